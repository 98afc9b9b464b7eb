/* sbxstore-rec.c - the sandbox-record store's text: records, options, environments and network
 * policy lines (sbxstore.h). */
#define _GNU_SOURCE
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backends/sbxstore.h"
#include "dsec/alloc.h"
#include "dsec/io.h"

static int oom(const struct dsec_sbx_store *s, dsec_err *err, const char *what)
{
    return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "%s: %s", s->type, what);
}

char *dsec_sbx_read_file(const char *path, size_t max)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return NULL;
    char *buf = dsec_malloc(max + 1);
    ssize_t got = buf != NULL ? dsec_read_full(fd, buf, max) : -1;
    int e = buf != NULL ? errno : ENOMEM;
    close(fd);
    if (got < 0) {
        dsec_free(buf);
        errno = e;
        return NULL;
    }
    buf[got] = '\0';
    return buf;
}

/* ---- records ----------------------------------------------------------------------------- */

/* Values go one per line; a newline or backslash inside one is escaped. */
void dsec_sbx_rec_put(FILE *f, const char *key, const char *v)
{
    fprintf(f, "%s ", key);
    for (const char *c = v ? v : "-"; *c; c++) {
        if (*c == '\n')
            fputs("\\n", f);
        else if (*c == '\\')
            fputs("\\\\", f);
        else
            fputc(*c, f);
    }
    fputc('\n', f);
}

void dsec_sbx_rec_unesc(char *s)
{
    char *w = s;
    for (char *r = s; *r; r++) {
        if (*r == '\\' && (r[1] == 'n' || r[1] == '\\')) {
            *w++ = r[1] == 'n' ? '\n' : '\\';
            r++;
        } else {
            *w++ = *r;
        }
    }
    *w = '\0';
}

int dsec_sbx_rec_parse(char *text, int (*fn)(void *arg, const char *key, char *val, dsec_err *err),
                       void *arg, dsec_err *err)
{
    for (char *save = NULL, *line = strtok_r(text, "\n", &save); line;
         line = strtok_r(NULL, "\n", &save)) {
        char *sp = strchr(line, ' ');
        if (sp == NULL)
            continue;
        *sp = '\0';
        dsec_sbx_rec_unesc(sp + 1);
        if (fn(arg, line, sp + 1, err) < 0)
            return -1;
    }
    return 0;
}

int dsec_sbx_rec_write(const struct dsec_sbx_store *s, const char *dir, const char *magic,
                       void (*put)(FILE *f, const void *arg), const void *arg, dsec_err *err)
{
    char path[PATH_MAX + 16], tmp[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/meta", dir);
    snprintf(tmp, sizeof tmp, "%s/meta.tmp", dir);
    FILE *f = fopen(tmp, "we");
    if (f == NULL)
        return dsec_err_set(err, DSEC_E_IO, errno, "%s: creating %s", s->type, tmp);
    fprintf(f, "%s\n", magic);
    put(f, arg);
    if (fclose(f) != 0 || rename(tmp, path) < 0)
        return dsec_err_set(err, DSEC_E_IO, errno, "%s: writing %s", s->type, path);
    return 0;
}

void dsec_sbx_rec_value(const char *text, const char *key, char *out, size_t len)
{
    char k[32];
    snprintf(k, sizeof k, "\n%s ", key);
    const char *r = text != NULL ? strstr(text, k) : NULL;
    size_t n = r != NULL ? strcspn(r + strlen(k), "\n") : 0;
    if (r == NULL || n >= len)
        n = 0;
    else
        memcpy(out, r + strlen(k), n);
    out[n] = '\0';
}

/* ---- options ------------------------------------------------------------------------------ */

int dsec_sbx_opt_u64(const struct dsec_sbx_store *s, const char *k, const char *v, uint64_t lo,
                     uint64_t hi, uint64_t *out, dsec_err *err)
{
    char *end;
    errno = 0;
    unsigned long long x = strtoull(v, &end, 10);
    if (errno != 0 || end == v || *end != '\0' || v[0] == '-' || x < lo || x > hi)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "%s option %s=\"%s\": expected an integer in %" PRIu64 "..%" PRIu64,
                            s->type, k, v, lo, hi);
    *out = x;
    return 0;
}

