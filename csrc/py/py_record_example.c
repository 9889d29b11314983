/*
 * py_record_example.c - tf.train.Example encode/decode and schema parsing.
 *
 *   encode_example(items) -> bytes      items: [(key: str, kind: int, values)]
 *   decode_example(data) -> dict        key -> int64/float32 ndarray, list of bytes, or None
 *   encode_sequence_example(context_items, list_items) -> bytes
 *   decode_sequence_example(data) -> (context dict, feature_lists dict of lists)
 *   Schema(specs)                       compiled once, used by parse_examples and the dataset
 *   parse_examples(schema, records, name=None) -> dict of batched arrays
 *
 * Value kinds are 1 bytes, 2 float, 3 int64 (the Feature oneof numbers).
 * Python (sparkgrad/data/example.py) infers kinds and normalizes values.
 */
#include "py/py_record.h"

#include <stdlib.h>
#include <string.h>

#include "record/bufpool.h"
#include "record/example.h"

/* ---- encoding ---- */

/* Appends one feature (as a map entry when key != NULL, else as a bare
 * Feature field 1 of a FeatureList) from a Python value of the given kind. */
static int put_value(PbBuf *b, const char *key, Py_ssize_t key_len, int kind, PyObject *values)
{
    if (kind == EX_INT64 || kind == EX_FLOAT) {
        int typenum = kind == EX_INT64 ? NPY_INT64 : NPY_FLOAT32;
        PyArrayObject *arr = (PyArrayObject *)PyArray_FROMANY(
            values, typenum, 0, 0,
            NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | NPY_ARRAY_FORCECAST);
        if (arr == NULL)
            return -1;
        size_t n = (size_t)PyArray_SIZE(arr);
        if (kind == EX_INT64) {
            if (key)
                ex_put_int64(b, key, (size_t)key_len, PyArray_DATA(arr), n);
            else
                ex_put_feature_int64(b, 1, PyArray_DATA(arr), n);
        } else {
            if (key)
                ex_put_float(b, key, (size_t)key_len, PyArray_DATA(arr), n);
            else
                ex_put_feature_float(b, 1, PyArray_DATA(arr), n);
        }
        Py_DECREF(arr);
        return 0;
    }
    if (kind != EX_BYTES) {
        sg_raise_code(SG_EINVAL, "feature kind must be 1 (bytes), 2 (float) or 3 (int64), not %d",
                      kind);
        return -1;
    }
    PyObject *seq = PySequence_Fast(values, "a bytes feature needs a sequence of bytes");
    if (seq == NULL)
        return -1;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    const uint8_t **ptrs = PyMem_Calloc((size_t)n + 1, sizeof *ptrs);
    size_t *lens = PyMem_Calloc((size_t)n + 1, sizeof *lens);
    int rc = -1;
    if (ptrs == NULL || lens == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *item = PySequence_Fast_GET_ITEM(seq, i);
        char *d;
        Py_ssize_t len;
        if (PyBytes_Check(item)) {
            d = PyBytes_AS_STRING(item);
            len = PyBytes_GET_SIZE(item);
        } else if (PyUnicode_Check(item)) {
            const char *u = PyUnicode_AsUTF8AndSize(item, &len);
            if (u == NULL)
                goto done;
            d = (char *)u;
        } else {
            PyErr_Format(PyExc_TypeError, "bytes feature '%s' value %zd is %.80s, not bytes or str",
                         key ? key : "", i, Py_TYPE(item)->tp_name);
            goto done;
        }
        ptrs[i] = (const uint8_t *)d;
        lens[i] = (size_t)len;
    }
    if (key)
        ex_put_bytes(b, key, (size_t)key_len, ptrs, lens, (size_t)n);
    else
        ex_put_feature_bytes(b, 1, ptrs, lens, (size_t)n);
    rc = 0;
done:
    PyMem_Free(ptrs);
    PyMem_Free(lens);
    Py_DECREF(seq);
    return rc;
}

