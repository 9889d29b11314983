/*
 * table_chunk.c - converting the planned columns of one Arrow record batch
 * into a chunk the batcher owns (float32 rows, lengths, strings as offsets
 * and bytes), with each column's null policy applied.
 *
 * Two passes: the first resolves every column (table_arrow.c validates it)
 * and finds its null rows, so that a row skipped for one column is dropped
 * from all of them and an error names the first null; the second converts
 * the kept rows. Not here: Arrow validation, batching, reading files.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/sg_half.h"
#include "table/table.h"
#include "table/table_internal.h"

enum { ROW_OK = 0, ROW_NULL = 1, ELEM_NULL = 2 }; /* a row's null state in one column */

typedef struct Column {
    TblLeaf leaf;
    uint8_t *nulls; /* [rows] ROW_* per batch row, or NULL when the column has none */
} Column;

static const char *where_file(const TblWhere *w)
{
    return w != NULL && w->file != NULL ? w->file : "<batch>";
}

/* Prepends "file 'f', row group g, row r: " to err. r < 0: no row. */
static int at(SgError *err, const TblWhere *w, long long r)
{
    long long group = w != NULL ? w->row_group : -1, first = w != NULL ? w->first_row : 0;
    if (r < 0)
        return sg_context(err, "file '%s', row group %lld: ", where_file(w), group);
    return sg_context(err, "file '%s', row group %lld, row %lld: ", where_file(w), group,
                      first + r);
}

/* Arrow's integer formats narrower than 64 bits, with their C types: X(format, type). */
#define TBL_SMALL_INTEGERS(X)                                                                      \
    X('c', int8_t) X('C', uint8_t) X('s', int16_t) X('S', uint16_t) X('i', int32_t) X('I', uint32_t)

/* n numbers of format fmt from physical index p of a, as float32. */
static void numbers_to_f32(float *dst, const struct ArrowArray *a, char fmt, int64_t p, int64_t n)
{
    const void *d = a->buffers[1];
    switch (fmt) {
    case 'b':
        for (int64_t i = 0; i < n; i++)
            dst[i] = (float)tbl_bit(d, p + i);
        break;
#define CONVERT(code, type)                                                                        \
    case code:                                                                                     \
        for (int64_t i = 0; i < n; i++)                                                            \
            dst[i] = (float)((const type *)d)[p + i];                                              \
        break;
        TBL_SMALL_INTEGERS(CONVERT)
        CONVERT('l', int64_t)
        CONVERT('L', uint64_t)
        CONVERT('g', double)
#undef CONVERT
    case 'e':
        for (int64_t i = 0; i < n; i++)
            dst[i] = sg_f16_to_f32(((const uint16_t *)d)[p + i]);
        break;
    case 'f':
        if (n > 0)
            memcpy(dst, (const float *)d + p, (size_t)n * sizeof *dst);
        break;
    default:
        break;
    }
}

static int is_integer(char fmt)
{
    return fmt != '\0' && strchr("bcCsSiIlL", fmt) != NULL;
}

static const char *out_name(TblOut out)
{
    return out == TBL_OUT_STR ? "strings" : out == TBL_OUT_I64 ? "int64 ids" : "numbers";
}

/* n integers of format fmt from physical index p of a, as int64 (uint64
 * above 2^63 wraps). */
static void integers_to_i64(int64_t *dst, const struct ArrowArray *a, char fmt, int64_t p,
                            int64_t n)
{
    const void *d = a->buffers[1];
    switch (fmt) {
    case 'b':
        for (int64_t i = 0; i < n; i++)
            dst[i] = tbl_bit(d, p + i);
        break;
#define CONVERT(code, type)                                                                        \
    case code:                                                                                     \
        for (int64_t i = 0; i < n; i++)                                                            \
            dst[i] = (int64_t)((const type *)d)[p + i];                                            \
        break;
        TBL_SMALL_INTEGERS(CONVERT)
        CONVERT('L', uint64_t)
#undef CONVERT
    case 'l':
        if (n > 0)
            memcpy(dst, (const int64_t *)d + p, (size_t)n * sizeof *dst);
        break;
    default:
        break;
    }
}

