/* hash.c — see hash.h. Follows the xxHash specification (XXH64), byte order
 * little-endian whatever the host's. */
#include "core/hash.h"

#include <string.h>

#define P1 0x9E3779B185EBCA87ull
#define P2 0xC2B2AE3D27D4EB4Full
#define P3 0x165667B19E3779F9ull
#define P4 0x85EBCA77C2B2AE63ull
#define P5 0x27D4EB2F165667C5ull

static uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

static uint64_t read64(const unsigned char *p) {
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t v; /* one load; the byte loop below is not always turned into one */
    memcpy(&v, p, 8);
    return v;
#else
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
    return v;
#endif
}

static uint64_t read32(const unsigned char *p) {
    return (uint64_t)p[0] | (uint64_t)p[1] << 8 | (uint64_t)p[2] << 16 | (uint64_t)p[3] << 24;
}

static uint64_t round64(uint64_t acc, uint64_t input) { return rotl(acc + input * P2, 31) * P1; }

static uint64_t merge64(uint64_t acc, uint64_t v) { return (acc ^ round64(0, v)) * P1 + P4; }

static void stripe(uint64_t v[4], const unsigned char *p) {
    for (int i = 0; i < 4; i++) v[i] = round64(v[i], read64(p + 8 * i));
}

void xxh64_init(Xxh64 *h, uint64_t seed) {
    memset(h, 0, sizeof *h);
    h->seed = seed;
    h->v[0] = seed + P1 + P2;
    h->v[1] = seed + P2;
    h->v[2] = seed;
    h->v[3] = seed - P1;
}

void xxh64_update(Xxh64 *h, const void *data, size_t len) {
    const unsigned char *p = data;
    h->total += len;
    if (h->buf_len) {
        size_t take = 32 - h->buf_len < len ? 32 - h->buf_len : len;
        memcpy(h->buf + h->buf_len, p, take);
        h->buf_len += take, p += take, len -= take;
        if (h->buf_len < 32) return;
        stripe(h->v, h->buf);
        h->buf_len = 0;
    }
    for (; len >= 32; p += 32, len -= 32) stripe(h->v, p);
    memcpy(h->buf, p, len);
    h->buf_len = len;
}

uint64_t xxh64_digest(const Xxh64 *h) {
    uint64_t acc;
    if (h->total >= 32) {
        const uint64_t *v = h->v;
        acc = rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18);
        for (int i = 0; i < 4; i++) acc = merge64(acc, v[i]);
    } else
        acc = h->seed + P5;
    acc += h->total;
    const unsigned char *p = h->buf;
    size_t len = h->buf_len;
    for (; len >= 8; p += 8, len -= 8) acc = rotl(acc ^ round64(0, read64(p)), 27) * P1 + P4;
    if (len >= 4) acc = rotl(acc ^ read32(p) * P1, 23) * P2 + P3, p += 4, len -= 4;
    for (; len > 0; p++, len--) acc = rotl(acc ^ *p * P5, 11) * P1;
    acc ^= acc >> 33;
    acc *= P2;
    acc ^= acc >> 29;
    acc *= P3;
    acc ^= acc >> 32;
    return acc;
}

uint64_t xxh64(const void *data, size_t len, uint64_t seed) {
    Xxh64 h;
    xxh64_init(&h, seed);
    xxh64_update(&h, data, len);
    return xxh64_digest(&h);
}
