/*
 * test_nn_loss.c - the loss table (nn_loss.h). Every loss with every head it
 * accepts (with and without sample weights, label smoothing and from_logits)
 * against Keras' formula written out here in double, and its gradient dz
 * against central finite differences, both of that double formula and of
 * the loss nn_loss_run itself returns; the cross-entropies against the
 * reference kernels log_softmax_forward_ref -> xent_forward / xent_backward
 * (nn_ref.h), with logits large enough that a naive exp overflows; the heads'
 * outputs; known values; and the refusals: labels out of range, non-finite
 * losses, bad targets, losses that do not fit their last layer.
 * Exits non-zero on any mismatch.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "nn/nn_loss.h"
#include "nn/nn_ref.h"

#define MAX_B       7
#define MAX_K       4
#define MAX_N       (MAX_B * MAX_K)
#define HUBER_DELTA 0.5f

static const NnAct HEADS[] = {NN_ACT_NONE, NN_ACT_SOFTMAX, NN_ACT_SIGMOID};

/* uniform in [lo, hi) */
static float urand(uint64_t *s, float lo, float hi)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (float)((*s >> 40) * (1.0 / 16777216.0));
}

static int is_ce(NnLossKind kind)
{
    return kind == NN_LOSS_SPARSE_CE || kind == NN_LOSS_CATEGORICAL_CE;
}

/* Which (loss, head, K) nn_loss_check should accept: the cross-entropies
 * read logits (a softmax or linear head, at least 2 classes), binary
 * cross-entropy a sigmoid or linear head, from_logits only a linear one. */
static int should_fit(const NnLoss *l, NnAct head, int K)
{
    if (is_ce(l->kind))
        return head != NN_ACT_SIGMOID && K >= 2 && !(l->from_logits && head == NN_ACT_SOFTMAX);
    if (l->kind == NN_LOSS_BINARY_CE)
        return head != NN_ACT_SOFTMAX && !(l->from_logits && head == NN_ACT_SIGMOID);
    return 1;
}

/* ---- Keras' losses in double ----------------------------------------------- */

static void ref_head(double *p, const double *z, NnAct head, int K)
{
    if (head == NN_ACT_SOFTMAX) {
        double mx = z[0], sum = 0.0;
        for (int k = 1; k < K; k++)
            mx = z[k] > mx ? z[k] : mx;
        for (int k = 0; k < K; k++)
            sum += p[k] = exp(z[k] - mx);
        for (int k = 0; k < K; k++)
            p[k] /= sum;
    } else if (head == NN_ACT_SIGMOID) {
        for (int k = 0; k < K; k++)
            p[k] = 1.0 / (1.0 + exp(-z[k]));
    } else {
        memcpy(p, z, (size_t)K * sizeof(double));
    }
}

/* Keras' loss of one row: z[K] the pre-head outputs, t[K] the targets
 * (one-hot for a label). The cross-entropies read z as logits whatever the
 * head (softmax or linear: sparkgrad's documented departure from Keras);
 * binary cross-entropy reads logits under a sigmoid head or from_logits,
 * else probabilities clipped to [eps, 1 - eps]. */
static double ref_row_loss(const NnLoss *l, NnAct head, const double *z, const double *t, int K)
{
    const double ls = l->label_smoothing, eps = 1e-7;
    double loss = 0.0, p[MAX_K];
    if (is_ce(l->kind)) {
        double mx = z[0], sum = 0.0;
        for (int k = 1; k < K; k++)
            mx = z[k] > mx ? z[k] : mx;
        for (int k = 0; k < K; k++)
            sum += exp(z[k] - mx);
        const double lse = mx + log(sum);
        for (int k = 0; k < K; k++)
            loss -= (t[k] * (1.0 - ls) + ls / K) * (z[k] - lse);
        return loss;
    }
    if (l->kind == NN_LOSS_BINARY_CE) {
        for (int k = 0; k < K; k++) {
            const double tk = t[k] * (1.0 - ls) + 0.5 * ls;
            if (head == NN_ACT_SIGMOID || l->from_logits) {
                loss += fmax(z[k], 0.0) - z[k] * tk + log1p(exp(-fabs(z[k])));
            } else {
                const double pk = fmin(fmax(z[k], eps), 1.0 - eps);
                loss -= tk * log(pk) + (1.0 - tk) * log(1.0 - pk);
            }
        }
        return loss / K;
    }
    ref_head(p, z, head, K);
    const double d = l->delta;
    for (int k = 0; k < K; k++) {
        const double e = p[k] - t[k], a = fabs(e);
        switch (l->kind) {
        case NN_LOSS_MSE:
            loss += e * e;
            break;
        case NN_LOSS_MAE:
            loss += a;
            break;
        case NN_LOSS_HUBER:
            loss += a <= d ? 0.5 * e * e : d * a - 0.5 * d * d;
            break;
        default: /* poisson */
            loss += p[k] - t[k] * log(p[k] + eps);
            break;
        }
    }
    return loss / K;
}

