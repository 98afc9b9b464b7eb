/* client.h - libdsec: create sandboxes and drive them over the bus.
 * Clients need no node addresses: the sandbox id names its node. */
#ifndef DSEC_CLIENT_H
#define DSEC_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "dsec/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dsec_client dsec_client;

typedef struct dsec_client_opts {
    const char *url;       /* NULL: $DSEC_URL, else nats://127.0.0.1:4222 */
    const char *tenant;    /* NULL: $DSEC_TENANT, else "default" */
    int timeout_ms;        /* per attempt; default 10000 */
    int retries;           /* extra attempts on retry-safe failures; default 2 */
    int threads;           /* callback threads; default 2 */
    const char *name;      /* connection name; default "dsec-client" */
    bool direct_callbacks; /* the caller's create callbacks never block (no waiting on
                              another answer, no sleeping): dsec_create_async sends with
                              dsec_bus_request_direct, so a timeout or failure reaches them a
                              thread hand-off sooner (replies run on the thread they arrive
                              on either way) */
} dsec_client_opts;

/* Connect. *out owns the client; free with dsec_client_free (drains first:
 * pending asynchronous creates are answered before it returns). */
int dsec_client_connect(dsec_client **out, const dsec_client_opts *opts, dsec_err *err);
void dsec_client_free(dsec_client *c);
const char *dsec_client_tenant(const dsec_client *c);

/* What to create. Every pointer is borrowed for the duration of the call. */
typedef struct dsec_create_spec {
    const char *type; /* function | container | microvm | vm | sim; NULL: lightest that satisfies
                         requires */
    const char *const *requires; /* capability names; NULL-terminated or NULL */
    const char *env;             /* environment name:version */
    uint64_t cpu_milli;
    uint64_t memory_mb;
    uint64_t disk_mb;
    uint64_t ttl_s;
    uint64_t idle_s;
    const char *const *labels;   /* "k=v" strings; NULL-terminated or NULL */
    const char *const *affinity; /* "k=v" node labels required; NULL-terminated or NULL */
    const char *cell;            /* NULL: any cell with room */
    const char *cls;             /* rollout (default) | job | batch */
    int64_t priority;
    const char *rollout_id;
    const char *const *net; /* network policy entries; NULL-terminated or NULL */
    const char *req_id;     /* idempotency key; NULL: a fresh one per call */
    bool pausable;          /* rollout: may be frozen while idle under memory pressure;
                               the next operation resumes it */
    const char *project;    /* the tenant's project it counts against ("rl" or "rl/math");
                               NULL: the tenant's own quota only */
} dsec_create_spec;

#define DSEC_ID_MAX 96
#define DSEC_NAME_MAX 72

typedef struct dsec_sandbox_info {
    char id[DSEC_ID_MAX];
    char node[DSEC_NAME_MAX];
    char type[32];
    char state[16];
    char cell[DSEC_NAME_MAX];
    bool existing; /* the request id matched an earlier create */
} dsec_sandbox_info;

/* Create and wait for the answer. Retries retry-safe failures with the same
 * request id, so a retry never makes a second sandbox. */
int dsec_create(dsec_client *c, const dsec_create_spec *spec, dsec_sandbox_info *out,
                dsec_err *err);

/* Called exactly once per asynchronous create, on a client thread; info and
 * err are borrowed for the call. status is 0 or negative. */
typedef void (*dsec_create_cb)(int status, const dsec_sandbox_info *info, const dsec_err *err,
                               void *ud);

/* Start a create and return at once; many may be in flight. -1 (and no callback) when it
 * cannot start: a bad spec, or DSEC_E_OVERLOADED (retry_after_ms set) when the cell has been
 * answering this client's creates "overloaded" and, even at twice the rate it takes them now,
 * this one's turn would come after its deadline. While the cell sheds creates, a client that
 * retries (retries > 0) sends them at a little more than the rate the cell accepts them and holds
 * the rest back, first come first served (docs/control-plane.md, "Clients pace"). */
int dsec_create_async(dsec_client *c, const dsec_create_spec *spec, dsec_create_cb cb, void *ud,
                      dsec_err *err);

