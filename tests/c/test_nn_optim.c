/* test_nn_optim.c - the Keras 3 additions to nn_optim against naive
 * references written out here: Adagrad (epsilon inside the square root, the
 * accumulator from its initial value), per-tensor norm clipping with a table
 * of tensors, the exponential, piecewise and ramped cosine schedules at their
 * boundaries, the configurations refused, and the row-wise step of an
 * Embedding table (optim_step_rows): Adagrad's equal to the dense step, lazy
 * Adam against SparseAdam's rule, bad tables refused. */
#include <math.h>
#include <string.h>

#include "check.h"
#include "nn/nn_optim.h"

#define N 12

static int close_to(double a, double b, double tol)
{
    return fabs(a - b) <= tol * (1.0 + fabs(b));
}

static void test_adagrad_matches_the_keras_rule(void)
{
    OptimConfig c;
    optim_config_default(&c, OPTIM_ADAGRAD);
    c.lr = 0.1f, c.eps = 1e-3f, c.init_accum = 0.2f;
    Optimizer *o = NULL;
    SgError err;
    CHECK(optim_create(&o, &c, N, &err) == 0);
    float p[N], g[N];
    double ref[N], acc[N];
    for (int i = 0; i < N; i++)
        p[i] = (float)(ref[i] = 0.1 * i - 0.5), acc[i] = 0.2;
    for (int t = 0; t < 4; t++) {
        for (int i = 0; i < N; i++) {
            g[i] = (float)((t * 7 + i * 5) % 11 - 5) / 4.0f;
            acc[i] += (double)g[i] * g[i];
            ref[i] -= 0.1 * g[i] / sqrt(acc[i] + 1e-3);
        }
        CHECK(optim_step(o, p, g, N, &err) == 0);
    }
    for (int i = 0; i < N; i++)
        CHECK(close_to(p[i], ref[i], 1e-6) && close_to(optim_state(o)[i], acc[i], 1e-6));
    CHECK(optim_state_size(o) == N);
    optim_free(o);
}

static void test_tensor_norm_clipping_is_per_tensor(void)
{
    OptimConfig c;
    optim_config_default(&c, OPTIM_SGD);
    c.lr = 1.0f, c.clip_tensor_norm = 1.0f;
    Optimizer *o = NULL;
    SgError err;
    CHECK(optim_create(&o, &c, N, &err) == 0);
    const size_t sizes[3] = {4, 3, 5}, bad[2] = {4, 3};
    CHECK(optim_set_tensors(o, bad, 2, &err) == SG_EINVAL && strstr(err.msg, "holds 12") != NULL);
    CHECK(optim_set_tensors(o, sizes, 3, &err) == 0);
    float p[N] = {0}, g[N];
    for (int i = 0; i < N; i++)
        g[i] = i < 4 ? 2.0f : (i < 7 ? 0.1f : -3.0f); /* norms 4, 0.17, 6.7 */
    CHECK(optim_step(o, p, g, N, &err) == 0);
    for (int i = 0; i < N; i++) {
        double norm = i < 4 ? 4.0 : (i < 7 ? sqrt(0.03) : sqrt(45.0));
        CHECK(close_to(p[i], -g[i] / fmax(norm, 1.0), 1e-6));
    }
    float lr;
    CHECK(optim_take_plain_sgd_step(o, N, &lr, &err) == 0); /* clipping: no folded step */
    optim_free(o);
    c.clip_norm = 1.0f; /* and global clipping with it: refused */
    CHECK(optim_create(&o, &c, N, &err) == SG_EINVAL && o == NULL && strstr(err.msg, "not both"));
}

static double lr_after(const OptimConfig *c, int t)
{
    Optimizer *o = NULL;
    SgError err;
    if (optim_create(&o, c, 0, &err) < 0)
        return -1.0;
    optim_set_state(o, t, NULL, 0, &err);
    double lr = optim_current_lr(o);
    optim_free(o);
    return lr;
}

static void test_schedules_at_their_boundaries(void)
{
    OptimConfig c;
    optim_config_default(&c, OPTIM_SGD);
    c.lr = 0.1f, c.schedule = LR_EXPONENTIAL, c.step_size = 4, c.gamma = 0.5f;
    for (int t = 0; t < 12; t++)
        CHECK(close_to(lr_after(&c, t), 0.1 * pow(0.5, t / 4.0), 1e-6));
    c.schedule = LR_PIECEWISE, c.npieces = 3;
    c.boundaries[0] = 3, c.boundaries[1] = 7;
    c.values[0] = 0.3f, c.values[1] = 0.1f, c.values[2] = 0.02f;
    const float want[9] = {0.3f, 0.3f, 0.3f, 0.3f, 0.1f, 0.1f, 0.1f, 0.1f, 0.02f};
    for (int t = 0; t < 9; t++)
        CHECK(lr_after(&c, t) == want[t]);
    c.boundaries[1] = 3; /* not increasing */
    CHECK(lr_after(&c, 0) < 0.0);
    optim_config_default(&c, OPTIM_SGD);
    c.lr = 0.2f, c.schedule = LR_COSINE, c.total_steps = 6, c.lr_min = 0.0f;
    c.warmup = WARMUP_RAMP, c.warmup_steps = 4, c.warmup_from = 0.01f;
    for (int t = 0; t < 14; t++) {
        double tt = t < 10 ? t : 10;
        double r = t < 4 ? 0.01 + 0.19 * t / 4.0 : 0.2 * 0.5 * (1.0 + cos(M_PI * (tt - 4.0) / 6.0));
        CHECK(close_to(lr_after(&c, t), r, 1e-6));
    }
}

