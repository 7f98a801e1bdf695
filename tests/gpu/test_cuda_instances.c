/* test_cuda_instances.c — two CUDA backend instances (backend_cuda_open, bf16
 * storage) on device 0 in one process, beside a CPU instance: their ops run
 * interleaved, one with the deterministic mode on (A) and one with it off (B),
 * and each must match the CPU within test_cuda_ops.c's tolerances; switching
 * the mode (or a test hook) on one must not change the other; closing both
 * must give their device memory back.
 *
 * Checked, per instance: linear (n = 37: cuBLASLt or the deterministic path;
 * n = 4: the skinny kernel or the deterministic path), rmsnorm, paged
 * attention (decode step, a padding row), greedy sampling, and one training
 * forward + backward of a small random model (log-probs and gradients).
 * The mode is observed where it decides something for certain: the skinny
 * kernel serves a decode-sized linear only with the mode off (its call count
 * moves), and with it on a row's bits do not depend on the batch.
 * Memory: the whole sequence (open, run, close) runs twice; the device's free
 * memory before and after the second must agree within MEMORY_SLACK (the
 * first loads the kernels' modules, which stay).
 * Where a second GPU is visible, the checks run once more with B on device 1:
 * every op of one thread then alternates between the two devices. Exits 77
 * without a GPU.
 *
 * Dimension legend: N tokens, D width, H query heads, KVH key/value heads, Dh
 * head dim, V vocab. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_instance.h"
#include "backend/sampling.h"
#include "backend_op_cases.h"
#include "core/error.h"
#include "core/rng.h"
#include "model/model.h"
#include "model/model_train.h"

/* cuda_skinny.cu (C linkage): the decode-sized linear's switch and its call count, per instance. */
void cuda_skinny_set_enabled(const Backend *be, int enabled);
long cuda_skinny_call_count(const Backend *be);

#define MEMORY_SLACK ((size_t)8 << 20)

static int g_failures = 0, g_checks = 0;
static uint64_t g_stream = 0;
static const Backend *CPU;

typedef struct Dev {
    const Backend *be;
    const char *tag;
} Dev;

/* bf16 storage: |err| <= bf16_abs * max|ref| + |ref| * bf16_k * 2^-8 (test_cuda_ops.c's Tol, bf16 half). */
typedef struct Tol {
    double bf16_abs, bf16_k;
} Tol;

/* ---------------------------------------------------------------- helpers (test_cuda_ops.c's) */

static float *rand_floats(size_t n, float scale) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    uint64_t s = g_stream++;
    for (size_t i = 0; i < n; i++) x[i] = scale * rng_normal(19, s, i);
    return x;
}

static void record(int ok) {
    g_checks++;
    if (!ok) g_failures++;
}

/* Compares got (an instance) with ref (CPU) under t, prints one line, counts failures. */
static void check(const Dev *d, const char *what, const float *got, const float *ref, size_t n, Tol t) {
    record(op_check_against(d->tag, true, what, got, ref, n, (OpTol){0, 0, t.bf16_abs, t.bf16_k}));
}

/* A yes/no check with its line. */
static void expect(int ok, const char *tag, const char *what) {
    record(ok);
    printf("%s %-2s %s\n", ok ? "ok  " : "FAIL", tag, what);
}

static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

/* ---------------------------------------------------------------- linear and the mode */

/* out[n, O] = x[n, I] @ w^T + b on both instances and the CPU, interleaved; returns each instance's output
 * in got[2] (caller frees) and the skinny kernel's calls it took. */
static void linear_both(const Dev dev[2], void *const gx[2], void *const gw[2], void *const gb[2], void *const go[2],
                        int n, int in_dim, int out_dim, float *got[2], long skinny[2]) {
    long before[2];
    for (int k = 0; k < 2; k++) before[k] = cuda_skinny_call_count(dev[k].be);
    for (int k = 0; k < 2; k++) dev[k].be->linear(dev[k].be, go[k], gx[k], gw[k], gb[k], n, in_dim, out_dim);
    for (int k = 0; k < 2; k++) {
        got[k] = op_fetch(dev[k].be, go[k], (size_t)n * out_dim);
        skinny[k] = cuda_skinny_call_count(dev[k].be) - before[k];
    }
}

