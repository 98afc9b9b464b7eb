/* agent-client-mux.c - several exchanges at once on one agent connection: the loop sends each
 * request as the socket takes it and hands each answer frame to the exchange whose request id
 * it carries (the agent answers every request by its id, in any order). A VM's guest has one
 * spare channel to its agent; multiplexed, it carries the sandbox's process calls beside one
 * another: a signal, a list or a stdin write while an output read waits. */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>

#include "backends/agent/agent-client-int.h"
#include "backends/agent/agent-proto.h"
#include "backends/loop.h"
#include "dsec/alloc.h"

struct agent_mux {
    dsec_agent *a;
    dsec_loop *loop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* under mu: runs handed over from other threads, not yet the loop's */
    struct loop_run *incoming;
    bool posted;   /* a take is posted to the loop */
    bool closed;   /* no more runs: the connection broke or is being freed */
    bool released; /* the loop let go of everything (dsec__agent_mux_close waits for it) */
    /* The loop's hold on m, for a close from another thread while the loop stops (no post
     * reaches it then): its watch is still there (a CANCEL call is to come), or one of its
     * callbacks runs. A close on the loop's thread inside a callback (the last holder of a VM's
     * side connection let go as its last exchange ended) leaves m to that callback's end. */
    bool watching;
    int in_cb;
    bool free_pending;
    /* loop thread only */
    dsec_loop_watch *w;
    struct loop_run *runs; /* in the order they came: requests go out in that order */
};

static void mux_ready(dsec_loop_watch *w, unsigned events, void *ud);
static void mux_destroy(struct agent_mux *m);

/* A callback of m's begins, and ends: the end frees m when a close asked for it meanwhile. m is
 * not touched between the end of an exchange and mux_leave but through these. */
static void mux_enter(struct agent_mux *m)
{
    pthread_mutex_lock(&m->mu);
    m->in_cb++;
    pthread_mutex_unlock(&m->mu);
}

static void mux_leave(struct agent_mux *m)
{
    pthread_mutex_lock(&m->mu);
    bool last = --m->in_cb == 0 && m->free_pending;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
    if (last)
        mux_destroy(m);
}

/* The watch is gone (deleted, or cancelled by a stopping loop). Loop thread. */
static void mux_unwatched(struct agent_mux *m)
{
    m->w = NULL;
    pthread_mutex_lock(&m->mu);
    m->watching = false;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
}

/* End r (taken off the list by the caller): its frame goes, end hears st. */
static void run_end(struct loop_run *r, int st, dsec_err *err)
{
    dsec_free(r->frame);
    r->frame = NULL;
    r->end(r, st, err);
}

/* Every run ends with err (an exchange cut short: EXEC_BROKEN), incoming ones too, and no
 * more are taken. Loop thread. */
static void mux_fail_all(struct agent_mux *m, dsec_err *err)
{
    pthread_mutex_lock(&m->mu);
    m->closed = true;
    struct loop_run *in = m->incoming;
    m->incoming = NULL;
    pthread_mutex_unlock(&m->mu);
    for (int pass = 0; pass < 2; pass++) {
        struct loop_run *r = pass == 0 ? m->runs : in;
        if (pass == 0)
            m->runs = NULL;
        while (r != NULL) {
            struct loop_run *next = r->mux_next;
            dsec_err e = *err;
            run_end(r, EXEC_BROKEN, &e);
            r = next;
        }
    }
}

/* The connection broke: its watch goes before its fd, then every exchange ends. */
static void mux_broken(struct agent_mux *m, dsec_err *err)
{
    dsec_loop_del(m->w);
    mux_unwatched(m);
    dsec__agent_mark_broken(m->a);
    mux_fail_all(m, err);
}

/* What the watch waits for now: input always, room to send while a request is unsent, and the
 * nearest deadline. */
static void mux_rewatch(struct agent_mux *m)
{
    if (m->w == NULL)
        return;
    unsigned ev = DSEC_LOOP_IN;
    uint64_t dl = 0;
    for (struct loop_run *r = m->runs; r != NULL; r = r->mux_next) {
        if (r->frame != NULL && r->sent < r->flen)
            ev |= DSEC_LOOP_OUT;
        if (r->deadline_ns != 0 && (dl == 0 || r->deadline_ns < dl))
            dl = r->deadline_ns;
    }
    dsec_loop_set(m->w, ev, dl);
}

