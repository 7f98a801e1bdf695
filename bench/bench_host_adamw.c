/* bench_host_adamw.c — the offloaded optimizer's host AdamW (parallel/host_adamw.h)
 * against the host's memory bandwidth, for 1 thread up to every core.
 *
 * One update of n parameters reads the gradient, the fp32 master weight and
 * both moments (16 bytes) and writes the master, the moments and the bf16
 * weight (14 bytes): 30 bytes per parameter. The bandwidth reference is
 * glibc's (vectorised) memcpy of an array as large, split over the same
 * threads (8 bytes moved per float: read and write). Prints a markdown table.
 * Usage: bench_host_adamw [millions of parameters, default 256] */
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench_common.h"
#include "core/log.h"
#include "parallel/host_adamw.h"

static double copy_time(float *dst, const float *src, size_t n, int threads) {
    double t0 = time_now();
#pragma omp parallel num_threads(threads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        size_t lo = n * (size_t)t / (size_t)nt, hi = n * (size_t)(t + 1) / (size_t)nt;
        memcpy(dst + lo, src + lo, (hi - lo) * sizeof(float));
    }
    return time_now() - t0;
}

int main(int argc, char **argv) {
    size_t millions = argc > 1 ? (size_t)atol(argv[1]) : 256;
    size_t n = millions << 20;
    float *master = malloc(n * 4), *m = malloc(n * 4), *v = malloc(n * 4), *g = malloc(n * 4);
    uint16_t *out = malloc(n * 2);
    if (!master || !m || !v || !g || !out) {
        fprintf(stderr, "bench_host_adamw: cannot allocate %.1f GB\n", n * 18.0 / 1e9);
        return 1;
    }
    /* Touch everything once with every thread (first-touch placement). */
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        master[i] = 0.01f * (float)(i % 1000);
        m[i] = 0.0f;
        v[i] = 0.0f;
        g[i] = 1e-3f * (float)((i * 2654435761u) % 2001) - 1.0f;
        out[i] = 0;
    }
    char cpu[256];
    bench_cpu_model_name(cpu, sizeof cpu);
    int max_threads = omp_get_max_threads();
    printf("host AdamW (offload_optimizer cpu) on %s, %d threads available, %zu M parameters (%.1f GB of state)\n\n",
           cpu, max_threads, millions, n * 12.0 / 1e9);
    printf("| threads | AdamW s | params/s | GB/s (30 B/param) | memcpy GB/s (8 B/float) | AdamW / memcpy |\n");
    printf("|---:|---:|---:|---:|---:|---:|\n");
    HostAdamWStep s;
    host_adamw_step_init(&s, 1e-6f, 0.9f, 0.999f, 1e-8f, 0.01f, 0.1f, 0.001f);
    for (int t = 1; t <= max_threads; t = t < max_threads && t * 2 > max_threads ? max_threads : t * 2) {
        double best = 1e30, best_triad = 1e30;
        for (int rep = 0; rep < 3; rep++) {
            double t0 = time_now();
            host_adamw(&s, master, m, v, g, out, DTYPE_BF16, n, t);
            double dt = time_now() - t0;
            if (dt < best) best = dt;
            double tt = copy_time(m, g, n, t);
            if (tt < best_triad) best_triad = tt;
        }
        double gbs = 30.0 * n / best / 1e9, triad_gbs = 8.0 * n / best_triad / 1e9;
        printf("| %d | %.3f | %.2e | %.1f | %.1f | %.2f |\n", t, best, n / best, gbs, triad_gbs, gbs / triad_gbs);
        if (t == max_threads) break;
    }
    printf("\nCommand: bench_host_adamw %zu (best of 3 per row)\n", millions);
    free(master), free(m), free(v), free(g), free(out);
    return 0;
}
