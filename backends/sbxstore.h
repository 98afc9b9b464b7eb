/* sbxstore.h - the sandbox-record store the container and VM backends share: the meta record's
 * text (escapes, writer, reader), the environment a sandbox runs with, its network policy lines,
 * option parsing, the live-sandbox set, the orphan sweep, abandon and the fork runner. */
#ifndef DSEC_BACKENDS_SBXSTORE_H
#define DSEC_BACKENDS_SBXSTORE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "backends/backend.h"
#include "backends/net/net.h"
#include "dsec/layers.h"

/*
 * A record is text, one "key value" a line; the first line names its kind and version
 * ("dsec-container 1", "dsec-vm 1", ...). A newline or backslash inside a value is escaped
 * (\n, \\); an absent value is "-". Records written by earlier builds are read unchanged, so
 * a node manager restarted on a newer build adopts the sandboxes an older one left.
 */

/* ---- the store: one per backend instance ------------------------------------------------- */

/* What the store asks of its backend. */
struct dsec_sbx_ops {
    /* Undo whatever of sb's start-up was done; frees sb on success. */
    int (*teardown)(void *be, dsec_sandbox *sb, dsec_err *err);
    /* Free a record whose teardown failed, or NULL to leave it (its resources stay). */
    void (*discard)(void *be, dsec_sandbox *sb);
    /* sb's id, for messages. */
    const char *(*id)(const dsec_sandbox *sb);
    /* Reclaim what earlier instances left behind (dsec_sbx_sweep_once runs it once). */
    void (*sweep)(void *be);
};

/* A sandbox's place in the live set: embedded in its record. */
struct dsec_sbx_link {
    struct dsec_sbx_link *next;
    const char *id;  /* the record's id */
    const char *rid; /* another name it holds (a runtime id), or the id again */
    bool listed;
};

/* Flags of a store. */
enum {
    /* environment variables must fit on one line (a guest reads them from a file, one a line) */
    DSEC_SBX_VARS_ONE_LINE = 1u << 0,
};

/* The store of one backend instance, embedded in it (dsec_sbx_store_init / _fini). */
struct dsec_sbx_store {
    const char *type; /* "container", "microvm", "vm": the prefix of every message */
    unsigned flags;   /* DSEC_SBX_* */
    const struct dsec_sbx_ops *ops;
    void *be;             /* the instance, passed to ops */
    pthread_mutex_t lock; /* guards live */
    struct dsec_sbx_link *live;
    /* what an earlier instance left behind is reclaimed once, before the first call that
     * creates or destroys: by then the node has re-adopted all it will (it replays its journal
     * before serving) */
    pthread_mutex_t sweep_lock;
    _Atomic bool swept;
};

/* type and ops are borrowed for the store's life. */
void dsec_sbx_store_init(struct dsec_sbx_store *s, const char *type, unsigned flags,
                         const struct dsec_sbx_ops *ops, void *be);
void dsec_sbx_store_fini(struct dsec_sbx_store *s);

/* ---- the live set: the records this instance holds, which the sweep leaves alone ---------- */

/* List l as id (and rid, which may be id; both borrowed from the record); no-op when listed. */
void dsec_sbx_live_add(struct dsec_sbx_store *s, struct dsec_sbx_link *l, const char *id,
                       const char *rid);
void dsec_sbx_live_del(struct dsec_sbx_store *s, struct dsec_sbx_link *l);
/* Whether a listed record has this id or rid. */
bool dsec_sbx_live_has(struct dsec_sbx_store *s, const char *name);

/* ---- teardown, the sweep ------------------------------------------------------------------- */

/* Clean up after a failure without losing its error: teardown, and when that fails say so on
 * stderr and discard the record (ops->discard). */
void dsec_sbx_abandon(struct dsec_sbx_store *s, dsec_sandbox *sb);
/* Run ops->sweep once in the instance's life, whoever calls first. */
void dsec_sbx_sweep_once(struct dsec_sbx_store *s);
/* fn(arg, dirfd, name) for each entry of dir but "." and ".."; returns the sum of fn's positive
 * results (a negative one stops the walk). A missing dir has no entries. */
