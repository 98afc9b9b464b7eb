/* container-runtime.c - driving the OCI runtime (crun, runc, runsc): spawning it (crun in a
 * private mount namespace on hybrid-cgroup hosts), container state, delete, and its cgroups. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/sendfile.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backends/cgroup-tune.h"
#include "backends/container/container-int.h"
#include "backends/spawn.h"
#include "dsec/alloc.h"
#include "dsec/io.h"
#include "dsec/log.h"

/* Every cgroup mount point (v1 hierarchies and the cgroup2 mount), for cleanup. */
static size_t cg_all(char out[][PATH_MAX], size_t max)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (f == NULL)
        return 0;
    char line[4096];
    size_t n = 0;
    while (n < max && fgets(line, sizeof line, f) != NULL) {
        char mp[PATH_MAX];
        if (sscanf(line, "%*s %*s %*s %*s %4095s", mp) != 1)
            continue;
        char *sep = strstr(line, " - ");
        char fstype[64];
        if (sep == NULL || sscanf(sep + 3, "%63s", fstype) != 1)
            continue;
        if (strcmp(fstype, "cgroup") == 0 || strcmp(fstype, "cgroup2") == 0)
            dsec__ct_fmt(out[n++], PATH_MAX, "%s", mp);
    }
    fclose(f);
    return n;
}

static int find_exe(const char *name, char *out, size_t len)
{
    static const char *const dirs[] = {"/usr/local/sbin", "/usr/local/bin", "/usr/sbin",
                                       "/usr/bin",        "/sbin",          "/bin"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        dsec__ct_fmt(out, len, "%s/%s", dirs[i], name);
        if (access(out, X_OK) == 0)
            return 0;
    }
    return -1;
}

/* crun and runc protect the host's runtime binary from the container they
 * start (CVE-2019-5736) by running from a copy: unless /proc/self/exe is a
 * memfd sealed against writes, every call copies or bind-mounts the binary
 * (a mount and a lazy unmount, which waits for an RCU grace period) and
 * executes itself again. Started from such a sealed copy, made once here,
 * they skip all that: about 2 ms less per runtime call on this host, with
 * the same protection (a sealed memfd cannot be written by anyone). */
static int rt_seal(struct ct_rt *rt, dsec_err *err)
{
    int src = open(rt->path, O_RDONLY | O_CLOEXEC);
    if (src < 0)
        return dsec_err_set(err, DSEC_E_CONFIG, errno, "container: opening %s", rt->path);
    struct stat st;
    int fd = -1;
    const char *what = "reading";
    if (fstat(src, &st) == 0) {
        what = "copying";
        fd = memfd_create("dsec-runtime", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    }
    off_t left = fd >= 0 ? st.st_size : 0;
    while (fd >= 0 && left > 0) {
        ssize_t n = sendfile(fd, src, NULL, (size_t)left);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0) {
            if (n == 0)
                errno = EIO; /* the file shrank under us */
            break;
        }
        left -= n;
    }
    if (fd >= 0 && left == 0) {
        what = "sealing";
        if (fcntl(fd, F_ADD_SEALS, F_SEAL_SEAL | F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE) == 0) {
            close(src);
            rt->fd = fd;
            return 0;
        }
    }
    int e = errno;
    if (fd >= 0)
        close(fd);
    close(src);
    return dsec_err_set(err, DSEC_E_CONFIG, e,
                        "container: %s a sealed in-memory copy of %s (option runtime_memfd=false "
                        "runs the file itself)",
                        what, rt->path);
}

static const char exe_dirs[] =
    "/usr/local/sbin, /usr/local/bin, /usr/sbin, /usr/bin, /sbin or /bin";

static const char *const rt_names[CT_RT_N] = {"crun", "runc", "runsc"};

int dsec__ct_rt_index(const char *name)
{
    for (int i = 0; i < CT_RT_N; i++)
        if (strcmp(name, rt_names[i]) == 0)
            return i;
    return -1;
}

/* What to do when runtime i is not installed. */
static const char *rt_install_hint(int i)
{
    return i == CT_RT_RUNSC  ? "gVisor is not packaged for Debian: install runsc from "
                               "https://gvisor.dev/docs/user_guide/install/"
           : i == CT_RT_RUNC ? "apt-get install runc"
                             : "apt-get install crun";
}

/* Fill be->rts[i]: its binary (be->rt_paths[i], or looked up), checked, and its sealed copy.
 * configured: it is the option runtime's (the messages name that option). Needs the cgroup
 * layout (be->hybrid). */
static int rt_open(struct ct_backend *be, int i, bool configured, dsec_err *err)
{
    struct ct_rt *rt = &be->rts[i];
    const char *name = rt_names[i];
    dsec__ct_fmt(rt->name, sizeof rt->name, "%s", name);
    rt->fd = -1;
    const char *opt = configured        ? "runtime_path"
                      : i == CT_RT_CRUN ? "crun_path"
                      : i == CT_RT_RUNC ? "runc_path"
                                        : "runsc_path";
    if (be->rt_paths[i][0] != '\0') {
        dsec__ct_fmt(rt->path, sizeof rt->path, "%s", be->rt_paths[i]);
    } else if (find_exe(name, rt->path, sizeof rt->path) < 0) {
        rt->path[0] = '\0';
        if (configured)
            return dsec_err_set(err, DSEC_E_CONFIG, 0,
                                "container: option runtime=%s, but no %s binary is installed in "
                                "%s (%s, or set the option %s)",
                                name, name, exe_dirs, rt_install_hint(i), opt);
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "container: no %s binary is installed in %s (%s, or set the option "
                            "%s)",
                            name, exe_dirs, rt_install_hint(i), opt);
    }
    if (access(rt->path, X_OK) != 0)
        return dsec_err_set(err, DSEC_E_CONFIG, errno,
                            "container: %s%s: the runtime binary %s is missing or not executable "
                            "(%s, or the option %s)",
                            configured ? "option runtime=" : "runtime ", name, rt->path,
                            rt_install_hint(i), opt);
    /* runc 1.1 looks for exactly these seals, as crun does (is_self_cloned in its
     * nsexec), and then skips the copy of itself it makes at every `runc init` (strace
     * here: no memfd_create of its own). runsc is left as it was, without a copy: its
     * containers run on gVisor's kernel, which does not expose the host's binary. */
    if (be->rt_memfd && i != CT_RT_RUNSC && rt_seal(rt, err) < 0)
        return -1;
    /* crun 1.8 refuses to run beside the hybrid cgroup2 mount, so it gets a mount
     * namespace without it. runc 1.1 handles hybrid hosts itself (it uses the v1
     * hierarchies and leaves the cgroup2 mount alone), so it runs in the node's namespace
     * and no call of it pays for a copy of the host's mount table. runsc is given crun's
     * treatment: untested here, and it gains nothing from seeing the mount. */
    rt->hybrid = be->hybrid && i != CT_RT_RUNC;
    atomic_store(&be->rt_open[i], true);
    return 0;
}

