/* test_client_files.c - libdsec's file reads and writes of any size against a
 * stand-in node on a real nats-server: a file is read whole across pages
 * (never its first page reported as the file, its sha256 checked), written in
 * messages the bus can carry (over 4 MiB as an upload that commits at the end),
 * a failed upload resumes from what the node holds, and a node that answers
 * inconsistently fails the call, saying what it saw. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "actors/wire.h"
#include "bus/bus.h"
#include "dsec/alloc.h"
#include "dsec/client.h"
#include "dsec/sha256.h"
#include "tests/fixture.h"

#define TENANT "t1"
#define SBX "fake-0123456789abcdef"
#define MIB (1u << 20)
#define PAGE (4u * MIB) /* what the real node answers at most (actors/node-ops.c) */

static dsec_natsd *natsd;
static char root[64];
static dsec_bus *node_bus;
static dsec_actor *node_actor;

/* What the stand-in holds for "/w": the bytes written to it. Written and read
 * only by the stand-in's handlers, which run one at a time per subject; the
 * test looks at it between calls. */
static uint8_t *wbuf;
static size_t wlen, wcap;
static size_t writes, biggest_write; /* messages seen, the largest data field */
static size_t reads;

/* The bytes "/pattern/N" holds: word i is i times an odd constant, so a page
 * put at the wrong offset differs. Made once; compared with memcmp, which
 * stays fast in the sanitizer build. */
#define PATTERN_MAX (1024 * MIB + 64)
static uint8_t *pattern;

static void make_pattern(void)
{
    uint64_t *w = dsec_malloc(PATTERN_MAX);
    for (size_t i = 0; i < PATTERN_MAX / 8; i++)
        w[i] = i * 0x9e3779b97f4a7c15ull;
    pattern = (uint8_t *)w;
}

static void hex_of(const uint8_t d[DSEC_SHA256_LEN], char out[65])
{
    for (int i = 0; i < DSEC_SHA256_LEN; i++)
        snprintf(out + 2 * i, 3, "%02x", d[i]);
}

static void fake_write(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_msg_file_write w;
    dsec_err err;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_FILE_WRITE, dsec_msg_data(m), dsec_msg_len(m), &w,
                    &err) < 0) {
        dsec_wire_error(a, m, &err);
        return;
    }
    writes++;
    if (w.data.len > biggest_write)
        biggest_write = w.data.len;
    if (!w.append)
        wlen = 0;
    if (wlen + w.data.len > wcap) {
        wcap = wlen + w.data.len > 2 * wcap ? wlen + w.data.len : 2 * wcap;
        wbuf = dsec_realloc(wbuf, wcap ? wcap : 1);
    }
    if (w.data.len)
        memcpy(wbuf + wlen, w.data.ptr, w.data.len);
    wlen += w.data.len;
    dsec_msg_file_data out = {.id = SBX, .path = w.path, .size = w.data.len, .eof = true};
    if (dsec_wire_reply(a, m, DSEC_MSG_FILE_DATA, &out, &err) < 0)
        dsec_wire_error(a, m, &err);
}

/* Paths: "/w" (what was written), "/pattern/N" (N bytes of pattern), and
 * misbehaviours: "/shrink" (its size drops after the first page), "/stuck"
 * (empty pages, never the end), "/short" (the end after one page of three),
 * "/over" (a page past the size it states). */
