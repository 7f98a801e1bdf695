/* test_dataset.c — dataset loading and prompt rendering against goldens from
 * tests/ref/make_dataset_goldens.py (transformers' apply_chat_template with the
 * Qwen2.5 tokenizer), preserved columns, every bad fixture's error text, the
 * GSM8K test file (no "prompt" column: an error listing its columns; loaded
 * with dataset_prompt_column "question"), the layouts datasets' to_json
 * writes (JSON Lines in a .json file, an array, one object), a conversational
 * prompt column under another name, parquet/arrow refused, and the
 * epoch shuffle (a permutation, reproducible, different per epoch and seed,
 * uniform over the 6 orders of 3 rows). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "data/dataset.h"
#include "tokenizer/tokenizer.h"
#include "shared_data.h"
#include "harness.h"

#define FIXTURES COLT_SOURCE_DIR "/tests/data/datasets/"


static void print_escaped(FILE *f, const char *s) {
    for (; *s; s++) fputs(*s == '\n' ? "\\n" : (char[2]){*s, 0}, f);
}

/* Loads a fixture and compares every row's prompt text with the golden list. */
static void check_goldens(const char *name, json_t *goldens, const Tokenizer *tok, int want_conversational[]) {
    char path[512], err[ERR_LEN];
    snprintf(path, sizeof path, FIXTURES "%s", name);
    Dataset *d = NULL;
    int rc = dataset_load(&d, path, err);
    CHECK(rc == 0, "%s: load failed: %s", name, err);
    if (rc != 0) return;
    json_t *want = json_object_get(goldens, name);
    CHECK(dataset_size(d) == json_array_size(want), "%s: %zu rows, golden has %zu", name, dataset_size(d),
          json_array_size(want));
    int equal = 0;
    for (size_t i = 0; i < dataset_size(d) && i < json_array_size(want); i++) {
        CHECK(dataset_is_conversational(d, i) == want_conversational[i], "%s row %zu: conversational=%d, want %d",
              name, i, dataset_is_conversational(d, i), want_conversational[i]);
        char *text = NULL;
        rc = dataset_prompt_text(&text, d, i, tok, NULL, err);
        CHECK(rc == 0, "%s row %zu: prompt text failed: %s", name, i, err);
        if (rc != 0) continue;
        const char *expected = json_string_value(json_array_get(want, i));
        int same = strcmp(text, expected) == 0;
        equal += same;
        CHECK(same, "%s row %zu: prompt text differs from transformers' golden", name, i);
        if (!same) {
            fprintf(stderr, "  got:      \"");
            print_escaped(stderr, text);
            fprintf(stderr, "\"\n  expected: \"");
            print_escaped(stderr, expected);
            fprintf(stderr, "\"\n");
        }
        free(text);
    }
    printf("%-22s %zu rows, %d/%zu prompt texts byte-identical to transformers\n", name, dataset_size(d), equal,
           json_array_size(want));
    dataset_free(d);
}

static void test_goldens(const Tokenizer *tok) {
    json_error_t jerr;
    json_t *goldens = json_load_file(FIXTURES "goldens.json", 0, &jerr);
    CHECK(goldens != NULL, "goldens.json: %s", jerr.text);
    if (!goldens) return;
    check_goldens("standard.jsonl", goldens, tok, (int[]){0, 0, 0});
    check_goldens("conversational.jsonl", goldens, tok, (int[]){1, 1, 1});
    check_goldens("array.json", goldens, tok, (int[]){0, 1, 0});
    json_decref(goldens);
}

