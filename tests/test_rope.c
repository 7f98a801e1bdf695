/* test_rope.c — RoPE configs and frequency tables against transformers.
 *
 * For every case of tests/data/rope_goldens.json (tests/ref/make_rope_goldens.py):
 * the config in transformers 5's form (rope_parameters) and in 4.x's form
 * (rope_theta + rope_scaling) parses to the same RoPE, and model_rope_inv_freq
 * gives transformers' inv_freq (fp32, compared in units in the last place;
 * tolerance 0 ulp). Then the refusals (yarn, dynamic, missing keys) name the
 * file and the key, a config with both forms reads as transformers 5 does,
 * and a checkpoint saved by colt keeps its RoPE when reloaded. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fileio.h"
#include "model/model.h"
#include "harness.h"


/* Distance in representable fp32 values (both finite, same sign here). */
static long ulp_distance(float a, float b) {
    int32_t ia, ib;
    memcpy(&ia, &a, 4);
    memcpy(&ib, &b, 4);
    return labs((long)ia - (long)ib);
}

static int parse_json_config(ModelConfig *cfg, const json_t *o, const char *name, char *err) {
    char *text = json_dumps(o, JSON_COMPACT);
    int rc = model_config_parse(cfg, text, strlen(text), name, err);
    free(text);
    return rc;
}

/* The table of one config form against the golden; returns the worst ulp distance. */
static long check_form(const json_t *form, const json_t *golden, const char *label, ModelConfig *out) {
    char err[ERR_LEN];
    ModelConfig cfg;
    if (parse_json_config(&cfg, form, "config.json", err) != 0) {
        CHECK(0, "%s: %s", label, err);
        return -1;
    }
    int half = cfg.head_dim / 2;
    CHECK((size_t)half == json_array_size(golden), "%s: %d frequencies, golden has %zu", label, half,
          json_array_size(golden));
    float *inv = calloc((size_t)half, sizeof(float));
    model_rope_inv_freq(inv, &cfg);
    long worst = 0;
    for (int j = 0; j < half && (size_t)j < json_array_size(golden); j++) {
        float want = (float)json_number_value(json_array_get(golden, (size_t)j));
        long d = ulp_distance(inv[j], want);
        if (d > worst) worst = d;
    }
    free(inv);
    *out = cfg;
    return worst;
}

static void test_goldens(void) {
    char err[ERR_LEN], *text = NULL;
    size_t len = 0;
    const char *path = COLT_SOURCE_DIR "/tests/data/rope_goldens.json";
    if (file_read_all(path, &text, &len, err) != 0) {
        CHECK(0, "%s", err);
        return;
    }
    json_t *root = json_loadb(text, len, 0, NULL);
    free(text);
    COLT_ASSERT(root);
    const json_t *cases = json_object_get(root, "cases");
    int n_llama3 = 0;
    for (size_t i = 0; i < json_array_size(cases); i++) {
        const json_t *c = json_array_get(cases, i);
        const char *name = json_string_value(json_object_get(c, "name"));
        const json_t *golden = json_object_get(c, "inv_freq");
        ModelConfig a, b;
        long d5 = check_form(json_object_get(c, "config_v5"), golden, name, &a);
        long d4 = check_form(json_object_get(c, "config_v4"), golden, name, &b);
        printf("  %-34s %-8s inv_freq[%zu] vs transformers: max %ld ulp (rope_parameters), %ld ulp (rope_scaling)\n",
               name, model_rope_type_name(a.rope_type), json_array_size(golden), d5, d4);
        CHECK(d5 == 0 && d4 == 0, "%s: inv_freq differs from transformers by %ld / %ld ulp", name, d5, d4);
        CHECK(a.rope_type == b.rope_type && a.rope_theta == b.rope_theta && a.rope_factor == b.rope_factor &&
                  a.rope_original_max_position_embeddings == b.rope_original_max_position_embeddings,
              "%s: the two config forms parse differently", name);
        n_llama3 += a.rope_type == ROPE_LLAMA3;
    }
    CHECK(json_array_size(cases) >= 8 && n_llama3 >= 5, "only %zu cases (%d llama3)", json_array_size(cases), n_llama3);
    json_decref(root);
}

static void expect_error(const char *label, const char *extra, const char *needle) {
    char text[1024], err[ERR_LEN] = "";
    snprintf(text, sizeof text,
             "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":128,"
             "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":256%s}",
             extra);
    ModelConfig cfg;
    int rc = model_config_parse(&cfg, text, strlen(text), "DIR/config.json", err);
    bool ok = rc != 0 && strstr(err, needle) && strstr(err, "DIR/config.json");
    printf("  %-4s %-34s -> %s\n", ok ? "ok" : "FAIL", label, rc ? err : "(parsed)");
    CHECK(ok, "%s: want an error containing '%s', got '%s'", label, needle, rc ? err : "(parsed)");
}

