/* alloc.h - the single allocation wrapper; jemalloc behind it in normal builds. */
#ifndef DSEC_ALLOC_H
#define DSEC_ALLOC_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* These behave like their libc namesakes. The caller frees with dsec_free. */
void *dsec_malloc(size_t n);
void *dsec_calloc(size_t nmemb, size_t n);
void *dsec_realloc(void *p, size_t n);
char *dsec_strdup(const char *s);
char *dsec_strndup(const char *s, size_t n);
void dsec_free(void *p);

/* "jemalloc" or "libc": which allocator this build uses. */
const char *dsec_alloc_name(void);

/* cleanup helper: `char *p __attribute__((cleanup(dsec_freep))) = ...;` */
static inline void dsec_freep(void *pp)
{
    void **p = (void **)pp;
    dsec_free(*p);
    *p = NULL;
}
#define DSEC_AUTOFREE __attribute__((cleanup(dsec_freep)))

#ifdef __cplusplus
}
#endif
#endif
