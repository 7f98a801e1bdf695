/* jinja_eval.c — tree-walking evaluator for the Jinja subset, with jinja2 3.1's
 * semantics under transformers' ImmutableSandboxedEnvironment: Python
 * arithmetic, comparison and truthiness; default Undefined (falsy, renders "",
 * iterates as empty, but reading an attribute or item of it, calling it or doing
 * arithmetic on it is an error); for-loops with a fresh scope per iteration and
 * the loop object; namespace(); macros. Filters, tests and methods are those of
 * the tables below; any other is an error naming it. Not supported: filters
 * and methods that mutate (the sandbox forbids them anyway), string '%'
 * formatting, str.format, recursive loops, call blocks. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <utf8proc.h>

#include "tokenizer/jinja.h"

enum { FLOW_NORMAL, FLOW_BREAK, FLOW_CONTINUE };

static Value eval(Jinja *J, Node *n, Scope *s);
static int exec_body(Jinja *J, const NodeList *body, Scope *s);
static bool call_test(Jinja *J, Node *n, int test, Value v, Value *args, size_t n_args);

static void step(Jinja *J, int line) {
    if (++J->steps > JINJA_STEP_LIMIT) jinja_fail(J, line, "rendering takes more than %ld steps", JINJA_STEP_LIMIT);
}

/* ---------------------------------------------------------------- helpers */

static Str *soft_str(Jinja *J, Value v, int line) {
    if (v.kind == VAL_STRING) return v.as.s;
    Buf b = {0};
    value_str(J, &b, v, line);
    return value_from_buf(J, &b).as.s;
}

static Value make_str(Jinja *J, const Buf *b) { return value_from_buf(J, b); }

/* Items a for-loop (or filter) visits: a list's items, a dict's keys, a
 * string's characters; none for Undefined. */
static List *iterate(Jinja *J, Value v, int line) {
    switch (v.kind) {
    case VAL_LIST:
        if (v.as.list->kind == LIST_GENERATOR) {
            if (v.as.list->consumed)
                jinja_fail(J, line, "unsupported: a generator (the result of select, map, items, ...) used twice; add '| list'");
            v.as.list->consumed = true;
        }
        return v.as.list;
    case VAL_UNDEFINED: return list_new(J, false);
    case VAL_DICT:
        if (v.as.dict->kind == DICT_PLAIN) {
            List *l = list_new(J, false);
            for (size_t i = 0; i < v.as.dict->n; i++) list_push(J, l, v.as.dict->keys[i]);
            return l;
        }
        break;
    case VAL_STRING: {
        List *l = list_new(J, false);
        const Str *s = v.as.s;
        for (size_t i = 0; i < s->len;) {
            int32_t cp;
            size_t n = utf8_next(s->data, s->len, i, &cp);
            list_push(J, l, value_string(J, s->data + i, n));
            i += n;
        }
        return l;
    }
    default: break;
    }
    jinja_fail(J, line, "'%s' object is not iterable", value_type_name(v));
}

static bool is_intlike(Value v) { return v.kind == VAL_INT || v.kind == VAL_BOOL; }
static int64_t as_int(Value v) { return v.kind == VAL_INT ? v.as.i : (int64_t)v.as.b; }
static bool is_number(Value v) { return v.kind == VAL_INT || v.kind == VAL_BOOL || v.kind == VAL_FLOAT; }
static double as_double(Value v) { return v.kind == VAL_FLOAT ? v.as.f : (double)as_int(v); }

/* Byte offsets of each code point of s, plus s->len at the end. */
static size_t *codepoint_offsets(Jinja *J, const Str *s, size_t *count) {
    size_t n = utf8_count(s->data, s->len);
    size_t *off = jinja_alloc(J, (n + 1) * sizeof(size_t));
    size_t k = 0;
    for (size_t i = 0; i < s->len; k++) {
        int32_t cp;
        off[k] = i;
        i += utf8_next(s->data, s->len, i, &cp);
    }
    off[n] = s->len;
    *count = n;
    return off;
}

/* ---------------------------------------------------------------- attributes and items */

static const char *const STR_METHODS[] = {"strip", "lstrip", "rstrip", "startswith", "endswith", "split", "rsplit",
                                          "upper", "lower", "title", "capitalize", "replace", "find", "rfind",
                                          "count", "join", NULL};
static const char *const STR_UNSUPPORTED[] = {
    "format", "format_map", "encode", "center", "ljust", "rjust", "zfill", "partition", "rpartition", "splitlines",
    "expandtabs", "index", "rindex", "isdigit", "isalpha", "isalnum", "isspace", "islower", "isupper", "istitle",
    "isnumeric", "isdecimal", "isidentifier", "isprintable", "isascii", "swapcase", "casefold", "removeprefix",
    "removesuffix", "translate", "maketrans", NULL};
static const char *const DICT_METHODS[] = {"items", "keys", "values", "get", NULL};
static const char *const DICT_UNSUPPORTED[] = {"pop", "popitem", "update", "setdefault", "clear", "copy", "fromkeys", NULL};
static const char *const LIST_UNSUPPORTED[] = {"append", "extend", "insert", "remove", "pop", "clear", "index",
                                               "count", "sort", "reverse", "copy", NULL};

static bool in_names(const char *const *names, const char *name) {
    for (; *names; names++)
        if (!strcmp(*names, name)) return true;
    return false;
}

static Value bound_method(Jinja *J, Value self, const char *name) {
    Method *m = jinja_alloc(J, sizeof(Method));
    m->self = self;
    m->name = name;
    return (Value){.kind = VAL_METHOD, .as.method = m};
}

/* jinja2's environment.getattr: an attribute (method) first, then an item. */
static Value get_attr(Jinja *J, Value obj, const char *name, int line) {
    Value out;
    switch (obj.kind) {
    case VAL_UNDEFINED: jinja_fail(J, line, "cannot read attribute '%s' of an undefined value", name);
    case VAL_DICT: {
        const Dict *d = obj.as.dict;
        if (d->kind == DICT_PLAIN) {
            if (in_names(DICT_METHODS, name)) return bound_method(J, obj, name);
            if (in_names(DICT_UNSUPPORTED, name)) jinja_fail(J, line, "unsupported Jinja method 'dict.%s'", name);
        } else if (d->kind == DICT_LOOP && !strcmp(name, "cycle")) {
            return bound_method(J, obj, name);
        }
        return dict_get_cstr(d, name, &out) ? out : value_undefined();
    }
    case VAL_STRING:
        if (in_names(STR_METHODS, name)) return bound_method(J, obj, name);
        if (in_names(STR_UNSUPPORTED, name)) jinja_fail(J, line, "unsupported Jinja method 'str.%s'", name);
        return value_undefined();
    case VAL_LIST:
        if (in_names(LIST_UNSUPPORTED, name)) jinja_fail(J, line, "unsupported Jinja method 'list.%s'", name);
        return value_undefined();
    default: return value_undefined();
    }
}

static Value get_item(Jinja *J, Value obj, Value key, int line) {
    switch (obj.kind) {
    case VAL_UNDEFINED: jinja_fail(J, line, "cannot read an item of an undefined value");
    case VAL_LIST:
        if (obj.as.list->kind == LIST_GENERATOR || obj.as.list->kind == LIST_VIEW) return value_undefined();
        if (is_intlike(key)) {
            int64_t i = as_int(key), n = (int64_t)obj.as.list->n;
            if (i < 0) i += n;
            return i >= 0 && i < n ? obj.as.list->items[i] : value_undefined();
        }
        break;
    case VAL_STRING:
        if (is_intlike(key)) {
            size_t n;
            size_t *off = codepoint_offsets(J, obj.as.s, &n);
            int64_t i = as_int(key);
            if (i < 0) i += (int64_t)n;
            if (i < 0 || i >= (int64_t)n) return value_undefined();
            return value_string(J, obj.as.s->data + off[i], off[i + 1] - off[i]);
        }
        break;
    case VAL_DICT:
        if (obj.as.dict->kind == DICT_PLAIN) {
            Value out;
            if (dict_get(obj.as.dict, key, &out)) return out;
        }
        break;
    default: break;
    }
    if (key.kind == VAL_STRING) return get_attr(J, obj, key.as.s->data, line);
    return value_undefined();
}

/* Slices compile to a plain Python subscript in jinja2 (no Undefined fallback). */
static int64_t slice_bound(Jinja *J, Value v, int line) {
    if (!is_intlike(v)) jinja_fail(J, line, "slice indices must be integers or None, not %s", value_type_name(v));
    return as_int(v);
}

static Value get_slice(Jinja *J, Value obj, Value start_v, Value stop_v, Value step_v, int line) {
    if (obj.kind == VAL_UNDEFINED) jinja_fail(J, line, "cannot slice an undefined value");
    if ((obj.kind != VAL_LIST && obj.kind != VAL_STRING) ||
        (obj.kind == VAL_LIST && (obj.as.list->kind == LIST_GENERATOR || obj.as.list->kind == LIST_VIEW)))
        jinja_fail(J, line, "'%s' object is not subscriptable with a slice", value_type_name(obj));
    int64_t step = step_v.kind == VAL_NONE ? 1 : slice_bound(J, step_v, line);
    if (step == 0) jinja_fail(J, line, "slice step cannot be zero");
    size_t n_cp = 0, *off = NULL;
    int64_t len;
    if (obj.kind == VAL_LIST) len = (int64_t)obj.as.list->n;
    else {
        off = codepoint_offsets(J, obj.as.s, &n_cp);
        len = (int64_t)n_cp;
    }
    int64_t lower = step > 0 ? 0 : -1, upper = step > 0 ? len : len - 1, start, stop;
    if (start_v.kind == VAL_NONE) start = step < 0 ? upper : lower;
    else {
        start = slice_bound(J, start_v, line);
        if (start < 0) { start += len; if (start < lower) start = lower; }
        else if (start > upper) start = upper;
    }
    if (stop_v.kind == VAL_NONE) stop = step < 0 ? lower : upper;
    else {
        stop = slice_bound(J, stop_v, line);
        if (stop < 0) { stop += len; if (stop < lower) stop = lower; }
        else if (stop > upper) stop = upper;
    }
    if (obj.kind == VAL_LIST) {
        List *l = list_new(J, obj.as.list->tuple);
        for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) list_push(J, l, obj.as.list->items[i]);
        return list_value(l, obj.as.list->kind);
    }
    Buf b = {0};
    for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step)
        buf_put(J, &b, obj.as.s->data + off[i], off[i + 1] - off[i]);
    return make_str(J, &b);
}

