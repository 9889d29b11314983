/*
 * bufpool.h - a small process-wide cache of large output buffers.
 *
 * Batches hand their column buffers to NumPy; when NumPy frees them they come
 * back here, so the next batch reuses warm, already-mapped pages instead of a
 * fresh mmap (which costs more than parsing the batch). Holds at most
 * BUFPOOL_MAX buffers; others are freed.
 */
#ifndef SG_BUFPOOL_H
#define SG_BUFPOOL_H

#include <stddef.h>

#define BUFPOOL_MAX 32

/* A 64-byte-aligned buffer of at least size bytes (NULL when out of memory). */
void *bufpool_get(size_t size);

/* Returns a buffer from bufpool_get (NULL is ignored). */
void bufpool_put(void *p);

#endif /* SG_BUFPOOL_H */
