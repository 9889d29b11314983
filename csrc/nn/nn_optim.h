/*
 * nn_optim.h - optimizers over one flat float range (a model's parameter
 * buffer, a parameter-server shard, an allreduced gradient): SGD (momentum,
 * Nesterov, weight decay), Adam, AdamW, RMSprop (momentum, centered),
 * Adadelta; learning-rate schedules (constant, step, cosine, linear warm-up)
 * and gradient clipping (global norm, value), applied on the fly without
 * touching the caller's gradients.
 *
 * The update rules follow torch.optim (2.x) exactly, so the tests can compare
 * parameters after several steps; Keras-style defaults are chosen by the
 * Python layer. The optimizer owns its state: `nslots` arrays of n floats in
 * one contiguous buffer (optim_state), plus the step counter; a checkpoint
 * saves both and restores them with optim_set_state.
 *
 * Not thread-safe per instance; optim_step parallelises with OpenMP.
 */
#ifndef NN_OPTIM_H
#define NN_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "common/sg_status.h"

typedef enum OptimKind {
    OPTIM_SGD = 0,
    OPTIM_ADAM = 1,
    OPTIM_ADAMW = 2,
    OPTIM_RMSPROP = 3,
    OPTIM_ADADELTA = 4,
} OptimKind;

typedef enum LrSchedule {
    LR_CONSTANT = 0,
    LR_STEP = 1,   /* lr * gamma ^ floor(t / step_size) */
    LR_COSINE = 2, /* lr_min + (lr - lr_min) * (1 + cos(pi * min(t, total) / total)) / 2 */
} LrSchedule;

typedef struct OptimConfig {
    OptimKind kind;
    float lr;
    float momentum;     /* SGD, RMSprop */
    int nesterov;       /* SGD */
    float weight_decay; /* L2 added to the gradient; decoupled for AdamW */
    float beta1, beta2; /* Adam(W) */
    float eps;          /* Adam(W), RMSprop, Adadelta */
    float rho;          /* RMSprop alpha, Adadelta rho */
    int centered;       /* RMSprop */
    /* schedule: t is the number of steps taken before this one */
    LrSchedule schedule;
    int64_t step_size;    /* LR_STEP */
    float gamma;          /* LR_STEP */
    int64_t total_steps;  /* LR_COSINE */
    float lr_min;         /* LR_COSINE */
    int64_t warmup_steps; /* factor min(1, (t+1)/warmup_steps) on top of the schedule; 0 = none */
    /* clipping, applied to the gradient before everything else; 0 = off */
    float clip_norm;  /* scale g by min(1, clip_norm / ||g||_2) */
    float clip_value; /* clamp g to [-clip_value, clip_value] */
} OptimConfig;

typedef struct Optimizer Optimizer;

/* Fills cfg with torch.optim's defaults for kind (lr 1e-3, or 1.0 for Adadelta). */
void optim_config_default(OptimConfig *cfg, OptimKind kind);

/* Validates cfg and allocates the state for n parameters (zeroed). */
int optim_create(Optimizer **out, const OptimConfig *cfg, size_t n, SgError *err);

/* params[n] -= update(grads[n]); n must equal the size given at creation. */
int optim_step(Optimizer *o, float *params, const float *grads, size_t n, SgError *err);

void optim_free(Optimizer *o);

/* dst[i] = src[i] rounded to bf16 (nearest, ties to even, NaN to a quiet NaN,
 * as oneDNN's reorders round) for i < n, with AVX512_BF16's conversion where
 * the CPU has it. */
void optim_f32_to_bf16(const float *src, uint16_t *dst, size_t n);

/* A bf16 copy of a [rows, cols] row-major block of the parameters (a Dense
 * kernel [C, OC]) from params[off], in the blocked layout oneDNN's bf16 inner
 * product reads (AB8b<ablk>a2b: pairs of rows interleaved, ablk columns a
 * block): element (r, c) is at
 *   dst[(c / ablk) * stride_a + (r / 16) * stride_b + (r % 16 / 2) * 2 * ablk
 *       + (c % ablk) * 2 + r % 2].
 * rows is even, ablk a multiple of 16; the columns of the last block up to
 * the next multiple of 16 are padding, written as zeros. */
typedef struct OptimBf16Copy {
    size_t off;
    int rows, cols, ablk;
    size_t stride_a, stride_b;
    uint16_t *dst;
} OptimBf16Copy;

/* 1 if optim_step_bf16 can write copies on this CPU (AVX512_BF16). */
int optim_bf16_copy_supported(void);

/* optim_step, writing the copies[0..ncopies) of the updated parameters in the
 * same pass (two rows at a time, from the L1 cache); copies are sorted by off
 * and do not overlap. Needs optim_bf16_copy_supported(). */
int optim_step_bf16(Optimizer *o, float *params, const float *grads, size_t n,
                    const OptimBf16Copy *copies, int ncopies, SgError *err);

/* Plain SGD (no momentum, weight decay or clipping) is params -= lr * grads,
 * which a caller may fold into the computation of the gradient itself (the
 * model's fit loop does, inside the weight-gradient GEMM). If o is plain
 * SGD: counts the step as optim_step would, sets *lr to this step's learning
 * rate and returns 1; otherwise returns 0 and changes nothing. n is the
 * parameter count, checked as optim_step checks it (< 0 with err set). */
int optim_take_plain_sgd_step(Optimizer *o, size_t n, float *lr, SgError *err);

/* The learning rate the next step will use. */
float optim_current_lr(const Optimizer *o);
/* Steps taken so far. */
int64_t optim_get_step(const Optimizer *o);
const OptimConfig *optim_config(const Optimizer *o);
/* Sets the base learning rate (the schedule applies on top of it from the next step);
 * SG_EINVAL unless lr is finite and >= 0. */
int optim_set_base_lr(Optimizer *o, float lr, SgError *err);

/* State for checkpoints: nslots * n floats, contiguous. */
size_t optim_state_size(const Optimizer *o);
float *optim_state(Optimizer *o);
/* Restores the step counter and the state (len floats; must equal optim_state_size). */
int optim_set_state(Optimizer *o, int64_t step, const float *state, size_t len, SgError *err);

/* ||g||_2 over n floats (double accumulation). */
double optim_global_norm(const float *g, size_t n);

#endif /* NN_OPTIM_H */
