/*
 * coll_hook.c - the gradient hook of nn/nn_hook.h on a ring communicator
 * (semantics in coll.h): step() allreduces the flat float32 gradients, with
 * local accumulation over backward_passes_per_step calls and, when
 * bucket_bytes > 0, buckets reduced by a background thread as ready()
 * reports them. Buckets and the ranges step() adds are queued in one FIFO
 * served by one thread, so every rank issues the same collectives in the same
 * order (the ready() calls follow the model's layers, the same everywhere).
 * A sparse hook's Embedding tables are left out of the ranges and reduced
 * after them, as rows or densely (coll_rows.c), once the FIFO is empty.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "common/sg_grow.h"
#include "net/coll_internal.h"

typedef struct Range {
    size_t off, cnt;
} Range;

struct CollHook {
    NnGradHook iface;
    CollComm *c;
    CollOp op;
    CollCompression comp;
    int k;               /* backward passes per step */
    size_t bucket_elems; /* 0: no overlap */
    float *accum;        /* [accum_n] sum of this cycle's local gradients (k > 1) */
    size_t accum_n;
    uint64_t calls; /* step() calls so far */

    /* this pass's ready() ranges: covered (sorted on use) and the bucket
     * being gathered, [pend_lo, pend_hi) */
    Range *covered;
    size_t ncovered, capcovered;
    size_t pend_lo, pend_hi;
    float *grads; /* the buffer ready() saw */

    /* the communication thread and its FIFO of ranges of `grads` */
    pthread_t th;
    int started, stop, busy;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    Range *queue;
    size_t qhead, qlen, qcap;
    int rc;
    SgError err;

    CollRows rows; /* a sparse hook's tables */
};

static int reducing_pass(const CollHook *h)
{
    return h->k <= 1 || h->calls % (uint64_t)h->k == (uint64_t)(h->k - 1);
}

