/* chat_template.c — renders a Hugging Face chat template the way transformers'
 * apply_chat_template does: the template sees messages (a list of dicts,
 * prepared as transformers prepares them), add_generation_prompt, tools (None or
 * a list), documents=None, the bos/eos tokens when given (a NULL token is left
 * undefined, as for Qwen's missing bos_token), the caller's extra variables, and
 * the globals raise_exception, namespace, range, dict and strftime_now. JSON
 * values become Jinja values here. The Jinja subset itself lives in jinja_*.c;
 * this file is only the entry point. */
#include "tokenizer/chat_template.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/jinja.h"

static Value function_value(JinjaFunction fn) { return (Value){.kind = VAL_FUNCTION, .as.function = fn}; }
static Value dict_value(Dict *d) { return (Value){.kind = VAL_DICT, .as.dict = d}; }

/* The Jinja value of a JSON value, as Python's json.loads would give it to
 * jinja2: objects keep their key order. `what` names the value in errors. */
static Value json_to_value(Jinja *J, const json_t *v, const char *what, int depth) {
    if (depth > JINJA_MAX_DEPTH) jinja_fail(J, 0, "%s nests more than %d levels deep", what, JINJA_MAX_DEPTH);
    switch (json_typeof(v)) {
    case JSON_NULL: return value_none();
    case JSON_TRUE: return value_bool(true);
    case JSON_FALSE: return value_bool(false);
    case JSON_INTEGER: return value_int((int64_t)json_integer_value(v));
    case JSON_REAL: return value_float(json_real_value(v));
    case JSON_STRING: {
        size_t n = json_string_length(v);
        const char *s = json_string_value(v);
        if (memchr(s, '\0', n)) jinja_fail(J, 0, "%s holds a string with a NUL character", what);
        return value_string(J, s, n);
    }
    case JSON_ARRAY: {
        List *l = list_new(J, false);
        size_t i;
        json_t *item;
        json_array_foreach(v, i, item) list_push(J, l, json_to_value(J, item, what, depth + 1));
        return list_value(l, LIST_PLAIN);
    }
    case JSON_OBJECT: {
        Dict *d = dict_new(J, DICT_PLAIN);
        const char *key;
        json_t *item;
        json_object_foreach((json_t *)v, key, item) dict_set_cstr(J, d, key, json_to_value(J, item, what, depth + 1));
        return dict_value(d);
    }
    }
    jinja_fail(J, 0, "%s is not a JSON value", what);
}

/* One message as transformers 5.24's apply_chat_template hands it to the
 * template: keys whose value is null dropped (_normalize_chat_messages), then
 * the first non-null of reasoning_content, thinking and reasoning copied to
 * "thinking" (first, unless the message has its own) and "reasoning_content"
 * (_alias_reasoning_fields, which is {"thinking": r, **message,
 * "reasoning_content": r}). */
static Value message_value(Jinja *J, const json_t *m, size_t index) {
    char what[64];
    snprintf(what, sizeof what, "message %zu", index);
    if (!json_is_object(m))
        jinja_fail(J, 0, "%s is not an object (a message is {\"role\": ..., \"content\": ...})", what);
    static const char *const REASONING[] = {"reasoning_content", "thinking", "reasoning"};
    const json_t *reasoning = NULL;
    for (size_t k = 0; k < 3 && !reasoning; k++) {
        const json_t *r = json_object_get(m, REASONING[k]);
        if (r && !json_is_null(r)) reasoning = r;
    }
    Dict *d = dict_new(J, DICT_PLAIN);
    Value reasoning_value = reasoning ? json_to_value(J, reasoning, what, 1) : value_undefined();
    if (reasoning) dict_set_cstr(J, d, "thinking", reasoning_value);
    const char *key;
    json_t *item;
    json_object_foreach((json_t *)m, key, item)
        if (!json_is_null(item)) dict_set_cstr(J, d, key, json_to_value(J, item, what, 1));
    if (reasoning) dict_set_cstr(J, d, "reasoning_content", reasoning_value);
    return dict_value(d);
}

/* Names apply_chat_template passes to the template itself: a variable of that
 * name would be Python's "got multiple values for keyword argument". */
static const char *const RESERVED[] = {"messages", "tools", "documents", "add_generation_prompt"};

typedef struct RenderInput {
    const char *template_source;
    const json_t *json_messages;  /* a JSON array, or NULL for ... */
    const ChatMessage *messages;  /* ... n_messages {role, content} pairs */
    size_t n_messages;
    ChatTemplateOptions options;
} RenderInput;

/* Everything that can fail, kept out of the caller's frame so that no local
 * there changes between setjmp and longjmp. */
