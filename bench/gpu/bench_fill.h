/* bench_fill.h — filling large GPU benchmark buffers with random values quickly: one chunk of
 * normal samples is uploaded once, then copied over each buffer on the device. */
#ifndef COLT_BENCH_FILL_H
#define COLT_BENCH_FILL_H

#include <stdint.h>
#include <stdlib.h>

#include "backend/backend.h"
#include "core/rng.h"

#define FILL_CHUNK ((size_t)1 << 22)

/* A device buffer of FILL_CHUNK elements: scale * rng_normal(seed, 0, i). The caller frees it. */
static inline void *bench_random_chunk(const Backend *be, uint64_t seed, float scale) {
    float *host = malloc(FILL_CHUNK * sizeof(float));
    for (size_t i = 0; i < FILL_CHUNK; i++) host[i] = scale * rng_normal(seed, 0, i);
    void *chunk = be->alloc(be, FILL_CHUNK);
    be->upload(be, chunk, host, FILL_CHUNK);
    free(host);
    return chunk;
}

/* Fills a storage buffer of n elements with the chunk, repeated. */
static inline void bench_fill(const Backend *be, void *buf, size_t n, const void *chunk) {
    for (size_t off = 0; off < n; off += FILL_CHUNK) {
        size_t len = n - off < FILL_CHUNK ? n - off : FILL_CHUNK;
        be->copy(be, buf, off, chunk, 0, len);
    }
}

#endif
