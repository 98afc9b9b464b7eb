/* testkit.c - full sample messages and a strict JSON checker, for tests and fuzzing. */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "codecs/msg.h"
#include "codecs/testkit.h"

/* ---- samples ------------------------------------------------------------------ */

#define N(a) ((uint32_t)(sizeof(a) / sizeof((a)[0])))

static const char *const requires_v[] = {"own_kernel", "isolation:2"};
static const char *const net_v[] = {"pypi.org", "10.0.0.0/8", "mirror:debian"};
static const char *const label_k[] = {"team", "stage", "empty"};
static const char *const live_k[] = {"container", "sim"};
static const char *const live_v[] = {"3000", "190"};
static const char *const label_v[] = {"rl", "train", ""};
static const char *const aff_k[] = {"zone"};
static const char *const aff_v[] = {"a"};
static const char *const tried_v[] = {"n1", "n2"};
static const char *const ids_v[] = {"n7-00000000000000a1", "n7-00000000000000a2"};
static const char *const info_k[] = {"uptime_s", "rss_mb"};
static const char *const info_v[] = {"12", "345"};
static const char *const argv_v[] = {"sh", "-c", "echo \"héllo\"\tworld\n", ""};
static const char *const env_k[] = {"PATH", "LANG"};
static const char *const env_v[] = {"/usr/bin:/bin", "C.UTF-8"};
static const char *const types_v[] = {"container", "function", "sim"};
static const char *const layers_v[] = {"sha256:aaaa", "sha256:bbbb"};
static const uint8_t stdin_b[] = {0, 'a', 0, 'b', 0xff, 0};
static const uint8_t stdout_b[] = {'o', 'u', 't', 0, '\n'};
static const uint8_t stderr_b[] = {0, 0, 0};
static const uint8_t data_b[] = {'d', 0, 't', 0x80, 'a'};

#define STRV(a) ((dsec_strv){.v = (const char **)(a), .n = N(a)})
#define KV(keys, vals)                                                                             \
    ((dsec_kv){.k = (const char **)(keys), .v = (const char **)(vals), .n = N(keys)})
#define BYTES(a) ((dsec_bytes){.ptr = (a), .len = sizeof(a)})

static const dsec_msg_file_entry entries[] = {
    {.name = "a.txt", .kind = "file", .size = 5, .mode = 0644, .mtime = 1700000000},
    {.name = "dir", .kind = "dir", .size = 4096, .mode = 0755, .mtime = -1},
    {.name = "ünïcode link", .kind = "link", .size = 0, .mode = 0777, .mtime = 0},
};

static const dsec_msg_proc_info procs[] = {
    {.handle = 1,
     .pid = 42,
     .running = true,
     .stdin_open = true,
     .started_ns = 1700000000000000000ull,
     .out_total = 5,
     .err_total = 0,
     .cmdline = "python3 -m http.server 8000"},
    {.handle = 2,
     .pid = 43,
     .timed_out = true,
     .exit_code = -1,
     .sig = 9,
     .started_ns = 1700000000000000001ull,
     .ended_ns = 1700000060000000000ull,
     .out_total = 1ull << 33,
     .err_total = 7,
     .cmdline = "sh -c \"sleep 100\""},
};

static const dsec_msg_sbx_info sbx_infos[] = {
    {.id = "n7-00000000000000a0",
     .type = "sim",
     .state = "running",
     .node = "n7",
     .labels = KV(label_k, label_v),
     .project = "rl",
     .created_ns = 1700000000000000000ull,
     .expires_ns = 1700000600000000000ull,
     .cpu_milli = 500,
     .memory_mb = 512},
    {.id = "n7-00000000000000a1", .type = "container", .state = "paused", .node = "n7"},
};

static void sample_create(dsec_msg_create *m)
{
    *m = (dsec_msg_create){
        .req_id = "req-0123456789abcdef",
        .tenant = "acme",
        .project = "proj-1",
        .type = "container",
        .requires = STRV(requires_v),
        .env = "python:3.11",
        .cpu_milli = 1000000,
        .memory_mb = 16777216,
        .disk_mb = 2048,
        .ttl_s = 3600,
        .idle_s = 300,
        .labels = KV(label_k, label_v),
        .affinity = KV(aff_k, aff_v),
        .cell = "c1",
        .cls = "rollout",
        .priority = -5,
        .rollout_id = "ro-42",
        .net = STRV(net_v),
        .hops = 16,
        .retry = 2,
        .pausable = true,
    };
}

