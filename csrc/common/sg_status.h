/*
 * sg_status.h - status codes and the caller-owned error message of the C core.
 *
 * Every fallible C function returns 0 (SG_OK) or a negative SgStatus and, on
 * failure, fills the caller's SgError with what failed, where (file, byte
 * offset, feature, peer) and why. The core never prints, exits or aborts on
 * bad input. The binding layer (csrc/py/sg_module.c) turns each status into a
 * Python exception through SG_STATUS_LIST, the one table of codes.
 */
#ifndef SG_STATUS_H
#define SG_STATUS_H

#include <stddef.h>

/* X(name, value, python exception class in sparkgrad.errors) */
#define SG_STATUS_LIST(X)                                                                          \
    X(SG_ENOMEM, -1, "OutOfMemoryError")                                                           \
    X(SG_EINVAL, -2, "InvalidArgumentError")                                                       \
    X(SG_EIO, -3, "SparkgradIOError")                                                              \
    X(SG_ETIMEOUT, -4, "SparkgradTimeout")                                                         \
    X(SG_ECANCELLED, -5, "CancelledError")                                                         \
    X(SG_ESTATE, -6, "StateError")                                                                 \
    X(SG_ERECORD, -10, "RecordError")                                                              \
    X(SG_ECORRUPT, -11, "CorruptRecordError")                                                      \
    X(SG_ETRUNCATED, -12, "TruncatedRecordError")                                                  \
    X(SG_EPROTOBUF, -13, "ExampleDecodeError")                                                     \
    X(SG_ESCHEMA, -20, "SchemaError")                                                              \
    X(SG_EMODEL, -25, "ModelError")                                                                \
    X(SG_EDNNL, -26, "OneDNNError")                                                                \
    X(SG_ECHECKPOINT, -27, "CheckpointError")                                                      \
    X(SG_ENONFINITE, -28, "NonFiniteLossError")                                                    \
    X(SG_ECLUSTER, -30, "ClusterError")                                                            \
    X(SG_ERDV_TIMEOUT, -31, "RendezvousTimeout")                                                   \
    X(SG_ENODE, -32, "NodeFailure")                                                                \
    X(SG_ESLOTS, -33, "InsufficientSlotsError")                                                    \
    X(SG_EPROTO, -40, "ProtocolError")                                                             \
    X(SG_EAUTH, -41, "AuthError")                                                                  \
    X(SG_EFRAME, -42, "FrameTooLargeError")                                                        \
    X(SG_EPEER, -43, "PeerClosedError")                                                            \
    X(SG_EREST, -50, "RestError")

typedef enum SgStatus {
    SG_OK = 0,
#define SG_STATUS_ENUM(name, value, pyname) name = value,
    SG_STATUS_LIST(SG_STATUS_ENUM)
#undef SG_STATUS_ENUM
} SgStatus;

#define SG_ERROR_MAX 1024

/* Caller-owned error report: the code of the first failure and its message. */
typedef struct SgError {
    int code;
    char msg[SG_ERROR_MAX];
} SgError;

/* Formats msg into err (if err is not NULL) and returns code, so call sites
 * read `return sg_fail(err, SG_ECORRUPT, "...", ...)`. */
int sg_fail(SgError *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Prepends context ("reading 'x.tfrecord': ") to an error already set;
 * returns err->code. */
int sg_context(SgError *err, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Like sg_fail with strerror(errno_value) appended. */
int sg_fail_errno(SgError *err, int code, int errno_value, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

void sg_error_clear(SgError *err);

/* The symbolic name of a status ("SG_ECORRUPT"), or "SG_UNKNOWN". */
const char *sg_status_name(int code);

#endif /* SG_STATUS_H */