/* ---------------------------------------------------------------- operators */

static _Noreturn void type_error(Jinja *J, int line, const char *op, Value a, Value b) {
    if (a.kind == VAL_UNDEFINED || b.kind == VAL_UNDEFINED)
        jinja_fail(J, line, "undefined value used with '%s'", op);
    jinja_fail(J, line, "unsupported operand types for %s: '%s' and '%s'", op, value_type_name(a), value_type_name(b));
}

static Value repeat(Jinja *J, Value seq, int64_t times) {
    if (seq.kind == VAL_STRING) {
        Buf b = {0};
        for (int64_t i = 0; i < times; i++) buf_put(J, &b, seq.as.s->data, seq.as.s->len);
        return make_str(J, &b);
    }
    List *l = list_new(J, seq.as.list->tuple);
    for (int64_t i = 0; i < times && seq.as.list->n; i++)
        for (size_t k = 0; k < seq.as.list->n; k++) list_push(J, l, seq.as.list->items[k]);
    return (Value){.kind = VAL_LIST, .as.list = l};
}

static Value arith(Jinja *J, int op, Value a, Value b, int line) {
    static const char *const names[128] = {['+'] = "+", ['-'] = "-", ['*'] = "*", ['/'] = "/", ['f'] = "//", ['%'] = "%", ['p'] = "**"};
    const char *name = names[op & 127] ? names[op & 127] : "?";
    if (op == '~') {
        Buf buf = {0};
        value_str(J, &buf, a, line);
        value_str(J, &buf, b, line);
        return make_str(J, &buf);
    }
    if (is_number(a) && is_number(b)) {
        if (is_intlike(a) && is_intlike(b) && op != '/') {
            int64_t x = as_int(a), y = as_int(b), r;
            switch (op) {
            case '+': if (__builtin_add_overflow(x, y, &r)) goto overflow; return value_int(r);
            case '-': if (__builtin_sub_overflow(x, y, &r)) goto overflow; return value_int(r);
            case '*': if (__builtin_mul_overflow(x, y, &r)) goto overflow; return value_int(r);
            case 'f': case '%': {
                if (y == 0) jinja_fail(J, line, "integer division or modulo by zero");
                if (x == INT64_MIN && y == -1) goto overflow;
                int64_t q = x / y, m = x % y;
                if (m != 0 && ((m < 0) != (y < 0))) { q--; m += y; }
                return value_int(op == 'f' ? q : m);
            }
            case 'p': {
                if (y < 0) {
                    if (x == 0) jinja_fail(J, line, "0.0 cannot be raised to a negative power");
                    return value_float(pow((double)x, (double)y));
                }
                int64_t result = 1;
                for (int64_t i = 0; i < y; i++) {
                    if (__builtin_mul_overflow(result, x, &result)) goto overflow;
                    if (result == 0 || result == 1) break;
                    if (result == -1) { result = (y - i - 1) % 2 ? -result : result; break; }
                }
                return value_int(result);
            }
            }
        }
        double x = as_double(a), y = as_double(b);
        switch (op) {
        case '+': return value_float(x + y);
        case '-': return value_float(x - y);
        case '*': return value_float(x * y);
        case '/': if (y == 0) jinja_fail(J, line, "division by zero"); return value_float(x / y);
        case 'f': if (y == 0) jinja_fail(J, line, "float floor division by zero"); return value_float(floor(x / y));
        case '%': {
            if (y == 0) jinja_fail(J, line, "float modulo by zero");
            double m = fmod(x, y);
            if (m != 0 && ((m < 0) != (y < 0))) m += y;
            return value_float(m);
        }
        case 'p':
            if (x == 0 && y < 0) jinja_fail(J, line, "0.0 cannot be raised to a negative power");
            if (x < 0 && y != floor(y)) jinja_fail(J, line, "unsupported: complex result of '**'");
            double r = pow(x, y);
            if (isinf(r) && isfinite(x) && isfinite(y)) jinja_fail(J, line, "numerical result out of range in '**'");
            return value_float(r);
        }
    }
    if (op == '+' && a.kind == VAL_STRING && b.kind == VAL_STRING) {
        Buf buf = {0};
        buf_put(J, &buf, a.as.s->data, a.as.s->len);
        buf_put(J, &buf, b.as.s->data, b.as.s->len);
        return make_str(J, &buf);
    }
    if (op == '+' && a.kind == VAL_LIST && b.kind == VAL_LIST && a.as.list->tuple == b.as.list->tuple &&
        a.as.list->kind == LIST_PLAIN && b.as.list->kind == LIST_PLAIN) {
        List *l = list_new(J, a.as.list->tuple);
        for (size_t i = 0; i < a.as.list->n; i++) list_push(J, l, a.as.list->items[i]);
        for (size_t i = 0; i < b.as.list->n; i++) list_push(J, l, b.as.list->items[i]);
        return (Value){.kind = VAL_LIST, .as.list = l};
    }
    bool a_seq = a.kind == VAL_STRING || (a.kind == VAL_LIST && a.as.list->kind == LIST_PLAIN);
    bool b_seq = b.kind == VAL_STRING || (b.kind == VAL_LIST && b.as.list->kind == LIST_PLAIN);
    if (op == '*' && a_seq && is_intlike(b)) return repeat(J, a, as_int(b));
    if (op == '*' && b_seq && is_intlike(a)) return repeat(J, b, as_int(a));
    if (op == '%' && a.kind == VAL_STRING) jinja_fail(J, line, "unsupported: '%%' string formatting");
    type_error(J, line, name, a, b);
overflow:
    jinja_fail(J, line, "unsupported: integer overflow beyond 64 bits in '%s'", name);
}

static bool less_than(Jinja *J, Value a, Value b, const char *op, int line) {
    if (is_number(a) && is_number(b)) {
        if (is_intlike(a) && is_intlike(b)) return as_int(a) < as_int(b);
        return as_double(a) < as_double(b);
    }
    if (a.kind == VAL_STRING && b.kind == VAL_STRING) {
        size_t n = a.as.s->len < b.as.s->len ? a.as.s->len : b.as.s->len;
        int c = memcmp(a.as.s->data, b.as.s->data, n);
        return c ? c < 0 : a.as.s->len < b.as.s->len;
    }
    if (a.kind == VAL_LIST && b.kind == VAL_LIST && a.as.list->tuple == b.as.list->tuple &&
        a.as.list->kind == LIST_PLAIN && b.as.list->kind == LIST_PLAIN) {
        const List *x = a.as.list, *y = b.as.list;
        for (size_t i = 0; i < x->n && i < y->n; i++) {
            if (!value_equal(x->items[i], y->items[i])) return less_than(J, x->items[i], y->items[i], op, line);
        }
        return x->n < y->n;
    }
    jinja_fail(J, line, "'%s' not supported between instances of '%s' and '%s'", op, value_type_name(a), value_type_name(b));
}

static bool contains(Jinja *J, Value container, Value item, int line) {
    switch (container.kind) {
    case VAL_STRING:
        if (item.kind != VAL_STRING)
            jinja_fail(J, line, "'in <string>' requires string as left operand, not %s", value_type_name(item));
        if (item.as.s->len == 0) return true;
        return memmem(container.as.s->data, container.as.s->len, item.as.s->data, item.as.s->len) != NULL;
    case VAL_LIST: {
        List *l = iterate(J, container, line);
        for (size_t i = 0; i < l->n; i++)
            if (value_equal(l->items[i], item)) return true;
        return false;
    }
    case VAL_DICT: {
        Value out;
        if (container.as.dict->kind == DICT_PLAIN) return dict_get(container.as.dict, item, &out);
        break;
    }
    case VAL_UNDEFINED: return false;
    default: break;
    }
    jinja_fail(J, line, "argument of type '%s' is not iterable", value_type_name(container));
}

static bool compare(Jinja *J, int op, Value a, Value b, int line) {
    if ((op == 'e' || op == 'n') && ((a.kind == VAL_LIST && a.as.list->kind == LIST_VIEW) || (b.kind == VAL_LIST && b.as.list->kind == LIST_VIEW)))
        jinja_fail(J, line, "unsupported: comparing a dict view");
    switch (op) {
    case 'e': return value_equal(a, b);
    case 'n': return !value_equal(a, b);
    case '<': return less_than(J, a, b, "<", line);
    case '>': return less_than(J, b, a, ">", line);
    case 'l':
        if (is_number(a) && is_number(b) && !(is_intlike(a) && is_intlike(b))) return as_double(a) <= as_double(b);
        return !less_than(J, b, a, "<=", line);
    case 'g':
        if (is_number(a) && is_number(b) && !(is_intlike(a) && is_intlike(b))) return as_double(a) >= as_double(b);
        return !less_than(J, a, b, ">=", line);
    case 'i': return contains(J, b, a, line);
    case 'o': return !contains(J, b, a, line);
    }
    return false;
}

/* ---------------------------------------------------------------- strings */

static bool cp_in(int32_t cp, const Str *chars) {
    for (size_t i = 0; i < chars->len;) {
        int32_t c;
        i += utf8_next(chars->data, chars->len, i, &c);
        if (c == cp) return true;
    }
    return false;
}

