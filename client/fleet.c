/* fleet.c - libdsec's fleet handling: a tenant's sandboxes listed from the nodes themselves, and
 * its lifecycle events followed. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client/internal.h"
#include "codecs/subjects.h"
#include "codecs/msg.h"
#include "dsec/alloc.h"
#include "dsec/names.h"

/* ---- small string sets ------------------------------------------------------------ */

typedef struct strset {
    char **v;
    size_t n, cap;
} strset;

static bool set_has(const strset *s, const char *x)
{
    for (size_t i = 0; i < s->n; i++)
        if (strcmp(s->v[i], x) == 0)
            return true;
    return false;
}

/* Add x unless present: 1 added, 0 present, -1 out of memory. */
static int set_add(strset *s, const char *x)
{
    if (set_has(s, x))
        return 0;
    if (s->n == s->cap) {
        size_t ncap = s->cap ? s->cap * 2 : 16;
        char **nv = dsec_realloc(s->v, ncap * sizeof *nv);
        if (nv == NULL)
            return -1;
        s->v = nv;
        s->cap = ncap;
    }
    if ((s->v[s->n] = dsec_strdup(x)) == NULL)
        return -1;
    s->n++;
    return 1;
}

static void set_release(strset *s)
{
    for (size_t i = 0; i < s->n; i++)
        dsec_free(s->v[i]);
    dsec_free(s->v);
    *s = (strset){0};
}

/* ---- gathering the answers --------------------------------------------------------- */

struct gather {
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* node_set answers */
    strset cells_answered, cells_known, nodes;
    /* list answers */
    strset answered;
    dsec_list_entry *e;
    size_t n, cap;
    bool more;               /* some node had more matches than it sent */
    char bound[DSEC_ID_MAX]; /* the smallest last id of a node that had more: the page is
                                complete only up to it ("" when none) */
    bool failed;             /* a node refused the request: err says why */
    dsec_err err;
    bool nomem;
    uint32_t limit;
};

static void copy(char *dst, size_t n, const char *src)
{
    snprintf(dst, n, "%s", src != NULL ? src : "");
}

static void entry_release(dsec_list_entry *e)
{
    for (size_t i = 0; i < e->nlabels; i++)
        dsec_free(e->labels[i]);
    dsec_free(e->labels);
    e->labels = NULL;
    e->nlabels = 0;
}

/* A node that refuses the request itself (a bad field: every node would) fails the listing
 * with its error. Any other failure of one node (out of memory, ...) leaves that node
 * unanswered: it is reported missing, and the others' pages still count. */
static void take_error(struct gather *g, dsec_msg *m, dsec_decoder *dec)
{
    dsec_msg_error e;
    dsec_err err;
    if (dsec_decode(dec, DSEC_MSG_ERROR, dsec_msg_data(m), dsec_msg_len(m), &e, &err) < 0)
        return;
    int code = dsec_code_from_name(e.code);
    if (g->failed || (code != DSEC_E_INVALID && code != DSEC_E_DECODE &&
                      code != DSEC_E_UNSUPPORTED && code != DSEC_E_PERMISSION))
        return;
    g->failed = true;
    if (e.field != NULL)
        dsec_err_set(&g->err, code, 0, "%s (field %s)", e.message, e.field);
    else
        dsec_err_set(&g->err, code, 0, "%s", e.message);
}

/* A node_set: the cells and nodes it names. Under g->mu. */
static void take_nodes(struct gather *g, dsec_msg *m, dsec_decoder *dec, const char *type)
{
    dsec_msg_node_set ns;
    dsec_err err;
    if (type != NULL && strcmp(type, "node_set") == 0 &&
        dsec_decode(dec, DSEC_MSG_NODE_SET, dsec_msg_data(m), dsec_msg_len(m), &ns, &err) == 0 &&
        ns.cell != NULL) {
        bool ok =
            set_add(&g->cells_answered, ns.cell) >= 0 && set_add(&g->cells_known, ns.cell) >= 0;
        for (uint32_t i = 0; ok && i < ns.cells.n; i++)
            ok = set_add(&g->cells_known, ns.cells.v[i]) >= 0;
        for (uint32_t i = 0; ok && i < ns.nodes.n; i++)
            ok = set_add(&g->nodes, ns.nodes.v[i]) >= 0;
        g->nomem |= !ok;
    }
}

