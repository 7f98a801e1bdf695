/* structured.c — see structured.h. The vocabulary sorted by bytes is the trie:
 * the ids whose bytes start with a prefix of length d are one run of the
 * sorted array, the shorter first, so a walk groups a run by its byte at d and
 * tests each group's prefix once. PCRE2 answers every test (JIT-compiled for
 * partial matching where the library has a JIT). On a large vocabulary the
 * subtrees under the first byte are walked by OpenMP threads, each with its
 * own match data, text copy and mask, OR-ed together at the end. */
#include "engine/structured.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <math.h>
#include <omp.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"

/* Masks kept, by the text they follow (direct-mapped on the text's hash). */
#define CACHE_ENTRIES 256
/* Vocabularies at least this large are walked by several threads. */
#define PARALLEL_MIN_TOKENS 4096

/* One thread's share of a walk. */
typedef struct Walker {
    pcre2_match_data *md;
    pcre2_match_context *mc;  /* with its own JIT stack (up to 8 MB: long texts under nested repeats) */
    pcre2_jit_stack *jit_stack;
    char *buf;          /* the text, then the prefix under test */
    size_t cap;
    uint32_t *mask;     /* [mask_words] the ids it allowed */
    int64_t matches;
} Walker;

typedef struct CacheEntry {
    char *text; /* NULL: empty entry */
    size_t len;
    uint64_t hash;
    bool full;        /* the text is a full match */
    uint32_t *words;  /* [mask_words]: the tokens allowed after it, stop ids left out */
} CacheEntry;

struct TokenRegex {
    char *pattern;
    pcre2_code *code;
    int n_walkers;
    Walker *walkers; /* [n_walkers]; walkers[0] also serves the calling thread's own matches */
    int *group_lo, *group_hi; /* [257] the runs of the sorted array by first byte, this walk's */
    int vocab_size, mask_words;
    /* The ids with bytes, sorted by their bytes (then length): [n_sorted]. */
    int n_sorted;
    int *sorted_id;
    const unsigned char **sorted_bytes;
    uint32_t *sorted_len;
    const char *const *token_bytes; /* the caller's, by id (copied pointers) */
    uint32_t *token_lens;
    uint32_t max_token_len;
    bool empty_viable;
    char *text;     /* the completion's text being looked up */
    size_t text_cap;
    CacheEntry cache[CACHE_ENTRIES];
    TokenRegexStats stats;
};

typedef struct SortItem {
    const unsigned char *bytes;
    uint32_t len;
    int id;
} SortItem;

static int sort_item_cmp(const void *a, const void *b) {
    const SortItem *x = a, *y = b;
    uint32_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->bytes, y->bytes, n);
    if (c != 0) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->id - y->id;
}

static uint64_t hash_text(const char *s, size_t n) { /* FNV-1a */
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 0x100000001b3ull;
    return h;
}

static void walker_reserve(Walker *w, size_t n) {
    if (n <= w->cap) return;
    size_t cap = w->cap ? w->cap : 256;
    while (cap < n) cap *= 2;
    w->buf = xrealloc(w->buf, cap);
    w->cap = cap;
}

/* w->buf[0, len) can still become a full match, or is one. PCRE2 reports no
 * partial match of an empty subject: the empty text is viable when it is a
 * full match or some one-byte text is viable (worked out once, at create). */
static bool viable(const TokenRegex *r, Walker *w, size_t len) {
    if (len == 0) return r->empty_viable;
    w->matches++;
    int rc = pcre2_match(r->code, (PCRE2_SPTR)w->buf, len, 0, PCRE2_PARTIAL_HARD, w->md, w->mc);
    return rc >= 0 || rc == PCRE2_ERROR_PARTIAL; /* a resource limit counts as no: a dead end is an error */
}

static bool full_match(TokenRegex *r, const char *text, size_t len) {
    r->walkers[0].matches++;
    return pcre2_match(r->code, (PCRE2_SPTR)text, len, 0, 0, r->walkers[0].md, r->walkers[0].mc) >= 0;
}

bool token_regex_full_match(TokenRegex *r, const char *text, size_t len) { return full_match(r, text, len); }

