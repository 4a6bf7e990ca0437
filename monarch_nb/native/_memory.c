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
 */

#define PY_SSIZE_T_CLEAN
#include <Python.h>

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "_cuda.h"
#include "_seal.h"
#include "_sha256.h"

#include <sys/random.h>

#ifndef PR_SET_PTRACER
#define PR_SET_PTRACER 0x59616d61
#endif

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

static int same_peer(const conn_t *a, const unsigned char *peer) {
    return memcmp(a->peer, peer, sizeof a->peer) == 0;
}

/* Another host (not loopback, not a Unix socket): only those are held to a
 * share of the verified places, since every local reader is the same "peer". */
static int remote_peer(const unsigned char *peer) {
    if (peer[0] == AF_INET) return peer[1] != 127;
    if (peer[0] == AF_INET6) {
        static const unsigned char loopback[16] = {[15] = 1};
        static const unsigned char mapped127[12] = {[10] = 0xff, [11] = 0xff};
        if (memcmp(peer + 1, loopback, 16) == 0) return 0;
        return !(memcmp(peer + 1, mapped127, 12) == 0 && peer[13] == 127);
    }
    return 0;
}

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t g_cond;
static region_t *g_buckets[NBUCKETS];
static uint64_t g_next_id = 1;
static uint64_t g_region_count = 0;
static uint64_t g_region_bytes = 0;
static conn_t *g_conns = NULL;
static int g_conn_count = 0; /* every open connection */
static int g_unverified = 0; /* of them, not yet verified nor evicted */
static int g_verified = 0;
static int g_max_verified = MAX_CONNS; /* lowered to a quarter of RLIMIT_NOFILE */
static int g_listen_fd = -1;
static int g_unix_fd = -1; /* a Unix socket in the tree's 0700 directory, or -1 */
static int g_server_started = 0;

/* ---------------------------------------------------------------- encoding */

static void put_u16(unsigned char *b, uint16_t v) {
    b[0] = (unsigned char)v;
    b[1] = (unsigned char)(v >> 8);
}

static void put_u32(unsigned char *b, uint32_t v) {
    for (int i = 0; i < 4; i++) b[i] = (unsigned char)(v >> (8 * i));
}

static void put_u64(unsigned char *b, uint64_t v) {
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
}

static uint16_t get_u16(const unsigned char *b) { return (uint16_t)(b[0] | (b[1] << 8)); }

static uint32_t get_u32(const unsigned char *b) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

static uint64_t get_u64(const unsigned char *b) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | b[i];
    return v;
}

static void encode_request(unsigned char *b, const request_t *q) {
    put_u32(b, q->magic);
    put_u16(b + 4, q->version);
    put_u16(b + 6, q->op);
    put_u64(b + 8, q->region);
    put_u64(b + 16, q->nonce);
    put_u64(b + 24, q->offset);
    put_u64(b + 32, q->length);
    memcpy(b + REQ_SIGNED, q->mac, MAC_SIZE);
}

/* The MAC of `q` (its first REQ_SIGNED bytes) under `token` on a connection
 * whose hello carried `challenge`. */
static void request_mac(const request_t *q, const unsigned char *token,
                        const unsigned char *challenge, unsigned char mac[MAC_SIZE]) {
    unsigned char msg[CHALLENGE_SIZE + REQ_SIZE], full[SHA256_SIZE];
    memcpy(msg, challenge, CHALLENGE_SIZE);
    encode_request(msg + CHALLENGE_SIZE, q);
    hmac_sha256(token, TOKEN_SIZE, msg, CHALLENGE_SIZE + REQ_SIGNED, full);
    memcpy(mac, full, MAC_SIZE);
}

static void decode_request(const unsigned char *b, request_t *q) {
    q->magic = get_u32(b);
    q->version = get_u16(b + 4);
    q->op = get_u16(b + 6);
    q->region = get_u64(b + 8);
    q->nonce = get_u64(b + 16);
    q->offset = get_u64(b + 24);
    q->length = get_u64(b + 32);
    memcpy(q->mac, b + REQ_SIGNED, MAC_SIZE);
}

/* --------------------------------------------------------------------- I/O */

