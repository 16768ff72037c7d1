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
#include "dlpack.h"

#define NUMPY(type_num) type_num, NULL
#define ML_DTYPES(name) -1, name

const char *const ampc_dtype_names[AMPC_NUM_DTYPES] = {
#define AMPC_DTYPE(ENUM, VALUE, NAME, ...) [AMPC_##ENUM] = NAME,
#include "kernels/dtypes.def"
#undef AMPC_DTYPE
};

/* dtypes.def's columns that Python needs. */
static const struct {
    ampc_dtype_kind kind;
    int numpy_type;           /* NumPy's type number; -1: registered by ml_dtypes */
    const char *ml_dtypes;    /* the ml_dtypes attribute that holds it, or NULL */
    const char *aliases;      /* other accepted names, separated by spaces */
} rows[AMPC_NUM_DTYPES] = {
#define AMPC_DTYPE(ENUM, VALUE, NAME, SIZE, KIND, DL_CODE, DL_BITS, NP, C_TYPE, ALIASES) \
    [AMPC_##ENUM] = {AMPC_KIND_##KIND, NP, ALIASES},
#include "kernels/dtypes.def"
#undef AMPC_DTYPE
};

int ampc_dtype_init(ampc_state *st)
{
    for (int d = 0; d < AMPC_NUM_DTYPES; d++) {
        if (rows[d].numpy_type >= 0) {
            st->descr[d] = PyArray_DescrFromType(rows[d].numpy_type);
            continue;
        }
        PyObject *ml_dtypes = PyImport_ImportModule("ml_dtypes");
        if (ml_dtypes == NULL)
            return -1;
        PyObject *type = PyObject_GetAttrString(ml_dtypes, rows[d].ml_dtypes);
        Py_DECREF(ml_dtypes);
        if (type == NULL)
            return -1;
        const int ok = PyArray_DescrConverter(type, &st->descr[d]);
        Py_DECREF(type);
        if (ok != NPY_SUCCEED)
            return -1;
    }
    return 0;
}

int ampc_dtype_from_descr(ampc_state *st, PyArray_Descr *descr)
{
    if (!PyDataType_ISNOTSWAPPED(descr))
        return -1;
    const int type_num = descr->type_num;
    const int64_t size = (int64_t)PyDataType_ELSIZE(descr);
    for (int d = 0; d < AMPC_NUM_DTYPES; d++) {
        if (rows[d].numpy_type >= 0 ? type_num == rows[d].numpy_type
                                    : descr->typeobj == st->descr[d]->typeobj)
            return d;
        /* NumPy has two type numbers for some integer sizes (long, long long). */
        if ((rows[d].kind == AMPC_KIND_INT && PyTypeNum_ISSIGNED(type_num)) ||
            (rows[d].kind == AMPC_KIND_UINT && PyTypeNum_ISUNSIGNED(type_num)))
            if (size == ampc_dtype_size((ampc_dtype)d))
                return d;
    }
    return -1;
}

/* Is `name` one of the space-separated words of `words`? */
static int is_word_of(const char *name, const char *words)
{
    const size_t len = strlen(name);
    for (const char *w = words; *w != '\0';) {
        const size_t n = strcspn(w, " ");
        if (n == len && len > 0 && strncmp(w, name, len) == 0)
            return 1;
        w += n;
        w += strspn(w, " ");
    }
    return 0;
}

static int dtype_from_name(const char *name)
{
    for (int d = 0; d < AMPC_NUM_DTYPES; d++)
        if (strcmp(name, ampc_dtype_names[d]) == 0 || is_word_of(name, rows[d].aliases))
            return d;
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

PyObject *ampc_dtypes_info(PyObject *module, PyObject *Py_UNUSED(arg))
{
    static const char *const kinds[] = {
        [AMPC_KIND_FLOAT] = "float", [AMPC_KIND_STORED_FLOAT] = "stored_float", [AMPC_KIND_BOOL] = "bool",
        [AMPC_KIND_INT] = "int", [AMPC_KIND_UINT] = "uint",
    };
    static const int dl[AMPC_NUM_DTYPES][2] = {
#define AMPC_DTYPE(ENUM, VALUE, NAME, SIZE, KIND, DL_CODE, DL_BITS, ...) [AMPC_##ENUM] = {DL_CODE, DL_BITS},
#include "kernels/dtypes.def"
#undef AMPC_DTYPE
    };
    ampc_state *st = ampc_state_of(module);
    PyObject *all = PyTuple_New(AMPC_NUM_DTYPES);
    for (int d = 0; all != NULL && d < AMPC_NUM_DTYPES; d++) {
        PyObject *row = Py_BuildValue("(ssLiiO)", ampc_dtype_names[d], kinds[rows[d].kind],
                                      (long long)ampc_dtype_size((ampc_dtype)d), dl[d][0], dl[d][1],
                                      (PyObject *)st->descr[d]);
        if (row == NULL)
            Py_CLEAR(all);
        else
            PyTuple_SET_ITEM(all, d, row);
    }
    return all;
}
