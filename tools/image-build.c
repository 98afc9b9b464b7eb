/* image-build.c - `dsec image build`: a Dockerfile's steps run in dsec containers of a cell, the
 * result published as an environment. */
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <glob.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dsec/alloc.h"
#include "dsec/client.h"
#include "dsec/image.h"
#include "dsec/sha256.h"
#include "dsec/layers.h"
#include "tools/cli.h"
#include "tools/dockerfile.h"
#include "tools/image-build.h"

#define MAX_ARGS 64

/*
 * No daemon and no second runtime: each stage of the Dockerfile is a dsec
 * container created from the stage's base environment (FROM an environment
 * or imported image by name, FROM scratch, or FROM an earlier stage, which is
 * forked). RUN is an exec in it, with the stage's ENV, the ARGs in scope,
 * WORKDIR and USER; COPY and ADD upload from the context (and COPY --from
 * downloads from an earlier stage). At the end the target stage is
 * snapshotted (its writable layer packed as one layer over the base's
 * layers) and its environment document rewritten with the Dockerfile's ENV,
 * WORKDIR and USER. Every sandbox the build made is destroyed, on failure too.
 * docs/images.md says why this builder rather than buildah.
 */

static volatile sig_atomic_t interrupted;

static void on_signal(int sig)
{
    (void)sig;
    interrupted = 1;
}

int dsec__ib_fail(const build *b, const dsec_df_insn *in, dsec_err *err, const char *fmt, ...)
{
    char what[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    if (err->code == DSEC_OK)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "%s:%u: %s %s", b->dockerfile, in->line,
                            in->cmd, what);
    return dsec_err_wrap(err, "%s:%u: %s %s", b->dockerfile, in->line, in->cmd, what);
}

static void stage_free(stage *s)
{
    dsec_free(s->alias);
    dsec_df_vars_free(&s->env);
    dsec_df_vars_free(&s->args);
    dsec_free(s->workdir);
    dsec_free(s->user);
    dsec_df_strv_free(s->shell, s->nshell);
    dsec_df_strv_free(s->entry, s->nentry);
    dsec_df_strv_free(s->cmd, s->ncmd);
    dsec_df_vars_free(&s->labels);
    dsec_free(s->base);
}

static int set_str(char **dst, const char *s, dsec_err *err)
{
    char *d = dsec_strdup(s);
    if (d == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "image build: out of memory");
    dsec_free(*dst);
    *dst = d;
    return 0;
}

/* The variables an instruction's words expand from: the stage's ARGs, then its ENV (ENV wins,
 * as in Docker). */
static int scope_vars(const stage *s, dsec_df_vars *out, dsec_err *err)
{
    *out = (dsec_df_vars){0};
    const dsec_df_vars *src[] = {&s->args, &s->env};
    for (size_t k = 0; k < 2; k++)
        if (dsec_df_vars_add(out, src[k]->v, src[k]->n, err) < 0) {
            dsec_df_vars_free(out);
            return -1;
        }
    return 0;
}

int dsec__ib_words(const build *b, const stage *s, const dsec_df_insn *in, char ***w, size_t *n,
                   dsec_err *err)
{
    dsec_df_vars v;
    if (scope_vars(s, &v, err) < 0)
        return -1;
    int rc;
    if (in->json) {
        *w = dsec_calloc(in->nargs + 1, sizeof **w);
        *n = 0;
        rc = *w != NULL ? 0 : dsec_err_set(err, DSEC_E_NOMEM, 0, "image build: out of memory");
        for (size_t i = 0; rc == 0 && i < in->nargs; i++) { /* expanded, not split */
            char **one;
            size_t n1;
            char *q = NULL;
            if (asprintf(&q, "\"%s\"", in->args[i]) < 0)
                q = NULL;
            rc = q == NULL ? dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory")
                           : dsec_df_words(q, b->df.escape, &v, &one, &n1, err);
            free(q);
            if (rc == 0) {
                (*w)[(*n)++] = n1 > 0 ? one[0] : dsec_strdup("");
                for (size_t k = 1; k < n1; k++)
                    dsec_free(one[k]);
                dsec_free(one);
            }
        }
    } else {
        rc = dsec_df_words(in->rest, b->df.escape, &v, w, n, err);
    }
    dsec_df_vars_free(&v);
    return rc;
}

/* in->rest expanded as one string (WORKDIR, USER keep their spaces). */
static char *insn_string(const build *b, const stage *s, const dsec_df_insn *in, dsec_err *err)
{
    char **w;
    size_t n;
    if (dsec__ib_words(b, s, in, &w, &n, err) < 0)
        return NULL;
    size_t len = 1;
    for (size_t i = 0; i < n; i++)
        len += strlen(w[i]) + 1;
    char *out = dsec_malloc(len);
    if (out != NULL) {
        out[0] = '\0';
        for (size_t i = 0; i < n; i++) {
            if (i > 0)
                strcat(out, " ");
            strcat(out, w[i]);
        }
    } else {
        dsec_err_set(err, DSEC_E_NOMEM, 0, "image build: out of memory");
    }
    dsec_df_strv_free(w, n);
    return out;
}

