/* cli.c - dsec subcommands that drive sandboxes through libdsec: create, exec, cp, ls, fork, pause,
 * resume, rm, status, ttl. */
#include "tools/cli.h"

#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "dsec/alloc.h"
#include "dsec/client.h"

#define MAX_ITEMS 64

int dsec_cli_fail(const char *cmd, const dsec_err *err)
{
    fprintf(stderr, "dsec %s: %s (%s%s)\n", cmd, err->msg, dsec_code_name(err->code),
            dsec_code_retry_safe(err->code) ? ", safe to retry" : "");
    return err->code == DSEC_E_INVALID ? 2 : 1;
}

static int usage(const char *cmd, const char *text)
{
    fprintf(stderr, "usage: dsec %s %s\n", cmd, text);
    return 2;
}

dsec_client *dsec_cli_connect(const char *cmd)
{
    dsec_client *c = NULL;
    dsec_err err;
    /* DSEC_TRACE_ID=ID dsec create ...: the requests carry it, for dsec trace ID */
    const char *tid = getenv("DSEC_TRACE_ID");
    if (tid != NULL && tid[0] != '\0' && dsec_trace_set(tid, &err) < 0) {
        fprintf(stderr, "dsec %s: DSEC_TRACE_ID: %s\n", cmd, err.msg);
        return NULL;
    }
    if (dsec_client_connect(&c, NULL, &err) < 0) {
        fprintf(stderr, "dsec %s: cannot reach the bus at %s: %s\n", cmd,
                getenv("DSEC_URL") ? getenv("DSEC_URL") : "nats://127.0.0.1:4222", err.msg);
        return NULL;
    }
    return c;
}

static bool parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (s[0] == '\0' || s[0] == '-' || *end != '\0' || errno != 0)
        return false;
    *out = v;
    return true;
}

/* "512", "512M", "2G" -> MiB */
static bool parse_mem(const char *s, uint64_t *mb)
{
    char buf[64];
    size_t n = strlen(s);
    if (n == 0 || n >= sizeof buf)
        return false;
    memcpy(buf, s, n + 1);
    uint64_t mult = 1;
    char last = buf[n - 1];
    if (last == 'G' || last == 'g')
        mult = 1024;
    if (last == 'G' || last == 'g' || last == 'M' || last == 'm')
        buf[n - 1] = '\0';
    uint64_t v;
    if (!parse_u64(buf, &v) || v > UINT64_MAX / mult)
        return false;
    *mb = v * mult;
    return true;
}

/* "1.5" cores or "1500m" -> milli-CPU */
static bool parse_cpu(const char *s, uint64_t *milli)
{
    size_t n = strlen(s);
    if (n > 1 && s[n - 1] == 'm') {
        char buf[64];
        if (n >= sizeof buf)
            return false;
        memcpy(buf, s, n - 1);
        buf[n - 1] = '\0';
        return parse_u64(buf, milli);
    }
    char *end;
    double v = strtod(s, &end);
    if (*end != '\0' || v < 0 || v > 1000)
        return false;
    *milli = (uint64_t)(v * 1000.0 + 0.5);
    return true;
}

static void split_commas(char *s, const char **out, size_t max)
{
    size_t n = 0;
    for (char *save = NULL, *t = strtok_r(s, ",", &save); t && n + 1 < max;
         t = strtok_r(NULL, ",", &save))
        out[n++] = t;
    out[n] = NULL;
}

