/* cuda_ops.cu — every CUDA op that is neither a GEMM nor attention: norms,
 * rope, elementwise, embedding, log-softmax (whole rows and a rank's part of
 * a vocabulary-parallel row), AdamW and the reductions.
 *
 * Contract (backend.h): activations are "=", gradients named "+=" accumulate.
 * Storage T is float or bf16; all arithmetic is fp32, reductions over a row
 * use fp32 per thread and a fixed-order block reduction (double where the sum
 * is long: log-softmax, sum_squares). Row ops use one block per row;
 * elementwise ops a grid-stride loop. Only embedding_backward uses atomics.
 * Tolerance vs the CPU in fp32 storage: ~1e-6 relative (order of summation). */
#include <math.h>
#include <stdint.h>

#include "backend/cuda/cuda_common.cuh"

extern "C" {
#include "core/floats.h"
}

#define ROW_THREADS 256

/* ---------------------------------------------------------------- reductions */

template <typename A> __device__ __forceinline__ A warp_reduce_sum(A v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_reduce_max(float v) {
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block, returned to every thread; fixed order, so deterministic.
 * Ends with a barrier so it can be called again. blockDim.x a multiple of 32. */
template <typename A> __device__ A block_sum(A v) {
    __shared__ A sh[32];
    v = warp_reduce_sum(v);
    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;
    __syncthreads();
    A r = 0;
    for (int w = 0; w < (int)(blockDim.x / 32); w++) r += sh[w];
    __syncthreads();
    return r;
}

__device__ float block_max(float v) {
    __shared__ float sh[32];
    v = warp_reduce_max(v);
    if (threadIdx.x % 32 == 0) sh[threadIdx.x / 32] = v;
    __syncthreads();
    float r = -INFINITY;
    for (int w = 0; w < (int)(blockDim.x / 32); w++) r = fmaxf(r, sh[w]);
    __syncthreads();
    return r;
}

#define GRID_STRIDE(e, total) \
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < (total); e += (size_t)gridDim.x * blockDim.x)

/* ---------------------------------------------------------------- 16-byte vectors */

/* Flat kernels move 8 elements per step whatever the storage: one uint4 of
 * bf16 or two float4 of fp32, so kernels mixing the two (adamw) share one
 * index. The vector body runs only when every pointer is 16-byte aligned (the
 * host checks); the remaining elements (odd n, or everything when a pointer is
 * misaligned) take the scalar tail, with the same arithmetic. */
#define VEC 8

template <typename T> struct V8;
template <> struct V8<float> {
    float4 a, b;
    __device__ __forceinline__ void load(const float *p) {
        a = reinterpret_cast<const float4 *>(p)[0];
        b = reinterpret_cast<const float4 *>(p)[1];
    }
    __device__ __forceinline__ void store(float *p) const {
        reinterpret_cast<float4 *>(p)[0] = a;
        reinterpret_cast<float4 *>(p)[1] = b;
    }
    __device__ __forceinline__ void get(float *f) const {
        f[0] = a.x, f[1] = a.y, f[2] = a.z, f[3] = a.w, f[4] = b.x, f[5] = b.y, f[6] = b.z, f[7] = b.w;
    }
    __device__ __forceinline__ void set(const float *f) {
        a = make_float4(f[0], f[1], f[2], f[3]);
        b = make_float4(f[4], f[5], f[6], f[7]);
    }
};
template <> struct V8<__nv_bfloat16> {
    uint4 r;
    __device__ __forceinline__ void load(const __nv_bfloat16 *p) { r = *reinterpret_cast<const uint4 *>(p); }
    __device__ __forceinline__ void store(__nv_bfloat16 *p) const { *reinterpret_cast<uint4 *>(p) = r; }
    __device__ __forceinline__ void get(float *f) const {
        f[0] = bf_lo(r.x), f[1] = bf_hi(r.x), f[2] = bf_lo(r.y), f[3] = bf_hi(r.y);
        f[4] = bf_lo(r.z), f[5] = bf_hi(r.z), f[6] = bf_lo(r.w), f[7] = bf_hi(r.w);
    }
    __device__ __forceinline__ void set(const float *f) {
        r.x = bf_pack(f[0], f[1]), r.y = bf_pack(f[2], f[3]), r.z = bf_pack(f[4], f[5]), r.w = bf_pack(f[6], f[7]);
    }
};




/* Number of 8-element vectors the vector body covers: all of n when every
 * pointer is aligned, else none. */
static inline size_t vec_count(size_t n, bool ok) { return ok ? n / VEC : 0; }

/* Grid-stride loop over vectors, UNROLL vectors per thread per iteration (their
 * loads issued together); then the scalar tail [nv*8, n). */
#define VEC_LOOP_BEGIN(UNROLL)                                                                     \
    const size_t vl_stride = (size_t)gridDim.x * blockDim.x;                                       \
    const size_t vl_tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;                           \
    for (size_t vl_base = vl_tid; vl_base < nv; vl_base += (UNROLL) * vl_stride)
#define TAIL_LOOP(e) for (size_t e = nv * VEC + vl_tid; e < n; e += vl_stride)

/* ---------------------------------------------------------------- conversion */

/* dst[e] = (D)src[e] between storage types, through fp32. */
template <typename D, typename S> __global__ void convert_kernel(D *dst, const S *src, size_t n, size_t nv) {
    VEC_LOOP_BEGIN(2) {
        V8<S> a[2];
#pragma unroll
        for (int k = 0; k < 2; k++)
            if (vl_base + k * vl_stride < nv) a[k].load(src + (vl_base + k * vl_stride) * VEC);
#pragma unroll
        for (int k = 0; k < 2; k++)
            if (vl_base + k * vl_stride < nv) {
                float f[VEC];
                a[k].get(f);
                V8<D> o;
                o.set(f);
                o.store(dst + (vl_base + k * vl_stride) * VEC);
            }
    }
    TAIL_LOOP(e) dst[e] = from_float<D>(to_float(src[e]));
}

template <typename D, typename S> static void convert_launch(CudaState *cs, D *dst, const S *src, size_t n) {
    if (!n) return;
    size_t nv = vec_count(n, aligned16(dst) && aligned16(src));
    convert_kernel<D, S><<<flat_blocks(cs, nv ? nv : n), CUDA_THREADS, 0, cs->stream>>>(dst, src, n, nv);
    LAUNCH_CHECK(cs);
}

template <typename T> void cuda_convert_from_f32(CudaState *cs, void *dst, const float *src, size_t n) {
    convert_launch<T, float>(cs, (T *)dst, src, n);
}

template <typename T> void cuda_convert_to_f32(CudaState *cs, float *dst, const void *src, size_t n) {
    convert_launch<float, T>(cs, dst, (const T *)src, n);
}

/* ---------------------------------------------------------------- rmsnorm */

/* One block per row: sum of squares in fp32, the scale in double then fp32,
 * applied as w * (x * scale) like transformers. */
template <typename T> __global__ void rmsnorm_kernel(T *out, const T *x, const T *w, int dim, float eps) {
    const T *xi = x + (size_t)blockIdx.x * dim;
    T *oi = out + (size_t)blockIdx.x * dim;
    float ss = 0.0f;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        float v = to_float(xi[j]);
        ss += v * v;
    }
    ss = block_sum(ss);
    float scale = (float)(1.0 / sqrt((double)ss / dim + (double)eps));
    for (int j = threadIdx.x; j < dim; j += blockDim.x) oi[j] = from_float<T>(to_float(w[j]) * (to_float(xi[j]) * scale));
}

/* The same with one warp per row and 16-byte vectors (dim % 8 == 0, aligned
 * rows): the sum of squares in fp32 per lane, a butterfly warp sum (every lane
 * gets the same bits), the same scale expression. */
