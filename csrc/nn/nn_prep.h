/*
 * nn_prep.h - Keras' preprocessing layers as a step of the batch gather: a
 * model input whose raw column (strings, integers or numbers) is mapped,
 * value by value, into the float row the network reads while the rows of a
 * batch are gathered (nn_train.c), so that a string column trains with no
 * per-row work outside C.
 *
 * One NnPrep is the chain on one model input: a map (Normalization,
 * Discretization, StringLookup / IntegerLookup, Hashing, or none) and an
 * optional encoding (CategoryEncoding, or a lookup's / Hashing's own
 * output_mode) that widens each row's ids into num_tokens floats. Ids are
 * written as exact integers in float32 (every id is below 2^24, checked when
 * the chain is built), which is how Embedding reads them.
 *
 * Strings arrive as Arrow lays them out (NnArray: offsets + bytes), so an
 * Arrow string or large_string array is fed without a copy. Hashes are
 * Keras' (tf.strings.to_hash_bucket_fast / _strong): FarmHash's
 * Fingerprint64 (libfarmhash) without a salt, SipHash-2-4 keyed with the
 * two 64-bit halves of the salt (OpenSSL's EVP_MAC "SIPHASH") with one;
 * integers are hashed as their decimal strings. Not here: nulls (an Arrow
 * validity bitmap), TF-IDF, inverted lookups, sparse outputs.
 *
 * A chain is immutable once built and may be read by several threads.
 */
#ifndef NN_PREP_H
#define NN_PREP_H

#include <stddef.h>
#include <stdint.h>

#include "common/sg_status.h"
#include "nn/nn_model.h"

/* Ids are exact in float32 below this. */
#define NN_PREP_MAX_ID (1 << 24)

typedef enum NnPrepMap {
    NN_PREP_IDENTITY = 0,   /* integer ids as they are (CategoryEncoding alone) */
    NN_PREP_NORMALIZE = 1,  /* (x - mean[j]) / std[j], float32 (std: max(sqrt(var), eps)) */
    NN_PREP_DISCRETIZE = 2, /* the number of boundaries <= x */
    NN_PREP_LOOKUP = 3,     /* the vocabulary's index, or an OOV bucket */
    NN_PREP_HASH = 4,       /* a hash bucket */
} NnPrepMap;

typedef enum NnPrepEncode {
    NN_ENCODE_NONE = 0,      /* one float id per value */
    NN_ENCODE_ONE_HOT = 1,   /* each value its own num_tokens row (one value: the row) */
    NN_ENCODE_MULTI_HOT = 2, /* 1 where an id occurs in the row */
    NN_ENCODE_COUNT = 3,     /* how often each id occurs in the row */
} NnPrepEncode;

/* What a chain is built from (copied by nn_prep_new). */
typedef struct NnPrepSpec {
    const char *map_layer;    /* the map's layer name, in messages ("" with none) */
    const char *encode_layer; /* the encoding's layer name */
    NnPrepMap map;
    int strings; /* the column holds strings (LOOKUP and HASH); else numbers */
    size_t row;  /* values per input row */
    /* NORMALIZE: [row] each */
    const float *mean, *std;
    /* DISCRETIZE: ascending boundaries [nbounds] */
    const float *bounds;
    size_t nbounds;
    /* LOOKUP: the tokens, token k getting id first + k; strings: token k is
     * vocab_bytes[vocab_offsets[k] .. vocab_offsets[k + 1]); integers:
     * vocab_ints[k]. Distinct (a repeated token is SG_EINVAL naming it). */
    size_t nvocab;
    const int64_t *vocab_offsets;
    const char *vocab_bytes;
    const int64_t *vocab_ints;
    int64_t first;
    /* LOOKUP: OOV buckets oov_start + [0, num_oov) (0: an OOV value is an
     * error); integers take floormod(x, num_oov) with oov_floormod, others a
     * hash. HASH: num_bins buckets (ids [0, num_bins), or with a mask 0 for
     * it and [1, num_bins) for the others). */
    int64_t num_oov, oov_start;
    int oov_floormod;
    int64_t num_bins;
    /* LOOKUP and HASH: the mask token and its id (mask_id < 0: dropped from
     * an encoding) */
    int has_mask;
    const char *mask_str;
    size_t mask_len;
    int64_t mask_int;
    int64_t mask_id;
    /* SipHash-2-4 keyed with salt[0], salt[1] instead of FarmHash */
    int salted;
    uint64_t salt[2];
    NnPrepEncode encode;
    int64_t num_tokens; /* the encoding's width (ids must be below it) */
} NnPrepSpec;

typedef struct NnPrep NnPrep;

/* Builds a chain from spec: SG_EINVAL naming the layer for a spec that does
 * not hold together (ids at or above NN_PREP_MAX_ID, a repeated token,
 * boundaries not ascending), SG_ENOMEM. */
int nn_prep_new(NnPrep **out, const NnPrepSpec *spec, SgError *err);
void nn_prep_free(NnPrep *p);

/* Values per input row, floats per output row, and whether it takes strings. */
size_t nn_prep_in_row(const NnPrep *p);
size_t nn_prep_out_row(const NnPrep *p);
int nn_prep_strings(const NnPrep *p);
/* The map's (or, without one, the encoding's) layer name. */
const char *nn_prep_layer(const NnPrep *p);

/* Checks that a (n rows) is a column p reads: strings for a string chain,
 * int32/int64 for ids, float32 for Normalization and Discretization, `row`
 * values per row. SG_EINVAL naming the layer and what was given. */
int nn_prep_check(const NnPrep *p, const NnArray *a, SgError *err);

/* Maps rows order[start..start+B) (order NULL: start..start+B) of a into
 * dst [B, out_row]. SG_EINVAL naming the layer, the row and the column: an
 * OOV value without OOV buckets, an id outside an encoding, a NaN to
 * discretize, string offsets that do not fit the bytes. */
int nn_prep_rows(const NnPrep *p, const NnArray *a, const int64_t *order, size_t start, int B,
                 float *dst, SgError *err);

/* Keras' string hashes (see above): FarmHash Fingerprint64 of s[len], and
 * SipHash-2-4 keyed with key[2] (SG_EINVAL when OpenSSL lacks SIPHASH). */
uint64_t nn_prep_fingerprint64(const char *s, size_t len);
int nn_prep_siphash(const uint64_t key[2], const char *s, size_t len, uint64_t *out, SgError *err);

#endif /* NN_PREP_H */
