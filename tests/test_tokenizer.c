/* test_tokenizer.c — the tokenizer against Hugging Face `tokenizers`.
 *
 * Compares, exactly: the 47 llama.cpp Qwen2 vectors (with both Qwen
 * tokenizer.json files, merges as arrays and as "a b" strings), and the corpus
 * goldens of tests/ref/make_tokenizer_goldens.py (ids, and decode with and
 * without skip_special_tokens) for Qwen2.5, Qwen2 and stories260K, and the
component goldens (normalizers, pre-tokenizers, decoders and added-token
options the three real files do not use). Then the
 * error paths (bad JSON, non-BPE model, unknown components, invalid UTF-8, id
 * out of range) and the tokenizer_config.json accessors. Exits non-zero on any
 * mismatch, printing the first ones with their text. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fileio.h"
#include "tokenizer/tokenizer.h"
#include "shared_data.h"
#include "harness.h"


static Tokenizer *load_or_die(const char *dir) {
    Tokenizer *t;
    char err[ERR_LEN];
    if (tokenizer_load(&t, dir, err)) {
        fprintf(stderr, "FAIL: cannot load %s: %s\n", dir, err);
        exit(1);
    }
    return t;
}

static void print_ids(const char *label, const int *ids, size_t n) {
    fprintf(stderr, "    %s (%zu):", label, n);
    for (size_t i = 0; i < n && i < 40; i++) fprintf(stderr, " %d", ids[i]);
    fprintf(stderr, n > 40 ? " ...\n" : "\n");
}

/* Encodes text and compares with want; prints the first few mismatches. */
static bool expect_ids(const Tokenizer *t, const char *what, const char *text, size_t len, const int *want, size_t n_want,
                       int *shown) {
    int *ids;
    size_t n;
    char err[ERR_LEN];
    if (tokenizer_encode(t, text, len, &ids, &n, err)) {
        fprintf(stderr, "  %s: encode failed: %s\n", what, err);
        return false;
    }
    bool ok = n == n_want && (n == 0 || memcmp(ids, want, n * sizeof(int)) == 0);
    if (!ok && (*shown)++ < 5) {
        fprintf(stderr, "  MISMATCH %s: text \"%.*s\"\n", what, (int)(len < 200 ? len : 200), text);
        print_ids("want", want, n_want);
        print_ids("got ", ids, n);
    }
    free(ids);
    return ok;
}

/* The llama.cpp vectors: .inp holds the texts, each followed by
 * "\n__ggml_vocab_test__\n"; .out one line of ids per text. The text after
 * the last separator (empty) pairs with the empty tail after the last line. */
static void test_llamacpp_vectors(const Tokenizer *t, const char *label) {
    char err[ERR_LEN], *inp, *outp;
    size_t inp_len, out_len;
    const char *dir = COLT_SHARED_DATA "/qwen2.5-tokenizer/tests/";
    char path[1024];
    snprintf(path, sizeof path, "%sggml-vocab-qwen2.gguf.inp", dir);
    if (file_read_all(path, &inp, &inp_len, err)) {
        CHECK(0, "%s", err);
        return;
    }
    snprintf(path, sizeof path, "%sggml-vocab-qwen2.gguf.out", dir);
    if (file_read_all(path, &outp, &out_len, err)) {
        free(inp);
        CHECK(0, "%s", err);
        return;
    }
    const char *sep = "\n__ggml_vocab_test__\n";
    size_t seplen = strlen(sep), total = 0, equal = 0;
    char *p = inp, *q = outp;
    int shown = 0;
    for (;;) {
        char *end = strstr(p, sep);
        size_t tlen = end ? (size_t)(end - p) : strlen(p);
        char *nl = strchr(q, '\n');
        size_t llen = nl ? (size_t)(nl - q) : strlen(q);
        int want[512];
        size_t n_want = 0;
        char *line = strndup(q, llen), *save = NULL;
        for (char *tok = strtok_r(line, " ", &save); tok && n_want < 512; tok = strtok_r(NULL, " ", &save))
            want[n_want++] = atoi(tok);
        free(line);
        total++;
        char what[64];
        snprintf(what, sizeof what, "%s llama.cpp vector %zu", label, total);
        if (expect_ids(t, what, p, tlen, want, n_want, &shown)) equal++;
        if (!end) break;
        p = end + seplen;
        q = nl ? nl + 1 : q + llen;
    }
    printf("%s: %zu/%zu llama.cpp vectors equal\n", label, equal, total);
    CHECK(total == 47, "%s: expected 47 llama.cpp vectors, found %zu", label, total);
    CHECK(equal == total, "%s: %zu llama.cpp vectors differ", label, total - equal);
    free(inp);
    free(outp);
}