/* Returns 0, or an errno value. */
static int send_all(int fd, const void *buf, size_t len) {
    const char *p = (const char *)buf;
    while (len > 0) {
        size_t n = len > IO_CHUNK ? IO_CHUNK : len;
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        p += k;
        len -= (size_t)k;
    }
    return 0;
}

/* Returns 0, -1 on end-of-file before len bytes, or an errno value. */
static int recv_all(int fd, void *buf, size_t len) {
    char *p = (char *)buf;
    while (len > 0) {
        size_t n = len > IO_CHUNK ? IO_CHUNK : len;
        ssize_t k = recv(fd, p, n, 0);
        if (k < 0) {
            if (errno == EINTR) continue;
            return errno;
        }
        if (k == 0) return -1;
        p += k;
        len -= (size_t)k;
    }
    return 0;
}

static int send_reply(int fd, uint32_t status, uint64_t value) {
    unsigned char b[REP_SIZE];
    put_u32(b, REP_MAGIC);
    put_u32(b + 4, status);
    put_u64(b + 8, value);
    return send_all(fd, b, REP_SIZE);
}

/* ------------------------------------------------------------ region table */

static region_t **bucket_of(uint64_t id) { return &g_buckets[id % NBUCKETS]; }

static region_t *find_locked(uint64_t id) {
    for (region_t *r = *bucket_of(id); r != NULL; r = r->next)
        if (r->id == id) return r;
    return NULL;
}

static void remove_locked(region_t *r) {
    region_t **pp = bucket_of(r->id);
    while (*pp != NULL && *pp != r) pp = &(*pp)->next;
    if (*pp == r) *pp = r->next;
    g_region_count--;
    g_region_bytes -= r->size;
    free(r);
}

/* `q` was made by a holder of `r`'s token for this connection, and is not a
 * replay of an earlier request on it (constant-time compare). Lock held. */
static int request_authentic(conn_t *c, const region_t *r, const request_t *q) {
    unsigned char want[MAC_SIZE], diff = 0;
    request_mac(q, r->token, c->challenge, want);
    for (int i = 0; i < MAC_SIZE; i++) diff |= (unsigned char)(want[i] ^ q->mac[i]);
    if (diff != 0 || q->nonce <= c->last_nonce) return 0;
    c->last_nonce = q->nonce;
    return 1;
}

/* Validate a request against the table; on success count a use by `c`. */
/* What a region that cannot be used says, the same whether it never existed,
 * was dropped, or its token is wrong: a reply must not tell a prober which ids
 * are live. (Ids are a counter: "below the next id" is no secret.) */
static uint32_t no_such_region_locked(const request_t *q) {
    return (q->region != 0 && q->region < g_next_id) ? ST_DROPPED : ST_UNKNOWN_REGION;
}

/* `c` showed a live region's token: from now on it counts among the verified
 * connections (ST_BUSY when they are at their cap), and may idle. Lock held. */
static uint32_t verify_conn_locked(conn_t *c) {
    if (c == NULL || c->verified) return ST_OK;
    if (g_verified >= g_max_verified) return ST_BUSY;
    /* Another host, even one holding a token, may take at most half the places. */
    if (remote_peer(c->peer)) {
        int of_peer = 0;
        for (conn_t *o = g_conns; o != NULL; o = o->next)
            if (o->verified && same_peer(o, c->peer)) of_peer++;
        if (of_peer >= g_max_verified / 2) return ST_BUSY;
    }
    c->verified = 1;
    g_verified++;
    if (!c->evicted) g_unverified--;
    struct timeval none = {0, 0};
    setsockopt(c->fd, SOL_SOCKET, SO_RCVTIMEO, &none, sizeof none);
    return ST_OK;
}

static uint32_t acquire(conn_t *c, const request_t *q, int want_write, int lease, region_t **out) {
    uint32_t st = ST_OK;
    pthread_mutex_lock(&g_lock);
    region_t *r = find_locked(q->region);
    if (r == NULL || !request_authentic(c, r, q))
        st = no_such_region_locked(q);
    else if ((st = verify_conn_locked(c)) != ST_OK)
        ;
    else if (r->revoked)
        st = ST_DROPPED;
    else if (want_write && !r->writable)
        st = ST_READ_ONLY;
    else if (q->offset > r->size || q->length > r->size - q->offset)
        st = ST_OUT_OF_RANGE;
    if (st == ST_OK && c != NULL && out != NULL) { /* a use (a query is none) */
        r->users++;
        c->busy = r;
        c->lease = lease;
    }
    if (st == ST_OK && out != NULL) *out = r;
    pthread_mutex_unlock(&g_lock);
    return st;
}

