/* test_cuda_paged.c — the CUDA engine ops of cuda_paged.cu against the CPU
 * reference, on both CUDA tables (cuda_f32: fp32 storage, cuda: bf16 storage):
 * [i32] buffers, embedding_i32, gather_rows_i32 and paged_kv_store (exact),
 * rope_i32 (bit-identical to the same table's rope), paged_attention for the
 * Qwen2.5 0.5B / 1.5B / 7B head shapes and a few odd ones (generic path, head
 * chunks) over contexts 1..2000 and batches 1..256, with splits automatic,
 * forced off and forced on (COLT_PAGED_SPLITS), and on bf16 the tensor-core path's tokens grouped
 * per CTA or not (COLT_PAGED_TC_TOKENS, bit-identical); then paged_attention captured
 * in a CUDA graph and replayed with new positions, and its speed.
 *
 * Tolerances as test_cuda_ops: cuda_f32 within f32_rel * max|ref|; cuda within
 * bf16_abs * max|ref| + |ref| * bf16_k * 2^-8, the inputs rounded to bf16 once
 * (uploaded, read back, and given to the CPU op as such). Padding rows (seq -1)
 * have unspecified outputs and are not compared. Exits 1 on any failure, 77
 * (skip) without a CUDA device.
 *
 * Dimension legend: N tokens, D row width, H query heads, KVH key/value heads,
 * Dh head dim, V vocab. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../rope_table.h"
#include "backend/backend.h"
#include "backend/cuda/cuda_bench.h"
#include "backend/cuda/cuda_instance.h"
#include "backend_op_cases.h"
#include "core/error.h"

static int g_failures = 0, g_checks = 0;
static uint64_t g_random_state = 0x2545f4914f6cdd1dull;
static const Backend *CPU;

typedef struct Dev {
    const Backend *be;
    int bf16;
    const char *tag;
} Dev;

/* f32 table: |err| <= f32_rel * max|ref|. bf16 table: |err| <= bf16_abs * max|ref| + |ref| * bf16_k * 2^-8. */
typedef struct Tol {
    double f32_rel, bf16_abs, bf16_k;
} Tol;

/* ---------------------------------------------------------------- helpers */

