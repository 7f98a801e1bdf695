/* cuda_attention.cu — KV cache store/gather and causal attention, forward and
 * backward, over caches [S, L, KVH*Dh] (see backend.h).
 *
 * Parallelisation: one block of ATT_WARPS warps per (token i, query head h).
 * Warp w takes cache positions t = w, w + ATT_WARPS, ... of 0..pos[i]; lane l
 * holds head dims l, l + 32, ... (Dh <= 256), so each K/V row is read
 * coalesced and q.k is a warp shuffle reduction. Each warp keeps its own
 * online-softmax state (max, sum, weighted V) in fp32; the warps merge through
 * shared memory at the end. No T x T score matrix exists anywhere.
 * Backward recomputes the softmax the same way: pass 1 gets max, sum and
 * delta = sum_t P_t (dout . v_t); pass 2 forms dS_t and writes dq (=) and
 * dK/dV (+=, fp32 atomicAdd: the order of additions varies run to run).
 * Tolerance vs the CPU (double) reference: ~1e-6 relative in fp32 storage.
 * These per-token kernels are the general fallback (decode steps, scattered
 * positions, head_dim > 128). Batches made of runs of consecutive positions
 * (training, prefill) take the tiled FlashAttention-2 style kernels below
 * (section "tiled"): no atomics, deterministic.
 * The tiles use fp32 FMA for fp32 storage and bf16 tensor cores (section
 * "tiled, bf16 tensor cores") for bf16 storage with head_dim 64 or 128.
 * Speed: bench/gpu/bench_attention.c. Not yet: wgmma/TMA (the mma.sync tiles
 * run at 11-20% of the H200's bf16 peak), GQA sharing of K/V tiles across the
 * heads of a group (each query head reads them through L2). */
#include <limits.h>
#include <math.h>
#include <string.h>

#include <type_traits>

#include "backend/cuda/cuda_common.cuh"

#define ATT_WARPS 4
#define ATT_MAX_HEAD_DIM 256

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* ---------------------------------------------------------------- kv cache */

template <typename T>
__global__ void kv_store_kernel(T *k_cache, T *v_cache, const T *k, const T *v, const int *slot, const int *pos,
                                int n, int kv_dim, int max_len) {
    size_t total = (size_t)n * kv_dim;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        size_t i = e / kv_dim, j = e % kv_dim;
        size_t row = ((size_t)slot[i] * max_len + pos[i]) * kv_dim;
        k_cache[row + j] = k[e];
        v_cache[row + j] = v[e];
    }
}

template <typename T>
__global__ void kv_gather_kernel(T *k, T *v, const float *k_cache, const float *v_cache, const int *slot,
                                 const int *pos, int n, int kv_dim, int max_len) {
    size_t total = (size_t)n * kv_dim;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        size_t i = e / kv_dim, j = e % kv_dim;
        size_t row = ((size_t)slot[i] * max_len + pos[i]) * kv_dim;
        k[e] = from_float<T>(k_cache[row + j]);
        v[e] = from_float<T>(v_cache[row + j]);
    }
}

template <typename T>
void cuda_kv_store(const Backend *be, void *k_cache, void *v_cache, const void *k, const void *v, const int *slot,
                   const int *pos, int n, int kv_dim, int max_len) {
    if (n <= 0 || kv_dim <= 0) return;
    CudaState *cs = cuda_enter(be);
    const int *host[2] = {slot, pos};
    int *d = cuda_upload_indices(cs, host, 2, n);
    size_t total = (size_t)n * kv_dim;
    kv_store_kernel<T><<<cuda_blocks_for(total), CUDA_THREADS, 0, cs->stream>>>(
        (T *)k_cache, (T *)v_cache, (const T *)k, (const T *)v, d, d + n, n, kv_dim, max_len);
    LAUNCH_CHECK(cs);
}

template <typename T>
void cuda_kv_gather(const Backend *be, void *k, void *v, const void *k_cache, const void *v_cache, const int *slot,
                    const int *pos, int n, int kv_dim, int max_len) {
    if (n <= 0 || kv_dim <= 0) return;
    CudaState *cs = cuda_enter(be);
    const int *host[2] = {slot, pos};
    int *d = cuda_upload_indices(cs, host, 2, n);
    size_t total = (size_t)n * kv_dim;
    kv_gather_kernel<T><<<cuda_blocks_for(total), CUDA_THREADS, 0, cs->stream>>>(
        (T *)k, (T *)v, (const float *)k_cache, (const float *)v_cache, d, d + n, n, kv_dim, max_len);
    LAUNCH_CHECK(cs);
}

/* ---------------------------------------------------------------- tiled (FlashAttention-2 style) */

/* Used when the tokens come in runs of consecutive positions of one slot (a
 * training batch, a prefill): a host "plan" cuts the runs into query tiles of
 * up to FT tokens {tok0, cnt, slot, pos0} (tokens tok0..tok0+cnt-1 sit at
 * positions pos0..pos0+cnt-1). Head dims up to 128 run through the same code,
 * zero padded to DMAX = 64 or 128 in shared memory; fp32 everywhere inside.
 * A block has 256 threads as a 16 x 16 grid (ty, tx): for score tiles it owns
 * rows ty*4+i and columns tx+16c; for [rows, Dh] accumulators rows ty*4+i and
 * dims 64c+4tx+e. Causality is masked per element (key j <= query pos).
 *   forward: one block per (query tile, head), online softmax over key tiles.
 *   backward: (1) the forward kernel again, keeping lse_i and
 *   delta_i = dout_i . O_i; (2) one block per (slot, key tile, KV head, head
 *   subset) loops over the query tiles that see its keys and the query heads
 *   of its subset, accumulating dK, dV in registers; with one subset it adds
 *   them into the caches itself (each row owned by one block), else it writes
 *   partials that a last kernel sums in a fixed order; (3) one block per
 *   (query tile, head) forms dq. No atomics: deterministic. */
#define FT 64
#define FTHREADS 256
#define FLDP (FT + 4)

template <typename T, int DMAX>
__device__ __forceinline__ void fa_load_rows(float *sm, const T *src, size_t row_stride, int rows, int head_dim) {
    const int LD = DMAX + 4;
    if (head_dim == DMAX && ((size_t)src % 16) == 0 && (row_stride * sizeof(T)) % 16 == 0) {
        /* rows start 16-byte aligned: 16-byte loads, VEC elements each */
        const int VEC = 16 / (int)sizeof(T);
        for (int idx = threadIdx.x; idx < FT * DMAX / VEC; idx += FTHREADS) {
            int r = idx / (DMAX / VEC), d = (idx % (DMAX / VEC)) * VEC;
            float *dst = sm + r * LD + d;
            if (r < rows) {
                uint4 raw = *(const uint4 *)(src + (size_t)r * row_stride + d);
                const T *e = (const T *)&raw;
#pragma unroll
                for (int k = 0; k < VEC; k += 4)
                    *(float4 *)(dst + k) = make_float4(to_float(e[k]), to_float(e[k + 1]), to_float(e[k + 2]),
                                                       to_float(e[k + 3]));
            } else {
#pragma unroll
                for (int k = 0; k < VEC; k += 4) *(float4 *)(dst + k) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
        }
        return;
    }
    for (int idx = threadIdx.x; idx < FT * DMAX; idx += FTHREADS) {
        int r = idx / DMAX, d = idx % DMAX;
        float v = 0.0f;
        if (r < rows && d < head_dim) v = to_float(src[(size_t)r * row_stride + d]);
        sm[r * LD + d] = v;
    }
}

/* acc[i][c] += A[ty*4+i, :] . B[tx+16c, :] */
template <int DMAX>
__device__ __forceinline__ void fa_mm_abT(float acc[4][4], const float *A, const float *B, int ty, int tx) {
    const int LD = DMAX + 4;
#pragma unroll 2
    for (int d = 0; d < DMAX; d += 4) {
        float4 a[4], b[4];
#pragma unroll
        for (int i = 0; i < 4; i++) a[i] = *(const float4 *)(A + (ty * 4 + i) * LD + d);
#pragma unroll
        for (int c = 0; c < 4; c++) b[c] = *(const float4 *)(B + (tx + 16 * c) * LD + d);
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int c = 0; c < 4; c++) {
                float s = acc[i][c];
                s = fmaf(a[i].x, b[c].x, s);
                s = fmaf(a[i].y, b[c].y, s);
                s = fmaf(a[i].z, b[c].z, s);
                s = fmaf(a[i].w, b[c].w, s);
                acc[i][c] = s;
            }
    }
}

/* acc[i][4c+e] += sum_k P[ty*4+i, k] * B[k, 64c+4tx+e] (P stride FLDP) */
template <int DMAX>
__device__ __forceinline__ void fa_mm_ab(float acc[4][DMAX / 16], const float *P, const float *B, int ty, int tx) {
    const int LD = DMAX + 4, DC = DMAX / 64;
#pragma unroll 2
    for (int k = 0; k < FT; k += 4) {
        float4 p[4];
#pragma unroll
        for (int i = 0; i < 4; i++) p[i] = *(const float4 *)(P + (ty * 4 + i) * FLDP + k);
#pragma unroll
        for (int kk = 0; kk < 4; kk++) {
#pragma unroll
            for (int c = 0; c < DC; c++) {
                float4 b = *(const float4 *)(B + (k + kk) * LD + 64 * c + 4 * tx);
#pragma unroll
                for (int i = 0; i < 4; i++) {
                    float pv = kk == 0 ? p[i].x : kk == 1 ? p[i].y : kk == 2 ? p[i].z : p[i].w;
                    acc[i][4 * c + 0] = fmaf(pv, b.x, acc[i][4 * c + 0]);
                    acc[i][4 * c + 1] = fmaf(pv, b.y, acc[i][4 * c + 1]);
                    acc[i][4 * c + 2] = fmaf(pv, b.z, acc[i][4 * c + 2]);
                    acc[i][4 * c + 3] = fmaf(pv, b.w, acc[i][4 * c + 3]);
                }
            }
        }
    }
}

__device__ __forceinline__ float fa_row_max(float v) {
    for (int o = 8; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}
__device__ __forceinline__ float fa_row_sum(float v) {
    for (int o = 8; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* grid (n_tiles, n_heads). STATS: write lse/delta (needs dout) instead of out. */
template <typename T, int DMAX, bool STATS>
__global__ void __launch_bounds__(FTHREADS) fa_forward_kernel(T *out, float *lse_out, float *delta_out,
                                                               const T *dout, const T *q, const T *k_cache,
                                                               const T *v_cache, const int4 *tiles, int n_heads,
                                                               int group, int head_dim, int max_len, int kv_dim,
                                                               float scale) {
    const int LD = DMAX + 4, DA = DMAX / 16;
    extern __shared__ float4 fa_smem4[];
    float *sQ = (float *)fa_smem4, *sK = sQ + FT * LD, *sV = sK + FT * LD, *sP = sV + FT * LD;
    int4 t = tiles[blockIdx.x];
    int tok0 = t.x, cnt = t.y, s_id = t.z, pos0 = t.w, h = blockIdx.y, g = h / group;
    int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
    size_t q_stride = (size_t)n_heads * head_dim;
    fa_load_rows<T, DMAX>(sQ, q + ((size_t)tok0 * n_heads + h) * head_dim, q_stride, cnt, head_dim);
    float m[4], l[4], o[4][DA];
#pragma unroll
    for (int i = 0; i < 4; i++) {
        m[i] = -INFINITY, l[i] = 0.0f;
#pragma unroll
        for (int e = 0; e < DA; e++) o[i][e] = 0.0f;
    }
    int last = pos0 + cnt - 1, nkt = last / FT + 1;
    size_t kv_base = (size_t)s_id * max_len * kv_dim + (size_t)g * head_dim;
    for (int kt = 0; kt < nkt; kt++) {
        int j0 = kt * FT, krows = min(FT, last + 1 - j0);
        __syncthreads();
        fa_load_rows<T, DMAX>(sK, k_cache + kv_base + (size_t)j0 * kv_dim, kv_dim, krows, head_dim);
        fa_load_rows<T, DMAX>(sV, v_cache + kv_base + (size_t)j0 * kv_dim, kv_dim, krows, head_dim);
        __syncthreads();
        float sc[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int c = 0; c < 4; c++) sc[i][c] = 0.0f;
        fa_mm_abT<DMAX>(sc, sQ, sK, ty, tx);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int r = ty * 4 + i, pi = pos0 + r;
            float mx = -INFINITY;
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int j = j0 + tx + 16 * c;
                float v = (r < cnt && j <= pi) ? sc[i][c] * scale : -INFINITY;
                sc[i][c] = v;
                mx = fmaxf(mx, v);
            }
            mx = fa_row_max(mx);
            float mnew = fmaxf(m[i], mx), mu = mnew == -INFINITY ? 0.0f : mnew;
            float corr = expf(m[i] - mu), ps = 0.0f;
#pragma unroll
            for (int c = 0; c < 4; c++) {
                float p = expf(sc[i][c] - mu);
                sP[r * FLDP + tx + 16 * c] = p;
                ps += p;
            }
            ps = fa_row_sum(ps);
            l[i] = l[i] * corr + ps;
            m[i] = mnew;
#pragma unroll
            for (int e = 0; e < DA; e++) o[i][e] *= corr;
        }
        __syncthreads();
        fa_mm_ab<DMAX>(o, sP, sV, ty, tx);
    }
    if (!STATS) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int r = ty * 4 + i;
            if (r >= cnt) continue;
            float inv = 1.0f / l[i];
            if (lse_out && tx == 0) lse_out[(size_t)(tok0 + r) * n_heads + h] = m[i] + logf(l[i]);
            T *orow = out + ((size_t)(tok0 + r) * n_heads + h) * head_dim;
#pragma unroll
            for (int e = 0; e < DA; e++) {
                int d = 64 * (e / 4) + 4 * tx + (e % 4);
                if (d < head_dim) orow[d] = from_float<T>(o[i][e] * inv);
            }
        }
    } else {
        __syncthreads();
        fa_load_rows<T, DMAX>(sK, dout + ((size_t)tok0 * n_heads + h) * head_dim, q_stride, cnt, head_dim);
        __syncthreads();
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int r = ty * 4 + i;
            float inv = r < cnt ? 1.0f / l[i] : 0.0f, dsum = 0.0f;
#pragma unroll
            for (int e = 0; e < DA; e++) dsum += o[i][e] * sK[r * LD + 64 * (e / 4) + 4 * tx + (e % 4)];
            dsum = fa_row_sum(dsum) * inv;
            if (tx == 0 && r < cnt) {
                size_t idx = (size_t)(tok0 + r) * n_heads + h;
                lse_out[idx] = m[i] + logf(l[i]);
                delta_out[idx] = dsum;
            }
        }
    }
}

