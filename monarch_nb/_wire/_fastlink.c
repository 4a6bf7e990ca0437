/* The Unix link's per-message work in C (see _unix_link.py for the link itself).
 *
 * send: one message (a frame count, each frame's length, the frames) in one
 * non-blocking sendmsg straight from the frames' buffers; how much the kernel
 * took, the caller queues the rest. send_many: a batch of messages held for
 * one worker, in one sendmsg the same way. parse: the whole messages of small frames
 * a read buffer holds, as lists of bytes, stopping at the first that is not
 * whole, has a large frame, or is malformed (the Python parser takes it from
 * there, with the same rules); recv_parse: a read of the socket, then parse.
 * In Python each cost about as much as the rest of a no-op call's handling
 * on a 1,024-rank mesh, where a process receives and sends a dozen messages
 * per gather. */

#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <errno.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "_link_send.h"

#define MAX_SEND_FRAMES 16 /* more go through Python */

static uint64_t read_u64(const unsigned char *p) {
    uint64_t v;
    memcpy(&v, p, 8); /* little-endian hosts only (Linux x86-64, aarch64) */
    return v;
}

static uint32_t read_u32(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* One message into a sendmsg's arrays: its frame count and each frame's length
 * in `header`, then the header and each non-empty frame as iovecs from
 * iov[*parts], each frame's buffer view in views[*got]; the bytes added to
 * *whole. -1 where a frame is not a contiguous buffer or `frames` lost some
 * meanwhile (an exporter may run Python): the views taken so far are counted
 * in *got, for the caller to release. `frames` and each frame are held while
 * their exporters run. */
static int take_message(PyObject *frames, Py_ssize_t count, unsigned char *header,
                        Py_buffer *views, Py_ssize_t *got, struct iovec *iov, int *parts,
                        Py_ssize_t *whole) {
    uint32_t n32 = (uint32_t)count;
    memcpy(header, &n32, 4);
    iov[*parts].iov_base = header;
    iov[*parts].iov_len = 4 + 8 * (size_t)count;
    *whole += (Py_ssize_t)iov[*parts].iov_len;
    (*parts)++;
    int ok = 0;
    Py_INCREF(frames);
    for (Py_ssize_t i = 0; i < count; i++) {
        PyObject *frame = i < PyList_GET_SIZE(frames) ? PyList_GET_ITEM(frames, i) : NULL;
        int taken = -1;
        if (frame != NULL) {
            Py_INCREF(frame);
            taken = PyObject_GetBuffer(frame, &views[*got], PyBUF_SIMPLE);
            Py_DECREF(frame);
        }
        if (taken != 0) {
            PyErr_Clear();
            ok = -1;
            break;
        }
        Py_buffer *view = &views[*got];
        uint64_t len = (uint64_t)view->len;
        memcpy(header + 4 + 8 * i, &len, 8);
        *whole += view->len;
        if (view->len > 0) {
            iov[*parts].iov_base = view->buf;
            iov[*parts].iov_len = (size_t)view->len;
            (*parts)++;
        }
        (*got)++;
    }
    Py_DECREF(frames);
    return ok;
}

static void release_views(Py_buffer *views, Py_ssize_t got) {
    for (Py_ssize_t i = 0; i < got; i++)
        PyBuffer_Release(&views[i]);
}

/* send(fd, frames) -> the bytes of the message the kernel did not take (0: all
 * sent), -errno on an error, or None where the frames are not for this path
 * (too many, not contiguous buffers): the caller sends them its own way. */
static PyObject *link_send(PyObject *self, PyObject *args) {
    int fd;
    PyObject *frames;
    if (!PyArg_ParseTuple(args, "iO!", &fd, &PyList_Type, &frames))
        return NULL;
    Py_ssize_t count = PyList_GET_SIZE(frames);
    if (count < 1 || count > MAX_SEND_FRAMES)
        Py_RETURN_NONE;
    unsigned char header[4 + 8 * MAX_SEND_FRAMES];
    Py_buffer views[MAX_SEND_FRAMES];
    struct iovec iov[MAX_SEND_FRAMES + 1];
    Py_ssize_t got = 0, whole = 0;
    int parts = 0;
    if (take_message(frames, count, header, views, &got, iov, &parts, &whole) != 0) {
        release_views(views, got);
        Py_RETURN_NONE;
    }
    struct msghdr msg = {0};
    msg.msg_iov = iov;
    msg.msg_iovlen = (size_t)parts;
    Py_ssize_t left = send_message(fd, &msg, whole);
    release_views(views, got);
    return PyLong_FromSsize_t(left);
}

#define MAX_SEND_IOV 1024 /* Linux's UIO_MAXIOV: buffers one sendmsg takes */

/* send_many(fd, messages) -> as send, for several messages in one sendmsg: the
 * bytes of them all the kernel did not take (0: all sent), -errno, or None
 * where they are not for this path (a message of no frames or more than
 * MAX_SEND_FRAMES, more buffers than one sendmsg takes, a frame that is not a
 * contiguous buffer). What a caller that holds a batch of small messages for
 * one worker writes; in Python, each message's header and each part cost more
 * than the write. */
static PyObject *link_send_many(PyObject *self, PyObject *args) {
    int fd;
    PyObject *messages;
    if (!PyArg_ParseTuple(args, "iO!", &fd, &PyList_Type, &messages))
        return NULL;
    Py_ssize_t n = PyList_GET_SIZE(messages), frames_total = 0;
    for (Py_ssize_t m = 0; m < n; m++) {
        PyObject *frames = PyList_GET_ITEM(messages, m);
        if (!PyList_Check(frames))
            Py_RETURN_NONE;
        Py_ssize_t count = PyList_GET_SIZE(frames);
        if (count < 1 || count > MAX_SEND_FRAMES)
            Py_RETURN_NONE;
        frames_total += count;
    }
    if (n == 0 || n + frames_total > MAX_SEND_IOV)
        Py_RETURN_NONE;
    Py_buffer *views = PyMem_Malloc(sizeof(Py_buffer) * (size_t)frames_total);
    struct iovec *iov = PyMem_Malloc(sizeof(struct iovec) * (size_t)(n + frames_total));
    unsigned char *headers = PyMem_Malloc((size_t)(4 * n + 8 * frames_total));
    if (views == NULL || iov == NULL || headers == NULL) { /* Python's path then */
        PyMem_Free(views);
        PyMem_Free(iov);
        PyMem_Free(headers);
        Py_RETURN_NONE;
    }
    Py_ssize_t got = 0, whole = 0;
    int parts = 0, ok = 1;
    unsigned char *header = headers;
    for (Py_ssize_t m = 0; m < n && ok; m++) {
        /* Checked again: a buffer's exporter may run Python that changes the lists
         * after the first pass, and the arrays are sized by it. */
        PyObject *frames = m < PyList_GET_SIZE(messages) ? PyList_GET_ITEM(messages, m) : NULL;
        Py_ssize_t count = frames != NULL && PyList_Check(frames) ? PyList_GET_SIZE(frames) : 0;
        if (count < 1 || count > MAX_SEND_FRAMES || got + count > frames_total) {
            ok = 0;
            break;
        }
        if (take_message(frames, count, header, views, &got, iov, &parts, &whole) != 0)
            ok = 0;
        header += 4 + 8 * count;
    }
    PyObject *result = NULL;
    if (ok) {
        struct msghdr msg = {0};
        msg.msg_iov = iov;
        msg.msg_iovlen = (size_t)parts;
        result = PyLong_FromSsize_t(send_message(fd, &msg, whole));
    } else {
        Py_INCREF(Py_None);
        result = Py_None;
    }
    release_views(views, got);
    PyMem_Free(views);
    PyMem_Free(iov);
    PyMem_Free(headers);
    return result;
}

/* Append to `messages` the whole messages of small frames in buf[*start:end]
 * (see parse below), advancing *start past them; -1 with an exception set. */
static int parse_into(PyObject *messages, const unsigned char *buf, Py_ssize_t *start_at,
                      Py_ssize_t end, Py_ssize_t max_messages, Py_ssize_t small,
                      Py_ssize_t max_frames, PyObject *first) {
    Py_ssize_t start = *start_at;
    Py_ssize_t skip = first == Py_None ? 0 : 1;
    Py_ssize_t taken = 0;
    while (taken < max_messages) {
        Py_ssize_t left = end - start;
        if (left < 4)
            break;
        uint32_t count = read_u32(buf + start);
        if (count == 0 || (Py_ssize_t)count > max_frames || (Py_ssize_t)count * 8 + 4 > left)
            break;
        const unsigned char *lengths = buf + start + 4;
        Py_ssize_t need = 4 + 8 * (Py_ssize_t)count;
        int ok = 1;
        for (uint32_t i = 0; i < count; i++) {
            uint64_t len = read_u64(lengths + 8 * i);
            if (len >= (uint64_t)small) {
                ok = 0;
                break;
            }
            need += (Py_ssize_t)len;
        }
        if (!ok || need > left)
            break;
        PyObject *message = PyList_New((Py_ssize_t)count + skip);
        if (message == NULL)
            return -1;
        if (skip) {
            Py_INCREF(first);
            PyList_SET_ITEM(message, 0, first);
        }
        Py_ssize_t at = start + 4 + 8 * (Py_ssize_t)count;
        for (uint32_t i = 0; i < count; i++) {
            Py_ssize_t len = (Py_ssize_t)read_u64(lengths + 8 * i);
            PyObject *frame = PyBytes_FromStringAndSize((const char *)buf + at, len);
            if (frame == NULL) {
                Py_DECREF(message);
                return -1;
            }
            PyList_SET_ITEM(message, (Py_ssize_t)i + skip, frame);
            at += len;
        }
        int appended = PyList_Append(messages, message);
        Py_DECREF(message);
        if (appended != 0)
            return -1;
        start = at;
        *start_at = start;
        taken++;
    }
    return 0;
}

/* parse(buffer, start, end, max_messages, small, max_frames[, first]) -> (messages, start)
 *
 * Whole messages from buffer[start:end] whose frames are all shorter than
 * `small`, each a list of bytes (after `first`, if given and not None: the
 * router's sender identity, so a message is one list, not one made and then
 * copied behind it); the returned start is where the first message it did
 * not take begins. It stops there when that message is not whole yet, has a
 * frame of `small` bytes or more, has no frames or more than `max_frames`, or
 * after `max_messages`. */
static PyObject *link_parse(PyObject *self, PyObject *args) {
    Py_buffer view;
    Py_ssize_t start, end, max_messages, small, max_frames;
    PyObject *first = Py_None;
    if (!PyArg_ParseTuple(args, "y*nnnnn|O", &view, &start, &end, &max_messages, &small,
                          &max_frames, &first))
        return NULL;
    if (start < 0 || end > view.len || start > end) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError, "parse: start and end must lie in the buffer");
        return NULL;
    }
    PyObject *messages = PyList_New(0);
    if (messages == NULL || parse_into(messages, (const unsigned char *)view.buf, &start, end,
                                       max_messages, small, max_frames, first) != 0) {
        Py_XDECREF(messages);
        PyBuffer_Release(&view);
        return NULL;
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(Nn)", messages, start);
}