static void fake_read(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_msg_file_read r;
    dsec_err err;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_FILE_READ, dsec_msg_data(m), dsec_msg_len(m), &r,
                    &err) < 0) {
        dsec_wire_error(a, m, &err);
        return;
    }
    reads++;
    uint64_t max = r.max == 0 || r.max > PAGE ? PAGE : r.max;
    uint64_t size;
    const uint8_t *src = NULL;
    if (strcmp(r.path, "/w") == 0) {
        size = wlen;
        src = wbuf;
    } else if (strncmp(r.path, "/pattern/", 9) == 0) {
        size = strtoull(r.path + 9, NULL, 10);
        src = pattern;
    } else if (strcmp(r.path, "/shrink") == 0) {
        size = r.offset == 0 ? 10 * MIB : 9 * MIB;
    } else if (strcmp(r.path, "/stuck") == 0 || strcmp(r.path, "/short") == 0) {
        size = 10 * MIB;
    } else if (strcmp(r.path, "/over") == 0) {
        size = 6 * MIB;
    } else {
        dsec_err_set(&err, DSEC_E_NOT_FOUND, 2, "reading %s", r.path);
        dsec_wire_error(a, m, &err);
        return;
    }
    uint64_t n = r.offset >= size ? 0 : size - r.offset;
    if (n > max)
        n = max;
    bool eof = r.offset + n >= size;
    if (strcmp(r.path, "/stuck") == 0)
        n = 0;
    if (strcmp(r.path, "/short") == 0)
        eof = true;
    if (strcmp(r.path, "/over") == 0)
        n = max; /* the second page runs 2 MiB past the end it states */
    if (src == NULL)
        src = pattern; /* the misbehaving files' pages hold pattern too */
    /* a hashed read: the running hash of the pages asked for in order */
    static dsec_sha256 rh;
    static uint64_t rnext;
    char hex[65] = "";
    if (r.sha256) {
        if (r.offset == 0) {
            dsec_sha256_init(&rh);
            rnext = 0;
        }
        if (r.offset == rnext) {
            dsec_sha256_update(&rh, src + r.offset, n);
            rnext += n;
        }
        if (eof && rnext == size) {
            uint8_t d[DSEC_SHA256_LEN];
            dsec_sha256_final(&rh, d);
            hex_of(d, hex);
        }
    }
    dsec_msg_file_data out = {.id = SBX,
                              .path = r.path,
                              .data = {src + r.offset, n},
                              .size = size,
                              .eof = eof,
                              .sha256 = hex[0] ? hex : NULL};
    if (dsec_wire_reply(a, m, DSEC_MSG_FILE_DATA, &out, &err) < 0)
        dsec_wire_error(a, m, &err);
}

/* The stand-in's upload: chunks must come at the offset it holds; the commit checks size
 * and sha256 and then replaces "/w" at once. "/drop" refuses the chunk at offset 8 MiB once
 * (a connection that broke there). */
static uint8_t *ubuf;
static size_t ulen, ucap;
static dsec_sha256 uhash;
static bool dropped;

static void fake_upload(dsec_actor *a, dsec_msg *m, void *ud)
{
    dsec_msg_file_write w;
    dsec_err err;
    if (dsec_decode(dsec_wire_decoder(), DSEC_MSG_FILE_WRITE, dsec_msg_data(m), dsec_msg_len(m), &w,
                    &err) < 0) {
        dsec_wire_error(a, m, &err);
        return;
    }
    if (!w.resume) {
        writes++;
        if (w.data.len > biggest_write)
            biggest_write = w.data.len;
    }
    if (w.resume) {
        dsec_msg_file_data out = {.id = SBX, .path = w.path, .size = ulen};
        if (dsec_wire_reply(a, m, DSEC_MSG_FILE_DATA, &out, &err) < 0)
            dsec_wire_error(a, m, &err);
        return;
    }
    if (strcmp(w.path, "/drop") == 0 && w.offset == 8 * MIB && !dropped) {
        dropped = true;
        dsec_err_set(&err, DSEC_E_IO, 5, "the disk hiccuped");
        dsec_wire_error(a, m, &err);
        return;
    }
    if (w.offset == 0) {
        ulen = 0;
        dsec_sha256_init(&uhash);
    }
    if (w.offset != ulen) {
        dsec_err_set(&err, DSEC_E_INVALID, 0, "chunk at offset %llu but the upload holds %zu bytes",
                     (unsigned long long)w.offset, ulen);
        dsec_wire_error(a, m, &err);
        return;
    }
    if (ulen + w.data.len > ucap) {
        ucap = ulen + w.data.len > 2 * ucap ? ulen + w.data.len : 2 * ucap;
        ubuf = dsec_realloc(ubuf, ucap ? ucap : 1);
    }
    if (w.data.len)
        memcpy(ubuf + ulen, w.data.ptr, w.data.len);
    ulen += w.data.len;
    dsec_sha256_update(&uhash, w.data.ptr, w.data.len);
    char hex[65] = "";
    if (w.commit) {
        uint8_t d[DSEC_SHA256_LEN];
        dsec_sha256_final(&uhash, d);
        hex_of(d, hex);
        if (strcmp(hex, w.sha256) != 0 || ulen != w.size) {
            dsec_err_set(&err, DSEC_E_INVALID, 0, "sha256 or size differ");
            dsec_wire_error(a, m, &err);
            return;
        }
        uint8_t *t = wbuf;
        size_t tc = wcap;
        wbuf = ubuf;
        wcap = ucap;
        wlen = ulen;
        ubuf = t;
        ucap = tc;
        ulen = 0;
    }
    dsec_msg_file_data out = {.id = SBX,
                              .path = w.path,
                              .size = w.commit ? wlen : ulen,
                              .eof = w.commit,
                              .sha256 = w.commit ? hex : NULL};
    if (dsec_wire_reply(a, m, DSEC_MSG_FILE_DATA, &out, &err) < 0)
        dsec_wire_error(a, m, &err);
}