/* A range [2 dense | table 4 x 2 | 2 dense]; the gradient of step t is zero
 * in the table outside rows ids[t]. */
#define ROWS_N 12
static const int32_t step_ids[3][2] = {{1, 3}, {3, -1}, {0, 1}};

static size_t rows_gradient(int t, float *g, OptimRows *tab)
{
    size_t nids = step_ids[t][1] < 0 ? 1 : 2;
    memset(g, 0, ROWS_N * sizeof *g);
    for (int i = 0; i < ROWS_N; i++) {
        int in_table = i >= 2 && i < 10, row = (i - 2) / 2;
        int live = !in_table || row == step_ids[t][0] || (nids == 2 && row == step_ids[t][1]);
        if (live)
            g[i] = (float)((t * 5 + i * 3) % 7 - 3) / 2.0f;
    }
    *tab = (OptimRows){2, 4, 2, step_ids[t], nids};
    return nids;
}

static void test_table_rows_adagrad_equal_dense_and_adam_is_lazy(void)
{
    OptimConfig c;
    optim_config_default(&c, OPTIM_ADAGRAD);
    c.lr = 0.1f, c.init_accum = 0.1f;
    Optimizer *sparse = NULL, *dense = NULL, *adam = NULL;
    SgError err;
    CHECK(optim_create(&sparse, &c, ROWS_N, &err) == 0 &&
          optim_create(&dense, &c, ROWS_N, &err) == 0);
    optim_config_default(&c, OPTIM_ADAM);
    c.lr = 0.05f, c.eps = 1e-3f;
    CHECK(optim_create(&adam, &c, ROWS_N, &err) == 0 && optim_sparse_rows(adam));
    float ps[ROWS_N], pd[ROWS_N], pa[ROWS_N], g[ROWS_N];
    double ref[ROWS_N], m[ROWS_N] = {0}, v[ROWS_N] = {0};
    for (int i = 0; i < ROWS_N; i++)
        ps[i] = pd[i] = pa[i] = (float)(ref[i] = 0.1 * i - 0.4);
    for (int t = 0; t < 3; t++) {
        OptimRows tab;
        rows_gradient(t, g, &tab);
        CHECK(optim_step_rows(sparse, ps, g, ROWS_N, &tab, 1, NULL, 0, &err) == 0);
        CHECK(optim_step(dense, pd, g, ROWS_N, &err) == 0);
        CHECK(optim_step_rows(adam, pa, g, ROWS_N, &tab, 1, NULL, 0, &err) == 0);
        const double step = 0.05 * sqrt(1.0 - pow(0.999, t + 1)) / (1.0 - pow(0.9, t + 1));
        for (int i = 0; i < ROWS_N; i++) {
            int in_table = i >= 2 && i < 10, row = (i - 2) / 2;
            int touched = row == tab.ids[0] || (tab.nids == 2 && row == tab.ids[1]);
            if (in_table && !touched)
                continue;    /* lazy: untouched rows and their moments stay */
            if (!in_table) { /* the dense stretches: torch.optim.Adam's rule */
                m[i] = 0.9 * m[i] + 0.1 * g[i];
                v[i] = 0.999 * v[i] + 0.001 * (double)g[i] * g[i];
                ref[i] -= 0.05 / (1.0 - pow(0.9, t + 1)) * m[i] /
                          (sqrt(v[i]) / sqrt(1.0 - pow(0.999, t + 1)) + 1e-3);
                continue;
            }
            m[i] += (g[i] - m[i]) * 0.1; /* SparseAdam's */
            v[i] += ((double)g[i] * g[i] - v[i]) * 0.001;
            ref[i] -= step * m[i] / (sqrt(v[i]) + 1e-3);
        }
    }
    for (int i = 0; i < ROWS_N; i++)
        CHECK(ps[i] == pd[i] && close_to(pa[i], ref[i], 1e-5));
    /* table row 2 was never touched: its moments are zero */
    CHECK(optim_state(adam)[2 + 2 * 2] == 0.0f && optim_state(adam)[ROWS_N + 2 + 2 * 2] == 0.0f);
    const int32_t unsorted[2] = {3, 1}, outside[1] = {4};
    OptimRows bad = {2, 4, 2, unsorted, 2};
    CHECK(optim_step_rows(adam, pa, g, ROWS_N, &bad, 1, NULL, 0, &err) == SG_EINVAL &&
          strstr(err.msg, "out of order") != NULL);
    bad = (OptimRows){2, 4, 2, outside, 1};
    CHECK(optim_step_rows(adam, pa, g, ROWS_N, &bad, 1, NULL, 0, &err) == SG_EINVAL);
    bad = (OptimRows){6, 4, 2, unsorted + 1, 1};
    CHECK(optim_step_rows(adam, pa, g, ROWS_N, &bad, 1, NULL, 0, &err) == SG_EINVAL &&
          strstr(err.msg, "outside the 12 parameters") != NULL);
    optim_free(sparse);
    optim_free(dense);
    optim_free(adam);
}

int main(void)
{
    test_adagrad_matches_the_keras_rule();
    test_tensor_norm_clipping_is_per_tensor();
    test_schedules_at_their_boundaries();
    test_table_rows_adagrad_equal_dense_and_adam_is_lazy();
    return check_report("test_nn_optim");
}
