/* Two looks at an object about to be pickled, for _serialize.dumps: does it
 * hold a large bytes or bytearray (holds_large_bytes), and is it plain, so
 * that pickle.dumps alone writes it (is_plain, below)?
 *
 * The C pickler writes bytes in-band without asking reducer_override, so
 * _serialize.dumps wraps large ones first (_wrap_large_bytes). Looking for them
 * in Python cost a call with a 1,000-item list about 90 us on each side, more
 * than the rest of its pickling; here the same look is a few microseconds, and
 * the Python wrap runs only when it finds something.
 *
 * The rules are _wrap_large_bytes's: exact bytes/bytearray of at least
 * `threshold` bytes, looked for in exact tuples, lists and dicts (their values)
 * down to `depth` levels. No Python code runs in either look (no __len__, no
 * __eq__), so nothing can change a container while it is read or release the
 * GIL.
 *
 * And one step of loading: copy_buffer makes the bytes or bytearray a large
 * out-of-band frame becomes on arrival (Python forces that copy: a bytes owns
 * its memory), on transparent huge pages where it is large (see below). */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>

/* glibc gives an allocation this large (its mmap threshold never rises above
 * 32 MiB) fresh pages from mmap every time, so filling it took one page fault
 * per 4 KiB: 16,384 for 64 MiB, about as long again as the copy itself. Asked
 * for huge pages first, the same fill takes one fault per 2 MiB. Smaller
 * buffers come from the heap, whose pages stay resident and are reused. */
#define HUGE_COPY_MIN ((Py_ssize_t)32 << 20)
#define HUGE_PAGE ((uintptr_t)2 << 20)
/* Copies at least this large run without the GIL (the wire thread goes on). */
#define UNLOCKED_COPY_MIN ((Py_ssize_t)1 << 20)

static int holds_large_bytes(PyObject *obj, int depth, Py_ssize_t threshold) {
    PyTypeObject *kind = Py_TYPE(obj);
    if (kind == &PyBytes_Type)
        return PyBytes_GET_SIZE(obj) >= threshold;
    if (kind == &PyByteArray_Type)
        return PyByteArray_GET_SIZE(obj) >= threshold;
    if (depth <= 0)
        return 0;
    if (kind == &PyTuple_Type) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(obj); i++) {
            if (holds_large_bytes(PyTuple_GET_ITEM(obj, i), depth - 1, threshold))
                return 1;
        }
    } else if (kind == &PyList_Type) {
        /* The size is read again each turn: nothing here can shrink the list,
         * but a read of the length once would be the first thing to break. */
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(obj); i++) {
            if (holds_large_bytes(PyList_GET_ITEM(obj, i), depth - 1, threshold))
                return 1;
        }
    } else if (kind == &PyDict_Type) {
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(obj, &pos, &key, &value)) {
            if (holds_large_bytes(value, depth - 1, threshold))
                return 1;
        }
    }
    return 0;
}

/* A depth argument, clamped to [0, most]: a bound on the C recursion. */
static int read_depth(PyObject *arg, int most, int *depth) {
    long value = PyLong_AsLong(arg);
    if (value == -1 && PyErr_Occurred())
        return -1;
    *depth = value > most ? most : value < 0 ? 0 : (int)value;
    return 0;
}

static PyObject *holds_large_bytes_py(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 3) {
        PyErr_SetString(PyExc_TypeError, "holds_large_bytes(obj, depth, threshold)");
        return NULL;
    }
    int depth; /* _serialize asks for 3; a bound on the recursion all the same */
    if (read_depth(args[1], 8, &depth) < 0)
        return NULL;
    Py_ssize_t threshold = PyLong_AsSsize_t(args[2]);
    if (threshold == -1 && PyErr_Occurred())
        return NULL;
    return PyBool_FromLong(holds_large_bytes(args[0], depth, threshold));
}

/* Is obj made only of what the C pickler writes by itself, without asking
 * reducer_override or anything else in Python: None, True, False, exact int,
 * float, str and bytes, in exact tuples, lists and dicts (keys too), down to
 * `depth` levels? Such a value pickles to the same bytes with pickle.dumps as
 * with our Pickler subclass, which costs about 4 us more to set up on every
 * call (a no-op call's `((), {})` paid that on the caller). */
