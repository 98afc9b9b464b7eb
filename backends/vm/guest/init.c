/* init.c - the microVM's /init (static): load drivers, assemble the sandbox root, start dsec-agent.
 */
/*
 * The contract with the host is in docs/vm.md ("Inside the guest"). Disks are found by their
 * virtio serial (dsec-disk, dsec-l0..), the sandbox's settings come from dsec-disk's
 * /dsec/conf, and the agent serves the virtio-serial ports dsec.agent and dsec.ctl.
 * Any failure prints "dsec-init: <step> failed: <why>" on the console and powers off, so the
 * host finds the reason in console.log and QEMU exits.
 *
 * Why C and not a shell script: under emulation (TCG) every process the guest starts costs
 * tens of milliseconds, and a shell init started some fifty of them on the boot path. This
 * program starts none, except identity.sh for a sandbox with a network (its `ip` steps).
 *
 * The initrd (scripts/build-vmkit.sh) holds, beside this program:
 *   /dsec/        dsec-agent, busybox, identity.sh: bound read-only at the new root's /.dsec
 *   /lower/       the busybox world (bin/busybox and its applet links, etc/passwd, ...): the
 *                 overlay's lower directory when the sandbox has no layers
 *   /lib/modules/ the drivers, and load.order: "GROUP FILE" lines, dependencies first.
 *                 Groups: base (always), pci (only on a machine with a PCI bus), net (only
 *                 when the sandbox has a network), layers (only when it has layers).
 * The initramfs is not emptied at the hand-over: /lower and /dsec stay in use from it.
 * Everything here is fixed-size buffers; nothing is freed because nothing is allocated.
 */
#define _GNU_SOURCE
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <net/if.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/reboot.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WAIT_MS 10000 /* for a disk, a port or eth0 to appear */

static bool has_pci;

static void fail(const char *step, const char *fmt, ...)
    __attribute__((format(printf, 2, 3), noreturn));
static void fail(const char *step, const char *fmt, ...)
{
    char why[768];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, sizeof why, fmt, ap);
    va_end(ap);
    dprintf(2, "dsec-init: %s failed: %s\n", step, why);
    sync();
    reboot(RB_POWER_OFF);
    sleep(2);
    reboot(RB_AUTOBOOT); /* poweroff unsupported by the machine: reboot=t makes QEMU end */
    for (;;)
        pause(); /* never exit: PID 1 exiting is a kernel panic */
}

static void msleep(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static void do_mount(const char *step, const char *src, const char *dst, const char *type,
                     unsigned long flags, const char *opts)
{
    if (mount(src, dst, type, flags, opts) < 0)
        fail(step, "mount %s on %s (%s): %s", src ? src : "-", dst, type ? type : "-",
             strerror(errno));
}

static void mkdir_p(const char *step, const char *path, mode_t mode)
{
    char p[4096];
    snprintf(p, sizeof p, "%s", path);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/')
            continue;
        *s = '\0';
        if (mkdir(p, 0755) < 0 && errno != EEXIST)
            fail(step, "mkdir %s: %s", p, strerror(errno));
        *s = '/';
    }
    if (mkdir(p, mode) < 0 && errno != EEXIST)
        fail(step, "mkdir %s: %s", p, strerror(errno));
}

/* The first line of a small file, without its newline, or "" when it cannot be read. */
static const char *read_line(const char *path, char *out, size_t len)
{
    out[0] = '\0';
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return out;
    ssize_t n = read(fd, out, len - 1);
    close(fd);
    out[n > 0 ? n : 0] = '\0';
    out[strcspn(out, "\n")] = '\0';
    return out;
}

/* ---- drivers ---------------------------------------------------------------------------- */

/* Load, in load.order's order, the modules of group, with finit_module from this process (no
 * insmod process per module). Loading the independent ones from threads side by side was
 * tried: the boot was no faster (one vCPU; the work only moved to the first disk access). */