/* grid (n_key_blocks, n_kv_heads, n_split). */
template <typename T, int DMAX>
__global__ void __launch_bounds__(FTHREADS, DMAX == 64 ? 2 : 1) fa_backward_kv_kernel(
    float *dk_cache, float *dv_cache, float *part, const T *dout, const T *q, const T *k_cache, const T *v_cache,
    const float *lse, const float *delta, const int4 *tiles, const int *slot_begin, const int2 *kblocks,
    int n_heads, int group, int heads_per_split, int head_dim, int max_len, int kv_dim, float scale) {
    const int LD = DMAX + 4, DA = DMAX / 16;
    extern __shared__ float4 fa_smem4[];
    float *sK = (float *)fa_smem4, *sV = sK + FT * LD, *sQ = sV + FT * LD, *sO = sQ + FT * LD;
    float *sP = sO + FT * LD, *sS = sP + FT * FLDP, *sL = sS + FT * FLDP, *sD = sL + FT;
    int2 kb = kblocks[blockIdx.x];
    int s_id = kb.x, j0 = kb.y * FT, g = blockIdx.y;
    int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
    int krows = min(FT, max_len - j0);
    size_t kv_base = (size_t)s_id * max_len * kv_dim + (size_t)g * head_dim + (size_t)j0 * kv_dim;
    fa_load_rows<T, DMAX>(sK, k_cache + kv_base, kv_dim, krows, head_dim);
    fa_load_rows<T, DMAX>(sV, v_cache + kv_base, kv_dim, krows, head_dim);
    float dk[4][DA], dv[4][DA];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int e = 0; e < DA; e++) dk[i][e] = 0.0f, dv[i][e] = 0.0f;
    int tb = slot_begin[s_id], te = slot_begin[s_id + 1];
    int h_lo = g * group + blockIdx.z * heads_per_split, h_hi = min(g * group + group, h_lo + heads_per_split);
    size_t q_stride = (size_t)n_heads * head_dim;
    for (int h = h_lo; h < h_hi; h++) {
        for (int ti = tb; ti < te; ti++) {
            int4 t = tiles[ti];
            int tok0 = t.x, cnt = t.y, pos0 = t.w;
            if (pos0 + cnt - 1 < j0) continue;
            __syncthreads();
            fa_load_rows<T, DMAX>(sQ, q + ((size_t)tok0 * n_heads + h) * head_dim, q_stride, cnt, head_dim);
            fa_load_rows<T, DMAX>(sO, dout + ((size_t)tok0 * n_heads + h) * head_dim, q_stride, cnt, head_dim);
            if (threadIdx.x < FT) {
                int r = threadIdx.x;
                sL[r] = r < cnt ? lse[(size_t)(tok0 + r) * n_heads + h] : 0.0f;
                sD[r] = r < cnt ? delta[(size_t)(tok0 + r) * n_heads + h] : 0.0f;
            }
            __syncthreads();
            float sc[4][4], dp[4][4];
#pragma unroll
            for (int i = 0; i < 4; i++)
#pragma unroll
                for (int c = 0; c < 4; c++) sc[i][c] = 0.0f, dp[i][c] = 0.0f;
            fa_mm_abT<DMAX>(sc, sK, sQ, ty, tx);
            fa_mm_abT<DMAX>(dp, sV, sO, ty, tx);
#pragma unroll
            for (int i = 0; i < 4; i++) {
                int jr = ty * 4 + i, j = j0 + jr;
#pragma unroll
                for (int c = 0; c < 4; c++) {
                    int r = tx + 16 * c;
                    bool ok = r < cnt && pos0 + r >= j;
                    float p = ok ? expf(sc[i][c] * scale - sL[r]) : 0.0f;
                    sP[jr * FLDP + r] = p;
                    sS[jr * FLDP + r] = p * (dp[i][c] - sD[r]);
                }
            }
            __syncthreads();
            fa_mm_ab<DMAX>(dv, sP, sO, ty, tx);
            fa_mm_ab<DMAX>(dk, sS, sQ, ty, tx);
        }
    }
    if (part == NULL) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int jr = ty * 4 + i;
            if (jr >= krows) continue;
            size_t row = kv_base + (size_t)jr * kv_dim;
#pragma unroll
            for (int e = 0; e < DA; e++) {
                int d = 64 * (e / 4) + 4 * tx + (e % 4);
                if (d < head_dim) dk_cache[row + d] += scale * dk[i][e], dv_cache[row + d] += dv[i][e];
            }
        }
    } else {
        /* partials [n_split][n_kb][KVH][FT][head_dim] for dk, then the same for dv */
        size_t per = (size_t)gridDim.x * gridDim.y * FT * head_dim;
        float *pk = part + (size_t)blockIdx.z * per + ((size_t)blockIdx.x * gridDim.y + g) * FT * head_dim;
        float *pv = pk + (size_t)gridDim.z * per;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int jr = ty * 4 + i;
#pragma unroll
            for (int e = 0; e < DA; e++) {
                int d = 64 * (e / 4) + 4 * tx + (e % 4);
                if (d < head_dim) pk[(size_t)jr * head_dim + d] = scale * dk[i][e], pv[(size_t)jr * head_dim + d] = dv[i][e];
            }
        }
    }
}

/* Sums the n_split partials in order into the caches (key blocks of block_rows keys). */
__global__ void fa_backward_kv_reduce_kernel(float *dk_cache, float *dv_cache, const float *part, const int2 *kblocks,
                                             int n_kb, int n_kv_heads, int n_split, int head_dim, int max_len,
                                             int kv_dim, int block_rows) {
    size_t per = (size_t)n_kb * n_kv_heads * block_rows * head_dim;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < per; e += (size_t)gridDim.x * blockDim.x) {
        int d = (int)(e % head_dim);
        size_t r = e / head_dim;
        int jr = (int)(r % block_rows);
        r /= block_rows;
        int g = (int)(r % n_kv_heads), b = (int)(r / n_kv_heads);
        int2 kb = kblocks[b];
        int j = kb.y * block_rows + jr;
        if (j >= max_len) continue;
        float sk = 0.0f, sv = 0.0f;
        for (int z = 0; z < n_split; z++) sk += part[(size_t)z * per + e], sv += part[(size_t)(n_split + z) * per + e];
        size_t idx = ((size_t)kb.x * max_len + j) * kv_dim + (size_t)g * head_dim + d;
        dk_cache[idx] += sk;
        dv_cache[idx] += sv;
    }
}

/* grid (n_tiles, n_heads): dq = scale * sum_j dS_ij k_j. */
template <typename T, int DMAX>
__global__ void __launch_bounds__(FTHREADS) fa_backward_dq_kernel(T *dq, const T *dout, const T *q, const T *k_cache,
                                                                   const T *v_cache, const float *lse,
                                                                   const float *delta, const int4 *tiles, int n_heads,
                                                                   int group, int head_dim, int max_len, int kv_dim,
                                                                   float scale) {
    const int LD = DMAX + 4, DA = DMAX / 16;
    extern __shared__ float4 fa_smem4[];
    float *sQ = (float *)fa_smem4, *sO = sQ + FT * LD, *sK = sO + FT * LD, *sV = sK + FT * LD;
    float *sS = sV + FT * LD, *sL = sS + FT * FLDP, *sD = sL + FT;
    int4 t = tiles[blockIdx.x];
    int tok0 = t.x, cnt = t.y, s_id = t.z, pos0 = t.w, h = blockIdx.y, g = h / group;
    int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
    size_t q_stride = (size_t)n_heads * head_dim;
    fa_load_rows<T, DMAX>(sQ, q + ((size_t)tok0 * n_heads + h) * head_dim, q_stride, cnt, head_dim);
    fa_load_rows<T, DMAX>(sO, dout + ((size_t)tok0 * n_heads + h) * head_dim, q_stride, cnt, head_dim);
    if (threadIdx.x < FT) {
        int r = threadIdx.x;
        sL[r] = r < cnt ? lse[(size_t)(tok0 + r) * n_heads + h] : 0.0f;
        sD[r] = r < cnt ? delta[(size_t)(tok0 + r) * n_heads + h] : 0.0f;
    }
    float acc[4][DA];
#pragma unroll
    for (int i = 0; i < 4; i++)
#pragma unroll
        for (int e = 0; e < DA; e++) acc[i][e] = 0.0f;
    int last = pos0 + cnt - 1, nkt = last / FT + 1;
    size_t kv_base = (size_t)s_id * max_len * kv_dim + (size_t)g * head_dim;
    for (int kt = 0; kt < nkt; kt++) {
        int j0 = kt * FT, krows = min(FT, last + 1 - j0);
        __syncthreads();
        fa_load_rows<T, DMAX>(sK, k_cache + kv_base + (size_t)j0 * kv_dim, kv_dim, krows, head_dim);
        fa_load_rows<T, DMAX>(sV, v_cache + kv_base + (size_t)j0 * kv_dim, kv_dim, krows, head_dim);
        __syncthreads();
        float sc[4][4], dp[4][4];
#pragma unroll
        for (int i = 0; i < 4; i++)
#pragma unroll
            for (int c = 0; c < 4; c++) sc[i][c] = 0.0f, dp[i][c] = 0.0f;
        fa_mm_abT<DMAX>(sc, sQ, sK, ty, tx);
        fa_mm_abT<DMAX>(dp, sO, sV, ty, tx);
#pragma unroll
        for (int i = 0; i < 4; i++) {
            int r = ty * 4 + i, pi = pos0 + r;
#pragma unroll
            for (int c = 0; c < 4; c++) {
                int j = j0 + tx + 16 * c;
                bool ok = r < cnt && j <= pi;
                float p = ok ? expf(sc[i][c] * scale - sL[r]) : 0.0f;
                sS[r * FLDP + tx + 16 * c] = p * (dp[i][c] - sD[r]);
            }
        }
        __syncthreads();
        fa_mm_ab<DMAX>(acc, sS, sK, ty, tx);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) {
        int r = ty * 4 + i;
        if (r >= cnt) continue;
        T *row = dq + ((size_t)(tok0 + r) * n_heads + h) * head_dim;
#pragma unroll
        for (int e = 0; e < DA; e++) {
            int d = 64 * (e / 4) + 4 * tx + (e % 4);
            if (d < head_dim) row[d] = from_float<T>(scale * acc[i][e]);
        }
    }
}

static size_t fa_smem_forward(int dmax) { return (size_t)(3 * FT * (dmax + 4) + FT * FLDP) * sizeof(float); }
static size_t fa_smem_kv(int dmax) { return (size_t)(4 * FT * (dmax + 4) + 2 * FT * FLDP + 2 * FT) * sizeof(float); }
static size_t fa_smem_dq(int dmax) { return (size_t)(4 * FT * (dmax + 4) + FT * FLDP + 2 * FT) * sizeof(float); }


/* The host plan: the batch cut into query tiles of up to FT tokens
 * {tok0, cnt, slot, pos0} (sorted by slot when for_backward: the kv kernels
 * stream them), the same runs cut into tiles of up to qrows tokens and ordered
 * by how many key tiles they see, most first (qtiles: the forward, statistics
 * and dq grids; a causal batch in token order would launch its longest tiles
 * last and end on them alone), per-slot
 * tile ranges and the key blocks {slot, key block of krows keys} (longest
 * first), packed in one int array and uploaded. Returns 0 when the batch is not
 * made of runs long enough for tiles to pay (decode steps): the caller falls
 * back to the per-token kernels. Backward skips tokens whose slot is outside
 * 0..n_slots-1. The host buffers are the instance's (CudaState.fa_*), grown
 * as the batches grow. */
struct FaPlan {
    int nt, nq, nkb;
    size_t npairs; /* backward: (query tile, key block) pairs with a key the tile sees */
    const int4 *tiles, *qtiles;
    const int *slot_begin;
    const int *tile_pbase, *qtile_pbase; /* backward: each tile's first pair (key block 0) */
    const int2 *kblocks;
};

/* Cuts the tokens into runs of consecutive positions of one slot, at most
 * limit tokens each, into raw (4 ints per tile). Returns the tile count, or -1
 * when a position is out of range; *valid counts the tokens kept. */
static int fa_cut_runs(int *raw, int *valid, const int *slot, const int *pos, int n, int n_slots, int max_len,
                       int for_backward, int limit) {
    int nt = 0, cur = -1;
    *valid = 0;
    for (int i = 0; i < n; i++) {
        int s = slot[i], p = pos[i];
        if (for_backward && (s < 0 || s >= n_slots)) {
            cur = -1;
            continue;
        }
        if (s < 0 || p < 0 || p >= max_len) return -1;
        (*valid)++;
        if (cur >= 0 && raw[4 * cur + 2] == s && raw[4 * cur + 3] + raw[4 * cur + 1] == p &&
            raw[4 * cur + 1] < limit) {
            raw[4 * cur + 1]++;
            continue;
        }
        cur = nt++;
        raw[4 * cur] = i, raw[4 * cur + 1] = 1, raw[4 * cur + 2] = s, raw[4 * cur + 3] = p;
    }
    return nt;
}

/* dst = the nt tiles of src ordered by key tiles seen ((last position) / FT),
 * most first, stable (a counting sort; max_len bounds the positions) */
