/* cuda_gemm.cu — linear and linear_backward through cuBLASLt.
 *
 * Row-major PyTorch tensors are column-major transposes, so
 *   out[N,O] = x[N,I] @ w[O,I]^T   is  out^T[O,N] = op_T(w)[O,I] @ x^T[I,N]    (m=O, n=N, k=I)
 *   dx[N,I]  = dy[N,O] @ w[O,I]    is  dx^T[I,N]  = w^T[I,O] @ dy^T[O,N]         (m=I, n=N, k=O)
 *   dw[O,I] += dy^T @ x             is  dw^T[I,O] += x^T[I,N] @ op_T(dy^T)[N,O]   (m=I, n=O, k=N)
 * Compute type CUBLAS_COMPUTE_32F (no TF32 for fp32 storage, so cuda_f32 is a
 * tight check); A/B in the storage type; dw (and db) are fp32. The bias rides
 * the CUBLASLT_EPILOGUE_BIAS epilogue (a per-row vector of the column-major D).
 * Matmul descriptors and the heuristic's algorithm are cached per shape.
 * db is a GEMM too: dy^T @ ones, accumulated into the fp32 db (deterministic).
 *
 * Autotuning: when a plan is first built, up to GEMM_TUNE_ALGOS heuristic
 * algorithms are timed (CUDA events on the backend stream) on the call's own
 * operands and the fastest is kept. Every candidate computes the same product
 * (only the GEMM's rounding/accumulation order may differ). beta = 0 calls are
 * timed in place (the real run overwrites d afterwards); beta != 0 calls write
 * a zeroed scratch D of the same size so the accumulator is not touched.
 * A later candidate replaces the current best only when clearly (> 3%) faster,
 * which keeps the choice stable from run to run. The choice is shared by all
 * shapes of a bucket (dimensions rounded to 3 significant bits) when it is
 * valid for them, so varying token counts do not re-tune. Off by default: the
 * pick comes from timings, so two runs could pick differently and round
 * differently, and on an H200 it gained ~1% of a training step (the heuristic's
 * first algorithm is within ~3% of the best). COLT_GEMM_TUNE=1 turns it on,
 * COLT_GEMM_TUNE=2 also prints the choice per shape to stderr (the instance's
 * option gemm_tune, read at open). Plans and tuned choices are the instance's.
 * Tuning is skipped while the stream is being captured into a CUDA graph. The
 * deterministic mode's split-K-free plans (below) are always tuned: every
 * candidate there gives the same bits, so timing only picks the speed. */
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"

typedef struct GemmKey {
    cudaDataType_t ab_type, cd_type;
    cublasOperation_t trans_a, trans_b;
    int m, n, k, lda, ldb, ldc;
    int bias;       /* epilogue BIAS */
    int split_free; /* only algorithms without split-K (the deterministic mode's linear, below) */
} GemmKey;

#define GEMM_TUNE_ALGOS 8 /* candidates timed per plan (and split-K-free candidates kept) */

typedef struct GemmPlan {
    GemmKey key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    cublasLtMatmulAlgo_t candidates[GEMM_TUNE_ALGOS]; /* split_free plans: the split-K-free algorithms found */
    int n_candidates;
    int used;
} GemmPlan;

#define GEMM_CACHE 256

static void gemm_plan_destroy(GemmPlan *p) {
    if (!p->used) return;
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(p->desc));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->a));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->b));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->c));
    p->used = 0;
}

#define GEMM_TUNE_REPS 3
#define GEMM_TUNE_MAX_REPS 20

static size_t gemm_elem_size(cudaDataType_t t) {
    switch (t) {
    case CUDA_R_32F: return 4;
    case CUDA_R_16BF:
    case CUDA_R_16F: return 2;
    default: return 4;
    }
}

/* Times every candidate on the real operands; returns the index of the fastest
 * (0 when tuning cannot run). Leaves no CUDA error behind. */
