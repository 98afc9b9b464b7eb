/* backend.h - the one interface every sandbox type implements (table of ops + opaque instance). */
#ifndef DSEC_BACKENDS_BACKEND_H
#define DSEC_BACKENDS_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsec/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * Model (crun style): a backend type is a table of operations
 * (dsec_backend_ops) plus a static capability record (dsec_backend_caps).
 * dsec_backend_new() opens one instance of a type on a node; the instance
 * hands out one opaque dsec_sandbox handle per sandbox it hosts.
 *
 * Threading contract, which every backend must honour:
 *  - Operations on ONE sandbox are called in order, one at a time, by that
 *    sandbox's actor. A backend needs no locking per sandbox.
 *  - Operations on DIFFERENT sandboxes of the same instance run in parallel
 *    on several threads, so whatever the instance shares between sandboxes
 *    must be thread-safe.
 *  - fork() reads its parent and creates children; no other call touches the
 *    parent meanwhile (the parent's actor is the one calling fork).
 *  - dsec_backend_new / dsec_backend_free are not concurrent with anything.
 *
 * Backends never talk to the bus and never block other sandboxes.
 *
 * Commands complete asynchronously: exec_start sends the command and returns at
 * once; its completion comes back through the node's event loop (backends/loop.h:
 * the agent's socket readiness, a timer), so a command that runs for minutes holds
 * a watch and a few KiB, never a thread. A node runs as many commands at once as
 * its sandboxes can hold. An exec_start that has returned 0 counts as the
 * operation in progress on its sandbox: the caller calls nothing else on that
 * sandbox until its done callback ran (the node holds the sandbox's key).
 *
 * File transfers do the same where the backend has file_write_start and
 * file_read_start (an agent's socket carries them, piece by piece), and so do
 * process calls that wait: proc_follow_start (output to come) and
 * proc_stdin_start (a process to read its stdin).
 *
 * The other operations (create, fork, destroy, ...) are calls that need a
 * thread (crun, mounts, mkfs, copying, QEMU's start and its state's load): the
 * node runs them on its fair-queued work threads (backends/workq.h), never on a
 * bus worker, so a busy sandbox or tenant delays only its own turn. Their
 * waits for the sandbox are the loop's where the backend has the _start op:
 *  - create_start: a create whose end is a wait for the sandbox to come up (a
 *    VM's boot, a cold container's agent); the thread goes back once it is
 *    started;
 *  - fork_start: a fork's wait for its children (a VM child's agent and its
 *    identity);
 *  - stop_start: a destroy's wait for what runs in the sandbox to end (killed
 *    processes exiting on a saturated host, QEMU's quit and its grace).
 * A backend without exec_start (or without the file ops' _start) has its exec
 * (or transfers) run on a work thread too.
 *
 * Errors follow dsec/err.h: a failing call returns -1 and fills err. Messages
 * name what failed but not the sandbox id (backends may not keep it); the
 * sandbox actor wraps them with the id.
 */

/* A string pair: options, labels, environment variables. */
typedef struct dsec_backend_kv {
    const char *key;
    const char *value;
} dsec_backend_kv;

/* How a node opens a backend instance. Everything is borrowed for the call:
 * the backend copies what it keeps. */
typedef struct dsec_backend_config {
    const char *state_dir;       /* the node's directory for this backend; may be NULL for sim */
    const char *node;            /* the node's name */
    const dsec_backend_kv *opts; /* backend-specific options, "key=value" as pairs */
    size_t nopts;
    /* The cell's layer registry (include/dsec/layers.h), borrowed for the
     * instance's life; NULL when the node has none (sim, function on the
     * host's base). */
    struct dsec_layer_registry *layers;
    /* The node's layer cache directory, shared by every backend of the node
     * that uses layers (dsec_layer_cache_share); NULL: <state_dir>/layers. */
    const char *layer_cache_dir;
    /* The node's network containment (backends/net/net.h), borrowed for
     * the instance's life; NULL when the node has none: sandboxes then get
     * an empty network namespace and refuse network policies. */
    struct dsec_net *net;
    /* The node's event loop (backends/loop.h), borrowed for the instance's
     * life; NULL: an instance whose type has exec_start opens a loop of its
     * own. */
    struct dsec_loop *loop;
} dsec_backend_config;

/* What a sandbox should be. Borrowed for the call by every operation that
 * takes one; the backend copies what it keeps. */
typedef struct dsec_sandbox_spec {
    const char *id;            /* sandbox id, unique on the node (names its node) */
    const char *type;          /* function | container | microvm | vm | sim | ... */
    const char *env;           /* environment name:version, or NULL */
    const char *const *layers; /* the environment's layer digests, lowest first */
    size_t nlayers;
    uint64_t cpu_milli; /* requested CPU, 1000 = one core */
    uint64_t memory_mb;
    uint64_t disk_mb; /* limit of the sandbox's own writable layer */
    const dsec_backend_kv *labels;
    size_t nlabels;
    const char *cls; /* rollout | job | batch, or NULL */
    const char *tenant;
    const char *const *net; /* network policy entries (allowed mirrors, domains, ranges) */
    size_t nnet;
} dsec_sandbox_spec;

/* One command to run in a sandbox. Borrowed for the call. */
typedef struct dsec_exec_req {
    const char *const *argv; /* argc 0: the sandbox's default command (default_cmd) */
    size_t argc;
    const dsec_backend_kv *env; /* added to the sandbox's environment */
    size_t nenv;
    const char *cwd;           /* NULL: the sandbox's default */
    const char *user;          /* NULL: the sandbox's default */
    const uint8_t *stdin_data; /* fed to the command, then closed; may be NULL */
    size_t stdin_len;
    uint64_t timeout_ms; /* 0: no timeout */
    size_t output_max;   /* cap per stream; 0: DSEC_EXEC_OUTPUT_DEFAULT */
    /* Nonzero: the handle of a shell session (dsec_proc_start_req.session) that runs the
     * command instead of a new process: argv is one string, a shell command line, and env,
     * cwd, user and stdin_data must be empty (the session's own directory and variables hold:
     * cd and export carry from one command to the next). A timeout or an interrupt ends that
     * command only; the session lives on. */
    uint64_t session;
    /* Optional: output as it arrives while the command runs (stream 1
     * stdout, 2 stderr; data borrowed for the call), called on the loop's
     * thread for exec_start (and for exec on a backend whose exec waits on
     * its loop). Backends that cannot stream never call it. */
    void (*on_output)(void *arg, int stream, const uint8_t *data, size_t len);
    void *on_output_arg;
} dsec_exec_req;

#define DSEC_EXEC_OUTPUT_DEFAULT (1u << 20)

/* Sandbox processes that share the node manager's cgroup (QEMU, function-call zygotes and
 * their workers) run at this nice value: when they keep every CPU busy, the node manager,
 * at nice 0, is still scheduled at once. Containers have cgroups of their own, weighed down
 * instead (docs/operations.md, "CPU for the node manager"). */
#define DSEC_SANDBOX_NICE 10

/* Most children one fork may create (the wire's op.n limit). */
#define DSEC_FORK_MAX 1024

/* What a command did. The backend fills it; the caller owns stdout_data and
 * stderr_data (allocated with dsec_malloc, may be NULL when empty) and
 * releases them with dsec_exec_result_release(). */
typedef struct dsec_exec_result {
    int exit_code; /* -1 when killed by a signal */
    int signal;    /* 0, or the signal that ended it (SIGKILL on timeout) */
    uint8_t *stdout_data;
    size_t stdout_len;
    bool stdout_truncated; /* output was longer than output_max */
    uint8_t *stderr_data;
    size_t stderr_len;
    bool stderr_truncated;
    uint64_t duration_us;
    bool timed_out;
    bool interrupted;   /* a session command ended by an interrupt (proc_signal SIGINT) */
    bool session_ended; /* a session command after which the session's shell is gone
                           (it ran exit, or was killed) */
    /* Optional (0 when the backend cannot tell): CPU time of the command and
     * everything it started, and the largest resident set of its main process. */
    uint64_t cpu_us;
    uint64_t peak_rss_kb;
} dsec_exec_result;

/* Frees the output buffers and zeroes r. NULL is a no-op. */
void dsec_exec_result_release(dsec_exec_result *r);

struct dsec_loop;

/* How an exec started with exec_start ended: rc 0 and *res filled (the callee
 * takes the buffers: it releases res with dsec_exec_result_release), or rc -1
 * and err set. Called exactly once, on the loop's thread (possibly before
 * exec_start returned). */
typedef void (*dsec_exec_done_fn)(void *ud, int rc, dsec_exec_result *res, dsec_err *err);

/* How a sandbox started with create_start came up: rc 0, or rc -1 and err. Called once, on the
 * loop's thread. */
typedef void (*dsec_ready_fn)(void *ud, int rc, dsec_err *err);

typedef enum dsec_file_kind {
    DSEC_FILE_REG = 1,
    DSEC_FILE_DIR,
    DSEC_FILE_LINK,
    DSEC_FILE_OTHER,
} dsec_file_kind;

/* "file", "dir", "link", "other" (the wire names). */
const char *dsec_file_kind_name(dsec_file_kind k);

/* One entry of a directory listing. name is owned by the array it sits in. */
typedef struct dsec_file_entry {
    char *name; /* the entry's name inside the listed directory */
    dsec_file_kind kind;
    uint64_t size;
    uint32_t mode; /* permission bits */
    int64_t mtime; /* seconds since the epoch */
} dsec_file_entry;

/* Frees a listing returned by file_list (names and array). NULL is a no-op. */
void dsec_file_entries_free(dsec_file_entry *entries, size_t n);

/* mkdir, stat, rename and remove on one sandbox's files (op file_op). */
typedef enum dsec_file_op_kind {
    DSEC_FOP_MKDIR = 1, /* path, mode (0: 0755), parents (no error when it exists) */
    DSEC_FOP_STAT,      /* path -> *st (lstat; st->name, when set, is the caller's) */
    DSEC_FOP_RENAME,    /* path -> to, replacing to atomically; sync: fsync path first */
    DSEC_FOP_REMOVE,    /* path; recursive: a directory and everything in it */
} dsec_file_op_kind;

typedef struct dsec_file_op {
    dsec_file_op_kind kind;
    const char *path;
    const char *to;
    uint32_t mode;
    bool parents;
    bool recursive;
    bool sync; /* rename: the data and the rename reach the disk before the answer */
} dsec_file_op;

/* Result of a file read. The caller owns data (dsec_malloc'd, NULL when
 * len == 0) and frees it with dsec_free. */
typedef struct dsec_file_data {
    uint8_t *data;
    size_t len;
    uint64_t size; /* the whole file's size */
    bool eof;      /* offset + len reached the end */
} dsec_file_data;

/* ---- background processes ----------------------------------------------------------
 * A process started with proc_start is detached from its caller: it outlives the call, the
 * connection and the node manager, and later calls name it by its handle. Each keeps the last
 * ring_max bytes of its stdout and of its stderr, so a client that comes late reads the tail
 * first; older bytes are dropped, never the process blocked for want of a reader. */
typedef struct dsec_proc_info {
    uint64_t handle; /* unique for the sandbox's life, never reused; 1, 2, ... */
    int32_t pid;     /* in the sandbox's pid namespace */
    bool running;
    bool stdin_open;               /* proc_stdin may still write */
    bool timed_out;                /* its timeout_ms ended it */
    int32_t exit_code;             /* when !running: its exit status, -1 when a signal ended it */
    int32_t signal;                /* when !running: the signal that ended it, else 0 */
    uint64_t started_ns, ended_ns; /* wall clock (the sandbox's); ended_ns 0 while running */
    uint64_t out_total, err_total; /* bytes each stream has produced in all */
    char cmdline[256];             /* its argv joined by spaces, cut to 255 bytes */
    bool pty;                      /* it runs on a terminal (dsec_proc_start_req.pty) */
    bool session;                  /* it is a shell session (dsec_proc_start_req.session) */
    bool busy;                     /* a session that is running a command now */
} dsec_proc_info;

#define DSEC_PROC_RING_DEFAULT (256u << 10) /* bytes kept per stream when ring_max is 0 */
#define DSEC_PROC_RING_MAX (16u << 20)
#define DSEC_PROC_MAX 1024u /* processes an agent keeps (running, or ended and not yet evicted) */

typedef struct dsec_proc_start_req {
    /* argv, env, cwd, user as for exec; timeout_ms (0: none) ends its whole process tree;
     * stdin_data is written first; output_max and on_output are not used */
    dsec_exec_req exec;
    uint64_t ring_max; /* bytes of each stream kept for proc_output; 0: DSEC_PROC_RING_DEFAULT */
    bool keep_stdin;   /* stdin stays open for proc_stdin; else closed after stdin_data */
    /* A terminal: the process leads a new session whose controlling terminal is a pty of
     * rows x cols (0: 24 x 80) on its stdin, stdout and stderr. Its output (echo included)
     * is the stdout ring; proc_stdin writes what is typed (a ^C byte then interrupts the
     * foreground job, as on any terminal; close sends ^D); keep_stdin is implied; TERM is
     * xterm-256color unless env sets it. */
    bool pty;
    uint16_t rows, cols;
    /* A persistent shell session: argv (argc 0: /bin/bash, or /bin/sh without bash) runs
     * as the session's shell and exec with .session = handle runs commands in it, one at a
     * time. Its directory, environment, functions and shell variables carry from command to
     * command. proc_signal SIGINT interrupts the running command only; any other signal goes
     * to the session's whole tree as for other processes (SIGKILL ends it). Output of its
     * background jobs between commands goes to the rings. Not with pty. */
    bool session;
} dsec_proc_start_req;

/* A window of a background process's output: its stdout and stderr from the offsets asked
 * (counted from the stream's first byte), as much as the ring still holds. */
typedef struct dsec_proc_output {
    dsec_proc_info info;
    uint8_t *out, *err; /* dsec_malloc'd, NULL when empty: dsec_proc_output_release */
    size_t out_len, err_len;
    uint64_t out_from, err_from; /* the stream offsets of out[0] and err[0]: above the offsets
                                    asked when the ring no longer held those bytes */
} dsec_proc_output;

void dsec_proc_output_release(dsec_proc_output *o);

/* How a proc_follow_start ended: rc 0 and *out (owned by the callee, which releases it with
 * dsec_proc_output_release), or rc -1 and err. Called once, on the loop's thread. */
typedef void (*dsec_proc_output_done_fn)(void *ud, int rc, dsec_proc_output *out, dsec_err *err);
/* The longest wait of one proc_follow_start or proc_stdin_start. */
#define DSEC_PROC_WAIT_MAX_MS 60000u

/* How a proc_stdin_start ended: rc 0 (the process took every byte) or rc -1 and err. Called
 * once, on the loop's thread. */
typedef void (*dsec_proc_done_fn)(void *ud, int rc, dsec_err *err);

/* How a transfer started with file_write_start or file_read_start ended: rc 0
 * (a read's data in *data, owned by the callee; NULL for a write) or rc -1 and
 * err. Called once, on the loop's thread. */
typedef void (*dsec_file_done_fn)(void *ud, int rc, dsec_file_data *data, dsec_err *err);

/* Resource use of one sandbox at the time of the call. */
typedef struct dsec_sandbox_stats {
    uint64_t cpu_used_us;  /* CPU time consumed since creation */
    uint64_t cpu_milli;    /* current CPU use, 1000 = one core busy */
    uint64_t memory_bytes; /* resident memory now */
    uint64_t disk_bytes;   /* bytes held in the sandbox's own writable layer */
    uint64_t nfiles;       /* files in its writable layer */
} dsec_sandbox_stats;

/*
 * The static capability record of a backend type. Placement reads it (through
 * the registry) to pick the lightest type satisfying a request; the node
 * manager reads it to refuse operations a type cannot do.
 */
typedef struct dsec_backend_caps {
    const char *type;       /* "container"; static storage */
    bool own_kernel;        /* the sandbox runs its own kernel */
    bool nested_containers; /* can run containers inside */
    bool gui;               /* has a display */
    bool persistence;       /* survives a node manager restart, can be snapshotted to disk */
    int isolation;          /* 1 function, 2 container, 3 microvm, 4 vm (0: none, sim) */
    unsigned cost;          /* relative weight; the lightest satisfying type is picked */
    bool supports_fork;
    bool supports_snapshot;
    bool supports_pause;
    bool network;        /* can be given network access by a policy (docs/network.md) */
    uint32_t startup_ms; /* typical cold start */
} dsec_backend_caps;

/* A sandbox as its backend sees it. Opaque: each backend defines its own
 * record behind the pointer. The caller (the sandbox actor) holds the handle
 * from create/fork/restore/adopt until destroy or detach. */
typedef struct dsec_sandbox dsec_sandbox;

/* An open backend instance on a node (ops + the backend's private state). */
typedef struct dsec_backend dsec_backend;

/*
 * The operations table. `self` is the private pointer init returned. Any
 * operation but init, fini, create, destroy and detach may be NULL: the
 * dsec_backend_* wrappers then fail with DSEC_E_UNSUPPORTED naming the op.
 *
 * backend_state: create, fork and restore return, per sandbox, an opaque
 * NUL-terminated string (a path, JSON, ...) allocated with dsec_malloc and
 * owned by the caller. The node manager stores it in the sandbox's persisted
 * record and, after a restart, hands it back to adopt() together with the
 * spec, so the backend can re-attach without a registry of its own.
 */
typedef struct dsec_backend_ops {
    const char *type; /* the type this table implements, e.g. "sim" */

    /* Open an instance for cfg; *self receives the private state. */
    int (*init)(void **self, const dsec_backend_config *cfg, dsec_err *err);
    /* Close the instance. Every sandbox must be destroyed or detached first. */
    void (*fini)(void *self);

    /* Start a sandbox for spec. On success *out is the handle and
     * *backend_state the caller-owned record for adopt (never NULL). */
    int (*create)(void *self, const dsec_sandbox_spec *spec, dsec_sandbox **out,
                  char **backend_state, dsec_err *err);
    /* Optional: create whose last wait is a watch on loop, not a thread's sleep (a VM's boot,
     * seconds until its agent answers). It does what create does up to that wait and returns
     * 0 with *out and *backend_state set, the caller's from then on; done runs once, on
     * loop's thread (possibly before this returns), when the sandbox answers (rc 0: it takes
     * calls) or cannot (rc -1 and err: the caller destroys *out, the only call it may make
     * on it; it makes none before done). 1: as create's success, the sandbox took calls at
     * once (a warm container), done is never called. -1 with err as create's failure: nothing
     * is left, done is never called. */
    int (*create_start)(void *self, const dsec_sandbox_spec *spec, struct dsec_loop *loop,
                        dsec_ready_fn done, void *ud, dsec_sandbox **out, char **backend_state,
                        dsec_err *err);
    /* Run one command; fills *res (caller releases it). */
    int (*exec)(void *self, dsec_sandbox *sb, const dsec_exec_req *req, dsec_exec_result *res,
                dsec_err *err);
    /* Start one command and return: 0 when started (done will be called once,
     * on loop's thread; req->on_output too, while it runs), -1 with err when it
     * could not start (done is never called). req is borrowed for the call only:
     * the backend copies what it sends. Optional: without it the node runs exec
     * on a work thread. */
    int (*exec_start)(void *self, dsec_sandbox *sb, const dsec_exec_req *req,
                      struct dsec_loop *loop, dsec_exec_done_fn done, void *ud, dsec_err *err);
    /* The sandbox's default command (an imported image's Entrypoint then Cmd): what an exec
     * or a background process that names no command runs. Returns its argc (0: it has none)
     * and sets *argv, which lives as long as the sandbox. Optional: without it a command
     * must always be named. */
    size_t (*default_cmd)(void *self, dsec_sandbox *sb, const char *const **argv);
    /* Write (or append) data to the absolute path, creating parents. */
    int (*file_write)(void *self, dsec_sandbox *sb, const char *path, const void *data, size_t len,
                      uint32_t mode, bool append, dsec_err *err);
    /* Read at most max bytes (0: the rest) from offset. */
    int (*file_read)(void *self, dsec_sandbox *sb, const char *path, uint64_t offset, uint64_t max,
                     dsec_file_data *out, dsec_err *err);
    /* file_write and file_read without waiting: 0 when started (done will be
     * called once, on loop's thread: a read's data passes to done, which frees
     * data->data with dsec_free; NULL for a write), -1 with err when it could
     * not start (done is never called). A write's data is borrowed until done;
     * path only for the call. Optional, both or neither: without them the node
     * runs transfers on a work thread. */
    int (*file_write_start)(void *self, dsec_sandbox *sb, const char *path, const void *data,
                            size_t len, uint32_t mode, bool append, struct dsec_loop *loop,
                            dsec_file_done_fn done, void *ud, dsec_err *err);
    int (*file_read_start)(void *self, dsec_sandbox *sb, const char *path, uint64_t offset,
                           uint64_t max, struct dsec_loop *loop, dsec_file_done_fn done, void *ud,
                           dsec_err *err);
    /* List a directory (or describe one file); *entries is caller-owned,
     * freed with dsec_file_entries_free. */
    int (*file_list)(void *self, dsec_sandbox *sb, const char *path, dsec_file_entry **entries,
                     size_t *n, dsec_err *err);
    /* One dsec_file_op; st (may be NULL but for DSEC_FOP_STAT) receives a stat's answer
     * (st->name, when set, is the caller's: dsec_free). */
    int (*file_op)(void *self, dsec_sandbox *sb, const dsec_file_op *op, dsec_file_entry *st,
                   dsec_err *err);
    /* Create n (1..DSEC_FORK_MAX) children of sb from its state now. ids[i] names child i.
     * children[] and states[] are caller arrays of n slots; on success each
     * holds a handle and a caller-owned backend_state. On failure no child
     * exists and the slots are NULL. */
    int (*fork)(void *self, dsec_sandbox *sb, const char *const *ids, size_t n,
                dsec_sandbox **children, char **states, dsec_err *err);
    /* Optional: fork whose children's last waits (each guest's agent answering, its identity
     * set) are watches on loop, as create_start's. It returns 0 with every children[i] and
     * states[i] set, the caller's from then on; done runs once, on loop's thread (possibly
     * before this returns), when every child takes calls (rc 0) or one cannot (rc -1 and err:
     * the caller destroys every child, the only call it may make on them; it makes none
     * before done). sb is not used after it returns. 1: as fork's success, every child took
     * calls at once, done is never called. -1 with err as fork's failure: no child exists,
     * done is never called. */
    int (*fork_start)(void *self, dsec_sandbox *sb, const char *const *ids, size_t n,
                      struct dsec_loop *loop, dsec_ready_fn done, void *ud, dsec_sandbox **children,
                      char **states, dsec_err *err);
    int (*pause)(void *self, dsec_sandbox *sb, dsec_err *err);
    int (*resume)(void *self, dsec_sandbox *sb, dsec_err *err);
    /* Save the sandbox to the file or directory at path (created). name, when
     * not NULL, is a "name:version" under which the backend also publishes
     * the snapshot as an environment in the cell's layer registry, so a
     * sandbox on any node can be created from it. */
    int (*snapshot)(void *self, dsec_sandbox *sb, const char *path, const char *name,
                    dsec_err *err);
    /* Start a new sandbox described by spec from the snapshot at path; out
     * parameters as for create. */
    int (*restore)(void *self, const dsec_sandbox_spec *spec, const char *path, dsec_sandbox **out,
                   char **backend_state, dsec_err *err);
    /* Stop the sandbox and free everything it holds. On success the handle
     * is gone; on failure it stays valid (the caller may retry). */
    int (*destroy)(void *self, dsec_sandbox *sb, dsec_err *err);
    /* Optional: destroy's waits as watches on loop. It ends what runs in sb (signals; a VM's
     * QEMU asked to quit, killed after its grace) and returns 0: done runs once, on loop's
     * thread (possibly before this returns), when nothing of sb runs any more (rc 0) or the
     * wait gave up (rc -1 and err). 1: nothing runs, done is never called. -1 with err: done is
     * never called. Either way the caller then calls destroy, which finds nothing left to wait
     * for (or waits for it itself); it makes no other call on sb meanwhile. */
    int (*stop_start)(void *self, dsec_sandbox *sb, struct dsec_loop *loop, dsec_ready_fn done,
                      void *ud, dsec_err *err);
    int (*stats)(void *self, dsec_sandbox *sb, dsec_sandbox_stats *out, dsec_err *err);
    /* Re-attach to a sandbox that outlived its node manager, from the spec
     * and backend_state persisted at create time. spec may be NULL when the
     * record lost it; a backend that needs it then fails with DSEC_E_INVALID.
     * DSEC_E_CONFIG: the sandbox exists but this instance, as configured,
     * cannot run it (the container runtime that started it is not installed,
     * or it had network containment and the node now has none);
     * the node keeps its record for a later start, so the backend must leave
     * the sandbox as it is. Other failures: the node drops the record. */
    int (*adopt)(void *self, const dsec_sandbox_spec *spec, const char *backend_state,
                 dsec_sandbox **out, dsec_err *err);
    /* Forget the handle but leave the sandbox running (node manager shutdown,
     * so a later adopt finds it). Never fails. */
    void (*detach)(void *self, dsec_sandbox *sb);
    /* Replace the sandbox's network policy while it runs (entries as in
     * dsec_sandbox_spec.net): new connections follow it at once, and
     * connections it no longer allows are cut. */
    int (*net_set)(void *self, dsec_sandbox *sb, const char *const *entries, size_t n,
                   dsec_err *err);
    /* Background processes (optional, all five or none; dsec_backend_procs says). proc_start
     * fills *out; proc_list's *out is caller-owned (dsec_free); proc_signal sends sig to the
     * process's whole tree (DSEC_E_STATE once it ended); proc_stdin answers once the process
     * took every byte (close: then its stdin is closed); proc_output returns at most max bytes
     * (0: all it holds) of each stream from the offsets. An unknown handle is
     * DSEC_E_NOT_FOUND. */
    int (*proc_start)(void *self, dsec_sandbox *sb, const dsec_proc_start_req *req,
                      dsec_proc_info *out, dsec_err *err);
    int (*proc_list)(void *self, dsec_sandbox *sb, dsec_proc_info **out, size_t *n, dsec_err *err);
    /* With proc_follow_start there, proc_list, proc_signal, proc_stdin, proc_output and
     * proc_resize too go on a connection of their own and may run beside any other call on
     * sb: the node makes them past a running command (its side lane), to interrupt a shell
     * session's command or to read, feed and list background processes meanwhile. */
    int (*proc_signal)(void *self, dsec_sandbox *sb, uint64_t handle, int sig, dsec_err *err);
    int (*proc_stdin)(void *self, dsec_sandbox *sb, uint64_t handle, const void *data, size_t len,
                      bool close, dsec_err *err);
    int (*proc_output)(void *self, dsec_sandbox *sb, uint64_t handle, uint64_t out_off,
                       uint64_t err_off, uint64_t max, dsec_proc_output *out, dsec_err *err);
    /* Optional: change a pty process's window (DSEC_E_INVALID for a process without one). */
    int (*proc_resize)(void *self, dsec_sandbox *sb, uint64_t handle, uint16_t rows, uint16_t cols,
                       dsec_err *err);
    /* Optional: proc_output that waits, on loop's thread, without a thread of its own:
     * when neither stream holds a byte past its offset and the process runs, the answer
     * waits until output comes, the process ends or wait_ms (at most DSEC_PROC_WAIT_MAX_MS)
     * passes. It goes on a connection other than the sandbox's own, so it may run beside any
     * other call on sb, an exec included; a sandbox destroyed meanwhile ends it with an error. 0
     * when started (done called once), -1 with err (done never called). */
    int (*proc_follow_start)(void *self, dsec_sandbox *sb, uint64_t handle, uint64_t out_off,
                             uint64_t err_off, uint64_t max, uint32_t wait_ms,
                             struct dsec_loop *loop, dsec_proc_output_done_fn done, void *ud,
                             dsec_err *err);
    /* Optional: proc_stdin without a thread, on loop's thread and a connection other than the
     * sandbox's own (like proc_follow_start): the bytes go to the sandbox at once, and done runs
     * when the process took them all, when it ended first, or after DSEC_PROC_WAIT_MAX_MS (the
     * bytes then still go in as it reads). data is copied before it returns. 0 when started
     * (done called once), -1 with err (done never called). */
    int (*proc_stdin_start)(void *self, dsec_sandbox *sb, uint64_t handle, const void *data,
                            size_t len, bool close, struct dsec_loop *loop, dsec_proc_done_fn done,
                            void *ud, dsec_err *err);
    /* Optional: true when every operation of this instance completes at once (no I/O, no
     * modelled time: sim at time_scale 0). The node then runs them where the request
     * arrives, without handing them to its loop or work queue. */
    bool (*instant)(void *self);
} dsec_backend_ops;

/* ---- instances and the call wrappers ----------------------------------------
 * The wrappers check arguments, turn a NULL op into DSEC_E_UNSUPPORTED
 * ("sandbox type "function" does not support snapshot") and call through. */

/* A backend option that is "true" or "false": *out, or -1 with err (DSEC_E_CONFIG) naming
 * key and value. */
int dsec_backend_opt_bool(const char *key, const char *v, bool *out, dsec_err *err);

/* The node's layer cache for a backend with a registry (cfg->layers):
 * cfg->layer_cache_dir, or <state_dir>/layers for a backend opened on its
 * own, one instance per directory (dsec_layer_cache_share). Close it with
 * dsec_layer_cache_free. */
struct dsec_layer_cache;
int dsec_backend_layer_cache(const dsec_backend_config *cfg, const char *state_dir,
                             uint64_t budget_bytes, struct dsec_layer_cache **out, dsec_err *err);

/* Open an instance of ops on this node. *out is owned by the caller and freed
 * with dsec_backend_free. ops must outlive the instance (they are static). */
int dsec_backend_new(dsec_backend **out, const dsec_backend_ops *ops,
                     const dsec_backend_config *cfg, dsec_err *err);
/* Close an instance; NULL is a no-op. Sandboxes must be destroyed or detached. */
void dsec_backend_free(dsec_backend *be);
const char *dsec_backend_type(const dsec_backend *be);

int dsec_backend_create(dsec_backend *be, const dsec_sandbox_spec *spec, dsec_sandbox **out,
                        char **backend_state, dsec_err *err);
/* Run one command and wait for it: the backend's exec, or exec_start on the
 * instance's loop and a wait for its done. */
int dsec_backend_exec(dsec_backend *be, dsec_sandbox *sb, const dsec_exec_req *req,
                      dsec_exec_result *res, dsec_err *err);
/* Whether exec_start is there: commands then need no thread while they run. */
bool dsec_backend_exec_async(const dsec_backend *be);
/* Whether the instance starts sandboxes with create_start, and the call (as
 * dsec_backend_create; DSEC_E_UNSUPPORTED without the op). */
bool dsec_backend_creates_async(const dsec_backend *be);
int dsec_backend_create_start(dsec_backend *be, const dsec_sandbox_spec *spec,
                              struct dsec_loop *loop, dsec_ready_fn done, void *ud,
                              dsec_sandbox **out, char **backend_state, dsec_err *err);
/* Whether the instance forks with fork_start, and the call (as dsec_backend_fork;
 * DSEC_E_UNSUPPORTED without the op). */
bool dsec_backend_forks_async(const dsec_backend *be);
int dsec_backend_fork_start(dsec_backend *be, dsec_sandbox *sb, const char *const *ids, size_t n,
                            struct dsec_loop *loop, dsec_ready_fn done, void *ud,
                            dsec_sandbox **children, char **states, dsec_err *err);
/* Whether the instance's operations complete at once (ops->instant). */
bool dsec_backend_instant(const dsec_backend *be);
/* Start one command on the instance's loop (dsec_backend_config.loop, or a loop of
 * the instance's own); see exec_start. DSEC_E_UNSUPPORTED without exec_start. */
int dsec_backend_exec_start(dsec_backend *be, dsec_sandbox *sb, const dsec_exec_req *req,
                            dsec_exec_done_fn done, void *ud, dsec_err *err);
int dsec_backend_file_write(dsec_backend *be, dsec_sandbox *sb, const char *path, const void *data,
                            size_t len, uint32_t mode, bool append, dsec_err *err);
int dsec_backend_file_read(dsec_backend *be, dsec_sandbox *sb, const char *path, uint64_t offset,
                           uint64_t max, dsec_file_data *out, dsec_err *err);
/* Background processes (ops proc_*): DSEC_E_UNSUPPORTED without them. */
int dsec_backend_proc_start(dsec_backend *be, dsec_sandbox *sb, const dsec_proc_start_req *req,
                            dsec_proc_info *out, dsec_err *err);
int dsec_backend_proc_list(dsec_backend *be, dsec_sandbox *sb, dsec_proc_info **out, size_t *n,
                           dsec_err *err);
int dsec_backend_proc_signal(dsec_backend *be, dsec_sandbox *sb, uint64_t handle, int sig,
                             dsec_err *err);
int dsec_backend_proc_stdin(dsec_backend *be, dsec_sandbox *sb, uint64_t handle, const void *data,
                            size_t len, bool close, dsec_err *err);
int dsec_backend_proc_output(dsec_backend *be, dsec_sandbox *sb, uint64_t handle, uint64_t out_off,
                             uint64_t err_off, uint64_t max, dsec_proc_output *out, dsec_err *err);
/* Terminals and waiting output (ops proc_resize, proc_follow_start): DSEC_E_UNSUPPORTED
 * without them; dsec_backend_proc_follows says whether the waiting one is there. */
int dsec_backend_proc_resize(dsec_backend *be, dsec_sandbox *sb, uint64_t handle, uint16_t rows,
                             uint16_t cols, dsec_err *err);
bool dsec_backend_proc_follows(const dsec_backend *be);
int dsec_backend_proc_follow_start(dsec_backend *be, dsec_sandbox *sb, uint64_t handle,
                                   uint64_t out_off, uint64_t err_off, uint64_t max,
                                   uint32_t wait_ms, struct dsec_loop *loop,
                                   dsec_proc_output_done_fn done, void *ud, dsec_err *err);
/* A stdin write that waits on loop (op proc_stdin_start): DSEC_E_UNSUPPORTED without it;
 * dsec_backend_proc_stdin_async says whether it is there. */
bool dsec_backend_proc_stdin_async(const dsec_backend *be);
int dsec_backend_proc_stdin_start(dsec_backend *be, dsec_sandbox *sb, uint64_t handle,
                                  const void *data, size_t len, bool close, struct dsec_loop *loop,
                                  dsec_proc_done_fn done, void *ud, dsec_err *err);
/* One mkdir, stat, rename or remove (op file_op): DSEC_E_UNSUPPORTED without it. */
int dsec_backend_file_op(dsec_backend *be, dsec_sandbox *sb, const dsec_file_op *op,
                         dsec_file_entry *st, dsec_err *err);
/* Whether file_write_start and file_read_start are there: transfers then need no
 * thread while they run. */
bool dsec_backend_files_async(const dsec_backend *be);
/* Start a file transfer on the instance's loop; see file_write_start.
 * DSEC_E_UNSUPPORTED without it. */
int dsec_backend_file_write_start(dsec_backend *be, dsec_sandbox *sb, const char *path,
                                  const void *data, size_t len, uint32_t mode, bool append,
                                  dsec_file_done_fn done, void *ud, dsec_err *err);
int dsec_backend_file_read_start(dsec_backend *be, dsec_sandbox *sb, const char *path,
                                 uint64_t offset, uint64_t max, dsec_file_done_fn done, void *ud,
                                 dsec_err *err);
int dsec_backend_file_list(dsec_backend *be, dsec_sandbox *sb, const char *path,
                           dsec_file_entry **entries, size_t *n, dsec_err *err);
int dsec_backend_fork(dsec_backend *be, dsec_sandbox *sb, const char *const *ids, size_t n,
                      dsec_sandbox **children, char **states, dsec_err *err);
int dsec_backend_pause(dsec_backend *be, dsec_sandbox *sb, dsec_err *err);
int dsec_backend_resume(dsec_backend *be, dsec_sandbox *sb, dsec_err *err);
int dsec_backend_snapshot(dsec_backend *be, dsec_sandbox *sb, const char *path, const char *name,
                          dsec_err *err);
int dsec_backend_restore(dsec_backend *be, const dsec_sandbox_spec *spec, const char *path,
                         dsec_sandbox **out, char **backend_state, dsec_err *err);
int dsec_backend_destroy(dsec_backend *be, dsec_sandbox *sb, dsec_err *err);
/* Whether the instance has stop_start, and the call (DSEC_E_UNSUPPORTED without it). */
bool dsec_backend_stops_async(const dsec_backend *be);
int dsec_backend_stop_start(dsec_backend *be, dsec_sandbox *sb, struct dsec_loop *loop,
                            dsec_ready_fn done, void *ud, dsec_err *err);
int dsec_backend_stats(dsec_backend *be, dsec_sandbox *sb, dsec_sandbox_stats *out, dsec_err *err);
int dsec_backend_adopt(dsec_backend *be, const dsec_sandbox_spec *spec, const char *backend_state,
                       dsec_sandbox **out, dsec_err *err);
void dsec_backend_detach(dsec_backend *be, dsec_sandbox *sb);
int dsec_backend_net_set(dsec_backend *be, dsec_sandbox *sb, const char *const *entries, size_t n,
                         dsec_err *err);

#ifdef __cplusplus
}
#endif
#endif
