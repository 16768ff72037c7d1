/*
 * interop.c: how ampc._C recognises the caller's array library without
 * importing it: by the module its types live in, the rule
 * ampc/_interop.py's library_of follows on the Python side.
 */
#include "ampc.h"

#include <string.h>

int ampc_is_torch_type(PyTypeObject *type, const char *name)
{
    if (name != NULL) {
        /* the type's __name__, as type.__name__ gives it: the last part of a static type's
         * tp_name ("torch.dtype"), a heap type's whole tp_name; checked first, without
         * calling anything, so most types are turned away by a strcmp */
        const char *dot = type->tp_flags & Py_TPFLAGS_HEAPTYPE ? NULL : strrchr(type->tp_name, '.');
        if (strcmp(dot != NULL ? dot + 1 : type->tp_name, name) != 0)
            return 0;
    }
    PyObject *module = PyObject_GetAttrString((PyObject *)type, "__module__");
    if (module == NULL) {
        PyErr_Clear();
        return 0;
    }
    const char *s = PyUnicode_Check(module) ? PyUnicode_AsUTF8(module) : NULL;
    if (s == NULL)
        PyErr_Clear();
    /* torch.dtype is torch's top-level class; torch.cuda.device is not torch.device */
    const int torch = s != NULL && strncmp(s, "torch", 5) == 0 &&
                      (s[5] == '\0' || (name == NULL && s[5] == '.'));
    Py_DECREF(module);
    return torch;
}