static void say(const build *b, const dsec_df_insn *in)
{
    if (b->quiet)
        return;
    fprintf(stderr, "STEP %u/%u: %s", b->step, b->nsteps, in->cmd);
    for (size_t i = 0; i < in->nflags; i++)
        fprintf(stderr, " %s", in->flags[i]);
    fprintf(stderr, " %s\n", in->rest);
}

const char *dsec__ib_flag(const dsec_df_insn *in, const char *name)
{
    size_t nl = strlen(name);
    for (size_t i = 0; i < in->nflags; i++)
        if (strncmp(in->flags[i] + 2, name, nl) == 0 && in->flags[i][2 + nl] == '=')
            return in->flags[i] + 3 + nl;
    return NULL;
}

char *dsec__ib_path(const stage *s, const char *p)
{
    char *out = NULL;
    if (p[0] == '/')
        return dsec_strdup(p);
    const char *wd = s->workdir != NULL ? s->workdir : "/";
    if (asprintf(&out, "%s%s%s", wd, wd[strlen(wd) - 1] == '/' ? "" : "/", p) < 0)
        return NULL;
    char *d = dsec_strdup(out);
    free(out);
    return d;
}

stage *dsec__ib_stage(build *b, const char *name, size_t before)
{
    char *end;
    unsigned long k = strtoul(name, &end, 10);
    if (name[0] != '\0' && *end == '\0')
        return k < before ? &b->st[k] : NULL;
    for (size_t i = 0; i < before; i++)
        if (b->st[i].alias != NULL && strcasecmp(b->st[i].alias, name) == 0)
            return &b->st[i];
    return NULL;
}

/* Stream a step's output as it comes. */
static void step_output(void *ud, int stream, const uint8_t *data, size_t len)
{
    (void)ud;
    FILE *f = stream == 2 ? stderr : stdout;
    fwrite(data, 1, len, f);
    fflush(f);
}

/* An exec in the stage's sandbox; a failure or a nonzero exit fails with what it printed. */
static int run_argv(build *b, stage *s, const char *const *argv, const char *const *env,
                    const char *user, const char *cwd, bool stream, dsec_err *err)
{
    dsec_exec_opts eo = {
        .argv = argv, .env = env, .cwd = cwd, .user = user, .timeout_ms = b->step_timeout_ms};
    dsec_exec_reply r = {0};
    int rc = stream ? dsec_exec_stream(b->c, s->id, &eo, step_output, NULL, &r, err)
                    : dsec_exec(b->c, s->id, &eo, &r, err);
    if (rc < 0)
        return -1;
    if (r.timed_out)
        rc = dsec_err_set(err, DSEC_E_TIMEOUT, 0, "did not finish within %" PRIu64 " s",
                          b->step_timeout_ms / 1000);
    else if (r.exit_code != 0 || r.signal != 0)
        rc = dsec_err_set(err, DSEC_E_STATE, 0, "%s %d%s%.*s",
                          r.signal ? "was killed by signal" : "exited with",
                          r.signal ? r.signal : r.exit_code, stream || r.err_len == 0 ? "" : ": ",
                          stream ? 0 : (int)(r.err_len > 300 ? 300 : r.err_len),
                          r.err_out != NULL ? (const char *)r.err_out : "");
    dsec_exec_reply_release(&r);
    return rc;
}

int dsec__ib_run_root(build *b, stage *s, const char *const *argv, dsec_err *err)
{
    return run_argv(b, s, argv, NULL, "0", "/", false, err);
}

/* ---- FROM ---------------------------------------------------------------------------------- */

/* The stage starts with its base environment's settings, as Docker starts from the image's. */
static int from_env(build *b, stage *s, const char *base, dsec_err *err)
{
    dsec_env *e;
    if (dsec_layer_registry_env_get(b->reg, base, &e, err) < 0)
        return dsec_err_wrap(err, "FROM %s: no such environment or image in the registry", base);
    int rc = dsec_df_vars_add(&s->env, e->vars, e->nvars, err);
    if (rc == 0 && e->workdir != NULL)
        rc = set_str(&s->workdir, e->workdir, err);
    if (rc == 0 && e->user != NULL)
        rc = set_str(&s->user, e->user, err);
    if (rc == 0)
        rc = dsec_df_vars_add(&s->labels, e->labels, e->nlabels, err);
    if (rc == 0 && e->ncmd > 0) { /* the base's ENTRYPOINT (its first nentry arguments), CMD */
        size_t ne = e->nentry <= e->ncmd ? e->nentry : 0;
        char **entry = dsec_calloc(ne + 1, sizeof *entry);
        char **cmd = dsec_calloc(e->ncmd - ne + 1, sizeof *cmd);
        if (entry == NULL || cmd == NULL) {
            dsec_free(entry);
            dsec_free(cmd);
            rc = dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
        } else { /* the strings move over */
            memcpy(entry, e->cmd, ne * sizeof *entry);
            memcpy(cmd, e->cmd + ne, (e->ncmd - ne) * sizeof *cmd);
            s->entry = entry;
            s->nentry = ne;
            s->cmd = cmd;
            s->ncmd = e->ncmd - ne;
            dsec_free(e->cmd);
            e->cmd = NULL;
            e->ncmd = 0;
        }
    }
    if (rc == 0)
        rc = set_str(&s->base, base, err);
    dsec_env_free(e);
    return rc;
}

