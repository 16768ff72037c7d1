/*
 * module.c: the ampc._C extension module: state, initialisation, and the
 * small module-level functions (from_dlpack, as_dtype, threads, CPU
 * features). Multi-phase initialisation with module state, as CPython's own
 * modules do; m_free calls clear, so exec may fail half-way and simply
 * return -1.
 */
#define AMPC_IMPORTS_NUMPY
#include "ampc.h"
#include "op_args.h"
#include "autocast.h"


/* ------------------------------------------------------------------------ */
/* Module-level functions                                                    */
/* ------------------------------------------------------------------------ */

static PyObject *mod_from_dlpack(PyObject *module, PyObject *x)
{
    ampc_state *st = ampc_state_of(module);
    if (ampc_is_array(st, x))
        return Py_NewRef(x);
    if (PyArray_Check(x))
        return ampc_array_from_ndarray(st, (PyArrayObject *)x);
    if (!PyCapsule_CheckExact(x) && !PyObject_HasAttrString(x, "__dlpack__")) {
        PyErr_Format(PyExc_TypeError, "from_dlpack: %.200s has no __dlpack__ method",
                     Py_TYPE(x)->tp_name);
        return NULL;
    }
    return ampc_dlpack_import(st, x, "from_dlpack: x", AMPC_FOR_READING);
}

static PyObject *mod_as_dtype(PyObject *module, PyObject *obj)
{
    ampc_state *st = ampc_state_of(module);
    ampc_dtype d;
    if (ampc_dtype_parse(st, obj, "as_dtype", &d) < 0)
        return NULL;
    return Py_NewRef((PyObject *)st->descr[d]);
}

static PyObject *mod_get_num_threads(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    return PyLong_FromLong(ampc_cpu_backend.get_num_threads());
}

static PyObject *mod_set_num_threads(PyObject *Py_UNUSED(module), PyObject *arg)
{
    const long n = PyLong_AsLong(arg);
    if (n == -1 && PyErr_Occurred())
        return NULL;
    if (n < 1) {
        PyErr_Format(PyExc_ValueError, "set_num_threads: expected a positive number, got %ld", n);
        return NULL;
    }
    Py_BEGIN_ALLOW_THREADS  /* waits for a running job and joins the workers */
    (void)ampc_cpu_backend.set_num_threads(n > 1024 ? 1024 : (int)n);  /* in range: cannot fail */
    Py_END_ALLOW_THREADS
    Py_RETURN_NONE;
}

static PyObject *mod_cpu_features(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    ampc_feature features[32];
    const int n = ampc_cpu_backend.features(features, 32);
    PyObject *d = PyDict_New();
    for (int i = 0; d != NULL && i < n; i++) {
        if (PyDict_SetItemString(d, features[i].name, features[i].present ? Py_True : Py_False) < 0)
            Py_CLEAR(d);
    }
    return d;
}

static PyObject *mod_cpu_isas(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    PyObject *list = PyList_New(0);
    const ampc_backend *cpu = &ampc_cpu_backend;
    for (int isa = 0; list != NULL && cpu->isa_name(isa) != NULL; isa++) {
        if (!cpu->isa_supported(isa))
            continue;
        PyObject *name = PyUnicode_FromString(cpu->isa_name(isa));
        if (name == NULL || PyList_Append(list, name) < 0)
            Py_CLEAR(list);
        Py_XDECREF(name);
    }
    return list;
}

static PyObject *mod_cpu_isa(PyObject *Py_UNUSED(module), PyObject *Py_UNUSED(ignored))
{
    return PyUnicode_FromString(ampc_cpu_backend.isa_name(ampc_cpu_backend.isa_active()));
}

static int set_isa_by_name(const char *name)
{
    const int status = ampc_cpu_backend.set_isa(name);
    if (status == AMPC_ERR_INVALID) {
        PyErr_Format(PyExc_ValueError, "unknown instruction set '%s' (expected portable, avx2, "
                     "avx512 or avx512bf16)", name);
        return -1;
    }
    if (status != AMPC_OK) {
        PyErr_Format(PyExc_ValueError, "this CPU does not support %s", name);
        return -1;
    }
    return 0;
}

static PyObject *mod_set_cpu_isa(PyObject *Py_UNUSED(module), PyObject *arg)
{
    const char *name = PyUnicode_AsUTF8(arg);
    if (name == NULL || set_isa_by_name(name) < 0)
        return NULL;
    Py_RETURN_NONE;
}

PyDoc_STRVAR(mod_from_dlpack_doc,
"from_dlpack(x, /)\n--\n\n"
"An ampc.Array sharing x's memory: x may be any DLPack producer or capsule, or a NumPy array\n"
"(bfloat16 included, which NumPy's own DLPack export refuses).");

PyDoc_STRVAR(mod_as_dtype_doc,
"as_dtype(dtype, /)\n--\n\n"
"The NumPy dtype for a NumPy dtype or type, a name ('float16', 'half', 'bf16', ...), or a torch dtype.");