template <typename T>
__global__ void rmsnorm_warp_kernel(T *out, const T *x, const T *w, int n, int dim, float eps) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= n) return;
    const T *xi = x + (size_t)row * dim;
    T *oi = out + (size_t)row * dim;
    int nvec = dim / VEC;
    float ss = 0.0f;
    for (int q = lane; q < nvec; q += 32) {
        V8<T> a;
        a.load(xi + q * VEC);
        float f[VEC];
        a.get(f);
#pragma unroll
        for (int k = 0; k < VEC; k++) ss += f[k] * f[k];
    }
    ss = warp_reduce_sum(ss);
    float scale = (float)(1.0 / sqrt((double)ss / dim + (double)eps));
    for (int q = lane; q < nvec; q += 32) {
        V8<T> a, b;
        a.load(xi + q * VEC);
        b.load(w + q * VEC);
        float f[VEC], g[VEC];
        a.get(f);
        b.get(g);
#pragma unroll
        for (int k = 0; k < VEC; k++) f[k] = g[k] * (f[k] * scale);
        a.set(f);
        a.store(oi + q * VEC);
    }
}

template <typename T>
void cuda_rmsnorm(const Backend *be, void *out, const void *x, const void *w, int n, int dim, float eps) {
    if (n <= 0 || dim <= 0) return;
    CudaState *cs = cuda_enter(be);
    if (dim % VEC == 0 && aligned16(out) && aligned16(x) && aligned16(w)) {
        const int rows_per_block = CUDA_THREADS / 32;
        rmsnorm_warp_kernel<T><<<(n + rows_per_block - 1) / rows_per_block, CUDA_THREADS, 0, cs->stream>>>(
            (T *)out, (const T *)x, (const T *)w, n, dim, eps);
        LAUNCH_CHECK(cs);
        return;
    }
    rmsnorm_kernel<T><<<n, ROW_THREADS, 0, cs->stream>>>((T *)out, (const T *)x, (const T *)w, dim, eps);
    LAUNCH_CHECK(cs);
}

/* dx += r (g - x r^2 mean(g x)), g = dy * w, one block per row; r goes to
 * r_out[row] for the dw pass. */
template <typename T>
__global__ void rmsnorm_backward_dx_kernel(T *dx, float *r_out, const T *dy, const T *x, const T *w, int dim,
                                           float eps) {
    size_t off = (size_t)blockIdx.x * dim;
    float ss = 0.0f, gx = 0.0f;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        float xv = to_float(x[off + j]);
        ss += xv * xv;
        gx += to_float(dy[off + j]) * to_float(w[j]) * xv;
    }
    ss = block_sum(ss);
    gx = block_sum(gx);
    double r = 1.0 / sqrt((double)ss / dim + (double)eps);
    float rf = (float)r, c = (float)(r * r * r * (double)gx / dim);
    if (threadIdx.x == 0) r_out[blockIdx.x] = rf;
    for (int j = threadIdx.x; j < dim; j += blockDim.x) {
        float g = to_float(dy[off + j]) * to_float(w[j]);
        dx[off + j] = from_float<T>(to_float(dx[off + j]) + (rf * g - c * to_float(x[off + j])));
    }
}

/* The dx pass with one warp per row and 16-byte vectors (dim % 8 == 0, aligned
 * rows); the same expressions, butterfly warp sums. */
template <typename T>
__global__ void rmsnorm_backward_dx_warp_kernel(T *dx, float *r_out, const T *dy, const T *x, const T *w, int n,
                                                int dim, float eps) {
    int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (row >= n) return;
    size_t off = (size_t)row * dim;
    int nvec = dim / VEC;
    float ss = 0.0f, gx = 0.0f;
    for (int q = lane; q < nvec; q += 32) {
        V8<T> a, b, c;
        a.load(x + off + q * VEC), b.load(dy + off + q * VEC), c.load(w + q * VEC);
        float xf[VEC], df[VEC], wf[VEC];
        a.get(xf), b.get(df), c.get(wf);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            ss += xf[k] * xf[k];
            gx += df[k] * wf[k] * xf[k];
        }
    }
    ss = warp_reduce_sum(ss);
    gx = warp_reduce_sum(gx);
    double r = 1.0 / sqrt((double)ss / dim + (double)eps);
    float rf = (float)r, c = (float)(r * r * r * (double)gx / dim);
    if (lane == 0) r_out[row] = rf;
    for (int q = lane; q < nvec; q += 32) {
        V8<T> a, b, cw, o;
        a.load(x + off + q * VEC), b.load(dy + off + q * VEC), cw.load(w + q * VEC), o.load(dx + off + q * VEC);
        float xf[VEC], df[VEC], wf[VEC], of[VEC];
        a.get(xf), b.get(df), cw.get(wf), o.get(of);
#pragma unroll
        for (int k = 0; k < VEC; k++) of[k] = of[k] + (rf * (df[k] * wf[k]) - c * xf[k]);
        o.set(of);
        o.store(dx + off + q * VEC);
    }
}

/* dw[j] += sum over rows of dy * (x * r), in two deterministic stages: blocks
 * over (column range, chunk of DW_ROWS rows) write partial column sums, then one
 * thread per column adds the chunks in order. */
#define DW_ROWS 64
template <typename T>
__global__ void rmsnorm_backward_dw_partial_kernel(float *part, const float *r, const T *dy, const T *x, int n,
                                                   int dim) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= dim) return;
    int i0 = blockIdx.y * DW_ROWS, i1 = min(n, i0 + DW_ROWS);
    float s = 0.0f;
    for (int i = i0; i < i1; i++) {
        size_t e = (size_t)i * dim + j;
        s += to_float(dy[e]) * (to_float(x[e]) * r[i]);
    }
    part[(size_t)blockIdx.y * dim + j] = s;
}

__global__ void column_chunks_add_kernel(float *dst, const float *part, int chunks, int dim) {
    int j = blockIdx.x * blockDim.x + threadIdx.x;
    if (j >= dim) return;
    float s = 0.0f;
    for (int c = 0; c < chunks; c++) s += part[(size_t)c * dim + j];
    dst[j] += s;
}

template <typename T>
void cuda_rmsnorm_backward(const Backend *be, void *dx, void *dw, const void *dy, const void *x, const void *w, int n,
                           int dim, float eps) {
    if (n <= 0 || dim <= 0) return;
    CudaState *cs = cuda_enter(be);
    int chunks = (n + DW_ROWS - 1) / DW_ROWS;
    float *r = (float *)cuda_scratch(cs, ((size_t)n + (size_t)chunks * dim) * sizeof(float));
    float *part = r + n;
    if (dim % VEC == 0 && aligned16(dx) && aligned16(dy) && aligned16(x) && aligned16(w)) {
        const int rows_per_block = CUDA_THREADS / 32;
        rmsnorm_backward_dx_warp_kernel<T><<<(n + rows_per_block - 1) / rows_per_block, CUDA_THREADS, 0,
                                             cs->stream>>>((T *)dx, r, (const T *)dy, (const T *)x, (const T *)w,
                                                              n, dim, eps);
    } else {
        rmsnorm_backward_dx_kernel<T><<<n, ROW_THREADS, 0, cs->stream>>>((T *)dx, r, (const T *)dy,
                                                                            (const T *)x, (const T *)w, dim, eps);
    }
    LAUNCH_CHECK(cs);
    if (!dw) return; /* a frozen norm: no weight gradient */
    unsigned col_blocks = (unsigned)((dim + CUDA_THREADS - 1) / CUDA_THREADS);
    rmsnorm_backward_dw_partial_kernel<T><<<dim3(col_blocks, (unsigned)chunks), CUDA_THREADS, 0, cs->stream>>>(
        part, r, (const T *)dy, (const T *)x, n, dim);
    LAUNCH_CHECK(cs);
    column_chunks_add_kernel<<<col_blocks, CUDA_THREADS, 0, cs->stream>>>((float *)dw, part, chunks, dim);
    LAUNCH_CHECK(cs);
}

/* ---------------------------------------------------------------- rope */

/* One thread per (token, head, pair j): the angle pos * inv_freq[j] in fp32,
 * inv_freq from the host (bit-identical to the CPU), cosf/sinf on the device
 * (<= 2 ulp). sign = +1 forward, -1 backward (the inverse rotation). */
