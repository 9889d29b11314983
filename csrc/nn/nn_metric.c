/* nn_metric.c - the metric table (see nn_metric.h). */
#include "nn/nn_metric.h"

#include <math.h>

/* the target of row b, output k (sparse labels as one-hot) */
static float target_at(const NnOutputs *o, int b, int k)
{
    return o->labels ? (o->labels[b] == k ? 1.0f : 0.0f) : o->targets[(size_t)b * o->K + k];
}

static float weight_at(const NnOutputs *o, int b)
{
    return o->weights ? o->weights[b] : 1.0f;
}

static int argmax(const float *v, int K)
{
    int best = 0;
    for (int k = 1; k < K; k++)
        if (v[k] > v[best])
            best = k;
    return best;
}

static double divide_no_nan(double a, double b)
{
    return b != 0.0 ? a / b : 0.0;
}

/* ---- means: state [sum of w * value, sum of w] ---------------------------- */

static size_t mean_size(const NnMetric *m)
{
    (void)m;
    return 2;
}

static double mean_result(const NnMetric *m, const double *s)
{
    (void)m;
    return divide_no_nan(s[0], s[1]);
}

static void accuracy_update(const NnMetric *m, double *s, const NnOutputs *o)
{
    (void)m;
    for (int b = 0; b < o->B; b++) {
        const float *p = o->out + (size_t)b * o->K;
        const int want = o->labels ? o->labels[b] : argmax(o->targets + (size_t)b * o->K, o->K);
        const double w = weight_at(o, b);
        s[0] += w * (argmax(p, o->K) == want);
        s[1] += w;
    }
}

static void binary_accuracy_update(const NnMetric *m, double *s, const NnOutputs *o)
{
    for (int b = 0; b < o->B; b++) {
        const float *p = o->out + (size_t)b * o->K;
        int hits = 0;
        for (int k = 0; k < o->K; k++)
            hits += (p[k] > m->threshold ? 1.0f : 0.0f) == target_at(o, b, k);
        const double w = weight_at(o, b);
        s[0] += w * hits / o->K;
        s[1] += w;
    }
}

/* per row: mean over k of f(out - target) */
static void error_update(double *s, const NnOutputs *o, int squared)
{
    for (int b = 0; b < o->B; b++) {
        const float *p = o->out + (size_t)b * o->K;
        double sum = 0.0;
        for (int k = 0; k < o->K; k++) {
            const double e = (double)p[k] - target_at(o, b, k);
            sum += squared ? e * e : fabs(e);
        }
        const double w = weight_at(o, b);
        s[0] += w * sum / o->K;
        s[1] += w;
    }
}

static void mse_update(const NnMetric *m, double *s, const NnOutputs *o)
{
    (void)m;
    error_update(s, o, 1);
}

static void mae_update(const NnMetric *m, double *s, const NnOutputs *o)
{
    (void)m;
    error_update(s, o, 0);
}

static double rmse_result(const NnMetric *m, const double *s)
{
    return sqrt(mean_result(m, s));
}

/* ---- confusion counts ------------------------------------------------------ */

static float prediction(const NnMetric *m, float p)
{
    if (m->from_logits)
        p = p >= 0.0f ? 1.0f / (1.0f + expf(-p)) : expf(p) / (1.0f + expf(p));
    return p;
}

/* state [tp, fp, fn] at the threshold: every output of every row counts
 * (a target is positive when it is not 0), weighted by its row's weight */
static size_t confusion_size(const NnMetric *m)
{
    (void)m;
    return 3;
}

static void confusion_update(const NnMetric *m, double *s, const NnOutputs *o)
{
    for (int b = 0; b < o->B; b++) {
        const double w = weight_at(o, b);
        for (int k = 0; k < o->K; k++) {
            const int pos = prediction(m, o->out[(size_t)b * o->K + k]) > m->threshold;
            const int truth = target_at(o, b, k) != 0.0f;
            s[0] += w * (pos && truth);
            s[1] += w * (pos && !truth);
            s[2] += w * (!pos && truth);
        }
    }
}

static double precision_result(const NnMetric *m, const double *s)
{
    (void)m;
    return divide_no_nan(s[0], s[0] + s[1]);
}

static double recall_result(const NnMetric *m, const double *s)
{
    (void)m;
    return divide_no_nan(s[0], s[0] + s[2]);
}

/* ---- AUC ------------------------------------------------------------------- */

/* state: [positives per bucket (n), negatives per bucket (n)], weighted.
 * Keras' thresholds are -eps, 1/(n-1), ..., (n-2)/(n-1), 1+eps; a prediction
 * p (clipped to [0,1]) counts as above thresholds 0..bucket, bucket = max(0,
 * ceil(p (n-1)) - 1) computed in float32 as Keras computes it (so a p equal
 * to a threshold whose product rounds up counts as above it, as in Keras),
 * and tp[i] is the sum of the positive buckets >= i. */
static size_t auc_size(const NnMetric *m)
{
    return 2 * (size_t)m->num_thresholds;
}

static void auc_update(const NnMetric *m, double *s, const NnOutputs *o)
{
    const int n = m->num_thresholds;
    double *pos = s, *neg = s + n;
    for (int b = 0; b < o->B; b++) {
        const double w = weight_at(o, b);
        for (int k = 0; k < o->K; k++) {
            float p = prediction(m, o->out[(size_t)b * o->K + k]);
            p = !(p >= 0.0f) ? 0.0f : p > 1.0f ? 1.0f : p; /* NaN: 0, below every threshold */
            int bucket = (int)ceilf(p * (float)(n - 1)) - 1;
            bucket = bucket < 0 ? 0 : bucket > n - 1 ? n - 1 : bucket;
            if (target_at(o, b, k) != 0.0f)
                pos[bucket] += w;
            else
                neg[bucket] += w;
        }
    }
}

