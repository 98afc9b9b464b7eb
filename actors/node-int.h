/* node-int.h - the node manager's internals shared by its files: the node, its sandboxes. */
#ifndef DSEC_ACTORS_NODE_INT_H
#define DSEC_ACTORS_NODE_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "runtime/journal.h"
#include "actors/node-results.h"
#include "actors/node.h"
#include "backends/loop.h"
#include "backends/workq.h"
#include "codecs/msg.h"
#include "dsec/sha256.h"
#include "dsec/names.h"

struct stat;
struct FTW;

/* The node manager: admission, one sandbox actor per sandbox (a mailbox key), reports, journal,
 * re-adoption. Shared names are dsec__node_*; what one file alone uses stays static in it. */

enum sbx_state {
    ST_REQUESTED,
    ST_STARTING,
    ST_RUNNING,
    ST_PAUSED,
    ST_STOPPING,
    ST_GONE,
    ST_FAILED
};
extern const char *const dsec__node_state_names[]; /* by enum sbx_state (node-table.c) */
enum reap_reason { REAP_NONE, REAP_TTL, REAP_IDLE, REAP_LOST, REAP_SUPERSEDED };

/* One sandbox as its actor sees it. Found through the id table; the fields
 * after `h` change only on the sandbox's own mailbox key, so handlers read
 * them without the node lock. */
struct sbx {
    struct sbx *next_id;  /* id hash chain (node lock) */
    struct sbx *next_req; /* (tenant, req_id) hash chain (node lock) */
    dsec_sandbox *h;      /* backend handle */
    dsec_backend *be;
    char *bstate;             /* backend_state for adopt and compaction */
    uint64_t created_ns;      /* wall clock */
    _Atomic uint64_t last_ns; /* wall clock of the last operation */
    _Atomic uint32_t running; /* commands in flight: a sandbox running one is never idle */
    /* Process calls made beside its other operations (the sig subject, node-proc.c): taken
     * under the node lock while side_closed is false; a destroy closes it and waits for those
     * in flight (a stdin write waits for the process to take the bytes, as on its own key). */
    _Atomic uint32_t side;
    bool side_closed; /* node lock */
    uint64_t ttl_ns, idle_ns;
    uint32_t cpu_milli, memory_mb;
    uint64_t disk_mb; /* the quota of its writable layer, held from the node's disk */
    uint8_t type_idx;
    _Atomic uint8_t state;
    _Atomic uint8_t reap;   /* enum reap_reason, set by the reaper */
    bool pausable;          /* a rollout that may be frozen while idle under memory pressure */
    bool superseded;        /* a later attempt of its create is kept elsewhere: the reaper destroys
                               it, and its request id finds it no more (node lock) */
    _Atomic uint32_t retry; /* the latest attempt of its create placed here, or kept here by a
                               superseded notice (set under the node lock; journaled) */
    uint32_t lookup_retry;  /* the latest attempt whose lookup it answered (node lock) */
    _Atomic bool frozen;    /* paused by the node; its memory went back to the pool */
    _Atomic bool freezing;  /* a freeze is queued on its mailbox */
    uint32_t mem_owed;      /* MB it could not take back when thawed (memory was short) */
    char id[DSEC_SBX_ID_LEN_MAX + 1];
    char tenant[DSEC_NAME_LEN_MAX + 1];
    char project[DSEC_NAME_LEN_MAX + 1]; /* "" when the create named none */
    char req_id[65];
    char *labels; /* its labels as created: nlabels "key\0value\0" pairs; NULL: none.
                     Set before it is inserted, never changed (read without the lock) */
    size_t labels_len;
    uint32_t nlabels;
};

/* A request id whose retry was placed on another node (superseded): a
 * placement of an earlier attempt that arrives later is not created. */
struct tomb {
    struct tomb *next;     /* hash chain (node lock) */
    struct tomb *next_old; /* oldest first, for expiry (node lock) */
    uint64_t expires_ns;   /* wall clock */
    uint32_t retry;        /* the attempt placed elsewhere */
    char tenant[DSEC_NAME_LEN_MAX + 1];
    char req_id[65];
};

