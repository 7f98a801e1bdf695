/* test_cuda_sample.c — the sample op of both CUDA tables (bf16 storage and its
 * fp32 twin) against the CPU op on the same logits.
 *
 * bf16 logits are rounded once: the test uploads fp32 values, downloads the
 * device copy and gives those to the CPU, so both sample the same numbers.
 * Per case (vocab, rows, sampling settings) it checks: tokens equal the CPU's in
 * at least 99% of rows over the whole run, and every mismatch is explained by
 * u falling within 1e-6 (of the kept mass) of the boundary between two tokens'
 * cumulative masses — the only difference the op allows (expf within 2 ulp,
 * sums in another order); the log-prob of the token the GPU chose within 1e-4
 * of the CPU's log-softmax at that token; padding rows untouched; each
 * sequence's history gains the token (unless full). Then: the uniforms are
 * Philox's bit for bit (uniform logits map u to floor(u * V) exactly); the
 * same call twice gives the same bits; a row's token does not depend on the
 * other rows; a CUDA graph of the op replays with new logits and counters;
 * both fast paths (batches of up to 8 unfiltered rows split over 128 CTAs
 * per row, the draw's walk by a warp) give the bits of one block per row
 * walking with one thread.
 * Exits 1 on any failure, 77 (skip) without a CUDA device. */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/sampling.h"
#include "core/rng.h"

/* cuda_sample.cu, on an instance: unfiltered batches of up to max_rows rows split; the draw's walk by one
 * thread (chunk_find). */
void cuda_sample_split_rows(const Backend *be, int max_rows);
void cuda_sample_sequential_find(const Backend *be, int on);

#define HISTORY_STRIDE 48
#define BOUNDARY_TOLERANCE 1e-6 /* share of the kept mass */
#define LOGPROB_TOLERANCE 1e-4

static int g_checks = 0, g_failures = 0;
static const Backend *CPU;

typedef struct Dev {
    const Backend *be;
    const char *tag;
} Dev;

typedef struct Case {
    const char *name;
    SamplingParams p;
    int with_history;
} Case;

/* Tokens over the whole run, per table: the 99% rule. */
typedef struct Tally {
    long rows, equal;
} Tally;

