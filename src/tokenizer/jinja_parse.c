/* jinja_parse.c — recursive-descent parser from tokens to the AST, following
 * jinja2 3.1's parser (same precedence: condexpr < or < and < not < compare <
 * +,- < ~ < *,/,//,% < ** < unary -,+ < primary/postfix/filter/test). Statements:
 * if/elif/else, for/else (with an inline 'if' filter), set (names, tuples,
 * namespace attributes), macro, break/continue, generation. Anything else —
 * unknown statements, filters or tests — fails here with its line, as jinja2
 * does at compile time. */
#include <stdio.h>
#include <string.h>

#include "tokenizer/jinja.h"

static Token *cur(Jinja *J) { return &J->tokens[J->pos]; }
static Token *peek(Jinja *J, size_t k) {
    size_t i = J->pos + k;
    return &J->tokens[i < J->n_tokens ? i : J->n_tokens - 1];
}
static void advance(Jinja *J) {
    if (J->pos + 1 < J->n_tokens) J->pos++;
}
static bool tok_is_op(const Token *t, const char *op) { return t->kind == TOK_OP && strcmp(t->text, op) == 0; }
static bool tok_is_name(const Token *t, const char *name) { return t->kind == TOK_NAME && strcmp(t->text, name) == 0; }

static const char *describe(const Token *t) {
    switch (t->kind) {
    case TOK_EOF: return "end of template";
    case TOK_TEXT: return "template text";
    case TOK_VAR_BEGIN: return "'{{'";
    case TOK_VAR_END: return "'}}'";
    case TOK_BLOCK_BEGIN: return "'{%'";
    case TOK_BLOCK_END: return "'%}'";
    case TOK_STRING: return "a string";
    case TOK_INT: case TOK_FLOAT: return "a number";
    default: return t->text;
    }
}

static _Noreturn void unexpected(Jinja *J, const char *expected) {
    Token *t = cur(J);
    if (t->kind == TOK_NAME || t->kind == TOK_OP)
        jinja_fail(J, t->line, "unexpected '%s', expected %s", t->text, expected);
    jinja_fail(J, t->line, "unexpected %s, expected %s", describe(t), expected);
}

static void expect_op(Jinja *J, const char *op) {
    if (!tok_is_op(cur(J), op)) {
        char what[16];
        snprintf(what, sizeof what, "'%s'", op);
        unexpected(J, what);
    }
    advance(J);
}

static bool skip_op(Jinja *J, const char *op) {
    if (!tok_is_op(cur(J), op)) return false;
    advance(J);
    return true;
}

static bool skip_name(Jinja *J, const char *name) {
    if (!tok_is_name(cur(J), name)) return false;
    advance(J);
    return true;
}

static Node *node_new(Jinja *J, NodeKind kind, int line) {
    Node *n = jinja_alloc(J, sizeof(Node));
    n->kind = kind;
    n->line = line;
    return n;
}

static void nodes_push(Jinja *J, NodeList *l, Node *n) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 4;
        l->items = jinja_realloc(J, l->items, l->cap * sizeof(Node *));
    }
    l->items[l->n++] = n;
}

static void enter(Jinja *J) {
    if (++J->depth > JINJA_MAX_DEPTH) jinja_fail(J, cur(J)->line, "template nests too deeply");
}
static void leave(Jinja *J) { J->depth--; }

static Node *parse_expression(Jinja *J, bool with_condexpr);
static Node *parse_tuple(Jinja *J, bool simplified, bool with_condexpr, const char *extra_end, bool explicit_parens);
static Node *parse_unary(Jinja *J, bool with_filter);
static Node *parse_primary(Jinja *J);
static Node *parse_postfix(Jinja *J, Node *node);
static Node *parse_subscribed(Jinja *J);

/* ---------------------------------------------------------------- expressions */

