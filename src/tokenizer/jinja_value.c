/* jinja_value.c — the Jinja interpreter's arena, output buffers and values:
 * construction, Python truthiness/equality, and Python's str(), repr() and
 * json.dumps() text of them. Not the evaluator (jinja_eval.c). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "tokenizer/jinja.h"

/* ---------------------------------------------------------------- arena */

struct Chunk {
    Chunk *prev, *next;
    size_t size;
    max_align_t data[];
};

/* Errors are one line: a line break that came in with a name or a
 * raise_exception() message is written as \n. */
_Noreturn void jinja_fail(Jinja *J, int line, const char *fmt, ...) {
    char raw[ERR_LEN], msg[ERR_LEN];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    size_t n = 0;
    for (const char *p = raw; *p && n + 2 < sizeof msg; p++) {
        if (*p == '\n' || *p == '\r') {
            msg[n++] = '\\';
            msg[n++] = *p == '\n' ? 'n' : 'r';
        } else {
            msg[n++] = *p;
        }
    }
    msg[n] = '\0';
    if (line > 0)
        snprintf(J->err, sizeof J->err, "chat template: %.440s at line %d", msg, line);
    else
        snprintf(J->err, sizeof J->err, "chat template: %.480s", msg);
    longjmp(J->jump, 1);
}

static void arena_charge(Jinja *J, size_t n) {
    if (n > JINJA_ARENA_LIMIT || J->arena_bytes > JINJA_ARENA_LIMIT - n)
        jinja_fail(J, 0, "rendering needs more than %zu MiB of memory", JINJA_ARENA_LIMIT >> 20);
    J->arena_bytes += n;
}

void *jinja_alloc(Jinja *J, size_t n) {
    arena_charge(J, n);
    Chunk *c = xmalloc(sizeof(Chunk) + n);
    memset(c->data, 0, n);
    c->size = n;
    c->prev = NULL;
    c->next = J->chunks;
    if (J->chunks) J->chunks->prev = c;
    J->chunks = c;
    return c->data;
}

void *jinja_realloc(Jinja *J, void *p, size_t n) {
    if (!p) return jinja_alloc(J, n);
    Chunk *c = (Chunk *)((char *)p - offsetof(Chunk, data));
    if (n > c->size) arena_charge(J, n - c->size);
    c = xrealloc(c, sizeof(Chunk) + n);
    c->size = n;
    if (c->prev) c->prev->next = c; else J->chunks = c;
    if (c->next) c->next->prev = c;
    return c->data;
}

void jinja_free_all(Jinja *J) {
    Chunk *c = J->chunks;
    while (c) {
        Chunk *next = c->next;
        free(c);
        c = next;
    }
    J->chunks = NULL;
    J->arena_bytes = 0;
}

/* ---------------------------------------------------------------- buffers */

void buf_put(Jinja *J, Buf *b, const char *s, size_t n) {
    if (n == 0) return;
    if (n > JINJA_OUTPUT_LIMIT || b->len > (size_t)JINJA_OUTPUT_LIMIT - n)
        jinja_fail(J, 0, "rendered text exceeds %d MiB", JINJA_OUTPUT_LIMIT >> 20);
    if (b->len + n + 1 > b->cap) {
        size_t cap = b->cap ? b->cap : 64;
        while (cap < b->len + n + 1) cap *= 2;
        b->data = jinja_realloc(J, b->data, cap);
        b->cap = cap;
    }
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = '\0';
}

void buf_puts(Jinja *J, Buf *b, const char *s) { buf_put(J, b, s, strlen(s)); }

