/* cuda_paged.cu — the generation engine's [i32] buffers and its paged KV cache
 * ops (backend.h, "generation engine"): alloc/upload/download_i32,
 * embedding_i32, vocab_shard_ids_i32, rope_i32, gather_rows_i32,
 * paged_kv_store, paged_attention.
 *
 * Every index (ids, positions, rows, slots, block tables) is read on the device
 * from [i32] buffers, and every launch configuration depends on host arguments
 * only (n, heads, dims, block size), never on their contents: a decode step
 * made of these ops can be captured once as a CUDA graph and replayed with new
 * buffer contents. The compute ops neither synchronise nor allocate per call,
 * with two one-time exceptions the engine must run once before it captures:
 *   - rope_i32 reads the instance's inv_freq table, uploaded from the host when
 *     the host table given changes (cuda_rope_inv_freq), and a captured graph
 *     keeps reading that one table: no rope with another table may run between
 *     capture and replay.
 *   - paged_attention with forced splits (the instance's option paged_splits)
 *     beyond the bound reserved at open regrows its split scratch (see "paged
 *     attention").
 * Storage T is float or bf16; arithmetic is fp32; copies are exact.
 *
 * Dimension legend: N tokens in a call, D row width, H query heads, KVH
 * key/value heads, G = H/KVH query heads per KV head, Dh head dim. */
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"



/* ---------------------------------------------------------------- 16-byte chunks */

/* A 16-byte chunk of storage as fp32: 4 floats or 8 bf16 (exact widening). */
template <typename T> __device__ __forceinline__ void chunk_unpack(const uint4 &r, float *f);
template <> __device__ __forceinline__ void chunk_unpack<float>(const uint4 &r, float *f) {
    f[0] = __uint_as_float(r.x), f[1] = __uint_as_float(r.y), f[2] = __uint_as_float(r.z), f[3] = __uint_as_float(r.w);
}
template <> __device__ __forceinline__ void chunk_unpack<__nv_bfloat16>(const uint4 &r, float *f) {
    f[0] = __uint_as_float(r.x << 16), f[1] = __uint_as_float(r.x & 0xffff0000u);
    f[2] = __uint_as_float(r.y << 16), f[3] = __uint_as_float(r.y & 0xffff0000u);
    f[4] = __uint_as_float(r.z << 16), f[5] = __uint_as_float(r.z & 0xffff0000u);
    f[6] = __uint_as_float(r.w << 16), f[7] = __uint_as_float(r.w & 0xffff0000u);
}

template <typename T> __device__ __forceinline__ uint4 chunk_pack(const float *f);
template <> __device__ __forceinline__ uint4 chunk_pack<float>(const float *f) {
    return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]), __float_as_uint(f[3]));
}
__device__ __forceinline__ unsigned bf16_pair(float lo, float hi) {
    return (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           ((unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16);
}
template <> __device__ __forceinline__ uint4 chunk_pack<__nv_bfloat16>(const float *f) {
    return make_uint4(bf16_pair(f[0], f[1]), bf16_pair(f[2], f[3]), bf16_pair(f[4], f[5]), bf16_pair(f[6], f[7]));
}

/* 8 consecutive elements (16-byte aligned) as fp32, and back: one or two chunks. */
template <typename T> __device__ __forceinline__ void load8(const T *p, float f[8]) {
    constexpr int PER = 16 / (int)sizeof(T);
#pragma unroll
    for (int c = 0; c < 8 / PER; c++) chunk_unpack<T>(reinterpret_cast<const uint4 *>(p)[c], f + c * PER);
}
template <typename T> __device__ __forceinline__ void store8(T *p, const float f[8]) {
    constexpr int PER = 16 / (int)sizeof(T);
#pragma unroll
    for (int c = 0; c < 8 / PER; c++) reinterpret_cast<uint4 *>(p)[c] = chunk_pack<T>(f + c * PER);
}

/* ---------------------------------------------------------------- [i32] buffers */

void *cuda_alloc_i32(const Backend *be, size_t n) {
    CudaState *cs = cuda_enter_checked(be);
    void *p = NULL;
    size_t bytes = (n ? n : 1) * sizeof(int);
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        fprintf(stderr, "%s:%d: cudaMalloc of %zu bytes failed: %s\n", __FILE__, __LINE__, bytes, cudaGetErrorString(e));
        abort();
    }
    /* zeroed like the CPU backend's; on the backend stream, so ordered before any op reading it */
    CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, cs->stream));
    return p;
}

/* Stream ordered: ops issued after it see the new contents. From pageable
 * memory the driver stages src before returning; from pinned memory the copy is
 * truly asynchronous, so src must not change until the stream has run it. */
void cuda_upload_i32(const Backend *be, void *dst, const int *src, size_t n) {
    if (!n) return;
    CudaState *cs = cuda_enter(be);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(int), cudaMemcpyHostToDevice, cs->stream));
}

/* Waits for every op issued before it, then for the copy. */
void cuda_download_i32(const Backend *be, int *dst, const void *src, size_t n) {
    CudaState *cs = cuda_enter(be);
    if (n) CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(int), cudaMemcpyDeviceToHost, cs->stream));
    CUDA_CHECK(cudaStreamSynchronize(cs->stream));
}

/* ---------------------------------------------------------------- row copies */

/* Gather: dst row i = src row index[i]. Scatter: dst row index[i] = src row i
 * (and dst2/src2 likewise when given: K and V in one launch). Rows whose index
 * is negative are skipped (padding; a negative slot), or, with ZERO_NEGATIVE
 * (embedding_i32: another rank's token), gathered as zeros; the flag is a
 * template argument so the KV store's path is unchanged. C is a 16-byte chunk
 * when rows and pointers allow it, else T; one thread per C, grid-stride. */
template <typename C> __device__ __forceinline__ C zero_bits() { /* 0.0 in fp32 and bf16 */
    C z;
    memset(&z, 0, sizeof z);
    return z;
}

template <typename C, bool SCATTER, bool ZERO_NEGATIVE>
__global__ void copy_rows_kernel(C *dst, const C *src, C *dst2, const C *src2, const int *index, int n,
                                 int row_elems) {
    static_assert(!(SCATTER && ZERO_NEGATIVE), "zero rows only when gathering");
    size_t total = (size_t)n * row_elems;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        size_t i = e / row_elems, c = e % row_elems;
        int r = index[i];
        if (r < 0) {
            if (ZERO_NEGATIVE) {
                dst[e] = zero_bits<C>();
                if (dst2) dst2[e] = zero_bits<C>();
            }
            continue;
        }
        size_t from = SCATTER ? e : (size_t)r * row_elems + c, to = SCATTER ? (size_t)r * row_elems + c : e;
        dst[to] = src[from];
        if (dst2) dst2[to] = src2[from];
    }
}

template <typename T, bool SCATTER, bool ZERO_NEGATIVE = false>
static void copy_rows(const Backend *be, void *dst, const void *src, void *dst2, const void *src2, const void *index,
                      int n, int dim) {
    if (n <= 0 || dim <= 0) return;
    CudaState *cs = cuda_enter(be);
    bool chunks = ((size_t)dim * sizeof(T)) % 16 == 0 && aligned16(dst) && aligned16(src) &&
                  (!dst2 || (aligned16(dst2) && aligned16(src2)));
    const int *idx = (const int *)index;
    if (chunks) {
        int row_chunks = (int)((size_t)dim * sizeof(T) / 16);
        copy_rows_kernel<uint4, SCATTER, ZERO_NEGATIVE>
            <<<cuda_blocks_for((size_t)n * row_chunks), CUDA_THREADS, 0, cs->stream>>>(
                (uint4 *)dst, (const uint4 *)src, (uint4 *)dst2, (const uint4 *)src2, idx, n, row_chunks);
    } else {
        copy_rows_kernel<T, SCATTER, ZERO_NEGATIVE><<<cuda_blocks_for((size_t)n * dim), CUDA_THREADS, 0, cs->stream>>>(
            (T *)dst, (const T *)src, (T *)dst2, (const T *)src2, idx, n, dim);
    }
    LAUNCH_CHECK(cs);
}

template <typename T>
void cuda_embedding_i32(const Backend *be, void *out, const void *table, const void *ids, int n, int dim) {
    copy_rows<T, false, true>(be, out, table, NULL, NULL, ids, n, dim);
}

