/*
 * nn_op.h - the layer ops, one table entry per kind (NnOpKind), each in a
 * file of its own (nn_op_<kind>.c): how it infers its output shape and
 * declares its parameters, the plan scratch it needs, how it builds its
 * oneDNN primitives once per batch size, and its forward and backward
 * passes. The model (nn_model.c), the plan (nn_plan.c) and the trainer loop
 * over the table; nothing outside an op's file switches on its kind.
 *
 * A new op is: its file, its line in NN_OPS (nn_model.h: the kind number
 * and the table entry follow), its Python class (python/sparkgrad/nn/
 * layers.py, which takes the kind numbers from _core.LAYER_KINDS) and its
 * tests.
 */
#ifndef NN_OP_H
#define NN_OP_H

#include "nn/nn_model_impl.h"

/* What an op is (NnOpKind.flags). */
enum {
    NN_OP_WEIGHTED = 1 << 0,   /* declares a kernel and a bias; may run on bf16 inputs */
    NN_OP_ALIAS = 1 << 1,      /* its output is its input's buffer, reshaped (no pass) */
    NN_OP_ACTIVATION = 1 << 2, /* takes an activation (LayerSpec.act) */
    NN_OP_FOLDS_SGD = 1 << 3,  /* its backward takes plain SGD folded in (NnOpBackward.sgd_lr) */
    NN_OP_MERGE = 1 << 4,      /* reads 2 to NN_MAX_NODE_INPUTS tensors (others read one) */
    /* its first parameter tensor is a table [rows, dim] whose gradient is a
     * set of rows (m->tables; Embedding) */
    NN_OP_SPARSE_ROWS = 1 << 5,
};

/* How build makes a weighted op's primitives (see nn_op_weighted.c). */
typedef struct NnOpBuild {
    int bf16;        /* the primitives take bf16 copies of their inputs */
    int input_bf16;  /* the op's input buffer holds bf16, written so by the op before */
    int output_bf16; /* its output buffer holds bf16, for the weighted op after */
} NnOpBuild;

/* What a backward pass is asked for besides the gradients. */
typedef struct NnOpBackward {
    /* told each weighted op's range of the gradient buffer once it is final */
    const NnGradHook *hook;
    /* plain SGD folded into the weight-gradient GEMMs (NN_OP_FOLDS_SGD), or
     * NULL: the gradient buffer is then not written for these ops */
    const float *sgd_lr;
} NnOpBackward;

typedef struct NnOpKind {
    const char *name; /* Keras' class name */
    unsigned flags;
    /* Checks layer l's spec against its input (m->shapes[l].h/w/c, set by
     * the caller from its first input; a merge reads the others' in
     * m->tshape), sets its output shape and padding, and declares its
     * parameters (model_add_tensor). SG_EMODEL naming the layer. */
    int (*infer)(Model *m, int l, SgError *err);
    /* Floats of plan scratch beyond its activation and gradient (Dropout's
     * mask), handed to it as p->lp[l].scratch; NULL: none. */
    size_t (*scratch)(const Model *m, int l, int B);
    /* Builds its primitives into p->lp[l] (NULL: none). A weighted op whose
     * bf16 primitives oneDNN lacks returns SG_EDNNL; the plan then rebuilds
     * it in f32. */
    int (*build)(Model *m, Plan *p, int l, const NnOpBuild *how, SgError *err);
    /* Forward from its inputs (op_src) into its output (op_dst) (NULL:
     * nothing to run). */
    int (*forward)(Model *m, Plan *p, int l, int training, SgError *err);
    /* Backward from op_ddst: its parameter gradients into m->grads and its
     * inputs' gradients into op_dsrc, where that is not NULL (an input of the
     * model needs none) (NULL: nothing to run). */
    int (*backward)(Model *m, Plan *p, int l, const NnOpBackward *how, SgError *err);
} NnOpKind;

#define NN_OP_EXTERN(kind, name) extern const NnOpKind nn_op_##name;
NN_OPS(NN_OP_EXTERN)
#undef NN_OP_EXTERN

/* Node l's buffers in plan p: its input k, its output, the gradient of its
 * output (summed over its readers) and the one it writes for its input k
 * (NULL: not needed). */
static inline float *op_src(const Model *m, const Plan *p, int l, int k)
{
    return p->act[node_in(m, l, k)];
}
static inline float *op_dst(const Model *m, const Plan *p, int l)
{
    return p->act[node_out(m, l)];
}
static inline float *op_ddst(const Model *m, const Plan *p, int l)
{
    return p->dact[node_out(m, l)];
}
static inline float *op_dsrc(const Plan *p, int l, int k)
{
    return p->din[(size_t)l * NN_MAX_NODE_INPUTS + k];
}
/* The shape of node l's input k. */
static inline const NnShape *op_in_shape(const Model *m, int l, int k)
{
    return &m->tshape[node_in(m, l, k)];
}