/* The ids of sorted[lo, hi), which all start with the depth bytes after the
 * text in w->buf (a viable prefix): those of exactly that length are allowed;
 * the others are grouped by their next byte, and a group is walked only when
 * its one-byte-longer prefix is still viable. */
static void walk(const TokenRegex *r, Walker *w, size_t text_len, int lo, int hi, uint32_t depth) {
    int k = lo;
    for (; k < hi && r->sorted_len[k] == depth; k++) w->mask[r->sorted_id[k] >> 5] |= 1u << (r->sorted_id[k] & 31);
    while (k < hi) {
        unsigned char c = r->sorted_bytes[k][depth];
        int end = k + 1;
        while (end < hi && r->sorted_bytes[end][depth] == c) end++;
        w->buf[text_len + depth] = (char)c;
        if (viable(r, w, text_len + depth + 1)) walk(r, w, text_len, k, end, depth + 1);
        k = end;
    }
}

/* The mask after text[0, text_len), without stop ids, and whether the text is
 * a full match. The first byte's groups are shared out among the walkers. */
static void compute_mask(TokenRegex *r, const char *text, size_t text_len, uint32_t *mask, bool *full) {
    const size_t W = (size_t)r->mask_words;
    memset(mask, 0, sizeof(uint32_t) * W);
    *full = full_match(r, text, text_len);
    Walker *w0 = &r->walkers[0];
    walker_reserve(w0, text_len + r->max_token_len + 1);
    memcpy(w0->buf, text, text_len);
    if (!viable(r, w0, text_len)) return;
    int n_groups = 0; /* every sorted token has a first byte: empty ones are left out */
    for (int k = 0; k < r->n_sorted;) {
        unsigned char c = r->sorted_bytes[k][0];
        int end = k + 1;
        while (end < r->n_sorted && r->sorted_bytes[end][0] == c) end++;
        r->group_lo[n_groups] = k;
        r->group_hi[n_groups++] = end;
        k = end;
    }
    int n_walkers = r->n_sorted >= PARALLEL_MIN_TOKENS ? r->n_walkers : 1;
#pragma omp parallel num_threads(n_walkers) if (n_walkers > 1)
    {
        Walker *w = &r->walkers[omp_get_thread_num()];
        walker_reserve(w, text_len + r->max_token_len + 1);
        memcpy(w->buf, text, text_len);
        memset(w->mask, 0, sizeof(uint32_t) * W);
#pragma omp for schedule(dynamic, 1)
        for (int g = 0; g < n_groups; g++) {
            int lo = r->group_lo[g];
            w->buf[text_len] = (char)r->sorted_bytes[lo][0];
            if (viable(r, w, text_len + 1)) walk(r, w, text_len, lo, r->group_hi[g], 1);
        }
    }
    for (int t = 0; t < n_walkers; t++)
        for (size_t k = 0; k < W; k++) mask[k] |= r->walkers[t].mask[k];
}

static int popcount_words(const uint32_t *w, int n) {
    int c = 0;
    for (int k = 0; k < n; k++) c += __builtin_popcount(w[k]);
    return c;
}