static void release_locked(conn_t *c) {
    region_t *r = c->busy;
    if (r == NULL) return;
    c->busy = NULL;
    c->lease = 0;
    r->users--;
    if (r->users == 0) {
        if (r->orphan) remove_locked(r);
        pthread_cond_broadcast(&g_cond);
    }
}

static void release(conn_t *c) {
    pthread_mutex_lock(&g_lock);
    release_locked(c);
    pthread_mutex_unlock(&g_lock);
}

static void revoke_locked(region_t *r) {
    r->revoked = 1;
    for (conn_t *c = g_conns; c != NULL; c = c->next)
        if (c->busy == r) shutdown(c->fd, c->lease ? SHUT_WR : SHUT_RDWR);
}

/* ------------------------------------------------------------------ server */

static uint32_t serve_drop(conn_t *c, const request_t *q) {
    pthread_mutex_lock(&g_lock);
    uint32_t st = ST_OK;
    region_t *r = find_locked(q->region);
    if (r == NULL || !request_authentic(c, r, q))
        st = no_such_region_locked(q);
    else if ((st = verify_conn_locked(c)) == ST_OK)
        revoke_locked(r);
    pthread_mutex_unlock(&g_lock);
    return st;
}

/* A READ of a CUDA region: device -> page-locked staging -> socket, a chunk at a
 * time. The first chunk is staged before the reply, so a failing device is
 * answered with its error rather than a broken stream. Returns 0 or an errno
 * value (-1 for a device error mid-stream: the connection is closed). */
static int send_device(conn_t *c, region_t *r, const request_t *q) {
    if (c->stage == NULL) {
        int rc = cuda_host_alloc(&c->stage, STAGE_CHUNK);
        if (rc != 0) {
            c->stage = NULL;
            send_reply(c->fd, ST_DEVICE_ERROR, (uint64_t)(unsigned)rc);
            return -1;
        }
    }
    const char *src = (const char *)r->addr + q->offset;
    uint64_t done = 0;
    int header_sent = 0;
    int rc = cuda_sync(r->device); /* what any stream queued before the read lands first */
    if (rc != 0) {
        send_reply(c->fd, ST_DEVICE_ERROR, (uint64_t)(unsigned)rc);
        return -1;
    }
    do {
        size_t n = q->length - done < STAGE_CHUNK ? (size_t)(q->length - done) : STAGE_CHUNK;
        rc = n > 0 ? cuda_copy(r->device, c->stage, src + done, n) : 0;
        if (rc != 0) {
            if (!header_sent) send_reply(c->fd, ST_DEVICE_ERROR, (uint64_t)(unsigned)rc);
            return -1;
        }
        if (!header_sent) {
            int err = send_reply(c->fd, ST_OK, q->length);
            if (err != 0) return err;
            header_sent = 1;
        }
        int err = send_all(c->fd, c->stage, n);
        if (err != 0) return err;
        done += n;
    } while (done < q->length);
    return 0;
}

/* A WRITE to a CUDA region: socket -> staging -> device. A device error is kept
 * in *cuda_rc while the rest of the stream is drained, so the writer reads a
 * reply naming it. Returns 0, or an errno value / -1 if the stream broke. */
static int recv_device(conn_t *c, region_t *r, const request_t *q, int *cuda_rc) {
    if (c->stage == NULL && (*cuda_rc = cuda_host_alloc(&c->stage, STAGE_CHUNK)) != 0) {
        c->stage = NULL;
        send_reply(c->fd, ST_DEVICE_ERROR, (uint64_t)(unsigned)*cuda_rc);
        return -1;
    }
    int err = send_reply(c->fd, ST_OK, q->length);
    char *dst = (char *)r->addr + q->offset;
    for (uint64_t done = 0; err == 0 && done < q->length;) {
        size_t n = q->length - done < STAGE_CHUNK ? (size_t)(q->length - done) : STAGE_CHUNK;
        err = recv_all(c->fd, c->stage, n);
        if (err == 0 && *cuda_rc == 0) *cuda_rc = cuda_copy(r->device, dst + done, c->stage, n);
        done += n;
    }
    return err;
}