static dsec_client *client;

static int group_setup(void **state)
{
    make_pattern();
    if (dsec_test_server_start("dsec-client-files", false, &natsd, root, sizeof root) < 0)
        return -1;
    dsec_err err;
    dsec_bus_opts o = {.url = dsec_natsd_url(natsd), .name = "stand-in node"};
    dsec_client_opts co = {
        .url = dsec_natsd_url(natsd), .tenant = TENANT, .timeout_ms = 30000, .retries = -1};
    if (dsec_bus_connect(&node_bus, &o, &err) < 0 ||
        dsec_actor_new(&node_actor, node_bus, "fake-node", &err) < 0 ||
        dsec_actor_on(node_actor, "dsec.v1." TENANT ".sbx.fake." SBX ".write", NULL, fake_write,
                      NULL, &err) < 0 ||
        dsec_actor_on(node_actor, "dsec.v1." TENANT ".sbx.fake." SBX ".read", NULL, fake_read, NULL,
                      &err) < 0 ||
        dsec_actor_on(node_actor, "dsec.v1." TENANT ".sbx.fake." SBX ".upload", NULL, fake_upload,
                      NULL, &err) < 0 ||
        dsec_bus_flush(node_bus, 5000, &err) < 0 || dsec_client_connect(&client, &co, &err) < 0) {
        fprintf(stderr, "test_client_files: setup: %s\n", err.msg);
        return -1;
    }
    return 0;
}

static int group_teardown(void **state)
{
    dsec_client_free(client);
    dsec_bus_free(node_bus);
    dsec_free(wbuf);
    dsec_free(ubuf);
    dsec_free(pattern);
    return dsec_test_server_stop(natsd, root);
}

/* The sizes the issue names: around the page, and far beyond it. */
static const size_t SIZES[] = {0, 1, PAGE - 1, PAGE, PAGE + 1, 7000000, 100 * MIB, 1024 * MIB};
#define NSIZES (sizeof SIZES / sizeof SIZES[0])

static void reads_are_whole_at_every_size(void **state)
{
    for (size_t i = 0; i < NSIZES; i++) {
        char path[64];
        snprintf(path, sizeof path, "/pattern/%zu", SIZES[i]);
        uint8_t *data = (uint8_t *)"x";
        size_t len = 12345;
        dsec_err err;
        reads = 0;
        if (dsec_file_read(client, SBX, path, &data, &len, &err) < 0)
            fail_msg("reading %zu bytes: %s", SIZES[i], err.msg);
        assert_int_equal(len, SIZES[i]);
        assert_non_null(data);
        assert_int_equal(data[len], 0); /* NUL one past the end */
        if (len > 0 && memcmp(data, pattern, len) != 0)
            fail_msg("reading %zu bytes: they differ from the file", SIZES[i]);
        /* one request per page, and one for an empty file */
        assert_int_equal(reads, SIZES[i] == 0 ? 1 : (SIZES[i] + PAGE - 1) / PAGE);
        dsec_free(data);
    }
}