/* --cpu, --memory, --disk, --ttl and --idle into spec; -1 with the reason printed. */
static int create_resource(int ch, const char *arg, dsec_create_spec *spec)
{
    switch (ch) {
    case 'c':
        if (!parse_cpu(arg, &spec->cpu_milli)) {
            fprintf(stderr, "dsec create: --cpu \"%s\": give cores (1.5) or milli-CPU (1500m)\n",
                    arg);
            return -1;
        }
        break;
    case 'm':
        if (!parse_mem(arg, &spec->memory_mb)) {
            fprintf(stderr, "dsec create: --memory \"%s\": give MiB (512) or 512M / 2G\n", arg);
            return -1;
        }
        break;
    case 'D':
        /* 0 would mean "the cell default": say so rather than take it */
        if (!parse_mem(arg, &spec->disk_mb) || spec->disk_mb == 0) {
            fprintf(stderr,
                    "dsec create: --disk \"%s\": give the writable disk's limit in MiB (1024) "
                    "or 1024M / 2G, at least 1; leave --disk out for the cell default\n",
                    arg);
            return -1;
        }
        break;
    case 'T':
    case 'I':
        if (!parse_u64(arg, ch == 'T' ? &spec->ttl_s : &spec->idle_s)) {
            fprintf(stderr, "dsec create: --%s \"%s\": give whole seconds\n",
                    ch == 'T' ? "ttl" : "idle", arg);
            return -1;
        }
        break;
    }
    return 0;
}

int dsec_cli_create(int argc, char **argv)
{
    static const struct option opts[] = {{"type", required_argument, 0, 't'},
                                         {"requires", required_argument, 0, 'R'},
                                         {"env", required_argument, 0, 'e'},
                                         {"cpu", required_argument, 0, 'c'},
                                         {"memory", required_argument, 0, 'm'},
                                         {"disk", required_argument, 0, 'D'},
                                         {"ttl", required_argument, 0, 'T'},
                                         {"idle", required_argument, 0, 'I'},
                                         {"label", required_argument, 0, 'l'},
                                         {"affinity", required_argument, 0, 'a'},
                                         {"cell", required_argument, 0, 'C'},
                                         {"class", required_argument, 0, 'k'},
                                         {"req-id", required_argument, 0, 'r'},
                                         {"rollout", required_argument, 0, 'o'},
                                         {"net", required_argument, 0, 'n'},
                                         {"project", required_argument, 0, 'P'},
                                         {0, 0, 0, 0}};
    const char *use =
        "[--type T] [--requires CAP,...] [--env NAME:VER] [--cpu CORES|Nm] "
        "[--memory MB|NG] [--disk MB|NG] [--ttl S] [--idle S] [--label K=V]... [--affinity K=V]... "
        "[--cell C] [--class rollout|job|batch] [--req-id ID] [--rollout ID] [--net ENTRY]... "
        "[--project P[/SUB]]";
    dsec_create_spec spec = {0};
    const char *req[MAX_ITEMS] = {0}, *labels[MAX_ITEMS] = {0}, *aff[MAX_ITEMS] = {0},
               *net[MAX_ITEMS] = {0};
    size_t nl = 0, na = 0, nn = 0;
    char reqbuf[1024] = "";
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "t:", opts, NULL)) != -1) {
        switch (ch) {
        case 't':
            spec.type = optarg;
            break;
        case 'R':
            snprintf(reqbuf, sizeof reqbuf, "%s", optarg);
            split_commas(reqbuf, req, MAX_ITEMS);
            spec.requires = req;
            break;
        case 'e':
            spec.env = optarg;
            break;
        case 'P':
            spec.project = optarg;
            break;
        case 'c':
        case 'm':
        case 'D':
        case 'T':
        case 'I':
            if (create_resource(ch, optarg, &spec) < 0)
                return 2;
            break;
        case 'l':
            if (nl + 1 < MAX_ITEMS)
                labels[nl++] = optarg;
            spec.labels = labels;
            break;
        case 'a':
            if (na + 1 < MAX_ITEMS)
                aff[na++] = optarg;
            spec.affinity = aff;
            break;
        case 'n':
            if (nn + 1 < MAX_ITEMS)
                net[nn++] = optarg;
            spec.net = net;
            break;
        case 'C':
            spec.cell = optarg;
            break;
        case 'k':
            spec.cls = optarg;
            break;
        case 'r':
            spec.req_id = optarg;
            break;
        case 'o':
            spec.rollout_id = optarg;
            break;
        default:
            return usage("create", use);
        }
    }
    if (optind != argc)
        return usage("create", use);
    dsec_client *c = dsec_cli_connect("create");
    if (c == NULL)
        return 1;
    dsec_sandbox_info info;
    dsec_err err;
    int rc = dsec_create(c, &spec, &info, &err);
    dsec_client_free(c);
    if (rc < 0)
        return dsec_cli_fail("create", &err);
    printf("%s\n", info.id);
    return 0;
}