static void sample_a(int type, void *out)
{
    switch (type) {
    case DSEC_MSG_ERROR:
        *(dsec_msg_error *)out =
            (dsec_msg_error){.code = "capacity",
                             .message = "no node in cell \"c1\" has 2 GiB free",
                             .retry_safe = true,
                             .field = "memory_mb",
                             .req_id = "req-1"};
        break;
    case DSEC_MSG_PING:
        *(dsec_msg_ping *)out =
            (dsec_msg_ping){.seq = UINT64_MAX, .sent_ns = 1700000000000000000ull, .note = "hi"};
        break;
    case DSEC_MSG_PONG:
        *(dsec_msg_pong *)out = (dsec_msg_pong){.seq = 0, .sent_ns = 1, .actor = "node n1"};
        break;
    case DSEC_MSG_CREATE:
        sample_create(out);
        break;
    case DSEC_MSG_PLACE: {
        dsec_msg_place *p = out;
        sample_create(&p->c);
        p->reply_to = "_INBOX.abc.def";
        p->attempt = 64;
        p->scheduler = "sched-c1-2";
        p->tried = STRV(tried_v);
        p->reason = "no memory";
        p->short_of = "memory";
        p->parked_ms = 1764806400000;
        p->reservation = 77;
        p->free_seq = 1764806400000001;
        p->free_cpu_milli = 250;
        p->free_mem_mb = 64;
        p->free_slots = 3;
        p->free_disk_mb = 512;
        p->sent_us = 86400000123;
        break;
    }
    case DSEC_MSG_CREATED:
        *(dsec_msg_created *)out = (dsec_msg_created){.id = "n7-00000000000000a0",
                                                      .node = "n7",
                                                      .type = "container",
                                                      .state = "running",
                                                      .cell = "c1",
                                                      .req_id = "req-1",
                                                      .existing = true};
        break;
    case DSEC_MSG_OP:
        *(dsec_msg_op *)out = (dsec_msg_op){.id = "n7-00000000000000a0",
                                            .op = "fork",
                                            .n = 1024,
                                            .name = "swe/task-7:step-3",
                                            .req_id = "r",
                                            .tenant = "t",
                                            .net = STRV(net_v),
                                            .ttl_s = 600};
        break;
    case DSEC_MSG_OP_REPLY:
        *(dsec_msg_op_reply *)out = (dsec_msg_op_reply){.id = "n7-00000000000000a0",
                                                        .state = "paused",
                                                        .node = "n7",
                                                        .type = "microvm",
                                                        .ids = STRV(ids_v),
                                                        .info = KV(info_k, info_v)};
        break;
    default:
        break;
    }
}

