/* cuda_skinny.cu — linear for a few token rows (decode): out[N,O] = x[N,I] @ w[O,I]^T (+ bias[O]),
 * 1 <= N <= SKINNY_MAX_ROWS. At such N the op is bound by reading w once, and cuBLAS's fixed cost
 * (~10 us per call on an H200) dominates every projection of a small model; these kernels stream w
 * with 16-byte loads, one launch per call, no workspace.
 *
 * Not here: large N (cuBLAS, cuda_gemm.cu), the backward pass, split-K across blocks (it would need
 * a workspace or atomics; splitting K across the warps of one block is enough for the shapes we have).
 *
 * Dimension legend: N token rows, I in_dim, O out_dim.
 *
 * Contract (both storage types): fp32 accumulation, bias added in fp32, one rounding to T. Requires
 * I % 8 == 0 and 16-byte aligned x and w; cuda_skinny_linear returns false otherwise (the caller then
 * uses cuBLAS). Deterministic and batch invariant: the launch geometry and every summation order
 * depend only on (I, O), never on N, so row i's result is bit-identical whatever N is and whatever
 * the other rows hold. (cuBLAS for N > SKINNY_MAX_ROWS rounds differently, so a row's bits change
 * when N crosses that bound.) CUDA-graph capturable: no allocation, sync or host copy.
 *
 * bf16 (backend_cuda): tensor cores, mma.m16n8k16 with the token rows as A (16 rows per tile,
 * padding rows are zeros) and 8 weight rows as B. A lane loads 8 consecutive k of one weight row
 * (16 bytes) and 8 consecutive k of its token rows; the pair of mmas that consumes them uses k
 * slots {2t, 2t+1, 2t+8, 2t+9} of each, a permutation of k applied identically to A and B, so the
 * product is unchanged. A warp owns OUT_TILES x 8 outputs; the warps of a block split K into
 * interleaved chunks and their partial sums are added in warp order through shared memory. Error:
 * fp32 accumulation (tensor-core adds) + the final bf16 rounding, |err| <~ |ref| * 2^-8.
 *
 * fp32 (backend_cuda_f32, the tight reference table): CUDA cores, explicit fmaf chains, a block owns
 * 4 outputs, lanes take float4 slices of k, rows in passes of 8 (w is re-read per pass), a fixed
 * xor-butterfly warp reduction, then warps added in order. Error ~1e-6 of max|ref|.
 *
 * COLT_NO_SKINNY=1 (read when the instance opens: its option skinny) turns the path off; tests and
 * benchmarks switch it per instance with cuda_skinny_set_enabled. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"

/* Warps in one block (all on the same outputs, splitting K). */
#define SKINNY_MAX_WARPS 16
/* Split K until about this many warps are running: ~16 per SM on 132 SMs keeps enough loads in
 * flight; a constant (not the device's SM count) so results do not depend on the GPU model. */
#define SKINNY_TARGET_WARPS 2048
/* bf16: 16-byte weight loads a lane issues before its first mma of a chunk. */
#define BF16_LOADS_PER_LANE 8
/* bf16: shared memory for the K-split reduction stays <= 32 KB (no opt-in attribute needed). */
#define BF16_MAX_WARP_TILES 32
/* fp32: outputs per block, token rows per pass, 128-wide k steps per chunk. */
#define F32_OUTS 4
#define F32_ROWS 8
#define F32_STEPS 2

/* ---------------------------------------------------------------- switch and counter */

/* For tests and benchmarks (declared where they use them), on the instance be: 3 the bf16 GEMV for every
 * shape it takes (1..4 rows), 2 the tensor-core kernel for every shape it takes, 1 each where it beats
 * cuBLAS (the default), 0 off (cuBLAS), -1 back to the setting the instance opened with. */
extern "C" void cuda_skinny_set_enabled(const Backend *be, int enabled) {
    CudaState *cs = cuda_state(be);
    cs->opt.skinny = enabled < 0 ? cs->opt_env.skinny : enabled > 3 ? 3 : enabled;
}

/* Where the path beats cuBLASLt, from bench_skinny on an H200 (weights streamed from HBM): up to 16
 * rows and weights up to ~4.5M elements (0.5B's q/k/v/o/gate/up/down, 1.5B's q/k/v/o, 7B's k/v:
 * 1.3-2x, about 5 us against cuBLAS's 9-10 us). Larger weights stream faster through cuBLAS
 * (2.7-3.6 TB/s against 2-2.5 here), and at 17-32 rows cuBLAS wins everywhere. */
