/* test_backends.c - the typed backend registry and the sim backend. */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "backends/backend.h"
#include "backends/container/container.h"
#include "backends/function/function.h"
#include "backends/registry.h"
#include "backends/sim.h"
#include "backends/vm/vm.h"
#include "dsec/alloc.h"
#include "dsec/err.h"

#if defined(__SANITIZE_ADDRESS__)
/* From the sanitizer runtime (sanitizer/allocator_interface.h, not shipped by gcc 12). */
size_t __sanitizer_get_current_allocated_bytes(void);
#elif defined(DSEC_WITH_JEMALLOC)
#include <jemalloc/jemalloc.h>
#else
#include <malloc.h>
#endif

#define N_(a) (sizeof(a) / sizeof((a)[0]))

/* ======================================================================== registry */

static dsec_registry *builtin(void)
{
    dsec_registry *reg = NULL;
    dsec_err e;
    assert_int_equal(dsec_registry_new_builtin(&reg, &e), 0);
    return reg;
}

static dsec_type_mask mask_of(const dsec_registry *reg, const char *const *names, size_t n)
{
    dsec_type_mask m = 0;
    dsec_err e;
    assert_int_equal(dsec_registry_mask(reg, names, n, false, &m, &e), 0);
    return m;
}

static const char *pick_name(const dsec_registry *reg, const char *type, const char *const *req,
                             size_t n, dsec_type_mask offered)
{
    dsec_err e;
    dsec_err_clear(&e);
    int idx = dsec_registry_pick(reg, type, req, n, offered, &e);
    if (idx < 0) {
        print_message("pick failed: %s\n", e.msg);
        return NULL;
    }
    return dsec_registry_caps(reg, idx)->type;
}

static void registry_builtins_are_ordered(void **state)
{
    dsec_registry *reg = builtin();
    static const char *const order[] = {"function", "container", "microvm", "vm"};
    assert_int_equal(dsec_registry_count(reg), 5);
    for (size_t i = 0; i < N_(order); i++) {
        int idx = dsec_registry_find(reg, order[i]);
        assert_int_equal(idx, (int)i);
        const dsec_backend_caps *c = dsec_registry_caps(reg, idx);
        assert_string_equal(c->type, order[i]);
        assert_int_equal(c->isolation, (int)i + 1);
        assert_ptr_equal(c, dsec_registry_caps(reg, idx));
        if (i > 0)
            assert_true(c->cost > dsec_registry_caps(reg, (int)i - 1)->cost);
        static const dsec_backend_ops *const ops[] = {&dsec_function_ops, &dsec_container_ops,
                                                      &dsec_microvm_ops, &dsec_vm_ops};
        assert_ptr_equal(dsec_registry_ops(reg, idx), ops[i]);
    }
    int sim = dsec_registry_find(reg, "sim");
    assert_int_equal(sim, 4);
    assert_ptr_equal(dsec_registry_ops(reg, sim), &dsec_sim_ops);
    assert_int_equal(dsec_registry_find(reg, "nope"), -1);
    assert_null(dsec_registry_caps(reg, 99));
    assert_null(dsec_backend_caps_builtin("nope"));
    assert_int_equal(dsec_backend_caps_builtin("vm")->isolation, 4);
    dsec_registry_free(reg);
}

static void registry_picks_lightest(void **state)
{
    dsec_registry *reg = builtin();
    dsec_type_mask all = dsec_registry_all(reg);
    static const struct {
        const char *req[3];
        size_t n;
        const char *want;
    } cases[] = {
        {{0}, 0, "function"},
        {{"isolation:1"}, 1, "function"},
        {{"persistence"}, 1, "container"},
        {{"isolation:2"}, 1, "container"},
        {{"fork"}, 1, "container"},
        {{"pause", "snapshot"}, 2, "container"},
        {{"own_kernel"}, 1, "microvm"},
        {{"nested_containers"}, 1, "microvm"},
        {{"isolation:3"}, 1, "microvm"},
        {{"own_kernel", "persistence", "fork"}, 3, "microvm"},
        {{"gui"}, 1, "vm"},
        {{"isolation:4"}, 1, "vm"},
        {{"own_kernel", "gui"}, 2, "vm"},
        {{"nested_containers", "isolation:4"}, 2, "vm"},
        {{"isolation:2", "isolation:3"}, 2, "microvm"}, /* the strictest level counts */
    };
    for (size_t i = 0; i < N_(cases); i++) {
        const char *got = pick_name(reg, NULL, cases[i].req, cases[i].n, all);
        assert_non_null(got);
        assert_string_equal(got, cases[i].want);
        /* "" means "choose for me", like NULL. */
        assert_string_equal(pick_name(reg, "", cases[i].req, cases[i].n, all), cases[i].want);
    }
    /* A narrower offer moves the choice to the next lightest. */
    static const char *const cv[] = {"container", "vm"};
    static const char *const ok[] = {"own_kernel"};
    assert_string_equal(pick_name(reg, NULL, ok, 1, mask_of(reg, cv, 2)), "vm");
    assert_string_equal(pick_name(reg, NULL, NULL, 0, mask_of(reg, cv, 2)), "container");
    /* sim claims nothing and costs most: chosen only when it is all there is. */
    static const char *const fs[] = {"function", "sim"}, *const so[] = {"sim"};
    assert_string_equal(pick_name(reg, NULL, NULL, 0, mask_of(reg, fs, 2)), "function");
    assert_string_equal(pick_name(reg, NULL, NULL, 0, mask_of(reg, so, 1)), "sim");
    dsec_registry_free(reg);
}

/* For every combination of requirements and every subset of offered types,
 * the pick satisfies all requirements and nothing cheaper offered would. */