/* One reply on the gather's inbox, taken by take under g->mu; waiters wake. */
static void gather_in(dsec_msg *m, void *ud,
                      void (*take)(struct gather *, dsec_msg *, dsec_decoder *, const char *))
{
    struct gather *g = ud;
    dsec_decoder *dec = dsec_decoder_new(NULL);
    if (dec == NULL)
        return;
    pthread_mutex_lock(&g->mu);
    take(g, m, dec, dsec_msg_type(m));
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    dsec_decoder_free(dec);
}

static void on_nodes(dsec_actor *a, dsec_msg *m, void *ud)
{
    (void)a;
    gather_in(m, ud, take_nodes);
}

static int by_entry_id(const void *a, const void *b)
{
    return strcmp(((const dsec_list_entry *)a)->id, ((const dsec_list_entry *)b)->id);
}

/* A list_reply (its page of entries) or an error. Under g->mu. */
static void take_list(struct gather *g, dsec_msg *m, dsec_decoder *dec, const char *type)
{
    dsec_msg_list_reply r;
    dsec_err err;
    if (type != NULL && strcmp(type, "error") == 0) {
        take_error(g, m, dec);
    } else if (type != NULL && strcmp(type, "list_reply") == 0 &&
               dsec_decode(dec, DSEC_MSG_LIST_REPLY, dsec_msg_data(m), dsec_msg_len(m), &r, &err) ==
                   0 &&
               set_add(&g->answered, r.node) == 1) { /* a node's second answer is not counted */
        g->more |= r.more;
        const dsec_msg_sbx_info *it = r.items.items;
        if (r.more && r.items.n > 0 &&
            (g->bound[0] == '\0' || strcmp(it[r.items.n - 1].id, g->bound) < 0))
            copy(g->bound, sizeof g->bound, it[r.items.n - 1].id);
        for (uint32_t i = 0; i < r.items.n && !g->nomem; i++) {
            if (g->n == g->cap) {
                size_t ncap = g->cap ? g->cap * 2 : 64;
                dsec_list_entry *ne = dsec_realloc(g->e, ncap * sizeof *ne);
                if (ne == NULL) {
                    g->nomem = true;
                    break;
                }
                g->e = ne;
                g->cap = ncap;
            }
            dsec_list_entry *e = &g->e[g->n];
            memset(e, 0, sizeof *e);
            copy(e->id, sizeof e->id, it[i].id);
            copy(e->type, sizeof e->type, it[i].type);
            copy(e->state, sizeof e->state, it[i].state);
            copy(e->node, sizeof e->node, it[i].node ? it[i].node : r.node);
            copy(e->project, sizeof e->project, it[i].project);
            e->created_ns = it[i].created_ns;
            e->expires_ns = it[i].expires_ns;
            e->cpu_milli = it[i].cpu_milli;
            e->memory_mb = it[i].memory_mb;
            if (it[i].labels.n > 0 &&
                (e->labels = dsec_calloc(it[i].labels.n, sizeof *e->labels)) == NULL) {
                g->nomem = true;
                break;
            }
            for (uint32_t j = 0; j < it[i].labels.n; j++) {
                size_t len = strlen(it[i].labels.k[j]) + strlen(it[i].labels.v[j]) + 2;
                if ((e->labels[j] = dsec_malloc(len)) == NULL) {
                    g->nomem = true;
                    break;
                }
                snprintf(e->labels[j], len, "%s=%s", it[i].labels.k[j], it[i].labels.v[j]);
                e->nlabels = j + 1;
            }
            g->n++;
            if (g->nomem)
                break;
        }
        /* keep at most limit: the merged page never needs more than the smallest ids */
        if (g->n > 2 * (size_t)g->limit) {
            qsort(g->e, g->n, sizeof *g->e, by_entry_id);
            for (size_t i = g->limit; i < g->n; i++)
                entry_release(&g->e[i]);
            g->n = g->limit;
            g->more = true;
        }
    }
}

static void on_list(dsec_actor *a, dsec_msg *m, void *ud)
{
    (void)a;
    gather_in(m, ud, take_list);
}

/* Wait until done(g) or the deadline (g->mu held). */
static void wait_until(struct gather *g, const struct timespec *deadline,
                       bool (*done)(const struct gather *))
{
    while (!done(g))
        if (pthread_cond_timedwait(&g->cv, &g->mu, deadline) != 0)
            break;
}

static bool cells_done(const struct gather *g)
{
    if (g->cells_answered.n == 0)
        return false;
    for (size_t i = 0; i < g->cells_known.n; i++)
        if (!set_has(&g->cells_answered, g->cells_known.v[i]))
            return false;
    return true;
}

static bool nodes_done(const struct gather *g)
{
    if (g->failed)
        return true;
    for (size_t i = 0; i < g->nodes.n; i++)
        if (!set_has(&g->answered, g->nodes.v[i]))
            return false;
    return true;
}

