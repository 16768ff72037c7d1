/*
 * parameter.c: ampc.Parameter, an array that an optimizer updates in place,
 * with its gradient and a version counter.
 *
 * The counter is what lets autocast's weight-cast cache reuse a float16 copy
 * of a float32 weight for a whole region and still never hand out a stale
 * one: every write ampc can see (an optimizer step, `p.data = ...`,
 * ampc.Parameter.bump_version()) counts one, and the cache keeps the count it
 * cast at. It lives in C so that the optimizers can count a thousand
 * parameters, and the cache check one, in nanoseconds.
 */
#include "ampc.h"

#include <structmember.h>

#define PARAM(op) ((ampc_parameter *)(op))

/* A Parameter holds an array (torch's holds a tensor): a list or a number would be found out
 * only later, by whatever reads its .shape. */
static int check_array(PyObject *value, const char *what)
{
    if (PyArray_Check(value) || (!PyUnicode_Check(value) && PyObject_HasAttrString(value, "__dlpack__")))
        return 0;
    PyErr_Format(PyExc_TypeError, "%s must be an array (a NumPy ndarray, or an object with __dlpack__ such as a "
                 "CuPy array, torch tensor or JAX array), got %s", what, Py_TYPE(value)->tp_name);
    return -1;
}

/* The array a Parameter is to hold (a new reference): value's own, or for another Parameter
 * (Parameter(p), q.data = p) the array that one holds, shared as torch's nn.Parameter(p) shares p's
 * storage; never a Parameter inside a Parameter. Strong: what runs before it is stored (an
 * allocation's garbage collection, finalizers) may assign p.data and drop p's array. */
static PyObject *array_to_hold(ampc_state *st, PyObject *value, const char *what)
{
    if (ampc_is_parameter(st, value))
        return Py_NewRef(PARAM(value)->data);
    return check_array(value, what) < 0 ? NULL : Py_NewRef(value);
}

/* The Parameter whose counter `self` (NULL while it is being made) is to
 * count in once it holds value's array: a new reference to value's owner,
 * where value is a Parameter that does not count in self's; else NULL, self's
 * own counter. */
static PyObject *counter_to_share(ampc_state *st, PyObject *self, PyObject *value)
{
    if (!ampc_is_parameter(st, value))
        return NULL;
    PyObject *owner = PARAM(value)->counter_owner != NULL ? PARAM(value)->counter_owner : value;
    return owner == self ? NULL : Py_NewRef(owner);
}

static PyObject *Parameter_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"data", "requires_grad", NULL};
    ampc_state *st = ampc_state_from_type(type);
    PyObject *value;
    int requires_grad = 1;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "O|p:Parameter", kwlist, &value, &requires_grad))
        return NULL;
    PyObject *data = array_to_hold(st, value, "Parameter: data");
    if (data == NULL)
        return NULL;
    PyObject *counter_owner = counter_to_share(st, NULL, value);
    ampc_parameter *self = (ampc_parameter *)type->tp_alloc(type, 0);
    if (self == NULL) {
        Py_DECREF(data);
        Py_XDECREF(counter_owner);
        return NULL;
    }
    self->data = data;
    self->counter_owner = counter_owner;
    self->grad = Py_NewRef(Py_None);
    self->requires_grad = (char)requires_grad;
    return (PyObject *)self;
}

static int Parameter_traverse(PyObject *op, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(op));
    Py_VISIT(PARAM(op)->data);
    Py_VISIT(PARAM(op)->grad);
    Py_VISIT(PARAM(op)->counter_owner);
    Py_VISIT(PARAM(op)->dict);
    return 0;
}

static int Parameter_clear(PyObject *op)
{
    Py_CLEAR(PARAM(op)->data);
    Py_CLEAR(PARAM(op)->grad);
    Py_CLEAR(PARAM(op)->counter_owner);
    Py_CLEAR(PARAM(op)->dict);
    return 0;
}

