/*
 * test_nn_loss.c - the one-pass training loss (nn_loss.h) against the
 * reference chain log_softmax_forward_ref -> xent_forward / xent_backward /
 * accuracy_count (nn_ref.h), sparse and one-hot targets, with logits large
 * enough that a naive exp would overflow; and its rejection of bad labels.
 * Exits non-zero on any mismatch.
 */
#include <math.h>
#include <stdlib.h>

#include "check.h"
#include "nn/nn_loss.h"
#include "nn/nn_ref.h"

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

static void check_against_reference(int B, int K, int sparse, float scale)
{
    uint64_t seed = 0x5eed + (uint64_t)B * 31 + (uint64_t)K;
    float *logits = malloc(sizeof(float) * B * K), *lp = malloc(sizeof(float) * B * K);
    float *want = malloc(sizeof(float) * B * K), *got = malloc(sizeof(float) * B * K);
    float *onehot = calloc((size_t)B * K, sizeof(float));
    int32_t *labels = malloc(sizeof(int32_t) * B);
    for (int i = 0; i < B * K; i++)
        logits[i] = scale * frand(&seed);
    for (int b = 0; b < B; b++) {
        labels[b] = (int32_t)((unsigned)(frand(&seed) * 1000.0f + 1000.0f) % (unsigned)K);
        onehot[(size_t)b * K + labels[b]] = 1.0f;
    }
    const int32_t *lab = sparse ? labels : NULL;
    const float *oh = sparse ? NULL : onehot;
    log_softmax_forward_ref(lp, logits, B, K);
    double want_loss = xent_forward(lp, lab, oh, B, K, NULL) * B;
    xent_backward(want, lp, lab, oh, B, K);
    int want_hits = accuracy_count(logits, lab, oh, B, K);

    double loss = 0.0;
    int hits = -1, bad = -1;
    CHECK(softmax_xent_train(got, &loss, &hits, logits, lab, oh, B, K, &bad) == 0);
    CHECK(bad == -1);
    CHECK(isfinite(loss) && fabs(loss - want_loss) <= 1e-5 * fabs(want_loss) + 1e-6);
    CHECK(hits == want_hits);
    double maxd = 0.0;
    for (int i = 0; i < B * K; i++) {
        double d = fabs((double)got[i] - want[i]);
        maxd = d > maxd ? d : maxd;
    }
    CHECK(maxd <= 1e-6 / B + 1e-9);
    /* without a gradient output: the same loss and hits */
    double loss2 = 0.0;
    int hits2 = -1;
    CHECK(softmax_xent_train(NULL, &loss2, &hits2, logits, lab, oh, B, K, &bad) == 0);
    CHECK(loss2 == loss && hits2 == hits);
    free(logits), free(lp), free(want), free(got), free(onehot), free(labels);
}

static void test_rejects_out_of_range_label(void)
{
    float logits[3 * 4] = {0}, d[3 * 4];
    int32_t labels[3] = {1, 4, 0};
    double loss;
    int hits, bad = -1;
    CHECK(softmax_xent_train(d, &loss, &hits, logits, labels, NULL, 3, 4, &bad) == -1);
    CHECK(bad == 1);
    labels[1] = -1;
    bad = -1;
    CHECK(softmax_xent_train(d, &loss, &hits, logits, labels, NULL, 3, 4, &bad) == -1);
    CHECK(bad == 1);
}

int main(void)
{
    check_against_reference(100, 10, 1, 3.0f);
    check_against_reference(100, 10, 0, 3.0f);
    check_against_reference(7, 3, 1, 200.0f); /* exp(200) overflows float */
    check_against_reference(5, 1000, 0, 50.0f);
    test_rejects_out_of_range_label();
    return check_report("test_nn_loss");
}
