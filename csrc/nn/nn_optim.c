/*
 * nn_optim.c - optimizer updates over a flat float range (see nn_optim.h).
 * Each rule is one OpenMP loop over the range; the arithmetic is float, in
 * the order torch.optim's single-tensor path uses, so results match it to
 * rounding.
 */
#include "nn/nn_optim.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

struct Optimizer {
    OptimConfig cfg;
    size_t n;     /* parameters */
    int nslots;   /* state arrays of n floats */
    int64_t step; /* steps taken */
    float *state; /* [nslots, n] */
    /* tensors of the range for clip_tensor_norm: ends[k] is one past tensor
     * k's last float; scales[k] its clipping factor of the current step */
    int ntensors;
    size_t *ends;
    float *scales;
};

void optim_config_default(OptimConfig *cfg, OptimKind kind)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->kind = kind;
    cfg->lr = kind == OPTIM_ADADELTA
                  ? 1.0f
                  : (kind == OPTIM_RMSPROP || kind == OPTIM_ADAGRAD ? 0.01f : 1e-3f);
    cfg->beta1 = 0.9f;
    cfg->beta2 = 0.999f;
    cfg->eps = kind == OPTIM_ADADELTA ? 1e-6f : (kind == OPTIM_ADAGRAD ? 1e-10f : 1e-8f);
    cfg->rho = kind == OPTIM_ADADELTA ? 0.9f : 0.99f;
    cfg->weight_decay = kind == OPTIM_ADAMW ? 0.01f : 0.0f;
    cfg->gamma = 0.1f;
    cfg->step_size = 1;
    cfg->total_steps = 1;
    cfg->npieces = 1;
    cfg->values[0] = cfg->lr;
}

static int slots_for(const OptimConfig *c)
{
    switch (c->kind) {
    case OPTIM_SGD:
        return c->momentum != 0.0f;
    case OPTIM_ADAGRAD:
        return 1;
    case OPTIM_ADAM:
    case OPTIM_ADAMW:
    case OPTIM_ADADELTA:
        return 2;
    case OPTIM_RMSPROP:
        return 1 + (c->centered != 0) + (c->momentum != 0.0f);
    }
    return -1;
}

static int check_pieces(const OptimConfig *c, SgError *err)
{
    if (c->npieces < 1 || c->npieces > OPTIM_MAX_PIECES)
        return sg_fail(err, SG_EINVAL, "optimizer: a piecewise schedule has 1..%d values, not %d",
                       OPTIM_MAX_PIECES, c->npieces);
    for (int i = 0; i < c->npieces; i++)
        if (!(c->values[i] >= 0.0f && isfinite(c->values[i])))
            return sg_fail(
                err, SG_EINVAL,
                "optimizer: piecewise schedule value %d is %g; rates are finite and >= 0", i,
                c->values[i]);
    for (int i = 1; i < c->npieces - 1; i++)
        if (c->boundaries[i] <= c->boundaries[i - 1])
            return sg_fail(err, SG_EINVAL,
                           "optimizer: piecewise schedule boundaries must increase, but %lld "
                           "follows %lld",
                           (long long)c->boundaries[i], (long long)c->boundaries[i - 1]);
    return 0;
}

