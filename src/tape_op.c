/*
 * tape_op.c: ampc.TapeOp, the tape's wrapper of an op
 * (ampc.autograd.differentiable), and the question it asks of every call.
 *
 * A call goes on the tape when an argument needs a gradient: a Tensor (an
 * op's output on the tape), or a Parameter that requires grad, anywhere
 * among the arguments, lists and tuples included. Most calls need nothing
 * (inference, the optimizers' and the scaler's arrays, every call without a
 * Tensor), and for them the wrapper was Python: its frame, the packing of
 * the arguments and the loops over them took 0.9 us of F.relu's 3.2 on a
 * torch tensor (torch.relu: 1.2). TapeOp asks in C and calls the op at once;
 * the rest goes to the Python recorder it was given.
 */
#include "ampc.h"

#include <structmember.h>

typedef struct {
    PyObject_HEAD
    PyObject *op;           /* the op itself */
    PyObject *record;       /* called instead when an argument needs a gradient */
    PyTypeObject *tensor;   /* ampc.autograd.Tensor */
    PyObject *explain;      /* explain(error, args, kwargs): the op's AttributeError renamed, or None */
    ampc_state *st;
    PyObject *dict;
    PyObject *weakreflist;
    vectorcallfunc vectorcall;
} tape_op;

#define TAPE_OP(o) ((tape_op *)(o))

/* Whether v is, or holds in lists and tuples, a `tensor` or a Parameter
 * that requires grad; -1 with an exception when the nesting is too deep (a
 * list that holds itself). */
static int needs_grad(ampc_state *st, PyObject *v, PyTypeObject *tensor)
{
    if (PyObject_TypeCheck(v, tensor))
        return 1;
    if (ampc_is_parameter(st, v))
        return ((ampc_parameter *)v)->requires_grad != 0;
    if (!PyList_Check(v) && !PyTuple_Check(v))
        return 0;
    if (Py_EnterRecursiveCall(" in the tape's check of an op's arguments"))
        return -1;
    int found = 0;
    /* nothing here runs Python code, so a list cannot change under the loop */
    for (Py_ssize_t i = 0; found == 0 && i < PySequence_Fast_GET_SIZE(v); i++)
        found = needs_grad(st, PySequence_Fast_GET_ITEM(v, i), tensor);
    Py_LeaveRecursiveCall();
    return found;
}

static int any_needs_grad(ampc_state *st, PyObject *const *args, Py_ssize_t n, PyTypeObject *tensor)
{
    int found = 0;
    for (Py_ssize_t i = 0; found == 0 && i < n; i++)
        found = needs_grad(st, args[i], tensor);
    return found;
}

/* The op's AttributeError (an argument that is no array) as explain names
 * it, raised from None as the Python wrapper did; any other error as it
 * was. Called with the error set; returns NULL. */