/* Where a sealed chunk is made: the CUDA staging buffer for a device region (the
 * chunk must come to the host anyway), a buffer of the connection's otherwise.
 * NULL if it cannot be made. */
static unsigned char *sealing_buffer(conn_t *c, const region_t *r) {
    if (r->device >= 0) {
        if (c->stage == NULL && cuda_host_alloc(&c->stage, STAGE_CHUNK) != 0) c->stage = NULL;
        return (unsigned char *)c->stage;
    }
    if (c->seal_buf == NULL) c->seal_buf = (unsigned char *)malloc(SEAL_CHUNK);
    return c->seal_buf;
}

/* READ_SEALED: each chunk is copied out of the region (through the staging
 * buffer for a device region), sealed and sent with its tag. Returns 0, or an
 * errno value / -1 (the connection is closed). */
static int send_sealed(conn_t *c, region_t *r, const request_t *q) {
    unsigned char *buf = sealing_buffer(c, r), key[SEAL_KEY_SIZE], tag[SEAL_TAG_SIZE];
    if (buf == NULL || (r->device >= 0 && cuda_sync(r->device) != 0)) {
        send_reply(c->fd, buf == NULL ? ST_BUSY : ST_DEVICE_ERROR, 0);
        return -1;
    }
    seal_key(r->token, TOKEN_SIZE, c->challenge, CHALLENGE_SIZE, key);
    int err = send_reply(c->fd, ST_OK, q->length);
    const unsigned char *src = (const unsigned char *)r->addr + q->offset;
    uint64_t done = 0;
    for (uint32_t i = 0; err == 0 && done < q->length; i++) {
        size_t n = q->length - done < SEAL_CHUNK ? (size_t)(q->length - done) : SEAL_CHUNK;
        const unsigned char *from = src + done;
        if (r->device >= 0) {
            if (cuda_copy(r->device, buf, from, n) != 0) return -1;
            from = buf;
        }
        if (seal_chunk(key, q->nonce, i, from, buf, n, tag) != 0) return -1;
        err = send_all(c->fd, buf, n);
        if (err == 0) err = send_all(c->fd, tag, SEAL_TAG_SIZE);
        done += n;
    }
    return err;
}

/* WRITE_SEALED: each chunk is received, opened in the connection's buffer and
 * only then copied into the region, so a forged chunk never lands. A failed tag
 * is kept in *seal_st while the rest of the stream is drained. Returns 0, or an
 * errno value / -1 if the stream broke. */
static int recv_sealed(conn_t *c, region_t *r, const request_t *q, uint32_t *seal_st) {
    unsigned char *buf = sealing_buffer(c, r), key[SEAL_KEY_SIZE], tag[SEAL_TAG_SIZE];
    if (buf == NULL) {
        send_reply(c->fd, ST_BUSY, 0);
        return -1;
    }
    seal_key(r->token, TOKEN_SIZE, c->challenge, CHALLENGE_SIZE, key);
    int err = send_reply(c->fd, ST_OK, q->length);
    unsigned char *dst = (unsigned char *)r->addr + q->offset;
    uint64_t done = 0;
    for (uint32_t i = 0; err == 0 && done < q->length; i++) {
        size_t n = q->length - done < SEAL_CHUNK ? (size_t)(q->length - done) : SEAL_CHUNK;
        err = recv_all(c->fd, buf, n);
        if (err == 0) err = recv_all(c->fd, tag, SEAL_TAG_SIZE);
        if (err == 0 && *seal_st == ST_OK) {
            if (open_chunk(key, q->nonce, i, buf, buf, n, tag) != 0)
                *seal_st = ST_BAD_SEAL;
            else if (r->device >= 0 && cuda_copy(r->device, dst + done, buf, n) != 0)
                *seal_st = ST_DEVICE_ERROR;
            else if (r->device < 0)
                memcpy(dst + done, buf, n);
        }
        done += n;
    }
    return err;
}