/* Appends the map entries of `items` ([(key, kind, values)]) to b. */
static int put_items(PbBuf *b, PyObject *items)
{
    PyObject *seq = PySequence_Fast(items, "items must be a sequence of (key, kind, values)");
    if (seq == NULL)
        return -1;
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *key_obj, *values;
        int kind;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "UiO:feature", &key_obj, &kind,
                              &values))
            goto fail;
        Py_ssize_t key_len;
        const char *key = PyUnicode_AsUTF8AndSize(key_obj, &key_len);
        if (key == NULL || put_value(b, key, key_len, kind, values) < 0)
            goto fail;
    }
    Py_DECREF(seq);
    return 0;
fail:
    Py_DECREF(seq);
    return -1;
}

static PyObject *buf_to_bytes(PbBuf *b)
{
    if (b->oom) {
        pb_buf_free(b);
        return PyErr_NoMemory();
    }
    PyObject *out = PyBytes_FromStringAndSize((const char *)b->data, (Py_ssize_t)b->len);
    pb_buf_free(b);
    return out;
}

static PyObject *py_encode_example(PyObject *self, PyObject *items)
{
    (void)self;
    PbBuf b = {0};
    size_t features = pb_begin(&b);
    if (put_items(&b, items) < 0) {
        pb_buf_free(&b);
        return NULL;
    }
    pb_end_message(&b, features, 1);
    return buf_to_bytes(&b);
}

static PyObject *py_encode_sequence_example(PyObject *self, PyObject *args)
{
    PyObject *context, *lists;
    (void)self;
    if (!PyArg_ParseTuple(args, "OO:encode_sequence_example", &context, &lists))
        return NULL;
    PbBuf b = {0};
    size_t mark = pb_begin(&b);
    if (put_items(&b, context) < 0)
        goto fail;
    pb_end_message(&b, mark, 1);
    PyObject *seq =
        PySequence_Fast(lists, "feature_lists must be a sequence of (key, kind, steps)");
    if (seq == NULL)
        goto fail;
    size_t fls = pb_begin(&b);
    for (Py_ssize_t i = 0; i < PySequence_Fast_GET_SIZE(seq); i++) {
        PyObject *key_obj, *steps;
        int kind;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "UiO:feature_list", &key_obj, &kind,
                              &steps))
            goto fail_seq;
        Py_ssize_t key_len;
        const char *key = PyUnicode_AsUTF8AndSize(key_obj, &key_len);
        PyObject *steps_seq = key ? PySequence_Fast(steps, "a feature list is a sequence") : NULL;
        if (steps_seq == NULL)
            goto fail_seq;
        size_t entry = pb_begin(&b);
        pb_put_bytes(&b, 1, key, (size_t)key_len);
        size_t fl = pb_begin(&b);
        for (Py_ssize_t k = 0; k < PySequence_Fast_GET_SIZE(steps_seq); k++)
            if (put_value(&b, NULL, 0, kind, PySequence_Fast_GET_ITEM(steps_seq, k)) < 0) {
                Py_DECREF(steps_seq);
                goto fail_seq;
            }
        Py_DECREF(steps_seq);
        pb_end_message(&b, fl, 2);
        pb_end_message(&b, entry, 1);
    }
    Py_DECREF(seq);
    pb_end_message(&b, fls, 2);
    return buf_to_bytes(&b);
fail_seq:
    Py_DECREF(seq);
fail:
    pb_buf_free(&b);
    return NULL;
}

/* ---- generic decoding ---- */

