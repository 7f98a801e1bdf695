/* cuda_fused.cu — the decode step's fused ops (backend.h, "generation engine"):
 * add_rmsnorm, qkv_rope_store, swiglu_gate_up, one kernel each.
 *
 * Contract: each result is bit-identical to the unfused sequence on the same
 * table (add + rmsnorm; copies + rope_i32 + rope_i32 + paged_kv_store; swiglu).
 * That holds because every value is computed by the same fp32 (and double)
 * expressions, written the same way so nvcc contracts them into the same FMAs,
 * and every reduction adds in the same order as the kernel it replaces: the
 * device code below repeats, line for line, the arithmetic of cuda_ops.cu
 * (rmsnorm_kernel, rmsnorm_warp_kernel, block_sum, warp_reduce_sum, add_kernel,
 * swiglu_f) and cuda_paged.cu (rope_i32_kernel, rope_i32_vec_kernel). A change
 * to those must be made here too; tests/gpu/test_cuda_fused.c compares the
 * two bit for bit. Only the loops, the grid and the memory traffic differ.
 *
 * Graph capture: launch configurations depend on host arguments only; no op
 * allocates, synchronises or copies from the host, except cuda_rope_inv_freq's
 * upload when the rope table changes, which the engine's warm-up does once.
 * Storage T is float or bf16; arithmetic fp32; copies move raw bits.
 *
 * Dimension legend: N tokens (rows) in a call, D row width, F MLP width, H
 * query heads, KVH key/value heads, Dh head dim, W = (H + 2*KVH) * Dh. */
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_common.cuh"

/* Private to this file: names here must not meet the same-named helpers of
 * cuda_ops.cu / cuda_paged.cu at link time. */
