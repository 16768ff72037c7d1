/*
 * dtype.c: ampc's dtypes and how Python spells them.
 *
 * The floating dtypes are NumPy dtypes: ampc.float16 is numpy.dtype("float16")
 * and ampc.bfloat16 is numpy.dtype(ml_dtypes.bfloat16), the type JAX,
 * TensorFlow and ml_dtypes share. ml_dtypes registers bfloat16 at run time,
 * so its type number depends on import order: it is recognised by its scalar
 * type, never by a hard-coded number or type character.
 */
#include "ampc.h"

#include <string.h>

const char *const ampc_dtype_names[AMPC_NUM_DTYPES] = {
    "float32", "float16", "bfloat16", "float64", "bool", "int8", "int16",
    "int32", "int64", "uint8", "uint16", "uint32", "uint64",
};

/* Accepted names; torch dtypes are read through their names too
 * (str(torch.half) == "torch.float16"). */
static const struct {
    const char *name;
    ampc_dtype dtype;
} dtype_aliases[] = {
    {"float32", AMPC_FLOAT32},  {"fp32", AMPC_FLOAT32},   {"single", AMPC_FLOAT32},
    {"float16", AMPC_FLOAT16},  {"fp16", AMPC_FLOAT16},   {"half", AMPC_FLOAT16},
    {"bfloat16", AMPC_BFLOAT16}, {"bf16", AMPC_BFLOAT16},
    {"float64", AMPC_FLOAT64},  {"fp64", AMPC_FLOAT64},   {"double", AMPC_FLOAT64},
    {"bool", AMPC_BOOL},        {"int8", AMPC_INT8},      {"int16", AMPC_INT16},
    {"int32", AMPC_INT32},      {"int64", AMPC_INT64},    {"uint8", AMPC_UINT8},
    {"uint16", AMPC_UINT16},    {"uint32", AMPC_UINT32},  {"uint64", AMPC_UINT64},
};

int ampc_dtype_init(ampc_state *st)
{
    static const int numpy_types[AMPC_NUM_DTYPES] = {
        NPY_FLOAT32, NPY_FLOAT16, -1 /* bfloat16 */, NPY_FLOAT64, NPY_BOOL,
        NPY_INT8, NPY_INT16, NPY_INT32, NPY_INT64, NPY_UINT8, NPY_UINT16, NPY_UINT32, NPY_UINT64,
    };
    for (int d = 0; d < AMPC_NUM_DTYPES; d++) {
        if (numpy_types[d] >= 0)
            st->descr[d] = PyArray_DescrFromType(numpy_types[d]);
    }
    PyObject *ml_dtypes = PyImport_ImportModule("ml_dtypes");
    if (ml_dtypes == NULL)
        return -1;
    PyObject *bf16 = PyObject_GetAttrString(ml_dtypes, "bfloat16");
    Py_DECREF(ml_dtypes);
    if (bf16 == NULL)
        return -1;
    const int ok = PyArray_DescrConverter(bf16, &st->descr[AMPC_BFLOAT16]);
    Py_DECREF(bf16);
    return ok == NPY_SUCCEED ? 0 : -1;
}

int ampc_dtype_from_descr(ampc_state *st, PyArray_Descr *descr)
{
    if (!PyDataType_ISNOTSWAPPED(descr))
        return -1;
    const int type_num = descr->type_num;
    const npy_intp size = PyDataType_ELSIZE(descr);
    switch (type_num) {
    case NPY_FLOAT32:
        return AMPC_FLOAT32;
    case NPY_FLOAT16:
        return AMPC_FLOAT16;
    case NPY_FLOAT64:
        return AMPC_FLOAT64;
    case NPY_BOOL:
        return AMPC_BOOL;
    default:
        break;
    }
    /* NumPy has two type numbers for some integer sizes (long, long long). */
    if (PyTypeNum_ISSIGNED(type_num) || PyTypeNum_ISUNSIGNED(type_num)) {
        const int base = PyTypeNum_ISSIGNED(type_num) ? AMPC_INT8 : AMPC_UINT8;
        switch (size) {
        case 1: return base;
        case 2: return base + 1;
        case 4: return base + 2;
        case 8: return base + 3;
        default: return -1;
        }
    }
    if (descr->typeobj == st->descr[AMPC_BFLOAT16]->typeobj)
        return AMPC_BFLOAT16;
    return -1;
}

