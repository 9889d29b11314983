/*
 * test_nn_metric.c - the metric table (nn_metric.h): the accuracies,
 * precision, recall and the error means on hand-computed batches, with and
 * without sample weights; AUC (ROC and PR) at its extremes and against a
 * brute-force Keras AUC written out here; logits against their sigmoids;
 * states that combine by addition; and the configurations refused.
 * Exits non-zero on any mismatch.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "nn/nn_loss.h"
#include "nn/nn_metric.h"
#include "nn/nn_ref.h"

/* uniform in [lo, hi) */
static float urand(uint64_t *s, float lo, float hi)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return lo + (hi - lo) * (float)((*s >> 40) * (1.0 / 16777216.0));
}

static int close_to(double a, double b, double tol)
{
    return fabs(a - b) <= tol;
}

/* the metric of one batch, from a fresh state */
static double value(const NnMetric *m, const NnOutputs *o)
{
    double *s = calloc(nn_metric_state_size(m), sizeof(double));
    nn_metric_update(m, s, o);
    const double v = nn_metric_result(m, s);
    free(s);
    return v;
}

/* ---- accuracies --------------------------------------------------------------- */

static void test_accuracies_on_a_hand_computed_batch(void)
{
    /* argmax 1, 0, 2 and 0 (a tie goes to the first, as Keras' argmax) */
    float out[4 * 3] = {0.1f, 0.7f, 0.2f, 0.5f, 0.2f, 0.3f, 0.2f, 0.2f, 0.6f, 0.3f, 0.3f, 0.3f};
    const int32_t labels[4] = {1, 2, 2, 0}; /* hits: 1, 0, 1, 1 */
    const float onehot[4 * 3] = {0, 1, 0, 0, 0, 1, 0, 0, 1, 1, 0, 0};
    const float soft[4 * 3] = {0.2f, 0.5f, 0.3f, 0.1f, 0.3f,  0.6f,
                               0.0f, 0.4f, 0.6f, 0.5f, 0.25f, 0.25f};
    const float w[4] = {1.0f, 2.0f, 0.5f, 1.5f}; /* (1 + 0.5 + 1.5) / 5 */
    const NnMetric sparse = {NN_METRIC_SPARSE_ACCURACY}, cat = {NN_METRIC_CATEGORICAL_ACCURACY};
    for (int weighted = 0; weighted <= 1; weighted++) {
        const float *ws = weighted ? w : NULL;
        const double want = weighted ? 0.6 : 0.75;
        const NnOutputs by_label = {4, 3, NN_ACT_SOFTMAX, NULL, out, labels, NULL, ws};
        const NnOutputs by_onehot = {4, 3, NN_ACT_SOFTMAX, NULL, out, NULL, onehot, ws};
        const NnOutputs by_soft = {4, 3, NN_ACT_SOFTMAX, NULL, out, NULL, soft, ws};
        CHECK(close_to(value(&sparse, &by_label), want, 1e-15));
        CHECK(close_to(value(&cat, &by_label), want, 1e-15));
        CHECK(close_to(value(&cat, &by_onehot), want, 1e-15));
        CHECK(close_to(value(&cat, &by_soft), want, 1e-15)); /* the argmax of the target */
    }
}

/* the accuracies agree with the reference kernel accuracy_count (nn_ref.h) */
static void test_accuracies_match_the_reference_count(void)
{
    enum { B = 50, K = 5 };
    uint64_t seed = 0xacc;
    float out[B * K], onehot[B * K] = {0};
    int32_t labels[B];
    for (int i = 0; i < B * K; i++)
        out[i] = urand(&seed, -2.0f, 2.0f);
    for (int b = 0; b < B; b++) {
        labels[b] = (int32_t)urand(&seed, 0.0f, (float)K) % K;
        onehot[b * K + labels[b]] = 1.0f;
    }
    const NnOutputs sparse = {B, K, NN_ACT_NONE, NULL, out, labels, NULL, NULL};
    const NnOutputs dense = {B, K, NN_ACT_NONE, NULL, out, NULL, onehot, NULL};
    const NnMetric sa = {NN_METRIC_SPARSE_ACCURACY}, ca = {NN_METRIC_CATEGORICAL_ACCURACY};
    CHECK(value(&sa, &sparse) == accuracy_count(out, labels, NULL, B, K) / (double)B);
    CHECK(value(&ca, &dense) == accuracy_count(out, NULL, onehot, B, K) / (double)B);
}

