/*
 * dataset.h - the input pipeline: TFRecord files -> parsed, batched columns.
 *
 *   files (this shard's) -> records (sharded by index when there are fewer
 *   files than shards) -> repeat `epochs` times -> shuffle buffer (seeded) ->
 *   parse with the schema -> batches of batch_size (the last one kept unless
 *   drop_remainder) -> a queue of `prefetch` batches filled by
 *   `parse_threads` background threads (prefetch 0 and one parse thread:
 *   produced in the caller's thread).
 *
 * Epochs are concatenated before batching (TF's repeat().shuffle().batch()),
 * so with a shuffle buffer records of neighbouring epochs can mix.
 */
#ifndef SG_DATASET_H
#define SG_DATASET_H

#include <stddef.h>
#include <stdint.h>

#include "common/sg_status.h"
#include "record/example_parse.h"
#include "record/tfrecord.h"

typedef struct DsConfig {
    const char *const *paths; /* files, already expanded (no globs) */
    size_t npaths;
    TfrCompression comp;
    int verify_crc;
    const ExSchema *schema; /* must outlive the dataset */
    size_t batch_size;
    size_t shuffle_buffer; /* 0: no shuffling */
    uint64_t seed;
    long long epochs; /* < 0: repeat forever */
    size_t shard_index, num_shards;
    int drop_remainder;
    size_t prefetch; /* batches produced ahead by a background thread */
    /* Threads that each read, check and parse whole batches, published in
     * order (any schema). With 1 and prefetch 0 everything runs in the
     * caller's thread. */
    size_t parse_threads;
} DsConfig;

typedef struct Dataset Dataset;

/* Copies what it needs from cfg and starts the thread (if prefetch > 0). */
int ds_open(Dataset **out, const DsConfig *cfg, SgError *err);

/* Waits up to wait_s seconds for the next batch. Returns 1 with *batch (the
 * caller's until ds_release), 0 at the end, SG_ETIMEOUT when nothing came in
 * time (call again), or the pipeline's error (then every later call fails). */
int ds_next(Dataset *ds, ExBatch **batch, double wait_s, SgError *err);

/* Gives a batch back for reuse (after its columns were taken or copied). */
void ds_release(Dataset *ds, ExBatch *batch);

/* The files this shard reads, for messages. */
size_t ds_file_count(const Dataset *ds);

/* Stops the thread and frees. Waits at most 2 s for the thread to finish its
 * current read; if it is still blocked (slow storage), returns 1 and the
 * thread frees the dataset when the read returns, so the schema given in
 * DsConfig must then stay alive. Returns 0 when everything was freed. */
int ds_close(Dataset *ds);

#endif /* SG_DATASET_H */