/* Plain bytes of a sealed region may leave only through the Unix socket. */
static int needs_seal(const conn_t *c, const region_t *r) {
    return r->sealed && c->peer[0] != AF_UNIX;
}

/* Serve one request; returns 1 to keep the connection, 0 to close it. */
static int serve_one(conn_t *c, const request_t *q) {
    region_t *r = NULL;
    uint32_t st;
    int err;
    if (q->magic != REQ_MAGIC) {
        send_reply(c->fd, ST_BAD_MAGIC, 0);
        return 0;
    }
    if (q->version != PROTO_VERSION) {
        send_reply(c->fd, ST_BAD_VERSION, PROTO_VERSION);
        return 0;
    }
    switch (q->op) {
    case OP_READ:
        st = acquire(c, q, 0, 0, &r);
        if (st != ST_OK) {
            send_reply(c->fd, st, 0);
            return 0;
        }
        if (needs_seal(c, r)) {
            release(c);
            send_reply(c->fd, ST_SEAL_REQUIRED, 0);
            return 0;
        }
        if (r->device >= 0) {
            err = send_device(c, r, q);
            release(c);
            return err == 0;
        }
        err = send_reply(c->fd, ST_OK, q->length);
        if (err == 0) err = send_all(c->fd, (const char *)r->addr + q->offset, q->length);
        release(c);
        return err == 0;
    case OP_WRITE:
        st = acquire(c, q, 1, 0, &r);
        if (st != ST_OK) {
            send_reply(c->fd, st, 0);
            return 0;
        }
        if (needs_seal(c, r)) {
            release(c);
            send_reply(c->fd, ST_SEAL_REQUIRED, 0);
            return 0;
        }
        if (r->device >= 0) {
            int cuda_rc = 0;
            err = recv_device(c, r, q, &cuda_rc);
            release(c);
            if (err != 0) return 0;
            if (cuda_rc != 0) return send_reply(c->fd, ST_DEVICE_ERROR, (uint64_t)cuda_rc) == 0;
            return send_reply(c->fd, ST_OK, q->length) == 0;
        }
        err = send_reply(c->fd, ST_OK, q->length);
        if (err == 0) err = recv_all(c->fd, (char *)r->addr + q->offset, q->length);
        release(c);
        if (err != 0) return 0;
        return send_reply(c->fd, ST_OK, q->length) == 0;
    case OP_READ_SEALED:
    case OP_WRITE_SEALED: {
        int write = q->op == OP_WRITE_SEALED;
        if (!seal_loaded()) {
            send_reply(c->fd, ST_NO_SEAL, 0);
            return 0;
        }
        st = acquire(c, q, write, 0, &r);
        if (st != ST_OK) {
            send_reply(c->fd, st, 0);
            return 0;
        }
        if (!write) {
            err = send_sealed(c, r, q);
            release(c);
            return err == 0;
        }
        uint32_t seal_st = ST_OK;
        err = recv_sealed(c, r, q, &seal_st);
        release(c);
        if (err != 0) return 0;
        return send_reply(c->fd, seal_st, seal_st == ST_OK ? q->length : 0) == 0 &&
               seal_st == ST_OK;
    }
    case OP_LEASE_READ:
    case OP_LEASE_WRITE: {
        unsigned char b[REQ_SIZE];
        request_t end;
        st = acquire(c, q, q->op == OP_LEASE_WRITE, 1, &r);
        if (st != ST_OK) {
            send_reply(c->fd, st, 0);
            return 0;
        }
        /* A CUDA region is leased once the work queued on its device is done:
         * the reader copies in another context, which is not ordered after ours. */
        if (r->device >= 0) {
            int rc = cuda_sync(r->device);
            if (rc != 0) {
                release(c);
                send_reply(c->fd, ST_DEVICE_ERROR, (uint64_t)(unsigned)rc);
                return 0;
            }
        }
        /* The reader copies now; we only wait for it to say it has stopped. */
        err = send_reply(c->fd, ST_OK, (uint64_t)r->addr);
        if (err == 0) err = recv_all(c->fd, b, REQ_SIZE);
        release(c);
        if (err != 0) return 0;
        /* RELEASE only gives the lease up, as closing the connection would: it
         * needs no MAC. */
        decode_request(b, &end);
        if (end.magic != REQ_MAGIC || end.op != OP_RELEASE) {
            send_reply(c->fd, ST_BAD_OP, 0);
            return 0;
        }
        return send_reply(c->fd, ST_OK, 0) == 0;
    }
    case OP_QUERY:
        st = acquire(c, q, 0, 0, NULL);
        if (st != ST_OK) {
            send_reply(c->fd, st, 0);
            return 0;
        }
        return send_reply(c->fd, ST_OK, 0) == 0;
    case OP_DROP:
        st = serve_drop(c, q);
        send_reply(c->fd, st, 0);
        return st == ST_OK;
    default:
        send_reply(c->fd, ST_BAD_OP, 0);
        return 0;
    }
}