/* sum_b w_b loss_b / B (Keras' "sum_over_batch_size") of z[B,K] in double;
 * *scale = sum_b |w_b loss_b| / B, what the float rows' rounding scales with
 * (Poisson's row losses may be negative and cancel). */
static double ref_batch_loss(const NnLoss *l, const NnOutputs *o, const double *z, double *scale)
{
    double total = 0.0, abs_total = 0.0, t[MAX_K];
    for (int b = 0; b < o->B; b++) {
        for (int k = 0; k < o->K; k++)
            t[k] = o->labels ? (o->labels[b] == k) : o->targets[b * o->K + k];
        const double w = o->weights ? o->weights[b] : 1.0;
        const double v = w * ref_row_loss(l, o->head, z + b * o->K, t, o->K);
        total += v, abs_total += fabs(v);
    }
    if (scale != NULL)
        *scale = abs_total / o->B;
    return total / o->B;
}

/* ---- random batches ---------------------------------------------------------- */

typedef struct Batch {
    float z[MAX_N], out[MAX_N], targets[MAX_N], weights[MAX_B];
    int32_t labels[MAX_B];
    NnOutputs o;
} Batch;

/* A batch where the loss is smooth within 1e-2 of every z: BCE on
 * probabilities keeps z in [0.2, 0.8] and Poisson on a linear head z in
 * [1, 3] (both away from where the third derivative blows up); MAE and Huber
 * take targets at |out - target| in [0.05, 0.35] or [0.65, 1] (Huber's
 * delta is 0.5), away from their kinks; one weight is 0 when weighted. */
static void make_batch(Batch *bt, const NnLoss *l, NnAct head, int B, int K, int weighted,
                       uint64_t *s)
{
    const int logits = head != NN_ACT_NONE || l->from_logits;
    for (int i = 0; i < B * K; i++) {
        if (l->kind == NN_LOSS_BINARY_CE && !logits)
            bt->z[i] = urand(s, 0.2f, 0.8f);
        else if (l->kind == NN_LOSS_POISSON && head == NN_ACT_NONE)
            bt->z[i] = urand(s, 1.0f, 3.0f);
        else
            bt->z[i] = urand(s, -3.0f, 3.0f);
    }
    for (int b = 0; b < B; b++) {
        double zd[MAX_K], p[MAX_K];
        for (int k = 0; k < K; k++)
            zd[k] = bt->z[b * K + k];
        ref_head(p, zd, head, K);
        bt->labels[b] = (int32_t)urand(s, 0.0f, (float)K) % K;
        bt->weights[b] = weighted ? (b == B - 1 ? 0.0f : urand(s, 0.25f, 2.0f)) : 1.0f;
        for (int k = 0; k < K; k++) {
            float *t = &bt->targets[b * K + k];
            const float r = urand(s, 0.0f, 1.0f), sign = urand(s, 0.0f, 1.0f) < 0.5f ? -1.0f : 1.0f;
            switch (l->kind) {
            case NN_LOSS_CATEGORICAL_CE: /* one-hot rows and soft (unnormalised) ones */
                *t = b % 2 ? r : (float)(bt->labels[b] == k);
                break;
            case NN_LOSS_BINARY_CE: /* exact 0 and 1, and soft targets */
                *t = r < 0.3f ? 0.0f : r < 0.6f ? 1.0f : urand(s, 0.0f, 1.0f);
                break;
            case NN_LOSS_MAE:
                *t = (float)(p[k] + sign * urand(s, 0.05f, 0.5f));
                break;
            case NN_LOSS_HUBER:
                *t = (float)(p[k] +
                             sign * (r < 0.5f ? urand(s, 0.05f, 0.35f) : urand(s, 0.65f, 1.0f)));
                break;
            case NN_LOSS_POISSON:
                *t = urand(s, 0.0f, 3.0f);
                break;
            default:
                *t = urand(s, -1.0f, 1.5f);
                break;
            }
        }
    }
    bt->o = (NnOutputs){.B = B, .K = K, .head = head, .z = bt->z, .out = bt->out};
    if (l->kind == NN_LOSS_SPARSE_CE)
        bt->o.labels = bt->labels;
    else
        bt->o.targets = bt->targets;
    bt->o.weights = weighted ? bt->weights : NULL;
}