void buf_printf(Jinja *J, Buf *b, const char *fmt, ...) {
    char tmp[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
    va_end(ap);
    COLT_ASSERT(n >= 0 && (size_t)n < sizeof tmp);
    buf_put(J, b, tmp, (size_t)n);
}

/* ---------------------------------------------------------------- UTF-8 */

/* Decodes the code point at s[i]; invalid bytes decode as themselves (one
 * byte each) so that lengths and slices stay total on non-UTF-8 input. */
size_t utf8_next(const char *s, size_t len, size_t i, int32_t *cp) {
    utf8proc_int32_t c;
    utf8proc_ssize_t n = utf8proc_iterate((const utf8proc_uint8_t *)s + i, (utf8proc_ssize_t)(len - i), &c);
    if (n <= 0) {
        *cp = (unsigned char)s[i];
        return 1;
    }
    *cp = c;
    return (size_t)n;
}

void utf8_put(Jinja *J, Buf *b, int32_t cp) {
    utf8proc_uint8_t tmp[4];
    utf8proc_ssize_t n = utf8proc_encode_char(cp, tmp);
    buf_put(J, b, (const char *)tmp, (size_t)n);
}

size_t utf8_count(const char *s, size_t len) {
    size_t count = 0;
    for (size_t i = 0; i < len; count++) {
        int32_t cp;
        i += utf8_next(s, len, i, &cp);
    }
    return count;
}

static bool cp_is_space(int32_t c) {
    return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
           c == 0x3000;
}

/* Byte length of the Python whitespace character (str.isspace, regex \s) that
 * starts at s, or 0. */
size_t space_at(const char *s, const char *end) {
    if (s >= end) return 0;
    int32_t cp;
    size_t n = utf8_next(s, (size_t)(end - s), 0, &cp);
    if (n == 1 && (unsigned char)s[0] >= 0x80) return 0;
    return cp_is_space(cp) ? n : 0;
}

/* Byte length of a Python whitespace character that ends at end, or 0. */
size_t space_before(const char *start, const char *end) {
    for (size_t n = 1; n <= 3 && (size_t)(end - start) >= n; n++) {
        if (space_at(end - n, end) == n) return n;
    }
    return 0;
}

/* ---------------------------------------------------------------- values */

Value value_undefined(void) { return (Value){.kind = VAL_UNDEFINED}; }
Value value_none(void) { return (Value){.kind = VAL_NONE}; }
Value value_bool(bool b) { return (Value){.kind = VAL_BOOL, .as.b = b}; }
Value value_int(int64_t i) { return (Value){.kind = VAL_INT, .as.i = i}; }
Value value_float(double f) { return (Value){.kind = VAL_FLOAT, .as.f = f}; }

Value value_string(Jinja *J, const char *s, size_t n) {
    Str *str = jinja_alloc(J, sizeof(Str) + n + 1);
    str->len = n;
    if (n) memcpy(str->data, s, n);
    str->data[n] = '\0';
    return (Value){.kind = VAL_STRING, .as.s = str};
}

Value value_cstring(Jinja *J, const char *s) { return value_string(J, s, strlen(s)); }

Value value_from_buf(Jinja *J, const Buf *b) { return value_string(J, b->data ? b->data : "", b->len); }

List *list_new(Jinja *J, bool tuple) {
    List *l = jinja_alloc(J, sizeof(List));
    l->tuple = tuple;
    return l;
}

Value list_value(List *l, ListKind kind) {
    l->kind = kind;
    return (Value){.kind = VAL_LIST, .as.list = l};
}

void list_push(Jinja *J, List *l, Value v) {
    if (l->n == l->cap) {
        l->cap = l->cap ? l->cap * 2 : 4;
        l->items = jinja_realloc(J, l->items, l->cap * sizeof(Value));
    }
    l->items[l->n++] = v;
}

Dict *dict_new(Jinja *J, DictKind kind) {
    Dict *d = jinja_alloc(J, sizeof(Dict));
    d->kind = kind;
    return d;
}

static bool dict_find(const Dict *d, Value key, size_t *index) {
    for (size_t i = 0; i < d->n; i++) {
        if (value_equal(d->keys[i], key)) {
            *index = i;
            return true;
        }
    }
    return false;
}

void dict_set(Jinja *J, Dict *d, Value key, Value v) {
    size_t i;
    if (dict_find(d, key, &i)) {
        d->values[i] = v;
        return;
    }
    if (d->n == d->cap) {
        d->cap = d->cap ? d->cap * 2 : 4;
        d->keys = jinja_realloc(J, d->keys, d->cap * sizeof(Value));
        d->values = jinja_realloc(J, d->values, d->cap * sizeof(Value));
    }
    d->keys[d->n] = key;
    d->values[d->n] = v;
    d->n++;
}

bool dict_get(const Dict *d, Value key, Value *out) {
    size_t i;
    if (!dict_find(d, key, &i)) return false;
    *out = d->values[i];
    return true;
}

bool dict_get_cstr(const Dict *d, const char *key, Value *out) {
    size_t n = strlen(key);
    for (size_t i = 0; i < d->n; i++) {
        Value k = d->keys[i];
        if (k.kind == VAL_STRING && k.as.s->len == n && memcmp(k.as.s->data, key, n) == 0) {
            *out = d->values[i];
            return true;
        }
    }
    return false;
}

void dict_set_cstr(Jinja *J, Dict *d, const char *key, Value v) { dict_set(J, d, value_cstring(J, key), v); }

bool value_truthy(Value v) {
    switch (v.kind) {
    case VAL_UNDEFINED:
    case VAL_NONE: return false;
    case VAL_BOOL: return v.as.b;
    case VAL_INT: return v.as.i != 0;
    case VAL_FLOAT: return v.as.f != 0.0;
    case VAL_STRING: return v.as.s->len > 0;
    case VAL_LIST: return v.as.list->kind == LIST_GENERATOR || v.as.list->n > 0;
    case VAL_DICT: return v.as.dict->kind != DICT_PLAIN || v.as.dict->n > 0;
    default: return true;
    }
}

static bool is_number(Value v) { return v.kind == VAL_BOOL || v.kind == VAL_INT || v.kind == VAL_FLOAT; }

static double number_as_double(Value v) {
    return v.kind == VAL_FLOAT ? v.as.f : v.kind == VAL_INT ? (double)v.as.i : (double)v.as.b;
}

/* Python ==. */
bool value_equal(Value a, Value b) {
    if (is_number(a) && is_number(b)) {
        if (a.kind != VAL_FLOAT && b.kind != VAL_FLOAT) {
            int64_t x = a.kind == VAL_INT ? a.as.i : a.as.b, y = b.kind == VAL_INT ? b.as.i : b.as.b;
            return x == y;
        }
        return number_as_double(a) == number_as_double(b);
    }
    if (a.kind != b.kind) return false;
    switch (a.kind) {
    case VAL_UNDEFINED:
    case VAL_NONE: return true;
    case VAL_STRING: return a.as.s->len == b.as.s->len && memcmp(a.as.s->data, b.as.s->data, a.as.s->len) == 0;
    case VAL_LIST:
        if (a.as.list->kind != b.as.list->kind) return false;
        if (a.as.list->kind == LIST_GENERATOR || a.as.list->kind == LIST_VIEW) return a.as.list == b.as.list;
        if (a.as.list->tuple != b.as.list->tuple || a.as.list->n != b.as.list->n) return false;
        for (size_t i = 0; i < a.as.list->n; i++)
            if (!value_equal(a.as.list->items[i], b.as.list->items[i])) return false;
        return true;
    case VAL_DICT:
        if (a.as.dict->kind != DICT_PLAIN || b.as.dict->kind != DICT_PLAIN) return a.as.dict == b.as.dict;
        if (a.as.dict->n != b.as.dict->n) return false;
        for (size_t i = 0; i < a.as.dict->n; i++) {
            Value other;
            if (!dict_get(b.as.dict, a.as.dict->keys[i], &other) || !value_equal(a.as.dict->values[i], other))
                return false;
        }
        return true;
    case VAL_FUNCTION: return a.as.function == b.as.function;
    case VAL_METHOD: return a.as.method == b.as.method;
    case VAL_MACRO: return a.as.macro == b.as.macro;
    default: return false;
    }
}

const char *value_type_name(Value v) {
    switch (v.kind) {
    case VAL_UNDEFINED: return "undefined";
    case VAL_NONE: return "NoneType";
    case VAL_BOOL: return "bool";
    case VAL_INT: return "int";
    case VAL_FLOAT: return "float";
    case VAL_STRING: return "str";
    case VAL_LIST:
        switch (v.as.list->kind) {
        case LIST_GENERATOR: return "generator";
        case LIST_VIEW: return "dict view";
        case LIST_RANGE: return "range";
        default: return v.as.list->tuple ? "tuple" : "list";
        }
    case VAL_DICT: return v.as.dict->kind == DICT_NAMESPACE ? "namespace" : v.as.dict->kind == DICT_LOOP ? "loop" : "dict";
    case VAL_FUNCTION: return "function";
    case VAL_METHOD: return "method";
    case VAL_MACRO: return "macro";
    }
    return "?";
}

/* Python repr(float): the shortest digits that round-trip, fixed notation for
 * decimal exponents in [-4, 16), scientific otherwise. */
void float_repr(char *out, size_t n, double f) {
    if (isnan(f)) { snprintf(out, n, "nan"); return; }
    if (isinf(f)) { snprintf(out, n, f < 0 ? "-inf" : "inf"); return; }
    char sci[40];
    for (int prec = 1; prec <= 17; prec++) {
        snprintf(sci, sizeof sci, "%.*e", prec - 1, f);
        if (strtod(sci, NULL) == f) break;
    }
    /* sci is [-]d[.ddd]e[+-]XX */
    bool negative = sci[0] == '-';
    const char *p = sci + negative;
    char digits[20];
    size_t nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.') digits[nd++] = *p;
    digits[nd] = '\0';
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') digits[--nd] = '\0';
    char body[64];
    size_t k = 0;
    if (exp10 >= -4 && exp10 < 16) {
        if (exp10 < 0) {
            k += (size_t)snprintf(body + k, sizeof body - k, "0.");
            for (int i = 0; i < -exp10 - 1; i++) body[k++] = '0';
            for (size_t i = 0; i < nd; i++) body[k++] = digits[i];
        } else {
            for (int i = 0; i <= exp10; i++) body[k++] = (size_t)i < nd ? digits[i] : '0';
            body[k++] = '.';
            if ((size_t)exp10 + 1 < nd)
                for (size_t i = (size_t)exp10 + 1; i < nd; i++) body[k++] = digits[i];
            else
                body[k++] = '0';
        }
        body[k] = '\0';
    } else {
        body[k++] = digits[0];
        if (nd > 1) {
            body[k++] = '.';
            for (size_t i = 1; i < nd; i++) body[k++] = digits[i];
        }
        snprintf(body + k, sizeof body - k, "e%c%02d", exp10 < 0 ? '-' : '+', exp10 < 0 ? -exp10 : exp10);
    }
    snprintf(out, n, "%s%s", negative ? "-" : "", body);
}

static bool cp_printable(int32_t cp) {
    if (cp == ' ') return true;
    if (cp < 0x20 || cp == 0x7f) return false;
    if (cp < 0x7f) return true;
    switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_CC: case UTF8PROC_CATEGORY_CF: case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO: case UTF8PROC_CATEGORY_CN: case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP: case UTF8PROC_CATEGORY_ZS: return false;
    default: return true;
    }
}