#define TOMB_BUCKETS 4096
#define TOMBS_MAX 65536
#define TOMB_TTL_NS (300ull * 1000000000ull) /* beyond any client's wait for one attempt */

/* A sandbox this node destroyed or dropped on its own (idle, lifetime, its node declared
 * lost, a retry kept elsewhere, not re-adopted): an operation on it later is told why, not
 * only that it is not here, since the event that said so is advisory and may never have
 * reached anyone. Its journal record replaces the sandbox's in one write, so the reason
 * outlives a restart of the node manager. */
struct gone {
    struct gone *next;     /* hash chain (node lock) */
    struct gone *next_old; /* oldest first, for expiry (node lock) */
    uint64_t at_ns;        /* wall clock */
    char id[DSEC_SBX_ID_LEN_MAX + 1];
    char tenant[DSEC_NAME_LEN_MAX + 1];
    char reason[96];
};

#define GONE_BUCKETS 4096
#define GONE_MAX 65536                        /* per node: about 18 MB when full */
#define GONE_TTL_NS (3600ull * 1000000000ull) /* an hour: beyond any client's backlog */

/* A sandbox the backend could not adopt because of this node's configuration (DSEC_E_CONFIG:
 * the runtime that started it is not installed, ...) but that still exists: its record stays
 * in the journal, so a node manager started with that put right adopts it. */
struct kept {
    char *id;
    char *data;
    size_t len;
    struct kept *next;
};

/* Capacity a preemptible job holds on this node (job_hold): it is taken
 * from what placement can use until the job, or the arbiter, releases it. */
struct hold {
    struct hold *next;
    char key[136]; /* "hold.<job>.<unit>": also its journal id */
    char job[DSEC_NAME_LEN_MAX + 1];
    uint64_t cpu_milli, memory_mb;
};

struct event {
    char id[DSEC_SBX_ID_LEN_MAX + 1];
    char tenant[DSEC_NAME_LEN_MAX + 1];
    char project[DSEC_NAME_LEN_MAX + 1];
    char req_id[65];
    uint32_t cpu_milli, memory_mb;
    uint8_t state, prev, type_idx;
    uint64_t ts_ns;
    char reason[96];
    char trace_id[DSEC_TRACE_ID_MAX + 1]; /* the request that caused it; "" if none */
};

/* Scheduler replicas a node hands placement stamps back to (a cell runs a few). */
#define NODE_ECHO_MAX 8

struct dsec_node {
    dsec_bus *bus;
    dsec_ticker *ticker;
    dsec_ticker *sync_ticker;
    dsec_ticker *hb_ticker;
    const dsec_registry *reg;
    dsec_actor *actor;
    dsec_journal *journal;
    char name[DSEC_NAME_LEN_MAX + 1];
    char cell[DSEC_NAME_LEN_MAX + 1];
    char subj_evt_node[192]; /* dsec.v1.ctl.evt.<cell>.node.<node> */
    char subj_evt_sbx[192];  /* dsec.v1.ctl.evt.<cell>.sbx.<node> */
    dsec_node_conf conf; /* copy; strings point into the caller's conf, which outlives start only */
    char snap_dir[4096]; /* <state_dir>/snapshots: the files backends write on snapshot */
    dsec_type_mask offered;
    char **type_names;       /* offered names (copied), NULL-terminated */
    dsec_backend_kv *labels; /* copied */
    size_t nlabels;
    dsec_backend
        *backends[DSEC_REGISTRY_MAX]; /* per registry index; shared when backend is "sim" */
    /* Sandbox operations never hold a bus worker: commands wait on the loop, everything
     * else that needs a thread runs on the work queue, fair across tenants and sandboxes. */
    dsec_loop *loop;
    dsec_workq *work;
    dsec_results *results;   /* finished commands' answers by request id (retries, reattach) */
    bool own_loop, own_work; /* opened here, not borrowed from the cell */
    _Atomic uint64_t execs_inflight, execs_peak;
    int ticks[4];

