/* dataset.c — loads a prompt dataset (JSON Lines, a JSON array of objects, or
 * one JSON object: what Hugging Face datasets' to_json writes and its "json"
 * loader reads), validates every row up front, renders prompts and orders
 * epochs.
 *
 * Validation happens once at load so a bad row fails before training starts,
 * with the file, the line (JSONL) or index (JSON array) and the problem. JSON
 * is parsed by jansson (which also rejects invalid UTF-8). Not a streaming
 * loader: the whole file is held in memory, as prompt sets are small. Not
 * parquet or arrow files (there is no Arrow C library to read them with: the
 * error gives the one-line conversion to JSON Lines), nor split layouts such as
 * {"train": [...]}. */
#include "data/dataset.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/fileio.h"
#include "core/rng.h"
#include "tokenizer/chat_template.h"

struct Dataset {
    json_t **rows;  /* [n], owned */
    size_t n;
    char *prompt_column; /* the column read as the prompt */
};

static const char *json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "object";
    case JSON_ARRAY: return "list";
    case JSON_STRING: return "string";
    case JSON_INTEGER:
    case JSON_REAL: return "number";
    case JSON_TRUE:
    case JSON_FALSE: return "boolean";
    case JSON_NULL: return "null";
    }
    return "unknown";
}

/* ---------------------------------------------------------------------------
 * Row validation
 * ------------------------------------------------------------------------- */

/* The error for a row without the prompt column: its columns, and a hint
 * when one of them holds rows (a {"train": [...]} layout). */
static int missing_column(const json_t *row, const char *column, const char *where, char *err) {
    char columns[ERR_LEN / 2] = "";
    size_t at = 0;
    const char *key, *holds_rows = NULL;
    json_t *v;
    json_object_foreach((json_t *)row, key, v) {
        if (at < sizeof columns)
            at += (size_t)snprintf(columns + at, sizeof columns - at, "%s%s", at ? ", " : "", key);
        json_t *first = json_array_get(v, 0);
        if (!holds_rows && json_is_object(first) && json_object_get(first, column)) holds_rows = key;
    }
    if (holds_rows)
        return errorf(err, "%s: no '%s' column (columns: %s): '%s' holds the rows, a layout that is not supported; "
                           "write them as JSON Lines or a JSON array", where, column, columns, holds_rows);
    return errorf(err, "%s: no '%s' column (columns: %s); set dataset_prompt_column", where, column,
                  json_object_size(row) ? columns : "none");
}

/* Checks one row; `where` is "data.jsonl line 3" or "data.json index 2". A
 * NULL column checks only that the row is an object (dataset_load_rows). */
static int validate_row(const json_t *row, const char *column, const char *where, char *err) {
    if (!json_is_object(row)) return errorf(err, "%s: expected a JSON object, got %s", where, json_type_name(row));
    if (!column) return 0;
    json_t *prompt = json_object_get(row, column);
    if (!prompt) return missing_column(row, column, where, err);
    if (json_is_string(prompt)) return 0;
    if (!json_is_array(prompt))
        return errorf(err, "%s: \"%s\" must be a string or a list of messages, got %s", where, column,
                      json_type_name(prompt));
    if (json_array_size(prompt) == 0) return errorf(err, "%s: \"%s\" is an empty list of messages", where, column);
    size_t k;
    json_t *msg;
    json_array_foreach(prompt, k, msg) {
        if (!json_is_object(msg))
            return errorf(err, "%s: \"%s\" message %zu must be an object {\"role\", \"content\"}, got %s", where,
                          column, k, json_type_name(msg));
        json_t *role = json_object_get(msg, "role"), *content = json_object_get(msg, "content");
        if (!role) return errorf(err, "%s: \"%s\" message %zu has no \"role\"", where, column, k);
        if (!json_is_string(role))
            return errorf(err, "%s: \"%s\" message %zu: \"role\" must be a string, got %s", where, column, k,
                          json_type_name(role));
        if (!content) return errorf(err, "%s: \"%s\" message %zu has no \"content\"", where, column, k);
        if (!json_is_string(content))
            return errorf(err, "%s: \"%s\" message %zu: \"content\" must be a string, got %s", where, column, k,
                          json_type_name(content));
    }
    return 0;
}

