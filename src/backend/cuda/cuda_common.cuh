/* cuda_common.cuh — what every file of the CUDA backend shares: the check
 * macros, bf16 <-> fp32 helpers, and the instance state (CudaState: one per
 * backend_cuda_open, in Backend.ctx — its device, streams, cuBLASLt handle,
 * scratch, caches and options). Nothing here is process-wide.
 *
 * It is not a public header: C code sees only backend.h, cuda_instance.h and
 * cuda_bench.h.
 *
 * Storage type T is float (backend_cuda_f32) or __nv_bfloat16 (backend_cuda);
 * every kernel reads T, computes in fp32 (or double where stated) and writes T.
 * Buffers marked [f32] in backend.h are always float.
 *
 * Every op of the table takes its instance first and begins with
 * cuda_enter(be), which makes the instance's device current on the thread and
 * returns its state; the helpers below it take that CudaState and launch on
 * cs->stream. */
#ifndef COLT_BACKEND_CUDA_COMMON_CUH
#define COLT_BACKEND_CUDA_COMMON_CUH

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

extern "C" {
#include "backend/backend.h"
#include "backend/cuda/cuda_instance.h"
}

/* ---------------------------------------------------------------- checks */

#define CUDA_CHECK(call)                                                                          \
    do {                                                                                          \
        cudaError_t cuda_check_err_ = (call);                                                     \
        if (cuda_check_err_ != cudaSuccess) {                                                     \
            fprintf(stderr, "%s:%d: CUDA error %s (%s) in: %s\n", __FILE__, __LINE__,             \
                    cudaGetErrorName(cuda_check_err_), cudaGetErrorString(cuda_check_err_), #call); \
            abort();                                                                              \
        }                                                                                         \
    } while (0)

#define CUBLAS_CHECK(call)                                                                         \
    do {                                                                                           \
        cublasStatus_t cublas_check_st_ = (call);                                                  \
        if (cublas_check_st_ != CUBLAS_STATUS_SUCCESS) {                                           \
            fprintf(stderr, "%s:%d: cuBLAS error %d (%s) in: %s\n", __FILE__, __LINE__,            \
                    (int)cublas_check_st_, cublasLtGetStatusString(cublas_check_st_), #call);     \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* After every kernel launch, given the instance's state cs. With its option
 * sync_each_launch (COLT_CUDA_SYNC=1) it also synchronises, so an asynchronous
 * fault is reported at the kernel that made it. */
#define LAUNCH_CHECK(cs)                                                                     \
    do {                                                                                     \
        CUDA_CHECK(cudaGetLastError());                                                      \
        if ((cs)->opt.sync_each_launch) CUDA_CHECK(cudaStreamSynchronize((cs)->stream));     \
    } while (0)

#define CUDA_ASSERT_HOST(cond)                                                                     \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            fprintf(stderr, "%s:%d: assertion failed: %s\n", __FILE__, __LINE__, #cond);          \
            abort();                                                                               \
        }                                                                                          \
    } while (0)

/* ---------------------------------------------------------------- types */

template <typename T> __device__ __forceinline__ float to_float(T x);
template <> __device__ __forceinline__ float to_float<float>(float x) { return x; }
template <> __device__ __forceinline__ float to_float<__nv_bfloat16>(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
    return __float2bfloat16_rn(x);
}

template <typename T> struct CudaType;
template <> struct CudaType<float> { static const cudaDataType_t value = CUDA_R_32F; };
template <> struct CudaType<__nv_bfloat16> { static const cudaDataType_t value = CUDA_R_16BF; };

/* Launch geometry for flat elementwise kernels (grid-stride loops). */
#define CUDA_THREADS 256
static inline unsigned cuda_blocks_for(size_t n) {
    size_t b = (n + CUDA_THREADS - 1) / CUDA_THREADS;
    if (b > 65535u * 16u) b = 65535u * 16u;
    return (unsigned)(b ? b : 1);
}

static inline bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* bf16 pairs packed in 32-bit words <-> fp32: exact widening, narrowing rounds
 * to nearest even (the vectorised loads and stores of the kernels). */
__device__ __forceinline__ float bf_lo(unsigned w) { return __uint_as_float(w << 16); }
__device__ __forceinline__ float bf_hi(unsigned w) { return __uint_as_float(w & 0xffff0000u); }
__device__ __forceinline__ unsigned bf_pack(float lo, float hi) {
    return (unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(lo)) |
           ((unsigned)__bfloat16_as_ushort(__float2bfloat16_rn(hi)) << 16);
}

/* ---------------------------------------------------------------- tensor cores and cp.async */

/* d[16x8] += a[16x16] @ b[16x8], bf16 inputs, fp32 accumulators. Fragments (PTX ISA, m16n8k16,
 * g = lane / 4, t = lane % 4): a0 (row g, k 2t..2t+1), a1 (row g+8, k 2t..), a2 (row g, k 2t+8..),
 * a3 (row g+8, k 2t+8..); b0 (k 2t..2t+1, col g), b1 (k 2t+8.., col g); d0, d1 (row g, cols 2t,
 * 2t+1), d2, d3 (row g+8, cols 2t, 2t+1). The lower k of a pair sits in the low 16 bits. */
__device__ __forceinline__ void mma_bf16_m16n8k16(float *d, uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                  uint32_t b0, uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* Four 8x8 b16 matrices from shared memory (lane l gives row l % 8 of matrix l / 8); .trans: transposed. */
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((unsigned)__cvta_generic_to_shared(smem_row)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void *smem_row) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((unsigned)__cvta_generic_to_shared(smem_row)));
}

/* 16 bytes global -> shared, asynchronous; valid = false zero-fills and reads nothing. */
__device__ __forceinline__ void cp_async16(void *smem_dst, const void *src, bool valid) {
    unsigned dst = (unsigned)__cvta_generic_to_shared(smem_dst);
    int bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(bytes) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/* Waits until at most PENDING committed groups are still in flight. */
template <int PENDING> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(PENDING) : "memory");
}