static void *hook_thread(void *arg)
{
    CollHook *h = arg;
    pthread_mutex_lock(&h->mu);
    for (;;) {
        while (!h->stop && h->qlen == 0)
            pthread_cond_wait(&h->cv, &h->mu);
        if (h->qlen == 0)
            break;
        Range r = h->queue[h->qhead];
        h->qhead++, h->qlen--;
        h->busy = 1;
        int failed = h->rc < 0;
        float *g = h->grads;
        pthread_mutex_unlock(&h->mu);
        SgError e;
        int rc =
            failed ? 0 : coll_allreduce(h->c, g + r.off, r.cnt, COLL_F32, h->op, h->comp, -1, &e);
        pthread_mutex_lock(&h->mu);
        if (rc < 0 && h->rc == 0) {
            h->rc = rc;
            h->err = e;
        }
        h->busy = 0;
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return NULL;
}

/* Appends r to the FIFO (mu held). */
static int enqueue(CollHook *h, size_t off, size_t cnt, SgError *err)
{
    if (cnt == 0)
        return 0;
    if (h->qhead + h->qlen == h->qcap) {
        if (h->qhead > 0) {
            memmove(h->queue, h->queue + h->qhead, h->qlen * sizeof *h->queue);
            h->qhead = 0;
        } else if (sg_grow(&h->queue, &h->qcap, h->qlen + 1, sizeof *h->queue, 64) < 0) {
            return sg_fail(err, SG_ENOMEM, "growing the gradient hook's bucket queue");
        }
    }
    h->queue[h->qhead + h->qlen++] = (Range){off, cnt};
    pthread_cond_broadcast(&h->cv);
    return 0;
}

static int flush_pending(CollHook *h, SgError *err)
{
    pthread_mutex_lock(&h->mu);
    int rc = enqueue(h, h->pend_lo, h->pend_hi - h->pend_lo, err);
    pthread_mutex_unlock(&h->mu);
    h->pend_lo = h->pend_hi = 0;
    return rc;
}

/* grads[i] = (grads[i] + accum[i]) / k on [off, off + cnt): this cycle's
 * mean local gradient. */
static void fold_accum(CollHook *h, float *grads, size_t off, size_t cnt)
{
    if (h->k <= 1)
        return;
    float inv = 1.0f / (float)h->k;
    for (size_t i = off; i < off + cnt; i++)
        grads[i] = (grads[i] + h->accum[i]) * inv;
}

static int hook_ready(void *ctx, float *grads, size_t offset, size_t count, SgError *err)
{
    CollHook *h = ctx;
    if (h->bucket_elems == 0 || count == 0 || !reducing_pass(h))
        return 0;
    if (h->k > 1 && (h->accum == NULL || offset + count > h->accum_n))
        return sg_fail(err, SG_EINVAL,
                       "gradient hook: ready(%zu, %zu) outside the %zu gradients of earlier steps",
                       offset, count, h->accum_n);
    if (h->grads != NULL && h->grads != grads)
        return sg_fail(err, SG_EINVAL, "gradient hook: ready() saw two gradient buffers in a step");
    if (!h->started) {
        if (pthread_create(&h->th, NULL, hook_thread, h) != 0)
            return sg_fail(err, SG_ENOMEM, "starting the gradient hook's communication thread");
        h->started = 1;
    }
    pthread_mutex_lock(&h->mu);
    h->grads = grads;
    pthread_mutex_unlock(&h->mu);
    fold_accum(h, grads, offset, count);
    if (sg_grow(&h->covered, &h->capcovered, h->ncovered + 1, sizeof *h->covered, 32) < 0)
        return sg_fail(err, SG_ENOMEM, "growing the gradient hook's range list");
    h->covered[h->ncovered++] = (Range){offset, count};
    int rc = 0;
    if (h->pend_hi > h->pend_lo && offset + count != h->pend_lo)
        rc = flush_pending(h, err); /* not contiguous with the bucket being gathered */
    if (rc < 0)
        return rc;
    if (h->pend_hi == h->pend_lo)
        h->pend_hi = offset + count;
    h->pend_lo = offset;
    if (h->pend_hi - h->pend_lo >= h->bucket_elems)
        rc = flush_pending(h, err);
    return rc;
}

static int cmp_range(const void *a, const void *b)
{
    const Range *x = a, *y = b;
    return x->off < y->off ? 1 : x->off > y->off ? -1 : 0; /* descending offset */
}

/* Accumulation pass: adds grads into accum; params are left alone. */
static int accumulate(CollHook *h, const float *grads, size_t n, SgError *err)
{
    if (h->accum == NULL || h->accum_n != n) {
        if (h->accum != NULL && h->calls % (uint64_t)h->k != 0)
            return sg_fail(err, SG_EINVAL, "gradient hook: %zu gradients, %zu in earlier passes", n,
                           h->accum_n);
        free(h->accum);
        if ((h->accum = malloc((n ? n : 1) * sizeof *h->accum)) == NULL)
            return sg_fail(err, SG_ENOMEM, "allocating %zu accumulated gradients", n);
        h->accum_n = n;
    }
    if (h->calls % (uint64_t)h->k == 0)
        memcpy(h->accum, grads, n * sizeof *grads);
    else
        for (size_t i = 0; i < n; i++)
            h->accum[i] += grads[i];
    return 0;
}

/* Reduces what neither ready() nor a table covered, from the end down: the
 * gaps between those ranges, folded; queued behind the buckets when the
 * thread runs (then waits for all), else reduced here. */
static int reduce_rest(CollHook *h, float *grads, size_t n, const OptimRows *tables, int nt,
                       SgError *err)
{
    if (sg_grow(&h->covered, &h->capcovered, h->ncovered + (size_t)nt, sizeof *h->covered, 32) < 0)
        return sg_fail(err, SG_ENOMEM, "growing the gradient hook's range list");
    for (int i = 0; i < nt; i++)
        h->covered[h->ncovered++] = (Range){tables[i].off, tables[i].rows * tables[i].dim};
    if (h->ncovered > 1)
        qsort(h->covered, h->ncovered, sizeof *h->covered, cmp_range);
    int rc = 0;
    if (h->started) {
        pthread_mutex_lock(&h->mu);
        h->grads = grads;
    }
    size_t hi = n;
    for (size_t i = 0; i <= h->ncovered && rc == 0; i++) {
        size_t lo = i < h->ncovered ? h->covered[i].off + h->covered[i].cnt : 0;
        if (lo > hi)
            lo = hi;
        if (hi > lo) {
            fold_accum(h, grads, lo, hi - lo);
            rc = h->started
                     ? enqueue(h, lo, hi - lo, err)
                     : coll_allreduce(h->c, grads + lo, hi - lo, COLL_F32, h->op, h->comp, -1, err);
        }
        if (i < h->ncovered && h->covered[i].off < hi)
            hi = h->covered[i].off;
    }
    if (h->started) {
        while (h->qlen > 0 || h->busy)
            pthread_cond_wait(&h->cv, &h->mu);
        if (rc == 0 && h->rc < 0) {
            rc = h->rc;
            *err = h->err;
        }
        h->rc = 0;
        h->grads = NULL;
        pthread_mutex_unlock(&h->mu);
    }
    return rc;
}

static int hook_step(void *ctx, float *params, float *grads, size_t n, OptimRows *tables,
                     int ntables, int64_t *global_step, SgError *err)
{
    (void)params, (void)global_step;
    CollHook *h = ctx;
    int rc = 0;
    if (!reducing_pass(h)) {
        rc = accumulate(h, grads, n, err);
        h->calls++;
        return rc < 0 ? rc : 1;
    }
    if (h->k > 1 && h->accum_n != n)
        return sg_fail(err, SG_EINVAL, "gradient hook: %zu gradients, %zu in earlier passes", n,
                       h->accum_n);
    if (ntables > 0 && !h->iface.sparse)
        return sg_fail(err, SG_EINVAL, "gradient hook: a dense hook was given %d tables as rows",
                       ntables);
    if (h->ncovered > 0 && h->grads != grads)
        rc = sg_fail(err, SG_EINVAL, "gradient hook: step() got another buffer than ready()");
    if (rc == 0)
        rc = flush_pending(h, err);
    if (rc == 0)
        rc = reduce_rest(h, grads, n, tables, ntables, err);
    if (rc == 0 && ntables > 0)
        rc = coll_rows_reduce(h->c, h->op, h->comp, grads, n, tables, ntables, &h->rows, err);
    h->ncovered = 0;
    h->pend_lo = h->pend_hi = 0;
    h->calls++;
    return rc;
}

int coll_hook_new(CollComm *c, CollOp op, CollCompression comp, int backward_passes_per_step,
                  size_t bucket_bytes, int sparse_tables, CollHook **out, SgError *err)
{
    if (backward_passes_per_step < 1)
        return sg_fail(err, SG_EINVAL, "backward_passes_per_step must be >= 1, got %d",
                       backward_passes_per_step);
    if (op < COLL_SUM || op > COLL_MAX)
        return sg_fail(err, SG_EINVAL, "gradient hook op %d (sum, average, min, max only)", op);
    CollHook *h = calloc(1, sizeof *h);
    if (h == NULL)
        return sg_fail(err, SG_ENOMEM, "allocating a gradient hook");
    /* tables as rows need every pass's rows reduced as it comes: no accumulation */
    h->iface = (NnGradHook){.ready = hook_ready,
                            .step = hook_step,
                            .sparse = sparse_tables && backward_passes_per_step == 1,
                            .ctx = h};
    h->c = c, h->op = op, h->comp = comp, h->k = backward_passes_per_step;
    h->bucket_elems = bucket_bytes / sizeof(float);
    if (bucket_bytes > 0 && h->bucket_elems == 0)
        h->bucket_elems = 1;
    pthread_mutex_init(&h->mu, NULL);
    pthread_cond_init(&h->cv, NULL);
    *out = h;
    return 0;
}

NnGradHook *coll_hook_iface(CollHook *h)
{
    return &h->iface;
}

void coll_hook_free(CollHook *h)
{
    if (h == NULL)
        return;
    if (h->started) {
        pthread_mutex_lock(&h->mu);
        h->stop = 1;
        pthread_cond_broadcast(&h->cv);
        pthread_mutex_unlock(&h->mu);
        pthread_join(h->th, NULL);
    }
    pthread_mutex_destroy(&h->mu);
    pthread_cond_destroy(&h->cv);
    coll_rows_free(&h->rows);
    free(h->accum);
    free(h->covered);
    free(h->queue);
    free(h);
}