/* ---- every loss and head: value, gradient, head output ---------------------------- */

/*
 * Tolerances, each with its source of error:
 *  - the batch loss against the double formula: the rows are computed in
 *    float (expf, logf, log1pf, a few ulps each): 1e-6 of
 *    sum_b |w_b loss_b| / B, plus 1e-7;
 *  - dz against a central difference of the double formula (h = 1e-4: the
 *    truncation error h^2 f'''/6 is below 1e-8 on these batches, the
 *    rounding of the difference 1e-12): dz is float, a few ulps of its
 *    terms, so 1e-5 relative plus 1e-7 absolute (dz is of order
 *    w / (B K), 1e-2 to 1);
 *  - dz against a central difference of nn_loss_run's own loss_sum / B
 *    (h = 1e-2, the step taken exactly as the two float z differ): the float
 *    rows round at 1e-7 of losses up to ~5, i.e. ~5e-5 after dividing by
 *    2h, and truncation adds up to ~2e-5 f''': 2e-3 relative plus 1e-4.
 * Measured on these batches: a tenth, a tenth and a half of each bound.
 */
static void check_case(const NnLoss *l, NnAct head, int K, int weighted, uint64_t *seed)
{
    const int B = 5 + K % 3, n = B * K;
    Batch bt;
    make_batch(&bt, l, head, B, K, weighted, seed);
    NnOutputs *o = &bt.o;
    float dz[MAX_N], out0[MAX_N], out1[MAX_N];
    double loss = NAN, zd[MAX_N], scale;
    int bad = -7;
    CHECK(nn_loss_run(l, o, dz, &loss, &bad) == 0 && bad == -7);
    for (int i = 0; i < n; i++)
        zd[i] = bt.z[i];
    const double want = ref_batch_loss(l, o, zd, &scale);
    CHECK(isfinite(loss) && fabs(loss / B - want) <= 1e-6 * scale + 1e-7);

    /* the head's output: softmax(z), sigmoid(z) or z itself, as nn_head_forward gives it */
    memcpy(out0, bt.out, (size_t)n * sizeof(float));
    double p[MAX_N];
    for (int b = 0; b < B; b++)
        ref_head(p + b * K, zd + b * K, head, K);
    for (int i = 0; i < n; i++)
        CHECK(head == NN_ACT_NONE ? bt.out[i] == bt.z[i] : fabs(bt.out[i] - p[i]) <= 1e-6);
    o->out = out1;
    nn_head_forward(o);
    CHECK(memcmp(out0, out1, (size_t)n * sizeof(float)) == 0);
    o->out = bt.out;

    /* without dz: the same loss, bit for bit, and the same outputs */
    double loss2 = NAN;
    CHECK(nn_loss_run(l, o, NULL, &loss2, &bad) == 0 && loss2 == loss);
    CHECK(memcmp(out0, bt.out, (size_t)n * sizeof(float)) == 0);

    for (int i = 0; i < n; i++) {
        const double h = 1e-4;
        zd[i] = bt.z[i] + h;
        const double lp = ref_batch_loss(l, o, zd, NULL);
        zd[i] = bt.z[i] - h;
        const double lm = ref_batch_loss(l, o, zd, NULL);
        zd[i] = bt.z[i];
        const double fd = (lp - lm) / (2.0 * h);
        CHECK(fabs(dz[i] - fd) <= 1e-5 * fabs(fd) + 1e-7);

        const float z0 = bt.z[i], zp = z0 + 1e-2f, zm = z0 - 1e-2f;
        double sp = NAN, sm = NAN;
        bt.z[i] = zp;
        CHECK(nn_loss_run(l, o, NULL, &sp, &bad) == 0);
        bt.z[i] = zm;
        CHECK(nn_loss_run(l, o, NULL, &sm, &bad) == 0);
        bt.z[i] = z0;
        const double fd32 = (sp - sm) / B / ((double)zp - (double)zm);
        CHECK(fabs(dz[i] - fd32) <= 2e-3 * fabs(fd32) + 1e-4);
    }
}