static void writes_are_whole_at_every_size(void **state)
{
    const uint8_t *src = pattern + 7;
    for (size_t i = 0; i < NSIZES; i++) {
        /* what the file held before: a write replaces it */
        wlen = 0;
        dsec_err err;
        assert_int_equal(dsec_file_write(client, SBX, "/w", "old contents", 12, 0644, &err), 0);
        writes = biggest_write = 0;
        if (dsec_file_write(client, SBX, "/w", src, SIZES[i], 0644, &err) < 0)
            fail_msg("writing %zu bytes: %s", SIZES[i], err.msg);
        assert_int_equal(wlen, SIZES[i]);
        if (SIZES[i] > 0 && memcmp(wbuf, src, SIZES[i]) != 0)
            fail_msg("writing %zu bytes: the node holds other bytes", SIZES[i]);
        assert_true(biggest_write <= PAGE);
        assert_int_equal(writes, SIZES[i] == 0 ? 1 : (SIZES[i] + PAGE - 1) / PAGE);
        /* and back through reads */
        uint8_t *back;
        size_t len;
        if (dsec_file_read(client, SBX, "/w", &back, &len, &err) < 0)
            fail_msg("reading back %zu bytes: %s", SIZES[i], err.msg);
        assert_int_equal(len, SIZES[i]);
        if (len > 0 && memcmp(back, src, len) != 0)
            fail_msg("reading back %zu bytes: they differ", SIZES[i]);
        dsec_free(back);
    }
    /* append: onto what is there, across pages too */
    wlen = 0;
    dsec_err err;
    dsec_write_opts ap = {.append = true};
    assert_int_equal(dsec_file_write_ex(client, SBX, "/w", src, 3, &ap, &err), 0);
    assert_int_equal(dsec_file_write_ex(client, SBX, "/w", src + 3, PAGE + 5, &ap, &err), 0);
    assert_int_equal(wlen, PAGE + 8);
    assert_memory_equal(wbuf, src, PAGE + 8);
}

static void a_logged_write_is_one_message(void **state)
{
    size_t n = PAGE + 1;
    uint8_t *src = dsec_calloc(1, n);
    dsec_write_opts o = {.rollout_id = "r1", .step = 3};
    dsec_err err;
    writes = 0;
    assert_int_equal(dsec_file_write_ex(client, SBX, "/w", src, n, &o, &err), -1);
    assert_int_equal(err.code, DSEC_E_TOO_LARGE);
    assert_non_null(strstr(err.msg, "trajectory log"));
    assert_int_equal(writes, 0); /* nothing half-sent */
    dsec_free(src);
}

static void an_inconsistent_node_fails_the_read(void **state)
{
    uint8_t *data = (uint8_t *)"x";
    size_t len = 1;
    dsec_err err;
    assert_int_equal(dsec_file_read(client, SBX, "/shrink", &data, &len, &err), -1);
    assert_int_equal(err.code, DSEC_E_STATE);
    assert_non_null(strstr(err.msg, "changed size"));
    assert_null(data);
    assert_int_equal(len, 0);

    assert_int_equal(dsec_file_read(client, SBX, "/stuck", &data, &len, &err), -1);
    assert_int_equal(err.code, DSEC_E_BACKEND);
    assert_non_null(strstr(err.msg, "empty page"));

    assert_int_equal(dsec_file_read(client, SBX, "/short", &data, &len, &err), -1);
    assert_int_equal(err.code, DSEC_E_STATE);
    assert_non_null(strstr(err.msg, "after 4194304 of its 10485760 bytes"));

    assert_int_equal(dsec_file_read(client, SBX, "/over", &data, &len, &err), -1);
    assert_int_equal(err.code, DSEC_E_BACKEND);

    assert_int_equal(dsec_file_read(client, SBX, "/missing", &data, &len, &err), -1);
    assert_int_equal(err.code, DSEC_E_NOT_FOUND);
}

