/* floats.h — reading a float as the decimal a user wrote. Settings arrive as
 * floats (0.999f); PyTorch keeps them as Python floats (doubles of 0.999).
 * Computing 1 - beta from (double)0.999f is off by 1e-5 relative, so parity
 * code recovers the shortest decimal that rounds to the float first. */
#ifndef COLT_CORE_FLOATS_H
#define COLT_CORE_FLOATS_H

/* The double nearest to the shortest decimal that rounds to x (0.999f -> 0.999). */
double float_as_decimal(float x);

#endif
