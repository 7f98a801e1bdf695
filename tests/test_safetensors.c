/* test_safetensors.c — bad checkpoints must fail with a message naming the
 * file and the problem, never crash; plus the sharded layout and a few
 * config.json / generation_config.json rules.
 *
 * Every corrupted checkpoint is built in a mkdtemp folder from the tiny Llama
 * checkpoint in tests/data/models. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fileio.h"
#include "model/model.h"
#include "model/safetensors.h"

#define SRC_DIR COLT_SOURCE_DIR "/tests/data/models/tiny-llama-f32"

static int g_failures = 0, g_checks = 0;
static char g_tmp[] = "/tmp/colt_test_st_XXXXXX";

static void write_file(const char *dir, const char *name, const void *data, size_t len) {
    char *path = path_join(dir, name);
    char err[ERR_LEN];
    COLT_ASSERT(file_write_atomic(path, data, len, err) == 0);
    free(path);
}

static void copy_file(const char *dir, const char *name) {
    char *src = path_join(SRC_DIR, name), *data;
    size_t len;
    char err[ERR_LEN];
    COLT_ASSERT(file_read_all(src, &data, &len, err) == 0);
    write_file(dir, name, data, len);
    free(data);
    free(src);
}

/* A fresh checkpoint folder: the tiny Llama's config files and, unless
 * with_weights is 0, its model.safetensors. */
static char *make_case(const char *label, int with_weights) {
    char *dir = path_join(g_tmp, label);
    char err[ERR_LEN];
    COLT_ASSERT(make_dirs(dir, err) == 0);
    copy_file(dir, "config.json");
    copy_file(dir, "generation_config.json");
    if (with_weights) copy_file(dir, "model.safetensors");
    return dir;
}

/* model.safetensors from a header string and data_size zero bytes. */
static void write_safetensors(const char *dir, const char *header, size_t data_size) {
    size_t hl = strlen(header), total = 8 + hl + data_size;
    unsigned char *buf = calloc(total, 1);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, hl);
    write_file(dir, "model.safetensors", buf, total);
    free(buf);
}

/* model_load(dir) must fail and its message contain every needle. */
static void expect_load_error(const char *label, const char *dir, const char *needle1, const char *needle2) {
    char err[ERR_LEN] = "";
    Model *m = NULL;
    int rc = model_load(&m, dir, backend_cpu(), err);
    int ok = rc != 0 && m == NULL && strstr(err, needle1) && (!needle2 || strstr(err, needle2));
    g_checks++;
    printf("%s %-28s -> %s\n", ok ? "ok  " : "FAIL", label, rc ? err : "(loaded without error)");
    if (!ok) {
        g_failures++;
        if (m) model_free(m);
    }
}

static void expect_header_error(const char *label, const char *header, size_t data_size, const char *needle) {
    size_t hl = strlen(header), total = 8 + hl + data_size;
    unsigned char *buf = calloc(total, 1);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(buf + 8, header, hl);
    SafeTensorsHeader h;
    char err[ERR_LEN] = "";
    int rc = safetensors_parse_header(&h, buf, total, "x.safetensors", err);
    int ok = rc != 0 && strstr(err, needle) && strstr(err, "x.safetensors");
    g_checks++;
    printf("%s %-28s -> %s\n", ok ? "ok  " : "FAIL", label, rc ? err : "(parsed without error)");
    if (rc == 0) safetensors_header_free(&h);
    if (!ok) g_failures++;
    free(buf);
}

static void expect_config_error(const char *label, const char *json, const char *needle) {
    ModelConfig cfg;
    char err[ERR_LEN] = "";
    int rc = model_config_parse(&cfg, json, strlen(json), "DIR/config.json", err);
    int ok = rc != 0 && strstr(err, needle) && strstr(err, "DIR/config.json");
    g_checks++;
    printf("%s %-28s -> %s\n", ok ? "ok  " : "FAIL", label, rc ? err : "(parsed without error)");
    if (!ok) g_failures++;
}

