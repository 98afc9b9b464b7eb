/* registry.c - built-in capability records, requirement parsing, and the lightest-type pick. */
#include "backends/registry.h"
#include "backends/container/container.h"
#include "backends/function/function.h"
#include "backends/sim.h"
#include "backends/vm/vm.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dsec/alloc.h"

/* Each built-in type: its capabilities and the ops that implement them (dsec_registry_add
 * checks that every capability a type declares has its ops). Costs are relative weights: what
 * a sandbox of that type costs a node in start-up time and memory, so the cheapest sufficient
 * isolation wins. sim claims no isolation and the highest cost: it is only chosen by name (or
 * when it is all a cell offers), so a cell that mixes sim with real types never hands a
 * trainer a sandbox that does nothing. */
static const struct builtin {
    dsec_backend_caps caps;
    const dsec_backend_ops *ops;
} builtin[] = {
    /* network: a policy gives a function sandbox a network of the node's
     * containment, which its calls join (docs/function-calls.md) */
    {.caps = {.type = "function", .isolation = 1, .cost = 1, .network = true, .startup_ms = 2},
     .ops = &dsec_function_ops},
    {.caps = {.type = "container",
              .persistence = true,
              .isolation = 2,
              .cost = 2,
              .supports_fork = true,
              .supports_snapshot = true,
              .supports_pause = true,
              .network = true,
              .startup_ms = 40},
     .ops = &dsec_container_ops},
    {.caps = {.type = "microvm",
              .own_kernel = true,
              .nested_containers = true,
              .persistence = true,
              .isolation = 3,
              .cost = 4,
              .supports_fork = true,
              .supports_snapshot = true,
              .supports_pause = true,
              .network = true,
              .startup_ms = 150},
     .ops = &dsec_microvm_ops},
    {.caps = {.type = "vm",
              .own_kernel = true,
              .nested_containers = true,
              .gui = true,
              .persistence = true,
              .isolation = 4,
              .cost = 8,
              .supports_fork = true,
              .supports_snapshot = true,
              .supports_pause = true,
              .network = true,
              .startup_ms = 3000},
     .ops = &dsec_vm_ops},
    {.caps = {.type = "sim",
              .isolation = 0,
              .cost = 100,
              .supports_fork = true,
              .supports_snapshot = true,
              .supports_pause = true,
              .network = true,
              .startup_ms = 0},
     .ops = &dsec_sim_ops},
};
#define NBUILTIN (sizeof builtin / sizeof builtin[0])

#define ISOLATION_MAX 4

const dsec_backend_caps *dsec_backend_caps_builtin(const char *type)
{
    if (type == NULL)
        return NULL;
    for (size_t i = 0; i < NBUILTIN; i++)
        if (strcmp(builtin[i].caps.type, type) == 0)
            return &builtin[i].caps;
    return NULL;
}

/* ---- requirements ------------------------------------------------------------ */

static const char known_caps[] =
    "own_kernel, nested_containers, gui, persistence, fork, snapshot, pause, network, "
    "isolation:N";

int dsec_requires_parse(const char *const *req, size_t n, dsec_requires *out, dsec_err *err)
{
    dsec_requires r = {0};
    for (size_t i = 0; i < n; i++) {
        const char *s = req[i];
        if (s == NULL || s[0] == '\0')
            return dsec_err_set(err, DSEC_E_INVALID, 0, "empty capability in requires[%zu]", i);
        if (strcmp(s, "own_kernel") == 0)
            r.own_kernel = true;
        else if (strcmp(s, "nested_containers") == 0)
            r.nested_containers = true;
        else if (strcmp(s, "gui") == 0)
            r.gui = true;
        else if (strcmp(s, "persistence") == 0)
            r.persistence = true;
        else if (strcmp(s, "fork") == 0)
            r.fork = true;
        else if (strcmp(s, "snapshot") == 0)
            r.snapshot = true;
        else if (strcmp(s, "pause") == 0)
            r.pause = true;
        else if (strcmp(s, "network") == 0)
            r.network = true;
        else if (strncmp(s, "isolation:", 10) == 0) {
            const char *num = s + 10;
            char *end = NULL;
            errno = 0;
            long lvl = strtol(num, &end, 10);
            if (num[0] < '0' || num[0] > '9' || *end != '\0' || errno != 0 || lvl < 0 ||
                lvl > ISOLATION_MAX)
                return dsec_err_set(err, DSEC_E_INVALID, 0,
                                    "bad requirement \"%s\": the isolation level must be 0..%d "
                                    "(1 function, 2 container, 3 microvm, 4 vm)",
                                    s, ISOLATION_MAX);
            if (lvl > r.min_isolation)
                r.min_isolation = (int)lvl;
        } else {
            return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                                "unknown capability \"%s\" in requires (known: %s)", s, known_caps);
        }
    }
    *out = r;
    return 0;
}