static double auc_result(const NnMetric *m, const double *s)
{
    const int n = m->num_thresholds;
    const double *pos = s, *neg = s + n;
    double total_pos = 0.0, total_neg = 0.0;
    for (int i = 0; i < n; i++)
        total_pos += pos[i], total_neg += neg[i];
    /* walk the thresholds from the last (tp = fp = 0) down, keeping the
     * confusion counts at threshold i + 1 (tp1, fp1) and at i (tp, fp) */
    double tp1 = 0.0, fp1 = 0.0, auc = 0.0;
    for (int i = n - 1; i >= 1; i--) {
        tp1 += pos[i], fp1 += neg[i];
        const double tp = tp1 + pos[i - 1], fp = fp1 + neg[i - 1];
        if (m->pr_curve) {
            /* Keras' interpolate_pr_auc (Davis & Goadrich) between i and i+1 */
            const double dtp = tp - tp1, p0 = tp + fp, p1 = tp1 + fp1, dp = p0 - p1;
            const double slope = divide_no_nan(dtp, dp > 0.0 ? dp : 0.0);
            const double intercept = tp1 - slope * p1;
            const double ratio = p0 > 0.0 && p1 > 0.0 ? divide_no_nan(p0, p1) : 1.0;
            const double fn1 = total_pos - tp1;
            auc += divide_no_nan(slope * (dtp + intercept * log(ratio)),
                                 tp1 + fn1 > 0 ? tp1 + fn1 : 0);
        } else {
            /* trapezoid between (fpr, tpr) at i and at i+1 */
            const double tpr0 = divide_no_nan(tp, total_pos), tpr1 = divide_no_nan(tp1, total_pos);
            const double fpr0 = divide_no_nan(fp, total_neg), fpr1 = divide_no_nan(fp1, total_neg);
            auc += (fpr0 - fpr1) * (tpr0 + tpr1) / 2.0;
        }
    }
    return auc;
}

/* ---- the table --------------------------------------------------------------- */

static const NnMetricOps METRICS[NN_METRIC_COUNT] = {
    [NN_METRIC_SPARSE_ACCURACY] = {"sparse_categorical_accuracy", mean_size, accuracy_update,
                                   mean_result},
    [NN_METRIC_CATEGORICAL_ACCURACY] = {"categorical_accuracy", mean_size, accuracy_update,
                                        mean_result},
    [NN_METRIC_BINARY_ACCURACY] = {"binary_accuracy", mean_size, binary_accuracy_update,
                                   mean_result},
    [NN_METRIC_AUC] = {"auc", auc_size, auc_update, auc_result},
    [NN_METRIC_PRECISION] = {"precision", confusion_size, confusion_update, precision_result},
    [NN_METRIC_RECALL] = {"recall", confusion_size, confusion_update, recall_result},
    [NN_METRIC_MSE] = {"mean_squared_error", mean_size, mse_update, mean_result},
    [NN_METRIC_MAE] = {"mean_absolute_error", mean_size, mae_update, mean_result},
    [NN_METRIC_RMSE] = {"root_mean_squared_error", mean_size, mse_update, rmse_result},
};

const NnMetricOps *nn_metric_ops(NnMetricKind kind)
{
    return (unsigned)kind < NN_METRIC_COUNT ? &METRICS[kind] : NULL;
}

int nn_metric_check(const NnMetric *m, int K, int sparse, SgError *err)
{
    const NnMetricOps *ops = nn_metric_ops(m->kind);
    if (ops == NULL)
        return sg_fail(err, SG_EMODEL, "unknown metric kind %d", (int)m->kind);
    /* above 2^20 thresholds float32 buckets lose their meaning (and the state is 16 MB) */
    if (m->kind == NN_METRIC_AUC && (m->num_thresholds <= 1 || m->num_thresholds > (1 << 20)))
        return sg_fail(err, SG_EMODEL, "auc: num_thresholds must be in [2, %d], not %d", 1 << 20,
                       m->num_thresholds);
    if ((m->kind == NN_METRIC_SPARSE_ACCURACY || m->kind == NN_METRIC_CATEGORICAL_ACCURACY) &&
        K < 2)
        return sg_fail(err, SG_EMODEL,
                       "%s needs at least 2 outputs (one per class); the last layer has %d (for "
                       "one output use binary_accuracy)",
                       ops->name, K);
    if (m->kind == NN_METRIC_SPARSE_ACCURACY && !sparse)
        return sg_fail(err, SG_EMODEL,
                       "sparse_categorical_accuracy needs integer labels; the loss takes dense "
                       "targets (use categorical_accuracy)");
    return 0;
}

size_t nn_metric_state_size(const NnMetric *m)
{
    return nn_metric_ops(m->kind)->state_size(m);
}

void nn_metric_update(const NnMetric *m, double *state, const NnOutputs *o)
{
    nn_metric_ops(m->kind)->update(m, state, o);
}

double nn_metric_result(const NnMetric *m, const double *state)
{
    return nn_metric_ops(m->kind)->result(m, state);
}
