/* nn_dnnl.c - checked oneDNN helpers (see nn_dnnl.h). */
#include "nn/nn_dnnl.h"

static const char *status_name(dnnl_status_t s)
{
    switch (s) {
    case dnnl_success:
        return "success";
    case dnnl_out_of_memory:
        return "out of memory";
    case dnnl_invalid_arguments:
        return "invalid arguments";
    case dnnl_unimplemented:
        return "unimplemented (no implementation for these shapes/formats)";
    case dnnl_last_impl_reached:
        return "last implementation reached";
    case dnnl_runtime_error:
        return "runtime error";
    case dnnl_not_required:
        return "not required";
    default:
        return "unknown status";
    }
}

int nn_dnnl_check(SgError *err, const char *call, dnnl_status_t status)
{
    if (status == dnnl_success)
        return 0;
    return sg_fail(err, SG_EDNNL, "%s failed: %s (dnnl_status_t %d)", call, status_name(status),
                   (int)status);
}

int nn_md(dnnl_memory_desc_t *out, int ndims, const dnnl_dim_t *dims, dnnl_format_tag_t tag,
          SgError *err)
{
    return DNNL(err, dnnl_memory_desc_create_with_tag, out, ndims, dims, dnnl_f32, tag);
}

int nn_md_dt(dnnl_memory_desc_t *out, int ndims, const dnnl_dim_t *dims, dnnl_data_type_t dt,
             dnnl_format_tag_t tag, SgError *err)
{
    return DNNL(err, dnnl_memory_desc_create_with_tag, out, ndims, dims, dt, tag);
}

int nn_bf16_native(void)
{
    const unsigned need = (unsigned)dnnl_cpu_isa_avx512_core_bf16;
    return ((unsigned)dnnl_get_effective_cpu_isa() & need) == need;
}

int nn_mem(dnnl_memory_t *out, const_dnnl_memory_desc_t md, dnnl_engine_t eng, void *data,
           SgError *err)
{
    return DNNL(err, dnnl_memory_create, out, md, eng, data);
}

int nn_prim(dnnl_primitive_t *out, const_dnnl_primitive_desc_t pd, SgError *err)
{
    return DNNL(err, dnnl_primitive_create, out, pd);
}

int nn_exec(const NnExec *e, dnnl_stream_t stream, SgError *err)
{
    return DNNL(err, dnnl_primitive_execute, e->prim, stream, e->nargs, e->args);
}

void nn_exec_arg(NnExec *e, int arg, dnnl_memory_t mem)
{
    e->args[e->nargs].arg = arg;
    e->args[e->nargs].memory = mem;
    e->nargs++;
}
