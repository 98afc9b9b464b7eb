/* test_journal.c - the node's sandbox journal: replay, torn tails, corruption, compaction. */
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "runtime/journal.h"

struct seen {
    char ids[64][32];
    char data[64][64];
    int n;
};

static int collect(const char *id, const void *data, size_t len, void *ud, dsec_err *err)
{
    struct seen *s = ud;
    assert_true(s->n < 64);
    snprintf(s->ids[s->n], sizeof s->ids[0], "%s", id);
    snprintf(s->data[s->n], sizeof s->data[0], "%.*s", (int)len, (const char *)data);
    s->n++;
    return 0;
}

static const char *find(const struct seen *s, const char *id)
{
    for (int i = 0; i < s->n; i++)
        if (strcmp(s->ids[i], id) == 0)
            return s->data[i];
    return NULL;
}

/* Every temp dir a test made, removed by the group teardown. */
static char dirs[16][32];
static int ndirs;

static char *tmp_path(void)
{
    static char path[128];
    assert_true(ndirs < 16);
    char *dir = dirs[ndirs++];
    strcpy(dir, "/tmp/dsec-journal-XXXXXX");
    assert_non_null(mkdtemp(dir));
    snprintf(path, sizeof path, "%s/j", dir);
    return path;
}

static int remove_dirs(void **state)
{
    int rc = 0;
    for (int i = 0; i < ndirs; i++) {
        char cmd[64];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", dirs[i]);
        if (system(cmd) != 0)
            rc = -1;
    }
    ndirs = 0;
    return rc;
}

static void replay_keeps_latest_and_drops_deleted(void **state)
{
    char *path = tmp_path();
    dsec_err err;
    dsec_journal *j;
    assert_int_equal(dsec_journal_open(&j, path, NULL, NULL, &err), 0);
    assert_int_equal(dsec_journal_put(j, "a", "one", 3, &err), 0);
    assert_int_equal(dsec_journal_put(j, "b", "two", 3, &err), 0);
    assert_int_equal(dsec_journal_put(j, "a", "three", 5, &err), 0);
    assert_int_equal(dsec_journal_del(j, "b", &err), 0);
    assert_int_equal(dsec_journal_put(j, "c", "", 0, &err), 0);
    dsec_journal_close(j);

    struct seen s = {0};
    assert_int_equal(dsec_journal_open(&j, path, collect, &s, &err), 0);
    assert_int_equal(s.n, 2);
    assert_string_equal(find(&s, "a"), "three");
    assert_null(find(&s, "b"));
    assert_string_equal(find(&s, "c"), "");
    assert_int_equal(dsec_journal_replayed(j), 2);
    dsec_journal_close(j);
}

static void torn_tail_is_cut_and_appends_continue(void **state)
{
    char *path = tmp_path();
    dsec_err err;
    dsec_journal *j;
    assert_int_equal(dsec_journal_open(&j, path, NULL, NULL, &err), 0);
    assert_int_equal(dsec_journal_put(j, "a", "alpha", 5, &err), 0);
    assert_int_equal(dsec_journal_put(j, "b", "beta", 4, &err), 0);
    dsec_journal_close(j);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    /* a crash in the middle of writing the second record */
    assert_int_equal(truncate(path, st.st_size - 2), 0);

    struct seen s = {0};
    assert_int_equal(dsec_journal_open(&j, path, collect, &s, &err), 0);
    assert_int_equal(s.n, 1);
    assert_string_equal(find(&s, "a"), "alpha");
    assert_int_equal(dsec_journal_put(j, "c", "gamma", 5, &err), 0);
    dsec_journal_close(j);

    memset(&s, 0, sizeof s);
    assert_int_equal(dsec_journal_open(&j, path, collect, &s, &err), 0);
    assert_int_equal(s.n, 2);
    assert_string_equal(find(&s, "c"), "gamma");
    dsec_journal_close(j);
}

