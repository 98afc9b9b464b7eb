/* agent-proto.h - the wire format between dsec-agent and its node-side client (private to the two).
 */
#ifndef DSEC_BACKENDS_AGENT_PROTO_H
#define DSEC_BACKENDS_AGENT_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>

/*
 * Not msgpack: the agent is a small static program with no dependencies, and
 * only codecs/ may know msgpack layouts. Every integer is little-endian.
 *
 * Frame:
 *   u32 len    bytes that follow this field (type + id + payload), 5..FRAME_MAX
 *   u8  type   a DSEC__AGENT_T_* value
 *   u32 id     request id, chosen by the client; answers carry the id of
 *              their request (0 for HELLO and for errors about broken framing)
 *   payload    the typed fields below, in order, nothing after them
 *
 * Field types: u8, u32, i32, u64, i64 fixed width; str and bytes are a u32
 * length then that many bytes (no terminator; a str holds no NUL byte).
 *
 * Agent -> client:
 *   HELLO    u32 version, u32 frame_max. Sent first on every connection.
 *   ERROR    u32 kind (DSEC__AGENT_ERR_*), i32 errno (0 if none), str message
 *            (names the path or field at fault). Answers any request.
 *   OK       u64 value (KILL: commands signalled; others 0).
 *   OUTPUT   u8 stream (1 stdout, 2 stderr), bytes data. Zero or more per
 *            EXEC while it runs; never more than the request's output_max
 *            per stream in all.
 *   EXIT     i32 exit_code (-1 when killed by a signal), i32 signal,
 *            u8 flags (DSEC__AGENT_X_*), u64 duration_us, u64 cpu_us,
 *            u64 peak_rss_kb. Ends an EXEC. A session command's (EXEC with a
 *            session) has exit_code its status in the shell, flags
 *            INTERRUPTED when PSIGNAL SIGINT ended it, SESSION_ENDED when the
 *            shell is gone after it (it ran exit, or was killed), and cpu_us and
 *            peak_rss_kb 0.
 *   DATA     u64 size (the whole file), u8 eof, bytes data. Answers FILE_READ.
 *   ENTRIES  u32 n, then n times: str name, u8 kind (dsec_file_kind values),
 *            u64 size, u32 mode, i64 mtime. Answers FILE_LIST and FILE_STAT.
 *   PROC     a process info (below). Answers PSTART.
 *   PROCS    u32 n (at most DSEC__AGENT_PROC_MAX), then n process infos, by
 *            handle. Answers PLIST.
 *   POUT     a process info, u64 out_from, bytes out, u64 err_from, bytes err:
 *            each stream's bytes from stream offset *_from on (the offset
 *            asked, or the oldest byte the ring still holds when that is
 *            later). Answers POUTPUT.
 *
 * A process info (background processes):
 *            u64 handle, i32 pid, u8 flags (DSEC__AGENT_P_*), i32 exit_code
 *            (-1 when a signal ended it), i32 signal, u64 started_ns,
 *            u64 ended_ns (wall clock; 0 while running), u64 out_total,
 *            u64 err_total (bytes each stream produced in all), str cmdline
 *            (argv joined by spaces, at most DSEC__AGENT_CMDLINE_MAX bytes).
 *            Flags PTY and SESSION say how it was started, BUSY that a session
 *            is running a command.
 *
 * Client -> agent:
 *   EXEC     u64 timeout_ms (0: none), u64 output_max (per stream),
 *            str cwd (empty: the agent's default), str user (empty: default),
 *            u32 argc, argc times str, u32 nenv, nenv times (str key, str value),
 *            bytes stdin, then optionally u64 session (0 or absent: none).
 *            Answered by OUTPUT* then EXIT, or by ERROR. With a session (the
 *            handle of a PSTART with the session flag), argc is 1, a shell
 *            command line, and cwd, user, env and stdin are empty (else ERROR
 *            INVALID naming the field); it runs in that session's shell, whose
 *            directory, variables and functions carry to the next command, with
 *            stdin /dev/null; timeout_ms and KILL end the command, not the
 *            session. What the shell prints (a command's output, and its
 *            background jobs' later output alike) also goes to the session's
 *            rings; the markers never do. An unknown handle: NOT_FOUND; not a session: INVALID; a
 *            session running a command, or ended: STATE.
 *   KILL     u32 signal. Signals the process group of every running command
 *            (EXEC's: background processes have PSIGNAL).
 *   FWRITE   u32 mode (0: 0644 for a new file, kept for an old one), u8 append,
 *            str path, bytes data. Answered by OK.
 *   FREAD    u64 offset, u64 max (0: as much as allowed), str path -> DATA.
 *   FLIST    str path -> ENTRIES (a directory's entries sorted by name, or
 *            one entry for a path that is not a directory).
 *   FSTAT    str path -> ENTRIES with one entry (lstat).
 *   FREMOVE  u8 recursive, str path -> OK.
 *   FMKDIR   u8 parents, u32 mode (0: 0755), str path -> OK. With parents the
 *            missing parents are created too and an existing directory is no
 *            error; without, an existing path is ERROR IO (EEXIST).
 *   FRENAME  u8 sync, str from, str to -> OK. rename(2): to is replaced
 *            atomically. With sync, from is fsync'd first and to's directory
 *            after, so what the answer promises survives a crash.
 *   Uploads: a file FWRITE wrote whose name starts with ".dsec-upload-" (a
 *            temporary file of an upload in progress) is removed when no
 *            FWRITE touched it for DSEC__AGENT_UPLOAD_STALE_S seconds (the
 *            agent's hidden flag --upload-stale-s changes it); an FRENAME or
 *            FREMOVE of it ends its watch.
 *   SYNC     no payload; id a random nonzero nonce -> HELLO with that id. "A
 *            new client starts here": the agent drops whatever it still had
 *            queued for the connection and detaches the connection's running
 *            commands. A virtio-serial port (a VM's channel) gives no sign
 *            that one host client left and the next came, so the client
 *            discards every byte before the HELLO carrying its nonce.
 *            Background processes (PSTART) are no connection's: SYNC and a
 *            disconnect leave them alone.
 *   PSTART   EXEC's fields but output_max (u64 timeout_ms, str cwd, str user,
 *            u32 argc, argc times str, u32 nenv, nenv times (str key, str
 *            value), bytes stdin), then u64 ring_max (bytes kept per stream;
 *            0: DSEC__AGENT_RING_DEFAULT, at most DSEC__AGENT_RING_MAX),
 *            u8 keep_stdin (stdin stays open for PSTDIN after the stdin bytes),
 *            then optionally (absent: 0) u8 flags (DSEC__AGENT_S_*), u32 rows,
 *            u32 cols. PTY: the process leads a new session on a pseudo-terminal
 *            of rows x cols (0: 24 x 80) as its stdin, stdout and stderr; its
 *            output, echo included, is the stdout ring (stderr stays empty);
 *            stdin stays open (keep_stdin implied) and PSTDIN's close writes ^D;
 *            TERM=xterm-256color unless env sets TERM. SESSION: a shell session
 *            (argc 0: /bin/bash, or /bin/sh without it; else that shell, which
 *            reads its commands from stdin), run by EXEC with its handle; no
 *            stdin bytes, PSTDIN refused; not with PTY.
 *            Starts a background process (handles 1, 2, ..., never reused)
 *            under a shepherd, its stdout and stderr always read into two
 *            rings -> PROC. At DSEC__AGENT_PROC_MAX processes the oldest
 *            ended one is forgotten; when all of them run: ERROR TOO_LARGE.
 *   PLIST    no payload -> PROCS.
 *   PSIGNAL  u64 handle, u32 signal -> OK. The process group of the process
 *            gets the signal; its main process exiting (whatever the signal)
 *            ends its whole tree, and SIGKILL kills the tree at once. An
 *            ended process: ERROR STATE; an unknown handle: ERROR NOT_FOUND.
 *            A session's SIGINT interrupts its running command only (SIGINT to
 *            the shell's group again and again; after 2 s SIGKILL to what is
 *            below the shell; after 4 s the session is killed), and is a no-op
 *            while it is idle.
 *   PSTDIN   u64 handle, u8 close, bytes data (at most DSEC__AGENT_STDIN_MAX)
 *            -> OK once the process took every byte (then, with close, its
 *            stdin is closed). One PSTDIN waits at a time per process: a
 *            second one while the first is unanswered gets ERROR STATE. Bytes
 *            still pending with nobody waiting (PSTART's stdin, or a PSTDIN
 *            whose connection left) go first, and the answer waits for them
 *            too; at most DSEC__AGENT_STDIN_MAX bytes are pending in all.
 *            Closed stdin or an ended process: ERROR INVALID.
 *   POUTPUT  u64 handle, u64 out_off, u64 err_off, u64 max (per stream; 0:
 *            all held), then optionally u32 wait_ms (at most
 *            DSEC__AGENT_WAIT_MAX_MS; absent: 0) -> POUT. Each stream is capped
 *            further so the frame stays within FRAME_MAX (half of it each). With
 *            wait_ms, when neither stream has a byte past its offset and the
 *            process runs, the answer waits until one has, the process ends or
 *            wait_ms passes (then it may carry nothing); other requests go on
 *            meanwhile, and a connection that closes (or SYNCs) drops its held
 *            requests.
 *   PRESIZE  u64 handle, u32 rows, u32 cols (1..65535) -> OK: the window of a
 *            PTY process (its foreground job gets SIGWINCH). Not a PTY: ERROR
 *            INVALID; unknown: NOT_FOUND; ended: STATE.
 *
 * A connection may carry several requests at once; answers to different
 * requests may interleave. A frame whose length is out of bounds ends the
 * connection (after an ERROR, id 0): framing is lost. A frame with a bad
 * payload or unknown type gets an ERROR and the connection goes on.
 */

