/*
 * table_arrow.c - finding a column of an Arrow record batch by its dotted
 * name and validating what will be read of it.
 *
 * The C data interface carries no buffer sizes, so a buffer's extent is
 * what the array's length, offset and offsets say; this file checks those
 * claims before any value is read: buffer and child counts per format,
 * lengths and offsets non-negative and within the parent's range, offsets
 * non-decreasing and inside the child, a validity bitmap wherever nulls
 * are counted. Only the ranges a batch's rows reach are checked. Not here:
 * converting values (table_chunk.c).
 */
#include <stdio.h>
#include <string.h>

#include "table/table_internal.h"

#define MAX_INDEX                                                                                  \
    ((int64_t)1 << 56) /* bound on lengths and offsets: no overflow when added or scaled */

/* Bits per value of a number format, or 0 for anything else. */
static int number_bits(const char *fmt)
{
    if (fmt == NULL || fmt[0] == '\0' || fmt[1] != '\0')
        return 0;
    switch (fmt[0]) {
    case 'b':
        return 1;
    case 'c':
    case 'C':
        return 8;
    case 's':
    case 'S':
    case 'e':
        return 16;
    case 'i':
    case 'I':
    case 'f':
        return 32;
    case 'l':
    case 'L':
    case 'g':
        return 64;
    default:
        return 0;
    }
}

/* The N of "w:N" / "+w:N" (prefix given), or -1. */
static int64_t fixed_size(const char *fmt, const char *prefix)
{
    size_t n = strlen(prefix);
    if (fmt == NULL || strncmp(fmt, prefix, n) != 0 || fmt[n] == '\0')
        return -1;
    int64_t v = 0;
    for (const char *p = fmt + n; *p != '\0'; p++) {
        if (*p < '0' || *p > '9' || v > MAX_INDEX / 10)
            return -1;
        v = v * 10 + (*p - '0');
    }
    return v;
}

static int is_format(const char *fmt, const char *want)
{
    return fmt != NULL && strcmp(fmt, want) == 0;
}

/* Buffers, children and lengths every array must get right; [lo, lo + n)
 * is the logical range read. */
static int check_common(const struct ArrowSchema *s, const struct ArrowArray *a, int64_t nbuf,
                        int64_t nchild, int64_t lo, int64_t n, const char *col, SgError *err)
{
    const char *fmt = s->format != NULL ? s->format : "?";
    if (s->dictionary != NULL || a->dictionary != NULL)
        return sg_fail(err, SG_ESCHEMA,
                       "column '%s' is dictionary-encoded (Arrow format '%s'), which is not "
                       "decoded here: read it "
                       "without read_dictionary",
                       col, fmt);
    if (a->length < 0 || a->length > MAX_INDEX || a->offset < 0 || a->offset > MAX_INDEX)
        return sg_fail(err, SG_ECORRUPT,
                       "column '%s' (Arrow format '%s'): length %lld or offset %lld out of range",
                       col, fmt, (long long)a->length, (long long)a->offset);
    if (lo < 0 || n < 0 || lo > a->length || n > a->length - lo)
        return sg_fail(
            err, SG_ECORRUPT,
            "column '%s' (Arrow format '%s'): rows %lld..%lld read, but the array holds %lld", col,
            fmt, (long long)lo, (long long)(lo + n), (long long)a->length);
    if (a->null_count < -1 || a->null_count > a->length)
        return sg_fail(err, SG_ECORRUPT, "column '%s': null_count %lld of %lld values", col,
                       (long long)a->null_count, (long long)a->length);
    if (a->n_buffers != nbuf || (nbuf > 0 && a->buffers == NULL))
        return sg_fail(err, SG_ECORRUPT,
                       "column '%s' (Arrow format '%s') has %lld buffers, not %lld", col, fmt,
                       (long long)a->n_buffers, (long long)nbuf);
    if (a->n_children != nchild || s->n_children != nchild ||
        (nchild > 0 && (a->children == NULL || s->children == NULL)))
        return sg_fail(err, SG_ECORRUPT,
                       "column '%s' (Arrow format '%s') has %lld children, not %lld", col, fmt,
                       (long long)a->n_children, (long long)nchild);
    for (int64_t i = 0; i < nchild; i++)
        if (a->children[i] == NULL || s->children[i] == NULL)
            return sg_fail(err, SG_ECORRUPT, "column '%s': child %lld missing", col, (long long)i);
    if (a->null_count > 0 && a->buffers[0] == NULL)
        return sg_fail(err, SG_ECORRUPT, "column '%s' counts %lld nulls but has no validity bitmap",
                       col, (long long)a->null_count);
    for (int64_t i = 1; i < nbuf; i++)
        if (a->buffers[i] == NULL && a->length > 0)
            return sg_fail(err, SG_ECORRUPT,
                           "column '%s' (Arrow format '%s'): buffer %lld is missing", col, fmt,
                           (long long)i);
    return 0;
}

