/* fuzz_agent_client.c - libFuzzer harness: the node-side agent client against a hostile agent. */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "backends/agent/agent-client.h"
#include "backends/agent/agent-proto.h"
#include "dsec/alloc.h"

/*
 * A container's or a VM's agent runs where the sandbox's code runs: in a VM
 * the whole guest kernel is the sandbox's, so every byte on the agent channel
 * may be forged. The client must answer any byte stream with a result or a
 * clear error, never a crash, a hang or a leak.
 *
 * The input is what the "agent" sends after the handshake. A peer thread
 * reads the client's SYNC, answers with the HELLO carrying its nonce (so
 * inputs reach the frame decoders rather than the handshake's byte scan),
 * waits for the first request, writes the input with every "NNNN" replaced
 * by that nonce, and closes its side for writing. The client then runs one of each call; request
 * ids are 1, 2, 3... in that order (exec, five file calls, five background process calls), so
 * inputs can answer them. Reads on the peer side keep the client's writes from ever blocking.
 */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define INPUT_MAX (128u << 10) /* under the socket buffer: the peer writes it in one go */

struct peer {
    int fd;
    const uint8_t *data;
    size_t size;
};

static void drain(int fd)
{
    uint8_t buf[65536];
    while (read(fd, buf, sizeof buf) > 0)
        ;
}

static void *peer_main(void *arg)
{
    struct peer *p = arg;
    uint8_t sync[DSEC__AGENT_HDR];
    size_t got = 0;
    while (got < sizeof sync) {
        ssize_t n = read(p->fd, sync + got, sizeof sync - got);
        if (n <= 0)
            return NULL;
        got += (size_t)n;
    }
    uint32_t nonce = dsec__agent_get_u32le(sync + 5);
    uint8_t hello[DSEC__AGENT_HDR + 8];
    uint8_t *w = dsec__agent_put_hdr(hello, DSEC__AGENT_T_HELLO, nonce, 8);
    w = dsec__agent_put_u32(w, DSEC__AGENT_VERSION);
    dsec__agent_put_u32(w, DSEC__AGENT_FRAME_MAX);
    /* MSG_NOSIGNAL: the client may hang up on a bad answer while the rest is still going out */
    if (send(p->fd, hello, sizeof hello, MSG_NOSIGNAL) != (ssize_t)sizeof hello)
        return NULL;
    /* the input goes out once the first request came: the handshake is over by then, and
     * the bytes are answers, not stale input for the handshake's scan to skip */
    uint8_t first[1];
    if (read(p->fd, first, sizeof first) <= 0)
        return NULL;
    uint8_t *copy = dsec_malloc(p->size + 1);
    if (copy != NULL) {
        memcpy(copy, p->data, p->size);
        uint8_t le[4];
        dsec__agent_put_u32(le, nonce);
        for (size_t i = 0; i + 4 <= p->size; i++)
            if (memcmp(copy + i, "NNNN", 4) == 0)
                memcpy(copy + i, le, 4);
        size_t off = 0;
        while (off < p->size) {
            ssize_t n = send(p->fd, copy + off, p->size - off, MSG_NOSIGNAL);
            if (n <= 0)
                break;
            off += (size_t)n;
        }
        dsec_free(copy);
    }
    shutdown(p->fd, SHUT_WR);
    drain(p->fd);
    return NULL;
}

/* DSEC_FUZZ_VERBOSE=1: what each call made of the input (for writing seeds). */
static void say(const char *call, int rc, const dsec_err *err)
{
    static int verbose = -1;
    if (verbose < 0)
        verbose = getenv("DSEC_FUZZ_VERBOSE") != NULL;
    if (verbose)
        fprintf(stderr, "%s: %s\n", call, rc == 0 ? "ok" : err->msg);
}