template <typename T>
__global__ void rope_kernel(T *x, const int *pos, const float *inv_freq, int n, int n_heads, int head_dim,
                            float sign) {
    int half = head_dim / 2;
    size_t total = (size_t)n * n_heads * half;
    GRID_STRIDE(e, total) {
        int j = (int)(e % half);
        size_t ih = e / half; /* token * n_heads + head */
        size_t i = ih / n_heads;
        float angle = (float)pos[i] * inv_freq[j];
        float c = cosf(angle), s = sign * sinf(angle);
        T *v = x + ih * head_dim;
        float a = to_float(v[j]), b = to_float(v[j + half]);
        v[j] = from_float<T>(a * c - b * s);
        v[j + half] = from_float<T>(b * c + a * s);
    }
}

/* The same rotation, one thread per (token, head, group of 8 pairs): 16-byte
 * loads of x[j..j+8) and x[j+half..j+half+8) (half % 8 == 0, aligned x). */
template <typename T>
__global__ void rope_vec_kernel(T *x, const int *pos, const float *inv_freq, int n, int n_heads, int head_dim,
                                float sign) {
    int half = head_dim / 2, groups = half / VEC;
    size_t total = (size_t)n * n_heads * groups;
    GRID_STRIDE(e, total) {
        int j0 = (int)(e % groups) * VEC;
        size_t ih = e / groups; /* token * n_heads + head */
        size_t i = ih / n_heads;
        float p = (float)pos[i];
        T *v = x + ih * head_dim;
        V8<T> va, vb;
        va.load(v + j0);
        vb.load(v + j0 + half);
        float a[VEC], b[VEC];
        va.get(a);
        vb.get(b);
#pragma unroll
        for (int k = 0; k < VEC; k++) {
            float angle = p * inv_freq[j0 + k];
            float c = cosf(angle), s = sign * sinf(angle);
            float ak = a[k], bk = b[k];
            a[k] = ak * c - bk * s;
            b[k] = bk * c + ak * s;
        }
        va.set(a);
        vb.set(b);
        va.store(v + j0);
        vb.store(v + j0 + half);
    }
}

template <typename T>
static void rope_launch(const Backend *be, void *x, const int *pos, int n, int n_heads, int head_dim,
                        const float *inv_freq_host, float sign) {
    if (n <= 0 || n_heads <= 0 || head_dim <= 0) return;
    CudaState *cs = cuda_enter(be);
    CUDA_ASSERT_HOST(head_dim % 2 == 0);
    const float *inv_freq = cuda_rope_inv_freq(cs, head_dim, inv_freq_host);
    const int *host[1] = {pos};
    int *d = cuda_upload_indices(cs, host, 1, n);
    if ((head_dim / 2) % VEC == 0 && aligned16(x)) {
        size_t total = (size_t)n * n_heads * (head_dim / 2 / VEC);
        rope_vec_kernel<T><<<flat_blocks(cs, total), CUDA_THREADS, 0, cs->stream>>>((T *)x, d, inv_freq, n, n_heads,
                                                                                   head_dim, sign);
        LAUNCH_CHECK(cs);
        return;
    }
    size_t total = (size_t)n * n_heads * (head_dim / 2);
    rope_kernel<T><<<cuda_blocks_for(total), CUDA_THREADS, 0, cs->stream>>>((T *)x, d, inv_freq, n, n_heads,
                                                                               head_dim, sign);
    LAUNCH_CHECK(cs);
}

template <typename T>
void cuda_rope(const Backend *be, void *x, const int *pos, int n, int n_heads, int head_dim,
               const float *inv_freq_host) {
    rope_launch<T>(be, x, pos, n, n_heads, head_dim, inv_freq_host, 1.0f);
}

template <typename T>
void cuda_rope_backward(const Backend *be, void *dx, const int *pos, int n, int n_heads, int head_dim,
                        const float *inv_freq_host) {
    rope_launch<T>(be, dx, pos, n, n_heads, head_dim, inv_freq_host, -1.0f);
}

/* ---------------------------------------------------------------- elementwise */

__device__ __forceinline__ float swiglu_f(float g, float u) { return g / (1.0f + expf(-g)) * u; }

template <typename T> __global__ void swiglu_kernel(T *out, const T *gate, const T *up, size_t n, size_t nv) {
    VEC_LOOP_BEGIN(2) {
        V8<T> g[2], u[2];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            size_t q = vl_base + k * vl_stride;
            if (q < nv) g[k].load(gate + q * VEC), u[k].load(up + q * VEC);
        }
#pragma unroll
        for (int k = 0; k < 2; k++) {
            size_t q = vl_base + k * vl_stride;
            if (q < nv) {
                float gf[VEC], uf[VEC];
                g[k].get(gf);
                u[k].get(uf);
#pragma unroll
                for (int j = 0; j < VEC; j++) gf[j] = swiglu_f(gf[j], uf[j]);
                g[k].set(gf);
                g[k].store(out + q * VEC);
            }
        }
    }
    TAIL_LOOP(e) out[e] = from_float<T>(swiglu_f(to_float(gate[e]), to_float(up[e])));
}

/* silu'(g) = s (1 + g (1 - s)), s = sigmoid(g). */
__device__ __forceinline__ void swiglu_bwd_f(float o, float g, float u, float *dg, float *du) {
    float sig = 1.0f / (1.0f + expf(-g));
    *dg = o * u * sig * (1.0f + g * (1.0f - sig));
    *du = o * g * sig;
}

template <typename T>
__global__ void swiglu_backward_kernel(T *dgate, T *dup, const T *dout, const T *gate, const T *up, size_t n,
                                       size_t nv) {
    VEC_LOOP_BEGIN(2) {
        V8<T> o[2], g[2], u[2];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            size_t q = vl_base + k * vl_stride;
            if (q < nv) o[k].load(dout + q * VEC), g[k].load(gate + q * VEC), u[k].load(up + q * VEC);
        }
#pragma unroll
        for (int k = 0; k < 2; k++) {
            size_t q = vl_base + k * vl_stride;
            if (q < nv) {
                float of[VEC], gf[VEC], uf[VEC];
                o[k].get(of);
                g[k].get(gf);
                u[k].get(uf);
#pragma unroll
                for (int j = 0; j < VEC; j++) swiglu_bwd_f(of[j], gf[j], uf[j], &of[j], &uf[j]);
                o[k].set(of);
                u[k].set(uf);
                o[k].store(dgate + q * VEC);
                u[k].store(dup + q * VEC);
            }
        }
    }
    TAIL_LOOP(e) {
        float dg, du;
        swiglu_bwd_f(to_float(dout[e]), to_float(gate[e]), to_float(up[e]), &dg, &du);
        dgate[e] = from_float<T>(dg);
        dup[e] = from_float<T>(du);
    }
}

/* out may alias a: each thread reads a[e], b[e] before writing out[e]. */
template <typename T> __global__ void add_kernel(T *out, const T *a, const T *b, size_t n, size_t nv) {
    VEC_LOOP_BEGIN(2) {
        V8<T> x[2], y[2];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            size_t q = vl_base + k * vl_stride;
            if (q < nv) x[k].load(a + q * VEC), y[k].load(b + q * VEC);
        }
#pragma unroll
        for (int k = 0; k < 2; k++) {
            size_t q = vl_base + k * vl_stride;
            if (q < nv) {
                float xf[VEC], yf[VEC];
                x[k].get(xf);
                y[k].get(yf);
#pragma unroll
                for (int j = 0; j < VEC; j++) xf[j] += yf[j];
                x[k].set(xf);
                x[k].store(out + q * VEC);
            }
        }
    }
    TAIL_LOOP(e) out[e] = from_float<T>(to_float(a[e]) + to_float(b[e]));
}

template <typename T> void cuda_swiglu(const Backend *be, void *out, const void *gate, const void *up, size_t n) {
    if (!n) return;
    CudaState *cs = cuda_enter(be);
    size_t nv = vec_count(n, aligned16(out) && aligned16(gate) && aligned16(up));
    swiglu_kernel<T><<<flat_blocks(cs, nv ? nv : n), CUDA_THREADS, 0, cs->stream>>>((T *)out, (const T *)gate,
                                                                                   (const T *)up, n, nv);
    LAUNCH_CHECK(cs);
}

