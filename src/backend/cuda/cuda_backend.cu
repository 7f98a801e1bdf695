/* cuda_backend.cu — CUDA backend instances (backend_cuda_open: bf16 storage
 * "cuda", or fp32 storage "cuda_f32", the same kernels), their state, memory
 * and host <-> device transfers, CUDA graphs. The ops live in cuda_gemm.cu,
 * cuda_attention.cu, cuda_ops.cu and the other files beside it.
 *
 * An instance is a Backend whose ctx is a CudaState (cuda_common.cuh): its
 * device, a compute stream every op, upload and download runs on (so an op's
 * result is visible to the next op; download/download_f32/sum_squares
 * synchronise), a communication stream for collectives, its cuBLASLt handle
 * and workspace, staging, scratch, caches, the deterministic mode's switch and
 * its options, read from the environment once, here, at open. Two instances
 * share nothing: they may run on two devices of one process, or side by side
 * on one. Every op first makes its instance's device current on the calling
 * thread (cuda_enter). Not here: memory pools (plain cudaMalloc/cudaFree). */
#include <dlfcn.h>
#include <math.h>
#include <mutex>
#include <string.h>
#include <unordered_map>

#include "backend/cuda/cuda_bench.h"
#include "backend/cuda/cuda_common.cuh"

extern "C" {
#define _Noreturn [[noreturn]] /* core/error.h is C11 */
#include "core/error.h"
#undef _Noreturn
#include "core/log.h"
}

/* ---------------------------------------------------------------- current device */

/* The device this thread last made current through an instance, so that an op
 * on the instance used last costs a compare instead of a driver call. */
static thread_local int t_current_device = -1;

static void cuda_set_current(int device) {
    CUDA_CHECK(cudaSetDevice(device));
    t_current_device = device;
}

CudaState *cuda_enter(const Backend *be) {
    CudaState *cs = cuda_state(be);
    if (t_current_device != cs->device) cuda_set_current(cs->device);
    return cs;
}

CudaState *cuda_enter_checked(const Backend *be) {
    CudaState *cs = cuda_state(be);
    int current = -1;
    if (cudaGetDevice(&current) != cudaSuccess) (void)cudaGetLastError();
    if (current != cs->device || t_current_device != cs->device) cuda_set_current(cs->device);
    return cs;
}

/* ---------------------------------------------------------------- options */

/* What the environment says, the one place it is read (cuda_instance.h lists
 * each variable). Unset or empty variables give the defaults. */
static int env_set(const char *name, const char **value) {
    const char *e = getenv(name);
    *value = e;
    return e && *e;
}

static void cuda_options_from_env(CudaOptions *o) {
    const char *e;
    memset(o, 0, sizeof *o);
    e = getenv("COLT_CUDA_SYNC");
    o->sync_each_launch = e && e[0] == '1';
    o->gemm_tune = env_set("COLT_GEMM_TUNE", &e) ? atoi(e) : 0;
    if (o->gemm_tune < 0) o->gemm_tune = 0;
    e = getenv("COLT_INVARIANT_ONLY");
    o->invariant_parts = e && strcmp(e, "linear") == 0 ? 1 : e && strcmp(e, "attention") == 0 ? 2 : 3;
    o->skinny = !(env_set("COLT_NO_SKINNY", &e) && strcmp(e, "0") != 0);
    o->paged_splits = (e = getenv("COLT_PAGED_SPLITS")) && atoi(e) > 0 ? atoi(e) : 0;
    o->paged_tc = env_set("COLT_PAGED_TC", &e) ? atoi(e) != 0 : 1;
    o->paged_tc_tokens = (e = getenv("COLT_PAGED_TC_TOKENS")) && atoi(e) > 0 ? atoi(e) : 0;
    o->fused_rope_attn = env_set("COLT_FUSED_ROPE_ATTN", &e) ? atoi(e) != 0 : 1;
    o->fa_precise = (e = getenv("COLT_FA_PRECISE")) && atoi(e) > 0;
    o->fa_ds_max_mb = (e = getenv("COLT_FA_DS_MAX_MB")) ? atol(e) : 1024;
    o->decode_layers_tokens = -1;
    if (env_set("COLT_DECODE_LAYERS", &e)) o->decode_layers_tokens = atoi(e) < 0 ? 0 : atoi(e);
    o->decode_ring = -1;
    if (env_set("COLT_DECODE_RING", &e)) o->decode_ring = atoi(e) < 0 ? 0 : atoi(e);
    o->decode_profile = env_set("COLT_DECODE_PROFILE", &e) && atoi(e) > 0;
    o->sample_split_rows = -1;
    if (env_set("COLT_SAMPLE_SPLIT_ROWS", &e)) o->sample_split_rows = atoi(e) < 0 ? 0 : atoi(e);
    o->sample_sequential_find = env_set("COLT_SAMPLE_SEQUENTIAL_FIND", &e) ? atoi(e) : 0;
    o->graph_report = env_set("COLT_GRAPH_REPORT", &e) && atoi(e) > 0;
    o->gemm_forced_candidate = -1;
    o->invariant_forced_shape = -1;
}