/* (args, kw) of a call, filter or test; the current token is '('. */
static void parse_call_args(Jinja *J, Node *n) {
    expect_op(J, "(");
    size_t n_kw = 0, cap_kw = 0;
    while (!tok_is_op(cur(J), ")")) {
        if (n->args.n + n_kw > 0) {
            expect_op(J, ",");
            if (tok_is_op(cur(J), ")")) break;
        }
        if (tok_is_op(cur(J), "*") || tok_is_op(cur(J), "**"))
            jinja_fail(J, cur(J)->line, "unsupported: *args / **kwargs in calls");
        if (cur(J)->kind == TOK_NAME && tok_is_op(peek(J, 1), "=")) {
            const char *name = cur(J)->text;
            advance(J);
            advance(J);
            if (n_kw == cap_kw) {
                cap_kw = cap_kw ? cap_kw * 2 : 4;
                n->kw_names = jinja_realloc(J, n->kw_names, cap_kw * sizeof(char *));
            }
            n->kw_names[n_kw++] = name;
            nodes_push(J, &n->kw_values, parse_expression(J, true));
        } else {
            if (n_kw > 0) jinja_fail(J, cur(J)->line, "positional argument after keyword argument");
            nodes_push(J, &n->args, parse_expression(J, true));
        }
    }
    advance(J);
}

static Node *parse_filter(Jinja *J, Node *node) {
    int line = cur(J)->line;
    expect_op(J, "|");
    if (cur(J)->kind != TOK_NAME) unexpected(J, "a filter name");
    const char *name = cur(J)->text;
    advance(J);
    if (tok_is_op(cur(J), ".")) jinja_fail(J, line, "unsupported Jinja filter '%s.%s'", name, peek(J, 1)->text);
    int index = jinja_filter_index(name); /* unknown (-1): an error when evaluated */
    Node *n = node_new(J, NODE_FILTER, line);
    n->a = node;
    n->name = name;
    n->op = index;
    if (tok_is_op(cur(J), "(")) parse_call_args(J, n);
    return n;
}

static Node *parse_test(Jinja *J, Node *node) {
    int line = cur(J)->line;
    advance(J); /* 'is' */
    bool negated = skip_name(J, "not");
    if (cur(J)->kind != TOK_NAME) unexpected(J, "a test name");
    const char *name = cur(J)->text;
    advance(J);
    if (tok_is_op(cur(J), ".")) jinja_fail(J, line, "unsupported Jinja test '%s.%s'", name, peek(J, 1)->text);
    int index = jinja_test_index(name); /* unknown (-1): an error when evaluated */
    Node *n = node_new(J, NODE_TEST, line);
    n->a = node;
    n->name = name;
    n->op = index;
    Token *t = cur(J);
    if (tok_is_op(t, "(")) {
        parse_call_args(J, n);
    } else if ((t->kind == TOK_NAME || t->kind == TOK_STRING || t->kind == TOK_INT || t->kind == TOK_FLOAT ||
                tok_is_op(t, "[") || tok_is_op(t, "{")) &&
               !tok_is_name(t, "else") && !tok_is_name(t, "or") && !tok_is_name(t, "and")) {
        if (tok_is_name(t, "is")) jinja_fail(J, t->line, "you cannot chain multiple tests with 'is'");
        nodes_push(J, &n->args, parse_postfix(J, parse_primary(J)));
    }
    if (negated) {
        Node *not = node_new(J, NODE_NOT, line);
        not->a = n;
        return not;
    }
    return n;
}

static Node *parse_filter_expr(Jinja *J, Node *node) {
    for (;;) {
        if (tok_is_op(cur(J), "|")) node = parse_filter(J, node);
        else if (tok_is_name(cur(J), "is")) node = parse_test(J, node);
        else if (tok_is_op(cur(J), "(")) {
            Node *call = node_new(J, NODE_CALL, cur(J)->line);
            call->a = node;
            parse_call_args(J, call);
            node = call;
        } else return node;
    }
}

