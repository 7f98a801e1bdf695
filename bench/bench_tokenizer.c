/* bench_tokenizer.c — single-threaded encode and decode throughput on GSM8K text.
 *
 * Encodes every question and answer of GSM8K train (or the JSONL given as
 * argv[1]) one text at a time, with the Qwen2.5 and stories260K tokenizers, and
 * prints a markdown table (MB/s of UTF-8 input, tokens/s, total tokens) with
 * the command and the CPU; then decodes every text's ids back (what the trainer
 * does to every completion of a round before scoring it). Best of several passes. Compare with
 * bench/bench_tokenizer_hf.py, which must report the same token totals.
 * It is not a correctness test (tests/test_tokenizer.c is). */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "bench_common.h"
#include "core/error.h"
#include "core/log.h"
#include "core/fileio.h"
#include "tokenizer/tokenizer.h"

typedef struct Texts {
    char **s;
    size_t *len;
    size_t n, cap, bytes;
} Texts;


static void texts_add(Texts *t, json_t *v) {
    if (!json_is_string(v)) return;
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 1024;
        t->s = xrealloc(t->s, t->cap * sizeof(char *));
        t->len = xrealloc(t->len, t->cap * sizeof(size_t));
    }
    t->len[t->n] = json_string_length(v);
    t->s[t->n] = xmalloc(t->len[t->n] + 1);
    memcpy(t->s[t->n], json_string_value(v), t->len[t->n] + 1);
    t->bytes += t->len[t->n];
    t->n++;
}


/* Returns the best seconds over `passes` full passes; *tokens gets the count. */
static double bench_one(const Tokenizer *tok, const Texts *texts, int passes, size_t *tokens) {
    double best = 1e30;
    char err[ERR_LEN];
    for (int p = 0; p < passes; p++) {
        size_t total = 0;
        double t0 = time_now();
        for (size_t i = 0; i < texts->n; i++) {
            int *ids;
            size_t n;
            if (tokenizer_encode(tok, texts->s[i], texts->len[i], &ids, &n, err)) {
                fprintf(stderr, "encode failed: %s\n", err);
                exit(1);
            }
            total += n;
            free(ids);
        }
        double dt = time_now() - t0;
        if (dt < best) best = dt;
        *tokens = total;
    }
    return best;
}

/* Decode: every text's ids back to text. Returns the best seconds; *tokens gets the count. */
static double bench_decode(const Tokenizer *tok, const Texts *texts, int passes, size_t *tokens) {
    char err[ERR_LEN];
    int **ids = xcalloc(texts->n, sizeof(int *));
    size_t *n = xcalloc(texts->n, sizeof(size_t)), total = 0;
    for (size_t i = 0; i < texts->n; i++) {
        if (tokenizer_encode(tok, texts->s[i], texts->len[i], &ids[i], &n[i], err)) {
            fprintf(stderr, "encode failed: %s\n", err);
            exit(1);
        }
        total += n[i];
    }
    double best = 1e30;
    for (int p = 0; p < passes; p++) {
        double t0 = time_now();
        for (size_t i = 0; i < texts->n; i++) {
            char *text;
            if (tokenizer_decode(tok, ids[i], n[i], true, &text, err)) {
                fprintf(stderr, "decode failed: %s\n", err);
                exit(1);
            }
            free(text);
        }
        double dt = time_now() - t0;
        if (dt < best) best = dt;
    }
    for (size_t i = 0; i < texts->n; i++) free(ids[i]);
    free(ids);
    free(n);
    *tokens = total;
    return best;
}

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : COLT_SHARED_DATA "/gsm8k/train.jsonl";
    int passes = argc > 2 ? atoi(argv[2]) : 3;
    if (passes < 1) passes = 1;
    char err[ERR_LEN], *data;
    size_t len;
    if (file_read_all(path, &data, &len, err)) {
        fprintf(stderr, "%s\n", err);
        return 1;
    }
    Texts texts = {0};
    char *save = NULL;
    for (char *line = strtok_r(data, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        json_t *row = json_loads(line, 0, NULL);
        if (!row) continue;
        texts_add(&texts, json_object_get(row, "question"));
        texts_add(&texts, json_object_get(row, "answer"));
        json_decref(row);
    }
    free(data);
    if (texts.n == 0) {
        fprintf(stderr, "%s: no question/answer texts found\n", path);
        return 1;
    }
    const char *names[] = {"qwen2.5", "stories260K"};
    const char *dirs[] = {COLT_SHARED_DATA "/qwen2.5-tokenizer", COLT_SHARED_DATA "/models/stories260K/hf"};
    char cpu[256];
    bench_cpu_model_name(cpu, sizeof cpu);
    printf("command: %s %s %d\n", argv[0], path, passes);
    printf("machine: %s (single thread)\n", cpu);
    printf("input: %zu texts, %.2f MB\n\n", texts.n, (double)texts.bytes / 1e6);
    printf("| tokenizer | implementation | MB/s | tokens/s | tokens |\n");
    printf("|---|---|---:|---:|---:|\n");
    for (int k = 0; k < 2; k++) {
        Tokenizer *tok;
        if (tokenizer_load(&tok, dirs[k], err)) {
            fprintf(stderr, "%s\n", err);
            return 1;
        }
        size_t tokens = 0;
        double s = bench_one(tok, &texts, passes, &tokens);
        printf("| %s | colt encode (one text at a time) | %.2f | %.0f | %zu |\n", names[k], (double)texts.bytes / 1e6 / s,
               (double)tokens / s, tokens);
        s = bench_decode(tok, &texts, passes, &tokens);
        printf("| %s | colt decode (one text at a time) | %.2f | %.0f | %zu |\n", names[k], (double)texts.bytes / 1e6 / s,
               (double)tokens / s, tokens);
        tokenizer_free(tok);
    }
    for (size_t i = 0; i < texts.n; i++) free(texts.s[i]);
    free(texts.s);
    free(texts.len);
    return 0;
}