template <typename T>
void cuda_swiglu_backward(const Backend *be, void *dgate, void *dup, const void *dout, const void *gate,
                          const void *up, size_t n) {
    if (!n) return;
    CudaState *cs = cuda_enter(be);
    size_t nv = vec_count(n, aligned16(dgate) && aligned16(dup) && aligned16(dout) && aligned16(gate) &&
                                 aligned16(up));
    swiglu_backward_kernel<T><<<flat_blocks(cs, nv ? nv : n), CUDA_THREADS, 0, cs->stream>>>(
        (T *)dgate, (T *)dup, (const T *)dout, (const T *)gate, (const T *)up, n, nv);
    LAUNCH_CHECK(cs);
}

template <typename T> void cuda_add(const Backend *be, void *out, const void *a, const void *b, size_t n) {
    if (!n) return;
    CudaState *cs = cuda_enter(be);
    size_t nv = vec_count(n, aligned16(out) && aligned16(a) && aligned16(b));
    add_kernel<T><<<flat_blocks(cs, nv ? nv : n), CUDA_THREADS, 0, cs->stream>>>((T *)out, (const T *)a,
                                                                                (const T *)b, n, nv);
    LAUNCH_CHECK(cs);
}

/* out = s * x elementwise in fp32, rounded once (LoRA's scaling on [N, r] rows: small). */
template <typename T> __global__ void mul_scalar_kernel(T *out, const T *x, float s, size_t n) {
    GRID_STRIDE(i, n) out[i] = from_float<T>(s * to_float(x[i]));
}

template <typename T> void cuda_mul_scalar(const Backend *be, void *out, const void *x, float s, size_t n) {
    if (!n) return;
    CudaState *cs = cuda_enter(be);
    mul_scalar_kernel<T><<<flat_blocks(cs, n), CUDA_THREADS, 0, cs->stream>>>((T *)out, (const T *)x, s, n);
    LAUNCH_CHECK(cs);
}

/* out = a + s * b elementwise, one fmaf in fp32 rounded once (the CPU's fmaf: the same bits on fp32 storage);
 * out may alias a: each thread reads a[i] and b[i] before writing out[i]. Grid-stride over the weights. */
template <typename T> __global__ void add_scaled_kernel(T *out, const T *a, const T *b, float s, size_t n) {
    GRID_STRIDE(i, n) out[i] = from_float<T>(__fmaf_rn(s, to_float(b[i]), to_float(a[i])));
}

template <typename T>
void cuda_add_scaled(const Backend *be, void *out, const void *a, const void *b, float s, size_t n) {
    if (!n) return;
    CudaState *cs = cuda_enter(be);
    add_scaled_kernel<T><<<flat_blocks(cs, n), CUDA_THREADS, 0, cs->stream>>>((T *)out, (const T *)a, (const T *)b,
                                                                              s, n);
    LAUNCH_CHECK(cs);
}

/* ---------------------------------------------------------------- embedding */

/* A negative id (a token outside this rank's part of the vocabulary) gives a
 * zero row, so the ranks' rows sum to the whole table's. */
template <typename T> __global__ void embedding_kernel(T *out, const T *table, const int *ids, int n, int dim) {
    GRID_STRIDE(e, (size_t)n * dim) {
        size_t i = e / dim, j = e % dim;
        int id = ids[i];
        out[e] = id < 0 ? from_float<T>(0.0f) : table[(size_t)id * dim + j];
    }
}

/* Repeated ids add through fp32 atomics (order varies run to run); negative
 * ids are another rank's rows and are skipped. */
template <typename T>
__global__ void embedding_backward_kernel(float *dtable, const T *dout, const int *ids, int n, int dim) {
    GRID_STRIDE(e, (size_t)n * dim) {
        size_t i = e / dim, j = e % dim;
        int id = ids[i];
        if (id >= 0) atomicAdd(dtable + (size_t)id * dim + j, to_float(dout[e]));
    }
}

template <typename T>
void cuda_embedding(const Backend *be, void *out, const void *table, const int *ids, int n, int dim) {
    if (n <= 0 || dim <= 0) return;
    CudaState *cs = cuda_enter(be);
    const int *host[1] = {ids};
    int *d = cuda_upload_indices(cs, host, 1, n);
    embedding_kernel<T><<<cuda_blocks_for((size_t)n * dim), CUDA_THREADS, 0, cs->stream>>>(
        (T *)out, (const T *)table, d, n, dim);
    LAUNCH_CHECK(cs);
}

template <typename T>
void cuda_embedding_backward(const Backend *be, void *dtable, const void *dout, const int *ids, int n, int dim) {
    if (n <= 0 || dim <= 0) return;
    CudaState *cs = cuda_enter(be);
    const int *host[1] = {ids};
    int *d = cuda_upload_indices(cs, host, 1, n);
    embedding_backward_kernel<T><<<cuda_blocks_for((size_t)n * dim), CUDA_THREADS, 0, cs->stream>>>(
        (float *)dtable, (const T *)dout, d, n, dim);
    LAUNCH_CHECK(cs);
}

/* ---------------------------------------------------------------- log-softmax */

/* One pass over a row of z = logits * inv_t: each thread keeps an online
 * (max m, s = sum exp(z - m), t = sum exp(z - m) z) in fp32 over its share
 * (~150-300 entries of a 151936 vocab), rescaling when its max grows; the
 * block then combines the threads' triples at the row max in double. Rows are
 * read as 16-byte vectors: a scalar head up to the first aligned element, the
 * vector body, a scalar tail. */
#define LSM_THREADS 512      /* forward: one block per row */
#define LSM_BWD_THREADS 1024 /* backward: one block per SM walking rows, so the
                                row it re-reads is still in L2 */
#define LSM_UNROLL 4

template <int CNT, bool WITH_T>
__device__ __forceinline__ void online_add(float &m, float &s, float &t, const float *z) {
    float gm = z[0];
#pragma unroll
    for (int k = 1; k < CNT; k++) gm = fmaxf(gm, z[k]);
    if (gm > m) {
        float c = expf(m - gm); /* 0 while m is -inf */
        s *= c;
        if (WITH_T) t *= c;
        m = gm;
    }
    if (m == -INFINITY) return; /* only -inf seen so far: nothing to add */
#pragma unroll
    for (int k = 0; k < CNT; k++) {
        float e = expf(z[k] - m);
        s += e;
        if (WITH_T) t += e * z[k];
    }
}

/* Elements before the first 16-byte aligned one (all of them when !vec). */
template <typename T> __device__ __forceinline__ int row_head(const T *row, int vocab, bool vec) {
    if (!vec) return vocab;
    int h = (int)(((16u - ((unsigned)(uintptr_t)row & 15u)) & 15u) / sizeof(T));
    return h < vocab ? h : vocab;
}

template <typename T, bool WITH_T>
__device__ void row_online_stats(const T *row, int vocab, float inv_t, int head, float &m, float &s, float &t) {
    m = -INFINITY, s = 0.0f, t = 0.0f;
    for (int v = threadIdx.x; v < head; v += blockDim.x) {
        float z = to_float(row[v]) * inv_t;
        online_add<1, WITH_T>(m, s, t, &z);
    }
    const int nvec = (vocab - head) / VEC, bs = blockDim.x;
    const T *body = row + head;
    int q = threadIdx.x;
    for (; q + (LSM_UNROLL - 1) * bs < nvec; q += LSM_UNROLL * bs) {
        V8<T> a[LSM_UNROLL];
#pragma unroll
        for (int k = 0; k < LSM_UNROLL; k++) a[k].load(body + (size_t)(q + k * bs) * VEC);
        float z[LSM_UNROLL * VEC];
#pragma unroll
        for (int k = 0; k < LSM_UNROLL; k++) a[k].get(z + k * VEC);
#pragma unroll
        for (int k = 0; k < LSM_UNROLL * VEC; k++) z[k] *= inv_t;
        online_add<LSM_UNROLL * VEC, WITH_T>(m, s, t, z);
    }
    for (; q < nvec; q += bs) {
        V8<T> a;
        a.load(body + (size_t)q * VEC);
        float z[VEC];
        a.get(z);
#pragma unroll
        for (int k = 0; k < VEC; k++) z[k] *= inv_t;
        online_add<VEC, WITH_T>(m, s, t, z);
    }
    for (int v = head + nvec * VEC + threadIdx.x; v < vocab; v += blockDim.x) {
        float z = to_float(row[v]) * inv_t;
        online_add<1, WITH_T>(m, s, t, &z);
    }
}

