/*
 * ps_rows.c - a ps shard's embedding rows (ps_rows.h): layout checks, id
 * checks, the accumulation of pushed rows and their application.
 */
#include "net/ps_rows.h"

#include <stdlib.h>
#include <string.h>

#include "common/sg_le.h"

int ps_rows_init(PsShardRows *r, const PsServerConfig *cfg, SgError *err)
{
    int n = cfg->ntables;
    memset(r, 0, sizeof *r);
    r->offset = cfg->offset, r->count = cfg->count;
    int rc = ps_tables_check(cfg->total, cfg->tables, n, err);
    if (rc < 0)
        return rc;
    uint64_t end = cfg->offset + cfg->count, rows = 0;
    for (int t = 0; t < n; t++) {
        const OptimRows *tab = &cfg->tables[t];
        uint64_t lo = tab->off, hi = tab->off + (uint64_t)tab->rows * tab->dim;
        if ((cfg->offset > lo && cfg->offset < hi && (cfg->offset - lo) % tab->dim) ||
            (end > lo && end < hi && (end - lo) % tab->dim))
            return sg_fail(
                err, SG_EINVAL,
                "ps shard [%llu, +%llu) cuts a row of embedding table %d (rows of %zu at "
                "%zu): split with ps_shard_range_rows",
                (unsigned long long)cfg->offset, (unsigned long long)cfg->count, t, tab->dim,
                tab->off);
    }
    size_t m = (size_t)n + 1;
    if ((r->layout = calloc(m, sizeof *r->layout)) == NULL ||
        (r->tables = calloc(m, sizeof *r->tables)) == NULL ||
        (r->local = calloc(m, sizeof *r->local)) == NULL ||
        (r->segs = calloc(m, sizeof *r->segs)) == NULL ||
        (r->base = calloc(m, sizeof *r->base)) == NULL)
        return sg_fail(err, SG_ENOMEM, "ps shard: bookkeeping of %d embedding tables", n);
    if (n > 0)
        memcpy(r->layout, cfg->tables, (size_t)n * sizeof *r->layout);
    r->nlayout = n;
    r->ntables = ps_shard_tables(cfg->offset, cfg->count, cfg->tables, n, r->tables);
    r->nsegs = ps_dense_segments(r->tables, r->ntables, cfg->count, r->segs);
    r->dense_count = cfg->count;
    for (int t = 0; t < r->ntables; t++) {
        const PsTable *pt = &r->tables[t];
        r->base[t] = rows;
        r->local[t] = (OptimRows){(size_t)pt->off, (size_t)pt->nrows, (size_t)pt->dim, NULL, 0};
        rows += pt->nrows;
        r->dense_count -= pt->nrows * pt->dim;
    }
    if ((r->marked = calloc((size_t)rows + 1, 1)) == NULL ||
        (r->touched = calloc((size_t)rows + 1, sizeof *r->touched)) == NULL)
        return sg_fail(err, SG_ENOMEM, "ps shard: bookkeeping of %llu embedding rows",
                       (unsigned long long)rows);
    for (int t = 0; t < r->ntables; t++)
        r->local[t].ids = r->touched + r->base[t];
    return SG_OK;
}

void ps_rows_free(PsShardRows *r)
{
    free(r->layout), free(r->tables), free(r->local), free(r->segs);
    free(r->base), free(r->marked), free(r->touched);
    memset(r, 0, sizeof *r);
}

int ps_rows_check_layout(const PsShardRows *r, const char *peer, uint64_t n, const uint8_t *aux,
                         SgError *err)
{
    for (uint64_t t = 0; t < n && t < (uint64_t)r->nlayout; t++) {
        const OptimRows *tab = &r->layout[t];
        const uint8_t *w = aux + 24 * t;
        uint64_t off = sg_get_le64(w), rows = sg_get_le64(w + 8), dim = sg_get_le64(w + 16);
        if (off != tab->off || rows != tab->rows || dim != tab->dim)
            return sg_fail(err, SG_ECLUSTER,
                           "worker at %s has embedding table %llu at offset %llu as [%llu, %llu], "
                           "this ps has it at %zu as [%zu, %zu] (models differ between nodes, or "
                           "one side was given a parameter count instead of the model?)",
                           peer, (unsigned long long)t, (unsigned long long)off,
                           (unsigned long long)rows, (unsigned long long)dim, tab->off, tab->rows,
                           tab->dim);
    }
    if (n != (uint64_t)r->nlayout)
        return sg_fail(
            err, SG_ECLUSTER,
            "worker at %s has %llu embedding tables, this ps was given %d (models differ "
            "between nodes, or one side was given a parameter count instead of the "
            "model?)",
            peer, (unsigned long long)n, r->nlayout);
    return SG_OK;
}

