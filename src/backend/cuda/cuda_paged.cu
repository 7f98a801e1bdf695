/* cuda_paged.cu — STUB, being written (the engine's [i32] buffers and paged KV cache ops). */
#include "backend/cuda/cuda_common.cuh"

void *cuda_alloc_i32(size_t n) { CUDA_ASSERT_HOST(!"cuda_alloc_i32 not written yet"); return NULL; }
void cuda_upload_i32(void *dst, const int *src, size_t n) { CUDA_ASSERT_HOST(!"not written yet"); }
void cuda_download_i32(int *dst, const void *src, size_t n) { CUDA_ASSERT_HOST(!"not written yet"); }
template <typename T> void cuda_embedding_i32(void *out, const void *table, const void *ids, int n, int dim) {
    CUDA_ASSERT_HOST(!"not written yet");
}
template <typename T> void cuda_rope_i32(void *x, const void *pos, int n, int n_heads, int head_dim, float theta) {
    CUDA_ASSERT_HOST(!"not written yet");
}
template <typename T> void cuda_gather_rows_i32(void *dst, const void *src, const void *rows, int n, int dim) {
    CUDA_ASSERT_HOST(!"not written yet");
}
template <typename T>
void cuda_paged_kv_store(void *k_pool, void *v_pool, const void *k, const void *v, const void *slot_mapping, int n,
                         int kv_dim) {
    CUDA_ASSERT_HOST(!"not written yet");
}
template <typename T>
void cuda_paged_attention(void *out, const void *q, const void *k_pool, const void *v_pool, const void *block_tables,
                          const void *seq, const void *pos, int n, int n_heads, int n_kv_heads, int head_dim,
                          int block_size, int max_blocks) {
    CUDA_ASSERT_HOST(!"not written yet");
}

#define INSTANTIATE(T)                                                                                             \
    template void cuda_embedding_i32<T>(void *, const void *, const void *, int, int);                             \
    template void cuda_rope_i32<T>(void *, const void *, int, int, int, float);                                    \
    template void cuda_gather_rows_i32<T>(void *, const void *, const void *, int, int);                           \
    template void cuda_paged_kv_store<T>(void *, void *, const void *, const void *, const void *, int, int);      \
    template void cuda_paged_attention<T>(void *, const void *, const void *, const void *, const void *,          \
                                          const void *, const void *, int, int, int, int, int, int);
INSTANTIATE(float)
INSTANTIATE(__nv_bfloat16)