/* The threads' (m, s, t) at the row max M, summed in double in a fixed order:
 * S = sum exp(z - M), Tz = sum exp(z - M) z. Every thread gets the results;
 * ends with a barrier. */
__device__ void block_combine(float m, float s, float t, float *M_out, double *S_out, double *T_out) {
    __shared__ double sh_s[32], sh_t[32];
    float M = block_max(m);
    double sc = m == -INFINITY ? 0.0 : exp((double)m - (double)M);
    double ds = (double)s * sc, dt = (double)t * sc;
    ds = warp_reduce_sum(ds);
    dt = warp_reduce_sum(dt);
    if (threadIdx.x % 32 == 0) sh_s[threadIdx.x / 32] = ds, sh_t[threadIdx.x / 32] = dt;
    __syncthreads();
    double rs = 0.0, rt = 0.0;
    for (int w = 0; w < (int)(blockDim.x / 32); w++) rs += sh_s[w], rt += sh_t[w];
    __syncthreads();
    *M_out = M, *S_out = rs, *T_out = rt;
}

template <typename T>
__global__ void __launch_bounds__(LSM_THREADS)
    log_softmax_target_kernel(float *logprobs, float *entropy, const T *logits, const int *targets, int vocab,
                              float inv_t) {
    int i = blockIdx.x, tgt = targets[i];
    if (tgt < 0) {
        if (threadIdx.x == 0) {
            logprobs[i] = 0.0f;
            if (entropy) entropy[i] = 0.0f;
        }
        return;
    }
    const T *row = logits + (size_t)i * vocab;
    int head = row_head(row, vocab, true);
    float m, s, t;
    if (entropy)
        row_online_stats<T, true>(row, vocab, inv_t, head, m, s, t);
    else
        row_online_stats<T, false>(row, vocab, inv_t, head, m, s, t);
    float M;
    double S, Tz;
    block_combine(m, s, t, &M, &S, &Tz);
    if (threadIdx.x == 0) {
        double lse = (double)M + log(S);
        logprobs[i] = (float)((double)(to_float(row[tgt]) * inv_t) - lse);
        if (entropy) entropy[i] = (float)(lse - Tz / S);
    }
}

__device__ __forceinline__ float lsm_grad(float z, float lse_f, float g, bool is_tgt) {
    float d = -g * expf(z - lse_f);
    if (is_tgt) d += g;
    return d;
}

/* dlogits = dlogprobs * (onehot - softmax(z)) / T. Blocks walk rows i, i +
 * gridDim.x, ...; per row the stats pass reads it front to back, then the
 * gradient pass back to front (the most recently read part first, from L2).
 * In place is safe: the stats end with a barrier, then each thread rewrites
 * only what it reads. vec: dlogits and logits share 16-byte alignment. */
template <typename T>
__global__ void __launch_bounds__(LSM_BWD_THREADS)
    log_softmax_target_backward_kernel(T *dlogits, const T *logits, const int *targets, const float *dlogprobs,
                                       int n, int vocab, float inv_t, int vec) {
    const int bs = blockDim.x;
    for (int i = blockIdx.x; i < n; i += gridDim.x) {
        int tgt = targets[i];
        T *drow = dlogits + (size_t)i * vocab;
        const T *row = logits + (size_t)i * vocab;
        int head = row_head(row, vocab, vec != 0);
        int nvec = (vocab - head) / VEC, tail0 = head + nvec * VEC;
        if (tgt < 0) { /* uniform over the block */
            float zero[VEC] = {0, 0, 0, 0, 0, 0, 0, 0};
            V8<T> zv;
            zv.set(zero);
            for (int v = threadIdx.x; v < head; v += bs) drow[v] = from_float<T>(0.0f);
            for (int q = threadIdx.x; q < nvec; q += bs) zv.store(drow + head + (size_t)q * VEC);
            for (int v = tail0 + threadIdx.x; v < vocab; v += bs) drow[v] = from_float<T>(0.0f);
            continue;
        }
        float m, s, t;
        row_online_stats<T, false>(row, vocab, inv_t, head, m, s, t);
        float M;
        double S, Tz;
        block_combine(m, s, t, &M, &S, &Tz);
        float g = dlogprobs[i] * inv_t, lse_f = (float)((double)M + log(S));
        for (int v = tail0 + threadIdx.x; v < vocab; v += bs)
            drow[v] = from_float<T>(lsm_grad(to_float(row[v]) * inv_t, lse_f, g, v == tgt));
        const T *body = row + head;
        T *dbody = drow + head;
        int tq = tgt - head; /* target's index in the body */
        int q = nvec - 1 - threadIdx.x;
        for (; q - (LSM_UNROLL - 1) * bs >= 0; q -= LSM_UNROLL * bs) {
            V8<T> a[LSM_UNROLL];
#pragma unroll
            for (int k = 0; k < LSM_UNROLL; k++) a[k].load(body + (size_t)(q - k * bs) * VEC);
#pragma unroll
            for (int k = 0; k < LSM_UNROLL; k++) {
                float z[VEC];
                a[k].get(z);
                int base = (q - k * bs) * VEC;
#pragma unroll
                for (int j = 0; j < VEC; j++) z[j] = lsm_grad(z[j] * inv_t, lse_f, g, base + j == tq);
                a[k].set(z);
                a[k].store(dbody + (size_t)base);
            }
        }
        for (; q >= 0; q -= bs) {
            V8<T> a;
            a.load(body + (size_t)q * VEC);
            float z[VEC];
            a.get(z);
#pragma unroll
            for (int j = 0; j < VEC; j++) z[j] = lsm_grad(z[j] * inv_t, lse_f, g, q * VEC + j == tq);
            a.set(z);
            a.store(dbody + (size_t)q * VEC);
        }
        for (int v = threadIdx.x; v < head; v += bs)
            drow[v] = from_float<T>(lsm_grad(to_float(row[v]) * inv_t, lse_f, g, v == tgt));
    }
}

template <typename T>
void cuda_log_softmax_target(const Backend *be, void *logprobs, void *entropy, const void *logits, const int *targets,
                             int n, int vocab, float temperature) {
    if (n <= 0) return;
    CudaState *cs = cuda_enter(be);
    const int *host[1] = {targets};
    int *d = cuda_upload_indices(cs, host, 1, n);
    float inv_t = (float)(1.0 / (double)temperature);
    log_softmax_target_kernel<T><<<n, LSM_THREADS, 0, cs->stream>>>((float *)logprobs, (float *)entropy,
                                                                       (const T *)logits, d, vocab, inv_t);
    LAUNCH_CHECK(cs);
}

template <typename T>
void cuda_log_softmax_target_backward(const Backend *be, void *dlogits, const void *logits, const int *targets,
                                      const void *dlogprobs, int n, int vocab, float temperature) {
    if (n <= 0) return;
    CudaState *cs = cuda_enter(be);
    const int *host[1] = {targets};
    int *d = cuda_upload_indices(cs, host, 1, n);
    float inv_t = (float)(1.0 / (double)temperature);
    int vec = (((uintptr_t)dlogits - (uintptr_t)logits) & 15u) == 0;
    int blocks = n < cs->sm_count ? n : cs->sm_count;
    log_softmax_target_backward_kernel<T><<<blocks, LSM_BWD_THREADS, 0, cs->stream>>>(
        (T *)dlogits, (const T *)logits, d, (const float *)dlogprobs, n, vocab, inv_t, vec);
    LAUNCH_CHECK(cs);
}

