/* fleet.c - dsec ls (a tenant's sandboxes, by label, state, type), dsec rm --label, dsec events. */
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "dsec/alloc.h"
#include "tools/cli.h"

#define MAX_FILTERS 64

/* The filters ls and rm share. */
struct filters {
    const char *labels[MAX_FILTERS + 1];
    size_t nlabels;
    const char *state, *type;
};

/* One --label: KEY=VALUE with a key, said here so the message names the flag. */
static int add_label(const char *cmd, struct filters *f, const char *arg)
{
    const char *eq = strchr(arg, '=');
    if (eq == NULL || eq == arg) {
        fprintf(stderr, "dsec %s: --label \"%s\": give KEY=VALUE (e.g. --label run=exp-7)\n", cmd,
                arg);
        return -1;
    }
    if (f->nlabels == MAX_FILTERS) {
        fprintf(stderr, "dsec %s: at most %d --label filters\n", cmd, MAX_FILTERS);
        return -1;
    }
    f->labels[f->nlabels++] = arg;
    return 0;
}

/* The filter options ls and rm share (-l, -s, -t): 1 when ch was one (taken), 0 when not,
 * -1 when its argument is wrong (said). */
static int filter_opt(const char *cmd, int ch, const char *arg, struct filters *f)
{
    switch (ch) {
    case 'l':
        return add_label(cmd, f, arg) < 0 ? -1 : 1;
    case 's':
        f->state = arg;
        return 1;
    case 't':
        f->type = arg;
        return 1;
    default:
        return 0;
    }
}

void dsec_cli_json_str(FILE *out, const char *s)
{
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(out, "\\%c", *p);
        else if (*p < 0x20)
            fprintf(out, "\\u%04x", *p);
        else
            fputc(*p, out);
    }
    fputc('"', out);
}

static void print_json_entry(const dsec_list_entry *e, bool first)
{
    printf("%s{\"id\":", first ? "" : ",");
    dsec_cli_json_str(stdout, e->id);
    printf(",\"type\":");
    dsec_cli_json_str(stdout, e->type);
    printf(",\"state\":");
    dsec_cli_json_str(stdout, e->state);
    printf(",\"node\":");
    dsec_cli_json_str(stdout, e->node);
    if (e->project[0]) {
        printf(",\"project\":");
        dsec_cli_json_str(stdout, e->project);
    }
    printf(",\"labels\":{");
    for (size_t i = 0; i < e->nlabels; i++) {
        const char *eq = strchr(e->labels[i], '=');
        char *k = dsec_strndup(e->labels[i], (size_t)(eq - e->labels[i]));
        printf("%s", i ? "," : "");
        dsec_cli_json_str(stdout, k ? k : "");
        printf(":");
        dsec_cli_json_str(stdout, eq + 1);
        dsec_free(k);
    }
    printf("},\"created_ns\":%" PRIu64 ",\"expires_ns\":%" PRIu64 ",\"cpu_milli\":%" PRIu64
           ",\"memory_mb\":%" PRIu64 "}",
           e->created_ns, e->expires_ns, e->cpu_milli, e->memory_mb);
}

static void age(char *out, size_t n, uint64_t from_ns)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t now = (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
    uint64_t s = now > from_ns ? (now - from_ns) / 1000000000ull : 0;
    if (s < 120)
        snprintf(out, n, "%" PRIu64 "s", s);
    else if (s < 7200)
        snprintf(out, n, "%" PRIu64 "m", s / 60);
    else if (s < 172800)
        snprintf(out, n, "%" PRIu64 "h", s / 3600);
    else
        snprintf(out, n, "%" PRIu64 "d", s / 86400);
}

static void print_row(const dsec_list_entry *e)
{
    char a[16], labels[512] = "";
    age(a, sizeof a, e->created_ns);
    for (size_t i = 0; i < e->nlabels; i++)
        snprintf(labels + strlen(labels), sizeof labels - strlen(labels), "%s%s", i ? "," : "",
                 e->labels[i]);
    printf("%-24s %-10s %-9s %-12s %5s  %s\n", e->id, e->type, e->state, e->node, a,
           labels[0] ? labels : "-");
}

