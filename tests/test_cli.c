/* test_cli.c — the `colt` CLI contracts, end to end through the built binary:
 * tokenize/detokenize against HF tokenizers (chats also with tools and
 * chat_template_kwargs, through the Qwen3 template), score and greedy generate
 * with the real stories260K against transformers (tests/data/cli_goldens.json, made by
 * tests/ref/make_cli_goldens.py), seeded sampling reproducibility, init, a
 * TRL user's config training a step (notices once, bare true/false flags),
 * and bad input (one-line error, non-zero exit, nothing on stdout). */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/fileio.h"
#include "shared_data.h"
#include "harness.h"

/* Runs `colt ARGS < stdin_text`; returns the exit code, fills stdout/stderr. */
static int run(const char *args, const char *stdin_text, char **out, char **errout) {
    return run_colt_with(&(ColtRun){.stdin_text = stdin_text ? stdin_text : "", .out = out}, args, errout);
}

/* Expects failure: non-zero exit, empty stdout, exactly one stderr line containing `needle`. */
static void expect_error(const char *name, const char *args, const char *stdin_text, const char *needle) {
    char *out, *err;
    int code = run(args, stdin_text, &out, &err);
    CHECK(code != 0, "%s: exit code 0, wanted an error", name);
    CHECK(code < 128, "%s: crashed (exit %d): %s", name, code, err);
    CHECK(out[0] == '\0', "%s: stdout not empty: %s", name, out);
    CHECK(count_lines(err) == 1, "%s: stderr has %d lines, wanted 1: %s", name, count_lines(err), err);
    CHECK(strstr(err, needle) != NULL, "%s: error '%s' does not mention '%s'", name, err, needle);
    printf("  bad input %-28s -> exit %d: %s", name, code, err);
    free(out);
    free(err);
}

static json_t *parse_json_line(const char *s) {
    json_error_t e;
    return json_loads(s, JSON_DECODE_ANY, &e);
}

static char *ids_to_json(json_t *ids) { return json_dumps(ids, JSON_COMPACT); }

/* tokenize (text, and messages through the chat template) and detokenize
 * with the Qwen2.5 tokenizer, against HF tokenizers / transformers. */
static void test_qwen_tokenizer(json_t *gold, const char *qwen) {
    char args[4096], *out, *err;
    /* tokenize: text */
    json_t *cases = json_object_get(gold, "qwen_tokenize_text");
    char *input = NULL;
    size_t n_cases = json_array_size(cases), in_len = 0;
    FILE *mem = open_memstream(&input, &in_len);
    for (size_t i = 0; i < n_cases; i++) {
        json_t *o = json_pack("{s:O}", "text", json_object_get(json_array_get(cases, i), "text"));
        char *s = json_dumps(o, 0);
        fprintf(mem, "%s\n", s);
        free(s);
        json_decref(o);
    }
    fclose(mem);
    snprintf(args, sizeof args, "tokenize --model %s", qwen);
    int code = run(args, input, &out, &err);
    CHECK(code == 0, "tokenize text exit %d: %s", code, err);
    char *line = strtok(out, "\n");
    size_t equal = 0;
    for (size_t i = 0; i < n_cases && line; i++, line = strtok(NULL, "\n")) {
        json_t *got = parse_json_line(line);
        json_t *want = json_object_get(json_array_get(cases, i), "ids");
        if (got && json_equal(json_object_get(got, "ids"), want)) equal++;
        else CHECK(0, "tokenize text case %zu: got %s", i, line);
        json_decref(got);
    }
    CHECK(equal == n_cases && n_cases == 4, "tokenize text: %zu/%zu equal", equal, n_cases);
    printf("tokenize text (qwen2.5): %zu/%zu equal to HF tokenizers\n", equal, n_cases);
    free(out); free(err); free(input);

    /* tokenize: messages with the chat template */
    cases = json_object_get(gold, "qwen_tokenize_messages");
    n_cases = json_array_size(cases);
    mem = open_memstream(&input, &in_len);
    for (size_t i = 0; i < n_cases; i++) {
        json_t *c = json_array_get(cases, i);
        json_t *o = json_pack("{s:O,s:O}", "messages", json_object_get(c, "messages"), "add_generation_prompt",
                              json_object_get(c, "add_generation_prompt"));
        char *s = json_dumps(o, 0);
        fprintf(mem, "%s\n", s);
        free(s);
        json_decref(o);
    }
    fclose(mem);
    code = run(args, input, &out, &err);
    CHECK(code == 0, "tokenize messages exit %d: %s", code, err);
    equal = 0;
    line = strtok(out, "\n");
    for (size_t i = 0; i < n_cases && line; i++, line = strtok(NULL, "\n")) {
        json_t *got = parse_json_line(line);
        if (got && json_equal(json_object_get(got, "ids"), json_object_get(json_array_get(cases, i), "ids"))) equal++;
        else CHECK(0, "tokenize messages case %zu: got %s", i, line);
        json_decref(got);
    }
    CHECK(equal == n_cases && n_cases == 2, "tokenize messages: %zu/%zu equal", equal, n_cases);
    printf("tokenize messages (qwen2.5 chat template): %zu/%zu equal to transformers\n", equal, n_cases);
    free(out); free(err); free(input);

    /* detokenize */
    json_t *dt = json_object_get(gold, "qwen_detokenize");
    char *ids_s = ids_to_json(json_object_get(dt, "ids"));
    char in_line[8192];
    snprintf(in_line, sizeof in_line, "{\"ids\": %s}\n", ids_s);
    snprintf(args, sizeof args, "detokenize --model %s", qwen);
    code = run(args, in_line, &out, &err);
    json_t *got = parse_json_line(out);
    CHECK(code == 0 && got && json_equal(json_object_get(got, "text"), json_object_get(dt, "text")),
          "detokenize: got %s", out);
    printf("detokenize (qwen2.5): %s", out);
    json_decref(got);
    free(out); free(err); free(ids_s);
}