/* ---------------------------------------------------------------------------
 * Loading
 * ------------------------------------------------------------------------- */

static void dataset_push(Dataset *d, size_t *cap, json_t *row) {
    if (d->n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        d->rows = xrealloc(d->rows, *cap * sizeof *d->rows);
    }
    d->rows[d->n++] = row;
}

static int is_blank(const char *s, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (s[i] != ' ' && s[i] != '\t' && s[i] != '\r' && s[i] != '\n') return 0;
    return 1;
}

static int load_jsonl(Dataset *d, const char *path, const char *text, size_t len, char *err) {
    size_t cap = 0, line_no = 0, pos = 0;
    while (pos < len) {
        line_no++;
        const char *line = text + pos;
        const char *nl = memchr(line, '\n', len - pos);
        size_t line_len = nl ? (size_t)(nl - line) : len - pos;
        pos += line_len + (nl ? 1 : 0);
        if (is_blank(line, line_len)) continue;
        char where[ERR_LEN / 2];
        snprintf(where, sizeof where, "%s line %zu", path, line_no);
        json_error_t jerr;
        json_t *row = json_loadb(line, line_len, JSON_REJECT_DUPLICATES, &jerr);
        if (!row)
            return errorf(err, "%s: invalid %s at column %d: %s", where,
                          json_error_code(&jerr) == json_error_invalid_utf8 ? "UTF-8" : "JSON", jerr.column, jerr.text);
        if (validate_row(row, d->prompt_column, where, err) != 0) {
            json_decref(row);
            return COLT_ERR;
        }
        dataset_push(d, &cap, row);
    }
    return 0;
}

/* A JSON array of rows, or one object (one row, as the "datasets" json loader
 * reads it); root is parsed already. */
static int load_json_document(Dataset *d, const char *path, json_t *root, char *err) {
    size_t cap = 0;
    if (json_is_object(root)) {
        char where[ERR_LEN / 2];
        snprintf(where, sizeof where, "%s (one object)", path);
        if (validate_row(root, d->prompt_column, where, err) != 0) return COLT_ERR;
        dataset_push(d, &cap, json_incref(root));
        return 0;
    }
    if (!json_is_array(root))
        return errorf(err, "%s: expected a JSON array of row objects at the top level, got %s", path,
                      json_type_name(root));
    size_t i;
    json_t *row;
    json_array_foreach(root, i, row) {
        char where[ERR_LEN / 2];
        snprintf(where, sizeof where, "%s index %zu", path, i);
        if (validate_row(row, d->prompt_column, where, err) != 0) return COLT_ERR;
        dataset_push(d, &cap, json_incref(row));
    }
    return 0;
}

static int has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), m = strlen(suffix);
    return n >= m && strcmp(s + n - m, suffix) == 0;
}

/* Parquet and Arrow files need the Arrow library, which colt does not link
 * (Debian 12 has no Arrow C package): the error gives the conversion. */
static int refuse_arrow_formats(const char *path, char *err) {
    const char *kind = has_suffix(path, ".parquet") ? "parquet" : has_suffix(path, ".arrow") ? "arrow" : NULL;
    if (!kind) return 0;
    int stem = (int)(strlen(path) - strlen(kind) - 1);
    return errorf(err, "%s: %s files are not supported (colt reads JSON Lines or JSON); convert it once with: "
                       "python -c \"import datasets; datasets.load_dataset('%s', data_files='%s')['train']"
                       ".to_json('%.*s.jsonl')\"",
                  path, kind, kind, path, stem, path);
}

/* .jsonl is JSON Lines. Any other name (.json included: datasets' to_json
 * writes JSON Lines there by default) is a JSON array when its first non-blank
 * byte is '[', one JSON object when the whole text is one, JSON Lines
 * otherwise. */
