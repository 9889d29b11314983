/*
 * nn_metric.h - the metrics, one table of entries (nn_metric.c), computed in
 * C during training and evaluation from the batch the loss saw (NnOutputs:
 * out = the model's outputs after its head, the targets, the sample weights).
 *
 * Each metric keeps a state of doubles that only ever grows by addition
 * (weighted sums and counts; AUC: weighted histograms of the predictions of
 * positives and negatives over Keras' evenly spaced thresholds), so the
 * states of several batches, log intervals or workers combine by summing
 * them, and the result is computed once from the sum: an AUC across workers
 * comes from their summed confusion counts, never from an average of AUCs.
 * Keras' semantics (keras.metrics), sample weights included.
 */
#ifndef NN_METRIC_H
#define NN_METRIC_H

#include <stddef.h>

#include "common/sg_status.h"
#include "nn/nn_loss.h"

typedef enum NnMetricKind {
    NN_METRIC_SPARSE_ACCURACY = 0,  /* argmax(out) == label */
    NN_METRIC_CATEGORICAL_ACCURACY, /* argmax(out) == argmax(target) */
    NN_METRIC_BINARY_ACCURACY,      /* mean over k of (out > threshold) == target */
    NN_METRIC_AUC,                  /* ROC or PR, interpolated, num_thresholds */
    NN_METRIC_PRECISION,            /* tp / (tp + fp) at threshold */
    NN_METRIC_RECALL,               /* tp / (tp + fn) at threshold */
    NN_METRIC_MSE,
    NN_METRIC_MAE,
    NN_METRIC_RMSE,
    NN_METRIC_COUNT,
} NnMetricKind;

typedef struct NnMetric {
    NnMetricKind kind;
    float threshold;    /* binary accuracy, precision, recall */
    int num_thresholds; /* AUC (Keras: 200) */
    int pr_curve;       /* AUC: 1 PR, 0 ROC */
    int from_logits;    /* AUC, precision, recall: sigmoid applied to out first */
} NnMetric;

typedef struct NnMetricOps {
    const char *name; /* Keras' name */
    size_t (*state_size)(const NnMetric *m);
    void (*update)(const NnMetric *m, double *state, const NnOutputs *o);
    double (*result)(const NnMetric *m, const double *state);
} NnMetricOps;

const NnMetricOps *nn_metric_ops(NnMetricKind kind);

/* Checks the metric's arguments and that it fits K outputs and the targets
 * (sparse: integer labels) (SG_EMODEL naming both). */
int nn_metric_check(const NnMetric *m, int K, int sparse, SgError *err);
size_t nn_metric_state_size(const NnMetric *m);
/* Adds the batch's contribution to state[nn_metric_state_size(m)]. */
void nn_metric_update(const NnMetric *m, double *state, const NnOutputs *o);
/* The metric's value from a (summed) state; 0 where nothing was seen. */
double nn_metric_result(const NnMetric *m, const double *state);

#endif /* NN_METRIC_H */