bool dsec_caps_satisfy(const dsec_backend_caps *c, const dsec_requires *r, char *lacking,
                       size_t lacking_len)
{
    const char *miss = NULL;
    if (r->own_kernel && !c->own_kernel)
        miss = "own_kernel";
    else if (r->nested_containers && !c->nested_containers)
        miss = "nested_containers";
    else if (r->gui && !c->gui)
        miss = "gui";
    else if (r->persistence && !c->persistence)
        miss = "persistence";
    else if (r->fork && !c->supports_fork)
        miss = "fork";
    else if (r->snapshot && !c->supports_snapshot)
        miss = "snapshot";
    else if (r->pause && !c->supports_pause)
        miss = "pause";
    else if (r->network && !c->network)
        miss = "network";
    else if (c->isolation < r->min_isolation) {
        if (lacking != NULL && lacking_len > 0)
            snprintf(lacking, lacking_len, "isolation:%d", r->min_isolation);
        return false;
    }
    if (miss == NULL)
        return true;
    if (lacking != NULL && lacking_len > 0)
        snprintf(lacking, lacking_len, "%s", miss);
    return false;
}

/* Append s to buf (NUL-terminated, capacity len), with ", " between items. */
static void append_item(char *buf, size_t len, const char *s)
{
    size_t used = strnlen(buf, len);
    if (used + 1 >= len)
        return;
    snprintf(buf + used, len - used, "%s%s", used > 0 ? ", " : "", s);
}

void dsec_requires_format(const dsec_requires *r, char *buf, size_t len)
{
    if (len == 0)
        return;
    buf[0] = '\0';
    if (r->own_kernel)
        append_item(buf, len, "own_kernel");
    if (r->nested_containers)
        append_item(buf, len, "nested_containers");
    if (r->gui)
        append_item(buf, len, "gui");
    if (r->persistence)
        append_item(buf, len, "persistence");
    if (r->fork)
        append_item(buf, len, "fork");
    if (r->snapshot)
        append_item(buf, len, "snapshot");
    if (r->pause)
        append_item(buf, len, "pause");
    if (r->network)
        append_item(buf, len, "network");
    if (r->min_isolation > 0) {
        char iso[24];
        snprintf(iso, sizeof iso, "isolation:%d", r->min_isolation);
        append_item(buf, len, iso);
    }
    if (buf[0] == '\0')
        snprintf(buf, len, "nothing");
}

/* ---- the registry ------------------------------------------------------------ */

struct dsec_registry {
    size_t n;
    dsec_backend_caps caps[DSEC_REGISTRY_MAX]; /* type strings owned (dsec_strdup) */
    const dsec_backend_ops *ops[DSEC_REGISTRY_MAX];
};

int dsec_registry_new(dsec_registry **out, dsec_err *err)
{
    dsec_registry *reg = dsec_calloc(1, sizeof *reg);
    if (reg == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "allocating the backend registry");
    *out = reg;
    return 0;
}

int dsec_registry_new_builtin(dsec_registry **out, dsec_err *err)
{
    dsec_registry *reg = NULL;
    if (dsec_registry_new(&reg, err) < 0)
        return -1;
    for (size_t i = 0; i < NBUILTIN; i++)
        if (dsec_registry_add(reg, &builtin[i].caps, builtin[i].ops, err) < 0)
            goto out_free;
    *out = reg;
    return 0;

out_free:
    dsec_registry_free(reg);
    return -1;
}

