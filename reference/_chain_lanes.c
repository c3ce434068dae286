/* The boundary loop with its digests finished in lanes (x86 SHA extensions).
 *
 * Reading the digest at a boundary finishes a copy of the running state: one more SHA-256
 * block (the padding and the length) that nothing else depends on. Done one after the other,
 * as SHA256_Final does, that block costs as much as a block of data: a 16-token boundary
 * (128 bytes) spent 45 of its 116 ns finishing, a 4-token one (32 bytes) 54 of 78. A single
 * SHA-256 stream leaves the SHA units mostly idle (each round waits for the one before), so
 * here the finishing blocks waiting for their turn ride in the same instruction stream as the
 * chain's next data block: up to three finishes and that block in one interleaved call
 * (measured on this project's AMD EPYC: one block 45-56 ns alone, two interleaved 61 ns,
 * three 69 ns). The chain's other blocks stay OpenSSL's (SHA256_Update: its assembly is
 * faster than these intrinsics on one stream).
 *
 * The state is OpenSSL's SHA256_CTX (its public struct): the chaining value h, the partial
 * block data[0:num], and the length in bits Nh:Nl. This file reads them to finish a copy
 * and writes them when it absorbs a block itself, exactly as SHA256_Update would.
 */
#define OPENSSL_SUPPRESS_DEPRECATED
#include "_chain_lanes.h"

#include <string.h>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define LANES_BUILT 1
#include <cpuid.h>
#include <immintrin.h>
#else
#define LANES_BUILT 0
#endif

#define MAX_LANES 4 /* the chain's block and up to three finishes */

#if LANES_BUILT

static const uint32_t ROUND_CONSTANTS[64] = {
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

#define LANES_TARGET __attribute__((target("sha,sse4.1,ssse3")))

/* The 32-bit words of a vector with their bytes reversed: SHA-256 reads and writes its words
 * big-endian, x86 holds them little-endian. */
static inline __attribute__((always_inline)) LANES_TARGET __m128i
swap_words(__m128i words)
{
    return _mm_shuffle_epi8(words, _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL));
}

/* One SHA-256 block for each of `n` states, the lanes' rounds interleaved. The SHA
 * instructions keep the state as (a, b, e, f) and (c, d, g, h); each quad of rounds takes
 * four schedule words, the first four loaded big-endian, the rest made by msg1/msg2 from
 * the four before them. */
static inline __attribute__((always_inline)) LANES_TARGET void
compress(int n, uint32_t *const state[], const unsigned char *const block[])
{
    __m128i abef[MAX_LANES], cdgh[MAX_LANES], abef_in[MAX_LANES], cdgh_in[MAX_LANES];
    __m128i words[MAX_LANES][4];
    for (int l = 0; l < n; l++) {
        __m128i dcba = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&state[l][0]), 0xB1);
        __m128i efgh = _mm_shuffle_epi32(_mm_loadu_si128((const __m128i *)&state[l][4]), 0x1B);
        abef[l] = abef_in[l] = _mm_alignr_epi8(dcba, efgh, 8);
        cdgh[l] = cdgh_in[l] = _mm_blend_epi16(efgh, dcba, 0xF0);
    }
#pragma GCC unroll 16
    for (int quad = 0; quad < 16; quad++) {
        __m128i constants = _mm_loadu_si128((const __m128i *)&ROUND_CONSTANTS[4 * quad]);
        for (int l = 0; l < n; l++) {
            __m128i *w = words[l];
            if (quad < 4) {
                w[quad] = swap_words(_mm_loadu_si128((const __m128i *)(block[l] + 16 * quad)));
            } else { /* w[t] = s1(w[t-2]) + w[t-7] + s0(w[t-15]) + w[t-16], four at a time */
                __m128i older = _mm_sha256msg1_epu32(w[quad % 4], w[(quad + 1) % 4]);
                __m128i seventh = _mm_alignr_epi8(w[(quad + 3) % 4], w[(quad + 2) % 4], 4);
                w[quad % 4] = _mm_sha256msg2_epu32(_mm_add_epi32(older, seventh),
                                                   w[(quad + 3) % 4]);
            }
            __m128i keyed = _mm_add_epi32(w[quad % 4], constants);
            cdgh[l] = _mm_sha256rnds2_epu32(cdgh[l], abef[l], keyed);
            abef[l] = _mm_sha256rnds2_epu32(abef[l], cdgh[l], _mm_shuffle_epi32(keyed, 0x0E));
        }
    }
    for (int l = 0; l < n; l++) {
        __m128i feba = _mm_shuffle_epi32(_mm_add_epi32(abef[l], abef_in[l]), 0x1B);
        __m128i dchg = _mm_shuffle_epi32(_mm_add_epi32(cdgh[l], cdgh_in[l]), 0xB1);
        _mm_storeu_si128((__m128i *)&state[l][0], _mm_blend_epi16(feba, dchg, 0xF0));
        _mm_storeu_si128((__m128i *)&state[l][4], _mm_alignr_epi8(dchg, feba, 8));
    }
}