static PyObject *feature_to_python(const ExFeature *f)
{
    if (f->kind == EX_NONE)
        Py_RETURN_NONE;
    if (f->kind == EX_BYTES) {
        PyObject *list = PyList_New((Py_ssize_t)f->count);
        const uint8_t **ptrs = PyMem_Malloc((f->count + 1) * sizeof *ptrs);
        size_t *lens = PyMem_Malloc((f->count + 1) * sizeof *lens);
        if (list == NULL || ptrs == NULL || lens == NULL) {
            Py_XDECREF(list);
            PyMem_Free(ptrs);
            PyMem_Free(lens);
            return PyErr_NoMemory();
        }
        ex_values_bytes(f, ptrs, lens);
        for (size_t i = 0; i < f->count; i++) {
            PyObject *v = PyBytes_FromStringAndSize((const char *)ptrs[i], (Py_ssize_t)lens[i]);
            if (v == NULL) {
                Py_DECREF(list);
                list = NULL;
                break;
            }
            PyList_SET_ITEM(list, (Py_ssize_t)i, v);
        }
        PyMem_Free(ptrs);
        PyMem_Free(lens);
        return list;
    }
    npy_intp dims[1] = {(npy_intp)f->count};
    PyObject *arr = PyArray_SimpleNew(1, dims, f->kind == EX_INT64 ? NPY_INT64 : NPY_FLOAT32);
    if (arr == NULL)
        return NULL;
    if (f->kind == EX_INT64)
        ex_values_int64(f, PyArray_DATA((PyArrayObject *)arr));
    else
        ex_values_float(f, PyArray_DATA((PyArrayObject *)arr));
    return arr;
}

typedef struct DecodeCtx {
    const uint8_t *base;
    PyObject *dict;    /* entries go here */
    PyObject *lists;   /* SequenceExample feature lists */
    PyObject *current; /* list being filled by feature_list_cb */
} DecodeCtx;

/* Python errors inside callbacks are reported as SG_ECANCELLED so the walk
 * stops; the caller sees PyErr_Occurred(). */
static int decode_entry_cb(void *vctx, const ExEntry *e, SgError *err)
{
    DecodeCtx *ctx = vctx;
    ExFeature f;
    int rc = ex_feature_decode(ctx->base, e->value, e->value_len, &f, err);
    if (rc < 0)
        return sg_context(err, "feature '%.*s': ", (int)e->key_len, (const char *)e->key);
    PyObject *v = feature_to_python(&f);
    PyObject *k = PyUnicode_DecodeUTF8((const char *)e->key, (Py_ssize_t)e->key_len, "strict");
    int bad = v == NULL || k == NULL || PyDict_SetItem(ctx->dict, k, v) < 0;
    Py_XDECREF(v);
    Py_XDECREF(k);
    return bad ? SG_ECANCELLED : 0;
}

static int step_cb(void *vctx, const ExEntry *e, SgError *err)
{
    DecodeCtx *ctx = vctx;
    ExFeature f;
    int rc = ex_feature_decode(ctx->base, e->value, e->value_len, &f, err);
    if (rc < 0)
        return rc;
    PyObject *v = feature_to_python(&f);
    int bad = v == NULL || PyList_Append(ctx->current, v) < 0;
    Py_XDECREF(v);
    return bad ? SG_ECANCELLED : 0;
}

static int feature_list_cb(void *vctx, const ExEntry *e, SgError *err)
{
    DecodeCtx *ctx = vctx;
    PyObject *list = PyList_New(0);
    PyObject *k = PyUnicode_DecodeUTF8((const char *)e->key, (Py_ssize_t)e->key_len, "strict");
    if (list == NULL || k == NULL || PyDict_SetItem(ctx->lists, k, list) < 0) {
        Py_XDECREF(list);
        Py_XDECREF(k);
        return SG_ECANCELLED;
    }
    ctx->current = list;
    int rc = ex_feature_list_foreach(ctx->base, e->value, e->value_len, step_cb, ctx, err);
    Py_DECREF(list);
    Py_DECREF(k);
    if (rc < 0 && rc != SG_ECANCELLED)
        sg_context(err, "feature list '%.*s': ", (int)e->key_len, (const char *)e->key);
    return rc;
}

static PyObject *decode_failed(int rc, SgError *err)
{
    if (rc == SG_ECANCELLED && PyErr_Occurred())
        return NULL;
    return sg_raise(err);
}

