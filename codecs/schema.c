/* schema.c - the field tables of every wire message: names, kinds, limits, docs. */
#include <stdbool.h>
#include <stddef.h>
#include <string.h>

#include "codecs/codec.h"
#include "codecs/msg.h"

/* Limits shared by many fields (bytes unless said otherwise). */
enum {
    L_NAME = 64,      /* ids and names: req_id, id, node, cell, tenant, type, state, ... */
    L_LONG = 256,     /* longer names: rollout ids, env names, users, labels */
    L_SUBJECT = 1024, /* NATS subjects */
    L_PATH = 4096,    /* file paths */
    L_TEXT = 4096,    /* human messages */
    L_ARGV = 4096,    /* argv items */
    L_ARG = 131072,   /* one argv or env string: Linux's MAX_ARG_STRLEN */
    L_SET = 256,      /* items in label maps and small lists */
    L_NODES = 1024,   /* node names in one list */
};

#define F_(k, st, mem, wire, req, len, lo, hi, sub, item, d)                                       \
    {                                                                                              \
        .name = (wire), .kind = (k), .required = (req), .offset = offsetof(st, mem),               \
        .max_len = (len), .min = (lo), .max = (hi), .sub_type = (sub), .max_item = (item),         \
        .doc = (d)                                                                                 \
    }
#define FSTR(st, mem, wire, req, len, d) F_(DSEC_F_STR, st, mem, wire, req, len, 0, 0, 0, 0, d)
#define FBIN(st, mem, wire, d) F_(DSEC_F_BIN, st, mem, wire, false, 0, 0, 0, 0, 0, d)
#define FU64(st, mem, wire, req, lo, hi, d) F_(DSEC_F_U64, st, mem, wire, req, 0, lo, hi, 0, 0, d)
#define FI64(st, mem, wire, lo, hi, d) F_(DSEC_F_I64, st, mem, wire, false, 0, lo, hi, 0, 0, d)
#define FBOOL(st, mem, wire, d) F_(DSEC_F_BOOL, st, mem, wire, false, 0, 0, 0, 0, 0, d)
#define FSTRV(st, mem, wire, req, items, item, d)                                                  \
    F_(DSEC_F_STRV, st, mem, wire, req, items, 0, 0, 0, item, d)
#define FKV(st, mem, wire, items, item, d)                                                         \
    F_(DSEC_F_KV, st, mem, wire, false, items, 0, 0, 0, item, d)
#define FLIST(st, mem, wire, sub, d) F_(DSEC_F_LIST, st, mem, wire, false, 0, 0, 0, sub, 0, d)

#define NF(a) (sizeof(a) / sizeof((a)[0]))

static const dsec_field error_fields[] = {
    FSTR(dsec_msg_error, code, "code", true, L_NAME, "error code name (see Error codes)"),
    FSTR(dsec_msg_error, message, "message", true, L_TEXT, "what failed, for humans"),
    FBOOL(dsec_msg_error, retry_safe, "retry_safe", "repeating the request cannot do harm"),
    FSTR(dsec_msg_error, field, "field", false, L_LONG, "the offending request field, if any"),
    FSTR(dsec_msg_error, req_id, "req_id", false, L_NAME, "the request's req_id, if any"),
    FU64(dsec_msg_error, retry_after_ms, "retry_after_ms", false, 0, 0,
         "with `overloaded`: wait this long (ms) before retrying; absent or 0: not said"),
};

static const dsec_field ping_fields[] = {
    FU64(dsec_msg_ping, seq, "seq", true, 0, 0, "sequence number, echoed in the pong"),
    FU64(dsec_msg_ping, sent_ns, "sent_ns", false, 0, 0, "sender's clock (ns since epoch)"),
    FSTR(dsec_msg_ping, note, "note", false, L_TEXT, "free text, echoed"),
};

static const dsec_field pong_fields[] = {
    FU64(dsec_msg_pong, seq, "seq", true, 0, 0, "the ping's seq"),
    FU64(dsec_msg_pong, sent_ns, "sent_ns", false, 0, 0, "the ping's sent_ns"),
    FSTR(dsec_msg_pong, actor, "actor", false, L_LONG, "who answered"),
};

/* The create fields, shared by create and place (which flattens them). pfx
 * is the member path of the create struct inside st ("c." for place). */
#define CREATE_FIELDS(st, pfx)                                                                     \
    FSTR(st, pfx req_id, "req_id", true, L_NAME, "idempotency key: a retry reuses it"),            \
        FSTR(st, pfx tenant, "tenant", false, L_NAME, "tenant (also in the subject)"),             \
        FSTR(st, pfx project, "project", false, L_NAME, "project, for accounting"),                \
        FSTR(st, pfx type, "type", false, L_NAME,                                                  \
             "function, container, microvm, vm or sim; absent: the lightest that fits requires"),  \
        FSTRV(st, pfx requires, "requires", false, 64, L_NAME,                                     \
              "capabilities: own_kernel, nested_containers, gui, persistence, isolation:N, ..."),  \
        FSTR(st, pfx env, "env", false, L_LONG, "environment name:version"),                       \
        FU64(st, pfx cpu_milli, "cpu_milli", false, 0, 1000000, "CPU in thousandths of a core"),   \
        FU64(st, pfx memory_mb, "memory_mb", false, 0, 16777216, "memory in MiB"),                 \
        FU64(st, pfx disk_mb, "disk_mb", false, 0, 0,                                              \
             "writable disk limit in MiB (0: the cell default)"),                                  \
        FU64(st, pfx ttl_s, "ttl_s", false, 0, 0, "maximum lifetime in s; 0: the cell default"),   \
        FU64(st, pfx idle_s, "idle_s", false, 0, 0, "idle timeout in s; 0: the cell default"),     \
        FKV(st, pfx labels, "labels", L_SET, L_LONG, "labels put on the sandbox"),                 \
        FKV(st, pfx affinity, "affinity", L_SET, L_LONG, "node labels the node must carry"),       \
        FSTR(st, pfx cell, "cell", false, L_NAME, "pin to this cell; absent: any cell"),           \
        FSTR(st, pfx cls, "class", false, L_NAME,                                                  \
             "rollout, job or batch (rollouts are never preempted)"),                              \
        FI64(st, pfx priority, "priority", 0, 0, "higher is placed first"),                        \
        FSTR(st, pfx rollout_id, "rollout_id", false, L_LONG, "the rollout this sandbox serves"),  \
        FSTRV(st, pfx net, "net", false, L_NODES, L_LONG,                                          \
              "network policy: allowed mirrors, domains or address ranges"),                       \
        FU64(st, pfx hops, "hops", false, 0, 16, "cross-cell forwards so far"),                    \
        FU64(st, pfx retry, "retry", false, 0, 0, "0 on a first attempt; n on the n-th retry"),    \
        FBOOL(st, pfx pausable, "pausable",                                                        \
              "rollout: may be frozen while idle under memory pressure; the next operation "       \
              "resumes it"),                                                                       \
        FU64(st, pfx deadline_ns, "deadline_ns", false, 0, 0,                                      \
             "the client stops waiting for this attempt then (ns since epoch); a later placement " \
             "is not created")

static const dsec_field create_fields[] = {
    CREATE_FIELDS(dsec_msg_create, ),
};

