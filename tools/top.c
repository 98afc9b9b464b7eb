/* top.c - `dsec top`: the live cell from capacity and sandbox events, and its network alerts. */
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "actors/wire.h"
#include "bus/bus.h"
#include "codecs/msg.h"
#include "dsec/alloc.h"
#include "codecs/subjects.h"
#include "tools/cli.h"

#define MAX_NODES 4096

struct node_row {
    char name[65], cell[65];
    uint64_t cpu, mem, slots, cpu_free, mem_free, slots_free, live;
    char types[128];
    uint64_t seen_ms;
    char lt_name[8][32]; /* live sandboxes per type, as last reported */
    uint64_t lt_count[8];
    int nlt;
    uint64_t alerts; /* network alert occurrences of its sandboxes since start */
};

/* One scheduler replica's admission, from its cell summaries. */
struct sched_row {
    char name[65], cell[65];
    uint64_t parked, held, admitted, shed, seen_ms;
};

#define MAX_SCHEDS 64

struct top {
    pthread_mutex_t mu;
    struct sched_row scheds[MAX_SCHEDS];
    size_t nscheds;
    struct node_row nodes[MAX_NODES];
    size_t nnodes;
    uint64_t created, gone, failed, events; /* since start */
    uint64_t by_type_running[8];
    char type_names[8][32];
    size_t ntypes;
    /* network alerts (net_alert): occurrences by kind, and the latest few */
    uint64_t alerts;
    char alert_kind[8][16];
    uint64_t alert_kind_n[8];
    int nkinds;
    char recent[5][200];
    int nrecent;
};

static uint64_t ms_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static struct node_row *row_for(struct top *t, const char *name)
{
    for (size_t i = 0; i < t->nnodes; i++)
        if (strcmp(t->nodes[i].name, name) == 0)
            return &t->nodes[i];
    if (t->nnodes == MAX_NODES)
        return NULL;
    struct node_row *r = &t->nodes[t->nnodes++];
    memset(r, 0, sizeof *r);
    snprintf(r->name, sizeof r->name, "%s", name);
    return r;
}

static void on_capacity(struct top *t, dsec_msg *m)
{
    dsec_msg_capacity c;
    dsec_err err;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_CAPACITY, dsec_msg_data(m), dsec_msg_len(m), &c,
                    &err) < 0)
        return;
    pthread_mutex_lock(&t->mu);
    struct node_row *r = row_for(t, c.node);
    if (r != NULL) {
        snprintf(r->cell, sizeof r->cell, "%s", c.cell ? c.cell : "");
        r->cpu_free = c.cpu_free_milli;
        r->mem_free = c.mem_free_mb;
        r->slots_free = c.slots_free;
        r->live = c.live;
        r->seen_ms = ms_now();
        r->nlt = 0;
        for (uint32_t i = 0; i < c.live_types.n && r->nlt < 8; i++) {
            snprintf(r->lt_name[r->nlt], sizeof r->lt_name[0], "%s", c.live_types.k[i]);
            r->lt_count[r->nlt++] = strtoull(c.live_types.v[i], NULL, 10);
        }
        if (c.full) {
            r->cpu = c.cpu_milli;
            r->mem = c.memory_mb;
            r->slots = c.slots;
            size_t used = 0;
            r->types[0] = '\0';
            for (uint32_t i = 0; i < c.types.n && used < sizeof r->types; i++)
                used += (size_t)snprintf(r->types + used, sizeof r->types - used, "%s%s",
                                         i ? "," : "", c.types.v[i]);
        }
    }
    pthread_mutex_unlock(&t->mu);
}

static void on_summary(struct top *t, dsec_msg *m)
{
    dsec_msg_cell_summary c;
    dsec_err err;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_CELL_SUMMARY, dsec_msg_data(m), dsec_msg_len(m),
                    &c, &err) < 0 ||
        c.scheduler == NULL) /* an older replica: no admission figures */
        return;
    pthread_mutex_lock(&t->mu);
    size_t i = 0;
    while (i < t->nscheds && strcmp(t->scheds[i].name, c.scheduler) != 0)
        i++;
    if (i == t->nscheds && t->nscheds < MAX_SCHEDS) {
        memset(&t->scheds[i], 0, sizeof t->scheds[i]);
        snprintf(t->scheds[i].name, sizeof t->scheds[i].name, "%s", c.scheduler);
        t->nscheds++;
    }
    if (i < t->nscheds) {
        struct sched_row *r = &t->scheds[i];
        snprintf(r->cell, sizeof r->cell, "%s", c.cell);
        r->parked = c.parked;
        r->held = c.held;
        r->admitted = c.admitted;
        r->shed = c.shed;
        r->seen_ms = ms_now();
    }
    pthread_mutex_unlock(&t->mu);
}

