/* test_chat_template.c — renders every case of tests/data/chat_template_goldens.jsonl
 * (made by tests/ref/make_chat_template_goldens.py with transformers'
 * apply_chat_template) through chat_template_render_json, with the row's
 * messages, tools and chat_template_kwargs, and requires byte-identical prompts,
 * or an error where jinja2 raised; rows of plain {role, content} messages go
 * through chat_template_render as well and must give the same. Then checks that
 * unsupported or broken templates, and bad messages, tools or variables, fail
 * with a one-line message instead of rendering something. */
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
    int expected_rows; /* how many goldens the script writes for it */
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
    /* 26 = 13 conversations x add_generation_prompt; Qwen3 adds 15 of its own x
     * enable_thinking absent/true/false x add_generation_prompt */
    Template templates[] = {
        {"qwen2.5", cfg ? strdup(json_string_value(json_object_get(cfg, "chat_template"))) : NULL, 26, 0, 0},
        {"qwen2_chatml", read_file(COLT_SOURCE_DIR "/tests/data/qwen2_chatml_chat_template.jinja"), 26, 0, 0},
        {"llama3", read_file(COLT_SOURCE_DIR "/tests/data/llama3_chat_template.jinja"), 26, 0, 0},
        {"llama3.1", read_file(COLT_SOURCE_DIR "/tests/data/llama3.1_chat_template.jinja"), 26 + 6 * 2, 0, 0},
        {"qwen3", read_file(COLT_SOURCE_DIR "/tests/data/qwen3_chat_template.jinja"), 26 + 15 * 6, 0, 0},
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
    int failures = 0, rows = 0, feature_total = 0, feature_equal = 0, plain_rows = 0;
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
        json_t *tools = json_object_get(row, "tools"), *kwargs = json_object_get(row, "chat_template_kwargs");
        bool agp = json_is_true(json_object_get(row, "add_generation_prompt"));
        const char *bos = json_string_value(json_object_get(row, "bos_token"));
        const char *eos = json_string_value(json_object_get(row, "eos_token"));
        json_t *expected = json_object_get(row, "expected");
        const char *want = json_is_string(expected) ? json_string_value(expected) : NULL;
        ChatTemplateOptions opt = {.add_generation_prompt = agp, .bos_token = bos, .eos_token = eos,
                                   .tools = tools, .variables = kwargs};
        char *got = NULL, err[ERR_LEN] = "";
        int rc = chat_template_render_json(&got, t ? t->source : source, jm, &opt, err);

        /* plain {role, content} rows: the ChatMessage entry point must agree */
        size_t n = json_array_size(jm);
        bool plain = !tools && !kwargs;
        for (size_t i = 0; i < n && plain; i++) {
            json_t *m = json_array_get(jm, i);
            plain = json_object_size(m) == 2 && json_is_string(json_object_get(m, "role")) &&
                    json_is_string(json_object_get(m, "content"));
        }
        if (plain) {
            ChatMessage *msgs = calloc(n + 1, sizeof *msgs);
            for (size_t i = 0; i < n; i++) {
                msgs[i].role = json_string_value(json_object_get(json_array_get(jm, i), "role"));
                msgs[i].content = json_string_value(json_object_get(json_array_get(jm, i), "content"));
            }
            char *got2 = NULL, err2[ERR_LEN] = "";
            int rc2 = chat_template_render(&got2, t ? t->source : source, msgs, n, agp, bos, eos, err2);
            if (rc2 != rc || (rc == 0 && strcmp(got, got2) != 0) || (rc != 0 && strcmp(err, err2) != 0)) {
                fprintf(stderr, "chat_template_render and chat_template_render_json differ on %s / %s\n", name,
                        json_string_value(json_object_get(row, "conversation")));
                failures++;
            }
            plain_rows++;
            free(got2);
            free(msgs);
        }
        bool ok = want ? rc == 0 && got && strcmp(got, want) == 0 : rc != 0 && err[0] != '\0';
        if (t) t->total++; else feature_total++;
        if (ok) {
            if (t) t->equal++; else feature_equal++;
        } else {
            failures++;
            if (failures <= 5) {
                const char *conv = json_string_value(json_object_get(row, "conversation"));
                char *kw = kwargs ? json_dumps(kwargs, JSON_COMPACT) : NULL;
                fprintf(stderr, "MISMATCH %s / %s / add_generation_prompt=%d%s%s%s\n", name, conv ? conv : "", agp,
                        tools ? " / tools" : "", kw ? " / " : "", kw ? kw : "");
                free(kw);
                if (source) fprintf(stderr, "  template: %s\n", source);
                if (rc != 0) fprintf(stderr, "  error: %s\n", err);
                else if (!want) fprintf(stderr, "  rendered but jinja2 raised: %s\n", json_string_value(json_object_get(row, "error")));
                else show_difference(got, want);
            }
        }
        free(got);
        json_decref(row);
    }
    free(line);
    fclose(f);
    int compared = 0, expected = 0;
    for (size_t i = 0; i < n_templates; i++) {
        if (!templates[i].source) continue; /* skipped */
        expected += templates[i].expected_rows;
        printf("%s: %d/%d equal\n", templates[i].name, templates[i].equal, templates[i].total);
        compared += templates[i].total;
        if (templates[i].total != templates[i].expected_rows) {
            fprintf(stderr, "%s: expected %d golden cases, found %d\n", templates[i].name, templates[i].expected_rows,
                    templates[i].total);
            failures++;
        }
        free(templates[i].source);
    }
    printf("jinja features: %d/%d equal\n", feature_equal, feature_total);
    if (feature_total < 50) {
        fprintf(stderr, "expected at least 50 feature goldens, found %d\n", feature_total);
        failures++;
    }
    printf("plain {role, content} rows also rendered through chat_template_render: %d\n", plain_rows);
    printf("goldens: %d rows, %d failures\n", rows, failures);
    return compared == expected && failures == 0 ? 0 : 1;
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
        {"{{ raise_exception('two\\nlines\\r') }}", "raised an error: two\\nlines\\r at line 1"},
        {"{{ messages | tojson }}{{ x.y }}", "undefined"},
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
        if (strchr(err, '\n')) {
            fprintf(stderr, "ERROR CASE %zu: the message is more than one line: %s\n", i, err);
            failures++;
        }
        free(got);
    }
    printf("error cases: %zu/%zu fail with the expected message\n", sizeof cases / sizeof *cases - (size_t)failures,
           sizeof cases / sizeof *cases);
    return failures ? 1 : 0;
}

