/* nn_loss.c - the loss table (see nn_loss.h): one entry per loss, each a
 * check and a per-row value and gradient; heads applied and differentiated
 * here. */
#include "nn/nn_loss.h"

#include <math.h>
#include <stddef.h>
#include <string.h>

#define KERAS_EPSILON 1e-7f /* keras.config.epsilon() */

static const char *head_name(NnAct head)
{
    return head == NN_ACT_SOFTMAX ? "softmax" : head == NN_ACT_SIGMOID ? "sigmoid" : "linear";
}

/* ---- heads -------------------------------------------------------------- */

/* out[K] = softmax(z[K]); returns log(sum(exp(z - max))) + max, the log-sum-exp */
static float softmax_row(float *out, const float *z, int K)
{
    float mx = z[0];
    for (int k = 1; k < K; k++)
        mx = z[k] > mx ? z[k] : mx;
    float sum = 0.0f;
    for (int k = 0; k < K; k++) {
        out[k] = expf(z[k] - mx);
        sum += out[k];
    }
    const float inv = 1.0f / sum;
    for (int k = 0; k < K; k++)
        out[k] *= inv;
    return mx + logf(sum);
}

static float sigmoid(float z)
{
    return z >= 0.0f ? 1.0f / (1.0f + expf(-z)) : expf(z) / (1.0f + expf(z));
}

static void head_row(NnAct head, float *out, const float *z, int K)
{
    if (head == NN_ACT_SOFTMAX) {
        softmax_row(out, z, K);
    } else if (head == NN_ACT_SIGMOID) {
        for (int k = 0; k < K; k++)
            out[k] = sigmoid(z[k]);
    } else if (out != z) {
        memcpy(out, z, (size_t)K * sizeof(float));
    }
}

void nn_head_forward(const NnOutputs *o)
{
    for (int b = 0; b < o->B; b++)
        head_row(o->head, o->out + (size_t)b * o->K, o->z + (size_t)b * o->K, o->K);
}

/* dz[K] from g[K] = d loss / d out, through the head at out p[K] */
static void head_backward(NnAct head, float *dz, const float *g, const float *p, int K)
{
    if (head == NN_ACT_SIGMOID) {
        for (int k = 0; k < K; k++)
            dz[k] = g[k] * p[k] * (1.0f - p[k]);
    } else if (head == NN_ACT_SOFTMAX) {
        float dot = 0.0f;
        for (int k = 0; k < K; k++)
            dot += g[k] * p[k];
        for (int k = 0; k < K; k++)
            dz[k] = p[k] * (g[k] - dot);
    } else if (dz != g) {
        memcpy(dz, g, (size_t)K * sizeof(float));
    }
}

/* the target of row b, output k */
static float target_at(const NnOutputs *o, int b, int k)
{
    return o->labels ? (o->labels[b] == k ? 1.0f : 0.0f) : o->targets[(size_t)b * o->K + k];
}

/* ---- cross-entropies (softmax or linear head: z are logits) -------------- */

static int check_categorical(const NnLoss *l, NnAct head, int K, SgError *err)
{
    const char *name = nn_loss_ops(l->kind)->name;
    if (head == NN_ACT_SIGMOID)
        return sg_fail(err, SG_EMODEL,
                       "%s needs a softmax or linear last layer; it ends in sigmoid (for a sigmoid "
                       "output use binary_crossentropy)",
                       name);
    if (K < 2)
        return sg_fail(err, SG_EMODEL,
                       "%s needs at least 2 outputs (one per class); the last layer has %d (for "
                       "one output use binary_crossentropy)",
                       name, K);
    if (l->from_logits && head == NN_ACT_SOFTMAX)
        return sg_fail(err, SG_EMODEL,
                       "%s(from_logits=True) expects a linear last layer; it ends in softmax",
                       name);
    return 0;
}