static void unlink_conn_locked(conn_t *c) {
    if (c->prev != NULL)
        c->prev->next = c->next;
    else
        g_conns = c->next;
    if (c->next != NULL) c->next->prev = c->prev;
    g_conn_count--;
    if (c->verified)
        g_verified--;
    else if (!c->evicted)
        g_unverified--;
}

/* Make room for a new connection from `peer`: shut down the oldest unverified
 * connection of that peer if it holds its share, else the oldest of all (its
 * thread then closes it). New connections go to the head of the list, so the
 * oldest is the last one found. Lock held. */
static void make_room_locked(const unsigned char *peer) {
    conn_t *oldest = NULL, *oldest_of_peer = NULL;
    int of_peer = 0;
    for (conn_t *c = g_conns; c != NULL; c = c->next) {
        if (c->verified || c->evicted) continue;
        oldest = c;
        if (same_peer(c, peer)) {
            oldest_of_peer = c;
            of_peer++;
        }
    }
    if (of_peer >= MAX_UNVERIFIED_PER_PEER)
        oldest = oldest_of_peer;
    else if (g_unverified < MAX_UNVERIFIED)
        return;
    if (oldest == NULL) return;
    oldest->evicted = 1;
    g_unverified--;
    shutdown(oldest->fd, SHUT_RDWR);
}

static void *conn_main(void *arg) {
    conn_t *c = (conn_t *)arg;
    unsigned char b[REQ_SIZE];
    request_t q;
    int one = 1;
    setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    unsigned char hello[HELLO_SIZE];
    put_u32(hello, HELLO_MAGIC);
    memcpy(hello + 4, c->challenge, CHALLENGE_SIZE);
    int ok = send_all(c->fd, hello, HELLO_SIZE) == 0;
    while (ok && recv_all(c->fd, b, REQ_SIZE) == 0) {
        decode_request(b, &q);
        if (!serve_one(c, &q)) break;
    }
    pthread_mutex_lock(&g_lock);
    release_locked(c);
    unlink_conn_locked(c);
    pthread_mutex_unlock(&g_lock);
    close(c->fd);
    cuda_host_free(c->stage);
    free(c->seal_buf);
    free(c);
    return NULL;
}

/* The process at the other end of a Unix socket runs as our user. */
static int same_user(int fd) {
    struct ucred cred;
    socklen_t len = sizeof cred;
    return getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0 && cred.uid == geteuid();
}

/* Name a connection's peer: its IP address, or its uid on a Unix socket. */
static void peer_of(int fd, const struct sockaddr_storage *addr, unsigned char peer[17]) {
    memset(peer, 0, 17);
    peer[0] = (unsigned char)addr->ss_family;
    if (addr->ss_family == AF_INET) {
        memcpy(peer + 1, &((const struct sockaddr_in *)addr)->sin_addr, 4);
    } else if (addr->ss_family == AF_INET6) {
        memcpy(peer + 1, &((const struct sockaddr_in6 *)addr)->sin6_addr, 16);
    } else {
        struct ucred cred;
        socklen_t len = sizeof cred;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) == 0)
            memcpy(peer + 1, &cred.uid, sizeof cred.uid);
    }
}