const struct ct_rt *dsec__ct_rt_get(struct ct_backend *be, const char *name, dsec_err *err)
{
    int i = dsec__ct_rt_index(name);
    if (i < 0) {
        dsec_err_set(err, DSEC_E_DECODE, 0,
                     "container: unknown runtime \"%.40s\" (expected crun, runc or runsc)", name);
        return NULL;
    }
    if (atomic_load(&be->rt_open[i]))
        return &be->rts[i];
    pthread_mutex_lock(&be->rt_mu);
    int rc = atomic_load(&be->rt_open[i]) ? 0 : rt_open(be, i, false, err);
    pthread_mutex_unlock(&be->rt_mu);
    if (rc < 0)
        return NULL;
    if (be->trace)
        dsec_log_info("dsec container: opened runtime %s (%s) for containers it started", name,
                      be->rts[i].path);
    return &be->rts[i];
}

const char *dsec__ct_rt_guess(const struct ct_backend *be, const char *rid)
{
    char p[PATH_MAX + 320];
    dsec__ct_fmt(p, sizeof p, "%s/%s/state.json", be->run_root, rid);
    if (access(p, F_OK) == 0)
        return "runc";
    dsec__ct_fmt(p, sizeof p, "%s/%s/status", be->run_root, rid);
    if (access(p, F_OK) == 0)
        return "crun";
    return NULL;
}

void dsec__ct_rt_release(struct ct_backend *be)
{
    for (int i = 0; i < CT_RT_N; i++) {
        if (be->rts[i].fd >= 0)
            close(be->rts[i].fd);
        be->rts[i].fd = -1;
        atomic_store(&be->rt_open[i], false);
    }
}

int dsec__ct_rt_init(struct ct_backend *be, const char *name, dsec_err *err)
{
    int idx = dsec__ct_rt_index(name);
    if (idx < 0)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "container option runtime=\"%s\": expected crun, runc or runsc", name);
    char v2[PATH_MAX] = "";
    bool has_v2 = dsec_cgroup_mount(NULL, v2, sizeof v2, NULL, 0) == 0;
    if (dsec_cgroup_mount("memory", be->cg_memory, sizeof be->cg_memory, NULL, 0) == 0) {
        /* v1 controllers; a cgroup2 mount beside them is hidden from crun (rt_open) */
        be->cg_mode = CT_CG_V1;
        be->hybrid = has_v2;
        if (dsec_cgroup_mount("freezer", be->cg_freezer, sizeof be->cg_freezer, NULL, 0) < 0 ||
            dsec_cgroup_mount("cpuacct", be->cg_cpuacct, sizeof be->cg_cpuacct, NULL, 0) < 0 ||
            dsec_cgroup_mount("pids", be->cg_pids, sizeof be->cg_pids, NULL, 0) < 0 ||
            dsec_cgroup_mount("cpu", be->cg_cpu, sizeof be->cg_cpu, NULL, 0) < 0)
            return dsec_err_set(err, DSEC_E_CONFIG, 0,
                                "container: cgroup v1 host without the freezer, cpu, cpuacct "
                                "and pids controllers mounted");
        char p[PATH_MAX + 32];
        dsec__ct_fmt(p, sizeof p, "%s/memory.memsw.limit_in_bytes", be->cg_memory);
        be->memsw = access(p, F_OK) == 0;
    } else if (has_v2) {
        be->cg_mode = CT_CG_V2;
        dsec__ct_fmt(be->cg_memory, sizeof be->cg_memory, "%s", v2);
        memcpy(be->cg_freezer, be->cg_memory, sizeof be->cg_freezer);
        memcpy(be->cg_cpuacct, be->cg_memory, sizeof be->cg_cpuacct);
        memcpy(be->cg_pids, be->cg_memory, sizeof be->cg_pids);
        memcpy(be->cg_cpu, be->cg_memory, sizeof be->cg_cpu);
    } else {
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "container: no cgroup hierarchy with the memory controller mounted");
    }
    if (rt_open(be, idx, true, err) < 0)
        return -1;
    be->rt = &be->rts[idx];
    /* gVisor runs the container's processes inside its own kernel (the Sentry): the host
     * pid in the container's cgroup is the Sentry, not the agent, so a warm container's
     * root cannot be switched from the host (dsec__ct_rt_switch_root). Every start is cold. */
    if (idx == CT_RT_RUNSC && be->warm_target > 0) {
        dsec_log_warn("dsec container: runtime=runsc: no warm pool (gVisor's containers "
                      "cannot have their root switched from the host); every create starts "
                      "its own container");
        be->warm_target = 0;
    }
    return 0;
}

/* What spawn's child does. */
struct spawn_args {
    const char *const *argv;
    int exe_fd, fd3, outfd, root_fd;
    bool hybrid;
    const char *root_at;
};

/* spawn's child, a dsec_spawn_vfork child until its exec. Not instrumented by ASan: it would see
 * the stack switch and warn at _exit. */
