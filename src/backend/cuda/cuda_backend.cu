/* cuda_backend.cu — the CUDA op tables (backend_cuda: bf16 storage,
 * backend_cuda_f32: fp32 storage, same kernels), device state, memory and
 * host <-> device transfers. The ops live in cuda_gemm.cu, cuda_attention.cu
 * and cuda_ops.cu.
 *
 * Everything runs on one stream shared by both tables, so an op's result is
 * visible to the next op; download/download_f32/sum_squares synchronise.
 * Not here: multi-GPU, CUDA graphs, memory pools (plain cudaMalloc/cudaFree). */
#include <math.h>
#include <string.h>

#include "backend/cuda/cuda_bench.h"
#include "backend/cuda/cuda_common.cuh"

int g_cuda_sync_each_launch = 0;

/* ---------------------------------------------------------------- state */

#define CUDA_LT_WORKSPACE_BYTES (32u << 20)
#define CUDA_STAGING_FLOATS ((size_t)8 << 20) /* 32 MiB of fp32 staging for upload/download conversion */

/* A recent upload of index arrays: the ints in pinned host memory (so the copy
 * is truly asynchronous) and on the device. Ops pass the same pos/slot arrays
 * to every layer, so most uploads are found here and cost a memcmp. */
#define INDEX_CACHE_ENTRIES 8
typedef struct IndexEntry {
    int *pinned, *dev;   /* [cap] */
    size_t cap, len;     /* in ints */
    uint64_t last_use;
    cudaEvent_t copied;  /* the last copy out of pinned */
    int has_event;
} IndexEntry;

typedef struct CudaState {
    int ready;  /* 1 usable, -1 no GPU */
    cudaStream_t stream;
    cublasLtHandle_t lt;
    void *lt_workspace;
    float *staging;       /* [CUDA_STAGING_FLOATS] */
    IndexEntry index_cache[INDEX_CACHE_ENTRIES]; /* recent index uploads (cuda_upload_indices) */
    uint64_t index_clock;
    void *scratch;        /* growable general scratch */
    size_t scratch_cap;   /* in bytes */
    float *inv_freq;      /* [512] rope table for (rope_head_dim, rope_theta) */
    int rope_head_dim;
    float rope_theta;
} CudaState;

static CudaState g_cuda;

static int cuda_init(void) {
    if (g_cuda.ready) return g_cuda.ready > 0;
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count <= 0) {
        (void)cudaGetLastError(); /* clear the sticky "no device" error */
        g_cuda.ready = -1;
        return 0;
    }
    const char *sync = getenv("COLT_CUDA_SYNC");
    g_cuda_sync_each_launch = sync && sync[0] == '1';
    CUDA_CHECK(cudaSetDevice(0));
    CUDA_CHECK(cudaStreamCreateWithFlags(&g_cuda.stream, cudaStreamNonBlocking));
    CUBLAS_CHECK(cublasLtCreate(&g_cuda.lt));
    CUDA_CHECK(cudaMalloc(&g_cuda.lt_workspace, CUDA_LT_WORKSPACE_BYTES));
    CUDA_CHECK(cudaMalloc((void **)&g_cuda.staging, CUDA_STAGING_FLOATS * sizeof(float)));
    CUDA_CHECK(cudaMalloc((void **)&g_cuda.inv_freq, 512 * sizeof(float)));
    g_cuda.rope_head_dim = -1;
    g_cuda.ready = 1;
    return 1;
}

cudaStream_t cuda_stream(void) { return g_cuda.stream; }

int cuda_sm_count(void) {
    static int sms = 0;
    if (!sms) {
        int dev = 0;
        CUDA_CHECK(cudaGetDevice(&dev));
        CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev));
        if (sms <= 0) sms = 1;
    }
    return sms;
}
cublasLtHandle_t cuda_lt_handle(void) { return g_cuda.lt; }
void *cuda_lt_workspace(size_t *bytes) {
    *bytes = CUDA_LT_WORKSPACE_BYTES;
    return g_cuda.lt_workspace;
}

