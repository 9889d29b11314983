/*
 * nn_loss.h - the losses, one table of entries (nn_loss.c), and the batch
 * that losses and metrics (nn_metric.h) read.
 *
 * A model's last layer may end in a "head" activation, softmax or sigmoid,
 * that the forward pass leaves out: the loss applies it (into out[B,K], what
 * metrics and prediction read) and differentiates through it, in the stable
 * fused form where there is one (softmax + cross-entropy from the logits,
 * sigmoid + binary cross-entropy from the logits). Every loss returns the
 * gradient with respect to the pre-head output z, so the backward pass is
 * the same for all of them.
 *
 * Keras' semantics (keras.losses): per-row losses are summed over classes
 * (cross-entropies) or averaged over the last axis (the others); a batch's
 * loss is sum_b w_b * loss_b / B ("sum_over_batch_size"), w the sample
 * weights (1 without). Shape letters as in nn_ref.h: B batch, K outputs.
 */
#ifndef NN_LOSS_H
#define NN_LOSS_H

#include <stdint.h>

#include "common/sg_status.h"
#include "nn/nn_ref.h"

typedef enum NnLossKind {
    NN_LOSS_SPARSE_CE = 0,  /* sparse_categorical_crossentropy: int labels [B] */
    NN_LOSS_CATEGORICAL_CE, /* categorical_crossentropy: targets [B,K] */
    NN_LOSS_BINARY_CE,      /* binary_crossentropy: targets [B,K] in [0,1] */
    NN_LOSS_MSE,            /* mean_squared_error */
    NN_LOSS_MAE,            /* mean_absolute_error */
    NN_LOSS_HUBER,          /* huber (delta) */
    NN_LOSS_POISSON,        /* poisson: mean(p - t log(p + eps)) */
    NN_LOSS_COUNT,
} NnLossKind;

/* A loss and its arguments (Keras' names). */
typedef struct NnLoss {
    NnLossKind kind;
    int from_logits;       /* binary_crossentropy on a linear head: z are logits */
    float label_smoothing; /* the cross-entropies */
    float delta;           /* huber */
} NnLoss;

/* One batch's outputs and targets, as losses and metrics see them. */
typedef struct NnOutputs {
    int B, K;
    NnAct head;            /* NN_ACT_SOFTMAX, NN_ACT_SIGMOID or NN_ACT_NONE */
    const float *z;        /* [B,K] the last layer's output before the head */
    float *out;            /* [B,K] head(z) */
    const int32_t *labels; /* [B] sparse targets in [0,K), or NULL */
    const float *targets;  /* [B,K] dense targets, or NULL */
    const float *weights;  /* [B] sample weights, or NULL (all 1) */
} NnOutputs;

/* An entry of the table: a loss's name and how it computes. */
typedef struct NnLossOps {
    const char *name; /* Keras' function name */
    int sparse;       /* 1: integer labels; 0: dense targets [B,K] */
    /* Whether the loss fits a head of K outputs (an error naming both if not). */
    int (*check)(const NnLoss *l, NnAct head, int K, SgError *err);
    /* Row b: its loss (before the sample weight) and, when dz is not NULL,
     * d loss_b / d z[b,:] into dz[K]. out[b,:] is already head(z[b,:]). */
    double (*row)(const NnLoss *l, const NnOutputs *o, int b, float *dz);
} NnLossOps;

/* The table entry of a kind (NULL for an unknown one). */
const NnLossOps *nn_loss_ops(NnLossKind kind);

/* Checks that the loss fits the head and its width (SG_EMODEL naming both). */
int nn_loss_check(const NnLoss *l, NnAct head, int K, SgError *err);

/* out = head(z), every row (prediction and the metrics of a forward pass). */
void nn_head_forward(const NnOutputs *o);

/* The batch's loss: out = head(z); *loss_sum = sum_b w_b * loss_b; with dz
 * (not NULL) dz[B,K] = w_b / B * d loss_b / d z (the gradient of the batch's
 * mean). Returns 0; -1 with *bad the first row whose label is outside
 * [0,K) (sparse); -2 with *bad the first row whose loss is not finite
 * (outputs then unspecified). */
int nn_loss_run(const NnLoss *l, const NnOutputs *o, float *dz, double *loss_sum, int *bad);

/* A target value outside what the loss takes (binary cross-entropy: [0,1]):
 * 1 with the value's index in the row; else 0. */
int nn_loss_bad_target(const NnLoss *l, const float *t, int K, int *at);

#endif /* NN_LOSS_H */
