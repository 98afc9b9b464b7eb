/* fuzz_agent.c - libFuzzer harness: dsec-agent's request reader against a hostile client. */

/*
 * Whoever holds the agent's channel (the node, or in a VM whatever reaches the
 * port) may send any bytes. The agent must answer every byte stream with
 * well-formed frames and never crash, leak or hang; a broken frame costs at
 * most the connection.
 *
 * backends/agent/agent.c is compiled into this file and the agent's other files
 * are built with it (DSEC_AGENT_FUZZ), so its own code runs: conn_new greets,
 * the agent's epoll loop (loop_once) reads the input, conn_process frames it,
 * and handle_frame's decoders (exec, kill,
 * sync, fwrite, fread, flist, fstat, fremove, the background process requests
 * pstart, plist, psignal, pstdin and poutput, unknown types) act on it.
 *
 * Input: byte 0 picks how the connection is served (bit 0 set: as a
 * virtio-serial port, where a bad frame length makes the agent skip input up
 * to the next SYNC instead of closing); the rest is what the client sends,
 * written through a socketpair, followed by EOF. Each request frame is
 * u32 len (type + id + payload), u8 type, u32 id, payload (agent-proto.h).
 *
 * What is real and what is not:
 * - File requests run for real, confined: the agent runs on a worker thread
 *   that has its own root (unshare(CLONE_FS) + chroot into a temp directory,
 *   root only), which is emptied and refilled before every input with an
 *   /etc/passwd, /etc/group and a few files, a symlink and a FIFO to act on.
 *   libFuzzer's thread keeps the host's root for its corpus and artifacts.
 * - exec: decoding, user resolution against that /etc/passwd, argv/env/cwd
 *   packing, pipes, stdin feeding, vfork, the child's descriptor, user and
 *   directory set-up, the PATH search and its failure report, reaping and the
 *   EXIT answer all run. Only execve is replaced (DSEC_AGENT_FUZZ, agent-spawn.c):
 *   it fails as for a missing file, so no program ever runs and every child
 *   exits 127. Output streaming of a live command (caps, back-pressure) and
 *   timeouts of running commands are therefore not exercised. Background
 *   processes (PSTART) end the same way; the table of them is emptied after
 *   every input, so handles start at 1 for each.
 * - kill signals the (already exited) children's process groups only.
 * - Not exercised: listening sockets, accept, virtio-serial port reopening,
 *   signals, start-up and shutdown (main).
 *
 * Checked for every input, besides ASan/UBSan/LSan: every frame the agent
 * sends decodes exactly (agent-proto.h layouts, known types and kinds), the
 * first one is the greeting, every child exits 127 (anything else means the
 * child failed before its exec), what a child gets is terminated and its
 * environment is all NAME=value, the connection ends and every command is
 * forgotten within 10 s of EOF, and nothing is left to free.
 */
#define DSEC_AGENT_FUZZ 1
#include "backends/agent/agent.c" /* first: it defines _GNU_SOURCE */

#include <dirent.h>
#include <pthread.h>
#include <sched.h>
#include <sys/wait.h>

#include "dsec/alloc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define INPUT_MAX (1u << 20)
#define HANG_NS (10ull * 1000000000u)

static struct {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    const uint8_t *data; /* the input to run, while have is set */
    size_t size;
    bool have, done;
    int ready; /* 0 starting, 1 confined, -1 could not confine */
    char why[256];
    char root[64];
} w = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static void fail(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fputs("fuzz_agent: ", stderr);
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    abort();
}

/* ---- what the agent gives a child (called in the agent, before vfork) ---- */

static void fuzz_check_spawn(const struct spawn *s)
{
    if (s->argv == NULL || s->argv[0] == NULL)
        fail("exec without argv[0] reached the spawn");
    size_t total = 0;
    for (char **a = s->argv; *a; a++)
        total += strlen(*a); /* ASan: every string is terminated inside its block */
    for (char **e = s->envp; *e; e++) {
        const char *eq = strchr(*e, '=');
        if (eq == NULL || eq == *e)
            fail("a child's environment holds \"%.64s\", not NAME=value", *e);
    }
    if (s->cwd)
        total += strlen(s->cwd);
    if (s->path_env == NULL || s->fds[0] < 0 || s->fds[1] < 0 || s->fds[2] < 0)
        fail("a child lacks a PATH or a standard descriptor");
    (void)total;
}

