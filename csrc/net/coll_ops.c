/*
 * coll_ops.c - the arithmetic of the collectives (coll_internal.h): element
 * sizes and the reduction kernels per dtype and op (the 16-bit float
 * conversions are common/sg_half.h's). Integer
 * sums wrap as NumPy's do (computed on unsigned values, so no signed
 * overflow). No I/O here.
 */
#include <math.h>
#include <string.h>

#include "common/sg_half.h"
#include "net/coll_internal.h"

size_t coll_dtype_size(int dtype)
{
    switch (dtype) {
    case COLL_F32:
    case COLL_I32:
        return 4;
    case COLL_F64:
    case COLL_I64:
        return 8;
    case COLL_BYTES:
        return 1;
    default:
        return 0;
    }
}

size_t coll_wire_size(CollDtype dtype, CollCompression comp)
{
    return comp != COLL_COMP_NONE ? 2 : coll_dtype_size(dtype);
}

static float wire_f32(const uint8_t *p, CollCompression comp)
{
    uint16_t h;
    memcpy(&h, p, sizeof h);
    return comp == COLL_COMP_FP16 ? sg_f16_to_f32(h) : sg_bf16_to_f32(h);
}

/* One loop per (type, op); `a` is dst[i], `b` the arriving value. */
#define REDUCE_LOOP(T, GET, EXPR)                                                                  \
    do {                                                                                           \
        T *d = dst;                                                                                \
        for (size_t i = 0; i < n; i++) {                                                           \
            T a = d[i], b = GET;                                                                   \
            d[i] = EXPR;                                                                           \
        }                                                                                          \
    } while (0)

#define REDUCE_OPS(T, U, GET)                                                                      \
    switch (op) {                                                                                  \
    case COLL_SUM:                                                                                 \
    case COLL_AVERAGE:                                                                             \
        REDUCE_LOOP(T, GET, (T)((U)a + (U)b));                                                     \
        break;                                                                                     \
    case COLL_MIN:                                                                                 \
        REDUCE_LOOP(T, GET, b < a ? b : a);                                                        \
        break;                                                                                     \
    case COLL_MAX:                                                                                 \
        REDUCE_LOOP(T, GET, b > a ? b : a);                                                        \
        break;                                                                                     \
    }

/* Unaligned readers of wire element i (the wire buffer has no alignment guarantee). */
#define DEFINE_WIRE_GET(NAME, T)                                                                   \
    static T NAME(const uint8_t *w, size_t i)                                                      \
    {                                                                                              \
        T v;                                                                                       \
        memcpy(&v, w + sizeof(T) * i, sizeof v);                                                   \
        return v;                                                                                  \
    }

DEFINE_WIRE_GET(get_f32, float)
DEFINE_WIRE_GET(get_f64, double)
DEFINE_WIRE_GET(get_i32, int32_t)
DEFINE_WIRE_GET(get_i64, int64_t)

void coll_reduce(void *dst, const uint8_t *wire, size_t n, CollDtype dtype, CollOp op,
                 CollCompression comp)
{
    switch (dtype) {
    case COLL_F32:
        if (comp != COLL_COMP_NONE) {
            REDUCE_OPS(float, float, wire_f32(wire + 2 * i, comp));
        } else {
            REDUCE_OPS(float, float, get_f32(wire, i));
        }
        break;
    case COLL_F64:
        REDUCE_OPS(double, double, get_f64(wire, i));
        break;
    case COLL_I32:
        REDUCE_OPS(int32_t, uint32_t, get_i32(wire, i));
        break;
    case COLL_I64:
        REDUCE_OPS(int64_t, uint64_t, get_i64(wire, i));
        break;
    default:
        break;
    }
}

void coll_decode(float *dst, const uint8_t *wire, size_t n, CollCompression comp)
{
    for (size_t i = 0; i < n; i++)
        dst[i] = wire_f32(wire + 2 * i, comp);
}

void coll_encode(uint8_t *wire, const float *src, size_t n, CollCompression comp)
{
    for (size_t i = 0; i < n; i++) {
        uint16_t h = comp == COLL_COMP_FP16 ? sg_f32_to_f16(src[i]) : sg_f32_to_bf16(src[i]);
        memcpy(wire + 2 * i, &h, sizeof h);
    }
}

/* buf's n values of type T divided by size (the average's last step). */
#define DIVIDE_ALL(T)                                                                              \
    do {                                                                                           \
        T *p = buf;                                                                                \
        for (size_t i = 0; i < n; i++)                                                             \
            p[i] /= (T)size;                                                                       \
    } while (0)

void coll_finish(void *buf, size_t n, CollDtype dtype, CollOp op, CollCompression comp, int size)
{
    if (op == COLL_AVERAGE && size > 1) {
        switch (dtype) {
        case COLL_F32:
            DIVIDE_ALL(float);
            break;
        case COLL_F64:
            DIVIDE_ALL(double);
            break;
        case COLL_I32:
            DIVIDE_ALL(int32_t);
            break;
        case COLL_I64:
            DIVIDE_ALL(int64_t);
            break;
        default:
            break;
        }
    }
    if (comp != COLL_COMP_NONE && dtype == COLL_F32) {
        float *p = buf;
        for (size_t i = 0; i < n; i++)
            p[i] = comp == COLL_COMP_FP16 ? sg_f16_to_f32(sg_f32_to_f16(p[i]))
                                          : sg_bf16_to_f32(sg_f32_to_bf16(p[i]));
    }
}
