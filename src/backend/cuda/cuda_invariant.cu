/* cuda_invariant.cu — the batch-invariant linear of the deterministic mode
 * (backend.h set_batch_invariant): out[N,O] = x[N,I] @ w[O,I]^T (+ bias[O]) where
 * every output element is summed in an order that does not depend on N.
 *
 * Why: cuBLAS picks its kernel (tile shape, split-K, stream-K) from the shape,
 * so a row's result changes with the number of rows N. The trainer's forward
 * (N = every token of a micro-batch) and the engine's decode step (N = the
 * running sequences) would then round differently, and so would a sequence run
 * alone or in a batch.
 *
 * bf16, I and O multiples of 8 and both at least INV_CUBLAS_MIN_DIM (every
 * Qwen2.5 projection): cuBLASLt limited to algorithms without split-K
 * (cuda_gemm.cu, cuda_linear_split_free), which give the same bits for every N
 * and every such algorithm — measured, and re-checked by
 * tests/gpu/test_cuda_invariant.c. It runs at cuBLAS speed. (LoRA's r-wide
 * shapes, e.g. 2048 -> 16, measured otherwise: a GRPO run's engine and trainer
 * log-probs differed; they take colt's kernels.)
 *
 * bf16 otherwise (ragged shapes such as stories260K's, narrow ones), and when a test forces
 * a tile shape: colt's own kernels. k is cut into chunks of INV_KC = 256 from
 * k = 0 (the last one shorter). A chunk's partial sum starts at 0 and takes one
 * tensor-core mma (m16n8k16) per 16 k, in k order, over the chunk's 32-wide
 * tiles (zeros past I); the element's total is partial 0, then + partial 1,
 * + partial 2, ... in fp32; then + bias in fp32 and one rounding to bf16. Three
 * ways compute exactly that sequence of instructions per element:
 *   - the tiled GEMM (any N): x and w tiles staged in shared memory by cp.async
 *     (16-byte chunks) when I % 8 == 0 and the pointers are 16-byte aligned,
 *     else by element loads (same contents), fragments by ldmatrix, three tile
 *     shapes in M x N chosen from N and O to fill the GPU;
 *   - the decode kernel (N <= INV_DECODE_ROWS): a block owns 8 outputs, its 4
 *     warps take one chunk each per round and load their mma fragments straight
 *     from global memory (every weight read once, many chunks in flight), and
 *     the chunks' partials are added in chunk order through shared memory.
 *   - narrow outputs (O <= INV_NARROW_OUT, LoRA's A) at up to INV_NARROW_ROWS rows, where the tiled
 *     GEMM would run one or two blocks: the decode kernel's chunks spread over blocks (32 rows and 8
 *     outputs each, one chunk per warp) into fp32 partials, then summed in chunk order by a second kernel.
 * Tile shape and kernel only decide which elements a block computes, never
 * how: a row's bits are the same whatever N is, whatever the other rows hold,
 * whichever shape or kernel ran (tests/gpu/test_cuda_invariant.c forces each).
 * These plain mma.sync kernels run at ~100-120 TFLOP/s, a seventh of cuBLAS.
 *
 * fp32 (the cuda_f32 check table): CUDA cores, a 64 x 64 block tile, 4 x 4
 * outputs per thread, one fmaf chain per element in k order.
 *
 * Dimension legend: N token rows, I in_dim, O out_dim. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <type_traits>

#include "backend/cuda/cuda_common.cuh"

#define INV_BK 32      /* k per staged tile */
#define INV_LDS 40     /* shared-memory row pitch in bf16 (80 bytes: ldmatrix rows hit distinct banks) */
#define INV_STAGES 4   /* tiles in flight */
#define INV_KC 256     /* k per chunk: the unit of the bf16 summation order */
#define INV_TILES_PER_CHUNK (INV_KC / INV_BK)
#define INV_DECODE_ROWS 32 /* the decode kernel serves N up to this */
#define INV_DECODE_WARPS 4
/* Outputs this narrow (LoRA's A: r wide) at up to this many rows take the split kernels
 * (inv_split_partial_kernel): the tiled GEMM would give them one or two blocks. Same bits either way. */
#define INV_NARROW_OUT 64
#define INV_NARROW_ROWS 1024

