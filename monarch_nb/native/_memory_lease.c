/*
 * Same-host copies (piece 3 in _memory.c): the reader leases a region from its
 * owner, copies it itself (process_vm_readv/writev, or CUDA IPC for a device
 * region) while it watches the lease for revocation, and releases it.
 */
#include "_memory.h"

#include <errno.h>
#include <poll.h>
#include <sys/uio.h>

#include "_cuda.h"

typedef struct {
    int fd; /* the lease connection, polled for revocation (-1: do not poll) */
    int pid;
    int is_write;
    uint64_t local;  /* local address of this part */
    uint64_t remote; /* remote address of this part */
    uint64_t length;
    uint64_t chunk;
    volatile int *stop; /* set by any part that fails or sees revocation */
    uint32_t status;
    int err;
} vm_part_t;

static void *vm_copy(void *arg) {
    vm_part_t *v = (vm_part_t *)arg;
    uint64_t done = 0;
    while (done < v->length) {
        if (__atomic_load_n(v->stop, __ATOMIC_ACQUIRE)) {
            v->status = ST_REVOKED;
            return NULL;
        }
        size_t n = (size_t)(v->length - done < v->chunk ? v->length - done : v->chunk);
        struct iovec lv = {(void *)(uintptr_t)(v->local + done), n};
        struct iovec rv = {(void *)(uintptr_t)(v->remote + done), n};
        ssize_t k = v->is_write ? process_vm_writev(v->pid, &lv, 1, &rv, 1, 0)
                                : process_vm_readv(v->pid, &lv, 1, &rv, 1, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            v->status = ST_VM_ERROR;
            v->err = k < 0 ? errno : EFAULT;
            __atomic_store_n(v->stop, 1, __ATOMIC_RELEASE);
            return NULL;
        }
        done += (uint64_t)k;
        if (v->fd >= 0 && done < v->length) {
            struct pollfd p = {v->fd, POLLIN, 0};
            if (poll(&p, 1, 0) > 0) {
                v->status = ST_REVOKED;
                __atomic_store_n(v->stop, 1, __ATOMIC_RELEASE);
                return NULL;
            }
        }
    }
    return NULL;
}

/* Ask for a lease on [offset, offset+length) of a region: 1 and the region's
 * address in *base if granted, else 0 with the refusal in *status. GIL released. */
static int begin_lease(int fd, const unsigned char *challenge, int is_write, uint64_t region,
                       const unsigned char *token, uint64_t offset, uint64_t length,
                       uint32_t *status, uint64_t *base, int *err) {
    request_t q;
    make_request(&q, is_write ? OP_LEASE_WRITE : OP_LEASE_READ, region, token, challenge, offset,
                 length);
    return exchange(fd, &q, status, base, err) == 0;
}

/* Send RELEASE for a lease: the owner counts the region in use until it arrives.
 * A copy that went well fails if the owner cannot confirm (it revoked the lease
 * or died meanwhile). GIL released. */
static void end_lease(int fd, const unsigned char *challenge, uint64_t region,
                      const unsigned char *token, uint32_t *status, int *err) {
    request_t q;
    uint32_t end_status = ST_OK;
    uint64_t ignored;
    int end_err = 0;
    make_request(&q, OP_RELEASE, region, token, challenge, 0, 0);
    if (exchange(fd, &q, &end_status, &ignored, &end_err) != 0 && *status == ST_OK) {
        *status = (end_status == ST_EOF || end_status == ST_IO_ERROR) ? ST_REVOKED : end_status;
        *err = end_err;
    }
}

