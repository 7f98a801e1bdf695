/* fuzz_optimizer_state.c — libFuzzer target: a checkpoint's
 * optimizer.safetensors as resume reads it (optim_load_bytes), on arbitrary
 * bytes, for a fixed tiny random Llama on the CPU. Must never crash or leak;
 * a rejected file must leave the optimizer as it was (checked here: its step
 * and state stay finite).
 *
 * The seed (fuzz/seeds/fuzz_optimizer_state/valid.safetensors) is this model's
 * state after one AdamW step; COLT_FUZZ_WRITE_SEED=PATH writes it anew. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "model/model.h"
#include "model/model_train.h"
#include "parallel/optim.h"

static Model *g_model;
static Optimizer *g_opt;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
    (void)argc, (void)argv;
    char err[ERR_LEN];
    const Backend *be = backend_cpu();
    ModelConfig cfg = {.arch = ARCH_LLAMA, .hidden_size = 16, .intermediate_size = 32, .num_hidden_layers = 1,
                       .num_attention_heads = 2, .num_key_value_heads = 1, .head_dim = 8, .vocab_size = 32,
                       .max_position_embeddings = 64, .rms_norm_eps = 1e-5f, .rope_theta = 10000.0f,
                       .tie_word_embeddings = true, .bos_token_id = -1, .torch_dtype = DTYPE_F32};
    AdamWConfig ac = {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.01f};
    COLT_ASSERT(be && model_create_random(&g_model, &cfg, 1, be, err) == 0);
    COLT_ASSERT(optim_create(&g_opt, g_model, &ac, be, err) == 0);
    const char *seed_path = getenv("COLT_FUZZ_WRITE_SEED");
    if (seed_path) {
        ModelGrads *g = NULL;
        COLT_ASSERT(model_grads_create(&g, g_model, err) == 0);
        size_t n = 0;
        float *flat = model_grads_flat(g, &n);
        for (size_t i = 0; i < n; i++) flat[i] = 0.001f * (float)(i % 7);
        optim_step(g_opt, g, 1e-3f);
        COLT_ASSERT(optim_save(g_opt, seed_path, err) == 0);
        model_grads_free(g);
        exit(0);
    }
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    uint8_t *buf = malloc(size ? size : 1); /* a private copy: ASan catches reads past the end */
    if (size) memcpy(buf, data, size);
    char err[ERR_LEN];
    int64_t before = optim_step_count(g_opt);
    if (optim_load_bytes(g_opt, buf, size, "fuzz/optimizer.safetensors", err) != 0)
        COLT_ASSERT(optim_step_count(g_opt) == before);
    COLT_ASSERT(optim_step_count(g_opt) >= 0 && optim_state_finite(g_opt));
    free(buf);
    return 0;
}