static void test_linear_and_modes(const Dev dev[2], int in_dim, int out_dim) {
    const int n_big = 37, n_small = 4;
    char name[160];
    size_t nx = (size_t)n_big * in_dim, nw = (size_t)out_dim * in_dim, ny = (size_t)n_big * out_dim;
    float *x = rand_floats(nx, 1.0f), *w = rand_floats(nw, 1.0f / sqrtf((float)in_dim)), *b = rand_floats(out_dim, 0.5f);
    void *gx[2], *gw[2], *gb[2], *go[2];
    for (int k = 0; k < 2; k++) { /* both bf16: the second upload rounds nothing further */
        gx[k] = op_upload(dev[k].be, x, nx), gw[k] = op_upload(dev[k].be, w, nw),
        gb[k] = op_upload(dev[k].be, b, out_dim);
        go[k] = dev[k].be->alloc(dev[k].be, ny);
        cuda_skinny_set_enabled(dev[k].be, 2); /* every shape it takes, whatever COLT_NO_SKINNY says */
    }
    void *cx = op_upload(CPU, x, nx), *cw = op_upload(CPU, w, nw), *cb = op_upload(CPU, b, out_dim),
         *co = CPU->alloc(CPU, ny);
    CPU->linear(CPU, co, cx, cw, cb, n_big, in_dim, out_dim);
    float *ref = op_fetch(CPU, co, ny);

    /* A deterministic, B not. */
    float *big[2], *small[2], *small_again[2], *small_swapped[2];
    long sk_big[2], sk_small[2], sk_again[2], sk_swapped[2];
    linear_both(dev, gx, gw, gb, go, n_big, in_dim, out_dim, big, sk_big);
    linear_both(dev, gx, gw, gb, go, n_small, in_dim, out_dim, small, sk_small);
    for (int k = 0; k < 2; k++) {
        snprintf(name, sizeof name, "linear [%d,%d]x[%d,%d]^T +b (%s)", n_big, in_dim, out_dim, in_dim,
                 k == 0 ? "deterministic" : "default");
        check(&dev[k], name, big[k], ref, ny, (Tol){2e-3, 1.5});
        snprintf(name, sizeof name, "linear [%d,%d]x[%d,%d]^T +b (%s)", n_small, in_dim, out_dim, in_dim,
                 k == 0 ? "deterministic" : "default");
        check(&dev[k], name, small[k], ref, (size_t)n_small * out_dim, (Tol){2e-3, 1.5});
    }
    expect(sk_big[0] == 0 && sk_small[0] == 0, "A", "deterministic: the skinny kernel served no call");
    expect(sk_small[1] == 1, "B", "default: the skinny kernel served the 4-row call");
    expect(same_bits(big[0], small[0], (size_t)n_small * out_dim), "A",
           "deterministic: rows 0..3 of the 37-row call bit-identical to the 4-row call");

    /* Swap the modes: A off, B on. Each instance's path follows its own switch. */
    dev[0].be->set_batch_invariant(dev[0].be, 0);
    dev[1].be->set_batch_invariant(dev[1].be, 1);
    linear_both(dev, gx, gw, gb, go, n_small, in_dim, out_dim, small_swapped, sk_swapped);
    expect(sk_swapped[0] == 1 && sk_swapped[1] == 0, "AB",
           "modes swapped: A's 4-row call takes the skinny kernel, B's does not");
    snprintf(name, sizeof name, "linear [%d,%d] with the modes swapped", n_small, in_dim);
    for (int k = 0; k < 2; k++) check(&dev[k], name, small_swapped[k], ref, (size_t)n_small * out_dim, (Tol){2e-3, 1.5});
    expect(same_bits(small_swapped[0], small[1], (size_t)n_small * out_dim) &&
               same_bits(small_swapped[1], small[0], (size_t)n_small * out_dim),
           "AB", "modes swapped: each instance gives the other's bits (same mode, same kernels)");

    /* Back: A on, B off; a hook on one instance (B's skinny switch off and back) leaves A alone. */
    dev[0].be->set_batch_invariant(dev[0].be, 1);
    dev[1].be->set_batch_invariant(dev[1].be, 0);
    cuda_skinny_set_enabled(dev[1].be, 0);
    long a_before = cuda_skinny_call_count(dev[0].be);
    dev[0].be->set_batch_invariant(dev[0].be, 0);
    dev[0].be->linear(dev[0].be, go[0], gx[0], gw[0], gb[0], n_small, in_dim, out_dim);
    dev[0].be->synchronize(dev[0].be);
    expect(cuda_skinny_call_count(dev[0].be) == a_before + 1, "A",
           "B's skinny switch off: A's (default mode) still takes the skinny kernel");
    dev[0].be->set_batch_invariant(dev[0].be, 1);
    cuda_skinny_set_enabled(dev[1].be, 2);
    linear_both(dev, gx, gw, gb, go, n_small, in_dim, out_dim, small_again, sk_again);
    expect(sk_again[0] == 0 && sk_again[1] == 1, "AB", "modes restored: the paths are as at first");
    for (int k = 0; k < 2; k++)
        expect(same_bits(small_again[k], small[k], (size_t)n_small * out_dim), dev[k].tag,
               "after the other instance's switches: bit-identical to the first run");

    for (int k = 0; k < 2; k++) {
        free(big[k]), free(small[k]), free(small_again[k]), free(small_swapped[k]);
        dev[k].be->free(dev[k].be, gx[k]), dev[k].be->free(dev[k].be, gw[k]), dev[k].be->free(dev[k].be, gb[k]);
        dev[k].be->free(dev[k].be, go[k]);
        cuda_skinny_set_enabled(dev[k].be, -1);
    }
    free(x), free(w), free(b), free(ref);
    CPU->free(CPU, cx), CPU->free(CPU, cw), CPU->free(CPU, cb), CPU->free(CPU, co);
}

