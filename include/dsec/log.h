/* log.h - the library's log: levels, and a hook that a daemon routes to its own log. */
#ifndef DSEC_LOG_H
#define DSEC_LOG_H

#include <stdarg.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum dsec_log_level {
    DSEC_LOG_ERROR = 0, /* something failed that an operator must look at */
    DSEC_LOG_WARN = 1,  /* something failed and was worked around, or will be retried */
    DSEC_LOG_INFO = 2,  /* a state change worth a line: a lease won, a node back */
    DSEC_LOG_DEBUG = 3,
} dsec_log_level;

/* Receives each line that passes the level: msg is the whole line without a newline, as the
 * library wrote it ("dsec-node n1: ..."), borrowed for the call. Called from any thread
 * (one line at a time: calls are serialised), and must not call dsec_log. */
typedef void (*dsec_log_fn)(dsec_log_level level, const char *msg, void *ud);

/* Route lines to fn (NULL: back to the default, stderr, one write(2) per line). When this
 * returns, no line goes to the previous hook any more. */
void dsec_log_set_hook(dsec_log_fn fn, void *ud);
/* Lines above max are dropped before they are formatted. The default is DSEC_LOG_INFO. */
void dsec_log_set_level(dsec_log_level max);
dsec_log_level dsec_log_get_level(void);
/* "error", "warn", "info" or "debug" → *out; -1 for anything else. */
int dsec_log_level_parse(const char *s, dsec_log_level *out);
const char *dsec_log_level_name(dsec_log_level level);

/* Log one line (printf format, no trailing newline needed; one is dropped if given). Lines
 * longer than 4 KiB are cut. */
void dsec_log(dsec_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void dsec_vlog(dsec_log_level level, const char *fmt, va_list ap)
    __attribute__((format(printf, 2, 0)));

#define dsec_log_error(...) dsec_log(DSEC_LOG_ERROR, __VA_ARGS__)
#define dsec_log_warn(...) dsec_log(DSEC_LOG_WARN, __VA_ARGS__)
#define dsec_log_info(...) dsec_log(DSEC_LOG_INFO, __VA_ARGS__)
#define dsec_log_debug(...) dsec_log(DSEC_LOG_DEBUG, __VA_ARGS__)

#ifdef __cplusplus
}
#endif
#endif
