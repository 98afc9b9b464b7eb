/* test_config.c - YAML config loading: values, defaults, and errors naming file, line and key. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "actors/cell.h"
#include "runtime/config.h"

static dsec_cfg *parse_ok(const char *text)
{
    dsec_cfg *c = NULL;
    dsec_err err;
    int rc = dsec_cfg_parse(&c, "t.yaml", text, strlen(text), &err);
    if (rc != 0)
        fail_msg("parse failed: %s", err.msg);
    return c;
}

static void reads_values_and_defaults(void **state)
{
    dsec_cfg *c = parse_ok("cell: c1\nscheduler:\n  k: 3\n  ratio: 0.5\n  on: true\n"
                           "nodes:\n  - name: n1\n  - name: n2\n");
    dsec_err err;
    const dsec_cfg_node *root = dsec_cfg_root(c);
    const char *cell;
    assert_int_equal(dsec_cfg_str(c, root, "cell", "x", &cell, &err), 0);
    assert_string_equal(cell, "c1");
    const dsec_cfg_node *sch = dsec_cfg_get(root, "scheduler");
    uint64_t k, missing;
    double ratio;
    bool on;
    assert_int_equal(dsec_cfg_u64(c, sch, "k", 1, 1, 16, &k, &err), 0);
    assert_int_equal(k, 3);
    assert_int_equal(dsec_cfg_u64(c, sch, "nope", 7, 1, 16, &missing, &err), 0);
    assert_int_equal(missing, 7);
    assert_int_equal(dsec_cfg_double(c, sch, "ratio", 0, 0, 1, &ratio, &err), 0);
    assert_true(ratio == 0.5);
    assert_int_equal(dsec_cfg_bool(c, sch, "on", false, &on, &err), 0);
    assert_true(on);
    const dsec_cfg_node *nodes = dsec_cfg_get(root, "nodes");
    assert_int_equal(nodes->kind, DSEC_CFG_SEQ);
    assert_int_equal(nodes->n, 2);
    const char *name;
    assert_int_equal(dsec_cfg_str(c, nodes->kids[1], "name", NULL, &name, &err), 0);
    assert_string_equal(name, "n2");
    assert_int_equal(nodes->kids[1]->line, 8);
    dsec_cfg_free(c);
}

static void errors_name_file_line_and_key(void **state)
{
    dsec_cfg *c = parse_ok("cell: c1\nscheduler:\n  k: lots\n  max: 99\n  flag: maybe\n");
    dsec_err err;
    const dsec_cfg_node *sch = dsec_cfg_get(dsec_cfg_root(c), "scheduler");
    uint64_t v;
    bool b;
    assert_int_equal(dsec_cfg_u64(c, sch, "k", 1, 1, 16, &v, &err), -1);
    assert_string_equal(err.msg,
                        "t.yaml:3: key \"k\": expected a non-negative integer, got \"lots\"");
    assert_int_equal(err.code, DSEC_E_CONFIG);
    assert_int_equal(dsec_cfg_u64(c, sch, "max", 1, 1, 16, &v, &err), -1);
    assert_string_equal(err.msg, "t.yaml:4: key \"max\": 99 is out of range [1, 16]");
    assert_int_equal(dsec_cfg_bool(c, sch, "flag", false, &b, &err), -1);
    assert_non_null(strstr(err.msg, "t.yaml:5: key \"flag\""));
    static const char *const allowed[] = {"k", "max", NULL};
    assert_int_equal(dsec_cfg_check_keys(c, sch, allowed, &err), -1);
    assert_string_equal(err.msg, "t.yaml:5: unknown key \"flag\" (known: k, max)");
    const char *s;
    assert_int_equal(dsec_cfg_str(c, dsec_cfg_root(c), "scheduler", NULL, &s, &err), -1);
    assert_non_null(strstr(err.msg, "t.yaml:2: key \"scheduler\": expected a scalar, got a map"));
    dsec_cfg_free(c);
}

static void syntax_and_structure_errors(void **state)
{
    dsec_cfg *c = NULL;
    dsec_err err;
    const char *bad = "a: 1\nb: [1, 2\n";
    assert_int_equal(dsec_cfg_parse(&c, "bad.yaml", bad, strlen(bad), &err), -1);
    assert_non_null(strstr(err.msg, "bad.yaml:"));
    const char *dup = "a: 1\na: 2\n";
    assert_int_equal(dsec_cfg_parse(&c, "dup.yaml", dup, strlen(dup), &err), -1);
    assert_string_equal(err.msg, "dup.yaml:2: key \"a\" appears twice");
    const char *list = "- a\n- b\n";
    assert_int_equal(dsec_cfg_parse(&c, "l.yaml", list, strlen(list), &err), -1);
    assert_non_null(strstr(err.msg, "top level must be a map"));
    const char *alias = "a: &x 1\nb: *x\n";
    assert_int_equal(dsec_cfg_parse(&c, "al.yaml", alias, strlen(alias), &err), -1);
    assert_non_null(strstr(err.msg, "al.yaml:2: YAML aliases"));
    assert_int_equal(dsec_cfg_load(&c, "/nonexistent/x.yaml", &err), -1);
    assert_non_null(strstr(err.msg, "/nonexistent/x.yaml"));
    assert_null(c);
}

static void empty_file_is_empty_map(void **state)
{
    dsec_cfg *c = parse_ok("");
    assert_int_equal(dsec_cfg_root(c)->kind, DSEC_CFG_MAP);
    assert_int_equal(dsec_cfg_root(c)->n, 0);
    dsec_cfg_free(c);
    c = parse_ok("# only a comment\n");
    assert_int_equal(dsec_cfg_root(c)->n, 0);
    dsec_cfg_free(c);
}

/* A relative state_dir is kept absolute: the node's backends mount under it. */
static void cell_state_dir_is_made_absolute(void **state)
{
    char cwd[512], want[600];
    assert_non_null(getcwd(cwd, sizeof cwd));
    static const char *const rel[][2] = {
        {"./st", "st"}, {"st/x", "st/x"}, {"././st", "st"}, {".", ""}};
    for (size_t i = 0; i < sizeof rel / sizeof rel[0]; i++) {
        char yaml[128];
        snprintf(yaml, sizeof yaml, "cell: c1\nstate_dir: %s\n", rel[i][0]);
        dsec_cell_conf c;
        dsec_cell_conf_defaults(&c);
        dsec_err err;
        if (dsec_cell_conf_parse(&c, "t.yaml", yaml, strlen(yaml), &err) < 0)
            fail_msg("%s: %s", rel[i][0], err.msg);
        snprintf(want, sizeof want, "%s%s%s", cwd, rel[i][1][0] ? "/" : "", rel[i][1]);
        assert_string_equal(c.state_dir, want);
        dsec_cell_conf_release(&c);
    }
    dsec_cell_conf c;
    dsec_cell_conf_defaults(&c);
    dsec_err err;
    const char *abs = "cell: c1\nstate_dir: /var/lib/dsec-x\n";
    assert_int_equal(dsec_cell_conf_parse(&c, "t.yaml", abs, strlen(abs), &err), 0);
    assert_string_equal(c.state_dir, "/var/lib/dsec-x");
    assert_int_equal(dsec_cell_conf_set_state_dir(&c, "", &err), -1);
    assert_non_null(strstr(err.msg, "state_dir"));
    dsec_cell_conf_release(&c);
}

