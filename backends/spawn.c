/* spawn.c - children that share the node's memory until they exec (spawn.h says why and how). */
#define _GNU_SOURCE
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#ifdef __SANITIZE_ADDRESS__
#include <sanitizer/asan_interface.h>
#endif

#include "backends/spawn.h"

void *dsec_spawn_stack_new(size_t len)
{
    void *stack =
        mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0);
    if (stack == MAP_FAILED)
        return NULL;
#ifdef __SANITIZE_ADDRESS__
    /* the mapping may reuse a finished thread's stack whose shadow still marks redzones, and
     * the child runs the sanitizer's interceptors on it */
    __asan_unpoison_memory_region(stack, len);
#endif
    return stack;
}

void dsec_spawn_stack_free(void *stack, size_t len)
{
    if (stack != NULL)
        munmap(stack, len);
}

pid_t dsec_spawn_vfork_on(int (*fn)(void *), void *arg, void *stack, size_t len)
{
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old);
    pid_t pid = clone(fn, (char *)stack + len, CLONE_VM | CLONE_VFORK | SIGCHLD, arg);
    int e = errno;
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    errno = e;
    return pid;
}

pid_t dsec_spawn_vfork(int (*fn)(void *), void *arg, size_t stack_len)
{
    void *stack = dsec_spawn_stack_new(stack_len);
    if (stack == NULL)
        return -1;
    pid_t pid = dsec_spawn_vfork_on(fn, arg, stack, stack_len);
    int e = errno;
    dsec_spawn_stack_free(stack, stack_len); /* the child has exec'd or exited */
    errno = e;
    return pid;
}

__attribute__((no_sanitize_address)) void dsec_spawn_default_signals(void)
{
    for (int sig = 1; sig < NSIG; sig++) {
        struct sigaction sa;
        if (sigaction(sig, NULL, &sa) == 0 && sa.sa_handler != SIG_DFL &&
            sa.sa_handler != SIG_IGN) {
            sa.sa_handler = SIG_DFL;
            sa.sa_flags = 0;
            sigaction(sig, &sa, NULL);
        }
    }
}