static int create_stage(build *b, stage *s, const char *base, dsec_err *err)
{
    char label[64];
    snprintf(label, sizeof label, "dsec.build=%d", (int)getpid());
    const char *labels[] = {label, NULL};
    dsec_create_spec spec = {.type = "container",
                             .env = base,
                             .labels = labels,
                             .ttl_s = b->step_timeout_ms / 1000 * 4 + 3600};
    dsec_sandbox_info info;
    if (dsec_create(b->c, &spec, &info, err) < 0)
        return dsec_err_wrap(err, "creating a container from %s", base != NULL ? base : "scratch");
    snprintf(s->id, sizeof s->id, "%s", info.id);
    return 0;
}

/* FROM an earlier stage: its sandbox forked, with its settings. */
static int from_stage(build *b, stage *s, const stage *from, dsec_err *err)
{
    int rc;
    char **ids;
    size_t nids;
    rc = dsec_fork(b->c, from->id, 1, &ids, &nids, err);
    if (rc == 0) {
        snprintf(s->id, sizeof s->id, "%s", ids[0]);
        dsec_strv_free(ids, nids);
        rc = dsec_df_vars_add(&s->env, from->env.v, from->env.n, err);
        if (rc == 0 && from->workdir != NULL)
            rc = set_str(&s->workdir, from->workdir, err);
        if (rc == 0 && from->user != NULL)
            rc = set_str(&s->user, from->user, err);
        if (rc == 0 && from->base != NULL)
            rc = set_str(&s->base, from->base, err);
        if (rc == 0)
            rc = dsec_df_vars_add(&s->labels, from->labels.v, from->labels.n, err);
        for (size_t i = 0; rc == 0 && i < 2; i++) { /* its ENTRYPOINT and CMD */
            char **src = i == 0 ? from->entry : from->cmd;
            size_t n2 = i == 0 ? from->nentry : from->ncmd;
            char **v2 = dsec_calloc(n2 + 1, sizeof *v2);
            for (size_t k = 0; v2 != NULL && k < n2; k++)
                if ((v2[k] = dsec_strdup(src[k])) == NULL) {
                    dsec_df_strv_free(v2, k);
                    v2 = NULL;
                }
            if (v2 == NULL) {
                rc = dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
            } else if (i == 0) {
                s->entry = v2;
                s->nentry = n2;
            } else {
                s->cmd = v2;
                s->ncmd = n2;
            }
        }
    }
    return rc;
}

/* FROM [--platform=P] base [AS name]: a new stage, from an environment, scratch or a stage. */
static int do_from(build *b, const dsec_df_insn *in, dsec_err *err)
{
    char **w;
    size_t n;
    stage tmp = {0};
    if (dsec_df_vars_add(&tmp.args, b->global.v, b->global.n, err) < 0) /* the ARGs before */
        return -1;                                                      /* the first FROM */
    int rc = dsec__ib_words(b, &tmp, in, &w, &n, err);
    dsec_df_vars_free(&tmp.args);
    if (rc < 0)
        return dsec__ib_fail(b, in, err, "%s", "");
    if (!(n == 1 || (n == 3 && strcasecmp(w[1], "AS") == 0))) {
        dsec_df_strv_free(w, n);
        return dsec__ib_fail(b, in, err, "takes one image and an optional \"AS name\"");
    }
    const char *plat = dsec__ib_flag(in, "platform");
    if (plat != NULL && strcmp(plat, "linux/amd64") != 0) {
        dsec_df_strv_free(w, n);
        return dsec__ib_fail(b, in, err, "--platform=%s: this builder makes linux/amd64 only",
                             plat);
    }
    stage *v = dsec_realloc(b->st, (b->nst + 1) * sizeof *v);
    if (v == NULL) {
        dsec_df_strv_free(w, n);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "image build: out of memory");
    }
    b->st = v;
    stage *s = &v[b->nst++];
    *s = (stage){0};
    if (n == 3 && set_str(&s->alias, w[2], err) < 0) {
        dsec_df_strv_free(w, n);
        return -1;
    }
    const char *base = w[0];
    stage *from = dsec__ib_stage(b, base, b->nst - 1);
    if (from != NULL) {
        rc = from_stage(b, s, from, err);
    } else if (strcmp(base, "scratch") == 0) {
        rc = create_stage(b, s, NULL, err);
    } else {
        char ref[512];
        dsec_image_info *img = NULL;
        dsec_err e2;
        if (dsec_image_get(b->reg, base, &img, &e2) == 0) /* an imported image, by any spelling */
            snprintf(ref, sizeof ref, "%s", img->env);
        else
            snprintf(ref, sizeof ref, "%s%s", base, strchr(base, ':') != NULL ? "" : ":latest");
        dsec_image_info_free(img);
        rc = from_env(b, s, ref, err);
        if (rc == 0)
            rc = create_stage(b, s, ref, err);
    }
    dsec_df_strv_free(w, n);
    return rc < 0 ? dsec__ib_fail(b, in, err, "%s", in->rest) : 0;
}