static void check(int ok, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void check(int ok, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    g_checks++;
    if (!ok) g_failures++;
    printf("%s ", ok ? "ok  " : "FAIL");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
}

/* ---------------------------------------------------------------- inputs */

/* logits[n, V], a mix of shapes by row: N(0,1), broad N(0,3), LLM-like (20
 * spikes well above N(0,2) noise) and nearly flat N(0,0.3). */
static void fill_logits(float *x, int n, int V, uint64_t salt) {
    for (int i = 0; i < n; i++) {
        float *row = x + (size_t)i * V;
        uint64_t stream = salt * 1000 + (uint64_t)i;
        float scale = (float[]){1.0f, 3.0f, 2.0f, 0.3f}[i % 4];
        for (int v = 0; v < V; v++) row[v] = scale * rng_normal(31, stream, (uint64_t)v);
        if (i % 4 == 2)
            for (int j = 0; j < 20; j++) {
                int id = (int)(rng_uniform(32, stream, (uint64_t)j) * (float)V) % V;
                row[id] = 10.0f + 0.5f * (float)j;
            }
    }
}

/* Each sequence's history: 10..49 tokens (sequence 2 full: nothing appended),
 * the row's argmax first so the penalty matters, then random ids with repeats. */
static void fill_history(int *history, int *history_len, const float *x, int n, int V) {
    for (int s = 0; s < n; s++) {
        const float *row = x + (size_t)s * V;
        int best = 0;
        for (int v = 1; v < V; v++)
            if (row[v] > row[best]) best = v;
        int len = s == 2 ? HISTORY_STRIDE : 10 + (s * 7) % (HISTORY_STRIDE - 10);
        history_len[s] = len;
        int *h = history + (size_t)s * HISTORY_STRIDE;
        for (int j = 0; j < HISTORY_STRIDE; j++) h[j] = (int)(rng_uniform(33, (uint64_t)s, (uint64_t)j) * (float)V) % V;
        h[0] = best;
        h[3] = h[1]; /* a repeat: penalised once */
    }
}

static void *dev_ints(const Backend *be, const int *src, size_t n) {
    void *buf = be->alloc_i32(be, n);
    be->upload_i32(be, buf, src, n);
    return buf;
}

/* The device inputs and outputs of one sample call, and what they read back. */
typedef struct DevCall {
    void *logits, *tokens, *logprobs, *seq, *streams, *counters, *history, *history_len;
    int *got_tokens, *got_history, *got_history_len;
    float *got_logprobs;
} DevCall;

#define TOKEN_SENTINEL (-7)
#define LOGPROB_SENTINEL 123.0f

static void dev_call_upload(DevCall *c, const Backend *be, const float *x, const int *seq, const int *streams,
                            const int *counters, const int *history, const int *history_len, int n, int V) {
    int *sentinel_tokens = malloc(sizeof(int) * (size_t)n);
    float *sentinel_logprobs = malloc(sizeof(float) * (size_t)n);
    for (int i = 0; i < n; i++) sentinel_tokens[i] = TOKEN_SENTINEL, sentinel_logprobs[i] = LOGPROB_SENTINEL;
    be->upload(be, c->logits, x, (size_t)n * V);
    be->upload_i32(be, c->tokens, sentinel_tokens, (size_t)n);
    be->upload_f32(be, c->logprobs, sentinel_logprobs, (size_t)n);
    be->upload_i32(be, c->seq, seq, (size_t)n);
    be->upload_i32(be, c->streams, streams, (size_t)n);
    be->upload_i32(be, c->counters, counters, (size_t)n);
    be->upload_i32(be, c->history, history, (size_t)n * HISTORY_STRIDE);
    be->upload_i32(be, c->history_len, history_len, (size_t)n);
    free(sentinel_tokens), free(sentinel_logprobs);
}

static void dev_call_alloc(DevCall *c, const Backend *be, int n, int V) {
    c->logits = be->alloc(be, (size_t)n * V);
    c->tokens = be->alloc_i32(be, (size_t)n);
    c->logprobs = be->alloc_f32(be, (size_t)n);
    c->seq = be->alloc_i32(be, (size_t)n);
    c->streams = be->alloc_i32(be, (size_t)n);
    c->counters = be->alloc_i32(be, (size_t)n);
    c->history = be->alloc_i32(be, (size_t)n * HISTORY_STRIDE);
    c->history_len = be->alloc_i32(be, (size_t)n);
    c->got_tokens = malloc(sizeof(int) * (size_t)n);
    c->got_logprobs = malloc(sizeof(float) * (size_t)n);
    c->got_history = malloc(sizeof(int) * (size_t)n * HISTORY_STRIDE);
    c->got_history_len = malloc(sizeof(int) * (size_t)n);
}

static void dev_call_run(DevCall *c, const Backend *be, const SamplingParams *p, int with_history, int n, int V) {
    be->sample(be, c->tokens, c->logprobs, c->logits, n, V, p, c->seq, c->streams, c->counters,
               with_history ? c->history : NULL, with_history ? c->history_len : NULL, HISTORY_STRIDE);
}

static void dev_call_download(DevCall *c, const Backend *be, int n) {
    be->download_i32(be, c->got_tokens, c->tokens, (size_t)n);
    be->download_f32(be, c->got_logprobs, c->logprobs, (size_t)n);
    be->download_i32(be, c->got_history, c->history, (size_t)n * HISTORY_STRIDE);
    be->download_i32(be, c->got_history_len, c->history_len, (size_t)n);
}

static void dev_call_free(DevCall *c, const Backend *be) {
    be->free(be, c->logits), be->free(be, c->tokens), be->free(be, c->logprobs), be->free(be, c->seq), be->free(be, c->streams);
    be->free(be, c->counters), be->free(be, c->history), be->free(be, c->history_len);
    free(c->got_tokens), free(c->got_logprobs), free(c->got_history), free(c->got_history_len);
}

/* ---------------------------------------------------------------- one case */

/* Whether the GPU's token g of a row is the CPU's draw but for u near a
 * boundary: g is kept and u lies within BOUNDARY_TOLERANCE of g's interval of
 * the kept mass, in id order. Prints the row. */
static int mismatch_explained(const float *row, int V, const SamplingParams *p, const int *history, int n_history,
                              int cpu_token, int gpu_token, float u) {
    float *logits = malloc(sizeof(float) * (size_t)V), *probs = malloc(sizeof(float) * (size_t)V);
    memcpy(logits, row, sizeof(float) * (size_t)V);
    Sampler s;
    sampler_init(&s, V);
    sampler_distribution(&s, logits, p, history, n_history, probs);
    double total = 0.0, before = 0.0;
    for (int v = 0; v < V; v++) total += probs[v];
    for (int v = 0; v < gpu_token; v++) before += probs[v];
    double after = before + probs[gpu_token];
    double distance = (double)u * total < before ? before - (double)u * total
                      : (double)u * total > after ? (double)u * total - after : 0.0;
    int explained = probs[gpu_token] > 0.0f && distance <= BOUNDARY_TOLERANCE * total;
    printf("     mismatch: cpu %d, cuda %d (p %.3g); u %.9f, cuda token's interval [%.9f, %.9f) of %.9f: %s\n",
           cpu_token, gpu_token, (double)probs[gpu_token], (double)u, before, after, total,
           explained ? "u at its boundary" : "NOT explained");
    sampler_free(&s);
    free(logits), free(probs);
    return explained;
}

static void run_case(const Dev *d, Tally *tally, int V, int n, const Case *c, uint64_t salt) {
    const Backend *be = d->be;
    size_t nv = (size_t)n * V;
    float *x = malloc(sizeof(float) * nv);
    fill_logits(x, n, V, salt);
    int *seq = malloc(sizeof(int) * (size_t)n), *streams = malloc(sizeof(int) * (size_t)n);
    int *counters = malloc(sizeof(int) * (size_t)n), *history = malloc(sizeof(int) * (size_t)n * HISTORY_STRIDE);
    int *history_len = malloc(sizeof(int) * (size_t)n);
    for (int i = 0; i < n; i++) {
        seq[i] = n > 1 && i % 6 == 5 ? -1 : i; /* padding rows */
        streams[i] = 1000 + i;
        counters[i] = (int)salt;
    }
    fill_history(history, history_len, x, n, V);

    DevCall g;
    dev_call_alloc(&g, be, n, V);
    dev_call_upload(&g, be, x, seq, streams, counters, history, history_len, n, V);
    be->download(be, x, g.logits, nv); /* the values the device holds (bf16-rounded) */
    dev_call_run(&g, be, &c->p, c->with_history, n, V);
    dev_call_download(&g, be, n);

    /* The CPU op on the same values (it clobbers its logits into z). */
    float *cpu_logits = malloc(sizeof(float) * nv), *cpu_logprobs = malloc(sizeof(float) * (size_t)n);
    int *cpu_tokens = malloc(sizeof(int) * (size_t)n), *cpu_history = malloc(sizeof(int) * (size_t)n * HISTORY_STRIDE);
    int *cpu_history_len = malloc(sizeof(int) * (size_t)n);
    memcpy(cpu_logits, x, sizeof(float) * nv);
    memcpy(cpu_history, history, sizeof(int) * (size_t)n * HISTORY_STRIDE);
    memcpy(cpu_history_len, history_len, sizeof(int) * (size_t)n);
    CPU->sample(CPU, cpu_tokens, cpu_logprobs, cpu_logits, n, V, &c->p, seq, streams, counters,
                c->with_history ? cpu_history : NULL, c->with_history ? cpu_history_len : NULL, HISTORY_STRIDE);

    int rows = 0, equal = 0, unexplained = 0, padding_ok = 1, history_ok = 1;
    double worst_logprob = 0.0;
    for (int i = 0; i < n; i++) {
        if (seq[i] < 0) {
            padding_ok &= g.got_tokens[i] == TOKEN_SENTINEL && g.got_logprobs[i] == LOGPROB_SENTINEL;
            continue;
        }
        rows++;
        int t = g.got_tokens[i];
        if (t < 0 || t >= V) {
            unexplained++;
            printf("     row %d: cuda token %d out of range\n", i, t);
            continue;
        }
        /* The log-prob of the distribution drawn from (renormalised over the kept
         * set): the CPU op's, where the two drew the same token. */
        double err = t == cpu_tokens[i] ? fabs((double)g.got_logprobs[i] - cpu_logprobs[i]) : 0.0;
        if (!(err <= worst_logprob)) worst_logprob = err;
        if (t == cpu_tokens[i]) equal++;
        else {
            float u = rng_uniform(c->p.seed, (uint64_t)streams[i], (uint64_t)counters[i]);
            const int *h = c->with_history ? history + (size_t)i * HISTORY_STRIDE : NULL;
            int n_h = c->with_history ? history_len[i] : 0;
            if (!mismatch_explained(x + (size_t)i * V, V, &c->p, h, n_h, cpu_tokens[i], t, u)) unexplained++;
        }
        if (c->with_history) {
            int len = history_len[i], full = len >= HISTORY_STRIDE;
            history_ok &= g.got_history_len[i] == (full ? len : len + 1);
            if (!full) history_ok &= g.got_history[(size_t)i * HISTORY_STRIDE + len] == t;
            history_ok &= memcmp(g.got_history + (size_t)i * HISTORY_STRIDE, history + (size_t)i * HISTORY_STRIDE,
                                 sizeof(int) * (size_t)len) == 0;
        }
    }
    tally->rows += rows, tally->equal += equal;
    check(unexplained == 0 && worst_logprob <= LOGPROB_TOLERANCE && padding_ok && history_ok,
          "%-9s V=%-6d n=%-2d %-32s tokens %d/%d equal, %d unexplained; max |dlogprob| %.2e (tol %.0e); "
          "padding %s; history %s",
          d->tag, V, n, c->name, equal, rows, unexplained, worst_logprob, LOGPROB_TOLERANCE,
          padding_ok ? "untouched" : "WRITTEN", c->with_history ? (history_ok ? "appended" : "WRONG") : "-");

    /* The same call again: the same bits. */
    if (n > 1) {
        DevCall again;
        dev_call_alloc(&again, be, n, V);
        dev_call_upload(&again, be, x, seq, streams, counters, history, history_len, n, V);
        dev_call_run(&again, be, &c->p, c->with_history, n, V);
        dev_call_download(&again, be, n);
        int same = memcmp(again.got_tokens, g.got_tokens, sizeof(int) * (size_t)n) == 0 &&
                   memcmp(again.got_logprobs, g.got_logprobs, sizeof(float) * (size_t)n) == 0;
        check(same, "%-9s V=%-6d n=%-2d %-32s deterministic: a second call gives the same tokens and log-probs",
              d->tag, V, n, c->name);
        dev_call_free(&again, be);
    }

    /* The reference: one block per row, the draw's walk by one thread (chunk_find). The default path —
     * the split path (a row over 128 CTAs) for up to 8 rows without filters or penalty, else one block per
     * row, the walk by a warp — must give the same bits. */
    {
        DevCall ref;
        dev_call_alloc(&ref, be, n, V);
        dev_call_upload(&ref, be, x, seq, streams, counters, history, history_len, n, V);
        cuda_sample_split_rows(be, 0);
        cuda_sample_sequential_find(be, 1);
        dev_call_run(&ref, be, &c->p, c->with_history, n, V);
        cuda_sample_split_rows(be, 8);
        cuda_sample_sequential_find(be, 0);
        dev_call_download(&ref, be, n);
        bool filtered = c->p.temperature != 0.0f && (c->p.top_k > 0 || c->p.top_p < 1.0f || c->p.min_p > 0.0f);
        bool split = n <= 8 && !filtered && !c->with_history;
        int same = memcmp(ref.got_tokens, g.got_tokens, sizeof(int) * (size_t)n) == 0 &&
                   memcmp(ref.got_logprobs, g.got_logprobs, sizeof(float) * (size_t)n) == 0 &&
                   (!c->with_history || memcmp(ref.got_history_len, g.got_history_len, sizeof(int) * (size_t)n) == 0);
        check(same, "%-9s V=%-6d n=%-2d %-32s %s bit-identical to one block per row walking with one thread",
              d->tag, V, n, c->name, split ? "split path (128 CTAs per row)" : "warp walk");
        dev_call_free(&ref, be);
    }

    /* Batch invariance: three rows alone give what they gave in the batch. */
    if (n >= 7) {
        int alone_ok = 1;
        for (int i = 0; i < n && i < 7; i += 3) {
            if (seq[i] < 0) continue;
            DevCall one;
            dev_call_alloc(&one, be, n, V); /* n-sized history: row i keeps its sequence id */
            dev_call_upload(&one, be, x, seq, streams, counters, history, history_len, n, V);
            int one_seq = seq[i], one_stream = streams[i], one_counter = counters[i];
            be->upload(be, one.logits, x + (size_t)i * V, (size_t)V);
            be->upload_i32(be, one.seq, &one_seq, 1);
            be->upload_i32(be, one.streams, &one_stream, 1);
            be->upload_i32(be, one.counters, &one_counter, 1);
            dev_call_run(&one, be, &c->p, c->with_history, 1, V);
            dev_call_download(&one, be, n);
            alone_ok &= one.got_tokens[0] == g.got_tokens[i] && one.got_logprobs[0] == g.got_logprobs[i];
            dev_call_free(&one, be);
        }
        check(alone_ok, "%-9s V=%-6d n=%-2d %-32s batch-invariant: rows 0, 3, 6 alone give the same token and log-prob",
              d->tag, V, n, c->name);
    }

    dev_call_free(&g, be);
    free(x), free(seq), free(streams), free(counters), free(history), free(history_len);
    free(cpu_logits), free(cpu_logprobs), free(cpu_tokens), free(cpu_history), free(cpu_history_len);
}

/* ---------------------------------------------------------------- Philox, graphs */

/* Equal logits over V = 2^16: the kept mass is exact on both sides, so the
 * token is floor(u * V) — any difference in the device's Philox shows. */
static void test_philox(const Dev *d) {
    const int V = 1 << 16, n = 256;
    const Backend *be = d->be;
    float *x = calloc((size_t)n * V, sizeof(float));
    int seq[256], streams[256], counters[256], tokens[256];
    for (int i = 0; i < n; i++) seq[i] = i, streams[i] = 77 * i + 5, counters[i] = i % 13;
    SamplingParams p = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
                        .repetition_penalty = 1.0f, .seed = 0x123456789abcULL};
    void *logits = be->alloc(be, (size_t)n * V), *g_tokens = be->alloc_i32(be, n), *g_logprobs = be->alloc_f32(be, n);
    void *g_seq = dev_ints(be, seq, n), *g_streams = dev_ints(be, streams, n), *g_counters = dev_ints(be, counters, n);
    be->upload(be, logits, x, (size_t)n * V);
    be->sample(be, g_tokens, g_logprobs, logits, n, V, &p, g_seq, g_streams, g_counters, NULL, NULL, 0);
    be->download_i32(be, tokens, g_tokens, n);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        int want = (int)(rng_uniform(p.seed, (uint64_t)streams[i], (uint64_t)counters[i]) * (float)V);
        if (tokens[i] != want) {
            if (bad < 5) printf("     row %d: cuda %d, floor(u * V) %d\n", i, tokens[i], want);
            bad++;
        }
    }
    check(bad == 0, "%-9s Philox: %d/%d rows of uniform logits (V=65536) draw floor(u * V) exactly", d->tag, n - bad, n);
    free(x);
    be->free(be, logits), be->free(be, g_tokens), be->free(be, g_logprobs), be->free(be, g_seq), be->free(be, g_streams);
    be->free(be, g_counters);
}