int token_regex_create(TokenRegex **out, const char *pattern, const char *const *token_bytes,
                       const uint32_t *token_lens, int vocab_size, char *err) {
    *out = NULL;
    int code_err;
    PCRE2_SIZE offset;
    pcre2_code *code = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED, &code_err, &offset,
                                     NULL);
    if (!code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code_err, msg, sizeof msg);
        return errorf(err, "regex '%s': %s at offset %zu", pattern, (const char *)msg, (size_t)offset);
    }
    pcre2_code_free(code);
    /* Anchored at the end by \z, not PCRE2_ENDANCHORED, which partial matching refuses. The pattern compiled
     * alone, so it is balanced and the group holds all of it (a trailing (?x) comment would swallow the \z). */
    size_t n_pattern = strlen(pattern);
    char *wrapped = xmalloc(n_pattern + 8);
    snprintf(wrapped, n_pattern + 8, "(?:%s)\\z", pattern);
    code = pcre2_compile((PCRE2_SPTR)wrapped, PCRE2_ZERO_TERMINATED, PCRE2_ANCHORED, &code_err, &offset, NULL);
    free(wrapped);
    if (!code) return errorf(err, "regex '%s' cannot be anchored at its end (does it end in a comment?)", pattern);
    /* JIT for both kinds of match; without a JIT (or where it fails) the interpreter runs them. */
    (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE | PCRE2_JIT_PARTIAL_HARD);
    TokenRegex *r = xcalloc(1, sizeof *r);
    r->pattern = xstrdup(pattern);
    r->code = code;
    r->n_walkers = omp_get_max_threads() > 0 ? omp_get_max_threads() : 1;
    r->walkers = xcalloc((size_t)r->n_walkers, sizeof(Walker));
    for (int t = 0; t < r->n_walkers; t++) {
        r->walkers[t].md = pcre2_match_data_create_from_pattern(code, NULL);
        r->walkers[t].mc = pcre2_match_context_create(NULL);
        r->walkers[t].jit_stack = pcre2_jit_stack_create(32 << 10, 8 << 20, NULL);
        if (r->walkers[t].jit_stack) pcre2_jit_stack_assign(r->walkers[t].mc, NULL, r->walkers[t].jit_stack);
        r->walkers[t].mask = xmalloc(sizeof(uint32_t) * (size_t)((vocab_size + 31) / 32 > 0 ? (vocab_size + 31) / 32 : 1));
    }
    r->group_lo = xmalloc(sizeof(int) * 257);
    r->group_hi = xmalloc(sizeof(int) * 257);
    r->vocab_size = vocab_size;
    r->mask_words = (vocab_size + 31) / 32;
    r->token_bytes = xmalloc(sizeof(char *) * (size_t)(vocab_size > 0 ? vocab_size : 1));
    memcpy((void *)r->token_bytes, token_bytes, sizeof(char *) * (size_t)vocab_size);
    r->token_lens = xmalloc(sizeof(uint32_t) * (size_t)(vocab_size > 0 ? vocab_size : 1));
    memcpy(r->token_lens, token_lens, sizeof(uint32_t) * (size_t)vocab_size);

    SortItem *items = xmalloc(sizeof(SortItem) * (size_t)(vocab_size > 0 ? vocab_size : 1));
    int n = 0;
    for (int v = 0; v < vocab_size; v++) {
        if (!token_bytes[v] || token_lens[v] == 0) continue; /* an empty token would never move the text */
        items[n++] = (SortItem){(const unsigned char *)token_bytes[v], token_lens[v], v};
        if (token_lens[v] > r->max_token_len) r->max_token_len = token_lens[v];
    }
    qsort(items, (size_t)n, sizeof(SortItem), sort_item_cmp);
    r->n_sorted = n;
    r->sorted_id = xmalloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
    r->sorted_bytes = xmalloc(sizeof(char *) * (size_t)(n > 0 ? n : 1));
    r->sorted_len = xmalloc(sizeof(uint32_t) * (size_t)(n > 0 ? n : 1));
    for (int k = 0; k < n; k++) {
        r->sorted_id[k] = items[k].id;
        r->sorted_bytes[k] = items[k].bytes;
        r->sorted_len[k] = items[k].len;
    }
    free(items);

    /* The empty completion: some text must be reachable from it. */
    walker_reserve(&r->walkers[0], (size_t)r->max_token_len + 1);
    r->empty_viable = full_match(r, "", 0);
    for (int b = 0; b < 256 && !r->empty_viable; b++) {
        r->walkers[0].buf[0] = (char)b;
        r->empty_viable = viable(r, &r->walkers[0], 1);
    }
    if (!r->empty_viable) {
        errorf(err, "regex '%s' matches no text: no completion can satisfy it", pattern);
        token_regex_free(r);
        return COLT_ERR;
    }
    uint32_t *mask = xmalloc(sizeof(uint32_t) * (size_t)(r->mask_words > 0 ? r->mask_words : 1));
    bool full;
    compute_mask(r, "", 0, mask, &full);
    int allowed = popcount_words(mask, r->mask_words);
    free(mask);
    if (allowed == 0 && !full) {
        errorf(err, "regex '%s': no token of the vocabulary (%d ids) can start a match", pattern, vocab_size);
        token_regex_free(r);
        return COLT_ERR;
    }
    memset(&r->stats, 0, sizeof r->stats);
    for (int t = 0; t < r->n_walkers; t++) r->walkers[t].matches = 0;
    *out = r;
    return COLT_OK;
}