static void fa_sort_longest_first(CudaState *cs, int *dst, const int *src, int nt, int max_len) {
    int nk = max_len / FT + 2;
    if ((size_t)nk > cs->fa_count_cap) {
        free(cs->fa_count);
        cs->fa_count_cap = (size_t)nk + 16;
        cs->fa_count = (int *)malloc(cs->fa_count_cap * sizeof(int));
        CUDA_ASSERT_HOST(cs->fa_count != NULL);
    }
    int *count = cs->fa_count;
    for (int k = 0; k < nk; k++) count[k] = 0;
    for (int t = 0; t < nt; t++) count[nk - 1 - (src[4 * t + 3] + src[4 * t + 1] - 1) / FT]++;
    for (int k = 0, at = 0; k < nk; k++) {
        int c = count[k];
        count[k] = at, at += c;
    }
    for (int t = 0; t < nt; t++) {
        int at = count[nk - 1 - (src[4 * t + 3] + src[4 * t + 1] - 1) / FT]++;
        for (int k = 0; k < 4; k++) dst[4 * at + k] = src[4 * t + k];
    }
}

static int fa_make_plan(CudaState *cs, FaPlan *pl, const int *slot, const int *pos, int n, int n_slots, int max_len,
                        int for_backward, int qrows, int krows) {
    if ((size_t)4 * n > cs->fa_raw_cap) {
        free(cs->fa_raw), free(cs->fa_rawq), free(cs->fa_sortq);
        cs->fa_raw_cap = (size_t)4 * n + 64;
        cs->fa_raw = (int *)malloc(cs->fa_raw_cap * sizeof(int));
        cs->fa_rawq = (int *)malloc(cs->fa_raw_cap * sizeof(int));
        cs->fa_sortq = (int *)malloc(cs->fa_raw_cap * sizeof(int));
        CUDA_ASSERT_HOST(cs->fa_raw && cs->fa_rawq && cs->fa_sortq);
    }
    int *raw = cs->fa_raw, *rawq = cs->fa_rawq, *sortq = cs->fa_sortq;
    int valid = 0;
    int nt = fa_cut_runs(raw, &valid, slot, pos, n, n_slots, max_len, for_backward, FT);
    if (nt < 0 || valid < 8 * nt) return 0;
    int nq = nt;
    const int *qsrc = raw;
    if (qrows != FT) {
        nq = fa_cut_runs(rawq, &valid, slot, pos, n, n_slots, max_len, for_backward, qrows);
        qsrc = rawq;
    }
    fa_sort_longest_first(cs, sortq, qsrc, nq, max_len);
    qsrc = sortq;
    pl->nt = nt, pl->nq = nq, pl->nkb = 0, pl->npairs = 0;
    pl->tile_pbase = pl->qtile_pbase = NULL;
    if (nt == 0) return 1;
    if (!for_backward) {
        pl->qtiles = (const int4 *)cuda_upload_indices(cs, (const int *const *)&qsrc, 1, 4 * nq);
        pl->tiles = qrows == FT ? pl->qtiles : NULL;
        pl->slot_begin = NULL, pl->kblocks = NULL;
        return 1;
    }
    /* aux: count[n_slots + 1], maxpos[n_slots] */
    size_t aux_need = (size_t)2 * n_slots + 1;
    if (aux_need > cs->fa_aux_cap) {
        free(cs->fa_aux);
        cs->fa_aux_cap = aux_need + 64;
        cs->fa_aux = (int *)malloc(cs->fa_aux_cap * sizeof(int));
        CUDA_ASSERT_HOST(cs->fa_aux != NULL);
    }
    int *cnt = cs->fa_aux, *maxpos = cs->fa_aux + n_slots + 1;
    for (int s = 0; s <= n_slots; s++) cnt[s] = 0;
    for (int s = 0; s < n_slots; s++) maxpos[s] = -1;
    int max_kt = 0;
    for (int t = 0; t < nt; t++) {
        int s = raw[4 * t + 2], last = raw[4 * t + 3] + raw[4 * t + 1] - 1;
        cnt[s + 1]++;
        if (last > maxpos[s]) maxpos[s] = last;
        if (last / krows + 1 > max_kt) max_kt = last / krows + 1;
    }
    int nkb = 0;
    for (int s = 0; s < n_slots; s++) {
        cnt[s + 1] += cnt[s];
        if (maxpos[s] >= 0) nkb += maxpos[s] / krows + 1;
    }
    int sb_len = (n_slots + 2) & ~1; /* keeps the key blocks 8-byte aligned */
    /* pair bases, by the tile's first token (tiles and qtiles are the same FT-row tiles, in two orders) */
    if ((size_t)n > cs->fa_tokbase_cap) {
        free(cs->fa_tokbase);
        cs->fa_tokbase_cap = (size_t)n + 64;
        cs->fa_tokbase = (int *)malloc(cs->fa_tokbase_cap * sizeof(int));
        CUDA_ASSERT_HOST(cs->fa_tokbase != NULL);
    }
    int *tokbase = cs->fa_tokbase;
    size_t npairs = 0;
    for (int t = 0; t < nt; t++) {
        tokbase[raw[4 * t]] = (int)npairs;
        npairs += (size_t)((raw[4 * t + 3] + raw[4 * t + 1] - 1) / FT + 1);
    }
    if (npairs > (size_t)INT_MAX) npairs = 0; /* no dS path: the bases would overflow */
    /* [tiles 4nt][qtiles 4nq][slot_begin sb_len][kblocks 2nkb][tile_pbase nt][qtile_pbase nq]: the int4 arrays
     * first, 16-byte aligned */
    size_t need = (size_t)4 * nt + (size_t)4 * nq + sb_len + (size_t)2 * nkb + (size_t)nt + (qrows == FT ? nq : 0);
    if (need > cs->fa_packed_cap) {
        free(cs->fa_packed);
        cs->fa_packed_cap = need + 64;
        cs->fa_packed = (int *)malloc(cs->fa_packed_cap * sizeof(int));
        CUDA_ASSERT_HOST(cs->fa_packed != NULL);
    }
    int *packed = cs->fa_packed;
    int *ptiles = packed, *pq = packed + 4 * nt, *psb = pq + 4 * nq, *pkb = psb + sb_len;
    for (int s = 0; s <= n_slots; s++) psb[s] = cnt[s];
    for (int s = n_slots + 1; s < sb_len; s++) psb[s] = 0;
    for (int t = 0; t < nt; t++) { /* stable counting sort by slot */
        int s = raw[4 * t + 2], at = cnt[s]++;
        for (int k = 0; k < 4; k++) ptiles[4 * at + k] = raw[4 * t + k];
    }
    memcpy(pq, qsrc, (size_t)4 * nq * sizeof(int));
    int b = 0;
    for (int kt = 0; kt < max_kt; kt++)
        for (int s = 0; s < n_slots; s++)
            if (maxpos[s] >= 0 && kt <= maxpos[s] / krows) pkb[2 * b] = s, pkb[2 * b + 1] = kt, b++;
    int *ptb = pkb + 2 * nkb, *pqb = ptb + nt;
    for (int t = 0; t < nt; t++) ptb[t] = tokbase[ptiles[4 * t]];
    if (qrows == FT)
        for (int t = 0; t < nq; t++) pqb[t] = tokbase[pq[4 * t]];
    int *dev = cuda_upload_indices(cs, (const int *const *)&packed, 1, (int)need);
    pl->nkb = nkb;
    pl->tiles = (const int4 *)dev;
    pl->qtiles = (const int4 *)(dev + 4 * nt);
    pl->slot_begin = dev + 4 * nt + 4 * nq;
    pl->kblocks = (const int2 *)(dev + 4 * nt + 4 * nq + sb_len);
    pl->tile_pbase = dev + 4 * nt + 4 * nq + sb_len + 2 * nkb;
    pl->qtile_pbase = qrows == FT ? pl->tile_pbase + nt : NULL;
    pl->npairs = qrows == FT && krows == FT ? npairs : 0;
    return 1;
}

template <typename T, int DMAX>
static void fa_forward_launch(CudaState *cs, T *out, float *lse, const T *q, const T *kc, const T *vc,
                              const FaPlan *pl, int n_heads, int group, int head_dim, int max_len, int kv_dim,
                              float scale) {
    size_t smem = fa_smem_forward(DMAX);
    cuda_smem_optin(cs, (const void *)fa_forward_kernel<T, DMAX, false>, smem);
    fa_forward_kernel<T, DMAX, false><<<dim3((unsigned)pl->nt, (unsigned)n_heads), FTHREADS, smem, cs->stream>>>(
        out, lse, NULL, NULL, q, kc, vc, pl->tiles, n_heads, group, head_dim, max_len, kv_dim, scale);
    LAUNCH_CHECK(cs);
}

template <typename T, int DMAX>
static void fa_backward_launch(CudaState *cs, T *dq, float *dkc, float *dvc, const T *go, const T *q, const T *kc,
                               const T *vc, const FaPlan *pl, int n, int n_heads, int n_kv_heads, int head_dim,
                               int max_len) {
    size_t smem_f = fa_smem_forward(DMAX), smem_kv = fa_smem_kv(DMAX), smem_dq = fa_smem_dq(DMAX);
    cuda_smem_optin(cs, (const void *)fa_forward_kernel<T, DMAX, true>, smem_f);
    cuda_smem_optin(cs, (const void *)fa_backward_kv_kernel<T, DMAX>, smem_kv);
    cuda_smem_optin(cs, (const void *)fa_backward_dq_kernel<T, DMAX>, smem_dq);
    int group = n_heads / n_kv_heads, kv_dim = n_kv_heads * head_dim;
    float scale = (float)(1.0 / sqrt((double)head_dim));
    /* Split the query heads of a group over blocks until the grid covers the GPU a few times over. */
    int blocks = pl->nkb * n_kv_heads, want = 4 * cs->sm_count;
    int n_split = blocks >= want ? 1 : (want + blocks - 1) / blocks;
    if (n_split > group) n_split = group;
    int per = (group + n_split - 1) / n_split;
    n_split = (group + per - 1) / per;
    size_t part_elems = n_split > 1 ? (size_t)2 * n_split * blocks * FT * head_dim : 0;
    size_t nh = (size_t)n * n_heads;
    float *lse = (float *)cuda_scratch(cs, (2 * nh + part_elems) * sizeof(float) + 256);
    float *delta = lse + nh, *part = n_split > 1 ? delta + nh : NULL;
    cudaStream_t st = cs->stream;
    fa_forward_kernel<T, DMAX, true><<<dim3((unsigned)pl->nt, (unsigned)n_heads), FTHREADS, smem_f, st>>>(
        NULL, lse, delta, go, q, kc, vc, pl->tiles, n_heads, group, head_dim, max_len, kv_dim, scale);
    LAUNCH_CHECK(cs);
    fa_backward_kv_kernel<T, DMAX>
        <<<dim3((unsigned)pl->nkb, (unsigned)n_kv_heads, (unsigned)n_split), FTHREADS, smem_kv, st>>>(
            dkc, dvc, part, go, q, kc, vc, lse, delta, pl->tiles, pl->slot_begin, pl->kblocks, n_heads, group, per,
            head_dim, max_len, kv_dim, scale);
    LAUNCH_CHECK(cs);
    if (n_split > 1) {
        size_t per_elems = (size_t)blocks * FT * head_dim;
        fa_backward_kv_reduce_kernel<<<cuda_blocks_for(per_elems), CUDA_THREADS, 0, st>>>(
            dkc, dvc, part, pl->kblocks, pl->nkb, n_kv_heads, n_split, head_dim, max_len, kv_dim, FT);
        LAUNCH_CHECK(cs);
    }
    fa_backward_dq_kernel<T, DMAX><<<dim3((unsigned)pl->nt, (unsigned)n_heads), FTHREADS, smem_dq, st>>>(
        dq, go, q, kc, vc, lse, delta, pl->tiles, n_heads, group, head_dim, max_len, kv_dim, scale);
    LAUNCH_CHECK(cs);
}

/* ---------------------------------------------------------------- tiled, bf16 tensor cores */

/* The bf16 storage instantiation with head_dim 64 or 128 runs the tiles above
 * on tensor cores: mma.sync m16n8k16 (bf16 in, fp32 accumulate), operands
 * staged in shared memory as bf16 by cp.async (double buffered) and fetched
 * with ldmatrix; softmax statistics, P and dS stay fp32 in registers and are
 * rounded to bf16 only as MMA inputs. Blocks of 4 warps, key tiles of FT, the
 * same causal rule and the same no-atomics split of the backward as the SIMT
 * tiles; fp32 storage keeps the SIMT tiles (the tight reference).
 *   forward: 128-row query tiles, warp w owns two m-tiles (rows 32w..32w+31),
 *   so each K/V fragment it reads from shared memory feeds two MMAs: S = Q K^T,
 *   online softmax on the accumulator fragments, O += P V.
 *   The forward also writes lse (fp32 [N, H]) when asked (training).
 *   backward statistics: given the forward's lse and output, delta = dO . O
 *   (fa_tc_delta_kernel, FA2's preprocessing); else, and in the precise mode,
 *   lse and delta = sum_j P dP from S and dP = dO V^T in one online pass
 *   (fa_tc_stats_kernel: no O, no P V, P never rounded).
 *   backward kv: warp w owns key rows 16w..16w+15: S^T = K Q^T, dP^T = V dO^T,
 *   dV += P^T dO, dK += dS^T Q; it also stores the bf16 dS blocks it formed.
 *   backward dq: dQ = dS K from those blocks (fa_tc_dq_from_ds_kernel: one
 *   product per key tile, deterministic plain stores, no atomics). With the
 *   stored statistics the backward is FA2's five products (S, dP, dV, dK, dQ)
 *   against nine before (statistics pass 2, kv 4, a dq kernel re-forming S and
 *   dP 3), at the price of writing and reading the dS blocks once (npairs * H *
 *   8 KB: 0.8 GB for 16 x 2048 tokens of the 1.5B shape). H200, 1.5B, 16 x
 *   2048: backward 5.09 -> 2.92 ms (3.51 ms with dq re-formed instead of read
 *   from the dS blocks). The forward and kv kernels skip the per-element causal
 *   mask on tiles wholly below the diagonal (warp-uniform test): forward 1.09
 *   -> 1.02 ms, backward 2.92 -> 2.75 ms. When the blocks would not fit (scratch cap,
 *   free memory) or in the precise mode, fa_tc_backward_dq_kernel re-forms S
 *   and dP per query tile and computes dQ += dS K as before.
 * The query-tile grids run the tiles that see the most keys first.
 * Measured and left out (bench/gpu/bench_attention.c, H200): blocks of 8 warps
 * with 128-row tiles (half the L2 -> shared traffic per FLOP; one block per SM
 * by registers instead of two) were 2-10% slower; the kv kernel's K/V
 * fragments held in registers across query tiles changed nothing.
 * Rounding. The backward's gradient MMAs (dV, dK, dQ) take P and dS rounded
 * once to bf16, as FlashAttention-2 does: one MMA per product. That rounding
 * is relative to a row's largest term, not to the (often cancelling) sum, so
 * dK/dV land ~10x outside the 2e-4 * max|ref| bound the fp32-exact kernels
 * meet; the GPU test bounds them instead by that bound plus twice the error of
 * a CPU reference that rounds P and dS to bf16 the same way
 * (tests/gpu/test_cuda_ops.c, test_attention): the GPU adds no error of its own
 * beyond FA2's (measured: max error 1.00x the reference's for dK and dV). The
 * precise mode (the instance's option fa_precise: COLT_FA_PRECISE=1) feeds P and dS as a
 * bf16 pair hi + lo (hi = bf16(x), lo = bf16(x - hi): ~16 significant bits,
 * two MMAs per product) and meets the tight bound; it makes the backward
 * ~12-15% slower. The forward's O = P V always takes the hi + lo pair
 * (FA_TC_SPLIT): it brings the trainer's log-probs closer to the generation
 * engine's, whose decode attention keeps P in fp32 (GRPO bench: mean
 * difference 8.8e-3 -> 8.0e-3 on 0.5B, 1.9e-2 -> 1.6e-2 on 1.5B), at no
 * measured cost. */
