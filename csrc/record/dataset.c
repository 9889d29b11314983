/*
 * dataset.c - the input pipeline behind sparkgrad.data.TFRecordDataset.
 *
 * One producer (the background thread, or the caller when prefetch is 0)
 * runs source -> shuffle -> parse -> batch; batches travel through a ring of
 * `prefetch` ready slots and a free list, guarded by one mutex and two
 * condition variables. Every wait is bounded: the producer re-checks the stop
 * flag each 100 ms, the consumer waits at most the time it was given.
 */
#include "record/dataset.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct ShufSlot {
    uint8_t *data;
    size_t len, cap;
    size_t file;      /* index into files */
    uint64_t index;   /* record index within its file */
    uint64_t offset;  /* byte offset within its file */
} ShufSlot;

struct Dataset {
    DsConfig cfg;
    char **files; /* this shard's files */
    size_t nfiles;
    int record_shard; /* shard by record index (fewer files than shards) */
    /* producer state */
    size_t *order;
    size_t file_pos;
    long long epoch;
    TfrReader *reader;
    uint64_t rec_in_file, rec_in_epoch;
    int src_done;
    uint64_t rng;
    ShufSlot *shuf;
    size_t shuf_n;
    ShufSlot cur; /* the current record when not shuffling (points into reader) */
    /* queue */
    pthread_mutex_t mu;
    pthread_cond_t ready_cv, free_cv;
    ExBatch *batches; /* prefetch + 1 (+1 when synchronous) */
    size_t nbatches;
    ExBatch **ready; /* ring of prefetch */
    size_t ready_head, ready_n, ready_cap;
    ExBatch **free_list;
    size_t free_n;
    int finished; /* producer reached the end (or failed) */
    int stop;
    SgError error;
    int failed;
    int thread_started;
    pthread_t thread;
};

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
 * ds->cur filled (data pointing into the reader), 0 at the end. */
static int source_next(Dataset *ds, SgError *err)
{
    for (;;) {
        if (ds->reader == NULL) {
            if (ds->file_pos >= ds->nfiles) {
                ds->epoch++;
                if (ds->cfg.epochs >= 0 && ds->epoch >= ds->cfg.epochs)
                    return 0;
                if (ds->nfiles == 0)
                    return 0;
                ds->file_pos = 0;
                ds->rec_in_epoch = 0;
                order_shuffle(ds);
            }
            int rc = tfr_reader_open(&ds->reader, ds->files[ds->order[ds->file_pos]],
                                     ds->cfg.comp, ds->cfg.verify_crc, err);
            if (rc < 0)
                return rc;
            ds->rec_in_file = 0;
        }
        const uint8_t *d;
        size_t len;
        int rc = tfr_reader_next(ds->reader, &d, &len, err);
        if (rc < 0)
            return rc;
        if (rc == 0) {
            tfr_reader_close(ds->reader);
            ds->reader = NULL;
            ds->file_pos++;
            continue;
        }
        uint64_t k = ds->rec_in_epoch++;
        uint64_t index = ds->rec_in_file++;
        if (ds->record_shard && k % ds->cfg.num_shards != ds->cfg.shard_index)
            continue;
        ds->cur.data = (uint8_t *)d;
        ds->cur.len = len;
        ds->cur.file = ds->order[ds->file_pos];
        ds->cur.index = index;
        ds->cur.offset = tfr_reader_offset(ds->reader);
        return 1;
    }
}

static int slot_store(ShufSlot *s, const ShufSlot *from, SgError *err)
{
    if (s->cap < from->len || s->data == NULL) {
        size_t cap = from->len > 64 ? from->len : 64;
        uint8_t *d = realloc(s->data, cap);
        if (d == NULL)
            return sg_fail(err, SG_ENOMEM, "out of memory for the shuffle buffer (%zu bytes)", cap);
        s->data = d;
        s->cap = cap;
    }
    memcpy(s->data, from->data, from->len);
    s->len = from->len;
    s->file = from->file;
    s->index = from->index;
    s->offset = from->offset;
    return 0;
}

static int parse_into(Dataset *ds, ExBatch *b, const ShufSlot *s, SgError *err)
{
    int rc = ex_batch_add(b, s->data, s->len, err);
    if (rc < 0)
        sg_context(err, "'%s': record %llu at byte %llu: ", ds->files[s->file],
                   (unsigned long long)s->index, (unsigned long long)s->offset);
    return rc;
}

