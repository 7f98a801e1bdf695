/* cuda_bench.h — timing helpers of the CUDA backend for benchmarks and tests
 * (CUDA builds only). Not part of the op table. */
#ifndef COLT_BACKEND_CUDA_BENCH_H
#define COLT_BACKEND_CUDA_BENCH_H

#ifdef __cplusplus
extern "C" {
#endif

/* Calls fn(ctx) once to warm up, then iters times between two CUDA events on
 * the backend's stream; returns milliseconds per call (-1 without a GPU).
 * fn must only enqueue work on the backend (ops, not downloads). */
double backend_cuda_time_ms(void (*fn)(void *), void *ctx, int iters);

/* Waits for every op enqueued so far. */
void backend_cuda_synchronize(void);

#ifdef __cplusplus
}
#endif

#endif