static void test_config_forms(void) {
    expect_error("yarn", ",\"rope_parameters\":{\"rope_type\":\"yarn\",\"factor\":4}",
                 "'rope_parameters.rope_type' is \"yarn\"");
    expect_error("dynamic (4.x type key)", ",\"rope_scaling\":{\"type\":\"dynamic\",\"factor\":2}",
                 "'rope_scaling.type' is \"dynamic\"");
    expect_error("llama3 without factor",
                 ",\"rope_scaling\":{\"rope_type\":\"llama3\",\"low_freq_factor\":1,\"high_freq_factor\":4}",
                 "'rope_scaling.factor' is missing");
    expect_error("llama3 low >= high",
                 ",\"rope_parameters\":{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":4,"
                 "\"high_freq_factor\":4}",
                 "'rope_parameters.low_freq_factor'");
    expect_error("llama3 bad original_max",
                 ",\"rope_parameters\":{\"rope_type\":\"llama3\",\"factor\":8,\"low_freq_factor\":1,"
                 "\"high_freq_factor\":4,\"original_max_position_embeddings\":\"8k\"}",
                 "'rope_parameters.original_max_position_embeddings'");
    expect_error("linear factor 0", ",\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":0}",
                 "'rope_scaling.factor' must be a positive number");
    expect_error("partial rotary", ",\"rope_parameters\":{\"rope_type\":\"default\",\"partial_rotary_factor\":0.5}",
                 "'rope_parameters.partial_rotary_factor'");
    expect_error("rope_scaling not an object", ",\"rope_scaling\":\"llama3\"", "'rope_scaling' must be an object");

    /* Both forms in one file: transformers 5 takes a non-empty rope_scaling over
     * rope_parameters, and the dict's rope_theta over the top-level one. */
    const char *both = "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":128,"
                       "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":256,\"rope_theta\":1000,"
                       "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":2000},"
                       "\"rope_scaling\":{\"rope_type\":\"linear\",\"factor\":2}}";
    ModelConfig cfg;
    char err[ERR_LEN];
    int rc = model_config_parse(&cfg, both, strlen(both), "config.json", err);
    CHECK(rc == 0 && cfg.rope_type == ROPE_LINEAR && cfg.rope_factor == 2.0f && cfg.rope_theta == 1000.0f,
          "both forms: rc %d type %d factor %g theta %g", rc, cfg.rope_type, cfg.rope_factor, cfg.rope_theta);
    const char *empty = "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":128,"
                        "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":256,"
                        "\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":2000},\"rope_scaling\":{}}";
    rc = model_config_parse(&cfg, empty, strlen(empty), "config.json", err);
    CHECK(rc == 0 && cfg.rope_type == ROPE_DEFAULT && cfg.rope_theta == 2000.0f, "empty rope_scaling: rc %d theta %g",
          rc, cfg.rope_theta);
    printf("  ok   both forms in one file         -> rope_scaling wins (linear, theta 1000); {} is none (theta 2000)\n");
}

/* colt saves both forms; reloading (and so transformers 4.x and 5) sees the same RoPE. */
static void test_save_round_trip(void) {
    ModelConfig cfg = {.arch = ARCH_LLAMA, .hidden_size = 64, .intermediate_size = 128, .num_hidden_layers = 1,
                       .num_attention_heads = 4, .num_key_value_heads = 2, .head_dim = 16, .vocab_size = 64,
                       .max_position_embeddings = 256, .rms_norm_eps = 1e-5f, .rope_theta = 500000.0f,
                       .rope_type = ROPE_LLAMA3, .rope_factor = 32.0f, .rope_low_freq_factor = 1.0f,
                       .rope_high_freq_factor = 4.0f, .rope_original_max_position_embeddings = 64,
                       .bos_token_id = -1, .torch_dtype = DTYPE_F32};
    char dir[] = "/tmp/colt_test_rope_XXXXXX", err[ERR_LEN];
    COLT_ASSERT(mkdtemp(dir));
    int rc = model_save_random(&cfg, 3, dir, DTYPE_F32, err);
    CHECK(rc == 0, "model_save_random: %s", err);
    ModelConfig back;
    if (rc == 0) rc = model_config_load(&back, NULL, dir, err);
    CHECK(rc == 0, "reload: %s", err);
    if (rc == 0) {
        float a[8], b[8];
        model_rope_inv_freq(a, &cfg);
        model_rope_inv_freq(b, &back);
        bool same = back.rope_type == ROPE_LLAMA3 && memcmp(a, b, sizeof a) == 0 &&
                    back.rope_original_max_position_embeddings == 64 && back.rope_factor == 32.0f;
        printf("  %-4s saved llama3 config reloads       -> %s, factor %g, original_max %d, table %s\n",
               same ? "ok" : "FAIL", model_rope_type_name(back.rope_type), back.rope_factor,
               back.rope_original_max_position_embeddings, same ? "identical" : "DIFFERS");
        CHECK(same, "llama3 RoPE lost in save + load");
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("warning: could not remove %s\n", dir);
}

int main(void) {
    printf("RoPE tables vs transformers (tests/data/rope_goldens.json)\n");
    test_goldens();
    printf("config forms and refusals\n");
    test_config_forms();
    test_save_round_trip();
    printf("%s: %d failures\n", g_failures ? "FAILED" : "OK", g_failures);
    return g_failures ? 1 : 0;
}
