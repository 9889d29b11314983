/*
 * py_record_sequence.c - batched SequenceExample parsing:
 *
 *   parse_sequence_examples(context, lists, allow_missing, records, name=None)
 *       -> (context dict, feature_lists dict, lengths dict)
 *
 * `context` and `lists` are compiled Schemas (or None); `allow_missing` has
 * one bool per list spec. Context features come out as from parse_examples.
 * A FixedLenSequence list becomes a dense [rows, max_steps, *shape] array
 * padded with zeros (b"" for bytes) and its step counts go to lengths; a
 * VarLen list becomes (values, step_splits, row_splits). Parsing runs with
 * the GIL released.
 */
#include "py/py_record.h"

#include <stdlib.h>
#include <string.h>

#include "record/sequence_parse.h"

static PyObject *int64_array(const int64_t *v, size_t n)
{
    npy_intp dims[1] = {(npy_intp)n};
    PyObject *arr = PyArray_SimpleNew(1, dims, NPY_INT64);
    if (arr != NULL && n > 0)
        memcpy(PyArray_DATA((PyArrayObject *)arr), v, n * sizeof *v);
    return arr;
}

/* Values [from, to) of a column into dst (an array's data, of the column's
 * dtype; object arrays hold a reference per item). */
static int put_values(const ExSpec *sp, const SeqColumn *c, size_t from, size_t to, void *dst)
{
    if (sp->wire != EX_BYTES) {
        size_t el = ex_dtype_size(sp->out);
        if (to > from)
            memcpy(dst, (const uint8_t *)c->v.values + from * el, (to - from) * el);
        return 0;
    }
    PyObject **items = dst;
    for (size_t k = from; k < to; k++) {
        PyObject *v = record_bytes_value(&c->v, k);
        if (v == NULL)
            return -1;
        Py_XSETREF(items[k - from], v);
    }
    return 0;
}

static PyObject *new_array(const ExSpec *sp, int nd, npy_intp *dims)
{
    if (sp->wire != EX_BYTES)
        return PyArray_ZEROS(nd, dims, record_typenum(sp->out), 0);
    PyObject *arr = PyArray_SimpleNew(nd, dims, NPY_OBJECT);
    if (arr == NULL)
        return NULL;
    PyObject *empty = PyBytes_FromStringAndSize("", 0);
    if (empty == NULL) {
        Py_DECREF(arr);
        return NULL;
    }
    PyObject **items = PyArray_DATA((PyArrayObject *)arr);
    for (npy_intp k = 0; k < PyArray_SIZE((PyArrayObject *)arr); k++) {
        Py_INCREF(empty);
        Py_XSETREF(items[k], empty);
    }
    Py_DECREF(empty);
    return arr;
}

/* [rows, max_steps, *shape], each record's steps at the start of its row. */
static PyObject *dense_list(const ExSpec *sp, PyObject *shape, const SeqColumn *c, size_t rows)
{
    int nd = 2 + (int)PyTuple_GET_SIZE(shape);
    npy_intp dims[NPY_MAXDIMS];
    if (nd > NPY_MAXDIMS)
        return sg_raise_code(SG_EINVAL, "feature list '%s': too many dimensions", sp->name);
    dims[0] = (npy_intp)rows;
    dims[1] = (npy_intp)c->max_steps;
    for (int d = 2; d < nd; d++)
        dims[d] = (npy_intp)PyLong_AsSsize_t(PyTuple_GET_ITEM(shape, d - 2));
    PyObject *arr = new_array(sp, nd, dims);
    if (arr == NULL)
        return NULL;
    size_t el = sp->wire == EX_BYTES ? sizeof(PyObject *) : ex_dtype_size(sp->out);
    uint8_t *base = PyArray_DATA((PyArrayObject *)arr);
    for (size_t r = 0; r < rows; r++) {
        size_t from = (size_t)c->step_splits[c->row_splits[r]];
        size_t to = (size_t)c->step_splits[c->row_splits[r + 1]];
        if (put_values(sp, c, from, to, base + r * c->max_steps * sp->count * el) < 0) {
            Py_DECREF(arr);
            return NULL;
        }
    }
    return arr;
}