/* `compress` with a constant lane count, so each one is unrolled and interleaved. */
static LANES_TARGET void
compress_lanes(int n, uint32_t *const state[], const unsigned char *const block[])
{
    switch (n) {
    case 1: compress(1, state, block); break;
    case 2: compress(2, state, block); break;
    case 3: compress(3, state, block); break;
    default: compress(4, state, block); break;
    }
}

/* A copy of the state waiting for its last block: the digest of what was fed up to a
 * boundary, bound for `out`. */
typedef struct {
    uint32_t h[8];
    unsigned char last[64];
    unsigned char *out;
} Finish;

static uint64_t
bits_of(const SHA256_CTX *ctx)
{
    return ((uint64_t)ctx->Nh << 32) | ctx->Nl;
}

/* The state as the digest: its words big-endian. */
static inline LANES_TARGET void
write_digest(const uint32_t h[8], unsigned char *out)
{
    for (int half = 0; half < 2; half++) {
        __m128i words = _mm_loadu_si128((const __m128i *)&h[4 * half]);
        _mm_storeu_si128((__m128i *)(out + 16 * half), swap_words(words));
    }
}

/* Queue the digest of the state so far. The padding (0x80, zeros, the length) fits the
 * partial block when fewer than 56 bytes wait there; otherwise it takes two blocks and the
 * digest is finished here, as SHA256_Final would (a boundary whose stream ends 56-63 bytes
 * into a block: one in eight at 15-token blocks). */
static LANES_TARGET void
queue_finish(const SHA256_CTX *ctx, Finish *pending, int *waiting, unsigned char *out)
{
    size_t num = ctx->num;
    if (num >= 56) {
        SHA256_CTX finished = *ctx;
        SHA256_Final(out, &finished);
        return;
    }
    Finish *finish = &pending[(*waiting)++];
    memcpy(finish->h, ctx->h, sizeof finish->h);
    memcpy(finish->last, ctx->data, num);
    finish->last[num] = 0x80;
    memset(finish->last + num + 1, 0, 55 - num);
    uint64_t bits = bits_of(ctx);
    for (int i = 0; i < 8; i++) {
        finish->last[63 - i] = (unsigned char)(bits >> (8 * i));
    }
    finish->out = out;
}

/* Compress the chain's next block (if `block`) and every waiting finish in one call. */
static LANES_TARGET void
run_lanes(SHA256_CTX *ctx, const unsigned char *block, Finish *pending, int *waiting)
{
    uint32_t *state[MAX_LANES];
    const unsigned char *blocks[MAX_LANES];
    int n = 0;
    if (block != NULL) {
        state[n] = ctx->h;
        blocks[n++] = block;
    }
    for (int k = 0; k < *waiting; k++) {
        state[n] = pending[k].h;
        blocks[n++] = pending[k].last;
    }
    if (n == 0) {
        return;
    }
    compress_lanes(n, state, blocks);
    for (int k = 0; k < *waiting; k++) {
        write_digest(pending[k].h, pending[k].out);
    }
    *waiting = 0;
}

/* Feed `len` bytes: the block that completes first goes with the waiting finishes, the rest
 * to SHA256_Update. */
static LANES_TARGET void
feed(SHA256_CTX *ctx, const unsigned char *at, size_t len, Finish *pending, int *waiting)
{
    size_t num = ctx->num;
    if (*waiting > 0 && num + len >= 64) {
        size_t taken = 64 - num;
        unsigned char joined[64];
        const unsigned char *block = at;
        if (num > 0) {
            memcpy(joined, ctx->data, num);
            memcpy(joined + num, at, taken);
            block = joined;
        }
        run_lanes(ctx, block, pending, waiting);
        uint64_t bits = bits_of(ctx) + 8 * (uint64_t)taken;
        ctx->Nl = (SHA_LONG)bits;
        ctx->Nh = (SHA_LONG)(bits >> 32);
        ctx->num = 0;
        at += taken;
        len -= taken;
    }
    if (len > 0) {
        SHA256_Update(ctx, at, len);
    }
}

LANES_TARGET void
lanes_boundaries(SHA256_CTX *ctx, const unsigned char *at, size_t first_span, size_t step,
                 size_t count, PyObject *const *digests)
{
    Finish pending[MAX_LANES - 1];
    int waiting = 0;
    size_t span = first_span;
    for (size_t k = 0; k < count; k++) {
        feed(ctx, at, span, pending, &waiting);
        at += span;
        span = step;
        if (waiting == MAX_LANES - 1) {
            run_lanes(ctx, NULL, pending, &waiting);
        }
        queue_finish(ctx, pending, &waiting,
                     (unsigned char *)PyBytes_AS_STRING(digests[k]));
    }
    run_lanes(ctx, NULL, pending, &waiting);
}

int
lanes_supported(void)
{
    unsigned int a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_SSSE3) || !(c & bit_SSE4_1)) {
        return 0;
    }
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) && (b & bit_SHA);
}

#else

int
lanes_supported(void)
{
    return 0;
}

/* Never called: lanes_supported() is 0, so `use_lanes` never switches the lanes on. */
void
lanes_boundaries(SHA256_CTX *ctx, const unsigned char *at, size_t first_span, size_t step,
                 size_t count, PyObject *const *digests)
{
    (void)ctx, (void)at, (void)first_span, (void)step, (void)count, (void)digests;
}

#endif
