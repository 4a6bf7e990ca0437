/*
 * HMAC-SHA256 (FIPS 180-4, RFC 2104) for the data plane's request MACs and the
 * control wire's small messages (_fastwire): small,
 * self-contained, so the extension needs no crypto library to build. Checked
 * against Python's hmac module in the tests.
 */
#ifndef MONARCH_NB_SHA256_H
#define MONARCH_NB_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define SHA256_SIZE 32

typedef struct {
    uint32_t h[8];
    unsigned char block[64];
    size_t used;   /* bytes in block */
    uint64_t bits; /* message length so far */
} sha256_t;

/* Incremental SHA-256; a sha256_t may be copied to fork a hash (HMAC's
   precomputed key states, monarch_nb._wire._fastwire). */
void sha256_init(sha256_t *s);
void sha256_update(sha256_t *s, const unsigned char *p, size_t n);
void sha256_final(sha256_t *s, unsigned char out[SHA256_SIZE]);
/* 1 if the x86 SHA extensions do the rounds (unless MONARCH_NB_PORTABLE_SHA256 is set). */
int sha256_uses_cpu_extensions(void);

void hmac_sha256(const unsigned char *key, size_t key_len, const unsigned char *msg,
                 size_t msg_len, unsigned char out[SHA256_SIZE]);

#endif