/* ---- thresholded metrics and error means ---------------------------------------- */

/* out [[0.2, 0.6, 0.7], [0.9, 0.5, 0.71]] against [[0, 1, 1], [1, 1, 0]],
 * weights 1 and 3. At 0.5 (strictly above) the predictions are
 * [[0, 1, 1], [1, 0, 1]]: rows right 3/3 and 1/3; tp 3, fp 1, fn 1, or
 * weighted tp 1+1+3, fp 3, fn 3. At 0.7 (0.7 itself is not above) they are
 * [[0, 0, 0], [1, 0, 1]]: rows 1/3 and 1/3; tp 1, fp 1, fn 3, or weighted
 * tp 3, fp 3, fn 1+1+3. */
static void test_thresholded_metrics_on_a_hand_computed_batch(void)
{
    const float out[2 * 3] = {0.2f, 0.6f, 0.7f, 0.9f, 0.5f, 0.71f};
    const float t[2 * 3] = {0, 1, 1, 1, 1, 0}, w[2] = {1.0f, 3.0f};
    const struct {
        float threshold;
        double acc, acc_w, prec, prec_w, rec, rec_w;
    } want[2] = {
        {0.5f, 2.0 / 3.0, 0.5, 0.75, 5.0 / 8.0, 0.75, 5.0 / 8.0},
        {0.7f, 1.0 / 3.0, 1.0 / 3.0, 0.5, 0.5, 0.25, 3.0 / 8.0},
    };
    for (int i = 0; i < 2; i++)
        for (int weighted = 0; weighted <= 1; weighted++) {
            const NnOutputs o = {2,    3, NN_ACT_SIGMOID,     NULL, (float *)out,
                                 NULL, t, weighted ? w : NULL};
            const float thr = want[i].threshold;
            const NnMetric acc = {NN_METRIC_BINARY_ACCURACY, thr};
            const NnMetric prec = {NN_METRIC_PRECISION, thr}, rec = {NN_METRIC_RECALL, thr};
            CHECK(close_to(value(&acc, &o), weighted ? want[i].acc_w : want[i].acc, 1e-15));
            CHECK(close_to(value(&prec, &o), weighted ? want[i].prec_w : want[i].prec, 1e-15));
            CHECK(close_to(value(&rec, &o), weighted ? want[i].rec_w : want[i].rec, 1e-15));
        }
}

/* out [[1, 2], [0, -1]] against [[0, 4], [0.5, -1]]: squared errors 1, 4
 * and 0.25, 0 (row means 2.5 and 0.125), absolute 1, 2 and 0.5, 0 (1.5 and
 * 0.25); weights 1 and 3. */
static void test_error_means_on_a_hand_computed_batch(void)
{
    float out[2 * 2] = {1.0f, 2.0f, 0.0f, -1.0f};
    const float t[2 * 2] = {0.0f, 4.0f, 0.5f, -1.0f}, w[2] = {1.0f, 3.0f};
    const NnMetric mse = {NN_METRIC_MSE}, mae = {NN_METRIC_MAE}, rmse = {NN_METRIC_RMSE};
    const NnOutputs o = {2, 2, NN_ACT_NONE, NULL, out, NULL, t, NULL};
    const NnOutputs ow = {2, 2, NN_ACT_NONE, NULL, out, NULL, t, w};
    CHECK(value(&mse, &o) == (2.5 + 0.125) / 2);
    CHECK(value(&mae, &o) == (1.5 + 0.25) / 2);
    CHECK(value(&rmse, &o) == sqrt((2.5 + 0.125) / 2));
    CHECK(value(&mse, &ow) == (2.5 + 3 * 0.125) / 4);
    CHECK(value(&mae, &ow) == (1.5 + 3 * 0.25) / 4);
    CHECK(value(&rmse, &ow) == sqrt((2.5 + 3 * 0.125) / 4));
}