#define DSEC__AGENT_VERSION 1u

#define DSEC__AGENT_HDR 9u /* u32 len + u8 type + u32 id */
/* Largest file piece moved by one FWRITE or FREAD (DSEC_AGENT_FILE_MAX). */
#define DSEC__AGENT_FILE_MAX (8u << 20)
/* Largest value of the len field: a full file piece plus its path and fields. */
#define DSEC__AGENT_FRAME_MAX (DSEC__AGENT_FILE_MAX + (64u << 10))
#define DSEC__AGENT_STDIN_MAX DSEC__AGENT_FILE_MAX

/* Let a whole file piece wait in the socket toward the peer. With the kernel's default
 * (about 200 KiB) a 4 MiB piece crosses in some 150 wakeups of the reader, and on a host whose
 * context switches are dear (a guest under a hypervisor) that costs more than moving the
 * bytes. The size is a limit, not memory taken: only bytes in flight use it. A process
 * without CAP_NET_ADMIN gets what net.core.wmem_max allows. Best effort: errors are ignored. */
static inline void dsec__agent_sndbuf(int fd)
{
    int want = (int)DSEC__AGENT_FRAME_MAX;
    if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &want, sizeof want) < 0)
        (void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &want, sizeof want);
}
#define DSEC__AGENT_ARGV_MAX 4096u
#define DSEC__AGENT_ENV_MAX 4096u
#define DSEC__AGENT_ARG_LEN_MAX                                                                    \
    (128u << 10) /* one argv or env string, as Linux's MAX_ARG_STRLEN                              \
                  */
