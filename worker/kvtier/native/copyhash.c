/* Copy-and-checksum for the KV tiers' host block copies (Strata, Apache-2.0).
 *
 * A block is copied in cache-sized chunks and each chunk is fed to a streaming XXH3-64 right
 * after its copy, while it is still in this core's cache: the block is read from memory once,
 * and the digest equals XXH3_64bits (python-xxhash's xxh3_64_intdigest) of the whole block.
 * Loaded with ctypes, which releases the GIL for the whole call; the batch entry point copies
 * many blocks in one call, so a thread hands the GIL over once per batch, not once per chunk.
 *
 * XXH3 comes from the vendored single header xxhash.h (BSD-2-Clause, Yann Collet).
 */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define XXH_INLINE_ALL
#include "xxhash.h"

/* Bumped when a signature changes: the loader refuses a library of another version. */
int strata_copyhash_abi(void) { return 1; }

uint64_t strata_hash(const void *data, size_t n) { return XXH3_64bits(data, n); }

/* XXH3's long-input loop (XXH3_hashLong_internal_loop with the default secret), copying as it
 * goes: each chunk (whole 1 KiB XXH3 blocks) is copied, then hashed from the destination while
 * it is in L1. The same operations on the same bytes as XXH3_64bits, so the same digest. */
static uint64_t copy_hash_long(xxh_u8 *dst, const xxh_u8 *src, size_t n, size_t chunk) {
    XXH_ALIGN(XXH_ACC_ALIGN) xxh_u64 acc[XXH_ACC_NB] = XXH3_INIT_ACC;
    const xxh_u8 *secret = XXH3_kSecret;
    size_t const secret_size = sizeof(XXH3_kSecret);
    size_t const stripes = (secret_size - XXH_STRIPE_LEN) / XXH_SECRET_CONSUME_RATE;
    size_t const block = XXH_STRIPE_LEN * stripes;
    size_t const blocks = (n - 1) / block; /* the last (partial or whole) block is the tail's */
    size_t const per_chunk = chunk / block ? chunk / block : 1;
    for (size_t b = 0; b < blocks; b += per_chunk) {
        size_t const m = blocks - b < per_chunk ? blocks - b : per_chunk;
        memcpy(dst + b * block, src + b * block, m * block);
        for (size_t i = b; i < b + m; i++) {
            XXH3_accumulate(acc, dst + i * block, secret, stripes);
            XXH3_scrambleAcc(acc, secret + secret_size - XXH_STRIPE_LEN);
        }
    }
    size_t const done = blocks * block;
    memcpy(dst + done, src + done, n - done);
    XXH3_accumulate(acc, dst + done, secret, ((n - 1) - done) / XXH_STRIPE_LEN);
    XXH3_accumulate_512(acc, dst + n - XXH_STRIPE_LEN,
                        secret + secret_size - XXH_STRIPE_LEN - XXH_SECRET_LASTACC_START);
    return XXH3_finalizeLong_64b(acc, secret, (xxh_u64)n);
}

uint64_t strata_copy_hash(void *dst, const void *src, size_t n, size_t chunk) {
    if (n <= XXH3_MIDSIZE_MAX) { /* short inputs take other XXH3 paths: copy, then hash */
        memcpy(dst, src, n);
        return XXH3_64bits(dst, n);
    }
    return copy_hash_long((xxh_u8 *)dst, (const xxh_u8 *)src, n, chunk);
}

void strata_copy_hash_many(void *const *dst, const void *const *src, const size_t *n, size_t count,
                           size_t chunk, uint64_t *sums) {
    for (size_t i = 0; i < count; i++) sums[i] = strata_copy_hash(dst[i], src[i], n[i], chunk);
}