static int is_plain(PyObject *obj, int depth) {
    if (obj == Py_None || obj == Py_True || obj == Py_False)
        return 1;
    PyTypeObject *kind = Py_TYPE(obj);
    if (kind == &PyLong_Type || kind == &PyFloat_Type || kind == &PyUnicode_Type ||
        kind == &PyBytes_Type)
        return 1;
    if (depth <= 0)
        return 0;
    if (kind == &PyTuple_Type) {
        for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(obj); i++) {
            if (!is_plain(PyTuple_GET_ITEM(obj, i), depth - 1))
                return 0;
        }
        return 1;
    }
    if (kind == &PyList_Type) {
        for (Py_ssize_t i = 0; i < PyList_GET_SIZE(obj); i++) {
            if (!is_plain(PyList_GET_ITEM(obj, i), depth - 1))
                return 0;
        }
        return 1;
    }
    if (kind == &PyDict_Type) {
        Py_ssize_t pos = 0;
        PyObject *key, *value;
        while (PyDict_Next(obj, &pos, &key, &value)) {
            if (!is_plain(key, depth - 1) || !is_plain(value, depth - 1))
                return 0;
        }
        return 1;
    }
    return 0;
}

static PyObject *is_plain_py(PyObject *self, PyObject *const *args, Py_ssize_t n) {
    if (n != 2) {
        PyErr_SetString(PyExc_TypeError, "is_plain(obj, depth)");
        return NULL;
    }
    int depth;
    if (read_depth(args[1], 16, &depth) < 0)
        return NULL;
    return PyBool_FromLong(is_plain(args[0], depth));
}

static void advise_huge_pages(char *start, Py_ssize_t size) {
#ifdef MADV_HUGEPAGE
    uintptr_t from = ((uintptr_t)start + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    uintptr_t to = ((uintptr_t)start + (uintptr_t)size) & ~(HUGE_PAGE - 1);
    if (to > from) (void)madvise((void *)from, to - from, MADV_HUGEPAGE); /* advice only */
#else
    (void)start;
    (void)size;
#endif
}

static PyObject *copy_buffer_py(PyObject *self, PyObject *const *args, Py_ssize_t nargs) {
    (void)self;
    if (nargs != 2) {
        PyErr_SetString(PyExc_TypeError, "copy_buffer(buffer, as_bytearray) takes 2 arguments");
        return NULL;
    }
    int as_bytearray = PyObject_IsTrue(args[1]);
    if (as_bytearray < 0) return NULL;
    Py_buffer view;
    if (PyObject_GetBuffer(args[0], &view, PyBUF_SIMPLE) != 0) return NULL;
    PyObject *out = as_bytearray ? PyByteArray_FromStringAndSize(NULL, view.len)
                                 : PyBytes_FromStringAndSize(NULL, view.len);
    if (out != NULL && view.len > 0) {
        char *to = as_bytearray ? PyByteArray_AS_STRING(out) : PyBytes_AS_STRING(out);
        if (view.len >= HUGE_COPY_MIN) advise_huge_pages(to, view.len);
        if (view.len >= UNLOCKED_COPY_MIN) {
            /* Nobody else sees `out` yet, and `view` keeps the source alive. */
            Py_BEGIN_ALLOW_THREADS
            memcpy(to, view.buf, (size_t)view.len);
            Py_END_ALLOW_THREADS
        } else {
            memcpy(to, view.buf, (size_t)view.len);
        }
    }
    PyBuffer_Release(&view);
    return out;
}

static PyMethodDef methods[] = {
    {"is_plain", (PyCFunction)(void (*)(void))is_plain_py, METH_FASTCALL,
     "is_plain(obj, depth): whether obj is only None, bools, exact ints, floats, str "
     "and bytes in exact tuples, lists and dicts, down to depth levels."},
    {"holds_large_bytes", (PyCFunction)(void (*)(void))holds_large_bytes_py, METH_FASTCALL,
     "holds_large_bytes(obj, depth, threshold): whether obj holds an exact bytes or "
     "bytearray of at least threshold bytes, in exact tuples, lists and dict values "
     "down to depth levels."},
    {"copy_buffer", (PyCFunction)(void (*)(void))copy_buffer_py, METH_FASTCALL,
     "copy_buffer(buffer, as_bytearray): a bytes (or bytearray) copy of a contiguous "
     "buffer; a large one on transparent huge pages, copied without the GIL."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_fastpickle",
    .m_doc = "What monarch_nb._wire._serialize.dumps asks before pickling, and the "
              "copy loads makes of a large bytes, in C.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__fastpickle(void) { return PyModule_Create(&module); }