template <typename T>
void cuda_gather_rows_i32(const Backend *be, void *dst, const void *src, const void *rows, int n, int dim) {
    copy_rows<T, false>(be, dst, src, NULL, NULL, rows, n, dim);
}

template <typename T>
void cuda_paged_kv_store(const Backend *be, void *k_pool, void *v_pool, const void *k, const void *v,
                         const void *slot_mapping, int n, int kv_dim) {
    copy_rows<T, true>(be, k_pool, k, v_pool, v, slot_mapping, n, kv_dim);
}

/* out[i] = ids[i] - lo inside [lo, hi), else -1 (backend.h vocab_shard_ids_i32);
 * out may be ids. The grid depends on n only: capturable in a decode graph. */
__global__ void vocab_shard_ids_kernel(int *out, const int *ids, int n, int lo, int hi) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
        int id = ids[i];
        out[i] = id >= lo && id < hi ? id - lo : -1;
    }
}

void cuda_vocab_shard_ids_i32(const Backend *be, void *out, const void *ids, int n, int lo, int hi) {
    if (n <= 0) return;
    CudaState *cs = cuda_enter(be);
    vocab_shard_ids_kernel<<<cuda_blocks_for((size_t)n), CUDA_THREADS, 0, cs->stream>>>((int *)out,
                                                                                         (const int *)ids, n, lo, hi);
    LAUNCH_CHECK(cs);
}

/* ---------------------------------------------------------------- rope */

/* cuda_rope's two kernels (cuda_ops.cu) with the positions already on the
 * device: the same inv_freq table, the same fp32 expressions in the same
 * order, the same choice between them, so the results are bit-identical. */
template <typename T>
__global__ void rope_i32_kernel(T *x, const int *pos, const float *inv_freq, int n, int n_heads, int head_dim) {
    int half = head_dim / 2;
    size_t total = (size_t)n * n_heads * half;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        int j = (int)(e % half);
        size_t ih = e / half; /* token * n_heads + head */
        size_t i = ih / n_heads;
        float angle = (float)pos[i] * inv_freq[j];
        float c = cosf(angle), s = sinf(angle);
        T *v = x + ih * head_dim;
        float a = to_float(v[j]), b = to_float(v[j + half]);
        v[j] = from_float<T>(a * c - b * s);
        v[j + half] = from_float<T>(b * c + a * s);
    }
}

/* One thread per (token, head, group of 8 pairs); half % 8 == 0, x aligned. */
template <typename T>
__global__ void rope_i32_vec_kernel(T *x, const int *pos, const float *inv_freq, int n, int n_heads, int head_dim) {
    int half = head_dim / 2, groups = half / 8;
    size_t total = (size_t)n * n_heads * groups;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        int j0 = (int)(e % groups) * 8;
        size_t ih = e / groups; /* token * n_heads + head */
        size_t i = ih / n_heads;
        float p = (float)pos[i];
        T *v = x + ih * head_dim;
        float a[8], b[8];
        load8(v + j0, a);
        load8(v + j0 + half, b);
#pragma unroll
        for (int k = 0; k < 8; k++) {
            float angle = p * inv_freq[j0 + k];
            float c = cosf(angle), s = sinf(angle);
            float ak = a[k], bk = b[k];
            a[k] = ak * c - bk * s;
            b[k] = bk * c + ak * s;
        }
        store8(v + j0, a);
        store8(v + j0 + half, b);
    }
}

template <typename T>
void cuda_rope_i32(const Backend *be, void *x, const void *pos, int n, int n_heads, int head_dim,
                   const float *inv_freq_host) {
    if (n <= 0 || n_heads <= 0 || head_dim <= 0) return;
    CudaState *cs = cuda_enter(be);
    CUDA_ASSERT_HOST(head_dim % 2 == 0);
    const float *inv_freq = cuda_rope_inv_freq(cs, head_dim, inv_freq_host);
    const int *positions = (const int *)pos;
    if ((head_dim / 2) % 8 == 0 && aligned16(x)) {
        size_t total = (size_t)n * n_heads * (head_dim / 16);
        rope_i32_vec_kernel<T><<<cuda_blocks_for(total), CUDA_THREADS, 0, cs->stream>>>((T *)x, positions, inv_freq,
                                                                                           n, n_heads, head_dim);
    } else {
        size_t total = (size_t)n * n_heads * (head_dim / 2);
        rope_i32_kernel<T><<<cuda_blocks_for(total), CUDA_THREADS, 0, cs->stream>>>((T *)x, positions, inv_freq, n,
                                                                                       n_heads, head_dim);
    }
    LAUNCH_CHECK(cs);
}

/* ---------------------------------------------------------------- paged attention */

/* Decode-style attention over the paged pools: each query row on its own
 * (prefill rows too), reading K/V rows through the block table.
 *
 * Grid: one CTA of PA_WARPS warps per (token, KV head, head chunk, split). A
 * CTA serves heads_per_cta query heads of the KV head's group (all G of them
 * when G <= 8; else the largest divisor of G that is <= 8), so each K/V row is
 * read once per group. The keys 0..pos[i] of a token are cut into `splits`
 * block-aligned ranges, computed on the device from pos[i]; the host picks
 * `splits` from n, KVH, the table width and the SM count only
 * (paged_choose_splits): as many as keep the CTAs within PA_TARGET_CTAS_PER_SM
 * per SM (floor(target / (n * KVH))), so 1 split once n * KVH reaches the SM
 * count, and never more than one split per PA_MIN_KEYS_PER_SPLIT keys of the
 * longest context the table can hold. Measured on an H200 (bench_paged with
 * COLT_PAGED_SPLITS=1,2,4,8; docs/gpu_engine.md): with n * KVH >= 128 one split
 * is fastest up to 1,024-key contexts (2-3 splits took up to 2x as long at
 * batch 128-256 of the 0.5B / 1.5B shapes) and within 10% beyond, except at
 * exactly 128 CTAs with 2-4K keys (2 splits 1.2-1.5x faster); below that,
 * splits pay from ~600 keys on (up to 4x at batch 1, 4,096 keys). With one split the CTA writes out; with more, each CTA writes its
 * normalised partial output and log2-sum-exp, and paged_combine_kernel merges
 * the splits of a (token, head).
 *
 * Tensor-core path (bf16 storage, head_dim 64 or 128, G <= 16; paged_attention_tc_kernel below):
 * the group's G query heads are the rows of one m16 tile, so a CTA serves the whole group, and with
 * one split and over PA_TC_GROUP_MIN_TOKENS tokens in the call a CTA takes up to 16 / G consecutive
 * tokens of one sequence (a prefill chunk's) on the same K/V tiles. On an H200 it took decode
 * attention at batch 128 from 15.0 to 8.5 us per layer (0.5B) and 18.2 to 12.1 (1.5B);
 * COLT_PAGED_TC=0 keeps the kernels below. paged_attention_rope (decode steps) hands this path q|k|v before
 * rope: each CTA ropes its group's q into the Q tile and the CTA whose keys end at the token stores the
 * token's k and v before staging any tile, with qkv_rope_store's expressions (bit-identical to the two ops;
 * COLT_FUSED_ROPE_ATTN=0 runs them apart).
 *
 * Fast path (head_dim 64 or 128, 16-byte aligned q and pools): a K/V row is
 * read by TPR = Dh / (16 / sizeof(T)) threads, one 16-byte chunk each (a "row
 * group"; 128 / TPR row groups per CTA). A row group takes keys rg,
 * rg + RG, ... of the range, U at a time: each thread stages its own chunks
 * of the next tiles with cp.async (zero-filled past the range), so loads of
 * PA_KEYS_IN_FLIGHT keys per row group are in flight while it computes, and
 * no barrier is needed before the final merge. q . k is a shuffle reduction
 * over the row group; every row group keeps an online softmax (max, sum,
 * weighted V) per head in fp32 registers, in the log2 domain (q is
 * pre-scaled by log2(e) / sqrt(Dh)). The row groups merge through shared
 * memory at the end. Generic path (any even head_dim <= 256, misaligned
 * buffers): a warp per key, lane l holding dims l, l + 32, ..., one head per
 * CTA; same splits, same merge.
 *
 * Scratch: with splits > 1 the partials live in a buffer of the instance,
 * reserved when it opens at a size that bounds every automatic choice (2 *
 * target CTAs * 16 heads * (256 + 1) floats, ~4.3 MB on an H200), so a graph
 * captured at any time keeps a valid pointer for good. The option paged_splits
 * (COLT_PAGED_SPLITS=k at open) forces k splits (tests); a forced k beyond the
 * bound regrows the buffer with a stream synchronisation, which is not allowed
 * while capturing.
 *
 * Tolerance vs the CPU (double) reference: ~1e-6 relative in fp32 storage;
 * bf16 storage rounds the output once (and, on tensor cores, the probabilities). */