/* log_softmax_entropy_backward: the log-prob's gradient plus the entropy's, d H / d z_v = -p_v (z_v - sum_u
 * p_u z_u), for TRL's entropy bonus (off by default, so a plain kernel: one block per row, the stats pass
 * with the sum of p z, then the gradient pass front to back, scalar loads). In place is safe: the stats
 * end with a barrier, then each thread rewrites only what it reads. Tolerance as the backward above (the
 * stats in double, each element in fp32). */
template <typename T>
__global__ void __launch_bounds__(LSM_THREADS)
    log_softmax_entropy_backward_kernel(T *dlogits, const T *logits, const int *targets, const float *dlogprobs,
                                        const float *dentropy, int vocab, float inv_t) {
    const int i = blockIdx.x, bs = blockDim.x, tgt = targets[i];
    T *drow = dlogits + (size_t)i * vocab;
    const T *row = logits + (size_t)i * vocab;
    if (tgt < 0) {
        for (int v = threadIdx.x; v < vocab; v += bs) drow[v] = from_float<T>(0.0f);
        return;
    }
    float m, s, t;
    row_online_stats<T, true>(row, vocab, inv_t, row_head(row, vocab, true), m, s, t);
    float M;
    double S, Tz;
    block_combine(m, s, t, &M, &S, &Tz);
    float lse_f = (float)((double)M + log(S)), pz = (float)(Tz / S);
    float g = dlogprobs[i] * inv_t, gh = dentropy[i] * inv_t;
    for (int v = threadIdx.x; v < vocab; v += bs) {
        float z = to_float(row[v]) * inv_t, p = expf(z - lse_f);
        float d = -g * p - gh * p * (z - pz);
        if (v == tgt) d += g;
        drow[v] = from_float<T>(d);
    }
}

template <typename T>
void cuda_log_softmax_entropy_backward(const Backend *be, void *dlogits, const void *logits, const int *targets,
                                       const void *dlogprobs, const void *dentropy, int n, int vocab,
                                       float temperature) {
    if (n <= 0 || vocab <= 0) return;
    CudaState *cs = cuda_enter(be);
    const int *host[1] = {targets};
    int *d = cuda_upload_indices(cs, host, 1, n);
    float inv_t = (float)(1.0 / (double)temperature);
    log_softmax_entropy_backward_kernel<T><<<n, LSM_THREADS, 0, cs->stream>>>(
        (T *)dlogits, (const T *)logits, d, (const float *)dlogprobs, (const float *)dentropy, vocab, inv_t);
    LAUNCH_CHECK(cs);
}

/* ---------------------------------------------------------------- vocabulary-parallel log-softmax */

/* logits_shard_stats: the forward kernel's pass and combine over this rank's
 * columns, written out instead of finished: stats[i] = {M, S, Tz, z[target]}
 * (backend.h), which the ranks combine. Every row gets stats, a row whose
 * target is another rank's included. One block per row. */
template <typename T>
__global__ void __launch_bounds__(LSM_THREADS)
    logits_shard_stats_kernel(float *stats, const T *logits, const int *targets, int vocab, float inv_t) {
    int i = blockIdx.x, tgt = targets[i];
    const T *row = logits + (size_t)i * vocab;
    float m, s, t;
    row_online_stats<T, true>(row, vocab, inv_t, row_head(row, vocab, true), m, s, t);
    float M;
    double S, Tz;
    block_combine(m, s, t, &M, &S, &Tz);
    if (threadIdx.x == 0) {
        float *o = stats + (size_t)4 * i;
        o[0] = M, o[1] = (float)S, o[2] = (float)Tz;
        o[3] = tgt >= 0 ? to_float(row[tgt]) * inv_t : 0.0f;
    }
}

/* log_softmax_shard_backward: the backward kernel's gradient pass with the
 * whole row's lse given, so no statistics pass and no re-read to keep in L2:
 * one block per row, front to back. The onehot term only where the target is
 * in this part (tgt < 0 never matches an index). In place is safe: each thread
 * rewrites only what it reads. vec: dlogits and logits share 16-byte alignment. */
template <typename T>
__global__ void __launch_bounds__(LSM_THREADS)
    log_softmax_shard_backward_kernel(T *dlogits, const T *logits, const int *targets, const float *dlogprobs,
                                      const float *lse, int vocab, float inv_t, int vec) {
    const int i = blockIdx.x, bs = blockDim.x, tgt = targets[i];
    T *drow = dlogits + (size_t)i * vocab;
    const T *row = logits + (size_t)i * vocab;
    int head = row_head(row, vocab, vec != 0);
    int nvec = (vocab - head) / VEC, tail0 = head + nvec * VEC;
    float g = dlogprobs[i] * inv_t, lse_f = lse[i];
    for (int v = threadIdx.x; v < head; v += bs)
        drow[v] = from_float<T>(lsm_grad(to_float(row[v]) * inv_t, lse_f, g, v == tgt));
    const T *body = row + head;
    T *dbody = drow + head;
    int tq = tgt - head; /* target's index in the body */
    int q = threadIdx.x;
    for (; q + (LSM_UNROLL - 1) * bs < nvec; q += LSM_UNROLL * bs) {
        V8<T> a[LSM_UNROLL];
#pragma unroll
        for (int k = 0; k < LSM_UNROLL; k++) a[k].load(body + (size_t)(q + k * bs) * VEC);
#pragma unroll
        for (int k = 0; k < LSM_UNROLL; k++) {
            float z[VEC];
            a[k].get(z);
            int base = (q + k * bs) * VEC;
#pragma unroll
            for (int j = 0; j < VEC; j++) z[j] = lsm_grad(z[j] * inv_t, lse_f, g, base + j == tq);
            a[k].set(z);
            a[k].store(dbody + (size_t)base);
        }
    }
    for (; q < nvec; q += bs) {
        V8<T> a;
        a.load(body + (size_t)q * VEC);
        float z[VEC];
        a.get(z);
#pragma unroll
        for (int j = 0; j < VEC; j++) z[j] = lsm_grad(z[j] * inv_t, lse_f, g, q * VEC + j == tq);
        a.set(z);
        a.store(dbody + (size_t)q * VEC);
    }
    for (int v = tail0 + threadIdx.x; v < vocab; v += bs)
        drow[v] = from_float<T>(lsm_grad(to_float(row[v]) * inv_t, lse_f, g, v == tgt));
}

template <typename T>
void cuda_logits_shard_stats(const Backend *be, void *stats, const void *logits, const int *targets, int n, int vocab,
                             float temperature) {
    if (n <= 0) return;
    CudaState *cs = cuda_enter(be);
    const int *host[1] = {targets};
    int *d = cuda_upload_indices(cs, host, 1, n);
    float inv_t = (float)(1.0 / (double)temperature);
    logits_shard_stats_kernel<T><<<n, LSM_THREADS, 0, cs->stream>>>((float *)stats, (const T *)logits, d, vocab,
                                                                       inv_t);
    LAUNCH_CHECK(cs);
}

template <typename T>
void cuda_log_softmax_shard_backward(const Backend *be, void *dlogits, const void *logits, const int *targets,
                                     const void *dlogprobs, const void *lse, int n, int vocab, float temperature) {
    if (n <= 0 || vocab <= 0) return;
    CudaState *cs = cuda_enter(be);
    const int *host[1] = {targets};
    int *d = cuda_upload_indices(cs, host, 1, n);
    float inv_t = (float)(1.0 / (double)temperature);
    int vec = (((uintptr_t)dlogits - (uintptr_t)logits) & 15u) == 0;
    log_softmax_shard_backward_kernel<T><<<n, LSM_THREADS, 0, cs->stream>>>(
        (T *)dlogits, (const T *)logits, d, (const float *)dlogprobs, (const float *)lse, vocab, inv_t, vec);
    LAUNCH_CHECK(cs);
}

