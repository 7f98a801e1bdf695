/* test_cuda_invariant.c — the deterministic mode's kernels (backend.h set_batch_invariant) on both
 * CUDA tables (GPU machine only):
 *   - linear (src/backend/cuda/cuda_invariant.cu) against the CPU's on Qwen2.5 0.5B and 1.5B projection
 *     shapes and ragged ones (in_dim not a multiple of 8, odd out_dim), with and without bias:
 *     cuda_f32 within 1e-5 * max|ref|; bf16 within 2e-3 * max|ref| + |ref| * 2^-7;
 *   - batch invariance: rows computed in calls of n = 1 .. 200 rows taken at other offsets are
 *     bit-identical to the same rows of one 300-row call; a misaligned x gives the same bits; bf16
 *     shapes with I and O multiples of 8 (cuBLASLt without split-K): each of the split-K-free
 *     algorithms, forced in turn, gives the same bits; colt's own kernel (the other shapes; forced
 *     on these): its three tile shapes give the same bits (n <= 32: its decode kernel);
 *   - attention: the training attention op (caches [S, L, KVD]) and paged_attention over the same
 *     keys in a shuffled 16-token block pool are bit-identical, for every token and for a
 *     decode-like call of each sequence's last token alone; both within 1e-5 (f32) / 1e-2 (bf16) of
 *     the CPU.
 * Exit 77 without a GPU. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../harness.h"
#include "backend/backend.h"
#include "backend_op_cases.h"

/* Test hooks on an instance. cuda_invariant.cu: -1 automatic, 0..2 a bf16 tile shape; cuda_gemm.cu: -1 the
 * fastest, else split-K-free candidate k. */
void cuda_invariant_force_shape(const Backend *be, int shape);
void cuda_gemm_force_candidate(const Backend *be, int k);

static void fill(float *x, size_t n, uint64_t seed, float scale) {
    for (size_t i = 0; i < n; i++) {
        uint64_t z = (seed + 1) * 0xD1B54A32D192ED03ull + (i + 1) * 0x9E3779B97F4A7C15ull;
        z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
        z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
        z ^= z >> 31;
        x[i] = scale * ((float)(z >> 40) * (2.0f / 16777216.0f) - 1.0f);
    }
}

static int same_bits(const float *a, const float *b, size_t n) { return memcmp(a, b, n * sizeof(float)) == 0; }

/* ---------------------------------------------------------------- linear */

#define FULL_ROWS 2100