static void print_output(void *ud, int stream, const uint8_t *data, size_t len)
{
    FILE *f = stream == 2 ? stderr : stdout;
    fwrite(data, 1, len, f);
    fflush(f);
}

/* What `dsec exec` was asked for. */
struct exec_args {
    dsec_exec_opts o;
    bool detach, keep_stdin, tty, with_stdin;
    uint64_t ring;
    const char *env[MAX_ITEMS];
    size_t ne;
    const char *id;
};

/* The options that do not go together, said; -1 when some were given (nargs: the words of the
 * command). */
static int exec_check(const struct exec_args *a, int nargs)
{
    if (!a->detach && (a->ring != 0 || a->keep_stdin)) {
        fprintf(stderr, "dsec exec: --ring and --keep-stdin are for a background process (-d)\n");
        return -1;
    }
    if (a->detach && (a->o.rollout_id != NULL || a->o.step != 0 || a->o.output_max != 0 ||
                      a->o.req_id != NULL)) {
        fprintf(stderr, "dsec exec -d: --rollout, --step, --output-max and --req-id are for a "
                        "command that runs to its answer; a background process keeps its last "
                        "--ring bytes of output instead\n");
        return -1;
    }
    if (a->tty && (a->detach || a->with_stdin || a->o.session != 0 || a->o.rollout_id != NULL ||
                   a->o.req_id != NULL || a->o.output_max != 0 || a->ring != 0)) {
        fprintf(stderr, "dsec exec -it: a terminal takes its input as typed; -d, --stdin, "
                        "--session, --rollout, --req-id, --output-max and --ring do not go "
                        "with it\n");
        return -1;
    }
    if (a->o.session != 0 && (a->detach || a->with_stdin || a->ne > 0 || a->o.cwd != NULL ||
                              a->o.user != NULL || a->o.rollout_id != NULL || nargs != 1)) {
        fprintf(stderr, "dsec exec --session: give one command line (quoted) and no -d, "
                        "--stdin, --env, --cwd, --user or --rollout: it runs in the session's "
                        "shell, with its directory and variables (use cd and export there)\n");
        return -1;
    }
    return 0;
}