#define SKINNY_WIN_ROWS 16
#define SKINNY_WIN_WEIGHTS ((size_t)4608 * 1024)
static bool skinny_wins(int n, int in_dim, int out_dim) {
    return n <= SKINNY_WIN_ROWS && (size_t)in_dim * (size_t)out_dim <= SKINNY_WIN_WEIGHTS;
}

/* How many linear calls this path has served on the instance be (host calls, not graph replays). */
extern "C" long cuda_skinny_call_count(const Backend *be) { return cuda_state(be)->skinny_calls; }

/* ---------------------------------------------------------------- device helpers */

/* Weights are read once: evict-first, so x and the activations stay cached. */
__device__ __forceinline__ uint4 load_streaming(const void *p) { return __ldcs(reinterpret_cast<const uint4 *>(p)); }
__device__ __forceinline__ float4 load_streaming_f4(const float *p) {
    return __ldcs(reinterpret_cast<const float4 *>(p));
}
/* x is re-read by every block: read-only path, cached in L1. */
__device__ __forceinline__ uint4 load_cached(const void *p) { return __ldg(reinterpret_cast<const uint4 *>(p)); }
__device__ __forceinline__ float4 load_cached_f4(const float *p) { return __ldg(reinterpret_cast<const float4 *>(p)); }

/* ---------------------------------------------------------------- bf16: tensor cores */

/* Block: blockDim.x / 32 warps on outputs [blockIdx.x * OUT_TILES * 8, +OUT_TILES * 8); warp w takes
 * k chunks w, w + warps, ... (a chunk is STEPS x 32 k). ROWS (8, 16 or 32) is the token capacity;
 * it only decides which token rows are loaded, never the order of any sum. Dynamic shared memory:
 * warps x FRAG x 32 floats when warps > 1. */