/* splitmix64: the pools hold up to ~10^8 values, too many for Philox normals. */
static uint64_t next_random(void) {
    uint64_t z = (g_random_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform values of standard deviation `scale`. */
static float *rand_floats(size_t n, float scale) {
    float *x = xmalloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = scale * 1.7320508f * (2.0f * (float)(next_random() >> 40) / 16777216.0f - 1.0f);
    return x;
}

static int rand_int(int lo, int hi) { /* inclusive */
    return lo + (int)(next_random() % (uint64_t)(hi - lo + 1));
}

static void shuffle_ints(int *a, int n) {
    for (int i = n - 1; i > 0; i--) {
        int j = rand_int(0, i), t = a[i];
        a[i] = a[j], a[j] = t;
    }
}

static void count_check(int ok) {
    g_checks++;
    if (!ok) g_failures++;
}

/* Compares got (CUDA) with ref (CPU) under t, prints one line, counts failures. */
static void check(const Dev *d, const char *what, const float *got, const float *ref, size_t n, Tol t) {
    count_check(op_check_against(d->tag, d->bf16, what, got, ref, n, (OpTol){0, t.f32_rel, t.bf16_abs, t.bf16_k}));
}

/* Bitwise equality of two downloads of the same table (fp32 holds bf16 exactly). */
static void check_identical(const Dev *d, const char *what, const float *a, const float *b, size_t n) {
    size_t n_diff = 0;
    for (size_t i = 0; i < n; i++) n_diff += memcmp(&a[i], &b[i], sizeof(float)) != 0;
    int ok = n > 0 && n_diff == 0;
    count_check(ok);
    printf("%s %-9s %-78s %zu of %zu elements differ\n", ok ? "ok  " : "FAIL", d->tag, what, n_diff, n);
}

/* ---------------------------------------------------------------- [i32] buffers and row ops */

static void test_i32_buffers(const Dev *d, size_t n) {
    int *host = xmalloc(n * sizeof(int)), *back = xmalloc(n * sizeof(int));
    void *buf = d->be->alloc_i32(d->be, n);
    d->be->download_i32(d->be, back, buf, n);
    size_t nonzero = 0, differ = 0;
    for (size_t i = 0; i < n; i++) nonzero += back[i] != 0, host[i] = rand_int(-1000000, 1000000);
    d->be->upload_i32(d->be, buf, host, n);
    d->be->download_i32(d->be, back, buf, n);
    for (size_t i = 0; i < n; i++) differ += back[i] != host[i];
    count_check(nonzero == 0 && differ == 0);
    printf("%s %-9s %-78s %zu nonzero after alloc, %zu differ after round trip\n",
           nonzero == 0 && differ == 0 ? "ok  " : "FAIL", d->tag, "alloc_i32 (zeroed) / upload_i32 / download_i32",
           nonzero, differ);
    free(host), free(back);
    d->be->free(d->be, buf);
}

static void test_embedding_i32(const Dev *d, int vocab, int dim, int n) {
    char name[160];
    size_t nt = (size_t)vocab * dim, no = (size_t)n * dim;
    int *ids = xmalloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) ids[i] = i % 3 == 2 ? ids[i - 1] : rand_int(0, vocab - 1); /* repeats */
    ids[0] = vocab - 1;
    float *t = rand_floats(nt, 1.0f);
    void *gt = op_upload(d->be, t, nt), *go = d->be->alloc(d->be, no), *ct = op_upload(CPU, t, nt),
         *co = CPU->alloc(CPU, no);
    void *gids = op_upload_i32(d->be, ids, (size_t)n);
    d->be->embedding_i32(d->be, go, gt, gids, n, dim);
    CPU->embedding(CPU, co, ct, ids, n, dim);
    float *got = op_fetch(d->be, go, no), *ref = op_fetch(CPU, co, no);
    snprintf(name, sizeof name, "embedding_i32 V=%d D=%d N=%d (exact)", vocab, dim, n);
    check(d, name, got, ref, no, (Tol){0, 0, 0});
    free(ids), free(t), free(got), free(ref);
    d->be->free(d->be, gt), d->be->free(d->be, go), d->be->free(d->be, gids), CPU->free(CPU, ct), CPU->free(CPU, co);
}

static void test_gather_rows_i32(const Dev *d, int src_rows, int dim, int n) {
    char name[160];
    size_t ns = (size_t)src_rows * dim, no = (size_t)n * dim;
    int *rows = xmalloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) rows[i] = rand_int(0, src_rows - 1);
    float *s = rand_floats(ns, 1.0f);
    void *gs = op_upload(d->be, s, ns), *go = d->be->alloc(d->be, no), *cs = op_upload(CPU, s, ns),
         *co = CPU->alloc(CPU, no);
    void *grows = op_upload_i32(d->be, rows, (size_t)n);
    d->be->gather_rows_i32(d->be, go, gs, grows, n, dim);
    CPU->gather_rows(CPU, co, cs, rows, n, dim);
    float *got = op_fetch(d->be, go, no), *ref = op_fetch(CPU, co, no);
    snprintf(name, sizeof name, "gather_rows_i32 [%d,%d] N=%d (exact)", src_rows, dim, n);
    check(d, name, got, ref, no, (Tol){0, 0, 0});
    free(rows), free(s), free(got), free(ref);
    d->be->free(d->be, gs), d->be->free(d->be, go), d->be->free(d->be, grows), CPU->free(CPU, cs), CPU->free(CPU, co);
}