static int check_config(const OptimConfig *c, SgError *err)
{
    if (slots_for(c) < 0)
        return sg_fail(err, SG_EINVAL, "optimizer: unknown kind %d", (int)c->kind);
    if (!(c->lr >= 0.0f) || !isfinite(c->lr))
        return sg_fail(err, SG_EINVAL, "optimizer: learning rate must be >= 0, not %g", c->lr);
    if (!(c->momentum >= 0.0f && c->momentum < 1.0f))
        return sg_fail(err, SG_EINVAL, "optimizer: momentum must be in [0, 1), not %g",
                       c->momentum);
    if (c->nesterov && (c->kind != OPTIM_SGD || c->momentum <= 0.0f))
        return sg_fail(err, SG_EINVAL, "optimizer: nesterov needs SGD with momentum > 0");
    if (!(c->weight_decay >= 0.0f))
        return sg_fail(err, SG_EINVAL, "optimizer: weight_decay must be >= 0, not %g",
                       c->weight_decay);
    if ((c->kind == OPTIM_ADAM || c->kind == OPTIM_ADAMW) &&
        !(c->beta1 >= 0.0f && c->beta1 < 1.0f && c->beta2 >= 0.0f && c->beta2 < 1.0f))
        return sg_fail(err, SG_EINVAL, "optimizer: betas must be in [0, 1), not (%g, %g)", c->beta1,
                       c->beta2);
    if ((c->kind == OPTIM_RMSPROP || c->kind == OPTIM_ADADELTA) &&
        !(c->rho >= 0.0f && c->rho <= 1.0f))
        return sg_fail(err, SG_EINVAL, "optimizer: rho must be in [0, 1], not %g", c->rho);
    if (!(c->eps >= 0.0f))
        return sg_fail(err, SG_EINVAL, "optimizer: eps must be >= 0, not %g", c->eps);
    if (c->kind == OPTIM_ADAGRAD && !(c->init_accum >= 0.0f && isfinite(c->init_accum)))
        return sg_fail(err, SG_EINVAL,
                       "optimizer: initial_accumulator_value must be finite and >= 0, not %g",
                       c->init_accum);
    if ((c->schedule == LR_STEP || c->schedule == LR_EXPONENTIAL) && c->step_size <= 0)
        return sg_fail(err, SG_EINVAL, "optimizer: step schedule needs step_size > 0, not %lld",
                       (long long)c->step_size);
    if ((c->schedule == LR_STEP || c->schedule == LR_EXPONENTIAL) &&
        !(c->gamma >= 0.0f && isfinite(c->gamma)))
        return sg_fail(err, SG_EINVAL,
                       "optimizer: decay rate (gamma) must be finite and >= 0, not %g", c->gamma);
    if (c->schedule == LR_PIECEWISE) {
        int rc = check_pieces(c, err);
        if (rc < 0)
            return rc;
    }
    if (c->schedule == LR_COSINE && c->total_steps <= 0)
        return sg_fail(err, SG_EINVAL, "optimizer: cosine schedule needs total_steps > 0, not %lld",
                       (long long)c->total_steps);
    if ((int)c->schedule < 0 || c->schedule > LR_PIECEWISE)
        return sg_fail(err, SG_EINVAL, "optimizer: unknown schedule %d", (int)c->schedule);
    if ((int)c->warmup < 0 || c->warmup > WARMUP_RAMP ||
        (c->warmup == WARMUP_RAMP && !(c->warmup_from >= 0.0f && isfinite(c->warmup_from))))
        return sg_fail(err, SG_EINVAL, "optimizer: unknown warm-up %d or its first rate %g",
                       (int)c->warmup, c->warmup_from);
    if (c->warmup_steps < 0 || !(c->clip_norm >= 0.0f) || !(c->clip_tensor_norm >= 0.0f) ||
        !(c->clip_value >= 0.0f))
        return sg_fail(err, SG_EINVAL,
                       "optimizer: warmup_steps, clip_norm, clip_tensor_norm and clip_value must "
                       "be >= 0");
    if (c->clip_norm > 0.0f && c->clip_tensor_norm > 0.0f)
        return sg_fail(err, SG_EINVAL,
                       "optimizer: clip by the global norm (%g) or by each tensor's norm (%g), not "
                       "both",
                       c->clip_norm, c->clip_tensor_norm);
    return 0;
}

int optim_create(Optimizer **out, const OptimConfig *cfg, size_t n, SgError *err)
{
    *out = NULL;
    int rc = check_config(cfg, err);
    if (rc < 0)
        return rc;
    Optimizer *o = calloc(1, sizeof *o);
    if (o == NULL)
        return sg_fail(err, SG_ENOMEM, "optimizer: out of memory");
    o->cfg = *cfg;
    o->n = n;
    o->nslots = slots_for(cfg);
    if (o->nslots > 0 && n > 0) {
        /* on a cache line: an Embedding row of 16 floats is one line of the
         * first slot (the lazy update's reads are scattered, line by line) */
        const size_t bytes = ((size_t)o->nslots * n * sizeof(float) + 63) / 64 * 64;
        o->state = aligned_alloc(64, bytes);
        if (o->state != NULL)
            memset(o->state, 0, bytes);
        if (o->state == NULL) {
            int nslots = o->nslots;
            free(o);
            return sg_fail(err, SG_ENOMEM, "optimizer: cannot allocate %d x %zu floats of state",
                           nslots, n);
        }
    }
    if (cfg->kind == OPTIM_ADAGRAD)
        for (size_t i = 0; i < n; i++)
            o->state[i] = cfg->init_accum;
    if ((rc = optim_set_tensors(o, &n, 1, err)) < 0) {
        optim_free(o);
        return rc;
    }
    *out = o;
    return 0;
}

void optim_free(Optimizer *o)
{
    if (o == NULL)
        return;
    free(o->state);
    free(o->ends);
    free(o->scales);
    free(o);
}

int optim_set_tensors(Optimizer *o, const size_t *sizes, int count, SgError *err)
{
    size_t total = 0;
    for (int k = 0; k < count; k++)
        total += sizes[k];
    if (count < 1 || total != o->n)
        return sg_fail(err, SG_EINVAL,
                       "optimizer: %d tensors of %zu floats in all, but the optimizer holds %zu",
                       count, total, o->n);
    size_t *ends = malloc((size_t)count * sizeof *ends);
    float *scales = malloc((size_t)count * sizeof *scales);
    if (ends == NULL || scales == NULL) {
        free(ends);
        free(scales);
        return sg_fail(err, SG_ENOMEM, "optimizer: cannot allocate a table of %d tensors", count);
    }
    size_t end = 0;
    for (int k = 0; k < count; k++)
        ends[k] = end += sizes[k];
    free(o->ends);
    free(o->scales);
    o->ends = ends;
    o->scales = scales;
    o->ntensors = count;
    return 0;
}