static void corruption_before_tail_is_an_error(void **state)
{
    char *path = tmp_path();
    dsec_err err;
    dsec_journal *j;
    assert_int_equal(dsec_journal_open(&j, path, NULL, NULL, &err), 0);
    assert_int_equal(dsec_journal_put(j, "a", "alpha", 5, &err), 0);
    assert_int_equal(dsec_journal_put(j, "b", "beta", 4, &err), 0);
    dsec_journal_close(j);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    assert_int_equal(pwrite(fd, "X", 1, 12), 1); /* inside the first record's id */
    close(fd);
    assert_int_equal(dsec_journal_open(&j, path, NULL, NULL, &err), -1);
    assert_int_equal(err.code, DSEC_E_IO);
    assert_non_null(strstr(err.msg, "corrupt record at offset 0"));
}

struct live_set {
    const char *ids[3];
    const char *data[3];
};

static int each_live(dsec_journal *j, dsec_journal_emit_fn emit, void *ud, dsec_err *err)
{
    struct live_set *ls = ud;
    for (int i = 0; i < 3; i++)
        if (emit(j, ls->ids[i], ls->data[i], strlen(ls->data[i]), err) < 0)
            return -1;
    return 0;
}

static void compaction_keeps_live_and_shrinks(void **state)
{
    char *path = tmp_path();
    dsec_err err;
    dsec_journal *j;
    assert_int_equal(dsec_journal_open(&j, path, NULL, NULL, &err), 0);
    char id[32];
    for (int i = 0; i < 6000; i++) {
        snprintf(id, sizeof id, "s%d", i);
        assert_int_equal(dsec_journal_put(j, id, "x", 1, &err), 0);
        if (i >= 3)
            assert_int_equal(dsec_journal_del(j, id, &err), 0);
    }
    assert_true(dsec_journal_wants_compaction(j, 3));
    assert_false(dsec_journal_wants_compaction(j, 6000));
    struct stat before, after;
    assert_int_equal(stat(path, &before), 0);
    struct live_set ls = {{"s0", "s1", "s2"}, {"x", "x", "x"}};
    assert_int_equal(dsec_journal_compact(j, each_live, &ls, &err), 0);
    assert_int_equal(stat(path, &after), 0);
    assert_true(after.st_size < before.st_size / 100);
    assert_false(dsec_journal_wants_compaction(j, 3));
    assert_int_equal(dsec_journal_put(j, "s9", "y", 1, &err), 0);
    assert_int_equal(dsec_journal_sync(j, &err), 0);
    dsec_journal_close(j);

    struct seen s = {0};
    assert_int_equal(dsec_journal_open(&j, path, collect, &s, &err), 0);
    assert_int_equal(s.n, 4);
    assert_string_equal(find(&s, "s9"), "y");
    assert_string_equal(find(&s, "s2"), "x");
    dsec_journal_close(j);
}

static void bad_ids_and_sizes_are_refused(void **state)
{
    char *path = tmp_path();
    dsec_err err;
    dsec_journal *j;
    assert_int_equal(dsec_journal_open(&j, path, NULL, NULL, &err), 0);
    assert_int_equal(dsec_journal_put(j, "", "x", 1, &err), -1);
    assert_int_equal(err.code, DSEC_E_INVALID);
    char big[70000];
    memset(big, 'a', sizeof big);
    assert_int_equal(dsec_journal_put(j, "a", big, sizeof big, &err), -1);
    assert_int_equal(err.code, DSEC_E_TOO_LARGE);
    dsec_journal_close(j);
    assert_int_equal(dsec_journal_open(&j, "/nonexistent-dir/j", NULL, NULL, &err), -1);
    assert_non_null(strstr(err.msg, "/nonexistent-dir/j"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(replay_keeps_latest_and_drops_deleted),
        cmocka_unit_test(torn_tail_is_cut_and_appends_continue),
        cmocka_unit_test(corruption_before_tail_is_an_error),
        cmocka_unit_test(compaction_keeps_live_and_shrinks),
        cmocka_unit_test(bad_ids_and_sizes_are_refused),
    };
    return cmocka_run_group_tests(tests, NULL, remove_dirs);
}