/* rope_i32 must equal this table's rope bit for bit (and so the CPU within rope's tolerance). */
static void test_rope_i32(const Dev *d, int n, int heads, int head_dim, float theta, int max_pos) {
    char name[160];
    size_t nx = (size_t)n * heads * head_dim;
    float *x = rand_floats(nx, 1.0f);
    int *pos = xmalloc((size_t)n * sizeof(int));
    for (int i = 0; i < n; i++) pos[i] = i == 0 ? max_pos : rand_int(0, max_pos);
    void *g_plain = op_upload(d->be, x, nx), *g_i32 = op_upload(d->be, x, nx), *cx = op_upload(CPU, x, nx);
    void *gpos = op_upload_i32(d->be, pos, (size_t)n);
    d->be->rope(d->be, g_plain, pos, n, heads, head_dim, rope_table(head_dim, theta));
    d->be->rope_i32(d->be, g_i32, gpos, n, heads, head_dim, rope_table(head_dim, theta));
    CPU->rope(CPU, cx, pos, n, heads, head_dim, rope_table(head_dim, theta));
    float *plain = op_fetch(d->be, g_plain, nx), *got = op_fetch(d->be, g_i32, nx), *ref = op_fetch(CPU, cx, nx);
    snprintf(name, sizeof name, "rope_i32 == rope [%d,%d,%d] theta %g pos<=%d (bit-identical)", n, heads, head_dim,
             theta, max_pos);
    check_identical(d, name, got, plain, nx);
    snprintf(name, sizeof name, "rope_i32 vs cpu rope [%d,%d,%d] theta %g", n, heads, head_dim, theta);
    check(d, name, got, ref, nx, (Tol){1e-5, 1e-4, 1.5});
    free(x), free(pos), free(plain), free(got), free(ref);
    d->be->free(d->be, g_plain), d->be->free(d->be, g_i32), d->be->free(d->be, gpos), CPU->free(CPU, cx);
}

static void test_paged_kv_store(const Dev *d, int pool_rows, int kv_dim, int n) {
    char name[160];
    size_t np = (size_t)pool_rows * kv_dim, nt = (size_t)n * kv_dim;
    int *rows = xmalloc((size_t)pool_rows * sizeof(int)), *slots = xmalloc((size_t)n * sizeof(int));
    for (int r = 0; r < pool_rows; r++) rows[r] = r;
    shuffle_ints(rows, pool_rows);
    for (int i = 0; i < n; i++) slots[i] = i % 5 == 3 ? -1 : rows[i]; /* distinct rows, some padding */
    float *kp = rand_floats(np, 1.0f), *vp = rand_floats(np, 1.0f), *k = rand_floats(nt, 1.0f), *v = rand_floats(nt, 1.0f);
    void *gkp = op_upload(d->be, kp, np), *gvp = op_upload(d->be, vp, np), *gk = op_upload(d->be, k, nt),
         *gv = op_upload(d->be, v, nt);
    void *ckp = op_upload(CPU, kp, np), *cvp = op_upload(CPU, vp, np), *ck = op_upload(CPU, k, nt),
         *cv = op_upload(CPU, v, nt);
    void *gslots = op_upload_i32(d->be, slots, (size_t)n), *cslots = op_upload_i32(CPU, slots, (size_t)n);
    d->be->paged_kv_store(d->be, gkp, gvp, gk, gv, gslots, n, kv_dim);
    CPU->paged_kv_store(CPU, ckp, cvp, ck, cv, cslots, n, kv_dim);
    for (int which = 0; which < 2; which++) {
        float *got = op_fetch(d->be, which ? gvp : gkp, np), *ref = op_fetch(CPU, which ? cvp : ckp, np);
        snprintf(name, sizeof name, "paged_kv_store %s pool [%d,%d] N=%d, 1 in 5 padding (exact)", which ? "v" : "k",
                 pool_rows, kv_dim, n);
        check(d, name, got, ref, np, (Tol){0, 0, 0});
        free(got), free(ref);
    }
    free(rows), free(slots), free(kp), free(vp), free(k), free(v);
    d->be->free(d->be, gkp), d->be->free(d->be, gvp), d->be->free(d->be, gk), d->be->free(d->be, gv), d->be->free(d->be, gslots);
    CPU->free(CPU, ckp), CPU->free(CPU, cvp), CPU->free(CPU, ck), CPU->free(CPU, cv), CPU->free(CPU, cslots);
}

/* ---------------------------------------------------------------- paged attention */

/* A batch over a paged pool: token i of sequence seq[i] (-1 padding) at pos[i];
 * len[s] positions of sequence s are in the pool, its blocks dealt from a
 * shuffled permutation. */
