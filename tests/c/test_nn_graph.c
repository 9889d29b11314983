/*
 * test_nn_graph.c - models as graphs: a DAG with two inputs, a tensor read
 * by several layers (its gradient summed), Add, Concatenate, Reshape, Dense
 * on an input of rank 3, and two outputs with their own losses and loss
 * weights. Every parameter's gradient against central finite differences of
 * the loss (in double over the model's own float forward), the folded SGD
 * update against gradient-then-update on the same graph, prediction against
 * evaluation, the declaration errors naming layers and shapes, and
 * BatchNormalization and LayerNormalization (their gradients against finite
 * differences of the training loss; the state buffer moved by training
 * only), and the merges Subtract, Multiply, Average, Maximum, Minimum and
 * Dot (with normalize) between Dense towers likewise.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "nn/nn_model_impl.h"

enum { B = 6 };

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) & 0xffffff) / (float)0x1000000 - 0.5f;
}

static NnNode node(LayerKind kind, int units, NnAct act, int n, int a, int b)
{
    NnNode nd;
    memset(&nd, 0, sizeof nd);
    nd.spec.kind = kind;
    nd.spec.units = units;
    nd.spec.act = act;
    nd.ninputs = n;
    nd.inputs[0] = a;
    nd.inputs[1] = b;
    nd.shares = -1;
    return nd;
}

/* Tensors: 0 a [1,1,4], 1 b [2,3,2]; node k writes tensor 2 + k.
 *   n0 Dense(5, tanh)(a)        -> 2   read by n1, n2, n7 (three gradients summed)
 *   n1 Dense(5, tanh)(2)        -> 3
 *   n2 Add(2, 3)                -> 4   read by n5 and n7
 *   n3 Dense(3, tanh)(b)        -> 5   [2,3,3]: Dense on the last axis
 *   n4 Reshape(5 -> 1x1x18)     -> 6
 *   n5 Concatenate(4, 6)        -> 7   [1,1,23]
 *   n6 Dense(2)(7)              -> 8   output 0: MSE, weight 0.5
 *   n7 Dense(3, softmax)(4)     -> 9   output 1: sparse CE, weight 2 */
static Model *make_graph(SgError *err)
{
    NnShape in[2] = {{1, 1, 4}, {2, 3, 2}};
    NnNode nodes[8] = {
        node(LAYER_DENSE, 5, NN_ACT_TANH, 1, 0, 0),
        node(LAYER_DENSE, 5, NN_ACT_TANH, 1, 2, 0),
        node(LAYER_ADD, 0, NN_ACT_NONE, 2, 2, 3),
        node(LAYER_DENSE, 3, NN_ACT_TANH, 1, 1, 0),
        node(LAYER_RESHAPE, 0, NN_ACT_NONE, 1, 5, 0),
        node(LAYER_CONCATENATE, 0, NN_ACT_NONE, 2, 4, 6),
        node(LAYER_DENSE, 2, NN_ACT_NONE, 1, 7, 0),
        node(LAYER_DENSE, 3, NN_ACT_SOFTMAX, 1, 4, 0),
    };
    nodes[4].spec.shape[0] = 1, nodes[4].spec.shape[1] = 1, nodes[4].spec.shape[2] = 18;
    int outs[2] = {8, 9};
    Model *m = NULL;
    if (model_create_graph(&m, in, 2, nodes, 8, outs, 2, err) < 0)
        return NULL;
    NnLoss mse = {NN_LOSS_MSE, 0, 0.0f, 1.0f}, sce = {NN_LOSS_SPARSE_CE, 0, 0.0f, 1.0f};
    if (model_set_output_loss(m, 0, &mse, 0.5f, err) < 0 ||
        model_set_output_loss(m, 1, &sce, 2.0f, err) < 0) {
        model_free(m);
        return NULL;
    }
    model_init_params(m, 11);
    uint64_t s = 5;
    for (size_t i = 0; i < m->nparams; i++) /* non-zero biases */
        if (m->params[i] == 0.0f)
            m->params[i] = 0.2f * frand(&s);
    return m;
}

