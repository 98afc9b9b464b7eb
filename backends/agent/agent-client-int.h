/* agent-client-int.h - what the files of the agent client share: the connection, its request
 * and answer frames, and exchanges driven by the node's loop (agent-client.c). */
#ifndef DSEC_BACKENDS_AGENT_CLIENT_INT_H
#define DSEC_BACKENDS_AGENT_CLIENT_INT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backends/agent/agent-client.h"
#include "backends/loop.h"
#include "dsec/err.h"

#define FILE_OP_TIMEOUT_MS                                                                         \
    60000u /* the agent answers file calls at once; this only catches a wedged one */
#define EXEC_GRACE_MS 30000u /* past the command's own timeout, which the agent enforces */

struct agent_mux;

struct dsec_agent {
    int fd;           /* -1 once broken */
    bool busy;        /* an exec started with dsec_agent_exec_start is in flight */
    uint32_t next_id; /* atomically incremented: a multiplexed connection is shared */
    /* Set by dsec_agent_mux_on: every exchange goes through the loop, several at once. */
    struct agent_mux *mux;
    uint8_t *buf; /* received bytes: [off, len) not yet consumed */
    size_t off, len, cap;
};

/* How one frame of an answer leaves an exchange (agent-client-exec.c tells the frames of an
 * exec apart; the loop's exchanges answer the same). */
enum { EXEC_MORE = 0, EXEC_EXITED = 1, EXEC_REFUSED = 2, EXEC_BROKEN = -1 };

/* ---- agent-client.c: the connection, one request and its answer ---------------------------- */

uint64_t dsec__agent_deadline_after(uint64_t ms);
void dsec__agent_mark_broken(dsec_agent *a);
int dsec__agent_check_open(dsec_agent *a, dsec_err *err);
int dsec__agent_send_all(dsec_agent *a, const uint8_t *p, size_t n, uint64_t deadline,
                         dsec_err *err);
int dsec__agent_recv_frame(dsec_agent *a, uint64_t deadline, uint8_t *type, uint32_t *id,
                           const uint8_t **payload, size_t *plen, dsec_err *err);
int dsec__agent_error_frame(const uint8_t *payload, size_t plen, dsec_err *err);
int dsec__agent_roundtrip(dsec_agent *a, uint8_t *frame, size_t flen, uint8_t want,
                          const uint8_t **payload, size_t *plen, dsec_err *err);
int dsec__agent_request_ok(dsec_agent *a, uint8_t *frame, size_t flen, dsec_err *err);
uint8_t *dsec__agent_new_frame(dsec_agent *a, uint8_t type, size_t payload_len, uint8_t **payload,
                               dsec_err *err);

/* The handshake every connection starts with (see sync_hello): a SYNC with a fresh nonce, and
 * the scan of what came back for the HELLO that carries it. */
void dsec__agent_sync_new(uint8_t sync[9], uint8_t tag[5], uint8_t etag[5]);
enum {
    DSEC__AGENT_HELLO_NONE,  /* not yet: win keeps at most a 16-byte tail, read on */
    DSEC__AGENT_HELLO_OK,    /* the answer: *version is the agent's protocol */
    DSEC__AGENT_HELLO_GREET, /* the agent started serving the channel: send a new SYNC */
    DSEC__AGENT_HELLO_OLD,   /* an agent older than SYNC: read and drop *drain bytes, done */
};
int dsec__agent_hello_scan(uint8_t *win, size_t *have, const uint8_t tag[5], const uint8_t etag[5],
                           uint32_t *version, size_t *drain);
/* 0 when version is this node's protocol, else -1 with err naming path. */
int dsec__agent_hello_version(uint32_t version, const char *path, dsec_err *err);
/* One non-blocking connect to the unix socket at path (any length); the fd, or -1 with errno. */
int dsec__agent_connect_once(const char *path);

/* ---- agent-client.c: calls without a thread, driven by the node's loop --------------------- */

