/* agent-client.h - the node side of the dsec-agent channel: one connection to one sandbox's agent.
 */
#ifndef DSEC_BACKENDS_AGENT_CLIENT_H
#define DSEC_BACKENDS_AGENT_CLIENT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/backend.h"
#include "dsec/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/*
 * dsec-agent runs inside a container (as its init) or a VM and serves the
 * node manager over a stream socket. The node side binds a unix socket on a
 * host path that is not visible inside the sandbox and hands the listening
 * fd to the agent (`dsec-agent --listen-fd N`), so nothing inside the sandbox
 * can reach the channel; after a node-manager restart it reconnects by path.
 * Tests may run the agent outside any container with `--listen PATH`.
 *
 * The wire format (agent-proto.h) is private to the agent and this client.
 *
 * Threading: a dsec_agent is one connection. Calls on one connection are
 * serialised by the caller (the sandbox actor), except dsec_agent_kill, which
 * opens its own short connection and may be called from any thread while an
 * exec is running.
 */
typedef struct dsec_agent dsec_agent;

/* Connect to the agent at the unix socket path, retrying until it answers
 * the hello or timeout_ms passes (DSEC_E_TIMEOUT). path may be longer than
 * sun_path allows (the client goes through a directory fd). *out is owned by
 * the caller and freed with dsec_agent_free. */
int dsec_agent_connect(dsec_agent **out, const char *path, uint64_t timeout_ms, dsec_err *err);
struct dsec_loop;
/* How a dsec_agent_connect_start ended: rc 0 and a (the caller's: dsec_agent_free), or rc -1
 * and err. On the loop's thread. */
typedef void (*dsec_agent_dial_fn)(void *ud, int rc, dsec_agent *a, dsec_err *err);
/* Asked once a second while a dial waits: false ends it, with err set by the callee (what
 * became of the peer: "the VM stopped before its agent answered"). */
typedef bool (*dsec_agent_alive_fn)(void *ud, dsec_err *err);
/* dsec_agent_connect without a thread: the connects, the SYNC and the wait for the HELLO are
 * watches on loop, so a peer that takes seconds to come up (a VM's boot) costs no thread.
 * Each connection waits attempt_ms (0: 2 s) for its HELLO before the next is made; alive (may
 * be NULL) is asked every second; timeout_ms ends it with DSEC_E_TIMEOUT. 0 when started:
 * done is called once, on loop's thread, possibly before this returns. -1 with err (done never
 * called) when it could not start. */
int dsec_agent_connect_start(struct dsec_loop *loop, const char *path, uint64_t timeout_ms,
                             uint64_t attempt_ms, dsec_agent_alive_fn alive,
                             dsec_agent_dial_fn done, void *ud, dsec_err *err);
/* Internal (tests and the fuzz harness): the same handshake as dsec_agent_connect on an
 * already-connected stream socket fd, which the new connection owns from the call on (closed
 * on failure too). */
int dsec__agent_from_fd(dsec_agent **out, int fd, const char *name, uint64_t timeout_ms,
                        dsec_err *err);
/* From now on every exchange on a goes through loop, and several may be in flight at once
 * (the agent answers each request by its id): a call from any thread, a process call beside a
 * waiting output read or stdin write. Calls that stream (exec, file transfers) are not made
 * on it. A call's timeout ends that call only. Calls that wait must not be made on loop's
 * thread (they fail). */
int dsec_agent_mux_on(dsec_agent *a, struct dsec_loop *loop, dsec_err *err);
/* Close the connection (the agent and its commands keep running). NULL is a no-op. */
void dsec_agent_free(dsec_agent *a);
/* Whether a failed call left the connection unusable (lost, timed out, out of step); later
 * calls then fail with DSEC_E_CLOSED and the caller reconnects. A call that failed with an
 * answer from the agent (no such file, unknown user, ...) leaves it usable. */
bool dsec_agent_broken(const dsec_agent *a);

/* Receives output while a command runs: stream 1 is stdout, 2 is stderr.
 * data is borrowed for the call. */