static int gemm_tune(CudaState *cs, const GemmPlan *p, const cublasLtMatmulHeuristicResult_t *res, int count,
                     const void *a, const void *b, void *d, float beta) {
    cudaStream_t stream = cs->stream;
    cudaStreamCaptureStatus cap = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(stream, &cap) != cudaSuccess || cap != cudaStreamCaptureStatusNone) {
        (void)cudaGetLastError();
        return 0;
    }
    const GemmKey *key = &p->key;
    void *out = d, *scratch = NULL;
    if (beta != 0.0f) { /* accumulating: never touch the real output */
        size_t bytes = (size_t)key->ldc * key->n * gemm_elem_size(key->cd_type);
        if (cudaMalloc(&scratch, bytes) != cudaSuccess) {
            (void)cudaGetLastError();
            return 0;
        }
        CUDA_CHECK(cudaMemsetAsync(scratch, 0, bytes, stream));
        out = scratch;
    }
    cudaEvent_t ev0, ev1;
    CUDA_CHECK(cudaEventCreate(&ev0));
    CUDA_CHECK(cudaEventCreate(&ev1));
    size_t ws_bytes = CUDA_LT_WORKSPACE_BYTES;
    void *ws = cs->lt_workspace;
    float alpha = 1.0f;
    int best = 0;
    float best_ms = -1.0f, times[GEMM_TUNE_ALGOS];
    for (int i = 0; i < count; i++) {
        times[i] = -1.0f;
        if (res[i].state != CUBLAS_STATUS_SUCCESS || res[i].workspaceSize > ws_bytes) continue;
        /* warm-up run (also rejects an algorithm that fails to launch) sizes the repetitions */
        CUDA_CHECK(cudaEventRecord(ev0, stream));
        if (cublasLtMatmul(cs->lt, p->desc, &alpha, a, p->a, b, p->b, &beta, out, p->c, out, p->c,
                           &res[i].algo, ws, ws_bytes, stream) != CUBLAS_STATUS_SUCCESS) {
            (void)cudaGetLastError();
            continue;
        }
        CUDA_CHECK(cudaEventRecord(ev1, stream));
        CUDA_CHECK(cudaEventSynchronize(ev1));
        float warm_ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&warm_ms, ev0, ev1));
        /* about 0.5 ms of timed work per candidate, between GEMM_TUNE_REPS and 20 runs */
        int reps = warm_ms > 0.0f ? (int)(0.5f / warm_ms) : GEMM_TUNE_MAX_REPS;
        reps = reps < GEMM_TUNE_REPS ? GEMM_TUNE_REPS : reps > GEMM_TUNE_MAX_REPS ? GEMM_TUNE_MAX_REPS : reps;
        CUDA_CHECK(cudaEventRecord(ev0, stream));
        int ok = 1;
        for (int r = 0; r < reps && ok; r++)
            ok = cublasLtMatmul(cs->lt, p->desc, &alpha, a, p->a, b, p->b, &beta, out, p->c, out, p->c,
                                &res[i].algo, ws, ws_bytes, stream) == CUBLAS_STATUS_SUCCESS;
        CUDA_CHECK(cudaEventRecord(ev1, stream));
        CUDA_CHECK(cudaEventSynchronize(ev1));
        if (!ok) {
            (void)cudaGetLastError();
            continue;
        }
        float ms = 0.0f;
        CUDA_CHECK(cudaEventElapsedTime(&ms, ev0, ev1));
        times[i] = ms / reps;
        /* hysteresis toward the heuristic's order keeps the choice stable across runs */
        if (best_ms < 0.0f || times[i] < 0.97f * best_ms) best = i, best_ms = times[i];
    }
    CUDA_CHECK(cudaEventDestroy(ev0));
    CUDA_CHECK(cudaEventDestroy(ev1));
    if (scratch) {
        CUDA_CHECK(cudaStreamSynchronize(stream));
        CUDA_CHECK(cudaFree(scratch));
    }
    if (best_ms < 0.0f) best = 0; /* nothing timed: fall back to the heuristic's first */
    if (cs->opt.gemm_tune >= 2) {
        fprintf(stderr, "gemm tune m=%d n=%d k=%d ta=%d tb=%d ab=%d cd=%d bias=%d beta=%g:", key->m, key->n, key->k,
                (int)key->trans_a, (int)key->trans_b, (int)key->ab_type, (int)key->cd_type, key->bias, beta);
        for (int i = 0; i < count; i++) fprintf(stderr, " %s%.4f", i == best ? "*" : "", times[i]);
        fprintf(stderr, " ms\n");
    }
    return best;
}

