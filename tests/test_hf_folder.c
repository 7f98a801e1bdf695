/* test_hf_folder.c — a Hugging Face folder as transformers 5 saves one, end to end.
 *
 * tests/data/models/tiny-llama3-f32 (tests/ref/make_model_goldens.py) has
 * sharded safetensors with an index, llama3 RoPE in rope_parameters, "dtype",
 * a byte-level BPE tokenizer whose tokenizer_config.json holds model_max_length
 * 1000000000000000019884624838656 (beyond 64 bits), chat_template.jinja beside
 * it, and generation_config.json with eos_token_id [2, X]. Checked against the
 * goldens' "chat" entry: the rendered chat text and its ids =
 * apply_chat_template's; the log-probs of chat + completion (1e-4); colt
 * generate --json on the chat stops at X with transformers' greedy ids. Then
 * the errors name the file actually wrong (a broken tokenizer_config.json). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fileio.h"
#include "model/model.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"
#include "harness.h"


#define DIR_REL "tests/data/models/tiny-llama3-f32"
#define MODEL_DIR COLT_SOURCE_DIR "/" DIR_REL

static bool ids_equal(const int *a, size_t n, const json_t *want) {
    if (n != json_array_size(want)) return false;
    for (size_t i = 0; i < n; i++)
        if (a[i] != json_integer_value(json_array_get(want, i))) return false;
    return true;
}

static void print_ids(const char *label, const int *ids, size_t n) {
    printf("    %s [", label);
    for (size_t i = 0; i < n; i++) printf("%s%d", i ? "," : "", ids[i]);
    printf("]\n");
}

/* The tokenizer files: the big integer, the template file, the rendered chat. */
static void test_tokenizer(const json_t *chat) {
    char err[ERR_LEN];
    Tokenizer *tok = NULL;
    int rc = tokenizer_load(&tok, MODEL_DIR, err);
    CHECK(rc == 0, "tokenizer_load: %s", err);
    if (rc != 0) return;
    char *jinja = NULL;
    COLT_ASSERT(file_read_all(MODEL_DIR "/chat_template.jinja", &jinja, NULL, err) == 0);
    bool from_file = tokenizer_chat_template(tok) && strcmp(tokenizer_chat_template(tok), jinja) == 0;
    printf("  tokenizer loaded (tokenizer_config.json's model_max_length has 31 digits); chat template from "
           "chat_template.jinja: %s\n", from_file ? "yes" : "NO");
    CHECK(from_file, "the chat template is not chat_template.jinja's");
    free(jinja);

    const json_t *msgs = json_object_get(chat, "messages");
    size_t n = json_array_size(msgs);
    ChatMessage m[8];
    COLT_ASSERT(n <= 8);
    for (size_t i = 0; i < n; i++)
        m[i] = (ChatMessage){json_string_value(json_object_get(json_array_get(msgs, i), "role")),
                             json_string_value(json_object_get(json_array_get(msgs, i), "content"))};
    char *text = NULL;
    rc = chat_template_render(&text, tokenizer_chat_template(tok), m, n, true, tokenizer_bos_token(tok),
                              tokenizer_eos_token(tok), err);
    CHECK(rc == 0, "render: %s", err);
    if (rc == 0) {
        bool same = strcmp(text, json_string_value(json_object_get(chat, "text"))) == 0;
        int *ids = NULL;
        size_t n_ids = 0;
        COLT_ASSERT(tokenizer_encode(tok, text, strlen(text), &ids, &n_ids, err) == 0);
        bool same_ids = ids_equal(ids, n_ids, json_object_get(chat, "ids"));
        printf("  chat (%zu messages): text %s apply_chat_template's; %zu ids %s\n", n,
               same ? "equal to" : "DIFFERS from", n_ids, same_ids ? "equal" : "DIFFER");
        if (!same_ids) print_ids("colt", ids, n_ids);
        CHECK(same && same_ids, "chat rendering differs from transformers");
        free(ids);
    }
    free(text);
    tokenizer_free(tok);
}