/* ---- the answers: every frame must decode exactly ---- */

struct answers {
    uint8_t *buf;
    size_t len, cap;
    size_t frames;
};

/* DSEC_FUZZ_VERBOSE=1: every answer on stderr (for writing seeds). */
static void say(uint8_t type, uint32_t id, const uint8_t *p, size_t len)
{
    static int verbose = -1;
    if (verbose < 0)
        verbose = getenv("DSEC_FUZZ_VERBOSE") != NULL;
    if (!verbose)
        return;
    static const char *const names[] = {"?",    "HELLO",   "ERROR", "OK",    "OUTPUT", "EXIT",
                                        "DATA", "ENTRIES", "PROC",  "PROCS", "POUT"};
    const char *name = type < sizeof names / sizeof names[0] ? names[type] : "?";
    if (type == DSEC__AGENT_T_ERROR && len >= 12)
        fprintf(stderr, "  id %" PRIu32 " %s: %.*s\n", id, name, (int)(len - 12),
                (const char *)p + 12);
    else if (type == DSEC__AGENT_T_OUTPUT && len >= 5)
        fprintf(stderr, "  id %" PRIu32 " %s %u: %.*s\n", id, name, p[0], (int)(len - 5),
                (const char *)p + 5);
    else
        fprintf(stderr, "  id %" PRIu32 " %s (%zu bytes)\n", id, name, len);
}

/* A process info (agent-proto.h): flags known, cmdline within its limit. */
static void check_proc_info(dsec__agent_rd *r)
{
    size_t n;
    uint64_t handle = dsec__agent_get_u64(r);
    dsec__agent_get_u32(r);
    uint8_t flags = dsec__agent_get_u8(r);
    for (int i = 0; i < 2; i++)
        dsec__agent_get_u32(r);
    for (int i = 0; i < 4; i++)
        dsec__agent_get_u64(r);
    dsec__agent_get_str(r, DSEC__AGENT_CMDLINE_MAX, &n);
    if (!r->bad && (handle == 0 || flags > 63))
        fail("process info of handle %" PRIu64 " with flags %#x", handle, flags);
}