    pthread_mutex_t mu; /* tables, free resources, events */
    struct sbx **by_id;
    struct sbx **by_req;
    size_t nbuckets;
    pthread_mutex_t report_mu; /* one capacity report at a time, events before it */
    uint64_t live;
    uint64_t live_by_type[DSEC_REGISTRY_MAX];
    uint64_t cpu_free, mem_free, slots_free;
    uint64_t disk_free; /* MB: conf.disk_mb less the reserve and the sandboxes' quotas */
    bool dirty;
    uint64_t seq;
    uint64_t last_full_ns;
    /* Per scheduler replica, the newest stamped placement taken since the last capacity
     * report (place.sent_us), handed back in that report (capacity.echo) and then cleared. */
    struct place_echo {
        char scheduler[DSEC_NAME_LEN_MAX * 2 + 2];
        uint64_t sent_us, at_ns; /* at_ns 0: nothing to hand back */
        uint64_t taken;          /* stamped placements taken since the last report */
    } echo[NODE_ECHO_MAX];
    struct event *events;
    size_t nevents, cap_events;
    struct sbx *dropped; /* records replayed but not re-adopted (start only) */
    struct kept *kept;   /* records replayed, not adopted, but kept (journal compaction too) */
    uint64_t nkept;
    struct hold *holds;  /* job holdings (node lock) */
    struct tomb **tombs; /* TOMB_BUCKETS chains (node lock) */
    struct tomb *tomb_old, *tomb_new;
    size_t ntombs;
    struct gone **gone; /* GONE_BUCKETS chains (node lock) */
    struct gone *gone_old, *gone_new;
    size_t ngone;

    _Atomic uint64_t created, destroyed, refused, adopted, adopt_failed, reaped_ttl, reaped_idle;
    _Atomic uint64_t lost_before_ns; /* reclaim what was made before: this node was declared
                                        lost then, and the owners were told */
    _Atomic uint64_t reaped_lost;
    _Atomic uint64_t reaped_superseded; /* made for an attempt whose retry was kept elsewhere */
    _Atomic uint64_t stale_places;      /* placements of an attempt already superseded */
    _Atomic uint64_t late_places;       /* placements dropped: past their client's deadline */
    _Atomic uint64_t shed_places;       /* placements answered "overloaded" for their wait */
    _Atomic uint64_t net_alerts;        /* network alerts published */
    dsec_metrics_hist
        create_lat; /* place received -> created answered, creates that made a sandbox */
    uint64_t hb_seq;
    uint64_t conn_base; /* wall clock at start: with the bus's reconnects, the report's conn */

    dsec_net *net;            /* network containment, or NULL */
    pthread_mutex_t alert_mu; /* alerts are published only while alert_on */
    bool alert_on;
    char subj_alert[192]; /* dsec.v1.ctl.evt.<cell>.alert.<node> */
};

/* Answers of finished commands kept for retries, unless the node's conf says otherwise
 * (results_budget, results_ttl_ms): 10 minutes, 64 MiB per node. */
#define RESULTS_BUDGET (64ull << 20)
#define RESULTS_TTL_MS (10u * 60u * 1000u)

/* ---- small helpers every file uses ------------------------------------------------ */

static inline uint64_t dsec__node_hash_str(const char *a, const char *b)
{
    uint64_t h = 1469598103934665603ull;
    for (; *a; a++)
        h = (h ^ (uint8_t)*a) * 1099511628211ull;
    for (; b && *b; b++)
        h = (h ^ (uint8_t)*b) * 1099511628211ull;
    return h ^ (h >> 29);
}

/* Memory a sandbox holds in the node's accounting now. */
static inline uint64_t dsec__node_mem_held(const struct sbx *s)
{
    return s->frozen ? 0 : (uint64_t)s->memory_mb - s->mem_owed;
}

static inline void dsec__node_touch(struct sbx *s)
{
    s->last_ns = dsec_wall_ns();
}

/* How long ago then was. The clock was read before the lock was taken, and
 * operations touch last_ns without it: a time a little after now is "just
 * now", never a wrapped-around eternity that reaps a fresh sandbox. */
static inline uint64_t dsec__node_age_ns(uint64_t now, uint64_t then)
{
    return now > then ? now - then : 0;
}

/* ---- node-table.c: tables (node lock held), records, holdings, adoption ----------- */