template <int OUT_TILES, int ROWS>
__global__ void __launch_bounds__(SKINNY_MAX_WARPS * 32)
    skinny_bf16_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *x, const __nv_bfloat16 *w,
                       const __nv_bfloat16 *bias, int n, int in_dim, int out_dim) {
    constexpr int STEPS = BF16_LOADS_PER_LANE / OUT_TILES; /* 32-wide k steps per chunk */
    constexpr int ROW_TILES = (ROWS + 15) / 16;
    constexpr int FRAG = ROW_TILES * OUT_TILES * 4; /* accumulators per lane */
    const int chunk_len = STEPS * 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    const int group = lane >> 2, quad = lane & 3;
    const int out_base = blockIdx.x * OUT_TILES * 8;

    /* This lane's weight rows (B column g of each 8-output tile) and token rows (A rows g, g+8). */
    const __nv_bfloat16 *w_row[OUT_TILES];
    bool w_valid[OUT_TILES];
#pragma unroll
    for (int ot = 0; ot < OUT_TILES; ot++) {
        int o = out_base + ot * 8 + group;
        w_valid[ot] = o < out_dim;
        w_row[ot] = w + (size_t)(w_valid[ot] ? o : 0) * in_dim + quad * 8;
    }
    const __nv_bfloat16 *x_row[ROW_TILES][2];
    bool x_valid[ROW_TILES][2];
#pragma unroll
    for (int rt = 0; rt < ROW_TILES; rt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int r = rt * 16 + h * 8 + group;
            x_valid[rt][h] = rt * 16 + h * 8 < ROWS && r < n; /* the first test folds at compile time */
            x_row[rt][h] = x + (size_t)(x_valid[rt][h] ? r : 0) * in_dim + quad * 8;
        }

    float acc[FRAG];
#pragma unroll
    for (int f = 0; f < FRAG; f++) acc[f] = 0.0f;

    const int n_chunks = (in_dim + chunk_len - 1) / chunk_len;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    for (int chunk = warp; chunk < n_chunks; chunk += n_warps) {
        const int k0 = chunk * chunk_len;
        /* All weight loads of the chunk first: they are what the kernel waits for. */
        uint4 wv[STEPS][OUT_TILES];
#pragma unroll
        for (int s = 0; s < STEPS; s++) {
            const bool k_ok = k0 + s * 32 + quad * 8 < in_dim; /* in_dim % 8 == 0: all 8 or none */
#pragma unroll
            for (int ot = 0; ot < OUT_TILES; ot++)
                wv[s][ot] = k_ok && w_valid[ot] ? load_streaming(w_row[ot] + k0 + s * 32) : zero;
        }
#pragma unroll
        for (int s = 0; s < STEPS; s++) {
            const bool k_ok = k0 + s * 32 + quad * 8 < in_dim;
#pragma unroll
            for (int rt = 0; rt < ROW_TILES; rt++) {
                uint4 xa = k_ok && x_valid[rt][0] ? load_cached(x_row[rt][0] + k0 + s * 32) : zero;
                uint4 xb = k_ok && x_valid[rt][1] ? load_cached(x_row[rt][1] + k0 + s * 32) : zero;
#pragma unroll
                for (int ot = 0; ot < OUT_TILES; ot++) {
                    float *d = &acc[(rt * OUT_TILES + ot) * 4];
                    /* k 0..3 of the 8 loaded, then k 4..7 (see the file comment) */
                    mma_bf16_m16n8k16(d, xa.x, xb.x, xa.y, xb.y, wv[s][ot].x, wv[s][ot].y);
                    mma_bf16_m16n8k16(d, xa.z, xb.z, xa.w, xb.w, wv[s][ot].z, wv[s][ot].w);
                }
            }
        }
    }

    /* Accumulator f of lane l is token rt*16 + l/4 (+8 for c >= 2), output tile ot, column 2(l%4) + c%2. */
    auto store = [&](int f, int l, float v) {
        int c = f & 3, ot = (f >> 2) % OUT_TILES, rt = (f >> 2) / OUT_TILES;
        int token = rt * 16 + (l >> 2) + (c >= 2 ? 8 : 0);
        int o = out_base + ot * 8 + (l & 3) * 2 + (c & 1);
        if (token >= n || o >= out_dim) return;
        if (bias) v += __bfloat162float(bias[o]);
        out[(size_t)token * out_dim + o] = __float2bfloat16_rn(v);
    };
    if (n_warps == 1) {
#pragma unroll
        for (int f = 0; f < FRAG; f++) store(f, lane, acc[f]);
        return;
    }
    extern __shared__ float partial[]; /* [warps][FRAG][32] */
#pragma unroll
    for (int f = 0; f < FRAG; f++) partial[(warp * FRAG + f) * 32 + lane] = acc[f];
    __syncthreads();
    for (int i = threadIdx.x; i < FRAG * 32; i += blockDim.x) {
        float v = partial[i];
        for (int k = 1; k < n_warps; k++) v += partial[k * FRAG * 32 + i]; /* fixed order */
        store(i >> 5, i & 31, v);
    }
}

/* ---------------------------------------------------------------- fp32: CUDA cores */

/* Block: blockDim.x / 32 warps on outputs [blockIdx.x * F32_OUTS, +F32_OUTS); warp w takes k chunks
 * w, w + warps, ... (a chunk is F32_STEPS x 128 k, a float4 per lane per step). Token rows go in
 * passes of F32_ROWS; each row's arithmetic is the same in whichever pass and slot it lands. */
