/*
 * coll_ops.c - the arithmetic of the collectives (coll_internal.h): element
 * sizes, fp16 conversions in plain C (round to nearest even; bf16's are
 * common/sg_bf16.h), and the reduction kernels per dtype and op. Integer
 * sums wrap as NumPy's do (computed on unsigned values, so no signed
 * overflow). No I/O here.
 */
#include <math.h>
#include <string.h>

#include "common/sg_bf16.h"
#include "net/coll_internal.h"

uint16_t coll_f32_to_f16(float f)
{
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) /* NaN: keep it quiet and non-zero */
        return (uint16_t)(sign | 0x7e00u);
    if (ax >= 0x477ff000u) /* >= 65520 rounds to infinity (and infinity itself) */
        return (uint16_t)(sign | 0x7c00u);
    if (ax < 0x38800000u) { /* below 2^-14: a half subnormal (or zero) */
        float a;
        memcpy(&a, &ax, sizeof a);
        /* a * 2^24 is exact; nearbyintf rounds to nearest even. 1024 is the
         * smallest normal's encoding, which is right. */
        return (uint16_t)(sign | (uint16_t)nearbyintf(a * 16777216.0f));
    }
    /* Normal: rebias the exponent (127 -> 15) and round the 13 dropped bits
     * to nearest even; a carry moves into the exponent as it should. */
    ax += 0xfffu + ((ax >> 13) & 1u);
    return (uint16_t)(sign | ((ax - 0x38000000u) >> 13));
}

float coll_f16_to_f32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, x;
    if (exp == 0) {
        float v = (float)mant * (1.0f / 16777216.0f); /* mant * 2^-24, exact */
        memcpy(&x, &v, sizeof x);
        x |= sign;
    } else if (exp == 31) {
        x = sign | 0x7f800000u | (mant << 13);
    } else {
        x = sign | ((exp + 112u) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &x, sizeof f);
    return f;
}

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
    return comp == COLL_COMP_FP16 ? coll_f16_to_f32(h) : sg_bf16_to_f32(h);
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
        uint16_t h = comp == COLL_COMP_FP16 ? coll_f32_to_f16(src[i]) : sg_f32_to_bf16(src[i]);
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
            p[i] = comp == COLL_COMP_FP16 ? coll_f16_to_f32(coll_f32_to_f16(p[i]))
                                          : sg_bf16_to_f32(sg_f32_to_bf16(p[i]));
    }
}
