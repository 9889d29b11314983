/*
 * dataset.c - the input pipeline behind sparkgrad.data.TFRecordDataset.
 *
 * Synchronous mode (prefetch 0, one parse thread) runs source -> shuffle ->
 * parse -> batch in the caller's thread. Otherwise `parse_threads` workers
 * each produce whole batches:
 *
 *   1. take a free batch (waits for the consumer to give one back);
 *   2. under src_mu: take the next sequence number and the next batch_size
 *      records from the source (pointers into mapped files, else copies;
 *      data CRCs deferred);
 *   3. without locks: check the data CRCs and parse into the batch;
 *   4. publish in sequence order: a batch finished early waits in a reorder
 *      slot while its worker goes on, so a preempted worker stalls nobody
 *      but the consumer. The output is the synchronous pipeline's, errors
 *      included.
 *
 * A worker holds its batch before it takes a sequence number, so every
 * unpublished number is being worked on: no deadlock.
 * Batches are whole units of work (one lock round per batch, no per-row
 * handoff), each worker writes only its own batch (no shared cache lines).
 * Every wait is bounded: workers re-check the stop flag each 100 ms, the
 * consumer waits at most the time it was given.
 */
#include "record/dataset.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/sg_clock.h"

#define PREFETCH_ROWS 8 /* stashed records read ahead while parsing */
#define NEED_OPEN     2 /* source_next: a file must be opened (no_open set) */

typedef struct ShufSlot {
    uint8_t *data;
    size_t len, cap;
    size_t file;     /* index into files */
    uint64_t index;  /* record index within its file */
    uint64_t offset; /* byte offset within its file */
} ShufSlot;

/* An open file; counted references keep a mapped file alive while batches
 * still point into it. */
typedef struct SrcFile {
    TfrReader *reader;
    int refs; /* atomic */
} SrcFile;

/* A record taken for a batch: in place (stable sources) or in the arena. */
typedef struct Stashed {
    const uint8_t *data; /* NULL: at arena + pos */
    size_t pos, len;     /* the CRC footer follows the data */
    size_t file;
    uint64_t index, offset;
} Stashed;

/* A batch's outcome waiting for its turn to be published. */
typedef struct Done {
    ExBatch *batch;
    int rc, filled;
    SgError err;
} Done;

typedef struct Worker {
    struct Dataset *ds;
    pthread_t thread;
    Stashed *stashed; /* batch_size */
    size_t n;
    uint8_t *arena;
    size_t arena_len, arena_cap;
    SrcFile **holds; /* files this batch points into (batch_size + 1) */
    size_t nholds;
    SgError err;
} Worker;

struct Dataset {
    DsConfig cfg;
    char **files; /* this shard's files */
    size_t nfiles;
    int record_shard; /* shard by record index (fewer files than shards) */
    /* source state (src_mu in threaded mode) */
    pthread_mutex_t src_mu;
    size_t *order;
    size_t file_pos;
    long long epoch;
    SrcFile *src;
    uint64_t rec_in_file, rec_in_epoch, yielded_in_epoch;
    int src_done;         /* the shuffle buffer's source ended */
    int no_open;          /* source_next returns NEED_OPEN instead of opening */
    struct Worker *carry; /* the caller's unfinished batch (see work_step) */
    uint64_t carry_seq;
    int src_over; /* no more batches: the data ended, failed, or stop */
    uint64_t next_seq;
    uint64_t rng;
    ShufSlot *shuf;
    size_t shuf_n;
    ShufSlot cur; /* the current record when not shuffling (points into reader) */
    /* workers */
    int direct;   /* one producer: it parses as it reads (no stash, no deferred CRC) */
    int helps;    /* ds_next makes batches when none is ready */
    int nworkers; /* background threads; workers[nworkers] is the consumer's */
    Worker *workers;
    int started; /* threads running */
    /* queue (mu) */
    pthread_mutex_t mu;
    pthread_cond_t ready_cv, free_cv;
    ExBatch *batches;
    size_t nbatches;
    ExBatch **ready; /* ring of nbatches */
    size_t ready_head, ready_n, ready_cap;
    ExBatch **free_list;
    size_t free_n;
    uint64_t publish_seq; /* the next sequence number to publish */
    Done *done;           /* reorder slots, by seq % nbatches */
    int finished;         /* every batch is published (or it failed) */
    int stop;
    SgError error;
    int failed;
    int nexited;       /* workers that returned */
    int consumer_done; /* a helping consumer found the source over (or never helps) */
    int orphaned;      /* ds_close gave up waiting: the last worker frees the dataset */
};

