/* dockerfile.c - Dockerfile parsing for `dsec image build`: instructions, word splitting,
 * variables, .dockerignore. */
#define _GNU_SOURCE
#include <ctype.h>
#include <fnmatch.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsec/alloc.h"
#include "tools/dockerfile.h"

/* A growing string. */
typedef struct str {
    char *p;
    size_t n, cap;
} str;

static int str_add(str *s, const char *p, size_t n, dsec_err *err)
{
    if (s->n + n + 1 > s->cap) {
        size_t cap = s->cap != 0 ? s->cap : 64;
        while (cap < s->n + n + 1)
            cap *= 2;
        char *q = dsec_realloc(s->p, cap);
        if (q == NULL)
            return dsec_err_set(err, DSEC_E_NOMEM, 0, "Dockerfile: out of memory");
        s->p = q;
        s->cap = cap;
    }
    memcpy(s->p + s->n, p, n);
    s->n += n;
    s->p[s->n] = '\0';
    return 0;
}

static int str_ch(str *s, char c, dsec_err *err)
{
    return str_add(s, &c, 1, err);
}

/* The string s holds (possibly "", never NULL); s is empty after. */
static char *str_take(str *s, dsec_err *err)
{
    if (s->p == NULL && str_add(s, "", 0, err) < 0)
        return NULL;
    char *p = s->p;
    *s = (str){0};
    return p;
}

static int strv_push(char ***v, size_t *n, char *s, dsec_err *err)
{
    char **q = dsec_realloc(*v, (*n + 1) * sizeof *q);
    if (q == NULL) {
        dsec_free(s);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "Dockerfile: out of memory");
    }
    q[(*n)++] = s;
    *v = q;
    return 0;
}

void dsec_df_strv_free(char **v, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dsec_free(v[i]);
    dsec_free(v);
}

/* ---- JSON arrays of strings (the exec form) ---------------------------------------------- */

static const char *skip_ws(const char *p)
{
    while (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\n')
        p++;
    return p;
}

static int hex4(const char *p, unsigned *out)
{
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        v <<= 4;
        if (c >= '0' && c <= '9')
            v |= (unsigned)(c - '0');
        else if (c >= 'a' && c <= 'f')
            v |= (unsigned)(c - 'a' + 10);
        else if (c >= 'A' && c <= 'F')
            v |= (unsigned)(c - 'A' + 10);
        else
            return -1;
    }
    *out = v;
    return 0;
}

static int put_utf8(str *s, unsigned cp, dsec_err *err)
{
    char b[4];
    size_t n;
    if (cp < 0x80) {
        b[0] = (char)cp;
        n = 1;
    } else if (cp < 0x800) {
        b[0] = (char)(0xc0 | (cp >> 6));
        b[1] = (char)(0x80 | (cp & 0x3f));
        n = 2;
    } else if (cp < 0x10000) {
        b[0] = (char)(0xe0 | (cp >> 12));
        b[1] = (char)(0x80 | ((cp >> 6) & 0x3f));
        b[2] = (char)(0x80 | (cp & 0x3f));
        n = 3;
    } else {
        b[0] = (char)(0xf0 | (cp >> 18));
        b[1] = (char)(0x80 | ((cp >> 12) & 0x3f));
        b[2] = (char)(0x80 | ((cp >> 6) & 0x3f));
        b[3] = (char)(0x80 | (cp & 0x3f));
        n = 4;
    }
    return str_add(s, b, n, err);
}