namespace fused {




/* ---------------------------------------------------------------- 8-element vectors */

/* 8 consecutive elements (16-byte aligned) <-> fp32: one uint4 of bf16 or two
 * of fp32. Widening is exact; narrowing rounds to nearest even, as V8::set in
 * cuda_ops.cu and chunk_pack in cuda_paged.cu do. */
template <typename T> struct Vec8;
template <> struct Vec8<float> {
    static __device__ __forceinline__ void load(const float *p, float f[8]) {
        float4 a = reinterpret_cast<const float4 *>(p)[0], b = reinterpret_cast<const float4 *>(p)[1];
        f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
    }
    static __device__ __forceinline__ void store(float *p, const float f[8]) {
        reinterpret_cast<float4 *>(p)[0] = make_float4(f[0], f[1], f[2], f[3]);
        reinterpret_cast<float4 *>(p)[1] = make_float4(f[4], f[5], f[6], f[7]);
    }
    /* Raw bits, so a copy is exact whatever the values (NaN payloads included). */
    static __device__ __forceinline__ void copy(float *dst, const float *src) {
        reinterpret_cast<uint4 *>(dst)[0] = reinterpret_cast<const uint4 *>(src)[0];
        reinterpret_cast<uint4 *>(dst)[1] = reinterpret_cast<const uint4 *>(src)[1];
    }
};
template <> struct Vec8<__nv_bfloat16> {
    static __device__ __forceinline__ void load(const __nv_bfloat16 *p, float f[8]) {
        uint4 r = *reinterpret_cast<const uint4 *>(p);
        f[0] = bf_lo(r.x), f[1] = bf_hi(r.x), f[2] = bf_lo(r.y), f[3] = bf_hi(r.y);
        f[4] = bf_lo(r.z), f[5] = bf_hi(r.z), f[6] = bf_lo(r.w), f[7] = bf_hi(r.w);
    }
    static __device__ __forceinline__ void store(__nv_bfloat16 *p, const float f[8]) {
        *reinterpret_cast<uint4 *>(p) =
            make_uint4(bf_pack(f[0], f[1]), bf_pack(f[2], f[3]), bf_pack(f[4], f[5]), bf_pack(f[6], f[7]));
    }
    static __device__ __forceinline__ void copy(__nv_bfloat16 *dst, const __nv_bfloat16 *src) {
        *reinterpret_cast<uint4 *>(dst) = *reinterpret_cast<const uint4 *>(src);
    }
};

/* ---------------------------------------------------------------- reductions (cuda_ops.cu's) */

__device__ __forceinline__ float warp_reduce_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* block_sum of cuda_ops.cu: warp sums, then warp 0's .. last warp's in order. */
__device__ float block_sum(float v) {
    __shared__ float sh[32];
    v = warp_reduce_sum(v);
    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;
    __syncthreads();
    float r = 0;
    for (int w = 0; w < (int)(blockDim.x / 32); w++) r += sh[w];
    __syncthreads();
    return r;
}

/* ---------------------------------------------------------------- add_rmsnorm */

/* One block of ADD_RMSNORM_THREADS per row. cuda_rmsnorm runs one of two
 * kernels, whose sums of squares add in different orders, and this kernel
 * reproduces the one cuda_rmsnorm would pick (the same test, on xn, x, w):
 *
 *  VEC (dim % 8 == 0, aligned): rmsnorm_warp_kernel's order. All threads add
 *  delta, round to T and store x, and stage the new row in shared memory
 *  (in x itself when the row is too wide for it); after a barrier, warp 0
 *  sums the squares exactly as that kernel's one warp does (lane l over
 *  vectors l, l + 32, ..., the 8 elements in order, then a butterfly), and
 *  every thread writes its vectors of xn.
 *
 *  scalar: rmsnorm_kernel's order. ADD_RMSNORM_THREADS equals its ROW_THREADS
 *  (256), so thread t adds elements t, t + 256, ..., and block_sum combines
 *  the threads as there; each thread reads back only what it wrote.
 *
 * Either way the norm reads x rounded to T, as after the add kernel. */
#define ADD_RMSNORM_THREADS 256
#define ADD_RMSNORM_MAX_SHARED_BYTES (47 * 1024) /* static + dynamic <= 48 KB without an opt-in */

template <typename T, bool VEC, bool STAGE_SHARED>
__global__ void __launch_bounds__(ADD_RMSNORM_THREADS)
    add_rmsnorm_kernel(T *x, T *xn, const T *delta, const T *w, int dim, float eps, bool delta_aligned) {
    extern __shared__ __align__(16) unsigned char staged_shared[];
    __shared__ float scale_shared;
    T *xi = x + (size_t)blockIdx.x * dim, *oi = xn + (size_t)blockIdx.x * dim;
    const T *di = delta + (size_t)blockIdx.x * dim;
    if (VEC) {
        T *staged = STAGE_SHARED ? reinterpret_cast<T *>(staged_shared) : xi;
        int nvec = dim / 8;
        for (int v = threadIdx.x; v < nvec; v += blockDim.x) {
            float f[8], d[8];
            Vec8<T>::load(xi + v * 8, f);
            if (delta_aligned) {
                Vec8<T>::load(di + v * 8, d);
            } else {
#pragma unroll
                for (int k = 0; k < 8; k++) d[k] = to_float(di[v * 8 + k]);
            }
#pragma unroll
            for (int k = 0; k < 8; k++) f[k] += d[k];
            Vec8<T>::store(xi + v * 8, f);
            if (STAGE_SHARED) Vec8<T>::store(staged + v * 8, f);
        }
        __syncthreads(); /* also makes x's global writes visible to warp 0 */
        if (threadIdx.x < 32) {
            int lane = threadIdx.x;
            float ss = 0.0f;
            for (int v = lane; v < nvec; v += 32) {
                float f[8];
                Vec8<T>::load(staged + v * 8, f);
#pragma unroll
                for (int k = 0; k < 8; k++) ss += f[k] * f[k];
            }
            ss = warp_reduce_sum(ss);
            if (lane == 0) scale_shared = (float)(1.0 / sqrt((double)ss / dim + (double)eps));
        }
        __syncthreads();
        float scale = scale_shared;
        for (int v = threadIdx.x; v < nvec; v += blockDim.x) {
            float f[8], g[8];
            Vec8<T>::load(staged + v * 8, f);
            Vec8<T>::load(w + v * 8, g);
#pragma unroll
            for (int k = 0; k < 8; k++) f[k] = g[k] * (f[k] * scale);
            Vec8<T>::store(oi + v * 8, f);
        }
    } else {
        float ss = 0.0f;
        for (int j = threadIdx.x; j < dim; j += blockDim.x) {
            T sum = from_float<T>(to_float(xi[j]) + to_float(di[j]));
            xi[j] = sum;
            float v = to_float(sum);
            ss += v * v;
        }
        ss = block_sum(ss);
        float scale = (float)(1.0 / sqrt((double)ss / dim + (double)eps));
        for (int j = threadIdx.x; j < dim; j += blockDim.x)
            oi[j] = from_float<T>(to_float(w[j]) * (to_float(xi[j]) * scale));
    }
}

/* ---------------------------------------------------------------- qkv_rope_store */

/* Where head h (0 .. H+2*KVH-1) of token i goes: q for h < H; else the k / v
 * pool row of the token's slot, NULL for a padding token (slot < 0). */
template <typename T>
__device__ __forceinline__ T *qkv_destination(T *q, T *k_pool, T *v_pool, const int *slot_mapping, size_t i, int h,
                                              int n_heads, int n_kv_heads, int head_dim) {
    if (h < n_heads) return q + (i * n_heads + h) * head_dim;
    int slot = slot_mapping[i];
    if (slot < 0) return NULL;
    size_t row = (size_t)slot * n_kv_heads * head_dim;
    if (h < n_heads + n_kv_heads) return k_pool + row + (size_t)(h - n_heads) * head_dim;
    return v_pool + row + (size_t)(h - n_heads - n_kv_heads) * head_dim;
}

/* One thread per (token, head of q|k|v, pair j): rope_i32_kernel's rotation for
 * q and k heads, a copy of elements j and j + half for v heads. */
template <typename T>
__global__ void qkv_rope_store_kernel(T *q, T *k_pool, T *v_pool, const T *qkv, const int *pos,
                                      const int *slot_mapping, const float *inv_freq, int n, int n_heads,
                                      int n_kv_heads, int head_dim) {
    int half = head_dim / 2, heads = n_heads + 2 * n_kv_heads;
    size_t total = (size_t)n * heads * half;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        int j = (int)(e % half);
        size_t ih = e / half; /* token * heads + head: the head's offset in qkv, in head_dim units */
        size_t i = ih / heads;
        int h = (int)(ih % heads);
        T *dst = qkv_destination(q, k_pool, v_pool, slot_mapping, i, h, n_heads, n_kv_heads, head_dim);
        if (!dst) continue;
        const T *v = qkv + ih * head_dim;
        if (h >= n_heads + n_kv_heads) {
            dst[j] = v[j];
            dst[j + half] = v[j + half];
            continue;
        }
        float angle = (float)pos[i] * inv_freq[j];
        float c = cosf(angle), s = sinf(angle);
        float a = to_float(v[j]), b = to_float(v[j + half]);
        dst[j] = from_float<T>(a * c - b * s);
        dst[j + half] = from_float<T>(b * c + a * s);
    }
}