__attribute__((no_sanitize_address)) static int spawn_child(void *p)
{
    const struct spawn_args *a = p;
    dsec_spawn_default_signals();
    if (a->hybrid || a->root_fd >= 0) {
        /* without CLONE_FS the child has its own fs_struct, so unshare works here where it
         * would fail in the threaded parent */
        if (unshare(CLONE_NEWNS) < 0 || mount("", "/", NULL, MS_REC | MS_SLAVE, NULL) < 0)
            _exit(126);
        if (a->hybrid)
            umount2("/sys/fs/cgroup/unified", MNT_DETACH);
        if (a->root_fd >= 0 &&
            move_mount(a->root_fd, "", AT_FDCWD, a->root_at, MOVE_MOUNT_F_EMPTY_PATH) < 0) {
            char num[16];
            int e = errno, k = (int)sizeof num;
            num[--k] = '\n';
            do
                num[--k] = (char)('0' + e % 10);
            while ((e /= 10) > 0 && k > 0);
            static const char what[] = "dsec: attaching the root filesystem failed, errno ";
            (void)!write(a->outfd, what, sizeof what - 1);
            (void)!write(a->outfd, num + k, sizeof num - (size_t)k);
            _exit(125);
        }
    }
    int o = fcntl(a->outfd, F_DUPFD, 10);
    int l = a->fd3 >= 0 ? fcntl(a->fd3, F_DUPFD, 10) : -1;
    int x = a->exe_fd >= 0 ? fcntl(a->exe_fd, F_DUPFD, 10) : -1;
    int nul = open("/dev/null", O_RDWR);
    if (o < 0 || nul < 0 || (a->fd3 >= 0 && l < 0))
        _exit(126);
    dup2(nul, 0);
    dup2(o, 1);
    dup2(o, 2);
    if (l >= 0)
        dup2(l, 3);
    int keep = l >= 0 ? 4 : 3; /* the first fd the program does not get */
    if (x >= 0 && dup2(x, keep) == keep && fcntl(keep, F_SETFD, FD_CLOEXEC) == 0)
        x = keep++; /* closed by the exec itself */
    else
        x = -1;
    close_range((unsigned)keep, ~0u, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    if (x >= 0)
        fexecve(x, (char *const *)a->argv, environ); /* on failure: the file, below */
    execv(a->argv[0], (char *const *)a->argv);
    _exit(127);
}

#define SPAWN_STACK (256 * 1024)

/* argv in a child (the program: exe_fd when >= 0, else the file argv[0]),
 * stdin /dev/null, stdout and stderr on outfd; when fd3 >= 0, fd3 as fd 3. hybrid: in a private
 * mount namespace without the cgroup2 mount (crun 1.8 refuses hybrid hosts). root_fd >= 0: attached
 * at root_at in a private mount namespace first (dsec__ct_rt_start says why); a failure there is
 * written to outfd and ends the child with 125. Returns the child's pid or -1.
 *
 * Not fork, and the node runs crun for every create, fork and destroy: the child shares the
 * node's memory (dsec_spawn_vfork; spawn.h says what a fork would cost), as vfork and
 * posix_spawn do, which posix_spawn cannot be used for: the child unshares its mount namespace
 * first. Under TSan, whose runtime a child in shared memory would confuse, it is a fork. */
static pid_t spawn(const char *const *argv, int exe_fd, bool hybrid, int fd3, int outfd,
                   int root_fd, const char *root_at)
{
    struct spawn_args a = {.argv = argv,
                           .exe_fd = exe_fd,
                           .fd3 = fd3,
                           .outfd = outfd,
                           .root_fd = root_fd,
                           .hybrid = hybrid,
                           .root_at = root_at};
#ifdef __SANITIZE_THREAD__
    pid_t pid = fork();
    if (pid == 0)
        spawn_child(&a);
    return pid;
#else
    return dsec_spawn_vfork(spawn_child, &a, SPAWN_STACK);
#endif
}

static int wait_status(pid_t pid)
{
    int st;
    while (waitpid(pid, &st, 0) < 0)
        if (errno != EINTR)
            return 255;
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

int dsec__ct_run(const char *const *argv, char *out, size_t outlen, dsec_err *err)
{
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "container: pipe for %s", argv[0]);
    pid_t pid = spawn(argv, -1, false, -1, p[1], -1, NULL);
    int e = errno;
    close(p[1]);
    if (pid < 0) {
        close(p[0]);
        return dsec_err_set(err, DSEC_E_IO, e, "container: starting %s", argv[0]);
    }
    dsec_drain_into(p[0], out, outlen);
    close(p[0]);
    return wait_status(pid);
}

/* Run runtime rt (argv after the binary and --root), output captured. */
static int rt_cmd(const struct ct_backend *be, const struct ct_rt *rt, const char *const *args,
                  char *out, size_t outlen, dsec_err *err)
{
    const char *argv[16];
    size_t n = 0;
    argv[n++] = rt->path;
    argv[n++] = "--root";
    argv[n++] = be->run_root;
    for (size_t i = 0; args[i] != NULL && n < 15; i++)
        argv[n++] = args[i];
    argv[n] = NULL;
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "container: pipe for %s", rt->name);
    pid_t pid = spawn(argv, rt->fd, rt->hybrid, -1, p[1], -1, NULL);
    int e = errno;
    close(p[1]);
    if (pid < 0) {
        close(p[0]);
        return dsec_err_set(err, DSEC_E_IO, e, "container: starting %s", rt->path);
    }
    size_t got = 0;
    for (;;) {
        char sink[1024];
        bool keep = got + 1 < outlen;
        ssize_t r =
            dsec_read_eintr(p[0], keep ? out + got : sink, keep ? outlen - 1 - got : sizeof sink);
        if (r <= 0)
            break;
        if (keep)
            got += (size_t)r;
    }
    close(p[0]);
    out[got] = '\0';
    return wait_status(pid);
}

/* The last line worth showing of a runtime's output. runc logs as logrus does
 * (time="..." level=error msg="..."): only the message, unquoted, is kept. */
static void last_line(char *s)
{
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == '\n' || s[n - 1] == ' '))
        s[--n] = '\0';
    char *nl = strrchr(s, '\n');
    if (nl != NULL)
        memmove(s, nl + 1, strlen(nl + 1) + 1);
    char *m = strncmp(s, "time=\"", 6) == 0 ? strstr(s, " msg=\"") : NULL;
    if (m == NULL)
        return;
    char *out = s;
    for (const char *p = m + 6; *p != '\0' && *p != '"'; p++) {
        if (*p == '\\' && p[1] != '\0')
            p++;
        *out++ = *p;
    }
    *out = '\0';
}