/* chat_template_render_json: bad messages, tools and variables are one-line
 * errors naming what is wrong; variables reach the template and override the
 * tokens; JSON values keep their types and key order. */
static int run_json_cases(void) {
    int failures = 0, checks = 0;
    json_t *user = json_pack("[{s:s,s:s}]", "role", "user", "content", "hi");
    json_t *deep = json_array(), *inner = json_object(); /* [{"a": {"a": ... 200 deep}}] */
    json_array_append_new(deep, inner);
    for (int i = 0; i < 200; i++) {
        json_t *next = json_object();
        json_object_set_new(inner, "a", next);
        inner = next;
    }
    json_t *nul_message = json_pack("[{s:s%}]", "role", "user\0x", (size_t)6);
    const struct {
        const char *messages, *tools, *variables; /* JSON text, or NULL */
        const json_t *messages_value, *tools_value; /* when the text is NULL */
        const char *needle;
    } cases[] = {
        {"{\"role\": \"user\"}", NULL, NULL, NULL, NULL, "the messages must be a list"},
        {"[{\"role\": \"user\", \"content\": \"a\"}, [\"b\"]]", NULL, NULL, NULL, NULL, "message 1 is not an object"},
        {NULL, "{\"name\": \"f\"}", NULL, user, NULL, "tools must be a list of tool definitions"},
        {NULL, "[{\"name\": \"f\"}, \"g\"]", NULL, user, NULL, "tools[1] is not an object"},
        {NULL, NULL, "[\"enable_thinking\"]", user, NULL, "the template variables must be an object"},
        {NULL, NULL, "{\"messages\": []}", user, NULL, "variable 'messages' cannot be set"},
        {NULL, NULL, "{\"add_generation_prompt\": true}", user, NULL, "variable 'add_generation_prompt' cannot"},
        {NULL, NULL, NULL, user, deep, "tools nests more than"},
        {NULL, NULL, NULL, nul_message, NULL, "message 0 holds a string with a NUL character"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        json_error_t jerr;
        json_t *m = cases[i].messages ? json_loads(cases[i].messages, JSON_DECODE_ANY, &jerr) : NULL;
        json_t *t = cases[i].tools ? json_loads(cases[i].tools, 0, &jerr) : NULL;
        json_t *v = cases[i].variables ? json_loads(cases[i].variables, JSON_DECODE_ANY, &jerr) : NULL;
        ChatTemplateOptions opt = {.tools = t ? t : cases[i].tools_value, .variables = v};
        char *got = NULL, err[ERR_LEN] = "";
        int rc = chat_template_render_json(&got, "{{ messages | tojson }}{{ tools | tojson }}",
                                           m ? m : cases[i].messages_value, &opt, err);
        checks++;
        if (rc == 0 || got || !strstr(err, cases[i].needle) || strchr(err, '\n')) {
            fprintf(stderr, "JSON CASE %zu: wanted one line containing \"%s\", got rc=%d err=\"%s\"\n", i,
                    cases[i].needle, rc, err);
            failures++;
        }
        free(got);
        json_decref(m);
        json_decref(t);
        json_decref(v);
    }

    /* what a template sees: variables (overriding eos_token), tools, and the
     * messages as transformers prepares them (null keys dropped, reasoning aliased) */
    json_error_t jerr;
    json_t *msgs = json_loads("[{\"role\": \"assistant\", \"content\": null, \"reasoning\": \"r\", \"z\": [1, 2.0, "
                              "-0.0, 1e300, true, null, {\"b\": 1, \"a\": 2}]}]", 0, &jerr);
    json_t *tools = json_loads("[{\"type\": \"function\", \"function\": {\"name\": \"f\"}}]", 0, &jerr);
    json_t *vars = json_loads("{\"enable_thinking\": false, \"eos_token\": \"<E>\", \"n\": 7}", 0, &jerr);
    ChatTemplateOptions opt = {.add_generation_prompt = true, .bos_token = "<B>", .eos_token = "</s>", .tools = tools,
                               .variables = vars};
    const char *tmpl = "{{ messages | tojson }}|{{ tools[0].function.name }}|{{ enable_thinking is false }}|"
                       "{{ bos_token }}{{ eos_token }}|{{ n + 1 }}|{{ add_generation_prompt }}|{{ documents }}";
    const char *want = "[{\"thinking\": \"r\", \"role\": \"assistant\", \"reasoning\": \"r\", \"z\": [1, 2.0, -0.0, "
                       "1e+300, true, null, {\"b\": 1, \"a\": 2}], \"reasoning_content\": \"r\"}]|f|True|<B><E>|8|"
                       "True|None";
    char *got = NULL, err[ERR_LEN] = "";
    int rc = chat_template_render_json(&got, tmpl, msgs, &opt, err);
    checks++;
    if (rc != 0 || strcmp(got, want) != 0) {
        fprintf(stderr, "JSON VALUES: rc=%d err=%s\n  got:  %s\n  want: %s\n", rc, err, got ? got : "", want);
        failures++;
    }
    free(got);
    /* NULL options: add_generation_prompt false, tools None, no tokens */
    got = NULL;
    rc = chat_template_render_json(&got, "{{ add_generation_prompt }} {{ tools }} {{ eos_token is defined }}", user,
                                   NULL, err);
    checks++;
    if (rc != 0 || strcmp(got, "False None False") != 0) {
        fprintf(stderr, "JSON NULL OPTIONS: rc=%d got \"%s\"\n", rc, got ? got : "");
        failures++;
    }
    free(got);
    json_decref(msgs);
    json_decref(tools);
    json_decref(vars);
    json_decref(user);
    json_decref(deep);
    json_decref(nul_message);
    printf("chat_template_render_json cases: %d/%d as expected\n", checks - failures, checks);
    return failures ? 1 : 0;
}

int main(void) {
    int rc = run_goldens();
    rc |= run_errors();
    rc |= run_json_cases();
    printf(rc ? "FAIL\n" : "OK\n");
    return rc;
}
