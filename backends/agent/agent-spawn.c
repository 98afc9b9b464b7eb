/* agent-spawn.c - the vfork child that sets up and execs a command, allocating nothing */
#define _GNU_SOURCE
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "backends/agent/agent-int.h"

#ifdef DSEC_AGENT_FUZZ
/* fuzz/fuzz_agent.c builds the agent with DSEC_AGENT_FUZZ. Requests are decoded and commands
 * prepared and forked for real, but no program ever runs: execve always fails as for a missing
 * file, so the child walks the PATH search and reports the failure (exit 127). */
static int fuzz_execve(const char *file, char *const argv[], char *const envp[])
{
    (void)file;
    (void)argv;
    (void)envp;
    errno = ENOENT;
    return -1;
}
#define execve fuzz_execve
#endif

static void __attribute__((noreturn))
child_fail(const struct spawn *s, const char *what, const char *arg, int errnum)
{
    const char *parts[] = {"dsec-agent: ", what, " \"", arg, "\": ", strerrordesc_np(errnum), "\n"};
    size_t n = 0;
    for (size_t i = 0; i < sizeof parts / sizeof parts[0]; i++) {
        const char *p = parts[i] ? parts[i] : "?";
        size_t l = strlen(p);
        if (l > s->msg_len - n)
            l = s->msg_len - n;
        memcpy(s->msg + n, p, l);
        n += l;
    }
    ssize_t w = write(2, s->msg, n);
    (void)w;
    _exit(127);
}

static void child_run(const struct spawn *s) __attribute__((noreturn));
static void child_run(const struct spawn *s)
{
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    setsid();
    if (dsec__agent_g.nofile_raised) /* a raw system call, as below */
        syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, &dsec__agent_g.nofile, NULL);
    /* Before the command can do anything (such as kill its shepherd): the agent learns the
     * pid even then. The descriptor is close-on-exec. */
    pid_t self = (pid_t)syscall(SYS_getpid);
    if (s->pid_fd >= 0 && write(s->pid_fd, &self, sizeof self) != (ssize_t)sizeof self)
        _exit(127);
    for (int i = 0; i < 3; i++)
        if (dup2(s->fds[i], i) < 0)
            child_fail(s, "cannot set up descriptor for", s->argv[0], errno);
    if (s->tty && ioctl(0, TIOCSCTTY, 0) < 0) /* setsid above: a session without a terminal */
        child_fail(s, "cannot make the terminal controlling for", s->argv[0], errno);
    if (s->id && s->id->set) {
        /* Raw system calls: glibc's wrappers would synchronise threads we do not have,
         * in memory this child shares with its parent. */
        if (syscall(SYS_setgroups, s->id->ngroups, s->id->groups) < 0 ||
            syscall(SYS_setresgid, s->id->gid, s->id->gid, s->id->gid) < 0 ||
            syscall(SYS_setresuid, s->id->uid, s->id->uid, s->id->uid) < 0)
            child_fail(s, "cannot switch user for", s->argv[0], errno);
    }
    if (s->cwd && chdir(s->cwd) < 0)
        child_fail(s, "cannot change directory to", s->cwd, errno);
    const char *file = s->argv[0];
    if (strchr(file, '/')) {
        execve(file, s->argv, s->envp);
        child_fail(s, "cannot run", file, errno);
    }
    /* PATH search as execvp does it, without its allocations. */
    size_t flen = strlen(file);
    bool denied = false;
    int last = ENOENT;
    for (const char *p = s->path_env;;) {
        const char *end = strchrnul(p, ':');
        size_t dlen = (size_t)(end - p);
        if (dlen + 1 + flen < s->scratch_len) {
            memcpy(s->scratch, p, dlen);
            size_t o = dlen;
            if (dlen == 0) /* an empty entry is the current directory */
                s->scratch[o++] = '.';
            s->scratch[o++] = '/';
            memcpy(s->scratch + o, file, flen + 1);
            execve(s->scratch, s->argv, s->envp);
            last = errno;
            if (last == EACCES)
                denied = true;
            else if (last != ENOENT && last != ENOTDIR && last != ESTALE && last != ENODEV &&
                     last != ETIMEDOUT)
                break;
        }
        if (*end == 0)
            break;
        p = end + 1;
    }
    child_fail(s, "cannot run", file, denied && last != EACCES ? EACCES : last);
}

/* The child's buffers: static, so a spawn costs no allocation and no fresh pages. */
static char spawn_path[DSEC__AGENT_PATH_MAX + DSEC__AGENT_ARG_LEN_MAX + 2];
static char spawn_msg[DSEC__AGENT_ARG_LEN_MAX + 256];

/* vfork in a function of its own: the caller's locals stay out of the child's way. */
static pid_t __attribute__((noinline)) spawn_child(const struct spawn *s)
{
    pid_t pid = vfork();
    if (pid == 0)
        child_run(s);
    return pid;
}

/* Start s's command in a child (in the shepherd): its pid, or -1 with errno set. s gets the
 * child's buffers. */
pid_t dsec__agent_spawn(struct spawn *s)
{
    s->scratch = spawn_path;
    s->scratch_len = sizeof spawn_path;
    s->msg = spawn_msg;
    s->msg_len = sizeof spawn_msg;
    return spawn_child(s);
}