/* Null elements of a's [p, p + n) become fill. */
static void fill_nulls(float *dst, const struct ArrowArray *a, int64_t p, int64_t n, float fill)
{
    if (a->null_count == 0 || a->buffers[0] == NULL)
        return;
    for (int64_t i = 0; i < n; i++)
        if (!tbl_bit(a->buffers[0], p + i))
            dst[i] = fill;
}

/* List row r's value range [*lo, *hi) in the child's physical indices. */
static void list_range(const TblLeaf *l, int64_t r, int64_t *lo, int64_t *hi)
{
    int64_t p = l->base + r;
    if (l->kind == TBL_FIXLIST) {
        *lo = p * l->size + l->values->offset;
        *hi = *lo + l->size;
        return;
    }
    *lo = tbl_offset_at(l->arr->buffers[1], l->large, p) + l->values->offset;
    *hi = tbl_offset_at(l->arr->buffers[1], l->large, p + 1) + l->values->offset;
}

static int column_may_have_nulls(const TblLeaf *l)
{
    for (int k = 0; k < l->depth; k++)
        if (l->path[k]->null_count != 0)
            return 1;
    if (l->values != NULL && l->values->null_count != 0)
        return 1;
    return l->kind == TBL_VECTOR; /* its children's nulls are checked row by row */
}

/* Fills c->nulls (or leaves it NULL when no row has a null). */
static int find_nulls(Column *c, int64_t rows, SgError *err)
{
    const TblLeaf *l = &c->leaf;
    if (!column_may_have_nulls(l) || rows == 0)
        return 0;
    c->nulls = calloc((size_t)rows, 1);
    if (c->nulls == NULL)
        return sg_fail(err, SG_ENOMEM, "no memory for the null flags of %lld rows",
                       (long long)rows);
    for (int64_t r = 0; r < rows; r++) {
        uint8_t state = ROW_OK;
        for (int k = 0; k < l->depth && state == ROW_OK; k++)
            if (tbl_is_null(l->path[k], l->path_base[k] + r))
                state = ROW_NULL;
        if (state == ROW_OK && l->kind == TBL_VECTOR)
            state = tbl_vector_row_null(l, r) ? ROW_NULL : ROW_OK;
        else if (state == ROW_OK && l->values != NULL) {
            int64_t lo, hi;
            list_range(l, r, &lo, &hi);
            if (tbl_any_null(l->values, lo, hi - lo))
                state = ELEM_NULL;
        }
        c->nulls[r] = state;
    }
    return 0;
}

/* Settles the plan's output kind, width and lengths from this column, or
 * fails when they disagree with what an earlier chunk set. `first` is the
 * first kept row (-1: none), for widths taken from the data. */