typedef struct RowCounts {
    size_t total, ids_ok, dec_ok;
} RowCounts;

static int shown_ids, shown_dec;

/* Checks one golden row: our ids equal HF's, and decoding HF's ids (so the
 * decode check does not depend on encode) equals HF's decode in both skip
 * modes. */
static void check_row(const Tokenizer *tok, const char *label, json_t *row, RowCounts *c) {
    char err[ERR_LEN];
    json_t *jt = json_object_get(row, "text"), *jids = json_object_get(row, "ids");
    const char *text = json_string_value(jt);
    size_t tlen = json_string_length(jt);
    size_t n_want = json_array_size(jids);
    int *want = malloc((n_want + 1) * sizeof(int));
    for (size_t i = 0; i < n_want; i++) want[i] = (int)json_integer_value(json_array_get(jids, i));
    c->total++;
    if (expect_ids(tok, label, text ? text : "", tlen, want, n_want, &shown_ids)) c->ids_ok++;
    bool dok = true;
    for (int skip = 0; skip < 2; skip++) {
        json_t *jd = json_object_get(row, skip ? "decoded_skip" : "decoded");
        char *got;
        if (tokenizer_decode(tok, want, n_want, skip, &got, err)) {
            fprintf(stderr, "  %s decode failed: %s\n", label, err);
            dok = false;
            continue;
        }
        if (strlen(got) != json_string_length(jd) || memcmp(got, json_string_value(jd), strlen(got)) != 0) {
            dok = false;
            if (shown_dec++ < 5)
                fprintf(stderr, "  DECODE MISMATCH %s skip=%d: text \"%.100s\"\n    want \"%.100s\"\n    got  \"%.100s\"\n",
                        label, skip, text, json_string_value(jd), got);
        }
        free(got);
    }
    if (dok) c->dec_ok++;
    free(want);
}

