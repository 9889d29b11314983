/*
 * nn_op_embedding.c - Embedding, as Keras' layer: integer ids in, rows of a
 * table out. oneDNN has no primitive for it; forward is a gather and
 * backward a scatter-add, in C.
 *
 *   ids    [B, T, K] float32 values (T = 1 for ids of shape (K,) per sample)
 *   table  [input_dim, D]     ("embeddings", Keras' layout)
 *   out    [B, T, K, D]       stored as NHWC (T, K, D); (1, K, D) for (K,)
 *
 * Ids reach the op as float32 values: the batch gather converts int32 and
 * int64 inputs exactly below 2^24 (NN_MAX_EMBEDDING_ROWS caps input_dim),
 * and lookups and hashing produce float-valued ids the same way. Forward
 * refuses an id that is negative, not below input_dim or not an integer,
 * naming the input, the data row and the column, before it writes anything.
 *
 * The table's gradient is a set of rows. Its range of m->grads is zero
 * except for the rows the last backward touched (m->touched[table], sorted
 * and unique; duplicates within a batch summed into one row): a backward
 * first zeroes the rows the previous one wrote (or the whole range after a
 * gradient hook, which may write any row), then scatter-adds. So no step
 * does work in proportion to the table, and dense readers of the buffer (the
 * allreduce, the parameter-server push, Model.grads) see the right
 * gradient. Plain SGD folded in (NNOpBackward.sgd_lr) updates the touched
 * rows and clears them again. A shared Embedding's calls add into one table;
 * the group's last call (the first the backward reaches) starts the step,
 * its first finishes it (sorts the rows, tells the hook).
 *
 * mask_zero is accepted with Keras' meaning and has no numeric effect: no
 * layer here consumes a mask. Plan scratch: the batch's ids as int32 [B*T*K].
 */
#include "nn/nn_op.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Ids per sample (T * K). */
static size_t ids_per_sample(const Model *m, int l)
{
    const LayerShape *s = &m->shapes[l];
    return (size_t)s->h * s->w * s->c;
}

static int embedding_infer(Model *m, int l, SgError *err)
{
    const LayerSpec *sp = &m->specs[l];
    LayerShape *s = &m->shapes[l];
    if (sp->input_dim < 1 || sp->input_dim > NN_MAX_EMBEDDING_ROWS)
        return sg_fail(err, SG_EMODEL,
                       "layer %d (Embedding): input_dim must be 1 to %d (2^24: ids travel as "
                       "float32 values, exact below it), not %d",
                       l, NN_MAX_EMBEDDING_ROWS, sp->input_dim);
    if (sp->units < 1)
        return sg_fail(err, SG_EMODEL, "layer %d (Embedding): output_dim must be > 0, not %d", l,
                       sp->units);
    if (s->h != 1)
        return sg_fail(err, SG_EMODEL,
                       "layer %d (Embedding): its input is %dx%dx%d per sample; Embedding takes "
                       "ids of shape (k,) or (t, k)",
                       l, s->h, s->w, s->c);
    s->oh = s->w, s->ow = s->c, s->oc = sp->units;
    const int shape[2] = {sp->input_dim, sp->units};
    model_add_param(m, l, "embeddings", NN_FILL_INIT, 2, shape);
    return 0;
}

static size_t embedding_scratch(const Model *m, int l, int B)
{
    return (size_t)B * ids_per_sample(m, l); /* int32 ids, one float each */
}

/* SG_EINVAL for the id at flat position i of the batch. */
static int bad_id(const Model *m, const Plan *p, int l, size_t i, float v, SgError *err)
{
    const size_t per = ids_per_sample(m, l);
    const int t = node_in(m, l, 0);
    char where[48], what[96];
    if (t < m->ninputs)
        snprintf(where, sizeof where, "input %d (tensor %d)", t, t);
    else
        snprintf(where, sizeof where, "its input (tensor %d)", t);
    if (isfinite(v) && v == floorf(v))
        snprintf(what, sizeof what, "is outside [0, %d)%s", m->specs[l].input_dim,
                 fabsf(v) >= 16777216.0f ? " (shown as float32 holds it)" : "");
    else
        snprintf(what, sizeof what, "is not an integer");
    return sg_fail(err, SG_EINVAL,
                   "layer %d (Embedding): id %.9g in column %zu of row %lld of %s %s", l, (double)v,
                   i % per, (long long)p->rows[i / per], where, what);
}

static int unique_ids(NnTable *tb, size_t rows, int32_t *a, int32_t *tmp, size_t *n, SgError *err);
static int reserve_ids(NnTable *tb, size_t have, size_t more, SgError *err);

/* Asks the hook (rows()) for the rows the batch's n ids read, sorted and
 * unique, before they are read. The table's id buffers serve as scratch
 * past the rows the gradient range holds (tr->ids, which the next backward
 * clears; they may be the hook's own memory). */
