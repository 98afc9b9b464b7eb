/* config.c - libyaml event parser building a small tree with line numbers. */
#include "runtime/config.h"

#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "dsec/alloc.h"

#define MAX_DEPTH 32
#define MAX_CONFIG_BYTES (4u << 20)

struct dsec_cfg {
    char *name;
    dsec_cfg_node *root;
};

static void node_free(dsec_cfg_node *n)
{
    if (n == NULL)
        return;
    for (size_t i = 0; i < n->n; i++)
        node_free(n->kids[i]);
    dsec_free(n->kids);
    dsec_free((char *)n->key);
    dsec_free((char *)n->value);
    dsec_free(n);
}

void dsec_cfg_free(dsec_cfg *c)
{
    if (c == NULL)
        return;
    node_free(c->root);
    dsec_free(c->name);
    dsec_free(c);
}

static int add_kid(dsec_cfg_node *parent, dsec_cfg_node *kid)
{
    dsec_cfg_node **k = dsec_realloc(parent->kids, (parent->n + 1) * sizeof *k);
    if (k == NULL)
        return -1;
    parent->kids = k;
    parent->kids[parent->n++] = kid;
    return 0;
}

struct parse {
    yaml_parser_t p;
    const char *name;
    dsec_err *err;
};

static int next_event(struct parse *ps, yaml_event_t *ev)
{
    if (!yaml_parser_parse(&ps->p, ev))
        return dsec_err_set(ps->err, DSEC_E_CONFIG, 0, "%s:%zu: %s", ps->name,
                            ps->p.problem_mark.line + 1,
                            ps->p.problem ? ps->p.problem : "YAML syntax error");
    return 0;
}

static dsec_cfg_node *new_node(dsec_cfg_kind kind, const yaml_event_t *ev)
{
    dsec_cfg_node *n = dsec_calloc(1, sizeof *n);
    if (n != NULL) {
        n->kind = kind;
        n->line = (int)ev->start_mark.line + 1;
    }
    return n;
}

/* Parse the node starting with ev (already read) into *out. */
static int parse_node(struct parse *ps, yaml_event_t *ev, int depth, dsec_cfg_node **out);

static int parse_children(struct parse *ps, dsec_cfg_node *n, int depth)
{
    for (;;) {
        yaml_event_t ev;
        if (next_event(ps, &ev) < 0)
            return -1;
        if (ev.type == YAML_SEQUENCE_END_EVENT || ev.type == YAML_MAPPING_END_EVENT) {
            yaml_event_delete(&ev);
            return 0;
        }
        char *key = NULL;
        int key_line = 0;
        if (n->kind == DSEC_CFG_MAP) {
            if (ev.type != YAML_SCALAR_EVENT) {
                int line = (int)ev.start_mark.line + 1;
                yaml_event_delete(&ev);
                return dsec_err_set(ps->err, DSEC_E_CONFIG, 0,
                                    "%s:%d: map keys must be plain scalars", ps->name, line);
            }
            key = dsec_strdup((const char *)ev.data.scalar.value);
            int line = key_line = (int)ev.start_mark.line + 1;
            yaml_event_delete(&ev);
            if (key == NULL)
                return dsec_err_set(ps->err, DSEC_E_NOMEM, 0, "out of memory");
            if (dsec_cfg_get(n, key) != NULL) {
                dsec_err_set(ps->err, DSEC_E_CONFIG, 0, "%s:%d: key \"%s\" appears twice", ps->name,
                             line, key);
                dsec_free(key);
                return -1;
            }
            if (next_event(ps, &ev) < 0) {
                dsec_free(key);
                return -1;
            }
        }
        dsec_cfg_node *kid = NULL;
        if (parse_node(ps, &ev, depth + 1, &kid) < 0) {
            dsec_free(key);
            return -1;
        }
        kid->key = key;
        if (key != NULL)
            kid->line = key_line; /* errors point at the key, not where its value begins */
        if (add_kid(n, kid) < 0) {
            node_free(kid);
            return dsec_err_set(ps->err, DSEC_E_NOMEM, 0, "out of memory");
        }
    }
}