static int settle_plan(TblPlan *plan, const TblLeaf *l, int64_t first, SgError *err)
{
    TblOut out = l->kind == TBL_STR ? TBL_OUT_STR : plan->ints ? TBL_OUT_I64 : TBL_OUT_F32;
    if (out == TBL_OUT_I64 &&
        (!(l->kind == TBL_NUM || l->kind == TBL_FIXLIST || l->kind == TBL_LIST) ||
         !is_integer(l->fmt)))
        return sg_fail(
            err, SG_ESCHEMA,
            "column '%s' is read as int64 ids, but it holds no integers (nor lists of them)",
            plan->name);
    if (plan->out != TBL_OUT_UNSET && plan->out != out)
        return sg_fail(err, SG_ESCHEMA, "column '%s' is %s here but was %s in an earlier batch",
                       plan->name, out_name(out), out_name(plan->out));
    if (l->kind == TBL_LIST && plan->out != TBL_OUT_UNSET && !plan->lengths)
        return sg_fail(err, SG_ESCHEMA,
                       "column '%s' is a variable-length list here but had one length per row in "
                       "an earlier batch",
                       plan->name);
    size_t found = 0; /* the width the data has, 0: none */
    switch (l->kind) {
    case TBL_NUM:
        found = 1;
        break;
    case TBL_FIXLIST:
    case TBL_FIXBIN:
        found = (size_t)l->size;
        break;
    case TBL_BIN:
        if (first >= 0) {
            int64_t p = l->base + first;
            found = (size_t)(tbl_offset_at(l->arr->buffers[1], l->large, p + 1) -
                             tbl_offset_at(l->arr->buffers[1], l->large, p));
        }
        break;
    case TBL_VECTOR:
        if (first >= 0) {
            int8_t type;
            int64_t size;
            tbl_vector_head(l, first, &type, &size);
            if (size < 0)
                return sg_fail(err, SG_ECORRUPT, "column '%s': a vector of size %lld", plan->name,
                               (long long)size);
            found = (size_t)size;
        }
        break;
    case TBL_LIST:
        if (plan->width == 0)
            return sg_fail(err, SG_ESCHEMA,
                           "column '%s' is a variable-length list: give its width (values per row; "
                           "shorter rows "
                           "are padded, lengths reported)",
                           plan->name);
        break;
    case TBL_STR:
        found = 1;
        break;
    }
    if (found > TBL_MAX_WIDTH || plan->width > TBL_MAX_WIDTH)
        return sg_fail(err, SG_ESCHEMA, "column '%s' has rows of %zu values, over the limit of %zu",
                       plan->name, found > plan->width ? found : plan->width, TBL_MAX_WIDTH);
    if (l->kind == TBL_NUM && plan->width > 1)
        return sg_fail(err, SG_ESCHEMA, "column '%s' holds one number per row, not %zu", plan->name,
                       plan->width);
    if (l->kind == TBL_FIXLIST && plan->width != 0 && plan->width < found && !plan->truncate)
        return sg_fail(err, SG_ESCHEMA,
                       "column '%s' is a fixed-size list of %zu values, longer than its width %zu "
                       "(truncate it "
                       "to cut)",
                       plan->name, found, plan->width);
    if (plan->width == 0)
        plan->width = found;
    plan->out = out;
    plan->lengths = plan->lengths || l->kind == TBL_LIST;
    return 0;
}

static int alloc_column(TblColumn *col, const TblPlan *plan, size_t rows, size_t bytes,
                        TblPool *pool, SgError *err)
{
    col->out = plan->out;
    col->width = plan->width;
    if (plan->out == TBL_OUT_STR) {
        col->offsets = tbl_pool_get(pool, (rows + 1) * sizeof *col->offsets);
        col->bytes = tbl_pool_get(pool, bytes > 0 ? bytes : 1);
        if (col->offsets == NULL || col->bytes == NULL)
            return sg_fail(err, SG_ENOMEM, "no memory for %zu strings (%zu bytes) of column '%s'",
                           rows, bytes, plan->name);
        col->offsets[0] = 0;
        return 0;
    }
    if (plan->width > 0 && rows > SIZE_MAX / sizeof(float) / plan->width)
        return sg_fail(err, SG_ENOMEM, "column '%s': %zu rows of %zu values is too large",
                       plan->name, rows, plan->width);
    col->values = tbl_pool_get(pool, rows * plan->width * sizeof(float) + 1);
    col->lengths = plan->lengths ? tbl_pool_get(pool, rows * sizeof(int32_t) + 1) : NULL;
    if (col->values == NULL || (plan->lengths && col->lengths == NULL))
        return sg_fail(err, SG_ENOMEM, "no memory for %zu rows of column '%s'", rows, plan->name);
    return 0;
}

/* Batch row r of a binary column: its bytes, which must be plan->width. */
static int row_bytes(const TblLeaf *l, const TblPlan *plan, int64_t r, const uint8_t **bytes,
                     SgError *err)
{
    int64_t p = l->base + r, n;
    if (l->kind == TBL_FIXBIN) {
        *bytes = (const uint8_t *)l->arr->buffers[1] + p * l->size;
        n = l->size;
    } else {
        int64_t lo = tbl_offset_at(l->arr->buffers[1], l->large, p);
        n = tbl_offset_at(l->arr->buffers[1], l->large, p + 1) - lo;
        *bytes = (const uint8_t *)l->arr->buffers[2] + lo;
    }
    if ((size_t)n != plan->width)
        return sg_fail(err, SG_ESCHEMA, "column '%s' holds %lld bytes, not its width %zu",
                       plan->name, (long long)n, plan->width);
    return 0;
}