static void warn_missing(const char *cmd, const dsec_list_page *p)
{
    if (p->nmissing == 0)
        return;
    fprintf(stderr,
            "dsec %s: %zu of %zu node(s) did not answer, their sandboxes may be missing:", cmd,
            p->nmissing, p->nodes_asked);
    for (size_t i = 0; i < p->nmissing; i++)
        fprintf(stderr, " %s", p->missing[i]);
    fprintf(stderr, "\n");
}

static int parse_limit(const char *cmd, const char *s, uint32_t *out)
{
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (*s == '\0' || *end != '\0' || s[0] == '-' || v < 1 || v > DSEC_LIST_LIMIT_MAX) {
        fprintf(stderr, "dsec %s: --limit \"%s\": give 1..%d\n", cmd, s, DSEC_LIST_LIMIT_MAX);
        return -1;
    }
    *out = (uint32_t)v;
    return 0;
}

/* The nodes a page missed, joined by \x1f (dsec_free); NULL when out of memory. */
static char *missing_of(const dsec_list_page *p)
{
    char *note = dsec_malloc(4096);
    if (note == NULL)
        return NULL;
    note[0] = '\0';
    for (size_t i = 0; i < p->nmissing; i++)
        snprintf(note + strlen(note), 4096 - strlen(note), "%s%s", i ? "\x1f" : "", p->missing[i]);
    return note;
}

/* The end of ls --json: next_cursor (where to go on; after a failure, the page that failed),
 * the nodes that did not answer (missing_note, cut up here), and the failure (NULL: none). */
static void json_tail(const char *cursor, char *missing_note, const dsec_err *failed)
{
    printf("],\"next_cursor\":");
    dsec_cli_json_str(stdout, cursor);
    printf(",\"missing\":[");
    if (missing_note != NULL) {
        char *save = NULL, *tok = strtok_r(missing_note, "\x1f", &save);
        for (bool first = true; tok != NULL; tok = strtok_r(NULL, "\x1f", &save), first = false) {
            printf("%s", first ? "" : ",");
            dsec_cli_json_str(stdout, tok);
        }
    }
    printf("]");
    if (failed != NULL) {
        printf(",\"error\":");
        dsec_cli_json_str(stdout, failed->msg);
    }
    printf("}\n");
}

/* ---- dsec ls --------------------------------------------------------------------------- */

static int fleet_ls(int argc, char **argv)
{
    static const struct option longs[] = {{"label", required_argument, 0, 'l'},
                                          {"state", required_argument, 0, 's'},
                                          {"type", required_argument, 0, 't'},
                                          {"limit", required_argument, 0, 'n'},
                                          {"cursor", required_argument, 0, 'c'},
                                          {"all", no_argument, 0, 'a'},
                                          {"json", no_argument, 0, 'j'},
                                          {"help", no_argument, 0, 'h'},
                                          {0, 0, 0, 0}};
    static const char use[] =
        "usage: dsec ls [--label K=V]... [--state S] [--type T] [--limit N] [--cursor C] [--all] "
        "[--json]\n"
        "       dsec ls ID [PATH]   (a directory inside a sandbox)\n"
        "Lists this tenant's sandboxes (DSEC_TENANT), asked of the nodes themselves, sorted by "
        "id.\n"
        "--limit: per page, 1..10000 (default 1000); --cursor: the cursor a page printed;\n"
        "--all: every page. Exit 1 when a node did not answer (the list may be short).\n";
    struct filters f = {0};
    dsec_list_opts o = {0};
    bool all = false, json = false;
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "l:s:t:n:c:ajh", longs, NULL)) != -1) {
        int took = filter_opt("ls", ch, optarg, &f);
        if (took != 0) {
            if (took < 0)
                return 2;
            continue;
        }
        switch (ch) {
        case 'n':
            if (parse_limit("ls", optarg, &o.limit) < 0)
                return 2;
            break;
        case 'c':
            o.cursor = optarg;
            break;
        case 'a':
            all = true;
            break;
        case 'j':
            json = true;
            break;
        case 'h':
            fputs(use, stdout);
            return 0;
        default:
            fputs(use, stderr);
            return 2;
        }
    }
    if (optind != argc) {
        fputs(use, stderr);
        return 2;
    }
    o.labels = f.nlabels ? f.labels : NULL;
    o.state = f.state;
    o.type = f.type;
    dsec_client *c = dsec_cli_connect("ls");
    if (c == NULL)
        return 1;
    int status = 0;
    size_t shown = 0;
    char cursor[DSEC_ID_MAX] = "";
    if (o.cursor != NULL)
        snprintf(cursor, sizeof cursor, "%s", o.cursor);
    if (json)
        printf("{\"items\":[");
    else
        printf("%-24s %-10s %-9s %-12s %5s  %s\n", "ID", "TYPE", "STATE", "NODE", "AGE", "LABELS");
    char *missing_note = NULL;
    bool failed = false;
    dsec_err ferr = {0};
    for (;;) {
        dsec_list_page p;
        dsec_err err;
        o.cursor = cursor;
        if (dsec_list_sandboxes(c, &o, &p, &err) < 0) {
            failed = true;
            ferr = err;
            break;
        }
        for (size_t i = 0; i < p.n; i++) {
            if (json)
                print_json_entry(&p.entries[i], shown == 0);
            else
                print_row(&p.entries[i]);
            shown++;
        }
        warn_missing("ls", &p);
        if (p.nmissing > 0) {
            status = 1;
            if (json && missing_note == NULL)
                missing_note = missing_of(&p);
        }
        snprintf(cursor, sizeof cursor, "%s", p.next_cursor);
        dsec_list_page_release(&p);
        if (cursor[0] == '\0' || !all)
            break;
    }
    if (json)
        json_tail(cursor, missing_note, failed ? &ferr : NULL);
    else if (!failed && cursor[0] != '\0') {
        fprintf(stderr, "dsec ls: more: ask again with --cursor %s (or --all)\n", cursor);
    }
    if (failed)
        status = dsec_cli_fail("ls", &ferr);
    dsec_free(missing_note);
    dsec_client_free(c);
    return status;
}

