/* node-list.c - fleet handling on the node: a tenant's sandboxes listed from the node's own table,
 * their labels, and lifecycle events per tenant. */
#include "actors/node-int.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "actors/wire.h"
#include "codecs/subjects.h"
#include "dsec/alloc.h"

/* ---- labels ---------------------------------------------------------------------- */

int dsec__node_labels_set(struct sbx *s, const char *const *k, const char *const *v, uint32_t n)
{
    size_t len = 0;
    for (uint32_t i = 0; i < n; i++)
        len += strlen(k[i]) + strlen(v[i]) + 2;
    if (n == 0)
        return 0;
    char *b = dsec_malloc(len);
    if (b == NULL)
        return -1;
    size_t off = 0;
    for (uint32_t i = 0; i < n; i++) {
        size_t kl = strlen(k[i]) + 1, vl = strlen(v[i]) + 1;
        memcpy(b + off, k[i], kl);
        memcpy(b + off + kl, v[i], vl);
        off += kl + vl;
    }
    s->labels = b;
    s->labels_len = len;
    s->nlabels = n;
    return 0;
}

int dsec__node_labels_copy(struct sbx *dst, const struct sbx *src)
{
    if (src->nlabels == 0)
        return 0;
    char *b = dsec_malloc(src->labels_len);
    if (b == NULL)
        return -1;
    memcpy(b, src->labels, src->labels_len);
    dst->labels = b;
    dst->labels_len = src->labels_len;
    dst->nlabels = src->nlabels;
    return 0;
}

/* Labels may hold any byte but NUL, the journal's separators included: the record carries
 * the "key\0value\0" pairs in hex. */
char *dsec__node_labels_record(const struct sbx *s)
{
    static const char hex[] = "0123456789abcdef";
    char *out = dsec_malloc(s->labels_len * 2 + 1);
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < s->labels_len; i++) {
        out[2 * i] = hex[(uint8_t)s->labels[i] >> 4];
        out[2 * i + 1] = hex[(uint8_t)s->labels[i] & 15];
    }
    out[s->labels_len * 2] = '\0';
    return out;
}