#define PA_WARPS 4
#define PA_THREADS (PA_WARPS * 32)
#define PA_KEYS_IN_FLIGHT 8   /* keys per row group staged ahead of the one being computed */
#define PA_MAX_HEADS_PER_CTA 8
#define PA_TC_MAX_GROUP 16    /* the tensor-core path: a CTA's query heads (the whole group) fill one m16 tile */
#define PA_TC_GROUP_MIN_TOKENS 512 /* above this many tokens in a call, the tensor-core path groups a sequence's tokens */
#define PA_MAX_HEAD_DIM 256
#define PA_MAX_SPLITS 64
#define PA_TARGET_CTAS_PER_SM 1
#define PA_MIN_KEYS_PER_SPLIT 256
#define PA_COMBINE_THREADS 64

struct PagedAttentionParams {
    void *out;            /* T [N, H*Dh], written when splits == 1 */
    float *part_out;      /* [N, H, splits, Dh] partial outputs, each normalised by its own sum */
    float *part_lse;      /* [N, H, splits] their log2-sum-exp; -inf for a split with no keys */
    const void *q, *k_pool, *v_pool;
    const int *block_tables, *seq, *pos;
    int n_heads, n_kv_heads, group, heads_per_cta, head_chunks, head_dim, kv_dim, splits, block_shift,
        max_blocks;
    int n, tc_tokens;     /* the tensor-core path: tokens, and tokens per CTA (16 / group with one split, else 1) */
    float qk_scale;       /* log2(e) / sqrt(Dh): scores come out in the log2 domain */
    /* paged_attention_rope on the tensor-core path: q|k|v rows before rope (q above unused); the CTA ropes
     * its group's q, and the CTA whose keys end at the token stores the token's k and v first. NULL: q is
     * given roped and the pools hold every key. */
    const void *qkv;
    const int *slot_mapping;
    const float *inv_freq;
    int qkv_width;        /* (H + 2 KVH) Dh */
};

/* What one CTA computes: heads head0 .. head0 + heads_per_cta - 1 of token
 * `token` over its keys k_begin .. k_end - 1 (empty for splits past the end). */
struct PagedWork {
    int token, kv_head, head0, split, seq, k_begin, k_end;
};

/* Keys [*k_begin, *k_end) of split `split` of a context of len keys: block-aligned ranges. */
__device__ __forceinline__ void paged_split_range(const PagedAttentionParams &p, int len, int split, int *k_begin,
                                                  int *k_end) {
    int n_blocks = (len + (1 << p.block_shift) - 1) >> p.block_shift;
    int blocks_per_split = (n_blocks + p.splits - 1) / p.splits;
    *k_begin = min(len, (split * blocks_per_split) << p.block_shift);
    *k_end = min(len, ((split + 1) * blocks_per_split) << p.block_shift);
}

__device__ __forceinline__ PagedWork paged_work(const PagedAttentionParams &p) {
    PagedWork w;
    int cta = blockIdx.x;
    w.split = cta % p.splits;
    cta /= p.splits;
    int chunk = cta % p.head_chunks;
    cta /= p.head_chunks;
    w.kv_head = cta % p.n_kv_heads;
    w.token = cta / p.n_kv_heads;
    w.head0 = w.kv_head * p.group + chunk * p.heads_per_cta;
    w.seq = p.seq[w.token];
    paged_split_range(p, p.pos[w.token] + 1, w.split, &w.k_begin, &w.k_end);
    return w;
}

/* Pool row of key position `key` of the sequence whose block-table row is `table`. */
__device__ __forceinline__ size_t paged_row(const int *table, int key, int block_shift) {
    return ((size_t)__ldg(table + (key >> block_shift)) << block_shift) + (size_t)(key & ((1 << block_shift) - 1));
}

/* Shared memory (floats) of paged_finish for n_rg row groups. */
__host__ __device__ constexpr int paged_merge_floats(int n_rg, int heads, int head_dim) {
    return n_rg * heads * head_dim + 3 * n_rg * heads + 2 * heads;
}

/* Merges the row groups' online-softmax states and writes the CTA's result:
 * out (splits == 1) or the split's partial output and log2-sum-exp. Element e
 * of a thread's acc is head dim d0 + e * d_step (ignored past head_dim). The
 * first barrier also retires the caller's staging buffers, which smem reuses. */
template <typename T, int GQ, int E>
__device__ void paged_finish(float *smem, const PagedAttentionParams &p, const PagedWork &w, const float (&m)[GQ],
                             const float (&l)[GQ], const float (&acc)[GQ][E], int rg, int n_rg, bool row_leader,
                             int d0, int d_step) {
    const int head_dim = p.head_dim;
    float *s_acc = smem;                           /* [n_rg, GQ, Dh] */
    float *s_max = s_acc + n_rg * GQ * head_dim;   /* [n_rg, GQ] */
    float *s_sum = s_max + n_rg * GQ;              /* [n_rg, GQ] */
    float *s_weight = s_sum + n_rg * GQ;           /* [n_rg, GQ] */
    float *s_total = s_weight + n_rg * GQ;         /* [GQ] */
    float *s_lse = s_total + GQ;                   /* [GQ] */
    __syncthreads();
#pragma unroll
    for (int h = 0; h < GQ; h++)
#pragma unroll
        for (int e = 0; e < E; e++) {
            int d = d0 + e * d_step;
            if (d < head_dim) s_acc[(rg * GQ + h) * head_dim + d] = acc[h][e];
        }
    if (row_leader)
#pragma unroll
        for (int h = 0; h < GQ; h++) s_max[rg * GQ + h] = m[h], s_sum[rg * GQ + h] = l[h];
    __syncthreads();
    if (threadIdx.x < GQ) {
        int h = threadIdx.x;
        float mx = -INFINITY, total = 0.0f;
        for (int r = 0; r < n_rg; r++) mx = fmaxf(mx, s_max[r * GQ + h]);
        for (int r = 0; r < n_rg; r++) {
            float sum = s_sum[r * GQ + h];
            float weight = sum > 0.0f ? exp2f(s_max[r * GQ + h] - mx) : 0.0f; /* row groups without keys: -inf, 0 */
            s_weight[r * GQ + h] = weight;
            total += sum * weight;
        }
        s_total[h] = total;
        s_lse[h] = total > 0.0f ? mx + log2f(total) : -INFINITY;
    }
    __syncthreads();
    for (int idx = threadIdx.x; idx < GQ * head_dim; idx += blockDim.x) {
        int h = idx / head_dim, d = idx % head_dim;
        float total = s_total[h];
        if (p.splits > 1 && total == 0.0f) continue; /* an empty split: the combine skips it by its lse */
        float o = 0.0f;
        for (int r = 0; r < n_rg; r++) o = fmaf(s_acc[(r * GQ + h) * head_dim + d], s_weight[r * GQ + h], o);
        o = total > 0.0f ? o / total : 0.0f;
        size_t row = (size_t)w.token * p.n_heads + w.head0 + h;
        if (p.splits == 1) ((T *)p.out)[row * head_dim + d] = from_float<T>(o);
        else p.part_out[(row * p.splits + w.split) * head_dim + d] = o;
    }
    if (p.splits > 1 && threadIdx.x < GQ)
        p.part_lse[((size_t)w.token * p.n_heads + w.head0 + threadIdx.x) * p.splits + w.split] = s_lse[threadIdx.x];
}