static void ds_free(Dataset *ds);

static void src_unref(SrcFile *f)
{
    if (f != NULL && __atomic_sub_fetch(&f->refs, 1, __ATOMIC_ACQ_REL) == 0) {
        tfr_reader_close(f->reader);
        free(f);
    }
}

/* splitmix64: small, seedable, good enough for shuffling. */
static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static size_t rng_below(uint64_t *s, size_t n)
{
    return (size_t)(rng_next(s) % n);
}

static void order_shuffle(Dataset *ds)
{
    for (size_t i = 0; i < ds->nfiles; i++)
        ds->order[i] = i;
    if (ds->cfg.shuffle_buffer == 0)
        return;
    for (size_t i = ds->nfiles; i > 1; i--) {
        size_t j = rng_below(&ds->rng, i);
        size_t t = ds->order[i - 1];
        ds->order[i - 1] = ds->order[j];
        ds->order[j] = t;
    }
}

/* Next record of this shard across files and epochs. Returns 1 with
 * ds->cur filled (data pointing into the reader), 0 at the end, NEED_OPEN
 * when a file must be opened and no_open is set. */
static int source_next(Dataset *ds, SgError *err)
{
    for (;;) {
        if (ds->src == NULL && ds->no_open)
            return NEED_OPEN; /* nothing changed: a worker opens it */
        if (ds->src == NULL) {
            if (ds->file_pos >= ds->nfiles) {
                /* An epoch that gave this shard nothing ends the data, even
                 * when repeating forever (else: a busy loop). */
                if (ds->epoch >= 0 && ds->yielded_in_epoch == 0)
                    return 0;
                ds->epoch++;
                if (ds->cfg.epochs >= 0 && ds->epoch >= ds->cfg.epochs)
                    return 0;
                if (ds->nfiles == 0)
                    return 0;
                ds->yielded_in_epoch = 0;
                ds->file_pos = 0;
                ds->rec_in_epoch = 0;
                order_shuffle(ds);
            }
            SrcFile *f = calloc(1, sizeof *f);
            if (f == NULL)
                return sg_fail(err, SG_ENOMEM, "out of memory opening a file");
            int rc = tfr_reader_open(&f->reader, ds->files[ds->order[ds->file_pos]], ds->cfg.comp,
                                     ds->cfg.verify_crc, err);
            if (rc < 0) {
                free(f);
                return rc;
            }
            f->refs = 1;
            /* Workers check data CRCs beside parsing. */
            tfr_reader_defer_data_crc(f->reader, !ds->direct);
            ds->src = f;
            ds->rec_in_file = 0;
        }
        const uint8_t *d;
        size_t len;
        int rc = tfr_reader_next(ds->src->reader, &d, &len, err);
        if (rc < 0)
            return rc;
        if (rc == 0) {
            src_unref(ds->src);
            ds->src = NULL;
            ds->file_pos++;
            continue;
        }
        uint64_t k = ds->rec_in_epoch++;
        uint64_t index = ds->rec_in_file++;
        if (ds->record_shard && k % ds->cfg.num_shards != ds->cfg.shard_index)
            continue;
        ds->yielded_in_epoch++;
        ds->cur.data = (uint8_t *)d;
        ds->cur.len = len;
        ds->cur.file = ds->order[ds->file_pos];
        ds->cur.index = index;
        ds->cur.offset = tfr_reader_offset(ds->src->reader);
        return 1;
    }
}

