/* bench_grid_sync.cu — what one grid-wide exchange costs on this GPU: the floor under each of the
 * all-layers decode kernel's phases (cuda_decode_layers.cu), where every CTA publishes its slice of a
 * vector and then needs all of it.
 *
 * One CTA of 512 threads per SM (a cooperative launch, as decode_layers), PHASES phases in a row; in
 * each, every CTA writes its 1/G share of a D-element fp32 vector, then:
 *   barrier only     the grid barrier alone (red.release.gpu on one counter, ld.acquire.gpu polls:
 *                    cuda_grid_barrier.cuh, decode_layers' barrier), nothing read;
 *   barrier + read   the barrier, then every CTA reads the whole vector (ld.cg) and sums it, the sum
 *                    feeding the next phase's values (a real dependency);
 *   tagged words     no barrier: each value travels with the phase number in the same 8-byte word
 *                    (st.relaxed / ld.relaxed.v2.u64, NCCL's LL protocol), readers poll the words;
 *   per-CTA flags    each CTA publishes a flag (st.release.gpu), one warp polls all G flags, then
 *                    reads the vector as "barrier + read";
 *   copies in flight "barrier + read" (or the barrier alone) while weight-like reads stream: every
 *                    thread starts STREAM_CHUNKS (or one) 16-byte cp.async of a 1 GiB buffer per phase,
 *                    or thread 0 one bulk copy (the TMA) of the same bytes, each waited for only
 *                    STREAM_DEPTH phases later, so their latency is never waited on — what the all-layers
 *                    kernel's weight ring does at each of its barriers ("quiet": thread 0, the one that
 *                    arrives and polls, has no copy of its own).
 * Prints us per phase (best of 4 launches). Usage: bench_grid_sync (exit 77 without a device). */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>

#include "backend/cuda/cuda_grid_barrier.cuh"

#define BENCH_NAME "bench_grid_sync"
#include "bench_grid_common.cuh"

#define THREADS 512
#define PHASES 2000
#define MAX_D 8960

enum { BARRIER_ONLY, BARRIER_READ, TAGGED, FLAGS_READ, STREAM_READ, STREAM_READ_QUIET, STREAM_BARRIER, STREAM_READ_1,
       STREAM_READ_BULK, MODES };
static const char *const MODE_NAMES[MODES] = {"barrier only",         "barrier + read",
                                              "tagged words",         "per-CTA flags + read",
                                              "barrier + read, copies in flight", "the same, arriving thread quiet",
                                              "barrier only, copies in flight", "barrier + read, half the copies",
                                              "barrier + read, one bulk copy in flight"};
#define STREAM_CHUNKS 2 /* 16-byte cp.async per thread per phase in the streaming modes */
#define STREAM_DEPTH 4  /* phases a copy has to land before it is waited for */

__device__ __forceinline__ void flag_barrier(unsigned *flags, unsigned gen) {
    __syncthreads();
    if (threadIdx.x < 32) {
        if (threadIdx.x == 0) asm volatile("st.release.gpu.global.u32 [%0], %1;" ::"l"(flags + blockIdx.x), "r"(gen) : "memory");
        bool all;
        do {
            all = true;
            for (int c = threadIdx.x; c < gridDim.x; c += 32) {
                unsigned v;
                asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(flags + c) : "memory");
                all &= v >= gen;
            }
        } while (!__all_sync(0xffffffffu, all));
        asm volatile("fence.acq_rel.gpu;" ::: "memory");
    }
    __syncthreads();
}