/* A binary column without null rows to fill stays bytes in the chunk
 * (col->u8: a quarter of the memory), made float32 as rows are gathered.
 * With `borrow` and every row kept, the rows, each checked to be the plan's
 * width, lie one after another in the batch's value buffer (offsets that
 * differ by the width each time): the column points at the first
 * (col->borrowed) instead of copying them. */
static int convert_bytes(TblColumn *col, const TblLeaf *l, const TblPlan *plan, const uint8_t *keep,
                         int64_t rows, size_t kept, const TblWhere *where, TblPool *pool,
                         int borrow, SgError *err)
{
    col->out = TBL_OUT_F32;
    col->width = plan->width;
    col->u8 = 1;
    if (borrow && kept == (size_t)rows && rows > 0) {
        const uint8_t *first = NULL, *bytes;
        for (int64_t r = 0; r < rows; r++) {
            if (row_bytes(l, plan, r, &bytes, err) < 0)
                return at(err, where, r);
            if (r == 0)
                first = bytes;
        }
        col->bytes = (uint8_t *)first;
        col->borrowed = 1;
        return 0;
    }
    col->bytes = tbl_pool_get(pool, kept * plan->width + 1);
    if (col->bytes == NULL)
        return sg_fail(err, SG_ENOMEM, "no memory for %zu rows of column '%s'", kept, plan->name);
    size_t k = 0;
    for (int64_t r = 0; r < rows; r++) {
        if (!keep[r])
            continue;
        const uint8_t *bytes;
        if (row_bytes(l, plan, r, &bytes, err) < 0)
            return at(err, where, r);
        memcpy(col->bytes + k++ * plan->width, bytes, plan->width);
    }
    return 0;
}

/* Batch row r of a numbers / list / binary / vector column into dst[width]
 * (and *length); fails naming the column when the row does not fit. */
static int convert_row(float *dst, int32_t *length, const TblLeaf *l, const TblPlan *plan,
                       int64_t r, uint8_t state, SgError *err)
{
    size_t width = plan->width;
    int64_t p = l->base + r, lo, hi, n;
    if (state == ROW_NULL) { /* only under TBL_NULLS_FILL */
        for (size_t i = 0; i < width; i++)
            dst[i] = plan->fill;
        *length = 0;
        return 0;
    }
    switch (l->kind) {
    case TBL_NUM:
        numbers_to_f32(dst, l->arr, l->fmt, p, 1);
        *length = 1;
        return 0;
    case TBL_FIXLIST:
    case TBL_LIST:
        list_range(l, r, &lo, &hi);
        n = hi - lo;
        if ((size_t)n > width) {
            if (!plan->truncate)
                return sg_fail(err, SG_ESCHEMA,
                               "column '%s' holds %lld values, more than its width %zu", plan->name,
                               (long long)n, width);
            n = (int64_t)width;
        }
        numbers_to_f32(dst, l->values, l->fmt, lo, n);
        if (state == ELEM_NULL)
            fill_nulls(dst, l->values, lo, n, plan->fill);
        for (size_t i = (size_t)n; i < width; i++)
            dst[i] = plan->pad;
        *length = (int32_t)n;
        return 0;
    case TBL_BIN:
    case TBL_FIXBIN: {
        const uint8_t *bytes;
        int rc = row_bytes(l, plan, r, &bytes, err);
        if (rc < 0)
            return rc;
        for (size_t i = 0; i < width; i++)
            dst[i] = (float)bytes[i];
        *length = (int32_t)width;
        return 0;
    }
    case TBL_VECTOR:
        return tbl_vector_row(dst, length, l, plan->name, width, r, err);
    case TBL_STR:
        break;
    }
    return sg_fail(err, SG_ESTATE, "column '%s': not a numeric column", plan->name);
}

