/*
 * nn_model.h - a network of layers over named tensors (a DAG: several inputs
 * and outputs, merges), whose parameters live in ONE contiguous float buffer,
 * with one gradient buffer of the same size beside it, and the training loop
 * that runs over it in C.
 *
 * The graph: tensors 0..ninputs-1 are the model's inputs, tensor ninputs+k
 * is the output of node k; nodes are in topological order (a node reads only
 * tensors before its own) and each is one layer (LayerSpec) with its input
 * tensors. A chain (Sequential) is the graph whose node k reads tensor k.
 * Buffers are planned once per batch size in that order; a tensor read by
 * several nodes gets its gradient summed from each reader's.
 *
 * Shape letters as in nn_ref.h (B batch, H W C input, OH OW OC output, K
 * classes). Activations are NHWC; a Dense layer works on the last axis (an
 * [H, W, C] input gives [H, W, units]). Parameter tensors, in
 * layer order, each kernel then bias:
 *   Dense   kernel [C, OC]          bias [OC]
 *   Conv2D  kernel [KH, KW, C, OC]  bias [OC]       (Keras' layouts)
 * The size table (model_param_info) gives each tensor's offset and shape, so
 * an optimizer step is one loop, a checkpoint one write and a
 * parameter-server push one frame.
 *
 * The loss and the metrics are entries of the tables in nn_loss.h and
 * nn_metric.h (model_set_loss, model_set_metrics). A last Dense layer with
 * softmax or sigmoid is the model's "head": the forward pass leaves that
 * activation to the loss, which applies it and differentiates through it in
 * the stable fused form. Targets are int32 or int64 labels [B] (sparse
 * losses) or float rows [B, K] (the others), with optional sample weights
 * [B]. Inputs are float32 or uint8 rows, converted while they are gathered
 * into the batch (NnData's transform), so that callers hand over their
 * arrays as they are.
 *
 * Not thread-safe per instance: one caller at a time (the Python binding
 * refuses a second call while one runs, with StateError). Kernels run on
 * oneDNN with OpenMP threads.
 */
#ifndef NN_MODEL_H
#define NN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/sg_status.h"
#include "nn/nn_hook.h"
#include "nn/nn_loss.h"
#include "nn/nn_metric.h"
#include "nn/nn_optim.h"
#include "nn/nn_ref.h"

/* The op kinds, in kind order: X(enum suffix, the op's table entry
 * nn_op_<name> in nn_op_<file>.c). A new op is its file and one line here
 * (nn_op.h), its Python class and its tests. */
#define NN_OPS(X)                                                                                  \
    X(DENSE, dense)                                                                                \
    X(CONV2D, conv2d)                                                                              \
    X(MAXPOOL, maxpool)                                                                            \
    X(AVGPOOL, avgpool)                                                                            \
    X(DROPOUT, dropout)                                                                            \
    X(FLATTEN, flatten)                                                                            \
    X(ACTIVATION, activation)                                                                      \
    X(RESHAPE, reshape)                                                                            \
    X(ADD, add)                                                                                    \
    X(CONCATENATE, concatenate)                                                                    \
    X(BATCHNORM, batchnorm)                                                                        \
    X(LAYERNORM, layernorm)                                                                        \
    X(SUBTRACT, subtract)                                                                          \
    X(MULTIPLY, multiply)                                                                          \
    X(AVERAGE, average)                                                                            \
    X(MAXIMUM, maximum)                                                                            \
    X(MINIMUM, minimum)                                                                            \
    X(DOT, dot)                                                                                    \
    X(EMBEDDING, embedding)

typedef enum LayerKind {
#define NN_OP_ENUM(kind, name) LAYER_##kind,
    NN_OPS(NN_OP_ENUM)
#undef NN_OP_ENUM
        LAYER_KIND_COUNT,
} LayerKind;

/* Keras' class name of a layer kind ("Dense"), or NULL for an unknown one. */
const char *nn_layer_kind_name(LayerKind kind);

typedef enum NnInit {
    INIT_GLOROT_UNIFORM = 0,   /* U(-l, l), l = sqrt(6 / (fan_in + fan_out)) */
    INIT_TRUNCATED_NORMAL = 1, /* N(0, 1/sqrt(fan_in)) redrawn beyond 2 stddev (TF walkthrough) */
    INIT_HE_NORMAL = 2,        /* truncated N(0, sqrt(2/fan_in)/0.8796) as Keras */
    INIT_HE_UNIFORM = 3,       /* U(-l, l), l = sqrt(6 / fan_in) */
    INIT_ZEROS = 4,
    INIT_UNIFORM = 5, /* U(-0.05, 0.05): Keras' "uniform" (RandomUniform's defaults) */
} NnInit;