struct sbx *dsec__node_find_id(dsec_node *n, const char *id);
struct sbx *dsec__node_find_req(dsec_node *n, const char *tenant, const char *req_id);
struct tomb *dsec__node_find_tomb(dsec_node *n, const char *tenant, const char *req_id);
void dsec__node_add_tomb(dsec_node *n, const char *tenant, const char *req_id, uint32_t retry,
                         uint64_t now);
const struct gone *dsec__node_find_gone(dsec_node *n, const char *id);
int dsec__node_gone(dsec_node *n, const struct sbx *s, const char *reason, dsec_err *err);
int dsec__node_gone_put(dsec_node *n, const char *id, dsec_err *err);
void dsec__node_gone_free_all(dsec_node *n);
void dsec__node_insert(dsec_node *n, struct sbx *s);
void dsec__node_unlink_sbx(dsec_node *n, struct sbx *s);
void dsec__node_release_resources(dsec_node *n, uint64_t cpu, uint64_t mem, uint64_t slots,
                                  uint64_t disk);
void dsec__node_event_locked(dsec_node *n, const struct sbx *s, int prev, int state,
                             const char *reason);
void dsec__node_set_state(dsec_node *n, struct sbx *s, int state, const char *reason);
const char *dsec__node_type_name(const dsec_node *n, int idx);
int dsec__node_journal_put(dsec_node *n, const struct sbx *s, dsec_err *err);
void dsec__node_answers_locked(dsec_node *n, struct sbx *s, uint32_t retry);
void dsec__node_sbx_free(struct sbx *s);
void dsec__node_spec_for(const dsec_node *n, const struct sbx *s, const char *env,
                         dsec_sandbox_spec *sp);
void dsec__node_on_hold(dsec_actor *a, dsec_msg *m, void *ud);
int dsec__node_emit_live(dsec_journal *j, dsec_journal_emit_fn emit, void *ud, dsec_err *err);
int dsec__node_adopt_one(const char *id, const void *data, size_t len, void *ud, dsec_err *err);

/* ---- node.c: answers every file sends --------------------------------------------- */