/* sync: [0] the barrier's counter, [64..) the per-CTA flags; vec [2][MAX_D] fp32; tagged [2][MAX_D]. */
__global__ void __launch_bounds__(THREADS, 1) exchange_kernel(int mode, int D, unsigned *sync, float *vec,
                                                               unsigned long long *tagged, unsigned epoch, float *out,
                                                               const uint4 *stream, size_t stream_chunks) {
    const int G = gridDim.x, c = blockIdx.x;
    extern __shared__ uint4 landing[]; /* [STREAM_DEPTH][STREAM_CHUNKS][THREADS] */
    __shared__ __align__(8) unsigned long long bulk_bars[STREAM_DEPTH];
    if (threadIdx.x < STREAM_DEPTH) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"((unsigned)__cvta_generic_to_shared(&bulk_bars[threadIdx.x])) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    size_t next = ((size_t)c * THREADS + threadIdx.x) * STREAM_CHUNKS;
    const int r0 = (int)((long long)D * c / G), r1 = (int)((long long)D * (c + 1) / G);
    float val = 1.0f;
    for (int ph = 0; ph < PHASES; ph++) {
        const int buf = ph & 1; /* two buffers: a CTA one phase ahead never overwrites what another reads */
        if (mode == TAGGED) {
            const unsigned tag = epoch + ph + 1;
            for (int i = r0 + threadIdx.x; i < r1; i += THREADS) {
                unsigned long long w = (unsigned long long)__float_as_uint(val + i) | ((unsigned long long)tag << 32);
                asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(tagged + (size_t)buf * MAX_D + i), "l"(w) : "memory");
            }
            float s = 0.0f;
            for (int i = 2 * threadIdx.x; i < D; i += 2 * THREADS) {
                unsigned long long a, b;
                do {
                    asm volatile("ld.relaxed.gpu.global.v2.u64 {%0,%1}, [%2];"
                                 : "=l"(a), "=l"(b)
                                 : "l"(tagged + (size_t)buf * MAX_D + i)
                                 : "memory");
                } while ((unsigned)(a >> 32) != tag || (unsigned)(b >> 32) != tag);
                s += __uint_as_float((unsigned)a) + __uint_as_float((unsigned)b);
            }
            val = block_sum<THREADS>(s) * 1e-9f + 1.0f;
            continue;
        }
        for (int i = r0 + threadIdx.x; i < r1; i += THREADS) vec[(size_t)buf * MAX_D + i] = val + i;
        if (mode == STREAM_READ_BULK && threadIdx.x == 0) {
            /* the same bytes as one bulk copy (the TMA) on the slot's mbarrier */
            const int slot = ph % STREAM_DEPTH;
            const unsigned bar = (unsigned)__cvta_generic_to_shared(&bulk_bars[slot]);
            if (ph >= STREAM_DEPTH) /* the copy this slot took STREAM_DEPTH phases ago has landed */
                mbar_wait(&bulk_bars[slot], (unsigned)((ph / STREAM_DEPTH - 1) & 1));
            const unsigned bytes = STREAM_CHUNKS * THREADS * 16;
            asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         ::"r"((unsigned)__cvta_generic_to_shared(&landing[(size_t)slot * STREAM_CHUNKS * THREADS])),
                         "l"(stream + next % (stream_chunks - THREADS * STREAM_CHUNKS)), "r"(bytes), "r"(bar)
                         : "memory");
            next += (size_t)G * THREADS * STREAM_CHUNKS; /* thread 0's next: the CTA's 16 KB of the next phase */
        }
        if (mode == STREAM_READ || mode == STREAM_BARRIER || mode == STREAM_READ_1 ||
            (mode == STREAM_READ_QUIET && threadIdx.x != 0)) {
            /* weights-like traffic in flight across the barrier, as decode_layers' ring keeps it */
            for (int k = 0; k < (mode == STREAM_READ_1 ? 1 : STREAM_CHUNKS); k++) {
                unsigned dst = (unsigned)__cvta_generic_to_shared(
                    &landing[((size_t)(ph % STREAM_DEPTH) * STREAM_CHUNKS + k) * THREADS + threadIdx.x]);
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(stream + next % stream_chunks) : "memory");
                next += (size_t)G * THREADS * STREAM_CHUNKS;
            }
            asm volatile("cp.async.commit_group;" ::: "memory");
            asm volatile("cp.async.wait_group %0;" ::"n"(STREAM_DEPTH - 1) : "memory");
        }
        if (mode == FLAGS_READ) flag_barrier(sync + 64, epoch + ph + 1);
        else {
            grid_barrier_arrive(sync);
            grid_barrier_wait(sync, (unsigned)(ph + 1) * G);
        }
        if (mode == BARRIER_ONLY || mode == STREAM_BARRIER) continue;
        float s = 0.0f;
        for (int i = 4 * threadIdx.x; i < D; i += 4 * THREADS) {
            float4 v = __ldcg(reinterpret_cast<const float4 *>(vec + (size_t)buf * MAX_D + i));
            s += v.x + v.y + v.z + v.w;
        }
        val = block_sum<THREADS>(s) * 1e-9f + 1.0f;
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    if (mode == STREAM_READ_BULK && threadIdx.x == 0) /* the last copies land before the CTA exits */
        for (int ph = PHASES - STREAM_DEPTH; ph < PHASES; ph++)
            mbar_wait(&bulk_bars[ph % STREAM_DEPTH], (unsigned)((ph / STREAM_DEPTH) & 1));
    __syncthreads();
    if (threadIdx.x == 0) out[c] = val;
}

