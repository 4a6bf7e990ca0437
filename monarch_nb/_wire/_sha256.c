/* SHA-256 and HMAC-SHA256, written from FIPS 180-4 and RFC 2104. */
#include "_sha256.h"

#include <stdlib.h>
#include <string.h>

static const uint32_t K[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
    0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
    0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
    0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
    0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
    0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
    0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
    0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
    0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2,
};

static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

#if defined(__x86_64__) && defined(__GNUC__)
#include <cpuid.h>
#include <immintrin.h>
#define HAVE_SHANI_PATH 1

/* The same compression with the x86 SHA extensions (most x86 CPUs since 2017):
   several times faster than the portable rounds below, which the small control
   messages' signatures spend most of their time in. Four rounds per step: the
   message schedule with sha256msg1/msg2, the rounds with sha256rnds2, the state
   kept as ABEF and CDGH as those instructions want it. */
__attribute__((target("sha,sse4.1"))) static void compress_shani(uint32_t h[8],
                                                                 const unsigned char *p) {
    const __m128i byte_swap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
    __m128i dcba = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&h[0]), 0xB1);
    __m128i hgfe = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&h[4]), 0x1B);
    __m128i abef = _mm_alignr_epi8(dcba, hgfe, 8);
    __m128i cdgh = _mm_blend_epi16(hgfe, dcba, 0xF0);
    __m128i abef_in = abef, cdgh_in = cdgh, w[4];
    for (int i = 0; i < 16; i++) {
        __m128i next;
        if (i < 4) {
            next = _mm_shuffle_epi8(_mm_loadu_si128((const __m128i *)(p + 16 * i)), byte_swap);
        } else {
            next = _mm_sha256msg1_epu32(w[(i - 4) & 3], w[(i - 3) & 3]);
            next = _mm_add_epi32(next, _mm_alignr_epi8(w[(i - 1) & 3], w[(i - 2) & 3], 4));
            next = _mm_sha256msg2_epu32(next, w[(i - 1) & 3]);
        }
        w[i & 3] = next;
        __m128i msg = _mm_add_epi32(next, _mm_loadu_si128((const __m128i *)&K[4 * i]));
        cdgh = _mm_sha256rnds2_epu32(cdgh, abef, msg);
        abef = _mm_sha256rnds2_epu32(abef, cdgh, _mm_shuffle_epi32(msg, 0x0E));
    }
    abef = _mm_add_epi32(abef, abef_in);
    cdgh = _mm_add_epi32(cdgh, cdgh_in);
    __m128i feba = _mm_shuffle_epi32(abef, 0x1B);
    __m128i dchg = _mm_shuffle_epi32(cdgh, 0xB1);
    _mm_storeu_si128((__m128i *)&h[0], _mm_blend_epi16(feba, dchg, 0xF0));
    _mm_storeu_si128((__m128i *)&h[4], _mm_alignr_epi8(dchg, feba, 8));
}

static int shani_state = -1; /* -1: not asked yet; benign race, every thread gets the same */

static int have_shani(void) {
    int state = __atomic_load_n(&shani_state, __ATOMIC_RELAXED);
    if (state < 0) {
        unsigned a, b, c, d;
        int sse41 = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_SSE4_1) && (c & bit_SSSE3);
        int sha = __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & bit_SHA);
        /* MONARCH_NB_PORTABLE_SHA256=1: the portable rounds (the tests check both). */
        const char *portable = getenv("MONARCH_NB_PORTABLE_SHA256");
        int forced = portable != NULL && *portable != '\0' && strcmp(portable, "0") != 0;
        state = sse41 && sha && !forced;
        __atomic_store_n(&shani_state, state, __ATOMIC_RELAXED);
    }
    return state;
}
#endif

int sha256_uses_cpu_extensions(void) {
#ifdef HAVE_SHANI_PATH
    return have_shani();
#else
    return 0;
#endif
}

static void compress_portable(sha256_t *s, const unsigned char *p);

static void compress(sha256_t *s, const unsigned char *p) {
#ifdef HAVE_SHANI_PATH
    if (have_shani()) {
        compress_shani(s->h, p);
        return;
    }
#endif
    compress_portable(s, p);
}

static void compress_portable(sha256_t *s, const unsigned char *p) {
    uint32_t w[64];
    for (int i = 0; i < 16; i++)
        w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
               (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
    for (int i = 16; i < 64; i++) {
        uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
        uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
        w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = s->h[0], b = s->h[1], c = s->h[2], d = s->h[3];
    uint32_t e = s->h[4], f = s->h[5], g = s->h[6], h = s->h[7];
    for (int i = 0; i < 64; i++) {
        uint32_t t1 = h + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + K[i] + w[i];
        uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
        h = g;
        g = f;
        f = e;
        e = d + t1;
        d = c;
        c = b;
        b = a;
        a = t1 + t2;
    }
    s->h[0] += a;
    s->h[1] += b;
    s->h[2] += c;
    s->h[3] += d;
    s->h[4] += e;
    s->h[5] += f;
    s->h[6] += g;
    s->h[7] += h;
}

void sha256_init(sha256_t *s) {
    static const uint32_t iv[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
    memcpy(s->h, iv, sizeof iv);
    s->used = 0;
    s->bits = 0;
}

void sha256_update(sha256_t *s, const unsigned char *p, size_t n) {
    s->bits += (uint64_t)n * 8;
    while (n >= 64 && s->used == 0) { /* whole blocks straight from the input */
        compress(s, p);
        p += 64;
        n -= 64;
    }
    while (n > 0) {
        size_t take = 64 - s->used < n ? 64 - s->used : n;
        memcpy(s->block + s->used, p, take);
        s->used += take;
        p += take;
        n -= take;
        if (s->used == 64) {
            compress(s, s->block);
            s->used = 0;
        }
    }
}

void sha256_final(sha256_t *s, unsigned char out[SHA256_SIZE]) {
    uint64_t bits = s->bits;
    /* 0x80, zeros to 56 bytes into a block, the length: padded in place. */
    s->block[s->used++] = 0x80;
    if (s->used > 56) {
        memset(s->block + s->used, 0, 64 - s->used);
        compress(s, s->block);
        s->used = 0;
    }
    memset(s->block + s->used, 0, 56 - s->used);
    for (int i = 0; i < 8; i++) s->block[56 + i] = (unsigned char)(bits >> (56 - 8 * i));
    compress(s, s->block);
    s->used = 0;
    for (int i = 0; i < 8; i++) {
        out[4 * i] = (unsigned char)(s->h[i] >> 24);
        out[4 * i + 1] = (unsigned char)(s->h[i] >> 16);
        out[4 * i + 2] = (unsigned char)(s->h[i] >> 8);
        out[4 * i + 3] = (unsigned char)s->h[i];
    }
}

void hmac_sha256(const unsigned char *key, size_t key_len, const unsigned char *msg,
                 size_t msg_len, unsigned char out[SHA256_SIZE]) {
    unsigned char k[64] = {0}, pad[64], inner[SHA256_SIZE];
    sha256_t s;
    if (key_len > 64) {
        sha256_init(&s);
        sha256_update(&s, key, key_len);
        sha256_final(&s, k);
    } else {
        memcpy(k, key, key_len);
    }
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x36;
    sha256_init(&s);
    sha256_update(&s, pad, 64);
    sha256_update(&s, msg, msg_len);
    sha256_final(&s, inner);
    for (int i = 0; i < 64; i++) pad[i] = k[i] ^ 0x5c;
    sha256_init(&s);
    sha256_update(&s, pad, 64);
    sha256_update(&s, inner, SHA256_SIZE);
    sha256_final(&s, out);
}
