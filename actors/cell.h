/* cell.h - a cell's actors in one process: configuration from YAML, then schedulers and node
 * managers on one bus. */
#ifndef DSEC_ACTORS_CELL_H
#define DSEC_ACTORS_CELL_H

#include <stdbool.h>
#include <stdint.h>

#include "actors/arbiter.h"
#include "actors/quota.h"
#include "actors/node.h"
#include "actors/scheduler.h"
#include "dsec/err.h"

#define DSEC_CELL_MAX_NODES 4096
/* Work-queue threads shared by a process's node managers when one of them has real
 * backends (crun, mkfs, copies run there, fair across tenants and sandboxes); commands run
 * without threads, on the nodes' event loop. */
#define DSEC_CELL_WORK_THREADS 16

typedef struct dsec_cell_node {
    char name[65];
    uint64_t cpu_milli, memory_mb, slots;
    uint64_t disk_mb;         /* 0: the free space of its state dir's filesystem (sim: 1 PiB) */
    uint64_t disk_reserve_mb; /* of it, kept from every sandbox */
    char *types[16];          /* NULL-terminated, owned */
    dsec_backend_kv labels[16];
    size_t nlabels;
    char backend[16];         /* sim | native */
    dsec_backend_kv opts[32]; /* backend options (the node's "sim:" or "options:" map) */
    size_t nopts;
    uint64_t results_budget_mb; /* answers of finished commands kept for retries by req_id:
                                   at most this much (memory, and disk under its state dir) */
    uint64_t results_ttl_s;     /* each for this long after its command finished */
    bool results_volatile;      /* not from YAML: in memory only (benchmarks, node.h) */
} dsec_cell_node;

/* net: network containment of native nodes' sandboxes (docs/network.md). */
typedef struct dsec_cell_net {
    bool enabled;      /* off: sandboxes get an empty namespace, policies are refused */
    unsigned tag_base; /* node i of this process gets tag tag_base + i (0..255 per host) */
    bool ipv6;         /* default false: sandboxes get no IPv6 at all (docs/network.md
                          says what IPv6 costs per sandbox) */
    bool masquerade;   /* SNAT traffic leaving the node (default true) */
    char **upstream;   /* resolvers for allowed names; none: /etc/resolv.conf */
    size_t nupstream;
    char **deny; /* CIDRs never reachable (beyond the built-in ones) */
    size_t ndeny;
    dsec_net_mirror *mirrors; /* names and targets owned */
    size_t nmirrors;
    uint32_t dns_port, dns_qps, conn_rate, alert_window_ms; /* 0: net.h defaults */
    uint32_t dns_cache; /* resolver answers cached per node (net.dns_cache); 0: 10000 */
    uint32_t warm;      /* networks kept ready ahead of creates (net.warm); 0: 8;
                           UINT32_MAX: none (net.warm: 0) */
} dsec_cell_net;

typedef struct dsec_cell_conf {
    char cell[65];
    char url[256];        /* the bus */
    int threads;          /* bus worker threads */
    int work_threads;     /* bus.work_threads: the nodes' threads for operations that need one;
                             0: DSEC_CELL_WORK_THREADS with a native node, else 4 */
    bool low_latency;     /* bus.low_latency: publish at once (default true) */
    bool shared_delivery; /* bus.shared_delivery: nats.c's delivery pool (default true) */
    bool embedded_nats;   /* start a nats-server (dsec up) */
    int nats_port;        /* 0: a free port */
    bool jetstream;
    char state_dir[1024];
    uint64_t default_cpu_milli, default_memory_mb, default_ttl_s, default_idle_s, max_ttl_s;
    uint64_t default_disk_mb,
        default_function_disk_mb; /* a create's disk quota when it names none */
    unsigned sched_replicas, k, max_attempts, max_hops;
    uint32_t dead_after_ms, capacity_ms, full_ms, heartbeat_ms, reap_ms, summary_ms;
    uint32_t lost_after_ms;    /* scheduler.lost_after_ms: a node silent this long is lost */
    uint32_t suspect_after_ms; /* scheduler.suspect_after_ms; 0: 2 * heartbeat_ms */
    uint32_t drain_gap_ms;     /* scheduler.drain_gap_ms; 0: 1000 */
    uint32_t probation_ms;     /* scheduler.probation_ms; 0: 3 * heartbeat_ms */
    int64_t journal_sync_ms;   /* 0: 1000; -1: never */
    uint32_t wait_ms;          /* scheduler.wait_ms: rollout creates wait for room; 0: 30000 */
    uint32_t admit_max;        /* scheduler.admit_max: work a replica holds; 0: 65536 */
    uint32_t park_max;         /* scheduler.park_max: rollouts parked per replica; 0: 1024 */
    uint32_t shed_after_ms;    /* scheduler.shed_after_ms: a create's longest wait in a replica's
                                  mailbox before it is answered "overloaded"; 0: never */
    uint32_t admit_delay_ms;   /* scheduler.admit_delay_ms: placements later than this to their
                                  nodes lower the rate a replica lets creates in; 0: never */
    uint32_t window_ms;        /* scheduler.window_ms: placements a replica may have on their
                                  way, as what its nodes take in this long; 0: no window */
    uint32_t arbiter_lease_ms, arbiter_grace_ms, arbiter_max_per_min;
    unsigned arbiter_replicas;  /* JetStream replicas of the arbiter's buckets; 0: 1 */
    bool quota;                 /* quota.enabled: schedulers admit creates with the quota actor */
    uint32_t quota_pending_ms;  /* 0: max(60000, wait_ms + 30000) */
    uint32_t quota_reload_ms;   /* 0: 10000 */
    uint32_t quota_lease_ms;    /* a standby quota actor takes over after this; 0: 3000 */
    unsigned quota_replicas;    /* of the DSEC_QUOTAS bucket; 0: 1 */
    uint64_t pause_idle_ms;     /* nodes freeze pausable rollouts idle this long... */
    uint32_t pressure_free_pct; /* ...when free memory is below this % (0: 30000 ms, 10 %) */
    int64_t traj_retention_s;   /* trajectory log retention; 0: 7 days */
    int64_t traj_max_bytes;     /* 0: unlimited */
    unsigned traj_replicas;     /* JetStream replicas of DSEC_TRAJ; 0: 1 (3 on a NATS cluster) */
    char layers_kind[16];       /* layers.registry: local | shared | jetstream */
    char layers_path[1024];     /* local/shared: the registry directory; "": <state_dir>/layers */
    char layers_bucket[64];     /* jetstream: the bucket (default DSEC_LAYERS) */
    unsigned layers_replicas;   /* jetstream: replicas of its stream and bucket; 0: 1 */
    dsec_cell_net net;
    char metrics_listen[128]; /* metrics.listen: "HOST:PORT" of the Prometheus endpoint
                                 (docs/metrics.md); "": none */
    double trace_sample_rate; /* trace.sample_rate: share of requests whose hops are kept (0.01) */
    uint32_t trace_slow_ms;   /* trace.slow_ms: hops this slow are always kept (100) */
    uint32_t trace_ring;      /* trace.ring: hops kept by this process (4096; 0: tracing off) */
    dsec_cell_node *nodes;    /* owned */
    size_t nnodes;
} dsec_cell_conf;