static int slot_store(ShufSlot *s, const ShufSlot *from, SgError *err)
{
    /* The 4-byte footer (data CRC) that follows the data is kept too. */
    size_t need = from->len + TFR_FOOTER_BYTES;
    if (s->cap < need || s->data == NULL) {
        size_t cap = need > 64 ? need : 64;
        uint8_t *d = realloc(s->data, cap);
        if (d == NULL)
            return sg_fail(err, SG_ENOMEM, "out of memory for the shuffle buffer (%zu bytes)", cap);
        s->data = d;
        s->cap = cap;
    }
    memcpy(s->data, from->data, need);
    s->len = from->len;
    s->file = from->file;
    s->index = from->index;
    s->offset = from->offset;
    return 0;
}

/* What to do with the next record: parse it, or stash it for a worker. */
typedef int (*TakeFn)(Dataset *ds, void *ctx, const ShufSlot *s, int stable, SgError *err);

static int parse_into(Dataset *ds, void *ctx, const ShufSlot *s, int stable, SgError *err)
{
    (void)stable;
    int rc = ex_batch_add(ctx, s->data, s->len, err);
    if (rc < 0)
        sg_context(err, "'%s': record %llu at byte %llu: ", ds->files[s->file],
                   (unsigned long long)s->index, (unsigned long long)s->offset);
    return rc;
}

/* Hands the next record to take (with whether it stays valid until its
 * file is released); 1 done, 0 no more records. */
static int next_record(Dataset *ds, void *ctx, TakeFn take, SgError *err)
{
    int rc;
    if (ds->cfg.shuffle_buffer == 0) {
        if ((rc = source_next(ds, err)) != 1)
            return rc;
        return take(ds, ctx, &ds->cur, tfr_reader_stable(ds->src->reader), err) < 0 ? err->code : 1;
    }
    while (!ds->src_done && ds->shuf_n < ds->cfg.shuffle_buffer) {
        if ((rc = source_next(ds, err)) < 0)
            return rc;
        if (rc == 0) {
            ds->src_done = 1;
            break;
        }
        if ((rc = slot_store(&ds->shuf[ds->shuf_n], &ds->cur, err)) < 0)
            return rc;
        ds->shuf_n++;
    }
    if (ds->shuf_n == 0)
        return 0;
    size_t i = rng_below(&ds->rng, ds->shuf_n);
    if ((rc = take(ds, ctx, &ds->shuf[i], 0, err)) < 0)
        return rc;
    /* Refill slot i from the source, or close the gap with the last slot. */
    if (!ds->src_done) {
        if ((rc = source_next(ds, err)) < 0)
            return rc;
        if (rc == 1)
            return slot_store(&ds->shuf[i], &ds->cur, err) < 0 ? err->code : 1;
        ds->src_done = 1;
    }
    ShufSlot t = ds->shuf[i];
    ds->shuf[i] = ds->shuf[ds->shuf_n - 1];
    ds->shuf[ds->shuf_n - 1] = t;
    ds->shuf_n--;
    return 1;
}

/* Synchronous: fills b; 1 a batch, 0 the end. */
static int produce(Dataset *ds, ExBatch *b, SgError *err)
{
    int rc = ex_batch_reset(b, err);
    if (rc < 0)
        return rc;
    while (b->rows < ds->cfg.batch_size) {
        if ((rc = next_record(ds, b, parse_into, err)) < 0)
            return rc;
        if (rc == 0)
            break;
    }
    if (b->rows == 0 || (b->rows < ds->cfg.batch_size && ds->cfg.drop_remainder))
        return 0;
    return 1;
}

/* ---- workers ---- */

/* Takes a record for the worker's batch: a pointer when the source keeps it
 * valid (holding a reference to its file), else a copy (with its footer). */