typedef struct TestBatch {
    int n, n_seqs, block_size, max_blocks, n_blocks;
    int *seq, *pos, *len, *tables; /* [n], [n], [n_seqs], [n_seqs, max_blocks] */
} TestBatch;

static void batch_deal_blocks(TestBatch *b) {
    int max_len = 1;
    b->n_blocks = 2; /* spare blocks nobody owns */
    for (int s = 0; s < b->n_seqs; s++) {
        if (b->len[s] > max_len) max_len = b->len[s];
        b->n_blocks += (b->len[s] + b->block_size - 1) / b->block_size;
    }
    b->max_blocks = (max_len + b->block_size - 1) / b->block_size;
    int *perm = xmalloc((size_t)b->n_blocks * sizeof(int)), next = 0;
    for (int k = 0; k < b->n_blocks; k++) perm[k] = k;
    shuffle_ints(perm, b->n_blocks);
    b->tables = xmalloc((size_t)b->n_seqs * b->max_blocks * sizeof(int));
    for (int s = 0; s < b->n_seqs; s++)
        for (int k = 0; k < b->max_blocks; k++)
            b->tables[s * b->max_blocks + k] = k * b->block_size < b->len[s] ? perm[next++] : -1;
    free(perm);
}

/* `batch` decode tokens, one per sequence, at the end of contexts of up to
 * `ctx` (exactly ctx when uniform, else random in [ctx/2, ctx] with the first
 * one at ctx); from 7 tokens up, token n/2 is padding (and its pos garbage). */
static TestBatch batch_decode(int batch, int ctx, int block_size, int uniform) {
    TestBatch b = {.n = batch, .n_seqs = batch, .block_size = block_size};
    b.seq = xmalloc((size_t)batch * sizeof(int)), b.pos = xmalloc((size_t)batch * sizeof(int));
    b.len = xmalloc((size_t)batch * sizeof(int));
    for (int s = 0; s < batch; s++) {
        b.len[s] = uniform || s == 0 ? ctx : rand_int(ctx / 2 > 1 ? ctx / 2 : 1, ctx);
        b.seq[s] = s, b.pos[s] = b.len[s] - 1;
    }
    if (batch >= 7) b.seq[batch / 2] = -1, b.pos[batch / 2] = 1 << 30;
    batch_deal_blocks(&b);
    return b;
}

/* The engine's mixed step: a whole prefill, a chunk of a longer prefill, decode
 * tokens at contexts 1, block_size + 1 and 600, and two padding tokens, shuffled. */
static TestBatch batch_mixed(int block_size) {
    const int len[5] = {45, 130, 1, block_size + 1, 600}, first[5] = {0, 100, 0, block_size, 599};
    TestBatch b = {.n = 2, .n_seqs = 5, .block_size = block_size};
    for (int s = 0; s < 5; s++) b.n += len[s] - first[s];
    b.seq = xmalloc((size_t)b.n * sizeof(int)), b.pos = xmalloc((size_t)b.n * sizeof(int));
    b.len = xmalloc(5 * sizeof(int));
    int *order = xmalloc((size_t)b.n * sizeof(int)), k = 0;
    for (int i = 0; i < b.n; i++) order[i] = i;
    shuffle_ints(order, b.n);
    for (int s = 0; s < 5; s++) {
        b.len[s] = len[s];
        for (int p = first[s]; p < len[s]; p++) b.seq[order[k]] = s, b.pos[order[k]] = p, k++;
    }
    b.seq[order[k]] = -1, b.pos[order[k]] = 0, k++;
    b.seq[order[k]] = -1, b.pos[order[k]] = -7;
    free(order);
    batch_deal_blocks(&b);
    return b;
}

/* The batch's tokens ordered by sequence then position, padding last: the engine's layout, where a
 * prefill chunk's tokens sit together (what the tensor-core path groups). */
static void batch_sort(TestBatch *b) {
    for (int i = 1; i < b->n; i++) /* insertion sort: a few hundred tokens */
        for (int j = i; j > 0; j--) {
            unsigned sa = (unsigned)b->seq[j - 1], sb = (unsigned)b->seq[j]; /* -1 sorts last */
            if (sa < sb || (sa == sb && b->pos[j - 1] <= b->pos[j])) break;
            int t = b->seq[j]; b->seq[j] = b->seq[j - 1], b->seq[j - 1] = t;
            t = b->pos[j]; b->pos[j] = b->pos[j - 1], b->pos[j - 1] = t;
        }
}