/* trace: the hop record's settings, their defaults and their bounds. */
static void cell_trace_settings(void **state)
{
    (void)state;
    dsec_cell_conf c;
    dsec_cell_conf_defaults(&c);
    assert_true(c.trace_sample_rate == 0.01);
    assert_int_equal(c.trace_slow_ms, 100);
    assert_int_equal(c.trace_ring, 4096);
    dsec_err err;
    const char *y = "cell: c1\ntrace:\n  sample_rate: 0.5\n  slow_ms: 250\n  ring: 0\n";
    assert_int_equal(dsec_cell_conf_parse(&c, "t.yaml", y, strlen(y), &err), 0);
    assert_true(c.trace_sample_rate == 0.5);
    assert_int_equal(c.trace_slow_ms, 250);
    assert_int_equal(c.trace_ring, 0);
    dsec_cell_conf_release(&c);
    dsec_cell_conf_defaults(&c);
    const char *bad = "cell: c1\ntrace:\n  sample_rate: 2\n";
    assert_int_equal(dsec_cell_conf_parse(&c, "t.yaml", bad, strlen(bad), &err), -1);
    assert_non_null(strstr(err.msg, "sample_rate"));
    dsec_cell_conf_release(&c);
    dsec_cell_conf_defaults(&c);
    const char *typo = "cell: c1\ntrace:\n  sampel_rate: 0.1\n";
    assert_int_equal(dsec_cell_conf_parse(&c, "t.yaml", typo, strlen(typo), &err), -1);
    assert_non_null(strstr(err.msg, "sampel_rate"));
    dsec_cell_conf_release(&c);
}