/* The options and the sandbox's id, checked; 0, or the exit code for a wrong one (said). */
static int exec_parse(int argc, char **argv, struct exec_args *a)
{
    static const struct option opts[] = {{"timeout", required_argument, 0, 't'},
                                         {"cwd", required_argument, 0, 'w'},
                                         {"env", required_argument, 0, 'e'},
                                         {"user", required_argument, 0, 'u'},
                                         {"stdin", no_argument, 0, 'i'},
                                         {"rollout", required_argument, 0, 'o'},
                                         {"step", required_argument, 0, 's'},
                                         {"output-max", required_argument, 0, 'm'},
                                         {"req-id", required_argument, 0, 'r'},
                                         {"detach", no_argument, 0, 'd'},
                                         {"ring", required_argument, 0, 'R'},
                                         {"keep-stdin", no_argument, 0, 'k'},
                                         {"tty", no_argument, 0, 'T'},
                                         {"session", required_argument, 0, 'S'},
                                         {0, 0, 0, 0}};
    const char *use =
        "ID [--timeout MS] [--cwd DIR] [--env K=V]... [--user U] [--stdin] "
        "[--output-max BYTES] [--rollout ID --step N] [--req-id R] -- CMD [ARG]...\n"
        "       dsec exec -d ID [--ring BYTES] [--keep-stdin] [--timeout MS] [--cwd DIR] "
        "[--env K=V]... [--user U] [--stdin] -- CMD [ARG]...\n"
        "  -d, --detach: run it in the background; prints its handle (dsec ps, attach, kill)\n"
        "       dsec exec -it ID [--env K=V]... [--cwd DIR] [--user U] -- CMD [ARG]...\n"
        "  -it, --tty: run it on a terminal, this one in raw mode (as docker exec -it)\n"
        "       dsec exec --session HANDLE ID [--timeout MS] -- 'COMMAND LINE'\n"
        "  --session: run it in a shell session (dsec session ID); Ctrl-C interrupts it\n"
        "  Without CMD: the environment's default command (an image's Entrypoint and Cmd)";
    *a = (struct exec_args){0};
    int ch;
    optind = 1;
    /* -d may come first, as in docker exec -d */
    if (argc > 1 && strcmp(argv[1], "-d") == 0) {
        a->detach = true;
        optind = 2;
    } else if (argc > 1 && (strcmp(argv[1], "-it") == 0 || strcmp(argv[1], "-ti") == 0)) {
        a->tty = true;
        optind = 2;
    }
    /* options may come before or after the id; "--" ends them */
    for (;;) {
        while ((ch = getopt_long(argc, argv, "+", opts, NULL)) != -1) {
            switch (ch) {
            case 't':
                if (!parse_u64(optarg, &a->o.timeout_ms))
                    return usage("exec", use);
                break;
            case 'w':
                a->o.cwd = optarg;
                break;
            case 'e':
                if (a->ne + 1 < MAX_ITEMS)
                    a->env[a->ne++] = optarg;
                a->o.env = a->env;
                break;
            case 'u':
                a->o.user = optarg;
                break;
            case 'i':
                a->with_stdin = true;
                break;
            case 'o':
                a->o.rollout_id = optarg;
                break;
            case 's':
                if (!parse_u64(optarg, &a->o.step))
                    return usage("exec", use);
                break;
            case 'm':
                if (!parse_u64(optarg, &a->o.output_max))
                    return usage("exec", use);
                break;
            case 'r':
                a->o.req_id = optarg;
                break;
            case 'd':
                a->detach = true;
                break;
            case 'k':
                a->keep_stdin = true;
                break;
            case 'T':
                a->tty = true;
                break;
            case 'S':
                if (!parse_u64(optarg, &a->o.session) || a->o.session == 0)
                    return usage("exec", use);
                break;
            case 'R':
                if (!parse_u64(optarg, &a->ring))
                    return usage("exec", use);
                break;
            default:
                return usage("exec", use);
            }
        }
        if (optind >= argc) {
            if (a->id != NULL) /* no command: the environment's default one */
                break;
            return usage("exec", use);
        }
        if (strcmp(argv[optind - 1], "--") == 0 || a->id != NULL)
            break;
        a->id = argv[optind++];
    }
    if (a->id == NULL)
        return usage("exec", use);
    if (exec_check(a, argc - optind) < 0)
        return 2;
    a->o.argv = (const char *const *)&argv[optind];
    return 0;
}

/* All of stdin (at most 8 MiB) into *data (the caller's to free with dsec_free); 0, or the
 * exit code. */
static int read_stdin(char **data, size_t *len)
{
    char *in = NULL;
    size_t inlen = 0;
    size_t cap = 0;
    for (;;) {
        if (inlen == cap) {
            cap = cap ? cap * 2 : 65536;
            if (cap > (8u << 20)) {
                fprintf(stderr, "dsec exec: stdin larger than 8 MiB\n");
                dsec_free(in);
                return 2;
            }
            char *ni = dsec_realloc(in, cap);
            if (ni == NULL) {
                dsec_free(in);
                return 1;
            }
            in = ni;
        }
        size_t r = fread(in + inlen, 1, cap - inlen, stdin);
        inlen += r;
        if (r == 0)
            break;
    }
    *data = in;
    *len = inlen;
    return 0;
}

