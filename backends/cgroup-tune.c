/* cgroup-tune.c - remount cgroup2 with favordynmods, so moving a process between cgroups does not
 * wait for an RCU grace period (cgroup-tune.h says why it matters). */
#define _GNU_SOURCE
#include "backends/cgroup-tune.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>

#include "dsec/log.h"

/* mountinfo escapes space, tab, newline and backslash as \ooo */
static void unescape(char *s)
{
    char *d = s;
    for (; *s; s++, d++) {
        if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' &&
            s[3] >= '0' && s[3] <= '7') {
            *d = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
            s += 3;
        } else {
            *d = *s;
        }
    }
    *d = '\0';
}

static bool has_opt(const char *list, const char *opt)
{
    size_t n = strlen(opt);
    for (const char *p = list; p != NULL && *p; p = strchr(p, ',') ? strchr(p, ',') + 1 : NULL)
        if (strncmp(p, opt, n) == 0 && (p[n] == ',' || p[n] == '\0'))
            return true;
    return false;
}

/* The per-mount flags a remount must pass again to keep them. */
static unsigned long mount_flags(const char *opts)
{
    static const struct {
        const char *name;
        unsigned long flag;
    } map[] = {{"ro", MS_RDONLY},         {"nosuid", MS_NOSUID},
               {"nodev", MS_NODEV},       {"noexec", MS_NOEXEC},
               {"noatime", MS_NOATIME},   {"nodiratime", MS_NODIRATIME},
               {"relatime", MS_RELATIME}, {"strictatime", MS_STRICTATIME}};
    unsigned long f = 0;
    for (size_t i = 0; i < sizeof map / sizeof map[0]; i++)
        if (has_opt(opts, map[i].name))
            f |= map[i].flag;
    return f;
}

static struct {
    pthread_once_t once;
    int rc;
    dsec_err err;
    char where[512];
} g = {.once = PTHREAD_ONCE_INIT};

static void favor_once(void)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (f == NULL) {
        g.rc = dsec_err_set(&g.err, DSEC_E_IO, errno, "reading /proc/self/mountinfo");
        return;
    }
    char *line = NULL;
    size_t cap = 0;
    g.rc = dsec_err_set(&g.err, DSEC_E_UNSUPPORTED, 0,
                        "this host has no cgroup2 mount (cgroup v1 only): task migrations keep "
                        "waiting for RCU grace periods");
    while (getline(&line, &cap, f) > 0) {
        /* ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTS [OPTIONAL...] - FSTYPE SOURCE SUPEROPTS */
        char *sep = strstr(line, " - ");
        if (sep == NULL)
            continue;
        *sep = '\0';
        char fstype[64], source[256], super[1024], mp[512], opts[512];
        if (sscanf(sep + 3, "%63s %255s %1023s", fstype, source, super) != 3 ||
            strcmp(fstype, "cgroup2") != 0 ||
            sscanf(line, "%*s %*s %*s %*s %511s %511s", mp, opts) != 2)
            continue;
        unescape(mp);
        snprintf(g.where, sizeof g.where, "%s", mp);
        if (has_opt(super, "favordynmods")) {
            g.rc = 0;
            break;
        }
        /* the superblock's options as they are (a remount replaces them all),
         * without rw/ro, which are flags, plus favordynmods */
        char data[1100] = "";
        size_t len = 0;
        for (char *save = NULL, *t = strtok_r(super, ",", &save); t; t = strtok_r(NULL, ",", &save))
            if (strcmp(t, "rw") != 0 && strcmp(t, "ro") != 0)
                len += (size_t)snprintf(data + len, sizeof data - len, "%s,", t);
        snprintf(data + len, sizeof data - len, "favordynmods");
        if (mount(source, mp, "cgroup2", MS_REMOUNT | mount_flags(opts), data) < 0)
            g.rc = dsec_err_set(&g.err, errno == EINVAL ? DSEC_E_UNSUPPORTED : DSEC_E_PERMISSION,
                                errno,
                                "remounting %s with favordynmods (Linux 6.0 or later has it)", mp);
        else
            g.rc = 1;
        break;
    }
    free(line);
    fclose(f);
}

int dsec_cgroup_favor_dynmods(char *where, size_t len, dsec_err *err)
{
    pthread_once(&g.once, favor_once);
    if (where != NULL && len > 0)
        snprintf(where, len, "%s", g.where);
    if (g.rc < 0 && err != NULL)
        *err = g.err;
    return g.rc;
}

void dsec_cgroup_tune_apply(bool on, const char *who)
{
    static atomic_flag said = ATOMIC_FLAG_INIT;
    if (!on)
        return;
    char where[512];
    dsec_err err;
    int rc = dsec_cgroup_favor_dynmods(where, sizeof where, &err);
    if (rc == 0 || atomic_flag_test_and_set(&said))
        return;
    if (rc == 1)
        dsec_log_warn("dsec %s: remounted cgroup2 at %s with favordynmods: moving a process into a "
                      "cgroup no longer waits for an RCU grace period (option cgroup_favordynmods)",
                      who, where);
    else
        dsec_log_warn("dsec %s: cgroup favordynmods not set, creates stay slower: %s", who,
                      err.msg);
}

int dsec_cgroup_mount(const char *ctrl, char *path, size_t plen, char *root, size_t rlen)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (f == NULL)
        return -1;
    char line[4096];
    int rc = -1;
    bool found = false;
    while (!found && fgets(line, sizeof line, f) != NULL) {
        char rt[PATH_MAX], mp[PATH_MAX];
        if (sscanf(line, "%*s %*s %*s %4095s %4095s", rt, mp) != 2)
            continue;
        char *sep = strstr(line, " - ");
        char fstype[64], source[256], opts[1024];
        if (sep == NULL || sscanf(sep + 3, "%63s %255s %1023s", fstype, source, opts) != 3)
            continue;
        if (strcmp(fstype, ctrl == NULL ? "cgroup2" : "cgroup") != 0 ||
            (ctrl != NULL && !has_opt(opts, ctrl)))
            continue;
        found = true;
        unescape(rt);
        unescape(mp);
        int n = snprintf(path, plen, "%s", mp);
        int m = root ? snprintf(root, rlen, "%s", rt) : 0;
        rc = n >= 0 && (size_t)n < plen && m >= 0 && (root == NULL || (size_t)m < rlen) ? 0 : -1;
    }
    fclose(f);
    return rc;
}