int *cuda_upload_indices(const int *const *host_arrays, int count, int n) {
    size_t need = (size_t)count * (size_t)(n > 0 ? n : 0);
    IndexEntry *cache = g_cuda.index_cache;
    g_cuda.index_clock++;
    /* Found: the same ints were uploaded recently and their device copy is intact
     * (entries are only rewritten on eviction, stream-ordered after their readers). */
    for (int e = 0; e < INDEX_CACHE_ENTRIES; e++) {
        IndexEntry *x = &cache[e];
        if (!x->dev || x->len != need) continue;
        int same = 1;
        for (int k = 0; k < count && same; k++)
            same = n <= 0 || memcmp(x->pinned + (size_t)k * n, host_arrays[k], (size_t)n * sizeof(int)) == 0;
        if (same) {
            x->last_use = g_cuda.index_clock;
            return x->dev;
        }
    }
    /* Not found: refill the least recently used entry. */
    IndexEntry *x = &cache[0];
    for (int e = 1; e < INDEX_CACHE_ENTRIES; e++)
        if (cache[e].last_use < x->last_use) x = &cache[e];
    if (x->has_event) CUDA_CHECK(cudaEventSynchronize(x->copied)); /* its pinned ints may still be read */
    if (need > x->cap) {
        size_t cap = x->cap ? x->cap : 4096;
        while (cap < need) cap *= 2;
        CUDA_CHECK(cudaStreamSynchronize(g_cuda.stream)); /* kernels may still read the old buffer */
        if (x->dev) CUDA_CHECK(cudaFree(x->dev));
        if (x->pinned) CUDA_CHECK(cudaFreeHost(x->pinned));
        CUDA_CHECK(cudaMalloc((void **)&x->dev, cap * sizeof(int)));
        CUDA_CHECK(cudaMallocHost((void **)&x->pinned, cap * sizeof(int)));
        x->cap = cap;
    }
    if (!x->has_event) {
        CUDA_CHECK(cudaEventCreateWithFlags(&x->copied, cudaEventDisableTiming));
        x->has_event = 1;
    }
    for (int k = 0; k < count && n > 0; k++) memcpy(x->pinned + (size_t)k * n, host_arrays[k], (size_t)n * sizeof(int));
    x->len = need;
    x->last_use = g_cuda.index_clock;
    if (need > 0) {
        CUDA_CHECK(cudaMemcpyAsync(x->dev, x->pinned, need * sizeof(int), cudaMemcpyHostToDevice, g_cuda.stream));
        CUDA_CHECK(cudaEventRecord(x->copied, g_cuda.stream));
    }
    return x->dev;
}

int cuda_env_int(const char *name, int fallback) {
    const char *e = getenv(name);
    return e && *e ? atoi(e) : fallback;
}

void *cuda_scratch(size_t bytes) {
    if (bytes > g_cuda.scratch_cap) {
        size_t cap = g_cuda.scratch_cap ? g_cuda.scratch_cap : ((size_t)1 << 16);
        while (cap < bytes) cap *= 2;
        CUDA_CHECK(cudaStreamSynchronize(g_cuda.stream));
        if (g_cuda.scratch) CUDA_CHECK(cudaFree(g_cuda.scratch));
        CUDA_CHECK(cudaMalloc(&g_cuda.scratch, cap));
        g_cuda.scratch_cap = cap;
    }
    return g_cuda.scratch;
}

/* The same expression, in the same host libm, as cpu_rope: the table is bit-identical. */
const float *cuda_rope_inv_freq(int head_dim, float theta) {
    CUDA_ASSERT_HOST(head_dim % 2 == 0 && head_dim <= 1024);
    if (head_dim != g_cuda.rope_head_dim || theta != g_cuda.rope_theta) {
        float table[512];
        for (int j = 0; j < head_dim / 2; j++) {
            float exponent = (float)(2 * j) / (float)head_dim;
            table[j] = 1.0f / ::powf(theta, exponent);
        }
        CUDA_CHECK(cudaMemcpyAsync(g_cuda.inv_freq, table, (size_t)(head_dim / 2) * sizeof(float),
                                   cudaMemcpyHostToDevice, g_cuda.stream));
        g_cuda.rope_head_dim = head_dim;
        g_cuda.rope_theta = theta;
    }
    return g_cuda.inv_freq;
}

/* ---------------------------------------------------------------- memory */

static void *cuda_alloc_bytes(size_t n_elements, size_t elem) {
    void *p = NULL;
    size_t bytes = (n_elements ? n_elements : 1) * elem;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e != cudaSuccess) {
        fprintf(stderr, "%s:%d: cudaMalloc of %zu bytes failed: %s\n", __FILE__, __LINE__, bytes,
                cudaGetErrorString(e));
        abort();
    }
    return p;
}