/* One JSON string at *pp (at its opening quote); 1 parsed, 0 not JSON, -1 error. */
static int json_string(const char **pp, str *s, dsec_err *err)
{
    const char *p = *pp + 1;
    while (*p != '"') {
        if (*p == '\0' || (unsigned char)*p < 0x20)
            return 0;
        if (*p != '\\') {
            if (str_ch(s, *p++, err) < 0)
                return -1;
            continue;
        }
        p++;
        const char *m = strchr("\"\\/bfnrt", *p);
        if (*p != '\0' && m != NULL) {
            static const char to[] = "\"\\/\b\f\n\r\t";
            if (str_ch(s, to[m - "\"\\/bfnrt"], err) < 0)
                return -1;
            p++;
            continue;
        }
        unsigned cp, lo;
        if (*p != 'u' || hex4(p + 1, &cp) < 0)
            return 0;
        p += 5;
        if (cp >= 0xd800 && cp < 0xdc00) { /* a surrogate pair */
            if (p[0] != '\\' || p[1] != 'u' || hex4(p + 2, &lo) < 0 || lo < 0xdc00 || lo > 0xdfff)
                return 0;
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
            p += 6;
        } else if (cp >= 0xdc00 && cp < 0xe000) {
            return 0;
        }
        if (cp == 0) /* a NUL cannot be an argument */
            return 0;
        if (put_utf8(s, cp, err) < 0)
            return -1;
    }
    *pp = p + 1;
    return 1;
}

/* rest as a JSON array of strings: 1 (args filled), 0 (not one: the shell form), -1 error. */
static int json_array(const char *rest, char ***args, size_t *n, dsec_err *err)
{
    const char *p = skip_ws(rest);
    if (*p != '[')
        return 0;
    p = skip_ws(p + 1);
    char **v = NULL;
    size_t nv = 0;
    int rc = 1;
    if (*p == ']')
        p++;
    while (rc == 1 && p[-1] != ']') {
        str s = {0};
        if (*p != '"' || (rc = json_string(&p, &s, err)) != 1) {
            dsec_free(s.p);
            rc = rc < 0 ? -1 : 0;
            break;
        }
        char *w = str_take(&s, err);
        if (w == NULL || strv_push(&v, &nv, w, err) < 0) {
            rc = -1;
            break;
        }
        p = skip_ws(p);
        if (*p != ',' && *p != ']') {
            rc = 0;
            break;
        }
        p = skip_ws(p + 1);
    }
    if (rc == 1 && *skip_ws(p) != '\0')
        rc = 0;
    if (rc != 1) {
        dsec_df_strv_free(v, nv);
        return rc;
    }
    *args = v;
    *n = nv;
    return 1;
}

/* ---- variables ---------------------------------------------------------------------------- */

static ssize_t var_find(const dsec_df_vars *vs, const char *key, size_t klen)
{
    for (size_t i = vs->n; i-- > 0;)
        if (strncmp(vs->v[i], key, klen) == 0 && vs->v[i][klen] == '=')
            return (ssize_t)i;
    return -1;
}

int dsec_df_vars_set(dsec_df_vars *vs, const char *key, const char *value, dsec_err *err)
{
    size_t kl = strlen(key), vl = strlen(value);
    char *kv = dsec_malloc(kl + vl + 2);
    if (kv == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "Dockerfile: out of memory");
    memcpy(kv, key, kl);
    kv[kl] = '=';
    memcpy(kv + kl + 1, value, vl + 1);
    ssize_t i = var_find(vs, key, kl);
    if (i >= 0) {
        dsec_free(vs->v[i]);
        vs->v[i] = kv;
        return 0;
    }
    if (vs->n == vs->cap) {
        size_t cap = vs->cap != 0 ? vs->cap * 2 : 16;
        char **q = dsec_realloc(vs->v, cap * sizeof *q);
        if (q == NULL) {
            dsec_free(kv);
            return dsec_err_set(err, DSEC_E_NOMEM, 0, "Dockerfile: out of memory");
        }
        vs->v = q;
        vs->cap = cap;
    }
    vs->v[vs->n++] = kv;
    return 0;
}

int dsec_df_vars_add(dsec_df_vars *vs, char *const *kv, size_t n, dsec_err *err)
{
    for (size_t i = 0; i < n; i++) {
        const char *eq = strchr(kv[i], '=');
        if (eq == NULL)
            continue;
        char *key = dsec_strndup(kv[i], (size_t)(eq - kv[i]));
        int rc = key != NULL ? dsec_df_vars_set(vs, key, eq + 1, err)
                             : dsec_err_set(err, DSEC_E_NOMEM, 0, "Dockerfile: out of memory");
        dsec_free(key);
        if (rc < 0)
            return -1;
    }
    return 0;
}

