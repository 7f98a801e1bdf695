/* tool_calls.c — reads the tool calls out of a completion as TRL 1.16 does
 * (its response templates run by transformers 5.24's ResponseParser, then
 * trl.chat_template_utils.parse_response's clean-up and fallback), and renders
 * TRL's tool suffix ids. See tool_calls.h for the formats.
 *
 * The parser is transformers' ResponseParser reduced to what a whole
 * completion needs (no streaming): the text after the prefix's last
 * assistant header, then the completion, scanned left to right. Outside a
 * region ("implicit": content) it watches every region's opening and
 * content's closing; inside one, only that region's closing. The earliest
 * match wins (ties: the longer, an opening before a closing). Text between
 * matches goes to the current region; closing a region parses its text
 * (text: stripped; json: parsed) and stores it (a repeated region appends; a
 * plain one replaces, which is why content after a tool call wins). Not a
 * general response-template engine: the two templates are tables below. */
#include "agent/tool_calls.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <math.h>
#include <pcre2.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/chat_template.h"

/* ---------------------------------------------------------------------------
 * The response templates (trl/chat_template_utils.py: qwen3_template, llama3_template)
 * ------------------------------------------------------------------------- */

typedef enum { CONTENT_TEXT, CONTENT_JSON } ContentKind;
typedef enum { TRANSFORM_NONE, TRANSFORM_FUNCTION_IS_CONTENT, TRANSFORM_NAME_AND_ARGUMENTS } Transform;

typedef struct FieldSpec {
    const char *name;
    const char *open;  /* where the region opens, or NULL: the implicit region */
    bool open_is_regex; /* else open is a literal */
    const char *close; /* a regex, or NULL */
    ContentKind content;
    bool repeats;
    Transform transform;
} FieldSpec;

typedef struct TemplateSpec {
    const char *start_anchor; /* a literal */
    FieldSpec fields[3];
    int n_fields;
} TemplateSpec;

static const TemplateSpec HERMES_SPEC = {
    "<|im_start|>assistant\n",
    {{"reasoning_content", "<think>", false, "</think>\\s*", CONTENT_TEXT, false, TRANSFORM_NONE},
     {"tool_calls", "<tool_call>", false, "</tool_call>\\s*", CONTENT_JSON, true, TRANSFORM_FUNCTION_IS_CONTENT},
     {"content", NULL, false, "<\\|im_end\\|>\\s*", CONTENT_TEXT, false, TRANSFORM_NONE}},
    3,
};

static const TemplateSpec LLAMA3_SPEC = {
    "<|start_header_id|>assistant<|end_header_id|>\n\n",
    {{"tool_calls", "\\{\"name\":\\s*\"(?P<name>[^\"]+)\",\\s*\"parameters\":\\s*", true,
      "\\}<\\|eot_id\\|>\\s*", CONTENT_JSON, true, TRANSFORM_NAME_AND_ARGUMENTS},
     {"content", NULL, false, "<\\|eot_id\\|>\\s*", CONTENT_TEXT, false, TRANSFORM_NONE}},
    2,
};

int tool_calls_format_of_template(ToolCallFormat *out, const char *template_source, char *err) {
    if (!template_source) return errorf(err, "tool calls: the tokenizer has no chat template");
    if (strstr(template_source, "<function=") || strstr(template_source, "<arg_key>"))
        return errorf(err, "tool calls: the chat template writes XML-style tool calls (Qwen3.5 / GLM), which colt "
                           "does not read yet; supported: Qwen2.5/Qwen3 <tool_call> JSON and Llama 3.1/3.2 JSON");
    if (strstr(template_source, "<tool_call>")) {
        *out = TOOL_FORMAT_HERMES;
        return 0;
    }
    if (strstr(template_source, "<|eot_id|>") && strstr(template_source, "\"parameters\": ")) {
        *out = TOOL_FORMAT_LLAMA3;
        return 0;
    }
    return errorf(err, "tool calls: the chat template renders no tool calls colt can read (supported: Qwen2.5/Qwen3 "
                       "<tool_call> JSON and Llama 3.1/3.2 JSON); is it a tool-calling model's template?");
}

/* ---------------------------------------------------------------------------
 * Small helpers
 * ------------------------------------------------------------------------- */

