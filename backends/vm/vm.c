/* vm.c - the microvm and vm sandbox backends: their ops tables and the life of a sandbox (boot,
 * exec and files through the agent, snapshot, restore, fork, pause, stats, adopt, destroy). */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "backends/vm/vm-int.h"
#include "dsec/alloc.h"

#include "backends/vm/vm-publish.h"

#ifndef DSEC_VMKIT_DIR
#define DSEC_VMKIT_DIR ""
#endif

/*
 * A sandbox's life: resolve its environment to layers; hold each in the
 * layer cache and make (once per node) its EROFS image; make the writable
 * ext4 disk holding /dsec/conf for the guest's init; attach its network
 * (a namespace, and a tap there that QEMU's NIC uses); start QEMU detached
 * with RAM in a file; wait for the agent. Snapshots stop the guest, save
 * the device state with a migration into a file, copy RAM file and disk,
 * and let it go on. Clones (restore, fork, resume of a clone) start QEMU on
 * the snapshot's RAM file mapped copy-on-write and load the state. Teardown
 * undoes what was done, in reverse, so a failed create and destroy share it.
 */

#define MEM_MB_MIN 128
#define MEM_MB_MAX (UINT64_C(1) << 20)
#define DISK_MB_DEFAULT 1024
#define DISK_MB_MAX (UINT64_C(1) << 24)
#define QMP_TIMEOUT_MS 10000
#define STOP_GRACE_MS 3000


int dsec__vm_fmt(char *out, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, len, fmt, ap);
    va_end(ap);
    return n;
}

char *dsec__vm_read_file(const char *path, size_t max)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    char *buf = dsec_malloc(max + 1);
    size_t got = 0;
    ssize_t n = 0;
    while (buf != NULL && got < max && (n = read(fd, buf + got, max - got)) != 0) {
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            break;
        got += (size_t)n;
    }
    int e = errno;
    close(fd);
    if (buf == NULL || n < 0) {
        dsec_free(buf);
        errno = n < 0 ? e : ENOMEM;
        return NULL;
    }
    buf[got] = '\0';
    return buf;
}

void dsec__vm_log_tail(const char *path, char *out, size_t len)
{
    out[0] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    char buf[2048];
    off_t end = lseek(fd, 0, SEEK_END);
    off_t from = end > (off_t)sizeof buf - 1 ? end - (off_t)sizeof buf + 1 : 0;
    ssize_t n = pread(fd, buf, sizeof buf - 1, from);
    close(fd);
    if (n <= 0)
        return;
    buf[n] = '\0';
    /* a "dsec-init: ... failed" line says it all: prefer it to the tail */
    char *why = strstr(buf, "dsec-init: ");
    char *s = why != NULL ? why : buf;
    if (why == NULL) {
        /* the last three non-empty lines */
        int lines = 0;
        for (char *p = buf + n - 1; p > buf; p--)
            if (*p == '\n' && p[1] != '\0' && p[1] != '\n' && ++lines == 3) {
                s = p + 1;
                break;
            }
    }
    size_t o = 0;
    for (; *s && o + 4 < len; s++) {
        if (*s == '\r')
            continue;
        if (*s == '\n') {
            if (s[1] != '\0' && o > 0)
                o += (size_t)dsec__vm_fmt(out + o, len - o, " | ");
            continue;
        }
        out[o++] = (unsigned char)*s < 0x20 ? ' ' : *s;
    }
    out[o < len ? o : len - 1] = '\0';
}

static int oom(const struct vm_backend *be, dsec_err *err, const char *what)
{
    return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "%s: %s", be->type, what);
}

/* ---- environments ----------------------------------------------------------------------- */

static void env_clear(struct vm_env *e)
{
    dsec_free(e->name);
    for (size_t i = 0; i < e->nlayers; i++)
        dsec_free(e->layers[i].dir);
    dsec_free(e->layers);
    for (size_t i = 0; i < e->nvars; i++)
        dsec_free(e->vars[i]);
    dsec_free(e->vars);
    dsec_free(e->workdir);
    dsec_free(e->user);
    for (size_t i = 0; i < e->ncmd; i++)
        dsec_free(e->cmd[i]);
    dsec_free(e->cmd);
    memset(e, 0, sizeof *e);
}

static int set_str(char **dst, const char *s)
{
    dsec_free(*dst);
    *dst = s ? dsec_strdup(s) : NULL;
    return s != NULL && *dst == NULL ? -1 : 0;
}

static int add_layer(const struct vm_backend *be, struct vm_env *e, const char *digest,
                     dsec_err *err)
{
    if (digest == NULL || !dsec_digest_valid(digest))
        return dsec_err_set(err, DSEC_E_INVALID, 0, "%s: \"%.80s\" is not a layer digest", be->type,
                            digest ? digest : "(null)");
    struct vm_layer *l = dsec_realloc(e->layers, (e->nlayers + 1) * sizeof *l);
    if (l == NULL)
        return oom(be, err, "layer list");
    e->layers = l;
    memset(&l[e->nlayers], 0, sizeof *l);
    dsec__vm_fmt(l[e->nlayers].digest, sizeof l->digest, "%s", digest);
    e->nlayers++;
    return 0;
}

static int add_var(const struct vm_backend *be, struct vm_env *e, const char *kv, dsec_err *err)
{
    if (strchr(kv, '=') == NULL || kv[0] == '=' || strchr(kv, '\n') != NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "%s: environment variable \"%.80s\" is not KEY=VALUE on one line",
                            be->type, kv);
    char **v = dsec_realloc(e->vars, (e->nvars + 1) * sizeof *v);
    if (v == NULL)
        return oom(be, err, "environment variables");
    e->vars = v;
    if ((v[e->nvars] = dsec_strdup(kv)) == NULL)
        return oom(be, err, "environment variables");
    e->nvars++;
    return 0;
}

static int add_cmd(const struct vm_backend *be, struct vm_env *e, const char *arg, dsec_err *err)
{
    char **v = dsec_realloc(e->cmd, (e->ncmd + 1) * sizeof *v);
    if (v == NULL)
        return oom(be, err, "default command");
    e->cmd = v;
    if ((v[e->ncmd] = dsec_strdup(arg)) == NULL)
        return oom(be, err, "default command");
    e->ncmd++;
    return 0;
}

static int env_from_spec(struct vm_backend *be, const dsec_sandbox_spec *spec, struct vm_env *out,
                         dsec_err *err)
{
    memset(out, 0, sizeof *out);
    int rc = 0;
    if (spec->env != NULL && spec->env[0] != '\0') {
        if (be->reg == NULL)
            return dsec_err_set(err, DSEC_E_CONFIG, 0,
                                "%s: the node has no layer registry to find environment %s in",
                                be->type, spec->env);
        dsec_env *d = NULL;
        if (dsec_layer_registry_env_get(be->reg, spec->env, &d, err) < 0)
            return dsec_err_wrap(err, "%s: environment %s", be->type, spec->env);
        if (set_str(&out->name, d->name) < 0 ||
            set_str(&out->workdir, d->workdir ? d->workdir : "/") < 0 ||
            set_str(&out->user, d->user ? d->user : "root") < 0)
            rc = oom(be, err, "environment");
        for (size_t i = 0; rc == 0 && i < d->nlayers; i++)
            rc = add_layer(be, out, d->layers[i], err);
        for (size_t i = 0; rc == 0 && i < d->nvars; i++)
            rc = add_var(be, out, d->vars[i], err);
        for (size_t i = 0; rc == 0 && i < d->ncmd; i++)
            rc = add_cmd(be, out, d->cmd[i], err);
        out->nentry = d->nentry <= d->ncmd ? d->nentry : 0;
        dsec_env_free(d);
    } else {
        /* no layers at all is allowed: the guest's root is then the initrd's busybox */
        for (size_t i = 0; rc == 0 && i < spec->nlayers; i++)
            rc = add_layer(be, out, spec->layers[i], err);
        if (rc == 0 && (set_str(&out->workdir, "/") < 0 || set_str(&out->user, "root") < 0))
            rc = oom(be, err, "environment");
    }
    if (rc < 0)
        env_clear(out);
    return rc;
}

/* ---- text records: the sandbox's meta and a snapshot's meta --------------------------------- */

static void put_esc(FILE *f, const char *key, const char *v)
{
    fprintf(f, "%s ", key);
    for (const char *c = v ? v : "-"; *c; c++) {
        if (*c == '\n')
            fputs("\\n", f);
        else if (*c == '\\')
            fputs("\\\\", f);
        else
            fputc(*c, f);
    }
    fputc('\n', f);
}

static void unesc(char *s)
{
    char *w = s;
    for (char *r = s; *r; r++) {
        if (*r == '\\' && (r[1] == 'n' || r[1] == '\\')) {
            *w++ = r[1] == 'n' ? '\n' : '\\';
            r++;
        } else {
            *w++ = *r;
        }
    }
    *w = '\0';
}

static void put_env(FILE *f, const struct vm_env *e)
{
    put_esc(f, "env", e->name);
    put_esc(f, "workdir", e->workdir);
    put_esc(f, "user", e->user);
    for (size_t i = 0; i < e->nvars; i++)
        put_esc(f, "var", e->vars[i]);
    for (size_t i = 0; i < e->ncmd; i++) /* an empty argument is a line "cmd " */
        put_esc(f, "cmd", e->cmd[i]);
    if (e->nentry > 0)
        fprintf(f, "entry %zu\n", e->nentry);
    /* with the image each layer's guest reads, when known: a snapshot's guest
     * must find the same bytes wherever it is restored */
    for (size_t i = 0; i < e->nlayers; i++) {
        const struct vm_layer *l = &e->layers[i];
        const char *img = l->image[0] != '\0' ? l->image : l->want;
        fprintf(f, "layer %s%s%s\n", l->digest, img[0] != '\0' ? " " : "", img);
    }
}

/* The machine fields both records share. */
static void put_machine(FILE *f, const struct vm_backend *be, const dsec_sandbox *sb)
{
    fprintf(f,
            "type %s\nmem_mb %" PRIu64 "\nsmp %u\ndisk_mb %" PRIu64 "\ncpu_milli %" PRIu64
            "\nnic %d\n",
            be->type, sb->mem_mb, sb->smp, sb->disk_mb, sb->cpu_milli, sb->nic ? 1 : 0);
    put_env(f, &sb->env);
}

struct rec {
    const struct vm_backend *be;
    dsec_sandbox *sb;
    char type[16];
};