int dsec__ct_rt_start(const struct ct_backend *be, const dsec_sandbox *sb, int listen_fd,
                      int root_fd, dsec_err *err)
{
    char root_at[PATH_MAX + 16];
    dsec__ct_fmt(root_at, sizeof root_at, "%s/rootfs", sb->dir);
    char log[PATH_MAX + 16];
    dsec__ct_fmt(log, sizeof log, "%s/agent.log", sb->dir);
    /* --detach hands the runtime's stdio to the container: the agent's
     * output, and the runtime's own errors, land in agent.log */
    int fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600);
    if (fd < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "container: creating %s", log);
    off_t start = lseek(fd, 0, SEEK_END);
    const struct ct_rt *rt = sb->rt;
    const char *argv[] = {rt->path, "--root",   be->run_root, "run",   "--detach", "--preserve-fds",
                          "1",      "--bundle", sb->dir,      sb->rid, NULL};
    pid_t pid = spawn(argv, rt->fd, rt->hybrid, listen_fd, fd, root_fd, root_at);
    int e = errno;
    close(fd);
    if (pid < 0)
        return dsec_err_set(err, DSEC_E_IO, e, "container: starting %s", rt->path);
    int st = wait_status(pid);
    if (st == 0)
        return 0;
    char msg[2048] = "";
    fd = open(log, O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        ssize_t n = pread(fd, msg, sizeof msg - 1, start > 0 ? start : 0);
        msg[n > 0 ? n : 0] = '\0';
        close(fd);
    }
    last_line(msg);
    return dsec_err_set(err, DSEC_E_BACKEND, 0, "container: %s run failed (status %d): %.300s",
                        rt->name, st, msg[0] ? msg : "no message");
}

int dsec__ct_rt_status(const struct ct_backend *be, const struct ct_rt *rt, const char *id,
                       char *status, size_t len, dsec_err *err)
{
    char out[4096];
    const char *args[] = {"state", id, NULL};
    int st = rt_cmd(be, rt, args, out, sizeof out, err);
    if (st < 0)
        return -1;
    if (st != 0) {
        if (strstr(out, "not exist") != NULL || strstr(out, "No such file") != NULL ||
            strstr(out, "not found") != NULL)
            return dsec_err_set(err, DSEC_E_NOT_FOUND, 0, "container: %s has no container %s",
                                rt->name, id);
        last_line(out);
        return dsec_err_set(err, DSEC_E_BACKEND, 0, "container: %s state failed: %.300s", rt->name,
                            out);
    }
    const char *s = strstr(out, "\"status\"");
    const char *q = s ? strchr(s + 8, '"') : NULL;
    const char *end = q ? strchr(q + 1, '"') : NULL;
    if (end == NULL)
        return dsec_err_set(err, DSEC_E_BACKEND, 0, "container: %s state printed no status",
                            rt->name);
    dsec__ct_fmt(status, len, "%.*s", (int)(end - q - 1), q + 1);
    return 0;
}

void dsec__ct_cg_path(const struct ct_backend *be, const char *ctrl_mount, const char *id,
                      char *out, size_t len)
{
    dsec__ct_fmt(out, len, "%s/%s/%s", ctrl_mount, be->cg_parent, id);
}