typedef struct dsec_exec_opts {
    /* NULL-terminated; NULL or empty: the sandbox's default command (an imported image's
     * Entrypoint and Cmd; an error naming the lack when its environment has none) */
    const char *const *argv;
    const char *const *env; /* "K=V" strings; NULL-terminated or NULL */
    const char *cwd;
    const void *stdin_data;
    size_t stdin_len;
    uint64_t timeout_ms; /* 0: the sandbox default */
    const char *user;
    const char *rollout_id; /* with step: recorded in the trajectory log */
    uint64_t step;
    uint64_t output_max; /* cap of stdout and of stderr, bytes (<= 8 MiB); 0: 1 MiB */
    /* Names this command (1..64 characters); NULL: a fresh one. The node keeps a finished
     * command's answer for 10 minutes (the node's results_ttl_s), across restarts of its
     * node manager: an exec with the same req_id, in the same sandbox, gets that answer and
     * does not run the command again, so a client that lost its answer (timed out,
     * disconnected, restarted) collects it. A command that was running when its node
     * manager went away is not run again either: the retry fails with DSEC_E_STATE (its
     * outcome was lost). A timed-out exec's error names the req_id it used. The client waits
     * for the answer as long as the command's timeout_ms plus 30 s, and at least the
     * client's own timeout. */
    const char *req_id;
    /* Nonzero: run argv[0], a shell command line, in this shell session (dsec_session_start)
     * instead of a new process: its directory and variables carry over from the session's
     * earlier commands. argv holds that one string; env, cwd, user and stdin stay unset.
     * timeout_ms ends that command only. Containers and VMs. */
    uint64_t session;
} dsec_exec_opts;

typedef struct dsec_exec_reply {
    int exit_code;
    int signal;
    bool timed_out;
    uint8_t *out; /* owned by the result: dsec_exec_reply_release */
    size_t out_len;
    bool out_truncated;
    uint8_t *err_out;
    size_t err_len;
    bool err_truncated;
    uint64_t duration_us;
    uint64_t cpu_us;      /* 0 when the backend does not measure it */
    uint64_t peak_rss_kb; /* 0 when the backend does not measure it */
    bool interrupted;     /* a session command that dsec_session_interrupt ended */
    bool session_ended;   /* a session command after which the session is gone (exit, kill) */
} dsec_exec_reply;

int dsec_exec(dsec_client *c, const char *id, const dsec_exec_opts *opts, dsec_exec_reply *res,
              dsec_err *err);
void dsec_exec_reply_release(dsec_exec_reply *res);

/* Receives a command's output while it runs: stream 1 is stdout, 2 stderr;
 * data is borrowed for the call. Called on a client thread, one call at a
 * time, in the order the output came. */
typedef void (*dsec_exec_output_fn)(void *ud, int stream, const uint8_t *data, size_t len);

/* dsec_exec, with the output also handed to fn as it comes (containers
 * stream while the command runs; other types deliver it when it ends). When
 * this returns, fn has seen all of it; res carries the capped output too.
 * Output chunks that never arrive (as across a NATS gateway) are made up
 * from the result when it holds the whole output; otherwise the call fails
 * with DSEC_E_TIMEOUT (docs/protocol.md, exec_chunk). */
int dsec_exec_stream(dsec_client *c, const char *id, const dsec_exec_opts *opts,
                     dsec_exec_output_fn fn, void *ud, dsec_exec_reply *res, dsec_err *err);

int dsec_file_write(dsec_client *c, const char *id, const char *path, const void *data, size_t len,
                    unsigned mode, dsec_err *err);
typedef struct dsec_write_opts {
    unsigned mode; /* 0: 0644 */
    bool append;
    const char *rollout_id; /* with step: recorded in the trajectory log, never repeated */
    uint64_t step;
} dsec_write_opts;

/* dsec_file_write with options (opts may be NULL). Data of any size: more
 * than 4 MiB that replaces the file goes as an upload (dsec_file_upload: the
 * file changes at once when all of it arrived, sha256 checked); more than
 * 4 MiB appended goes in 4 MiB appends, and a failure part way says how many
 * bytes the file holds. A write with a rollout_id is one trajectory step and
 * holds at most 4 MiB (DSEC_E_TOO_LARGE beyond). */
int dsec_file_write_ex(dsec_client *c, const char *id, const char *path, const void *data,
                       size_t len, const dsec_write_opts *opts, dsec_err *err);

/* The whole file, of any size, read in 4 MiB pages; *data is owned by the
 * caller (dsec_free) and NUL-terminated one past *len. A file that changes
 * size while it is read fails with DSEC_E_STATE (read it again), never a
 * short read reported as the file. */