/* ---------------------------------------------------------------- rmsnorm */

static void test_rmsnorm(const Dev dev[2], int n, int dim) {
    char name[128];
    const float eps = 1e-6f;
    size_t nx = (size_t)n * dim;
    float *x = rand_floats(nx, 3.0f), *w = rand_floats(dim, 1.0f);
    void *gx[2], *gw[2], *go[2];
    for (int k = 0; k < 2; k++)
        gx[k] = op_upload(dev[k].be, x, nx), gw[k] = op_upload(dev[k].be, w, dim),
        go[k] = dev[k].be->alloc(dev[k].be, nx);
    for (int k = 0; k < 2; k++) dev[k].be->rmsnorm(dev[k].be, go[k], gx[k], gw[k], n, dim, eps);
    void *cx = op_upload(CPU, x, nx), *cw = op_upload(CPU, w, dim), *co = CPU->alloc(CPU, nx);
    CPU->rmsnorm(CPU, co, cx, cw, n, dim, eps);
    float *ref = op_fetch(CPU, co, nx);
    for (int k = 0; k < 2; k++) {
        float *got = op_fetch(dev[k].be, go[k], nx);
        snprintf(name, sizeof name, "rmsnorm [%d,%d]", n, dim);
        check(&dev[k], name, got, ref, nx, (Tol){1e-4, 1.5});
        free(got);
        dev[k].be->free(dev[k].be, gx[k]), dev[k].be->free(dev[k].be, gw[k]), dev[k].be->free(dev[k].be, go[k]);
    }
    free(x), free(w), free(ref);
    CPU->free(CPU, cx), CPU->free(CPU, cw), CPU->free(CPU, co);
}

