/* test_choice_text.c — a streamed choice's text (serve/openai.c choice_text_update), decoded incrementally,
 * against the whole completion decoded at once, for a sentencepiece-style tokenizer with byte fallback
 * (models/stories260K) and a byte-level BPE one (Qwen2.5, ../shared/data/qwen2.5-tokenizer). Token
 * sequences: texts with multi-byte characters (accents, Greek, CJK, emoji) encoded, random ids, special
 * tokens and ids past the vocabulary mixed in, a stop token at the end; fed one token at a time and in random
 * chunks of 1-7. Checked:
 *   a. the final text is tokenizer_decode_generated of the whole completion (the stop token left out);
 *   b. after every update, the text up to choice_text_stream_end is a prefix of the final text, and the
 *      bytes streamed, put together, are the final text;
 *   c. a stop string (cut out of the text: across tokens, a lone multi-byte character) cuts where it first
 *      occurs in the whole text, finish_reason "stop";
 *   d. the ids decoded stay linear in the length (20,000 tokens one at a time, ChoiceText.n_decoded).
 * Random ids for stories260K leave out its byte tokens: an invalid byte run is decoded whole into U+FFFDs,
 * which takes back text already shown (no prefix to keep); such sequences are checked for (a) alone.
 * Without ../shared/data the Qwen part is skipped and the test exits 77 after the stories260K part. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "harness.h"
#include "serve/openai.h"
#include "shared_data.h"
#include "tokenizer/tokenizer.h"

static uint64_t g_rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(uint32_t n) {
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (uint32_t)(g_rng % n);
}

static const char *TEXTS[] = {
    "Once upon a time, there was a little girl named Lily. She loved to play outside.",
    "Café, naïve, émigré, Zürich, São Paulo: déjà vu. Ελληνικά και русский текст.",
    "中文字符和日本語のテキスト、한국어도 있습니다。最後に句点。",
    "Emoji: 😀🎉👩‍👩‍👧 and flags 🇫🇷🇯🇵, then 🙂 again 😀.",
    "Mixed: a中b😀c é\n\n\tTabs, \"quotes\" and <tags> {braces} \\ backslash.",
};

typedef struct Tok {
    const char *name;
    Tokenizer *t;
    int specials[8], n_specials;
    int eos;
    int random_from, random_to; /* the ids random sequences draw from */
} Tok;

typedef struct Case {
    int *ids, n;
    bool stop_token;    /* ids[n - 1] is a stop token (left out of the text) */
    bool prefix_stable; /* (b) and (c) hold */
} Case;

static char *decode_whole(const Tok *k, const int *ids, int n) {
    char *s = NULL, err[ERR_LEN];
    if (tokenizer_decode_generated(k->t, ids, (size_t)n, true, &s, err) != 0) {
        printf("decode: %s\n", err);
        return calloc(1, 1);
    }
    return s;
}

/* Feeds c to a ChoiceText in chunks (max_chunk 1: one token at a time) with the stop strings given; checks
 * (a)-(c) against the whole text. Returns the ids decoded. */
static long long feed(const Tok *k, const Case *c, int max_chunk, char **stops, int n_stops, const char *what) {
    OpenAIRequest req = {.endpoint = OPENAI_COMPLETIONS, .stream = true, .stop_strings = stops,
                         .n_stop_strings = n_stops};
    GenSequence g = {.tokens = c->ids, .n_tokens = c->n};
    int n_text = c->n - (c->stop_token ? 1 : 0);
    char *whole = decode_whole(k, c->ids, n_text), *want = whole;
    bool want_stop = false;
    for (int i = 0; i < n_stops; i++) {
        char *at = strstr(whole, stops[i]);
        if (at && (!want_stop || at < want)) want = at, want_stop = true;
    }
    size_t want_len = want_stop ? (size_t)(want - whole) : strlen(whole);
    ChoiceText ct = {0};
    ChoiceProgress p = {0};
    char err[ERR_LEN], *sent = calloc(1, 1);
    size_t n_sent = 0, end = 0;
    bool hit = false, prefix_ok = true, hit_seen = false;
    int updates = 0;
    while (!ct.finished) {
        if (p.n_ready < c->n) p.n_ready += 1 + (int)rnd((uint32_t)max_chunk);
        if (p.n_ready >= c->n) {
            p.n_ready = c->n;
            p.done = true;
            p.finish = c->stop_token ? FINISH_STOP : FINISH_LENGTH;
        }
        if (choice_text_update(&ct, &g, &p, &req, k->t, &hit, err) != 0) {
            printf("FAIL %s: %s\n", what, err);
            g_failures++;
            break;
        }
        hit_seen |= hit;
        end = choice_text_stream_end(&ct, &req);
        if (c->prefix_stable && ++updates % 64 == 0) prefix_ok &= end <= want_len && !memcmp(ct.text, whole, end);
        else if (c->prefix_stable) prefix_ok &= end <= want_len && !memcmp(ct.text + ct.streamed, whole + ct.streamed,
                                                                         end - ct.streamed);
        sent = realloc(sent, n_sent + end - ct.streamed + 1);
        memcpy(sent + n_sent, ct.text + ct.streamed, end - ct.streamed);
        n_sent += end - ct.streamed;
        sent[n_sent] = '\0';
        ct.streamed = end;
    }
    whole[want_len] = '\0';
    CHECK(!strcmp(ct.text ? ct.text : "", whole),
          "%s: (a) the final text is not the whole decode's (%zu bytes vs %zu)", what, ct.text_len, strlen(whole));
    if (c->prefix_stable) {
        CHECK(prefix_ok, "%s: (b) streamed text is not a prefix of the final text", what);
        CHECK(n_sent == ct.text_len && !strcmp(sent, ct.text), "%s: (b) the bytes streamed are not the final text",
              what);
        CHECK(want_stop == hit_seen && (!want_stop || !strcmp(ct.finish_reason, "stop")),
              "%s: (c) stop string found %d, expected %d", what, hit_seen, want_stop);
    }
    long long decoded = ct.n_decoded;
    choice_text_free(&ct);
    free(sent), free(whole);
    return decoded;
}

