/* chaos.c - make bench S=chaos: a multi-process cell on a 3-server NATS cluster under steady
 * create/exec load, with a fault every few seconds; counts what was answered, lost, orphaned or
 * placed twice. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include "bus/bus.h"
#include "codecs/msg.h"
#include "dsec/alloc.h"
#include "dsec/client.h"

/* The cell: 3 nats-servers (routes, JetStream), 2 scheduler processes, 2
 * arbiters, NODES node-manager processes with sim nodes. */
#define SERVERS 3
#define SCHEDS 2
#define ARBS 2
#define NODES 4
#define WORKERS 16 /* threads running exec + destroy on created sandboxes */
#define LOST_AFTER_MS 6000
#define IDLE_S 20 /* a sandbox no client drives is reaped: what reconciles unclaimed ones */

enum { P_SERVER, P_SCHED, P_ARB, P_NODE };
struct proc {
    int kind, idx;
    pid_t pid;
    char name[32];
};

static char dir[64];
static int client_port[SERVERS], route_port[SERVERS];
static char urls[256];
static struct proc procs[SERVERS + SCHEDS + ARBS + NODES];
static size_t nprocs;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void msleep(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

static int free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (f == NULL || fputs(text, f) < 0 || fclose(f) != 0) {
        fprintf(stderr, "chaos: writing %s: %s\n", path, strerror(errno));
        exit(2);
    }
}

static void write_configs(void)
{
    char path[256], text[4096];
    for (int i = 0; i < SERVERS; i++) {
        snprintf(path, sizeof path, "%s/nats-%d.conf", dir, i);
        snprintf(text, sizeof text,
                 "server_name: s%d\nlisten: 127.0.0.1:%d\njetstream { store_dir: \"%s/js-%d\" }\n"
                 "cluster { name: chaos, listen: 127.0.0.1:%d,\n"
                 "  routes: [nats-route://127.0.0.1:%d, nats-route://127.0.0.1:%d, "
                 "nats-route://127.0.0.1:%d] }\n",
                 i, client_port[i], dir, i, route_port[i], route_port[0], route_port[1],
                 route_port[2]);
        write_file(path, text);
    }
    char common[1024];
    snprintf(common, sizeof common,
             "cell: chaos\nbus: {url: \"%s\", threads: 4}\nembedded_nats: {enabled: false}\n"
             "defaults: {cpu_milli: 100, memory_mb: 64, ttl_s: 600, idle_s: %d}\n"
             "scheduler: {replicas: 1, dead_after_ms: 1500, lost_after_ms: %d}\n"
             "reports: {capacity_ms: 100, full_ms: 1000, heartbeat_ms: 250, reap_ms: 500}\n"
             "arbiter: {lease_ms: 1500, replicas: 3}\ntrajectory: {replicas: 3}\n",
             urls, IDLE_S, LOST_AFTER_MS);
    /* schedulers and arbiters share one file: they hold no node */
    snprintf(path, sizeof path, "%s/ctl.yaml", dir);
    snprintf(text, sizeof text, "%s", common);
    size_t len = strlen(text);
    snprintf(text + len, sizeof text - len, "state_dir: %s/ctl\n", dir);
    write_file(path, text);
    for (int i = 0; i < NODES; i++) {
        snprintf(path, sizeof path, "%s/node-%d.yaml", dir, i);
        snprintf(text, sizeof text, "%s", common);
        size_t n = strlen(text);
        snprintf(
            text + n, sizeof text - n,
            "state_dir: %s/node-%d\nnodes:\n  - {name: cn%d, cpu_milli: 400000, memory_mb: 400000, "
            "slots: 20000, types: [sim], backend: sim, sim: {time_scale: 0}}\n",
            dir, i, i);
        write_file(path, text);
    }
}

static void spawn(struct proc *p)
{
    char log[256], conf[256];
    snprintf(log, sizeof log, "%s/%s.log", dir, p->name);
    pid_t pid = fork();
    if (pid == 0) {
        int fd = open(log, O_WRONLY | O_CREAT | O_APPEND, 0644);
        if (fd >= 0) {
            dup2(fd, 1);
            dup2(fd, 2);
        }
        if (p->kind == P_SERVER) {
            snprintf(conf, sizeof conf, "%s/nats-%d.conf", dir, p->idx);
            execlp("nats-server", "nats-server", "-c", conf, (char *)NULL);
        } else {
            const char *roles = p->kind == P_SCHED ? "scheduler"
                                : p->kind == P_ARB ? "arbiter"
                                                   : "node";
            if (p->kind == P_NODE)
                snprintf(conf, sizeof conf, "%s/node-%d.yaml", dir, p->idx);
            else
                snprintf(conf, sizeof conf, "%s/ctl.yaml", dir);
            execl(DSECD_BIN, "dsecd", "--config", conf, "--roles", roles, (char *)NULL);
        }
        _exit(127);
    }
    p->pid = pid;
}

