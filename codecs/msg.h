/* msg.h - the dsec wire messages: C structs, their schemas, and strict
 * msgpack encode/decode. Only codecs/ knows msgpack layouts. */
#ifndef DSEC_CODECS_MSG_H
#define DSEC_CODECS_MSG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dsec/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Schema version carried in the Dsec-Schema header. Adding an optional field
 * keeps the version; removing or retyping a field, or making one required,
 * bumps it (docs/protocol.md, "Versioning"). */
#define DSEC_SCHEMA_VERSION 1

/* ---- value types used in message structs -------------------------------
 * Decoded strings are NUL-terminated copies in the decoder's arena. Binary
 * fields point into the input buffer (decoded in place). Both stay valid
 * until the next decode on the same decoder, dsec_decoder_free, or until the
 * input buffer is freed, whichever comes first.
 * When encoding, the caller owns everything it points to. */
typedef struct dsec_bytes {
    const uint8_t *ptr;
    size_t len;
} dsec_bytes;

typedef struct dsec_strv { /* array of strings */
    const char **v;
    uint32_t n;
} dsec_strv;

typedef struct dsec_kv { /* map string -> string, in wire order */
    const char **k;
    const char **v;
    uint32_t n;
} dsec_kv;

typedef struct dsec_list { /* array of nested messages (type fixed by the field) */
    void *items;
    uint32_t n;
} dsec_list;

/* ---- message types ------------------------------------------------------ */
enum dsec_msg_type {
    DSEC_MSG_NONE = 0,
    DSEC_MSG_ERROR,           /* "error": any request's failure answer */
    DSEC_MSG_PING,            /* "ping" */
    DSEC_MSG_PONG,            /* "pong" */
    DSEC_MSG_CREATE,          /* "create": client -> scheduler */
    DSEC_MSG_PLACE,           /* "place": scheduler -> node */
    DSEC_MSG_CREATED,         /* "created": node -> client */
    DSEC_MSG_OP,              /* "op": client -> sandbox (pause, resume, destroy, status, fork) */
    DSEC_MSG_OP_REPLY,        /* "op_reply" */
    DSEC_MSG_EXEC,            /* "exec" */
    DSEC_MSG_EXEC_RESULT,     /* "exec_result" */
    DSEC_MSG_FILE_WRITE,      /* "file_write" */
    DSEC_MSG_FILE_READ,       /* "file_read" */
    DSEC_MSG_FILE_DATA,       /* "file_data": answer to file_read and file_write */
    DSEC_MSG_FILE_LIST,       /* "file_list" */
    DSEC_MSG_FILE_LIST_REPLY, /* "file_list_reply" */
    DSEC_MSG_FILE_ENTRY,      /* "file_entry": only nested in file_list_reply */
    DSEC_MSG_FILE_OP,         /* "file_op": mkdir, stat, rename, remove -> file_list_reply */
    DSEC_MSG_SANDBOX_EVENT,   /* "sandbox_event": lifecycle transition */
    DSEC_MSG_NODE_ANNOUNCE,   /* "node_announce" */
    DSEC_MSG_CAPACITY,        /* "capacity": delta or full report */
    DSEC_MSG_HEARTBEAT,       /* "heartbeat" */
    DSEC_MSG_CELL_SUMMARY,    /* "cell_summary" */
    DSEC_MSG_SANDBOX_EVENTS,  /* "sandbox_events": a node's batch of sandbox_event */
    DSEC_MSG_JOB_HOLD,        /* "job_hold": capacity a job holds (or releases) on one node */
    DSEC_MSG_JOB_REGISTER,    /* "job_register": a preemptible job and what it holds -> arbiter */
    DSEC_MSG_RECLAIM,         /* "reclaim": arbiter -> job: give back this much by then */
    DSEC_MSG_RECLAIM_ACK,     /* "reclaim_ack": job -> arbiter, the reclaim's answer */
    DSEC_MSG_RECLAIM_OUTCOME, /* "reclaim_outcome": what became of a reclaim (published) */
    DSEC_MSG_DEMAND,          /* "demand": rollout creates a scheduler holds waiting for room */
    DSEC_MSG_ARBITER_LEASE,   /* "arbiter_lease": the value of the arbiter lease in KV */
    DSEC_MSG_EXEC_CHUNK,      /* "exec_chunk": output of a running command, node -> stream_to */
    DSEC_MSG_NET_ALERT,       /* "net_alert": blocked traffic or a refused DNS query of a sandbox */
    DSEC_MSG_USAGE,      /* "usage": what one tenant's project holds on a node (full capacity) */
    DSEC_MSG_QUOTA,      /* "quota": a tenant's or project's limits, and what it uses */
    DSEC_MSG_QUOTA_LIST, /* "quota_list": the quotas of one tenant, or all */
    DSEC_MSG_ADMIT,      /* "admit": scheduler -> quota actor, before placing a create */
    DSEC_MSG_NODE_LOST,  /* "node_lost": a node silent too long: its sandboxes are lost */
    DSEC_MSG_SUPERSEDED, /* "superseded": a retried create placed on another node */
    DSEC_MSG_SUPERSEDED_LIST, /* "superseded_list": scheduler -> nodes, a batch of superseded */
    DSEC_MSG_TRACE_QUERY,     /* "trace_query": dsec trace -> every actor process */
    DSEC_MSG_TRACE_HOP,       /* "trace_hop": only nested in trace_hops */
    DSEC_MSG_TRACE_HOPS,      /* "trace_hops": one process's kept hops of a trace */
    DSEC_MSG_PROC,            /* "proc": client -> sandbox, background processes */
    DSEC_MSG_PROC_REPLY,      /* "proc_reply" */
    DSEC_MSG_PROC_INFO,       /* "proc_info": only nested in proc_reply */
    DSEC_MSG_NODE_SET,        /* "node_set": a client asks the schedulers which nodes to list */
    DSEC_MSG_LIST,            /* "list": a client asks every node for its tenant's sandboxes */
    DSEC_MSG_LIST_REPLY,      /* "list_reply": one node's page of them */
    DSEC_MSG_SBX_INFO,        /* "sbx_info": only nested in list_reply */
    DSEC_MSG_PLACE_ECHO,      /* "place_echo": only nested in capacity */
    DSEC_MSG_TYPE_MAX_
};