static void test_every_loss_and_head_matches_keras_and_finite_differences(void)
{
    uint64_t seed = 0x10550;
    int cases = 0;
    for (int kind = 0; kind < NN_LOSS_COUNT; kind++) {
        const int xent = is_ce(kind) || kind == NN_LOSS_BINARY_CE; /* from_logits, smoothing */
        for (int fl = 0; fl <= xent; fl++)
            for (int si = 0; si <= xent; si++)
                for (size_t h = 0; h < sizeof HEADS / sizeof HEADS[0]; h++)
                    for (int K = 1; K <= MAX_K; K++) {
                        const NnLoss l = {kind, fl, si ? 0.1f : 0.0f, HUBER_DELTA};
                        SgError err = {0};
                        const int rc = nn_loss_check(&l, HEADS[h], K, &err);
                        CHECK(rc == (should_fit(&l, HEADS[h], K) ? 0 : SG_EMODEL));
                        if (rc != 0)
                            continue;
                        for (int weighted = 0; weighted <= 1; weighted++, cases++)
                            check_case(&l, HEADS[h], K, weighted, &seed);
                    }
    }
    CHECK(cases == 216); /* the grid above, should_fit's combinations */
}

/* ---- the cross-entropies against the reference kernels -------------------------- */

/* nn_loss_run on logits[B,K] against log_softmax_forward_ref -> xent_forward /
 * xent_backward, row by row so that sample weights apply: loss to 1e-5
 * relative, dz to 1e-6 of its scale w / B (both are float softmaxes). */
static void check_ce_against_reference(int B, int K, int sparse, float scale, NnAct head,
                                       int weighted)
{
    uint64_t seed = 0x5eed + (uint64_t)B * 31 + (uint64_t)K;
    const size_t n = (size_t)B * K;
    float *logits = malloc(sizeof(float) * n), *lp = malloc(sizeof(float) * n);
    float *want = malloc(sizeof(float) * n), *got = malloc(sizeof(float) * n);
    float *out = malloc(sizeof(float) * n), *onehot = calloc(n, sizeof(float));
    float *w = malloc(sizeof(float) * B);
    int32_t *labels = malloc(sizeof(int32_t) * B);
    for (size_t i = 0; i < n; i++)
        logits[i] = urand(&seed, -scale, scale);
    for (int b = 0; b < B; b++) {
        labels[b] = (int32_t)urand(&seed, 0.0f, (float)K) % K;
        onehot[(size_t)b * K + labels[b]] = 1.0f;
        w[b] = weighted ? urand(&seed, 0.0f, 3.0f) : 1.0f;
    }
    const int32_t *lab = sparse ? labels : NULL;
    const float *oh = sparse ? NULL : onehot;
    log_softmax_forward_ref(lp, logits, B, K);
    double want_loss = 0.0;
    for (int b = 0; b < B; b++) {
        const size_t r = (size_t)b * K;
        want_loss +=
            w[b] * xent_forward(lp + r, lab ? lab + b : NULL, oh ? oh + r : NULL, 1, K, NULL);
        xent_backward(want + r, lp + r, lab ? lab + b : NULL, oh ? oh + r : NULL, 1, K);
    }

    const NnLoss l = {sparse ? NN_LOSS_SPARSE_CE : NN_LOSS_CATEGORICAL_CE};
    const NnOutputs o = {B, K, head, logits, out, lab, oh, weighted ? w : NULL};
    SgError err = {0};
    CHECK(nn_loss_check(&l, head, K, &err) == 0);
    double loss = NAN;
    int bad = -1;
    CHECK(nn_loss_run(&l, &o, got, &loss, &bad) == 0 && bad == -1);
    CHECK(isfinite(loss) && fabs(loss - want_loss) <= 1e-5 * fabs(want_loss) + 1e-6);
    double maxd = 0.0, maxo = 0.0;
    for (size_t i = 0; i < n; i++) {
        const double wi = w[i / K];
        const double d = fabs((double)got[i] - want[i] * wi / B) / (wi > 1.0 ? wi : 1.0);
        maxd = d > maxd ? d : maxd;
        /* the head's output: softmax(z) (exp of the reference log-softmax) or z */
        const double e =
            head == NN_ACT_SOFTMAX ? fabs(out[i] - exp(lp[i])) : fabs(out[i] - logits[i]);
        maxo = e > maxo ? e : maxo;
    }
    CHECK(maxd <= 1e-6 / B + 1e-9);
    CHECK(head == NN_ACT_SOFTMAX ? maxo <= 1e-6 : maxo == 0.0);
    double loss2 = NAN;
    CHECK(nn_loss_run(&l, &o, NULL, &loss2, &bad) == 0 && loss2 == loss);
    free(logits), free(lp), free(want), free(got), free(out), free(onehot), free(w), free(labels);
}