/* ---------------------------------------------------------------- instance state (cuda_backend.cu) */

/* A recent upload of index arrays: the ints in pinned host memory (so the copy
 * is truly asynchronous) and on the device. Ops pass the same pos/slot arrays
 * to every layer, so most uploads are found here and cost a memcmp. */
#define CUDA_INDEX_CACHE_ENTRIES 8
struct CudaIndexEntry {
    int *pinned, *dev;  /* [cap] */
    size_t cap, len;    /* in ints */
    uint64_t last_use;
    cudaEvent_t copied; /* the last copy out of pinned */
    int has_event;
};

/* A kernel whose dynamic shared memory limit this instance raised (cuda_smem_optin). */
#define CUDA_SMEM_OPTINS 64
struct CudaSmemOptin {
    const void *kernel;
    size_t bytes;
};

/* The all-layers decode kernel's weight-ring choice for one model shape (cuda_decode_layers.cu). */
#define CUDA_DECODE_PICKS 8
struct CudaDecodePick {
    int key[8], ring[3];
};

struct CudaGemmCache; /* cuda_gemm.cu: cuBLASLt plans and tuned algorithms */

/* One instance of the CUDA backend (Backend.ctx). Not thread-safe: one thread
 * at a time per instance; instances are independent (two may share a device). */
struct CudaState {
    const Backend *be; /* the instance's table (ctx points back here) */
    int device;
    DType storage;
    int shared;   /* backend_cuda() / backend_cuda_f32(): never closed */
    int sm_count; /* streaming multiprocessors of the device */
    CudaOptions opt;     /* read at open; tests change them */
    CudaOptions opt_env; /* as read at open: a test hook's -1 goes back to these */
    int batch_invariant; /* deterministic mode (backend.h set_batch_invariant): bit 0 linear, bit 1 attention */

    cudaStream_t stream;      /* every op, upload and download */
    cudaStream_t comm_stream; /* collectives (backend_cuda_comm_stream); no op uses it */
    cudaEvent_t compute_mark; /* recorded on stream for backend_cuda_comm_after_compute */
    cublasLtHandle_t lt;
    void *lt_workspace;       /* [CUDA_LT_WORKSPACE_BYTES] */
    float *staging;           /* [CUDA_STAGING_FLOATS]: fp32 <-> storage conversion of upload/download */
    float *inv_freq;          /* [512] device copy of rope_table */
    int rope_head_dim;
    float rope_table[512];    /* the host rope table last uploaded (cuda_rope_inv_freq) */
    size_t reserved_bytes;    /* device bytes reserved at open (backend_cuda_reserved_bytes) */
    /* alloc / alloc_f32 buffers held (backend.h memory_stats): their sizes by
     * address (a std::unordered_map, cuda_backend.cu), the bytes now and at most */
    void *alloc_sizes;
    size_t mem_in_use, mem_peak;
    char alloc_label[160];    /* backend.h set_alloc_label: named when an allocation fails */

