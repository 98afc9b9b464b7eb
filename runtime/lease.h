/* lease.h - one holder at a time among actors of one role (the arbiter pair, the quota pair): a
 * lease record in a JetStream KV bucket, renewed by compare-and-set. */
#ifndef DSEC_ACTORS_LEASE_H
#define DSEC_ACTORS_LEASE_H

#include <stdbool.h>
#include <stdint.h>

#include "bus/js.h"
#include "dsec/err.h"
#include "dsec/names.h"

/* The record (dsec_msg_arbiter_lease: holder, expires_ns, acquired_ns) names
 * its holder and a wall-clock expiry lease_ms ahead. The holder renews it
 * every lease_ms/3 by compare-and-set on the revision it wrote last, so a
 * second writer can never renew it too: whoever's update fails has lost it.
 * Another instance takes it when the record is absent or has expired.
 * Expiry compares wall clocks across hosts: keep them in sync (NTP). */
typedef struct dsec_lease {
    dsec_kv_bucket *kv; /* borrowed; outlives the lease */
    char key[32];
    char holder[DSEC_NAME_LEN_MAX + 1];
    uint32_t lease_ms;
    uint64_t rev;           /* revision of the record we wrote last */
    uint64_t last_renew_ms; /* CLOCK_MONOTONIC */
    uint64_t acquired_ns;   /* wall clock; 0 when not held */
    bool held;
} dsec_lease;

typedef enum dsec_lease_state {
    DSEC_LEASE_STANDBY = 0,  /* someone else holds it (or the bucket did not answer) */
    DSEC_LEASE_HELD = 1,     /* still ours (renewed, or not yet due) */
    DSEC_LEASE_ACQUIRED = 2, /* ours from this step on */
    DSEC_LEASE_LOST = 3,     /* was ours, and the renewal failed: err says why */
} dsec_lease_state;

/* key in kv, held under the name holder (unique per instance). */
void dsec_lease_init(dsec_lease *l, dsec_kv_bucket *kv, const char *key, const char *holder,
                     uint32_t lease_ms);
/* Renew when held and due, else try to take it. Call at least every
 * lease_ms/3. Not thread-safe: one caller (a ticker) per lease. */
dsec_lease_state dsec_lease_step(dsec_lease *l, dsec_err *err);
/* A clean stop: delete the record when held, so a standby takes over at its
 * next step instead of after expiry. */
void dsec_lease_release(dsec_lease *l);

#endif