static int rec_line(struct rec *r, const char *key, char *val, dsec_err *err)
{
    dsec_sandbox *sb = r->sb;
    struct vm_env *e = &sb->env;
    bool dash = strcmp(val, "-") == 0;
    int rc = 0;
    if (strcmp(key, "env") == 0)
        rc = set_str(&e->name, dash ? NULL : val);
    else if (strcmp(key, "workdir") == 0)
        rc = set_str(&e->workdir, val);
    else if (strcmp(key, "user") == 0)
        rc = set_str(&e->user, val);
    else if (strcmp(key, "var") == 0)
        return add_var(r->be, e, val, err);
    else if (strcmp(key, "cmd") == 0)
        return add_cmd(r->be, e, val, err);
    else if (strcmp(key, "entry") == 0)
        e->nentry = strtoull(val, NULL, 10);
    else if (strcmp(key, "layer") == 0) {
        /* "DIGEST [IMAGE-DIGEST]" */
        char *img = strchr(val, ' ');
        if (img != NULL)
            *img++ = '\0';
        if (add_layer(r->be, e, val, err) < 0)
            return -1;
        if (img != NULL) {
            if (!dsec_digest_valid(img))
                return dsec_err_set(err, DSEC_E_DECODE, 0,
                                    "%s: layer %s names image \"%.80s\", not a digest",
                                    r->be->type, val, img);
            dsec__vm_fmt(e->layers[e->nlayers - 1].want, sizeof(dsec_digest), "%s", img);
        }
        return 0;
    }
    else if (strcmp(key, "type") == 0)
        dsec__vm_fmt(r->type, sizeof r->type, "%s", val);
    else if (strcmp(key, "mem_mb") == 0)
        sb->mem_mb = strtoull(val, NULL, 10);
    else if (strcmp(key, "smp") == 0)
        sb->smp = (unsigned)strtoul(val, NULL, 10);
    else if (strcmp(key, "disk_mb") == 0)
        sb->disk_mb = strtoull(val, NULL, 10);
    else if (strcmp(key, "cpu_milli") == 0)
        sb->cpu_milli = strtoull(val, NULL, 10);
    else if (strcmp(key, "nic") == 0)
        sb->nic = strcmp(val, "1") == 0;
    else if (strcmp(key, "id") == 0) {
        if (dsec_name_ok(val, DSEC_SBX_ID_LEN_MAX) < 0)
            return dsec_err_set(err, DSEC_E_DECODE, 0, "%s: the record names a bad id",
                                r->be->type);
        dsec__vm_fmt(sb->id, sizeof sb->id, "%s", val);
    } else if (strcmp(key, "pid") == 0)
        sb->pid = (pid_t)strtol(val, NULL, 10);
    else if (strcmp(key, "mem_private") == 0)
        sb->mem_private = strcmp(val, "1") == 0;
    else if (strcmp(key, "paused") == 0)
        sb->paused = strcmp(val, "1") == 0;
    else if (strcmp(key, "tenant") == 0)
        rc = set_str(&sb->tenant, dash ? NULL : val);
    else if (strcmp(key, "net_state") == 0)
        rc = set_str(&sb->net_state, val);
    else if (strcmp(key, "net") == 0) {
        char **nv = dsec_realloc(sb->net_entries, (sb->nnet + 1) * sizeof *nv);
        if (nv == NULL)
            return oom(r->be, err, "network policy");
        sb->net_entries = nv;
        if ((nv[sb->nnet] = dsec_strdup(val)) == NULL)
            return oom(r->be, err, "network policy");
        sb->nnet++;
    }
    return rc < 0 ? oom(r->be, err, "record") : 0;
}

/* Read a record file with the given first line into sb. */
static int read_rec(const struct vm_backend *be, const char *path, const char *magic,
                    dsec_sandbox *sb, char *type, size_t typelen, dsec_err *err)
{
    char *text = dsec__vm_read_file(path, 1u << 20);
    if (text == NULL)
        return dsec_err_set(err, errno == ENOENT ? DSEC_E_NOT_FOUND : DSEC_E_IO, errno,
                            "%s: reading %s", be->type, path);
    size_t ml = strlen(magic);
    if (strncmp(text, magic, ml) != 0 || text[ml] != '\n') {
        dsec_free(text);
        return dsec_err_set(err, DSEC_E_DECODE, 0, "%s: %s is not a %s record", be->type, path,
                            magic);
    }
    struct rec r = {.be = be, .sb = sb};
    int rc = 0;
    for (char *save = NULL, *line = strtok_r(text + ml + 1, "\n", &save); rc == 0 && line;
         line = strtok_r(NULL, "\n", &save)) {
        char *sp = strchr(line, ' ');
        if (sp == NULL)
            continue;
        *sp = '\0';
        unesc(sp + 1);
        rc = rec_line(&r, line, sp + 1, err);
    }
    dsec_free(text);
    if (type != NULL)
        dsec__vm_fmt(type, typelen, "%s", r.type);
    return rc;
}

static int write_meta(const struct vm_backend *be, const dsec_sandbox *sb, dsec_err *err)
{
    char path[PATH_MAX + 16], tmp[PATH_MAX + 16];
    dsec__vm_fmt(path, sizeof path, "%s/meta", sb->dir);
    dsec__vm_fmt(tmp, sizeof tmp, "%s/meta.tmp", sb->dir);
    FILE *f = fopen(tmp, "we");
    if (f == NULL)
        return dsec_err_set(err, DSEC_E_IO, errno, "%s: creating %s", be->type, tmp);
    fprintf(f, "dsec-vm 1\n");
    put_esc(f, "id", sb->id);
    fprintf(f, "pid %d\nmem_private %d\npaused %d\n", (int)sb->pid, sb->mem_private ? 1 : 0,
            sb->paused ? 1 : 0);
    put_esc(f, "tenant", sb->tenant);
    if (sb->net != NULL)
        put_esc(f, "net_state", dsec_net_sbx_state(sb->net));
    for (size_t i = 0; i < sb->nnet; i++)
        put_esc(f, "net", sb->net_entries[i]);
    put_machine(f, be, sb);
    if (fclose(f) != 0 || rename(tmp, path) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "%s: writing %s", be->type, path);
    return 0;
}

/* ---- options and the instance -----------------------------------------------------------------
 */

static int opt_u64(const struct vm_backend *be, const char *k, const char *v, uint64_t lo,
                   uint64_t hi, uint64_t *out, dsec_err *err)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || v[0] == '-' || x < lo || x > hi)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "%s option %s=\"%s\": expected an integer in %" PRIu64 "..%" PRIu64,
                            be->type, k, v, lo, hi);
    *out = x;
    return 0;
}

static const char known_opts[] =
    "qemu, vm_kit, vm_mem_mb, vm_tb_mb, vm_boot_timeout_ms, vm_uid_base, layer_cache_gb";

static int parse_opts(struct vm_backend *be, const dsec_backend_config *cfg, char *qemu,
                      size_t qlen, char *kit, size_t klen, uint64_t *cache_gb, dsec_err *err)
{
    char prefix[16];
    int plen = dsec__vm_fmt(prefix, sizeof prefix, "%s.", be->type);
    for (size_t i = 0; i < cfg->nopts; i++) {
        const char *k = cfg->opts[i].key, *v = cfg->opts[i].value;
        if (k == NULL || v == NULL)
            return dsec_err_set(err, DSEC_E_CONFIG, 0, "%s option %zu has no key or value",
                                be->type, i);
        bool mine = strncmp(k, prefix, (size_t)plen) == 0;
        const char *key = mine ? k + plen : k;
        int rc = 0;
        if (strcmp(key, "qemu") == 0)
            dsec__vm_fmt(qemu, qlen, "%s", v);
        else if (strcmp(key, "vm_kit") == 0)
            dsec__vm_fmt(kit, klen, "%s", v);
        else if (strcmp(key, "vm_mem_mb") == 0)
            rc = opt_u64(be, k, v, MEM_MB_MIN, MEM_MB_MAX, &be->mem_mb, err);
        else if (strcmp(key, "vm_tb_mb") == 0)
            rc = opt_u64(be, k, v, 1, 4096, &be->tb_mb, err);
        else if (strcmp(key, "vm_boot_timeout_ms") == 0)
            rc = opt_u64(be, k, v, 1000, 3600000, &be->boot_timeout_ms, err);
        else if (strcmp(key, "vm_uid_base") == 0) {
            /* uid_base + any pid (at most 2^22 on Linux) must stay a valid, unprivileged uid */
            uint64_t x = 0;
            rc = opt_u64(be, k, v, 1000, UINT32_MAX - 1 - (1u << 22), &x, err);
            be->uid_base = (uint32_t)x;
        } else if (strcmp(key, "layer_cache_gb") == 0)
            rc = opt_u64(be, k, v, 0, 1u << 20, cache_gb, err);
        else if (mine)
            rc = dsec_err_set(err, DSEC_E_CONFIG, 0, "unknown %s option %s (known: %s)", be->type,
                              k, known_opts);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* name on PATH (or as given when it holds a slash) into out; -1 when not executable. */
static int find_exe(const char *name, char *out, size_t len)
{
    if (strchr(name, '/') != NULL) {
        dsec__vm_fmt(out, len, "%s", name);
        return access(out, X_OK);
    }
    const char *path = getenv("PATH");
    if (path == NULL || path[0] == '\0')
        path = "/usr/local/bin:/usr/bin:/bin:/usr/local/sbin:/usr/sbin:/sbin";
    for (const char *p = path; *p;) {
        size_t n = strcspn(p, ":");
        if (n > 0) {
            dsec__vm_fmt(out, len, "%.*s/%s", (int)n, p, name);
            if (access(out, X_OK) == 0)
                return 0;
        }
        p += n + (p[n] == ':');
    }
    return -1;
}

static void vm_fini(void *self);

/* KVM if this host's really works. /dev/kvm may open while QEMU still cannot
 * start a vCPU on it: under the nested virtualisation of these machines
 * setting MSR 0x10a (IA32_ARCH_CAPABILITIES) fails and QEMU aborts at start
 * (2026-12-03; with that feature masked QEMU starts, but no guest boots).
 * A paused QEMU told to quit goes through vCPU set-up, so that is tried
 * (under a minute's limit); failing it means TCG. */
static bool probe_kvm(const char *qemu, bool q35)
{
    int kfd = open("/dev/kvm", O_RDWR | O_CLOEXEC);
    if (kfd < 0)
        return false;
    close(kfd);
    char out[512] = "";
    const char *argv[] = {"timeout",
                          "-s",
                          "KILL",
                          "60",
                          qemu,
                          "-machine",
                          q35 ? "q35" : "microvm",
                          "-accel",
                          "kvm",
                          "-cpu",
                          "max",
                          "-m",
                          "64",
                          "-nodefaults",
                          "-no-user-config",
                          "-display",
                          "none",
                          "-S",
                          "-monitor",
                          "stdio",
                          NULL};
    dsec_err err;
    int rc = dsec__vm_run_in(argv, "quit\n", out, sizeof out, &err);
    if (rc == 0)
        return true;
    if (rc < 0)
        dsec__vm_fmt(out, sizeof out, "%s", err.msg);
    char *why = strstr(out, "error:");
    why = why != NULL ? why : out;
    why[strcspn(why, "\n")] = '\0';
    fprintf(stderr,
            "dsec vm: /dev/kvm is there but QEMU cannot start a %s vCPU with it (%.200s); "
            "guests run under TCG\n",
            q35 ? "q35" : "microvm", why);
    return false;
}

bool dsec_vm_kvm_works(const char *qemu, bool q35)
{
    static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
    static int known[2] = {-1, -1};
    pthread_mutex_lock(&mu);
    if (known[q35] < 0)
        known[q35] = probe_kvm(qemu, q35);
    bool ok = known[q35] == 1;
    pthread_mutex_unlock(&mu);
    return ok;
}

/* The host's TSC rate in kHz, measured against CLOCK_MONOTONIC_RAW over 50 ms (0 off x86). */
static uint64_t measure_tsc_khz(void)
{
#if defined(__x86_64__) || defined(__i386__)
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC_RAW, &a);
    uint64_t t0 = __builtin_ia32_rdtsc();
    struct timespec nap = {0, 50000000L};
    nanosleep(&nap, NULL);
    clock_gettime(CLOCK_MONOTONIC_RAW, &b);
    uint64_t t1 = __builtin_ia32_rdtsc();
    uint64_t ns =
        (uint64_t)(b.tv_sec - a.tv_sec) * 1000000000u + (uint64_t)b.tv_nsec - (uint64_t)a.tv_nsec;
    return ns > 0 ? (t1 - t0) * 1000000u / ns : 0;
#else
    return 0;
#endif
}

static int vm_init(void **self, const dsec_backend_config *cfg, bool q35, dsec_err *err)
{
    const char *type = q35 ? "vm" : "microvm";
    *self = NULL;
    if (cfg->state_dir == NULL || cfg->state_dir[0] != '/')
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "%s: the backend needs an absolute state "
                            "directory",
                            type);
    if (strlen(cfg->state_dir) > PATH_MAX - 512)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "%s: the state directory's path is longer than %d bytes", type,
                            PATH_MAX - 512);
    if (geteuid() != 0)
        return dsec_err_set(err, DSEC_E_PERMISSION, 0,
                            "%s: the backend must run as root (layer mounts, network, QEMU)", type);
    struct vm_backend *be = dsec_calloc(1, sizeof *be);
    if (be == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "%s: backend instance", type);
    pthread_mutex_init(&be->lock, NULL);
    pthread_mutex_init(&be->sweep_lock, NULL);
    pthread_cond_init(&be->built, NULL);
    be->q35 = q35;
    be->type = type;
    be->mem_mb = 256;
    be->tb_mb = 64;
    be->boot_timeout_ms = 120000;
    be->uid_base = 1600000000u;
    be->reg = cfg->layers;
    be->net = cfg->net;
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    be->ncpu = nc > 0 ? (unsigned)nc : 1;
    char qemu[PATH_MAX] = "qemu-system-x86_64", kit[PATH_MAX] = DSEC_VMKIT_DIR;
    uint64_t cache_gb = 0;
    if (parse_opts(be, cfg, qemu, sizeof qemu, kit, sizeof kit, &cache_gb, err) < 0)
        goto fail;
    if (find_exe(qemu, be->qemu, sizeof be->qemu) < 0) {
        dsec_err_set(err, DSEC_E_CONFIG, 0,
                     "%s: QEMU (%s) is not installed: apt-get install qemu-system-x86, or set "
                     "the option qemu",
                     type, qemu);
        goto fail;
    }
    dsec__vm_fmt(be->kernel, sizeof be->kernel, "%s/vmlinuz", kit);
    dsec__vm_fmt(be->initrd, sizeof be->initrd, "%s/initrd.img", kit);
    const char *missing = kit[0] == '\0'                  ? "a directory"
                          : access(be->kernel, R_OK) != 0 ? "vmlinuz"
                          : access(be->initrd, R_OK) != 0 ? "initrd.img"
                                                          : NULL;
    if (missing != NULL) {
        dsec_err_set(err, DSEC_E_CONFIG, 0,
                     "%s: the VM kit \"%s\" lacks %s: run make (target vmkit, "
                     "scripts/build-vmkit.sh), or set the option vm_kit",
                     type, kit, missing);
        goto fail;
    }
    be->kvm = dsec_vm_kvm_works(be->qemu, be->q35);
    if (!be->kvm)
        be->tsc_khz = measure_tsc_khz();
    dsec__vm_fmt(be->state_dir, sizeof be->state_dir, "%s", cfg->state_dir);
    dsec__vm_fmt(be->sbroot, sizeof be->sbroot, "%s/sb", be->state_dir);
    dsec__vm_fmt(be->images, sizeof be->images, "%s/images", be->state_dir);
    dsec__vm_fmt(be->forks, sizeof be->forks, "%s/forks", be->state_dir);
    dsec__vm_fmt(be->jail, sizeof be->jail, "%s/jail", be->state_dir);
    const char *dirs[] = {be->state_dir, be->sbroot, be->images, be->forks, be->jail};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++)
        if (mkdir(dirs[i], 0700) < 0 && errno != EEXIST) {
            dsec_err_set(err, DSEC_E_IO, errno, "%s: creating %s", type, dirs[i]);
            goto fail;
        }
    if (be->reg != NULL) {
        if (dsec_backend_layer_cache(cfg, be->state_dir, cache_gb << 30, &be->cache, err) < 0) {
            dsec_err_wrap(err, "%s", type);
            goto fail;
        }
    }
    *self = be;
    return 0;