    CudaIndexEntry index_cache[CUDA_INDEX_CACHE_ENTRIES]; /* recent index uploads (cuda_upload_indices) */
    uint64_t index_clock;
    void *scratch;      /* growable general scratch (cuda_scratch) */
    size_t scratch_cap; /* in bytes */
    /* backend.h buffers_epoch: moves whenever a buffer the ops may have recorded into a CUDA graph is
     * freed to grow it (cuda_buffer_regrown) */
    uint64_t buffers_epoch;
    CudaSmemOptin smem_optin[CUDA_SMEM_OPTINS];
    int n_smem_optin;

    /* cuda_gemm.cu */
    CudaGemmCache *gemm;
    void *split_free_scratch; /* the deterministic linear's aligned copies of x / out */
    size_t split_free_scratch_bytes;
    void *ones;               /* db's vector of ones in the storage type */
    int ones_capacity;
    /* cuda_attention.cu: the tiled kernels' host plan buffers and the dS scratch granted so far */
    int *fa_raw, *fa_rawq, *fa_sortq, *fa_packed, *fa_aux, *fa_tokbase, *fa_count;
    size_t fa_raw_cap, fa_packed_cap, fa_aux_cap, fa_tokbase_cap, fa_count_cap;
    size_t fa_granted;
    /* cuda_paged.cu: split partials (reserved at open) and the identity block table */
    float *paged_partials;
    size_t paged_partials_cap; /* floats */
    int *identity_table;
    size_t identity_cap;
    /* cuda_ops.cu: sum_squares' partials and ticket (device), result (mapped pinned host) */
    double *sumsq_partial, *sumsq_dev_result, *sumsq_host, *sumsq_mapped;
    unsigned *sumsq_ticket;
    /* cuda_sample.cu: the split path's scratch (reserved at open) */
    void *sample_split;
    /* cuda_decode_layers.cu: the weight-ring picks by shape, timed once per shape and instance */
    CudaDecodePick decode_picks[CUDA_DECODE_PICKS];
    int n_decode_picks;
    /* host calls served (tests; graph replays are not counted) */
    long skinny_calls, decode_layers_calls;
};

#define CUDA_LT_WORKSPACE_BYTES (32u << 20)
#define CUDA_STAGING_FLOATS ((size_t)8 << 20) /* 32 MiB of fp32 staging for upload/download conversion */

static inline CudaState *cuda_state(const Backend *be) { return (CudaState *)be->ctx; }
/* An instance buffer that ops read (scratch, partials, tables) is about to be freed and allocated larger:
 * graphs recorded with its old address must not be launched again (backend.h buffers_epoch). */
static inline void cuda_buffer_regrown(CudaState *cs) { cs->buffers_epoch++; }
/* The start of every op: the instance's device made current on this thread
 * (a thread-local compare when it already is) and its state. */
CudaState *cuda_enter(const Backend *be);
/* The same for the rare calls (alloc, free, graphs): also catches a cudaSetDevice made behind the
 * backend's back. */
CudaState *cuda_enter_checked(const Backend *be);

/* Blocks for a grid-stride loop over `work` items of CUDA_THREADS threads:
 * enough to fill every SM (8 x 256 threads), no more. The grid never changes
 * a result. */
static inline unsigned flat_blocks(const CudaState *cs, size_t work) {
    size_t b = (work + CUDA_THREADS - 1) / CUDA_THREADS, cap = (size_t)cs->sm_count * 8;
    if (b > cap) b = cap;
    return (unsigned)(b ? b : 1);
}

/* Copies `count` host int arrays of n entries each into device memory, array k
 * at offset k * n; returns the device base. Stream ordered: valid for kernels
 * launched after it on cs->stream, until the next call. */