/* Python str.strip/lstrip/rstrip; chars NULL strips whitespace. */
static Value strip(Jinja *J, const Str *s, const Str *chars, bool left, bool right) {
    const char *begin = s->data, *end = s->data + s->len;
    if (left) {
        while (begin < end) {
            int32_t cp;
            size_t n = utf8_next(begin, (size_t)(end - begin), 0, &cp);
            bool strip_it = chars ? cp_in(cp, chars) : space_at(begin, end) > 0;
            if (!strip_it) break;
            begin += n;
        }
    }
    if (right) {
        while (end > begin) {
            const char *p = end - 1;
            while (p > begin && ((unsigned char)*p & 0xc0) == 0x80 && end - p < 4) p--;
            int32_t cp;
            size_t n = utf8_next(p, (size_t)(end - p), 0, &cp);
            if (p + n != end) { p = end - 1; cp = (unsigned char)*p; }
            bool strip_it = chars ? cp_in(cp, chars) : space_before(begin, end) > 0;
            if (!strip_it) break;
            end = chars ? p : end - space_before(begin, end);
        }
    }
    return value_string(J, begin, (size_t)(end - begin));
}

static Value change_case(Jinja *J, const Str *s, int mode /* 'u' upper, 'l' lower, 't' title, 'c' capitalize */) {
    Buf b = {0};
    bool previous_cased = false, first = true;
    for (size_t i = 0; i < s->len;) {
        int32_t cp;
        size_t n = utf8_next(s->data, s->len, i, &cp);
        int32_t out = cp;
        if (n == 1 && (unsigned char)s->data[i] >= 0x80) {
            buf_put(J, &b, s->data + i, 1); /* invalid byte: keep */
            i++;
            first = false;
            continue;
        }
        bool upper;
        if (mode == 'u') upper = true;
        else if (mode == 'l') upper = false;
        else if (mode == 'c') upper = first;
        else upper = !previous_cased;
        if (upper && cp == 0xdf) { /* Python's full case mapping: sharp s upper-cases to "SS" */
            buf_puts(J, &b, mode == 'u' ? "SS" : "Ss");
            previous_cased = true;
            first = false;
            i += n;
            continue;
        }
        out = upper ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
        if (mode == 't') {
            const utf8proc_property_t *p = utf8proc_get_property(cp);
            previous_cased = p->category == UTF8PROC_CATEGORY_LU || p->category == UTF8PROC_CATEGORY_LL ||
                             p->category == UTF8PROC_CATEGORY_LT;
        }
        utf8_put(J, &b, out);
        first = false;
        i += n;
    }
    return make_str(J, &b);
}

static Value str_replace(Jinja *J, const Str *s, const Str *old, const Str *new, int64_t count) {
    Buf b = {0};
    if (old->len == 0) {
        size_t done = 0;
        for (size_t i = 0;; done++) {
            if (count >= 0 && (int64_t)done >= count) {
                buf_put(J, &b, s->data + i, s->len - i);
                break;
            }
            buf_put(J, &b, new->data, new->len);
            if (i >= s->len) break;
            int32_t cp;
            size_t n = utf8_next(s->data, s->len, i, &cp);
            buf_put(J, &b, s->data + i, n);
            i += n;
        }
        return make_str(J, &b);
    }
    size_t i = 0;
    for (int64_t done = 0; count < 0 || done < count; done++) {
        const char *hit = memmem(s->data + i, s->len - i, old->data, old->len);
        if (!hit) break;
        buf_put(J, &b, s->data + i, (size_t)(hit - (s->data + i)));
        buf_put(J, &b, new->data, new->len);
        i = (size_t)(hit - s->data) + old->len;
    }
    buf_put(J, &b, s->data + i, s->len - i);
    return make_str(J, &b);
}

/* Python str.split / str.rsplit. */
static Value str_split(Jinja *J, const Str *s, const Str *sep, int64_t maxsplit, bool from_right, int line) {
    List *l = list_new(J, false);
    Value result = {.kind = VAL_LIST, .as.list = l};
    const char *begin = s->data, *end = s->data + s->len;
    if (sep) {
        if (sep->len == 0) jinja_fail(J, line, "split: empty separator");
        if (!from_right) {
            const char *p = begin;
            for (int64_t done = 0; maxsplit < 0 || done < maxsplit; done++) {
                const char *hit = memmem(p, (size_t)(end - p), sep->data, sep->len);
                if (!hit) break;
                list_push(J, l, value_string(J, p, (size_t)(hit - p)));
                p = hit + sep->len;
            }
            list_push(J, l, value_string(J, p, (size_t)(end - p)));
            return result;
        }
        /* from the right: collect pieces backwards, then reverse */
        const char *q = end;
        for (int64_t done = 0; maxsplit < 0 || done < maxsplit; done++) {
            const char *hit = NULL;
            for (const char *p = q - sep->len; p >= begin; p--)
                if (memcmp(p, sep->data, sep->len) == 0) { hit = p; break; }
            if (!hit) break;
            list_push(J, l, value_string(J, hit + sep->len, (size_t)(q - hit - sep->len)));
            q = hit;
        }
        list_push(J, l, value_string(J, begin, (size_t)(q - begin)));
        for (size_t i = 0; i < l->n / 2; i++) {
            Value t = l->items[i];
            l->items[i] = l->items[l->n - 1 - i];
            l->items[l->n - 1 - i] = t;
        }
        return result;
    }
    if (from_right) {
        const char *q = end;
        for (int64_t done = 0;; done++) {
            for (size_t k; q > begin && (k = space_before(begin, q)) > 0;) q -= k;
            if (q == begin) break;
            if (maxsplit >= 0 && done >= maxsplit) {
                list_push(J, l, value_string(J, begin, (size_t)(q - begin)));
                break;
            }
            const char *p = q;
            while (p > begin && space_before(begin, p) == 0) p--;
            list_push(J, l, value_string(J, p, (size_t)(q - p)));
            q = p;
        }
        for (size_t i = 0; i < l->n / 2; i++) {
            Value t = l->items[i];
            l->items[i] = l->items[l->n - 1 - i];
            l->items[l->n - 1 - i] = t;
        }
        return result;
    }
    const char *p = begin;
    for (int64_t done = 0;; done++) {
        for (size_t k; p < end && (k = space_at(p, end)) > 0;) p += k;
        if (p == end) break;
        if (maxsplit >= 0 && done >= maxsplit) {
            list_push(J, l, value_string(J, p, (size_t)(end - p)));
            break;
        }
        const char *q = p;
        while (q < end && space_at(q, end) == 0) {
            int32_t cp;
            q += utf8_next(q, (size_t)(end - q), 0, &cp);
        }
        list_push(J, l, value_string(J, p, (size_t)(q - p)));
        p = q;
    }
    return result;
}

static int64_t str_find(Jinja *J, const Str *s, const Str *sub, bool from_right) {
    const char *hit = NULL;
    if (!from_right) hit = sub->len == 0 ? s->data : memmem(s->data, s->len, sub->data, sub->len);
    else if (sub->len <= s->len)
        for (const char *p = s->data + s->len - sub->len; p >= s->data; p--)
            if (memcmp(p, sub->data, sub->len) == 0) { hit = p; break; }
    if (!hit) return -1;
    return (int64_t)utf8_count(s->data, (size_t)(hit - s->data)); /* code point index, like Python */
}

/* ---------------------------------------------------------------- argument binding */

/* Binds positional and keyword arguments to params (NULL-terminated); an
 * unbound parameter has has[i] == false. */
static void bind_args(Jinja *J, int line, const char *what, const char *const *params, Value *args, size_t n_args,
                      const char **kw_names, Value *kw_values, size_t n_kw, Value *out, bool *has) {
    size_t n_params = 0;
    while (params[n_params]) n_params++;
    for (size_t i = 0; i < n_params; i++) {
        has[i] = false;
        out[i] = value_undefined();
    }
    if (n_args > n_params) jinja_fail(J, line, "%s takes at most %zu argument(s), %zu given", what, n_params, n_args);
    for (size_t i = 0; i < n_args; i++) {
        out[i] = args[i];
        has[i] = true;
    }
    for (size_t k = 0; k < n_kw; k++) {
        size_t i = 0;
        while (i < n_params && strcmp(params[i], kw_names[k])) i++;
        if (i == n_params) jinja_fail(J, line, "%s got an unexpected keyword argument '%s'", what, kw_names[k]);
        if (has[i]) jinja_fail(J, line, "%s got multiple values for argument '%s'", what, kw_names[k]);
        out[i] = kw_values[k];
        has[i] = true;
    }
}

static const Str *arg_str(Jinja *J, Value v, const char *what, int line) {
    if (v.kind != VAL_STRING) jinja_fail(J, line, "%s must be a string, not %s", what, value_type_name(v));
    return v.as.s;
}

static int64_t arg_int(Jinja *J, Value v, const char *what, int line) {
    if (!is_intlike(v)) jinja_fail(J, line, "%s must be an integer, not %s", what, value_type_name(v));
    return as_int(v);
}

/* ---------------------------------------------------------------- methods */

static bool match_affix(Jinja *J, const Str *s, Value affix, bool suffix, int line) {
    if (affix.kind == VAL_LIST && affix.as.list->tuple) {
        for (size_t i = 0; i < affix.as.list->n; i++)
            if (match_affix(J, s, affix.as.list->items[i], suffix, line)) return true;
        return false;
    }
    const Str *a = arg_str(J, affix, suffix ? "endswith argument" : "startswith argument", line);
    if (a->len > s->len) return false;
    return memcmp(suffix ? s->data + s->len - a->len : s->data, a->data, a->len) == 0;
}

