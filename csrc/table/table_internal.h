/*
 * table_internal.h - what table_arrow.c (finding and validating a column in
 * an Arrow batch) hands table_chunk.c (converting it). Not a public API.
 */
#ifndef SG_TABLE_INTERNAL_H
#define SG_TABLE_INTERNAL_H

#include <stdint.h>

#include "common/sg_status.h"
#include "table/arrow_c.h"

#define TBL_MAX_DEPTH 16 /* struct nesting followed by a dotted name */

typedef enum TblKind {
    TBL_NUM,     /* one number per row */
    TBL_FIXLIST, /* fixed_size_list<number> */
    TBL_LIST,    /* list / large_list<number> */
    TBL_BIN,     /* binary / large_binary */
    TBL_FIXBIN,  /* fixed_size_binary */
    TBL_STR,     /* string / large_string */
    TBL_VECTOR,  /* Spark ML VectorUDT's struct */
} TblKind;

/* A resolved column. Physical index of batch row r in an array a on the
 * path is r + base of a (the sum of the offsets from the batch down). */
typedef struct TblLeaf {
    TblKind kind;
    const struct ArrowArray *arr;
    int64_t base;
    char fmt;                        /* the numbers' format: arr's (TBL_NUM) or the list child's */
    int large;                       /* 64-bit offsets (large_list, large_binary, large_string) */
    int64_t size;                    /* fixed_size_list / fixed_size_binary size */
    const struct ArrowArray *values; /* lists: the child of numbers */
    int depth;                       /* arrays on the path, the batch excluded, arr last */
    const struct ArrowArray *path[TBL_MAX_DEPTH];
    int64_t path_base[TBL_MAX_DEPTH];
    /* TBL_VECTOR: the struct's children type, size, indices, values */
    const struct ArrowArray *vtype, *vsize, *vindices, *vvalues;
} TblLeaf;

/* Finds the column `name` (dotted through structs) in the batch and
 * validates every array it reads. SG_ESCHEMA / SG_ECORRUPT with the column
 * named. */
int tbl_resolve(TblLeaf *leaf, const struct ArrowSchema *schema, const struct ArrowArray *array,
                const char *name, SgError *err);

/* Validates the batch itself: a struct whose children match the schema's. */
int tbl_check_batch(const struct ArrowSchema *schema, const struct ArrowArray *array, SgError *err);

static inline int tbl_bit(const void *bitmap, int64_t i)
{
    return (((const uint8_t *)bitmap)[i >> 3] >> (i & 7)) & 1;
}

/* 1 when element i (physical) of a is null. */
static inline int tbl_is_null(const struct ArrowArray *a, int64_t i)
{
    return a->null_count != 0 && a->buffers[0] != NULL && !tbl_bit(a->buffers[0], i);
}

static inline int64_t tbl_offset_at(const void *offsets, int large, int64_t i)
{
    return large ? ((const int64_t *)offsets)[i] : (int64_t)((const int32_t *)offsets)[i];
}

/* 1 when a's [p, p + n) (physical) holds a null. */
static inline int tbl_any_null(const struct ArrowArray *a, int64_t p, int64_t n)
{
    if (a->null_count == 0 || a->buffers[0] == NULL)
        return 0;
    for (int64_t i = 0; i < n; i++)
        if (!tbl_bit(a->buffers[0], p + i))
            return 1;
    return 0;
}

/* Spark ML vectors (table_vector.c). Row r of a TBL_VECTOR leaf: */

/* 1 when it has no value: the struct, its type or values (and for a sparse
 * row its size or indices) null, or a null inside its lists. */
int tbl_vector_row_null(const TblLeaf *l, int64_t r);

/* Its type (0 sparse, 1 dense) and size; a non-null row only. */
void tbl_vector_head(const TblLeaf *l, int64_t r, int8_t *type, int64_t *size);

/* Its values, dense, into dst[width]; *length gets the size. SG_ESCHEMA
 * naming the column for a size other than width, an index outside it, or
 * an unknown type. */
int tbl_vector_row(float *dst, int32_t *length, const TblLeaf *l, const char *name, size_t width,
                   int64_t r, SgError *err);

#endif /* SG_TABLE_INTERNAL_H */
