/* lease.c - a KV lease held by compare-and-set: the arbiter's and the quota actor's active/standby
 * election. */
#include "runtime/lease.h"

#include <stdio.h>
#include <string.h>

#include "runtime/ticker.h"
#include "codecs/msg.h"
#include "dsec/alloc.h"

static uint64_t mono_ms(void)
{
    return dsec_now_ns() / 1000000ull;
}

void dsec_lease_init(dsec_lease *l, dsec_kv_bucket *kv, const char *key, const char *holder,
                     uint32_t lease_ms)
{
    memset(l, 0, sizeof *l);
    l->kv = kv;
    snprintf(l->key, sizeof l->key, "%s", key);
    snprintf(l->holder, sizeof l->holder, "%s", holder);
    l->lease_ms = lease_ms;
}

/* Write our record: create it (last 0 and create) or replace revision last. */
static int write_record(dsec_lease *l, bool create, uint64_t last, dsec_err *err)
{
    uint64_t now = dsec_wall_ns();
    dsec_msg_arbiter_lease rec = {.holder = l->holder,
                                  .expires_ns = now + (uint64_t)l->lease_ms * 1000000ull,
                                  .acquired_ns = l->acquired_ns ? l->acquired_ns : now};
    dsec_buf b;
    dsec_buf_init(&b);
    int rc = dsec_encode(&b, DSEC_MSG_ARBITER_LEASE, &rec, err);
    uint64_t rev = 0;
    if (rc == 0)
        rc = create ? dsec_kv_create(l->kv, l->key, b.data, b.len, &rev, err)
                    : dsec_kv_update(l->kv, l->key, b.data, b.len, last, &rev, err);
    dsec_buf_release(&b);
    if (rc == 0) {
        l->rev = rev;
        l->last_renew_ms = mono_ms();
        if (l->acquired_ns == 0)
            l->acquired_ns = now;
    }
    return rc;
}

dsec_lease_state dsec_lease_step(dsec_lease *l, dsec_err *err)
{
    dsec_err local;
    if (err == NULL)
        err = &local;
    if (l->held) {
        if (mono_ms() - l->last_renew_ms < l->lease_ms / 3)
            return DSEC_LEASE_HELD;
        if (write_record(l, false, l->rev, err) == 0)
            return DSEC_LEASE_HELD;
        l->held = false;
        l->acquired_ns = 0;
        return DSEC_LEASE_LOST;
    }
    char *val = NULL;
    size_t len = 0;
    uint64_t rev = 0;
    int rc;
    if (dsec_kv_get(l->kv, l->key, &val, &len, &rev, err) < 0) {
        if (err->code != DSEC_E_NOT_FOUND)
            return DSEC_LEASE_STANDBY;
        rc = write_record(l, true, 0, err);
    } else {
        /* an undecodable record is as good as none: replace it */
        dsec_msg_arbiter_lease rec;
        dsec_decoder *d = dsec_decoder_new(NULL);
        bool lapsed = d == NULL ||
                      dsec_decode(d, DSEC_MSG_ARBITER_LEASE, val, len, &rec, err) < 0 ||
                      rec.expires_ns < dsec_wall_ns() || strcmp(rec.holder, l->holder) == 0;
        dsec_decoder_free(d);
        rc = lapsed ? write_record(l, false, rev, err) : -1;
    }
    dsec_free(val);
    if (rc < 0)
        return DSEC_LEASE_STANDBY;
    l->held = true;
    return DSEC_LEASE_ACQUIRED;
}

void dsec_lease_release(dsec_lease *l)
{
    if (!l->held)
        return;
    dsec_err err;
    dsec_kv_delete(l->kv, l->key, &err);
    l->held = false;
    l->acquired_ns = 0;
}