static int parse_node(struct parse *ps, yaml_event_t *ev, int depth, dsec_cfg_node **out)
{
    int rc = -1;
    dsec_cfg_node *n = NULL;
    if (depth > MAX_DEPTH) {
        dsec_err_set(ps->err, DSEC_E_CONFIG, 0, "%s:%zu: nested deeper than %d levels", ps->name,
                     ev->start_mark.line + 1, MAX_DEPTH);
        goto out_event;
    }
    switch (ev->type) {
    case YAML_SCALAR_EVENT:
        n = new_node(DSEC_CFG_SCALAR, ev);
        if (n != NULL && (n->value = dsec_strdup((const char *)ev->data.scalar.value)) == NULL) {
            node_free(n);
            n = NULL;
        }
        break;
    case YAML_MAPPING_START_EVENT:
    case YAML_SEQUENCE_START_EVENT:
        n = new_node(ev->type == YAML_MAPPING_START_EVENT ? DSEC_CFG_MAP : DSEC_CFG_SEQ, ev);
        break;
    case YAML_ALIAS_EVENT:
        dsec_err_set(ps->err, DSEC_E_CONFIG, 0, "%s:%zu: YAML aliases are not supported", ps->name,
                     ev->start_mark.line + 1);
        goto out_event;
    default:
        dsec_err_set(ps->err, DSEC_E_CONFIG, 0, "%s:%zu: unexpected YAML structure", ps->name,
                     ev->start_mark.line + 1);
        goto out_event;
    }
    if (n == NULL) {
        dsec_err_set(ps->err, DSEC_E_NOMEM, 0, "out of memory");
        goto out_event;
    }
    if (n->kind != DSEC_CFG_SCALAR && parse_children(ps, n, depth) < 0) {
        node_free(n);
        goto out_event;
    }
    *out = n;
    rc = 0;
out_event:
    yaml_event_delete(ev);
    return rc;
}

int dsec_cfg_parse(dsec_cfg **out, const char *name, const char *text, size_t len, dsec_err *err)
{
    *out = NULL;
    dsec_cfg *c = dsec_calloc(1, sizeof *c);
    if (c == NULL || (c->name = dsec_strdup(name)) == NULL) {
        dsec_cfg_free(c);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    }
    struct parse ps = {.name = name, .err = err};
    if (!yaml_parser_initialize(&ps.p)) {
        dsec_cfg_free(c);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    }
    yaml_parser_set_input_string(&ps.p, (const unsigned char *)text, len);
    int rc = -1;
    yaml_event_t ev;
    /* stream start, then document start or stream end (empty file) */
    if (next_event(&ps, &ev) < 0)
        goto out_parser;
    yaml_event_delete(&ev);
    if (next_event(&ps, &ev) < 0)
        goto out_parser;
    if (ev.type == YAML_STREAM_END_EVENT) {
        c->root = new_node(DSEC_CFG_MAP, &ev);
        yaml_event_delete(&ev);
        rc = c->root ? 0 : dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
        goto out_parser;
    }
    yaml_event_delete(&ev);
    if (next_event(&ps, &ev) < 0)
        goto out_parser;
    if (ev.type == YAML_DOCUMENT_END_EVENT) {
        c->root = new_node(DSEC_CFG_MAP, &ev);
        yaml_event_delete(&ev);
        rc = c->root ? 0 : dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
        goto out_parser;
    }
    if (parse_node(&ps, &ev, 0, &c->root) < 0)
        goto out_parser;
    if (c->root->kind != DSEC_CFG_MAP) {
        dsec_err_set(err, DSEC_E_CONFIG, 0, "%s:%d: the top level must be a map of settings", name,
                     c->root->line);
        goto out_parser;
    }
    if (next_event(&ps, &ev) < 0)
        goto out_parser;
    yaml_event_delete(&ev);
    if (next_event(&ps, &ev) < 0)
        goto out_parser;
    bool more = ev.type == YAML_DOCUMENT_START_EVENT;
    int line = (int)ev.start_mark.line + 1;
    yaml_event_delete(&ev);
    if (more) {
        dsec_err_set(err, DSEC_E_CONFIG, 0, "%s:%d: only one YAML document is allowed", name, line);
        goto out_parser;
    }
    rc = 0;
out_parser:
    yaml_parser_delete(&ps.p);
    if (rc < 0)
        dsec_cfg_free(c);
    else
        *out = c;
    return rc;
}