static const dsec_field place_fields[] = {
    CREATE_FIELDS(dsec_msg_place, c.),
    FSTR(dsec_msg_place, reply_to, "reply_to", true, L_SUBJECT,
         "the client's reply subject: the node answers `created` there"),
    FU64(dsec_msg_place, attempt, "attempt", false, 0, 64, "1-based placement attempt"),
    FSTR(dsec_msg_place, scheduler, "scheduler", false, L_LONG, "the scheduler that placed it"),
    FSTRV(dsec_msg_place, tried, "tried", false, L_NODES, L_NAME, "nodes that already refused"),
    FSTR(dsec_msg_place, reason, "reason", false, L_TEXT, "in a refusal: why the node refused"),
    FSTR(dsec_msg_place, short_of, "short_of", false, L_NAME,
         "in a refusal for room: what the node lacked (`slots`, `cpu`, `memory` or `disk`)"),
    FU64(dsec_msg_place, parked_ms, "parked_ms", false, 0, 0,
         "a rollout that waited for room: when its wait began (ms since epoch); it waits `wait_ms` "
         "from then, across refusals"),
    FU64(dsec_msg_place, reservation, "reservation", false, 0, 0,
         "the scheduler's reservation for this attempt; a node sends it back unchanged in a "
         "refusal"),
    FU64(dsec_msg_place, free_seq, "free_seq", false, 0, 0,
         "in a refusal for room: the sequence number of the node's last capacity report; the "
         "`free_` figures are newer than it (0: no figures)"),
    FU64(dsec_msg_place, free_cpu_milli, "free_cpu_milli", false, 0, 0,
         "in a refusal for room: the node's free milli-CPU when it refused"),
    FU64(dsec_msg_place, free_mem_mb, "free_mem_mb", false, 0, 0,
         "in a refusal for room: the node's free memory (MB) when it refused"),
    FU64(dsec_msg_place, free_slots, "free_slots", false, 0, 0,
         "in a refusal for room: the node's free sandbox slots when it refused"),
    FU64(dsec_msg_place, free_disk_mb, "free_disk_mb", false, 0, 0,
         "in a refusal for room: the disk (MB) the node could still give sandboxes when it "
         "refused"),
    FU64(dsec_msg_place, sent_us, "sent_us", false, 0, 0,
         "the scheduler's own monotonic clock when it sent the placement (µs); the node hands it "
         "back in `capacity.echo` (0: not stamped)"),
};
_Static_assert(NF(place_fields) <= 64, "the decoder tracks fields in a 64-bit set");

static const dsec_field created_fields[] = {
    FSTR(dsec_msg_created, id, "id", true, L_NAME, "sandbox id `<node>-<16 hex>`"),
    FSTR(dsec_msg_created, node, "node", true, L_NAME, "the node that owns it"),
    FSTR(dsec_msg_created, type, "type", true, L_NAME, "the sandbox type started"),
    FSTR(dsec_msg_created, state, "state", false, L_NAME, "its state (see sandbox_event)"),
    FSTR(dsec_msg_created, cell, "cell", false, L_NAME, "the node's cell"),
    FSTR(dsec_msg_created, req_id, "req_id", false, L_NAME, "the create's req_id"),
    FBOOL(dsec_msg_created, existing, "existing", "true: req_id matched an earlier create"),
};

static const dsec_field op_fields[] = {
    FSTR(dsec_msg_op, id, "id", true, L_NAME, "sandbox id"),
    FSTR(dsec_msg_op, op, "op", true, L_NAME,
         "pause, resume, destroy, status, fork, freeze, snapshot, net or ttl; lookup on the "
         "lookup subject"),
    FU64(dsec_msg_op, n, "n", false, 1, 1024, "fork: number of children"),
    FSTR(dsec_msg_op, name, "name", false, L_LONG, "snapshot: environment name:version to publish"),
    FSTRV(dsec_msg_op, net, "net", false, 64, L_LONG,
          "net: the new network policy (mirrors, domains, ranges); empty: reach nothing"),
    FSTR(dsec_msg_op, req_id, "req_id", false, L_NAME, "request id"),
    FSTR(dsec_msg_op, tenant, "tenant", false, L_NAME, "tenant (also in the subject)"),
    FU64(dsec_msg_op, retry, "retry", false, 0, 0, "lookup: the retried create's attempt number"),
    FU64(dsec_msg_op, ttl_s, "ttl_s", false, 0, 0,
         "ttl: the sandbox now ends this many s from now (its whole lifetime within the cell's "
         "max_ttl_s)"),
};

static const dsec_field op_reply_fields[] = {
    FSTR(dsec_msg_op_reply, id, "id", true, L_NAME, "sandbox id"),
    FSTR(dsec_msg_op_reply, state, "state", false, L_NAME, "state after the op"),
    FSTR(dsec_msg_op_reply, node, "node", false, L_NAME, "owning node"),
    FSTR(dsec_msg_op_reply, type, "type", false, L_NAME, "sandbox type"),
    FSTRV(dsec_msg_op_reply, ids, "ids", false, 1024, L_NAME, "fork: the children's ids"),
    FKV(dsec_msg_op_reply, info, "info", L_SET, L_TEXT, "status: details; ttl: expires_ns"),
};

static const dsec_field exec_fields[] = {
    FSTR(dsec_msg_exec, id, "id", true, L_NAME, "sandbox id"),
    FSTRV(dsec_msg_exec, argv, "argv", false, L_ARGV, L_ARG,
          "the command and its arguments; empty: the environment's default command"),
    FKV(dsec_msg_exec, env, "env", L_ARGV, L_ARG, "extra environment variables"),
    FSTR(dsec_msg_exec, cwd, "cwd", false, L_PATH, "working directory"),
    FBIN(dsec_msg_exec, stdin_data, "stdin", "bytes fed to standard input"),
    FU64(dsec_msg_exec, timeout_ms, "timeout_ms", false, 0, 0, "kill after this long; 0: none"),
    FSTR(dsec_msg_exec, user, "user", false, L_LONG, "run as this user"),
    FSTR(dsec_msg_exec, req_id, "req_id", false, L_NAME, "request id"),
    FSTR(dsec_msg_exec, rollout_id, "rollout_id", false, L_LONG, "trajectory log: the rollout"),
    FU64(dsec_msg_exec, step, "step", false, 0, 0, "trajectory log: the step in the rollout"),
    FSTR(dsec_msg_exec, stream_to, "stream_to", false, L_LONG,
         "an _INBOX. subject: output is sent there as exec_chunk while the command runs"),
    FU64(dsec_msg_exec, output_max, "output_max", false, 0, 8u << 20,
         "cap of stdout and of stderr in bytes, the rest dropped and flagged; 0: 1 MiB"),
    FU64(dsec_msg_exec, session, "session", false, 0, 0,
         "a shell session's handle (proc start with session): argv is one command line run in "
         "that shell, keeping its directory and variables; no env, cwd, user or stdin"),
};