/* with nothing seen (or only weights 0), every result is 0, not NaN */
static void test_empty_states_give_zero(void)
{
    float out[2] = {0.3f, 0.8f}, t[2] = {0.0f, 1.0f}, w[1] = {0.0f};
    const NnOutputs o = {1, 2, NN_ACT_NONE, NULL, out, NULL, t, w};
    for (int kind = 0; kind < NN_METRIC_COUNT; kind++) {
        const NnMetric m = {kind, 0.5f, 200, 0, 0};
        double *s = calloc(nn_metric_state_size(&m), sizeof(double));
        CHECK(nn_metric_result(&m, s) == 0.0);
        if (kind != NN_METRIC_SPARSE_ACCURACY) { /* it needs labels */
            nn_metric_update(&m, s, &o);
            CHECK(nn_metric_result(&m, s) == 0.0);
        }
        free(s);
    }
}

/* ---- AUC ----------------------------------------------------------------------------- */

/*
 * Keras' AUC by brute force: its thresholds -eps, 1/(n-1), ..., (n-2)/(n-1),
 * 1+eps (eps 1e-7), computed in double and cast to the metric's float32 as
 * Keras does; a prediction counts at every threshold it is strictly above,
 * float32 against float32; the counts (tp, fp, fn each accumulated as such)
 * and the area in double. ROC: the trapezoids between consecutive
 * (fpr, tpr); PR: Keras' interpolate_pr_auc (Davis & Goadrich).
 * pred, truth: [N]; w: [N] or NULL.
 */
static double ref_auc(const float *pred, const float *truth, const float *w, int N, int n, int pr)
{
    double *tp = calloc(n, sizeof(double)), *fp = calloc(n, sizeof(double));
    double *fn = calloc(n, sizeof(double)), *tn = calloc(n, sizeof(double));
    for (int i = 0; i < n; i++) {
        const float t = (float)(i == 0       ? 0.0 - 1e-7
                                : i == n - 1 ? 1.0 + 1e-7
                                             : (double)i / (n - 1));
        for (int e = 0; e < N; e++) {
            const double we = w ? w[e] : 1.0;
            const int above = pred[e] > t, pos = truth[e] != 0.0f;
            tp[i] += pos && above ? we : 0.0;
            fp[i] += !pos && above ? we : 0.0;
            fn[i] += pos && !above ? we : 0.0;
            tn[i] += !pos && !above ? we : 0.0;
        }
    }
    double auc = 0.0;
    for (int i = 0; i + 1 < n; i++) {
        if (pr) {
            const double dtp = tp[i] - tp[i + 1], p0 = tp[i] + fp[i], p1 = tp[i + 1] + fp[i + 1];
            const double dp = fmax(p0 - p1, 0.0);
            const double slope = dp != 0.0 ? dtp / dp : 0.0;
            const double intercept = tp[i + 1] - slope * p1;
            const double ratio = p0 > 0.0 && p1 > 0.0 ? p0 / p1 : 1.0;
            const double den = fmax(tp[i + 1] + fn[i + 1], 0.0);
            auc += den != 0.0 ? slope * (dtp + intercept * log(ratio)) / den : 0.0;
        } else {
            const double P = tp[i] + fn[i], N_ = fp[i] + tn[i]; /* the same at every i */
            const double tpr0 = P != 0.0 ? tp[i] / P : 0.0, tpr1 = P != 0.0 ? tp[i + 1] / P : 0.0;
            const double fpr0 = N_ != 0.0 ? fp[i] / N_ : 0.0;
            const double fpr1 = N_ != 0.0 ? fp[i + 1] / N_ : 0.0;
            auc += (fpr0 - fpr1) * (tpr0 + tpr1) / 2.0;
        }
    }
    free(tp), free(fp), free(fn), free(tn);
    return auc;
}