/* ---------------------------------------------------------------- state helpers */

int *cuda_upload_indices(CudaState *cs, const int *const *host_arrays, int count, int n) {
    size_t need = (size_t)count * (size_t)(n > 0 ? n : 0);
    CudaIndexEntry *cache = cs->index_cache;
    cs->index_clock++;
    /* Found: the same ints were uploaded recently and their device copy is intact
     * (entries are only rewritten on eviction, stream-ordered after their readers). */
    for (int e = 0; e < CUDA_INDEX_CACHE_ENTRIES; e++) {
        CudaIndexEntry *x = &cache[e];
        if (!x->dev || x->len != need) continue;
        int same = 1;
        for (int k = 0; k < count && same; k++)
            same = n <= 0 || memcmp(x->pinned + (size_t)k * n, host_arrays[k], (size_t)n * sizeof(int)) == 0;
        if (same) {
            x->last_use = cs->index_clock;
            return x->dev;
        }
    }
    /* Not found: refill the least recently used entry. */
    CudaIndexEntry *x = &cache[0];
    for (int e = 1; e < CUDA_INDEX_CACHE_ENTRIES; e++)
        if (cache[e].last_use < x->last_use) x = &cache[e];
    if (x->has_event) CUDA_CHECK(cudaEventSynchronize(x->copied)); /* its pinned ints may still be read */
    if (need > x->cap) {
        size_t cap = x->cap ? x->cap : 4096;
        while (cap < need) cap *= 2;
        /* kernels may still read the old buffer; graphs never hold one (nothing copies from the host while
         * capturing: backend.h), so buffers_epoch stays where it is */
        CUDA_CHECK(cudaStreamSynchronize(cs->stream));
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
    x->last_use = cs->index_clock;
    if (need > 0) {
        CUDA_CHECK(cudaMemcpyAsync(x->dev, x->pinned, need * sizeof(int), cudaMemcpyHostToDevice, cs->stream));
        CUDA_CHECK(cudaEventRecord(x->copied, cs->stream));
    }
    return x->dev;
}

void *cuda_scratch(CudaState *cs, size_t bytes) {
    if (bytes > cs->scratch_cap) {
        size_t cap = cs->scratch_cap ? cs->scratch_cap : ((size_t)1 << 16);
        while (cap < bytes) cap *= 2;
        CUDA_CHECK(cudaStreamSynchronize(cs->stream));
        cuda_buffer_regrown(cs);
        if (cs->scratch) CUDA_CHECK(cudaFree(cs->scratch));
        CUDA_CHECK(cudaMalloc(&cs->scratch, cap));
        cs->scratch_cap = cap;
    }
    return cs->scratch;
}

/* The model's table itself (model_rope_inv_freq), the one the CPU rope reads:
 * the angles are bit-identical. A pageable copy is staged before the call
 * returns, so the host cache may change afterwards. */
const float *cuda_rope_inv_freq(CudaState *cs, int head_dim, const float *inv_freq_host) {
    CUDA_ASSERT_HOST(head_dim % 2 == 0 && head_dim <= 1024 && inv_freq_host != NULL);
    size_t bytes = (size_t)(head_dim / 2) * sizeof(float);
    if (head_dim != cs->rope_head_dim || memcmp(cs->rope_table, inv_freq_host, bytes) != 0) {
        memcpy(cs->rope_table, inv_freq_host, bytes);
        CUDA_CHECK(cudaMemcpyAsync(cs->inv_freq, cs->rope_table, bytes, cudaMemcpyHostToDevice, cs->stream));
        cs->rope_head_dim = head_dim;
    }
    return cs->inv_freq;
}

/* The attribute is the device's (its context's), not the process's: each
 * instance raises it once on its own device, and afterwards finds it here. */
void cuda_smem_optin(CudaState *cs, const void *kernel, size_t bytes) {
    for (int i = 0; i < cs->n_smem_optin; i++)
        if (cs->smem_optin[i].kernel == kernel && cs->smem_optin[i].bytes >= bytes) return;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
    for (int i = 0; i < cs->n_smem_optin; i++)
        if (cs->smem_optin[i].kernel == kernel) {
            cs->smem_optin[i].bytes = bytes;
            return;
        }
    if (cs->n_smem_optin < CUDA_SMEM_OPTINS) cs->smem_optin[cs->n_smem_optin++] = CudaSmemOptin{kernel, bytes};
}

/* ---------------------------------------------------------------- memory */

/* The processes holding memory on the GPU with this PCI bus id, as the driver
 * tells through NVML ("pid 1234 (python3) 70.1 GB, ..."), or "" when it will
 * not (no libnvidia-ml, a container without the pids). NVML is opened with
 * dlopen so that colt does not link it; the few declarations below are its
 * stable C ABI (nvml.h is not part of the CUDA toolkit). */
typedef struct {
    unsigned int pid;
    unsigned long long used_bytes;
    unsigned int gpu_instance, compute_instance;
} NvmlProcessInfo;

static void describe_gpu_holders(const char *bus_id, char *out, size_t size) {
    out[0] = 0;
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return;
    typedef int (*InitFn)(void);
    typedef int (*HandleFn)(const char *, void **);
    typedef int (*ProcsFn)(void *, unsigned int *, NvmlProcessInfo *);
    InitFn init = (InitFn)dlsym(lib, "nvmlInit_v2"), shutdown = (InitFn)dlsym(lib, "nvmlShutdown");
    HandleFn handle = (HandleFn)dlsym(lib, "nvmlDeviceGetHandleByPciBusId_v2");
    ProcsFn procs = (ProcsFn)dlsym(lib, "nvmlDeviceGetComputeRunningProcesses_v3");
    void *dev = NULL;
    NvmlProcessInfo info[16];
    unsigned int n = 16;
    if (init && shutdown && handle && procs && init() == 0) {
        if (handle(bus_id, &dev) == 0 && procs(dev, &n, info) == 0) {
            size_t used = 0;
            for (unsigned int i = 0; i < n && i < 16 && used + 1 < size; i++) {
                char comm[64] = "?", path[64];
                snprintf(path, sizeof path, "/proc/%u/comm", info[i].pid);
                FILE *f = fopen(path, "r");
                if (f) {
                    if (fgets(comm, sizeof comm, f)) comm[strcspn(comm, "\n")] = 0;
                    fclose(f);
                }
                int w = snprintf(out + used, size - used, "%spid %u (%s) %.1f GB", i ? ", " : "", info[i].pid, comm,
                                 info[i].used_bytes / 1e9);
                if (w < 0) break;
                used += (size_t)w;
            }
        }
        shutdown();
    }
    dlclose(lib);
}

/* Out of device memory: one line that says how much was asked for, how much
 * is free and who holds the rest, then exit 1 (a bug it is not). */
static void cuda_out_of_memory(const Backend *be, size_t bytes, cudaError_t e) {
    (void)cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    if (cudaMemGetInfo(&free_b, &total_b) != cudaSuccess) (void)cudaGetLastError();
    char bus[32] = "", holders[512] = "";
    if (cudaDeviceGetPCIBusId(bus, sizeof bus, be->device) == cudaSuccess) describe_gpu_holders(bus, holders, sizeof holders);
    else (void)cudaGetLastError();
    const CudaState *cs = cuda_state(be);
    fprintf(stderr,
            "colt: %s%s%sGPU %d (%s) could not allocate %.2f GB: %s; %.2f GB free of %.2f GB%s%s (lower the batch or "
            "sequence lengths, free the GPU, or use a GPU with more memory)\n",
            cs->alloc_label[0] ? "while allocating " : "", cs->alloc_label, cs->alloc_label[0] ? ": " : "",
            be->device, bus[0] ? bus : "?", bytes / 1e9, cudaGetErrorString(e), free_b / 1e9, total_b / 1e9,
            holders[0] ? "; processes holding it: " : "", holders);
    fflush(stderr);
    exit(1);
}

typedef std::unordered_map<void *, size_t> CudaAllocSizes;

static CudaAllocSizes *alloc_sizes(CudaState *cs) {
    if (!cs->alloc_sizes) cs->alloc_sizes = new CudaAllocSizes();
    return (CudaAllocSizes *)cs->alloc_sizes;
}

static void *cuda_alloc_bytes(const Backend *be, size_t n_elements, size_t elem) {
    CudaState *cs = cuda_enter_checked(be);
    void *p = NULL;
    size_t bytes = (n_elements ? n_elements : 1) * elem;
    cudaError_t e = cudaMalloc(&p, bytes);
    if (e == cudaErrorMemoryAllocation) cuda_out_of_memory(be, bytes, e);
    if (e != cudaSuccess) {
        fprintf(stderr, "%s:%d: cudaMalloc of %zu bytes on device %d failed: %s\n", __FILE__, __LINE__, bytes,
                be->device, cudaGetErrorString(e));
        abort();
    }
    (*alloc_sizes(cs))[p] = bytes;
    cs->mem_in_use += bytes;
    if (cs->mem_in_use > cs->mem_peak) cs->mem_peak = cs->mem_in_use;
    return p;
}

template <typename T> static void *cuda_alloc(const Backend *be, size_t n_elements) {
    return cuda_alloc_bytes(be, n_elements, sizeof(T));
}
static void *cuda_alloc_f32(const Backend *be, size_t n_elements) {
    return cuda_alloc_bytes(be, n_elements, sizeof(float));
}

static void cuda_free(const Backend *be, void *buf) {
    if (!buf) return;
    CudaState *cs = cuda_enter_checked(be);
    CUDA_CHECK(cudaStreamSynchronize(cs->stream));
    CUDA_CHECK(cudaFree(buf));
    CudaAllocSizes *sizes = alloc_sizes(cs);
    auto it = sizes->find(buf); /* absent: an [i32] buffer, not counted */
    if (it != sizes->end()) {
        cs->mem_in_use -= it->second;
        sizes->erase(it);
    }
}

static void cuda_memory_stats(const Backend *be, size_t *in_use, size_t *peak, bool reset_peak) {
    CudaState *cs = cuda_state(be);
    if (reset_peak) cs->mem_peak = cs->mem_in_use;
    if (in_use) *in_use = cs->mem_in_use;
    if (peak) *peak = cs->mem_peak;
}

static void cuda_set_alloc_label(const Backend *be, const char *label) {
    CudaState *cs = cuda_state(be);
    snprintf(cs->alloc_label, sizeof cs->alloc_label, "%s", label ? label : "");
}

static void cuda_copy_to_host(const Backend *be, void *dst, const void *src, size_t bytes) {
    CudaState *cs = cuda_enter(be);
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, cs->stream));
    CUDA_CHECK(cudaStreamSynchronize(cs->stream));
}

