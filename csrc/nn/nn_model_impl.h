/*
 * nn_model_impl.h - the Model and its execution plans, shared by
 * nn_model.c (declaration, parameters), nn_plan.c (oneDNN primitives,
 * forward/backward) and nn_train.c (loops). Not part of the public API.
 */
#ifndef NN_MODEL_IMPL_H
#define NN_MODEL_IMPL_H

#include "nn/nn_dnnl.h"
#include "nn/nn_model.h"
#include "nn/nn_optim.h"

#define PLAN_CACHE 2

typedef struct LayerPlan {
    NnExec fwd[5]; /* [src to bf16,] [weights reorder,] compute, [activation (SELU: 2)] */
    int nfwd;
    NnExec bwd[12]; /* [act bwd (SELU: 2),] [diff_dst to bf16,] [src, diff_dst reorders,] bwd
                      weights, [diff weights reorder,] [weights reorder,] bwd data */
    int nbwd;
    float *scratch; /* the op's plan scratch (NnOpKind.scratch): Dropout's mask [B, out] */
    /* weighted ops: bwd[wgrad_first .. +wgrad_count) compute the weight
     * gradients (the weights backward and its reorder); the folded SGD path
     * skips them */
    int wgrad_first, wgrad_count;
    int bf16; /* the op's primitives run on bf16 inputs (see nn_op_weighted.c) */
    /* act[l] and dact[l] (input_bf16), act[l+1] and dact[l+1] (output_bf16) hold bf16 */
    int input_bf16, output_bf16;
    /* bf16 Dense: fwd[weights_convert] converts the f32 master weights into
     * the bf16 copy the forward reads, which the optimizer can also write
     * (copy); or -1 */
    int weights_convert;
} LayerPlan;

/* Output j's buffers in a plan. */
typedef struct PlanOutput {
    float *out;      /* [B, K]: the outputs after the head (nn_loss.h) */
    float *dz;       /* [B, K]: where the loss writes its gradient (dact, or an edge of it) */
    float *targets;  /* [B, K]: dense targets */
    int32_t *labels; /* [B]: sparse targets */
} PlanOutput;

/* Everything that depends on the batch size B. Buffers are per tensor
 * (T = inputs + nodes): act[t] its values [B, size], dact[t] the gradient
 * with respect to it (NULL where none is needed: the inputs, and aliases of
 * them). A tensor with one reader hands that reader dact[t] itself; one with
 * several (the loss of an output counts as one) gives each reader an edge
 * buffer of its own and sums them into dact[t] before its producer's
 * backward (model_backward). */
typedef struct Plan {
    int B;
    uint64_t last_use;
    float *arena;    /* every buffer below */
    float **act;     /* [T] */
    float **dact;    /* [T] */
    float **din;     /* [L * NN_MAX_NODE_INPUTS]: node l's gradient of its input k */
    int *edge_first; /* [T+1]: tensor t's edge buffers are edges[edge_first[t] ..] */
    float **edges;   /* several readers' gradient buffers, to sum */
    float *colsum;   /* [widest layer]: the bias gradient sums of the folded SGD update */
    PlanOutput outputs[NN_MAX_IO];
    float *weights;         /* [B]: sample weights */
    int64_t *rows;          /* [B]: the data row each batch row was gathered from (messages) */
    LayerPlan *lp;          /* [L] */
    int nbf16;              /* weighted layers built in bf16 */
    int input16[NN_MAX_IO]; /* act[i] holds input i in bf16 (its one reader is bf16) */
    float *rowbuf;          /* [widest input row]: gather's scratch for input16 */
    OptimBf16Copy *copies;  /* [ncopies]: the bf16 weights the optimizer can write */
    int ncopies;
    dnnl_memory_t *mems;
    int nmems, capmems;
    dnnl_primitive_t *prims;
    int nprims, capprims;
} Plan;

/* An Embedding table's gradient bookkeeping (nn_op_embedding.c); its
 * touched rows are the model's touched[i]. */
typedef struct NnTable {
    int32_t *ids; /* [cap]: the batch's ids collected, then sorted and made unique */
    int32_t *tmp; /* [cap]: the sort's scratch */
    size_t cap;
    uint64_t *seen; /* [(rows + 63) / 64] bits, zero between calls: unique_ids' bitmap */
    /* what of the table's gradient range may be nonzero: the touched rows
     * (grads_rows), or any row (grads_whole: a gradient hook wrote the
     * buffer); the next backward clears it first */
    int grads_rows, grads_whole;
} NnTable;

/* Output j of the model. */
typedef struct ModelOutput {
    int tensor;
    int width;         /* K */
    NnAct head;        /* see model_output_head */
    NnLoss loss;       /* model_set_output_loss */
    float loss_weight; /* its weight in the total loss (1) */
    NnMetric *metrics; /* [nmetrics] */
    int nmetrics;
    size_t metric_state; /* doubles in its metrics' state */
} ModelOutput;