static Value call_method(Jinja *J, Node *n, Method *m, Value *args, size_t n_args, const char **kw_names,
                         Value *kw_values, size_t n_kw) {
    int line = n->line;
    const char *name = m->name;
    Value a[3];
    bool has[3];
    char what[64];
    snprintf(what, sizeof what, "%s.%s()", value_type_name(m->self), name);
    if (m->self.kind == VAL_DICT && m->self.as.dict->kind == DICT_LOOP) { /* loop.cycle(*values) */
        if (n_kw || n_args == 0) jinja_fail(J, line, "loop.cycle() takes one or more positional arguments");
        Value index0;
        dict_get_cstr(m->self.as.dict, "index0", &index0);
        return args[as_int(index0) % (int64_t)n_args];
    }
    if (m->self.kind == VAL_DICT) {
        const Dict *d = m->self.as.dict;
        if (!strcmp(name, "get")) {
            static const char *const params[] = {"key", "default", NULL};
            bind_args(J, line, what, params, args, n_args, kw_names, kw_values, n_kw, a, has);
            if (!has[0]) jinja_fail(J, line, "dict.get() needs a key");
            Value out;
            return dict_get(d, a[0], &out) ? out : has[1] ? a[1] : value_none();
        }
        static const char *const none[] = {NULL};
        bind_args(J, line, what, none, args, n_args, kw_names, kw_values, n_kw, a, has);
        List *l = list_new(J, false);
        for (size_t i = 0; i < d->n; i++) {
            if (!strcmp(name, "keys")) list_push(J, l, d->keys[i]);
            else if (!strcmp(name, "values")) list_push(J, l, d->values[i]);
            else {
                List *pair = list_new(J, true);
                list_push(J, pair, d->keys[i]);
                list_push(J, pair, d->values[i]);
                list_push(J, l, (Value){.kind = VAL_LIST, .as.list = pair});
            }
        }
        return list_value(l, LIST_VIEW);
    }
    COLT_ASSERT(m->self.kind == VAL_STRING);
    const Str *s = m->self.as.s;
    if (!strcmp(name, "strip") || !strcmp(name, "lstrip") || !strcmp(name, "rstrip")) {
        static const char *const params[] = {"chars", NULL};
        bind_args(J, line, what, params, args, n_args, kw_names, kw_values, n_kw, a, has);
        const Str *chars = has[0] && a[0].kind != VAL_NONE ? arg_str(J, a[0], "strip argument", line) : NULL;
        return strip(J, s, chars, name[0] != 'r', name[0] != 'l');
    }
    if (!strcmp(name, "startswith") || !strcmp(name, "endswith")) {
        static const char *const params[] = {"prefix", NULL};
        bind_args(J, line, what, params, args, n_args, kw_names, kw_values, n_kw, a, has);
        if (!has[0]) jinja_fail(J, line, "%s needs an argument", what);
        return value_bool(match_affix(J, s, a[0], name[0] == 'e', line));
    }
    if (!strcmp(name, "split") || !strcmp(name, "rsplit")) {
        static const char *const params[] = {"sep", "maxsplit", NULL};
        bind_args(J, line, what, params, args, n_args, kw_names, kw_values, n_kw, a, has);
        const Str *sep = has[0] && a[0].kind != VAL_NONE ? arg_str(J, a[0], "separator", line) : NULL;
        int64_t maxsplit = has[1] ? arg_int(J, a[1], "maxsplit", line) : -1;
        return str_split(J, s, sep, maxsplit, name[0] == 'r', line);
    }
    if (!strcmp(name, "upper") || !strcmp(name, "lower") || !strcmp(name, "title") || !strcmp(name, "capitalize")) {
        static const char *const none[] = {NULL};
        bind_args(J, line, what, none, args, n_args, kw_names, kw_values, n_kw, a, has);
        return change_case(J, s, name[0] == 'c' ? 'c' : name[0]);
    }
    if (!strcmp(name, "replace")) {
        static const char *const params[] = {"old", "new", "count", NULL};
        bind_args(J, line, what, params, args, n_args, kw_names, kw_values, n_kw, a, has);
        if (!has[0] || !has[1]) jinja_fail(J, line, "str.replace() needs two arguments");
        return str_replace(J, s, arg_str(J, a[0], "replace argument", line), arg_str(J, a[1], "replace argument", line),
                           has[2] ? arg_int(J, a[2], "count", line) : -1);
    }
    if (!strcmp(name, "find") || !strcmp(name, "rfind") || !strcmp(name, "count")) {
        static const char *const params[] = {"sub", NULL};
        bind_args(J, line, what, params, args, n_args, kw_names, kw_values, n_kw, a, has);
        if (!has[0]) jinja_fail(J, line, "%s needs an argument", what);
        const Str *sub = arg_str(J, a[0], "argument", line);
        if (name[0] != 'c') return value_int(str_find(J, s, sub, name[0] == 'r'));
        if (sub->len == 0) return value_int((int64_t)utf8_count(s->data, s->len) + 1);
        int64_t count = 0;
        for (const char *p = s->data; (p = memmem(p, (size_t)(s->data + s->len - p), sub->data, sub->len)); p += sub->len)
            count++;
        return value_int(count);
    }
    if (!strcmp(name, "join")) {
        static const char *const params[] = {"iterable", NULL};
        bind_args(J, line, what, params, args, n_args, kw_names, kw_values, n_kw, a, has);
        if (!has[0]) jinja_fail(J, line, "str.join() needs an argument");
        List *items = iterate(J, a[0], line);
        Buf b = {0};
        for (size_t i = 0; i < items->n; i++) {
            if (i) buf_put(J, &b, s->data, s->len);
            buf_put(J, &b, arg_str(J, items->items[i], "str.join() item", line)->data, items->items[i].as.s->len);
        }
        return make_str(J, &b);
    }
    jinja_fail(J, line, "unsupported Jinja method 'str.%s'", name);
}

/* ---------------------------------------------------------------- functions and macros */

static Value call_function(Jinja *J, Node *n, int fn, Value *args, size_t n_args, const char **kw_names,
                           Value *kw_values, size_t n_kw) {
    int line = n->line;
    switch ((JinjaFunction)fn) {
    case FN_RAISE_EXCEPTION: {
        Str *msg = n_args ? soft_str(J, args[0], line) : soft_str(J, value_cstring(J, ""), line);
        jinja_fail(J, line, "the template raised an error: %s", msg->data);
    }
    case FN_NAMESPACE:
    case FN_DICT: {
        Dict *d = dict_new(J, fn == FN_NAMESPACE ? DICT_NAMESPACE : DICT_PLAIN);
        if (n_args > 1) jinja_fail(J, line, "%s() takes at most one positional argument", fn == FN_DICT ? "dict" : "namespace");
        if (n_args == 1) {
            if (args[0].kind != VAL_DICT || args[0].as.dict->kind != DICT_PLAIN)
                jinja_fail(J, line, "unsupported: %s() from a %s", fn == FN_DICT ? "dict" : "namespace", value_type_name(args[0]));
            for (size_t i = 0; i < args[0].as.dict->n; i++) dict_set(J, d, args[0].as.dict->keys[i], args[0].as.dict->values[i]);
        }
        for (size_t k = 0; k < n_kw; k++) dict_set_cstr(J, d, kw_names[k], kw_values[k]);
        return (Value){.kind = VAL_DICT, .as.dict = d};
    }
    case FN_RANGE: {
        if (n_kw || n_args < 1 || n_args > 3) jinja_fail(J, line, "range() takes 1 to 3 positional arguments");
        int64_t start = 0, stop, stride = 1;
        if (n_args == 1) stop = arg_int(J, args[0], "range() argument", line);
        else {
            start = arg_int(J, args[0], "range() argument", line);
            stop = arg_int(J, args[1], "range() argument", line);
            if (n_args == 3) stride = arg_int(J, args[2], "range() argument", line);
        }
        if (stride == 0) jinja_fail(J, line, "range() step must not be zero");
        List *l = list_new(J, false);
        for (int64_t i = start; stride > 0 ? i < stop : i > stop; i += stride) {
            if (l->n >= 1000000) jinja_fail(J, line, "range() of more than 1000000 items");
            list_push(J, l, value_int(i));
            if ((stride > 0 && i > INT64_MAX - stride) || (stride < 0 && i < INT64_MIN - stride)) break;
        }
        return list_value(l, LIST_RANGE);
    }
    case FN_STRFTIME_NOW: {
        if (n_args != 1 || n_kw) jinja_fail(J, line, "strftime_now() takes one argument");
        const Str *fmt = arg_str(J, args[0], "strftime_now() format", line);
        time_t now = time(NULL);
        struct tm tm;
        localtime_r(&now, &tm);
        char out[512];
        size_t len = fmt->len ? strftime(out, sizeof out, fmt->data, &tm) : 0;
        return value_string(J, out, len);
    }
    }
    jinja_fail(J, line, "unknown function");
}

static Value call_macro(Jinja *J, Node *n, Macro *m, Value *args, size_t n_args, const char **kw_names, Value *kw_values,
                        size_t n_kw) {
    Node *def = m->node;
    size_t n_params = def->kw_values.n;
    if (n_args > n_params) jinja_fail(J, n->line, "macro '%s' takes not more than %zu argument(s)", def->name, n_params);
    if (J->depth + 1 > JINJA_MAX_DEPTH) jinja_fail(J, n->line, "macro calls nest too deeply");
    Scope *scope = jinja_alloc(J, sizeof(Scope));
    scope->parent = m->closure;
    scope->vars = dict_new(J, DICT_PLAIN);
    for (size_t k = 0; k < n_kw; k++) {
        size_t i = 0;
        while (i < n_params && strcmp(def->kw_names[i], kw_names[k])) i++;
        if (i == n_params) jinja_fail(J, n->line, "macro '%s' has no argument '%s'", def->name, kw_names[k]);
        if (i < n_args) jinja_fail(J, n->line, "macro '%s' got multiple values for argument '%s'", def->name, kw_names[k]);
    }
    for (size_t i = 0; i < n_params; i++) {
        Value v = value_undefined();
        bool set = false;
        if (i < n_args) { v = args[i]; set = true; }
        for (size_t k = 0; k < n_kw && !set; k++)
            if (!strcmp(def->kw_names[i], kw_names[k])) { v = kw_values[k]; set = true; }
        if (!set && def->kw_values.items[i]) v = eval(J, def->kw_values.items[i], scope);
        dict_set_cstr(J, scope->vars, def->kw_names[i], v);
    }
    Buf out = {0};
    Buf *saved = J->out;
    J->out = &out;
    J->depth++;
    exec_body(J, &def->body, scope);
    J->depth--;
    J->out = saved;
    return make_str(J, &out);
}