#define DSEC__AGENT_PATH_MAX 4096u
#define DSEC__AGENT_USER_MAX 256u
#define DSEC__AGENT_LIST_MAX 65536u           /* entries in one listing */
#define DSEC__AGENT_CHUNK 65536u              /* most output bytes in one OUTPUT frame */
#define DSEC__AGENT_PROC_MAX 1024u            /* background processes kept (DSEC_PROC_MAX) */
#define DSEC__AGENT_RING_DEFAULT (256u << 10) /* DSEC_PROC_RING_DEFAULT */
#define DSEC__AGENT_RING_MAX (16u << 20)      /* DSEC_PROC_RING_MAX */
#define DSEC__AGENT_CMDLINE_MAX 255u
#define DSEC__AGENT_UPLOAD_STALE_S 600u /* an upload's temporary file untouched this long goes */
#define DSEC__AGENT_UPLOAD_PREFIX ".dsec-upload-"
/* Most bytes of one stream in a POUT: two streams and a process info fit a frame. */
#define DSEC__AGENT_POUT_MAX ((DSEC__AGENT_FRAME_MAX - 1024u) / 2u)

enum {
    /* agent -> client */
    DSEC__AGENT_T_HELLO = 1,
    DSEC__AGENT_T_ERROR = 2,
    DSEC__AGENT_T_OK = 3,
    DSEC__AGENT_T_OUTPUT = 4,
    DSEC__AGENT_T_EXIT = 5,
    DSEC__AGENT_T_DATA = 6,
    DSEC__AGENT_T_ENTRIES = 7,
    DSEC__AGENT_T_PROC = 8,
    DSEC__AGENT_T_PROCS = 9,
    DSEC__AGENT_T_POUT = 10,
    /* client -> agent */
    DSEC__AGENT_T_EXEC = 16,
    DSEC__AGENT_T_KILL = 17,
    DSEC__AGENT_T_FWRITE = 18,
    DSEC__AGENT_T_FREAD = 19,
    DSEC__AGENT_T_FLIST = 20,
    DSEC__AGENT_T_FSTAT = 21,
    DSEC__AGENT_T_FREMOVE = 22,
    DSEC__AGENT_T_SYNC = 23,
    /* u32 count, count "K=V" strings, workdir, user: the sandbox's process defaults, given
     * once to an agent started ahead for a warm pool, after its root was switched */
    DSEC__AGENT_T_SETUP = 24,
    /* background processes */
    DSEC__AGENT_T_PSTART = 25,
    DSEC__AGENT_T_PLIST = 26,
    DSEC__AGENT_T_PSIGNAL = 27,
    DSEC__AGENT_T_PSTDIN = 28,
    DSEC__AGENT_T_POUTPUT = 29,
    DSEC__AGENT_T_PRESIZE = 30,
    /* files: directories, renames (40 up: 30-39 are background processes') */
    DSEC__AGENT_T_FMKDIR = 40,
    DSEC__AGENT_T_FRENAME = 41,
};