typedef struct Buf {
    char *s;
    size_t len, cap;
} Buf;

static void buf_add(Buf *b, const char *s, size_t n) {
    if (b->len + n + 1 > b->cap) {
        b->cap = (b->len + n + 1) * 2;
        b->s = xrealloc(b->s, b->cap);
    }
    memcpy(b->s + b->len, s, n);
    b->len += n;
    b->s[b->len] = '\0';
}

/* The code point of the UTF-8 sequence at s[i] (of n), its length in *len. */
static unsigned decode_utf8(const unsigned char *s, size_t n, size_t i, size_t *len) {
    unsigned c = s[i];
    size_t k = c < 0x80 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
    if (i + k > n) k = 1;
    unsigned cp = k == 1 ? c : k == 2 ? c & 0x1f : k == 3 ? c & 0x0f : c & 0x07;
    for (size_t j = 1; j < k; j++) cp = (cp << 6) | (s[i + j] & 0x3f);
    *len = k;
    return cp;
}

/* Python's str.isspace(), which str.strip() uses. */
static bool is_python_space(unsigned cp) {
    return (cp >= 0x09 && cp <= 0x0d) || (cp >= 0x1c && cp <= 0x20) || cp == 0x85 || cp == 0xa0 || cp == 0x1680 ||
           (cp >= 0x2000 && cp <= 0x200a) || cp == 0x2028 || cp == 0x2029 || cp == 0x202f || cp == 0x205f ||
           cp == 0x3000;
}

/* s[0..n) without Python whitespace at either end, as a new string. */
static char *python_strip(const char *s, size_t n) {
    const unsigned char *u = (const unsigned char *)s;
    size_t a = 0, b = n, len;
    while (a < b && is_python_space(decode_utf8(u, n, a, &len))) a += len;
    while (b > a) {
        size_t k = b - 1;
        while (k > a && (u[k] & 0xc0) == 0x80) k--;
        if (!is_python_space(decode_utf8(u, n, k, &len))) break;
        b = k;
    }
    char *out = xmalloc(b - a + 1);
    memcpy(out, s + a, b - a);
    out[b - a] = '\0';
    return out;
}

static char *escape_literal(const char *s) {
    Buf b = {0};
    for (; *s; s++) {
        if (strchr("\\^$.|?*+()[]{}", *s)) buf_add(&b, "\\", 1);
        buf_add(&b, s, 1);
    }
    return b.s;
}

static pcre2_code *compile(const char *pattern, bool literal) {
    char *escaped = literal ? escape_literal(pattern) : NULL;
    int code;
    PCRE2_SIZE offset;
    /* UCP: \s is Unicode whitespace, as in Python's regex module on str patterns. */
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)(escaped ? escaped : pattern), PCRE2_ZERO_TERMINATED,
                                   PCRE2_DOTALL | PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &code, &offset, NULL);
    free(escaped);
    COLT_ASSERT(re != NULL); /* the patterns are this file's constants */
    return re;
}

/* ---------------------------------------------------------------------------
 * Typing arguments by the tool's schema (transformers' ResponseParser._coerce_tool_calls)
 * ------------------------------------------------------------------------- */

/* The schema's types in order: "type" (a string or a list), anyOf/oneOf's,
 * and "null" when nullable (transformers' _schema_types). */
static void schema_types(json_t *types, const json_t *schema) {
    if (!json_is_object(schema)) return;
    const json_t *declared = json_object_get(schema, "type");
    if (json_is_string(declared)) json_array_append(types, (json_t *)declared);
    size_t i;
    json_t *v;
    if (json_is_array(declared))
        json_array_foreach(declared, i, v) if (json_is_string(v)) json_array_append(types, v);
    const char *unions[] = {"anyOf", "oneOf"};
    for (int u = 0; u < 2; u++) {
        const json_t *choices = json_object_get(schema, unions[u]);
        if (json_is_array(choices)) json_array_foreach(choices, i, v) schema_types(types, v);
    }
    if (json_is_true(json_object_get(schema, "nullable"))) {
        bool has_null = false;
        json_array_foreach(types, i, v) has_null |= strcmp(json_string_value(v), "null") == 0;
        if (!has_null) json_array_append_new(types, json_string("null"));
    }
}

static bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

/* Python's float(raw) for the decimal forms a model writes (sign, digits,
 * point, exponent; inf/infinity/nan): 0 and *out, or -1 where Python raises
 * or colt does not follow it (digit underscores, non-ASCII digits). */
static int python_float(double *out, const char *raw) {
    size_t a = 0, b = strlen(raw);
    while (a < b && is_ascii_space(raw[a])) a++;
    while (b > a && is_ascii_space(raw[b - 1])) b--;
    if (a == b) return -1;
    char *s = xmalloc(b - a + 1);
    memcpy(s, raw + a, b - a);
    s[b - a] = '\0';
    const char *p = s + (s[0] == '+' || s[0] == '-');
    int ok = 0;
    if (!strcasecmp(p, "inf") || !strcasecmp(p, "infinity") || !strcasecmp(p, "nan")) {
        ok = 1;
    } else {
        size_t digits = 0;
        while (*p >= '0' && *p <= '9') p++, digits++;
        if (*p == '.') {
            p++;
            while (*p >= '0' && *p <= '9') p++, digits++;
        }
        if (digits && (*p == 'e' || *p == 'E')) {
            p++;
            if (*p == '+' || *p == '-') p++;
            size_t exp = 0;
            while (*p >= '0' && *p <= '9') p++, exp++;
            if (!exp) digits = 0;
        }
        ok = digits > 0 && *p == '\0';
    }
    if (ok) *out = strtod(s, NULL);
    free(s);
    return ok ? 0 : -1;
}

/* Python's int(raw) for a plain decimal integer (spaces, sign, digits). */
static int python_int(json_int_t *out, const char *raw) {
    const char *p = raw;
    while (is_ascii_space(*p)) p++;
    const char *start = p;
    if (*p == '+' || *p == '-') p++;
    const char *digits = p;
    while (*p >= '0' && *p <= '9') p++;
    if (p == digits) return -1;
    const char *end = p;
    while (is_ascii_space(*p)) p++;
    if (*p) return -1;
    char tmp[32];
    if ((size_t)(end - start) >= sizeof tmp) return -1; /* beyond 64 bits: jansson cannot hold it */
    memcpy(tmp, start, (size_t)(end - start));
    tmp[end - start] = '\0';
    *out = strtoll(tmp, NULL, 10);
    return 0;
}

static bool stripped_lower_is(const char *raw, const char *const *words) {
    char *s = python_strip(raw, strlen(raw));
    bool hit = false;
    for (int i = 0; words[i] && !hit; i++) hit = strcasecmp(s, words[i]) == 0;
    free(s);
    return hit;
}

/* transformers' _coerce: the first of types that raw reads as, else raw (new ref). */
static json_t *coerce(const char *raw, const json_t *types) {
    size_t i;
    json_t *t;
    json_array_foreach(types, i, t) {
        const char *type = json_string_value(t);
        double f;
        json_int_t n;
        if (!strcmp(type, "integer")) {
            if (python_int(&n, raw) == 0) return json_integer(n);
            if (python_float(&f, raw) == 0 && isfinite(f) && f == floor(f) && fabs(f) < 9.2e18)
                return json_integer((json_int_t)f);
        } else if (!strcmp(type, "number")) {
            if (python_float(&f, raw) == 0 && isfinite(f)) {
                if (f == floor(f) && !strchr(raw, '.') && fabs(f) < 9.2e18) return json_integer((json_int_t)f);
                return json_real(f);
            }
        } else if (!strcmp(type, "boolean")) {
            static const char *const truthy[] = {"true", "1", NULL}, *const falsy[] = {"false", "0", NULL};
            /* Python lower-cases before comparing, strcasecmp the same for these ASCII words. */
            if (stripped_lower_is(raw, truthy)) return json_true();
            if (stripped_lower_is(raw, falsy)) return json_false();
        } else if (!strcmp(type, "null")) {
            char *s = python_strip(raw, strlen(raw));
            bool is_null = !strcmp(s, "null") || !strcmp(s, "None");
            free(s);
            if (is_null) return json_null();
        } else if (!strcmp(type, "object") || !strcmp(type, "array")) {
            json_t *v = json_loads(raw, JSON_DECODE_ANY, NULL);
            if (v && (!strcmp(type, "object") ? json_is_object(v) : json_is_array(v))) return v;
            json_decref(v);
        }
    }
    return json_string(raw);
}