static void registry_pick_is_minimal_everywhere(void **state)
{
    dsec_registry *reg = builtin();
    static const char *const flags[] = {"own_kernel", "nested_containers", "gui", "persistence",
                                        "fork"};
    size_t picked = 0, refused = 0;
    for (unsigned fm = 0; fm < (1u << N_(flags)); fm++)
        for (int iso = 0; iso <= 4; iso++)
            for (dsec_type_mask off = 1; off < (1u << 5); off++) {
                const char *req[8];
                char isos[16];
                size_t n = 0;
                for (size_t f = 0; f < N_(flags); f++)
                    if (fm & (1u << f))
                        req[n++] = flags[f];
                snprintf(isos, sizeof isos, "isolation:%d", iso);
                req[n++] = isos;
                dsec_requires r;
                dsec_err e;
                assert_int_equal(dsec_requires_parse(req, n, &r, &e), 0);
                int idx = dsec_registry_pick(reg, NULL, req, n, off, &e);
                bool any = false;
                for (int t = 0; t < 5; t++)
                    if ((off & (1u << t)) &&
                        dsec_caps_satisfy(dsec_registry_caps(reg, t), &r, NULL, 0))
                        any = true;
                if (!any) {
                    assert_int_equal(idx, -1);
                    assert_int_equal(e.code, DSEC_E_UNSUPPORTED);
                    refused++;
                    continue;
                }
                assert_true(idx >= 0);
                assert_true(off & (1u << idx));
                const dsec_backend_caps *c = dsec_registry_caps(reg, idx);
                assert_true(dsec_caps_satisfy(c, &r, NULL, 0));
                for (int t = 0; t < 5; t++)
                    if ((off & (1u << t)) &&
                        dsec_caps_satisfy(dsec_registry_caps(reg, t), &r, NULL, 0))
                        assert_true(c->cost <= dsec_registry_caps(reg, t)->cost);
                picked++;
            }
    assert_true(picked > 100 && refused > 100);
    dsec_registry_free(reg);
}

static void registry_named_type(void **state)
{
    dsec_registry *reg = builtin();
    dsec_type_mask all = dsec_registry_all(reg);
    dsec_err e;
    /* network access (what a create with a network policy implies): a function call can have it */
    static const char *const net[] = {"network"};
    int fnx = dsec_registry_find(reg, "function");
    assert_int_equal(dsec_registry_pick(reg, NULL, net, 1, all, &e), fnx);
    assert_int_equal(dsec_registry_pick(reg, "function", net, 1, all, &e), fnx);
    static const char *const ok[] = {"own_kernel"};
    assert_int_equal(dsec_registry_pick(reg, "container", ok, 1, all, &e), -1);
    assert_int_equal(e.code, DSEC_E_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "\"container\" lacks own_kernel"));
    assert_non_null(strstr(e.msg, "microvm, vm")); /* what would do */

    static const char *const iso[] = {"isolation:3"};
    assert_int_equal(dsec_registry_pick(reg, "function", iso, 1, all, &e), -1);
    assert_non_null(strstr(e.msg, "isolation 1"));
    assert_non_null(strstr(e.msg, "isolation:3"));

    /* Satisfied: the named type even though a lighter one would do. */
    static const char *const per[] = {"persistence"};
    assert_int_equal(dsec_registry_pick(reg, "vm", per, 1, all, &e), 3);

    /* Named but not offered here. */
    static const char *const fc[] = {"function", "container"};
    assert_int_equal(dsec_registry_pick(reg, "vm", NULL, 0, mask_of(reg, fc, 2), &e), -1);
    assert_int_equal(e.code, DSEC_E_UNSUPPORTED);
    assert_string_equal(e.msg,
                        "sandbox type \"vm\" is not offered here (offered: function, container)");
    dsec_registry_free(reg);
}

static void registry_unknowns(void **state)
{
    dsec_registry *reg = builtin();
    dsec_type_mask all = dsec_registry_all(reg);
    dsec_err e;
    assert_int_equal(dsec_registry_pick(reg, "x", NULL, 0, all, &e), -1);
    assert_int_equal(e.code, DSEC_E_UNSUPPORTED);
    assert_string_equal(
        e.msg, "unknown sandbox type \"x\" (known: function, container, microvm, vm, sim)");

    static const char *const tp[] = {"gui", "teleport"};
    assert_int_equal(dsec_registry_pick(reg, NULL, tp, 2, all, &e), -1);
    assert_int_equal(e.code, DSEC_E_UNSUPPORTED);
    assert_non_null(strstr(e.msg, "unknown capability \"teleport\""));

    static const char *const bad[][1] = {
        {"isolation:x"}, {"isolation:9"}, {"isolation:"}, {"isolation:-1"}};
    for (size_t i = 0; i < N_(bad); i++) {
        assert_int_equal(dsec_registry_pick(reg, NULL, bad[i], 1, all, &e), -1);
        assert_int_equal(e.code, DSEC_E_INVALID);
        assert_non_null(strstr(e.msg, bad[i][0]));
    }

    const char *unk[] = {"container", "warp"};
    dsec_type_mask m = 0;
    assert_int_equal(dsec_registry_mask(reg, unk, 2, false, &m, &e), -1);
    assert_non_null(strstr(e.msg, "\"warp\""));
    assert_int_equal(dsec_registry_mask(reg, unk, 2, true, &m, &e), 0);
    assert_int_equal(m, 1u << 1);
    dsec_registry_free(reg);
}

static void registry_nothing_offered(void **state)
{
    dsec_registry *reg = builtin();
    dsec_err e;
    static const char *const fc[] = {"function", "container"};
    static const char *const gui[] = {"gui", "isolation:2"};
    assert_int_equal(dsec_registry_pick(reg, NULL, gui, 2, mask_of(reg, fc, 2), &e), -1);
    assert_int_equal(e.code, DSEC_E_UNSUPPORTED);
    assert_string_equal(e.msg, "no sandbox type offered here satisfies gui, isolation:2 (offered: "
                               "function, container; vm would, but is not offered)");
    assert_int_equal(dsec_registry_pick(reg, NULL, NULL, 0, 0, &e), -1);
    assert_non_null(strstr(e.msg, "offered: none"));
    /* Nothing known satisfies at all. */
    static const char *const fsim[] = {"gui", "fork", "isolation:4"};
    dsec_registry *small = NULL;
    assert_int_equal(dsec_registry_new(&small, &e), 0);
    assert_int_equal(dsec_registry_add(small, dsec_backend_caps_builtin("container"), NULL, &e), 0);
    assert_int_equal(dsec_registry_pick(small, NULL, fsim, 3, 1, &e), -1);
    assert_non_null(strstr(e.msg, "no sandbox type satisfies the requirements gui, fork, "
                                  "isolation:4"));
    dsec_registry_free(small);
    dsec_registry_free(reg);
}