const char *dsec_df_vars_get(const dsec_df_vars *vs, const char *key)
{
    size_t kl = strlen(key);
    ssize_t i = vs != NULL ? var_find(vs, key, kl) : -1;
    return i >= 0 ? vs->v[i] + kl + 1 : NULL;
}

void dsec_df_vars_free(dsec_df_vars *vs)
{
    dsec_df_strv_free(vs->v, vs->n);
    *vs = (dsec_df_vars){0};
}

static bool name_char(char c, bool first)
{
    return c == '_' || isalpha((unsigned char)c) || (!first && isdigit((unsigned char)c));
}

static int expand_word(const char **pp, char escape, const dsec_df_vars *vars, str *out,
                       dsec_err *err);

/* $NAME or ${NAME[:-word|:+word]} at *pp (just past the '$'). */
static int expand_var(const char **pp, char escape, const dsec_df_vars *vars, str *out,
                      dsec_err *err)
{
    const char *p = *pp;
    bool braced = *p == '{';
    if (braced)
        p++;
    const char *name = p;
    while (name_char(*p, p == name))
        p++;
    size_t nl = (size_t)(p - name);
    if (nl == 0) { /* "$" alone stays a "$" */
        if (braced)
            return dsec_err_set(err, DSEC_E_INVALID, 0, "bad substitution: \"${%.20s\"", name);
        return str_ch(out, '$', err);
    }
    char key[256];
    if (nl >= sizeof key)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "variable name longer than %zu",
                            sizeof key - 1);
    memcpy(key, name, nl);
    key[nl] = '\0';
    const char *val = dsec_df_vars_get(vars, key);
    if (!braced) {
        *pp = p;
        return val != NULL ? str_add(out, val, strlen(val), err) : 0;
    }
    char mod = 0;
    str word = {0};
    if (p[0] == ':' && (p[1] == '-' || p[1] == '+')) {
        mod = p[1];
        p += 2;
        while (*p != '}' && *p != '\0')
            if (expand_word(&p, escape, vars, &word, err) < 0) {
                dsec_free(word.p);
                return -1;
            }
    }
    if (*p != '}') {
        dsec_free(word.p);
        return dsec_err_set(err, DSEC_E_INVALID, 0, "bad substitution: \"${%s\" has no closing '}'",
                            key);
    }
    *pp = p + 1;
    bool set = val != NULL && val[0] != '\0';
    const char *use = mod == '-'   ? (set ? val : (word.p ? word.p : ""))
                      : mod == '+' ? (set ? (word.p ? word.p : "") : "")
                                   : (val != NULL ? val : "");
    int rc = str_add(out, use, strlen(use), err);
    dsec_free(word.p);
    return rc;
}

/* One character or construct of a word at *pp, appended to out (inside ${...:-word}). */
static int expand_word(const char **pp, char escape, const dsec_df_vars *vars, str *out,
                       dsec_err *err)
{
    const char *p = *pp;
    if (*p == escape && p[1] != '\0') {
        *pp = p + 2;
        return str_ch(out, p[1], err);
    }
    if (*p == '$' && vars != NULL) {
        *pp = p + 1;
        return expand_var(pp, escape, vars, out, err);
    }
    *pp = p + 1;
    return str_ch(out, *p, err);
}

static int quoted(const char **pp, char escape, const dsec_df_vars *vars, str *w, dsec_err *err)
{
    const char *p = *pp;
    char q = *p++;
    while (*p != q) {
        if (*p == '\0')
            return dsec_err_set(err, DSEC_E_INVALID, 0, "unterminated %s quote",
                                q == '"' ? "double" : "single");
        if (q == '\'') {
            if (str_ch(w, *p++, err) < 0)
                return -1;
        } else if (*p == escape && (p[1] == '"' || p[1] == escape || p[1] == '$')) {
            if (str_ch(w, p[1], err) < 0)
                return -1;
            p += 2;
        } else if (expand_word(&p, escape, vars, w, err) < 0) {
            return -1;
        }
    }
    *pp = p + 1;
    return 0;
}