typedef struct LayerSpec {
    LayerKind kind;
    int units;  /* Dense units / Conv2D filters */
    int kh, kw; /* Conv2D kernel / pool window */
    int stride; /* Conv2D / pool stride (pool: 0 = window size) */
    int same;   /* 1 = "same" padding, 0 = "valid" */
    NnAct act;
    float rate; /* Dropout */
    NnInit init;
    int shape[3]; /* Reshape: the target h, w, c */
    /* BatchNormalization, LayerNormalization: on the last axis; with
     * center a beta, with scale a gamma; momentum of the moving statistics
     * (BatchNormalization) */
    float epsilon, momentum;
    int center, scale;
    int normalize; /* Dot: L2-normalize both inputs along the last axis first */
    /* Embedding: rows of its table (ids 0 .. input_dim-1; units is output_dim); mask_zero as
     * Keras' (no numeric effect here: no layer consumes a mask) */
    int input_dim, mask_zero;
} LayerSpec;

/* The most rows an Embedding table has: ids travel as float32 values, exact
 * below 2^24. */
#define NN_MAX_EMBEDDING_ROWS (1 << 24)

/* Inputs a node may read, and inputs and outputs a model may have. */
#define NN_MAX_NODE_INPUTS 64
#define NN_MAX_IO          64

/* One node of the graph: its layer and the tensors it reads (see above).
 * `shares`: -1, or an earlier node whose parameters this one uses (a shared
 * layer, called on several tensors: its spec must be that node's, and its
 * input must give parameters of the same shapes); their gradients add up. */
typedef struct NnNode {
    LayerSpec spec;
    int ninputs;
    int inputs[NN_MAX_NODE_INPUTS];
    int shares;
} NnNode;

/* A tensor's shape per sample (a flat one: h = w = 1). */
typedef struct NnShape {
    int h, w, c;
} NnShape;

/* How model_init_params fills a tensor: the layer's initializer (a bias:
 * zeros), zeros or ones. */
typedef enum NnFill { NN_FILL_INIT = 0, NN_FILL_ZEROS = 1, NN_FILL_ONES = 2 } NnFill;

/* One tensor of the parameter buffer or of the state buffer. */
typedef struct ParamInfo {
    int layer;
    int is_bias;
    size_t offset, size; /* in floats, into the flat buffer */
    int ndim;
    int shape[4];
    const char *name; /* Keras' variable name: "kernel", "bias", "gamma", "moving_mean", ... */
    NnFill fill;
} ParamInfo;

typedef struct LayerShape {
    int h, w, c; /* input (a flat input has h = w = 1) */
    int oh, ow, oc;
    int pt, pl, pb, pr; /* padding */
} LayerShape;

typedef struct NnStats {
    /* sum over samples of w * the per-sample loss, summed over the outputs
     * with their loss weights */
    double loss_sum;
    double output_loss[NN_MAX_IO]; /* each output's loss_sum (unweighted by loss weights) */
    int64_t seen;                  /* samples */
    int64_t steps;                 /* batches */
    /* the metrics' summed states, model_metric_state_size(m) doubles that
     * the passes add to (NULL: metrics not computed) */
    double *metrics;
} NnStats;

/* The element types of the arrays NnData describes. */
typedef enum NnDtype {
    NN_F32 = 0,
    NN_U8 = 1,
    NN_I32 = 2,
    NN_I64 = 3,
    NN_STR32 = 4, /* strings: int32 offsets (Arrow's string) */
    NN_STR64 = 5, /* strings: int64 offsets (Arrow's large_string) */
} NnDtype;

/* n rows of `row` values of one type, contiguous. Strings (NN_STR32,
 * NN_STR64) as Arrow lays them out: value k (row k / row, column k % row) is
 * the bytes data[offsets[k] .. offsets[k + 1]) of nbytes, offsets [n * row
 * + 1]; only a preprocessing chain (nn_prep.h) reads them. */
typedef struct NnArray {
    NnDtype dtype;
    const void *data;
    size_t row;
    const void *offsets;
    size_t nbytes;
} NnArray;

/* A model input's preprocessing chain (nn_prep.h). */
typedef struct NnPrep NnPrep;

/* With `on`, every value of an input becomes (x * scale - mean[j]) / std[j]
 * as it is gathered (j the position in the row; mean/std NULL: 0 and 1);
 * without, float32 rows are copied as they are and uint8 rows converted to
 * float unscaled. */