static void test_linear(const Backend *be, int in_dim, int out_dim, int with_bias) {
    const Backend *cpu = backend_cpu();
    int bf16 = be->storage == DTYPE_BF16;
    size_t nx = (size_t)FULL_ROWS * in_dim + 8, nw = (size_t)out_dim * in_dim, no = (size_t)FULL_ROWS * out_dim;
    float *x = malloc(nx * sizeof(float)), *w = malloc(nw * sizeof(float)), *b = malloc(out_dim * sizeof(float));
    float *ref = malloc(no * sizeof(float)), *full = malloc(no * sizeof(float)), *got = malloc(no * sizeof(float));
    fill(x, nx, 1, 1.0f);
    fill(w, nw, 2, 1.0f / sqrtf((float)in_dim));
    fill(b, out_dim, 3, 0.5f);
    void *dx = op_upload(be, x, nx), *dw = op_upload(be, w, nw), *db = with_bias ? op_upload(be, b, out_dim) : NULL;
    void *dout = be->alloc(be, no);

    /* CPU reference (its default sgemm) on the storage-rounded inputs */
    void *cx = cpu->alloc(cpu, nx), *cw = cpu->alloc(cpu, nw), *cb = cpu->alloc(cpu, out_dim), *co = cpu->alloc(cpu, no);
    cpu->upload(cpu, cx, x, nx), cpu->upload(cpu, cw, w, nw), cpu->upload(cpu, cb, b, out_dim);
    cpu->linear(cpu, co, cx, cw, with_bias ? cb : NULL, FULL_ROWS, in_dim, out_dim);
    cpu->download(cpu, ref, co, no);

    be->linear(be, dout, dx, dw, db, FULL_ROWS, in_dim, out_dim);
    be->download(be, full, dout, no);
    double max_ref = 0, worst = 0;
    for (size_t i = 0; i < no; i++) max_ref = fmax(max_ref, fabs(ref[i]));
    int bad = 0;
    for (size_t i = 0; i < no; i++) {
        double tol = bf16 ? 2e-3 * max_ref + fabs(ref[i]) / 128.0 : 1e-5 * max_ref;
        double d = fabs((double)full[i] - ref[i]);
        if (d > worst) worst = d;
        bad += !(d <= tol);
    }
    CHECK(bad == 0, "%s linear %dx%d->%d bias %d: %d outputs off the CPU (worst %.3g)", be->name, FULL_ROWS, in_dim,
          out_dim, with_bias, bad, worst);

    /* rows [off, off + n) alone */
    static const int ns[] = {1, 2, 5, 16, 17, 64, 128, 200, 2048};
    int invariant = 0;
    for (size_t k = 0; k < sizeof ns / sizeof ns[0]; k++) {
        int n = ns[k], off = (n * 37 + 11) % (FULL_ROWS - n + 1);
        void *sub_x = (char *)dx + (size_t)off * in_dim * dtype_size(be->storage);
        be->linear(be, dout, sub_x, dw, db, n, in_dim, out_dim);
        be->download(be, got, dout, (size_t)n * out_dim);
        int ok = same_bits(got, full + (size_t)off * out_dim, (size_t)n * out_dim);
        invariant += ok;
        CHECK(ok, "%s linear %d->%d: rows %d..%d alone differ from the same rows of %d", be->name, in_dim, out_dim, off,
              off + n - 1, FULL_ROWS);
    }
    /* misaligned x: the same values one element into a buffer */
    void *dx2 = be->alloc(be, nx);
    be->copy(be, dx2, 1, dx, 0, nx - 1);
    be->linear(be, dout, (char *)dx2 + dtype_size(be->storage), dw, db, FULL_ROWS, in_dim, out_dim);
    be->download(be, got, dout, no);
    CHECK(same_bits(got, full, no), "%s linear %d->%d: misaligned x gives other bits", be->name, in_dim, out_dim);
    /* bf16: every cuBLASLt split-K-free candidate (shapes it serves) gives the bits of the automatic
     * choice, and so does colt's own kernel in each forced tile shape (against its own shape 0, since
     * it sums in another order than cuBLAS) */
    int shapes_same = 0, candidates_same = 0, lt = bf16 && in_dim % 8 == 0 && out_dim % 8 == 0;
    if (lt)
        for (int k = 0; k < 8; k++) {
            cuda_gemm_force_candidate(be, k);
            be->linear(be, dout, dx, dw, db, FULL_ROWS, in_dim, out_dim);
            be->download(be, got, dout, no);
            cuda_gemm_force_candidate(be, -1);
            int ok = same_bits(got, full, no);
            candidates_same += ok;
            CHECK(ok, "%s linear %d->%d: cuBLASLt split-K-free candidate %d gives other bits", be->name, in_dim,
                  out_dim, k);
        }
    if (bf16) {
        float *own = lt ? malloc(no * sizeof(float)) : full;
        for (int s = 0; s < 3; s++) {
            cuda_invariant_force_shape(be, s);
            be->linear(be, dout, dx, dw, db, FULL_ROWS, in_dim, out_dim);
            be->download(be, s == 0 && lt ? own : got, dout, no);
            cuda_invariant_force_shape(be, -1);
            int ok = (s == 0 && lt) || same_bits(got, own, no);
            shapes_same += ok;
            CHECK(ok, "%s linear %d->%d: tile shape %d gives other bits", be->name, in_dim, out_dim, s);
        }
        if (lt) free(own);
    }
    char what[96] = "";
    if (bf16)
        snprintf(what, sizeof what, "%s; own kernel: %s", lt ? (candidates_same == 8 ? "; cuBLASLt candidates 0-7 (mod count) alike" : "; CANDIDATES DIFFER") : "",
                 shapes_same == 3 ? "3/3 tile shapes" : "TILE SHAPES DIFFER");
    printf("  %-8s linear %5d -> %5d bias %d: worst |err| %.2e (max|ref| %.2f); %d/8 sub-batches bit-identical%s\n",
           be->name, in_dim, out_dim, with_bias, worst, max_ref, invariant, what);
    void *bufs[] = {dx, dw, db, dout, dx2};
    for (size_t i = 0; i < 5; i++)
        if (bufs[i]) be->free(be, bufs[i]);
    cpu->free(cpu, cx), cpu->free(cpu, cw), cpu->free(cpu, cb), cpu->free(cpu, co);
    free(x), free(w), free(b), free(ref), free(full), free(got);
}