/* Sharded weights, eos list from generation_config.json, log-probs of chat + completion. */
static void test_model(const json_t *chat) {
    char err[ERR_LEN];
    CHECK(file_exists(MODEL_DIR "/model.safetensors.index.json") && !file_exists(MODEL_DIR "/model.safetensors"),
          "the fixture is not sharded");
    ModelConfig cfg;
    GenerationDefaults gen;
    int rc = model_config_load(&cfg, &gen, MODEL_DIR, err);
    CHECK(rc == 0, "model_config_load: %s", err);
    if (rc != 0) return;
    const json_t *eos = json_object_get(chat, "eos_token_id");
    int found = 0;
    for (size_t i = 0; i < json_array_size(eos); i++)
        for (int k = 0; k < cfg.n_eos; k++) found += cfg.eos_token_ids[k] == json_integer_value(json_array_get(eos, i));
    printf("  config: %s RoPE, dtype %s; eos ids from config + generation_config.json: %d (want both of [%lld, %lld])\n",
           model_rope_type_name(cfg.rope_type), cfg.torch_dtype == DTYPE_F32 ? "float32" : "other", cfg.n_eos,
           (long long)json_integer_value(json_array_get(eos, 0)), (long long)json_integer_value(json_array_get(eos, 1)));
    CHECK(found == 2 && cfg.rope_type == ROPE_LLAMA3 && cfg.torch_dtype == DTYPE_F32, "config read wrongly");

    Model *m = NULL;
    rc = model_load(&m, MODEL_DIR, backend_cpu(), err);
    CHECK(rc == 0, "model_load (sharded): %s", err);
    if (rc != 0) return;
    const json_t *ids_j = json_object_get(chat, "ids"), *comp = json_object_get(chat, "completion");
    int T = (int)(json_array_size(ids_j) + json_array_size(comp)), V = cfg.vocab_size;
    int *ids = malloc(sizeof(int) * (size_t)T), *slot = calloc((size_t)T, sizeof(int)), *pos = malloc(sizeof(int) * (size_t)T);
    for (int t = 0; t < T; t++) {
        size_t np = json_array_size(ids_j);
        ids[t] = (int)json_integer_value((size_t)t < np ? json_array_get(ids_j, (size_t)t) : json_array_get(comp, (size_t)t - np));
        pos[t] = t;
    }
    ModelState *st;
    COLT_ASSERT(model_state_create(&st, m, 1, T, T, err) == 0);
    float *logits = malloc(sizeof(float) * (size_t)T * V);
    rc = model_forward(m, st, ids, slot, pos, T, NULL, logits, err);
    CHECK(rc == 0, "forward: %s", err);
    double worst = 0.0;
    const json_t *lp = json_object_get(chat, "logprobs");
    for (int t = 0; rc == 0 && t + 1 < T; t++) {
        const float *row = logits + (size_t)t * V;
        double mx = row[0], sum = 0.0;
        for (int v = 1; v < V; v++) mx = fmax(mx, row[v]);
        for (int v = 0; v < V; v++) sum += exp((double)row[v] - mx);
        double got = (double)row[ids[t + 1]] - mx - log(sum);
        worst = fmax(worst, fabs(got - json_number_value(json_array_get(lp, (size_t)t))));
    }
    printf("  sharded checkpoint: log-probs of chat + completion (T=%d) max |diff| vs transformers = %.3g\n", T, worst);
    CHECK(rc == 0 && worst < 1e-4, "log-probs differ by %.3g (tolerance 1e-4)", worst);
    free(ids), free(slot), free(pos), free(logits);
    model_state_free(st);
    model_free(m);
}

