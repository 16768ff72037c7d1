/*
 * copy.c: the Python functions that make a converted or moved copy:
 * ampc.cast(x, dtype, *, out=None) and _to_device(x, device). They read and
 * check their arguments, allocate the result (an ndarray on the host, an
 * ampc.Array on a GPU) and hand the conversion to cast.c or the copy to
 * ampc_copy_bytes (the device's backend).
 *
 * cast: everything is checked before anything is written: dtypes, shapes,
 * devices, a read-only or self-overlapping out=, out= overlapping x. The
 * result keeps x's dimension order (a transposed input gives a transposed
 * output) so the kernels see one contiguous run wherever the input is dense.
 */
#include "ampc.h"

#include <string.h>

/* 1 if the two views touch a common byte, unless they are the same elements
 * in the same layout (an in-place cast to the same dtype is a plain copy). */
static int overlaps(const ampc_view *a, const ampc_view *b)
{
    if (a->numel == 0 || b->numel == 0 || a->device.type != b->device.type ||
        a->device.index != b->device.index)
        return 0;
    if (a->data == b->data && a->dtype == b->dtype) {
        int same = 1;
        for (int d = 0; d < a->ndim; d++)
            same &= a->strides[d] == b->strides[d] || a->shape[d] <= 1;
        if (same)
            return 0;
    }
    int64_t alo, ahi, blo, bhi;
    if (ampc_layout_extent(a->ndim, a->shape, a->strides, ampc_dtype_size(a->dtype), &alo, &ahi) < 0 ||
        ampc_layout_extent(b->ndim, b->shape, b->strides, ampc_dtype_size(b->dtype), &blo, &bhi) < 0)
        return 1;  /* no view spans that much (view.c, dlpack.c): refused, never guessed */
    const uintptr_t a0 = (uintptr_t)a->data + (uintptr_t)alo, a1 = (uintptr_t)a->data + (uintptr_t)ahi;
    const uintptr_t b0 = (uintptr_t)b->data + (uintptr_t)blo, b1 = (uintptr_t)b->data + (uintptr_t)bhi;
    return a0 < b1 && b0 < a1;
}

/* 0 if cast writes `target` from `source`: a floating dtype from anything,
 * or a copy of the same dtype; else a TypeError naming `what`. */
static int check_target(ampc_dtype target, ampc_dtype source, const char *what)
{
    if (AMPC_DTYPE_IS_FLOAT(target) || target == source)
        return 0;
    PyErr_Format(PyExc_TypeError, "cast: %s must be float32, float16, bfloat16 or float64 (or x's own dtype, "
                 "a copy), got %s", what, ampc_dtype_names[target]);
    return -1;
}

/* All of cast()'s checks on out=, before anything is written. */
static int check_out(const ampc_view *out, const ampc_view *x, int have_dtype, ampc_dtype dtype)
{
    char a[32], b[32];
    if (have_dtype && out->dtype != dtype) {
        PyErr_Format(PyExc_TypeError, "cast: out has dtype %s but dtype=%s was asked for",
                     ampc_dtype_names[out->dtype], ampc_dtype_names[dtype]);
        return -1;
    }
    if (check_target(out->dtype, x->dtype, "out's dtype") < 0)
        return -1;
    if (out->device.type != x->device.type || out->device.index != x->device.index) {
        PyErr_Format(PyExc_ValueError, "cast: x is on %s but out is on %s",
                     ampc_device_str(x->device, a, sizeof a), ampc_device_str(out->device, b, sizeof b));
        return -1;
    }
    if (!ampc_same_shape(out, x)) {
        char sa[256], sb[256];
        ampc_shape_str(out, sa, sizeof sa);
        ampc_shape_str(x, sb, sizeof sb);
        PyErr_Format(PyExc_ValueError, "cast: out has shape %s but x has shape %s", sa, sb);
        return -1;
    }
    if (out->readonly) {
        PyErr_SetString(PyExc_ValueError, "cast: out is read-only");
        return -1;
    }
    if (ampc_layout_has_internal_overlap(out->ndim, out->shape, out->strides,
                                         ampc_dtype_size(out->dtype))) {
        PyErr_SetString(PyExc_ValueError, "cast: out has elements that share memory (zero or "
                        "overlapping strides)");
        return -1;
    }
    if (overlaps(out, x)) {
        PyErr_SetString(PyExc_ValueError, "cast: out overlaps x in memory");
        return -1;
    }
    return 0;
}

static PyObject *mod_cast(PyObject *module, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"x", "dtype", "out", NULL};
    ampc_state *st = ampc_state_of(module);
    PyObject *x_obj, *dtype_obj = Py_None, *out_obj = Py_None, *result = NULL;
    ampc_view x = {0}, out = {0};
    ampc_dtype dtype = AMPC_FLOAT32;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|O$O:cast", kwlist, &x_obj, &dtype_obj, &out_obj))
        return NULL;
    const int have_dtype = dtype_obj != Py_None;
    if (have_dtype && ampc_dtype_parse(st, dtype_obj, "cast: dtype", &dtype) < 0)
        return NULL;
    if (!have_dtype && out_obj == Py_None) {
        PyErr_SetString(PyExc_TypeError, "cast() needs a dtype, or out= to take the dtype from");
        return NULL;
    }
    if (ampc_view_from_object(st, x_obj, "cast: x", AMPC_FOR_READING, &x) < 0)
        goto done;
    if (have_dtype && check_target(dtype, x.dtype, "dtype") < 0)
        goto done;

    if (out_obj != Py_None) {
        if (ampc_view_from_object(st, out_obj, "cast: out", AMPC_FOR_WRITING, &out) < 0 ||
            check_out(&out, &x, have_dtype, dtype) < 0)
            goto done;
        const int rc = ampc_cast_views(st, &out, &x, 0);
        ampc_count_write(st, out_obj);  /* written (a failed GPU cast may have written part) */
        if (rc < 0)
            goto done;
        Py_INCREF(out_obj);
        result = out_obj;
        goto done;
    }
    PyObject *fresh = ampc_empty_like(st, &x, dtype, &out);
    if (fresh == NULL)
        goto done;
    if (ampc_cast_views(st, &out, &x, 1) < 0) {
        Py_DECREF(fresh);
        goto done;
    }
    result = ampc_return_as(st, fresh, x.source);
