/* nn_ref.c - naive reference kernels and the C-only kernels (see nn_ref.h). */
#include "nn/nn_ref.h"

#include <float.h>
#include <math.h>
#include <string.h>

void dense_forward_ref(float *out, const float *inp, const float *weight, const float *bias, int B,
                       int C, int OC)
{
    for (int b = 0; b < B; b++)
        for (int o = 0; o < OC; o++) {
            double acc = bias ? bias[o] : 0.0;
            for (int c = 0; c < C; c++)
                acc += (double)inp[(size_t)b * C + c] * weight[(size_t)c * OC + o];
            out[(size_t)b * OC + o] = (float)acc;
        }
}

void dense_backward_ref(float *dinp, float *dweight, float *dbias, const float *dout,
                        const float *inp, const float *weight, int B, int C, int OC)
{
    if (dinp)
        for (int b = 0; b < B; b++)
            for (int c = 0; c < C; c++) {
                double acc = 0.0;
                for (int o = 0; o < OC; o++)
                    acc += (double)dout[(size_t)b * OC + o] * weight[(size_t)c * OC + o];
                dinp[(size_t)b * C + c] = (float)acc;
            }
    for (int c = 0; c < C; c++)
        for (int o = 0; o < OC; o++) {
            double acc = 0.0;
            for (int b = 0; b < B; b++)
                acc += (double)inp[(size_t)b * C + c] * dout[(size_t)b * OC + o];
            dweight[(size_t)c * OC + o] = (float)acc;
        }
    for (int o = 0; o < OC; o++) {
        double acc = 0.0;
        for (int b = 0; b < B; b++)
            acc += dout[(size_t)b * OC + o];
        dbias[o] = (float)acc;
    }
}

static double ref_sigmoid(double x)
{
    return 1.0 / (1.0 + exp(-x));
}

/* act(x) in double (the references' precision) */
static double act_value(double x, NnAct act)
{
    switch (act) {
    case NN_ACT_RELU:
        return x > 0.0 ? x : 0.0;
    case NN_ACT_TANH:
        return tanh(x);
    case NN_ACT_SIGMOID:
        return ref_sigmoid(x);
    case NN_ACT_LEAKY_RELU:
        return x > 0.0 ? x : NN_LEAKY_RELU_SLOPE * x;
    case NN_ACT_ELU:
        return x > 0.0 ? x : expm1(x);
    case NN_ACT_SELU:
        return NN_SELU_SCALE * (x > 0.0 ? x : NN_SELU_ALPHA * expm1(x));
    case NN_ACT_GELU:
        return 0.5 * x * (1.0 + erf(x / sqrt(2.0)));
    case NN_ACT_SWISH:
        return x * ref_sigmoid(x);
    case NN_ACT_SOFTPLUS:
        return x > 0.0 ? x + log1p(exp(-x)) : log1p(exp(x));
    default:
        return x;
    }
}

/* act'(x) in double */
static double act_slope(double x, NnAct act)
{
    switch (act) {
    case NN_ACT_RELU:
        return x > 0.0 ? 1.0 : 0.0;
    case NN_ACT_TANH:
        return 1.0 - tanh(x) * tanh(x);
    case NN_ACT_SIGMOID:
        return ref_sigmoid(x) * (1.0 - ref_sigmoid(x));
    case NN_ACT_LEAKY_RELU:
        return x > 0.0 ? 1.0 : NN_LEAKY_RELU_SLOPE;
    case NN_ACT_ELU:
        return x > 0.0 ? 1.0 : exp(x);
    case NN_ACT_SELU:
        return NN_SELU_SCALE * (x > 0.0 ? 1.0 : NN_SELU_ALPHA * exp(x));
    case NN_ACT_GELU:
        return 0.5 * (1.0 + erf(x / sqrt(2.0))) + x * exp(-0.5 * x * x) / sqrt(2.0 * M_PI);
    case NN_ACT_SWISH:
        return ref_sigmoid(x) * (1.0 + x * (1.0 - ref_sigmoid(x)));
    case NN_ACT_SOFTPLUS:
        return ref_sigmoid(x);
    default:
        return 1.0;
    }
}

void act_forward_ref(float *out, const float *inp, size_t n, NnAct act)
{
    for (size_t i = 0; i < n; i++)
        out[i] = (float)act_value(inp[i], act);
}