int dsec_sbx_dir_each(const char *dir, int (*fn)(void *arg, int dfd, const char *name), void *arg);

/* ---- fork ---------------------------------------------------------------------------------- */

/* Check fork child ids (valid and distinct), clearing children[] and states[] as it goes. */
int dsec_sbx_fork_ids(const struct dsec_sbx_store *s, const char *const *ids, size_t n,
                      dsec_sandbox **children, char **states, dsec_err *err);
/* child(arg, i, err) for each i in 0..n-1, on `workers` threads side by side (the caller is
 * one): starting a child is mostly waiting. The first failure stops the others; err receives
 * it as "fork child I: ...". */
int dsec_sbx_fork_run(size_t n, size_t workers, int (*child)(void *arg, size_t i, dsec_err *err),
                      void *arg, dsec_err *err);
/* After a failed fork: abandon every child made and free every state. */
void dsec_sbx_fork_undo(struct dsec_sbx_store *s, dsec_sandbox **children, char **states, size_t n);

/* The children of one fork_start settling on a loop: a hold for each child still waiting, and
 * one for fork_start while it starts their waits. done(ud, rc, err) runs once, when the last
 * hold goes, with the first failure (rc -1) or 0; then the wait is freed. */
struct dsec_sbx_fork_wait;
/* A wait holding fork_start's own hold; NULL when out of memory. */
struct dsec_sbx_fork_wait *dsec_sbx_fork_wait_new(dsec_ready_fn done, void *ud);
/* One more child waiting: before its wait starts. */
void dsec_sbx_fork_wait_hold(struct dsec_sbx_fork_wait *w);
/* A child's wait ended (a dsec_ready_fn, ud the fork's wait). */
void dsec_sbx_fork_wait_end(void *wait, int rc, dsec_err *err);
/* A wait that no child took: freed, done never runs. */
void dsec_sbx_fork_wait_free(struct dsec_sbx_fork_wait *w);
/* fork_start's own hold, let go by a post to loop: done then always runs on the loop's thread,
 * even when every child's wait already failed. */
void dsec_sbx_fork_wait_started(struct dsec_sbx_fork_wait *w, struct dsec_loop *loop);

/* ---- file reads through an agent ---------------------------------------------------------- */

/* Add one page of a file read through a sandbox's agent (part, consumed: it answers at most
 * DSEC_AGENT_FILE_MAX a call) to what was read so far (out, zeroed before the first). 1 when
 * another page is wanted, 0 when out is complete (end of file, an empty page, or max bytes; max 0
 * is no limit), -1 when out of memory (out is then freed and zeroed). */
int dsec_sbx_file_page(dsec_file_data *out, dsec_file_data *part, uint64_t max);

/* ---- record text ---------------------------------------------------------------------------- */

/* A small file as a NUL-terminated dsec_malloc'd string (caller frees); NULL with errno. */
char *dsec_sbx_read_file(const char *path, size_t max);
/* A "key value" line, the value escaped (NULL is "-"). */
void dsec_sbx_rec_put(FILE *f, const char *key, const char *v);
/* Undo the escapes in place. */
void dsec_sbx_rec_unesc(char *s);
/* Split text (modified) into lines; fn(arg, key, value unescaped) for each line with a space. */
int dsec_sbx_rec_parse(char *text, int (*fn)(void *arg, const char *key, char *val, dsec_err *err),
                       void *arg, dsec_err *err);
/* Replace dir/meta (through dir/meta.tmp) with first line magic, then put(f, arg)'s lines. */
int dsec_sbx_rec_write(const struct dsec_sbx_store *s, const char *dir, const char *magic,
                       void (*put)(FILE *f, const void *arg), const void *arg, dsec_err *err);
/* The value of a "key value" line of text (not the first line), NUL-terminated in out; "" when
 * absent or too long. */
void dsec_sbx_rec_value(const char *text, const char *key, char *out, size_t len);

/* ---- options ----------------------------------------------------------------------------- */

/* An integer option in lo..hi. */
int dsec_sbx_opt_u64(const struct dsec_sbx_store *s, const char *k, const char *v, uint64_t lo,
                     uint64_t hi, uint64_t *out, dsec_err *err);
