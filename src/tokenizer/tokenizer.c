/* tokenizer.c — Hugging Face tokenizer.json BPE tokenizers (byte-level as in
 * GPT-2/Qwen/Llama-3, sentencepiece-style as in Llama-2/Mistral/TinyStories),
 * following the `tokenizers` crate step by step: added tokens are split out
 * first, then normalizer -> pre-tokenizer -> BPE model; decode runs the decoder
 * chain. JSON comes from jansson, regexes from PCRE2, normalization from
 * utf8proc.
 *
 * A loaded Tokenizer is read-only: encode/decode may run on many threads at
 * once (the only mutable state, a cache of short pre-tokens, is per thread).
 *
 * It is not a trainer, does not add special tokens (no post-processor), does
 * not compute offsets, and supports only the BPE model. Components it does not
 * know are load errors that name them, never silently wrong ids. */
#include "tokenizer/tokenizer.h"

#include <jansson.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/error.h"
#include "core/fileio.h"

/* ------------------------------------------------------------------------ */
/* Byte buffers and UTF-8                                                    */
/* ------------------------------------------------------------------------ */

typedef struct Buf {
    char *data;
    size_t len, cap;
} Buf;

static void buf_reserve(Buf *b, size_t extra) {
    if (b->len + extra + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < b->len + extra + 1) cap *= 2;
    b->data = xrealloc(b->data, cap);
    b->cap = cap;
}

static void buf_append(Buf *b, const void *p, size_t n) {
    buf_reserve(b, n);
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = '\0';
}

static void buf_append_cp(Buf *b, int32_t cp) {
    unsigned char tmp[4];
    utf8proc_ssize_t n = utf8proc_encode_char(cp, tmp);
    buf_append(b, tmp, (size_t)n);
}

/* Length of the valid UTF-8 character at s[0..n), or 0 if it is not one
 * (truncated, overlong, surrogate, > U+10FFFF). *consumed gets the length of
 * the maximal invalid prefix when it is not, which is what from_utf8_lossy
 * replaces by one U+FFFD. */
static size_t utf8_char_len(const unsigned char *s, size_t n, size_t *consumed) {
    unsigned char c = s[0];
    size_t need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c < 0x80) return 1;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        need = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        if (consumed) *consumed = 1;
        return 0;
    }
    size_t i = 1;
    for (; i < need && i < n; i++) {
        unsigned char lim_lo = i == 1 ? lo : 0x80, lim_hi = i == 1 ? hi : 0xBF;
        if (s[i] < lim_lo || s[i] > lim_hi) break;
    }
    if (i == need) return need;
    if (consumed) *consumed = i;
    return 0;
}

/* Returns the offset of the first invalid byte, or n if s is valid UTF-8. */
static size_t utf8_first_invalid(const char *text, size_t n) {
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t l = utf8_char_len(s + i, n - i, NULL);
        if (!l) return i;
        i += l;
    }
    return n;
}

/* Appends s to out with invalid sequences replaced by U+FFFD, as Rust's
 * String::from_utf8_lossy does (one replacement per maximal invalid prefix). */
static void utf8_append_lossy(Buf *out, const char *text, size_t n) {
    const unsigned char *s = (const unsigned char *)text;
    size_t i = 0, run = 0;
    while (i < n) {
        size_t bad = 0, l = s[i] < 0x80 ? 1 : utf8_char_len(s + i, n - i, &bad);
        if (l) {
            i += l;
            continue;
        }
        buf_append(out, s + run, i - run);
        buf_append(out, "\xEF\xBF\xBD", 3);
        i += bad;
        run = i;
    }
    buf_append(out, s + run, n - run);
}

/* Decodes one character of valid UTF-8; returns its length. */
static size_t utf8_decode(const char *s, size_t n, int32_t *cp) {
    utf8proc_ssize_t l = utf8proc_iterate((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, cp);
    if (l <= 0) {
        *cp = (unsigned char)s[0];
        return 1;
    }
    return (size_t)l;
}

/* Rust's char::is_whitespace (the Unicode White_Space property). */
static bool cp_is_whitespace(int32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* Regex \w as the `regex` crate has it: letters, marks, decimal digits,
 * connector punctuation. */
static bool cp_is_word(int32_t c) {
    if (c < 0x80) return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
    switch (utf8proc_category(c)) {
    case UTF8PROC_CATEGORY_LU: case UTF8PROC_CATEGORY_LL: case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM: case UTF8PROC_CATEGORY_LO: case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC: case UTF8PROC_CATEGORY_ME: case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL: case UTF8PROC_CATEGORY_PC:
        return true;
    default:
        return c == 0x200C || c == 0x200D;
    }
}

/* Last character of s[0..n) (valid UTF-8), or -1 if empty. */
static int32_t utf8_last_cp(const char *s, size_t n) {
    if (!n) return -1;
    size_t i = n - 1;
    while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
    int32_t cp;
    utf8_decode(s + i, n - i, &cp);
    return cp;
}

/* ------------------------------------------------------------------------ */
/* Hash maps: token string -> id, (left id, right id) -> merge               */
/* ------------------------------------------------------------------------ */

static uint64_t hash_bytes(const void *p, size_t n) {
    const unsigned char *s = p;
    uint64_t h = 0x9E3779B97F4A7C15ull ^ (n * 0x100000001B3ull);
    while (n >= 8) {
        uint64_t v;
        memcpy(&v, s, 8);
        h = (h ^ v) * 0xff51afd7ed558ccdull;
        h ^= h >> 32;
        s += 8;
        n -= 8;
    }
    uint64_t v = 0;
    memcpy(&v, s, n);
    h = (h ^ v) * 0xc4ceb9fe1a85ec53ull;
    h ^= h >> 29;
    h *= 0x94D049BB133111EBull;
    h ^= h >> 31;
    return h;
}

static uint64_t hash_u64(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ull;
    x ^= x >> 33;
    return x;
}

typedef struct StrEntry {
    const char *key; /* NULL: empty slot; points into storage owned elsewhere */
    uint32_t len;
    int32_t val;
} StrEntry;

typedef struct StrMap {
    StrEntry *slots;
    size_t mask;
} StrMap;

static void strmap_init(StrMap *m, size_t n) {
    size_t cap = 16;
    while (cap < 2 * n + 2) cap *= 2;
    m->slots = xcalloc(cap, sizeof(StrEntry));
    m->mask = cap - 1;
}

/* Inserts or overwrites (a later duplicate wins, like a Rust HashMap collect). */
static void strmap_put(StrMap *m, const char *key, size_t len, int32_t val) {
    size_t i = hash_bytes(key, len) & m->mask;
    while (m->slots[i].key) {
        if (m->slots[i].len == len && memcmp(m->slots[i].key, key, len) == 0) {
            m->slots[i].val = val;
            return;
        }
        i = (i + 1) & m->mask;
    }
    m->slots[i] = (StrEntry){key, (uint32_t)len, val};
}

static int32_t strmap_get(const StrMap *m, const char *key, size_t len) {
    if (!m->slots) return -1;
    size_t i = hash_bytes(key, len) & m->mask;
    while (m->slots[i].key) {
        if (m->slots[i].len == len && memcmp(m->slots[i].key, key, len) == 0) return m->slots[i].val;
        i = (i + 1) & m->mask;
    }
    return -1;
}

typedef struct MergeEntry {
    uint64_t key; /* left id << 32 | right id; UINT64_MAX = empty */
    uint32_t rank;
    int32_t new_id;
} MergeEntry;

typedef struct MergeMap {
    MergeEntry *slots;
    size_t mask;
} MergeMap;

static void mergemap_init(MergeMap *m, size_t n) {
    size_t cap = 16;
    while (cap < 2 * n + 2) cap *= 2;
    m->slots = xmalloc(cap * sizeof(MergeEntry));
    for (size_t i = 0; i < cap; i++) m->slots[i].key = UINT64_MAX;
    m->mask = cap - 1;
}

static void mergemap_put(MergeMap *m, int32_t a, int32_t b, uint32_t rank, int32_t new_id) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t i = hash_u64(key) & m->mask;
    while (m->slots[i].key != UINT64_MAX && m->slots[i].key != key) i = (i + 1) & m->mask;
    m->slots[i] = (MergeEntry){key, rank, new_id};
}

static const MergeEntry *mergemap_get(const MergeMap *m, int32_t a, int32_t b) {
    uint64_t key = (uint64_t)(uint32_t)a << 32 | (uint32_t)b;
    size_t i = hash_u64(key) & m->mask;
    while (m->slots[i].key != UINT64_MAX) {
        if (m->slots[i].key == key) return &m->slots[i];
        i = (i + 1) & m->mask;
    }
    return NULL;
}

/* ------------------------------------------------------------------------ */
/* Pipeline components                                                       */
/* ------------------------------------------------------------------------ */

typedef enum {
    NORM_SEQUENCE, NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_PREPEND, NORM_REPLACE,
    NORM_LOWERCASE, NORM_STRIP
} NormType;

typedef struct Normalizer {
    NormType type;
    struct Normalizer **children;
    size_t n_children;
    char *str;          /* Prepend's prefix, Replace's content */
    char *pattern;      /* Replace's literal pattern (NULL if regex) */
    pcre2_code *regex;  /* Replace's regex pattern */
    bool strip_left, strip_right;
} Normalizer;

typedef enum {
    PRE_SEQUENCE, PRE_SPLIT, PRE_BYTELEVEL, PRE_METASPACE
} PreType;

typedef enum { SPLIT_REMOVED, SPLIT_ISOLATED, SPLIT_MERGED_PREV, SPLIT_MERGED_NEXT, SPLIT_CONTIGUOUS } SplitBehavior;
typedef enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER } PrependScheme;

typedef struct PreTokenizer {
    PreType type;
    struct PreTokenizer **children;
    size_t n_children;
    pcre2_code *regex;  /* Split's regex, or ByteLevel's GPT-2 regex when use_regex */
    char *literal;      /* Split's String pattern */
    SplitBehavior behavior;
    bool invert;
    bool add_prefix_space; /* ByteLevel */
    char *replacement;  /* Metaspace */
    PrependScheme prepend_scheme;
    bool split;
} PreTokenizer;

typedef enum {
    DEC_SEQUENCE, DEC_BYTELEVEL, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_METASPACE
} DecType;

typedef struct Decoder {
    DecType type;
    struct Decoder **children;
    size_t n_children;
    char *pattern, *content; /* Replace (literal pattern) */
    pcre2_code *regex;       /* Replace (regex pattern) */
    int32_t strip_char;
    size_t strip_start, strip_stop;
    int32_t replacement_cp;  /* Metaspace */
    PrependScheme prepend_scheme;
} Decoder;