typedef struct dsec_msg_error {
    const char *code;    /* required: a dsec_code_name() */
    const char *message; /* required: human text naming what failed */
    bool retry_safe;
    const char *field; /* the offending field, for decode/validation errors */
    const char *req_id;
    uint64_t retry_after_ms; /* with "overloaded": wait this long before the retry; 0: not said */
} dsec_msg_error;

typedef struct dsec_msg_ping {
    uint64_t seq; /* required */
    uint64_t sent_ns;
    const char *note;
} dsec_msg_ping;

typedef struct dsec_msg_pong {
    uint64_t seq; /* required */
    uint64_t sent_ns;
    const char *actor;
} dsec_msg_pong;

typedef struct dsec_msg_create {
    const char *req_id; /* required, <= 64: idempotency key */
    const char *tenant;
    const char *project;
    const char *type;   /* function | container | microvm | vm | sim; empty: pick by requires */
    dsec_strv requires; /* capabilities: own_kernel, nested_containers, gui, persistence,
                           isolation:N, ... */
    const char *env;    /* environment name:version */
    uint64_t cpu_milli; /* 0..1,000,000 */
    uint64_t memory_mb; /* 0..16,777,216 */
    uint64_t disk_mb;
    uint64_t ttl_s;   /* max lifetime; 0 = cell default */
    uint64_t idle_s;  /* idle timeout; 0 = cell default */
    dsec_kv labels;   /* labels on the sandbox */
    dsec_kv affinity; /* node labels required */
    const char *cell; /* pin to one cell; NULL = any cell */
    const char *cls;  /* wire name "class": rollout | job | batch */
    int64_t priority;
    const char *rollout_id;
    dsec_strv net;        /* network policy entries */
    uint64_t hops;        /* cross-cell forwards so far */
    uint64_t retry;       /* 0 on a first attempt; n on the client's n-th retry of this req_id */
    bool pausable;        /* rollout: may be frozen when idle under memory pressure */
    uint64_t deadline_ns; /* wall clock: the client stops waiting for this attempt then; a node
                             that only gets the placement later does not create it */
} dsec_msg_create;

typedef struct dsec_msg_place {
    dsec_msg_create c;    /* every create field, same names */
    const char *reply_to; /* required: the client's reply subject */
    uint64_t attempt;     /* 1-based */
    const char *scheduler;
    dsec_strv tried;      /* nodes that already refused */
    const char *reason;   /* set by a node sending a refusal back: why it refused */
    const char *short_of; /* a refusal for room: what the node lacked ("slots", "cpu", "memory",
                             "disk") */
    uint64_t parked_ms;   /* when a rollout first waited for room (ms since epoch), 0 if never */
    uint64_t reservation; /* the scheduler's reservation for this attempt; nodes send it back */
    /* A refusal for room: the node's own free figures then, and the sequence number of
     * the capacity report they follow (free_seq 0: no figures). */
    uint64_t free_seq, free_cpu_milli, free_mem_mb, free_slots, free_disk_mb;
    /* The scheduler's own clock when it sent this placement (µs, monotonic): the node hands it
     * back in its capacity reports (place_echo), so the scheduler learns how far behind the
     * node is without comparing clocks. 0: not stamped. */
    uint64_t sent_us;
} dsec_msg_place;