#define FA_TC_SPLIT true
#define TC_WARPS 4
#define TC_THREADS (32 * TC_WARPS)

/* query m-tiles of 16 rows per warp in the forward kernel (measured: 2 beats 1
 * by ~10% on the Qwen2.5 shapes, bench_attention) */
#define FA_TC_FWD_MT 2

typedef __nv_bfloat16 bf16_t;

__device__ __forceinline__ uint32_t tc_smem_u32(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

__device__ __forceinline__ void tc_cp_async16(void *sdst, const void *gsrc, bool valid) {
    int sz = valid ? 16 : 0; /* 0: zero-fill, nothing read */
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(tc_smem_u32(sdst)), "l"(gsrc), "r"(sz));
}
__device__ __forceinline__ void tc_cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void tc_cp_wait1() { asm volatile("cp.async.wait_group 1;\n" ::); }

__device__ __forceinline__ void tc_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
__device__ __forceinline__ uint32_t tc_pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *(uint32_t *)&v;
}
/* hi = bf16 pair of (x, y); lo = bf16 pair of the remainders */
__device__ __forceinline__ uint32_t tc_pack_split(float x, float y, uint32_t *lo) {
    __nv_bfloat162 v = __floats2bfloat162_rn(x, y);
    float2 f = __bfloat1622float2(v);
    *lo = tc_pack(x - f.x, y - f.y);
    return *(uint32_t *)&v;
}

/* A operand (16 rows x 16 k) at rows m0.., cols k0.. of a row-major tile with stride LDS */
template <int LDS>
__device__ __forceinline__ void tc_ld_a(uint32_t r[4], const bf16_t *s, int m0, int k0, int lane) {
    ldmatrix_x4(r, s + (m0 + (lane & 15)) * LDS + k0 + (lane >> 4) * 8);
}
/* B operands of two n-tiles (n0..n0+15) x k0..k0+15 from a tile stored [n][k] */
template <int LDS>
__device__ __forceinline__ void tc_ld_b(uint32_t r[4], const bf16_t *s, int n0, int k0, int lane) {
    ldmatrix_x4(r, s + (n0 + (lane >> 4) * 8 + (lane & 7)) * LDS + k0 + ((lane >> 3) & 1) * 8);
}
/* the same from a tile stored [k][n] */
template <int LDS>
__device__ __forceinline__ void tc_ld_bt(uint32_t r[4], const bf16_t *s, int k0, int n0, int lane) {
    ldmatrix_x4_trans(r, s + (k0 + ((lane >> 3) & 1) * 8 + (lane & 7)) * LDS + n0 + (lane >> 4) * 8);
}

/* rows 0..rows-1 of [R, D] from src (row stride in elements) into sm (stride D + 8), the rest zero;
 * NTH threads */
template <int D, int R, int NTH>
__device__ __forceinline__ void tc_load_tile(bf16_t *sm, const bf16_t *src, size_t row_stride, int rows) {
    const int CH = D / 8;
    for (int idx = threadIdx.x; idx < R * CH; idx += NTH) {
        int r = idx / CH, c = (idx % CH) * 8;
        bool ok = r < rows;
        tc_cp_async16(sm + r * (D + 8) + c, ok ? src + (size_t)r * row_stride + c : src, ok);
    }
}

__device__ __forceinline__ float tc_quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float tc_quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

#define TC_LOG2E 1.4426950408889634f
#define TC_LN2 0.69314718055994531f

/* grid (n_tiles, n_heads), TC_THREADS threads: the backward's statistics
 * without O. lse_i and delta_i = sum_j P_ij dP_ij (dP = dout V^T; equal to
 * dout_i . O_i) in one online pass over the key tiles: S = Q K^T and dP, two
 * products per tile against the forward's three (hi + lo P V), and P is never
 * rounded, so delta is fp32-exact. Warp w owns query rows 16w.. of an FT-row
 * tile, its Q and dout fragments in registers. */
/* Where a tensor-core kernel's query tile sits: tiles[blockIdx.x] = (first token, rows, sequence,
 * first position), blockIdx.y the query head; g its KV head, last the tile's last position, nkt the
 * key tiles it sees (causal), kv_base the KV head's first element in the sequence's cache rows. */
struct TcTile {
    int tok0, cnt, s_id, pos0, h, g, last, nkt;
    size_t kv_base;
};
template <int D>
__device__ __forceinline__ TcTile tc_tile(const int4 *tiles, int group, int max_len, int kv_dim) {
    const int4 t = tiles[blockIdx.x];
    const int h = blockIdx.y, g = h / group, last = t.w + t.y - 1;
    return TcTile{t.x, t.y, t.z, t.w, h, g, last, last / FT + 1, (size_t)t.z * max_len * kv_dim + (size_t)g * D};
}

template <int D, bool DELTA>
__global__ void __launch_bounds__(TC_THREADS) fa_tc_stats_kernel(float *lse_out, float *delta_out,
                                                                  const bf16_t *dout, const bf16_t *q,
                                                                  const bf16_t *k_cache, const bf16_t *v_cache,
                                                                  const int4 *tiles, int n_heads, int group,
                                                                  int max_len, int kv_dim, float scale) {
    const int LDS = D + 8, KS = D / 16;
    extern __shared__ float4 fa_smem4[];
    bf16_t *sQ = (bf16_t *)fa_smem4, *sO = sQ + FT * LDS, *sK = sO + FT * LDS, *sV = sK + 2 * FT * LDS;
    const auto [tok0, cnt, s_id, pos0, h, g, last, nkt, kv_base] = tc_tile<D>(tiles, group, max_len, kv_dim);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, tq = lane % 4;
    size_t q_stride = (size_t)n_heads * D;
    tc_load_tile<D, FT, TC_THREADS>(sQ, q + ((size_t)tok0 * n_heads + h) * D, q_stride, cnt);
    if (DELTA) tc_load_tile<D, FT, TC_THREADS>(sO, dout + ((size_t)tok0 * n_heads + h) * D, q_stride, cnt);
    tc_load_tile<D, FT, TC_THREADS>(sK, k_cache + kv_base, kv_dim, min(FT, last + 1));
    if (DELTA) tc_load_tile<D, FT, TC_THREADS>(sV, v_cache + kv_base, kv_dim, min(FT, last + 1));
    tc_cp_commit();
    const float sl2 = scale * TC_LOG2E;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, sd[2] = {0.0f, 0.0f};
    uint32_t qf[KS][4], of[DELTA ? KS : 1][4];
    int wr0 = warp * 16, wlast = min(wr0 + 15, cnt - 1);
    for (int kt = 0; kt < nkt; kt++) {
        int j0 = kt * FT, buf = kt & 1;
        if (kt + 1 < nkt) {
            int j1 = j0 + FT;
            tc_load_tile<D, FT, TC_THREADS>(sK + (buf ^ 1) * FT * LDS, k_cache + kv_base + (size_t)j1 * kv_dim,
                                            kv_dim, min(FT, last + 1 - j1));
            if (DELTA)
                tc_load_tile<D, FT, TC_THREADS>(sV + (buf ^ 1) * FT * LDS, v_cache + kv_base + (size_t)j1 * kv_dim,
                                                kv_dim, min(FT, last + 1 - j1));
        }
        tc_cp_commit();
        tc_cp_wait1();
        __syncthreads();
        if (kt == 0) {
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                tc_ld_a<LDS>(qf[ks], sQ, wr0, ks * 16, lane);
                if (DELTA) tc_ld_a<LDS>(of[DELTA ? ks : 0], sO, wr0, ks * 16, lane);
            }
        }
        if (wr0 < cnt && j0 <= pos0 + wlast) {
            const bf16_t *cK = sK + buf * FT * LDS, *cV = sV + buf * FT * LDS;
            float s[8][4], dp[8][4];
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[n][e] = 0.0f, dp[n][e] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KS; ks++)
#pragma unroll
                for (int np = 0; np < 4; np++) {
                    uint32_t b[4];
                    tc_ld_b<LDS>(b, cK, np * 16, ks * 16, lane);
                    tc_mma(s[2 * np], qf[ks], b[0], b[1]);
                    tc_mma(s[2 * np + 1], qf[ks], b[2], b[3]);
                    if (DELTA) {
                        tc_ld_b<LDS>(b, cV, np * 16, ks * 16, lane);
                        tc_mma(dp[2 * np], of[DELTA ? ks : 0], b[0], b[1]);
                        tc_mma(dp[2 * np + 1], of[DELTA ? ks : 0], b[2], b[3]);
                    }
                }
            float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int r = wr0 + gr + (e >> 1) * 8, j = j0 + n * 8 + 2 * tq + (e & 1);
                    float v = (r < cnt && j <= pos0 + r) ? s[n][e] * sl2 : -INFINITY;
                    s[n][e] = v;
                    mx[e >> 1] = fmaxf(mx[e >> 1], v);
                }
            float mu[2], ps[2] = {0.0f, 0.0f}, pd[2] = {0.0f, 0.0f};
#pragma unroll
            for (int i = 0; i < 2; i++) {
                float mn = fmaxf(m[i], tc_quad_max(mx[i]));
                mu[i] = mn == -INFINITY ? 0.0f : mn;
                float corr = exp2f(m[i] - mu[i]);
                m[i] = mn;
                l[i] *= corr;
                sd[i] *= corr;
            }
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float p = exp2f(s[n][e] - mu[e >> 1]); /* 0 where masked */
                    ps[e >> 1] += p;
                    if (DELTA) pd[e >> 1] += p * dp[n][e];
                }
#pragma unroll
            for (int i = 0; i < 2; i++) l[i] += tc_quad_sum(ps[i]), sd[i] += tc_quad_sum(pd[i]);
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int r = wr0 + gr + 8 * i;
        if (r >= cnt || tq != 0) continue;
        size_t idx = (size_t)(tok0 + r) * n_heads + h;
        lse_out[idx] = (m[i] + log2f(l[i])) * TC_LN2;
        if (DELTA) delta_out[idx] = sd[i] / l[i];
    }
}

/* A operand fragments of P or dS (two n8 accumulator tiles of one k16 step, kk):
 * one bf16 rounding (hi), or hi + lo when SPLIT */
template <bool SPLIT>
__device__ __forceinline__ void tc_pack_a(uint32_t hi[4], uint32_t lo[4], const float x0[4], const float x1[4]) {
    if (SPLIT) {
        hi[0] = tc_pack_split(x0[0], x0[1], &lo[0]);
        hi[1] = tc_pack_split(x0[2], x0[3], &lo[1]);
        hi[2] = tc_pack_split(x1[0], x1[1], &lo[2]);
        hi[3] = tc_pack_split(x1[2], x1[3], &lo[3]);
    } else {
        hi[0] = tc_pack(x0[0], x0[1]), hi[1] = tc_pack(x0[2], x0[3]);
        hi[2] = tc_pack(x1[0], x1[1]), hi[3] = tc_pack(x1[2], x1[3]);
    }
}

/* grid (n_qtiles, n_heads), TC_THREADS threads; warp w owns MT m-tiles of 16
 * query rows (rows 16*MT*w ...), so each K/V fragment read from shared memory
 * feeds MT MMAs. */