static const dsec_field proc_fields[] = {
    FSTR(dsec_msg_proc, id, "id", true, L_NAME, "sandbox id"),
    FSTR(dsec_msg_proc, op, "op", true, L_NAME, "start, list, signal, stdin, output or resize"),
    FSTRV(dsec_msg_proc, argv, "argv", false, L_ARGV, L_ARG,
          "start: the command and its arguments; empty: the environment's default command"),
    FKV(dsec_msg_proc, env, "env", L_ARGV, L_ARG, "start: extra environment variables"),
    FSTR(dsec_msg_proc, cwd, "cwd", false, L_PATH, "start: working directory"),
    FSTR(dsec_msg_proc, user, "user", false, L_LONG, "start: run as this user"),
    FU64(dsec_msg_proc, timeout_ms, "timeout_ms", false, 0, 0,
         "start: kill its whole process tree after this long; 0: none"),
    FU64(dsec_msg_proc, ring_max, "ring_max", false, 0, 16u << 20,
         "start: bytes of stdout and of stderr kept for output; 0: 256 KiB"),
    FBOOL(dsec_msg_proc, keep_stdin, "keep_stdin", "start: stdin stays open for op stdin"),
    FBIN(dsec_msg_proc, data, "data", "start: the first bytes of stdin; stdin: the bytes"),
    FU64(dsec_msg_proc, handle, "handle", false, 0, 0, "signal, stdin, output: the process"),
    FU64(dsec_msg_proc, sig, "signal", false, 0, 64, "signal: the signal number"),
    FBOOL(dsec_msg_proc, close, "close", "stdin: close stdin after data"),
    FU64(dsec_msg_proc, out_off, "out_off", false, 0, 0, "output: stdout offset to read from"),
    FU64(dsec_msg_proc, err_off, "err_off", false, 0, 0, "output: stderr offset to read from"),
    FU64(dsec_msg_proc, max, "max", false, 0, 0,
         "output: at most this many bytes of each stream; 0: all kept"),
    FU64(dsec_msg_proc, wait_ms, "wait_ms", false, 0, 60000,
         "output: with nothing new past the offsets, answer when output comes, the process "
         "ends or this long passed; 0: at once"),
    FBOOL(dsec_msg_proc, pty, "pty", "start: run it on a terminal (stdout carries its output)"),
    FU64(dsec_msg_proc, rows, "rows", false, 0, 65535,
         "start with pty, resize: window rows; 0: 24"),
    FU64(dsec_msg_proc, cols, "cols", false, 0, 65535,
         "start with pty, resize: window columns; 0: 80"),
    FBOOL(dsec_msg_proc, session, "session",
          "start: a persistent shell session (argv: the shell; empty: bash, else sh) for exec "
          "with session"),
    FSTR(dsec_msg_proc, req_id, "req_id", false, L_NAME, "request id"),
    FSTR(dsec_msg_proc, tenant, "tenant", false, L_NAME, "tenant (also in the subject)"),
};

static const dsec_field proc_info_fields[] = {
    FU64(dsec_msg_proc_info, handle, "handle", true, 0, 0, "the process's handle in its sandbox"),
    FI64(dsec_msg_proc_info, pid, "pid", 0, 0, "its pid in the sandbox"),
    FBOOL(dsec_msg_proc_info, running, "running", "it has not exited"),
    FBOOL(dsec_msg_proc_info, stdin_open, "stdin_open", "op stdin may still write"),
    FBOOL(dsec_msg_proc_info, timed_out, "timed_out", "its timeout_ms ended it"),
    FI64(dsec_msg_proc_info, exit_code, "exit_code", -1, 255,
         "when not running: exit status; -1: a signal ended it"),
    FI64(dsec_msg_proc_info, sig, "signal", 0, 64, "when not running: the signal that ended it"),
    FU64(dsec_msg_proc_info, started_ns, "started_ns", false, 0, 0, "wall clock"),
    FU64(dsec_msg_proc_info, ended_ns, "ended_ns", false, 0, 0, "wall clock; 0: running"),
    FU64(dsec_msg_proc_info, out_total, "out_total", false, 0, 0, "stdout bytes produced in all"),
    FU64(dsec_msg_proc_info, err_total, "err_total", false, 0, 0, "stderr bytes produced in all"),
    FSTR(dsec_msg_proc_info, cmdline, "cmdline", false, L_LONG, "its argv joined by spaces"),
    FBOOL(dsec_msg_proc_info, pty, "pty", "it runs on a terminal"),
    FBOOL(dsec_msg_proc_info, session, "session", "it is a shell session"),
    FBOOL(dsec_msg_proc_info, busy, "busy", "a session running a command now"),
};

static const dsec_field proc_reply_fields[] = {
    FSTR(dsec_msg_proc_reply, id, "id", true, L_NAME, "sandbox id"),
    FLIST(dsec_msg_proc_reply, procs, "procs", DSEC_MSG_PROC_INFO,
          "list: every process kept; others: the one named (maps of the proc_info fields)"),
    FBIN(dsec_msg_proc_reply, out, "out", "output: stdout from out_from"),
    FBIN(dsec_msg_proc_reply, err, "err", "output: stderr from err_from"),
    FU64(dsec_msg_proc_reply, out_from, "out_from", false, 0, 0,
         "output: the stdout offset of out's first byte"),
    FU64(dsec_msg_proc_reply, err_from, "err_from", false, 0, 0,
         "output: the stderr offset of err's first byte"),
};

static const dsec_field exec_result_fields[] = {
    FSTR(dsec_msg_exec_result, id, "id", true, L_NAME, "sandbox id"),
    FI64(dsec_msg_exec_result, exit_code, "exit_code", -1, 255, "exit status; -1: none (signal)"),
    FI64(dsec_msg_exec_result, signal, "signal", 0, 64, "the signal that ended it; 0: none"),
    FBIN(dsec_msg_exec_result, stdout_data, "stdout", "standard output"),
    FBIN(dsec_msg_exec_result, stderr_data, "stderr", "standard error"),
    FBOOL(dsec_msg_exec_result, stdout_truncated, "stdout_truncated", "stdout was cut"),
    FBOOL(dsec_msg_exec_result, stderr_truncated, "stderr_truncated", "stderr was cut"),
    FU64(dsec_msg_exec_result, duration_us, "duration_us", false, 0, 0, "run time in µs"),
    FBOOL(dsec_msg_exec_result, timed_out, "timed_out", "killed by timeout_ms"),
    FU64(dsec_msg_exec_result, cpu_us, "cpu_us", false, 0, 0, "CPU time used, microseconds"),
    FU64(dsec_msg_exec_result, peak_rss_kb, "peak_rss_kb", false, 0, 0,
         "peak resident memory, KiB"),
    FU64(dsec_msg_exec_result, chunks, "chunks", false, 0, 0,
         "with stream_to: exec_chunk messages sent"),
    FBOOL(dsec_msg_exec_result, interrupted, "interrupted",
          "a session command ended by an interrupt (proc signal SIGINT)"),
    FBOOL(dsec_msg_exec_result, session_ended, "session_ended",
          "a session command after which the session's shell is gone (exit, killed)"),
};

static const dsec_field net_alert_fields[] = {
    FSTR(dsec_msg_net_alert, sandbox, "sandbox", true, L_NAME, "the sandbox that tried"),
    FSTR(dsec_msg_net_alert, tenant, "tenant", false, L_NAME, "its tenant"),
    FSTR(dsec_msg_net_alert, node, "node", false, L_NAME, "its node"),
    FSTR(dsec_msg_net_alert, cell, "cell", false, L_NAME, "its cell"),
    FSTR(dsec_msg_net_alert, kind, "kind", true, L_NAME,
         "blocked, dns_denied, dns_type, dns_cname, dns_flood, dns_malformed or suppressed"),
    FSTR(dsec_msg_net_alert, dest, "dest", false, L_LONG, "the address or the name asked"),
    FSTR(dsec_msg_net_alert, detail, "detail", false, L_NAME, "tcp/443, udp/53, icmp, TXT, ..."),
    FU64(dsec_msg_net_alert, count, "count", false, 0, 0, "occurrences in the window"),
    FU64(dsec_msg_net_alert, first_ns, "first_ns", false, 0, 0, "first occurrence (wall clock)"),
    FU64(dsec_msg_net_alert, last_ns, "last_ns", false, 0, 0, "last occurrence (wall clock)"),
};

static const dsec_field exec_chunk_fields[] = {
    FSTR(dsec_msg_exec_chunk, id, "id", true, L_NAME, "sandbox id"),
    FU64(dsec_msg_exec_chunk, seq, "seq", false, 0, 0, "0, 1, 2, ... in the order the output came"),
    FU64(dsec_msg_exec_chunk, stream, "stream", true, 1, 2, "1 stdout, 2 stderr"),
    FBIN(dsec_msg_exec_chunk, data, "data", "the output"),
};

