/*
 * test_nn_kernels.c - every oneDNN kernel of the model plan against its naive
 * C reference (nn_ref.h), layer by layer, forward and backward: each layer's
 * reference runs on the plan's own input/upstream gradient, so a mismatch
 * names the kernel. Also the loss kernels, error reporting through the
 * oneDNN checking macro, and model declaration errors. Exits non-zero on
 * the first failing check.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "nn/nn_model_impl.h"

/* max |a-b| / max(max |b|, 1e-6) over n */
static double rel_err(const float *a, const float *b, size_t n)
{
    double d = 0.0, s = 1e-6;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]);
        d = e > d ? e : d;
        s = fabs(b[i]) > s ? fabs(b[i]) : s;
    }
    return d / s;
}

static void expect_close_tol(const char *what, int layer, const float *got, const float *want,
                             size_t n, double tol)
{
    double e = rel_err(got, want, n);
    if (!(e < tol)) {
        fprintf(stderr, "layer %d %s: relative error %.3g\n", layer, what, e);
        failures++;
    }
}

static void expect_close(const char *what, int layer, const float *got, const float *want, size_t n)
{
    expect_close_tol(what, layer, got, want, n, 2e-5);
}

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((*s >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
}

/* dst[i] = src[i] rounded to the nearest bf16 (ties to even), as oneDNN's
 * reorders round (NaN-free inputs here). */
static void round_bf16(float *dst, const float *src, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &src[i], sizeof u);
        u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
        memcpy(&dst[i], &u, sizeof u);
    }
}

/* A plan buffer of n values: itself, or widened from bf16 into scratch when
 * is16 (an activation two bf16 layers hand on in bf16, or the gathered
 * input of a bf16 first layer). */
static const float *widen(const float *b, size_t n, int is16, float *scratch)
{
    if (!is16)
        return b;
    const uint16_t *h = (const uint16_t *)b;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)h[i] << 16;
        memcpy(&scratch[i], &u, sizeof u);
    }
    return scratch;
}

/* A bf16-held result against its f32 reference rounded the same way: one
 * bf16 step apart where an f32 difference crosses a rounding boundary. */
static void expect_close16(const char *what, int layer, const float *got, float *want, size_t n)
{
    round_bf16(want, want, n);
    expect_close_tol(what, layer, got, want, n, 1e-3);
}

/* With bf16 (NN_BF16 precision), the references of Dense and Conv2D take
 * bf16-rounded copies of what the primitives convert (input, weights, output
 * gradient): bf16 products are exact in f32, so the f32 tolerance holds. The
 * backward references then start from the plan's own upstream gradient at
 * every layer, since a rounding boundary would amplify the chain's f32
 * differences. */