static Node *parse_subscript(Jinja *J, Node *node) {
    Token *t = cur(J);
    if (tok_is_op(t, ".")) {
        advance(J);
        Token *attr = cur(J);
        if (attr->kind == TOK_NAME) {
            advance(J);
            Node *n = node_new(J, NODE_GETATTR, t->line);
            n->a = node;
            n->name = attr->text;
            return n;
        }
        if (attr->kind == TOK_INT) {
            advance(J);
            Node *n = node_new(J, NODE_GETITEM, t->line);
            n->a = node;
            n->b = node_new(J, NODE_CONST, t->line);
            n->b->value = value_int(attr->i);
            return n;
        }
        unexpected(J, "an attribute name");
    }
    expect_op(J, "[");
    Node *index = parse_subscribed(J);
    if (tok_is_op(cur(J), ",")) { /* a[x, y] indexes with a tuple */
        Node *tuple = node_new(J, NODE_TUPLE, t->line);
        nodes_push(J, &tuple->args, index);
        while (skip_op(J, ",")) {
            if (tok_is_op(cur(J), "]")) break;
            nodes_push(J, &tuple->args, parse_subscribed(J));
        }
        for (size_t i = 0; i < tuple->args.n; i++)
            if (tuple->args.items[i]->kind == NODE_SLICE) jinja_fail(J, t->line, "unsupported: slices inside a tuple subscript");
        index = tuple;
    }
    expect_op(J, "]");
    if (index->kind == NODE_SLICE) {
        index->a = node;
        return index;
    }
    Node *n = node_new(J, NODE_GETITEM, t->line);
    n->a = node;
    n->b = index;
    return n;
}

/* An index, or a slice start:stop:step (returned as a SLICE node without its object). */
static Node *parse_subscribed(Jinja *J) {
    Token *t = cur(J);
    Node *parts[3] = {NULL, NULL, NULL};
    int part = 0;
    bool is_slice = false;
    for (;;) {
        if (tok_is_op(cur(J), ":")) {
            if (part >= 2) unexpected(J, "']'");
            advance(J);
            is_slice = true;
            part++;
            continue;
        }
        if (tok_is_op(cur(J), "]") || tok_is_op(cur(J), ",") || parts[part]) break;
        parts[part] = parse_expression(J, true);
    }
    if (!is_slice) {
        if (!parts[0]) unexpected(J, "an index");
        return parts[0];
    }
    Node *n = node_new(J, NODE_SLICE, t->line);
    n->b = parts[0];
    n->c = parts[1];
    n->d = parts[2];
    return n;
}

static Node *parse_postfix(Jinja *J, Node *node) {
    for (;;) {
        if (tok_is_op(cur(J), ".") || tok_is_op(cur(J), "[")) node = parse_subscript(J, node);
        else if (tok_is_op(cur(J), "(")) {
            Node *call = node_new(J, NODE_CALL, cur(J)->line);
            call->a = node;
            parse_call_args(J, call);
            node = call;
        } else return node;
    }
}

static Node *parse_primary(Jinja *J) {
    enter(J);
    Token *t = cur(J);
    Node *n;
    if (t->kind == TOK_NAME) {
        advance(J);
        n = node_new(J, NODE_CONST, t->line);
        if (!strcmp(t->text, "true") || !strcmp(t->text, "True")) n->value = value_bool(true);
        else if (!strcmp(t->text, "false") || !strcmp(t->text, "False")) n->value = value_bool(false);
        else if (!strcmp(t->text, "none") || !strcmp(t->text, "None")) n->value = value_none();
        else {
            n->kind = NODE_NAME;
            n->name = t->text;
        }
    } else if (t->kind == TOK_STRING) {
        Buf b = {0};
        while (cur(J)->kind == TOK_STRING) { /* adjacent literals concatenate */
            buf_put(J, &b, cur(J)->text, cur(J)->len);
            advance(J);
        }
        n = node_new(J, NODE_CONST, t->line);
        n->value = value_from_buf(J, &b);
    } else if (t->kind == TOK_INT || t->kind == TOK_FLOAT) {
        advance(J);
        n = node_new(J, NODE_CONST, t->line);
        n->value = t->kind == TOK_INT ? value_int(t->i) : value_float(t->f);
    } else if (tok_is_op(t, "(")) {
        advance(J);
        n = parse_tuple(J, false, true, NULL, true);
        expect_op(J, ")");
    } else if (tok_is_op(t, "[")) {
        advance(J);
        n = node_new(J, NODE_LIST, t->line);
        while (!tok_is_op(cur(J), "]")) {
            if (n->args.n) {
                expect_op(J, ",");
                if (tok_is_op(cur(J), "]")) break;
            }
            nodes_push(J, &n->args, parse_expression(J, true));
        }
        advance(J);
    } else if (tok_is_op(t, "{")) {
        advance(J);
        n = node_new(J, NODE_DICT, t->line);
        while (!tok_is_op(cur(J), "}")) {
            if (n->args.n) {
                expect_op(J, ",");
                if (tok_is_op(cur(J), "}")) break;
            }
            nodes_push(J, &n->args, parse_expression(J, true));
            expect_op(J, ":");
            nodes_push(J, &n->kw_values, parse_expression(J, true));
        }
        advance(J);
    } else {
        unexpected(J, "an expression");
    }
    leave(J);
    return n;
}