int dsec_cfg_load(dsec_cfg **out, const char *path, dsec_err *err)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (f == NULL)
        return dsec_err_set(err, DSEC_E_CONFIG, errno, "opening config %s", path);
    char *buf = dsec_malloc(MAX_CONFIG_BYTES + 1);
    if (buf == NULL) {
        fclose(f);
        return dsec_err_set(err, DSEC_E_NOMEM, 0, "out of memory");
    }
    size_t n = fread(buf, 1, MAX_CONFIG_BYTES + 1, f);
    int rerr = ferror(f) ? errno : 0;
    fclose(f);
    int rc;
    if (rerr != 0)
        rc = dsec_err_set(err, DSEC_E_CONFIG, rerr, "reading config %s", path);
    else if (n > MAX_CONFIG_BYTES)
        rc =
            dsec_err_set(err, DSEC_E_CONFIG, 0, "%s: larger than %u bytes", path, MAX_CONFIG_BYTES);
    else
        rc = dsec_cfg_parse(out, path, buf, n, err);
    dsec_free(buf);
    return rc;
}

const dsec_cfg_node *dsec_cfg_root(const dsec_cfg *c)
{
    return c->root;
}
const char *dsec_cfg_name(const dsec_cfg *c)
{
    return c->name;
}

const dsec_cfg_node *dsec_cfg_get(const dsec_cfg_node *map, const char *key)
{
    if (map == NULL || map->kind != DSEC_CFG_MAP)
        return NULL;
    for (size_t i = 0; i < map->n; i++)
        if (strcmp(map->kids[i]->key, key) == 0)
            return map->kids[i];
    return NULL;
}

int dsec_cfg_check_keys(const dsec_cfg *c, const dsec_cfg_node *map, const char *const *allowed,
                        dsec_err *err)
{
    if (map == NULL)
        return 0;
    for (size_t i = 0; i < map->n; i++) {
        bool ok = false;
        for (const char *const *a = allowed; *a != NULL && !ok; a++)
            ok = strcmp(*a, map->kids[i]->key) == 0;
        if (!ok) {
            char list[DSEC_ERR_MSG_MAX / 2] = "";
            size_t used = 0;
            for (const char *const *a = allowed; *a != NULL; a++) {
                int w =
                    snprintf(list + used, sizeof list - used, "%s%s", a == allowed ? "" : ", ", *a);
                if (w < 0 || (size_t)w >= sizeof list - used)
                    break;
                used += (size_t)w;
            }
            return dsec_err_set(err, DSEC_E_CONFIG, 0, "%s:%d: unknown key \"%s\" (known: %s)",
                                c->name, map->kids[i]->line, map->kids[i]->key, list);
        }
    }
    return 0;
}

int dsec_cfg_expect(const dsec_cfg *c, const dsec_cfg_node *node, dsec_cfg_kind kind, dsec_err *err)
{
    static const char *const names[] = {"", "a scalar", "a map", "a list"};
    if (node == NULL || node->kind == kind)
        return 0;
    return dsec_err_set(err, DSEC_E_CONFIG, 0, "%s:%d: key \"%s\": expected %s, got %s", c->name,
                        node->line, node->key ? node->key : "(item)", names[kind],
                        names[node->kind]);
}

/* The scalar under key: 1 with *out set, 0 when the key is absent, or an
 * error when it holds a map or a list. */