typedef struct AddedToken {
    char *content;
    size_t len;
    int32_t id;
    bool single_word, lstrip, rstrip, normalized, special;
    char *match;        /* what is searched for: content, or normalized content */
    size_t match_len;
} AddedToken;

/* A set of added tokens searched together (the non-normalized ones on the raw
 * text, the normalized ones on normalized text). */
typedef struct AddedSet {
    int32_t *tokens;    /* indices into Tokenizer.added */
    size_t n;
    bool first_byte[256];
} AddedSet;

struct Tokenizer {
    char *name;
    uint64_t serial;    /* unique per load: tags this tokenizer's cache entries */
    /* vocabulary: model vocab plus added tokens, by id */
    char **tokens;
    uint32_t *token_lens;
    int32_t n_ids;
    StrMap vocab;       /* model vocab only */
    MergeMap merges;
    int32_t unk_id;
    bool fuse_unk, byte_fallback, ignore_merges;
    int32_t byte_fallback_ids[256]; /* <0xNN> ids, -1 if absent */
    int32_t byte_level_ids[256];    /* id of the ByteLevel character of each byte, -1 if absent */
    int16_t byte_level_inverse[512]; /* codepoint -> byte, -1 if not a ByteLevel char */
    char byte_level_chars[256][3];   /* UTF-8 of each byte's ByteLevel char, NUL-terminated */

    AddedToken *added;
    size_t n_added;
    AddedSet added_raw, added_norm;
    StrMap added_map;
    bool *is_special;   /* by id */

    Normalizer *normalizer;
    PreTokenizer *pre_tokenizer;
    Decoder *decoder;
    /* A lone ByteLevel decoder (GPT-2 style: Qwen, Llama 3): each token's bytes
     * worked out once at load (byte_level_precompute), so decoding is a copy
     * per token. NULL otherwise. */
    char *token_bytes;        /* arena */
    uint32_t *token_byte_off; /* [n_ids] */
    uint32_t *token_byte_len; /* [n_ids] */

    char *bos_token, *eos_token, *pad_token;
    bool add_bos;
    char *chat_template;
};

static const char GPT2_REGEX[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

static void normalizer_free(Normalizer *n) {
    if (!n) return;
    for (size_t i = 0; i < n->n_children; i++) normalizer_free(n->children[i]);
    free(n->children);
    free(n->str);
    free(n->pattern);
    if (n->regex) pcre2_code_free(n->regex);
    free(n);
}

static void pre_tokenizer_free(PreTokenizer *p) {
    if (!p) return;
    for (size_t i = 0; i < p->n_children; i++) pre_tokenizer_free(p->children[i]);
    free(p->children);
    if (p->regex) pcre2_code_free(p->regex);
    free(p->literal);
    free(p->replacement);
    free(p);
}

static void decoder_free(Decoder *d) {
    if (!d) return;
    for (size_t i = 0; i < d->n_children; i++) decoder_free(d->children[i]);
    free(d->children);
    free(d->pattern);
    free(d->content);
    if (d->regex) pcre2_code_free(d->regex);
    free(d);
}

/* The White_Space characters: what \s means in Oniguruma (HF's regex engine).
 * PCRE2's \s also takes U+180E (Mongolian vowel separator, a format character
 * since Unicode 6.3), which splits text differently from HF. */
#define WHITE_SPACE_CLASS "\\t\\n\\x0b\\f\\r\\x20\\x{85}\\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}"

/* Rewrites \s (and \S outside classes) to the explicit White_Space class. */
static char *regex_rewrite_space(const char *p) {
    Buf b = {0};
    bool in_class = false;
    size_t n = strlen(p);
    buf_reserve(&b, n);
    for (size_t i = 0; i < n; i++) {
        char c = p[i];
        if (c == '\\' && i + 1 < n) {
            char e = p[i + 1];
            if (e == 's') {
                if (in_class) buf_append(&b, WHITE_SPACE_CLASS, strlen(WHITE_SPACE_CLASS));
                else {
                    buf_append(&b, "[", 1);
                    buf_append(&b, WHITE_SPACE_CLASS, strlen(WHITE_SPACE_CLASS));
                    buf_append(&b, "]", 1);
                }
            } else if (e == 'S' && !in_class) {
                buf_append(&b, "[^", 2);
                buf_append(&b, WHITE_SPACE_CLASS, strlen(WHITE_SPACE_CLASS));
                buf_append(&b, "]", 1);
            } else {
                buf_append(&b, p + i, 2);
            }
            i++;
            continue;
        }
        if (!in_class && c == '[') {
            in_class = true;
            buf_append(&b, p + i, 1);
            /* A ']' right after '[' or '[^' is a literal. */
            if (i + 1 < n && p[i + 1] == '^') buf_append(&b, p + ++i, 1);
            if (i + 1 < n && p[i + 1] == ']') buf_append(&b, p + ++i, 1);
            continue;
        }
        if (in_class && c == '[' && i + 1 < n && p[i + 1] == ':') {
            const char *end = strstr(p + i + 2, ":]");
            if (end) {
                buf_append(&b, p + i, (size_t)(end + 2 - (p + i)));
                i = (size_t)(end + 1 - p);
                continue;
            }
        }
        if (in_class && c == ']') in_class = false;
        buf_append(&b, p + i, 1);
    }
    return b.data;
}

/* Compiles a regex with Unicode semantics (as the Oniguruma engine HF uses
 * has them) and JIT-compiles it when the platform allows. */
static int regex_compile(pcre2_code **out, const char *pattern, const char *name, char *err) {
    int code;
    PCRE2_SIZE off;
    char *rewritten = regex_rewrite_space(pattern);
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)rewritten, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &code, &off, NULL);
    free(rewritten);
    if (!re) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return errorf(err, "%s: cannot compile regex '%.80s' at offset %zu: %s", name, pattern, (size_t)off, (char *)msg);
    }
    pcre2_jit_compile(re, PCRE2_JIT_COMPLETE); /* failure just means the interpreter is used */
    *out = re;
    return COLT_OK;
}

/* Parses a {"String": s} / {"Regex": r} pattern object. */
static int parse_pattern(char **literal, pcre2_code **regex, json_t *pat, const char *what, const char *name, char *err) {
    json_t *s = json_object_get(pat, "String"), *r = json_object_get(pat, "Regex");
    if (json_is_string(s)) {
        *literal = xstrdup(json_string_value(s));
        return COLT_OK;
    }
    if (json_is_string(r)) return regex_compile(regex, json_string_value(r), name, err);
    return errorf(err, "%s: %s has no String or Regex pattern", name, what);
}

static const char *json_type_of(json_t *o) {
    json_t *t = json_object_get(o, "type");
    return json_is_string(t) ? json_string_value(t) : NULL;
}

static bool json_bool_or(json_t *o, const char *key, bool dflt) {
    json_t *v = json_object_get(o, key);
    return json_is_boolean(v) ? json_is_true(v) : dflt;
}

static int parse_prepend_scheme(PrependScheme *out, json_t *o, const char *name, char *err) {
    json_t *ps = json_object_get(o, "prepend_scheme");
    if (json_is_string(ps)) {
        const char *s = json_string_value(ps);
        if (!strcmp(s, "always")) *out = PREPEND_ALWAYS;
        else if (!strcmp(s, "first")) *out = PREPEND_FIRST;
        else if (!strcmp(s, "never")) *out = PREPEND_NEVER;
        else return errorf(err, "%s: unknown Metaspace prepend_scheme '%s'", name, s);
        return COLT_OK;
    }
    /* Older files: add_prefix_space true/false. */
    *out = json_bool_or(o, "add_prefix_space", true) ? PREPEND_ALWAYS : PREPEND_NEVER;
    return COLT_OK;
}

/* Reads Metaspace's replacement (one character). */
static int parse_replacement(int32_t *cp, char **str, json_t *o, const char *name, char *err) {
    json_t *r = json_object_get(o, "replacement");
    const char *s = json_is_string(r) ? json_string_value(r) : "\xE2\x96\x81";
    size_t n = strlen(s);
    if (n == 0 || utf8_first_invalid(s, n) != n) return errorf(err, "%s: Metaspace replacement must be one character", name);
    size_t l = utf8_decode(s, n, cp);
    if (l != n) return errorf(err, "%s: Metaspace replacement must be one character", name);
    if (str) *str = xstrdup(s);
    return COLT_OK;
}

#define MAX_DEPTH 16

static int parse_normalizer(Normalizer **out, json_t *o, int depth, const char *name, char *err) {
    *out = NULL;
    const char *type = json_type_of(o);
    if (!type) return errorf(err, "%s: normalizer without a type", name);
    if (depth > MAX_DEPTH) return errorf(err, "%s: normalizers nested too deeply", name);
    Normalizer *n = xcalloc(1, sizeof *n);
    *out = n;
    if (!strcmp(type, "Sequence")) {
        n->type = NORM_SEQUENCE;
        json_t *arr = json_object_get(o, "normalizers");
        if (!json_is_array(arr)) return errorf(err, "%s: Sequence normalizer without a normalizers list", name);
        n->children = xcalloc(json_array_size(arr) + 1, sizeof(Normalizer *));
        for (size_t i = 0; i < json_array_size(arr); i++) {
            n->n_children = i + 1;
            if (parse_normalizer(&n->children[i], json_array_get(arr, i), depth + 1, name, err)) return COLT_ERR;
        }
    } else if (!strcmp(type, "NFC")) n->type = NORM_NFC;
    else if (!strcmp(type, "NFD")) n->type = NORM_NFD;
    else if (!strcmp(type, "NFKC")) n->type = NORM_NFKC;
    else if (!strcmp(type, "NFKD")) n->type = NORM_NFKD;
    else if (!strcmp(type, "Lowercase")) n->type = NORM_LOWERCASE;
    else if (!strcmp(type, "Strip")) {
        n->type = NORM_STRIP;
        n->strip_left = json_bool_or(o, "strip_left", true);
        n->strip_right = json_bool_or(o, "strip_right", true);
    } else if (!strcmp(type, "Prepend")) {
        n->type = NORM_PREPEND;
        json_t *p = json_object_get(o, "prepend");
        if (!json_is_string(p)) return errorf(err, "%s: Prepend normalizer without a prepend string", name);
        n->str = xstrdup(json_string_value(p));
    } else if (!strcmp(type, "Replace")) {
        n->type = NORM_REPLACE;
        json_t *c = json_object_get(o, "content");
        if (!json_is_string(c)) return errorf(err, "%s: Replace normalizer without content", name);
        n->str = xstrdup(json_string_value(c));
        if (parse_pattern(&n->pattern, &n->regex, json_object_get(o, "pattern"), "Replace normalizer", name, err)) return COLT_ERR;
    } else {
        return errorf(err, "%s: unsupported normalizer type '%s'", name, type);
    }
    return COLT_OK;
}