static void Parameter_dealloc(PyObject *op)
{
    PyTypeObject *type = Py_TYPE(op);
    PyObject_GC_UnTrack(op);
    if (PARAM(op)->weakreflist != NULL)
        PyObject_ClearWeakRefs(op);
    Parameter_clear(op);
    type->tp_free(op);
    Py_DECREF(type);
}

static PyObject *Parameter_get_data(PyObject *op, void *Py_UNUSED(closure))
{
    return Py_NewRef(PARAM(op)->data);
}

static int Parameter_set_data(PyObject *op, PyObject *value, void *Py_UNUSED(closure))
{
    if (value == NULL) {
        PyErr_SetString(PyExc_AttributeError, "Parameter.data cannot be deleted");
        return -1;
    }
    ampc_state *st = ampc_state_from_type(Py_TYPE(op));
    PyObject *data = array_to_hold(st, value, "Parameter.data");
    if (data == NULL)
        return -1;
    /* q.data = p shares p's counter as Parameter(p) does; q.data = array, q's own again */
    PyObject *old_data = PARAM(op)->data, *old_owner = PARAM(op)->counter_owner;
    PARAM(op)->counter_owner = counter_to_share(st, op, value);
    PARAM(op)->data = data;
    (*ampc_parameter_version(PARAM(op)))++;
    Py_DECREF(old_data);  /* last: a finalizer run here sees the new array and counter */
    Py_XDECREF(old_owner);
    return 0;
}

static PyObject *Parameter_get_grad(PyObject *op, void *Py_UNUSED(closure))
{
    return Py_NewRef(PARAM(op)->grad);
}

static int Parameter_set_grad(PyObject *op, PyObject *value, void *Py_UNUSED(closure))
{
    Py_SETREF(PARAM(op)->grad, Py_NewRef(value != NULL ? value : Py_None));
    return 0;
}

static PyObject *Parameter_get_requires_grad(PyObject *op, void *Py_UNUSED(closure))
{
    return PyBool_FromLong(PARAM(op)->requires_grad);
}

static int Parameter_set_requires_grad(PyObject *op, PyObject *value, void *Py_UNUSED(closure))
{
    const int flag = value != NULL ? PyObject_IsTrue(value) : 0;
    if (flag < 0)
        return -1;
    PARAM(op)->requires_grad = (char)flag;
    return 0;
}

static PyObject *Parameter_get_version(PyObject *op, void *Py_UNUSED(closure))
{
    return PyLong_FromUnsignedLongLong(*ampc_parameter_version(PARAM(op)));
}

/* data's attribute `name`: data held across the lookup, which runs the array's Python (a property
 * may assign p.data, dropping the array being asked). */
static PyObject *data_attribute(PyObject *op, const char *name)
{
    PyObject *data = Py_NewRef(PARAM(op)->data);
    PyObject *value = PyObject_GetAttrString(data, name);
    Py_DECREF(data);
    return value;
}

static PyObject *Parameter_get_shape(PyObject *op, void *Py_UNUSED(closure))
{
    PyObject *shape = data_attribute(op, "shape");
    if (shape == NULL || PyTuple_Check(shape))
        return shape;
    Py_SETREF(shape, PySequence_Tuple(shape));  /* torch.Size and the like */
    return shape;
}

static PyObject *Parameter_get_dtype(PyObject *op, void *Py_UNUSED(closure))
{
    return data_attribute(op, "dtype");
}

static PyObject *Parameter_get_ndim(PyObject *op, void *Py_UNUSED(closure))
{
    PyObject *shape = Parameter_get_shape(op, NULL);
    if (shape == NULL)
        return NULL;
    PyObject *ndim = PyLong_FromSsize_t(PyTuple_GET_SIZE(shape));
    Py_DECREF(shape);
    return ndim;
}