/* tokenize with a chat template that reads tools and extra variables: the
 * Qwen3 template (tests/data/qwen3_chat_template.jinja) over the Qwen2.5
 * tokenizer. Each Qwen3 row of chat_template_goldens.jsonl goes in twice, as
 * {"messages", "add_generation_prompt", "tools", "chat_template_kwargs"} and as
 * {"text": transformers' rendering}; both must give the same ids. */
static void test_chat_template_options(const char *qwen) {
    char dir[300], path[400], *out, *err;
    snprintf(dir, sizeof dir, "%s/qwen3-template", g_tmp);
    CHECK(mkdir(dir, 0755) == 0, "mkdir %s", dir);
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    char target[400];
    snprintf(target, sizeof target, "%s/tokenizer.json", qwen);
    CHECK(symlink(target, path) == 0, "symlink %s", path);
    json_error_t jerr;
    snprintf(target, sizeof target, "%s/tokenizer_config.json", qwen);
    json_t *cfg = json_load_file(target, 0, &jerr);
    char *tmpl = NULL;
    size_t len = 0;
    CHECK(cfg && file_read_all(COLT_SOURCE_DIR "/tests/data/qwen3_chat_template.jinja", &tmpl, &len, NULL) == 0,
          "cannot read the Qwen2.5 tokenizer_config.json or the Qwen3 template");
    if (!cfg || !tmpl) return;
    json_object_set_new(cfg, "chat_template", json_string(tmpl));
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    CHECK(json_dump_file(cfg, path, 0) == 0, "write %s", path);
    json_decref(cfg);
    free(tmpl);

    FILE *f = fopen(COLT_SOURCE_DIR "/tests/data/chat_template_goldens.jsonl", "r");
    char *line = NULL, *input = NULL;
    size_t cap = 0, in_len = 0;
    FILE *mem = open_memstream(&input, &in_len);
    int pairs = 0, with_options = 0;
    while (f && getline(&line, &cap, f) > 0) {
        json_t *row = json_loads(line, 0, &jerr);
        json_t *expected = json_object_get(row, "expected");
        if (row && !strcmp(json_string_value(json_object_get(row, "template")), "qwen3") && json_is_string(expected)) {
            json_t *req = json_pack("{s:O,s:O}", "messages", json_object_get(row, "messages"), "add_generation_prompt",
                                    json_object_get(row, "add_generation_prompt"));
            const char *keys[] = {"tools", "chat_template_kwargs"};
            for (int k = 0; k < 2; k++)
                if (json_object_get(row, keys[k])) json_object_set(req, keys[k], json_object_get(row, keys[k]));
            with_options += json_object_size(req) > 2;
            json_t *text = json_pack("{s:O}", "text", expected);
            char *a = json_dumps(req, JSON_COMPACT), *b = json_dumps(text, JSON_COMPACT);
            fprintf(mem, "%s\n%s\n", a, b);
            free(a);
            free(b);
            json_decref(req);
            json_decref(text);
            pairs++;
        }
        json_decref(row);
    }
    free(line);
    if (f) fclose(f);
    fclose(mem);
    char args[600];
    snprintf(args, sizeof args, "tokenize --model %s", dir);
    int code = run(args, input, &out, &err);
    CHECK(code == 0, "tokenize with tools and chat_template_kwargs: exit %d: %s", code, err);
    int equal = 0;
    char *save = NULL;
    for (char *a = strtok_r(out, "\n", &save), *b = a ? strtok_r(NULL, "\n", &save) : NULL; a && b;
         a = strtok_r(NULL, "\n", &save), b = a ? strtok_r(NULL, "\n", &save) : NULL) {
        json_t *ja = parse_json_line(a), *jb = parse_json_line(b);
        json_t *ia = json_object_get(ja, "ids");
        if (json_array_size(ia) > 0 && json_equal(ia, json_object_get(jb, "ids"))) equal++;
        else CHECK(0, "tokenize qwen3 pair %d: %s vs %s", equal, a, b);
        json_decref(ja);
        json_decref(jb);
    }
    CHECK(pairs >= 100 && with_options >= 60 && equal == pairs, "tokenize qwen3 chats: %d/%d equal (%d with options)",
          equal, pairs, with_options);
    printf("tokenize qwen3 chats with tools / chat_template_kwargs: %d/%d the ids of transformers' text (%d with "
           "options)\n", equal, pairs, with_options);
    free(out);
    free(err);
    free(input);

    expect_error("chat_template_kwargs list", args,
                 "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"chat_template_kwargs\": [1]}\n",
                 "stdin line 1: \"chat_template_kwargs\" must be an object");
    expect_error("tools object", args, "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": {}}\n",
                 "stdin line 1: \"tools\" must be a list");
    expect_error("tool not an object", args,
                 "{\"text\": \"ok\"}\n{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}], \"tools\": [1]}\n",
                 "stdin line 2: chat template: tools[0] is not an object");
    expect_error("message not an object", args, "{\"messages\": [\"hi\"]}\n",
                 "stdin line 1: chat template: message 0 is not");
    expect_error("reserved template variable", args,
                 "{\"messages\": [], \"chat_template_kwargs\": {\"tools\": []}}\n", "variable 'tools' cannot be set");
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_test_cli_XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    json_error_t jerr;
    json_t *gold = json_load_file(COLT_SOURCE_DIR "/tests/data/cli_goldens.json", 0, &jerr);
    if (!gold) {
        fprintf(stderr, "cannot read cli_goldens.json: %s\n", jerr.text);
        return 1;
    }
    const char *qwen = COLT_SHARED_DATA "/qwen2.5-tokenizer";
    const char *stories = COLT_SOURCE_DIR "/models/stories260K";
    char args[4096], *out, *err;

    const bool have_shared = shared_data_present(); /* the Qwen2.5 tokenizer comes from there */
    if (have_shared) {
        test_qwen_tokenizer(gold, qwen);
        test_chat_template_options(qwen);
    }
    else shared_data_skipped("tokenize, chat template and detokenize with the Qwen2.5 tokenizer against HF");
    int code;
    json_t *got;
    char in_line[8192], *ids_s;

    /* score with stories260K */
    json_t *sc = json_object_get(gold, "stories_score");
    ids_s = ids_to_json(json_object_get(sc, "ids"));
    snprintf(in_line, sizeof in_line, "{\"ids\": %s}\n", ids_s);
    snprintf(args, sizeof args, "score --model %s", stories);
    code = run(args, in_line, &out, &err);
    got = parse_json_line(out);
    json_t *lp = got ? json_object_get(got, "logprobs") : NULL;
    json_t *want_lp = json_object_get(sc, "logprobs");
    double max_diff = 0;
    CHECK(code == 0 && lp && json_array_size(lp) == json_array_size(want_lp) && json_array_size(lp) > 40,
          "score: exit %d, %zu values (wanted %zu): %s", code, lp ? json_array_size(lp) : 0,
          json_array_size(want_lp), err);
    for (size_t i = 0; lp && i < json_array_size(lp) && i < json_array_size(want_lp); i++) {
        double d = fabs(json_number_value(json_array_get(lp, i)) - json_number_value(json_array_get(want_lp, i)));
        if (d > max_diff) max_diff = d;
    }
    CHECK(max_diff < 1e-4, "score: max |diff| %.3g vs transformers", max_diff);
    printf("score (stories260K, %zu tokens): max |logprob - transformers| = %.3g (tol 1e-4)\n",
           lp ? json_array_size(lp) : 0, max_diff);
    char *scored = out;  /* kept to compare with the tokenizer-less folder */
    json_decref(got);
    free(err);

    /* score on a folder without tokenizer files gives the same answer */
    char bare[300];
    snprintf(bare, sizeof bare, "%s/bare", g_tmp);
    snprintf(args, sizeof args, "mkdir -p %s && cp %s/config.json %s/model.safetensors %s/", bare, stories, stories, bare);
    CHECK(system(args) == 0, "copy bare model");
    snprintf(args, sizeof args, "score --model %s", bare);
    code = run(args, in_line, &out, &err);
    CHECK(code == 0 && strcmp(out, scored) == 0, "score without tokenizer files: exit %d: %s", code, err);
    printf("score on a folder without tokenizer files: exit %d, same output\n", code);
    free(scored);
    free(out); free(err); free(ids_s);

    /* greedy generate with stories260K: text prompt, and ids prompt */
    json_t *gen = json_object_get(gold, "stories_generate");
    json_t *want_ids = json_object_get(gen, "completion_ids");
    snprintf(args, sizeof args, "generate --model %s --prompt 'Once upon a time' --max_new_tokens %zu --json",
             stories, json_array_size(want_ids));
    code = run(args, NULL, &out, &err);
    got = parse_json_line(out);
    CHECK(code == 0 && got && json_equal(json_object_get(got, "ids"), want_ids), "generate --prompt: %s %s", out, err);
    CHECK(got && json_equal(json_object_get(got, "text"), json_object_get(gen, "completion_text")),
          "generate text: %s", out);
    printf("generate greedy (stories260K, %zu tokens): %s\n",
           json_array_size(want_ids), got && json_equal(json_object_get(got, "ids"), want_ids) ? "token-identical to transformers" : "DIFFERENT");
    json_decref(got);
    free(out); free(err);

    snprintf(args, sizeof args, "generate --model %s --prompt 'Once upon a time' --max_new_tokens %zu", stories,
             json_array_size(want_ids));
    code = run(args, NULL, &out, &err);
    char want_text[4096];
    snprintf(want_text, sizeof want_text, "%s\n", json_string_value(json_object_get(gen, "completion_text")));
    CHECK(code == 0 && strcmp(out, want_text) == 0, "generate plain text: got '%s'", out);
    printf("generate plain text: %s", out);
    free(out); free(err);

    ids_s = ids_to_json(json_object_get(gen, "prompt_ids"));
    snprintf(args, sizeof args, "generate --model %s --ids '%s' --max_new_tokens %zu --json", stories, ids_s,
             json_array_size(want_ids));
    code = run(args, NULL, &out, &err);
    got = parse_json_line(out);
    CHECK(code == 0 && got && json_equal(json_object_get(got, "ids"), want_ids), "generate --ids: %s %s", out, err);
    json_decref(got);
    free(out); free(err); free(ids_s);

    /* --prompts: a JSONL file of prompts generated together, each as it is alone */
    char prompts_path[300];
    snprintf(prompts_path, sizeof prompts_path, "%s/prompts.jsonl", g_tmp);
    ids_s = ids_to_json(json_object_get(gen, "prompt_ids"));
    FILE *pf = fopen(prompts_path, "w");
    CHECK(pf != NULL, "cannot write %s", prompts_path);
    if (pf) {
        fprintf(pf, "{\"prompt\": \"Once upon a time\"}\n\n{\"prompt\": \"The dog\"}\n{\"ids\": %s}\n", ids_s);
        fclose(pf);
    }
    snprintf(args, sizeof args, "generate --model %s --prompts %s --max_new_tokens %zu --json", stories, prompts_path,
             json_array_size(want_ids));
    code = run(args, NULL, &out, &err);
    CHECK(code == 0 && count_lines(out) == 3, "generate --prompts: exit %d, %d lines: %s", code, count_lines(out), err);
    int same_as_alone = 0, line_no = 0;
    for (char *line = out; code == 0 && *line; line_no++) {
        char *end = strchr(line, '\n');
        size_t len = end ? (size_t)(end - line) : strlen(line);
        char *one = strndup(line, len);
        got = parse_json_line(one);
        json_int_t idx = got ? json_integer_value(json_object_get(got, "prompt_index")) : -1;
        CHECK(idx == line_no, "generate --prompts: line %d has prompt_index %lld", line_no, (long long)idx);
        if (got && idx != 1) same_as_alone += json_equal(json_object_get(got, "ids"), want_ids);
        json_decref(got);
        free(one);
        line += len + (end ? 1 : 0);
    }
    CHECK(same_as_alone == 2, "generate --prompts: %d of 2 completions of 'Once upon a time' as alone", same_as_alone);
    printf("generate --prompts (3 prompts): the text and ids forms of one prompt both give its completion alone\n");
    free(out); free(err); free(ids_s);
    pf = fopen(prompts_path, "w");
    if (pf) {
        fprintf(pf, "{\"prompt\": \"Once upon a time\"}\n{\"prompt\": 5}\n");
        fclose(pf);
    }
    snprintf(args, sizeof args, "generate --model %s --prompts %s", stories, prompts_path);
    expect_error("--prompts bad line", args, NULL, "prompts.jsonl line 2");
    snprintf(args, sizeof args, "generate --model %s --prompts %s --prompt hi", stories, prompts_path);
    expect_error("--prompts and --prompt", args, NULL, "exactly one");

    /* TRL's rows, as colt train reads them: a conversational "prompt" (a list of messages) is the same
     * chat as a "messages" row, and other columns are ignored */
    {
        const char *chat_model = COLT_SOURCE_DIR "/tests/data/models/tiny-llama3-f32";
        char *out_trl = NULL, *out_msgs = NULL;
        pf = fopen(prompts_path, "w");
        if (pf) {
            fprintf(pf, "{\"prompt\": [{\"role\": \"user\", \"content\": \"What is 2+2?\"}], \"answer\": \"4\"}\n");
            fclose(pf);
        }
        snprintf(args, sizeof args, "generate --model %s --prompts %s --max_new_tokens 6 --json", chat_model, prompts_path);
        int code_trl = run(args, NULL, &out_trl, &err);
        free(err);
        pf = fopen(prompts_path, "w");
        if (pf) {
            fprintf(pf, "{\"messages\": [{\"role\": \"user\", \"content\": \"What is 2+2?\"}]}\n");
            fclose(pf);
        }
        int code_msgs = run(args, NULL, &out_msgs, &err);
        free(err);
        CHECK(code_trl == 0 && code_msgs == 0 && strstr(out_trl, "\"ids\"") && strcmp(out_trl, out_msgs) == 0,
              "generate --prompts: a TRL conversational prompt row (exit %d) gives '%s', the messages row (exit %d) '%s'",
              code_trl, out_trl, code_msgs, out_msgs);
        free(out_trl), free(out_msgs);
        snprintf(args, sizeof args, "generate --model %s --prompts %s/examples/data/demo_train.jsonl --max_new_tokens 4 --json",
                 stories, COLT_SOURCE_DIR);
        code = run(args, NULL, &out, &err);
        CHECK(code == 0 && count_lines(out) == 128, "generate --prompts on colt train's dataset: exit %d, %d lines: %s",
              code, count_lines(out), err);
        printf("generate --prompts: a TRL conversational row = its messages row; colt train's dataset file works as is\n");
        free(out); free(err);
    }

    /* seeded sampling: reproducible, and completion 0 does not depend on --n */
    char *out_a, *out_b, *out_c;
    snprintf(args, sizeof args,
             "generate --model %s --prompt 'Once upon a time' --max_new_tokens 30 --temperature 1.0 --top_k 40 "
             "--top_p 0.95 --seed 7 --n 3 --json", stories);
    run(args, NULL, &out_a, &err); free(err);
    run(args, NULL, &out_b, &err); free(err);
    CHECK(strcmp(out_a, out_b) == 0 && count_lines(out_a) == 3, "sampling with the same seed differs");
    snprintf(args, sizeof args,
             "generate --model %s --prompt 'Once upon a time' --max_new_tokens 30 --temperature 1.0 --top_k 40 "
             "--top_p 0.95 --seed 7 --n 1 --json", stories);
    run(args, NULL, &out_c, &err); free(err);
    CHECK(strncmp(out_a, out_c, strlen(out_c)) == 0 && strlen(out_c) > 10, "completion 0 depends on --n");
    char *second = strchr(out_a, '\n');
    CHECK(second && strncmp(out_a, second + 1, (size_t)(second - out_a)) != 0, "completions 0 and 1 are identical");
    printf("sampling: same seed reproduces, completion 0 identical with --n 1 and --n 3\n");
    free(out_a); free(out_b); free(out_c);

    /* init: tiny checkpoints of every architecture load and generate */
    const char *archs[] = {"qwen2", "llama", "qwen3"};
    for (int a = 0; a < 3; a++) {
        snprintf(args, sizeof args, "init --arch %s --preset tiny --tokenizer %s --out %s/init_%s --seed 1", archs[a],
                 stories, g_tmp, archs[a]);
        code = run(args, NULL, &out, &err);
        CHECK(code == 0, "init %s: %s", archs[a], err);
        free(out); free(err);
        snprintf(args, sizeof args, "generate --model %s/init_%s --prompt 'Hello' --max_new_tokens 5 --ignore_eos --json",
                 g_tmp, archs[a]);
        code = run(args, NULL, &out, &err);
        got = parse_json_line(out);
        CHECK(code == 0 && got && json_array_size(json_object_get(got, "ids")) == 5, "generate with init %s: %s %s",
              archs[a], out, err);
        printf("init --arch %s --preset tiny: generate gave %s", archs[a], out);
        json_decref(got);
        free(out); free(err);
    }

    /* --chat with a Qwen2.5-tokenizer model: the chat template is rendered, and
     * generation stops at the template's <|im_end|> unless told otherwise. */
    if (have_shared) {
        snprintf(args, sizeof args, "init --arch qwen2 --preset tiny --tokenizer %s --out %s/init_qwen_tok --seed 2", qwen,
                 g_tmp);
        code = run(args, NULL, &out, &err);
        CHECK(code == 0, "init with the qwen tokenizer: %s", err);
        free(out); free(err);
        snprintf(args, sizeof args, "generate --model %s/init_qwen_tok --chat 'What is 2+2?' --max_new_tokens 4 "
                 "--ignore_eos --json", g_tmp);
        code = run(args, NULL, &out, &err);
        got = parse_json_line(out);
        CHECK(code == 0 && got && json_array_size(json_object_get(got, "ids")) == 4, "generate --chat: %s %s", out, err);
        printf("generate --chat on a tiny Qwen2 with the Qwen2.5 tokenizer: %s", out);
        json_decref(got);
        free(out); free(err);
    } else {
        shared_data_skipped("init --tokenizer with the Qwen2.5 tokenizer and generate --chat");
    }

    /* train with a TRL user's config: TRL's colocate GRPOConfig (the stand-in
     * model) trains one step; each key that changes nothing prints one notice
     * line, once; a true/false key alone is true, `--key false` still false. */
    snprintf(args, sizeof args, "%s/trl.yaml", g_tmp);
    FILE *trl = fopen(args, "w");
    fprintf(trl, "model_name_or_path: %s\ndataset: %s/examples/data/demo_train.jsonl\n"
                 "reward_funcs: [{type: regex, pattern: park}]\noutput_dir: %s/trl_out\n"
                 "use_vllm: true\nvllm_mode: colocate\nvllm_tensor_parallel_size: 1\nvllm_gpu_memory_utilization: 0.3\n"
                 "per_device_train_batch_size: 8\ngradient_accumulation_steps: 1\nnum_generations: 4\n"
                 "max_prompt_length: 64\nmax_completion_length: 8\nlearning_rate: 1.0e-5\nbf16: true\n"
                 "logging_steps: 1\nreport_to: none\npush_to_hub: false\ngradient_checkpointing: false\n"
                 "num_train_epochs: 1\nmax_steps: 1\nsave_steps: 100\nbeta: 0.0\nloss_type: dapo\ndevice: cpu\n"
                 "torch_dtype: bfloat16\n",
            stories, COLT_SOURCE_DIR, g_tmp);
    fclose(trl);
    snprintf(args, sizeof args, "train --config %s/trl.yaml --deterministic false --gradient_checkpointing", g_tmp);
    code = run(args, NULL, &out, &err);
    CHECK(code == 0, "train with TRL's colocate config: exit %d: %s", code, err);
    /* report_to: none, vllm_mode: colocate, vllm_tensor_parallel_size and bf16 are honoured (no notice) */
    const char *noticed[] = {"use_vllm: true", "torch_dtype: bfloat16", "push_to_hub: false"};
    for (int k = 0; k < 3; k++) {
        char needle[96];
        snprintf(needle, sizeof needle, "trl.yaml: %s changes nothing in colt: ", noticed[k]);
        const char *first = strstr(err, needle);
        CHECK(first && !strstr(first + 1, needle), "notice '%s' once in: %s", needle, err);
    }
    CHECK(!strstr(err, "gradient_checkpointing: ") && !strstr(err, "learning_rate: ") && !strstr(err, "report_to: ") &&
              !strstr(err, "vllm_mode: ") && !strstr(err, "trl.yaml: bf16"),
          "a notice for an honoured key");
    free(out);
    free(err);
    snprintf(args, sizeof args, "%s/trl_out/summary.json", g_tmp);
    json_t *summary = json_load_file(args, 0, &jerr);
    json_t *config = json_object_get(summary, "config");
    CHECK(json_is_true(json_object_get(config, "gradient_checkpointing")) &&
              json_is_false(json_object_get(config, "deterministic")) &&
              json_real_value(json_object_get(config, "gpu_memory_utilization")) == 0.3 &&
              !strcmp(json_string_value(json_object_get(config, "model")), stories),
          "summary.json config: bare --gradient_checkpointing true, --deterministic false, model_name_or_path, "
          "vllm_gpu_memory_utilization");
    printf("train --config trl.yaml (TRL's colocate GRPOConfig) --deterministic false --gradient_checkpointing: "
           "exit %d, 5 notices once each, gradient_checkpointing %s\n",
           code, json_is_true(json_object_get(config, "gradient_checkpointing")) ? "true" : "false");
    json_decref(summary);

    /* a flag of the other commands: alone true, and true/false words */
    const char *json_flags[] = {"--json", "--json true", "--json=1", "--json false", "--json=no"};
    for (int f = 0; f < 5; f++) {
        snprintf(args, sizeof args, "generate --model %s --prompt hi --max_new_tokens 2 --ignore_eos %s", stories,
                 json_flags[f]);
        code = run(args, NULL, &out, &err);
        bool want_json = f < 3, is_json = out[0] == '{';
        CHECK(code == 0 && is_json == want_json, "generate %s: exit %d, JSON %d: %s %s", json_flags[f], code, is_json,
              out, err);
        free(out);
        free(err);
    }
    printf("generate --json alone, true, =1 print JSON; false, =no print text\n");

    /* --help */
    const char *cmds[] = {"tokenize", "detokenize", "score", "generate", "init"};
    for (int c = 0; c < 5; c++) {
        snprintf(args, sizeof args, "%s --help", cmds[c]);
        code = run(args, NULL, &out, &err);
        CHECK(code == 0 && strstr(out, "usage: colt") && strstr(out, "--"), "%s --help: %s", cmds[c], out);
        free(out); free(err);
    }
    printf("--help: all 5 commands print their usage\n");

    /* bad input */
    if (have_shared) {
        snprintf(args, sizeof args, "tokenize --model %s", qwen);
        expect_error("invalid JSON on stdin", args, "{\"text\": \n", "stdin line 1");
        expect_error("invalid UTF-8 on stdin", args, "{\"text\": \"\xff\xfe\"}\n", "stdin line 1");
        expect_error("wrong field", args, "{\"txt\": \"a\"}\n", "stdin line 1");
        snprintf(args, sizeof args, "detokenize --model %s", qwen);
        expect_error("token id out of range", args, "{\"ids\": [1, 99999999]}\n", "out of range");
    } else {
        shared_data_skipped("bad stdin for tokenize and detokenize with the Qwen2.5 tokenizer");
    }
    snprintf(args, sizeof args, "score --model %s", stories);
    char *long_ids = malloc(8 * 600 + 32);
    strcpy(long_ids, "{\"ids\": [1");
    for (int i = 0; i < 599; i++) strcat(long_ids, ", 5");
    strcat(long_ids, "]}\n");
    expect_error("longer than max_position", args, long_ids, "max_position_embeddings");
    free(long_ids);
    expect_error("score id out of range", args, "{\"ids\": [1, 512]}\n", "out of range");
    snprintf(args, sizeof args, "score --model %s/does-not-exist", g_tmp);
    expect_error("missing model folder", args, "", "does-not-exist");
    snprintf(args, sizeof args, "generate --model %s --prompt hi --max_new_tokens x", stories);
    expect_error("non-integer flag", args, NULL, "max_new_tokens");
    snprintf(args, sizeof args, "generate --model %s --prompt hi --bogus 1", stories);
    expect_error("unknown flag", args, NULL, "bogus");
    snprintf(args, sizeof args, "generate --model %s", stories);
    expect_error("no prompt", args, NULL, "--prompt");
    snprintf(args, sizeof args, "generate --model %s --prompt hi --top_p 0", stories);
    expect_error("bad top_p", args, NULL, "top_p");
    snprintf(args, sizeof args, "generate --model %s --chat hi", stories);
    expect_error("no chat template", args, NULL, "chat_template");
    snprintf(args, sizeof args, "init --arch gpt2 --preset tiny --out %s/x", g_tmp);
    expect_error("init unknown arch", args, NULL, "gpt2");
    snprintf(args, sizeof args, "init --arch qwen2 --preset llama3.2-1b --out %s/x", g_tmp);
    expect_error("init Llama 3 preset as qwen2", args, NULL, "preset llama3.2-1b is a llama model, not qwen2");
    snprintf(args, sizeof args, "init --arch llama --preset qwen3-0.6b --out %s/x", g_tmp);
    expect_error("init Qwen3 preset as llama", args, NULL, "preset qwen3-0.6b is a qwen3 model, not llama");
    snprintf(args, sizeof args, "generate --model %s --prompt hi --json maybe", stories);
    expect_error("flag with a non-bool word", args, NULL, "--json: 'maybe' is not true or false");
    snprintf(args, sizeof args, "train --config %s/trl.yaml --push_to_hub", g_tmp);
    expect_error("train --push_to_hub alone", args, NULL, "push_to_hub: true is a known TRL/transformers setting");
    snprintf(args, sizeof args, "train --config %s/trl.yaml --use_dora true", g_tmp);
    expect_error("train --use_dora true", args, NULL, "DoRA is not supported");
    snprintf(args, sizeof args, "train --config %s/trl.yaml --vllm_tensor_parallel_size 2", g_tmp);
    expect_error("train tensor parallel 2 in one process", args, NULL,
                 "tensor_parallel_size 2 needs a multiple of 2 processes");
    snprintf(args, sizeof args, "train --config %s/trl.yaml --gradient_checkpointing maybe", g_tmp);
    expect_error("train bool flag, bad word", args, NULL, "gradient_checkpointing");
    snprintf(args, sizeof args, "train --config %s/trl.yaml --learning_rate", g_tmp);
    expect_error("train non-bool alone", args, NULL, "option --learning_rate needs a value");
    snprintf(args, sizeof args, "train --model %s --dataset %s/train.parquet --reward_funcs '[{\"type\": \"length\"}]' "
             "--output_dir %s/parquet_out --device cpu", stories, g_tmp, g_tmp);
    expect_error("train on a parquet file", args, NULL, "datasets.load_dataset('parquet'");

    json_decref(gold);
    snprintf(args, sizeof args, "rm -rf %s", g_tmp);
    if (system(args) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
    printf("%d checks, %d failed\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