int *cuda_upload_indices(CudaState *cs, const int *const *host_arrays, int count, int n);
/* Device scratch of at least `bytes` (contents undefined), valid until the next call. */
void *cuda_scratch(CudaState *cs, size_t bytes);
/* The device copy of the host table inv_freq_host[head_dim / 2] (the rope ops'
 * argument, the values the CPU rope uses), uploaded when it differs from the
 * last one (compared on the host; nothing is uploaded while it stays the same). */
const float *cuda_rope_inv_freq(CudaState *cs, int head_dim, const float *inv_freq_host);
/* Lets `kernel` take `bytes` of dynamic shared memory (the opt-in above 48 KB)
 * on the instance's device; a lookup after the first time. */
void cuda_smem_optin(CudaState *cs, const void *kernel, size_t bytes);

/* Per-file state made at open and freed at close. The reservations add the
 * device bytes they took to *reserved; an error leaves the rest to the release. */
cudaError_t cuda_paged_reserve(CudaState *cs, size_t *reserved);
cudaError_t cuda_sum_squares_reserve(CudaState *cs, size_t *reserved);
cudaError_t cuda_sample_reserve(CudaState *cs, size_t *reserved);
void cuda_gemm_state_create(CudaState *cs);
void cuda_gemm_release(CudaState *cs);
void cuda_attention_release(CudaState *cs);
void cuda_paged_release(CudaState *cs);
void cuda_sum_squares_release(CudaState *cs);
void cuda_sample_release(CudaState *cs);
/* Growable scratch held now beyond the reservation (backend_cuda_reserved_bytes). */
size_t cuda_gemm_held_bytes(const CudaState *cs);
size_t cuda_paged_held_bytes(const CudaState *cs);

/* ---------------------------------------------------------------- ops (one file per family) */

/* cuda_gemm.cu */
template <typename T>
void cuda_linear(const Backend *be, void *out, const void *x, const void *w, const void *bias, int n, int in_dim,
                 int out_dim);
template <typename T>
void cuda_linear_backward(const Backend *be, void *dx, void *dw, void *db, const void *dy, const void *x,
                          const void *w, int n, int in_dim, int out_dim, int accumulate_dx);
/* cuda_skinny.cu: linear for 1 <= n <= SKINNY_MAX_ROWS (decode); false (nothing launched) when the
 * shape or alignment is unsupported or the instance's skinny option is 0, and the caller uses cuBLAS. */
#define SKINNY_MAX_ROWS 32
template <typename T>
bool cuda_skinny_linear(CudaState *cs, void *out, const void *x, const void *w, const void *bias, int n, int in_dim,
                        int out_dim);

/* cuda_invariant.cu: the deterministic mode's switch (backend.h set_batch_invariant) and its
 * batch-invariant linear, which cuda_linear runs for every n while the mode is on. */
void cuda_set_batch_invariant(const Backend *be, int on);
static inline int cuda_batch_invariant(const CudaState *cs) { return cs->batch_invariant & 1; }
static inline int cuda_attention_invariant(const CudaState *cs) { return (cs->batch_invariant & 2) != 0; }
template <typename T>
void cuda_invariant_linear(CudaState *cs, void *out, const void *x, const void *w, const void *bias, int n,
                           int in_dim, int out_dim);
/* cuda_gemm.cu: the deterministic mode's bf16 linear on cuBLASLt restricted to split-K-free
 * algorithms (row bits independent of n; see there); false (nothing run) for shapes it does not
 * serve, which cuda_invariant_linear then computes with its own kernels. */
bool cuda_linear_split_free(CudaState *cs, void *out, const void *x, const void *w, const void *bias, int n,
                            int in_dim, int out_dim);

/* cuda_attention.cu */
template <typename T>
void cuda_kv_store(const Backend *be, void *k_cache, void *v_cache, const void *k, const void *v, const int *slot,
                   const int *pos, int n, int kv_dim, int max_len);
template <typename T>
void cuda_kv_gather(const Backend *be, void *k, void *v, const void *k_cache, const void *v_cache, const int *slot,
                    const int *pos, int n, int kv_dim, int max_len);
template <typename T>
void cuda_attention(const Backend *be, void *out, void *lse, const void *q, const void *k_cache, const void *v_cache,
                    const int *slot, const int *pos, int n, int n_heads, int n_kv_heads, int head_dim, int max_len);