done:
    ampc_view_release(&x);
    ampc_view_release(&out);
    return result;
}

PyDoc_STRVAR(mod_cast_doc,
"cast(x, dtype=None, *, out=None)\n--\n\n"
"Convert x to dtype (float32, float16, bfloat16 or float64), rounding to nearest even.\n\n"
"An integer or bool x converts as torch's .to() does (through float32 for the 16-bit dtypes),\n"
"and copies to its own dtype. NaN stays NaN (quiet, sign and leading payload bits kept), overflow becomes +-inf and\n"
"subnormals are exact, bit for bit the same on the CPU and the GPU. x may be a NumPy array,\n"
"a Python float, or any DLPack array (CuPy, torch, JAX); the result is a new array of the\n"
"same type, on the same device, in x's dimension order. With out=, the result is written\n"
"there (same shape and device; dtype may then be omitted) and out is returned.");

/* A copy of x (dense, in its own layout) on device: -1 the host (a NumPy array), else
 * that GPU (an ampc.Array from ampc's pool). The copy is queued on the
 * stream in use on the GPU end, after the work that made x; one that lands
 * on the host waits for it. Module.to() moves parameters with it. */
static PyObject *mod_to_device(PyObject *module, PyObject *args)
{
    ampc_state *st = ampc_state_of(module);
    PyObject *x, *fresh = NULL;
    int device;
    if (!PyArg_ParseTuple(args, "Oi:_to_device", &x, &device))
        return NULL;
    if (device >= 0 && ampc_cuda_check_device(st, device) < 0)
        return NULL;
    ampc_view v, out;
    if (ampc_view_from_object(st, x, "to: x", AMPC_FOR_READING, &v) < 0)
        return NULL;
    const int64_t itemsize = ampc_dtype_size(v.dtype);
    /* dense in some order of its dimensions (C order, channels-last, a transpose), strides positive:
     * its bytes are one block, copied as they are, and the copy keeps the strides */
    int64_t lo = 0, hi = 0, strides[AMPC_MAX_NDIM];
    int positive = 1;
    for (int d = 0; d < v.ndim; d++)
        positive &= v.strides[d] > 0 || v.shape[d] <= 1;
    /* (every view's extent was checked when it was made: the -1 of an overflow cannot come) */
    const int extent = v.numel > 0 ? ampc_layout_extent(v.ndim, v.shape, v.strides, itemsize, &lo, &hi) : 0;
    if (v.numel > 0 && (extent < 0 || !positive || lo != 0 || hi != v.numel * itemsize ||
                        ampc_layout_has_internal_overlap(v.ndim, v.shape, v.strides, itemsize))) {
        PyErr_SetString(PyExc_ValueError, "to: x must be dense (C order, channels-last or another order of its "
                        "dimensions) with positive strides");
        goto done;
    }
    ampc_layout_korder_strides(v.ndim, v.shape, v.strides, itemsize, strides);
    const ampc_device target = {device < 0 ? AMPC_DEVICE_CPU : AMPC_DEVICE_CUDA, device < 0 ? 0 : device};
    fresh = ampc_array_empty(st, target, v.dtype, v.ndim, v.shape, strides, &out);
    if (fresh == NULL)
        goto done;
    const size_t nbytes = (size_t)(v.numel * itemsize);
    const int src = v.device.type == AMPC_DEVICE_CPU ? -1 : v.device.index;
    void *stream = src >= 0 || device >= 0 ? ampc_current_stream(device >= 0 ? device : src, NULL) : NULL;
    ampc_streams_seen seen = {0};
    if (src >= 0 && ampc_order_stream(st, src, stream, v.stream, 1, &seen) < 0) {
        Py_CLEAR(fresh);
        goto done;
    }
    if (ampc_copy_bytes(st, target, out.data, v.device, v.data, nbytes, stream, "copying an array between devices") < 0)
        Py_CLEAR(fresh);
done:
    ampc_view_release(&v);
    return fresh;
}

int ampc_copy_bytes(ampc_state *st, ampc_device dst_device, void *dst, ampc_device src_device, const void *src,
                    size_t nbytes, void *stream, const char *what)
{
    if (nbytes == 0)
        return 0;
    if (dst_device.type == AMPC_DEVICE_CPU && src_device.type == AMPC_DEVICE_CPU) {
        memcpy(dst, src, nbytes);
        return 0;
    }
    const ampc_device device = dst_device.type != AMPC_DEVICE_CPU ? dst_device : src_device;
    const int status = ampc_backend_of(st, device)->copy(dst_device.type == AMPC_DEVICE_CPU ? -1 : dst_device.index,
                                                         dst, src_device.type == AMPC_DEVICE_CPU ? -1 : src_device.index,
                                                         src, nbytes, stream);
    return status == AMPC_OK ? 0 : ampc_backend_raise(st, device, status, what);
}

PyMethodDef ampc_copy_methods[] = {
    {"cast", (PyCFunction)(void (*)(void))mod_cast, METH_VARARGS | METH_KEYWORDS, mod_cast_doc},
    {"_to_device", mod_to_device, METH_VARARGS, "A copy of dense x, in its layout, on a device (-1: the host)."},
    {NULL, NULL, 0, NULL},
};
