/*
 * The data plane's wire, both sides (see _memory.c): a request's encoding and
 * its MAC, and blocking socket I/O that sends or receives all of a buffer.
 */
#include "_memory.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>

#include "../_wire/_sha256.h"

/* ----------------------------------------------------------------- requests */

void encode_request(unsigned char *b, const request_t *q) {
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
void request_mac(const request_t *q, const unsigned char *token,
                        const unsigned char *challenge, unsigned char mac[MAC_SIZE]) {
    unsigned char msg[CHALLENGE_SIZE + REQ_SIZE], full[SHA256_SIZE];
    memcpy(msg, challenge, CHALLENGE_SIZE);
    encode_request(msg + CHALLENGE_SIZE, q);
    hmac_sha256(token, TOKEN_SIZE, msg, CHALLENGE_SIZE + REQ_SIGNED, full);
    memcpy(mac, full, MAC_SIZE);
}

void decode_request(const unsigned char *b, request_t *q) {
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
int send_all(int fd, const void *buf, size_t len) {
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
int recv_all(int fd, void *buf, size_t len) {
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

int send_reply(int fd, uint32_t status, uint64_t value) {
    unsigned char b[REP_SIZE];
    put_u32(b, REP_MAGIC);
    put_u32(b + 4, status);
    put_u64(b + 8, value);
    return send_all(fd, b, REP_SIZE);
}