static void test_goldens(Tokenizer **toks, const char **names, int n_toks) {
    char err[ERR_LEN];
    char *data;
    size_t len;
    if (file_read_all(COLT_SOURCE_DIR "/tests/data/tokenizer_goldens.jsonl", &data, &len, err)) {
        CHECK(0, "%s", err);
        return;
    }
    RowCounts counts[8] = {{0}};
    char *save = NULL;
    for (char *line = strtok_r(data, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        json_error_t jerr;
        json_t *row = json_loads(line, JSON_ALLOW_NUL, &jerr);
        CHECK(row != NULL, "goldens: bad JSON line: %s", jerr.text);
        if (!row) continue;
        const char *name = json_string_value(json_object_get(row, "tokenizer"));
        int k = -1;
        for (int i = 0; i < n_toks; i++)
            if (name && !strcmp(name, names[i])) k = i;
        CHECK(k >= 0, "goldens: unknown tokenizer '%s'", name ? name : "(null)");
        if (k >= 0) {
            char label[64];
            snprintf(label, sizeof label, "%s corpus", names[k]);
            check_row(toks[k], label, row, &counts[k]);
        }
        json_decref(row);
    }
    free(data);
    for (int k = 0; k < n_toks; k++) {
        RowCounts *c = &counts[k];
        printf("corpus %s: ids %zu/%zu equal, decode (both skip modes) %zu/%zu equal\n", names[k], c->ids_ok, c->total,
               c->dec_ok, c->total);
        CHECK(c->total >= 80, "corpus %s: only %zu goldens (expected >= 80)", names[k], c->total);
        CHECK(c->ids_ok == c->total && c->dec_ok == c->total, "corpus %s: mismatches", names[k]);
    }
}

/* Component configs: stories260K's tokenizer.json with some top-level keys
 * replaced ({"config", "overrides"} lines), each followed by its rows. */
static void test_component_goldens(void) {
    char err[ERR_LEN], *data, *base_text;
    size_t len, base_len;
    if (file_read_all(COLT_SOURCE_DIR "/tests/data/tokenizer_goldens_components.jsonl", &data, &len, err) ||
        file_read_all(COLT_SHARED_DATA "/models/stories260K/hf/tokenizer.json", &base_text, &base_len, err)) {
        CHECK(0, "%s", err);
        return;
    }
    Tokenizer *tok = NULL;
    char config[64] = "";
    RowCounts c = {0};
    size_t n_configs = 0, total = 0, ok = 0;
    char *save = NULL;
    for (char *line = strtok_r(data, "\n", &save);; line = strtok_r(NULL, "\n", &save)) {
        json_t *row = line ? json_loads(line, JSON_ALLOW_NUL, NULL) : NULL;
        CHECK(!line || row, "component goldens: bad JSON line");
        if (line && !row) continue;
        json_t *cfg = row ? json_object_get(row, "config") : NULL;
        if (!line || cfg) {
            if (tok) {
                printf("  component %s: ids %zu/%zu, decode %zu/%zu\n", config, c.ids_ok, c.total, c.dec_ok, c.total);
                CHECK(c.total >= 50 && c.ids_ok == c.total && c.dec_ok == c.total, "component %s: mismatches", config);
                total += c.total;
                ok += c.ids_ok == c.total && c.dec_ok == c.total ? c.total : 0;
                tokenizer_free(tok);
                tok = NULL;
            }
            if (!line) break;
            snprintf(config, sizeof config, "%s", json_string_value(cfg));
            c = (RowCounts){0};
            json_t *base = json_loadb(base_text, base_len, 0, NULL);
            json_object_update(base, json_object_get(row, "overrides"));
            char *text = json_dumps(base, JSON_COMPACT);
            json_decref(base);
            if (tokenizer_load_from_memory(&tok, text, strlen(text), NULL, 0, config, err)) {
                CHECK(0, "component %s does not load: %s", config, err);
                tok = NULL;
            }
            free(text);
            n_configs++;
        } else if (tok) {
            check_row(tok, config, row, &c);
        }
        json_decref(row);
    }
    printf("components: %zu configs, %zu/%zu rows equal\n", n_configs, ok, total);
    CHECK(n_configs == 8 && total >= 400 && ok == total, "component goldens: %zu configs, %zu/%zu", n_configs, ok, total);
    free(data);
    free(base_text);
}

/* Loads json and expects failure whose message contains `needle`. */
static void expect_load_error(const char *json, const char *needle) {
    Tokenizer *t = NULL;
    char err[ERR_LEN] = "";
    int rc = tokenizer_load_from_memory(&t, json, strlen(json), NULL, 0, "bad.json", err);
    CHECK(rc != 0 && t == NULL, "loading %.60s should fail", json);
    CHECK(strstr(err, needle) != NULL && strstr(err, "bad.json") != NULL,
          "error for %.60s should mention '%s' and the file, got: %s", json, needle, err);
    if (rc == 0) tokenizer_free(t);
}

static void test_errors(const Tokenizer *qwen) {
    int before = g_failures;
    expect_load_error("this is not json", "not valid JSON");
    expect_load_error("[1,2,3]", "not a JSON object");
    expect_load_error("{\"version\": \"1.0\"}", "model");
    expect_load_error("{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}", "unsupported tokenizer model 'WordPiece'");
    expect_load_error("{\"model\": {\"type\": \"BPE\"}}", "vocab");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a b\"]}}", "missing from the vocab");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
                      "\"normalizer\": {\"type\": \"BertNormalizer\"}}", "BertNormalizer");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
                      "\"pre_tokenizer\": {\"type\": \"Punctuation\"}}", "Punctuation");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
                      "\"decoder\": {\"type\": \"WordPiece\"}}", "WordPiece");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []}, "
                      "\"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, \"behavior\": \"Isolated\"}}",
                      "regex");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 99999999}, \"merges\": []}}", "invalid id");

    char err[ERR_LEN] = "";
    int *ids = NULL;
    size_t n = 0;
    const char bad_utf8[] = "abc\xff\xfe def";
    int rc = tokenizer_encode(qwen, bad_utf8, sizeof bad_utf8 - 1, &ids, &n, err);
    CHECK(rc != 0 && strstr(err, "invalid UTF-8"), "invalid UTF-8 should fail with a message, got rc=%d '%s'", rc, err);
    const char overlong[] = "\xc0\xaf";
    rc = tokenizer_encode(qwen, overlong, 2, &ids, &n, err);
    CHECK(rc != 0, "overlong UTF-8 should fail");
    const char surrogate[] = "\xed\xa0\x80";
    rc = tokenizer_encode(qwen, surrogate, 3, &ids, &n, err);
    CHECK(rc != 0, "an encoded surrogate should fail");

    char *text = NULL;
    int bad_ids[] = {9707, 999999};
    rc = tokenizer_decode(qwen, bad_ids, 2, false, &text, err);
    CHECK(rc != 0 && strstr(err, "999999") && strstr(err, "out of range"), "id out of range should fail, got '%s'", err);
    int neg[] = {-1};
    rc = tokenizer_decode(qwen, neg, 1, false, &text, err);
    CHECK(rc != 0, "negative id should fail");

    /* A byte-level decode that ends mid-character gives U+FFFD, as HF. */
    int id_c3 = tokenizer_token_id(qwen, "\xc3\x83"); /* ByteLevel char for byte 0xC3 */
    if (id_c3 >= 0) {
        int seq[] = {id_c3};
        rc = tokenizer_decode(qwen, seq, 1, false, &text, err);
        CHECK(rc == 0 && text && !strcmp(text, "\xEF\xBF\xBD"), "lone 0xC3 byte should decode to U+FFFD, got '%s'",
              text ? text : "(null)");
        free(text);
    }
    printf("errors: %s\n", g_failures == before ? "all error cases report a message" : "FAILED");
}