template <typename T, int HEAD_DIM, int GQ> struct PagedFastShape {
    static constexpr int VEC = 16 / (int)sizeof(T);          /* elements per 16-byte chunk */
    static constexpr int TPR = HEAD_DIM / VEC;               /* threads per K/V row */
    static constexpr int RG = PA_THREADS / TPR;              /* row groups per CTA */
    static constexpr int U = GQ <= 4 ? 4 : 2;                /* keys per row group per tile (registers) */
    static constexpr int STAGES = 1 + PA_KEYS_IN_FLIGHT / U; /* tiles staged: the one computed + in flight */
    static constexpr int TILE = U * RG;                      /* keys per tile */
    static constexpr int STAGE_BYTES = STAGES * U * 2 * PA_THREADS * 16;
    static constexpr int MERGE_BYTES = paged_merge_floats(RG, GQ, HEAD_DIM) * 4;
    static constexpr int SMEM_BYTES = STAGE_BYTES > MERGE_BYTES ? STAGE_BYTES : MERGE_BYTES;
    static_assert(TPR >= 1 && TPR <= 32 && 32 % TPR == 0, "a row group lies within a warp");
    static_assert(SMEM_BYTES <= 48 * 1024, "static shared memory");
};

/* The fast path. Staging slot of (stage, key u, K or V) for thread tid:
 * consecutive threads hold consecutive 16-byte slots, so the warp's reads are
 * conflict-free, and each thread reads only what it staged itself. */
template <typename T, int HEAD_DIM, int GQ>
__global__ void __launch_bounds__(PA_THREADS) paged_attention_kernel(const PagedAttentionParams p) {
    using S = PagedFastShape<T, HEAD_DIM, GQ>;
    constexpr int VEC = S::VEC, TPR = S::TPR, RG = S::RG, U = S::U, STAGES = S::STAGES, TILE = S::TILE;
    __shared__ __align__(16) unsigned char smem[S::SMEM_BYTES];
    uint4 *staging = reinterpret_cast<uint4 *>(smem);

    const PagedWork w = paged_work(p);
    if (w.seq < 0) return; /* padding */
    const int tid = threadIdx.x, rg = tid / TPR, part = tid % TPR;

    float q[GQ][VEC];
    const T *q_row = (const T *)p.q + ((size_t)w.token * p.n_heads + w.head0) * HEAD_DIM + part * VEC;
#pragma unroll
    for (int h = 0; h < GQ; h++) {
        chunk_unpack<T>(*reinterpret_cast<const uint4 *>(q_row + h * HEAD_DIM), q[h]);
#pragma unroll
        for (int e = 0; e < VEC; e++) q[h][e] *= p.qk_scale;
    }
    float m[GQ], l[GQ], acc[GQ][VEC];
#pragma unroll
    for (int h = 0; h < GQ; h++) {
        m[h] = -INFINITY, l[h] = 0.0f;
#pragma unroll
        for (int e = 0; e < VEC; e++) acc[h][e] = 0.0f;
    }

    const int *table = p.block_tables + (size_t)w.seq * p.max_blocks;
    const size_t head_offset = (size_t)w.kv_head * HEAD_DIM + part * VEC;
    const T *k_pool = (const T *)p.k_pool, *v_pool = (const T *)p.v_pool;
    const int n_tiles = (w.k_end - w.k_begin + TILE - 1) / TILE;
    auto slot = [&](int stage, int u, int kind) { return staging + ((stage * U + u) * 2 + kind) * PA_THREADS + tid; };
    auto stage_tile = [&](int tile) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            int key = w.k_begin + tile * TILE + u * RG + rg;
            bool valid = key < w.k_end;
            size_t offset = valid ? paged_row(table, key, p.block_shift) * p.kv_dim + head_offset : 0;
            cp_async16(slot(tile % STAGES, u, 0), k_pool + offset, valid);
            cp_async16(slot(tile % STAGES, u, 1), v_pool + offset, valid);
        }
    };

#pragma unroll
    for (int t = 0; t < STAGES - 1; t++) {
        if (t < n_tiles) stage_tile(t);
        cp_async_commit(); /* one group per tile, empty or not, so the wait count below holds */
    }
    for (int tile = 0; tile < n_tiles; tile++) {
        cp_async_wait<STAGES - 2>(); /* this tile's group has landed */
        __syncwarp();                /* the stage refilled next was read in the previous iteration */
        if (tile + STAGES - 1 < n_tiles) stage_tile(tile + STAGES - 1);
        cp_async_commit();
        const int stage = tile % STAGES, key0 = w.k_begin + tile * TILE + rg;

        float s[GQ][U]; /* scores, then probabilities */
#pragma unroll
        for (int u = 0; u < U; u++) {
            float k[VEC];
            chunk_unpack<T>(*slot(stage, u, 0), k);
#pragma unroll
            for (int h = 0; h < GQ; h++) {
                float dot = 0.0f;
#pragma unroll
                for (int e = 0; e < VEC; e++) dot = fmaf(q[h][e], k[e], dot);
                s[h][u] = dot;
            }
        }
#pragma unroll
        for (int o = TPR / 2; o > 0; o >>= 1)
#pragma unroll
            for (int h = 0; h < GQ; h++)
#pragma unroll
                for (int u = 0; u < U; u++) s[h][u] += __shfl_xor_sync(0xffffffffu, s[h][u], o);
#pragma unroll
        for (int u = 0; u < U; u++)
            if (key0 + u * RG >= w.k_end)
#pragma unroll
                for (int h = 0; h < GQ; h++) s[h][u] = -INFINITY;
#pragma unroll
        for (int h = 0; h < GQ; h++) {
            float mx = m[h];
#pragma unroll
            for (int u = 0; u < U; u++) mx = fmaxf(mx, s[h][u]);
            if (mx > m[h]) { /* rescale what was accumulated under the old max (0 when there was none) */
                float corr = exp2f(m[h] - mx);
                l[h] *= corr;
#pragma unroll
                for (int e = 0; e < VEC; e++) acc[h][e] *= corr;
                m[h] = mx;
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                s[h][u] = s[h][u] == -INFINITY ? 0.0f : exp2f(s[h][u] - m[h]);
                l[h] += s[h][u];
            }
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            float v[VEC];
            chunk_unpack<T>(*slot(stage, u, 1), v);
#pragma unroll
            for (int h = 0; h < GQ; h++)
#pragma unroll
                for (int e = 0; e < VEC; e++) acc[h][e] = fmaf(s[h][u], v[e], acc[h][e]);
        }
    }
    cp_async_wait<0>();
    paged_finish<T, GQ, VEC>(reinterpret_cast<float *>(smem), p, w, m, l, acc, rg, RG, part == 0, part * VEC, 1);
}

/* The tensor-core path (bf16 storage, head_dim 64 or 128, a group of at most 16 query heads): a
 * pass's rows are the G query heads of one (token, KV head), or of up to 16 / G tokens of one
 * sequence, padded to an m16 tile. Warp w takes the key tiles w, w + PA_WARPS, ... of 16 keys of the
 * range (the same tiles whatever the batch: they depend on the positions only), STAGES - 1 tiles per
 * warp in flight with cp.async while it computes one (rows past the range zero-filled). Per tile:
 * S = Q K^T on mma.sync m16n8k16 (fp32 sums of exact bf16 products), scaled into the log2 domain,
 * masked past each row's last key; an online softmax per row (the max over the quad's lanes); P
 * rounded to bf16 as the A operand of P V (FlashAttention-2's rounding; the row sums stay fp32).
 * The warps merge in order through shared memory at the end, as paged_finish does. */
template <int HEAD_DIM> struct PagedTcShape {
    static constexpr int LDS = HEAD_DIM + 8;                 /* smem row pitch (bf16): ldmatrix rows on distinct banks */
    static constexpr int TILE_ELEMS = 16 * LDS;              /* one 16-row tile */
    static constexpr int CPR = HEAD_DIM / 8;                 /* 16-byte chunks per row */
    static constexpr int NT = HEAD_DIM / 8;                  /* n8 tiles of the output */
    static constexpr int STAGES = 2; /* per warp: the tile computed + the next in flight (3-4 measured no faster) */
    static constexpr int STAGE_BYTES = (1 + PA_WARPS * STAGES * 2) * TILE_ELEMS * 2; /* Q + per warp STAGES x (K, V) */
    static constexpr int MERGE_BYTES = (PA_WARPS * 16 * HEAD_DIM + 2 * PA_WARPS * 16) * 4;
    static constexpr int SMEM_BYTES = STAGE_BYTES > MERGE_BYTES ? STAGE_BYTES : MERGE_BYTES;
};

/* One pass of the tensor-core kernel: tokens tok0 .. tok0 + count - 1 (count x G <= 16 rows, all of
 * sequence seq; count > 1 only with one split), KV head kv_head, keys [k_begin, k_end) for count 1,
 * else [0, max pos + 1) with each row masked past its own token's position. A row's result does not
 * depend on the other tokens of the pass: its tiles are the same, and a tile past its own keys is
 * all -inf for it, which leaves its state as it was. */