/* offsets[p .. p + n] non-decreasing and non-negative; their first and last. */
static int check_offsets(const struct ArrowArray *a, int large, int64_t p, int64_t n,
                         int64_t *first, int64_t *last, const char *col, SgError *err)
{
    const void *off = a->buffers[1];
    if (off == NULL) { /* an empty array may come without offsets */
        if (n > 0)
            return sg_fail(err, SG_ECORRUPT, "column '%s': no offsets buffer", col);
        *first = *last = 0;
        return 0;
    }
    int64_t prev = tbl_offset_at(off, large, p);
    if (prev < 0 || prev > MAX_INDEX)
        return sg_fail(err, SG_ECORRUPT, "column '%s': offset %lld at %lld out of range", col,
                       (long long)prev, (long long)p);
    *first = prev;
    for (int64_t i = 1; i <= n; i++) {
        int64_t cur = tbl_offset_at(off, large, p + i);
        if (cur < prev || cur > MAX_INDEX)
            return sg_fail(err, SG_ECORRUPT,
                           "column '%s': offsets decrease at value %lld (%lld after %lld)", col,
                           (long long)(p + i - a->offset), (long long)cur, (long long)prev);
        prev = cur;
    }
    *last = prev;
    return 0;
}

/* Validates the logical range [lo, lo + n) of an array and what it reaches
 * of its children. */
static int check_range(const struct ArrowSchema *s, const struct ArrowArray *a, int64_t lo,
                       int64_t n, int depth, const char *col, SgError *err)
{
    if (depth > TBL_MAX_DEPTH)
        return sg_fail(err, SG_ESCHEMA, "column '%s' nests deeper than %d levels", col,
                       TBL_MAX_DEPTH);
    const char *fmt = s->format;
    if (fmt == NULL)
        return sg_fail(err, SG_ECORRUPT, "column '%s' has no format", col);
    int64_t p = lo + a->offset, first, last, size;
    int rc;
    if (number_bits(fmt) > 0)
        return check_common(s, a, 2, 0, lo, n, col, err);
    if (is_format(fmt, "z") || is_format(fmt, "Z") || is_format(fmt, "u") || is_format(fmt, "U")) {
        if ((rc = check_common(s, a, 3, 0, lo, n, col, err)) < 0)
            return rc;
        if ((rc = check_offsets(a, fmt[0] == 'Z' || fmt[0] == 'U', p, n, &first, &last, col, err)) <
            0)
            return rc;
        if (last > first && a->buffers[2] == NULL)
            return sg_fail(err, SG_ECORRUPT, "column '%s': no data buffer for %lld bytes", col,
                           (long long)(last - first));
        return 0;
    }
    if ((size = fixed_size(fmt, "w:")) >= 0) {
        if (size == 0)
            return sg_fail(err, SG_ESCHEMA, "column '%s' is fixed_size_binary(0)", col);
        return check_common(s, a, 2, 0, lo, n, col, err);
    }
    if ((size = fixed_size(fmt, "+w:")) >= 0) {
        if ((rc = check_common(s, a, 1, 1, lo, n, col, err)) < 0)
            return rc;
        if (size > 0 && p + n > MAX_INDEX / size)
            return sg_fail(err, SG_ECORRUPT,
                           "column '%s': fixed_size_list(%lld) of %lld rows is too large", col,
                           (long long)size, (long long)(p + n));
        return check_range(s->children[0], a->children[0], p * size, n * size, depth + 1, col, err);
    }
    if (is_format(fmt, "+l") || is_format(fmt, "+L")) {
        if ((rc = check_common(s, a, 2, 1, lo, n, col, err)) < 0)
            return rc;
        if ((rc = check_offsets(a, fmt[1] == 'L', p, n, &first, &last, col, err)) < 0)
            return rc;
        return check_range(s->children[0], a->children[0], first, last - first, depth + 1, col,
                           err);
    }
    if (is_format(fmt, "+s")) {
        if ((rc = check_common(s, a, 1, s->n_children, lo, n, col, err)) < 0)
            return rc;
        for (int64_t i = 0; i < s->n_children; i++)
            if ((rc = check_range(s->children[i], a->children[i], p, n, depth + 1, col, err)) < 0)
                return rc;
        return 0;
    }
    return sg_fail(err, SG_ESCHEMA,
                   "column '%s' has Arrow format '%s', which cannot be fed (numbers, bools, lists "
                   "and fixed-size "
                   "lists of numbers, binary, strings, structs and Spark ML vectors can)",
                   col, fmt);
}

