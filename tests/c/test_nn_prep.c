/*
 * test_nn_prep.c - preprocessing chains (nn/nn_prep.h) on hand-made
 * columns: a string lookup over Arrow's layout (int32 offsets), OOV buckets
 * by floormod and by hash, the hashes against TensorFlow's values, the
 * encodings, Discretization's boundary side, and the errors (a repeated
 * token, offsets outside the bytes, an id outside an encoding, ids beyond
 * float32's exact range); then a chain in a model's gather, and a string
 * column refused by an input without one.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "nn/nn_model.h"
#include "nn/nn_prep.h"

static const char VOCAB[] = "abbccc";
static const int64_t VOFF[] = {0, 1, 3, 6};

static NnPrepSpec string_lookup(void)
{
    NnPrepSpec s;
    memset(&s, 0, sizeof s);
    s.map_layer = "StringLookup 'lk'";
    s.map = NN_PREP_LOOKUP;
    s.strings = 1;
    s.row = 1;
    s.nvocab = 3;
    s.vocab_offsets = VOFF;
    s.vocab_bytes = VOCAB;
    s.first = 1;
    s.num_oov = 1;
    return s;
}

static void test_string_lookup_over_arrow_offsets(void)
{
    NnPrep *p;
    SgError err = {0};
    NnPrepSpec s = string_lookup();
    CHECK(nn_prep_new(&p, &s, &err) == 0);
    const char data[] = "bbzza";
    const int32_t off[] = {0, 2, 4, 5, 5}; /* "bb", "zz", "a", "" */
    NnArray a = {NN_STR32, data, 1, off, 5};
    float out[4];
    CHECK(nn_prep_check(p, &a, &err) == 0);
    CHECK(nn_prep_rows(p, &a, NULL, 0, 4, out, &err) == 0);
    CHECK(out[0] == 2.0f && out[1] == 0.0f && out[2] == 1.0f && out[3] == 0.0f);
    const int32_t bad[] = {0, 2, 9, 9, 9};
    NnArray b = {NN_STR32, data, 1, bad, 5};
    CHECK(nn_prep_rows(p, &b, NULL, 0, 4, out, &err) == SG_EINVAL);
    CHECK(strstr(err.msg, "row 1") != NULL && strstr(err.msg, "outside 5 bytes") != NULL);
    NnArray f = {NN_F32, out, 1, NULL, 0};
    CHECK(nn_prep_check(p, &f, &err) == SG_EINVAL && strstr(err.msg, "takes a string column"));
    nn_prep_free(p);

    static const char DUP[] = "abba";
    static const int64_t DOFF[] = {0, 1, 3, 4, 5};
    s.vocab_bytes = DUP;
    s.vocab_offsets = DOFF;
    s.nvocab = 3; /* "a", "bb", "a" */
    CHECK(nn_prep_new(&p, &s, &err) == SG_EINVAL && strstr(err.msg, "repeats 'a'") != NULL);
    CHECK(p == NULL);
}

static void test_integer_lookup_floormod_and_mask(void)
{
    static const int64_t vocab[] = {5, 9};
    NnPrepSpec s;
    memset(&s, 0, sizeof s);
    s.map_layer = "IntegerLookup 'il'";
    s.map = NN_PREP_LOOKUP;
    s.row = 4;
    s.nvocab = 2;
    s.vocab_ints = vocab;
    s.num_oov = 3;
    s.oov_start = 1; /* the mask at 0 */
    s.first = 4;
    s.oov_floormod = 1;
    s.has_mask = 1;
    s.mask_int = 0;
    NnPrep *p;
    SgError err = {0};
    CHECK(nn_prep_new(&p, &s, &err) == 0);
    const int64_t x[] = {9, -1, 0, 4};
    NnArray a = {NN_I64, x, 4, NULL, 0};
    float out[4];
    CHECK(nn_prep_rows(p, &a, NULL, 0, 1, out, &err) == 0);
    /* 9 -> 4 + 1; -1 -> 1 + floormod(-1, 3) = 3; the mask -> 0; 4 -> 1 + 1 */
    CHECK(out[0] == 5.0f && out[1] == 3.0f && out[2] == 0.0f && out[3] == 2.0f);
    nn_prep_free(p);
}

static void test_hashes_are_tensorflows(void)
{
    /* tf.strings.to_hash_bucket_fast("hello", 1000003) and _strong(key=[7, 11]) */
    SgError err = {0};
    uint64_t h;
    const uint64_t key[2] = {7, 11};
    CHECK(nn_prep_fingerprint64("hello", 5) % 1000003 == 497363);
    CHECK(nn_prep_siphash(key, "hello", 5, &h, &err) == 0 && h % 1000003 == 37178);

    NnPrepSpec s;
    memset(&s, 0, sizeof s);
    s.map_layer = "Hashing 'h'";
    s.map = NN_PREP_HASH;
    s.row = 2;
    s.num_bins = 1000003;
    s.salted = 1;
    s.salt[0] = 7;
    s.salt[1] = 11;
    NnPrep *p;
    CHECK(nn_prep_new(&p, &s, &err) == 0);
    const char data[] = "hello";
    const int64_t off[] = {0, 5, 5};
    NnArray a = {NN_STR64, data, 2, off, 5};
    float out[2];
    CHECK(nn_prep_rows(p, &a, NULL, 0, 1, out, &err) == 0);
    CHECK(out[0] == 37178.0f && out[1] == 360241.0f); /* "" as well */
    nn_prep_free(p);
    s.num_bins = 1; /* a mask needs a bin of its own and one for the others */
    s.has_mask = 1;
    CHECK(nn_prep_new(&p, &s, &err) == SG_EINVAL && strstr(err.msg, "num_bins must be >= 2"));
}