int dsec_df_words(const char *s, char escape, const dsec_df_vars *vars, char ***words, size_t *n,
                  dsec_err *err)
{
    char **v = NULL;
    size_t nv = 0;
    const char *p = s;
    for (;;) {
        while (*p == ' ' || *p == '\t')
            p++;
        if (*p == '\0')
            break;
        str w = {0};
        int rc = 0;
        while (rc == 0 && *p != '\0' && *p != ' ' && *p != '\t') {
            if (*p == '\'' || *p == '"')
                rc = quoted(&p, escape, vars, &w, err);
            else
                rc = expand_word(&p, escape, vars, &w, err);
        }
        char *word = rc == 0 ? str_take(&w, err) : NULL;
        if (word == NULL || strv_push(&v, &nv, word, err) < 0) {
            dsec_free(w.p);
            dsec_df_strv_free(v, nv);
            return -1;
        }
    }
    *words = v;
    *n = nv;
    return 0;
}

/* ---- the file ------------------------------------------------------------------------------ */

static const char *const known[] = {
    "FROM",    "RUN",   "CMD",        "ENTRYPOINT",  "ENV",        "ARG",
    "WORKDIR", "USER",  "COPY",       "ADD",         "LABEL",      "EXPOSE",
    "VOLUME",  "SHELL", "STOPSIGNAL", "HEALTHCHECK", "MAINTAINER", "ONBUILD"};

void dsec_df_free(dsec_df *df)
{
    for (size_t i = 0; i < df->n; i++) {
        dsec_df_insn *in = &df->v[i];
        dsec_free(in->cmd);
        dsec_df_strv_free(in->flags, in->nflags);
        dsec_free(in->rest);
        dsec_df_strv_free(in->args, in->nargs);
    }
    dsec_free(df->v);
    *df = (dsec_df){0};
}

/* Parser directives: "# escape=`" (or "\"), "# syntax=..." before any instruction or comment. */
static void directives(const char **pp, const char *end, char *escape)
{
    const char *p = *pp;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl != NULL ? nl : end;
        const char *q = p;
        while (q < le && (*q == ' ' || *q == '\t'))
            q++;
        if (q >= le || *q != '#')
            break;
        q++;
        while (q < le && (*q == ' ' || *q == '\t'))
            q++;
        if (le - q >= 8 && strncasecmp(q, "escape=", 7) == 0 && (q[7] == '`' || q[7] == '\\'))
            *escape = q[7];
        else if (!(le - q >= 7 && strncasecmp(q, "syntax=", 7) == 0))
            break;
        p = nl != NULL ? nl + 1 : end;
    }
    *pp = p;
}

/* The instruction's leading --flags, then the rest. */
static int split_flags(dsec_df_insn *in, const char *args, dsec_err *err)
{
    const char *p = args;
    while (p[0] == '-' && p[1] == '-' && isalpha((unsigned char)p[2])) {
        const char *e = p;
        while (*e != '\0' && *e != ' ' && *e != '\t')
            e++;
        char *f = dsec_strndup(p, (size_t)(e - p));
        if (f == NULL || strv_push(&in->flags, &in->nflags, f, err) < 0)
            return f == NULL ? dsec_err_set(err, DSEC_E_NOMEM, 0, "Dockerfile: out of memory") : -1;
        while (*e == ' ' || *e == '\t')
            e++;
        p = e;
    }
    size_t n = strlen(p);
    while (n > 0 && isspace((unsigned char)p[n - 1]))
        n--;
    in->rest = dsec_strndup(p, n);
    if (in->rest == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "Dockerfile: out of memory");
    return 0;
}