int tbl_check_batch(const struct ArrowSchema *schema, const struct ArrowArray *array, SgError *err)
{
    if (schema == NULL || array == NULL || !is_format(schema->format, "+s"))
        return sg_fail(err, SG_EINVAL,
                       "an Arrow record batch (a struct array) is expected, not format '%s'",
                       schema != NULL && schema->format != NULL ? schema->format : "?");
    int rc = check_common(schema, array, 1, schema->n_children, 0, array->length, "<batch>", err);
    if (rc == 0 && array->null_count != 0 && array->buffers[0] != NULL)
        return sg_fail(err, SG_ECORRUPT, "the record batch itself has a validity bitmap");
    return rc;
}

/* Lists the batch's columns into buf, dotted through structs. */
static void list_columns(char *buf, size_t cap, size_t *len, const struct ArrowSchema *s,
                         const char *prefix, int depth)
{
    for (int64_t i = 0; i < s->n_children && depth < TBL_MAX_DEPTH; i++) {
        const struct ArrowSchema *c = s->children[i];
        const char *name = c != NULL && c->name != NULL ? c->name : "?";
        char full[256];
        snprintf(full, sizeof full, "%s%s%s", prefix, *prefix ? "." : "", name);
        if (c != NULL && is_format(c->format, "+s") && c->n_children > 0 && c->children != NULL) {
            list_columns(buf, cap, len, c, full, depth + 1);
            continue;
        }
        if (*len < cap) {
            int n = snprintf(buf + *len, cap - *len, "%s%s", *len ? ", " : "", full);
            *len += n > 0 ? (size_t)n : 0;
        }
    }
}

/* The child of struct s named by the longest prefix of rest ending at '.' or
 * its end; *used gets the prefix length. -1 when none. */
static int64_t find_child(const struct ArrowSchema *s, const char *rest, size_t *used)
{
    size_t full = strlen(rest);
    for (size_t n = full; n > 0; n--) {
        if (n < full && rest[n] != '.')
            continue;
        for (int64_t i = 0; i < s->n_children; i++) {
            const char *name = s->children[i] != NULL ? s->children[i]->name : NULL;
            if (name != NULL && strlen(name) == n && strncmp(name, rest, n) == 0) {
                *used = n;
                return i;
            }
        }
    }
    return -1;
}

static int is_vector(const struct ArrowSchema *s)
{
    static const char *const names[4] = {"type", "size", "indices", "values"};
    static const char *const formats[4] = {"c", "i", "+l", "+l"};
    if (!is_format(s->format, "+s") || s->n_children != 4 || s->children == NULL)
        return 0;
    for (int i = 0; i < 4; i++) {
        const struct ArrowSchema *c = s->children[i];
        if (c == NULL || c->name == NULL || strcmp(c->name, names[i]) != 0 ||
            !is_format(c->format, formats[i]))
            return 0;
    }
    const struct ArrowSchema *ind = s->children[2], *val = s->children[3];
    return ind->n_children == 1 && ind->children != NULL && ind->children[0] != NULL &&
           is_format(ind->children[0]->format, "i") && val->n_children == 1 &&
           val->children != NULL && val->children[0] != NULL &&
           is_format(val->children[0]->format, "g");
}