/* One exchange on the loop: the request goes out as the socket takes it, then the answer's
 * frames are read as they come and handed to frame_in until it says how the exchange ended.
 * The agent is the exchange's until then (a->busy). */
struct loop_run {
    dsec_agent *a;
    uint8_t *frame; /* the request, until sent */
    size_t flen, sent;
    uint64_t deadline_ns; /* when a wedged agent is given up on; 0: never */
    dsec_loop_watch *w;
    const char *what; /* "the command", "the file transfer": what a stopping node abandons */
    /* One frame of the answer: EXEC_MORE to read on, otherwise how the exchange ended (err
     * set for EXEC_REFUSED and EXEC_BROKEN). It may send the next request (dsec__agent_loop_next).
     */
    int (*frame_in)(struct loop_run *r, uint8_t type, uint32_t rid, const uint8_t *pl, size_t pn,
                    dsec_err *err);
    /* Once, at the end, with frame_in's last answer or EXEC_BROKEN; frees the run. The last
     * frame's payload is still valid. */
    void (*end)(struct loop_run *r, int st, dsec_err *err);
    /* On a multiplexed connection (agent-client-mux.c): the request id its answers carry, and
     * its place in the connection's list. */
    uint32_t mux_id;
    struct loop_run *mux_next;
};

int dsec__agent_loop_run_start(struct loop_run *r, dsec_agent *a, struct dsec_loop *loop,
                               dsec_err *err);
int dsec__agent_loop_run_own(struct loop_run *r, dsec_agent *a, struct dsec_loop *loop,
                             dsec_err *err);
void dsec__agent_loop_next(struct loop_run *r, uint8_t *frame, size_t flen);
/* The frame a run's frame_in got, checked: 0 when it answers request id with type want,
 * else how the exchange ends (EXEC_REFUSED: the agent's error; EXEC_BROKEN: another request's
 * or another type's), err set. what names the request in the message. */
int dsec__agent_loop_answer(uint32_t id, uint8_t want, const char *what, uint8_t type, uint32_t rid,
                            const uint8_t *pl, size_t pn, dsec_err *err);

/* The next frame if the buffer holds all of it: 1, with payload valid until the next call
 * on a; 0 when more bytes are needed (the buffer then has room for them); -1 on a bad frame
 * or out of memory. */
int dsec__agent_next_frame(dsec_agent *a, uint8_t *type, uint32_t *id, const uint8_t **payload,
                           size_t *plen, dsec_err *err);

/* ---- agent-client-mux.c: several exchanges at once on one connection ------------------------ */

/* A run on a's multiplexed connection: as dsec__agent_loop_run_start (the loop is the mux's). */
int dsec__agent_mux_run(struct loop_run *r, dsec_agent *a, dsec_err *err);
/* dsec__agent_loop_next for a run on a multiplexed connection. */
void dsec__agent_mux_next(struct loop_run *r);
/* dsec__agent_roundtrip on a multiplexed connection, from a thread other than the loop's: the
 * answer's payload stays valid until the calling thread's next call. frame stays the caller's. */
int dsec__agent_mux_roundtrip(dsec_agent *a, const uint8_t *frame, size_t flen, uint8_t want,
                              const uint8_t **payload, size_t *plen, dsec_err *err);
/* Before a multiplexed connection is freed: its exchanges end (DSEC_E_CLOSED) and its watch
 * goes, on the loop's thread; waits for that from any other thread. true: called inside one of
 * the connection's own callbacks, the free of a is left to that callback's end. */
bool dsec__agent_mux_close(dsec_agent *a);

/* ---- agent-client-exec.c: what EXEC and PSTART share ---------------------------------------- */

int dsec__agent_check_exec_req(const dsec_exec_req *req, bool empty_ok, size_t *plen,
                               dsec_err *err);
uint8_t *dsec__agent_put_exec_body(uint8_t *p, const dsec_exec_req *req);

#endif
