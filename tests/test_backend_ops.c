/* test_backend_ops.c — every CPU op against a naive double-precision
 * reference on random inputs, with a stated tolerance per op; prints the max
 * abs error of each. The op-case table (backend_op_cases.c: the ops and shapes
 * every backend runs; tests/gpu/test_cuda_ops runs it on the GPU against the
 * CPU) first, then the ops not yet in the table. Training ops (backward,
 * optimizer) are checked against analytic or finite-difference double
 * references. Each set runs on the CPU backend, through the profiling wrapper,
 * and on two CPU instances side by side (one in batch-invariant mode), each
 * of which must give the same bits on one thread and on three (GEMMs split
 * over the team, attention rows shared out). Attention runs the CPU's fast
 * fp32 path outside deterministic mode and the double reference in it.
 *
 * Dimension legend: N tokens, D width, H query heads, KVH key/value heads,
 * Dh head dim, S cache slots, L max cache length, F MLP width, V vocab. */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/profile.h"
#include "backend_op_cases.h"
#include "core/cpu_threads.h"
#include "core/error.h"
#include "core/rng.h"
#include "harness.h"

static uint64_t g_stream = 0;

static float *rand_floats(size_t n, float scale) {
    float *x = malloc(n * sizeof(float));
    uint64_t s = g_stream++;
    for (size_t i = 0; i < n; i++) x[i] = scale * rng_normal(7, s, i);
    return x;
}

static void *to_device(const Backend *be, const float *x, size_t n) {
    void *d = be->alloc(be, n);
    be->upload(be, d, x, n);
    return d;
}

static float *from_device(const Backend *be, const void *d, size_t n) {
    float *x = malloc(n * sizeof(float));
    be->download(be, x, d, n);
    return x;
}

/* max |got - ref|, reported against tol */
static void report(const char *op, const float *got, const double *ref, size_t n, double tol) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)got[i] - ref[i]);
        if (!(d <= worst)) worst = d; /* NaN counts as worst */
    }
    int ok = worst <= tol;
    printf("%s %-40s max |err| = %.3g (tol %.0e)\n", ok ? "ok  " : "FAIL", op, worst, tol);
    g_checks++;
    if (!ok) g_failures++;
}

/* kv_store + attention with GQA, tokens of three slots at mixed positions. */
static void test_attention(const Backend *be) {
    int S = 3, L = 40, H = 6, KVH = 2, Dh = 16, kvd = KVH * Dh;
    int n = 5;
    int slot[5] = {2, 0, 1, 2, 0}, pos[5] = {9, 0, 39, 10, 31};
    size_t cache_n = (size_t)S * L * kvd;
    float *kc = rand_floats(cache_n, 1.0f), *vc = rand_floats(cache_n, 1.0f);
    float *q = rand_floats((size_t)n * H * Dh, 1.0f), *k = rand_floats((size_t)n * kvd, 1.0f),
          *v = rand_floats((size_t)n * kvd, 1.0f);
    void *dkc = to_device(be, kc, cache_n), *dvc = to_device(be, vc, cache_n), *dq = to_device(be, q, (size_t)n * H * Dh),
         *dk = to_device(be, k, (size_t)n * kvd), *dv = to_device(be, v, (size_t)n * kvd),
         *dout = be->alloc(be, (size_t)n * H * Dh);
    be->kv_store(be, dkc, dvc, dk, dv, slot, pos, n, kvd, L);
    for (int i = 0; i < n; i++) { /* the reference cache */
        memcpy(kc + ((size_t)slot[i] * L + pos[i]) * kvd, k + (size_t)i * kvd, (size_t)kvd * sizeof(float));
        memcpy(vc + ((size_t)slot[i] * L + pos[i]) * kvd, v + (size_t)i * kvd, (size_t)kvd * sizeof(float));
    }
    float *got_k = from_device(be, dkc, cache_n);
    double *ref_k = malloc(cache_n * sizeof(double));
    for (size_t i = 0; i < cache_n; i++) ref_k[i] = kc[i];
    report("kv_store [3,40,32] (5 tokens)", got_k, ref_k, cache_n, 0.0);
    void *dlse = be->alloc_f32(be, (size_t)n * H);
    be->attention(be, dout, dlse, dq, dkc, dvc, slot, pos, n, H, KVH, Dh, L);
    float *got = from_device(be, dout, (size_t)n * H * Dh), *got_lse = malloc((size_t)n * H * sizeof(float));
    be->download_f32(be, got_lse, dlse, (size_t)n * H);
    double *ref = calloc((size_t)n * H * Dh, sizeof(double)), *ref_lse = malloc((size_t)n * H * sizeof(double));
    double *p = malloc((size_t)L * sizeof(double));
    for (int i = 0; i < n; i++)
        for (int h = 0; h < H; h++) {
            int kh = h / (H / KVH);
            double mx = -INFINITY, sum = 0;
            for (int t = 0; t <= pos[i]; t++) {
                double s = 0;
                for (int d = 0; d < Dh; d++)
                    s += (double)q[((size_t)i * H + h) * Dh + d] * kc[((size_t)slot[i] * L + t) * kvd + kh * Dh + d];
                p[t] = s / sqrt((double)Dh);
                mx = fmax(mx, p[t]);
            }
            for (int t = 0; t <= pos[i]; t++) sum += (p[t] = exp(p[t] - mx));
            ref_lse[(size_t)i * H + h] = mx + log(sum);
            for (int t = 0; t <= pos[i]; t++)
                for (int d = 0; d < Dh; d++)
                    ref[((size_t)i * H + h) * Dh + d] +=
                        p[t] / sum * vc[((size_t)slot[i] * L + t) * kvd + kh * Dh + d];
        }
    report("attention GQA H=6 KVH=2 Dh=16, 3 slots", got, ref, (size_t)n * H * Dh, 1e-6);
    report("attention lse [f32] (log-sum-exp per row)", got_lse, ref_lse, (size_t)n * H, 1e-5);
    free(kc), free(vc), free(q), free(k), free(v), free(got), free(ref), free(p), free(got_k), free(ref_k);
    free(got_lse), free(ref_lse);
    be->free(be, dkc), be->free(be, dvc), be->free(be, dq), be->free(be, dk), be->free(be, dv), be->free(be, dout), be->free(be, dlse);
}