/* ---------------------------------------------------------------- paged attention */

/* A decode step over a paged cache: three sequences of lens[] tokens (blocks of BLOCK rows, the block
 * table a permutation), one query each at its last position, and a padding row (seq -1) last. */
#define BLOCK 16
static void test_paged_attention(const Dev dev[2], int heads, int kv_heads, int head_dim) {
    enum { SEQS = 3, N = SEQS + 1, MAX_BLOCKS = 8 };
    static const int lens[SEQS] = {100, 37, 5};
    char name[160];
    const int n_blocks = SEQS * MAX_BLOCKS, kvd = kv_heads * head_dim, qd = heads * head_dim;
    size_t pool = (size_t)n_blocks * BLOCK * kvd, nq = (size_t)N * qd, n_real = (size_t)SEQS * qd;
    int tables[SEQS * MAX_BLOCKS], seq[N], pos[N];
    for (int b = 0; b < n_blocks; b++) tables[b] = (b * 7 + 3) % n_blocks; /* 7 is coprime to 24 */
    for (int s = 0; s < SEQS; s++) seq[s] = s, pos[s] = lens[s] - 1;
    seq[SEQS] = -1, pos[SEQS] = 0;
    float *q = rand_floats(nq, 1.0f), *kp = rand_floats(pool, 1.0f), *vp = rand_floats(pool, 1.0f);
    void *gq[2], *gk[2], *gv[2], *go[2], *gt[2], *gs[2], *gp[2];
    for (int k = 0; k < 2; k++) {
        gq[k] = op_upload(dev[k].be, q, nq), gk[k] = op_upload(dev[k].be, kp, pool),
        gv[k] = op_upload(dev[k].be, vp, pool);
        go[k] = dev[k].be->alloc(dev[k].be, nq);
        gt[k] = op_upload_i32(dev[k].be, tables, SEQS * MAX_BLOCKS), gs[k] = op_upload_i32(dev[k].be, seq, N);
        gp[k] = op_upload_i32(dev[k].be, pos, N);
    }
    for (int k = 0; k < 2; k++)
        dev[k].be->paged_attention(dev[k].be, go[k], gq[k], gk[k], gv[k], gt[k], gs[k], gp[k], N, heads, kv_heads,
                                   head_dim, BLOCK, MAX_BLOCKS);
    void *cq = op_upload(CPU, q, nq), *ck = op_upload(CPU, kp, pool), *cv = op_upload(CPU, vp, pool),
         *co = CPU->alloc(CPU, nq);
    void *ct = op_upload_i32(CPU, tables, SEQS * MAX_BLOCKS), *cs = op_upload_i32(CPU, seq, N),
         *cp = op_upload_i32(CPU, pos, N);
    CPU->paged_attention(CPU, co, cq, ck, cv, ct, cs, cp, N, heads, kv_heads, head_dim, BLOCK, MAX_BLOCKS);
    float *ref = op_fetch(CPU, co, nq);
    for (int k = 0; k < 2; k++) {
        float *got = op_fetch(dev[k].be, go[k], nq);
        snprintf(name, sizeof name, "paged_attention H=%d KVH=%d Dh=%d, lens 100/37/5 + padding", heads, kv_heads,
                 head_dim);
        check(&dev[k], name, got, ref, n_real, (Tol){2e-3, 2.0}); /* the padding row is unspecified */
        free(got);
        void *bufs[] = {gq[k], gk[k], gv[k], go[k], gt[k], gs[k], gp[k]};
        for (size_t j = 0; j < sizeof bufs / sizeof bufs[0]; j++) dev[k].be->free(dev[k].be, bufs[j]);
    }
    void *cbufs[] = {cq, ck, cv, co, ct, cs, cp};
    for (size_t j = 0; j < sizeof cbufs / sizeof cbufs[0]; j++) CPU->free(CPU, cbufs[j]);
    free(q), free(kp), free(vp), free(ref);
}