/* -d: the command started in the background; its handle is printed. */
static int exec_detached(dsec_client *c, const struct exec_args *a)
{
    dsec_err err;
    dsec_proc_opts po = {.argv = a->o.argv,
                         .env = a->o.env,
                         .cwd = a->o.cwd,
                         .user = a->o.user,
                         .timeout_ms = a->o.timeout_ms,
                         .ring_max = a->ring,
                         .keep_stdin = a->keep_stdin,
                         .stdin_data = a->o.stdin_data,
                         .stdin_len = a->o.stdin_len};
    dsec_proc p;
    int rc = dsec_proc_start(c, a->id, &po, &p, &err);
    if (rc < 0)
        return dsec_cli_fail("exec", &err);
    printf("%" PRIu64 "\n", p.handle);
    return 0;
}

/* What the command's answer says besides its output, and its exit code. */
static int exec_answered(dsec_exec_reply *r)
{
    if (r->out_truncated)
        fprintf(stderr, "dsec exec: stdout was truncated\n");
    if (r->err_truncated)
        fprintf(stderr, "dsec exec: stderr was truncated\n");
    if (r->timed_out)
        fprintf(stderr, "dsec exec: timed out\n");
    if (r->interrupted)
        fprintf(stderr, "dsec exec: interrupted\n");
    if (r->session_ended)
        fprintf(stderr, "dsec exec: the session has ended\n");
    int code = r->signal ? 128 + r->signal : r->exit_code;
    dsec_exec_reply_release(r);
    fflush(stdout);
    return code;
}

int dsec_cli_exec(int argc, char **argv)
{
    struct exec_args a;
    int prc = exec_parse(argc, argv, &a);
    if (prc != 0)
        return prc;
    char *in = NULL;
    size_t inlen = 0;
    if (a.with_stdin) {
        int src = read_stdin(&in, &inlen);
        if (src != 0)
            return src;
        a.o.stdin_data = in;
        a.o.stdin_len = inlen;
    }
    dsec_exec_opts o = a.o;
    const char *id = a.id;
    dsec_client *c = dsec_cli_connect("exec");
    if (c == NULL) {
        dsec_free(in);
        return 1;
    }
    dsec_err err;
    if (a.detach) {
        int code = exec_detached(c, &a);
        dsec_client_free(c);
        dsec_free(in);
        return code;
    }
    if (a.tty) {
        dsec_proc_opts po = {
            .argv = o.argv, .env = o.env, .cwd = o.cwd, .user = o.user, .timeout_ms = o.timeout_ms};
        int code = dsec_cli_tty(c, id, &po);
        dsec_client_free(c);
        return code;
    }
    dsec_exec_reply r;
    void *guard = o.session != 0 ? dsec_cli_session_guard(c, id, o.session) : NULL;
    /* output shows as the command writes it */
    int rc = dsec_exec_stream(c, id, &o, print_output, NULL, &r, &err);
    dsec_cli_session_guard_end(guard);
    dsec_client_free(c);
    dsec_free(in);
    if (rc < 0)
        return dsec_cli_fail("exec", &err);
    return exec_answered(&r);
}

/* "ID:/path" -> id, path; local paths have no ':' before the first '/'. */
static bool remote(char *s, char **id, char **path)
{
    char *colon = strchr(s, ':');
    char *slash = strchr(s, '/');
    if (colon == NULL || (slash && slash < colon))
        return false;
    *colon = '\0';
    *id = s;
    *path = colon + 1;
    return true;
}