/* The schedule alone at t (no warm-up). */
static double schedule_at(const OptimConfig *c, int64_t t)
{
    double lr = c->lr;
    switch (c->schedule) {
    case LR_CONSTANT:
        break;
    case LR_STEP:
        lr *= pow(c->gamma, (double)(t / c->step_size));
        break;
    case LR_EXPONENTIAL:
        lr *= pow(c->gamma, (double)t / (double)c->step_size);
        break;
    case LR_COSINE: {
        double tt = (double)(t < c->total_steps ? t : c->total_steps);
        lr =
            c->lr_min + (c->lr - c->lr_min) * (1.0 + cos(M_PI * tt / (double)c->total_steps)) / 2.0;
        break;
    }
    case LR_PIECEWISE: {
        int i = 0;
        while (i < c->npieces - 1 && t > c->boundaries[i])
            i++;
        lr = c->values[i];
        break;
    }
    }
    return lr;
}

static double lr_at(const OptimConfig *c, int64_t t)
{
    if (c->warmup_steps > 0 && c->warmup == WARMUP_RAMP)
        return t < c->warmup_steps ? c->warmup_from + (c->lr - (double)c->warmup_from) * (double)t /
                                                          (double)c->warmup_steps
                                   : schedule_at(c, t - c->warmup_steps);
    double lr = schedule_at(c, t);
    if (c->warmup_steps > 0 && t + 1 < c->warmup_steps)
        lr *= (double)(t + 1) / (double)c->warmup_steps;
    return lr;
}

float optim_current_lr(const Optimizer *o)
{
    return (float)lr_at(&o->cfg, o->step);
}
int64_t optim_get_step(const Optimizer *o)
{
    return o->step;
}
int optim_set_base_lr(Optimizer *o, float lr, SgError *err)
{
    if (!isfinite(lr) || lr < 0.0f)
        return sg_fail(err, SG_EINVAL, "learning rate must be finite and >= 0, got %g", (double)lr);
    if (o->cfg.schedule == LR_PIECEWISE)
        return sg_fail(err, SG_ESTATE,
                       "the learning rate follows a piecewise constant schedule of absolute "
                       "values; it has no base rate to set");
    o->cfg.lr = lr;
    return SG_OK;
}

const OptimConfig *optim_config(const Optimizer *o)
{
    return &o->cfg;
}
size_t optim_state_size(const Optimizer *o)
{
    return (size_t)o->nslots * o->n;
}
float *optim_state(Optimizer *o)
{
    return o->state;
}

int optim_set_state(Optimizer *o, int64_t step, const float *state, size_t len, SgError *err)
{
    if (len != optim_state_size(o))
        return sg_fail(err, SG_EINVAL, "optimizer: state has %zu floats, this optimizer needs %zu",
                       len, optim_state_size(o));
    if (step < 0)
        return sg_fail(err, SG_EINVAL, "optimizer: negative step %lld", (long long)step);
    if (len)
        memcpy(o->state, state, len * sizeof(float));
    o->step = step;
    return 0;
}

double optim_global_norm(const float *g, size_t n)
{
    double s = 0.0;
#pragma omp parallel for reduction(+ : s) schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; i++)
        s += (double)g[i] * g[i];
    return sqrt(s);
}

/* Everything one update needs, computed once per step. */
typedef struct StepArgs {
    OptimKind kind;
    float lr, scale, clipv, wd, mom, b1, b2, eps, rho, step_size, bc2_sqrt;
    int nesterov, centered, decoupled;
    /* per-tensor clipping: scale times scales[k] on [ends[k-1], ends[k]); NULL = off */
    const size_t *ends;
    const float *scales;
    int ntensors;
    /* lazy Adam's (SparseAdam's) step size from these, in double */
    double lr_d, bc1_d, bc2_d;
} StepArgs;

/* The hot loops, compiled for AVX-512, AVX2 and the baseline and picked at
 * load time; no contraction into fused multiply-adds (which AVX-512 and
 * AVX2 offer), so every clone rounds as the baseline does. (They vectorise
 * because the build passes -fno-math-errno: sqrtf setting errno kept them
 * scalar.) */
#define OPTIM_CLONES                                                                               \
    __attribute__((target_clones("avx512f", "avx2", "default"), optimize("fp-contract=off")))

/* (the clones' options, so that it inlines into them) */
__attribute__((optimize("fp-contract=off"))) static inline float
grad_at(const float *restrict g, ptrdiff_t i, float scale, float clipv)
{
    float v = g[i] * scale;
    if (clipv > 0.0f)
        v = v > clipv ? clipv : (v < -clipv ? -clipv : v);
    return v;
}

/* One update over a contiguous range; restrict pointers and loop-invariant
 * locals let the compiler vectorise each loop. */
