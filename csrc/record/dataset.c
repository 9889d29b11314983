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
    size_t file;     /* index into files */
    uint64_t index;  /* record index within its file */
    uint64_t offset; /* byte offset within its file */
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
    uint64_t rec_in_file, rec_in_epoch, yielded_in_epoch;
    int src_done;
    uint64_t rng;
    ShufSlot *shuf;
    size_t shuf_n;
    ShufSlot cur; /* the current record when not shuffling (points into reader) */
    /* parallel parsing: records of the batch being built, and thread scratch */
    int threads;
    struct Stashed *stashed;
    uint8_t *arena, *scratch;
    size_t arena_len, arena_cap;
    ExBatch *job;
    long *bad_row; /* per worker: first failing row or -1 */
    int *bad_crc;
    SgError *bad_err;
    pthread_t *pool;
    struct PoolArg *pool_args;
    int pool_started;
    pthread_mutex_t pool_mu;
    pthread_cond_t pool_go, pool_done;
    uint64_t pool_gen;
    int pool_pending, pool_stop;
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
    int exited;   /* producer_main returned */
    int orphaned; /* ds_close gave up waiting: the thread frees the dataset */
    pthread_t thread;
};

static void ds_free(Dataset *ds);

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
            int rc = tfr_reader_open(&ds->reader, ds->files[ds->order[ds->file_pos]], ds->cfg.comp,
                                     ds->cfg.verify_crc, err);
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
        ds->yielded_in_epoch++;
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

/* What to do with the next record: parse it, or stash it for the threads. */
typedef int (*TakeFn)(Dataset *ds, ExBatch *b, const ShufSlot *s, SgError *err);

static int parse_into(Dataset *ds, ExBatch *b, const ShufSlot *s, SgError *err)
{
    int rc = ex_batch_add(b, s->data, s->len, err);
    if (rc < 0)
        sg_context(err, "'%s': record %llu at byte %llu: ", ds->files[s->file],
                   (unsigned long long)s->index, (unsigned long long)s->offset);
    return rc;
}