static void test_columns(void) {
    char err[ERR_LEN];
    Dataset *d = NULL;
    int rc = dataset_load(&d, FIXTURES "standard.jsonl", err);
    CHECK(rc == 0, "standard.jsonl: %s", err);
    if (rc != 0) return;
    json_t *r0 = dataset_row(d, 0), *r1 = dataset_row(d, 1), *r2 = dataset_row(d, 2);
    CHECK(!strcmp(json_string_value(json_object_get(r0, "answer")), "5"), "row 0 answer");
    CHECK(json_integer_value(json_object_get(r0, "level")) == 1, "row 0 level");
    CHECK(json_array_size(json_object_get(r1, "tags")) == 2, "row 1 tags list");
    CHECK(json_is_null(json_object_get(r2, "extra")), "row 2 extra is null (kept)");
    CHECK(!strcmp(json_string_value(json_object_get(r2, "answer")), "\\frac{1}{2}"), "row 2 answer");
    CHECK(json_object_size(r0) == 3 && json_object_size(r1) == 3 && json_object_size(r2) == 3,
          "every column kept (sizes %zu %zu %zu, want 3 3 3)", json_object_size(r0), json_object_size(r1),
          json_object_size(r2));
    printf("columns: answer/level/tags/extra preserved with their JSON types\n");
    dataset_free(d);

    /* A byte-order mark and CRLF line ends (files saved on Windows) load. */
    rc = dataset_load(&d, FIXTURES "bom_crlf.data", err);
    CHECK(rc == 0 && dataset_size(d) == 2 && !strcmp(json_string_value(json_object_get(dataset_row(d, 1), "prompt")),
                                                     "second"),
          "bom_crlf.data (JSONL by content, BOM, CRLF): rc=%d %s", rc, rc ? err : "");
    printf("bom_crlf.data:  %s\n", rc == 0 ? "2 rows (BOM skipped, CRLF accepted, JSONL detected by content)" : err);
    if (rc == 0) dataset_free(d);

    /* A conversational prompt without a chat template is an error, not a guess. */
    rc = dataset_load(&d, FIXTURES "conversational.jsonl", err);
    CHECK(rc == 0, "conversational.jsonl: %s", err);
    if (rc != 0) return;
    char *text = NULL;
    rc = dataset_prompt_text(&text, d, 0, NULL, NULL, err);
    CHECK(rc != 0 && strstr(err, "no chat template") && !text, "messages without a template: rc=%d err=%s", rc,
          rc ? err : "");
    printf("no tokenizer:   \"%s\"\n", err);
    dataset_free(d);
}