static int convert_strings(TblColumn *col, const TblLeaf *l, const TblPlan *plan, const Column *c,
                           const uint8_t *keep, int64_t rows, size_t kept, TblPool *pool,
                           SgError *err)
{
    const void *offsets = l->arr->buffers[1];
    size_t bytes = 0;
    for (int64_t r = 0; r < rows; r++)
        if (keep[r] && (c->nulls == NULL || c->nulls[r] == ROW_OK))
            bytes += (size_t)(tbl_offset_at(offsets, l->large, l->base + r + 1) -
                              tbl_offset_at(offsets, l->large, l->base + r));
    int rc = alloc_column(col, plan, kept, bytes, pool, err);
    if (rc < 0)
        return rc;
    size_t k = 0, pos = 0;
    for (int64_t r = 0; r < rows; r++) {
        if (!keep[r])
            continue;
        if (c->nulls == NULL || c->nulls[r] == ROW_OK) {
            int64_t lo = tbl_offset_at(offsets, l->large, l->base + r);
            size_t n = (size_t)(tbl_offset_at(offsets, l->large, l->base + r + 1) - lo);
            if (n > 0)
                memcpy(col->bytes + pos, (const uint8_t *)l->arr->buffers[2] + lo, n);
            pos += n;
        }
        col->offsets[++k] = (int64_t)pos;
    }
    return 0;
}

/* An integer column (or lists of integers) as int64 ids [rows, width]. */
static int convert_ints(TblColumn *col, const TblLeaf *l, const TblPlan *plan, const Column *c,
                        const uint8_t *keep, int64_t rows, size_t kept, const TblWhere *where,
                        TblPool *pool, SgError *err)
{
    size_t width = plan->width;
    col->out = TBL_OUT_I64;
    col->width = width;
    if (width > 0 && kept > SIZE_MAX / sizeof(int64_t) / width)
        return sg_fail(err, SG_ENOMEM, "column '%s': %zu rows of %zu ids is too large", plan->name,
                       kept, width);
    col->ints = tbl_pool_get(pool, kept * width * sizeof(int64_t) + 1);
    col->lengths = plan->lengths ? tbl_pool_get(pool, kept * sizeof(int32_t) + 1) : NULL;
    if (col->ints == NULL || (plan->lengths && col->lengths == NULL))
        return sg_fail(err, SG_ENOMEM, "no memory for %zu rows of column '%s'", kept, plan->name);
    size_t k = 0;
    for (int64_t r = 0; r < rows; r++) {
        if (!keep[r])
            continue;
        int64_t *dst = col->ints + k * width, lo = l->base + r, hi = lo + 1, n;
        uint8_t state = c->nulls != NULL ? c->nulls[r] : ROW_OK;
        if (state == ROW_NULL) { /* only under TBL_NULLS_FILL */
            for (size_t i = 0; i < width; i++)
                dst[i] = (int64_t)plan->fill;
            n = 0;
        } else {
            const struct ArrowArray *src = l->arr;
            if (l->kind != TBL_NUM) {
                list_range(l, r, &lo, &hi);
                src = l->values;
            }
            n = hi - lo;
            if ((size_t)n > width) {
                if (!plan->truncate) {
                    sg_fail(err, SG_ESCHEMA,
                            "column '%s' holds %lld values, more than its width %zu", plan->name,
                            (long long)n, width);
                    return at(err, where, r);
                }
                n = (int64_t)width;
            }
            integers_to_i64(dst, src, l->fmt, lo, n);
            for (int64_t i = 0; state == ELEM_NULL && i < n; i++)
                if (tbl_is_null(src, lo + i))
                    dst[i] = (int64_t)plan->fill;
            for (size_t i = (size_t)n; i < width; i++)
                dst[i] = (int64_t)plan->pad;
        }
        if (col->lengths != NULL)
            col->lengths[k] = (int32_t)n;
        k++;
    }
    return 0;
}