/* ERROR kinds; the client turns them (and errno for IO) into dsec codes. */
enum {
    DSEC__AGENT_ERR_IO = 1,        /* a system call failed: see errno */
    DSEC__AGENT_ERR_BAD_FRAME = 2, /* malformed frame or field */
    DSEC__AGENT_ERR_TOO_LARGE = 3, /* a field or the answer exceeds a limit */
    DSEC__AGENT_ERR_INVALID = 4,   /* well-formed but unacceptable (relative path, unknown user) */
    DSEC__AGENT_ERR_UNSUPPORTED = 5, /* unknown frame type */
    DSEC__AGENT_ERR_NOT_FOUND = 6,   /* no such object (a background process's handle) */
    DSEC__AGENT_ERR_STATE = 7,       /* not now (the process ended; a PSTDIN is pending) */
};

/* EXIT flags */
#define DSEC__AGENT_X_TIMED_OUT 1u
#define DSEC__AGENT_X_STDOUT_TRUNC 2u
#define DSEC__AGENT_X_STDERR_TRUNC 4u
#define DSEC__AGENT_X_INTERRUPTED 8u
#define DSEC__AGENT_X_SESSION_ENDED 16u

/* process info flags */
#define DSEC__AGENT_P_RUNNING 1u
#define DSEC__AGENT_P_STDIN_OPEN 2u
#define DSEC__AGENT_P_TIMED_OUT 4u
#define DSEC__AGENT_P_PTY 8u
#define DSEC__AGENT_P_SESSION 16u
#define DSEC__AGENT_P_BUSY 32u