static void test_cross_entropies_match_the_reference_kernels(void)
{
    for (size_t h = 0; h < 2; h++)
        for (int weighted = 0; weighted <= 1; weighted++) {
            const NnAct head = HEADS[h]; /* linear, softmax */
            check_ce_against_reference(100, 10, 1, 3.0f, head, weighted);
            check_ce_against_reference(100, 10, 0, 3.0f, head, weighted);
            check_ce_against_reference(7, 3, 1, 200.0f, head, weighted); /* exp(200) overflows */
            check_ce_against_reference(7, 3, 0, 200.0f, head, weighted);
            check_ce_against_reference(5, 1000, 0, 50.0f, head, weighted);
        }
}

/* ---- known values ------------------------------------------------------------- */

/* the loss of one row, z[K] against t[K] (or label y when t is NULL) */
static double row_loss(NnLoss l, NnAct head, int K, const float *z, const float *t, int32_t y)
{
    float out[MAX_K], dz[MAX_K];
    const NnOutputs o = {1, K, head, z, out, t ? NULL : &y, t, NULL};
    double loss = NAN;
    int bad = -1;
    SgError err = {0};
    CHECK(nn_loss_check(&l, head, K, &err) == 0);
    CHECK(nn_loss_run(&l, &o, dz, &loss, &bad) == 0);
    return loss;
}

static void test_known_values(void)
{
    const float zero = 0.0f, one = 1.0f, two = 2.0f, three = 3.0f, four = 4.0f;
    const NnLoss bce_logits = {NN_LOSS_BINARY_CE, 1}, bce = {NN_LOSS_BINARY_CE};
    CHECK(fabs(row_loss(bce_logits, NN_ACT_NONE, 1, &zero, &one, 0) - log(2.0)) <= 1e-6);
    CHECK(fabs(row_loss(bce, NN_ACT_SIGMOID, 1, &zero, &one, 0) - log(2.0)) <= 1e-6);
    CHECK(row_loss((NnLoss){NN_LOSS_MSE}, NN_ACT_NONE, 1, &three, &one, 0) == 4.0);
    CHECK(row_loss((NnLoss){NN_LOSS_MAE}, NN_ACT_NONE, 1, &three, &one, 0) == 2.0);
    /* huber, delta 1: |err| 3 on the linear part (3 - 0.5), 0.5 on the quadratic */
    const float half = 0.5f;
    CHECK(row_loss((NnLoss){NN_LOSS_HUBER, .delta = 1.0f}, NN_ACT_NONE, 1, &four, &one, 0) == 2.5);
    CHECK(row_loss((NnLoss){NN_LOSS_HUBER, .delta = 1.0f}, NN_ACT_NONE, 1, &half, &zero, 0) ==
          0.125);
    CHECK(fabs(row_loss((NnLoss){NN_LOSS_POISSON}, NN_ACT_NONE, 1, &two, &one, 0) -
               (2.0 - log(2.0 + 1e-7))) <= 1e-6);

    /* Keras' CategoricalCrossentropy(label_smoothing=0.1) on two classes,
     * y_true [1, 0], y_pred softmax([2, 0]): the targets become
     * [1 - 0.1 + 0.1/2, 0.1/2] = [0.95, 0.05], so the loss is
     * -(0.95 log p0 + 0.05 log(1 - p0)), p0 = 1 / (1 + e^-2), = 0.2269...;
     * binary cross-entropy from the logit 2 with label_smoothing 0.1
     * ([1] -> [0.95]) is the same number. */
    const double p0 = 1.0 / (1.0 + exp(-2.0));
    const double keras = -(0.95 * log(p0) + 0.05 * log(1.0 - p0));
    CHECK(fabs(keras - 0.22692801104297255) <= 1e-12);
    const float z2[2] = {2.0f, 0.0f}, t2[2] = {1.0f, 0.0f};
    for (size_t h = 0; h < 2; h++) {
        const NnLoss cce = {NN_LOSS_CATEGORICAL_CE, 0, 0.1f}, scce = {NN_LOSS_SPARSE_CE, 0, 0.1f};
        CHECK(fabs(row_loss(cce, HEADS[h], 2, z2, t2, 0) - keras) <= 1e-6);
        CHECK(fabs(row_loss(scce, HEADS[h], 2, z2, NULL, 0) - keras) <= 1e-6);
    }
    const NnLoss bce_smooth = {NN_LOSS_BINARY_CE, 1, 0.1f};
    CHECK(fabs(row_loss(bce_smooth, NN_ACT_NONE, 1, &two, &one, 0) - keras) <= 1e-6);
    /* smoothing a label is smoothing its one-hot row: sparse and dense agree */
    float z3[3] = {0.5f, -1.0f, 2.0f}, t3[3] = {0.0f, 1.0f, 0.0f};
    const NnLoss c3 = {NN_LOSS_CATEGORICAL_CE, 0, 0.1f}, s3 = {NN_LOSS_SPARSE_CE, 0, 0.1f};
    CHECK(fabs(row_loss(c3, NN_ACT_NONE, 3, z3, t3, 0) -
               row_loss(s3, NN_ACT_NONE, 3, z3, NULL, 1)) <= 1e-6);
}