static int convert_column(TblColumn *col, const TblLeaf *l, const TblPlan *plan, const Column *c,
                          const uint8_t *keep, int64_t rows, size_t kept, const TblWhere *where,
                          TblPool *pool, int borrow, SgError *err)
{
    if (plan->out == TBL_OUT_STR)
        return convert_strings(col, l, plan, c, keep, rows, kept, pool, err);
    if (plan->out == TBL_OUT_I64)
        return convert_ints(col, l, plan, c, keep, rows, kept, where, pool, err);
    if ((l->kind == TBL_BIN || l->kind == TBL_FIXBIN) &&
        (c->nulls == NULL || plan->nulls != TBL_NULLS_FILL))
        return convert_bytes(col, l, plan, keep, rows, kept, where, pool, borrow, err);
    int rc = alloc_column(col, plan, kept, 0, pool, err);
    if (rc < 0)
        return rc;
    size_t k = 0;
    for (int64_t r = 0; r < rows; r++) {
        if (!keep[r])
            continue;
        int32_t length = 0;
        rc = convert_row(col->values + k * plan->width, &length, l, plan, r,
                         c->nulls ? c->nulls[r] : ROW_OK, err);
        if (rc < 0)
            return at(err, where, r);
        if (col->lengths != NULL)
            col->lengths[k] = length;
        k++;
    }
    return 0;
}

/* ---- batches lent to chunks ------------------------------------------------ */

typedef struct Held {
    struct ArrowArray array;
    struct Held *next;
} Held;

struct TblRelease {
    pthread_mutex_t mu;
    Held *queued;
};

int tbl_release_new(TblRelease **out, SgError *err)
{
    TblRelease *r = calloc(1, sizeof *r);
    if (r == NULL)
        return sg_fail(err, SG_ENOMEM, "allocating a table release queue");
    pthread_mutex_init(&r->mu, NULL);
    *out = r;
    return 0;
}

void tbl_release_drain(TblRelease *r)
{
    if (r == NULL)
        return;
    pthread_mutex_lock(&r->mu);
    Held *h = r->queued;
    r->queued = NULL;
    pthread_mutex_unlock(&r->mu);
    while (h != NULL) {
        Held *next = h->next;
        h->array.release(&h->array);
        free(h);
        h = next;
    }
}

void tbl_release_free(TblRelease *r)
{
    if (r == NULL)
        return;
    tbl_release_drain(r);
    pthread_mutex_destroy(&r->mu);
    free(r);
}

/* A freed chunk's batch into its queue; released here only when no node can
 * be had for it (out of memory: better than keeping it for good). */
static void give_back_batch(TblChunk *chunk)
{
    Held *h = malloc(sizeof *h);
    if (h == NULL) {
        chunk->held.release(&chunk->held);
        return;
    }
    h->array = chunk->held;
    pthread_mutex_lock(&chunk->release_to->mu);
    h->next = chunk->release_to->queued;
    chunk->release_to->queued = h;
    pthread_mutex_unlock(&chunk->release_to->mu);
}

void tbl_chunk_free(TblChunk *chunk)
{
    if (chunk == NULL)
        return;
    for (size_t i = 0; i < chunk->ncols; i++) {
        tbl_pool_put(chunk->pool, chunk->cols[i].values);
        tbl_pool_put(chunk->pool, chunk->cols[i].ints);
        tbl_pool_put(chunk->pool, chunk->cols[i].lengths);
        tbl_pool_put(chunk->pool, chunk->cols[i].offsets);
        if (!chunk->cols[i].borrowed)
            tbl_pool_put(chunk->pool, chunk->cols[i].bytes);
    }
    if (chunk->held.release != NULL)
        give_back_batch(chunk);
    free(chunk);
}

/* Applies each column's null policy: marks skipped rows in keep, fails on
 * a null under TBL_NULLS_ERROR. Returns the kept row count or an error. */