int dsec_file_read(dsec_client *c, const char *id, const char *path, uint8_t **data, size_t *len,
                   dsec_err *err);

/* Called with each page of a file in order (data borrowed for the call; size
 * is the whole file's, the same on every call). Return -1 (errno set) to
 * stop the read. Called once with len 0 for an empty file. */
typedef int (*dsec_file_page_fn)(void *ud, const uint8_t *data, size_t len, uint64_t size);

/* dsec_file_read, handing the file to fn in pages of at most 4 MiB instead
 * of holding it whole (dsec_file_download: a few pages in flight, sha256
 * checked). Fails as dsec_file_read does, after fn may have seen part of the
 * file; a stop by fn fails with DSEC_E_IO. */
int dsec_file_read_pages(dsec_client *c, const char *id, const char *path, dsec_file_page_fn fn,
                         void *ud, dsec_err *err);

typedef struct dsec_dirent {
    char *name;
    char kind[8]; /* file | dir | link | other */
    uint64_t size;
    uint64_t mode;
    int64_t mtime;
} dsec_dirent;

/* *entries is owned by the caller: dsec_dirents_free. */
int dsec_file_list(dsec_client *c, const char *id, const char *path, dsec_dirent **entries,
                   size_t *n, dsec_err *err);
void dsec_dirents_free(dsec_dirent *entries, size_t n);

/* ---- streamed transfers (docs/protocol.md, "Files") ----------------------------------
 * An upload goes in chunks to a hidden temporary file next to path, a few chunks in flight;
 * the last one commits: the sandbox checks the size and sha256 of what it holds and renames
 * it over path, so path is never seen half written. A failed upload can go on later from
 * what the sandbox holds: call again with the same upload_id and resume. A download reads
 * pages with a few in flight and checks the sha256 of what arrived against the sandbox's. */

/* Reads the next bytes of an upload's source into buf (at most n): the count, 0 at the end,
 * -1 with errno set on failure. Called in order from the start of the source (a resumed
 * upload reads again what the sandbox holds, to hash it). */
typedef ssize_t (*dsec_upload_read_fn)(void *ud, void *buf, size_t n);

typedef struct dsec_upload_opts {
    unsigned mode;         /* 0: the mode of the file replaced, or 0644 */
    const char *upload_id; /* [A-Za-z0-9_-]{1,64}; NULL: a fresh one (in the result) */
    bool resume;           /* go on from what the sandbox holds for upload_id */
    size_t chunk;          /* bytes per message; 0: 4 MiB (64 KiB to 4 MiB) */
    unsigned window;       /* messages in flight; 0: 4 (at most 16) */
} dsec_upload_opts;

typedef struct dsec_download_opts {
    size_t page;     /* bytes per message; 0: 4 MiB (64 KiB to 4 MiB) */
    unsigned window; /* messages in flight; 0: 4 (at most 16) */
} dsec_download_opts;

typedef struct dsec_transfer_result {
    uint64_t size;         /* the whole file's */
    char sha256[65];       /* its SHA-256, lowercase hex, checked by both ends */
    char upload_id[65];    /* an upload's id: give it back with resume after a failure */
    uint64_t resumed_from; /* bytes the sandbox held already (not sent again) */
} dsec_transfer_result;

/* Upload what rd reads to path (any size). res (may be NULL) says what was published. A
 * failure after chunks arrived leaves them in the sandbox's temporary file (removed when no
 * chunk comes for 10 minutes) and says how many: resume with res->upload_id. */
int dsec_file_upload(dsec_client *c, const char *id, const char *path, const dsec_upload_opts *o,
                     dsec_upload_read_fn rd, void *ud, dsec_transfer_result *res, dsec_err *err);
/* dsec_file_upload reading fd (a file or a pipe) from where it stands. */
int dsec_file_upload_fd(dsec_client *c, const char *id, const char *path, const dsec_upload_opts *o,
                        int fd, dsec_transfer_result *res, dsec_err *err);
/* How many bytes the sandbox holds for upload_id's upload to path (0: none). */
int dsec_file_upload_held(dsec_client *c, const char *id, const char *path, const char *upload_id,
                          uint64_t *held, dsec_err *err);
/* Hand path to fn page by page (as dsec_file_read_pages), a few pages in flight; at the end
 * the sha256 of what arrived must equal the sandbox's (else DSEC_E_BACKEND, read it again).
 * res (may be NULL) gets the size and sha256. */