int dsec_cli_ls_any(int argc, char **argv)
{
    /* `dsec ls ID [PATH]` lists a directory in a sandbox, as it always has */
    if (argc >= 2 && argv[1][0] != '-')
        return dsec_cli_ls(argc, argv);
    return fleet_ls(argc, argv);
}

/* ---- dsec rm --label ----------------------------------------------------------------------- */

#define RM_WORKERS 16

struct rm_work {
    pthread_mutex_t mu;
    dsec_client *c;
    char (*ids)[DSEC_ID_MAX];
    size_t n, next;
    size_t destroyed;
    bool *failed;
    char (*why)[256];
};

static void *rm_worker(void *p)
{
    struct rm_work *w = p;
    for (;;) {
        pthread_mutex_lock(&w->mu);
        size_t i = w->next < w->n ? w->next++ : w->n;
        pthread_mutex_unlock(&w->mu);
        if (i == w->n)
            return NULL;
        dsec_err err;
        int rc = dsec_destroy(w->c, w->ids[i], &err);
        pthread_mutex_lock(&w->mu);
        if (rc == 0 || err.code == DSEC_E_NOT_FOUND) { /* gone already is what was asked */
            w->destroyed++;
        } else {
            w->failed[i] = true;
            snprintf(w->why[i], sizeof w->why[i], "%.200s (%s)", err.msg, dsec_code_name(err.code));
        }
        pthread_mutex_unlock(&w->mu);
    }
}

/* Every page of the matches, their ids to *ids (the caller frees). 0, or minus the exit
 * status after saying why. */
static int collect(dsec_client *c, dsec_list_opts *o, char (**ids)[DSEC_ID_MAX], size_t *n,
                   bool *short_list)
{
    char cursor[DSEC_ID_MAX] = "";
    size_t cap = 0;
    *ids = NULL;
    *n = 0;
    *short_list = false;
    for (;;) {
        dsec_list_page p;
        dsec_err err;
        o->cursor = cursor;
        if (dsec_list_sandboxes(c, o, &p, &err) < 0)
            return -dsec_cli_fail("rm", &err);
        warn_missing("rm", &p);
        *short_list |= p.nmissing > 0;
        if (*n + p.n > cap) {
            size_t ncap = (*n + p.n) * 2;
            char(*nv)[DSEC_ID_MAX] = dsec_realloc(*ids, ncap * sizeof **ids);
            if (nv == NULL) {
                dsec_list_page_release(&p);
                fprintf(stderr, "dsec rm: out of memory\n");
                return -1;
            }
            *ids = nv;
            cap = ncap;
        }
        for (size_t i = 0; i < p.n; i++)
            snprintf((*ids)[(*n)++], DSEC_ID_MAX, "%s", p.entries[i].id);
        snprintf(cursor, sizeof cursor, "%s", p.next_cursor);
        dsec_list_page_release(&p);
        if (cursor[0] == '\0')
            return 0;
    }
}

