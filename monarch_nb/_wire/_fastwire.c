/*
 * The control wire's per-message signing and checking in C (see _wire.py).
 *
 * A no-op call is four small messages' worth of seal and verify; in Python each
 * is a dozen interpreted steps around hashlib (a memoryview per frame, a hash
 * object per digest, an HMAC copy, int conversions), and together they were a
 * fifth to a third of a no-op call's CPU on each side. Here each is one call.
 *
 * Only small content is hashed here (SMALL_HASH_LIMIT bytes): the portable
 * SHA-256 below is several times slower per byte than OpenSSL's, which Python's
 * hashlib uses. Bigger messages get None (or 0 from check()) and take the
 * Python path, which must give the very same digest and signature: the tests
 * compare the two byte for byte.
 *
 * This module holds no state: the HMAC key's precomputed inner and outer hash
 * states travel as a bytes object (key_state()), owned by the Signer.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

#include "_sha256.h"
#include "_link_send.h"

#define SIG_BYTES 32
#define SEQ_BYTES 8
#define FLAGS_BYTES 1
#define SENDER_BYTES 16
#define HEADER_BYTES (SIG_BYTES + SEQ_BYTES + FLAGS_BYTES + SENDER_BYTES)
#define FLAGS_AT (SIG_BYTES + SEQ_BYTES)
#define SENDER_AT (FLAGS_AT + FLAGS_BYTES)
#define META_LEN_BYTES 4
#define UPSTREAM 1
#define BULK_BY_LENGTH 2
#define KNOWN_FLAGS (UPSTREAM | BULK_BY_LENGTH)
#define KEY_BYTES 32
/* Content hashed here at most; more goes to hashlib (see the top). */
#define SMALL_HASH_LIMIT (16 * 1024)

/* check()'s refusals before any hashing, as _wire.Signer.verify counts them (a bad
   signature is a tuple, with the bytes hashed); FALL_BACK: not refused, but too big
   (or not a plain buffer) for this path. */
enum { FALL_BACK = 0, MALFORMED = 1, MISDIRECTED = 2 };

typedef struct {
    sha256_t inner, outer; /* after the key block XOR ipad / opad (RFC 2104) */
} key_state_t;

static void put_le(unsigned char *out, uint64_t value, int n) {
    for (int i = 0; i < n; i++) out[i] = (unsigned char)(value >> (8 * i));
}

static uint64_t get_le(const unsigned char *in, int n) {
    uint64_t value = 0;
    for (int i = n - 1; i >= 0; i--) value = value << 8 | in[i];
    return value;
}

static PyObject *key_state(PyObject *self, PyObject *arg) {
    Py_buffer key;
    if (PyObject_GetBuffer(arg, &key, PyBUF_SIMPLE) < 0) return NULL;
    if (key.len != KEY_BYTES) {
        PyBuffer_Release(&key);
        return PyErr_Format(PyExc_ValueError, "a signing key is %d bytes, got %zd", KEY_BYTES,
                            key.len);
    }
    unsigned char pad[64] = {0};
    key_state_t state;
    memset(&state, 0, sizeof state); /* every byte of it is handed out */
    memcpy(pad, key.buf, KEY_BYTES);
    PyBuffer_Release(&key);
    for (int i = 0; i < 64; i++) pad[i] ^= 0x36;
    sha256_init(&state.inner);
    sha256_update(&state.inner, pad, 64);
    for (int i = 0; i < 64; i++) pad[i] ^= 0x36 ^ 0x5c;
    sha256_init(&state.outer);
    sha256_update(&state.outer, pad, 64);
    return PyBytes_FromStringAndSize((const char *)&state, sizeof state);
}

static int read_state(PyObject *obj, key_state_t *state) {
    if (!PyBytes_Check(obj) || PyBytes_GET_SIZE(obj) != (Py_ssize_t)sizeof *state) {
        PyErr_SetString(PyExc_TypeError, "not a key state from key_state()");
        return -1;
    }
    memcpy(state, PyBytes_AS_STRING(obj), sizeof *state);
    return 0;
}

