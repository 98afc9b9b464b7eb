/* client.c - libdsec: the connection, requests on a sandbox's subjects (retried while nobody
 * listens), its operations, one-shot function calls and lost-node notices. */
#include "codecs/subjects.h"
#include "dsec/client.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bus/bus.h"
#include "dsec/layers.h"
#include "dsec/names.h"
#include "codecs/msg.h"
#include "dsec/alloc.h"
#include "client/internal.h"

dsec_bus *dsec__client_bus(dsec_client *c)
{
    return c->bus;
}
int dsec__client_timeout_ms(const dsec_client *c)
{
    return c->timeout_ms;
}

#define MAX_LIST 256

/* ---- helpers ------------------------------------------------------------ */

uint32_t dsec__client_count_nt(const char *const *v)
{
    uint32_t n = 0;
    while (v != NULL && v[n] != NULL)
        n++;
    return n;
}

/* Split "k=v" strings into a dsec_kv whose arrays and strings are owned by
 * the caller (dsec_free of k[0..n) strings is by kv_release). */
int dsec__client_kv_from_pairs(const char *const *pairs, dsec_kv *kv, const char *what,
                               dsec_err *err)
{
    uint32_t n = dsec__client_count_nt(pairs);
    memset(kv, 0, sizeof *kv);
    if (n == 0)
        return 0;
    if (n > MAX_LIST)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "%s: %u entries, at most %d", what, n,
                            MAX_LIST);
    kv->k = dsec_calloc(n, sizeof *kv->k);
    kv->v = dsec_calloc(n, sizeof *kv->v);
    if (kv->k == NULL || kv->v == NULL)
        goto out_nomem;
    for (uint32_t i = 0; i < n; i++) {
        const char *eq = strchr(pairs[i], '=');
        if (eq == NULL || eq == pairs[i]) {
            dsec_err_set(err, DSEC_E_INVALID, 0, "%s: \"%s\" is not KEY=VALUE", what, pairs[i]);
            goto out_fail;
        }
        kv->k[i] = dsec_strndup(pairs[i], (size_t)(eq - pairs[i]));
        kv->v[i] = eq + 1;
        kv->n = i + 1;
        if (kv->k[i] == NULL)
            goto out_nomem;
    }
    return 0;
out_nomem:
    dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
out_fail:
    for (uint32_t i = 0; i < kv->n; i++)
        dsec_free((char *)kv->k[i]);
    dsec_free(kv->k);
    dsec_free(kv->v);
    memset(kv, 0, sizeof *kv);
    return -1;
}

void dsec__client_kv_release(dsec_kv *kv)
{
    for (uint32_t i = 0; i < kv->n; i++)
        dsec_free((char *)kv->k[i]);
    dsec_free(kv->k);
    dsec_free(kv->v);
    memset(kv, 0, sizeof *kv);
}

void dsec__client_copy_str(char *dst, size_t n, const char *src)
{
    snprintf(dst, n, "%s", src ? src : "");
}

/* Turn a reply into either the expected message (decoded into out) or the
 * error it carries. */
int dsec__client_decode_reply(dsec_decoder *dec, dsec_msg *reply, int type, void *out,
                              dsec_err *err)
{
    const char *t = dsec_msg_type(reply);
    if (t != NULL && strcmp(t, "error") == 0) {
        const char *code = dsec_msg_header(reply, "Dsec-Error-Code");
        if (dsec_msg_len(reply) == 0) { /* a bus-level error reply: no actor read the request */
            int k = code ? dsec_code_from_name(code) : DSEC_E_INTERNAL;
            const char *why = k == DSEC_E_OVERFLOW      ? "the responder is overloaded"
                              : k == DSEC_E_CLOSED      ? "the responder is shutting down"
                              : k == DSEC_E_UNSUPPORTED ? "the responder reads an older schema "
                                                          "version than this client sends"
                                                        : "the responder's bus refused it";
            return dsec_err_set(err, k, 0, "%s: %s (%s)", dsec_msg_subject(reply), why,
                                code ? code : "error");
        }
        dsec_msg_error e;
        if (dsec_decode(dec, DSEC_MSG_ERROR, dsec_msg_data(reply), dsec_msg_len(reply), &e, err) <
            0)
            return dsec_err_wrap(err, "decoding error reply");
        dsec_err_set(err, dsec_code_from_name(e.code), 0, "%s", e.message);
        if (err != NULL) /* bounded: a hostile or confused responder cannot park the caller */
            err->retry_after_ms = e.retry_after_ms > 3600000 ? 3600000 : (unsigned)e.retry_after_ms;
        return -1;
    }
    const char *want = dsec_msg_type_name(type);
    if (t == NULL || strcmp(t, want) != 0)
        return dsec_err_set(err, DSEC_E_DECODE, 0, "expected a \"%s\" reply, got \"%s\"", want,
                            t ? t : "(no type header)");
    if (dsec_decode(dec, type, dsec_msg_data(reply), dsec_msg_len(reply), out, err) < 0)
        return dsec_err_wrap(err, "decoding %s reply", want);
    return 0;
}