int dsec_file_download(dsec_client *c, const char *id, const char *path,
                       const dsec_download_opts *o, dsec_file_page_fn fn, void *ud,
                       dsec_transfer_result *res, dsec_err *err);
/* dsec_file_download writing to fd. */
int dsec_file_download_fd(dsec_client *c, const char *id, const char *path,
                          const dsec_download_opts *o, int fd, dsec_transfer_result *res,
                          dsec_err *err);

/* Create a directory (mode 0: 0755); with parents its missing parents too, and an existing
 * directory is no error. */
int dsec_file_mkdir(dsec_client *c, const char *id, const char *path, unsigned mode, bool parents,
                    dsec_err *err);
/* Describe path (not following a last symlink); out->name is the caller's (dsec_free). */
int dsec_file_stat(dsec_client *c, const char *id, const char *path, dsec_dirent *out,
                   dsec_err *err);
/* Rename from to to inside the sandbox; to, if there, is replaced atomically. */
int dsec_file_rename(dsec_client *c, const char *id, const char *from, const char *to,
                     dsec_err *err);
/* Remove a file or an empty directory (recursive: a directory and all it holds). */
int dsec_file_remove(dsec_client *c, const char *id, const char *path, bool recursive,
                     dsec_err *err);

/* Fork n children; *ids is an array of n strings owned by the caller:
 * dsec_strv_free. */
int dsec_fork(dsec_client *c, const char *id, unsigned n, char ***ids, size_t *nids, dsec_err *err);
void dsec_strv_free(char **v, size_t n);

/* Package the sandbox's writable layer as a new layer and publish it, with
 * the layers below it, as environment name ("name:version") in the cell's
 * layer registry: dsec_create with .env = name then starts from this state
 * on any node. Containers only (DSEC_E_UNSUPPORTED elsewhere). */
int dsec_snapshot(dsec_client *c, const char *id, const char *name, dsec_err *err);
/* Replace the sandbox's network policy while it runs (entries as in
 * dsec_create_opts.net; none: it reaches nothing). New connections follow it
 * at once; connections it no longer allows are cut (docs/network.md). */
int dsec_set_network(dsec_client *c, const char *id, const char *const *entries, size_t n,
                     dsec_err *err);
/* ---- background processes (docs/protocol.md, "Background processes") ----------------
 * Container, microVM and VM sandboxes keep processes started with dsec_proc_start running
 * after the call, the client and the node manager are gone; later calls (from any client)
 * name them by handle. Other types fail with DSEC_E_UNSUPPORTED. */
typedef struct dsec_proc {
    uint64_t handle; /* unique in its sandbox, never reused */
    int32_t pid;     /* in the sandbox */
    bool running;
    bool stdin_open;
    bool timed_out;
    int32_t exit_code;             /* when !running: exit status; -1 when a signal ended it */
    int32_t signal;                /* when !running: the signal that ended it, else 0 */
    uint64_t started_ns, ended_ns; /* wall clock; ended_ns 0 while running */
    uint64_t out_total, err_total; /* bytes each stream produced in all */
    char cmdline[256];
    bool pty;     /* on a terminal (dsec_proc_opts.pty) */
    bool session; /* a shell session (dsec_session_start) */
    bool busy;    /* a session running a command now */
} dsec_proc;

typedef struct dsec_proc_opts {
    const char *const
        *argv; /* NULL-terminated; NULL or empty: the default command, as for dsec_exec */
    const char *const *env; /* "K=V" strings; NULL-terminated or NULL */
    const char *cwd;
    const char *user;
    uint64_t timeout_ms;    /* its whole process tree is killed after this long; 0: never */
    uint64_t ring_max;      /* bytes of stdout and of stderr kept (<= 16 MiB); 0: 256 KiB */
    bool keep_stdin;        /* stdin stays open for dsec_proc_write */
    const void *stdin_data; /* its first stdin bytes (<= 8 MiB) */
    size_t stdin_len;
    /* On a terminal of rows x cols (0: 24 x 80), as `docker exec -t`: its output, echo
     * included, is the stdout stream; dsec_proc_write sends keystrokes (a 0x03 byte
     * interrupts its foreground job; close sends ^D); keep_stdin is implied. Containers and
     * VMs. */
    bool pty;
    uint16_t rows, cols;
} dsec_proc_opts;