typedef void (*dsec_agent_output_fn)(void *arg, int stream, const uint8_t *data, size_t len);

/* Run one command in the sandbox and wait for it to end. req->argv is run
 * directly (no shell; argv {"/bin/sh","-c",…} for a shell line), in its own
 * process group, with req->env added to the agent's base environment, in
 * req->cwd as req->user (a name from the sandbox's /etc/passwd or a numeric
 * uid[:gid]). stdin_data is fed then closed. After timeout_ms the whole
 * process group gets SIGKILL and res->timed_out is set. Each stream keeps at
 * most output_max bytes (truncated flags set when more came). on_output (may
 * be NULL) sees the output as it arrives. res is filled on success; the
 * caller releases it with dsec_exec_result_release. A command that cannot
 * start (no such file) is a success with exit_code 127 and the reason on
 * stderr, as a shell would report it. */
int dsec_agent_exec(dsec_agent *a, const dsec_exec_req *req, dsec_agent_output_fn on_output,
                    void *arg, dsec_exec_result *res, dsec_err *err);

/* dsec_agent_exec without waiting: send the command and return. done gets the result (rc 0,
 * res owned by done, released with dsec_exec_result_release) or the failure (rc -1, err;
 * dsec_agent_broken then tells whether the connection is lost), once, on loop's thread;
 * on_output runs there too. Until done ran, a is the command's: no other call may use it,
 * nor free it. Returns -1 (done never called) when the command could not be sent. */
typedef void (*dsec_agent_exec_done_fn)(void *ud, int rc, dsec_exec_result *res, dsec_err *err);
int dsec_agent_exec_start(dsec_agent *a, struct dsec_loop *loop, const dsec_exec_req *req,
                          dsec_agent_output_fn on_output, void *arg, dsec_agent_exec_done_fn done,
                          void *ud, dsec_err *err);

/* Give an agent started ahead (a warm pool's, without --env/--workdir/--user) the defaults
 * of the sandbox it now serves: vars ("K=V"; when n > 0 they are the whole base environment),
 * workdir and user (checked against the sandbox's /etc/passwd). Once per agent. */
int dsec_agent_setup(dsec_agent *a, const char *const *vars, size_t n, const char *workdir,
                     const char *user, dsec_err *err);
/* Send sig to the process group of every command the agent is running. */
int dsec_agent_kill(const char *path, int sig, dsec_err *err);

/* Files, by absolute path inside the sandbox. Sizes are capped by the agent
 * (DSEC_AGENT_FILE_MAX per call); larger transfers go in pieces (offset /
 * append). Semantics as the backend.h file ops. */
#define DSEC_AGENT_FILE_MAX (8u << 20)
int dsec_agent_file_write(dsec_agent *a, const char *path, const void *data, size_t len,
                          uint32_t mode, bool append, dsec_err *err);
int dsec_agent_file_read(dsec_agent *a, const char *path, uint64_t offset, uint64_t max,
                         dsec_file_data *out, dsec_err *err);
/* The same transfers without waiting: the whole of it, piece by piece, on loop's thread.
 * done gets rc 0 (a read's data in *data, owned by done: dsec_free(data->data); NULL for a
 * write) or rc -1 and err (dsec_agent_broken then tells whether the connection is lost),
 * once. A write's data is borrowed until done. Until done ran, a is the transfer's. Returns
 * -1 (done never called) when the transfer could not start. */
typedef void (*dsec_agent_file_done_fn)(void *ud, int rc, dsec_file_data *data, dsec_err *err);
int dsec_agent_file_write_start(dsec_agent *a, struct dsec_loop *loop, const char *path,
                                const void *data, size_t len, uint32_t mode, bool append,
                                dsec_agent_file_done_fn done, void *ud, dsec_err *err);
int dsec_agent_file_read_start(dsec_agent *a, struct dsec_loop *loop, const char *path,
                               uint64_t offset, uint64_t max, dsec_agent_file_done_fn done,
                               void *ud, dsec_err *err);