static void cuda_copy_from_host(const Backend *be, void *dst, const void *src, size_t bytes) {
    CudaState *cs = cuda_enter(be);
    if (bytes) CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, cs->stream));
    CUDA_CHECK(cudaStreamSynchronize(cs->stream));
}

static void *cuda_alloc_host(const Backend *be, size_t bytes) {
    (void)cuda_enter(be);
    void *p = NULL;
    if (cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable) != cudaSuccess) {
        (void)cudaGetLastError();
        return NULL;
    }
    return p;
}

static void cuda_free_host(const Backend *be, void *p) {
    (void)cuda_enter(be);
    if (p) CUDA_CHECK(cudaFreeHost(p));
}

static void cuda_upload_f32(const Backend *be, void *dst, const float *src, size_t n) {
    if (!n) return;
    CudaState *cs = cuda_enter(be);
    CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyHostToDevice, cs->stream));
}

static void cuda_download_f32(const Backend *be, float *dst, const void *src, size_t n) {
    CudaState *cs = cuda_enter(be);
    if (n) CUDA_CHECK(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost, cs->stream));
    CUDA_CHECK(cudaStreamSynchronize(cs->stream));
}

/* fp32 host -> fp32 staging -> convert kernel, in chunks of the staging size. */
template <typename T> static void cuda_upload(const Backend *be, void *dst, const float *src, size_t n) {
    if constexpr (sizeof(T) == sizeof(float)) {
        cuda_upload_f32(be, dst, src, n);
    } else {
        CudaState *cs = cuda_enter(be);
        for (size_t off = 0; off < n; off += CUDA_STAGING_FLOATS) {
            size_t len = n - off < CUDA_STAGING_FLOATS ? n - off : CUDA_STAGING_FLOATS;
            CUDA_CHECK(cudaMemcpyAsync(cs->staging, src + off, len * sizeof(float), cudaMemcpyHostToDevice,
                                       cs->stream));
            cuda_convert_from_f32<T>(cs, (T *)dst + off, cs->staging, len);
        }
    }
}