static void string_repr(Jinja *J, Buf *b, const Str *s) {
    bool has_single = memchr(s->data, '\'', s->len) != NULL, has_double = memchr(s->data, '"', s->len) != NULL;
    char quote = has_single && !has_double ? '"' : '\'';
    buf_put(J, b, &quote, 1);
    for (size_t i = 0; i < s->len;) {
        int32_t cp;
        size_t n = utf8_next(s->data, s->len, i, &cp);
        if (cp == quote || cp == '\\') {
            buf_put(J, b, "\\", 1);
            buf_put(J, b, s->data + i, 1);
        } else if (cp == '\n') buf_puts(J, b, "\\n");
        else if (cp == '\r') buf_puts(J, b, "\\r");
        else if (cp == '\t') buf_puts(J, b, "\\t");
        else if (cp_printable(cp)) buf_put(J, b, s->data + i, n);
        else if (cp < 0x100) buf_printf(J, b, "\\x%02x", (unsigned)cp);
        else if (cp < 0x10000) buf_printf(J, b, "\\u%04x", (unsigned)cp);
        else buf_printf(J, b, "\\U%08x", (unsigned)cp);
        i += n;
    }
    buf_put(J, b, &quote, 1);
}

void value_repr(Jinja *J, Buf *b, Value v, int line) {
    switch (v.kind) {
    case VAL_STRING: string_repr(J, b, v.as.s); return;
    case VAL_LIST: {
        const List *l = v.as.list;
        if (l->kind != LIST_PLAIN) break;
        buf_puts(J, b, l->tuple ? "(" : "[");
        for (size_t i = 0; i < l->n; i++) {
            if (i) buf_puts(J, b, ", ");
            value_repr(J, b, l->items[i], line);
        }
        if (l->tuple && l->n == 1) buf_puts(J, b, ",");
        buf_puts(J, b, l->tuple ? ")" : "]");
        return;
    }
    case VAL_DICT:
        if (v.as.dict->kind == DICT_PLAIN) {
            const Dict *d = v.as.dict;
            buf_puts(J, b, "{");
            for (size_t i = 0; i < d->n; i++) {
                if (i) buf_puts(J, b, ", ");
                value_repr(J, b, d->keys[i], line);
                buf_puts(J, b, ": ");
                value_repr(J, b, d->values[i], line);
            }
            buf_puts(J, b, "}");
            return;
        }
        break;
    case VAL_UNDEFINED: buf_puts(J, b, "Undefined"); return;
    default: break;
    }
    value_str(J, b, v, line);
}