static void registry_add_rules(void **state)
{
    dsec_registry *reg = builtin();
    dsec_err e;
    assert_int_equal(dsec_registry_add(reg, dsec_backend_caps_builtin("vm"), NULL, &e), -1);
    assert_int_equal(e.code, DSEC_E_EXISTS);
    dsec_backend_caps bad = {.type = "odd", .isolation = 7};
    assert_int_equal(dsec_registry_add(reg, &bad, NULL, &e), -1);
    assert_int_equal(e.code, DSEC_E_INVALID);
    /* a type that declares what its ops cannot do, or ops of another type: refused */
    dsec_backend_ops forkless = dsec_sim_ops;
    forkless.type = "forkless";
    forkless.fork = NULL;
    dsec_backend_caps fk = *dsec_backend_caps_builtin("sim");
    fk.type = "forkless";
    assert_int_equal(dsec_registry_add(reg, &fk, &forkless, &e), -1);
    assert_int_equal(e.code, DSEC_E_INVALID);
    assert_non_null(strstr(e.msg, "they lack fork"));
    forkless.fork = dsec_sim_ops.fork;
    forkless.pause = NULL;
    assert_int_equal(dsec_registry_add(reg, &fk, &forkless, &e), -1);
    assert_non_null(strstr(e.msg, "they lack pause and resume"));
    fk.type = "other";
    assert_int_equal(dsec_registry_add(reg, &fk, &dsec_sim_ops, &e), -1);
    assert_non_null(strstr(e.msg, "its ops implement \"sim\""));
    /* A new, cheaper type with container-level isolation wins where it may. */
    char name[16] = "wasm";
    dsec_backend_caps wasm = {.type = name, .isolation = 2, .cost = 0};
    assert_int_equal(dsec_registry_add(reg, &wasm, NULL, &e), 5);
    name[0] = 'X'; /* the registry copied the name */
    static const char *const iso2[] = {"isolation:2"};
    assert_string_equal(pick_name(reg, NULL, iso2, 1, dsec_registry_all(reg)), "wasm");
    static const char *const per[] = {"persistence"};
    assert_string_equal(pick_name(reg, NULL, per, 1, dsec_registry_all(reg)), "container");
    for (int i = 6; i < DSEC_REGISTRY_MAX; i++) {
        snprintf(name, sizeof name, "t%d", i);
        assert_int_equal(dsec_registry_add(reg, &wasm, NULL, &e), i);
    }
    assert_int_equal(dsec_registry_all(reg), UINT32_MAX);
    assert_int_equal(dsec_registry_add(reg, &bad, NULL, &e), -1);
    snprintf(name, sizeof name, "one-too-many");
    assert_int_equal(dsec_registry_add(reg, &wasm, NULL, &e), -1);
    assert_int_equal(e.code, DSEC_E_CAPACITY);
    char buf[64];
    dsec_registry_mask_format(reg, 0x6, buf, sizeof buf);
    assert_string_equal(buf, "container, microvm");
    dsec_registry_free(reg);
}

/* ======================================================================== sim */

static dsec_backend *sim_open(const dsec_backend_kv *opts, size_t n)
{
    dsec_backend_config cfg = {.node = "n1", .opts = opts, .nopts = n};
    dsec_backend *be = NULL;
    dsec_err e;
    dsec_err_clear(&e);
    if (dsec_backend_new(&be, &dsec_sim_ops, &cfg, &e) < 0)
        fail_msg("opening sim: %s", e.msg);
    assert_string_equal(dsec_backend_type(be), "sim");
    return be;
}

static dsec_backend *sim_fast(void)
{
    static const dsec_backend_kv o[] = {{"time_scale", "0"}};
    return sim_open(o, 1);
}

static dsec_sandbox *mk(dsec_backend *be, const char *type, char **state_out)
{
    dsec_sandbox_spec sp = {.id = "n1-0000000000000001",
                            .type = type,
                            .cpu_milli = 1000,
                            .memory_mb = 1024,
                            .disk_mb = 0};
    dsec_sandbox *sb = NULL;
    char *st = NULL;
    dsec_err e;
    if (dsec_backend_create(be, &sp, &sb, &st, &e) < 0)
        fail_msg("create: %s", e.msg);
    assert_non_null(sb);
    assert_non_null(st);
    if (state_out)
        *state_out = st;
    else
        dsec_free(st);
    return sb;
}

static void kill_sb(dsec_backend *be, dsec_sandbox *sb)
{
    dsec_err e;
    assert_int_equal(dsec_backend_destroy(be, sb, &e), 0);
}

/* Run argv (NULL-terminated) and return the result; the caller releases it. */
static int run(dsec_backend *be, dsec_sandbox *sb, dsec_exec_result *r, const char *in,
               size_t outmax, uint64_t timeout_ms, dsec_err *e, ...)
{
    const char *argv[16];
    size_t argc = 0;
    va_list ap;
    va_start(ap, e);
    for (const char *a; (a = va_arg(ap, const char *)) != NULL && argc < 16;)
        argv[argc++] = a;
    va_end(ap);
    dsec_exec_req req = {
        .argv = argv, .argc = argc, .output_max = outmax, .timeout_ms = timeout_ms};
    if (in != NULL) {
        req.stdin_data = (const uint8_t *)in;
        req.stdin_len = strlen(in);
    }
    return dsec_backend_exec(be, sb, &req, r, e);
}

