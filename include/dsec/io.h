/* io.h - the I/O helpers every module shares: EINTR-safe reads and writes, whole-buffer
 * writes, reading a small file, running a program and capturing its output. */
#ifndef DSEC_IO_H
#define DSEC_IO_H

#include <stddef.h>
#include <sys/types.h>

#include "dsec/err.h"

#ifdef __cplusplus
extern "C" {
#endif

/* read(2), write(2), pread(2) and pwrite(2), retried while interrupted by a signal (EINTR).
 * Same results otherwise: a short count, 0 at end of file, -1 with errno. */
ssize_t dsec_read_eintr(int fd, void *buf, size_t n);
ssize_t dsec_write_eintr(int fd, const void *buf, size_t n);
ssize_t dsec_pread_eintr(int fd, void *buf, size_t n, off_t off);
ssize_t dsec_pwrite_eintr(int fd, const void *buf, size_t n, off_t off);
pid_t dsec_waitpid_eintr(pid_t pid, int *status, int options);

/* Write all n bytes (retrying short writes and EINTR). 0, or -1 with errno (EAGAIN on a
 * non-blocking fd that filled up: what was written is lost to the caller's count, so use it on
 * blocking fds). */
int dsec_write_all(int fd, const void *buf, size_t n);
/* The same at offset off, not moving the file offset. */
int dsec_pwrite_all(int fd, const void *buf, size_t n, off_t off);
/* Read until n bytes or end of file. The count read (< n only at end of file), or -1 with
 * errno. */
ssize_t dsec_read_full(int fd, void *buf, size_t n);

/* The whole of a regular file of at most max bytes, NUL-terminated (*len without the NUL).
 * *data is the caller's, freed with dsec_free. -1 with err filled (naming the path) when it
 * cannot be opened or read, or is larger than max (DSEC_E_TOO_LARGE). */
int dsec_read_file(const char *path, size_t max, char **data, size_t *len, dsec_err *err);

/* Remove path and, if it is a directory, everything below it, without following symlinks or
 * crossing into other file systems. 0 when it is gone (or was never there), -1 with errno. */
int dsec_rm_tree(const char *path);

/* Read fd to its end (or an error), keeping the first outlen - 1 bytes in out, NUL-terminated,
 * and dropping the rest; out may be NULL (everything dropped). The count kept. For a child's
 * output pipe: draining it whole lets the child finish instead of blocking on a full pipe. */
size_t dsec_drain_into(int fd, char *out, size_t outlen);

/* Run argv[0] (looked up in PATH) with argv and the caller's environment; stdin is in (at most
 * 4 KiB, written before the program starts) or /dev/null when NULL; stdout and stderr together
 * are captured as dsec_drain_into keeps them (out may be NULL). Returns the exit code (0-255, or
 * 128 + the signal that killed it), or -1 with err filled when it could not be started
 * (DSEC_E_CONFIG: the program is missing) or waited for. Blocks until the program ends: not for
 * an event loop's thread. */
int dsec_run_capture(const char *const *argv, const char *in, char *out, size_t outlen,
                     dsec_err *err);

#ifdef __cplusplus
}
#endif
#endif