static void *accept_main(void *arg) {
    (void)arg;
    pthread_attr_t attr;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    pthread_attr_setstacksize(&attr, 256 * 1024);
    for (;;) {
        struct pollfd ready[2] = {{g_listen_fd, POLLIN, 0}, {g_unix_fd, POLLIN, 0}};
        if (poll(ready, g_unix_fd >= 0 ? 2 : 1, -1) < 0) {
            if (errno == EINTR) continue;
            break;
        }
        if (ready[0].revents & POLLNVAL) break; /* the listening socket is gone */
        int from = (ready[0].revents & (POLLIN | POLLERR | POLLHUP)) ? g_listen_fd : g_unix_fd;
        struct sockaddr_storage addr;
        socklen_t addr_len = sizeof addr;
        /* The listening sockets are non-blocking (a connection may vanish between
         * poll and accept); accepted ones are blocking, as on Linux they are. */
        int fd = accept4(from, (struct sockaddr *)&addr, &addr_len, SOCK_CLOEXEC);
        if (fd >= 0 && from == g_unix_fd && !same_user(fd)) {
            close(fd); /* the directory is 0700 already; this is a second lock */
            continue;
        }
        if (fd < 0) {
            if (errno == EAGAIN || errno == EWOULDBLOCK) continue;
            if (errno == EINTR || errno == ECONNABORTED || errno == EPROTO) continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                struct timespec pause = {0, 10 * 1000 * 1000};
                nanosleep(&pause, NULL);
                continue;
            }
            break; /* the listening socket is gone */
        }
        /* Until it shows a token, a connection must send a request in time. */
        struct timeval preauth = {PREAUTH_TIMEOUT_S, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &preauth, sizeof preauth);
        conn_t *c = (conn_t *)calloc(1, sizeof *c);
        if (c == NULL || getrandom(c->challenge, CHALLENGE_SIZE, 0) != CHALLENGE_SIZE) {
            send_reply(fd, ST_BUSY, 0);
            close(fd);
            free(c);
            continue;
        }
        pthread_mutex_lock(&g_lock);
        peer_of(fd, &addr, c->peer);
        make_room_locked(c->peer);
        c->fd = fd;
        c->next = g_conns;
        if (g_conns != NULL) g_conns->prev = c;
        g_conns = c;
        g_conn_count++;
        g_unverified++;
        pthread_mutex_unlock(&g_lock);
        pthread_t t;
        if (pthread_create(&t, &attr, conn_main, c) != 0) {
            pthread_mutex_lock(&g_lock);
            unlink_conn_locked(c);
            pthread_mutex_unlock(&g_lock);
            send_reply(fd, ST_BUSY, 0);
            close(fd);
            free(c);
        }
    }
    pthread_attr_destroy(&attr);
    return NULL;
}

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