static void assert_out(const dsec_exec_result *r, const char *want)
{
    assert_int_equal(r->stdout_len, strlen(want));
    if (r->stdout_len > 0)
        assert_memory_equal(r->stdout_data, want, r->stdout_len);
}

static void sim_exec_model(void **state)
{
    dsec_backend *be = sim_fast();
    dsec_sandbox *sb = mk(be, "container", NULL);
    dsec_exec_result r;
    dsec_err e;

    assert_int_equal(run(be, sb, &r, NULL, 0, 0, &e, "echo", "hello", "world", NULL), 0);
    assert_int_equal(r.exit_code, 0);
    assert_out(&r, "hello world\n");
    assert_false(r.stdout_truncated);
    assert_int_equal(r.duration_us, 2000); /* container exec_ms */
    dsec_exec_result_release(&r);

    assert_int_equal(run(be, sb, &r, NULL, 0, 0, &e, "/bin/echo", NULL), 0);
    assert_out(&r, "\n");
    dsec_exec_result_release(&r);

    assert_int_equal(run(be, sb, &r, NULL, 0, 0, &e, "false", NULL), 0);
    assert_int_equal(r.exit_code, 1);
    assert_int_equal(r.stdout_len, 0);
    dsec_exec_result_release(&r);

    assert_int_equal(run(be, sb, &r, NULL, 0, 0, &e, "exit", "3", NULL), 0);
    assert_int_equal(r.exit_code, 3);
    dsec_exec_result_release(&r);

    assert_int_equal(run(be, sb, &r, "line one\nline two\n", 0, 0, &e, "cat", NULL), 0);
    assert_int_equal(r.exit_code, 0);
    assert_out(&r, "line one\nline two\n");
    dsec_exec_result_release(&r);

    assert_int_equal(run(be, sb, &r, NULL, 0, 0, &e, "python3", "-c", "print(1)", NULL), 0);
    assert_int_equal(r.exit_code, 0);
    assert_int_equal(r.stdout_len, 0);
    dsec_exec_result_release(&r);

    /* Output cap. */
    assert_int_equal(run(be, sb, &r, NULL, 5, 0, &e, "echo", "0123456789", NULL), 0);
    assert_out(&r, "01234");
    assert_true(r.stdout_truncated);
    dsec_exec_result_release(&r);

    /* sleep: modelled duration; a shorter timeout kills it. */
    assert_int_equal(run(be, sb, &r, NULL, 0, 0, &e, "sleep", "3", NULL), 0);
    assert_false(r.timed_out);
    assert_int_equal(r.duration_us, 3000000 + 2000);
    dsec_exec_result_release(&r);
    assert_int_equal(run(be, sb, &r, NULL, 0, 500, &e, "sleep", "3", NULL), 0);
    assert_true(r.timed_out);
    assert_int_equal(r.signal, 9);
    assert_int_equal(r.exit_code, -1);
    assert_int_equal(r.duration_us, 500000);
    dsec_exec_result_release(&r);

    /* No command, and a sandbox without a default command (an image's Entrypoint/Cmd):
     * refused, saying so, in the foreground and the background. */
    dsec_exec_req empty = {.argc = 0};
    assert_int_equal(dsec_backend_exec(be, sb, &empty, &r, &e), -1);
    assert_int_equal(e.code, DSEC_E_INVALID);
    assert_non_null(strstr(e.msg, "no default command"));
    dsec_exec_req half = {.argc = 1, .argv = NULL};
    assert_int_equal(dsec_backend_exec(be, sb, &half, &r, &e), -1);
    assert_int_equal(e.code, DSEC_E_INVALID);

    kill_sb(be, sb);
    dsec_backend_free(be);
}