static PyObject *py_decode_example(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    DecodeCtx ctx = {buf.buf, PyDict_New(), NULL, NULL};
    SgError err;
    int rc = ctx.dict ? ex_example_foreach(buf.buf, (size_t)buf.len, decode_entry_cb, &ctx, &err)
                      : SG_ECANCELLED;
    PyBuffer_Release(&buf);
    if (rc != 0) {
        Py_XDECREF(ctx.dict);
        return decode_failed(rc, &err);
    }
    return ctx.dict;
}

static PyObject *py_decode_sequence_example(PyObject *self, PyObject *arg)
{
    (void)self;
    Py_buffer buf;
    if (PyObject_GetBuffer(arg, &buf, PyBUF_SIMPLE) < 0)
        return NULL;
    DecodeCtx ctx = {buf.buf, PyDict_New(), PyDict_New(), NULL};
    SgError err;
    int rc = ctx.dict && ctx.lists ? ex_sequence_foreach(buf.buf, (size_t)buf.len, decode_entry_cb,
                                                         feature_list_cb, &ctx, &err)
                                   : SG_ECANCELLED;
    PyBuffer_Release(&buf);
    if (rc != 0) {
        Py_XDECREF(ctx.dict);
        Py_XDECREF(ctx.lists);
        return decode_failed(rc, &err);
    }
    return Py_BuildValue("(NN)", ctx.dict, ctx.lists);
}

/* ---- Schema ---- */