/* Tuning results are shared by shapes of one bucket: every dimension rounded up
 * to 3 significant bits (steps of at most 1/4 octave), so token counts that vary
 * from step to step (GRPO batches, logits chunks) do not re-tune every time. */
typedef struct GemmTuned {
    GemmKey bucket;
    cublasLtMatmulAlgo_t algo;
} GemmTuned;

#define GEMM_TUNED_CACHE 1024

/* The instance's plans (a ring of GEMM_CACHE, by key) and tuned choices (by bucket). */
struct CudaGemmCache {
    GemmPlan plans[GEMM_CACHE];
    int plan_next;
    GemmTuned tuned[GEMM_TUNED_CACHE];
    int tuned_count, tuned_next;
};

void cuda_gemm_state_create(CudaState *cs) {
    cs->gemm = (CudaGemmCache *)calloc(1, sizeof(CudaGemmCache));
    CUDA_ASSERT_HOST(cs->gemm != NULL);
}

static int gemm_bucket(int v) {
    if (v <= 8) return v;
    int shift = 0;
    while ((v >> shift) >= 8) shift++;
    int top = (v + (1 << shift) - 1) >> shift; /* round up to 3 significant bits */
    return top << shift;
}

static GemmKey gemm_bucket_key(const GemmKey *key) {
    GemmKey b = *key;
    b.m = gemm_bucket(key->m), b.n = gemm_bucket(key->n), b.k = gemm_bucket(key->k);
    b.lda = gemm_bucket(key->lda), b.ldb = gemm_bucket(key->ldb), b.ldc = gemm_bucket(key->ldc);
    return b;
}

static GemmTuned *gemm_tuned_find(CudaGemmCache *c, const GemmKey *bucket) {
    for (int i = 0; i < c->tuned_count; i++)
        if (memcmp(&c->tuned[i].bucket, bucket, sizeof *bucket) == 0) return &c->tuned[i];
    return NULL;
}

static void gemm_tuned_store(CudaGemmCache *c, const GemmKey *bucket, const cublasLtMatmulAlgo_t *algo) {
    GemmTuned *t = &c->tuned[c->tuned_next];
    c->tuned_next = (c->tuned_next + 1) % GEMM_TUNED_CACHE;
    if (c->tuned_count < GEMM_TUNED_CACHE) c->tuned_count++;
    t->bucket = *bucket;
    t->algo = *algo;
}

/* The layouts of op(B) (k x n) and C (m x n) for key with n columns (the token rows): gemm_plan's
 * for key->n, and the wider shapes the split-K-free search asks the heuristic about. */
static void gemm_layouts_bc(const GemmKey *key, int n, cublasLtMatrixLayout_t *b, cublasLtMatrixLayout_t *c) {
    int b_rows = key->trans_b == CUBLAS_OP_N ? key->k : n, b_cols = key->trans_b == CUBLAS_OP_N ? n : key->k;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(b, key->ab_type, b_rows, b_cols, key->ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(c, key->cd_type, key->m, n, key->ldc));
}

/* ---------------------------------------------------------------- split-K-free algorithms */

/* The deterministic mode needs a linear whose every output row has the same
 * bits whatever the number of rows n. cuBLASLt's algorithms without split-K
 * sum each output over k inside one tile in a fixed order: on an H200 with
 * cuBLAS 13.0 every such algorithm its heuristic offers (Qwen2.5 0.5B-7B
 * projection shapes, n = 1 to 16384, bias or not) gave the same bits as every
 * other, at every n; only split-K (chosen by the heuristic for long k and few
 * rows) changes them. tests/gpu/test_cuda_invariant.c re-checks that on each run,
 * every candidate forced in turn. Candidates: the split-K-free algorithms of
 * the heuristic for this shape and, when it offers fewer than 4 (long k, few
 * rows), those it offers for 1024+ rows that also run this shape; the fastest is
 * kept (timed, gemm_tune), since the choice does not change the bits. */