static int parse_pre_tokenizer(PreTokenizer **out, json_t *o, int depth, const char *name, char *err) {
    *out = NULL;
    const char *type = json_type_of(o);
    if (!type) return errorf(err, "%s: pre_tokenizer without a type", name);
    if (depth > MAX_DEPTH) return errorf(err, "%s: pre_tokenizers nested too deeply", name);
    PreTokenizer *p = xcalloc(1, sizeof *p);
    *out = p;
    if (!strcmp(type, "Sequence")) {
        p->type = PRE_SEQUENCE;
        json_t *arr = json_object_get(o, "pretokenizers");
        if (!json_is_array(arr)) return errorf(err, "%s: Sequence pre_tokenizer without a pretokenizers list", name);
        p->children = xcalloc(json_array_size(arr) + 1, sizeof(PreTokenizer *));
        for (size_t i = 0; i < json_array_size(arr); i++) {
            p->n_children = i + 1;
            if (parse_pre_tokenizer(&p->children[i], json_array_get(arr, i), depth + 1, name, err)) return COLT_ERR;
        }
    } else if (!strcmp(type, "Split")) {
        p->type = PRE_SPLIT;
        if (parse_pattern(&p->literal, &p->regex, json_object_get(o, "pattern"), "Split pre_tokenizer", name, err)) return COLT_ERR;
        json_t *b = json_object_get(o, "behavior");
        const char *bs = json_is_string(b) ? json_string_value(b) : "";
        if (!strcmp(bs, "Removed")) p->behavior = SPLIT_REMOVED;
        else if (!strcmp(bs, "Isolated")) p->behavior = SPLIT_ISOLATED;
        else if (!strcmp(bs, "MergedWithPrevious")) p->behavior = SPLIT_MERGED_PREV;
        else if (!strcmp(bs, "MergedWithNext")) p->behavior = SPLIT_MERGED_NEXT;
        else if (!strcmp(bs, "Contiguous")) p->behavior = SPLIT_CONTIGUOUS;
        else return errorf(err, "%s: unknown Split behavior '%s'", name, bs);
        p->invert = json_bool_or(o, "invert", false);
    } else if (!strcmp(type, "ByteLevel")) {
        p->type = PRE_BYTELEVEL;
        p->add_prefix_space = json_bool_or(o, "add_prefix_space", true);
        if (json_bool_or(o, "use_regex", true) && regex_compile(&p->regex, GPT2_REGEX, name, err)) return COLT_ERR;
    } else if (!strcmp(type, "Metaspace")) {
        p->type = PRE_METASPACE;
        int32_t cp;
        if (parse_replacement(&cp, &p->replacement, o, name, err)) return COLT_ERR;
        if (parse_prepend_scheme(&p->prepend_scheme, o, name, err)) return COLT_ERR;
        p->split = json_bool_or(o, "split", true);
    } else if (!strcmp(type, "Whitespace")) {
        /* HF: keep the matches of \w+|[^\w\s]+ */
        p->type = PRE_SPLIT;
        p->behavior = SPLIT_REMOVED;
        p->invert = true;
        if (regex_compile(&p->regex, "\\w+|[^\\w\\s]+", name, err)) return COLT_ERR;
    } else if (!strcmp(type, "WhitespaceSplit")) {
        p->type = PRE_SPLIT;
        p->behavior = SPLIT_REMOVED;
        if (regex_compile(&p->regex, "\\s+", name, err)) return COLT_ERR;
    } else if (!strcmp(type, "Digits")) {
        p->type = PRE_SPLIT;
        p->behavior = json_bool_or(o, "individual_digits", false) ? SPLIT_ISOLATED : SPLIT_CONTIGUOUS;
        if (regex_compile(&p->regex, "\\p{N}", name, err)) return COLT_ERR;
    } else {
        return errorf(err, "%s: unsupported pre_tokenizer type '%s'", name, type);
    }
    return COLT_OK;
}

static int parse_decoder(Decoder **out, json_t *o, int depth, const char *name, char *err) {
    *out = NULL;
    const char *type = json_type_of(o);
    if (!type) return errorf(err, "%s: decoder without a type", name);
    if (depth > MAX_DEPTH) return errorf(err, "%s: decoders nested too deeply", name);
    Decoder *d = xcalloc(1, sizeof *d);
    *out = d;
    if (!strcmp(type, "Sequence")) {
        d->type = DEC_SEQUENCE;
        json_t *arr = json_object_get(o, "decoders");
        if (!json_is_array(arr)) return errorf(err, "%s: Sequence decoder without a decoders list", name);
        d->children = xcalloc(json_array_size(arr) + 1, sizeof(Decoder *));
        for (size_t i = 0; i < json_array_size(arr); i++) {
            d->n_children = i + 1;
            if (parse_decoder(&d->children[i], json_array_get(arr, i), depth + 1, name, err)) return COLT_ERR;
        }
    } else if (!strcmp(type, "ByteLevel")) d->type = DEC_BYTELEVEL;
    else if (!strcmp(type, "ByteFallback")) d->type = DEC_BYTEFALLBACK;
    else if (!strcmp(type, "Fuse")) d->type = DEC_FUSE;
    else if (!strcmp(type, "Replace")) {
        d->type = DEC_REPLACE;
        json_t *c = json_object_get(o, "content");
        if (!json_is_string(c)) return errorf(err, "%s: Replace decoder without content", name);
        d->content = xstrdup(json_string_value(c));
        if (parse_pattern(&d->pattern, &d->regex, json_object_get(o, "pattern"), "Replace decoder", name, err)) return COLT_ERR;
    } else if (!strcmp(type, "Strip")) {
        d->type = DEC_STRIP;
        json_t *c = json_object_get(o, "content"), *s = json_object_get(o, "start"), *e = json_object_get(o, "stop");
        if (!json_is_string(c) || !json_is_integer(s) || !json_is_integer(e) || json_integer_value(s) < 0 ||
            json_integer_value(e) < 0)
            return errorf(err, "%s: Strip decoder needs content, start and stop", name);
        const char *cs = json_string_value(c);
        size_t n = strlen(cs);
        if (n == 0 || utf8_first_invalid(cs, n) != n || utf8_decode(cs, n, &d->strip_char) != n)
            return errorf(err, "%s: Strip decoder content must be one character", name);
        d->strip_start = (size_t)json_integer_value(s);
        d->strip_stop = (size_t)json_integer_value(e);
    } else if (!strcmp(type, "Metaspace")) {
        d->type = DEC_METASPACE;
        if (parse_replacement(&d->replacement_cp, NULL, o, name, err)) return COLT_ERR;
        if (parse_prepend_scheme(&d->prepend_scheme, o, name, err)) return COLT_ERR;
    } else {
        return errorf(err, "%s: unsupported decoder type '%s'", name, type);
    }
    return COLT_OK;
}

/* ------------------------------------------------------------------------ */
/* Normalization                                                             */
/* ------------------------------------------------------------------------ */

static bool is_ascii(const char *s, size_t n) {
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)s[i] >= 0x80) return false;
    return true;
}

/* Replaces every non-overlapping match of a literal or regex in `in` by
 * `content`, writing to out. */