static void sim_files(void **state)
{
    dsec_backend *be = sim_fast();
    dsec_sandbox *sb = mk(be, "container", NULL);
    dsec_err e;
    dsec_file_data d;

    assert_int_equal(dsec_backend_file_write(be, sb, "/w/a.txt", "hello", 5, 0, false, &e), 0);
    assert_int_equal(dsec_backend_file_write(be, sb, "/w/sub/b", "B", 1, 0600, false, &e), 0);
    assert_int_equal(dsec_backend_file_write(be, sb, "/w/sub/c", "", 0, 0, false, &e), 0);
    assert_int_equal(dsec_backend_file_write(be, sb, "/w/a.txt", " world", 6, 0, true, &e), 0);
    assert_int_equal(dsec_backend_file_write(be, sb, "/top", "t", 1, 0, false, &e), 0);

    assert_int_equal(dsec_backend_file_read(be, sb, "/w/a.txt", 0, 0, &d, &e), 0);
    assert_int_equal(d.len, 11);
    assert_memory_equal(d.data, "hello world", 11);
    assert_true(d.eof);
    dsec_free(d.data);
    assert_int_equal(dsec_backend_file_read(be, sb, "/w/a.txt", 6, 3, &d, &e), 0);
    assert_int_equal(d.len, 3);
    assert_memory_equal(d.data, "wor", 3);
    assert_int_equal(d.size, 11);
    assert_false(d.eof);
    dsec_free(d.data);
    assert_int_equal(dsec_backend_file_read(be, sb, "/w/a.txt", 50, 0, &d, &e), 0);
    assert_int_equal(d.len, 0);
    assert_true(d.eof);

    /* cat reads the in-memory files. */
    dsec_exec_result r;
    assert_int_equal(run(be, sb, &r, NULL, 0, 0, &e, "cat", "/w/sub/b", "/nope", NULL), 0);
    assert_out(&r, "B");
    assert_int_equal(r.exit_code, 1);
    assert_int_equal(r.stderr_len, strlen("cat: /nope: No such file or directory\n"));
    dsec_exec_result_release(&r);

    dsec_file_entry *ent = NULL;
    size_t n = 0;
    assert_int_equal(dsec_backend_file_list(be, sb, "/w", &ent, &n, &e), 0);
    assert_int_equal(n, 2);
    assert_string_equal(ent[0].name, "a.txt");
    assert_int_equal(ent[0].kind, DSEC_FILE_REG);
    assert_int_equal(ent[0].size, 11);
    assert_int_equal(ent[0].mode, 0644);
    assert_string_equal(ent[1].name, "sub");
    assert_int_equal(ent[1].kind, DSEC_FILE_DIR);
    assert_string_equal(dsec_file_kind_name(ent[1].kind), "dir");
    dsec_file_entries_free(ent, n);
    assert_int_equal(dsec_backend_file_list(be, sb, "/", &ent, &n, &e), 0);
    assert_int_equal(n, 2);
    assert_string_equal(ent[0].name, "top");
    assert_string_equal(ent[1].name, "w");
    dsec_file_entries_free(ent, n);
    assert_int_equal(dsec_backend_file_list(be, sb, "/w/sub/b", &ent, &n, &e), 0);
    assert_int_equal(n, 1);
    assert_string_equal(ent[0].name, "b");
    assert_int_equal(ent[0].mode, 0600);
    dsec_file_entries_free(ent, n);

    /* Errors name the path and say what is wrong. */
    assert_int_equal(dsec_backend_file_list(be, sb, "/nothing", &ent, &n, &e), -1);
    assert_int_equal(e.code, DSEC_E_NOT_FOUND);
    assert_int_equal(dsec_backend_file_read(be, sb, "/w/none", 0, 0, &d, &e), -1);
    assert_int_equal(e.code, DSEC_E_NOT_FOUND);
    assert_non_null(strstr(e.msg, "/w/none"));
    assert_int_equal(dsec_backend_file_read(be, sb, "/w/sub", 0, 0, &d, &e), -1);
    assert_int_equal(e.code, DSEC_E_INVALID);
    static const char *const bad[] = {"rel/x", "/a//b", "/a/../b", "/a/./b", "/a/", "/"};
    for (size_t i = 0; i < N_(bad); i++) {
        assert_int_equal(dsec_backend_file_write(be, sb, bad[i], "x", 1, 0, false, &e), -1);
        assert_int_equal(e.code, DSEC_E_INVALID);
    }
    assert_int_equal(dsec_backend_file_write(be, sb, "/top/under", "x", 1, 0, false, &e), -1);
    assert_non_null(strstr(e.msg, "/top is a file"));
    assert_int_equal(dsec_backend_file_write(be, sb, "/w/sub", "x", 1, 0, false, &e), -1);
    assert_int_equal(e.code, DSEC_E_INVALID);

    dsec_sandbox_stats st;
    assert_int_equal(dsec_backend_stats(be, sb, &st, &e), 0);
    assert_int_equal(st.nfiles, 4);
    assert_int_equal(st.disk_bytes, 11 + 1 + 0 + 1);
    /* Overwrite shrinks the count. */
    assert_int_equal(dsec_backend_file_write(be, sb, "/w/a.txt", "x", 1, 0, false, &e), 0);
    assert_int_equal(dsec_backend_stats(be, sb, &st, &e), 0);
    assert_int_equal(st.disk_bytes, 1 + 1 + 0 + 1);
    kill_sb(be, sb);

    /* The disk limit: the spec's disk_mb wins when smaller than max_disk_mb. */
    dsec_sandbox_spec sp = {.id = "x", .type = "container", .disk_mb = 1};
    char *s = NULL;
    assert_int_equal(dsec_backend_create(be, &sp, &sb, &s, &e), 0);
    dsec_free(s);
    size_t big = 600 * 1024;
    char *buf = dsec_calloc(1, big);
    assert_int_equal(dsec_backend_file_write(be, sb, "/a", buf, big, 0, false, &e), 0);
    assert_int_equal(dsec_backend_file_write(be, sb, "/b", buf, big, 0, false, &e), -1);
    assert_int_equal(e.code, DSEC_E_TOO_LARGE);
    assert_int_equal(dsec_backend_file_write(be, sb, "/a", buf, big, 0, true, &e), -1);
    assert_int_equal(dsec_backend_file_write(be, sb, "/a", buf, 10, 0, false, &e), 0);
    assert_int_equal(dsec_backend_file_write(be, sb, "/b", buf, big, 0, false, &e), 0);
    dsec_free(buf);
    kill_sb(be, sb);
    dsec_backend_free(be);
}

static void read_is(dsec_backend *be, dsec_sandbox *sb, const char *path, const char *want)
{
    dsec_file_data d;
    dsec_err e;
    if (want == NULL) {
        assert_int_equal(dsec_backend_file_read(be, sb, path, 0, 0, &d, &e), -1);
        assert_int_equal(e.code, DSEC_E_NOT_FOUND);
        return;
    }
    if (dsec_backend_file_read(be, sb, path, 0, 0, &d, &e) < 0)
        fail_msg("reading %s: %s", path, e.msg);
    assert_int_equal(d.len, strlen(want));
    if (d.len)
        assert_memory_equal(d.data, want, d.len);
    dsec_free(d.data);
}