static void check_model_prec(const char *name, int h, int w, int c, const LayerSpec *specs, int L,
                             int B, int sparse, int bf16)
{
    SgError err = {0};
    Model *m = NULL;
    if (model_create(&m, h, w, c, specs, L, &err) < 0) {
        fprintf(stderr, "%s: model_create: %s\n", name, err.msg);
        failures++;
        return;
    }
    if (bf16)
        CHECK(model_set_precision(m, NN_BF16) == NN_BF16);
    model_init_params(m, 7);
    for (size_t i = 0; i < m->nparams; i++) /* non-zero biases exercise the bias path */
        if (m->params[i] == 0.0f)
            m->params[i] = 0.05f * (float)((i % 7) - 3);
    const size_t row = model_input_size(m), K = (size_t)m->classes;
    float *x = malloc(sizeof(float) * B * row), *onehot = calloc((size_t)B * K, sizeof(float));
    int32_t *labels = malloc(sizeof(int32_t) * B);
    uint64_t s = 42;
    for (size_t i = 0; i < (size_t)B * row; i++)
        x[i] = frand(&s);
    for (int b = 0; b < B; b++) {
        labels[b] = (int32_t)((b * 7 + 3) % K);
        onehot[(size_t)b * K + labels[b]] = 1.0f;
    }
    NnData d = sparse ? nn_data(NN_F32, x, (size_t)B, row, NN_I32, labels, K)
                      : nn_data(NN_F32, x, (size_t)B, row, NN_F32, onehot, K);
    NnStats st = {0};
    NnLoss xent = {sparse ? NN_LOSS_SPARSE_CE : NN_LOSS_CATEGORICAL_CE, 0, 0.0f, 1.0f};
    CHECK(model_set_loss(m, &xent, &err) == 0);
    if (model_train_batch(m, NULL, &d, NULL, 0, B, NULL, NULL, &st, &err) < 0) {
        fprintf(stderr, "%s: model_train_batch: %s\n", name, err.msg);
        failures++;
        goto done;
    }
    Plan *p = NULL;
    CHECK(model_plan(m, B, &p, &err) == 0);
    size_t maxn = (size_t)B * row;
    for (int l = 0; l < L; l++) {
        const LayerShape *sh = &m->shapes[l];
        size_t o = (size_t)B * sh->oh * sh->ow * sh->oc;
        maxn = o > maxn ? o : maxn;
    }
    float *want = malloc(sizeof(float) * maxn), *pre = malloc(sizeof(float) * maxn),
          *dpre = malloc(sizeof(float) * maxn), *gw = malloc(sizeof(float) * m->nparams);
    float *xr = malloc(sizeof(float) * maxn), *wr = malloc(sizeof(float) * m->nparams);
    float *sx = malloc(sizeof(float) * maxn), *sy = malloc(sizeof(float) * maxn);
    if (bf16) {
        int nb = 0;
        CHECK(model_bf16_layers(m, B, &nb, &err) == 0 && nb > 0);
        CHECK(p->nbf16 == nb);
        round_bf16(wr, m->params, m->nparams);
    } else {
        memcpy(wr, m->params, sizeof(float) * m->nparams);
    }

    /* the loss (the table's cross-entropy, nn_loss.c) against the reference
     * log-softmax and cross-entropy on the same logits */
    float *lp = malloc(sizeof(float) * B * K), *dl = malloc(sizeof(float) * B * K);
    log_softmax_forward_ref(lp, p->act[L], B, (int)K);
    xent_backward(dl, lp, sparse ? labels : NULL, sparse ? NULL : onehot, B, (int)K);
    expect_close("cross-entropy gradient", L, p->dact[L], dl, (size_t)B * K);
    double loss = xent_forward(lp, sparse ? labels : NULL, sparse ? NULL : onehot, B, (int)K, NULL);
    CHECK(fabs(loss * B - st.loss_sum) < 1e-4 * fabs(st.loss_sum));

    /* forward: each kernel on the plan's own input */
    for (int l = 0; l < L; l++) {
        const LayerSpec *sp = &m->specs[l];
        const LayerShape *sh = &m->shapes[l];
        const size_t o = (size_t)B * sh->oh * sh->ow * sh->oc;
        const float *X = p->act[l], *Y = p->act[l + 1];
        NnAct act = model_layer_act(m, l);
        switch (sp->kind) {
        case LAYER_DENSE:
        case LAYER_CONV2D: {
            const ParamInfo *kt = &m->tensors[m->kernel_t[l]], *bt = &m->tensors[m->bias_t[l]];
            const float *W = wr + kt->offset, *bias = m->params + bt->offset;
            X = widen(X, (size_t)B * sh->h * sh->w * sh->c, p->lp[l].input_bf16, sx);
            Y = widen(Y, o, p->lp[l].output_bf16, sy);
            if (p->lp[l].bf16) {
                round_bf16(xr, X, (size_t)B * sh->h * sh->w * sh->c);
                X = xr;
            }
            if (sp->kind == LAYER_DENSE)
                dense_forward_ref(pre, X, W, bias, B, sh->c, sh->oc);
            else
                conv2d_forward_ref(pre, X, W, bias, B, sh->h, sh->w, sh->c, sh->oc, sp->kh, sp->kw,
                                   sp->stride, sh->pt, sh->pl, sh->oh, sh->ow);
            act_forward_ref(want, pre, o, act);
            if (p->lp[l].output_bf16)
                expect_close16(sp->kind == LAYER_DENSE ? "dense forward" : "conv2d forward", l, Y,
                               want, o);
            else
                expect_close(sp->kind == LAYER_DENSE ? "dense forward" : "conv2d forward", l, Y,
                             want, o);
            break;
        }
        case LAYER_MAXPOOL:
        case LAYER_AVGPOOL: {
            int mx = sp->kind == LAYER_MAXPOOL;
            (mx ? maxpool_forward_ref : avgpool_forward_ref)(want, X, B, sh->h, sh->w, sh->c,
                                                             sp->kh, sp->kw, sp->stride, sh->pt,
                                                             sh->pl, sh->oh, sh->ow);
            expect_close(mx ? "maxpool forward" : "avgpool forward", l, Y, want, o);
            break;
        }
        case LAYER_DROPOUT: {
            size_t zeros = 0;
            for (size_t i = 0; i < o; i++) {
                want[i] = X[i] * p->lp[l].scratch[i];
                zeros += p->lp[l].scratch[i] == 0.0f;
            }
            expect_close("dropout forward", l, Y, want, o);
            /* the drop fraction is within 4 binomial standard deviations of the rate */
            double sd = sqrt(sp->rate * (1.0 - sp->rate) / (double)o);
            if (!(fabs((double)zeros / o - sp->rate) < 4.0 * sd + 1e-3)) {
                fprintf(stderr, "layer %d dropout: %zu of %zu dropped at rate %g\n", l, zeros, o,
                        sp->rate);
                failures++;
            }
            break;
        }
        case LAYER_FLATTEN:
            CHECK(Y == X && p->dact[l + 1] == p->dact[l]);
            break;
        case LAYER_ACTIVATION:
            act_forward_ref(want, X, o, sp->act);
            expect_close("activation forward", l, Y, want, o);
            break;
        default:
            CHECK(!"a layer kind this test does not check");
        }
    }

    /* backward: the reference chain from the logits gradient down; every
     * layer's parameter gradients are compared, and its data gradient where
     * the plan still holds it (a fused activation below overwrites it in place) */
    float *up = malloc(sizeof(float) * maxn), *down = malloc(sizeof(float) * maxn);
    memcpy(up, p->dact[L], sizeof(float) * B * K);
    for (int l = L - 1; l >= 0; l--) {
        const LayerSpec *sp = &m->specs[l];
        const LayerShape *sh = &m->shapes[l];
        const size_t o = (size_t)B * sh->oh * sh->ow * sh->oc,
                     in = (size_t)B * sh->h * sh->w * sh->c;
        const float *X = p->act[l], *Y = p->act[l + 1];
        NnAct act = model_layer_act(m, l);
        const char *what = "data gradient";
        const int w16 =
            (sp->kind == LAYER_DENSE || sp->kind == LAYER_CONV2D) && p->lp[l].output_bf16;
        const int d16 =
            (sp->kind == LAYER_DENSE || sp->kind == LAYER_CONV2D) && p->lp[l].input_bf16;
        if (bf16 && sp->kind != LAYER_FLATTEN) /* the plan's own upstream (see above) */
            memcpy(up, widen(p->dact[l + 1], o, w16, sy), sizeof(float) * o);
        if (d16)
            X = widen(X, in, 1, sx);
        switch (sp->kind) {
        case LAYER_DENSE:
        case LAYER_CONV2D: {
            const ParamInfo *kt = &m->tensors[m->kernel_t[l]], *bt = &m->tensors[m->bias_t[l]];
            const float *W = wr + kt->offset;
            if (p->lp[l].bf16) {
                /* dact[l+1] now holds the gradient before the activation, as
                 * the weights and data primitives took it */
                round_bf16(dpre, up, o);
                round_bf16(xr, X, in);
                X = xr;
            } else {
                act_backward_ref(dpre, up, Y, o, act);
            }
            if (sp->kind == LAYER_DENSE)
                dense_backward_ref(down, gw + kt->offset, gw + bt->offset, dpre, X, W, B, sh->c,
                                   sh->oc);
            else
                conv2d_backward_ref(down, gw + kt->offset, gw + bt->offset, dpre, X, W, B, sh->h,
                                    sh->w, sh->c, sh->oc, sp->kh, sp->kw, sp->stride, sh->pt,
                                    sh->pl, sh->oh, sh->ow);
            expect_close("weight gradient", l, m->grads + kt->offset, gw + kt->offset, kt->size);
            expect_close("bias gradient", l, m->grads + bt->offset, gw + bt->offset, bt->size);
            what = sp->kind == LAYER_DENSE ? "dense data gradient" : "conv2d data gradient";
            break;
        }
        case LAYER_MAXPOOL:
            maxpool_backward_ref(down, up, X, B, sh->h, sh->w, sh->c, sp->kh, sp->kw, sp->stride,
                                 sh->pt, sh->pl, sh->oh, sh->ow);
            what = "maxpool backward";
            break;
        case LAYER_AVGPOOL:
            avgpool_backward_ref(down, up, B, sh->h, sh->w, sh->c, sp->kh, sp->kw, sp->stride,
                                 sh->pt, sh->pl, sh->oh, sh->ow);
            what = "avgpool backward";
            break;
        case LAYER_DROPOUT:
            dropout_backward(down, up, p->lp[l].scratch, o);
            what = "dropout backward";
            break;
        case LAYER_FLATTEN:
            memcpy(down, up, sizeof(float) * o);
            break;
        case LAYER_ACTIVATION:
            act_backward_src_ref(down, up, X, o, sp->act);
            what = "activation backward";
            break;
        default:
            CHECK(!"a layer kind this test does not check");
        }
        int below_fused = 0;
        for (int k = l - 1; k >= 0; k--) {
            if (m->specs[k].kind == LAYER_FLATTEN)
                continue;
            below_fused = (m->specs[k].kind == LAYER_DENSE || m->specs[k].kind == LAYER_CONV2D) &&
                          m->specs[k].act != NN_ACT_NONE;
            break;
        }
        if (l > 0 && !below_fused && sp->kind != LAYER_FLATTEN && d16) {
            memcpy(sy, down, sizeof(float) * in); /* rounded for the comparison, not the chain */
            expect_close16(what, l, widen(p->dact[l], in, 1, sx), sy, in);
        } else if (l > 0 && !below_fused && sp->kind != LAYER_FLATTEN) {
            expect_close(what, l, p->dact[l], down, in);
        }
        float *t = up;
        up = down;
        down = t;
    }
    free(up);
    free(down);
    /* inference mode: dropout is the identity, results are deterministic */
    NnStats e1 = {0}, e2 = {0};
    CHECK(model_evaluate(m, &d, B, &e1, &err) == 0);
    CHECK(model_evaluate(m, &d, B, &e2, &err) == 0);
    CHECK(e1.loss_sum == e2.loss_sum && e1.seen == B);
    free(want);
    free(pre);
    free(dpre);
    free(gw);
    free(xr);
    free(sx);
    free(sy);
    free(wr);
    free(lp);
    free(dl);
done:
    free(x);
    free(onehot);
    free(labels);
    model_free(m);
}