static void kill9(struct proc *p)
{
    if (p->pid > 0) {
        kill(p->pid, SIGKILL);
        waitpid(p->pid, NULL, 0);
        p->pid = -1;
    }
}

/* ---- what the cell says: creations by req_id (double placements), live per node -------- */

struct seen {
    struct seen *next;
    char *req_id; /* in gone: the state and reason the node gave */
    char id[96];
    double t;
};

static struct {
    pthread_mutex_t mu;
    struct seen **b;    /* req_id -> the sandbox its creation made */
    struct seen **gone; /* sandbox ids the nodes said were gone or failed for a reason other
                         * than a client's destroy: the reason (req_id) and when */
    size_t nb;
    uint64_t doubles;
    double t0;
    uint64_t live[NODES];
    bool reported[NODES];
} cellv = {.mu = PTHREAD_MUTEX_INITIALIZER};

static uint64_t hash(const char *s)
{
    uint64_t h = 1469598103934665603ull;
    for (; *s; s++)
        h = (h ^ (uint8_t)*s) * 1099511628211ull;
    return h;
}

static void on_cell_event(dsec_actor *a, dsec_msg *m, void *ud)
{
    (void)a;
    dsec_decoder *dec = ud;
    const char *subj = dsec_msg_subject(m);
    dsec_err err;
    if (strstr(subj, ".sbx.") != NULL) {
        dsec_msg_sandbox_events b;
        if (dsec_decode(dec, DSEC_MSG_SANDBOX_EVENTS, dsec_msg_data(m), dsec_msg_len(m), &b, &err) <
            0)
            return;
        const dsec_msg_sandbox_event *ev = b.events.items;
        pthread_mutex_lock(&cellv.mu);
        for (uint32_t i = 0; i < b.events.n; i++) {
            if ((strcmp(ev[i].state, "gone") == 0 || strcmp(ev[i].state, "failed") == 0) &&
                ev[i].reason != NULL && strcmp(ev[i].reason, "destroyed by request") != 0) {
                struct seen *g = malloc(sizeof *g);
                char why[256];
                snprintf(why, sizeof why, "%s: %s", ev[i].state, ev[i].reason);
                if (g != NULL && (g->req_id = strdup(why)) != NULL) {
                    snprintf(g->id, sizeof g->id, "%s", ev[i].id);
                    g->t = now_s() - cellv.t0;
                    size_t k = hash(ev[i].id) % cellv.nb;
                    g->next = cellv.gone[k];
                    cellv.gone[k] = g;
                } else {
                    free(g);
                }
                continue;
            }
            if (ev[i].prev == NULL || strcmp(ev[i].prev, "requested") != 0 ||
                ev[i].req_id == NULL || strncmp(ev[i].req_id, "fork-", 5) == 0)
                continue;
            size_t k = hash(ev[i].req_id) % cellv.nb;
            struct seen *s = cellv.b[k];
            while (s && strcmp(s->req_id, ev[i].req_id) != 0)
                s = s->next;
            if (s != NULL) {
                if (strcmp(s->id, ev[i].id) != 0) { /* one request, two sandboxes */
                    if (cellv.doubles < 8)
                        fprintf(stderr, "chaos: t=%.1f s req_id %s made %s and %s\n",
                                now_s() - cellv.t0, ev[i].req_id, s->id, ev[i].id);
                    cellv.doubles++;
                }
                continue;
            }
            s = malloc(sizeof *s);
            if (s == NULL || (s->req_id = strdup(ev[i].req_id)) == NULL) {
                free(s);
                continue;
            }
            snprintf(s->id, sizeof s->id, "%s", ev[i].id);
            s->next = cellv.b[k];
            cellv.b[k] = s;
        }
        pthread_mutex_unlock(&cellv.mu);
    } else if (strstr(subj, ".capacity") != NULL) {
        dsec_msg_capacity c;
        if (dsec_decode(dec, DSEC_MSG_CAPACITY, dsec_msg_data(m), dsec_msg_len(m), &c, &err) < 0)
            return;
        int i = -1;
        if (sscanf(c.node, "cn%d", &i) == 1 && i >= 0 && i < NODES) {
            pthread_mutex_lock(&cellv.mu);
            cellv.live[i] = c.live;
            cellv.reported[i] = true;
            pthread_mutex_unlock(&cellv.mu);
        }
    }
}