typedef struct dsec_msg_created {
    const char *id;   /* required: sandbox id (names its node) */
    const char *node; /* required */
    const char *type; /* required */
    const char *state;
    const char *cell;
    const char *req_id;
    bool existing; /* true when req_id matched an earlier create */
} dsec_msg_created;

typedef struct dsec_msg_op {
    const char *id; /* required */
    const char *op; /* required: pause | resume | destroy | status | fork | freeze | snapshot | net
                     * | ttl;
                     * lookup (on dsec.v1.ctl.lookup.<cell>) */
    uint64_t n;     /* fork: number of children, 1..1024 */
    const char *name; /* snapshot: the environment name:version to publish it as */
    dsec_strv net;    /* net: the sandbox's new network policy (empty: reach nothing) */
    const char *req_id;
    const char *tenant;
    uint64_t retry; /* lookup: the retried create's attempt number */
    uint64_t ttl_s; /* ttl: the sandbox now ends this many seconds from now */
} dsec_msg_op;

typedef struct dsec_msg_op_reply {
    const char *id; /* required */
    const char *state;
    const char *node;
    const char *type;
    dsec_strv ids; /* fork: the children */
    dsec_kv info;  /* status details */
} dsec_msg_op_reply;

typedef struct dsec_msg_exec {
    const char *id; /* required */
    dsec_strv argv; /* required, 1..4096 */
    dsec_kv env;
    const char *cwd;
    dsec_bytes stdin_data; /* wire name "stdin" */
    uint64_t timeout_ms;
    const char *user;
    const char *req_id;
    const char *rollout_id;
    uint64_t step;
    const char *stream_to; /* an _INBOX. subject: output goes there as exec_chunk while it runs */
    uint64_t output_max;   /* cap of stdout and of stderr, bytes; 0: the backend's default */
    uint64_t session;      /* a shell session's handle: argv[0] is a command line run there */
} dsec_msg_exec;

/* Background processes of a sandbox (docs/protocol.md, "Background processes"). */
typedef struct dsec_msg_proc {
    const char *id;            /* required */
    const char *op;            /* required: start | list | signal | stdin | output | resize */
    dsec_strv argv;            /* start: 1..4096 */
    dsec_kv env;               /* start */
    const char *cwd;           /* start */
    const char *user;          /* start */
    uint64_t timeout_ms;       /* start: its whole tree is killed after this long; 0: none */
    uint64_t ring_max;         /* start: bytes of each stream kept; 0: 256 KiB; <= 16 MiB */
    bool keep_stdin;           /* start: stdin stays open for op stdin */
    dsec_bytes data;           /* start: first bytes of stdin; stdin: the bytes */
    uint64_t handle;           /* signal, stdin, output */
    uint64_t sig;              /* wire name "signal": signal, 1..64 */
    bool close;                /* stdin: close stdin after data */
    uint64_t out_off, err_off; /* output: stream offsets to read from */
    uint64_t max;              /* output: at most this many bytes of each stream; 0: all kept */
    uint64_t wait_ms;          /* output: wait this long for new output (<= 60000); 0: at once */
    bool pty;                  /* start: on a terminal */
    uint64_t rows, cols;       /* start with pty, resize: the window */
    bool session;              /* start: a persistent shell session */
    const char *req_id;
    const char *tenant;
} dsec_msg_proc;

typedef struct dsec_msg_proc_info {
    uint64_t handle; /* required */
    int64_t pid;
    bool running;
    bool stdin_open;
    bool timed_out;
    int64_t exit_code; /* when not running; -1: a signal ended it */
    int64_t sig;       /* wire name "signal" */
    uint64_t started_ns, ended_ns;
    uint64_t out_total, err_total;
    const char *cmdline;
    bool pty;
    bool session;
    bool busy;
} dsec_msg_proc_info;

typedef struct dsec_msg_proc_reply {
    const char *id;      /* required */
    dsec_list procs;     /* of dsec_msg_proc_info: list: all; others: the one named */
    dsec_bytes out, err; /* output */
    uint64_t out_from, err_from;
} dsec_msg_proc_reply;