typedef struct Batch {
    float a[B * 4], b[B * 12], y0[B * 2];
    int32_t y1[B];
    NnData d;
} Batch;

static void make_batch(Batch *bt)
{
    uint64_t s = 99;
    for (int i = 0; i < B * 4; i++)
        bt->a[i] = 2.0f * frand(&s);
    for (int i = 0; i < B * 12; i++)
        bt->b[i] = 2.0f * frand(&s);
    for (int i = 0; i < B * 2; i++)
        bt->y0[i] = frand(&s);
    for (int i = 0; i < B; i++)
        bt->y1[i] = i % 3;
    memset(&bt->d, 0, sizeof bt->d);
    bt->d.n = B;
    bt->d.ninputs = 2;
    bt->d.inputs[0] = (NnArray){NN_F32, bt->a, 4};
    bt->d.inputs[1] = (NnArray){NN_F32, bt->b, 12};
    bt->d.ntargets = 2;
    bt->d.targets[0] = (NnArray){NN_F32, bt->y0, 2};
    bt->d.targets[1] = (NnArray){NN_I32, bt->y1, 1};
}

/* The mean loss of the batch at the current parameters (the training loss:
 * sum over outputs of weight * mean). */
static double loss_at(Model *m, const NnData *d)
{
    SgError err = {0};
    NnStats st = {0};
    CHECK(model_evaluate(m, d, B, &st, &err) == 0);
    return st.loss_sum / B;
}

typedef double (*LossAt)(Model *m, const NnData *d);
static double train_loss_at(Model *m, const NnData *d);

/* The worst relative error of m->grads (from a training batch just run)
 * against central differences of loss_fn over every parameter. */
static double worst_error_of(Model *m, const NnData *d, LossAt loss_fn)
{
    float *g = malloc(m->nparams * sizeof(float));
    memcpy(g, m->grads, m->nparams * sizeof(float));
    const float eps = 1e-2f;
    double worst = 0.0;
    size_t at = 0;
    for (size_t i = 0; i < m->nparams; i++) {
        const float w = m->params[i];
        m->params[i] = w + eps;
        double up = loss_fn(m, d);
        m->params[i] = w - eps;
        double down = loss_fn(m, d);
        m->params[i] = w;
        double num = (up - down) / (2.0 * eps);
        double e = fabs(num - g[i]) / (fabs(num) + fabs(g[i]) + 1e-2);
        if (e > worst)
            worst = e, at = i;
    }
    if (worst > 2e-2)
        fprintf(stderr, "gradient %zu: relative error %g\n", at, worst);
    free(g);
    return worst;
}

static double worst_gradient_error(Model *m, const NnData *d)
{
    return worst_error_of(m, d, loss_at);
}

static void test_graph_gradients_match_finite_differences(void)
{
    SgError err = {0};
    Model *m = make_graph(&err);
    CHECK(m != NULL);
    if (m == NULL) {
        fprintf(stderr, "make_graph: %s\n", err.msg);
        return;
    }
    CHECK(m->nparams == 4 * 5 + 5 + 5 * 5 + 5 + 2 * 3 + 3 + 23 * 2 + 2 + 5 * 3 + 3);
    CHECK(model_output_head(m, 0) == NN_ACT_NONE && model_output_head(m, 1) == NN_ACT_SOFTMAX);
    Batch bt;
    make_batch(&bt);
    NnStats st = {0};
    CHECK(model_train_batch(m, NULL, &bt.d, NULL, 0, B, NULL, NULL, &st, &err) == 0);
    /* the training loss is the weighted sum of the outputs' */
    CHECK(fabs(st.loss_sum - (0.5 * st.output_loss[0] + 2.0 * st.output_loss[1])) <
          1e-9 * fabs(st.loss_sum));
    CHECK(fabs(st.loss_sum / B - loss_at(m, &bt.d)) < 1e-6);
    CHECK(worst_gradient_error(m, &bt.d) <= 2e-2);
    model_free(m);
}

