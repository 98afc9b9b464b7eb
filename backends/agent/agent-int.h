/* agent-int.h - what the files of dsec-agent share: the objects its loop watches (connections,
 * commands, background processes, ports), its one state, and each file's entry points. */
#ifndef DSEC_BACKENDS_AGENT_INT_H
#define DSEC_BACKENDS_AGENT_INT_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/resource.h>
#include <sys/types.h>

#include "backends/agent/agent-proto.h"

/* fuzz/fuzz_agent.c compiles agent.c in and builds the other files with DSEC_AGENT_FUZZ (see
 * agent.c and agent-spawn.c). */

#define PORTS_MAX 8
#ifdef DSEC_AGENT_FUZZ
#define SHEP_IDLE_MAX 0 /* the harness waits for each command's shepherd to exit */
#else
#define SHEP_IDLE_MAX 4 /* idle shepherds kept for the next commands (agent-shepherd.c) */
#endif

/* What an epoll event points at: each of these starts with its kind (agent.c). */
enum { K_LISTEN = 1, K_SIGNAL, K_CONN, K_PIPE, K_PORT };

struct cmd;
struct port;
struct proc;

struct conn {
    int kind; /* K_CONN */
    int fd;
    bool dead, closing, want_out;
    bool processing;   /* inside conn_process */
    bool stalled;      /* requests wait until the answers drain */
    bool resync;       /* port connections: framing was lost; input is skipped up to a SYNC */
    struct port *port; /* the virtio-serial port it is served on, or NULL for a socket */
    uint8_t *rbuf;
    size_t rlen, rcap;
    uint8_t *wbuf;
    size_t woff, wlen, wcap;
    uint64_t big_idle_ns; /* when its large buffers last went idle; 0: in use or small */
    struct conn *next, *prev;
    struct conn *next_dead;
};

struct pipe_ep {
    int kind;   /* K_PIPE */
    int fd;     /* the agent's end, or -1 once closed */
    int stream; /* 0 stdin, 1 stdout, 2 stderr, 3 the shepherd's report */
    bool paused;
    struct cmd *cmd;
};

/* A virtio-serial port: one host connection at a time. */
struct port {
    int kind; /* K_PORT */
    int fd;   /* the open port, or -1 while it could not be reopened */
    char path[PATH_MAX];
    struct conn *conn; /* the host connection being served, or NULL */
};

struct cmd {
    struct conn *conn; /* NULL once the connection is gone: output is then discarded */
    struct proc *proc; /* a background process (PSTART): its output goes to its rings */
    uint32_t id;
    pid_t pid;  /* its shepherd, the agent's child (agent-shepherd.c); 0 once gone or idle */
    pid_t pgid; /* the main process: also its process group and session id (setsid) */
    struct pipe_ep io[3];
    struct pipe_ep rep;    /* stream 3: the shepherd's report (struct shep_report) */
    bool doomed;           /* the agent ends it (timeout, KILL, SIGTERM): its whole tree goes */
    bool main_reaped;      /* the main process, orphaned by its shepherd, was reaped here: */
    int main_status;       /* its status, */
    struct rusage main_ru; /* and its usage */
    uint8_t *in;
    size_t in_len, in_off;
    uint64_t out_max;
    uint64_t seen[3]; /* bytes read per stream, sent or not */
    uint64_t start_ns, deadline_ns;
    bool exited, timed_out, dead;
    struct cmd *next, *prev;
    struct cmd *next_dead;
};

/* The last bytes of one stream of a background process: stream offset o is at buf[o % cap].
 * buf grows up to cap as bytes come, so a quiet process costs little. */
struct ring {
    uint8_t *buf;
    size_t cap, alloc;
    uint64_t total; /* bytes the stream produced in all */
};

