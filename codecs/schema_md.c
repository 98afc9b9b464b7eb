/* schema_md.c - the field tables of docs/protocol.md, generated from the schemas. */
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "codecs/codec.h"
#include "codecs/msg.h"

static const char *kind_text(const dsec_field *f, char *tmp, size_t n)
{
    switch (f->kind) {
    case DSEC_F_STR:
        return "str";
    case DSEC_F_BIN:
        return "bin";
    case DSEC_F_U64:
        return "uint";
    case DSEC_F_I64:
        return "int";
    case DSEC_F_BOOL:
        return "bool";
    case DSEC_F_STRV:
        return "array of str";
    case DSEC_F_KV:
        return "map str → str";
    case DSEC_F_LIST:
        snprintf(tmp, n, "array of `%s`", dsec_msg_type_name(f->sub_type));
        return tmp;
    }
    return "?";
}

static void size_text(char *out, size_t n, uint32_t bytes)
{
    if (bytes >= (1u << 20) && bytes % (1u << 20) == 0)
        snprintf(out, n, "%u MiB", bytes >> 20);
    else if (bytes >= (64u << 10) && bytes % 1024 == 0)
        snprintf(out, n, "%u KiB", bytes >> 10);
    else
        snprintf(out, n, "%u bytes", bytes);
}

static void limit_text(const dsec_field *f, const dsec_codec_limits *lim, char *out, size_t n)
{
    char sz[32];
    uint32_t max = dsec__field_limit(f, lim);
    const char *at_least = f->required ? "1.." : "≤ ";
    switch (f->kind) {
    case DSEC_F_STR:
    case DSEC_F_BIN:
        size_text(sz, sizeof sz, max);
        snprintf(out, n, "%s%s", f->required ? "non-empty, ≤ " : "≤ ", sz);
        return;
    case DSEC_F_U64:
    case DSEC_F_I64:
        if (dsec__field_ranged(f))
            snprintf(out, n, "%lld..%lld", (long long)f->min, (long long)f->max);
        else
            snprintf(out, n, "any");
        return;
    case DSEC_F_BOOL:
        snprintf(out, n, "—");
        return;
    case DSEC_F_STRV:
        size_text(sz, sizeof sz, dsec__item_limit(f, lim));
        snprintf(out, n, "%s%u items, each ≤ %s", at_least, max, sz);
        return;
    case DSEC_F_KV:
        size_text(sz, sizeof sz, dsec__item_limit(f, lim));
        snprintf(out, n, "%s%u entries; keys, values ≤ %s", at_least, max, sz);
        return;
    case DSEC_F_LIST:
        snprintf(out, n, "%s%u items", at_least, max);
        return;
    }
    snprintf(out, n, "?");
}

static int table(dsec_buf *b, const dsec_schema *s, const dsec_codec_limits *lim, dsec_err *err)
{
    if (dsec__buf_printf(b, err, "#### `%s`\n\n", s->name) < 0 ||
        dsec__buf_printf(b, err, "| field | type | required | limits | meaning |\n") < 0 ||
        dsec__buf_printf(b, err, "|---|---|---|---|---|\n") < 0)
        return -1;
    for (size_t i = 0; i < s->nfields; i++) {
        const dsec_field *f = &s->fields[i];
        char kind[64], limits[96];
        limit_text(f, lim, limits, sizeof limits);
        if (dsec__buf_printf(b, err, "| `%s` | %s | %s | %s | %s |\n", f->name,
                             kind_text(f, kind, sizeof kind), f->required ? "yes" : "no", limits,
                             f->doc != NULL ? f->doc : "") < 0)
            return -1;
    }
    return dsec__buf_printf(b, err, "\n");
}

int dsec_schema_markdown(dsec_buf *b, dsec_err *err)
{
    dsec_codec_limits lim;
    dsec_codec_limits_default(&lim);
    for (int t = DSEC_MSG_NONE + 1; t < DSEC_MSG_TYPE_MAX_; t++)
        if (table(b, dsec_schema_of(t), &lim, err) < 0)
            return -1;
    return 0;
}