/* Plain SGD folded into the GEMMs on the graph (Add, Concatenate and
 * Reshape fold too) equals gradient-then-update. */
static void test_graph_folded_sgd(void)
{
    SgError err = {0};
    Model *fused = make_graph(&err), *plain = make_graph(&err);
    CHECK(fused && plain && model_dense_only(fused));
    if (!fused || !plain)
        goto done;
    Optimizer *opt = NULL;
    OptimConfig cfg;
    optim_config_default(&cfg, OPTIM_SGD);
    cfg.lr = 0.1f;
    CHECK(optim_create(&opt, &cfg, fused->nparams, &err) == 0);
    Batch bt;
    make_batch(&bt);
    NnStats s1 = {0}, s2 = {0};
    CHECK(model_train_batch(fused, opt, &bt.d, NULL, 0, B, NULL, NULL, &s1, &err) == 0);
    CHECK(model_train_batch(plain, NULL, &bt.d, NULL, 0, B, NULL, NULL, &s2, &err) == 0);
    double worst = 0.0;
    for (size_t i = 0; i < plain->nparams; i++) {
        double want = plain->params[i] - 0.1 * plain->grads[i];
        double e = fabs(fused->params[i] - want);
        worst = e > worst ? e : worst;
    }
    CHECK(worst < 1e-5);
    optim_free(opt);
done:
    model_free(fused);
    model_free(plain);
}

/* Prediction's outputs (heads applied) give evaluation's loss. */
static void test_graph_predict(void)
{
    SgError err = {0};
    Model *m = make_graph(&err);
    CHECK(m != NULL);
    if (m == NULL)
        return;
    Batch bt;
    make_batch(&bt);
    float o0[B * 2], o1[B * 3];
    float *outs[2] = {o0, o1};
    CHECK(model_predict(m, &bt.d, 4, outs, &err) == 0);
    double mse = 0.0, ce = 0.0;
    for (int b = 0; b < B; b++) {
        double s = 0.0;
        for (int k = 0; k < 3; k++)
            s += o1[b * 3 + k];
        CHECK(fabs(s - 1.0) < 1e-5);
        ce -= log(o1[b * 3 + bt.y1[b]]);
        for (int k = 0; k < 2; k++)
            mse += (o0[b * 2 + k] - bt.y0[b * 2 + k]) * (o0[b * 2 + k] - bt.y0[b * 2 + k]) / 2.0;
    }
    CHECK(fabs((0.5 * mse + 2.0 * ce) / B - loss_at(m, &bt.d)) < 1e-5);
    model_free(m);
}

/* Each merge between Dense(4, tanh) towers, then Dense(2) with MSE:
 * tensors 0 a [1,1,3] and 1 b [1,1,3]; n0 tower(a) -> 2, n1 tower(b) -> 3,
 * (with 3 inputs n2 tower(a) -> 4); the merge of 2, 3 (and 4); Dense(2) of
 * it, the output. Every gradient against central differences. */
