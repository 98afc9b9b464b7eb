/* names.h - names that travel as one NATS subject token: tenants, cells, nodes, sandbox ids. */
#ifndef DSEC_NAMES_H
#define DSEC_NAMES_H

#include <stddef.h>
#include <string.h>

#define DSEC_NAME_LEN_MAX 64                         /* tenants, cells, nodes */
#define DSEC_SBX_ID_LEN_MAX (DSEC_NAME_LEN_MAX + 17) /* NODE-16hex */

/* 0 when s is 1..max characters of [A-Za-z0-9_-], else -1. */
static inline int dsec_name_ok(const char *s, size_t max)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > max)
        return -1;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '_' || ch == '-'))
            return -1;
    }
    return 0;
}

/* 0 when s is a project path: names as above joined by '/' ("rl" or
 * "rl/math"), at most max characters and DSEC_PROJECT_DEPTH_MAX deep. */
#define DSEC_PROJECT_DEPTH_MAX 8
static inline int dsec_project_ok(const char *s, size_t max)
{
    size_t n = s ? strlen(s) : 0;
    if (n == 0 || n > max || s[0] == '/' || s[n - 1] == '/')
        return -1;
    int depth = 1;
    for (size_t i = 0; i < n; i++) {
        char ch = s[i];
        if (ch == '/') {
            if (s[i + 1] == '/' || ++depth > DSEC_PROJECT_DEPTH_MAX)
                return -1;
        } else if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
                     (ch >= '0' && ch <= '9') || ch == '_' || ch == '-')) {
            return -1;
        }
    }
    return 0;
}

#endif