/* The "properties" of the tool named `name` among tools (schemas, or
 * {"name", "parameters"} objects), or NULL. */
static const json_t *tool_properties(const json_t *tools, const char *name) {
    size_t i;
    json_t *tool;
    const json_t *found = NULL;
    json_array_foreach(tools, i, tool) {
        const json_t *fn = json_object_get(tool, "function");
        if (!fn) fn = tool;
        const json_t *fname = json_object_get(fn, "name");
        if (!json_is_object(fn) || !json_is_string(fname) || strcmp(json_string_value(fname), name)) continue;
        const json_t *params = json_object_get(fn, "parameters");
        const json_t *props = json_is_object(params) ? json_object_get(params, "properties") : NULL;
        found = json_is_object(props) ? props : NULL; /* a later tool of the same name wins, as in a dict */
    }
    return found;
}

static void coerce_tool_call(json_t *call, const json_t *tools) {
    json_t *fn = json_object_get(call, "function");
    if (!json_is_object(fn)) return;
    json_t *name = json_object_get(fn, "name"), *arguments = json_object_get(fn, "arguments");
    if (!json_is_string(name) || !json_is_object(arguments)) return;
    const json_t *properties = tool_properties(tools, json_string_value(name));
    if (!properties || json_object_size(properties) == 0) return;
    const char *key;
    json_t *argument;
    json_object_foreach(arguments, key, argument) {
        json_t *types = json_array();
        schema_types(types, json_object_get(properties, key));
        bool has_array = false;
        size_t i;
        json_t *t;
        json_array_foreach(types, i, t) has_array |= !strcmp(json_string_value(t), "array");
        if (json_array_size(types) > 0) {
            if (json_is_string(argument)) {
                json_object_set_new(arguments, key, coerce(json_string_value(argument), types));
            } else if (json_is_array(argument) && !has_array) {
                json_t *item;
                json_array_foreach(argument, i, item) if (json_is_string(item))
                    json_array_set_new(argument, i, coerce(json_string_value(item), types));
            }
        }
        json_decref(types);
    }
}

/* ---------------------------------------------------------------------------
 * The scan
 * ------------------------------------------------------------------------- */

typedef struct Parser {
    const TemplateSpec *spec;
    pcre2_code *open_re[3], *close_re[3];
    int implicit; /* the field without an opening */
    const char *text;
    size_t len;
    const json_t *tools;
    json_t *output;
    int current; /* a field, never -1 here: both templates have an implicit one */
    bool opened;
    Buf body;
    char *capture_name; /* the opening's (?P<name>) */
    bool failed;        /* a region's content did not parse: the caller falls back to plain text */
} Parser;

static void reset_to_implicit(Parser *p) {
    p->current = p->implicit;
    p->opened = false;
    p->body.len = 0;
    if (p->body.s) p->body.s[0] = '\0';
    free(p->capture_name);
    p->capture_name = NULL;
}

static void accumulate(Parser *p, size_t from, size_t to) {
    if (to <= from) return;
    p->opened = true;
    buf_add(&p->body, p->text + from, to - from);
}

static void close_current(Parser *p) {
    if (!p->opened) {
        reset_to_implicit(p);
        return;
    }
    const FieldSpec *f = &p->spec->fields[p->current];
    const char *body = p->body.s ? p->body.s : "";
    json_t *value;
    if (f->content == CONTENT_TEXT) {
        char *s = python_strip(body, p->body.len);
        value = json_string(s);
        free(s);
        if (!value) value = json_string(""); /* not UTF-8: cannot be, the text came from the tokenizer */
    } else {
        value = json_loadb(body, p->body.len, JSON_DECODE_ANY, NULL);
        if (!value) {
            p->failed = true;
            reset_to_implicit(p);
            return;
        }
    }
    if (f->transform == TRANSFORM_FUNCTION_IS_CONTENT) {
        value = json_pack("{s:s, s:o}", "type", "function", "function", value);
    } else if (f->transform == TRANSFORM_NAME_AND_ARGUMENTS) {
        value = json_pack("{s:s, s:{s:s, s:o}}", "type", "function", "function", "name",
                          p->capture_name ? p->capture_name : "", "arguments", value);
    }
    if (p->tools) coerce_tool_call(value, p->tools);
    if (f->repeats) {
        json_t *list = json_object_get(p->output, f->name);
        if (!list) json_object_set_new(p->output, f->name, list = json_array());
        json_array_append_new(list, value);
    } else {
        json_object_set_new(p->output, f->name, value);
    }
    reset_to_implicit(p);
}