static PyMethodDef module_methods[] = {
    {"from_dlpack", mod_from_dlpack, METH_O, mod_from_dlpack_doc},
    {"as_dtype", mod_as_dtype, METH_O, mod_as_dtype_doc},
    {"_dtypes", ampc_dtypes_info, METH_NOARGS,
     "Each dtype ampc knows, by number: (name, kind, size, DLPack code, DLPack bits, NumPy dtype)."},
    {"get_num_threads", mod_get_num_threads, METH_NOARGS,
     "get_num_threads()\n--\n\nThreads ampc's CPU kernels use."},
    {"set_num_threads", mod_set_num_threads, METH_O,
     "set_num_threads(n, /)\n--\n\nSet the threads ampc's CPU kernels use."},
    {"_cpu_features", mod_cpu_features, METH_NOARGS, "The CPU's SIMD features."},
    {"_cpu_isas", mod_cpu_isas, METH_NOARGS, "Instruction sets the casts can use here."},
    {"_cpu_isa", mod_cpu_isa, METH_NOARGS, "The instruction set the casts use now."},
    {"_set_cpu_isa", mod_set_cpu_isa, METH_O, "Force an instruction set (for tests)."},
    {NULL, NULL, 0, NULL},
};

/* ------------------------------------------------------------------------ */
/* State and initialisation                                                  */
/* ------------------------------------------------------------------------ */

static int module_traverse(PyObject *module, visitproc visit, void *arg)
{
    ampc_state *st = ampc_state_of(module);
    Py_VISIT(st->array_type);
    for (int d = 0; d < AMPC_NUM_DTYPES; d++)
        Py_VISIT(st->descr[d]);
    Py_VISIT(st->converters);
    Py_VISIT(st->exchange_apis);
    Py_VISIT(st->converter_for);
    Py_VISIT(st->cuda_error);
    Py_VISIT(st->argument_error);
    Py_VISIT(st->state_dict_error);
    Py_VISIT(st->scaler_type);
    Py_VISIT(st->oom_error);
    Py_VISIT(st->cuda_module);
    Py_VISIT(st->cuda_load_error);
    Py_VISIT(st->parameter_type);
    Py_VISIT(st->autocast_type);
    Py_VISIT(st->autocast_op_type);
    Py_VISIT(st->op_policy_type);
    Py_VISIT(st->autocast_registry);
    Py_VISIT(st->cast_cache);
    Py_VISIT(st->array_like_types);
    Py_VISIT(st->float32_for);
    Py_VISIT(st->interop);
    Py_VISIT(st->np_matmul);
    Py_VISIT(st->np_errstate);
    return 0;
}

static int module_clear(PyObject *module)
{
    ampc_state *st = ampc_state_of(module);
    Py_CLEAR(st->array_type);
    for (int d = 0; d < AMPC_NUM_DTYPES; d++)
        Py_CLEAR(st->descr[d]);
    Py_CLEAR(st->converters);
    Py_CLEAR(st->exchange_apis);
    Py_CLEAR(st->converter_for);
    Py_CLEAR(st->cuda_error);
    Py_CLEAR(st->argument_error);
    Py_CLEAR(st->state_dict_error);
    Py_CLEAR(st->scaler_type);
    Py_CLEAR(st->oom_error);
    Py_CLEAR(st->cuda_module);
    Py_CLEAR(st->cuda_load_error);
    Py_CLEAR(st->parameter_type);
    Py_CLEAR(st->autocast_type);
    Py_CLEAR(st->autocast_op_type);
    Py_CLEAR(st->op_policy_type);
    Py_CLEAR(st->autocast_registry);
    Py_CLEAR(st->cast_cache);
    Py_CLEAR(st->array_like_types);
    Py_CLEAR(st->float32_for);
    Py_CLEAR(st->interop);
    Py_CLEAR(st->np_matmul);
    Py_CLEAR(st->np_errstate);
    /* The table lives in ampc._cuda's shared object, which stays loaded. */
    st->cuda = NULL;
    return 0;
}

static void module_free(void *module) { module_clear((PyObject *)module); }