/* The op recorded once in a CUDA graph, replayed on new logits and counters,
 * gives what a direct call gives. */
static void test_graph(const Dev *d) {
    const Backend *be = d->be;
    if (!be->capture_begin) return;
    const int V = 151936, n = 7;
    Case c = {"graph", {.temperature = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.0f,
                        .repetition_penalty = 1.2f, .seed = 5}, 1};
    float *x = malloc(sizeof(float) * (size_t)n * V);
    int seq[7], streams[7], counters[7], history[7 * HISTORY_STRIDE], history_len[7];
    for (int i = 0; i < n; i++) seq[i] = i, streams[i] = 40 + i, counters[i] = 1;
    fill_logits(x, n, V, 900);
    fill_history(history, history_len, x, n, V);

    DevCall graph, direct;
    dev_call_alloc(&graph, be, n, V);
    dev_call_alloc(&direct, be, n, V);
    dev_call_upload(&graph, be, x, seq, streams, counters, history, history_len, n, V);
    be->capture_begin(be);
    dev_call_run(&graph, be, &c.p, 1, n, V);
    void *exec = be->capture_end(be);

    fill_logits(x, n, V, 901); /* new contents, same buffers */
    for (int i = 0; i < n; i++) counters[i] = 2;
    dev_call_upload(&graph, be, x, seq, streams, counters, history, history_len, n, V);
    be->graph_launch(be, exec);
    dev_call_download(&graph, be, n);
    dev_call_upload(&direct, be, x, seq, streams, counters, history, history_len, n, V);
    dev_call_run(&direct, be, &c.p, 1, n, V);
    dev_call_download(&direct, be, n);
    int same = memcmp(graph.got_tokens, direct.got_tokens, sizeof(int) * n) == 0 &&
               memcmp(graph.got_logprobs, direct.got_logprobs, sizeof(float) * n) == 0 &&
               memcmp(graph.got_history_len, direct.got_history_len, sizeof(int) * n) == 0;
    check(same, "%-9s CUDA graph: the captured op replayed on new logits and counters matches a direct call", d->tag);
    be->graph_free(be, exec);
    dev_call_free(&graph, be), dev_call_free(&direct, be);
    free(x);
}