static Node *parse_unary(Jinja *J, bool with_filter) {
    enter(J);
    Token *t = cur(J);
    Node *node;
    if (tok_is_op(t, "-") || tok_is_op(t, "+")) {
        advance(J);
        node = node_new(J, t->text[0] == '-' ? NODE_NEG : NODE_POS, t->line);
        node->a = parse_unary(J, false);
    } else {
        node = parse_primary(J);
    }
    node = parse_postfix(J, node);
    if (with_filter) node = parse_filter_expr(J, node);
    leave(J);
    return node;
}

static Node *binop(Jinja *J, int op, Node *a, Node *b, int line) {
    Node *n = node_new(J, NODE_BINOP, line);
    n->op = op;
    n->a = a;
    n->b = b;
    return n;
}

static Node *parse_pow(Jinja *J) {
    Node *left = parse_unary(J, true);
    while (tok_is_op(cur(J), "**")) {
        int line = cur(J)->line;
        advance(J);
        left = binop(J, 'p', left, parse_unary(J, true), line);
    }
    return left;
}

static Node *parse_math2(Jinja *J) {
    Node *left = parse_pow(J);
    for (;;) {
        Token *t = cur(J);
        int op = tok_is_op(t, "*") ? '*' : tok_is_op(t, "/") ? '/' : tok_is_op(t, "//") ? 'f' : tok_is_op(t, "%") ? '%' : 0;
        if (!op) return left;
        advance(J);
        left = binop(J, op, left, parse_pow(J), t->line);
    }
}

static Node *parse_concat(Jinja *J) {
    Node *left = parse_math2(J);
    while (tok_is_op(cur(J), "~")) {
        int line = cur(J)->line;
        advance(J);
        left = binop(J, '~', left, parse_math2(J), line);
    }
    return left;
}

static Node *parse_math1(Jinja *J) {
    Node *left = parse_concat(J);
    for (;;) {
        Token *t = cur(J);
        int op = tok_is_op(t, "+") ? '+' : tok_is_op(t, "-") ? '-' : 0;
        if (!op) return left;
        advance(J);
        left = binop(J, op, left, parse_concat(J), t->line);
    }
}

/* Comparison operators are stored as: 'e' ==, 'n' !=, '<', '>', 'l' <=, 'g' >=, 'i' in, 'o' not in. */
static Node *parse_compare(Jinja *J) {
    int line = cur(J)->line;
    Node *first = parse_math1(J);
    Node *n = NULL;
    size_t cap = 0;
    for (;;) {
        Token *t = cur(J);
        int op = tok_is_op(t, "==") ? 'e' : tok_is_op(t, "!=") ? 'n' : tok_is_op(t, "<") ? '<' : tok_is_op(t, ">") ? '>'
               : tok_is_op(t, "<=") ? 'l' : tok_is_op(t, ">=") ? 'g' : 0;
        if (op) advance(J);
        else if (tok_is_name(t, "in")) { op = 'i'; advance(J); }
        else if (tok_is_name(t, "not") && tok_is_name(peek(J, 1), "in")) { op = 'o'; advance(J); advance(J); }
        else break;
        if (!n) {
            n = node_new(J, NODE_COMPARE, line);
            n->a = first;
        }
        if (n->args.n == cap) {
            cap = cap ? cap * 2 : 2;
            n->ops = jinja_realloc(J, n->ops, cap * sizeof(int));
        }
        n->ops[n->args.n] = op;
        nodes_push(J, &n->args, parse_math1(J));
    }
    return n ? n : first;
}