/* ---------------------------------------------------------------- switch */

/* The mode is the instance's (CudaState.batch_invariant: bit 0 linear, bit 1
 * attention). Its option invariant_parts (COLT_INVARIANT_ONLY=linear|attention,
 * for experiments: which part of the mode closes how much of the trainer/engine
 * gap) keeps the other part on its default kernels; the log-probs are then no
 * longer bit-identical. */
void cuda_set_batch_invariant(const Backend *be, int on) {
    CudaState *cs = cuda_state(be);
    cs->batch_invariant = on ? cs->opt.invariant_parts : 0;
}
/* Tests: force the bf16 kernel of the instance be (0, 1, 2: the tiled GEMM's large, medium, small tile
 * shape; 3: the decode kernel, where N allows; -1 automatic). */
extern "C" void cuda_invariant_force_shape(const Backend *be, int shape) {
    cuda_state(be)->opt.invariant_forced_shape = shape;
}

/* ---------------------------------------------------------------- bf16 */

/* Block tile BM x BN of outputs, warps WARPS_M x WARPS_N each owning a
 * (BM / WARPS_M) x (BN / WARPS_N) sub-tile. */
template <int BM, int BN, int WARPS_M, int WARPS_N> struct InvShape {
    static constexpr int THREADS = WARPS_M * WARPS_N * 32;
    static constexpr int WM = BM / WARPS_M, WN = BN / WARPS_N;
    static constexpr int MI = WM / 16, NI = WN / 8; /* mma tiles per warp */
    static constexpr int STAGE_ELEMS = (BM + BN) * INV_LDS;
    static constexpr int SMEM_BYTES = INV_STAGES * STAGE_ELEMS * 2;
    static_assert(WM % 16 == 0 && WN % 16 == 0, "warp tile: whole m16 tiles, pairs of n8 tiles");
};

/* Stages rows [row0, row0 + ROWS) x k [k0, k0 + INV_BK) of src[rows_total, I]
 * into dst[ROWS][INV_LDS]; zeros beyond rows_total and I. */
template <int ROWS, int THREADS, bool VEC>
__device__ __forceinline__ void inv_stage(__nv_bfloat16 *dst, const __nv_bfloat16 *src, int row0, int rows_total,
                                          int k0, int in_dim) {
    constexpr int CHUNKS = ROWS * (INV_BK / 8);
#pragma unroll
    for (int c = threadIdx.x; c < CHUNKS; c += THREADS) {
        int r = c / (INV_BK / 8), kc = (c % (INV_BK / 8)) * 8;
        int row = row0 + r, k = k0 + kc;
        __nv_bfloat16 *d = dst + r * INV_LDS + kc;
        if (VEC) {
            bool valid = row < rows_total && k < in_dim; /* I % 8 == 0: a chunk is all in or all out */
            cp_async16(d, valid ? src + (size_t)row * in_dim + k : src, valid);
        } else {
            __align__(16) __nv_bfloat16 v[8];
#pragma unroll
            for (int e = 0; e < 8; e++)
                v[e] = row < rows_total && k + e < in_dim ? src[(size_t)row * in_dim + k + e] : __float2bfloat16_rn(0.0f);
            *reinterpret_cast<uint4 *>(d) = *reinterpret_cast<const uint4 *>(v);
        }
    }
}