/* Test hook: -1 the fastest, else candidate k (mod count), on the instance be. */
extern "C" void cuda_gemm_force_candidate(const Backend *be, int k) { cuda_state(be)->opt.gemm_forced_candidate = k; }

static int gemm_splitk_num(const cublasLtMatmulAlgo_t *algo) {
    uint32_t v = 0;
    size_t written = 0;
    CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &v, sizeof v, &written));
    return (int)v;
}

static int gemm_split_free_candidates(CudaState *cs, const GemmPlan *p, cublasLtMatmulPreference_t pref,
                                      cublasLtMatmulHeuristicResult_t out[GEMM_TUNE_ALGOS]) {
    const GemmKey *key = &p->key;
    size_t ws_bytes = CUDA_LT_WORKSPACE_BYTES;
    int count = 0;
    for (int wide = 0; wide < 2 && count < 4; wide++) {
        /* wide: ask for a shape with more rows (key->n is the row count), then check each on the real one */
        int rows = wide ? (key->n < 1024 ? 1024 : key->n * 4) : key->n;
        if (wide && key->n >= 1 << 28) break;
        cublasLtMatrixLayout_t b = p->b, c = p->c;
        if (wide) gemm_layouts_bc(key, rows, &b, &c);
        cublasLtMatmulHeuristicResult_t res[16];
        int found = 0;
        memset(res, 0, sizeof res);
        if (cublasLtMatmulAlgoGetHeuristic(cs->lt, p->desc, p->a, b, c, c, pref, 16, res, &found) !=
            CUBLAS_STATUS_SUCCESS)
            found = 0;
        if (wide) {
            CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(b));
            CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(c));
        }
        for (int i = 0; i < found && count < GEMM_TUNE_ALGOS; i++) {
            if (res[i].state != CUBLAS_STATUS_SUCCESS || gemm_splitk_num(&res[i].algo) != 1) continue;
            cublasLtMatmulHeuristicResult_t chk;
            memset(&chk, 0, sizeof chk);
            if (wide && (cublasLtMatmulAlgoCheck(cs->lt, p->desc, p->a, p->b, p->c, p->c, &res[i].algo,
                                                 &chk) != CUBLAS_STATUS_SUCCESS ||
                         chk.workspaceSize > ws_bytes))
                continue;
            out[count] = res[i];
            if (wide) out[count].workspaceSize = chk.workspaceSize;
            count++;
        }
    }
    (void)cudaGetLastError();
    return count;
}

/* The plan for key; a new one is built and (unless disabled) tuned on this
 * call's operands a, b, d with its beta and bias. */