static void sample_b(int type, void *out)
{
    switch (type) {
    case DSEC_MSG_EXEC:
        *(dsec_msg_exec *)out = (dsec_msg_exec){.id = "n7-00000000000000a0",
                                                .argv = STRV(argv_v),
                                                .env = KV(env_k, env_v),
                                                .cwd = "/work",
                                                .stdin_data = BYTES(stdin_b),
                                                .timeout_ms = 30000,
                                                .user = "agent",
                                                .req_id = "req-x",
                                                .rollout_id = "ro-42",
                                                .step = 17,
                                                .stream_to = "_INBOX.abc.exec",
                                                .output_max = 4096};
        break;
    case DSEC_MSG_EXEC_RESULT:
        *(dsec_msg_exec_result *)out = (dsec_msg_exec_result){.id = "n7-00000000000000a0",
                                                              .exit_code = -1,
                                                              .signal = 64,
                                                              .stdout_data = BYTES(stdout_b),
                                                              .stderr_data = BYTES(stderr_b),
                                                              .stdout_truncated = true,
                                                              .stderr_truncated = true,
                                                              .duration_us = 1234,
                                                              .timed_out = true,
                                                              .cpu_us = 1234,
                                                              .peak_rss_kb = 5678,
                                                              .chunks = 3};
        break;
    case DSEC_MSG_FILE_WRITE:
        *(dsec_msg_file_write *)out =
            (dsec_msg_file_write){.id = "n7-00000000000000a0",
                                  .path = "/work/a b.txt",
                                  .data = BYTES(data_b),
                                  .mode = 07777,
                                  .append = true,
                                  .rollout_id = "ro-42",
                                  .step = 17,
                                  .upload = "up-1_x",
                                  .offset = 8 << 20,
                                  .commit = true,
                                  .sha256 = "e3b0c44298fc1c149afbf4c8996fb924"
                                            "27ae41e4649b934ca495991b7852b855",
                                  .size = 12 << 20};
        break;
    case DSEC_MSG_FILE_READ:
        *(dsec_msg_file_read *)out = (dsec_msg_file_read){.id = "n7-00000000000000a0",
                                                          .path = "/etc/hosts",
                                                          .offset = 10,
                                                          .max = 1 << 20,
                                                          .sha256 = true};
        break;
    case DSEC_MSG_FILE_DATA:
        *(dsec_msg_file_data *)out =
            (dsec_msg_file_data){.id = "n7-00000000000000a0",
                                 .path = "/etc/hosts",
                                 .data = BYTES(data_b),
                                 .size = 99,
                                 .eof = true,
                                 .sha256 = "e3b0c44298fc1c149afbf4c8996fb924"
                                           "27ae41e4649b934ca495991b7852b855"};
        break;
    case DSEC_MSG_FILE_LIST:
        *(dsec_msg_file_list *)out =
            (dsec_msg_file_list){.id = "n7-00000000000000a0", .path = "/work"};
        break;
    case DSEC_MSG_FILE_ENTRY:
        *(dsec_msg_file_entry *)out = entries[0];
        break;
    case DSEC_MSG_FILE_OP:
        *(dsec_msg_file_op *)out = (dsec_msg_file_op){.id = "n7-00000000000000a0",
                                                      .op = "rename",
                                                      .path = "/work/a",
                                                      .to = "/work/b",
                                                      .mode = 0700,
                                                      .parents = true,
                                                      .recursive = true};
        break;
    case DSEC_MSG_FILE_LIST_REPLY:
        *(dsec_msg_file_list_reply *)out =
            (dsec_msg_file_list_reply){.id = "n7-00000000000000a0",
                                       .path = "/work",
                                       .entries = {.items = (void *)entries, .n = N(entries)}};
        break;
    default:
        break;
    }
}

static const dsec_msg_job_hold holds[] = {
    {.job = "train-7", .node = "n7", .unit = "u0", .cpu_milli = 8000, .memory_mb = 32768},
    {.job = "train-7",
     .node = "n8",
     .unit = "u1",
     .cpu_milli = 1000000,
     .memory_mb = 16777216,
     .release = true,
     .forced = true},
};

static const dsec_msg_sandbox_event events[] = {
    {.id = "n7-00000000000000a0",
     .state = "starting",
     .prev = "requested",
     .node = "n7",
     .type = "container",
     .tenant = "acme",
     .ts_ns = 1,
     .project = "rl/math",
     .req_id = "r-42",
     .cpu_milli = 500,
     .memory_mb = 512,
     .trace_id = "a1b2c3"},
    {.id = "n7-00000000000000a0", .state = "running", .prev = "starting", .ts_ns = 2},
};

static const dsec_msg_superseded superseded[] = {
    {.tenant = "acme", .req_id = "r-42", .node = "n8", .retry = 1, .ts_ns = 1700000000000000000ull},
    {.tenant = "beta", .req_id = "r-43", .node = "n9", .retry = 3},
};

static const dsec_msg_trace_hop hops[] = {
    {.trace_id = "a1b2c3",
     .actor = "sched-c1-0",
     .subject = "dsec.v1.acme.create",
     .type = "create",
     .sent = "place",
     .kept = "sample",
     .start_ns = 1700000000000000000ull,
     .end_ns = 1700000000000100000ull},
    {.trace_id = "a1b2c3",
     .actor = "n7",
     .subject = "dsec.v1.ctl.place.n7",
     .type = "place",
     .sent = "error",
     .error = true,
     .kept = "error",
     .start_ns = 1700000000000200000ull,
     .end_ns = UINT64_MAX},
};

static const dsec_msg_place_echo echoes[] = {
    {.scheduler = "c1-s0", .sent_us = 123456789, .age_us = 2500, .taken = 17},
    {.scheduler = "c1-s1", .sent_us = 42}};