/* HMAC-SHA256 of header[SIG_BYTES:] + digest under the key: the signature. */
static void sign(const key_state_t *key, const unsigned char *trailer, const unsigned char *digest,
                 unsigned char out[SIG_BYTES]) {
    sha256_t s = key->inner;
    unsigned char inner[SHA256_SIZE];
    sha256_update(&s, trailer, HEADER_BYTES - SIG_BYTES);
    sha256_update(&s, digest, SHA256_SIZE);
    sha256_final(&s, inner);
    s = key->outer;
    sha256_update(&s, inner, SHA256_SIZE);
    sha256_final(&s, out);
}

/* Content digest of body and buffer frames (see _wire._content_digest): 1 done,
   0 too big or not plain buffers (no error set), -1 error set. */
static int content_digest(const unsigned char *body, Py_ssize_t body_len, PyObject **buffers,
                          Py_ssize_t count, int by_length, unsigned char out[SHA256_SIZE],
                          Py_ssize_t *digested) {
    sha256_t s;
    unsigned char len[8];
    Py_ssize_t hashed = body_len;
    if (hashed > SMALL_HASH_LIMIT) return 0;
    sha256_init(&s);
    put_le(len, (uint64_t)body_len, 8);
    sha256_update(&s, len, 8);
    sha256_update(&s, body, (size_t)body_len);
    *digested = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        Py_buffer view;
        if (PyObject_GetBuffer(buffers[i], &view, PyBUF_SIMPLE) < 0) {
            PyErr_Clear();
            return 0;
        }
        put_le(len, (uint64_t)view.len, 8);
        sha256_update(&s, len, 8);
        if (!by_length) {
            hashed += view.len;
            if (hashed > SMALL_HASH_LIMIT) {
                PyBuffer_Release(&view);
                return 0;
            }
            sha256_update(&s, view.buf, (size_t)view.len);
            *digested += view.len;
        }
        PyBuffer_Release(&view);
    }
    sha256_final(&s, out);
    return 1;
}

/* digest(body, buffers, by_length) -> (digest, buffer bytes hashed), or None. */
static PyObject *digest(PyObject *self, PyObject *args) {
    PyObject *body_obj, *buffers_obj;
    int by_length;
    if (!PyArg_ParseTuple(args, "OOp", &body_obj, &buffers_obj, &by_length)) return NULL;
    PyObject *buffers = PySequence_Fast(buffers_obj, "buffers must be a sequence");
    if (buffers == NULL) return NULL;
    Py_buffer body;
    if (PyObject_GetBuffer(body_obj, &body, PyBUF_SIMPLE) < 0) {
        Py_DECREF(buffers);
        return NULL;
    }
    unsigned char out[SHA256_SIZE];
    Py_ssize_t digested = 0;
    int done = content_digest(body.buf, body.len, PySequence_Fast_ITEMS(buffers),
                              PySequence_Fast_GET_SIZE(buffers), by_length, out, &digested);
    PyBuffer_Release(&body);
    Py_DECREF(buffers);
    if (done <= 0) Py_RETURN_NONE;
    return Py_BuildValue("(y#n)", (const char *)out, (Py_ssize_t)SHA256_SIZE, digested);
}

/* header(state, sequence, flags, sender, digest) -> signature | sequence | flags | sender */
static PyObject *header(PyObject *self, PyObject *args) {
    PyObject *state_obj;
    unsigned long long sequence;
    int flags;
    const char *sender, *content;
    Py_ssize_t sender_len, content_len;
    if (!PyArg_ParseTuple(args, "OKiy#y#", &state_obj, &sequence, &flags, &sender, &sender_len,
                          &content, &content_len))
        return NULL;
    key_state_t key;
    if (read_state(state_obj, &key) < 0) return NULL;
    if (sender_len != SENDER_BYTES || content_len != SHA256_SIZE || flags < 0 || flags > 255)
        return PyErr_Format(PyExc_ValueError, "bad header fields (sender %zd, digest %zd bytes)",
                            sender_len, content_len);
    unsigned char out[HEADER_BYTES];
    put_le(out + SIG_BYTES, sequence, SEQ_BYTES);
    out[FLAGS_AT] = (unsigned char)flags;
    memcpy(out + SENDER_AT, sender, SENDER_BYTES);
    sign(&key, out + SIG_BYTES, (const unsigned char *)content, out);
    return PyBytes_FromStringAndSize((const char *)out, HEADER_BYTES);
}

/* The one sealed frame of a small body: header | meta length | meta | payload, as
   _wire.Encoded.seal() gives it for the same sequence, in one allocation. The
   caller checked the sizes (body_len within SMALL_HASH_LIMIT). */
