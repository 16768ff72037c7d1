/*
 * Preloaded into the interpreter that .ci/valgrind runs under memcheck: wraps CPython's
 * _PyLong_New so that an int's first digit is always initialised.
 *
 * Why: CPython 3.11's _PyLong_New(0) allocates one digit and leaves it uninitialised, and
 * maybe_small_long() then computes the value of that zero-digit int as size * ob_digit[0] = 0 * garbage.
 * Memcheck cannot know the product is 0, so the small-int pointer it picks is "undefined" to it,
 * and so is every later use of that object: int("0"), int.from_bytes(b""), x & 0, json's 0 ... reach
 * any code, ampc's too (its Py_TYPE and Py_DECREF of a state dict's 0 were reported). With the
 * digit zeroed the interpreter reports nothing of its own here, so the suppressions need not cover
 * the interpreter, whose reports would also hide an uninitialised value that ampc returns to Python.
 * The digit is unused when the int has no digits and is overwritten otherwise: no behaviour changes.
 *
 * Valgrind's function wrapping (valgrind.h) redirects every call, the interpreter's calls within
 * its own library included, which LD_PRELOAD's symbol interposition would not.
 */
#include <Python.h>
#include <valgrind/valgrind.h>

#if PY_VERSION_HEX >= 0x030C0000
#define FIRST_DIGIT(v) ((v)->long_value.ob_digit[0])
#else
#define FIRST_DIGIT(v) ((v)->ob_digit[0])
#endif

#define WRAP(soname)                                                          \
    PyLongObject *I_WRAP_SONAME_FNNAME_ZU(soname, _PyLong_New)(Py_ssize_t size); \
    PyLongObject *I_WRAP_SONAME_FNNAME_ZU(soname, _PyLong_New)(Py_ssize_t size)  \
    {                                                                         \
        OrigFn fn;                                                            \
        PyLongObject *v;                                                      \
        VALGRIND_GET_ORIG_FN(fn);                                             \
        CALL_FN_W_W(v, fn, size);                                             \
        if (v != NULL)                                                        \
            FIRST_DIGIT(v) = 0;                                               \
        return v;                                                             \
    }

WRAP(libpythonZa) /* libpython*: an interpreter linked against its shared library */
WRAP(NONE)        /* the executable itself: an interpreter linked statically */