static void batch_free(TestBatch *b) { free(b->seq), free(b->pos), free(b->len), free(b->tables); }

/* Rows of x [n, row] whose token is not padding, packed. */
static float *real_rows(const float *x, const int *seq, int n, size_t row, size_t *count) {
    float *out = xmalloc(((size_t)n * row + 1) * sizeof(float));
    size_t k = 0;
    for (int i = 0; i < n; i++)
        if (seq[i] >= 0) memcpy(out + k * row, x + (size_t)i * row, row * sizeof(float)), k++;
    *count = k * row;
    return out;
}

/* Device and CPU copies of one attention problem (inputs rounded for bf16). */
typedef struct PagedProblem {
    int n_heads, n_kv_heads, head_dim;
    const TestBatch *b;
    void *g_q, *g_k, *g_v, *g_out, *g_tables, *g_seq, *g_pos;
    void *c_q, *c_k, *c_v, *c_out, *c_tables, *c_seq, *c_pos;
} PagedProblem;

static void problem_init(PagedProblem *pr, const Dev *d, const TestBatch *b, int heads, int kv_heads, int head_dim,
                         float q_scale) {
    pr->b = b, pr->n_heads = heads, pr->n_kv_heads = kv_heads, pr->head_dim = head_dim;
    size_t nq = (size_t)b->n * heads * head_dim, np = (size_t)b->n_blocks * b->block_size * kv_heads * head_dim;
    size_t nt = (size_t)b->n_seqs * b->max_blocks;
    float *q = rand_floats(nq, q_scale), *k = rand_floats(np, 1.0f), *v = rand_floats(np, 1.0f);
    pr->g_q = op_upload(d->be, q, nq), pr->g_k = op_upload(d->be, k, np), pr->g_v = op_upload(d->be, v, np);
    pr->c_q = op_upload(CPU, q, nq), pr->c_k = op_upload(CPU, k, np), pr->c_v = op_upload(CPU, v, np);
    pr->g_out = d->be->alloc(d->be, nq), pr->c_out = CPU->alloc(CPU, nq);
    pr->g_tables = op_upload_i32(d->be, b->tables, nt), pr->c_tables = op_upload_i32(CPU, b->tables, nt);
    pr->g_seq = op_upload_i32(d->be, b->seq, (size_t)b->n), pr->c_seq = op_upload_i32(CPU, b->seq, (size_t)b->n);
    pr->g_pos = op_upload_i32(d->be, b->pos, (size_t)b->n), pr->c_pos = op_upload_i32(CPU, b->pos, (size_t)b->n);
    free(q), free(k), free(v);
}

static void problem_free(PagedProblem *pr, const Dev *d) {
    void *g[7] = {pr->g_q, pr->g_k, pr->g_v, pr->g_out, pr->g_tables, pr->g_seq, pr->g_pos};
    void *c[7] = {pr->c_q, pr->c_k, pr->c_v, pr->c_out, pr->c_tables, pr->c_seq, pr->c_pos};
    for (int i = 0; i < 7; i++) d->be->free(d->be, g[i]), CPU->free(CPU, c[i]);
}

static void problem_run(const Backend *be, void *out, void *q, void *k, void *v, void *tables, void *seq, void *pos,
                        const PagedProblem *pr) {
    be->paged_attention(be, out, q, k, v, tables, seq, pos, pr->b->n, pr->n_heads, pr->n_kv_heads, pr->head_dim,
                        pr->b->block_size, pr->b->max_blocks);
}

/* The CPU reference for the problem's current pos, real rows only. */
static float *problem_reference(const PagedProblem *pr, size_t *count) {
    size_t row = (size_t)pr->n_heads * pr->head_dim, nq = (size_t)pr->b->n * row;
    problem_run(CPU, pr->c_out, pr->c_q, pr->c_k, pr->c_v, pr->c_tables, pr->c_seq, pr->c_pos, pr);
    float *all = op_fetch(CPU, pr->c_out, nq), *ref = real_rows(all, pr->b->seq, pr->b->n, row, count);
    free(all);
    return ref;
}

