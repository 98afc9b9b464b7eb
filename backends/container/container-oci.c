/* container-oci.c - the OCI bundle config (config.json) of a container sandbox: the agent as
 * init, limits, namespaces, a conservative capability set, seccomp and masked paths. */
#define _GNU_SOURCE
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "backends/container/container-int.h"
#include "dsec/alloc.h"

/* A growing text buffer; an allocation failure sticks and is reported once at the end. */
struct buf {
    char *p;
    size_t len, cap;
    bool oom;
};

static void put(struct buf *b, const char *s, size_t n)
{
    if (b->oom)
        return;
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 8192;
        while (cap < b->len + n + 1)
            cap *= 2;
        char *p = dsec_realloc(b->p, cap);
        if (p == NULL) {
            b->oom = true;
            return;
        }
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

static void puts_(struct buf *b, const char *s)
{
    put(b, s, strlen(s));
}

static void __attribute__((format(printf, 2, 3))) putf(struct buf *b, const char *fmt, ...)
{
    char tmp[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    if (n > 0)
        put(b, tmp, (size_t)n < sizeof tmp ? (size_t)n : sizeof tmp - 1);
}

/* A JSON string literal. */
static void jstr(struct buf *b, const char *s)
{
    put(b, "\"", 1);
    for (const unsigned char *c = (const unsigned char *)s; *c; c++) {
        if (*c == '"' || *c == '\\') {
            char e[2] = {'\\', (char)*c};
            put(b, e, 2);
        } else if (*c < 0x20) {
            char e[8];
            dsec__ct_fmt(e, sizeof e, "\\u%04x", *c);
            put(b, e, 6);
        } else {
            put(b, (const char *)c, 1);
        }
    }
    put(b, "\"", 1);
}

static void jstrs(struct buf *b, const char *const *v, size_t n)
{
    puts_(b, "[");
    for (size_t i = 0; i < n; i++) {
        if (i)
            puts_(b, ",");
        jstr(b, v[i]);
    }
    puts_(b, "]");
}

static const char *const caps[] = {
    "CAP_CHOWN",  "CAP_DAC_OVERRIDE", "CAP_FOWNER",  "CAP_FSETID",           "CAP_KILL",
    "CAP_SETGID", "CAP_SETUID",       "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT",
};

/* Denied outright (EPERM): kernel, mount, namespace, tracing and keyring
 * interfaces a sandboxed workload has no business with. */
static const char *const denied[] = {
    "kexec_load",
    "kexec_file_load",
    "init_module",
    "finit_module",
    "delete_module",
    "mount",
    "umount2",
    "pivot_root",
    "swapon",
    "swapoff",
    "reboot",
    "bpf",
    "perf_event_open",
    "ptrace",
    "process_vm_readv",
    "process_vm_writev",
    "keyctl",
    "add_key",
    "request_key",
    "open_by_handle_at",
    "name_to_handle_at",
    "userfaultfd",
    "unshare",
    "setns",
    "iopl",
    "ioperm",
    "acct",
    "settimeofday",
    "clock_settime",
    "quotactl",
    "lookup_dcookie",
    "fanotify_init",
    "move_mount",
    "fsopen",
    "fsmount",
    "fsconfig",
    "open_tree",
    "fspick",
    "mount_setattr",
    "kcmp",
    "uselib",
    "nfsservctl",
    "pidfd_getfd",
    "syslog", /* the host's kernel log: dmesg_restrict=0 would let anyone read it */
};

/* clone flags that make a namespace; a clone carrying any of them is denied
 * (one rule per flag: libseccomp has no "masked not-equal"). */
static const uint64_t ns_flags[] = {
    0x00020000, /* CLONE_NEWNS */
    0x02000000, /* CLONE_NEWCGROUP */
    0x04000000, /* CLONE_NEWUTS */
    0x08000000, /* CLONE_NEWIPC */
    0x10000000, /* CLONE_NEWUSER */
    0x20000000, /* CLONE_NEWPID */
    0x40000000, /* CLONE_NEWNET */
    0x00000080, /* CLONE_NEWTIME */
};

/* ioctls that reach below the overlay into the shared layers' extents. */
static const uint64_t denied_ioctls[] = {
    0x40049409, /* FICLONE */
    0x4020940d, /* FICLONERANGE */
    0xc0189436, /* FIDEDUPERANGE */
    0xc020660b, /* FS_IOC_FIEMAP */
    0xc028660f, /* EXT4_IOC_MOVE_EXT: swaps extents between two files */
};

static const char *const masked[] = {
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
    "/sys/devices/virtual/powercap",
    "/proc/kpagecgroup",
    "/proc/kpageflags",
    "/proc/kpagecount",
};

static const char *const readonly[] = {
    "/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger",
};

static void seccomp(struct buf *b)
{
    /* No "architectures": only the native ABI is allowed at all, so the
     * 32-bit entry points cannot go around the rules. */
    puts_(b, "\"seccomp\":{\"defaultAction\":\"SCMP_ACT_ALLOW\",\"syscalls\":[");
    puts_(b, "{\"names\":");
    jstrs(b, denied, sizeof denied / sizeof denied[0]);
    puts_(b, ",\"action\":\"SCMP_ACT_ERRNO\",\"errnoRet\":1}");
    /* clone3 passes its flags in memory seccomp cannot read: ENOSYS makes
     * the C library fall back to clone, whose flags are checked below. */
    puts_(b, ",{\"names\":[\"clone3\"],\"action\":\"SCMP_ACT_ERRNO\",\"errnoRet\":38}");
    for (size_t i = 0; i < sizeof ns_flags / sizeof ns_flags[0]; i++)
        putf(b,
             ",{\"names\":[\"clone\"],\"action\":\"SCMP_ACT_ERRNO\",\"errnoRet\":1,"
             "\"args\":[{\"index\":0,\"value\":%" PRIu64 ",\"valueTwo\":%" PRIu64
             ",\"op\":\"SCMP_CMP_MASKED_EQ\"}]}",
             ns_flags[i], ns_flags[i]);
    /* The kernel takes ioctl's request as an unsigned int, seccomp sees all 64
     * bits: an exact match would miss FICLONE with junk in the upper half. */
    for (size_t i = 0; i < sizeof denied_ioctls / sizeof denied_ioctls[0]; i++)
        putf(b,
             ",{\"names\":[\"ioctl\"],\"action\":\"SCMP_ACT_ERRNO\",\"errnoRet\":1,"
             "\"args\":[{\"index\":1,\"value\":4294967295,\"valueTwo\":%" PRIu64
             ",\"op\":\"SCMP_CMP_MASKED_EQ\"}]}",
             denied_ioctls[i]);
    puts_(b, "]}");
}

static void mounts(struct buf *b, const struct ct_backend *be, const dsec_sandbox *sb)
{
    puts_(b, "\"mounts\":["
             "{\"destination\":\"/proc\",\"type\":\"proc\",\"source\":\"proc\","
             "\"options\":[\"nosuid\",\"noexec\",\"nodev\"]},"
             "{\"destination\":\"/dev\",\"type\":\"tmpfs\",\"source\":\"tmpfs\","
             "\"options\":[\"nosuid\",\"strictatime\",\"mode=755\",\"size=65536k\"]},"
             "{\"destination\":\"/dev/pts\",\"type\":\"devpts\",\"source\":\"devpts\","
             "\"options\":[\"nosuid\",\"noexec\",\"newinstance\",\"ptmxmode=0666\","
             "\"mode=0620\",\"gid=5\"]},"
             "{\"destination\":\"/dev/shm\",\"type\":\"tmpfs\",\"source\":\"shm\","
             "\"options\":[\"nosuid\",\"noexec\",\"nodev\",\"mode=1777\",\"size=65536k\"]},"
             "{\"destination\":\"/dev/mqueue\",\"type\":\"mqueue\",\"source\":\"mqueue\","
             "\"options\":[\"nosuid\",\"noexec\",\"nodev\"]},"
             "{\"destination\":\"/sys\",\"type\":\"sysfs\",\"source\":\"sysfs\","
             "\"options\":[\"nosuid\",\"noexec\",\"nodev\",\"ro\"]},");
    if (sb->net != NULL) { /* the node-local resolver, the only one it has */
        char rc[PATH_MAX + 16];
        dsec__ct_fmt(rc, sizeof rc, "%s/resolv.conf", sb->dir);
        puts_(b, "{\"destination\":\"/etc/resolv.conf\",\"type\":\"bind\",\"source\":");
        jstr(b, rc);
        puts_(b, ",\"options\":[\"bind\",\"ro\",\"nosuid\",\"nodev\",\"noexec\"]},");
    }
    puts_(b, "{\"destination\":\"/.dsec/agent\",\"type\":\"bind\",\"source\":");
    jstr(b, be->agent);
    puts_(b, ",\"options\":[\"bind\",\"ro\",\"nosuid\",\"nodev\"]}]");
}

static void resources(struct buf *b, const struct ct_backend *be, const dsec_sandbox *sb)
{
    puts_(b, "\"resources\":{\"devices\":[{\"allow\":false,\"access\":\"rwm\"},"
             "{\"allow\":true,\"type\":\"c\",\"major\":1,\"minor\":3,\"access\":\"rwm\"},"
             "{\"allow\":true,\"type\":\"c\",\"major\":1,\"minor\":5,\"access\":\"rwm\"},"
             "{\"allow\":true,\"type\":\"c\",\"major\":1,\"minor\":7,\"access\":\"rwm\"},"
             "{\"allow\":true,\"type\":\"c\",\"major\":1,\"minor\":8,\"access\":\"rwm\"},"
             "{\"allow\":true,\"type\":\"c\",\"major\":1,\"minor\":9,\"access\":\"rwm\"},"
             "{\"allow\":true,\"type\":\"c\",\"major\":5,\"minor\":0,\"access\":\"rwm\"},"
             "{\"allow\":true,\"type\":\"c\",\"major\":5,\"minor\":2,\"access\":\"rwm\"},"
             "{\"allow\":true,\"type\":\"c\",\"major\":136,\"access\":\"rwm\"}]");
    putf(b, ",\"pids\":{\"limit\":%" PRIu64 "}", be->pids_max);
    if (sb->memory_mb != 0) {
        uint64_t bytes = sb->memory_mb << 20;
        putf(b, ",\"memory\":{\"limit\":%" PRIu64, bytes);
        /* swap = limit: memory plus swap may not exceed the limit, so no swap */
        if (be->cg_mode == CT_CG_V2 || be->memsw)
            putf(b, ",\"swap\":%" PRIu64, bytes);
        puts_(b, "}");
    }
    if (sb->cpu_milli != 0) {
        uint64_t quota = sb->cpu_milli * 100; /* of a 100 ms period */
        if (quota < 1000)
            quota = 1000;
        putf(b, ",\"cpu\":{\"quota\":%" PRIu64 ",\"period\":100000}", quota);
    }
    puts_(b, "}");
}

int dsec__ct_oci_write(const struct ct_backend *be, const dsec_sandbox *sb, dsec_err *err)
{
    struct buf b = {0};
    const struct dsec_sbx_env *e = &sb->env.base;
    puts_(&b, "{\"ociVersion\":\"1.0.2\",\"process\":{\"terminal\":false,"
              "\"user\":{\"uid\":0,\"gid\":0},\"args\":[\"/.dsec/agent\",\"--listen-fd\",\"3\"");
    for (size_t i = 0; i < e->nvars; i++) {
        puts_(&b, ",\"--env\",");
        jstr(&b, e->vars[i]);
    }
    puts_(&b, ",\"--workdir\",");
    jstr(&b, e->workdir ? e->workdir : "/");
    puts_(&b, ",\"--user\",");
    jstr(&b, e->user ? e->user : "root");
    puts_(&b, "],\"env\":[\"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin\"");
    for (size_t i = 0; i < e->nvars; i++) {
        puts_(&b, ",");
        jstr(&b, e->vars[i]);
    }
    puts_(&b, "],\"cwd\":\"/\",\"capabilities\":{\"bounding\":");
    size_t ncaps = sizeof caps / sizeof caps[0];
    jstrs(&b, caps, ncaps);
    puts_(&b, ",\"effective\":");
    jstrs(&b, caps, ncaps);
    puts_(&b, ",\"permitted\":");
    jstrs(&b, caps, ncaps);
    /* rlimits: the node's own (a sandbox cannot raise a hard limit the node lacks) */
    puts_(&b, "},\"noNewPrivileges\":true},");
    puts_(&b, "\"root\":{\"path\":\"rootfs\",\"readonly\":false},\"hostname\":");
    char host[64];
    dsec__ct_fmt(host, sizeof host, "%s", sb->id);
    jstr(&b, host);
    puts_(&b, ",");
    mounts(&b, be, sb);
    puts_(&b, ",\"linux\":{");
    resources(&b, be, sb);
    putf(&b, ",\"cgroupsPath\":\"/%s/%s\"", be->cg_parent, sb->rid);
    puts_(&b, ",\"namespaces\":[{\"type\":\"pid\"},{\"type\":\"ipc\"},{\"type\":\"uts\"},"
              "{\"type\":\"mount\"},{\"type\":\"cgroup\"},{\"type\":\"network\"");
    /* with containment: the namespace the node prepared (veth, policy);
     * without: a new empty one, which reaches nothing at all */
    if (sb->net != NULL) {
        puts_(&b, ",\"path\":");
        jstr(&b, dsec_net_sbx_netns(sb->net));
    }
    puts_(&b, "}],");
    puts_(&b, "\"maskedPaths\":");
    jstrs(&b, masked, sizeof masked / sizeof masked[0]);
    puts_(&b, ",\"readonlyPaths\":");
    jstrs(&b, readonly, sizeof readonly / sizeof readonly[0]);
    puts_(&b, ",");
    seccomp(&b);
    puts_(&b, "}}\n");
    if (b.oom) {
        dsec_free(b.p);
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "container: building config.json");
    }
    char path[PATH_MAX + 16];
    dsec__ct_fmt(path, sizeof path, "%s/config.json", sb->dir);
    int rc = dsec__ct_write_file(path, b.p, b.len, err);
    dsec_free(b.p);
    return rc;
}
