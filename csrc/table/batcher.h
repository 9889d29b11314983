/*
 * batcher.h - chunks of table rows -> shuffled batches.
 *
 * Rows are handles (chunk, row). With shuffle_buffer S > 0 the batcher
 * keeps S handles; each batch row is one of them drawn at random (seeded,
 * so a seed gives one order), its slot refilled from the rows pushed next,
 * as tf.data's shuffle does. S = 0 keeps the pushed order. A batch's
 * columns are gathered from the chunks (float32 rows, lengths, strings as
 * offsets + bytes); a chunk is freed once every row of it is in a batch.
 *
 * The order depends only on the rows pushed, not on how they were cut into
 * chunks: a batch is drawn only once the buffer is full (or `final`).
 * Not here: reading, epochs, shards (the Python side plans those).
 */
#ifndef SG_TABLE_BATCHER_H
#define SG_TABLE_BATCHER_H

#include <stddef.h>
#include <stdint.h>

#include "common/sg_status.h"
#include "table/table.h"

typedef struct TblBatcher TblBatcher;

int tbl_batcher_new(TblBatcher **out, size_t batch_size, size_t shuffle_buffer, uint64_t seed,
                    SgError *err);

/* Takes chunk (freed on failure too). Every chunk must have the columns,
 * widths and kinds of the first (SG_ESCHEMA otherwise). */
int tbl_batcher_push(TblBatcher *b, TblChunk *chunk, SgError *err);

/* Rows pushed and not yet in a batch. */
size_t tbl_batcher_rows(const TblBatcher *b);

/* Makes the next batch (a TblChunk of batch_size rows, or fewer when
 * `final` and fewer are left; free with tbl_chunk_free) into *out and
 * returns 1; returns 0 when more rows must be pushed first (or, when
 * final, none are left). */
int tbl_batcher_next(TblBatcher *b, int final, TblChunk **out, SgError *err);

void tbl_batcher_free(TblBatcher *b);

#endif /* SG_TABLE_BATCHER_H */