static PyObject *sealed(const key_state_t *key, uint64_t sequence, int flags, const char *sender,
                        const char *meta, Py_ssize_t meta_len, const char *payload,
                        Py_ssize_t payload_len) {
    Py_ssize_t body_len = META_LEN_BYTES + meta_len + payload_len;
    PyObject *out = PyBytes_FromStringAndSize(NULL, HEADER_BYTES + body_len);
    if (out == NULL) return NULL;
    unsigned char *head = (unsigned char *)PyBytes_AS_STRING(out), *body = head + HEADER_BYTES;
    put_le(body, (uint64_t)meta_len, META_LEN_BYTES);
    memcpy(body + META_LEN_BYTES, meta, (size_t)meta_len);
    memcpy(body + META_LEN_BYTES + meta_len, payload, (size_t)payload_len);
    unsigned char content[SHA256_SIZE];
    Py_ssize_t digested = 0;
    content_digest(body, body_len, NULL, 0, 0, content, &digested); /* small: always done */
    put_le(head + SIG_BYTES, sequence, SEQ_BYTES);
    head[FLAGS_AT] = (unsigned char)flags;
    memcpy(head + SENDER_AT, sender, SENDER_BYTES);
    sign(key, head + SIG_BYTES, content, head);
    return out;
}

/* frame(state, sequence, flags, sender, meta, payload) -> the one frame of a small
   message with no buffer frames, sealed (see sealed): the reply path of a small
   call pickled, digested, signed and joined in a dozen interpreted steps.
   ValueError if the body is over SMALL_HASH_LIMIT. */
static PyObject *frame(PyObject *self, PyObject *args) {
    PyObject *state_obj;
    unsigned long long sequence;
    int flags;
    const char *sender, *meta, *payload;
    Py_ssize_t sender_len, meta_len, payload_len;
    if (!PyArg_ParseTuple(args, "OKiy#y#y#", &state_obj, &sequence, &flags, &sender, &sender_len,
                          &meta, &meta_len, &payload, &payload_len))
        return NULL;
    key_state_t key;
    if (read_state(state_obj, &key) < 0) return NULL;
    Py_ssize_t body_len = META_LEN_BYTES + meta_len + payload_len;
    if (sender_len != SENDER_BYTES || flags < 0 || flags > 255 || body_len > SMALL_HASH_LIMIT)
        return PyErr_Format(PyExc_ValueError, "bad frame fields (sender %zd bytes, body %zd bytes)",
                            sender_len, body_len);
    return sealed(&key, sequence, flags, sender, meta, meta_len, payload, payload_len);
}

static PyObject *pickle_dumps, *pickle_loads; /* looked up once */

/* seal_write(state, numbers, flags, sender, meta, payload, fd) -> (frame, bytes of
   the message the kernel did not take: 0 all sent, -errno on an error), or None
   where the body is too big for one step (nothing taken from `numbers`, nothing
   written). `meta` (to_wire's tuple) is pickled as Signer.encode pickles it, the
   frame sealed with next(numbers) (see sealed), and written as one message of one
   frame of the Unix link (a frame count, its length, the frame: see
   _unix_link.py and _fastlink.c) in one non-blocking sendmsg. A rank's every
   reply to a small call: in Python, pickling, numbering, sealing and writing were
   seven interpreted calls, each with its cache misses on a rank woken per call.
   Call under the locks that order the sender's numbers and the socket's writes,
   with nothing of an earlier message waiting to be written. */
