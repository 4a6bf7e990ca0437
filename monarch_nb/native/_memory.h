/*
 * Private declarations of monarch_nb.native._memory, shared by its files (the
 * design is in _memory.c): the protocol's constants and records, the tables
 * kept under g_lock, and what one file calls in another. Nothing here is
 * exported from the extension (it is built with -fvisibility=hidden).
 *
 * Included first: it includes Python.h, which must come before any system
 * header (and defines _GNU_SOURCE, which accept4, process_vm_readv and
 * struct ucred need).
 */
#ifndef MONARCH_NB_MEMORY_H
#define MONARCH_NB_MEMORY_H

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define REQ_MAGIC 0x524e424dU   /* "MNBR" little endian */
#define REP_MAGIC 0x414e424dU   /* "MNBA" little endian */
#define HELLO_MAGIC 0x484e424dU /* "MNBH" little endian */
#define PROTO_VERSION 2
#define REQ_SIZE 56
#define REQ_SIGNED 40 /* the bytes the MAC covers, after the challenge */
#define REP_SIZE 16
#define HELLO_SIZE 20
#define TOKEN_SIZE 16
#define CHALLENGE_SIZE 16
#define MAC_SIZE 16
#define NBUCKETS 1024
#define MAX_CONNS 1024
/* Connections that have not yet shown a region's token: at most this many (a
 * new one evicts the oldest), each closed if it sends no request in time. A
 * real reader sends its request as it connects, so a flood of idle or silent
 * connections can neither fill the table nor keep readers out. */
#define MAX_UNVERIFIED 64
/* Of those, at most this many from one peer (address, or uid on a Unix socket):
 * a flood from one host evicts its own connections, not other hosts'. */
#define MAX_UNVERIFIED_PER_PEER 16
#define PREAUTH_TIMEOUT_S 10
#define MAX_STREAMS 16
#define IO_CHUNK ((size_t)64 << 20)
/* A CUDA region is served through a page-locked buffer of this size per connection. */
#define STAGE_CHUNK ((size_t)8 << 20)

enum {
    OP_READ = 1,
    OP_WRITE = 2,
    OP_LEASE_READ = 3,
    OP_LEASE_WRITE = 4,
    OP_RELEASE = 5,
    OP_QUERY = 6,
    OP_DROP = 7,
    OP_READ_SEALED = 8,  /* READ, the stream in AES-256-GCM chunks (see _seal.h) */
    OP_WRITE_SEALED = 9, /* WRITE, likewise */
};

enum {
    ST_OK = 0,
    /* refused by the owner */
    ST_BAD_MAGIC = 1,
    ST_BAD_VERSION = 2,
    ST_BAD_OP = 3,
    ST_UNKNOWN_REGION = 4,
    ST_DROPPED = 5,
    ST_BAD_TOKEN = 6,
    ST_OUT_OF_RANGE = 7,
    ST_READ_ONLY = 8,
    ST_BUSY = 9,
    ST_DEVICE_ERROR = 10, /* a CUDA call failed; the value is its error code */
    ST_SEAL_REQUIRED = 11, /* this region crosses the network only sealed */
    ST_BAD_SEAL = 12,      /* a sealed chunk failed its tag (or sealing failed) */
    ST_NO_SEAL = 13,       /* the owner cannot seal (no libcrypto loaded) */
    /* seen by the client */
    ST_IO_ERROR = 100,
    ST_EOF = 101,
    ST_BAD_REPLY = 102,
    ST_REVOKED = 103,
    ST_VM_ERROR = 104,
};

typedef struct {
    uint32_t magic;
    uint16_t version;
    uint16_t op;
    uint64_t region;
    uint64_t nonce;
    uint64_t offset;
    uint64_t length;
    unsigned char mac[MAC_SIZE];
} request_t;

typedef struct region {
    uint64_t id;
    uintptr_t addr;
    uint64_t size;
    unsigned char token[TOKEN_SIZE];
    int writable;
    int device; /* the CUDA device holding it, or -1 for host memory */
    int sealed; /* plain READ/WRITE only from this host's Unix socket */
    int revoked;
    int orphan; /* unregister gave up waiting: the last user frees the record */
    int users;
    struct region *next;
} region_t;