/* One logical line (continuations joined) into an instruction. */
static int add_insn(dsec_df *df, const char *name, unsigned line, const char *text, dsec_err *err)
{
    const char *p = text;
    while (*p == ' ' || *p == '\t')
        p++;
    const char *kw = p;
    while (*p != '\0' && *p != ' ' && *p != '\t')
        p++;
    size_t kl = (size_t)(p - kw);
    char cmd[16] = "";
    for (size_t i = 0; i < kl && i < sizeof cmd - 1; i++)
        cmd[i] = (char)toupper((unsigned char)kw[i]);
    bool ok = kl < sizeof cmd;
    size_t k = 0;
    while (ok && k < sizeof known / sizeof *known && strcmp(known[k], cmd) != 0)
        k++;
    if (!ok || k == sizeof known / sizeof *known)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "%s:%u: unknown instruction \"%.*s\"", name,
                            line, (int)(kl > 40 ? 40 : kl), kw);
    while (*p == ' ' || *p == '\t')
        p++;
    if (strstr(p, "<<") != NULL && (strcmp(cmd, "RUN") == 0 || strcmp(cmd, "COPY") == 0)) {
        const char *h = strstr(p, "<<");
        if (h[2] == '-' || h[2] == '"' || h[2] == '\'' || isupper((unsigned char)h[2]))
            return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                                "%s:%u: %s with a heredoc (<<%c...) is not supported: put the text "
                                "in a file of the context and COPY it",
                                name, line, cmd, h[2]);
    }
    dsec_df_insn *v = dsec_realloc(df->v, (df->n + 1) * sizeof *v);
    if (v == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "Dockerfile: out of memory");
    df->v = v;
    dsec_df_insn *in = &v[df->n++];
    *in = (dsec_df_insn){.line = line};
    in->cmd = dsec_strdup(cmd);
    if (in->cmd == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "Dockerfile: out of memory");
    if (split_flags(in, p, err) < 0)
        return -1;
    if (strcmp(cmd, "FROM") != 0 && strcmp(cmd, "ENV") != 0 && strcmp(cmd, "ARG") != 0 &&
        strcmp(cmd, "LABEL") != 0 && strcmp(cmd, "WORKDIR") != 0 && strcmp(cmd, "USER") != 0) {
        int rc = json_array(in->rest, &in->args, &in->nargs, err);
        if (rc < 0)
            return -1;
        in->json = rc == 1;
    }
    if (in->rest[0] == '\0' && !in->json)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "%s:%u: %s needs arguments", name, line, cmd);
    return 0;
}

/* Whether line (without its newline) ends in the escape character, ignoring trailing blanks;
 * *cut is where the continued text stops. */
static bool continues(const char *l, size_t n, char escape, size_t *cut)
{
    while (n > 0 && (l[n - 1] == ' ' || l[n - 1] == '\t' || l[n - 1] == '\r'))
        n--;
    *cut = n > 0 && l[n - 1] == escape ? n - 1 : n;
    return n > 0 && l[n - 1] == escape;
}

int dsec_df_parse(const char *text, size_t len, const char *name, dsec_df *out, dsec_err *err)
{
    *out = (dsec_df){.escape = '\\'};
    if (memchr(text, '\0', len) != NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "%s: holds a NUL byte: not a Dockerfile", name);
    const char *p = text, *end = text + len;
    directives(&p, end, &out->escape);
    unsigned line = 1;
    for (const char *q = text; q < p; q++)
        line += *q == '\n';
    str cur = {0};
    unsigned start = 0;
    int rc = 0;
    while (rc == 0 && p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t n = (size_t)((nl != NULL ? nl : end) - p);
        const char *t = p;
        while (t < p + n && (*t == ' ' || *t == '\t'))
            t++;
        bool blank = t == p + n || (t == p + n - 1 && *t == '\r');
        if (*t == '#' && t < p + n) {
            /* a comment line, also inside a continuation */
        } else if (blank) {
            /* Docker ends nothing at a blank line inside a continuation either */
        } else {
            size_t cut;
            bool more = continues(p, n, out->escape, &cut);
            if (cur.n == 0)
                start = line;
            rc = str_add(&cur, p, cut, err);
            if (rc == 0 && !more) {
                rc = add_insn(out, name, start, cur.p, err);
                cur.n = 0;
            } else if (rc == 0) {
                rc = str_ch(&cur, ' ', err);
            }
        }
        p = nl != NULL ? nl + 1 : end;
        line++;
    }
    if (rc == 0 && cur.n != 0)
        rc = dsec_err_set(err, DSEC_E_INVALID, 0,
                          "%s:%u: the file ends inside a continued line (a trailing '%c')", name,
                          start, out->escape);
    dsec_free(cur.p);
    if (rc == 0 && (out->n == 0 || strcmp(out->v[0].cmd, "FROM") != 0)) {
        size_t i = 0;
        while (i < out->n && strcmp(out->v[i].cmd, "ARG") == 0)
            i++;
        if (i == out->n || strcmp(out->v[i].cmd, "FROM") != 0)
            rc = dsec_err_set(err, DSEC_E_INVALID, 0,
                              "%s: the first instruction must be FROM (ARG may come before it)",
                              name);
    }
    if (rc < 0)
        dsec_df_free(out);
    return rc;
}