static PyObject *seal_write(PyObject *self, PyObject *args) {
    PyObject *state_obj, *numbers, *meta_obj;
    int flags, fd;
    const char *sender, *payload;
    Py_ssize_t sender_len, payload_len;
    if (!PyArg_ParseTuple(args, "OOiy#Oy#i", &state_obj, &numbers, &flags, &sender, &sender_len,
                          &meta_obj, &payload, &payload_len, &fd))
        return NULL;
    key_state_t key;
    if (read_state(state_obj, &key) < 0) return NULL;
    if (sender_len != SENDER_BYTES || flags < 0 || flags > 255 || !PyIter_Check(numbers))
        return PyErr_Format(PyExc_ValueError, "bad frame fields (sender %zd bytes)", sender_len);
    PyObject *meta = PyObject_CallFunction(pickle_dumps, "Oi", meta_obj, 5);
    if (meta == NULL) return NULL;
    Py_ssize_t meta_len = PyBytes_GET_SIZE(meta);
    if (META_LEN_BYTES + meta_len + payload_len > SMALL_HASH_LIMIT) {
        Py_DECREF(meta);
        Py_RETURN_NONE;
    }
    PyObject *number = PyIter_Next(numbers);
    unsigned long long sequence = number != NULL ? PyLong_AsUnsignedLongLong(number) : 0;
    Py_XDECREF(number);
    if (number == NULL || (sequence == (unsigned long long)-1 && PyErr_Occurred())) {
        Py_DECREF(meta);
        return PyErr_Occurred() ? NULL : PyErr_Format(PyExc_ValueError, "the sequence numbers ran out");
    }
    PyObject *out = sealed(&key, sequence, flags, sender, PyBytes_AS_STRING(meta), meta_len, payload,
                           payload_len);
    Py_DECREF(meta);
    if (out == NULL) return NULL;
    unsigned char link_header[4 + 8];
    uint32_t count = 1;
    uint64_t length = (uint64_t)PyBytes_GET_SIZE(out);
    memcpy(link_header, &count, 4); /* little-endian hosts only, as _fastlink.c */
    memcpy(link_header + 4, &length, 8);
    struct iovec iov[2] = {{link_header, sizeof link_header}, {PyBytes_AS_STRING(out), (size_t)length}};
    struct msghdr msg = {0};
    msg.msg_iov = iov;
    msg.msg_iovlen = 2;
    Py_ssize_t left = send_message(fd, &msg, (Py_ssize_t)(sizeof link_header + length));
    return Py_BuildValue("(Nn)", out, left);
}

static int same(const unsigned char *a, const unsigned char *b, size_t n) {
    unsigned char diff = 0; /* constant time, as hmac.compare_digest */
    for (size_t i = 0; i < n; i++) diff |= a[i] ^ b[i];
    return diff == 0;
}

/* The checks of _wire.Signer.verify before the replay window, on buffers already
   held: a refusal code, (sequence, meta, buffer bytes hashed), or (None, None,
   buffer bytes hashed) for a bad signature. */
static PyObject *check_views(const key_state_t *key, const unsigned char *first, Py_ssize_t first_len,
                             const unsigned char *body, Py_ssize_t body_len, PyObject **buffers,
                             Py_ssize_t count, int upstream, int trusted, const char *sender,
                             Py_ssize_t sender_len) {
    if (body_len < META_LEN_BYTES) return PyLong_FromLong(MALFORMED);
    uint64_t meta_end = META_LEN_BYTES + get_le(body, META_LEN_BYTES);
    if (meta_end > (uint64_t)body_len) return PyLong_FromLong(MALFORMED);
    int flags = first[FLAGS_AT];
    if (flags & ~KNOWN_FLAGS) return PyLong_FromLong(MALFORMED);
    int by_length = (flags & BULK_BY_LENGTH) != 0;
    if (((flags & UPSTREAM) != 0) == (upstream != 0) || (by_length && !trusted) ||
        (sender != NULL && (sender_len != SENDER_BYTES || memcmp(first + SENDER_AT, sender, SENDER_BYTES) != 0)))
        return PyLong_FromLong(MISDIRECTED);
    unsigned char content[SHA256_SIZE], mac[SIG_BYTES];
    Py_ssize_t digested = 0;
    int done = content_digest(body, body_len, buffers, count, by_length, content, &digested);
    if (done <= 0) return done < 0 ? NULL : PyLong_FromLong(FALL_BACK);
    sign(key, first + SIG_BYTES, content, mac);
    if (!same(mac, first, SIG_BYTES)) /* hashed, then refused: counted as hashed too */
        return Py_BuildValue("(OOn)", Py_None, Py_None, digested);
    return Py_BuildValue("(Ky#n)", (unsigned long long)get_le(first + SIG_BYTES, SEQ_BYTES),
                         (const char *)body + META_LEN_BYTES,
                         (Py_ssize_t)(meta_end - META_LEN_BYTES), digested);
}