static int scalar_at(const dsec_cfg *c, const dsec_cfg_node *map, const char *key,
                     const dsec_cfg_node **out, dsec_err *err)
{
    *out = dsec_cfg_get(map, key);
    if (*out == NULL)
        return 0;
    if ((*out)->kind != DSEC_CFG_SCALAR)
        return dsec_cfg_expect(c, *out, DSEC_CFG_SCALAR, err);
    return 1;
}

static int bad_value(const dsec_cfg *c, const dsec_cfg_node *n, const char *key, const char *want,
                     dsec_err *err)
{
    return dsec_err_set(err, DSEC_E_CONFIG, 0, "%s:%d: key \"%s\": expected %s, got \"%s\"",
                        c->name, n->line, key, want, n->value);
}

static bool parse_u64(const char *s, unsigned long long *v)
{
    char *end = NULL;
    errno = 0;
    *v = strtoull(s, &end, 10);
    return s[0] != '\0' && s[0] != '-' && *end == '\0' && errno == 0;
}

static bool parse_double(const char *s, double *v)
{
    char *end = NULL;
    errno = 0;
    *v = strtod(s, &end);
    return s[0] != '\0' && *end == '\0' && errno == 0 && isfinite(*v);
}

int dsec_cfg_str(const dsec_cfg *c, const dsec_cfg_node *map, const char *key, const char *def,
                 const char **out, dsec_err *err)
{
    const dsec_cfg_node *n;
    int rc = scalar_at(c, map, key, &n, err);
    if (rc < 0)
        return rc;
    *out = rc > 0 ? n->value : def;
    return 0;
}

int dsec_cfg_u64(const dsec_cfg *c, const dsec_cfg_node *map, const char *key, uint64_t def,
                 uint64_t min, uint64_t max, uint64_t *out, dsec_err *err)
{
    const dsec_cfg_node *n;
    int rc = scalar_at(c, map, key, &n, err);
    if (rc <= 0)
        return rc == 0 ? (*out = def, 0) : rc;
    unsigned long long v;
    if (!parse_u64(n->value, &v))
        return bad_value(c, n, key, "a non-negative integer", err);
    if (v < min || v > max)
        return dsec_err_set(err, DSEC_E_CONFIG, 0,
                            "%s:%d: key \"%s\": %llu is out of range [%" PRIu64 ", %" PRIu64 "]",
                            c->name, n->line, key, v, min, max);
    *out = v;
    return 0;
}

int dsec_cfg_double(const dsec_cfg *c, const dsec_cfg_node *map, const char *key, double def,
                    double min, double max, double *out, dsec_err *err)
{
    const dsec_cfg_node *n;
    int rc = scalar_at(c, map, key, &n, err);
    if (rc <= 0)
        return rc == 0 ? (*out = def, 0) : rc;
    double v;
    if (!parse_double(n->value, &v))
        return bad_value(c, n, key, "a number", err);
    if (v < min || v > max)
        return dsec_err_set(err, DSEC_E_CONFIG, 0, "%s:%d: key \"%s\": %g is out of range [%g, %g]",
                            c->name, n->line, key, v, min, max);
    *out = v;
    return 0;
}

int dsec_cfg_bool(const dsec_cfg *c, const dsec_cfg_node *map, const char *key, bool def, bool *out,
                  dsec_err *err)
{
    const dsec_cfg_node *n;
    int rc = scalar_at(c, map, key, &n, err);
    if (rc <= 0)
        return rc == 0 ? (*out = def, 0) : rc;
    const char *v = n->value;
    if (strcmp(v, "true") == 0 || strcmp(v, "yes") == 0 || strcmp(v, "on") == 0)
        *out = true;
    else if (strcmp(v, "false") == 0 || strcmp(v, "no") == 0 || strcmp(v, "off") == 0)
        *out = false;
    else
        return bad_value(c, n, key, "true or false", err);
    return 0;
}