OPTIM_CLONES static void step_range(const StepArgs *a, float *restrict p, const float *restrict g,
                                    float *restrict s0, float *restrict s1, float *restrict s2,
                                    ptrdiff_t n)
{
    const float lr = a->lr, scale = a->scale, clipv = a->clipv, wd = a->wd, mom = a->mom;
    switch (a->kind) {
    case OPTIM_SGD:
        if (mom == 0.0f && wd == 0.0f && clipv == 0.0f) {
            const float k = lr * scale;
#pragma omp simd
            for (ptrdiff_t i = 0; i < n; i++)
                p[i] -= k * g[i];
        } else if (mom == 0.0f) {
#pragma omp simd
            for (ptrdiff_t i = 0; i < n; i++)
                p[i] -= lr * (grad_at(g, i, scale, clipv) + wd * p[i]);
        } else {
            const int nest = a->nesterov;
#pragma omp simd
            for (ptrdiff_t i = 0; i < n; i++) {
                float gi = grad_at(g, i, scale, clipv) + wd * p[i];
                s0[i] = mom * s0[i] + gi;
                p[i] -= lr * (nest ? gi + mom * s0[i] : s0[i]);
            }
        }
        break;
    case OPTIM_ADAM:
    case OPTIM_ADAMW: {
        const float b1 = a->b1, b2 = a->b2, eps = a->eps, ss = a->step_size, bc2s = a->bc2_sqrt;
        const float decay = a->decoupled ? 1.0f - lr * wd : 1.0f, l2 = a->decoupled ? 0.0f : wd;
#pragma omp simd
        for (ptrdiff_t i = 0; i < n; i++) {
            p[i] *= decay;
            float gi = grad_at(g, i, scale, clipv) + l2 * p[i];
            s0[i] += (gi - s0[i]) * (1.0f - b1);
            s1[i] = b2 * s1[i] + (1.0f - b2) * gi * gi;
            float denom = sqrtf(s1[i]) / bc2s + eps;
            p[i] += -ss * (s0[i] / denom);
        }
        break;
    }
    case OPTIM_RMSPROP: {
        const float al = a->rho, eps = a->eps;
        float *restrict gavg = a->centered ? s1 : NULL;
        float *restrict buf = mom != 0.0f ? (a->centered ? s2 : s1) : NULL;
        for (ptrdiff_t i = 0; i < n; i++) {
            float gi = grad_at(g, i, scale, clipv) + wd * p[i];
            s0[i] = al * s0[i] + (1.0f - al) * gi * gi;
            float avg;
            if (gavg) {
                gavg[i] += (gi - gavg[i]) * (1.0f - al);
                avg = sqrtf(s0[i] - gavg[i] * gavg[i]) + eps;
            } else {
                avg = sqrtf(s0[i]) + eps;
            }
            if (buf) {
                buf[i] = mom * buf[i] + gi / avg;
                p[i] -= lr * buf[i];
            } else {
                p[i] -= lr * (gi / avg);
            }
        }
        break;
    }
    case OPTIM_ADAGRAD: {
        const float eps = a->eps;
#pragma omp simd
        for (ptrdiff_t i = 0; i < n; i++) {
            float gi = grad_at(g, i, scale, clipv) + wd * p[i];
            s0[i] += gi * gi;
            p[i] -= lr * gi / sqrtf(s0[i] + eps);
        }
        break;
    }
    case OPTIM_ADADELTA: {
        const float rho = a->rho, eps = a->eps;
#pragma omp simd
        for (ptrdiff_t i = 0; i < n; i++) {
            float gi = grad_at(g, i, scale, clipv) + wd * p[i];
            s0[i] = rho * s0[i] + (1.0f - rho) * gi * gi;
            float delta = sqrtf(s1[i] + eps) / sqrtf(s0[i] + eps) * gi;
            s1[i] = rho * s1[i] + (1.0f - rho) * delta * delta;
            p[i] -= lr * delta;
        }
        break;
    }
    }
}

/* step_range over [lo, hi) of the whole range, each tensor's stretch with its
 * own clipping factor when per-tensor clipping is on. */
static void step_span(const StepArgs *a, float *p, const float *g, float *s0, float *s1, float *s2,
                      size_t lo, size_t hi)
{
#define AT(x) ((x) ? (x) + pos : NULL)
    if (a->scales == NULL) {
        size_t pos = lo;
        step_range(a, p + pos, g + pos, AT(s0), AT(s1), AT(s2), (ptrdiff_t)(hi - lo));
        return;
    }
    StepArgs t = *a;
    int k = 0;
    while (k < a->ntensors - 1 && a->ends[k] <= lo)
        k++;
    for (size_t pos = lo; pos < hi; k++) {
        size_t end = a->ends[k] < hi ? a->ends[k] : hi;
        t.scale = a->scale * a->scales[k];
        step_range(&t, p + pos, g + pos, AT(s0), AT(s1), AT(s2), (ptrdiff_t)(end - pos));
        pos = end;
    }
#undef AT
}