/* ---------------------------------------------------------------- filters */

typedef Value (*FilterFn)(Jinja *J, Node *n, Value v, Value *a, const bool *has);

static Value filter_trim(Jinja *J, Node *n, Value v, Value *a, const bool *has) {
    const Str *chars = has[0] && a[0].kind != VAL_NONE ? arg_str(J, a[0], "trim argument", n->line) : NULL;
    return strip(J, soft_str(J, v, n->line), chars, true, true);
}

static Value filter_length(Jinja *J, Node *n, Value v, Value *a, const bool *has) {
    switch (v.kind) {
    case VAL_UNDEFINED: return value_int(0);
    case VAL_STRING: return value_int((int64_t)utf8_count(v.as.s->data, v.as.s->len));
    case VAL_LIST: return value_int((int64_t)iterate(J, v, n->line)->n);
    case VAL_DICT:
        if (v.as.dict->kind == DICT_PLAIN) return value_int((int64_t)v.as.dict->n);
        if (v.as.dict->kind == DICT_LOOP) {
            Value len;
            dict_get_cstr(v.as.dict, "length", &len);
            return len;
        }
        break;
    default: break;
    }
    jinja_fail(J, n->line, "object of type '%s' has no len()", value_type_name(v));
}

static Value filter_tojson(Jinja *J, Node *n, Value v, Value *a, const bool *has) {
    bool ensure_ascii = has[0] && value_truthy(a[0]);
    const char *indent = NULL;
    if (has[1] && a[1].kind != VAL_NONE) {
        if (a[1].kind == VAL_STRING) indent = a[1].as.s->data;
        else {
            int64_t width = arg_int(J, a[1], "tojson indent", n->line);
            if (width > 64) jinja_fail(J, n->line, "unsupported: tojson indent above 64");
            char *spaces = jinja_alloc(J, (size_t)(width > 0 ? width : 0) + 1);
            for (int64_t i = 0; i < width; i++) spaces[i] = ' ';
            indent = spaces;
        }
    }
    const char *item_sep = indent ? "," : ", ", *key_sep = ": ";
    if (has[2] && a[2].kind != VAL_NONE) {
        if (a[2].kind != VAL_LIST || a[2].as.list->n != 2) jinja_fail(J, n->line, "tojson separators must be a pair of strings");
        item_sep = arg_str(J, a[2].as.list->items[0], "tojson separator", n->line)->data;
        key_sep = arg_str(J, a[2].as.list->items[1], "tojson separator", n->line)->data;
    }
    Buf b = {0};
    value_json(J, &b, v, ensure_ascii, indent, item_sep, key_sep, has[3] && value_truthy(a[3]), 0, n->line);
    return make_str(J, &b);
}

static Value filter_upper(Jinja *J, Node *n, Value v, Value *a, const bool *has) { return change_case(J, soft_str(J, v, n->line), 'u'); }
static Value filter_lower(Jinja *J, Node *n, Value v, Value *a, const bool *has) { return change_case(J, soft_str(J, v, n->line), 'l'); }
/* jinja2's title filter (not str.title): words start after whitespace or -({[< */
static Value filter_title(Jinja *J, Node *n, Value v, Value *a, const bool *has) {
    const Str *s = soft_str(J, v, n->line);
    Buf b = {0};
    bool word_start = true;
    for (size_t i = 0; i < s->len;) {
        int32_t cp;
        size_t k = utf8_next(s->data, s->len, i, &cp);
        bool boundary = space_at(s->data + i, s->data + s->len) > 0 || (cp < 0x80 && strchr("-({[<", (int)cp) && cp);
        if (boundary || (k == 1 && (unsigned char)s->data[i] >= 0x80)) buf_put(J, &b, s->data + i, k);
        else if (word_start && cp == 0xdf) buf_puts(J, &b, "SS");
        else utf8_put(J, &b, word_start ? utf8proc_toupper(cp) : utf8proc_tolower(cp));
        word_start = boundary;
        i += k;
    }
    return make_str(J, &b);
}
static Value filter_capitalize(Jinja *J, Node *n, Value v, Value *a, const bool *has) {
    return change_case(J, soft_str(J, v, n->line), 'c');
}
static Value filter_string(Jinja *J, Node *n, Value v, Value *a, const bool *has) {
    return (Value){.kind = VAL_STRING, .as.s = soft_str(J, v, n->line)};
}
static Value filter_safe(Jinja *J, Node *n, Value v, Value *a, const bool *has) { return v; }

static Value filter_default(Jinja *J, Node *n, Value v, Value *a, const bool *has) {
    bool use_default = v.kind == VAL_UNDEFINED || (has[1] && value_truthy(a[1]) && !value_truthy(v));
    if (!use_default) return v;
    return has[0] ? a[0] : value_cstring(J, "");
}

static Value attribute_of(Jinja *J, Value item, Value attribute, int line) {
    if (attribute.kind == VAL_INT) return get_item(J, item, attribute, line);
    const Str *path = arg_str(J, attribute, "attribute", line);
    /* dotted paths, integer parts index */
    const char *p = path->data;
    for (;;) {
        const char *dot = strchr(p, '.');
        size_t len = dot ? (size_t)(dot - p) : strlen(p);
        Value key = value_string(J, p, len);
        char *end;
        long long index = len ? strtoll(key.as.s->data, &end, 10) : 0;
        if (len && *end == '\0') key = value_int(index);
        item = get_item(J, item, key, line);
        if (!dot) return item;
        p = dot + 1;
    }
}

static Value filter_join(Jinja *J, Node *n, Value v, Value *a, const bool *has) {
    const Str *sep = has[0] ? soft_str(J, a[0], n->line) : NULL;
    List *items = iterate(J, v, n->line);
    Buf b = {0};
    for (size_t i = 0; i < items->n; i++) {
        if (i && sep) buf_put(J, &b, sep->data, sep->len);
        Value item = items->items[i];
        if (has[1] && a[1].kind != VAL_NONE) item = attribute_of(J, item, a[1], n->line);
        value_str(J, &b, item, n->line);
    }
    return make_str(J, &b);
}

static Value filter_items(Jinja *J, Node *n, Value v, Value *a, const bool *has) {
    List *l = list_new(J, false);
    if (v.kind == VAL_UNDEFINED) return (Value){.kind = VAL_LIST, .as.list = l};
    if (v.kind != VAL_DICT || v.as.dict->kind != DICT_PLAIN) jinja_fail(J, n->line, "items filter: can only get item pairs from a mapping, not %s", value_type_name(v));
    for (size_t i = 0; i < v.as.dict->n; i++) {
        List *pair = list_new(J, true);
        list_push(J, pair, v.as.dict->keys[i]);
        list_push(J, pair, v.as.dict->values[i]);
        list_push(J, l, (Value){.kind = VAL_LIST, .as.list = pair});
    }
    return list_value(l, LIST_GENERATOR);
}

static Value filter_first(Jinja *J, Node *n, Value v, Value *a, const bool *has) {
    List *items = iterate(J, v, n->line);
    return items->n ? items->items[0] : value_undefined();
}

static Value filter_last(Jinja *J, Node *n, Value v, Value *a, const bool *has) {
    if (v.kind == VAL_DICT || (v.kind == VAL_LIST && v.as.list->kind == LIST_GENERATOR))
        jinja_fail(J, n->line, "unsupported: last of a %s", value_type_name(v));
    List *items = iterate(J, v, n->line);
    return items->n ? items->items[items->n - 1] : value_undefined();
}

static Value filter_list(Jinja *J, Node *n, Value v, Value *a, const bool *has) {
    List *items = iterate(J, v, n->line), *l = list_new(J, false);
    for (size_t i = 0; i < items->n; i++) list_push(J, l, items->items[i]);
    return (Value){.kind = VAL_LIST, .as.list = l};
}

static Value filter_reverse(Jinja *J, Node *n, Value v, Value *a, const bool *has) {
    List *items = iterate(J, v, n->line), *l = list_new(J, false);
    for (size_t i = items->n; i > 0; i--) list_push(J, l, items->items[i - 1]);
    if (v.kind != VAL_STRING) return list_value(l, LIST_GENERATOR); /* reversed() iterator */
    Buf b = {0};
    for (size_t i = 0; i < l->n; i++) buf_put(J, &b, l->items[i].as.s->data, l->items[i].as.s->len);
    return make_str(J, &b);
}

static Value filter_replace(Jinja *J, Node *n, Value v, Value *a, const bool *has) {
    if (!has[0] || !has[1]) jinja_fail(J, n->line, "replace filter needs two arguments");
    return str_replace(J, soft_str(J, v, n->line), soft_str(J, a[0], n->line), soft_str(J, a[1], n->line),
                       has[2] && a[2].kind != VAL_NONE ? arg_int(J, a[2], "count", n->line) : -1);
}