typedef struct dsec_msg_exec_result {
    const char *id; /* required */
    int64_t exit_code;
    int64_t signal;
    dsec_bytes stdout_data; /* wire name "stdout" */
    dsec_bytes stderr_data; /* wire name "stderr" */
    bool stdout_truncated;
    bool stderr_truncated;
    uint64_t duration_us;
    bool timed_out;
    uint64_t cpu_us;      /* CPU time the command used, where the backend measures it */
    uint64_t peak_rss_kb; /* its peak resident memory, where the backend measures it */
    uint64_t chunks;      /* with stream_to: how many exec_chunk messages were sent */
    bool interrupted;     /* a session command ended by an interrupt */
    bool session_ended;   /* a session command after which the session's shell is gone */
} dsec_msg_exec_result;

typedef struct dsec_msg_exec_chunk {
    const char *id;  /* required: the sandbox */
    uint64_t seq;    /* 0, 1, 2, ... in the order the output came */
    uint64_t stream; /* 1 stdout, 2 stderr */
    dsec_bytes data;
} dsec_msg_exec_chunk;

typedef struct dsec_msg_net_alert {
    const char *sandbox; /* required */
    const char *tenant;
    const char *node;
    const char *cell;
    const char *kind;   /* required: blocked | dns_denied | dns_type | dns_cname | dns_flood |
                           dns_malformed | suppressed */
    const char *dest;   /* the address or name */
    const char *detail; /* tcp/443, udp/53, icmp, TXT, ... */
    uint64_t count;     /* occurrences in the window */
    uint64_t first_ns;
    uint64_t last_ns;
} dsec_msg_net_alert;

typedef struct dsec_msg_file_write {
    const char *id;   /* required */
    const char *path; /* required */
    dsec_bytes data;
    uint64_t mode;
    bool append;
    const char *rollout_id; /* with step: logged in the trajectory log */
    uint64_t step;
    const char *upload; /* a transfer id: data goes to a hidden temporary file */
    uint64_t offset;    /* with upload: where this chunk goes */
    bool commit;        /* with upload: the last chunk; verify and publish */
    const char *sha256; /* with commit: lowercase hex digest of the whole file */
    uint64_t size;      /* with commit: the whole file's size */
    bool resume;        /* with upload and no data: how many bytes are held */
} dsec_msg_file_write;

typedef struct dsec_msg_file_read {
    const char *id;   /* required */
    const char *path; /* required */
    uint64_t offset;
    uint64_t max;
    bool sha256; /* the answer that reaches eof carries the whole file's digest */
} dsec_msg_file_read;

typedef struct dsec_msg_file_data {
    const char *id;   /* required */
    const char *path; /* required */
    dsec_bytes data;
    uint64_t size;
    bool eof;
    const char *sha256; /* with file_read's sha256 at eof: the whole file's digest */
} dsec_msg_file_data;

typedef struct dsec_msg_file_op {
    const char *id;   /* required */
    const char *op;   /* required: mkdir | stat | rename | remove */
    const char *path; /* required: the path (rename: the source) */
    const char *to;   /* rename: the destination */
    uint64_t mode;    /* mkdir: permission bits; 0: 0755 */
    bool parents;     /* mkdir: create missing parents, no error if it exists */
    bool recursive;   /* remove: a directory and everything in it */
} dsec_msg_file_op;

typedef struct dsec_msg_file_list {
    const char *id;   /* required */
    const char *path; /* required */
} dsec_msg_file_list;

typedef struct dsec_msg_file_entry {
    const char *name; /* required */
    const char *kind; /* file | dir | link | other */
    uint64_t size;
    uint64_t mode;
    int64_t mtime;
} dsec_msg_file_entry;

typedef struct dsec_msg_file_list_reply {
    const char *id; /* required */
    const char *path;
    dsec_list entries; /* of dsec_msg_file_entry */
} dsec_msg_file_list_reply;

typedef struct dsec_msg_sandbox_event {
    const char *id; /* required */
    const char
        *state; /* required: requested | starting | running | paused | stopping | gone | failed */
    const char *prev;
    const char *node;
    const char *type;
    const char *tenant;
    uint64_t ts_ns;
    const char *reason;
    const char *project; /* what the quota actor needs to count it */
    const char *req_id;
    uint64_t cpu_milli;
    uint64_t memory_mb;
    const char *trace_id; /* the Dsec-Trace-Id of the request that caused it, if any */
} dsec_msg_sandbox_event;

