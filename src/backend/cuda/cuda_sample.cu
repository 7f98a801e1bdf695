/* cuda_sample.cu — STUB, being written (the sample op on the GPU). */
#include "backend/cuda/cuda_common.cuh"

template <typename T>
void cuda_sample(void *tokens, void *logprobs, void *logits, int n, int vocab, const struct SamplingParams *p,
                 const void *seq, const void *streams, const void *counters, void *history, void *history_len,
                 int history_stride) {
    CUDA_ASSERT_HOST(!"cuda_sample not written yet");
}

template void cuda_sample<float>(void *, void *, void *, int, int, const struct SamplingParams *, const void *,
                                 const void *, const void *, void *, void *, int);
template void cuda_sample<__nv_bfloat16>(void *, void *, void *, int, int, const struct SamplingParams *,
                                         const void *, const void *, const void *, void *, void *, int);
