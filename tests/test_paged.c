/* test_paged.c — the CPU backend's paged KV cache ops against its contiguous
 * cache ops: paged_kv_store + paged_attention over pools with a shuffled block
 * assignment must give what kv_store + attention give over [S, L, KVH*Dh]
 * caches (max |diff| <= 1e-6; the math is the same, so expect 0), and padding
 * tokens (seq -1, slot -1) must write nothing.
 *
 * Each case stores some sequences' earlier positions in a first call, then
 * runs one call that mixes a prefill, a chunked prefill, decode tokens (one at
 * context 1, one across a block boundary) and two padding tokens, in shuffled
 * order, as the engine's batches do.
 *
 * Dimension legend: N tokens, H query heads, KVH key/value heads, Dh head dim,
 * S sequences, L max length. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "core/rng.h"

#define N_SEQS 5
#define POOL_SENTINEL 777.0f /* pool rows that nothing may write keep this value */

static int g_failures = 0, g_checks = 0;
static uint64_t g_counter = 0;

static void report(const char *what, double worst, double tol) {
    int ok = worst <= tol;
    g_checks++;
    if (!ok) g_failures++;
    printf("%s %-72s max |diff| = %.3g (tol %.0e)\n", ok ? "ok  " : "FAIL", what, worst, tol);
}

static float *rand_floats(size_t n, float scale) {
    float *x = xmalloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = scale * rng_normal(21, 0, g_counter++);
    return x;
}

/* Fisher-Yates with counter-based draws, so every run sees the same order. */
static void shuffle_ints(int *a, int n) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)(rng_uniform(23, 0, g_counter++) * (float)(i + 1));
        if (j > i) j = i;
        int t = a[i];
        a[i] = a[j], a[j] = t;
    }
}

static int *i32_buffer(const Backend *be, const int *src, size_t n) {
    int *buf = be->alloc_i32(be, n);
    be->upload_i32(be, buf, src, n);
    return buf;
}

/* One token of a call: the sequence (-1: padding) and its position. */
typedef struct Token {
    int seq, pos;
} Token;