typedef struct dsec_msg_node_announce {
    const char *node; /* required */
    const char *cell; /* required */
    dsec_strv types;
    dsec_kv labels;
    uint64_t cpu_milli;
    uint64_t memory_mb;
    uint64_t slots;
    uint64_t started_ns;
} dsec_msg_node_announce;

typedef struct dsec_msg_capacity {
    const char *node; /* required */
    const char *cell;
    uint64_t seq; /* required: increases per node; older reports are ignored */
    bool full;    /* a full report also carries totals, types, labels, layers */
    uint64_t cpu_free_milli;
    uint64_t mem_free_mb;
    uint64_t slots_free;
    uint64_t live;
    uint64_t cpu_milli;
    uint64_t memory_mb;
    uint64_t slots;
    dsec_strv types;
    dsec_kv labels;
    dsec_strv layers;
    uint64_t ts_ns;
    dsec_kv live_types; /* live sandboxes per type: type -> decimal count */
    dsec_list usage;    /* full: of dsec_msg_usage, one per (tenant, project) with sandboxes here */
    uint64_t conn;      /* changes when the node restarts or its bus reconnects: it may have
                           missed messages then; 0: not told */
    uint64_t disk_free_mb; /* disk sandboxes may still be given, MiB */
    uint64_t disk_mb;      /* full: disk sandboxes may hold (the node's disk less its reserve);
                              0: the node does not count disk */
    dsec_list echo;        /* of dsec_msg_place_echo: per scheduler, the newest placement taken */
} dsec_msg_capacity;

/* In a capacity report: the newest stamped placement a node took from one scheduler replica
 * (its sent_us, unchanged), and how long before this report it took it. The replica's delay
 * to this node is its clock now, less sent_us, less age_us (plus the report's own trip). */
typedef struct dsec_msg_place_echo {
    const char *scheduler; /* required: the replica that sent it (place.scheduler) */
    uint64_t sent_us;      /* required: place.sent_us */
    uint64_t age_us;       /* how long before the report the node took it */
    uint64_t taken;        /* placements taken from that replica since the previous report */
} dsec_msg_place_echo;

typedef struct dsec_msg_heartbeat {
    const char *node; /* required */
    const char *cell;
    uint64_t seq;
    uint64_t ts_ns;
} dsec_msg_heartbeat;

typedef struct dsec_msg_cell_summary {
    const char *cell; /* required */
    uint64_t nodes;
    uint64_t cpu_free_milli;
    uint64_t mem_free_mb;
    uint64_t slots_free;
    uint64_t live;
    dsec_strv types;
    uint64_t ts_ns;
    /* the replica that sent it, and its admission figures (docs/control-plane.md, Admission) */
    const char *scheduler;
    uint64_t parked;   /* rollout creates parked for room now */
    uint64_t held;     /* work held now: admitting, unconfirmed placements, parked */
    uint64_t admitted; /* creates let in, since the replica started */
    uint64_t shed;     /* creates answered "overloaded", since the replica started */
} dsec_msg_cell_summary;

/* Lifecycle events leave a node in batches (one message per report window),
 * so events never multiply the bus messages per create. */
typedef struct dsec_msg_sandbox_events {
    const char *node; /* required */
    const char *cell;
    dsec_list events; /* of dsec_msg_sandbox_event */
} dsec_msg_sandbox_events;

/* Capacity a job holds on one node: an item of job_register, and the request
 * that reserves (or, with release, frees) it on that node's manager. */
typedef struct dsec_msg_job_hold {
    const char *job;  /* required */
    const char *node; /* required */
    const char *unit; /* the holding's name within the job (unique per job and node) */
    uint64_t cpu_milli;
    uint64_t memory_mb;
    bool release; /* give it back instead of taking it */
    bool forced;  /* released by the arbiter after a missed deadline */
} dsec_msg_job_hold;

typedef struct dsec_msg_job_register {
    const char *job;        /* required */
    const char *cell;       /* required */
    const char *cls;        /* wire name "class": job | batch */
    int64_t priority;       /* lower is reclaimed first */
    uint64_t checkpoint_ms; /* how long a checkpoint takes (the job's estimate) */
    uint64_t grace_ms;      /* the longest the job may be given to release */
    dsec_list holds;        /* of dsec_msg_job_hold: what it holds now */
    uint64_t ts_ns;
} dsec_msg_job_register;