/* PSTART flags */
#define DSEC__AGENT_S_PTY 1u
#define DSEC__AGENT_S_SESSION 2u

#define DSEC__AGENT_WAIT_MAX_MS 60000u /* longest POUTPUT wait (DSEC_PROC_WAIT_MAX_MS) */

/* ---- writing: callers size the buffer first, then put fields in order ---- */

static inline uint8_t *dsec__agent_put_u8(uint8_t *p, uint8_t v)
{
    *p = v;
    return p + 1;
}

static inline uint8_t *dsec__agent_put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
    p[2] = (uint8_t)(v >> 16);
    p[3] = (uint8_t)(v >> 24);
    return p + 4;
}

static inline uint8_t *dsec__agent_put_u64(uint8_t *p, uint64_t v)
{
    p = dsec__agent_put_u32(p, (uint32_t)v);
    return dsec__agent_put_u32(p, (uint32_t)(v >> 32));
}

static inline uint8_t *dsec__agent_put_bytes(uint8_t *p, const void *data, size_t len)
{
    p = dsec__agent_put_u32(p, (uint32_t)len);
    if (len > 0)
        memcpy(p, data, len);
    return p + len;
}

/* The header of a frame whose payload is payload_len bytes. */
static inline uint8_t *dsec__agent_put_hdr(uint8_t *p, uint8_t type, uint32_t id,
                                           size_t payload_len)
{
    p = dsec__agent_put_u32(p, (uint32_t)(payload_len + 5));
    p = dsec__agent_put_u8(p, type);
    return dsec__agent_put_u32(p, id);
}

static inline uint32_t dsec__agent_get_u32le(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ---- reading: a cursor that turns bad once anything runs past the end ---- */

typedef struct dsec__agent_rd {
    const uint8_t *p;
    const uint8_t *end;
    bool bad;
} dsec__agent_rd;

static inline bool dsec__agent_need(dsec__agent_rd *r, size_t n)
{
    if (r->bad || (size_t)(r->end - r->p) < n) {
        r->bad = true;
        return false;
    }
    return true;
}

static inline uint8_t dsec__agent_get_u8(dsec__agent_rd *r)
{
    if (!dsec__agent_need(r, 1))
        return 0;
    return *r->p++;
}

static inline uint32_t dsec__agent_get_u32(dsec__agent_rd *r)
{
    if (!dsec__agent_need(r, 4))
        return 0;
    uint32_t v = dsec__agent_get_u32le(r->p);
    r->p += 4;
    return v;
}

static inline uint64_t dsec__agent_get_u64(dsec__agent_rd *r)
{
    uint64_t lo = dsec__agent_get_u32(r);
    uint64_t hi = dsec__agent_get_u32(r);
    return lo | hi << 32;
}

/* A length-prefixed field of at most max bytes; *len receives its length.
 * The pointer is into the frame (not terminated). */
static inline const uint8_t *dsec__agent_get_bytes(dsec__agent_rd *r, size_t max, size_t *len)
{
    uint32_t n = dsec__agent_get_u32(r);
    *len = 0;
    if (r->bad || n > max || !dsec__agent_need(r, n)) {
        r->bad = true;
        return NULL;
    }
    const uint8_t *v = r->p;
    r->p += n;
    *len = n;
    return v;
}

/* A str field: like bytes, but a NUL byte inside makes the cursor bad. */
static inline const char *dsec__agent_get_str(dsec__agent_rd *r, size_t max, size_t *len)
{
    const uint8_t *v = dsec__agent_get_bytes(r, max, len);
    if (v != NULL && memchr(v, 0, *len) != NULL) {
        r->bad = true;
        return NULL;
    }
    return (const char *)v;
}

/* Whether the cursor consumed the payload exactly. */
static inline bool dsec__agent_done(const dsec__agent_rd *r)
{
    return !r->bad && r->p == r->end;
}

#endif