static int stash(Dataset *ds, void *ctx, const ShufSlot *s, int stable, SgError *err)
{
    Worker *w = ctx;
    Stashed *m = &w->stashed[w->n];
    *m = (Stashed){NULL, 0, s->len, s->file, s->index, s->offset};
    if (stable) {
        if (w->nholds == 0 || w->holds[w->nholds - 1] != ds->src) {
            __atomic_add_fetch(&ds->src->refs, 1, __ATOMIC_RELAXED);
            w->holds[w->nholds++] = ds->src;
        }
        m->data = s->data;
        w->n++;
        return 0;
    }
    size_t need = s->len + TFR_FOOTER_BYTES;
    if (w->arena_len + need > w->arena_cap) {
        size_t cap = w->arena_cap ? w->arena_cap : (1u << 20);
        while (cap < w->arena_len + need)
            cap *= 2;
        uint8_t *a = realloc(w->arena, cap);
        if (a == NULL)
            return sg_fail(err, SG_ENOMEM, "out of memory for a batch of records (%zu bytes)", cap);
        w->arena = a;
        w->arena_cap = cap;
    }
    memcpy(w->arena + w->arena_len, s->data, need);
    m->pos = w->arena_len;
    w->arena_len += need;
    w->n++;
    return 0;
}

/* Step 2, under src_mu: the worker's share of records. Returns the source's
 * status (0 its end, < 0 its error); either ends the data for every worker. */
static int take_records(Dataset *ds, Worker *w, SgError *err)
{
    int rc = 1;
    while (w->n < ds->cfg.batch_size && (rc = next_record(ds, w, stash, err)) == 1)
        ;
    if (rc <= 0)
        ds->src_over = 1;
    return rc;
}

static void stash_swap(Worker *a, Worker *b)
{
    Worker t = *a;
    a->stashed = b->stashed, a->n = b->n, a->holds = b->holds, a->nholds = b->nholds;
    a->arena = b->arena, a->arena_len = b->arena_len, a->arena_cap = b->arena_cap;
    b->stashed = t.stashed, b->n = t.n, b->holds = t.holds, b->nholds = t.nholds;
    b->arena = t.arena, b->arena_len = t.arena_len, b->arena_cap = t.arena_cap;
}

/* Step 3: CRCs and parsing, row by row, the first failure reported as the
 * synchronous pipeline would. src_rc is what the source said after the
 * last stashed record. Returns 1 a batch, 0 nothing to publish, < 0. */
static int parse_records(Dataset *ds, Worker *w, ExBatch *b, int src_rc, SgError *err)
{
    int rc = ex_batch_reset(b, err);
    for (size_t r = 0; r < w->n && rc >= 0; r++) {
        const Stashed *m = &w->stashed[r];
        const uint8_t *d = m->data ? m->data : w->arena + m->pos;
        if (r + PREFETCH_ROWS < w->n) { /* the hardware prefetcher stops at pages */
            const Stashed *a = &w->stashed[r + PREFETCH_ROWS];
            const uint8_t *ad = a->data ? a->data : w->arena + a->pos;
            for (size_t k = 0; k < a->len + TFR_FOOTER_BYTES; k += 64)
                __builtin_prefetch(ad + k);
        }
        if (ds->cfg.verify_crc && (rc = tfr_check_data_crc(d, m->len, m->offset, err)) < 0)
            sg_context(err, "'%s': ", ds->files[m->file]);
        else if ((rc = ex_batch_add(b, d, m->len, err)) < 0)
            sg_context(err, "'%s': record %llu at byte %llu: ", ds->files[m->file],
                       (unsigned long long)m->index, (unsigned long long)m->offset);
    }
    for (size_t i = 0; i < w->nholds; i++)
        src_unref(w->holds[i]);
    w->nholds = 0;
    if (rc < 0)
        return rc;
    if (src_rc < 0)
        return src_rc; /* err still holds the source's message */
    if (b->rows == 0 || (b->rows < ds->cfg.batch_size && ds->cfg.drop_remainder))
        return 0;
    return 1;
}