__global__ void __launch_bounds__(SKINNY_MAX_WARPS * 32)
    skinny_f32_kernel(float *out, const float *x, const float *w, const float *bias, int n, int in_dim,
                      int out_dim) {
    __shared__ float partial[SKINNY_MAX_WARPS][F32_ROWS * F32_OUTS];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, n_warps = blockDim.x >> 5;
    const int out_base = blockIdx.x * F32_OUTS;
    const int chunk_len = F32_STEPS * 128;
    const int n_chunks = (in_dim + chunk_len - 1) / chunk_len;
    const float4 zero = make_float4(0.0f, 0.0f, 0.0f, 0.0f);

    const float *w_row[F32_OUTS];
    bool w_valid[F32_OUTS];
#pragma unroll
    for (int o = 0; o < F32_OUTS; o++) {
        w_valid[o] = out_base + o < out_dim;
        w_row[o] = w + (size_t)(w_valid[o] ? out_base + o : 0) * in_dim + lane * 4;
    }

    for (int row_base = 0; row_base < n; row_base += F32_ROWS) {
        float acc[F32_ROWS][F32_OUTS];
#pragma unroll
        for (int r = 0; r < F32_ROWS; r++)
#pragma unroll
            for (int o = 0; o < F32_OUTS; o++) acc[r][o] = 0.0f;

        for (int chunk = warp; chunk < n_chunks; chunk += n_warps) {
            const int k0 = chunk * chunk_len;
            float4 wv[F32_STEPS][F32_OUTS];
#pragma unroll
            for (int s = 0; s < F32_STEPS; s++) {
                const bool k_ok = k0 + s * 128 + lane * 4 < in_dim;
#pragma unroll
                for (int o = 0; o < F32_OUTS; o++)
                    wv[s][o] = k_ok && w_valid[o] ? load_streaming_f4(w_row[o] + k0 + s * 128) : zero;
            }
#pragma unroll
            for (int s = 0; s < F32_STEPS; s++) {
                const int k = k0 + s * 128 + lane * 4;
                if (k >= in_dim) continue;
#pragma unroll
                for (int r = 0; r < F32_ROWS; r++) {
                    if (row_base + r >= n) continue;
                    const float4 xv = load_cached_f4(x + (size_t)(row_base + r) * in_dim + k);
#pragma unroll
                    for (int o = 0; o < F32_OUTS; o++) {
                        float a = acc[r][o];
                        a = fmaf(wv[s][o].x, xv.x, a);
                        a = fmaf(wv[s][o].y, xv.y, a);
                        a = fmaf(wv[s][o].z, xv.z, a);
                        a = fmaf(wv[s][o].w, xv.w, a);
                        acc[r][o] = a;
                    }
                }
            }
        }
        /* xor butterfly: a fixed order, and a + b == b + a leaves every lane with the same bits */
#pragma unroll
        for (int r = 0; r < F32_ROWS; r++)
#pragma unroll
            for (int o = 0; o < F32_OUTS; o++) {
                float v = acc[r][o];
#pragma unroll
                for (int m = 16; m > 0; m >>= 1) v += __shfl_xor_sync(0xffffffffu, v, m);
                acc[r][o] = v;
            }
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < F32_ROWS; r++)
#pragma unroll
                for (int o = 0; o < F32_OUTS; o++) partial[warp][r * F32_OUTS + o] = acc[r][o];
        }
        __syncthreads();
        if (threadIdx.x < F32_ROWS * F32_OUTS) {
            const int r = threadIdx.x / F32_OUTS, o = threadIdx.x % F32_OUTS;
            const int token = row_base + r, col = out_base + o;
            if (token < n && col < out_dim) {
                float v = partial[0][threadIdx.x];
                for (int k = 1; k < n_warps; k++) v += partial[k][threadIdx.x]; /* fixed order */
                if (bias) v += bias[col];
                out[(size_t)token * out_dim + col] = v;
            }
        }
        __syncthreads(); /* partial is reused by the next pass */
    }
}

/* ---------------------------------------------------------------- host */

/* Launch geometry: a function of (I, O) only, which is what makes the results batch invariant. */
typedef struct SkinnyPlan {
    int out_tiles; /* bf16: 8-output mma tiles per warp */
    int blocks;
    int warps; /* per block, splitting K */
} SkinnyPlan;

/* Doubles the K split while the GPU is not yet full, each warp still gets a chunk, and the block
 * stays within max_warps. */
static int skinny_k_split(int blocks, int in_dim, int chunk_len, int max_warps) {
    int chunks = (in_dim + chunk_len - 1) / chunk_len;
    int warps = 1;
    while (warps * 2 <= max_warps && warps * 2 <= chunks && (long)blocks * warps < SKINNY_TARGET_WARPS) warps *= 2;
    return warps;
}

static SkinnyPlan skinny_plan_bf16(int in_dim, int out_dim) {
    SkinnyPlan p;
    /* More outputs per warp cut the re-reads of x; fewer keep small O spread over the SMs. */
    p.out_tiles = out_dim >= 8192 ? 4 : out_dim >= 2048 ? 2 : 1;
    p.blocks = (out_dim + p.out_tiles * 8 - 1) / (p.out_tiles * 8);
    int max_warps = BF16_MAX_WARP_TILES / p.out_tiles;
    if (max_warps > SKINNY_MAX_WARPS) max_warps = SKINNY_MAX_WARPS;
    p.warps = skinny_k_split(p.blocks, in_dim, 32 * (BF16_LOADS_PER_LANE / p.out_tiles), max_warps);
    return p;
}