void dsec_registry_free(dsec_registry *reg)
{
    if (reg == NULL)
        return;
    for (size_t i = 0; i < reg->n; i++)
        dsec_free((char *)reg->caps[i].type);
    dsec_free(reg);
}

int dsec_registry_add(dsec_registry *reg, const dsec_backend_caps *caps,
                      const dsec_backend_ops *ops, dsec_err *err)
{
    if (caps == NULL || caps->type == NULL || caps->type[0] == '\0')
        return dsec_err_set(err, DSEC_E_INVALID, 0, "registering a backend type without a name");
    if (caps->isolation < 0 || caps->isolation > ISOLATION_MAX)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "backend type \"%s\": isolation %d is outside 0..%d", caps->type,
                            caps->isolation, ISOLATION_MAX);
    /* what the type declares, its ops must do (without ops: a type only placed, never run) */
    const char *missing = NULL;
    if (ops != NULL && ops->type != NULL && strcmp(ops->type, caps->type) != 0)
        return dsec_err_set(err, DSEC_E_INVALID, 0, "backend type \"%s\": its ops implement \"%s\"",
                            caps->type, ops->type);
    if (ops == NULL)
        missing = NULL;
    else if (ops->create == NULL || ops->destroy == NULL)
        missing = "create and destroy";
    else if (caps->supports_fork && ops->fork == NULL)
        missing = "fork";
    else if (caps->supports_snapshot && (ops->snapshot == NULL || ops->restore == NULL))
        missing = "snapshot and restore";
    else if (caps->supports_pause && (ops->pause == NULL || ops->resume == NULL))
        missing = "pause and resume";
    if (missing != NULL)
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "backend type \"%s\" declares what its ops cannot do: they lack %s",
                            caps->type, missing);
    if (dsec_registry_find(reg, caps->type) >= 0)
        return dsec_err_set(err, DSEC_E_EXISTS, 0, "backend type \"%s\" is already registered",
                            caps->type);
    if (reg->n >= DSEC_REGISTRY_MAX)
        return dsec_err_set(err, DSEC_E_CAPACITY, 0,
                            "cannot register \"%s\": the registry holds at most %d types",
                            caps->type, DSEC_REGISTRY_MAX);
    char *name = dsec_strdup(caps->type);
    if (name == NULL)
        return dsec_err_set(err, DSEC_E_NOMEM, ENOMEM, "registering \"%s\"", caps->type);
    reg->caps[reg->n] = *caps;
    reg->caps[reg->n].type = name;
    reg->ops[reg->n] = ops;
    return (int)reg->n++;
}

size_t dsec_registry_count(const dsec_registry *reg)
{
    return reg->n;
}

int dsec_registry_find(const dsec_registry *reg, const char *type)
{
    if (type == NULL)
        return -1;
    for (size_t i = 0; i < reg->n; i++)
        if (strcmp(reg->caps[i].type, type) == 0)
            return (int)i;
    return -1;
}

const dsec_backend_caps *dsec_registry_caps(const dsec_registry *reg, int idx)
{
    if (idx < 0 || (size_t)idx >= reg->n)
        return NULL;
    return &reg->caps[idx];
}

const dsec_backend_ops *dsec_registry_ops(const dsec_registry *reg, int idx)
{
    if (idx < 0 || (size_t)idx >= reg->n)
        return NULL;
    return reg->ops[idx];
}

dsec_type_mask dsec_registry_all(const dsec_registry *reg)
{
    return reg->n >= 32 ? UINT32_MAX : ((dsec_type_mask)1 << reg->n) - 1;
}