/* ================================================================ training ops
 * Backward ops against double references: analytic where the formula is
 * independent of the kernel's, central finite differences (h = 1e-5 on a
 * double forward, error ~1e-9) for rmsnorm, attention and log-softmax. The
 * "+=" outputs start from random values to check they accumulate. */

static double *to_double(const float *x, size_t n) {
    double *d = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) d[i] = x[i];
    return d;
}

/* Double attention over whole sequences: out[i,h] from q and the caches. */
static void attention_ref(double *out, const double *q, const double *kc, const double *vc, const int *slot,
                          const int *pos, int n, int H, int KVH, int Dh, int L) {
    int kvd = KVH * Dh;
    double p[64];
    for (int i = 0; i < n; i++)
        for (int h = 0; h < H; h++) {
            int kh = h / (H / KVH);
            double mx = -INFINITY, sum = 0;
            for (int t = 0; t <= pos[i]; t++) {
                double s = 0;
                for (int d = 0; d < Dh; d++)
                    s += q[((size_t)i * H + h) * Dh + d] * kc[((size_t)slot[i] * L + t) * kvd + kh * Dh + d];
                p[t] = s / sqrt((double)Dh);
                mx = fmax(mx, p[t]);
            }
            for (int t = 0; t <= pos[i]; t++) sum += (p[t] = exp(p[t] - mx));
            for (int d = 0; d < Dh; d++) {
                double acc = 0;
                for (int t = 0; t <= pos[i]; t++) acc += p[t] / sum * vc[((size_t)slot[i] * L + t) * kvd + kh * Dh + d];
                out[((size_t)i * H + h) * Dh + d] = acc;
            }
        }
}

static double attention_loss(const double *dout, double *q, double *kc, double *vc, const int *slot, const int *pos,
                             int n, int H, int KVH, int Dh, int L, double *scratch) {
    attention_ref(scratch, q, kc, vc, slot, pos, n, H, KVH, Dh, L);
    double s = 0;
    for (size_t i = 0; i < (size_t)n * H * Dh; i++) s += dout[i] * scratch[i];
    return s;
}

/* Two whole sequences (5 and 3 tokens) in slots 1 and 0, tokens interleaved. */
static void test_attention_backward(const Backend *be) {
    int S = 2, L = 6, H = 4, KVH = 2, Dh = 8, kvd = KVH * Dh, n = 8;
    int slot[8] = {1, 0, 1, 1, 0, 1, 0, 1}, pos[8] = {0, 0, 1, 2, 1, 3, 2, 4};
    size_t qn = (size_t)n * H * Dh, cn = (size_t)S * L * kvd;
    float *q = rand_floats(qn, 1.0f), *kc = rand_floats(cn, 1.0f), *vc = rand_floats(cn, 1.0f),
          *dout = rand_floats(qn, 1.0f), *dk0 = rand_floats(cn, 1.0f), *dv0 = rand_floats(cn, 1.0f);
    void *gq = to_device(be, q, qn), *gkc = to_device(be, kc, cn), *gvc = to_device(be, vc, cn),
         *gdo = to_device(be, dout, qn), *gdq = be->alloc(be, qn), *gdk = to_device(be, dk0, cn),
         *gdv = to_device(be, dv0, cn);
    be->attention_backward(be, gdq, gdk, gdv, gdo, gq, NULL, NULL, gkc, gvc, slot, pos, n, H, KVH, Dh, S, L);
    float *got_dq = from_device(be, gdq, qn), *got_dk = from_device(be, gdk, cn), *got_dv = from_device(be, gdv, cn);
    double *qd = to_double(q, qn), *kd = to_double(kc, cn), *vd = to_double(vc, cn), *dod = to_double(dout, qn);
    double *scratch = malloc(qn * sizeof(double)), h = 1e-5;
    double *ref_dq = malloc(qn * sizeof(double)), *ref_dk = malloc(cn * sizeof(double)),
           *ref_dv = malloc(cn * sizeof(double));
    struct {
        double *x, *ref;
        size_t n;
        const float *init;
    } parts[3] = {{qd, ref_dq, qn, NULL}, {kd, ref_dk, cn, dk0}, {vd, ref_dv, cn, dv0}};
    for (int p = 0; p < 3; p++)
        for (size_t j = 0; j < parts[p].n; j++) {
            double keep = parts[p].x[j];
            parts[p].x[j] = keep + h;
            double lp = attention_loss(dod, qd, kd, vd, slot, pos, n, H, KVH, Dh, L, scratch);
            parts[p].x[j] = keep - h;
            double lm = attention_loss(dod, qd, kd, vd, slot, pos, n, H, KVH, Dh, L, scratch);
            parts[p].x[j] = keep;
            parts[p].ref[j] = (parts[p].init ? parts[p].init[j] : 0.0) + (lp - lm) / (2 * h);
        }
    report("attention_backward dq GQA vs fd", got_dq, ref_dq, qn, 1e-5);
    report("attention_backward dk_cache (+=) vs fd", got_dk, ref_dk, cn, 1e-5);
    report("attention_backward dv_cache (+=) vs fd", got_dv, ref_dv, cn, 1e-5);
    /* Again from the forward's out and lse: the CPU's fast path (fp32) outside deterministic mode */
    void *gout = be->alloc(be, qn), *glse = be->alloc_f32(be, (size_t)n * H);
    be->attention(be, gout, glse, gq, gkc, gvc, slot, pos, n, H, KVH, Dh, L);
    be->upload(be, gdk, dk0, cn), be->upload(be, gdv, dv0, cn);
    be->attention_backward(be, gdq, gdk, gdv, gdo, gq, gout, glse, gkc, gvc, slot, pos, n, H, KVH, Dh, S, L);
    float *got2_dq = from_device(be, gdq, qn), *got2_dk = from_device(be, gdk, cn), *got2_dv = from_device(be, gdv, cn);
    report("attention_backward dq from out, lse vs fd", got2_dq, ref_dq, qn, 1e-5);
    report("attention_backward dk_cache from out, lse vs fd", got2_dk, ref_dk, cn, 1e-5);
    report("attention_backward dv_cache from out, lse vs fd", got2_dv, ref_dv, cn, 1e-5);
    free(got2_dq), free(got2_dk), free(got2_dv);
    be->free(be, gout), be->free(be, glse);
    /* kv_gather reads back what kv_store wrote */
    void *gk = be->alloc(be, (size_t)n * kvd), *gv = be->alloc(be, (size_t)n * kvd);
    be->kv_gather(be, gk, gv, gkc, gvc, slot, pos, n, kvd, L);
    float *got_k = from_device(be, gk, (size_t)n * kvd), *got_v = from_device(be, gv, (size_t)n * kvd);
    double *ref_kv = malloc((size_t)n * kvd * sizeof(double));
    for (int i = 0; i < n; i++)
        for (int j = 0; j < kvd; j++) ref_kv[i * kvd + j] = kc[((size_t)slot[i] * L + pos[i]) * kvd + j];
    report("kv_gather k [8 tokens of 2x6x16]", got_k, ref_kv, (size_t)n * kvd, 0.0);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < kvd; j++) ref_kv[i * kvd + j] = vc[((size_t)slot[i] * L + pos[i]) * kvd + j];
    report("kv_gather v [8 tokens of 2x6x16]", got_v, ref_kv, (size_t)n * kvd, 0.0);
    free(q), free(kc), free(vc), free(dout), free(dk0), free(dv0), free(got_dq), free(got_dk), free(got_dv);
    free(qd), free(kd), free(vd), free(dod), free(scratch), free(ref_dq), free(ref_dk), free(ref_dv);
    free(got_k), free(got_v), free(ref_kv);
    be->free(be, gq), be->free(be, gkc), be->free(be, gvc), be->free(be, gdo), be->free(be, gdq), be->free(be, gdk), be->free(be, gdv);
    be->free(be, gk), be->free(be, gv);
}

