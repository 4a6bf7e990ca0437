/*
 * The owner's server (piece 2 in _memory.c): one accept thread, then one
 * thread per connection that sends its hello and serves its requests, each
 * checked against the registration table (_memory_registry.c) first.
 */
#include "_memory.h"

#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/types.h>
#include <time.h>
#include <unistd.h>

#include "_cuda.h"
#include "_seal.h"

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

/* ----------------------------------------------------------- Python layer */

PyObject *py_server_start(PyObject *self, PyObject *args) {
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
