/*
 * bufpool.c - the buffer cache: a mutex-guarded array of (size, pointer).
 * Each buffer carries its size in a 64-byte header in front of it.
 */
#include "record/bufpool.h"

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#define HEADER 64

static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;
static void *pool[BUFPOOL_MAX]; /* base pointers (header included) */
static size_t pool_n;

static size_t size_of(void *base)
{
    return *(size_t *)base;
}

void *bufpool_get(size_t size)
{
    if (size == 0)
        size = 1;
    pthread_mutex_lock(&pool_mu);
    for (size_t i = 0; i < pool_n; i++) {
        if (size_of(pool[i]) == size) {
            void *base = pool[i];
            pool[i] = pool[--pool_n];
            pthread_mutex_unlock(&pool_mu);
            return (uint8_t *)base + HEADER;
        }
    }
    pthread_mutex_unlock(&pool_mu);
    if (size > SIZE_MAX - 2 * HEADER)
        return NULL;
    size_t total = (size + HEADER + 63) & ~(size_t)63;
    void *base = aligned_alloc(64, total);
    if (base == NULL)
        return NULL;
    *(size_t *)base = size;
    return (uint8_t *)base + HEADER;
}

void bufpool_put(void *p)
{
    if (p == NULL)
        return;
    void *base = (uint8_t *)p - HEADER;
    pthread_mutex_lock(&pool_mu);
    if (pool_n < BUFPOOL_MAX) {
        pool[pool_n++] = base;
        base = NULL;
    }
    pthread_mutex_unlock(&pool_mu);
    free(base);
}