void value_str(Jinja *J, Buf *b, Value v, int line) {
    char tmp[64];
    switch (v.kind) {
    case VAL_UNDEFINED: return;
    case VAL_NONE: buf_puts(J, b, "None"); return;
    case VAL_BOOL: buf_puts(J, b, v.as.b ? "True" : "False"); return;
    case VAL_INT: buf_printf(J, b, "%lld", (long long)v.as.i); return;
    case VAL_FLOAT: float_repr(tmp, sizeof tmp, v.as.f); buf_puts(J, b, tmp); return;
    case VAL_STRING: buf_put(J, b, v.as.s->data, v.as.s->len); return;
    case VAL_LIST:
        if (v.as.list->kind != LIST_PLAIN) break;
        value_repr(J, b, v, line);
        return;
    case VAL_DICT:
        if (v.as.dict->kind == DICT_PLAIN) {
            value_repr(J, b, v, line);
            return;
        }
        break;
    default: break;
    }
    jinja_fail(J, line, "unsupported: rendering a %s object as text", value_type_name(v));
}

static void json_string(Jinja *J, Buf *b, const char *s, size_t len, bool ensure_ascii) {
    buf_put(J, b, "\"", 1);
    for (size_t i = 0; i < len;) {
        int32_t cp;
        size_t n = utf8_next(s, len, i, &cp);
        switch (cp) {
        case '"': buf_puts(J, b, "\\\""); break;
        case '\\': buf_puts(J, b, "\\\\"); break;
        case '\n': buf_puts(J, b, "\\n"); break;
        case '\r': buf_puts(J, b, "\\r"); break;
        case '\t': buf_puts(J, b, "\\t"); break;
        case '\b': buf_puts(J, b, "\\b"); break;
        case '\f': buf_puts(J, b, "\\f"); break;
        default:
            if (cp < 0x20) buf_printf(J, b, "\\u%04x", (unsigned)cp);
            else if (cp < 0x80 || !ensure_ascii) buf_put(J, b, s + i, n);
            else if (cp < 0x10000) buf_printf(J, b, "\\u%04x", (unsigned)cp);
            else {
                int32_t v = cp - 0x10000;
                buf_printf(J, b, "\\u%04x\\u%04x", (unsigned)(0xd800 + (v >> 10)), (unsigned)(0xdc00 + (v & 0x3ff)));
            }
        }
        i += n;
    }
    buf_put(J, b, "\"", 1);
}