/* Moves one record into the batch; 1 done, 0 no more records. */
static int next_record(Dataset *ds, ExBatch *b, SgError *err)
{
    int rc;
    if (ds->cfg.shuffle_buffer == 0) {
        if ((rc = source_next(ds, err)) <= 0)
            return rc;
        return parse_into(ds, b, &ds->cur, err) < 0 ? err->code : 1;
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
    if ((rc = parse_into(ds, b, &ds->shuf[i], err)) < 0)
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

/* Fills b; 1 a batch, 0 the end. */
static int produce(Dataset *ds, ExBatch *b, SgError *err)
{
    int rc = ex_batch_reset(b, err);
    if (rc < 0)
        return rc;
    while (b->rows < ds->cfg.batch_size) {
        if ((rc = next_record(ds, b, err)) < 0)
            return rc;
        if (rc == 0)
            break;
    }
    if (b->rows == 0 || (b->rows < ds->cfg.batch_size && ds->cfg.drop_remainder))
        return 0;
    return 1;
}

/* ---- the queue ---- */

static void deadline_in(struct timespec *ts, double seconds)
{
    clock_gettime(CLOCK_REALTIME, ts);
    long long ns = (long long)(seconds * 1e9);
    ts->tv_sec += (time_t)(ns / 1000000000ll);
    ts->tv_nsec += (long)(ns % 1000000000ll);
    if (ts->tv_nsec >= 1000000000l) {
        ts->tv_sec++;
        ts->tv_nsec -= 1000000000l;
    }
}

static void *producer_main(void *arg)
{
    Dataset *ds = arg;
    SgError err;
    sg_error_clear(&err);
    for (;;) {
        pthread_mutex_lock(&ds->mu);
        while (ds->free_n == 0 && !ds->stop) {
            struct timespec ts;
            deadline_in(&ts, 0.1); /* re-check stop every 100 ms */
            pthread_cond_timedwait(&ds->free_cv, &ds->mu, &ts);
        }
        if (ds->stop) {
            pthread_mutex_unlock(&ds->mu);
            return NULL;
        }
        ExBatch *b = ds->free_list[--ds->free_n];
        pthread_mutex_unlock(&ds->mu);

        int rc = produce(ds, b, &err);

        pthread_mutex_lock(&ds->mu);
        if (rc == 1) {
            ds->ready[(ds->ready_head + ds->ready_n++) % ds->ready_cap] = b;
        } else {
            ds->free_list[ds->free_n++] = b;
            ds->finished = 1;
            if (rc < 0) {
                ds->failed = 1;
                ds->error = err;
            }
        }
        pthread_cond_broadcast(&ds->ready_cv);
        pthread_mutex_unlock(&ds->mu);
        if (rc != 1)
            return NULL;
    }
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
    pthread_cond_init(&ds->ready_cv, NULL);
    pthread_cond_init(&ds->free_cv, NULL);
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
    /* prefetch batches queued ahead plus the one the consumer holds; the
     * ring can hold all of them. */
    ds->nbatches = (cfg->prefetch ? cfg->prefetch : 1) + 1;
    ds->ready_cap = ds->nbatches;
    ds->batches = calloc(ds->nbatches, sizeof *ds->batches);
    ds->ready = calloc(ds->ready_cap, sizeof *ds->ready);
    ds->free_list = calloc(ds->nbatches, sizeof *ds->free_list);
    if (ds->batches == NULL || ds->ready == NULL || ds->free_list == NULL)
        goto oom;
    for (size_t i = 0; i < ds->nbatches; i++) {
        if ((rc = ex_batch_init(&ds->batches[i], cfg->schema, cfg->batch_size, err)) < 0) {
            ds->nbatches = i;
            ds_close(ds);
            return rc;
        }
        ds->free_list[ds->free_n++] = &ds->batches[i];
    }
    if (cfg->prefetch > 0) {
        if ((rc = pthread_create(&ds->thread, NULL, producer_main, ds)) != 0) {
            ds_close(ds);
            return sg_fail_errno(err, SG_ESTATE, rc, "cannot start the prefetch thread");
        }
        ds->thread_started = 1;
    }
    *out = ds;
    return 0;
oom:
    ds_close(ds);
    return sg_fail(err, SG_ENOMEM, "out of memory opening a dataset of %zu files", cfg->npaths);
}

int ds_next(Dataset *ds, ExBatch **batch, double wait_s, SgError *err)
{
    if (!ds->thread_started) {
        /* Synchronous: the spare batch is produced here. */
        if (ds->failed) {
            *err = ds->error;
            return err->code;
        }
        if (ds->finished)
            return 0;
        ExBatch *b = &ds->batches[ds->nbatches - 1];
        int rc = produce(ds, b, err);
        if (rc <= 0) {
            ds->finished = 1;
            if (rc < 0) {
                ds->failed = 1;
                ds->error = *err;
            }
            return rc;
        }
        *batch = b;
        return 1;
    }
    pthread_mutex_lock(&ds->mu);
    struct timespec ts;
    deadline_in(&ts, wait_s);
    while (ds->ready_n == 0 && !ds->finished) {
        int rc = pthread_cond_timedwait(&ds->ready_cv, &ds->mu, &ts);
        if (rc == ETIMEDOUT && ds->ready_n == 0 && !ds->finished) {
            pthread_mutex_unlock(&ds->mu);
            return sg_fail(err, SG_ETIMEOUT,
                           "no batch from the reader thread within %.1f s (%zu files)", wait_s,
                           ds->nfiles);
        }
    }
    int rc;
    if (ds->ready_n > 0) {
        *batch = ds->ready[ds->ready_head];
        ds->ready_head = (ds->ready_head + 1) % ds->ready_cap;
        ds->ready_n--;
        rc = 1;
    } else if (ds->failed) {
        *err = ds->error;
        rc = err->code;
    } else {
        rc = 0;
    }
    pthread_mutex_unlock(&ds->mu);
    return rc;
}

void ds_release(Dataset *ds, ExBatch *batch)
{
    if (!ds->thread_started)
        return;
    pthread_mutex_lock(&ds->mu);
    ds->free_list[ds->free_n++] = batch;
    pthread_cond_signal(&ds->free_cv);
    pthread_mutex_unlock(&ds->mu);
}

size_t ds_file_count(const Dataset *ds)
{
    return ds->nfiles;
}

void ds_close(Dataset *ds)
{
    if (ds == NULL)
        return;
    if (ds->thread_started) {
        pthread_mutex_lock(&ds->mu);
        ds->stop = 1;
        pthread_cond_broadcast(&ds->free_cv);
        pthread_mutex_unlock(&ds->mu);
        pthread_join(ds->thread, NULL);
    }
    tfr_reader_close(ds->reader);
    if (ds->files)
        for (size_t i = 0; i < ds->nfiles; i++)
            free(ds->files[i]);
    free(ds->files);
    free(ds->order);
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
    pthread_mutex_destroy(&ds->mu);
    pthread_cond_destroy(&ds->ready_cv);
    pthread_cond_destroy(&ds->free_cv);
    free(ds);
}