/* A background process (PSTART), kept after it ended until evicted. */
struct proc {
    uint64_t handle;
    struct cmd *cmd; /* while it runs */
    pid_t pid;
    bool running, stdin_open, timed_out;
    int32_t exit_code, sig;
    uint64_t started_ns, ended_ns; /* CLOCK_REALTIME */
    struct ring ring[2];           /* stdout, stderr */
    char cmdline[DSEC__AGENT_CMDLINE_MAX + 1];
    /* A PSTDIN answered once its bytes (the command's pending stdin) are taken. */
    struct conn *in_conn; /* NULL: nobody to answer (none waits, or its connection left) */
    uint32_t in_id;
    bool in_close;     /* close stdin once the pending bytes are taken */
    bool pty;          /* on a pseudo-terminal: its master is the command's io[1] (and io[0]) */
    struct sess *sess; /* a shell session (PSTART's session flag) */
};

/* A POUTPUT held until its process has output past the offsets asked, ends, or the wait
 * passes (dsec__agent_waiters_run, after each batch of events). */
struct waiter {
    struct conn *conn;
    uint32_t id;
    uint64_t handle, off[2], max, deadline_ns;
    struct waiter *next;
};

/* What a shepherd answers a command with on its socket: first the main process's pid (pid_t;
 * a negative errno when it could not be started), then, once the command's whole tree is
 * gone, this. */
struct shep_report {
    int32_t status;   /* the main process's wait status */
    uint64_t exit_ns; /* when it exited (CLOCK_MONOTONIC) */
    struct rusage ru; /* its resource usage, as wait4 gives it */
    int32_t reusable; /* the shepherd waits for another command */
};

/* The agent's one state (defined in agent.c). */
struct dsec__agent_state {
    int ep;
    int listen_fd;
    int sig_fd;
    int null_fd; /* /dev/null, the stdin of commands given none */
    int listen_kind, sig_kind;
    char *listen_path; /* unlinked at exit when we bound it */
    char **base_env;
    size_t nbase_env;
    const char *workdir;
    const char *default_user;
    bool set_up; /* SETUP was answered: the defaults are final */
    /* The descriptor limit the agent was given, which commands get back: the agent raises its
     * own soft limit to the hard one, as each background process holds 3 or 4 descriptors
     * (DSEC__AGENT_PROC_MAX of them would not fit the usual 1024). */
    struct rlimit nofile;
    bool nofile_raised;
    struct conn *conns;
    struct cmd *cmds;
    struct proc **procs; /* background processes, by handle */
    size_t nprocs, proc_max;
    uint64_t next_handle;
    struct conn *dead_conns;
    struct cmd *dead_cmds;
    struct waiter *waiters; /* held POUTPUTs */
    struct port ports[PORTS_MAX];
    size_t nports;
    struct {
        pid_t pid;
        int fd;
    } idle[SHEP_IDLE_MAX > 0 ? SHEP_IDLE_MAX : 1]; /* shepherds waiting for a command */
    size_t nidle;
    bool terminating;
};
extern struct dsec__agent_state dsec__agent_g;

/* A shell session (agent-sess.c). */
#define SESS_TOK_LEN 36 /* "dsec" + 32 hex digits */
#define SESS_MARK_MAX (1 + SESS_TOK_LEN + 1 + 12 + 1)

struct sess {
    char tok[SESS_TOK_LEN + 1];
    uint8_t mark[SESS_MARK_MAX]; /* "\036" tok ":" */
    size_t mark_len;
    /* per stream: bytes that may be the start of a marker, held back */
    uint8_t hold[2][SESS_MARK_MAX];
    size_t hold_len[2];
    /* per stream: the bootstrap's marker came (SIGINT waits for both: before its trap is set, it
     * would kill the shell) */
    bool booted[2];
    /* the command running, if busy */
    bool busy, marked[2];
    int32_t status;
    struct conn *conn; /* NULL once its connection left: it runs on, answered to nobody */
    uint32_t id;
    uint64_t out_max, seen[2];
    uint64_t start_ns, deadline_ns;
    bool timed_out, interrupted;
    uint64_t int_at, int_next; /* an interrupt under way: when it began, the next SIGINT */
    int int_stage;             /* 1: what is below the shell was killed, 2: the session */
};

/* A user of the sandbox's own /etc/passwd and /etc/group (agent-user.c). */
#define GROUPS_MAX 64

