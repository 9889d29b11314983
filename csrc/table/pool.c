/*
 * pool.c - the chunk buffer free list (see pool.h): at most POOL_SLOTS
 * buffers, best fit, under one mutex.
 */
#include "table/pool.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#define POOL_SLOTS 64
#define HEADER     16 /* the capacity, keeping the buffer 16-byte aligned */

typedef struct Slot {
    void *buf; /* the header's address */
    size_t cap;
} Slot;

struct TblPool {
    pthread_mutex_t lock;
    size_t max_bytes, bytes, n;
    Slot slots[POOL_SLOTS];
};

int tbl_pool_new(TblPool **out, size_t max_bytes, SgError *err)
{
    TblPool *p = calloc(1, sizeof *p);
    if (p == NULL)
        return sg_fail(err, SG_ENOMEM, "no memory for a buffer pool");
    pthread_mutex_init(&p->lock, NULL);
    p->max_bytes = max_bytes;
    *out = p;
    return 0;
}

void tbl_pool_free(TblPool *pool)
{
    if (pool == NULL)
        return;
    for (size_t i = 0; i < pool->n; i++)
        free(pool->slots[i].buf);
    pthread_mutex_destroy(&pool->lock);
    free(pool);
}

void *tbl_pool_get(TblPool *pool, size_t bytes)
{
    if (pool == NULL)
        return malloc(bytes);
    if (bytes > SIZE_MAX - HEADER)
        return NULL;
    void *found = NULL;
    pthread_mutex_lock(&pool->lock);
    size_t best = pool->n;
    for (size_t i = 0; i < pool->n; i++) {
        size_t cap = pool->slots[i].cap;
        if (cap >= bytes && cap / 2 <= bytes && (best == pool->n || cap < pool->slots[best].cap))
            best = i;
    }
    if (best < pool->n) {
        found = pool->slots[best].buf;
        pool->bytes -= pool->slots[best].cap;
        pool->slots[best] = pool->slots[--pool->n];
    }
    pthread_mutex_unlock(&pool->lock);
    if (found == NULL) {
        found = malloc(HEADER + bytes);
        if (found == NULL)
            return NULL;
        *(size_t *)found = bytes;
    }
    return (uint8_t *)found + HEADER;
}

void tbl_pool_put(TblPool *pool, void *buf)
{
    if (buf == NULL)
        return;
    if (pool == NULL) {
        free(buf);
        return;
    }
    void *base = (uint8_t *)buf - HEADER;
    size_t cap = *(size_t *)base;
    pthread_mutex_lock(&pool->lock);
    int kept = pool->n < POOL_SLOTS && cap <= pool->max_bytes - pool->bytes;
    if (kept) {
        pool->slots[pool->n++] = (Slot){base, cap};
        pool->bytes += cap;
    }
    pthread_mutex_unlock(&pool->lock);
    if (!kept)
        free(base);
}

size_t tbl_pool_bytes(TblPool *pool)
{
    if (pool == NULL)
        return 0;
    pthread_mutex_lock(&pool->lock);
    size_t n = pool->bytes;
    pthread_mutex_unlock(&pool->lock);
    return n;
}
