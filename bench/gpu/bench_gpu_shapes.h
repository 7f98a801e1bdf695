/* bench_gpu_shapes.h — the Qwen2.5 model shapes the GPU benchmarks measure,
 * by preset name, and the config of a random-weight bf16 model of each (C only:
 * bench_layer_floor.cu, C++, takes just the table). */
#ifndef COLT_BENCH_GPU_SHAPES_H
#define COLT_BENCH_GPU_SHAPES_H

#include <stdbool.h>
#include <string.h>

typedef struct Shape {
    const char *name;
    int hidden, inter, layers, heads, kv_heads, vocab;
    bool tied;
} Shape;

static const Shape SHAPES[] = {
    {"0.5b", 896, 4864, 24, 14, 2, 151936, true},
    {"1.5b", 1536, 8960, 28, 12, 2, 151936, true},
    {"7b", 3584, 18944, 28, 28, 4, 152064, false},
    /* Llama-3.1-8B's dimensions with the Qwen vocabulary (bench_8b.sh's model), built as Qwen2 here: its
     * q/k/v biases are 0.01% of the bytes */
    {"8b", 4096, 14336, 32, 32, 8, 151936, false},
};

/* The shape named `name` (0.5b, 1.5b, 7b, 8b), or NULL. */
static inline const Shape *shape_by_name(const char *name) {
    for (size_t k = 0; k < sizeof SHAPES / sizeof SHAPES[0]; k++)
        if (strcmp(SHAPES[k].name, name) == 0) return &SHAPES[k];
    return NULL;
}

#ifndef __cplusplus
#include <stdio.h>

#include "core/error.h"
#include "model/model.h"

/* Qwen2 config of a shape (q/k/v biases, rope theta 1e6, bf16). */
static inline ModelConfig shape_config(const Shape *s) {
    ModelConfig cfg = {.arch = ARCH_QWEN2, .hidden_size = s->hidden, .intermediate_size = s->inter,
                       .num_hidden_layers = s->layers, .num_attention_heads = s->heads,
                       .num_key_value_heads = s->kv_heads, .head_dim = s->hidden / s->heads,
                       .vocab_size = s->vocab, .max_position_embeddings = 32768, .rms_norm_eps = 1e-6f,
                       .rope_theta = 1e6f, .tie_word_embeddings = s->tied, .attention_bias = true,
                       .bos_token_id = -1, .torch_dtype = DTYPE_BF16};
    return cfg;
}

/* A random-weight bf16 model of the shape named `name` on be (*shape set), or NULL: an unknown name is
 * skipped quietly, a model that cannot be made prints its table row with the reason. */
static inline Model *shape_random_model(const char *name, const Backend *be, const Shape **shape) {
    *shape = shape_by_name(name);
    if (!*shape) return NULL;
    ModelConfig cfg = shape_config(*shape);
    Model *m = NULL;
    char err[ERR_LEN];
    if (model_create_random(&m, &cfg, 1, be, err) != 0) {
        printf("| %s | %s |\n", (*shape)->name, err);
        return NULL;
    }
    return m;
}
#endif

#endif