static int replace_all(Buf *out, const char *in, size_t n, const char *literal, pcre2_code *regex,
                       const char *content, char *err) {
    size_t clen = strlen(content), pos = 0;
    out->len = 0;
    buf_reserve(out, n);
    if (literal) {
        size_t llen = strlen(literal);
        if (llen == 0) {
            buf_append(out, in, n);
            return COLT_OK;
        }
        while (pos < n) {
            const char *hit = n - pos >= llen ? memmem(in + pos, n - pos, literal, llen) : NULL;
            if (!hit) break;
            size_t at = (size_t)(hit - in);
            buf_append(out, in + pos, at - pos);
            buf_append(out, content, clen);
            pos = at + llen;
        }
        buf_append(out, in + pos, n - pos);
        return COLT_OK;
    }
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(regex, NULL);
    if (!md) colt_out_of_memory(0); /* PCRE2 does not say how much it asked for */
    size_t search = 0;
    while (search <= n) {
        int rc = pcre2_match(regex, (PCRE2_SPTR)in, n, search, PCRE2_NO_UTF_CHECK, md, NULL);
        if (rc == PCRE2_ERROR_NOMATCH) break;
        if (rc < 0) {
            pcre2_match_data_free(md);
            return errorf(err, "regex match failed (PCRE2 error %d)", rc);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t s = ov[0], e = ov[1];
        buf_append(out, in + pos, s - pos);
        buf_append(out, content, clen);
        pos = e;
        if (e == s) {
            if (e >= n) break;
            int32_t cp;
            size_t l = utf8_decode(in + e, n - e, &cp);
            buf_append(out, in + e, l);
            pos = e + l;
        }
        search = pos;
    }
    buf_append(out, in + pos, n - pos);
    pcre2_match_data_free(md);
    return COLT_OK;
}

/* Normalizes cur in place (swapping with tmp as scratch). */
static int normalize_apply(const Normalizer *nz, Buf *cur, Buf *tmp, char *err) {
    switch (nz->type) {
    case NORM_SEQUENCE:
        for (size_t i = 0; i < nz->n_children; i++)
            if (normalize_apply(nz->children[i], cur, tmp, err)) return COLT_ERR;
        return COLT_OK;
    case NORM_NFC: case NORM_NFD: case NORM_NFKC: case NORM_NFKD: {
        /* All four are the identity on ASCII, which is most text. */
        if (cur->len == 0 || is_ascii(cur->data, cur->len)) return COLT_OK;
        int opts = UTF8PROC_STABLE;
        if (nz->type == NORM_NFC || nz->type == NORM_NFKC) opts |= UTF8PROC_COMPOSE;
        else opts |= UTF8PROC_DECOMPOSE;
        if (nz->type == NORM_NFKC || nz->type == NORM_NFKD) opts |= UTF8PROC_COMPAT;
        utf8proc_uint8_t *res = NULL;
        utf8proc_ssize_t r = utf8proc_map((const utf8proc_uint8_t *)cur->data, (utf8proc_ssize_t)cur->len, &res, opts);
        if (r < 0) return errorf(err, "unicode normalization failed: %s", utf8proc_errmsg(r));
        cur->len = 0;
        buf_append(cur, res, (size_t)r);
        free(res);
        return COLT_OK;
    }
    case NORM_LOWERCASE: {
        tmp->len = 0;
        for (size_t i = 0; i < cur->len;) {
            int32_t cp;
            i += utf8_decode(cur->data + i, cur->len - i, &cp);
            buf_append_cp(tmp, utf8proc_tolower(cp));
        }
        break;
    }
    case NORM_STRIP: {
        size_t s = 0, e = cur->len;
        while (s < e) {
            int32_t cp;
            size_t l = utf8_decode(cur->data + s, e - s, &cp);
            if (!nz->strip_left || !cp_is_whitespace(cp)) break;
            s += l;
        }
        while (e > s && nz->strip_right) {
            size_t i = e - 1;
            while (i > s && ((unsigned char)cur->data[i] & 0xC0) == 0x80) i--;
            int32_t cp;
            utf8_decode(cur->data + i, e - i, &cp);
            if (!cp_is_whitespace(cp)) break;
            e = i;
        }
        tmp->len = 0;
        buf_append(tmp, cur->data + s, e - s);
        break;
    }
    case NORM_PREPEND:
        if (cur->len == 0) return COLT_OK;
        tmp->len = 0;
        buf_append(tmp, nz->str, strlen(nz->str));
        buf_append(tmp, cur->data, cur->len);
        break;
    case NORM_REPLACE:
        if (replace_all(tmp, cur->data, cur->len, nz->pattern, nz->regex, nz->str, err)) return COLT_ERR;
        break;
    }
    Buf swap = *cur;
    *cur = *tmp;
    *tmp = swap;
    return COLT_OK;
}

/* ------------------------------------------------------------------------ */
/* Pre-tokenization: a list of pieces (spans of one buffer)                  */
/* ------------------------------------------------------------------------ */

typedef struct Span {
    size_t start, len;
    bool at_origin;     /* starts at offset 0 of the original text (Metaspace "first") */
} Span;

typedef struct Pieces {
    Buf buf;
    Span *spans;
    size_t n, cap;
    bool byte_level;    /* ByteLevel ran: bytes stand for their ByteLevel characters */
} Pieces;

static void pieces_push(Pieces *p, size_t start, size_t len, bool at_origin) {
    if (len == 0) return; /* HF drops empty pieces */
    if (p->n == p->cap) {
        p->cap = p->cap ? 2 * p->cap : 16;
        p->spans = xrealloc(p->spans, p->cap * sizeof(Span));
    }
    p->spans[p->n++] = (Span){start, len, at_origin};
}

static void pieces_clear(Pieces *p) {
    p->buf.len = 0;
    p->n = 0;
    p->byte_level = false;
}

typedef struct Match {
    size_t start, end;
    bool is_match;
} Match;

typedef struct Workspace {
    Pieces a, b;
    Buf norm, norm_tmp, scratch;
    Match *matches;
    size_t n_matches, cap_matches;
    pcre2_match_data *md;
    size_t md_pairs;
    /* BPE */
    struct Symbol *syms;
    size_t cap_syms;
    struct HeapItem *heap;
    size_t cap_heap;
    int *ids;
    size_t n_ids, cap_ids;
} Workspace;

static void ws_push_match(Workspace *ws, size_t s, size_t e, bool m) {
    if (ws->n_matches == ws->cap_matches) {
        ws->cap_matches = ws->cap_matches ? 2 * ws->cap_matches : 64;
        ws->matches = xrealloc(ws->matches, ws->cap_matches * sizeof(Match));
    }
    ws->matches[ws->n_matches++] = (Match){s, e, m};
}

/* Finds all matches of a pattern in s[0..n), filling ws->matches with
 * alternating matched/unmatched spans that cover s (as HF's find_matches). */
static int find_matches(Workspace *ws, const PreTokenizer *p, const char *s, size_t n, char *err) {
    ws->n_matches = 0;
    size_t prev = 0;
    if (p->literal) {
        size_t llen = strlen(p->literal);
        if (llen == 0) {
            ws_push_match(ws, 0, n, false);
            return COLT_OK;
        }
        size_t pos = 0;
        while (pos + llen <= n) {
            const char *hit = memmem(s + pos, n - pos, p->literal, llen);
            if (!hit) break;
            size_t at = (size_t)(hit - s);
            if (at > prev) ws_push_match(ws, prev, at, false);
            ws_push_match(ws, at, at + llen, true);
            prev = pos = at + llen;
        }
    } else {
        uint32_t pairs;
        pcre2_pattern_info(p->regex, PCRE2_INFO_CAPTURECOUNT, &pairs);
        if (!ws->md || ws->md_pairs < pairs + 1) {
            if (ws->md) pcre2_match_data_free(ws->md);
            ws->md = pcre2_match_data_create(pairs + 1, NULL);
            if (!ws->md) colt_out_of_memory((size_t)(pairs + 1) * 2 * sizeof(PCRE2_SIZE));
            ws->md_pairs = pairs + 1;
        }
        size_t pos = 0;
        while (pos <= n) {
            int rc = pcre2_match(p->regex, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, ws->md, NULL);
            if (rc == PCRE2_ERROR_JIT_STACKLIMIT)
                /* Very long runs exhaust the small default JIT stack; the
                 * interpreter keeps its backtracking state on the heap. */
                rc = pcre2_match(p->regex, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT, ws->md, NULL);
            if (rc == PCRE2_ERROR_NOMATCH) break;
            if (rc < 0) {
                PCRE2_UCHAR msg[128];
                pcre2_get_error_message(rc, msg, sizeof msg);
                return errorf(err, "pre-tokenizer regex failed: %s", (char *)msg);
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(ws->md);
            size_t ms = ov[0], me = ov[1];
            if (ms > prev) ws_push_match(ws, prev, ms, false);
            ws_push_match(ws, ms, me, true);
            prev = me;
            if (me == ms) {
                if (me >= n) break;
                int32_t cp;
                pos = me + utf8_decode(s + me, n - me, &cp);
            } else {
                pos = me;
            }
        }
    }
    if (prev < n) ws_push_match(ws, prev, n, false);
    return COLT_OK;
}

/* Groups ws->matches by the Split behavior (the folds of HF's
 * NormalizedString::split), appending the resulting pieces to out. */
static void split_apply(Workspace *ws, SplitBehavior behavior, bool invert, Pieces *out, size_t base, bool at_origin) {
    Match *m = ws->matches;
    size_t n = ws->n_matches, k = 0;
    if (invert)
        for (size_t i = 0; i < n; i++) m[i].is_match = !m[i].is_match;
    switch (behavior) {
    case SPLIT_ISOLATED:
        k = n;
        break;
    case SPLIT_REMOVED:
        for (size_t i = 0; i < n; i++)
            if (!m[i].is_match) m[k++] = m[i];
        break;
    case SPLIT_MERGED_PREV: {
        bool prev_match = false;
        for (size_t i = 0; i < n; i++) {
            if (m[i].is_match && !prev_match && k > 0) m[k - 1].end = m[i].end;
            else m[k++] = m[i];
            prev_match = m[i].is_match;
        }
        break;
    }
    case SPLIT_MERGED_NEXT: {
        /* Right to left, then the result is in reverse order. */
        bool prev_match = false;
        Match *tmp = xmalloc((n + 1) * sizeof(Match));
        for (size_t i = n; i-- > 0;) {
            if (m[i].is_match && !prev_match && k > 0) tmp[k - 1].start = m[i].start;
            else tmp[k++] = m[i];
            prev_match = m[i].is_match;
        }
        for (size_t i = 0; i < k; i++) m[i] = tmp[k - 1 - i];
        free(tmp);
        break;
    }
    case SPLIT_CONTIGUOUS: {
        bool prev_match = false;
        for (size_t i = 0; i < n; i++) {
            if (m[i].is_match == prev_match && k > 0) m[k - 1].end = m[i].end;
            else m[k++] = m[i];
            prev_match = m[i].is_match;
        }
        break;
    }
    }
    for (size_t i = 0; i < k; i++) pieces_push(out, base + m[i].start, m[i].end - m[i].start, at_origin && m[i].start == 0);
}

/* Rewrites the buffer so that each byte is its ByteLevel character, for a
 * stage that runs after ByteLevel and must see those characters. */
static void pieces_materialize_byte_level(const Tokenizer *t, Pieces *in, Pieces *out) {
    pieces_clear(out);
    for (size_t i = 0; i < in->n; i++) {
        size_t start = out->buf.len;
        for (size_t j = 0; j < in->spans[i].len; j++) {
            const char *c = t->byte_level_chars[(unsigned char)in->buf.data[in->spans[i].start + j]];
            buf_append(&out->buf, c, strlen(c));
        }
        pieces_push(out, start, out->buf.len - start, in->spans[i].at_origin);
    }
}

static void pieces_swap(Pieces *x, Pieces *y) {
    Pieces t = *x;
    *x = *y;
    *y = t;
}

/* Runs one pre-tokenizer over ws->a (result left in ws->a). */
static int pre_tokenize(const Tokenizer *t, const PreTokenizer *p, Workspace *ws, char *err) {
    if (p->type == PRE_SEQUENCE) {
        for (size_t i = 0; i < p->n_children; i++)
            if (pre_tokenize(t, p->children[i], ws, err)) return COLT_ERR;
        return COLT_OK;
    }
    if (ws->a.byte_level) {
        pieces_materialize_byte_level(t, &ws->a, &ws->b);
        pieces_swap(&ws->a, &ws->b);
    }
    Pieces *in = &ws->a, *out = &ws->b;
    pieces_clear(out);
    /* Copy the bytes once; spans are then offsets into out->buf. */
    for (size_t i = 0; i < in->n; i++) {
        const Span *sp = &in->spans[i];
        const char *s = in->buf.data + sp->start;
        size_t n = sp->len;
        switch (p->type) {
        case PRE_SPLIT: {
            size_t base = out->buf.len;
            buf_append(&out->buf, s, n);
            if (find_matches(ws, p, out->buf.data + base, n, err)) return COLT_ERR;
            split_apply(ws, p->behavior, p->invert, out, base, sp->at_origin);
            break;
        }
        case PRE_BYTELEVEL: {
            size_t base = out->buf.len;
            if (p->add_prefix_space && s[0] != ' ') buf_append(&out->buf, " ", 1);
            buf_append(&out->buf, s, n);
            size_t len = out->buf.len - base;
            if (p->regex) {
                if (find_matches(ws, p, out->buf.data + base, len, err)) return COLT_ERR;
                split_apply(ws, SPLIT_ISOLATED, false, out, base, sp->at_origin);
            } else {
                pieces_push(out, base, len, sp->at_origin);
            }
            break;
        }
        case PRE_METASPACE: {
            size_t base = out->buf.len, rlen = strlen(p->replacement);
            bool starts = n >= rlen && memcmp(s, p->replacement, rlen) == 0;
            /* A leading space becomes the replacement too, so it counts as one. */
            if (!starts && s[0] == ' ') starts = true;
            if ((p->prepend_scheme == PREPEND_ALWAYS || (p->prepend_scheme == PREPEND_FIRST && sp->at_origin)) && !starts)
                buf_append(&out->buf, p->replacement, rlen);
            for (size_t j = 0; j < n; j++) {
                if (s[j] == ' ') buf_append(&out->buf, p->replacement, rlen);
                else buf_append(&out->buf, s + j, 1);
            }
            size_t len = out->buf.len - base;
            if (p->split) {
                PreTokenizer lit = {.literal = p->replacement};
                if (find_matches(ws, &lit, out->buf.data + base, len, err)) return COLT_ERR;
                split_apply(ws, SPLIT_MERGED_NEXT, false, out, base, sp->at_origin);
            } else {
                pieces_push(out, base, len, sp->at_origin);
            }
            break;
        }
        case PRE_SEQUENCE:
            break;
        }
    }
    out->byte_level = p->type == PRE_BYTELEVEL;
    pieces_swap(&ws->a, &ws->b);
    return COLT_OK;
}

/* ------------------------------------------------------------------------ */
/* BPE model                                                                 */
/* ------------------------------------------------------------------------ */

typedef struct Symbol {
    int32_t id;
    int32_t prev, next; /* -1 at the ends */
    bool alive;
} Symbol;

typedef struct HeapItem {
    uint32_t rank;
    uint32_t pos;
    int32_t new_id;
} HeapItem;

static void ws_push_id(Workspace *ws, int id) {
    if (ws->n_ids == ws->cap_ids) {
        ws->cap_ids = ws->cap_ids ? 2 * ws->cap_ids : 256;
        ws->ids = xrealloc(ws->ids, ws->cap_ids * sizeof(int));
    }
    ws->ids[ws->n_ids++] = id;
}

static bool heap_less(const HeapItem *a, const HeapItem *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(Workspace *ws, size_t *n, HeapItem it) {
    if (*n == ws->cap_heap) {
        ws->cap_heap = ws->cap_heap ? 2 * ws->cap_heap : 64;
        ws->heap = xrealloc(ws->heap, ws->cap_heap * sizeof(HeapItem));
    }
    HeapItem *h = ws->heap;
    size_t i = (*n)++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!heap_less(&it, &h[parent])) break;
        h[i] = h[parent];
        i = parent;
    }
    h[i] = it;
}

static HeapItem heap_pop(Workspace *ws, size_t *n) {
    HeapItem *h = ws->heap, top = h[0], last = h[--(*n)];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && heap_less(&h[c + 1], &h[c])) c++;
        if (!heap_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n) h[i] = last;
    return top;
}