/* ---------------------------------------------------------------- main */

int main(void) {
    CPU = backend_cpu();
    const Backend *f32 = backend_cuda_f32(), *bf16 = backend_cuda();
    if (!f32 || !bf16) {
        printf("no GPU (no CUDA device usable): skipping test_cuda_sample\n");
        return 77;
    }
    static const Case cases[] = {
        {"greedy", {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .repetition_penalty = 1.0f, .seed = 1}, 0},
        {"greedy, penalty 1.3", {.temperature = 0.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .repetition_penalty = 1.3f, .seed = 2}, 1},
        {"temperature 1", {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .repetition_penalty = 1.0f, .seed = 3}, 0},
        {"temperature 0.7", {.temperature = 0.7f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .repetition_penalty = 1.0f, .seed = 4}, 0},
        {"top_k 50", {.temperature = 1.0f, .top_k = 50, .top_p = 1.0f, .min_p = 0.0f, .repetition_penalty = 1.0f, .seed = 5}, 0},
        {"top_k 1", {.temperature = 1.0f, .top_k = 1, .top_p = 1.0f, .min_p = 0.0f, .repetition_penalty = 1.0f, .seed = 6}, 0},
        {"top_p 0.9", {.temperature = 1.0f, .top_k = 0, .top_p = 0.9f, .min_p = 0.0f, .repetition_penalty = 1.0f, .seed = 7}, 0},
        {"top_p 0.3", {.temperature = 1.0f, .top_k = 0, .top_p = 0.3f, .min_p = 0.0f, .repetition_penalty = 1.0f, .seed = 8}, 0},
        {"min_p 0.05", {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.05f, .repetition_penalty = 1.0f, .seed = 9}, 0},
        {"penalty 1.3", {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .repetition_penalty = 1.3f, .seed = 10}, 1},
        {"T 0.7, k 50, p 0.9, min_p 0.05, pen 1.3", {.temperature = 0.7f, .top_k = 50, .top_p = 0.9f, .min_p = 0.05f, .repetition_penalty = 1.3f, .seed = 11}, 1},
        {"T 1.2, k 1000, p 0.95", {.temperature = 1.2f, .top_k = 1000, .top_p = 0.95f, .min_p = 0.0f, .repetition_penalty = 1.0f, .seed = 12}, 0},
        {"T 1, p 0.9, pen 1.1", {.temperature = 1.0f, .top_k = 0, .top_p = 0.9f, .min_p = 0.0f, .repetition_penalty = 1.1f, .seed = 13}, 1},
    };
    const int vocabs[3] = {151936, 1000, 1001}, batches[3] = {1, 7, 64};
    Dev devs[2] = {{bf16, "cuda_bf16"}, {f32, "cuda_f32"}};
    for (int k = 0; k < 2; k++) {
        Tally tally = {0, 0};
        uint64_t salt = 1;
        for (int vi = 0; vi < 3; vi++)
            for (int bi = 0; bi < 3; bi++)
                for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++)
                    run_case(&devs[k], &tally, vocabs[vi], batches[bi], &cases[ci], salt++);
        check(tally.equal >= 0.99 * (double)tally.rows, "%-9s tokens equal to the CPU's in %ld/%ld rows (>= 99%%)",
              devs[k].tag, tally.equal, tally.rows);
        test_philox(&devs[k]);
        test_graph(&devs[k]);
    }
    printf("test_cuda_sample: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