static void test_config(const Tokenizer *qwen, const Tokenizer *stories) {
    CHECK(tokenizer_vocab_size(qwen) == 151665, "qwen2.5 vocab size %d", tokenizer_vocab_size(qwen));
    CHECK(tokenizer_token_id(qwen, "<|im_end|>") == 151645, "qwen <|im_end|> id");
    CHECK(tokenizer_eos_id(qwen) == 151645, "qwen eos id %d", tokenizer_eos_id(qwen));
    CHECK(tokenizer_pad_id(qwen) == 151643, "qwen pad id %d", tokenizer_pad_id(qwen));
    CHECK(tokenizer_bos_id(qwen) == -1 && !strcmp(tokenizer_bos_token(qwen), ""), "qwen has no bos");
    CHECK(!tokenizer_add_bos(qwen), "qwen add_bos false");
    CHECK(tokenizer_chat_template(qwen) && strstr(tokenizer_chat_template(qwen), "<|im_start|>"), "qwen chat template");
    CHECK(!strcmp(tokenizer_id_to_token(qwen, 151644), "<|im_start|>"), "id_to_token added");
    CHECK(!strcmp(tokenizer_id_to_token(qwen, 9707), "Hello"), "id_to_token vocab");
    CHECK(tokenizer_id_to_token(qwen, 151665) == NULL && tokenizer_id_to_token(qwen, -1) == NULL, "id_to_token range");
    CHECK(tokenizer_vocab_size(stories) == 512, "stories vocab size %d", tokenizer_vocab_size(stories));
    CHECK(tokenizer_bos_id(stories) == 1 && tokenizer_eos_id(stories) == 2, "stories bos/eos");
    CHECK(!strcmp(tokenizer_bos_token(stories), "<s>") && !strcmp(tokenizer_eos_token(stories), "</s>"), "stories tokens");
    CHECK(tokenizer_add_bos(stories), "stories add_bos true");
    CHECK(tokenizer_pad_id(stories) == -1, "stories has no pad");
    CHECK(tokenizer_chat_template(stories) == NULL, "stories has no chat template");

    /* Config variants: object tokens, template lists. */
    const char *tj = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1}, \"merges\": []}}";
    const char *cj = "{\"bos_token\": {\"content\": \"a\", \"lstrip\": false}, \"eos_token\": \"b\", "
                     "\"chat_template\": [{\"name\": \"tool_use\", \"template\": \"T\"}, {\"name\": \"default\", \"template\": \"D\"}]}";
    Tokenizer *t;
    char err[ERR_LEN];
    int rc = tokenizer_load_from_memory(&t, tj, strlen(tj), cj, strlen(cj), "mini", err);
    CHECK(rc == 0, "mini tokenizer: %s", err);
    if (rc == 0) {
        CHECK(tokenizer_bos_id(t) == 0 && tokenizer_eos_id(t) == 1, "object bos token");
        CHECK(tokenizer_chat_template(t) && !strcmp(tokenizer_chat_template(t), "D"), "default template from list");
        CHECK(!tokenizer_add_bos(t), "absent add_bos_token is false");
        tokenizer_free(t);
    }

    /* A directory without tokenizer_config.json but with chat_template.jinja. */
    char dir[] = "/tmp/colt_test_tokenizer_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char *tpath = path_join(dir, "tokenizer.json"), *jpath = path_join(dir, "chat_template.jinja");
    CHECK(file_write_atomic(tpath, tj, strlen(tj), err) == 0, "%s", err);
    CHECK(file_write_atomic(jpath, "{{ messages }}", 14, err) == 0, "%s", err);
    rc = tokenizer_load(&t, dir, err);
    CHECK(rc == 0, "dir load: %s", err);
    if (rc == 0) {
        CHECK(tokenizer_chat_template(t) && !strcmp(tokenizer_chat_template(t), "{{ messages }}"), "chat_template.jinja");
        CHECK(tokenizer_bos_id(t) == -1 && !tokenizer_add_bos(t), "no config: no bos");
        tokenizer_free(t);
    }
    remove(tpath);
    remove(jpath);
    rmdir(dir);
    free(tpath);
    free(jpath);
    rc = tokenizer_load(&t, "/nonexistent/colt", err);
    CHECK(rc != 0 && strstr(err, "/nonexistent/colt/tokenizer.json"), "missing dir should name the file, got '%s'", err);
}

