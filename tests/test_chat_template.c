/* test_chat_template.c — renders every case of tests/data/chat_template_goldens.jsonl
 * (made by tests/ref/make_chat_template_goldens.py with transformers'
 * apply_chat_template) and requires byte-identical prompts, or an error where
 * jinja2 raised. Then checks that unsupported or broken templates fail with a
 * message instead of rendering something. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/chat_template.h"
#include "shared_data.h"

static char *read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "cannot open %s\n", path);
        exit(1);
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)n + 1);
    if (fread(s, 1, (size_t)n, f) != (size_t)n) exit(1);
    s[n] = '\0';
    fclose(f);
    return s;
}

typedef struct {
    const char *name;
    char *source;
    int total, equal;
} Template;

static void show_difference(const char *got, const char *want) {
    size_t i = 0;
    while (got[i] && got[i] == want[i]) i++;
    size_t from = i > 40 ? i - 40 : 0;
    fprintf(stderr, "  first difference at byte %zu\n  got:      \"", i);
    for (size_t k = from; got[k] && k < i + 40; k++) fputc(got[k] == '\n' ? '|' : got[k], stderr);
    fprintf(stderr, "\"\n  expected: \"");
    for (size_t k = from; want[k] && k < i + 40; k++) fputc(want[k] == '\n' ? '|' : want[k], stderr);
    fprintf(stderr, "\"  (newlines shown as |)\n");
}

static int run_goldens(void) {
    json_error_t jerr;
    /* Qwen2.5's template comes from ../shared/data; without it its rows are skipped (source NULL) */
    const bool have_shared = shared_data_present();
    json_t *cfg = have_shared ? json_load_file(COLT_SHARED_DATA "/qwen2.5-tokenizer/tokenizer_config.json", 0, &jerr)
                              : NULL;
    if (have_shared && !cfg) {
        fprintf(stderr, "tokenizer_config.json: %s\n", jerr.text);
        return 1;
    }
    if (!have_shared) shared_data_skipped("the 26 Qwen2.5 chat template goldens");
    Template templates[] = {
        {"qwen2.5", cfg ? strdup(json_string_value(json_object_get(cfg, "chat_template"))) : NULL, 0, 0},
        {"qwen2_chatml", read_file(COLT_SOURCE_DIR "/tests/data/qwen2_chatml_chat_template.jinja"), 0, 0},
        {"llama3", read_file(COLT_SOURCE_DIR "/tests/data/llama3_chat_template.jinja"), 0, 0},
        {"llama3.1", read_file(COLT_SOURCE_DIR "/tests/data/llama3.1_chat_template.jinja"), 0, 0},
    };
    json_decref(cfg);
    size_t n_templates = sizeof templates / sizeof *templates;

    FILE *f = fopen(COLT_SOURCE_DIR "/tests/data/chat_template_goldens.jsonl", "r");
    if (!f) {
        fprintf(stderr, "cannot open chat_template_goldens.jsonl\n");
        return 1;
    }
    char *line = NULL;
    size_t cap = 0;
    int failures = 0, rows = 0, feature_total = 0, feature_equal = 0;
    while (getline(&line, &cap, f) > 0) {
        json_t *row = json_loads(line, 0, &jerr);
        if (!row) {
            fprintf(stderr, "bad golden line: %s\n", jerr.text);
            return 1;
        }
        rows++;
        const char *name = json_string_value(json_object_get(row, "template"));
        const char *source = json_string_value(json_object_get(row, "template_source"));
        Template *t = NULL;
        for (size_t i = 0; i < n_templates; i++)
            if (!strcmp(templates[i].name, name)) t = &templates[i];
        if (!t && !source) {
            fprintf(stderr, "golden names unknown template '%s'\n", name);
            return 1;
        }
        if (t && !t->source) { /* skipped above */
            json_decref(row);
            continue;
        }
        json_t *jm = json_object_get(row, "messages");
        size_t n = json_array_size(jm);
        ChatMessage *msgs = calloc(n + 1, sizeof *msgs);
        for (size_t i = 0; i < n; i++) {
            msgs[i].role = json_string_value(json_object_get(json_array_get(jm, i), "role"));
            msgs[i].content = json_string_value(json_object_get(json_array_get(jm, i), "content"));
        }
        json_t *expected = json_object_get(row, "expected");
        const char *want = json_is_string(expected) ? json_string_value(expected) : NULL;
        char *got = NULL, err[ERR_LEN] = "";
        int rc = chat_template_render(&got, t ? t->source : source, msgs, n,
                                      json_is_true(json_object_get(row, "add_generation_prompt")),
                                      json_string_value(json_object_get(row, "bos_token")),
                                      json_string_value(json_object_get(row, "eos_token")), err);
        bool ok = want ? rc == 0 && got && strcmp(got, want) == 0 : rc != 0 && err[0] != '\0';
        if (t) t->total++; else feature_total++;
        if (ok) {
            if (t) t->equal++; else feature_equal++;
        } else {
            failures++;
            if (failures <= 5) {
                const char *conv = json_string_value(json_object_get(row, "conversation"));
                fprintf(stderr, "MISMATCH %s / %s / add_generation_prompt=%d\n", name, conv ? conv : "",
                        json_is_true(json_object_get(row, "add_generation_prompt")));
                if (source) fprintf(stderr, "  template: %s\n", source);
                if (rc != 0) fprintf(stderr, "  error: %s\n", err);
                else if (!want) fprintf(stderr, "  rendered but jinja2 raised: %s\n", json_string_value(json_object_get(row, "error")));
                else show_difference(got, want);
            }
        }
        free(got);
        free(msgs);
        json_decref(row);
    }
    free(line);
    fclose(f);
    int compared = 0, expected = 0;
    for (size_t i = 0; i < n_templates; i++) {
        if (!templates[i].source) continue; /* skipped */
        expected += 26;
        printf("%s: %d/%d equal\n", templates[i].name, templates[i].equal, templates[i].total);
        compared += templates[i].total;
        if (templates[i].total != 26) {
            fprintf(stderr, "%s: expected 26 golden cases, found %d\n", templates[i].name, templates[i].total);
            failures++;
        }
        free(templates[i].source);
    }
    printf("jinja features: %d/%d equal\n", feature_equal, feature_total);
    if (feature_total < 50) {
        fprintf(stderr, "expected at least 50 feature goldens, found %d\n", feature_total);
        failures++;
    }
    printf("goldens: %d rows, %d failures\n", rows, failures);
    return compared == expected && expected == (have_shared ? 104 : 78) && failures == 0 ? 0 : 1;
}

