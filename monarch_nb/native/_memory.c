/*
 * monarch_nb.native._memory -- the native half of the data plane.
 *
 * Three pieces, all usable without the caller's (or the owner's) Python:
 *
 *   1. A registration table: region id -> (address, size, capability token,
 *      writable, revoked, users).  Guarded by one mutex; every access to
 *      registered memory on the owner side happens while the table counts a
 *      "user" of the region, and unregister() waits for users to reach zero,
 *      so memory is never touched after unregister() returns.
 *
 *   2. A TCP server: one accept thread plus one thread per connection.  The
 *      server opens each connection with a hello (u32 magic "MNBH", u8[16]
 *      random challenge); the connection then carries a sequence of
 *      fixed-size requests (56 bytes):
 *
 *          u32 magic "MNBR" | u16 version | u16 op | u64 region | u64 nonce
 *          u64 offset | u64 length | u8[16] mac                 (little endian)
 *
 *      where mac is HMAC-SHA256(region's token, challenge || the first 40
 *      bytes) cut to 16 bytes, and nonce grows from request to request on a
 *      connection. The token itself never crosses the wire: a request seen on
 *      the network can neither be replayed (another connection has another
 *      challenge; this one wants a larger nonce) nor altered.
 *
 *      Every reply starts with a 16-byte header:
 *
 *          u32 magic "MNBA" | u32 status | u64 value
 *
 *      READ streams the range straight from memory with send(); WRITE
 *      receives straight into memory with recv(); LEASE_* pins a region for a
 *      same-host copy made by the *reader* with process_vm_readv/writev and is
 *      ended by RELEASE; QUERY and DROP check or revoke a region.  Any
 *      malformed request gets an error status and the connection is closed.
 *      A request is served only if the region is registered and not revoked,
 *      the MAC matches (constant-time compare) and [offset, offset+length)
 *      lies inside the region; nothing else is ever read or written.
 *
 *   3. Client-side copy engines, called with the GIL released: tcp_copy
 *      (several connections in parallel, one pthread each) and local_copy
 *      (lease, chunked cross-memory copy that stops at the next chunk boundary
 *      when the lease is revoked, release).
 *
 * Revocation.  Dropping a region marks it revoked (new requests are refused)
 * and wakes every connection currently using it: a READ/WRITE connection is
 * shut down both ways, which makes the server's own send()/recv() fail at
 * once; a lease connection is shut down for writing only, which the remote
 * reader sees as end-of-file between two chunks; it stops copying and then
 * sends RELEASE (or dies, which closes the socket).  Only then does the
 * server thread drop its use, so unregister() returns only once no process
 * is copying to or from the region.
 *
 * Files: _memory.h (the protocol's constants and records, what the files
 * share), _memory_protocol.c (a request's encoding and MAC, socket I/O),
 * _memory_registry.c (piece 1), _memory_server.c (piece 2), _memory_client.c
 * and _memory_lease.c (piece 3: over TCP, and same-host by lease), and this
 * file: the module, its small entry points, and the state reset after fork.
 */

#include "_memory.h"

#include <errno.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "_cuda.h"
#include "_seal.h"
#include "../_wire/_sha256.h"

#ifndef PR_SET_PTRACER
#define PR_SET_PTRACER 0x59616d61
#endif

/* ----------------------------------------------------------- Python layer */

static PyObject *py_set_ptracer(PyObject *self, PyObject *args) {
    unsigned long pid;
    if (!PyArg_ParseTuple(args, "k", &pid)) return NULL;
    int rc = prctl(PR_SET_PTRACER, pid, 0, 0, 0);
    return PyLong_FromLong(rc == 0 ? 0 : errno);
}

static PyObject *py_address_of(PyObject *self, PyObject *args) {
    PyObject *obj;
    int writable;
    if (!PyArg_ParseTuple(args, "Op", &obj, &writable)) return NULL;
    Py_buffer view;
    int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(obj, &view, flags) != 0) return NULL;
    PyObject *out = Py_BuildValue("(Kn)", (unsigned long long)(uintptr_t)view.buf, view.len);
    PyBuffer_Release(&view);
    return out;
}


static PyObject *py_hmac_sha256(PyObject *self, PyObject *args) {
    const char *key, *msg;
    Py_ssize_t key_len, msg_len;
    if (!PyArg_ParseTuple(args, "y#y#", &key, &key_len, &msg, &msg_len)) return NULL;
    unsigned char out[SHA256_SIZE];
    hmac_sha256((const unsigned char *)key, (size_t)key_len, (const unsigned char *)msg,
                (size_t)msg_len, out);
    return PyBytes_FromStringAndSize((const char *)out, SHA256_SIZE);
}