/* Loop thread: the runs handed over become the loop's. */
static void mux_take(dsec_loop_watch *w, unsigned events, void *ud)
{
    (void)w;
    struct agent_mux *m = ud;
    mux_enter(m);
    pthread_mutex_lock(&m->mu);
    m->posted = false; /* in_cb holds m for the rest */
    pthread_mutex_unlock(&m->mu);
    if ((events & DSEC_LOOP_CANCEL) || m->w == NULL) { /* the loop or the watch is gone */
        dsec_err err;
        dsec_err_set(&err, DSEC_E_CLOSED, 0, "the agent connection was closed");
        mux_fail_all(m, &err);
        mux_leave(m);
        return;
    }
    pthread_mutex_lock(&m->mu);
    struct loop_run *in = m->incoming;
    m->incoming = NULL;
    pthread_mutex_unlock(&m->mu);
    struct loop_run **tail = &m->runs;
    while (*tail != NULL)
        tail = &(*tail)->mux_next;
    /* incoming is newest first: reverse it onto the tail */
    struct loop_run *rev = NULL;
    while (in != NULL) {
        struct loop_run *next = in->mux_next;
        in->mux_next = rev;
        rev = in;
        in = next;
    }
    *tail = rev;
    mux_rewatch(m);
    mux_leave(m);
}

int dsec__agent_mux_run(struct loop_run *r, dsec_agent *a, dsec_err *err)
{
    struct agent_mux *m = a->mux;
    r->a = a;
    r->w = NULL;
    r->sent = 0;
    r->mux_id = dsec__agent_get_u32le(r->frame + 5);
    pthread_mutex_lock(&m->mu);
    if (m->closed || dsec_agent_broken(a)) {
        pthread_mutex_unlock(&m->mu);
        dsec_free(r->frame);
        r->frame = NULL;
        return dsec_err_set(err, DSEC_E_CLOSED, 0, "the agent connection is closed");
    }
    r->mux_next = m->incoming;
    m->incoming = r;
    bool post = !m->posted;
    m->posted = true;
    int rc = post ? dsec_loop_post(m->loop, mux_take, m, err) : 0;
    if (rc < 0) { /* the loop is stopping */
        m->incoming = r->mux_next;
        m->posted = false;
    }
    pthread_mutex_unlock(&m->mu);
    if (rc < 0) {
        dsec_free(r->frame);
        r->frame = NULL;
    }
    return rc;
}

void dsec__agent_mux_next(struct loop_run *r)
{
    r->mux_id = dsec__agent_get_u32le(r->frame + 5);
    mux_rewatch(r->a->mux);
}

/* Send what the socket takes, oldest request first. 0, or -1 when the connection broke. */
static int mux_send(struct agent_mux *m)
{
    for (struct loop_run *r = m->runs; r != NULL; r = r->mux_next) {
        while (r->frame != NULL && r->sent < r->flen) {
            ssize_t n = send(m->a->fd, r->frame + r->sent, r->flen - r->sent, MSG_NOSIGNAL);
            if (n < 0 && errno == EINTR)
                continue;
            if (n < 0 && errno == EAGAIN)
                return 0;
            if (n < 0) {
                dsec_err err;
                dsec_err_set(&err, DSEC_E_CLOSED, errno, "sending to the agent: %s",
                             strerror(errno));
                mux_broken(m, &err);
                return -1;
            }
            r->sent += (size_t)n;
        }
        if (r->frame != NULL && r->sent == r->flen) {
            dsec_free(r->frame);
            r->frame = NULL;
        }
    }
    return 0;
}

/* One answer frame: to the run it names. A greeting (id 0) means the agent began serving the
 * channel afresh and forgot every request: the connection is done for. 0, or -1 when it
 * broke. */
static int mux_frame(struct agent_mux *m, uint8_t type, uint32_t rid, const uint8_t *pl, size_t pn)
{
    dsec_err err;
    if (rid == 0) {
        dsec_err_set(&err, DSEC_E_CLOSED, 0,
                     "the agent started over on this channel (frame type %u with no request)",
                     type);
        mux_broken(m, &err);
        return -1;
    }
    for (struct loop_run **pp = &m->runs; *pp != NULL; pp = &(*pp)->mux_next) {
        struct loop_run *r = *pp;
        if (r->mux_id != rid)
            continue;
        int st = r->frame_in(r, type, rid, pl, pn, &err);
        if (st != EXEC_MORE) {
            *pp = r->mux_next;
            run_end(r, st, &err);
        }
        return 0;
    }
    return 0; /* the answer to a request that gave up waiting: dropped */
}

/* Runs whose deadline passed end (DSEC_E_TIMEOUT); the connection stays: a late answer to
 * them is dropped. */