int ps_rows_check_ids(const PsShardRows *r, const char *peer, uint64_t t, const int32_t *ids,
                      size_t nids, const PsTable **held, SgError *err)
{
    const PsTable *pt = NULL;
    if (t >= (uint64_t)r->nlayout)
        return sg_fail(err, SG_EINVAL, "%s names embedding table %llu; the model has %d tables",
                       peer, (unsigned long long)t, r->nlayout);
    for (int i = 0; i < r->ntables; i++)
        if ((uint64_t)r->tables[i].index == t)
            pt = &r->tables[i];
    if (pt == NULL && nids > 0)
        return sg_fail(
            err, SG_EINVAL,
            "rows of embedding table %llu (row %d) sent by %s to ps shard [%llu, +%llu), "
            "which holds none of that table's rows",
            (unsigned long long)t, (int)ids[0], peer, (unsigned long long)r->offset,
            (unsigned long long)r->count);
    for (size_t i = 0; i < nids; i++) {
        int64_t id = ids[i];
        if (id < (int64_t)pt->row0 || id >= (int64_t)(pt->row0 + pt->nrows))
            return sg_fail(err, SG_EINVAL,
                           "row %lld of embedding table %llu (%zu rows) sent by %s is not on ps "
                           "shard [%llu, +%llu), which holds its rows [%llu, %llu)",
                           (long long)id, (unsigned long long)t, r->layout[t].rows, peer,
                           (unsigned long long)r->offset, (unsigned long long)r->count,
                           (unsigned long long)pt->row0,
                           (unsigned long long)(pt->row0 + pt->nrows));
        if (i > 0 && id <= ids[i - 1])
            return sg_fail(err, SG_EINVAL,
                           "rows of embedding table %llu from %s are not sorted and unique (%d "
                           "after %d)",
                           (unsigned long long)t, peer, (int)id, (int)ids[i - 1]);
    }
    *held = pt;
    return SG_OK;
}

int ps_rows_push_size(const PsShardRows *r, const char *peer, const uint64_t v[4], size_t *aux,
                      size_t *nvals, SgError *err)
{
    if (v[1] > (uint64_t)r->ntables || v[2] > r->count || v[3] > r->count - r->dense_count)
        return sg_fail(err, SG_EPROTO,
                       "rows push from %s of %llu tables, %llu ids and %llu row floats: this "
                       "shard holds rows of %d tables in %llu floats",
                       peer, (unsigned long long)v[1], (unsigned long long)v[2],
                       (unsigned long long)v[3], r->ntables,
                       (unsigned long long)(r->count - r->dense_count));
    *aux = (size_t)(8 * v[1] + 4 * v[2]);
    *nvals = (size_t)(r->dense_count + v[3]);
    return SG_OK;
}

/* Adds k rows (global ids, gradients g) of held table pt to accum and marks them. */
static void add_rows(PsShardRows *r, const PsTable *pt, const int32_t *ids, uint64_t k,
                     const float *g, float *accum)
{
    uint64_t t = (uint64_t)(pt - r->tables);
    for (uint64_t i = 0; i < k; i++, g += pt->dim) {
        uint64_t row = (uint64_t)ids[i] - pt->row0;
        float *a = accum + pt->off + row * pt->dim;
        for (uint64_t j = 0; j < pt->dim; j++)
            a[j] += g[j];
        if (!r->marked[r->base[t] + row]) {
            r->marked[r->base[t] + row] = 1;
            r->touched[r->base[t] + r->local[t].nids++] = (int32_t)row;
        }
    }
}

