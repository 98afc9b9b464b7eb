/* function-seccomp.c - the seccomp filter of function-call workers, built once per zygote with
 * libseccomp. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <seccomp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "backends/function/function-zygote.h"

/*
 * Two filters. The base one is installed once in the zygote (after its
 * start-up) and inherited by every worker it forks: attaching a filter
 * compiles its BPF, ~20 us each time here, and the base list is long. Each
 * call process (W3) adds the short second one on top.
 *
 * A deny list, not an allow list: calls run arbitrary native programs, so
 * there is no fixed set of syscalls they need. The worker already runs as an
 * unprivileged uid with no capabilities and no_new_privs inside fresh
 * namespaces, so most of these would fail anyway; the filter removes the
 * kernel surface an exploit would aim at (module loading, bpf, perf,
 * io_uring, keyrings, userfaultfd, new namespaces, mounts, ptrace, exotic
 * socket families). Denied calls fail with EPERM (ENOSYS for clone3, so libc
 * falls back to clone, whose flags the filter can see). A syscall of another
 * architecture (i386, x32) kills the process.
 */

static const char *const denied[] = {
    "acct",
    "add_key",
    "bpf",
    "chroot",
    "clock_adjtime",
    "clock_settime",
    "settimeofday",
    "adjtimex",
    "create_module",
    "delete_module",
    "finit_module",
    "init_module",
    "get_kernel_syms",
    "query_module",
    "fanotify_init",
    "fsconfig",
    "fsmount",
    "fsopen",
    "fspick",
    "io_uring_enter",
    "io_uring_register",
    "io_uring_setup",
    "ioperm",
    "iopl",
    "kcmp",
    "kexec_file_load",
    "kexec_load",
    "keyctl",
    "lookup_dcookie",
    "mount_setattr",
    "move_mount",
    "name_to_handle_at",
    "nfsservctl",
    "open_by_handle_at",
    "open_tree",
    "perf_event_open",
    "pivot_root",
    "process_vm_readv",
    "process_vm_writev",
    "ptrace",
    "quotactl",
    "quotactl_fd",
    "reboot",
    "request_key",
    "swapoff",
    "swapon",
    "syslog",
    "umount2",
    "uselib",
    "userfaultfd",
    "vhangup",
    "setdomainname",
    "pidfd_getfd",
    "process_madvise",
    "memfd_secret",
};

/* What the zygote's own workers still do after the base filter is on (W1
 * unshares, and joins a networked sandbox's namespace with setns; W2 mounts
 * and names the host): denied to the call only, by a second filter of its
 * own. */
static const char *const denied_to_calls[] = {"unshare", "setns", "mount", "sethostname"};

/* Namespace flags clone() may not carry. */
static const unsigned long ns_flags[] = {
    CLONE_NEWNS,   CLONE_NEWCGROUP, CLONE_NEWUTS, CLONE_NEWIPC,
    CLONE_NEWUSER, CLONE_NEWPID,    CLONE_NEWNET,
#ifdef CLONE_NEWTIME
    CLONE_NEWTIME,
#endif
};

/* Compile ctx to BPF, once: export it and keep the program. */
static int export(scmp_filter_ctx ctx, struct sock_fprog *out, char *msg, size_t msglen)
{
    int memfd = memfd_create("dsec-seccomp", MFD_CLOEXEC), rc;
    if (memfd < 0) {
        snprintf(msg, msglen, "memfd_create for the seccomp program: %s", strerror(errno));
        return -1;
    }
    if ((rc = seccomp_export_bpf(ctx, memfd)) < 0) {
        snprintf(msg, msglen, "exporting the seccomp filter: %s", strerror(-rc));
        close(memfd);
        return -1;
    }
    struct stat st;
    if (fstat(memfd, &st) < 0 || st.st_size <= 0 || st.st_size % sizeof(struct sock_filter) != 0 ||
        st.st_size / sizeof(struct sock_filter) > 4096) {
        snprintf(msg, msglen, "seccomp export produced %lld bytes", (long long)st.st_size);
        close(memfd);
        return -1;
    }
    struct sock_filter *prog = malloc((size_t)st.st_size);
    if (prog == NULL || pread(memfd, prog, (size_t)st.st_size, 0) != st.st_size) {
        snprintf(msg, msglen, "reading the seccomp program back failed");
        free(prog);
        close(memfd);
        return -1;
    }
    close(memfd);
    out->len = (unsigned short)(st.st_size / sizeof(struct sock_filter));
    out->filter = prog;
    return 0;
}