static const dsec_msg_usage usages[] = {
    {.tenant = "acme", .project = "rl/math", .sandboxes = 3, .cpu_milli = 1500, .memory_mb = 1536},
    {.tenant = "beta", .sandboxes = 1, .cpu_milli = 250, .memory_mb = 128},
};

static const dsec_msg_quota quotas[] = {
    {.tenant = "acme", .sandboxes = 1000, .cpu_milli = 2000000, .memory_mb = 4194304},
    {.tenant = "acme",
     .project = "rl/math",
     .sandboxes = 100,
     .used_sandboxes = 3,
     .used_cpu_milli = 1500,
     .used_memory_mb = 1536},
};

static void sample_c(int type, void *out)
{
    switch (type) {
    case DSEC_MSG_SANDBOX_EVENT:
        *(dsec_msg_sandbox_event *)out =
            (dsec_msg_sandbox_event){.id = "n7-00000000000000a0",
                                     .state = "failed",
                                     .prev = "starting",
                                     .node = "n7",
                                     .type = "vm",
                                     .tenant = "acme",
                                     .ts_ns = 42,
                                     .reason = "backend: qemu exited 1"};
        break;
    case DSEC_MSG_NODE_ANNOUNCE:
        *(dsec_msg_node_announce *)out = (dsec_msg_node_announce){.node = "n7",
                                                                  .cell = "c1",
                                                                  .types = STRV(types_v),
                                                                  .labels = KV(aff_k, aff_v),
                                                                  .cpu_milli = 192000,
                                                                  .memory_mb = 786432,
                                                                  .slots = 3200,
                                                                  .started_ns = 7};
        break;
    case DSEC_MSG_CAPACITY:
        *(dsec_msg_capacity *)out =
            (dsec_msg_capacity){.node = "n7",
                                .cell = "c1",
                                .seq = 99,
                                .full = true,
                                .cpu_free_milli = 1000,
                                .mem_free_mb = 2048,
                                .slots_free = 10,
                                .live = 3190,
                                .cpu_milli = 192000,
                                .memory_mb = 786432,
                                .slots = 3200,
                                .types = STRV(types_v),
                                .labels = KV(label_k, label_v),
                                .layers = STRV(layers_v),
                                .ts_ns = 8,
                                .live_types = KV(live_k, live_v),
                                .usage = {.items = (void *)usages, .n = N(usages)},
                                .echo = {.items = (void *)echoes, .n = N(echoes)},
                                .disk_free_mb = 4096,
                                .disk_mb = 1048576};
        break;
    case DSEC_MSG_HEARTBEAT:
        *(dsec_msg_heartbeat *)out =
            (dsec_msg_heartbeat){.node = "n7", .cell = "c1", .seq = 5, .ts_ns = 9};
        break;
    case DSEC_MSG_CELL_SUMMARY:
        *(dsec_msg_cell_summary *)out = (dsec_msg_cell_summary){.cell = "c1",
                                                                .nodes = 160,
                                                                .cpu_free_milli = 5,
                                                                .mem_free_mb = 6,
                                                                .slots_free = 7,
                                                                .live = 380000,
                                                                .types = STRV(types_v),
                                                                .ts_ns = 10};
        break;
    case DSEC_MSG_SANDBOX_EVENTS:
        *(dsec_msg_sandbox_events *)out = (dsec_msg_sandbox_events){
            .node = "n7", .cell = "c1", .events = {.items = (void *)events, .n = N(events)}};
        break;
    default:
        break;
    }
}