static void test_merges_match_finite_differences(void)
{
    static const struct {
        LayerKind kind;
        int ninputs, normalize;
    } cases[] = {
        {LAYER_SUBTRACT, 2, 0}, {LAYER_MULTIPLY, 3, 0}, {LAYER_AVERAGE, 3, 0},
        {LAYER_MAXIMUM, 3, 0},  {LAYER_MINIMUM, 3, 0},  {LAYER_DOT, 2, 0},
        {LAYER_DOT, 2, 1},
    };
    float a[B * 3], b[B * 3], y[B * 2];
    uint64_t s = 17;
    for (int i = 0; i < B * 3; i++)
        a[i] = 2.0f * frand(&s), b[i] = 2.0f * frand(&s);
    for (int i = 0; i < B * 2; i++)
        y[i] = frand(&s);
    NnData d;
    memset(&d, 0, sizeof d);
    d.n = B;
    d.ninputs = 2;
    d.inputs[0] = (NnArray){NN_F32, a, 3};
    d.inputs[1] = (NnArray){NN_F32, b, 3};
    d.ntargets = 1;
    d.targets[0] = (NnArray){NN_F32, y, 2};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        SgError err = {0};
        NnShape in[2] = {{1, 1, 3}, {1, 1, 3}};
        const int three = cases[c].ninputs == 3, merged = 4 + three;
        NnNode nodes[5] = {
            node(LAYER_DENSE, 4, NN_ACT_TANH, 1, 0, 0),
            node(LAYER_DENSE, 4, NN_ACT_TANH, 1, 1, 0),
            node(LAYER_DENSE, 4, NN_ACT_TANH, 1, 0, 0),
        };
        nodes[2 + three] = node(cases[c].kind, 0, 0, cases[c].ninputs, 2, 3);
        nodes[2 + three].inputs[2] = 4;
        nodes[2 + three].spec.normalize = cases[c].normalize;
        nodes[3 + three] = node(LAYER_DENSE, 2, NN_ACT_NONE, 1, merged, 0);
        int out = merged + 1;
        Model *m = NULL;
        NnLoss mse = {NN_LOSS_MSE, 0, 0.0f, 1.0f};
        CHECK(model_create_graph(&m, in, 2, nodes, 4 + three, &out, 1, &err) == 0);
        if (m == NULL) {
            fprintf(stderr, "merge case %zu: %s\n", c, err.msg);
            continue;
        }
        CHECK(model_set_output_loss(m, 0, &mse, 1.0f, &err) == 0);
        model_init_params(m, 40 + c);
        for (size_t i = 0; i < m->nparams; i++) /* non-zero biases */
            if (m->params[i] == 0.0f)
                m->params[i] = 0.5f * frand(&s);
        NnStats st = {0};
        CHECK(model_train_batch(m, NULL, &d, NULL, 0, B, NULL, NULL, &st, &err) == 0);
        const double e = worst_error_of(m, &d, loss_at);
        if (e > 2e-2)
            fprintf(stderr, "merge case %zu (%s): relative error %g\n", c,
                    nn_layer_kind_name(cases[c].kind), e);
        CHECK(e <= 2e-2);
        model_free(m);
    }
    /* Subtract and Dot read exactly 2 tensors */
    SgError err = {0};
    Model *m = NULL;
    NnShape in[1] = {{1, 1, 3}};
    NnNode three[2] = {node(LAYER_SUBTRACT, 0, 0, 3, 0, 0), node(LAYER_DENSE, 1, 0, 1, 1, 0)};
    int out = 2;
    CHECK(model_create_graph(&m, in, 1, three, 2, &out, 1, &err) == SG_EMODEL && m == NULL);
    CHECK(strstr(err.msg, "layer 0 (Subtract) reads exactly 2 tensors, not 3") != NULL);
    three[0].spec.kind = LAYER_DOT;
    CHECK(model_create_graph(&m, in, 1, three, 2, &out, 1, &err) == SG_EMODEL && m == NULL);
    CHECK(strstr(err.msg, "layer 0 (Dot) reads exactly 2 tensors, not 3") != NULL);
}