template <int D, int MT>
__global__ void __launch_bounds__(TC_THREADS) fa_tc_forward_kernel(bf16_t *out, float *lse_out, const bf16_t *q,
                                                                    const bf16_t *k_cache, const bf16_t *v_cache,
                                                                    const int4 *tiles, int n_heads, int group,
                                                                    int max_len, int kv_dim, float scale) {
    const int LDS = D + 8, NT = D / 8, KS = D / 16, WR = 16 * MT, QR = WR * TC_WARPS;
    extern __shared__ float4 fa_smem4[];
    bf16_t *sQ = (bf16_t *)fa_smem4, *sK = sQ + QR * LDS, *sV = sK + 2 * FT * LDS;
    const auto [tok0, cnt, s_id, pos0, h, g, last, nkt, kv_base] = tc_tile<D>(tiles, group, max_len, kv_dim);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, tq = lane % 4;
    size_t q_stride = (size_t)n_heads * D;
    tc_load_tile<D, QR, TC_THREADS>(sQ, q + ((size_t)tok0 * n_heads + h) * D, q_stride, cnt);
    tc_load_tile<D, FT, TC_THREADS>(sK, k_cache + kv_base, kv_dim, min(FT, last + 1));
    tc_load_tile<D, FT, TC_THREADS>(sV, v_cache + kv_base, kv_dim, min(FT, last + 1));
    tc_cp_commit();
    const float sl2 = scale * TC_LOG2E;
    float o[MT][NT][4], m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
        m[mt][0] = m[mt][1] = -INFINITY, l[mt][0] = l[mt][1] = 0.0f;
#pragma unroll
        for (int n = 0; n < NT; n++) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.0f;
    }
    uint32_t qf[MT == 1 ? KS : 1][4]; /* one m-tile: Q fragments stay in registers; more: read per k step */
    int wr0 = warp * WR, wlast = min(wr0 + WR - 1, cnt - 1); /* the warp's last valid row */
    for (int kt = 0; kt < nkt; kt++) {
        int j0 = kt * FT, buf = kt & 1;
        if (kt + 1 < nkt) {
            int j1 = j0 + FT;
            tc_load_tile<D, FT, TC_THREADS>(sK + (buf ^ 1) * FT * LDS, k_cache + kv_base + (size_t)j1 * kv_dim,
                                            kv_dim, min(FT, last + 1 - j1));
            tc_load_tile<D, FT, TC_THREADS>(sV + (buf ^ 1) * FT * LDS, v_cache + kv_base + (size_t)j1 * kv_dim,
                                            kv_dim, min(FT, last + 1 - j1));
        }
        tc_cp_commit();
        tc_cp_wait1();
        __syncthreads();
        if (MT == 1 && kt == 0) {
#pragma unroll
            for (int ks = 0; ks < KS; ks++) tc_ld_a<LDS>(qf[MT == 1 ? ks : 0], sQ, wr0, ks * 16, lane);
        }
        if (wr0 < cnt && j0 <= pos0 + wlast) {
            const bf16_t *cK = sK + buf * FT * LDS, *cV = sV + buf * FT * LDS;
            float s[MT][8][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int n = 0; n < 8; n++) s[mt][n][0] = s[mt][n][1] = s[mt][n][2] = s[mt][n][3] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                uint32_t qa[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    if (MT == 1) {
#pragma unroll
                        for (int k = 0; k < 4; k++) qa[mt][k] = qf[MT == 1 ? ks : 0][k];
                    } else {
                        tc_ld_a<LDS>(qa[mt], sQ, wr0 + 16 * mt, ks * 16, lane);
                    }
                }
#pragma unroll
                for (int np = 0; np < 4; np++) {
                    uint32_t b[4];
                    tc_ld_b<LDS>(b, cK, np * 16, ks * 16, lane);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        tc_mma(s[mt][2 * np], qa[mt], b[0], b[1]);
                        tc_mma(s[mt][2 * np + 1], qa[mt], b[2], b[3]);
                    }
                }
            }
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                float mx[2] = {-INFINITY, -INFINITY};
                if (j0 + FT - 1 <= pos0 + wr0 + 16 * mt) {
                    /* every row of the m-tile sees every key of the tile: no mask (rows past cnt hold zero Q,
                     * finite, and are never stored) */
#pragma unroll
                    for (int n = 0; n < 8; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            float v = s[mt][n][e] * sl2;
                            s[mt][n][e] = v;
                            mx[e >> 1] = fmaxf(mx[e >> 1], v);
                        }
                } else {
#pragma unroll
                    for (int n = 0; n < 8; n++)
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            int r = wr0 + 16 * mt + gr + (e >> 1) * 8, j = j0 + n * 8 + 2 * tq + (e & 1);
                            float v = (r < cnt && j <= pos0 + r) ? s[mt][n][e] * sl2 : -INFINITY;
                            s[mt][n][e] = v;
                            mx[e >> 1] = fmaxf(mx[e >> 1], v);
                        }
                }
                float mu[2], ps[2] = {0.0f, 0.0f};
#pragma unroll
                for (int i = 0; i < 2; i++) {
                    float mn = fmaxf(m[mt][i], tc_quad_max(mx[i]));
                    mu[i] = mn == -INFINITY ? 0.0f : mn;
                    float corr = exp2f(m[mt][i] - mu[i]);
                    m[mt][i] = mn;
                    l[mt][i] *= corr;
#pragma unroll
                    for (int n = 0; n < NT; n++) o[mt][n][2 * i] *= corr, o[mt][n][2 * i + 1] *= corr;
                }
#pragma unroll
                for (int n = 0; n < 8; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        float p = exp2f(s[mt][n][e] - mu[e >> 1]);
                        s[mt][n][e] = p;
                        ps[e >> 1] += p;
                    }
                l[mt][0] += tc_quad_sum(ps[0]);
                l[mt][1] += tc_quad_sum(ps[1]);
            }
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                uint32_t a[MT][4], al[MT][4];
#pragma unroll
                for (int mt = 0; mt < MT; mt++) /* O from hi + lo P: see FA_TC_SPLIT */
                    tc_pack_a<FA_TC_SPLIT>(a[mt], al[mt], s[mt][2 * kk], s[mt][2 * kk + 1]);
#pragma unroll
                for (int dp = 0; dp < NT / 2; dp++) {
                    uint32_t b[4];
                    tc_ld_bt<LDS>(b, cV, kk * 16, dp * 16, lane);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        tc_mma(o[mt][2 * dp], a[mt], b[0], b[1]);
                        tc_mma(o[mt][2 * dp + 1], a[mt], b[2], b[3]);
                        if (FA_TC_SPLIT) {
                            tc_mma(o[mt][2 * dp], al[mt], b[0], b[1]);
                            tc_mma(o[mt][2 * dp + 1], al[mt], b[2], b[3]);
                        }
                    }
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int r = wr0 + 16 * mt + gr + 8 * i;
            if (r >= cnt) continue;
            size_t idx = (size_t)(tok0 + r) * n_heads + h;
            float inv = 1.0f / l[mt][i];
            if (lse_out && tq == 0) lse_out[idx] = (m[mt][i] + log2f(l[mt][i])) * TC_LN2;
            bf16_t *orow = out + idx * D;
#pragma unroll
            for (int n = 0; n < NT; n++)
                *(__nv_bfloat162 *)(orow + n * 8 + 2 * tq) =
                    __floats2bfloat162_rn(o[mt][n][2 * i] * inv, o[mt][n][2 * i + 1] * inv);
        }
}

/* grid (n_key_blocks, n_kv_heads, n_split), TC_THREADS threads; see
 * fa_backward_kv_kernel. SPLIT: P and dS as hi + lo (precise mode). With
 * ds_out (not SPLIT), the bf16 dS it feeds to dK's MMAs also goes to memory for
 * fa_tc_dq_from_ds_kernel: per (query tile t, key block kt, head h) one block
 * [FT keys][FT queries] at ds_out + ((tile_pbase[t] + kt) * n_heads + h) * FT*FT,
 * zeros where the causal rule masks (query rows past the tile may be left
 * unwritten: they feed only dq rows that are never stored). */
template <int D, bool SPLIT>
__global__ void __launch_bounds__(TC_THREADS) fa_tc_backward_kv_kernel(
    float *dk_cache, float *dv_cache, float *part, bf16_t *ds_out, const bf16_t *dout, const bf16_t *q,
    const bf16_t *k_cache, const bf16_t *v_cache, const float *lse, const float *delta, const int4 *tiles,
    const int *slot_begin, const int *tile_pbase, const int2 *kblocks, int n_heads, int group, int heads_per_split,
    int max_len, int kv_dim, float scale) {
    const int LDS = D + 8, NT = D / 8, KS = D / 16, QC = D == 64 ? 64 : 32, QN = QC / 8;
    const int KR = FT, NTH = TC_THREADS;
    extern __shared__ float4 fa_smem4[];
    bf16_t *sK = (bf16_t *)fa_smem4, *sV = sK + KR * LDS, *sQ = sV + KR * LDS, *sO = sQ + 2 * FT * LDS;
    float *sL = (float *)(sO + 2 * FT * LDS), *sD = sL + 2 * FT;
    int2 kb = kblocks[blockIdx.x];
    int s_id = kb.x, j0 = kb.y * KR, g = blockIdx.y;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, tq = lane % 4;
    int krows = min(KR, max_len - j0);
    size_t kv_base = (size_t)s_id * max_len * kv_dim + (size_t)g * D + (size_t)j0 * kv_dim;
    tc_load_tile<D, KR, NTH>(sK, k_cache + kv_base, kv_dim, krows);
    tc_load_tile<D, KR, NTH>(sV, v_cache + kv_base, kv_dim, krows);
    int tb = slot_begin[s_id], te = slot_begin[s_id + 1];
    int h_lo = g * group + blockIdx.z * heads_per_split, h_hi = min(g * group + group, h_lo + heads_per_split);
    size_t q_stride = (size_t)n_heads * D;
    const float sl2 = scale * TC_LOG2E;
    /* the (head, query tile) pairs whose queries see some key of the block, in order */
    auto seek = [&](int &hh, int &ti) {
        while (hh < h_hi) {
            if (ti >= te) {
                hh++, ti = tb;
                continue;
            }
            int4 u = tiles[ti];
            if (u.w + u.y - 1 >= j0) return;
            ti++;
        }
    };
    auto stage = [&](int hh, int ti, int b) {
        int4 u = tiles[ti];
        size_t off = ((size_t)u.x * n_heads + hh) * D;
        tc_load_tile<D, FT, NTH>(sQ + b * FT * LDS, q + off, q_stride, u.y);
        tc_load_tile<D, FT, NTH>(sO + b * FT * LDS, dout + off, q_stride, u.y);
        if (threadIdx.x < FT) {
            int r = threadIdx.x;
            size_t idx = (size_t)(u.x + r) * n_heads + hh;
            sL[b * FT + r] = r < u.y ? lse[idx] * TC_LOG2E : 0.0f;
            sD[b * FT + r] = r < u.y ? delta[idx] : 0.0f;
        }
    };
    int ch = h_lo, cti = tb;
    seek(ch, cti);
    if (ch < h_hi) stage(ch, cti, 0);
    tc_cp_commit();
    float dk[NT][4], dv[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[n][e] = 0.0f, dv[n][e] = 0.0f;
    int kr0 = warp * 16, buf = 0;
    while (ch < h_hi) {
        int4 u = tiles[cti];
        int cnt = u.y, pos0 = u.w;
        int nh = ch, nti = cti + 1;
        seek(nh, nti);
        if (nh < h_hi) stage(nh, nti, buf ^ 1);
        tc_cp_commit();
        tc_cp_wait1();
        __syncthreads();
        const bf16_t *cQ = sQ + buf * FT * LDS, *cO = sO + buf * FT * LDS;
        const float *cL = sL + buf * FT, *cD = sD + buf * FT;
        /* this warp's 16 key rows of the dS^T block of (tile, key block, head) */
        bf16_t *dsw = ds_out ? ds_out + ((size_t)(tile_pbase[cti] + kb.y) * n_heads + ch) * FT * FT + kr0 * FT : NULL;
        for (int c0 = 0; c0 < cnt; c0 += QC) {
            if (pos0 + min(c0 + QC, cnt) - 1 < j0 + kr0) { /* every query of the chunk precedes the warp's keys */
                if (dsw) {
#pragma unroll
                    for (int kk = 0; kk < QN / 2; kk++)
#pragma unroll
                        for (int e = 0; e < 4; e++)
                            *(uint32_t *)(dsw + (gr + (e & 1) * 8) * FT + c0 + kk * 16 + (e >> 1) * 8 + 2 * tq) = 0u;
                }
                continue;
            }
            float s[QN][4], dp[QN][4];
#pragma unroll
            for (int n = 0; n < QN; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[n][e] = 0.0f, dp[n][e] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                uint32_t ka[4], va[4];
                tc_ld_a<LDS>(ka, sK, kr0, ks * 16, lane);
                tc_ld_a<LDS>(va, sV, kr0, ks * 16, lane);
#pragma unroll
                for (int np = 0; np < QN / 2; np++) {
                    uint32_t b[4];
                    tc_ld_b<LDS>(b, cQ, c0 + np * 16, ks * 16, lane);
                    tc_mma(s[2 * np], ka, b[0], b[1]);
                    tc_mma(s[2 * np + 1], ka, b[2], b[3]);
                    tc_ld_b<LDS>(b, cO, c0 + np * 16, ks * 16, lane);
                    tc_mma(dp[2 * np], va, b[0], b[1]);
                    tc_mma(dp[2 * np + 1], va, b[2], b[3]);
                }
            }
            /* s <- P^T, dp <- dS^T (rows: keys, columns: queries); no per-element mask when every query of the
             * chunk sees every key of the warp (warp-uniform) */
            if (c0 + QC <= cnt && pos0 + c0 >= j0 + kr0 + 15) {
#pragma unroll
                for (int n = 0; n < QN; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int c = c0 + n * 8 + 2 * tq + (e & 1);
                        float p = exp2f(s[n][e] * sl2 - cL[c]);
                        s[n][e] = p;
                        dp[n][e] = p * (dp[n][e] - cD[c]);
                    }
            } else {
#pragma unroll
                for (int n = 0; n < QN; n++)
#pragma unroll
                    for (int e = 0; e < 4; e++) {
                        int j = j0 + kr0 + gr + (e >> 1) * 8, c = c0 + n * 8 + 2 * tq + (e & 1);
                        bool ok = c < cnt && pos0 + c >= j;
                        float p = ok ? exp2f(s[n][e] * sl2 - cL[c]) : 0.0f;
                        s[n][e] = p;
                        dp[n][e] = ok ? p * (dp[n][e] - cD[c]) : 0.0f;
                    }
            }
#pragma unroll
            for (int kk = 0; kk < QN / 2; kk++) {
                uint32_t ph[4], pl[4], dh[4], dl[4];
                tc_pack_a<SPLIT>(ph, pl, s[2 * kk], s[2 * kk + 1]);
                tc_pack_a<SPLIT>(dh, dl, dp[2 * kk], dp[2 * kk + 1]);
                if (!SPLIT && dsw) { /* A fragment registers: rows gr, gr + 8; queries +0 / +8 */
#pragma unroll
                    for (int e = 0; e < 4; e++)
                        *(uint32_t *)(dsw + (gr + (e & 1) * 8) * FT + c0 + kk * 16 + (e >> 1) * 8 + 2 * tq) = dh[e];
                }
#pragma unroll
                for (int dd = 0; dd < NT / 2; dd++) {
                    uint32_t b[4];
                    tc_ld_bt<LDS>(b, cO, c0 + kk * 16, dd * 16, lane);
                    tc_mma(dv[2 * dd], ph, b[0], b[1]);
                    tc_mma(dv[2 * dd + 1], ph, b[2], b[3]);
                    if (SPLIT) {
                        tc_mma(dv[2 * dd], pl, b[0], b[1]);
                        tc_mma(dv[2 * dd + 1], pl, b[2], b[3]);
                    }
                    tc_ld_bt<LDS>(b, cQ, c0 + kk * 16, dd * 16, lane);
                    tc_mma(dk[2 * dd], dh, b[0], b[1]);
                    tc_mma(dk[2 * dd + 1], dh, b[2], b[3]);
                    if (SPLIT) {
                        tc_mma(dk[2 * dd], dl, b[0], b[1]);
                        tc_mma(dk[2 * dd + 1], dl, b[2], b[3]);
                    }
                }
            }
        }
        __syncthreads();
        ch = nh, cti = nti, buf ^= 1;
    }
    if (part == NULL) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int jr = kr0 + gr + 8 * i;
            if (jr >= krows) continue;
            size_t row = kv_base + (size_t)jr * kv_dim;
#pragma unroll
            for (int n = 0; n < NT; n++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    int d = n * 8 + 2 * tq + e;
                    dk_cache[row + d] += scale * dk[n][2 * i + e];
                    dv_cache[row + d] += dv[n][2 * i + e];
                }
        }
    } else {
        /* partials [n_split][n_kb][KVH][KR][D] for dk, then the same for dv */
        size_t per = (size_t)gridDim.x * gridDim.y * KR * D;
        float *pk = part + (size_t)blockIdx.z * per + ((size_t)blockIdx.x * gridDim.y + g) * KR * D;
        float *pv = pk + (size_t)gridDim.z * per;
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int jr = kr0 + gr + 8 * i;
#pragma unroll
            for (int n = 0; n < NT; n++) {
                int d = n * 8 + 2 * tq;
                *(float2 *)(pk + (size_t)jr * D + d) = make_float2(scale * dk[n][2 * i], scale * dk[n][2 * i + 1]);
                *(float2 *)(pv + (size_t)jr * D + d) = make_float2(dv[n][2 * i], dv[n][2 * i + 1]);
            }
        }
    }
}