static void ws_reserve_syms(Workspace *ws, size_t n) {
    if (n <= ws->cap_syms) return;
    ws->cap_syms = n < 64 ? 64 : 2 * n;
    ws->syms = xrealloc(ws->syms, ws->cap_syms * sizeof(Symbol));
}

static void sym_push(Workspace *ws, size_t *n, int32_t id) {
    ws_reserve_syms(ws, *n + 1);
    Symbol *s = &ws->syms[*n];
    s->id = id;
    s->prev = (int32_t)*n - 1;
    s->next = -1;
    s->alive = true;
    if (*n > 0) ws->syms[*n - 1].next = (int32_t)*n;
    (*n)++;
}

static void heap_push_pair(const Tokenizer *t, Workspace *ws, size_t *nh, int32_t pos) {
    const Symbol *s = &ws->syms[pos];
    if (s->next < 0) return;
    const MergeEntry *m = mergemap_get(&t->merges, s->id, ws->syms[s->next].id);
    if (m) heap_push(ws, nh, (HeapItem){m->rank, (uint32_t)pos, m->new_id});
}

/* Merges the symbols ws->syms[0..n) by merge rank (lowest first, leftmost on
 * ties — the order of HF's Word::merge_all) and appends the ids. */
static void bpe_merge(const Tokenizer *t, Workspace *ws, size_t n) {
    if (n > 1) {
        size_t nh = 0;
        for (size_t i = 0; i + 1 < n; i++) heap_push_pair(t, ws, &nh, (int32_t)i);
        while (nh) {
            HeapItem top = heap_pop(ws, &nh);
            Symbol *s = &ws->syms[top.pos];
            if (!s->alive || s->next < 0) continue;
            Symbol *r = &ws->syms[s->next];
            const MergeEntry *m = mergemap_get(&t->merges, s->id, r->id);
            if (!m || m->new_id != top.new_id) continue; /* stale entry */
            s->id = top.new_id;
            r->alive = false;
            s->next = r->next;
            if (r->next >= 0) ws->syms[r->next].prev = (int32_t)top.pos;
            if (s->prev >= 0) heap_push_pair(t, ws, &nh, s->prev);
            heap_push_pair(t, ws, &nh, (int32_t)top.pos);
        }
    }
    for (int32_t i = n ? 0 : -1; i >= 0; i = ws->syms[i].next) ws_push_id(ws, ws->syms[i].id);
}

/* A small per-thread cache of short pre-tokens -> ids: most words repeat, and
 * merging is most of the encode time. Per thread, so a const Tokenizer can be
 * used from many threads without locks; entries carry the tokenizer's serial,
 * so a freed tokenizer's entries are never served to a new one at the same
 * address. */
#define PIECE_CACHE_SLOTS 4096
#define PIECE_CACHE_BYTES 22
#define PIECE_CACHE_IDS 6

typedef struct PieceCacheSlot {
    uint64_t serial; /* 0: empty */
    uint64_t hash;
    uint8_t len, n_ids;
    bool byte_level;
    char bytes[PIECE_CACHE_BYTES];
    int32_t ids[PIECE_CACHE_IDS];
} PieceCacheSlot;

static _Thread_local PieceCacheSlot piece_cache[PIECE_CACHE_SLOTS];
static atomic_uint_fast64_t tokenizer_serial_counter;

static void bpe_encode_piece_uncached(const Tokenizer *t, Workspace *ws, const char *s, size_t n, bool byte_level);

/* Encodes one pre-token with the BPE model. */
static void bpe_encode_piece(const Tokenizer *t, Workspace *ws, const char *s, size_t n, bool byte_level) {
    if (n > PIECE_CACHE_BYTES) {
        bpe_encode_piece_uncached(t, ws, s, n, byte_level);
        return;
    }
    uint64_t h = hash_bytes(s, n);
    PieceCacheSlot *slot = &piece_cache[h & (PIECE_CACHE_SLOTS - 1)];
    if (slot->serial == t->serial && slot->hash == h && slot->len == n && slot->byte_level == byte_level &&
        memcmp(slot->bytes, s, n) == 0) {
        for (size_t i = 0; i < slot->n_ids; i++) ws_push_id(ws, slot->ids[i]);
        return;
    }
    size_t first = ws->n_ids;
    bpe_encode_piece_uncached(t, ws, s, n, byte_level);
    size_t count = ws->n_ids - first;
    if (count <= PIECE_CACHE_IDS) {
        slot->serial = t->serial;
        slot->hash = h;
        slot->len = (uint8_t)n;
        slot->byte_level = byte_level;
        memcpy(slot->bytes, s, n);
        slot->n_ids = (uint8_t)count;
        for (size_t i = 0; i < count; i++) slot->ids[i] = ws->ids[first + i];
    }
}

static void bpe_encode_piece_uncached(const Tokenizer *t, Workspace *ws, const char *s, size_t n, bool byte_level) {
    if (t->ignore_merges) {
        int32_t id;
        if (byte_level) {
            ws->scratch.len = 0;
            for (size_t i = 0; i < n; i++) {
                const char *c = t->byte_level_chars[(unsigned char)s[i]];
                buf_append(&ws->scratch, c, strlen(c));
            }
            id = strmap_get(&t->vocab, ws->scratch.data, ws->scratch.len);
        } else {
            id = strmap_get(&t->vocab, s, n);
        }
        if (id >= 0) {
            ws_push_id(ws, id);
            return;
        }
    }
    /* Initial symbols, one per character, as HF's BPE::merge_word: a
     * character missing from the vocab becomes its <0xNN> byte tokens
     * (byte_fallback) or unk; an unk is held back so that a run of them can be
     * fused, and is emitted when the next in-vocab character arrives. */
    size_t ns = 0;
    bool pending_unk = false;
    ws_reserve_syms(ws, n);
    for (size_t i = 0; i < n;) {
        const char *c;
        size_t l;
        int32_t id;
        if (byte_level) {
            c = t->byte_level_chars[(unsigned char)s[i]];
            l = strlen(c);
            id = t->byte_level_ids[(unsigned char)s[i]];
            i++;
        } else {
            int32_t cp;
            c = s + i;
            l = utf8_decode(s + i, n - i, &cp);
            id = strmap_get(&t->vocab, c, l);
            i += l;
        }
        if (id >= 0) {
            if (pending_unk) sym_push(ws, &ns, t->unk_id);
            pending_unk = false;
            sym_push(ws, &ns, id);
            continue;
        }
        if (t->byte_fallback) {
            bool all = true;
            for (size_t j = 0; j < l; j++)
                if (t->byte_fallback_ids[(unsigned char)c[j]] < 0) all = false;
            if (all) {
                for (size_t j = 0; j < l; j++) sym_push(ws, &ns, t->byte_fallback_ids[(unsigned char)c[j]]);
                continue;
            }
        }
        if (t->unk_id >= 0) {
            if (pending_unk && !t->fuse_unk) sym_push(ws, &ns, t->unk_id);
            pending_unk = true;
        }
    }
    if (pending_unk) sym_push(ws, &ns, t->unk_id);
    bpe_merge(t, ws, ns);
}

/* ------------------------------------------------------------------------ */
/* Encode                                                                    */
/* ------------------------------------------------------------------------ */

/* Normalizer -> pre-tokenizer -> model for one stretch of text without
 * non-normalized added tokens. */
static int encode_normalized(const Tokenizer *t, Workspace *ws, const char *s, size_t n, bool at_origin, char *err) {
    pieces_clear(&ws->a);
    buf_append(&ws->a.buf, s, n);
    pieces_push(&ws->a, 0, n, at_origin);
    if (t->pre_tokenizer && pre_tokenize(t, t->pre_tokenizer, ws, err)) return COLT_ERR;
    for (size_t i = 0; i < ws->a.n; i++)
        bpe_encode_piece(t, ws, ws->a.buf.data + ws->a.spans[i].start, ws->a.spans[i].len, ws->a.byte_level);
    return COLT_OK;
}

typedef int (*SegmentFn)(const Tokenizer *t, Workspace *ws, const char *s, size_t n, bool at_origin, char *err);

/* Splits s on the added tokens of `set` (leftmost-longest, honouring
 * single_word/lstrip/rstrip as HF's AddedVocabulary::split_with_indices does):
 * matched tokens emit their id, the text between goes to fn. */
