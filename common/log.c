/* log.c - the library's log (dsec/log.h): a level filter and a hook, stderr by default. */
#include "dsec/log.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "dsec/io.h"

/* Logging is rare (failures and state changes), so one lock keeps the hook and its argument
 * together and a hook's lines whole, with no ordering subtleties. */
static pthread_mutex_t hook_mu = PTHREAD_MUTEX_INITIALIZER;
static dsec_log_fn hook_fn;
static void *hook_ud;
static atomic_int level_now = DSEC_LOG_INFO;

static const char *const names[] = {"error", "warn", "info", "debug"};

void dsec_log_set_hook(dsec_log_fn fn, void *ud)
{
    pthread_mutex_lock(&hook_mu);
    hook_fn = fn;
    hook_ud = ud;
    pthread_mutex_unlock(&hook_mu);
}

void dsec_log_set_level(dsec_log_level max)
{
    atomic_store(&level_now, (int)max);
}

dsec_log_level dsec_log_get_level(void)
{
    return (dsec_log_level)atomic_load(&level_now);
}

int dsec_log_level_parse(const char *s, dsec_log_level *out)
{
    for (int i = 0; i < 4; i++)
        if (s != NULL && strcmp(s, names[i]) == 0) {
            *out = (dsec_log_level)i;
            return 0;
        }
    return -1;
}

const char *dsec_log_level_name(dsec_log_level level)
{
    return (int)level >= 0 && (int)level < 4 ? names[level] : "?";
}

void dsec_vlog(dsec_log_level level, const char *fmt, va_list ap)
{
    if ((int)level > atomic_load(&level_now))
        return;
    char line[4096 + 1];
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    if (n < 0)
        return;
    size_t len = (size_t)n < sizeof line - 2 ? (size_t)n : sizeof line - 2;
    while (len > 0 && line[len - 1] == '\n')
        len--;
    line[len] = '\0';
    pthread_mutex_lock(&hook_mu);
    if (hook_fn != NULL) {
        hook_fn(level, line, hook_ud);
    } else {
        /* one write per line, so lines of several threads do not interleave */
        line[len] = '\n';
        (void)dsec_write_all(STDERR_FILENO, line, len + 1);
    }
    pthread_mutex_unlock(&hook_mu);
}

void dsec_log(dsec_log_level level, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    dsec_vlog(level, fmt, ap);
    va_end(ap);
}