static int apply_nulls(const Column *cols, const TblPlan *plans, size_t nplans, uint8_t *keep,
                       int64_t rows, size_t *kept, const TblWhere *where, SgError *err)
{
    for (int64_t r = 0; r < rows; r++)
        keep[r] = 1;
    for (size_t i = 0; i < nplans; i++) {
        if (cols[i].nulls == NULL || plans[i].nulls == TBL_NULLS_FILL)
            continue;
        for (int64_t r = 0; r < rows; r++) {
            if (cols[i].nulls[r] == ROW_OK)
                continue;
            if (plans[i].nulls == TBL_NULLS_SKIP) {
                keep[r] = 0;
                continue;
            }
            sg_fail(err, SG_ESCHEMA,
                    "column '%s' is null%s (its null policy is 'error'; 'fill' or 'skip' it)",
                    plans[i].name, cols[i].nulls[r] == ELEM_NULL ? " inside its list" : "");
            return at(err, where, r);
        }
    }
    *kept = 0;
    for (int64_t r = 0; r < rows; r++)
        *kept += keep[r];
    return 0;
}

int tbl_chunk_from_arrow(TblChunk **out, const struct ArrowSchema *schema, struct ArrowArray *array,
                         TblPlan *plans, size_t nplans, const TblWhere *where, TblPool *pool,
                         TblRelease *lend, SgError *err)
{
    *out = NULL;
    int rc = tbl_check_batch(schema, array, err);
    if (rc < 0)
        return at(err, where, -1);
    int64_t rows = array->length;
    Column *cols = calloc(nplans > 0 ? nplans : 1, sizeof *cols);
    uint8_t *keep = malloc(rows > 0 ? (size_t)rows : 1);
    TblChunk *chunk = calloc(1, sizeof *chunk + nplans * sizeof(TblColumn));
    if (cols == NULL || keep == NULL || chunk == NULL) {
        rc = sg_fail(err, SG_ENOMEM, "no memory for a batch of %lld rows", (long long)rows);
        goto cleanup;
    }
    chunk->ncols = nplans;
    chunk->pool = pool;
    for (size_t i = 0; i < nplans; i++) {
        if ((rc = tbl_resolve(&cols[i].leaf, schema, array, plans[i].name, err)) < 0 ||
            (rc = find_nulls(&cols[i], rows, err)) < 0) {
            at(err, where, -1);
            goto cleanup;
        }
    }
    size_t kept = 0;
    if ((rc = apply_nulls(cols, plans, nplans, keep, rows, &kept, where, err)) < 0)
        goto cleanup;
    int64_t first = -1;
    for (int64_t r = 0; r < rows && first < 0; r++)
        if (keep[r])
            first = r;
    chunk->rows = chunk->pending = kept;
    for (size_t i = 0; i < nplans; i++) {
        int64_t first_valid = -1; /* a width from the data comes from a row with a value */
        for (int64_t r = first; r >= 0 && r < rows && first_valid < 0; r++)
            if (keep[r] && (cols[i].nulls == NULL || cols[i].nulls[r] == ROW_OK))
                first_valid = r;
        if ((rc = settle_plan(&plans[i], &cols[i].leaf, first_valid, err)) < 0) {
            at(err, where, first_valid);
            goto cleanup;
        }
        if (plans[i].out != TBL_OUT_STR && plans[i].width == 0 && kept > 0) {
            rc = sg_fail(err, SG_ESCHEMA,
                         "column '%s': no row has a value to take its width from; give the width",
                         plans[i].name);
            at(err, where, -1);
            goto cleanup;
        }
        if ((rc = convert_column(&chunk->cols[i], &cols[i].leaf, &plans[i], &cols[i], keep, rows,
                                 kept, where, pool, lend != NULL, err)) < 0)
            goto cleanup;
    }
    for (size_t i = 0; i < nplans; i++) {
        if (chunk->cols[i].borrowed) { /* the batch moves into the chunk */
            chunk->held = *array;
            chunk->release_to = lend;
            array->release = NULL;
            break;
        }
    }
    *out = chunk;
    chunk = NULL;
cleanup:
    for (size_t i = 0; cols != NULL && i < nplans; i++)
        free(cols[i].nulls);
    free(cols);
    free(keep);
    tbl_chunk_free(chunk);
    return rc;
}