/* The table entry of a kind, or NULL for an unknown one. */
const NnOpKind *nn_op_kind(LayerKind kind);
/* The entry of model layer l. */
const NnOpKind *nn_op_of(const Model *m, int l);

/* ---- what ops share (nn_op.c, nn_plan.c, nn_model.c) ----------------------- */

/* Output size of a window of k with stride s over `in` ("same": padded so the
 * output is ceil(in / s), the padding split low/high). */
int nn_op_window(int in, int k, int s, int same, int *pad_lo, int *pad_hi);
/* A window op's shapes (Conv2D, pooling): stride default_stride when the
 * spec's is 0, output channels the spec's units when `filters`, else the
 * input's; SG_EMODEL naming the layer when the window does not fit. */
int nn_op_infer_window(Model *m, int l, int default_stride, int filters, SgError *err);
/* Floats in layer l's output for one sample. */
size_t nn_op_out_size(const Model *m, int l);
/* Runs list[0..n), skipping index `skip` (-1: none); `what` prefixes an error. */
int nn_op_run(Model *m, NnExec *list, int n, int skip, int l, const char *what, SgError *err);
/* Node l's parameter gradients, grads [offset, offset + n), are written
 * (a node sharing another's parameters wrote them to `mine`: they are added
 * to the others' here); with a hook, ready() is told the range is final. */
int nn_op_params_done(Model *m, int l, const NnOpBackward *how, size_t offset, size_t n,
                      const float *mine, SgError *err);
/* An op's forward / backward that runs the primitives its build listed in
 * p->lp[l].fwd / bwd, in order (pooling, Activation). */
int nn_op_forward_primitives(Model *m, Plan *p, int l, int training, SgError *err);
int nn_op_backward_primitives(Model *m, Plan *p, int l, const NnOpBackward *how, SgError *err);

/* 1 if weighted node l's activation runs as eltwise primitives after its
 * primitive (gelu, selu, swish, softplus), not fused into it
 * (nn_op_weighted.c); its output is then f32 even in a bf16 chain. */
int nn_weighted_unfused(const Model *m, int l);

/* The oneDNN eltwise algorithm and alpha of an activation (SELU: its ELU
 * part; softmax and unknown ones: undef). */
dnnl_alg_kind_t nn_op_eltwise(NnAct act, float *alpha);
/* An activation as eltwise primitives of layer l, forward src -> dst
 * appended to its forward list and, unless dsrc is NULL, backward (from src)
 * ddst -> dsrc put at the front of its backward list (dsrc may be ddst: in
 * place). SELU runs as ELU into mid (B x its size floats) then a scale. */
int nn_op_eltwise_chain(Model *m, Plan *p, int l, NnAct act, const_dnnl_memory_desc_t md,
                        float *src, float *mid, float *dst, float *dsrc, float *ddst, SgError *err);

/* Plan bookkeeping for builds (nn_plan.c): a memory over data (or
 * DNNL_MEMORY_ALLOCATE), a primitive, a reorder from -> to appended as *e,
 * the bf16 weights copy the optimizer can write; all freed with the plan. */
int plan_mem(Model *m, Plan *p, dnnl_memory_t *out, const_dnnl_memory_desc_t md, void *data,
             SgError *err);
int plan_prim(Plan *p, dnnl_primitive_t *out, const_dnnl_primitive_desc_t pd, SgError *err);
int plan_reorder(Model *m, Plan *p, NnExec *e, dnnl_memory_t from, dnnl_memory_t to, SgError *err);
int plan_copy(Plan *p, const OptimBf16Copy *c, SgError *err);

/* Declares a parameter tensor of layer l (nn_model.c): its index. A
 * kernel ("kernel", the layer's initializer) or a bias ("bias", zeros). */
int model_add_tensor(Model *m, int layer, int is_bias, int ndim, const int *shape);
/* Declares a parameter tensor of layer l by name and fill: its index. */
int model_add_param(Model *m, int layer, const char *name, NnFill fill, int ndim, const int *shape);
/* Declares a tensor of layer l in the state buffer: its index into
 * m->states. */
int model_add_state(Model *m, int layer, const char *name, NnFill fill, int ndim, const int *shape);
/* Node l's parameter tensor i and state tensor i (NULL: it has no i-th). */
static inline const ParamInfo *op_param(const Model *m, int l, int i)
{
    return i < m->param_count[l] ? &m->tensors[m->param_first[l] + i] : NULL;
}
static inline const ParamInfo *op_state(const Model *m, int l, int i)
{
    return i < m->state_count[l] ? &m->states[m->state_first[l] + i] : NULL;
}

#endif /* NN_OP_H */