fail:
    vm_fini(be);
    return -1;
}

static int microvm_init(void **self, const dsec_backend_config *cfg, dsec_err *err)
{
    return vm_init(self, cfg, false, err);
}

static int q35_init(void **self, const dsec_backend_config *cfg, dsec_err *err)
{
    return vm_init(self, cfg, true, err);
}

static void vm_fini(void *self)
{
    struct vm_backend *be = self;
    if (be == NULL)
        return;
    dsec_layer_cache_free(be->cache);
    for (size_t i = 0; i < be->nbuilding; i++)
        dsec_free(be->building[i]);
    dsec_free(be->building);
    pthread_mutex_destroy(&be->lock);
    pthread_mutex_destroy(&be->sweep_lock);
    pthread_cond_destroy(&be->built);
    dsec_free(be);
}

/* ---- sandbox records ---------------------------------------------------------------------- */

static dsec_sandbox *sb_new(const struct vm_backend *be, const char *id, dsec_err *err)
{
    if (id == NULL || dsec_name_ok(id, DSEC_SBX_ID_LEN_MAX) < 0) {
        dsec_err_set(err, DSEC_E_INVALID, 0,
                     "%s: sandbox id must be 1..%d characters of [A-Za-z0-9_-]", be->type,
                     DSEC_SBX_ID_LEN_MAX);
        return NULL;
    }
    dsec_sandbox *sb = dsec_calloc(1, sizeof *sb);
    if (sb == NULL) {
        oom(be, err, "sandbox record");
        return NULL;
    }
    dsec__vm_fmt(sb->id, sizeof sb->id, "%s", id);
    dsec__vm_fmt(sb->dir, sizeof sb->dir, "%s/%s", be->sbroot, id);
    sb->guest.tap_fd = -1;
    return sb;
}

static void sb_free(dsec_sandbox *sb)
{
    env_clear(&sb->env);
    for (size_t i = 0; i < sb->nnet; i++)
        dsec_free(sb->net_entries[i]);
    dsec_free(sb->net_entries);
    dsec_free(sb->net_state);
    dsec_free(sb->tenant);
    if (sb->guest.tap_fd >= 0)
        close(sb->guest.tap_fd);
    dsec_free(sb);
}

static void live_add(struct vm_backend *be, dsec_sandbox *sb)
{
    pthread_mutex_lock(&be->lock);
    if (!sb->listed) {
        sb->live_next = be->live;
        be->live = sb;
        sb->listed = true;
    }
    pthread_mutex_unlock(&be->lock);
}

static void live_del(struct vm_backend *be, dsec_sandbox *sb)
{
    pthread_mutex_lock(&be->lock);
    if (sb->listed) {
        dsec_sandbox **pp = &be->live;
        while (*pp != NULL && *pp != sb)
            pp = &(*pp)->live_next;
        if (*pp == sb)
            *pp = sb->live_next;
        sb->listed = false;
    }
    pthread_mutex_unlock(&be->lock);
}

static bool live_has(struct vm_backend *be, const char *id)
{
    pthread_mutex_lock(&be->lock);
    dsec_sandbox *s = be->live;
    while (s != NULL && strcmp(s->id, id) != 0)
        s = s->live_next;
    pthread_mutex_unlock(&be->lock);
    return s != NULL;
}

/* Let go of sb's layers; the cache may evict them now, and their images go with them. */
static void release_layers(struct vm_backend *be, dsec_sandbox *sb)
{
    bool any = sb->held > 0;
    while (sb->held > 0) {
        struct vm_layer *l = &sb->env.layers[--sb->held];
        dsec_layer_cache_release(be->cache, l->digest);
        dsec_free(l->dir);
        l->dir = NULL;
    }
    if (any)
        dsec__vm_images_gc(be);
}

/* Hold each layer in the cache and make sure its image exists. */
static int hold_layers(struct vm_backend *be, dsec_sandbox *sb, dsec_err *err)
{
    for (; sb->held < sb->env.nlayers; sb->held++) {
        struct vm_layer *l = &sb->env.layers[sb->held];
        if (be->cache == NULL)
            return dsec_err_set(err, DSEC_E_CONFIG, 0,
                                "%s: the node has no layer registry to get %s from", be->type,
                                l->digest);
        if (dsec_layer_cache_acquire(be->cache, l->digest, &l->dir, err) < 0)
            return dsec_err_wrap(err, "%s: layer %s", be->type, l->digest);
        char img[PATH_MAX + 128];
        int rc = dsec__vm_image(be, l->digest, l->dir, img, sizeof img, l->image, err);
        if (rc == 0 && l->want[0] != '\0' && strcmp(l->want, l->image) != 0)
            rc = dsec_err_set(err, DSEC_E_STATE, 0,
                              "%s: the image of layer %s here (%s) is not the one the "
                              "snapshot's guest was reading (%s): it cannot resume on it",
                              be->type, l->digest, l->image, l->want);
        if (rc < 0) {
            dsec_layer_cache_release(be->cache, l->digest);
            dsec_free(l->dir);
            l->dir = NULL;
            return -1;
        }
    }
    /* taking these may have evicted other layers */
    if (sb->env.nlayers > 0)
        dsec__vm_images_gc(be);
    return 0;
}

/* Undo whatever of sb's start was done; frees sb on success. */
static int sb_teardown(struct vm_backend *be, dsec_sandbox *sb, dsec_err *err)
{
    dsec_agent_free(sb->agent);
    sb->agent = NULL;
    if (dsec__vm_qemu_stop(sb, STOP_GRACE_MS, err) < 0)
        return dsec_err_wrap(err, "%s: stopping QEMU", be->type);
    if (sb->net != NULL) {
        if (dsec_net_detach(sb->net, err) < 0)
            return -1;
        sb->net = NULL;
    }
    release_layers(be, sb);
    if (sb->made_dir) {
        if (dsec__vm_rmtree(sb->dir) < 0)
            return dsec_err_set(err, DSEC_E_IO, errno, "%s: removing %s", be->type, sb->dir);
        sb->made_dir = false;
    }
    live_del(be, sb);
    sb_free(sb);
    return 0;
}

static void sb_abandon(struct vm_backend *be, dsec_sandbox *sb)
{
    dsec_err e2;
    if (sb_teardown(be, sb, &e2) < 0) {
        fprintf(stderr, "dsec %s: cleaning up a failed sandbox %s: %s\n", be->type, sb->id, e2.msg);
        live_del(be, sb);
        sb_free(sb);
    }
}

/*
 * The sweep: QEMU processes and directories an earlier node manager left
 * and never re-adopted. Every QEMU whose command line names a sandbox dir
 * of this instance that no record holds is killed, and the dir removed;
 * fork snapshots (transient) and half-made images go too.
 */