static double auc_of(int n, int pr, int from_logits, const float *pred, const float *truth,
                     const float *w, int B, int K)
{
    const NnMetric m = {NN_METRIC_AUC, 0.5f, n, pr, from_logits};
    const NnOutputs o = {B, K, NN_ACT_SIGMOID, NULL, (float *)pred, NULL, truth, w};
    return value(&m, &o);
}

static const int NUM_THRESHOLDS[] = {200, 11, 3, 2};

static void test_auc_extremes(void)
{
    /* perfect separation: every negative below every positive */
    const float sep[6] = {0.1f, 0.2f, 0.35f, 0.8f, 0.9f, 0.95f}, sep_t[6] = {0, 0, 0, 1, 1, 1};
    const float w[6] = {0.5f, 2.0f, 1.0f, 3.0f, 0.25f, 1.0f};
    /* every prediction equal: ROC 0.5 (the chance diagonal), PR the weight
     * share of the positives (one segment: precision = that share) */
    const float flat[6] = {0.4f, 0.4f, 0.4f, 0.4f, 0.4f, 0.4f}, flat_t[6] = {1, 0, 0, 1, 0, 1};
    const float none_t[6] = {0}; /* no positives: tpr and precision 0 throughout */
    for (size_t j = 0; j < 2; j++) {
        const int n = NUM_THRESHOLDS[j];
        for (int weighted = 0; weighted <= 1; weighted++) {
            const float *ws = weighted ? w : NULL;
            const double share = weighted ? (0.5 + 3.0 + 1.0) / 7.75 : 0.5;
            CHECK(close_to(auc_of(n, 0, 0, sep, sep_t, ws, 6, 1), 1.0, 1e-12));
            CHECK(close_to(auc_of(n, 1, 0, sep, sep_t, ws, 6, 1), 1.0, 1e-12));
            CHECK(close_to(auc_of(n, 0, 0, flat, flat_t, ws, 3, 2), 0.5, 1e-12));
            CHECK(close_to(auc_of(n, 1, 0, flat, flat_t, ws, 6, 1), share, 1e-12));
            CHECK(auc_of(n, 0, 0, sep, none_t, ws, 6, 1) == 0.0);
            CHECK(auc_of(n, 1, 0, sep, none_t, ws, 6, 1) == 0.0);
        }
    }
}

/*
 * Random predictions in [0, 1], with the exact values 0, 1, 0.5 and
 * thresholds i/(n-1) among them, against ref_auc to 1e-9.
 *
 * Keras buckets evenly spaced thresholds as nn_metric.c does, with
 * ceil(p * (n-1)) - 1 in float32. For a few thresholds (n = 200: i = 31,
 * 53, 62, 103, 106, 111, 119, 124) float32(i/(n-1)) * (n-1) rounds up past
 * i, so a prediction equal to the threshold counts as above it, where the
 * comparison with the float32 threshold says not; the grid values here
 * leave those out (test_auc_bucket_of_a_threshold_value pins them).
 */
static float grid_value(uint64_t *s, int n)
{
    for (;;) {
        const int i = (int)urand(s, 0.0f, (float)n) % n;
        const float p = (float)((double)i / (n - 1));
        if (p * (float)(n - 1) == (float)i)
            return p;
    }
}