static int pull_rows(Model *m, int l, const int32_t *ids, size_t n, SgError *err)
{
    OptimRows *tr = &m->touched[m->table_of[l]];
    NnTable *tb = &m->tables[m->table_of[l]];
    const int own = tr->ids == tb->ids;
    const size_t keep = own ? tr->nids : 0;
    int rc = reserve_ids(tb, keep, n, err);
    if (rc < 0)
        return sg_context(err, "layer %d (Embedding): ", l);
    if (own)
        tr->ids = tb->ids; /* the buffers may have moved */
    int32_t *want = tb->ids + keep, *tmp = tb->tmp + keep;
    memcpy(want, ids, n * sizeof *ids);
    size_t u = n;
    if ((rc = unique_ids(tb, tr->rows, want, tmp, &u, err)) < 0)
        return sg_context(err, "layer %d (Embedding): ", l);
    if ((rc = m->hook->rows(m->hook->ctx, m->params, tr, want, u, err)) < 0)
        return sg_context(err, "layer %d (Embedding): the gradient hook's rows: ", l);
    return 0;
}

/* The loops below, compiled for AVX-512, AVX2 and the baseline and picked
 * at load time (copies and sums: every clone gives the same floats); rows
 * of a few floats copied and cleared in the loop, not by a call per row. */
#define EMB_CLONES                                                                                 \
    __attribute__((target_clones("avx512f", "avx2", "default"),                                    \
                   optimize("no-tree-loop-distribute-patterns")))

#define ROWS_AHEAD 16 /* rows prefetched ahead of the one read */

/* ids[i] = src[i] for i < n while each is an integer in [0, rows): n, or
 * the first position that is not. */
EMB_CLONES static size_t float_ids(int32_t *restrict ids, const float *restrict src, size_t n,
                                   float rows)
{
    for (size_t lo = 0; lo < n; lo += 256) { /* a block checked at once, then converted */
        const size_t hi = n - lo < 256 ? n : lo + 256;
        int bad = 0;
        for (size_t i = lo; i < hi; i++)
            bad |= !(src[i] >= 0.0f && src[i] < rows) | (src[i] != floorf(src[i]));
        if (bad) {
            for (size_t i = lo; i < hi; i++)
                if (!(src[i] >= 0.0f && src[i] < rows) || src[i] != floorf(src[i]))
                    return i;
        }
        for (size_t i = lo; i < hi; i++)
            ids[i] = (int32_t)src[i];
    }
    return n;
}

/* dst[i] = table[ids[i]] for i in [lo, hi): rows of a few floats, a loop the
 * compiler vectorises (a memcpy call each costs more). */
EMB_CLONES static void gather_rows(float *restrict dst, const float *restrict table,
                                   const int32_t *ids, size_t lo, size_t hi, size_t D)
{
    for (size_t i = lo; i < hi; i++) {
        if (i + ROWS_AHEAD < hi) /* scattered over the table: fetched ahead */
            __builtin_prefetch(table + (size_t)ids[i + ROWS_AHEAD] * D, 0);
        const float *restrict row = table + (size_t)ids[i] * D;
        float *restrict out = dst + i * D;
        for (size_t j = 0; j < D; j++)
            out[j] = row[j];
    }
}

/* g[ids[i]] += dy[i] for the i < n whose id is in [lo, hi), in order (a
 * repeated id sums as on one thread, whichever thread owns its rows). */
EMB_CLONES static void scatter_rows(float *g, const float *dy, const int32_t *ids, size_t n,
                                    size_t D, int32_t lo, int32_t hi)
{
    for (size_t i = 0; i < n; i++) {
        if (i + ROWS_AHEAD < n && ids[i + ROWS_AHEAD] >= lo && ids[i + ROWS_AHEAD] < hi)
            __builtin_prefetch(g + (size_t)ids[i + ROWS_AHEAD] * D, 1);
        if (ids[i] < lo || ids[i] >= hi)
            continue;
        float *restrict row = g + (size_t)ids[i] * D;
        const float *restrict d = dy + i * D;
        for (size_t j = 0; j < D; j++)
            row[j] += d[j];
    }
}

/* scatter_rows over the table's rows, split by row among the OpenMP
 * threads when the batch is large: no two threads add into one row. */
static void scatter_add(float *g, const float *dy, const int32_t *ids, size_t n, size_t D,
                        size_t rows)
{
    const int nt = n * D >= 65536 ? omp_get_max_threads() : 1;
    if (nt <= 1) {
        scatter_rows(g, dy, ids, n, D, 0, (int32_t)rows);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        const size_t k = (size_t)omp_get_thread_num(), T = (size_t)omp_get_num_threads();
        scatter_rows(g, dy, ids, n, D, (int32_t)(rows * k / T), (int32_t)(rows * (k + 1) / T));
    }
}