/* scheduler: the silence settings, and a suspect_after_ms that would never come first. */
static void cell_scheduler_silence_settings(void **state)
{
    (void)state;
    dsec_cell_conf c;
    dsec_cell_conf_defaults(&c);
    dsec_err err;
    const char *y = "cell: c1\nscheduler:\n  dead_after_ms: 5000\n  suspect_after_ms: 2500\n"
                    "  drain_gap_ms: 2000\n  probation_ms: 4000\n";
    assert_int_equal(dsec_cell_conf_parse(&c, "t.yaml", y, strlen(y), &err), 0);
    assert_int_equal(c.suspect_after_ms, 2500);
    assert_int_equal(c.drain_gap_ms, 2000);
    assert_int_equal(c.probation_ms, 4000);
    dsec_cell_conf_release(&c);
    dsec_cell_conf_defaults(&c);
    const char *bad = "cell: c1\nscheduler:\n  dead_after_ms: 3000\n  suspect_after_ms: 3000\n";
    assert_int_equal(dsec_cell_conf_parse(&c, "t.yaml", bad, strlen(bad), &err), -1);
    assert_int_equal(err.code, DSEC_E_CONFIG);
    assert_non_null(strstr(err.msg, "scheduler.suspect_after_ms (3000) must be below "
                                    "scheduler.dead_after_ms (3000)"));
    dsec_cell_conf_release(&c);
}

/* nodes[].results_budget_mb and results_ttl_s: the kept answers' limits, defaults unchanged,
 * bad values refused naming the key, its line and the range. */
static void cell_node_results_settings(void **state)
{
    (void)state;
    dsec_cell_conf c;
    dsec_cell_conf_defaults(&c);
    dsec_err err;
    const char *y = "cell: c1\nnodes:\n  - name: a\n    results_budget_mb: 128\n"
                    "    results_ttl_s: 60\n  - name: b\n";
    assert_int_equal(dsec_cell_conf_parse(&c, "t.yaml", y, strlen(y), &err), 0);
    assert_int_equal(c.nnodes, 2);
    assert_int_equal(c.nodes[0].results_budget_mb, 128);
    assert_int_equal(c.nodes[0].results_ttl_s, 60);
    assert_int_equal(c.nodes[1].results_budget_mb, 64);
    assert_int_equal(c.nodes[1].results_ttl_s, 600);
    dsec_cell_conf_release(&c);
    static const struct {
        const char *yaml, *want;
    } bad[] = {
        {"cell: c1\nnodes:\n  - name: a\n    results_budget_mb: 8\n",
         "t.yaml:4: key \"results_budget_mb\": 8 is out of range [16, 1048576]"},
        {"cell: c1\nnodes:\n  - name: a\n    results_ttl_s: 0\n",
         "t.yaml:4: key \"results_ttl_s\": 0 is out of range [1, 86400]"},
        {"cell: c1\nnodes:\n  - name: a\n    results_ttl_s: 10m\n",
         "key \"results_ttl_s\": expected a non-negative integer, got \"10m\""},
        {"cell: c1\nnodes:\n  - name: a\n    results_ttl_ms: 5\n",
         "unknown key \"results_ttl_ms\""},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        dsec_cell_conf_defaults(&c);
        assert_int_equal(dsec_cell_conf_parse(&c, "t.yaml", bad[i].yaml, strlen(bad[i].yaml), &err),
                         -1);
        assert_int_equal(err.code, DSEC_E_CONFIG);
        if (strstr(err.msg, bad[i].want) == NULL)
            fail_msg("%s: got \"%s\"", bad[i].want, err.msg);
        dsec_cell_conf_release(&c);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(reads_values_and_defaults),
        cmocka_unit_test(cell_scheduler_silence_settings),
        cmocka_unit_test(errors_name_file_line_and_key),
        cmocka_unit_test(syntax_and_structure_errors),
        cmocka_unit_test(empty_file_is_empty_map),
        cmocka_unit_test(cell_state_dir_is_made_absolute),
        cmocka_unit_test(cell_trace_settings),
        cmocka_unit_test(cell_node_results_settings),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