/* ---------------------------------------------------------------- sample */

/* Greedy: the token is the CPU's (the argmax of the same bf16 logits) and its log-prob within
 * test_cuda_sample.c's 1e-4. Sampled (temperature 1, unfiltered): the two instances draw the same. */
static void test_sample(const Dev dev[2], int n, int vocab) {
    char name[160];
    size_t nl = (size_t)n * vocab;
    float *x = rand_floats(nl, 3.0f);
    int seq[8], streams[8], counters[8];
    for (int i = 0; i < n; i++) seq[i] = i, streams[i] = 100 + i, counters[i] = 3 * i;
    void *gl[2], *gtok[2], *glp[2], *gseq[2], *gstr[2], *gcnt[2];
    for (int k = 0; k < 2; k++) {
        gl[k] = op_upload(dev[k].be, x, nl); /* x now holds the bf16 values */
        gtok[k] = dev[k].be->alloc_i32(dev[k].be, n), glp[k] = dev[k].be->alloc_f32(dev[k].be, n);
        gseq[k] = op_upload_i32(dev[k].be, seq, n), gstr[k] = op_upload_i32(dev[k].be, streams, n);
        gcnt[k] = op_upload_i32(dev[k].be, counters, n);
    }
    SamplingParams greedy = sampling_params_greedy();
    SamplingParams drawn = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f,
                            .repetition_penalty = 1.0f, .seed = 7};
    int cpu_tok[8], got_tok[2][8], drawn_tok[2][8];
    float cpu_lp[8], got_lp[2][8], drawn_lp[2][8];
    void *cl = op_upload(CPU, x, nl), *ctok = CPU->alloc_i32(CPU, n), *clp = CPU->alloc_f32(CPU, n);
    void *cseq = op_upload_i32(CPU, seq, n), *cstr = op_upload_i32(CPU, streams, n),
         *ccnt = op_upload_i32(CPU, counters, n);
    CPU->sample(CPU, ctok, clp, cl, n, vocab, &greedy, cseq, cstr, ccnt, NULL, NULL, 0);
    CPU->download_i32(CPU, cpu_tok, ctok, n);
    CPU->download_f32(CPU, cpu_lp, clp, n);
    for (int k = 0; k < 2; k++)
        dev[k].be->sample(dev[k].be, gtok[k], glp[k], gl[k], n, vocab, &greedy, gseq[k], gstr[k], gcnt[k], NULL,
                          NULL, 0);
    for (int k = 0; k < 2; k++) {
        dev[k].be->download_i32(dev[k].be, got_tok[k], gtok[k], n);
        dev[k].be->download_f32(dev[k].be, got_lp[k], glp[k], n);
        int tokens_ok = 1;
        double worst = 0.0;
        for (int i = 0; i < n; i++) {
            tokens_ok &= got_tok[k][i] == cpu_tok[i];
            worst = fmax(worst, fabs((double)got_lp[k][i] - cpu_lp[i]));
        }
        int ok = tokens_ok && worst <= 1e-4;
        record(ok);
        snprintf(name, sizeof name, "sample greedy [%d,%d]", n, vocab);
        printf("%s %-2s %-58s tokens %s the CPU's, max |dlogprob| %.2e (tol 1e-4)\n", ok ? "ok  " : "FAIL",
               dev[k].tag, name, tokens_ok ? "==" : "!=", worst);
    }
    /* sample clobbers the logits: upload them again, then draw on both */
    for (int k = 0; k < 2; k++) dev[k].be->upload(dev[k].be, gl[k], x, nl);
    for (int k = 0; k < 2; k++)
        dev[k].be->sample(dev[k].be, gtok[k], glp[k], gl[k], n, vocab, &drawn, gseq[k], gstr[k], gcnt[k], NULL, NULL,
                          0);
    for (int k = 0; k < 2; k++) {
        dev[k].be->download_i32(dev[k].be, drawn_tok[k], gtok[k], n);
        dev[k].be->download_f32(dev[k].be, drawn_lp[k], glp[k], n);
    }
    int same = memcmp(drawn_tok[0], drawn_tok[1], sizeof(int) * n) == 0 &&
               memcmp(drawn_lp[0], drawn_lp[1], sizeof(float) * n) == 0;
    snprintf(name, sizeof name, "sample temperature 1 [%d,%d]: both instances draw the same tokens", n, vocab);
    expect(same, "AB", name);
    for (int k = 0; k < 2; k++) {
        void *bufs[] = {gl[k], gtok[k], glp[k], gseq[k], gstr[k], gcnt[k]};
        for (size_t j = 0; j < sizeof bufs / sizeof bufs[0]; j++) dev[k].be->free(dev[k].be, bufs[j]);
    }
    void *cbufs[] = {cl, ctok, clp, cseq, cstr, ccnt};
    for (size_t j = 0; j < sizeof cbufs / sizeof cbufs[0]; j++) CPU->free(CPU, cbufs[j]);
    free(x);
}

