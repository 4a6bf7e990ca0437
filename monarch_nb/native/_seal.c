/* AES-256-GCM through libcrypto's EVP interface, found with dlsym (see _seal.h). */
#include "_seal.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "../_wire/_sha256.h"

/* EVP_CIPHER_CTX_ctrl commands for GCM (stable across OpenSSL 1.1 and 3). */
#define GCM_SET_IVLEN 0x9
#define GCM_GET_TAG 0x10
#define GCM_SET_TAG 0x11
#define IV_SIZE 12

static struct {
    void *(*ctx_new)(void);
    void (*ctx_free)(void *);
    int (*ctrl)(void *, int, int, void *);
    const void *(*aes_256_gcm)(void);
    int (*encrypt_init)(void *, const void *, void *, const unsigned char *, const unsigned char *);
    int (*encrypt_update)(void *, unsigned char *, int *, const unsigned char *, int);
    int (*encrypt_final)(void *, unsigned char *, int *);
    int (*decrypt_init)(void *, const void *, void *, const unsigned char *, const unsigned char *);
    int (*decrypt_update)(void *, unsigned char *, int *, const unsigned char *, int);
    int (*decrypt_final)(void *, unsigned char *, int *);
} evp;

static pthread_mutex_t load_lock = PTHREAD_MUTEX_INITIALIZER;
static int loaded = 0;

int seal_load(const char *libcrypto_path, char *why, size_t why_len) {
    pthread_mutex_lock(&load_lock);
    int rc = 0;
    if (!loaded) {
        void *lib = dlopen(libcrypto_path, RTLD_NOW | RTLD_LOCAL);
        struct {
            const char *name;
            void **slot;
        } table[] = {
            {"EVP_CIPHER_CTX_new", (void **)&evp.ctx_new},
            {"EVP_CIPHER_CTX_free", (void **)&evp.ctx_free},
            {"EVP_CIPHER_CTX_ctrl", (void **)&evp.ctrl},
            {"EVP_aes_256_gcm", (void **)&evp.aes_256_gcm},
            {"EVP_EncryptInit_ex", (void **)&evp.encrypt_init},
            {"EVP_EncryptUpdate", (void **)&evp.encrypt_update},
            {"EVP_EncryptFinal_ex", (void **)&evp.encrypt_final},
            {"EVP_DecryptInit_ex", (void **)&evp.decrypt_init},
            {"EVP_DecryptUpdate", (void **)&evp.decrypt_update},
            {"EVP_DecryptFinal_ex", (void **)&evp.decrypt_final},
        };
        if (lib == NULL) {
            snprintf(why, why_len, "cannot open %s: %s", libcrypto_path, dlerror());
            rc = -1;
        }
        for (size_t i = 0; rc == 0 && i < sizeof table / sizeof table[0]; i++) {
            *table[i].slot = dlsym(lib, table[i].name);
            if (*table[i].slot == NULL) {
                snprintf(why, why_len, "%s has no %s", libcrypto_path, table[i].name);
                rc = -1;
            }
        }
        if (rc == 0) __atomic_store_n(&loaded, 1, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&load_lock);
    return rc;
}

int seal_loaded(void) { return __atomic_load_n(&loaded, __ATOMIC_ACQUIRE); }

void seal_key(const unsigned char *token, size_t token_len, const unsigned char *challenge,
              size_t challenge_len, unsigned char key[SEAL_KEY_SIZE]) {
    static const char label[] = "monarch_nb rdma seal v1";
    unsigned char msg[sizeof label + 64];
    size_t n = sizeof label - 1;
    memcpy(msg, label, n);
    if (challenge_len > 64) challenge_len = 64;
    memcpy(msg + n, challenge, challenge_len);
    hmac_sha256(token, token_len, msg, n + challenge_len, key);
}

static void make_iv(uint64_t nonce, uint32_t index, unsigned char iv[IV_SIZE]) {
    for (int i = 0; i < 8; i++) iv[i] = (unsigned char)(nonce >> (8 * i));
    for (int i = 0; i < 4; i++) iv[8 + i] = (unsigned char)(index >> (8 * i));
}

int seal_chunk(const unsigned char key[SEAL_KEY_SIZE], uint64_t nonce, uint32_t index,
               const unsigned char *src, unsigned char *dst, size_t n,
               unsigned char tag[SEAL_TAG_SIZE]) {
    if (!seal_loaded() || n > (size_t)1 << 30) return -1;
    unsigned char iv[IV_SIZE];
    make_iv(nonce, index, iv);
    void *ctx = evp.ctx_new();
    int out = 0, ok = ctx != NULL && evp.encrypt_init(ctx, evp.aes_256_gcm(), NULL, NULL, NULL) &&
                      evp.ctrl(ctx, GCM_SET_IVLEN, IV_SIZE, NULL) &&
                      evp.encrypt_init(ctx, NULL, NULL, key, iv) &&
                      evp.encrypt_update(ctx, dst, &out, src, (int)n) &&
                      evp.encrypt_final(ctx, dst + out, &out) &&
                      evp.ctrl(ctx, GCM_GET_TAG, SEAL_TAG_SIZE, tag);
    if (ctx != NULL) evp.ctx_free(ctx);
    return ok ? 0 : -1;
}

int open_chunk(const unsigned char key[SEAL_KEY_SIZE], uint64_t nonce, uint32_t index,
               const unsigned char *src, unsigned char *dst, size_t n,
               const unsigned char tag[SEAL_TAG_SIZE]) {
    if (!seal_loaded() || n > (size_t)1 << 30) return -1;
    unsigned char iv[IV_SIZE], want[SEAL_TAG_SIZE];
    make_iv(nonce, index, iv);
    memcpy(want, tag, SEAL_TAG_SIZE);
    void *ctx = evp.ctx_new();
    int out = 0;
    int ok = ctx != NULL && evp.decrypt_init(ctx, evp.aes_256_gcm(), NULL, NULL, NULL) &&
             evp.ctrl(ctx, GCM_SET_IVLEN, IV_SIZE, NULL) &&
             evp.decrypt_init(ctx, NULL, NULL, key, iv) &&
             evp.decrypt_update(ctx, dst, &out, src, (int)n) &&
             evp.ctrl(ctx, GCM_SET_TAG, SEAL_TAG_SIZE, want);
    int rc = ok ? (evp.decrypt_final(ctx, dst + out, &out) > 0 ? 0 : 1) : -1;
    if (ctx != NULL) evp.ctx_free(ctx);
    return rc;
}