static Node *parse_not(Jinja *J) {
    if (tok_is_name(cur(J), "not")) {
        enter(J);
        Node *n = node_new(J, NODE_NOT, cur(J)->line);
        advance(J);
        n->a = parse_not(J);
        leave(J);
        return n;
    }
    return parse_compare(J);
}

static Node *parse_and(Jinja *J) {
    Node *left = parse_not(J);
    while (tok_is_name(cur(J), "and")) {
        Node *n = node_new(J, NODE_AND, cur(J)->line);
        advance(J);
        n->a = left;
        n->b = parse_not(J);
        left = n;
    }
    return left;
}

static Node *parse_or(Jinja *J) {
    Node *left = parse_and(J);
    while (tok_is_name(cur(J), "or")) {
        Node *n = node_new(J, NODE_OR, cur(J)->line);
        advance(J);
        n->a = left;
        n->b = parse_and(J);
        left = n;
    }
    return left;
}

static Node *parse_condexpr(Jinja *J) {
    Node *expr = parse_or(J);
    while (tok_is_name(cur(J), "if")) {
        enter(J);
        Node *n = node_new(J, NODE_CONDEXPR, cur(J)->line);
        advance(J);
        n->b = expr;
        n->a = parse_or(J);
        if (skip_name(J, "else")) n->c = parse_condexpr(J);
        expr = n;
        leave(J);
    }
    return expr;
}

static Node *parse_expression(Jinja *J, bool with_condexpr) {
    enter(J);
    Node *n = with_condexpr ? parse_condexpr(J) : parse_or(J);
    leave(J);
    return n;
}

static bool is_tuple_end(Jinja *J, const char *extra_end) {
    Token *t = cur(J);
    return t->kind == TOK_VAR_END || t->kind == TOK_BLOCK_END || tok_is_op(t, ")") || t->kind == TOK_EOF ||
           (extra_end && tok_is_name(t, extra_end));
}

static Node *parse_tuple(Jinja *J, bool simplified, bool with_condexpr, const char *extra_end, bool explicit_parens) {
    int line = cur(J)->line;
    Node *tuple = node_new(J, NODE_TUPLE, line);
    bool is_tuple = false;
    for (;;) {
        if (tuple->args.n) expect_op(J, ",");
        if (is_tuple_end(J, extra_end)) break;
        nodes_push(J, &tuple->args, simplified ? parse_primary(J) : parse_expression(J, with_condexpr));
        if (tok_is_op(cur(J), ",")) is_tuple = true;
        else break;
    }
    if (!is_tuple) {
        if (tuple->args.n) return tuple->args.items[0];
        if (!explicit_parens) unexpected(J, "an expression");
    }
    return tuple;
}

/* ---------------------------------------------------------------- statements */

static void check_target(Jinja *J, Node *t) {
    if (t->kind == NODE_NAME) return;
    if (t->kind == NODE_TUPLE) {
        for (size_t i = 0; i < t->args.n; i++)
            if (t->args.items[i]->kind != NODE_NAME) jinja_fail(J, t->line, "can't assign to this expression");
        return;
    }
    jinja_fail(J, t->line, "can't assign to this expression");
}

static Node *parse_assign_target(Jinja *J, const char *extra_end, bool with_namespace) {
    Token *t = cur(J);
    if (with_namespace && t->kind == TOK_NAME && tok_is_op(peek(J, 1), ".") && peek(J, 2)->kind == TOK_NAME) {
        Node *n = node_new(J, NODE_GETATTR, t->line);
        n->a = node_new(J, NODE_NAME, t->line);
        n->a->name = t->text;
        n->name = peek(J, 2)->text;
        advance(J);
        advance(J);
        advance(J);
        return n;
    }
    if (t->kind == TOK_NAME && !tok_is_op(peek(J, 1), ",")) {
        advance(J);
        Node *n = node_new(J, NODE_NAME, t->line);
        n->name = t->text;
        return n;
    }
    Node *target = parse_tuple(J, true, false, extra_end, false);
    check_target(J, target);
    return target;
}

static NodeList parse_body(Jinja *J, const char *const *end_tags, const char *opener, int open_line);

static void expect_block_end(Jinja *J) {
    if (cur(J)->kind != TOK_BLOCK_END) unexpected(J, "end of statement block '%}'");
    advance(J);
}