static double logprob_ref(const double *row, int V, int target, double temp, double *entropy) {
    double mx = -INFINITY, sum = 0, pz = 0;
    for (int v = 0; v < V; v++) mx = fmax(mx, row[v] / temp);
    for (int v = 0; v < V; v++) sum += exp(row[v] / temp - mx);
    double lse = mx + log(sum);
    for (int v = 0; v < V; v++) pz += exp(row[v] / temp - lse) * (row[v] / temp);
    if (entropy) *entropy = lse - pz;
    return row[target] / temp - lse;
}

/* log_softmax_entropy_backward against central differences of dlogprobs * logprob + dentropy * entropy,
 * out of place and in place; with dentropy = 0 it must equal log_softmax_target_backward. */
static void test_log_softmax_entropy_backward(const Backend *be) {
    int n = 5, V = 300;
    float temp = 0.7f;
    int targets[5] = {3, 299, -1, 17, 17};
    float *lg = rand_floats((size_t)n * V, 3.0f), *dlp = rand_floats(n, 1.0f), *dh = rand_floats(n, 1.0f);
    float zeros[5] = {0};
    void *glg = to_device(be, lg, (size_t)n * V), *gdlp = to_device(be, dlp, n), *gdh = to_device(be, dh, n),
         *gzero = to_device(be, zeros, n), *gdl = be->alloc(be, (size_t)n * V);
    double *ref_dl = calloc((size_t)n * V, sizeof(double)), *row = malloc(V * sizeof(double)), h = 1e-5;
    for (int i = 0; i < n; i++) {
        if (targets[i] < 0) continue;
        for (int v = 0; v < V; v++) row[v] = lg[i * V + v];
        for (int v = 0; v < V; v++) {
            double keep = row[v], ep, em;
            row[v] = keep + h;
            double lp = logprob_ref(row, V, targets[i], temp, &ep);
            row[v] = keep - h;
            double lm = logprob_ref(row, V, targets[i], temp, &em);
            row[v] = keep;
            ref_dl[i * V + v] = (dlp[i] * (lp - lm) + dh[i] * (ep - em)) / (2 * h);
        }
    }
    be->log_softmax_entropy_backward(be, gdl, glg, targets, gdlp, gdh, n, V, temp);
    float *got = from_device(be, gdl, (size_t)n * V);
    report("log_softmax_entropy_backward [5,300] T=0.7 vs fd", got, ref_dl, (size_t)n * V, 1e-6);
    /* dentropy = 0: the plain backward's values */
    be->log_softmax_target_backward(be, gdl, glg, targets, gdlp, n, V, temp);
    float *plain = from_device(be, gdl, (size_t)n * V);
    double *plain_ref = malloc((size_t)n * V * sizeof(double));
    for (size_t k = 0; k < (size_t)n * V; k++) plain_ref[k] = plain[k];
    be->log_softmax_entropy_backward(be, gdl, glg, targets, gdlp, gzero, n, V, temp);
    float *no_entropy = from_device(be, gdl, (size_t)n * V);
    report("log_softmax_entropy_backward dentropy=0 vs log_softmax_target_backward", no_entropy, plain_ref,
           (size_t)n * V, 1e-6);
    be->log_softmax_entropy_backward(be, glg, glg, targets, gdlp, gdh, n, V, temp); /* in place */
    float *in_place = from_device(be, glg, (size_t)n * V);
    report("log_softmax_entropy_backward in place", in_place, ref_dl, (size_t)n * V, 1e-6);
    free(lg), free(dlp), free(dh), free(ref_dl), free(row), free(got), free(plain), free(plain_ref), free(no_entropy),
        free(in_place);
    be->free(be, glg), be->free(be, gdlp), be->free(be, gdh), be->free(be, gzero), be->free(be, gdl);
}