static void check_model(const char *name, int h, int w, int c, const LayerSpec *specs, int L, int B,
                        int sparse)
{
    check_model_prec(name, h, w, c, specs, L, B, sparse, 0);
    if (nn_bf16_supported()) {
        char bname[64];
        snprintf(bname, sizeof bname, "%s (bf16)", name);
        check_model_prec(bname, h, w, c, specs, L, B, sparse, 1);
    }
}

static void test_mlp_kernels(void)
{
    LayerSpec specs[] = {
        {LAYER_DENSE, 16, 0, 0, 0, 0, NN_ACT_RELU, 0, INIT_TRUNCATED_NORMAL},
        {LAYER_DENSE, 12, 0, 0, 0, 0, NN_ACT_TANH, 0, INIT_GLOROT_UNIFORM},
        {LAYER_DENSE, 9, 0, 0, 0, 0, NN_ACT_SIGMOID, 0, INIT_HE_NORMAL},
        {LAYER_DENSE, 5, 0, 0, 0, 0, NN_ACT_NONE, 0, INIT_HE_UNIFORM},
    };
    check_model("mlp", 1, 1, 20, specs, 4, 6, 1);
}

static void test_cnn_kernels(void)
{
    LayerSpec specs[] = {
        {LAYER_CONV2D, 4, 3, 3, 1, 1, NN_ACT_RELU, 0, INIT_GLOROT_UNIFORM},
        {LAYER_MAXPOOL, 0, 2, 2, 0, 0, NN_ACT_NONE, 0, 0},
        {LAYER_CONV2D, 5, 3, 3, 2, 1, NN_ACT_TANH, 0, INIT_HE_NORMAL},
        {LAYER_AVGPOOL, 0, 2, 2, 1, 1, NN_ACT_NONE, 0, 0},
        {LAYER_CONV2D, 3, 2, 2, 1, 0, NN_ACT_NONE, 0, INIT_GLOROT_UNIFORM},
        {LAYER_DROPOUT, 0, 0, 0, 0, 0, NN_ACT_NONE, 0.3f, 0},
        {LAYER_FLATTEN, 0, 0, 0, 0, 0, NN_ACT_NONE, 0, 0},
        {LAYER_DENSE, 7, 0, 0, 0, 0, NN_ACT_SIGMOID, 0, INIT_GLOROT_UNIFORM},
        {LAYER_DENSE, 4, 0, 0, 0, 0, NN_ACT_SOFTMAX, 0, INIT_GLOROT_UNIFORM},
    };
    check_model("cnn", 9, 8, 3, specs, 9, 5, 0);
}

