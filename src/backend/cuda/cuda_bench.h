/* cuda_bench.h — timing helpers of the CUDA backend for benchmarks and tests
 * (CUDA builds only). Not part of the op table. */
#ifndef COLT_BACKEND_CUDA_BENCH_H
#define COLT_BACKEND_CUDA_BENCH_H

#ifdef __cplusplus
extern "C" {
#endif

#include "backend/backend.h" /* C declarations: inside the extern "C" block */

/* Calls fn(ctx) once to warm up, then iters times between two CUDA events on
 * the compute stream of the CUDA instance be; returns milliseconds per call
 * (-1 when be is NULL: no GPU). fn must only enqueue work on be (ops, not
 * downloads). */
double backend_cuda_time_ms(const Backend *be, void (*fn)(void *), void *ctx, int iters);

#ifdef __cplusplus
}
#endif

#endif