struct pages {
    size_t calls, bytes;
    int stop_after;
};

static int on_page(void *ud, const uint8_t *data, size_t len, uint64_t size)
{
    struct pages *p = ud;
    assert_int_equal(size, 3 * PAGE + 10);
    if (len > 0 && memcmp(data, pattern + p->bytes, len) != 0)
        fail_msg("page %zu differs from the file", p->calls);
    p->calls++;
    p->bytes += len;
    return (int)p->calls == p->stop_after ? -1 : 0;
}

static void pages_come_in_order_and_the_reader_can_stop(void **state)
{
    char path[64];
    snprintf(path, sizeof path, "/pattern/%u", 3 * PAGE + 10);
    struct pages p = {0};
    dsec_err err;
    assert_int_equal(dsec_file_read_pages(client, SBX, path, on_page, &p, &err), 0);
    assert_int_equal(p.calls, 4);
    assert_int_equal(p.bytes, 3 * PAGE + 10);
    p = (struct pages){.stop_after = 2};
    reads = 0;
    assert_int_equal(dsec_file_read_pages(client, SBX, path, on_page, &p, &err), -1);
    assert_int_equal(err.code, DSEC_E_IO);
    assert_int_equal(p.calls, 2);
    /* no page asked for after the stop: the first alone, then a window of the rest */
    assert_true(reads >= 2 && reads <= 4);
}

struct src {
    const uint8_t *p;
    size_t len, off;
};

static ssize_t src_read(void *ud, void *buf, size_t n)
{
    struct src *s = ud;
    size_t k = s->len - s->off < n ? s->len - s->off : n;
    memcpy(buf, s->p + s->off, k);
    s->off += k;
    return (ssize_t)k;
}

/* A failed upload goes on from what the other end holds, sending only the rest, and the
 * file changes only at the commit. */
static void a_failed_upload_resumes(void **state)
{
    const uint8_t *src = pattern + 3;
    size_t n = 21 * MIB + 5;
    dsec_err err;
    wlen = ulen = 0;
    dropped = false;
    assert_int_equal(dsec_file_write(client, SBX, "/w", "old", 3, 0644, &err), 0);
    struct src s = {src, n, 0};
    dsec_upload_opts o = {.upload_id = "u-resume", .chunk = 2 * MIB};
    dsec_transfer_result res;
    assert_int_equal(dsec_file_upload(client, SBX, "/drop", &o, src_read, &s, &res, &err), -1);
    assert_non_null(strstr(err.msg, "resume with the same upload id"));
    assert_int_equal(ulen, 8 * MIB); /* what arrived before the failure is held */
    assert_int_equal(wlen, 3);       /* the target is untouched */
    uint64_t held = 0;
    assert_int_equal(dsec_file_upload_held(client, SBX, "/drop", "u-resume", &held, &err), 0);
    assert_int_equal(held, 8 * MIB);
    s = (struct src){src, n, 0};
    o.resume = true;
    writes = 0;
    if (dsec_file_upload(client, SBX, "/drop", &o, src_read, &s, &res, &err) < 0)
        fail_msg("resuming: %s", err.msg);
    assert_int_equal(res.resumed_from, 8 * MIB);
    assert_int_equal(res.size, n);
    assert_int_equal(writes, (n - 8 * MIB + 2 * MIB - 1) / (2 * MIB)); /* only the rest */
    assert_int_equal(wlen, n);
    assert_memory_equal(wbuf, src, n);
    assert_string_equal(res.upload_id, "u-resume");
    assert_int_equal(strlen(res.sha256), 64);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(reads_are_whole_at_every_size),
        cmocka_unit_test(writes_are_whole_at_every_size),
        cmocka_unit_test(a_logged_write_is_one_message),
        cmocka_unit_test(an_inconsistent_node_fails_the_read),
        cmocka_unit_test(pages_come_in_order_and_the_reader_can_stop),
        cmocka_unit_test(a_failed_upload_resumes),
    };
    return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
