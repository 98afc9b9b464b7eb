/* call.c - `dsec call`: run one task in a fresh function sandbox (created, used once, destroyed).
 */
#include "tools/cli.h"

#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "dsec/alloc.h"
#include "dsec/client.h"

#define MAX_ITEMS 64
#define INPUT_MAX (8u << 20)

static int usage(void)
{
    fprintf(stderr,
            "usage: dsec call [--runtime python3|sh|native] [--timeout MS] [--cpu-ms MS] [--memory "
            "MB]\n"
            "                 [--file LOCAL[:/work/PATH]]... [--env K=V]... [--stdin] [--cell C]\n"
            "                 [--environment NAME:VERSION] [--output-max BYTES] [--net ENTRY]...\n"
            "                 -- CMD [ARG]...\n"
            "examples:\n"
            "  dsec call -- python3 -c 'print(6 * 7)'\n"
            "  dsec call --file solve.py --stdin -- python3 solve.py < input.txt\n"
            "  dsec call --runtime sh -- sh -c 'echo $((1 + 2))'\n"
            "  dsec call --runtime sh --environment busybox:1 -- sh -c 'cat /etc/passwd'\n"
            "  dsec call --runtime native --file ./a.out:/work/a.out -- /work/a.out\n"
            "  dsec call -- python3 --call add -c 'def add(a, b): return a + b' 2 3\n"
            "  dsec call --net pypi.org --net files.pythonhosted.org -- python3 fetch.py\n"
            "--net ENTRY: a network policy entry (docs/network.md); without one the call\n"
            "reaches nothing.\n");
    return 2;
}

static bool parse_u64(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (s[0] < '0' || s[0] > '9' || *end != '\0' || errno != 0)
        return false;
    *out = v;
    return true;
}

/* Read all of f (at most INPUT_MAX); *data is dsec_malloc'd. */
static int slurp(FILE *f, const char *name, char **data, size_t *len)
{
    size_t cap = 65536, n = 0;
    char *buf = dsec_malloc(cap);
    while (buf != NULL) {
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0)
            break;
        if (n == cap) {
            if (cap >= INPUT_MAX) {
                fprintf(stderr, "dsec call: %s is larger than %u MiB\n", name, INPUT_MAX >> 20);
                dsec_free(buf);
                return -1;
            }
            char *nb = dsec_realloc(buf, cap * 2);
            if (nb == NULL)
                dsec_free(buf);
            buf = nb;
            cap *= 2;
        }
    }
    if (buf == NULL) {
        fprintf(stderr, "dsec call: out of memory reading %s\n", name);
        return -1;
    }
    *data = buf;
    *len = n;
    return 0;
}

/* One --file LOCAL[:/work/PATH] read into file; its bytes (*blob) and target path (*path) are
 * the caller's to free, also when it fails. */
static int load_file(const char *file_arg, dsec_call_file *file, char **blob, char **path)
{
    /* without a target, /work/<basename> */
    char *arg = dsec_strdup(file_arg);
    char *colon = arg ? strstr(arg, ":/") : NULL;
    if (arg == NULL)
        return -1;
    const char *local = arg, *target = NULL;
    if (colon != NULL) {
        *colon = '\0';
        target = colon + 1;
    }
    const char *base = strrchr(local, '/') ? strrchr(local, '/') + 1 : local;
    size_t plen = target ? strlen(target) + 1 : strlen(base) + 7;
    *path = dsec_malloc(plen);
    if (*path != NULL)
        snprintf(*path, plen, target ? "%s" : "/work/%s", target ? target : base);
    FILE *f = fopen(local, "rb");
    if (f == NULL || *path == NULL) {
        fprintf(stderr, "dsec call: %s: %s\n", local, f ? "out of memory" : strerror(errno));
        if (f)
            fclose(f);
        dsec_free(arg);
        return -1;
    }
    size_t len;
    int r = slurp(f, local, blob, &len);
    fclose(f);
    /* keep the executable bit of programs */
    *file = (dsec_call_file){
        .path = *path, .data = *blob, .len = len, .mode = access(local, X_OK) == 0 ? 0755 : 0644};
    dsec_free(arg);
    return r < 0 ? -1 : 0;
}