static int dataset_load_any(Dataset **out, const char *path, const char *prompt_column, char *err) {
    *out = NULL;
    if (refuse_arrow_formats(path, err) != 0) return COLT_ERR;
    char *text = NULL;
    size_t len = 0;
    if (file_read_all(path, &text, &len, err) != 0) return COLT_ERR;
    Dataset *d = xcalloc(1, sizeof *d);
    d->prompt_column = prompt_column ? xstrdup(prompt_column) : NULL;
    const char *body = text;
    if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) body += 3, len -= 3;  /* a UTF-8 byte-order mark */
    size_t first = 0;
    while (first < len && (body[first] == ' ' || body[first] == '\t' || body[first] == '\r' || body[first] == '\n'))
        first++;
    json_t *document = NULL;
    json_error_t jerr;
    int rc = 0;
    if (!has_suffix(path, ".jsonl") && first < len && body[first] == '[') {
        document = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
        if (!document)
            rc = errorf(err, "%s line %d column %d: invalid %s: %s", path, jerr.line, jerr.column,
                        json_error_code(&jerr) == json_error_invalid_utf8 ? "UTF-8" : "JSON", jerr.text);
    } else if (!has_suffix(path, ".jsonl") && first < len && body[first] == '{') {
        document = json_loadb(body, len, JSON_REJECT_DUPLICATES, NULL); /* NULL: several lines of JSON Lines */
    }
    if (rc == 0)
        rc = document ? load_json_document(d, path, document, err) : load_jsonl(d, path, body, len, err);
    json_decref(document);
    free(text);
    if (rc == 0 && d->n == 0) rc = errorf(err, "%s: the dataset has no rows", path);
    if (rc != 0) {
        dataset_free(d);
        return COLT_ERR;
    }
    *out = d;
    return 0;
}

int dataset_load_column(Dataset **out, const char *path, const char *prompt_column, char *err) {
    return dataset_load_any(out, path, prompt_column ? prompt_column : "prompt", err);
}

int dataset_load(Dataset **out, const char *path, char *err) { return dataset_load_column(out, path, "prompt", err); }

int dataset_load_rows(Dataset **out, const char *path, char *err) { return dataset_load_any(out, path, NULL, err); }

int dataset_from_rows(Dataset **out, json_t *rows, const char *prompt_column, const char *name, char *err) {
    *out = NULL;
    COLT_ASSERT(json_is_array(rows) && prompt_column);
    Dataset *d = xcalloc(1, sizeof *d);
    d->prompt_column = xstrdup(prompt_column);
    size_t cap = 0, i;
    json_t *row;
    json_array_foreach(rows, i, row) {
        char where[ERR_LEN / 2];
        snprintf(where, sizeof where, "%s row %zu", name, i);
        if (validate_row(row, d->prompt_column, where, err) != 0) {
            dataset_free(d);
            return COLT_ERR;
        }
        dataset_push(d, &cap, json_incref(row));
    }
    if (d->n == 0) {
        dataset_free(d);
        return errorf(err, "%s: the dataset has no rows", name);
    }
    *out = d;
    return 0;
}

void dataset_free(Dataset *d) {
    if (!d) return;
    for (size_t i = 0; i < d->n; i++) json_decref(d->rows[i]);
    free(d->rows);
    free(d->prompt_column);
    free(d);
}

size_t dataset_size(const Dataset *d) { return d->n; }

json_t *dataset_row(const Dataset *d, size_t i) {
    COLT_ASSERT(i < d->n);
    return d->rows[i];
}

int dataset_is_conversational(const Dataset *d, size_t i) {
    COLT_ASSERT(d->prompt_column); /* not a dataset_load_rows one */
    return json_is_array(json_object_get(dataset_row(d, i), d->prompt_column));
}

/* ---------------------------------------------------------------------------
 * Prompt text
 * ------------------------------------------------------------------------- */

/* Like TRL's maybe_apply_chat_template: messages ending with a user (or
 * system) turn get add_generation_prompt; messages ending with an assistant
 * turn are continued instead, as transformers' continue_final_message does it:
 * a tag is appended to the final content, the chat rendered without a
 * generation prompt, and the text cut at the tag's last occurrence (and
 * right-stripped when the template trimmed the content's trailing spaces). */
#define CONTINUE_TAG "CONTINUE_FINAL_MESSAGE_TAG "