/* Open a library at run time with `load` (cuda_load, seal_load); OSError if it cannot. */
static PyObject *load_library(PyObject *args, int (*load)(const char *, char *, size_t)) {
    const char *path;
    if (!PyArg_ParseTuple(args, "s", &path)) return NULL;
    char why[512] = "";
    if (load(path, why, sizeof why) != 0) {
        PyErr_SetString(PyExc_OSError, why);
        return NULL;
    }
    Py_RETURN_NONE;
}

static PyObject *py_seal_load(PyObject *self, PyObject *args) { return load_library(args, seal_load); }

static PyObject *py_cuda_load(PyObject *self, PyObject *args) { return load_library(args, cuda_load); }

static PyObject *py_cuda_ipc_export(PyObject *self, PyObject *args) {
    int device;
    unsigned long long ptr;
    if (!PyArg_ParseTuple(args, "iK", &device, &ptr)) return NULL;
    unsigned char handle[CUDA_IPC_HANDLE_SIZE];
    uint64_t offset = 0;
    int rc;
    Py_BEGIN_ALLOW_THREADS
    rc = cuda_ipc_export(device, (uintptr_t)ptr, handle, &offset);
    Py_END_ALLOW_THREADS
    if (rc != 0) return Py_BuildValue("(Oi)", Py_None, rc);
    return Py_BuildValue("((y#K)i)", (const char *)handle, (Py_ssize_t)CUDA_IPC_HANDLE_SIZE,
                         (unsigned long long)offset, 0);
}

static PyObject *py_cuda_error(PyObject *self, PyObject *args) {
    int code;
    if (!PyArg_ParseTuple(args, "i", &code)) return NULL;
    return PyUnicode_FromString(cuda_error(code));
}

static void atfork_child(void) {
    /* Only the forking thread survives: the server and its connections did not. */
    pthread_mutex_init(&g_lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g_cond, &ca);
    pthread_condattr_destroy(&ca);
    memset(g_buckets, 0, sizeof g_buckets);
    g_region_count = 0;
    g_region_bytes = 0;
    g_conns = NULL;
    g_conn_count = 0;
    if (g_listen_fd >= 0) close(g_listen_fd);
    if (g_unix_fd >= 0) close(g_unix_fd);
    g_listen_fd = -1;
    g_unix_fd = -1;
    g_server_started = 0;
}

static PyMethodDef methods[] = {
    {"register", py_register, METH_VARARGS,
     "register(address, size, token, writable) -> region id"},
    {"unregister", py_unregister, METH_VARARGS,
     "unregister(region_id, timeout_s) -> users still copying (0 once it is safe to free)"},
    {"set_ptracer", py_set_ptracer, METH_VARARGS,
     "set_ptracer(pid): prctl(PR_SET_PTRACER, pid) -> 0 or errno"},
    {"server_start", py_server_start, METH_VARARGS,
     "server_start(tcp_fd, unix_fd=-1): serve registered regions on a native thread "
     "(non-blocking listening sockets)"},
    {"stats", py_stats, METH_NOARGS, "stats() -> (regions, bytes, connections, server_started)"},
    {"address_of", py_address_of, METH_VARARGS,
     "address_of(obj, writable) -> (address, nbytes) of a C-contiguous buffer"},
    {"request", py_request, METH_VARARGS,
     "request(fd, challenge, op, region, token, offset, length) -> (status, value, errno)"},
    {"tcp_copy", py_tcp_copy, METH_VARARGS,
     "tcp_copy(fds, challenges, op, region, token, offset, address, length) -> (status, errno)"},
    {"local_copy", py_local_copy, METH_VARARGS,
     "local_copy(fd, challenge, pid, write, region, token, offset, address, length, chunk, "
     "threads=1)"
     " -> (status, errno)"},
    {"cuda_local_copy", py_cuda_local_copy, METH_VARARGS,
     "cuda_local_copy(fd, challenge, write, region, token, offset, address, length, chunk, "
     "device, "
     "ipc_handle, ipc_offset) -> (status, errno or CUDA error)"},
    {"seal_load", py_seal_load, METH_VARARGS,
     "seal_load(libcrypto_path): open OpenSSL's libcrypto for sealed copies (OSError if not)"},
    {"cuda_load", py_cuda_load, METH_VARARGS,
     "cuda_load(cudart_path): open the CUDA runtime torch loaded (OSError if it cannot)"},
    {"cuda_ipc_export", py_cuda_ipc_export, METH_VARARGS,
     "cuda_ipc_export(device, pointer) -> ((ipc_handle, offset) or None, CUDA error)"},
    {"cuda_error", py_cuda_error, METH_VARARGS, "cuda_error(code) -> the CUDA error's name"},
    {"hmac_sha256", py_hmac_sha256, METH_VARARGS,
     "hmac_sha256(key, message) -> the 32-byte MAC requests are signed with"},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "monarch_nb.native._memory",
    "Native data plane of monarch_nb: registration table, TCP server, copy engines.", -1,
    methods, NULL, NULL, NULL, NULL,
};