/* ---- faults, and what happened near them ---------------------------------------------- */

#define FAULT_WINDOW_S 10.0 /* an answer this long after a fault began is counted against it */

static struct {
    pthread_mutex_t mu;
    double t[1024];
    char what[1024][48];
    size_t n;
} faultv = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void fault_note(double t, const char *victim, const char *kind)
{
    pthread_mutex_lock(&faultv.mu);
    if (faultv.n < 1024) {
        faultv.t[faultv.n] = t;
        snprintf(faultv.what[faultv.n], sizeof faultv.what[0], "%s %s", victim, kind);
        faultv.n++;
    }
    pthread_mutex_unlock(&faultv.mu);
}

/* The fault that began at most FAULT_WINDOW_S before t (seconds since the start), or
 * "none"; with_t adds how long before. */
static void fault_at(double t, char *out, size_t len, bool with_t)
{
    pthread_mutex_lock(&faultv.mu);
    size_t i = faultv.n;
    while (i > 0 && faultv.t[i - 1] > t)
        i--;
    if (i > 0 && t - faultv.t[i - 1] <= FAULT_WINDOW_S) {
        if (with_t)
            snprintf(out, len, "%.1f s after %s", t - faultv.t[i - 1], faultv.what[i - 1]);
        else
            snprintf(out, len, "%s", faultv.what[i - 1]);
    } else {
        snprintf(out, len, "none");
    }
    pthread_mutex_unlock(&faultv.mu);
}

/* What kind of fault: the victim's kind without its index ("node-2 kill -9" -> "node kill -9"). */
static void fault_kind(const char *what, char *out, size_t len)
{
    size_t o = 0;
    for (const char *p = what; *p && o + 1 < len; p++) {
        if (p > what && p[-1] != ' ' && *p == '-' && p[1] >= '0' && p[1] <= '9') {
            while (p[1] >= '0' && p[1] <= '9')
                p++;
            continue;
        }
        out[o++] = *p;
    }
    out[o] = '\0';
}

/* A message without its numbers and ids (words holding a digit), so that errors of one kind
 * count together. */
static void msg_class(const char *msg, char *out, size_t len)
{
    size_t o = 0;
    const char *p = msg;
    while (*p && o + 2 < len) {
        size_t w = strcspn(p, " ,:;()\"'");
        if (w == 0) {
            out[o++] = *p++;
            continue;
        }
        bool digit = false;
        for (size_t i = 0; i < w; i++)
            digit |= p[i] >= '0' && p[i] <= '9';
        if (digit) {
            out[o++] = '#';
        } else {
            size_t c = w < len - o - 1 ? w : len - o - 1;
            memcpy(out + o, p, c);
            o += c;
        }
        p += w;
    }
    out[o] = '\0';
}

/* Definitive errors by operation, code, message class and the fault active then. */
static struct {
    pthread_mutex_t mu;
    struct {
        char key[256];
        uint64_t n;
    } e[128];
    size_t n;
    uint64_t other;
} defv = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void definitive_note(const char *op, const dsec_err *err, double t)
{
    char cls[128], f[64], fk[64], key[256];
    msg_class(err->msg, cls, sizeof cls);
    fault_at(t, f, sizeof f, false);
    fault_kind(f, fk, sizeof fk);
    snprintf(key, sizeof key, "%-7s %-10s [%s] %s", op, dsec_code_name(err->code), fk, cls);
    pthread_mutex_lock(&defv.mu);
    size_t i = 0;
    while (i < defv.n && strcmp(defv.e[i].key, key) != 0)
        i++;
    if (i < defv.n) {
        defv.e[i].n++;
    } else if (defv.n < 128) {
        snprintf(defv.e[defv.n].key, sizeof defv.e[0].key, "%s", key);
        defv.e[defv.n++].n = 1;
    } else {
        defv.other++;
    }
    pthread_mutex_unlock(&defv.mu);
}

/* ---- the load ------------------------------------------------------------------------ */

struct made {
    char id[DSEC_ID_MAX];
    double t; /* when its create was answered, seconds since the start */
};

