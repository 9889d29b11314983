/*
 * coll_internal.h - what coll.c, coll_ops.c and coll_hook.c share and nothing
 * outside csrc/net/coll*.c uses: wire conversions and reduction kernels.
 */
#ifndef NET_COLL_INTERNAL_H
#define NET_COLL_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "net/coll.h"

/* IEEE half and bfloat16 from float32, round to nearest even (NaN stays NaN,
 * overflow becomes infinity), and back (exact). */
uint16_t coll_f32_to_f16(float f);
float coll_f16_to_f32(uint16_t h);
uint16_t coll_f32_to_bf16(float f);
float coll_bf16_to_f32(uint16_t h);

/* Bytes per element on the wire: the dtype's size, or 2 with compression. */
size_t coll_wire_size(CollDtype dtype, CollCompression comp);

/* dst[i] = op(dst[i], wire[i]) for n elements; wire holds dtype values, or
 * fp16/bf16 values for a float32 dst with compression. */
void coll_reduce(void *dst, const uint8_t *wire, size_t n, CollDtype dtype, CollOp op,
                 CollCompression comp);

/* dst[i] = wire[i] converted from fp16/bf16 to float32. */
void coll_decode(float *dst, const uint8_t *wire, size_t n, CollCompression comp);

/* wire[i] = src[i] converted to fp16/bf16. */
void coll_encode(uint8_t *wire, const float *src, size_t n, CollCompression comp);

/* The owner's last touch of its reduced segment: divides by size for
 * COLL_AVERAGE (integer division truncates), then rounds float32 values to
 * the wire format with compression. */
void coll_finish(void *buf, size_t n, CollDtype dtype, CollOp op, CollCompression comp, int size);

#endif /* NET_COLL_INTERNAL_H */