static int module_exec(PyObject *module)
{
    ampc_state *st = ampc_state_of(module);
    st->cuda_device_count = -1;
    st->cuda_bf16_supported = -1;
    if (PyArray_ImportNumPyAPI() < 0)
        return -1;
    if (ampc_dtype_init(st) < 0 || ampc_array_type_init(module, st) < 0)
        return -1;
    st->converters = PyDict_New();
    st->exchange_apis = PyDict_New();
    if (st->converters == NULL || st->exchange_apis == NULL)
        return -1;
    st->cuda_error = PyErr_NewExceptionWithDoc(
        "ampc.CudaError", "A CUDA, cuBLAS or cuDNN call failed.", PyExc_RuntimeError, NULL);
    if (st->cuda_error == NULL || PyModule_AddObjectRef(module, "CudaError", st->cuda_error) < 0)
        return -1;
    /* Both a RuntimeError (as torch.cuda.OutOfMemoryError) and a MemoryError. */
    PyObject *bases = PyTuple_Pack(2, PyExc_RuntimeError, PyExc_MemoryError);
    if (bases == NULL)
        return -1;
    st->oom_error = PyErr_NewExceptionWithDoc(
        "ampc.OutOfMemoryError", "ampc could not allocate GPU memory.", bases, NULL);
    Py_DECREF(bases);
    if (st->oom_error == NULL || PyModule_AddObjectRef(module, "OutOfMemoryError", st->oom_error) < 0)
        return -1;
    /* Where torch asserts on an argument: catchable as either, and unlike an
     * assert it survives python -O. */
    bases = PyTuple_Pack(2, PyExc_ValueError, PyExc_AssertionError);
    if (bases == NULL)
        return -1;
    st->argument_error = PyErr_NewExceptionWithDoc(
        "ampc.ArgumentError", "A bad argument where PyTorch asserts: both a ValueError and an AssertionError.",
        bases, NULL);
    Py_DECREF(bases);
    if (st->argument_error == NULL || PyModule_AddObjectRef(module, "ArgumentError", st->argument_error) < 0)
        return -1;
    /* A state dict without a required entry: torch's KeyError, and the ValueError that a bad
     * payload (outside input) gives everywhere else in ampc. */
    bases = PyTuple_Pack(2, PyExc_KeyError, PyExc_ValueError);
    if (bases == NULL)
        return -1;
    st->state_dict_error = PyErr_NewExceptionWithDoc(
        "ampc.StateDictError", "A state dict without a required entry: both a KeyError (as torch's) and a "
        "ValueError.", bases, NULL);
    Py_DECREF(bases);
    if (st->state_dict_error == NULL || PyModule_AddObjectRef(module, "StateDictError", st->state_dict_error) < 0)
        return -1;
    if (ampc_scaler_type_init(module, st) < 0 || ampc_parameter_type_init(module, st) < 0 ||
        ampc_autocast_state_init(module, st) < 0 || ampc_autocast_dispatch_init(module, st) < 0 ||
        ampc_tape_op_type_init(module) < 0)
        return -1;
    if (PyModule_AddFunctions(module, module_methods) < 0 ||
        PyModule_AddFunctions(module, ampc_parameter_methods) < 0 ||
        PyModule_AddFunctions(module, ampc_tape_op_methods) < 0 ||
        PyModule_AddFunctions(module, ampc_autocast_state_methods) < 0 ||
        PyModule_AddFunctions(module, ampc_autocast_dispatch_methods) < 0 ||
        PyModule_AddFunctions(module, ampc_autocast_cache_methods) < 0 ||
        PyModule_AddFunctions(module, ampc_copy_methods) < 0 ||
        PyModule_AddFunctions(module, ampc_optim_methods) < 0 ||
        PyModule_AddFunctions(module, ampc_ops_methods) < 0 ||
        PyModule_AddFunctions(module, ampc_gemm_methods) < 0 ||
        PyModule_AddFunctions(module, ampc_spatial_methods) < 0 ||
        PyModule_AddFunctions(module, ampc_embedding_methods) < 0 ||
        PyModule_AddFunctions(module, ampc_attention_methods) < 0 ||
        PyModule_AddFunctions(module, ampc_cuda_methods) < 0)
        return -1;
    for (int d = 0; d < AMPC_NUM_DTYPES; d++)
        if (AMPC_DTYPE_IS_FLOAT(d) && PyModule_AddObjectRef(module, ampc_dtype_names[d], (PyObject *)st->descr[d]) < 0)
            return -1;
    /* AMPC_CPU_ISA=portable|avx2|avx512|avx512bf16 forces one table, to test
     * or to compare a whole program on each. */
    const char *isa = getenv("AMPC_CPU_ISA");
    if (isa != NULL && *isa != '\0' && set_isa_by_name(isa) < 0)
        return -1;
    return 0;
}

static PyModuleDef_Slot module_slots[] = {
    {Py_mod_exec, module_exec},
#if PY_VERSION_HEX >= 0x030C0000
    /* NumPy and the CUDA runtime are process-wide: one interpreter only. */
    {Py_mod_multiple_interpreters, Py_MOD_MULTIPLE_INTERPRETERS_NOT_SUPPORTED},
#endif
#if PY_VERSION_HEX >= 0x030D0000
    /* Not free-threaded: the module's state, the weight-cast cache, the
     * scalers' owner counts and the objects the ops build assume the GIL. On
     * a free-threaded build CPython turns the GIL back on at import (with a
     * warning that says so). */
    {Py_mod_gil, Py_MOD_GIL_USED},
#endif
    {0, NULL},
};

PyModuleDef ampc_module_def = {
    PyModuleDef_HEAD_INIT,
    .m_name = "ampc._C",
    .m_doc = "ampc's C core: arrays, dtypes, casts, and the bridge to ampc._cuda.",
    .m_size = sizeof(ampc_state),
    .m_methods = NULL,
    .m_slots = module_slots,
    .m_traverse = module_traverse,
    .m_clear = module_clear,
    .m_free = module_free,
};

PyMODINIT_FUNC PyInit__C(void) { return PyModuleDef_Init(&ampc_module_def); }