/* ---- the settings ---------------------------------------------------------------------------- */

/* ARG NAME[=default]...: the value is --build-arg's, else the default, else a global's. */
static int do_arg(build *b, stage *s, const dsec_df_insn *in, dsec_err *err)
{
    char **w;
    size_t n;
    stage glob = {0};
    stage *scope = s != NULL ? s : &glob;
    if (s == NULL)
        glob.args = b->global; /* borrowed: earlier globals expand in later defaults */
    int rc = dsec__ib_words(b, scope, in, &w, &n, err);
    if (s == NULL)
        glob.args = (dsec_df_vars){0};
    for (size_t i = 0; rc == 0 && i < n; i++) {
        char *eq = strchr(w[i], '=');
        if (eq != NULL)
            *eq = '\0';
        const char *val = dsec_df_vars_get(&b->build_args, w[i]);
        if (val == NULL)
            val = eq != NULL ? eq + 1 : (s != NULL ? dsec_df_vars_get(&b->global, w[i]) : NULL);
        if (val != NULL)
            rc = dsec_df_vars_set(s != NULL ? &s->args : &b->global, w[i], val, err);
    }
    dsec_df_strv_free(w, n);
    return rc < 0 ? dsec__ib_fail(b, in, err, "%s", "") : 0;
}

/* ENV K=V ... (or the old ENV K the rest) and LABEL K=V ...: into vars. */
static int do_keyvals(build *b, stage *s, const dsec_df_insn *in, dsec_df_vars *into, dsec_err *err)
{
    char **w;
    size_t n;
    if (dsec__ib_words(b, s, in, &w, &n, err) < 0)
        return dsec__ib_fail(b, in, err, "%s", "");
    int rc = 0;
    bool pairs = n == 0 || strchr(w[0], '=') != NULL;
    if (!pairs && strcmp(in->cmd, "ENV") == 0) {
        /* ENV KEY VALUE WITH SPACES: the rest of the line after the key, expanded */
        size_t len = 1;
        for (size_t i = 1; i < n; i++)
            len += strlen(w[i]) + 1;
        char *val = dsec_malloc(len);
        rc = val != NULL ? 0 : dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
        if (rc == 0) {
            val[0] = '\0';
            for (size_t i = 1; i < n; i++)
                strcat(strcat(val, i > 1 ? " " : ""), w[i]);
            rc = n > 1 ? dsec_df_vars_set(into, w[0], val, err)
                       : dsec__ib_fail(b, in, err, "%s: needs a value", w[0]);
            dsec_free(val);
        }
    }
    for (size_t i = 0; rc == 0 && (pairs || strcmp(in->cmd, "ENV") != 0) && i < n; i++) {
        char *eq = strchr(w[i], '=');
        if (eq == NULL || eq == w[i]) {
            rc = dsec__ib_fail(b, in, err, "\"%s\": expected KEY=VALUE", w[i]);
            break;
        }
        *eq = '\0';
        rc = dsec_df_vars_set(into, w[i], eq + 1, err);
    }
    dsec_df_strv_free(w, n);
    return rc;
}

/* CMD/ENTRYPOINT/SHELL/RUN's argv: the JSON form as written, else the stage's shell and the line.
 */
static int command_argv(const stage *s, const dsec_df_insn *in, const char **argv, size_t max)
{
    size_t n = 0;
    if (in->json) {
        for (size_t i = 0; i < in->nargs && n + 1 < max; i++)
            argv[n++] = in->args[i];
    } else {
        static const char *const sh[] = {"/bin/sh", "-c"};
        size_t ns = s->nshell > 0 ? s->nshell : 2;
        for (size_t i = 0; i < ns && n + 2 < max; i++)
            argv[n++] = s->nshell > 0 ? s->shell[i] : sh[i];
        argv[n++] = in->rest;
    }
    argv[n] = NULL;
    return (int)n;
}

static int do_run(build *b, stage *s, const dsec_df_insn *in, dsec_err *err)
{
    if (dsec__ib_flag(in, "mount") != NULL)
        return dsec__ib_fail(b, in, err,
                             "--mount is not supported (caches and secrets): COPY what "
                             "the step needs");
    const char *argv[MAX_ARGS + 1];
    if (command_argv(s, in, argv, MAX_ARGS + 1) == 0)
        return dsec__ib_fail(b, in, err, "has an empty command");
    dsec_df_vars v;
    if (scope_vars(s, &v, err) < 0)
        return -1;
    const char **env = dsec_calloc(v.n + 1, sizeof *env);
    for (size_t i = 0; env != NULL && i < v.n; i++)
        env[i] = v.v[i];
    int rc = env != NULL ? run_argv(b, s, argv, env, s->user, s->workdir, true, err)
                         : dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    dsec_free(env);
    dsec_df_vars_free(&v);
    return rc < 0 ? dsec__ib_fail(b, in, err, "%s", in->rest) : 0;
}

