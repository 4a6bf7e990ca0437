/*
 * The reader's side over TCP (piece 3 in _memory.c): a request and its reply,
 * and tcp_copy, which streams a range over several connections at once, one
 * thread each, with the GIL released. The same-host copies that lease a
 * region instead are in _memory_lease.c.
 */
#include "_memory.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "_seal.h"

/* ------------------------------------------------------------ client side */

typedef struct {
    int fd;
    const unsigned char *challenge; /* the connection's hello */
    uint16_t op;
    uint64_t region;
    const unsigned char *token;
    uint64_t offset;
    char *addr;
    uint64_t length;
    uint32_t status;
    int err;
} xfer_t;

int exchange(int fd, const request_t *q, uint32_t *status, uint64_t *value, int *err) {
    unsigned char b[REQ_SIZE > REP_SIZE ? REQ_SIZE : REP_SIZE];
    encode_request(b, q);
    int e = send_all(fd, b, REQ_SIZE);
    if (e != 0) {
        *status = ST_IO_ERROR;
        *err = e;
        return -1;
    }
    e = recv_all(fd, b, REP_SIZE);
    if (e != 0) {
        *status = e < 0 ? ST_EOF : ST_IO_ERROR;
        *err = e < 0 ? 0 : e;
        return -1;
    }
    if (get_u32(b) != REP_MAGIC) {
        *status = ST_BAD_REPLY;
        *err = 0;
        return -1;
    }
    *status = get_u32(b + 4);
    *value = get_u64(b + 8);
    *err = *status == ST_DEVICE_ERROR ? (int)*value : 0;
    return *status == ST_OK ? 0 : -1;
}

/* Nonces of this process's requests: one counter for every connection, so each
 * connection sees them grow. */
static uint64_t g_client_nonce = 0;

void make_request(request_t *q, uint16_t op, uint64_t region, const unsigned char *token,
                         const unsigned char *challenge, uint64_t offset, uint64_t length) {
    q->magic = REQ_MAGIC;
    q->version = PROTO_VERSION;
    q->op = op;
    q->region = region;
    q->nonce = __atomic_add_fetch(&g_client_nonce, 1, __ATOMIC_RELAXED);
    q->offset = offset;
    q->length = length;
    request_mac(q, token, challenge, q->mac);
}

/* Run fn over items[0..n): items 1.. on threads of their own, item 0 on the
   calling thread; an item whose thread cannot be created runs here as well.
   Called with the GIL released. */
void run_parallel(void *(*fn)(void *), void *items, size_t item_size, int n) {
    pthread_t threads[MAX_STREAMS];
    int started[MAX_STREAMS] = {0};
    char *base = items;
    for (int i = 1; i < n; i++)
        started[i] = pthread_create(&threads[i], NULL, fn, base + i * item_size) == 0;
    fn(base);
    for (int i = 1; i < n; i++) {
        if (started[i])
            pthread_join(threads[i], NULL);
        else
            fn(base + i * item_size);
    }
}

/* The reader's side of READ_SEALED / WRITE_SEALED after the owner's ST_OK: open
 * each chunk in place in the destination, or seal each into a buffer and send
 * it, then read the owner's verdict. Sets x->status for a bad tag or a refused
 * write and returns 0; returns an errno value or -1 if the stream broke. */
