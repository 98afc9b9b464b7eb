/* arena.c - the decoder's reusable bump allocator for strings and arrays of one message. */
#include <stddef.h>
#include <stdint.h>

#include "codecs/codec.h"
#include "dsec/alloc.h"

struct dsec__arena_chunk {
    dsec__arena_chunk *next;
    size_t cap;
    size_t used;
    max_align_t data[]; /* cap bytes */
};

void dsec__arena_init(dsec__arena *a, size_t chunk_size, size_t retain)
{
    a->head = NULL;
    a->cur = NULL;
    a->chunk_size = chunk_size;
    a->retain = retain < chunk_size ? chunk_size : retain;
    a->used = 0;
}

static void free_chunks(dsec__arena *a)
{
    dsec__arena_chunk *c = a->head;
    while (c != NULL) {
        dsec__arena_chunk *next = c->next;
        dsec_free(c);
        c = next;
    }
    a->head = NULL;
    a->cur = NULL;
}

void dsec__arena_release(dsec__arena *a)
{
    free_chunks(a);
    a->used = 0;
}

static dsec__arena_chunk *chunk_new(size_t cap)
{
    if (cap > SIZE_MAX - sizeof(dsec__arena_chunk))
        return NULL;
    dsec__arena_chunk *c = dsec_malloc(sizeof *c + cap);
    if (c == NULL)
        return NULL;
    c->next = NULL;
    c->cap = cap;
    c->used = 0;
    return c;
}

void dsec__arena_reset(dsec__arena *a)
{
    a->used = 0;
    if (a->head == NULL)
        return;
    if (a->head->next == NULL) {
        a->head->used = 0;
        a->cur = a->head;
        return;
    }
    /* The last message needed several chunks: keep one that would have held
     * it all (up to retain), so the next one like it allocates nothing. */
    size_t want = 0;
    for (dsec__arena_chunk *c = a->head; c != NULL; c = c->next)
        want += c->cap;
    if (want > a->retain)
        want = a->retain;
    free_chunks(a);
    a->head = a->cur = chunk_new(want);
}

void *dsec__arena_alloc(dsec__arena *a, size_t n, size_t align)
{
    for (;;) {
        dsec__arena_chunk *c = a->cur;
        if (c != NULL) {
            size_t off = (c->used + align - 1) & ~(align - 1);
            if (off <= c->cap && n <= c->cap - off) {
                c->used = off + n;
                a->used += n;
                return (char *)c->data + off;
            }
            if (c->next != NULL) {
                a->cur = c->next;
                a->cur->used = 0;
                continue;
            }
        }
        if (n > SIZE_MAX / 2)
            return NULL;
        size_t cap = n + align > a->chunk_size ? n + align : a->chunk_size;
        dsec__arena_chunk *fresh = chunk_new(cap);
        if (fresh == NULL)
            return NULL;
        if (c == NULL)
            a->head = fresh;
        else
            c->next = fresh;
        a->cur = fresh;
    }
}