/* Each option of cfg to fn(arg, key, k, v, err): key is k without its "<type>." prefix; fn
 * returns 1 when it took the key, 0 when it does not know it, -1 with err. A key of this type
 * (with the prefix) that fn does not know is an error naming the known ones. */
int dsec_sbx_opts(const struct dsec_sbx_store *s, const dsec_backend_config *cfg,
                  int (*fn)(void *arg, const char *key, const char *k, const char *v,
                            dsec_err *err),
                  void *arg, const char *known, dsec_err *err);

/* ---- strings ------------------------------------------------------------------------------ */

/* Replace *dst with a copy of s (NULL: none); -1 with err when out of memory. */
int dsec_sbx_set_str(const struct dsec_sbx_store *s, char **dst, const char *src, dsec_err *err);
/* Append copies of add[0..nadd) (NULL is "") to (*v, *n); -1 when out of memory. */
int dsec_sbx_strv_add(char ***v, size_t *n, const char *const *add, size_t nadd);
void dsec_sbx_strv_clear(char ***v, size_t *n);

/* ---- the environment a sandbox runs with (its layers are the backend's) --------------------- */

struct dsec_sbx_env {
    char *name;  /* env name:version, or NULL */
    char **vars; /* "KEY=VALUE" */
    size_t nvars;
    char *workdir;
    char *user;
    char **cmd; /* the default command (an image's Entrypoint then Cmd); ncmd 0: none */
    size_t ncmd;
    size_t nentry; /* how many of cmd's first arguments are the Entrypoint */
};

void dsec_sbx_env_clear(struct dsec_sbx_env *e);
int dsec_sbx_env_var(const struct dsec_sbx_store *s, struct dsec_sbx_env *e, const char *kv,
                     dsec_err *err);
int dsec_sbx_env_cmd(const struct dsec_sbx_store *s, struct dsec_sbx_env *e, const char *arg,
                     dsec_err *err);
/* dst (empty) receives a copy of src; on failure dst is cleared. */
int dsec_sbx_env_copy(const struct dsec_sbx_store *s, struct dsec_sbx_env *dst,
                      const struct dsec_sbx_env *src, dsec_err *err);
/* out (empty) receives an environment document's name, workdir and user (defaults / and root),
 * variables and default command; layer(arg, digest, format, err) takes each of its layers, in
 * order, before the variables. On failure out is cleared (the caller clears its layers). */
int dsec_sbx_env_from_doc(const struct dsec_sbx_store *s, struct dsec_sbx_env *out,
                          const dsec_env *d,
                          int (*layer)(void *arg, const char *digest, int format, dsec_err *err),
                          void *arg, dsec_err *err);
/* The registry's environment document called name (a spec's env), with what the lookup
 * failing means in err. Caller frees it (dsec_env_free). */
int dsec_sbx_env_get(const struct dsec_sbx_store *s, dsec_layer_registry *reg, const char *name,
                     dsec_env **d, dsec_err *err);
/* The lines env, workdir, user, var, cmd, entry. */
void dsec_sbx_env_put(FILE *f, const struct dsec_sbx_env *e);
/* Take one line into e when it is one of those; 1 when taken, 0 when not, -1 with err. */
int dsec_sbx_env_line(const struct dsec_sbx_store *s, struct dsec_sbx_env *e, const char *key,
                      char *val, dsec_err *err);

/* ---- the network policy a record keeps (backends/net/net.h) --------------------------------- */

/* A sandbox's tenant and policy as a record keeps them. */
struct dsec_sbx_netrec {
    char **tenant;
    char **state; /* dsec_net_sbx_state, read back on adopt */
    char ***entries;
    size_t *n;
};
/* The lines tenant, net_state (when net is attached) and net (one per entry). */
void dsec_sbx_net_put(FILE *f, const char *tenant, const dsec_net_sbx *net, char *const *entries,
                      size_t n);
/* Take one of those lines; 1 when taken, 0 when not, -1 with err. */
int dsec_sbx_net_line(const struct dsec_sbx_store *s, const struct dsec_sbx_netrec *r,
                      const char *key, char *val, dsec_err *err);

#endif