static float *problem_device_result(const PagedProblem *pr, const Dev *d, size_t *count) {
    size_t row = (size_t)pr->n_heads * pr->head_dim, nq = (size_t)pr->b->n * row;
    float *all = op_fetch(d->be, pr->g_out, nq), *got = real_rows(all, pr->b->seq, pr->b->n, row, count);
    free(all);
    return got;
}

static const Tol ATTENTION_TOL = {1e-5, 2e-3, 2.0};

/* paged_attention with splits automatic, forced off and forced on, vs the CPU. */
static void test_paged_attention(const Dev *d, const TestBatch *b, int heads, int kv_heads, int head_dim,
                                 const char *label) {
    static const char *const modes[3] = {NULL, "1", "5"};
    char name[200];
    PagedProblem pr;
    problem_init(&pr, d, b, heads, kv_heads, head_dim, 1.5f);
    size_t n_ref, n_got;
    float *ref = problem_reference(&pr, &n_ref);
    CudaOptions *opt = backend_cuda_options(d->be), opened = *opt; /* COLT_PAGED_SPLITS, COLT_PAGED_TC_TOKENS */
    for (int m = 0; m < 3; m++) {
        opt->paged_splits = modes[m] ? atoi(modes[m]) : 0;
        d->be->zero(d->be, pr.g_out, (size_t)b->n * heads * head_dim);
        problem_run(d->be, pr.g_out, pr.g_q, pr.g_k, pr.g_v, pr.g_tables, pr.g_seq, pr.g_pos, &pr);
        float *got = problem_device_result(&pr, d, &n_got);
        snprintf(name, sizeof name, "paged_attention %s H=%d KVH=%d Dh=%d bs=%d N=%d splits %s", label, heads,
                 kv_heads, head_dim, b->block_size, b->n, modes[m] ? modes[m] : "auto");
        check(d, name, got, ref, n_ref, ATTENTION_TOL);
        free(got);
    }
    *opt = opened;
    if (d->bf16) { /* the tensor-core path, a sequence's tokens one per CTA or up to 16 / G together: same bits */
        float *got[2];
        opt->paged_splits = 1; /* tokens are grouped only with one split */
        for (int k = 0; k < 2; k++) {
            opt->paged_tc_tokens = k ? 16 : 1;
            d->be->zero(d->be, pr.g_out, (size_t)b->n * heads * head_dim);
            problem_run(d->be, pr.g_out, pr.g_q, pr.g_k, pr.g_v, pr.g_tables, pr.g_seq, pr.g_pos, &pr);
            got[k] = problem_device_result(&pr, d, &n_got);
        }
        *opt = opened;
        int same = memcmp(got[0], got[1], n_got * sizeof(float)) == 0;
        count_check(same);
        printf("%s %-9s paged_attention %s H=%d KVH=%d Dh=%d bs=%d N=%d: tokens grouped per CTA == one per CTA: %s\n",
               same ? "ok  " : "FAIL", d->tag, label, heads, kv_heads, head_dim, b->block_size, b->n, same ? "yes" : "no");
        free(got[0]), free(got[1]);
    }
    free(ref);
    problem_free(&pr, d);
}

/* Captures paged_attention once (after a warm-up call, as the engine does),
 * then replays the graph with the positions moved on: each replay must match
 * the CPU at the new positions. */