static int *encode(const Tok *k, const char *text, int *n) {
    int *ids = NULL;
    size_t n_ids = 0;
    char err[ERR_LEN];
    if (tokenizer_encode(k->t, text, strlen(text), &ids, &n_ids, err) != 0) printf("encode: %s\n", err);
    *n = (int)n_ids;
    return ids;
}

#define REPLACEMENT "\xEF\xBF\xBD"

/* A stop string cut out of text at a random character boundary, 1-4 characters long, without U+FFFD (which
 * a prefix's text may end in before its character completes, so a stop string of it may cut there first). */
static char *random_stop(const char *text) {
    size_t len = strlen(text);
    if (len == 0) return NULL;
    for (int tries = 0; tries < 20; tries++) {
    size_t from = rnd((uint32_t)len);
    while (from > 0 && ((unsigned char)text[from] & 0xC0) == 0x80) from--;
    size_t to = from;
    for (int chars = 1 + (int)rnd(4); chars > 0 && to < len; chars--) {
        to++;
        while (to < len && ((unsigned char)text[to] & 0xC0) == 0x80) to++;
    }
    char *s = malloc(to - from + 1);
    memcpy(s, text + from, to - from);
    s[to - from] = '\0';
    if (!strstr(s, REPLACEMENT)) return s;
    free(s);
    }
    return NULL;
}

/* The first multi-byte character of text but U+FFFD (NULL: none). */
static char *multibyte_char(const char *text) {
    for (const char *s = text; *s; s++)
        if ((unsigned char)*s >= 0xC0 && strncmp(s, REPLACEMENT, 3) != 0) {
            size_t l = 1;
            while (((unsigned char)s[l] & 0xC0) == 0x80) l++;
            char *c = malloc(l + 1);
            memcpy(c, s, l);
            c[l] = '\0';
            return c;
        }
    return NULL;
}

/* Special tokens and ids past the vocabulary (a model's padded rows) put in at random. */
static void sprinkle(const Tok *k, Case *c, int every) {
    int *ids = malloc(sizeof(int) * (size_t)(2 * c->n + 2)), n = 0;
    for (int i = 0; i < c->n; i++) {
        if (every && rnd((uint32_t)every) == 0)
            ids[n++] = rnd(4) == 0 ? tokenizer_vocab_size(k->t) + (int)rnd(64)
                                   : k->specials[rnd((uint32_t)k->n_specials)];
        ids[n++] = c->ids[i];
    }
    free(c->ids);
    c->ids = ids;
    c->n = n;
}

static void add_stop_token(const Tok *k, Case *c) {
    c->ids = realloc(c->ids, sizeof(int) * (size_t)(c->n + 1));
    c->ids[c->n++] = k->eos;
    c->stop_token = true;
}

static void run_case(const Tok *k, Case *c, const char *what) {
    char name[160], *whole = decode_whole(k, c->ids, c->n - (c->stop_token ? 1 : 0));
    for (int chunk = 1; chunk <= 7; chunk += 6) {
        snprintf(name, sizeof name, "%s %s chunks 1-%d", k->name, what, chunk);
        feed(k, c, chunk, NULL, 0, name);
        if (!c->prefix_stable) continue;
        for (int r = 0; r < 3; r++) { /* stop strings out of the text: they occur, across tokens or not */
            char *stop = random_stop(whole);
            if (!stop) break;
            char *stops[2] = {stop, "\x01never"};
            snprintf(name, sizeof name, "%s %s chunks 1-%d stop \"%s\"", k->name, what, chunk, stop);
            feed(k, c, chunk, stops, 2, name);
            free(stop);
        }
        char *mb = multibyte_char(whole);
        if (mb) {
            snprintf(name, sizeof name, "%s %s chunks 1-%d stop \"%s\"", k->name, what, chunk, mb);
            feed(k, c, chunk, &mb, 1, name);
            free(mb);
        }
    }
    free(whole);
}