template <typename T> static void *cuda_alloc(size_t n_elements) { return cuda_alloc_bytes(n_elements, sizeof(T)); }
static void *cuda_alloc_f32(size_t n_elements) { return cuda_alloc_bytes(n_elements, sizeof(float)); }

static void cuda_free(void *buf) {
    if (!buf) return;
    CUDA_CHECK(cudaStreamSynchronize(g_cuda.stream));
    CUDA_CHECK(cudaFree(buf));
}

static void cuda_upload_f32(void *dst, const float *src, size_t n) {
    if (!n) return;
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice, g_cuda.stream));
}

static void cuda_download_f32(float *dst, const void *src, size_t n) {
    if (n) CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost, g_cuda.stream));
    CUDA_CHECK(cudaStreamSynchronize(g_cuda.stream));
}

/* fp32 host -> fp32 staging -> convert kernel, in chunks of the staging size. */
template <typename T> static void cuda_upload(void *dst, const float *src, size_t n) {
    if constexpr (sizeof(T) == sizeof(float)) {
        cuda_upload_f32(dst, src, n);
    } else {
        for (size_t off = 0; off < n; off += CUDA_STAGING_FLOATS) {
            size_t len = n - off < CUDA_STAGING_FLOATS ? n - off : CUDA_STAGING_FLOATS;
            CUDA_CHECK(cudaMemcpyAsync(g_cuda.staging, src + off, len * sizeof(float), cudaMemcpyHostToDevice,
                                       g_cuda.stream));
            cuda_convert_from_f32<T>((T *)dst + off, g_cuda.staging, len);
        }
    }
}

template <typename T> static void cuda_download(float *dst, const void *src, size_t n) {
    if constexpr (sizeof(T) == sizeof(float)) {
        cuda_download_f32(dst, src, n);
    } else {
        for (size_t off = 0; off < n; off += CUDA_STAGING_FLOATS) {
            size_t len = n - off < CUDA_STAGING_FLOATS ? n - off : CUDA_STAGING_FLOATS;
            cuda_convert_to_f32<T>(g_cuda.staging, (const T *)src + off, len);
            CUDA_CHECK(cudaMemcpyAsync(dst + off, g_cuda.staging, len * sizeof(float), cudaMemcpyDeviceToHost,
                                       g_cuda.stream));
        }
        CUDA_CHECK(cudaStreamSynchronize(g_cuda.stream));
    }
}

template <typename T>
static void cuda_copy(void *dst, size_t dst_offset, const void *src, size_t src_offset, size_t n) {
    if (!n) return;
    CUDA_CHECK(cudaMemcpyAsync((T *)dst + dst_offset, (const T *)src + src_offset, n * sizeof(T),
                               cudaMemcpyDeviceToDevice, g_cuda.stream));
}

/* All-zero bits are 0.0 in fp32 and bf16. */
template <typename T> static void cuda_zero(void *x, size_t n) {
    if (n) CUDA_CHECK(cudaMemsetAsync(x, 0, n * sizeof(T), g_cuda.stream));
}

/* ---------------------------------------------------------------- device control */

static void cuda_memory_info(size_t *free_bytes, size_t *total_bytes) {
    CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}

/* Graphs record the one stream. Capture mode "relaxed" lets other threads keep
 * using CUDA meanwhile; the ops themselves must not allocate or synchronise. */
static void cuda_capture_begin(void) {
    CUDA_CHECK(cudaStreamSynchronize(g_cuda.stream));
    CUDA_CHECK(cudaStreamBeginCapture(g_cuda.stream, cudaStreamCaptureModeRelaxed));
}

static void *cuda_capture_end(void) {
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamEndCapture(g_cuda.stream, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    CUDA_CHECK(cudaGraphDestroy(graph));
    return (void *)exec;
}

static void cuda_graph_launch(void *graph) {
    CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)graph, g_cuda.stream));
}

static void cuda_graph_free(void *graph) {
    if (!graph) return;
    CUDA_CHECK(cudaStreamSynchronize(g_cuda.stream));
    CUDA_CHECK(cudaGraphExecDestroy((cudaGraphExec_t)graph));
}


/* ---------------------------------------------------------------- tables */

