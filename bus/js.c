/* js.c - JetStream key-value buckets, streams, acked publishes and ordered reads over nats.c. */
#include "bus/js.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "bus/internal.h"
#include "dsec/alloc.h"

struct dsec_js {
    dsec_bus *bus;
    jsCtx *ctx;
    int timeout_ms;
};

struct dsec_kv {
    dsec_js *js;
    kvStore *kv;
    char bucket[128];
};

/* JetStream API errors carry a jsErrCode besides the status; map the ones a
 * caller can act on, and let dsec__nats_err phrase the rest. */
static int js_err(dsec_err *err, natsStatus s, jsErrCode jerr, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int js_err(dsec_err *err, natsStatus s, jsErrCode jerr, const char *fmt, ...)
{
    char ctx[DSEC_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(ctx, sizeof ctx, fmt, ap);
    va_end(ap);
    dsec__nats_err(err, s, "%s", ctx);
    if (err == NULL)
        return -1;
    if (jerr == JSStreamNotFoundErr || jerr == JSNoMessageFoundErr || s == NATS_NOT_FOUND)
        err->code = DSEC_E_NOT_FOUND;
    else if (jerr == JSStreamWrongLastSequenceErr ||
             strstr(err->msg, "wrong last sequence") != NULL)
        err->code = DSEC_E_EXISTS;
    else if (jerr == JSNotEnabledErr || jerr == JSNotEnabledForAccountErr)
        err->code = DSEC_E_UNSUPPORTED;
    else if (s == NATS_NO_RESPONDERS)
        err->code = DSEC_E_NO_RESPONDERS;
    return -1;
}

int dsec_js_new(dsec_js **out, dsec_bus *bus, int timeout_ms, dsec_err *err)
{
    *out = NULL;
    dsec_js *js = dsec_calloc(1, sizeof *js);
    if (js == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    js->bus = bus;
    js->timeout_ms = timeout_ms > 0 ? timeout_ms : 5000;
    jsOptions o;
    jsOptions_Init(&o);
    o.Wait = js->timeout_ms;
    natsStatus s = natsConnection_JetStream(&js->ctx, bus->nc, &o);
    if (s != NATS_OK) {
        dsec_free(js);
        return dsec__nats_err(err, s, "JetStream context");
    }
    *out = js;
    return 0;
}

void dsec_js_free(dsec_js *js)
{
    if (js == NULL)
        return;
    jsCtx_Destroy(js->ctx);
    dsec_free(js);
}

/* ---- key-value ----------------------------------------------------------- */

int dsec_kv_open(dsec_kv_bucket **out, dsec_js *js, const dsec_kv_conf *conf, dsec_err *err)
{
    *out = NULL;
    dsec_kv_bucket *kv = dsec_calloc(1, sizeof *kv);
    if (kv == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    kv->js = js;
    snprintf(kv->bucket, sizeof kv->bucket, "%s", conf->bucket);
    natsStatus s = js_KeyValue(&kv->kv, js->ctx, conf->bucket);
    if (s == NATS_NOT_FOUND) {
        kvConfig c;
        kvConfig_Init(&c);
        c.Bucket = conf->bucket;
        c.History = (uint8_t)(conf->history > 0 ? conf->history : 1);
        c.TTL = conf->ttl_ms * 1000000;
        c.Replicas = conf->replicas > 0 ? conf->replicas : 1;
        c.StorageType = js_FileStorage;
        s = js_CreateKeyValue(&kv->kv, js->ctx, &c);
        if (s != NATS_OK) /* created by someone else meanwhile: bind to it */
            s = js_KeyValue(&kv->kv, js->ctx, conf->bucket);
    }
    if (s != NATS_OK) {
        dsec_free(kv);
        return js_err(err, s, 0, "opening key-value bucket %s", conf->bucket);
    }
    *out = kv;
    return 0;
}

void dsec_kv_close(dsec_kv_bucket *kv)
{
    if (kv == NULL)
        return;
    kvStore_Destroy(kv->kv);
    dsec_free(kv);
}

int dsec_kv_get(dsec_kv_bucket *kv, const char *key, char **val, size_t *len, uint64_t *rev,
                dsec_err *err)
{
    *val = NULL;
    kvEntry *e = NULL;
    natsStatus s = kvStore_Get(&e, kv->kv, key);
    if (s == NATS_NOT_FOUND)
        return dsec_err_set(err, DSEC_E_NOT_FOUND, 0, "key %s not in bucket %s", key, kv->bucket);
    if (s != NATS_OK)
        return js_err(err, s, 0, "reading key %s", key);
    size_t n = (size_t)kvEntry_ValueLen(e);
    char *copy = dsec_malloc(n + 1);
    if (copy == NULL) {
        kvEntry_Destroy(e);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    }
    memcpy(copy, kvEntry_Value(e), n);
    copy[n] = '\0';
    if (rev != NULL)
        *rev = kvEntry_Revision(e);
    kvEntry_Destroy(e);
    *val = copy;
    if (len != NULL)
        *len = n;
    return 0;
}

int dsec_kv_put(dsec_kv_bucket *kv, const char *key, const void *val, size_t len, uint64_t *rev,
                dsec_err *err)
{
    uint64_t r = 0;
    natsStatus s = kvStore_Put(&r, kv->kv, key, val, (int)len);
    if (s != NATS_OK)
        return js_err(err, s, 0, "writing key %s", key);
    if (rev != NULL)
        *rev = r;
    return 0;
}

int dsec_kv_create(dsec_kv_bucket *kv, const char *key, const void *val, size_t len, uint64_t *rev,
                   dsec_err *err)
{
    uint64_t r = 0;
    natsStatus s = kvStore_Create(&r, kv->kv, key, val, (int)len);
    if (s != NATS_OK) {
        js_err(err, s, 0, "creating key %s", key);
        if (err != NULL && (err->code == DSEC_E_EXISTS || s == NATS_ERR))
            dsec_err_set(err, DSEC_E_EXISTS, 0, "key %s already exists in bucket %s", key,
                         kv->bucket);
        return -1;
    }
    if (rev != NULL)
        *rev = r;
    return 0;
}

int dsec_kv_update(dsec_kv_bucket *kv, const char *key, const void *val, size_t len, uint64_t last,
                   uint64_t *rev, dsec_err *err)
{
    uint64_t r = 0;
    natsStatus s = kvStore_Update(&r, kv->kv, key, val, (int)len, last);
    if (s != NATS_OK) {
        js_err(err, s, 0, "updating key %s", key);
        if (err != NULL && (err->code == DSEC_E_EXISTS || s == NATS_ERR))
            dsec_err_set(err, DSEC_E_EXISTS, 0, "key %s in bucket %s changed since revision %llu",
                         key, kv->bucket, (unsigned long long)last);
        return -1;
    }
    if (rev != NULL)
        *rev = r;
    return 0;
}

int dsec_kv_delete(dsec_kv_bucket *kv, const char *key, dsec_err *err)
{
    natsStatus s = kvStore_Delete(kv->kv, key);
    if (s != NATS_OK)
        return js_err(err, s, 0, "deleting key %s", key);
    return 0;
}

int dsec_kv_keys(dsec_kv_bucket *kv, char ***keys, size_t *n, dsec_err *err)
{
    *keys = NULL;
    *n = 0;
    kvKeysList l = {0};
    kvWatchOptions o;
    kvWatchOptions_Init(&o);
    o.Timeout = kv->js->timeout_ms;
    natsStatus s = kvStore_Keys(&l, kv->kv, &o);
    if (s == NATS_NOT_FOUND)
        return 0; /* an empty bucket */
    if (s != NATS_OK)
        return js_err(err, s, 0, "listing keys of %s", kv->bucket);
    char **out = dsec_calloc(l.Count ? (size_t)l.Count : 1, sizeof *out);
    if (out == NULL) {
        kvKeysList_Destroy(&l);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    }
    for (int i = 0; i < l.Count; i++) {
        if ((out[i] = dsec_strdup(l.Keys[i])) == NULL) {
            dsec_kv_keys_free(out, (size_t)i);
            kvKeysList_Destroy(&l);
            return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
        }
    }
    *keys = out;
    *n = (size_t)l.Count;
    kvKeysList_Destroy(&l);
    return 0;
}

void dsec_kv_keys_free(char **keys, size_t n)
{
    for (size_t i = 0; keys && i < n; i++)
        dsec_free(keys[i]);
    dsec_free(keys);
}

/* ---- streams ------------------------------------------------------------- */

int dsec_js_stream_ensure(dsec_js *js, const dsec_stream_conf *conf, dsec_err *err)
{
    jsStreamConfig c;
    jsStreamConfig_Init(&c);
    c.Name = conf->name;
    c.Subjects = (const char **)conf->subjects;
    c.SubjectsLen = (int)conf->nsubjects;
    c.Replicas = conf->replicas > 0 ? conf->replicas : 1;
    c.MaxAge = conf->max_age_ms * 1000000;
    c.MaxBytes = conf->max_bytes > 0 ? conf->max_bytes : -1;
    c.MaxMsgsPerSubject = conf->max_msgs_per_subject > 0 ? conf->max_msgs_per_subject : -1;
    c.Storage = conf->memory ? js_MemoryStorage : js_FileStorage;
    c.Retention = js_LimitsPolicy;
    c.AllowDirect = true; /* dsec_js_read's direct gets, answered by any replica */
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_AddStream(&si, js->ctx, &c, NULL, &jerr);
    if (s != NATS_OK && jerr == JSStreamNameExistErr) {
        jerr = 0;
        /* A caller that names no replica count must not scale an R3 stream
         * down to R1: keep the stream's. */
        if (conf->replicas <= 0) {
            dsec_stream_conf cur;
            if (dsec_js_stream_get(js, conf->name, &cur, err) < 0)
                return -1;
            if (cur.replicas > 0)
                c.Replicas = cur.replicas;
        }
        s = js_UpdateStream(&si, js->ctx, &c, NULL, &jerr);
    }
    jsStreamInfo_Destroy(si);
    if (s != NATS_OK)
        return js_err(err, s, jerr, "creating stream %s", conf->name);
    return 0;
}

int dsec_js_stream_get(dsec_js *js, const char *name, dsec_stream_conf *out, dsec_err *err)
{
    *out = (dsec_stream_conf){0};
    jsStreamInfo *si = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_GetStreamInfo(&si, js->ctx, name, NULL, &jerr);
    if (s != NATS_OK)
        return js_err(err, s, jerr, "reading stream %s", name);
    if (si != NULL && si->Config != NULL) {
        const jsStreamConfig *c = si->Config;
        out->replicas = (int)c->Replicas;
        out->max_age_ms = c->MaxAge / 1000000;
        out->max_bytes = c->MaxBytes > 0 ? c->MaxBytes : 0;
        out->max_msgs_per_subject = c->MaxMsgsPerSubject > 0 ? c->MaxMsgsPerSubject : 0;
        out->memory = c->Storage == js_MemoryStorage;
    }
    jsStreamInfo_Destroy(si);
    return 0;
}

int dsec_js_stream_delete(dsec_js *js, const char *name, dsec_err *err)
{
    jsErrCode jerr = 0;
    natsStatus s = js_DeleteStream(js->ctx, name, NULL, &jerr);
    if (s != NATS_OK)
        return js_err(err, s, jerr, "deleting stream %s", name);
    return 0;
}

int dsec_js_purge(dsec_js *js, const char *stream, const char *subject, dsec_err *err)
{
    jsOptions o;
    jsOptions_Init(&o);
    o.Stream.Purge.Subject = subject;
    jsErrCode jerr = 0;
    natsStatus s = js_PurgeStream(js->ctx, stream, &o, &jerr);
    if (s != NATS_OK)
        return js_err(err, s, jerr, "purging %s from stream %s", subject, stream);
    return 0;
}

int dsec_js_publish(dsec_js *js, const char *subject, const void *data, size_t len, uint64_t *seq,
                    dsec_err *err)
{
    jsPubAck *ack = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_Publish(&ack, js->ctx, subject, data, (int)len, NULL, &jerr);
    if (s != NATS_OK)
        return js_err(err, s, jerr, "storing a message on %s", subject);
    if (seq != NULL)
        *seq = ack->Sequence;
    jsPubAck_Destroy(ack);
    return 0;
}

int dsec_js_last(dsec_js *js, const char *stream, const char *subject, void **data, size_t *len,
                 dsec_err *err)
{
    *data = NULL;
    natsMsg *m = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_GetLastMsg(&m, js->ctx, stream, subject, NULL, &jerr);
    if (s != NATS_OK) {
        js_err(err, s, jerr, "reading the last message on %s", subject);
        if (err != NULL && err->code == DSEC_E_NOT_FOUND)
            dsec_err_set(err, DSEC_E_NOT_FOUND, 0, "no message on %s in stream %s", subject,
                         stream);
        return -1;
    }
    size_t n = (size_t)natsMsg_GetDataLength(m);
    void *copy = dsec_malloc(n ? n : 1);
    if (copy == NULL) {
        dsec__msg_destroy(&m);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    }
    memcpy(copy, natsMsg_GetData(m), n);
    dsec__msg_destroy(&m);
    *data = copy;
    *len = n;
    return 0;
}

/* Read with direct gets, one message per request, each the next one on
 * subject after the last: any replica of the stream answers them, so a read
 * works while the stream or JetStream's meta layer elects a new leader (a
 * consumer needs both, and on nats-server 2.9 creating one can time out for
 * many seconds after a leader is lost). A replica may lag its leader by the
 * last few writes. */
static int read_direct(dsec_js *js, const char *stream, const char *subject, dsec_js_each_fn fn,
                       void *ud, size_t *count, dsec_err *err)
{
    uint64_t next = 1;
    for (;;) {
        jsDirectGetMsgOptions o;
        jsDirectGetMsgOptions_Init(&o);
        o.Sequence = next;
        o.NextBySubject = subject;
        natsMsg *m = NULL;
        natsStatus s = js_DirectGetMsg(&m, js->ctx, stream, NULL, &o);
        if (s == NATS_NOT_FOUND)
            return 0; /* nothing on subject from next on */
        if (s != NATS_OK)
            return js_err(err, s, 0,
                          "reading %s: direct get from sequence %" PRIu64 " of stream %s", subject,
                          next, stream);
        uint64_t seq = natsMsg_GetSequence(m);
        if (seq < next) {
            dsec__msg_destroy(&m);
            return dsec_err_set(err, DSEC_E_INTERNAL, 0,
                                "reading %s: stream %s answered sequence %" PRIu64 " for %" PRIu64
                                " or later",
                                subject, stream, seq, next);
        }
        if (count != NULL)
            (*count)++;
        int stop = fn(natsMsg_GetSubject(m), natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m),
                      seq, ud);
        dsec__msg_destroy(&m);
        if (stop)
            return 0;
        next = seq + 1;
    }
}

int dsec_js_read(dsec_js *js, const char *stream, const char *subject, dsec_js_each_fn fn, void *ud,
                 size_t *count, dsec_err *err)
{
    if (count != NULL)
        *count = 0;
    /* Whether the stream allows direct gets (dsec's own do); a stream without
     * them would leave a direct get unanswered until the timeout. When the
     * stream's info cannot be read (an election under way), direct gets. */
    jsStreamInfo *si = NULL;
    jsErrCode ijerr = 0;
    natsStatus is = js_GetStreamInfo(&si, js->ctx, stream, NULL, &ijerr);
    if (is != NATS_OK && (ijerr == JSStreamNotFoundErr || is == NATS_NOT_FOUND))
        return js_err(err, is, ijerr, "reading %s: stream %s", subject, stream);
    bool direct = is != NATS_OK || si == NULL || si->Config == NULL || si->Config->AllowDirect;
    jsStreamInfo_Destroy(si);
    if (direct)
        return read_direct(js, stream, subject, fn, ud, count, err);
    /* a stream made without allow_direct (by another tool): an ordered consumer */
    jsSubOptions so;
    jsSubOptions_Init(&so);
    so.Stream = stream;
    so.Ordered = true;
    so.Config.DeliverPolicy = js_DeliverAll;
    natsSubscription *sub = NULL;
    jsErrCode jerr = 0;
    natsStatus s = js_SubscribeSync(&sub, js->ctx, subject, NULL, &so, &jerr);
    if (s != NATS_OK)
        return js_err(err, s, jerr, "reading %s: creating a consumer on stream %s", subject,
                      stream);
    /* The consumer's pending count when it starts says how many to expect. */
    jsConsumerInfo *ci = NULL;
    s = natsSubscription_GetConsumerInfo(&ci, sub, NULL, &jerr);
    if (s != NATS_OK) {
        natsSubscription_Destroy(sub);
        return js_err(err, s, jerr, "reading %s: the consumer's info", subject);
    }
    uint64_t want = ci->NumPending + ci->Delivered.Consumer;
    jsConsumerInfo_Destroy(ci);
    size_t got = 0;
    int rc = 0;
    while (got < want) {
        natsMsg *m = NULL;
        s = natsSubscription_NextMsg(&m, sub, js->timeout_ms);
        if (s != NATS_OK) {
            rc = js_err(err, s, 0, "reading %s: waiting for record %zu of %" PRIu64, subject,
                        got + 1, want);
            break;
        }
        jsMsgMetaData *meta = NULL;
        uint64_t seq = 0, pending = 1;
        if (natsMsg_GetMetaData(&meta, m) == NATS_OK) {
            seq = meta->Sequence.Stream;
            pending = meta->NumPending;
            jsMsgMetaData_Destroy(meta);
        }
        got++;
        int stop = fn(natsMsg_GetSubject(m), natsMsg_GetData(m), (size_t)natsMsg_GetDataLength(m),
                      seq, ud);
        dsec__msg_destroy(&m);
        if (stop || pending == 0)
            break;
    }
    natsSubscription_Unsubscribe(sub);
    natsSubscription_Destroy(sub);
    if (count != NULL)
        *count = got;
    return rc;
}
