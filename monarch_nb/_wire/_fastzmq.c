/*
 * The wire's per-message socket operations straight on libzmq (see _wire.py).
 *
 * pyzmq costs a few microseconds a frame around each libzmq call (argument
 * parsing, a Frame object, ZMQ_EVENTS looked up as an enum member), and a
 * no-op call crosses it a dozen times. Here, on the libzmq functions pyzmq
 * itself calls (bind(): looked up through pyzmq's compiled backend, already
 * loaded; never a second copy of libzmq), each of the wire's loops is one call:
 *
 * - events(): a socket's ZMQ_EVENTS;
 * - take(): whole messages, under budgets of frames and messages, as Frame
 *   objects (zero-copy: a frame keeps its zmq_msg_t, exported through the
 *   buffer protocol, writable as pyzmq's are);
 * - send_copied(): small frames of one message, copied, without blocking;
 * - send_each_copied(): one small message to each of many peers (a cast);
 * - send_one(): a one-frame message, and ZMQ_EVENTS after it (a reply).
 *
 * Nothing here raises libzmq's errors or waits: where libzmq says no (an
 * error, a full queue), the function returns how far it got and _wire.py does
 * the rest through pyzmq, which blocks, raises the right exception and handles
 * signals exactly as before. Callers check that the socket is open first.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <dlfcn.h>
#include <errno.h>
#include <string.h>

#define ZMQ_EVENTS_OPTION 15
#define ZMQ_POLLIN_EVENT 1
#define ZMQ_DONTWAIT_FLAG 1
#define ZMQ_SNDMORE_FLAG 2

/* zmq_msg_t: 64 opaque bytes, pointer-aligned (zmq.h). */
typedef struct {
    unsigned char opaque[64];
} __attribute__((aligned(sizeof(void *)))) zmq_msg;

static struct {
    int (*getsockopt)(void *, int, void *, size_t *);
    int (*msg_init)(zmq_msg *);
    int (*msg_recv)(zmq_msg *, void *, int);
    void *(*msg_data)(zmq_msg *);
    size_t (*msg_size)(const zmq_msg *);
    int (*msg_more)(const zmq_msg *);
    int (*msg_close)(zmq_msg *);
    int (*send)(void *, const void *, size_t, int);
} zmq;

static int bound = 0;

/* bind(path) -> True if path is a library already loaded here (pyzmq's compiled
   backend) through which libzmq's functions resolve: looked up in it and its
   dependencies, they are the ones pyzmq calls, whether libzmq is a library of
   its own beside it or linked into it. */
static PyObject *bind(PyObject *self, PyObject *arg) {
    const char *path = PyUnicode_AsUTF8(arg);
    if (path == NULL) return NULL;
    if (bound) Py_RETURN_TRUE; /* once: live frames close through the table */
    void *lib = dlopen(path, RTLD_LAZY | RTLD_NOLOAD);
    if (lib == NULL) Py_RETURN_FALSE;
    __typeof__(zmq) found;
    struct {
        const char *name;
        void **slot;
    } table[] = {
        {"zmq_getsockopt", (void **)&found.getsockopt}, {"zmq_msg_init", (void **)&found.msg_init},
        {"zmq_msg_recv", (void **)&found.msg_recv},     {"zmq_msg_data", (void **)&found.msg_data},
        {"zmq_msg_size", (void **)&found.msg_size},     {"zmq_msg_more", (void **)&found.msg_more},
        {"zmq_msg_close", (void **)&found.msg_close},   {"zmq_send", (void **)&found.send},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++) {
        *table[i].slot = dlsym(lib, table[i].name);
        if (*table[i].slot == NULL) Py_RETURN_FALSE; /* the table stays as it was */
    }
    zmq = found;
    bound = 1;
    Py_RETURN_TRUE;
}

static void *handle_of(PyObject *arg) {
    void *handle = PyLong_AsVoidPtr(arg);
    if (handle == NULL && !PyErr_Occurred())
        PyErr_SetString(PyExc_ValueError, "a null socket handle");
    return handle;
}

/* events(handle) -> ZMQ_EVENTS, or -1: ask pyzmq (which raises the error). */
static PyObject *events(PyObject *self, PyObject *arg) {
    void *handle = handle_of(arg);
    if (handle == NULL) return NULL;
    int value = 0;
    size_t size = sizeof value;
    if (!bound || zmq.getsockopt(handle, ZMQ_EVENTS_OPTION, &value, &size) != 0)
        return PyLong_FromLong(-1);
    return PyLong_FromLong(value);
}