/* -sum_k t_k log_softmax(z)_k with t = smoothed targets; dz_k = p_k * sum(t) - t_k */
static double categorical_row(const NnLoss *l, const NnOutputs *o, int b, float *dz)
{
    const int K = o->K;
    const float *z = o->z + (size_t)b * K;
    const float ls = l->label_smoothing, off = ls / (float)K;
    float lse;
    if (dz != NULL) {
        lse = softmax_row(dz, z, K); /* p, then the gradient in place */
    } else {
        float mx = z[0], sum = 0.0f;
        for (int k = 1; k < K; k++)
            mx = z[k] > mx ? z[k] : mx;
        for (int k = 0; k < K; k++)
            sum += expf(z[k] - mx);
        lse = mx + logf(sum);
    }
    double loss = 0.0;
    if (o->labels) {
        const int y = o->labels[b];
        loss = -(double)(1.0f - ls) * (double)(z[y] - lse);
        if (ls > 0.0f)
            for (int k = 0; k < K; k++)
                loss -= (double)off * (double)(z[k] - lse);
        if (dz != NULL) {
            for (int k = 0; k < K; k++)
                dz[k] -= off;
            dz[y] -= 1.0f - ls;
        }
        return loss;
    }
    const float *t = o->targets + (size_t)b * K;
    float tsum = 0.0f;
    for (int k = 0; k < K; k++) {
        const float tk = t[k] * (1.0f - ls) + off;
        tsum += tk;
        loss -= (double)tk * (double)(z[k] - lse);
    }
    if (dz != NULL)
        for (int k = 0; k < K; k++)
            dz[k] = dz[k] * tsum - (t[k] * (1.0f - ls) + off);
    return loss;
}

/* ---- binary cross-entropy ------------------------------------------------ */

static int check_binary(const NnLoss *l, NnAct head, int K, SgError *err)
{
    (void)K;
    if (head == NN_ACT_SOFTMAX)
        return sg_fail(
            err, SG_EMODEL,
            "binary_crossentropy needs a sigmoid or linear last layer; it ends in softmax "
            "(for softmax outputs use categorical_crossentropy or "
            "sparse_categorical_crossentropy)");
    if (l->from_logits && head == NN_ACT_SIGMOID)
        return sg_fail(err, SG_EMODEL,
                       "binary_crossentropy(from_logits=True) expects a linear last layer; it ends "
                       "in sigmoid");
    return 0;
}

/* mean over k: logits (sigmoid head, or from_logits) in the stable form
 * max(z,0) - z t + log(1 + exp(-|z|)); else Keras' clipped probabilities */
static double binary_row(const NnLoss *l, const NnOutputs *o, int b, float *dz)
{
    const int K = o->K;
    const float *z = o->z + (size_t)b * K;
    const float ls = l->label_smoothing, invk = 1.0f / (float)K;
    const int logits = o->head == NN_ACT_SIGMOID || l->from_logits;
    double loss = 0.0;
    for (int k = 0; k < K; k++) {
        const float t = target_at(o, b, k) * (1.0f - ls) + 0.5f * ls;
        if (logits) {
            const float x = z[k];
            loss += (double)((x > 0.0f ? x : 0.0f) - x * t + log1pf(expf(-fabsf(x))));
            if (dz != NULL)
                dz[k] = (sigmoid(x) - t) * invk;
        } else {
            const float eps = KERAS_EPSILON;
            const float p = z[k] < eps ? eps : z[k] > 1.0f - eps ? 1.0f - eps : z[k];
            loss -= (double)(t * logf(p) + (1.0f - t) * logf(1.0f - p));
            if (dz != NULL)
                dz[k] =
                    z[k] >= eps && z[k] <= 1.0f - eps ? (p - t) / (p * (1.0f - p)) * invk : 0.0f;
        }
    }
    return loss * invk;
}

/* ---- losses of the outputs (any head, chained through it) ----------------- */

static int check_any(const NnLoss *l, NnAct head, int K, SgError *err)
{
    (void)head, (void)K;
    if (l->kind == NN_LOSS_HUBER && !(l->delta > 0.0f))
        return sg_fail(err, SG_EMODEL, "huber: delta must be > 0, not %g", (double)l->delta);
    return 0;
}

/* loss and d loss / d p of one output p against its target t */
typedef float (*ElementLoss)(float p, float t, float delta, float *g);

static float mse_el(float p, float t, float delta, float *g)
{
    (void)delta;
    const float e = p - t;
    *g = 2.0f * e;
    return e * e;
}

static float mae_el(float p, float t, float delta, float *g)
{
    (void)delta;
    const float e = p - t;
    *g = e > 0.0f ? 1.0f : e < 0.0f ? -1.0f : 0.0f;
    return fabsf(e);
}

static float huber_el(float p, float t, float delta, float *g)
{
    const float e = p - t, a = fabsf(e);
    if (a <= delta) {
        *g = e;
        return 0.5f * e * e;
    }
    *g = e > 0.0f ? delta : -delta;
    return delta * a - 0.5f * delta * delta;
}

static float poisson_el(float p, float t, float delta, float *g)
{
    (void)delta;
    *g = 1.0f - t / (p + KERAS_EPSILON);
    return p - t * logf(p + KERAS_EPSILON);
}

