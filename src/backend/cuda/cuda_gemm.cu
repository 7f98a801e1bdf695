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
 * db is a GEMM too: dy^T @ ones, accumulated into the fp32 db (deterministic). */
#include <string.h>

#include "backend/cuda/cuda_common.cuh"

typedef struct GemmKey {
    cudaDataType_t ab_type, cd_type;
    cublasOperation_t trans_a, trans_b;
    int m, n, k, lda, ldb, ldc;
    int bias; /* epilogue BIAS */
} GemmKey;

typedef struct GemmPlan {
    GemmKey key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t a, b, c;
    cublasLtMatmulAlgo_t algo;
    int used;
} GemmPlan;

#define GEMM_CACHE 256
static GemmPlan g_plans[GEMM_CACHE];
static int g_plan_next = 0;

static void gemm_plan_destroy(GemmPlan *p) {
    if (!p->used) return;
    CUBLAS_CHECK(cublasLtMatmulDescDestroy(p->desc));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->a));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->b));
    CUBLAS_CHECK(cublasLtMatrixLayoutDestroy(p->c));
    p->used = 0;
}

static GemmPlan *gemm_plan(const GemmKey *key) {
    for (int i = 0; i < GEMM_CACHE; i++)
        if (g_plans[i].used && memcmp(&g_plans[i].key, key, sizeof *key) == 0) return &g_plans[i];
    GemmPlan *p = &g_plans[g_plan_next];
    g_plan_next = (g_plan_next + 1) % GEMM_CACHE;
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
    }
    /* Stored (column-major) shapes: op(A) is m x k, op(B) is k x n. */
    int a_rows = key->trans_a == CUBLAS_OP_N ? key->m : key->k, a_cols = key->trans_a == CUBLAS_OP_N ? key->k : key->m;
    int b_rows = key->trans_b == CUBLAS_OP_N ? key->k : key->n, b_cols = key->trans_b == CUBLAS_OP_N ? key->n : key->k;
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->a, key->ab_type, a_rows, a_cols, key->lda));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->b, key->ab_type, b_rows, b_cols, key->ldb));
    CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p->c, key->cd_type, key->m, key->n, key->ldc));

    size_t ws_bytes = 0;
    (void)cuda_lt_workspace(&ws_bytes);
    cublasLtMatmulPreference_t pref;
    CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                      sizeof ws_bytes));
    cublasLtMatmulHeuristicResult_t result;
    int found = 0;
    memset(&result, 0, sizeof result);
    CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(cuda_lt_handle(), p->desc, p->a, p->b, p->c, p->c, pref, 1, &result,
                                                &found));
    CUBLAS_CHECK(cublasLtMatmulPreferenceDestroy(pref));
    if (found < 1) {
        fprintf(stderr,
                "%s:%d: cuBLASLt has no algorithm for m=%d n=%d k=%d lda=%d ldb=%d ldc=%d transa=%d transb=%d "
                "ab_type=%d cd_type=%d bias=%d\n",
                __FILE__, __LINE__, key->m, key->n, key->k, key->lda, key->ldb, key->ldc, (int)key->trans_a,
                (int)key->trans_b, (int)key->ab_type, (int)key->cd_type, key->bias);
        abort();
    }
    p->algo = result.algo;
    p->used = 1;
    return p;
}

/* D = alpha op(A) op(B) + beta C with C = D (in place). */
static void gemm_run(const GemmKey *key, const void *a, const void *b, void *d, float beta, const void *bias) {
    GemmPlan *p = gemm_plan(key);
    if (key->bias)
        CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias));
    float alpha = 1.0f;
    size_t ws_bytes = 0;
    void *ws = cuda_lt_workspace(&ws_bytes);
    CUBLAS_CHECK(cublasLtMatmul(cuda_lt_handle(), p->desc, &alpha, a, p->a, b, p->b, &beta, d, p->c, d, p->c,
                                &p->algo, ws, ws_bytes, cuda_stream()));
}

template <typename T>
void cuda_linear(void *out, const void *x, const void *w, const void *bias, int n, int in_dim, int out_dim) {
    if (n <= 0 || out_dim <= 0) return;
    if (in_dim <= 0) { /* empty sum: out = bias or 0 */
        CUDA_ASSERT_HOST(bias == NULL);
        CUDA_CHECK(cudaMemsetAsync(out, 0, (size_t)n * out_dim * sizeof(T), cuda_stream()));
        return;
    }
    GemmKey key;
    memset(&key, 0, sizeof key);
    key.ab_type = CudaType<T>::value;
    key.cd_type = CudaType<T>::value;
    key.trans_a = CUBLAS_OP_T;
    key.trans_b = CUBLAS_OP_N;
    key.m = out_dim, key.n = n, key.k = in_dim;
    key.lda = in_dim, key.ldb = in_dim, key.ldc = out_dim;
    key.bias = bias != NULL;
    gemm_run(&key, w, x, out, 0.0f, bias);
}

template <typename T> __global__ void fill_ones_kernel(T *x, size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        x[i] = from_float<T>(1.0f);
}

/* A vector of n ones in the storage type, grown (rarely) as n grows; for db. */
template <typename T> static const T *ones_vector(int n) {
    static T *ones = NULL;
    static int capacity = 0;
    if (n > capacity) {
        int cap = capacity ? capacity : 4096;
        while (cap < n) cap *= 2;
        if (ones) {
            CUDA_CHECK(cudaStreamSynchronize(cuda_stream()));
            CUDA_CHECK(cudaFree(ones));
        }
        CUDA_CHECK(cudaMalloc((void **)&ones, (size_t)cap * sizeof(T)));
        fill_ones_kernel<T><<<cuda_blocks_for((size_t)cap), CUDA_THREADS, 0, cuda_stream()>>>(ones, (size_t)cap);
        LAUNCH_CHECK();
        capacity = cap;
    }
    return ones;
}

template <typename T>
void cuda_linear_backward(void *dx, void *dw, void *db, const void *dy, const void *x, const void *w, int n,
                          int in_dim, int out_dim, int accumulate_dx) {
    if (n <= 0 || out_dim <= 0 || in_dim <= 0) return;
    if (dx) {
        GemmKey key;
        memset(&key, 0, sizeof key);
        key.ab_type = CudaType<T>::value;
        key.cd_type = CudaType<T>::value;
        key.trans_a = CUBLAS_OP_N;
        key.trans_b = CUBLAS_OP_N;
        key.m = in_dim, key.n = n, key.k = out_dim;
        key.lda = in_dim, key.ldb = out_dim, key.ldc = in_dim;
        gemm_run(&key, w, dy, dx, accumulate_dx ? 1.0f : 0.0f, NULL);
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
        gemm_run(&key, x, dy, dw, 1.0f, NULL);
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
        gemm_run(&key, dy, ones_vector<T>(n), db, 1.0f, NULL);
    }
}

#define INSTANTIATE(T)                                                                                            \
    template void cuda_linear<T>(void *, const void *, const void *, const void *, int, int, int);               \
    template void cuda_linear_backward<T>(void *, void *, void *, const void *, const void *, const void *, int, \
                                          int, int, int);
INSTANTIATE(float)
INSTANTIATE(__nv_bfloat16)
