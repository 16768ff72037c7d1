/*
 * view.c: ampc_view, the one description of an array the C code works on:
 * a NumPy array's view (read through the NumPy C API: any strides, any
 * ml_dtypes bfloat16) and a view's release. Reading any other kind of
 * array (ampc.Array, DLPack producers) is any_array.c's.
 */
#include "ampc.h"

void ampc_view_release(ampc_view *view)
{
    Py_CLEAR(view->owner);
    Py_CLEAR(view->source);
}

int ampc_view_from_ndarray(ampc_state *st, PyArrayObject *a, const char *argname, ampc_view *v)
{
    const int dtype = ampc_dtype_from_descr(st, PyArray_DESCR(a));
    if (dtype < 0) {
        PyErr_Format(PyExc_TypeError, "%s has dtype %R, which ampc does not support", argname,
                     (PyObject *)PyArray_DESCR(a));
        return -1;
    }
    v->data = PyArray_BYTES(a);
    v->dtype = (ampc_dtype)dtype;
    v->ndim = PyArray_NDIM(a);
    v->numel = PyArray_SIZE(a);
    for (int d = 0; d < v->ndim; d++) {
        v->shape[d] = PyArray_DIM(a, d);
        v->strides[d] = PyArray_STRIDE(a, d);
    }
    /* NumPy bounds the size, not the strides (as_strided takes any): every view's extent fits in
     * int64, so that no offset ampc computes over it wraps. */
    int64_t lo, hi;
    if (v->numel > 0 && ampc_layout_extent(v->ndim, v->shape, v->strides, ampc_dtype_size(v->dtype), &lo, &hi) < 0) {
        PyErr_Format(PyExc_ValueError, "%s: the array's strides span more than 2**63 bytes", argname);
        return -1;
    }
    v->device = (ampc_device){AMPC_DEVICE_CPU, 0};
    v->readonly = !PyArray_ISWRITEABLE(a);
    v->stream = NULL;
    Py_INCREF(a);
    v->owner = (PyObject *)a;
    v->source = NULL;
    return 0;
}