/* recv_parse(fd, buffer, start, end, max_messages, small, max_frames, first)
 *     -> (messages, start, end, got)
 *
 * One non-blocking recv into buffer[end:] (the buffer must have room), then
 * parse() of buffer[start:end + got]: a read's system call and its parse in
 * one step, where they were three interpreted calls and two into C on every
 * message a rank or the controller receives. `got`: the bytes read, 0 when
 * none waited (EAGAIN, or a signal came first), -1 at end of file or on an
 * error (the stream is over, as the Python path decides). */
static PyObject *link_recv_parse(PyObject *self, PyObject *args) {
    int fd;
    Py_buffer view;
    Py_ssize_t start, end, max_messages, small, max_frames;
    PyObject *first;
    if (!PyArg_ParseTuple(args, "iw*nnnnnO", &fd, &view, &start, &end, &max_messages, &small,
                          &max_frames, &first))
        return NULL;
    if (start < 0 || end >= view.len || start > end) {
        PyBuffer_Release(&view);
        PyErr_SetString(PyExc_ValueError,
                        "recv_parse: start and end must lie in the buffer, with room after end");
        return NULL;
    }
    unsigned char *buf = (unsigned char *)view.buf;
    /* Non-blocking and small (a read buffer's room): no GIL release, whose
     * hand-off to a waiting thread costs more than the copy. */
    ssize_t got = recv(fd, buf + end, (size_t)(view.len - end), MSG_DONTWAIT);
    if (got < 0)
        got = (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) ? 0 : -1;
    else if (got == 0)
        got = -1;
    PyObject *messages = PyList_New(0);
    if (messages == NULL) {
        PyBuffer_Release(&view);
        return NULL;
    }
    if (got > 0) {
        end += got;
        if (parse_into(messages, buf, &start, end, max_messages, small, max_frames, first) !=
            0) {
            Py_DECREF(messages);
            PyBuffer_Release(&view);
            return NULL;
        }
    }
    PyBuffer_Release(&view);
    return Py_BuildValue("(Nnnn)", messages, start, end, (Py_ssize_t)got);
}

static PyMethodDef methods[] = {
    {"send", link_send, METH_VARARGS,
     "send(fd, frames) -> bytes left unsent (0: all), -errno, or None (not for C)"},
    {"send_many", link_send_many, METH_VARARGS,
     "send_many(fd, messages) -> bytes left unsent (0: all), -errno, or None (not for C)"},
    {"parse", link_parse, METH_VARARGS,
     "parse(buffer, start, end, max_messages, small, max_frames[, first]) -> (messages, start)"},
    {"recv_parse", link_recv_parse, METH_VARARGS,
     "recv_parse(fd, buffer, start, end, max_messages, small, max_frames, first) -> "
     "(messages, start, end, got)"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_fastlink",
    .m_doc = "The Unix link's per-message work in C.",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__fastlink(void) { return PyModule_Create(&module); }
