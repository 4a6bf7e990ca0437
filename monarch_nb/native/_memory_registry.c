/*
 * The registration table (piece 1 in _memory.c): region id -> region, the
 * connections that use regions, and the one lock over both. Registering,
 * revoking, and counting a connection's use of a region happen here; the
 * server (_memory_server.c) asks before it touches a region's memory.
 */
#include "_memory.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>

#include "_cuda.h"

int same_peer(const conn_t *a, const unsigned char *peer) {
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

pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
pthread_cond_t g_cond;
region_t *g_buckets[NBUCKETS];
static uint64_t g_next_id = 1;
uint64_t g_region_count = 0;
uint64_t g_region_bytes = 0;
conn_t *g_conns = NULL;
int g_conn_count = 0; /* every open connection */
int g_unverified = 0; /* of them, not yet verified nor evicted */
int g_verified = 0;
int g_max_verified = MAX_CONNS; /* lowered to a quarter of RLIMIT_NOFILE */
int g_listen_fd = -1;
int g_unix_fd = -1; /* a Unix socket in the tree's 0700 directory, or -1 */
int g_server_started = 0;

/* ------------------------------------------------------------ region table */

static region_t **bucket_of(uint64_t id) { return &g_buckets[id % NBUCKETS]; }

region_t *find_locked(uint64_t id) {
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
int request_authentic(conn_t *c, const region_t *r, const request_t *q) {
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
uint32_t no_such_region_locked(const request_t *q) {
    return (q->region != 0 && q->region < g_next_id) ? ST_DROPPED : ST_UNKNOWN_REGION;
}

/* `c` showed a live region's token: from now on it counts among the verified
 * connections (ST_BUSY when they are at their cap), and may idle. Lock held. */
uint32_t verify_conn_locked(conn_t *c) {
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

uint32_t acquire(conn_t *c, const request_t *q, int want_write, int lease, region_t **out) {
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

void release_locked(conn_t *c) {
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

void release(conn_t *c) {
    pthread_mutex_lock(&g_lock);
    release_locked(c);
    pthread_mutex_unlock(&g_lock);
}

void revoke_locked(region_t *r) {
    r->revoked = 1;
    for (conn_t *c = g_conns; c != NULL; c = c->next)
        if (c->busy == r) shutdown(c->fd, c->lease ? SHUT_WR : SHUT_RDWR);
}

/* ----------------------------------------------------------- Python layer */

PyObject *py_register(PyObject *self, PyObject *args) {
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

PyObject *py_unregister(PyObject *self, PyObject *args) {
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

PyObject *py_stats(PyObject *self, PyObject *noargs) {
    pthread_mutex_lock(&g_lock);
    unsigned long long regions = g_region_count, bytes = g_region_bytes;
    int conns = g_conn_count, started = g_server_started;
    pthread_mutex_unlock(&g_lock);
    return Py_BuildValue("(KKii)", regions, bytes, conns, started);
}
