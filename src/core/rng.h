/* rng.h — counter-based random numbers (Philox4x32-10).
 *
 * A draw is a pure function of (seed, stream, counter): sampling keys it by
 * (seed, sequence id, position), so a completion does not depend on what else
 * shares its batch, its device or its process. There is no hidden state.
 * Not cryptographic. */
#ifndef COLT_CORE_RNG_H
#define COLT_CORE_RNG_H

#include <stdint.h>

/* Four independent 32-bit words for (seed, stream, counter). */
void rng_philox(uint32_t out[4], uint64_t seed, uint64_t stream, uint64_t counter);

/* A uniform float in [0, 1) with 24 random bits. */
float rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter);

/* A standard normal draw (Box-Muller on one Philox block). */
float rng_normal(uint64_t seed, uint64_t stream, uint64_t counter);

#endif