struct ident {
    bool set;
    uid_t uid;
    gid_t gid;
    gid_t groups[GROUPS_MAX];
    size_t ngroups;
    char name[DSEC__AGENT_USER_MAX + 1]; /* empty when the uid has no passwd entry */
    char home[DSEC__AGENT_PATH_MAX + 1];
};

/* Everything the vfork child needs, prepared by the parent: the child allocates nothing
 * (agent-spawn.c). */
struct spawn {
    char **argv;
    char **envp;
    const char *path_env; /* PATH for a bare argv[0] */
    const char *cwd;      /* NULL: inherit */
    const struct ident *id;
    int fds[3];    /* the child's stdin, stdout, stderr */
    char *scratch; /* a PATH candidate */
    size_t scratch_len;
    char *msg; /* the failure message written to stderr */
    size_t msg_len;
    int pid_fd; /* the child writes its pid here (pid_t) before anything of the command runs;
                 * -1: the shepherd does once the child exec'd */
    bool tty;   /* fds are a pty's slave: it becomes the controlling terminal */
};

/* ---- agent.c: basics, the defaults, start-up and the loop ---------------------------------- */

void dsec__agent_logmsg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void *dsec__agent_xrealloc(void *p, size_t n);
char *dsec__agent_xstrndup(const char *s, size_t n);
uint64_t dsec__agent_now_ns(void);
void dsec__agent_ep_ctl(int op, int fd, uint32_t events, void *ptr);
void dsec__agent_handle_setup(struct conn *c, uint32_t id, dsec__agent_rd *r);

/* ---- agent-conn.c: connections, their frames in and out ------------------------------------- */

struct conn *dsec__agent_conn_new(int fd, struct port *port, int epoll_op);
void dsec__agent_conn_close(struct conn *c);
size_t dsec__agent_conn_backlog(const struct conn *c);
uint8_t *dsec__agent_conn_reserve_keep(struct conn *c, size_t n, size_t keep);
uint8_t *dsec__agent_conn_reserve(struct conn *c, size_t n);
void dsec__agent_conn_commit(struct conn *c, size_t n);
void dsec__agent_send_error(struct conn *c, uint32_t id, uint32_t kind, int errnum, const char *fmt,
                            ...) __attribute__((format(printf, 5, 6)));
void dsec__agent_send_errno(struct conn *c, uint32_t id, int errnum, const char *what,
                            const char *path);
void dsec__agent_send_ok(struct conn *c, uint32_t id, uint64_t value);
int dsec__agent_bufs_sweep(int timeout_ms);
void dsec__agent_on_conn(struct conn *c, uint32_t events);
void dsec__agent_on_listen(void);

/* ---- agent-port.c: virtio-serial ports ------------------------------------------------------ */

void dsec__agent_port_open(struct port *p);
void dsec__agent_port_lost(struct port *p);
void dsec__agent_on_port(struct port *p);
void dsec__agent_ports_retry(void);
int dsec__agent_ports_start(const char *const *args, const bool *is_name);

/* ---- agent-cmd.c: running commands: output, exit, reaping, timeouts, KILL -------------------- */

void dsec__agent_pipe_close(struct pipe_ep *e);
void dsec__agent_send_exit(struct conn *c, uint32_t id, int32_t code, int32_t sig, uint8_t flags,
                           uint64_t dur_us, uint64_t cpu_us, uint64_t rss_kb);
void dsec__agent_cmd_end(struct cmd *m);
void dsec__agent_on_report(struct cmd *m);
void dsec__agent_reap(void);
void dsec__agent_on_pipe(struct pipe_ep *e, uint32_t events);
void dsec__agent_check_timeouts(void);
void dsec__agent_handle_kill(struct conn *c, uint32_t id, dsec__agent_rd *r);

/* ---- agent-exec.c: EXEC and PSTART ---------------------------------------------------------- */

void dsec__agent_env_set(char ***env, size_t *n, char *kv);
void dsec__agent_handle_exec(struct conn *c, uint32_t id, dsec__agent_rd *r, bool bg);

/* ---- agent-proc.c: background processes ----------------------------------------------------- */