/* ---------------------------------------------------------------- a training step */

/* Forward + backward of the checkpoint in dir on both instances and the CPU. Log-probs: test_cuda_ops.c's
 * bf16 model tolerances (max 0.5, mean 0.06). Gradients, all parameters together: relative L2 error
 * within GRAD_REL_L2 (bf16 activations through two layers; test_cuda_ops.c checks the ops one by one).
 * A's forward (deterministic) is run again after B's step: bit-identical. */
#define GRAD_REL_L2 0.05
static void test_train_step(const Dev dev[2], const char *dir) {
    char err[ERR_LEN];
    Model *mc = NULL, *mg[2] = {NULL, NULL};
    TrainState *sc = NULL, *sg[2] = {NULL, NULL};
    ModelGrads *gc = NULL, *gg[2] = {NULL, NULL};
    int ok_setup = model_load(&mc, dir, CPU, err) == 0;
    for (int k = 0; k < 2 && ok_setup; k++) ok_setup = model_load(&mg[k], dir, dev[k].be, err) == 0;
    enum { LEN0 = 21, LEN1 = 14, N = LEN0 + LEN1 };
    ok_setup = ok_setup && train_state_create(&sc, mc, 2, 32, N, err) == 0 && model_grads_create(&gc, mc, err) == 0;
    for (int k = 0; k < 2 && ok_setup; k++)
        ok_setup = train_state_create(&sg[k], mg[k], 2, 32, N, err) == 0 && model_grads_create(&gg[k], mg[k], err) == 0;
    if (!ok_setup) {
        record(0);
        printf("FAIL    train step setup: %s\n", err);
        goto done;
    }
    int V = model_config(mc)->vocab_size, tok[N], slot[N], pos[N], tg[N];
    float w[N], lpc[N], lpg[2][N], lp_again[N];
    for (int i = 0; i < N; i++) {
        int s = i < LEN0 ? 0 : 1, p = s ? i - LEN0 : i, len = s ? LEN1 : LEN0;
        slot[i] = s, pos[i] = p;
        tok[i] = (int)(rng_uniform(23, 0, (uint64_t)i) * (float)V) % V;
        tg[i] = p < 4 || p == len - 1 ? -1 : (int)(rng_uniform(23, 1, (uint64_t)i) * (float)V) % V;
        w[i] = tg[i] < 0 ? 0.0f : rng_normal(23, 2, (uint64_t)i) / (float)N;
    }
    model_grads_zero(gc);
    for (int k = 0; k < 2; k++) model_grads_zero(gg[k]);
    int ok = model_train_forward(mc, sc, tok, slot, pos, tg, N, 1.0f, lpc, NULL, err) == 0 &&
             model_train_backward(mc, sc, w, gc, err) == 0;
    for (int k = 0; k < 2 && ok; k++) ok = model_train_forward(mg[k], sg[k], tok, slot, pos, tg, N, 1.0f, lpg[k], NULL, err) == 0;
    for (int k = 0; k < 2 && ok; k++) ok = model_train_backward(mg[k], sg[k], w, gg[k], err) == 0;
    if (!ok) {
        record(0);
        printf("FAIL    train step: %s\n", err);
        goto done;
    }
    for (int k = 0; k < 2; k++) {
        double worst = 0.0, sum = 0.0;
        for (int i = 0; i < N; i++) {
            double e = fabs((double)lpg[k][i] - lpc[i]);
            if (isnan(lpg[k][i])) e = INFINITY;
            worst = fmax(worst, e), sum += e;
        }
        int lp_ok = worst <= 0.5 && sum / N <= 0.06;
        record(lp_ok);
        printf("%s %-2s %-58s max|err| %.3e mean %.3e  tol 0.5 / 0.06\n", lp_ok ? "ok  " : "FAIL", dev[k].tag,
               "train forward log-probs (random 2-layer model, N=35)", worst, sum / N);
        double diff2 = 0.0, ref2 = 0.0;
        for (int p = 0; p < model_param_count(mc); p++) {
            ModelParam pc = model_param(mc, p);
            float *ref = malloc(pc.numel * sizeof(float)), *got = malloc(pc.numel * sizeof(float));
            CPU->download_f32(CPU, ref, model_grad(gc, p), pc.numel);
            dev[k].be->download_f32(dev[k].be, got, model_grad(gg[k], p), pc.numel);
            for (size_t i = 0; i < pc.numel; i++) {
                double d = (double)got[i] - ref[i];
                diff2 += isnan(got[i]) ? INFINITY : d * d, ref2 += (double)ref[i] * ref[i];
            }
            free(ref), free(got);
        }
        double rel = ref2 > 0 ? sqrt(diff2 / ref2) : INFINITY;
        int g_ok = rel <= GRAD_REL_L2;
        record(g_ok);
        printf("%s %-2s %-58s relative L2 error %.3e  tol %.2g\n", g_ok ? "ok  " : "FAIL", dev[k].tag,
               "train backward, every parameter's gradient", rel, GRAD_REL_L2);
    }
    /* B switched its mode on and off meanwhile (and ran its step): A's deterministic forward is unchanged */
    dev[1].be->set_batch_invariant(dev[1].be, 1);
    dev[1].be->set_batch_invariant(dev[1].be, 0);
    ok = model_train_forward(mg[0], sg[0], tok, slot, pos, tg, N, 1.0f, lp_again, NULL, err) == 0;
    expect(ok && same_bits(lp_again, lpg[0], N), "A", "train forward again: bit-identical log-probs");
done:
    if (gc) model_grads_free(gc);
    if (sc) train_state_free(sc);
    if (mc) model_free(mc);
    for (int k = 0; k < 2; k++) {
        if (gg[k]) model_grads_free(gg[k]);
        if (sg[k]) train_state_free(sg[k]);
        if (mg[k]) model_free(mg[k]);
    }
}