template <typename T>
void cuda_attention_backward(const Backend *be, void *dq, void *dk_cache, void *dv_cache, const void *dout,
                             const void *q, const void *out, const void *lse, const void *k_cache,
                             const void *v_cache, const int *slot, const int *pos, int n, int n_heads,
                             int n_kv_heads, int head_dim, int n_slots, int max_len);

/* cuda_ops.cu */
template <typename T>
void cuda_rmsnorm(const Backend *be, void *out, const void *x, const void *w, int n, int dim, float eps);
template <typename T>
void cuda_rmsnorm_backward(const Backend *be, void *dx, void *dw, const void *dy, const void *x, const void *w, int n,
                           int dim, float eps);
template <typename T>
void cuda_rope(const Backend *be, void *x, const int *pos, int n, int n_heads, int head_dim,
               const float *inv_freq_host);
template <typename T>
void cuda_rope_backward(const Backend *be, void *dx, const int *pos, int n, int n_heads, int head_dim,
                        const float *inv_freq_host);
template <typename T> void cuda_swiglu(const Backend *be, void *out, const void *gate, const void *up, size_t n);
template <typename T>
void cuda_swiglu_backward(const Backend *be, void *dgate, void *dup, const void *dout, const void *gate,
                          const void *up, size_t n);
template <typename T> void cuda_add(const Backend *be, void *out, const void *a, const void *b, size_t n);
template <typename T> void cuda_mul_scalar(const Backend *be, void *out, const void *x, float s, size_t n);
template <typename T>
void cuda_add_scaled(const Backend *be, void *out, const void *a, const void *b, float s, size_t n);
template <typename T>
void cuda_embedding(const Backend *be, void *out, const void *table, const int *ids, int n, int dim);
template <typename T>
void cuda_gather_rows(const Backend *be, void *dst, const void *src, const int *rows, int n, int dim);
template <typename T>
void cuda_scatter_rows(const Backend *be, void *dst, const void *src, const int *rows, int n, int dim);
template <typename T>
void cuda_embedding_backward(const Backend *be, void *dtable, const void *dout, const int *ids, int n, int dim);
template <typename T>
void cuda_log_softmax_target(const Backend *be, void *logprobs, void *entropy, const void *logits, const int *targets,
                             int n, int vocab, float temperature);
template <typename T>
void cuda_log_softmax_target_backward(const Backend *be, void *dlogits, const void *logits, const int *targets,
                                      const void *dlogprobs, int n, int vocab, float temperature);
template <typename T>
void cuda_log_softmax_entropy_backward(const Backend *be, void *dlogits, const void *logits, const int *targets,
                                       const void *dlogprobs, const void *dentropy, int n, int vocab,
                                       float temperature);
template <typename T>
void cuda_logits_shard_stats(const Backend *be, void *stats, const void *logits, const int *targets, int n, int vocab,
                             float temperature);
template <typename T>
void cuda_log_softmax_shard_backward(const Backend *be, void *dlogits, const void *logits, const int *targets,
                                     const void *dlogprobs, const void *lse, int n, int vocab, float temperature);
template <typename T>
void cuda_log_softmax_shard_entropy_backward(const Backend *be, void *dlogits, const void *logits, const int *targets,
                                             const void *dlogprobs, const void *dentropy, const void *lse,
                                             const void *pz, int n, int vocab, float temperature);
template <typename T>
void cuda_adamw(const Backend *be, void *param, void *master, const void *grad, void *m, void *v, size_t n, float lr,
                float beta1, float beta2, float eps, float weight_decay, float bias_correction1,
                float bias_correction2);
double cuda_sum_squares(const Backend *be, const void *x, size_t n);
void cuda_scale(const Backend *be, void *x, float s, size_t n);
void cuda_add_f32(const Backend *be, void *y, const void *x, size_t n);
/* cuda_paged.cu: the generation engine's [i32] buffers and paged KV cache ops (backend.h). */
void *cuda_alloc_i32(const Backend *be, size_t n);
void cuda_upload_i32(const Backend *be, void *dst, const int *src, size_t n);
void cuda_download_i32(const Backend *be, int *dst, const void *src, size_t n);
void cuda_vocab_shard_ids_i32(const Backend *be, void *out, const void *ids, int n, int lo, int hi);
template <typename T>
void cuda_embedding_i32(const Backend *be, void *out, const void *table, const void *ids, int n, int dim);
template <typename T>
void cuda_rope_i32(const Backend *be, void *x, const void *pos, int n, int n_heads, int head_dim,
                   const float *inv_freq_host);
