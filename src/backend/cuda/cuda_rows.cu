/* cuda_rows.cu — gather_rows / scatter_rows: moving whole rows by a host index
 * list in one launch (the training lm_head picks the rows that have targets;
 * generation picks the last token of each sequence). One thread per element. */
#include "cuda_common.cuh"

template <typename T>
__global__ void gather_rows_kernel(T *dst, const T *src, const int *rows, int n, int dim) {
    size_t total = (size_t)n * dim;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        size_t i = e / dim, c = e % dim;
        dst[e] = src[(size_t)rows[i] * dim + c];
    }
}

template <typename T>
__global__ void scatter_rows_kernel(T *dst, const T *src, const int *rows, int n, int dim) {
    size_t total = (size_t)n * dim;
    for (size_t e = blockIdx.x * (size_t)blockDim.x + threadIdx.x; e < total; e += (size_t)gridDim.x * blockDim.x) {
        size_t i = e / dim, c = e % dim;
        dst[(size_t)rows[i] * dim + c] = src[e];
    }
}

template <typename T>
void cuda_gather_rows(const Backend *be, void *dst, const void *src, const int *rows, int n, int dim) {
    if (n <= 0 || dim <= 0) return;
    CudaState *cs = cuda_enter(be);
    const int *host[1] = {rows};
    int *d = cuda_upload_indices(cs, host, 1, n);
    gather_rows_kernel<T><<<cuda_blocks_for((size_t)n * dim), CUDA_THREADS, 0, cs->stream>>>(
        (T *)dst, (const T *)src, d, n, dim);
    LAUNCH_CHECK(cs);
}

template <typename T>
void cuda_scatter_rows(const Backend *be, void *dst, const void *src, const int *rows, int n, int dim) {
    if (n <= 0 || dim <= 0) return;
    CudaState *cs = cuda_enter(be);
    const int *host[1] = {rows};
    int *d = cuda_upload_indices(cs, host, 1, n);
    scatter_rows_kernel<T><<<cuda_blocks_for((size_t)n * dim), CUDA_THREADS, 0, cs->stream>>>(
        (T *)dst, (const T *)src, d, n, dim);
    LAUNCH_CHECK(cs);
}

template void cuda_gather_rows<float>(const Backend *, void *, const void *, const int *, int, int);
template void cuda_gather_rows<__nv_bfloat16>(const Backend *, void *, const void *, const int *, int, int);
template void cuda_scatter_rows<float>(const Backend *, void *, const void *, const int *, int, int);
template void cuda_scatter_rows<__nv_bfloat16>(const Backend *, void *, const void *, const int *, int, int);
