/*
 * nn_ref.h - naive C reference kernels, one pair <op>_forward_ref /
 * <op>_backward_ref per operation, plus the few kernels that only exist in C
 * (cross-entropy from log-probabilities, accuracy, dropout).
 *
 * The oneDNN kernels (nn_plan.c) are checked against these by the tests;
 * they are written for clarity, not speed. Outputs first, then inputs, then
 * shape ints. Shape letters, used in every comment:
 *   B  batch            C  input features / channels     OC output features / channels
 *   H, W  input height / width      OH, OW  output height / width
 *   KH, KW  kernel height / width   K  classes
 * Activations are NHWC (Keras' channels_last); conv weights are HWIO
 * [KH, KW, C, OC] and dense weights are [C, OC] (Keras' kernel layout).
 * Backward functions overwrite (not accumulate) their gradient outputs.
 */
#ifndef NN_REF_H
#define NN_REF_H

#include <stddef.h>
#include <stdint.h>

/* Activations, with Keras 3's default arguments. Dense and Conv2D fuse
 * those up to NN_ACT_ELU (their backward runs from the output); the
 * Activation op runs every one but softmax (from its input). */
typedef enum NnAct {
    NN_ACT_NONE = 0,
    NN_ACT_RELU = 1,
    NN_ACT_TANH = 2,
    NN_ACT_SIGMOID = 3,
    NN_ACT_SOFTMAX = 4,    /* only on the last layer: handled by the loss */
    NN_ACT_LEAKY_RELU = 5, /* x < 0: 0.2 x (keras.activations.leaky_relu) */
    NN_ACT_ELU = 6,        /* x < 0: exp(x) - 1 */
    NN_ACT_SELU = 7,       /* 1.0507 * elu(x, 1.67326) */
    NN_ACT_GELU = 8,       /* x * Phi(x), the erf form (approximate=False) */
    NN_ACT_SWISH = 9,      /* x * sigmoid(x), also silu */
    NN_ACT_SOFTPLUS = 10,  /* log(1 + exp(x)) */
    NN_ACT_COUNT,
} NnAct;

#define NN_LEAKY_RELU_SLOPE 0.2f
#define NN_SELU_ALPHA       1.67326324235437728481f
#define NN_SELU_SCALE       1.05070098735548049342f

/* out[B,OC] = inp[B,C] @ weight[C,OC] + bias[OC] */
void dense_forward_ref(float *out, const float *inp, const float *weight, const float *bias, int B,
                       int C, int OC);
/* dinp[B,C] (may be NULL), dweight[C,OC], dbias[OC] from dout[B,OC] */
void dense_backward_ref(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, int B, int C, int OC);

/* out[n] = act(inp[n]) (NONE and SOFTMAX copy) */
void act_forward_ref(float *out, const float *inp, size_t n, NnAct act);
/* dinp[n] = dout[n] * act'(.), expressed through the forward output out[n]
 * (the activations up to NN_ACT_ELU) */
void act_backward_ref(float *dinp, const float *dout, const float *out, size_t n, NnAct act);
/* dinp[n] = dout[n] * act'(inp[n]), from the input (every activation) */
void act_backward_src_ref(float *dinp, const float *dout, const float *inp, size_t n, NnAct act);

/* logprob[B,K] = log_softmax(logits[B,K]) computed as x - max - log(sum(exp(x - max))) */
void log_softmax_forward_ref(float *logprob, const float *logits, int B, int K);

/* Mean cross-entropy over the batch from logprob[B,K]: targets are either
 * labels[B] (sparse, int32 in [0,K)) or onehot[B,K] (one of them NULL).
 * Returns -1 (and sets *bad to the row) when a label is out of range. */
double xent_forward(const float *logprob, const int32_t *labels, const float *onehot, int B, int K,
                    int *bad);
/* dlogits[B,K] = (softmax - target) / B */
void xent_backward(float *dlogits, const float *logprob, const int32_t *labels, const float *onehot,
                   int B, int K);
/* Number of rows whose argmax(scores) equals the label (argmax of onehot). */
int accuracy_count(const float *scores, const int32_t *labels, const float *onehot, int B, int K);

/* Convolution: out[B,OH,OW,OC] from inp[B,H,W,C], weight[KH,KW,C,OC], bias[OC],
 * stride S, padding top/left PT/PL (the bottom/right padding follows from OH/OW). */
void conv2d_forward_ref(float *out, const float *inp, const float *weight, const float *bias, int B,
                        int H, int W, int C, int OC, int KH, int KW, int S, int PT, int PL, int OH,
                        int OW);
void conv2d_backward_ref(float *dinp, float *dweight, float *dbias, const float *dout,
                         const float *inp, const float *weight, int B, int H, int W, int C, int OC,
                         int KH, int KW, int S, int PT, int PL, int OH, int OW);

/* Pooling over KHxKW windows, stride S, padding PT/PL; padded cells are
 * ignored (max) or excluded from the count (average), as in Keras. */
void maxpool_forward_ref(float *out, const float *inp, int B, int H, int W, int C, int KH, int KW,
                         int S, int PT, int PL, int OH, int OW);
void maxpool_backward_ref(float *dinp, const float *dout, const float *inp, int B, int H, int W,
                          int C, int KH, int KW, int S, int PT, int PL, int OH, int OW);
void avgpool_forward_ref(float *out, const float *inp, int B, int H, int W, int C, int KH, int KW,
                         int S, int PT, int PL, int OH, int OW);
void avgpool_backward_ref(float *dinp, const float *dout, int B, int H, int W, int C, int KH,
                          int KW, int S, int PT, int PL, int OH, int OW);

/* Inverted dropout: mask[n] is 0 or 1/(1-rate), out = inp * mask. The mask
 * is drawn from the counter-based generator (seed, counter): the same pair
 * always gives the same mask. */
void dropout_forward(float *out, float *mask, const float *inp, size_t n, float rate, uint64_t seed,
                     uint64_t counter);
void dropout_backward(float *dinp, const float *dout, const float *mask, size_t n);

/* Index of the largest of x[0..K) (the first, on ties). */
static inline int nn_argmax(const float *x, int K)
{
    int best = 0;
    for (int k = 1; k < K; k++)
        if (x[k] > x[best])
            best = k;
    return best;
}

/* splitmix64 finaliser: the hash under the counter-based generator (inline:
 * parameter initialisation calls it four times per value). */
#define NN_MIX64_ADD  0x9e3779b97f4a7c15ull
#define NN_MIX64_MUL1 0xbf58476d1ce4e5b9ull /* after the shift by 30 */
#define NN_MIX64_MUL2 0x94d049bb133111ebull /* after the shift by 27; then a shift by 31 */
static inline uint64_t nn_mix64(uint64_t x)
{
    x += NN_MIX64_ADD;
    x = (x ^ (x >> 30)) * NN_MIX64_MUL1;
    x = (x ^ (x >> 27)) * NN_MIX64_MUL2;
    return x ^ (x >> 31);
}
/* Uniform in [0,1) from (seed, counter). */
static inline double nn_uniform(uint64_t seed, uint64_t counter)
{
    return (double)(nn_mix64(seed ^ nn_mix64(counter)) >> 11) * 0x1.0p-53;
}

#endif /* NN_REF_H */