/* Start a process in the background; *out describes it (its handle, its pid). */
int dsec_proc_start(dsec_client *c, const char *id, const dsec_proc_opts *o, dsec_proc *out,
                    dsec_err *err);
/* The sandbox's processes: running, and ended ones it still keeps (up to 1,024 in all).
 * *procs is owned by the caller: dsec_free. */
int dsec_proc_list(dsec_client *c, const char *id, dsec_proc **procs, size_t *n, dsec_err *err);
/* Send sig to the process; SIGKILL ends its whole process tree. DSEC_E_STATE once it ended. */
int dsec_proc_signal(dsec_client *c, const char *id, uint64_t handle, int sig, dsec_err *err);
/* Write len bytes (<= 8 MiB) to its stdin; returns once the process took them all.
 * close: then close its stdin (len may be 0). While they wait, a further write to the same
 * process is refused (DSEC_E_STATE); a container's node waits at most 60 s for the process
 * to read, then answers DSEC_E_TIMEOUT while the bytes still go in as it reads. */
int dsec_proc_write(dsec_client *c, const char *id, uint64_t handle, const void *data, size_t len,
                    bool close, dsec_err *err);

typedef struct dsec_proc_out {
    dsec_proc info;
    uint8_t *out, *err; /* owned: dsec_proc_out_free */
    size_t out_len, err_len;
    uint64_t out_from, err_from; /* the stream offsets of out[0] and err[0] */
} dsec_proc_out;

/* Its output from the stream offsets out_off and err_off: what the sandbox still keeps
 * from there (out_from/err_from above the offsets when older bytes were dropped), at most
 * max bytes of each stream (0: as much as one answer carries, 3 MiB). Follow a process by
 * asking again from out_from + out_len and err_from + err_len. */
int dsec_proc_read(dsec_client *c, const char *id, uint64_t handle, uint64_t out_off,
                   uint64_t err_off, uint64_t max, dsec_proc_out *out, dsec_err *err);
void dsec_proc_out_free(dsec_proc_out *o);
/* dsec_proc_read that waits: when nothing past the offsets is there yet and the process
 * runs, the answer comes as soon as output does, the process ends, or wait_ms (<= 60000)
 * passed (then with nothing new). Follows a terminal with no polling delay. Containers wait
 * without holding a thread; VMs answer at once. */
int dsec_proc_read_wait(dsec_client *c, const char *id, uint64_t handle, uint64_t out_off,
                        uint64_t err_off, uint64_t max, uint32_t wait_ms, dsec_proc_out *out,
                        dsec_err *err);
/* Change a terminal's window (the process sees SIGWINCH). DSEC_E_INVALID without a pty. */
int dsec_proc_resize(dsec_client *c, const char *id, uint64_t handle, uint16_t rows, uint16_t cols,
                     dsec_err *err);

/* ---- watching a directory -------------------------------------------------------------
 * A watcher is a background process of the sandbox (containers, microVMs, VMs): the agent
 * itself, watching with inotify and printing one JSON line per change, so its events are
 * kept in its ring when nobody reads, followed by offset from any client, and it ends with
 * the sandbox or dsec_proc_signal. */
typedef struct dsec_dir_event {
    /* create, modify (a file written and closed), delete, moved_from, moved_to, attrib,
     * overflow (events were lost: list the directory again), gone (the directory itself
     * went; the watcher has ended) */
    char event[16];
    char path[4096]; /* absolute, in the sandbox */
    bool dir;
} dsec_dir_event;

/* Watch the absolute directory path (and below it when recursive: directories made later
 * too; entries of a directory made while the watch was being set may be reported twice).
 * Returns once every watch is set, so changes after it are seen; *out is the watcher's
 * process (its handle for dsec_dir_events and dsec_proc_signal). A path that is not a
 * directory fails with the sandbox's reason. */
int dsec_dir_watch(dsec_client *c, const char *id, const char *path, bool recursive, dsec_proc *out,
                   dsec_err *err);
/* Hand fn the watcher's events from *offset on (0 at first), waiting up to wait_ms for some;
 * *offset moves past what was handed over (whole lines only). Events dropped because nobody
 * read them for long (more than the ring's 256 KiB) come as one "overflow". Returns how many
 * events fn saw (0 when the wait ran out), or -1. *running tells whether the watcher still
 * runs (may be NULL). */