static int sweep_procs(struct vm_backend *be)
{
    DIR *d = opendir("/proc");
    if (d == NULL)
        return 0;
    char needle[PATH_MAX + 8];
    int nd = dsec__vm_fmt(needle, sizeof needle, "%s/", be->sbroot);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] < '1' || e->d_name[0] > '9')
            continue;
        pid_t pid = (pid_t)strtol(e->d_name, NULL, 10);
        if (pid == getpid() || !dsec__vm_qemu_is_ours(pid, be->sbroot))
            continue;
        char p[64];
        dsec__vm_fmt(p, sizeof p, "/proc/%d/cmdline", (int)pid);
        char id[DSEC_SBX_ID_LEN_MAX + 2] = "";
        int fd = open(p, O_RDONLY | O_CLOEXEC);
        char buf[1 << 16];
        ssize_t got = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
        if (fd >= 0)
            close(fd);
        if (got <= 0)
            continue;
        for (ssize_t i = 0; i < got; i++)
            if (buf[i] == '\0')
                buf[i] = ' ';
        buf[got] = '\0';
        const char *at = strstr(buf, needle);
        if (at == NULL)
            continue;
        at += nd;
        size_t idl = strcspn(at, "/ ,");
        if (idl == 0 || idl >= sizeof id)
            continue;
        memcpy(id, at, idl);
        id[idl] = '\0';
        if (live_has(be, id))
            continue;
        dsec_sandbox tmp = {.pid = pid};
        dsec__vm_fmt(tmp.dir, sizeof tmp.dir, "%s/%s", be->sbroot, id);
        dsec_err err;
        kill(pid, SIGKILL);
        if (dsec__vm_qemu_stop(&tmp, 0, &err) == 0)
            n++;
    }
    closedir(d);
    return n;
}

static void sweep_once(struct vm_backend *be)
{
    if (atomic_load(&be->swept))
        return;
    pthread_mutex_lock(&be->sweep_lock);
    if (!atomic_load(&be->swept)) {
        int procs = sweep_procs(be);
        int dirs = 0;
        DIR *d = opendir(be->sbroot);
        struct dirent *e;
        while (d != NULL && (e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.' || live_has(be, e->d_name))
                continue;
            char p[PATH_MAX + 300];
            dsec__vm_fmt(p, sizeof p, "%s/%s", be->sbroot, e->d_name);
            if (dsec__vm_rmtree(p) == 0)
                dirs++;
        }
        if (d != NULL)
            closedir(d);
        d = opendir(be->forks);
        while (d != NULL && (e = readdir(d)) != NULL) {
            if (e->d_name[0] == '.')
                continue;
            char p[PATH_MAX + 300];
            dsec__vm_fmt(p, sizeof p, "%s/%s", be->forks, e->d_name);
            dsec__vm_rmtree(p);
        }
        if (d != NULL)
            closedir(d);
        d = opendir(be->images);
        while (d != NULL && (e = readdir(d)) != NULL) {
            size_t l = strlen(e->d_name);
            if (l > 4 && strcmp(e->d_name + l - 4, ".tmp") == 0)
                unlinkat(dirfd(d), e->d_name, 0);
        }
        if (d != NULL)
            closedir(d);
        /* images an earlier node manager left behind after their layers went */
        dsec__vm_images_gc(be);
        if (procs > 0 || dirs > 0)
            fprintf(stderr,
                    "dsec %s: reclaimed %d QEMU processes and %d sandbox directories left by an "
                    "earlier node manager\n",
                    be->type, procs, dirs);
        atomic_store(&be->swept, true);
    }
    pthread_mutex_unlock(&be->sweep_lock);
}

/* ---- booting ------------------------------------------------------------------------------- */

static void random_hex(char *out, size_t nbytes)
{
    uint8_t raw[64];
    if (nbytes > sizeof raw)
        nbytes = sizeof raw;
    if (getrandom(raw, nbytes, 0) != (ssize_t)nbytes) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        for (size_t i = 0; i < nbytes; i++)
            raw[i] = (uint8_t)((uint64_t)ts.tv_nsec * 2654435761u >> (i % 24));
    }
    for (size_t i = 0; i < nbytes; i++)
        sprintf(out + 2 * i, "%02x", raw[i]);
}

/* The guest's hostname: the sandbox id as a DNS label (63 chars, no '_'). */
static void hostname_of(const char *id, char *out, size_t len)
{
    size_t n = 0;
    for (; id[n] && n < 63 && n + 1 < len; n++)
        out[n] = id[n] == '_' ? '-' : id[n];
    out[n] = '\0';
    if (out[0] == '-')
        out[0] = 'x';
}

static int conf_val(FILE *f, const char *key, const char *v)
{
    if (v == NULL)
        v = "";
    if (strchr(v, '\'') != NULL || strchr(v, '\n') != NULL)
        return -1;
    fprintf(f, "%s='%s'\n", key, v);
    return 0;
}

/* Make the writable disk with /dsec/conf and /dsec/env. */
static int make_disk(struct vm_backend *be, dsec_sandbox *sb, dsec_err *err)
{
    char *conf = NULL, *envf = NULL;
    size_t cl = 0, el = 0;
    FILE *f = open_memstream(&conf, &cl);
    FILE *g = open_memstream(&envf, &el);
    int rc = 0;
    if (f == NULL || g == NULL) {
        rc = oom(be, err, "guest configuration");
    } else {
        char host[64], mid[33], epoch[24];
        hostname_of(sb->id, host, sizeof host);
        random_hex(mid, 16);
        dsec__vm_fmt(epoch, sizeof epoch, "%lld", (long long)time(NULL));
        fprintf(f, "DSEC_NLAYERS='%zu'\n", sb->env.nlayers);
        int bad = conf_val(f, "DSEC_HOSTNAME", host) | conf_val(f, "DSEC_MACHINE_ID", mid) |
                  conf_val(f, "DSEC_EPOCH", epoch) | conf_val(f, "DSEC_WORKDIR", sb->env.workdir) |
                  conf_val(f, "DSEC_USER", sb->env.user);
        if (sb->nic) {
            bad |= conf_val(f, "DSEC_NET_MAC", sb->guest.mac) |
                   conf_val(f, "DSEC_NET_ADDR", sb->guest.addr4) |
                   conf_val(f, "DSEC_NET_GW", sb->guest.gw4) |
                   conf_val(f, "DSEC_NET_GWMAC", sb->guest.gw_mac) |
                   conf_val(f, "DSEC_NET_DNS", sb->guest.dns4);
            if (sb->guest.addr6[0] != '\0')
                bad |= conf_val(f, "DSEC_NET_ADDR6", sb->guest.addr6) |
                       conf_val(f, "DSEC_NET_GW6", sb->guest.gw6);
        }
        if (bad)
            rc = dsec_err_set(err, DSEC_E_INVALID, 0,
                              "%s: the environment's workdir or user holds a quote or newline",
                              be->type);
        for (size_t i = 0; i < sb->env.nvars; i++)
            fprintf(g, "%s\n", sb->env.vars[i]);
    }
    if (f != NULL)
        fclose(f);
    if (g != NULL)
        fclose(g);
    if (rc == 0 && (conf == NULL || envf == NULL))
        rc = oom(be, err, "guest configuration");
    if (rc == 0)
        rc = dsec__vm_disk_make(sb, conf, envf, err);
    free(conf); /* open_memstream buffers come from libc */
    free(envf);
    return rc < 0 ? dsec_err_wrap(err, "%s: the sandbox's disk", be->type) : 0;
}

/* Attach sb's network when the node has containment (every VM gets a
 * namespace then, so a later policy works). */
static int net_attach(struct vm_backend *be, dsec_sandbox *sb, dsec_err *err)
{
    if (be->net == NULL) {
        if (sb->nnet > 0)
            return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                                "%s: this node has no network containment configured (the "
                                "cell's net: section), so it cannot apply a network policy",
                                be->type);
        return 0;
    }
    if (dsec_net_attach(be->net, sb->id, sb->tenant, (const char *const *)sb->net_entries, sb->nnet,
                        &sb->net, err) < 0)
        return dsec_err_wrap(err, "%s: network", be->type);
    return 0;
}

/* The tap for this QEMU start (a new one each start). */
static int guest_link(struct vm_backend *be, dsec_sandbox *sb, dsec_err *err)
{
    if (!sb->nic)
        return 0;
    if (sb->net == NULL)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "%s: the machine has a network device but the node has no network "
                            "containment to connect it to",
                            be->type);
    if (sb->guest.tap_fd >= 0)
        close(sb->guest.tap_fd);
    if (dsec_net_guest_link(sb->net, &sb->guest, err) < 0)
        return dsec_err_wrap(err, "%s: the guest's network link", be->type);
    return 0;
}

static void agent_path(const dsec_sandbox *sb, const char *name, char *out, size_t len)
{
    dsec__vm_fmt(out, len, "%s/%s", sb->dir, name);
}

/* Why the guest is gone or silent, from its console. */
static int boot_error(struct vm_backend *be, dsec_sandbox *sb, bool exited, uint64_t waited_ms,
                      dsec_err *err)
{
    char p[PATH_MAX + 16], tail[700], qtail[300];
    dsec__vm_fmt(p, sizeof p, "%s/console.log", sb->dir);
    dsec__vm_log_tail(p, tail, sizeof tail);
    dsec__vm_fmt(p, sizeof p, "%s/qemu.log", sb->dir);
    dsec__vm_log_tail(p, qtail, sizeof qtail);
    if (exited)
        return dsec_err_set(
            err, DSEC_E_BACKEND, 0, "%s: the VM stopped before its agent answered: %s%s%s",
            be->type, tail[0] ? tail : "nothing on its console", qtail[0] ? "; QEMU: " : "", qtail);
    return dsec_err_set(err, DSEC_E_TIMEOUT, 0,
                        "%s: the VM's agent did not answer within %" PRIu64 " ms; console: %s",
                        be->type, waited_ms, tail[0] ? tail : "(empty)");
}

static bool trace(void)
{
    const char *t = getenv("DSEC_VM_TRACE");
    return t != NULL && t[0] == '1';
}

static void trace_step(const dsec_sandbox *sb, const char *step, uint64_t *t)
{
    uint64_t now = dsec_now_ns();
    if (trace())
        fprintf(stderr, "dsec vm %s: %s %.1f ms\n", sb->id, step, (double)(now - *t) / 1e6);
    *t = now;
}

/* Connect to sb's agent within timeout_ms, in rounds of a second, so that a guest that died
 * (init failed and powered off) is reported soon, with what its console said. */
static int agent_dial(struct vm_backend *be, dsec_sandbox *sb, uint64_t timeout_ms, dsec_err *err)
{
    char sp[PATH_MAX + 16];
    agent_path(sb, "agent.sock", sp, sizeof sp);
    uint64_t deadline = dsec_now_ns() + timeout_ms * 1000000u;
    for (;;) {
        dsec_err e2;
        if (dsec_agent_connect(&sb->agent, sp, 1000, &e2) == 0)
            return 0;
        if (!dsec__vm_qemu_is_ours(sb->pid, sb->dir))
            return boot_error(be, sb, true, 0, err);
        if (dsec_now_ns() > deadline)
            return boot_error(be, sb, false, timeout_ms, err);
    }
}