int dsec_sbx_opts(const struct dsec_sbx_store *s, const dsec_backend_config *cfg,
                  int (*fn)(void *arg, const char *key, const char *k, const char *v,
                            dsec_err *err),
                  void *arg, const char *known, dsec_err *err)
{
    char prefix[32];
    int plen = snprintf(prefix, sizeof prefix, "%s.", s->type);
    for (size_t i = 0; i < cfg->nopts; i++) {
        const char *k = cfg->opts[i].key, *v = cfg->opts[i].value;
        if (k == NULL || v == NULL)
            return dsec_err_set(err, DSEC_E_CONFIG, 0, "%s option %zu has no key or value", s->type,
                                i);
        bool mine = strncmp(k, prefix, (size_t)plen) == 0;
        int rc = fn(arg, mine ? k + plen : k, k, v, err);
        if (rc == 0 && mine)
            rc = dsec_err_set(err, DSEC_E_CONFIG, 0, "unknown %s option %s (known: %s)", s->type, k,
                              known);
        if (rc < 0)
            return -1;
    }
    return 0;
}

/* ---- strings -------------------------------------------------------------------------------- */

int dsec_sbx_set_str(const struct dsec_sbx_store *s, char **dst, const char *src, dsec_err *err)
{
    dsec_free(*dst);
    *dst = src ? dsec_strdup(src) : NULL;
    return src != NULL && *dst == NULL ? oom(s, err, "copying a string") : 0;
}

int dsec_sbx_strv_add(char ***v, size_t *n, const char *const *add, size_t nadd)
{
    if (nadd == 0)
        return 0;
    char **nv = dsec_realloc(*v, (*n + nadd) * sizeof *nv);
    if (nv == NULL)
        return -1;
    *v = nv;
    for (size_t i = 0; i < nadd; i++) {
        if ((nv[*n] = dsec_strdup(add[i] != NULL ? add[i] : "")) == NULL)
            return -1;
        (*n)++;
    }
    return 0;
}

void dsec_sbx_strv_clear(char ***v, size_t *n)
{
    for (size_t i = 0; i < *n; i++)
        dsec_free((*v)[i]);
    dsec_free(*v);
    *v = NULL;
    *n = 0;
}

/* ---- environments -----------------------------------------------------------------------------
 */

void dsec_sbx_env_clear(struct dsec_sbx_env *e)
{
    dsec_free(e->name);
    dsec_sbx_strv_clear(&e->vars, &e->nvars);
    dsec_free(e->workdir);
    dsec_free(e->user);
    dsec_sbx_strv_clear(&e->cmd, &e->ncmd);
    memset(e, 0, sizeof *e);
}

int dsec_sbx_env_var(const struct dsec_sbx_store *s, struct dsec_sbx_env *e, const char *kv,
                     dsec_err *err)
{
    bool one_line = s->flags & DSEC_SBX_VARS_ONE_LINE;
    if (strchr(kv, '=') == NULL || kv[0] == '=' || (one_line && strchr(kv, '\n') != NULL))
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "%s: environment variable \"%.80s\" is not KEY=VALUE%s", s->type, kv,
                            one_line ? " on one line" : "");
    const char *one[1] = {kv};
    return dsec_sbx_strv_add(&e->vars, &e->nvars, one, 1) < 0 ? oom(s, err, "environment variables")
                                                              : 0;
}

int dsec_sbx_env_cmd(const struct dsec_sbx_store *s, struct dsec_sbx_env *e, const char *arg,
                     dsec_err *err)
{
    const char *one[1] = {arg};
    return dsec_sbx_strv_add(&e->cmd, &e->ncmd, one, 1) < 0 ? oom(s, err, "default command") : 0;
}

int dsec_sbx_env_copy(const struct dsec_sbx_store *s, struct dsec_sbx_env *dst,
                      const struct dsec_sbx_env *src, dsec_err *err)
{
    memset(dst, 0, sizeof *dst);
    int rc = dsec_sbx_set_str(s, &dst->name, src->name, err);
    for (size_t i = 0; rc == 0 && i < src->nvars; i++)
        rc = dsec_sbx_env_var(s, dst, src->vars[i], err);
    if (rc == 0)
        rc = dsec_sbx_set_str(s, &dst->workdir, src->workdir, err);
    if (rc == 0)
        rc = dsec_sbx_set_str(s, &dst->user, src->user, err);
    for (size_t i = 0; rc == 0 && i < src->ncmd; i++)
        rc = dsec_sbx_env_cmd(s, dst, src->cmd[i], err);
    dst->nentry = src->nentry;
    if (rc < 0)
        dsec_sbx_env_clear(dst);
    return rc;
}