/* Templates that must fail, and a fragment the message must contain. */
static int run_errors(void) {
    static const struct {
        const char *source, *needle;
    } cases[] = {
        {"{{ messages | frobnicate }}", "unsupported Jinja filter 'frobnicate' at line 1"},
        {"hello\n{% if messages %}\nunclosed", "unclosed '{% if %}'"},
        {"{% for m in messages %}{{ m.content }}", "unclosed '{% for %}'"},
        {"{% for m in messages %}{% if m.role not in ['user', 'assistant'] %}{{ raise_exception('bad role ' + m.role) }}{% endif %}{% endfor %}",
         "raised an error: bad role system"},
        {"{% include 'x.jinja' %}", "unsupported Jinja statement 'include'"},
        {"{% for m in [] %}{{ m | frobnicate }}{% endfor %}", "unsupported Jinja filter 'frobnicate' at line 1"},
        {"{% if x is frob %}{% endif %}", "unsupported Jinja test 'frob'"},
        {"line1\nline2\n{{ messages[0].content.format(1) }}", "unsupported Jinja method 'str.format' at line 3"},
        {"{{ 'abc' % 3 }}", "'%' string formatting"},
        {"{{ (1 + }}", "line 1"},
        {"{{ 'unterminated }}", "unterminated string"},
        {"{# never closed", "missing end of comment"},
        {"{{ undefined_thing.attr }}", "undefined"},
        {"{% endif %}", "unexpected '{% endif %}'"},
        {"{% set x %}block{% endset %}", "block set"},
        {"{{ x ]] }}", "unexpected ']'"},
        {"{% for i in range(10) %}{% endfor %}{% break %}", "outside of a for-loop"},
        {"{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}", "nest too deeply"},
        {"{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}", "more than"},
        {"{{ 'x' * 100000000 }}", "MiB"},
        {"{{ 9223372036854775807 + 1 }}", "overflow"},
        {"{{ messages | tojson(indent=2) }}{{ 1 / 0 }}", "division by zero"},
        {"{{ (((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((1))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))) }}",
         "nest"},
    };
    int failures = 0;
    ChatMessage msgs[] = {{"system", "sys"}, {"user", "hi"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *got = NULL, err[ERR_LEN] = "";
        int rc = chat_template_render(&got, cases[i].source, msgs, 2, true, "<s>", "</s>", err);
        if (rc == 0 || !strstr(err, cases[i].needle)) {
            fprintf(stderr, "ERROR CASE %zu: template %s\n  wanted an error containing \"%s\", got rc=%d err=\"%s\" output=\"%s\"\n", i,
                    cases[i].source, cases[i].needle, rc, err, got ? got : "");
            failures++;
        }
        if (rc != 0 && got) {
            fprintf(stderr, "ERROR CASE %zu: output not NULL on error\n", i);
            failures++;
        }
        free(got);
    }
    printf("error cases: %zu/%zu fail with the expected message\n", sizeof cases / sizeof *cases - (size_t)failures,
           sizeof cases / sizeof *cases);
    return failures ? 1 : 0;
}

int main(void) {
    int rc = run_goldens();
    rc |= run_errors();
    printf(rc ? "FAIL\n" : "OK\n");
    return rc;
}
