/*
 * table_vector.c - Spark ML vectors as table columns. pyspark's VectorUDT
 * stores a vector as struct<type: int8, size: int32, indices: list<int32>,
 * values: list<double>>: type 1 (dense) with its values (size and indices
 * null), type 0 (sparse) with its size, indices and values. Both become
 * dense float32 rows. Validation of the arrays is table_arrow.c's.
 */
#include <string.h>

#include "table/table.h"
#include "table/table_internal.h"

/* The child values of list row r (indices or values), their physical range. */
static const struct ArrowArray *vector_list(const TblLeaf *l, const struct ArrowArray *list,
                                            int64_t r, int64_t *lo, int64_t *hi)
{
    int64_t p = l->base + r + list->offset;
    const struct ArrowArray *child = list->children[0];
    *lo = tbl_offset_at(list->buffers[1], 0, p) + child->offset;
    *hi = tbl_offset_at(list->buffers[1], 0, p + 1) + child->offset;
    return child;
}

static int8_t vector_type(const TblLeaf *l, int64_t r)
{
    return ((const int8_t *)l->vtype->buffers[1])[l->base + r + l->vtype->offset];
}

int tbl_vector_row_null(const TblLeaf *l, int64_t r)
{
    int64_t p = l->base + r, lo, hi;
    if (tbl_is_null(l->vtype, p + l->vtype->offset) ||
        tbl_is_null(l->vvalues, p + l->vvalues->offset))
        return 1;
    const struct ArrowArray *val = vector_list(l, l->vvalues, r, &lo, &hi);
    if (tbl_any_null(val, lo, hi - lo))
        return 1;
    if (vector_type(l, r) != 0)
        return 0;
    if (tbl_is_null(l->vsize, p + l->vsize->offset) ||
        tbl_is_null(l->vindices, p + l->vindices->offset))
        return 1;
    const struct ArrowArray *ind = vector_list(l, l->vindices, r, &lo, &hi);
    return tbl_any_null(ind, lo, hi - lo);
}

void tbl_vector_head(const TblLeaf *l, int64_t r, int8_t *type, int64_t *size)
{
    int64_t lo, hi;
    *type = vector_type(l, r);
    if (*type == 1) {
        vector_list(l, l->vvalues, r, &lo, &hi);
        *size = hi - lo;
    } else {
        *size = ((const int32_t *)l->vsize->buffers[1])[l->base + r + l->vsize->offset];
    }
}

int tbl_vector_row(float *dst, int32_t *length, const TblLeaf *l, const char *name, size_t width,
                   int64_t r, SgError *err)
{
    int8_t type;
    int64_t size, vlo, vhi, lo, hi;
    tbl_vector_head(l, r, &type, &size);
    if (type != 0 && type != 1)
        return sg_fail(err, SG_ESCHEMA,
                       "column '%s': vector type %d (0 sparse and 1 dense are known)", name,
                       (int)type);
    if (size < 0 || (size_t)size != width)
        return sg_fail(err, SG_ESCHEMA, "column '%s' holds a vector of size %lld, not %zu", name,
                       (long long)size, width);
    const struct ArrowArray *val = vector_list(l, l->vvalues, r, &vlo, &vhi);
    const double *values = (const double *)val->buffers[1];
    if (type == 1) {
        for (int64_t i = 0; i < size; i++)
            dst[i] = (float)values[vlo + i];
        *length = (int32_t)size;
        return 0;
    }
    const struct ArrowArray *ind = vector_list(l, l->vindices, r, &lo, &hi);
    if (hi - lo != vhi - vlo)
        return sg_fail(err, SG_ESCHEMA,
                       "column '%s': a sparse vector with %lld indices and %lld values", name,
                       (long long)(hi - lo), (long long)(vhi - vlo));
    memset(dst, 0, width * sizeof *dst);
    const int32_t *indices = (const int32_t *)ind->buffers[1];
    for (int64_t i = 0; i < hi - lo; i++) {
        int32_t k = indices[lo + i];
        if (k < 0 || k >= size)
            return sg_fail(err, SG_ESCHEMA,
                           "column '%s': a sparse vector of size %lld has index %d", name,
                           (long long)size, (int)k);
        dst[k] = (float)values[vlo + i];
    }
    *length = (int32_t)size;
    return 0;
}
