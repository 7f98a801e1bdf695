/* cmd_init.c — `colt init`: a randomly initialised Hugging Face checkpoint
 * with the shapes of a public config (Qwen2.5 sizes for either architecture,
 * Qwen3 sizes, Llama 3.1 / 3.2 sizes with their llama3 RoPE scaling) or a tiny test preset;
 * optionally with a tokenizer copied in. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/error.h"
#include "core/fileio.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokenizer_files.h"

static const char *INIT_USAGE =
    "usage: colt init [--arch qwen2|qwen3|llama] --preset PRESET --out DIR [--tokenizer DIR] [--seed S] [--dtype bf16|fp32]\n"
    "                 [--vocab_size V] [--config_only]\n"
    "  presets: tiny, qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-7b, qwen2.5-14b, qwen2.5-32b (--arch qwen2, qwen3 or llama),\n"
    "           qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b, qwen3-32b (qwen3),\n"
    "           llama3.2-1b, llama3.2-3b, llama3.1-8b (llama, with Llama 3's RoPE scaling)\n";

typedef struct Preset {
    const char *name;
    int hidden, intermediate, layers, heads, kv_heads, head_dim, vocab, max_pos; /* head_dim 0: hidden / heads */
    bool tied;
    const char *arch;  /* the architecture the preset is (NULL: --arch chooses) */
    float llama3_factor; /* llama3 RoPE scaling factor (theta 500000, low 1, high 4, original 8192); 0: none */
} Preset;

/* Shapes of the public configs: Qwen/Qwen2.5-*-Instruct, Qwen/Qwen3-0.6B, -1.7B, -4B, -8B and
 * -32B and meta-llama/Llama-3.2-1B, -3.2-3B, -3.1-8B (config.json). */
static const Preset PRESETS[] = {
    {"tiny", 64, 128, 2, 4, 2, 0, 512, 2048, true, NULL, 0.0f},
    {"qwen2.5-0.5b", 896, 4864, 24, 14, 2, 0, 151936, 32768, true, NULL, 0.0f},
    {"qwen2.5-1.5b", 1536, 8960, 28, 12, 2, 0, 151936, 32768, true, NULL, 0.0f},
    {"qwen2.5-7b", 3584, 18944, 28, 28, 4, 0, 152064, 32768, false, NULL, 0.0f},
    {"qwen2.5-14b", 5120, 13824, 48, 40, 8, 0, 152064, 32768, false, NULL, 0.0f},
    {"qwen2.5-32b", 5120, 27648, 64, 40, 8, 0, 152064, 32768, false, NULL, 0.0f},
    {"qwen3-0.6b", 1024, 3072, 28, 16, 8, 128, 151936, 40960, true, "qwen3", 0.0f},
    {"qwen3-1.7b", 2048, 6144, 28, 16, 8, 128, 151936, 40960, true, "qwen3", 0.0f},
    {"qwen3-4b", 2560, 9728, 36, 32, 8, 128, 151936, 40960, true, "qwen3", 0.0f},
    {"qwen3-8b", 4096, 12288, 36, 32, 8, 128, 151936, 40960, false, "qwen3", 0.0f},
    {"qwen3-32b", 5120, 25600, 64, 64, 8, 128, 151936, 40960, false, "qwen3", 0.0f},
    {"llama3.2-1b", 2048, 8192, 16, 32, 8, 0, 128256, 131072, true, "llama", 32.0f},
    {"llama3.2-3b", 3072, 8192, 28, 24, 8, 0, 128256, 131072, true, "llama", 32.0f},
    {"llama3.1-8b", 4096, 14336, 32, 32, 8, 0, 128256, 131072, false, "llama", 8.0f},
};