/* Destroy ids with RM_WORKERS in parallel; failures said when last (earlier ones are tried
 * again). Returns how many failed. */
static size_t destroy_all(dsec_client *c, char (*ids)[DSEC_ID_MAX], size_t n, size_t *destroyed,
                          bool last)
{
    struct rm_work w = {.c = c, .ids = ids, .n = n};
    pthread_mutex_init(&w.mu, NULL);
    w.failed = dsec_calloc(n ? n : 1, sizeof *w.failed);
    w.why = dsec_calloc(n ? n : 1, sizeof *w.why);
    if (w.failed == NULL || w.why == NULL) {
        fprintf(stderr, "dsec rm: out of memory\n");
        dsec_free(w.failed);
        dsec_free(w.why);
        return n;
    }
    pthread_t t[RM_WORKERS];
    size_t nt = 0;
    for (; nt < RM_WORKERS && nt < n; nt++)
        if (pthread_create(&t[nt], NULL, rm_worker, &w) != 0)
            break;
    if (nt == 0)
        rm_worker(&w);
    for (size_t i = 0; i < nt; i++)
        pthread_join(t[i], NULL);
    size_t failed = 0;
    for (size_t i = 0; i < n; i++)
        if (w.failed[i]) {
            failed++;
            if (last)
                fprintf(stderr, "dsec rm: %s: %s\n", ids[i], w.why[i]);
        }
    *destroyed += w.destroyed;
    dsec_free(w.failed);
    dsec_free(w.why);
    pthread_mutex_destroy(&w.mu);
    return failed;
}

static int fleet_rm(int argc, char **argv)
{
    static const struct option longs[] = {
        {"label", required_argument, 0, 'l'}, {"state", required_argument, 0, 's'},
        {"type", required_argument, 0, 't'},  {"yes", no_argument, 0, 'y'},
        {"help", no_argument, 0, 'h'},        {0, 0, 0, 0}};
    static const char use[] =
        "usage: dsec rm --label K=V [--label K=V]... [--state S] [--type T] [--yes]\n"
        "       dsec rm ID...\n"
        "Destroys every sandbox of this tenant that matches (asked of the nodes, every page).\n"
        "Without --yes it only prints what would be destroyed, and exits 1.\n";
    struct filters f = {0};
    bool yes = false;
    int ch;
    optind = 1;
    while ((ch = getopt_long(argc, argv, "l:s:t:yh", longs, NULL)) != -1) {
        int took = filter_opt("rm", ch, optarg, &f);
        if (took != 0) {
            if (took < 0)
                return 2;
            continue;
        }
        switch (ch) {
        case 'y':
            yes = true;
            break;
        case 'h':
            fputs(use, stdout);
            return 0;
        default:
            fputs(use, stderr);
            return 2;
        }
    }
    if (optind != argc || f.nlabels == 0) {
        if (f.nlabels == 0)
            fprintf(stderr, "dsec rm: give at least one --label K=V (or sandbox ids)\n");
        fputs(use, stderr);
        return 2;
    }
    dsec_list_opts o = {
        .labels = f.labels, .state = f.state, .type = f.type, .limit = DSEC_LIST_LIMIT_MAX};
    dsec_client *c = dsec_cli_connect("rm");
    if (c == NULL)
        return 1;
    char(*ids)[DSEC_ID_MAX] = NULL;
    size_t n = 0, destroyed = 0;
    bool short_list = false;
    int status = 0;
    int rc = collect(c, &o, &ids, &n, &short_list);
    if (rc < 0) {
        status = -rc;
        goto out;
    }
    if (!yes) {
        for (size_t i = 0; i < n; i++)
            printf("%s\n", ids[i]);
        fprintf(stderr, "dsec rm: %zu sandbox(es) match%s; add --yes to destroy them\n", n,
                short_list ? " (some nodes did not answer)" : "");
        status = 1;
        goto out;
    }
    /* Rounds: a sandbox still starting when the list was taken (a create in flight from a
     * trainer that crashed) may refuse its destroy, or appear after it: list again until
     * none match, at most 5 times. */
    for (int round = 0; n > 0 && round < 5; round++) {
        destroy_all(c, ids, n, &destroyed, round == 4);
        dsec_free(ids);
        ids = NULL;
        if (round > 0) {
            struct timespec ts = {0, 300000000L};
            nanosleep(&ts, NULL);
        }
        if ((rc = collect(c, &o, &ids, &n, &short_list)) < 0) {
            status = 1;
            break;
        }
    }
    printf("destroyed %zu sandbox(es)\n", destroyed);
    if (status == 0 && n > 0) {
        for (size_t i = 0; i < n; i++)
            fprintf(stderr, "dsec rm: %s was not destroyed\n", ids[i]);
        status = 1;
    }
    if (short_list) {
        fprintf(stderr, "dsec rm: some nodes did not answer: their sandboxes were not seen; run it "
                        "again\n");
        status = 1;
    }
out:
    dsec_free(ids);
    dsec_client_free(c);
    return status;
}