template <int BM, int BN, int WARPS_M, int WARPS_N, bool VEC>
__global__ void __launch_bounds__(WARPS_M *WARPS_N * 32)
    inv_gemm_bf16_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                         const __nv_bfloat16 *bias, int n, int in_dim, int out_dim) {
    using S = InvShape<BM, BN, WARPS_M, WARPS_N>;
    extern __shared__ __align__(16) unsigned char inv_smem[];
    __nv_bfloat16 *smem = reinterpret_cast<__nv_bfloat16 *>(inv_smem);
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int wm = warp / WARPS_N, wn = warp % WARPS_N;
    const int row0 = blockIdx.y * BM, col0 = blockIdx.x * BN;
    const int k_tiles = (in_dim + INV_BK - 1) / INV_BK;

    auto stage_tile = [&](int tile) {
        __nv_bfloat16 *a = smem + (tile % INV_STAGES) * S::STAGE_ELEMS, *b = a + BM * INV_LDS;
        inv_stage<BM, S::THREADS, VEC>(a, x, row0, n, tile * INV_BK, in_dim);
        inv_stage<BN, S::THREADS, VEC>(b, w, col0, out_dim, tile * INV_BK, in_dim);
    };

    float acc[S::MI][S::NI][4], total[S::MI][S::NI][4]; /* the chunk's partial; the sum of the chunks before */
#pragma unroll
    for (int i = 0; i < S::MI; i++)
#pragma unroll
        for (int j = 0; j < S::NI; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[i][j][e] = 0.0f, total[i][j][e] = 0.0f;

#pragma unroll
    for (int t = 0; t < INV_STAGES - 1; t++) {
        if (t < k_tiles) stage_tile(t);
        cp_async_commit(); /* one group per tile, empty or not, so the wait count holds */
    }
    for (int tile = 0; tile < k_tiles; tile++) {
        cp_async_wait<INV_STAGES - 2>();
        __syncthreads(); /* this tile landed for every thread; the stage refilled below is free */
        if (tile + INV_STAGES - 1 < k_tiles) stage_tile(tile + INV_STAGES - 1);
        cp_async_commit();
        const __nv_bfloat16 *a = smem + (tile % INV_STAGES) * S::STAGE_ELEMS, *b = a + BM * INV_LDS;
#pragma unroll
        for (int ks = 0; ks < INV_BK; ks += 16) {
            uint32_t af[S::MI][4], bfr[S::NI][2];
#pragma unroll
            for (int i = 0; i < S::MI; i++) /* lanes 0-15: rows 0-15 at k, lanes 16-31: the same rows at k + 8 */
                ldmatrix_x4(af[i], a + (wm * S::WM + i * 16 + lane % 16) * INV_LDS + ks + (lane / 16) * 8);
#pragma unroll
            for (int j = 0; j < S::NI; j += 2) { /* two n8 tiles: (n 0-7, k), (n 0-7, k+8), (n 8-15, k), (n 8-15, k+8) */
                uint32_t r[4];
                ldmatrix_x4(r, b + (wn * S::WN + j * 8 + (lane / 16) * 8 + lane % 8) * INV_LDS + ks +
                                       ((lane / 8) % 2) * 8);
                bfr[j][0] = r[0], bfr[j][1] = r[1], bfr[j + 1][0] = r[2], bfr[j + 1][1] = r[3];
            }
#pragma unroll
            for (int i = 0; i < S::MI; i++)
#pragma unroll
                for (int j = 0; j < S::NI; j++) mma_bf16_m16n8k16(acc[i][j], af[i][0], af[i][1], af[i][2], af[i][3], bfr[j][0], bfr[j][1]);
        }
        if ((tile + 1) % INV_TILES_PER_CHUNK == 0 || tile + 1 == k_tiles) { /* a chunk ends: fold it in */
            bool first = tile < INV_TILES_PER_CHUNK;
#pragma unroll
            for (int i = 0; i < S::MI; i++)
#pragma unroll
                for (int j = 0; j < S::NI; j++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        total[i][j][e] = first ? acc[i][j][e] : total[i][j][e] + acc[i][j][e];
                        acc[i][j][e] = 0.0f;
                    }
        }
    }
    cp_async_wait<0>();

    /* d0, d1: row g, cols 2t, 2t+1; d2, d3: row g + 8 (g = lane / 4, t = lane % 4). */
#pragma unroll
    for (int i = 0; i < S::MI; i++)
#pragma unroll
        for (int j = 0; j < S::NI; j++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                int row = row0 + wm * S::WM + i * 16 + lane / 4 + h * 8;
                int col = col0 + wn * S::WN + j * 8 + (lane % 4) * 2;
                if (row >= n) continue;
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    if (col + e >= out_dim) continue;
                    float v = total[i][j][h * 2 + e];
                    if (bias) v += __bfloat162float(bias[col + e]);
                    out[(size_t)row * out_dim + col + e] = __float2bfloat16_rn(v);
                }
            }
}