static void test_keras_cnn_shapes_and_kernels(void)
{
    /* model (b) at a reduced size: valid 3x3 convs, 2x2 max pool, dropout */
    LayerSpec specs[] = {
        {LAYER_CONV2D, 8, 3, 3, 1, 0, NN_ACT_RELU, 0, INIT_GLOROT_UNIFORM},
        {LAYER_CONV2D, 16, 3, 3, 1, 0, NN_ACT_RELU, 0, INIT_GLOROT_UNIFORM},
        {LAYER_MAXPOOL, 0, 2, 2, 0, 0, NN_ACT_NONE, 0, 0},
        {LAYER_DROPOUT, 0, 0, 0, 0, 0, NN_ACT_NONE, 0.25f, 0},
        {LAYER_FLATTEN, 0, 0, 0, 0, 0, NN_ACT_NONE, 0, 0},
        {LAYER_DENSE, 32, 0, 0, 0, 0, NN_ACT_RELU, 0, INIT_GLOROT_UNIFORM},
        {LAYER_DROPOUT, 0, 0, 0, 0, 0, NN_ACT_NONE, 0.5f, 0},
        {LAYER_DENSE, 10, 0, 0, 0, 0, NN_ACT_SOFTMAX, 0, INIT_GLOROT_UNIFORM},
    };
    check_model("keras-cnn", 12, 12, 1, specs, 8, 4, 0);
}

/* Every activation: fused into Dense (those that backward from the output)
 * and as Activation layers (every one, backward from the input), first
 * layer and after a convolution included. */