/* grid (n_tiles, n_heads), TC_THREADS threads: dq = scale * sum_j dS_ij k_j. SPLIT: dS as hi + lo. */
template <int D, bool SPLIT>
__global__ void __launch_bounds__(TC_THREADS) fa_tc_backward_dq_kernel(bf16_t *dq, const bf16_t *dout,
                                                                    const bf16_t *q, const bf16_t *k_cache,
                                                                    const bf16_t *v_cache, const float *lse,
                                                                    const float *delta, const int4 *tiles,
                                                                    int n_heads, int group, int max_len,
                                                                    int kv_dim, float scale) {
    const int LDS = D + 8, NT = D / 8, KS = D / 16, QR = FT, NTH = TC_THREADS;
    extern __shared__ float4 fa_smem4[];
    bf16_t *sQ = (bf16_t *)fa_smem4, *sO = sQ + QR * LDS, *sK = sO + QR * LDS, *sV = sK + 2 * FT * LDS;
    const auto [tok0, cnt, s_id, pos0, h, g, last, nkt, kv_base] = tc_tile<D>(tiles, group, max_len, kv_dim);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, tq = lane % 4;
    size_t q_stride = (size_t)n_heads * D;
    tc_load_tile<D, QR, NTH>(sQ, q + ((size_t)tok0 * n_heads + h) * D, q_stride, cnt);
    tc_load_tile<D, QR, NTH>(sO, dout + ((size_t)tok0 * n_heads + h) * D, q_stride, cnt);
    tc_load_tile<D, FT, NTH>(sK, k_cache + kv_base, kv_dim, min(FT, last + 1));
    tc_load_tile<D, FT, NTH>(sV, v_cache + kv_base, kv_dim, min(FT, last + 1));
    tc_cp_commit();
    const float sl2 = scale * TC_LOG2E;
    int wr0 = warp * 16, wlast = min(wr0 + 15, cnt - 1);
    float rl[2], rd[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int r = wr0 + gr + 8 * i;
        size_t idx = (size_t)(tok0 + r) * n_heads + h;
        rl[i] = r < cnt ? lse[idx] * TC_LOG2E : 0.0f;
        rd[i] = r < cnt ? delta[idx] : 0.0f;
    }
    float acc[NT][4];
#pragma unroll
    for (int n = 0; n < NT; n++) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
    for (int kt = 0; kt < nkt; kt++) {
        int j0 = kt * FT, buf = kt & 1;
        if (kt + 1 < nkt) {
            int j1 = j0 + FT;
            tc_load_tile<D, FT, NTH>(sK + (buf ^ 1) * FT * LDS, k_cache + kv_base + (size_t)j1 * kv_dim, kv_dim,
                                     min(FT, last + 1 - j1));
            tc_load_tile<D, FT, NTH>(sV + (buf ^ 1) * FT * LDS, v_cache + kv_base + (size_t)j1 * kv_dim, kv_dim,
                                     min(FT, last + 1 - j1));
        }
        tc_cp_commit();
        tc_cp_wait1();
        __syncthreads();
        if (wr0 < cnt && j0 <= pos0 + wlast) {
            const bf16_t *cK = sK + buf * FT * LDS, *cV = sV + buf * FT * LDS;
            float s[8][4], dp[8][4];
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[n][e] = 0.0f, dp[n][e] = 0.0f;
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                uint32_t qa[4], oa[4];
                tc_ld_a<LDS>(qa, sQ, wr0, ks * 16, lane);
                tc_ld_a<LDS>(oa, sO, wr0, ks * 16, lane);
#pragma unroll
                for (int np = 0; np < 4; np++) {
                    uint32_t b[4];
                    tc_ld_b<LDS>(b, cK, np * 16, ks * 16, lane);
                    tc_mma(s[2 * np], qa, b[0], b[1]);
                    tc_mma(s[2 * np + 1], qa, b[2], b[3]);
                    tc_ld_b<LDS>(b, cV, np * 16, ks * 16, lane);
                    tc_mma(dp[2 * np], oa, b[0], b[1]);
                    tc_mma(dp[2 * np + 1], oa, b[2], b[3]);
                }
            }
#pragma unroll
            for (int n = 0; n < 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int r = wr0 + gr + (e >> 1) * 8, j = j0 + n * 8 + 2 * tq + (e & 1);
                    bool ok = r < cnt && j <= pos0 + r;
                    float p = ok ? exp2f(s[n][e] * sl2 - rl[e >> 1]) : 0.0f;
                    s[n][e] = ok ? p * (dp[n][e] - rd[e >> 1]) : 0.0f;
                }
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                uint32_t ah[4], al[4];
                tc_pack_a<SPLIT>(ah, al, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
                for (int dd = 0; dd < NT / 2; dd++) {
                    uint32_t b[4];
                    tc_ld_bt<LDS>(b, cK, kk * 16, dd * 16, lane);
                    tc_mma(acc[2 * dd], ah, b[0], b[1]);
                    tc_mma(acc[2 * dd + 1], ah, b[2], b[3]);
                    if (SPLIT) {
                        tc_mma(acc[2 * dd], al, b[0], b[1]);
                        tc_mma(acc[2 * dd + 1], al, b[2], b[3]);
                    }
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        int r = wr0 + gr + 8 * i;
        if (r >= cnt) continue;
        bf16_t *row = dq + ((size_t)(tok0 + r) * n_heads + h) * D;
#pragma unroll
        for (int n = 0; n < NT; n++)
            *(__nv_bfloat162 *)(row + n * 8 + 2 * tq) = __floats2bfloat162_rn(scale * acc[n][2 * i], scale * acc[n][2 * i + 1]);
    }
}

/* A operand (16 rows m0.. x 16 k k0..) from a tile stored [k][m] with stride LDS */
template <int LDS>
__device__ __forceinline__ void tc_ld_at(uint32_t r[4], const bf16_t *s, int m0, int k0, int lane) {
    ldmatrix_x4_trans(r, s + (k0 + (lane & 7) + ((lane >> 4) & 1) * 8) * LDS + m0 + ((lane >> 3) & 1) * 8);
}

/* grid (n_tiles, n_heads), TC_THREADS threads: dq = scale * sum_kt dS(kt) K(kt)
 * from the dS blocks fa_tc_backward_kv_kernel stored (no S, dP recompute: one
 * product per key tile instead of three). The warps tile the [FT, D] output
 * 2 x 2: warp w owns query rows 32 (w & 1).. (two m-tiles) and head dims
 * D/2 (w >> 1).., so each K fragment feeds two MMAs and each dS fragment D/16.
 * dS (stored [key][query]) and K stream through shared memory by cp.async,
 * double buffered. */
template <int D>
__global__ void __launch_bounds__(TC_THREADS) fa_tc_dq_from_ds_kernel(bf16_t *dq, const bf16_t *ds,
                                                                      const bf16_t *k_cache, const int4 *tiles,
                                                                      const int *tile_pbase, int n_heads, int group,
                                                                      int max_len, int kv_dim, float scale) {
    const int LDS = D + 8, LDP = FT + 8, NW = D / 16; /* n8-tiles per warp */
    extern __shared__ float4 fa_smem4[];
    bf16_t *sP = (bf16_t *)fa_smem4, *sK = sP + 2 * FT * LDP;
    const auto [tok0, cnt, s_id, pos0, h, g, last, nkt, kv_base] = tc_tile<D>(tiles, group, max_len, kv_dim);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32, gr = lane / 4, tq = lane % 4;
    int wm = (warp & 1) * 32, wn = (warp >> 1) * (D / 2);
    const bf16_t *dsb = ds + ((size_t)tile_pbase[blockIdx.x] * n_heads + h) * FT * FT;
    const size_t ds_step = (size_t)n_heads * FT * FT;
    tc_load_tile<FT, FT, TC_THREADS>(sP, dsb, FT, FT);
    tc_load_tile<D, FT, TC_THREADS>(sK, k_cache + kv_base, kv_dim, min(FT, last + 1));
    tc_cp_commit();
    float acc[2][NW][4];
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int n = 0; n < NW; n++) acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.0f;
    for (int kt = 0; kt < nkt; kt++) {
        int buf = kt & 1;
        if (kt + 1 < nkt) {
            int j1 = (kt + 1) * FT;
            tc_load_tile<FT, FT, TC_THREADS>(sP + (buf ^ 1) * FT * LDP, dsb + (kt + 1) * ds_step, FT, FT);
            tc_load_tile<D, FT, TC_THREADS>(sK + (buf ^ 1) * FT * LDS, k_cache + kv_base + (size_t)j1 * kv_dim,
                                            kv_dim, min(FT, last + 1 - j1));
        }
        tc_cp_commit();
        tc_cp_wait1();
        __syncthreads();
        const bf16_t *cP = sP + buf * FT * LDP, *cK = sK + buf * FT * LDS;
#pragma unroll
        for (int ks = 0; ks < FT / 16; ks++) {
            uint32_t a[2][4];
            tc_ld_at<LDP>(a[0], cP, wm, ks * 16, lane);
            tc_ld_at<LDP>(a[1], cP, wm + 16, ks * 16, lane);
#pragma unroll
            for (int np = 0; np < NW / 2; np++) {
                uint32_t b[4];
                tc_ld_bt<LDS>(b, cK, ks * 16, wn + np * 16, lane);
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    tc_mma(acc[mt][2 * np], a[mt], b[0], b[1]);
                    tc_mma(acc[mt][2 * np + 1], a[mt], b[2], b[3]);
                }
            }
        }
        __syncthreads();
    }
#pragma unroll
    for (int mt = 0; mt < 2; mt++)
#pragma unroll
        for (int i = 0; i < 2; i++) {
            int r = wm + 16 * mt + gr + 8 * i;
            if (r >= cnt) continue;
            bf16_t *row = dq + ((size_t)(tok0 + r) * n_heads + h) * D + wn;
#pragma unroll
            for (int n = 0; n < NW; n++)
                *(__nv_bfloat162 *)(row + n * 8 + 2 * tq) =
                    __floats2bfloat162_rn(scale * acc[mt][n][2 * i], scale * acc[mt][n][2 * i + 1]);
        }
}

/* delta[i, h] = dout[i, h, :] . out[i, h, :] in fp32 (FA2's preprocessing
 * pass): one warp per (token, head) row, a fixed shuffle order. */
template <int D>
__global__ void fa_tc_delta_kernel(float *delta, const bf16_t *dout, const bf16_t *out, size_t rows) {
    size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (row >= rows) return;
    const __nv_bfloat162 *g = (const __nv_bfloat162 *)(dout + row * D), *o = (const __nv_bfloat162 *)(out + row * D);
    float sum = 0.0f;
#pragma unroll
    for (int k = lane; k < D / 2; k += 32) {
        float2 a = __bfloat1622float2(g[k]), b = __bfloat1622float2(o[k]);
        sum = fmaf(a.x, b.x, sum);
        sum = fmaf(a.y, b.y, sum);
    }
    sum = warp_sum(sum);
    if (lane == 0) delta[row] = sum;
}

/* shared memory: forward Q (16 * MT * TC_WARPS rows) + K, V double buffered (FT
 * rows each); kv: K, V + Q, dO double buffered + lse, delta; stats and dq: Q,
 * dO + K, V double buffered */
static size_t fa_tc_smem_forward(int d, int mt) {
    return (size_t)(16 * mt * TC_WARPS + 4 * FT) * (d + 8) * sizeof(bf16_t);
}
static size_t fa_tc_smem_kv(int d) { return (size_t)6 * FT * (d + 8) * sizeof(bf16_t) + 4 * FT * sizeof(float); }
static size_t fa_tc_smem_dq(int d) { return (size_t)6 * FT * (d + 8) * sizeof(bf16_t); }
static size_t fa_tc_smem_dq_ds(int d) { return (size_t)2 * FT * (FT + 8 + d + 8) * sizeof(bf16_t); }

