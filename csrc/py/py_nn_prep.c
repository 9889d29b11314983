/*
 * py_nn_prep.c - sparkgrad._core.Prep, a model input's preprocessing chain
 * (nn/nn_prep.h) built from the description sparkgrad.nn.preprocessing
 * gives; utf8_column, which lays a NumPy column of strings out as Arrow
 * does (offsets + bytes) once, in C; the string hashes, for tests; and what
 * Model.train_steps / evaluate / predict need to hand a raw column to C.
 */
#include "py/py_nn_prep.h"

#include <string.h>

typedef struct PrepObject {
    PyObject_HEAD
    NnPrep *prep;
} PrepObject;

static void prep_dealloc(PrepObject *self)
{
    nn_prep_free(self->prep);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

/* ---- the description ---------------------------------------------------- */

/* desc[key] as a C long long (missing: dflt). */
static int desc_ll(PyObject *desc, const char *key, long long dflt, long long *out)
{
    PyObject *v = PyDict_GetItemString(desc, key);
    *out = dflt;
    if (v == NULL || v == Py_None)
        return 0;
    *out = PyLong_AsLongLong(v);
    return *out == -1 && PyErr_Occurred() ? -1 : 0;
}

/* desc[key] as a contiguous array of `type` (a new reference in *keep), or
 * NULL when missing. */
static const void *desc_array(PyObject *desc, const char *key, int type, size_t *n, PyObject **keep)
{
    PyObject *v = PyDict_GetItemString(desc, key);
    *keep = NULL;
    *n = 0;
    if (v == NULL || v == Py_None)
        return NULL;
    PyArrayObject *a = (PyArrayObject *)PyArray_FROMANY(v, type, 0, 0, NPY_ARRAY_CARRAY_RO);
    if (a == NULL)
        return NULL;
    *keep = (PyObject *)a;
    *n = (size_t)PyArray_SIZE(a);
    return PyArray_DATA(a);
}

static int prep_init(PrepObject *self, PyObject *args, PyObject *kw)
{
    static char *kwlist[] = {"desc", NULL};
    PyObject *desc;
    if (!PyArg_ParseTupleAndKeywords(args, kw, "O!:Prep", kwlist, &PyDict_Type, &desc))
        return -1;
    NnPrepSpec s;
    memset(&s, 0, sizeof s);
    PyObject *keep[6] = {NULL};
    long long v[12];
    int rc = -1;
    if (desc_ll(desc, "map", 0, &v[0]) < 0 || desc_ll(desc, "strings", 0, &v[1]) < 0 ||
        desc_ll(desc, "row", 0, &v[2]) < 0 || desc_ll(desc, "first", 0, &v[3]) < 0 ||
        desc_ll(desc, "num_oov", 0, &v[4]) < 0 || desc_ll(desc, "oov_start", 0, &v[5]) < 0 ||
        desc_ll(desc, "oov_floormod", 0, &v[6]) < 0 || desc_ll(desc, "num_bins", 0, &v[7]) < 0 ||
        desc_ll(desc, "mask_id", 0, &v[8]) < 0 || desc_ll(desc, "encode", 0, &v[9]) < 0 ||
        desc_ll(desc, "num_tokens", 0, &v[10]) < 0)
        goto done;
    s.map = (NnPrepMap)v[0];
    s.strings = (int)v[1];
    s.row = (size_t)v[2];
    s.first = v[3];
    s.num_oov = v[4];
    s.oov_start = v[5];
    s.oov_floormod = (int)v[6];
    s.num_bins = v[7];
    s.mask_id = v[8];
    s.encode = (NnPrepEncode)v[9];
    s.num_tokens = v[10];
    PyObject *ml = PyDict_GetItemString(desc, "map_layer");
    PyObject *el = PyDict_GetItemString(desc, "encode_layer");
    s.map_layer = ml && PyUnicode_Check(ml) ? PyUnicode_AsUTF8(ml) : "";
    s.encode_layer = el && PyUnicode_Check(el) ? PyUnicode_AsUTF8(el) : "";
    size_t n, nstd;
    s.mean = desc_array(desc, "mean", NPY_FLOAT32, &n, &keep[0]);
    s.std = desc_array(desc, "std", NPY_FLOAT32, &nstd, &keep[1]);
    if (PyErr_Occurred())
        goto done;
    if ((s.mean && n != s.row) || (s.std && nstd != s.row)) {
        sg_raise_code(SG_EINVAL, "%s: mean and std need %zu values", s.map_layer, s.row);
        goto done;
    }
    s.bounds = desc_array(desc, "bounds", NPY_FLOAT32, &s.nbounds, &keep[2]);
    if (PyErr_Occurred())
        goto done;
    if (s.map == NN_PREP_LOOKUP && s.strings) {
        s.vocab_offsets = desc_array(desc, "vocab_offsets", NPY_INT64, &n, &keep[3]);
        s.vocab_bytes = desc_array(desc, "vocab_bytes", NPY_UINT8, &nstd, &keep[4]);
        if (PyErr_Occurred())
            goto done;
        if (s.vocab_offsets == NULL || n < 1 || s.vocab_offsets[n - 1] != (int64_t)nstd) {
            sg_raise_code(SG_EINVAL, "%s: vocabulary offsets do not fit its bytes", s.map_layer);
            goto done;
        }
        s.nvocab = n - 1;
    } else if (s.map == NN_PREP_LOOKUP) {
        s.vocab_ints = desc_array(desc, "vocab_ints", NPY_INT64, &s.nvocab, &keep[3]);
        if (PyErr_Occurred())
            goto done;
    }
    PyObject *mask = PyDict_GetItemString(desc, "mask");
    if (mask != NULL && mask != Py_None) {
        s.has_mask = 1;
        Py_ssize_t len = 0;
        if (PyUnicode_Check(mask)) {
            s.mask_str = PyUnicode_AsUTF8AndSize(mask, &len);
        } else if (PyBytes_Check(mask)) {
            s.mask_str = PyBytes_AS_STRING(mask);
            len = PyBytes_GET_SIZE(mask);
        } else if ((s.mask_int = PyLong_AsLongLong(mask)) == -1 && PyErr_Occurred()) {
            goto done;
        }
        if (s.mask_str == NULL && PyErr_Occurred())
            goto done;
        s.mask_len = (size_t)len;
    }
    PyObject *salt = PyDict_GetItemString(desc, "salt");
    if (salt != NULL && salt != Py_None) {
        unsigned long long k0, k1;
        if (!PyArg_ParseTuple(salt, "KK;salt is two 64-bit integers", &k0, &k1))
            goto done;
        s.salted = 1;
        s.salt[0] = k0;
        s.salt[1] = k1;
    }
    SgError err = {0};
    nn_prep_free(self->prep);
    self->prep = NULL;
    if (nn_prep_new(&self->prep, &s, &err) < 0) {
        sg_raise(&err);
        goto done;
    }
    rc = 0;
done:
    for (size_t i = 0; i < sizeof keep / sizeof *keep; i++)
        Py_XDECREF(keep[i]);
    return rc;
}

static PyObject *prep_get_in_row(PrepObject *self, void *closure)
{
    (void)closure;
    return self->prep ? PyLong_FromSize_t(nn_prep_in_row(self->prep))
                      : sg_raise_code(SG_ESTATE, "Prep is not built");
}

static PyObject *prep_get_out_row(PrepObject *self, void *closure)
{
    (void)closure;
    return self->prep ? PyLong_FromSize_t(nn_prep_out_row(self->prep))
                      : sg_raise_code(SG_ESTATE, "Prep is not built");
}

/* prep.map(x) -> float32 [n, out_row]: the chain on a raw column outside a
 * model (adapt's checks, tests). */
static PyObject *prep_map(PrepObject *self, PyObject *arg)
{
    if (self->prep == NULL)
        return sg_raise_code(SG_ESTATE, "Prep is not built");
    NnArray a;
    size_t n;
    PyObject *keep = NULL;
    if (nn_py_raw_column(arg, nn_prep_in_row(self->prep), &a, &n, &keep) < 0)
        return NULL;
    npy_intp dims[2] = {(npy_intp)n, (npy_intp)nn_prep_out_row(self->prep)};
    PyObject *out = PyArray_SimpleNew(2, dims, NPY_FLOAT32);
    SgError err = {0};
    int rc = -1;
    if (out != NULL) {
        rc = nn_prep_check(self->prep, &a, &err);
        if (rc == 0) {
            Py_BEGIN_ALLOW_THREADS
            rc = nn_prep_rows(self->prep, &a, NULL, 0, (int)n, PyArray_DATA((PyArrayObject *)out),
                              &err);
            Py_END_ALLOW_THREADS
        }
    }
    Py_XDECREF(keep);
    if (rc < 0) {
        Py_XDECREF(out);
        return out ? sg_raise(&err) : NULL;
    }
    return out;
}

static PyMethodDef prep_methods[] = {
    {"map", (PyCFunction)prep_map, METH_O,
     "map(x) -> float32 [n, out_row]: the chain applied to a raw column."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef prep_getset[] = {
    {"in_row", (getter)prep_get_in_row, NULL, "values per raw row", NULL},
    {"out_row", (getter)prep_get_out_row, NULL, "floats per output row", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

PyTypeObject PrepType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "sparkgrad._core.Prep",
    .tp_basicsize = sizeof(PrepObject),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "Prep(desc): a model input's preprocessing chain, run in C in the batch gather.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)prep_init,
    .tp_dealloc = (destructor)prep_dealloc,
    .tp_methods = prep_methods,
    .tp_getset = prep_getset,
};

/* ---- raw columns -------------------------------------------------------- */

int nn_py_raw_column(PyObject *o, size_t row, NnArray *a, size_t *n, PyObject **keep)
{
    memset(a, 0, sizeof *a);
    *keep = NULL;
    a->row = row;
    if (PyArray_Check(o)) {
        PyArrayObject *x = (PyArrayObject *)o;
        const int t = PyArray_TYPE(x);
        if ((t != NPY_FLOAT32 && t != NPY_INT32 && t != NPY_INT64) || !PyArray_IS_C_CONTIGUOUS(x) ||
            PyArray_NDIM(x) < 1) {
            sg_raise_code(SG_EINVAL,
                          "a preprocessed column is a C-contiguous float32, int32 or int64 array "
                          "or a string column, not %s",
                          PyArray_DESCR(x)->typeobj->tp_name);
            return -1;
        }
        *n = (size_t)PyArray_DIM(x, 0);
        if ((size_t)PyArray_SIZE(x) != *n * row) {
            sg_raise_code(SG_EINVAL, "a column of %zd values for %zu rows of %zu", PyArray_SIZE(x),
                          *n, row);
            return -1;
        }
        a->dtype = t == NPY_FLOAT32 ? NN_F32 : t == NPY_INT32 ? NN_I32 : NN_I64;
        a->data = PyArray_DATA(x);
        return 0;
    }
    /* a string column: .offsets int32/int64 [n * row + 1] into .data uint8 */
    PyObject *off = PyObject_GetAttrString(o, "offsets");
    PyObject *data = off ? PyObject_GetAttrString(o, "data") : NULL;
    int rc = -1;
    if (data == NULL) {
        PyErr_Clear();
        sg_raise_code(SG_EINVAL, "a column must be a NumPy array or a string column, not %s",
                      Py_TYPE(o)->tp_name);
        goto done;
    }
    PyArrayObject *ao = (PyArrayObject *)off, *ad = (PyArrayObject *)data;
    if (!PyArray_Check(off) || !PyArray_Check(data) ||
        (PyArray_TYPE(ao) != NPY_INT32 && PyArray_TYPE(ao) != NPY_INT64) ||
        PyArray_TYPE(ad) != NPY_UINT8 || !PyArray_IS_C_CONTIGUOUS(ao) ||
        !PyArray_IS_C_CONTIGUOUS(ad) || PyArray_SIZE(ao) < 1 ||
        (size_t)(PyArray_SIZE(ao) - 1) % row != 0) {
        sg_raise_code(SG_EINVAL,
                      "a string column has int32/int64 offsets [rows * %zu + 1] and uint8 data",
                      row);
        goto done;
    }
    *n = (size_t)(PyArray_SIZE(ao) - 1) / row;
    a->dtype = PyArray_TYPE(ao) == NPY_INT32 ? NN_STR32 : NN_STR64;
    a->offsets = PyArray_DATA(ao);
    a->data = PyArray_DATA(ad);
    a->nbytes = (size_t)PyArray_SIZE(ad);
    *keep = PyTuple_Pack(2, off, data);
    rc = *keep ? 0 : -1;
done:
    Py_XDECREF(off);
    Py_XDECREF(data);
    return rc;
}

int nn_py_prep_list(PyObject *o, int ninputs, const NnPrep **out)
{
    for (int i = 0; i < ninputs; i++)
        out[i] = NULL;
    if (o == Py_None)
        return 0;
    PyObject *seq = PySequence_Fast(o, "preps must be a list of Prep or None, one per input");
    if (seq == NULL)
        return -1;
    int rc = 0;
    if (PySequence_Fast_GET_SIZE(seq) != ninputs) {
        sg_raise_code(SG_EINVAL, "preps has %zd entries, the model has %d inputs",
                      PySequence_Fast_GET_SIZE(seq), ninputs);
        rc = -1;
    }
    for (int i = 0; rc == 0 && i < ninputs; i++) {
        PyObject *p = PySequence_Fast_GET_ITEM(seq, i);
        if (p == Py_None)
            continue;
        if (!PyObject_TypeCheck(p, &PrepType) || ((PrepObject *)p)->prep == NULL) {
            sg_raise_code(SG_EINVAL, "preps[%d] must be a built Prep or None", i);
            rc = -1;
        } else {
            out[i] = ((PrepObject *)p)->prep;
        }
    }
    Py_DECREF(seq);
    return rc;
}

/* ---- utf8_column ------------------------------------------------------ */

/* Item k's UTF-8 bytes: *s (borrowed from item or *tmp, a new reference). */
static int item_utf8(PyArrayObject *x, npy_intp k, const char **s, Py_ssize_t *len, PyObject **tmp)
{
    const char *p = (const char *)PyArray_DATA(x) + k * PyArray_ITEMSIZE(x);
    const npy_intp size = PyArray_ITEMSIZE(x);
    *tmp = NULL;
    switch (PyArray_TYPE(x)) {
    case NPY_STRING: { /* NumPy drops trailing NULs of a bytes item */
        npy_intp l = size;
        while (l > 0 && p[l - 1] == 0)
            l--;
        *s = p;
        *len = l;
        return 0;
    }
    case NPY_UNICODE: {
        npy_intp l = size / 4;
        Py_UCS4 c;
        while (l > 0 && (memcpy(&c, p + 4 * (l - 1), 4), c == 0))
            l--;
        *tmp = PyUnicode_FromKindAndData(PyUnicode_4BYTE_KIND, p, l);
        break;
    }
    default: { /* object: str or bytes */
        PyObject *item;
        memcpy(&item, p, sizeof item);
        if (item != NULL && PyBytes_Check(item)) {
            *s = PyBytes_AS_STRING(item);
            *len = PyBytes_GET_SIZE(item);
            return 0;
        }
        if (item == NULL || !PyUnicode_Check(item)) {
            sg_raise_code(SG_EINVAL, "value %zd of the column is %s, not a string (str or bytes)",
                          (Py_ssize_t)k, item ? Py_TYPE(item)->tp_name : "NULL");
            return -1;
        }
        Py_INCREF(item);
        *tmp = item;
    }
    }
    if (*tmp == NULL)
        return -1;
    *s = PyUnicode_AsUTF8AndSize(*tmp, len);
    return *s ? 0 : -1;
}

/* utf8_column(x) -> (offsets int64 [x.size + 1], data uint8): a NumPy array
 * of str, bytes or objects (str / bytes), in C order, as UTF-8. */
static PyObject *py_utf8_column(PyObject *self, PyObject *arg)
{
    (void)self;
    if (!PyArray_Check(arg))
        return sg_raise_code(SG_EINVAL, "utf8_column takes a NumPy array, not %s",
                             Py_TYPE(arg)->tp_name);
    const int t = PyArray_TYPE((PyArrayObject *)arg);
    if (t != NPY_STRING && t != NPY_UNICODE && t != NPY_OBJECT)
        return sg_raise_code(SG_EINVAL, "utf8_column takes str, bytes or object arrays, not %s",
                             PyArray_DESCR((PyArrayObject *)arg)->typeobj->tp_name);
    PyArrayObject *x = (PyArrayObject *)PyArray_FromAny(arg, NULL, 0, 0, NPY_ARRAY_CARRAY_RO, NULL);
    if (x == NULL)
        return NULL;
    const npy_intp n = PyArray_SIZE(x);
    npy_intp dim = n + 1;
    PyObject *offs = PyArray_SimpleNew(1, &dim, NPY_INT64);
    PyObject *bytes = PyByteArray_FromStringAndSize(NULL, 0), *res = NULL;
    if (offs == NULL || bytes == NULL)
        goto done;
    int64_t *o = PyArray_DATA((PyArrayObject *)offs);
    o[0] = 0;
    for (npy_intp k = 0; k < n; k++) {
        const char *s;
        Py_ssize_t len;
        PyObject *tmp;
        if (item_utf8(x, k, &s, &len, &tmp) < 0)
            goto done;
        const Py_ssize_t at = PyByteArray_GET_SIZE(bytes);
        int rc = PyByteArray_Resize(bytes, at + len);
        if (rc == 0)
            memcpy(PyByteArray_AS_STRING(bytes) + at, s, (size_t)len);
        Py_XDECREF(tmp);
        if (rc < 0)
            goto done;
        o[k + 1] = at + len;
    }
    npy_intp nb = PyByteArray_GET_SIZE(bytes);
    PyObject *data = PyArray_SimpleNew(1, &nb, NPY_UINT8);
    if (data == NULL)
        goto done;
    memcpy(PyArray_DATA((PyArrayObject *)data), PyByteArray_AS_STRING(bytes), (size_t)nb);
    res = PyTuple_Pack(2, offs, data);
    Py_DECREF(data);
done:
    Py_DECREF(x);
    Py_XDECREF(offs);
    Py_XDECREF(bytes);
    return res;
}

/* fingerprint64(b) and siphash(key0, key1, b): the hashes Hashing uses. */
static PyObject *py_fingerprint64(PyObject *self, PyObject *args)
{
    (void)self;
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "y*:fingerprint64", &b))
        return NULL;
    uint64_t h = nn_prep_fingerprint64(b.buf, (size_t)b.len);
    PyBuffer_Release(&b);
    return PyLong_FromUnsignedLongLong(h);
}

static PyObject *py_siphash(PyObject *self, PyObject *args)
{
    (void)self;
    unsigned long long k0, k1;
    Py_buffer b;
    if (!PyArg_ParseTuple(args, "KKy*:siphash", &k0, &k1, &b))
        return NULL;
    const uint64_t key[2] = {k0, k1};
    uint64_t h = 0;
    SgError err = {0};
    int rc = nn_prep_siphash(key, b.buf, (size_t)b.len, &h, &err);
    PyBuffer_Release(&b);
    return rc < 0 ? sg_raise(&err) : PyLong_FromUnsignedLongLong(h);
}

static PyMethodDef prep_functions[] = {
    {"utf8_column", py_utf8_column, METH_O,
     "utf8_column(x) -> (offsets int64 [x.size + 1], data uint8): strings as UTF-8, Arrow's "
     "layout."},
    {"fingerprint64", py_fingerprint64, METH_VARARGS,
     "fingerprint64(b) -> int: FarmHash Fingerprint64 (tf.strings.to_hash_bucket_fast's hash)."},
    {"siphash", py_siphash, METH_VARARGS,
     "siphash(k0, k1, b) -> int: SipHash-2-4 keyed with (k0, k1) (to_hash_bucket_strong's)."},
    {NULL, NULL, 0, NULL},
};

int nn_prep_module_init(PyObject *mod)
{
    if (PyType_Ready(&PrepType) < 0 || PyModule_AddType(mod, &PrepType) < 0)
        return -1;
    return PyModule_AddFunctions(mod, prep_functions);
}