static void sim_fork_copies_on_write(void **state)
{
    dsec_backend *be = sim_fast();
    dsec_sandbox *p = mk(be, "container", NULL);
    dsec_err e;
    assert_int_equal(dsec_backend_file_write(be, p, "/a", "v1", 2, 0, false, &e), 0);
    assert_int_equal(dsec_backend_file_write(be, p, "/log", "x", 1, 0, false, &e), 0);

    const char *ids[] = {"c1", "c2"};
    dsec_sandbox *kids[2];
    char *states[2];
    assert_int_equal(dsec_backend_fork(be, p, ids, 2, kids, states, &e), 0);
    for (int i = 0; i < 2; i++) {
        assert_non_null(kids[i]);
        assert_non_null(strstr(states[i], "type=container"));
        dsec_free(states[i]);
        read_is(be, kids[i], "/a", "v1");
    }
    /* Later parent writes (replace, append in place, new file) stay in the parent. */
    assert_int_equal(dsec_backend_file_write(be, p, "/a", "v2", 2, 0, false, &e), 0);
    assert_int_equal(dsec_backend_file_write(be, p, "/log", "y", 1, 0, true, &e), 0);
    assert_int_equal(dsec_backend_file_write(be, p, "/new", "n", 1, 0, false, &e), 0);
    read_is(be, p, "/a", "v2");
    read_is(be, p, "/log", "xy");
    for (int i = 0; i < 2; i++) {
        read_is(be, kids[i], "/a", "v1");
        read_is(be, kids[i], "/log", "x");
        read_is(be, kids[i], "/new", NULL);
    }
    /* Siblings are independent, and the parent does not see its children. */
    assert_int_equal(dsec_backend_file_write(be, kids[0], "/log", "z", 1, 0, true, &e), 0);
    assert_int_equal(dsec_backend_file_write(be, kids[0], "/only0", "0", 1, 0, false, &e), 0);
    read_is(be, kids[0], "/log", "xz");
    read_is(be, kids[1], "/log", "x");
    read_is(be, kids[1], "/only0", NULL);
    read_is(be, p, "/only0", NULL);
    read_is(be, p, "/log", "xy");

    /* Destroying the parent leaves the children whole (shared contents). */
    kill_sb(be, p);
    read_is(be, kids[1], "/a", "v1");
    kill_sb(be, kids[0]);
    read_is(be, kids[1], "/log", "x");
    kill_sb(be, kids[1]);

    /* A function cannot fork (its caps say so) and nothing is left behind. */
    dsec_sandbox *f = mk(be, "function", NULL);
    kids[0] = (dsec_sandbox *)&e; /* must be reset */
    assert_int_equal(dsec_backend_fork(be, f, ids, 1, kids, states, &e), -1);
    assert_int_equal(e.code, DSEC_E_UNSUPPORTED);
    assert_string_equal(e.msg, "sandbox type \"function\" does not support fork");
    assert_null(kids[0]);
    assert_int_equal(dsec_backend_fork(be, f, ids, 0, kids, states, &e), -1);
    assert_int_equal(e.code, DSEC_E_INVALID);
    kill_sb(be, f);
    dsec_backend_free(be);
}

static void sim_pause_resume_stats(void **state)
{
    static const dsec_backend_kv o[] = {{"time_scale", "0"}, {"mem_overhead_mb.microvm", "100"}};
    dsec_backend *be = sim_open(o, N_(o));
    dsec_sandbox *sb = mk(be, "microvm", NULL);
    dsec_err e;
    dsec_exec_result r;
    dsec_sandbox_stats st;

    for (int i = 0; i < 3; i++) {
        assert_int_equal(run(be, sb, &r, NULL, 0, 0, &e, "true", NULL), 0);
        dsec_exec_result_release(&r);
    }
    assert_int_equal(dsec_backend_stats(be, sb, &st, &e), 0);
    assert_int_equal(st.cpu_used_us, 3 * 3000); /* microvm exec_ms = 3 */
    assert_int_equal(st.cpu_milli, 50);         /* 5% of 1000 */
    assert_int_equal(st.memory_bytes, 100ull * 1048576 + (uint64_t)(0.1 * 1024 * 1048576));

    assert_int_equal(dsec_backend_pause(be, sb, &e), 0);
    assert_int_equal(dsec_backend_pause(be, sb, &e), 0); /* a retry is harmless */
    assert_int_equal(run(be, sb, &r, NULL, 0, 0, &e, "echo", "x", NULL), -1);
    assert_int_equal(e.code, DSEC_E_STATE);
    assert_non_null(strstr(e.msg, "paused"));
    assert_int_equal(dsec_backend_file_write(be, sb, "/a", "x", 1, 0, false, &e), -1);
    assert_int_equal(e.code, DSEC_E_STATE);
    assert_int_equal(dsec_backend_stats(be, sb, &st, &e), 0);
    assert_int_equal(st.cpu_milli, 0);
    assert_int_equal(st.cpu_used_us, 3 * 3000);

    assert_int_equal(dsec_backend_resume(be, sb, &e), 0);
    assert_int_equal(run(be, sb, &r, NULL, 0, 0, &e, "echo", "back", NULL), 0);
    assert_out(&r, "back\n");
    dsec_exec_result_release(&r);
    assert_int_equal(dsec_backend_stats(be, sb, &st, &e), 0);
    assert_int_equal(st.cpu_milli, 50);
    assert_int_equal(st.cpu_used_us, 4 * 3000);
    kill_sb(be, sb);

    /* function: no pause. */
    sb = mk(be, "function", NULL);
    assert_int_equal(dsec_backend_pause(be, sb, &e), -1);
    assert_int_equal(e.code, DSEC_E_UNSUPPORTED);
    kill_sb(be, sb);
    dsec_backend_free(be);

    /* enforce_caps=false lets a sim "function" pause (for what-if runs). */
    static const dsec_backend_kv o2[] = {{"time_scale", "0"}, {"enforce_caps", "false"}};
    be = sim_open(o2, N_(o2));
    sb = mk(be, "function", NULL);
    assert_int_equal(dsec_backend_pause(be, sb, &e), 0);
    kill_sb(be, sb);
    dsec_backend_free(be);
}

