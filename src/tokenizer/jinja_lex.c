/* jinja_lex.c — tokenizer for the Jinja subset, reproducing jinja2 3.1's lexer
 * as transformers configures it: newlines normalized to \n, one trailing
 * newline dropped, trim_blocks (a block or comment tag eats the one newline
 * after it), lstrip_blocks (spaces before a block or comment tag on its own line
 * are dropped), and the explicit '-' / '+' whitespace controls. Not supported:
 * line statements, custom delimiters, {% raw %} (it reaches the parser as an
 * unknown statement and fails there). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <utf8proc.h>

#include "tokenizer/jinja.h"

static void emit(Jinja *J, TokenKind kind, int line, const char *text, size_t len) {
    if (J->n_tokens % 256 == 0) J->tokens = jinja_realloc(J, J->tokens, (J->n_tokens + 256) * sizeof(Token));
    Token *t = &J->tokens[J->n_tokens++];
    memset(t, 0, sizeof *t);
    t->kind = kind;
    t->line = line;
    t->text = text;
    t->len = len;
}

static int count_newlines(const char *s, const char *end) {
    int n = 0;
    for (; s < end; s++) n += *s == '\n';
    return n;
}

static const char *copy_text(Jinja *J, const char *s, size_t n) {
    char *t = jinja_alloc(J, n + 1);
    memcpy(t, s, n);
    return t;
}

static int hex_value(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* Python's unicode-escape decoding of a string literal's body. */
static void unescape(Jinja *J, Buf *b, const char *s, size_t n, int line) {
    for (size_t i = 0; i < n;) {
        if (s[i] != '\\' || i + 1 >= n) {
            buf_put(J, b, s + i, 1);
            i++;
            continue;
        }
        char c = s[i + 1];
        i += 2;
        int32_t cp = -1;
        switch (c) {
        case '\n': continue;
        case '\\': cp = '\\'; break;
        case '\'': cp = '\''; break;
        case '"': cp = '"'; break;
        case 'a': cp = 7; break;
        case 'b': cp = 8; break;
        case 'f': cp = 12; break;
        case 'n': cp = 10; break;
        case 'r': cp = 13; break;
        case 't': cp = 9; break;
        case 'v': cp = 11; break;
        case 'x': case 'u': case 'U': {
            int digits = c == 'x' ? 2 : c == 'u' ? 4 : 8;
            cp = 0;
            for (int k = 0; k < digits; k++) {
                int h = i < n ? hex_value(s[i]) : -1;
                if (h < 0) jinja_fail(J, line, "truncated \\%c escape in string literal", c);
                cp = cp * 16 + h;
                i++;
                if (cp > 0x10ffff) jinja_fail(J, line, "invalid \\%c escape in string literal", c);
            }
            break;
        }
        case 'N': jinja_fail(J, line, "unsupported: \\N{...} escape in string literal");
        default:
            if (c >= '0' && c <= '7') {
                cp = c - '0';
                for (int k = 0; k < 2 && i < n && s[i] >= '0' && s[i] <= '7'; k++) cp = cp * 8 + (s[i++] - '0');
            } else if ((unsigned char)c >= 0x80) {
                /* Python backslash-escapes non-ASCII before decoding: "\\é" reads as the text "\\xe9" */
                int32_t raw;
                size_t k = utf8_next(s, n, i - 1, &raw);
                if (raw < 0x100) buf_printf(J, b, "\\x%02x", (unsigned)raw);
                else if (raw < 0x10000) buf_printf(J, b, "\\u%04x", (unsigned)raw);
                else buf_printf(J, b, "\\U%08x", (unsigned)raw);
                i += k - 1;
                continue;
            } else {
                buf_put(J, b, s + i - 2, 1); /* unknown escapes keep their backslash */
                i -= 1;
                continue;
            }
        }
        if (cp == 0) jinja_fail(J, line, "unsupported: NUL character in string literal");
        if (cp >= 0xd800 && cp <= 0xdfff) jinja_fail(J, line, "unsupported: surrogate escape in string literal");
        utf8_put(J, b, cp);
    }
}

/* Byte length of an identifier character at p (Python identifiers, as jinja2
 * 3 accepts them: letters, '_', and after the first, digits and marks), or 0. */
static size_t name_char_len(const char *p, const char *end, bool first) {
    unsigned char c = (unsigned char)*p;
    if (c < 0x80) return isalpha(c) || c == '_' || (!first && isdigit(c)) ? 1 : 0;
    int32_t cp;
    size_t n = utf8_next(p, (size_t)(end - p), 0, &cp);
    if (n == 1) return 0;
    switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT: case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_NL: return n;
    case UTF8PROC_CATEGORY_MN: case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ND: case UTF8PROC_CATEGORY_PC:
        return first ? 0 : n;
    default: return 0;
    }
}