static Node *parse_statement(Jinja *J) {
    Token *t = cur(J);
    int line = t->line;
    if (t->kind != TOK_NAME) unexpected(J, "a statement name");
    const char *keyword = t->text;
    enter(J);
    Node *n;
    if (!strcmp(keyword, "if")) {
        advance(J);
        n = node_new(J, NODE_IF, line);
        Node *node = n;
        for (;;) {
            node->a = parse_tuple(J, false, false, NULL, false);
            expect_block_end(J);
            static const char *const ends[] = {"elif", "else", "endif", NULL};
            node->body = parse_body(J, ends, "if", line);
            if (skip_name(J, "elif")) {
                Node *next = node_new(J, NODE_IF, cur(J)->line);
                nodes_push(J, &node->else_body, next);
                node = next;
                continue;
            }
            if (skip_name(J, "else")) {
                expect_block_end(J);
                static const char *const end_if[] = {"endif", NULL};
                node->else_body = parse_body(J, end_if, "if", line);
            }
            advance(J); /* endif */
            break;
        }
    } else if (!strcmp(keyword, "for")) {
        advance(J);
        n = node_new(J, NODE_FOR, line);
        n->a = parse_assign_target(J, "in", false);
        if (!skip_name(J, "in")) unexpected(J, "'in'");
        n->b = parse_tuple(J, false, false, "recursive", false);
        if (skip_name(J, "if")) n->c = parse_expression(J, true);
        if (tok_is_name(cur(J), "recursive")) jinja_fail(J, line, "unsupported: recursive for-loops");
        expect_block_end(J);
        static const char *const ends[] = {"endfor", "else", NULL};
        J->loop_depth++;
        n->body = parse_body(J, ends, "for", line);
        J->loop_depth--;
        if (skip_name(J, "else")) {
            expect_block_end(J);
            static const char *const end_for[] = {"endfor", NULL};
            n->else_body = parse_body(J, end_for, "for", line);
        }
        advance(J); /* endfor */
    } else if (!strcmp(keyword, "set")) {
        advance(J);
        n = node_new(J, NODE_SET, line);
        n->a = parse_assign_target(J, NULL, true);
        if (!skip_op(J, "=")) jinja_fail(J, line, "unsupported: block set ('{%% set %s %%}...{%% endset %%}')", n->a->name ? n->a->name : "...");
        n->b = parse_tuple(J, false, true, NULL, false);
    } else if (!strcmp(keyword, "macro")) {
        advance(J);
        n = node_new(J, NODE_MACRO, line);
        if (cur(J)->kind != TOK_NAME) unexpected(J, "a macro name");
        n->name = cur(J)->text;
        advance(J);
        expect_op(J, "(");
        size_t cap = 0;
        while (!tok_is_op(cur(J), ")")) {
            if (n->kw_values.n) expect_op(J, ",");
            if (cur(J)->kind != TOK_NAME) unexpected(J, "a parameter name");
            if (n->kw_values.n == cap) {
                cap = cap ? cap * 2 : 4;
                n->kw_names = jinja_realloc(J, n->kw_names, cap * sizeof(char *));
            }
            n->kw_names[n->kw_values.n] = cur(J)->text;
            advance(J);
            Node *def = NULL;
            if (skip_op(J, "=")) def = parse_expression(J, true);
            else if (n->kw_values.n && n->kw_values.items[n->kw_values.n - 1])
                jinja_fail(J, line, "non-default argument follows default argument");
            nodes_push(J, &n->kw_values, def);
        }
        advance(J);
        expect_block_end(J);
        static const char *const ends[] = {"endmacro", NULL};
        int saved = J->loop_depth;
        J->loop_depth = 0;
        n->body = parse_body(J, ends, "macro", line);
        J->loop_depth = saved;
        advance(J);
    } else if (!strcmp(keyword, "break") || !strcmp(keyword, "continue")) {
        if (J->loop_depth == 0) jinja_fail(J, line, "'%s' outside of a for-loop", keyword);
        advance(J);
        n = node_new(J, keyword[0] == 'b' ? NODE_BREAK : NODE_CONTINUE, line);
    } else if (!strcmp(keyword, "generation")) {
        advance(J);
        n = node_new(J, NODE_BLOCK, line);
        expect_block_end(J);
        static const char *const ends[] = {"endgeneration", NULL};
        n->body = parse_body(J, ends, "generation", line);
        advance(J);
    } else {
        jinja_fail(J, line, "unsupported Jinja statement '%s'", keyword);
    }
    expect_block_end(J);
    leave(J);
    return n;
}