int ps_rows_push(PsShardRows *r, const char *peer, const uint64_t v[4], const uint8_t *aux,
                 const float *vals, float *accum, SgError *err)
{
    const int32_t *ids = (const int32_t *)(aux + 8 * v[1]);
    const float *g = vals + r->dense_count;
    uint64_t nids = 0, nvals = 0;
    for (uint64_t e = 0; e < v[1]; e++) {
        uint64_t t = sg_get_le32(aux + 8 * e), k = sg_get_le32(aux + 8 * e + 4);
        const PsTable *pt = NULL;
        int rc;
        if (k > v[2] - nids)
            return sg_fail(err, SG_EINVAL, "rows push from %s lists more ids than its %llu", peer,
                           (unsigned long long)v[2]);
        if (e > 0 && t <= sg_get_le32(aux + 8 * e - 8))
            return sg_fail(err, SG_EINVAL, "rows push from %s lists table %llu out of order", peer,
                           (unsigned long long)t);
        if ((rc = ps_rows_check_ids(r, peer, t, ids + nids, (size_t)k, &pt, err)) < 0)
            return rc;
        if (accum != NULL && k > 0) {
            add_rows(r, pt, ids + nids, k, g, accum);
            g += k * pt->dim;
        }
        nids += k;
        nvals += k * (pt != NULL ? pt->dim : 0);
    }
    if (nids != v[2] || nvals != v[3])
        return sg_fail(err, SG_EINVAL,
                       "rows push from %s announces %llu ids and %llu row floats, its entries "
                       "hold %llu and %llu",
                       peer, (unsigned long long)v[2], (unsigned long long)v[3],
                       (unsigned long long)nids, (unsigned long long)nvals);
    for (int k = 0; accum != NULL && k < r->nsegs; k++)
        for (uint64_t i = r->segs[k][0]; i < r->segs[k][1]; i++)
            accum[i] += *vals++;
    return SG_OK;
}

static int cmp_i32(const void *a, const void *b)
{
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    return (x > y) - (x < y);
}

/* The spans a rows step changes: the dense segments, then every marked row;
 * [*lo, *lo + *n) of span i, 0 past the last. */
static int span(const PsShardRows *r, size_t i, uint64_t *lo, uint64_t *n)
{
    if (i < (size_t)r->nsegs) {
        *lo = r->segs[i][0], *n = r->segs[i][1] - r->segs[i][0];
        return 1;
    }
    i -= (size_t)r->nsegs;
    for (int t = 0; t < r->ntables; t++) {
        const OptimRows *l = &r->local[t];
        if (i < l->nids) {
            *lo = l->off + (uint64_t)l->ids[i] * l->dim, *n = l->dim;
            return 1;
        }
        i -= l->nids;
    }
    return 0;
}

int ps_rows_apply(PsShardRows *r, float *params, float *accum, float scale, Optimizer *optim,
                  PsApplyFn apply, void *apply_ctx, SgError *err)
{
    uint64_t lo, n;
    int rc = SG_OK;
    for (int t = 0; t < r->ntables; t++)
        qsort(r->touched + r->base[t], r->local[t].nids, sizeof(int32_t), cmp_i32);
    for (size_t i = 0; scale != 1.0f && span(r, i, &lo, &n); i++)
        for (uint64_t j = lo; j < lo + n; j++)
            accum[j] *= scale;
    if (optim != NULL)
        rc = optim_step_rows(optim, params, accum, (size_t)r->count, r->local, r->ntables, NULL, 0,
                             err);
    for (size_t i = 0; optim == NULL && rc == 0 && span(r, i, &lo, &n); i++)
        rc = apply(apply_ctx, params + lo, accum + lo, (size_t)n, err);
    for (size_t i = 0; span(r, i, &lo, &n); i++)
        memset(accum + lo, 0, (size_t)n * sizeof(float));
    ps_rows_clear_marks(r);
    return rc;
}

void ps_rows_clear_marks(PsShardRows *r)
{
    for (int t = 0; t < r->ntables; t++) {
        OptimRows *l = &r->local[t];
        for (size_t i = 0; i < l->nids; i++)
            r->marked[r->base[t] + (uint64_t)l->ids[i]] = 0;
        l->nids = 0;
    }
}

void ps_rows_gather_dense(const PsShardRows *r, const float *params, float *out)
{
    for (int k = 0; k < r->nsegs; k++) {
        size_t len = (size_t)(r->segs[k][1] - r->segs[k][0]);
        memcpy(out, params + r->segs[k][0], len * sizeof(float));
        out += len;
    }
}