static int split_added(const Tokenizer *t, Workspace *ws, const AddedSet *set, const char *s, size_t n,
                       bool at_origin, SegmentFn fn, char *err) {
    size_t start_offset = 0, pos = 0;
    while (set->n && pos < n) {
        if (!set->first_byte[(unsigned char)s[pos]]) {
            pos++;
            continue;
        }
        const AddedToken *best = NULL;
        for (size_t k = 0; k < set->n; k++) {
            const AddedToken *a = &t->added[set->tokens[k]];
            if (a->match_len && a->match_len <= n - pos && (!best || a->match_len > best->match_len) &&
                memcmp(s + pos, a->match, a->match_len) == 0)
                best = a;
        }
        if (!best) {
            pos++;
            continue;
        }
        size_t start = pos, stop = pos + best->match_len;
        pos = stop;
        if (best->single_word) {
            int32_t before = utf8_last_cp(s, start), after = -1;
            if (stop < n) utf8_decode(s + stop, n - stop, &after);
            if ((before >= 0 && cp_is_word(before)) || (after >= 0 && cp_is_word(after))) continue;
        }
        if (best->lstrip) {
            size_t ns = start;
            while (ns > 0) {
                size_t i = ns - 1;
                while (i > 0 && ((unsigned char)s[i] & 0xC0) == 0x80) i--;
                int32_t cp;
                utf8_decode(s + i, ns - i, &cp);
                if (!cp_is_whitespace(cp)) break;
                ns = i;
            }
            start = ns > start_offset ? ns : start_offset;
        }
        if (best->rstrip) {
            while (stop < n) {
                int32_t cp;
                size_t l = utf8_decode(s + stop, n - stop, &cp);
                if (!cp_is_whitespace(cp)) break;
                stop += l;
            }
            pos = stop;
        }
        if (start > start_offset && fn(t, ws, s + start_offset, start - start_offset, at_origin && start_offset == 0, err))
            return COLT_ERR;
        ws_push_id(ws, best->id);
        start_offset = stop;
    }
    if (n > start_offset) return fn(t, ws, s + start_offset, n - start_offset, at_origin && start_offset == 0, err);
    return COLT_OK;
}

/* Normalizes a stretch between non-normalized added tokens, then splits it on
 * the normalized added tokens. */
static int encode_segment(const Tokenizer *t, Workspace *ws, const char *s, size_t n, bool at_origin, char *err) {
    if (!t->normalizer) return split_added(t, ws, &t->added_norm, s, n, at_origin, encode_normalized, err);
    ws->norm.len = 0;
    buf_append(&ws->norm, s, n);
    if (normalize_apply(t->normalizer, &ws->norm, &ws->norm_tmp, err)) return COLT_ERR;
    /* encode_normalized reuses ws buffers, but not ws->norm. */
    return split_added(t, ws, &t->added_norm, ws->norm.data, ws->norm.len, at_origin, encode_normalized, err);
}

static void workspace_free(Workspace *ws) {
    free(ws->a.buf.data);
    free(ws->a.spans);
    free(ws->b.buf.data);
    free(ws->b.spans);
    free(ws->norm.data);
    free(ws->norm_tmp.data);
    free(ws->scratch.data);
    free(ws->matches);
    if (ws->md) pcre2_match_data_free(ws->md);
    free(ws->syms);
    free(ws->heap);
    free(ws->ids);
}

int tokenizer_encode(const Tokenizer *t, const char *text, size_t len, int **ids, size_t *n_ids, char *err) {
    *ids = NULL;
    *n_ids = 0;
    size_t bad = utf8_first_invalid(text, len);
    if (bad != len)
        return errorf(err, "%s: cannot encode: invalid UTF-8 at byte %zu (0x%02x)", t->name, bad, (unsigned char)text[bad]);
    Workspace ws = {0};
    int rc = split_added(t, &ws, &t->added_raw, text, len, true, encode_segment, err);
    if (rc == COLT_OK) {
        *ids = ws.ids ? ws.ids : xmalloc(sizeof(int));
        *n_ids = ws.n_ids;
        ws.ids = NULL;
    } else {
        error_prefix(err, "%s", t->name);
    }
    workspace_free(&ws);
    return rc;
}

/* ------------------------------------------------------------------------ */
/* Decode                                                                    */
/* ------------------------------------------------------------------------ */

typedef struct StrList {
    Buf *items;
    size_t n, cap;
} StrList;

static Buf *strlist_add(StrList *l) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->items = xrealloc(l->items, l->cap * sizeof(Buf));
    }
    Buf *b = &l->items[l->n++];
    *b = (Buf){0};
    buf_reserve(b, 0);
    b->data[0] = '\0';
    return b;
}

static void strlist_free(StrList *l) {
    for (size_t i = 0; i < l->n; i++) free(l->items[i].data);
    free(l->items);
    *l = (StrList){0};
}

static void strlist_swap_free(StrList *old, StrList *fresh) {
    strlist_free(old);
    *old = *fresh;
    *fresh = (StrList){0};
}

/* Pushes the ByteFallback run bytes[0..n) as HF does: the string if it is
 * valid UTF-8, else one U+FFFD per byte. */
static void byte_fallback_flush(StrList *out, Buf *bytes) {
    if (!bytes->len) return;
    if (utf8_first_invalid(bytes->data, bytes->len) == bytes->len) {
        Buf *b = strlist_add(out);
        buf_append(b, bytes->data, bytes->len);
    } else {
        for (size_t i = 0; i < bytes->len; i++) buf_append(strlist_add(out), "\xEF\xBF\xBD", 3);
    }
    bytes->len = 0;
}

static int hex_val(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* ByteLevel's decode of one token: each character back to its byte, or the token's own bytes when one is not a ByteLevel
 * character (HF keeps those). */
static void byte_level_token(const Tokenizer *t, const char *s, size_t len, Buf *out) {
    size_t mark = out->len;
    for (size_t j = 0; j < len;) {
        int32_t cp;
        j += utf8_decode(s + j, len - j, &cp);
        int b = cp >= 0 && cp < 512 ? t->byte_level_inverse[cp] : -1;
        if (b < 0) {
            out->len = mark;
            buf_append(out, s, len);
            return;
        }
        unsigned char c = (unsigned char)b;
        buf_append(out, &c, 1);
    }
}

static int decode_apply(const Tokenizer *t, const Decoder *d, StrList *toks, char *err) {
    StrList out = {0};
    switch (d->type) {
    case DEC_SEQUENCE:
        for (size_t i = 0; i < d->n_children; i++)
            if (decode_apply(t, d->children[i], toks, err)) return COLT_ERR;
        return COLT_OK;
    case DEC_BYTELEVEL: {
        Buf bytes = {0};
        buf_reserve(&bytes, 0);
        for (size_t i = 0; i < toks->n; i++) byte_level_token(t, toks->items[i].data, toks->items[i].len, &bytes);
        utf8_append_lossy(strlist_add(&out), bytes.data, bytes.len);
        free(bytes.data);
        break;
    }
    case DEC_REPLACE:
        for (size_t i = 0; i < toks->n; i++)
            if (replace_all(strlist_add(&out), toks->items[i].data, toks->items[i].len, d->pattern, d->regex, d->content, err)) {
                strlist_free(&out);
                return COLT_ERR;
            }
        break;
    case DEC_BYTEFALLBACK: {
        Buf bytes = {0};
        for (size_t i = 0; i < toks->n; i++) {
            const Buf *tk = &toks->items[i];
            const char *s = tk->data;
            int hi = tk->len == 6 ? hex_val(s[3]) : -1, lo = tk->len == 6 ? hex_val(s[4]) : -1;
            if (tk->len == 6 && !memcmp(s, "<0x", 3) && s[5] == '>' && hi >= 0 && lo >= 0) {
                unsigned char c = (unsigned char)(hi * 16 + lo);
                buf_append(&bytes, &c, 1);
            } else {
                byte_fallback_flush(&out, &bytes);
                buf_append(strlist_add(&out), tk->data, tk->len);
            }
        }
        byte_fallback_flush(&out, &bytes);
        free(bytes.data);
        break;
    }
    case DEC_FUSE: {
        Buf *b = strlist_add(&out);
        for (size_t i = 0; i < toks->n; i++) buf_append(b, toks->items[i].data, toks->items[i].len);
        break;
    }
    case DEC_STRIP:
        for (size_t i = 0; i < toks->n; i++) {
            const Buf *tk = &toks->items[i];
            size_t s = 0, e = tk->len;
            for (size_t k = 0; k < d->strip_start && s < e; k++) {
                int32_t cp;
                size_t l = utf8_decode(tk->data + s, e - s, &cp);
                if (cp != d->strip_char) break;
                s += l;
            }
            for (size_t k = 0; k < d->strip_stop && e > s; k++) {
                size_t j = e - 1;
                while (j > s && ((unsigned char)tk->data[j] & 0xC0) == 0x80) j--;
                int32_t cp;
                utf8_decode(tk->data + j, e - j, &cp);
                if (cp != d->strip_char) break;
                e = j;
            }
            buf_append(strlist_add(&out), tk->data + s, e - s);
        }
        break;
    case DEC_METASPACE:
        /* HF drops every replacement character of the first token (not only a
         * leading one) when a prefix was prepended. */
        for (size_t i = 0; i < toks->n; i++) {
            const Buf *tk = &toks->items[i];
            Buf *b = strlist_add(&out);
            for (size_t j = 0; j < tk->len;) {
                int32_t cp;
                size_t l = utf8_decode(tk->data + j, tk->len - j, &cp);
                if (cp == d->replacement_cp) {
                    if (!(i == 0 && d->prepend_scheme != PREPEND_NEVER)) buf_append(b, " ", 1);
                } else {
                    buf_append(b, tk->data + j, l);
                }
                j += l;
            }
        }
        break;
    }
    strlist_swap_free(toks, &out);
    return COLT_OK;
}

/* The lone-ByteLevel decoder's bytes of every token, in one arena. */
static void byte_level_precompute(Tokenizer *t) {
    if (!t->decoder || t->decoder->type != DEC_BYTELEVEL) return;
    Buf arena = {0};
    t->token_byte_off = xcalloc((size_t)(t->n_ids ? t->n_ids : 1), sizeof(uint32_t));
    t->token_byte_len = xcalloc((size_t)(t->n_ids ? t->n_ids : 1), sizeof(uint32_t));
    for (int32_t id = 0; id < t->n_ids; id++) {
        size_t at = arena.len;
        if (t->tokens[id]) byte_level_token(t, t->tokens[id], t->token_lens[id], &arena);
        COLT_ASSERT(arena.len < UINT32_MAX);
        t->token_byte_off[id] = (uint32_t)at;
        t->token_byte_len[id] = (uint32_t)(arena.len - at);
    }
    buf_reserve(&arena, 0);
    t->token_bytes = arena.data;
}

bool tokenizer_byte_level(const Tokenizer *t) { return t->token_bytes != NULL; }

const char *tokenizer_token_bytes(const Tokenizer *t, int id, size_t *len) {
    *len = 0;
    if (!t->token_bytes || id < 0 || id >= t->n_ids || !t->tokens[id] || t->is_special[id]) return NULL;
    *len = t->token_byte_len[id];
    return t->token_bytes + t->token_byte_off[id];
}

int tokenizer_decode(const Tokenizer *t, const int *ids, size_t n, bool skip_special_tokens, char **text, char *err) {
    size_t len;
    return tokenizer_decode_len(t, ids, n, skip_special_tokens, text, &len, err);
}

int tokenizer_decode_len(const Tokenizer *t, const int *ids, size_t n, bool skip_special_tokens, char **text,
                         size_t *len, char *err) {
    *text = NULL;
    *len = 0;
    if (t->token_bytes) { /* lone ByteLevel: the tokens' bytes, then one lossy UTF-8 pass */
        Buf bytes = {0}, out = {0};
        buf_reserve(&bytes, n * 8);
        for (size_t i = 0; i < n; i++) {
            int id = ids[i];
            if (id < 0 || id >= t->n_ids || !t->tokens[id]) {
                free(bytes.data);
                return errorf(err, "%s: cannot decode: token id %d is out of range (vocabulary size %d)", t->name, id,
                              t->n_ids);
            }
            if (skip_special_tokens && t->is_special[id]) continue;
            buf_append(&bytes, t->token_bytes + t->token_byte_off[id], t->token_byte_len[id]);
        }
        buf_reserve(&out, bytes.len);
        out.data[0] = '\0';
        utf8_append_lossy(&out, bytes.data, bytes.len);
        free(bytes.data);
        *text = out.data;
        *len = out.len;
        return COLT_OK;
    }
    StrList toks = {0};
    for (size_t i = 0; i < n; i++) {
        int id = ids[i];
        if (id < 0 || id >= t->n_ids || !t->tokens[id]) {
            strlist_free(&toks);
            return errorf(err, "%s: cannot decode: token id %d is out of range (vocabulary size %d)", t->name, id, t->n_ids);
        }
        if (skip_special_tokens && t->is_special[id]) continue;
        buf_append(strlist_add(&toks), t->tokens[id], t->token_lens[id]);
    }
    Buf out = {0};
    buf_reserve(&out, 0);
    out.data[0] = '\0';
    if (t->decoder) {
        if (decode_apply(t, t->decoder, &toks, err)) {
            strlist_free(&toks);
            free(out.data);
            return error_prefix(err, "%s: cannot decode", t->name);
        }
        for (size_t i = 0; i < toks.n; i++) utf8_append_lossy(&out, toks.items[i].data, toks.items[i].len);
    } else {
        for (size_t i = 0; i < toks.n; i++) {
            if (i) buf_append(&out, " ", 1);
            utf8_append_lossy(&out, toks.items[i].data, toks.items[i].len);
        }
    }
    strlist_free(&toks);
    *text = out.data;
    *len = out.len;
    return COLT_OK;
}

/* ------------------------------------------------------------------------ */
/* Loading                                                                   */
/* ------------------------------------------------------------------------ */

/* GPT-2's bytes_to_unicode: printable bytes map to themselves, the others to
 * U+0100 upwards, so every byte is a visible character. */
static void byte_level_init(Tokenizer *t) {
    int n = 0;
    for (int i = 0; i < 512; i++) t->byte_level_inverse[i] = -1;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        int32_t cp = printable ? b : 256 + n++;
        utf8proc_ssize_t l = utf8proc_encode_char(cp, (utf8proc_uint8_t *)t->byte_level_chars[b]);
        t->byte_level_chars[b][l] = '\0';
        t->byte_level_inverse[cp] = (int16_t)b;
    }
}

