/* hash.h — XXH64 (Yann Collet's xxHash, 64-bit), streaming.
 *
 * Used to record what a checkpoint's files must be. It runs at memory speed
 * (32 bytes a round, ~10x byte-serial FNV-1a), so hashing a saved checkpoint
 * costs little next to writing it. It catches damage, truncation and files
 * swapped between checkpoints; it is not a cryptographic hash and does not
 * stand against someone who can also rewrite the record. */
#ifndef COLT_CORE_HASH_H
#define COLT_CORE_HASH_H

#include <stddef.h>
#include <stdint.h>

typedef struct Xxh64 {
    uint64_t v[4];            /* the four lanes */
    uint64_t total;           /* bytes seen */
    uint64_t seed;
    unsigned char buf[32];    /* a partial stripe */
    size_t buf_len;
} Xxh64;

void xxh64_init(Xxh64 *h, uint64_t seed);
void xxh64_update(Xxh64 *h, const void *data, size_t len);
/* The hash of everything given so far (h is not changed). */
uint64_t xxh64_digest(const Xxh64 *h);
/* One call. */
uint64_t xxh64(const void *data, size_t len, uint64_t seed);

#endif