static GemmPlan *gemm_plan(CudaState *cs, const GemmKey *key, const void *a, const void *b, void *d, float beta,
                           const void *bias) {
    CudaGemmCache *c = cs->gemm;
    for (int i = 0; i < GEMM_CACHE; i++)
        if (c->plans[i].used && memcmp(&c->plans[i].key, key, sizeof *key) == 0) return &c->plans[i];
    GemmPlan *p = &c->plans[c->plan_next];
    c->plan_next = (c->plan_next + 1) % GEMM_CACHE;
    gemm_plan_destroy(p);
    memset(p, 0, sizeof *p);
    p->key = *key;
    CUBLAS_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &key->trans_a,
                                                sizeof key->trans_a));
    CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &key->trans_b,
                                                sizeof key->trans_b));
    if (key->bias) {
        cublasLtEpilogue_t epi = CUBLASLT_EPILOGUE_BIAS;
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi));
        /* The bias type defaults to D's type: the bias is a storage buffer like out. */
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    }
    /* Stored (column-major) shapes: op(A) is m x k, op(B) is k x n. */
    int a_rows = key->trans_a == CUBLAS_OP_N ? key->m : key->k, a_cols = key->trans_a == CUBLAS_OP_N ? key->k : key->m;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, key->ab_type, a_rows, a_cols, key->lda));
    gemm_layouts_bc(key, key->n, &p->b, &p->c);

    size_t ws_bytes = CUDA_LT_WORKSPACE_BYTES;
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                      sizeof ws_bytes));
    cublasLtMatmulHeuristicResult_t results[GEMM_TUNE_ALGOS];
    int found = 0;
    memset(results, 0, sizeof results);
    int tune = cs->opt.gemm_tune > 0 || key->split_free;
    if (key->split_free)
        found = gemm_split_free_candidates(cs, p, pref, results);
    else
        CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(cs->lt, p->desc, p->a, p->b, p->c, p->c, pref,
                                                    tune ? GEMM_TUNE_ALGOS : 1, results, &found));
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    if (found < 1 && key->split_free) { /* the caller falls back to its own kernel */
        gemm_plan_destroy(p);
        return NULL;
    }
    if (found < 1) {
        fprintf(stderr,
                "%s:%d: cuBLASLt has no algorithm for m=%d n=%d k=%d lda=%d ldb=%d ldc=%d transa=%d transb=%d "
                "ab_type=%d cd_type=%d bias=%d\n",
                __FILE__, __LINE__, key->m, key->n, key->k, key->lda, key->ldb, key->ldc, (int)key->trans_a,
                (int)key->trans_b, (int)key->ab_type, (int)key->cd_type, key->bias);
        abort();
    }
    p->algo = results[0].algo;
    if (key->split_free) {
        p->n_candidates = found;
        for (int i = 0; i < found; i++) p->candidates[i] = results[i].algo;
    }
    if (tune && found > 1) {
        /* A shape in an already tuned bucket reuses that choice when it is valid here;
         * otherwise tune now and remember the winner for the bucket. */
        GemmKey bk = gemm_bucket_key(key);
        GemmTuned *t = gemm_tuned_find(c, &bk);
        if (t) {
            cublasLtMatmulHeuristicResult_t chk;
            memset(&chk, 0, sizeof chk);
            if (cublasLtMatmulAlgoCheck(cs->lt, p->desc, p->a, p->b, p->c, p->c, &t->algo, &chk) ==
                    CUBLAS_STATUS_SUCCESS &&
                chk.workspaceSize <= ws_bytes)
                p->algo = t->algo;
            else
                (void)cudaGetLastError();
        } else {
            int pick = gemm_tune(cs, p, results, found, a, b, d, beta);
            p->algo = results[pick].algo;
            gemm_tuned_store(c, &bk, &p->algo);
        }
    }
    p->used = 1;
    return p;
}

/* D = alpha op(A) op(B) + beta C with C = D (in place). False (nothing run)
 * only for a split_free key that no such algorithm serves. */
static bool gemm_run(CudaState *cs, const GemmKey *key, const void *a, const void *b, void *d, float beta,
                     const void *bias) {
    GemmPlan *p = gemm_plan(cs, key, a, b, d, beta, bias);
    if (!p) return false;
    if (key->bias)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    float alpha = 1.0f;
    size_t ws_bytes = CUDA_LT_WORKSPACE_BYTES;
    void *ws = cs->lt_workspace;
    const cublasLtMatmulAlgo_t *algo = &p->algo;
    const int forced = cs->opt.gemm_forced_candidate;
    if (key->split_free && forced >= 0) algo = &p->candidates[forced % p->n_candidates];
    CUBLAS_CHECK(cublasLtMatmul(cs->lt, p->desc, &alpha, a, p->a, b, p->b, &beta, d, p->c, d, p->c, algo,
                                ws, ws_bytes, cs->stream));
    return true;
}