/* ---- bad input ------------------------------------------------------------------ */

static void test_rejects_out_of_range_label(void)
{
    float logits[3 * 4] = {0}, out[3 * 4], d[3 * 4];
    int32_t labels[3] = {1, 4, 0};
    const NnLoss l = {NN_LOSS_SPARSE_CE};
    const NnOutputs o = {3, 4, NN_ACT_SOFTMAX, logits, out, labels, NULL, NULL};
    double loss;
    int bad = -7;
    CHECK(nn_loss_run(&l, &o, d, &loss, &bad) == -1 && bad == 1);
    labels[1] = 2, labels[2] = -1, bad = -7;
    CHECK(nn_loss_run(&l, &o, d, &loss, &bad) == -1 && bad == 2);
    bad = -7;
    CHECK(nn_loss_run(&l, &o, NULL, &loss, &bad) == -1 && bad == 2);
}

/* A NaN in row 1 of z makes that row's loss NaN for every loss and head */
static void test_rejects_non_finite_loss(void)
{
    for (int kind = 0; kind < NN_LOSS_COUNT; kind++)
        for (int fl = 0; fl <= 1; fl++)
            for (size_t h = 0; h < sizeof HEADS / sizeof HEADS[0]; h++) {
                const NnLoss l = {kind, fl, 0.0f, 1.0f};
                SgError err = {0};
                if (nn_loss_check(&l, HEADS[h], 2, &err) != 0)
                    continue;
                float z[3 * 2] = {0.3f, 0.6f, 0.2f, 0.4f, 0.5f, 0.5f}, out[6], d[6];
                float t[6] = {1, 0, 0, 1, 1, 0};
                int32_t labels[3] = {0, 1, 0};
                const int sparse = kind == NN_LOSS_SPARSE_CE;
                const NnOutputs o = {
                    3, 2, HEADS[h], z, out, sparse ? labels : NULL, sparse ? NULL : t, NULL};
                double loss;
                int bad = -7;
                CHECK(nn_loss_run(&l, &o, d, &loss, &bad) == 0 && bad == -7);
                for (int k = 0; k < 2; k++) {
                    const float keep = z[2 + k];
                    z[2 + k] = NAN;
                    bad = -7;
                    CHECK(nn_loss_run(&l, &o, d, &loss, &bad) == -2 && bad == 1);
                    bad = -7;
                    CHECK(nn_loss_run(&l, &o, NULL, &loss, &bad) == -2 && bad == 1);
                    z[2 + k] = keep;
                }
            }
}

