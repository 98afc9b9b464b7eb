/* spawn.h - starting programs from the node without a fork: children that share the node's
 * memory until they exec (clone with CLONE_VM | CLONE_VFORK), for the backends that run helpers. */
#ifndef DSEC_BACKENDS_SPAWN_H
#define DSEC_BACKENDS_SPAWN_H

#include <stddef.h>
#include <sys/types.h>

/*
 * Why not fork: a fork of the node manager (hundreds of MiB, thousands of sandboxes) copies its
 * page tables (20 ms for 300 MiB here, with the address space locked for every thread) and
 * leaves each of its pages write-protected, so the node's next write to each faults (17 us a
 * page here: 1.3 s to touch 300 MiB once). A vfork child shares the memory instead and the
 * calling thread waits until it execs or exits (as posix_spawn does, which cannot be used when
 * the child must unshare a namespace or pivot its root first).
 *
 * The rules for a child (fn): it allocates nothing, uses no stdio, writes only its own stack
 * and memory its parent prepared for it, and makes only system calls; it ends in an exec or
 * _exit. It starts with every signal blocked and calls dsec_spawn_default_signals before it
 * unblocks any, so no handler of the node runs in it. Its errno is the calling thread's (the
 * thread-local storage is shared), which waits meanwhile. fn is marked
 * __attribute__((no_sanitize_address)): ASan would take the stack switch for a stack it knows at
 * the _exit (a noreturn call), and warn or unpoison the memory between the two.
 * ThreadSanitizer's runtime would be confused by a child in its memory: under TSan, callers
 * fork instead.
 */

/* A stack for dsec_spawn_vfork_on, len bytes (a multiple of the page size), mapped now so that
 * a child can start another child without allocating. NULL with errno on failure. The caller
 * frees it with dsec_spawn_stack_free once the child that used it has exec'd or exited. */
void *dsec_spawn_stack_new(size_t len);
/* Unmap a stack of dsec_spawn_stack_new; NULL is a no-op. */
void dsec_spawn_stack_free(void *stack, size_t len);

/* Run fn(arg) in a child that shares this process's memory, on stack (len bytes, from
 * dsec_spawn_stack_new, which the child owns until it execs or exits), while the calling thread
 * waits; every signal is blocked in the caller around the clone, so the child starts with all
 * blocked. Also usable from such a child, to start a grandchild on a stack prepared before.
 * Returns the child's pid (it has exec'd or exited by then), or -1 with errno set. */
pid_t dsec_spawn_vfork_on(int (*fn)(void *), void *arg, void *stack, size_t len);

/* dsec_spawn_vfork_on on a stack of stack_len bytes mapped for the call and unmapped after it. */
pid_t dsec_spawn_vfork(int (*fn)(void *), void *arg, size_t stack_len);

/* In a dsec_spawn_vfork child: every caught signal back to its default (the child has its own
 * copy of the dispositions), so unblocking signals cannot run a handler of the node. Ignored
 * signals stay ignored. */
void dsec_spawn_default_signals(void);

#endif