static void json_newline(Jinja *J, Buf *b, const char *indent, int level) {
    buf_put(J, b, "\n", 1);
    for (int i = 0; i < level; i++) buf_puts(J, b, indent);
}

static int compare_str_values(const void *x, const void *y) {
    const Str *a = ((const Value *)x)->as.s, *b = ((const Value *)y)->as.s;
    size_t n = a->len < b->len ? a->len : b->len;
    int c = memcmp(a->data, b->data, n);
    return c ? c : (a->len > b->len) - (a->len < b->len);
}

void value_json(Jinja *J, Buf *b, Value v, bool ensure_ascii, const char *indent, const char *item_sep,
                const char *key_sep, bool sort_keys, int level, int line) {
    char tmp[64];
    if (level > JINJA_MAX_DEPTH) jinja_fail(J, line, "tojson: value nests too deeply");
    switch (v.kind) {
    case VAL_NONE: buf_puts(J, b, "null"); return;
    case VAL_BOOL: buf_puts(J, b, v.as.b ? "true" : "false"); return;
    case VAL_INT: buf_printf(J, b, "%lld", (long long)v.as.i); return;
    case VAL_FLOAT:
        if (isnan(v.as.f)) buf_puts(J, b, "NaN");
        else if (isinf(v.as.f)) buf_puts(J, b, v.as.f < 0 ? "-Infinity" : "Infinity");
        else { float_repr(tmp, sizeof tmp, v.as.f); buf_puts(J, b, tmp); }
        return;
    case VAL_STRING: json_string(J, b, v.as.s->data, v.as.s->len, ensure_ascii); return;
    case VAL_LIST: {
        const List *l = v.as.list;
        if (l->kind != LIST_PLAIN) break;
        if (l->n == 0) { buf_puts(J, b, "[]"); return; }
        buf_puts(J, b, "[");
        for (size_t i = 0; i < l->n; i++) {
            if (i) buf_puts(J, b, item_sep);
            if (indent) json_newline(J, b, indent, level + 1);
            value_json(J, b, l->items[i], ensure_ascii, indent, item_sep, key_sep, sort_keys, level + 1, line);
        }
        if (indent) json_newline(J, b, indent, level);
        buf_puts(J, b, "]");
        return;
    }
    case VAL_DICT: {
        const Dict *d = v.as.dict;
        if (d->kind != DICT_PLAIN) break;
        if (d->n == 0) { buf_puts(J, b, "{}"); return; }
        /* keys become strings the way json.dumps converts them */
        Value *keys = jinja_alloc(J, d->n * sizeof(Value));
        size_t *order = jinja_alloc(J, d->n * sizeof(size_t));
        for (size_t i = 0; i < d->n; i++) {
            Value k = d->keys[i];
            Buf kb = {0};
            switch (k.kind) {
            case VAL_STRING: keys[i] = k; break;
            case VAL_NONE: keys[i] = value_cstring(J, "null"); break;
            case VAL_BOOL: keys[i] = value_cstring(J, k.as.b ? "true" : "false"); break;
            case VAL_INT: case VAL_FLOAT: value_json(J, &kb, k, false, NULL, ", ", ": ", false, level, line);
                keys[i] = value_from_buf(J, &kb); break;
            default: jinja_fail(J, line, "tojson: keys must be str, int, float, bool or None, not %s", value_type_name(k));
            }
            order[i] = i;
        }
        if (sort_keys) {
            for (size_t i = 0; i < d->n; i++)
                if (d->keys[i].kind != VAL_STRING) jinja_fail(J, line, "unsupported: tojson(sort_keys=true) with non-string keys");
            /* stable insertion sort by key text over the indices */
            for (size_t i = 1; i < d->n; i++) {
                size_t cur = order[i], j = i;
                while (j > 0 && compare_str_values(&keys[order[j - 1]], &keys[cur]) > 0) {
                    order[j] = order[j - 1];
                    j--;
                }
                order[j] = cur;
            }
        }
        buf_puts(J, b, "{");
        for (size_t i = 0; i < d->n; i++) {
            size_t k = order[i];
            if (i) buf_puts(J, b, item_sep);
            if (indent) json_newline(J, b, indent, level + 1);
            json_string(J, b, keys[k].as.s->data, keys[k].as.s->len, ensure_ascii);
            buf_puts(J, b, key_sep);
            value_json(J, b, d->values[k], ensure_ascii, indent, item_sep, key_sep, sort_keys, level + 1, line);
        }
        if (indent) json_newline(J, b, indent, level);
        buf_puts(J, b, "}");
        return;
    }
    default: break;
    }
    jinja_fail(J, line, "tojson: object of type %s is not JSON serializable", value_type_name(v));
}
