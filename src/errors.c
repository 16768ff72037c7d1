/*
 * errors.c: what ampc's errors say. Arguments and objects named in a message
 * (a repr that cannot turn into the object's own exception, a device, a
 * shape), a message renamed for the argument it is about, and the one
 * argument parse whose TypeError/ValueError every shape argument shares.
 * A leaf: it calls no other file of ampc._C.
 */
#include "ampc.h"

#include <stdio.h>
#include <string.h>

PyObject *ampc_safe_repr(PyObject *obj)
{
    PyObject *r = PyObject_Repr(obj);
    /* only an ordinary failure of the object's __repr__ gives way to its type name: MemoryError,
     * KeyboardInterrupt and SystemExit go on up */
    if (r != NULL || PyErr_ExceptionMatches(PyExc_MemoryError) || !PyErr_ExceptionMatches(PyExc_Exception))
        return r;
    PyErr_Clear();
    return PyUnicode_FromFormat("<%.200s object>", Py_TYPE(obj)->tp_name);
}

int ampc_raise_with_repr(PyObject *exc, const char *format, const char *name, PyObject *obj)
{
    PyObject *r = ampc_safe_repr(obj);
    if (r != NULL)
        PyErr_Format(exc, format, name, r);
    Py_XDECREF(r);
    return -1;
}

void ampc_rename_error(const char *given, const char *name)
{
    PyObject *exc = ampc_take_exception();
    if (exc == NULL)
        return;
    PyObject *msg = PyObject_Str(exc);
    const char *text = msg ? PyUnicode_AsUTF8(msg) : NULL;
    const size_t n = strlen(given);
    if (text != NULL && strncmp(text, given, n) == 0) {
        PyErr_Format((PyObject *)Py_TYPE(exc), "%s%s", name, text + n);
        Py_DECREF(exc);
    }
    else {
        PyErr_Clear();
        ampc_restore_exception(exc);
    }
    Py_XDECREF(msg);
}

const char *ampc_device_str(ampc_device device, char *buf, size_t size)
{
    if (device.type == AMPC_DEVICE_CPU)
        snprintf(buf, size, "cpu");
    else
        snprintf(buf, size, "cuda:%d", device.index);
    return buf;
}

void ampc_shape_str(const ampc_view *v, char *buf, size_t size)
{
    size_t n = 0;
    n += (size_t)snprintf(buf + n, size - n, "(");
    for (int d = 0; d < v->ndim && n < size; d++)
        n += (size_t)snprintf(buf + n, size - n, d ? ", %lld" : "%lld", (long long)v->shape[d]);
    if (n < size)
        snprintf(buf + n, size - n, v->ndim == 1 ? ",)" : ")");
}

int ampc_parse_int64s(PyObject *obj, const char *argname, int64_t *out, int allow_negative)
{
    PyObject *seq = PySequence_Fast(obj, "shape must be a sequence of ints");
    if (seq == NULL)
        return -1;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n > AMPC_MAX_NDIM) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "%s has more than %d dimensions", argname, AMPC_MAX_NDIM);
        return -1;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        /* an item's __index__ may change a list (PySequence_Fast's is the list itself): its size
         * again each time, and the item held across the call */
        if (i >= PySequence_Fast_GET_SIZE(seq)) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_RuntimeError, "%s changed size while it was read", argname);
            return -1;
        }
        PyObject *item = Py_NewRef(PySequence_Fast_GET_ITEM(seq, i));
        const long long v = PyLong_AsLongLong(item);
        Py_DECREF(item);
        if (v == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return -1;
        }
        if (v < 0 && !allow_negative) {
            Py_DECREF(seq);
            PyErr_Format(PyExc_ValueError, "%s has a negative dimension", argname);
            return -1;
        }
        out[i] = v;
    }
    Py_DECREF(seq);
    return (int)n;
}