/* ================================================================ vocabulary parallelism
 * A [N, V] matrix split into column parts, one per (pretend) rank: each part's
 * op output, combined on the host or reassembled with copy_2d, must equal the
 * whole-matrix op. */

#define SHARD_PARTS 3
static const int SHARD_LO[SHARD_PARTS + 1] = {0, 12, 24, 37}; /* parts of 12, 12 and 13 columns */

/* buffer + elems storage elements: a column offset into a backend buffer */
static void *at_elem(const Backend *be, void *buf, size_t elems) {
    return (char *)buf + elems * dtype_size(be->storage);
}

/* targets[i] into part [lo, hi): target - lo inside it, else -1 */
static void part_targets(int *out, const int *targets, int n, int lo, int hi) {
    for (int i = 0; i < n; i++) out[i] = targets[i] >= lo && targets[i] < hi ? targets[i] - lo : -1;
}

/* logits_shard_stats on each part, combined as the ranks do, against
 * log_softmax_target on the whole matrix; then log_softmax_shard_backward on
 * each part with the combined lse, reassembled, against
 * log_softmax_target_backward on the whole. */
static void test_logits_shard(const Backend *be) {
    enum { N = 5, V = 37 };
    float temp = 0.7f;
    int targets[N] = {0, 36, -1, 12, 23}; /* first and last column, no target, both sides of a part boundary */
    float *lg = rand_floats((size_t)N * V, 3.0f), *dlp = rand_floats(N, 1.0f);
    dlp[2] = 0.0f; /* the whole-matrix backward gives a row without target no gradient */
    void *glg = to_device(be, lg, (size_t)N * V), *glp = be->alloc_f32(be, N), *gent = be->alloc_f32(be, N);
    be->log_softmax_target(be, glp, gent, glg, targets, N, V, temp);
    float whole_lp[N], whole_ent[N];
    be->download_f32(be, whole_lp, glp, N);
    be->download_f32(be, whole_ent, gent, N);

    double M[N], S[N], Tz[N], zt[N];
    for (int i = 0; i < N; i++) M[i] = -INFINITY, S[i] = Tz[i] = zt[i] = 0.0;
    void *part_lg[SHARD_PARTS];
    int tq[SHARD_PARTS][N];
    bool other_target_zero = true;
    for (int p = 0; p < SHARD_PARTS; p++) {
        int lo = SHARD_LO[p], vp = SHARD_LO[p + 1] - lo;
        part_lg[p] = be->alloc(be, (size_t)N * vp);
        be->copy_2d(be, part_lg[p], vp, at_elem(be, glg, lo), V, N, vp);
        part_targets(tq[p], targets, N, lo, SHARD_LO[p + 1]);
        void *gstats = be->alloc_f32(be, (size_t)N * 4);
        be->logits_shard_stats(be, gstats, part_lg[p], tq[p], N, vp, temp);
        float st[N * 4];
        be->download_f32(be, st, gstats, (size_t)N * 4);
        for (int i = 0; i < N; i++) { /* from M = -inf, S = T = 0: the first part's exp(M - Mn) is 0 */
            double m = st[4 * i], Mn = fmax(M[i], m);
            S[i] = S[i] * exp(M[i] - Mn) + st[4 * i + 1] * exp(m - Mn);
            Tz[i] = Tz[i] * exp(M[i] - Mn) + st[4 * i + 2] * exp(m - Mn);
            M[i] = Mn;
            zt[i] += st[4 * i + 3];
            if (tq[p][i] < 0 && st[4 * i + 3] != 0.0f) other_target_zero = false;
        }
        be->free(be, gstats);
    }
    printf("%s logits_shard_stats z[target] of a part without the target is 0\n", other_target_zero ? "ok  " : "FAIL");
    g_checks++;
    if (!other_target_zero) g_failures++;

    /* rows with a target: log-prob and entropy from the parts vs the whole */
    float got_lp[N], got_ent[N], lse[N];
    double ref_lp[N], ref_ent[N];
    int m = 0;
    for (int i = 0; i < N; i++) {
        double l = M[i] + log(S[i]);
        lse[i] = (float)l;
        if (targets[i] < 0) continue;
        got_lp[m] = (float)(zt[i] - l), got_ent[m] = (float)(l - Tz[i] / S[i]);
        ref_lp[m] = whole_lp[i], ref_ent[m] = whole_ent[i];
        m++;
    }
    report("logits_shard_stats 3 parts -> logprobs [5,37] T=0.7", got_lp, ref_lp, m, 1e-5);
    report("logits_shard_stats 3 parts -> entropy [5,37]", got_ent, ref_ent, m, 1e-5);
    /* the row without a target (the whole op gives it 0): its entropy vs double */
    double row[V], ent2;
    for (int v = 0; v < V; v++) row[v] = lg[2 * V + v];
    logprob_ref(row, V, 0, temp, &ent2);
    float got_ent2 = (float)(M[2] + log(S[2]) - Tz[2] / S[2]);
    report("logits_shard_stats 3 parts -> entropy, row without target", &got_ent2, &ent2, 1, 1e-5);

    /* backward: parts 0 and 1 out of place, part 2 in place */
    void *gdlp = be->alloc_f32(be, N), *glse = be->alloc_f32(be, N), *gdl = be->alloc(be, (size_t)N * V),
         *gparts = be->alloc(be, (size_t)N * V);
    be->upload_f32(be, gdlp, dlp, N);
    be->upload_f32(be, glse, lse, N);
    be->log_softmax_target_backward(be, gdl, glg, targets, gdlp, N, V, temp);
    for (int p = 0; p < SHARD_PARTS; p++) {
        int lo = SHARD_LO[p], vp = SHARD_LO[p + 1] - lo;
        void *pdl = p == 2 ? part_lg[p] : be->alloc(be, (size_t)N * vp);
        be->log_softmax_shard_backward(be, pdl, part_lg[p], tq[p], gdlp, glse, N, vp, temp);
        be->copy_2d(be, at_elem(be, gparts, lo), V, pdl, vp, N, vp);
        if (pdl != part_lg[p]) be->free(be, pdl);
    }
    float *got_dl = from_device(be, gparts, (size_t)N * V), *whole_dl = from_device(be, gdl, (size_t)N * V);
    double *ref_dl = to_double(whole_dl, (size_t)N * V);
    report("log_softmax_shard_backward 3 parts (last in place) [5,37]", got_dl, ref_dl, (size_t)N * V, 1e-6);

    /* with the entropy's gradient: the parts (the whole row's lse and sum p z given) vs the whole op; the
     * row without a target gets no gradient from the whole op, so its dlogprob and dentropy are 0 here */
    float dh[N] = {0.7f, -1.1f, 0.0f, 0.4f, -0.3f}, pz[N]; /* fixed: the random stream of later tests stays */
    for (int i = 0; i < N; i++) pz[i] = (float)(Tz[i] / S[i]);
    void *gdh = be->alloc_f32(be, N), *gpz = be->alloc_f32(be, N);
    be->upload_f32(be, gdh, dh, N);
    be->upload_f32(be, gpz, pz, N);
    be->log_softmax_entropy_backward(be, gdl, glg, targets, gdlp, gdh, N, V, temp);
    for (int p = 0; p < SHARD_PARTS; p++) {
        int lo = SHARD_LO[p], vp = SHARD_LO[p + 1] - lo;
        void *plg = be->alloc(be, (size_t)N * vp);
        be->copy_2d(be, plg, vp, at_elem(be, glg, lo), V, N, vp);
        void *pdl = p == 1 ? plg : be->alloc(be, (size_t)N * vp); /* the middle part in place */
        be->log_softmax_shard_entropy_backward(be, pdl, plg, tq[p], gdlp, gdh, glse, gpz, N, vp, temp);
        be->copy_2d(be, at_elem(be, gparts, lo), V, pdl, vp, N, vp);
        if (pdl != plg) be->free(be, pdl);
        be->free(be, plg);
    }
    float *got_edl = from_device(be, gparts, (size_t)N * V), *whole_edl = from_device(be, gdl, (size_t)N * V);
    double *ref_edl = to_double(whole_edl, (size_t)N * V);
    report("log_softmax_shard_entropy_backward 3 parts [5,37]", got_edl, ref_edl, (size_t)N * V, 1e-6);
    free(got_edl), free(whole_edl), free(ref_edl);
    be->free(be, gdh), be->free(be, gpz);

    free(lg), free(dlp), free(got_dl), free(whole_dl), free(ref_dl);
    for (int p = 0; p < SHARD_PARTS; p++) be->free(be, part_lg[p]);
    be->free(be, glg), be->free(be, glp), be->free(be, gent), be->free(be, gdlp), be->free(be, glse), be->free(be, gdl),
        be->free(be, gparts);
}