/* ---------------------------------------------------------------- main */

/* Opens A on device 0 and B on device_b, runs every check interleaved, closes both. */
static int round_of_checks(const char *dir, int round, int device_b) {
    char err[ERR_LEN];
    Backend *a = backend_cuda_open(0, DTYPE_BF16, err), *b = a ? backend_cuda_open(device_b, DTYPE_BF16, err) : NULL;
    if (!a || !b) {
        record(0);
        printf("FAIL    backend_cuda_open(0 and %d, bf16): %s\n", device_b, err);
        if (a) backend_close(a);
        return -1;
    }
    printf("---- round %d: instances A (deterministic, device %d) and B (default, device %d), %zu + %zu bytes "
           "reserved ----\n",
           round, a->device, b->device, backend_cuda_reserved_bytes(a), backend_cuda_reserved_bytes(b));
    expect(a->ctx != b->ctx && backend_cuda_compute_stream(a) != backend_cuda_compute_stream(b) &&
               backend_cuda_comm_stream(a) != backend_cuda_compute_stream(a) && backend_cuda_reserved_bytes(a) > 0,
           "AB", "own state, own compute streams, a communication stream apart, scratch reserved");
    a->set_batch_invariant(a, 1);
    b->set_batch_invariant(b, 0);
    const Dev dev[2] = {{a, "A"}, {b, "B"}};
    test_linear_and_modes(dev, 320, 200);
    test_rmsnorm(dev, 19, 896);
    test_paged_attention(dev, 4, 2, 64);
    test_sample(dev, 3, 1000);
    test_train_step(dev, dir);
    backend_close(a);
    backend_close(b);
    return 0;
}