/* WORKDIR: relative to the last one; made in the sandbox, as Docker makes it. */
static int do_workdir(build *b, stage *s, const dsec_df_insn *in, dsec_err *err)
{
    char *w = insn_string(b, s, in, err);
    char *p = w != NULL ? dsec__ib_path(s, w) : NULL;
    dsec_free(w);
    if (p == NULL)
        return dsec__ib_fail(b, in, err, "%s", "");
    int rc = dsec_file_mkdir(b->c, s->id, p, 0755, true, err);
    if (rc == 0)
        rc = set_str(&s->workdir, p, err);
    dsec_free(p);
    return rc < 0 ? dsec__ib_fail(b, in, err, "%s", in->rest) : 0;
}

static int do_shell(build *b, stage *s, const dsec_df_insn *in, dsec_err *err)
{
    if (!in->json || in->nargs == 0)
        return dsec__ib_fail(b, in, err, "must be a JSON array: SHELL [\"/bin/bash\", \"-c\"]");
    dsec_df_strv_free(s->shell, s->nshell);
    s->shell = dsec_calloc(in->nargs, sizeof *s->shell);
    s->nshell = 0;
    for (size_t i = 0; s->shell != NULL && i < in->nargs; i++)
        if ((s->shell[s->nshell++] = dsec_strdup(in->args[i])) == NULL)
            return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    return s->shell != NULL ? 0 : dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
}