template <typename T> static void cuda_download(const Backend *be, float *dst, const void *src, size_t n) {
    if constexpr (sizeof(T) == sizeof(float)) {
        cuda_download_f32(be, dst, src, n);
    } else {
        CudaState *cs = cuda_enter(be);
        for (size_t off = 0; off < n; off += CUDA_STAGING_FLOATS) {
            size_t len = n - off < CUDA_STAGING_FLOATS ? n - off : CUDA_STAGING_FLOATS;
            cuda_convert_to_f32<T>(cs, cs->staging, (const T *)src + off, len);
            CUDA_CHECK(cudaMemcpyAsync(dst + off, cs->staging, len * sizeof(float), cudaMemcpyDeviceToHost,
                                       cs->stream));
        }
        CUDA_CHECK(cudaStreamSynchronize(cs->stream));
    }
}

template <typename T>
static void cuda_copy(const Backend *be, void *dst, size_t dst_offset, const void *src, size_t src_offset, size_t n) {
    if (!n) return;
    CudaState *cs = cuda_enter(be);
    CUDA_CHECK(cudaMemcpyAsync((T *)dst + dst_offset, (const T *)src + src_offset, n * sizeof(T),
                               cudaMemcpyDeviceToDevice, cs->stream));
}

/* Strides and width in storage elements. One row goes as a plain copy:
 * cudaMemcpy2D rejects pitches below the width, which a single row may have. */