static PyObject *explained(tape_op *self, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames)
{
    if (self->explain == Py_None || !PyErr_ExceptionMatches(PyExc_AttributeError))
        return NULL;
    PyObject *error = ampc_take_exception();
    PyObject *tuple = PyTuple_New(nargs), *kwargs = PyDict_New(), *named = NULL;
    if (tuple == NULL || kwargs == NULL)
        goto done;
    for (Py_ssize_t i = 0; i < nargs; i++)
        PyTuple_SET_ITEM(tuple, i, Py_NewRef(args[i]));
    for (Py_ssize_t i = 0; kwnames != NULL && i < PyTuple_GET_SIZE(kwnames); i++)
        if (PyDict_SetItem(kwargs, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0)
            goto done;
    named = PyObject_CallFunctionObjArgs(self->explain, error, tuple, kwargs, NULL);
done:
    Py_XDECREF(tuple);
    Py_XDECREF(kwargs);
    PyObject *raised = error;
    if (named == NULL) {  /* explain itself failed: its error, the op's as its context */
        raised = ampc_take_exception();
        if (raised == NULL)
            raised = error;
        else
            PyException_SetContext(raised, error);
    }
    else if (PyExceptionInstance_Check(named)) {  /* raise named from None, in the op's except clause */
        raised = named;
        named = NULL;
        PyException_SetContext(raised, error);
        PyException_SetCause(raised, NULL);
    }
    Py_XDECREF(named);
    ampc_restore_exception(raised);
    return NULL;
}

static PyObject *TapeOp_vectorcall(PyObject *o, PyObject *const *args, size_t nargsf, PyObject *kwnames)
{
    tape_op *self = TAPE_OP(o);
    const Py_ssize_t nargs = PyVectorcall_NARGS(nargsf), nkw = kwnames ? PyTuple_GET_SIZE(kwnames) : 0;
    const int found = any_needs_grad(self->st, args, nargs + nkw, self->tensor);
    if (found < 0)
        return NULL;
    if (found)
        return PyObject_Vectorcall(self->record, args, nargsf, kwnames);
    PyObject *result = PyObject_Vectorcall(self->op, args, nargsf, kwnames);
    return result != NULL ? result : explained(self, args, nargs, kwnames);
}

static PyObject *TapeOp_new(PyTypeObject *type, PyObject *args, PyObject *kwargs)
{
    static char *kwlist[] = {"op", "record", "tensor_type", "explain", NULL};
    PyObject *op, *record, *tensor, *explain = Py_None;
    ampc_state *st = ampc_state_from_type(type);
    if (st == NULL ||
        !PyArg_ParseTupleAndKeywords(args, kwargs, "OOO!|O:TapeOp", kwlist, &op, &record, &PyType_Type, &tensor,
                                     &explain))
        return NULL;
    if (!PyCallable_Check(op) || !PyCallable_Check(record) || (explain != Py_None && !PyCallable_Check(explain))) {
        PyErr_SetString(PyExc_TypeError, "TapeOp: op, record and explain must be callable");
        return NULL;
    }
    tape_op *self = (tape_op *)type->tp_alloc(type, 0);
    if (self == NULL)
        return NULL;
    self->op = Py_NewRef(op);
    self->record = Py_NewRef(record);
    self->tensor = (PyTypeObject *)Py_NewRef(tensor);
    self->explain = Py_NewRef(explain);
    self->st = st;
    self->vectorcall = TapeOp_vectorcall;
    return (PyObject *)self;
}

static int TapeOp_traverse(PyObject *o, visitproc visit, void *arg)
{
    Py_VISIT(Py_TYPE(o));
    Py_VISIT(TAPE_OP(o)->op);
    Py_VISIT(TAPE_OP(o)->record);
    Py_VISIT(TAPE_OP(o)->tensor);
    Py_VISIT(TAPE_OP(o)->explain);
    Py_VISIT(TAPE_OP(o)->dict);
    return 0;
}

static int TapeOp_clear(PyObject *o)
{
    Py_CLEAR(TAPE_OP(o)->op);
    Py_CLEAR(TAPE_OP(o)->record);
    Py_CLEAR(TAPE_OP(o)->tensor);
    Py_CLEAR(TAPE_OP(o)->explain);
    Py_CLEAR(TAPE_OP(o)->dict);
    return 0;
}

static void TapeOp_dealloc(PyObject *o)
{
    PyTypeObject *type = Py_TYPE(o);
    PyObject_GC_UnTrack(o);
    if (TAPE_OP(o)->weakreflist != NULL)
        PyObject_ClearWeakRefs(o);
    TapeOp_clear(o);
    type->tp_free(o);
    Py_DECREF(type);
}

/* Pickled by name, as a function is: __qualname__ (functools.update_wrapper's, then the name it is
 * public under) in __module__. */
static PyObject *TapeOp_reduce(PyObject *self, PyObject *Py_UNUSED(ignored))
{
    return PyObject_GetAttrString(self, "__qualname__");
}

static PyMethodDef TapeOp_methods[] = {
    {"__reduce__", TapeOp_reduce, METH_NOARGS, "Pickled by its qualified name, as a function."},
    {NULL, NULL, 0, NULL},
};

static PyObject *TapeOp_repr(PyObject *o)
{
    return PyUnicode_FromFormat("<tape op of %R>", TAPE_OP(o)->op);
}

static PyGetSetDef TapeOp_getset[] = {
    {"__dict__", PyObject_GenericGetDict, PyObject_GenericSetDict, NULL, NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyMemberDef TapeOp_members[] = {
    {"raw", T_OBJECT, offsetof(tape_op, op), READONLY, "The op, off the tape."},
    {"__dictoffset__", T_PYSSIZET, offsetof(tape_op, dict), READONLY, NULL},
    {"__weaklistoffset__", T_PYSSIZET, offsetof(tape_op, weakreflist), READONLY, NULL},
    {"__vectorcalloffset__", T_PYSSIZET, offsetof(tape_op, vectorcall), READONLY, NULL},
    {NULL, 0, 0, 0, NULL},
};

PyDoc_STRVAR(TapeOp_doc,
"TapeOp(op, record, tensor_type, explain=None)\n--\n\n"
"op, put on the tape by record(*args, **kwargs) when an argument is a tensor_type or a Parameter\n"
"that requires grad (in lists and tuples too); otherwise op is called as it was. An AttributeError\n"
"from op is passed to explain(error, args, kwargs), which may answer the exception to raise instead.\n"
"Made by ampc.autograd.differentiable.");

static PyType_Slot TapeOp_slots[] = {
    {Py_tp_new, TapeOp_new},
    {Py_tp_dealloc, TapeOp_dealloc},
    {Py_tp_traverse, TapeOp_traverse},
    {Py_tp_clear, TapeOp_clear},
    {Py_tp_call, PyVectorcall_Call},
    {Py_tp_descr_get, ampc_bind_as_method},
    {Py_tp_repr, TapeOp_repr},
    {Py_tp_getset, TapeOp_getset},
    {Py_tp_methods, TapeOp_methods},
    {Py_tp_members, TapeOp_members},
    {Py_tp_doc, (void *)TapeOp_doc},
    {0, NULL},
};

static PyType_Spec TapeOp_spec = {
    .name = "ampc.TapeOp",
    .basicsize = sizeof(tape_op),
    .flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_HAVE_GC | Py_TPFLAGS_HAVE_VECTORCALL,
    .slots = TapeOp_slots,
};

/* _needs_grad(args, kwargs, Tensor): the same question of a tuple of
 * arguments and a dict (or None) of keywords. */
static PyObject *mod_needs_grad(PyObject *module, PyObject *const *args, Py_ssize_t nargs)
{
    if (nargs != 3 || !PyTuple_Check(args[0]) || (args[1] != Py_None && !PyDict_Check(args[1])) ||
        !PyType_Check(args[2])) {
        PyErr_SetString(PyExc_TypeError, "_needs_grad(args, kwargs, tensor_type): a tuple, a dict or None, a type");
        return NULL;
    }
    ampc_state *st = ampc_state_of(module);
    PyTypeObject *tensor = (PyTypeObject *)args[2];
    int found = needs_grad(st, args[0], tensor);
    Py_ssize_t pos = 0;
    PyObject *key, *value;
    while (found == 0 && args[1] != Py_None && PyDict_Next(args[1], &pos, &key, &value))
        found = needs_grad(st, value, tensor);
    if (found < 0)
        return NULL;
    return PyBool_FromLong(found);
}

PyMethodDef ampc_tape_op_methods[] = {
    {"_needs_grad", (PyCFunction)(void (*)(void))mod_needs_grad, METH_FASTCALL,
     "_needs_grad(args, kwargs, Tensor): whether the arguments hold a Tensor or a Parameter that requires grad."},
    {NULL, NULL, 0, NULL},
};

int ampc_tape_op_type_init(PyObject *module)
{
    PyTypeObject *type = (PyTypeObject *)PyType_FromModuleAndSpec(module, &TapeOp_spec, NULL);
    if (type == NULL)
        return -1;
    const int rc = PyModule_AddType(module, type);
    Py_DECREF(type);
    return rc;
}
