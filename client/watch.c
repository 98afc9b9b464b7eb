/* watch.c - libdsec: watching a directory in a sandbox (a background process of the agent's own,
 * followed by offset). */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "dsec/alloc.h"
#include "dsec/client.h"
#include "dsec/err.h"

/* The value of "key":"..." in a line the watcher printed (agent-watch.c escapes '"', '\' and
 * control bytes); 0 when found. */
static int json_str(const char *line, const char *key, char *out, size_t n)
{
    char pat[32];
    snprintf(pat, sizeof pat, "\"%s\":\"", key);
    const char *p = strstr(line, pat);
    if (p == NULL)
        return -1;
    p += strlen(pat);
    size_t k = 0;
    for (; *p && *p != '"'; p++) {
        char ch = *p;
        if (ch == '\\') {
            p++;
            if (*p == 'u' && p[1] && p[2] && p[3] && p[4]) {
                char hex[5] = {p[1], p[2], p[3], p[4], 0};
                ch = (char)strtol(hex, NULL, 16);
                p += 4;
            } else if (*p) {
                ch = *p;
            } else {
                return -1;
            }
        }
        if (k + 1 < n)
            out[k++] = ch;
    }
    out[k] = '\0';
    return *p == '"' ? 0 : -1;
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static bool parse_event(const char *line, dsec_dir_event *ev)
{
    memset(ev, 0, sizeof *ev);
    if (json_str(line, "event", ev->event, sizeof ev->event) < 0 ||
        json_str(line, "path", ev->path, sizeof ev->path) < 0)
        return false;
    ev->dir = strstr(line, "\"dir\":true") != NULL;
    return true;
}

int dsec_dir_events(dsec_client *c, const char *id, uint64_t handle, uint64_t *offset,
                    uint32_t wait_ms, dsec_dir_event_fn fn, void *ud, bool *running, dsec_err *err)
{
    dsec_proc_out o;
    if (dsec_proc_read_wait(c, id, handle, *offset, 0, 0, wait_ms, &o, err) < 0)
        return -1;
    int n = 0;
    if (o.out_from > *offset) {
        /* the ring dropped events nobody read: say so, and start at the next whole line */
        dsec_dir_event ev = {.event = "overflow", .dir = true};
        fn(ud, &ev);
        n++;
        const uint8_t *nl = memchr(o.out, '\n', o.out_len);
        size_t skip = nl == NULL ? o.out_len : (size_t)(nl - o.out) + 1;
        *offset = o.out_from + skip;
        memmove(o.out, o.out + skip, o.out_len - skip);
        o.out_len -= skip;
    }
    size_t used = 0;
    for (;;) {
        uint8_t *nl = memchr(o.out + used, '\n', o.out_len - used);
        if (nl == NULL)
            break;
        *nl = '\0';
        dsec_dir_event ev;
        if (parse_event((const char *)o.out + used, &ev) && strcmp(ev.event, "ready") != 0) {
            fn(ud, &ev);
            n++;
        }
        used = (size_t)(nl - o.out) + 1;
    }
    *offset += used;
    if (running != NULL)
        *running = o.info.running;
    dsec_proc_out_free(&o);
    return n;
}

int dsec_dir_watch(dsec_client *c, const char *id, const char *path, bool recursive, dsec_proc *out,
                   dsec_err *err)
{
    memset(out, 0, sizeof *out);
    if (path == NULL || path[0] != '/')
        return dsec_err_set(err, DSEC_E_INVALID, 0,
                            "watch: path \"%s\" is not absolute (a directory in the sandbox)",
                            path ? path : "");
    /* the agent's shepherd runs the agent binary itself as the watcher */
    const char *argv[] = {"/proc/self/exe", "--watch", path, recursive ? "--recursive" : NULL,
                          NULL};
    if (dsec_proc_start(c, id, &(dsec_proc_opts){.argv = argv}, out, err) < 0)
        return -1;
    /* wait for its first line: every watch is set, or it failed (and says why). Bounded by
     * the clock, not by a count of reads: a sandbox type whose reads do not wait answers at
     * once, so 40 reads there were over in a few milliseconds */
    for (uint64_t end = mono_ms() + 10000; mono_ms() < end;) {
        uint64_t asked = mono_ms();
        dsec_proc_out o;
        if (dsec_proc_read_wait(c, id, out->handle, 0, 0, 0, 250, &o, err) < 0)
            return -1;
        bool ready = o.out_len > 0 && memchr(o.out, '\n', o.out_len) != NULL;
        bool ended = !o.info.running;
        int code = o.info.exit_code;
        char why[512];
        snprintf(why, sizeof why, "%.*s",
                 (int)(o.err_len && o.err[o.err_len - 1] == '\n' ? o.err_len - 1 : o.err_len),
                 (const char *)o.err);
        dsec_proc_out_free(&o);
        if (ready)
            return 0;
        if (ended)
            return dsec_err_set(err, code == 2 ? DSEC_E_INVALID : DSEC_E_NOT_FOUND, 0,
                                "watch %s in %s: %s", path, id,
                                why[0] ? why : "the watcher ended at once");
        if (mono_ms() - asked < 20) /* answered without waiting: do not spin */
            nanosleep(&(struct timespec){0, 20 * 1000000}, NULL);
    }
    dsec_err e2;
    dsec_proc_signal(c, id, out->handle, 9, &e2);
    return dsec_err_set(err, DSEC_E_TIMEOUT, 0,
                        "watch %s in %s: the watcher did not start within 10 s", path, id);
}