/* Rewrites DIR's config.json with key set to a raw JSON value. */
static void patch_config(const char *dir, const char *key, const char *raw_value) {
    char *path = path_join(dir, "config.json"), *text;
    size_t len;
    char err[ERR_LEN];
    COLT_ASSERT(file_read_all(path, &text, &len, err) == 0);
    json_t *root = json_loads(text, 0, NULL);
    json_object_set_new(root, key, json_loads(raw_value, JSON_DECODE_ANY, NULL));
    char *out = json_dumps(root, JSON_INDENT(2));
    write_file(dir, "config.json", out, strlen(out));
    free(out);
    free(text);
    free(path);
    json_decref(root);
}

/* The tiny checkpoint's tensors as fp32 host arrays (for rewriting files). */
typedef struct Tensors {
    MappedFile map;
    SafeTensorsHeader h;
    SafeTensorWrite *w;
} Tensors;

static void tensors_read(Tensors *t) {
    char err[ERR_LEN];
    COLT_ASSERT(file_map(&t->map, SRC_DIR "/model.safetensors", err) == 0);
    COLT_ASSERT(safetensors_parse_header(&t->h, t->map.data, t->map.size, "src", err) == 0);
    t->w = calloc((size_t)t->h.n_tensors, sizeof(SafeTensorWrite));
    for (int i = 0; i < t->h.n_tensors; i++) {
        const SafeTensor *s = &t->h.tensors[i];
        float *data = malloc(safetensors_numel(s) * sizeof(float) + 4);
        safetensors_to_f32(data, s);
        t->w[i] = (SafeTensorWrite){.name = s->name, .ndim = s->ndim, .data = data};
        memcpy(t->w[i].shape, s->shape, sizeof(s->shape));
    }
}

static void tensors_free(Tensors *t) {
    for (int i = 0; i < t->h.n_tensors; i++) free((void *)t->w[i].data);
    free(t->w);
    safetensors_header_free(&t->h);
    file_unmap(&t->map);
}

/* Sharded: the tensors split over two files + an index must load and give the
 * same logits as the single file. */
static void check_sharded(Tensors *t) {
    char *dir = make_case("sharded", 0), err[ERR_LEN];
    int n = t->h.n_tensors, half = n / 2;
    char *p1 = path_join(dir, "model-00001-of-00002.safetensors"), *p2 = path_join(dir, "model-00002-of-00002.safetensors");
    COLT_ASSERT(safetensors_write(p1, t->w, half, DTYPE_F32, err) == 0);
    COLT_ASSERT(safetensors_write(p2, t->w + half, n - half, DTYPE_BF16, err) == 0);
    json_t *root = json_object(), *map = json_object();
    for (int i = 0; i < n; i++)
        json_object_set_new(map, t->w[i].name, json_string(i < half ? "model-00001-of-00002.safetensors"
                                                                     : "model-00002-of-00002.safetensors"));
    json_object_set_new(root, "metadata", json_object());
    json_object_set_new(root, "weight_map", map);
    char *text = json_dumps(root, JSON_INDENT(2));
    write_file(dir, "model.safetensors.index.json", text, strlen(text));
    Model *a = NULL, *b = NULL;
    int rc = model_load(&a, dir, backend_cpu(), err);
    g_checks++;
    if (rc != 0) {
        printf("FAIL sharded load: %s\n", err);
        g_failures++;
    } else {
        COLT_ASSERT(model_load(&b, SRC_DIR, backend_cpu(), err) == 0);
        ModelState *sa, *sb;
        COLT_ASSERT(model_state_create(&sa, a, 1, 8, 4, err) == 0 && model_state_create(&sb, b, 1, 8, 4, err) == 0);
        int ids[4] = {1, 20, 30, 40}, sl[4] = {0}, ps[4] = {0, 1, 2, 3}, V = model_config(a)->vocab_size;
        float *la = malloc(4 * (size_t)V * sizeof(float)), *lb = malloc(4 * (size_t)V * sizeof(float));
        COLT_ASSERT(model_forward(a, sa, ids, sl, ps, 4, NULL, la, err) == 0);
        COLT_ASSERT(model_forward(b, sb, ids, sl, ps, 4, NULL, lb, err) == 0);
        double worst = 0;
        for (int i = 0; i < 4 * V; i++) worst = fmax(worst, fabs((double)la[i] - lb[i]));
        /* the second shard is bf16, so logits differ a little */
        int ok = worst < 0.05 && worst > 0;
        printf("%s sharded (2 files, index)       -> loaded; max |logit diff| vs single file = %.3g\n",
               ok ? "ok  " : "FAIL", worst);
        if (!ok) g_failures++;
        free(la);
        free(lb);
        model_state_free(sa);
        model_state_free(sb);
        model_free(a);
        model_free(b);
    }
    /* The index names a tensor its shard lacks. */
    json_object_set_new(map, "model.extra.weight", json_string("model-00001-of-00002.safetensors"));
    free(text);
    text = json_dumps(root, JSON_INDENT(2));
    write_file(dir, "model.safetensors.index.json", text, strlen(text));
    expect_load_error("index names absent tensor", dir, "model-00001-of-00002.safetensors", "'model.extra.weight'");
    free(text);
    json_decref(root);
    free(p1);
    free(p2);
    free(dir);
}