static PyGetSetDef Parameter_getset[] = {
    {"data", Parameter_get_data, Parameter_set_data,
     "The array. Assigning a new one counts as a write (the version goes up).", NULL},
    {"grad", Parameter_get_grad, Parameter_set_grad, "The gradient: None or an array like data.", NULL},
    {"requires_grad", Parameter_get_requires_grad, Parameter_set_requires_grad,
     "Whether the parameter is trained (autocast caches only the casts of those, as torch does).", NULL},
    {"_version", Parameter_get_version, NULL, "Writes counted so far (as torch.Tensor._version).", NULL},
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {"shape", Parameter_get_shape, NULL, "data's shape, as a tuple.", NULL},
    {"dtype", Parameter_get_dtype, NULL, "data's dtype.", NULL},
    {"ndim", Parameter_get_ndim, NULL, "data's number of dimensions.", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyObject *Parameter_repr(PyObject *op)
{
    PyObject *shape = Parameter_get_shape(op, NULL);
    PyObject *dtype = shape ? Parameter_get_dtype(op, NULL) : NULL;
    PyObject *r = dtype ? PyUnicode_FromFormat("Parameter(shape=%R, dtype=%S)", shape, dtype) : NULL;
    Py_XDECREF(shape);
    Py_XDECREF(dtype);
    return r;
}

static PyObject *Parameter_bump_version(PyObject *op, PyObject *Py_UNUSED(ignored))
{
    (*ampc_parameter_version(PARAM(op)))++;
    Py_RETURN_NONE;
}

/* Pickled as (data, requires_grad) and then (grad, __dict__); the version
 * counts writes to this object and starts again at 0. */
static PyObject *Parameter_reduce(PyObject *op, PyObject *Py_UNUSED(ignored))
{
    ampc_parameter *self = PARAM(op);
    return Py_BuildValue("(O(OO)(OO))", (PyObject *)Py_TYPE(op), self->data,
                         self->requires_grad ? Py_True : Py_False, self->grad,
                         self->dict != NULL ? self->dict : Py_None);
}

static PyObject *Parameter_setstate(PyObject *op, PyObject *state)
{
    PyObject *grad, *dict;
    if (!PyArg_ParseTuple(state, "OO:__setstate__", &grad, &dict))
        return NULL;
    Py_SETREF(PARAM(op)->grad, Py_NewRef(grad));
    if (dict != Py_None) {
        PyObject *own = PyObject_GenericGetDict(op, NULL);
        const int rc = own != NULL ? PyDict_Update(own, dict) : -1;
        Py_XDECREF(own);
        if (rc < 0)
            return NULL;
    }
    Py_RETURN_NONE;
}

/* The array protocols, answered by data, so that np.asarray(p), torch.from_dlpack(p) and
 * cupy.asarray(p) see the array (without __array__ NumPy made an object array of the Parameter). */
static PyObject *Parameter_array(PyObject *op, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"dtype", "copy", NULL};
    PyObject *dtype = Py_None, *copy = Py_None;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "|OO:__array__", kwlist, &dtype, &copy))
        return NULL;
    PyObject *numpy = PyImport_ImportModule("numpy");
    PyObject *asarray = numpy != NULL ? PyObject_GetAttrString(numpy, "asarray") : NULL;
    Py_XDECREF(numpy);
    if (asarray == NULL)
        return NULL;
    PyObject *call_args = Py_BuildValue("(O)", PARAM(op)->data);
    PyObject *call_kwargs = call_args != NULL ? Py_BuildValue("{sOsO}", "dtype", dtype, "copy", copy) : NULL;
    PyObject *result = call_kwargs != NULL ? PyObject_Call(asarray, call_args, call_kwargs) : NULL;
    Py_XDECREF(call_kwargs);
    Py_XDECREF(call_args);
    Py_DECREF(asarray);
    return result;
}

static PyObject *Parameter_dlpack(PyObject *op, PyObject *args, PyObject *kwargs)
{
    PyObject *method = data_attribute(op, "__dlpack__");
    if (method == NULL)
        return NULL;
    PyObject *capsule = PyObject_Call(method, args, kwargs);
    Py_DECREF(method);
    return capsule;
}

