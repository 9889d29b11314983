/*
 * nn_optim.c - optimizer updates over a flat float range (see nn_optim.h).
 * Each rule is one OpenMP loop over the range; the arithmetic is float, in
 * the order torch.optim's single-tensor path uses, so results match it to
 * rounding.
 */
#include "nn/nn_optim.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

struct Optimizer {
    OptimConfig cfg;
    size_t n;      /* parameters */
    int nslots;    /* state arrays of n floats */
    int64_t step;  /* steps taken */
    float *state;  /* [nslots, n] */
};

void optim_config_default(OptimConfig *cfg, OptimKind kind)
{
    memset(cfg, 0, sizeof *cfg);
    cfg->kind = kind;
    cfg->lr = kind == OPTIM_ADADELTA ? 1.0f : (kind == OPTIM_RMSPROP ? 0.01f : 1e-3f);
    cfg->beta1 = 0.9f;
    cfg->beta2 = 0.999f;
    cfg->eps = kind == OPTIM_ADADELTA ? 1e-6f : 1e-8f;
    cfg->rho = kind == OPTIM_ADADELTA ? 0.9f : 0.99f;
    cfg->weight_decay = kind == OPTIM_ADAMW ? 0.01f : 0.0f;
    cfg->gamma = 0.1f;
    cfg->step_size = 1;
    cfg->total_steps = 1;
}

static int slots_for(const OptimConfig *c)
{
    switch (c->kind) {
    case OPTIM_SGD: return c->momentum != 0.0f;
    case OPTIM_ADAM:
    case OPTIM_ADAMW:
    case OPTIM_ADADELTA: return 2;
    case OPTIM_RMSPROP: return 1 + (c->centered != 0) + (c->momentum != 0.0f);
    }
    return -1;
}

static int check_config(const OptimConfig *c, SgError *err)
{
    if (slots_for(c) < 0)
        return sg_fail(err, SG_EINVAL, "optimizer: unknown kind %d", (int)c->kind);
    if (!(c->lr >= 0.0f) || !isfinite(c->lr))
        return sg_fail(err, SG_EINVAL, "optimizer: learning rate must be >= 0, not %g", c->lr);
    if (!(c->momentum >= 0.0f && c->momentum < 1.0f))
        return sg_fail(err, SG_EINVAL, "optimizer: momentum must be in [0, 1), not %g", c->momentum);
    if (c->nesterov && (c->kind != OPTIM_SGD || c->momentum <= 0.0f))
        return sg_fail(err, SG_EINVAL, "optimizer: nesterov needs SGD with momentum > 0");
    if (!(c->weight_decay >= 0.0f))
        return sg_fail(err, SG_EINVAL, "optimizer: weight_decay must be >= 0, not %g", c->weight_decay);
    if ((c->kind == OPTIM_ADAM || c->kind == OPTIM_ADAMW) &&
        !(c->beta1 >= 0.0f && c->beta1 < 1.0f && c->beta2 >= 0.0f && c->beta2 < 1.0f))
        return sg_fail(err, SG_EINVAL, "optimizer: betas must be in [0, 1), not (%g, %g)", c->beta1,
                       c->beta2);
    if ((c->kind == OPTIM_RMSPROP || c->kind == OPTIM_ADADELTA) && !(c->rho >= 0.0f && c->rho <= 1.0f))
        return sg_fail(err, SG_EINVAL, "optimizer: rho must be in [0, 1], not %g", c->rho);
    if (!(c->eps >= 0.0f))
        return sg_fail(err, SG_EINVAL, "optimizer: eps must be >= 0, not %g", c->eps);
    if (c->schedule == LR_STEP && c->step_size <= 0)
        return sg_fail(err, SG_EINVAL, "optimizer: step schedule needs step_size > 0, not %lld",
                       (long long)c->step_size);
    if (c->schedule == LR_COSINE && c->total_steps <= 0)
        return sg_fail(err, SG_EINVAL, "optimizer: cosine schedule needs total_steps > 0, not %lld",
                       (long long)c->total_steps);
    if ((int)c->schedule < 0 || c->schedule > LR_COSINE)
        return sg_fail(err, SG_EINVAL, "optimizer: unknown schedule %d", (int)c->schedule);
    if (c->warmup_steps < 0 || c->clip_norm < 0.0f || c->clip_value < 0.0f)
        return sg_fail(err, SG_EINVAL, "optimizer: warmup_steps, clip_norm and clip_value must be >= 0");
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
        o->state = calloc((size_t)o->nslots * n, sizeof(float));
        if (o->state == NULL) {
            int nslots = o->nslots;
            free(o);
            return sg_fail(err, SG_ENOMEM, "optimizer: cannot allocate %d x %zu floats of state",
                           nslots, n);
        }
    }
    *out = o;
    return 0;
}

void optim_free(Optimizer *o)
{
    if (o == NULL)
        return;
    free(o->state);
    free(o);
}