/* check(state, frames, upstream, trusted, sender or None): see check_views. */
static PyObject *check(PyObject *self, PyObject *args) {
    PyObject *state_obj, *frames_obj, *sender_obj;
    int upstream, trusted;
    if (!PyArg_ParseTuple(args, "OOppO", &state_obj, &frames_obj, &upstream, &trusted, &sender_obj))
        return NULL;
    key_state_t key;
    if (read_state(state_obj, &key) < 0) return NULL;
    const char *sender = NULL;
    Py_ssize_t sender_len = 0;
    if (sender_obj != Py_None) {
        if (!PyBytes_Check(sender_obj)) return PyErr_Format(PyExc_TypeError, "sender must be bytes");
        sender = PyBytes_AS_STRING(sender_obj);
        sender_len = PyBytes_GET_SIZE(sender_obj);
    }
    PyObject *frames = PySequence_Fast(frames_obj, "frames must be a sequence");
    if (frames == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(frames);
    PyObject **items = PySequence_Fast_ITEMS(frames);
    PyObject *result = NULL;
    Py_buffer first, body;
    if (n == 0) {
        result = PyLong_FromLong(MALFORMED);
    } else if (PyObject_GetBuffer(items[0], &first, PyBUF_SIMPLE) < 0) {
        PyErr_Clear();
        result = PyLong_FromLong(FALL_BACK);
    } else {
        if (first.len < HEADER_BYTES) {
            result = PyLong_FromLong(MALFORMED);
        } else if (first.len > HEADER_BYTES) { /* header and body share the frame */
            result = check_views(&key, first.buf, first.len, (unsigned char *)first.buf + HEADER_BYTES,
                                 first.len - HEADER_BYTES, items + 1, n - 1, upstream, trusted,
                                 sender, sender_len);
        } else if (n < 2) {
            result = PyLong_FromLong(MALFORMED);
        } else if (PyObject_GetBuffer(items[1], &body, PyBUF_SIMPLE) < 0) {
            PyErr_Clear();
            result = PyLong_FromLong(FALL_BACK);
        } else {
            result = check_views(&key, first.buf, first.len, body.buf, body.len, items + 2, n - 2,
                                 upstream, trusted, sender, sender_len);
            PyBuffer_Release(&body);
        }
        PyBuffer_Release(&first);
    }
    Py_DECREF(frames);
    return result;
}

/* The replay window of _wire.ReplayWindow, as a type: the same rule, one C call
   per message instead of an interpreted method (every message any receiver
   accepts goes through it). Bit i of `seen` set: number `highest - i` was
   accepted; REPLAY_WINDOW bits in all. */
#define REPLAY_WINDOW 1024
#define WINDOW_WORDS (REPLAY_WINDOW / 64)

typedef struct {
    PyObject_HEAD
    uint64_t highest;
    uint64_t seen[WINDOW_WORDS];
} window_t;

static PyObject *window_new(PyTypeObject *type, PyObject *args, PyObject *kwargs) {
    if (PyTuple_GET_SIZE(args) != 0 || (kwargs != NULL && PyDict_GET_SIZE(kwargs) != 0))
        return PyErr_Format(PyExc_TypeError, "Window() takes no arguments");
    window_t *w = (window_t *)type->tp_alloc(type, 0);
    if (w == NULL) return NULL;
    w->highest = 0;
    memset(w->seen, 0, sizeof w->seen);
    w->seen[0] = 1; /* number 0 counts as seen: nobody seals it */
    return (PyObject *)w;
}

/* Move the bits `shift` places up (towards older numbers); what passes the top goes. */
static void window_shift(window_t *w, uint64_t shift) {
    if (shift >= REPLAY_WINDOW) {
        memset(w->seen, 0, sizeof w->seen);
        return;
    }
    int words = (int)(shift / 64), bits = (int)(shift % 64);
    for (int i = WINDOW_WORDS - 1; i >= 0; i--) {
        uint64_t high = i - words >= 0 ? w->seen[i - words] : 0;
        uint64_t low = i - words - 1 >= 0 ? w->seen[i - words - 1] : 0;
        w->seen[i] = bits ? (high << bits) | (low >> (64 - bits)) : high;
    }
}

/* Accept `number` into window `w` (as window_accept): 1 fresh, 0 seen or too old. */
static int window_take(window_t *w, uint64_t number) {
    if (number > w->highest) {
        window_shift(w, number - w->highest);
        w->seen[0] |= 1;
        w->highest = number;
        return 1;
    }
    uint64_t age = w->highest - number;
    if (age >= REPLAY_WINDOW) return 0;
    uint64_t bit = (uint64_t)1 << (age % 64);
    if (w->seen[age / 64] & bit) return 0;
    w->seen[age / 64] |= bit;
    return 1;
}

static PyObject *window_accept(PyObject *self, PyObject *arg) {
    unsigned long long number = PyLong_AsUnsignedLongLong(arg);
    if (number == (unsigned long long)-1 && PyErr_Occurred()) return NULL;
    return PyBool_FromLong(window_take((window_t *)self, number));
}

static PyMethodDef window_methods[] = {
    {"accept", window_accept, METH_O,
     "accept(number) -> True the first time a number within the window is seen"},
    {NULL, NULL, 0, NULL},
};

static PyTypeObject window_type = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "monarch_nb._wire._fastwire.Window",
    .tp_basicsize = sizeof(window_t),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_doc = "The sequence numbers already accepted from one sender (see _wire.ReplayWindow).",
    .tp_new = window_new,
    .tp_methods = window_methods,
};


