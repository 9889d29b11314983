/*
 * nn_version.h - the oneDNN the engine was built against and the one it runs
 * on; the binding refuses to import when the runtime is older than the
 * headers' major.minor.
 */
#ifndef NN_VERSION_H
#define NN_VERSION_H

typedef struct NnVersion {
    int major, minor, patch;
    unsigned cpu_runtime; /* DNNL_RUNTIME_* */
} NnVersion;

NnVersion nn_onednn_runtime_version(void);
NnVersion nn_onednn_build_version(void);

#endif