/* The earliest match among what the current region watches; fills
 * start/end/field/is_open, or returns false. */
static bool scan(Parser *p, pcre2_match_data *md, size_t pos, size_t *start, size_t *end, int *field, bool *is_open) {
    bool found = false;
    for (int pass = 0; pass < 2; pass++) {
        for (int i = 0; i < p->spec->n_fields; i++) {
            bool open = pass == 0;
            pcre2_code *re;
            if (p->current != p->implicit)
                re = !open && i == p->current ? p->close_re[i] : NULL;
            else
                re = open ? p->open_re[i] : (i == p->implicit ? p->close_re[i] : NULL);
            if (!re) continue;
            int rc = pcre2_match(re, (PCRE2_SPTR)p->text, p->len, pos, PCRE2_NO_UTF_CHECK, md, NULL);
            if (rc < 0) continue;
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
            size_t s = ov[0], e = ov[1];
            /* earliest start, then the longer, then an opening before a closing (pass order) */
            if (!found || s < *start || (s == *start && e - s > *end - *start)) {
                found = true;
                *start = s, *end = e, *field = i, *is_open = open;
                if (open) {
                    free(p->capture_name);
                    p->capture_name = NULL;
                    PCRE2_UCHAR *name = NULL;
                    PCRE2_SIZE name_len;
                    if (pcre2_substring_get_byname(md, (PCRE2_SPTR) "name", &name, &name_len) == 0) {
                        p->capture_name = xmalloc(name_len + 1);
                        memcpy(p->capture_name, name, name_len);
                        p->capture_name[name_len] = '\0';
                        pcre2_substring_free(name);
                    }
                }
            }
        }
    }
    return found;
}

/* TRL's _validate_tool_calls: 0, or -1 where TRL raises (then plain text). */
static int validate_tool_calls(json_t *calls) {
    if (!json_is_array(calls)) return -1;
    size_t i;
    json_t *call;
    json_array_foreach(calls, i, call) {
        if (!json_is_object(call)) return -1;
        json_t *fn = json_object_get(call, "function");
        if (!fn) fn = call;
        else if (!json_is_object(fn)) return -1;
        if (!json_is_string(json_object_get(fn, "name"))) return -1;
        json_t *arguments = json_object_get(fn, "arguments");
        if (!arguments || json_is_null(arguments)) json_object_set_new(fn, "arguments", json_object());
    }
    return 0;
}

static bool is_empty(const json_t *v) {
    return !v || json_is_null(v) || (json_is_string(v) && json_string_length(v) == 0) ||
           (json_is_array(v) && json_array_size(v) == 0) || (json_is_object(v) && json_object_size(v) == 0);
}

/* The scan over the whole text: regions open and close at the earliest
 * match, text between goes to the current region, the end closes it. */
static void parser_run(Parser *p) {
    reset_to_implicit(p);
    pcre2_match_data *md = pcre2_match_data_create(8, NULL);
    size_t pos = 0;
    while (!p->failed) {
        size_t start = 0, end = 0;
        int field = 0;
        bool is_open = false;
        if (!scan(p, md, pos, &start, &end, &field, &is_open)) {
            accumulate(p, pos, p->len);
            close_current(p);
            break;
        }
        accumulate(p, pos, start);
        pos = end;
        if (is_open) {
            char *name = p->capture_name; /* the new region's, not the one closing */
            p->capture_name = NULL;
            close_current(p);
            p->current = field;
            p->opened = true;
            p->body.len = 0;
            p->capture_name = name;
        } else {
            bool had_content = p->opened;
            close_current(p);
            if (!had_content && start == end) break; /* an empty match would fire forever */
        }
    }
    pcre2_match_data_free(md);
}