static void test_bad_fixtures(void) {
    static const char *const cases[][2] = {
        {"bad_prompt_number.jsonl",
         "bad_prompt_number.jsonl line 3: \"prompt\" must be a string or a list of messages, got number"},
        {"bad_missing_prompt.jsonl",
         "bad_missing_prompt.jsonl line 2: no 'prompt' column (columns: question); set dataset_prompt_column"},
        {"bad_invalid_json.jsonl", "bad_invalid_json.jsonl line 2: invalid JSON"},
        {"bad_not_object.jsonl", "bad_not_object.jsonl line 3: expected a JSON object, got list"},
        {"bad_empty.jsonl", "bad_empty.jsonl: the dataset has no rows"},
        {"bad_empty_messages.jsonl", "bad_empty_messages.jsonl line 1: \"prompt\" is an empty list of messages"},
        {"bad_message_role.jsonl", "bad_message_role.jsonl line 1: \"prompt\" message 1 has no \"role\""},
        {"bad_message_content.jsonl",
         "bad_message_content.jsonl line 1: \"prompt\" message 0: \"content\" must be a string, got number"},
        {"bad_utf8.jsonl", "bad_utf8.jsonl line 2: invalid UTF-8"},
        {"bad_object.json", "bad_object.json (one object): no 'prompt' column (columns: train): 'train' holds the "
                            "rows, a layout that is not supported; write them as JSON Lines or a JSON array"},
        {"bad_array_item.json",
         "bad_array_item.json index 1: no 'prompt' column (columns: answer); set dataset_prompt_column"},
        {"bad_invalid.json", "bad_invalid.json line 2 column"},
        {"bad_empty_array.json", "bad_empty_array.json: the dataset has no rows"},
        {"does_not_exist.jsonl", "does_not_exist.jsonl"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char path[512], err[ERR_LEN] = "";
        snprintf(path, sizeof path, FIXTURES "%s", cases[i][0]);
        Dataset *d = (Dataset *)1;
        int rc = dataset_load(&d, path, err);
        int ok = rc != 0 && d == NULL && strstr(err, cases[i][1]) != NULL;
        CHECK(ok, "%s: rc=%d, error \"%s\" should contain \"%s\"", cases[i][0], rc, err, cases[i][1]);
        const char *shown = strstr(err, "datasets/");
        printf("%-26s -> %s\n", cases[i][0], shown ? shown + 9 : err);
        if (rc == 0) dataset_free(d);
    }
}

/* GSM8K has "question"/"answer" but no "prompt": loading it as-is fails on
 * line 1 listing the columns; with the prompt column "question" it loads. */
static void test_gsm8k(void) {
    char err[ERR_LEN] = "";
    Dataset *d = NULL;
    int rc = dataset_load(&d, COLT_SHARED_DATA "/gsm8k/test.jsonl", err);
    CHECK(rc != 0 && strstr(err, "gsm8k/test.jsonl line 1: no 'prompt' column (columns: question, answer); set "
                                 "dataset_prompt_column"),
          "gsm8k: rc=%d err=%s", rc, err);
    printf("gsm8k/test.jsonl (no \"prompt\" column) -> %s\n", strstr(err, "gsm8k/") ? strstr(err, "gsm8k/") : err);
    if (rc == 0) dataset_free(d);
    rc = dataset_load_column(&d, COLT_SHARED_DATA "/gsm8k/test.jsonl", "question", err);
    CHECK(rc == 0 && dataset_size(d) == 1319, "gsm8k with column 'question': rc=%d %s", rc, rc ? err : "");
    if (rc != 0) return;
    char *text = NULL;
    CHECK(dataset_prompt_text(&text, d, 0, NULL, NULL, err) == 0 && text &&
              !strcmp(text, json_string_value(json_object_get(dataset_row(d, 0), "question"))) &&
              strncmp(text, "Janet", 5) == 0,
          "gsm8k row 0 prompt '%.40s'", text ? text : "(null)");
    printf("gsm8k/test.jsonl with dataset_prompt_column question: %zu rows, row 0 \"%.40s...\"\n", dataset_size(d),
           text ? text : "");
    free(text);
    dataset_free(d);
}

/* Writes text to dir/name; returns the path (static buffer). */
static const char *write_file(const char *dir, const char *name, const char *text) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *fp = fopen(path, "w");
    if (!fp) return path;
    fputs(text, fp);
    fclose(fp);
    return path;
}

/* The layouts datasets' to_json and TRL users produce: JSON Lines in a .json
 * file (to_json's default), a JSON array, one object; the prompt taken from
 * another column (dataset_prompt_column), conversational too; parquet and
 * arrow refused with the conversion. */