template <int HEAD_DIM>
__device__ void paged_tc_pass(const PagedAttentionParams &p, unsigned char *smem_tc, int tok0, int count, int seq,
                              int kv_head, int split, int k_begin, int k_end) {
    using S = PagedTcShape<HEAD_DIM>;
    constexpr int LDS = S::LDS, CPR = S::CPR, NT = S::NT, KSTEPS = HEAD_DIM / 16, STAGES = S::STAGES;
    __nv_bfloat16 *q_s = reinterpret_cast<__nv_bfloat16 *>(smem_tc);
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, G = p.heads_per_cta, rows = count * G;
    const int head0 = kv_head * p.group;
    __nv_bfloat16 *stage_base = q_s + S::TILE_ELEMS * (1 + warp * STAGES * 2); /* [STAGES][K, V][16][LDS] */

    if (p.qkv) { /* paged_attention_rope (count == 1): qkv_rope_store's work for this CTA, its expressions */
        constexpr int HALF = HEAD_DIM / 2;
        const __nv_bfloat16 *row = (const __nv_bfloat16 *)p.qkv + (size_t)tok0 * p.qkv_width;
        const float fpos = (float)p.pos[tok0];
        const int slot = p.slot_mapping[tok0], kv_col = p.n_heads * HEAD_DIM + kv_head * HEAD_DIM;
        const bool store = slot >= 0 && k_begin <= p.pos[tok0] && p.pos[tok0] < k_end; /* the split that reads it */
        for (int e = tid; e < (G + 1) * HALF; e += PA_THREADS) {
            const int r = e / HALF, j = e % HALF; /* r < G: query head head0 + r; r == G: the key */
            if (r == G && !store) continue;
            const __nv_bfloat16 *src = row + (r < G ? (head0 + r) * HEAD_DIM : kv_col);
            float angle = fpos * p.inv_freq[j];
            float c = cosf(angle), sn = sinf(angle);
            float ak = __bfloat162float(src[j]), bk = __bfloat162float(src[j + HALF]);
            float a = ak * c - bk * sn;
            float b = bk * c + ak * sn;
            if (r < G) {
                q_s[r * LDS + j] = __float2bfloat16_rn(a), q_s[r * LDS + j + HALF] = __float2bfloat16_rn(b);
            } else {
                __nv_bfloat16 *kd = (__nv_bfloat16 *)p.k_pool + (size_t)slot * p.kv_dim + kv_head * HEAD_DIM;
                __nv_bfloat16 *vd = (__nv_bfloat16 *)p.v_pool + (size_t)slot * p.kv_dim + kv_head * HEAD_DIM;
                const __nv_bfloat16 *vs = row + kv_col + p.n_kv_heads * HEAD_DIM;
                kd[j] = __float2bfloat16_rn(a), kd[j + HALF] = __float2bfloat16_rn(b);
                vd[j] = vs[j], vd[j + HALF] = vs[j + HALF];
            }
        }
        for (int c = tid; c < (16 - G) * CPR; c += PA_THREADS) /* rows past the group: zero */
            *reinterpret_cast<uint4 *>(q_s + (G + c / CPR) * LDS + (c % CPR) * 8) = make_uint4(0, 0, 0, 0);
        __threadfence_block();
        __syncthreads(); /* the token's k and v are in the pool before any tile is staged */
    }
    /* Q: row r = head r % G of token tok0 + r / G; rows past count x G zero. */
    for (int c = p.qkv ? 16 * CPR : tid; c < 16 * CPR; c += PA_THREADS) {
        int r = c / CPR, part = c % CPR;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (r < rows)
            v = *reinterpret_cast<const uint4 *>((const __nv_bfloat16 *)p.q +
                                                 ((size_t)(tok0 + r / G) * p.n_heads + head0 + r % G) * HEAD_DIM + part * 8);
        *reinterpret_cast<uint4 *>(q_s + r * LDS + part * 8) = v;
    }

    const int *table = p.block_tables + (size_t)seq * p.max_blocks;
    const size_t head_offset = (size_t)kv_head * HEAD_DIM;
    const __nv_bfloat16 *k_pool = (const __nv_bfloat16 *)p.k_pool, *v_pool = (const __nv_bfloat16 *)p.v_pool;
    const int n_tiles = (k_end - k_begin + 15) / 16;
    auto stage_tile = [&](int tile, int stage) { /* this warp's tile `tile` of the range into `stage` */
        __nv_bfloat16 *ks = stage_base + stage * 2 * S::TILE_ELEMS, *vs = ks + S::TILE_ELEMS;
        for (int c = lane; c < 16 * CPR; c += 32) {
            int r = c / CPR, part = c % CPR, key = k_begin + tile * 16 + r;
            bool valid = key < k_end;
            size_t off = valid ? paged_row(table, key, p.block_shift) * p.kv_dim + head_offset + part * 8 : 0;
            cp_async16(ks + r * LDS + part * 8, k_pool + off, valid);
            cp_async16(vs + r * LDS + part * 8, v_pool + off, valid);
        }
    };
#pragma unroll
    for (int k = 0; k < STAGES - 1; k++) { /* one group per stage, empty or not, so the wait count below holds */
        if (warp + k * PA_WARPS < n_tiles) stage_tile(warp + k * PA_WARPS, k);
        cp_async_commit();
    }
    __syncthreads(); /* q_s */
    uint32_t qa[KSTEPS][4];
#pragma unroll
    for (int kk = 0; kk < KSTEPS; kk++) ldmatrix_x4(qa[kk], q_s + (lane & 15) * LDS + kk * 16 + (lane >> 4) * 8);

    const int g = lane / 4, t4 = lane % 4;
    int row_end[2]; /* this thread's rows g and g + 8: keys at or past row_end are masked */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int r = g + 8 * h;
        row_end[h] = count == 1 || r >= rows ? k_end : p.pos[tok0 + r / G] + 1;
    }
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}, acc[NT][4];
#pragma unroll
    for (int j = 0; j < NT; j++) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.0f;
    for (int it = 0, tile = warp; tile < n_tiles; it++, tile += PA_WARPS) {
        const int stage = it % STAGES;
        cp_async_wait<STAGES - 2>(); /* this tile's group has landed */
        __syncwarp();                /* and every lane is done with the stage refilled next */
        if (tile + (STAGES - 1) * PA_WARPS < n_tiles) stage_tile(tile + (STAGES - 1) * PA_WARPS, (it + STAGES - 1) % STAGES);
        cp_async_commit();
        const __nv_bfloat16 *ks = stage_base + stage * 2 * S::TILE_ELEMS, *vs = ks + S::TILE_ELEMS;
        float s[2][4] = {{0.0f, 0.0f, 0.0f, 0.0f}, {0.0f, 0.0f, 0.0f, 0.0f}}; /* keys 0-7, 8-15 of the tile */
#pragma unroll
        for (int kk = 0; kk < KSTEPS; kk++) {
            uint32_t b[4]; /* K stored [key][dim]: B of two n-tiles (keys 0-7, 8-15) x k16 */
            ldmatrix_x4(b, ks + ((lane >> 4) * 8 + (lane & 7)) * LDS + kk * 16 + ((lane >> 3) & 1) * 8);
            mma_bf16_m16n8k16(s[0], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], b[0], b[1]);
            mma_bf16_m16n8k16(s[1], qa[kk][0], qa[kk][1], qa[kk][2], qa[kk][3], b[2], b[3]);
        }
        const int key0 = k_begin + tile * 16;
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int j = 0; j < 2; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int key = key0 + j * 8 + 2 * t4 + (e & 1);
                s[j][e] = key < row_end[e >> 1] ? s[j][e] * p.qk_scale : -INFINITY;
                mx[e >> 1] = fmaxf(mx[e >> 1], s[j][e]);
            }
#pragma unroll
        for (int h = 0; h < 2; h++) {
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 1));
            mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], 2));
        }
        /* A row with no key yet (mx -inf: a tile past its token's keys, with count > 1) stays as it is. */
        float corr[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            corr[h] = mx[h] == -INFINITY ? 1.0f : exp2f(m[h] - mx[h]); /* m -inf: 0 */
            m[h] = mx[h], l[h] *= corr[h];
        }
        uint32_t pa[4];
