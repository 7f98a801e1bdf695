/* cmd_tokenize.c — `colt tokenize` and `colt detokenize`: JSONL in, JSONL out.
 * tokenize: {"text"} is encoded with no special tokens added; {"messages",
 * "add_generation_prompt", "tools", "chat_template_kwargs"} is rendered with the
 * chat template and then encoded the same way, as transformers'
 * apply_chat_template(tokenize=True) does. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/cli_json.h"
#include "core/error.h"
#include "data/prompt.h"
#include "tokenizer/tokenizer.h"

static const char *TOKENIZE_USAGE =
    "usage: colt tokenize --model DIR < in.jsonl > out.jsonl\n"
    "  each input line {\"text\": STR} or {\"messages\": [{\"role\", \"content\", ...}],\n"
    "  \"add_generation_prompt\": BOOL, \"tools\": [...], \"chat_template_kwargs\": {...}} (the last three optional:\n"
    "  apply_chat_template's add_generation_prompt, tools and keyword arguments such as {\"enable_thinking\": false})\n"
    "  each output line {\"ids\": [...]}; text gets no special tokens added, messages get the chat template\n";

int cmd_tokenize(int argc, char **argv) {
    char err[ERR_LEN];
    const char *model_dir = NULL;
    CliOption opts[] = {{"model", OPT_STRING, &model_dir, "folder with tokenizer.json (and tokenizer_config.json)", false}};
    int prc = cli_parse(opts, 1, argc, argv, TOKENIZE_USAGE, err);
    if (prc == 1) return 0;
    if (prc != 0) return cli_fail("tokenize", err);
    if (!model_dir) return cli_fail("tokenize", "--model DIR is required");
    char model_folder[4096];
    if (cli_model_folder(model_folder, sizeof model_folder, "tokenize", model_dir, NULL) != 0) return 1;
    model_dir = model_folder;
    Tokenizer *tok = NULL;
    if (tokenizer_load(&tok, model_dir, err) != 0) return cli_fail("tokenize", err);
    char **lines = NULL;
    size_t n_lines = 0;
    if (stdin_read_lines(&lines, &n_lines, err) != 0) {
        tokenizer_free(tok);
        return cli_fail("tokenize", err);
    }
    OutBuf out = {0};
    int rc = 0;
    for (size_t i = 0; i < n_lines && rc == 0; i++) {
        char where[64];
        snprintf(where, sizeof where, "stdin line %zu", i + 1);
        json_t *obj = NULL;
        if (cli_json_parse_line(&obj, lines[i], where, err) != 0) { rc = 1; break; }
        json_t *text = json_object_get(obj, "text"), *messages = json_object_get(obj, "messages");
        char *rendered = NULL;
        const char *to_encode = NULL;
        if (json_is_string(text)) {
            to_encode = json_string_value(text);
        } else if (messages) {
            json_t *agp = json_object_get(obj, "add_generation_prompt"), *tools = NULL, *kwargs = NULL;
            if (agp && !json_is_boolean(agp)) {
                errorf(err, "%s: \"add_generation_prompt\" must be true or false", where);
                rc = 1;
            } else if (prompt_chat_options(&tools, &kwargs, obj, where, err) != 0 ||
                       prompt_render_chat(&rendered, tok, messages, tools, kwargs, agp && json_is_true(agp), where,
                                       err) != 0) {
                rc = 1;
            }
            to_encode = rendered;
        } else {
            errorf(err, "%s: expected {\"text\": string} or {\"messages\": [...]}", where);
            rc = 1;
        }
        int *ids = NULL;
        size_t n_ids = 0;
        if (rc == 0 && tokenizer_encode(tok, to_encode, strlen(to_encode), &ids, &n_ids, err) != 0) {
            error_prefix(err, "%s", where);
            rc = 1;
        }
        if (rc == 0) cli_json_append_ids(&out, "ids", ids, n_ids);
        free(ids);
        free(rendered);
        json_decref(obj);
    }
    if (rc == 0) fwrite(out.data ? out.data : "", 1, out.len, stdout);
    else cli_fail("tokenize", err);
    outbuf_free(&out);
    lines_free(lines, n_lines);
    tokenizer_free(tok);
    return rc;
}

static const char *DETOKENIZE_USAGE =
    "usage: colt detokenize --model DIR [--skip_special_tokens] < in.jsonl > out.jsonl\n"
    "  each input line {\"ids\": [...]}, each output line {\"text\": STR}\n";

int cmd_detokenize(int argc, char **argv) {
    char err[ERR_LEN];
    const char *model_dir = NULL;
    bool skip_special = false;
    CliOption opts[] = {{"model", OPT_STRING, &model_dir, "folder with tokenizer.json", false},
                        {"skip_special_tokens", OPT_FLAG, &skip_special, "leave special tokens out of the text", false}};
    int prc = cli_parse(opts, 2, argc, argv, DETOKENIZE_USAGE, err);
    if (prc == 1) return 0;
    if (prc != 0) return cli_fail("detokenize", err);
    if (!model_dir) return cli_fail("detokenize", "--model DIR is required");
    char model_folder[4096];
    if (cli_model_folder(model_folder, sizeof model_folder, "detokenize", model_dir, NULL) != 0) return 1;
    model_dir = model_folder;
    Tokenizer *tok = NULL;
    if (tokenizer_load(&tok, model_dir, err) != 0) return cli_fail("detokenize", err);
    char **lines = NULL;
    size_t n_lines = 0;
    if (stdin_read_lines(&lines, &n_lines, err) != 0) {
        tokenizer_free(tok);
        return cli_fail("detokenize", err);
    }
    OutBuf out = {0};
    int rc = 0;
    for (size_t i = 0; i < n_lines && rc == 0; i++) {
        char where[64];
        snprintf(where, sizeof where, "stdin line %zu", i + 1);
        int *ids = NULL;
        size_t n_ids = 0;
        char *text = NULL;
        if (cli_json_read_ids(&ids, &n_ids, lines[i], tokenizer_vocab_size(tok), where, err) != 0 ||
            tokenizer_decode(tok, ids, n_ids, skip_special, &text, err) != 0) {
            rc = 1;
        } else {
            json_t *o = json_pack("{s:s}", "text", text);
            char *s = json_dumps(o, 0);
            outbuf_puts(&out, s);
            outbuf_puts(&out, "\n");
            free(s);
            json_decref(o);
        }
        free(text);
        free(ids);
    }
    if (rc == 0) fwrite(out.data ? out.data : "", 1, out.len, stdout);
    else cli_fail("detokenize", err);
    outbuf_free(&out);
    lines_free(lines, n_lines);
    tokenizer_free(tok);
    return rc;
}