static int deny_names(scmp_filter_ctx ctx, const char *const *names, size_t n, char *msg,
                      size_t msglen)
{
    for (size_t i = 0; i < n; i++) {
        int nr = seccomp_syscall_resolve_name(names[i]);
        if (nr == __NR_SCMP_ERROR)
            continue; /* not on this architecture or libseccomp too old: nothing to deny */
        int rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), nr, 0);
        if (rc < 0) {
            snprintf(msg, msglen, "seccomp rule for %s: %s", names[i], strerror(-rc));
            return -1;
        }
    }
    return 0;
}

int fnz_seccomp_build(struct sock_fprog *base, struct sock_fprog *tail, char *msg, size_t msglen)
{
    int rc;
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    if (ctx == NULL) {
        snprintf(msg, msglen, "seccomp_init failed");
        return -1;
    }
    if ((rc = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS)) < 0)
        goto out_fail;
    if (deny_names(ctx, denied, sizeof denied / sizeof denied[0], msg, msglen) < 0)
        goto out_release;
    for (size_t i = 0; i < sizeof ns_flags / sizeof ns_flags[0]; i++)
        if ((rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(clone), 1,
                                   SCMP_A0(SCMP_CMP_MASKED_EQ, ns_flags[i], ns_flags[i]))) < 0)
            goto out_fail;
    int clone3 = seccomp_syscall_resolve_name("clone3");
    if (clone3 != __NR_SCMP_ERROR &&
        (rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), clone3, 0)) < 0)
        goto out_fail;
    /* Socket families: unix, inet, inet6 and netlink (libc's getaddrinfo
     * asks netlink which address families are configured) only. */
    if ((rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), SCMP_SYS(socket), 1,
                               SCMP_A0(SCMP_CMP_GT, AF_NETLINK))) < 0)
        goto out_fail;
    static const int bad_low[] = {3, 4, 5, 6, 7, 8, 9, 11, 12, 13, 14, 15};
    for (size_t i = 0; i < sizeof bad_low / sizeof bad_low[0]; i++)
        if ((rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EAFNOSUPPORT), SCMP_SYS(socket), 1,
                                   SCMP_A0(SCMP_CMP_EQ, (scmp_datum_t)bad_low[i]))) < 0)
            goto out_fail;
    /* Pushing characters into a terminal's input queue. */
    if ((rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
                               SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, TIOCSTI))) < 0 ||
        (rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(EPERM), SCMP_SYS(ioctl), 1,
                               SCMP_A1(SCMP_CMP_MASKED_EQ, 0xffffffffu, TIOCLINUX))) < 0)
        goto out_fail;
    if (export(ctx, base, msg, msglen) < 0)
        goto out_release;
    seccomp_release(ctx);

    ctx = seccomp_init(SCMP_ACT_ALLOW);
    if (ctx == NULL) {
        snprintf(msg, msglen, "seccomp_init failed");
        return -1;
    }
    if ((rc = seccomp_attr_set(ctx, SCMP_FLTATR_ACT_BADARCH, SCMP_ACT_KILL_PROCESS)) < 0)
        goto out_fail;
    if (deny_names(ctx, denied_to_calls, sizeof denied_to_calls / sizeof denied_to_calls[0], msg,
                   msglen) < 0 ||
        export(ctx, tail, msg, msglen) < 0)
        goto out_release;
    seccomp_release(ctx);
    return 0;

out_fail:
    snprintf(msg, msglen, "building the seccomp filter: %s", strerror(-rc));
out_release:
    seccomp_release(ctx);
    return -1;
}