/* One thread per (token, head of q|k|v, group of 8 pairs): rope_i32_vec_kernel's
 * rotation; half % 8 == 0 and every buffer 16-byte aligned. */
template <typename T>
__global__ void qkv_rope_store_vec_kernel(T *q, T *k_pool, T *v_pool, const T *qkv, const int *pos,
                                          const int *slot_mapping, const float *inv_freq, int n, int n_heads,
                                          int n_kv_heads, int head_dim) {
    int half = head_dim / 2, groups = half / 8, heads = n_heads + 2 * n_kv_heads;
    size_t total = (size_t)n * heads * groups;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        int j0 = (int)(e % groups) * 8;
        size_t ih = e / groups; /* token * heads + head */
        size_t i = ih / heads;
        int h = (int)(ih % heads);
        T *dst = qkv_destination(q, k_pool, v_pool, slot_mapping, i, h, n_heads, n_kv_heads, head_dim);
        if (!dst) continue;
        const T *v = qkv + ih * head_dim;
        if (h >= n_heads + n_kv_heads) {
            Vec8<T>::copy(dst + j0, v + j0);
            Vec8<T>::copy(dst + j0 + half, v + j0 + half);
            continue;
        }
        float p = (float)pos[i];
        float a[8], b[8];
        Vec8<T>::load(v + j0, a);
        Vec8<T>::load(v + j0 + half, b);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float angle = p * inv_freq[j0 + k];
            float c = cosf(angle), s = sinf(angle);
            float ak = a[k], bk = b[k];
            a[k] = ak * c - bk * s;
            b[k] = bk * c + ak * s;
        }
        Vec8<T>::store(dst + j0, a);
        Vec8<T>::store(dst + j0 + half, b);
    }
}

/* ---------------------------------------------------------------- swiglu_gate_up */

/* swiglu_f of cuda_ops.cu. */
__device__ __forceinline__ float swiglu_f(float g, float u) { return g / (1.0f + expf(-g)) * u; }

/* Grid-stride over the 8-element vectors of out[N, F] (F % 8 == 0, aligned):
 * gate from gate_up[i, c*8 ..], up from gate_up[i, F + c*8 ..]. */
template <typename T> __global__ void swiglu_gate_up_vec_kernel(T *out, const T *gate_up, int n, int f) {
    int row_vecs = f / 8;
    size_t total = (size_t)n * row_vecs;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        size_t i = e / row_vecs, c = (e % row_vecs) * 8;
        const T *g = gate_up + i * 2 * f + c;
        float gf[8], uf[8];
        Vec8<T>::load(g, gf);
        Vec8<T>::load(g + f, uf);
#pragma unroll
        for (int k = 0; k < 8; k++) gf[k] = swiglu_f(gf[k], uf[k]);
        Vec8<T>::store(out + i * f + c, gf);
    }
}

template <typename T> __global__ void swiglu_gate_up_kernel(T *out, const T *gate_up, int n, int f) {
    size_t total = (size_t)n * f;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        size_t i = e / f, j = e % f;
        const T *g = gate_up + i * 2 * f + j;
        out[e] = from_float<T>(swiglu_f(to_float(g[0]), to_float(g[f])));
    }
}

} /* namespace fused */

