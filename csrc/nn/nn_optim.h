/*
 * nn_optim.h - optimizers over one flat float range (a model's parameter
 * buffer, a parameter-server shard, an allreduced gradient): SGD (momentum,
 * Nesterov, weight decay), Adam, AdamW, RMSprop (momentum, centered),
 * Adadelta, Adagrad; learning-rate schedules (constant, step, exponential,
 * piecewise constant, cosine; linear warm-up as a factor or as Keras'
 * CosineDecay ramp) and gradient clipping (global norm, per-tensor norm,
 * value), applied on the fly without touching the caller's gradients.
 *
 * The update rules follow torch.optim (2.x) exactly, so the tests can compare
 * parameters after several steps, except Adagrad, which follows Keras 3
 * (epsilon inside the square root, the accumulator starting at a value);
 * Keras-style defaults are chosen by the Python layer. The optimizer owns its state: `nslots`
 * arrays of n floats in one contiguous buffer (optim_state), plus the step counter; a checkpoint
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
    OPTIM_ADAGRAD = 5, /* Keras 3: acc += g^2; p -= lr * g / sqrt(acc + eps) */
} OptimKind;

/* t is the number of steps taken before this one (Keras' `iterations`). */
typedef enum LrSchedule {
    LR_CONSTANT = 0,
    LR_STEP = 1,        /* lr * gamma ^ floor(t / step_size) (ExponentialDecay, staircase) */
    LR_COSINE = 2,      /* lr_min + (lr - lr_min) * (1 + cos(pi * min(t, total) / total)) / 2 */
    LR_EXPONENTIAL = 3, /* lr * gamma ^ (t / step_size) (ExponentialDecay) */
    LR_PIECEWISE = 4,   /* values[i], i the number of boundaries < t (PiecewiseConstantDecay) */
} LrSchedule;

typedef enum LrWarmup {
    WARMUP_SCALE = 0, /* the schedule times min(1, (t + 1) / warmup_steps) */
    WARMUP_RAMP = 1,  /* warmup_from + (lr - warmup_from) * t / warmup_steps while t < warmup_steps,
                         then the schedule at t - warmup_steps (Keras' CosineDecay) */
} LrWarmup;

#define OPTIM_MAX_PIECES 64 /* values of LR_PIECEWISE */

typedef struct OptimConfig {
    OptimKind kind;
    float lr;
    float momentum;     /* SGD, RMSprop */
    int nesterov;       /* SGD */
    float weight_decay; /* L2 added to the gradient; decoupled for AdamW */
    float beta1, beta2; /* Adam(W) */
    float eps;          /* Adam(W), RMSprop, Adadelta, Adagrad */
    float rho;          /* RMSprop alpha, Adadelta rho */
    int centered;       /* RMSprop */
    float init_accum;   /* Adagrad: the accumulator's first value */
    /* schedule: t is the number of steps taken before this one */
    LrSchedule schedule;
    int64_t step_size;                        /* LR_STEP, LR_EXPONENTIAL */
    float gamma;                              /* LR_STEP, LR_EXPONENTIAL */
    int64_t total_steps;                      /* LR_COSINE */
    float lr_min;                             /* LR_COSINE */
    int npieces;                              /* LR_PIECEWISE: values, 1..OPTIM_MAX_PIECES */
    int64_t boundaries[OPTIM_MAX_PIECES - 1]; /* LR_PIECEWISE: npieces - 1, increasing */
    float values[OPTIM_MAX_PIECES];           /* LR_PIECEWISE: absolute rates; lr is unused */
    int64_t warmup_steps;                     /* 0 = none */
    LrWarmup warmup;
    float warmup_from; /* WARMUP_RAMP's first rate */
    /* clipping, applied to the gradient before everything else; 0 = off */
    float clip_norm;        /* scale g by min(1, clip_norm / ||g||_2) */
    float clip_tensor_norm; /* scale each tensor's g by clip / max(||g_tensor||_2, clip) (Keras'
                               clipnorm); tensors from optim_set_tensors, else the whole range */
    float clip_value;       /* clamp g to [-clip_value, clip_value] */
} OptimConfig;

typedef struct Optimizer Optimizer;

/* Fills cfg with torch.optim's defaults for kind (lr 1e-3, 1.0 for Adadelta,
 * 0.01 for RMSprop and Adagrad; Adagrad's eps 1e-10). */
void optim_config_default(OptimConfig *cfg, OptimKind kind);

/* Validates cfg and allocates the state for n parameters (zeroed). */
int optim_create(Optimizer **out, const OptimConfig *cfg, size_t n, SgError *err);

/* Declares the tensors of the range for clip_tensor_norm: sizes[0..count)
 * in order, summing to the size given at creation (one tensor, the whole
 * range, until called). */
int optim_set_tensors(Optimizer *o, const size_t *sizes, int count, SgError *err);

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
 * ablk is a multiple of 16; the columns of the last block up to the next
 * multiple of 16 are padding, written as zeros, and so is the row after an
 * odd last row (rows are padded to 16). The plan offers the optimizer such a
 * copy for even input widths only (nn_op_weighted.c's pair_layout): with an
 * odd width, a shared Dense layer trained in bf16 drifted from fp32
 * (tests/test_nn_functional.py), so odd widths keep their per-step reorder. */
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

/* A table of the range (an Embedding's [rows, dim] at float `off`) whose
 * gradient is zero outside the rows listed: ids[0..nids), sorted, unique. */
typedef struct OptimRows {
    size_t off;
    size_t rows, dim;
    const int32_t *ids;
    size_t nids;
} OptimRows;

/* 1 if o updates only the listed rows of such tables (optim_step_rows):
 * SGD (momentum and Nesterov too), Adagrad and Adam, without weight decay.
 * For SGD without momentum and Adagrad that equals the dense update; SGD's
 * momentum and Adam's moments of rows a step does not touch are left as
 * they are (lazily: TensorFlow's sparse momentum, torch.optim.SparseAdam),
 * and Adam's touched rows follow SparseAdam's arithmetic (epsilon added to
 * the root of the uncorrected second moment, bias corrections from the
 * global step). Other optimizers update the tables densely. */
int optim_sparse_rows(const Optimizer *o);

/* optim_step where tables[0..ntables) (sorted by off, not overlapping, not
 * overlapping the copies) are updated only in their listed rows when
 * optim_sparse_rows(o), densely otherwise; clipping norms count the listed
 * rows alone (the others are zero). copies as optim_step_bf16 (ncopies 0:
 * none). SG_EINVAL for a table outside the range or ids out of order. */
int optim_step_rows(Optimizer *o, float *params, const float *grads, size_t n,
                    const OptimRows *tables, int ntables, const OptimBf16Copy *copies, int ncopies,
                    SgError *err);

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
 * SG_EINVAL unless lr is finite and >= 0, SG_ESTATE under LR_PIECEWISE (absolute values). */
int optim_set_base_lr(Optimizer *o, float lr, SgError *err);

/* State for checkpoints: nslots * n floats, contiguous. */
size_t optim_state_size(const Optimizer *o);
float *optim_state(Optimizer *o);
/* Restores the step counter and the state (len floats; must equal optim_state_size). */
int optim_set_state(Optimizer *o, int64_t step, const float *state, size_t len, SgError *err);

/* ||g||_2 over n floats (double accumulation). */
double optim_global_norm(const float *g, size_t n);

#endif /* NN_OPTIM_H */