template <typename T>
void cuda_linear(const Backend *be, void *out, const void *x, const void *w, const void *bias, int n, int in_dim,
                 int out_dim) {
    if (n <= 0 || out_dim <= 0) return;
    CudaState *cs = cuda_enter(be);
    if (in_dim <= 0) { /* empty sum: out = bias or 0 */
        CUDA_ASSERT_HOST(bias == NULL);
        CUDA_CHECK(cudaMemsetAsync(out, 0, (size_t)n * out_dim * sizeof(T), cs->stream));
        return;
    }
    /* deterministic mode: the same summation order for every n (cuda_invariant.cu) */
    if (cuda_batch_invariant(cs)) {
        cuda_invariant_linear<T>(cs, out, x, w, bias, n, in_dim, out_dim);
        return;
    }
    /* decode-sized n: a weight-streaming kernel beats cuBLAS's fixed cost (cuda_skinny.cu) */
    if (n <= SKINNY_MAX_ROWS && cuda_skinny_linear<T>(cs, out, x, w, bias, n, in_dim, out_dim)) return;
    GemmKey key;
    memset(&key, 0, sizeof key);
    key.ab_type = CudaType<T>::value;
    key.cd_type = CudaType<T>::value;
    key.trans_a = CUBLAS_OP_T;
    key.trans_b = CUBLAS_OP_N;
    key.m = out_dim, key.n = n, key.k = in_dim;
    key.lda = in_dim, key.ldb = in_dim, key.ldc = out_dim;
    key.bias = bias != NULL;
    gemm_run(cs, &key, w, x, out, 0.0f, bias);
}

/* The deterministic mode's bf16 linear (cuda_invariant.cu calls it): cuBLASLt
 * restricted to split-K-free algorithms, whose row bits do not depend on n (see
 * "split-K-free algorithms" above). Takes shapes with in_dim and out_dim
 * multiples of 8 and 16-byte aligned w and bias (cuBLASLt's fast kernels need
 * them; colt's weights always are); an x or out off that alignment goes through
 * an aligned scratch copy so that the same kernels run. False (nothing run)
 * otherwise; the caller then uses its own kernel. */
bool cuda_linear_split_free(CudaState *cs, void *out, const void *x, const void *w, const void *bias, int n,
                            int in_dim, int out_dim) {
    if (n <= 0 || in_dim % 8 || out_dim % 8 || ((uintptr_t)w & 15) || ((uintptr_t)bias & 15)) return false;
    size_t x_bytes = (size_t)n * in_dim * 2, out_bytes = (size_t)n * out_dim * 2;
    bool x_odd = ((uintptr_t)x & 15) != 0, out_odd = ((uintptr_t)out & 15) != 0;
    size_t need = (x_odd ? (x_bytes + 255) / 256 * 256 : 0) + (out_odd ? out_bytes : 0);
    if (need > cs->split_free_scratch_bytes) {
        if (cs->split_free_scratch) {
            CUDA_CHECK(cudaStreamSynchronize(cs->stream));
            cuda_buffer_regrown(cs);
            CUDA_CHECK(cudaFree(cs->split_free_scratch));
        }
        CUDA_CHECK(cudaMalloc(&cs->split_free_scratch, need));
        cs->split_free_scratch_bytes = need;
    }
    void *scratch = cs->split_free_scratch;
    const void *xa = x;
    void *outa = out;
    if (x_odd) {
        CUDA_CHECK(cudaMemcpyAsync(scratch, x, x_bytes, cudaMemcpyDeviceToDevice, cs->stream));
        xa = scratch;
    }
    if (out_odd) outa = (char *)scratch + (x_odd ? (x_bytes + 255) / 256 * 256 : 0);
    GemmKey key;
    memset(&key, 0, sizeof key);
    key.ab_type = key.cd_type = CUDA_R_16BF;
    key.trans_a = CUBLAS_OP_T;
    key.trans_b = CUBLAS_OP_N;
    key.m = out_dim, key.n = n, key.k = in_dim;
    key.lda = in_dim, key.ldb = in_dim, key.ldc = out_dim;
    key.bias = bias != NULL;
    key.split_free = 1;
    if (!gemm_run(cs, &key, w, xa, outa, 0.0f, bias)) return false;
    if (out_odd) CUDA_CHECK(cudaMemcpyAsync(out, outa, out_bytes, cudaMemcpyDeviceToDevice, cs->stream));
    return true;
}

template <typename T> __global__ void fill_ones_kernel(T *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = from_float<T>(1.0f);
}