/* The message a meta tuple stands for, built without its interpreted __init__
   where `kinds` (tag -> (class, its fields' slot descriptors)) knows the tag and
   the field count matches; else (meta,), for _messages.from_wire to read or
   refuse (a message is never a tuple: the caller tells the two apart so). A frozen dataclass's __init__ sets each field through
   object.__setattr__, an interpreted step apiece: a rank's every call and the
   controller's every reply built one. */
static PyObject *build(PyObject *kinds, PyObject *meta) {
    if (!PyTuple_Check(meta) || PyTuple_GET_SIZE(meta) == 0 || kinds == Py_None) return PyTuple_Pack(1, meta);
    PyObject *spec = PyDict_GetItemWithError(kinds, PyTuple_GET_ITEM(meta, 0));
    if (spec == NULL) return PyErr_Occurred() ? NULL : PyTuple_Pack(1, meta);
    if (!PyTuple_Check(spec) || PyTuple_GET_SIZE(spec) != 2 || !PyType_Check(PyTuple_GET_ITEM(spec, 0)) ||
        !PyTuple_Check(PyTuple_GET_ITEM(spec, 1)))
        return PyErr_Format(PyExc_TypeError, "kinds maps a tag to (class, slot descriptors)");
    PyTypeObject *type = (PyTypeObject *)PyTuple_GET_ITEM(spec, 0);
    PyObject *members = PyTuple_GET_ITEM(spec, 1);
    Py_ssize_t n = PyTuple_GET_SIZE(members);
    if (PyTuple_GET_SIZE(meta) != n + 1) return PyTuple_Pack(1, meta);
    PyObject *message = type->tp_alloc(type, 0);
    if (message == NULL) return NULL;
    for (Py_ssize_t i = 0; i < n; i++) {
        PyObject *member = PyTuple_GET_ITEM(members, i);
        descrsetfunc set = Py_TYPE(member)->tp_descr_set;
        if (set == NULL) {
            Py_DECREF(message);
            return PyErr_Format(PyExc_TypeError, "a field of %s is not a slot", type->tp_name);
        }
        if (set(member, message, PyTuple_GET_ITEM(meta, i + 1)) < 0) {
            Py_DECREF(message);
            return NULL;
        }
    }
    return message;
}

/* admit(state, frames, upstream, trusted, sender or None, window, kinds or None):
   check()'s checks, then the replay window, then the meta unpickled and its
   message built (see build), in one call: a refusal code as check() gives, or
   (None, bytes hashed) for a bad signature, (False, bytes hashed) for a number
   seen before, (message or (meta,), bytes hashed) for a message admitted. Raises
   what unpickling the (signed) meta raises. */