static PyObject *ragged_list(const ExSpec *sp, const SeqColumn *c, size_t rows)
{
    npy_intp dims[1] = {(npy_intp)c->v.nvalues};
    PyObject *values = sp->wire == EX_BYTES ? new_array(sp, 1, dims)
                                            : PyArray_SimpleNew(1, dims, record_typenum(sp->out));
    if (values == NULL ||
        put_values(sp, c, 0, c->v.nvalues, PyArray_DATA((PyArrayObject *)values)) < 0) {
        Py_XDECREF(values);
        return NULL;
    }
    PyObject *steps = int64_array(c->step_splits, c->nsteps + 1);
    PyObject *splits = steps ? int64_array(c->row_splits, rows + 1) : NULL;
    PyObject *out = splits ? PyTuple_Pack(3, values, steps, splits) : NULL;
    Py_DECREF(values);
    Py_XDECREF(steps);
    Py_XDECREF(splits);
    return out;
}

static PyObject *lists_to_dicts(SchemaObject *schema, SeqBatch *b)
{
    PyObject *lists = PyDict_New(), *lengths = PyDict_New();
    if (lists == NULL || lengths == NULL)
        goto fail;
    for (size_t i = 0; i < schema->schema.n; i++) {
        const ExSpec *sp = &schema->schema.specs[i];
        const SeqColumn *c = &b->cols[i];
        PyObject *name = PyList_GET_ITEM(schema->names, (Py_ssize_t)i);
        PyObject *value;
        if (sp->kind == EX_SPEC_FIXED) {
            value = dense_list(sp, PyList_GET_ITEM(schema->shapes, (Py_ssize_t)i), c, b->rows);
            npy_intp dims[1] = {(npy_intp)b->rows};
            PyObject *len = value ? PyArray_SimpleNew(1, dims, NPY_INT64) : NULL;
            if (len == NULL) {
                Py_XDECREF(value);
                goto fail;
            }
            int64_t *l = PyArray_DATA((PyArrayObject *)len);
            for (size_t r = 0; r < b->rows; r++)
                l[r] = c->row_splits[r + 1] - c->row_splits[r];
            int rc = PyDict_SetItem(lengths, name, len);
            Py_DECREF(len);
            if (rc < 0) {
                Py_DECREF(value);
                goto fail;
            }
        } else {
            value = ragged_list(sp, c, b->rows);
        }
        if (value == NULL)
            goto fail;
        int rc = PyDict_SetItem(lists, name, value);
        Py_DECREF(value);
        if (rc < 0)
            goto fail;
    }
    PyObject *out = PyTuple_Pack(2, lists, lengths);
    Py_DECREF(lists);
    Py_DECREF(lengths);
    return out;
fail:
    Py_XDECREF(lists);
    Py_XDECREF(lengths);
    return NULL;
}