typedef void (*dsec_dir_event_fn)(void *ud, const dsec_dir_event *ev);
int dsec_dir_events(dsec_client *c, const char *id, uint64_t handle, uint64_t *offset,
                    uint32_t wait_ms, dsec_dir_event_fn fn, void *ud, bool *running, dsec_err *err);

/* ---- shell sessions ----------------------------------------------------------------------
 * A persistent shell in the sandbox (bash, or sh where there is none; or shell, a path):
 * dsec_exec with .session = the handle runs one command line in it at a time, and its
 * directory, environment, functions and variables carry from one command to the next. Each
 * command has its own exit code, output and timeout. The session is a background process:
 * dsec_proc_list shows it, and dsec_proc_signal SIGKILL (or the command `exit`) ends it. */
int dsec_session_start(dsec_client *c, const char *id, const char *shell, dsec_proc *out,
                       dsec_err *err);
/* Interrupt the session's running command (as Ctrl-C would): it ends with interrupted set
 * and exit code 130; the session lives on. It goes past the running command (a subject and
 * an agent connection of its own: a container's side connection, a VM's second channel).
 * Nothing happens when the session is idle. */
int dsec_session_interrupt(dsec_client *c, const char *id, uint64_t session, dsec_err *err);

/* Move the sandbox's end: it now ends ttl_s seconds from now (sooner or later than it would
 * have), as long as its whole lifetime stays within the cell's max_ttl_s (DSEC_E_INVALID
 * otherwise, naming how much more it may have). *expires_ns (if not NULL) gets its new end,
 * wall clock. The change is journaled: it holds across a restart of the node manager. */
int dsec_set_ttl(dsec_client *c, const char *id, uint64_t ttl_s, uint64_t *expires_ns,
                 dsec_err *err);
int dsec_pause(dsec_client *c, const char *id, dsec_err *err);
int dsec_resume(dsec_client *c, const char *id, dsec_err *err);
int dsec_destroy(dsec_client *c, const char *id, dsec_err *err);

/* Called on a client thread when a node holding this tenant's sandboxes is
 * declared lost (silent for the cell's scheduler.lost_after_ms): every
 * sandbox whose id names that node is gone, and if the node returns it
 * destroys them. A loss may be reported once per scheduler replica. */
typedef void (*dsec_node_lost_cb)(const char *node, const char *cell, uint64_t lost_ns, void *ud);
/* Start delivering this tenant's node_lost events to cb (once per client). */
int dsec_watch_lost(dsec_client *c, dsec_node_lost_cb cb, void *ud, dsec_err *err);
int dsec_status(dsec_client *c, const char *id, dsec_sandbox_info *out, dsec_err *err);

/* Wait until the sandbox reaches state (e.g. "running", "gone"), or fail
 * with DSEC_E_TIMEOUT. A sandbox that is gone or unknown while waiting for
 * another state fails with DSEC_E_NOT_FOUND. */
int dsec_wait_state(dsec_client *c, const char *id, const char *state, int timeout_ms,
                    dsec_err *err);

/* The node that owns a sandbox id (the part before the last '-'), copied into
 * node; fails with DSEC_E_INVALID for a malformed id. */
int dsec_id_node(const char *id, char *node, size_t n, dsec_err *err);

/* ---- completion queues (added for the SDKs) ---------------------------------
 * An alternative to dsec_create_async's callback for event-loop callers (the
 * Python SDK): answers are queued in C and an eventfd becomes readable, so the
 * caller's loop collects them in batches and no foreign callback runs on a
 * client thread. Additive: nothing above changes. */
typedef struct dsec_cq dsec_cq;

typedef struct dsec_cq_event {
    uint64_t token;         /* as given to dsec_create_cq */
    int status;             /* 0 or -1 */
    dsec_sandbox_info info; /* when status is 0 */
    dsec_err err;           /* when status is -1 */
} dsec_cq_event;

/* A queue with its eventfd (non-blocking, close-on-exec). Free with
 * dsec_cq_free once no create naming it is pending (e.g. after
 * dsec_client_free, which answers every pending create). */
int dsec_cq_new(dsec_cq **out, dsec_err *err);
void dsec_cq_free(dsec_cq *q);

/* Readable while the queue holds events. */
int dsec_cq_fd(const dsec_cq *q);

/* Move up to max events into out (oldest first); returns how many. */
size_t dsec_cq_poll(dsec_cq *q, dsec_cq_event *out, size_t max);

/* dsec_create_async whose answer goes to q under token. */
int dsec_create_cq(dsec_client *c, const dsec_create_spec *spec, dsec_cq *q, uint64_t token,
                   dsec_err *err);