void dsec__node_reply_err(dsec_node *n, dsec_msg *m, int code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void dsec__node_reply_bad(dsec_node *n, dsec_msg *m, const char *field, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void dsec__node_reply_backend(dsec_node *n, dsec_msg *m, const dsec_err *e, const char *bad_field);

/* node-xfer.c: uploads, hashed downloads, mkdir/stat/rename/remove. */
bool dsec__node_is_upload(const dsec_msg_file_write *w);
void dsec__node_do_upload(dsec_node *n, dsec_msg *m, struct sbx *s, const dsec_msg_file_write *w);
void dsec__node_do_file_op(dsec_node *n, dsec_msg *m, struct sbx *s);
/* A read with sha256: its running hash, or NULL when it cannot be had here (a read that does
 * not start at 0 nor go on from where one stopped: hash the file at its end instead). */
typedef struct dsec__read_hash dsec__read_hash;
dsec__read_hash *dsec__node_read_hash_begin(struct sbx *s, const char *path, uint64_t offset);
/* The page d read at offset: folds it in and frees r; hex the file's digest when d reaches
 * its end (else ""). */
void dsec__node_read_hash_page(dsec__read_hash *r, uint64_t offset, const dsec_file_data *d,
                               char hex[2 * DSEC_SHA256_LEN + 1]);
void dsec__node_read_hash_abort(dsec__read_hash *r);
/* The digest of the first size bytes of path, read again. */
int dsec__node_read_hash_file(struct sbx *s, const char *path, uint64_t size,
                              char hex[2 * DSEC_SHA256_LEN + 1], dsec_err *err);

/* ---- node-place.c: admission ------------------------------------------------------ */

void dsec__node_send_created(dsec_node *n, const char *reply_to, const struct sbx *s, bool existing,
                             const char *req_id);
void dsec__node_new_id(const dsec_node *n, char *out, size_t len);
void dsec__node_on_place(dsec_actor *a, dsec_msg *m, void *ud);
void dsec__node_on_place_shed(dsec_actor *a, dsec_msg *m, uint64_t waited_ns, void *ud);

/* ---- node-exec.c: commands and the trajectory log --------------------------------- */

int dsec__node_traj_check(dsec_node *n, dsec_msg *m, const char *rollout, uint64_t step,
                          const uint8_t hash[DSEC_SHA256_LEN], dsec_traj_record **rec);
int dsec__node_traj_log(dsec_node *n, dsec_traj_record *r, dsec_err *err);
void dsec__node_do_exec(dsec_node *n, dsec_msg *m, struct sbx *s);
/* node-proc.c: the proc message (background processes), on a work thread. */
void dsec__node_do_proc(dsec_node *n, dsec_msg *m, struct sbx *s);
/* Most bytes of each stream one proc output answer carries: two of them and the rest stay
 * under the bus's 8 MiB payload limit. A client asks again from where the answer ended. */
#define DSEC_PROC_OUTPUT_MAX (3u << 20)

/* ---- node-ops.c: operations on one sandbox, off the bus --------------------------- */

/* A process call but start on the sandbox's side key (the sig subject): it passes a
 * command that is running, to interrupt a shell session's command, or to read, feed, list
 * and resize background processes meanwhile (node-proc.c). */
void dsec__node_side_proc(dsec_node *n, dsec_msg *m, const char *tenant, const char *id);
/* Whether m (a proc request) is a signal: short, so it is not queued. */
bool dsec__node_side_is_signal(const dsec_msg *m);
/* Stop side calls to s and wait for those in flight, before s's backend handle goes. */
void dsec__node_side_close(dsec_node *n, struct sbx *s);
bool dsec__node_decode_for_running(dsec_node *n, dsec_msg *m, struct sbx *s, int type, void *out);
int dsec__node_rm_entry(const char *path, const struct stat *st, int flag, struct FTW *ftw);
void dsec__node_on_sbx(dsec_actor *a, dsec_msg *m, void *ud);
uint64_t dsec__node_key_of(const dsec_msg *cm, void *ud);
/* Whether s can run an operation (a frozen sandbox is thawed for it); false when m was
 * answered why not. */
bool dsec__node_check_running(dsec_node *n, dsec_msg *m, struct sbx *s);
void dsec__node_reply_op(dsec_node *n, dsec_msg *m, struct sbx *s, const char *state, dsec_strv ids,
                         dsec_kv info);
/* Inside an operation on a work thread: its deferred message, which the operation now ends
 * with dsec_deferred_done (its end comes later, from the loop); NULL elsewhere (the
 * operation then ends before it returns). */
dsec_deferred *dsec__node_job_keep(void);

/* ---- node-fork.c: forks ------------------------------------------------------------ */

void dsec__node_do_fork(dsec_node *n, dsec_msg *m, struct sbx *s, uint64_t count);

/* ---- node-report.c: reports, ticks, notices --------------------------------------- */

void dsec__node_tick_capacity(void *ud, uint64_t now);
void dsec__node_tick_sync(void *ud, uint64_t now);
void dsec__node_tick_heartbeat(void *ud, uint64_t now);
void dsec__node_tick_reap(void *ud, uint64_t mono_now);
void dsec__node_on_lookup(dsec_actor *a, dsec_msg *m, void *ud);
void dsec__node_on_superseded(dsec_actor *a, dsec_msg *m, void *ud);
void dsec__node_on_reconcile(dsec_actor *a, dsec_msg *m, void *ud);
void dsec__node_on_sync(dsec_actor *a, dsec_msg *m, void *ud);
void dsec__node_announce(dsec_node *n);

/* ---- node-list.c: listing a tenant's sandboxes, labels, per-tenant events ---------- */

int dsec__node_labels_set(struct sbx *s, const char *const *k, const char *const *v, uint32_t n);
int dsec__node_labels_copy(struct sbx *dst, const struct sbx *src);
/* The labels as one journal field (hex of the pairs); "" when none. Caller frees; NULL: no memory.
 */
char *dsec__node_labels_record(const struct sbx *s);
int dsec__node_labels_parse(struct sbx *s, const char *rec);
void dsec__node_on_list(dsec_actor *a, dsec_msg *m, void *ud);
/* Publish the batch again per tenant, on dsec.v1.<tenant>.evt.sbx (report thread). */
void dsec__node_send_tenant_events(dsec_node *n, const dsec_msg_sandbox_event *items, size_t ne);

#endif