/* ---------------------------------------------------------------- host side */

template <typename T>
void cuda_add_rmsnorm(const Backend *be, void *x, void *xn, const void *delta, const void *w, int n, int dim,
                      float eps) {
    using namespace fused;
    if (n <= 0 || dim <= 0) return;
    CudaState *cs = cuda_enter(be);
    T *xs = (T *)x, *os = (T *)xn;
    const T *ds = (const T *)delta, *ws = (const T *)w;
    bool delta_aligned = aligned16(delta);
    cudaStream_t st = cs->stream;
    /* cuda_rmsnorm's own test for its vectorised kernel: the sum order follows it. */
    if (dim % 8 == 0 && aligned16(xn) && aligned16(x) && aligned16(w)) {
        size_t staged_bytes = (size_t)dim * sizeof(T);
        if (staged_bytes <= ADD_RMSNORM_MAX_SHARED_BYTES)
            add_rmsnorm_kernel<T, true, true><<<n, ADD_RMSNORM_THREADS, staged_bytes, st>>>(xs, os, ds, ws, dim, eps,
                                                                                          delta_aligned);
        else
            add_rmsnorm_kernel<T, true, false><<<n, ADD_RMSNORM_THREADS, 0, st>>>(xs, os, ds, ws, dim, eps,
                                                                                 delta_aligned);
    } else {
        add_rmsnorm_kernel<T, false, false><<<n, ADD_RMSNORM_THREADS, 0, st>>>(xs, os, ds, ws, dim, eps,
                                                                              delta_aligned);
    }
    LAUNCH_CHECK(cs);
}

template <typename T>
void cuda_qkv_rope_store(const Backend *be, void *q, void *k_pool, void *v_pool, const void *qkv, const void *pos,
                         const void *slot_mapping, int n, int n_heads, int n_kv_heads, int head_dim,
                         const float *inv_freq_host) {
    using namespace fused;
    if (n <= 0 || n_heads <= 0 || n_kv_heads <= 0 || head_dim <= 0) return;
    CudaState *cs = cuda_enter(be);
    CUDA_ASSERT_HOST(head_dim % 2 == 0);
    const float *inv_freq = cuda_rope_inv_freq(cs, head_dim, inv_freq_host);
    const int *positions = (const int *)pos, *slots = (const int *)slot_mapping;
    int heads = n_heads + 2 * n_kv_heads;
    cudaStream_t st = cs->stream;
    if ((head_dim / 2) % 8 == 0 && aligned16(q) && aligned16(k_pool) && aligned16(v_pool) && aligned16(qkv)) {
        size_t total = (size_t)n * heads * (head_dim / 16);
        qkv_rope_store_vec_kernel<T><<<flat_blocks(cs, total), CUDA_THREADS, 0, st>>>(
            (T *)q, (T *)k_pool, (T *)v_pool, (const T *)qkv, positions, slots, inv_freq, n, n_heads, n_kv_heads,
            head_dim);
    } else {
        size_t total = (size_t)n * heads * (head_dim / 2);
        qkv_rope_store_kernel<T><<<flat_blocks(cs, total), CUDA_THREADS, 0, st>>>(
            (T *)q, (T *)k_pool, (T *)v_pool, (const T *)qkv, positions, slots, inv_freq, n, n_heads, n_kv_heads,
            head_dim);
    }
    LAUNCH_CHECK(cs);
}

template <typename T> void cuda_swiglu_gate_up(const Backend *be, void *out, const void *gate_up, int n, int f) {
    using namespace fused;
    if (n <= 0 || f <= 0) return;
    CudaState *cs = cuda_enter(be);
    cudaStream_t st = cs->stream;
    if (f % 8 == 0 && aligned16(out) && aligned16(gate_up)) {
        size_t total = (size_t)n * (f / 8);
        swiglu_gate_up_vec_kernel<T><<<flat_blocks(cs, total), CUDA_THREADS, 0, st>>>((T *)out, (const T *)gate_up, n,
                                                                                     f);
    } else {
        size_t total = (size_t)n * f;
        swiglu_gate_up_kernel<T><<<flat_blocks(cs, total), CUDA_THREADS, 0, st>>>((T *)out, (const T *)gate_up, n, f);
    }
    LAUNCH_CHECK(cs);
}

#define INSTANTIATE(T)                                                                                             \
    template void cuda_add_rmsnorm<T>(const Backend *, void *, void *, const void *, const void *, int, int, float); \
    template void cuda_qkv_rope_store<T>(const Backend *, void *, void *, void *, const void *, const void *,       \
                                         const void *, int, int, int, int, const float *);                         \
    template void cuda_swiglu_gate_up<T>(const Backend *, void *, const void *, int, int);
INSTANTIATE(float)
INSTANTIATE(__nv_bfloat16)