static bool fa_tc_aligned(const void *p) { return ((size_t)p & 15) == 0; }

template <int D, int MT>
static void fa_tc_forward_launch(CudaState *cs, bf16_t *out, float *lse, const bf16_t *q, const bf16_t *kc,
                                 const bf16_t *vc, const FaPlan *pl, int n_heads, int group, int max_len, int kv_dim,
                                 float scale) {
    size_t smem = fa_tc_smem_forward(D, MT);
    cuda_smem_optin(cs, (const void *)fa_tc_forward_kernel<D, MT>, smem);
    fa_tc_forward_kernel<D, MT><<<dim3((unsigned)pl->nq, (unsigned)n_heads), TC_THREADS, smem, cs->stream>>>(
        out, lse, q, kc, vc, pl->qtiles, n_heads, group, max_len, kv_dim, scale);
    LAUNCH_CHECK(cs);
}

/* The dS blocks of the non-precise backward take npairs * H * FT^2 bf16 of
 * scratch (1.5B shape, 16 x 2048 tokens: 0.83 GB; 7B, 8 x 2048: 0.97 GB); above
 * the instance's option fa_ds_max_mb MiB (COLT_FA_DS_MAX_MB, default 1024), or
 * when the device could not hold the scratch with 256 MiB to spare, the
 * backward forms dq by recomputing S and dP instead (fa_tc_backward_dq_kernel). */
static size_t fa_ds_cap_bytes(const CudaState *cs) {
    long mb = cs->opt.fa_ds_max_mb;
    return mb > 0 ? (size_t)mb << 20 : 0;
}

/* Whether cuda_scratch(cs, bytes) will fit: sizes granted before are (the scratch
 * never shrinks); a larger one needs its power-of-two capacity free. */
static bool fa_scratch_fits(CudaState *cs, size_t bytes) {
    size_t &granted = cs->fa_granted;
    if (bytes <= granted) return true;
    size_t cap = (size_t)1 << 16, free_bytes = 0, total_bytes = 0;
    while (cap < bytes) cap *= 2;
    if (cudaMemGetInfo(&free_bytes, &total_bytes) != cudaSuccess) return false;
    if (cap + ((size_t)256 << 20) > free_bytes) return false;
    granted = cap;
    return true;
}

static size_t fa_align256(size_t b) { return (b + 255) & ~(size_t)255; }

/* statistics (or delta alone, given the forward's lse and output), kv and dq
 * kernels; the plan's qtiles have FT rows here */
template <int D, bool SPLIT>
static void fa_tc_backward_launch(CudaState *cs, bf16_t *dq, float *dkc, float *dvc, const bf16_t *go,
                                  const bf16_t *q, const bf16_t *out, const float *lse_fwd, const bf16_t *kc,
                                  const bf16_t *vc, const FaPlan *pl, int n, int n_heads, int n_kv_heads,
                                  int max_len) {
    size_t smem_kv = fa_tc_smem_kv(D), smem_dq = fa_tc_smem_dq(D), smem_ds = fa_tc_smem_dq_ds(D);
    cuda_smem_optin(cs, (const void *)fa_tc_backward_kv_kernel<D, SPLIT>, smem_kv);
    cuda_smem_optin(cs, (const void *)fa_tc_backward_dq_kernel<D, SPLIT>, smem_dq);
    cuda_smem_optin(cs, (const void *)fa_tc_stats_kernel<D, true>, smem_dq);
    cuda_smem_optin(cs, (const void *)fa_tc_dq_from_ds_kernel<D>, smem_ds);
    int group = n_heads / n_kv_heads, kv_dim = n_kv_heads * D;
    float scale = (float)(1.0 / sqrt((double)D));
    /* as fa_backward_launch: split the query heads of a group until the grid covers the GPU a few times */
    int blocks = pl->nkb * n_kv_heads, want = 4 * cs->sm_count;
    int n_split = blocks >= want ? 1 : (want + blocks - 1) / blocks;
    if (n_split > group) n_split = group;
    int per = (group + n_split - 1) / n_split;
    n_split = (group + per - 1) / per;
    size_t part_elems = n_split > 1 ? (size_t)2 * n_split * blocks * FT * D : 0;
    size_t nh = (size_t)n * n_heads;
    /* the forward's statistics are used in the FA2-rounding mode only: the precise mode keeps delta = sum P dP
     * in fp32 (a delta from the bf16 output would undo what its hi + lo split buys) */
    bool stored = !SPLIT && lse_fwd && out;
    size_t ds_bytes = SPLIT ? 0 : pl->npairs * (size_t)n_heads * FT * FT * sizeof(bf16_t);
    /* scratch: [lse nh, unless stored][delta nh][partials][dS blocks], each 256-byte aligned */
    size_t b_lse = stored ? 0 : fa_align256(nh * sizeof(float)), b_delta = fa_align256(nh * sizeof(float));
    size_t b_part = fa_align256(part_elems * sizeof(float));
    if (ds_bytes > fa_ds_cap_bytes(cs) || !fa_scratch_fits(cs, b_lse + b_delta + b_part + ds_bytes + 256))
        ds_bytes = 0;
    char *scratch = (char *)cuda_scratch(cs, b_lse + b_delta + b_part + ds_bytes + 256);
    scratch = (char *)(((size_t)scratch + 255) & ~(size_t)255);
    float *lse = stored ? NULL : (float *)scratch, *delta = (float *)(scratch + b_lse);
    float *part = n_split > 1 ? (float *)(scratch + b_lse + b_delta) : NULL;
    bf16_t *ds = ds_bytes ? (bf16_t *)(scratch + b_lse + b_delta + b_part) : NULL;
    cudaStream_t st = cs->stream;
    if (stored) {
        fa_tc_delta_kernel<D><<<(unsigned)((nh + 7) / 8), 256, 0, st>>>(delta, go, out, nh);
        LAUNCH_CHECK(cs);
    } else {
        fa_tc_stats_kernel<D, true><<<dim3((unsigned)pl->nq, (unsigned)n_heads), TC_THREADS, smem_dq, st>>>(
            lse, delta, go, q, kc, vc, pl->qtiles, n_heads, group, max_len, kv_dim, scale);
        LAUNCH_CHECK(cs);
    }
    const float *lse_use = stored ? lse_fwd : lse;
    fa_tc_backward_kv_kernel<D, SPLIT>
        <<<dim3((unsigned)pl->nkb, (unsigned)n_kv_heads, (unsigned)n_split), TC_THREADS, smem_kv, st>>>(
            dkc, dvc, part, ds, go, q, kc, vc, lse_use, delta, pl->tiles, pl->slot_begin, pl->tile_pbase,
            pl->kblocks, n_heads, group, per, max_len, kv_dim, scale);
    LAUNCH_CHECK(cs);
    if (n_split > 1) {
        size_t per_elems = (size_t)blocks * FT * D;
        fa_backward_kv_reduce_kernel<<<cuda_blocks_for(per_elems), CUDA_THREADS, 0, st>>>(
            dkc, dvc, part, pl->kblocks, pl->nkb, n_kv_heads, n_split, D, max_len, kv_dim, FT);
        LAUNCH_CHECK(cs);
    }
    if (ds) {
        fa_tc_dq_from_ds_kernel<D><<<dim3((unsigned)pl->nq, (unsigned)n_heads), TC_THREADS, smem_ds, st>>>(
            dq, ds, kc, pl->qtiles, pl->qtile_pbase, n_heads, group, max_len, kv_dim, scale);
    } else {
        fa_tc_backward_dq_kernel<D, SPLIT><<<dim3((unsigned)pl->nq, (unsigned)n_heads), TC_THREADS, smem_dq, st>>>(
            dq, go, q, kc, vc, lse_use, delta, pl->qtiles, n_heads, group, max_len, kv_dim, scale);
    }
    LAUNCH_CHECK(cs);
}

/* The tensor-core backward by head dim and rounding. */
template <int D>
static void fa_tc_backward_dispatch(CudaState *cs, bf16_t *dq, float *dkc, float *dvc, const bf16_t *go,
                                    const bf16_t *q, const bf16_t *out, const float *lse, const bf16_t *kc,
                                    const bf16_t *vc, const FaPlan *pl, int n, int n_heads, int n_kv_heads,
                                    int max_len, bool precise) {
    if (precise)
        fa_tc_backward_launch<D, true>(cs, dq, dkc, dvc, go, q, out, lse, kc, vc, pl, n, n_heads, n_kv_heads,
                                       max_len);
    else
        fa_tc_backward_launch<D, false>(cs, dq, dkc, dvc, go, q, out, lse, kc, vc, pl, n, n_heads, n_kv_heads,
                                        max_len);
}

/* lse alone (the deterministic mode's forward runs the paged kernel, which
 * keeps its statistics to itself): fa_tc_stats_kernel without dP */
template <int D>
static void fa_tc_lse_launch(CudaState *cs, float *lse, const bf16_t *q, const bf16_t *kc, const bf16_t *vc,
                             const FaPlan *pl, int n_heads, int group, int max_len, int kv_dim, float scale) {
    size_t smem = fa_tc_smem_dq(D);
    cuda_smem_optin(cs, (const void *)fa_tc_stats_kernel<D, false>, smem);
    fa_tc_stats_kernel<D, false><<<dim3((unsigned)pl->nq, (unsigned)n_heads), TC_THREADS, smem, cs->stream>>>(
        lse, NULL, NULL, q, kc, vc, pl->qtiles, n_heads, group, max_len, kv_dim, scale);
    LAUNCH_CHECK(cs);
}

/* ---------------------------------------------------------------- forward */

/* grid: n * n_heads blocks; block: ATT_WARPS * 32 threads. DPL = dims per lane. */
template <typename T, int DPL>
__global__ void attention_kernel(T *out, float *lse, const T *q, const T *k_cache, const T *v_cache, const int *slot,
                                 const int *pos, int n_heads, int group, int head_dim, int max_len, int kv_dim,
                                 float scale) {
    __shared__ float sh_m[ATT_WARPS], sh_l[ATT_WARPS];
    __shared__ float sh_acc[ATT_WARPS][ATT_MAX_HEAD_DIM];
    int i = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const T *qi = q + ((size_t)i * n_heads + h) * head_dim;
    size_t base = (size_t)slot[i] * max_len * kv_dim + (size_t)(h / group) * head_dim;
    const T *kbase = k_cache + base, *vbase = v_cache + base;
    float qr[DPL], acc[DPL];
#pragma unroll
    for (int k = 0; k < DPL; k++) {
        int d = lane + 32 * k;
        qr[k] = d < head_dim ? to_float(qi[d]) : 0.0f;
        acc[k] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    int len = pos[i] + 1;
    for (int t = warp; t < len; t += ATT_WARPS) {
        const T *kt = kbase + (size_t)t * kv_dim, *vt = vbase + (size_t)t * kv_dim;
        float s = 0.0f;
#pragma unroll
        for (int k = 0; k < DPL; k++) {
            int d = lane + 32 * k;
            if (d < head_dim) s += qr[k] * to_float(kt[d]);
        }
        s = warp_sum(s) * scale;
        if (s > m) { /* rescale what was accumulated under the old max */
            float c = expf(m - s);
            l *= c;
#pragma unroll
            for (int k = 0; k < DPL; k++) acc[k] *= c;
            m = s;
        }
        float p = expf(s - m);
        l += p;
#pragma unroll
        for (int k = 0; k < DPL; k++) {
            int d = lane + 32 * k;
            if (d < head_dim) acc[k] += p * to_float(vt[d]);
        }
    }
    if (lane == 0) sh_m[warp] = m, sh_l[warp] = l;
#pragma unroll
    for (int k = 0; k < DPL; k++) {
        int d = lane + 32 * k;
        if (d < head_dim) sh_acc[warp][d] = acc[k];
    }
    __syncthreads();
    float mx = -INFINITY;
    for (int w = 0; w < ATT_WARPS; w++) mx = fmaxf(mx, sh_m[w]);
    float total = 0.0f, wscale[ATT_WARPS];
    for (int w = 0; w < ATT_WARPS; w++) {
        wscale[w] = sh_l[w] > 0.0f ? expf(sh_m[w] - mx) : 0.0f; /* warps with no positions hold -inf, 0 */
        total += sh_l[w] * wscale[w];
    }
    T *oi = out + ((size_t)i * n_heads + h) * head_dim;
    if (lse && threadIdx.x == 0) lse[(size_t)i * n_heads + h] = mx + logf(total);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++) o += sh_acc[w][d] * wscale[w];
        oi[d] = from_float<T>(o / total);
    }
}