static struct timespec deadline_in(int ms)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += ms / 1000;
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

/* ---- dsec_list_sandboxes ----------------------------------------------------------------------
 */

static const char *const list_states[] = {"requested", "starting", "running", "paused", "stopping"};

/* opts checked, and the request built from them (kv borrows opts' strings, split copies). */
static int build_request(const dsec_list_opts *o, dsec_msg_list *q, char ***keys, char ***vals,
                         dsec_err *err)
{
    *keys = *vals = NULL;
    memset(q, 0, sizeof *q);
    uint32_t nl = 0;
    while (o->labels != NULL && o->labels[nl] != NULL)
        nl++;
    if (nl > 256)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "list: labels: %u filters, at most 256", nl);
    if (nl > 0) {
        *keys = dsec_calloc(nl, sizeof **keys);
        *vals = dsec_calloc(nl, sizeof **vals);
        if (*keys == NULL || *vals == NULL)
            return dsec_err_set(err, DSEC_E_NOMEM, 0, "list: out of memory");
    }
    for (uint32_t i = 0; i < nl; i++) {
        const char *l = o->labels[i], *eq = strchr(l, '=');
        if (eq == NULL || eq == l)
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "list: labels: \"%.100s\" is not KEY=VALUE (a label filter "
                                "names a key and the value it must have)",
                                l);
        if ((size_t)(eq - l) > 256 || strlen(eq + 1) > 256)
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "list: labels: \"%.60s...\": keys and values are at most 256 bytes",
                                l);
        (*keys)[i] = dsec_strndup(l, (size_t)(eq - l));
        (*vals)[i] = dsec_strdup(eq + 1);
        if ((*keys)[i] == NULL || (*vals)[i] == NULL)
            return dsec_err_set(err, DSEC_E_NOMEM, 0, "list: out of memory");
    }
    q->labels = (dsec_kv){(const char **)*keys, (const char **)*vals, nl};
    if (o->state != NULL && o->state[0] != '\0') {
        bool ok = false;
        for (size_t i = 0; i < sizeof list_states / sizeof *list_states; i++)
            ok |= strcmp(o->state, list_states[i]) == 0;
        if (!ok)
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "list: state \"%.64s\" is not one of requested, starting, running, "
                                "paused, stopping",
                                o->state);
        q->state = o->state;
    }
    if (o->type != NULL && o->type[0] != '\0') {
        if (dsec_name_ok(o->type, DSEC_NAME_LEN_MAX) < 0)
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "list: type \"%.64s\" is not a sandbox type name", o->type);
        q->type = o->type;
    }
    if (o->limit > DSEC_LIST_LIMIT_MAX)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "list: limit %u: give 1..%d", o->limit,
                            DSEC_LIST_LIMIT_MAX);
    q->limit = o->limit ? o->limit : DSEC_LIST_LIMIT_DEFAULT;
    if (o->cursor != NULL && o->cursor[0] != '\0') {
        char node[DSEC_NAME_MAX];
        dsec_err e2;
        if (dsec_id_node(o->cursor, node, sizeof node, &e2) < 0)
            return dsec_err_set(err, DSEC_E_INVALID, 0,
                                "list: cursor \"%.80s\" is not a sandbox id: pass the "
                                "next_cursor of the previous page",
                                o->cursor);
        q->after = o->cursor;
    }
    return 0;
}

static void free_split(char **keys, char **vals, const dsec_list_opts *o)
{
    size_t nl = 0;
    while (o->labels != NULL && o->labels[nl] != NULL)
        nl++;
    for (size_t i = 0; keys != NULL && i < nl; i++)
        dsec_free(keys[i]);
    for (size_t i = 0; vals != NULL && i < nl; i++)
        dsec_free(vals[i]);
    dsec_free(keys);
    dsec_free(vals);
}

/* The gathered answers into the page: sorted, cut to the request's limit and to what is certain,
 * with the nodes and cells that did not answer. The entries move to out (g->e is NULL then). */