/* ---------------------------------------------------------------- attention */

#define N_SEQ 3
static const int LENS[N_SEQ] = {37, 100, 5};

static void test_attention(const Backend *be, int n_heads, int n_kv_heads, int head_dim) {
    const Backend *cpu = backend_cpu();
    const int block = 16, max_len = 112, max_blocks = max_len / block, kv_dim = n_kv_heads * head_dim;
    int n = 0;
    for (int s = 0; s < N_SEQ; s++) n += LENS[s];
    int *slot = malloc(n * sizeof(int)), *pos = malloc(n * sizeof(int)), *mapping = malloc(n * sizeof(int));
    int tables[N_SEQ * 7], n_pool_blocks = N_SEQ * max_blocks;
    for (int b = 0; b < N_SEQ * max_blocks; b++) tables[b] = (b * 5 + 3) % n_pool_blocks; /* a permutation (gcd(5, 21) = 1) */
    int t = 0;
    for (int s = 0; s < N_SEQ; s++)
        for (int p = 0; p < LENS[s]; p++, t++) {
            slot[t] = s, pos[t] = p;
            mapping[t] = tables[s * max_blocks + p / block] * block + p % block;
        }
    size_t nq = (size_t)n * n_heads * head_dim, nkv = (size_t)n * kv_dim;
    size_t ncache = (size_t)N_SEQ * max_len * kv_dim, npool = (size_t)n_pool_blocks * block * kv_dim;
    float *q = malloc(nq * sizeof(float)), *k = malloc(nkv * sizeof(float)), *v = malloc(nkv * sizeof(float));
    float *ref = malloc(nq * sizeof(float)), *train = malloc(nq * sizeof(float)), *paged = malloc(nq * sizeof(float));
    fill(q, nq, 4, 1.0f), fill(k, nkv, 5, 1.0f), fill(v, nkv, 6, 1.0f);
    void *dq = op_upload(be, q, nq), *dk = op_upload(be, k, nkv), *dv = op_upload(be, v, nkv);
    void *kc = be->alloc(be, ncache), *vc = be->alloc(be, ncache), *kp = be->alloc(be, npool), *vp = be->alloc(be, npool);
    void *out = be->alloc(be, nq);
    be->zero(be, kc, ncache), be->zero(be, vc, ncache), be->zero(be, kp, npool), be->zero(be, vp, npool);
    be->kv_store(be, kc, vc, dk, dv, slot, pos, n, kv_dim, max_len);
    be->attention(be, out, NULL, dq, kc, vc, slot, pos, n, n_heads, n_kv_heads, head_dim, max_len);
    be->download(be, train, out, nq);

    void *d_map = be->alloc_i32(be, n), *d_seq = be->alloc_i32(be, n), *d_pos = be->alloc_i32(be, n),
         *d_tab = be->alloc_i32(be, N_SEQ * max_blocks);
    be->upload_i32(be, d_map, mapping, n), be->upload_i32(be, d_seq, slot, n), be->upload_i32(be, d_pos, pos, n);
    be->upload_i32(be, d_tab, tables, N_SEQ * max_blocks);
    be->paged_kv_store(be, kp, vp, dk, dv, d_map, n, kv_dim);
    be->paged_attention(be, out, dq, kp, vp, d_tab, d_seq, d_pos, n, n_heads, n_kv_heads, head_dim, block, max_blocks);
    be->download(be, paged, out, nq);
    int all_same = same_bits(train, paged, nq);
    CHECK(all_same, "%s attention H%d KVH%d Dh%d: training op and paged_attention differ", be->name, n_heads,
          n_kv_heads, head_dim);

    /* decode-like: each sequence's last token alone */
    int last[N_SEQ], last_seq[N_SEQ], last_pos[N_SEQ], decode_same = 0, end = 0;
    for (int s = 0; s < N_SEQ; s++) end += LENS[s], last[s] = end - 1, last_seq[s] = s, last_pos[s] = LENS[s] - 1;
    size_t row = (size_t)n_heads * head_dim;
    void *dq_last = be->alloc(be, N_SEQ * row);
    for (int s = 0; s < N_SEQ; s++) be->copy(be, dq_last, s * row, dq, (size_t)last[s] * row, row);
    be->upload_i32(be, d_seq, last_seq, N_SEQ), be->upload_i32(be, d_pos, last_pos, N_SEQ);
    be->paged_attention(be, out, dq_last, kp, vp, d_tab, d_seq, d_pos, N_SEQ, n_heads, n_kv_heads, head_dim, block,
                        max_blocks);
    float *dec = malloc(N_SEQ * row * sizeof(float));
    be->download(be, dec, out, N_SEQ * row);
    for (int s = 0; s < N_SEQ; s++) decode_same += same_bits(dec + s * row, train + (size_t)last[s] * row, row);
    CHECK(decode_same == N_SEQ, "%s attention Dh%d: %d/%d last tokens alone bit-identical", be->name, head_dim,
          decode_same, N_SEQ);

    /* CPU reference */
    void *cq = cpu->alloc(cpu, nq), *ck = cpu->alloc(cpu, nkv), *cv = cpu->alloc(cpu, nkv), *ckc = cpu->alloc(cpu, ncache),
         *cvc = cpu->alloc(cpu, ncache), *co = cpu->alloc(cpu, nq);
    cpu->upload(cpu, cq, q, nq), cpu->upload(cpu, ck, k, nkv), cpu->upload(cpu, cv, v, nkv);
    cpu->zero(cpu, ckc, ncache), cpu->zero(cpu, cvc, ncache);
    cpu->kv_store(cpu, ckc, cvc, ck, cv, slot, pos, n, kv_dim, max_len);
    cpu->attention(cpu, co, NULL, cq, ckc, cvc, slot, pos, n, n_heads, n_kv_heads, head_dim, max_len);
    cpu->download(cpu, ref, co, nq);
    double worst = 0, tol = be->storage == DTYPE_BF16 ? 1e-2 : 1e-5;
    for (size_t i = 0; i < nq; i++) worst = fmax(worst, fabs((double)train[i] - ref[i]));
    CHECK(worst <= tol, "%s attention Dh%d: %.3g off the CPU", be->name, head_dim, worst);
    printf("  %-8s attention H%-2d KVH%d Dh%-3d: training op == paged %s, last tokens alone %d/%d, |err| %.2e\n",
           be->name, n_heads, n_kv_heads, head_dim, all_same ? "yes" : "NO", decode_same, N_SEQ, worst);

    void *bufs[] = {dq, dk, dv, kc, vc, kp, vp, out, d_map, d_seq, d_pos, d_tab, dq_last};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) be->free(be, bufs[i]);
    void *cbufs[] = {cq, ck, cv, ckc, cvc, co};
    for (size_t i = 0; i < sizeof cbufs / sizeof cbufs[0]; i++) cpu->free(cpu, cbufs[i]);
    free(slot), free(pos), free(mapping), free(q), free(k), free(v), free(ref), free(train), free(paged), free(dec);
}

