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
 * Not yet: FlashAttention tiling, GQA sharing of K/V loads across the group. */
#include <math.h>

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
void cuda_kv_store(void *k_cache, void *v_cache, const void *k, const void *v, const int *slot, const int *pos,
                   int n, int kv_dim, int max_len) {
    if (n <= 0 || kv_dim <= 0) return;
    const int *host[2] = {slot, pos};
    int *d = cuda_upload_indices(host, 2, n);
    size_t total = (size_t)n * kv_dim;
    kv_store_kernel<T><<<cuda_blocks_for(total), CUDA_THREADS, 0, cuda_stream()>>>(
        (T *)k_cache, (T *)v_cache, (const T *)k, (const T *)v, d, d + n, n, kv_dim, max_len);
    LAUNCH_CHECK();
}

template <typename T>
void cuda_kv_gather(void *k, void *v, const void *k_cache, const void *v_cache, const int *slot, const int *pos,
                    int n, int kv_dim, int max_len) {
    if (n <= 0 || kv_dim <= 0) return;
    const int *host[2] = {slot, pos};
    int *d = cuda_upload_indices(host, 2, n);
    size_t total = (size_t)n * kv_dim;
    kv_gather_kernel<T><<<cuda_blocks_for(total), CUDA_THREADS, 0, cuda_stream()>>>(
        (T *)k, (T *)v, (const float *)k_cache, (const float *)v_cache, d, d + n, n, kv_dim, max_len);
    LAUNCH_CHECK();
}

/* ---------------------------------------------------------------- forward */

/* grid: n * n_heads blocks; block: ATT_WARPS * 32 threads. DPL = dims per lane. */
template <typename T, int DPL>
__global__ void attention_kernel(T *out, const T *q, const T *k_cache, const T *v_cache, const int *slot,
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
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float o = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++) o += sh_acc[w][d] * wscale[w];
        oi[d] = from_float<T>(o / total);
    }
}

template <typename T>
void cuda_attention(void *out, const void *q, const void *k_cache, const void *v_cache, const int *slot,
                    const int *pos, int n, int n_heads, int n_kv_heads, int head_dim, int max_len) {
    if (n <= 0 || n_heads <= 0) return;
    CUDA_ASSERT_HOST(head_dim > 0 && head_dim <= ATT_MAX_HEAD_DIM && n_kv_heads > 0 && n_heads % n_kv_heads == 0);
    const int *host[2] = {slot, pos};
    int *d = cuda_upload_indices(host, 2, n);
    int group = n_heads / n_kv_heads, kv_dim = n_kv_heads * head_dim;
    float scale = (float)(1.0 / sqrt((double)head_dim));
    dim3 grid((unsigned)((size_t)n * n_heads)), block(ATT_WARPS * 32);
    cudaStream_t st = cuda_stream();
    T *o = (T *)out;
    const T *qs = (const T *)q, *kc = (const T *)k_cache, *vc = (const T *)v_cache;
    if (head_dim <= 32)
        attention_kernel<T, 1><<<grid, block, 0, st>>>(o, qs, kc, vc, d, d + n, n_heads, group, head_dim, max_len, kv_dim, scale);
    else if (head_dim <= 64)
        attention_kernel<T, 2><<<grid, block, 0, st>>>(o, qs, kc, vc, d, d + n, n_heads, group, head_dim, max_len, kv_dim, scale);
    else if (head_dim <= 128)
        attention_kernel<T, 4><<<grid, block, 0, st>>>(o, qs, kc, vc, d, d + n, n_heads, group, head_dim, max_len, kv_dim, scale);
    else
        attention_kernel<T, 8><<<grid, block, 0, st>>>(o, qs, kc, vc, d, d + n, n_heads, group, head_dim, max_len, kv_dim, scale);
    LAUNCH_CHECK();
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
void cuda_attention_backward(void *dq, void *dk_cache, void *dv_cache, const void *dout, const void *q,
                             const void *k_cache, const void *v_cache, const int *slot, const int *pos, int n,
                             int n_heads, int n_kv_heads, int head_dim, int n_slots, int max_len) {
    if (n <= 0 || n_heads <= 0) return;
    CUDA_ASSERT_HOST(head_dim > 0 && head_dim <= ATT_MAX_HEAD_DIM && n_kv_heads > 0 && n_heads % n_kv_heads == 0);
    const int *host[2] = {slot, pos};
    int *d = cuda_upload_indices(host, 2, n);
    int group = n_heads / n_kv_heads, kv_dim = n_kv_heads * head_dim;
    float scale = (float)(1.0 / sqrt((double)head_dim));
    dim3 grid((unsigned)((size_t)n * n_heads)), block(ATT_WARPS * 32);
    cudaStream_t st = cuda_stream();
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
    LAUNCH_CHECK();
}

#define INSTANTIATE(T)                                                                                              \
    template void cuda_kv_store<T>(void *, void *, const void *, const void *, const int *, const int *, int, int, \
                                   int);                                                                            \
    template void cuda_kv_gather<T>(void *, void *, const void *, const void *, const int *, const int *, int, int, \
                                    int);                                                                           \
    template void cuda_attention<T>(void *, const void *, const void *, const void *, const int *, const int *, int, \
                                    int, int, int, int);                                                            \
    template void cuda_attention_backward<T>(void *, void *, void *, const void *, const void *, const void *,      \
                                             const void *, const int *, const int *, int, int, int, int, int, int);
INSTANTIATE(float)
INSTANTIATE(__nv_bfloat16)