static int page_from(struct gather *g, dsec_list_page *out, dsec_err *err)
{
    if (g->n > 1)
        qsort(g->e, g->n, sizeof *g->e, by_entry_id);
    size_t keep = g->n < g->limit ? g->n : (size_t)g->limit;
    /* A node that had more but sent fewer than limit (its answer was cut to fit the payload
     * limit) holds unsent ids after its last one: nothing past that id is certain yet. With
     * full pages this cuts nothing (limit ids at or below any such last id exist). */
    while (g->bound[0] != '\0' && keep > 0 && strcmp(g->e[keep - 1].id, g->bound) > 0)
        keep--;
    bool more = g->more || g->n > keep;
    for (size_t i = keep; i < g->n; i++)
        entry_release(&g->e[i]);
    strset missing = {0};
    for (size_t i = 0; i < g->nodes.n; i++)
        if (!set_has(&g->answered, g->nodes.v[i]) && set_add(&missing, g->nodes.v[i]) < 0)
            g->nomem = true;
    for (size_t i = 0; i < g->cells_known.n; i++)
        if (!set_has(&g->cells_answered, g->cells_known.v[i])) {
            char cell[DSEC_NAME_MAX + 8];
            snprintf(cell, sizeof cell, "cell:%s", g->cells_known.v[i]);
            if (set_add(&missing, cell) < 0)
                g->nomem = true;
        }
    if (g->nomem) {
        set_release(&missing);
        for (size_t i = 0; i < keep; i++)
            entry_release(&g->e[i]);
        dsec_err_set(err, DSEC_E_NOMEM, 0, "list: out of memory gathering answers");
        return -1;
    }
    out->entries = g->e;
    out->n = keep;
    g->e = NULL;
    if (more && keep > 0)
        copy(out->next_cursor, sizeof out->next_cursor, out->entries[keep - 1].id);
    out->missing = missing.v;
    out->nmissing = missing.n;
    out->nodes_asked = g->nodes.n;
    out->nodes_answered = g->answered.n;
    return 0;
}

int dsec_list_sandboxes(dsec_client *c, const dsec_list_opts *opts, dsec_list_page *out,
                        dsec_err *err)
{
    static const dsec_list_opts none = {0};
    const dsec_list_opts *o = opts != NULL ? opts : &none;
    memset(out, 0, sizeof *out);
    dsec_msg_list q;
    char **keys = NULL, **vals = NULL;
    if (build_request(o, &q, &keys, &vals, err) < 0) {
        free_split(keys, vals, o);
        return -1;
    }
    int timeout = o->timeout_ms > 0 ? o->timeout_ms : dsec__client_timeout_ms(c);
    dsec_bus *bus = dsec__client_bus(c);
    const char *tenant = dsec_client_tenant(c);
    struct gather g = {.limit = (uint32_t)q.limit};
    pthread_mutex_init(&g.mu, NULL);
    pthread_cond_init(&g.cv, NULL);
    char id[33], in_nodes[160], in_list[160], subj[128];
    dsec_bus_new_id(id);
    snprintf(in_nodes, sizeof in_nodes, "%s.fleet.%s.nodes", dsec_bus_inbox_prefix(bus), id);
    snprintf(in_list, sizeof in_list, "%s.fleet.%s.list", dsec_bus_inbox_prefix(bus), id);
    dsec_actor *act = NULL;
    dsec_buf b;
    dsec_buf_init(&b);
    int rc = -1;
    /* 1. which nodes to hear from: one scheduler replica per cell answers */
    snprintf(subj, sizeof subj, DSEC_SUBJ_NODES, tenant);
    dsec_msg_node_set ns = {0};
    if (dsec_actor_new(&act, bus, "fleet-list", err) < 0 ||
        dsec_actor_on(act, in_nodes, NULL, on_nodes, &g, err) < 0 ||
        dsec_actor_on(act, in_list, NULL, on_list, &g, err) < 0 ||
        dsec_bus_flush(bus, 2000, err) < 0 || dsec_encode(&b, DSEC_MSG_NODE_SET, &ns, err) < 0 ||
        dsec_bus_publish(bus, subj, in_nodes,
                         &(dsec_hdr){.type = "node_set", .schema = DSEC_SCHEMA_VERSION}, b.data,
                         b.len, err) < 0)
        goto out;
    /* Every cell named answers, or a short wait ends it: a scheduler answers at once. */
    int cells_ms = timeout < 2000 ? timeout : 2000;
    struct timespec dl = deadline_in(cells_ms);
    pthread_mutex_lock(&g.mu);
    wait_until(&g, &dl, cells_done);
    bool any = g.cells_answered.n > 0;
    pthread_mutex_unlock(&g.mu);
    if (!any) {
        dsec_err_set(err, DSEC_E_TIMEOUT, 0,
                     "list: no scheduler answered on %s within %d ms: without one no node set is "
                     "known (is the cell up?)",
                     subj, cells_ms);
        goto out;
    }
    /* 2. every node answers its page; wait for exactly those named */
    snprintf(subj, sizeof subj, DSEC_SUBJ_LIST, tenant);
    if (dsec_encode(&b, DSEC_MSG_LIST, &q, err) < 0 ||
        dsec_bus_publish(bus, subj, in_list,
                         &(dsec_hdr){.type = "list", .schema = DSEC_SCHEMA_VERSION}, b.data, b.len,
                         err) < 0)
        goto out;
    dl = deadline_in(timeout);
    pthread_mutex_lock(&g.mu);
    wait_until(&g, &dl, nodes_done);
    pthread_mutex_unlock(&g.mu);
    dsec_actor_free(act); /* no handler runs after this */
    act = NULL;
    if (g.nomem) {
        dsec_err_set(err, DSEC_E_NOMEM, 0, "list: out of memory gathering answers");
        goto out;
    }
    if (g.failed) {
        *err = g.err;
        goto out;
    }
    if (page_from(&g, out, err) < 0)
        goto out;
    rc = 0;
out:
    if (act != NULL)
        dsec_actor_free(act);
    if (g.e != NULL) {
        for (size_t i = 0; i < g.n; i++)
            entry_release(&g.e[i]);
        dsec_free(g.e);
    }
    set_release(&g.cells_answered);
    set_release(&g.cells_known);
    set_release(&g.nodes);
    set_release(&g.answered);
    pthread_cond_destroy(&g.cv);
    pthread_mutex_destroy(&g.mu);
    dsec_buf_release(&b);
    free_split(keys, vals, o);
    return rc;
}

