/*
 * batcher.c - the shuffle buffer of row handles and the gather into
 * batches (see batcher.h).
 */
#include "table/batcher.h"

#include <stdlib.h>
#include <string.h>

#include "common/sg_rng.h"

typedef struct Handle {
    TblChunk *chunk;
    size_t row;
} Handle;

struct TblBatcher {
    size_t batch_size, capacity; /* capacity: the shuffle buffer's handles, 0: none */
    uint64_t rng;
    Handle *buf; /* [capacity] the shuffle buffer, nbuf used */
    size_t nbuf;
    TblChunk **queue; /* chunks pushed whose rows are not all in buf yet, a ring */
    size_t qhead, qlen, qcap;
    size_t qrow;      /* next row of queue[qhead] */
    size_t queued;    /* rows in the queue not yet in buf */
    Handle *picked;   /* [batch_size] */
    size_t ncols;     /* the first chunk's columns: every chunk has their kinds and widths */
    TblColumn *shape; /* [ncols] kinds and widths alone (no buffers) */
    uint8_t *lengths; /* [ncols] 1: the column has lengths */
};

int tbl_batcher_new(TblBatcher **out, size_t batch_size, size_t shuffle_buffer, uint64_t seed,
                    SgError *err)
{
    *out = NULL;
    if (batch_size == 0 || batch_size > ((size_t)1 << 30) || shuffle_buffer > ((size_t)1 << 34))
        return sg_fail(err, SG_EINVAL, "batch_size %zu or shuffle_buffer %zu out of range",
                       batch_size, shuffle_buffer);
    TblBatcher *b = calloc(1, sizeof *b);
    if (b == NULL)
        return sg_fail(err, SG_ENOMEM, "no memory for a batcher");
    b->batch_size = batch_size;
    b->capacity = shuffle_buffer;
    b->rng = seed;
    b->buf = malloc((shuffle_buffer > 0 ? shuffle_buffer : 1) * sizeof *b->buf);
    b->picked = malloc(batch_size * sizeof *b->picked);
    if (b->buf == NULL || b->picked == NULL) {
        tbl_batcher_free(b);
        return sg_fail(err, SG_ENOMEM, "no memory for a shuffle buffer of %zu rows",
                       shuffle_buffer);
    }
    *out = b;
    return 0;
}

static int same_shape(const TblBatcher *b, const TblChunk *c, SgError *err)
{
    if (b->ncols != c->ncols)
        return sg_fail(err, SG_ESCHEMA, "a chunk of %zu columns after one of %zu", c->ncols,
                       b->ncols);
    for (size_t i = 0; i < b->ncols; i++) {
        const TblColumn *x = &b->shape[i], *y = &c->cols[i];
        if (x->out != y->out || x->width != y->width || b->lengths[i] != (y->lengths != NULL))
            return sg_fail(err, SG_ESCHEMA, "column %zu: width %zu after %zu (or another kind)", i,
                           y->width, x->width);
    }
    return 0;
}

int tbl_batcher_push(TblBatcher *b, TblChunk *chunk, SgError *err)
{
    if (chunk->rows == 0) {
        tbl_chunk_free(chunk);
        return 0;
    }
    if (b->shape == NULL) {
        b->shape = calloc(chunk->ncols + 1, sizeof *b->shape);
        b->lengths = calloc(chunk->ncols + 1, 1);
        if (b->shape == NULL || b->lengths == NULL) {
            tbl_chunk_free(chunk);
            return sg_fail(err, SG_ENOMEM, "no memory for a batcher");
        }
        b->ncols = chunk->ncols;
        for (size_t i = 0; i < chunk->ncols; i++) {
            b->shape[i].out = chunk->cols[i].out;
            b->shape[i].width = chunk->cols[i].width;
            b->lengths[i] = chunk->cols[i].lengths != NULL;
        }
    }
    int rc = same_shape(b, chunk, err);
    if (rc < 0) {
        tbl_chunk_free(chunk);
        return rc;
    }
    if (b->qlen == b->qcap) {
        size_t cap = b->qcap ? b->qcap * 2 : 16;
        TblChunk **q = malloc(cap * sizeof *q);
        if (q == NULL) {
            tbl_chunk_free(chunk);
            return sg_fail(err, SG_ENOMEM, "no memory for the batcher's queue");
        }
        for (size_t i = 0; i < b->qlen; i++)
            q[i] = b->queue[(b->qhead + i) % b->qcap];
        free(b->queue);
        b->queue = q;
        b->qcap = cap;
        b->qhead = 0;
    }
    chunk->pending = chunk->rows;
    b->queue[(b->qhead + b->qlen) % b->qcap] = chunk;
    b->qlen++;
    b->queued += chunk->rows;
    return 0;
}

size_t tbl_batcher_rows(const TblBatcher *b)
{
    return b->nbuf + b->queued;
}

/* The next pushed row, out of the queue. */
static Handle take_queued(TblBatcher *b)
{
    Handle h = {b->queue[b->qhead], b->qrow++};
    b->queued--;
    if (b->qrow == h.chunk->rows) {
        b->qhead = (b->qhead + 1) % b->qcap;
        b->qlen--;
        b->qrow = 0;
    }
    return h;
}

