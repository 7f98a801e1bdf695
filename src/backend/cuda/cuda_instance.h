/* cuda_instance.h — what C code may ask a CUDA backend instance (backend.h
 * backend_cuda_open) beyond its op table: its streams, the device memory it
 * holds for itself, and its options. In a build without CUDA the functions
 * are inline stubs (NULL / 0), so callers need no #ifdef.
 *
 * Not here: the op table (backend.h), timing helpers (cuda_bench.h). */
#ifndef COLT_BACKEND_CUDA_INSTANCE_H
#define COLT_BACKEND_CUDA_INSTANCE_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "backend/backend.h" /* C declarations: inside the extern "C" block */

/* The options of one instance. backend_cuda_open reads them from the
 * environment once (the variable beside each field); nothing reads the
 * environment afterwards. Tests and benchmarks change them on an instance
 * through backend_cuda_options; other instances keep theirs. */
typedef struct CudaOptions {
    int sync_each_launch;       /* COLT_CUDA_SYNC=1: synchronise after every kernel (an asynchronous fault is
                                   reported at the kernel that made it) */
    int gemm_tune;              /* COLT_GEMM_TUNE: 0 the heuristic's first cuBLASLt algorithm (default,
                                   reproducible), 1 time the candidates, 2 also print the picks */
    int invariant_parts;        /* COLT_INVARIANT_ONLY=linear|attention: which parts the deterministic mode
                                   switches (1 linear, 2 attention, 3 both: the default) */
    int skinny;                 /* decode-sized linear (cuda_skinny.cu): 1 where it beats cuBLAS (default),
                                   0 off (COLT_NO_SKINNY=1), 2 every shape it takes, 3 the GEMV (tests) */
    int paged_splits;           /* COLT_PAGED_SPLITS=k > 0: paged attention with k key splits; 0 automatic */
    int paged_tc;               /* COLT_PAGED_TC=0: paged attention without the tensor-core kernel */
    int paged_tc_tokens;        /* COLT_PAGED_TC_TOKENS=k > 0: tokens per CTA on the tensor-core path; 0 auto */
    int fused_rope_attn;        /* COLT_FUSED_ROPE_ATTN=0: paged_attention_rope runs rope + store apart */
    int fa_precise;             /* COLT_FA_PRECISE=1: attention backward with P and dS as bf16 hi + lo pairs */
    long fa_ds_max_mb;          /* COLT_FA_DS_MAX_MB (1024): the attention backward's dS blocks' scratch cap */
    int decode_layers_tokens;   /* COLT_DECODE_LAYERS=k: calls of up to k tokens take the all-layers kernel
                                   (0 never); -1 the kernel's default */
    int decode_ring;            /* COLT_DECODE_RING=k >= 0: the all-layers kernel's weight ring rounds
                                   (0 direct loads); -1 picked by timing */
    int decode_profile;         /* COLT_DECODE_PROFILE=1: the all-layers kernel prints its phases' times */
    int sample_split_rows;      /* COLT_SAMPLE_SPLIT_ROWS=k: unfiltered batches of up to k rows sample split
                                   over CTAs (0 never); -1 the default */
    int sample_sequential_find; /* COLT_SAMPLE_SEQUENTIAL_FIND=1: the draw's walk in one thread (reference) */
    int graph_report;           /* COLT_GRAPH_REPORT=1: each recorded CUDA graph's nodes by kind, and its
                                   launch's host time, on stderr */
    /* Test hooks, never from the environment. */
    int gemm_forced_candidate;  /* -1 the fastest split-K-free cuBLASLt candidate, else candidate k */
    int invariant_forced_shape; /* -1 automatic, else the batch-invariant bf16 kernel shape (0..3) */
} CudaOptions;

#ifdef COLT_HAVE_CUDA
/* The instance's streams (cudaStream_t): every op runs on the compute stream;
 * the communication stream is the instance's own for collectives (NCCL), left
 * to the caller to order against the compute stream with events. */
void *backend_cuda_compute_stream(const Backend *be);
void *backend_cuda_comm_stream(const Backend *be);
/* Makes the instance's device current on the calling thread (cudaSetDevice),
 * for code that issues its own CUDA or NCCL calls beside the ops. Ops do this
 * themselves, cheaply: they remember the device last set on the thread, so
 * code that calls cudaSetDevice directly must call this before the next op. */
void backend_cuda_make_current(const Backend *be);
/* Orders the communication stream after everything enqueued so far on the
 * compute stream (an event): a collective enqueued next on the communication
 * stream sees the results of the ops before it, while later ops overlap it. */
void backend_cuda_comm_after_compute(const Backend *be);
/* The PCI bus id of the instance's GPU ("0000:18:00.0"): the same card gets
 * the same id in every process, whatever CUDA_VISIBLE_DEVICES says. */
void backend_cuda_pci_bus_id(const Backend *be, char *out, size_t size);
/* cudaMemGetInfo on the instance's device (0, 0 if the driver will not say). */
void backend_cuda_memory(const Backend *be, size_t *free_bytes, size_t *total_bytes);
/* Device bytes the instance holds for itself outside alloc'd buffers: what
 * backend_cuda_open reserved (cuBLASLt workspace, staging, paged-attention
 * partials, sampling and reduction scratch) plus what its growable scratch
 * has grown to since. Right after the open: the reservation alone. */
size_t backend_cuda_reserved_bytes(const Backend *be);
/* The instance's options (see above), to read or change. */
CudaOptions *backend_cuda_options(const Backend *be);
#else
static inline void *backend_cuda_compute_stream(const Backend *be) { (void)be; return NULL; }
static inline void *backend_cuda_comm_stream(const Backend *be) { (void)be; return NULL; }
static inline void backend_cuda_make_current(const Backend *be) { (void)be; }
static inline void backend_cuda_comm_after_compute(const Backend *be) { (void)be; }
static inline void backend_cuda_pci_bus_id(const Backend *be, char *out, size_t size) {
    (void)be;
    if (size) out[0] = 0;
}
static inline void backend_cuda_memory(const Backend *be, size_t *free_bytes, size_t *total_bytes) {
    (void)be;
    *free_bytes = *total_bytes = 0;
}
static inline size_t backend_cuda_reserved_bytes(const Backend *be) { (void)be; return 0; }
static inline CudaOptions *backend_cuda_options(const Backend *be) { (void)be; return NULL; }
#endif

#ifdef __cplusplus
}
#endif

#endif