/* Local file (or stdin) to the sandbox as an upload: any size, never held whole, the file
 * replaced at once when all of it arrived and its sha256 matched. A failure keeps what arrived
 * for a while: the message names the upload id that --resume goes on with. */
static int cp_up(dsec_client *c, const char *local, const char *id, const char *path,
                 const char *resume, bool verbose)
{
    int fd = strcmp(local, "-") == 0 ? 0 : open(local, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        fprintf(stderr, "dsec cp: %s: %s\n", local, strerror(errno));
        return 1;
    }
    dsec_upload_opts o = {.mode = 0644, .upload_id = resume, .resume = resume != NULL};
    dsec_transfer_result res;
    dsec_err err;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = 0;
    if (dsec_file_upload_fd(c, id, path, &o, fd, &res, &err) < 0) {
        if (err.code != DSEC_E_INVALID || resume != NULL)
            dsec_err_wrap(&err, "to go on: dsec cp --resume %s %s %s:%s", res.upload_id, local, id,
                          path);
        rc = dsec_cli_fail("cp", &err);
    } else if (verbose) {
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
        fprintf(stderr, "%" PRIu64 " bytes (%" PRIu64 " resumed) sha256 %s in %.3f s, %.1f MB/s\n",
                res.size, res.resumed_from, res.sha256, s, s > 0 ? (double)res.size / s / 1e6 : 0);
    }
    if (fd != 0)
        close(fd);
    return rc;
}

static int page_out(void *ud, const uint8_t *data, size_t len, uint64_t size)
{
    return len == 0 || fwrite(data, 1, len, ud) == len ? 0 : -1;
}

/* The sandbox's file to stdout, or to a local file that appears whole or not
 * at all (written beside it under a temporary name, then renamed), or into a
 * device or FIFO as it comes. */
static int cp_down(dsec_client *c, const char *id, const char *path, const char *local)
{
    dsec_err err;
    if (strcmp(local, "-") == 0) {
        if (dsec_file_read_pages(c, id, path, page_out, stdout, &err) < 0)
            return dsec_cli_fail("cp", &err);
        if (fflush(stdout) != 0) {
            fprintf(stderr, "dsec cp: writing to stdout: %s\n", strerror(errno));
            return 1;
        }
        return 0;
    }
    /* A device or a FIFO (/dev/null, a pipe) is written in place: renaming a
     * temporary file over it would replace it. */
    struct stat st;
    if (stat(local, &st) == 0 && !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
        FILE *f = fopen(local, "wb");
        if (f == NULL) {
            fprintf(stderr, "dsec cp: %s: %s\n", local, strerror(errno));
            return 1;
        }
        int rc = dsec_file_read_pages(c, id, path, page_out, f, &err) < 0
                     ? dsec_cli_fail("cp", &err)
                     : 0;
        if (fclose(f) != 0 && rc == 0) {
            fprintf(stderr, "dsec cp: writing %s: %s\n", local, strerror(errno));
            rc = 1;
        }
        return rc;
    }
    size_t n = strlen(local);
    char *tmp = dsec_malloc(n + 16);
    if (tmp == NULL) {
        fprintf(stderr, "dsec cp: out of memory\n");
        return 1;
    }
    snprintf(tmp, n + 16, "%s.dsec-XXXXXX", local);
    int fd = mkstemp(tmp);
    FILE *f = fd < 0 ? NULL : fdopen(fd, "wb");
    if (f == NULL) {
        fprintf(stderr, "dsec cp: %s: %s\n", local, strerror(errno));
        if (fd >= 0) {
            close(fd);
            unlink(tmp);
        }
        dsec_free(tmp);
        return 1;
    }
    mode_t um = umask(0);
    umask(um);
    int rc = 0;
    if (dsec_file_read_pages(c, id, path, page_out, f, &err) < 0)
        rc = dsec_cli_fail("cp", &err);
    else if (fchmod(fd, 0666 & ~um) != 0 || fflush(f) != 0 || ferror(f)) {
        fprintf(stderr, "dsec cp: writing %s: %s\n", local, strerror(errno));
        rc = 1;
    }
    if (fclose(f) != 0 && rc == 0) {
        fprintf(stderr, "dsec cp: writing %s: %s\n", local, strerror(errno));
        rc = 1;
    }
    if (rc == 0 && rename(tmp, local) != 0) {
        fprintf(stderr, "dsec cp: %s: %s\n", local, strerror(errno));
        rc = 1;
    }
    if (rc != 0)
        unlink(tmp);
    dsec_free(tmp);
    return rc;
}