static const dsec_field file_write_fields[] = {
    FSTR(dsec_msg_file_write, id, "id", true, L_NAME, "sandbox id"),
    FSTR(dsec_msg_file_write, path, "path", true, L_PATH, "file path in the sandbox"),
    FBIN(dsec_msg_file_write, data, "data", "the bytes to write"),
    FU64(dsec_msg_file_write, mode, "mode", false, 0, 07777, "permission bits; 0: 0644"),
    FBOOL(dsec_msg_file_write, append, "append", "append instead of replacing"),
    FSTR(dsec_msg_file_write, rollout_id, "rollout_id", false, L_LONG,
         "with step: the write is logged in the trajectory log and never repeated"),
    FU64(dsec_msg_file_write, step, "step", false, 0, 0, "the step in the rollout"),
    FSTR(dsec_msg_file_write, upload, "upload", false, L_NAME,
         "upload id ([A-Za-z0-9_-]): chunks go to a hidden temporary file (see Files)"),
    FU64(dsec_msg_file_write, offset, "offset", false, 0, 0,
         "with upload: where this chunk goes; must equal the bytes held"),
    FBOOL(dsec_msg_file_write, commit, "commit",
          "with upload: the last chunk; check size and sha256, then rename over path"),
    FSTR(dsec_msg_file_write, sha256, "sha256", false, 64,
         "with commit: the whole file's SHA-256, lowercase hex"),
    FU64(dsec_msg_file_write, size, "size", false, 0, 0, "with commit: the whole file's size"),
    FBOOL(dsec_msg_file_write, resume, "resume",
          "with upload, no data: answer file_data with size = bytes held (0: none)"),
};

static const dsec_field file_read_fields[] = {
    FSTR(dsec_msg_file_read, id, "id", true, L_NAME, "sandbox id"),
    FSTR(dsec_msg_file_read, path, "path", true, L_PATH, "file path in the sandbox"),
    FU64(dsec_msg_file_read, offset, "offset", false, 0, 0, "first byte to read"),
    FU64(dsec_msg_file_read, max, "max", false, 0, 0, "most bytes to return; 0: the limit"),
    FBOOL(dsec_msg_file_read, sha256, "sha256",
          "the answer that reaches eof carries the whole file's SHA-256"),
};

static const dsec_field file_data_fields[] = {
    FSTR(dsec_msg_file_data, id, "id", true, L_NAME, "sandbox id"),
    FSTR(dsec_msg_file_data, path, "path", true, L_PATH, "file path in the sandbox"),
    FBIN(dsec_msg_file_data, data, "data", "the bytes read (absent for a write)"),
    FU64(dsec_msg_file_data, size, "size", false, 0, 0, "file size after the operation"),
    FBOOL(dsec_msg_file_data, eof, "eof", "data reaches the end of the file"),
    FSTR(dsec_msg_file_data, sha256, "sha256", false, 64,
         "with file_read's sha256, at eof: the whole file's SHA-256, lowercase hex"),
};

static const dsec_field file_op_fields[] = {
    FSTR(dsec_msg_file_op, id, "id", true, L_NAME, "sandbox id"),
    FSTR(dsec_msg_file_op, op, "op", true, L_NAME, "mkdir, stat, rename or remove"),
    FSTR(dsec_msg_file_op, path, "path", true, L_PATH, "the path (rename: the source)"),
    FSTR(dsec_msg_file_op, to, "to", false, L_PATH,
         "rename: the destination (replaced atomically)"),
    FU64(dsec_msg_file_op, mode, "mode", false, 0, 07777, "mkdir: permission bits; 0: 0755"),
    FBOOL(dsec_msg_file_op, parents, "parents",
          "mkdir: create missing parents; an existing directory is no error"),
    FBOOL(dsec_msg_file_op, recursive, "recursive", "remove: a directory and all it holds"),
};

static const dsec_field file_list_fields[] = {
    FSTR(dsec_msg_file_list, id, "id", true, L_NAME, "sandbox id"),
    FSTR(dsec_msg_file_list, path, "path", true, L_PATH, "directory path in the sandbox"),
};

static const dsec_field file_entry_fields[] = {
    FSTR(dsec_msg_file_entry, name, "name", true, L_PATH, "entry name"),
    FSTR(dsec_msg_file_entry, kind, "kind", false, L_NAME, "file, dir, link or other"),
    FU64(dsec_msg_file_entry, size, "size", false, 0, 0, "size in bytes"),
    FU64(dsec_msg_file_entry, mode, "mode", false, 0, 0, "mode bits"),
    FI64(dsec_msg_file_entry, mtime, "mtime", 0, 0, "modification time, s since epoch"),
};

static const dsec_field file_list_reply_fields[] = {
    FSTR(dsec_msg_file_list_reply, id, "id", true, L_NAME, "sandbox id"),
    FSTR(dsec_msg_file_list_reply, path, "path", false, L_PATH, "the directory listed"),
    FLIST(dsec_msg_file_list_reply, entries, "entries", DSEC_MSG_FILE_ENTRY,
          "the entries: maps of the file_entry fields"),
};

static const dsec_field sandbox_event_fields[] = {
    FSTR(dsec_msg_sandbox_event, id, "id", true, L_NAME, "sandbox id"),
    FSTR(dsec_msg_sandbox_event, state, "state", true, L_NAME,
         "requested, starting, running, paused, stopping, gone or failed"),
    FSTR(dsec_msg_sandbox_event, prev, "prev", false, L_NAME, "the state before"),
    FSTR(dsec_msg_sandbox_event, node, "node", false, L_NAME, "owning node"),
    FSTR(dsec_msg_sandbox_event, type, "type", false, L_NAME, "sandbox type"),
    FSTR(dsec_msg_sandbox_event, tenant, "tenant", false, L_NAME, "owning tenant"),
    FU64(dsec_msg_sandbox_event, ts_ns, "ts_ns", false, 0, 0, "when (ns since epoch)"),
    FSTR(dsec_msg_sandbox_event, reason, "reason", false, L_TEXT, "why (failures, reclaims)"),
    FSTR(dsec_msg_sandbox_event, project, "project", false, L_NAME, "its project (quotas)"),
    FSTR(dsec_msg_sandbox_event, req_id, "req_id", false, L_NAME, "the create's req_id"),
    FU64(dsec_msg_sandbox_event, cpu_milli, "cpu_milli", false, 0, 0, "CPU it holds"),
    FU64(dsec_msg_sandbox_event, memory_mb, "memory_mb", false, 0, 0, "memory it holds, MiB"),
    FSTR(dsec_msg_sandbox_event, trace_id, "trace_id", false, L_NAME,
         "the Dsec-Trace-Id of the request that caused it (absent: the node's own doing)"),
};

static const dsec_field node_announce_fields[] = {
    FSTR(dsec_msg_node_announce, node, "node", true, L_NAME, "node name"),
    FSTR(dsec_msg_node_announce, cell, "cell", true, L_NAME, "its cell"),
    FSTRV(dsec_msg_node_announce, types, "types", false, 64, L_NAME, "sandbox types offered"),
    FKV(dsec_msg_node_announce, labels, "labels", L_SET, L_LONG, "node labels (affinity)"),
    FU64(dsec_msg_node_announce, cpu_milli, "cpu_milli", false, 0, 0, "total CPU, thousandths"),
    FU64(dsec_msg_node_announce, memory_mb, "memory_mb", false, 0, 0, "total memory, MiB"),
    FU64(dsec_msg_node_announce, slots, "slots", false, 0, 0, "most sandboxes it will hold"),
    FU64(dsec_msg_node_announce, started_ns, "started_ns", false, 0, 0, "when it started"),
};