static PyObject *py_parse_sequence_examples(PyObject *self, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"context", "lists", "allow_missing", "records", "name", NULL};
    PyObject *ctx_obj, *lists_obj, *allow_obj, *records;
    const char *name = "<records>";
    (void)self;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OOOO|z:parse_sequence_examples", kwlist,
                                     &ctx_obj, &lists_obj, &allow_obj, &records, &name))
        return NULL;
    if (name == NULL) /* name=None */
        name = "<records>";
    if ((ctx_obj != Py_None && !PyObject_TypeCheck(ctx_obj, &SchemaType)) ||
        (lists_obj != Py_None && !PyObject_TypeCheck(lists_obj, &SchemaType)))
        return sg_raise_code(SG_EINVAL, "context and lists must be compiled Schemas or None");
    SchemaObject *ctx_schema = ctx_obj == Py_None ? NULL : (SchemaObject *)ctx_obj;
    SchemaObject *list_schema = lists_obj == Py_None ? NULL : (SchemaObject *)lists_obj;
    ExSchema empty = {0, NULL};
    const ExSchema *lists = list_schema ? &list_schema->schema : &empty;
    PyObject *seq = PySequence_Fast(records, "records must be a sequence of bytes");
    PyObject *allow_seq =
        seq ? PySequence_Fast(allow_obj, "allow_missing must be a sequence") : NULL;
    if (allow_seq == NULL) {
        Py_XDECREF(seq);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    Py_buffer *bufs = PyMem_Calloc((size_t)n + 1, sizeof *bufs);
    int *allow = PyMem_Calloc(lists->n + 1, sizeof *allow);
    PyObject *out = NULL, *ctx_dict = NULL, *pair = NULL;
    Py_ssize_t got = 0;
    ExBatch cb;
    SeqBatch sb;
    int have_cb = 0, have_sb = 0;
    SgError err;
    if (bufs == NULL || allow == NULL) {
        PyErr_NoMemory();
        goto done;
    }
    if ((size_t)PySequence_Fast_GET_SIZE(allow_seq) != lists->n) {
        sg_raise_code(SG_EINVAL, "allow_missing has %zd entries for %zu feature lists",
                      PySequence_Fast_GET_SIZE(allow_seq), lists->n);
        goto done;
    }
    for (size_t i = 0; i < lists->n; i++) {
        int t = PyObject_IsTrue(PySequence_Fast_GET_ITEM(allow_seq, (Py_ssize_t)i));
        if (t < 0)
            goto done;
        allow[i] = t;
        const ExSpec *sp = &lists->specs[i];
        if (sp->kind == EX_SPEC_RAW) {
            sg_raise_code(SG_EINVAL, "feature list '%s': only FixedLenSequence and VarLen lists",
                          sp->name);
            goto done;
        }
    }
    for (; got < n; got++)
        if (PyObject_GetBuffer(PySequence_Fast_GET_ITEM(seq, got), &bufs[got], PyBUF_SIMPLE) < 0)
            goto done;
    if (ctx_schema && ex_batch_init(&cb, &ctx_schema->schema, (size_t)n, &err) < 0) {
        sg_raise(&err);
        goto done;
    }
    have_cb = ctx_schema != NULL;
    if (seq_batch_init(&sb, lists, allow, (size_t)n, &err) < 0) {
        sg_raise(&err);
        goto done;
    }
    have_sb = 1;
    int rc = 0;
    Py_ssize_t i = 0;
    Py_BEGIN_ALLOW_THREADS
    for (; i < n && rc == 0; i++) {
        if (have_cb)
            rc = ex_batch_add(&cb, bufs[i].buf, (size_t)bufs[i].len, &err);
        if (rc == 0)
            rc = seq_batch_add(&sb, bufs[i].buf, (size_t)bufs[i].len, &err);
    }
    Py_END_ALLOW_THREADS
    if (rc < 0) {
        sg_context(&err, "%s: record %zd: ", name, i - 1);
        sg_raise(&err);
        goto done;
    }
    ctx_dict = have_cb ? record_batch_to_dict(ctx_schema, &cb) : PyDict_New();
    if (ctx_dict == NULL)
        goto done;
    if (list_schema) {
        pair = lists_to_dicts(list_schema, &sb);
    } else {
        PyObject *a = PyDict_New(), *b = PyDict_New();
        pair = a && b ? PyTuple_Pack(2, a, b) : NULL;
        Py_XDECREF(a);
        Py_XDECREF(b);
    }
    if (pair == NULL)
        goto done;
    out = PyTuple_Pack(3, ctx_dict, PyTuple_GET_ITEM(pair, 0), PyTuple_GET_ITEM(pair, 1));
done:
    Py_XDECREF(ctx_dict);
    Py_XDECREF(pair);
    if (have_cb)
        ex_batch_free(&cb);
    if (have_sb)
        seq_batch_free(&sb);
    for (Py_ssize_t k = 0; k < got; k++)
        PyBuffer_Release(&bufs[k]);
    PyMem_Free(bufs);
    PyMem_Free(allow);
    Py_DECREF(seq);
    Py_DECREF(allow_seq);
    return out;
}

static PyMethodDef sequence_methods[] = {
    {"parse_sequence_examples", (PyCFunction)(void (*)(void))py_parse_sequence_examples,
     METH_VARARGS | METH_KEYWORDS,
     "parse_sequence_examples(context, lists, allow_missing, records, name=None) -> "
     "(context, feature_lists, lengths)"},
    {NULL, NULL, 0, NULL},
};

int record_sequence_module_init(PyObject *mod)
{
    return PyModule_AddFunctions(mod, sequence_methods);
}