int dsec_registry_mask(const dsec_registry *reg, const char *const *types, size_t n,
                       bool ignore_unknown, dsec_type_mask *out, dsec_err *err)
{
    dsec_type_mask m = 0;
    for (size_t i = 0; i < n; i++) {
        int idx = dsec_registry_find(reg, types[i]);
        if (idx >= 0) {
            m |= (dsec_type_mask)1 << idx;
            continue;
        }
        if (ignore_unknown)
            continue;
        char known[256];
        dsec_registry_mask_format(reg, dsec_registry_all(reg), known, sizeof known);
        return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0, "unknown sandbox type \"%s\" (known: %s)",
                            types[i] ? types[i] : "(null)", known);
    }
    *out = m;
    return 0;
}

void dsec_registry_mask_format(const dsec_registry *reg, dsec_type_mask mask, char *buf, size_t len)
{
    if (len == 0)
        return;
    buf[0] = '\0';
    for (size_t i = 0; i < reg->n; i++)
        if (mask & ((dsec_type_mask)1 << i))
            append_item(buf, len, reg->caps[i].type);
    if (buf[0] == '\0')
        snprintf(buf, len, "none");
}

/* The mask of types whose caps satisfy r. */
static dsec_type_mask satisfying(const dsec_registry *reg, const dsec_requires *r)
{
    dsec_type_mask m = 0;
    for (size_t i = 0; i < reg->n; i++)
        if (dsec_caps_satisfy(&reg->caps[i], r, NULL, 0))
            m |= (dsec_type_mask)1 << i;
    return m;
}

int dsec_registry_pick_parsed(const dsec_registry *reg, const char *type, const dsec_requires *r,
                              dsec_type_mask offered, dsec_err *err)
{
    char wanted[160], offered_s[256], others[256];
    dsec_type_mask ok = satisfying(reg, r);

    if (type != NULL && type[0] != '\0') {
        int idx = dsec_registry_find(reg, type);
        if (idx < 0) {
            char known[256];
            dsec_registry_mask_format(reg, dsec_registry_all(reg), known, sizeof known);
            return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                                "unknown sandbox type \"%s\" (known: %s)", type, known);
        }
        char lacking[32];
        if (!dsec_caps_satisfy(&reg->caps[idx], r, lacking, sizeof lacking)) {
            dsec_registry_mask_format(reg, ok, others, sizeof others);
            if (r->min_isolation > reg->caps[idx].isolation && strncmp(lacking, "iso", 3) == 0)
                return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                                    "sandbox type \"%s\" has isolation %d but the request "
                                    "requires %s (types that satisfy every requirement: %s)",
                                    type, reg->caps[idx].isolation, lacking, others);
            return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                                "sandbox type \"%s\" lacks %s, which the request requires "
                                "(types that satisfy every requirement: %s)",
                                type, lacking, others);
        }
        if (!(offered & ((dsec_type_mask)1 << idx))) {
            dsec_registry_mask_format(reg, offered, offered_s, sizeof offered_s);
            return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                                "sandbox type \"%s\" is not offered here (offered: %s)", type,
                                offered_s);
        }
        return idx;
    }

    int best = -1;
    for (size_t i = 0; i < reg->n; i++) {
        if (!(ok & offered & ((dsec_type_mask)1 << i)))
            continue;
        if (best < 0 || reg->caps[i].cost < reg->caps[best].cost)
            best = (int)i;
    }
    if (best >= 0)
        return best;

    dsec_requires_format(r, wanted, sizeof wanted);
    dsec_registry_mask_format(reg, offered, offered_s, sizeof offered_s);
    if (ok == 0)
        return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                            "no sandbox type satisfies the requirements %s (offered: %s)", wanted,
                            offered_s);
    dsec_registry_mask_format(reg, ok, others, sizeof others);
    return dsec_err_set(err, DSEC_E_UNSUPPORTED, 0,
                        "no sandbox type offered here satisfies %s (offered: %s; %s would, but "
                        "is not offered)",
                        wanted, offered_s, others);
}

int dsec_registry_pick(const dsec_registry *reg, const char *type, const char *const *req,
                       size_t nreq, dsec_type_mask offered, dsec_err *err)
{
    dsec_requires r;
    if (dsec_requires_parse(req, nreq, &r, err) < 0)
        return -1;
    return dsec_registry_pick_parsed(reg, type, &r, offered, err);
}