/* vocab_shard_ids_i32, then embedding / embedding_i32 / embedding_backward of
 * each part of a vocabulary-parallel table: a token outside the part gives a
 * zero row (forward) and no gradient (backward), so the parts' rows sum to the
 * whole table's. */
static void test_vocab_shard_embedding(const Backend *be) {
    enum { N = 8, V = 37, D = 6 };
    int ids[N] = {0, 11, 12, 23, 24, 36, 12, 5}; /* both sides of each boundary, a repeat */
    float *table = rand_floats((size_t)V * D, 1.0f), *dout = rand_floats((size_t)N * D, 1.0f),
          *dt0 = rand_floats((size_t)V * D, 0.1f), *stale = rand_floats((size_t)N * D, 1.0f);
    void *gt = to_device(be, table, (size_t)V * D), *go = be->alloc(be, (size_t)N * D),
         *gdo = to_device(be, dout, (size_t)N * D);
    void *gids = be->alloc_i32(be, N), *gpids = be->alloc_i32(be, N);
    be->upload_i32(be, gids, ids, N);
    double *sum = calloc((size_t)N * D, sizeof(double)), *sum_i32 = calloc((size_t)N * D, sizeof(double));
    double *dt_parts = calloc((size_t)V * D, sizeof(double));
    int wrong_ids = 0;
    for (int p = 0; p < SHARD_PARTS; p++) {
        int lo = SHARD_LO[p], hi = SHARD_LO[p + 1], vp = hi - lo;
        int pids[N], want[N];
        be->vocab_shard_ids_i32(be, gpids, gids, N, lo, hi);
        be->download_i32(be, pids, gpids, N);
        part_targets(want, ids, N, lo, hi);
        for (int i = 0; i < N; i++) wrong_ids += pids[i] != want[i];
        void *gpt = be->alloc(be, (size_t)vp * D);
        be->copy(be, gpt, 0, gt, (size_t)lo * D, (size_t)vp * D);
        be->upload(be, go, stale, (size_t)N * D); /* a skipped row would keep these */
        be->embedding(be, go, gpt, pids, N, D);
        float *got = from_device(be, go, (size_t)N * D);
        double *ref = calloc((size_t)N * D, sizeof(double));
        for (int i = 0; i < N; i++) {
            if (want[i] < 0) continue;
            for (int j = 0; j < D; j++) ref[i * D + j] = table[(size_t)(lo + want[i]) * D + j];
        }
        char name[96];
        snprintf(name, sizeof name, "embedding part [%d,%d) (zero rows for ids < 0)", lo, hi);
        report(name, got, ref, (size_t)N * D, 0.0);
        for (size_t e = 0; e < (size_t)N * D; e++) sum[e] += got[e];
        free(got);
        be->upload(be, go, stale, (size_t)N * D);
        be->embedding_i32(be, go, gpt, gpids, N, D);
        got = from_device(be, go, (size_t)N * D);
        for (size_t e = 0; e < (size_t)N * D; e++) sum_i32[e] += got[e];
        free(got), free(ref);
        /* backward into the part's slice of a copy of dt0 */
        void *gpdt = be->alloc_f32(be, (size_t)vp * D);
        be->upload_f32(be, gpdt, dt0 + (size_t)lo * D, (size_t)vp * D);
        be->embedding_backward(be, gpdt, gdo, pids, N, D);
        float *part_dt = malloc((size_t)vp * D * sizeof(float));
        be->download_f32(be, part_dt, gpdt, (size_t)vp * D);
        for (size_t e = 0; e < (size_t)vp * D; e++) dt_parts[(size_t)lo * D + e] = part_dt[e];
        free(part_dt);
        be->free(be, gpt), be->free(be, gpdt);
    }
    printf("%s vocab_shard_ids_i32 3 parts of [0,37): %d of %d ids wrong\n", wrong_ids ? "FAIL" : "ok  ", wrong_ids,
           SHARD_PARTS * N);
    g_checks++;
    if (wrong_ids) g_failures++;
    be->embedding(be, go, gt, ids, N, D);
    float *whole = from_device(be, go, (size_t)N * D);
    double *ref_whole = to_double(whole, (size_t)N * D);
    float *sum_f = malloc((size_t)N * D * sizeof(float)), *sum_i32_f = malloc((size_t)N * D * sizeof(float));
    for (size_t e = 0; e < (size_t)N * D; e++) sum_f[e] = (float)sum[e], sum_i32_f[e] = (float)sum_i32[e];
    report("embedding sum over 3 parts = whole table's", sum_f, ref_whole, (size_t)N * D, 0.0);
    report("embedding_i32 sum over 3 parts = whole table's", sum_i32_f, ref_whole, (size_t)N * D, 0.0);
    void *gdt = be->alloc_f32(be, (size_t)V * D);
    be->upload_f32(be, gdt, dt0, (size_t)V * D);
    be->embedding_backward(be, gdt, gdo, ids, N, D);
    float *whole_dt = malloc((size_t)V * D * sizeof(float));
    be->download_f32(be, whole_dt, gdt, (size_t)V * D);
    float *parts_dt_f = malloc((size_t)V * D * sizeof(float));
    double *ref_dt = to_double(whole_dt, (size_t)V * D);
    for (size_t e = 0; e < (size_t)V * D; e++) parts_dt_f[e] = (float)dt_parts[e];
    report("embedding_backward 3 parts (ids < 0 skipped) = whole", parts_dt_f, ref_dt, (size_t)V * D, 0.0);

    free(table), free(dout), free(dt0), free(stale), free(sum), free(sum_i32), free(dt_parts), free(whole),
        free(ref_whole), free(sum_f), free(sum_i32_f), free(whole_dt), free(parts_dt_f), free(ref_dt);
    be->free(be, gt), be->free(be, go), be->free(be, gdo), be->free(be, gids), be->free(be, gpids), be->free(be, gdt);
}