/* Start n creates in one call, as n dsec_create_cq(c, specs[i], q, tokens[i]):
 * for event loops that gather the creates asked for during one turn and
 * submit them together (the Python SDK). Every create gets exactly one event
 * on q under its token, in whatever order the answers come: a create that
 * could not be sent (a bad spec, e.g. malformed labels or an invalid project
 * or cell, or a connection that refused the publish) is answered at once with
 * an event of status -1 and its error, so one bad spec does not stop the
 * others. The arrays and the specs are borrowed for the call. Returns -1 (err filled, nothing
 * started) only when q or c is NULL, or n > 0 and specs or tokens is NULL; otherwise 0. */
int dsec_cq_create_batch(dsec_cq *q, dsec_client *c, const dsec_create_spec *const *specs,
                         const uint64_t *tokens, size_t n, dsec_err *err);

/* ---- one-shot function calls ---------------------------------------------------
 * A function sandbox made for one task and destroyed after it (create with
 * type "function", write the dependency files, exec, destroy), for callers
 * that do not keep sandboxes. Additive: nothing above changes.
 * docs/function-calls.md describes the task (argv forms, env, limits). */

typedef struct dsec_call_file {
    const char *path; /* absolute, under /work */
    const void *data;
    size_t len;
    unsigned mode; /* 0: 0644 */
} dsec_call_file;

typedef struct dsec_call_spec {
    const char *runtime;     /* python3 (NULL) | sh | native */
    const char *const *argv; /* NULL-terminated, required: python3 -c CODE, sh -c ..., /work/prog */
    const char *const *env;  /* "K=V"; NULL-terminated or NULL */
    const void *stdin_data;
    size_t stdin_len;
    const dsec_call_file *files; /* copied into the call's /work */
    size_t nfiles;
    uint64_t
        timeout_ms; /* wall time; 0: the backend's ceiling. Keep it below the client's timeout_ms */
    uint64_t cpu_ms;         /* CPU time of the call; 0: none */
    uint64_t memory_mb;      /* 0: the cell's default */
    const char *cell;        /* NULL: any cell with room */
    uint64_t output_max;     /* cap of stdout and of stderr, bytes (<= 8 MiB); 0: 1 MiB */
    const char *environment; /* name:version of an environment of layers; NULL: the host's base */
    const char *const *net;  /* network policy entries (as dsec_create_spec.net), NULL-terminated;
                                NULL: the call reaches nothing (docs/network.md) */
} dsec_call_spec;

/* Run spec in a fresh function sandbox, then destroy it whatever happened
 * (a destroy that fails is left to the sandbox's ttl). On success *res holds
 * the result (release with dsec_exec_reply_release); a failure to create,
 * write or exec fails the call. All pointers in spec are borrowed. */
int dsec_call(dsec_client *c, const dsec_call_spec *spec, dsec_exec_reply *res, dsec_err *err);

/* ---- tracing ------------------------------------------------------------ */

/* Every request carries a Dsec-Trace-Id, and so does everything it causes:
 * the place a scheduler sends, the node's answer, the exec's output chunks,
 * the sandbox events. By default each call makes a fresh id. */

/* Calls made by this thread from now on carry trace_id (1-64 printable
 * characters, no spaces; copied); NULL goes back to fresh ids. A create's
 * retries keep the id its first attempt had. -1 with err filled when the id
 * is not acceptable. */
int dsec_trace_set(const char *trace_id, dsec_err *err);

/* The id this thread's calls carry now, or NULL (fresh ids). Valid until
 * the next dsec_trace_set on this thread. */
const char *dsec_trace_get(void);

/* One step of a traced request, as the actor that took it recorded it.
 * Times are wall clock, ns since the epoch. */
typedef struct dsec_trace_hop_info {
    char process[128]; /* the process that answered (dsecd-<cell>, ...) */
    char actor[128];   /* the actor that handled it (scheduler replica, node, ...) */
    char subject[256]; /* the subject it handled */
    char type[64];     /* the Dsec-Type it handled */
    char sent[64];     /* the Dsec-Type of the first message it sent for it */
    char kept[16];     /* why it was recorded: error, slow or sample */
    bool error;
    uint64_t start_ns;
    uint64_t end_ns;
} dsec_trace_hop_info;