int tool_calls_parse(json_t **message, ToolCallFormat format, const char *prefix, const char *text,
                     const char *text_skip_special, const char *eos_token, const json_t *tools, char *err) {
    *message = NULL;
    if (!text || !text_skip_special) return errorf(err, "tool calls: the completion's text is missing");
    if (tools && !json_is_array(tools))
        return errorf(err, "tool calls: \"tools\" must be a list of tool schemas ({\"type\": \"function\", ...})");
    const TemplateSpec *spec = format == TOOL_FORMAT_LLAMA3 ? &LLAMA3_SPEC : &HERMES_SPEC;

    /* The prefix from just past its last assistant header (all of it when it has none,
     * as transformers does), then the completion. */
    const char *tail = prefix ? prefix : "";
    for (const char *hit; (hit = strstr(tail, spec->start_anchor));) tail = hit + strlen(spec->start_anchor);
    Buf all = {0};
    buf_add(&all, tail, strlen(tail));
    buf_add(&all, text, strlen(text));

    Parser p = {.spec = spec, .text = all.s, .len = all.len, .tools = tools, .implicit = -1};
    for (int i = 0; i < spec->n_fields; i++) {
        const FieldSpec *f = &spec->fields[i];
        p.open_re[i] = f->open ? compile(f->open, !f->open_is_regex) : NULL;
        p.close_re[i] = f->close ? compile(f->close, false) : NULL;
        if (!f->open) p.implicit = i;
    }
    p.output = json_pack("{s:s}", "role", "assistant");
    parser_run(&p);
    for (int i = 0; i < spec->n_fields; i++) {
        pcre2_code_free(p.open_re[i]);
        pcre2_code_free(p.close_re[i]);
    }
    free(p.body.s);
    free(p.capture_name);
    free(all.s);

    /* finalize: only role and the non-empty fields */
    json_t *out = p.output;
    const char *key;
    json_t *value;
    void *tmp;
    json_object_foreach_safe(out, tmp, key, value) if (strcmp(key, "role") && is_empty(value))
        json_object_del(out, key);
    /* TRL: the eos text off the end of content, content always a string, calls checked */
    json_t *content = json_object_get(out, "content");
    if (json_is_string(content) && eos_token && *eos_token) {
        size_t n = json_string_length(content), k = strlen(eos_token);
        if (n >= k && memcmp(json_string_value(content) + n - k, eos_token, k) == 0)
            json_object_set_new(out, "content", json_stringn(json_string_value(content), n - k));
    }
    if (is_empty(json_object_get(out, "content"))) json_object_set_new(out, "content", json_string(""));
    json_t *calls = json_object_get(out, "tool_calls");
    if (p.failed || (calls && validate_tool_calls(calls) != 0)) {
        json_decref(out);
        out = json_pack("{s:s, s:s}", "role", "assistant", "content", text_skip_special);
        if (!out) return errorf(err, "tool calls: the completion's text is not valid UTF-8");
    }
    *message = out;
    return 0;
}

int tool_calls_parse_ids(json_t **message, ToolCallFormat format, const Tokenizer *tok, const int *prefix_ids,
                         size_t n_prefix, const int *ids, size_t n_ids, const json_t *tools, char *err) {
    *message = NULL;
    char *prefix = NULL, *text = NULL, *plain = NULL;
    int rc = COLT_ERR;
    /* the model may sample its padded embedding rows (ids past the tokenizer's vocabulary): left out, as
     * transformers' decode leaves them, not an error that would stop the run */
    if (tokenizer_decode_generated(tok, prefix_ids, n_prefix, false, &prefix, err) != 0 ||
        tokenizer_decode_generated(tok, ids, n_ids, false, &text, err) != 0 ||
        tokenizer_decode_generated(tok, ids, n_ids, true, &plain, err) != 0) {
        error_prefix(err, "tool calls");
        goto done;
    }
    rc = tool_calls_parse(message, format, prefix, text, plain, tokenizer_eos_token(tok), tools, err);
done:
    free(prefix);
    free(text);
    free(plain);
    return rc;
}

/* ---------------------------------------------------------------------------
 * Tool suffix ids (TRL's GRPOTrainer._get_tool_suffix_ids)
 * ------------------------------------------------------------------------- */