static void sim_adopt_from_state(void **state)
{
    dsec_backend *be = sim_fast();
    char *st = NULL;
    dsec_sandbox *sb = mk(be, "microvm", &st);
    dsec_err e;
    assert_string_equal(st, "sim1;type=microvm;cpu=1000;mem=1024;disk=0");
    assert_int_equal(dsec_backend_file_write(be, sb, "/f", "x", 1, 0, false, &e), 0);
    dsec_sandbox_stats before, after;
    assert_int_equal(dsec_backend_stats(be, sb, &before, &e), 0);
    /* The node manager goes away: it detaches, then a new one adopts. */
    dsec_backend_detach(be, sb);
    dsec_backend_free(be);

    be = sim_fast();
    dsec_sandbox_spec spec = {.id = "n1-0000000000000001", .type = "microvm"};
    dsec_sandbox *back = NULL;
    assert_int_equal(dsec_backend_adopt(be, &spec, st, &back, &e), 0);
    assert_non_null(back);
    assert_int_equal(dsec_backend_stats(be, back, &after, &e), 0);
    assert_int_equal(after.memory_bytes, before.memory_bytes);
    assert_int_equal(after.cpu_milli, before.cpu_milli);
    assert_int_equal(after.nfiles, 0); /* documented: sim files are lost on adopt */
    read_is(be, back, "/f", NULL);
    dsec_exec_result r;
    assert_int_equal(run(be, back, &r, NULL, 0, 0, &e, "echo", "alive", NULL), 0);
    assert_out(&r, "alive\n");
    dsec_exec_result_release(&r);
    kill_sb(be, back);

    /* The record and the state disagree, or the state is not ours. */
    spec.type = "container";
    assert_int_equal(dsec_backend_adopt(be, &spec, st, &back, &e), -1);
    assert_int_equal(e.code, DSEC_E_INVALID);
    static const char *const junk[] = {"", "sim1;type=vm", "sim1;type=vm;cpu=1;mem=2;disk=3x",
                                       "{\"pid\":4}"};
    for (size_t i = 0; i < N_(junk); i++) {
        assert_int_equal(dsec_backend_adopt(be, NULL, junk[i], &back, &e), -1);
        assert_int_equal(e.code, DSEC_E_INVALID);
        assert_null(back);
    }
    dsec_free(st);
    dsec_backend_free(be);
}

static void sim_snapshot_restore(void **state)
{
    dsec_backend *be = sim_fast();
    dsec_sandbox *sb = mk(be, "container", NULL);
    dsec_err e;
    char path[] = "/tmp/dsec-test-snap-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    assert_int_equal(dsec_backend_file_write(be, sb, "/w/a", "alpha", 5, 0, false, &e), 0);
    assert_int_equal(dsec_backend_file_write(be, sb, "/w/e", "", 0, 0700, false, &e), 0);
    assert_int_equal(dsec_backend_file_write(be, sb, "/z", "zz\nz", 4, 0, false, &e), 0);
    assert_int_equal(dsec_backend_snapshot(be, sb, path, NULL, &e), 0);
    kill_sb(be, sb);

    dsec_sandbox_spec spec = {.id = "n1-2", .type = "container", .cpu_milli = 250};
    char *st = NULL;
    assert_int_equal(dsec_backend_restore(be, &spec, path, &sb, &st, &e), 0);
    assert_string_equal(st, "sim1;type=container;cpu=250;mem=0;disk=0");
    dsec_free(st);
    read_is(be, sb, "/w/a", "alpha");
    read_is(be, sb, "/w/e", "");
    read_is(be, sb, "/z", "zz\nz");
    dsec_file_entry *ent;
    size_t n;
    assert_int_equal(dsec_backend_file_list(be, sb, "/w", &ent, &n, &e), 0);
    assert_int_equal(n, 2);
    assert_int_equal(ent[1].mode, 0700);
    dsec_file_entries_free(ent, n);
    kill_sb(be, sb);

    spec.type = "microvm";
    assert_int_equal(dsec_backend_restore(be, &spec, path, &sb, &st, &e), -1);
    assert_int_equal(e.code, DSEC_E_INVALID);
    assert_non_null(strstr(e.msg, "cannot restore as microvm"));

    /* A damaged snapshot is refused, never half-restored. */
    assert_int_equal(truncate(path, 60), 0); /* inside the first file's header */
    spec.type = "container";
    assert_int_equal(dsec_backend_restore(be, &spec, path, &sb, &st, &e), -1);
    assert_int_equal(e.code, DSEC_E_INVALID);
    assert_non_null(strstr(e.msg, "corrupt"));
    unlink(path);
    assert_int_equal(dsec_backend_restore(be, &spec, path, &sb, &st, &e), -1);
    assert_int_equal(e.code, DSEC_E_NOT_FOUND);
    dsec_backend_free(be);
}

static double ms_since(const struct timespec *t0)
{
    struct timespec t1;
    clock_gettime(CLOCK_MONOTONIC, &t1);
    return (double)(t1.tv_sec - t0->tv_sec) * 1e3 + (double)(t1.tv_nsec - t0->tv_nsec) / 1e6;
}

static void sim_options_and_latency(void **state)
{
    dsec_backend *be = NULL;
    dsec_err e;
    static const dsec_backend_kv bad[][1] = {
        {{"speed", "1"}},          {{"startup_ms", "-3"}},      {{"cpu_frac.vm", "2"}},
        {{"warp.container", "1"}}, {{"enforce_caps", "maybe"}}, {{"time_scale", "x"}},
    };
    for (size_t i = 0; i < N_(bad); i++) {
        dsec_backend_config cfg = {.opts = bad[i], .nopts = 1};
        assert_int_equal(dsec_backend_new(&be, &dsec_sim_ops, &cfg, &e), -1);
        assert_int_equal(e.code, DSEC_E_CONFIG);
        assert_non_null(strstr(e.msg, bad[i][0].key));
    }

    /* Type-specific beats type-less, whatever the order; both scale. */
    static const dsec_backend_kv o[] = {{"startup_ms.container", "40"},
                                        {"startup_ms", "0"},
                                        {"time_scale", "0.5"},
                                        {"exec_ms", "0"}};
    be = sim_open(o, N_(o));
    struct timespec t0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    dsec_sandbox *a = mk(be, "container", NULL);
    double took = ms_since(&t0);
    assert_true(took >= 20.0); /* 40 ms * 0.5 */
    clock_gettime(CLOCK_MONOTONIC, &t0);
    dsec_sandbox *b = mk(be, "microvm", NULL);
    dsec_sandbox *c = mk(be, "made-up-type", NULL); /* impersonates anything */
    took = ms_since(&t0);
    assert_true(took < 20.0);
    dsec_exec_result r;
    assert_int_equal(run(be, c, &r, NULL, 0, 0, &e, "sleep", "0.05", NULL), 0);
    assert_int_equal(r.duration_us, 50000);
    dsec_exec_result_release(&r);
    assert_true(ms_since(&t0) >= 25.0);
    kill_sb(be, a);
    kill_sb(be, b);
    kill_sb(be, c);
    dsec_backend_free(be);
}

