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

#include "backends/loop.h"
#include "backends/vm/vm-int.h"
#include "dsec/alloc.h"
#include "dsec/io.h"
#include "dsec/log.h"

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

#define DISK_MB_DEFAULT 1024
#define DISK_MB_MAX (UINT64_C(1) << 24)

int dsec__vm_fmt(char *out, size_t len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, len, fmt, ap);
    va_end(ap);
    return n;
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

void dsec__vm_env_clear(struct vm_env *e)
{
    dsec_sbx_env_clear(&e->base);
    for (size_t i = 0; i < e->nlayers; i++)
        dsec_free(e->layers[i].dir);
    dsec_free(e->layers);
    memset(e, 0, sizeof *e);
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

/* An environment being built: the layers' owner. */
struct env_build {
    const struct vm_backend *be;
    struct vm_env *env;
};

static int doc_layer(void *arg, const char *digest, int format, dsec_err *err)
{
    (void)format;
    struct env_build *b = arg;
    return add_layer(b->be, b->env, digest, err);
}

static int env_from_spec(struct vm_backend *be, const dsec_sandbox_spec *spec, struct vm_env *out,
                         dsec_err *err)
{
    memset(out, 0, sizeof *out);
    int rc = 0;
    if (spec->env != NULL && spec->env[0] != '\0') {
        dsec_env *d = NULL;
        if (dsec_sbx_env_get(&be->sbx, be->reg, spec->env, &d, err) < 0)
            return -1;
        struct env_build b = {be, out};
        rc = dsec_sbx_env_from_doc(&be->sbx, &out->base, d, doc_layer, &b, err);
        dsec_env_free(d);
    } else {
        /* no layers at all is allowed: the guest's root is then the initrd's busybox */
        for (size_t i = 0; rc == 0 && i < spec->nlayers; i++)
            rc = add_layer(be, out, spec->layers[i], err);
        if (rc == 0)
            rc = dsec_sbx_set_str(&be->sbx, &out->base.workdir, "/", err);
        if (rc == 0)
            rc = dsec_sbx_set_str(&be->sbx, &out->base.user, "root", err);
    }
    if (rc < 0)
        dsec__vm_env_clear(out);
    return rc;
}

/* ---- text records: the sandbox's meta and a snapshot's meta --------------------------------- */

static void put_env(FILE *f, const struct vm_env *e)
{
    dsec_sbx_env_put(f, &e->base);
    /* with the image each layer's guest reads, when known: a snapshot's guest
     * must find the same bytes wherever it is restored */
    for (size_t i = 0; i < e->nlayers; i++) {
        const struct vm_layer *l = &e->layers[i];
        const char *img = l->image[0] != '\0' ? l->image : l->want;
        fprintf(f, "layer %s%s%s\n", l->digest, img[0] != '\0' ? " " : "", img);
    }
}

/* The machine fields both records share. */
void dsec__vm_put_machine(FILE *f, const struct vm_backend *be, const dsec_sandbox *sb)
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

/* "layer DIGEST [IMAGE-DIGEST]" */
static int layer_line(const struct vm_backend *be, struct vm_env *e, char *val, dsec_err *err)
{
    char *img = strchr(val, ' ');
    if (img != NULL)
        *img++ = '\0';
    if (add_layer(be, e, val, err) < 0)
        return -1;
    if (img != NULL) {
        if (!dsec_digest_valid(img))
            return dsec_err_set(err, DSEC_E_DECODE, 0,
                                "%s: layer %s names image \"%.80s\", not a digest", be->type, val,
                                img);
        dsec__vm_fmt(e->layers[e->nlayers - 1].want, sizeof(dsec_digest), "%s", img);
    }
    return 0;
}

/* The machine's and the sandbox's own lines. */
static int own_line(struct rec *r, const char *key, char *val, dsec_err *err)
{
    dsec_sandbox *sb = r->sb;
    if (strcmp(key, "type") == 0)
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
    return 0;
}

static int rec_line(void *arg, const char *key, char *val, dsec_err *err)
{
    struct rec *r = arg;
    dsec_sandbox *sb = r->sb;
    if (strcmp(key, "layer") == 0)
        return layer_line(r->be, &sb->env, val, err);
    int t = dsec_sbx_env_line(&r->be->sbx, &sb->env.base, key, val, err);
    struct dsec_sbx_netrec nr = {&sb->tenant, &sb->net_state, &sb->net_entries, &sb->nnet};
    if (t == 0)
        t = dsec_sbx_net_line(&r->be->sbx, &nr, key, val, err);
    if (t != 0)
        return t < 0 ? -1 : 0;
    return own_line(r, key, val, err);
}

/* Read a record file with the given first line into sb. */
int dsec__vm_read_rec(const struct vm_backend *be, const char *path, const char *magic,
                      dsec_sandbox *sb, char *type, size_t typelen, dsec_err *err)
{
    char *text = dsec_sbx_read_file(path, 1u << 20);
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
    int rc = dsec_sbx_rec_parse(text + ml + 1, rec_line, &r, err);
    dsec_free(text);
    if (type != NULL)
        dsec__vm_fmt(type, typelen, "%s", r.type);
    return rc;
}

/* The record's meta lines after its first. */
struct meta_arg {
    const struct vm_backend *be;
    const dsec_sandbox *sb;
};

static void meta_put(FILE *f, const void *arg)
{
    const struct meta_arg *m = arg;
    const dsec_sandbox *sb = m->sb;
    dsec_sbx_rec_put(f, "id", sb->id);
    fprintf(f, "pid %d\nmem_private %d\npaused %d\n", (int)sb->pid, sb->mem_private ? 1 : 0,
            sb->paused ? 1 : 0);
    dsec_sbx_net_put(f, sb->tenant, sb->net, sb->net_entries, sb->nnet);
    dsec__vm_put_machine(f, m->be, sb);
}

int dsec__vm_write_meta(const struct vm_backend *be, const dsec_sandbox *sb, dsec_err *err)
{
    struct meta_arg m = {be, sb};
    return dsec_sbx_rec_write(&be->sbx, sb->dir, "dsec-vm 1", meta_put, &m, err);
}

/* ---- options and the instance -----------------------------------------------------------------
 */

static const char known_opts[] =
    "qemu, vm_kit, vm_mem_mb, vm_tb_mb, vm_boot_timeout_ms, vm_uid_base, layer_cache_gb";

/* What the options set besides the instance's fields. */
struct vm_opts {
    struct vm_backend *be;
    char qemu[PATH_MAX], kit[PATH_MAX];
    uint64_t cache_gb;
};

static int opt_one(void *arg, const char *key, const char *k, const char *v, dsec_err *err)
{
    struct vm_opts *o = arg;
    struct vm_backend *be = o->be;
    const struct dsec_sbx_store *s = &be->sbx;
    int rc = 0;
    if (strcmp(key, "qemu") == 0)
        dsec__vm_fmt(o->qemu, sizeof o->qemu, "%s", v);
    else if (strcmp(key, "vm_kit") == 0)
        dsec__vm_fmt(o->kit, sizeof o->kit, "%s", v);
    else if (strcmp(key, "vm_mem_mb") == 0)
        rc = dsec_sbx_opt_u64(s, k, v, MEM_MB_MIN, MEM_MB_MAX, &be->mem_mb, err);
    else if (strcmp(key, "vm_tb_mb") == 0)
        rc = dsec_sbx_opt_u64(s, k, v, 1, 4096, &be->tb_mb, err);
    else if (strcmp(key, "vm_boot_timeout_ms") == 0)
        rc = dsec_sbx_opt_u64(s, k, v, 1000, 3600000, &be->boot_timeout_ms, err);
    else if (strcmp(key, "vm_uid_base") == 0) {
        /* uid_base + any pid (at most 2^22 on Linux) must stay a valid, unprivileged uid */
        uint64_t x = 0;
        rc = dsec_sbx_opt_u64(s, k, v, 1000, UINT32_MAX - 1 - (1u << 22), &x, err);
        be->uid_base = (uint32_t)x;
    } else if (strcmp(key, "layer_cache_gb") == 0)
        rc = dsec_sbx_opt_u64(s, k, v, 0, 1u << 20, &o->cache_gb, err);
    else
        return 0;
    return rc < 0 ? -1 : 1;
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
static const struct dsec_sbx_ops vm_store_ops;

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
    int rc = dsec_run_capture(argv, "quit\n", out, sizeof out, &err);
    if (rc == 0)
        return true;
    if (rc < 0)
        dsec__vm_fmt(out, sizeof out, "%s", err.msg);
    char *why = strstr(out, "error:");
    why = why != NULL ? why : out;
    why[strcspn(why, "\n")] = '\0';
    dsec_log_warn("dsec vm: /dev/kvm is there but QEMU cannot start a %s vCPU with it (%.200s); "
                  "guests run under TCG",
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
    pthread_cond_init(&be->built, NULL);
    be->q35 = q35;
    be->type = type;
    dsec_sbx_store_init(&be->sbx, type, DSEC_SBX_VARS_ONE_LINE, &vm_store_ops, be);
    be->mem_mb = 256;
    be->tb_mb = 64;
    be->boot_timeout_ms = 120000;
    be->uid_base = 1600000000u;
    be->reg = cfg->layers;
    be->net = cfg->net;
    be->loop = cfg->loop;
    long nc = sysconf(_SC_NPROCESSORS_ONLN);
    be->ncpu = nc > 0 ? (unsigned)nc : 1;
    struct vm_opts o = {.be = be, .qemu = "qemu-system-x86_64", .kit = DSEC_VMKIT_DIR};
    if (dsec_sbx_opts(&be->sbx, cfg, opt_one, &o, known_opts, err) < 0)
        goto fail;
    const char *qemu = o.qemu, *kit = o.kit;
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
        if (dsec_backend_layer_cache(cfg, be->state_dir, o.cache_gb << 30, &be->cache, err) < 0) {
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
    dsec_sbx_store_fini(&be->sbx);
    pthread_cond_destroy(&be->built);
    dsec_free(be);
}

/* ---- sandbox records ---------------------------------------------------------------------- */

dsec_sandbox *dsec__vm_sb_new(const struct vm_backend *be, const char *id, dsec_err *err)
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

void dsec__vm_sb_free(dsec_sandbox *sb)
{
    dsec__vm_env_clear(&sb->env);
    dsec_sbx_strv_clear(&sb->net_entries, &sb->nnet);
    dsec_free(sb->net_state);
    dsec_free(sb->tenant);
    if (sb->guest.tap_fd >= 0)
        close(sb->guest.tap_fd);
    dsec_free(sb);
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
int dsec__vm_hold_layers(struct vm_backend *be, dsec_sandbox *sb, dsec_err *err)
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
    dsec__vm_side_drop(sb);
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
    dsec_sbx_live_del(&be->sbx, &sb->live);
    dsec__vm_sb_free(sb);
    return 0;
}

/* A QEMU quitting for a destroy (stop_start): asked with SIGTERM, as QMP's quit would, and
 * killed once its grace has passed. */
struct vm_stop {
    dsec_sandbox *sb;
    bool killed;
    dsec_ready_fn done;
    void *ud;
};

static int stop_tick(void *ud, uint64_t ms, dsec_err *err)
{
    struct vm_stop *st = ud;
    dsec_sandbox *sb = st->sb;
    if (!dsec__vm_qemu_is_ours(sb->pid, sb->dir))
        return 1;
    if (!st->killed && ms >= STOP_GRACE_MS) {
        kill(sb->pid, SIGKILL);
        st->killed = true;
    }
    if (ms > STOP_GRACE_MS + 30000)
        return dsec_err_set(err, DSEC_E_TIMEOUT, 0, "QEMU (pid %d) did not exit after SIGKILL",
                            (int)sb->pid);
    return 0;
}

static void stop_done(void *ud, int rc, dsec_err *err)
{
    struct vm_stop st = *(struct vm_stop *)ud;
    dsec_free(ud);
    st.done(st.ud, rc, err);
}

static int vm_stop_start(void *self, dsec_sandbox *sb, struct dsec_loop *loop, dsec_ready_fn done,
                         void *ud, dsec_err *err)
{
    struct vm_backend *be = self;
    dsec__vm_side_drop(sb);
    dsec_agent_free(sb->agent);
    sb->agent = NULL;
    if (sb->pid <= 0 || !dsec__vm_qemu_is_ours(sb->pid, sb->dir))
        return 1;
    struct vm_stop *st = dsec_malloc(sizeof *st);
    if (st == NULL)
        return oom(be, err, "a stop in flight");
    *st = (struct vm_stop){.sb = sb, .done = done, .ud = ud};
    kill(sb->pid, SIGTERM);
    if (dsec_loop_tick_start(loop, 10, stop_tick, stop_done, st, err) < 0) {
        dsec_free(st);
        return -1;
    }
    return 0;
}

static int store_teardown(void *be, dsec_sandbox *sb, dsec_err *err)
{
    return sb_teardown(be, sb, err);
}

/* A record whose teardown failed is dropped all the same. */
static void store_discard(void *be, dsec_sandbox *sb)
{
    dsec_sbx_live_del(&((struct vm_backend *)be)->sbx, &sb->live);
    dsec__vm_sb_free(sb);
}

static const char *store_id(const dsec_sandbox *sb)
{
    return sb->id;
}

static void sweep(void *be);

static const struct dsec_sbx_ops vm_store_ops = {
    .teardown = store_teardown, .discard = store_discard, .id = store_id, .sweep = sweep};

/*
 * The sweep: QEMU processes and directories an earlier node manager left
 * and never re-adopted. Every QEMU whose command line names a sandbox dir
 * of this instance that no record holds is killed, and the dir removed;
 * fork snapshots (transient) and half-made images go too.
 */

/* The sandbox id a QEMU's command line names below be->sbroot, or "" (id has room for one). */
static void proc_sandbox(const struct vm_backend *be, pid_t pid, char *id, size_t len)
{
    id[0] = '\0';
    char needle[PATH_MAX + 8], p[64];
    int nd = dsec__vm_fmt(needle, sizeof needle, "%s/", be->sbroot);
    dsec__vm_fmt(p, sizeof p, "/proc/%d/cmdline", (int)pid);
    int fd = open(p, O_RDONLY | O_CLOEXEC);
    char buf[1 << 16];
    ssize_t got = fd >= 0 ? read(fd, buf, sizeof buf - 1) : -1;
    if (fd >= 0)
        close(fd);
    if (got <= 0)
        return;
    for (ssize_t i = 0; i < got; i++)
        if (buf[i] == '\0')
            buf[i] = ' ';
    buf[got] = '\0';
    const char *at = strstr(buf, needle);
    if (at == NULL)
        return;
    at += nd;
    size_t idl = strcspn(at, "/ ,");
    if (idl == 0 || idl >= len)
        return;
    memcpy(id, at, idl);
    id[idl] = '\0';
}

static int sweep_proc(void *arg, int dfd, const char *name)
{
    (void)dfd;
    struct vm_backend *be = arg;
    if (name[0] < '1' || name[0] > '9')
        return 0;
    pid_t pid = (pid_t)strtol(name, NULL, 10);
    if (pid == getpid() || !dsec__vm_qemu_is_ours(pid, be->sbroot))
        return 0;
    char id[DSEC_SBX_ID_LEN_MAX + 2];
    proc_sandbox(be, pid, id, sizeof id);
    if (id[0] == '\0' || dsec_sbx_live_has(&be->sbx, id))
        return 0;
    dsec_sandbox tmp = {.pid = pid};
    dsec__vm_fmt(tmp.dir, sizeof tmp.dir, "%s/%s", be->sbroot, id);
    dsec_err err;
    kill(pid, SIGKILL);
    return dsec__vm_qemu_stop(&tmp, 0, &err) == 0;
}

/* An entry of dir (S/sb: unless a held sandbox's; S/forks: every one) removed. */
struct sweep_rm {
    struct vm_backend *be;
    const char *dir;
    bool unheld;
};

static int sweep_rm(void *arg, int dfd, const char *name)
{
    (void)dfd;
    const struct sweep_rm *s = arg;
    if (name[0] == '.' || (s->unheld && dsec_sbx_live_has(&s->be->sbx, name)))
        return 0;
    char p[PATH_MAX + 300];
    dsec__vm_fmt(p, sizeof p, "%s/%s", s->dir, name);
    return dsec__vm_rmtree(p) == 0;
}

/* Half-made images (*.tmp). */
static int sweep_tmp(void *arg, int dfd, const char *name)
{
    (void)arg;
    size_t l = strlen(name);
    if (l > 4 && strcmp(name + l - 4, ".tmp") == 0)
        unlinkat(dfd, name, 0);
    return 0;
}

static void sweep(void *self)
{
    struct vm_backend *be = self;
    int procs = dsec_sbx_dir_each("/proc", sweep_proc, be);
    struct sweep_rm sb = {be, be->sbroot, true}, forks = {be, be->forks, false};
    int dirs = dsec_sbx_dir_each(be->sbroot, sweep_rm, &sb);
    dsec_sbx_dir_each(be->forks, sweep_rm, &forks);
    dsec_sbx_dir_each(be->images, sweep_tmp, NULL);
    /* images an earlier node manager left behind after their layers went */
    dsec__vm_images_gc(be);
    if (procs > 0 || dirs > 0)
        dsec_log_info("dsec %s: reclaimed %d QEMU processes and %d sandbox directories left by an "
                      "earlier node manager",
                      be->type, procs, dirs);
}

/* ---- booting ------------------------------------------------------------------------------- */

void dsec__vm_random_hex(char *out, size_t nbytes)
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
void dsec__vm_hostname(const char *id, char *out, size_t len)
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
        dsec__vm_hostname(sb->id, host, sizeof host);
        dsec__vm_random_hex(mid, 16);
        dsec__vm_fmt(epoch, sizeof epoch, "%lld", (long long)time(NULL));
        fprintf(f, "DSEC_NLAYERS='%zu'\n", sb->env.nlayers);
        int bad = conf_val(f, "DSEC_HOSTNAME", host) | conf_val(f, "DSEC_MACHINE_ID", mid) |
                  conf_val(f, "DSEC_EPOCH", epoch) |
                  conf_val(f, "DSEC_WORKDIR", sb->env.base.workdir) |
                  conf_val(f, "DSEC_USER", sb->env.base.user);
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
        for (size_t i = 0; i < sb->env.base.nvars; i++)
            fprintf(g, "%s\n", sb->env.base.vars[i]);
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
int dsec__vm_net_attach(struct vm_backend *be, dsec_sandbox *sb, dsec_err *err)
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

void dsec__vm_trace_step(const dsec_sandbox *sb, const char *step, uint64_t *t)
{
    uint64_t now = dsec_now_ns();
    if (trace())
        dsec_log_info("dsec vm %s: %s %.1f ms", sb->id, step, (double)(now - *t) / 1e6);
    *t = now;
}

/* Connect to sb's agent within timeout_ms, in rounds of a second, so that a guest that died
 * (init failed and powered off) is reported soon, with what its console said. */
int dsec__vm_agent_dial(struct vm_backend *be, dsec_sandbox *sb, uint64_t timeout_ms, dsec_err *err)
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

int dsec__vm_boot_launch(struct vm_backend *be, dsec_sandbox *sb, const char *state, dsec_err *err)
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
    if (dsec__vm_write_meta(be, sb, err) < 0)
        return -1;
    dsec__vm_trace_step(sb, "QEMU started", &t);
    if (dsec__vm_qemu_wait_ready(sb, 30000, err) < 0)
        return dsec_err_wrap(err, "%s", be->type);
    dsec__vm_trace_step(sb, "QMP ready", &t);
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
        dsec__vm_trace_step(sb, "state loaded", &t);
    }
    return 0;
}

/* Start QEMU for sb (a cold boot, or loading state when not NULL) and connect to its agent. */
int dsec__vm_boot(struct vm_backend *be, dsec_sandbox *sb, const char *state, dsec_err *err)
{
    if (dsec__vm_boot_launch(be, sb, state, err) < 0)
        return -1;
    uint64_t t = dsec_now_ns();
    if (dsec__vm_agent_dial(be, sb, be->boot_timeout_ms, err) < 0)
        return -1;
    dsec__vm_trace_step(sb, "agent answered", &t);
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

int dsec__vm_copy_net(dsec_sandbox *sb, const char *tenant, const char *const *net, size_t n)
{
    dsec_free(sb->tenant);
    sb->tenant = tenant != NULL ? dsec_strdup(tenant) : NULL;
    if (tenant != NULL && sb->tenant == NULL)
        return -1;
    return dsec_sbx_strv_add(&sb->net_entries, &sb->nnet, net, n);
}

/* Make sb's dir and list it (before anything else of it exists). */
int dsec__vm_sb_mkdir(struct vm_backend *be, dsec_sandbox *sb, dsec_err *err)
{
    if (mkdir(sb->dir, 0700) < 0)
        return errno == EEXIST
                   ? dsec_err_set(err, DSEC_E_EXISTS, 0, "%s: a sandbox with this id exists",
                                  be->type)
                   : dsec_err_set(err, DSEC_E_IO, errno, "%s: creating %s", be->type, sb->dir);
    sb->made_dir = true;
    dsec_sbx_live_add(&be->sbx, &sb->live, sb->id, sb->id);
    return 0;
}

/* A cold create up to QEMU: *out made and listed, with its layers, network, disk and memory
 * file. -1: nothing is left. */
static int create_prepare(struct vm_backend *be, const dsec_sandbox_spec *spec, dsec_sandbox **out,
                          dsec_err *err)
{
    dsec_sandbox *sb = dsec__vm_sb_new(be, spec->id, err);
    if (sb == NULL)
        return -1;
    dsec_sbx_sweep_once(&be->sbx);
    sb->mem_mb = pick_mem(be, spec->memory_mb);
    sb->disk_mb = spec->disk_mb != 0 ? spec->disk_mb : DISK_MB_DEFAULT;
    sb->cpu_milli = spec->cpu_milli;
    sb->smp = pick_smp(be, spec->cpu_milli);
    int rc = check_sizes(be, sb, err);
    if (rc == 0)
        rc = env_from_spec(be, spec, &sb->env, err);
    if (rc == 0 && dsec__vm_copy_net(sb, spec->tenant, spec->net, spec->nnet) < 0)
        rc = oom(be, err, "network policy");
    if (rc < 0 || dsec__vm_sb_mkdir(be, sb, err) < 0) {
        dsec__vm_sb_free(sb); /* not listed yet */
        return -1;
    }
    rc = dsec__vm_hold_layers(be, sb, err);
    if (rc == 0)
        rc = dsec__vm_net_attach(be, sb, err);
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
    if (rc < 0) {
        dsec_sbx_abandon(&be->sbx, sb);
        return -1;
    }
    *out = sb;
    return 0;
}

static int vm_create(void *self, const dsec_sandbox_spec *spec, dsec_sandbox **out,
                     char **backend_state, dsec_err *err)
{
    struct vm_backend *be = self;
    *out = NULL;
    *backend_state = NULL;
    dsec_sandbox *sb;
    if (create_prepare(be, spec, &sb, err) < 0)
        return -1;
    int rc = dsec__vm_boot(be, sb, NULL, err);
    if (rc == 0 && (*backend_state = dsec_strdup(sb->dir)) == NULL)
        rc = oom(be, err, "backend state");
    if (rc < 0) {
        dsec_sbx_abandon(&be->sbx, sb);
        return -1;
    }
    *out = sb;
    return 0;
}

/* A boot whose wait for the agent is the node's loop's (create_start). */
struct vm_ready {
    struct vm_backend *be;
    dsec_sandbox *sb;
    dsec_ready_fn done;
    void *ud;
    uint64_t t;
};

/* Asked every second of the wait: a guest that powered off is reported at once. */
static bool ready_alive(void *ud, dsec_err *err)
{
    struct vm_ready *r = ud;
    if (dsec__vm_qemu_is_ours(r->sb->pid, r->sb->dir))
        return true;
    boot_error(r->be, r->sb, true, 0, err);
    return false;
}

static void ready_dialed(void *ud, int rc, dsec_agent *a, dsec_err *err)
{
    struct vm_ready r = *(struct vm_ready *)ud;
    dsec_free(ud);
    if (rc == 0) {
        r.sb->agent = a;
        dsec__vm_trace_step(r.sb, "agent answered", &r.t);
    } else if (err->code == DSEC_E_TIMEOUT) { /* what the console says, as a wait on a thread */
        boot_error(r.be, r.sb, !dsec__vm_qemu_is_ours(r.sb->pid, r.sb->dir), r.be->boot_timeout_ms,
                   err);
    }
    r.done(r.ud, rc, err);
}

int dsec__vm_ready_start(struct vm_backend *be, dsec_sandbox *sb, struct dsec_loop *loop,
                         dsec_ready_fn done, void *ud, dsec_err *err)
{
    struct vm_ready *r = dsec_malloc(sizeof *r);
    if (r == NULL)
        return oom(be, err, "a boot in flight");
    *r = (struct vm_ready){.be = be, .sb = sb, .done = done, .ud = ud, .t = dsec_now_ns()};
    char sp[PATH_MAX + 16];
    agent_path(sb, "agent.sock", sp, sizeof sp);
    /* in rounds of a second, as dsec__vm_agent_dial */
    if (dsec_agent_connect_start(loop, sp, be->boot_timeout_ms, 1000, ready_alive, ready_dialed, r,
                                 err) < 0) {
        dsec_free(r);
        return -1;
    }
    return 0;
}

/* vm_create whose boot is waited for on loop: the guest's seconds of boot hold no thread. */
static int vm_create_start(void *self, const dsec_sandbox_spec *spec, struct dsec_loop *loop,
                           dsec_ready_fn done, void *ud, dsec_sandbox **out, char **backend_state,
                           dsec_err *err)
{
    struct vm_backend *be = self;
    *out = NULL;
    *backend_state = NULL;
    dsec_sandbox *sb;
    if (create_prepare(be, spec, &sb, err) < 0)
        return -1;
    int rc = dsec__vm_boot_launch(be, sb, NULL, err);
    if (rc == 0 && (*backend_state = dsec_strdup(sb->dir)) == NULL)
        rc = oom(be, err, "backend state");
    if (rc == 0) {
        /* the caller's before the wait starts: ready_dialed may run before this returns */
        *out = sb;
        rc = dsec__vm_ready_start(be, sb, loop, done, ud, err);
    }
    if (rc < 0) {
        *out = NULL;
        dsec_free(*backend_state);
        *backend_state = NULL;
        dsec_sbx_abandon(&be->sbx, sb);
        return -1;
    }
    return 0;
}

/* ---- destroy, stats, adopt, detach, network ---------------------------------------------------
 */

static int vm_destroy(void *self, dsec_sandbox *sb, dsec_err *err)
{
    dsec_sbx_sweep_once(&((struct vm_backend *)self)->sbx);
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
    char *stat = dsec_sbx_read_file(p, 4096);
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
    int rc = dsec__vm_read_rec(be, mp, "dsec-vm 1", sb, type, sizeof type, err);
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
        dsec__vm_sb_free(sb);
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
            dsec__vm_sb_free(sb);
        return -1;
    }
    if (dsec__vm_hold_layers(be, sb, err) < 0) {
        /* leave it running: a later adopt may find the layer again */
        release_layers(be, sb);
        dsec__vm_sb_free(sb);
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
            dsec__vm_sb_free(sb);
            return dsec_err_wrap(err, "%s: adopting its network", be->type);
        }
    }
    if (!sb->paused && dsec__vm_agent_dial(be, sb, 10000, err) < 0)
        sb->agent = NULL; /* exec reconnects or reports it; destroy still works */
    dsec_err_clear(err);
    dsec_sbx_live_add(&be->sbx, &sb->live, sb->id, sb->id);
    *out = sb;
    return 0;
}