void token_regex_free(TokenRegex *r) {
    if (!r) return;
    for (int k = 0; k < CACHE_ENTRIES; k++) free(r->cache[k].text), free(r->cache[k].words);
    for (int t = 0; t < r->n_walkers; t++) {
        pcre2_match_data_free(r->walkers[t].md);
        pcre2_match_context_free(r->walkers[t].mc);
        pcre2_jit_stack_free(r->walkers[t].jit_stack);
        free(r->walkers[t].buf), free(r->walkers[t].mask);
    }
    free(r->walkers), free(r->group_lo), free(r->group_hi);
    pcre2_code_free(r->code);
    free(r->pattern), free((void *)r->token_bytes), free(r->token_lens);
    free(r->sorted_id), free(r->sorted_bytes), free(r->sorted_len), free(r->text);
    free(r);
}

const char *token_regex_pattern(const TokenRegex *r) { return r->pattern; }
int token_regex_vocab_size(const TokenRegex *r) { return r->vocab_size; }
int token_regex_mask_words(const TokenRegex *r) { return r->mask_words; }
void token_regex_stats(const TokenRegex *r, TokenRegexStats *out) {
    *out = r->stats;
    for (int t = 0; t < r->n_walkers; t++) out->matches += r->walkers[t].matches;
}

int token_regex_mask(TokenRegex *r, uint32_t *mask, const int *tokens, int n_tokens, const int *stop_ids, int n_stop) {
    double t0 = time_now();
    size_t len = 0;
    for (int k = 0; k < n_tokens; k++) {
        int id = tokens[k];
        if (id < 0 || id >= r->vocab_size || !r->token_bytes[id]) continue;
        if (len + r->token_lens[id] + 1 > r->text_cap) {
            r->text_cap = 2 * (len + r->token_lens[id] + 1) + 256;
            r->text = xrealloc(r->text, r->text_cap);
        }
        memcpy(r->text + len, r->token_bytes[id], r->token_lens[id]);
        len += r->token_lens[id];
    }
    if (!r->text) r->text = xmalloc(r->text_cap = 256);
    uint64_t h = hash_text(r->text, len);
    CacheEntry *c = &r->cache[h % CACHE_ENTRIES];
    bool full;
    r->stats.masks++;
    if (c->text && c->hash == h && c->len == len && memcmp(c->text, r->text, len) == 0) {
        memcpy(mask, c->words, sizeof(uint32_t) * (size_t)r->mask_words);
        full = c->full;
        r->stats.cached++;
    } else {
        compute_mask(r, r->text, len, mask, &full);
        free(c->text);
        c->text = xmalloc(len + 1);
        memcpy(c->text, r->text, len);
        c->len = len;
        c->hash = h;
        c->full = full;
        if (!c->words) c->words = xmalloc(sizeof(uint32_t) * (size_t)(r->mask_words > 0 ? r->mask_words : 1));
        memcpy(c->words, mask, sizeof(uint32_t) * (size_t)r->mask_words);
    }
    /* a stop id ends the completion (its bytes are not text): only after a full match, whatever its bytes */
    for (int k = 0; k < n_stop; k++) {
        int id = stop_ids[k];
        if (id < 0 || id >= r->vocab_size) continue;
        if (full) mask[id >> 5] |= 1u << (id & 31);
        else mask[id >> 5] &= ~(1u << (id & 31));
    }
    r->stats.seconds += time_now() - t0;
    return popcount_words(mask, r->mask_words);
}

void token_mask_apply(float *logits, const uint32_t *mask, int vocab_size) {
    for (int v = 0; v < vocab_size; v++)
        if (!(mask[v >> 5] >> (v & 31) & 1u)) logits[v] = -INFINITY;
}
