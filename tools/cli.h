/* cli.h - the subcommands of the dsec command-line tool, one function each. */
#ifndef DSEC_TOOLS_CLI_H
#define DSEC_TOOLS_CLI_H

#include <stdio.h>

#include "dsec/client.h"

/* Each subcommand gets argv from its own name on (argv[0] is "decode") and
 * returns the process exit code: 0 success, 1 the input or the operation
 * failed, 2 usage or environment error. `dsec exec` returns the command's
 * own exit code (128 + signal when it was killed). */
int dsec_cli_decode(int argc, char **argv);
int dsec_cli_up(int argc, char **argv);
int dsec_cli_create(int argc, char **argv);
int dsec_cli_exec(int argc, char **argv);
int dsec_cli_call(int argc, char **argv); /* one function call (tools/call.c) */
int dsec_cli_cp(int argc, char **argv);
int dsec_cli_ls(int argc, char **argv);
int dsec_cli_files(int argc, char **argv); /* dsec files mkdir|stat|mv|rm (tools/files.c) */
int dsec_cli_fork(int argc, char **argv);
int dsec_cli_snapshot(int argc, char **argv);
/* layer.c: layers and environments in a registry */
int dsec_cli_layer(int argc, char **argv);
int dsec_cli_env(int argc, char **argv);
/* The layer registry the layer, env and image commands use: registry (--registry DIR or
 * nats://HOST:PORT[?bucket=NAME]), else $DSEC_LAYERS, else state/layers (state: --state-dir,
 * default ./state); *where names it. Returns 0, or 2 after printing why not. Close with
 * dsec_cli_registry_close (dsec_layer_registry_open, dsec/image.h, does the opening). */
struct dsec_layer_registry;
int dsec_cli_registry_open(const char *registry, const char *state, struct dsec_layer_registry **r,
                           const char **where);
void dsec_cli_registry_close(struct dsec_layer_registry *r);
/* image.c: import, list, inspect and remove images; build (image-build.c) */
int dsec_cli_image(int argc, char **argv);
int dsec_cli_image_build(int argc, char **argv);
int dsec_cli_simple_op(int argc, char **argv); /* pause, resume, rm, status */
int dsec_cli_ttl(int argc, char **argv);       /* dsec ttl ID SECONDS */
int dsec_cli_ps(int argc, char **argv);        /* background processes (tools/proc.c) */
int dsec_cli_attach(int argc, char **argv);    /* dsec attach [-i] ID HANDLE */
int dsec_cli_kill(int argc, char **argv);      /* dsec kill ID HANDLE [-s SIG] */
int dsec_cli_session(int argc, char **argv);   /* dsec session ID: start a shell session */
/* dsec cp -r (tools/cp-dir.c): a directory tree up or down; returns the exit status. */
int dsec_cli_cp_dir_up(dsec_client *c, const char *local, const char *id, const char *path);
int dsec_cli_cp_dir_down(dsec_client *c, const char *id, const char *path, const char *local);
int dsec_cli_watch(int argc, char **argv); /* dsec watch ID PATH [-r]: a directory's changes */
/* s as a JSON string, quoted and escaped (tools/fleet.c). */
void dsec_cli_json_str(FILE *out, const char *s);
/* dsec exec -it (tools/proc.c): base's process on a terminal, this one's in raw mode, until
 * it exits; returns its exit status. */
int dsec_cli_tty(dsec_client *c, const char *id, const dsec_proc_opts *base);
/* dsec exec --session: until _end, Ctrl-C interrupts the session's command (NULL: could not
 * set up; Ctrl-C then ends this client as usual). */
void *dsec_cli_session_guard(dsec_client *c, const char *id, uint64_t session);
void dsec_cli_session_guard_end(void *g);
int dsec_cli_top(int argc, char **argv);
int dsec_cli_trace(int argc, char **argv); /* dsec trace TRACE_ID (tools/trace.c) */
int dsec_cli_net(int argc, char **argv);   /* dsec net set|alerts (tools/net.c) */
int dsec_cli_demo(int argc, char **argv);
int dsec_cli_job(int argc, char **argv);     /* play a preemptible job (tools/preempt.c) */
int dsec_cli_traj(int argc, char **argv);    /* dsec traj show ROLLOUT */
int dsec_cli_tenant(int argc, char **argv);  /* quotas of tenants (tools/tenant.c) */
int dsec_cli_project(int argc, char **argv); /* ... and of their projects */
int dsec_cli_auth(int argc, char **argv);    /* nats-server config + credentials (tools/auth.c) */
/* fleet.c: dsec ls without an ID (a tenant's sandboxes), dsec rm --label, dsec events */
int dsec_cli_ls_any(int argc, char **argv);
int dsec_cli_rm(int argc, char **argv);
int dsec_cli_events(int argc, char **argv);

/* Block SIGINT/SIGTERM in all threads (call before any starts), then wait for one. */
void dsec_cli_block_signals(void);
int dsec_cli_wait_for_signal(void);

/* For the subcommands: print "dsec CMD: message (code[, safe to retry])"; the exit status
 * for it (2 for invalid input, else 1). */
int dsec_cli_fail(const char *cmd, const dsec_err *err);
/* A client on DSEC_URL (DSEC_TRACE_ID carried when set), or NULL after saying why. */
dsec_client *dsec_cli_connect(const char *cmd);

#endif
