/* nn_loss.c - softmax cross-entropy, gradient and hits in one pass (see nn_loss.h). */
#include "nn/nn_loss.h"

#include "nn/nn_ref.h"

#include <math.h>
#include <stddef.h>

int softmax_xent_train(float *dlogits, double *loss_sum, int *correct, const float *logits,
                       const int32_t *labels, const float *onehot, int B, int K, int *bad)
{
    double total = 0.0;
    int hits = 0;
    const float inv_b = 1.0f / (float)B;
    for (int b = 0; b < B; b++) {
        const float *x = logits + (size_t)b * K;
        const float *t = onehot ? onehot + (size_t)b * K : NULL;
        int want;
        if (labels) {
            want = labels[b];
            if (want < 0 || want >= K) {
                *bad = b;
                return -1;
            }
        } else {
            want = nn_argmax(t, K);
        }
        int best = nn_argmax(x, K);
        hits += best == want;
        const float mx = x[best];
        float sum = 0.0f;
        float *d = dlogits ? dlogits + (size_t)b * K : NULL;
        for (int k = 0; k < K; k++) {
            float e = expf(x[k] - mx);
            sum += e;
            if (d)
                d[k] = e; /* exp(x - max), normalised below */
        }
        const float lse = logf(sum); /* log_softmax_k = x_k - mx - lse */
        if (labels) {
            total -= (double)(x[want] - mx - lse);
        } else {
            for (int k = 0; k < K; k++)
                total -= (double)t[k] * (double)(x[k] - mx - lse);
        }
        if (d) {
            const float inv = 1.0f / sum;
            for (int k = 0; k < K; k++) {
                float target = labels ? (k == want ? 1.0f : 0.0f) : t[k];
                d[k] = (d[k] * inv - target) * inv_b;
            }
        }
    }
    *loss_sum = total;
    *correct = hits;
    return 0;
}