static const dsec_field capacity_fields[] = {
    FSTR(dsec_msg_capacity, node, "node", true, L_NAME, "node name"),
    FSTR(dsec_msg_capacity, cell, "cell", false, L_NAME, "its cell"),
    FU64(dsec_msg_capacity, seq, "seq", true, 0, 0, "per-node sequence; older reports are ignored"),
    FBOOL(dsec_msg_capacity, full, "full", "a full report: totals, types, labels, layers set"),
    FU64(dsec_msg_capacity, cpu_free_milli, "cpu_free_milli", false, 0, 0, "free CPU"),
    FU64(dsec_msg_capacity, mem_free_mb, "mem_free_mb", false, 0, 0, "free memory, MiB"),
    FU64(dsec_msg_capacity, slots_free, "slots_free", false, 0, 0, "free sandbox slots"),
    FU64(dsec_msg_capacity, live, "live", false, 0, 0, "sandboxes alive"),
    FU64(dsec_msg_capacity, cpu_milli, "cpu_milli", false, 0, 0, "full: total CPU"),
    FU64(dsec_msg_capacity, memory_mb, "memory_mb", false, 0, 0, "full: total memory, MiB"),
    FU64(dsec_msg_capacity, slots, "slots", false, 0, 0, "full: total slots"),
    FSTRV(dsec_msg_capacity, types, "types", false, 64, L_NAME, "full: sandbox types offered"),
    FKV(dsec_msg_capacity, labels, "labels", L_SET, L_LONG, "full: node labels"),
    FSTRV(dsec_msg_capacity, layers, "layers", false, L_ARGV, L_LONG,
          "full: layer digests in the node's cache (locality)"),
    FU64(dsec_msg_capacity, ts_ns, "ts_ns", false, 0, 0, "when (ns since epoch)"),
    FKV(dsec_msg_capacity, live_types, "live_types", 64, L_NAME,
        "live sandboxes per type: type name -> decimal count"),
    FLIST(dsec_msg_capacity, usage, "usage", DSEC_MSG_USAGE,
          "full: what each tenant's project holds here: maps of the usage fields"),
    FU64(dsec_msg_capacity, conn, "conn", false, 0, 0,
         "connection generation: changes when the node restarts or reconnects (0: not told)"),
    FU64(dsec_msg_capacity, disk_free_mb, "disk_free_mb", false, 0, 0,
         "disk sandboxes may still be given, MiB (`disk_mb` less their quotas)"),
    FU64(dsec_msg_capacity, disk_mb, "disk_mb", false, 0, 0,
         "full: disk sandboxes may hold, MiB: the node's disk less its reserve (absent: the node "
         "does not count disk, and placement does not filter on it)"),
    FLIST(dsec_msg_capacity, echo, "echo", DSEC_MSG_PLACE_ECHO,
          "per scheduler replica, the newest stamped placement the node took: maps of the "
          "place_echo fields"),
};

static const dsec_field place_echo_fields[] = {
    FSTR(dsec_msg_place_echo, scheduler, "scheduler", true, L_LONG,
         "the replica that sent the placement (`place.scheduler`)"),
    FU64(dsec_msg_place_echo, sent_us, "sent_us", true, 0, 0, "`place.sent_us`, unchanged"),
    FU64(dsec_msg_place_echo, age_us, "age_us", false, 0, 0,
         "how long before this report the node took that placement (µs)"),
    FU64(dsec_msg_place_echo, taken, "taken", false, 0, 0,
         "stamped placements the node took from that replica since its previous report"),
};

static const dsec_field heartbeat_fields[] = {
    FSTR(dsec_msg_heartbeat, node, "node", true, L_NAME, "node name"),
    FSTR(dsec_msg_heartbeat, cell, "cell", false, L_NAME, "its cell"),
    FU64(dsec_msg_heartbeat, seq, "seq", false, 0, 0, "per-node sequence"),
    FU64(dsec_msg_heartbeat, ts_ns, "ts_ns", false, 0, 0, "when (ns since epoch)"),
};

static const dsec_field cell_summary_fields[] = {
    FSTR(dsec_msg_cell_summary, cell, "cell", true, L_NAME, "cell name"),
    FU64(dsec_msg_cell_summary, nodes, "nodes", false, 0, 0, "healthy nodes"),
    FU64(dsec_msg_cell_summary, cpu_free_milli, "cpu_free_milli", false, 0, 0, "free CPU"),
    FU64(dsec_msg_cell_summary, mem_free_mb, "mem_free_mb", false, 0, 0, "free memory, MiB"),
    FU64(dsec_msg_cell_summary, slots_free, "slots_free", false, 0, 0, "free sandbox slots"),
    FU64(dsec_msg_cell_summary, live, "live", false, 0, 0, "sandboxes alive"),
    FSTRV(dsec_msg_cell_summary, types, "types", false, 64, L_NAME, "sandbox types offered"),
    FU64(dsec_msg_cell_summary, ts_ns, "ts_ns", false, 0, 0, "when (ns since epoch)"),
    FSTR(dsec_msg_cell_summary, scheduler, "scheduler", false, L_NAME,
         "the scheduler replica that sent it"),
    FU64(dsec_msg_cell_summary, parked, "parked", false, 0, 0,
         "the replica's rollout creates parked for room now"),
    FU64(dsec_msg_cell_summary, held, "held", false, 0, 0,
         "work the replica holds now: creates being admitted, unconfirmed placements, parked"),
    FU64(dsec_msg_cell_summary, admitted, "admitted", false, 0, 0,
         "creates the replica's admission let in since it started"),
    FU64(dsec_msg_cell_summary, shed, "shed", false, 0, 0,
         "creates the replica answered `overloaded` since it started"),
};

static const dsec_field sandbox_events_fields[] = {
    FSTR(dsec_msg_sandbox_events, node, "node", true, L_NAME, "the node whose sandboxes these are"),
    FSTR(dsec_msg_sandbox_events, cell, "cell", false, L_NAME, "its cell"),
    FLIST(dsec_msg_sandbox_events, events, "events", DSEC_MSG_SANDBOX_EVENT,
          "transitions in order: maps of the sandbox_event fields"),
};

static const dsec_field job_hold_fields[] = {
    FSTR(dsec_msg_job_hold, job, "job", true, L_NAME, "the job"),
    FSTR(dsec_msg_job_hold, node, "node", true, L_NAME, "the node the capacity is on"),
    FSTR(dsec_msg_job_hold, unit, "unit", false, L_NAME, "the holding's name within the job"),
    FU64(dsec_msg_job_hold, cpu_milli, "cpu_milli", false, 0, 1000000, "milli-CPU held"),
    FU64(dsec_msg_job_hold, memory_mb, "memory_mb", false, 0, 16777216, "memory held"),
    FBOOL(dsec_msg_job_hold, release, "release", "give the holding back instead of taking it"),
    FBOOL(dsec_msg_job_hold, forced, "forced", "released by the arbiter after a missed deadline"),
};

static const dsec_field job_register_fields[] = {
    FSTR(dsec_msg_job_register, job, "job", true, L_NAME, "job id (names its subjects)"),
    FSTR(dsec_msg_job_register, cell, "cell", true, L_NAME, "the cell it holds capacity in"),
    FSTR(dsec_msg_job_register, cls, "class", false, L_NAME,
         "job (checkpoints) or batch (restarts)"),
    FI64(dsec_msg_job_register, priority, "priority", 0, 0, "lower priorities are reclaimed first"),
    FU64(dsec_msg_job_register, checkpoint_ms, "checkpoint_ms", false, 0, 0,
         "how long a checkpoint takes: cheaper victims first"),
    FU64(dsec_msg_job_register, grace_ms, "grace_ms", false, 0, 0,
         "the time a reclaim gives this job to release; 0: the arbiter's default"),
    FLIST(dsec_msg_job_register, holds, "holds", DSEC_MSG_JOB_HOLD,
          "what the job holds now: maps of the job_hold fields"),
    FU64(dsec_msg_job_register, ts_ns, "ts_ns", false, 0, 0, "when (ns since epoch)"),
};