template <typename T>
static void cuda_copy_2d(const Backend *be, void *dst, size_t dst_stride, const void *src, size_t src_stride, int rows,
                         int cols) {
    if (rows <= 0 || cols <= 0) return;
    CudaState *cs = cuda_enter(be);
    size_t width = (size_t)cols * sizeof(T);
    if (rows == 1)
        CUDA_CHECK(cudaMemcpyAsync(dst, src, width, cudaMemcpyDeviceToDevice, cs->stream));
    else
        CUDA_CHECK(cudaMemcpy2DAsync(dst, dst_stride * sizeof(T), src, src_stride * sizeof(T), width, (size_t)rows,
                                     cudaMemcpyDeviceToDevice, cs->stream));
}

/* All-zero bits are 0.0 in fp32 and bf16. */
template <typename T> static void cuda_zero(const Backend *be, void *x, size_t n) {
    if (!n) return;
    CudaState *cs = cuda_enter(be);
    CUDA_CHECK(cudaMemsetAsync(x, 0, n * sizeof(T), cs->stream));
}

/* ---------------------------------------------------------------- device control */

static void cuda_memory_info(const Backend *be, size_t *free_bytes, size_t *total_bytes) {
    (void)cuda_enter_checked(be);
    CUDA_CHECK(cudaMemGetInfo(free_bytes, total_bytes));
}

static void cuda_synchronize(const Backend *be) {
    CudaState *cs = cuda_enter(be);
    CUDA_CHECK(cudaStreamSynchronize(cs->stream));
}

/* Graphs record the instance's compute stream. Capture mode "relaxed" lets
 * other threads (and instances) keep using CUDA meanwhile; the ops themselves
 * must not allocate or synchronise. */
static void cuda_capture_begin(const Backend *be) {
    CudaState *cs = cuda_enter_checked(be);
    CUDA_CHECK(cudaStreamSynchronize(cs->stream));
    CUDA_CHECK(cudaStreamBeginCapture(cs->stream, cudaStreamCaptureModeRelaxed));
}

/* COLT_GRAPH_REPORT: the graph's nodes by kind, and what launching it costs
 * the host (three launches, each run to the end before the next). Replaying
 * the step it recorded is harmless: it writes what the step writes. */
static void graph_report(CudaState *cs, cudaGraph_t graph, cudaGraphExec_t exec) {
    size_t n = 0;
    CUDA_CHECK(cudaGraphGetNodes(graph, NULL, &n));
    cudaGraphNode_t *nodes = (cudaGraphNode_t *)malloc(sizeof(cudaGraphNode_t) * (n ? n : 1));
    CUDA_CHECK(cudaGraphGetNodes(graph, nodes, &n));
    int kernels = 0, copies = 0, memsets = 0, other = 0;
    for (size_t i = 0; i < n; i++) {
        cudaGraphNodeType t;
        CUDA_CHECK(cudaGraphNodeGetType(nodes[i], &t));
        if (t == cudaGraphNodeTypeKernel) kernels++;
        else if (t == cudaGraphNodeTypeMemcpy) copies++;
        else if (t == cudaGraphNodeTypeMemset) memsets++;
        else other++;
    }
    free(nodes);
    CUDA_CHECK(cudaStreamSynchronize(cs->stream));
    double launch_ms[3], run_ms[3];
    for (int r = 0; r < 3; r++) {
        double t0 = time_now();
        CUDA_CHECK(cudaGraphLaunch(exec, cs->stream));
        double t1 = time_now();
        CUDA_CHECK(cudaStreamSynchronize(cs->stream));
        launch_ms[r] = 1e3 * (t1 - t0), run_ms[r] = 1e3 * (time_now() - t0);
    }
    fprintf(stderr, "cuda graph: %zu nodes (%d kernels, %d copies, %d memsets, %d other); launch %.3f %.3f %.3f ms "
                    "on the host, done after %.3f %.3f %.3f ms\n",
            n, kernels, copies, memsets, other, launch_ms[0], launch_ms[1], launch_ms[2], run_ms[0], run_ms[1],
            run_ms[2]);
}

static void *cuda_capture_end(const Backend *be) {
    CudaState *cs = cuda_enter(be);
    cudaGraph_t graph;
    cudaGraphExec_t exec;
    CUDA_CHECK(cudaStreamEndCapture(cs->stream, &graph));
    CUDA_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    if (cs->opt.graph_report) graph_report(cs, graph, exec);
    CUDA_CHECK(cudaGraphDestroy(graph));
    return (void *)exec;
}

static uint64_t cuda_buffers_epoch(const Backend *be) { return cuda_state(be)->buffers_epoch; }