static void test_graph_declaration_errors(void)
{
    SgError err = {0};
    Model *m = NULL;
    NnShape in[2] = {{1, 1, 4}, {1, 1, 3}};
    /* Add of 4 and 3 features names the layer, both inputs and their shapes */
    NnNode add[2] = {node(LAYER_ADD, 0, NN_ACT_NONE, 2, 0, 1), node(LAYER_DENSE, 1, 0, 1, 2, 0)};
    int out = 3;
    CHECK(model_create_graph(&m, in, 2, add, 2, &out, 1, &err) == SG_EMODEL && m == NULL);
    CHECK(strstr(err.msg, "layer 0 (Add): input 1 (tensor 1) is 1x1x3 and input 0 (tensor 0) "
                          "1x1x4") != NULL);
    /* an input nobody reads */
    NnNode one[1] = {node(LAYER_DENSE, 1, 0, 1, 0, 0)};
    out = 2;
    CHECK(model_create_graph(&m, in, 2, one, 1, &out, 1, &err) == SG_EMODEL);
    CHECK(strstr(err.msg, "input 1 is read by no layer") != NULL);
    /* a layer whose output reaches no output */
    NnNode dead[2] = {node(LAYER_DENSE, 2, 0, 1, 0, 0), node(LAYER_DENSE, 1, 0, 1, 0, 0)};
    out = 2;
    CHECK(model_create_graph(&m, in, 1, dead, 2, &out, 1, &err) == SG_EMODEL);
    CHECK(strstr(err.msg, "layer 0 (Dense): its output reaches no model output") != NULL);
    /* a layer reading a later tensor (not topological order) */
    NnNode late[2] = {node(LAYER_DENSE, 2, 0, 1, 2, 0), node(LAYER_DENSE, 1, 0, 1, 0, 0)};
    out = 2;
    CHECK(model_create_graph(&m, in, 1, late, 2, &out, 1, &err) == SG_EMODEL);
    CHECK(strstr(err.msg, "layer 0 (Dense): input 0 is tensor 2") != NULL);
    /* a merge of one tensor; a Dense of two */
    NnNode lone[1] = {node(LAYER_CONCATENATE, 0, 0, 1, 0, 0)};
    out = 1;
    CHECK(model_create_graph(&m, in, 1, lone, 1, &out, 1, &err) == SG_EMODEL);
    CHECK(strstr(err.msg, "reads 2 to 64 tensors") != NULL);
    /* Reshape to a different number of values */
    NnNode rs[1] = {node(LAYER_RESHAPE, 0, 0, 1, 0, 0)};
    rs[0].spec.shape[0] = 1, rs[0].spec.shape[1] = 1, rs[0].spec.shape[2] = 5;
    CHECK(model_create_graph(&m, in, 1, rs, 1, &out, 1, &err) == SG_EMODEL);
    CHECK(strstr(err.msg, "Reshape): the input 1x1x4 has 4 values") != NULL);
    /* softmax on a Dense another layer reads */
    NnNode sm[2] = {node(LAYER_DENSE, 3, NN_ACT_SOFTMAX, 1, 0, 0),
                    node(LAYER_DENSE, 1, 0, 1, 1, 0)};
    int outs2[2] = {1, 2};
    CHECK(model_create_graph(&m, in, 1, sm, 2, outs2, 2, &err) == SG_EMODEL);
    CHECK(strstr(err.msg, "layer 0: softmax") != NULL);
    /* the same tensor twice as outputs */
    int dup[2] = {1, 1};
    CHECK(model_create_graph(&m, in, 1, one, 1, dup, 2, &err) == SG_EMODEL);
    CHECK(strstr(err.msg, "outputs 0 and 1 are the same tensor 1") != NULL);
    /* data: a missing input array, wrong targets per output */
    Model *g = make_graph(&err);
    CHECK(g != NULL);
    if (g == NULL)
        return;
    Batch bt;
    make_batch(&bt);
    NnStats st = {0};
    bt.d.ninputs = 1;
    CHECK(model_train_batch(g, NULL, &bt.d, NULL, 0, B, NULL, NULL, &st, &err) == SG_EINVAL);
    CHECK(strstr(err.msg, "1 input arrays given, the model has 2 inputs") != NULL);
    make_batch(&bt);
    bt.d.targets[1] = (NnArray){NN_F32, bt.y0, 3};
    CHECK(model_train_batch(g, NULL, &bt.d, NULL, 0, B, NULL, NULL, &st, &err) == SG_EINVAL);
    CHECK(strstr(err.msg, "sparse_categorical_crossentropy of output 1 takes integer labels") !=
          NULL);
    make_batch(&bt);
    bt.y1[4] = 3;
    CHECK(model_train_batch(g, NULL, &bt.d, NULL, 0, B, NULL, NULL, &st, &err) == SG_EINVAL);
    CHECK(strstr(err.msg, "label 3 of row 4 of output 1 is outside [0, 3)") != NULL);
    model_free(g);
}