static int exchange(int fd, const request_t *q, uint32_t *status, uint64_t *value, int *err) {
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

static void make_request(request_t *q, uint16_t op, uint64_t region, const unsigned char *token,
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
static void run_parallel(void *(*fn)(void *), void *items, size_t item_size, int n) {
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

static PyObject *py_register(PyObject *self, PyObject *args) {
    unsigned long long addr, size;
    const char *token;
    Py_ssize_t token_len;
    int writable, device = -1, sealed = 0;
    if (!PyArg_ParseTuple(args, "KKy#p|ip", &addr, &size, &token, &token_len, &writable, &device,
                          &sealed))
        return NULL;
    if (device >= 0 && !cuda_loaded()) {
        PyErr_SetString(PyExc_RuntimeError, "register a CUDA region only after cuda_load()");
        return NULL;
    }
    if (token_len != TOKEN_SIZE) {
        PyErr_Format(PyExc_ValueError, "token must be %d bytes, got %zd", TOKEN_SIZE, token_len);
        return NULL;
    }
    region_t *r = (region_t *)calloc(1, sizeof *r);
    if (r == NULL) return PyErr_NoMemory();
    r->addr = (uintptr_t)addr;
    r->size = size;
    r->writable = writable;
    r->device = device < 0 ? -1 : device;
    r->sealed = sealed;
    memcpy(r->token, token, TOKEN_SIZE);
    pthread_mutex_lock(&g_lock);
    r->id = g_next_id++;
    region_t **b = bucket_of(r->id);
    r->next = *b;
    *b = r;
    g_region_count++;
    g_region_bytes += size;
    pthread_mutex_unlock(&g_lock);
    return PyLong_FromUnsignedLongLong(r->id);
}

static PyObject *py_unregister(PyObject *self, PyObject *args) {
    unsigned long long id;
    double timeout;
    if (!PyArg_ParseTuple(args, "Kd", &id, &timeout)) return NULL;
    int left = 0;
    Py_BEGIN_ALLOW_THREADS
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    if (timeout < 0) timeout = 0;
    deadline.tv_sec += (time_t)timeout;
    deadline.tv_nsec += (long)((timeout - (double)(time_t)timeout) * 1e9);
    if (deadline.tv_nsec >= 1000000000L) {
        deadline.tv_sec += 1;
        deadline.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&g_lock);
    region_t *r = find_locked(id);
    if (r != NULL) {
        revoke_locked(r);
        while (r->users > 0) {
            if (pthread_cond_timedwait(&g_cond, &g_lock, &deadline) == ETIMEDOUT) break;
        }
        left = r->users;
        if (left == 0)
            remove_locked(r);
        else
            r->orphan = 1;
    }
    pthread_mutex_unlock(&g_lock);
    Py_END_ALLOW_THREADS
    return PyLong_FromLong(left);
}

static PyObject *py_set_ptracer(PyObject *self, PyObject *args) {
    unsigned long pid;
    if (!PyArg_ParseTuple(args, "k", &pid)) return NULL;
    int rc = prctl(PR_SET_PTRACER, pid, 0, 0, 0);
    return PyLong_FromLong(rc == 0 ? 0 : errno);
}

static PyObject *py_server_start(PyObject *self, PyObject *args) {
    int fd, unix_fd = -1;
    if (!PyArg_ParseTuple(args, "i|i", &fd, &unix_fd)) return NULL;
    /* Verified connections stay well under the file limit, so a full table
     * never makes this process's own open() fail with EMFILE. */
    struct rlimit files;
    int cap = MAX_CONNS;
    if (getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur != RLIM_INFINITY &&
        files.rlim_cur / 4 < (rlim_t)cap)
        cap = files.rlim_cur / 4 > 16 ? (int)(files.rlim_cur / 4) : 16;
    pthread_mutex_lock(&g_lock);
    int started = g_server_started;
    if (!started) {
        g_server_started = 1;
        g_listen_fd = fd;
        g_unix_fd = unix_fd;
        g_max_verified = cap;
    }
    pthread_mutex_unlock(&g_lock);
    if (started) {
        PyErr_SetString(PyExc_RuntimeError, "the RDMA server of this process is already running");
        return NULL;
    }
    pthread_attr_t attr;
    pthread_t t;
    pthread_attr_init(&attr);
    pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
    int rc = pthread_create(&t, &attr, accept_main, NULL);
    pthread_attr_destroy(&attr);
    if (rc != 0) {
        pthread_mutex_lock(&g_lock);
        g_server_started = 0;
        g_listen_fd = -1;
        pthread_mutex_unlock(&g_lock);
        errno = rc;
        return PyErr_SetFromErrno(PyExc_OSError);
    }
    Py_RETURN_NONE;
}

static PyObject *py_stats(PyObject *self, PyObject *noargs) {
    pthread_mutex_lock(&g_lock);
    unsigned long long regions = g_region_count, bytes = g_region_bytes;
    int conns = g_conn_count, started = g_server_started;
    pthread_mutex_unlock(&g_lock);
    return Py_BuildValue("(KKii)", regions, bytes, conns, started);
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

static int parse_token(PyObject *obj, unsigned char *token) {
    return parse_fixed(obj, token, TOKEN_SIZE, "token");
}

static int parse_challenge(PyObject *obj, unsigned char *challenge) {
    return parse_fixed(obj, challenge, CHALLENGE_SIZE, "challenge");
}

static PyObject *py_request(PyObject *self, PyObject *args) {
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

static PyObject *py_tcp_copy(PyObject *self, PyObject *args) {
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

static PyObject *py_local_copy(PyObject *self, PyObject *args) {
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
static PyObject *py_cuda_local_copy(PyObject *self, PyObject *args) {
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