static bool parse_python_int(const Str *s, int64_t *out) {
    char digits[64];
    size_t k = 0;
    const char *p = s->data, *end = s->data + s->len;
    while (p < end && space_at(p, end)) p += space_at(p, end);
    while (end > p && space_before(p, end)) end -= space_before(p, end);
    if (p < end && (*p == '+' || *p == '-')) digits[k++] = *p++;
    if (p == end) return false;
    for (; p < end; p++) {
        if (*p == '_' && p + 1 < end && p[-1] >= '0' && p[-1] <= '9') continue;
        if (*p < '0' || *p > '9' || k + 1 >= sizeof digits) return false;
        digits[k++] = *p;
    }
    digits[k] = '\0';
    char *stop;
    errno = 0;
    long long v = strtoll(digits, &stop, 10);
    if (errno || *stop) return false;
    *out = v;
    return true;
}

static bool parse_python_float(const Str *s, double *out) {
    const char *p = s->data, *end = s->data + s->len;
    while (p < end && space_at(p, end)) p += space_at(p, end);
    while (end > p && space_before(p, end)) end -= space_before(p, end);
    if (p == end || end - p > 60) return false;
    char tmp[64];
    memcpy(tmp, p, (size_t)(end - p));
    tmp[end - p] = '\0';
    if (strchr(tmp, 'x') || strchr(tmp, 'X') || strchr(tmp, 'p') || strchr(tmp, 'P')) return false;
    char *stop;
    double f = strtod(tmp, &stop);
    if (*stop) return false;
    *out = f;
    return true;
}

static Value filter_int(Jinja *J, Node *n, Value v, Value *a, const bool *has) {
    Value fallback = has[0] ? a[0] : value_int(0);
    if (has[1]) jinja_fail(J, n->line, "unsupported: int filter with a base");
    switch (v.kind) {
    case VAL_INT: return v;
    case VAL_BOOL: return value_int(v.as.b);
    case VAL_FLOAT:
        if (!isfinite(v.as.f) || fabs(v.as.f) >= 9.2e18) return fallback;
        return value_int((int64_t)v.as.f);
    case VAL_STRING: {
        int64_t i;
        double f;
        if (parse_python_int(v.as.s, &i)) return value_int(i);
        if (parse_python_float(v.as.s, &f) && isfinite(f) && fabs(f) < 9.2e18) return value_int((int64_t)f);
        return fallback;
    }
    default: return fallback;
    }
}

static Value filter_float(Jinja *J, Node *n, Value v, Value *a, const bool *has) {
    Value fallback = has[0] ? a[0] : value_float(0.0);
    if (is_number(v)) return value_float(as_double(v));
    double f;
    if (v.kind == VAL_STRING && parse_python_float(v.as.s, &f)) return value_float(f);
    return fallback;
}

static Value filter_abs(Jinja *J, Node *n, Value v, Value *a, const bool *has) {
    if (is_intlike(v)) {
        if (as_int(v) == INT64_MIN) jinja_fail(J, n->line, "unsupported: integer overflow in abs");
        return value_int(llabs(as_int(v)));
    }
    if (v.kind == VAL_FLOAT) return value_float(fabs(v.as.f));
    jinja_fail(J, n->line, "bad operand type for abs(): '%s'", value_type_name(v));
}

static Value filter_escape(Jinja *J, Node *n, Value v, Value *a, const bool *has) {
    const Str *s = soft_str(J, v, n->line);
    Buf b = {0};
    for (size_t i = 0; i < s->len; i++) {
        switch (s->data[i]) {
        case '&': buf_puts(J, &b, "&amp;"); break;
        case '<': buf_puts(J, &b, "&lt;"); break;
        case '>': buf_puts(J, &b, "&gt;"); break;
        case '"': buf_puts(J, &b, "&#34;"); break;
        case '\'': buf_puts(J, &b, "&#39;"); break;
        default: buf_put(J, &b, s->data + i, 1);
        }
    }
    return make_str(J, &b);
}

/* Python str.splitlines() boundaries. */
static size_t line_break_at(const char *p, const char *end) {
    unsigned char c = (unsigned char)*p;
    if (c == '\r') return p + 1 < end && p[1] == '\n' ? 2 : 1;
    if (c == '\n' || c == '\v' || c == '\f' || (c >= 0x1c && c <= 0x1e)) return 1;
    if (c == 0xc2 && p + 1 < end && (unsigned char)p[1] == 0x85) return 2;
    if (c == 0xe2 && p + 2 < end && (unsigned char)p[1] == 0x80 && ((unsigned char)p[2] == 0xa8 || (unsigned char)p[2] == 0xa9)) return 3;
    return 0;
}

static Value filter_indent(Jinja *J, Node *n, Value v, Value *a, const bool *has) {
    const Str *indent;
    if (has[0] && a[0].kind == VAL_STRING) indent = a[0].as.s;
    else {
        int64_t width = has[0] ? arg_int(J, a[0], "indent width", n->line) : 4;
        if (width > 1024) jinja_fail(J, n->line, "unsupported: indent width above 1024");
        Buf sp = {0};
        for (int64_t i = 0; i < width; i++) buf_put(J, &sp, " ", 1);
        indent = make_str(J, &sp).as.s;
    }
    bool first = has[1] && value_truthy(a[1]), blank = has[2] && value_truthy(a[2]);
    const Str *s = soft_str(J, v, n->line);
    /* lines = (s + "\n").splitlines() */
    Buf text = {0};
    buf_put(J, &text, s->data, s->len);
    buf_put(J, &text, "\n", 1);
    List *lines = list_new(J, false);
    const char *p = text.data, *end = text.data + text.len, *start = p;
    while (p < end) {
        size_t k = line_break_at(p, end);
        if (k) {
            list_push(J, lines, value_string(J, start, (size_t)(p - start)));
            p += k;
            start = p;
        } else p++;
    }
    if (start < end) list_push(J, lines, value_string(J, start, (size_t)(end - start)));
    Buf b = {0};
    if (first) buf_put(J, &b, indent->data, indent->len);
    for (size_t i = 0; i < lines->n; i++) {
        const Str *line = lines->items[i].as.s;
        if (i) {
            buf_put(J, &b, "\n", 1);
            if (blank || line->len) buf_put(J, &b, indent->data, indent->len);
        }
        buf_put(J, &b, line->data, line->len);
    }
    return make_str(J, &b);
}

/* Filters with a variable argument list: map, select, reject, selectattr, rejectattr. */
static Value filter_select_family(Jinja *J, Node *n, const char *name, Value v, Value *args, size_t n_args,
                                  const char **kw_names, Value *kw_values, size_t n_kw) {
    int line = n->line;
    List *items = iterate(J, v, line), *out = list_new(J, false);
    Value result = list_value(out, LIST_GENERATOR);
    if (!strcmp(name, "map")) {
        if (n_args == 0) { /* map(attribute=..., default=...) */
            Value attribute = value_undefined(), fallback = value_undefined();
            bool has_default = false;
            for (size_t k = 0; k < n_kw; k++) {
                if (!strcmp(kw_names[k], "attribute")) attribute = kw_values[k];
                else if (!strcmp(kw_names[k], "default")) { fallback = kw_values[k]; has_default = true; }
                else jinja_fail(J, line, "map filter got an unexpected keyword argument '%s'", kw_names[k]);
            }
            if (attribute.kind == VAL_UNDEFINED) jinja_fail(J, line, "map filter needs a filter name or attribute=");
            for (size_t i = 0; i < items->n; i++) {
                Value x = attribute_of(J, items->items[i], attribute, line);
                list_push(J, out, x.kind == VAL_UNDEFINED && has_default ? fallback : x);
            }
            return result;
        }
        const Str *filter_name = arg_str(J, args[0], "map filter name", line);
        int filter = jinja_filter_index(filter_name->data);
        if (filter < 0) jinja_fail(J, line, "unsupported Jinja filter '%s'", filter_name->data);
        for (size_t i = 0; i < items->n; i++)
            list_push(J, out, jinja_call_filter(J, n, filter, items->items[i], args + 1, n_args - 1, kw_names, kw_values, n_kw));
        return result;
    }
    if (n_kw) jinja_fail(J, line, "%s filter takes no keyword arguments", name);
    bool by_attribute = !strcmp(name, "selectattr") || !strcmp(name, "rejectattr");
    bool keep_if = name[0] == 's';
    size_t first_test_arg = by_attribute ? 1 : 0;
    if (by_attribute && n_args == 0) jinja_fail(J, line, "%s filter needs an attribute", name);
    int test = -1;
    if (n_args > first_test_arg) {
        const Str *test_name = arg_str(J, args[first_test_arg], "test name", line);
        test = jinja_test_index(test_name->data);
        if (test < 0) jinja_fail(J, line, "unsupported Jinja test '%s'", test_name->data);
    }
    for (size_t i = 0; i < items->n; i++) {
        Value x = by_attribute ? attribute_of(J, items->items[i], args[0], line) : items->items[i];
        bool passed = test < 0 ? value_truthy(x) : call_test(J, n, test, x, args + first_test_arg + 1, n_args - first_test_arg - 1);
        if (passed == keep_if) list_push(J, out, items->items[i]);
    }
    return result;
}

typedef struct FilterDef {
    const char *name;
    FilterFn fn; /* NULL: variable arguments, filter_select_family */
    const char *params[5];
} FilterDef;

