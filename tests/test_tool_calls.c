/* test_tool_calls.c — the foundations of tool calling against TRL 1.16 /
 * transformers 5.24, with tests/data/tool_goldens.json (made by
 * tests/ref/make_tool_goldens.py):
 *   parse   — every completion of the goldens through tool_calls_parse (text)
 *             and, where ../shared/data has the tokenizer, tool_calls_parse_ids,
 *             equal as JSON to TRL's parse_response message;
 *   suffix  — tool_calls_suffix_ids equal to TRL's _get_tool_suffix_ids over
 *             Qwen2.5, Qwen3 (training variant) and Llama 3.1's templates;
 *   prompt  — prompts rendered with the schemas the tool worker reports, equal
 *             to the ids TRL renders with tools=[callables];
 *   worker  — tests/data/agent/tools.py and envs.py:MathEnv in colt's Python
 *             tool worker: schemas, results as TRL stringifies them (raise,
 *             unknown tool, async), out-of-order answers, a hanging tool cut at
 *             a 1 s limit, an environment's reset, methods and reward;
 *   errors  — bad input fails with one line that names it.
 * The parts that need the Qwen tokenizer skip with one line without ../shared. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "agent/tool_calls.h"
/*WORKER*/
#include "core/error.h"
#include "tokenizer/tokenizer.h"
#include "harness.h"
#include "shared_data.h"

#define DATA COLT_SOURCE_DIR "/tests/data"

static ToolCallFormat format_of_setup(const char *setup) {
    return strncmp(setup, "llama", 5) == 0 ? TOOL_FORMAT_LLAMA3 : TOOL_FORMAT_HERMES;
}

static int *ids_of(const json_t *list, size_t *n) {
    *n = json_array_size(list);
    int *ids = malloc(sizeof(int) * (*n ? *n : 1));
    for (size_t i = 0; i < *n; i++) ids[i] = (int)json_integer_value(json_array_get(list, i));
    return ids;
}

static bool same_ids(const int *a, size_t na, const json_t *expected) {
    if (na != json_array_size(expected)) return false;
    for (size_t i = 0; i < na; i++)
        if (a[i] != json_integer_value(json_array_get(expected, i))) return false;
    return true;
}

static char *dumps(const json_t *v) { return json_dumps(v, JSON_SORT_KEYS | JSON_COMPACT); }

/* The Qwen2.5 tokenizer of ../shared/data with Llama 3's special tokens added at
 * the goldens' ids, and Llama's bos/eos: the script's stand-in for a Llama 3.1
 * tokenizer (the same vocabulary, so only the template and specials differ). */
static Tokenizer *llama_tokenizer(const json_t *added, char *err) {
    json_error_t jerr;
    json_t *tj = json_load_file(COLT_SHARED_DATA "/qwen2.5-tokenizer/tokenizer.json", 0, &jerr);
    if (!tj) return NULL;
    json_t *list = json_object_get(tj, "added_tokens");
    size_t i;
    json_t *t;
    json_array_foreach(added, i, t) json_array_append_new(
        list, json_pack("{s:O, s:O, s:b, s:b, s:b, s:b, s:b}", "id", json_object_get(t, "id"), "content",
                        json_object_get(t, "content"), "single_word", 0, "lstrip", 0, "rstrip", 0, "normalized", 0,
                        "special", 1));
    char *text = json_dumps(tj, JSON_COMPACT);
    json_decref(tj);
    const char *config = "{\"bos_token\": \"<|begin_of_text|>\", \"eos_token\": \"<|eot_id|>\", "
                         "\"add_bos_token\": false}";
    Tokenizer *tok = NULL;
    if (tokenizer_load_from_memory(&tok, text, strlen(text), config, strlen(config), "llama-on-qwen", err) != 0)
        tok = NULL;
    free(text);
    return tok;
}

/* ---------------------------------------------------------------------------
 * parse
 * ------------------------------------------------------------------------- */

static void test_parse(const json_t *goldens, Tokenizer *qwen, Tokenizer *llama) {
    const json_t *rows = json_object_get(goldens, "parse"), *prefixes = json_object_get(goldens, "parse_prefixes");
    const json_t *schemas = json_object_get(json_object_get(goldens, "worker"), "schemas");
    size_t i, equal = 0, equal_ids = 0, n_ids = 0;
    json_t *row;
    json_array_foreach(rows, i, row) {
        const char *setup = json_string_value(json_object_get(row, "setup"));
        const char *name = json_string_value(json_object_get(row, "case"));
        const json_t *expected = json_object_get(row, "expected");
        ToolCallFormat format = format_of_setup(setup);
        const char *eos = format == TOOL_FORMAT_LLAMA3 ? "<|eot_id|>" : "<|im_end|>";
        char err[ERR_LEN];
        json_t *got = NULL;
        int rc = tool_calls_parse(&got, format, json_string_value(json_object_get(prefixes, setup)),
                                  json_string_value(json_object_get(row, "text")),
                                  json_string_value(json_object_get(row, "text_skip_special")), eos, schemas, err);
        CHECK(rc == 0, "parse %s/%s: %s", setup, name, err);
        if (rc == 0 && json_equal(got, (json_t *)expected)) {
            equal++;
        } else if (rc == 0) {
            char *a = dumps(got), *b = dumps(expected);
            CHECK(false, "parse %s/%s:\n  colt %s\n  TRL  %s", setup, name, a, b);
            free(a);
            free(b);
        }
        json_decref(got);

        Tokenizer *tok = format == TOOL_FORMAT_LLAMA3 ? llama : qwen;
        if (!tok) continue;
        /* the ids path: the prompt re-encoded from its text, the completion's ids as TRL had them */
        size_t n = 0, n_prefix = 0;
        int *ids = ids_of(json_object_get(row, "ids"), &n), *prefix_ids = NULL;
        const char *prefix = json_string_value(json_object_get(prefixes, setup));
        CHECK(tokenizer_encode(tok, prefix, strlen(prefix), &prefix_ids, &n_prefix, err) == 0, "encode: %s", err);
        rc = tool_calls_parse_ids(&got, format, tok, prefix_ids, n_prefix, ids, n, schemas, err);
        CHECK(rc == 0, "parse ids %s/%s: %s", setup, name, err);
        n_ids++;
        if (rc == 0 && json_equal(got, (json_t *)expected)) equal_ids++;
        else if (rc == 0) {
            char *a = dumps(got), *b = dumps(expected);
            CHECK(false, "parse ids %s/%s:\n  colt %s\n  TRL  %s", setup, name, a, b);
            free(a);
            free(b);
        }
        json_decref(got);
        free(ids);
        free(prefix_ids);
    }
    CHECK(json_array_size(rows) >= 80, "only %zu parse goldens", json_array_size(rows));
    printf("parse: %zu/%zu completions give TRL's message from text, %zu/%zu from ids\n", equal,
           json_array_size(rows), equal_ids, n_ids);
    if (!qwen) shared_data_skipped("tool-call parsing from token ids");
}