int cmd_init(int argc, char **argv) {
    char err[ERR_LEN];
    const char *arch = NULL, *preset_name = NULL, *tokenizer_dir = NULL, *out = NULL, *dtype = "bf16";
    uint64_t seed = 0;
    int vocab_size = 0;
    bool config_only = false;
    CliOption opts[] = {
        {"arch", OPT_STRING, &arch, "qwen2, qwen3 or llama (required unless the preset names one)", false},
        {"preset", OPT_STRING, &preset_name,
         "tiny, qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-7b, qwen2.5-14b, qwen2.5-32b, qwen3-0.6b, qwen3-1.7b, qwen3-4b, qwen3-8b, qwen3-32b, llama3.2-1b, "
         "llama3.2-3b or llama3.1-8b (required)", false},
        {"tokenizer", OPT_STRING, &tokenizer_dir, "copy this folder's tokenizer files in; tiny takes its vocab size", false},
        {"out", OPT_STRING, &out, "output folder (required)", false},
        {"seed", OPT_U64, &seed, "random seed (default 0)", false},
        {"dtype", OPT_STRING, &dtype, "bf16 (default) or fp32", false},
        {"vocab_size", OPT_INT, &vocab_size,
         "the preset's shape with another vocabulary size (e.g. a Llama shape with a Qwen tokenizer)", false},
        {"config_only", OPT_FLAG, &config_only,
         "write config.json (and the tokenizer) without weights: a shape to plan with colt train --dry_run", false},
    };
    int prc = cli_parse(opts, (int)(sizeof opts / sizeof opts[0]), argc, argv, INIT_USAGE, err);
    if (prc == 1) return 0;
    if (prc != 0) return cli_fail("init", err);
    if (!preset_name || !out) return cli_fail("init", "--preset and --out are required");
    const Preset *p = NULL;
    for (size_t i = 0; i < sizeof PRESETS / sizeof PRESETS[0]; i++)
        if (strcmp(PRESETS[i].name, preset_name) == 0) p = &PRESETS[i];
    if (!p) {
        errorf(err, "--preset: unknown preset '%s' (tiny, qwen2.5-0.5b, qwen2.5-1.5b, qwen2.5-7b, qwen2.5-14b, qwen2.5-32b, qwen3-0.6b, "
                    "qwen3-1.7b, qwen3-4b, qwen3-8b, qwen3-32b, llama3.2-1b, llama3.2-3b, llama3.1-8b)", preset_name);
        return cli_fail("init", err);
    }
    if (p->arch && arch && strcmp(arch, p->arch) != 0) {
        errorf(err, "--arch: preset %s is a %s model, not %s", p->name, p->arch, arch);
        return cli_fail("init", err);
    }
    if (!arch) arch = p->arch;
    if (!arch) return cli_fail("init", "--arch is required for this preset (qwen2, qwen3 or llama)");
    ModelArch model_arch;
    if (strcmp(arch, "qwen2") == 0) model_arch = ARCH_QWEN2;
    else if (strcmp(arch, "qwen3") == 0) model_arch = ARCH_QWEN3;
    else if (strcmp(arch, "llama") == 0) model_arch = ARCH_LLAMA;
    else {
        errorf(err, "--arch: unknown architecture '%s' (qwen2, qwen3 or llama)", arch);
        return cli_fail("init", err);
    }
    DType save_dtype;
    if (strcmp(dtype, "bf16") == 0) save_dtype = DTYPE_BF16;
    else if (strcmp(dtype, "fp32") == 0) save_dtype = DTYPE_F32;
    else {
        errorf(err, "--dtype: unknown dtype '%s' (bf16 or fp32)", dtype);
        return cli_fail("init", err);
    }

    ModelConfig cfg = {0};
    cfg.arch = model_arch;
    cfg.hidden_size = p->hidden;
    cfg.intermediate_size = p->intermediate;
    cfg.num_hidden_layers = p->layers;
    cfg.num_attention_heads = p->heads;
    cfg.num_key_value_heads = p->kv_heads;
    cfg.head_dim = p->head_dim > 0 ? p->head_dim : p->hidden / p->heads;
    cfg.vocab_size = p->vocab;
    if (vocab_size != 0) {
        if (vocab_size < 1 || vocab_size > (1 << 24)) {
            errorf(err, "--vocab_size: %d is out of range (1 .. %d)", vocab_size, 1 << 24);
            return cli_fail("init", err);
        }
        cfg.vocab_size = vocab_size;
    }
    cfg.max_position_embeddings = p->max_pos;
    cfg.rms_norm_eps = 1e-6f;
    cfg.rope_theta = model_arch == ARCH_LLAMA ? 10000.0f : 1000000.0f;
    cfg.tie_word_embeddings = p->tied;
    cfg.attention_bias = model_arch == ARCH_QWEN2;
    cfg.torch_dtype = save_dtype;
    cfg.bos_token_id = strcmp(p->name, "tiny") == 0 ? -1 : 151643;
    cfg.n_eos = 0;
    if (strcmp(p->name, "tiny") != 0) cfg.eos_token_ids[cfg.n_eos++] = 151645;
    if (p->llama3_factor > 0.0f) { /* Llama 3's: rms_norm_eps 1e-5, <|begin_of_text|>, <|end_of_text|> <|eot_id|> */
        cfg.rms_norm_eps = 1e-5f;
        cfg.rope_theta = 500000.0f;
        cfg.rope_type = ROPE_LLAMA3;
        cfg.rope_factor = p->llama3_factor;
        cfg.rope_low_freq_factor = 1.0f;
        cfg.rope_high_freq_factor = 4.0f;
        cfg.rope_original_max_position_embeddings = 8192;
        cfg.bos_token_id = 128000;
        cfg.n_eos = 2;
        cfg.eos_token_ids[0] = 128001;
        cfg.eos_token_ids[1] = 128009;
    }

    if (tokenizer_dir) {
        Tokenizer *tok = NULL;
        if (tokenizer_load(&tok, tokenizer_dir, err) != 0) return cli_fail("init", err);
        int tok_vocab = tokenizer_vocab_size(tok);
        if (strcmp(p->name, "tiny") == 0 && vocab_size == 0) cfg.vocab_size = (tok_vocab + 63) / 64 * 64; /* padded like Qwen's */
        if (tok_vocab > cfg.vocab_size) {
            tokenizer_free(tok);
            errorf(err, "--tokenizer: %d tokens do not fit the preset's vocab_size %d", tok_vocab, cfg.vocab_size);
            return cli_fail("init", err);
        }
        cfg.bos_token_id = tokenizer_bos_id(tok);
        cfg.n_eos = 0;
        if (tokenizer_eos_id(tok) >= 0) cfg.eos_token_ids[cfg.n_eos++] = tokenizer_eos_id(tok);
        tokenizer_free(tok);
    }

    /* Streams the weights to disk: a 7B preset never sits in memory. */
    int rc = 0;
    if (make_dirs(out, err) != 0 ||
        (config_only ? model_save_config(&cfg, out, save_dtype, err) : model_save_random(&cfg, seed, out, save_dtype, err)) != 0 ||
        (tokenizer_dir && tokenizer_copy_files(tokenizer_dir, out, err) != 0))
        rc = cli_fail("init", err);
    if (rc == 0)
        fprintf(stderr, "colt init: wrote %s (%s, preset %s, %s%s)\n", out, arch, p->name, dtype,
                config_only ? ", config only: no weights" : "");
    return rc;
}