PyMODINIT_FUNC PyInit__memory(void) {
    static int initialised = 0;
    if (!initialised) {
        pthread_condattr_t ca;
        pthread_condattr_init(&ca);
        pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
        pthread_cond_init(&g_cond, &ca);
        pthread_condattr_destroy(&ca);
        pthread_atfork(NULL, NULL, atfork_child);
        initialised = 1;
    }
    PyObject *m = PyModule_Create(&module);
    if (m == NULL) return NULL;
    struct {
        const char *name;
        long value;
    } consts[] = {
        {"OP_READ", OP_READ},
        {"OP_WRITE", OP_WRITE},
        {"OP_LEASE_READ", OP_LEASE_READ},
        {"OP_LEASE_WRITE", OP_LEASE_WRITE},
        {"OP_RELEASE", OP_RELEASE},
        {"OP_QUERY", OP_QUERY},
        {"OP_DROP", OP_DROP},
        {"OP_READ_SEALED", OP_READ_SEALED},
        {"OP_WRITE_SEALED", OP_WRITE_SEALED},
        {"ST_OK", ST_OK},
        {"ST_BAD_MAGIC", ST_BAD_MAGIC},
        {"ST_BAD_VERSION", ST_BAD_VERSION},
        {"ST_BAD_OP", ST_BAD_OP},
        {"ST_UNKNOWN_REGION", ST_UNKNOWN_REGION},
        {"ST_DROPPED", ST_DROPPED},
        {"ST_BAD_TOKEN", ST_BAD_TOKEN},
        {"ST_OUT_OF_RANGE", ST_OUT_OF_RANGE},
        {"ST_READ_ONLY", ST_READ_ONLY},
        {"ST_BUSY", ST_BUSY},
        {"ST_DEVICE_ERROR", ST_DEVICE_ERROR},
        {"ST_SEAL_REQUIRED", ST_SEAL_REQUIRED},
        {"ST_BAD_SEAL", ST_BAD_SEAL},
        {"ST_NO_SEAL", ST_NO_SEAL},
        {"ST_IO_ERROR", ST_IO_ERROR},
        {"ST_EOF", ST_EOF},
        {"ST_BAD_REPLY", ST_BAD_REPLY},
        {"ST_REVOKED", ST_REVOKED},
        {"ST_VM_ERROR", ST_VM_ERROR},
        {"REQUEST_MAGIC", (long)REQ_MAGIC},
        {"REPLY_MAGIC", (long)REP_MAGIC},
        {"PROTOCOL_VERSION", PROTO_VERSION},
        {"REQUEST_SIZE", REQ_SIZE},
        {"REPLY_SIZE", REP_SIZE},
        {"TOKEN_SIZE", TOKEN_SIZE},
        {"HELLO_MAGIC", (long)HELLO_MAGIC},
        {"HELLO_SIZE", HELLO_SIZE},
        {"CHALLENGE_SIZE", CHALLENGE_SIZE},
        {"MAC_SIZE", MAC_SIZE},
        {"MAX_STREAMS", MAX_STREAMS},
        {"SEAL_CHUNK", (long)SEAL_CHUNK},
        {"MAX_CONNECTIONS", MAX_CONNS},
        {"CUDA_IPC_HANDLE_SIZE", CUDA_IPC_HANDLE_SIZE},
    };
    for (size_t i = 0; i < sizeof consts / sizeof consts[0]; i++) {
        if (PyModule_AddIntConstant(m, consts[i].name, consts[i].value) != 0) {
            Py_DECREF(m);
            return NULL;
        }
    }
    return m;
}