static double lr_at(const OptimConfig *c, int64_t t)
{
    double lr = c->lr;
    if (c->schedule == LR_STEP)
        lr *= pow(c->gamma, (double)(t / c->step_size));
    else if (c->schedule == LR_COSINE) {
        double tt = (double)(t < c->total_steps ? t : c->total_steps);
        lr = c->lr_min + (c->lr - c->lr_min) * (1.0 + cos(M_PI * tt / (double)c->total_steps)) / 2.0;
    }
    if (c->warmup_steps > 0 && t + 1 < c->warmup_steps)
        lr *= (double)(t + 1) / (double)c->warmup_steps;
    return lr;
}

float optim_current_lr(const Optimizer *o) { return (float)lr_at(&o->cfg, o->step); }
int64_t optim_get_step(const Optimizer *o) { return o->step; }
const OptimConfig *optim_config(const Optimizer *o) { return &o->cfg; }
size_t optim_state_size(const Optimizer *o) { return (size_t)o->nslots * o->n; }
float *optim_state(Optimizer *o) { return o->state; }

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

int optim_step(Optimizer *o, float *params, const float *grads, size_t n, SgError *err)
{
    if (n != o->n)
        return sg_fail(err, SG_EINVAL, "optimizer: step over %zu floats, created for %zu", n, o->n);
    const OptimConfig *c = &o->cfg;
    const float lr = (float)lr_at(c, o->step);
    o->step++;
    const int64_t t = o->step;
    float scale = 1.0f;
    if (c->clip_norm > 0.0f) {
        double norm = optim_global_norm(grads, n);
        double coef = c->clip_norm / (norm + 1e-6);
        scale = coef < 1.0 ? (float)coef : 1.0f;
    }
    const float clipv = c->clip_value, wd = c->weight_decay, mom = c->momentum;
    float *s0 = o->state, *s1 = o->state ? o->state + n : NULL,
          *s2 = o->state ? o->state + 2 * n : NULL;
    const ptrdiff_t N = (ptrdiff_t)n;
    const int par = n > 16384;

#define GRAD_AT(i)                                                   \
    float g = grads[i] * scale;                                      \
    if (clipv > 0.0f)                                                \
        g = g > clipv ? clipv : (g < -clipv ? -clipv : g);

    switch (c->kind) {
    case OPTIM_SGD: {
        const int nest = c->nesterov;
#pragma omp parallel for simd schedule(static) if (par)
        for (ptrdiff_t i = 0; i < N; i++) {
            GRAD_AT(i)
            if (wd != 0.0f)
                g += wd * params[i];
            if (mom != 0.0f) {
                s0[i] = mom * s0[i] + g;
                g = nest ? g + mom * s0[i] : s0[i];
            }
            params[i] -= lr * g;
        }
        break;
    }
    case OPTIM_ADAM:
    case OPTIM_ADAMW: {
        const float b1 = c->beta1, b2 = c->beta2, eps = c->eps;
        const float bc1 = 1.0f - powf(b1, (float)t), bc2 = 1.0f - powf(b2, (float)t);
        const float step_size = lr / bc1, bc2_sqrt = sqrtf(bc2);
        const int decoupled = c->kind == OPTIM_ADAMW;
        const float decay = 1.0f - lr * wd;
#pragma omp parallel for simd schedule(static) if (par)
        for (ptrdiff_t i = 0; i < N; i++) {
            GRAD_AT(i)
            if (decoupled)
                params[i] *= decay;
            else if (wd != 0.0f)
                g += wd * params[i];
            s0[i] += (g - s0[i]) * (1.0f - b1);
            s1[i] = b2 * s1[i] + (1.0f - b2) * g * g;
            float denom = sqrtf(s1[i]) / bc2_sqrt + eps;
            params[i] += -step_size * (s0[i] / denom);
        }
        break;
    }
    case OPTIM_RMSPROP: {
        const float a = c->rho, eps = c->eps;
        const int centered = c->centered;
        float *gavg = centered ? s1 : NULL;
        float *buf = mom != 0.0f ? (centered ? s2 : s1) : NULL;
#pragma omp parallel for simd schedule(static) if (par)
        for (ptrdiff_t i = 0; i < N; i++) {
            GRAD_AT(i)
            if (wd != 0.0f)
                g += wd * params[i];
            s0[i] = a * s0[i] + (1.0f - a) * g * g;
            float avg;
            if (gavg) {
                gavg[i] += (g - gavg[i]) * (1.0f - a);
                avg = sqrtf(s0[i] - gavg[i] * gavg[i]) + eps;
            } else {
                avg = sqrtf(s0[i]) + eps;
            }
            if (buf) {
                buf[i] = mom * buf[i] + g / avg;
                params[i] -= lr * buf[i];
            } else {
                params[i] -= lr * (g / avg);
            }
        }
        break;
    }
    case OPTIM_ADADELTA: {
        const float rho = c->rho, eps = c->eps;
#pragma omp parallel for simd schedule(static) if (par)
        for (ptrdiff_t i = 0; i < N; i++) {
            GRAD_AT(i)
            if (wd != 0.0f)
                g += wd * params[i];
            s0[i] = rho * s0[i] + (1.0f - rho) * g * g;
            float delta = sqrtf(s1[i] + eps) / sqrtf(s0[i] + eps) * g;
            s1[i] = rho * s1[i] + (1.0f - rho) * delta * delta;
            params[i] -= lr * delta;
        }
        break;
    }
    }
#undef GRAD_AT
    return 0;
}