typedef struct conn {
    int fd;
    region_t *busy; /* the region this connection is using, or NULL */
    int lease;
    int verified; /* it has shown a live region's token */
    int evicted;  /* shut down to make room for a newer unverified connection */
    void *stage;  /* page-locked staging for CUDA regions, made on first use */
    unsigned char *seal_buf; /* a chunk being sealed or opened, made on first use */
    unsigned char peer[17]; /* who connected: family byte + address (or uid) */
    unsigned char challenge[CHALLENGE_SIZE]; /* sent in the hello */
    uint64_t last_nonce;                     /* of the last request verified */
    struct conn *prev, *next;
} conn_t;

/* ---------------------------------------------------------------- encoding */

static inline void put_u16(unsigned char *b, uint16_t v) {
    b[0] = (unsigned char)v;
    b[1] = (unsigned char)(v >> 8);
}

static inline void put_u32(unsigned char *b, uint32_t v) {
    for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
}

static inline void put_u64(unsigned char *b, uint64_t v) {
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
}

static inline uint16_t get_u16(const unsigned char *b) { return (uint16_t)(b[0] | (b[1] << 8)); }

static inline uint32_t get_u32(const unsigned char *b) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

static inline uint64_t get_u64(const unsigned char *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

/* ------------------------------------------- _memory_protocol.c: the wire */

void encode_request(unsigned char *b, const request_t *q);
void decode_request(const unsigned char *b, request_t *q);
void request_mac(const request_t *q, const unsigned char *token, const unsigned char *challenge,
                 unsigned char mac[MAC_SIZE]);
int send_all(int fd, const void *buf, size_t len);
int recv_all(int fd, void *buf, size_t len);
int send_reply(int fd, uint32_t status, uint64_t value);

/* ------------------------------- _memory_registry.c: the tables, g_lock */

extern pthread_mutex_t g_lock;
extern pthread_cond_t g_cond;
extern region_t *g_buckets[NBUCKETS];
extern uint64_t g_region_count;
extern uint64_t g_region_bytes;
extern conn_t *g_conns;
extern int g_conn_count;
extern int g_unverified;
extern int g_verified;
extern int g_max_verified;
extern int g_listen_fd;
extern int g_unix_fd;
extern int g_server_started;

int same_peer(const conn_t *a, const unsigned char *peer);
region_t *find_locked(uint64_t id);
int request_authentic(conn_t *c, const region_t *r, const request_t *q);
uint32_t no_such_region_locked(const request_t *q);
uint32_t verify_conn_locked(conn_t *c);
uint32_t acquire(conn_t *c, const request_t *q, int want_write, int lease, region_t **out);
void release_locked(conn_t *c);
void release(conn_t *c);
void revoke_locked(region_t *r);
PyObject *py_register(PyObject *self, PyObject *args);
PyObject *py_unregister(PyObject *self, PyObject *args);
PyObject *py_stats(PyObject *self, PyObject *noargs);

/* ------------------------------------------------ _memory_server.c: serving */

PyObject *py_server_start(PyObject *self, PyObject *args);

/* ------------------------------------- _memory_client.c: the copy engines */

int exchange(int fd, const request_t *q, uint32_t *status, uint64_t *value, int *err);
void make_request(request_t *q, uint16_t op, uint64_t region, const unsigned char *token,
                  const unsigned char *challenge, uint64_t offset, uint64_t length);
void run_parallel(void *(*fn)(void *), void *items, size_t item_size, int n);
int parse_token(PyObject *obj, unsigned char *token);
int parse_challenge(PyObject *obj, unsigned char *challenge);
PyObject *py_request(PyObject *self, PyObject *args);
PyObject *py_tcp_copy(PyObject *self, PyObject *args);

/* ------------------------------------ _memory_lease.c: same-host copies */

PyObject *py_local_copy(PyObject *self, PyObject *args);
PyObject *py_cuda_local_copy(PyObject *self, PyObject *args);

#endif