static void mux_deadlines(struct agent_mux *m)
{
    uint64_t now = dsec_loop_now_ns();
    for (struct loop_run **pp = &m->runs; *pp != NULL;) {
        struct loop_run *r = *pp;
        if (r->deadline_ns == 0 || r->deadline_ns > now) {
            pp = &r->mux_next;
            continue;
        }
        *pp = r->mux_next;
        dsec_err err;
        dsec_err_set(&err, DSEC_E_TIMEOUT, 0, "no answer from the agent in time");
        run_end(r, EXEC_BROKEN, &err);
    }
}

static void mux_read(struct agent_mux *m)
{
    dsec_agent *a = m->a;
    dsec_err err;
    uint8_t type = 0;
    uint32_t rid = 0;
    const uint8_t *pl = NULL;
    size_t pn = 0;
    int got;
    while ((got = dsec__agent_next_frame(a, &type, &rid, &pl, &pn, &err)) == 1)
        if (mux_frame(m, type, rid, pl, pn) < 0)
            return;
    if (got < 0) {
        mux_broken(m, &err);
        return;
    }
    ssize_t n = recv(a->fd, a->buf + a->len, a->cap - a->len, 0);
    if (n < 0 && (errno == EAGAIN || errno == EINTR))
        return;
    if (n <= 0) {
        if (n == 0)
            dsec_err_set(&err, DSEC_E_CLOSED, 0, "the agent closed the connection");
        else
            dsec_err_set(&err, DSEC_E_CLOSED, errno, "receiving from the agent: %s",
                         strerror(errno));
        mux_broken(m, &err);
        return;
    }
    a->len += (size_t)n;
    while ((got = dsec__agent_next_frame(a, &type, &rid, &pl, &pn, &err)) == 1)
        if (mux_frame(m, type, rid, pl, pn) < 0)
            return;
    if (got < 0)
        mux_broken(m, &err);
}

static void mux_ready(dsec_loop_watch *w, unsigned events, void *ud)
{
    (void)w;
    struct agent_mux *m = ud;
    mux_enter(m);
    if (events & DSEC_LOOP_CANCEL) {
        mux_unwatched(m); /* the loop deletes it */
        dsec_err err;
        dsec_err_set(&err, DSEC_E_CLOSED, 0,
                     "the node manager stopped waiting for the agent's answer");
        mux_fail_all(m, &err);
    } else {
        if (events & DSEC_LOOP_TIMER)
            mux_deadlines(m);
        if (!(events & DSEC_LOOP_OUT) || mux_send(m) == 0) {
            if (events & (DSEC_LOOP_IN | DSEC_LOOP_ERR))
                mux_read(m);
            mux_rewatch(m);
        }
    }
    mux_leave(m);
}

int dsec_agent_mux_on(dsec_agent *a, struct dsec_loop *loop, dsec_err *err)
{
    if (a == NULL || loop == NULL || a->fd < 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "mux: an open connection and a loop needed");
    if (a->mux != NULL)
        return 0;
    struct agent_mux *m = dsec_calloc(1, sizeof *m);
    if (m == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "agent connection");
    pthread_mutex_init(&m->mu, NULL);
    pthread_cond_init(&m->cv, NULL);
    m->a = a;
    m->loop = loop;
    m->watching = true;
    a->mux = m;
    if (dsec_loop_add(loop, a->fd, DSEC_LOOP_IN, 0, mux_ready, m, &m->w, err) < 0) {
        a->mux = NULL;
        pthread_cond_destroy(&m->cv);
        pthread_mutex_destroy(&m->mu);
        dsec_free(m);
        return -1;
    }
    return 0;
}

/* ---- a call that waits, from a thread other than the loop's ------------------------------- */

struct sync_run {
    struct loop_run run; /* first: the run is the request */
    struct agent_mux *m;
    uint8_t want;
    bool ended;
    int rc;
    dsec_err err;
    uint8_t type;
    uint8_t *ans;
    size_t ans_len;
};

static int sync_frame(struct loop_run *lr, uint8_t type, uint32_t rid, const uint8_t *pl, size_t pn,
                      dsec_err *err)
{
    (void)rid;
    struct sync_run *s = (struct sync_run *)lr;
    if (type == DSEC__AGENT_T_ERROR) {
        dsec__agent_error_frame(pl, pn, err);
        return EXEC_REFUSED;
    }
    if (type != s->want) {
        dsec_err_set(err, DSEC_E_DECODE, 0, "agent answered with frame type %u, expected %u", type,
                     s->want);
        return EXEC_REFUSED;
    }
    s->ans = dsec_malloc(pn ? pn : 1);
    if (s->ans == NULL) {
        dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "an answer of %zu bytes", pn);
        return EXEC_REFUSED;
    }
    memcpy(s->ans, pl, pn);
    s->ans_len = pn;
    return EXEC_EXITED;
}