static int nibble(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* A record's labels field back into s: 0, or -1 when it is not what labels_record wrote
 * (the sandbox is adopted without labels then). */
int dsec__node_labels_parse(struct sbx *s, const char *rec)
{
    size_t hl = strlen(rec);
    if (hl == 0)
        return 0;
    if (hl % 2 != 0)
        return -1;
    size_t len = hl / 2;
    char *b = dsec_malloc(len);
    if (b == NULL)
        return -1;
    uint32_t zeros = 0;
    for (size_t i = 0; i < len; i++) {
        int hi = nibble(rec[2 * i]), lo = nibble(rec[2 * i + 1]);
        if (hi < 0 || lo < 0) {
            dsec_free(b);
            return -1;
        }
        b[i] = (char)(hi << 4 | lo);
        zeros += b[i] == '\0';
    }
    if (zeros % 2 != 0 || b[len - 1] != '\0') {
        dsec_free(b);
        return -1;
    }
    s->labels = b;
    s->labels_len = len;
    s->nlabels = zeros / 2;
    return 0;
}

static bool labels_match(const struct sbx *s, const dsec_kv *want)
{
    for (uint32_t i = 0; i < want->n; i++) {
        bool found = false;
        const char *p = s->labels;
        for (uint32_t j = 0; j < s->nlabels && !found; j++) {
            const char *k = p, *v = p + strlen(p) + 1;
            found = strcmp(k, want->k[i]) == 0 && strcmp(v, want->v[i]) == 0;
            p = v + strlen(v) + 1;
        }
        if (!found)
            return false;
    }
    return true;
}

/* ---- list ------------------------------------------------------------------------ */

/* One match, copied under the node lock: the sandbox may be gone when the answer leaves. */
struct hit {
    char id[DSEC_SBX_ID_LEN_MAX + 1];
    char project[DSEC_NAME_LEN_MAX + 1];
    uint8_t state, type_idx;
    uint64_t created_ns, expires_ns;
    uint32_t cpu_milli, memory_mb;
    char *labels; /* copy */
    uint32_t nlabels;
};

static int by_id(const void *a, const void *b)
{
    return strcmp(((const struct hit *)a)->id, ((const struct hit *)b)->id);
}

static int state_index(const char *name)
{
    for (int i = ST_REQUESTED; i <= ST_STOPPING; i++)
        if (strcmp(dsec__node_state_names[i], name) == 0)
            return i;
    return -1;
}

/* This node's sandboxes of tenant that match q (want_state: its state's index, or -1), after
 * its cursor, copied out under the node's lock into *hits (the caller frees *hits and the labels
 * of its *nhits hits, all there is when out of memory too); -1 when out of memory. */
static int list_hits(dsec_node *n, const char *tenant, const dsec_msg_list *q, int want_state,
                     struct hit **hits, size_t *nhits)
{
    const char *after = q->after != NULL ? q->after : "";
    size_t cap = 64, nh = 0;
    struct hit *h = dsec_malloc(cap * sizeof *h);
    bool nomem = h == NULL;
    pthread_mutex_lock(&n->mu);
    for (size_t b = 0; b < n->nbuckets && !nomem; b++)
        for (struct sbx *s = n->by_id[b]; s && !nomem; s = s->next_id) {
            int st = s->state;
            if (strcmp(s->tenant, tenant) != 0 || strcmp(s->id, after) <= 0 || st == ST_GONE ||
                st == ST_FAILED || (want_state >= 0 && st != want_state) ||
                (q->type != NULL && strcmp(dsec__node_type_name(n, s->type_idx), q->type) != 0) ||
                !labels_match(s, &q->labels))
                continue;
            if (nh == cap) {
                struct hit *nhp = dsec_realloc(h, cap * 2 * sizeof *h);
                if (nhp == NULL) {
                    nomem = true;
                    break;
                }
                h = nhp;
                cap *= 2;
            }
            struct hit *x = &h[nh];
            memcpy(x->id, s->id, sizeof x->id);
            memcpy(x->project, s->project, sizeof x->project);
            x->state = (uint8_t)st;
            x->type_idx = s->type_idx;
            x->created_ns = s->created_ns;
            x->expires_ns = s->ttl_ns ? s->created_ns + s->ttl_ns : 0;
            x->cpu_milli = s->cpu_milli;
            x->memory_mb = s->memory_mb;
            x->labels = NULL;
            x->nlabels = 0;
            if (s->nlabels > 0) {
                if ((x->labels = dsec_malloc(s->labels_len)) == NULL) {
                    nomem = true;
                    break;
                }
                memcpy(x->labels, s->labels, s->labels_len);
                x->nlabels = s->nlabels;
            }
            nh++;
        }
    pthread_mutex_unlock(&n->mu);
    *hits = h;
    *nhits = nh;
    return nomem ? -1 : 0;
}

/* dsec.v1.<tenant>.list: this node's sandboxes of that tenant (the subject's, never the
 * body's) that match, after the cursor, sorted by id, at most limit; more says whether
 * there were others. Every node answers, with no items when it has none: the client waits
 * for each node a scheduler named, so a node's silence is told apart from "none here". */
void dsec__node_on_list(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_node *n = ud;
    dsec_err err;
    dsec_msg_list q;
    char buf[256];
    const char *tok[5];
    if (dsec_wire_tokens(dsec_msg_subject(m), buf, sizeof buf, tok, 5) != 4 ||
        strcmp(tok[3], "list") != 0 || strcmp(tok[2], "ctl") == 0) {
        dsec__node_reply_bad(n, m, "subject", "subject %s: expected dsec.v1.TENANT.list",
                             dsec_msg_subject(m));
        return;
    }
    const char *tenant = tok[2];
    if (!dsec_wire_type_ok(a, m, DSEC_MSG_LIST))
        return;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_LIST, dsec_msg_data(m), dsec_msg_len(m), &q,
                    &err) < 0) {
        dsec_wire_error(a, m, &err);
        return;
    }
    int want_state = -1;
    if (q.state != NULL && (want_state = state_index(q.state)) < 0) {
        dsec__node_reply_bad(n, m, "state",
                             "list: state \"%.64s\" is not one of requested, starting, running, "
                             "paused, stopping",
                             q.state);
        return;
    }
    struct hit *h = NULL;
    size_t nh = 0;
    bool nomem = list_hits(n, tenant, &q, want_state, &h, &nh) < 0;
    dsec_msg_sbx_info *items = NULL;
    const char **kv = NULL;
    size_t nkv = 0;
    if (nomem)
        goto out_nomem;
    qsort(h, nh, sizeof *h, by_id);
    size_t take = nh < q.limit ? nh : (size_t)q.limit;
    for (size_t i = 0; i < take; i++)
        nkv += h[i].nlabels;
    items = dsec_calloc(take ? take : 1, sizeof *items);
    kv = dsec_malloc((nkv ? nkv : 1) * 2 * sizeof *kv);
    if (items == NULL || kv == NULL)
        goto out_nomem;
    size_t at = 0;
    for (size_t i = 0; i < take; i++) {
        const char **k = kv + at, **v = kv + nkv + at;
        const char *p = h[i].labels;
        for (uint32_t j = 0; j < h[i].nlabels; j++) {
            k[j] = p;
            v[j] = p + strlen(p) + 1;
            p = v[j] + strlen(v[j]) + 1;
        }
        at += h[i].nlabels;
        items[i] = (dsec_msg_sbx_info){.id = h[i].id,
                                       .type = dsec__node_type_name(n, h[i].type_idx),
                                       .state = dsec__node_state_names[h[i].state],
                                       .node = n->name,
                                       .labels = {k, v, h[i].nlabels},
                                       .project = h[i].project[0] ? h[i].project : NULL,
                                       .created_ns = h[i].created_ns,
                                       .expires_ns = h[i].expires_ns,
                                       .cpu_milli = h[i].cpu_milli,
                                       .memory_mb = h[i].memory_mb};
    }
    /* An answer over the payload limit (thousands of large label sets) is cut in half
     * until it fits; more tells the client to ask again from its last id. */
    for (size_t send = take;;) {
        dsec_msg_list_reply out = {
            .node = n->name, .cell = n->cell, .items = {items, (uint32_t)send}, .more = send < nh};
        if (dsec_wire_reply(a, m, DSEC_MSG_LIST_REPLY, &out, &err) == 0)
            break;
        if (err.code != DSEC_E_TOO_LARGE || send <= 1) {
            dsec_actor_count_error(a);
            dsec_wire_error(a, m, &err);
            break;
        }
        send /= 2;
    }
    goto out;