typedef struct NnTransform {
    int on;
    float scale;
    const float *mean, *std; /* [row] each, or NULL */
} NnTransform;

/* Data in memory, n rows of each: one array per model input, in the model's
 * order (float32, uint8, or int32/int64: ids, gathered as float32 values,
 * exact below 2^24), and one target array per output (none for
 * prediction): int32 or int64 labels [n] for a sparse loss, float32 rows
 * [n, K] for the others; optional sample weights [n]. The one batch-gather
 * stage (nn_train.c) reads every source through this description. */
typedef struct NnData {
    size_t n;
    int ninputs;
    NnArray inputs[NN_MAX_IO];
    NnTransform transforms[NN_MAX_IO];
    /* input i's preprocessing chain (NULL: none): the array is then its raw
     * column and the chain's output is the model's input row */
    const NnPrep *preps[NN_MAX_IO];
    int ntargets;
    NnArray targets[NN_MAX_IO];
    const float *weights; /* [n] sample weights, or NULL (all 1) */
} NnData;

/* A one-input description: x [n, row] float32 or uint8 and one target
 * array (labels int32/int64 [n] or float32 targets [n, k]; NULL: none). */
NnData nn_data(NnDtype xtype, const void *x, size_t n, size_t row, NnDtype ytype, const void *y,
               size_t k);

typedef struct Model Model;

/* Arithmetic of the Dense and Conv2D primitives. NN_BF16: their inputs
 * (activations, weights, output gradients) are converted to bf16 and they
 * accumulate in f32; the parameters, their gradients, the optimizer, the
 * loss, pooling and dropout stay f32 (see nn_plan.c). */
typedef enum NnPrecision {
    NN_FP32 = 0,
    NN_BF16 = 1,
} NnPrecision;

/* Declares the graph: the inputs' shapes, the nodes (topological order) and
 * the output tensors; validates every node (SG_EMODEL naming the layer, and
 * for a merge both inputs' shapes), computes shapes and the size table and
 * allocates the parameter and gradient buffers (zeroed). Every node must
 * lead to an output and every input must be read. */
int model_create_graph(Model **out, const NnShape *inputs, int ninputs, const NnNode *nodes,
                       int nnodes, const int *outputs, int noutputs, SgError *err);
/* A chain of layers on one input of h x w x c (a flat input: 1 x 1 x c),
 * its output the last layer's. */
int model_create(Model **out, int h, int w, int c, const LayerSpec *layers, int nlayers,
                 SgError *err);
void model_free(Model *m);

/* Parameters: params/grads [n]. */
size_t model_num_params(const Model *m);
float *model_params(Model *m);
float *model_grads(Model *m);
int model_num_tensors(const Model *m);
const ParamInfo *model_param_info(const Model *m, int i);
/* Non-trainable state (BatchNormalization's moving statistics): a second
 * flat buffer [n] that training passes update in place (not a gradient: no
 * optimizer, hook or ps push touches it) and inference reads; its size
 * table as the parameters'. Distribution averages it across workers when it
 * is read (python/sparkgrad/nn/training.py). */
size_t model_num_state(const Model *m);
float *model_state(Model *m);
int model_num_state_tensors(const Model *m);
const ParamInfo *model_state_info(const Model *m, int i);
const LayerShape *model_layer_shape(const Model *m, int layer);
int model_num_layers(const Model *m);
int model_num_inputs(const Model *m);
int model_num_outputs(const Model *m);
/* Input i's shape and values per row; output j's tensor and width (K). */
const NnShape *model_input_shape(const Model *m, int i);
size_t model_input_row(const Model *m, int i);
int model_output_tensor(const Model *m, int j);
int model_output_width(const Model *m, int j);
/* Node l's input tensors (its count returned, ids into *ids). */
int model_node_inputs(const Model *m, int l, const int **ids);
/* Output 0's width and input 0's row (one-input one-output callers). */
int model_num_classes(const Model *m);
size_t model_input_size(const Model *m);
/* Output j's head: NN_ACT_SOFTMAX or NN_ACT_SIGMOID when its tensor is a
 * Dense's with that activation that no node reads (applied by the loss),
 * else NN_ACT_NONE; model_head is output 0's. */
NnAct model_output_head(const Model *m, int j);
NnAct model_head(const Model *m);

/* Output j's training loss (default: sparse cross-entropy, or binary
 * cross-entropy under a sigmoid head, or mean squared error on one linear
 * output) and its weight in the total; checked against the head and the
 * output's width (SG_EMODEL). The metrics (none by default) are checked
 * against the output and the loss's targets. model_set_loss and
 * model_set_metrics are output 0's. */