/* A vector of n ones in the storage type (the instance's: T), grown (rarely) as n grows; for db. */
template <typename T> static const T *ones_vector(CudaState *cs, int n) {
    CUDA_ASSERT_HOST(sizeof(T) == dtype_size(cs->storage));
    if (n > cs->ones_capacity) {
        int cap = cs->ones_capacity ? cs->ones_capacity : 4096;
        while (cap < n) cap *= 2;
        if (cs->ones) {
            CUDA_CHECK(cudaStreamSynchronize(cs->stream));
            cuda_buffer_regrown(cs);
            CUDA_CHECK(cudaFree(cs->ones));
        }
        CUDA_CHECK(cudaMalloc(&cs->ones, (size_t)cap * sizeof(T)));
        fill_ones_kernel<T><<<cuda_blocks_for((size_t)cap), CUDA_THREADS, 0, cs->stream>>>((T *)cs->ones, (size_t)cap);
        LAUNCH_CHECK(cs);
        cs->ones_capacity = cap;
    }
    return (const T *)cs->ones;
}

template <typename T>
void cuda_linear_backward(const Backend *be, void *dx, void *dw, void *db, const void *dy, const void *x,
                          const void *w, int n, int in_dim, int out_dim, int accumulate_dx) {
    if (n <= 0 || out_dim <= 0 || in_dim <= 0) return;
    CudaState *cs = cuda_enter(be);
    if (dx) {
        GemmKey key;
        memset(&key, 0, sizeof key);
        key.ab_type = CudaType<T>::value;
        key.cd_type = CudaType<T>::value;
        key.trans_a = CUBLAS_OP_N;
        key.trans_b = CUBLAS_OP_N;
        key.m = in_dim, key.n = n, key.k = out_dim;
        key.lda = in_dim, key.ldb = out_dim, key.ldc = in_dim;
        gemm_run(cs, &key, w, dy, dx, accumulate_dx ? 1.0f : 0.0f, NULL);
    }
    if (dw) {
        GemmKey key;
        memset(&key, 0, sizeof key);
        key.ab_type = CudaType<T>::value;
        key.cd_type = CUDA_R_32F;
        key.trans_a = CUBLAS_OP_N;
        key.trans_b = CUBLAS_OP_T;
        key.m = in_dim, key.n = out_dim, key.k = n;
        key.lda = in_dim, key.ldb = out_dim, key.ldc = in_dim;
        gemm_run(cs, &key, x, dy, dw, 1.0f, NULL);
    }
    if (db) { /* db[out_dim] += dy^T @ ones[n]: column sums as a (GEMV-shaped) GEMM */
        GemmKey key;
        memset(&key, 0, sizeof key);
        key.ab_type = CudaType<T>::value;
        key.cd_type = CUDA_R_32F;
        key.trans_a = CUBLAS_OP_N;
        key.trans_b = CUBLAS_OP_N;
        key.m = out_dim, key.n = 1, key.k = n;
        key.lda = out_dim, key.ldb = n, key.ldc = out_dim;
        gemm_run(cs, &key, dy, ones_vector<T>(cs, n), db, 1.0f, NULL);
    }
}

/* Plans (their cuBLASLt descriptors) and the scratch of this file; the device's work is done (close drains
 * the streams first). */
void cuda_gemm_release(CudaState *cs) {
    if (cs->gemm) {
        for (int i = 0; i < GEMM_CACHE; i++) gemm_plan_destroy(&cs->gemm->plans[i]);
        free(cs->gemm);
        cs->gemm = NULL;
    }
    if (cs->split_free_scratch) CUDA_CHECK(cudaFree(cs->split_free_scratch));
    if (cs->ones) CUDA_CHECK(cudaFree(cs->ones));
    cs->split_free_scratch = cs->ones = NULL;
    cs->split_free_scratch_bytes = 0, cs->ones_capacity = 0;
}

size_t cuda_gemm_held_bytes(const CudaState *cs) {
    return cs->split_free_scratch_bytes + (size_t)cs->ones_capacity * dtype_size(cs->storage);
}

#define INSTANTIATE(T)                                                                                             \
    template void cuda_linear<T>(const Backend *, void *, const void *, const void *, const void *, int, int, int); \
    template void cuda_linear_backward<T>(const Backend *, void *, void *, void *, const void *, const void *,      \
                                          const void *, int, int, int, int);
INSTANTIATE(float)
INSTANTIATE(__nv_bfloat16)