static int stream_sealed(xfer_t *x, uint64_t nonce) {
    unsigned char key[SEAL_KEY_SIZE], tag[SEAL_TAG_SIZE];
    seal_key(x->token, TOKEN_SIZE, x->challenge, CHALLENGE_SIZE, key);
    unsigned char *buf = NULL;
    if (x->op == OP_WRITE_SEALED && (buf = (unsigned char *)malloc(SEAL_CHUNK)) == NULL) {
        x->status = ST_IO_ERROR;
        x->err = ENOMEM;
        return 0;
    }
    int e = 0;
    uint64_t done = 0;
    for (uint32_t i = 0; e == 0 && done < x->length; i++) {
        size_t n = x->length - done < SEAL_CHUNK ? (size_t)(x->length - done) : SEAL_CHUNK;
        unsigned char *here = (unsigned char *)x->addr + done;
        if (x->op == OP_READ_SEALED) {
            e = recv_all(x->fd, here, n);
            if (e == 0) e = recv_all(x->fd, tag, SEAL_TAG_SIZE);
            if (e == 0 && open_chunk(key, nonce, i, here, here, n, tag) != 0) {
                x->status = ST_BAD_SEAL;
                break;
            }
        } else {
            if (seal_chunk(key, nonce, i, here, buf, n, tag) != 0) {
                x->status = ST_BAD_SEAL;
                break;
            }
            e = send_all(x->fd, buf, n);
            if (e == 0) e = send_all(x->fd, tag, SEAL_TAG_SIZE);
        }
        done += n;
    }
    free(buf);
    if (e == 0 && x->status == ST_OK && x->op == OP_WRITE_SEALED) {
        unsigned char b[REP_SIZE];
        e = recv_all(x->fd, b, REP_SIZE);
        if (e == 0 && (get_u32(b) != REP_MAGIC || get_u32(b + 4) != ST_OK))
            x->status = get_u32(b) != REP_MAGIC ? ST_BAD_REPLY : get_u32(b + 4);
    }
    return e;
}

static void *tcp_stream(void *arg) {
    xfer_t *x = (xfer_t *)arg;
    request_t q;
    uint64_t value = 0;
    make_request(&q, x->op, x->region, x->token, x->challenge, x->offset, x->length);
    if (exchange(x->fd, &q, &x->status, &value, &x->err) != 0) return NULL;
    if (value != x->length) {
        x->status = ST_BAD_REPLY;
        return NULL;
    }
    int e;
    if (x->op == OP_READ_SEALED || x->op == OP_WRITE_SEALED) {
        e = stream_sealed(x, q.nonce);
        if (e > 0 || e == -1) {
            x->status = e < 0 ? ST_EOF : ST_IO_ERROR;
            x->err = e < 0 ? 0 : e;
        }
        return NULL;
    }
    if (x->op == OP_READ) {
        e = recv_all(x->fd, x->addr, x->length);
    } else {
        e = send_all(x->fd, x->addr, x->length);
        if (e == 0) {
            unsigned char b[REP_SIZE];
            e = recv_all(x->fd, b, REP_SIZE);
            if (e == 0 && (get_u32(b) != REP_MAGIC || get_u32(b + 4) != ST_OK)) {
                x->status = get_u32(b) != REP_MAGIC ? ST_BAD_REPLY : get_u32(b + 4);
                return NULL;
            }
        }
    }
    if (e != 0) {
        x->status = e < 0 ? ST_EOF : ST_IO_ERROR;
        x->err = e < 0 ? 0 : e;
    }
    return NULL;
}

/* ----------------------------------------------------------- Python layer */

/* Copy exactly `size` bytes of the bytes object `obj` to `out`. */
static int parse_fixed(PyObject *obj, unsigned char *out, Py_ssize_t size, const char *what) {
    char *p;
    Py_ssize_t n;
    if (PyBytes_AsStringAndSize(obj, &p, &n) != 0) return -1;
    if (n != size) {
        PyErr_Format(PyExc_ValueError, "%s must be %zd bytes, got %zd", what, size, n);
        return -1;
    }
    memcpy(out, p, (size_t)size);
    return 0;
}

int parse_token(PyObject *obj, unsigned char *token) {
    return parse_fixed(obj, token, TOKEN_SIZE, "token");
}

int parse_challenge(PyObject *obj, unsigned char *challenge) {
    return parse_fixed(obj, challenge, CHALLENGE_SIZE, "challenge");
}