static void on_output(void *arg, int stream, const uint8_t *data, size_t len)
{
    size_t *seen = arg;
    (void)stream;
    if (data != NULL)
        *seen += len;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size > INPUT_MAX)
        return 0;
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0)
        return 0;
    struct peer p = {.fd = sv[1], .data = data, .size = size};
    pthread_t t;
    if (pthread_create(&t, NULL, peer_main, &p) != 0) {
        close(sv[0]);
        close(sv[1]);
        return 0;
    }
    dsec_agent *a = NULL;
    dsec_err err;
    int rc = dsec__agent_from_fd(&a, sv[0], "fuzz", 2000, &err);
    say("handshake", rc, &err);
    if (rc == 0) {
        /* id 1: exec, streaming */
        const char *argv[] = {"/bin/sh", "-c", "true"};
        dsec_exec_req req = {.argv = argv, .argc = 3, .timeout_ms = 1000, .output_max = 4096};
        dsec_exec_result res;
        size_t seen = 0;
        rc = dsec_agent_exec(a, &req, on_output, &seen, &res, &err);
        say("exec", rc, &err);
        if (rc == 0)
            dsec_exec_result_release(&res);
        /* ids 2..6: the file calls, each answer decoded or refused */
        dsec_file_data fd = {0};
        rc = dsec_agent_file_read(a, "/f", 0, 0, &fd, &err);
        say("file_read", rc, &err);
        if (rc == 0)
            dsec_free(fd.data);
        dsec_file_entry *ents = NULL;
        size_t n = 0;
        rc = dsec_agent_file_list(a, "/d", &ents, &n, &err);
        say("file_list", rc, &err);
        if (rc == 0)
            dsec_file_entries_free(ents, n);
        dsec_file_entry one = {0};
        rc = dsec_agent_file_stat(a, "/s", &one, &err);
        say("file_stat", rc, &err);
        if (rc == 0)
            dsec_free(one.name);
        rc = dsec_agent_file_write(a, "/w", "x", 1, 0644, false, &err);
        say("file_write", rc, &err);
        rc = dsec_agent_file_remove(a, "/r", true, &err);
        say("file_remove", rc, &err);
        /* ids 7..11: the background process calls */
        dsec_proc_start_req preq = {.exec = req, .ring_max = 4096, .keep_stdin = true};
        dsec_proc_info info;
        rc = dsec_agent_proc_start(a, &preq, &info, &err);
        say("proc_start", rc, &err);
        if (rc == 0 && strlen(info.cmdline) >= sizeof info.cmdline)
            abort();
        dsec_proc_info *procs = NULL;
        rc = dsec_agent_proc_list(a, &procs, &n, &err);
        say("proc_list", rc, &err);
        if (rc == 0) {
            for (size_t i = 0; i < n; i++)
                if (strlen(procs[i].cmdline) >= sizeof procs[i].cmdline)
                    abort();
            dsec_free(procs);
        }
        rc = dsec_agent_proc_signal(a, 1, 15, &err);
        say("proc_signal", rc, &err);
        rc = dsec_agent_proc_stdin(a, 1, "in", 2, true, &err);
        say("proc_stdin", rc, &err);
        dsec_proc_output po;
        rc = dsec_agent_proc_output(a, 1, 0, 0, 100, &po, &err);
        say("proc_output", rc, &err);
        if (rc == 0) {
            /* what the client accepted is consistent with what it says the streams hold */
            if (po.out_len > 100 || po.err_len > 100 ||
                po.out_from + po.out_len > po.info.out_total ||
                po.err_from + po.err_len > po.info.err_total)
                abort();
            dsec_proc_output_release(&po);
        }
        /* ids 12, 13: a terminal's resize, a session's command (its EXIT flags decoded) */
        rc = dsec_agent_proc_resize(a, 1, 24, 80, &err);
        say("proc_resize", rc, &err);
        const char *line[] = {"cd /tmp"};
        dsec_exec_req sreq = {.argv = line, .argc = 1, .session = 1, .output_max = 4096};
        rc = dsec_agent_exec(a, &sreq, on_output, &seen, &res, &err);
        say("session exec", rc, &err);
        if (rc == 0)
            dsec_exec_result_release(&res);
        dsec_agent_free(a);
    }
    /* the client's side is closed (freed, or by the failed handshake): the peer sees EOF */
    pthread_join(t, NULL);
    close(sv[1]);
    return 0;
}