static void test_formats_and_columns(const Tokenizer *tok) {
    char dir[] = "/tmp/colt_test_dataset_XXXXXX", err[ERR_LEN];
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp failed");
        return;
    }
    Dataset *d = NULL;
    /* what Dataset.from_dict({...}).to_json("x.json") writes (datasets 5.2.0): JSON Lines, compact */
    const char *p = write_file(dir, "to_json.json", "{\"question\":\"a\",\"answer\":\"1\"}\n{\"question\":\"b\",\"answer\":\"2\"}\n");
    int rc = dataset_load_column(&d, p, "question", err);
    CHECK(rc == 0 && dataset_size(d) == 2, "to_json.json (JSON Lines in .json): rc %d %s", rc, rc ? err : "");
    if (rc == 0) {
        char *text = NULL;
        CHECK(dataset_prompt_text(&text, d, 1, tok, NULL, err) == 0 && text && strcmp(text, "b") == 0 &&
                  !dataset_is_conversational(d, 1),
              "to_json.json row 1 prompt '%s'", text ? text : "(null)");
        CHECK(!strcmp(json_string_value(json_object_get(dataset_row(d, 1), "answer")), "2"), "answer column kept");
        free(text);
        dataset_free(d);
    }
    printf("to_json.json (JSON Lines, .json), prompt column 'question': %s\n", rc == 0 ? "2 rows" : err);
    /* to_json(lines=False): an array */
    p = write_file(dir, "records.json", "[{\"question\":\"a\",\"answer\":\"1\"},{\"question\":\"b\",\"answer\":\"2\"}]\n");
    rc = dataset_load_column(&d, p, "question", err);
    CHECK(rc == 0 && dataset_size(d) == 2, "records.json: rc %d %s", rc, rc ? err : "");
    if (rc == 0) dataset_free(d);
    /* one object over several lines: one row, as datasets' json loader reads it */
    p = write_file(dir, "one.json", "{\n  \"prompt\": \"only\",\n  \"answer\": \"x\"\n}\n");
    rc = dataset_load(&d, p, err);
    CHECK(rc == 0 && dataset_size(d) == 1 &&
              !strcmp(json_string_value(json_object_get(dataset_row(d, 0), "prompt")), "only"),
          "one.json (one object, several lines): rc %d %s", rc, rc ? err : "");
    if (rc == 0) dataset_free(d);
    /* a conversational column under another name renders as the "prompt" fixture does */
    json_error_t jerr;
    json_t *goldens = json_load_file(FIXTURES "goldens.json", 0, &jerr);
    json_t *want = json_object_get(goldens, "conversational.jsonl");
    Dataset *conv = NULL;
    rc = dataset_load(&conv, FIXTURES "conversational.jsonl", err);
    CHECK(rc == 0, "conversational.jsonl: %s", err);
    char *lines = NULL;
    size_t lines_len = 0;
    FILE *mem = open_memstream(&lines, &lines_len);
    for (size_t i = 0; conv && i < dataset_size(conv); i++) {
        json_t *row = json_pack("{s:O,s:s}", "messages", json_object_get(dataset_row(conv, i), "prompt"), "prompt",
                                "not this one");
        char *s = json_dumps(row, JSON_COMPACT);
        fprintf(mem, "%s\n", s);
        free(s);
        json_decref(row);
    }
    fclose(mem);
    p = write_file(dir, "messages.jsonl", lines);
    rc = dataset_load_column(&d, p, "messages", err);
    CHECK(rc == 0 && conv && dataset_size(d) == dataset_size(conv), "messages.jsonl: rc %d %s", rc, rc ? err : "");
    int same = 0;
    for (size_t i = 0; rc == 0 && i < dataset_size(d); i++) {
        char *text = NULL;
        CHECK(dataset_is_conversational(d, i), "messages.jsonl row %zu is conversational", i);
        if (dataset_prompt_text(&text, d, i, tok, NULL, err) == 0 && !strcmp(text, json_string_value(json_array_get(want, i))))
            same++;
        free(text);
    }
    CHECK(rc == 0 && same == (int)json_array_size(want), "messages column: %d of %zu prompt texts equal the goldens",
          same, json_array_size(want));
    printf("column 'messages' (conversational): %d/%zu prompt texts byte-identical to transformers\n", same,
           json_array_size(want));
    if (rc == 0) dataset_free(d);
    dataset_free(conv);
    free(lines);
    json_decref(goldens);
    /* a missing column lists those found */
    rc = dataset_load_column(&d, FIXTURES "standard.jsonl", "question", err);
    CHECK(rc != 0 && strstr(err, "standard.jsonl line 1: no 'question' column (columns: prompt, answer, level); set "
                                 "dataset_prompt_column"),
          "standard.jsonl with column 'question': %s", err);
    printf("standard.jsonl, column 'question' -> %s\n", strstr(err, "datasets/") ? strstr(err, "datasets/") + 9 : err);
    /* parquet and arrow: the one-line conversion, before the file is even read */
    const char *kinds[] = {"parquet", "arrow"};
    for (int k = 0; k < 2; k++) {
        char path[256], want_text[512];
        snprintf(path, sizeof path, "%s/train.%s", dir, kinds[k]);
        snprintf(want_text, sizeof want_text,
                 "python -c \"import datasets; datasets.load_dataset('%s', data_files='%s')['train'].to_json('%s/"
                 "train.jsonl')\"",
                 kinds[k], path, dir);
        d = (Dataset *)1;
        rc = dataset_load(&d, path, err);
        CHECK(rc != 0 && !d && strstr(err, path) == err && strstr(err, want_text) && !strchr(err, '\n'),
              "%s: %s", path, err);
        printf("train.%s -> %s\n", kinds[k], strstr(err, "train.") ? strstr(err, "train.") : err);
    }
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
}