/* Start QEMU for sb (a cold boot, or loading state when not NULL) and connect to its agent. */
static int boot(struct vm_backend *be, dsec_sandbox *sb, const char *state, dsec_err *err)
{
    uint64_t t = dsec_now_ns();
    if (guest_link(be, sb, err) < 0)
        return -1;
    struct vm_launch l = {.incoming = state != NULL, .tap_fd = sb->nic ? sb->guest.tap_fd : -1};
    int rc = dsec__vm_qemu_start(be, sb, &l, err);
    /* QEMU holds its own copy of the tap now */
    if (sb->guest.tap_fd >= 0) {
        close(sb->guest.tap_fd);
        sb->guest.tap_fd = -1;
    }
    if (rc < 0)
        return -1;
    if (write_meta(be, sb, err) < 0)
        return -1;
    trace_step(sb, "QEMU started", &t);
    if (dsec__vm_qemu_wait_ready(sb, 30000, err) < 0)
        return dsec_err_wrap(err, "%s", be->type);
    trace_step(sb, "QMP ready", &t);
    if (state != NULL) {
        struct vm_qmp q;
        if (dsec__vm_qmp_open(&q, sb->dir, QMP_TIMEOUT_MS, err) < 0)
            return dsec_err_wrap(err, "%s", be->type);
        rc = dsec__vm_migrate_in(&q, state, err);
        dsec__vm_qmp_close(&q);
        if (rc < 0) {
            if (!dsec__vm_qemu_is_ours(sb->pid, sb->dir)) {
                char p[PATH_MAX + 16], qtail[400];
                dsec__vm_fmt(p, sizeof p, "%s/qemu.log", sb->dir);
                dsec__vm_log_tail(p, qtail, sizeof qtail);
                dsec_err_set(err, DSEC_E_BACKEND, 0, "QEMU exited loading the state: %s",
                             qtail[0] ? qtail : "no message");
            }
            return dsec_err_wrap(err, "%s", be->type);
        }
        trace_step(sb, "state loaded", &t);
    }
    if (agent_dial(be, sb, be->boot_timeout_ms, err) < 0)
        return -1;
    trace_step(sb, "agent answered", &t);
    return 0;
}

static uint64_t pick_mem(const struct vm_backend *be, uint64_t want)
{
    return want == 0 ? be->mem_mb : want;
}

static unsigned pick_smp(const struct vm_backend *be, uint64_t cpu_milli)
{
    uint64_t n = (cpu_milli + 999) / 1000;
    if (n == 0)
        n = 1;
    if (n > be->ncpu)
        n = be->ncpu;
    return (unsigned)n;
}

static int check_sizes(const struct vm_backend *be, const dsec_sandbox *sb, dsec_err *err)
{
    if (sb->mem_mb < MEM_MB_MIN || sb->mem_mb > MEM_MB_MAX)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "%s: memory_mb %" PRIu64 " is outside %d..%" PRIu64
                            " (a VM needs at least %d MiB for its kernel and initrd)",
                            be->type, sb->mem_mb, MEM_MB_MIN, (uint64_t)MEM_MB_MAX, MEM_MB_MIN);
    if (sb->disk_mb < 16 || sb->disk_mb > DISK_MB_MAX)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "%s: disk_mb %" PRIu64 " is outside 16..%" PRIu64, be->type,
                            sb->disk_mb, (uint64_t)DISK_MB_MAX);
    return 0;
}

static int copy_net(dsec_sandbox *sb, const char *tenant, const char *const *net, size_t n)
{
    if (set_str(&sb->tenant, tenant) < 0)
        return -1;
    if (n == 0)
        return 0;
    if ((sb->net_entries = dsec_calloc(n, sizeof *sb->net_entries)) == NULL)
        return -1;
    for (; sb->nnet < n; sb->nnet++)
        if ((sb->net_entries[sb->nnet] = dsec_strdup(net[sb->nnet] ? net[sb->nnet] : "")) == NULL)
            return -1;
    return 0;
}

/* Make sb's dir and list it (before anything else of it exists). */
static int sb_mkdir(struct vm_backend *be, dsec_sandbox *sb, dsec_err *err)
{
    if (mkdir(sb->dir, 0700) < 0)
        return errno == EEXIST
                   ? dsec_err_set(err, DSEC_E_EXISTS, 0, "%s: a sandbox with this id exists",
                                  be->type)
                   : dsec_err_set(err, DSEC_E_IO, errno, "%s: creating %s", be->type, sb->dir);
    sb->made_dir = true;
    live_add(be, sb);
    return 0;
}

static int vm_create(void *self, const dsec_sandbox_spec *spec, dsec_sandbox **out,
                     char **backend_state, dsec_err *err)
{
    struct vm_backend *be = self;
    *out = NULL;
    *backend_state = NULL;
    dsec_sandbox *sb = sb_new(be, spec->id, err);
    if (sb == NULL)
        return -1;
    sweep_once(be);
    sb->mem_mb = pick_mem(be, spec->memory_mb);
    sb->disk_mb = spec->disk_mb != 0 ? spec->disk_mb : DISK_MB_DEFAULT;
    sb->cpu_milli = spec->cpu_milli;
    sb->smp = pick_smp(be, spec->cpu_milli);
    int rc = check_sizes(be, sb, err);
    if (rc == 0)
        rc = env_from_spec(be, spec, &sb->env, err);
    if (rc == 0 && copy_net(sb, spec->tenant, spec->net, spec->nnet) < 0)
        rc = oom(be, err, "network policy");
    if (rc < 0) {
        sb_free(sb);
        return -1;
    }
    if (sb_mkdir(be, sb, err) < 0) {
        sb_free(sb);
        return -1;
    }
    rc = hold_layers(be, sb, err);
    if (rc == 0)
        rc = net_attach(be, sb, err);
    sb->nic = sb->net != NULL;
    /* the tap (and the addresses the guest configures) before the disk's conf */
    if (rc == 0)
        rc = guest_link(be, sb, err);
    if (rc == 0)
        rc = make_disk(be, sb, err);
    if (rc == 0) {
        char mem[PATH_MAX + 16];
        dsec__vm_fmt(mem, sizeof mem, "%s/mem", sb->dir);
        int fd = open(mem, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
        if (fd < 0 || ftruncate(fd, (off_t)(sb->mem_mb << 20)) < 0)
            rc = dsec_err_set(err, DSEC_E_IO, errno, "%s: creating %s", be->type, mem);
        if (fd >= 0)
            close(fd);
    }
    if (rc == 0)
        rc = boot(be, sb, NULL, err);
    if (rc == 0 && (*backend_state = dsec_strdup(sb->dir)) == NULL)
        rc = oom(be, err, "backend state");
    if (rc < 0) {
        sb_abandon(be, sb);
        return -1;
    }
    *out = sb;
    return 0;
}

/* ---- the agent ----------------------------------------------------------------------------- */

static int agent(struct vm_backend *be, dsec_sandbox *sb, dsec_err *err)
{
    if (sb->paused)
        return dsec_err_set(err, DSEC_E_STATE, 0, "%s: the sandbox is paused (resume it first)",
                            be->type);
    if (sb->agent != NULL)
        return 0;
    return agent_dial(be, sb, 20000, err);
}

/* After a failed agent call, a lost connection is dropped so the next call reconnects. */
static int agent_failed(dsec_sandbox *sb, dsec_err *err)
{
    if (sb->agent != NULL && dsec_agent_broken(sb->agent)) {
        dsec_agent_free(sb->agent);
        sb->agent = NULL;
    }
    return -1;
}

/* A call through the agent, retried once on a fresh connection when the old one broke. */
#define AGENT_CALL(be, sb, err, call)                                                              \
    do {                                                                                           \
        for (int try_ = 0;; try_++) {                                                              \
            if (agent(be, sb, err) < 0)                                                            \
                return -1;                                                                         \
            if ((call) == 0)                                                                       \
                break;                                                                             \
            bool broken_ = dsec_agent_broken(sb->agent);                                           \
            agent_failed(sb, err);                                                                 \
            if (!broken_ || try_ > 0 || (err)->code == DSEC_E_TIMEOUT)                             \
                return -1;                                                                         \
        }                                                                                          \
    } while (0)

static int vm_exec(void *self, dsec_sandbox *sb, const dsec_exec_req *req, dsec_exec_result *res,
                   dsec_err *err)
{
    struct vm_backend *be = self;
    if (agent(be, sb, err) < 0)
        return -1;
    /* not retried: the command may have run */
    if (dsec_agent_exec(sb->agent, req, req->on_output, req->on_output_arg, res, err) < 0)
        return agent_failed(sb, err);
    return 0;
}

struct vm_run {
    dsec_sandbox *sb;
    dsec_exec_done_fn done;
    void *ud;
};

static void vm_exec_done(void *ud, int rc, dsec_exec_result *res, dsec_err *err)
{
    struct vm_run r = *(struct vm_run *)ud;
    dsec_free(ud);
    if (rc < 0)
        agent_failed(r.sb, err);
    r.done(r.ud, rc, res, err);
}

static size_t vm_default_cmd(void *self, dsec_sandbox *sb, const char *const **argv)
{
    (void)self;
    *argv = (const char *const *)sb->env.cmd;
    return sb->env.ncmd;
}

static int vm_exec_start(void *self, dsec_sandbox *sb, const dsec_exec_req *req,
                         struct dsec_loop *loop, dsec_exec_done_fn done, void *ud, dsec_err *err)
{
    struct vm_backend *be = self;
    if (agent(be, sb, err) < 0)
        return -1;
    struct vm_run *r = dsec_malloc(sizeof *r);
    if (r == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "%s: a command in flight", be->type);
    *r = (struct vm_run){.sb = sb, .done = done, .ud = ud};
    /* not retried: the command may have run */
    if (dsec_agent_exec_start(sb->agent, loop, req, req->on_output, req->on_output_arg,
                              vm_exec_done, r, err) < 0) {
        dsec_free(r);
        return agent_failed(sb, err);
    }
    return 0;
}

/* A file transfer in flight: a lost connection is dropped when it ends (the next call
 * re-dials). Not retried on the loop: a dial may wait up to 20 s. */
struct vm_xfer {
    dsec_sandbox *sb;
    dsec_file_done_fn done;
    void *ud;
};

static void vm_xfer_done(void *ud, int rc, dsec_file_data *data, dsec_err *err)
{
    struct vm_xfer x = *(struct vm_xfer *)ud;
    dsec_free(ud);
    if (rc < 0)
        agent_failed(x.sb, err);
    x.done(x.ud, rc, data, err);
}

static struct vm_xfer *vm_xfer_new(struct vm_backend *be, dsec_sandbox *sb,
                                   dsec_file_done_fn done, void *ud, dsec_err *err)
{
    if (agent(be, sb, err) < 0)
        return NULL;
    struct vm_xfer *x = dsec_malloc(sizeof *x);
    if (x == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "%s: a file transfer in flight", be->type);
        return NULL;
    }
    *x = (struct vm_xfer){.sb = sb, .done = done, .ud = ud};
    return x;
}

static int vm_file_write_start(void *self, dsec_sandbox *sb, const char *path, const void *data,
                               size_t len, uint32_t mode, bool append, struct dsec_loop *loop,
                               dsec_file_done_fn done, void *ud, dsec_err *err)
{
    struct vm_xfer *x = vm_xfer_new(self, sb, done, ud, err);
    if (x == NULL)
        return -1;
    if (dsec_agent_file_write_start(sb->agent, loop, path, data, len, mode, append, vm_xfer_done,
                                    x, err) < 0) {
        dsec_free(x);
        return agent_failed(sb, err);
    }
    return 0;
}