/* The next batch row: in pushed order, or drawn from the full buffer. */
static Handle pick(TblBatcher *b)
{
    if (b->capacity == 0)
        return take_queued(b);
    while (b->nbuf < b->capacity && b->queued > 0)
        b->buf[b->nbuf++] = take_queued(b);
    size_t j = sg_rng_below(&b->rng, b->nbuf);
    Handle h = b->buf[j];
    b->buf[j] = b->buf[--b->nbuf];
    return h;
}

static int gather(const TblBatcher *b, TblChunk *batch, const Handle *rows, size_t n, SgError *err)
{
    for (size_t c = 0; c < batch->ncols; c++) {
        TblColumn col = {.out = b->shape[c].out, .width = b->shape[c].width};
        if (col.out == TBL_OUT_I64) {
            col.ints = malloc(n * col.width * sizeof(int64_t) + 1);
            col.lengths = b->lengths[c] ? malloc(n * sizeof(int32_t) + 1) : NULL;
            if (col.ints == NULL || (b->lengths[c] && col.lengths == NULL)) {
                batch->cols[c] = col;
                return sg_fail(err, SG_ENOMEM, "no memory for a batch of %zu rows of %zu ids", n,
                               col.width);
            }
            for (size_t i = 0; i < n; i++) {
                const TblColumn *src = &rows[i].chunk->cols[c];
                memcpy(col.ints + i * col.width, src->ints + rows[i].row * col.width,
                       col.width * sizeof(int64_t));
                if (col.lengths != NULL)
                    col.lengths[i] = src->lengths[rows[i].row];
            }
        } else if (col.out == TBL_OUT_STR) {
            size_t bytes = 0;
            for (size_t i = 0; i < n; i++) {
                const int64_t *off = rows[i].chunk->cols[c].offsets;
                bytes += (size_t)(off[rows[i].row + 1] - off[rows[i].row]);
            }
            col.offsets = malloc((n + 1) * sizeof *col.offsets);
            col.bytes = malloc(bytes + 1);
            if (col.offsets == NULL || col.bytes == NULL) {
                batch->cols[c] = col;
                return sg_fail(err, SG_ENOMEM, "no memory for a batch of %zu strings", n);
            }
            col.offsets[0] = 0;
            for (size_t i = 0; i < n; i++) {
                const TblColumn *src = &rows[i].chunk->cols[c];
                int64_t lo = src->offsets[rows[i].row], len = src->offsets[rows[i].row + 1] - lo;
                if (len > 0)
                    memcpy(col.bytes + col.offsets[i], src->bytes + lo, (size_t)len);
                col.offsets[i + 1] = col.offsets[i] + len;
            }
        } else {
            col.values = malloc(n * col.width * sizeof(float) + 1);
            col.lengths = b->lengths[c] ? malloc(n * sizeof(int32_t) + 1) : NULL;
            if (col.values == NULL || (b->lengths[c] && col.lengths == NULL)) {
                batch->cols[c] = col;
                return sg_fail(err, SG_ENOMEM, "no memory for a batch of %zu rows of %zu values", n,
                               col.width);
            }
            for (size_t i = 0; i < n; i++) {
                const TblColumn *src = &rows[i].chunk->cols[c];
                float *dst = col.values + i * col.width;
                if (src->u8) {
                    const uint8_t *bytes = src->bytes + rows[i].row * col.width;
                    for (size_t j = 0; j < col.width; j++)
                        dst[j] = (float)bytes[j];
                } else {
                    memcpy(dst, src->values + rows[i].row * col.width, col.width * sizeof(float));
                }
                if (col.lengths != NULL)
                    col.lengths[i] = src->lengths[rows[i].row];
            }
        }
        batch->cols[c] = col;
    }
    return 0;
}

int tbl_batcher_next(TblBatcher *b, int final, TblChunk **out, SgError *err)
{
    *out = NULL;
    size_t avail = b->nbuf + b->queued,
           need = b->batch_size + (b->capacity > 0 ? b->capacity - 1 : 0);
    if (avail == 0 || (!final && avail < need))
        return 0;
    size_t n = avail < b->batch_size ? avail : b->batch_size;
    TblChunk *batch = calloc(1, sizeof *batch + b->ncols * sizeof(TblColumn));
    if (batch == NULL)
        return sg_fail(err, SG_ENOMEM, "no memory for a batch");
    batch->ncols = b->ncols;
    batch->rows = n;
    for (size_t i = 0; i < n; i++)
        b->picked[i] = pick(b);
    int rc = gather(b, batch, b->picked, n, err);
    for (size_t i = 0; i < n; i++)
        if (--b->picked[i].chunk->pending == 0)
            tbl_chunk_free(b->picked[i].chunk);
    if (rc < 0) {
        tbl_chunk_free(batch);
        return rc;
    }
    *out = batch;
    return 1;
}

void tbl_batcher_free(TblBatcher *b)
{
    if (b == NULL)
        return;
    /* Each chunk still referenced is freed once: through its last handle. */
    for (size_t i = 0; i < b->nbuf; i++)
        if (--b->buf[i].chunk->pending == 0)
            tbl_chunk_free(b->buf[i].chunk);
    while (b->qlen > 0) {
        TblChunk *c = b->queue[b->qhead];
        size_t left = c->rows - b->qrow;
        c->pending -= left;
        if (c->pending == 0)
            tbl_chunk_free(c);
        b->qhead = (b->qhead + 1) % b->qcap;
        b->qlen--;
        b->qrow = 0;
    }
    free(b->queue);
    free(b->buf);
    free(b->picked);
    free(b->shape);
    free(b->lengths);
    free(b);
}