struct Model {
    int nlayers;        /* L, the nodes */
    LayerSpec *specs;   /* [L] */
    LayerShape *shapes; /* [L]: input 0's shape, the output's, padding */
    NnNode *nodes;      /* [L]: the tensors each reads */
    int ninputs;        /* the model's inputs: tensors 0 .. ninputs-1 */
    int ntensors_graph; /* T = ninputs + L */
    NnShape *tshape;    /* [T] */
    int *readers;       /* [T]: edges reading the tensor (an output's loss counts) */
    /* [L]: node l shares its parameters with other nodes; its weight
     * gradients go to its plan scratch and are added into m->grads after its
     * backward, except at the group's last node (the first backward reaches),
     * which writes them */
    int *accumulate;
    /* [L]: node l tells the gradient hook its parameters' range (the group's
     * first node, the last backward reaches; every unshared node) */
    int *tells;
    int *needs_grad; /* [T]: 0 for the inputs and aliases of them */
    int noutputs;
    ModelOutput outputs[NN_MAX_IO];
    int classes;         /* outputs[0].width */
    size_t metric_state; /* doubles in the metrics' state, every output's */
    ParamInfo *tensors;  /* size table */
    int ntensors;
    int *kernel_t, *bias_t; /* [L]: tensor index or -1 (weighted ops) */
    /* [L]: node l's parameter tensors are tensors[param_first .. + param_count)
     * (a shared node's: its group's), its state tensors states[state_first ..
     * + state_count) */
    int *param_first, *param_count, *state_first, *state_count;
    size_t nparams;
    float *params;     /* [nparams] */
    float *grads;      /* [nparams] */
    ParamInfo *states; /* the state buffer's size table */
    int nstates;
    size_t nstate;
    float *state; /* [nstate] */
    dnnl_engine_t eng;
    dnnl_stream_t stream;
    Plan *plans[PLAN_CACHE];
    uint64_t use_clock;
    uint64_t rng_seed, rng_counter;
    NnPrecision precision; /* in use: NN_BF16 only where nn_bf16_native() */
    /* Embedding tables (NN_OP_SPARSE_ROWS ops' first tensor, one per
     * parameter group): their touched rows (model_touched_rows) and
     * bookkeeping; table_of[l] is node l's table, or -1 */
    int ntables;
    OptimRows *touched; /* [ntables] */
    NnTable *tables;    /* [ntables] */
    int *table_of;      /* [L] */
    /* the plan whose bf16 weights (Plan.copies) the last optimizer step wrote,
     * within one model_fit_steps; its next forward skips their conversions */
    Plan *w16_fresh;
    /* the gradient hook of the training forward under way (its rows()), or NULL */
    const NnGradHook *hook;
};

/* The tensor node l writes, and its k-th input. */
static inline int node_out(const Model *m, int l)
{
    return m->ninputs + l;
}
static inline int node_in(const Model *m, int l, int k)
{
    return m->nodes[l].inputs[k];
}

/* After a gradient hook's step(): any row of the tables' gradient ranges may
 * be nonzero (an allreduce's average), so the next backward clears them
 * whole (nn_op_embedding.c). */
void model_tables_written(Model *m);

/* After a sparse hook's step(), which may point a table's ids at its own
 * memory (nn_hook.h): those ids copied into the table's buffer
 * (nn_op_embedding.c), so the model never reads the hook's memory after the
 * hook is gone. */
int model_tables_keep_ids(Model *m, SgError *err);

/* nn_plan.c (the op kinds: nn_op.h) */
void plan_free(Plan *p);
int model_plan(Model *m, int B, Plan **out, SgError *err);
/* Forward through every layer from p->act[0]; training enables dropout. */
int model_forward(Model *m, Plan *p, int training, SgError *err);
/* The activation layer l's primitives fuse: its own, except the head's. */
NnAct model_layer_act(const Model *m, int l);
/* Backward from the outputs' gradients (PlanOutput.dz) into m->grads; with a hook
 * whose ready is set, ready() is told each weighted layer's range of the
 * gradient buffer as soon as it is final (last layer first). */
int model_backward(Model *m, Plan *p, const NnGradHook *hook, SgError *err);
/* 1 if every layer is Dense, Dropout or Flatten: model_backward_sgd applies. */
int model_dense_only(const Model *m);
/* Backward with plain SGD folded in: per Dense layer the
 * activation and data backward as model_backward, then
 * W -= lr * src^T @ dY in one GEMM (beta 1) and b -= lr * colsum(dY).
 * m->grads is not written. Needs model_dense_only(m). */
int model_backward_sgd(Model *m, Plan *p, float lr, SgError *err);

#endif /* NN_MODEL_IMPL_H */