/* colt generate on the chat: greedy, stopped by generation_config.json's second eos id. */
static void test_generate(const json_t *chat, const char *tmp) {
    char prompts[600], out[600], cmd[2400];
    snprintf(prompts, sizeof prompts, "%s/prompts.jsonl", tmp);
    snprintf(out, sizeof out, "%s/out.jsonl", tmp);
    json_t *line = json_pack("{s:O}", "messages", json_object_get(chat, "messages"));
    char *text = json_dumps(line, JSON_COMPACT);
    json_decref(line);
    FILE *f = fopen(prompts, "w");
    COLT_ASSERT(f);
    fprintf(f, "%s\n", text);
    fclose(f);
    free(text);
    snprintf(cmd, sizeof cmd, "%s generate --model %s --prompts %s --json --max_new_tokens 24 > %s 2>%s/err.txt",
             COLT_BINARY, MODEL_DIR, prompts, out, tmp);
    int rc = system(cmd);
    CHECK(rc == 0, "colt generate failed (%d): see %s/err.txt", rc, tmp);
    char *body = NULL, err[ERR_LEN];
    if (rc != 0 || file_read_all(out, &body, NULL, err) != 0) return;
    json_t *o = json_loads(body, JSON_DISABLE_EOF_CHECK, NULL);
    free(body);
    const json_t *got = json_object_get(o, "ids"), *want = json_object_get(chat, "completion");
    size_t n = json_array_size(got);
    int ids[64] = {0};
    for (size_t i = 0; i < n && i < 64; i++) ids[i] = (int)json_integer_value(json_array_get(got, i));
    bool same = n <= 64 && ids_equal(ids, n, want);
    long long stop = json_integer_value(json_array_get(json_object_get(chat, "eos_token_id"), 1));
    printf("  colt generate --json: %zu tokens, %s transformers' greedy ids, last %d (eos list's %lld)\n", n,
           same ? "equal to" : "DIFFERENT from", n ? ids[n - 1] : -1, stop);
    if (!same) print_ids("colt", ids, n < 64 ? n : 64);
    CHECK(same && n < 24, "generate differs from transformers or did not stop");
    json_decref(o);
}

/* A broken tokenizer_config.json is named as such (not tokenizer.json). */
static void test_errors(const char *tmp) {
    char dir[600], cmd[4096], err[ERR_LEN] = "";
    snprintf(dir, sizeof dir, "%s/broken", tmp);
    snprintf(cmd, sizeof cmd, "mkdir -p %s && cp %s/tokenizer.json %s/ && printf '{\"bos_token\": [1,' > %s/tokenizer_config.json",
             dir, MODEL_DIR, dir, dir);
    COLT_ASSERT(system(cmd) == 0);
    Tokenizer *tok = NULL;
    int rc = tokenizer_load(&tok, dir, err);
    char want[700];
    snprintf(want, sizeof want, "%s/tokenizer_config.json: not valid JSON", dir);
    bool ok = rc != 0 && strncmp(err, want, strlen(want)) == 0;
    printf("  %-4s broken tokenizer_config.json -> %s\n", ok ? "ok" : "FAIL", err);
    CHECK(ok, "error should start with '%s'", want);
    if (rc == 0) tokenizer_free(tok);
}

int main(void) {
    char err[ERR_LEN], *text = NULL;
    size_t len = 0;
    if (file_read_all(COLT_SOURCE_DIR "/tests/data/models/goldens.json", &text, &len, err) != 0) {
        printf("FAIL: %s\n", err);
        return 1;
    }
    json_t *root = json_loadb(text, len, 0, NULL);
    free(text);
    COLT_ASSERT(root);
    const json_t *chat = NULL, *models = json_object_get(root, "models");
    for (size_t i = 0; i < json_array_size(models); i++)
        if (json_object_get(json_array_get(models, i), "chat")) chat = json_object_get(json_array_get(models, i), "chat");
    if (!chat) {
        printf("FAIL: goldens.json has no \"chat\" entry (regenerate with tests/ref/make_model_goldens.py)\n");
        return 1;
    }
    char tmp[] = "/tmp/colt_test_hf_folder_XXXXXX";
    COLT_ASSERT(mkdtemp(tmp));
    printf("%s, as transformers 5 saved it\n", DIR_REL);
    test_tokenizer(chat);
    test_model(chat);
    test_generate(chat, tmp);
    test_errors(tmp);
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", tmp);
    if (system(cmd) != 0) printf("warning: could not remove %s\n", tmp);
    json_decref(root);
    printf("%s: %d failures\n", g_failures ? "FAILED" : "OK", g_failures);
    return g_failures ? 1 : 0;
}