/* sum_squares (against double), scale, zero (adamw is in the op-case table). */
static void test_optimizer_ops(const Backend *be) {
    size_t n = 777;
    float *g = rand_floats(n, 1.0f);
    void *gg = to_device(be, g, n);
    double *ref = malloc(n * sizeof(double));
    double ss = be->sum_squares(be, gg, n), ref_ss = 0;
    for (size_t i = 0; i < n; i++) ref_ss += (double)g[i] * g[i];
    float got_ss = (float)(ss / ref_ss);
    double one = 1.0;
    report("sum_squares [777] (ratio to double ref)", &got_ss, &one, 1, 1e-6);
    be->scale(be, gg, -0.5f, n);
    float *got_s = from_device(be, gg, n);
    for (size_t i = 0; i < n; i++) ref[i] = -0.5 * g[i];
    report("scale [777] by -0.5", got_s, ref, n, 0.0);
    be->zero(be, gg, n);
    float *got_z = from_device(be, gg, n);
    for (size_t i = 0; i < n; i++) ref[i] = 0.0;
    report("zero [777]", got_z, ref, n, 0.0);
    free(g), free(ref), free(got_s), free(got_z);
    be->free(be, gg);
}

/* The CPU instance's threads change no bit: linear and linear_backward with
 * GEMMs large enough to be split (300 x 896 x 200), decode-sized ones (few
 * rows: split by columns, or in fixed column blocks where this BLAS cannot
 * split columns bit-safely), and attention (its rows shared out among
 * threads), on one thread and on three. The wide decode-sized one is also
 * checked against a double-precision reference. */
