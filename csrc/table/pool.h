/*
 * pool.h - a bounded free list of the large buffers chunks are converted
 * into, shared by the readers of one dataset: a shuffle buffer keeps a
 * chunk until its last row is drawn, so without reuse every epoch faults
 * in (and the kernel zeroes) fresh pages for all of them.
 *
 * Thread-safe (one mutex). A buffer from tbl_pool_get carries its capacity
 * in a 16-byte header and goes back with tbl_pool_put only. A NULL pool is
 * plain malloc / free.
 */
#ifndef SG_TABLE_POOL_H
#define SG_TABLE_POOL_H

#include <stddef.h>

#include "common/sg_status.h"

typedef struct TblPool TblPool;

/* Keeps at most max_bytes of free buffers. */
int tbl_pool_new(TblPool **out, size_t max_bytes, SgError *err);

/* Frees the pool and the buffers it holds (not those handed out). */
void tbl_pool_free(TblPool *pool);

/* A buffer of at least bytes (a free one of up to twice the size when the
 * pool has one), or NULL when out of memory. */
void *tbl_pool_get(TblPool *pool, size_t bytes);

/* Gives a buffer from tbl_pool_get back (freed when the pool is full). */
void tbl_pool_put(TblPool *pool, void *buf);

/* Bytes of free buffers held now. */
size_t tbl_pool_bytes(TblPool *pool);

#endif /* SG_TABLE_POOL_H */