static PyObject *admit(PyObject *self, PyObject *args) {
    PyObject *state, *frames, *upstream, *trusted, *sender, *window, *kinds;
    if (!PyArg_UnpackTuple(args, "admit", 7, 7, &state, &frames, &upstream, &trusted, &sender, &window,
                           &kinds))
        return NULL;
    if (kinds != Py_None && !PyDict_Check(kinds)) return PyErr_Format(PyExc_TypeError, "kinds must be a dict");
    PyObject *check_args = PyTuple_Pack(5, state, frames, upstream, trusted, sender);
    if (check_args == NULL) return NULL;
    PyObject *checked = check(self, check_args);
    Py_DECREF(check_args);
    if (checked == NULL || !PyTuple_Check(checked) || PyTuple_GET_ITEM(checked, 1) == Py_None)
        goto keep; /* a refusal code, or a bad signature: check()'s answer, shorter */
    unsigned long long sequence = PyLong_AsUnsignedLongLong(PyTuple_GET_ITEM(checked, 0));
    if (sequence == (unsigned long long)-1 && PyErr_Occurred()) goto fail;
    PyObject *digested = PyTuple_GET_ITEM(checked, 2);
    int fresh;
    if (Py_TYPE(window) == &window_type) {
        fresh = window_take((window_t *)window, sequence);
    } else { /* another window (the pure-Python one): asked as the Python path asks it */
        PyObject *answer = PyObject_CallMethod(window, "accept", "K", sequence);
        if (answer == NULL) goto fail;
        fresh = PyObject_IsTrue(answer);
        Py_DECREF(answer);
        if (fresh < 0) goto fail;
    }
    if (!fresh) {
        PyObject *out = PyTuple_Pack(2, Py_False, digested);
        Py_DECREF(checked);
        return out;
    }
    PyObject *meta = PyObject_CallOneArg(pickle_loads, PyTuple_GET_ITEM(checked, 1));
    if (meta == NULL) goto fail;
    PyObject *message = build(kinds, meta);
    Py_DECREF(meta);
    if (message == NULL) goto fail;
    PyObject *out = PyTuple_Pack(2, message, digested);
    Py_DECREF(message);
    Py_DECREF(checked);
    return out;
keep:
    if (checked != NULL && PyTuple_Check(checked)) { /* (None, None, hashed) -> (None, hashed) */
        PyObject *out = PyTuple_Pack(2, Py_None, PyTuple_GET_ITEM(checked, 2));
        Py_DECREF(checked);
        return out;
    }
    return checked;
fail:
    Py_DECREF(checked);
    return NULL;
}

/* payload(frames) -> the payload of a verified message unpickled, its buffer frames
   out of band, or None where it has none: _wire.decode_payload in one call (a
   rank's every call unpickles its arguments so, the controller every reply's
   value). Trusts the layout verify() checked; raises what unpickling raises. */