template <int BM, int BN, int WARPS_M, int WARPS_N>
static void inv_launch_bf16(CudaState *cs, __nv_bfloat16 *out, const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                            const __nv_bfloat16 *bias, int n, int in_dim, int out_dim, bool vec) {
    using S = InvShape<BM, BN, WARPS_M, WARPS_N>;
    /* above 48 KB of dynamic shared memory needs the opt-in */
    cuda_smem_optin(cs, (const void *)inv_gemm_bf16_kernel<BM, BN, WARPS_M, WARPS_N, true>, S::SMEM_BYTES);
    cuda_smem_optin(cs, (const void *)inv_gemm_bf16_kernel<BM, BN, WARPS_M, WARPS_N, false>, S::SMEM_BYTES);
    dim3 grid((unsigned)((out_dim + BN - 1) / BN), (unsigned)((n + BM - 1) / BM));
    CUDA_ASSERT_HOST(grid.y <= 65535u);
    if (vec)
        inv_gemm_bf16_kernel<BM, BN, WARPS_M, WARPS_N, true>
            <<<grid, S::THREADS, S::SMEM_BYTES, cs->stream>>>(out, x, w, bias, n, in_dim, out_dim);
    else
        inv_gemm_bf16_kernel<BM, BN, WARPS_M, WARPS_N, false>
            <<<grid, S::THREADS, S::SMEM_BYTES, cs->stream>>>(out, x, w, bias, n, in_dim, out_dim);
    LAUNCH_CHECK(cs);
}

static size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }

/* ---------------------------------------------------------------- bf16 decode kernel */

/* Two consecutive bf16 of row `row` at k (k even), 0 past the edges; as one 32-bit fragment register
 * (the lower k in the low half, as ldmatrix leaves it). */
__device__ __forceinline__ uint32_t inv_pair(const __nv_bfloat16 *m, int row, int rows, int k, int in_dim, bool vec) {
    if (row >= rows || k >= in_dim) return 0u;
    const __nv_bfloat16 *p = m + (size_t)row * in_dim + k;
    if (vec) return __ldg(reinterpret_cast<const unsigned int *>(p)); /* I even, aligned: a 4-byte load */
    uint32_t lo = __bfloat16_as_ushort(p[0]), hi = k + 1 < in_dim ? __bfloat16_as_ushort(p[1]) : 0u;
    return lo | (hi << 16);
}

/* One warp's partial sum of chunk `chunk` for rows [0, 16 MT) (those below n) and outputs [col0, +8):
 * the mma sequence every bf16 kernel of this file runs for a chunk (fragments loaded from global memory
 * in the m16n8k16 layout: g = lane / 4, t = lane % 4; b0 = w[col g][k + 2t, +1], b1 = w[col g][k + 2t +
 * 8, +9]; a0 / a1 = x[row g / g + 8][k + 2t, +1], a2 / a3 the same at k + 2t + 8). Element (row, c)
 * goes to p[row * 8 + c]. */
template <int MT>
__device__ __forceinline__ void inv_chunk_partial(float *p, const __nv_bfloat16 *x, const __nv_bfloat16 *w, int n,
                                                  int in_dim, int out_dim, int col0, int chunk, bool vec) {
    constexpr int STEPS = INV_KC / 16; /* k16 steps per chunk */
    const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
    const int k_end = ((in_dim + INV_BK - 1) / INV_BK) * INV_BK; /* the tiled GEMM's last tile ends here */
    int k0 = chunk * INV_KC;
    uint32_t b[STEPS][2];
#pragma unroll
    for (int s = 0; s < STEPS; s++) { /* every weight load of the chunk first: all in flight */
        int k = k0 + s * 16 + 2 * t;
        b[s][0] = inv_pair(w, col0 + g, out_dim, k, in_dim, vec);
        b[s][1] = inv_pair(w, col0 + g, out_dim, k + 8, in_dim, vec);
    }
#pragma unroll
    for (int m = 0; m < MT; m++) {
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        int r0 = m * 16 + g;
#pragma unroll
        for (int s = 0; s < STEPS; s++) {
            int k = k0 + s * 16;
            if (k >= k_end) break; /* past the tiled GEMM's last tile: it runs no mma there */
            uint32_t a[4] = {inv_pair(x, r0, n, k + 2 * t, in_dim, vec), inv_pair(x, r0 + 8, n, k + 2 * t, in_dim, vec),
                             inv_pair(x, r0, n, k + 2 * t + 8, in_dim, vec),
                             inv_pair(x, r0 + 8, n, k + 2 * t + 8, in_dim, vec)};
            mma_bf16_m16n8k16(acc, a[0], a[1], a[2], a[3], b[s][0], b[s][1]);
        }
        /* d0, d1: row g, cols 2t, 2t + 1; d2, d3: row g + 8 */
        float *q = p + m * 128;
        q[g * 8 + 2 * t] = acc[0], q[g * 8 + 2 * t + 1] = acc[1];
        q[(g + 8) * 8 + 2 * t] = acc[2], q[(g + 8) * 8 + 2 * t + 1] = acc[3];
    }
}