static void test_threads_same_bits(Backend *be) {
    int n = 300, in = 896, out = 200, H = 4, KVH = 2, Dh = 16, L = 40, kvd = KVH * Dh;
    size_t nx = (size_t)n * in, nw = (size_t)out * in, ny = (size_t)n * out, qn = (size_t)L * H * Dh;
    float *x = rand_floats(nx, 1.0f), *w = rand_floats(nw, 0.05f), *dy = rand_floats(ny, 1.0f),
          *q = rand_floats(qn, 1.0f), *kc = rand_floats((size_t)L * kvd, 1.0f), *vc = rand_floats((size_t)L * kvd, 1.0f);
    void *gx = to_device(be, x, nx), *gw = to_device(be, w, nw), *gdy = to_device(be, dy, ny), *gq = to_device(be, q, qn),
         *gk = to_device(be, kc, (size_t)L * kvd), *gv = to_device(be, vc, (size_t)L * kvd);
    void *gy = be->alloc(be, ny), *gdx = be->alloc(be, nx), *gdw = be->alloc_f32(be, nw), *ga = be->alloc(be, qn);
    int slot[40], pos[40];
    for (int i = 0; i < L; i++) slot[i] = 0, pos[i] = i;
    int wide_n = 16, wide_in = 576, wide_out = 3072; /* SmolLM2's gate/up projections at a decode step of 16 */
    size_t nwx = (size_t)wide_n * wide_in, nww = (size_t)wide_out * wide_in, nwy = (size_t)wide_n * wide_out;
    float *wx = rand_floats(nwx, 1.0f), *ww = rand_floats(nww, 0.05f);
    void *gwx = to_device(be, wx, nwx), *gww = to_device(be, ww, nww), *gwy = be->alloc(be, nwy);
    float *got[2][6];
    for (int run = 0; run < 2; run++) {
        be->set_threads(be, run == 0 ? 1 : 3);
        be->linear(be, gy, gx, gw, NULL, n, in, out);
        got[run][0] = from_device(be, gy, ny);
        be->linear(be, gy, gx, gw, NULL, 32, in, out); /* a decode step's */
        got[run][1] = from_device(be, gy, (size_t)32 * out);
        be->zero_f32(be, gdw, nw);
        be->linear_backward(be, gdx, gdw, NULL, gdy, gx, gw, n, in, out, 0);
        got[run][2] = from_device(be, gdx, nx);
        got[run][3] = malloc(nw * sizeof(float));
        be->download_f32(be, got[run][3], gdw, nw);
        be->attention(be, ga, NULL, gq, gk, gv, slot, pos, L, H, KVH, Dh, L);
        got[run][4] = from_device(be, ga, qn);
        be->linear(be, gwy, gwx, gww, NULL, wide_n, wide_in, wide_out);
        got[run][5] = from_device(be, gwy, nwy);
    }
    /* each output within 1e-5 of the sum of its terms' magnitudes: any summation order passes, a wrong block fails */
    int far = 0;
    for (int i = 0; i < wide_n; i++)
        for (int j = 0; j < wide_out; j++) {
            double ref = 0, mag = 0;
            for (int q = 0; q < wide_in; q++) {
                double term = (double)wx[(size_t)i * wide_in + q] * ww[(size_t)j * wide_in + q];
                ref += term, mag += fabs(term);
            }
            far += fabs(got[1][5][(size_t)i * wide_out + j] - ref) > 1e-5 * mag;
        }
    CHECK(far == 0, "linear [16,576]x[3072,576]^T on 3 threads: %d of %zu outputs off the double reference", far, nwy);
    printf("%s %-40s 3 threads vs double reference: %d of %zu off\n", far ? "FAIL" : "ok  ",
           "linear [16,576]x[3072,576]^T", far, nwy);
    const char *what[6] = {"linear [300,896]x[200,896]^T", "linear [32,896]x[200,896]^T", "linear_backward dx",
                           "linear_backward dw", "attention 40 tokens", "linear [16,576]x[3072,576]^T"};
    size_t sizes[6] = {ny, (size_t)32 * out, nx, nw, qn, nwy};
    for (int k = 0; k < 6; k++) {
        bool same = memcmp(got[0][k], got[1][k], sizes[k] * sizeof(float)) == 0;
        CHECK(same, "%s: 1 thread and 3 threads give different bits", what[k]);
        printf("%s %-40s 1 thread vs 3 threads: %s\n", same ? "ok  " : "FAIL", what[k], same ? "same bits" : "differ");
        free(got[0][k]), free(got[1][k]);
    }
    be->set_threads(be, 2);
    free(x), free(w), free(dy), free(q), free(kc), free(vc), free(wx), free(ww);
    void *bufs[13] = {gx, gw, gdy, gq, gk, gv, gy, gdx, gdw, ga, gwx, gww, gwy};
    for (int k = 0; k < 13; k++) be->free(be, bufs[k]);
}

/* A CPU instance keeps freed blocks of 1 MB or more for its next allocation of
 * up to a quarter less (cpu_backend.c CPU_CACHE_*); memory_stats counts what is
 * in use, never what is kept. */