int dsec_sbx_env_from_doc(const struct dsec_sbx_store *s, struct dsec_sbx_env *out,
                          const dsec_env *d,
                          int (*layer)(void *arg, const char *digest, int format, dsec_err *err),
                          void *arg, dsec_err *err)
{
    memset(out, 0, sizeof *out);
    int rc = dsec_sbx_set_str(s, &out->name, d->name, err);
    if (rc == 0)
        rc = dsec_sbx_set_str(s, &out->workdir, d->workdir ? d->workdir : "/", err);
    if (rc == 0)
        rc = dsec_sbx_set_str(s, &out->user, d->user ? d->user : "root", err);
    for (size_t i = 0; rc == 0 && i < d->nlayers; i++)
        rc = layer(arg, d->layers[i], d->formats ? (int)d->formats[i] : 0, err);
    for (size_t i = 0; rc == 0 && i < d->nvars; i++)
        rc = dsec_sbx_env_var(s, out, d->vars[i], err);
    for (size_t i = 0; rc == 0 && i < d->ncmd; i++)
        rc = dsec_sbx_env_cmd(s, out, d->cmd[i], err);
    out->nentry = d->nentry <= d->ncmd ? d->nentry : 0;
    if (rc < 0)
        dsec_sbx_env_clear(out);
    return rc;
}

int dsec_sbx_env_get(const struct dsec_sbx_store *s, dsec_layer_registry *reg, const char *name,
                     dsec_env **d, dsec_err *err)
{
    *d = NULL;
    if (reg == NULL)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "%s: the node has no layer registry to find environment %s in", s->type,
                            name);
    if (dsec_layer_registry_env_get(reg, name, d, err) < 0)
        return dsec_err_wrap(err, "%s: environment %s", s->type, name);
    return 0;
}

void dsec_sbx_env_put(FILE *f, const struct dsec_sbx_env *e)
{
    dsec_sbx_rec_put(f, "env", e->name);
    dsec_sbx_rec_put(f, "workdir", e->workdir);
    dsec_sbx_rec_put(f, "user", e->user);
    for (size_t i = 0; i < e->nvars; i++)
        dsec_sbx_rec_put(f, "var", e->vars[i]);
    for (size_t i = 0; i < e->ncmd; i++) /* an empty argument is a line "cmd " */
        dsec_sbx_rec_put(f, "cmd", e->cmd[i]);
    if (e->nentry > 0)
        fprintf(f, "entry %zu\n", e->nentry);
}

int dsec_sbx_env_line(const struct dsec_sbx_store *s, struct dsec_sbx_env *e, const char *key,
                      char *val, dsec_err *err)
{
    int rc;
    if (strcmp(key, "env") == 0)
        rc = dsec_sbx_set_str(s, &e->name, strcmp(val, "-") == 0 ? NULL : val, err);
    else if (strcmp(key, "workdir") == 0)
        rc = dsec_sbx_set_str(s, &e->workdir, val, err);
    else if (strcmp(key, "user") == 0)
        rc = dsec_sbx_set_str(s, &e->user, val, err);
    else if (strcmp(key, "var") == 0)
        rc = dsec_sbx_env_var(s, e, val, err);
    else if (strcmp(key, "cmd") == 0)
        rc = dsec_sbx_env_cmd(s, e, val, err);
    else if (strcmp(key, "entry") == 0)
        rc = (e->nentry = strtoull(val, NULL, 10), 0);
    else
        return 0;
    return rc < 0 ? -1 : 1;
}

/* ---- network policy lines ------------------------------------------------------------------- */

void dsec_sbx_net_put(FILE *f, const char *tenant, const dsec_net_sbx *net, char *const *entries,
                      size_t n)
{
    dsec_sbx_rec_put(f, "tenant", tenant);
    if (net != NULL)
        dsec_sbx_rec_put(f, "net_state", dsec_net_sbx_state(net));
    for (size_t i = 0; i < n; i++)
        dsec_sbx_rec_put(f, "net", entries[i]);
}

int dsec_sbx_net_line(const struct dsec_sbx_store *s, const struct dsec_sbx_netrec *r,
                      const char *key, char *val, dsec_err *err)
{
    int rc;
    if (strcmp(key, "tenant") == 0)
        rc = dsec_sbx_set_str(s, r->tenant, strcmp(val, "-") == 0 ? NULL : val, err);
    else if (strcmp(key, "net_state") == 0)
        rc = dsec_sbx_set_str(s, r->state, val, err);
    else if (strcmp(key, "net") == 0) {
        const char *one[1] = {val};
        rc = dsec_sbx_strv_add(r->entries, r->n, one, 1) < 0 ? oom(s, err, "network policy") : 0;
    } else
        return 0;
    return rc < 0 ? -1 : 1;
}