/* Allocator's count of live bytes (libc, jemalloc or the sanitizer's). */
static size_t allocated_bytes(void)
{
#if defined(__SANITIZE_ADDRESS__)
    return __sanitizer_get_current_allocated_bytes();
#elif defined(DSEC_WITH_JEMALLOC)
    uint64_t epoch = 1;
    size_t sz = sizeof epoch;
    mallctl("epoch", &epoch, &sz, &epoch, sz);
    size_t allocated = 0;
    sz = sizeof allocated;
    mallctl("stats.allocated", &allocated, &sz, NULL, 0);
    return allocated;
#else
    return mallinfo2().uordblks;
#endif
}

static const char *allocator_name(void)
{
#if defined(__SANITIZE_ADDRESS__)
    return "asan";
#else
    return dsec_alloc_name();
#endif
}

static void sim_memory_per_sandbox(void **state)
{
    enum { N = 100000 };
    dsec_backend *be = sim_fast();
    dsec_sandbox **h = dsec_calloc(N, sizeof *h);
    dsec_sandbox_spec sp = {.id = "n1-0", .type = "container", .cpu_milli = 100, .memory_mb = 256};
    dsec_err e;
    /* Warm up (models, allocator caches) before the baseline. */
    char *st;
    dsec_sandbox *w = NULL;
    assert_int_equal(dsec_backend_create(be, &sp, &w, &st, &e), 0);
    dsec_free(st);
    kill_sb(be, w);

    size_t before = allocated_bytes();
    for (int i = 0; i < N; i++) {
        assert_int_equal(dsec_backend_create(be, &sp, &h[i], &st, &e), 0);
        dsec_free(st); /* persisted by the node manager, not held by the backend */
    }
    size_t after = allocated_bytes();
    double per = (double)(after - before) / N;
    print_message("sim: %.1f bytes of backend state per empty sandbox (%d sandboxes, %s "
                  "allocator)\n",
                  per, N, allocator_name());
    assert_true(after > before); /* the measure works at all */
    assert_true(per <= 256.0);
    for (int i = 0; i < N; i++)
        kill_sb(be, h[i]);
    assert_true(allocated_bytes() < after - (size_t)N * 32);
    dsec_free(h);
    dsec_backend_free(be);
}

/* Sandboxes of one instance driven from several threads, with new type
 * names appearing concurrently (the one shared table). */
struct worker {
    dsec_backend *be;
    int id;
    int failures;
};

static void *worker_run(void *arg)
{
    struct worker *w = arg;
    char type[16], want[64];
    for (int i = 0; i < 400; i++) {
        snprintf(type, sizeof type, "t%d", i % 12);
        dsec_sandbox_spec sp = {.id = "x", .type = type, .cpu_milli = 10};
        dsec_sandbox *sb = NULL, *kid[1];
        char *st = NULL, *kst[1];
        dsec_err e;
        if (dsec_backend_create(w->be, &sp, &sb, &st, &e) < 0) {
            w->failures++;
            continue;
        }
        snprintf(want, sizeof want, "sim1;type=%s;cpu=10;", type);
        if (strncmp(st, want, strlen(want)) != 0)
            w->failures++;
        dsec_free(st);
        const char *ids[] = {"k"};
        if (dsec_backend_file_write(w->be, sb, "/f", "abc", 3, 0, false, &e) < 0 ||
            dsec_backend_fork(w->be, sb, ids, 1, kid, kst, &e) < 0) {
            w->failures++;
        } else {
            dsec_free(kst[0]);
            dsec_backend_destroy(w->be, sb, &e); /* parent first: the child holds the blob */
            sb = NULL;
            dsec_file_data d = {0};
            if (dsec_backend_file_read(w->be, kid[0], "/f", 0, 0, &d, &e) < 0 || d.len != 3)
                w->failures++;
            dsec_free(d.data);
            dsec_backend_destroy(w->be, kid[0], &e);
        }
        if (sb != NULL)
            dsec_backend_destroy(w->be, sb, &e);
    }
    return NULL;
}

static void sim_threads(void **state)
{
    dsec_backend *be = sim_fast();
    struct worker w[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (struct worker){.be = be, .id = i};
        assert_int_equal(pthread_create(&th[i], NULL, worker_run, &w[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(w[i].failures, 0);
    }
    dsec_backend_free(be);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(registry_builtins_are_ordered),
        cmocka_unit_test(registry_picks_lightest),
        cmocka_unit_test(registry_pick_is_minimal_everywhere),
        cmocka_unit_test(registry_named_type),
        cmocka_unit_test(registry_unknowns),
        cmocka_unit_test(registry_nothing_offered),
        cmocka_unit_test(registry_add_rules),
        cmocka_unit_test(sim_exec_model),
        cmocka_unit_test(sim_files),
        cmocka_unit_test(sim_fork_copies_on_write),
        cmocka_unit_test(sim_pause_resume_stats),
        cmocka_unit_test(sim_adopt_from_state),
        cmocka_unit_test(sim_snapshot_restore),
        cmocka_unit_test(sim_options_and_latency),
        cmocka_unit_test(sim_memory_per_sandbox),
        cmocka_unit_test(sim_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