static void render(Jinja *J, char **out, const RenderInput *in) {
    const ChatTemplateOptions *o = &in->options;
    jinja_lex(J, in->template_source);
    NodeList body = jinja_parse(J);
    Scope *globals = jinja_alloc(J, sizeof(Scope));
    globals->vars = dict_new(J, DICT_PLAIN);
    dict_set_cstr(J, globals->vars, "raise_exception", function_value(FN_RAISE_EXCEPTION));
    dict_set_cstr(J, globals->vars, "namespace", function_value(FN_NAMESPACE));
    dict_set_cstr(J, globals->vars, "range", function_value(FN_RANGE));
    dict_set_cstr(J, globals->vars, "dict", function_value(FN_DICT));
    dict_set_cstr(J, globals->vars, "strftime_now", function_value(FN_STRFTIME_NOW));

    Scope *context = jinja_alloc(J, sizeof(Scope));
    context->parent = globals;
    context->vars = dict_new(J, DICT_PLAIN);
    List *list = list_new(J, false);
    if (in->json_messages) {
        size_t i;
        json_t *m;
        json_array_foreach(in->json_messages, i, m) list_push(J, list, message_value(J, m, i));
    } else {
        for (size_t i = 0; i < in->n_messages; i++) {
            Dict *m = dict_new(J, DICT_PLAIN);
            dict_set_cstr(J, m, "role", value_cstring(J, in->messages[i].role));
            dict_set_cstr(J, m, "content", value_cstring(J, in->messages[i].content));
            list_push(J, list, dict_value(m));
        }
    }
    dict_set_cstr(J, context->vars, "messages", list_value(list, LIST_PLAIN));
    dict_set_cstr(J, context->vars, "tools", o->tools ? json_to_value(J, o->tools, "tools", 0) : value_none());
    dict_set_cstr(J, context->vars, "documents", value_none());
    dict_set_cstr(J, context->vars, "add_generation_prompt", value_bool(o->add_generation_prompt));
    if (o->bos_token) dict_set_cstr(J, context->vars, "bos_token", value_cstring(J, o->bos_token));
    if (o->eos_token) dict_set_cstr(J, context->vars, "eos_token", value_cstring(J, o->eos_token));
    if (o->variables) {
        const char *name;
        json_t *v;
        json_object_foreach((json_t *)o->variables, name, v) {
            for (size_t k = 0; k < sizeof RESERVED / sizeof *RESERVED; k++)
                if (!strcmp(name, RESERVED[k]))
                    jinja_fail(J, 0, "variable '%s' cannot be set: apply_chat_template sets it itself", name);
            char what[96];
            snprintf(what, sizeof what, "variable '%.60s'", name);
            dict_set_cstr(J, context->vars, name, json_to_value(J, v, what, 0));
        }
    }

    Buf rendered = {0};
    J->out = &rendered;
    jinja_render(J, &body, context);

    *out = xmalloc(rendered.len + 1);
    if (rendered.len) memcpy(*out, rendered.data, rendered.len);
    (*out)[rendered.len] = '\0';
}

static int render_protected(char **out, const RenderInput *in, char *err) {
    Jinja *J = xcalloc(1, sizeof(Jinja));
    if (setjmp(J->jump)) { /* every parse or render error lands here */
        errorf(err, "%s", J->err);
        jinja_free_all(J);
        free(J);
        return COLT_ERR;
    }
    render(J, out, in);
    jinja_free_all(J);
    free(J);
    return COLT_OK;
}

int chat_template_render_json(char **out, const char *template_source, const json_t *messages,
                              const ChatTemplateOptions *options, char *err) {
    if (!out) return errorf(err, "chat template: no output pointer");
    *out = NULL;
    if (!template_source) return errorf(err, "chat template: no template source");
    if (!json_is_array(messages)) return errorf(err, "chat template: the messages must be a list");
    RenderInput in = {.template_source = template_source, .json_messages = messages};
    if (options) in.options = *options;
    if (in.options.tools && !json_is_array(in.options.tools))
        return errorf(err, "chat template: tools must be a list of tool definitions (or absent)");
    for (size_t i = 0; in.options.tools && i < json_array_size(in.options.tools); i++)
        if (!json_is_object(json_array_get(in.options.tools, i)))
            return errorf(err, "chat template: tools[%zu] is not an object (a JSON-schema function definition)", i);
    if (in.options.variables && !json_is_object(in.options.variables))
        return errorf(err, "chat template: the template variables must be an object of name: value");
    return render_protected(out, &in, err);
}

int chat_template_render(char **out, const char *template_source, const ChatMessage *messages, size_t n_messages,
                         bool add_generation_prompt, const char *bos_token, const char *eos_token, char *err) {
    if (!out) return errorf(err, "chat template: no output pointer");
    *out = NULL;
    if (!template_source) return errorf(err, "chat template: no template source");
    if (n_messages && !messages) return errorf(err, "chat template: %zu messages but no message array", n_messages);
    for (size_t i = 0; i < n_messages; i++)
        if (!messages[i].role || !messages[i].content)
            return errorf(err, "chat template: message %zu has no %s", i, messages[i].role ? "content" : "role");
    RenderInput in = {
        .template_source = template_source,
        .messages = messages,
        .n_messages = n_messages,
        .options = {.add_generation_prompt = add_generation_prompt, .bos_token = bos_token, .eos_token = eos_token},
    };
    return render_protected(out, &in, err);
}