static void sync_end(struct loop_run *lr, int st, dsec_err *err)
{
    struct sync_run *s = (struct sync_run *)lr;
    pthread_mutex_lock(&s->m->mu);
    s->rc = st == EXEC_EXITED ? 0 : -1;
    if (s->rc < 0)
        s->err = *err;
    s->ended = true;
    pthread_cond_broadcast(&s->m->cv);
    pthread_mutex_unlock(&s->m->mu);
}

/* The answer a thread's last call got lives here until its next call (or its end). */
static pthread_key_t kept_key;
static pthread_once_t kept_once = PTHREAD_ONCE_INIT;

static void kept_free(void *p)
{
    dsec_free(p);
}

static void kept_init(void)
{
    pthread_key_create(&kept_key, kept_free);
}

int dsec__agent_mux_roundtrip(dsec_agent *a, const uint8_t *frame, size_t flen, uint8_t want,
                              const uint8_t **payload, size_t *plen, dsec_err *err)
{
    pthread_once(&kept_once, kept_init);
    struct agent_mux *m = a->mux;
    if (dsec_loop_is_current(m->loop))
        return dsec_err_set(err, DSEC_E_INTERNAL, 0,
                            "a call that waits was made on the loop's own thread");
    struct sync_run s = {.m = m, .want = want};
    s.run.frame = dsec_malloc(flen);
    if (s.run.frame == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "a request of %zu bytes", flen);
    memcpy(s.run.frame, frame, flen);
    s.run.flen = flen;
    s.run.deadline_ns = dsec_loop_now_ns() + FILE_OP_TIMEOUT_MS * 1000000ull;
    s.run.what = "the call";
    s.run.frame_in = sync_frame;
    s.run.end = sync_end;
    if (dsec__agent_mux_run(&s.run, a, err) < 0)
        return -1;
    pthread_mutex_lock(&m->mu);
    while (!s.ended)
        pthread_cond_wait(&m->cv, &m->mu);
    pthread_mutex_unlock(&m->mu);
    if (s.rc < 0) {
        *err = s.err;
        return -1;
    }
    dsec_free(pthread_getspecific(kept_key));
    pthread_setspecific(kept_key, s.ans);
    *payload = s.ans;
    *plen = s.ans_len;
    return 0;
}

/* ---- closing ------------------------------------------------------------------------------- */

/* m goes, and with it the connection when its free was left to m (free_pending). */
static void mux_destroy(struct agent_mux *m)
{
    if (m->free_pending) {
        dsec__agent_mark_broken(m->a);
        dsec_free(m->a->buf);
        dsec_free(m->a);
    }
    pthread_cond_destroy(&m->cv);
    pthread_mutex_destroy(&m->mu);
    dsec_free(m);
}

static void mux_release(struct agent_mux *m)
{
    dsec_loop_del(m->w);
    mux_unwatched(m);
    dsec_err err;
    dsec_err_set(&err, DSEC_E_CLOSED, 0, "the agent connection was closed");
    mux_fail_all(m, &err);
}

static void mux_release_posted(dsec_loop_watch *w, unsigned events, void *ud)
{
    (void)w;
    (void)events;
    struct agent_mux *m = ud;
    mux_release(m);
    pthread_mutex_lock(&m->mu);
    m->released = true;
    pthread_cond_broadcast(&m->cv);
    pthread_mutex_unlock(&m->mu);
}

bool dsec__agent_mux_close(dsec_agent *a)
{
    struct agent_mux *m = a->mux;
    dsec_err err;
    if (dsec_loop_is_current(m->loop)) {
        mux_release(m);
        pthread_mutex_lock(&m->mu);
        /* inside one of m's callbacks, which may read the connection still: its end frees m
         * and the connection */
        bool later = m->in_cb > 0;
        m->free_pending = later;
        pthread_mutex_unlock(&m->mu);
        if (later)
            return true;
        a->mux = NULL;
        mux_destroy(m);
        return false;
    }
    a->mux = NULL;
    pthread_mutex_lock(&m->mu);
    if (dsec_loop_post(m->loop, mux_release_posted, m, &err) == 0) {
        while (!m->released)
            pthread_cond_wait(&m->cv, &m->mu);
    }
    /* A take posted before (posts need not run in order) or, with the loop stopping, its
     * CANCEL calls (the watch's, a take's: they end every run) may still be to come: wait
     * until the loop is done with m. */
    while (m->watching || m->posted || m->in_cb > 0)
        pthread_cond_wait(&m->cv, &m->mu);
    pthread_mutex_unlock(&m->mu);
    mux_destroy(m);
    return false;
}