static void test_paged_graph(const Dev *d, int batch, int heads, int kv_heads, int head_dim) {
    char name[200];
    TestBatch b = batch_decode(batch, 700, 16, 0); /* blocks for up to 700 positions */
    int *final_pos = xmalloc((size_t)b.n * sizeof(int));
    memcpy(final_pos, b.pos, (size_t)b.n * sizeof(int));
    for (int i = 0; i < b.n; i++)
        if (b.seq[i] >= 0) b.pos[i] = b.len[b.seq[i]] / 3; /* the capture sees short contexts */
    PagedProblem pr;
    problem_init(&pr, d, &b, heads, kv_heads, head_dim, 1.5f);
    problem_run(d->be, pr.g_out, pr.g_q, pr.g_k, pr.g_v, pr.g_tables, pr.g_seq, pr.g_pos, &pr); /* warm-up */
    d->be->capture_begin(d->be);
    problem_run(d->be, pr.g_out, pr.g_q, pr.g_k, pr.g_v, pr.g_tables, pr.g_seq, pr.g_pos, &pr);
    void *graph = d->be->capture_end(d->be);
    for (int round = 0; round < 2; round++) {
        for (int i = 0; i < b.n; i++)
            if (b.seq[i] >= 0) b.pos[i] = round == 0 ? b.len[b.seq[i]] * 2 / 3 : final_pos[i];
        d->be->upload_i32(d->be, pr.g_pos, b.pos, (size_t)b.n);
        CPU->upload_i32(CPU, pr.c_pos, b.pos, (size_t)b.n);
        d->be->zero(d->be, pr.g_out, (size_t)b.n * heads * head_dim);
        d->be->graph_launch(d->be, graph);
        size_t n_ref, n_got;
        float *ref = problem_reference(&pr, &n_ref), *got = problem_device_result(&pr, d, &n_got);
        snprintf(name, sizeof name, "paged_attention graph replay %d H=%d KVH=%d Dh=%d N=%d, contexts to <=700",
                 round + 1, heads, kv_heads, head_dim, b.n);
        check(d, name, got, ref, n_ref, ATTENTION_TOL);
        free(ref), free(got);
    }
    d->be->graph_free(d->be, graph);
    free(final_pos);
    problem_free(&pr, d);
    batch_free(&b);
}

typedef struct TimedCall {
    const Backend *be;
    const PagedProblem *pr;
} TimedCall;

static void timed_paged_attention(void *ctx) {
    const TimedCall *c = ctx;
    const PagedProblem *pr = c->pr;
    problem_run(c->be, pr->g_out, pr->g_q, pr->g_k, pr->g_v, pr->g_tables, pr->g_seq, pr->g_pos, pr);
}

/* Time per call and the K/V bytes it must read over that time (padding excluded). */
static void time_paged_attention(const Dev *d, int batch, int ctx, int heads, int kv_heads, int head_dim) {
    TestBatch b = batch_decode(batch, ctx, 16, 1);
    PagedProblem pr;
    problem_init(&pr, d, &b, heads, kv_heads, head_dim, 1.0f);
    double bytes = 0.0;
    for (int i = 0; i < b.n; i++)
        if (b.seq[i] >= 0) bytes += 2.0 * (b.pos[i] + 1) * kv_heads * head_dim * (d->bf16 ? 2 : 4);
    TimedCall call = {d->be, &pr};
    double ms = backend_cuda_time_ms(d->be, timed_paged_attention, &call, 50);
    printf("time %-9s paged_attention H=%d KVH=%d Dh=%d context %d batch %3d: %8.1f us  %7.0f GB/s (K+V %.1f MB)\n",
           d->tag, heads, kv_heads, head_dim, ctx, batch, ms * 1e3, bytes / (ms * 1e-3) / 1e9, bytes / 1e6);
    problem_free(&pr, d);
    batch_free(&b);
}

/* ---------------------------------------------------------------- driver */

typedef struct HeadShape {
    int heads, kv_heads, head_dim;
    const char *label;
} HeadShape;