static int dtype_from_name(const char *name)
{
    for (size_t i = 0; i < sizeof dtype_aliases / sizeof dtype_aliases[0]; i++)
        if (strcmp(name, dtype_aliases[i].name) == 0)
            return dtype_aliases[i].dtype;
    return -1;
}

int ampc_dtype_of_torch(PyObject *dtype)
{
    PyObject *text = PyObject_Str(dtype);
    if (text == NULL)
        return -2;
    const char *name = PyUnicode_AsUTF8(text);
    int d = -1;
    if (name != NULL && strncmp(name, "torch.", 6) == 0)
        d = dtype_from_name(name + 6);
    else if (name == NULL && PyErr_ExceptionMatches(PyExc_UnicodeEncodeError))
        PyErr_Clear();  /* lone surrogates: no name ampc knows */
    else if (name == NULL)
        d = -2;
    Py_DECREF(text);
    return d;
}

static int unsupported(PyObject *obj, const char *argname)
{
    return ampc_raise_with_repr(PyExc_TypeError, "%s: ampc does not support dtype %U; it knows float32, float16, "
                                "bfloat16, float64, bool and the integer types", argname, obj);
}

int ampc_dtype_parse(ampc_state *st, PyObject *obj, const char *argname, ampc_dtype *out)
{
    int d = -1;
    if (PyArray_DescrCheck(obj)) {
        d = ampc_dtype_from_descr(st, (PyArray_Descr *)obj);
        if (d < 0)
            return unsupported(obj, argname);
        *out = (ampc_dtype)d;
        return 0;
    }
    if (ampc_is_torch_type(Py_TYPE(obj), "dtype")) {
        d = ampc_dtype_of_torch(obj);
        if (d == -2)
            return -1;
        if (d < 0)
            return unsupported(obj, argname);
        *out = (ampc_dtype)d;
        return 0;
    }
    if (PyUnicode_Check(obj)) {
        /* a str's own characters (a subclass's __str__ may do anything) */
        const char *name = PyUnicode_AsUTF8(obj);
        if (name == NULL)
            return -1;
        d = dtype_from_name(name);
        if (d < 0 && strcmp(name, "float") == 0) {
            PyErr_Format(PyExc_ValueError,
                         "%s: 'float' is ambiguous (float32 in torch, float64 in NumPy); "
                         "write 'float32' or 'float64'",
                         argname);
            return -1;
        }
        if (d >= 0) {
            *out = (ampc_dtype)d;
            return 0;
        }
        /* Other strings NumPy understands: "f2", "<f4", "e", ... */
    }
    if (obj == Py_None) {
        PyErr_Format(PyExc_TypeError, "%s: a dtype is required, got None", argname);
        return -1;
    }
    PyArray_Descr *descr = NULL;
    if (PyArray_DescrConverter(obj, &descr) != NPY_SUCCEED) {
        /* an ordinary failure means "no dtype"; a MemoryError, KeyboardInterrupt or SystemExit raised by
         * the object's Python (its .dtype) goes on up, not swallowed into a TypeError (ampc_safe_repr's rule) */
        if (PyErr_ExceptionMatches(PyExc_MemoryError) || !PyErr_ExceptionMatches(PyExc_Exception))
            return -1;
        PyErr_Clear();
        return ampc_raise_with_repr(PyExc_TypeError, "%s: %U is not a dtype; expected a NumPy or torch dtype, or a "
                                    "name such as 'float16', 'bfloat16', 'float32'", argname, obj);
    }
    d = ampc_dtype_from_descr(st, descr);
    Py_DECREF(descr);
    if (d < 0)
        return unsupported(obj, argname);
    *out = (ampc_dtype)d;
    return 0;
}