static void check_frame(const struct answers *a, uint8_t type, uint32_t id, const uint8_t *p,
                        size_t len)
{
    dsec__agent_rd r = {.p = p, .end = p + len};
    size_t n;
    say(type, id, p, len);
    if (a->frames == 0 && (type != DSEC__AGENT_T_HELLO || id != 0))
        fail("the first frame is type %u id %" PRIu32 ", not the greeting", type, id);
    switch (type) {
    case DSEC__AGENT_T_HELLO:
        if (dsec__agent_get_u32(&r) != DSEC__AGENT_VERSION ||
            dsec__agent_get_u32(&r) != DSEC__AGENT_FRAME_MAX)
            fail("HELLO with a wrong version or frame limit");
        break;
    case DSEC__AGENT_T_ERROR: {
        uint32_t kind = dsec__agent_get_u32(&r);
        dsec__agent_get_u32(&r);
        dsec__agent_get_bytes(&r, 512, &n);
        if (!r.bad && (kind < DSEC__AGENT_ERR_IO || kind > DSEC__AGENT_ERR_STATE || n == 0))
            fail("ERROR of kind %" PRIu32 " with a %zu-byte message", kind, n);
        break;
    }
    case DSEC__AGENT_T_OK:
        dsec__agent_get_u64(&r);
        break;
    case DSEC__AGENT_T_OUTPUT: {
        uint8_t stream = dsec__agent_get_u8(&r);
        dsec__agent_get_bytes(&r, DSEC__AGENT_CHUNK, &n);
        if (!r.bad && (stream < 1 || stream > 2 || n == 0))
            fail("OUTPUT on stream %u with %zu bytes", stream, n);
        break;
    }
    case DSEC__AGENT_T_EXIT: {
        uint32_t code = dsec__agent_get_u32(&r), sig = dsec__agent_get_u32(&r);
        uint8_t flags = dsec__agent_get_u8(&r);
        dsec__agent_get_u64(&r);
        dsec__agent_get_u64(&r);
        dsec__agent_get_u64(&r);
        if (!r.bad && (code != 127 || sig != 0))
            fail("a child ended with code %" PRId32 ", signal %" PRIu32
                 " instead of 127 (failed before its exec; its report is above)",
                 (int32_t)code, sig);
        if (!r.bad && flags > 31)
            fail("EXIT flags %#x", flags);
        break;
    }
    case DSEC__AGENT_T_DATA: {
        dsec__agent_get_u64(&r);
        uint8_t eof = dsec__agent_get_u8(&r);
        dsec__agent_get_bytes(&r, DSEC__AGENT_FILE_MAX, &n);
        if (!r.bad && eof > 1)
            fail("DATA with eof %u", eof);
        break;
    }
    case DSEC__AGENT_T_ENTRIES: {
        uint32_t count = dsec__agent_get_u32(&r);
        if (count > DSEC__AGENT_LIST_MAX)
            fail("ENTRIES with %" PRIu32 " entries", count);
        for (uint32_t i = 0; i < count && !r.bad; i++) {
            dsec__agent_get_bytes(&r, DSEC__AGENT_PATH_MAX, &n);
            uint8_t kind = dsec__agent_get_u8(&r);
            dsec__agent_get_u64(&r);
            uint32_t mode = dsec__agent_get_u32(&r);
            dsec__agent_get_u64(&r);
            if (!r.bad && (n == 0 || kind < 1 || kind > 4 || mode > 07777))
                fail("entry %" PRIu32 ": %zu-byte name, kind %u, mode %#" PRIx32, i, n, kind, mode);
        }
        break;
    }
    case DSEC__AGENT_T_PROC:
        check_proc_info(&r);
        break;
    case DSEC__AGENT_T_PROCS: {
        uint32_t count = dsec__agent_get_u32(&r);
        if (count > DSEC__AGENT_PROC_MAX)
            fail("PROCS with %" PRIu32 " processes", count);
        for (uint32_t i = 0; i < count && !r.bad; i++)
            check_proc_info(&r);
        break;
    }
    case DSEC__AGENT_T_POUT:
        check_proc_info(&r);
        for (int s = 0; s < 2; s++) {
            dsec__agent_get_u64(&r);
            dsec__agent_get_bytes(&r, DSEC__AGENT_POUT_MAX, &n);
        }
        break;
    default:
        fail("the agent sent a frame of type %u", type);
    }
    if (!dsec__agent_done(&r))
        fail("a frame of type %u (id %" PRIu32 ", %zu payload bytes) does not decode exactly", type,
             id, len);
}

/* Check the complete frames received so far and keep the incomplete tail. */
static void check_answers(struct answers *a)
{
    size_t off = 0;
    while (a->len - off >= DSEC__AGENT_HDR) {
        uint32_t len = dsec__agent_get_u32le(a->buf + off);
        if (len < 5 || len > DSEC__AGENT_FRAME_MAX)
            fail("the agent sent a frame length of %" PRIu32, len);
        if (a->len - off < 4 + (size_t)len)
            break;
        const uint8_t *f = a->buf + off;
        check_frame(a, f[4], dsec__agent_get_u32le(f + 5), f + DSEC__AGENT_HDR, len - 5);
        a->frames++;
        off += 4 + (size_t)len;
    }
    memmove(a->buf, a->buf + off, a->len - off);
    a->len -= off;
}

/* Read what the agent sent; false at EOF. */
static bool read_answers(int fd, struct answers *a, bool *busy)
{
    for (;;) {
        if (a->cap - a->len < 65536) {
            size_t cap = a->cap ? a->cap * 2 : 131072;
            uint8_t *nb = dsec_realloc(a->buf, cap);
            if (nb == NULL)
                fail("out of memory for %zu bytes of answers", cap);
            a->buf = nb;
            a->cap = cap;
        }
        ssize_t n = recv(fd, a->buf + a->len, a->cap - a->len, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0 && errno == EAGAIN)
            return true;
        if (n <= 0) /* EOF, or the agent reset the connection */
            return false;
        *busy = true;
        a->len += (size_t)n;
        check_answers(a);
    }
}

/* ---- the confined root: refilled before every input ---- */

static void put_file(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0 || write(fd, text, strlen(text)) != (ssize_t)strlen(text))
        fail("writing %s in the fuzz root: %s", path, strerror(errno));
    close(fd);
}