static int count_ready(void *ctx, float *grads, size_t offset, size_t count, SgError *err)
{
    (void)grads, (void)offset, (void)count, (void)err;
    ++*(int *)ctx;
    return 0;
}

static int no_step(void *ctx, float *params, float *grads, size_t n, OptimRows *tables, int ntables,
                   int64_t *step, SgError *err)
{
    (void)ctx, (void)params, (void)grads, (void)n, (void)tables, (void)ntables, (void)step,
        (void)err;
    return 1; /* applied: no optimizer */
}

/* One Dense layer called twice (a shared layer: one kernel, its gradients
 * from both calls added), in a graph with Add:
 *   n0 Dense(4, tanh)(a) -> 1;  n1 = n0 again (1) -> 2;  n2 Add(1, 2) -> 3;
 *   n3 Dense(2)(3) -> 4 (MSE). */
static void test_shared_layer(void)
{
    SgError err = {0};
    NnShape in = {1, 1, 4};
    NnNode nodes[4] = {
        node(LAYER_DENSE, 4, NN_ACT_TANH, 1, 0, 0),
        node(LAYER_DENSE, 4, NN_ACT_TANH, 1, 1, 0),
        node(LAYER_ADD, 0, NN_ACT_NONE, 2, 1, 2),
        node(LAYER_DENSE, 2, NN_ACT_NONE, 1, 3, 0),
    };
    nodes[1].shares = 0;
    int out = 4;
    Model *m = NULL;
    CHECK(model_create_graph(&m, &in, 1, nodes, 4, &out, 1, &err) == 0);
    if (m == NULL) {
        fprintf(stderr, "shared: %s\n", err.msg);
        return;
    }
    CHECK(m->nparams == 4 * 4 + 4 + 4 * 2 + 2 && model_num_tensors(m) == 4);
    CHECK(m->kernel_t[1] == m->kernel_t[0] && m->accumulate[0] && !m->accumulate[1]);
    CHECK(!model_dense_only(m)); /* no folded SGD between two uses of one kernel */
    NnLoss mse = {NN_LOSS_MSE, 0, 0.0f, 1.0f};
    CHECK(model_set_loss(m, &mse, &err) == 0);
    model_init_params(m, 3);
    Batch bt;
    make_batch(&bt);
    NnData d = nn_data(NN_F32, bt.a, B, 4, NN_F32, bt.y0, 2);
    NnStats st = {0};
    int ready = 0;
    NnGradHook hook = {.ready = count_ready, .step = no_step, .ctx = &ready};
    CHECK(model_train_batch(m, NULL, &d, NULL, 0, B, &hook, NULL, &st, &err) == 0);
    CHECK(ready == 2); /* the shared kernel once, when both calls' gradients are in */
    CHECK(worst_gradient_error(m, &d) <= 2e-2);
    model_free(m);
    /* sharing with a node of another spec, or on an input of other width */
    NnNode bad[3] = {
        node(LAYER_DENSE, 4, NN_ACT_TANH, 1, 0, 0),
        node(LAYER_DENSE, 3, NN_ACT_TANH, 1, 1, 0),
        node(LAYER_DENSE, 1, NN_ACT_NONE, 1, 2, 0),
    };
    bad[1].shares = 0;
    out = 3;
    CHECK(model_create_graph(&m, &in, 1, bad, 3, &out, 1, &err) == SG_EMODEL);
    CHECK(strstr(err.msg, "layer 1 (Dense) shares layer 0's parameters") != NULL);
    bad[1].spec.units = 4;
    bad[1].inputs[0] = 0;
    bad[2].inputs[0] = 2;
    NnNode wide[3] = {node(LAYER_DENSE, 5, NN_ACT_TANH, 1, 0, 0),
                      node(LAYER_DENSE, 5, NN_ACT_TANH, 1, 1, 0),
                      node(LAYER_DENSE, 1, NN_ACT_NONE, 1, 2, 0)};
    wide[1].shares = 0;
    CHECK(model_create_graph(&m, &in, 1, wide, 3, &out, 1, &err) == SG_EMODEL);
    CHECK(strstr(err.msg, "input of 5 channels where layer 0 had 4") != NULL);
}