/* The call made and its answer shown: its output, and its exit code returned. */
static int run_call(const dsec_call_spec *spec)
{
    dsec_client *c = NULL;
    dsec_err err;
    /* The call may take its whole timeout: wait a little longer than that. */
    dsec_client_opts co = {.timeout_ms =
                               (int)(spec->timeout_ms ? spec->timeout_ms + 5000 : 630000)};
    if (dsec_client_connect(&c, &co, &err) < 0) {
        fprintf(stderr, "dsec call: cannot reach the bus at %s: %s\n",
                getenv("DSEC_URL") ? getenv("DSEC_URL") : "nats://127.0.0.1:4222", err.msg);
        return 1;
    }
    dsec_exec_reply r;
    int crc = dsec_call(c, spec, &r, &err);
    dsec_client_free(c);
    if (crc < 0) {
        fprintf(stderr, "dsec call: %s (%s%s)\n", err.msg, dsec_code_name(err.code),
                dsec_code_retry_safe(err.code) ? ", safe to retry" : "");
        return err.code == DSEC_E_INVALID ? 2 : 1;
    }
    fwrite(r.out, 1, r.out_len, stdout);
    fwrite(r.err_out, 1, r.err_len, stderr);
    if (r.out_truncated)
        fprintf(stderr, "dsec call: stdout was truncated\n");
    if (r.err_truncated)
        fprintf(stderr, "dsec call: stderr was truncated\n");
    if (r.timed_out)
        fprintf(stderr, "dsec call: timed out\n");
    int rc = r.signal ? 128 + r.signal : r.exit_code;
    dsec_exec_reply_release(&r);
    fflush(stdout);
    return rc;
}

int dsec_cli_call(int argc, char **argv)
{
    static const struct option opts[] = {{"runtime", required_argument, 0, 'r'},
                                         {"timeout", required_argument, 0, 't'},
                                         {"cpu-ms", required_argument, 0, 'c'},
                                         {"memory", required_argument, 0, 'm'},
                                         {"file", required_argument, 0, 'f'},
                                         {"env", required_argument, 0, 'e'},
                                         {"stdin", no_argument, 0, 'i'},
                                         {"cell", required_argument, 0, 'C'},
                                         {"environment", required_argument, 0, 'E'},
                                         {"output-max", required_argument, 0, 'o'},
                                         {"net", required_argument, 0, 'n'},
                                         {"help", no_argument, 0, 'h'},
                                         {0, 0, 0, 0}};
    dsec_call_spec spec = {0};
    const char *env[MAX_ITEMS] = {0}, *net[MAX_ITEMS] = {0};
    const char *file_args[MAX_ITEMS];
    size_t ne = 0, nf = 0, nn = 0;
    bool with_stdin = false;
    int ch, rc = 1;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "+", opts, NULL)) != -1) {
        switch (ch) {
        case 'r':
            spec.runtime = optarg;
            break;
        case 't':
            if (!parse_u64(optarg, &spec.timeout_ms))
                return usage();
            break;
        case 'c':
            if (!parse_u64(optarg, &spec.cpu_ms))
                return usage();
            break;
        case 'm':
            if (!parse_u64(optarg, &spec.memory_mb))
                return usage();
            break;
        case 'f':
            if (nf == MAX_ITEMS)
                return usage();
            file_args[nf++] = optarg;
            break;
        case 'e':
            if (ne + 1 == MAX_ITEMS)
                return usage();
            env[ne++] = optarg;
            break;
        case 'i':
            with_stdin = true;
            break;
        case 'C':
            spec.cell = optarg;
            break;
        case 'E':
            spec.environment = optarg;
            break;
        case 'o':
            if (!parse_u64(optarg, &spec.output_max))
                return usage();
            break;
        case 'n':
            if (nn + 1 == MAX_ITEMS) {
                fprintf(stderr, "dsec call: at most %d --net entries\n", MAX_ITEMS - 1);
                return 2;
            }
            net[nn++] = optarg;
            break;
        case 'h':
            usage();
            return 0;
        default:
            return usage();
        }
    }
    if (optind >= argc)
        return usage();
    spec.argv = (const char *const *)&argv[optind];
    spec.env = ne ? env : NULL;
    spec.net = nn ? net : NULL;

    dsec_call_file files[MAX_ITEMS];
    char *blobs[MAX_ITEMS] = {0}, *paths[MAX_ITEMS] = {0}, *in = NULL;
    for (size_t i = 0; i < nf; i++) {
        if (load_file(file_args[i], &files[i], &blobs[i], &paths[i]) < 0)
            goto out;
    }
    spec.files = files;
    spec.nfiles = nf;
    size_t inlen = 0;
    if (with_stdin) {
        if (slurp(stdin, "stdin", &in, &inlen) < 0)
            goto out;
        spec.stdin_data = in;
        spec.stdin_len = inlen;
    }

    rc = run_call(&spec);

out:
    for (size_t i = 0; i < nf; i++) {
        dsec_free(blobs[i]);
        dsec_free(paths[i]);
    }
    dsec_free(in);
    return rc;
}