static void test_activation_kernels(void)
{
    LayerSpec mlp[] = {
        {LAYER_DENSE, 16, 0, 0, 0, 0, NN_ACT_LEAKY_RELU, 0, INIT_GLOROT_UNIFORM},
        {LAYER_ACTIVATION, 0, 0, 0, 0, 0, NN_ACT_GELU, 0, 0},
        {LAYER_DENSE, 12, 0, 0, 0, 0, NN_ACT_ELU, 0, INIT_GLOROT_UNIFORM},
        {LAYER_ACTIVATION, 0, 0, 0, 0, 0, NN_ACT_SWISH, 0, 0},
        {LAYER_DENSE, 10, 0, 0, 0, 0, NN_ACT_NONE, 0, INIT_GLOROT_UNIFORM},
        {LAYER_ACTIVATION, 0, 0, 0, 0, 0, NN_ACT_SOFTPLUS, 0, 0},
        {LAYER_DENSE, 8, 0, 0, 0, 0, NN_ACT_NONE, 0, INIT_GLOROT_UNIFORM},
        {LAYER_ACTIVATION, 0, 0, 0, 0, 0, NN_ACT_SELU, 0, 0},
        {LAYER_DENSE, 7, 0, 0, 0, 0, NN_ACT_NONE, 0, INIT_GLOROT_UNIFORM},
        {LAYER_ACTIVATION, 0, 0, 0, 0, 0, NN_ACT_LEAKY_RELU, 0, 0},
        {LAYER_DENSE, 6, 0, 0, 0, 0, NN_ACT_NONE, 0, INIT_GLOROT_UNIFORM},
        {LAYER_ACTIVATION, 0, 0, 0, 0, 0, NN_ACT_ELU, 0, 0},
        {LAYER_DENSE, 5, 0, 0, 0, 0, NN_ACT_NONE, 0, INIT_GLOROT_UNIFORM},
    };
    check_model("activations", 1, 1, 20, mlp, 13, 6, 1);
    LayerSpec first[] = {
        {LAYER_ACTIVATION, 0, 0, 0, 0, 0, NN_ACT_SIGMOID, 0, 0},
        {LAYER_DENSE, 4, 0, 0, 0, 0, NN_ACT_NONE, 0, INIT_GLOROT_UNIFORM},
    };
    check_model("activation first", 1, 1, 9, first, 2, 5, 1);
    LayerSpec conv[] = {
        {LAYER_CONV2D, 4, 3, 3, 1, 1, NN_ACT_NONE, 0, INIT_GLOROT_UNIFORM},
        {LAYER_ACTIVATION, 0, 0, 0, 0, 0, NN_ACT_GELU, 0, 0},
        {LAYER_CONV2D, 3, 3, 3, 1, 0, NN_ACT_ELU, 0, INIT_GLOROT_UNIFORM},
        {LAYER_FLATTEN, 0, 0, 0, 0, 0, NN_ACT_NONE, 0, 0},
        {LAYER_DENSE, 4, 0, 0, 0, 0, NN_ACT_SOFTMAX, 0, INIT_GLOROT_UNIFORM},
    };
    check_model("conv activations", 7, 6, 2, conv, 5, 4, 0);
    /* a Dense cannot fuse an activation whose backward needs its input */
    SgError err = {0};
    Model *m = NULL;
    LayerSpec odd_dense[] = {{LAYER_DENSE, 4, 0, 0, 0, 0, (NnAct)99, 0, 0}};
    CHECK(model_create(&m, 1, 1, 3, odd_dense, 1, &err) == SG_EMODEL && m == NULL);
    CHECK(strstr(err.msg, "layer 0 (Dense): unknown activation 99") != NULL);
    LayerSpec softmax_layer[] = {{LAYER_DENSE, 4, 0, 0, 0, 0, NN_ACT_NONE, 0, 0},
                                 {LAYER_ACTIVATION, 0, 0, 0, 0, 0, NN_ACT_SOFTMAX, 0, 0}};
    CHECK(model_create(&m, 1, 1, 3, softmax_layer, 2, &err) == SG_EMODEL && m == NULL);
    CHECK(strstr(err.msg, "softmax") != NULL);
}

static void test_dnnl_errors_name_the_call(void)
{
    SgError err = {0};
    dnnl_memory_desc_t md = NULL;
    dnnl_dims_t dims = {-5, 3};
    int rc = nn_md(&md, 2, dims, dnnl_ab, &err);
    CHECK(rc == SG_EDNNL);
    CHECK(err.code == SG_EDNNL);
    CHECK(strstr(err.msg, "dnnl_memory_desc_create_with_tag") != NULL);
    CHECK(strstr(err.msg, "invalid arguments") != NULL);
}

