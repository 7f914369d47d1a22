/* Copy-and-checksum for the KV tiers' host block copies (Strata, Apache-2.0).
 *
 * A block is copied in cache-sized chunks and each chunk is fed to a streaming XXH3-64 right
 * after its copy, while it is still in this core's cache: the block is read from memory once,
 * and the digest equals XXH3_64bits (python-xxhash's xxh3_64_intdigest) of the whole block.
 * Loaded with ctypes, which releases the GIL for the whole call; the batch entry point copies
 * many blocks in one call, so a thread hands the GIL over once per batch, not once per chunk.
 *
 * A save into a shared-memory slot may stream its stores past the cache (the ``_stream``
 * entry point): no core reads a slot soon after it is written (the sidecar holds it, writes it
 * to NVMe by DMA, or copies it out later), so a cached store only makes the core read every
 * destination line from memory first and later write it back, a third pass over memory that
 * non-temporal stores skip. A load out of the slots streams too: it is mostly far more than a
 * cache holds. The chunk is then hashed from the source, which the copy just brought into
 * this core's cache: the same bytes, so the same digest.
 *
 * XXH3 comes from the system's xxhash.h (Debian's libxxhash-dev: BSD-2-Clause, Yann Collet),
 * inlined whole. Its long-input loop's internals changed in 0.8.2 (XXH3_accumulate lost its
 * function argument, XXH3_finalizeLong_64b appeared): ACCUMULATE and FINALIZE take either.
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define XXH_INLINE_ALL
#include <xxhash.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#if XXH_VERSION_NUMBER >= 802
#define ACCUMULATE(acc, input, secret, stripes) XXH3_accumulate(acc, input, secret, stripes)
#define FINALIZE(acc, secret, n) XXH3_finalizeLong_64b(acc, secret, n)
#else
#define ACCUMULATE(acc, input, secret, stripes) \
    XXH3_accumulate(acc, input, secret, stripes, XXH3_accumulate_512)
#define FINALIZE(acc, secret, n) \
    XXH3_mergeAccs(acc, (secret) + XXH_SECRET_MERGEACCS_START, (n) * XXH_PRIME64_1)
#endif

/* Bumped when a signature changes: the loader refuses a library of another version. */
int strata_copyhash_abi(void) { return 3; }

uint64_t strata_hash(const void *data, size_t n) { return XXH3_64bits(data, n); }

/* XXH3's default secret, for the GPU's hash of the same blocks (xxh3parts.py). */
const void *strata_xxh3_secret(void) { return XXH3_kSecret; }
size_t strata_xxh3_secret_size(void) { return sizeof(XXH3_kSecret); }

/* Copy ``n`` bytes with non-temporal stores where the target allows them (SSE2, a 16-byte
 * aligned destination); plain memcpy elsewhere. The caller fences once at the end. */
static void stream_copy(xxh_u8 *dst, const xxh_u8 *src, size_t n) {
#if defined(__SSE2__)
    if (((uintptr_t)dst & 15) == 0) {
        size_t i = 0;
        for (; i + 64 <= n; i += 64) {
            __m128i const a = _mm_loadu_si128((const __m128i *)(src + i));
            __m128i const b = _mm_loadu_si128((const __m128i *)(src + i + 16));
            __m128i const c = _mm_loadu_si128((const __m128i *)(src + i + 32));
            __m128i const d = _mm_loadu_si128((const __m128i *)(src + i + 48));
            _mm_stream_si128((__m128i *)(dst + i), a);
            _mm_stream_si128((__m128i *)(dst + i + 16), b);
            _mm_stream_si128((__m128i *)(dst + i + 32), c);
            _mm_stream_si128((__m128i *)(dst + i + 48), d);
        }
        memcpy(dst + i, src + i, n - i);
        return;
    }
#endif
    memcpy(dst, src, n);
}

static void stream_fence(void) {
#if defined(__SSE2__)
    _mm_sfence(); /* streamed stores are weakly ordered: visible before the put is sent */
#endif
}

/* XXH3's long-input loop (XXH3_hashLong_internal_loop with the default secret), copying as it
 * goes: each chunk (whole 1 KiB XXH3 blocks) is copied, then hashed while it is in L1 (from the
 * destination, or with ``stream`` from the source: the streamed destination is not cached). The
 * same operations on the same bytes as XXH3_64bits, so the same digest. */
static uint64_t copy_hash_long(xxh_u8 *dst, const xxh_u8 *src, size_t n, size_t chunk, int stream) {
    XXH_ALIGN(XXH_ACC_ALIGN) xxh_u64 acc[XXH_ACC_NB] = XXH3_INIT_ACC;
    const xxh_u8 *secret = XXH3_kSecret;
    const xxh_u8 *hashed = stream ? src : dst;
    size_t const secret_size = sizeof(XXH3_kSecret);
    size_t const stripes = (secret_size - XXH_STRIPE_LEN) / XXH_SECRET_CONSUME_RATE;
    size_t const block = XXH_STRIPE_LEN * stripes;
    size_t const blocks = (n - 1) / block; /* the last (partial or whole) block is the tail's */
    size_t const per_chunk = chunk / block ? chunk / block : 1;
    for (size_t b = 0; b < blocks; b += per_chunk) {
        size_t const m = blocks - b < per_chunk ? blocks - b : per_chunk;
        if (stream)
            stream_copy(dst + b * block, src + b * block, m * block);
        else
            memcpy(dst + b * block, src + b * block, m * block);
        for (size_t i = b; i < b + m; i++) {
            ACCUMULATE(acc, hashed + i * block, secret, stripes);
            XXH3_scrambleAcc(acc, secret + secret_size - XXH_STRIPE_LEN);
        }
    }
    size_t const done = blocks * block;
    memcpy(dst + done, src + done, n - done);
    ACCUMULATE(acc, hashed + done, secret, ((n - 1) - done) / XXH_STRIPE_LEN);
    XXH3_accumulate_512(acc, hashed + n - XXH_STRIPE_LEN,
                        secret + secret_size - XXH_STRIPE_LEN - XXH_SECRET_LASTACC_START);
    return FINALIZE(acc, secret, (xxh_u64)n);
}

static uint64_t copy_hash(void *dst, const void *src, size_t n, size_t chunk, int stream) {
    if (n <= XXH3_MIDSIZE_MAX) { /* short inputs take other XXH3 paths: copy, then hash */
        memcpy(dst, src, n);
        return XXH3_64bits(dst, n);
    }
    return copy_hash_long((xxh_u8 *)dst, (const xxh_u8 *)src, n, chunk, stream);
}

uint64_t strata_copy_hash(void *dst, const void *src, size_t n, size_t chunk) {
    return copy_hash(dst, src, n, chunk, 0);
}

void strata_copy_hash_many(void *const *dst, const void *const *src, const size_t *n, size_t count,
                           size_t chunk, uint64_t *sums) {
    for (size_t i = 0; i < count; i++) sums[i] = copy_hash(dst[i], src[i], n[i], chunk, 0);
}

/* strata_copy_hash_many into destinations no core reads soon (shared-memory slots). */
void strata_copy_hash_stream_many(void *const *dst, const void *const *src, const size_t *n,
                                  size_t count, size_t chunk, uint64_t *sums) {
    for (size_t i = 0; i < count; i++) sums[i] = copy_hash(dst[i], src[i], n[i], chunk, 1);
    stream_fence();
}