/* Token string from a JSON bos/eos/pad entry: a string or {"content": ...}. */
static char *config_token(json_t *cfg, const char *key) {
    json_t *v = json_object_get(cfg, key);
    if (json_is_object(v)) v = json_object_get(v, "content");
    return json_is_string(v) ? xstrdup(json_string_value(v)) : NULL;
}

/* tokenizer_config.json; name is its path (or "tokenizer_config.json"), for
 * errors. Numbers are decoded as reals: transformers writes model_max_length
 * as int(1e30) = 1000000000000000019884624838656, beyond jansson's 64-bit
 * integers, and nothing read here is a number. */
static int load_config(Tokenizer *t, const char *config_json, size_t config_len, const char *name, char *err) {
    json_error_t jerr;
    json_t *cfg = json_loadb(config_json, config_len, JSON_ALLOW_NUL | JSON_DECODE_INT_AS_REAL, &jerr);
    if (!cfg) return errorf(err, "%s: not valid JSON: %s (line %d)", name, jerr.text, jerr.line);
    if (!json_is_object(cfg)) {
        json_decref(cfg);
        return errorf(err, "%s: not a JSON object", name);
    }
    t->bos_token = config_token(cfg, "bos_token");
    t->eos_token = config_token(cfg, "eos_token");
    t->pad_token = config_token(cfg, "pad_token");
    t->add_bos = json_bool_or(cfg, "add_bos_token", false);
    json_t *ct = json_object_get(cfg, "chat_template");
    if (json_is_string(ct)) {
        t->chat_template = xstrdup(json_string_value(ct));
    } else if (json_is_array(ct)) {
        size_t i;
        json_t *e;
        json_array_foreach(ct, i, e) {
            json_t *nm = json_object_get(e, "name"), *tp = json_object_get(e, "template");
            if (json_is_string(nm) && json_is_string(tp) && !strcmp(json_string_value(nm), "default"))
                t->chat_template = xstrdup(json_string_value(tp));
        }
    }
    json_decref(cfg);
    return COLT_OK;
}

static int load_vocab_and_merges(Tokenizer *t, json_t *model, json_t *added, const char *name, char *err) {
    json_t *vocab = json_object_get(model, "vocab");
    if (!json_is_object(vocab)) return errorf(err, "%s: model has no vocab object", name);
    size_t n_vocab = json_object_size(vocab), n_added = json_array_size(added);
    /* Ids are dense in real files; the bound keeps a hostile file from
     * making us allocate gigabytes. */
    int64_t limit = 2 * (int64_t)(n_vocab + n_added) + 256, max_id = -1;
    const char *key;
    json_t *v;
    json_object_foreach(vocab, key, v) {
        if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) >= limit)
            return errorf(err, "%s: vocab entry '%.60s' has an invalid id", name, key);
        if (json_integer_value(v) > max_id) max_id = json_integer_value(v);
    }
    for (size_t i = 0; i < n_added; i++) {
        json_t *id = json_object_get(json_array_get(added, i), "id");
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= limit)
            return errorf(err, "%s: added token %zu has an invalid id", name, i);
        if (json_integer_value(id) > max_id) max_id = json_integer_value(id);
    }
    t->n_ids = (int32_t)(max_id + 1);
    t->tokens = xcalloc((size_t)t->n_ids + 1, sizeof(char *));
    t->token_lens = xcalloc((size_t)t->n_ids + 1, sizeof(uint32_t));
    t->is_special = xcalloc((size_t)t->n_ids + 1, sizeof(bool));
    strmap_init(&t->vocab, n_vocab);
    json_object_foreach(vocab, key, v) {
        int32_t id = (int32_t)json_integer_value(v);
        /* jansson keys are NUL-terminated; a key with an embedded NUL is cut there. */
        size_t len = strlen(key);
        if (t->tokens[id]) return errorf(err, "%s: vocab id %d is used twice", name, id);
        t->tokens[id] = xstrdup(key);
        t->token_lens[id] = (uint32_t)len;
        strmap_put(&t->vocab, t->tokens[id], len, id);
    }

    json_t *merges = json_object_get(model, "merges");
    size_t n_merges = json_is_array(merges) ? json_array_size(merges) : 0;
    if (merges && !json_is_array(merges)) return errorf(err, "%s: model merges is not a list", name);
    mergemap_init(&t->merges, n_merges);
    Buf joined = {0};
    for (size_t i = 0; i < n_merges; i++) {
        json_t *m = json_array_get(merges, i);
        const char *a, *b;
        size_t la, lb;
        if (json_is_string(m)) {
            const char *s = json_string_value(m);
            const char *sp = strchr(s, ' ');
            if (!sp || strchr(sp + 1, ' ')) {
                free(joined.data);
                return errorf(err, "%s: merge %zu '%.60s' is not two tokens separated by a space", name, i, s);
            }
            a = s;
            la = (size_t)(sp - s);
            b = sp + 1;
            lb = strlen(b);
        } else if (json_is_array(m) && json_array_size(m) == 2 && json_is_string(json_array_get(m, 0)) &&
                   json_is_string(json_array_get(m, 1))) {
            a = json_string_value(json_array_get(m, 0));
            b = json_string_value(json_array_get(m, 1));
            la = strlen(a);
            lb = strlen(b);
        } else {
            free(joined.data);
            return errorf(err, "%s: merge %zu is neither \"a b\" nor [\"a\", \"b\"]", name, i);
        }
        int32_t ia = strmap_get(&t->vocab, a, la), ib = strmap_get(&t->vocab, b, lb);
        joined.len = 0;
        buf_append(&joined, a, la);
        buf_append(&joined, b, lb);
        int32_t ij = strmap_get(&t->vocab, joined.data, joined.len);
        if (ia < 0 || ib < 0 || ij < 0) {
            int rc = errorf(err, "%s: merge %zu ('%.*s' + '%.*s') uses a token missing from the vocab", name, i,
                            (int)(la < 40 ? la : 40), a, (int)(lb < 40 ? lb : 40), b);
            free(joined.data);
            return rc;
        }
        mergemap_put(&t->merges, ia, ib, (uint32_t)i, ij);
    }
    free(joined.data);
    return COLT_OK;
}

