/* bench_grid_common.cuh — what the two grid benchmarks (bench_grid_sync.cu, bench_layer_floor.cu) share:
 * their error check, a block-wide sum and the mbarrier wait of their bulk copies. Define BENCH_NAME
 * (the program's name, for error lines) before including. */
#pragma once
#include <cuda_runtime.h>
#include <stdio.h>

/* On a failed CUDA call: one line naming the program, the call and the error, and main returns 1. */
#define CHECK(call)                                                                                                \
    do {                                                                                                           \
        cudaError_t e_ = (call);                                                                                   \
        if (e_ != cudaSuccess) {                                                                                   \
            fprintf(stderr, "%s: %s: %s\n", BENCH_NAME, #call, cudaGetErrorString(e_));                           \
            return 1;                                                                                              \
        }                                                                                                          \
    } while (0)

__device__ __forceinline__ unsigned smem_addr(const void *p) { return (unsigned)__cvta_generic_to_shared(p); }

/* Spins until the phase of mbarrier `bar` with this parity has completed (its bulk copy has landed). */
__device__ __forceinline__ void mbar_wait(unsigned long long *bar, unsigned parity) {
    unsigned done;
    do {
        asm volatile("{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n selp.u32 %0, 1, 0, p;\n}"
                     : "=r"(done)
                     : "r"(smem_addr(bar)), "r"(parity)
                     : "memory");
    } while (!done);
}

/* The sum of v over a CTA of NT threads, returned to every thread. */
template <int NT>
__device__ float block_sum(float v) {
    __shared__ float warp_sums[NT / 32];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (threadIdx.x % 32 == 0) warp_sums[threadIdx.x / 32] = v;
    __syncthreads();
    float total = 0.0f;
    for (int k = 0; k < NT / 32; k++) total += warp_sums[k];
    __syncthreads();
    return total;
}