PyObject *py_local_copy(PyObject *self, PyObject *args) {
    int fd, pid, is_write, nthreads = 1;
    unsigned long long region, offset, local, length, chunk;
    PyObject *tok, *hello;
    unsigned char token[TOKEN_SIZE], challenge[CHALLENGE_SIZE];
    if (!PyArg_ParseTuple(args, "iSipKSKKKK|i", &fd, &hello, &pid, &is_write, &region, &tok,
                          &offset, &local, &length, &chunk, &nthreads))
        return NULL;
    if (parse_token(tok, token) != 0 || parse_challenge(hello, challenge) != 0) return NULL;
    if (chunk == 0) chunk = 16 << 20;
    if (nthreads < 1) nthreads = 1;
    if (nthreads > MAX_STREAMS) nthreads = MAX_STREAMS;
    uint32_t status = ST_OK;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    uint64_t base = 0;
    if (begin_lease(fd, challenge, is_write, region, token, offset, length, &status, &base,
                    &err)) {
        /* The owner tells us where the region lives: the handle is not trusted for it.
         * Parts run in parallel; only the first polls the lease, the others stop via
         * the shared flag, and all have stopped before RELEASE is sent. */
        volatile int stop = 0;
        vm_part_t parts[MAX_STREAMS];
        uint64_t part = (length + (uint64_t)nthreads - 1) / (uint64_t)nthreads;
        part = (part + 4095) & ~(uint64_t)4095;
        int used = 0;
        for (uint64_t pos = 0; used == 0 || (pos < length && used < nthreads); used++) {
            uint64_t len = length - pos < part ? length - pos : part;
            parts[used] = (vm_part_t){used == 0 ? fd : -1, pid, is_write, local + pos,
                                      base + offset + pos, len, chunk, &stop, ST_OK, 0};
            pos += len;
        }
        run_parallel(vm_copy, parts, sizeof parts[0], used);
        for (int i = 0; i < used && status == ST_OK; i++) {
            if (parts[i].status != ST_OK) {
                status = parts[i].status;
                err = parts[i].err;
            }
        }
        /* A part stopped by another's failure reports REVOKED: prefer the real cause. */
        for (int i = 0; i < used; i++) {
            if (parts[i].status == ST_VM_ERROR) {
                status = ST_VM_ERROR;
                err = parts[i].err;
            }
        }
        /* Always say we stopped: the owner keeps the region pinned until then. */
        end_lease(fd, challenge, region, token, &status, &err);
    }
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(Ii)", status, err);
}

/* The lease-and-copy of py_local_copy for a CUDA region on this host: the
 * region is mapped with CUDA IPC (or used directly in its own process), copied
 * with cudaMemcpy in chunks while the lease is polled for revocation, unmapped,
 * and only then released. */
PyObject *py_cuda_local_copy(PyObject *self, PyObject *args) {
    int fd, is_write, device;
    unsigned long long region, offset, local, length, chunk, ipc_offset;
    PyObject *tok, *hello;
    const char *ipc;
    Py_ssize_t ipc_len;
    unsigned char token[TOKEN_SIZE], challenge[CHALLENGE_SIZE];
    if (!PyArg_ParseTuple(args, "iSpKSKKKKiy#K", &fd, &hello, &is_write, &region, &tok, &offset,
                          &local, &length, &chunk, &device, &ipc, &ipc_len, &ipc_offset))
        return NULL;
    if (parse_token(tok, token) != 0 || parse_challenge(hello, challenge) != 0) return NULL;
    if (ipc_len != 0 && ipc_len != CUDA_IPC_HANDLE_SIZE) {
        PyErr_Format(PyExc_ValueError, "an IPC handle has %d bytes, got %zd",
                     CUDA_IPC_HANDLE_SIZE, ipc_len);
        return NULL;
    }
    if (!cuda_loaded()) {
        PyErr_SetString(PyExc_RuntimeError, "cuda_local_copy needs cuda_load() first");
        return NULL;
    }
    if (chunk == 0) chunk = 16 << 20;
    uint32_t status = ST_OK;
    int err = 0;
    Py_BEGIN_ALLOW_THREADS
    uint64_t base = 0;
    int granted = begin_lease(fd, challenge, is_write, region, token, offset, length, &status,
                              &base, &err);
    if (!granted && ipc_len != 0 && (status == ST_DROPPED || status == ST_UNKNOWN_REGION))
        cuda_ipc_forget(device, (const unsigned char *)ipc);
    if (granted) {
        void *mapped = NULL;
        int slot = -1;
        char *remote = (char *)(uintptr_t)base; /* in the owner's own process */
        if (ipc_len != 0) {
            int rc = cuda_ipc_map(device, (const unsigned char *)ipc, &mapped, &slot);
            if (rc != 0) {
                status = ST_DEVICE_ERROR;
                err = rc;
            } else {
                remote = (char *)mapped + ipc_offset;
            }
        }
        for (uint64_t done = 0; status == ST_OK && done < length;) {
            size_t n = (size_t)(length - done < chunk ? length - done : chunk);
            char *there = remote + offset + done, *here = (char *)(uintptr_t)(local + done);
            int rc = is_write ? cuda_copy(device, there, here, n) : cuda_copy(device, here, there, n);
            if (rc != 0) {
                status = ST_DEVICE_ERROR;
                err = rc;
                break;
            }
            done += n;
            struct pollfd p = {fd, POLLIN, 0};
            if (done < length && poll(&p, 1, 0) > 0) status = ST_REVOKED;
        }
        /* Device-to-device copies return before they finish: every copy is over
         * before the lease ends (the owner may free the memory after it). */
        int rc = cuda_stream_sync(device);
        if (rc != 0 && status == ST_OK) {
            status = ST_DEVICE_ERROR;
            err = rc;
        }
        if (mapped != NULL) cuda_ipc_done(device, mapped, slot);
        end_lease(fd, challenge, region, token, &status, &err);
    }
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(Ii)", status, err);
}