/* Dense with the activations it does not fuse (gelu, selu, swish,
 * softplus: eltwise primitives after the inner product, backward from its
 * output): gradients against finite differences, outputs equal to Dense
 * then an Activation layer. */
static void test_unfused_activations_on_dense(void)
{
    SgError err = {0};
    const NnAct acts[4] = {NN_ACT_GELU, NN_ACT_SELU, NN_ACT_SWISH, NN_ACT_SOFTPLUS};
    LayerSpec fused[5], split[9];
    memset(fused, 0, sizeof fused);
    memset(split, 0, sizeof split);
    for (int i = 0; i < 4; i++) {
        fused[i].kind = split[2 * i].kind = LAYER_DENSE;
        fused[i].units = split[2 * i].units = 5 - (i == 3);
        fused[i].act = acts[i];
        split[2 * i + 1].kind = LAYER_ACTIVATION;
        split[2 * i + 1].act = acts[i];
    }
    fused[4].kind = split[8].kind = LAYER_DENSE;
    fused[4].units = split[8].units = 2;
    Model *a = NULL, *b = NULL;
    CHECK(model_create(&a, 1, 1, 4, fused, 5, &err) == 0);
    CHECK(model_create(&b, 1, 1, 4, split, 9, &err) == 0);
    if (!a || !b) {
        fprintf(stderr, "unfused: %s\n", err.msg);
        goto done;
    }
    NnLoss mse = {NN_LOSS_MSE, 0, 0.0f, 1.0f};
    CHECK(model_set_loss(a, &mse, &err) == 0 && model_set_loss(b, &mse, &err) == 0);
    model_init_params(a, 21);
    CHECK(a->nparams == b->nparams);
    memcpy(b->params, a->params, a->nparams * sizeof(float));
    Batch bt;
    make_batch(&bt);
    NnData d = nn_data(NN_F32, bt.a, B, 4, NN_F32, bt.y0, 2);
    float oa[B * 2], ob[B * 2];
    float *pa[1] = {oa}, *pb[1] = {ob};
    CHECK(model_predict(a, &d, B, pa, &err) == 0 && model_predict(b, &d, B, pb, &err) == 0);
    for (int i = 0; i < B * 2; i++)
        CHECK(fabsf(oa[i] - ob[i]) <= 1e-6f * (1.0f + fabsf(ob[i])));
    NnStats st = {0};
    CHECK(model_train_batch(a, NULL, &d, NULL, 0, B, NULL, NULL, &st, &err) == 0);
    CHECK(worst_gradient_error(a, &d) <= 2e-2);
done:
    model_free(a);
    model_free(b);
}

/* The training-mode loss (batch statistics) at the current parameters,
 * leaving the state buffer as it was. */
static double train_loss_at(Model *m, const NnData *d)
{
    SgError err = {0};
    NnStats st = {0};
    float *keep = malloc(m->nstate * sizeof(float));
    memcpy(keep, m->state, m->nstate * sizeof(float));
    CHECK(model_train_batch(m, NULL, d, NULL, 0, B, NULL, NULL, &st, &err) == 0);
    memcpy(m->state, keep, m->nstate * sizeof(float));
    free(keep);
    return st.loss_sum / B;
}

/* b [2,3,2] -> Dense(4) [2,3,4] -> BatchNormalization (per channel over the
 * batch and the 6 positions) -> LayerNormalization (each position's 4) ->
 * Reshape [1,1,24] -> Dense(2), MSE. */