/* ---- .dockerignore ------------------------------------------------------------------------- */

void dsec_df_ignore_free(dsec_df_ignore *ig)
{
    dsec_df_strv_free(ig->pats, ig->n);
    dsec_free(ig->negate);
    *ig = (dsec_df_ignore){0};
}

int dsec_df_ignore_parse(const char *text, size_t len, dsec_df_ignore *out, dsec_err *err)
{
    *out = (dsec_df_ignore){0};
    const char *p = text, *end = text + len;
    while (p < end) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        const char *le = nl != NULL ? nl : end;
        while (p < le && isspace((unsigned char)*p))
            p++;
        const char *e = le;
        while (e > p && isspace((unsigned char)e[-1]))
            e--;
        bool neg = p < e && *p == '!';
        if (neg)
            p++;
        while (p < e && (*p == '/' || (*p == '.' && p + 1 < e && p[1] == '/')))
            p += *p == '/' ? 1 : 2;
        if (p < e && *p != '#') {
            char *pat = dsec_strndup(p, (size_t)(e - p));
            bool *ng = dsec_realloc(out->negate, (out->n + 1) * sizeof *ng);
            if (ng != NULL)
                out->negate = ng;
            size_t before = out->n;
            if (pat == NULL || ng == NULL || strv_push(&out->pats, &out->n, pat, err) < 0) {
                if (out->n == before)
                    dsec_free(pat);
                dsec_df_ignore_free(out);
                return dsec_err_set(err, DSEC_E_NOMEM, 0, ".dockerignore: out of memory");
            }
            out->negate[before] = neg;
        }
        p = nl != NULL ? nl + 1 : end;
    }
    return 0;
}

/* pat against path, '/'-separated segment by segment; "**" spans any number of segments. */
static bool seg_match(const char *pat, const char *path)
{
    if (*pat == '\0')
        return *path == '\0';
    const char *ps = strchr(pat, '/');
    size_t pl = ps != NULL ? (size_t)(ps - pat) : strlen(pat);
    if (pl == 2 && pat[0] == '*' && pat[1] == '*') {
        const char *rest = ps != NULL ? ps + 1 : "";
        for (const char *q = path;; q++) { /* zero or more whole segments */
            if ((q == path || q[-1] == '/') && seg_match(rest, q))
                return true;
            if (*q == '\0')
                return *rest == '\0';
        }
    }
    if (*path == '\0')
        return false;
    const char *ss = strchr(path, '/');
    size_t sl = ss != NULL ? (size_t)(ss - path) : strlen(path);
    char pb[512], sb[512];
    if (pl >= sizeof pb || sl >= sizeof sb)
        return false;
    memcpy(pb, pat, pl);
    pb[pl] = '\0';
    memcpy(sb, path, sl);
    sb[sl] = '\0';
    if (fnmatch(pb, sb, 0) != 0)
        return false;
    if (ps == NULL)
        return true; /* the pattern named this segment: all below it goes with it */
    return ss != NULL && seg_match(ps + 1, ss + 1);
}

bool dsec_df_ignored(const dsec_df_ignore *ig, const char *rel)
{
    bool out = false;
    for (size_t i = 0; i < ig->n; i++)
        if (seg_match(ig->pats[i], rel))
            out = !ig->negate[i];
    return out;
}