int main(void) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        printf("no CUDA device\n");
        return 77;
    }
    int G = 0;
    cudaDeviceProp prop;
    CHECK(cudaDeviceGetAttribute(&G, cudaDevAttrMultiProcessorCount, 0));
    CHECK(cudaGetDeviceProperties(&prop, 0));
    unsigned *sync;
    float *vec, *out;
    unsigned long long *tagged;
    CHECK(cudaMalloc(&sync, 4096 * sizeof(unsigned)));
    CHECK(cudaMalloc(&vec, 2 * MAX_D * sizeof(float)));
    CHECK(cudaMalloc(&tagged, 2 * MAX_D * sizeof(unsigned long long)));
    CHECK(cudaMalloc(&out, G * sizeof(float)));
    const size_t stream_bytes = (size_t)1 << 30; /* 1 GiB, more than the L2: the copies reach the HBM */
    uint4 *stream;
    size_t stream_chunks = stream_bytes / sizeof(uint4);
    CHECK(cudaMalloc(&stream, stream_bytes));
    CHECK(cudaMemset(stream, 0, stream_bytes));
    const size_t landing_bytes = (size_t)STREAM_DEPTH * STREAM_CHUNKS * THREADS * sizeof(uint4);
    CHECK(cudaFuncSetAttribute((void *)exchange_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)landing_bytes));
    CHECK(cudaMemset(tagged, 0, 2 * MAX_D * sizeof(unsigned long long)));
    CHECK(cudaMemset(sync, 0, 4096 * sizeof(unsigned)));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    printf("Grid-wide exchange, %d CTAs x %d threads (one per SM), %d phases per launch, us per phase (best of 4)\n\n",
           G, THREADS, PHASES);
    printf("| vector (fp32) |");
    for (int m = 0; m < MODES; m++) printf(" %s |", MODE_NAMES[m]);
    printf("\n|---:|");
    for (int m = 0; m < MODES; m++) printf("---:|");
    printf("\n");
    const int dims[4] = {896, 1536, 4864, 8960}; /* Qwen2.5 0.5B / 1.5B hidden and intermediate sizes */
    unsigned epoch = 0;                        /* tags and flags only grow across launches */
    for (int k = 0; k < 4; k++) {
        int D = dims[k];
        printf("| %d |", D);
        for (int mode = 0; mode < MODES; mode++) {
            float best = 1e30f;
            for (int rep = 0; rep < 4; rep++) {
                CHECK(cudaMemset(sync, 0, sizeof(unsigned))); /* the counter; the flags keep growing */
                void *args[] = {&mode, &D, &sync, &vec, &tagged, &epoch, &out, &stream, &stream_chunks};
                CHECK(cudaEventRecord(e0));
                CHECK(cudaLaunchCooperativeKernel((void *)exchange_kernel, G, THREADS, args, landing_bytes, 0));
                CHECK(cudaEventRecord(e1));
                CHECK(cudaEventSynchronize(e1));
                epoch += PHASES;
                float ms = 0.0f;
                CHECK(cudaEventElapsedTime(&ms, e0, e1));
                if (ms < best) best = ms;
            }
            printf(" %.2f |", best * 1e3f / PHASES);
        }
        printf("\n");
    }
    printf("\nCommand: build-cuda/bench_grid_sync; hardware: %s, %d SMs.\n", prop.name, G);
    return 0;
}