int dsec_cli_cp(int argc, char **argv)
{
    const char *use = "[-v] [--resume UPLOAD_ID] LOCAL ID:/PATH | [-v] ID:/PATH LOCAL   (LOCAL "
                      "may be - for stdin/stdout; --resume goes on with a failed upload; -v "
                      "prints size, sha256, rate)\n"
                      "       dsec cp -r DIR ID:/PATH | -r ID:/PATH DIR   (a directory tree: "
                      "PATH or DIR becomes a copy, made when missing, merged into when there; "
                      "each file checked; links skipped)";
    static const struct option opts[] = {{"resume", required_argument, 0, 'R'},
                                         {"verbose", no_argument, 0, 'v'},
                                         {"recursive", no_argument, 0, 'r'},
                                         {0, 0, 0, 0}};
    const char *resume = NULL;
    bool verbose = false, recursive = false;
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "+vr", opts, NULL)) != -1) {
        if (ch == 'R')
            resume = optarg;
        else if (ch == 'r')
            recursive = true;
        else if (ch == 'v')
            verbose = true;
        else
            return usage("cp", use);
    }
    argc -= optind - 1;
    argv += optind - 1;
    if (argc != 3)
        return usage("cp", use);
    char *id, *path;
    bool up = remote(argv[2], &id, &path);
    if (!up && !remote(argv[1], &id, &path))
        return usage("cp", use);
    if ((!up || recursive) && resume != NULL)
        return usage("cp", use);
    if (recursive && (strcmp(argv[1], "-") == 0 || strcmp(argv[2], "-") == 0))
        return usage("cp", use);
    dsec_client *c = dsec_cli_connect("cp");
    if (c == NULL)
        return 1;
    if (recursive) {
        int rc = up ? dsec_cli_cp_dir_up(c, argv[1], id, path)
                    : dsec_cli_cp_dir_down(c, id, path, argv[2]);
        dsec_client_free(c);
        return rc;
    }
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = up ? cp_up(c, argv[1], id, path, resume, verbose) : cp_down(c, id, path, argv[2]);
    if (!up && rc == 0 && verbose) {
        clock_gettime(CLOCK_MONOTONIC, &t1);
        double s = (double)(t1.tv_sec - t0.tv_sec) + (double)(t1.tv_nsec - t0.tv_nsec) / 1e9;
        fprintf(stderr, "read %s:%s in %.3f s (sha256 checked)\n", id, path, s);
    }
    dsec_client_free(c);
    return rc;
}

int dsec_cli_ls(int argc, char **argv)
{
    if (argc < 2 || argc > 3)
        return usage("ls", "ID [PATH]");
    dsec_client *c = dsec_cli_connect("ls");
    if (c == NULL)
        return 1;
    dsec_dirent *e;
    size_t n;
    dsec_err err;
    int rc = dsec_file_list(c, argv[1], argc == 3 ? argv[2] : "/", &e, &n, &err);
    dsec_client_free(c);
    if (rc < 0)
        return dsec_cli_fail("ls", &err);
    for (size_t i = 0; i < n; i++)
        printf("%-5s %04" PRIo64 " %10" PRIu64 " %s\n", e[i].kind, e[i].mode & 07777, e[i].size,
               e[i].name);
    dsec_dirents_free(e, n);
    return 0;
}