static int vm_file_read_start(void *self, dsec_sandbox *sb, const char *path, uint64_t offset,
                              uint64_t max, struct dsec_loop *loop, dsec_file_done_fn done,
                              void *ud, dsec_err *err)
{
    struct vm_xfer *x = vm_xfer_new(self, sb, done, ud, err);
    if (x == NULL)
        return -1;
    if (dsec_agent_file_read_start(sb->agent, loop, path, offset, max, vm_xfer_done, x, err) <
        0) {
        dsec_free(x);
        return agent_failed(sb, err);
    }
    return 0;
}

static int vm_file_write(void *self, dsec_sandbox *sb, const char *path, const void *data,
                         size_t len, uint32_t mode, bool append, dsec_err *err)
{
    struct vm_backend *be = self;
    const uint8_t *p = data;
    size_t off = 0;
    do {
        size_t n = len - off > DSEC_AGENT_FILE_MAX ? DSEC_AGENT_FILE_MAX : len - off;
        AGENT_CALL(
            be, sb, err,
            dsec_agent_file_write(sb->agent, path, p + off, n, mode, append || off > 0, err));
        off += n;
    } while (off < len);
    return 0;
}

static int vm_file_read(void *self, dsec_sandbox *sb, const char *path, uint64_t offset,
                        uint64_t max, dsec_file_data *out, dsec_err *err)
{
    struct vm_backend *be = self;
    memset(out, 0, sizeof *out);
    for (;;) {
        uint64_t want = max == 0 ? 0 : max - out->len;
        dsec_file_data part = {0};
        int rc = 0;
        for (int attempt = 0;; attempt++) {
            if ((rc = agent(be, sb, err)) < 0)
                break;
            if ((rc = dsec_agent_file_read(sb->agent, path, offset + out->len, want, &part, err)) ==
                0)
                break;
            bool broken = dsec_agent_broken(sb->agent);
            agent_failed(sb, err);
            if (!broken || attempt > 0)
                break;
        }
        if (rc < 0) {
            dsec_free(out->data);
            memset(out, 0, sizeof *out);
            return -1;
        }
        if (out->data == NULL) {
            *out = part;
        } else if (part.len > 0) {
            uint8_t *grown = dsec_realloc(out->data, out->len + part.len);
            if (grown == NULL) {
                dsec_free(part.data);
                dsec_free(out->data);
                memset(out, 0, sizeof *out);
                return oom(be, err, "file data");
            }
            memcpy(grown + out->len, part.data, part.len);
            out->data = grown;
            out->len += part.len;
            out->size = part.size;
            out->eof = part.eof;
            dsec_free(part.data);
        } else {
            out->eof = part.eof;
            out->size = part.size;
        }
        if (out->eof || part.len == 0 || (max != 0 && out->len >= max))
            return 0;
    }
}

static int vm_file_list(void *self, dsec_sandbox *sb, const char *path, dsec_file_entry **entries,
                        size_t *n, dsec_err *err)
{
    struct vm_backend *be = self;
    AGENT_CALL(be, sb, err, dsec_agent_file_list(sb->agent, path, entries, n, err));
    return 0;
}

static int vm_file_op(void *self, dsec_sandbox *sb, const dsec_file_op *op, dsec_file_entry *st,
                      dsec_err *err)
{
    struct vm_backend *be = self;
    AGENT_CALL(be, sb, err, dsec_agent_file_op(sb->agent, op, st, err));
    return 0;
}

/* ---- background processes ------------------------------------------------------------------ */

/* A start or a stdin write is not sent again on a fresh connection (the first may have reached
 * the agent: a process would start twice); a signal neither (a second SIGTERM is not the
 * first's). list and output are asked again, as the file calls are. */
#define AGENT_ONCE(be, sb, err, call)                                                              \
    do {                                                                                           \
        if (agent(be, sb, err) < 0)                                                                \
            return -1;                                                                             \
        if ((call) < 0)                                                                            \
            return agent_failed(sb, err);                                                          \
    } while (0)

static int vm_proc_start(void *self, dsec_sandbox *sb, const dsec_proc_start_req *req,
                         dsec_proc_info *out, dsec_err *err)
{
    struct vm_backend *be = self;
    AGENT_ONCE(be, sb, err, dsec_agent_proc_start(sb->agent, req, out, err));
    return 0;
}

static int vm_proc_list(void *self, dsec_sandbox *sb, dsec_proc_info **out, size_t *n,
                        dsec_err *err)
{
    struct vm_backend *be = self;
    AGENT_CALL(be, sb, err, dsec_agent_proc_list(sb->agent, out, n, err));
    return 0;
}

static int vm_proc_signal(void *self, dsec_sandbox *sb, uint64_t handle, int sig, dsec_err *err)
{
    struct vm_backend *be = self;
    AGENT_ONCE(be, sb, err, dsec_agent_proc_signal(sb->agent, handle, sig, err));
    return 0;
}

static int vm_proc_stdin(void *self, dsec_sandbox *sb, uint64_t handle, const void *data,
                         size_t len, bool close, dsec_err *err)
{
    struct vm_backend *be = self;
    AGENT_ONCE(be, sb, err, dsec_agent_proc_stdin(sb->agent, handle, data, len, close, err));
    return 0;
}

/* A resize sets the window whatever it was: sent again after a lost channel, it does no harm.
 * (No proc_follow_start: the guest has one channel, which a waiting request would hold.) */
static int vm_proc_resize(void *self, dsec_sandbox *sb, uint64_t handle, uint16_t rows,
                          uint16_t cols, dsec_err *err)
{
    struct vm_backend *be = self;
    AGENT_CALL(be, sb, err, dsec_agent_proc_resize(sb->agent, handle, rows, cols, err));
    return 0;
}

static int vm_proc_output(void *self, dsec_sandbox *sb, uint64_t handle, uint64_t out_off,
                          uint64_t err_off, uint64_t max, dsec_proc_output *out, dsec_err *err)
{
    struct vm_backend *be = self;
    AGENT_CALL(be, sb, err,
               dsec_agent_proc_output(sb->agent, handle, out_off, err_off, max, out, err));
    return 0;
}

/* ---- state: snapshots, clones, pause --------------------------------------------------------- */

/* The file sb's guest RAM is mapped from. */
static void mem_path(const dsec_sandbox *sb, char *out, size_t len)
{
    dsec__vm_fmt(out, len, "%s/%s", sb->dir, sb->mem_private ? "base.mem" : "mem");
}

/* Save sb into dir (existing): state, mem, disk.img, meta. A running guest
 * is stopped for it and goes on after (unless keep_stopped). */
static int save_to(struct vm_backend *be, dsec_sandbox *sb, const char *dir, bool keep_stopped,
                   dsec_err *err)
{
    char st[PATH_MAX + 16], p[PATH_MAX + 16], src[PATH_MAX + 16];
    dsec__vm_fmt(st, sizeof st, "%s/state", dir);
    struct vm_qmp q = {.fd = -1};
    bool stopped = false;
    int rc = 0;
    if (sb->paused) {
        dsec__vm_fmt(src, sizeof src, "%s/paused/state", sb->dir);
        rc = dsec__vm_copy_sparse(src, st, err);
    } else {
        rc = dsec__vm_qmp_open(&q, sb->dir, QMP_TIMEOUT_MS, err);
        if (rc == 0 && (rc = dsec__vm_qmp_cmd(&q, "stop", NULL, NULL, QMP_TIMEOUT_MS, err)) == 0)
            stopped = true;
        if (rc == 0)
            rc = dsec__vm_migrate_out(&q, st, err);
    }
    /* RAM and disk while nothing runs; a clone's RAM file never changes (link it) */
    mem_path(sb, src, sizeof src);
    dsec__vm_fmt(p, sizeof p, "%s/mem", dir);
    if (rc == 0 && !(sb->mem_private && link(src, p) == 0))
        rc = dsec__vm_copy_sparse(src, p, err);
    dsec__vm_fmt(src, sizeof src, "%s/disk.img", sb->dir);
    dsec__vm_fmt(p, sizeof p, "%s/disk.img", dir);
    if (rc == 0)
        rc = dsec__vm_copy_sparse(src, p, err);
    if (stopped && !keep_stopped) {
        dsec_err e2;
        if (dsec__vm_qmp_cmd(&q, "cont", NULL, NULL, QMP_TIMEOUT_MS, rc < 0 ? &e2 : err) < 0 &&
            rc == 0)
            rc = dsec_err_wrap(err, "resuming the VM after its snapshot");
    }
    dsec__vm_qmp_close(&q);
    if (rc == 0) {
        dsec__vm_fmt(p, sizeof p, "%s/meta", dir);
        FILE *f = fopen(p, "we");
        if (f == NULL) {
            rc = dsec_err_set(err, DSEC_E_IO, errno, "creating %s", p);
        } else {
            fprintf(f, "dsec-vm-snapshot 1\n");
            put_machine(f, be, sb);
            if (fclose(f) != 0)
                rc = dsec_err_set(err, DSEC_E_IO, errno, "writing %s", p);
        }
    }
    /* the snapshot's RAM file is mapped by clones: nobody may write it */
    dsec__vm_fmt(p, sizeof p, "%s/mem", dir);
    if (rc == 0)
        chmod(p, 0400);
    return rc < 0 ? dsec_err_wrap(err, "%s: saving the VM", be->type) : 0;
}

/* Give a clone its own identity (hostname, machine id, clock, random seed, addresses). */
static int set_identity(struct vm_backend *be, dsec_sandbox *sb, dsec_err *err)
{
    char host[64], mid[33], epoch[24];
    hostname_of(sb->id, host, sizeof host);
    random_hex(mid, 16);
    dsec__vm_fmt(epoch, sizeof epoch, "%lld", (long long)time(NULL));
    const char *argv[16] = {"/.dsec/busybox", "sh", "/.dsec/identity.sh", host, mid, epoch};
    size_t argc = 6;
    if (sb->nic) {
        argv[argc++] = sb->guest.mac;
        argv[argc++] = sb->guest.addr4;
        argv[argc++] = sb->guest.gw4;
        argv[argc++] = sb->guest.gw_mac;
        argv[argc++] = sb->guest.dns4;
        if (sb->guest.addr6[0] != '\0') {
            argv[argc++] = sb->guest.addr6;
            argv[argc++] = sb->guest.gw6;
        }
    }
    /* 512 random bytes as one line of hex: identity.sh reads it with a shell builtin (a
     * program to copy raw bytes would cost a process under emulation) */
    uint8_t raw[512];
    char seed[2 * sizeof raw + 1];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw)
        return dsec_err_set(err, DSEC_E_IO, errno, "%s: random seed for a clone", be->type);
    for (size_t i = 0; i < sizeof raw; i++)
        sprintf(seed + 2 * i, "%02x", raw[i]);
    seed[sizeof seed - 1] = '\n';
    dsec_exec_req req = {.argv = argv,
                         .argc = argc,
                         .stdin_data = (const uint8_t *)seed,
                         .stdin_len = sizeof seed,
                         .cwd = "/",
                         .user = "root",
                         .timeout_ms = 60000};
    dsec_exec_result res = {0};
    if (vm_exec(be, sb, &req, &res, err) < 0)
        return dsec_err_wrap(err, "%s: giving the clone its identity", be->type);
    int rc = 0;
    if (res.exit_code != 0)
        rc =
            dsec_err_set(err, DSEC_E_BACKEND, 0,
                         "%s: giving the clone its identity: identity.sh exited %d: %.*s", be->type,
                         res.exit_code, (int)(res.stderr_len > 300 ? 300 : res.stderr_len),
                         res.stderr_data ? (const char *)res.stderr_data : "");
    dsec_exec_result_release(&res);
    return rc;
}

