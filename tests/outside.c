/* outside.c - the outside world of the network tests (outside.h). */
#include "tests/outside.h"

#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

int dsec_test_sh(const char *fmt, ...)
{
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

void dsec_test_outside_down(dsec_test_outside *o)
{
    if (o->pid > 0) {
        kill(o->pid, SIGKILL);
        waitpid(o->pid, NULL, 0);
        o->pid = 0;
    }
    dsec_test_sh("ip netns del %s 2>/dev/null; ip link del %s 2>/dev/null%s; true", o->ns,
                 o->ifname, o->teardown != NULL ? o->teardown : "");
}

int dsec_test_links(const char *prefix)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "ip -o link show | grep -c ': %s'", prefix);
    int n = 0;
    FILE *p = popen(cmd, "r");
    if (p == NULL || fscanf(p, "%d", &n) != 1)
        n = 1000;
    if (p != NULL)
        pclose(p);
    return n;
}

long dsec_test_ifindex(const char *dev)
{
    char p[128];
    snprintf(p, sizeof p, "/sys/class/net/%s/ifindex", dev);
    FILE *f = fopen(p, "r");
    long ix = -1;
    if (f != NULL && fscanf(f, "%ld", &ix) != 1)
        ix = -1;
    if (f != NULL)
        fclose(f);
    return ix;
}

int dsec_test_outside_up(dsec_test_outside *o)
{
    dsec_test_outside_down(o);
    const char *ns = o->ns, *ifn = o->ifname;
    int n = o->net;
    if (dsec_test_sh("ip netns add %s && ip link add %s type veth peer name eth0 netns %s"
                     " && ip addr add 198.18.%d.1/24 dev %s && ip link set %s up"
                     " && ip -n %s link set lo up && ip -n %s link set eth0 up"
                     " && ip -n %s addr add 198.18.%d.2/24 dev eth0"
                     " && ip -n %s addr add 198.18.%d.3/24 dev eth0"
                     " && ip -n %s route add default via 198.18.%d.1%s",
                     ns, ifn, ns, n, ifn, ifn, ns, ns, ns, n, ns, n, ns, n,
                     o->setup != NULL ? o->setup : "") != 0)
        return -1;
    char a2[32], a3[32];
    snprintf(a2, sizeof a2, "198.18.%d.2", n);
    snprintf(a3, sizeof a3, "198.18.%d.3", n);
    const char *argv[64] = {
        "ip",    "ip",   "netns",  "exec", ns,       "python3", DSEC_SRC "/tests/net_outside.py",
        "--log", o->log, "--addr", a2,     "--addr", a3};
    size_t k = 13;
    for (size_t i = 0; o->args != NULL && o->args[i] != NULL && k < 63; i++)
        argv[k++] = o->args[i];
    argv[k] = NULL;
    o->pid = fork();
    if (o->pid == 0) {
        execvp(argv[0], (char *const *)argv + 1);
        _exit(127);
    }
    if (o->pid < 0)
        return -1;
    /* ready when its web service answers */
    for (int i = 0; i < 100; i++) {
        if (dsec_test_sh("ip netns exec %s python3 -c \"import socket;s=socket.socket();"
                         "s.settimeout(0.2);s.connect(('%s',8080))\" 2>/dev/null",
                         ns, a2) == 0)
            return 0;
        usleep(100 * 1000);
    }
    return -1;
}