static void schema_dealloc(SchemaObject *self)
{
    ex_schema_free(&self->schema);
    Py_XDECREF(self->names);
    Py_XDECREF(self->shapes);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int spec_defaults(ExSpec *sp, PyObject *dflt)
{
    if (dflt == Py_None)
        return 0;
    sp->has_default = 1;
    if (sp->out == EX_DT_BYTES) {
        PyObject *seq = PySequence_Fast(dflt, "a bytes default must be a sequence of bytes");
        if (seq == NULL)
            return -1;
        if ((size_t)PySequence_Fast_GET_SIZE(seq) != sp->count) {
            Py_DECREF(seq);
            sg_raise_code(SG_ESCHEMA, "feature '%s': default has %zd values, shape needs %zu",
                          sp->name, PySequence_Fast_GET_SIZE(seq), sp->count);
            return -1;
        }
        sp->default_bytes = calloc(sp->count + 1, sizeof *sp->default_bytes);
        sp->default_lens = calloc(sp->count + 1, sizeof *sp->default_lens);
        if (sp->default_bytes == NULL || sp->default_lens == NULL) {
            Py_DECREF(seq);
            PyErr_NoMemory();
            return -1;
        }
        for (size_t i = 0; i < sp->count; i++) {
            char *d;
            Py_ssize_t len;
            if (PyBytes_AsStringAndSize(PySequence_Fast_GET_ITEM(seq, i), &d, &len) < 0) {
                Py_DECREF(seq);
                return -1;
            }
            sp->default_bytes[i] = malloc((size_t)len + 1);
            if (sp->default_bytes[i] == NULL) {
                Py_DECREF(seq);
                PyErr_NoMemory();
                return -1;
            }
            memcpy(sp->default_bytes[i], d, (size_t)len);
            sp->default_lens[i] = (size_t)len;
        }
        Py_DECREF(seq);
        return 0;
    }
    int typenum = sp->out == EX_DT_INT64     ? NPY_INT64
                  : sp->out == EX_DT_FLOAT32 ? NPY_FLOAT32
                                             : NPY_UINT8;
    PyArrayObject *arr = (PyArrayObject *)PyArray_FROMANY(
        dflt, typenum, 0, 0, NPY_ARRAY_C_CONTIGUOUS | NPY_ARRAY_ALIGNED | NPY_ARRAY_FORCECAST);
    if (arr == NULL)
        return -1;
    size_t n = (size_t)PyArray_SIZE(arr);
    if (n != sp->count) {
        Py_DECREF(arr);
        sg_raise_code(SG_ESCHEMA, "feature '%s': default has %zu values, shape needs %zu", sp->name,
                      n, sp->count);
        return -1;
    }
    size_t bytes = n * ex_dtype_size(sp->out);
    sp->defaults = malloc(bytes ? bytes : 1);
    if (sp->defaults == NULL) {
        Py_DECREF(arr);
        PyErr_NoMemory();
        return -1;
    }
    memcpy(sp->defaults, PyArray_DATA(arr), bytes);
    Py_DECREF(arr);
    return 0;
}

/* Schema(specs): specs = [(name, kind, wire, out, shape, default, raw_src, scale)] with
 * kind 0 fixed / 1 varlen / 2 raw, wire 1 bytes / 2 float / 3 int64, out and
 * raw_src 0 int64 / 1 float32 / 2 uint8 / 3 bytes. */
static PyObject *schema_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"specs", NULL};
    PyObject *specs;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O:Schema", kwlist, &specs))
        return NULL;
    PyObject *seq = PySequence_Fast(specs, "specs must be a sequence");
    if (seq == NULL)
        return NULL;
    SchemaObject *self = (SchemaObject *)type->tp_alloc(type, 0);
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (self == NULL)
        goto fail;
    self->names = PyList_New(0);
    self->shapes = PyList_New(0);
    self->schema.specs = calloc((size_t)n + 1, sizeof(ExSpec));
    if (self->names == NULL || self->shapes == NULL || self->schema.specs == NULL) {
        PyErr_NoMemory();
        goto fail;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *name, *shape, *dflt;
        int kind, wire, out, raw_src;
        double scale;
        if (!PyArg_ParseTuple(PySequence_Fast_GET_ITEM(seq, i), "UiiiO!Oid:spec", &name, &kind,
                              &wire, &out, &PyTuple_Type, &shape, &dflt, &raw_src, &scale))
            goto fail;
        ExSpec *sp = &self->schema.specs[self->schema.n++];
        Py_ssize_t name_len;
        const char *s = PyUnicode_AsUTF8AndSize(name, &name_len);
        if (s == NULL)
            goto fail;
        sp->name = malloc((size_t)name_len + 1);
        if (sp->name == NULL) {
            PyErr_NoMemory();
            goto fail;
        }
        memcpy(sp->name, s, (size_t)name_len + 1);
        sp->name_len = (size_t)name_len;
        if (kind < 0 || kind > 2 || wire < 1 || wire > 3 || out < 0 || out > 3 || raw_src < 0 ||
            raw_src > 2) {
            sg_raise_code(SG_EINVAL, "feature '%s': bad spec codes", sp->name);
            goto fail;
        }
        sp->kind = (ExSpecKind)kind;
        sp->wire = (ExKind)wire;
        sp->out = (ExDtype)out;
        sp->raw_src = (ExDtype)raw_src;
        sp->scale = (float)scale;
        size_t count = 1;
        for (Py_ssize_t d = 0; d < PyTuple_GET_SIZE(shape); d++) {
            long long dim = PyLong_AsLongLong(PyTuple_GET_ITEM(shape, d));
            if (dim == -1 && PyErr_Occurred())
                goto fail;
            if (dim < 0 || dim > (1ll << 31)) {
                sg_raise_code(SG_EINVAL, "feature '%s': dimension %lld out of range", sp->name,
                              dim);
                goto fail;
            }
            count *= (size_t)dim;
        }
        sp->count = count;
        if (spec_defaults(sp, dflt) < 0)
            goto fail;
        if (PyList_Append(self->names, name) < 0 || PyList_Append(self->shapes, shape) < 0)
            goto fail;
    }
    Py_DECREF(seq);
    return (PyObject *)self;
fail:
    Py_DECREF(seq);
    Py_XDECREF(self);
    return NULL;
}

PyTypeObject SchemaType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sparkgrad._core.Schema",
    .tp_basicsize = sizeof(SchemaObject),
    .tp_dealloc = (destructor)schema_dealloc,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Schema(specs): a compiled parsing schema (built by sparkgrad.data.Schema).",
    .tp_new = schema_new,
};

