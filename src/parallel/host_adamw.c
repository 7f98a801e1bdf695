/* host_adamw.c — see host_adamw.h. Built with -fno-math-errno (CMakeLists) so
 * that sqrtf vectorises: the only errno case, sqrt of a negative, cannot
 * happen for v >= 0. The project compiles as ISO C11, where GCC does not
 * contract a * b + c into an FMA, so each operation rounds as the reference's. */
#include "parallel/host_adamw.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/floats.h"

void host_adamw_step_init(HostAdamWStep *s, float lr, float beta1, float beta2, float eps, float weight_decay,
                          float bias_correction1, float bias_correction2) {
    /* As cpu_adamw: 1 - beta from the decimal the user wrote, as torch does. */
    s->decay = (float)(1.0 - (double)lr * weight_decay);
    s->w1 = (float)(1.0 - float_as_decimal(beta1));
    s->w2 = (float)(1.0 - float_as_decimal(beta2));
    s->beta2 = beta2;
    s->step_size = (float)((double)lr / bias_correction1);
    s->bc2_sqrt = (float)sqrt((double)bias_correction2);
    s->eps = eps;
}

/* The element loop, one clone per instruction set (resolved when the program
 * loads). The two forms of the first moment are the reference's: which one
 * depends on w1 only, so each is its own loop and vectorises. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
#define CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define CLONES
#endif

CLONES static void adamw_block(const HostAdamWStep *s, float *restrict p, float *restrict m, float *restrict v,
                               const float *restrict g, size_t n) {
    const float decay = s->decay, w1 = s->w1, w2 = s->w2, beta2 = s->beta2, step_size = s->step_size,
                bc2_sqrt = s->bc2_sqrt, eps = s->eps, one_minus_w1 = 1.0f - w1;
    if (w1 < 0.5f) {
        for (size_t i = 0; i < n; i++) {
            float gi = g[i], pi = p[i] * decay, mi = m[i] + w1 * (gi - m[i]);
            float vi = v[i] * beta2 + w2 * (gi * gi);
            float denom = sqrtf(vi) / bc2_sqrt + eps;
            p[i] = pi + -step_size * (mi / denom);
            m[i] = mi;
            v[i] = vi;
        }
    } else {
        for (size_t i = 0; i < n; i++) {
            float gi = g[i], pi = p[i] * decay, mi = gi - (gi - m[i]) * one_minus_w1;
            float vi = v[i] * beta2 + w2 * (gi * gi);
            float denom = sqrtf(vi) / bc2_sqrt + eps;
            p[i] = pi + -step_size * (mi / denom);
            m[i] = mi;
            v[i] = vi;
        }
    }
}

CLONES static void round_block(uint16_t *restrict out, const float *restrict p, size_t n) {
    for (size_t i = 0; i < n; i++) out[i] = float_to_bf16(p[i]);
}

/* Elements per task: a few hundred KB of the five streams, far more work than
 * a task's scheduling, and a multiple of every vector width. */
#define BLOCK 8192

void host_adamw(const HostAdamWStep *s, float *master, float *m, float *v, const float *grad, void *out,
                DType out_dtype, size_t n, int threads) {
    size_t blocks = (n + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : omp_get_max_threads())
    for (size_t b = 0; b < blocks; b++) {
        size_t i0 = b * BLOCK, len = n - i0 < BLOCK ? n - i0 : BLOCK;
        adamw_block(s, master + i0, m + i0, v + i0, grad + i0, len);
        if (!out) continue;
        if (out_dtype == DTYPE_BF16) round_block((uint16_t *)out + i0, master + i0, len);
        else memcpy((float *)out + i0, master + i0, len * sizeof(float));
    }
}

void host_zero(float *x, size_t n, int threads) {
    size_t blocks = (n + BLOCK - 1) / BLOCK;
#pragma omp parallel for schedule(static) num_threads(threads > 0 ? threads : omp_get_max_threads())
    for (size_t b = 0; b < blocks; b++) {
        size_t i0 = b * BLOCK, len = n - i0 < BLOCK ? n - i0 : BLOCK;
        memset(x + i0, 0, len * sizeof(float));
    }
}

double host_sum_squares(const float *x, size_t n) {
    size_t blocks = (n + BLOCK - 1) / BLOCK;
    double *part = malloc((blocks ? blocks : 1) * sizeof(double));
    if (!part) { /* no memory for the partial sums: one thread, the same blocks */
        double total = 0;
        for (size_t b = 0; b < blocks; b++) {
            size_t i0 = b * BLOCK, len = n - i0 < BLOCK ? n - i0 : BLOCK;
            double s = 0;
            for (size_t i = 0; i < len; i++) s += (double)x[i0 + i] * x[i0 + i];
            total += s;
        }
        return total;
    }
#pragma omp parallel for schedule(static)
    for (size_t b = 0; b < blocks; b++) {
        size_t i0 = b * BLOCK, len = n - i0 < BLOCK ? n - i0 : BLOCK;
        double s = 0;
        for (size_t i = 0; i < len; i++) s += (double)x[i0 + i] * x[i0 + i];
        part[b] = s;
    }
    double total = 0;
    for (size_t b = 0; b < blocks; b++) total += part[b];
    free(part);
    return total;
}