/* A new sandbox id from the snapshot in dir; spec (may be NULL) gives tenant and network. */
static int clone_from(struct vm_backend *be, const char *dir, const char *id, const char *tenant,
                      const char *const *net, size_t nnet, dsec_sandbox **out, dsec_err *err)
{
    *out = NULL;
    dsec_sandbox *sb = sb_new(be, id, err);
    if (sb == NULL)
        return -1;
    char p[PATH_MAX + 16], type[16] = "";
    dsec__vm_fmt(p, sizeof p, "%s/meta", dir);
    int rc = read_rec(be, p, "dsec-vm-snapshot 1", sb, type, sizeof type, err);
    if (rc == 0 && strcmp(type, be->type) != 0)
        rc = dsec_err_set(err, DSEC_E_INVALID, 0,
                          "%s: the snapshot in %s is of a \"%s\" sandbox, not \"%s\"", be->type,
                          dir, type, be->type);
    bool nic = sb->nic;
    if (rc == 0 && nic && be->net == NULL)
        rc = dsec_err_set(err, DSEC_E_CONFIG, 0,
                          "%s: the snapshot's VM has a network device but this node has no "
                          "network containment to connect it to",
                          be->type);
    if (rc == 0 && (sb->mem_mb < MEM_MB_MIN || sb->smp == 0 || sb->env.workdir == NULL))
        rc = dsec_err_set(err, DSEC_E_DECODE, 0, "%s: the snapshot meta in %s is incomplete",
                          be->type, dir);
    if (rc == 0 && copy_net(sb, tenant, net, nnet) < 0)
        rc = oom(be, err, "network policy");
    if (rc < 0) {
        sb_free(sb);
        return -1;
    }
    if (sb_mkdir(be, sb, err) < 0) {
        sb_free(sb);
        return -1;
    }
    sb->mem_private = true;
    rc = hold_layers(be, sb, err);
    char src[PATH_MAX + 16], dst[PATH_MAX + 16];
    dsec__vm_fmt(src, sizeof src, "%s/mem", dir);
    dsec__vm_fmt(dst, sizeof dst, "%s/base.mem", sb->dir);
    /* a link keeps the RAM file alive (and its pages shared) for as long as
     * this clone needs it, whatever happens to the snapshot */
    if (rc == 0 && link(src, dst) < 0)
        rc = dsec__vm_copy_sparse(src, dst, err);
    dsec__vm_fmt(src, sizeof src, "%s/disk.img", dir);
    dsec__vm_fmt(dst, sizeof dst, "%s/disk.img", sb->dir);
    if (rc == 0)
        rc = dsec__vm_copy_sparse(src, dst, err);
    if (rc == 0)
        rc = net_attach(be, sb, err);
    /* the machine keeps the snapshot's devices: a NIC only when it had one */
    sb->nic = nic;
    dsec__vm_fmt(src, sizeof src, "%s/state", dir);
    if (rc == 0)
        rc = boot(be, sb, src, err);
    uint64_t t = dsec_now_ns();
    if (rc == 0)
        rc = set_identity(be, sb, err);
    trace_step(sb, "identity", &t);
    if (rc == 0)
        rc = write_meta(be, sb, err);
    if (rc < 0) {
        sb_abandon(be, sb);
        return -1;
    }
    *out = sb;
    return 0;
}

static int check_dir_path(const struct vm_backend *be, const char *path, dsec_err *err)
{
    if (path == NULL || path[0] != '/')
        return dsec_err_set(err, DSEC_E_INVALID, 0, "%s: the snapshot path must be absolute",
                            be->type);
    if (strlen(path) > PATH_MAX - 64)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "%s: the snapshot path is too long", be->type);
    return 0;
}

static int vm_snapshot(void *self, dsec_sandbox *sb, const char *path, const char *name,
                       dsec_err *err)
{
    struct vm_backend *be = self;
    if (check_dir_path(be, path, err) < 0)
        return -1;
    sweep_once(be);
    if (mkdir(path, 0700) < 0)
        return dsec_err_set(err, errno == EEXIST ? DSEC_E_EXISTS : DSEC_E_IO, errno,
                            "%s: creating the snapshot directory %s", be->type, path);
    /* what a published environment holds must be on the disk, not in the guest's cache */
    if (name != NULL && !sb->paused) {
        const char *argv[] = {"/.dsec/busybox", "sync"};
        dsec_exec_req req = {.argv = argv, .argc = 2, .timeout_ms = 60000};
        dsec_exec_result res = {0};
        if (vm_exec(be, sb, &req, &res, err) < 0) {
            dsec__vm_rmtree(path);
            return dsec_err_wrap(err, "%s: syncing the guest's files", be->type);
        }
        dsec_exec_result_release(&res);
    }
    int rc = save_to(be, sb, path, false, err);
    if (rc == 0 && name != NULL) {
        dsec_env base = {.name = sb->env.name,
                         .nlayers = sb->env.nlayers,
                         .vars = sb->env.vars,
                         .nvars = sb->env.nvars,
                         .workdir = sb->env.workdir,
                         .user = sb->env.user,
                         .cmd = sb->env.cmd,
                         .ncmd = sb->env.ncmd,
                         .nentry = sb->env.nentry <= sb->env.ncmd ? sb->env.nentry : 0};
        base.layers = dsec_calloc(sb->env.nlayers + 1, sizeof *base.layers);
        if (base.layers == NULL)
            rc = oom(be, err, "environment");
        for (size_t i = 0; rc == 0 && i < sb->env.nlayers; i++)
            base.layers[i] = sb->env.layers[i].digest;
        char scratch[PATH_MAX + 16], disk[PATH_MAX + 16];
        dsec__vm_fmt(scratch, sizeof scratch, "%s/publish", path);
        dsec__vm_fmt(disk, sizeof disk, "%s/disk.img", path);
        if (rc == 0)
            rc = dsec__vm_publish(be->reg, disk, scratch, &base, name, err);
        dsec__vm_rmtree(scratch);
        dsec_free(base.layers);
    }
    if (rc < 0)
        dsec__vm_rmtree(path);
    return rc;
}

static int vm_restore(void *self, const dsec_sandbox_spec *spec, const char *path,
                      dsec_sandbox **out, char **backend_state, dsec_err *err)
{
    struct vm_backend *be = self;
    *out = NULL;
    *backend_state = NULL;
    if (check_dir_path(be, path, err) < 0)
        return -1;
    sweep_once(be);
    dsec_sandbox *sb = NULL;
    if (clone_from(be, path, spec->id, spec->tenant, spec->net, spec->nnet, &sb, err) < 0)
        return -1;
    if ((*backend_state = dsec_strdup(sb->dir)) == NULL) {
        sb_abandon(be, sb);
        return oom(be, err, "backend state");
    }
    *out = sb;
    return 0;
}

/* The children of one fork, restored by up to ncpu threads side by side: much of a restore
 * is waiting (QEMU's start, the state's load, the agent's hello). */
struct fork_run {
    struct vm_backend *be;
    dsec_sandbox *parent;
    const char *dir;
    const char *const *ids;
    size_t n;
    dsec_sandbox **children;
    char **states;
    atomic_size_t next;
    atomic_bool failed;
    pthread_mutex_t mu; /* guards err */
    dsec_err err;       /* the first failure */
};

static void *fork_worker(void *arg)
{
    struct fork_run *f = arg;
    for (;;) {
        size_t i = atomic_fetch_add(&f->next, 1);
        if (i >= f->n || atomic_load(&f->failed))
            break;
        dsec_err e;
        int rc = clone_from(f->be, f->dir, f->ids[i], f->parent->tenant,
                            (const char *const *)f->parent->net_entries, f->parent->nnet,
                            &f->children[i], &e);
        if (rc < 0)
            dsec_err_wrap(&e, "fork child %zu", i);
        else if ((f->states[i] = dsec_strdup(f->children[i]->dir)) == NULL)
            rc = oom(f->be, &e, "backend state");
        if (rc < 0) {
            pthread_mutex_lock(&f->mu);
            if (!atomic_exchange(&f->failed, true))
                f->err = e;
            pthread_mutex_unlock(&f->mu);
        }
    }
    return NULL;
}

static int vm_fork(void *self, dsec_sandbox *sb, const char *const *ids, size_t n,
                   dsec_sandbox **children, char **states, dsec_err *err)
{
    struct vm_backend *be = self;
    for (size_t i = 0; i < n; i++) {
        children[i] = NULL;
        states[i] = NULL;
        if (ids[i] == NULL || dsec_name_ok(ids[i], DSEC_SBX_ID_LEN_MAX) < 0)
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "%s: fork child id %zu is not 1..%d of [A-Za-z0-9_-]", be->type, i,
                                DSEC_SBX_ID_LEN_MAX);
        for (size_t k = 0; k < i; k++)
            if (strcmp(ids[k], ids[i]) == 0)
                return dsec_err_set(err, DSEC_E_INVALID, 0,
                                    "%s: fork child ids %zu and %zu are equal", be->type, k, i);
    }
    sweep_once(be);
    char dir[PATH_MAX + 160];
    dsec__vm_fmt(dir, sizeof dir, "%s/%s-%" PRIu64, be->forks, sb->id,
                 atomic_fetch_add(&be->seq, 1));
    if (mkdir(dir, 0700) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "%s: creating %s", be->type, dir);
    int rc = save_to(be, sb, dir, false, err);
    if (rc == 0) {
        struct fork_run f = {.be = be,
                             .parent = sb,
                             .dir = dir,
                             .ids = ids,
                             .n = n,
                             .children = children,
                             .states = states};
        atomic_init(&f.next, 0);
        atomic_init(&f.failed, false);
        pthread_mutex_init(&f.mu, NULL);
        pthread_t th[8];
        size_t nth = 0, want = n < be->ncpu ? n : be->ncpu;
        while (nth + 1 < want && nth < sizeof th / sizeof th[0] &&
               pthread_create(&th[nth], NULL, fork_worker, &f) == 0)
            nth++; /* fewer threads if one cannot start: this one works too */
        fork_worker(&f);
        for (size_t i = 0; i < nth; i++)
            pthread_join(th[i], NULL);
        pthread_mutex_destroy(&f.mu);
        if (atomic_load(&f.failed)) {
            *err = f.err;
            rc = -1;
        }
    }
    if (rc < 0)
        for (size_t i = 0; i < n; i++) {
            if (children[i] != NULL)
                sb_abandon(be, children[i]);
            dsec_free(states[i]);
            children[i] = NULL;
            states[i] = NULL;
        }
    /* each child links the RAM file it maps: the snapshot itself can go */
    dsec__vm_rmtree(dir);
    return rc;
}