template <typename T>
void cuda_gather_rows_i32(const Backend *be, void *dst, const void *src, const void *rows, int n, int dim);
template <typename T>
void cuda_paged_kv_store(const Backend *be, void *k_pool, void *v_pool, const void *k, const void *v,
                         const void *slot_mapping, int n, int kv_dim);
template <typename T>
void cuda_paged_attention(const Backend *be, void *out, const void *q, const void *k_pool, const void *v_pool,
                          const void *block_tables, const void *seq, const void *pos, int n, int n_heads,
                          int n_kv_heads, int head_dim, int block_size, int max_blocks);
template <typename T>
void cuda_paged_attention_rope(const Backend *be, void *out, void *q, void *k_pool, void *v_pool, const void *qkv,
                               const void *block_tables, const void *seq, const void *pos, const void *slot_mapping,
                               int n, int n_heads, int n_kv_heads, int head_dim, const float *inv_freq_host,
                               int block_size,
                               int max_blocks);
/* The training attention (backend.h attention, caches [S, L, KVD]) run by the paged kernel: what
 * cuda_attention does in the deterministic mode, so the trainer's and the engine's attention agree bit
 * for bit. */
template <typename T>
void cuda_attention_paged(CudaState *cs, void *out, const void *q, const void *k_cache, const void *v_cache,
                          const int *slot, const int *pos, int n, int n_heads, int n_kv_heads, int head_dim,
                          int max_len);
/* cuda_fused.cu: the decode step's fused ops (backend.h). */
template <typename T>
void cuda_add_rmsnorm(const Backend *be, void *x, void *xn, const void *delta, const void *w, int n, int dim,
                      float eps);
template <typename T>
void cuda_qkv_rope_store(const Backend *be, void *q, void *k_pool, void *v_pool, const void *qkv, const void *pos,
                         const void *slot_mapping, int n, int n_heads, int n_kv_heads, int head_dim,
                         const float *inv_freq_host);
template <typename T> void cuda_swiglu_gate_up(const Backend *be, void *out, const void *gate_up, int n, int f);
/* cuda_decode_layers.cu: decode_layers (backend.h), bf16 storage only. */
void *cuda_decode_layers_create(const Backend *be, const DecodeLayerWeights *layers, const DecodeDims *dims);
void cuda_decode_layers_free(const Backend *be, void *plan);
bool cuda_decode_layers(const Backend *be, void *plan, void *x, const void *pos, const void *seq,
                        const void *slot_mapping, const void *block_tables, int n);
/* cuda_sample.cu: the sample op (backend.h). */
template <typename T>
void cuda_sample(const Backend *be, void *tokens, void *logprobs, void *logits, int n, int vocab,
                 const struct SamplingParams *p, const void *seq, const void *streams, const void *counters,
                 void *history, void *history_len, int history_stride);

/* cuda_sample.cu: structured outputs' apply_token_bitmask op and the apply_penalties op (backend.h). */
template <typename T>
void cuda_apply_token_bitmask(const Backend *be, void *logits, const void *bitmask, int n, int vocab);
template <typename T>
void cuda_apply_penalties(const Backend *be, void *logits, int n, int vocab, const struct SamplingParams *p,
                          const void *seq, const void *history, const void *history_len, const void *prompt_len,
                          int history_stride, const void *bias_ids, const void *bias_values, const void *bias_len,
                          int bias_stride);

/* cuda_sample.cu (beside the Philox it shares): the dropout op (backend.h). */
template <typename T>
void cuda_dropout(const Backend *be, void *out, const void *x, size_t n, float p, uint64_t seed, uint64_t stream);

/* float <-> storage conversion on the device (upload/download). */
template <typename T> void cuda_convert_from_f32(CudaState *cs, void *dst, const float *src, size_t n);
template <typename T> void cuda_convert_to_f32(CudaState *cs, float *dst, const void *src, size_t n);

#endif