/* -- Frame: one received part, zero-copy ------------------------------------------ */

typedef struct {
    PyObject_HEAD zmq_msg msg;
} Frame;

static void frame_dealloc(Frame *self) {
    zmq.msg_close(&self->msg);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static int frame_getbuffer(Frame *self, Py_buffer *view, int flags) {
    return PyBuffer_FillInfo(view, (PyObject *)self, zmq.msg_data(&self->msg),
                             (Py_ssize_t)zmq.msg_size(&self->msg), 0, flags);
}

static Py_ssize_t frame_length(Frame *self) { return (Py_ssize_t)zmq.msg_size(&self->msg); }

static PyObject *frame_bytes(Frame *self, void *closure) {
    return PyBytes_FromStringAndSize(zmq.msg_data(&self->msg), (Py_ssize_t)zmq.msg_size(&self->msg));
}

static PyObject *frame_buffer(Frame *self, void *closure) {
    return PyMemoryView_FromObject((PyObject *)self);
}

static PyBufferProcs frame_as_buffer = {(getbufferproc)frame_getbuffer, NULL};
static PySequenceMethods frame_as_sequence = {.sq_length = (lenfunc)frame_length};
static PyGetSetDef frame_getset[] = {
    {"bytes", (getter)frame_bytes, NULL, "a copy of the frame's bytes", NULL},
    {"buffer", (getter)frame_buffer, NULL, "a memoryview of the frame (no copy)", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject FrameType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "monarch_nb._wire._fastzmq.Frame",
    .tp_basicsize = sizeof(Frame),
    .tp_dealloc = (destructor)frame_dealloc,
    .tp_as_sequence = &frame_as_sequence,
    .tp_as_buffer = &frame_as_buffer,
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "A received frame (as zmq.Frame: buffer protocol, .bytes, .buffer, len()).",
    .tp_getset = frame_getset,
};

/* -- take: whole messages under budgets ------------------------------------------- */

enum { DRAINED = 0, BUDGET_SPENT = 1, ASK_PYZMQ = 2 };

/* take(handle, partial, dropping, frames, messages, max_per_message) ->
   (done, partial, dropping, dropped, status): as _wire.Receiver.take, which holds
   partial (a message begun in an earlier take, or None) and dropping (the rest of
   an oversized message is being dropped) between calls. status: DRAINED (the
   socket said nothing waits), BUDGET_SPENT, or ASK_PYZMQ (libzmq refused). */
static PyObject *take(PyObject *self, PyObject *args) {
    PyObject *handle_obj, *partial;
    int dropping;
    Py_ssize_t frames, messages, max_per_message, dropped = 0;
    if (!PyArg_ParseTuple(args, "OOpnnn", &handle_obj, &partial, &dropping, &frames, &messages,
                          &max_per_message))
        return NULL;
    void *handle = handle_of(handle_obj);
    if (handle == NULL) return NULL;
    if (partial != Py_None && !PyList_Check(partial))
        return PyErr_Format(PyExc_TypeError, "partial must be a list or None");
    PyObject *done = PyList_New(0);
    if (done == NULL) return NULL;
    Py_INCREF(partial);
    int status = BUDGET_SPENT;
    /* Whether ZMQ_EVENTS was asked in this take. It is asked before the first
       message: asking makes libzmq process its pending commands (a new pipe, a
       message's arrival), which a receive that finds a message does only every
       so many receives. After a whole message, a receive that finds nothing
       (EAGAIN) ends the take just as well: before it says EAGAIN, libzmq
       processes its commands as ZMQ_EVENTS does, so the fd is re-armed, and a
       message to take costs no system call. */
    int asked = 0;
    while (frames > 0 && PyList_GET_SIZE(done) < messages) {
        if (!bound) {
            status = ASK_PYZMQ;
            break;
        }
        if (partial == Py_None && !asked) {
            asked = 1;
            int value = 0;
            size_t size = sizeof value;
            if (zmq.getsockopt(handle, ZMQ_EVENTS_OPTION, &value, &size) != 0) {
                status = ASK_PYZMQ;
                break;
            }
            if (!(value & ZMQ_POLLIN_EVENT)) {
                status = DRAINED;
                break;
            }
        }
        if (partial == Py_None) {
            Py_DECREF(partial);
            partial = PyList_New(0);
            if (partial == NULL) goto error;
        }
        Frame *frame = PyObject_New(Frame, &FrameType);
        if (frame == NULL) goto error;
        zmq.msg_init(&frame->msg);
        if (zmq.msg_recv(&frame->msg, handle, ZMQ_DONTWAIT_FLAG) < 0) {
            int why = errno;
            Py_DECREF(frame); /* closes the empty message */
            if (why == EINTR) continue;
            if (why == EAGAIN && PyList_GET_SIZE(partial) == 0) {
                status = DRAINED; /* ZMQ_EVENTS said POLLIN, yet nothing came: drained */
                Py_DECREF(partial);
                partial = Py_None;
                Py_INCREF(partial);
                break;
            }
            status = ASK_PYZMQ;
            if (PyList_GET_SIZE(partial) == 0) { /* no message begun: pyzmq asks first */
                Py_DECREF(partial);
                partial = Py_None;
                Py_INCREF(partial);
            }
            break;
        }
        frames--;
        int more = zmq.msg_more(&frame->msg);
        if (dropping) {
            Py_DECREF(frame);
        } else {
            int failed = PyList_Append(partial, (PyObject *)frame);
            Py_DECREF(frame);
            if (failed) goto error;
            if (PyList_GET_SIZE(partial) > max_per_message) { /* keep none of it */
                if (PyList_SetSlice(partial, 0, PyList_GET_SIZE(partial), NULL) < 0) goto error;
                dropping = 1;
            }
        }
        if (more) continue;
        if (dropping) {
            dropping = 0;
            dropped++;
        } else if (PyList_Append(done, partial) < 0) {
            goto error;
        }
        Py_DECREF(partial);
        partial = Py_None;
        Py_INCREF(partial);
    }
    PyObject *result = Py_BuildValue("(NOOni)", done, partial, dropping ? Py_True : Py_False,
                                     dropped, status);
    Py_DECREF(partial);
    return result;
error:
    Py_DECREF(done);
    Py_XDECREF(partial);
    return NULL;
}

/* send_copied(handle, parts) -> how many parts went, copied (the parts of one
   message, SNDMORE on all but the last). 0: libzmq would not take the first
   part now (or at all): pyzmq sends the message, waiting or raising as it
   would have. Once the first part went, the rest go here as pyzmq's blocking
   send sends them (a peer gone mid-message drops it); fewer than all only on a
   lasting error, which pyzmq then raises. */
static PyObject *send_copied(PyObject *self, PyObject *args) {
    PyObject *handle_obj, *parts_obj;
    if (!PyArg_ParseTuple(args, "OO", &handle_obj, &parts_obj)) return NULL;
    void *handle = handle_of(handle_obj);
    if (handle == NULL) return NULL;
    PyObject *parts = PySequence_Fast(parts_obj, "parts must be a sequence");
    if (parts == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(parts), sent = 0;
    PyObject **items = PySequence_Fast_ITEMS(parts);
    while (bound && sent < n) {
        Py_buffer view;
        if (PyObject_GetBuffer(items[sent], &view, PyBUF_SIMPLE) < 0) {
            PyErr_Clear(); /* pyzmq says what is wrong with it */
            break;
        }
        int flags = sent < n - 1 ? ZMQ_SNDMORE_FLAG : 0;
        int rc;
        if (sent == 0) { /* whether the message goes at all: never wait for it */
            do {
                rc = zmq.send(handle, view.buf, (size_t)view.len, flags | ZMQ_DONTWAIT_FLAG);
            } while (rc < 0 && errno == EINTR);
        } else {
            /* The rest of a message libzmq took: never refused for a full queue
               (the high-water mark counts whole messages), and as pyzmq sends it
               (a part that fails drops the message, it never starts a new one);
               without the GIL, in case libzmq waits after all. */
            Py_BEGIN_ALLOW_THREADS
            do {
                rc = zmq.send(handle, view.buf, (size_t)view.len, flags);
            } while (rc < 0 && errno == EINTR);
            Py_END_ALLOW_THREADS
        }
        PyBuffer_Release(&view);
        if (rc < 0) break; /* an error (ETERM, ENOTSOCK...): pyzmq raises it */
        sent++;
    }
    Py_DECREF(parts);
    return PyLong_FromSsize_t(sent);
}

/* send_each_copied(handle, identities, frame) -> n: one message of one small frame
   to each of identities on a ROUTER (a cast), copied, without waiting. n >= 0: the
   first n went whole, the next nothing (pyzmq sends it and the rest); -(n + 1):
   the identity part of message n went, not its frame (pyzmq sends that frame). */
static PyObject *send_each_copied(PyObject *self, PyObject *args) {
    PyObject *handle_obj, *identities_obj, *frame_obj;
    if (!PyArg_ParseTuple(args, "OOO", &handle_obj, &identities_obj, &frame_obj)) return NULL;
    void *handle = handle_of(handle_obj);
    if (handle == NULL) return NULL;
    PyObject *identities = PySequence_Fast(identities_obj, "identities must be a sequence");
    if (identities == NULL) return NULL;
    Py_buffer frame;
    if (PyObject_GetBuffer(frame_obj, &frame, PyBUF_SIMPLE) < 0) {
        Py_DECREF(identities);
        return NULL;
    }
    Py_ssize_t n = PySequence_Fast_GET_SIZE(identities), sent = 0;
    PyObject **items = PySequence_Fast_ITEMS(identities);
    while (bound && sent < n) {
        PyObject *identity = items[sent];
        if (!PyBytes_Check(identity)) break; /* pyzmq says what is wrong with it */
        int rc;
        do {
            rc = zmq.send(handle, PyBytes_AS_STRING(identity), (size_t)PyBytes_GET_SIZE(identity),
                          ZMQ_DONTWAIT_FLAG | ZMQ_SNDMORE_FLAG);
        } while (rc < 0 && errno == EINTR);
        if (rc < 0) break;
        do {
            rc = zmq.send(handle, frame.buf, (size_t)frame.len, ZMQ_DONTWAIT_FLAG);
        } while (rc < 0 && errno == EINTR);
        if (rc < 0) {
            sent = -(sent + 1);
            break;
        }
        sent++;
    }
    PyBuffer_Release(&frame);
    Py_DECREF(identities);
    return PyLong_FromSsize_t(sent);
}

/* send_one(handle, frame) -> the socket's ZMQ_EVENTS after sending the one-frame
   message frame (copied, without waiting); -1: not sent (pyzmq sends it), -2: sent,
   but ask pyzmq for the events. A reply's send and the look that follows it (a send
   can take the notice of input that just came) in one call. */
static PyObject *send_one(PyObject *self, PyObject *args) {
    PyObject *handle_obj;
    Py_buffer frame;
    if (!PyArg_ParseTuple(args, "Oy*", &handle_obj, &frame)) return NULL;
    void *handle = handle_of(handle_obj);
    if (handle == NULL) {
        PyBuffer_Release(&frame);
        return NULL;
    }
    int rc = -1;
    if (bound) {
        do {
            rc = zmq.send(handle, frame.buf, (size_t)frame.len, ZMQ_DONTWAIT_FLAG);
        } while (rc < 0 && errno == EINTR);
    }
    PyBuffer_Release(&frame);
    if (rc < 0) return PyLong_FromLong(-1);
    int value = 0;
    size_t size = sizeof value;
    if (zmq.getsockopt(handle, ZMQ_EVENTS_OPTION, &value, &size) != 0) return PyLong_FromLong(-2);
    return PyLong_FromLong(value);
}

static PyMethodDef methods[] = {
    {"send_each_copied", send_each_copied, METH_VARARGS,
     "send_each_copied(handle, identities, frame) -> how many went whole (see the source)"},
    {"bind", bind, METH_O, "bind(path) -> whether the libzmq loaded at path is used"},
    {"events", events, METH_O, "events(handle) -> ZMQ_EVENTS, or -1: ask pyzmq"},
    {"take", take, METH_VARARGS,
     "take(handle, partial, dropping, frames, messages, max_per_message) -> "
     "(done, partial, dropping, dropped, status)"},
    {"send_one", send_one, METH_VARARGS,
     "send_one(handle, frame) -> ZMQ_EVENTS after sending it; -1: not sent, -2: events unknown"},
    {"send_copied", send_copied, METH_VARARGS,
     "send_copied(handle, parts) -> how many parts were sent (copied, without waiting)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_fastzmq",
    .m_doc = "The wire's per-message socket operations on libzmq (see monarch_nb._wire._signed).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__fastzmq(void) {
    if (PyType_Ready(&FrameType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    Py_INCREF(&FrameType);
    if (PyModule_AddObject(m, "Frame", (PyObject *)&FrameType) < 0 ||
        PyModule_AddIntConstant(m, "DRAINED", DRAINED) < 0 ||
        PyModule_AddIntConstant(m, "BUDGET_SPENT", BUDGET_SPENT) < 0 ||
        PyModule_AddIntConstant(m, "ASK_PYZMQ", ASK_PYZMQ) < 0) {
        Py_DECREF(&FrameType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