int main(void) {
    if (!shared_data_present()) { /* every part below uses the Qwen tokenizers or stories260K's from there */
        shared_data_skipped("test_tokenizer: the Qwen2.5, Qwen2 and stories260K tokenizers");
        return SHARED_DATA_SKIP;
    }
    Tokenizer *qwen25 = load_or_die(COLT_SHARED_DATA "/qwen2.5-tokenizer");
    Tokenizer *qwen2 = load_or_die(COLT_SHARED_DATA "/qwen2-tokenizer");
    Tokenizer *stories = load_or_die(COLT_SHARED_DATA "/models/stories260K/hf");

    test_llamacpp_vectors(qwen25, "qwen2.5");
    test_llamacpp_vectors(qwen2, "qwen2");
    Tokenizer *toks[] = {qwen25, qwen2, stories};
    const char *names[] = {"qwen2.5", "qwen2", "stories260K"};
    test_goldens(toks, names, 3);
    test_component_goldens();
    test_errors(qwen25);
    test_config(qwen25, stories);

    tokenizer_free(qwen25);
    tokenizer_free(qwen2);
    tokenizer_free(stories);
    printf("%d checks, %d failures\n", g_checks, g_failures);
    if (g_failures) {
        printf("test_tokenizer: FAILED\n");
        return 1;
    }
    printf("test_tokenizer: OK\n");
    return 0;
}