static void test_model_declaration_errors(void)
{
    SgError err = {0};
    Model *m = NULL;
    LayerSpec no_flatten[] = {
        {LAYER_CONV2D, 4, 3, 3, 1, 0, NN_ACT_RELU, 0, 0},
        {LAYER_DENSE, 10, 0, 0, 0, 0, NN_ACT_NONE, 0, 0},
    };
    CHECK(model_create(&m, 8, 8, 1, no_flatten, 2, &err) == SG_EMODEL && m == NULL);
    CHECK(strstr(err.msg, "output 0 (layer 1, Dense) is 6x6x10; it must be flat: add Flatten") !=
          NULL);
    LayerSpec image_out[] = {{LAYER_CONV2D, 4, 3, 3, 1, 0, NN_ACT_RELU, 0, 0}};
    CHECK(model_create(&m, 8, 8, 1, image_out, 1, &err) == SG_EMODEL && m == NULL);
    CHECK(strstr(err.msg, "must be flat") != NULL);
    /* a loss that does not fit the head: refused, naming both */
    LayerSpec sigmoid_head[] = {{LAYER_DENSE, 3, 0, 0, 0, 0, NN_ACT_SIGMOID, 0, 0}};
    CHECK(model_create(&m, 1, 1, 4, sigmoid_head, 1, &err) == 0);
    CHECK(model_head(m) == NN_ACT_SIGMOID && model_loss(m)->kind == NN_LOSS_BINARY_CE);
    NnLoss sparse = {NN_LOSS_SPARSE_CE, 0, 0.0f, 1.0f};
    CHECK(model_set_loss(m, &sparse, &err) == SG_EMODEL);
    CHECK(strstr(err.msg, "sparse_categorical_crossentropy") && strstr(err.msg, "sigmoid"));
    model_free(m);
    m = NULL;
    LayerSpec softmax_head[] = {{LAYER_DENSE, 3, 0, 0, 0, 0, NN_ACT_SOFTMAX, 0, 0}};
    CHECK(model_create(&m, 1, 1, 4, softmax_head, 1, &err) == 0);
    NnLoss bce = {NN_LOSS_BINARY_CE, 0, 0.0f, 1.0f};
    CHECK(model_set_loss(m, &bce, &err) == SG_EMODEL && strstr(err.msg, "softmax"));
    NnMetric acc = {NN_METRIC_SPARSE_ACCURACY, 0.5f, 200, 0, 0};
    NnLoss cce = {NN_LOSS_CATEGORICAL_CE, 0, 0.0f, 1.0f};
    CHECK(model_set_loss(m, &cce, &err) == 0);
    CHECK(model_set_metrics(m, &acc, 1, &err) == SG_EMODEL && strstr(err.msg, "integer labels"));
    model_free(m);
    m = NULL;
    LayerSpec relu_last[] = {{LAYER_DENSE, 1, 0, 0, 0, 0, NN_ACT_RELU, 0, 0}};
    CHECK(model_create(&m, 1, 1, 4, relu_last, 1, &err) == 0);
    CHECK(model_head(m) == NN_ACT_NONE && model_loss(m)->kind == NN_LOSS_MSE);
    model_free(m);
    m = NULL;
    LayerSpec too_big[] = {
        {LAYER_CONV2D, 4, 5, 5, 1, 0, NN_ACT_RELU, 0, 0},
        {LAYER_FLATTEN, 0, 0, 0, 0, 0, NN_ACT_NONE, 0, 0},
        {LAYER_DENSE, 2, 0, 0, 0, 0, NN_ACT_NONE, 0, 0},
    };
    CHECK(model_create(&m, 3, 3, 1, too_big, 3, &err) == SG_EMODEL);
    CHECK(strstr(err.msg, "does not fit") != NULL);
    LayerSpec bad_rate[] = {
        {LAYER_DROPOUT, 0, 0, 0, 0, 0, NN_ACT_NONE, 1.0f, 0},
        {LAYER_DENSE, 2, 0, 0, 0, 0, NN_ACT_NONE, 0, 0},
    };
    CHECK(model_create(&m, 1, 1, 3, bad_rate, 2, &err) == SG_EMODEL);
    /* a label outside [0, K) is reported with its row */
    LayerSpec ok[] = {{LAYER_DENSE, 3, 0, 0, 0, 0, NN_ACT_NONE, 0, 0}};
    CHECK(model_create(&m, 1, 1, 2, ok, 1, &err) == 0);
    float x[4] = {0};
    int32_t y[2] = {1, 3};
    NnData d = nn_data(NN_F32, x, 2, 2, NN_I32, y, 3);
    NnStats st = {0};
    CHECK(model_train_batch(m, NULL, &d, NULL, 0, 2, NULL, NULL, &st, &err) == SG_EINVAL);
    CHECK(strstr(err.msg, "label 3 of row 1") != NULL);
    model_free(m);
}

/* Plain SGD folded into the weight-gradient GEMMs (model_backward_sgd) against
 * the gradient buffer followed by params -= lr * grads, over 3 steps of a
 * Dense stack with Dropout (the same seed gives the same masks). */