static void test_cpu_block_cache(void) {
    char err[ERR_LEN];
    Backend *be = backend_open("cpu", 0, err);
    CHECK(be != NULL, "backend_open cpu: %s", err);
    if (!be) return;
    size_t mb = 1 << 20, in_use = 0, peak = 0;
    float *p = be->alloc(be, 2 * mb / sizeof(float));
    for (size_t i = 0; i < 2 * mb / sizeof(float); i += 1024) p[i] = (float)i;
    be->free(be, p);
    be->memory_stats(be, &in_use, &peak, true);
    CHECK(in_use == 0, "a freed block is kept, but %zu bytes count as in use", in_use);
    float *q = be->alloc(be, (2 * mb - mb / 8) / sizeof(float)); /* 1.875 MB: the 2 MB block */
    be->memory_stats(be, &in_use, &peak, false);
    CHECK(q == p && in_use == 2 * mb - mb / 8, "1.875 MB after freeing 2 MB: %s block, %zu bytes in use",
          q == p ? "the same" : "another", in_use);
    float *r = be->alloc(be, 2 * mb / sizeof(float)); /* none kept now */
    CHECK(r != q, "two live buffers share a block");
    be->free(be, q);
    float *small = be->alloc(be, mb / sizeof(float)); /* half the kept 2 MB block: too much slack, a new one */
    CHECK(small != q, "a 1 MB buffer took a kept 2 MB block");
    float *half = be->alloc(be, (mb / 2) / sizeof(float)); /* below the cache's minimum */
    be->free(be, half), be->free(be, small), be->free(be, r);
    be->memory_stats(be, &in_use, &peak, false);
    CHECK(in_use == 0, "all freed: %zu bytes in use", in_use);
    printf("cpu block cache: a freed 2 MB block serves 1.875 MB, not 1 MB; in use counts live buffers only\n");
    backend_close(be);
}

/* The threads a rank computes with: cgroup quota lines, OMP_NUM_THREADS, the
 * cores shared among a host's ranks (the remainder to the lowest). */
static void test_cpu_threads(void) {
    CHECK(cpu_quota_cores("max 100000\n", 0, 0) == 0, "cpu.max 'max': no quota");
    CHECK(cpu_quota_cores("150000 100000\n", 0, 0) == 2, "cpu.max 150000/100000: 2 cores");
    CHECK(cpu_quota_cores("200000 100000", 0, 0) == 2, "cpu.max 200000/100000: 2 cores");
    CHECK(cpu_quota_cores("garbage", 0, 0) == 0, "an unreadable cpu.max: no quota");
    CHECK(cpu_quota_cores(NULL, -1, 100000) == 0, "cgroup v1 quota -1: no quota");
    CHECK(cpu_quota_cores(NULL, 50000, 100000) == 1, "cgroup v1 50000/100000: 1 core");
    int cores = cpu_cores_usable();
    CHECK(cores >= 1, "cpu_cores_usable: %d", cores);
    char *kept = getenv("OMP_NUM_THREADS") ? strdup(getenv("OMP_NUM_THREADS")) : NULL;
    unsetenv("OMP_NUM_THREADS");
    const char *why = NULL;
    int total = 0;
    for (int r = 0; r < cores + 1; r++) total += cpu_threads_for_rank(r, cores + 1, &why);
    /* cores + 1 ranks: every rank gets at least one, so one core is shared by two ranks */
    CHECK(total == cores + 1, "%d ranks on %d cores: %d threads in all, want %d", cores + 1, cores, total, cores + 1);
    CHECK(cpu_threads_for_rank(0, 1, &why) == cores && strstr(why, "cores"), "a world of one takes the %d cores", cores);
    setenv("OMP_NUM_THREADS", "3", 1);
    CHECK(cpu_threads_for_rank(1, 2, &why) == 3 && !strcmp(why, "OMP_NUM_THREADS"), "OMP_NUM_THREADS=3 is taken as given");
    if (kept) setenv("OMP_NUM_THREADS", kept, 1), free(kept);
    else unsetenv("OMP_NUM_THREADS");
    printf("cpu threads: %d usable core(s); quota lines, shares and OMP_NUM_THREADS checked\n", cores);
}

static void run_all(const Backend *be, OpRefs *refs) {
    printf("backend: %s\n", be->name);
    g_stream = 0; /* every backend gets the same inputs */
    g_failures += op_cases_check_reference(be, refs, &g_checks);
    test_attention(be);
    test_attention_backward(be);
    test_log_softmax_entropy_backward(be);
    test_logits_shard(be);
    test_vocab_shard_embedding(be);
    test_optimizer_ops(be);
}

int main(void) {
    OpRefs *refs = op_refs_create(); /* the table's references, computed once for the four CPU runs */
    run_all(backend_cpu(), refs);
    /* Again through the profiling wrapper: it must forward every op unchanged,
     * and its report must account for them. */
    Backend *profiled = backend_profile_wrap(backend_cpu());
    run_all(profiled, refs);
    char *report = NULL;
    size_t len = 0;
    FILE *fp = open_memstream(&report, &len);
    backend_profile_report(profiled, fp);
    fclose(fp);
    backend_profile_free(profiled);

    /* Two CPU instances side by side: the deterministic mode is each one's own. */
    char err[ERR_LEN];
    Backend *a = backend_open("cpu", 0, err), *b = backend_open("cpu", 0, err);
    a->set_batch_invariant(a, 1);
    run_all(b, refs); /* b still runs the BLAS path, a the invariant one */
    run_all(a, refs);
    test_threads_same_bits(b);
    test_threads_same_bits(a);
    test_cpu_threads();
    test_cpu_block_cache();
    backend_close(a);
    backend_close(b);
    op_refs_free(refs);
    int rows = 0;
    for (const char *c = report; *c; c++) rows += *c == '\n';
    printf("profile report: %d lines (linear row present: %s)\n", rows, strstr(report, "| linear |") ? "yes" : "no");
    const char *only = getenv("COLT_OP_CASES"); /* a filtered run calls fewer ops: the report is shorter */
    g_checks++;
    if ((!only || !*only) && (rows < 20 || !strstr(report, "| linear |"))) g_failures++;
    free(report);
    printf("%s: %d checks, %d failures\n", g_failures ? "FAILED" : "OK", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