void dsec__agent_ring_put(struct ring *r, const uint8_t *data, size_t n);
struct proc *dsec__agent_proc_new(struct cmd *m, char **argv, uint64_t ring_max);
void dsec__agent_proc_free(struct proc *p);
bool dsec__agent_procs_room(void);
struct proc *dsec__agent_proc_by_handle(uint64_t handle);
void dsec__agent_procs_forget_conn(const struct conn *c);
void dsec__agent_proc_ended(struct proc *p, struct cmd *m, int status, uint64_t end);
void dsec__agent_proc_stdin_taken(struct proc *p, struct cmd *m, size_t left);
void dsec__agent_proc_feed(struct proc *p, const uint8_t *data, size_t len);
void dsec__agent_send_proc(struct conn *c, uint32_t id, uint8_t type, const struct proc *p);
void dsec__agent_handle_plist(struct conn *c, uint32_t id, dsec__agent_rd *r);
void dsec__agent_handle_psignal(struct conn *c, uint32_t id, dsec__agent_rd *r);
void dsec__agent_handle_pstdin(struct conn *c, uint32_t id, dsec__agent_rd *r);
void dsec__agent_handle_poutput(struct conn *c, uint32_t id, dsec__agent_rd *r);
void dsec__agent_handle_presize(struct conn *c, uint32_t id, dsec__agent_rd *r);
void dsec__agent_waiters_run(void);

/* ---- agent-sess.c: shell sessions ----------------------------------------------------------- */

const char *dsec__agent_sess_start(struct proc *p, size_t *boot_len);
void dsec__agent_sess_forget_conn(struct proc *p, const struct conn *c);
void dsec__agent_sess_output(struct proc *p, int s, const uint8_t *data, size_t n);
void dsec__agent_sess_ended(struct proc *p, int status);
void dsec__agent_handle_sexec(struct conn *c, uint32_t id, uint64_t handle, const char *cmd,
                              size_t cmd_len, uint64_t timeout_ms, uint64_t out_max);
void dsec__agent_sess_interrupt(struct proc *p);
void dsec__agent_sess_signal(struct cmd *m, uint32_t sig);
void dsec__agent_sess_tick(struct proc *p, uint64_t now);
uint64_t dsec__agent_sess_due(const struct sess *x);

/* ---- agent-user.c, agent-spawn.c, agent-shepherd.c: starting commands ----------------------- */

const char *dsec__agent_resolve_user(const char *spec, struct ident *id);
pid_t dsec__agent_spawn(struct spawn *s);
bool dsec__agent_proc_is_ours(void);
void dsec__agent_kill_below(pid_t root, pid_t main_pgid, int sig, bool groups);
void dsec__agent_shep_doom(struct cmd *m);
pid_t dsec__agent_spawn_shepherd(const struct spawn *s, pid_t *main_pid, int *sock);
#ifdef DSEC_AGENT_FUZZ
/* The harness's check of what a child is about to get (agent.c points it there). */
extern void (*dsec__agent_fuzz_check_spawn)(const struct spawn *s);
#endif

/* ---- agent-files.c: file requests and uploads' temporary files ------------------------------ */

void dsec__agent_handle_fwrite(struct conn *c, uint32_t id, dsec__agent_rd *r);
void dsec__agent_handle_fread(struct conn *c, uint32_t id, dsec__agent_rd *r);
void dsec__agent_handle_fstat(struct conn *c, uint32_t id, dsec__agent_rd *r, bool list);
void dsec__agent_handle_fremove(struct conn *c, uint32_t id, dsec__agent_rd *r);
void dsec__agent_handle_fmkdir(struct conn *c, uint32_t id, dsec__agent_rd *r);
void dsec__agent_handle_frename(struct conn *c, uint32_t id, dsec__agent_rd *r);
int dsec__agent_remove_tree(int dirfd, const char *name);
void dsec__agent_uploads_set_stale(uint64_t stale_ns);
void dsec__agent_uploads_sweep(void);
int dsec__agent_uploads_timeout(int timeout_ms);

#endif