/* Step 4: files the outcome of seq (a batch, rc 1; nothing, rc 0; a
 * failure, rc < 0) in the reorder slots, then moves every outcome that is
 * next in order to the ready ring. Never waits: a worker whose batch is
 * early goes on with the next one. */
static void publish(Dataset *ds, uint64_t seq, ExBatch *b, int rc, const SgError *err)
{
    pthread_mutex_lock(&ds->mu);
    Done *d = &ds->done[seq % ds->nbatches]; /* at most nbatches in flight */
    d->batch = b;
    d->rc = rc;
    d->filled = 1;
    if (rc < 0)
        d->err = *err;
    while ((d = &ds->done[ds->publish_seq % ds->nbatches])->filled) {
        d->filled = 0;
        ds->publish_seq++;
        if (d->rc == 1 && !ds->failed && !ds->stop) {
            ds->ready[(ds->ready_head + ds->ready_n++) % ds->ready_cap] = d->batch;
            continue;
        }
        ds->free_list[ds->free_n++] = d->batch;
        if (d->rc < 0 && !ds->failed && !ds->stop) {
            ds->failed = 1;
            ds->finished = 1;
            ds->error = d->err;
        }
    }
    pthread_cond_broadcast(&ds->ready_cv);
    pthread_cond_signal(&ds->free_cv);
    pthread_mutex_unlock(&ds->mu);
}

/* Steps 2-4 for batch b (taken from the free list). Returns 1 after
 * publishing, 0 when the source was already over, -1 when another thread
 * held the source past `deadline`, -2 when the helping caller stopped short
 * of I/O that can block (b is given back in the last three cases).
 *
 * The caller (`helper`) never opens a file when there are worker threads
 * (an open can block without bound, e.g. on a FIFO or a hung mount): it
 * helps only while the current file is mapped and unshuffled, and if its
 * batch reaches the end of that file it leaves the records it took, and its
 * sequence number, for the next worker to carry on with. */
static int work_step(Dataset *ds, Worker *w, ExBatch *b, const struct timespec *deadline,
                     int helper)
{
    int busy =
        deadline ? pthread_mutex_timedlock(&ds->src_mu, deadline) : pthread_mutex_lock(&ds->src_mu);
    int rc = busy != 0 ? -1 : 0;
    if (busy == 0 && !ds->src_over && helper &&
        (ds->src == NULL || ds->cfg.shuffle_buffer > 0 || !tfr_reader_stable(ds->src->reader) ||
         ds->carry != NULL))
        rc = -2;
    if (busy != 0 || ds->src_over || rc == -2) {
        if (busy == 0)
            pthread_mutex_unlock(&ds->src_mu);
        ds_release(ds, b);
        return rc;
    }
    uint64_t seq;
    if (ds->direct) { /* the only producer: parse as we go */
        seq = ds->next_seq++;
        rc = produce(ds, b, &w->err);
        if (rc <= 0)
            ds->src_over = 1;
        pthread_mutex_unlock(&ds->src_mu);
    } else {
        if (ds->carry != NULL) { /* the caller's unfinished batch */
            stash_swap(w, ds->carry);
            seq = ds->carry_seq;
            ds->carry = NULL;
        } else {
            seq = ds->next_seq++;
            w->n = 0;
            w->arena_len = 0;
        }
        ds->no_open = helper;
        int src_rc = take_records(ds, w, &w->err);
        ds->no_open = 0;
        if (src_rc == NEED_OPEN) {
            ds->carry = w;
            ds->carry_seq = seq;
            pthread_mutex_unlock(&ds->src_mu);
            ds_release(ds, b);
            return -2;
        }
        pthread_mutex_unlock(&ds->src_mu);
        /* 3. CRCs and parsing, in parallel with the other workers */
        rc = parse_records(ds, w, b, src_rc, &w->err);
        if (rc < 0) {
            pthread_mutex_lock(&ds->src_mu);
            ds->src_over = 1; /* later batches are not needed */
            pthread_mutex_unlock(&ds->src_mu);
        }
    }
    publish(ds, seq, b, rc, &w->err); /* 4. in order */
    return 1;
}