typedef struct dsec_msg_reclaim {
    const char *req_id; /* required: names this reclaim everywhere */
    const char *job;    /* required */
    uint64_t cpu_milli; /* how much to give back (at least) */
    uint64_t memory_mb;
    uint64_t deadline_ns; /* by when (ns since epoch) */
    const char *arbiter;
    uint64_t epoch; /* the arbiter lease's revision when sent */
} dsec_msg_reclaim;

typedef struct dsec_msg_reclaim_ack {
    const char *req_id; /* required */
    const char *job;    /* required */
    bool accepted;
    uint64_t checkpoint_ms; /* the job's estimate for this checkpoint */
    const char *reason;
} dsec_msg_reclaim_ack;

typedef struct dsec_msg_reclaim_outcome {
    const char *req_id;  /* required */
    const char *job;     /* required */
    const char *outcome; /* required: requested | released | honoured | forced | failed */
    uint64_t cpu_milli;  /* released (or asked for, while requested) */
    uint64_t memory_mb;
    uint64_t requested_ns;
    uint64_t deadline_ns;
    uint64_t done_ns;
    const char *arbiter;
    const char *reason;
    dsec_list holds; /* of dsec_msg_job_hold: what was released */
} dsec_msg_reclaim_outcome;

typedef struct dsec_msg_demand {
    const char *scheduler; /* required */
    const char *cell;
    uint64_t waiting;   /* rollout creates waiting for room */
    uint64_t cpu_milli; /* what they need together */
    uint64_t memory_mb;
    uint64_t oldest_ms; /* how long the oldest has waited */
    uint64_t ts_ns;
} dsec_msg_demand;

typedef struct dsec_msg_arbiter_lease {
    const char *holder;  /* required: the arbiter holding the lease */
    uint64_t expires_ns; /* required: wall clock; renewed before */
    uint64_t acquired_ns;
} dsec_msg_arbiter_lease;

typedef struct dsec_msg_usage {
    const char *tenant;  /* required */
    const char *project; /* absent: the tenant's sandboxes outside any project */
    uint64_t sandboxes;
    uint64_t cpu_milli;
    uint64_t memory_mb;
} dsec_msg_usage;

/* Limits of a tenant (project absent) or of a project ("a" or nested "a/b").
 * A limit of 0 means none of its own: only its parents bound it. */
typedef struct dsec_msg_quota {
    const char *tenant; /* required */
    const char *project;
    uint64_t sandboxes;
    uint64_t cpu_milli;
    uint64_t memory_mb;
    uint64_t used_sandboxes; /* in answers: what it and its sub-projects use in the cell now, */
    uint64_t used_cpu_milli; /* admissions still being placed included */
    uint64_t used_memory_mb;
    bool remove; /* quota set: delete the definition instead */
} dsec_msg_quota;

typedef struct dsec_msg_quota_list {
    const char *tenant; /* request: only this tenant's; absent: all */
    dsec_list items;    /* answer: of dsec_msg_quota */
} dsec_msg_quota_list;

/* Admission of a create against its tenant's and projects' quotas. The
 * answer is the same message (admitted) or an error with code "quota". */
typedef struct dsec_msg_admit {
    const char *tenant; /* required */
    const char *project;
    const char *req_id; /* required: a repeated admit of the same request is admitted once */
    uint64_t n;         /* sandboxes (fork children); 0 counts as 1 */
    uint64_t cpu_milli; /* per sandbox */
    uint64_t memory_mb;
    bool release; /* the create was refused after all: give the admission back */
} dsec_msg_admit;

/* A node silent for scheduler.lost_after_ms: to the owners of its sandboxes
 * (dsec.v1.<tenant>.evt.lost), to operators, and, when it returns, to the
 * node itself (dsec.v1.ctl.reconcile.<node>), which then reclaims every
 * sandbox it made before lost_ns: their owners were told they are gone. */
typedef struct dsec_msg_node_lost {
    const char *node; /* required */
    const char *cell;
    uint64_t lost_ns;   /* required: when it was declared lost (wall clock, ns) */
    uint64_t silent_ms; /* how long it had been silent then */
    const char *by;     /* the scheduler replica that declared it */
} dsec_msg_node_lost;

/* A retried create whose lookup found no node holding it was placed on
 * node. Any other node that made a sandbox for the same (tenant, req_id),
 * by an earlier attempt, its answer lost (a partition, a create slower
 * than the client's wait), drops it, and refuses a placement of an earlier
 * attempt that arrives later: the client holds one sandbox per request. */
