/*
 * nn_dnnl.h - the one checking helper every oneDNN call goes through, and the
 * small helpers for plain-layout memory descriptors and primitive execution.
 *
 * DNNL(err, fn, args...) calls fn(args...) and, when it does not return
 * dnnl_success, records "fn: <status>" into err with code SG_EDNNL and
 * evaluates to SG_EDNNL; otherwise it evaluates to 0. Call sites read
 *     if ((rc = DNNL(err, dnnl_memory_create, &m, md, eng, ptr)) < 0) goto cleanup;
 */
#ifndef NN_DNNL_H
#define NN_DNNL_H

#include <oneapi/dnnl/dnnl.h>

#include "common/sg_status.h"

int nn_dnnl_check(SgError *err, const char *call, dnnl_status_t status);

#define DNNL(err, fn, ...) nn_dnnl_check((err), #fn, fn(__VA_ARGS__))

/* One primitive execution: the primitive and its (argument, memory) pairs. */
#define NN_EXEC_MAX_ARGS 10
typedef struct NnExec {
    dnnl_primitive_t prim;
    int nargs;
    dnnl_exec_arg_t args[NN_EXEC_MAX_ARGS];
} NnExec;

/* Creates a f32 memory descriptor of ndims dims with a plain format tag. */
int nn_md(dnnl_memory_desc_t *out, int ndims, const dnnl_dim_t *dims, dnnl_format_tag_t tag,
          SgError *err);

/* The same with data type dt (dnnl_f32 or dnnl_bf16). */
int nn_md_dt(dnnl_memory_desc_t *out, int ndims, const dnnl_dim_t *dims, dnnl_data_type_t dt,
             dnnl_format_tag_t tag, SgError *err);

/* 1 if oneDNN runs bf16 dot products natively on this CPU: the effective ISA
 * (capped by ONEDNN_MAX_CPU_ISA) includes AVX512_BF16 (or AMX). Without it
 * oneDNN would emulate bf16, slower than f32. */
int nn_bf16_native(void);

/* Creates a memory object over caller-owned data (not freed by oneDNN). */
int nn_mem(dnnl_memory_t *out, const_dnnl_memory_desc_t md, dnnl_engine_t eng, void *data,
           SgError *err);

/* Creates the primitive of pd (and keeps pd owned by the caller). */
int nn_prim(dnnl_primitive_t *out, const_dnnl_primitive_desc_t pd, SgError *err);

/* Runs an NnExec on the stream (no wait). */
int nn_exec(const NnExec *e, dnnl_stream_t stream, SgError *err);

/* Adds (arg, mem) to e. */
void nn_exec_arg(NnExec *e, int arg, dnnl_memory_t mem);

#endif /* NN_DNNL_H */