/* CMD / ENTRYPOINT: kept as argv for the environment's default command. */
static int do_default_cmd(build *b, stage *s, const dsec_df_insn *in, bool entry, dsec_err *err)
{
    (void)b;
    const char *argv[MAX_ARGS + 1];
    size_t n = (size_t)command_argv(s, in, argv, MAX_ARGS + 1);
    char **v = dsec_calloc(n + 1, sizeof *v);
    for (size_t i = 0; v != NULL && i < n; i++)
        if ((v[i] = dsec_strdup(argv[i])) == NULL) {
            dsec_df_strv_free(v, i);
            v = NULL;
        }
    if (v == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    if (entry) {
        dsec_df_strv_free(s->entry, s->nentry);
        s->entry = v;
        s->nentry = n;
        s->entry_set = true;
        if (!s->cmd_set) { /* as Docker: ENTRYPOINT resets a CMD that came from the base */
            dsec_df_strv_free(s->cmd, s->ncmd);
            s->cmd = NULL;
            s->ncmd = 0;
        }
    } else {
        dsec_df_strv_free(s->cmd, s->ncmd);
        s->cmd = v;
        s->ncmd = n;
        s->cmd_set = true;
    }
    return 0;
}

/* One instruction of a stage. */
static int do_insn(build *b, stage *s, const dsec_df_insn *in, dsec_err *err)
{
    const char *c = in->cmd;
    if (strcmp(c, "RUN") == 0)
        return do_run(b, s, in, err);
    if (strcmp(c, "COPY") == 0 || strcmp(c, "ADD") == 0)
        return dsec__ib_copy(b, s, in, c[0] == 'A', err);
    if (strcmp(c, "ENV") == 0)
        return do_keyvals(b, s, in, &s->env, err);
    if (strcmp(c, "LABEL") == 0)
        return do_keyvals(b, s, in, &s->labels, err);
    if (strcmp(c, "MAINTAINER") == 0)
        return dsec_df_vars_set(&s->labels, "maintainer", in->rest, err);
    if (strcmp(c, "ARG") == 0)
        return do_arg(b, s, in, err);
    if (strcmp(c, "WORKDIR") == 0)
        return do_workdir(b, s, in, err);
    if (strcmp(c, "USER") == 0) {
        char *u = insn_string(b, s, in, err);
        int rc = u != NULL ? set_str(&s->user, u, err) : -1;
        dsec_free(u);
        return rc;
    }
    if (strcmp(c, "SHELL") == 0)
        return do_shell(b, s, in, err);
    if (strcmp(c, "CMD") == 0 || strcmp(c, "ENTRYPOINT") == 0)
        return do_default_cmd(b, s, in, c[0] == 'E', err);
    if (strcmp(c, "ONBUILD") == 0)
        return dsec__ib_fail(b, in, err, "is not supported");
    /* EXPOSE, VOLUME, STOPSIGNAL, HEALTHCHECK: nothing in a sandbox reads them */
    if (!b->quiet)
        fprintf(stderr, "note: %s:%u: %s is recorded nowhere: a dsec sandbox has no use for it\n",
                b->dockerfile, in->line, c);
    return 0;
}

/* ---- the result ------------------------------------------------------------------------------ */

/* The stage's ENTRYPOINT then CMD, as one argv (the environment's default command); the
 * strings stay the stage's. */
static char **default_cmd(const stage *s, size_t *n)
{
    char **v = dsec_calloc(s->nentry + s->ncmd + 1, sizeof *v);
    *n = 0;
    for (size_t i = 0; v != NULL && i < s->nentry; i++)
        v[(*n)++] = s->entry[i];
    for (size_t i = 0; v != NULL && i < s->ncmd; i++)
        v[(*n)++] = s->cmd[i];
    return v;
}

/* The image record of the result: its layers (with the base image's diff_ids where the base was
 * an imported image, else each layer's own digest: a DIR layer is the tar itself), pinned to
 * the digest of the environment document. */
static int record_image(build *b, stage *s, const dsec_env *e, const char *pin, dsec_err *err)
{
    dsec_image_info *base = NULL;
    dsec_err e2;
    if (s->base != NULL && dsec_image_get(b->reg, s->base, &base, &e2) < 0)
        base = NULL;
    dsec_layer_info *have = NULL;
    size_t nhave = 0;
    if (dsec_layer_registry_list(b->reg, &have, &nhave, err) < 0)
        return -1;
    dsec_image_info info = {
        .ref = (char *)b->name, .env = (char *)b->name, .created_unix = (int64_t)time(NULL)};
    snprintf(info.manifest, sizeof info.manifest, "%s", pin);
    snprintf(info.config, sizeof info.config, "%s", pin);
    info.layers = dsec_calloc(e->nlayers + 1, sizeof *info.layers);
    info.cmd = e->cmd;
    info.ncmd = e->ncmd;
    info.labels = e->labels;
    info.nlabels = e->nlabels;
    for (size_t i = 0; info.layers != NULL && i < e->nlayers; i++) {
        dsec_image_layer *l = &info.layers[info.nlayers++];
        snprintf(l->layer, sizeof l->layer, "%s", e->layers[i]);
        snprintf(l->diff_id, sizeof l->diff_id, "%s", e->layers[i]);
        for (size_t k = 0; base != NULL && k < base->nlayers; k++)
            if (strcmp(base->layers[k].layer, e->layers[i]) == 0)
                snprintf(l->diff_id, sizeof l->diff_id, "%s", base->layers[k].diff_id);
        for (size_t k = 0; k < nhave; k++)
            if (strcmp(have[k].digest, e->layers[i]) == 0)
                l->size = have[k].size;
    }
    int rc = info.layers != NULL ? dsec_image_record(b->reg, &info, err)
                                 : dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    dsec_free(info.layers);
    dsec_layer_infos_free(have, nhave);
    dsec_image_info_free(base);
    return rc;
}

/* The target stage's sandbox becomes environment b->name: its writable layer packed over the
 * base's layers (dsec_snapshot), the document rewritten with the Dockerfile's settings and
 * pinned to its own digest, then the image record. */
static int publish(build *b, stage *s, dsec_err *err)
{
    if (dsec_snapshot(b->c, s->id, b->name, err) < 0)
        return dsec_err_wrap(err, "snapshotting the result as %s", b->name);
    dsec_env *e;
    if (dsec_layer_registry_env_get(b->reg, b->name, &e, err) < 0)
        return dsec_err_wrap(err, "reading back environment %s (is --registry the cell's?)",
                             b->name);
    dsec_env mine = *e; /* the snapshot's layers; the rest the stage's (borrowed) */
    mine.vars = s->env.v;
    mine.nvars = s->env.n;
    mine.workdir = s->workdir != NULL ? s->workdir : e->workdir;
    mine.user = s->user != NULL ? s->user : e->user;
    mine.cmd = default_cmd(s, &mine.ncmd);
    mine.nentry = s->nentry;
    mine.labels = s->labels.v;
    mine.nlabels = s->labels.n;
    mine.image = NULL;
    mine.image_digest = NULL;
    char *doc = NULL, pin[DSEC_DIGEST_STRLEN + 1] = "";
    size_t len;
    int rc = mine.cmd != NULL ? dsec_env_encode(&mine, &doc, &len, err)
                              : dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    if (rc == 0) { /* what a build made is named by the digest of what it describes */
        dsec_sha256 h;
        uint8_t raw[DSEC_SHA256_LEN];
        dsec_sha256_init(&h);
        dsec_sha256_update(&h, doc, len);
        dsec_sha256_final(&h, raw);
        dsec_digest_from_raw(raw, pin);
        mine.image = (char *)b->name;
        mine.image_digest = pin;
        rc = dsec_layer_registry_env_put(b->reg, &mine, err);
        if (rc < 0)
            dsec_err_wrap(err, "storing environment %s", b->name);
    }
    if (rc == 0)
        rc = record_image(b, s, &mine, pin, err);
    dsec_free(doc);
    dsec_free(mine.cmd);
    dsec_env_free(e);
    if (rc == 0 && !b->quiet)
        fprintf(stderr, "image %s: %zu layers, %s\n", b->name, mine.nlayers, pin);
    return rc;
}

static void destroy_all(build *b)
{
    for (size_t i = 0; i < b->nst; i++) {
        if (b->st[i].id[0] == '\0')
            continue;
        dsec_err err;
        if (dsec_destroy(b->c, b->st[i].id, &err) < 0 && err.code != DSEC_E_NOT_FOUND)
            fprintf(stderr, "dsec image build: destroying %s: %s\n", b->st[i].id, err.msg);
        b->st[i].id[0] = '\0';
    }
}

/* Every instruction, stage by stage, up to the target's end. */
static int run_all(build *b, dsec_err *err)
{
    size_t last = b->df.n;
    if (b->target != NULL) { /* stop after the target stage's instructions */
        bool found = false;
        for (size_t i = 0; i < b->df.n; i++) {
            if (strcmp(b->df.v[i].cmd, "FROM") != 0)
                continue;
            if (found) {
                last = i;
                break;
            }
            char **w;
            size_t n;
            stage none = {0};
            if (dsec__ib_words(b, &none, &b->df.v[i], &w, &n, err) < 0)
                return -1;
            found = n == 3 && strcasecmp(w[2], b->target) == 0;
            dsec_df_strv_free(w, n);
        }
        if (!found)
            return dsec_err_set(err, DSEC_E_INVALID, 0, "--target %s: no stage of %s is named so",
                                b->target, b->dockerfile);
    }
    b->nsteps = (unsigned)last;
    for (size_t i = 0; i < last; i++) {
        const dsec_df_insn *in = &b->df.v[i];
        b->step = (unsigned)i + 1;
        if (interrupted)
            return dsec_err_set(err, DSEC_E_CLOSED, 0, "interrupted at %s:%u", b->dockerfile,
                                in->line);
        say(b, in);
        int rc;
        if (strcmp(in->cmd, "FROM") == 0)
            rc = do_from(b, in, err);
        else if (b->nst == 0) /* only ARG comes before the first FROM */
            rc = do_arg(b, NULL, in, err);
        else
            rc = do_insn(b, &b->st[b->nst - 1], in, err);
        if (rc < 0)
            return -1;
    }
    return publish(b, &b->st[b->nst - 1], err);
}

/* ---- the command ------------------------------------------------------------------------------
 */

static int build_usage(void)
{
    fprintf(stderr,
            "usage: dsec image build [-f Dockerfile] --name NAME:TAG [--build-arg K=V]...\n"
            "                        [--target STAGE] [--timeout SECONDS] [--quiet]\n"
            "                        [--registry DIR|nats://...] [--state-dir DIR] CONTEXT\n"
            "Runs the Dockerfile's steps in containers of the cell at $DSEC_URL (start one with\n"
            "`dsec up --config configs/containers.yaml`) and publishes the result as environment\n"
            "NAME:TAG in the cell's layer registry (--registry: the same one the cell uses).\n"
            "FROM names an environment or an imported image, `scratch`, or an earlier stage.\n"
            "--timeout bounds each RUN (default 3600 s). The steps reach no network.\n");
    return 2;
}

/* A whole small file (Dockerfile, .dockerignore); 1 when it is absent and may be. */
static int slurp(const char *path, bool may_miss, char **data, size_t *len, dsec_err *err)
{
    FILE *f = fopen(path, "re");
    if (f == NULL) {
        if (may_miss && errno == ENOENT)
            return 1;
        return dsec_err_set(err, DSEC_E_IO, errno, "reading %s", path);
    }
    size_t cap = 65536, n = 0;
    char *p = dsec_malloc(cap);
    while (p != NULL) {
        size_t got = fread(p + n, 1, cap - n, f);
        n += got;
        if (n < cap)
            break;
        if (cap >= 16u << 20) {
            dsec_free(p);
            fclose(f);
            return dsec_err_set(err, DSEC_E_TOO_LARGE, 0, "%s is larger than 16 MiB", path);
        }
        char *q = dsec_realloc(p, cap *= 2);
        if (q == NULL)
            dsec_free(p);
        p = q;
    }
    bool bad = ferror(f);
    fclose(f);
    if (p == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "reading %s", path);
    if (bad) {
        dsec_free(p);
        return dsec_err_set(err, DSEC_E_IO, EIO, "reading %s", path);
    }
    *data = p;
    *len = n;
    return 0;
}

static int parse_opts(int argc, char **argv, build *b, const char **registry, const char **state,
                      dsec_err *err)
{
    static const struct option lo[] = {{"file", required_argument, 0, 'f'},
                                       {"name", required_argument, 0, 'n'},
                                       {"tag", required_argument, 0, 't'},
                                       {"build-arg", required_argument, 0, 'a'},
                                       {"target", required_argument, 0, 'T'},
                                       {"timeout", required_argument, 0, 'o'},
                                       {"registry", required_argument, 0, 'r'},
                                       {"state-dir", required_argument, 0, 's'},
                                       {"quiet", no_argument, 0, 'q'},
                                       {"help", no_argument, 0, 'h'},
                                       {0, 0, 0, 0}};
    optind = 1;
    int ch;
    while ((ch = getopt_long(argc, argv, "f:n:t:qh", lo, NULL)) != -1) {
        char *eq, *end;
        switch (ch) {
        case 'f':
            b->dockerfile = optarg;
            break;
        case 'n':
        case 't':
            b->name = optarg;
            break;
        case 'T':
            b->target = optarg;
            break;
        case 'r':
            *registry = optarg;
            break;
        case 's':
            *state = optarg;
            break;
        case 'q':
            b->quiet = true;
            break;
        case 'o':
            b->step_timeout_ms = strtoull(optarg, &end, 10) * 1000;
            if (optarg[0] == '-' || *end != '\0' || b->step_timeout_ms == 0)
                return dsec_err_set(err, DSEC_E_INVALID, 0, "--timeout %s: expected seconds > 0",
                                    optarg);
            break;
        case 'a':
            eq = strchr(optarg, '=');
            if (eq == NULL || eq == optarg) { /* --build-arg K takes K from the environment */
                const char *v = eq == NULL ? getenv(optarg) : NULL;
                if (v == NULL)
                    return dsec_err_set(err, DSEC_E_INVALID, 0,
                                        "--build-arg %s: expected KEY=VALUE (or a KEY set in the "
                                        "environment)",
                                        optarg);
                if (dsec_df_vars_set(&b->build_args, optarg, v, err) < 0)
                    return -1;
                break;
            }
            *eq = '\0';
            if (dsec_df_vars_set(&b->build_args, optarg, eq + 1, err) < 0)
                return -1;
            *eq = '=';
            break;
        default:
            return 1;
        }
    }
    if (optind != argc - 1 || b->name == NULL)
        return 1;
    b->context = argv[optind];
    if (!dsec_layer_name_valid(b->name))
        return dsec_err_set(
            err, DSEC_E_INVALID, 0,
            "--name %s: expected NAME:TAG (name of [a-z0-9._-] parts joined by '/')", b->name);
    return 0;
}

/* The Dockerfile, the .dockerignore and the context's real path. */
static int load_inputs(build *b, char *dfpath, size_t dfn, dsec_err *err)
{
    if (realpath(b->context, b->ctx_real) == NULL)
        return dsec_err_set(err, DSEC_E_INVALID, errno, "context %s", b->context);
    struct stat st;
    if (stat(b->ctx_real, &st) < 0 || !S_ISDIR(st.st_mode))
        return dsec_err_set(err, DSEC_E_INVALID, ENOTDIR, "context %s is not a directory",
                            b->context);
    if (b->dockerfile == NULL)
        snprintf(dfpath, dfn, "%s/Dockerfile", b->ctx_real);
    else
        snprintf(dfpath, dfn, "%s", b->dockerfile);
    b->dockerfile = dfpath;
    char *text;
    size_t len;
    if (slurp(dfpath, false, &text, &len, err) != 0)
        return -1;
    int rc = dsec_df_parse(text, len, dfpath, &b->df, err);
    dsec_free(text);
    if (rc < 0)
        return -1;
    char ig[PATH_MAX + 16];
    snprintf(ig, sizeof ig, "%s/.dockerignore", b->ctx_real);
    rc = slurp(ig, true, &text, &len, err);
    if (rc < 0)
        return -1;
    if (rc == 0) {
        rc = dsec_df_ignore_parse(text, len, &b->ignore, err);
        dsec_free(text);
    }
    return rc < 0 ? -1 : 0;
}

int dsec_cli_image_build(int argc, char **argv)
{
    build b = {.step_timeout_ms = 3600 * 1000};
    const char *registry = NULL, *state = NULL;
    dsec_err err;
    dsec_err_clear(&err);
    char dfpath[PATH_MAX + 16];
    int rc = parse_opts(argc, argv, &b, &registry, &state, &err);
    if (rc != 0) {
        dsec_df_vars_free(&b.build_args);
        return rc < 0 ? dsec_cli_fail("image build", &err) : build_usage();
    }
    rc = load_inputs(&b, dfpath, sizeof dfpath, &err);
    const char *where;
    bool said = false; /* dsec_cli_registry_open prints its own failure */
    if (rc == 0 && dsec_cli_registry_open(registry, state, &b.reg, &where) != 0) {
        rc = -1;
        said = true;
    }
    dsec_client_opts co = {.timeout_ms = 120000, .name = "dsec-image-build"};
    if (rc == 0 && dsec_client_connect(&b.c, &co, &err) < 0)
        rc = dsec_err_wrap(&err, "connecting to the cell at %s",
                           getenv("DSEC_URL") ? getenv("DSEC_URL") : "nats://127.0.0.1:4222");
    struct sigaction sa = {.sa_handler = on_signal}, old_int, old_term;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    if (rc == 0)
        rc = run_all(&b, &err);
    if (b.c != NULL)
        destroy_all(&b);
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    int code = rc < 0 ? (said ? 2 : dsec_cli_fail("image build", &err)) : 0;
    if (rc == 0)
        printf("%s\n", b.name);
    for (size_t i = 0; i < b.nst; i++)
        stage_free(&b.st[i]);
    dsec_free(b.st);
    dsec_client_free(b.c);
    dsec_cli_registry_close(b.reg);
    dsec_df_free(&b.df);
    dsec_df_ignore_free(&b.ignore);
    dsec_df_vars_free(&b.build_args);
    dsec_df_vars_free(&b.global);
    return code;
}