/* log_softmax_shard_entropy_backward: the entropy kernel's gradient pass on a part of the vocabulary, the
 * whole row's lse and sum p z given (no stats pass): one block per row, scalar, front to back; the onehot
 * term only where the target is in this part. In place is safe: each thread rewrites only what it reads. */
template <typename T>
__global__ void __launch_bounds__(LSM_THREADS)
    log_softmax_shard_entropy_backward_kernel(T *dlogits, const T *logits, const int *targets, const float *dlogprobs,
                                              const float *dentropy, const float *lse, const float *pz, int vocab,
                                              float inv_t) {
    const int i = blockIdx.x, tgt = targets[i];
    T *drow = dlogits + (size_t)i * vocab;
    const T *row = logits + (size_t)i * vocab;
    float g = dlogprobs[i] * inv_t, gh = dentropy[i] * inv_t, lse_f = lse[i], pz_f = pz[i];
    for (int v = threadIdx.x; v < vocab; v += blockDim.x) {
        float z = to_float(row[v]) * inv_t, p = expf(z - lse_f);
        float d = -g * p - gh * p * (z - pz_f);
        if (v == tgt) d += g;
        drow[v] = from_float<T>(d);
    }
}

template <typename T>
void cuda_log_softmax_shard_entropy_backward(const Backend *be, void *dlogits, const void *logits, const int *targets,
                                             const void *dlogprobs, const void *dentropy, const void *lse,
                                             const void *pz, int n, int vocab, float temperature) {
    if (n <= 0 || vocab <= 0) return;
    CudaState *cs = cuda_enter(be);
    const int *host[1] = {targets};
    int *d = cuda_upload_indices(cs, host, 1, n);
    float inv_t = (float)(1.0 / (double)temperature);
    log_softmax_shard_entropy_backward_kernel<T><<<n, LSM_THREADS, 0, cs->stream>>>(
        (T *)dlogits, (const T *)logits, d, (const float *)dlogprobs, (const float *)dentropy, (const float *)lse,
        (const float *)pz, vocab, inv_t);
    LAUNCH_CHECK(cs);
}

/* ---------------------------------------------------------------- optimizer */

/* The CPU's adamw line by line, with explicitly rounded fp32 operations (no
 * FMA contraction) so fp32 storage reproduces it to the last bit where
 * sqrtf/division agree (both IEEE here). One element; the vector body and the
 * scalar tail both call it. */
__device__ __forceinline__ void adamw_one(float gi, float &p, float &mi, float &vi, float decay, float w1, float w2,
                                          float beta2, float step_size, float bc2_sqrt, float eps) {
    p = __fmul_rn(p, decay);
    mi = w1 < 0.5f ? __fadd_rn(mi, __fmul_rn(w1, __fsub_rn(gi, mi)))
                   : __fsub_rn(gi, __fmul_rn(__fsub_rn(gi, mi), __fsub_rn(1.0f, w1)));
    vi = __fadd_rn(__fmul_rn(vi, beta2), __fmul_rn(w2, __fmul_rn(gi, gi)));
    float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), bc2_sqrt), eps);
    p = __fadd_rn(p, __fmul_rn(-step_size, __fdiv_rn(mi, denom)));
}

template <typename T>
__global__ void adamw_kernel(T *param, float *master, const float *grad, float *m, float *v, size_t n, size_t nv,
                             float decay, float w1, float w2, float beta2, float step_size, float bc2_sqrt,
                             float eps) {
    VEC_LOOP_BEGIN(1) {
        size_t o = vl_base * VEC;
        V8<float> gv, mv, vv, pm;
        V8<T> pv;
        gv.load(grad + o), mv.load(m + o), vv.load(v + o);
        if (master)
            pm.load(master + o);
        else
            pv.load(param + o);
        float gf[VEC], mf[VEC], vf[VEC], pf[VEC];
        gv.get(gf), mv.get(mf), vv.get(vf);
        if (master)
            pm.get(pf);
        else
            pv.get(pf);
#pragma unroll
        for (int k = 0; k < VEC; k++) adamw_one(gf[k], pf[k], mf[k], vf[k], decay, w1, w2, beta2, step_size, bc2_sqrt, eps);
        mv.set(mf), vv.set(vf), pv.set(pf);
        mv.store(m + o), vv.store(v + o), pv.store(param + o);
        if (master) pm.set(pf), pm.store(master + o);
    }
    TAIL_LOOP(e) {
        float p = master ? master[e] : to_float(param[e]), mi = m[e], vi = v[e];
        adamw_one(grad[e], p, mi, vi, decay, w1, w2, beta2, step_size, bc2_sqrt, eps);
        m[e] = mi;
        v[e] = vi;
        if (master) master[e] = p;
        param[e] = from_float<T>(p);
    }
}

template <typename T>
void cuda_adamw(const Backend *be, void *param, void *master, const void *grad, void *m, void *v, size_t n, float lr,
                float beta1, float beta2, float eps, float weight_decay, float bias_correction1,
                float bias_correction2) {
    /* Without a master copy the update must run on fp32 storage. */
    CUDA_ASSERT_HOST(master != NULL || sizeof(T) == sizeof(float));
    if (!n) return;
    CudaState *cs = cuda_enter(be);
    float decay = (float)(1.0 - (double)lr * weight_decay);
    float w1 = (float)(1.0 - float_as_decimal(beta1)), w2 = (float)(1.0 - float_as_decimal(beta2));
    float step_size = (float)((double)lr / bias_correction1);
    float bc2_sqrt = (float)sqrt((double)bias_correction2);
    size_t nv = vec_count(n, aligned16(param) && (!master || aligned16(master)) && aligned16(grad) && aligned16(m) &&
                                 aligned16(v));
    adamw_kernel<T><<<flat_blocks(cs, nv ? nv : n), CUDA_THREADS, 0, cs->stream>>>(
        (T *)param, (float *)master, (const float *)grad, (float *)m, (float *)v, n, nv, decay, w1, w2, beta2,
        step_size, bc2_sqrt, eps);
    LAUNCH_CHECK(cs);
}

/* ---------------------------------------------------------------- reductions over [f32] */

#define SUMSQ_BLOCKS 1024
#define SUMSQ_UNROLL 4

/* A grid fixed by n (at most SUMSQ_BLOCKS blocks): each thread sums a fixed
 * subset in double (float4 loads, SUMSQ_UNROLL in flight), each block writes
 * its partial; the last block to finish (atomic ticket) adds the partials in
 * block order and writes the total to *result. Deterministic. The ticket is
 * reset by that last block for the next call. */