static void *worker_main(void *arg)
{
    Worker *w = arg;
    Dataset *ds = w->ds;
    for (;;) {
        /* 1. a free batch */
        pthread_mutex_lock(&ds->mu);
        while (ds->free_n == 0 && !ds->stop && !ds->failed) {
            sg_cond_wait(&ds->free_cv, &ds->mu, sg_now() + 0.1); /* re-check stop every 100 ms */
        }
        if (ds->stop || ds->failed) {
            pthread_mutex_unlock(&ds->mu);
            break;
        }
        ExBatch *b = ds->free_list[--ds->free_n];
        pthread_mutex_unlock(&ds->mu);
        if (work_step(ds, w, b, NULL, 0) == 0)
            break;
    }
    pthread_mutex_lock(&ds->mu);
    int last = ++ds->nexited == ds->started;
    if (last && ds->consumer_done)
        ds->finished = 1;
    int orphaned = ds->orphaned;
    pthread_cond_broadcast(&ds->ready_cv);
    pthread_mutex_unlock(&ds->mu);
    if (last && orphaned)
        ds_free(ds);
    return NULL;
}

int ds_open(Dataset **out, const DsConfig *cfg, SgError *err)
{
    if (cfg->batch_size == 0)
        return sg_fail(err, SG_EINVAL, "batch_size must be at least 1");
    if (cfg->num_shards == 0 || cfg->shard_index >= cfg->num_shards)
        return sg_fail(err, SG_EINVAL, "shard_index %zu must be below num_shards %zu",
                       cfg->shard_index, cfg->num_shards);
    Dataset *ds = calloc(1, sizeof *ds);
    if (ds == NULL)
        return sg_fail(err, SG_ENOMEM, "out of memory for a dataset");
    ds->cfg = *cfg;
    ds->cfg.paths = NULL;
    ds->epoch = -1;
    ds->rng = cfg->seed;
    pthread_mutex_init(&ds->mu, NULL);
    pthread_mutex_init(&ds->src_mu, NULL);
    sg_cond_init(&ds->ready_cv);
    sg_cond_init(&ds->free_cv);
    int rc = 0;
    ds->record_shard = cfg->npaths < cfg->num_shards;
    ds->files = calloc(cfg->npaths + 1, sizeof *ds->files);
    ds->order = calloc(cfg->npaths + 1, sizeof *ds->order);
    if (ds->files == NULL || ds->order == NULL)
        goto oom;
    for (size_t i = 0; i < cfg->npaths; i++) {
        if (!ds->record_shard && i % cfg->num_shards != cfg->shard_index)
            continue;
        if ((ds->files[ds->nfiles++] = strdup(cfg->paths[i])) == NULL)
            goto oom;
    }
    ds->file_pos = ds->nfiles; /* the first source_next starts epoch 0 */
    if (cfg->shuffle_buffer > 0 &&
        (ds->shuf = calloc(cfg->shuffle_buffer, sizeof *ds->shuf)) == NULL)
        goto oom;
    /* parse_threads 1: one producer, the caller (prefetch 0) or a background
     * thread. More: parse_threads - 1 background workers, and the caller
     * makes batches too whenever none is ready. */
    size_t threads = cfg->parse_threads < 1 ? 1 : cfg->parse_threads > 64 ? 64 : cfg->parse_threads;
    ds->direct = threads == 1;
    ds->helps = threads > 1 || cfg->prefetch == 0;
    ds->consumer_done = !ds->helps;
    ds->nworkers = threads > 1 ? (int)threads - 1 : cfg->prefetch > 0 ? 1 : 0;
    /* Batches: queued ahead (prefetch), one per producer (workers and the
     * caller), the one the caller holds; the ring can hold all of them. */
    ds->nbatches = (cfg->prefetch ? cfg->prefetch : 1) + (size_t)ds->nworkers + 1;
    ds->ready_cap = ds->nbatches;
    ds->batches = calloc(ds->nbatches, sizeof *ds->batches);
    ds->ready = calloc(ds->ready_cap, sizeof *ds->ready);
    ds->free_list = calloc(ds->nbatches, sizeof *ds->free_list);
    ds->done = calloc(ds->nbatches, sizeof *ds->done);
    ds->workers = calloc((size_t)ds->nworkers + 1, sizeof *ds->workers);
    if (ds->batches == NULL || ds->ready == NULL || ds->free_list == NULL || ds->done == NULL ||
        ds->workers == NULL)
        goto oom;
    for (int i = 0; i <= ds->nworkers && !ds->direct; i++) {
        Worker *w = &ds->workers[i];
        w->stashed = calloc(cfg->batch_size, sizeof *w->stashed);
        w->holds = calloc(cfg->batch_size + 1, sizeof *w->holds);
        if (w->stashed == NULL || w->holds == NULL)
            goto oom;
    }
    for (size_t i = 0; i < ds->nbatches; i++) {
        if ((rc = ex_batch_init(&ds->batches[i], cfg->schema, cfg->batch_size, err)) < 0) {
            ds->nbatches = i;
            ds_close(ds);
            return rc;
        }
        ds->free_list[ds->free_n++] = &ds->batches[i];
    }
    /* Workers wait for mu before their first step, so `started` is final
     * before any of them can count itself out. */
    pthread_mutex_lock(&ds->mu);
    for (int i = 0; i < ds->nworkers; i++) {
        ds->workers[i].ds = ds;
        if ((rc = pthread_create(&ds->workers[i].thread, NULL, worker_main, &ds->workers[i])) !=
            0) {
            pthread_mutex_unlock(&ds->mu);
            ds_close(ds);
            return sg_fail_errno(err, SG_ESTATE, rc, "cannot start reader thread %d", i);
        }
        ds->started++;
    }
    pthread_mutex_unlock(&ds->mu);
    *out = ds;
    return 0;
oom:
    ds_close(ds);
    return sg_fail(err, SG_ENOMEM, "out of memory opening a dataset of %zu files", cfg->npaths);
}