/* mean over k of el(out, target); the gradient chained through the head */
static double elementwise_row(const NnLoss *l, const NnOutputs *o, int b, float *dz, ElementLoss el)
{
    const int K = o->K;
    const float *p = o->out + (size_t)b * K;
    const float invk = 1.0f / (float)K;
    double loss = 0.0;
    for (int k = 0; k < K; k++) {
        float g;
        loss += (double)el(p[k], target_at(o, b, k), l->delta, &g);
        if (dz != NULL)
            dz[k] = g * invk;
    }
    if (dz != NULL)
        head_backward(o->head, dz, dz, p, K);
    return loss * invk;
}

static double mse_row(const NnLoss *l, const NnOutputs *o, int b, float *dz)
{
    return elementwise_row(l, o, b, dz, mse_el);
}
static double mae_row(const NnLoss *l, const NnOutputs *o, int b, float *dz)
{
    return elementwise_row(l, o, b, dz, mae_el);
}
static double huber_row(const NnLoss *l, const NnOutputs *o, int b, float *dz)
{
    return elementwise_row(l, o, b, dz, huber_el);
}
static double poisson_row(const NnLoss *l, const NnOutputs *o, int b, float *dz)
{
    return elementwise_row(l, o, b, dz, poisson_el);
}

/* ---- the table ------------------------------------------------------------ */

static const NnLossOps LOSSES[NN_LOSS_COUNT] = {
    [NN_LOSS_SPARSE_CE] = {"sparse_categorical_crossentropy", 1, check_categorical,
                           categorical_row},
    [NN_LOSS_CATEGORICAL_CE] = {"categorical_crossentropy", 0, check_categorical, categorical_row},
    [NN_LOSS_BINARY_CE] = {"binary_crossentropy", 0, check_binary, binary_row},
    [NN_LOSS_MSE] = {"mean_squared_error", 0, check_any, mse_row},
    [NN_LOSS_MAE] = {"mean_absolute_error", 0, check_any, mae_row},
    [NN_LOSS_HUBER] = {"huber", 0, check_any, huber_row},
    [NN_LOSS_POISSON] = {"poisson", 0, check_any, poisson_row},
};

const NnLossOps *nn_loss_ops(NnLossKind kind)
{
    return (unsigned)kind < NN_LOSS_COUNT ? &LOSSES[kind] : NULL;
}

int nn_loss_check(const NnLoss *l, NnAct head, int K, SgError *err)
{
    const NnLossOps *ops = nn_loss_ops(l->kind);
    if (ops == NULL)
        return sg_fail(err, SG_EMODEL, "unknown loss kind %d", (int)l->kind);
    if (!(l->label_smoothing >= 0.0f && l->label_smoothing <= 1.0f))
        return sg_fail(err, SG_EMODEL, "%s: label_smoothing must be in [0, 1], not %g", ops->name,
                       (double)l->label_smoothing);
    if (K <= 0)
        return sg_fail(err, SG_EMODEL, "%s: the model has no outputs", ops->name);
    int rc = ops->check(l, head, K, err);
    if (rc < 0)
        sg_context(err, "loss and last layer (%s, %d outputs): ", head_name(head), K);
    return rc;
}

int nn_loss_run(const NnLoss *l, const NnOutputs *o, float *dz, double *loss_sum, int *bad)
{
    const NnLossOps *ops = nn_loss_ops(l->kind);
    const int K = o->K;
    const float inv_b = 1.0f / (float)o->B;
    double total = 0.0;
    for (int b = 0; b < o->B; b++) {
        if (o->labels && (o->labels[b] < 0 || o->labels[b] >= K)) {
            *bad = b;
            return -1;
        }
        head_row(o->head, o->out + (size_t)b * K, o->z + (size_t)b * K, K);
        float *d = dz ? dz + (size_t)b * K : NULL;
        const double v = ops->row(l, o, b, d);
        const float w = o->weights ? o->weights[b] : 1.0f;
        if (!isfinite(v)) {
            *bad = b;
            return -2;
        }
        total += (double)w * v;
        if (d != NULL) {
            const float s = w * inv_b;
            for (int k = 0; k < K; k++)
                d[k] *= s;
        }
    }
    *loss_sum = total;
    return 0;
}

int nn_loss_bad_target(const NnLoss *l, const float *t, int K, int *at)
{
    for (int k = 0; k < K; k++) {
        const int bad =
            l->kind == NN_LOSS_BINARY_CE ? !(t[k] >= 0.0f && t[k] <= 1.0f) : !isfinite(t[k]);
        if (bad) {
            *at = k;
            return 1;
        }
    }
    return 0;
}