static SkinnyPlan skinny_plan_f32(int in_dim, int out_dim) {
    SkinnyPlan p;
    p.out_tiles = 0;
    p.blocks = (out_dim + F32_OUTS - 1) / F32_OUTS;
    p.warps = skinny_k_split(p.blocks, in_dim, F32_STEPS * 128, SKINNY_MAX_WARPS);
    return p;
}

template <int OUT_TILES, int ROWS>
static void skinny_bf16_launch(CudaState *cs, const SkinnyPlan *p, void *out, const void *x, const void *w,
                               const void *bias, int n, int in_dim, int out_dim) {
    constexpr int FRAG = (ROWS + 15) / 16 * OUT_TILES * 4;
    size_t smem = p->warps > 1 ? (size_t)p->warps * FRAG * 32 * sizeof(float) : 0;
    skinny_bf16_kernel<OUT_TILES, ROWS><<<p->blocks, p->warps * 32, smem, cs->stream>>>(
        (__nv_bfloat16 *)out, (const __nv_bfloat16 *)x, (const __nv_bfloat16 *)w, (const __nv_bfloat16 *)bias, n,
        in_dim, out_dim);
    LAUNCH_CHECK(cs);
}

template <int ROWS>
static void skinny_bf16_dispatch(CudaState *cs, const SkinnyPlan *p, void *out, const void *x, const void *w,
                                 const void *bias, int n, int in_dim, int out_dim) {
    switch (p->out_tiles) {
    case 1: skinny_bf16_launch<1, ROWS>(cs, p, out, x, w, bias, n, in_dim, out_dim); break;
    case 2: skinny_bf16_launch<2, ROWS>(cs, p, out, x, w, bias, n, in_dim, out_dim); break;
    default: skinny_bf16_launch<4, ROWS>(cs, p, out, x, w, bias, n, in_dim, out_dim); break;
    }
}

/* ---------------------------------------------------------------- bf16 GEMV for large weights */

/* One row (up to GEMV_MAX_ROWS) against weights too large for the kernel
 * above to beat cuBLAS: a plain streaming GEMV on CUDA cores. One warp per output feature, lanes take 16-byte
 * chunks of the weight row GEMV_UNROLL at a time (that many loads in flight
 * per lane), fp32 sums per chunk in index order, then a fixed xor butterfly:
 * the order depends on in_dim only, so a row's result does not depend on n. */
#define GEMV_MAX_ROWS 4
#define GEMV_WARPS 8
#define GEMV_UNROLL 8

template <int ROWS>
__global__ void __launch_bounds__(GEMV_WARPS * 32)
    gemv_bf16_kernel(__nv_bfloat16 *out, const __nv_bfloat16 *x, const __nv_bfloat16 *w, const __nv_bfloat16 *bias,
                     int n, int in_dim, int out_dim) {
    const int lane = threadIdx.x % 32, o = blockIdx.x * GEMV_WARPS + threadIdx.x / 32;
    if (o >= out_dim) return;
    const int chunks = in_dim / 8;
    const __nv_bfloat16 *wrow = w + (size_t)o * in_dim;
    float acc[ROWS];
#pragma unroll
    for (int r = 0; r < ROWS; r++) acc[r] = 0.0f;
    for (int c0 = lane; c0 < chunks; c0 += 32 * GEMV_UNROLL) {
        uint4 wv[GEMV_UNROLL];
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            int c = c0 + u * 32;
            wv[u] = c < chunks ? load_streaming(wrow + (size_t)c * 8) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < GEMV_UNROLL; u++) {
            int c = c0 + u * 32;
            if (c >= chunks) break;
            const __nv_bfloat16 *wp = reinterpret_cast<const __nv_bfloat16 *>(&wv[u]);
#pragma unroll
            for (int r = 0; r < ROWS; r++) {
                if (r >= n) break;
                uint4 xv = __ldg(reinterpret_cast<const uint4 *>(x + (size_t)r * in_dim + (size_t)c * 8));
                const __nv_bfloat16 *xp = reinterpret_cast<const __nv_bfloat16 *>(&xv);
                float part = 0.0f;
#pragma unroll
                for (int j = 0; j < 8; j++) part = fmaf(__bfloat162float(wp[j]), __bfloat162float(xp[j]), part);
                acc[r] += part;
            }
        }
    }
