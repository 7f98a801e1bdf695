/* floats.h — reading a float as the decimal a user wrote. Settings arrive as
 * floats (0.999f); PyTorch keeps them as Python floats (doubles of 0.999).
 * Computing 1 - beta from (double)0.999f is off by 1e-5 relative, so parity
 * code recovers the shortest decimal that rounds to the float first. Also
 * the bf16 rounding the host side shares with the GPU's. */
#ifndef COLT_CORE_FLOATS_H
#define COLT_CORE_FLOATS_H

#include <stdint.h>
#include <string.h>

/* The double nearest to the shortest decimal that rounds to x (0.999f -> 0.999). */
double float_as_decimal(float x);

/* x rounded to bf16, to nearest even (NaN stays a quiet NaN): the CUDA
 * conversion's result. Inline, so loops over it vectorise. */
static inline uint16_t float_to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

#endif