static int is_permutation(const size_t *order, size_t n) {
    char *seen = calloc(n ? n : 1, 1);
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        if (order[i] >= n || seen[order[i]]) ok = 0;
        else seen[order[i]] = 1;
    }
    free(seen);
    return ok;
}

/* TRL's chat_template_kwargs reach the template: Qwen3's, with the Qwen2.5
 * tokenizer's files, renders an empty think block after the generation prompt
 * when enable_thinking is false, and none by default; a tool-calling assistant
 * turn (any keys of a message) reaches it too. */
static void test_template_kwargs(void) {
    char dir[] = "/tmp/colt_test_dataset_kw_XXXXXX", err[ERR_LEN], cmd[1024];
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp failed");
        return;
    }
    snprintf(cmd, sizeof cmd, "cp %s/qwen2.5-tokenizer/tokenizer.json %s/qwen2.5-tokenizer/tokenizer_config.json %s/ && "
             "cp %s/tests/data/qwen3_chat_template.jinja %s/chat_template.jinja",
             COLT_SHARED_DATA, COLT_SHARED_DATA, dir, COLT_SOURCE_DIR, dir);
    CHECK(system(cmd) == 0, "%s failed", cmd);
    Tokenizer *tok = NULL;
    Dataset *d = NULL;
    if (tokenizer_load(&tok, dir, err) != 0) {
        CHECK(0, "tokenizer with Qwen3's template: %s", err);
        return;
    }
    const char *p = write_file(dir, "chats.jsonl",
                               "{\"prompt\": [{\"role\": \"user\", \"content\": \"What is 2+2?\"}]}\n"
                               "{\"prompt\": [{\"role\": \"user\", \"content\": \"Weather?\"}, {\"role\": \"assistant\", "
                               "\"content\": \"\", \"tool_calls\": [{\"type\": \"function\", \"function\": {\"name\": "
                               "\"get_weather\", \"arguments\": {\"city\": \"Paris\"}}}]}, {\"role\": \"tool\", "
                               "\"content\": \"sunny\"}]}\n");
    int rc = dataset_load(&d, p, err);
    CHECK(rc == 0, "chats.jsonl: %s", err);
    json_t *no_think = json_pack("{s:b}", "enable_thinking", 0);
    char *plain = NULL, *off = NULL, *tools = NULL;
    if (rc == 0) {
        CHECK(dataset_prompt_text(&plain, d, 0, tok, NULL, err) == 0, "%s", err);
        CHECK(dataset_prompt_text(&off, d, 0, tok, no_think, err) == 0, "%s", err);
        CHECK(dataset_prompt_text(&tools, d, 1, tok, NULL, err) == 0, "%s", err);
    }
    const char *gen = "<|im_start|>assistant\n", *empty_think = "<|im_start|>assistant\n<think>\n\n</think>\n\n";
    bool plain_ok = plain && strlen(plain) >= strlen(gen) && strcmp(plain + strlen(plain) - strlen(gen), gen) == 0;
    bool off_ok = off && strlen(off) >= strlen(empty_think) &&
                  strcmp(off + strlen(off) - strlen(empty_think), empty_think) == 0;
    bool tools_ok = tools && strstr(tools, "<tool_call>\n{\"name\": \"get_weather\"") &&
                    strstr(tools, "<tool_response>\nsunny\n</tool_response>");
    CHECK(plain_ok, "Qwen3 prompt without kwargs should end with the generation prompt: %s", plain ? plain : "");
    CHECK(off_ok, "enable_thinking false should add an empty think block: %s", off ? off : "");
    CHECK(tools_ok, "a tool call and its result should reach the template: %s", tools ? tools : "");
    printf("chat_template_kwargs: Qwen3 template, enable_thinking false adds the empty think block; tool calls "
           "and tool results in a prompt render\n");
    free(plain), free(off), free(tools);
    json_decref(no_think);
    dataset_free(d);
    tokenizer_free(tok);
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) printf("warning: could not remove %s\n", dir);
}

