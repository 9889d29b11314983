/* nn_version.c - oneDNN build-time and run-time versions. */
#include "nn/nn_version.h"

#include <oneapi/dnnl/dnnl.h>

NnVersion nn_onednn_runtime_version(void)
{
    const dnnl_version_t *v = dnnl_version();
    NnVersion out = {v->major, v->minor, v->patch, v->cpu_runtime};
    return out;
}

NnVersion nn_onednn_build_version(void)
{
    NnVersion out = {DNNL_VERSION_MAJOR, DNNL_VERSION_MINOR, DNNL_VERSION_PATCH, DNNL_CPU_RUNTIME};
    return out;
}