static void test_auc_matches_brute_force_keras(void)
{
    enum { B = 60, K = 2, N = B * K };
    uint64_t seed = 0xa0c;
    float pred[N], truth[N], w[B], we[N];
    for (size_t j = 0; j < sizeof NUM_THRESHOLDS / sizeof NUM_THRESHOLDS[0]; j++) {
        const int n = NUM_THRESHOLDS[j];
        for (int round = 0; round < 4; round++) {
            for (int e = 0; e < N; e++) {
                const float r = urand(&seed, 0.0f, 1.0f);
                pred[e] = r < 0.1f    ? 0.0f
                          : r < 0.2f  ? 1.0f
                          : r < 0.3f  ? 0.5f
                          : r < 0.45f ? grid_value(&seed, n)
                                      : urand(&seed, 0.0f, 1.0f);
                truth[e] = urand(&seed, 0.0f, 1.0f) < 0.4f ? 1.0f : 0.0f;
            }
            for (int b = 0; b < B; b++)
                w[b] = b == 7 ? 0.0f : urand(&seed, 0.0f, 2.0f);
            for (int e = 0; e < N; e++)
                we[e] = w[e / K];
            for (int pr = 0; pr <= 1; pr++) {
                const double got = auc_of(n, pr, 0, pred, truth, NULL, B, K);
                const double got_w = auc_of(n, pr, 0, pred, truth, w, B, K);
                CHECK(close_to(got, ref_auc(pred, truth, NULL, N, n, pr), 1e-9));
                CHECK(close_to(got_w, ref_auc(pred, truth, we, N, n, pr), 1e-9));
                CHECK(got > 0.2 && got < 0.8); /* random: neither 0 nor 1 */
            }
        }
    }
}

/* a prediction equal to float32(31/199) falls above threshold 31 of 200, as
 * in Keras (see test_auc_matches_brute_force_keras); 0, 0.5 and 1 land in
 * the buckets their thresholds say */
static void test_auc_bucket_of_a_threshold_value(void)
{
    const struct {
        int n;
        float p;
        int bucket;
    } cases[] = {
        {200, (float)(31.0 / 199), 31},
        {200, (float)(30.0 / 199), 29},
        {200, 0.0f, 0},
        {200, 0.5f, 99},
        {200, 1.0f, 198},
        {11, 0.5f, 4},
        {11, 0.3f, 2},
        {2, 0.0f, 0},
        {2, 1.0f, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        const NnMetric m = {NN_METRIC_AUC, 0.5f, cases[c].n};
        const float t = 1.0f;
        const NnOutputs o = {1, 1, NN_ACT_SIGMOID, NULL, (float *)&cases[c].p, NULL, &t, NULL};
        double s[400] = {0};
        nn_metric_update(&m, s, &o);
        for (int i = 0; i < 2 * cases[c].n; i++)
            CHECK(s[i] == (i == cases[c].bucket));
    }
}

/* AUC, precision and recall of logits with from_logits equal those of their
 * sigmoids (the sigmoid head of nn_loss.h) without, state for state */
static void test_from_logits_equals_sigmoid_outputs(void)
{
    enum { B = 40, K = 2, N = B * K };
    uint64_t seed = 0x1061;
    float z[N], sig[N], truth[N], w[B];
    for (int e = 0; e < N; e++) {
        const float r = urand(&seed, 0.0f, 1.0f);
        z[e] = r < 0.1f ? 0.0f : r < 0.15f ? 40.0f : r < 0.2f ? -40.0f : urand(&seed, -6.0f, 6.0f);
        truth[e] = urand(&seed, 0.0f, 1.0f) < 0.5f ? 1.0f : 0.0f;
    }
    for (int b = 0; b < B; b++)
        w[b] = urand(&seed, 0.0f, 2.0f);
    nn_head_forward(&(NnOutputs){B, K, NN_ACT_SIGMOID, z, sig});
    const NnMetric ms[] = {
        {NN_METRIC_AUC, 0.5f, 200, 0}, {NN_METRIC_AUC, 0.5f, 200, 1}, {NN_METRIC_AUC, 0.5f, 11, 0},
        {NN_METRIC_AUC, 0.5f, 11, 1},  {NN_METRIC_PRECISION, 0.5f},   {NN_METRIC_PRECISION, 0.3f},
        {NN_METRIC_RECALL, 0.5f},      {NN_METRIC_RECALL, 0.8f},
    };
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++)
        for (int weighted = 0; weighted <= 1; weighted++) {
            NnMetric logits = ms[i];
            logits.from_logits = 1;
            const NnOutputs ol = {B, K, NN_ACT_NONE, z, z, NULL, truth, weighted ? w : NULL};
            const NnOutputs os = {B, K, NN_ACT_SIGMOID, z, sig, NULL, truth, weighted ? w : NULL};
            const size_t n = nn_metric_state_size(&ms[i]);
            double *a = calloc(n, sizeof(double)), *b = calloc(n, sizeof(double));
            nn_metric_update(&logits, a, &ol);
            nn_metric_update(&ms[i], b, &os);
            CHECK(memcmp(a, b, n * sizeof(double)) == 0);
            CHECK(nn_metric_result(&logits, a) == nn_metric_result(&ms[i], b));
            free(a), free(b);
        }
}