static void run_ops(const Dev *d) {
    printf("---- %s (storage %s) ----\n", d->tag, d->bf16 ? "bf16" : "fp32");
    test_i32_buffers(d, 1000);
    test_embedding_i32(d, 1000, 896, 50); /* 16-byte chunks */
    test_embedding_i32(d, 1003, 75, 9);   /* element copies */
    test_gather_rows_i32(d, 300, 1536, 64);
    test_gather_rows_i32(d, 37, 75, 20);
    test_rope_i32(d, 50, 14, 64, 1000000.0f, 2000); /* the vectorised kernel */
    test_rope_i32(d, 20, 2, 128, 10000.0f, 300);
    test_rope_i32(d, 10, 3, 8, 10000.0f, 100);      /* the scalar kernel */
    test_rope_i32(d, 9, 4, 72, 10000.0f, 100);
    test_paged_kv_store(d, 300, 128, 100);
    test_paged_kv_store(d, 64, 512, 40);
    test_paged_kv_store(d, 50, 75, 30); /* element copies */

    const HeadShape qwen[3] = {{14, 2, 64, "0.5B"}, {12, 2, 128, "1.5B"}, {28, 4, 128, "7B"}};
    const int contexts[4] = {1, 17, 512, 2000}, batches[3] = {1, 7, 64};
    for (int s = 0; s < 3; s++) {
        for (int c = 0; c < 4; c++)
            for (int k = 0; k < 3; k++) {
                TestBatch b = batch_decode(batches[k], contexts[c], k == 1 ? 32 : 16, 0);
                test_paged_attention(d, &b, qwen[s].heads, qwen[s].kv_heads, qwen[s].head_dim, qwen[s].label);
                batch_free(&b);
            }
        TestBatch b = batch_decode(256, 512, 32, 0);
        test_paged_attention(d, &b, qwen[s].heads, qwen[s].kv_heads, qwen[s].head_dim, qwen[s].label);
        batch_free(&b);
    }
    /* Other shapes: head chunks (G > 8, G = 9), G = 5, no GQA, and the generic path (Dh 48, 8, 256, 96). */
    const HeadShape other[8] = {{16, 1, 64, "G=16"},       {9, 1, 128, "G=9"},        {10, 2, 64, "G=5"},
                                {8, 8, 128, "MHA"},        {8, 4, 48, "generic"},     {8, 4, 8, "generic"},
                                {4, 1, 256, "generic"},    {6, 2, 96, "generic"}};
    for (int s = 0; s < 8; s++)
        for (int bs = 16; bs <= 32; bs *= 2) {
            TestBatch mixed = batch_mixed(bs), decode = batch_decode(7, 300, bs, 0);
            test_paged_attention(d, &mixed, other[s].heads, other[s].kv_heads, other[s].head_dim, other[s].label);
            test_paged_attention(d, &decode, other[s].heads, other[s].kv_heads, other[s].head_dim, other[s].label);
            batch_free(&mixed), batch_free(&decode);
        }
    for (int s = 0; s < 3; s++) {
        TestBatch mixed = batch_mixed(s == 1 ? 32 : 16);
        test_paged_attention(d, &mixed, qwen[s].heads, qwen[s].kv_heads, qwen[s].head_dim, qwen[s].label);
        batch_sort(&mixed); /* prefill runs together: the tensor-core path groups them */
        test_paged_attention(d, &mixed, qwen[s].heads, qwen[s].kv_heads, qwen[s].head_dim, qwen[s].label);
        batch_free(&mixed);
    }
    for (int s = 2; s < 4; s++) { /* G = 5 and MHA (G = 1): 3 and 16 tokens per m16 tile */
        TestBatch mixed = batch_mixed(16);
        batch_sort(&mixed);
        test_paged_attention(d, &mixed, other[s].heads, other[s].kv_heads, other[s].head_dim, other[s].label);
        batch_free(&mixed);
    }

    test_paged_graph(d, 7, 12, 2, 128);   /* splits > 1: the scratch is used under capture */
    test_paged_graph(d, 256, 28, 4, 128); /* one split */
    test_paged_graph(d, 5, 8, 4, 48);     /* generic path */
}

int main(void) {
    CPU = backend_cpu();
    const Backend *f32 = backend_cuda_f32(), *bf16 = backend_cuda();
    if (!f32 || !bf16) {
        printf("no CUDA device (cudaGetDeviceCount failed or found none): skipping test_cuda_paged\n");
        return 77;
    }
    Dev devs[2] = {{f32, 0, "cuda_f32"}, {bf16, 1, "cuda_bf16"}};
    for (int k = 0; k < 2; k++) run_ops(&devs[k]);

    printf("---- speed (1.5B heads, context 512) ----\n");
    const int batches[3] = {1, 64, 256};
    for (int k = 1; k >= 0; k--)
        for (int i = 0; i < 3; i++) time_paged_attention(&devs[k], batches[i], 512, 12, 2, 128);

    printf("test_cuda_paged: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