static void load_modules(const char *group)
{
    FILE *f = fopen("/lib/modules/load.order", "re");
    if (f == NULL)
        fail("modules", "/lib/modules/load.order: %s", strerror(errno));
    char line[256], g[32], ko[200], path[256];
    while (fgets(line, sizeof line, f) != NULL) {
        if (sscanf(line, "%31s %199s", g, ko) != 2)
            fail("modules", "bad line in /lib/modules/load.order: %s", line);
        if (strcmp(g, group) != 0)
            continue;
        snprintf(path, sizeof path, "/lib/modules/%s", ko);
        int fd = open(path, O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            fail("modules", "%s: %s", path, strerror(errno));
        if (syscall(SYS_finit_module, fd, "", 0) < 0 && errno != EEXIST)
            fail("modules", "loading %s: %s", ko, strerror(errno));
        close(fd);
    }
    fclose(f);
}

/* The module files are not needed after the boot: give their memory back to the guest. */
static void drop_modules(void)
{
    DIR *d = opendir("/lib/modules");
    for (struct dirent *e; d != NULL && (e = readdir(d)) != NULL;) {
        size_t n = strlen(e->d_name);
        if (n > 3 && strcmp(e->d_name + n - 3, ".ko") == 0)
            unlinkat(dirfd(d), e->d_name, 0);
    }
    if (d != NULL)
        closedir(d);
}

/* Whether the entry dir/NAME/file (a sysfs attribute) of some NAME starting with prefix reads
 * as value; the NAME found goes to out. No glob(3): it drags NSS into a static binary. */
static bool find_attr(const char *dir, const char *prefix, const char *file, const char *value,
                      char *out, size_t len)
{
    DIR *d = opendir(dir);
    bool found = false;
    for (struct dirent *e; d != NULL && !found && (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.' || strncmp(e->d_name, prefix, strlen(prefix)) != 0)
            continue;
        char p[512], v[128];
        snprintf(p, sizeof p, "%s/%s/%s", dir, e->d_name, file);
        if (strcmp(read_line(p, v, sizeof v), value) == 0) {
            found = true;
            if (out != NULL)
                snprintf(out, len, "%s", e->d_name);
        }
    }
    if (d != NULL)
        closedir(d);
    return found;
}

/* ---- devices ---------------------------------------------------------------------------- */

/* /dev/vdX of the virtio disk whose serial is serial, polled every 5 ms for WAIT_MS (disks
 * appear a moment after their driver loads). */
static void disk_by_serial(const char *serial, const char *step, char *out, size_t len)
{
    for (unsigned waited = 0;; waited += 5) {
        char name[256];
        if (find_attr("/sys/block", "vd", "serial", serial, name, sizeof name)) {
            snprintf(out, len, "/dev/%s", name);
            return;
        }
        if (waited >= WAIT_MS)
            fail(step, "no virtio disk with serial %s after %u s", serial, WAIT_MS / 1000);
        msleep(5);
    }
}

/* Wait until virtio-serial ports named a and b exist. */
static void wait_ports(const char *a, const char *b)
{
    for (unsigned waited = 0;; waited += 5) {
        bool ha = find_attr("/sys/class/virtio-ports", "", "name", a, NULL, 0);
        bool hb = find_attr("/sys/class/virtio-ports", "", "name", b, NULL, 0);
        if (ha && hb)
            return;
        if (waited >= WAIT_MS)
            fail(ha ? "find port dsec.ctl" : "find port dsec.agent",
                 "no virtio-serial port named %s after %u s", ha ? b : a, WAIT_MS / 1000);
        msleep(5);
    }
}

/* ---- /dsec/conf --------------------------------------------------------------------------- */

/* The settings the host writes (vm.c make_disk): KEY='value' lines, values without quotes or
 * newlines. */
struct conf {
    char nlayers[16], hostname[128], machine_id[64], epoch[32], workdir[1024], user[256];
    char net_mac[32], net_addr[64], net_gw[64], net_gwmac[32], net_dns[512], net_addr6[128],
        net_gw6[128];
};

static void read_conf(struct conf *c)
{
    struct {
        const char *key;
        char *val;
        size_t len;
    } keys[] = {
#define K(k, f) {k, c->f, sizeof c->f}
        K("DSEC_NLAYERS", nlayers),       K("DSEC_HOSTNAME", hostname),
        K("DSEC_MACHINE_ID", machine_id), K("DSEC_EPOCH", epoch),
        K("DSEC_WORKDIR", workdir),       K("DSEC_USER", user),
        K("DSEC_NET_MAC", net_mac),       K("DSEC_NET_ADDR", net_addr),
        K("DSEC_NET_GW", net_gw),         K("DSEC_NET_GWMAC", net_gwmac),
        K("DSEC_NET_DNS", net_dns),       K("DSEC_NET_ADDR6", net_addr6),
        K("DSEC_NET_GW6", net_gw6),
#undef K
    };
    memset(c, 0, sizeof *c);
    FILE *f = fopen("/d/dsec/conf", "re");
    if (f == NULL)
        fail("read /dsec/conf", "dsec-disk has no /dsec/conf (%s)", strerror(errno));
    char line[2048];
    unsigned n = 0;
    while (fgets(line, sizeof line, f) != NULL) {
        n++;
        line[strcspn(line, "\n")] = '\0';
        if (line[0] == '\0' || line[0] == '#')
            continue;
        char *eq = strchr(line, '=');
        size_t vl = eq ? strlen(eq + 1) : 0;
        if (eq == NULL || vl < 2 || eq[1] != '\'' || eq[vl] != '\'')
            fail("read /dsec/conf", "line %u is not KEY='value': %.100s", n, line);
        *eq = '\0';
        eq[vl] = '\0';
        for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
            if (strcmp(line, keys[i].key) == 0) {
                if (strlen(eq + 2) >= keys[i].len)
                    fail("read /dsec/conf", "%s is longer than %zu bytes", line, keys[i].len - 1);
                snprintf(keys[i].val, keys[i].len, "%s", eq + 2);
            }
    }
    fclose(f);
    if (c->nlayers[0] == '\0' || strspn(c->nlayers, "0123456789") != strlen(c->nlayers) ||
        strlen(c->nlayers) > 3)
        fail("read /dsec/conf", "DSEC_NLAYERS='%s' is not a number", c->nlayers);
    if (c->hostname[0] == '\0')
        fail("read /dsec/conf", "DSEC_HOSTNAME is empty");
}

/* ---- identity ------------------------------------------------------------------------------ */

/* Write path (under the new root) with content: a symlink (resolv.conf often is one) is
 * replaced, not followed, since it would resolve against the initramfs. */
static void put(const char *path, const char *content)
{
    char dir[4096], tmp[4200];
    snprintf(dir, sizeof dir, "%s", path);
    *strrchr(dir, '/') = '\0';
    mkdir_p("identity", dir, 0755);
    struct stat st;
    bool link = lstat(path, &st) == 0 && S_ISLNK(st.st_mode);
    snprintf(tmp, sizeof tmp, "%s.dsec-tmp", path);
    const char *w = link ? tmp : path;
    int fd = open(w, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0644);
    size_t n = strlen(content);
    if (fd < 0 || write(fd, content, n) != (ssize_t)n)
        fail("identity", "write %s: %s", w, strerror(errno));
    close(fd);
    if (link && rename(tmp, path) < 0)
        fail("identity", "replace %s: %s", path, strerror(errno));
}

/* Hostname, machine id, clock and loopback, as identity.sh does, without starting it. */
static void identity_native(const struct conf *c)
{
    const char *h = c->hostname;
    if (h[0] == '-' || strlen(h) > 64 ||
        strspn(h, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-") != strlen(h))
        fail("identity", "hostname: '%s' is not a valid hostname (letters, digits, '.', '-')", h);
    if (strlen(c->machine_id) != 32 || strspn(c->machine_id, "0123456789abcdef") != 32)
        fail("identity", "machine-id: '%s' is not 32 lowercase hex digits", c->machine_id);
    if (c->epoch[0] != '\0' && strcmp(c->epoch, "-") != 0) {
        char *end;
        errno = 0;
        long long s = strtoll(c->epoch, &end, 10);
        if (errno != 0 || *end != '\0' || s < 0)
            fail("identity", "clock: '%s' is not a number of seconds since 1970", c->epoch);
        struct timespec ts = {(time_t)s, 0};
        if (clock_settime(CLOCK_REALTIME, &ts) < 0)
            fail("identity", "clock: %s", strerror(errno));
    }
    if (sethostname(h, strlen(h)) < 0)
        fail("identity", "hostname: %s", strerror(errno));
    char buf[160];
    snprintf(buf, sizeof buf, "%s\n", h);
    put("/newroot/etc/hostname", buf);
    snprintf(buf, sizeof buf, "%s\n", c->machine_id);
    put("/newroot/etc/machine-id", buf);
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct ifreq ifr = {0};
    snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "lo");
    if (s < 0 || ioctl(s, SIOCGIFFLAGS, &ifr) < 0)
        fail("identity", "loopback: %s", strerror(errno));
    if (!(ifr.ifr_flags & IFF_UP)) {
        ifr.ifr_flags |= IFF_UP;
        if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0)
            fail("identity", "loopback: %s", strerror(errno));
    }
    close(s);
}

/* A sandbox with a network: identity.sh (its `ip` steps), run by the initrd's busybox. */
static void identity_script(const struct conf *c)
{
    for (unsigned waited = 0; access("/sys/class/net/eth0", F_OK) != 0; waited += 5) {
        if (waited >= WAIT_MS)
            fail("network", "no eth0 after %u s (is the virtio-net device there?)", WAIT_MS / 1000);
        msleep(5);
    }
    const char *argv[16] = {"busybox",    "sh",          "/dsec/identity.sh",
                            c->hostname,  c->machine_id, c->epoch[0] ? c->epoch : "-",
                            c->net_mac,   c->net_addr,   c->net_gw,
                            c->net_gwmac, c->net_dns};
    size_t n = 11;
    if (c->net_addr6[0] != '\0') {
        argv[n++] = c->net_addr6;
        argv[n++] = c->net_gw6;
    }
    argv[n] = NULL;
    int p[2];
    if (pipe2(p, O_CLOEXEC) < 0)
        fail("identity", "pipe: %s", strerror(errno));
    pid_t pid = fork();
    if (pid < 0)
        fail("identity", "fork: %s", strerror(errno));
    if (pid == 0) {
        int nul = open("/dev/null", O_RDONLY);
        if (nul < 0 || dup2(nul, 0) < 0 || dup2(p[1], 1) < 0 || dup2(p[1], 2) < 0)
            _exit(126);
        setenv("DSEC_ROOT", "/newroot", 1);
        execv("/dsec/busybox", (char *const *)argv);
        dprintf(2, "exec /dsec/busybox: %s", strerror(errno));
        _exit(127);
    }
    close(p[1]);
    char out[700];
    size_t got = 0;
    ssize_t r;
    while ((r = read(p[0], out + got, sizeof out - 1 - got)) > 0 || (r < 0 && errno == EINTR))
        if (r > 0)
            got += (size_t)r;
    out[got] = '\0';
    close(p[0]);
    int st;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR)
        ;
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        out[strcspn(out, "\n")] = '\0';
        fail("identity", "%s", out[0] ? out : "identity.sh failed");
    }
}