int main(void) {
    COLT_ASSERT(mkdtemp(g_tmp));
    char *dir, *data, err[ERR_LEN];
    size_t len;

    /* --- whole checkpoints through model_load */
    dir = path_join(g_tmp, "does-not-exist");
    expect_load_error("missing folder", dir, "does-not-exist/config.json", "cannot open");
    free(dir);

    dir = make_case("no-weights", 0);
    expect_load_error("missing model.safetensors", dir, "no-weights", "no model.safetensors");
    free(dir);

    dir = make_case("empty", 0);
    write_file(dir, "model.safetensors", "", 0);
    expect_load_error("empty file", dir, "empty/model.safetensors", "0 bytes");
    free(dir);

    COLT_ASSERT(file_read_all(SRC_DIR "/model.safetensors", &data, &len, err) == 0);
    dir = make_case("truncated", 0);
    write_file(dir, "model.safetensors", data, len / 2);
    expect_load_error("truncated file", dir, "truncated/model.safetensors", "outside the data area");
    free(dir);

    dir = make_case("truncated-header", 0);
    write_file(dir, "model.safetensors", data, 100);
    expect_load_error("truncated in header", dir, "truncated-header/model.safetensors", "larger than the file");
    free(dir);
    free(data);

    dir = make_case("garbage", 0);
    {
        unsigned char junk[4096];
        uint32_t x = 12345;
        for (size_t i = 0; i < sizeof(junk); i++) x = x * 1664525u + 1013904223u, junk[i] = (unsigned char)(x >> 24);
        write_file(dir, "model.safetensors", junk, sizeof(junk));
    }
    expect_load_error("garbage bytes", dir, "garbage/model.safetensors", "header length");
    free(dir);

    dir = make_case("not-json", 0);
    write_safetensors(dir, "this is not json at all", 16);
    expect_load_error("header not JSON", dir, "not-json/model.safetensors", "not valid JSON");
    free(dir);

    dir = make_case("offsets", 0);
    write_safetensors(dir, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                           "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,32]}}", 24);
    expect_load_error("offsets outside the data", dir, "offsets/model.safetensors", "'b': data_offsets [16,32] outside");
    free(dir);

    dir = make_case("overlap", 0);
    write_safetensors(dir, "{\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
                           "\"b\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[8,24]}}", 24);
    expect_load_error("overlapping tensors", dir, "overlap/model.safetensors", "overlap");
    free(dir);

    dir = make_case("dtype", 0);
    write_safetensors(dir, "{\"a\":{\"dtype\":\"F8_E4M3\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4);
    expect_load_error("unknown dtype", dir, "dtype/model.safetensors", "unknown dtype 'F8_E4M3'");
    free(dir);

    dir = make_case("shape", 1);
    patch_config(dir, "intermediate_size", "96");
    expect_load_error("shape mismatch vs config", dir, "shape/model.safetensors",
                      "tensor 'model.layers.0.mlp.gate_proj.weight' has shape [128,64], config wants [96,64]");
    free(dir);

    Tensors t;
    tensors_read(&t);
    dir = make_case("missing-tensor", 0);
    {
        /* every tensor but layer 1's k_proj.weight */
        SafeTensorWrite *w = calloc((size_t)t.h.n_tensors, sizeof(SafeTensorWrite));
        int n = 0;
        for (int i = 0; i < t.h.n_tensors; i++)
            if (strcmp(t.w[i].name, "model.layers.1.self_attn.k_proj.weight") != 0) w[n++] = t.w[i];
        char *p = path_join(dir, "model.safetensors");
        COLT_ASSERT(safetensors_write(p, w, n, DTYPE_F32, err) == 0);
        free(p);
        free(w);
    }
    expect_load_error("missing tensor", dir, "missing-tensor/model.safetensors",
                      "missing tensor 'model.layers.1.self_attn.k_proj.weight'");
    free(dir);

    dir = make_case("arch", 1);
    patch_config(dir, "architectures", "[\"GPT2LMHeadModel\"]");
    expect_load_error("unsupported architecture", dir, "arch/config.json", "unsupported architecture 'GPT2LMHeadModel'");
    free(dir);

    dir = make_case("bad-config", 1);
    {
        const char *bad = "{\"architectures\": [\"LlamaForCausalLM\"], \"hidden_size\": 6";
        write_file(dir, "config.json", bad, strlen(bad));
    }
    expect_load_error("malformed config.json", dir, "bad-config/config.json", "not valid JSON");
    free(dir);

    dir = make_case("bad-gen-config", 1);
    write_file(dir, "generation_config.json", "{\"eos_token_id\": \"x\"}", strlen("{\"eos_token_id\": \"x\"}"));
    expect_load_error("bad generation_config.json", dir, "bad-gen-config/generation_config.json", "eos_token_id");
    free(dir);

    check_sharded(&t);
    tensors_free(&t);

    /* --- the header parser alone */
    expect_header_error("missing dtype", "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "missing field 'dtype'");
    expect_header_error("missing data_offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4,
                        "missing field 'data_offsets'");
    expect_header_error("end < begin", "{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[4,0]}}", 4, "end 0 < begin 4");
    expect_header_error("byte size != numel*size", "{\"a\":{\"dtype\":\"BF16\",\"shape\":[3],\"data_offsets\":[0,4]}}", 8,
                        "4 data bytes, but shape and dtype BF16 need 6");
    expect_header_error("negative shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4,
                        "shape[0]");
    expect_header_error("header not an object", "[1,2,3]", 0, "not a JSON object");
    expect_header_error("huge shape", "{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}",
                        4, "too large");
    {
        const char *hdr = "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}";
        size_t hl = strlen(hdr);
        unsigned char buf[256] = {0};
        buf[0] = (unsigned char)hl;
        memcpy(buf + 8, hdr, hl);
        buf[8 + hl] = 0x00, buf[9 + hl] = 0x3c; /* f16 1.0 */
        buf[10 + hl] = 0x00, buf[11 + hl] = 0xc0; /* f16 -2.0 */
        SafeTensorsHeader h;
        int rc = safetensors_parse_header(&h, buf, 8 + hl + 4, "ok.safetensors", err);
        float v[2] = {0, 0};
        if (rc == 0) safetensors_to_f32(v, &h.tensors[0]);
        int ok = rc == 0 && h.n_tensors == 1 && v[0] == 1.0f && v[1] == -2.0f;
        g_checks++;
        printf("%s %-28s -> %s\n", ok ? "ok  " : "FAIL", "__metadata__ + F16 accepted", rc ? err : "parsed, values 1, -2");
        if (rc == 0) safetensors_header_free(&h);
        if (!ok) g_failures++;
    }
    {
        /* bf16 rounding: to nearest, ties to even */
        float x1 = 1.0f + 1.0f / 256.0f;         /* exactly halfway between 1 and 1+1/128: ties to even -> 1 */
        float x2 = 1.0f + 3.0f / 256.0f;         /* halfway between 1+1/128 and 1+2/128 -> 1+2/128 */
        float x3 = 1.0f + 1.0f / 256.0f + 1e-6f; /* just above halfway -> 1+1/128 */
        int ok = safetensors_bf16_to_f32(safetensors_f32_to_bf16(x1)) == 1.0f &&
                 safetensors_bf16_to_f32(safetensors_f32_to_bf16(x2)) == 1.0f + 2.0f / 128.0f &&
                 safetensors_bf16_to_f32(safetensors_f32_to_bf16(x3)) == 1.0f + 1.0f / 128.0f;
        g_checks++;
        printf("%s %-28s\n", ok ? "ok  " : "FAIL", "bf16 round-to-nearest-even");
        if (!ok) g_failures++;
    }

    /* --- config.json rules */
    const char *base = "{\"architectures\":[\"LlamaForCausalLM\"],\"hidden_size\":64,\"intermediate_size\":128,"
                       "\"num_hidden_layers\":2,\"num_attention_heads\":4,\"vocab_size\":256";
    char buf[1024];
#define CFG(extra) (snprintf(buf, sizeof(buf), "%s%s}", base, extra), buf)
    expect_config_error("rope_scaling set", CFG(",\"rope_scaling\":{\"type\":\"linear\",\"factor\":2}"),
                        "rope_scaling is not supported");
    expect_config_error("rope_parameters yarn", CFG(",\"rope_parameters\":{\"rope_type\":\"yarn\"}"), "rope_type");
    expect_config_error("kv heads do not divide", CFG(",\"num_key_value_heads\":3"), "'num_key_value_heads' (3)");
    expect_config_error("heads do not divide D", CFG(",\"num_attention_heads\":5"), "does not divide 'hidden_size'");
    expect_config_error("eps underflows fp32", CFG(",\"rms_norm_eps\":1e-46"), "'rms_norm_eps'"); /* found by fuzz_config */
    expect_config_error("hidden_act gelu", CFG(",\"hidden_act\":\"gelu\""), "'hidden_act'");
    expect_config_error("negative hidden_size", CFG(",\"hidden_size\":-64"), "'hidden_size'");
    expect_config_error("string vocab_size", CFG(",\"vocab_size\":\"256\""), "'vocab_size'");
    expect_config_error("unknown dtype", CFG(",\"torch_dtype\":\"float64\""), "'torch_dtype'");
    expect_config_error("missing key", "{\"model_type\":\"llama\",\"hidden_size\":64}", "missing key 'intermediate_size'");
    expect_config_error("unsupported model_type", "{\"model_type\":\"gpt2\"}", "unsupported model type 'gpt2'");
    expect_config_error("not an object", "[]", "not a JSON object");
    {
        ModelConfig cfg;
        const char *q = "{\"model_type\":\"qwen2\",\"hidden_size\":64,\"intermediate_size\":128,\"num_hidden_layers\":2,"
                        "\"num_attention_heads\":4,\"num_key_value_heads\":2,\"vocab_size\":256,\"eos_token_id\":[5,7],"
                        "\"dtype\":\"bfloat16\",\"rope_parameters\":{\"rope_type\":\"default\",\"rope_theta\":1000000.0}}";
        int rc = model_config_parse(&cfg, q, strlen(q), "q.json", err);
        int ok = rc == 0 && cfg.arch == ARCH_QWEN2 && cfg.attention_bias && !cfg.tie_word_embeddings &&
                 cfg.head_dim == 16 && cfg.n_eos == 2 && cfg.eos_token_ids[1] == 7 && cfg.torch_dtype == DTYPE_BF16 &&
                 cfg.rope_theta == 1e6f && cfg.num_key_value_heads == 2 && cfg.bos_token_id == -1;
        g_checks++;
        printf("%s %-28s -> %s\n", ok ? "ok  " : "FAIL", "qwen2 config (defaults, eos list)", rc ? err : "parsed");
        if (!ok) g_failures++;
        GenerationDefaults gen;
        dir = make_case("gen", 0);
        const char *g = "{\"eos_token_id\":[2,9],\"do_sample\":true,\"temperature\":0.7,\"top_p\":0.9,\"top_k\":20}";
        write_file(dir, "generation_config.json", g, strlen(g));
        rc = model_config_load(&cfg, &gen, dir, err);
        ok = rc == 0 && cfg.n_eos == 2 && cfg.eos_token_ids[0] == 2 && cfg.eos_token_ids[1] == 9 && gen.present &&
             gen.do_sample && gen.temperature == 0.7f && gen.top_p == 0.9f && gen.top_k == 20 &&
             gen.repetition_penalty == 1.0f;
        g_checks++;
        printf("%s %-28s -> %s\n", ok ? "ok  " : "FAIL", "generation_config merge", rc ? err : "eos [2,9], sampling");
        if (!ok) g_failures++;
        free(dir);
    }

    snprintf(buf, sizeof(buf), "rm -rf '%s'", g_tmp);
    if (system(buf) != 0) printf("warning: could not remove %s\n", g_tmp);
    printf("%s: %d checks, %d failures\n", g_failures ? "FAILED" : "OK", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