int dsec_cli_fork(int argc, char **argv)
{
    const char *use = "ID [-n N]";
    uint64_t n = 1;
    int ch;
    optind = 1;
    while ((ch = getopt(argc, argv, "n:")) != -1) {
        if (ch != 'n' || !parse_u64(optarg, &n) || n == 0 || n > 1024)
            return usage("fork", use);
    }
    if (optind + 1 != argc)
        return usage("fork", use);
    dsec_client *c = dsec_cli_connect("fork");
    if (c == NULL)
        return 1;
    char **ids;
    size_t nids;
    dsec_err err;
    int rc = dsec_fork(c, argv[optind], (unsigned)n, &ids, &nids, &err);
    dsec_client_free(c);
    if (rc < 0)
        return dsec_cli_fail("fork", &err);
    for (size_t i = 0; i < nids; i++)
        printf("%s\n", ids[i]);
    dsec_strv_free(ids, nids);
    return 0;
}

int dsec_cli_snapshot(int argc, char **argv)
{
    const char *use = "ID NAME:VERSION";
    if (argc != 3)
        return usage("snapshot", use);
    dsec_client *c = dsec_cli_connect("snapshot");
    if (c == NULL)
        return 1;
    dsec_err err;
    int rc = dsec_snapshot(c, argv[1], argv[2], &err);
    dsec_client_free(c);
    if (rc < 0)
        return dsec_cli_fail("snapshot", &err);
    printf("%s\n", argv[2]);
    return 0;
}

int dsec_cli_ttl(int argc, char **argv)
{
    const char *use =
        "ID SECONDS\n  the sandbox now ends SECONDS from now (sooner or later than it "
        "would have);\n  prints its id and its new end (UTC)";
    uint64_t secs;
    if (argc != 3)
        return usage("ttl", use);
    if (!parse_u64(argv[2], &secs) || secs == 0) {
        fprintf(stderr,
                "dsec ttl: SECONDS must be a whole number of at least 1, got \"%s\" "
                "(dsec rm ends a sandbox now)\n",
                argv[2]);
        return 2;
    }
    dsec_client *c = dsec_cli_connect("ttl");
    if (c == NULL)
        return 1;
    dsec_err err;
    uint64_t end_ns = 0;
    int rc = dsec_set_ttl(c, argv[1], secs, &end_ns, &err);
    dsec_client_free(c);
    if (rc < 0)
        return dsec_cli_fail("ttl", &err);
    time_t end = (time_t)(end_ns / 1000000000ull);
    struct tm tm;
    char when[32];
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&end, &tm));
    printf("%s\tends %s\n", argv[1], when);
    return 0;
}

int dsec_cli_simple_op(int argc, char **argv)
{
    const char *cmd = argv[0];
    if (argc < 2)
        return usage(cmd, "ID...");
    dsec_client *c = dsec_cli_connect(cmd);
    if (c == NULL)
        return 1;
    int status = 0;
    for (int i = 1; i < argc; i++) {
        dsec_err err;
        int rc;
        if (strcmp(cmd, "pause") == 0) {
            rc = dsec_pause(c, argv[i], &err);
        } else if (strcmp(cmd, "resume") == 0) {
            rc = dsec_resume(c, argv[i], &err);
        } else if (strcmp(cmd, "rm") == 0) {
            rc = dsec_destroy(c, argv[i], &err);
        } else {
            dsec_sandbox_info info;
            rc = dsec_status(c, argv[i], &info, &err);
            if (rc == 0)
                printf("%s\t%s\t%s\t%s\n", info.id, info.type, info.state, info.node);
        }
        if (rc < 0)
            status = dsec_cli_fail(cmd, &err);
        else if (strcmp(cmd, "status") != 0)
            printf("%s\n", argv[i]);
    }
    dsec_client_free(c);
    return status;
}