static void test_bad_targets(void)
{
    const NnLoss bce = {NN_LOSS_BINARY_CE}, mse = {NN_LOSS_MSE};
    const float ok[3] = {0.0f, 1.0f, 0.5f}, over[3] = {0.0f, 1.0f, 1.5f}, under[2] = {-0.5f, 1.0f};
    const float nan[2] = {0.0f, NAN}, inf[2] = {INFINITY, 0.0f};
    int at = -7;
    CHECK(nn_loss_bad_target(&bce, ok, 3, &at) == 0 && at == -7);
    CHECK(nn_loss_bad_target(&bce, over, 3, &at) == 1 && at == 2);
    CHECK(nn_loss_bad_target(&bce, under, 2, &at) == 1 && at == 0);
    CHECK(nn_loss_bad_target(&bce, nan, 2, &at) == 1 && at == 1);
    at = -7;
    CHECK(nn_loss_bad_target(&mse, over, 3, &at) == 0 && at == -7); /* any finite value */
    CHECK(nn_loss_bad_target(&mse, nan, 2, &at) == 1 && at == 1);
    CHECK(nn_loss_bad_target(&mse, inf, 2, &at) == 1 && at == 0);
}

/* nn_loss_check's refusal: SG_EMODEL, with a message that names the loss */
static void check_refused(NnLoss l, NnAct head, int K, const char *name)
{
    SgError err = {0};
    CHECK(nn_loss_check(&l, head, K, &err) == SG_EMODEL);
    CHECK(err.code == SG_EMODEL && strstr(err.msg, name) != NULL);
}

static void test_check_refuses_losses_that_do_not_fit(void)
{
    const char *scce = "sparse_categorical_crossentropy", *cce = "categorical_crossentropy";
    const char *bce = "binary_crossentropy";
    check_refused((NnLoss){NN_LOSS_SPARSE_CE}, NN_ACT_SIGMOID, 3, scce);
    check_refused((NnLoss){NN_LOSS_CATEGORICAL_CE}, NN_ACT_SOFTMAX, 1, cce);
    check_refused((NnLoss){NN_LOSS_SPARSE_CE}, NN_ACT_NONE, 1, scce);
    check_refused((NnLoss){NN_LOSS_BINARY_CE}, NN_ACT_SOFTMAX, 2, bce);
    check_refused((NnLoss){NN_LOSS_BINARY_CE, 1}, NN_ACT_SIGMOID, 1, bce);
    check_refused((NnLoss){NN_LOSS_CATEGORICAL_CE, 1}, NN_ACT_SOFTMAX, 3, cce);
    check_refused((NnLoss){NN_LOSS_HUBER, .delta = 0.0f}, NN_ACT_NONE, 1, "huber");
    check_refused((NnLoss){NN_LOSS_HUBER, .delta = -1.0f}, NN_ACT_NONE, 1, "huber");
    check_refused((NnLoss){NN_LOSS_CATEGORICAL_CE, .label_smoothing = 1.5f}, NN_ACT_SOFTMAX, 3,
                  cce);
    check_refused((NnLoss){NN_LOSS_BINARY_CE, .label_smoothing = -0.1f}, NN_ACT_SIGMOID, 1, bce);
    check_refused((NnLoss){NN_LOSS_MSE}, NN_ACT_NONE, 0, "mean_squared_error");
    SgError err = {0};
    CHECK(nn_loss_check(&(NnLoss){NN_LOSS_COUNT}, NN_ACT_NONE, 1, &err) == SG_EMODEL);
    CHECK(nn_loss_ops(NN_LOSS_COUNT) == NULL && nn_loss_ops((NnLossKind)-1) == NULL);
    /* only the sparse cross-entropy takes integer labels */
    for (int kind = 0; kind < NN_LOSS_COUNT; kind++)
        CHECK(nn_loss_ops(kind)->sparse == (kind == NN_LOSS_SPARSE_CE));
}

int main(void)
{
    test_every_loss_and_head_matches_keras_and_finite_differences();
    test_cross_entropies_match_the_reference_kernels();
    test_known_values();
    test_rejects_out_of_range_label();
    test_rejects_non_finite_loss();
    test_bad_targets();
    test_check_refuses_losses_that_do_not_fit();
    return check_report("test_nn_loss");
}