static void msleep(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int write_str(const char *path, const char *v);

/* SIGKILL to every process in the cgroup dir; how many it listed. */
static size_t kill_procs(const char *dir)
{
    char p[PATH_MAX + 32];
    dsec__ct_fmt(p, sizeof p, "%s/cgroup.procs", dir);
    FILE *f = fopen(p, "re");
    if (f == NULL)
        return 0;
    long pid;
    size_t n = 0;
    while (fscanf(f, "%ld", &pid) == 1)
        if (pid > 1 && ++n)
            kill((pid_t)pid, SIGKILL);
    fclose(f);
    return n;
}

size_t dsec__ct_cg_kill(const struct ct_backend *be, const char *id)
{
    char dir[PATH_MAX * 2];
    dsec__ct_cg_path(be, be->cg_freezer, id, dir, sizeof dir);
    if (be->cg_mode == CT_CG_V1) { /* a frozen v1 cgroup keeps its killed processes until thawed */
        char p[PATH_MAX * 2 + 16];
        dsec__ct_fmt(p, sizeof p, "%s/freezer.state", dir);
        write_str(p, "THAWED");
    } else { /* the whole tree at once, where the kernel has it (5.14) */
        char p[PATH_MAX * 2 + 16];
        dsec__ct_fmt(p, sizeof p, "%s/cgroup.kill", dir);
        if (access(p, F_OK) == 0)
            write_str(p, "1");
    }
    return kill_procs(dir);
}

/* Remove the container's cgroup in every hierarchy, killing stragglers (an
 * agent's orphans the runtime did not reach). */
static int cg_remove(const struct ct_backend *be, const char *id, dsec_err *err)
{
    char(*all)[PATH_MAX] = dsec_malloc(32 * sizeof *all);
    if (all == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "container: removing cgroups");
    size_t n = cg_all(all, 32);
    int rc = 0;
    for (size_t i = 0; i < n; i++) {
        char dir[PATH_MAX * 2];
        dsec__ct_fmt(dir, sizeof dir, "%s/%s/%s", all[i], be->cg_parent, id);
        if (access(dir, F_OK) != 0)
            continue;
        /* a frozen v1 cgroup keeps its killed processes until thawed */
        if (strcmp(all[i], be->cg_freezer) == 0 && be->cg_mode == CT_CG_V1) {
            char p[PATH_MAX * 2 + 16];
            dsec__ct_fmt(p, sizeof p, "%s/freezer.state", dir);
            int fd = open(p, O_WRONLY | O_CLOEXEC);
            if (fd >= 0) {
                (void)!write(fd, "THAWED", 6);
                close(fd);
            }
        }
        /* killed processes leave the cgroup when they have run their exit, which on a host
         * whose CPUs are saturated by other sandboxes can take seconds (the rollout bench
         * saw 3 s run out under a load of 300) */
        int tries = 0;
        while (rmdir(dir) < 0 && errno == EBUSY && tries++ < 2000) {
            kill_procs(dir);
            msleep(10);
        }
        if (access(dir, F_OK) == 0 && rc == 0)
            rc =
                dsec_err_set(err, DSEC_E_BACKEND, errno, "container: cannot remove cgroup %s", dir);
    }
    dsec_free(all);
    return rc;
}

int dsec__ct_rt_delete(const struct ct_backend *be, const struct ct_rt *rt, const char *id,
                       dsec_err *err)
{
    /* thaw first: SIGKILL does not end a frozen process before it thaws */
    dsec_err ignore;
    dsec__ct_freeze(be, id, false, &ignore);
    char out[2048];
    const char *args[] = {"delete", "--force", id, NULL};
    int st = rt_cmd(be, rt, args, out, sizeof out, err);
    if (st < 0)
        return -1;
    if (st != 0 && strstr(out, "not exist") == NULL && strstr(out, "No such file") == NULL &&
        strstr(out, "not found") == NULL) {
        last_line(out);
        return dsec_err_set(err, DSEC_E_BACKEND, 0, "container: %s delete failed: %.300s", rt->name,
                            out);
    }
    return cg_remove(be, id, err);
}

static int write_str(const char *path, const char *v)
{
    int fd = open(path, O_WRONLY | O_CLOEXEC);
    if (fd < 0)
        return -1;
    ssize_t n = write(fd, v, strlen(v));
    int e = errno;
    close(fd);
    errno = e;
    return n == (ssize_t)strlen(v) ? 0 : -1;
}

int dsec__ct_freeze(const struct ct_backend *be, const char *id, bool frozen, dsec_err *err)
{
    char dir[PATH_MAX * 2], file[PATH_MAX * 2 + 32], want[32];
    dsec__ct_cg_path(be, be->cg_freezer, id, dir, sizeof dir);
    const char *val;
    if (be->cg_mode == CT_CG_V1) {
        dsec__ct_fmt(file, sizeof file, "%s/freezer.state", dir);
        val = frozen ? "FROZEN" : "THAWED";
        dsec__ct_fmt(want, sizeof want, "%s", val);
    } else {
        dsec__ct_fmt(file, sizeof file, "%s/cgroup.freeze", dir);
        val = frozen ? "1" : "0";
        dsec__ct_fmt(want, sizeof want, "frozen %s", val);
    }
    if (write_str(file, val) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "container: writing %s", file);
    if (be->cg_mode == CT_CG_V2)
        dsec__ct_fmt(file, sizeof file, "%s/cgroup.events", dir);
    /* the kernel freezes tasks asynchronously; wait until all are, up to 10 s: on a host
     * whose CPUs are saturated a v1 freeze of a busy sandbox takes seconds */
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0;; i++) {
        char buf[256];
        int fd = open(file, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            return dsec_err_set(err, DSEC_E_IO, errno, "container: reading %s", file);
        ssize_t n = read(fd, buf, sizeof buf - 1);
        close(fd);
        buf[n > 0 ? n : 0] = '\0';
        if (strstr(buf, want) != NULL)
            return 0;
        if (be->cg_mode == CT_CG_V1 && frozen && i % 50 == 49)
            write_str(file, val); /* v1 may give up FREEZING; ask again */
        struct timespec ts = {0, 500000}, now;
        nanosleep(&ts, NULL);
        clock_gettime(CLOCK_MONOTONIC, &now);
        if (now.tv_sec - t0.tv_sec >= 10)
            break;
    }
    return dsec_err_set(err, DSEC_E_TIMEOUT, 0,
                        "container: the cgroup did not become %s in 10 s (%s)",
                        frozen ? "frozen" : "thawed", file);
}

bool dsec__ct_frozen(const struct ct_backend *be, const char *id)
{
    char dir[PATH_MAX * 2], file[PATH_MAX * 2 + 32];
    dsec__ct_cg_path(be, be->cg_freezer, id, dir, sizeof dir);
    dsec__ct_fmt(file, sizeof file, "%s/%s", dir,
                 be->cg_mode == CT_CG_V1 ? "freezer.state" : "cgroup.freeze");
    char *s = dsec_sbx_read_file(file, 64);
    bool frozen =
        s != NULL && (be->cg_mode == CT_CG_V1 ? strncmp(s, "FROZEN", 6) == 0 : s[0] == '1');
    dsec_free(s);
    return frozen;
}

bool dsec__ct_alive(const struct ct_backend *be, const char *id)
{
    char dir[PATH_MAX * 2], file[PATH_MAX * 2 + 32];
    dsec__ct_cg_path(be, be->cg_pids, id, dir, sizeof dir);
    dsec__ct_fmt(file, sizeof file, "%s/cgroup.procs", dir);
    char *s = dsec_sbx_read_file(file, 64);
    bool alive = s != NULL && s[0] != '\0';
    dsec_free(s);
    return alive;
}

/* A "key value" line of a cgroup stat file; 0 when absent. */
static uint64_t stat_key(const char *buf, const char *key)
{
    size_t kl = strlen(key);
    for (const char *p = buf; p != NULL && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (strncmp(p, key, kl) == 0 && p[kl] == ' ')
            return strtoull(p + kl + 1, NULL, 10);
    return 0;
}

int dsec__ct_cg_usage(const struct ct_backend *be, const char *id, uint64_t *cpu_us, uint64_t *mem,
                      dsec_err *err)
{
    char dir[PATH_MAX * 2], p[PATH_MAX * 2 + 32];
    char *s;
    bool v1 = be->cg_mode == CT_CG_V1;
    dsec__ct_cg_path(be, be->cg_cpuacct, id, dir, sizeof dir);
    dsec__ct_fmt(p, sizeof p, "%s/%s", dir, v1 ? "cpuacct.usage" : "cpu.stat");
    if ((s = dsec_sbx_read_file(p, 8192)) == NULL)
        return dsec_err_set(err, DSEC_E_IO, errno, "container: reading %s", p);
    *cpu_us = v1 ? strtoull(s, NULL, 10) / 1000 : stat_key(s, "usage_usec");
    dsec_free(s);
    dsec__ct_cg_path(be, be->cg_memory, id, dir, sizeof dir);
    dsec__ct_fmt(p, sizeof p, "%s/%s", dir, v1 ? "memory.usage_in_bytes" : "memory.current");
    if ((s = dsec_sbx_read_file(p, 256)) == NULL)
        return dsec_err_set(err, DSEC_E_IO, errno, "container: reading %s", p);
    uint64_t usage = strtoull(s, NULL, 10);
    dsec_free(s);
    /* what the sandbox holds, as docker counts it: usage minus the page
     * cache the kernel may drop at once */
    dsec__ct_fmt(p, sizeof p, "%s/memory.stat", dir);
    uint64_t inactive = 0;
    if ((s = dsec_sbx_read_file(p, 16384)) != NULL) {
        inactive = stat_key(s, v1 ? "total_inactive_file" : "inactive_file");
        dsec_free(s);
    }
    *mem = usage > inactive ? usage - inactive : 0;
    return 0;
}

int dsec__ct_cg_weigh(const struct ct_backend *be, dsec_err *err)
{
    char dir[PATH_MAX * 2], file[PATH_MAX * 2 + 32];
    dsec__ct_fmt(dir, sizeof dir, "%s/%s", be->cg_cpu, be->cg_parent);
    if (mkdir(dir, 0755) < 0 && errno != EEXIST)
        return dsec_err_set(err, DSEC_E_IO, errno, "container: creating cgroup %s", dir);
    bool v1 = be->cg_mode == CT_CG_V1;
    if (!v1) { /* v2: the cpu controller must reach it from the root */
        dsec__ct_fmt(file, sizeof file, "%s/cgroup.subtree_control", be->cg_cpu);
        int fd = open(file, O_WRONLY | O_CLOEXEC);
        if (fd >= 0) {
            ssize_t w = write(fd, "+cpu", 4);
            (void)w; /* already enabled, or refused: the weight write below says */
            close(fd);
        }
    }
    dsec__ct_fmt(file, sizeof file, "%s/%s", dir, v1 ? "cpu.shares" : "cpu.weight");
    char v[32];
    int n =
        snprintf(v, sizeof v, "%u", v1 ? DSEC_CT_SANDBOX_CPU_SHARES : DSEC_CT_SANDBOX_CPU_WEIGHT);
    int fd = open(file, O_WRONLY | O_CLOEXEC);
    if (fd < 0 || write(fd, v, (size_t)n) != n) {
        int e = errno;
        if (fd >= 0)
            close(fd);
        return dsec_err_set(err, DSEC_E_IO, e, "container: setting %s to %s", file, v);
    }
    close(fd);
    return 0;
}

/* The v1 freezer enables a kernel static key while any cgroup is frozen, and patching the
 * kernel's text for it stops every CPU: freezing the first cgroup and thawing the last cost
 * 5.4 ms of a whole machine per freeze and thaw here (a VM), and under load the rollout bench
 * saw 6% of all CPU time in it, since crun freezes a v1 container to kill it, and a fork
 * freezes its parent. An empty cgroup kept frozen beside the sandboxes holds the key on:
 * a freeze and thaw then cost 0.07 ms. */
#define CT_FREEZE_PIN "dsec-freeze-pin"

static void freeze_pin_path(const struct ct_backend *be, char *out, size_t len)
{
    dsec__ct_fmt(out, len, "%s/%s/%s", be->cg_freezer, be->cg_parent, CT_FREEZE_PIN);
}

void dsec__ct_cg_pin_freezer(const struct ct_backend *be)
{
    if (be->cg_mode != CT_CG_V1)
        return;
    char dir[PATH_MAX * 2], file[PATH_MAX * 2 + 32];
    dsec__ct_fmt(dir, sizeof dir, "%s/%s", be->cg_freezer, be->cg_parent);
    if (mkdir(dir, 0755) < 0 && errno != EEXIST)
        goto warn;
    freeze_pin_path(be, dir, sizeof dir);
    if (mkdir(dir, 0755) < 0 && errno != EEXIST)
        goto warn;
    dsec__ct_fmt(file, sizeof file, "%s/freezer.state", dir);
    if (write_str(file, "FROZEN") == 0)
        return;
warn:
    dsec_log_warn("dsec container: cannot keep the empty cgroup %s/%s/%s frozen (%s): each freeze "
                  "and thaw of a sandbox then patches kernel text",
                  be->cg_freezer, be->cg_parent, CT_FREEZE_PIN, strerror(errno));
}

void dsec__ct_cg_cleanup(const struct ct_backend *be)
{
    if (be->cg_mode == CT_CG_V1) {
        char dir[PATH_MAX * 2], file[PATH_MAX * 2 + 32];
        freeze_pin_path(be, dir, sizeof dir);
        dsec__ct_fmt(file, sizeof file, "%s/freezer.state", dir);
        (void)write_str(file, "THAWED");
        rmdir(dir);
    }
    char(*all)[PATH_MAX] = dsec_malloc(32 * sizeof *all);
    if (all == NULL)
        return;
    size_t n = cg_all(all, 32);
    for (size_t i = 0; i < n; i++) {
        char dir[PATH_MAX * 2];
        dsec__ct_fmt(dir, sizeof dir, "%s/%s", all[i], be->cg_parent);
        rmdir(dir);
    }
    dsec_free(all);
}

/* ---- warm containers ----------------------------------------------------------------- */

/* The first pid in the container's cgroup: its init (the agent) while nothing else runs. */
pid_t dsec__ct_init_pid(const struct ct_backend *be, const char *id)
{
    char dir[PATH_MAX * 2], file[PATH_MAX * 2 + 32];
    dsec__ct_cg_path(be, be->cg_pids, id, dir, sizeof dir);
    dsec__ct_fmt(file, sizeof file, "%s/cgroup.procs", dir);
    char *s = dsec_sbx_read_file(file, 64);
    long pid = s != NULL ? strtol(s, NULL, 10) : 0;
    dsec_free(s);
    return pid > 0 ? (pid_t)pid : -1;
}

/* A whole number from a cgroup file: "max" and absent files are 0. */
static uint64_t cg_u64(const char *dir, const char *file)
{
    char p[PATH_MAX * 2 + 64];
    dsec__ct_fmt(p, sizeof p, "%s/%s", dir, file);
    char *s = dsec_sbx_read_file(p, 64);
    uint64_t v = s != NULL && s[0] >= '0' && s[0] <= '9' ? strtoull(s, NULL, 10) : 0;
    dsec_free(s);
    return v;
}

/* A "key value" line of a cgroup file (stat_key), 0 when the file or line is absent. */
static uint64_t cg_key(const char *dir, const char *file, const char *key)
{
    char p[PATH_MAX * 2 + 64];
    dsec__ct_fmt(p, sizeof p, "%s/%s", dir, file);
    char *s = dsec_sbx_read_file(p, 8192);
    uint64_t v = s != NULL ? stat_key(s, key) : 0;
    dsec_free(s);
    return v;
}

/* pid's state letter, and whether it is pid 1 of its own pid namespace (NSpid's last field). */
static char proc_state(long pid, bool *ns_init, bool *has_nspid)
{
    char p[64];
    dsec__ct_fmt(p, sizeof p, "/proc/%ld/status", pid);
    char *s = dsec_sbx_read_file(p, 4096);
    char st = 0;
    *ns_init = false;
    const char *l = s != NULL ? strstr(s, "\nState:\t") : NULL;
    if (l != NULL)
        st = l[8];
    if (s != NULL && (l = strstr(s, "\nNSpid:")) != NULL) {
        *has_nspid = true;
        const char *end = strchr(l + 1, '\n');
        const char *last = end != NULL ? end : l + strlen(l);
        while (last > l && (last[-1] == ' ' || last[-1] == '\t'))
            last--;
        const char *f = last;
        while (f > l && f[-1] != '\t' && f[-1] != ' ')
            f--;
        *ns_init = last - f == 1 && *f == '1';
    }
    dsec_free(s);
    return st;
}

void dsec__ct_agent_probe(const struct ct_backend *be, const char *id, struct ct_agent_probe *p)
{
    memset(p, 0, sizeof *p);
    char dir[PATH_MAX * 2], file[PATH_MAX * 2 + 32];
    bool v1 = be->cg_mode == CT_CG_V1;
    dsec__ct_cg_path(be, be->cg_pids, id, dir, sizeof dir);
    p->cgroup = access(dir, F_OK) == 0;
    dsec__ct_fmt(file, sizeof file, "%s/cgroup.procs", dir);
    /* a fork bomb fills it up to pids.max: 1 MiB holds ~130000 pids */
    char *procs = p->cgroup ? dsec_sbx_read_file(file, 1u << 20) : NULL;
    long first = 0;
    bool has_nspid = false;
    for (char *q = procs, *end; q != NULL && *q; q = end) {
        long pid = strtol(q, &end, 10);
        if (end == q)
            break;
        if (pid <= 0)
            continue;
        p->nprocs++;
        if (first == 0)
            first = pid;
        bool ns_init = false;
        char st = p->init == 0 ? proc_state(pid, &ns_init, &has_nspid) : 0;
        if (p->init == 0 && ns_init) {
            p->init = (pid_t)pid;
            p->state = st;
        }
    }
    dsec_free(procs);
    /* a kernel without NSpid: the first is init. With it, no pid 1 means the init is gone,
     * whatever else is left (an agent's shepherd dies with it a moment later). */
    if (p->init == 0 && first != 0 && !has_nspid) {
        bool ns_init;
        p->init = (pid_t)first;
        p->state = proc_state(first, &ns_init, &has_nspid);
    }
    if (p->cgroup) {
        p->pids = cg_u64(dir, "pids.current");
        p->pids_max = cg_u64(dir, "pids.max");
        p->frozen = dsec__ct_frozen(be, id);
    }
    dsec__ct_cg_path(be, be->cg_memory, id, dir, sizeof dir);
    p->oom_kills = v1 ? cg_key(dir, "memory.oom_control", "oom_kill")
                      : cg_key(dir, "memory.events", "oom_kill");
    p->mem_limit = cg_u64(dir, v1 ? "memory.limit_in_bytes" : "memory.max");
    if (p->mem_limit >= (1ull << 60)) /* v1 says "no limit" with a huge number */
        p->mem_limit = 0;
    dsec__ct_cg_path(be, be->cg_cpu, id, dir, sizeof dir);
    p->cpu_throttled = cg_key(dir, "cpu.stat", "nr_throttled");
}

static int cg_write(const char *dir, const char *file, const char *val, dsec_err *err)
{
    char p[PATH_MAX * 2 + 64];
    dsec__ct_fmt(p, sizeof p, "%s/%s", dir, file);
    if (write_str(p, val) < 0)
        return dsec_err_set(err, DSEC_E_BACKEND, errno, "container: writing %s to %s", val, p);
    return 0;
}

int dsec__ct_cg_limits(const struct ct_backend *be, const char *id, uint64_t memory_mb,
                       uint64_t cpu_milli, dsec_err *err)
{
    char dir[PATH_MAX * 2], v[64];
    bool v1 = be->cg_mode == CT_CG_V1;
    if (memory_mb != 0) {
        /* as the OCI config asks: memory + swap capped at the limit, so no swap */
        dsec__ct_cg_path(be, be->cg_memory, id, dir, sizeof dir);
        dsec__ct_fmt(v, sizeof v, "%" PRIu64, memory_mb << 20);
        if (cg_write(dir, v1 ? "memory.limit_in_bytes" : "memory.max", v, err) < 0)
            return -1;
        if (v1 && be->memsw && cg_write(dir, "memory.memsw.limit_in_bytes", v, err) < 0)
            return -1;
        if (!v1 && cg_write(dir, "memory.swap.max", "0", err) < 0)
            return -1;
    }
    if (cpu_milli != 0) {
        uint64_t quota = cpu_milli * 100; /* of a 100 ms period, as dsec__ct_oci_write */
        if (quota < 1000)
            quota = 1000;
        dsec__ct_cg_path(be, be->cg_cpu, id, dir, sizeof dir);
        if (v1) {
            dsec__ct_fmt(v, sizeof v, "%" PRIu64, quota);
            if (cg_write(dir, "cpu.cfs_period_us", "100000", err) < 0 ||
                cg_write(dir, "cpu.cfs_quota_us", v, err) < 0)
                return -1;
        } else {
            dsec__ct_fmt(v, sizeof v, "%" PRIu64 " 100000", quota);
            if (cg_write(dir, "cpu.max", v, err) < 0)
                return -1;
        }
    }
    return 0;
}

/* The steps of a root switch, as the helper reports its failure. */
static const char *const switch_steps[] = {
    "",
    "entering its uts namespace",
    "setting the hostname",
    "entering its mount namespace",
    "attaching the new root at /.dsec/root",
    ("making mount points in the new root (/proc, /dev, /sys and /.dsec must be directories, "
     "/.dsec/agent a file)"),
    "moving /proc, /dev, /sys and the agent into the new root",
    "making /etc/resolv.conf in the new root (/etc must be a directory)",
    "moving /etc/resolv.conf into the new root",
    "pivot_root",
    "detaching the old root",
};

/* In switch_child; not instrumented by ASan either (switch_child says why). */
__attribute__((noreturn, no_sanitize_address)) static void switch_fail(int fd, int step)
{
    int msg[2] = {step, errno};
    (void)!write(fd, msg, sizeof msg);
    _exit(1);
}

/* path is a directory, made if missing; a symlink is refused (ENOTDIR). */
static int switch_dir(const char *path, mode_t mode)
{
    struct stat st;
    if ((mkdir(path, mode) < 0 && errno != EEXIST) || lstat(path, &st) < 0)
        return -1;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return -1;
    }
    return 0;
}

/* The mount points the new root needs: dirs, and the agent's file. The layers are the
 * sandbox's, so none of them may be a symlink (this runs as the host's root, and a link
 * would lead the mounts elsewhere): each must be a directory, the agent's file a file. */
static int switch_points(void)
{
    static const char *const dirs[] = {"/.dsec/root/proc", "/.dsec/root/dev", "/.dsec/root/sys",
                                       "/.dsec/root/.dsec"};
    static const mode_t modes[] = {0555, 0755, 0555, 0755};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++)
        if (switch_dir(dirs[i], modes[i]) < 0)
            return -1;
    /* read-only: an existing one in a lower layer is not copied up */
    int fd = open("/.dsec/root/.dsec/agent", O_RDONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0755);
    if (fd < 0)
        return -1;
    close(fd);
    return 0;
}