static const dsec_field reclaim_fields[] = {
    FSTR(dsec_msg_reclaim, req_id, "req_id", true, L_NAME, "names this reclaim in every answer"),
    FSTR(dsec_msg_reclaim, job, "job", true, L_NAME, "the job asked"),
    FU64(dsec_msg_reclaim, cpu_milli, "cpu_milli", false, 0, 0,
         "milli-CPU to give back (at least)"),
    FU64(dsec_msg_reclaim, memory_mb, "memory_mb", false, 0, 0, "memory to give back (at least)"),
    FU64(dsec_msg_reclaim, deadline_ns, "deadline_ns", false, 0, 0,
         "release by then (ns since epoch) or be released by force"),
    FSTR(dsec_msg_reclaim, arbiter, "arbiter", false, L_NAME, "the arbiter asking"),
    FU64(dsec_msg_reclaim, epoch, "epoch", false, 0, 0, "the arbiter lease's revision"),
};

static const dsec_field reclaim_ack_fields[] = {
    FSTR(dsec_msg_reclaim_ack, req_id, "req_id", true, L_NAME, "the reclaim's req_id"),
    FSTR(dsec_msg_reclaim_ack, job, "job", true, L_NAME, "the job answering"),
    FBOOL(dsec_msg_reclaim_ack, accepted, "accepted", "the job will checkpoint and release"),
    FU64(dsec_msg_reclaim_ack, checkpoint_ms, "checkpoint_ms", false, 0, 0,
         "the job's estimate for this checkpoint"),
    FSTR(dsec_msg_reclaim_ack, reason, "reason", false, L_TEXT, "why not, when not accepted"),
};

static const dsec_field reclaim_outcome_fields[] = {
    FSTR(dsec_msg_reclaim_outcome, req_id, "req_id", true, L_NAME, "the reclaim's req_id"),
    FSTR(dsec_msg_reclaim_outcome, job, "job", true, L_NAME, "the job"),
    FSTR(dsec_msg_reclaim_outcome, outcome, "outcome", true, L_NAME,
         "requested, released (by the job), honoured, forced or failed"),
    FU64(dsec_msg_reclaim_outcome, cpu_milli, "cpu_milli", false, 0, 0,
         "milli-CPU released (asked for, while requested)"),
    FU64(dsec_msg_reclaim_outcome, memory_mb, "memory_mb", false, 0, 0,
         "memory released (asked for)"),
    FU64(dsec_msg_reclaim_outcome, requested_ns, "requested_ns", false, 0, 0, "when it was asked"),
    FU64(dsec_msg_reclaim_outcome, deadline_ns, "deadline_ns", false, 0, 0, "its deadline"),
    FU64(dsec_msg_reclaim_outcome, done_ns, "done_ns", false, 0, 0, "when it ended"),
    FSTR(dsec_msg_reclaim_outcome, arbiter, "arbiter", false, L_NAME, "the arbiter that asked"),
    FSTR(dsec_msg_reclaim_outcome, reason, "reason", false, L_TEXT, "why, for forced and failed"),
    FLIST(dsec_msg_reclaim_outcome, holds, "holds", DSEC_MSG_JOB_HOLD,
          "the holdings released: maps of the job_hold fields"),
};

static const dsec_field demand_fields[] = {
    FSTR(dsec_msg_demand, scheduler, "scheduler", true, L_NAME, "the scheduler replica"),
    FSTR(dsec_msg_demand, cell, "cell", false, L_NAME, "its cell"),
    FU64(dsec_msg_demand, waiting, "waiting", false, 0, 0, "rollout creates waiting for room"),
    FU64(dsec_msg_demand, cpu_milli, "cpu_milli", false, 0, 0, "milli-CPU they need together"),
    FU64(dsec_msg_demand, memory_mb, "memory_mb", false, 0, 0, "memory they need together"),
    FU64(dsec_msg_demand, oldest_ms, "oldest_ms", false, 0, 0, "how long the oldest has waited"),
    FU64(dsec_msg_demand, ts_ns, "ts_ns", false, 0, 0, "when (ns since epoch)"),
};

static const dsec_field arbiter_lease_fields[] = {
    FSTR(dsec_msg_arbiter_lease, holder, "holder", true, L_NAME, "the arbiter holding the lease"),
    FU64(dsec_msg_arbiter_lease, expires_ns, "expires_ns", true, 0, 0,
         "the lease lapses then unless renewed (ns since epoch)"),
    FU64(dsec_msg_arbiter_lease, acquired_ns, "acquired_ns", false, 0, 0,
         "when the holder took it"),
};

static const dsec_field usage_fields[] = {
    FSTR(dsec_msg_usage, tenant, "tenant", true, L_NAME, "tenant"),
    FSTR(dsec_msg_usage, project, "project", false, L_NAME, "project path; absent: none"),
    FU64(dsec_msg_usage, sandboxes, "sandboxes", false, 0, 0, "sandboxes it holds"),
    FU64(dsec_msg_usage, cpu_milli, "cpu_milli", false, 0, 0, "CPU they hold"),
    FU64(dsec_msg_usage, memory_mb, "memory_mb", false, 0, 0, "memory they hold, MiB"),
};

static const dsec_field quota_fields[] = {
    FSTR(dsec_msg_quota, tenant, "tenant", true, L_NAME, "tenant"),
    FSTR(dsec_msg_quota, project, "project", false, L_NAME,
         "project path under the tenant (a or a/b); absent: the tenant itself"),
    FU64(dsec_msg_quota, sandboxes, "sandboxes", false, 0, 0,
         "most concurrent sandboxes; 0: no own limit"),
    FU64(dsec_msg_quota, cpu_milli, "cpu_milli", false, 0, 0, "most milli-CPU; 0: no own limit"),
    FU64(dsec_msg_quota, memory_mb, "memory_mb", false, 0, 0, "most memory, MiB; 0: no own limit"),
    FU64(dsec_msg_quota, used_sandboxes, "used_sandboxes", false, 0, 0,
         "answers: sandboxes in use"),
    FU64(dsec_msg_quota, used_cpu_milli, "used_cpu_milli", false, 0, 0,
         "answers: milli-CPU in use"),
    FU64(dsec_msg_quota, used_memory_mb, "used_memory_mb", false, 0, 0,
         "answers: memory in use, MiB"),
    FBOOL(dsec_msg_quota, remove, "remove", "quota set: delete this definition"),
};

static const dsec_field quota_list_fields[] = {
    FSTR(dsec_msg_quota_list, tenant, "tenant", false, L_NAME, "request: only this tenant"),
    FLIST(dsec_msg_quota_list, items, "items", DSEC_MSG_QUOTA, "answer: maps of the quota fields"),
};

static const dsec_field admit_fields[] = {
    FSTR(dsec_msg_admit, tenant, "tenant", true, L_NAME, "tenant"),
    FSTR(dsec_msg_admit, project, "project", false, L_NAME, "project path"),
    FSTR(dsec_msg_admit, req_id, "req_id", true, L_NAME, "the create's req_id"),
    FU64(dsec_msg_admit, n, "n", false, 0, 1024, "sandboxes; 0 counts as 1"),
    FU64(dsec_msg_admit, cpu_milli, "cpu_milli", false, 0, 1000000, "milli-CPU of each"),
    FU64(dsec_msg_admit, memory_mb, "memory_mb", false, 0, 16777216, "memory of each, MiB"),
    FBOOL(dsec_msg_admit, release, "release", "give the admission back (the create failed)"),
};