/* Block: 8 outputs [blockIdx.x * 8, +8), all N (<= 16 * MT) rows. Round r: warp w computes chunk
 * 4r + w (its mma fragments loaded from global memory in the m16n8k16 layout: g = lane / 4,
 * t = lane % 4; b0 = w[col g][k + 2t, +1], b1 = w[col g][k + 2t + 8, +9]; a0 / a1 = x[row g /
 * g + 8][k + 2t, +1], a2 / a3 the same at k + 2t + 8), writes its partial to shared memory, and the
 * round's partials are added to the running totals in chunk order. */
template <int MT>
__global__ void __launch_bounds__(INV_DECODE_WARPS * 32)
    inv_decode_bf16_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                           const __nv_bfloat16 *bias, int n, int in_dim, int out_dim, bool vec) {
    constexpr int ELEMS = MT * 16 * 8; /* outputs per block */
    __shared__ float part[INV_DECODE_WARPS][ELEMS];
    const int warp = threadIdx.x / 32;
    const int col0 = blockIdx.x * 8;
    const int chunks = (in_dim + INV_KC - 1) / INV_KC;
    constexpr int PER_THREAD = (ELEMS + INV_DECODE_WARPS * 32 - 1) / (INV_DECODE_WARPS * 32);
    float total[PER_THREAD];
    for (int round = 0; round * INV_DECODE_WARPS < chunks; round++) {
        int chunk = round * INV_DECODE_WARPS + warp;
        if (chunk < chunks) inv_chunk_partial<MT>(part[warp], x, w, n, in_dim, out_dim, col0, chunk, vec);
        __syncthreads();
#pragma unroll
        for (int q = 0; q < PER_THREAD; q++) {
            int e = threadIdx.x + q * INV_DECODE_WARPS * 32;
            if (e >= ELEMS) continue;
            for (int c = 0; c < INV_DECODE_WARPS && round * INV_DECODE_WARPS + c < chunks; c++)
                total[q] = round == 0 && c == 0 ? part[c][e] : total[q] + part[c][e];
        }
        __syncthreads();
    }
#pragma unroll
    for (int q = 0; q < PER_THREAD; q++) {
        int e = threadIdx.x + q * INV_DECODE_WARPS * 32;
        int row = e / 8, col = col0 + e % 8;
        if (e >= ELEMS || row >= n || col >= out_dim) continue;
        float v = total[q];
        if (bias) v += __bfloat162float(bias[col]);
        out[(size_t)row * out_dim + col] = __float2bfloat16_rn(v);
    }
}

/* Narrow outputs (LoRA's A, r wide) at more than INV_DECODE_ROWS rows: the decode kernel's chunks spread
 * over blocks as well, for parallelism. Block (x: 8 outputs, y: 32 rows, z: INV_DECODE_WARPS chunks),
 * each warp one chunk's partial (inv_chunk_partial) into part[chunk][row][col]; then
 * inv_chunks_sum_kernel adds the chunks in chunk order, + bias, one rounding: the decode kernel's
 * arithmetic exactly. */