/* Called with ds->mu held: releases it and reports the wait that ran out. */
static int no_batch_in_time(Dataset *ds, double wait_s, SgError *err)
{
    pthread_mutex_unlock(&ds->mu);
    return sg_fail(err, SG_ETIMEOUT, "no batch from the reader threads within %.1f s (%zu files)",
                   wait_s, ds->nfiles);
}

int ds_next(Dataset *ds, ExBatch **batch, double wait_s, SgError *err)
{
    pthread_mutex_lock(&ds->mu);
    double deadline = sg_now() + wait_s;
    struct timespec until; /* the same, for pthread_mutex_timedlock (CLOCK_REALTIME) */
    clock_gettime(CLOCK_REALTIME, &until);
    double whole = (double)until.tv_sec + (double)until.tv_nsec * 1e-9 + wait_s;
    until.tv_sec = (time_t)whole;
    until.tv_nsec = (long)((whole - (double)until.tv_sec) * 1e9);
    int rc, helped_out = 0;
    for (;;) {
        if (ds->ready_n > 0) {
            *batch = ds->ready[ds->ready_head];
            ds->ready_head = (ds->ready_head + 1) % ds->ready_cap;
            ds->ready_n--;
            rc = 1;
            break;
        }
        if (ds->finished) {
            if (ds->failed)
                *err = ds->error;
            rc = ds->failed ? err->code : 0;
            break;
        }
        if (ds->helps && !ds->consumer_done && ds->free_n > 0 && !helped_out) {
            /* Nothing ready: make a batch here rather than wait. */
            ExBatch *b = ds->free_list[--ds->free_n];
            pthread_mutex_unlock(&ds->mu);
            /* A worker reading slow storage holds the source: wait for it
             * no longer than for a batch. */
            int more = work_step(ds, &ds->workers[ds->nworkers], b, &until, ds->nworkers > 0);
            pthread_mutex_lock(&ds->mu);
            if (more == -2)
                helped_out = 1; /* wait for a worker's batch now */
            if (more == -1 && ds->ready_n == 0 && !ds->finished)
                return no_batch_in_time(ds, wait_s, err);
            if (more == 0) {
                ds->consumer_done = 1;
                if (ds->nexited == ds->started)
                    ds->finished = 1;
            }
            continue;
        }
        helped_out = 0;
        if (sg_cond_wait(&ds->ready_cv, &ds->mu, deadline) == ETIMEDOUT && ds->ready_n == 0 &&
            !ds->finished)
            return no_batch_in_time(ds, wait_s, err);
    }
    pthread_mutex_unlock(&ds->mu);
    return rc;
}