static const dsec_field node_lost_fields[] = {
    FSTR(dsec_msg_node_lost, node, "node", true, L_NAME, "the node"),
    FSTR(dsec_msg_node_lost, cell, "cell", false, L_NAME, "its cell"),
    FU64(dsec_msg_node_lost, lost_ns, "lost_ns", true, 0, 0, "declared lost then (ns since epoch)"),
    FU64(dsec_msg_node_lost, silent_ms, "silent_ms", false, 0, 0, "how long it had been silent"),
    FSTR(dsec_msg_node_lost, by, "by", false, L_NAME, "the scheduler replica that declared it"),
};

static const dsec_field superseded_fields[] = {
    FSTR(dsec_msg_superseded, tenant, "tenant", true, L_NAME, "the create's tenant"),
    FSTR(dsec_msg_superseded, req_id, "req_id", true, L_NAME, "the create's req_id"),
    FSTR(dsec_msg_superseded, node, "node", true, L_NAME, "the node its retry was placed on"),
    FU64(dsec_msg_superseded, retry, "retry", true, 1, 1000000,
         "that retry's attempt number: a sandbox made by an earlier attempt is dropped"),
    FU64(dsec_msg_superseded, ts_ns, "ts_ns", false, 0, 0, "when (ns since epoch)"),
};

static const dsec_field superseded_list_fields[] = {
    FSTR(dsec_msg_superseded_list, by, "by", false, L_NAME, "the scheduler replica"),
    FLIST(dsec_msg_superseded_list, items, "items", DSEC_MSG_SUPERSEDED,
          "maps of the superseded fields"),
};

static const dsec_field trace_query_fields[] = {
    FSTR(dsec_msg_trace_query, trace_id, "trace_id", true, L_NAME, "the Dsec-Trace-Id to look up"),
};

static const dsec_field trace_hop_fields[] = {
    FSTR(dsec_msg_trace_hop, trace_id, "trace_id", true, L_NAME, "the trace"),
    FSTR(dsec_msg_trace_hop, actor, "actor", true, L_LONG, "the actor that handled it"),
    FSTR(dsec_msg_trace_hop, subject, "subject", false, L_SUBJECT, "the subject it handled"),
    FSTR(dsec_msg_trace_hop, type, "type", false, L_NAME, "the Dsec-Type it handled"),
    FSTR(dsec_msg_trace_hop, sent, "sent", false, L_NAME,
         "the Dsec-Type of the first message it sent for it (`place`, `created`, ...)"),
    FBOOL(dsec_msg_trace_hop, error, "error", "it answered or sent an error, or counted one"),
    FSTR(dsec_msg_trace_hop, kept, "kept", false, L_NAME,
         "why it was kept: `error`, `slow` (took `trace.slow_ms` or more) or `sample`"),
    FU64(dsec_msg_trace_hop, start_ns, "start_ns", false, 0, 0,
         "its handler started (ns since epoch)"),
    FU64(dsec_msg_trace_hop, end_ns, "end_ns", false, 0, 0,
         "its handler returned (ns since epoch)"),
};

static const dsec_field trace_hops_fields[] = {
    FSTR(dsec_msg_trace_hops, process, "process", true, L_LONG, "the answering process"),
    FLIST(dsec_msg_trace_hops, hops, "hops", DSEC_MSG_TRACE_HOP,
          "its kept hops of the trace, oldest first: maps of the trace_hop fields"),
};

static const dsec_field node_set_fields[] = {
    FSTR(dsec_msg_node_set, cell, "cell", false, L_NAME, "answer: the cell answered for"),
    FSTR(dsec_msg_node_set, scheduler, "scheduler", false, L_NAME, "answer: the replica answering"),
    FSTRV(dsec_msg_node_set, nodes, "nodes", false, 65536, L_NAME,
          "answer: every node of the cell the replica knows and has not drained"),
    FSTRV(dsec_msg_node_set, cells, "cells", false, L_NODES, L_NAME,
          "answer: the other cells whose summaries it heard lately"),
};

static const dsec_field list_fields[] = {
    FKV(dsec_msg_list, labels, "labels", L_SET, L_LONG, "sandbox labels that must all match"),
    FSTR(dsec_msg_list, state, "state", false, L_NAME,
         "only sandboxes in this state: requested, starting, running, paused or stopping"),
    FSTR(dsec_msg_list, type, "type", false, L_NAME, "only sandboxes of this type"),
    FU64(dsec_msg_list, limit, "limit", true, 1, 10000, "most items in the answer"),
    FSTR(dsec_msg_list, after, "after", false, L_NAME,
         "the cursor: only ids that sort after this sandbox id (bytewise)"),
};

static const dsec_field sbx_info_fields[] = {
    FSTR(dsec_msg_sbx_info, id, "id", true, L_NAME, "sandbox id"),
    FSTR(dsec_msg_sbx_info, type, "type", false, L_NAME, "sandbox type"),
    FSTR(dsec_msg_sbx_info, state, "state", false, L_NAME, "its state (see sandbox_event)"),
    FSTR(dsec_msg_sbx_info, node, "node", false, L_NAME, "owning node"),
    FKV(dsec_msg_sbx_info, labels, "labels", L_SET, L_LONG, "its labels, as created"),
    FSTR(dsec_msg_sbx_info, project, "project", false, L_NAME, "its project, if any"),
    FU64(dsec_msg_sbx_info, created_ns, "created_ns", false, 0, 0, "when (ns since epoch)"),
    FU64(dsec_msg_sbx_info, expires_ns, "expires_ns", false, 0, 0,
         "its lifetime ends then (ns since epoch); 0: no limit"),
    FU64(dsec_msg_sbx_info, cpu_milli, "cpu_milli", false, 0, 0, "CPU it holds"),
    FU64(dsec_msg_sbx_info, memory_mb, "memory_mb", false, 0, 0, "memory it holds, MiB"),
};

static const dsec_field list_reply_fields[] = {
    FSTR(dsec_msg_list_reply, node, "node", true, L_NAME, "the answering node"),
    FSTR(dsec_msg_list_reply, cell, "cell", false, L_NAME, "its cell"),
    FLIST(
        dsec_msg_list_reply, items, "items", DSEC_MSG_SBX_INFO,
        "its matches after the cursor, sorted by id, at most limit (maps of the sbx_info fields)"),
    FBOOL(dsec_msg_list_reply, more, "more", "it has more matches after the last item"),
};

#define SCHEMA(t, wire, st, f)                                                                     \
    [t] = {.type = (t), .name = (wire), .size = sizeof(st), .fields = (f), .nfields = NF(f)}