void act_backward_ref(float *dinp, const float *dout, const float *out, size_t n, NnAct act)
{
    for (size_t i = 0; i < n; i++) {
        float y = out[i], g = dout[i];
        switch (act) {
        case NN_ACT_RELU:
            dinp[i] = y > 0.0f ? g : 0.0f;
            break;
        case NN_ACT_TANH:
            dinp[i] = g * (1.0f - y * y);
            break;
        case NN_ACT_SIGMOID:
            dinp[i] = g * y * (1.0f - y);
            break;
        case NN_ACT_LEAKY_RELU:
            dinp[i] = y > 0.0f ? g : NN_LEAKY_RELU_SLOPE * g;
            break;
        case NN_ACT_ELU:
            dinp[i] = y > 0.0f ? g : g * (y + 1.0f);
            break;
        default:
            dinp[i] = g;
            break;
        }
    }
}

void act_backward_src_ref(float *dinp, const float *dout, const float *inp, size_t n, NnAct act)
{
    for (size_t i = 0; i < n; i++)
        dinp[i] = (float)(dout[i] * act_slope(inp[i], act));
}

void log_softmax_forward_ref(float *logprob, const float *logits, int B, int K)
{
    for (int b = 0; b < B; b++) {
        const float *x = logits + (size_t)b * K;
        float *y = logprob + (size_t)b * K;
        float mx = -FLT_MAX;
        for (int k = 0; k < K; k++)
            mx = x[k] > mx ? x[k] : mx;
        double sum = 0.0;
        for (int k = 0; k < K; k++)
            sum += exp((double)x[k] - mx);
        float lse = (float)log(sum);
        for (int k = 0; k < K; k++)
            y[k] = x[k] - mx - lse;
    }
}

double xent_forward(const float *logprob, const int32_t *labels, const float *onehot, int B, int K,
                    int *bad)
{
    double total = 0.0;
    for (int b = 0; b < B; b++) {
        const float *lp = logprob + (size_t)b * K;
        if (labels) {
            int32_t y = labels[b];
            if (y < 0 || y >= K) {
                if (bad)
                    *bad = b;
                return -1.0;
            }
            total -= lp[y];
        } else {
            const float *t = onehot + (size_t)b * K;
            for (int k = 0; k < K; k++)
                total -= (double)t[k] * lp[k];
        }
    }
    return total / B;
}

void xent_backward(float *dlogits, const float *logprob, const int32_t *labels, const float *onehot,
                   int B, int K)
{
    float inv_b = 1.0f / (float)B;
    for (int b = 0; b < B; b++) {
        const float *lp = logprob + (size_t)b * K;
        float *d = dlogits + (size_t)b * K;
        for (int k = 0; k < K; k++) {
            float target = labels ? (labels[b] == k ? 1.0f : 0.0f) : onehot[(size_t)b * K + k];
            d[k] = (expf(lp[k]) - target) * inv_b;
        }
    }
}

int accuracy_count(const float *scores, const int32_t *labels, const float *onehot, int B, int K)
{
    int correct = 0;
    for (int b = 0; b < B; b++) {
        int want = labels ? labels[b] : nn_argmax(onehot + (size_t)b * K, K);
        correct += nn_argmax(scores + (size_t)b * K, K) == want;
    }
    return correct;
}

/* ---- convolution -------------------------------------------------------- */

#define AT4(p, i0, i1, i2, i3, D1, D2, D3)                                                         \
    (p)[(((size_t)(i0) * (D1) + (i1)) * (D2) + (i2)) * (D3) + (i3)]

void conv2d_forward_ref(float *out, const float *inp, const float *weight, const float *bias, int B,
                        int H, int W, int C, int OC, int KH, int KW, int S, int PT, int PL, int OH,
                        int OW)
{
    for (int b = 0; b < B; b++)
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++)
                for (int o = 0; o < OC; o++) {
                    double acc = bias ? bias[o] : 0.0;
                    for (int kh = 0; kh < KH; kh++)
                        for (int kw = 0; kw < KW; kw++) {
                            int h = oh * S - PT + kh, w = ow * S - PL + kw;
                            if (h < 0 || h >= H || w < 0 || w >= W)
                                continue;
                            for (int c = 0; c < C; c++)
                                acc += (double)AT4(inp, b, h, w, c, H, W, C) *
                                       AT4(weight, kh, kw, c, o, KW, C, OC);
                        }
                    AT4(out, b, oh, ow, o, OH, OW, OC) = (float)acc;
                }
}