static struct {
    _Atomic uint64_t requests, answered, ok, retryable, definitive_errors;
    _Atomic uint64_t vanished, reclaimed_after_loss, idled, gone_other, unexplained_on_lost_node;
    _Atomic uint64_t undriven; /* created while the workers were too far behind to keep them */
    _Atomic uint64_t inflight_creates;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct made *ring;
    size_t cap, head, tail;
    bool stop;
    char lost_nodes[NODES][32];
    int nlost;
} load = {.mu = PTHREAD_MUTEX_INITIALIZER, .cv = PTHREAD_COND_INITIALIZER};

static dsec_client *client;

static void count_answer(const char *op, int status, const dsec_err *err)
{
    atomic_fetch_add(&load.answered, 1);
    if (status == 0)
        atomic_fetch_add(&load.ok, 1);
    else if (dsec_code_retry_safe(err->code))
        atomic_fetch_add(&load.retryable, 1);
    else {
        atomic_fetch_add(&load.definitive_errors, 1);
        definitive_note(op, err, now_s() - cellv.t0);
    }
}

static void on_created(int status, const dsec_sandbox_info *info, const dsec_err *err, void *ud)
{
    (void)ud;
    count_answer("create", status, err);
    atomic_fetch_sub(&load.inflight_creates, 1);
    if (status != 0)
        return;
    pthread_mutex_lock(&load.mu);
    if (load.tail - load.head < load.cap) {
        struct made *e = &load.ring[load.tail % load.cap];
        snprintf(e->id, sizeof e->id, "%s", info->id);
        e->t = now_s() - cellv.t0;
        load.tail++;
        pthread_cond_signal(&load.cv);
    } else {
        atomic_fetch_add(&load.undriven, 1); /* left to the idle reaper */
    }
    pthread_mutex_unlock(&load.mu);
}

static void on_lost(const char *node, const char *cell, uint64_t lost_ns, void *ud)
{
    (void)cell;
    (void)lost_ns;
    (void)ud;
    pthread_mutex_lock(&load.mu);
    bool known = false;
    for (int i = 0; i < load.nlost; i++)
        known |= strcmp(load.lost_nodes[i], node) == 0;
    if (!known && load.nlost < NODES)
        snprintf(load.lost_nodes[load.nlost++], 32, "%s", node);
    pthread_mutex_unlock(&load.mu);
}

static bool node_was_lost(const char *id);

/* Why the node said id is gone or failed (other than a client's destroy), or NULL. */
static const char *gone_reason(const char *id, double *t)
{
    pthread_mutex_lock(&cellv.mu);
    struct seen *g = cellv.gone[hash(id) % cellv.nb];
    while (g && strcmp(g->id, id) != 0)
        g = g->next;
    pthread_mutex_unlock(&cellv.mu);
    if (g != NULL && t != NULL)
        *t = g->t;
    return g ? g->req_id : NULL; /* never freed while the load runs */
}

/* Lost sandboxes by what the node said about them and the faults at their create and their
 * operation: the first few in full, all of them counted by kind. */
static struct {
    pthread_mutex_t mu;
    struct {
        char key[512];
        uint64_t n;
    } e[64];
    size_t n;
    uint64_t printed;
} lostv = {.mu = PTHREAD_MUTEX_INITIALIZER};

static void lost_note(const struct made *mk, const char *op, const dsec_err *err, const char *what,
                      double t)
{
    const char *why = gone_reason(mk->id, NULL);
    char fa[96], fo[96], ka[64], ko[64], key[512];
    fault_at(mk->t, fa, sizeof fa, true);
    fault_at(t, fo, sizeof fo, true);
    pthread_mutex_lock(&lostv.mu);
    if (lostv.printed++ < 40)
        fprintf(stderr,
                "chaos: %s %s: created t=%.2f (%s); %s at t=%.2f (%s): %s; its events said: %s\n",
                what, mk->id, mk->t, fa, op, t, fo, err->msg, why ? why : "nothing");
    fault_at(mk->t, fa, sizeof fa, false);
    fault_at(t, fo, sizeof fo, false);
    fault_kind(fa, ka, sizeof ka);
    fault_kind(fo, ko, sizeof ko);
    char wc[128], ec[128];
    msg_class(why ? why : "nothing", wc, sizeof wc);
    msg_class(err->msg, ec, sizeof ec);
    snprintf(key, sizeof key,
             "%s: %s %s %.0f s after its create; created during [%s], %s during [%s]: %s; its "
             "events said: %s",
             what, op, t - mk->t >= IDLE_S ? "at least" : "less than", (double)IDLE_S, ka, op, ko,
             ec, wc);
    size_t i = 0;
    while (i < lostv.n && strcmp(lostv.e[i].key, key) != 0)
        i++;
    if (i < lostv.n) {
        lostv.e[i].n++;
    } else if (lostv.n < 64) {
        snprintf(lostv.e[lostv.n].key, sizeof lostv.e[0].key, "%s", key);
        lostv.e[lostv.n++].n = 1;
    }
    pthread_mutex_unlock(&lostv.mu);
}