int optim_take_plain_sgd_step(Optimizer *o, size_t n, float *lr, SgError *err)
{
    if (n != o->n)
        return sg_fail(err, SG_EINVAL, "optimizer: step over %zu floats, created for %zu", n, o->n);
    const OptimConfig *c = &o->cfg;
    if (c->kind != OPTIM_SGD || c->momentum != 0.0f || c->weight_decay != 0.0f ||
        c->clip_norm > 0.0f || c->clip_tensor_norm > 0.0f || c->clip_value > 0.0f)
        return 0;
    *lr = (float)lr_at(c, o->step);
    o->step++;
    return 1;
}

#if defined(__x86_64__) && defined(__GNUC__) && (__GNUC__ >= 10 || defined(__clang__))
#include <immintrin.h>
#define HAVE_CVT_BF16 1
__attribute__((target("avx512f,avx512bf16,avx512vl,avx512bw"))) static void
cvt_bf16_avx512(const float *src, uint16_t *dst, size_t n)
{
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        __m512bh v = _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
        _mm512_storeu_si512((void *)(dst + i), (__m512i)v);
    }
    for (; i < n; i += 16) {
        __mmask16 k = n - i >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (n - i)) - 1u);
        __m256bh v = _mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(k, src + i));
        _mm256_mask_storeu_epi16(dst + i, k, (__m256i)v);
    }
}
#endif

#ifdef HAVE_CVT_BF16
/* The bf16 copy of rows [r0, r1) (r0 even; r1 even or c's last row) of c:
 * per pair of rows and 16 columns, one conversion of 32 values, interleaved,
 * one 64-byte store. An odd last row pairs with zeros, the padding row the
 * reorder writes. */
/* With g (plain SGD, k = lr * scale): first p -= k * g on those rows, as
 * step_range computes it (a product, then a difference: no fused
 * multiply-add), in the same pass. */
__attribute__((target("avx512f,avx512bf16,avx512vl,avx512bw"),
               optimize("fp-contract=off"))) static void
copy_rows_avx512(float *params, const float *grads, float kk, const OptimBf16Copy *c, int r0,
                 int r1)
{
    const __m512 k16 = _mm512_set1_ps(kk);
    const __m512i pairs =
        _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8, 23, 7, 22, 6,
                         21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    float *p = params + c->off;
    const float *g = grads ? grads + c->off : NULL;
    const size_t cols = (size_t)c->cols, ablk = (size_t)c->ablk;
    for (int r = r0; r < r1; r += 2) {
        float *a = p + (size_t)r * cols, *b = a + cols;
        const int lone = r + 1 == c->rows; /* b is past the tensor: zeros */
        uint16_t *row = c->dst + (size_t)(r / 16) * c->stride_b + (size_t)(r % 16 / 2) * 2 * ablk;
        for (size_t j = 0; j < cols; j += 16) {
            /* the last columns of a width that is no multiple of 16 fill the
             * padding of their block with zeros, as the reorder does */
            __mmask16 k = cols - j >= 16 ? (__mmask16)0xffff : (__mmask16)((1u << (cols - j)) - 1u);
            const __mmask16 kb = lone ? 0 : k;
            __m512 va = _mm512_maskz_loadu_ps(k, a + j), vb = _mm512_maskz_loadu_ps(kb, b + j);
            if (g) {
                const float *ga = g + (size_t)r * cols, *gb = ga + cols;
                va = _mm512_sub_ps(va, _mm512_mul_ps(k16, _mm512_maskz_loadu_ps(k, ga + j)));
                vb = _mm512_sub_ps(vb, _mm512_mul_ps(k16, _mm512_maskz_loadu_ps(kb, gb + j)));
                _mm512_mask_storeu_ps(a + j, k, va);
                _mm512_mask_storeu_ps(b + j, kb, vb);
            }
            __m512bh v = _mm512_cvtne2ps_pbh(vb, va);
            __m512i w = _mm512_permutexvar_epi16(pairs, (__m512i)v);
            _mm512_storeu_si512((void *)(row + (j / ablk) * c->stride_a + (j % ablk) * 2), w);
        }
    }
}
#endif