void dsec_list_page_release(dsec_list_page *p)
{
    if (p == NULL)
        return;
    for (size_t i = 0; i < p->n; i++)
        entry_release(&p->entries[i]);
    dsec_free(p->entries);
    for (size_t i = 0; i < p->nmissing; i++)
        dsec_free(p->missing[i]);
    dsec_free(p->missing);
    memset(p, 0, sizeof *p);
}

/* ---- events ------------------------------------------------------------------------- */

struct dsec_event_watch {
    dsec_actor *act;
    dsec_sbx_event_cb cb;
    void *ud;
};

static void on_events(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_event_watch *w = ud;
    (void)a;
    const char *type = dsec_msg_type(m);
    if (type == NULL || strcmp(type, "sandbox_events") != 0)
        return;
    dsec_decoder *dec = dsec_decoder_new(NULL);
    if (dec == NULL)
        return;
    dsec_msg_sandbox_events b;
    dsec_err err;
    if (dsec_decode(dec, DSEC_MSG_SANDBOX_EVENTS, dsec_msg_data(m), dsec_msg_len(m), &b, &err) ==
        0) {
        const dsec_msg_sandbox_event *it = b.events.items;
        for (uint32_t i = 0; i < b.events.n; i++) {
            dsec_sbx_event ev;
            memset(&ev, 0, sizeof ev);
            copy(ev.id, sizeof ev.id, it[i].id);
            copy(ev.state, sizeof ev.state, it[i].state);
            copy(ev.prev, sizeof ev.prev, it[i].prev);
            copy(ev.node, sizeof ev.node, it[i].node ? it[i].node : b.node);
            copy(ev.type, sizeof ev.type, it[i].type);
            copy(ev.reason, sizeof ev.reason, it[i].reason);
            ev.ts_ns = it[i].ts_ns;
            w->cb(&ev, w->ud);
        }
    }
    dsec_decoder_free(dec);
}

int dsec_watch_events(dsec_client *c, dsec_sbx_event_cb cb, void *ud, dsec_event_watch **out,
                      dsec_err *err)
{
    *out = NULL;
    if (cb == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "watch_events: a callback is required");
    dsec_event_watch *w = dsec_calloc(1, sizeof *w);
    if (w == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "watch_events: out of memory");
    w->cb = cb;
    w->ud = ud;
    dsec_bus *bus = dsec__client_bus(c);
    char subj[128];
    snprintf(subj, sizeof subj, DSEC_SUBJ_EVT_SBX, dsec_client_tenant(c));
    /* one lane: a node's batches are delivered in the order they came */
    if (dsec_actor_new(&w->act, bus, "event-watch", err) < 0 ||
        dsec_actor_on(w->act, subj, NULL, on_events, w, err) < 0 ||
        dsec_bus_flush(bus, 2000, err) < 0) {
        dsec_event_watch_free(w);
        return -1;
    }
    *out = w;
    return 0;
}

void dsec_event_watch_free(dsec_event_watch *w)
{
    if (w == NULL)
        return;
    if (w->act != NULL)
        dsec_actor_free(w->act);
    dsec_free(w);
}