int main(void) {
    char err[ERR_LEN], dir[] = "/tmp/colt_test_cuda_instances_XXXXXX";
    const Backend *probe = backend_cuda(); /* device 0's shared instance: kept open, for memory_info */
    if (!probe) {
        printf("no CUDA device (cudaGetDeviceCount failed or found none): skipping test_cuda_instances\n");
        return 77;
    }
    Backend *cpu = backend_open("cpu", 0, err);
    CPU = cpu;

    /* Errors a user can act on. */
    Backend *none = backend_open("cuda", 4096, err);
    int ok = !none && strstr(err, "--device cuda: device 4096 does not exist (") && strstr(err, "visible");
    record(ok);
    printf("%s    backend_open(\"cuda\", 4096): %s\n", ok ? "ok  " : "FAIL", none ? "opened!" : err);
    if (none) backend_close(none);

    ModelConfig cfg = {.arch = ARCH_QWEN2, .hidden_size = 128, .intermediate_size = 256, .num_hidden_layers = 2,
                       .num_attention_heads = 4, .num_key_value_heads = 2, .head_dim = 32, .vocab_size = 500,
                       .max_position_embeddings = 1024, .rms_norm_eps = 1e-6f, .rope_theta = 1e6f,
                       .tie_word_embeddings = true, .attention_bias = true, .bos_token_id = -1,
                       .torch_dtype = DTYPE_BF16};
    if (!mkdtemp(dir) || model_save_random(&cfg, 5, dir, DTYPE_BF16, err) != 0) {
        printf("FAIL    writing a random checkpoint: %s\n", err);
        return 1;
    }

    size_t free_before = 0, free_after = 0, total = 0;
    round_of_checks(dir, 0, 0); /* loads every kernel's module: the memory that stays */
    probe->memory_info(probe, &free_before, &total);
    round_of_checks(dir, 1, 0);
    probe->memory_info(probe, &free_after, &total);
    size_t gap = free_before > free_after ? free_before - free_after : free_after - free_before;
    ok = gap <= MEMORY_SLACK;
    record(ok);
    printf("%s    device memory free before round 1 %.1f MiB, after closing its instances %.1f MiB: %s%.2f MiB "
           "apart (tol %.0f MiB)\n",
           ok ? "ok  " : "FAIL", free_before / 1048576.0, free_after / 1048576.0,
           free_after < free_before ? "-" : "+", gap / 1048576.0, MEMORY_SLACK / 1048576.0);

    /* A second GPU: B there, the ops of this one thread alternating between the devices. */
    Backend *second = backend_cuda_open(1, DTYPE_BF16, err);
    if (second) {
        backend_close(second);
        round_of_checks(dir, 2, 1);
    } else {
        printf("skip    a second GPU (%s)\n", err);
    }

    const char *files[] = {"config.json", "generation_config.json", "model.safetensors"};
    for (size_t k = 0; k < sizeof files / sizeof files[0]; k++) {
        char path[sizeof dir + 64];
        snprintf(path, sizeof path, "%s/%s", dir, files[k]);
        unlink(path);
    }
    rmdir(dir);
    backend_close(cpu);
    printf("test_cuda_instances: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