/* Parses nodes until a block tag whose name is in end_tags (left current,
 * after its '{%'), or the end of the template when end_tags is NULL. */
static NodeList parse_body(Jinja *J, const char *const *end_tags, const char *opener, int open_line) {
    NodeList body = {0};
    for (;;) {
        Token *t = cur(J);
        switch (t->kind) {
        case TOK_EOF:
            if (end_tags) {
                const char *want = end_tags[0];
                for (const char *const *e = end_tags; *e; e++)
                    if (!strncmp(*e, "end", 3)) want = *e;
                jinja_fail(J, open_line, "unclosed '{%% %s %%}': the template ends before its '{%% %s %%}'", opener, want);
            }
            return body;
        case TOK_TEXT: {
            Node *n = node_new(J, NODE_TEXT, t->line);
            n->value = value_string(J, t->text, t->len);
            nodes_push(J, &body, n);
            advance(J);
            break;
        }
        case TOK_VAR_BEGIN: {
            advance(J);
            Node *n = node_new(J, NODE_PRINT, t->line);
            n->a = parse_tuple(J, false, true, NULL, false);
            if (cur(J)->kind != TOK_VAR_END) unexpected(J, "end of print statement '}}'");
            advance(J);
            nodes_push(J, &body, n);
            break;
        }
        case TOK_BLOCK_BEGIN: {
            advance(J);
            if (end_tags && cur(J)->kind == TOK_NAME)
                for (const char *const *e = end_tags; *e; e++)
                    if (tok_is_name(cur(J), *e)) return body;
            Token *name = cur(J);
            if (name->kind == TOK_NAME && (!strncmp(name->text, "end", 3) || !strcmp(name->text, "elif") || !strcmp(name->text, "else")))
                jinja_fail(J, name->line, "unexpected '{%% %s %%}'%s", name->text, opener ? "" : " with no open block");
            nodes_push(J, &body, parse_statement(J));
            break;
        }
        default: unexpected(J, "template text or a tag");
        }
    }
}

static void check_filters(Jinja *J, Node *n, bool soft);

static void check_list(Jinja *J, const NodeList *l, bool soft) {
    for (size_t i = 0; i < l->n; i++)
        if (l->items[i]) check_filters(J, l->items[i], soft);
}

/* jinja2 rejects an unknown filter or test when it compiles the template,
 * except inside an if-statement or a conditional expression ("soft frames"),
 * where it fails only if evaluated; for-loop and macro bodies are hard again. */
static void check_filters(Jinja *J, Node *n, bool soft) {
    if ((n->kind == NODE_FILTER || n->kind == NODE_TEST) && n->op < 0 && !soft)
        jinja_fail(J, n->line, "unsupported Jinja %s '%s'", n->kind == NODE_FILTER ? "filter" : "test", n->name);
    bool inner = soft || n->kind == NODE_IF || n->kind == NODE_CONDEXPR;
    if (n->kind == NODE_FOR) {
        check_filters(J, n->b, soft);
        if (n->c) check_filters(J, n->c, false);
        check_list(J, &n->body, false);
        check_list(J, &n->else_body, false);
        return;
    }
    if (n->kind == NODE_MACRO) {
        check_list(J, &n->kw_values, soft);
        check_list(J, &n->body, false);
        return;
    }
    Node *children[] = {n->a, n->b, n->c, n->d};
    for (size_t i = 0; i < 4; i++)
        if (children[i]) check_filters(J, children[i], inner);
    check_list(J, &n->args, inner);
    check_list(J, &n->kw_values, inner);
    check_list(J, &n->body, inner);
    check_list(J, &n->else_body, inner);
}

NodeList jinja_parse(Jinja *J) {
    J->pos = 0;
    J->depth = 0;
    NodeList body = parse_body(J, NULL, NULL, 0);
    check_list(J, &body, false);
    return body;
}
