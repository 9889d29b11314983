/*
 * sequence_parse.h - schema-driven parsing of the feature lists of
 * tf.train.SequenceExample records into batched columns, with TensorFlow's
 * parse_sequence_example semantics (the context is an Example's Features on
 * the wire, so ex_batch_add parses it with an ordinary ExSchema):
 *
 *   EX_SPEC_FIXED   FixedLenSequenceFeature: every step holds exactly `count`
 *                   values; the batch is padded to its longest list (zeros,
 *                   empty bytes) and each record's step count is kept. A
 *                   missing list is an error unless allow_missing (0 steps).
 *   EX_SPEC_VARLEN  VarLenFeature: any number of steps, any number of values
 *                   per step -> values + step splits + row splits.
 *
 * Duplicate keys: the last one wins. Errors are SG_ESCHEMA naming the feature
 * list, the step, what was expected and what was found (callers prepend the
 * file and record index), or SG_EPROTOBUF for broken bytes.
 */
#ifndef SG_SEQUENCE_PARSE_H
#define SG_SEQUENCE_PARSE_H

#include <stddef.h>
#include <stdint.h>

#include "common/sg_status.h"
#include "record/example_parse.h"

/* One feature list of a batch. Records' steps are concatenated. */
typedef struct SeqColumn {
    ExValues v;           /* every step's values, of the spec's dtype */
    int64_t *step_splits; /* nsteps + 1: values before each step */
    size_t nsteps, steps_cap;
    int64_t *row_splits; /* rows + 1: steps before each record */
    size_t max_steps;    /* the longest list so far */
} SeqColumn;

typedef struct SeqBatch {
    const ExSchema *lists;    /* kind FIXED or VARLEN, wire == out kind */
    const int *allow_missing; /* per list spec (FIXED only) */
    size_t rows, cap;
    SeqColumn *cols;
    struct SeqSlot *slots; /* per-record scratch */
} SeqBatch;

int seq_batch_init(SeqBatch *b, const ExSchema *lists, const int *allow_missing, size_t cap,
                   SgError *err);

/* Parses the feature lists of one SequenceExample into row b->rows, then
 * rows++; on failure nothing of the record stays in the columns. */
int seq_batch_add(SeqBatch *b, const uint8_t *rec, size_t n, SgError *err);

void seq_batch_free(SeqBatch *b);

#endif /* SG_SEQUENCE_PARSE_H */