static const char *const OPERATORS[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/", "*", "%", "~",
                                        "[", "]", "(", ")", "{", "}", ">", "<", "=", ".", ":", "|", ",", ";"};

/* Lexes the inside of a {{ }} or {% %} tag starting at p; returns the position
 * after the end delimiter and sets *sign to its whitespace control. */
static const char *lex_tag(Jinja *J, const char *src, const char *end, const char *p, bool block, int *line,
                           char *sign) {
    char stack[JINJA_MAX_DEPTH];
    int depth = 0;
    int start_line = *line;
    for (;;) {
        for (size_t n; (n = space_at(p, end)) > 0; p += n) *line += *p == '\n';
        if (!*p) jinja_fail(J, start_line, "unexpected end of template: the tag opened here is never closed");
        if (depth == 0) {
            if (block) {
                if ((p[0] == '-' || p[0] == '+') && p[1] == '%' && p[2] == '}') {
                    *sign = p[0];
                    emit(J, TOK_BLOCK_END, *line, "%}", 2);
                    return p + 3;
                }
                if (p[0] == '%' && p[1] == '}') {
                    *sign = 0;
                    emit(J, TOK_BLOCK_END, *line, "%}", 2);
                    return p + 2;
                }
            } else {
                if (p[0] == '-' && p[1] == '}' && p[2] == '}') {
                    *sign = '-';
                    emit(J, TOK_VAR_END, *line, "}}", 2);
                    return p + 3;
                }
                if (p[0] == '}' && p[1] == '}') {
                    *sign = 0;
                    emit(J, TOK_VAR_END, *line, "}}", 2);
                    return p + 2;
                }
            }
        }
        unsigned char c = (unsigned char)*p;
        if (isdigit(c)) {
            const char *s = p;
            bool is_float = false;
            if (c == '0' && (p[1] == 'x' || p[1] == 'X' || p[1] == 'o' || p[1] == 'O' || p[1] == 'b' || p[1] == 'B'))
                jinja_fail(J, *line, "unsupported: hexadecimal, octal or binary integer literal");
            while (isdigit((unsigned char)*p) || (*p == '_' && isdigit((unsigned char)p[1]))) p++;
            bool after_dot = s > src && s[-1] == '.';
            if (!after_dot && *p == '.' && isdigit((unsigned char)p[1])) {
                is_float = true;
                p++;
                while (isdigit((unsigned char)*p) || (*p == '_' && isdigit((unsigned char)p[1]))) p++;
            }
            if (!after_dot && (*p == 'e' || *p == 'E')) {
                const char *e = p + 1;
                if (*e == '+' || *e == '-') e++;
                if (isdigit((unsigned char)*e)) {
                    is_float = true;
                    p = e;
                    while (isdigit((unsigned char)*p) || (*p == '_' && isdigit((unsigned char)p[1]))) p++;
                }
            }
            char digits[128];
            size_t nd = 0;
            for (const char *q = s; q < p; q++) {
                if (*q == '_') continue;
                if (nd + 1 >= sizeof digits) jinja_fail(J, *line, "number literal too long");
                digits[nd++] = *q;
            }
            digits[nd] = '\0';
            emit(J, is_float ? TOK_FLOAT : TOK_INT, *line, copy_text(J, s, (size_t)(p - s)), (size_t)(p - s));
            Token *t = &J->tokens[J->n_tokens - 1];
            if (is_float) {
                t->f = strtod(digits, NULL);
                if (isinf(t->f)) jinja_fail(J, *line, "unsupported: float literal out of range");
            } else {
                if (digits[0] == '0' && nd > 1) {
                    for (size_t k = 1; k < nd; k++)
                        if (digits[k] != '0') jinja_fail(J, *line, "unsupported: integer literal with leading zero");
                }
                errno = 0;
                long long v = strtoll(digits, NULL, 10);
                if (errno == ERANGE) jinja_fail(J, *line, "unsupported: integer literal beyond 64 bits");
                t->i = v;
            }
            continue;
        }
        if (isalpha(c) || c == '_' || name_char_len(p, end, true)) {
            const char *s = p;
            for (size_t k; (k = name_char_len(p, end, p == s)) > 0;) p += k;
            emit(J, TOK_NAME, *line, copy_text(J, s, (size_t)(p - s)), (size_t)(p - s));
            continue;
        }
        if (c == '\'' || c == '"') {
            const char *s = ++p;
            while (*p && *p != (char)c) {
                if (*p == '\\' && p[1]) p++;
                p++;
            }
            if (!*p) jinja_fail(J, *line, "unterminated string literal");
            Buf b = {0};
            unescape(J, &b, s, (size_t)(p - s), *line);
            emit(J, TOK_STRING, *line, b.data ? b.data : "", b.len);
            *line += count_newlines(s, p);
            p++;
            continue;
        }
        const char *op = NULL;
        for (size_t k = 0; k < sizeof OPERATORS / sizeof *OPERATORS; k++) {
            size_t n = strlen(OPERATORS[k]);
            if (strncmp(p, OPERATORS[k], n) == 0) {
                op = OPERATORS[k];
                break;
            }
        }
        if (!op) {
            int32_t cp;
            int len = (int)utf8_next(p, (size_t)(end - p), 0, &cp);
            jinja_fail(J, *line, "unexpected character '%.*s' in tag", len, p);
        }
        if (op[0] == '(' || op[0] == '[' || op[0] == '{') {
            if (depth >= JINJA_MAX_DEPTH) jinja_fail(J, *line, "brackets nest too deeply");
            stack[depth++] = op[0] == '(' ? ')' : op[0] == '[' ? ']' : '}';
        } else if (op[0] == ')' || op[0] == ']' || op[0] == '}') {
            if (depth == 0) jinja_fail(J, *line, "unexpected '%c'", op[0]);
            if (stack[depth - 1] != op[0]) jinja_fail(J, *line, "unexpected '%c', expected '%c'", op[0], stack[depth - 1]);
            depth--;
        }
        emit(J, TOK_OP, *line, op, strlen(op));
        p += strlen(op);
    }
}