/* The embedded defaults (configs/local.yaml says the same). */
void dsec_cell_conf_defaults(dsec_cell_conf *c);
/* Read a YAML file over the defaults. Errors name file, line and key. */
int dsec_cell_conf_load(dsec_cell_conf *c, const char *path, dsec_err *err);
/* The same from text (len bytes, not NUL-terminated); name stands for the
 * file in errors. */
int dsec_cell_conf_parse(dsec_cell_conf *c, const char *name, const char *text, size_t len,
                         dsec_err *err);
/* Set metrics.listen (a --metrics flag over the file): "HOST:PORT", or ""
 * for none. Errors name what is wrong with the address. */
int dsec_cell_conf_set_metrics(dsec_cell_conf *c, const char *listen, dsec_err *err);
/* Set the state directory; a relative one is taken from the current
 * directory and stored absolute (backends that mount need absolute paths). */
int dsec_cell_conf_set_state_dir(dsec_cell_conf *c, const char *dir, dsec_err *err);
/* Add n sim nodes named PREFIX-0000.. with the given resources (benchmarks). */
int dsec_cell_conf_add_sim_nodes(dsec_cell_conf *c, const char *prefix, size_t n, uint64_t cpu,
                                 uint64_t mem, uint64_t slots, const char *const *types,
                                 const char *time_scale, dsec_err *err);
void dsec_cell_conf_release(dsec_cell_conf *c);

enum { DSEC_ROLE_SCHEDULER = 1, DSEC_ROLE_NODE = 2, DSEC_ROLE_ARBITER = 4, DSEC_ROLE_QUOTA = 8 };
/* Parse "scheduler,node,arbiter,quota" into DSEC_ROLE_* bits ("all" is
 * every role; the quota actor runs only where quota.enabled is set). */
int dsec_cell_roles_parse(const char *s, int *roles, dsec_err *err);

typedef struct dsec_cell dsec_cell;

/* Start what roles asks for (and the embedded nats-server when configured).
 * conf is copied. *out is stopped with dsec_cell_stop. */
int dsec_cell_start(dsec_cell **out, const dsec_cell_conf *conf, int roles, dsec_err *err);
/* Stop everything started. Sandboxes stay (re-adopted next start) unless destroy. */
void dsec_cell_stop(dsec_cell *c, bool destroy);
const char *dsec_cell_url(const dsec_cell *c);
dsec_bus *dsec_cell_bus(dsec_cell *c);
size_t dsec_cell_node_count(const dsec_cell *c);
dsec_node *dsec_cell_node_at(dsec_cell *c, size_t i);
size_t dsec_cell_sched_count(const dsec_cell *c);
dsec_sched *dsec_cell_sched_at(dsec_cell *c, size_t i);
/* The arbiter hosted here (role "arbiter"), or NULL. */
dsec_arbiter *dsec_cell_arbiter(dsec_cell *c);
/* The quota actor hosted here (role "quota" with quota.enabled), or NULL. */
dsec_quota *dsec_cell_quota(dsec_cell *c);
/* The port the metrics endpoint listens on (metrics.listen), or 0 when off. */
uint16_t dsec_cell_metrics_port(const dsec_cell *c);

#endif