__global__ void sum_squares_kernel(double *partial, unsigned *ticket, double *result, const float *x, size_t n,
                                   size_t n4) {
    const size_t stride = (size_t)gridDim.x * blockDim.x, tid = blockIdx.x * (size_t)blockDim.x + threadIdx.x;
    double s = 0.0;
    const float4 *x4 = reinterpret_cast<const float4 *>(x);
    for (size_t b = tid; b < n4; b += SUMSQ_UNROLL * stride) {
        float4 a[SUMSQ_UNROLL];
#pragma unroll
        for (int k = 0; k < SUMSQ_UNROLL; k++)
            if (b + k * stride < n4) a[k] = x4[b + k * stride];
#pragma unroll
        for (int k = 0; k < SUMSQ_UNROLL; k++)
            if (b + k * stride < n4) {
                s += (double)a[k].x * a[k].x;
                s += (double)a[k].y * a[k].y;
                s += (double)a[k].z * a[k].z;
                s += (double)a[k].w * a[k].w;
            }
    }
    for (size_t e = n4 * 4 + tid; e < n; e += stride) s += (double)x[e] * x[e];
    s = block_sum(s);
    __shared__ bool last;
    if (threadIdx.x == 0) {
        partial[blockIdx.x] = s;
        __threadfence();
        last = atomicAdd(ticket, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    double r = 0.0;
    for (unsigned b = threadIdx.x; b < gridDim.x; b += blockDim.x) r += ((volatile double *)partial)[b];
    r = block_sum(r);
    if (threadIdx.x == 0) {
        *result = r;
        *ticket = 0;
    }
}

/* The instance's state of sum_squares, made at open: partials and the ticket
 * on the device (sumsq_partial: [SUMSQ_BLOCKS] partials, the device result,
 * then the ticket), the result in pinned host memory the kernel writes through
 * its mapping (sumsq_mapped), or, where mapping fails (NULL), copied into it
 * from sumsq_dev_result. */
cudaError_t cuda_sum_squares_reserve(CudaState *cs, size_t *reserved) {
    const size_t bytes = (SUMSQ_BLOCKS + 1) * sizeof(double) + 16;
    char *buf;
    cudaError_t e = cudaMalloc((void **)&buf, bytes);
    if (e != cudaSuccess) return e;
    cs->sumsq_partial = (double *)buf;
    *reserved += bytes;
    if ((e = cudaMemset(buf, 0, bytes)) != cudaSuccess) return e;
    cs->sumsq_dev_result = (double *)buf + SUMSQ_BLOCKS;
    cs->sumsq_ticket = (unsigned *)((double *)buf + SUMSQ_BLOCKS + 1);
    if ((e = cudaHostAlloc((void **)&cs->sumsq_host, sizeof(double), cudaHostAllocMapped)) != cudaSuccess) {
        cs->sumsq_host = NULL;
        return e;
    }
    void *dp = NULL;
    if (cudaHostGetDevicePointer(&dp, cs->sumsq_host, 0) == cudaSuccess && dp)
        cs->sumsq_mapped = (double *)dp;
    else
        (void)cudaGetLastError(), cs->sumsq_mapped = NULL;
    return cudaSuccess;
}

void cuda_sum_squares_release(CudaState *cs) {
    if (cs->sumsq_partial) CUDA_CHECK(cudaFree(cs->sumsq_partial));
    if (cs->sumsq_host) CUDA_CHECK(cudaFreeHost(cs->sumsq_host));
    cs->sumsq_partial = cs->sumsq_dev_result = cs->sumsq_host = cs->sumsq_mapped = NULL;
    cs->sumsq_ticket = NULL;
}

double cuda_sum_squares(const Backend *be, const void *x, size_t n) {
    if (!n) return 0.0;
    CudaState *cs = cuda_enter(be);
    size_t n4 = aligned16(x) ? n / 4 : 0;
    size_t per_block = (size_t)CUDA_THREADS * 4 * SUMSQ_UNROLL; /* floats per block per grid pass */
    size_t b = (n + per_block - 1) / per_block;
    unsigned blocks = (unsigned)(b < 1 ? 1 : b > SUMSQ_BLOCKS ? SUMSQ_BLOCKS : b);
    double *result = cs->sumsq_mapped ? cs->sumsq_mapped : cs->sumsq_dev_result;
    sum_squares_kernel<<<blocks, CUDA_THREADS, 0, cs->stream>>>(cs->sumsq_partial, cs->sumsq_ticket, result,
                                                                (const float *)x, n, n4);
    LAUNCH_CHECK(cs);
    if (!cs->sumsq_mapped)
        CUDA_CHECK(cudaMemcpyAsync(cs->sumsq_host, cs->sumsq_dev_result, sizeof(double), cudaMemcpyDeviceToHost,
                                   cs->stream));
    CUDA_CHECK(cudaStreamSynchronize(cs->stream));
    return *(volatile double *)cs->sumsq_host;
}

__global__ void scale_kernel(float *x, float s, size_t n, size_t nv) {
    VEC_LOOP_BEGIN(2) {
        V8<float> a[2];
#pragma unroll
        for (int k = 0; k < 2; k++)
            if (vl_base + k * vl_stride < nv) a[k].load(x + (vl_base + k * vl_stride) * VEC);
#pragma unroll
        for (int k = 0; k < 2; k++)
            if (vl_base + k * vl_stride < nv) {
                float f[VEC];
                a[k].get(f);
#pragma unroll
                for (int j = 0; j < VEC; j++) f[j] *= s;
                a[k].set(f);
                a[k].store(x + (vl_base + k * vl_stride) * VEC);
            }
    }
    TAIL_LOOP(e) x[e] *= s;
}

void cuda_scale(const Backend *be, void *x, float s, size_t n) {
    if (!n) return;
    CudaState *cs = cuda_enter(be);
    size_t nv = vec_count(n, aligned16(x));
    scale_kernel<<<flat_blocks(cs, nv ? nv : n), CUDA_THREADS, 0, cs->stream>>>((float *)x, s, n, nv);
    LAUNCH_CHECK(cs);
}

__global__ void add_f32_kernel(float *y, const float *x, size_t n, size_t nv) {
    VEC_LOOP_BEGIN(1) {
        V8<float> a, b;
        a.load(y + vl_base * VEC);
        b.load(x + vl_base * VEC);
        float f[VEC], g[VEC];
        a.get(f);
        b.get(g);
#pragma unroll
        for (int j = 0; j < VEC; j++) f[j] += g[j];
        a.set(f);
        a.store(y + vl_base * VEC);
    }
    TAIL_LOOP(e) y[e] += x[e];
}

void cuda_add_f32(const Backend *be, void *y, const void *x, size_t n) {
    if (!n) return;
    CudaState *cs = cuda_enter(be);
    size_t nv = vec_count(n, aligned16(y) && aligned16(x));
    add_f32_kernel<<<flat_blocks(cs, nv ? nv : n), CUDA_THREADS, 0, cs->stream>>>((float *)y, (const float *)x, n, nv);
    LAUNCH_CHECK(cs);
}

/* ---------------------------------------------------------------- instantiations */

#define INSTANTIATE(T)                                                                                              \
    template void cuda_convert_from_f32<T>(CudaState *, void *, const float *, size_t);                            \
    template void cuda_convert_to_f32<T>(CudaState *, float *, const void *, size_t);                              \
    template void cuda_rmsnorm<T>(const Backend *, void *, const void *, const void *, int, int, float);           \
    template void cuda_rmsnorm_backward<T>(const Backend *, void *, void *, const void *, const void *, const void *, \
                                           int, int, float);                                                       \
    template void cuda_rope<T>(const Backend *, void *, const int *, int, int, int, const float *);                \
    template void cuda_rope_backward<T>(const Backend *, void *, const int *, int, int, int, const float *);       \
    template void cuda_swiglu<T>(const Backend *, void *, const void *, const void *, size_t);                     \
    template void cuda_swiglu_backward<T>(const Backend *, void *, void *, const void *, const void *, const void *, \
                                          size_t);                                                                 \
    template void cuda_add<T>(const Backend *, void *, const void *, const void *, size_t);                        \
    template void cuda_mul_scalar<T>(const Backend *, void *, const void *, float, size_t);                       \
    template void cuda_add_scaled<T>(const Backend *, void *, const void *, const void *, float, size_t);         \
    template void cuda_embedding<T>(const Backend *, void *, const void *, const int *, int, int);                 \
    template void cuda_embedding_backward<T>(const Backend *, void *, const void *, const int *, int, int);        \
    template void cuda_log_softmax_target<T>(const Backend *, void *, void *, const void *, const int *, int, int,  \
                                             float);                                                               \
    template void cuda_log_softmax_target_backward<T>(const Backend *, void *, const void *, const int *,          \
                                                      const void *, int, int, float);                              \
    template void cuda_log_softmax_entropy_backward<T>(const Backend *, void *, const void *, const int *,         \
                                                       const void *, const void *, int, int, float);               \
    template void cuda_logits_shard_stats<T>(const Backend *, void *, const void *, const int *, int, int, float);  \
    template void cuda_log_softmax_shard_backward<T>(const Backend *, void *, const void *, const int *,           \
                                                     const void *, const void *, int, int, float);                 \
    template void cuda_log_softmax_shard_entropy_backward<T>(const Backend *, void *, const void *, const int *,   \
                                                             const void *, const void *, const void *,             \
                                                             const void *, int, int, float);                       \
    template void cuda_adamw<T>(const Backend *, void *, void *, const void *, void *, void *, size_t, float, float, \
                                float, float, float, float, float);
INSTANTIATE(float)
INSTANTIATE(__nv_bfloat16)
