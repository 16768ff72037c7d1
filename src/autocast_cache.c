/*
 * autocast_cache.c: the weight-cast cache. Inside a region, a float32
 * Parameter that an op wants in the region's lower dtype is cast once and the
 * copy reused by every later op of the region, as torch's cached_cast does.
 *
 * Process-wide (a region opened by another thread, say a backward pass,
 * reuses the casts), keyed by the Parameter's identity; the entry keeps the
 * Parameter, its data object and its version at the time of the cast, so a
 * write (an optimizer step, p.data = ..., bump_version()) makes the next op
 * cast again instead of reading a stale copy, and a reused id can never
 * match. Data with a version counter of its own (a torch tensor's
 * _version, which its in-place ops count) is checked by that too. Cleared when a thread leaves its outermost region, so nothing grows
 * from one iteration to the next.
 */
#include "autocast.h"

ampc_autocast_counters ampc_autocast_count;

enum { ENTRY_PARAM, ENTRY_DATA, ENTRY_VERSION, ENTRY_DATA_VERSION, ENTRY_DTYPE, ENTRY_CAST };

/* The data's own write counter (torch's Tensor._version) as an exact int, None
 * for data without one (NumPy arrays, CuPy, ...), or NULL (nothing raised)
 * for a counter the cache cannot trust to compare without running Python (an
 * int subclass, a float, a raising property): such data is never cached. Any
 * size of int: one past int64 is not "no counter". */
static PyObject *data_version(PyObject *data)
{
    if (PyArray_Check(data))
        return Py_NewRef(Py_None);
    PyObject *v = PyObject_GetAttrString(data, "_version");
    if (v == NULL) {
        const int missing = PyErr_ExceptionMatches(PyExc_AttributeError);
        PyErr_Clear();
        return missing ? Py_NewRef(Py_None) : NULL;
    }
    if (!PyLong_CheckExact(v))
        Py_CLEAR(v);
    return v;
}

/* Whether two data_version results say "not written in between": both None, or equal exact ints. */
static int same_version(PyObject *a, PyObject *b)
{
    if (a == NULL || b == NULL)
        return 0;
    if (a == Py_None || b == Py_None)
        return a == b;
    const int eq = PyObject_RichCompareBool(a, b, Py_EQ);  /* exact ints: no Python runs */
    PyErr_Clear();
    return eq == 1;
}

PyObject *ampc_cast_cache_get(ampc_state *st, PyObject *param, ampc_dtype dtype)
{
    PyObject *key = PyLong_FromVoidPtr(param);
    if (key == NULL) {
        PyErr_Clear();
        return NULL;
    }
    PyObject *entry = Py_XNewRef(PyDict_GetItemWithError(st->cast_cache, key));
    Py_DECREF(key);
    if (entry == NULL) {
        PyErr_Clear();
        return NULL;
    }
    /* The entry is held: reading the data's _version runs Python (a property),
     * which may clear the cache or write the parameter. The parameter is read
     * after it. */
    ampc_parameter *p = (ampc_parameter *)param;
    PyObject *data = Py_NewRef(PyTuple_GET_ITEM(entry, ENTRY_DATA));
    PyObject *version = data_version(data);
    PyObject *hit = NULL;
    if (data == p->data &&
        PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(entry, ENTRY_VERSION)) == *ampc_parameter_version(p) &&
        PyLong_AsLong(PyTuple_GET_ITEM(entry, ENTRY_DTYPE)) == (long)dtype &&
        same_version(PyTuple_GET_ITEM(entry, ENTRY_DATA_VERSION), version))
        hit = Py_NewRef(PyTuple_GET_ITEM(entry, ENTRY_CAST));
    Py_XDECREF(version);
    Py_DECREF(data);
    Py_DECREF(entry);
    return hit;
}

int ampc_cast_cache_put(ampc_state *st, PyObject *param, ampc_dtype dtype, PyObject *cast, int nesting)
{
    ampc_parameter *p = (ampc_parameter *)param;
    PyObject *data = Py_NewRef(p->data);
    PyObject *version = data_version(data);  /* Python: may write the parameter */
    int rc = 0;
    /* else the cast is of data the parameter no longer has, the region is gone, or the data's
     * counter cannot be trusted: not kept */
    if (data == p->data && ampc_autocast.nesting >= nesting && version != NULL) {
        PyObject *key = PyLong_FromVoidPtr(param);
        PyObject *entry = key ? Py_BuildValue("(OOKOiO)", param, data, *ampc_parameter_version(p), version,
                                              (int)dtype, cast)
                              : NULL;
        rc = entry ? PyDict_SetItem(st->cast_cache, key, entry) : -1;
        Py_XDECREF(key);
        Py_XDECREF(entry);
    }
    Py_XDECREF(version);
    Py_DECREF(data);
    return rc;
}

void ampc_cast_cache_clear(ampc_state *st)
{
    if (st != NULL && st->cast_cache != NULL)
        PyDict_Clear(st->cast_cache);
}

static PyObject *mod_clear_autocast_cache(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    ampc_cast_cache_clear(ampc_state_of(module));
    Py_RETURN_NONE;
}

static PyObject *mod_autocast_cache_info(PyObject *module, PyObject *Py_UNUSED(ignored))
{
    return Py_BuildValue("{s:n,s:K,s:K}", "entries", PyDict_GET_SIZE(ampc_state_of(module)->cast_cache),
                         "casts", ampc_autocast_count.casts, "cache_hits", ampc_autocast_count.cache_hits);
}

PyMethodDef ampc_autocast_cache_methods[] = {
    {"clear_autocast_cache", mod_clear_autocast_cache, METH_NOARGS,
     "clear_autocast_cache()\n--\n\nDrop every cached weight cast (leaving the outermost region does it)."},
    {"_autocast_cache_info", mod_autocast_cache_info, METH_NOARGS,
     "entries in the cast cache now; casts autocast made and cache hits since the process started."},
    {NULL, NULL, 0, NULL},
};