static int classify(TblLeaf *leaf, const struct ArrowSchema *s, const struct ArrowArray *a,
                    const char *col, SgError *err)
{
    const char *fmt = s->format;
    int64_t size;
    if (number_bits(fmt) > 0) {
        leaf->kind = TBL_NUM;
        leaf->fmt = fmt[0];
        return 0;
    }
    if (is_format(fmt, "z") || is_format(fmt, "Z") || is_format(fmt, "u") || is_format(fmt, "U")) {
        leaf->kind = fmt[0] == 'u' || fmt[0] == 'U' ? TBL_STR : TBL_BIN;
        leaf->large = fmt[0] == 'Z' || fmt[0] == 'U';
        return 0;
    }
    if ((size = fixed_size(fmt, "w:")) > 0) {
        leaf->kind = TBL_FIXBIN;
        leaf->size = size;
        return 0;
    }
    int fixed = (size = fixed_size(fmt, "+w:")) >= 0;
    if (fixed || is_format(fmt, "+l") || is_format(fmt, "+L")) {
        const char *child = s->children[0]->format;
        if (number_bits(child) == 0)
            return sg_fail(
                err, SG_ESCHEMA,
                "column '%s' is a list of Arrow format '%s': only lists of numbers can be fed", col,
                child != NULL ? child : "?");
        leaf->kind = fixed ? TBL_FIXLIST : TBL_LIST;
        leaf->size = fixed ? size : 0;
        leaf->large = is_format(fmt, "+L");
        leaf->fmt = child[0];
        leaf->values = a->children[0];
        return 0;
    }
    if (is_vector(s)) {
        leaf->kind = TBL_VECTOR;
        leaf->vtype = a->children[0];
        leaf->vsize = a->children[1];
        leaf->vindices = a->children[2];
        leaf->vvalues = a->children[3];
        return 0;
    }
    if (is_format(fmt, "+s"))
        return sg_fail(err, SG_ESCHEMA,
                       "column '%s' is a struct: name one of its fields ('%s.<field>'), or give a "
                       "Spark ML vector "
                       "(type, size, indices, values)",
                       col, col);
    return sg_fail(err, SG_ESCHEMA, "column '%s' has Arrow format '%s', which cannot be fed", col,
                   fmt);
}

int tbl_resolve(TblLeaf *leaf, const struct ArrowSchema *schema, const struct ArrowArray *array,
                const char *name, SgError *err)
{
    memset(leaf, 0, sizeof *leaf);
    const struct ArrowSchema *s = schema;
    const struct ArrowArray *a = array;
    int64_t rows = array->length, parent = array->offset; /* parent: physical index of row 0 */
    const char *rest = name;
    for (;;) {
        size_t used = 0;
        int64_t k = find_child(s, rest, &used);
        if (k < 0) {
            char cols[640];
            size_t len = 0;
            cols[0] = '\0';
            list_columns(cols, sizeof cols, &len, schema, "", 0);
            if (s == schema)
                return sg_fail(err, SG_ESCHEMA, "no column '%s' (the batch has: %s)", name, cols);
            return sg_fail(err, SG_ESCHEMA,
                           "no column '%s': the struct has no field '%s' (the batch has: %s)", name,
                           rest, cols);
        }
        const struct ArrowSchema *cs = s->children[k];
        const struct ArrowArray *ca = a->children[k];
        if (leaf->depth == TBL_MAX_DEPTH)
            return sg_fail(err, SG_ESCHEMA, "column '%s' nests deeper than %d levels", name,
                           TBL_MAX_DEPTH);
        if (rest[used] == '\0') {
            int rc = check_range(cs, ca, parent, rows, leaf->depth, name, err);
            if (rc < 0)
                return rc;
        } else {
            if (!is_format(cs->format, "+s"))
                return sg_fail(
                    err, SG_ESCHEMA, "no column '%s': '%.*s' has Arrow format '%s', not a struct",
                    name, (int)(rest - name + used), name, cs->format != NULL ? cs->format : "?");
            int rc = check_common(cs, ca, 1, cs->n_children, parent, rows, name, err);
            if (rc < 0)
                return rc;
        }
        parent += ca->offset;
        leaf->path[leaf->depth] = ca;
        leaf->path_base[leaf->depth] = parent;
        leaf->depth++;
        if (rest[used] == '\0') {
            leaf->arr = ca;
            leaf->base = parent;
            return classify(leaf, cs, ca, name, err);
        }
        s = cs;
        a = ca;
        rest += used + 1;
    }
}
