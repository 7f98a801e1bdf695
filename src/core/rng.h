/* rng.h — counter-based random numbers (Philox4x32-10).
 *
 * A draw is a pure function of (seed, stream, counter): sampling keys it by
 * (seed, sequence id, position), so a completion does not depend on what else
 * shares its batch, its device or its process. There is no hidden state.
 * Not cryptographic. */
#ifndef COLT_CORE_RNG_H
#define COLT_CORE_RNG_H

#include <stdint.h>

/* Philox4x32 round multipliers and Weyl key increments (rng.c and the CUDA
 * sampler, which must draw bit-identical numbers, both use these). */
#define PHILOX_M0 0xD2511F53u
#define PHILOX_M1 0xCD9E8D57u
#define PHILOX_W0 0x9E3779B9u
#define PHILOX_W1 0xBB67AE85u

/* Four independent 32-bit words for (seed, stream, counter). */
void rng_philox(uint32_t out[4], uint64_t seed, uint64_t stream, uint64_t counter);

/* A uniform float in [0, 1) with 24 random bits. */
float rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter);

/* A standard normal draw (Box-Muller on one Philox block). */
float rng_normal(uint64_t seed, uint64_t stream, uint64_t counter);

#endif