static void on_events(struct top *t, dsec_msg *m)
{
    dsec_msg_sandbox_events b;
    dsec_err err;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_SANDBOX_EVENTS, dsec_msg_data(m), dsec_msg_len(m),
                    &b, &err) < 0)
        return;
    pthread_mutex_lock(&t->mu);
    const dsec_msg_sandbox_event *e = b.events.items;
    for (uint32_t i = 0; i < b.events.n; i++) {
        t->events++;
        if (strcmp(e[i].state, "running") == 0 && e[i].prev && strcmp(e[i].prev, "paused") != 0)
            t->created++;
        else if (strcmp(e[i].state, "gone") == 0)
            t->gone++;
        else if (strcmp(e[i].state, "failed") == 0)
            t->failed++;
    }
    pthread_mutex_unlock(&t->mu);
}

static void on_alert(struct top *t, dsec_msg *m)
{
    dsec_msg_net_alert al;
    dsec_err err;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_NET_ALERT, dsec_msg_data(m), dsec_msg_len(m), &al,
                    &err) < 0)
        return;
    uint64_t k = al.count ? al.count : 1;
    pthread_mutex_lock(&t->mu);
    t->alerts += k;
    int i = 0;
    while (i < t->nkinds && strcmp(t->alert_kind[i], al.kind) != 0)
        i++;
    if (i == t->nkinds && t->nkinds < 8)
        snprintf(t->alert_kind[t->nkinds++], sizeof t->alert_kind[0], "%s", al.kind);
    if (i < t->nkinds)
        t->alert_kind_n[i] += k;
    struct node_row *r = al.node ? row_for(t, al.node) : NULL;
    if (r != NULL)
        r->alerts += k;
    memmove(t->recent[1], t->recent[0], sizeof t->recent[0] * 4);
    snprintf(t->recent[0], sizeof t->recent[0], "%s %s %s %s x%" PRIu64, al.sandbox, al.kind,
             al.dest ? al.dest : "", al.detail ? al.detail : "", k);
    if (t->nrecent < 5)
        t->nrecent++;
    pthread_mutex_unlock(&t->mu);
}

static void on_msg(dsec_actor *a, dsec_msg *m, void *ud)
{
    const char *type = dsec_msg_type(m);
    if (type == NULL)
        return;
    if (strcmp(type, "capacity") == 0)
        on_capacity(ud, m);
    else if (strcmp(type, "cell_summary") == 0)
        on_summary(ud, m);
    else if (strcmp(type, "sandbox_events") == 0)
        on_events(ud, m);
    else if (strcmp(type, "net_alert") == 0)
        on_alert(ud, m);
}