#pragma unroll
    for (int r = 0; r < ROWS; r++)
        for (int off = 16; off > 0; off >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], off);
    if (lane == 0) {
        float b = bias ? __bfloat162float(bias[o]) : 0.0f;
#pragma unroll
        for (int r = 0; r < ROWS; r++)
            if (r < n) out[(size_t)r * out_dim + o] = __float2bfloat16_rn(acc[r] + b);
    }
}

static void gemv_bf16(CudaState *cs, void *out, const void *x, const void *w, const void *bias, int n, int in_dim,
                      int out_dim) {
    unsigned blocks = (unsigned)((out_dim + GEMV_WARPS - 1) / GEMV_WARPS);
    auto *o = (__nv_bfloat16 *)out;
    auto *xx = (const __nv_bfloat16 *)x, *ww = (const __nv_bfloat16 *)w, *bb = (const __nv_bfloat16 *)bias;
    cudaStream_t st = cs->stream;
    if (n == 1) gemv_bf16_kernel<1><<<blocks, GEMV_WARPS * 32, 0, st>>>(o, xx, ww, bb, n, in_dim, out_dim);
    else if (n == 2) gemv_bf16_kernel<2><<<blocks, GEMV_WARPS * 32, 0, st>>>(o, xx, ww, bb, n, in_dim, out_dim);
    else gemv_bf16_kernel<4><<<blocks, GEMV_WARPS * 32, 0, st>>>(o, xx, ww, bb, n, in_dim, out_dim);
    LAUNCH_CHECK(cs);
}

template <typename T>
bool cuda_skinny_linear(CudaState *cs, void *out, const void *x, const void *w, const void *bias, int n, int in_dim,
                        int out_dim) {
    static_assert(SKINNY_MAX_ROWS <= 32, "the bf16 kernel holds at most two 16-row tiles");
    int mode = cs->opt.skinny;
    if (mode == 0) return false;
    /* Large weights at one row: the streaming GEMV (mode 3 forces it at 1..4 rows, for its test).
     * bench_skinny, H200: 1.05-1.12x cuBLASLt at n = 1 (lm_heads at 4.4 TB/s, 7B gate|up at 3.8),
     * except the tall down projections (in_dim > 2 out_dim: 0.9x); at 2..4 rows it re-reads x from
     * L1 per row and loses (0.5-0.7x). */
    if constexpr (sizeof(T) == 2) {
        bool gemv = mode == 3 || (mode == 1 && n == 1 && !skinny_wins(n, in_dim, out_dim) && in_dim <= 2 * out_dim);
        if (gemv && n >= 1 && n <= GEMV_MAX_ROWS && in_dim > 0 && out_dim > 0 && in_dim % 8 == 0 &&
            ((uintptr_t)x | (uintptr_t)w) % 16 == 0) {
            gemv_bf16(cs, out, x, w, bias, n, in_dim, out_dim);
            cs->skinny_calls++;
            return true;
        }
    }
    if (mode == 3 || (mode == 1 && !skinny_wins(n, in_dim, out_dim))) return false;
    if (n < 1 || n > SKINNY_MAX_ROWS || in_dim <= 0 || out_dim <= 0 || in_dim % 8 != 0) return false;
    if (((uintptr_t)x | (uintptr_t)w) % 16 != 0) return false;
    if constexpr (sizeof(T) == sizeof(float)) {
        SkinnyPlan p = skinny_plan_f32(in_dim, out_dim);
        skinny_f32_kernel<<<p.blocks, p.warps * 32, 0, cs->stream>>>(
            (float *)out, (const float *)x, (const float *)w, (const float *)bias, n, in_dim, out_dim);
        LAUNCH_CHECK(cs);
    } else {
        SkinnyPlan p = skinny_plan_bf16(in_dim, out_dim);
        if (n <= 8)
            skinny_bf16_dispatch<8>(cs, &p, out, x, w, bias, n, in_dim, out_dim);
        else if (n <= 16)
            skinny_bf16_dispatch<16>(cs, &p, out, x, w, bias, n, in_dim, out_dim);
        else
            skinny_bf16_dispatch<32>(cs, &p, out, x, w, bias, n, in_dim, out_dim);
    }
    cs->skinny_calls++;
    return true;
}

template bool cuda_skinny_linear<float>(CudaState *, void *, const void *, const void *, const void *, int, int, int);
template bool cuda_skinny_linear<__nv_bfloat16>(CudaState *, void *, const void *, const void *, const void *, int, int,
                                                int);