/* Skips what follows an end delimiter: all whitespace after '-', one newline
 * after a block or comment tag (trim_blocks), nothing after '+'. */
static const char *after_tag(const char *p, const char *end, char sign, bool trim_newline, int *line) {
    if (sign == '-') {
        for (size_t n; (n = space_at(p, end)) > 0; p += n) *line += *p == '\n';
    } else if (sign == 0 && trim_newline && *p == '\n') {
        p++;
        (*line)++;
    }
    return p;
}

void jinja_lex(Jinja *J, const char *source) {
    /* normalize newlines, drop one trailing newline (keep_trailing_newline=False) */
    size_t n = strlen(source);
    char *src = jinja_alloc(J, n + 1);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (source[i] == '\r') {
            src[m++] = '\n';
            if (source[i + 1] == '\n') i++;
        } else {
            src[m++] = source[i];
        }
    }
    if (m > 0 && src[m - 1] == '\n') m--;
    src[m] = '\0';
    const char *end = src + m;

    const char *p = src;
    int line = 1;
    bool line_starting = true;
    for (;;) {
        const char *tag = p;
        while ((tag = strchr(tag, '{')) && tag[1] != '{' && tag[1] != '%' && tag[1] != '#') tag++;
        if (!tag) {
            if (p < end) emit(J, TOK_TEXT, line, p, (size_t)(end - p));
            break;
        }
        char kind = tag[1];
        char sign = tag[2] == '-' || tag[2] == '+' ? tag[2] : 0;
        const char *text_end = tag;
        if (sign == '-') {
            for (size_t k; (k = space_before(p, text_end)) > 0;) text_end -= k;
        } else if (sign != '+' && kind != '{') {
            const char *line_start = tag;
            while (line_start > p && line_start[-1] != '\n') line_start--;
            if ((line_start > p || line_starting) && line_start < tag) {
                const char *q = line_start;
                for (size_t k; q < tag && (k = space_at(q, tag)) > 0;) q += k;
                if (q == tag) text_end = line_start;
            }
        }
        if (text_end > p) emit(J, TOK_TEXT, line, p, (size_t)(text_end - p));
        line += count_newlines(p, tag);
        const char *q = tag + 2 + (sign ? 1 : 0);
        if (kind == '#') {
            const char *close = strstr(q, "#}");
            if (!close && q == end) break; /* jinja2 accepts a bare '{#' as the template's last characters */
            if (!close) jinja_fail(J, line, "missing end of comment tag");
            char end_sign = 0;
            const char *after = close + 2;
            if (close > q && (close[-1] == '-' || close[-1] == '+')) end_sign = close[-1];
            line += count_newlines(q, close);
            p = after_tag(after, end, end_sign, true, &line);
        } else {
            bool block = kind == '%';
            emit(J, block ? TOK_BLOCK_BEGIN : TOK_VAR_BEGIN, line, block ? "{%" : "{{", 2);
            char end_sign = 0;
            const char *after = lex_tag(J, src, end, q, block, &line, &end_sign);
            p = after_tag(after, end, end_sign, block, &line);
        }
        line_starting = p > src && p[-1] == '\n';
    }
    emit(J, TOK_EOF, line, "", 0);
    /* TEXT tokens point into src; give each its own terminated copy */
    for (size_t i = 0; i < J->n_tokens; i++) {
        Token *t = &J->tokens[i];
        if (t->kind == TOK_TEXT) t->text = copy_text(J, t->text, t->len);
    }
}