static int load_added_tokens(Tokenizer *t, json_t *added, const char *name, char *err) {
    if (added && !json_is_array(added)) return errorf(err, "%s: added_tokens is not a list", name);
    t->n_added = json_array_size(added);
    t->added = xcalloc(t->n_added + 1, sizeof(AddedToken));
    t->added_raw.tokens = xcalloc(t->n_added + 1, sizeof(int32_t));
    t->added_norm.tokens = xcalloc(t->n_added + 1, sizeof(int32_t));
    strmap_init(&t->added_map, t->n_added);
    for (size_t i = 0; i < t->n_added; i++) {
        json_t *o = json_array_get(added, i);
        json_t *c = json_object_get(o, "content");
        if (!json_is_string(c) || json_string_length(c) == 0)
            return errorf(err, "%s: added token %zu has no content", name, i);
        AddedToken *a = &t->added[i];
        a->len = strlen(json_string_value(c));
        a->content = xstrdup(json_string_value(c));
        a->id = (int32_t)json_integer_value(json_object_get(o, "id"));
        a->single_word = json_bool_or(o, "single_word", false);
        a->lstrip = json_bool_or(o, "lstrip", false);
        a->rstrip = json_bool_or(o, "rstrip", false);
        a->special = json_bool_or(o, "special", false);
        /* As HF's AddedToken: normalized defaults to !special. */
        a->normalized = json_bool_or(o, "normalized", !a->special);
        bool in_vocab = t->tokens[a->id] != NULL;
        t->is_special[a->id] = a->special;
        strmap_put(&t->added_map, a->content, a->len, a->id);
        a->match = a->content;
        a->match_len = a->len;
        AddedSet *set = &t->added_raw;
        if (a->normalized && t->normalizer) {
            /* Matched on normalized text, so search for the normalized form. */
            Buf cur = {0}, tmp = {0};
            buf_append(&cur, a->content, a->len);
            int rc = normalize_apply(t->normalizer, &cur, &tmp, err);
            free(tmp.data);
            if (rc) {
                free(cur.data);
                return error_prefix(err, "%s: added token '%.60s'", name, a->content);
            }
            a->match = cur.data;
            a->match_len = cur.len;
            set = &t->added_norm;
        } else if (a->normalized) {
            set = &t->added_norm;
        }
        if (!in_vocab) {
            /* HF's id_to_token gives a normalized token's normalized form,
             * and decode goes through it. */
            t->tokens[a->id] = xmalloc(a->match_len + 1);
            memcpy(t->tokens[a->id], a->match, a->match_len);
            t->tokens[a->id][a->match_len] = '\0';
            t->token_lens[a->id] = (uint32_t)a->match_len;
        }
        set->tokens[set->n++] = (int32_t)i;
        if (a->match_len) set->first_byte[(unsigned char)a->match[0]] = true;
    }
    return COLT_OK;
}

/* tokenizer_load_from_memory with the config's own name for its errors. */
static int load_from_memory(Tokenizer **out, const char *tokenizer_json, size_t len, const char *config_json,
                            size_t config_len, const char *name, const char *config_name, char *err) {
    *out = NULL;
    if (!name) name = "tokenizer.json";
    json_error_t jerr;
    json_t *root = json_loadb(tokenizer_json, len, JSON_ALLOW_NUL, &jerr);
    if (!root) return errorf(err, "%s: not valid JSON: %s (line %d, column %d)", name, jerr.text, jerr.line, jerr.column);
    Tokenizer *t = xcalloc(1, sizeof *t);
    t->name = xstrdup(name);
    t->serial = atomic_fetch_add(&tokenizer_serial_counter, 1) + 1;
    t->unk_id = -1;
    byte_level_init(t);
    int rc = COLT_ERR;
    json_t *model = json_object_get(root, "model");
    if (!json_is_object(root)) {
        errorf(err, "%s: not a JSON object", name);
        goto done;
    }
    if (!json_is_object(model)) {
        errorf(err, "%s: no \"model\" object", name);
        goto done;
    }
    const char *mtype = json_type_of(model);
    if (mtype ? strcmp(mtype, "BPE") != 0 : !json_object_get(model, "merges")) {
        errorf(err, "%s: unsupported tokenizer model '%s' (only BPE is supported)", name, mtype ? mtype : "unknown");
        goto done;
    }
    json_t *dropout = json_object_get(model, "dropout");
    if (json_is_number(dropout) && json_number_value(dropout) > 0) {
        errorf(err, "%s: BPE dropout is not supported", name);
        goto done;
    }
    json_t *csp = json_object_get(model, "continuing_subword_prefix"), *eows = json_object_get(model, "end_of_word_suffix");
    if ((json_is_string(csp) && json_string_length(csp)) || (json_is_string(eows) && json_string_length(eows))) {
        errorf(err, "%s: BPE continuing_subword_prefix/end_of_word_suffix are not supported", name);
        goto done;
    }
    json_t *added = json_object_get(root, "added_tokens");
    if (added && !json_is_array(added) && !json_is_null(added)) {
        errorf(err, "%s: added_tokens is not a list", name);
        goto done;
    }
    if (!json_is_array(added)) added = NULL;
    if (load_vocab_and_merges(t, model, added, name, err)) goto done;
    t->fuse_unk = json_bool_or(model, "fuse_unk", false);
    t->byte_fallback = json_bool_or(model, "byte_fallback", false);
    t->ignore_merges = json_bool_or(model, "ignore_merges", false);
    json_t *unk = json_object_get(model, "unk_token");
    if (json_is_string(unk)) t->unk_id = strmap_get(&t->vocab, json_string_value(unk), json_string_length(unk));
    for (int b = 0; b < 256; b++) {
        char hex[8];
        snprintf(hex, sizeof hex, "<0x%02X>", b);
        t->byte_fallback_ids[b] = strmap_get(&t->vocab, hex, 6);
        t->byte_level_ids[b] = strmap_get(&t->vocab, t->byte_level_chars[b], strlen(t->byte_level_chars[b]));
    }

    json_t *nz = json_object_get(root, "normalizer"), *pt = json_object_get(root, "pre_tokenizer"),
           *dec = json_object_get(root, "decoder");
    if (nz && !json_is_null(nz) && parse_normalizer(&t->normalizer, nz, 0, name, err)) goto done;
    if (pt && !json_is_null(pt) && parse_pre_tokenizer(&t->pre_tokenizer, pt, 0, name, err)) goto done;
    if (dec && !json_is_null(dec) && parse_decoder(&t->decoder, dec, 0, name, err)) goto done;
    if (load_added_tokens(t, added, name, err)) goto done;

    if (config_json && load_config(t, config_json, config_len, config_name, err)) goto done;
    byte_level_precompute(t);
    rc = COLT_OK;
done:
    json_decref(root);
    if (rc) {
        tokenizer_free(t);
        return COLT_ERR;
    }
    *out = t;
    return COLT_OK;
}

int tokenizer_load_from_memory(Tokenizer **out, const char *tokenizer_json, size_t len, const char *config_json,
                               size_t config_len, const char *name, char *err) {
    return load_from_memory(out, tokenizer_json, len, config_json, config_len, name, "tokenizer_config.json", err);
}

int tokenizer_load(Tokenizer **out, const char *dir, char *err) {
    *out = NULL;
    char *path = path_join(dir, "tokenizer.json"), *cpath = path_join(dir, "tokenizer_config.json");
    char *json = NULL, *cfg = NULL;
    size_t len = 0, clen = 0;
    int rc = file_read_all(path, &json, &len, err);
    if (rc == COLT_OK && file_exists(cpath)) rc = file_read_all(cpath, &cfg, &clen, err);
    if (rc == COLT_OK) rc = load_from_memory(out, json, len, cfg, clen, path, cpath, err);
    /* transformers 5 saves the template beside the config, and when that file
     * exists it wins over tokenizer_config.json's chat_template, as there. */
    char *tpath = path_join(dir, "chat_template.jinja");
    if (rc == COLT_OK && file_exists(tpath)) {
        char *tmpl = NULL;
        rc = file_read_all(tpath, &tmpl, NULL, err);
        if (rc == COLT_OK) {
            free((*out)->chat_template);
            (*out)->chat_template = tmpl;
        } else {
            tokenizer_free(*out);
            *out = NULL;
        }
    }
    free(tpath);
    free(json);
    free(cfg);
    free(path);
    free(cpath);
    return rc;
}

void tokenizer_free(Tokenizer *t) {
    if (!t) return;
    for (int32_t i = 0; i < t->n_ids; i++) free(t->tokens[i]);
    free(t->tokens);
    free(t->token_lens);
    free(t->token_bytes);
    free(t->token_byte_off);
    free(t->token_byte_len);
    free(t->is_special);
    free(t->vocab.slots);
    free(t->merges.slots);
    for (size_t i = 0; i < t->n_added; i++) {
        if (t->added[i].match != t->added[i].content) free(t->added[i].match);
        free(t->added[i].content);
    }
    free(t->added);
    free(t->added_raw.tokens);
    free(t->added_norm.tokens);
    free(t->added_map.slots);
    normalizer_free(t->normalizer);
    pre_tokenizer_free(t->pre_tokenizer);
    decoder_free(t->decoder);
    free(t->bos_token);
    free(t->eos_token);
    free(t->pad_token);
    free(t->chat_template);
    free(t->name);
    free(t);
}

/* ------------------------------------------------------------------------ */
/* Queries                                                                   */
/* ------------------------------------------------------------------------ */

int tokenizer_vocab_size(const Tokenizer *t) { return t->n_ids; }

bool tokenizer_is_special(const Tokenizer *t, int id) { return id >= 0 && id < t->n_ids && t->is_special[id]; }

int tokenizer_token_id(const Tokenizer *t, const char *token) {
    if (!token) return -1;
    size_t n = strlen(token);
    int32_t id = strmap_get(&t->added_map, token, n);
    return id >= 0 ? id : strmap_get(&t->vocab, token, n);
}

const char *tokenizer_id_to_token(const Tokenizer *t, int id) {
    return id >= 0 && id < t->n_ids ? t->tokens[id] : NULL;
}

int tokenizer_bos_id(const Tokenizer *t) { return tokenizer_token_id(t, t->bos_token); }
int tokenizer_eos_id(const Tokenizer *t) { return tokenizer_token_id(t, t->eos_token); }
int tokenizer_pad_id(const Tokenizer *t) { return tokenizer_token_id(t, t->pad_token); }
const char *tokenizer_bos_token(const Tokenizer *t) { return t->bos_token ? t->bos_token : ""; }
const char *tokenizer_eos_token(const Tokenizer *t) { return t->eos_token ? t->eos_token : ""; }
bool tokenizer_add_bos(const Tokenizer *t) { return t->add_bos; }
const char *tokenizer_chat_template(const Tokenizer *t) { return t->chat_template; }

int tokenizer_decode_generated(const Tokenizer *t, const int *ids, size_t n, bool skip_special_tokens, char **text,
                               char *err) {
    int *known = xmalloc(sizeof(int) * (n ? n : 1));
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] < tokenizer_vocab_size(t)) known[k++] = ids[i];
    int rc = tokenizer_decode(t, known, k, skip_special_tokens, text, err);
    free(known);
    return rc;
}
