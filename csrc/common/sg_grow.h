/*
 * sg_grow.h - growing an array to hold at least `need` elements: the
 * capacity doubles from `first`, so n appends cost O(n). On failure
 * (SG_ENOMEM, the caller names what it grew) the array is as it was.
 */
#ifndef SG_GROW_H
#define SG_GROW_H

#include <stdlib.h>

#include "common/sg_status.h"

static inline int sg_grow(void *arrayp, size_t *cap, size_t need, size_t elem, size_t first)
{
    if (need <= *cap)
        return SG_OK;
    size_t n = *cap ? *cap : first;
    while (n < need)
        n *= 2;
    void *grown = realloc(*(void **)arrayp, n * elem);
    if (grown == NULL)
        return SG_ENOMEM;
    *(void **)arrayp = grown;
    *cap = n;
    return SG_OK;
}

#endif /* SG_GROW_H */
