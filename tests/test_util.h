/* test_util.h - small helpers every test may use, header-only so no test links anything more. */
#ifndef DSEC_TESTS_TEST_UTIL_H
#define DSEC_TESTS_TEST_UTIL_H

#include <errno.h>
#include <time.h>

/* Sleep ms milliseconds, the whole of them (a signal does not cut it short). */
static inline void msleep(int ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

#endif
