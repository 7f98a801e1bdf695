/* fuzz_config.c — libFuzzer target: model_config_parse on arbitrary bytes.
 * Must never crash or leak; when it accepts, the config must satisfy the
 * invariants the model relies on (checked here). */
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "model/model.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    ModelConfig cfg;
    char err[ERR_LEN];
    if (model_config_parse(&cfg, (const char *)data, size, "fuzz/config.json", err) == 0) {
        COLT_ASSERT(cfg.hidden_size > 0 && cfg.intermediate_size > 0 && cfg.num_hidden_layers > 0);
        COLT_ASSERT(cfg.num_attention_heads > 0 && cfg.num_key_value_heads > 0 && cfg.vocab_size > 0);
        COLT_ASSERT(cfg.num_attention_heads % cfg.num_key_value_heads == 0);
        COLT_ASSERT(cfg.head_dim > 0 && cfg.head_dim % 2 == 0);
        COLT_ASSERT(cfg.rms_norm_eps > 0 && cfg.rope_theta > 0);
        COLT_ASSERT(cfg.n_eos >= 0 && cfg.n_eos <= MODEL_MAX_EOS);
    }
    return 0;
}