__global__ void __launch_bounds__(INV_DECODE_WARPS * 32)
    inv_split_partial_kernel(float *part, const __nv_bfloat16 *x, const __nv_bfloat16 *w, int n, int in_dim,
                             int out_dim, bool vec) {
    constexpr int ELEMS = 32 * 8;
    __shared__ float p[INV_DECODE_WARPS][ELEMS];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int col0 = blockIdx.x * 8, row_base = blockIdx.y * 32;
    const int chunks = (in_dim + INV_KC - 1) / INV_KC, chunk = blockIdx.z * INV_DECODE_WARPS + warp;
    if (chunk >= chunks) return;
    const int rows = min(n - row_base, 32);
    inv_chunk_partial<2>(p[warp], x + (size_t)row_base * in_dim, w, rows, in_dim, out_dim, col0, chunk, vec);
    __syncwarp();
    for (int e = lane; e < ELEMS; e += 32) {
        int row = e / 8, col = col0 + e % 8;
        if (row < rows && col < out_dim) part[((size_t)chunk * n + row_base + row) * out_dim + col] = p[warp][e];
    }
}

__global__ void inv_chunks_sum_kernel(__nv_bfloat16 *out, const float *part, const __nv_bfloat16 *bias, int n,
                                      int out_dim, int chunks) {
    size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x, total = (size_t)n * out_dim;
    if (e >= total) return;
    float v = part[e];
    for (int c = 1; c < chunks; c++) v = v + part[(size_t)c * total + e];
    if (bias) v += __bfloat162float(bias[e % out_dim]);
    out[e] = __float2bfloat16_rn(v);
}

static void inv_linear_bf16(CudaState *cs, __nv_bfloat16 *out, const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                            const __nv_bfloat16 *bias, int n, int in_dim, int out_dim) {
    bool vec = in_dim % 8 == 0 && aligned16(x) && aligned16(w);
    int shape = cs->opt.invariant_forced_shape;
    bool narrow = out_dim <= INV_NARROW_OUT && n <= INV_NARROW_ROWS;
    bool vec2 = in_dim % 2 == 0 && ((uintptr_t)x & 3) == 0 && ((uintptr_t)w & 3) == 0;
    if ((shape < 0 || shape == 3) && narrow && n > INV_DECODE_ROWS) { /* chunks over blocks, then their sum */
        int chunks = (int)ceil_div((size_t)in_dim, INV_KC);
        float *part = (float *)cuda_scratch(cs, (size_t)chunks * n * out_dim * sizeof(float));
        dim3 grid((unsigned)ceil_div((size_t)out_dim, 8), (unsigned)ceil_div((size_t)n, 32),
                  (unsigned)ceil_div((size_t)chunks, INV_DECODE_WARPS));
        inv_split_partial_kernel<<<grid, INV_DECODE_WARPS * 32, 0, cs->stream>>>(part, x, w, n, in_dim, out_dim, vec2);
        LAUNCH_CHECK(cs);
        size_t total = (size_t)n * out_dim;
        inv_chunks_sum_kernel<<<(unsigned)ceil_div(total, 256), 256, 0, cs->stream>>>(out, part, bias, n, out_dim,
                                                                                      chunks);
        LAUNCH_CHECK(cs);
        return;
    }
    if ((shape < 0 || shape == 3) && n <= INV_DECODE_ROWS) { /* decode: stream every weight once */
        dim3 grid((unsigned)ceil_div((size_t)out_dim, 8), (unsigned)ceil_div((size_t)n, 32));
        if (n <= 16)
            inv_decode_bf16_kernel<1><<<grid, INV_DECODE_WARPS * 32, 0, cs->stream>>>(out, x, w, bias, n, in_dim,
                                                                                      out_dim, vec2);
        else
            inv_decode_bf16_kernel<2><<<grid, INV_DECODE_WARPS * 32, 0, cs->stream>>>(out, x, w, bias, n, in_dim,
                                                                                      out_dim, vec2);
        LAUNCH_CHECK(cs);
        return;
    }
    /* The largest tile that still gives every SM a block (weights re-read per row tile). */
    size_t sms = (size_t)cs->sm_count;
    if (shape < 0 || shape == 3) {
        if (ceil_div((size_t)n, 128) * ceil_div((size_t)out_dim, 128) >= sms) shape = 0;
        else if (ceil_div((size_t)n, 64) * ceil_div((size_t)out_dim, 64) >= sms) shape = 1;
        else shape = 2;
    }
    if (shape == 0) inv_launch_bf16<128, 128, 2, 4>(cs, out, x, w, bias, n, in_dim, out_dim, vec);
    else if (shape == 1) inv_launch_bf16<64, 64, 2, 2>(cs, out, x, w, bias, n, in_dim, out_dim, vec);
    else inv_launch_bf16<16, 64, 1, 4>(cs, out, x, w, bias, n, in_dim, out_dim, vec);
}