static void cuda_graph_launch(const Backend *be, void *graph) {
    CudaState *cs = cuda_enter(be);
    CUDA_CHECK(cudaGraphLaunch((cudaGraphExec_t)graph, cs->stream));
}

static void cuda_graph_free(const Backend *be, void *graph) {
    if (!graph) return;
    CudaState *cs = cuda_enter_checked(be);
    CUDA_CHECK(cudaStreamSynchronize(cs->stream));
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
    b->copy_to_host = cuda_copy_to_host;
    b->copy_from_host = cuda_copy_from_host;
    b->alloc_host = cuda_alloc_host;
    b->free_host = cuda_free_host;
    b->memory_stats = cuda_memory_stats;
    b->set_alloc_label = cuda_set_alloc_label;
    b->gather_rows = cuda_gather_rows<T>;
    b->scatter_rows = cuda_scatter_rows<T>;
    b->linear = cuda_linear<T>;
    b->rmsnorm = cuda_rmsnorm<T>;
    b->rope = cuda_rope<T>;
    b->kv_store = cuda_kv_store<T>;
    b->attention = cuda_attention<T>;
    b->swiglu = cuda_swiglu<T>;
    b->add = cuda_add<T>;
    b->mul_scalar = cuda_mul_scalar<T>;
    b->add_scaled = cuda_add_scaled<T>;
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
    b->log_softmax_entropy_backward = cuda_log_softmax_entropy_backward<T>;
    b->logits_shard_stats = cuda_logits_shard_stats<T>;
    b->log_softmax_shard_backward = cuda_log_softmax_shard_backward<T>;
    b->log_softmax_shard_entropy_backward = cuda_log_softmax_shard_entropy_backward<T>;
    b->copy_2d = cuda_copy_2d<T>;
    b->adamw = cuda_adamw<T>;
    b->sum_squares = cuda_sum_squares;
    b->scale = cuda_scale;
    b->add_f32 = cuda_add_f32;
    b->dropout = cuda_dropout<T>;
    b->alloc_i32 = cuda_alloc_i32;
    b->upload_i32 = cuda_upload_i32;
    b->download_i32 = cuda_download_i32;
    b->vocab_shard_ids_i32 = cuda_vocab_shard_ids_i32;
    b->embedding_i32 = cuda_embedding_i32<T>;
    b->rope_i32 = cuda_rope_i32<T>;
    b->gather_rows_i32 = cuda_gather_rows_i32<T>;
    b->paged_kv_store = cuda_paged_kv_store<T>;
    b->paged_attention = cuda_paged_attention<T>;
    b->paged_attention_rope = cuda_paged_attention_rope<T>;
    b->sample = cuda_sample<T>;
    b->apply_token_bitmask = cuda_apply_token_bitmask<T>;
    b->apply_penalties = cuda_apply_penalties<T>;
    b->add_rmsnorm = cuda_add_rmsnorm<T>;
    b->qkv_rope_store = cuda_qkv_rope_store<T>;
    b->swiglu_gate_up = cuda_swiglu_gate_up<T>;
    if constexpr (sizeof(T) == 2) { /* the all-layers decode kernel is bf16 only */
        b->decode_layers_create = cuda_decode_layers_create;
        b->decode_layers_free = cuda_decode_layers_free;
        b->decode_layers = cuda_decode_layers;
    }
    b->memory_info = cuda_memory_info;
    b->synchronize = cuda_synchronize;
    b->capture_begin = cuda_capture_begin;
    b->buffers_epoch = cuda_buffers_epoch;
    b->capture_end = cuda_capture_end;
    b->graph_launch = cuda_graph_launch;
    b->graph_free = cuda_graph_free;
    b->set_batch_invariant = cuda_set_batch_invariant;
    b->device_kind = BACKEND_DEVICE_GPU;
    b->nccl_capable = true;
    b->device_id = backend_cuda_pci_bus_id;
    b->compute_stream = backend_cuda_compute_stream;
    b->comm_stream = backend_cuda_comm_stream;
    b->comm_after_compute = backend_cuda_comm_after_compute;
    b->reserved_bytes = backend_cuda_reserved_bytes;
}

/* ---------------------------------------------------------------- open and close */

/* Frees what the instance holds, whatever part of the open got done (NULL and
 * zero fields are skipped); the streams are drained first. Not the Backend. */
