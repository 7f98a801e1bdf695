/* rope.c — the RoPE frequency table inv_freq[Dh / 2] of a config, computed
 * once per model and handed to every rope op (backend.h), as transformers'
 * ROPE_INIT_FUNCTIONS compute it (modeling_rope_utils.py): default, linear and
 * llama3. Each scheme changes only inv_freq; the attention factor of all three
 * is 1. This is not the rotation itself (the backends' rope ops) nor config
 * parsing (config.c).
 *
 * Arithmetic follows torch's on fp32 tensors with Python scalars: every
 * operation in fp32, the scalar rounded to fp32 first, and `scalar / tensor`
 * evaluated as torch does it (tensor.reciprocal() * scalar). The default table
 * keeps the expression colt's rope always used, so unscaled models are
 * bit-identical to before the table existed. */
#include <math.h>

#include "core/error.h"
#include "model/model.h"

const char *model_rope_type_name(RopeType type) {
    switch (type) {
    case ROPE_DEFAULT: return "default";
    case ROPE_LINEAR: return "linear";
    case ROPE_LLAMA3: return "llama3";
    }
    return "unknown";
}

/* transformers' _compute_llama3_parameters, on the default table in place:
 * wavelengths longer than original_max_position_embeddings / low_freq_factor
 * are slowed down by factor, those shorter than .../ high_freq_factor kept,
 * and the band between interpolated smoothly. */
static void llama3_scale(float *inv_freq, int half, const ModelConfig *cfg) {
    const double old_context_len = (double)cfg->rope_original_max_position_embeddings;
    const double low = (double)cfg->rope_low_freq_factor, high = (double)cfg->rope_high_freq_factor;
    const float factor = cfg->rope_factor;
    /* Python floats, then rounded to fp32 where they meet a tensor. */
    const float low_freq_wavelen = (float)(old_context_len / low);
    const float high_freq_wavelen = (float)(old_context_len / high);
    const float two_pi = (float)(2.0 * M_PI), old_len = (float)old_context_len, low_f = (float)low;
    const float band = (float)(high - low);
    for (int j = 0; j < half; j++) {
        float inv = inv_freq[j];
        float wavelen = (1.0f / inv) * two_pi;
        float scaled = wavelen > low_freq_wavelen ? inv / factor : inv;
        float smooth = ((1.0f / wavelen) * old_len - low_f) / band;
        float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
        bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
        inv_freq[j] = medium ? smoothed : scaled;
    }
}

void model_rope_inv_freq(float *inv_freq, const ModelConfig *cfg) {
    const int head_dim = cfg->head_dim, half = head_dim / 2;
    COLT_ASSERT(head_dim > 0 && head_dim % 2 == 0);
    for (int j = 0; j < half; j++) {
        float exponent = (float)(2 * j) / (float)head_dim;
        inv_freq[j] = 1.0f / powf(cfg->rope_theta, exponent);
    }
    if (cfg->rope_type == ROPE_LINEAR) {
        for (int j = 0; j < half; j++) inv_freq[j] = inv_freq[j] / cfg->rope_factor;
    } else if (cfg->rope_type == ROPE_LLAMA3) {
        llama3_scale(inv_freq, half, cfg);
    }
}