/* ---------------------------------------------------------------------------
 * suffix ids and prompts
 * ------------------------------------------------------------------------- */

static char *template_of(const char *setup, const Tokenizer *qwen) {
    if (!strcmp(setup, "qwen2.5") || !strcmp(setup, "qwen2.5_env")) return strdup(tokenizer_chat_template(qwen));
    const char *file = !strcmp(setup, "qwen3") ? DATA "/qwen3_training_chat_template.jinja"
                                               : DATA "/llama3.1_chat_template.jinja";
    char *path = strdup(file), *slash = strrchr(path, '/');
    *slash = '\0';
    char *text = read_text(path, slash + 1);
    free(path);
    return text;
}

static void test_suffix(const json_t *goldens, Tokenizer *qwen, Tokenizer *llama) {
    const json_t *rows = json_object_get(goldens, "suffix");
    size_t i, equal = 0;
    json_t *row;
    json_array_foreach(rows, i, row) {
        const char *setup = json_string_value(json_object_get(row, "setup"));
        const char *name = json_string_value(json_object_get(row, "case"));
        Tokenizer *tok = format_of_setup(setup) == TOOL_FORMAT_LLAMA3 ? llama : qwen;
        char *tmpl = template_of(setup, qwen), err[ERR_LEN];
        int *ids = NULL;
        size_t n = 0;
        int rc = tool_calls_suffix_ids(&ids, &n, tok, tmpl, json_object_get(row, "tool_messages"), NULL, err);
        CHECK(rc == 0, "suffix %s/%s: %s", setup, name, err);
        bool same = rc == 0 && same_ids(ids, n, json_object_get(row, "expected"));
        equal += same;
        if (rc == 0 && !same) {
            char *text = NULL;
            tokenizer_decode(tok, ids, n, false, &text, err);
            CHECK(false, "suffix %s/%s: colt %zu ids \"%s\", TRL %zu \"%s\"", setup, name, n, text ? text : "?",
                  json_array_size(json_object_get(row, "expected")),
                  json_string_value(json_object_get(row, "expected_text")));
            free(text);
        }
        free(ids);
        free(tmpl);
    }
    printf("suffix: %zu/%zu tool suffixes equal TRL's _get_tool_suffix_ids\n", equal, json_array_size(rows));

    /* The original Qwen3 template is not prefix-preserving: TRL swaps it, colt says so. */
    char *qwen3 = read_text(DATA, "qwen3_chat_template.jinja"), err[ERR_LEN];
    int *ids = NULL;
    size_t n = 0;
    json_t *msgs = json_pack("[{s:s, s:s, s:s}]", "role", "tool", "name", "calculator", "content", "12");
    CHECK(tool_calls_suffix_ids(&ids, &n, qwen, qwen3, msgs, NULL, err) != 0 && strstr(err, "prefix-preserving"),
          "the original Qwen3 template should be refused as not prefix-preserving (got \"%s\")", err);
    json_decref(msgs);
    free(ids);
    free(qwen3);
}

/* ---------------------------------------------------------------------------
 * main
 * ------------------------------------------------------------------------- */

int main(void) {
    double t0 = now_s();
    json_error_t jerr;
    json_t *goldens = json_load_file(DATA "/tool_goldens.json", 0, &jerr);
    if (!goldens) {
        fprintf(stderr, "tests/data/tool_goldens.json: %s (line %d); run tests/ref/make_tool_goldens.py\n", jerr.text,
                jerr.line);
        return 1;
    }
    Tokenizer *qwen = NULL, *llama = NULL;
    char err[ERR_LEN];
    if (shared_data_present()) {
        CHECK(tokenizer_load(&qwen, COLT_SHARED_DATA "/qwen2.5-tokenizer", err) == 0, "qwen2.5 tokenizer: %s", err);
        llama = llama_tokenizer(json_object_get(goldens, "llama_added_tokens"), err);
        CHECK(llama != NULL, "llama-on-qwen tokenizer: %s", err);
    }
    test_parse(goldens, qwen, llama);
    if (qwen && llama) test_suffix(goldens, qwen, llama);
    else shared_data_skipped("tool suffix ids and prompts with tools (they need the Qwen2.5 tokenizer)");

    tokenizer_free(qwen);
    tokenizer_free(llama);
    json_decref(goldens);
    printf("%s: %d checks, %d failed (%.1f s)\n", g_failures ? "FAIL" : "OK", g_checks, g_failures, now_s() - t0);
    return g_failures ? 1 : 0;
}
