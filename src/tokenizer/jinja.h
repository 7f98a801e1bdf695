/* jinja.h — private to src/tokenizer: the types shared by the Jinja subset
 * interpreter behind chat_template.c (jinja_lex.c, jinja_parse.c, jinja_eval.c,
 * jinja_value.c). It is not a public API: callers use chat_template.h.
 *
 * Memory: everything one render allocates (tokens, AST, values, scopes, output)
 * lives in one Jinja context's arena and is freed at once at the end, so values
 * are shared freely without ownership rules. Errors: a runtime or parse error
 * formats the message into J->err and longjmps back to chat_template_render, so
 * the interpreter needs no error plumbing; the arena makes that leak-free. */
#ifndef COLT_TOKENIZER_JINJA_H
#define COLT_TOKENIZER_JINJA_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

enum {
    JINJA_MAX_DEPTH = 96,                   /* nesting of expressions, blocks, macro calls */
    JINJA_OUTPUT_LIMIT = 64 << 20,          /* bytes of one rendered string */
};
#define JINJA_ARENA_LIMIT ((size_t)512 << 20) /* bytes one render may allocate */
#define JINJA_STEP_LIMIT 20000000L          /* evaluated nodes per render */

/* ---------------------------------------------------------------- values */

typedef enum {
    VAL_UNDEFINED, /* jinja2's default Undefined: falsy, renders as "" */
    VAL_NONE,
    VAL_BOOL,
    VAL_INT,
    VAL_FLOAT,
    VAL_STRING,
    VAL_LIST,      /* list, or tuple when list->tuple */
    VAL_DICT,      /* dict, namespace() object or loop object (dict->kind) */
    VAL_FUNCTION,  /* a global such as raise_exception or namespace */
    VAL_METHOD,    /* a bound method such as 'abc'.strip */
    VAL_MACRO,
} ValueKind;

typedef enum { DICT_PLAIN, DICT_NAMESPACE, DICT_LOOP } DictKind;

typedef struct Str {
    size_t len;
    char data[]; /* NUL-terminated, never contains NUL */
} Str;

typedef struct List List;
typedef struct Dict Dict;
typedef struct Method Method;
typedef struct Macro Macro;

typedef struct Value {
    ValueKind kind;
    union {
        bool b;
        int64_t i;
        double f;
        Str *s;
        List *list;
        Dict *dict;
        int function; /* a JinjaFunction */
        Method *method;
        Macro *macro;
    } as;
} Value;

/* What Python object a list value stands for: jinja2's select/map/items
 * filters return one-shot generators (always truthy, not renderable, not
 * indexable), dict.items()/keys()/values() return views and range() a range. */
typedef enum { LIST_PLAIN, LIST_GENERATOR, LIST_VIEW, LIST_RANGE } ListKind;

struct List {
    size_t n, cap;
    Value *items;
    bool tuple;
    ListKind kind;
    bool consumed; /* a generator that was iterated already */
};

struct Dict {
    size_t n, cap;
    Value *keys;
    Value *values;
    DictKind kind;
};

struct Method {
    Value self;
    const char *name;
};

typedef enum { FN_RAISE_EXCEPTION, FN_NAMESPACE, FN_RANGE, FN_DICT, FN_STRFTIME_NOW } JinjaFunction;

/* ---------------------------------------------------------------- tokens */

typedef enum {
    TOK_EOF,
    TOK_TEXT,
    TOK_VAR_BEGIN,
    TOK_VAR_END,
    TOK_BLOCK_BEGIN,
    TOK_BLOCK_END,
    TOK_NAME,
    TOK_STRING,
    TOK_INT,
    TOK_FLOAT,
    TOK_OP,
} TokenKind;

typedef struct Token {
    TokenKind kind;
    int line;
    const char *text; /* TEXT/NAME/STRING (unescaped)/OP; NUL-terminated */
    size_t len;
    int64_t i;
    double f;
} Token;

/* ---------------------------------------------------------------- AST */

typedef enum {
    /* expressions */
    NODE_CONST, NODE_NAME, NODE_GETATTR, NODE_GETITEM, NODE_SLICE, NODE_CALL, NODE_FILTER,
    NODE_TEST, NODE_BINOP, NODE_NOT, NODE_NEG, NODE_POS, NODE_AND, NODE_OR, NODE_COMPARE,
    NODE_CONDEXPR, NODE_LIST, NODE_TUPLE, NODE_DICT,
    /* statements */
    NODE_TEXT, NODE_PRINT, NODE_IF, NODE_FOR, NODE_SET, NODE_MACRO, NODE_BREAK, NODE_CONTINUE,
    NODE_BLOCK, /* a body rendered in place: {% generation %} */
} NodeKind;