static PyObject *payload(PyObject *self, PyObject *frames_obj) {
    PyObject *frames = PySequence_Fast(frames_obj, "frames must be a sequence");
    if (frames == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(frames);
    PyObject **items = PySequence_Fast_ITEMS(frames);
    PyObject *result = NULL, *view = NULL, *buffers = NULL;
    Py_buffer body;
    Py_ssize_t skip, first_buffer;
    if (n < 1) {
        PyErr_SetString(PyExc_ValueError, "a message has at least one frame");
        goto done;
    }
    if (PyObject_GetBuffer(items[0], &body, PyBUF_SIMPLE) < 0) goto done;
    if (body.len > HEADER_BYTES) { /* header and body share the first frame */
        skip = HEADER_BYTES, first_buffer = 1;
    } else {
        PyBuffer_Release(&body);
        if (n < 2) {
            PyErr_SetString(PyExc_ValueError, "a message's body frame is missing");
            goto done;
        }
        if (PyObject_GetBuffer(items[1], &body, PyBUF_SIMPLE) < 0) goto done;
        skip = 0, first_buffer = 2;
    }
    Py_ssize_t body_len = body.len - skip;
    const unsigned char *start = (const unsigned char *)body.buf + skip;
    if (body_len < META_LEN_BYTES || (uint64_t)body_len < META_LEN_BYTES + get_le(start, META_LEN_BYTES)) {
        PyBuffer_Release(&body);
        PyErr_SetString(PyExc_ValueError, "a message's meta runs past its body");
        goto done;
    }
    Py_ssize_t at = META_LEN_BYTES + (Py_ssize_t)get_le(start, META_LEN_BYTES);
    if (at == body_len) { /* no payload */
        PyBuffer_Release(&body);
        result = Py_NewRef(Py_None);
        goto done;
    }
    /* A view of the frame's own memory, held (body) while pickle reads it: what
       it unpickles in band is copied into new objects. */
    view = PyMemoryView_FromMemory((char *)start + at, body_len - at, PyBUF_READ);
    if (view == NULL) {
        PyBuffer_Release(&body);
        goto done;
    }
    if (first_buffer < n) {
        buffers = PyList_New(n - first_buffer);
        for (Py_ssize_t i = first_buffer; buffers != NULL && i < n; i++) {
            PyObject *b = PyMemoryView_FromObject(items[i]);
            if (b == NULL) Py_CLEAR(buffers);
            else PyList_SET_ITEM(buffers, i - first_buffer, b);
        }
        if (buffers == NULL) {
            PyBuffer_Release(&body);
            goto done;
        }
        PyObject *args = PyTuple_Pack(1, view), *kwargs = Py_BuildValue("{sO}", "buffers", buffers);
        if (args != NULL && kwargs != NULL) result = PyObject_Call(pickle_loads, args, kwargs);
        Py_XDECREF(args);
        Py_XDECREF(kwargs);
    } else {
        result = PyObject_CallOneArg(pickle_loads, view);
    }
    PyBuffer_Release(&body);
done:
    Py_XDECREF(view);
    Py_XDECREF(buffers);
    Py_DECREF(frames);
    return result;
}

static PyObject *sha_extensions(PyObject *self, PyObject *unused) {
    return PyBool_FromLong(sha256_uses_cpu_extensions());
}

static PyMethodDef methods[] = {
    {"sha_extensions", sha_extensions, METH_NOARGS,
     "sha_extensions() -> whether SHA-256 runs on the CPU's SHA instructions"},
    {"key_state", key_state, METH_O, "key_state(key) -> the HMAC key's precomputed hash states"},
    {"digest", digest, METH_VARARGS,
     "digest(body, buffers, by_length) -> (content digest, buffer bytes hashed), or None if too big"},
    {"header", header, METH_VARARGS,
     "header(state, sequence, flags, sender, digest) -> the signed 57-byte header"},
    {"frame", frame, METH_VARARGS,
     "frame(state, sequence, flags, sender, meta, payload) -> a small message's one sealed frame"},
    {"seal_write", seal_write, METH_VARARGS,
     "seal_write(state, numbers, flags, sender, meta, payload, fd) -> (frame, bytes not sent or "
     "-errno): a small message pickled, sealed and written to a Unix link; None if too big"},
    {"admit", admit, METH_VARARGS,
     "admit(state, frames, upstream, trusted, sender, window, kinds) -> check()'s refusal code, "
     "(None, bytes hashed): bad signature, (False, bytes hashed): replayed, "
     "(message or (meta,), bytes hashed): admitted"},
    {"payload", payload, METH_O,
     "payload(frames) -> a verified message's payload unpickled (buffers out of band), or None"},
    {"check", check, METH_VARARGS,
     "check(state, frames, upstream, trusted, sender) -> refusal code, "
     "(sequence, meta, buffer bytes hashed), or (None, None, bytes hashed): bad signature"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT,
    .m_name = "_fastwire",
    .m_doc = "Signing and checking small control-wire messages in C (see monarch_nb._wire._signed).",
    .m_size = -1,
    .m_methods = methods,
};

PyMODINIT_FUNC PyInit__fastwire(void) {
    if (pickle_loads == NULL) {
        PyObject *pickle = PyImport_ImportModule("pickle");
        if (pickle == NULL) return NULL;
        pickle_loads = PyObject_GetAttrString(pickle, "loads");
        pickle_dumps = PyObject_GetAttrString(pickle, "dumps");
        Py_DECREF(pickle);
        if (pickle_loads == NULL || pickle_dumps == NULL) return NULL;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    if (PyType_Ready(&window_type) < 0 ||
        PyModule_AddObjectRef(m, "Window", (PyObject *)&window_type) < 0 ||
        PyModule_AddIntConstant(m, "REPLAY_WINDOW", REPLAY_WINDOW) < 0 ||
        PyModule_AddIntConstant(m, "SMALL_HASH_LIMIT", SMALL_HASH_LIMIT) < 0 ||
        PyModule_AddIntConstant(m, "FALL_BACK", FALL_BACK) < 0 ||
        PyModule_AddIntConstant(m, "MALFORMED", MALFORMED) < 0 ||
        PyModule_AddIntConstant(m, "MISDIRECTED", MISDIRECTED) < 0) {
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