void conv2d_backward_ref(float *dinp, float *dweight, float *dbias, const float *dout,
                         const float *inp, const float *weight, int B, int H, int W, int C, int OC,
                         int KH, int KW, int S, int PT, int PL, int OH, int OW)
{
    if (dinp)
        memset(dinp, 0, sizeof(float) * (size_t)B * H * W * C);
    memset(dweight, 0, sizeof(float) * (size_t)KH * KW * C * OC);
    memset(dbias, 0, sizeof(float) * (size_t)OC);
    for (int b = 0; b < B; b++)
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++)
                for (int o = 0; o < OC; o++) {
                    float g = AT4(dout, b, oh, ow, o, OH, OW, OC);
                    dbias[o] += g;
                    for (int kh = 0; kh < KH; kh++)
                        for (int kw = 0; kw < KW; kw++) {
                            int h = oh * S - PT + kh, w = ow * S - PL + kw;
                            if (h < 0 || h >= H || w < 0 || w >= W)
                                continue;
                            for (int c = 0; c < C; c++) {
                                AT4(dweight, kh, kw, c, o, KW, C, OC) +=
                                    g * AT4(inp, b, h, w, c, H, W, C);
                                if (dinp)
                                    AT4(dinp, b, h, w, c, H, W, C) +=
                                        g * AT4(weight, kh, kw, c, o, KW, C, OC);
                            }
                        }
                }
}

/* ---- pooling ------------------------------------------------------------ */

void maxpool_forward_ref(float *out, const float *inp, int B, int H, int W, int C, int KH, int KW,
                         int S, int PT, int PL, int OH, int OW)
{
    for (int b = 0; b < B; b++)
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++)
                for (int c = 0; c < C; c++) {
                    float m = -FLT_MAX;
                    for (int kh = 0; kh < KH; kh++)
                        for (int kw = 0; kw < KW; kw++) {
                            int h = oh * S - PT + kh, w = ow * S - PL + kw;
                            if (h >= 0 && h < H && w >= 0 && w < W) {
                                float v = AT4(inp, b, h, w, c, H, W, C);
                                m = v > m ? v : m;
                            }
                        }
                    AT4(out, b, oh, ow, c, OH, OW, C) = m;
                }
}

void maxpool_backward_ref(float *dinp, const float *dout, const float *inp, int B, int H, int W,
                          int C, int KH, int KW, int S, int PT, int PL, int OH, int OW)
{
    memset(dinp, 0, sizeof(float) * (size_t)B * H * W * C);
    for (int b = 0; b < B; b++)
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++)
                for (int c = 0; c < C; c++) {
                    /* the gradient goes to the first maximum in window order */
                    int bh = -1, bw = -1;
                    float m = -FLT_MAX;
                    for (int kh = 0; kh < KH; kh++)
                        for (int kw = 0; kw < KW; kw++) {
                            int h = oh * S - PT + kh, w = ow * S - PL + kw;
                            if (h >= 0 && h < H && w >= 0 && w < W &&
                                AT4(inp, b, h, w, c, H, W, C) > m) {
                                m = AT4(inp, b, h, w, c, H, W, C);
                                bh = h;
                                bw = w;
                            }
                        }
                    if (bh >= 0)
                        AT4(dinp, b, bh, bw, c, H, W, C) += AT4(dout, b, oh, ow, c, OH, OW, C);
                }
}

static int window_count(int oh, int ow, int H, int W, int KH, int KW, int S, int PT, int PL)
{
    int n = 0;
    for (int kh = 0; kh < KH; kh++)
        for (int kw = 0; kw < KW; kw++) {
            int h = oh * S - PT + kh, w = ow * S - PL + kw;
            n += h >= 0 && h < H && w >= 0 && w < W;
        }
    return n;
}

void avgpool_forward_ref(float *out, const float *inp, int B, int H, int W, int C, int KH, int KW,
                         int S, int PT, int PL, int OH, int OW)
{
    for (int b = 0; b < B; b++)
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++) {
                int n = window_count(oh, ow, H, W, KH, KW, S, PT, PL);
                for (int c = 0; c < C; c++) {
                    double acc = 0.0;
                    for (int kh = 0; kh < KH; kh++)
                        for (int kw = 0; kw < KW; kw++) {
                            int h = oh * S - PT + kh, w = ow * S - PL + kw;
                            if (h >= 0 && h < H && w >= 0 && w < W)
                                acc += AT4(inp, b, h, w, c, H, W, C);
                        }
                    AT4(out, b, oh, ow, c, OH, OW, C) = (float)(acc / n);
                }
            }
}

void avgpool_backward_ref(float *dinp, const float *dout, int B, int H, int W, int C, int KH,
                          int KW, int S, int PT, int PL, int OH, int OW)
{
    memset(dinp, 0, sizeof(float) * (size_t)B * H * W * C);
    for (int b = 0; b < B; b++)
        for (int oh = 0; oh < OH; oh++)
            for (int ow = 0; ow < OW; ow++) {
                int n = window_count(oh, ow, H, W, KH, KW, S, PT, PL);
                for (int kh = 0; kh < KH; kh++)
                    for (int kw = 0; kw < KW; kw++) {
                        int h = oh * S - PT + kh, w = ow * S - PL + kw;
                        if (h < 0 || h >= H || w < 0 || w >= W)
                            continue;
                        for (int c = 0; c < C; c++)
                            AT4(dinp, b, h, w, c, H, W, C) +=
                                AT4(dout, b, oh, ow, c, OH, OW, C) / n;
                    }
            }
}