static int vm_pause(void *self, dsec_sandbox *sb, dsec_err *err)
{
    struct vm_backend *be = self;
    if (sb->paused)
        return 0;
    char dir[PATH_MAX + 16], st[PATH_MAX + 32];
    dsec__vm_fmt(dir, sizeof dir, "%s/paused", sb->dir);
    dsec__vm_fmt(st, sizeof st, "%s/state", dir);
    dsec__vm_rmtree(dir);
    if (mkdir(dir, 0700) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "%s: creating %s", be->type, dir);
    struct vm_qmp q;
    int rc = dsec__vm_qmp_open(&q, sb->dir, QMP_TIMEOUT_MS, err);
    if (rc < 0) {
        dsec__vm_rmtree(dir);
        return dsec_err_wrap(err, "%s: pause", be->type);
    }
    rc = dsec__vm_qmp_cmd(&q, "stop", NULL, NULL, QMP_TIMEOUT_MS, err);
    if (rc == 0)
        rc = dsec__vm_migrate_out(&q, st, err);
    if (rc < 0) {
        dsec_err e2;
        dsec__vm_qmp_cmd(&q, "cont", NULL, NULL, QMP_TIMEOUT_MS, &e2);
        dsec__vm_qmp_close(&q);
        dsec__vm_rmtree(dir);
        return dsec_err_wrap(err, "%s: pause", be->type);
    }
    dsec__vm_qmp_close(&q);
    /* the state is saved (its RAM in the file, or in the state for a clone): QEMU and
     * the memory it held can go */
    dsec_agent_free(sb->agent);
    sb->agent = NULL;
    if (dsec__vm_qemu_stop(sb, STOP_GRACE_MS, err) < 0)
        return dsec_err_wrap(err, "%s: pause", be->type);
    sb->paused = true;
    return write_meta(be, sb, err);
}

static int vm_resume(void *self, dsec_sandbox *sb, dsec_err *err)
{
    struct vm_backend *be = self;
    if (!sb->paused)
        return 0;
    char dir[PATH_MAX + 16], st[PATH_MAX + 32];
    dsec__vm_fmt(dir, sizeof dir, "%s/paused", sb->dir);
    dsec__vm_fmt(st, sizeof st, "%s/state", dir);
    sb->paused = false;
    if (boot(be, sb, st, err) < 0) {
        dsec_err e2;
        dsec_agent_free(sb->agent);
        sb->agent = NULL;
        dsec__vm_qemu_stop(sb, 0, &e2);
        sb->paused = true;
        write_meta(be, sb, &e2);
        return dsec_err_wrap(err, "%s: resume", be->type);
    }
    dsec__vm_rmtree(dir);
    return write_meta(be, sb, err);
}

/* ---- destroy, stats, adopt, detach, network ---------------------------------------------------
 */

static int vm_destroy(void *self, dsec_sandbox *sb, dsec_err *err)
{
    sweep_once(self);
    return sb_teardown(self, sb, err);
}

static int vm_stats(void *self, dsec_sandbox *sb, dsec_sandbox_stats *out, dsec_err *err)
{
    struct vm_backend *be = self;
    memset(out, 0, sizeof *out);
    char p[PATH_MAX + 16];
    dsec__vm_fmt(p, sizeof p, "%s/disk.img", sb->dir);
    out->disk_bytes = dsec__vm_allocated(p);
    if (sb->paused || sb->pid <= 0) {
        out->cpu_used_us = sb->last_cpu_us;
        return 0;
    }
    dsec__vm_fmt(p, sizeof p, "/proc/%d/stat", (int)sb->pid);
    char *stat = dsec__vm_read_file(p, 4096);
    const char *rp = stat != NULL ? strrchr(stat, ')') : NULL;
    unsigned long long ut = 0, st = 0;
    long long rss = 0;
    /* after ")": state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime
     * stime cutime cstime priority nice threads itrealvalue starttime vsize rss */
    if (rp == NULL ||
        sscanf(rp + 2,
               "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu %*d %*d %*d %*d "
               "%*d %*d %*u %*u %lld",
               &ut, &st, &rss) != 3) {
        dsec_free(stat);
        return dsec_err_set(err, DSEC_E_NOT_FOUND, errno, "%s: QEMU (pid %d) is gone", be->type,
                            (int)sb->pid);
    }
    dsec_free(stat);
    long tick = sysconf(_SC_CLK_TCK);
    long page = sysconf(_SC_PAGESIZE);
    out->cpu_used_us = (ut + st) * 1000000u / (uint64_t)(tick > 0 ? tick : 100);
    out->memory_bytes = (uint64_t)(rss > 0 ? rss : 0) * (uint64_t)(page > 0 ? page : 4096);
    uint64_t now = dsec_now_ns();
    if (sb->last_ns != 0 && now > sb->last_ns && out->cpu_used_us >= sb->last_cpu_us)
        out->cpu_milli = (out->cpu_used_us - sb->last_cpu_us) * 1000000u / (now - sb->last_ns);
    sb->last_ns = now;
    sb->last_cpu_us = out->cpu_used_us;
    return 0;
}

static int vm_adopt(void *self, const dsec_sandbox_spec *spec, const char *backend_state,
                    dsec_sandbox **out, dsec_err *err)
{
    struct vm_backend *be = self;
    *out = NULL;
    if (backend_state == NULL || backend_state[0] != '/')
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "%s: adopt needs the sandbox directory as backend state", be->type);
    dsec_sandbox *sb = dsec_calloc(1, sizeof *sb);
    if (sb == NULL)
        return oom(be, err, "sandbox record");
    sb->guest.tap_fd = -1;
    char mp[PATH_MAX + 16], type[16] = "";
    dsec__vm_fmt(mp, sizeof mp, "%s/meta", backend_state);
    int rc = read_rec(be, mp, "dsec-vm 1", sb, type, sizeof type, err);
    if (rc == 0 && sb->id[0] == '\0')
        rc = dsec_err_set(err, DSEC_E_DECODE, 0, "%s: %s names no sandbox", be->type, mp);
    if (rc == 0 && strcmp(type, be->type) != 0)
        rc = dsec_err_set(err, DSEC_E_INVALID, 0, "%s: %s is a \"%s\" sandbox", be->type,
                          backend_state, type);
    if (rc == 0 && spec != NULL && spec->id != NULL && strcmp(spec->id, sb->id) != 0)
        rc = dsec_err_set(err, DSEC_E_INVALID, 0, "%s: the record is of sandbox %s", be->type,
                          sb->id);
    if (rc == 0) {
        dsec__vm_fmt(sb->dir, sizeof sb->dir, "%s/%s", be->sbroot, sb->id);
        if (strcmp(sb->dir, backend_state) != 0)
            rc = dsec_err_set(err, DSEC_E_INVALID, 0,
                              "%s: %s is not a sandbox directory of this backend", be->type,
                              backend_state);
    }
    if (rc < 0) {
        sb_free(sb);
        return -1;
    }
    sb->made_dir = true;
    if (!sb->paused && !dsec__vm_qemu_is_ours(sb->pid, sb->dir)) {
        dsec_err_set(err, DSEC_E_NOT_FOUND, 0,
                     "%s: the sandbox's QEMU (pid %d) is no longer running; what was left of "
                     "it is removed",
                     be->type, (int)sb->pid);
        sb->pid = 0;
        dsec_err e2;
        if (sb_teardown(be, sb, &e2) < 0)
            sb_free(sb);
        return -1;
    }
    if (hold_layers(be, sb, err) < 0) {
        /* leave it running: a later adopt may find the layer again */
        release_layers(be, sb);
        sb_free(sb);
        return -1;
    }
    if (sb->net_state != NULL) {
        int nrc =
            be->net == NULL
                ? dsec_err_set(err, DSEC_E_CONFIG, 0,
                               "%s: the sandbox had network containment and the node now "
                               "has none",
                               be->type)
                : dsec_net_adopt(be->net, sb->id, sb->tenant, sb->net_state,
                                 (const char *const *)sb->net_entries, sb->nnet, &sb->net, err);
        if (nrc < 0) {
            release_layers(be, sb);
            sb_free(sb);
            return dsec_err_wrap(err, "%s: adopting its network", be->type);
        }
    }
    if (!sb->paused && agent_dial(be, sb, 10000, err) < 0)
        sb->agent = NULL; /* exec reconnects or reports it; destroy still works */
    dsec_err_clear(err);
    live_add(be, sb);
    *out = sb;
    return 0;
}

static void vm_detach(void *self, dsec_sandbox *sb)
{
    struct vm_backend *be = self;
    live_del(be, sb);
    /* QEMU reads the layers' images in S/images, not the cache's directories, so
     * the cache may let them go; adopt takes them again */
    release_layers(be, sb);
    dsec_agent_free(sb->agent);
    dsec_net_release(sb->net);
    sb_free(sb);
}

static int vm_net_set(void *self, dsec_sandbox *sb, const char *const *entries, size_t n,
                      dsec_err *err)
{
    struct vm_backend *be = self;
    if (sb->net == NULL)
        return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                            "%s: this sandbox has no managed network (its node has no network "
                            "containment configured)",
                            be->type);
    if (dsec_net_set(sb->net, entries, n, err) < 0)
        return -1;
    for (size_t i = 0; i < sb->nnet; i++)
        dsec_free(sb->net_entries[i]);
    dsec_free(sb->net_entries);
    sb->net_entries = NULL;
    sb->nnet = 0;
    if (copy_net(sb, sb->tenant, entries, n) < 0)
        return oom(be, err, "network policy");
    if (write_meta(be, sb, err) < 0)
        return dsec_err_wrap(err, "%s: the policy is applied but not recorded", be->type);
    return 0;
}

#define VM_OPS(name, typestr, initfn)                                                              \
    const dsec_backend_ops name = {                                                                \
        .type = typestr,                                                                           \
        .init = initfn,                                                                            \
        .fini = vm_fini,                                                                           \
        .create = vm_create,                                                                       \
        .exec = vm_exec,                                                                           \
        .exec_start = vm_exec_start,                                                               \
        .default_cmd = vm_default_cmd,                                                             \
        .file_write = vm_file_write,                                                               \
        .file_read = vm_file_read,                                                                 \
        .file_write_start = vm_file_write_start,                                                   \
        .file_read_start = vm_file_read_start,                                                     \
        .file_list = vm_file_list,                                                                 \
        .file_op = vm_file_op,                                                                     \
        .fork = vm_fork,                                                                           \
        .pause = vm_pause,                                                                         \
        .resume = vm_resume,                                                                       \
        .snapshot = vm_snapshot,                                                                   \
        .restore = vm_restore,                                                                     \
        .destroy = vm_destroy,                                                                     \
        .stats = vm_stats,                                                                         \
        .adopt = vm_adopt,                                                                         \
        .detach = vm_detach,                                                                       \
        .net_set = vm_net_set,                                                                     \
        .proc_start = vm_proc_start,                                                               \
        .proc_list = vm_proc_list,                                                                 \
        .proc_signal = vm_proc_signal,                                                             \
        .proc_stdin = vm_proc_stdin,                                                               \
        .proc_output = vm_proc_output,                                                             \
        .proc_resize = vm_proc_resize,                                                             \
    }

VM_OPS(dsec_microvm_ops, "microvm", microvm_init);
VM_OPS(dsec_vm_ops, "vm", q35_init);