static uint16_t to_bf16(float f)
{
    union {
        float f;
        uint32_t u;
    } v = {f};
    if ((v.u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((v.u >> 16) | 0x40u);
    return (uint16_t)((v.u + 0x7fffu + ((v.u >> 16) & 1u)) >> 16);
}

void optim_f32_to_bf16(const float *src, uint16_t *dst, size_t n)
{
#ifdef HAVE_CVT_BF16
    static int native = -1;
    if (native < 0)
        native = __builtin_cpu_supports("avx512bf16") != 0;
    if (native) {
        cvt_bf16_avx512(src, dst, n);
        return;
    }
#endif
    for (size_t i = 0; i < n; i++)
        dst[i] = to_bf16(src[i]);
}

int optim_bf16_copy_supported(void)
{
#ifdef HAVE_CVT_BF16
    return __builtin_cpu_supports("avx512bf16") != 0;
#else
    return 0;
#endif
}

/* One thread's update of [lo, hi) with the copies: the plain stretches in one
 * step_range, each copy's rows a few pairs at a time, then their bf16 copy. */
#define COPY_BLOCK 4096
static void step_copy(const StepArgs *a, float *p, const float *g, float *s0, float *s1, float *s2,
                      size_t lo, size_t hi, const OptimBf16Copy *c, int nc)
{
#define RANGE(from, to) step_span(a, p, g, s0, s1, s2, (from), (to))
    /* plain SGD: the update of the copied rows happens in the copy's own pass */
    const int plain = a->kind == OPTIM_SGD && a->mom == 0.0f && a->wd == 0.0f && a->clipv == 0.0f &&
                      a->scales == NULL;
    size_t pos = lo;
    for (int k = 0; k < nc; k++) {
        size_t end = c[k].off + (size_t)c[k].rows * c[k].cols;
        RANGE(pos, c[k].off);
        int step = COPY_BLOCK / (2 * c[k].cols) * 2;
        step = step > 2 ? step : 2;
        for (int r = 0; r < c[k].rows; r += step) {
            int e = r + step < c[k].rows ? r + step : c[k].rows;
#ifdef HAVE_CVT_BF16
            if (plain) {
                copy_rows_avx512(p, g, a->lr * a->scale, &c[k], r, e);
                continue;
            }
#endif
            RANGE(c[k].off + (size_t)r * c[k].cols, c[k].off + (size_t)e * c[k].cols);
#ifdef HAVE_CVT_BF16
            copy_rows_avx512(p, NULL, 0.0f, &c[k], r, e);
#endif
        }
        pos = end;
    }
    RANGE(pos, hi);
#undef RANGE
}

int optim_step(Optimizer *o, float *params, const float *grads, size_t n, SgError *err)
{
    return optim_step_rows(o, params, grads, n, NULL, 0, NULL, 0, err);
}

int optim_step_bf16(Optimizer *o, float *params, const float *grads, size_t n,
                    const OptimBf16Copy *copies, int ncopies, SgError *err)
{
    return optim_step_rows(o, params, grads, n, NULL, 0, copies, ncopies, err);
}

int optim_sparse_rows(const Optimizer *o)
{
    const OptimConfig *c = &o->cfg;
    return (c->kind == OPTIM_SGD || c->kind == OPTIM_ADAGRAD || c->kind == OPTIM_ADAM) &&
           c->weight_decay == 0.0f;
}

static int check_copies(const OptimBf16Copy *copies, int ncopies, size_t n, SgError *err)
{
    for (int k = 0; k < ncopies; k++) {
        const OptimBf16Copy *c = &copies[k];
        size_t end = c->off + (size_t)c->rows * c->cols;
        if (!optim_bf16_copy_supported() || end > n || c->rows <= 0 || c->cols <= 0 ||
            c->ablk <= 0 || c->ablk % 16 || (k > 0 && c->off < copies[k - 1].off))
            return sg_fail(err, SG_EINVAL,
                           "optimizer: bf16 copy %d ([%d, %d] from %zu, blocks of %d) does not "
                           "fit the %zu parameters or this CPU",
                           k, c->rows, c->cols, c->off, c->ablk, n);
    }
    return 0;
}

/* Tables in order, inside the range, clear of the copies, their ids sorted,
 * unique and inside the table. */
static int check_tables(const OptimRows *t, int nt, const OptimBf16Copy *copies, int ncopies,
                        size_t n, SgError *err)
{
    for (int k = 0; k < nt; k++) {
        const size_t end = t[k].off + t[k].rows * t[k].dim;
        if (t[k].dim == 0 || end > n || end < t[k].off ||
            (k > 0 && t[k].off < t[k - 1].off + t[k - 1].rows * t[k - 1].dim))
            return sg_fail(err, SG_EINVAL,
                           "optimizer: table %d ([%zu, %zu] from %zu) is outside the %zu "
                           "parameters or overlaps the table before",
                           k, t[k].rows, t[k].dim, t[k].off, n);
        for (int c = 0; c < ncopies; c++)
            if (copies[c].off < end &&
                t[k].off < copies[c].off + (size_t)copies[c].rows * copies[c].cols)
                return sg_fail(err, SG_EINVAL, "optimizer: table %d overlaps bf16 copy %d", k, c);
        for (size_t i = 0; i < t[k].nids; i++)
            if (t[k].ids[i] < 0 || (size_t)t[k].ids[i] >= t[k].rows ||
                (i > 0 && t[k].ids[i] <= t[k].ids[i - 1]))
                return sg_fail(err, SG_EINVAL,
                               "optimizer: row %d (entry %zu) of table %d is outside [0, %zu) or "
                               "out of order (rows are sorted and unique)",
                               (int)t[k].ids[i], i, k, t[k].rows);
    }
    return 0;
}

/* Sum of squares of g over [lo, hi), where the tables' ranges count only
 * their listed rows (double accumulation). */
static double norm2_span(const float *g, size_t lo, size_t hi, const OptimRows *t, int nt)
{
    double s = 0.0, d;
    size_t pos = lo;
    for (int k = 0; k < nt; k++) {
        const size_t toff = t[k].off, tend = toff + t[k].rows * t[k].dim;
        if (tend <= pos)
            continue;
        if (toff >= hi)
            break;
        if (toff > pos) {
            d = optim_global_norm(g + pos, toff - pos);
            s += d * d;
        }
        for (size_t i = 0; i < t[k].nids; i++) {
            const size_t at = toff + (size_t)t[k].ids[i] * t[k].dim;
            if (at >= lo && at + t[k].dim <= hi)
                for (size_t j = 0; j < t[k].dim; j++)
                    s += (double)g[at + j] * g[at + j];
        }
        pos = tend < hi ? tend : hi;
    }
    if (pos < hi) {
        d = optim_global_norm(g + pos, hi - pos);
        s += d * d;
    }
    return s;
}

/* A dense update of [lo, hi) with the copies inside it, on the OpenMP
 * threads when it is long. */
static void update_dense(const StepArgs *a, float *params, const float *grads, float *s0, float *s1,
                         float *s2, size_t lo, size_t hi, const OptimBf16Copy *copies, int ncopies)
{
    const size_t len = hi - lo;
    int nt = len >= 65536 ? omp_get_max_threads() : 1;
    if (nt <= 1) {
        step_copy(a, params, grads, s0, s1, s2, lo, hi, copies, ncopies);
        return;
    }
#pragma omp parallel num_threads(nt)
    {
        size_t t = (size_t)omp_get_thread_num(), T = (size_t)omp_get_num_threads();
        step_span(a, params, grads, s0, s1, s2, lo + len * t / T, lo + len * (t + 1) / T);
        /* threads: the copies in a second pass, once every update is done */
        if (ncopies > 0) {
#pragma omp barrier
        }
        for (int k = 0; k < ncopies; k++) {
#pragma omp for schedule(static)
            for (int r = 0; r < (copies[k].rows + 1) / 2; r++) {
#ifdef HAVE_CVT_BF16
                copy_rows_avx512(params, NULL, 0.0f, &copies[k], 2 * r,
                                 2 * r + 2 < copies[k].rows ? 2 * r + 2 : copies[k].rows);
#endif
            }
        }
    }
}

/* Lazy Adam on rows [lo, hi) of the listed ids of table t, as
 * torch.optim.SparseAdam computes it:
 * m += (g - m)(1 - b1), v += (g^2 - v)(1 - b2), p -= ss * m / (sqrt(v) + eps)
 * with ss = lr * sqrt(1 - b2^t) / (1 - b1^t). The state and parameters of the
 * rows ahead are prefetched (scattered over the table, likely cold), each
 * row's first and last line. */
#define ROWS_AHEAD 16
OPTIM_CLONES static void adam_rows(const StepArgs *r, float *p, const float *g, float *s0,
                                   float *s1, const OptimRows *t, size_t lo, size_t hi)
{
    const size_t dim = t->dim;
    const float b1 = r->b1, b2 = r->b2, eps = r->eps, ss = r->step_size, scale = r->scale,
                clipv = r->clipv;
    for (size_t i = lo; i < hi; i++) {
        if (i + ROWS_AHEAD < hi) {
            const size_t ahead = t->off + (size_t)t->ids[i + ROWS_AHEAD] * dim,
                         last = ahead + dim - 1;
            __builtin_prefetch(p + ahead, 1);
            __builtin_prefetch(s0 + ahead, 1);
            __builtin_prefetch(s1 + ahead, 1);
            __builtin_prefetch(g + ahead, 0);
            if ((ahead ^ last) >= 16) {
                __builtin_prefetch(p + last, 1);
                __builtin_prefetch(s0 + last, 1);
                __builtin_prefetch(s1 + last, 1);
                __builtin_prefetch(g + last, 0);
            }
        }
        const size_t at = t->off + (size_t)t->ids[i] * dim;
        float *restrict pr = p + at, *restrict m = s0 + at, *restrict v = s1 + at;
        const float *restrict gr = g + at;
        for (size_t j = 0; j < dim; j++) {
            const float gj = grad_at(gr, (ptrdiff_t)j, scale, clipv);
            m[j] += (gj - m[j]) * (1.0f - b1);
            v[j] += (gj * gj - v[j]) * (1.0f - b2);
            pr[j] += -ss * (m[j] / (sqrtf(v[j]) + eps));
        }
    }
}

/* The listed rows of table t. */
static void update_rows(const StepArgs *a, float *p, const float *g, float *s0, float *s1,
                        float *s2, const OptimRows *t)
{
    StepArgs r = *a;
    if (a->scales != NULL) { /* the table is one tensor: its clipping factor, once */
        int k = 0;
        while (k < a->ntensors - 1 && a->ends[k] <= t->off)
            k++;
        r.scale = a->scale * a->scales[k];
        r.scales = NULL;
    }
    const size_t dim = t->dim, nids = t->nids;
    /* threads for many floats, or many rows (each a few cache misses) */
    const int nt = nids * dim >= 65536 || nids >= 4096 ? omp_get_max_threads() : 1;
    if (a->kind == OPTIM_ADAM) {
        /* SparseAdam's step size, in double as torch computes it, then float */
        r.step_size = a->lr_d * sqrt(a->bc2_d) / a->bc1_d;
        if (nt <= 1) {
            adam_rows(&r, p, g, s0, s1, t, 0, nids);
            return;
        }
#pragma omp parallel num_threads(nt)
        {
            const size_t k = (size_t)omp_get_thread_num(), T = (size_t)omp_get_num_threads();
            adam_rows(&r, p, g, s0, s1, t, nids * k / T, nids * (k + 1) / T);
        }
        return;
    }
#pragma omp parallel for schedule(static) num_threads(nt)
    for (size_t i = 0; i < nids; i++) {
        const size_t at = t->off + (size_t)t->ids[i] * dim;
        step_span(&r, p, g, s0, s1, s2, at, at + dim);
    }
}

int optim_step_rows(Optimizer *o, float *params, const float *grads, size_t n,
                    const OptimRows *tables, int ntables, const OptimBf16Copy *copies, int ncopies,
                    SgError *err)
{
    if (n != o->n)
        return sg_fail(err, SG_EINVAL, "optimizer: step over %zu floats, created for %zu", n, o->n);
    int rc = check_copies(copies, ncopies, n, err);
    if (rc == 0)
        rc = check_tables(tables, ntables, copies, ncopies, n, err);
    if (rc < 0)
        return rc;
    const OptimConfig *c = &o->cfg;
    /* dense optimizers see the tables as any range (their gradient is zero
     * outside the listed rows, so the norms are the same either way) */
    const int sparse = ntables > 0 && optim_sparse_rows(o);
    const int nt = sparse ? ntables : 0;
    StepArgs a = {c->kind,
                  (float)lr_at(c, o->step),
                  1.0f,
                  c->clip_value,
                  c->weight_decay,
                  c->momentum,
                  c->beta1,
                  c->beta2,
                  c->eps,
                  c->rho,
                  0.0f,
                  1.0f,
                  c->nesterov,
                  c->centered,
                  c->kind == OPTIM_ADAMW,
                  NULL,
                  NULL,
                  0,
                  0.0,
                  1.0,
                  1.0};
    a.lr_d = lr_at(c, o->step);
    o->step++;
    if (c->clip_norm > 0.0f) {
        double coef = c->clip_norm / (sqrt(norm2_span(grads, 0, n, tables, nt)) + 1e-6);
        a.scale = coef < 1.0 ? (float)coef : 1.0f;
    }
    if (c->clip_tensor_norm > 0.0f) {
        /* Keras' clip_by_norm: g * clip / max(||g||_2, clip), per tensor */
        for (int k = 0; k < o->ntensors; k++) {
            size_t lo = k ? o->ends[k - 1] : 0;
            double norm = sqrt(norm2_span(grads, lo, o->ends[k], tables, nt));
            o->scales[k] = (float)(c->clip_tensor_norm / fmax(norm, c->clip_tensor_norm));
        }
        a.ends = o->ends;
        a.scales = o->scales;
        a.ntensors = o->ntensors;
    }
    if (c->kind == OPTIM_ADAM || c->kind == OPTIM_ADAMW) {
        float t = (float)o->step;
        a.step_size = a.lr / (1.0f - powf(c->beta1, t));
        a.bc2_sqrt = sqrtf(1.0f - powf(c->beta2, t));
        a.bc1_d = 1.0 - pow(c->beta1, (double)o->step);
        a.bc2_d = 1.0 - pow(c->beta2, (double)o->step);
    }
    float *s0 = o->state, *s1 = o->state ? o->state + n : NULL,
          *s2 = o->state && o->nslots > 2 ? o->state + 2 * n : NULL;
    /* the stretches between the tables densely (with the copies inside
     * them), then each table's listed rows */
    size_t pos = 0;
    int ci = 0;
    for (int k = 0; k <= nt; k++) {
        const size_t end = k < nt ? tables[k].off : n;
        int cj = ci;
        while (cj < ncopies && copies[cj].off < end)
            cj++;
        if (end > pos)
            update_dense(&a, params, grads, s0, s1, s2, pos, end, copies + ci, cj - ci);
        ci = cj;
        if (k < nt) {
            update_rows(&a, params, grads, s0, s1, s2, &tables[k]);
            pos = end + tables[k].rows * tables[k].dim;
        }
    }
    return 0;
}