/* ---------------------------------------------------------------- fp32 */

#define INV_F32_TILE 64
#define INV_F32_BK 16

/* 16 x 16 threads, each 4 x 4 outputs (rows ty + 16 a, cols tx + 16 b). */
__global__ void __launch_bounds__(256) inv_gemm_f32_kernel(float *out, const float *x, const float *w,
                                                           const float *bias, int n, int in_dim, int out_dim) {
    __shared__ float xs[INV_F32_BK][INV_F32_TILE + 1], ws[INV_F32_BK][INV_F32_TILE + 1];
    const int tx = threadIdx.x % 16, ty = threadIdx.x / 16;
    const int row0 = blockIdx.y * INV_F32_TILE, col0 = blockIdx.x * INV_F32_TILE;
    float acc[4][4] = {};
    for (int k0 = 0; k0 < in_dim; k0 += INV_F32_BK) {
        for (int e = threadIdx.x; e < INV_F32_TILE * INV_F32_BK; e += 256) {
            int r = e / INV_F32_BK, k = e % INV_F32_BK;
            int row = row0 + r, col = col0 + r, kk = k0 + k;
            xs[k][r] = row < n && kk < in_dim ? x[(size_t)row * in_dim + kk] : 0.0f;
            ws[k][r] = col < out_dim && kk < in_dim ? w[(size_t)col * in_dim + kk] : 0.0f;
        }
        __syncthreads();
#pragma unroll
        for (int k = 0; k < INV_F32_BK; k++)
#pragma unroll
            for (int a = 0; a < 4; a++)
#pragma unroll
                for (int b = 0; b < 4; b++) acc[a][b] = fmaf(xs[k][ty + 16 * a], ws[k][tx + 16 * b], acc[a][b]);
        __syncthreads();
    }
#pragma unroll
    for (int a = 0; a < 4; a++)
#pragma unroll
        for (int b = 0; b < 4; b++) {
            int row = row0 + ty + 16 * a, col = col0 + tx + 16 * b;
            if (row < n && col < out_dim) out[(size_t)row * out_dim + col] = acc[a][b] + (bias ? bias[col] : 0.0f);
        }
}

/* ---------------------------------------------------------------- entry */

/* Narrower shapes never go to cuBLASLt in this mode (see cuda_invariant_linear). */
#define INV_CUBLAS_MIN_DIM 128

template <typename T>
void cuda_invariant_linear(CudaState *cs, void *out, const void *x, const void *w, const void *bias, int n, int in_dim,
                           int out_dim) {
    if (n <= 0 || out_dim <= 0) return;
    if constexpr (std::is_same<T, __nv_bfloat16>::value) {
        /* cuBLASLt's split-K-free algorithms were found invariant on projection shapes (in and out >= 896);
         * LoRA's rank-wide ones (r = 16 in or out) measured otherwise at scale: colt's own kernel takes them. */
        bool wide = in_dim >= INV_CUBLAS_MIN_DIM && out_dim >= INV_CUBLAS_MIN_DIM;
        if (wide && cs->opt.invariant_forced_shape < 0 &&
            cuda_linear_split_free(cs, out, x, w, bias, n, in_dim, out_dim))
            return;
        inv_linear_bf16(cs, (T *)out, (const T *)x, (const T *)w, (const T *)bias, n, in_dim, out_dim);
    } else {
        dim3 grid((unsigned)ceil_div((size_t)out_dim, INV_F32_TILE), (unsigned)ceil_div((size_t)n, INV_F32_TILE));
        CUDA_ASSERT_HOST(grid.y <= 65535u);
        inv_gemm_f32_kernel<<<grid, 256, 0, cs->stream>>>((float *)out, (const float *)x, (const float *)w,
                                                          (const float *)bias, n, in_dim, out_dim);
        LAUNCH_CHECK(cs);
    }
}

template void cuda_invariant_linear<float>(CudaState *, void *, const void *, const void *, const void *, int, int,
                                           int);
template void cuda_invariant_linear<__nv_bfloat16>(CudaState *, void *, const void *, const void *, const void *, int,
                                                   int, int);