int main(void) {
    const Backend *tables[2] = {backend_cuda(), backend_cuda_f32()};
    if (!tables[0]) {
        printf("test_cuda_invariant: no GPU\n");
        return 77;
    }
    static const int shapes[][3] = {
        {896, 1152, 1},  /* 0.5B q|k|v with bias */
        {896, 896, 0},   /* o_proj */
        {896, 9728, 0},  /* gate|up */
        {4864, 896, 0},  /* down */
        {1536, 2048, 1}, /* 1.5B q|k|v */
        {8960, 1536, 0}, /* 1.5B down: long k, where cuBLAS splits k for few rows */
        {172, 64, 0},    /* stories260K down: in_dim % 8 != 0 */
        {64, 172, 1},    /* odd tiles */
        {40, 7, 1},      /* tiny */
        {2048, 16, 0},   /* LoRA A (r 16) of a 1.7B q_proj */
        {16, 2048, 0},   /* LoRA B */
        {16, 8192, 0},   /* LoRA B of a 3B gate_proj */
    };
    for (int b = 0; b < 2; b++) {
        const Backend *be = tables[b];
        be->set_batch_invariant(be, 1);
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            test_linear(be, shapes[s][0], shapes[s][1], shapes[s][2]);
        test_attention(be, 14, 2, 64);   /* Qwen2.5-0.5B heads: the fast path */
        test_attention(be, 12, 2, 128);  /* 1.5B */
        test_attention(be, 8, 4, 8);     /* stories260K: the generic path */
        be->set_batch_invariant(be, 0);
    }
    printf("test_cuda_invariant: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