static void test_folded_sgd_matches_gradient_then_update(void)
{
    LayerSpec specs[] = {
        {LAYER_DENSE, 16, 0, 0, 0, 0, NN_ACT_RELU, 0, INIT_TRUNCATED_NORMAL},
        {LAYER_DROPOUT, 0, 0, 0, 0, 0, NN_ACT_NONE, 0.25f, 0},
        {LAYER_DENSE, 8, 0, 0, 0, 0, NN_ACT_TANH, 0, INIT_GLOROT_UNIFORM},
        {LAYER_DENSE, 5, 0, 0, 0, 0, NN_ACT_NONE, 0, INIT_GLOROT_UNIFORM},
    };
    const int B = 7, C = 12, STEPS = 3;
    const float lr = 0.3f;
    SgError err = {0};
    Model *fused = NULL, *plain = NULL;
    Optimizer *opt = NULL;
    OptimConfig cfg;
    optim_config_default(&cfg, OPTIM_SGD);
    cfg.lr = lr;
    CHECK(model_create(&fused, 1, 1, C, specs, 4, &err) == 0);
    CHECK(model_create(&plain, 1, 1, C, specs, 4, &err) == 0);
    if (!fused || !plain)
        goto done;
    CHECK(model_dense_only(fused));
    CHECK(optim_create(&opt, &cfg, fused->nparams, &err) == 0);
    model_init_params(fused, 3);
    model_init_params(plain, 3);
    model_set_rng(fused, 9, 0);
    model_set_rng(plain, 9, 0);
    float x[7 * 12];
    int32_t labels[7];
    uint64_t s = 17;
    for (int i = 0; i < B * C; i++)
        x[i] = frand(&s);
    for (int b = 0; b < B; b++)
        labels[b] = (b * 3 + 1) % 5;
    NnData d = nn_data(NN_F32, x, (size_t)B, (size_t)C, NN_I32, labels, 5);
    NnStats st1 = {0}, st2 = {0};
    for (int step = 0; step < STEPS; step++) {
        CHECK(model_train_batch(fused, opt, &d, NULL, 0, B, NULL, NULL, &st1, &err) == 0);
        CHECK(model_train_batch(plain, NULL, &d, NULL, 0, B, NULL, NULL, &st2, &err) == 0);
        for (size_t i = 0; i < plain->nparams; i++)
            plain->params[i] -= lr * plain->grads[i];
    }
    CHECK(optim_get_step(opt) == STEPS);
    CHECK(fabs(st1.loss_sum - st2.loss_sum) <= 1e-5 * fabs(st2.loss_sum));
    expect_close("folded SGD parameters after 3 steps", -1, fused->params, plain->params,
                 plain->nparams);
    for (size_t i = 0; i < fused->nparams; i++)
        CHECK(fused->grads[i] == 0.0f); /* the folded path writes no gradient */
done:
    optim_free(opt);
    model_free(fused);
    model_free(plain);
}

/* The gradient hook (nn_hook.h) in the loop: ready() once per weighted
 * layer, last layer first, with that layer's kernel+bias range; step() after
 * backward with the step count; 1 skips the optimizer, 0 lets it run, < 0
 * ends the run with the row in the error; the fused SGD path is never taken
 * with a hook (the gradient buffer is written). Also uint8 inputs with a
 * scale and int64 labels against the float32/int32 equivalent. */
typedef struct HookLog {
    size_t offsets[8], counts[8];
    int nready, nstep, ret;
    int64_t seen_step, set_step;
    float grad0;
} HookLog;

static int log_ready(void *ctx, float *grads, size_t offset, size_t count, SgError *err)
{
    (void)grads;
    (void)err;
    HookLog *h = ctx;
    if (h->nready < 8) {
        h->offsets[h->nready] = offset;
        h->counts[h->nready] = count;
    }
    h->nready++;
    return 0;
}

static int log_step(void *ctx, float *params, float *grads, size_t n, OptimRows *tables,
                    int ntables, int64_t *global_step, SgError *err)
{
    (void)params, (void)tables, (void)ntables;
    (void)n;
    HookLog *h = ctx;
    h->nstep++;
    h->seen_step = *global_step;
    h->grad0 = grads[0];
    if (h->ret < 0)
        return sg_fail(err, SG_ENODE, "hook says no");
    if (h->set_step)
        *global_step = h->set_step;
    return h->ret;
}