#pragma unroll
        for (int j = 0; j < 2; j++) {
            float p0 = exp2f(s[j][0] - m[0]), p1 = exp2f(s[j][1] - m[0]);
            float p2 = exp2f(s[j][2] - m[1]), p3 = exp2f(s[j][3] - m[1]);
            if (m[0] == -INFINITY) p0 = p1 = 0.0f;
            if (m[1] == -INFINITY) p2 = p3 = 0.0f;
            l[0] += p0 + p1, l[1] += p2 + p3;
            __nv_bfloat162 lo = __floats2bfloat162_rn(p0, p1), hi = __floats2bfloat162_rn(p2, p3);
            pa[2 * j] = *reinterpret_cast<uint32_t *>(&lo), pa[2 * j + 1] = *reinterpret_cast<uint32_t *>(&hi);
        }
#pragma unroll
        for (int j = 0; j < NT; j++) acc[j][0] *= corr[0], acc[j][1] *= corr[0], acc[j][2] *= corr[1], acc[j][3] *= corr[1];
#pragma unroll
        for (int d = 0; d < NT / 2; d++) {
            uint32_t b[4]; /* V stored [key][dim]: B of two n-tiles (dims 16d.., 16d+8..) x the tile's 16 keys */
            ldmatrix_x4_trans(b, vs + (((lane >> 3) & 1) * 8 + (lane & 7)) * LDS + d * 16 + (lane >> 4) * 8);
            mma_bf16_m16n8k16(acc[2 * d], pa[0], pa[1], pa[2], pa[3], b[0], b[1]);
            mma_bf16_m16n8k16(acc[2 * d + 1], pa[0], pa[1], pa[2], pa[3], b[2], b[3]);
        }
    }
    cp_async_wait<0>();
#pragma unroll
    for (int h = 0; h < 2; h++) {
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 1);
        l[h] += __shfl_xor_sync(0xffffffffu, l[h], 2);
    }
    /* The warps' states merge in warp order. */
    __syncthreads(); /* the staging buffers are retired */
    float *s_acc = reinterpret_cast<float *>(smem_tc); /* [warps][16][Dh] */
    float *s_max = s_acc + PA_WARPS * 16 * HEAD_DIM, *s_sum = s_max + PA_WARPS * 16; /* [warps][16] */
#pragma unroll
    for (int j = 0; j < NT; j++) {
        float *row0 = s_acc + (warp * 16 + g) * HEAD_DIM + j * 8 + 2 * t4, *row1 = row0 + 8 * HEAD_DIM;
        row0[0] = acc[j][0], row0[1] = acc[j][1], row1[0] = acc[j][2], row1[1] = acc[j][3];
    }
    if (t4 == 0) {
        s_max[warp * 16 + g] = m[0], s_sum[warp * 16 + g] = l[0];
        s_max[warp * 16 + g + 8] = m[1], s_sum[warp * 16 + g + 8] = l[1];
    }
    __syncthreads();
    for (int idx = tid; idx < rows * HEAD_DIM; idx += PA_THREADS) {
        const int r = idx / HEAD_DIM, d = idx % HEAD_DIM;
        float mx = -INFINITY;
#pragma unroll
        for (int k = 0; k < PA_WARPS; k++) mx = fmaxf(mx, s_max[k * 16 + r]);
        float o = 0.0f, total = 0.0f;
#pragma unroll
        for (int k = 0; k < PA_WARPS; k++) {
            float sum = s_sum[k * 16 + r];
            float weight = sum > 0.0f ? exp2f(s_max[k * 16 + r] - mx) : 0.0f; /* warps without keys: -inf, 0 */
            total += sum * weight;
            o = fmaf(s_acc[(k * 16 + r) * HEAD_DIM + d], weight, o);
        }
        const size_t row = (size_t)(tok0 + r / G) * p.n_heads + head0 + r % G;
        if (p.splits > 1 && d == 0) p.part_lse[row * p.splits + split] = total > 0.0f ? mx + log2f(total) : -INFINITY;
        if (p.splits > 1 && total == 0.0f) continue; /* an empty split: the combine skips it by its lse */
        o = total > 0.0f ? o / total : 0.0f;
        if (p.splits == 1) ((__nv_bfloat16 *)p.out)[row * HEAD_DIM + d] = __float2bfloat16_rn(o);
        else p.part_out[(row * p.splits + split) * HEAD_DIM + d] = o;
    }
    __syncthreads(); /* shared memory is the next pass's */
}

/* Grid: (token group, KV head, split); a group is p.tc_tokens consecutive tokens of the batch (1
 * unless one split). Its runs of tokens of one sequence are one pass each: a prefill chunk's tokens
 * share each K/V tile they read; decode tokens (one per sequence) are a pass each. */
template <int HEAD_DIM>
__global__ void __launch_bounds__(PA_THREADS) paged_attention_tc_kernel(const PagedAttentionParams p) {
    extern __shared__ __align__(16) unsigned char smem_tc[];
    int cta = blockIdx.x;
    const int split = cta % p.splits;
    cta /= p.splits;
    const int kv_head = cta % p.n_kv_heads, first = (cta / p.n_kv_heads) * p.tc_tokens;
    const int last = min(p.n, first + p.tc_tokens);
    for (int t = first; t < last;) {
        const int seq = p.seq[t];
        int count = 1;
        while (t + count < last && seq >= 0 && p.seq[t + count] == seq) count++;
        if (seq >= 0) { /* padding tokens: nothing */
            int k_begin = 0, k_end = 0;
            for (int j = 0; j < count; j++) k_end = max(k_end, p.pos[t + j] + 1);
            if (count == 1) paged_split_range(p, k_end, split, &k_begin, &k_end); /* count > 1: one split */
            paged_tc_pass<HEAD_DIM>(p, smem_tc, t, count, seq, kv_head, split, k_begin, k_end);
        }
        t += count;
    }
}

/* The generic path: warp `warp` takes keys k_begin + warp, + PA_WARPS, ...;
 * lane l holds dims l + 32 e. One head per CTA (heads_per_cta == 1). */
template <typename T> __global__ void __launch_bounds__(PA_THREADS) paged_attention_generic_kernel(const PagedAttentionParams p) {
    constexpr int E = PA_MAX_HEAD_DIM / 32;
    __shared__ float smem[paged_merge_floats(PA_WARPS, 1, PA_MAX_HEAD_DIM)];
    const PagedWork w = paged_work(p);
    if (w.seq < 0) return; /* padding */
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, head_dim = p.head_dim;
    const T *q_row = (const T *)p.q + ((size_t)w.token * p.n_heads + w.head0) * head_dim;
    float q[E], m[1] = {-INFINITY}, l[1] = {0.0f}, acc[1][E];
#pragma unroll
    for (int e = 0; e < E; e++) {
        int d = lane + 32 * e;
        q[e] = d < head_dim ? to_float(q_row[d]) * p.qk_scale : 0.0f;
        acc[0][e] = 0.0f;
    }
    const int *table = p.block_tables + (size_t)w.seq * p.max_blocks;
    const size_t head_offset = (size_t)w.kv_head * head_dim;
    for (int key = w.k_begin + warp; key < w.k_end; key += PA_WARPS) {
        size_t offset = paged_row(table, key, p.block_shift) * p.kv_dim + head_offset;
        const T *k = (const T *)p.k_pool + offset, *v = (const T *)p.v_pool + offset;
        float s = 0.0f;
#pragma unroll
        for (int e = 0; e < E; e++) {
            int d = lane + 32 * e;
            if (d < head_dim) s = fmaf(q[e], to_float(k[d]), s);
        }
        for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
        if (s > m[0]) {
            float corr = exp2f(m[0] - s);
            l[0] *= corr;
#pragma unroll
            for (int e = 0; e < E; e++) acc[0][e] *= corr;
            m[0] = s;
        }
        float prob = exp2f(s - m[0]);
        l[0] += prob;
#pragma unroll
        for (int e = 0; e < E; e++) {
            int d = lane + 32 * e;
            if (d < head_dim) acc[0][e] = fmaf(prob, to_float(v[d]), acc[0][e]);
        }
    }
    paged_finish<T, 1, E>(smem, p, w, m, l, acc, warp, PA_WARPS, lane == 0, lane, 32);
}