/* out[i] = table[ids[i]], the ids checked first. */
static int embedding_forward(Model *m, Plan *p, int l, int training, SgError *err)
{
    int rc = DNNL(err, dnnl_stream_wait, m->stream); /* the CPU reads what primitives wrote */
    if (rc < 0)
        return rc;
    const size_t n = (size_t)p->B * ids_per_sample(m, l), D = (size_t)m->specs[l].units;
    const float *src = op_src(m, p, l, 0);
    int32_t *ids = (int32_t *)p->lp[l].scratch;
    const size_t bad = float_ids(ids, src, n, (float)m->specs[l].input_dim);
    if (bad < n)
        return bad_id(m, p, l, bad, src[bad], err);
    if (training && m->hook != NULL && m->hook->sparse && m->hook->rows != NULL &&
        (rc = pull_rows(m, l, ids, n, err)) < 0)
        return rc;
    const float *table = m->params + op_param(m, l, 0)->offset;
    float *dst = op_dst(m, p, l);
    const int nt = n * D >= 65536 ? omp_get_max_threads() : 1;
    if (nt <= 1) {
        gather_rows(dst, table, ids, 0, n, D);
        return 0;
    }
#pragma omp parallel num_threads(nt)
    {
        const size_t k = (size_t)omp_get_thread_num(), T = (size_t)omp_get_num_threads();
        gather_rows(dst, table, ids, n * k / T, n * (k + 1) / T, D);
    }
    return 0;
}

/* Sorts a[0..n) (values in [0, 2^24)) by LSD radix, 8 bits a pass, and
 * drops repeats: the count of distinct values. */
static size_t sort_unique(int32_t *a, int32_t *tmp, size_t n)
{
    int32_t top = 0;
    for (size_t i = 0; i < n; i++)
        top = a[i] > top ? a[i] : top;
    int32_t *src = a, *dst = tmp;
    for (int shift = 0; shift < 32 && (top >> shift) > 0; shift += 8) {
        size_t count[257] = {0};
        for (size_t i = 0; i < n; i++)
            count[((src[i] >> shift) & 255) + 1]++;
        for (int k = 0; k < 256; k++)
            count[k + 1] += count[k];
        for (size_t i = 0; i < n; i++)
            dst[count[(src[i] >> shift) & 255]++] = src[i];
        int32_t *t = src;
        src = dst, dst = t;
    }
    if (src != a)
        memcpy(a, src, n * sizeof *a);
    size_t u = 0;
    for (size_t i = 0; i < n; i++)
        if (u == 0 || a[i] != a[u - 1])
            a[u++] = a[i];
    return u;
}

/* Sorts a[0..n) (values in [0, 2^24)) and drops repeats through the bitmap
 * seen (zero on entry and on return): a bit set per value, then the set bits
 * read back in order. The count of distinct values. */
static size_t bitmap_unique(int32_t *a, size_t n, uint64_t *seen, size_t words)
{
    for (size_t i = 0; i < n; i++)
        seen[(uint32_t)a[i] >> 6] |= (uint64_t)1 << (a[i] & 63);
    size_t u = 0;
    for (size_t w = 0; w < words; w++) {
        uint64_t x = seen[w];
        if (x == 0)
            continue;
        seen[w] = 0;
        for (; x != 0; x &= x - 1)
            a[u++] = (int32_t)(w * 64 + (size_t)__builtin_ctzll(x));
    }
    return u;
}

/* a[0..*n) of a table of `rows` sorted and made unique, *n the count left:
 * through the table's bitmap where reading it back costs no more than a few
 * passes over the ids (rows <= 256 n: the batch's ids of one table usually
 * are), else by radix sort. */
static int unique_ids(NnTable *tb, size_t rows, int32_t *a, int32_t *tmp, size_t *n, SgError *err)
{
    const size_t words = (rows + 63) / 64;
    if (words > 4 * *n) {
        *n = sort_unique(a, tmp, *n);
        return 0;
    }
    if (tb->seen == NULL && (tb->seen = calloc(words, sizeof *tb->seen)) == NULL)
        return sg_fail(err, SG_ENOMEM, "Embedding: cannot allocate a bitmap of %zu rows", rows);
    *n = bitmap_unique(a, *n, tb->seen, words);
    return 0;
}

/* g[ids[i]] = 0 for i < n: rows of a few floats, stored in the loop (not a
 * memset call per row). */
EMB_CLONES static void zero_rows(float *g, const int32_t *ids, size_t n, size_t D)
{
    for (size_t i = 0; i < n; i++) {
        float *restrict row = g + (size_t)ids[i] * D;
        for (size_t j = 0; j < D; j++)
            row[j] = 0.0f;
    }
}