template <typename T> static void cuda_fill_table(Backend *b, const char *name, DType storage) {
    memset(b, 0, sizeof *b);
    b->name = name;
    b->storage = storage;
    b->logits_chunk_rows = 1024;
    b->alloc = cuda_alloc<T>;
    b->alloc_f32 = cuda_alloc_f32;
    b->free = cuda_free;
    b->upload = cuda_upload<T>;
    b->download = cuda_download<T>;
    b->upload_f32 = cuda_upload_f32;
    b->download_f32 = cuda_download_f32;
    b->copy = cuda_copy<T>;
    b->gather_rows = cuda_gather_rows<T>;
    b->scatter_rows = cuda_scatter_rows<T>;
    b->linear = cuda_linear<T>;
    b->rmsnorm = cuda_rmsnorm<T>;
    b->rope = cuda_rope<T>;
    b->kv_store = cuda_kv_store<T>;
    b->attention = cuda_attention<T>;
    b->swiglu = cuda_swiglu<T>;
    b->add = cuda_add<T>;
    b->embedding = cuda_embedding<T>;
    b->zero = cuda_zero<T>;
    b->zero_f32 = cuda_zero<float>;
    b->linear_backward = cuda_linear_backward<T>;
    b->rmsnorm_backward = cuda_rmsnorm_backward<T>;
    b->rope_backward = cuda_rope_backward<T>;
    b->kv_gather = cuda_kv_gather<T>;
    b->attention_backward = cuda_attention_backward<T>;
    b->swiglu_backward = cuda_swiglu_backward<T>;
    b->embedding_backward = cuda_embedding_backward<T>;
    b->log_softmax_target = cuda_log_softmax_target<T>;
    b->log_softmax_target_backward = cuda_log_softmax_target_backward<T>;
    b->adamw = cuda_adamw<T>;
    b->sum_squares = cuda_sum_squares;
    b->scale = cuda_scale;
    b->alloc_i32 = cuda_alloc_i32;
    b->upload_i32 = cuda_upload_i32;
    b->download_i32 = cuda_download_i32;
    b->embedding_i32 = cuda_embedding_i32<T>;
    b->rope_i32 = cuda_rope_i32<T>;
    b->gather_rows_i32 = cuda_gather_rows_i32<T>;
    b->paged_kv_store = cuda_paged_kv_store<T>;
    b->paged_attention = cuda_paged_attention<T>;
    b->paged_attention_rope = cuda_paged_attention_rope<T>;
    b->sample = cuda_sample<T>;
    b->add_rmsnorm = cuda_add_rmsnorm<T>;
    b->qkv_rope_store = cuda_qkv_rope_store<T>;
    b->swiglu_gate_up = cuda_swiglu_gate_up<T>;
    b->memory_info = cuda_memory_info;
    b->synchronize = backend_cuda_synchronize;
    b->capture_begin = cuda_capture_begin;
    b->capture_end = cuda_capture_end;
    b->graph_launch = cuda_graph_launch;
    b->graph_free = cuda_graph_free;
    b->set_batch_invariant = cuda_set_batch_invariant;
}

static Backend g_table_bf16, g_table_f32;

extern "C" const Backend *backend_cuda(void) {
    static int filled = 0;
    if (!cuda_init()) return NULL;
    if (!filled) {
        cuda_fill_table<__nv_bfloat16>(&g_table_bf16, "cuda", DTYPE_BF16);
        g_table_bf16.decode_layers_create = cuda_decode_layers_create; /* bf16 only */
        g_table_bf16.decode_layers_free = cuda_decode_layers_free;
        g_table_bf16.decode_layers = cuda_decode_layers;
        filled = 1;
    }
    return &g_table_bf16;
}

extern "C" const Backend *backend_cuda_f32(void) {
    static int filled = 0;
    if (!cuda_init()) return NULL;
    if (!filled) cuda_fill_table<float>(&g_table_f32, "cuda_f32", DTYPE_F32), filled = 1;
    return &g_table_f32;
}

/* ---------------------------------------------------------------- benchmarking */

extern "C" double backend_cuda_time_ms(void (*fn)(void *), void *ctx, int iters) {
    if (!cuda_init() || iters <= 0) return -1.0;
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    fn(ctx); /* warm-up: heuristics, descriptor cache, clocks */
    CUDA_CHECK(cudaStreamSynchronize(g_cuda.stream));
    CUDA_CHECK(cudaEventRecord(start, g_cuda.stream));
    for (int i = 0; i < iters; i++) fn(ctx);
    CUDA_CHECK(cudaEventRecord(stop, g_cuda.stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    return (double)ms / iters;
}

extern "C" void backend_cuda_synchronize(void) {
    if (cuda_init()) CUDA_CHECK(cudaStreamSynchronize(g_cuda.stream));
}
