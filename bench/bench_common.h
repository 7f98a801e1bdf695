/* bench_common.h — small helpers the CPU benchmarks share: the machine's CPU
 * model for the tables' header, and exiting on a failed setup step. Timing
 * uses core/log.h's time_now(). */
#ifndef COLT_BENCH_COMMON_H
#define COLT_BENCH_COMMON_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The "model name" line of /proc/cpuinfo, or "unknown CPU". */
static inline void bench_cpu_model_name(char *buf, size_t size) {
    snprintf(buf, size, "unknown CPU");
    FILE *fp = fopen("/proc/cpuinfo", "r");
    if (!fp) return;
    char line[512];
    while (fgets(line, sizeof(line), fp)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *p = strchr(line, ':');
            if (p) {
                p += 2;
                p[strcspn(p, "\n")] = '\0';
                snprintf(buf, size, "%s", p);
            }
            break;
        }
    }
    fclose(fp);
}

/* colt init's "tiny" preset shapes (Qwen2 with biases, GQA, tied), for the
 * benchmarks' random-weight row. */
#define BENCH_TINY_PRESET                                                                                    \
    {.arch = ARCH_QWEN2, .hidden_size = 64, .intermediate_size = 128, .num_hidden_layers = 2,                 \
     .num_attention_heads = 4, .num_key_value_heads = 2, .head_dim = 16, .vocab_size = 512,                   \
     .max_position_embeddings = 2048, .rms_norm_eps = 1e-6f, .rope_theta = 10000.0f, .tie_word_embeddings = true, \
     .attention_bias = true, .bos_token_id = -1}

/* Exits with "PROGRAM: err" when a setup step failed. */
static inline void bench_check(int rc, const char *program, const char *err) {
    if (rc != 0) {
        fprintf(stderr, "%s: %s\n", program, err);
        exit(1);
    }
}

#endif
