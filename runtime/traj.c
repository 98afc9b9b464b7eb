/* traj.c - the trajectory log over a JetStream stream: append before answering, find a step, read a
 * rollout. */
#include "codecs/subjects.h"
#include "runtime/traj.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "bus/js.h"
#include "dsec/alloc.h"

struct dsec_traj {
    dsec_js *js;
    char stream[64];
};

int dsec_traj_check_id(const char *id, dsec_err *err)
{
    size_t n = id ? strlen(id) : 0;
    if (n == 0 || n > 256)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "rollout_id must be 1-256 characters");
    for (size_t i = 0; i < n; i++) {
        char c = id[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return dsec_err_set(
                err, DSEC_E_INVALID, 0,
                "rollout_id \"%.64s\" has '%c': use A-Z a-z 0-9 _ - (it names a subject)", id, c);
    }
    return 0;
}

int dsec_traj_open(dsec_traj **out, dsec_bus *bus, const dsec_traj_conf *conf, dsec_err *err)
{
    *out = NULL;
    dsec_traj *t = dsec_calloc(1, sizeof *t);
    if (t == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    snprintf(t->stream, sizeof t->stream, "%s",
             conf && conf->stream ? conf->stream : DSEC_TRAJ_STREAM);
    if (dsec_js_new(&t->js, bus, 5000, err) < 0) {
        dsec_free(t);
        return dsec_err_wrap(err, "trajectory log");
    }
    if (conf == NULL) {
        /* a reader (`dsec traj show`, a trainer fast-forwarding) binds to the
         * log the nodes keep and leaves its limits alone */
        dsec_stream_conf cur;
        if (dsec_js_stream_get(t->js, t->stream, &cur, err) < 0) {
            if (err != NULL && err->code == DSEC_E_NOT_FOUND)
                dsec_err_set(err, DSEC_E_NOT_FOUND, 0,
                             "no trajectory log: stream %s does not exist on this server (a node "
                             "with JetStream creates it when it starts)",
                             t->stream);
            dsec_js_free(t->js);
            dsec_free(t);
            return dsec_err_wrap(err, "trajectory log");
        }
        *out = t;
        return 0;
    }
    const char *subjects[] = {DSEC_SUBJ_TRAJ_ALL};
    dsec_stream_conf sc = {.name = t->stream,
                           .subjects = subjects,
                           .nsubjects = 1,
                           .replicas = conf ? conf->replicas : 0,
                           .max_age_ms =
                               (conf && conf->max_age_s ? conf->max_age_s : 7 * 86400) * 1000,
                           .max_bytes = conf ? conf->max_bytes : 0};
    if (dsec_js_stream_ensure(t->js, &sc, err) < 0) {
        dsec_js_free(t->js);
        dsec_free(t);
        return dsec_err_wrap(err, "trajectory log (is JetStream enabled on the server?)");
    }
    *out = t;
    return 0;
}

void dsec_traj_close(dsec_traj *t)
{
    if (t == NULL)
        return;
    dsec_js_free(t->js);
    dsec_free(t);
}

int dsec_traj_find(dsec_traj *t, const char *rollout, uint64_t step, dsec_traj_record **out,
                   dsec_err *err)
{
    *out = NULL;
    char subj[320];
    snprintf(subj, sizeof subj, DSEC_SUBJ_TRAJ, rollout, step);
    void *data = NULL;
    size_t len = 0;
    if (dsec_js_last(t->js, t->stream, subj, &data, &len, err) < 0)
        return err->code == DSEC_E_NOT_FOUND ? 0 : dsec_err_wrap(err, "trajectory log");
    int rc = dsec_traj_record_decode(data, len, out, err);
    dsec_free(data);
    if (rc < 0)
        return dsec_err_wrap(err, "rollout %s step %" PRIu64 " in the trajectory log", rollout,
                             step);
    return 1;
}

int dsec_traj_append(dsec_traj *t, const dsec_traj_record *r, dsec_err *err)
{
    dsec_buf b;
    dsec_buf_init(&b);
    dsec_record_writer *w = dsec_record_writer_new_buf(&b, 0);
    if (w == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    int rc = dsec_traj_record_write(w, r, err);
    dsec_record_writer_free(w);
    if (rc == 0) {
        char subj[320];
        snprintf(subj, sizeof subj, DSEC_SUBJ_TRAJ, r->rollout_id, r->step);
        rc = dsec_js_publish(t->js, subj, b.data, b.len, NULL, err);
        if (rc < 0)
            dsec_err_wrap(err, "logging rollout %s step %" PRIu64, r->rollout_id, r->step);
    }
    dsec_buf_release(&b);
    return rc;
}

struct read_ctx {
    dsec_traj_each_fn fn;
    void *ud;
    dsec_err *err;
    int rc;
};

static int each(const char *subject, const void *data, size_t len, uint64_t seq, void *ud)
{
    struct read_ctx *c = ud;
    dsec_traj_record *r = NULL;
    if (dsec_traj_record_decode(data, len, &r, c->err) < 0) {
        dsec_err_wrap(c->err, "record %" PRIu64 " on %s", seq, subject);
        c->rc = -1;
        return 1;
    }
    int stop = c->fn(r, c->ud);
    dsec_traj_record_free(r);
    return stop;
}

int dsec_traj_read(dsec_traj *t, const char *rollout, dsec_traj_each_fn fn, void *ud, size_t *count,
                   dsec_err *err)
{
    if (dsec_traj_check_id(rollout, err) < 0)
        return -1;
    char subj[320];
    snprintf(subj, sizeof subj, DSEC_SUBJ_TRAJ_ROLLOUT, rollout);
    struct read_ctx c = {.fn = fn, .ud = ud, .err = err};
    if (dsec_js_read(t->js, t->stream, subj, each, &c, count, err) < 0)
        return dsec_err_wrap(err, "trajectory log of %s", rollout);
    return c.rc;
}

static void hash_str(dsec_sha256 *c, const char *s)
{
    /* length-prefixed, so ("ab","c") and ("a","bc") differ */
    uint64_t n = s ? strlen(s) + 1 : 0;
    dsec_sha256_update(c, &n, sizeof n);
    if (s)
        dsec_sha256_update(c, s, n - 1);
}

static void hash_bytes(dsec_sha256 *c, const void *p, size_t len)
{
    uint64_t n = len;
    dsec_sha256_update(c, &n, sizeof n);
    if (len)
        dsec_sha256_update(c, p, len);
}

void dsec_traj_hash_exec(const dsec_msg_exec *x, uint8_t out[DSEC_SHA256_LEN])
{
    dsec_sha256 c;
    dsec_sha256_init(&c);
    hash_str(&c, "exec");
    for (uint32_t i = 0; i < x->argv.n; i++)
        hash_str(&c, x->argv.v[i]);
    hash_str(&c, "env");
    for (uint32_t i = 0; i < x->env.n; i++) {
        hash_str(&c, x->env.k[i]);
        hash_str(&c, x->env.v[i]);
    }
    hash_str(&c, x->cwd);
    hash_str(&c, x->user);
    hash_bytes(&c, x->stdin_data.ptr, x->stdin_data.len);
    dsec_sha256_final(&c, out);
}

void dsec_traj_hash_write(const dsec_msg_file_write *w, uint8_t out[DSEC_SHA256_LEN])
{
    dsec_sha256 c;
    dsec_sha256_init(&c);
    hash_str(&c, "file_write");
    hash_str(&c, w->path);
    hash_bytes(&c, w->data.ptr, w->data.len);
    uint64_t mode = w->mode, app = w->append;
    dsec_sha256_update(&c, &mode, sizeof mode);
    dsec_sha256_update(&c, &app, sizeof app);
    dsec_sha256_final(&c, out);
}