static const FilterDef FILTERS[] = {
    {"trim", filter_trim, {"chars"}},
    {"length", filter_length, {NULL}},
    {"count", filter_length, {NULL}},
    {"tojson", filter_tojson, {"ensure_ascii", "indent", "separators", "sort_keys"}},
    {"upper", filter_upper, {NULL}},
    {"lower", filter_lower, {NULL}},
    {"title", filter_title, {NULL}},
    {"capitalize", filter_capitalize, {NULL}},
    {"string", filter_string, {NULL}},
    {"safe", filter_safe, {NULL}},
    {"default", filter_default, {"default_value", "boolean"}},
    {"d", filter_default, {"default_value", "boolean"}},
    {"join", filter_join, {"d", "attribute"}},
    {"items", filter_items, {NULL}},
    {"first", filter_first, {NULL}},
    {"last", filter_last, {NULL}},
    {"list", filter_list, {NULL}},
    {"reverse", filter_reverse, {NULL}},
    {"replace", filter_replace, {"old", "new", "count"}},
    {"int", filter_int, {"default", "base"}},
    {"float", filter_float, {"default"}},
    {"abs", filter_abs, {NULL}},
    {"escape", filter_escape, {NULL}},
    {"e", filter_escape, {NULL}},
    {"indent", filter_indent, {"width", "first", "blank"}},
    {"map", NULL, {NULL}},
    {"select", NULL, {NULL}},
    {"reject", NULL, {NULL}},
    {"selectattr", NULL, {NULL}},
    {"rejectattr", NULL, {NULL}},
};

int jinja_filter_index(const char *name) {
    for (size_t i = 0; i < sizeof FILTERS / sizeof *FILTERS; i++)
        if (!strcmp(FILTERS[i].name, name)) return (int)i;
    return -1;
}

Value jinja_call_filter(Jinja *J, Node *n, int filter, Value v, Value *args, size_t n_args, const char **kw_names,
                        Value *kw_values, size_t n_kw) {
    const FilterDef *f = &FILTERS[filter];
    if (!f->fn) return filter_select_family(J, n, f->name, v, args, n_args, kw_names, kw_values, n_kw);
    Value a[5];
    bool has[5];
    char what[48];
    snprintf(what, sizeof what, "filter '%s'", f->name);
    bind_args(J, n->line, what, f->params, args, n_args, kw_names, kw_values, n_kw, a, has);
    return f->fn(J, n, v, a, has);
}

/* ---------------------------------------------------------------- tests */

static bool str_has_case(const Str *s, bool upper) {
    bool cased = false;
    for (size_t i = 0; i < s->len;) {
        int32_t cp;
        i += utf8_next(s->data, s->len, i, &cp);
        if (utf8proc_tolower(cp) != cp || utf8proc_toupper(cp) != cp) {
            bool is_upper = utf8proc_tolower(cp) != cp;
            if (is_upper != upper) return false;
            cased = true;
        }
    }
    return cased;
}

typedef struct TestDef {
    const char *name;
    int arity; /* arguments the test takes */
} TestDef;

static const TestDef TESTS[] = {
    {"defined", 0}, {"undefined", 0}, {"none", 0}, {"string", 0}, {"mapping", 0}, {"iterable", 0},
    {"sequence", 0}, {"number", 0}, {"integer", 0}, {"float", 0}, {"boolean", 0}, {"true", 0},
    {"false", 0}, {"callable", 0}, {"odd", 0}, {"even", 0}, {"lower", 0}, {"upper", 0},
    {"sameas", 1}, {"eq", 1}, {"equalto", 1}, {"ne", 1}, {"lt", 1}, {"lessthan", 1}, {"le", 1},
    {"gt", 1}, {"greaterthan", 1}, {"ge", 1}, {"in", 1}, {"divisibleby", 1},
};

int jinja_test_index(const char *name) {
    for (size_t i = 0; i < sizeof TESTS / sizeof *TESTS; i++)
        if (!strcmp(TESTS[i].name, name)) return (int)i;
    return -1;
}

static bool call_test(Jinja *J, Node *n, int test, Value v, Value *args, size_t n_args) {
    const char *name = TESTS[test].name;
    int line = n->line;
    if (n_args != (size_t)TESTS[test].arity)
        jinja_fail(J, line, "test '%s' takes %d argument(s), %zu given", name, TESTS[test].arity, n_args);
    Value o = n_args ? args[0] : value_undefined();
    switch (name[0]) {
    case 'd':
        if (!strcmp(name, "defined")) return v.kind != VAL_UNDEFINED;
        { /* divisibleby */
            int64_t d = arg_int(J, o, "divisibleby argument", line);
            if (d == 0) jinja_fail(J, line, "integer division or modulo by zero");
            if (v.kind == VAL_FLOAT) return fmod(v.as.f, (double)d) == 0;
            return d == -1 || arg_int(J, v, "divisibleby value", line) % d == 0;
        }
    case 'u':
        if (!strcmp(name, "undefined")) return v.kind == VAL_UNDEFINED;
        return str_has_case(soft_str(J, v, line), true);
    case 'n':
        if (!strcmp(name, "none")) return v.kind == VAL_NONE;
        if (!strcmp(name, "number")) return is_number(v);
        return !value_equal(v, o); /* ne */
    case 's':
        if (!strcmp(name, "string")) return v.kind == VAL_STRING;
        if (!strcmp(name, "sequence"))
            return v.kind == VAL_STRING || (v.kind == VAL_LIST && v.as.list->kind != LIST_GENERATOR) || v.kind == VAL_UNDEFINED || (v.kind == VAL_DICT && v.as.dict->kind != DICT_NAMESPACE);
        /* sameas */
        if (v.kind != o.kind) return false;
        switch (v.kind) {
        case VAL_UNDEFINED: return false;
        case VAL_NONE: return true;
        case VAL_BOOL: return v.as.b == o.as.b;
        case VAL_INT: return v.as.i == o.as.i && v.as.i >= -5 && v.as.i <= 256; /* CPython small-int cache */
        case VAL_FLOAT: return false;
        case VAL_STRING: return v.as.s == o.as.s;
        case VAL_LIST: return v.as.list == o.as.list;
        case VAL_DICT: return v.as.dict == o.as.dict;
        default: return value_equal(v, o);
        }
    case 'm': return v.kind == VAL_DICT && v.as.dict->kind == DICT_PLAIN;
    case 'i':
        if (!strcmp(name, "iterable"))
            return v.kind == VAL_STRING || v.kind == VAL_LIST || v.kind == VAL_UNDEFINED || (v.kind == VAL_DICT && v.as.dict->kind != DICT_NAMESPACE);
        if (!strcmp(name, "integer")) return v.kind == VAL_INT;
        return contains(J, o, v, line); /* in */
    case 'f':
        if (!strcmp(name, "float")) return v.kind == VAL_FLOAT;
        return v.kind == VAL_BOOL && !v.as.b; /* false */
    case 'b': return v.kind == VAL_BOOL;
    case 't': return v.kind == VAL_BOOL && v.as.b;
    case 'c': return v.kind == VAL_FUNCTION || v.kind == VAL_METHOD || v.kind == VAL_MACRO || v.kind == VAL_UNDEFINED;
    case 'o':
    case 'e':
        if (!strcmp(name, "eq") || !strcmp(name, "equalto")) return value_equal(v, o);
        {
            int64_t x = arg_int(J, v, name, line);
            return (x % 2 != 0) == (name[0] == 'o');
        }
    case 'l':
        if (!strcmp(name, "lower")) return str_has_case(soft_str(J, v, line), false);
        if (!strcmp(name, "le")) return compare(J, 'l', v, o, line);
        return compare(J, '<', v, o, line); /* lt, lessthan */
    case 'g':
        if (!strcmp(name, "ge")) return compare(J, 'g', v, o, line);
        return compare(J, '>', v, o, line); /* gt, greaterthan */
    }
    jinja_fail(J, line, "unsupported Jinja test '%s'", name);
}

/* ---------------------------------------------------------------- evaluation */

static Value lookup(Scope *s, const char *name) {
    for (; s; s = s->parent) {
        Value v;
        if (dict_get_cstr(s->vars, name, &v)) return v;
    }
    return value_undefined();
}

static void eval_args(Jinja *J, Node *n, Scope *s, Value **args, Value **kw_values) {
    *args = jinja_alloc(J, (n->args.n + 1) * sizeof(Value));
    *kw_values = jinja_alloc(J, (n->kw_values.n + 1) * sizeof(Value));
    for (size_t i = 0; i < n->args.n; i++) (*args)[i] = eval(J, n->args.items[i], s);
    for (size_t i = 0; i < n->kw_values.n; i++) (*kw_values)[i] = eval(J, n->kw_values.items[i], s);
}