int dsec_cli_rm(int argc, char **argv)
{
    if (argc < 2)
        return fleet_rm(argc, argv); /* says both forms */
    for (int i = 1; i < argc; i++)
        if (argv[i][0] == '-')
            return fleet_rm(argc, argv);
    return dsec_cli_simple_op(argc, argv);
}

/* ---- dsec events ----------------------------------------------------------------------------- */

static bool events_json;

static void on_event(const dsec_sbx_event *ev, void *ud)
{
    (void)ud;
    flockfile(stdout);
    if (events_json) {
        printf("{\"id\":");
        dsec_cli_json_str(stdout, ev->id);
        printf(",\"state\":");
        dsec_cli_json_str(stdout, ev->state);
        printf(",\"prev\":");
        dsec_cli_json_str(stdout, ev->prev);
        printf(",\"node\":");
        dsec_cli_json_str(stdout, ev->node);
        printf(",\"type\":");
        dsec_cli_json_str(stdout, ev->type);
        if (ev->reason[0]) {
            printf(",\"reason\":");
            dsec_cli_json_str(stdout, ev->reason);
        }
        printf(",\"ts_ns\":%" PRIu64 "}\n", ev->ts_ns);
    } else {
        time_t t = (time_t)(ev->ts_ns / 1000000000ull);
        struct tm tm;
        char when[32];
        strftime(when, sizeof when, "%H:%M:%S", localtime_r(&t, &tm));
        printf("%s.%03u %-24s %9s -> %-9s %-12s %-10s %s\n", when,
               (unsigned)(ev->ts_ns / 1000000ull % 1000), ev->id, ev->prev, ev->state, ev->node,
               ev->type, ev->reason);
    }
    fflush(stdout);
    funlockfile(stdout);
}

int dsec_cli_events(int argc, char **argv)
{
    static const char use[] = "usage: dsec events [--json]\n"
                              "Follows this tenant's sandbox lifecycle events until Ctrl-C.\n";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--json") == 0) {
            events_json = true;
        } else if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            fputs(use, stdout);
            return 0;
        } else {
            fputs(use, stderr);
            return 2;
        }
    }
    dsec_cli_block_signals();
    dsec_client *c = dsec_cli_connect("events");
    if (c == NULL)
        return 1;
    dsec_event_watch *w = NULL;
    dsec_err err;
    if (dsec_watch_events(c, on_event, NULL, &w, &err) < 0) {
        dsec_client_free(c);
        return dsec_cli_fail("events", &err);
    }
    if (!events_json)
        fprintf(stderr, "dsec events: following tenant %s (Ctrl-C stops)\n", dsec_client_tenant(c));
    dsec_cli_wait_for_signal();
    dsec_event_watch_free(w);
    dsec_client_free(c);
    return 0;
}