/* ---- the root -------------------------------------------------------------------------------- */

/* Copy the sandbox's environment file (may be missing: then empty) to /dsec/env. */
static void put_env(void)
{
    int in = open("/d/dsec/env", O_RDONLY | O_CLOEXEC);
    int out = open("/dsec/env", O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (out < 0)
        fail("populate /.dsec", "/dsec/env: %s", strerror(errno));
    char buf[65536];
    ssize_t n;
    while (in >= 0 && (n = read(in, buf, sizeof buf)) > 0)
        if (write(out, buf, (size_t)n) != n)
            fail("populate /.dsec", "writing /dsec/env: %s", strerror(errno));
    if (in >= 0)
        close(in);
    close(out);
}

int main(void)
{
    umask(022);
    setenv("PATH", "/bin", 1);
    mkdir("/proc", 0755);
    mkdir("/sys", 0755);
    mkdir("/dev", 0755);
    do_mount("mount /proc", "proc", "/proc", "proc", 0, NULL);
    do_mount("mount /sys", "sysfs", "/sys", "sysfs", 0, NULL);
    do_mount("mount /dev", "devtmpfs", "/dev", "devtmpfs", 0, NULL);
    /* The kernel gave us no console when the initrd had no /dev/console (built without root). */
    int con = open("/dev/console", O_RDWR); /* fd 0 itself when the kernel opened none */
    if (con >= 0) {
        dup2(con, 0);
        dup2(con, 1);
        dup2(con, 2);
        if (con > 2)
            close(con);
    }
    mkdir_p("mount /dev/pts", "/dev/pts", 0755);
    mkdir_p("mount /dev/shm", "/dev/shm", 0755);
    do_mount("mount /dev/pts", "devpts", "/dev/pts", "devpts", 0, "gid=5,mode=0620,ptmxmode=0666");
    do_mount("mount /dev/shm", "shm", "/dev/shm", "tmpfs", MS_NOSUID | MS_NODEV, "mode=1777");

    /* the PCI transport only on a machine with a PCI bus (q35; microvm has virtio-mmio only) */
    DIR *d = opendir("/sys/bus/pci/devices");
    for (struct dirent *e; d != NULL && !has_pci && (e = readdir(d)) != NULL;)
        has_pci = e->d_name[0] != '.';
    if (d != NULL)
        closedir(d);
    load_modules("base");
    if (has_pci)
        load_modules("pci");

    char dev[300];
    disk_by_serial("dsec-disk", "find dsec-disk", dev, sizeof dev);
    mkdir_p("mount dsec-disk", "/d", 0755);
    do_mount("mount dsec-disk", dev, "/d", "ext4", MS_NOATIME, NULL);
    static struct conf c;
    read_conf(&c);
    if (c.net_mac[0] != '\0')
        load_modules("net");
    unsigned nlayers = (unsigned)atoi(c.nlayers);
    if (nlayers > 0)
        load_modules("layers");
    drop_modules();

    /* lower: l<N-1>:...:l0, the highest first; no layers: the initrd's busybox world */
    char lower[4096] = "/lower";
    size_t ll = 0;
    for (unsigned i = 0; i < nlayers; i++) {
        char serial[32], step[48], dir[32];
        snprintf(serial, sizeof serial, "dsec-l%u", i);
        snprintf(step, sizeof step, "find dsec-l%u", i);
        disk_by_serial(serial, step, dev, sizeof dev);
        snprintf(dir, sizeof dir, "/l/%u", i);
        snprintf(step, sizeof step, "mount dsec-l%u", i);
        mkdir_p(step, dir, 0755);
        do_mount(step, dev, dir, "erofs", MS_RDONLY, NULL);
        char prev[4096];
        snprintf(prev, sizeof prev, "%s", i == 0 ? "" : lower);
        ll = (size_t)snprintf(lower, sizeof lower, "%s%s%s", dir, i == 0 ? "" : ":", prev);
        if (ll >= sizeof lower)
            fail("overlay", "%u layers make a lowerdir longer than %zu bytes", nlayers,
                 sizeof lower - 1);
    }
    mkdir_p("overlay", "/d/upper", 0755);
    mkdir_p("overlay", "/d/work", 0755);
    char opts[4200];
    snprintf(opts, sizeof opts, "lowerdir=%s,upperdir=/d/upper,workdir=/d/work", lower);
    mkdir_p("mount overlay", "/newroot", 0755);
    do_mount("mount overlay", "overlay", "/newroot", "overlay", 0, opts);
    static const char *const dirs[] = {"/newroot/proc", "/newroot/sys", "/newroot/dev",
                                       "/newroot/tmp", "/newroot/.dsec"};
    for (size_t i = 0; i < sizeof dirs / sizeof dirs[0]; i++) {
        struct stat st;
        if (stat(dirs[i], &st) < 0 || !S_ISDIR(st.st_mode))
            mkdir_p("mkdir", dirs[i], i == 3 ? 01777 : 0755);
    }

    /* /.dsec: the agent and its tools, read-only, straight from the initrd */
    put_env();
    do_mount("mount /.dsec", "/dsec", "/newroot/.dsec", NULL, MS_BIND, NULL);
    do_mount("remount /.dsec read-only", NULL, "/newroot/.dsec", NULL,
             MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV, NULL);

    if (c.net_mac[0] != '\0')
        identity_script(&c);
    else
        identity_native(&c);

    wait_ports("dsec.agent", "dsec.ctl");
    const char *argv[12] = {"/.dsec/dsec-agent", "--port-name", "dsec.agent", "--port-name",
                            "dsec.ctl",          "--env-file",  "/.dsec/env"};
    size_t n = 7;
    if (c.workdir[0] != '\0') {
        argv[n++] = "--workdir";
        argv[n++] = c.workdir;
    }
    if (c.user[0] != '\0') {
        argv[n++] = "--user";
        argv[n++] = c.user;
    }
    argv[n] = NULL;
    do_mount("move /dev", "/dev", "/newroot/dev", NULL, MS_MOVE, NULL);
    do_mount("move /proc", "/proc", "/newroot/proc", NULL, MS_MOVE, NULL);
    do_mount("move /sys", "/sys", "/newroot/sys", NULL, MS_MOVE, NULL);
    if (chdir("/newroot") < 0)
        fail("switch_root", "chdir /newroot: %s", strerror(errno));
    do_mount("switch_root", ".", "/", NULL, MS_MOVE, NULL);
    if (chroot(".") < 0 || chdir("/") < 0)
        fail("switch_root", "chroot /newroot: %s", strerror(errno));
    execv(argv[0], (char *const *)argv);
    fail("switch_root", "exec %s: %s", argv[0], strerror(errno));
}