/* Hands the next record to take; 1 done, 0 no more records. */
static int next_record(Dataset *ds, ExBatch *b, TakeFn take, SgError *err)
{
    int rc;
    if (ds->cfg.shuffle_buffer == 0) {
        if ((rc = source_next(ds, err)) <= 0)
            return rc;
        return take(ds, b, &ds->cur, err) < 0 ? err->code : 1;
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
    if ((rc = take(ds, b, &ds->shuf[i], err)) < 0)
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

/* ---- parallel parsing (positional schemas, parse_threads > 1) ---- */

static void deadline_in(struct timespec *ts, double seconds);

typedef struct PoolArg {
    Dataset *ds;
    int t;
} PoolArg;

typedef struct Stashed {
    size_t pos, len; /* data at arena + pos, its CRC footer after it */
    size_t file;
    uint64_t index, offset;
} Stashed;

/* Copies the record (and its footer) into the batch arena. */
static int stash(Dataset *ds, ExBatch *b, const ShufSlot *s, SgError *err)
{
    size_t need = s->len + TFR_FOOTER_BYTES;
    if (ds->arena_len + need > ds->arena_cap) {
        size_t cap = ds->arena_cap ? ds->arena_cap : (1u << 20);
        while (cap < ds->arena_len + need)
            cap *= 2;
        uint8_t *a = realloc(ds->arena, cap);
        if (a == NULL)
            return sg_fail(err, SG_ENOMEM, "out of memory for a batch of records (%zu bytes)", cap);
        ds->arena = a;
        ds->arena_cap = cap;
    }
    memcpy(ds->arena + ds->arena_len, s->data, need);
    ds->stashed[b->rows] = (Stashed){ds->arena_len, s->len, s->file, s->index, s->offset};
    ds->arena_len += need;
    b->rows++;
    return 0;
}

/* Rows t, t + T, t + 2T, ... of the stashed batch, for worker t of T. */
static void parse_rows(Dataset *ds, int t)
{
    ExBatch *b = ds->job;
    uint8_t *mine = ds->scratch + ex_scratch_size(ds->cfg.schema) * (size_t)t;
    ds->bad_row[t] = -1;
    for (size_t r = (size_t)t; r < b->rows; r += (size_t)ds->threads) {
        const Stashed *m = &ds->stashed[r];
        const uint8_t *d = ds->arena + m->pos;
        SgError *e = &ds->bad_err[t];
        int crc_failed = ds->cfg.verify_crc && tfr_check_data_crc(d, m->len, m->offset, e) < 0;
        if (crc_failed || ex_batch_parse_row(b, r, mine, d, m->len, e) < 0) {
            ds->bad_row[t] = (long)r;
            ds->bad_crc[t] = crc_failed;
            return; /* later rows of this worker cannot be the first failure */
        }
    }
}

/* A helper of the parse pool: waits for a job (re-checking stop every
 * 100 ms), parses its share, reports done. */
static void *pool_main(void *arg)
{
    PoolArg *pa = arg;
    Dataset *ds = pa->ds;
    uint64_t seen = 0;
    pthread_mutex_lock(&ds->pool_mu);
    for (;;) {
        while (ds->pool_gen == seen && !ds->pool_stop) {
            struct timespec ts;
            deadline_in(&ts, 0.1);
            pthread_cond_timedwait(&ds->pool_go, &ds->pool_mu, &ts);
        }
        if (ds->pool_stop)
            break;
        seen = ds->pool_gen;
        pthread_mutex_unlock(&ds->pool_mu);
        parse_rows(ds, pa->t);
        pthread_mutex_lock(&ds->pool_mu);
        if (--ds->pool_pending == 0)
            pthread_cond_signal(&ds->pool_done);
    }
    pthread_mutex_unlock(&ds->pool_mu);
    return NULL;
}

/* Checks the CRCs and parses the stashed rows on `threads` threads (this one
 * and the pool); reports the failure of the lowest row, as a sequential pass
 * would. */
static int parse_stashed(Dataset *ds, ExBatch *b, SgError *err)
{
    pthread_mutex_lock(&ds->pool_mu);
    ds->job = b;
    ds->pool_pending = ds->threads - 1;
    ds->pool_gen++;
    pthread_cond_broadcast(&ds->pool_go);
    pthread_mutex_unlock(&ds->pool_mu);
    parse_rows(ds, 0);
    pthread_mutex_lock(&ds->pool_mu);
    while (ds->pool_pending > 0)
        pthread_cond_wait(&ds->pool_done, &ds->pool_mu); /* helpers never block */
    pthread_mutex_unlock(&ds->pool_mu);
    int first = -1;
    for (int t = 0; t < ds->threads; t++)
        if (ds->bad_row[t] >= 0 && (first < 0 || ds->bad_row[t] < ds->bad_row[first]))
            first = t;
    if (first < 0)
        return 0;
    *err = ds->bad_err[first];
    const Stashed *m = &ds->stashed[ds->bad_row[first]];
    if (ds->bad_crc[first])
        return sg_context(err, "'%s': ", ds->files[m->file]);
    return sg_context(err, "'%s': record %llu at byte %llu: ", ds->files[m->file],
                      (unsigned long long)m->index, (unsigned long long)m->offset);
}

/* Fills b; 1 a batch, 0 the end. */
static int produce(Dataset *ds, ExBatch *b, SgError *err)
{
    int rc = ex_batch_reset(b, err);
    if (rc < 0)
        return rc;
    TakeFn take = ds->threads > 1 ? stash : parse_into;
    ds->arena_len = 0;
    while (b->rows < ds->cfg.batch_size) {
        if ((rc = next_record(ds, b, take, err)) < 0)
            return rc;
        if (rc == 0)
            break;
    }
    if (ds->threads > 1 && b->rows > 0 && (rc = parse_stashed(ds, b, err)) < 0)
        return rc;
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

static void producer_loop(Dataset *ds);

/* Runs the loop, then either tells ds_close it is done or, when ds_close
 * stopped waiting (a read blocked on slow storage), frees the dataset. */
static void *producer_main(void *arg)
{
    Dataset *ds = arg;
    producer_loop(ds);
    pthread_mutex_lock(&ds->mu);
    ds->exited = 1;
    int orphaned = ds->orphaned;
    pthread_cond_broadcast(&ds->ready_cv);
    pthread_mutex_unlock(&ds->mu);
    if (orphaned)
        ds_free(ds);
    return NULL;
}

static void producer_loop(Dataset *ds)
{
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
            return;
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
            return;
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
    pthread_mutex_init(&ds->pool_mu, NULL);
    pthread_cond_init(&ds->pool_go, NULL);
    pthread_cond_init(&ds->pool_done, NULL);
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
    ds->threads = cfg->parse_threads > 1 && ex_schema_positional(cfg->schema)
                      ? (int)(cfg->parse_threads > 64 ? 64 : cfg->parse_threads)
                      : 1;
    if (ds->threads > 1) {
        size_t t = (size_t)ds->threads;
        ds->stashed = calloc(cfg->batch_size, sizeof *ds->stashed);
        ds->scratch = calloc(t, ex_scratch_size(cfg->schema));
        ds->bad_row = calloc(t, sizeof *ds->bad_row);
        ds->bad_crc = calloc(t, sizeof *ds->bad_crc);
        ds->bad_err = calloc(t, sizeof *ds->bad_err);
        ds->pool = calloc(t, sizeof *ds->pool);
        ds->pool_args = calloc(t, sizeof *ds->pool_args);
        if (ds->stashed == NULL || ds->scratch == NULL || ds->bad_row == NULL ||
            ds->bad_crc == NULL || ds->bad_err == NULL || ds->pool == NULL || ds->pool_args == NULL)
            goto oom;
        for (int i = 1; i < ds->threads; i++) {
            ds->pool_args[i] = (PoolArg){ds, i};
            if ((rc = pthread_create(&ds->pool[i], NULL, pool_main, &ds->pool_args[i])) != 0) {
                ds->threads = i; /* the helpers started so far get joined */
                ds_close(ds);
                return sg_fail_errno(err, SG_ESTATE, rc, "cannot start parse thread %d", i);
            }
            ds->pool_started = i;
        }
    }
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

int ds_close(Dataset *ds)
{
    if (ds == NULL)
        return 0;
    if (ds->thread_started) {
        /* The thread stops after its current record; a read blocked on
         * storage can take longer, so wait at most 2 s, then leave the
         * freeing to the thread. */
        pthread_mutex_lock(&ds->mu);
        ds->stop = 1;
        pthread_cond_broadcast(&ds->free_cv);
        struct timespec ts;
        deadline_in(&ts, 2.0);
        while (!ds->exited)
            if (pthread_cond_timedwait(&ds->ready_cv, &ds->mu, &ts) == ETIMEDOUT)
                break;
        int exited = ds->exited;
        if (!exited)
            ds->orphaned = 1;
        pthread_mutex_unlock(&ds->mu);
        if (!exited) {
            pthread_detach(ds->thread);
            return 1;
        }
        pthread_join(ds->thread, NULL);
    }
    ds_free(ds);
    return 0;
}

static void ds_free(Dataset *ds)
{
    tfr_reader_close(ds->reader);
    if (ds->files)
        for (size_t i = 0; i < ds->nfiles; i++)
            free(ds->files[i]);
    free(ds->files);
    free(ds->order);
    if (ds->pool_started > 0) {
        pthread_mutex_lock(&ds->pool_mu);
        ds->pool_stop = 1;
        pthread_cond_broadcast(&ds->pool_go);
        pthread_mutex_unlock(&ds->pool_mu);
        for (int i = 1; i <= ds->pool_started; i++)
            pthread_join(ds->pool[i], NULL);
    }
    pthread_mutex_destroy(&ds->pool_mu);
    pthread_cond_destroy(&ds->pool_go);
    pthread_cond_destroy(&ds->pool_done);
    free(ds->stashed);
    free(ds->arena);
    free(ds->scratch);
    free(ds->bad_row);
    free(ds->bad_crc);
    free(ds->bad_err);
    free(ds->pool);
    free(ds->pool_args);
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