/* One CTA per (token, head): out = sum_s 2^(lse_s - max) o_s / sum_s 2^(lse_s - max). */
template <typename T>
__global__ void paged_combine_kernel(T *out, const float *part_out, const float *part_lse, const int *seq,
                                     int n_heads, int head_dim, int splits) {
    size_t row = blockIdx.x; /* token * n_heads + head */
    if (seq[row / n_heads] < 0) return;
    const float *lse = part_lse + row * splits;
    float mx = -INFINITY;
    for (int s = 0; s < splits; s++) mx = fmaxf(mx, lse[s]);
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float num = 0.0f, den = 0.0f;
        for (int s = 0; s < splits; s++) {
            if (lse[s] == -INFINITY) continue; /* no keys: its partial output was never written */
            float weight = exp2f(lse[s] - mx);
            den += weight;
            num = fmaf(weight, part_out[(row * splits + s) * head_dim + d], num);
        }
        out[row * head_dim + d] = from_float<T>(den > 0.0f ? num / den : 0.0f);
    }
}

/* Splits per token: as many as keep the CTAs within PA_TARGET_CTAS_PER_SM per
 * SM, at most one per PA_MIN_KEYS_PER_SPLIT keys of the table (max_blocks *
 * block_size) and PA_MAX_SPLITS; the option paged_splits (COLT_PAGED_SPLITS)
 * overrides. */
static int paged_choose_splits(const CudaState *cs, size_t base_ctas, int max_blocks, int block_size) {
    if (cuda_attention_invariant(cs)) return 1; /* a token's keys in one order, whatever n is */
    if (cs->opt.paged_splits > 0) return cs->opt.paged_splits;
    size_t target = (size_t)PA_TARGET_CTAS_PER_SM * cs->sm_count;
    if (base_ctas == 0 || base_ctas >= target) return 1;
    size_t splits = target / base_ctas;
    if (splits > PA_MAX_SPLITS) splits = PA_MAX_SPLITS;
    size_t by_length = (size_t)max_blocks * block_size / PA_MIN_KEYS_PER_SPLIT;
    if (splits > by_length) splits = by_length;
    if (splits > (size_t)max_blocks) splits = (size_t)max_blocks;
    return splits > 1 ? (int)splits : 1;
}

/* The split partials [floats]. Automatic choices keep base_ctas * splits
 * within target (splits <= target / base_ctas), hence the bound reserved at
 * open (with a factor 2 to spare); only forced splits can exceed it. */
static size_t paged_partials_bound(const CudaState *cs) {
    return (size_t)2 * PA_TARGET_CTAS_PER_SM * cs->sm_count * PA_TC_MAX_GROUP * (PA_MAX_HEAD_DIM + 1);
}

cudaError_t cuda_paged_reserve(CudaState *cs, size_t *reserved) {
    size_t floats = paged_partials_bound(cs);
    cudaError_t e = cudaMalloc((void **)&cs->paged_partials, floats * sizeof(float));
    if (e != cudaSuccess) {
        cs->paged_partials = NULL;
        return e;
    }
    cs->paged_partials_cap = floats;
    *reserved += floats * sizeof(float);
    return cudaSuccess;
}

void cuda_paged_release(CudaState *cs) {
    if (cs->paged_partials) CUDA_CHECK(cudaFree(cs->paged_partials));
    if (cs->identity_table) CUDA_CHECK(cudaFree(cs->identity_table));
    cs->paged_partials = NULL, cs->identity_table = NULL;
    cs->paged_partials_cap = cs->identity_cap = 0;
}

/* Beyond the reservation: forced splits' larger partials, the identity table. */
size_t cuda_paged_held_bytes(const CudaState *cs) {
    size_t bound = paged_partials_bound(cs);
    return (cs->paged_partials_cap > bound ? (cs->paged_partials_cap - bound) * sizeof(float) : 0) +
           cs->identity_cap * sizeof(int);
}

static float *paged_partials(CudaState *cs, size_t floats) {
    if (floats > cs->paged_partials_cap) {
        size_t bound = paged_partials_bound(cs);
        size_t want = floats > bound ? floats : bound;
        if (cs->paged_partials) {
            CUDA_CHECK(cudaStreamSynchronize(cs->stream)); /* kernels may still read the old buffer */
            cuda_buffer_regrown(cs);
            CUDA_CHECK(cudaFree(cs->paged_partials));
        }
        CUDA_CHECK(cudaMalloc((void **)&cs->paged_partials, want * sizeof(float)));
        cs->paged_partials_cap = want;
    }
    return cs->paged_partials;
}

/* Query heads per CTA: the largest divisor of G up to PA_MAX_HEADS_PER_CTA. */
static int paged_heads_per_cta(int group) {
    for (int h = PA_MAX_HEADS_PER_CTA; h > 1; h--)
        if (group % h == 0) return h;
    return 1;
}

/* paged_attention_rope's fused tensor-core path unless the option fused_rope_attn is off
 * (COLT_FUSED_ROPE_ATTN=0: qkv_rope_store, then the kernel), and the tensor-core kernel for bf16 storage
 * unless the option paged_tc is (COLT_PAGED_TC=0). */
static bool paged_fused_rope(const CudaState *cs) { return cs->opt.fused_rope_attn != 0; }
static bool paged_tensor_cores(const CudaState *cs) { return cs->opt.paged_tc != 0; }

/* Tokens per CTA on the tensor-core path with one split: as many as fill the m16 tile (16 / G) once
 * the call has more than PA_TC_GROUP_MIN_TOKENS tokens (prefill chunks, training), else 1 (a decode
 * step's tokens are of different sequences: grouping them would only serialise them).
 * The option paged_tc_tokens = k (COLT_PAGED_TC_TOKENS=k) forces min(k, 16 / G) (tests). The bits are the
 * same either way. */
static int paged_tc_tokens(const CudaState *cs, int n, int group) {
    const int most = PA_TC_MAX_GROUP / group;
    const int forced = cs->opt.paged_tc_tokens;
    int k = forced > 0 ? forced : n > PA_TC_GROUP_MIN_TOKENS ? most : 1;
    return k < most ? k : most;
}

template <int HEAD_DIM>
static void paged_launch_tc(CudaState *cs, const PagedAttentionParams &p, unsigned grid, cudaStream_t st) {
    using S = PagedTcShape<HEAD_DIM>;
    cuda_smem_optin(cs, (const void *)paged_attention_tc_kernel<HEAD_DIM>, S::SMEM_BYTES); /* above 48 KB */
    paged_attention_tc_kernel<HEAD_DIM><<<grid, PA_THREADS, S::SMEM_BYTES, st>>>(p);
}

template <typename T, int HEAD_DIM>
static void paged_launch_fast(const PagedAttentionParams &p, unsigned grid, cudaStream_t st) {
    switch (p.heads_per_cta) {
    case 1: paged_attention_kernel<T, HEAD_DIM, 1><<<grid, PA_THREADS, 0, st>>>(p); break;
    case 2: paged_attention_kernel<T, HEAD_DIM, 2><<<grid, PA_THREADS, 0, st>>>(p); break;
    case 3: paged_attention_kernel<T, HEAD_DIM, 3><<<grid, PA_THREADS, 0, st>>>(p); break;
    case 4: paged_attention_kernel<T, HEAD_DIM, 4><<<grid, PA_THREADS, 0, st>>>(p); break;
    case 5: paged_attention_kernel<T, HEAD_DIM, 5><<<grid, PA_THREADS, 0, st>>>(p); break;
    case 6: paged_attention_kernel<T, HEAD_DIM, 6><<<grid, PA_THREADS, 0, st>>>(p); break;
    case 7: paged_attention_kernel<T, HEAD_DIM, 7><<<grid, PA_THREADS, 0, st>>>(p); break;
    case 8: paged_attention_kernel<T, HEAD_DIM, 8><<<grid, PA_THREADS, 0, st>>>(p); break;
    default: CUDA_ASSERT_HOST(!"heads per CTA out of range");
    }
}

/* paged_attention; with qkv (paged_attention_rope) the tensor-core path ropes q and stores the token's K/V
 * itself, and the other paths run qkv_rope_store into q first. */