static void test_grad_hook_in_the_loop(void)
{
    LayerSpec specs[] = {
        {LAYER_DENSE, 6, 0, 0, 0, 0, NN_ACT_RELU, 0, INIT_GLOROT_UNIFORM},
        {LAYER_DROPOUT, 0, 0, 0, 0, 0, NN_ACT_NONE, 0.0f, 0},
        {LAYER_DENSE, 3, 0, 0, 0, 0, NN_ACT_NONE, 0, INIT_GLOROT_UNIFORM},
    };
    const int B = 4, C = 5;
    SgError err = {0};
    Model *m = NULL, *ref = NULL;
    Optimizer *opt = NULL;
    OptimConfig cfg;
    optim_config_default(&cfg, OPTIM_SGD);
    cfg.lr = 0.5f;
    CHECK(model_create(&m, 1, 1, C, specs, 3, &err) == 0);
    CHECK(model_create(&ref, 1, 1, C, specs, 3, &err) == 0);
    if (!m || !ref)
        goto done;
    CHECK(optim_create(&opt, &cfg, m->nparams, &err) == 0);
    model_init_params(m, 5);
    model_init_params(ref, 5);
    uint8_t xu[4 * 5];
    float xf[4 * 5];
    int64_t y64[4] = {0, 2, 1, 2};
    int32_t y32[4] = {0, 2, 1, 2};
    for (int i = 0; i < B * C; i++) {
        xu[i] = (uint8_t)(i * 37 % 256);
        xf[i] = (float)xu[i] * (1.0f / 255.0f);
    }
    NnData du = nn_data(NN_U8, xu, (size_t)B, (size_t)C, NN_I64, y64, 3);
    du.transforms[0] = (NnTransform){1, 1.0f / 255.0f, NULL, NULL};
    NnData df = nn_data(NN_F32, xf, (size_t)B, (size_t)C, NN_I32, y32, 3);
    HookLog log = {.ret = 1};
    NnGradHook hook = {.ready = log_ready, .step = log_step, .ctx = &log};
    NnStats st = {0}, st2 = {0};
    int64_t step = 7;
    float before = m->params[0];
    memset(m->grads, 0, m->nparams * sizeof(float));
    CHECK(model_train_batch(m, opt, &du, NULL, 0, B, &hook, &step, &st, &err) == 0);
    CHECK(log.nready == 2 && log.nstep == 1 && log.seen_step == 8 && step == 8);
    /* last layer first: layer 2's range ends the buffer, layer 0's starts it */
    CHECK(log.offsets[0] + log.counts[0] == m->nparams && log.offsets[1] == 0);
    CHECK(log.counts[1] == log.offsets[0]);
    CHECK(m->params[0] == before);   /* step() returned 1: no optimizer */
    CHECK(m->grads[0] == log.grad0); /* gradients written: no fused SGD */
    CHECK(optim_get_step(opt) == 0);
    /* uint8 * scale and int64 labels train as float32 and int32 do */
    CHECK(model_train_batch(ref, NULL, &df, NULL, 0, B, NULL, NULL, &st2, &err) == 0);
    CHECK(fabs(st.loss_sum - st2.loss_sum) <= 1e-6 * fabs(st2.loss_sum));
    for (size_t i = 0; i < m->nparams; i++)
        CHECK(m->grads[i] == ref->grads[i]);
    /* 0: the loop's optimizer runs; the hook may set the step */
    log.ret = 0;
    log.set_step = 100;
    CHECK(model_train_batch(m, opt, &du, NULL, 0, B, &hook, &step, &st, &err) == 0);
    CHECK(step == 100 && optim_get_step(opt) == 1 && m->params[0] != before);
    /* an error ends the run, naming the row */
    log.ret = -1;
    CHECK(model_fit_steps(m, opt, &du, NULL, 0, 2, 2, &hook, &step, &st, &err) == SG_ENODE);
    CHECK(strstr(err.msg, "hook says no") != NULL &&
          strstr(err.msg, "training step 101 (the batch at row 0"));
done:
    optim_free(opt);
    model_free(m);
    model_free(ref);
}

/* dropout_forward's masks (its vector path where the CPU has AVX-512DQ, blocks under OpenMP)
 * are exactly nn_uniform(seed, counter + i) >= rate, element by element, on lengths with
 * vector tails and block remainders, and rates whose threshold is not a round number. */
static void test_dropout_masks_are_the_generator_definition(void)
{
    const size_t lens[] = {1, 7, 8, 9, 16383, 16384 * 5 + 13};
    const float rates[] = {0.0f, 0.1f, 0.25f, 0.3f, 0.5f, 0.77f};
    const size_t nmax = 16384 * 5 + 13;
    float *inp = malloc(nmax * sizeof(float)), *out = malloc(nmax * sizeof(float));
    float *mask = malloc(nmax * sizeof(float));
    CHECK(inp && out && mask);
    if (!inp || !out || !mask)
        return;
    for (size_t i = 0; i < nmax; i++)
        inp[i] = (float)i * 0.001f - 3.0f;
    for (size_t a = 0; a < sizeof lens / sizeof lens[0]; a++)
        for (size_t r = 0; r < sizeof rates / sizeof rates[0]; r++) {
            const size_t n = lens[a];
            const float rate = rates[r], keep = 1.0f / (1.0f - rate);
            const uint64_t seed = 0x5eed0000u + r, counter = 1000003u * a + 5;
            dropout_forward(out, mask, inp, n, rate, seed, counter);
            size_t bad = n;
            for (size_t i = 0; i < n && bad == n; i++) {
                float want = nn_uniform(seed, counter + i) >= rate ? keep : 0.0f;
                if (mask[i] != want || out[i] != inp[i] * want)
                    bad = i;
            }
            if (bad != n) {
                fprintf(stderr, "dropout n=%zu rate=%g: element %zu differs from nn_uniform\n", n,
                        rate, bad);
                failures++;
            }
        }
    free(inp);
    free(out);
    free(mask);
}

int main(void)
{
    test_dropout_masks_are_the_generator_definition();
    test_mlp_kernels();
    test_cnn_kernels();
    test_keras_cnn_shapes_and_kernels();
    test_activation_kernels();
    test_dnnl_errors_name_the_call();
    test_model_declaration_errors();
    test_folded_sgd_matches_gradient_then_update();
    test_grad_hook_in_the_loop();
    return check_report("test_nn_kernels");
}