/* One request/reply round trip with retries on retry-safe transport errors.
 * On success the reply is decoded into out with dec (valid until dec's next
 * decode). */
static int call_for(dsec_client *c, const char *subject, const char *type_name, const dsec_buf *req,
                    const char *req_id, int reply_type, dsec_decoder *dec, dsec_msg **keep,
                    void *out, int timeout_ms, dsec_err *err)
{
    dsec_hdr hdr = {.type = type_name, .schema = DSEC_SCHEMA_VERSION, .req_id = req_id};
    int rc = -1;
    for (int attempt = 0;; attempt++) {
        dsec_msg *reply = NULL;
        rc = dsec_bus_request_sync(c->bus, subject, &hdr, req->data, req->len, timeout_ms, &reply,
                                   err);
        if (rc == 0) {
            rc = dsec__client_decode_reply(dec, reply, reply_type, out, err);
            *keep = reply;
            return rc;
        }
        /* Ops other than create are retried only when the request surely
         * never ran: nobody was listening. */
        if (err->code != DSEC_E_NO_RESPONDERS || attempt >= c->retries)
            return rc;
        struct timespec ts = {0, 50 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

/* ---- connect -------------------------------------------------------------- */

int dsec_client_connect(dsec_client **out, const dsec_client_opts *opts, dsec_err *err)
{
    dsec_client_opts o = opts ? *opts : (dsec_client_opts){0};
    *out = NULL;
    const char *tenant = o.tenant ? o.tenant : getenv("DSEC_TENANT");
    if (tenant == NULL || tenant[0] == '\0')
        tenant = "default";
    if (dsec_name_ok(tenant, DSEC_NAME_LEN_MAX) < 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "tenant \"%s\": use 1-64 characters from A-Z a-z 0-9 _ -", tenant);
    dsec_client *c = dsec_calloc(1, sizeof *c);
    if (c != NULL) {
        pthread_mutex_init(&c->rmu, NULL);
        pthread_cond_init(&c->rcv, NULL);
    }
    if (c == NULL || (c->tenant = dsec_strdup(tenant)) == NULL ||
        (c->pace = dsec_pace_new()) == NULL) {
        dsec_client_free(c);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    }
    c->timeout_ms = o.timeout_ms > 0 ? o.timeout_ms : 10000;
    c->retries = o.retries > 0 ? o.retries : (o.retries < 0 ? 0 : 2);
    c->direct_callbacks = o.direct_callbacks;
    /* a client waits on every answer: publish at once rather than batch */
    /* replies under _INBOX.<tenant>: a bus configured by `dsec auth` lets this
     * tenant subscribe there and nowhere else, so no tenant reads another's answers */
    char inbox[DSEC_NAME_LEN_MAX + 8];
    snprintf(inbox, sizeof inbox, "_INBOX.%s", tenant);
    dsec_bus_opts bo = {.url = o.url,
                        .name = o.name ? o.name : "dsec-client",
                        .threads = o.threads > 0 ? o.threads : 2,
                        .low_latency = true,
                        .inbox_prefix = inbox,
                        .schema_max = DSEC_SCHEMA_VERSION};
    if (dsec_bus_connect(&c->bus, &bo, err) < 0) {
        dsec_client_free(c);
        return -1;
    }
    *out = c;
    return 0;
}

void dsec_client_free(dsec_client *c)
{
    if (c == NULL)
        return;
    /* creates waiting for their retry go out now, so that every one is answered
     * before the bus drains below */
    pthread_mutex_lock(&c->rmu);
    c->retrier_stop = true;
    bool started = c->retrier_started;
    pthread_cond_broadcast(&c->rcv);
    pthread_mutex_unlock(&c->rmu);
    if (started)
        pthread_join(c->retrier, NULL);
    pthread_mutex_destroy(&c->rmu);
    pthread_cond_destroy(&c->rcv);
    dsec_actor_free(c->lost);
    dsec_bus_free(c->bus);
    dsec_pace_free(c->pace); /* after the bus: its last answers still tell the pace */
    dsec_free(c->tenant);
    dsec_free(c);
}

const char *dsec_client_tenant(const dsec_client *c)
{
    return c->tenant;
}

int dsec_id_node(const char *id, char *node, size_t n, dsec_err *err)
{
    const char *dash = id ? strrchr(id, '-') : NULL;
    size_t len = dash ? (size_t)(dash - id) : 0;
    if (dash == NULL || len == 0 || len >= n || strlen(dash + 1) != 16 ||
        dsec_name_ok(id, DSEC_SBX_ID_LEN_MAX) < 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "\"%s\" is not a sandbox id (NODE-XXXXXXXXXXXXXXXX)", id ? id : "");
    memcpy(node, id, len);
    node[len] = '\0';
    return 0;
}

/* ---- operations on a sandbox ---------------------------------------------- */

int dsec__client_sbx_subject(dsec_client *c, const char *id, const char *op, char *subj, size_t n,
                             dsec_err *err)
{
    char node[DSEC_NAME_MAX];
    if (dsec_id_node(id, node, sizeof node, err) < 0)
        return -1;
    snprintf(subj, n, DSEC_SUBJ_SBX, c->tenant, node, id, op);
    return 0;
}

/* Encode msg, send it to the sandbox's op subject, decode the reply into out.
 * The reply message is kept in *keep until the caller frees it. */
int dsec__client_sbx_call_for(dsec_client *c, const char *id, const char *op, int type,
                              const void *msg, const char *req_id, int reply_type,
                              dsec_decoder *dec, dsec_msg **keep, void *out, int timeout_ms,
                              dsec_err *err)
{
    char subj[256];
    dsec_buf buf;
    dsec_buf_init(&buf);
    *keep = NULL;
    int rc = dsec__client_sbx_subject(c, id, op, subj, sizeof subj, err);
    if (rc == 0)
        rc = dsec_encode(&buf, type, msg, err);
    if (rc == 0)
        rc = call_for(c, subj, dsec_msg_type_name(type), &buf, req_id, reply_type, dec, keep, out,
                      timeout_ms, err);
    dsec_buf_release(&buf);
    return rc;
}

int dsec__client_sbx_call(dsec_client *c, const char *id, const char *op, int type, const void *msg,
                          int reply_type, dsec_decoder *dec, dsec_msg **keep, void *out,
                          dsec_err *err)
{
    return dsec__client_sbx_call_for(c, id, op, type, msg, NULL, reply_type, dec, keep, out,
                                     c->timeout_ms, err);
}

void dsec_strv_free(char **v, size_t n)
{
    for (size_t i = 0; v != NULL && i < n; i++)
        dsec_free(v[i]);
    dsec_free(v);
}

/* Send m (an "op" message, given a new request id and the client's tenant)
 * and decode its reply into *r with *dec, which the caller frees with *keep. */
static int op_send(dsec_client *c, dsec_msg_op *m, dsec_decoder **dec, dsec_msg **keep,
                   dsec_msg_op_reply *r, dsec_err *err)
{
    char req_id[33];
    dsec_bus_new_id(req_id);
    m->req_id = req_id;
    m->tenant = c->tenant;
    *keep = NULL;
    if ((*dec = dsec_decoder_new(NULL)) == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    return dsec__client_sbx_call(c, m->id, "op", DSEC_MSG_OP, m, DSEC_MSG_OP_REPLY, *dec, keep, r,
                                 err);
}

/* pause, resume, destroy, status, fork: the "op" message. */
static int op_call_net(dsec_client *c, const char *id, const char *op, uint64_t n, const char *name,
                       dsec_strv net, dsec_sandbox_info *info, char ***ids, size_t *nids,
                       dsec_err *err)
{
    dsec_msg_op m = {.id = id, .op = op, .n = n, .name = name, .net = net};
    dsec_decoder *dec;
    dsec_msg *keep;
    dsec_msg_op_reply r;
    int rc = op_send(c, &m, &dec, &keep, &r, err);
    if (rc == 0 && info != NULL) {
        memset(info, 0, sizeof *info);
        dsec__client_copy_str(info->id, sizeof info->id, r.id);
        dsec__client_copy_str(info->node, sizeof info->node, r.node);
        dsec__client_copy_str(info->type, sizeof info->type, r.type);
        dsec__client_copy_str(info->state, sizeof info->state, r.state);
    }
    if (rc == 0 && ids != NULL) {
        char **v = dsec_calloc(r.ids.n ? r.ids.n : 1, sizeof *v);
        for (uint32_t i = 0; v != NULL && i < r.ids.n; i++)
            if ((v[i] = dsec_strdup(r.ids.v[i])) == NULL) {
                dsec_strv_free(v, i);
                v = NULL;
            }
        if (v == NULL)
            rc = dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
        else {
            *ids = v;
            *nids = r.ids.n;
        }
    }
    dsec_msg_free(keep);
    dsec_decoder_free(dec);
    return rc;
}

static int op_call(dsec_client *c, const char *id, const char *op, uint64_t n, const char *name,
                   dsec_sandbox_info *info, char ***ids, size_t *nids, dsec_err *err)
{
    return op_call_net(c, id, op, n, name, (dsec_strv){0}, info, ids, nids, err);
}

int dsec_set_network(dsec_client *c, const char *id, const char *const *entries, size_t n,
                     dsec_err *err)
{
    if (n > 64)
        return dsec_err_set(err, DSEC_E_TOO_LARGE, 0,
                            "network policy has %zu entries; at most 64 are allowed", n);
    for (size_t i = 0; i < n; i++)
        if (entries[i] == NULL || entries[i][0] == '\0')
            return dsec_err_set(err, DSEC_E_INVALID, 0, "network policy entry %zu is empty", i);
    dsec_strv v = {.v = (const char **)entries, .n = (uint32_t)n};
    return op_call_net(c, id, "net", 0, NULL, v, NULL, NULL, NULL, err);
}

int dsec_set_ttl(dsec_client *c, const char *id, uint64_t ttl_s, uint64_t *expires_ns,
                 dsec_err *err)
{
    if (ttl_s == 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "ttl: ttl_s must be at least 1 (seconds from now); dsec_destroy ends "
                            "a sandbox at once");
    dsec_msg_op m = {.id = id, .op = "ttl", .ttl_s = ttl_s};
    dsec_decoder *dec;
    dsec_msg *keep;
    dsec_msg_op_reply r;
    int rc = op_send(c, &m, &dec, &keep, &r, err);
    if (rc == 0 && expires_ns != NULL) {
        *expires_ns = 0;
        for (uint32_t i = 0; i < r.info.n; i++)
            if (strcmp(r.info.k[i], "expires_ns") == 0)
                *expires_ns = strtoull(r.info.v[i], NULL, 10);
    }
    dsec_msg_free(keep);
    dsec_decoder_free(dec);
    return rc;
}

int dsec_fork(dsec_client *c, const char *id, unsigned n, char ***ids, size_t *nids, dsec_err *err)
{
    *ids = NULL;
    *nids = 0;
    if (n == 0 || n > 1024)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "fork: n must be 1..1024, got %u", n);
    return op_call(c, id, "fork", n, NULL, NULL, ids, nids, err);
}

int dsec_snapshot(dsec_client *c, const char *id, const char *name, dsec_err *err)
{
    if (name == NULL || !dsec_layer_name_valid(name))
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "snapshot: name must be an environment name:version, got \"%s\"",
                            name ? name : "");
    return op_call(c, id, "snapshot", 0, name, NULL, NULL, NULL, err);
}

int dsec_pause(dsec_client *c, const char *id, dsec_err *err)
{
    return op_call(c, id, "pause", 0, NULL, NULL, NULL, NULL, err);
}

int dsec_resume(dsec_client *c, const char *id, dsec_err *err)
{
    return op_call(c, id, "resume", 0, NULL, NULL, NULL, NULL, err);
}

int dsec_destroy(dsec_client *c, const char *id, dsec_err *err)
{
    return op_call(c, id, "destroy", 0, NULL, NULL, NULL, NULL, err);
}

int dsec_status(dsec_client *c, const char *id, dsec_sandbox_info *out, dsec_err *err)
{
    return op_call(c, id, "status", 0, NULL, out, NULL, NULL, err);
}

int dsec_wait_state(dsec_client *c, const char *id, const char *state, int timeout_ms,
                    dsec_err *err)
{
    struct timespec start, now;
    clock_gettime(CLOCK_MONOTONIC, &start);
    long sleep_ms = 5;
    for (;;) {
        dsec_sandbox_info info;
        if (dsec_status(c, id, &info, err) < 0) {
            if (err->code == DSEC_E_NOT_FOUND && strcmp(state, "gone") == 0)
                return 0;
            return -1;
        }
        if (strcmp(info.state, state) == 0)
            return 0;
        if (strcmp(info.state, "gone") == 0 || strcmp(info.state, "failed") == 0)
            return dsec_err_set(err, DSEC_E_NOT_FOUND, 0, "sandbox %s is %s, not %s", id,
                                info.state, state);
        clock_gettime(CLOCK_MONOTONIC, &now);
        long waited = (now.tv_sec - start.tv_sec) * 1000 + (now.tv_nsec - start.tv_nsec) / 1000000;
        if (waited >= timeout_ms)
            return dsec_err_set(err, DSEC_E_TIMEOUT, 0, "sandbox %s still %s after %d ms (want %s)",
                                id, info.state, timeout_ms, state);
        struct timespec ts = {0, sleep_ms * 1000 * 1000};
        nanosleep(&ts, NULL);
        if (sleep_ms < 100)
            sleep_ms *= 2;
    }
}

/* ---- one-shot function calls ------------------------------------------------------ */

int dsec_call(dsec_client *c, const dsec_call_spec *spec, dsec_exec_reply *res, dsec_err *err)
{
    memset(res, 0, sizeof *res);
    if (spec == NULL || spec->argv == NULL || spec->argv[0] == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "call: empty argv");
    char rt[64], cpu[48];
    snprintf(rt, sizeof rt, "runtime=%s", spec->runtime ? spec->runtime : "python3");
    snprintf(cpu, sizeof cpu, "cpu_ms=%llu", (unsigned long long)spec->cpu_ms);
    const char *labels[] = {rt, spec->cpu_ms ? cpu : NULL, NULL};
    /* A ttl past the call's end: if this client dies mid-call, the node
     * reaps the sandbox on its own. */
    uint64_t ttl = (spec->timeout_ms ? spec->timeout_ms / 1000 : 600) + 60;
    dsec_create_spec cs = {.type = "function",
                           .labels = labels,
                           .memory_mb = spec->memory_mb,
                           .ttl_s = ttl,
                           .cell = spec->cell,
                           .env = spec->environment,
                           .net = spec->net};
    dsec_sandbox_info info;
    if (dsec_create(c, &cs, &info, err) < 0)
        return dsec_err_wrap(err, "call: creating the function sandbox");
    int rc = 0;
    for (size_t i = 0; rc == 0 && i < spec->nfiles; i++) {
        const dsec_call_file *f = &spec->files[i];
        rc = dsec_file_write(c, info.id, f->path, f->data, f->len, f->mode ? f->mode : 0644, err);
        if (rc < 0)
            dsec_err_wrap(err, "call: writing %s", f->path ? f->path : "(null)");
    }
    if (rc == 0) {
        dsec_exec_opts o = {.argv = spec->argv,
                            .env = spec->env,
                            .stdin_data = spec->stdin_data,
                            .stdin_len = spec->stdin_len,
                            .timeout_ms = spec->timeout_ms,
                            .output_max = spec->output_max};
        rc = dsec_exec(c, info.id, &o, res, err);
    }
    dsec_err derr;
    dsec_destroy(c, info.id, &derr); /* best effort: the ttl covers a lost destroy */
    return rc;
}

/* ---- nodes declared lost ------------------------------------------------------------ */

static void on_lost(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_client *c = ud;
    dsec_msg_node_lost nl;
    dsec_err err;
    dsec_decoder *dec = dsec_decoder_new(NULL); /* rare: one per event */
    if (dec == NULL ||
        dsec_decode(dec, DSEC_MSG_NODE_LOST, dsec_msg_data(m), dsec_msg_len(m), &nl, &err) < 0) {
        dsec_decoder_free(dec);
        dsec_actor_count_error(a);
        return;
    }
    c->lost_cb(nl.node, nl.cell ? nl.cell : "", nl.lost_ns, c->lost_ud);
    dsec_decoder_free(dec);
}

int dsec_watch_lost(dsec_client *c, dsec_node_lost_cb cb, void *ud, dsec_err *err)
{
    if (cb == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "watch_lost: a callback is required");
    if (c->lost != NULL)
        return dsec_err_set(err, DSEC_E_STATE, 0, "watch_lost: this client already watches");
    c->lost_cb = cb;
    c->lost_ud = ud;
    char subj[128];
    snprintf(subj, sizeof subj, DSEC_SUBJ_EVT_LOST, c->tenant);
    if (dsec_actor_new(&c->lost, c->bus, "lost-watch", err) < 0)
        return -1;
    if (dsec_actor_on(c->lost, subj, NULL, on_lost, c, err) < 0 ||
        dsec_bus_flush(c->bus, 2000, err) < 0) {
        dsec_actor_free(c->lost);
        c->lost = NULL;
        return -1;
    }
    return 0;
}