static void render(struct top *t, bool clear, double secs, uint64_t created0, uint64_t gone0)
{
    pthread_mutex_lock(&t->mu);
    if (clear)
        printf("\033[H\033[2J");
    uint64_t live = 0, cpu = 0, cpu_free = 0;
    for (size_t i = 0; i < t->nnodes; i++) {
        live += t->nodes[i].live;
        cpu += t->nodes[i].cpu;
        cpu_free += t->nodes[i].cpu_free;
    }
    printf("dsec top: %zu node(s), %" PRIu64 " sandboxes live, CPU %" PRIu64 "/%" PRIu64
           " milli free; creates %.1f/s, destroys %.1f/s\n",
           t->nnodes, live, cpu_free, cpu, secs > 0 ? (double)(t->created - created0) / secs : 0.0,
           secs > 0 ? (double)(t->gone - gone0) / secs : 0.0);
    char names[16][32];
    uint64_t counts[16] = {0};
    int nn = 0;
    for (size_t i = 0; i < t->nnodes; i++)
        for (int j = 0; j < t->nodes[i].nlt; j++) {
            int k = 0;
            while (k < nn && strcmp(names[k], t->nodes[i].lt_name[j]) != 0)
                k++;
            if (k == nn && nn < 16)
                snprintf(names[nn++], sizeof names[0], "%s", t->nodes[i].lt_name[j]);
            if (k < nn)
                counts[k] += t->nodes[i].lt_count[j];
        }
    printf("sandboxes by type:");
    for (int k = 0; k < nn; k++)
        printf(" %s %" PRIu64 "%s", names[k], counts[k], k + 1 < nn ? "," : "");
    printf("%s\n", nn ? "" : " none reported yet");
    printf("network alerts: %" PRIu64, t->alerts);
    for (int k = 0; k < t->nkinds; k++)
        printf("%s%s %" PRIu64, k ? ", " : " (", t->alert_kind[k], t->alert_kind_n[k]);
    printf("%s\n", t->nkinds ? ")" : "");
    for (int k = 0; k < t->nrecent; k++)
        printf("  %s\n", t->recent[k]);
    uint64_t now = ms_now();
    if (t->nscheds > 0)
        printf("%-24s %-10s %8s %8s %12s %10s\n", "SCHEDULER", "CELL", "HELD", "PARKED", "ADMITTED",
               "SHED");
    for (size_t i = 0; i < t->nscheds; i++) {
        struct sched_row *r = &t->scheds[i];
        printf("%-24s %-10s %8" PRIu64 " %8" PRIu64 " %12" PRIu64 " %10" PRIu64 "%s\n", r->name,
               r->cell, r->held, r->parked, r->admitted, r->shed,
               now - r->seen_ms > 5000 ? "  (silent)" : "");
    }
    printf("%-20s %-10s %8s %14s %14s %12s %8s %s\n", "NODE", "CELL", "LIVE", "CPU free/total",
           "MEM free/total", "SLOTS free", "ALERTS", "TYPES");
    for (size_t i = 0; i < t->nnodes && i < 200; i++) {
        struct node_row *r = &t->nodes[i];
        char cpu_s[32], mem_s[32];
        snprintf(cpu_s, sizeof cpu_s, "%" PRIu64 "/%" PRIu64, r->cpu_free, r->cpu);
        snprintf(mem_s, sizeof mem_s, "%" PRIu64 "/%" PRIu64, r->mem_free, r->mem);
        printf("%-20s %-10s %8" PRIu64 " %14s %14s %12" PRIu64 " %8" PRIu64 " %s%s\n", r->name,
               r->cell, r->live, cpu_s, mem_s, r->slots_free, r->alerts, r->types,
               now - r->seen_ms > 5000 ? "  (silent)" : "");
    }
    fflush(stdout);
    pthread_mutex_unlock(&t->mu);
}

int dsec_cli_top(int argc, char **argv)
{
    static const struct option opts[] = {
        {"once", no_argument, 0, 'o'}, {"interval", required_argument, 0, 'i'}, {0, 0, 0, 0}};
    bool once = false;
    int interval_ms = 1000;
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "oi:", opts, NULL)) != -1) {
        if (ch == 'o')
            once = true;
        else if (ch == 'i' && atoi(optarg) > 0)
            interval_ms = atoi(optarg);
        else {
            fprintf(stderr, "usage: dsec top [--once] [--interval MS]\n");
            return 2;
        }
    }
    struct top *t = dsec_calloc(1, sizeof *t);
    if (t == NULL)
        return 1;
    pthread_mutex_init(&t->mu, NULL);
    dsec_bus *bus = NULL;
    dsec_actor *a = NULL;
    dsec_err err;
    dsec_bus_opts bo = {.name = "dsec-top", .threads = 1, .schema_max = DSEC_SCHEMA_VERSION};
    int rc = 1;
    if (dsec_bus_connect(&bus, &bo, &err) < 0 || dsec_actor_new(&a, bus, "top", &err) < 0 ||
        dsec_actor_on(a, DSEC_SUBJ_EVT_PREFIX ">", NULL, on_msg, t, &err) < 0 ||
        dsec_bus_flush(bus, 2000, &err) < 0 ||
        dsec_bus_publish(bus, DSEC_SUBJ_SYNC, NULL,
                         &(dsec_hdr){.type = "sync", .schema = DSEC_SCHEMA_VERSION}, "", 0,
                         &err) < 0) {
        fprintf(stderr, "dsec top: %s\n", err.msg);
        goto out;
    }
    /* every node answers dsec.v1.ctl.sync with a full report: no waiting for the period */
    bool tty = isatty(1);
    uint64_t created0 = 0, gone0 = 0, t0 = ms_now();
    for (;;) {
        usleep((useconds_t)interval_ms * 1000);
        double secs = (double)(ms_now() - t0) / 1000.0;
        render(t, tty && !once, secs, created0, gone0);
        if (once)
            break;
        pthread_mutex_lock(&t->mu);
        created0 = t->created;
        gone0 = t->gone;
        pthread_mutex_unlock(&t->mu);
        t0 = ms_now();
    }
    rc = 0;
out:
    dsec_bus_free(bus);
    pthread_mutex_destroy(&t->mu);
    dsec_free(t);
    return rc;
}