static void vm_detach(void *self, dsec_sandbox *sb)
{
    struct vm_backend *be = self;
    dsec_sbx_live_del(&be->sbx, &sb->live);
    /* QEMU reads the layers' images in S/images, not the cache's directories, so
     * the cache may let them go; adopt takes them again */
    release_layers(be, sb);
    dsec__vm_side_drop(sb);
    dsec_agent_free(sb->agent);
    dsec_net_release(sb->net);
    dsec__vm_sb_free(sb);
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
    /* remembered for forks and for adoption after a restart (the tenant stays) */
    dsec_sbx_strv_clear(&sb->net_entries, &sb->nnet);
    if (dsec_sbx_strv_add(&sb->net_entries, &sb->nnet, entries, n) < 0)
        return oom(be, err, "network policy");
    if (dsec__vm_write_meta(be, sb, err) < 0)
        return dsec_err_wrap(err, "%s: the policy is applied but not recorded", be->type);
    return 0;
}

#define VM_OPS(name, typestr, initfn)                                                              \
    const dsec_backend_ops name = {                                                                \
        .type = typestr,                                                                           \
        .init = initfn,                                                                            \
        .fini = vm_fini,                                                                           \
        .create = vm_create,                                                                       \
        .create_start = vm_create_start,                                                           \
        .exec = dsec__vm_exec,                                                                     \
        .exec_start = dsec__vm_exec_start,                                                         \
        .default_cmd = dsec__vm_default_cmd,                                                       \
        .file_write = dsec__vm_file_write,                                                         \
        .file_read = dsec__vm_file_read,                                                           \
        .file_write_start = dsec__vm_file_write_start,                                             \
        .file_read_start = dsec__vm_file_read_start,                                               \
        .file_list = dsec__vm_file_list,                                                           \
        .file_op = dsec__vm_file_op,                                                               \
        .fork = dsec__vm_fork,                                                                     \
        .fork_start = dsec__vm_fork_start,                                                         \
        .pause = dsec__vm_pause,                                                                   \
        .resume = dsec__vm_resume,                                                                 \
        .snapshot = dsec__vm_snapshot,                                                             \
        .restore = dsec__vm_restore,                                                               \
        .destroy = vm_destroy,                                                                     \
        .stop_start = vm_stop_start,                                                               \
        .stats = vm_stats,                                                                         \
        .adopt = vm_adopt,                                                                         \
        .detach = vm_detach,                                                                       \
        .net_set = vm_net_set,                                                                     \
        .proc_start = dsec__vm_proc_start,                                                         \
        .proc_list = dsec__vm_proc_list,                                                           \
        .proc_signal = dsec__vm_proc_signal,                                                       \
        .proc_stdin = dsec__vm_proc_stdin,                                                         \
        .proc_output = dsec__vm_proc_output,                                                       \
        .proc_resize = dsec__vm_proc_resize,                                                       \
        .proc_follow_start = dsec__vm_proc_follow_start,                                           \
        .proc_stdin_start = dsec__vm_proc_stdin_start,                                             \
    }

VM_OPS(dsec_microvm_ops, "microvm", microvm_init);
VM_OPS(dsec_vm_ops, "vm", q35_init);