static void cuda_state_free(CudaState *cs) {
    if (cs->stream) CUDA_CHECK(cudaStreamSynchronize(cs->stream));
    if (cs->comm_stream) CUDA_CHECK(cudaStreamSynchronize(cs->comm_stream));
    cuda_gemm_release(cs);
    cuda_attention_release(cs);
    cuda_paged_release(cs);
    cuda_sum_squares_release(cs);
    cuda_sample_release(cs);
    for (int e = 0; e < CUDA_INDEX_CACHE_ENTRIES; e++) {
        CudaIndexEntry *x = &cs->index_cache[e];
        if (x->has_event) CUDA_CHECK(cudaEventDestroy(x->copied));
        if (x->dev) CUDA_CHECK(cudaFree(x->dev));
        if (x->pinned) CUDA_CHECK(cudaFreeHost(x->pinned));
    }
    void *bufs[] = {cs->scratch, cs->lt_workspace, cs->staging, cs->inv_freq};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++)
        if (bufs[k]) CUDA_CHECK(cudaFree(bufs[k]));
    if (cs->lt) CUBLAS_CHECK(cublasLtDestroy(cs->lt));
    if (cs->stream) CUDA_CHECK(cudaStreamDestroy(cs->stream));
    if (cs->comm_stream) CUDA_CHECK(cudaStreamDestroy(cs->comm_stream));
    if (cs->compute_mark) CUDA_CHECK(cudaEventDestroy(cs->compute_mark));
    delete (CudaAllocSizes *)cs->alloc_sizes;
    free(cs);
}

static void cuda_close_instance(Backend *be) {
    if (!be) return;
    CudaState *cs = cuda_enter_checked(be);
    if (cs->shared) return; /* backend_cuda() / backend_cuda_f32() live as long as the process */
    cuda_state_free(cs);
    free(be);
}

/* A device allocation of the open: false (with err set) when the device cannot give it. */
static bool open_malloc(void **p, size_t bytes, const char *what, int device, size_t *reserved, char *err) {
    cudaError_t e = cudaMalloc(p, bytes);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        *p = NULL;
        errorf(err, "device %d: could not reserve %zu bytes for the %s: %s", device, bytes, what,
               cudaGetErrorString(e));
        return false;
    }
    *reserved += bytes;
    return true;
}

extern "C" Backend *backend_cuda_open(int device, DType storage, char *err) {
    int count = 0;
    cudaError_t e = cudaGetDeviceCount(&count);
    if (e != cudaSuccess || count <= 0) {
        (void)cudaGetLastError(); /* clear the sticky "no device" error */
        errorf(err, "no usable CUDA GPU (%s)", e != cudaSuccess ? cudaGetErrorString(e) : "none visible");
        return NULL;
    }
    if (device < 0 || device >= count) {
        const char *visible = getenv("CUDA_VISIBLE_DEVICES");
        errorf(err, "device %d does not exist (%d visible: CUDA_VISIBLE_DEVICES=%s)", device, count,
               visible ? visible : "unset");
        return NULL;
    }
    if (storage != DTYPE_BF16 && storage != DTYPE_F32) {
        errorf(err, "CUDA storage must be bf16 or fp32");
        return NULL;
    }
    if ((e = cudaSetDevice(device)) != cudaSuccess) {
        (void)cudaGetLastError();
        errorf(err, "device %d: %s", device, cudaGetErrorString(e));
        return NULL;
    }
    t_current_device = device;
    CudaState *cs = (CudaState *)calloc(1, sizeof(CudaState));
    Backend *be = (Backend *)calloc(1, sizeof(Backend));
    CUDA_ASSERT_HOST(cs != NULL && be != NULL);
    cs->device = device;
    cs->storage = storage;
    cs->rope_head_dim = -1;
    cuda_options_from_env(&cs->opt);
    cs->opt_env = cs->opt;
    CUDA_CHECK(cudaDeviceGetAttribute(&cs->sm_count, cudaDevAttrMultiProcessorCount, device));
    if (cs->sm_count <= 0) cs->sm_count = 1;
    CUDA_CHECK(cudaStreamCreateWithFlags(&cs->stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&cs->comm_stream, cudaStreamNonBlocking));
    CUDA_CHECK(cudaEventCreateWithFlags(&cs->compute_mark, cudaEventDisableTiming));
    CUBLAS_CHECK(cublasLtCreate(&cs->lt));
    cuda_gemm_state_create(cs);
    size_t reserved = 0;
    if (!open_malloc(&cs->lt_workspace, CUDA_LT_WORKSPACE_BYTES, "cuBLASLt workspace", device, &reserved, err) ||
        !open_malloc((void **)&cs->staging, CUDA_STAGING_FLOATS * sizeof(float), "upload/download staging", device,
                     &reserved, err) ||
        !open_malloc((void **)&cs->inv_freq, 512 * sizeof(float), "rope table", device, &reserved, err)) {
        cuda_state_free(cs);
        free(be);
        return NULL;
    }
    /* The scratch whose size the open knows: no op allocates it later (nor while a graph is captured). */
    if ((e = cuda_paged_reserve(cs, &reserved)) != cudaSuccess ||
        (e = cuda_sum_squares_reserve(cs, &reserved)) != cudaSuccess ||
        (e = cuda_sample_reserve(cs, &reserved)) != cudaSuccess) {
        (void)cudaGetLastError();
        errorf(err, "device %d: could not reserve the backend's scratch: %s", device, cudaGetErrorString(e));
        cuda_state_free(cs);
        free(be);
        return NULL;
    }
    cs->reserved_bytes = reserved;
    if (storage == DTYPE_BF16) cuda_fill_table<__nv_bfloat16>(be, "cuda", DTYPE_BF16);
    else cuda_fill_table<float>(be, "cuda_f32", DTYPE_F32);
    be->device = device;
    be->ctx = cs;
    be->close_instance = cuda_close_instance;
    cs->be = be;
    return be;
}