/* Zeroes what the table's gradient range may hold from before: the rows the
 * last backward wrote, or all of it after a hook. */
static void clear_rows(NnTable *tb, const OptimRows *tr, float *g)
{
    const size_t D = tr->dim;
    if (tb->grads_whole) {
        const size_t n = tr->rows * D, chunk = 1 << 20;
#pragma omp parallel for schedule(static) if (n > chunk)
        for (size_t at = 0; at < n; at += chunk)
            memset(g + at, 0, (n - at < chunk ? n - at : chunk) * sizeof(float));
    } else if (tb->grads_rows) {
        zero_rows(g, tr->ids, tr->nids, D);
    }
    tb->grads_whole = tb->grads_rows = 0;
}

/* Room for `more` ids beyond `have` in the table's buffers. */
static int reserve_ids(NnTable *tb, size_t have, size_t more, SgError *err)
{
    if (have + more <= tb->cap)
        return 0;
    size_t cap = 2 * (have + more);
    int32_t *ids = realloc(tb->ids, cap * sizeof *ids);
    if (ids != NULL)
        tb->ids = ids;
    int32_t *tmp = ids ? realloc(tb->tmp, cap * sizeof *tmp) : NULL;
    if (tmp == NULL)
        return sg_fail(err, SG_ENOMEM, "Embedding: cannot allocate %zu row ids", cap);
    tb->tmp = tmp;
    tb->cap = cap;
    return 0;
}

int model_tables_keep_ids(Model *m, SgError *err)
{
    for (int i = 0; i < m->ntables; i++) {
        OptimRows *tr = &m->touched[i];
        NnTable *tb = &m->tables[i];
        if (tr->ids == tb->ids || tr->nids == 0) {
            tr->ids = tb->ids;
            continue;
        }
        int rc = reserve_ids(tb, 0, tr->nids, err);
        if (rc < 0)
            return sg_context(err, "Embedding table %d: ", i);
        memmove(tb->ids, tr->ids, tr->nids * sizeof *tb->ids);
        tr->ids = tb->ids;
    }
    return 0;
}

static int embedding_backward(Model *m, Plan *p, int l, const NnOpBackward *how, SgError *err)
{
    int rc = DNNL(err, dnnl_stream_wait, m->stream);
    if (rc < 0)
        return rc;
    OptimRows *tr = &m->touched[m->table_of[l]];
    NnTable *tb = &m->tables[m->table_of[l]];
    const size_t n = (size_t)p->B * ids_per_sample(m, l), D = tr->dim;
    float *g = m->grads + tr->off;
    if (!m->accumulate[l]) { /* the step's first call of this table */
        clear_rows(tb, tr, g);
        tr->nids = 0;
        /* from here the rows listed (unsorted until the last call) are what
         * the range holds, also if the pass stops before that call */
        tb->grads_rows = 1;
    }
    if ((rc = reserve_ids(tb, tr->nids, n, err)) < 0)
        return sg_context(err, "layer %d (Embedding): ", l);
    tr->ids = tb->ids;
    const int32_t *ids = (const int32_t *)p->lp[l].scratch;
    const float *dy = op_ddst(m, p, l);
    scatter_add(g, dy, ids, n, D, tr->rows);
    memcpy(tb->ids + tr->nids, ids, n * sizeof *ids);
    tr->nids += n;
    if (!m->tells[l])
        return 0;
    /* the table's last call: its rows, sorted and unique */
    if ((rc = unique_ids(tb, tr->rows, tb->ids, tb->tmp, &tr->nids, err)) < 0)
        return sg_context(err, "layer %d (Embedding): ", l);
    if (how->sgd_lr != NULL) { /* folded plain SGD: p -= lr * g on those rows, then g = 0 */
        const float lr = *how->sgd_lr;
        float *w = m->params + tr->off;
        for (size_t i = 0; i < tr->nids; i++) {
            const size_t at = (size_t)tr->ids[i] * D;
#pragma omp simd
            for (size_t j = 0; j < D; j++) {
                w[at + j] -= lr * g[at + j];
                g[at + j] = 0.0f;
            }
        }
        tb->grads_rows = 0;
    }
    if (how->hook != NULL && how->hook->ready != NULL && !how->hook->sparse &&
        (rc = how->hook->ready(how->hook->ctx, m->grads, tr->off, tr->rows * D, err)) < 0)
        return sg_context(err, "gradient hook on layer %d: ", l);
    return 0;
}

const NnOpKind nn_op_embedding = {
    "Embedding",
    NN_OP_FOLDS_SGD | NN_OP_SPARSE_ROWS,
    embedding_infer,
    embedding_scratch,
    NULL,
    embedding_forward,
    embedding_backward,
};