/* ---- dropout ------------------------------------------------------------ */

/* u >= rate for u = (h >> 11) * 2^-53 (nn_uniform) is (h >> 11) >= ceil(rate * 2^53): the
 * scaling by a power of two is exact, so the integer test keeps exactly the same elements and
 * skips the conversion to double. */
static void dropout_range(float *out, float *mask, const float *inp, size_t i0, size_t i1,
                          float keep, uint64_t thresh, uint64_t seed, uint64_t counter)
{
    for (size_t i = i0; i < i1; i++) {
        mask[i] = (nn_mix64(seed ^ nn_mix64(counter + i)) >> 11) >= thresh ? keep : 0.0f;
        out[i] = inp[i] * mask[i];
    }
}

#if defined(__x86_64__) && defined(__GNUC__) && (__GNUC__ >= 10 || defined(__clang__))
#include <immintrin.h>
#define HAVE_DROPOUT_AVX512 1
#define DROPOUT_AVX512      __attribute__((target("avx512f,avx512dq,avx512vl")))

DROPOUT_AVX512 static inline __m512i mix64_x8(__m512i x)
{
    x = _mm512_add_epi64(x, _mm512_set1_epi64((long long)NN_MIX64_ADD));
    x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 30));
    x = _mm512_mullo_epi64(x, _mm512_set1_epi64((long long)NN_MIX64_MUL1));
    x = _mm512_xor_si512(x, _mm512_srli_epi64(x, 27));
    x = _mm512_mullo_epi64(x, _mm512_set1_epi64((long long)NN_MIX64_MUL2));
    return _mm512_xor_si512(x, _mm512_srli_epi64(x, 31));
}

/* dropout_range eight counters at a time (AVX-512DQ's 64-bit multiply): the same masks. */
DROPOUT_AVX512 static void dropout_range_avx512(float *out, float *mask, const float *inp,
                                                size_t i0, size_t i1, float keep, uint64_t thresh,
                                                uint64_t seed, uint64_t counter)
{
    const __m512i vseed = _mm512_set1_epi64((long long)seed);
    const __m512i vthresh = _mm512_set1_epi64((long long)thresh), eight = _mm512_set1_epi64(8);
    const __m256 vkeep = _mm256_set1_ps(keep);
    __m512i ctr = _mm512_add_epi64(_mm512_set1_epi64((long long)(counter + i0)),
                                   _mm512_setr_epi64(0, 1, 2, 3, 4, 5, 6, 7));
    size_t i = i0;
    for (; i + 8 <= i1; i += 8) {
        __m512i h = mix64_x8(_mm512_xor_si512(vseed, mix64_x8(ctr)));
        __mmask8 kept = _mm512_cmpge_epu64_mask(_mm512_srli_epi64(h, 11), vthresh);
        __m256 mk = _mm256_maskz_mov_ps(kept, vkeep);
        _mm256_storeu_ps(mask + i, mk);
        _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_loadu_ps(inp + i), mk));
        ctr = _mm512_add_epi64(ctr, eight);
    }
    dropout_range(out, mask, inp, i, i1, keep, thresh, seed, counter);
}
#endif

#define DROPOUT_BLOCK 16384

void dropout_forward(float *out, float *mask, const float *inp, size_t n, float rate, uint64_t seed,
                     uint64_t counter)
{
    const float keep = 1.0f / (1.0f - rate);
    const uint64_t thresh = (uint64_t)ceil((double)rate * 0x1.0p53);
    int wide = 0;
#ifdef HAVE_DROPOUT_AVX512
    wide = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl");
#endif
    const size_t blocks = (n + DROPOUT_BLOCK - 1) / DROPOUT_BLOCK;
#pragma omp parallel for schedule(static) if (n > 4 * DROPOUT_BLOCK)
    for (size_t b = 0; b < blocks; b++) {
        size_t i0 = b * DROPOUT_BLOCK, i1 = i0 + DROPOUT_BLOCK < n ? i0 + DROPOUT_BLOCK : n;
#ifdef HAVE_DROPOUT_AVX512
        if (wide) {
            dropout_range_avx512(out, mask, inp, i0, i1, keep, thresh, seed, counter);
            continue;
        }
#endif
        dropout_range(out, mask, inp, i0, i1, keep, thresh, seed, counter);
    }
    (void)wide;
}

void dropout_backward(float *dinp, const float *dout, const float *mask, size_t n)
{
    for (size_t i = 0; i < n; i++)
        dinp[i] = dout[i] * mask[i];
}