PyObject *py_request(PyObject *self, PyObject *args) {
    int fd, op;
    unsigned long long region, offset, length;
    PyObject *tok, *hello;
    unsigned char token[TOKEN_SIZE], challenge[CHALLENGE_SIZE];
    if (!PyArg_ParseTuple(args, "iSiKSKK", &fd, &hello, &op, &region, &tok, &offset, &length))
        return NULL;
    if (parse_token(tok, token) != 0 || parse_challenge(hello, challenge) != 0) return NULL;
    request_t q;
    uint32_t status = 0;
    uint64_t value = 0;
    int err = 0;
    make_request(&q, (uint16_t)op, region, token, challenge, offset, length);
    Py_BEGIN_ALLOW_THREADS
    exchange(fd, &q, &status, &value, &err);
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(IKi)", status, (unsigned long long)value, err);
}

PyObject *py_tcp_copy(PyObject *self, PyObject *args) {
    PyObject *fds_obj, *hellos_obj, *tok;
    int op;
    unsigned long long region, offset, addr, length;
    unsigned char token[TOKEN_SIZE], challenges[MAX_STREAMS][CHALLENGE_SIZE];
    if (!PyArg_ParseTuple(args, "OOiKSKKK", &fds_obj, &hellos_obj, &op, &region, &tok, &offset,
                          &addr, &length))
        return NULL;
    if (op != OP_READ && op != OP_WRITE && op != OP_READ_SEALED && op != OP_WRITE_SEALED) {
        PyErr_Format(PyExc_ValueError, "op must be READ or WRITE, sealed or not, got %d", op);
        return NULL;
    }
    if ((op == OP_READ_SEALED || op == OP_WRITE_SEALED) && !seal_loaded()) {
        PyErr_SetString(PyExc_RuntimeError, "sealed copies need seal_load() first");
        return NULL;
    }
    if (parse_token(tok, token) != 0) return NULL;
    PyObject *seq = PySequence_Fast(fds_obj, "fds must be a sequence of file descriptors");
    if (seq == NULL) return NULL;
    Py_ssize_t n = PySequence_Fast_GET_SIZE(seq);
    if (n < 1 || n > MAX_STREAMS) {
        Py_DECREF(seq);
        PyErr_Format(PyExc_ValueError, "need 1 to %d connections, got %zd", MAX_STREAMS, n);
        return NULL;
    }
    PyObject *hellos = PySequence_Fast(hellos_obj, "challenges must be a sequence of bytes");
    if (hellos == NULL || PySequence_Fast_GET_SIZE(hellos) != n) {
        Py_DECREF(seq);
        Py_XDECREF(hellos);
        if (!PyErr_Occurred())
            PyErr_SetString(PyExc_ValueError, "need one challenge per connection");
        return NULL;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        if (parse_challenge(PySequence_Fast_GET_ITEM(hellos, i), challenges[i]) != 0) {
            Py_DECREF(seq);
            Py_DECREF(hellos);
            return NULL;
        }
    }
    Py_DECREF(hellos);
    xfer_t x[MAX_STREAMS];
    uint64_t part = (length + (uint64_t)n - 1) / (uint64_t)n;
    part = (part + 65535) & ~(uint64_t)65535;
    uint64_t pos = 0;
    int used = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        long fd = PyLong_AsLong(PySequence_Fast_GET_ITEM(seq, i));
        if (fd == -1 && PyErr_Occurred()) {
            Py_DECREF(seq);
            return NULL;
        }
        if (i > 0 && pos >= length) break;
        uint64_t len = length - pos < part ? length - pos : part;
        x[used] = (xfer_t){(int)fd,     challenges[i],  (uint16_t)op, region, token,
                           offset + pos, (char *)(uintptr_t)(addr + pos), len, ST_OK, 0};
        pos += len;
        used++;
    }
    Py_DECREF(seq);
    Py_BEGIN_ALLOW_THREADS
    run_parallel(tcp_stream, x, sizeof x[0], used);
    Py_END_ALLOW_THREADS
    for (int i = 0; i < used; i++)
        if (x[i].status != ST_OK) return Py_BuildValue("(Ii)", x[i].status, x[i].err);
    return Py_BuildValue("(Ii)", (unsigned int)ST_OK, 0);
}