typedef struct Node Node;

typedef struct NodeList {
    Node **items;
    size_t n, cap;
} NodeList;

/* Fields by kind:
 *   CONST value | NAME name | GETATTR a.name | GETITEM a[b] | SLICE a[b:c:d]
 *   CALL a(args, kw) | FILTER a|name(args, kw), op = filter index | TEST a is name(args), op = test index
 *   BINOP a op b (op is the operator's first char, '/' '//'->'f' '**'->'p')
 *   NOT/NEG/POS a | AND/OR a b | COMPARE a (ops[i] args.items[i])... | CONDEXPR b if a else c
 *   LIST/TUPLE args | DICT args (keys) kw_values (values)
 *   TEXT value | PRINT a | IF a body else_body | FOR a=target in b if c, body, else_body
 *   SET a=target b=value (target NAME, TUPLE of NAME, or GETATTR of NAME)
 *   MACRO name, params in kw_names/kw_values (default or NULL), body */
struct Node {
    NodeKind kind;
    int line;
    int op;
    const char *name;
    Value value;
    Node *a, *b, *c, *d;
    NodeList args;
    NodeList kw_values;
    const char **kw_names;
    int *ops;
    NodeList body, else_body;
};

struct Macro {
    Node *node;
    struct Scope *closure;
};

typedef struct Scope {
    struct Scope *parent;
    Dict *vars;
} Scope;

/* ---------------------------------------------------------------- context */

typedef struct Buf {
    char *data;
    size_t len, cap;
} Buf;

typedef struct Chunk Chunk;

typedef struct Jinja {
    jmp_buf jump;
    char err[ERR_LEN];
    Chunk *chunks;
    size_t arena_bytes;
    long steps;
    int depth;
    int loop_depth; /* parser: enclosing for-loops, for break/continue */
    Token *tokens;
    size_t n_tokens, pos;
    Buf *out;
} Jinja;

/* jinja_value.c */
_Noreturn void jinja_fail(Jinja *J, int line, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void *jinja_alloc(Jinja *J, size_t n);
void *jinja_realloc(Jinja *J, void *p, size_t n);
void jinja_free_all(Jinja *J);
void buf_put(Jinja *J, Buf *b, const char *s, size_t n);
void buf_puts(Jinja *J, Buf *b, const char *s);
void buf_printf(Jinja *J, Buf *b, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
Value value_undefined(void);
Value value_none(void);
Value value_bool(bool b);
Value value_int(int64_t i);
Value value_float(double f);
Value value_string(Jinja *J, const char *s, size_t n);
Value value_cstring(Jinja *J, const char *s);
Value value_from_buf(Jinja *J, const Buf *b);
List *list_new(Jinja *J, bool tuple);
Value list_value(List *l, ListKind kind);
void list_push(Jinja *J, List *l, Value v);
Dict *dict_new(Jinja *J, DictKind kind);
void dict_set(Jinja *J, Dict *d, Value key, Value v);
bool dict_get(const Dict *d, Value key, Value *out);
bool dict_get_cstr(const Dict *d, const char *key, Value *out);
void dict_set_cstr(Jinja *J, Dict *d, const char *key, Value v);
bool value_truthy(Value v);
bool value_equal(Value a, Value b);
const char *value_type_name(Value v);
/* Python str(v) appended to b; fails on values str() would not render faithfully. */
void value_str(Jinja *J, Buf *b, Value v, int line);
/* Python repr(v). */
void value_repr(Jinja *J, Buf *b, Value v, int line);
/* json.dumps(v, ensure_ascii, indent (NULL = None), separators, sort_keys). */
void value_json(Jinja *J, Buf *b, Value v, bool ensure_ascii, const char *indent, const char *item_sep,
                const char *key_sep, bool sort_keys, int level, int line);
void float_repr(char *out, size_t n, double f);
size_t utf8_next(const char *s, size_t len, size_t i, int32_t *cp);
void utf8_put(Jinja *J, Buf *b, int32_t cp);
size_t utf8_count(const char *s, size_t len);
size_t space_at(const char *s, const char *end);
size_t space_before(const char *start, const char *end);

/* jinja_lex.c: tokens of the whole template into J->tokens. */
void jinja_lex(Jinja *J, const char *source);

/* jinja_parse.c: the template's top-level body. */
NodeList jinja_parse(Jinja *J);
int jinja_filter_index(const char *name);
int jinja_test_index(const char *name);

/* jinja_eval.c */
void jinja_render(Jinja *J, const NodeList *body, Scope *scope);
Value jinja_call_filter(Jinja *J, Node *n, int filter, Value v, Value *args, size_t n_args,
                        const char **kw_names, Value *kw_values, size_t n_kw);

#endif
