/* alloc.c - the allocation wrapper. jemalloc replaces malloc at link time in
 * normal builds (it is linked into every executable), so this stays plain. */
#include "dsec/alloc.h"

#include <stdlib.h>
#include <string.h>

void *dsec_malloc(size_t n)
{
    return malloc(n ? n : 1);
}
void *dsec_calloc(size_t nmemb, size_t n)
{
    return calloc(nmemb ? nmemb : 1, n ? n : 1);
}
void *dsec_realloc(void *p, size_t n)
{
    return realloc(p, n ? n : 1);
}
void dsec_free(void *p)
{
    free(p);
}

char *dsec_strdup(const char *s)
{
    return s == NULL ? NULL : strdup(s);
}

char *dsec_strndup(const char *s, size_t n)
{
    return s == NULL ? NULL : strndup(s, n);
}

const char *dsec_alloc_name(void)
{
#ifdef DSEC_WITH_JEMALLOC
    return "jemalloc";
#else
    return "libc";
#endif
}
