/* host_adamw.h — torch.optim.AdamW on the host, for optimizer offload
 * (offload_optimizer: cpu): the fp32 master weights and moments live in host
 * memory, the gradients arrive from the device and the updated weights go back
 * in the storage dtype. The arithmetic is the backend adamw op's, operation by
 * operation (no FMA contraction, IEEE sqrt and division), so an offloaded step
 * gives the same bits as one on the device; vectorised per CPU (AVX-512, AVX2
 * or baseline, chosen at load) and spread over OpenMP threads. */
#ifndef COLT_PARALLEL_HOST_ADAMW_H
#define COLT_PARALLEL_HOST_ADAMW_H

#include <stddef.h>

#include "backend/backend.h"

/* The per-step scalars, derived as the backend ops derive them. */
typedef struct HostAdamWStep {
    float decay, w1, w2, beta2, step_size, bc2_sqrt, eps;
} HostAdamWStep;

void host_adamw_step_init(HostAdamWStep *s, float lr, float beta1, float beta2, float eps, float weight_decay,
                          float bias_correction1, float bias_correction2);

/* One update of n parameters: master[n], m[n], v[n] (fp32, in place) from
 * grad[n]; out[n] receives the new weights in out_dtype (F32 or BF16,
 * rounded to nearest even), NULL for none. threads: OpenMP threads (0: all). */
void host_adamw(const HostAdamWStep *s, float *master, float *m, float *v, const float *grad, void *out,
                DType out_dtype, size_t n, int threads);

/* x[n] = 0 with threads (0: all): the first touch of fresh host memory, spread
 * over the cores, so that its page faults do not land in the first step. */
void host_zero(float *x, size_t n, int threads);

/* Sum of x[i]^2 in double over every core, with the same bits whatever the
 * number of threads: fixed blocks summed in parallel, the blocks' sums added
 * in order (the optimizer's finiteness check and fingerprint on offloaded state). */
double host_sum_squares(const float *x, size_t n);

#endif
