/*
 * Sealing the data plane's bulk stream: AES-256-GCM from the OpenSSL libcrypto
 * that Python's hashlib already loaded (opened with dlopen, so the extension
 * builds without OpenSSL headers and no cipher is written here). A connection's
 * key is HMAC-SHA256(token, label || its challenge); each chunk's 96-bit IV is
 * the request's nonce and the chunk's index, so no IV repeats under a key.
 */
#ifndef MONARCH_NB_SEAL_H
#define MONARCH_NB_SEAL_H

#include <stddef.h>
#include <stdint.h>

#define SEAL_KEY_SIZE 32
#define SEAL_TAG_SIZE 16
#define SEAL_CHUNK ((size_t)1 << 20) /* bytes of data per sealed chunk */

int seal_load(const char *libcrypto_path, char *why, size_t why_len);
int seal_loaded(void);

/* The key of a connection from a region's token and the connection's challenge. */
void seal_key(const unsigned char *token, size_t token_len, const unsigned char *challenge,
              size_t challenge_len, unsigned char key[SEAL_KEY_SIZE]);

/* Encrypt n bytes of src into dst (they may be the same) and write the tag.
 * Returns 0, or -1 if the library failed. */
int seal_chunk(const unsigned char key[SEAL_KEY_SIZE], uint64_t nonce, uint32_t index,
               const unsigned char *src, unsigned char *dst, size_t n,
               unsigned char tag[SEAL_TAG_SIZE]);

/* Decrypt n bytes of src into dst (they may be the same); 0 if the tag matches,
 * 1 if it does not (dst then holds nothing to trust), -1 if the library failed. */
int open_chunk(const unsigned char key[SEAL_KEY_SIZE], uint64_t nonce, uint32_t index,
               const unsigned char *src, unsigned char *dst, size_t n,
               const unsigned char tag[SEAL_TAG_SIZE]);

#endif