static void test_normalization(void)
{
    SgError err = {0};
    NnShape in = {2, 3, 2};
    NnNode nodes[5] = {
        node(LAYER_DENSE, 4, NN_ACT_NONE, 1, 0, 0),
        node(LAYER_BATCHNORM, 0, NN_ACT_NONE, 1, 1, 0),
        node(LAYER_LAYERNORM, 0, NN_ACT_NONE, 1, 2, 0),
        node(LAYER_RESHAPE, 0, NN_ACT_NONE, 1, 3, 0),
        node(LAYER_DENSE, 2, NN_ACT_NONE, 1, 4, 0),
    };
    for (int k = 1; k <= 2; k++) {
        nodes[k].spec.epsilon = 1e-3f;
        nodes[k].spec.momentum = 0.9f;
        nodes[k].spec.center = nodes[k].spec.scale = 1;
    }
    nodes[3].spec.shape[0] = 1, nodes[3].spec.shape[1] = 1, nodes[3].spec.shape[2] = 24;
    const int out = 5;
    Model *m = NULL;
    CHECK(model_create_graph(&m, &in, 1, nodes, 5, &out, 1, &err) == 0);
    if (m == NULL) {
        fprintf(stderr, "normalization: %s\n", err.msg);
        return;
    }
    /* gamma, beta of each, in node order; BatchNormalization's moving stats */
    CHECK(m->nparams == 2 * 4 + 4 + 2 * 4 + 2 * 4 + 24 * 2 + 2);
    CHECK(model_num_state(m) == 8 && model_num_state_tensors(m) == 2);
    CHECK(strcmp(model_state_info(m, 0)->name, "moving_mean") == 0 &&
          strcmp(model_state_info(m, 1)->name, "moving_variance") == 0);
    CHECK(strcmp(model_param_info(m, 2)->name, "gamma") == 0 &&
          strcmp(model_param_info(m, 3)->name, "beta") == 0);
    NnLoss mse = {NN_LOSS_MSE, 0, 0.0f, 1.0f};
    CHECK(model_set_loss(m, &mse, &err) == 0);
    model_init_params(m, 7);
    CHECK(m->state[0] == 0.0f && m->state[4] == 1.0f && m->params[8 + 4] == 1.0f);
    uint64_t s = 3;
    for (size_t i = 0; i < m->nparams; i++) /* gammas and betas away from 1 and 0 */
        m->params[i] += 0.3f * frand(&s);
    Batch bt;
    make_batch(&bt);
    for (int i = 0; i < B * 12; i++)
        bt.b[i] = 3.0f * bt.b[i] + 1.0f;
    NnData d = nn_data(NN_F32, bt.b, B, 12, NN_F32, bt.y0, 2);
    float before[8];
    memcpy(before, m->state, sizeof before);
    NnStats st = {0};
    CHECK(model_evaluate(m, &d, B, &st, &err) == 0);
    CHECK(memcmp(before, m->state, sizeof before) == 0); /* inference reads the state only */
    st = (NnStats){0};
    CHECK(model_train_batch(m, NULL, &d, NULL, 0, B, NULL, NULL, &st, &err) == 0);
    CHECK(memcmp(before, m->state, sizeof before) != 0); /* training moved it */
    for (int c = 0; c < 4; c++)                          /* towards the batch's, by 1 - momentum */
        CHECK(m->state[4 + c] > 0.0f && fabsf(m->state[c]) < 10.0f);
    /* the gradients of the training loss (batch statistics), against its
     * finite differences */
    CHECK(worst_error_of(m, &d, train_loss_at) <= 2e-2);
    /* a bad epsilon is named */
    nodes[1].spec.epsilon = 0.0f;
    Model *bad = NULL;
    CHECK(model_create_graph(&bad, &in, 1, nodes, 5, &out, 1, &err) == SG_EMODEL);
    CHECK(strstr(err.msg, "layer 1 (BatchNormalization): epsilon must be > 0") != NULL);
    model_free(m);
}

int main(void)
{
    test_normalization();
    test_unfused_activations_on_dense();
    test_shared_layer();
    test_graph_gradients_match_finite_differences();
    test_graph_folded_sgd();
    test_graph_predict();
    test_graph_declaration_errors();
    test_merges_match_finite_differences();
    return check_report("test_nn_graph");
}