static void test_epoch_order(void) {
    enum { N = 1000 };
    size_t *a = malloc(N * sizeof *a), *b = malloc(N * sizeof *b), *c = malloc(N * sizeof *c), *e = malloc(N * sizeof *e);
    dataset_epoch_order(a, N, 1234, 0);
    dataset_epoch_order(b, N, 1234, 0);
    dataset_epoch_order(c, N, 1234, 1);
    dataset_epoch_order(e, N, 1235, 0);
    size_t fixed = 0, same_epoch = 0, same_seed = 0;
    for (size_t i = 0; i < N; i++) {
        fixed += a[i] == i;
        same_epoch += a[i] == c[i];
        same_seed += a[i] == e[i];
    }
    CHECK(is_permutation(a, N) && is_permutation(c, N) && is_permutation(e, N), "orders are permutations of 0..%d",
          N - 1);
    CHECK(memcmp(a, b, N * sizeof *a) == 0, "same (seed, epoch) gives the same order");
    CHECK(fixed < 20 && same_epoch < 20 && same_seed < 20,
          "orders look random: %zu fixed points, %zu shared with epoch 1, %zu shared with seed 1235 (each ~1)", fixed,
          same_epoch, same_seed);
    printf("epoch order n=%d: permutation, reproducible; %zu fixed points, %zu positions equal to epoch 1, %zu to "
           "another seed\n", N, fixed, same_epoch, same_seed);

    size_t one = 7;
    dataset_epoch_order(&one, 1, 1, 1);
    CHECK(one == 0, "n=1 gives [0]");
    dataset_epoch_order(NULL, 0, 1, 1);

    /* The 6 orders of 3 rows over 6000 epochs: each about 1000 times. */
    int counts[6] = {0}, all_permutations = 1;
    for (uint64_t ep = 0; ep < 6000; ep++) {
        size_t o[3];
        dataset_epoch_order(o, 3, 42, ep);
        all_permutations &= is_permutation(o, 3);
        counts[o[0] * 2 + (o[1] > o[2])]++;
    }
    CHECK(all_permutations, "n=3: every epoch's order is a permutation");
    int lo = 6000, hi = 0;
    for (int k = 0; k < 6; k++) {
        lo = counts[k] < lo ? counts[k] : lo;
        hi = counts[k] > hi ? counts[k] : hi;
    }
    CHECK(lo > 880 && hi < 1120, "n=3 order frequencies between %d and %d, want within 1000 +- 120", lo, hi);
    printf("epoch order n=3 over 6000 epochs: each of 6 orders seen %d..%d times (expected 1000)\n", lo, hi);
    free(a);
    free(b);
    free(c);
    free(e);
}

int main(void) {
    char err[ERR_LEN];
    Tokenizer *tok = NULL;
    const bool have_shared = shared_data_present(); /* the Qwen2.5 tokenizer and GSM8K come from there */
    if (have_shared && tokenizer_load(&tok, COLT_SHARED_DATA "/qwen2.5-tokenizer", err) != 0) {
        fprintf(stderr, "FAIL: cannot load the Qwen2.5 tokenizer: %s\n", err);
        return 1;
    }
    if (have_shared) test_goldens(tok);
    else shared_data_skipped("prompts rendered with the Qwen2.5 tokenizer against transformers");
    test_columns();
    test_bad_fixtures();
    if (have_shared) test_gsm8k();
    else shared_data_skipped("gsm8k/test.jsonl's columns");
    if (have_shared) test_formats_and_columns(tok);
    else shared_data_skipped("dataset layouts and prompt columns (rendered with the Qwen2.5 tokenizer)");
    if (have_shared) test_template_kwargs();
    else shared_data_skipped("chat_template_kwargs with Qwen3's template (the Qwen2.5 tokenizer's files)");
    test_epoch_order();
    tokenizer_free(tok);
    printf("%s: %d checks, %d failed\n", g_failures ? "FAIL" : "OK", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