static int render_ids(int **ids, size_t *n, const Tokenizer *tok, const char *template_source, const json_t *messages,
                      const json_t *tools, bool add_generation_prompt, const json_t *variables, char *err) {
    ChatTemplateOptions opt = {.add_generation_prompt = add_generation_prompt,
                               .bos_token = tokenizer_bos_token(tok),
                               .eos_token = tokenizer_eos_token(tok),
                               .tools = tools,
                               .variables = variables};
    char *text = NULL;
    if (chat_template_render_json(&text, template_source, messages, &opt, err) != 0) return COLT_ERR;
    int rc = tokenizer_encode(tok, text, strlen(text), ids, n, err); /* apply_chat_template adds no special tokens */
    free(text);
    return rc;
}

int tool_calls_prompt_ids(int **ids, size_t *n_ids, const Tokenizer *tok, const char *template_source,
                          const json_t *messages, const json_t *tools, const json_t *variables, char *err) {
    *ids = NULL;
    *n_ids = 0;
    if (!template_source) return errorf(err, "prompt with tools: the tokenizer has no chat template");
    if (tools && !json_is_array(tools)) return errorf(err, "prompt with tools: \"tools\" must be a list of schemas");
    /* TRL passes tools=self.tools or None: an empty list renders as no tools (Llama would add boilerplate). */
    if (tools && json_array_size(tools) == 0) tools = NULL;
    if (render_ids(ids, n_ids, tok, template_source, messages, tools, true, variables, err) != 0)
        return error_prefix(err, "prompt with tools");
    return 0;
}

int tool_calls_suffix_ids(int **ids, size_t *n_ids, const Tokenizer *tok, const char *template_source,
                          const json_t *tool_messages, const json_t *variables, char *err) {
    *ids = NULL;
    *n_ids = 0;
    if (!template_source) return errorf(err, "tool suffix: the tokenizer has no chat template");
    const json_t *first = json_array_get(tool_messages, 0);
    const json_t *name = json_object_get(first, "name");
    if (!json_is_array(tool_messages) || !json_is_object(first) || !json_is_string(name))
        return errorf(err, "tool suffix: tool_messages must be a non-empty list of {\"role\": \"tool\", \"name\": "
                           "..., \"content\": ...} messages");
    /* The real tool name, not a dummy: some templates (GPT-OSS) name the response after the call. */
    json_t *dummy = json_pack("[{s:s, s:s}, {s:s, s:s, s:[{s:s, s:{s:O, s:{}}}]}]", "role", "user", "content",
                              "dummy", "role", "assistant", "content", "", "tool_calls", "type", "function",
                              "function", "name", name, "arguments");
    json_t *full = json_deep_copy(dummy);
    json_array_extend(full, (json_t *)tool_messages);
    int *prefix = NULL, *all = NULL;
    size_t n_prefix = 0, n_all = 0;
    int rc = COLT_ERR;
    if (render_ids(&prefix, &n_prefix, tok, template_source, dummy, NULL, false, variables, err) != 0 ||
        render_ids(&all, &n_all, tok, template_source, full, NULL, true, variables, err) != 0) {
        error_prefix(err, "tool suffix");
        goto done;
    }
    /* Cut after the last eos (Qwen3 renders "<|im_end|>\n" after a turn; the completion ends at the eos). */
    int eos = tokenizer_eos_id(tok);
    for (size_t i = n_prefix; eos >= 0 && i-- > 0;)
        if (prefix[i] == eos) {
            n_prefix = i + 1;
            break;
        }
    if (n_all < n_prefix || memcmp(all, prefix, sizeof(int) * n_prefix) != 0) {
        errorf(err, "tool suffix: the chat template is not prefix-preserving (the conversation before the tool "
                    "messages, cut after its last eos, is not a prefix of the one with them); TRL would use its "
                    "training variant of the template");
        goto done;
    }
    *n_ids = n_all - n_prefix;
    *ids = xmalloc(sizeof(int) * (*n_ids ? *n_ids : 1));
    memcpy(*ids, all + n_prefix, sizeof(int) * *n_ids);
    rc = 0;
done:
    free(prefix);
    free(all);
    json_decref(dummy);
    json_decref(full);
    return rc;
}