/* ---- batch -> NumPy ---- */

static void capsule_free(PyObject *cap)
{
    free(PyCapsule_GetPointer(cap, "sparkgrad.buffer"));
}

static void capsule_pool_put(PyObject *cap)
{
    bufpool_put(PyCapsule_GetPointer(cap, "sparkgrad.pooled"));
}

/* Wraps memory (taken over) as an ndarray: from malloc, or from bufpool_get
 * when pooled. */
static PyObject *array_take_from(void **data, int typenum, int nd, npy_intp *dims, int pooled)
{
    void *p = *data;
    *data = NULL;
    if (p == NULL && (p = pooled ? bufpool_get(1) : malloc(1)) == NULL)
        return PyErr_NoMemory();
    PyObject *arr = PyArray_SimpleNewFromData(nd, dims, typenum, p);
    PyObject *cap = arr == NULL ? NULL
                    : pooled    ? PyCapsule_New(p, "sparkgrad.pooled", capsule_pool_put)
                                : PyCapsule_New(p, "sparkgrad.buffer", capsule_free);
    if (cap == NULL) {
        Py_XDECREF(arr);
        if (pooled)
            bufpool_put(p);
        else
            free(p);
        return NULL;
    }
    if (PyArray_SetBaseObject((PyArrayObject *)arr, cap) < 0) {
        Py_DECREF(arr);
        return NULL;
    }
    return arr;
}

static PyObject *array_take(void **data, int typenum, int nd, npy_intp *dims)
{
    return array_take_from(data, typenum, nd, dims, 0);
}

PyObject *record_bytes_value(const ExValues *v, size_t k)
{
    uint64_t start = k ? v->ends[k - 1] : 0;
    return PyBytes_FromStringAndSize((const char *)v->arena + start,
                                     (Py_ssize_t)(v->ends[k] - start));
}

static PyObject *bytes_array(const ExValues *vals, int nd, npy_intp *dims)
{
    PyObject *arr = PyArray_SimpleNew(nd, dims, NPY_OBJECT);
    if (arr == NULL)
        return NULL;
    PyObject **items = PyArray_DATA((PyArrayObject *)arr);
    for (size_t i = 0; i < vals->nvalues; i++) {
        PyObject *v = record_bytes_value(vals, i);
        if (v == NULL) {
            Py_DECREF(arr);
            return NULL;
        }
        Py_XSETREF(items[i], v);
    }
    return arr;
}

int record_typenum(ExDtype t)
{
    return t == EX_DT_INT64 ? NPY_INT64 : t == EX_DT_FLOAT32 ? NPY_FLOAT32 : NPY_UINT8;
}

PyObject *record_batch_to_dict(SchemaObject *schema, ExBatch *batch)
{
    PyObject *out = PyDict_New();
    if (out == NULL)
        return NULL;
    for (size_t i = 0; i < schema->schema.n; i++) {
        const ExSpec *sp = &schema->schema.specs[i];
        ExColumn *c = &batch->cols[i];
        PyObject *value = NULL;
        if (sp->kind == EX_SPEC_VARLEN) {
            npy_intp vdims[1] = {(npy_intp)c->v.nvalues}, sdims[1] = {(npy_intp)batch->rows + 1};
            PyObject *values = sp->out == EX_DT_BYTES
                                   ? bytes_array(&c->v, 1, vdims)
                                   : array_take(&c->v.values, record_typenum(sp->out), 1, vdims);
            c->v.values_cap = sp->out == EX_DT_BYTES ? c->v.values_cap : 0;
            PyObject *splits =
                values ? array_take((void **)&c->row_splits, NPY_INT64, 1, sdims) : NULL;
            value = splits ? PyTuple_Pack(2, values, splits) : NULL;
            Py_XDECREF(values);
            Py_XDECREF(splits);
        } else {
            PyObject *shape = PyList_GET_ITEM(schema->shapes, (Py_ssize_t)i);
            int nd = 1 + (int)PyTuple_GET_SIZE(shape);
            npy_intp dims[NPY_MAXDIMS];
            if (nd > NPY_MAXDIMS) {
                Py_DECREF(out);
                return sg_raise_code(SG_EINVAL, "feature '%s': too many dimensions", sp->name);
            }
            dims[0] = (npy_intp)batch->rows;
            for (int d = 1; d < nd; d++)
                dims[d] = (npy_intp)PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d - 1));
            value = sp->out == EX_DT_BYTES
                        ? bytes_array(&c->v, nd, dims)
                        : array_take_from(&c->data, record_typenum(sp->out), nd, dims, 1);
        }
        if (value == NULL ||
            PyDict_SetItem(out, PyList_GET_ITEM(schema->names, (Py_ssize_t)i), value) < 0) {
            Py_XDECREF(value);
            Py_DECREF(out);
            return NULL;
        }
        Py_DECREF(value);
    }
    SgError err;
    if (ex_batch_reset(batch, &err) < 0) {
        Py_DECREF(out);
        return sg_raise(&err);
    }
    return out;
}