out_nomem:
    dsec__node_reply_err(n, m, DSEC_E_NOMEM, "list: out of memory on node %s", n->name);
out:
    for (size_t i = 0; h != NULL && i < nh; i++)
        dsec_free(h[i].labels);
    dsec_free(h);
    dsec_free(items);
    dsec_free(kv);
}

/* ---- events per tenant ------------------------------------------------------------- */

struct tev {
    const dsec_msg_sandbox_event *e;
    size_t i; /* its place in the batch: a sandbox's events keep their order */
};

static int by_tenant(const void *a, const void *b)
{
    const struct tev *x = a, *y = b;
    int c = strcmp(x->e->tenant ? x->e->tenant : "", y->e->tenant ? y->e->tenant : "");
    return c != 0 ? c : (x->i > y->i) - (x->i < y->i);
}

/* Each tenant's events of the batch on its own subject, so NATS permissions that confine a
 * tenant to dsec.v1.<tenant>.> let it follow its sandboxes and no one else's. One message
 * per tenant per report window: events still do not multiply the messages per create. */
void dsec__node_send_tenant_events(dsec_node *n, const dsec_msg_sandbox_event *items, size_t ne)
{
    if (ne == 0)
        return;
    struct tev *t = dsec_malloc(ne * sizeof *t);
    dsec_msg_sandbox_event *v = dsec_malloc(ne * sizeof *v);
    if (t == NULL || v == NULL) {
        dsec_free(t);
        dsec_free(v);
        dsec_actor_count_error(n->actor);
        return;
    }
    for (size_t i = 0; i < ne; i++)
        t[i] = (struct tev){&items[i], i};
    qsort(t, ne, sizeof *t, by_tenant);
    for (size_t i = 0; i < ne; i++)
        v[i] = *t[i].e;
    for (size_t i = 0; i < ne;) {
        const char *tenant = v[i].tenant ? v[i].tenant : "";
        size_t j = i + 1;
        while (j < ne && j - i < 4096 && strcmp(v[j].tenant ? v[j].tenant : "", tenant) == 0)
            j++;
        char subj[192];
        if (tenant[0] != '\0' && strcmp(tenant, "ctl") != 0 &&
            dsec_name_ok(tenant, DSEC_NAME_LEN_MAX) == 0) {
            snprintf(subj, sizeof subj, DSEC_SUBJ_EVT_SBX, tenant);
            dsec_msg_sandbox_events batch = {
                .node = n->name, .cell = n->cell, .events = {v + i, (uint32_t)(j - i)}};
            dsec_err err;
            if (dsec_wire_send(n->actor, n->bus, subj, NULL, DSEC_MSG_SANDBOX_EVENTS, &batch, NULL,
                               &err) < 0)
                dsec_actor_count_error(n->actor);
        }
        i = j;
    }
    dsec_free(t);
    dsec_free(v);
}