/* ---- combining states ---------------------------------------------------------------- */

/* a batch's state equals the element-wise sum of its two halves' states
 * (4 and 6 rows), for every metric, to 1e-12 relative */
static void test_states_combine_by_addition(void)
{
    enum { B = 10, K = 3, N = B * K, B1 = 4 };
    uint64_t seed = 0xadd;
    float out[N], t[N], w[B];
    int32_t labels[B];
    for (int e = 0; e < N; e++) {
        out[e] = urand(&seed, 0.0f, 1.0f);
        t[e] = urand(&seed, 0.0f, 1.0f) < 0.5f ? 1.0f : 0.0f;
    }
    for (int b = 0; b < B; b++)
        labels[b] = (int32_t)urand(&seed, 0.0f, (float)K) % K, w[b] = urand(&seed, 0.0f, 2.0f);
    const NnMetric ms[] = {
        {NN_METRIC_SPARSE_ACCURACY},
        {NN_METRIC_CATEGORICAL_ACCURACY},
        {NN_METRIC_BINARY_ACCURACY, 0.5f},
        {NN_METRIC_AUC, 0.5f, 200, 0},
        {NN_METRIC_AUC, 0.5f, 11, 1},
        {NN_METRIC_AUC, 0.5f, 200, 1, 1},
        {NN_METRIC_PRECISION, 0.5f},
        {NN_METRIC_RECALL, 0.3f},
        {NN_METRIC_MSE},
        {NN_METRIC_MAE},
        {NN_METRIC_RMSE},
    };
    int kinds_seen = 0;
    for (size_t i = 0; i < sizeof ms / sizeof ms[0]; i++) {
        kinds_seen |= 1 << ms[i].kind;
        for (int weighted = 0; weighted <= 1; weighted++) {
            const int sparse = ms[i].kind == NN_METRIC_SPARSE_ACCURACY;
            const int32_t *lab = sparse ? labels : NULL;
            const float *tg = sparse ? NULL : t, *ws = weighted ? w : NULL;
            const NnOutputs all = {B, K, NN_ACT_NONE, NULL, out, lab, tg, ws};
            const NnOutputs h1 = {B1, K, NN_ACT_NONE, NULL, out, lab, tg, ws};
            NnOutputs h2 = {B - B1, K, NN_ACT_NONE, NULL, out + B1 * K};
            h2.labels = lab ? lab + B1 : NULL;
            h2.targets = tg ? tg + B1 * K : NULL;
            h2.weights = ws ? ws + B1 : NULL;
            const size_t n = nn_metric_state_size(&ms[i]);
            double *sa = calloc(n, sizeof(double)), *s1 = calloc(n, sizeof(double));
            double *s2 = calloc(n, sizeof(double));
            nn_metric_update(&ms[i], sa, &all);
            nn_metric_update(&ms[i], s1, &h1);
            nn_metric_update(&ms[i], s2, &h2);
            for (size_t j = 0; j < n; j++) {
                CHECK(close_to(sa[j], s1[j] + s2[j], 1e-12 * fmax(1.0, fabs(sa[j]))));
                s1[j] += s2[j];
            }
            const double r = nn_metric_result(&ms[i], sa);
            CHECK(close_to(nn_metric_result(&ms[i], s1), r, 1e-12 * fmax(1.0, fabs(r))));
            CHECK(r > 0.0);
            free(sa), free(s1), free(s2);
        }
    }
    CHECK(kinds_seen == (1 << NN_METRIC_COUNT) - 1);
}