/* parse_examples(schema, records, name=None) -> dict */
static PyObject *py_parse_examples(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"schema", "records", "name", NULL};
    SchemaObject *schema;
    PyObject *records;
    const char *name = "<records>";
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O!O|z:parse_examples", kwlist, &SchemaType,
                                     &schema, &records, &name))
        return NULL;
    if (name == NULL) /* name=None */
        name = "<records>";
    PyObject *seq = PySequence_Fast(records, "records must be a sequence of bytes");
    if (seq == NULL)
        return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Py_buffer *bufs = PyMem_Calloc((size_t)n + 1, sizeof *bufs);
    PyObject *out = NULL;
    Py_ssize_t got = 0;
    ExBatch batch;
    int have_batch = 0;
    SgError err;
    if (bufs == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    for (; got < n; got++)
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, got), &bufs[got], PyBUF_SIMPLE) < 0)
            goto done;
    if (ex_batch_init(&batch, &schema->schema, (size_t)n, &err) < 0) {
        sg_raise(&err);
        goto done;
    }
    have_batch = 1;
    int rc = 0;
    Py_ssize_t i = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; i < n && rc == 0; i++)
        rc = ex_batch_add(&batch, bufs[i].buf, (size_t)bufs[i].len, &err);
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        sg_context(&err, "%s: record %zd: ", name, i - 1);
        sg_raise(&err);
        goto done;
    }
    out = record_batch_to_dict(schema, &batch);
done:
    if (have_batch)
        ex_batch_free(&batch);
    for (Py_ssize_t k = 0; k < got; k++)
        PyBuffer_Release(&bufs[k]);
    PyMem_Free(bufs);
    Py_DECREF(seq);
    return out;
}

static PyMethodDef example_methods[] = {
    {"encode_example", py_encode_example, METH_O,
     "encode_example(items) -> bytes: items = [(key, kind, values)], kind 1 bytes/2 float/3 int64"},
    {"decode_example", py_decode_example, METH_O,
     "decode_example(data) -> dict: key -> int64/float32 ndarray, list of bytes, or None"},
    {"encode_sequence_example", py_encode_sequence_example, METH_VARARGS,
     "encode_sequence_example(context_items, list_items) -> bytes"},
    {"decode_sequence_example", py_decode_sequence_example, METH_O,
     "decode_sequence_example(data) -> (context, feature_lists)"},
    {"parse_examples", (PyCFunction)(void (*)(void))py_parse_examples, METH_VARARGS | METH_KEYWORDS,
     "parse_examples(schema, records, name=None) -> dict of batched arrays"},
    {NULL, NULL, 0, NULL},
};

int record_example_module_init(PyObject *mod)
{
    if (PyModule_AddType(mod, &SchemaType) < 0)
        return -1;
    return PyModule_AddFunctions(mod, example_methods);
}