static void test_tokenizer(Tok *k) {
    int n_cases = 0;
    /* texts, alone and with special tokens and a stop token */
    for (size_t i = 0; i < sizeof TEXTS / sizeof *TEXTS; i++) {
        for (int variant = 0; variant < 3; variant++) {
            Case c = {.prefix_stable = true};
            c.ids = encode(k, TEXTS[i], &c.n);
            if (variant >= 1) sprinkle(k, &c, 4);
            if (variant == 2) add_stop_token(k, &c);
            char what[64];
            snprintf(what, sizeof what, "text %zu variant %d", i, variant);
            run_case(k, &c, what);
            free(c.ids);
            n_cases++;
        }
    }
    /* random ids */
    for (int r = 0; r < 40; r++) {
        Case c = {.n = 1 + (int)rnd(60), .prefix_stable = true};
        c.ids = malloc(sizeof(int) * (size_t)c.n);
        for (int i = 0; i < c.n; i++) c.ids[i] = k->random_from + (int)rnd((uint32_t)(k->random_to - k->random_from));
        sprinkle(k, &c, r % 2 ? 5 : 0);
        if (r % 3 == 0) add_stop_token(k, &c);
        char what[64];
        snprintf(what, sizeof what, "random ids %d", r);
        run_case(k, &c, what);
        free(c.ids);
        n_cases++;
    }
    /* random ids over the whole vocabulary (stories260K's byte tokens included): the final text alone */
    for (int r = 0; r < 40; r++) {
        Case c = {.n = 1 + (int)rnd(60)};
        c.ids = malloc(sizeof(int) * (size_t)c.n);
        for (int i = 0; i < c.n; i++) c.ids[i] = (int)rnd((uint32_t)tokenizer_vocab_size(k->t));
        char what[64];
        snprintf(what, sizeof what, "any ids %d", r);
        run_case(k, &c, what);
        free(c.ids);
        n_cases++;
    }
    /* (d) 20,000 tokens one at a time: decoding stays linear (quadratic would be ~2e8 ids) */
    Case c = {.prefix_stable = true};
    c.ids = malloc(sizeof(int) * 20000);
    while (c.n < 20000) {
        int n_text = 0, *ids = encode(k, TEXTS[rnd(sizeof TEXTS / sizeof *TEXTS)], &n_text);
        for (int i = 0; i < n_text && c.n < 20000; i++) c.ids[c.n++] = ids[i];
        free(ids);
    }
    c.ids[c.n / 2] = k->specials[0];
    char *stops[1] = {"\x01never"};
    double t0 = now_s();
    long long decoded = feed(k, &c, 1, stops, 1, "20,000 tokens");
    printf("%s: %d cases; 20,000 tokens one at a time: %lld ids decoded (%.1f per token), %.2f s\n", k->name,
           n_cases, decoded, (double)decoded / c.n, now_s() - t0);
    CHECK(decoded <= 8LL * c.n, "%s: (d) %lld ids decoded for %d tokens", k->name, decoded, c.n);
    free(c.ids);
}

int main(void) {
    char err[ERR_LEN];
    Tok stories = {.name = "stories260K", .specials = {0, 1, 2}, .n_specials = 3, .eos = 2, .random_from = 259,
                   .random_to = 512};
    if (tokenizer_load(&stories.t, COLT_SOURCE_DIR "/models/stories260K", err) != 0) {
        printf("FAIL: %s\n", err);
        return 1;
    }
    test_tokenizer(&stories);
    tokenizer_free(stories.t);
    bool qwen = shared_data_present();
    if (qwen) {
        Tok q = {.name = "Qwen2.5", .specials = {151643, 151644, 151645, 151646, 151647, 151648},
                 .n_specials = 6, .eos = 151645, .random_from = 0, .random_to = 151643};
        if (tokenizer_load(&q.t, COLT_SHARED_DATA "/qwen2.5-tokenizer", err) != 0) {
            printf("FAIL: %s\n", err);
            return 1;
        }
        test_tokenizer(&q);
        tokenizer_free(q.t);
    } else {
        shared_data_skipped("Qwen2.5 tokenizer (byte-level BPE) cases");
    }
    printf("%d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0; /* without ../shared/data the stories260K part still ran (shared_data.h) */
}