/* Not found, and not yet explained: looked at again once the cell has settled (the node's
 * event saying why may still be on its way). */
struct unexplained {
    struct made mk;
    char op[8];
    dsec_err err;
    double t; /* when the operation was answered */
};

static struct {
    pthread_mutex_t mu;
    struct unexplained *v;
    size_t n, cap;
} unexv = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* A sandbox the client was given that an operation no longer finds: gone with its node
 * (declared lost, owners told), reaped idle because the load fell behind, gone for another
 * reason the node gave (in its answer or its events), or lost. Settled at the end (final). */
static void count_vanished(const struct made *mk, const char *op, const dsec_err *err, double t,
                           bool final)
{
    const char *why = gone_reason(mk->id, NULL);
    const char *said = strstr(err->msg, " is gone: "); /* the node's answer says why */
    if (said != NULL)
        why = said + 10;
    else if (why != NULL)
        why = strchr(why, ':') ? strchr(why, ':') + 2 : why;
    if (why != NULL && strstr(why, "declared lost") != NULL) {
        atomic_fetch_add(&load.reclaimed_after_loss, 1);
    } else if (why != NULL && strncmp(why, "idle timeout", 12) == 0) {
        atomic_fetch_add(&load.idled, 1);
    } else if (why != NULL) {
        atomic_fetch_add(&load.gone_other, 1);
        lost_note(mk, op, err, "gone with a reason", t);
    } else if (!final) {
        pthread_mutex_lock(&unexv.mu);
        if (unexv.n == unexv.cap) {
            size_t ncap = unexv.cap ? unexv.cap * 2 : 1024;
            struct unexplained *nv = realloc(unexv.v, ncap * sizeof *nv);
            if (nv != NULL) {
                unexv.v = nv;
                unexv.cap = ncap;
            }
        }
        if (unexv.n < unexv.cap) {
            struct unexplained *u = &unexv.v[unexv.n++];
            u->mk = *mk;
            u->t = t;
            snprintf(u->op, sizeof u->op, "%s", op);
            u->err = *err;
            u->err.msg[sizeof u->err.msg - 1] = '\0';
        }
        pthread_mutex_unlock(&unexv.mu);
    } else if (node_was_lost(mk->id)) { /* no reason given, but its owner heard node_lost */
        atomic_fetch_add(&load.unexplained_on_lost_node, 1);
        lost_note(mk, op, err, "no reason, on a node declared lost", t);
    } else {
        atomic_fetch_add(&load.vanished, 1);
        lost_note(mk, op, err, "lost", t);
    }
}

static void settle_vanished(void)
{
    for (size_t i = 0; i < unexv.n; i++)
        count_vanished(&unexv.v[i].mk, unexv.v[i].op, &unexv.v[i].err, unexv.v[i].t, true);
    free(unexv.v);
}

static bool node_was_lost(const char *id)
{
    bool lost = false;
    pthread_mutex_lock(&load.mu);
    for (int i = 0; i < load.nlost; i++) {
        size_t n = strlen(load.lost_nodes[i]);
        lost |= strncmp(id, load.lost_nodes[i], n) == 0 && id[n] == '-';
    }
    pthread_mutex_unlock(&load.mu);
    return lost;
}

/* Each created sandbox gets one exec, then a destroy. */
static void *worker(void *arg)
{
    (void)arg;
    struct made mk;
    const char *argv[] = {"true", NULL};
    for (;;) {
        pthread_mutex_lock(&load.mu);
        while (load.head == load.tail && !load.stop)
            pthread_cond_wait(&load.cv, &load.mu);
        if (load.head == load.tail) {
            pthread_mutex_unlock(&load.mu);
            return NULL;
        }
        mk = load.ring[load.head % load.cap];
        load.head++;
        pthread_mutex_unlock(&load.mu);
        dsec_exec_opts eo = {.argv = argv, .timeout_ms = 5000};
        dsec_exec_reply r;
        dsec_err err;
        atomic_fetch_add(&load.requests, 1);
        int rc = dsec_exec(client, mk.id, &eo, &r, &err);
        count_answer("exec", rc, &err);
        if (rc == 0)
            dsec_exec_reply_release(&r);
        else if (err.code == DSEC_E_NOT_FOUND) {
            count_vanished(&mk, "exec", &err, now_s() - cellv.t0, false);
            continue; /* nothing left to destroy */
        }
        atomic_fetch_add(&load.requests, 1);
        rc = dsec_destroy(client, mk.id, &err);
        count_answer("destroy", rc, &err);
        if (rc < 0 && err.code == DSEC_E_NOT_FOUND)
            count_vanished(&mk, "destroy", &err, now_s() - cellv.t0, false);
    }
}