static PyObject *Parameter_dlpack_device(PyObject *op, PyObject *Py_UNUSED(ignored))
{
    PyObject *method = data_attribute(op, "__dlpack_device__");
    if (method == NULL)
        return NULL;
    PyObject *device = PyObject_CallNoArgs(method);
    Py_DECREF(method);
    return device;
}

static PyMethodDef Parameter_methods[] = {
    {"__array__", (PyCFunction)(void (*)(void))Parameter_array, METH_VARARGS | METH_KEYWORDS,
     "data as a NumPy array (np.asarray(data, dtype, copy))."},
    {"__dlpack__", (PyCFunction)(void (*)(void))Parameter_dlpack, METH_VARARGS | METH_KEYWORDS,
     "data's DLPack capsule."},
    {"__dlpack_device__", Parameter_dlpack_device, METH_NOARGS, "data's DLPack device."},
    {"bump_version", Parameter_bump_version, METH_NOARGS,
     "bump_version($self, /)\n--\n\nCount a write to data that ampc cannot see (p.data[...] = x): a float16 "
     "copy that autocast cached for this region is then made again."},
    {"__reduce__", Parameter_reduce, METH_NOARGS, NULL},
    {"__setstate__", Parameter_setstate, METH_O, NULL},
    {NULL, NULL, 0, NULL},
};

static PyMemberDef Parameter_members[] = {
    {"__dictoffset__", T_PYSSIZET, offsetof(ampc_parameter, dict), READONLY, NULL},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(ampc_parameter, weakreflist), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(Parameter_doc,
"Parameter(data, requires_grad=True)\n--\n\n"
"An array that an optimizer updates in place, and its gradient (.grad: None, or an array of the same\n"
"shape, dtype, device and strides). data may be a NumPy array or any DLPack array; it is not copied.\n"
"Inside an autocast region a float32 Parameter that an op wants in float16 or bfloat16 is cast once\n"
"per region and the copy reused, until the parameter is written (an optimizer step, p.data = ...,\n"
"p.bump_version()).");

static PyType_Slot Parameter_slots[] = {
    {Py_tp_new, Parameter_new},
    {Py_tp_dealloc, Parameter_dealloc},
    {Py_tp_traverse, Parameter_traverse},
    {Py_tp_clear, Parameter_clear},
    {Py_tp_repr, Parameter_repr},
    {Py_tp_getset, Parameter_getset},
    {Py_tp_methods, Parameter_methods},
    {Py_tp_members, Parameter_members},
    {Py_tp_doc, (void *)Parameter_doc},
    {0, NULL},
};

static PyType_Spec Parameter_spec = {
    .name = "ampc.Parameter",
    .basicsize = sizeof(ampc_parameter),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE | Py_TPFLAGS_HAVE_GC,
    .slots = Parameter_slots,
};

/* _bump_versions(params): count a write to each Parameter of a sequence (an
 * optimizer's step over a group). Other objects are skipped. */
static PyObject *mod_bump_versions(PyObject *module, PyObject *params)
{
    ampc_state *st = ampc_state_of(module);
    PyObject *seq = PySequence_Fast(params, "_bump_versions expects a sequence of parameters");
    if (seq == NULL)
        return NULL;
    const Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    PyObject **items = PySequence_Fast_ITEMS(seq);
    for (Py_ssize_t i = 0; i < n; i++)
        if (ampc_is_parameter(st, items[i]))
            (*ampc_parameter_version(PARAM(items[i])))++;
    Py_DECREF(seq);
    Py_RETURN_NONE;
}

PyMethodDef ampc_parameter_methods[] = {
    {"_bump_versions", mod_bump_versions, METH_O, "Count a write to each Parameter of a sequence."},
    {NULL, NULL, 0, NULL},
};

int ampc_parameter_type_init(PyObject *module, ampc_state *st)
{
    st->parameter_type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &Parameter_spec, NULL);
    if (st->parameter_type == NULL)
        return -1;
    return PyModule_AddType(module, st->parameter_type);
}
