/* fuzz_tokenizer.c — libFuzzer target for the tokenizer.
 *
 * Input whose first byte is even: the rest is text, encoded and decoded with
 * stories260K (byte_fallback, normalizers, added tokens), loaded once; the ids
 * are decoded with both skip modes. Odd first byte: the rest is a
 * tokenizer.json (and, after a NUL, a tokenizer_config.json) for
 * tokenizer_load_from_memory; when it loads, a fixed text is encoded and
 * decoded with it. Either may fail with an error; it must never crash, leak or
 * hit undefined behaviour. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/tokenizer.h"

static void roundtrip(const Tokenizer *t, const char *text, size_t len) {
    char err[ERR_LEN];
    int *ids;
    size_t n;
    if (tokenizer_encode(t, text, len, &ids, &n, err) == 0) {
        for (int skip = 0; skip < 2; skip++) {
            char *out;
            if (tokenizer_decode(t, ids, n, skip, &out, err) == 0) free(out);
        }
        free(ids);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    static Tokenizer *stories;
    char err[ERR_LEN];
    if (!stories && tokenizer_load(&stories, COLT_SHARED_DATA "/models/stories260K/hf", err)) {
        fprintf(stderr, "fuzz_tokenizer: %s\n", err);
        abort();
    }
    if (size == 0) return 0;
    const char *body = (const char *)data + 1;
    size_t len = size - 1;
    if ((data[0] & 1) == 0) {
        roundtrip(stories, body, len);
        /* Ids straight from the input, some out of range. */
        size_t n = len / 2;
        int *ids = malloc((n + 1) * sizeof(int));
        for (size_t i = 0; i < n; i++) ids[i] = (int)(((unsigned)data[1 + 2 * i] << 8 | data[2 + 2 * i]) % 600);
        char *out;
        if (tokenizer_decode(stories, ids, n, data[0] & 2, &out, err) == 0) free(out);
        free(ids);
        return 0;
    }
    const char *nul = memchr(body, '\0', len);
    size_t json_len = nul ? (size_t)(nul - body) : len;
    const char *cfg = nul ? nul + 1 : NULL;
    size_t cfg_len = nul ? len - json_len - 1 : 0;
    Tokenizer *t;
    if (tokenizer_load_from_memory(&t, body, json_len, cfg, cfg_len, "fuzz.json", err) == 0) {
        static const char text[] = "Hello world! <s> caf\xc3\xa9 \xf0\x9f\x98\x80 123  \n\t 'll";
        roundtrip(t, text, sizeof text - 1);
        int ids[] = {0, 1, 2, 3, 4, 5};
        int nv = tokenizer_vocab_size(t);
        char *out;
        if (tokenizer_decode(t, ids, nv < 6 ? (size_t)nv : 6, false, &out, err) == 0) free(out);
        tokenizer_free(t);
    }
    return 0;
}