int model_set_output_loss(Model *m, int j, const NnLoss *loss, float weight, SgError *err);
int model_set_loss(Model *m, const NnLoss *loss, SgError *err);
const NnLoss *model_output_loss(const Model *m, int j);
const NnLoss *model_loss(const Model *m);
int model_set_output_metrics(Model *m, int j, const NnMetric *metrics, int n, SgError *err);
int model_set_metrics(Model *m, const NnMetric *metrics, int n, SgError *err);
/* Doubles in the metrics' state (NnStats.metrics): the outputs' metrics in
 * output order, each metric's part in its order; their values come from
 * nn_metric_result on each metric's part of a (summed) state. */
size_t model_metric_state_size(const Model *m);

/* 1 if this CPU (as oneDNN sees it, ONEDNN_MAX_CPU_ISA included) computes
 * bf16 natively (AVX512_BF16 or AMX). */
int nn_bf16_supported(void);

/* Sets the precision of every later pass (the cached plans are dropped) and
 * returns the precision in use: NN_BF16 falls back to NN_FP32 where
 * nn_bf16_supported() is 0. A layer whose bf16 primitives oneDNN does not
 * implement for its shapes runs in f32 (model_bf16_layers counts the others). */
NnPrecision model_set_precision(Model *m, NnPrecision p);
NnPrecision model_precision(const Model *m);
/* Weighted layers whose primitives run in bf16, in the plan of batch size B
 * (built if needed); 0 in NN_FP32. */
int model_bf16_layers(Model *m, int B, int *count, SgError *err);

/* Fills the parameters from the seeded initialisers (biases zero) and the
 * state from its fills (moving means 0, moving variances 1). */
void model_init_params(Model *m, uint64_t seed);

/* RNG state (dropout masks, shuffling): a seed and a counter. */
void model_get_rng(const Model *m, uint64_t *seed, uint64_t *counter);
void model_set_rng(Model *m, uint64_t seed, uint64_t counter);

/* order[n] = a permutation of 0..n-1 drawn from the model RNG. */
void model_shuffle(Model *m, int64_t *order, size_t n);

/* One training batch of rows order[start..start+B) (order NULL: contiguous):
 * forward, loss, backward into the gradient buffer, the gradient hook (if
 * hook is not NULL, nn_hook.h: ready() per layer during backward, last layer
 * first, then step()) and, if opt is not NULL and step() did not return 1,
 * the optimizer update. When opt is plain SGD (optim_take_plain_sgd_step),
 * there is no hook, the precision is NN_FP32 and every layer is Dense,
 * Dropout or Flatten, the update
 * is folded into the weight-gradient GEMMs and the gradient buffer is not
 * written. *step (may be NULL) is the model's step count: on entry before
 * this batch, on return after it (+1, or what the hook's step() set). Adds
 * the batch's results into st. */
int model_train_batch(Model *m, Optimizer *opt, const NnData *d, const int64_t *order, size_t start,
                      int B, const NnGradHook *hook, int64_t *step, NnStats *st, SgError *err);

/* Up to nsteps batches of `batch` rows from position start (the last one may
 * be short), as model_train_batch; an error (the hook's too) ends the run
 * with the context "training step at row N". */
int model_fit_steps(Model *m, Optimizer *opt, const NnData *d, const int64_t *order, size_t start,
                    int batch, int64_t nsteps, const NnGradHook *hook, int64_t *step, NnStats *st,
                    SgError *err);

/* Inference over all rows of d (dropout off): loss and metrics into st. */
int model_evaluate(Model *m, const NnData *d, int batch, NnStats *st, SgError *err);

/* Inference outputs for the inputs of d (targets unused): out[j] [d->n, K_j]
 * for each output j, its head (softmax, sigmoid) applied. */
int model_predict(Model *m, const NnData *d, int batch, float *const *out, SgError *err);

/* Embedding tables (a parameter tensor each, shared nodes counted once) and
 * the rows of each that the last backward pass touched: *tables[i] gives the
 * table's place in the flat buffer (off, rows, dim) and its touched rows
 * (ids: sorted, unique, nids of them; duplicates within the batch were
 * summed). Valid until the next training step. The table's range of the
 * gradient buffer is zero outside those rows (see nn_op_embedding.c), so a
 * dense reader of the buffer sees the right gradient and a sparse one (the
 * optimizer, a parameter server) can read those rows alone. The count is
 * returned. */
int model_touched_rows(const Model *m, const OptimRows **tables);

/* OpenMP threads for oneDNN and the C loops. */
void nn_set_num_threads(int n);
int nn_get_num_threads(void);

#endif /* NN_MODEL_H */