template <typename T>
static void paged_attention_impl(CudaState *cs, void *out, void *q, void *k_pool, void *v_pool,
                                 const void *block_tables,
                                 const void *seq, const void *pos, int n, int n_heads, int n_kv_heads, int head_dim,
                                 int block_size, int max_blocks, const void *qkv, const void *slot_mapping,
                                 const float *inv_freq_host) {
    if (n <= 0 || n_heads <= 0) return;
    CUDA_ASSERT_HOST(head_dim > 0 && head_dim % 2 == 0 && head_dim <= PA_MAX_HEAD_DIM);
    CUDA_ASSERT_HOST(n_kv_heads > 0 && n_heads % n_kv_heads == 0);
    CUDA_ASSERT_HOST(block_size > 0 && (block_size & (block_size - 1)) == 0 && max_blocks > 0);
    bool fast = (head_dim == 64 || head_dim == 128) && aligned16(q) && aligned16(k_pool) && aligned16(v_pool);
    PagedAttentionParams p;
    p.out = out;
    p.q = q, p.k_pool = k_pool, p.v_pool = v_pool;
    p.block_tables = (const int *)block_tables, p.seq = (const int *)seq, p.pos = (const int *)pos;
    p.n_heads = n_heads, p.n_kv_heads = n_kv_heads, p.group = n_heads / n_kv_heads;
    const bool tc = fast && sizeof(T) == 2 && p.group <= PA_TC_MAX_GROUP && paged_tensor_cores(cs);
    p.heads_per_cta = tc ? p.group : fast ? paged_heads_per_cta(p.group) : 1;
    p.head_chunks = p.group / p.heads_per_cta;
    p.head_dim = head_dim, p.kv_dim = n_kv_heads * head_dim;
    p.block_shift = __builtin_ctz((unsigned)block_size), p.max_blocks = max_blocks;
    p.qk_scale = (float)(1.4426950408889634 / sqrt((double)head_dim));
    size_t base_ctas = (size_t)n * n_kv_heads * p.head_chunks;
    p.splits = paged_choose_splits(cs, base_ctas, max_blocks, block_size);
    p.part_out = p.part_lse = NULL;
    if (p.splits > 1) {
        size_t partial_rows = (size_t)n * n_heads * p.splits;
        p.part_out = paged_partials(cs, partial_rows * (head_dim + 1));
        p.part_lse = p.part_out + partial_rows * head_dim;
    }
    p.n = n, p.tc_tokens = tc && p.splits == 1 ? paged_tc_tokens(cs, n, p.group) : 1;
    p.qkv = NULL, p.slot_mapping = NULL, p.inv_freq = NULL, p.qkv_width = 0;
    if (qkv && tc && p.tc_tokens == 1 && aligned16(qkv) && paged_fused_rope(cs)) {
        p.qkv = qkv, p.slot_mapping = (const int *)slot_mapping;
        p.inv_freq = cuda_rope_inv_freq(cs, head_dim, inv_freq_host);
        p.qkv_width = (n_heads + 2 * n_kv_heads) * head_dim;
    } else if (qkv) {
        cuda_qkv_rope_store<T>(cs->be, q, k_pool, v_pool, qkv, pos, slot_mapping, n, n_heads, n_kv_heads, head_dim,
                               inv_freq_host);
    }
    size_t grid = (tc ? ((size_t)n + p.tc_tokens - 1) / p.tc_tokens * n_kv_heads : base_ctas) * p.splits;
    CUDA_ASSERT_HOST(grid < (1u << 31));
    cudaStream_t st = cs->stream;
    if (tc && head_dim == 64) paged_launch_tc<64>(cs, p, (unsigned)grid, st);
    else if (tc) paged_launch_tc<128>(cs, p, (unsigned)grid, st);
    else if (!fast) paged_attention_generic_kernel<T><<<(unsigned)grid, PA_THREADS, 0, st>>>(p);
    else if (head_dim == 64) paged_launch_fast<T, 64>(p, (unsigned)grid, st);
    else paged_launch_fast<T, 128>(p, (unsigned)grid, st);
    LAUNCH_CHECK(cs);
    if (p.splits > 1) {
        paged_combine_kernel<T><<<(unsigned)((size_t)n * n_heads), PA_COMBINE_THREADS, 0, st>>>(
            (T *)out, p.part_out, p.part_lse, p.seq, n_heads, head_dim, p.splits);
        LAUNCH_CHECK(cs);
    }
}

template <typename T>
void cuda_paged_attention(const Backend *be, void *out, const void *q, const void *k_pool, const void *v_pool,
                          const void *block_tables, const void *seq, const void *pos, int n, int n_heads,
                          int n_kv_heads, int head_dim, int block_size, int max_blocks) {
    paged_attention_impl<T>(cuda_enter(be), out, (void *)q, (void *)k_pool, (void *)v_pool, block_tables, seq, pos, n,
                            n_heads, n_kv_heads, head_dim, block_size, max_blocks, NULL, NULL, NULL);
}

template <typename T>
void cuda_paged_attention_rope(const Backend *be, void *out, void *q, void *k_pool, void *v_pool, const void *qkv,
                               const void *block_tables, const void *seq, const void *pos, const void *slot_mapping,
                               int n, int n_heads, int n_kv_heads, int head_dim, const float *inv_freq_host,
                               int block_size, int max_blocks) {
    paged_attention_impl<T>(cuda_enter(be), out, q, k_pool, v_pool, block_tables, seq, pos, n, n_heads, n_kv_heads,
                            head_dim, block_size, max_blocks, qkv, slot_mapping, inv_freq_host);
}

/* Deterministic mode's training attention: the [S, L, KVD] caches read as a
 * pool of 1-token blocks whose table is the identity (sequence s, position p
 * at row s * L + p), one split. The kernel's arithmetic depends on the key
 * positions only, never on the block size, so the output is the engine's. */
static const int *identity_table(CudaState *cs, size_t rows) {
    if (rows > cs->identity_cap) {
        size_t want = rows > 2 * cs->identity_cap ? rows : 2 * cs->identity_cap;
        int *host = (int *)malloc(want * sizeof(int));
        CUDA_ASSERT_HOST(host != NULL && want < (1u << 31));
        for (size_t i = 0; i < want; i++) host[i] = (int)i;
        CUDA_CHECK(cudaStreamSynchronize(cs->stream)); /* kernels may still read the old table */
        cuda_buffer_regrown(cs);
        if (cs->identity_table) CUDA_CHECK(cudaFree(cs->identity_table));
        CUDA_CHECK(cudaMalloc((void **)&cs->identity_table, want * sizeof(int)));
        CUDA_CHECK(cudaMemcpy(cs->identity_table, host, want * sizeof(int), cudaMemcpyHostToDevice));
        free(host);
        cs->identity_cap = want;
    }
    return cs->identity_table;
}

template <typename T>
void cuda_attention_paged(CudaState *cs, void *out, const void *q, const void *k_cache, const void *v_cache,
                          const int *slot, const int *pos, int n, int n_heads, int n_kv_heads, int head_dim,
                          int max_len) {
    if (n <= 0 || n_heads <= 0) return;
    int n_slots = 0;
    for (int i = 0; i < n; i++)
        if (slot[i] + 1 > n_slots) n_slots = slot[i] + 1;
    const int *table = identity_table(cs, (size_t)n_slots * max_len);
    const int *host[2] = {slot, pos};
    const int *d = cuda_upload_indices(cs, host, 2, n);
    paged_attention_impl<T>(cs, out, (void *)q, (void *)k_cache, (void *)v_cache, table, d, d + n, n, n_heads,
                            n_kv_heads, head_dim, 1, max_len, NULL, NULL, NULL);
}

#define INSTANTIATE(T)                                                                                             \
    template void cuda_embedding_i32<T>(const Backend *, void *, const void *, const void *, int, int);            \
    template void cuda_rope_i32<T>(const Backend *, void *, const void *, int, int, int, const float *);           \
    template void cuda_gather_rows_i32<T>(const Backend *, void *, const void *, const void *, int, int);          \
    template void cuda_paged_kv_store<T>(const Backend *, void *, void *, const void *, const void *, const void *, \
                                         int, int);                                                                \
    template void cuda_paged_attention<T>(const Backend *, void *, const void *, const void *, const void *,       \
                                          const void *, const void *, const void *, int, int, int, int, int, int);  \
    template void cuda_paged_attention_rope<T>(const Backend *, void *, void *, void *, void *, const void *,      \
                                               const void *, const void *, const void *, const void *, int, int,  \
                                               int, int, const float *, int, int);                                 \
    template void cuda_attention_paged<T>(CudaState *, void *, const void *, const void *, const void *,           \
                                          const int *, const int *, int, int, int, int, int);
INSTANTIATE(float)
INSTANTIATE(__nv_bfloat16)