static int env_int(const char *name, int def)
{
    const char *v = getenv(name);
    return v && atoi(v) > 0 ? atoi(v) : def;
}

int main(void)
{
    int seconds = env_int("CHAOS_SECONDS", 300), rate = env_int("CHAOS_RATE", 2000);
    int fault_s = env_int("CHAOS_FAULT_S", 20), baseline_s = env_int("CHAOS_BASELINE_S", 20);
    signal(SIGPIPE, SIG_IGN);
    snprintf(dir, sizeof dir, "/tmp/dsec-chaos-XXXXXX");
    if (mkdtemp(dir) == NULL)
        return 2;
    size_t off = 0;
    for (int i = 0; i < SERVERS; i++) {
        client_port[i] = free_port();
        route_port[i] = free_port();
        off += (size_t)snprintf(urls + off, sizeof urls - off, "%snats://127.0.0.1:%d",
                                i ? "," : "", client_port[i]);
    }
    write_configs();
    for (int i = 0; i < SERVERS; i++)
        procs[nprocs++] = (struct proc){.kind = P_SERVER, .idx = i};
    for (int i = 0; i < SCHEDS; i++)
        procs[nprocs++] = (struct proc){.kind = P_SCHED, .idx = i};
    for (int i = 0; i < ARBS; i++)
        procs[nprocs++] = (struct proc){.kind = P_ARB, .idx = i};
    for (int i = 0; i < NODES; i++)
        procs[nprocs++] = (struct proc){.kind = P_NODE, .idx = i};
    static const char *const kinds[] = {"nats", "sched", "arb", "node"};
    for (size_t i = 0; i < nprocs; i++) {
        snprintf(procs[i].name, sizeof procs[i].name, "%s-%d", kinds[procs[i].kind], procs[i].idx);
        if (procs[i].kind == P_SERVER)
            spawn(&procs[i]);
    }
    msleep(3000); /* the cluster forms and elects its JetStream leader */
    for (size_t i = 0; i < nprocs; i++)
        if (procs[i].kind != P_SERVER)
            spawn(&procs[i]);

    dsec_err err;
    dsec_bus *watch = NULL;
    dsec_actor *wa = NULL;
    dsec_decoder *dec = dsec_decoder_new(NULL);
    cellv.nb = 1u << 20;
    cellv.b = calloc(cellv.nb, sizeof *cellv.b);
    cellv.gone = calloc(cellv.nb, sizeof *cellv.gone);
    dsec_bus_opts bo = {.url = urls, .name = "chaos-watch"};
    dsec_client_opts co = {
        .url = urls, .tenant = "chaos", .timeout_ms = 3000, .retries = 3, .threads = 4};
    if (dec == NULL || cellv.b == NULL || cellv.gone == NULL ||
        dsec_bus_connect(&watch, &bo, &err) < 0 ||
        dsec_actor_new(&wa, watch, "chaos-watch", &err) < 0 ||
        dsec_actor_on(wa, "dsec.v1.ctl.evt.chaos.>", NULL, on_cell_event, dec, &err) < 0 ||
        dsec_client_connect(&client, &co, &err) < 0 ||
        dsec_watch_lost(client, on_lost, NULL, &err) < 0) {
        fprintf(stderr, "chaos: %s (logs in %s)\n", err.msg, dir);
        return 1;
    }
    /* ready when a create goes through */
    dsec_create_spec spec = {.type = "sim"};
    dsec_sandbox_info info;
    bool ready = false;
    for (int i = 0; i < 60 && !ready; i++) {
        ready = dsec_create(client, &spec, &info, &err) == 0;
        if (ready)
            dsec_destroy(client, info.id, &err);
        else
            msleep(1000);
    }
    if (!ready) {
        fprintf(stderr, "chaos: the cell never took a create: %s (logs in %s)\n", err.msg, dir);
        return 1;
    }
    load.cap = 1u << 16;
    load.ring = calloc(load.cap, sizeof *load.ring);
    pthread_t th[WORKERS];
    for (int i = 0; i < WORKERS; i++)
        pthread_create(&th[i], NULL, worker, NULL);

    printf("chaos: %d s at %d creates/s (each then exec + destroy), a fault every %d s after %d s "
           "without; %d servers, %d schedulers, %d arbiters, %d nodes (logs in %s)\n",
           seconds, rate, fault_s, baseline_s, SERVERS, SCHEDS, ARBS, NODES, dir);
    double t0 = now_s(), next_fault = t0 + baseline_s, base_ok_at = 0;
    cellv.t0 = t0;
    uint64_t sent = 0, base_ok = 0, faults = 0;
    struct proc *restart = NULL;
    double restart_at = 0;
    pid_t stopped = 0;
    double cont_at = 0;
    int kind = 0;
    while (now_s() - t0 < seconds) {
        double t = now_s();
        uint64_t due = (uint64_t)((t - t0) * rate);
        /* never more than 2 s of creates outstanding: a stalled cell slows the load, not memory */
        while (sent < due && atomic_load(&load.inflight_creates) < (uint64_t)rate * 2) {
            atomic_fetch_add(&load.requests, 1);
            atomic_fetch_add(&load.inflight_creates, 1);
            if (dsec_create_async(client, &spec, on_created, NULL, &err) < 0) {
                atomic_fetch_sub(&load.inflight_creates, 1);
                count_answer("create", -1, &err);
            }
            sent++;
        }
        if (base_ok_at == 0 && t - t0 >= baseline_s) {
            base_ok = atomic_load(&load.ok);
            base_ok_at = t;
        }
        if (restart != NULL && t >= restart_at) {
            spawn(restart);
            restart = NULL;
        }
        if (stopped && t >= cont_at) {
            kill(stopped, SIGCONT);
            stopped = 0;
        }
        if (t >= next_fault && restart == NULL && !stopped) {
            struct proc *victim = NULL;
            const char *what = "";
            int k = kind++ % 5;
            for (size_t i = 0; i < nprocs && victim == NULL; i++) {
                int want = k == 0 ? P_SCHED : k == 1 || k == 4 ? P_NODE : k == 2 ? P_ARB : P_SERVER;
                int n = k == 0 ? SCHEDS : k == 1 || k == 4 ? NODES : k == 2 ? ARBS : SERVERS;
                if (procs[i].kind == want && procs[i].idx == (int)(faults / 5) % n)
                    victim = &procs[i];
            }
            if (k == 4) { /* a partition: the node stops answering for longer than lost_after_ms */
                kill(victim->pid, SIGSTOP);
                stopped = victim->pid;
                cont_at = t + LOST_AFTER_MS / 1000.0 + 3;
                what = "partitioned (stopped past lost_after_ms)";
            } else {
                kill9(victim);
                restart = victim;
                restart_at = t + (k == 3 ? 2.0 : 1.0);
                what = "kill -9, restarted";
            }
            printf("chaos: t=%5.1f s fault %" PRIu64 ": %s %s\n", t - t0, faults + 1, victim->name,
                   what);
            fault_note(t - t0, victim->name, k == 4 ? "partition" : "kill -9");
            fflush(stdout);
            faults++;
            next_fault = t + fault_s;
        }
        msleep(1);
    }
    double t_end = now_s();
    if (restart != NULL)
        spawn(restart);
    if (stopped)
        kill(stopped, SIGCONT);
    /* every create is answered (or times out, its retries included) */
    for (int i = 0; i < 600 && atomic_load(&load.inflight_creates) > 0; i++)
        msleep(100);
    pthread_mutex_lock(&load.mu);
    load.stop = true;
    pthread_cond_broadcast(&load.cv);
    pthread_mutex_unlock(&load.mu);
    for (int i = 0; i < WORKERS; i++)
        pthread_join(th[i], NULL);
    /* reconciliation: unclaimed sandboxes idle out, lost nodes reclaim theirs */
    printf("chaos: load stopped; waiting %d s for reconciliation\n", IDLE_S + 5);
    fflush(stdout);
    msleep((IDLE_S + 5) * 1000);
    settle_vanished();
    dsec_bus_stats bs;
    dsec_bus_stats_get(watch, &bs);
    printf("chaos: the event watcher's connection: %" PRIu64 " slow-consumer drops, %" PRIu64
           " mailbox drops, %" PRIu64 " reconnects\n",
           bs.slow_consumers, bs.mailbox_drops, bs.reconnects);
    uint64_t orphans = 0;
    pthread_mutex_lock(&cellv.mu);
    for (int i = 0; i < NODES; i++)
        orphans += cellv.live[i];
    uint64_t doubles = cellv.doubles;
    pthread_mutex_unlock(&cellv.mu);
    uint64_t requests = atomic_load(&load.requests), answered = atomic_load(&load.answered);
    uint64_t lost = requests - answered + atomic_load(&load.vanished);
    double base_rate = base_ok_at > t0 ? (double)base_ok / (base_ok_at - t0) : 0;
    double all_rate = (double)atomic_load(&load.ok) / (t_end - t0);
    printf("chaos: %" PRIu64 " requests, %" PRIu64 " answered (%" PRIu64 " ok, %" PRIu64
           " retry-safe errors, %" PRIu64 " other errors), lost %" PRIu64 ", orphans %" PRIu64
           ", double placements %" PRIu64 ", %" PRIu64
           " faults; sandboxes gone with a reason: %" PRIu64
           " reclaimed after their node was declared lost, %" PRIu64
           " reaped idle while the load fell "
           "behind (%" PRIu64 " never driven), %" PRIu64 " for other reasons; %" PRIu64
           " not found without a reason on a node once declared lost\n",
           requests, answered, atomic_load(&load.ok), atomic_load(&load.retryable),
           atomic_load(&load.definitive_errors), lost, orphans, doubles, faults,
           atomic_load(&load.reclaimed_after_loss), atomic_load(&load.idled),
           atomic_load(&load.undriven), atomic_load(&load.gone_other),
           atomic_load(&load.unexplained_on_lost_node));
    pthread_mutex_lock(&lostv.mu);
    for (size_t i = 0; i < lostv.n; i++)
        printf("chaos: %8" PRIu64 "  %s\n", lostv.e[i].n, lostv.e[i].key);
    pthread_mutex_unlock(&lostv.mu);
    pthread_mutex_lock(&defv.mu);
    if (defv.n > 0)
        printf("chaos: definitive errors by operation, code, [fault begun at most %.0f s before] "
               "and message:\n",
               FAULT_WINDOW_S);
    for (size_t i = 0; i < defv.n; i++)
        printf("chaos:   %8" PRIu64 "  %s\n", defv.e[i].n, defv.e[i].key);
    if (defv.other > 0)
        printf("chaos:   %8" PRIu64 "  (other kinds)\n", defv.other);
    pthread_mutex_unlock(&defv.mu);
    printf("chaos: baseline (first %d s, no faults): %.0f ok answers/s; whole run: %.0f/s\n",
           baseline_s, base_rate, all_rate);
    for (size_t i = 0; i < nprocs; i++)
        if (procs[i].pid > 0)
            kill(procs[i].pid, SIGTERM);
    for (size_t i = 0; i < nprocs; i++)
        if (procs[i].pid > 0)
            waitpid(procs[i].pid, NULL, 0);
    dsec_client_free(client);
    dsec_actor_free(wa);
    dsec_bus_free(watch);
    dsec_decoder_free(dec);
    /* the JetStream stores and node state hold hundreds of MB after a run: keep only the
     * daemons' logs, and those only when something went wrong or CHAOS_KEEP is set */
    bool clean = lost == 0 && orphans == 0 && doubles == 0 && getenv("CHAOS_KEEP") == NULL;
    char cmd[256];
    if (clean)
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    else
        snprintf(cmd, sizeof cmd, "cd '%s' && rm -rf js-* node-* ctl", dir);
    if (system(cmd) != 0)
        fprintf(stderr, "chaos: could not clean %s\n", dir);
    else if (!clean)
        printf("chaos: the daemons' logs are kept in %s\n", dir);
    printf("{\"scenario\":\"chaos\",\"seconds\":%d,\"rate\":%d,\"requests\":%" PRIu64
           ",\"answered\":%" PRIu64 ",\"retryable_errors\":%" PRIu64 ",\"other_errors\":%" PRIu64
           ",\"lost\":%" PRIu64 ",\"orphans\":%" PRIu64 ",\"double_placements\":%" PRIu64
           ",\"faults\":%" PRIu64
           ",\"ok_per_s\":%.0f,\"baseline_ok_per_s\":%.0f,\"gone_idle\":%" PRIu64
           ",\"gone_node_lost\":%" PRIu64 ",\"gone_other\":%" PRIu64 "}\n",
           seconds, rate, requests, answered, atomic_load(&load.retryable),
           atomic_load(&load.definitive_errors), lost, orphans, doubles, faults, all_rate,
           base_rate, atomic_load(&load.idled), atomic_load(&load.reclaimed_after_loss),
           atomic_load(&load.gone_other));
    return 0;
}
