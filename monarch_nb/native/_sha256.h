/*
 * HMAC-SHA256 (FIPS 180-4, RFC 2104) for the data plane's request MACs: small,
 * self-contained, so the extension needs no crypto library to build. Checked
 * against Python's hmac module in the tests.
 */
#ifndef MONARCH_NB_SHA256_H
#define MONARCH_NB_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define SHA256_SIZE 32

void hmac_sha256(const unsigned char *key, size_t key_len, const unsigned char *msg,
                 size_t msg_len, unsigned char out[SHA256_SIZE]);

#endif