/* ---- refusals ----------------------------------------------------------------------- */

static void check_refused(NnMetric m, int K, int sparse, const char *name)
{
    SgError err = {0};
    CHECK(nn_metric_check(&m, K, sparse, &err) == SG_EMODEL);
    CHECK(err.code == SG_EMODEL && strstr(err.msg, name) != NULL);
}

static void test_check_refuses_metrics_that_do_not_fit(void)
{
    check_refused((NnMetric){NN_METRIC_SPARSE_ACCURACY}, 3, 0, "sparse_categorical_accuracy");
    check_refused((NnMetric){NN_METRIC_SPARSE_ACCURACY}, 1, 1, "sparse_categorical_accuracy");
    check_refused((NnMetric){NN_METRIC_CATEGORICAL_ACCURACY}, 1, 0, "categorical_accuracy");
    check_refused((NnMetric){NN_METRIC_AUC, .num_thresholds = 1}, 1, 0, "auc");
    check_refused((NnMetric){NN_METRIC_AUC, .num_thresholds = 0}, 1, 0, "auc");
    check_refused((NnMetric){NN_METRIC_AUC, .num_thresholds = -5}, 1, 0, "auc");
    SgError err = {0};
    CHECK(nn_metric_check(&(NnMetric){NN_METRIC_COUNT}, 2, 0, &err) == SG_EMODEL);
    CHECK(nn_metric_ops(NN_METRIC_COUNT) == NULL && nn_metric_ops((NnMetricKind)-1) == NULL);
    /* and accepts what fits */
    CHECK(nn_metric_check(&(NnMetric){NN_METRIC_SPARSE_ACCURACY}, 2, 1, &err) == 0);
    CHECK(nn_metric_check(&(NnMetric){NN_METRIC_CATEGORICAL_ACCURACY}, 2, 1, &err) == 0);
    CHECK(nn_metric_check(&(NnMetric){NN_METRIC_BINARY_ACCURACY, 0.5f}, 1, 0, &err) == 0);
    CHECK(nn_metric_check(&(NnMetric){NN_METRIC_AUC, 0.5f, 2}, 1, 0, &err) == 0);
    CHECK(nn_metric_check(&(NnMetric){NN_METRIC_MSE}, 1, 1, &err) == 0);
}

/* nn_metric.c: "NaN stays: bucket 0" */
static void test_auc_puts_a_nan_prediction_in_bucket_0(void)
{
    const NnMetric m = {NN_METRIC_AUC, 0.5f, 11};
    float p[2] = {NAN, 0.5f};
    const float t[2] = {1.0f, 0.0f};
    const NnOutputs o = {2, 1, NN_ACT_SIGMOID, NULL, p, NULL, t, NULL};
    double s[22] = {0};
    nn_metric_update(&m, s, &o);
    CHECK(s[0] == 1.0 && s[10] == 0.0); /* the positive, NaN */
    CHECK(s[11 + 4] == 1.0);            /* the negative, 0.5: above thresholds 0..4 */
}

int main(void)
{
    test_accuracies_on_a_hand_computed_batch();
    test_accuracies_match_the_reference_count();
    test_thresholded_metrics_on_a_hand_computed_batch();
    test_error_means_on_a_hand_computed_batch();
    test_empty_states_give_zero();
    test_auc_extremes();
    test_auc_matches_brute_force_keras();
    test_auc_bucket_of_a_threshold_value();
    test_from_logits_equals_sigmoid_outputs();
    test_states_combine_by_addition();
    test_check_refuses_metrics_that_do_not_fit();
    test_auc_puts_a_nan_prediction_in_bucket_0(); /* last: UB in nn_metric.c today */
    return check_report("test_nn_metric");
}
