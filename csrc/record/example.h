/*
 * example.h - tf.train.Example and SequenceExample on the wire.
 *
 *   Example         { Features features = 1; }
 *   Features        { map<string, Feature> feature = 1; }   entry: key = 1, value = 2
 *   Feature         { oneof { BytesList = 1; FloatList = 2; Int64List = 3; } }
 *   *List           { repeated bytes|float|int64 value = 1; }  (packed or not)
 *   SequenceExample { Features context = 1; FeatureLists feature_lists = 2; }
 *   FeatureLists    { map<string, FeatureList> feature_list = 1; }
 *   FeatureList     { repeated Feature feature = 1; }
 *
 * Decoding never copies: an ExFeature points into the record. Offsets in
 * messages are bytes from the start of the record.
 */
#ifndef SG_EXAMPLE_H
#define SG_EXAMPLE_H

#include <stddef.h>
#include <stdint.h>

#include "common/sg_status.h"
#include "record/pb.h"

typedef enum ExKind { EX_NONE = 0, EX_BYTES = 1, EX_FLOAT = 2, EX_INT64 = 3 } ExKind;

const char *ex_kind_name(ExKind kind);

/* One map entry: the key and the Feature message body (not yet decoded). */
typedef struct ExEntry {
    const uint8_t *key;
    size_t key_len;
    const uint8_t *value;
    size_t value_len;
    size_t offset; /* of the entry within the record */
} ExEntry;

/* A decoded Feature: which list it holds and how many values. */
typedef struct ExFeature {
    ExKind kind;
    const uint8_t *list; /* the *List message body */
    size_t list_len;
    size_t count;
    size_t offset; /* of the list body within the record */
} ExFeature;

typedef int (*ExEntryFn)(void *ctx, const ExEntry *entry, SgError *err);

/* Calls fn for every map entry of an Example record's Features (every
 * `features` field, duplicates included, in order), after checking its
 * structure and that the key is UTF-8. A non-zero return from fn stops the
 * walk and is returned. */
int ex_example_foreach(const uint8_t *rec, size_t n, ExEntryFn fn, void *ctx, SgError *err);

/* Decodes a Feature body: its kind (EX_NONE when empty), the list, and the
 * number of values, validating every value's encoding. */
int ex_feature_decode(const uint8_t *base, const uint8_t *p, size_t n, ExFeature *out,
                      SgError *err);

/* Copy out a validated feature's values (exactly f->count of them). */
void ex_values_int64(const ExFeature *f, int64_t *out);
void ex_values_float(const ExFeature *f, float *out);
void ex_values_bytes(const ExFeature *f, const uint8_t **ptrs, size_t *lens);

/* SequenceExample: context entries go to ctx_fn, feature_lists entries (key
 * + FeatureList body) to list_fn. */
int ex_sequence_foreach(const uint8_t *rec, size_t n, ExEntryFn ctx_fn, ExEntryFn list_fn,
                        void *ctx, SgError *err);

/* Calls fn for each Feature of a FeatureList body (entry->key is NULL). */
int ex_feature_list_foreach(const uint8_t *base, const uint8_t *p, size_t n, ExEntryFn fn,
                            void *ctx, SgError *err);

/* ---- encoding: append one map entry (field 1 of Features) to b ---- */
void ex_put_int64(PbBuf *b, const char *key, size_t key_len, const int64_t *v, size_t n);
void ex_put_float(PbBuf *b, const char *key, size_t key_len, const float *v, size_t n);
void ex_put_bytes(PbBuf *b, const char *key, size_t key_len, const uint8_t *const *v,
                  const size_t *lens, size_t n);

/* A bare Feature message (for FeatureList.feature) appended as field `field`. */
void ex_put_feature_int64(PbBuf *b, uint32_t field, const int64_t *v, size_t n);
void ex_put_feature_float(PbBuf *b, uint32_t field, const float *v, size_t n);
void ex_put_feature_bytes(PbBuf *b, uint32_t field, const uint8_t *const *v, const size_t *lens,
                          size_t n);

#endif /* SG_EXAMPLE_H */