static void sample_c2(int type, void *out)
{
    switch (type) {
    case DSEC_MSG_JOB_HOLD:
        *(dsec_msg_job_hold *)out = holds[1];
        break;
    case DSEC_MSG_JOB_REGISTER:
        *(dsec_msg_job_register *)out =
            (dsec_msg_job_register){.job = "train-7",
                                    .cell = "c1",
                                    .cls = "job",
                                    .priority = -3,
                                    .checkpoint_ms = 1500,
                                    .grace_ms = 30000,
                                    .holds = {.items = (void *)holds, .n = N(holds)},
                                    .ts_ns = 9};
        break;
    case DSEC_MSG_RECLAIM:
        *(dsec_msg_reclaim *)out = (dsec_msg_reclaim){.req_id = "rc-1",
                                                      .job = "train-7",
                                                      .cpu_milli = 16000,
                                                      .memory_mb = 65536,
                                                      .deadline_ns = 1700000000000000000ull,
                                                      .arbiter = "arb-c1-a",
                                                      .epoch = 12};
        break;
    case DSEC_MSG_RECLAIM_ACK:
        *(dsec_msg_reclaim_ack *)out =
            (dsec_msg_reclaim_ack){.req_id = "rc-1",
                                   .job = "train-7",
                                   .accepted = true,
                                   .checkpoint_ms = 1200,
                                   .reason = "checkpointing to s3://ckpt/7"};
        break;
    case DSEC_MSG_RECLAIM_OUTCOME:
        *(dsec_msg_reclaim_outcome *)out =
            (dsec_msg_reclaim_outcome){.req_id = "rc-1",
                                       .job = "train-7",
                                       .outcome = "forced",
                                       .cpu_milli = 16000,
                                       .memory_mb = 65536,
                                       .requested_ns = 1,
                                       .deadline_ns = 2,
                                       .done_ns = 3,
                                       .arbiter = "arb-c1-a",
                                       .reason = "no release by the deadline",
                                       .holds = {.items = (void *)holds, .n = N(holds)}};
        break;
    case DSEC_MSG_DEMAND:
        *(dsec_msg_demand *)out = (dsec_msg_demand){.scheduler = "sched-c1-0",
                                                    .cell = "c1",
                                                    .waiting = 32000,
                                                    .cpu_milli = 1280000,
                                                    .memory_mb = 2560000,
                                                    .oldest_ms = 750,
                                                    .ts_ns = 10};
        break;
    default:
        break;
    }
}

static void sample_d(int type, void *out)
{
    switch (type) {
    case DSEC_MSG_EXEC_CHUNK:
        *(dsec_msg_exec_chunk *)out = (dsec_msg_exec_chunk){
            .id = "n7-00000000000000a0", .seq = 2, .stream = 2, .data = BYTES(stderr_b)};
        break;
    case DSEC_MSG_NET_ALERT:
        *(dsec_msg_net_alert *)out = (dsec_msg_net_alert){.sandbox = "n7-00000000000000a0",
                                                          .tenant = "acme",
                                                          .node = "n7",
                                                          .cell = "c1",
                                                          .kind = "dns_denied",
                                                          .dest = "q1.exfil.example",
                                                          .detail = "TXT",
                                                          .count = 12,
                                                          .first_ns = 1700000000000000000ull,
                                                          .last_ns = 1700000000900000000ull};
        break;
    case DSEC_MSG_USAGE:
        *(dsec_msg_usage *)out = usages[0];
        break;
    case DSEC_MSG_QUOTA:
        *(dsec_msg_quota *)out = quotas[1];
        break;
    case DSEC_MSG_QUOTA_LIST:
        *(dsec_msg_quota_list *)out = (dsec_msg_quota_list){
            .tenant = "acme", .items = {.items = (void *)quotas, .n = N(quotas)}};
        break;
    case DSEC_MSG_ADMIT:
        *(dsec_msg_admit *)out = (dsec_msg_admit){.tenant = "acme",
                                                  .project = "rl/math",
                                                  .req_id = "r-42",
                                                  .n = 4,
                                                  .cpu_milli = 500,
                                                  .memory_mb = 512};
        break;
    case DSEC_MSG_NODE_LOST:
        *(dsec_msg_node_lost *)out = (dsec_msg_node_lost){.node = "n7",
                                                          .cell = "c1",
                                                          .lost_ns = 1700000000000000000ull,
                                                          .silent_ms = 30000,
                                                          .by = "sched-c1-0"};
        break;
    case DSEC_MSG_SUPERSEDED:
        *(dsec_msg_superseded *)out = superseded[0];
        break;
    case DSEC_MSG_SUPERSEDED_LIST:
        *(dsec_msg_superseded_list *)out = (dsec_msg_superseded_list){
            .by = "sched-c1-0", .items = {.items = (void *)superseded, .n = N(superseded)}};
        break;
    case DSEC_MSG_ARBITER_LEASE:
        *(dsec_msg_arbiter_lease *)out = (dsec_msg_arbiter_lease){
            .holder = "arb-c1-a", .expires_ns = 1700000000000000000ull, .acquired_ns = 11};
        break;
    default:
        break;
    }
}