static void run_case(const Backend *be, int n_heads, int n_kv_heads, int head_dim, int block_size) {
    /* Sequence s holds positions 0..len[s]-1 after the call; positions below
     * first_new[s] were stored by an earlier call. */
    const int len[N_SEQS] = {37, 70, 130, 1, block_size + 1};
    const int first_new[N_SEQS] = {0, 69, 100, 0, block_size};
    int max_len = 0, n_old = 0, n_new = 0;
    for (int s = 0; s < N_SEQS; s++) {
        if (len[s] > max_len) max_len = len[s];
        n_old += first_new[s], n_new += len[s] - first_new[s];
    }
    int kv_dim = n_kv_heads * head_dim, max_blocks = (max_len + block_size - 1) / block_size + 1;
    int n_blocks = 3; /* spare blocks nobody owns */
    for (int s = 0; s < N_SEQS; s++) n_blocks += (len[s] + block_size - 1) / block_size;
    size_t pool_rows = (size_t)n_blocks * block_size;

    /* Block tables: a shuffled permutation of the pool, dealt out in order. */
    int *perm = xmalloc((size_t)n_blocks * sizeof(int)), *tables = xmalloc((size_t)N_SEQS * max_blocks * sizeof(int));
    for (int b = 0; b < n_blocks; b++) perm[b] = b;
    shuffle_ints(perm, n_blocks);
    int next_block = 0;
    for (int s = 0; s < N_SEQS; s++)
        for (int b = 0; b < max_blocks; b++)
            tables[s * max_blocks + b] = b * block_size < len[s] ? perm[next_block++] : -1;

    /* The two calls' tokens: first the old positions, then the new ones shuffled with two padding tokens. */
    int n_call = n_new + 2;
    Token *old = xmalloc((size_t)n_old * sizeof(Token)), *call = xmalloc((size_t)n_call * sizeof(Token));
    int k_old = 0, k_call = 0;
    for (int s = 0; s < N_SEQS; s++)
        for (int p = 0; p < len[s]; p++) {
            if (p < first_new[s]) old[k_old++] = (Token){s, p};
            else call[k_call++] = (Token){s, p};
        }
    call[k_call++] = (Token){-1, 5};
    call[k_call++] = (Token){-1, 0};
    int *order = xmalloc((size_t)n_call * sizeof(int));
    for (int i = 0; i < n_call; i++) order[i] = i;
    shuffle_ints(order, n_call);
    Token *shuffled = xmalloc((size_t)n_call * sizeof(Token));
    for (int i = 0; i < n_call; i++) shuffled[i] = call[order[i]];
    memcpy(call, shuffled, (size_t)n_call * sizeof(Token));

    /* Contiguous caches [S, L, KVH*Dh] (zero) and pools [rows, KVH*Dh] (sentinel). */
    size_t cache_n = (size_t)N_SEQS * max_len * kv_dim, pool_n = pool_rows * kv_dim;
    float *zeros = xcalloc(cache_n, sizeof(float)), *sentinel = xmalloc(pool_n * sizeof(float));
    for (size_t e = 0; e < pool_n; e++) sentinel[e] = POOL_SENTINEL;
    void *k_cache = be->alloc(be, cache_n), *v_cache = be->alloc(be, cache_n);
    void *k_pool = be->alloc(be, pool_n), *v_pool = be->alloc(be, pool_n);
    be->upload(be, k_cache, zeros, cache_n), be->upload(be, v_cache, zeros, cache_n);
    be->upload(be, k_pool, sentinel, pool_n), be->upload(be, v_pool, sentinel, pool_n);
    int *d_tables = i32_buffer(be, tables, (size_t)N_SEQS * max_blocks);

    /* Stores a batch of tokens both ways: the contiguous ops see only the real
     * tokens (they have no padding rule), the paged op sees every token. */
    for (int step = 0; step < 2; step++) {
        const Token *toks = step == 0 ? old : call;
        int n = step == 0 ? n_old : n_call, n_real = 0;
        float *k = rand_floats((size_t)n * kv_dim, 1.0f), *v = rand_floats((size_t)n * kv_dim, 1.0f);
        float *k_real = xmalloc(((size_t)n * kv_dim + 1) * sizeof(float)),
              *v_real = xmalloc(((size_t)n * kv_dim + 1) * sizeof(float));
        int *slot = xmalloc((size_t)(n + 1) * sizeof(int)), *pos = xmalloc((size_t)(n + 1) * sizeof(int));
        int *seq_all = xmalloc((size_t)(n + 1) * sizeof(int)), *pos_all = xmalloc((size_t)(n + 1) * sizeof(int));
        int *slot_mapping = xmalloc((size_t)(n + 1) * sizeof(int)), *real_index = xmalloc((size_t)(n + 1) * sizeof(int));
        for (int i = 0; i < n; i++) {
            Token t = toks[i];
            seq_all[i] = t.seq, pos_all[i] = t.pos;
            slot_mapping[i] = t.seq < 0 ? -1
                                        : tables[t.seq * max_blocks + t.pos / block_size] * block_size +
                                              t.pos % block_size;
            if (t.seq < 0) continue;
            memcpy(k_real + (size_t)n_real * kv_dim, k + (size_t)i * kv_dim, (size_t)kv_dim * sizeof(float));
            memcpy(v_real + (size_t)n_real * kv_dim, v + (size_t)i * kv_dim, (size_t)kv_dim * sizeof(float));
            slot[n_real] = t.seq, pos[n_real] = t.pos, real_index[n_real] = i, n_real++;
        }
        void *dk = be->alloc(be, (size_t)n * kv_dim), *dv = be->alloc(be, (size_t)n * kv_dim);
        void *dk_real = be->alloc(be, (size_t)n_real * kv_dim), *dv_real = be->alloc(be, (size_t)n_real * kv_dim);
        be->upload(be, dk, k, (size_t)n * kv_dim), be->upload(be, dv, v, (size_t)n * kv_dim);
        be->upload(be, dk_real, k_real, (size_t)n_real * kv_dim), be->upload(be, dv_real, v_real, (size_t)n_real * kv_dim);
        int *d_slot_mapping = i32_buffer(be, slot_mapping, (size_t)n);
        be->kv_store(be, k_cache, v_cache, dk_real, dv_real, slot, pos, n_real, kv_dim, max_len);
        be->paged_kv_store(be, k_pool, v_pool, dk, dv, d_slot_mapping, n, kv_dim);

        if (step == 1) {
            char what[160];
            size_t q_n = (size_t)n * n_heads * head_dim, row = (size_t)n_heads * head_dim;
            float *q = rand_floats(q_n, 1.5f), *q_real = xmalloc((q_n + 1) * sizeof(float));
            for (int r = 0; r < n_real; r++)
                memcpy(q_real + (size_t)r * row, q + (size_t)real_index[r] * row, row * sizeof(float));
            void *dq = be->alloc(be, q_n), *dq_real = be->alloc(be, (size_t)n_real * row);
            void *dout = be->alloc(be, q_n), *dout_real = be->alloc(be, (size_t)n_real * row);
            be->upload(be, dq, q, q_n), be->upload(be, dq_real, q_real, (size_t)n_real * row);
            int *d_seq = i32_buffer(be, seq_all, (size_t)n), *d_pos = i32_buffer(be, pos_all, (size_t)n);
            be->attention(be, dout_real, NULL, dq_real, k_cache, v_cache, slot, pos, n_real, n_heads, n_kv_heads, head_dim,
                          max_len);
            be->paged_attention(be, dout, dq, k_pool, v_pool, d_tables, d_seq, d_pos, n, n_heads, n_kv_heads, head_dim,
                                block_size, max_blocks);
            float *got = xmalloc(q_n * sizeof(float)), *ref = xmalloc(((size_t)n_real * row + 1) * sizeof(float));
            be->download(be, got, dout, q_n), be->download(be, ref, dout_real, (size_t)n_real * row);
            double worst = 0.0;
            for (int r = 0; r < n_real; r++)
                for (size_t e = 0; e < row; e++) {
                    double d = fabs((double)got[(size_t)real_index[r] * row + e] - ref[(size_t)r * row + e]);
                    if (!(d <= worst)) worst = d; /* NaN counts as worst */
                }
            snprintf(what, sizeof what, "paged_attention vs attention H=%d KVH=%d Dh=%d bs=%d N=%d (%d padding)",
                     n_heads, n_kv_heads, head_dim, block_size, n, n - n_real);
            report(what, worst, 1e-6);
            free(q), free(q_real), free(got), free(ref);
            be->free(be, dq), be->free(be, dq_real), be->free(be, dout), be->free(be, dout_real), be->free(be, d_seq), be->free(be, d_pos);
        }
        free(k), free(v), free(k_real), free(v_real), free(slot), free(pos), free(seq_all), free(pos_all);
        free(slot_mapping), free(real_index);
        be->free(be, dk), be->free(be, dv), be->free(be, dk_real), be->free(be, dv_real), be->free(be, d_slot_mapping);
    }

    /* Every stored row equals its contiguous twin; every other pool row still holds the sentinel. */
    float *kc = xmalloc(cache_n * sizeof(float)), *vc = xmalloc(cache_n * sizeof(float));
    float *kp = xmalloc(pool_n * sizeof(float)), *vp = xmalloc(pool_n * sizeof(float));
    be->download(be, kc, k_cache, cache_n), be->download(be, vc, v_cache, cache_n);
    be->download(be, kp, k_pool, pool_n), be->download(be, vp, v_pool, pool_n);
    unsigned char *owned = xcalloc(pool_rows, 1);
    double worst_rows = 0.0, worst_untouched = 0.0;
    for (int s = 0; s < N_SEQS; s++)
        for (int p = 0; p < len[s]; p++) {
            size_t prow = (size_t)tables[s * max_blocks + p / block_size] * block_size + p % block_size;
            size_t crow = (size_t)s * max_len + p;
            owned[prow] = 1;
            for (int e = 0; e < kv_dim; e++) {
                double dk = fabs((double)kp[prow * kv_dim + e] - kc[crow * kv_dim + e]);
                double dv = fabs((double)vp[prow * kv_dim + e] - vc[crow * kv_dim + e]);
                if (!(dk <= worst_rows)) worst_rows = dk;
                if (!(dv <= worst_rows)) worst_rows = dv;
            }
        }
    for (size_t r = 0; r < pool_rows; r++)
        for (int e = 0; e < kv_dim && !owned[r]; e++) {
            double dk = fabs((double)kp[r * kv_dim + e] - POOL_SENTINEL);
            double dv = fabs((double)vp[r * kv_dim + e] - POOL_SENTINEL);
            if (!(dk <= worst_untouched)) worst_untouched = dk;
            if (!(dv <= worst_untouched)) worst_untouched = dv;
        }
    char what[160];
    snprintf(what, sizeof what, "paged_kv_store rows vs kv_store KVH*Dh=%d bs=%d pool %zu rows", kv_dim, block_size,
             pool_rows);
    report(what, worst_rows, 0.0);
    snprintf(what, sizeof what, "paged_kv_store leaves unowned rows alone (padding skipped)");
    report(what, worst_untouched, 0.0);

    free(kc), free(vc), free(kp), free(vp), free(owned), free(zeros), free(sentinel);
    free(perm), free(tables), free(old), free(call), free(order), free(shuffled);
    be->free(be, k_cache), be->free(be, v_cache), be->free(be, k_pool), be->free(be, v_pool), be->free(be, d_tables);
}

int main(void) {
    const Backend *be = backend_cpu();
    const int block_sizes[2] = {16, 32};
    for (int b = 0; b < 2; b++) {
        run_case(be, 14, 2, 64, block_sizes[b]);  /* Qwen2.5-0.5B heads */
        run_case(be, 12, 2, 128, block_sizes[b]); /* Qwen2.5-1.5B heads */
        run_case(be, 4, 4, 64, block_sizes[b]);   /* no GQA */
    }
    printf("test_paged: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
