/* chat_template.c — renders a Hugging Face chat template the way transformers'
 * apply_chat_template does: the template sees messages (a list of {role,
 * content} dicts), add_generation_prompt, tools=None, documents=None, the
 * bos/eos tokens when given (a NULL token is left undefined, as for Qwen's
 * missing bos_token), and the globals raise_exception, namespace, range, dict
 * and strftime_now. The Jinja subset itself lives in jinja_*.c; this file is
 * only the entry point. */
#include "tokenizer/chat_template.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/jinja.h"

static Value function_value(JinjaFunction fn) { return (Value){.kind = VAL_FUNCTION, .as.function = fn}; }

/* Everything that can fail, kept out of chat_template_render's frame so that
 * no local there changes between setjmp and longjmp. */
static void render(Jinja *J, char **out, const char *template_source, const ChatMessage *messages, size_t n_messages,
                   bool add_generation_prompt, const char *bos_token, const char *eos_token) {
    jinja_lex(J, template_source);
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
    for (size_t i = 0; i < n_messages; i++) {
        Dict *m = dict_new(J, DICT_PLAIN);
        dict_set_cstr(J, m, "role", value_cstring(J, messages[i].role));
        dict_set_cstr(J, m, "content", value_cstring(J, messages[i].content));
        list_push(J, list, (Value){.kind = VAL_DICT, .as.dict = m});
    }
    dict_set_cstr(J, context->vars, "messages", (Value){.kind = VAL_LIST, .as.list = list});
    dict_set_cstr(J, context->vars, "tools", value_none());
    dict_set_cstr(J, context->vars, "documents", value_none());
    dict_set_cstr(J, context->vars, "add_generation_prompt", value_bool(add_generation_prompt));
    if (bos_token) dict_set_cstr(J, context->vars, "bos_token", value_cstring(J, bos_token));
    if (eos_token) dict_set_cstr(J, context->vars, "eos_token", value_cstring(J, eos_token));

    Buf rendered = {0};
    J->out = &rendered;
    jinja_render(J, &body, context);

    *out = xmalloc(rendered.len + 1);
    if (rendered.len) memcpy(*out, rendered.data, rendered.len);
    (*out)[rendered.len] = '\0';
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

    Jinja *J = xcalloc(1, sizeof(Jinja));
    if (setjmp(J->jump)) { /* every parse or render error lands here */
        errorf(err, "%s", J->err);
        jinja_free_all(J);
        free(J);
        return COLT_ERR;
    }
    render(J, out, template_source, messages, n_messages, add_generation_prompt, bos_token, eos_token);
    jinja_free_all(J);
    free(J);
    return COLT_OK;
}