static void reset_root(void)
{
    int dfd = open("/", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = dfd < 0 ? NULL : fdopendir(dfd);
    if (d == NULL)
        fail("opening the fuzz root: %s", strerror(errno));
    /* removing while reading may make readdir skip entries: pass until none is left */
    for (bool any = true; any;) {
        any = false;
        rewinddir(d);
        struct dirent *de;
        while ((de = readdir(d)) != NULL) {
            if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
                continue;
            any = true;
            if (dsec__agent_remove_tree(dfd, de->d_name) < 0)
                fail("emptying the fuzz root: %s: %s", de->d_name, strerror(errno));
        }
    }
    closedir(d);
    static const char *const dirs[] = {"/etc", "/home", "/home/sbx", "/tmp", "/data", "/data/sub"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++)
        if (mkdir(dirs[i], 0755) < 0)
            fail("mkdir %s in the fuzz root: %s", dirs[i], strerror(errno));
    put_file("/etc/passwd", "root:x:0:0:root:/root:/bin/sh\n"
                            "sbx:x:1000:1000:sandbox:/home/sbx:/bin/sh\n"
                            "broken line\n"
                            "odd:x:12a:1:bad uid:/:/bin/sh\n"
                            "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
    put_file("/etc/group", "root:x:0:\nsbx:x:1000:\ndev:x:2000:other,sbx\nwheel:x:10:root,sbx\n");
    put_file("/data/hello", "hello\n");
    put_file("/data/sub/deep", "deep\n");
    if (symlink("/data/sub", "/data/link") < 0 || mkfifo("/data/fifo", 0644) < 0)
        fail("symlink/mkfifo in the fuzz root: %s", strerror(errno));
}

/* ---- one input: a client connection driven through the agent's own loop ---- */

static void run_input(const uint8_t *data, size_t size)
{
    bool port_mode = size > 0 && (data[0] & 1);
    const uint8_t *in = size > 0 ? data + 1 : data;
    size_t in_len = size > 0 ? size - 1 : 0;
    reset_root();

    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
        fail("socketpair: %s", strerror(errno));
    /* g.terminating (set at start-up) keeps port_lost from reopening this stand-in port */
    struct port fport = {.kind = K_PORT, .fd = sv[0]};
    struct conn *c = dsec__agent_conn_new(sv[0], port_mode ? &fport : NULL, EPOLL_CTL_ADD);
    if (c == NULL)
        fail("conn_new: out of memory");
    fport.conn = c;

    static struct answers a; /* the buffer stays for the next input: no mmap churn under ASan */
    a.len = a.frames = 0;
    size_t off = 0;
    bool wr_done = false, eof = false;
    uint64_t deadline = dsec__agent_now_ns() + HANG_NS;
    while (!eof || dsec__agent_g.conns != NULL || dsec__agent_g.cmds != NULL) {
        bool busy = false;
        if (!wr_done && off < in_len) {
            ssize_t n = send(sv[1], in + off, in_len - off, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0) {
                off += (size_t)n;
                busy = true;
            } else if (n < 0 && errno != EAGAIN && errno != EINTR) {
                wr_done = true; /* the agent closed the connection */
            }
        }
        if (!wr_done && off == in_len) {
            shutdown(sv[1], SHUT_WR);
            wr_done = busy = true;
        }
        if (!eof && !read_answers(sv[1], &a, &busy))
            eof = busy = true;
        /* idle: nothing moved in this turn, so only the agent's own events can be pending */
        if (loop_once(busy ? 0 : 10) < 0)
            fail("the agent's epoll_wait failed");
        /* No program runs, so every child is on its way out; vfork returned before it became a
         * zombie, though. Waiting (without reaping) for that makes the agent's reap, and so
         * whether EXIT still finds the connection, independent of timing. */
        for (struct cmd *m = dsec__agent_g.cmds; m; m = m->next)
            if (!m->exited) {
                siginfo_t si;
                while (waitid(P_PID, (id_t)m->pid, &si, WEXITED | WNOWAIT) < 0 && errno == EINTR)
                    ;
            }
        dsec__agent_reap();
        if (dsec__agent_now_ns() > deadline)
            fail("after %llu s the connection is %s and %s (%zu of %zu input bytes taken)",
                 HANG_NS / 1000000000u, eof ? "closed" : "open",
                 dsec__agent_g.cmds ? "commands remain" : "no command remains", off, in_len);
    }
    if (dsec__agent_g.dead_conns || dsec__agent_g.dead_cmds)
        fail("dead connections or commands were not freed");
    /* Background processes have all ended (no program runs); the next input starts afresh. */
    for (size_t i = 0; i < dsec__agent_g.nprocs; i++) {
        struct proc *pr = dsec__agent_g.procs[i];
        if (pr->running || pr->cmd || pr->in_conn || pr->exit_code != 127)
            fail("background process %" PRIu64 " is %s with code %d", pr->handle,
                 pr->running ? "running" : "ended", (int)pr->exit_code);
        dsec__agent_proc_free(pr);
    }
    dsec__agent_g.nprocs = 0;
    dsec__agent_g.next_handle = 1;
    close(sv[1]);
}

/* ---- the worker thread: confined once, then runs inputs one at a time ---- */

static void *worker_main(void *arg)
{
    (void)arg;
    /* a write to a gone peer returns EPIPE (the agent blocks SIGPIPE in main) */
    sigset_t pipe_set;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, NULL);
    int rc = 0;
    if (unshare(CLONE_FS) < 0 || chroot(w.root) < 0 || chdir("/") < 0) {
        snprintf(w.why, sizeof w.why,
                 "confining file requests to %s (unshare(CLONE_FS), chroot): %s", w.root,
                 strerror(errno));
        rc = -1;
    }
    pthread_mutex_lock(&w.mu);
    w.ready = rc < 0 ? -1 : 1;
    pthread_cond_broadcast(&w.cv);
    pthread_mutex_unlock(&w.mu);
    if (rc < 0)
        return NULL;
    for (;;) {
        pthread_mutex_lock(&w.mu);
        while (!w.have)
            pthread_cond_wait(&w.cv, &w.mu);
        const uint8_t *data = w.data;
        size_t size = w.size;
        pthread_mutex_unlock(&w.mu);
        run_input(data, size);
        pthread_mutex_lock(&w.mu);
        w.have = false;
        w.done = true;
        pthread_cond_broadcast(&w.cv);
        pthread_mutex_unlock(&w.mu);
    }
    return NULL;
}

static void remove_root(void)
{
    if (strstr(w.root, "/dsec-fuzz-agent.") != NULL)
        dsec__agent_remove_tree(AT_FDCWD, w.root);
}

static void start(void)
{
    /* deep trees from mkdir_parents cost an fd per level to remove */
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < 65536) {
        rl.rlim_cur = rl.rlim_max < 65536 ? rl.rlim_max : 65536;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    /* tmpfs when there is one: a disk filesystem makes the refill the slowest part of a run */
    struct stat st;
    const char *base = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm" : "/tmp";
    snprintf(w.root, sizeof w.root, "%s/dsec-fuzz-agent.XXXXXX", base);
    if (mkdtemp(w.root) == NULL)
        fail("mkdtemp %s: %s", w.root, strerror(errno));
    atexit(remove_root);
    chmod(w.root, 0755); /* commands switched to another user still reach their cwd */
    static char *env[] = {"PATH=/usr/bin:/bin", "LANG=C"};
    dsec__agent_g.base_env = env;
    dsec__agent_g.nbase_env = 2;
    dsec__agent_g.terminating = true;
    dsec__agent_g.null_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    dsec__agent_g.ep = epoll_create1(EPOLL_CLOEXEC);
    if (dsec__agent_g.ep < 0)
        fail("epoll_create1: %s", strerror(errno));
    pthread_t t;
    if (pthread_create(&t, NULL, worker_main, NULL) != 0)
        fail("cannot start the worker thread");
    pthread_detach(t);
    pthread_mutex_lock(&w.mu);
    while (w.ready == 0)
        pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    if (w.ready < 0) {
        fprintf(stderr, "fuzz_agent: %s; it needs root (skipped)\n", w.why);
        exit(77);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static bool started;
    if (size > INPUT_MAX)
        return 0;
    if (!started) {
        start();
        started = true;
    }
    pthread_mutex_lock(&w.mu);
    w.data = data;
    w.size = size;
    w.have = true;
    w.done = false;
    pthread_cond_broadcast(&w.cv);
    while (!w.done)
        pthread_cond_wait(&w.cv, &w.mu);
    pthread_mutex_unlock(&w.mu);
    return 0;
}