static void test_encodings_and_their_range(void)
{
    NnPrepSpec s;
    memset(&s, 0, sizeof s);
    s.encode_layer = "CategoryEncoding 'enc'";
    s.map = NN_PREP_IDENTITY;
    s.row = 3;
    s.encode = NN_ENCODE_COUNT;
    s.num_tokens = 4;
    NnPrep *p;
    SgError err = {0};
    CHECK(nn_prep_new(&p, &s, &err) == 0);
    CHECK(nn_prep_out_row(p) == 4);
    const int32_t x[] = {1, 1, 3, 0, 4, 0};
    const int64_t order[] = {1, 0};
    NnArray a = {NN_I32, x, 3, NULL, 0};
    float out[8];
    CHECK(nn_prep_rows(p, &a, order, 1, 1, out, &err) == 0); /* row 0 */
    CHECK(out[0] == 0.0f && out[1] == 2.0f && out[2] == 0.0f && out[3] == 1.0f);
    CHECK(nn_prep_rows(p, &a, order, 0, 2, out, &err) == SG_EINVAL);
    CHECK(strstr(err.msg, "CategoryEncoding 'enc': value 4 of row 1 (column 1)") != NULL);
    nn_prep_free(p);

    s.encode = NN_ENCODE_ONE_HOT;
    CHECK(nn_prep_new(&p, &s, &err) == 0 && nn_prep_out_row(p) == 12);
    float hot[12];
    CHECK(nn_prep_rows(p, &a, NULL, 0, 1, hot, &err) == 0); /* 1, 1, 3: each its own row of 4 */
    float sum = 0.0f;
    for (int i = 0; i < 12; i++)
        sum += hot[i];
    CHECK(sum == 3.0f && hot[1] == 1.0f && hot[5] == 1.0f && hot[11] == 1.0f);
    nn_prep_free(p);

    s.num_tokens = NN_PREP_MAX_ID + 1;
    CHECK(nn_prep_new(&p, &s, &err) == SG_EINVAL && strstr(err.msg, "float32 exactly") != NULL);
}

static void test_discretization_takes_the_upper_bin_at_a_boundary(void)
{
    static const float bounds[] = {0.0f, 1.0f};
    NnPrepSpec s;
    memset(&s, 0, sizeof s);
    s.map_layer = "Discretization 'd'";
    s.map = NN_PREP_DISCRETIZE;
    s.row = 5;
    s.bounds = bounds;
    s.nbounds = 2;
    NnPrep *p;
    SgError err = {0};
    CHECK(nn_prep_new(&p, &s, &err) == 0);
    const float x[] = {-1.0f, 0.0f, 0.5f, 1.0f, 2.0f};
    NnArray a = {NN_F32, x, 5, NULL, 0};
    float out[5];
    CHECK(nn_prep_rows(p, &a, NULL, 0, 1, out, &err) == 0);
    CHECK(out[0] == 0 && out[1] == 1 && out[2] == 1 && out[3] == 2 && out[4] == 2);
    nn_prep_free(p);
}

static void test_a_chain_in_the_gather(void)
{
    /* strings -> StringLookup (one-hot over 4) -> Dense(1), no bias: the output is the kernel's row
     */
    LayerSpec dense;
    memset(&dense, 0, sizeof dense);
    dense.kind = LAYER_DENSE;
    dense.units = 1;
    Model *m;
    SgError err = {0};
    CHECK(model_create(&m, 1, 1, 4, &dense, 1, &err) == 0);
    float *w = model_params(m);
    for (int i = 0; i < 4; i++)
        w[i] = (float)(10 * i);
    w[4] = 0.0f;
    NnPrepSpec s = string_lookup();
    s.encode = NN_ENCODE_ONE_HOT;
    s.encode_layer = "StringLookup 'lk'";
    s.num_tokens = 4;
    NnPrep *p;
    CHECK(nn_prep_new(&p, &s, &err) == 0);
    const char data[] = "cccabb";
    const int64_t off[] = {0, 3, 4, 6};
    NnData d;
    memset(&d, 0, sizeof d);
    d.n = 3;
    d.ninputs = 1;
    d.inputs[0] = (NnArray){NN_STR64, data, 1, off, 6};
    d.preps[0] = p;
    float out[3];
    float *outs[1] = {out};
    CHECK(model_predict(m, &d, 2, outs, &err) == 0);
    CHECK(out[0] == 30.0f && out[1] == 10.0f && out[2] == 20.0f);
    d.preps[0] = NULL;
    CHECK(model_predict(m, &d, 2, outs, &err) == SG_EINVAL);
    CHECK(strstr(err.msg, "a string column was given") != NULL);
    nn_prep_free(p);
    model_free(m);
}

int main(void)
{
    test_string_lookup_over_arrow_offsets();
    test_integer_lookup_floormod_and_mask();
    test_hashes_are_tensorflows();
    test_encodings_and_their_range();
    test_discretization_takes_the_upper_bin_at_a_boundary();
    test_a_chain_in_the_gather();
    return check_report("test_nn_prep");
}