typedef struct dsec_msg_superseded {
    const char *tenant; /* required */
    const char *req_id; /* required */
    const char *node;   /* required: where the retry was placed (or found, by its lookup) */
    uint64_t retry;     /* required, >= 1: that attempt's number; what an earlier attempt made
                           elsewhere is dropped, what this one or a later one made is kept */
    uint64_t ts_ns;     /* when (wall clock) */
} dsec_msg_superseded;

/* A scheduler replica's superseded notices: one on
 * dsec.v1.ctl.superseded.<cell> as each retry is placed, and those a node
 * may have missed while silent on dsec.v1.ctl.superseded.<cell>.<node>. */
typedef struct dsec_msg_superseded_list {
    const char *by;  /* the scheduler replica */
    dsec_list items; /* of dsec_msg_superseded */
} dsec_msg_superseded_list;

/* dsec trace asks every process on dsec.v1.ctl.trace for what it kept of one
 * request; each answers with its hops (none: an empty list). */
typedef struct dsec_msg_trace_query {
    const char *trace_id; /* required */
} dsec_msg_trace_query;

typedef struct dsec_msg_trace_hop {
    const char *trace_id; /* required */
    const char *actor;    /* required */
    const char *subject;
    const char *type;
    const char *sent;
    bool error;
    const char *kept;
    uint64_t start_ns;
    uint64_t end_ns;
} dsec_msg_trace_hop;

typedef struct dsec_msg_trace_hops {
    const char *process; /* required: the answering process (its bus's name) */
    dsec_list hops;      /* of dsec_msg_trace_hop */
} dsec_msg_trace_hops;

/* Fleet listing (docs/protocol.md, "Listing sandboxes"): the client asks one scheduler
 * replica per cell for the nodes to wait for (node_set, on dsec.v1.<tenant>.nodes), then
 * every node for its page of the tenant's sandboxes (list, on dsec.v1.<tenant>.list). */
typedef struct dsec_msg_node_set {
    const char *cell; /* answer: the cell answered for */
    const char *scheduler;
    dsec_strv nodes; /* answer: every node of the cell the replica knows (not drained) */
    dsec_strv cells; /* answer: the other cells it has heard from lately */
} dsec_msg_node_set;

typedef struct dsec_msg_list {
    dsec_kv labels;    /* every one must match */
    const char *state; /* requested | starting | running | paused | stopping */
    const char *type;
    uint64_t limit;    /* required: 1..10000 */
    const char *after; /* the cursor: only ids sorting after it */
} dsec_msg_list;

typedef struct dsec_msg_sbx_info {
    const char *id; /* required */
    const char *type;
    const char *state;
    const char *node;
    dsec_kv labels;
    const char *project;
    uint64_t created_ns;
    uint64_t expires_ns; /* 0: no lifetime limit */
    uint64_t cpu_milli, memory_mb;
} dsec_msg_sbx_info;

typedef struct dsec_msg_list_reply {
    const char *node; /* required */
    const char *cell;
    dsec_list items; /* of dsec_msg_sbx_info, sorted by id, at most limit */
    bool more;       /* this node has more matches after the last item */
} dsec_msg_list_reply;

/* ---- schemas ------------------------------------------------------------ */

typedef enum dsec_field_kind {
    DSEC_F_STR = 1,
    DSEC_F_BIN,
    DSEC_F_U64,
    DSEC_F_I64,
    DSEC_F_BOOL,
    DSEC_F_STRV,
    DSEC_F_KV,
    DSEC_F_LIST,
} dsec_field_kind;

typedef struct dsec_field {
    const char *name; /* wire name */
    dsec_field_kind kind;
    bool required;
    size_t offset;    /* in the message struct */
    uint32_t max_len; /* strings/bins: bytes; arrays/maps: items; 0 = decoder limit */
    int64_t min;      /* integers: inclusive range (ignored when min == max == 0) */
    int64_t max;
    int sub_type;      /* DSEC_F_LIST: dsec_msg_type of the items */
    uint32_t max_item; /* DSEC_F_STRV/KV: bytes per item string; 0 = decoder max_str */
    const char *doc;   /* one line for docs/protocol.md (dsec decode --schema-md) */
} dsec_field;

typedef struct dsec_schema {
    int type;         /* dsec_msg_type */
    const char *name; /* wire name, the Dsec-Type header */
    size_t size;      /* sizeof the struct */
    const dsec_field *fields;
    size_t nfields;
} dsec_schema;

/* The schema of a type, or NULL for an unknown type. */
const dsec_schema *dsec_schema_of(int type);
/* The type for a wire name ("create"), or DSEC_MSG_NONE. */
int dsec_msg_type_from_name(const char *name);
const char *dsec_msg_type_name(int type);