static Value eval(Jinja *J, Node *n, Scope *s) {
    step(J, n->line);
    if (++J->depth > JINJA_MAX_DEPTH * 2) jinja_fail(J, n->line, "expression nests too deeply");
    Value result;
    switch (n->kind) {
    case NODE_CONST: result = n->value; break;
    case NODE_NAME: result = lookup(s, n->name); break;
    case NODE_GETATTR: result = get_attr(J, eval(J, n->a, s), n->name, n->line); break;
    case NODE_GETITEM: {
        Value obj = eval(J, n->a, s);
        result = get_item(J, obj, eval(J, n->b, s), n->line);
        break;
    }
    case NODE_SLICE: {
        Value obj = eval(J, n->a, s);
        Value start = n->b ? eval(J, n->b, s) : value_none(), stop = n->c ? eval(J, n->c, s) : value_none();
        Value stride = n->d ? eval(J, n->d, s) : value_none();
        result = get_slice(J, obj, start, stop, stride, n->line);
        break;
    }
    case NODE_CALL: {
        Value callee = eval(J, n->a, s);
        Value *args, *kw_values;
        eval_args(J, n, s, &args, &kw_values);
        switch (callee.kind) {
        case VAL_FUNCTION: result = call_function(J, n, callee.as.function, args, n->args.n, n->kw_names, kw_values, n->kw_values.n); break;
        case VAL_METHOD: result = call_method(J, n, callee.as.method, args, n->args.n, n->kw_names, kw_values, n->kw_values.n); break;
        case VAL_MACRO: result = call_macro(J, n, callee.as.macro, args, n->args.n, n->kw_names, kw_values, n->kw_values.n); break;
        case VAL_UNDEFINED:
            if (n->a->kind == NODE_NAME) jinja_fail(J, n->line, "unsupported or undefined function '%s'", n->a->name);
            if (n->a->kind == NODE_GETATTR) jinja_fail(J, n->line, "unsupported or undefined method '%s'", n->a->name);
            jinja_fail(J, n->line, "an undefined value is not callable");
        default: jinja_fail(J, n->line, "'%s' object is not callable", value_type_name(callee));
        }
        break;
    }
    case NODE_FILTER: {
        if (n->op < 0) jinja_fail(J, n->line, "unsupported Jinja filter '%s'", n->name);
        Value v = eval(J, n->a, s);
        Value *args, *kw_values;
        eval_args(J, n, s, &args, &kw_values);
        result = jinja_call_filter(J, n, n->op, v, args, n->args.n, n->kw_names, kw_values, n->kw_values.n);
        break;
    }
    case NODE_TEST: {
        if (n->op < 0) jinja_fail(J, n->line, "unsupported Jinja test '%s'", n->name);
        Value v = eval(J, n->a, s);
        Value *args, *kw_values;
        eval_args(J, n, s, &args, &kw_values);
        if (n->kw_values.n) jinja_fail(J, n->line, "test '%s' takes no keyword arguments", n->name);
        result = value_bool(call_test(J, n, n->op, v, args, n->args.n));
        break;
    }
    case NODE_BINOP: {
        Value a = eval(J, n->a, s);
        result = arith(J, n->op, a, eval(J, n->b, s), n->line);
        break;
    }
    case NODE_NOT: result = value_bool(!value_truthy(eval(J, n->a, s))); break;
    case NODE_NEG:
    case NODE_POS: {
        Value v = eval(J, n->a, s);
        if (v.kind == VAL_FLOAT) result = value_float(n->kind == NODE_NEG ? -v.as.f : v.as.f);
        else if (is_intlike(v)) {
            if (n->kind == NODE_NEG && as_int(v) == INT64_MIN) jinja_fail(J, n->line, "unsupported: integer overflow");
            result = value_int(n->kind == NODE_NEG ? -as_int(v) : as_int(v));
        } else jinja_fail(J, n->line, "bad operand type for unary %c: '%s'", n->kind == NODE_NEG ? '-' : '+', value_type_name(v));
        break;
    }
    case NODE_AND: {
        Value a = eval(J, n->a, s);
        result = value_truthy(a) ? eval(J, n->b, s) : a;
        break;
    }
    case NODE_OR: {
        Value a = eval(J, n->a, s);
        result = value_truthy(a) ? a : eval(J, n->b, s);
        break;
    }
    case NODE_COMPARE: {
        Value left = eval(J, n->a, s);
        result = value_bool(true);
        for (size_t i = 0; i < n->args.n; i++) {
            Value right = eval(J, n->args.items[i], s);
            if (!compare(J, n->ops[i], left, right, n->line)) {
                result = value_bool(false);
                break;
            }
            left = right;
        }
        break;
    }
    case NODE_CONDEXPR:
        if (value_truthy(eval(J, n->a, s))) result = eval(J, n->b, s);
        else result = n->c ? eval(J, n->c, s) : value_undefined();
        break;
    case NODE_LIST:
    case NODE_TUPLE: {
        List *l = list_new(J, n->kind == NODE_TUPLE);
        for (size_t i = 0; i < n->args.n; i++) list_push(J, l, eval(J, n->args.items[i], s));
        result = (Value){.kind = VAL_LIST, .as.list = l};
        break;
    }
    case NODE_DICT: {
        Dict *d = dict_new(J, DICT_PLAIN);
        for (size_t i = 0; i < n->args.n; i++) {
            Value key = eval(J, n->args.items[i], s);
            if (key.kind == VAL_LIST && !key.as.list->tuple) jinja_fail(J, n->line, "unhashable type: 'list'");
            if (key.kind == VAL_DICT || key.kind == VAL_UNDEFINED) jinja_fail(J, n->line, "unsupported dict key of type '%s'", value_type_name(key));
            dict_set(J, d, key, eval(J, n->kw_values.items[i], s));
        }
        result = (Value){.kind = VAL_DICT, .as.dict = d};
        break;
    }
    default: jinja_fail(J, n->line, "internal error: statement evaluated as an expression");
    }
    J->depth--;
    return result;
}

static void assign(Jinja *J, Node *target, Value v, Scope *s) {
    if (target->kind == NODE_NAME) {
        dict_set_cstr(J, s->vars, target->name, v);
        return;
    }
    if (target->kind == NODE_GETATTR) {
        Value ns = lookup(s, target->a->name);
        if (ns.kind != VAL_DICT || ns.as.dict->kind != DICT_NAMESPACE)
            jinja_fail(J, target->line, "can only assign attributes of a namespace() object, '%s' is a %s", target->a->name, value_type_name(ns));
        dict_set_cstr(J, ns.as.dict, target->name, v);
        return;
    }
    List *items = iterate(J, v, target->line);
    if (items->n != target->args.n)
        jinja_fail(J, target->line, "cannot unpack %zu value(s) into %zu name(s)", items->n, target->args.n);
    for (size_t i = 0; i < items->n; i++) dict_set_cstr(J, s->vars, target->args.items[i]->name, items->items[i]);
}

static Scope *scope_new(Jinja *J, Scope *parent) {
    Scope *s = jinja_alloc(J, sizeof(Scope));
    s->parent = parent;
    s->vars = dict_new(J, DICT_PLAIN);
    return s;
}

static int exec_for(Jinja *J, Node *n, Scope *s) {
    List *all = iterate(J, eval(J, n->b, s), n->line);
    List *items = all;
    if (n->c) { /* for x in xs if cond: filter first, so loop.length counts kept items */
        items = list_new(J, false);
        for (size_t i = 0; i < all->n; i++) {
            Scope *filter_scope = scope_new(J, s);
            assign(J, n->a, all->items[i], filter_scope);
            if (value_truthy(eval(J, n->c, filter_scope))) list_push(J, items, all->items[i]);
        }
    }
    size_t count = items->n;
    /* the loop object's keys, shared by every iteration's loop dict */
    static const char *const names[] = {"index", "index0", "revindex", "revindex0", "first", "last",
                                        "length", "depth", "depth0", "previtem", "nextitem", "loop"};
    enum { N_NAMES = sizeof names / sizeof *names };
    Value keys[N_NAMES];
    for (size_t k = 0; k < N_NAMES; k++) keys[k] = value_cstring(J, names[k]);
    for (size_t i = 0; i < count; i++) {
        step(J, n->line);
        Scope *iteration = scope_new(J, s);
        Dict *loop = dict_new(J, DICT_LOOP);
        int64_t len = (int64_t)count, k = (int64_t)i;
        Value values[] = {value_int(k + 1), value_int(k), value_int(len - k), value_int(len - k - 1),
                          value_bool(i == 0), value_bool(i + 1 == count), value_int(len), value_int(1), value_int(0)};
        loop->cap = N_NAMES;
        loop->keys = jinja_alloc(J, N_NAMES * sizeof(Value));
        loop->values = jinja_alloc(J, N_NAMES * sizeof(Value));
        for (size_t v = 0; v < sizeof values / sizeof *values; v++) {
            loop->keys[loop->n] = keys[v];
            loop->values[loop->n++] = values[v];
        }
        if (i > 0) {
            loop->keys[loop->n] = keys[9];
            loop->values[loop->n++] = items->items[i - 1];
        }
        if (i + 1 < count) {
            loop->keys[loop->n] = keys[10];
            loop->values[loop->n++] = items->items[i + 1];
        }
        dict_set(J, iteration->vars, keys[11], (Value){.kind = VAL_DICT, .as.dict = loop});
        assign(J, n->a, items->items[i], iteration);
        int flow = exec_body(J, &n->body, iteration);
        if (flow == FLOW_BREAK) break;
    }
    if (count == 0 && n->else_body.n) return exec_body(J, &n->else_body, scope_new(J, s));
    return FLOW_NORMAL;
}

static int exec_node(Jinja *J, Node *n, Scope *s) {
    step(J, n->line);
    switch (n->kind) {
    case NODE_TEXT: buf_put(J, J->out, n->value.as.s->data, n->value.as.s->len); return FLOW_NORMAL;
    case NODE_PRINT: value_str(J, J->out, eval(J, n->a, s), n->line); return FLOW_NORMAL;
    case NODE_IF: return exec_body(J, value_truthy(eval(J, n->a, s)) ? &n->body : &n->else_body, s);
    case NODE_FOR: return exec_for(J, n, s);
    case NODE_SET: assign(J, n->a, eval(J, n->b, s), s); return FLOW_NORMAL;
    case NODE_MACRO: {
        Macro *m = jinja_alloc(J, sizeof(Macro));
        m->node = n;
        m->closure = s;
        dict_set_cstr(J, s->vars, n->name, (Value){.kind = VAL_MACRO, .as.macro = m});
        return FLOW_NORMAL;
    }
    case NODE_BREAK: return FLOW_BREAK;
    case NODE_CONTINUE: return FLOW_CONTINUE;
    case NODE_BLOCK: return exec_body(J, &n->body, s);
    default: jinja_fail(J, n->line, "internal error: expression executed as a statement");
    }
}

static int exec_body(Jinja *J, const NodeList *body, Scope *s) {
    if (++J->depth > JINJA_MAX_DEPTH * 2) jinja_fail(J, 0, "blocks nest too deeply");
    int flow = FLOW_NORMAL;
    for (size_t i = 0; i < body->n && flow == FLOW_NORMAL; i++) flow = exec_node(J, body->items[i], s);
    J->depth--;
    return flow;
}

void jinja_render(Jinja *J, const NodeList *body, Scope *scope) {
    J->depth = 0;
    exec_body(J, body, scope);
}
