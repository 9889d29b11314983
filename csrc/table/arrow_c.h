/*
 * arrow_c.h - the two structs of Apache Arrow's C data interface, laid out as
 * the specification defines them (the ABI every producer and consumer
 * shares; pyarrow exports a RecordBatch through them). A schema describes
 * types (format strings such as "f" float32, "+l" list, "+s" struct); an
 * array holds one column's buffers (validity bitmap first) and children.
 * The consumer that moved a struct out of a producer calls its release.
 *
 * The interface carries no buffer sizes: a buffer's extent follows from the
 * array's length, offset and (for variable-length types) its offsets, so
 * those are what table_arrow.c validates.
 */
#ifndef SG_ARROW_C_H
#define SG_ARROW_C_H

#include <stdint.h>

#ifndef ARROW_C_DATA_INTERFACE
#define ARROW_C_DATA_INTERFACE

#define ARROW_FLAG_DICTIONARY_ORDERED 1
#define ARROW_FLAG_NULLABLE           2
#define ARROW_FLAG_MAP_KEYS_SORTED    4

struct ArrowSchema {
    const char *format;
    const char *name;
    const char *metadata;
    int64_t flags;
    int64_t n_children;
    struct ArrowSchema **children;
    struct ArrowSchema *dictionary;
    void (*release)(struct ArrowSchema *);
    void *private_data;
};

struct ArrowArray {
    int64_t length;
    int64_t null_count;
    int64_t offset;
    int64_t n_buffers;
    int64_t n_children;
    const void **buffers;
    struct ArrowArray **children;
    struct ArrowArray *dictionary;
    void (*release)(struct ArrowArray *);
    void *private_data;
};

#endif /* ARROW_C_DATA_INTERFACE */

#endif /* SG_ARROW_C_H */
