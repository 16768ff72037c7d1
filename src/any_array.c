/*
 * any_array.c: every array the C code is handed becomes an ampc_view: NumPy
 * arrays through view.c, ampc.Arrays directly, everything else through
 * DLPack (dlpack.c). Results go back as the caller's own type without a copy.
 */
#include "ampc.h"

static int view_from_array(PyObject *array, ampc_view *v)
{
    *v = *ampc_array_view(array);
    Py_INCREF(array);
    v->owner = array;
    return 0;
}

static int view_from_any(ampc_state *st, PyObject *obj, const char *argname, ampc_access access,
                         ampc_view *view);

int ampc_view_from_object(ampc_state *st, PyObject *obj, const char *argname,
                          ampc_access access, ampc_view *view)
{
    if (!ampc_is_parameter(st, obj))
        return view_from_any(st, obj, argname, access, view);
    /* A Parameter reads as its array (held while it is described, which may
     * run Python code, __dlpack__, that assigns p.data). */
    PyObject *data = Py_NewRef(((ampc_parameter *)obj)->data);
    const int rc = view_from_any(st, data, argname, access, view);
    Py_DECREF(data);
    return rc;
}

static int view_from_any(ampc_state *st, PyObject *obj, const char *argname, ampc_access access,
                         ampc_view *view)
{
    view->owner = NULL;
    view->source = NULL;
    int rc = -1;
    if (PyArray_Check(obj)) {
        rc = ampc_view_from_ndarray(st, (PyArrayObject *)obj, argname, view);
    }
    else if (ampc_is_array(st, obj)) {
        rc = view_from_array(obj, view);
    }
    else if (PyArray_IsScalar(obj, Generic) || PyFloat_Check(obj) || PyLong_Check(obj)) {
        /* A scalar becomes a 0-d array of its NumPy type (Python float:
         * float64; int and bool are integer dtypes that casts refuse), a
         * copy: read-only, since a write would be lost. */
        PyObject *a = PyArray_FromAny(obj, NULL, 0, 0, 0, NULL);
        if (a == NULL)
            return -1;
        rc = ampc_view_from_ndarray(st, (PyArrayObject *)a, argname, view);
        view->readonly = 1;
        Py_DECREF(a);
    }
    else if ((rc = ampc_dlpack_fast_view(st, obj, argname, view)) != 0) {
        /* done (rc 1) or failed (rc -1) through the C exchange API */
        if (rc > 0)
            rc = 0;
    }
    else if (PyCapsule_CheckExact(obj) || PyObject_HasAttrString(obj, "__dlpack__")) {
        PyObject *array = ampc_dlpack_import(st, obj, argname, access);
        if (array == NULL)
            return -1;
        rc = view_from_array(array, view);
        Py_DECREF(array);
    }
    else {
        PyErr_Format(PyExc_TypeError,
                     "%s must be an array (a NumPy ndarray, an object with __dlpack__ such as a "
                     "CuPy array, torch tensor or JAX array, or a Python float), got %.200s",
                     argname, Py_TYPE(obj)->tp_name);
        return -1;
    }
    if (rc < 0)
        return -1;
    Py_INCREF(Py_TYPE(obj));
    view->source = Py_TYPE(obj);
    return 0;
}

/* The callable that turns an ampc.Array into an array of type `source`, or
 * None to return the ampc.Array itself. Asked of ampc._interop once per type
 * (it knows CuPy, torch and JAX without importing them first) and kept. */
static PyObject *converter_for(ampc_state *st, PyTypeObject *source)
{
    PyObject *conv = PyDict_GetItemWithError(st->converters, (PyObject *)source);
    if (conv != NULL) {
        Py_INCREF(conv);
        return conv;
    }
    if (PyErr_Occurred())
        return NULL;
    if (st->converter_for == NULL) {
        PyObject *interop = PyImport_ImportModule("ampc._interop");
        if (interop == NULL)
            return NULL;
        st->converter_for = PyObject_GetAttrString(interop, "converter_for");
        Py_DECREF(interop);
        if (st->converter_for == NULL)
            return NULL;
    }
    conv = PyObject_CallOneArg(st->converter_for, (PyObject *)source);
    if (conv == NULL)
        return NULL;
    if (PyDict_SetItem(st->converters, (PyObject *)source, conv) < 0) {
        Py_DECREF(conv);
        return NULL;
    }
    return conv;
}

PyObject *ampc_return_as(ampc_state *st, PyObject *result, PyTypeObject *source)
{
    PyObject *array = NULL, *conv = NULL, *out = NULL;
    if (result == NULL)
        return NULL;
    const int numpy_source = PyType_IsSubtype(source, &PyArray_Type) ||
                             PyType_IsSubtype(source, &PyGenericArrType_Type) ||
                             source == &PyFloat_Type || PyType_IsSubtype(source, &PyLong_Type);
    if (PyArray_Check(result) && numpy_source)
        return result;

    if (PyArray_Check(result)) {
        array = ampc_array_from_ndarray(st, (PyArrayObject *)result);
        Py_DECREF(result);
        if (array == NULL)
            return NULL;
    }
    else {
        array = result;
    }
    if (source == st->array_type || PyType_IsSubtype(source, &PyCapsule_Type))
        return array;
    const int fast = ampc_dlpack_fast_return(st, ampc_array_view(array), array, source, &out);
    if (fast != 0)
        goto done;
    conv = converter_for(st, source);
    if (conv == NULL)
        goto done;
    if (conv == Py_None) {
        out = array;
        array = NULL;
        goto done;
    }
    out = PyObject_CallOneArg(conv, array);
done:
    Py_XDECREF(conv);
    Py_XDECREF(array);
    return out;
}