/* A directory's entries, or one entry describing path when it is not a directory. */
int dsec_agent_file_list(dsec_agent *a, const char *path, dsec_file_entry **entries, size_t *n,
                         dsec_err *err);
/* Describe one path (lstat); out->name is a dsec_malloc'd copy of the last component. */
int dsec_agent_file_stat(dsec_agent *a, const char *path, dsec_file_entry *out, dsec_err *err);
/* Remove a file, or a directory (with its contents when recursive). */
int dsec_agent_file_remove(dsec_agent *a, const char *path, bool recursive, dsec_err *err);
/* Create a directory (mode 0: 0755); with parents, its missing parents too, and an existing
 * directory is no error. */
int dsec_agent_file_mkdir(dsec_agent *a, const char *path, uint32_t mode, bool parents,
                          dsec_err *err);
/* rename(2) from over to; with sync, from's data and the rename reach the disk first. */
int dsec_agent_file_rename(dsec_agent *a, const char *from, const char *to, bool sync,
                           dsec_err *err);
/* One backend file_op through the calls above (st: a stat's answer; st->name is the
 * caller's, as dsec_agent_file_stat's). */
int dsec_agent_file_op(dsec_agent *a, const dsec_file_op *op, dsec_file_entry *st, dsec_err *err);

/* Background processes (backend.h, "background processes"): the agent keeps them, detached
 * from every connection, until the sandbox ends. Semantics as the backend ops proc_*. */
int dsec_agent_proc_start(dsec_agent *a, const dsec_proc_start_req *req, dsec_proc_info *out,
                          dsec_err *err);
int dsec_agent_proc_list(dsec_agent *a, dsec_proc_info **out, size_t *n, dsec_err *err);
int dsec_agent_proc_signal(dsec_agent *a, uint64_t handle, int sig, dsec_err *err);
int dsec_agent_proc_stdin(dsec_agent *a, uint64_t handle, const void *data, size_t len, bool close,
                          dsec_err *err);
int dsec_agent_proc_output(dsec_agent *a, uint64_t handle, uint64_t out_off, uint64_t err_off,
                           uint64_t max, dsec_proc_output *out, dsec_err *err);
/* Change a terminal's window (a process started with req->pty). */
int dsec_agent_proc_resize(dsec_agent *a, uint64_t handle, uint16_t rows, uint16_t cols,
                           dsec_err *err);
/* dsec_agent_proc_output without a thread, waiting on the agent: when neither stream has a
 * byte past its offset and the process runs, the answer comes once one has, the process ends
 * or wait_ms (at most DSEC_PROC_WAIT_MAX_MS) passes. done gets rc 0 and *out (owned by done:
 * dsec_proc_output_release) or rc -1 and err (dsec_agent_broken then tells whether the
 * connection is lost), once, on loop's thread. Until done ran, a is the request's: no other
 * call may use it, nor free it. Returns -1 (done never called) when it could not be sent. */
int dsec_agent_proc_output_start(dsec_agent *a, struct dsec_loop *loop, uint64_t handle,
                                 uint64_t out_off, uint64_t err_off, uint64_t max, uint32_t wait_ms,
                                 dsec_proc_output_done_fn done, void *ud, dsec_err *err);
/* dsec_agent_proc_stdin on loop: done(ud, 0, NULL) once the process took every byte, or rc -1
 * and err: refused, the process ended first, the connection lost, or wait_max_ms passed
 * (DSEC_E_TIMEOUT; the bytes still go in as it reads, and a is then broken: its answer is
 * abandoned). wait_max_ms 0 is DSEC_PROC_WAIT_MAX_MS, and more than that is refused. data is
 * copied before it returns. As for dsec_agent_proc_output_start, a is the request's until done
 * ran. */
int dsec_agent_proc_stdin_start(dsec_agent *a, struct dsec_loop *loop, uint64_t handle,
                                const void *data, size_t len, bool close, uint32_t wait_max_ms,
                                dsec_proc_done_fn done, void *ud, dsec_err *err);

#ifdef __cplusplus
}
#endif
#endif