static void sample_d2(int type, void *out)
{
    switch (type) {
    case DSEC_MSG_TRACE_QUERY:
        *(dsec_msg_trace_query *)out = (dsec_msg_trace_query){.trace_id = "a1b2c3"};
        break;
    case DSEC_MSG_TRACE_HOP:
        *(dsec_msg_trace_hop *)out = hops[0];
        break;
    case DSEC_MSG_PROC:
        *(dsec_msg_proc *)out = (dsec_msg_proc){.id = "n7-00000000000000a0",
                                                .op = "start",
                                                .argv = STRV(argv_v),
                                                .env = KV(env_k, env_v),
                                                .cwd = "/work",
                                                .user = "nobody",
                                                .timeout_ms = 60000,
                                                .ring_max = 1u << 20,
                                                .keep_stdin = true,
                                                .data = BYTES(stdin_b),
                                                .handle = 7,
                                                .sig = 15,
                                                .close = true,
                                                .out_off = 5,
                                                .err_off = 3,
                                                .max = 65536,
                                                .req_id = "r",
                                                .tenant = "t"};
        break;
    case DSEC_MSG_PROC_INFO:
        *(dsec_msg_proc_info *)out = procs[0];
        break;
    case DSEC_MSG_PROC_REPLY:
        *(dsec_msg_proc_reply *)out =
            (dsec_msg_proc_reply){.id = "n7-00000000000000a0",
                                  .procs = {.items = (void *)procs, .n = N(procs)},
                                  .out = BYTES(stdout_b),
                                  .err = BYTES(stderr_b),
                                  .out_from = 1u << 20,
                                  .err_from = 0};
        break;
    case DSEC_MSG_NODE_SET:
        *(dsec_msg_node_set *)out = (dsec_msg_node_set){
            .cell = "c1", .scheduler = "sched-c1-0", .nodes = STRV(tried_v), .cells = STRV(aff_v)};
        break;
    case DSEC_MSG_LIST:
        *(dsec_msg_list *)out = (dsec_msg_list){.labels = KV(label_k, label_v),
                                                .state = "running",
                                                .type = "sim",
                                                .limit = 1000,
                                                .after = "n7-0000000000000009"};
        break;
    case DSEC_MSG_SBX_INFO:
        *(dsec_msg_sbx_info *)out = sbx_infos[0];
        break;
    case DSEC_MSG_PLACE_ECHO:
        *(dsec_msg_place_echo *)out = echoes[0];
        break;
    case DSEC_MSG_LIST_REPLY:
        *(dsec_msg_list_reply *)out =
            (dsec_msg_list_reply){.node = "n7",
                                  .cell = "c1",
                                  .items = {.items = (void *)sbx_infos, .n = N(sbx_infos)},
                                  .more = true};
        break;
    case DSEC_MSG_TRACE_HOPS:
        *(dsec_msg_trace_hops *)out = (dsec_msg_trace_hops){
            .process = "dsecd-c1", .hops = {.items = (void *)hops, .n = N(hops)}};
        break;
    default:
        break;
    }
}

bool dsec_testkit_sample(int type, void *out)
{
    const dsec_schema *s = dsec_schema_of(type);
    if (s == NULL)
        return false;
    memset(out, 0, s->size);
    sample_a(type, out);
    sample_b(type, out);
    sample_c(type, out);
    sample_c2(type, out);
    sample_d(type, out);
    sample_d2(type, out);
    return true;
}

/* ---- strict JSON checker --------------------------------------------------------- */

typedef struct jp {
    const unsigned char *s;
    size_t n, i;
    unsigned depth;
} jp;

enum { JSON_DEPTH = 128 };

static bool value(jp *p);

static void ws(jp *p)
{
    while (p->i < p->n &&
           (p->s[p->i] == ' ' || p->s[p->i] == '\t' || p->s[p->i] == '\n' || p->s[p->i] == '\r'))
        p->i++;
}

static bool lit(jp *p, const char *w)
{
    size_t k = strlen(w);
    if (p->n - p->i < k || memcmp(p->s + p->i, w, k) != 0)
        return false;
    p->i += k;
    return true;
}

static bool digits(jp *p)
{
    size_t start = p->i;
    while (p->i < p->n && p->s[p->i] >= '0' && p->s[p->i] <= '9')
        p->i++;
    return p->i > start;
}

