/* test_dockerfile.c - the Dockerfile reader of `dsec image build`: instructions, continuations,
 * exec forms, words, variables, .dockerignore. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "dsec/alloc.h"
#include "tools/dockerfile.h"

static void parse_ok(const char *text, dsec_df *df)
{
    dsec_err err;
    if (dsec_df_parse(text, strlen(text), "Dockerfile", df, &err) < 0)
        fail_msg("parse: %s", err.msg);
}

static void parse_bad(const char *text, const char *want)
{
    dsec_df df;
    dsec_err err;
    assert_int_equal(dsec_df_parse(text, strlen(text), "Dockerfile", &df, &err), -1);
    if (strstr(err.msg, want) == NULL)
        fail_msg("wanted \"%s\" in \"%s\"", want, err.msg);
}

static void test_instructions(void **state)
{
    (void)state;
    dsec_df df;
    parse_ok("# syntax=docker/dockerfile:1\n"
             "ARG V=1\n"
             "from busybox:$V as base\n"
             "\n"
             "# a comment\n"
             "RUN echo a \\\n"
             "  # a comment inside a continuation\n"
             "  && echo b\n"
             "COPY --chown=app:app --chmod=0644 a b /dst/\n"
             "CMD [\"sh\", \"-c\", \"echo \\\"hi\\\" \\u00e9\"]\n"
             "ENTRYPOINT [not json\n",
             &df);
    assert_int_equal(df.n, 6);
    assert_string_equal(df.v[0].cmd, "ARG");
    assert_int_equal(df.v[1].line, 3);
    assert_string_equal(df.v[1].cmd, "FROM");
    assert_string_equal(df.v[1].rest, "busybox:$V as base");
    assert_string_equal(df.v[2].cmd, "RUN");
    assert_int_equal(df.v[2].line, 6);
    assert_string_equal(df.v[2].rest, "echo a    && echo b");
    assert_false(df.v[2].json);
    assert_int_equal(df.v[3].nflags, 2);
    assert_string_equal(df.v[3].flags[0], "--chown=app:app");
    assert_string_equal(df.v[3].flags[1], "--chmod=0644");
    assert_string_equal(df.v[3].rest, "a b /dst/");
    assert_true(df.v[4].json);
    assert_int_equal(df.v[4].nargs, 3);
    assert_string_equal(df.v[4].args[2], "echo \"hi\" \xc3\xa9");
    assert_false(df.v[5].json); /* not JSON: the shell form, as Docker reads it */
    assert_string_equal(df.v[5].rest, "[not json");
    dsec_df_free(&df);

    parse_ok("# escape=`\nFROM x\nRUN a `\n b\n", &df);
    assert_int_equal(df.escape, '`');
    assert_string_equal(df.v[1].rest, "a   b");
    dsec_df_free(&df);
}

static void test_refusals(void **state)
{
    (void)state;
    parse_bad("FROM x\nFETCH y\n", "Dockerfile:2: unknown instruction \"FETCH\"");
    parse_bad("RUN true\n", "the first instruction must be FROM");
    parse_bad("", "the first instruction must be FROM");
    parse_bad("FROM x\nRUN a \\\n", "ends inside a continued line");
    parse_bad("FROM x\nRUN <<EOF\nhi\nEOF\n", "heredoc");
    parse_bad("FROM x\nRUN\n", "Dockerfile:2: RUN needs arguments");
    dsec_df df;
    dsec_err err;
    assert_int_equal(dsec_df_parse("FROM x\0", 7, "Dockerfile", &df, &err), -1);
    assert_non_null(strstr(err.msg, "NUL"));
}

static void words(const char *s, const dsec_df_vars *v, const char *const *want, size_t n)
{
    char **w;
    size_t nw;
    dsec_err err;
    if (dsec_df_words(s, '\\', v, &w, &nw, &err) < 0)
        fail_msg("words \"%s\": %s", s, err.msg);
    assert_int_equal(nw, n);
    for (size_t i = 0; i < n; i++)
        assert_string_equal(w[i], want[i]);
    dsec_df_strv_free(w, nw);
}

static void test_words_and_variables(void **state)
{
    (void)state;
    dsec_df_vars v = {0};
    dsec_err err;
    assert_int_equal(dsec_df_vars_set(&v, "PATH", "/bin", &err), 0);
    assert_int_equal(dsec_df_vars_set(&v, "HOME", "/root", &err), 0);
    assert_int_equal(dsec_df_vars_set(&v, "EMPTY", "", &err), 0);
    assert_int_equal(dsec_df_vars_set(&v, "PATH", "/usr/bin:/bin", &err), 0); /* replaced */
    assert_int_equal(v.n, 3);
    assert_string_equal(dsec_df_vars_get(&v, "PATH"), "/usr/bin:/bin");
    assert_null(dsec_df_vars_get(&v, "PAT"));

    words("A=1 PATH=/opt/bin:$PATH", &v,
          (const char *const[]){"A=1", "PATH=/opt/bin:/usr/bin:/bin"}, 2);
    words("X=\"a b\" Y='$HOME' Z=${HOME}/x", &v,
          (const char *const[]){"X=a b", "Y=$HOME", "Z=/root/x"}, 3);
    words("${NOPE:-def} ${HOME:-def} ${HOME:+set} ${EMPTY:-e} ${NOPE:+x}|", &v,
          (const char *const[]){"def", "/root", "set", "e", "|"}, 5);
    words("a\\ b \\$HOME \"q\\\"q\" $ $1x", &v,
          (const char *const[]){"a b", "$HOME", "q\"q", "$", "$1x"}, 5);
    words("  ", &v, NULL, 0);
    char **w;
    size_t n;
    assert_int_equal(dsec_df_words("A=\"open", '\\', &v, &w, &n, &err), -1);
    assert_non_null(strstr(err.msg, "unterminated double quote"));
    assert_int_equal(dsec_df_words("${HOME", '\\', &v, &w, &n, &err), -1);
    assert_non_null(strstr(err.msg, "no closing"));
    dsec_df_vars_free(&v);
}

static void test_dockerignore(void **state)
{
    (void)state;
    const char *text = "# comment\n*.log\n/build\n**/node_modules\n!keep.log\ndocs/*.md\n";
    dsec_df_ignore ig;
    dsec_err err;
    assert_int_equal(dsec_df_ignore_parse(text, strlen(text), &ig, &err), 0);
    assert_int_equal(ig.n, 5);
    assert_true(dsec_df_ignored(&ig, "x.log"));
    assert_false(dsec_df_ignored(&ig, "keep.log"));  /* re-included */
    assert_false(dsec_df_ignored(&ig, "sub/x.log")); /* "*.log" is the top only */
    assert_true(dsec_df_ignored(&ig, "build"));
    assert_true(dsec_df_ignored(&ig, "build/out/a.o")); /* below an excluded directory */
    assert_true(dsec_df_ignored(&ig, "node_modules/x"));
    assert_true(dsec_df_ignored(&ig, "a/b/node_modules/y"));
    assert_true(dsec_df_ignored(&ig, "docs/a.md"));
    assert_false(dsec_df_ignored(&ig, "docs/sub/a.md"));
    assert_false(dsec_df_ignored(&ig, "src/main.c"));
    dsec_df_ignore_free(&ig);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_instructions),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_words_and_variables),
        cmocka_unit_test(test_dockerignore),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