static const dsec_schema schemas[DSEC_MSG_TYPE_MAX_] = {
    SCHEMA(DSEC_MSG_ERROR, "error", dsec_msg_error, error_fields),
    SCHEMA(DSEC_MSG_PING, "ping", dsec_msg_ping, ping_fields),
    SCHEMA(DSEC_MSG_PONG, "pong", dsec_msg_pong, pong_fields),
    SCHEMA(DSEC_MSG_CREATE, "create", dsec_msg_create, create_fields),
    SCHEMA(DSEC_MSG_PLACE, "place", dsec_msg_place, place_fields),
    SCHEMA(DSEC_MSG_CREATED, "created", dsec_msg_created, created_fields),
    SCHEMA(DSEC_MSG_OP, "op", dsec_msg_op, op_fields),
    SCHEMA(DSEC_MSG_OP_REPLY, "op_reply", dsec_msg_op_reply, op_reply_fields),
    SCHEMA(DSEC_MSG_EXEC, "exec", dsec_msg_exec, exec_fields),
    SCHEMA(DSEC_MSG_EXEC_RESULT, "exec_result", dsec_msg_exec_result, exec_result_fields),
    SCHEMA(DSEC_MSG_FILE_WRITE, "file_write", dsec_msg_file_write, file_write_fields),
    SCHEMA(DSEC_MSG_FILE_READ, "file_read", dsec_msg_file_read, file_read_fields),
    SCHEMA(DSEC_MSG_FILE_DATA, "file_data", dsec_msg_file_data, file_data_fields),
    SCHEMA(DSEC_MSG_FILE_LIST, "file_list", dsec_msg_file_list, file_list_fields),
    SCHEMA(DSEC_MSG_FILE_LIST_REPLY, "file_list_reply", dsec_msg_file_list_reply,
           file_list_reply_fields),
    SCHEMA(DSEC_MSG_FILE_ENTRY, "file_entry", dsec_msg_file_entry, file_entry_fields),
    SCHEMA(DSEC_MSG_FILE_OP, "file_op", dsec_msg_file_op, file_op_fields),
    SCHEMA(DSEC_MSG_SANDBOX_EVENT, "sandbox_event", dsec_msg_sandbox_event, sandbox_event_fields),
    SCHEMA(DSEC_MSG_NODE_ANNOUNCE, "node_announce", dsec_msg_node_announce, node_announce_fields),
    SCHEMA(DSEC_MSG_CAPACITY, "capacity", dsec_msg_capacity, capacity_fields),
    SCHEMA(DSEC_MSG_HEARTBEAT, "heartbeat", dsec_msg_heartbeat, heartbeat_fields),
    SCHEMA(DSEC_MSG_CELL_SUMMARY, "cell_summary", dsec_msg_cell_summary, cell_summary_fields),
    SCHEMA(DSEC_MSG_SANDBOX_EVENTS, "sandbox_events", dsec_msg_sandbox_events,
           sandbox_events_fields),
    SCHEMA(DSEC_MSG_JOB_HOLD, "job_hold", dsec_msg_job_hold, job_hold_fields),
    SCHEMA(DSEC_MSG_JOB_REGISTER, "job_register", dsec_msg_job_register, job_register_fields),
    SCHEMA(DSEC_MSG_RECLAIM, "reclaim", dsec_msg_reclaim, reclaim_fields),
    SCHEMA(DSEC_MSG_RECLAIM_ACK, "reclaim_ack", dsec_msg_reclaim_ack, reclaim_ack_fields),
    SCHEMA(DSEC_MSG_RECLAIM_OUTCOME, "reclaim_outcome", dsec_msg_reclaim_outcome,
           reclaim_outcome_fields),
    SCHEMA(DSEC_MSG_DEMAND, "demand", dsec_msg_demand, demand_fields),
    SCHEMA(DSEC_MSG_ARBITER_LEASE, "arbiter_lease", dsec_msg_arbiter_lease, arbiter_lease_fields),
    SCHEMA(DSEC_MSG_EXEC_CHUNK, "exec_chunk", dsec_msg_exec_chunk, exec_chunk_fields),
    SCHEMA(DSEC_MSG_NET_ALERT, "net_alert", dsec_msg_net_alert, net_alert_fields),
    SCHEMA(DSEC_MSG_USAGE, "usage", dsec_msg_usage, usage_fields),
    SCHEMA(DSEC_MSG_QUOTA, "quota", dsec_msg_quota, quota_fields),
    SCHEMA(DSEC_MSG_QUOTA_LIST, "quota_list", dsec_msg_quota_list, quota_list_fields),
    SCHEMA(DSEC_MSG_ADMIT, "admit", dsec_msg_admit, admit_fields),
    SCHEMA(DSEC_MSG_NODE_LOST, "node_lost", dsec_msg_node_lost, node_lost_fields),
    SCHEMA(DSEC_MSG_SUPERSEDED, "superseded", dsec_msg_superseded, superseded_fields),
    SCHEMA(DSEC_MSG_SUPERSEDED_LIST, "superseded_list", dsec_msg_superseded_list,
           superseded_list_fields),
    SCHEMA(DSEC_MSG_TRACE_QUERY, "trace_query", dsec_msg_trace_query, trace_query_fields),
    SCHEMA(DSEC_MSG_TRACE_HOP, "trace_hop", dsec_msg_trace_hop, trace_hop_fields),
    SCHEMA(DSEC_MSG_TRACE_HOPS, "trace_hops", dsec_msg_trace_hops, trace_hops_fields),
    SCHEMA(DSEC_MSG_PROC, "proc", dsec_msg_proc, proc_fields),
    SCHEMA(DSEC_MSG_PROC_REPLY, "proc_reply", dsec_msg_proc_reply, proc_reply_fields),
    SCHEMA(DSEC_MSG_PROC_INFO, "proc_info", dsec_msg_proc_info, proc_info_fields),
    SCHEMA(DSEC_MSG_NODE_SET, "node_set", dsec_msg_node_set, node_set_fields),
    SCHEMA(DSEC_MSG_LIST, "list", dsec_msg_list, list_fields),
    SCHEMA(DSEC_MSG_LIST_REPLY, "list_reply", dsec_msg_list_reply, list_reply_fields),
    SCHEMA(DSEC_MSG_SBX_INFO, "sbx_info", dsec_msg_sbx_info, sbx_info_fields),
    SCHEMA(DSEC_MSG_PLACE_ECHO, "place_echo", dsec_msg_place_echo, place_echo_fields),
};

const dsec_schema *dsec_schema_of(int type)
{
    if (type <= DSEC_MSG_NONE || type >= DSEC_MSG_TYPE_MAX_)
        return NULL;
    return &schemas[type];
}

int dsec_msg_type_from_name(const char *name)
{
    if (name == NULL)
        return DSEC_MSG_NONE;
    for (int t = DSEC_MSG_NONE + 1; t < DSEC_MSG_TYPE_MAX_; t++)
        if (strcmp(schemas[t].name, name) == 0)
            return t;
    return DSEC_MSG_NONE;
}

const char *dsec_msg_type_name(int type)
{
    const dsec_schema *s = dsec_schema_of(type);
    return s != NULL ? s->name : "none";
}

static bool name_is(const char *fn, const char *name, size_t n)
{
    return fn[0] == name[0] && strlen(fn) == n && memcmp(fn, name, n) == 0;
}

const dsec_field *dsec__field_find(const dsec_schema *s, const char *name, size_t n, size_t *hint)
{
    if (n == 0)
        return NULL;
    /* Senders usually write fields in schema order (dsec_encode does), so
     * start where the last match left off: one comparison per field. */
    for (size_t k = 0; k < s->nfields; k++) {
        size_t i = (*hint + k) % s->nfields;
        if (name_is(s->fields[i].name, name, n)) {
            *hint = i + 1;
            return &s->fields[i];
        }
    }
    return NULL;
}

uint32_t dsec__field_limit(const dsec_field *f, const dsec_codec_limits *lim)
{
    if (f->max_len != 0)
        return f->max_len;
    switch (f->kind) {
    case DSEC_F_STR:
        return lim->max_str;
    case DSEC_F_BIN:
        return lim->max_bin;
    default:
        return lim->max_items;
    }
}

uint32_t dsec__item_limit(const dsec_field *f, const dsec_codec_limits *lim)
{
    return f->max_item != 0 ? f->max_item : lim->max_str;
}