/* Ask every dsec process on the bus for the hops of trace_id it kept, and
 * gather the answers for window_ms (<= 0: 500). *hops, ordered by start
 * time, is the caller's: dsec_trace_hops_free. Processes keep a bounded,
 * sampled record (docs/operations.md, "Following a request"): errors and
 * slow hops always, others when the id is sampled; 0 hops is not an error.
 * *answered tells how many processes answered (may be NULL). */
int dsec_trace_hops(dsec_client *c, const char *trace_id, int window_ms, dsec_trace_hop_info **hops,
                    size_t *n, size_t *answered, dsec_err *err);
void dsec_trace_hops_free(dsec_trace_hop_info *hops);

/* ---- fleet: a tenant's sandboxes, listed and followed (client/fleet.c) ---------
 * A listing (dsec_list_sandboxes) is answered by the nodes themselves, not by a
 * database: libdsec asks one scheduler replica per cell which nodes to hear from,
 * then every node for its page of this client's tenant's sandboxes (docs/protocol.md,
 * "Listing sandboxes"). A node that does not answer in time is named in missing:
 * the page may lack its sandboxes. */

#define DSEC_LIST_LIMIT_DEFAULT 1000
#define DSEC_LIST_LIMIT_MAX 10000

typedef struct dsec_list_opts {
    const char *const *labels; /* "k=v" strings that must all match; NULL-terminated or NULL */
    const char *state;         /* requested | starting | running | paused | stopping; NULL: any */
    const char *type;          /* sandbox type; NULL: any */
    uint32_t limit;            /* 1..DSEC_LIST_LIMIT_MAX; 0: DSEC_LIST_LIMIT_DEFAULT */
    const char *cursor;        /* NULL or "": from the first id; else a page's next_cursor */
    int timeout_ms;            /* how long to wait for the nodes; 0: the client's timeout */
} dsec_list_opts;

typedef struct dsec_list_entry {
    char id[DSEC_ID_MAX];
    char type[32];
    char state[16];
    char node[DSEC_NAME_MAX];
    char project[DSEC_NAME_MAX]; /* "" when none */
    char **labels;               /* nlabels "k=v" strings, owned by the page */
    size_t nlabels;
    uint64_t created_ns;
    uint64_t expires_ns; /* its lifetime ends then; 0: no limit */
    uint64_t cpu_milli, memory_mb;
} dsec_list_entry;

typedef struct dsec_list_page {
    dsec_list_entry *entries; /* n of them, sorted by id */
    size_t n;
    char next_cursor[DSEC_ID_MAX]; /* "": this was the last page */
    char **missing; /* nodes (and "cell:NAME" for a cell whose scheduler did not answer)
                       that did not answer in time: their sandboxes may be absent */
    size_t nmissing;
    size_t nodes_asked, nodes_answered;
} dsec_list_page;

/* One page of this client's tenant's sandboxes matching opts (NULL: all). Bad options
 * fail with DSEC_E_INVALID naming the field (labels, state, limit, cursor). *out is the
 * caller's: dsec_list_page_release. */
int dsec_list_sandboxes(dsec_client *c, const dsec_list_opts *opts, dsec_list_page *out,
                        dsec_err *err);
void dsec_list_page_release(dsec_list_page *p);

/* One lifecycle transition of one of this tenant's sandboxes. */
typedef struct dsec_sbx_event {
    char id[DSEC_ID_MAX];
    char state[16]; /* requested, starting, running, paused, stopping, gone, failed */
    char prev[16];
    char node[DSEC_NAME_MAX];
    char type[32];
    char reason[128];
    uint64_t ts_ns;
} dsec_sbx_event;

/* Called on a client thread, one event at a time, in each node's order. */
typedef void (*dsec_sbx_event_cb)(const dsec_sbx_event *ev, void *ud);
typedef struct dsec_event_watch dsec_event_watch;

/* Follow this tenant's sandbox lifecycle events (dsec.v1.<tenant>.evt.sbx) from now on,
 * calling cb for each. *out is the caller's: dsec_event_watch_free (waits for a callback
 * still running), before dsec_client_free. Events are advisory: one may be missed while
 * the connection is down; dsec_list tells what exists. */
int dsec_watch_events(dsec_client *c, dsec_sbx_event_cb cb, void *ud, dsec_event_watch **out,
                      dsec_err *err);
void dsec_event_watch_free(dsec_event_watch *w);

#ifdef __cplusplus
}
#endif
#endif