/* Whether a and b (structs of type) carry the same message: they encode to
 * the same bytes. Absent and empty optional values compare equal. */
bool dsec_msg_equal(int type, const void *a, const void *b);

/* Containers nested deeper than this fail to decode; no message needs more
 * than 3 (message map, entries array, entry map). */
#define DSEC_DECODE_MAX_DEPTH 8
/* msgpack_to_json's bound on nesting. */
#define DSEC_JSON_MAX_DEPTH 32

/* ---- limits --------------------------------------------------------------- */
typedef struct dsec_codec_limits {
    size_t max_payload; /* whole message; default 8 MiB */
    uint32_t max_str;   /* default 4096 bytes */
    uint32_t max_bin;   /* default 8 MiB */
    uint32_t max_items; /* arrays and maps; default 65536 */
} dsec_codec_limits;

void dsec_codec_limits_default(dsec_codec_limits *out);

/* ---- decode --------------------------------------------------------------- */
typedef struct dsec_decoder dsec_decoder;

/* limits may be NULL for the defaults; a zero member takes its default.
 * Returns NULL on allocation failure. */
dsec_decoder *dsec_decoder_new(const dsec_codec_limits *limits);
void dsec_decoder_free(dsec_decoder *d);

/* Strictly decode buf as a message of type into out (a struct of that type,
 * zeroed first). Unknown fields are ignored (forward compatibility); a
 * missing required field, wrong type, out-of-range number, oversize field,
 * duplicate key, trailing bytes or malformed msgpack fail with DSEC_E_DECODE
 * or DSEC_E_TOO_LARGE and a message that names the field. The decoder is not
 * thread-safe: use one per thread. */
int dsec_decode(dsec_decoder *d, int type, const void *buf, size_t len, void *out, dsec_err *err);

/* The field named by the last decode failure on d ("" when none). */
const char *dsec_decoder_bad_field(const dsec_decoder *d);

/* Copy the string value of key in the top-level msgpack map buf[0..len)
 * into out (size n) and return true, when the map has that key (its first
 * occurrence) with a str value of valid UTF-8, no NUL, shorter than n.
 * Nothing else of the payload is checked, so it answers for payloads that
 * fail to decode (too large, a bad field elsewhere): an error can echo the
 * request's own req_id. Reads only within buf; out is "" when false. */
bool dsec_msgpack_peek_str(const void *buf, size_t len, const char *key, char *out, size_t n);

/* ---- encode --------------------------------------------------------------- */
typedef struct dsec_buf {
    char *data;
    size_t len;
    size_t cap;
} dsec_buf;

void dsec_buf_init(dsec_buf *b);
void dsec_buf_release(dsec_buf *b); /* frees data */
/* Make room for n more bytes; -1 (DSEC_E_NOMEM) on allocation failure. */
int dsec_buf_reserve(dsec_buf *b, size_t n, dsec_err *err);
/* Append n bytes of p; -1 (DSEC_E_NOMEM) on allocation failure. */
int dsec_buf_append(dsec_buf *b, const void *p, size_t n, dsec_err *err);

/* Append the field tables of every message, as Markdown, to b (the tables
 * in docs/protocol.md; `dsec decode --schema-md` prints them). */
int dsec_schema_markdown(dsec_buf *b, dsec_err *err);

/* Encode msg (a struct of type) into b, replacing its contents. Optional
 * fields that are NULL, empty, zero or false are omitted. Fails with
 * DSEC_E_INVALID naming the field when a required field is missing or a
 * value breaks its limits (we never send what we would refuse). */
int dsec_encode(dsec_buf *b, int type, const void *msg, dsec_err *err);

/* ---- JSON ------------------------------------------------------------------- */

/* Render any msgpack value (one object, no trailing bytes) as JSON into b.
 * Binary is rendered as {"$bin":"<base64>"} and non-UTF-8 strings the same
 * way, so the output is always valid JSON. Fails on malformed input.
 * b's contents are replaced; no NUL is appended (b->len is the length). */
int dsec_msgpack_to_json(dsec_buf *b, const void *buf, size_t len, dsec_err *err);

#define DSEC_JSON_PRETTY 0x1u /* indent by two spaces, one member per line */

/* dsec_msgpack_to_json with flags (DSEC_JSON_*). Nesting deeper than
 * DSEC_JSON_MAX_DEPTH fails. */
int dsec_msgpack_to_json_ex(dsec_buf *b, const void *buf, size_t len, unsigned flags,
                            dsec_err *err);

#ifdef __cplusplus
}
#endif
#endif