static bool number(jp *p)
{
    if (p->i < p->n && p->s[p->i] == '-')
        p->i++;
    if (p->i < p->n && p->s[p->i] == '0')
        p->i++;
    else if (!(p->i < p->n && p->s[p->i] >= '1' && p->s[p->i] <= '9') || !digits(p))
        return false;
    if (p->i < p->n && p->s[p->i] == '.') {
        p->i++;
        if (!digits(p))
            return false;
    }
    if (p->i < p->n && (p->s[p->i] == 'e' || p->s[p->i] == 'E')) {
        p->i++;
        if (p->i < p->n && (p->s[p->i] == '+' || p->s[p->i] == '-'))
            p->i++;
        if (!digits(p))
            return false;
    }
    return true;
}

static int hex4(jp *p)
{
    if (p->n - p->i < 4)
        return -1;
    int v = 0;
    for (int k = 0; k < 4; k++) {
        unsigned char c = p->s[p->i++];
        int d = c >= '0' && c <= '9'   ? c - '0'
                : c >= 'a' && c <= 'f' ? c - 'a' + 10
                : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                       : -1;
        if (d < 0)
            return -1;
        v = v * 16 + d;
    }
    return v;
}

/* After "\u": a code unit, pairing surrogates. */
static bool uescape(jp *p)
{
    int u = hex4(p);
    if (u < 0 || (u >= 0xdc00 && u <= 0xdfff))
        return false;
    if (u < 0xd800 || u > 0xdbff)
        return true;
    if (!lit(p, "\\u"))
        return false;
    int lo = hex4(p);
    return lo >= 0xdc00 && lo <= 0xdfff;
}

/* One raw UTF-8 sequence starting with byte c >= 0x80 (strict, as RFC 3629). */
static bool utf8_seq(jp *p, unsigned c)
{
    size_t need;
    unsigned lo = 0x80, hi = 0xbf;
    if (c >= 0xc2 && c <= 0xdf)
        need = 1;
    else if (c >= 0xe0 && c <= 0xef)
        need = 2, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
    else if (c >= 0xf0 && c <= 0xf4)
        need = 3, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
    else
        return false;
    if (p->n - p->i < need || p->s[p->i] < lo || p->s[p->i] > hi)
        return false;
    for (size_t k = 1; k < need; k++)
        if ((p->s[p->i + k] & 0xc0) != 0x80)
            return false;
    p->i += need;
    return true;
}

static bool string(jp *p)
{
    if (!lit(p, "\""))
        return false;
    while (p->i < p->n) {
        unsigned c = p->s[p->i++];
        if (c == '"')
            return true;
        if (c < 0x20)
            return false;
        if (c >= 0x80 && !utf8_seq(p, c))
            return false;
        if (c != '\\')
            continue;
        if (p->i >= p->n)
            return false;
        c = p->s[p->i++];
        if (c == 'u') {
            if (!uescape(p))
                return false;
        } else if (!strchr("\"\\/bfnrt", (int)c) || c == 0) {
            return false;
        }
    }
    return false;
}

static bool members(jp *p, char close, bool keyed)
{
    p->i++;
    ws(p);
    if (p->i < p->n && p->s[p->i] == close) {
        p->i++;
        return true;
    }
    for (;;) {
        ws(p);
        if (keyed) {
            if (!string(p))
                return false;
            ws(p);
            if (!lit(p, ":"))
                return false;
        }
        if (!value(p))
            return false;
        ws(p);
        if (p->i < p->n && p->s[p->i] == close) {
            p->i++;
            return true;
        }
        if (!lit(p, ","))
            return false;
    }
}

static bool value(jp *p)
{
    ws(p);
    if (p->i >= p->n)
        return false;
    bool ok;
    switch (p->s[p->i]) {
    case '{':
    case '[':
        if (++p->depth > JSON_DEPTH)
            return false;
        ok = members(p, p->s[p->i] == '{' ? '}' : ']', p->s[p->i] == '{');
        p->depth--;
        return ok;
    case '"':
        return string(p);
    case 't':
        return lit(p, "true");
    case 'f':
        return lit(p, "false");
    case 'n':
        return lit(p, "null");
    default:
        return number(p);
    }
}

bool dsec_testkit_json_valid(const char *s, size_t n, size_t *where)
{
    jp p = {.s = (const unsigned char *)s, .n = n};
    bool ok = value(&p);
    if (ok) {
        ws(&p);
        ok = p.i == p.n;
    }
    if (!ok && where != NULL)
        *where = p.i;
    return ok;
}