template <typename T>
void cuda_attention(const Backend *be, void *out, void *lse, const void *q, const void *k_cache, const void *v_cache,
                    const int *slot, const int *pos, int n, int n_heads, int n_kv_heads, int head_dim, int max_len) {
    if (n <= 0 || n_heads <= 0) return;
    CudaState *cs = cuda_enter(be);
    CUDA_ASSERT_HOST(head_dim > 0 && head_dim <= ATT_MAX_HEAD_DIM && n_kv_heads > 0 && n_heads % n_kv_heads == 0);
    int group = n_heads / n_kv_heads, kv_dim = n_kv_heads * head_dim;
    float scale = (float)(1.0 / sqrt((double)head_dim));
    float *lse_out = (float *)lse;
    FaPlan pl;
    bool tc = std::is_same<T, __nv_bfloat16>::value && (head_dim == 64 || head_dim == 128) && fa_tc_aligned(out) &&
              fa_tc_aligned(q) && fa_tc_aligned(k_cache) && fa_tc_aligned(v_cache);
    if (cuda_attention_invariant(cs)) { /* deterministic mode: the engine's kernel, bit for bit (cuda_paged.cu) */
        cuda_attention_paged<T>(cs, out, q, k_cache, v_cache, slot, pos, n, n_heads, n_kv_heads, head_dim, max_len);
        if (!lse_out) return;
        /* the statistics for the backward: the stats kernel without dP on tiles, else the per-token kernel's
         * (its output goes to scratch) */
        if constexpr (std::is_same<T, __nv_bfloat16>::value) {
            if (tc && fa_make_plan(cs, &pl, slot, pos, n, 0, max_len, 0, FT, FT)) {
                if (pl.nt == 0) return;
                if (head_dim == 64)
                    fa_tc_lse_launch<64>(cs, lse_out, (const bf16_t *)q, (const bf16_t *)k_cache,
                                         (const bf16_t *)v_cache,
                                         &pl, n_heads, group, max_len, kv_dim, scale);
                else
                    fa_tc_lse_launch<128>(cs, lse_out, (const bf16_t *)q, (const bf16_t *)k_cache,
                                          (const bf16_t *)v_cache, &pl, n_heads, group, max_len, kv_dim, scale);
                return;
            }
        }
        out = cuda_scratch(cs, (size_t)n * n_heads * head_dim * sizeof(T));
    } else if (head_dim <= 128 &&
               fa_make_plan(cs, &pl, slot, pos, n, 0, max_len, 0, tc ? 16 * TC_WARPS * FA_TC_FWD_MT : FT, FT)) {
        if (pl.nt == 0) return;
        if constexpr (std::is_same<T, __nv_bfloat16>::value) {
            if (tc) {
                if (head_dim == 64)
                    fa_tc_forward_launch<64, FA_TC_FWD_MT>(cs, (bf16_t *)out, lse_out, (const bf16_t *)q,
                                                           (const bf16_t *)k_cache, (const bf16_t *)v_cache, &pl,
                                                           n_heads, group, max_len, kv_dim, scale);
                else
                    fa_tc_forward_launch<128, FA_TC_FWD_MT>(cs, (bf16_t *)out, lse_out, (const bf16_t *)q,
                                                            (const bf16_t *)k_cache, (const bf16_t *)v_cache, &pl,
                                                            n_heads, group, max_len, kv_dim, scale);
                return;
            }
        }
        if (head_dim <= 64)
            fa_forward_launch<T, 64>(cs, (T *)out, lse_out, (const T *)q, (const T *)k_cache, (const T *)v_cache, &pl,
                                     n_heads, group, head_dim, max_len, kv_dim, scale);
        else
            fa_forward_launch<T, 128>(cs, (T *)out, lse_out, (const T *)q, (const T *)k_cache, (const T *)v_cache, &pl,
                                      n_heads, group, head_dim, max_len, kv_dim, scale);
        return;
    }
    const int *host[2] = {slot, pos};
    int *d = cuda_upload_indices(cs, host, 2, n);
    dim3 grid((unsigned)((size_t)n * n_heads)), block(ATT_WARPS * 32);
    cudaStream_t st = cs->stream;
    T *o = (T *)out;
    const T *qs = (const T *)q, *kc = (const T *)k_cache, *vc = (const T *)v_cache;
#define ATT_FWD_LAUNCH(DPL)                                                                                    \
    attention_kernel<T, DPL><<<grid, block, 0, st>>>(o, lse_out, qs, kc, vc, d, d + n, n_heads, group, head_dim, \
                                                     max_len, kv_dim, scale)
    if (head_dim <= 32)
        ATT_FWD_LAUNCH(1);
    else if (head_dim <= 64)
        ATT_FWD_LAUNCH(2);
    else if (head_dim <= 128)
        ATT_FWD_LAUNCH(4);
    else
        ATT_FWD_LAUNCH(8);
#undef ATT_FWD_LAUNCH
    LAUNCH_CHECK(cs);
}

/* ---------------------------------------------------------------- backward */

template <typename T, int DPL>
__global__ void attention_backward_kernel(T *dq, float *dk_cache, float *dv_cache, const T *dout, const T *q,
                                          const T *k_cache, const T *v_cache, const int *slot, const int *pos,
                                          int n_heads, int group, int head_dim, int n_slots, int max_len,
                                          int kv_dim, float scale) {
    __shared__ float sh_m[ATT_WARPS], sh_l[ATT_WARPS], sh_sd[ATT_WARPS];
    __shared__ float sh_acc[ATT_WARPS][ATT_MAX_HEAD_DIM];
    int i = blockIdx.x / n_heads, h = blockIdx.x % n_heads;
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    int s_id = slot[i];
    if (s_id < 0 || s_id >= n_slots) return; /* as the CPU: tokens outside 0..n_slots-1 are not visited */
    const T *qi = q + ((size_t)i * n_heads + h) * head_dim;
    const T *gi = dout + ((size_t)i * n_heads + h) * head_dim;
    size_t base = (size_t)s_id * max_len * kv_dim + (size_t)(h / group) * head_dim;
    const T *kbase = k_cache + base, *vbase = v_cache + base;
    float *dkbase = dk_cache + base, *dvbase = dv_cache + base;
    float qr[DPL], gr[DPL], acc[DPL];
#pragma unroll
    for (int k = 0; k < DPL; k++) {
        int d = lane + 32 * k;
        qr[k] = d < head_dim ? to_float(qi[d]) : 0.0f;
        gr[k] = d < head_dim ? to_float(gi[d]) : 0.0f;
        acc[k] = 0.0f;
    }
    int len = pos[i] + 1;

    /* Pass 1: max, sum of e_t and sum of e_t * dP_t, online per warp. */
    float m = -INFINITY, l = 0.0f, sd = 0.0f;
    for (int t = warp; t < len; t += ATT_WARPS) {
        const T *kt = kbase + (size_t)t * kv_dim, *vt = vbase + (size_t)t * kv_dim;
        float s = 0.0f, dp = 0.0f;
#pragma unroll
        for (int k = 0; k < DPL; k++) {
            int d = lane + 32 * k;
            if (d < head_dim) s += qr[k] * to_float(kt[d]), dp += gr[k] * to_float(vt[d]);
        }
        s = warp_sum(s) * scale;
        dp = warp_sum(dp);
        if (s > m) {
            float c = expf(m - s);
            l *= c, sd *= c, m = s;
        }
        float e = expf(s - m);
        l += e;
        sd += e * dp;
    }
    if (lane == 0) sh_m[warp] = m, sh_l[warp] = l, sh_sd[warp] = sd;
    __syncthreads();
    float mx = -INFINITY;
    for (int w = 0; w < ATT_WARPS; w++) mx = fmaxf(mx, sh_m[w]);
    float total = 0.0f, sd_total = 0.0f;
    for (int w = 0; w < ATT_WARPS; w++) {
        float c = sh_l[w] > 0.0f ? expf(sh_m[w] - mx) : 0.0f;
        total += sh_l[w] * c;
        sd_total += sh_sd[w] * c;
    }
    float delta = sd_total / total;

    /* Pass 2: dS_t = P_t (dP_t - delta); dq += dS_t k_t; dk_t += scale dS_t q; dv_t += P_t dout. */
    for (int t = warp; t < len; t += ATT_WARPS) {
        const T *kt = kbase + (size_t)t * kv_dim, *vt = vbase + (size_t)t * kv_dim;
        float s = 0.0f, dp = 0.0f;
        float kr[DPL];
#pragma unroll
        for (int k = 0; k < DPL; k++) {
            int d = lane + 32 * k;
            kr[k] = d < head_dim ? to_float(kt[d]) : 0.0f;
            if (d < head_dim) s += qr[k] * kr[k], dp += gr[k] * to_float(vt[d]);
        }
        s = warp_sum(s) * scale;
        dp = warp_sum(dp);
        float p = expf(s - mx) / total, ds = p * (dp - delta), sds = scale * ds;
        float *dkt = dkbase + (size_t)t * kv_dim, *dvt = dvbase + (size_t)t * kv_dim;
#pragma unroll
        for (int k = 0; k < DPL; k++) {
            int d = lane + 32 * k;
            if (d < head_dim) {
                acc[k] += ds * kr[k];
                atomicAdd(dkt + d, sds * qr[k]);
                atomicAdd(dvt + d, p * gr[k]);
            }
        }
    }
#pragma unroll
    for (int k = 0; k < DPL; k++) {
        int d = lane + 32 * k;
        if (d < head_dim) sh_acc[warp][d] = acc[k];
    }
    __syncthreads();
    T *dqi = dq + ((size_t)i * n_heads + h) * head_dim;
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float a = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++) a += sh_acc[w][d];
        dqi[d] = from_float<T>(scale * a);
    }
}

template <typename T>
void cuda_attention_backward(const Backend *be, void *dq, void *dk_cache, void *dv_cache, const void *dout,
                             const void *q, const void *out, const void *lse, const void *k_cache,
                             const void *v_cache, const int *slot, const int *pos, int n, int n_heads,
                             int n_kv_heads, int head_dim, int n_slots, int max_len) {
    if (n <= 0 || n_heads <= 0) return;
    CudaState *cs = cuda_enter(be);
    CUDA_ASSERT_HOST(head_dim > 0 && head_dim <= ATT_MAX_HEAD_DIM && n_kv_heads > 0 && n_heads % n_kv_heads == 0);
    FaPlan pl;
    bool tc = std::is_same<T, __nv_bfloat16>::value && (head_dim == 64 || head_dim == 128) && fa_tc_aligned(dq) &&
              fa_tc_aligned(dout) && fa_tc_aligned(q) && fa_tc_aligned(k_cache) && fa_tc_aligned(v_cache);
    const bf16_t *out_fwd = out && fa_tc_aligned(out) ? (const bf16_t *)out : NULL;
    if (head_dim <= 128 && n_slots > 0 && fa_make_plan(cs, &pl, slot, pos, n, n_slots, max_len, 1, FT, FT)) {
        if (pl.nt == 0) return;
        if constexpr (std::is_same<T, __nv_bfloat16>::value) {
            if (tc) {
                bool precise = cs->opt.fa_precise != 0;
                if (head_dim == 64)
                    fa_tc_backward_dispatch<64>(cs, (bf16_t *)dq, (float *)dk_cache, (float *)dv_cache,
                                                (const bf16_t *)dout, (const bf16_t *)q, out_fwd, (const float *)lse,
                                                (const bf16_t *)k_cache, (const bf16_t *)v_cache, &pl, n, n_heads,
                                                n_kv_heads, max_len, precise);
                else
                    fa_tc_backward_dispatch<128>(cs, (bf16_t *)dq, (float *)dk_cache, (float *)dv_cache,
                                                 (const bf16_t *)dout, (const bf16_t *)q, out_fwd, (const float *)lse,
                                                 (const bf16_t *)k_cache, (const bf16_t *)v_cache, &pl, n, n_heads,
                                                 n_kv_heads, max_len, precise);
                return;
            }
        }
        if (head_dim <= 64)
            fa_backward_launch<T, 64>(cs, (T *)dq, (float *)dk_cache, (float *)dv_cache, (const T *)dout, (const T *)q,
                                      (const T *)k_cache, (const T *)v_cache, &pl, n, n_heads, n_kv_heads, head_dim,
                                      max_len);
        else
            fa_backward_launch<T, 128>(cs, (T *)dq, (float *)dk_cache, (float *)dv_cache, (const T *)dout, (const T *)q,
                                       (const T *)k_cache, (const T *)v_cache, &pl, n, n_heads, n_kv_heads, head_dim,
                                       max_len);
        return;
    }
    const int *host[2] = {slot, pos};
    int *d = cuda_upload_indices(cs, host, 2, n);
    int group = n_heads / n_kv_heads, kv_dim = n_kv_heads * head_dim;
    float scale = (float)(1.0 / sqrt((double)head_dim));
    dim3 grid((unsigned)((size_t)n * n_heads)), block(ATT_WARPS * 32);
    cudaStream_t st = cs->stream;
    T *dqs = (T *)dq;
    float *dkc = (float *)dk_cache, *dvc = (float *)dv_cache;
    const T *go = (const T *)dout, *qs = (const T *)q, *kc = (const T *)k_cache, *vc = (const T *)v_cache;
#define ATT_BWD_LAUNCH(DPL)                                                                                    \
    attention_backward_kernel<T, DPL><<<grid, block, 0, st>>>(dqs, dkc, dvc, go, qs, kc, vc, d, d + n, n_heads, \
                                                              group, head_dim, n_slots, max_len, kv_dim, scale)
    if (head_dim <= 32)
        ATT_BWD_LAUNCH(1);
    else if (head_dim <= 64)
        ATT_BWD_LAUNCH(2);
    else if (head_dim <= 128)
        ATT_BWD_LAUNCH(4);
    else
        ATT_BWD_LAUNCH(8);
#undef ATT_BWD_LAUNCH
    LAUNCH_CHECK(cs);
}

/* The plan buffers (host memory). */
void cuda_attention_release(CudaState *cs) {
    int *bufs[] = {cs->fa_raw, cs->fa_rawq, cs->fa_sortq, cs->fa_packed, cs->fa_aux, cs->fa_tokbase, cs->fa_count};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) free(bufs[k]);
    cs->fa_raw = cs->fa_rawq = cs->fa_sortq = cs->fa_packed = cs->fa_aux = cs->fa_tokbase = cs->fa_count = NULL;
    cs->fa_raw_cap = cs->fa_packed_cap = cs->fa_aux_cap = cs->fa_tokbase_cap = cs->fa_count_cap = 0;
}

#define INSTANTIATE(T)                                                                                              \
    template void cuda_kv_store<T>(const Backend *, void *, void *, const void *, const void *, const int *,       \
                                   const int *, int, int, int);                                                     \
    template void cuda_kv_gather<T>(const Backend *, void *, void *, const void *, const void *, const int *,      \
                                    const int *, int, int, int);                                                    \
    template void cuda_attention<T>(const Backend *, void *, void *, const void *, const void *, const void *,     \
                                    const int *, const int *, int, int, int, int, int);                            \
    template void cuda_attention_backward<T>(const Backend *, void *, void *, void *, const void *, const void *,  \
                                             const void *, const void *, const void *, const void *, const int *,   \
                                             const int *, int, int, int, int, int, int);
INSTANTIATE(float)
INSTANTIATE(__nv_bfloat16)
