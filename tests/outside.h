/* outside.h - the outside world of the network tests: a namespace of the test's own, linked
 * to the host by a veth, holding 198.18.<net>.2 and .3 and running tests/net_outside.py
 * (a logging DNS server and web services on them). Sandboxes reach it only through the
 * node's policy. No other address is ever a target. */
#ifndef DSEC_TESTS_OUTSIDE_H
#define DSEC_TESTS_OUTSIDE_H

#include <sys/types.h>

typedef struct dsec_test_outside {
    const char *ns;          /* its namespace, e.g. "dsecnt-out" */
    const char *ifname;      /* the host's end of the link */
    int net;                 /* 198.18.<net>.0/24: the host .1, the outside .2 and .3 */
    const char *setup;       /* more of the set-up, "&& ..." shell (ip commands), or NULL */
    const char *teardown;    /* more of the removal, "; ..." shell, or NULL */
    const char *const *args; /* more net_outside.py arguments (NULL-ended), or NULL */
    const char *log;         /* where net_outside.py logs the DNS queries it answers */
    pid_t pid;               /* net_outside.py's, while up */
} dsec_test_outside;

/* Run a shell command; its exit code, or -1. */
int dsec_test_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Make it (after removing what an earlier run left) and wait until its web service on
 * .2:8080 answers; 0, or -1. */
int dsec_test_outside_up(dsec_test_outside *o);
void dsec_test_outside_down(dsec_test_outside *o);

/* How many of the host's links are named prefix... (a node's sandbox veths: "dsv" and its tag
 * in hex); a large number when it cannot tell, so a check for none fails. */
int dsec_test_links(const char *prefix);

/* The host's interface index of link dev, or -1 when there is none. A destroyed sandbox's slot
 * may be taken again at once, under the same veth name: what tells its veth from the next one
 * is the index. */
long dsec_test_ifindex(const char *dev);

#endif