int dataset_prompt_text(char **text, const Dataset *d, size_t i, const Tokenizer *tok, const json_t *template_kwargs,
                        char *err) {
    return dataset_prompt_text_tools(text, d, i, tok, template_kwargs, NULL, err);
}

int dataset_prompt_text_tools(char **text, const Dataset *d, size_t i, const Tokenizer *tok,
                              const json_t *template_kwargs, const json_t *tools, char *err) {
    *text = NULL;
    COLT_ASSERT(d->prompt_column); /* not a dataset_load_rows one */
    json_t *prompt = json_object_get(dataset_row(d, i), d->prompt_column);
    if (json_is_string(prompt)) {
        *text = xstrdup(json_string_value(prompt));
        return 0;
    }
    const char *template_source = tok ? tokenizer_chat_template(tok) : NULL;
    if (!template_source)
        return errorf(err, "row %zu: \"%s\" is a list of messages but the tokenizer has no chat template", i,
                      d->prompt_column);
    size_t n = json_array_size(prompt);
    json_t *messages = json_deep_copy(prompt); /* every key of every message reaches the template */
    json_t *last = json_array_get(messages, n - 1);
    int continue_final = strcmp(json_string_value(json_object_get(last, "role")), "assistant") == 0;
    if (continue_final) {
        const char *content = json_string_value(json_object_get(last, "content"));
        size_t clen = strlen(content);
        char *tagged = xmalloc(clen + sizeof CONTINUE_TAG);
        memcpy(tagged, content, clen);
        memcpy(tagged + clen, CONTINUE_TAG, sizeof CONTINUE_TAG);
        json_object_set_new(last, "content", json_string(tagged));
        free(tagged);
    }
    char *rendered = NULL;
    ChatTemplateOptions options = {.add_generation_prompt = !continue_final,
                                   .bos_token = tokenizer_bos_token(tok),
                                   .eos_token = tokenizer_eos_token(tok),
                                   .variables = template_kwargs,
                                   .tools = tools};
    int rc = chat_template_render_json(&rendered, template_source, messages, &options, err);
    json_decref(messages);
    if (rc != 0) return error_prefix(err, "row %zu", i);
    if (continue_final) {
        const char *stripped_tag = "CONTINUE_FINAL_MESSAGE_TAG";
        char *found = NULL;  /* the last occurrence, like Python's rindex */
        for (char *p = rendered; (p = strstr(p, stripped_tag)) != NULL; p++) found = p;
        if (!found) {
            free(rendered);
            return errorf(err, "row %zu: the chat template dropped the final assistant message, so it cannot be "
                               "continued", i);
        }
        int spacing_kept = strncmp(found, CONTINUE_TAG, strlen(CONTINUE_TAG)) == 0;
        *found = '\0';
        if (!spacing_kept) {
            size_t len = strlen(rendered);
            while (len > 0 && strchr(" \t\n\r\f\v", rendered[len - 1])) rendered[--len] = '\0';
        }
    }
    *text = rendered;
    return 0;
}

/* ---------------------------------------------------------------------------
 * Epoch order
 * ------------------------------------------------------------------------- */

/* Domain tag mixed into the seed so the shuffle's draws never coincide with
 * the sampler's, which key Philox by the same user seed. */
#define DATASET_SHUFFLE_TAG 0x53485546464c4531ull /* "SHUFFLE1" */

void dataset_epoch_order(size_t *order, size_t n, uint64_t seed, uint64_t epoch) {
    for (size_t i = 0; i < n; i++) order[i] = i;
    /* Fisher-Yates from the back: position i swaps with a uniform j in [0, i].
     * 64 random bits per draw, reduced by modulo: the bias is below n / 2^64. */
    for (size_t i = n; i > 1; i--) {
        uint32_t r[4];
        rng_philox(r, seed ^ DATASET_SHUFFLE_TAG, epoch, (uint64_t)(i - 1));
        uint64_t bits = ((uint64_t)r[0] << 32) | r[1];
        size_t j = (size_t)(bits % (uint64_t)i);
        size_t t = order[i - 1];
        order[i - 1] = order[j];
        order[j] = t;
    }
}