extern "C" void backend_cuda_close(Backend *be) { cuda_close_instance(be); }

/* cudaGetDeviceCount initialises the driver but makes no context on any device. */
extern "C" int backend_cuda_device_count(void) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky "no device" error */
        return 0;
    }
    return count > 0 ? count : 0;
}

/* The shared instances: opened on first use (device 0) and kept; NULL, also
 * kept, when there is no GPU. */
static const Backend *cuda_shared(DType storage) {
    static std::mutex lock;
    static Backend *instances[2];
    static bool tried[2];
    const int k = storage == DTYPE_BF16 ? 0 : 1;
    std::lock_guard<std::mutex> guard(lock);
    if (!tried[k]) {
        char err[ERR_LEN];
        tried[k] = true;
        instances[k] = backend_cuda_open(0, storage, err);
        if (instances[k]) {
            cuda_state(instances[k])->shared = 1;
            instances[k]->close_instance = NULL; /* not closable */
        }
    }
    return instances[k];
}

extern "C" const Backend *backend_cuda(void) { return cuda_shared(DTYPE_BF16); }
extern "C" const Backend *backend_cuda_f32(void) { return cuda_shared(DTYPE_F32); }

/* ---------------------------------------------------------------- cuda_instance.h */

extern "C" void *backend_cuda_compute_stream(const Backend *be) { return (void *)cuda_state(be)->stream; }
extern "C" void *backend_cuda_comm_stream(const Backend *be) { return (void *)cuda_state(be)->comm_stream; }
extern "C" void backend_cuda_make_current(const Backend *be) { cuda_set_current(cuda_state(be)->device); }

extern "C" void backend_cuda_comm_after_compute(const Backend *be) {
    CudaState *cs = cuda_enter(be);
    CUDA_CHECK(cudaEventRecord(cs->compute_mark, cs->stream));
    CUDA_CHECK(cudaStreamWaitEvent(cs->comm_stream, cs->compute_mark, 0));
}

extern "C" void backend_cuda_pci_bus_id(const Backend *be, char *out, size_t size) {
    out[0] = 0;
    if (cudaDeviceGetPCIBusId(out, (int)size, cuda_state(be)->device) != cudaSuccess) {
        (void)cudaGetLastError();
        snprintf(out, size, "device %d", cuda_state(be)->device);
    }
}

extern "C" void backend_cuda_memory(const Backend *be, size_t *free_bytes, size_t *total_bytes) {
    cuda_enter(be);
    *free_bytes = *total_bytes = 0;
    if (cudaMemGetInfo(free_bytes, total_bytes) != cudaSuccess) (void)cudaGetLastError();
}

extern "C" size_t backend_cuda_reserved_bytes(const Backend *be) {
    const CudaState *cs = cuda_state(be);
    size_t held = cs->reserved_bytes + cs->scratch_cap + cuda_gemm_held_bytes(cs) + cuda_paged_held_bytes(cs);
    for (int e = 0; e < CUDA_INDEX_CACHE_ENTRIES; e++) held += cs->index_cache[e].cap * sizeof(int);
    return held;
}

extern "C" CudaOptions *backend_cuda_options(const Backend *be) { return &cuda_state(be)->opt; }

/* ---------------------------------------------------------------- benchmarking */

extern "C" double backend_cuda_time_ms(const Backend *be, void (*fn)(void *), void *ctx, int iters) {
    if (!be || iters <= 0) return -1.0;
    CudaState *cs = cuda_enter(be);
    cudaEvent_t start, stop;
    CUDA_CHECK(cudaEventCreate(&start));
    CUDA_CHECK(cudaEventCreate(&stop));
    fn(ctx); /* warm-up: heuristics, descriptor cache, clocks */
    cs = cuda_enter(be);
    CUDA_CHECK(cudaStreamSynchronize(cs->stream));
    CUDA_CHECK(cudaEventRecord(start, cs->stream));
    for (int i = 0; i < iters; i++) fn(ctx);
    cs = cuda_enter(be);
    CUDA_CHECK(cudaEventRecord(stop, cs->stream));
    CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0.0f;
    CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    CUDA_CHECK(cudaEventDestroy(start));
    CUDA_CHECK(cudaEventDestroy(stop));
    return (double)ms / iters;
}