void ds_release(Dataset *ds, ExBatch *batch)
{
    pthread_mutex_lock(&ds->mu);
    ds->free_list[ds->free_n++] = batch;
    pthread_cond_signal(&ds->free_cv);
    pthread_mutex_unlock(&ds->mu);
}

size_t ds_file_count(const Dataset *ds)
{
    return ds->nfiles;
}

int ds_close(Dataset *ds)
{
    if (ds == NULL)
        return 0;
    pthread_mutex_lock(&ds->mu);
    int started = ds->started;
    if (started > 0) {
        /* Workers stop after their current batch; a read blocked on storage
         * can take longer, so wait at most 2 s, then leave the freeing to
         * the last worker. */
        ds->stop = 1;
        pthread_cond_broadcast(&ds->free_cv);
        double deadline = sg_now() + 2.0;
        while (ds->nexited < started)
            if (sg_cond_wait(&ds->ready_cv, &ds->mu, deadline) == ETIMEDOUT)
                break;
        if (ds->nexited < started) {
            ds->orphaned = 1;
            pthread_mutex_unlock(&ds->mu);
            for (int i = 0; i < started; i++)
                pthread_detach(ds->workers[i].thread);
            return 1;
        }
    }
    pthread_mutex_unlock(&ds->mu);
    for (int i = 0; i < started; i++)
        pthread_join(ds->workers[i].thread, NULL);
    ds_free(ds);
    return 0;
}

static void ds_free(Dataset *ds)
{
    src_unref(ds->src);
    if (ds->files)
        for (size_t i = 0; i < ds->nfiles; i++)
            free(ds->files[i]);
    free(ds->files);
    free(ds->order);
    if (ds->workers)
        for (int i = 0; i <= ds->nworkers; i++) {
            Worker *w = &ds->workers[i];
            for (size_t k = 0; k < w->nholds; k++)
                src_unref(w->holds[k]);
            free(w->stashed);
            free(w->holds);
            free(w->arena);
        }
    free(ds->workers);
    if (ds->shuf)
        for (size_t i = 0; i < ds->cfg.shuffle_buffer; i++)
            free(ds->shuf[i].data);
    free(ds->shuf);
    if (ds->batches)
        for (size_t i = 0; i < ds->nbatches; i++)
            ex_batch_free(&ds->batches[i]);
    free(ds->batches);
    free(ds->ready);
    free(ds->free_list);
    free(ds->done);
    pthread_mutex_destroy(&ds->mu);
    pthread_mutex_destroy(&ds->src_mu);
    pthread_cond_destroy(&ds->ready_cv);
    pthread_cond_destroy(&ds->free_cv);
    free(ds);
}