/* With network containment: /etc/resolv.conf, where the node's resolver file is bound. A
 * symlink there (systemd-resolved images) is replaced by a file: the bind hides it anyway. */
static int switch_resolv(void)
{
    struct stat st;
    if (switch_dir("/.dsec/root/etc", 0755) < 0)
        return -1;
    if (lstat("/.dsec/root/etc/resolv.conf", &st) == 0 && S_ISLNK(st.st_mode) &&
        unlink("/.dsec/root/etc/resolv.conf") < 0)
        return -1;
    int fd = open("/.dsec/root/etc/resolv.conf", O_RDONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (fd < 0)
        return -1;
    close(fd);
    return 0;
}

struct switch_args {
    int mnt, uts, root_fd, out;
    bool resolv;
    const char *hostname;
    size_t hl;
};

/* The helper, a dsec_spawn_vfork child: it shares the node's memory (no page tables copied,
 * nothing to tear down at exit) but has its own fs_struct, which setns into a mount namespace
 * needs. Only system calls here, with every signal blocked until it exits. Not instrumented by
 * ASan: at the _exit (a noreturn call) it would take the helper's stack for a stack it knows. */
__attribute__((no_sanitize_address)) static int switch_child(void *arg)
{
    const struct switch_args *a = arg;
    if (setns(a->uts, CLONE_NEWUTS) < 0)
        switch_fail(a->out, 1);
    if (sethostname(a->hostname, a->hl) < 0)
        switch_fail(a->out, 2);
    if (setns(a->mnt, CLONE_NEWNS) < 0) /* root and cwd: the container's root */
        switch_fail(a->out, 3);
    if (move_mount(a->root_fd, "", AT_FDCWD, "/.dsec/root", MOVE_MOUNT_F_EMPTY_PATH) < 0)
        switch_fail(a->out, 4);
    if (switch_points() < 0)
        switch_fail(a->out, 5);
    /* each with what is mounted below it: proc's masks and read-only paths,
     * devpts, shm, mqueue, the cgroup mounts */
    if (mount("/proc", "/.dsec/root/proc", NULL, MS_MOVE, NULL) < 0 ||
        mount("/dev", "/.dsec/root/dev", NULL, MS_MOVE, NULL) < 0 ||
        mount("/sys", "/.dsec/root/sys", NULL, MS_MOVE, NULL) < 0 ||
        mount("/.dsec/agent", "/.dsec/root/.dsec/agent", NULL, MS_MOVE, NULL) < 0)
        switch_fail(a->out, 6);
    if (a->resolv && switch_resolv() < 0)
        switch_fail(a->out, 7);
    if (a->resolv &&
        mount("/etc/resolv.conf", "/.dsec/root/etc/resolv.conf", NULL, MS_MOVE, NULL) < 0)
        switch_fail(a->out, 8);
    /* every process whose root was the old one (the agent) gets the new */
    if (chdir("/.dsec/root") < 0 || syscall(SYS_pivot_root, ".", ".") < 0)
        switch_fail(a->out, 9);
    if (umount2(".", MNT_DETACH) < 0)
        switch_fail(a->out, 10);
    _exit(0);
}

int dsec__ct_rt_switch_root(const struct ct_backend *be, const char *id, pid_t init, int root_fd,
                            const char *hostname, bool resolv, dsec_err *err)
{
    (void)be;
    char p[64];
    dsec__ct_fmt(p, sizeof p, "/proc/%d/ns/mnt", (int)init);
    int mnt = open(p, O_RDONLY | O_CLOEXEC);
    dsec__ct_fmt(p, sizeof p, "/proc/%d/ns/uts", (int)init);
    int uts = open(p, O_RDONLY | O_CLOEXEC);
    int pfd[2] = {-1, -1};
    if (mnt < 0 || uts < 0 || pipe2(pfd, O_CLOEXEC) < 0) {
        int e = errno;
        if (mnt >= 0)
            close(mnt);
        if (uts >= 0)
            close(uts);
        if (pfd[0] >= 0) {
            close(pfd[0]);
            close(pfd[1]);
        }
        return dsec_err_set(err, DSEC_E_BACKEND, e,
                            "container: the namespaces of warm container %s (init %d)", id,
                            (int)init);
    }
    struct switch_args a = {.mnt = mnt,
                            .uts = uts,
                            .root_fd = root_fd,
                            .out = pfd[1],
                            .resolv = resolv,
                            .hostname = hostname,
                            .hl = strlen(hostname)};
    /* this thread waits until the child has exited */
    pid_t pid = dsec_spawn_vfork(switch_child, &a, 64 << 10);
    int e = errno;
    close(pfd[1]);
    close(mnt);
    close(uts);
    if (pid < 0) {
        close(pfd[0]);
        return dsec_err_set(err, DSEC_E_IO, e, "container: starting the root switch helper");
    }
    int msg[2] = {0, 0};
    ssize_t n;
    while ((n = read(pfd[0], msg, sizeof msg)) < 0 && errno == EINTR)
        ;
    close(pfd[0]);
    int st = wait_status(pid);
    if (st == 0)
        return 0;
    if (n == (ssize_t)sizeof msg && msg[0] > 0 &&
        msg[0] < (int)(sizeof switch_steps / sizeof switch_steps[0]))
        return dsec_err_set(err, DSEC_E_BACKEND, msg[1],
                            "container: switching the root of warm container %s: %s", id,
                            switch_steps[msg[0]]);
    return dsec_err_set(err, DSEC_E_BACKEND, 0,
                        "container: switching the root of warm container %s: the helper ended "
                        "with status %d",
                        id, st);
}
