/* test_cuda_fused.c — the CUDA fused decode ops (cuda_fused.cu) on both CUDA
 * tables (cuda_f32: fp32 storage, cuda: bf16 storage):
 *   - bit-identical to the unfused op sequence they replace ON THE SAME table
 *     (downloads compared with memcmp: fp32 holds every bf16 exactly):
 *       add_rmsnorm       == add(x, x, delta); rmsnorm(xn, x, w)
 *       qkv_rope_store    == copy the q, k, v parts out of qkv; rope_i32(q);
 *                            rope_i32(k); paged_kv_store(pools, k, v)
 *       swiglu_gate_up    == copy the halves out; swiglu(out, gate, up)
 *       paged_attention_rope == qkv_rope_store; paged_attention (decode steps:
 *                            output and both pools)
 *   - against the CPU's fused op (itself bit-identical to the CPU's unfused
 *     sequence, tests/test_fused.c) within test_cuda_ops' tolerances;
 *   - captured once in a CUDA graph and replayed with new inputs: the same bits
 *     as an eager call.
 * Shapes of Qwen2.5 0.5B / 1.5B / 7B at N = 1, 7, 128 (a padding token, slot
 * -1, from N = 7 up; the pools start random and are compared whole), and the
 * other kernel paths: widths that are no multiple of 8, misaligned pointers
 * (scalar kernels, checked against the unfused vectorised ones), rows too wide
 * for add_rmsnorm's shared-memory staging. Then fused vs unfused timings.
 *
 * Tolerances vs the CPU as test_cuda_ops: cuda_f32 within f32_rel * max|ref|;
 * cuda within bf16_abs * max|ref| + |ref| * bf16_k * 2^-8, the inputs rounded
 * to bf16 once (uploaded, read back, and given to the CPU op as such). Exits 1
 * on any failure, 77 (skip) without a CUDA device.
 *
 * Dimension legend: N tokens, D model width, F MLP width, H query heads, KVH
 * key/value heads, Dh head dim, W = (H + 2*KVH) * Dh. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../rope_table.h"
#include "backend/backend.h"
#include "backend/cuda/cuda_bench.h"
#include "backend_op_cases.h"
#include "core/error.h"

static int g_failures = 0, g_checks = 0;
static uint64_t g_random_state = 0x9e3779b97f4a7c15ull;
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

static const Tol ADD_TOL = {1e-6, 1e-6, 1.0};     /* test_cuda_ops' add */
static const Tol RMSNORM_TOL = {1e-5, 1e-4, 2.0}; /* rmsnorm's, + the bf16 rounding of x before the norm */
static const Tol ROPE_TOL = {1e-5, 1e-4, 1.5};
static const Tol SWIGLU_TOL = {1e-5, 1e-5, 1.5};
static const Tol EXACT = {0, 0, 0};

/* ---------------------------------------------------------------- helpers */

static uint64_t next_random(void) { /* splitmix64 */
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

/* `off` elements into a device buffer (off = 1: not 16-byte aligned). */
static void *dev_at(const Dev *d, void *buf, size_t off) {
    return (char *)buf + off * dtype_size(d->be->storage);
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
    size_t n_diff = 0, first = 0;
    for (size_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], sizeof(float)) != 0 && n_diff++ == 0) first = i;
    int ok = n > 0 && n_diff == 0;
    count_check(ok);
    printf("%s %-9s %-72s %zu of %zu elements differ\n", ok ? "ok  " : "FAIL", d->tag, what, n_diff, n);
    if (n_diff) printf("     first at [%zu]: fused %.9g unfused %.9g\n", first, (double)a[first], (double)b[first]);
}

/* Downloads two device buffers of one table and compares them bitwise. */
static void check_identical_buffers(const Dev *d, const char *what, const void *fused, const void *unfused,
                                    size_t n) {
    float *a = op_fetch(d->be, fused, n), *b = op_fetch(d->be, unfused, n);
    check_identical(d, what, a, b, n);
    free(a), free(b);
}

/* ---------------------------------------------------------------- add_rmsnorm */

/* x and xn start `off` elements into their buffers, delta `delta_off`: off = 1
 * sends both the fused and the unfused norm down the scalar (block) kernel;
 * delta_off = 1 alone keeps the vectorised norm with element loads of delta. */
static void test_add_rmsnorm(const Dev *d, int n, int dim, size_t off, size_t delta_off) {
    char name[200];
    float eps = 1e-6f;
    size_t nx = (size_t)n * dim;
    float *x = rand_floats(nx + off, 3.0f), *delta = rand_floats(nx + delta_off, 1.0f), *w = rand_floats(dim, 1.0f);
    void *g_x = op_upload(d->be, x, nx + off), *g_x2 = op_upload(d->be, x, nx + off),
         *g_delta = op_upload(d->be, delta, nx + delta_off);
    void *g_w = op_upload(d->be, w, dim), *g_xn = d->be->alloc(d->be, nx + off), *g_xn2 = d->be->alloc(d->be, nx + off);
    void *c_x = op_upload(CPU, x + off, nx), *c_delta = op_upload(CPU, delta + delta_off, nx),
         *c_w = op_upload(CPU, w, dim);
    void *c_xn = CPU->alloc(CPU, nx);

    d->be->add_rmsnorm(d->be, dev_at(d, g_x, off), dev_at(d, g_xn, off), dev_at(d, g_delta, delta_off), g_w, n, dim, eps);
    d->be->add(d->be, dev_at(d, g_x2, off), dev_at(d, g_x2, off), dev_at(d, g_delta, delta_off), nx);
    d->be->rmsnorm(d->be, dev_at(d, g_xn2, off), dev_at(d, g_x2, off), g_w, n, dim, eps);
    CPU->add_rmsnorm(CPU, c_x, c_xn, c_delta, c_w, n, dim, eps);

    float *fx = op_fetch(d->be, g_x, nx + off), *ux = op_fetch(d->be, g_x2, nx + off);
    float *fxn = op_fetch(d->be, g_xn, nx + off), *uxn = op_fetch(d->be, g_xn2, nx + off);
    float *rx = op_fetch(CPU, c_x, nx), *rxn = op_fetch(CPU, c_xn, nx);
    char shape[80];
    snprintf(shape, sizeof shape, "[%d,%d]%s%s", n, dim, off ? " x/xn misaligned" : "",
             delta_off ? " delta misaligned" : "");
    snprintf(name, sizeof name, "add_rmsnorm %s: x == add (bit-identical)", shape);
    check_identical(d, name, fx + off, ux + off, nx);
    snprintf(name, sizeof name, "add_rmsnorm %s: xn == rmsnorm(add) (bit-identical)", shape);
    check_identical(d, name, fxn + off, uxn + off, nx);
    snprintf(name, sizeof name, "add_rmsnorm %s: x vs cpu", shape);
    check(d, name, fx + off, rx, nx, ADD_TOL);
    snprintf(name, sizeof name, "add_rmsnorm %s: xn vs cpu", shape);
    check(d, name, fxn + off, rxn, nx, RMSNORM_TOL);

    free(x), free(delta), free(w), free(fx), free(ux), free(fxn), free(uxn), free(rx), free(rxn);
    d->be->free(d->be, g_x), d->be->free(d->be, g_x2), d->be->free(d->be, g_delta), d->be->free(d->be, g_w), d->be->free(d->be, g_xn);
    d->be->free(d->be, g_xn2);
    CPU->free(CPU, c_x), CPU->free(CPU, c_delta), CPU->free(CPU, c_w), CPU->free(CPU, c_xn);
}

/* ---------------------------------------------------------------- qkv_rope_store */

/* Positions up to 2000 (token 0 at 2000), distinct shuffled pool rows, token
 * n/2 padding from N = 7 up (its position garbage, as the engine may leave it). */
static void make_tokens(int *pos, int *slots, int n, int pool_rows) {
    int *rows = xmalloc((size_t)pool_rows * sizeof(int));
    for (int r = 0; r < pool_rows; r++) rows[r] = r;
    for (int r = pool_rows - 1; r > 0; r--) {
        int j = rand_int(0, r), t = rows[r];
        rows[r] = rows[j], rows[j] = t;
    }
    for (int i = 0; i < n; i++) pos[i] = i == 0 ? 2000 : rand_int(0, 2000), slots[i] = rows[i];
    if (n >= 7) slots[n / 2] = -1, pos[n / 2] = rand_int(0, 1 << 20);
    free(rows);
}

/* qkv starts `off` elements into its buffer (off = 1: the scalar kernel, while
 * the unfused rope_i32 on its own aligned buffers takes the vectorised one). */
static void test_qkv_rope_store(const Dev *d, int n, int heads, int kv_heads, int head_dim, float theta, size_t off,
                                const char *label) {
    char name[200], what[120];
    int q_dim = heads * head_dim, kv_dim = kv_heads * head_dim, row = q_dim + 2 * kv_dim;
    int pool_rows = n + 37; /* rows nobody writes stay as they were */
    size_t n_qkv = (size_t)n * row, n_q = (size_t)n * q_dim, n_pool = (size_t)pool_rows * kv_dim;
    int *pos = xmalloc((size_t)n * sizeof(int)), *slots = xmalloc((size_t)n * sizeof(int));
    make_tokens(pos, slots, n, pool_rows);
    float *qkv = rand_floats(n_qkv + off, 1.0f), *kp = rand_floats(n_pool, 1.0f), *vp = rand_floats(n_pool, 1.0f);
    const Backend *be = d->be;
    void *g_qkv = op_upload(d->be, qkv, n_qkv + off), *g_pos = op_upload_i32(be, pos, (size_t)n),
         *g_slots = op_upload_i32(be, slots, (size_t)n);
    void *g_q = be->alloc(be, n_q), *g_kp = op_upload(d->be, kp, n_pool), *g_vp = op_upload(d->be, vp, n_pool);
    void *u_q = be->alloc(be, n_q), *u_kp = op_upload(d->be, kp, n_pool), *u_vp = op_upload(d->be, vp, n_pool);
    void *u_k = be->alloc(be, (size_t)n * kv_dim), *u_v = be->alloc(be, (size_t)n * kv_dim);
    void *c_qkv = op_upload(CPU, qkv + off, n_qkv), *c_q = CPU->alloc(CPU, n_q), *c_kp = op_upload(CPU, kp, n_pool),
         *c_vp = op_upload(CPU, vp, n_pool);
    void *c_pos = op_upload_i32(CPU, pos, (size_t)n), *c_slots = op_upload_i32(CPU, slots, (size_t)n);

    be->qkv_rope_store(be, g_q, g_kp, g_vp, dev_at(d, g_qkv, off), g_pos, g_slots, n, heads, kv_heads, head_dim,
                       rope_table(head_dim, theta));
    for (int i = 0; i < n; i++) {
        size_t src = off + (size_t)i * row;
        be->copy(be, u_q, (size_t)i * q_dim, g_qkv, src, (size_t)q_dim);
        be->copy(be, u_k, (size_t)i * kv_dim, g_qkv, src + q_dim, (size_t)kv_dim);
        be->copy(be, u_v, (size_t)i * kv_dim, g_qkv, src + q_dim + kv_dim, (size_t)kv_dim);
    }
    be->rope_i32(be, u_q, g_pos, n, heads, head_dim, rope_table(head_dim, theta));
    be->rope_i32(be, u_k, g_pos, n, kv_heads, head_dim, rope_table(head_dim, theta));
    be->paged_kv_store(be, u_kp, u_vp, u_k, u_v, g_slots, n, kv_dim);
    CPU->qkv_rope_store(CPU, c_q, c_kp, c_vp, c_qkv, c_pos, c_slots, n, heads, kv_heads, head_dim,
                        rope_table(head_dim, theta));

    snprintf(what, sizeof what, "%s H=%d KVH=%d Dh=%d N=%d%s%s", label, heads, kv_heads, head_dim, n,
             n >= 7 ? " 1 pad" : "", off ? " qkv misaligned" : "");
    const void *fused[3] = {g_q, g_kp, g_vp}, *unfused[3] = {u_q, u_kp, u_vp}, *cpu[3] = {c_q, c_kp, c_vp};
    const size_t count[3] = {n_q, n_pool, n_pool};
    const char *part[3] = {"q", "k pool", "v pool"};
    const Tol tol[3] = {ROPE_TOL, ROPE_TOL, EXACT};
    for (int p = 0; p < 3; p++) {
        float *got = op_fetch(d->be, fused[p], count[p]), *same = op_fetch(d->be, unfused[p], count[p]);
        float *ref = op_fetch(CPU, cpu[p], count[p]);
        snprintf(name, sizeof name, "qkv_rope_store %s: %s (bit-identical)", what, part[p]);
        check_identical(d, name, got, same, count[p]);
        snprintf(name, sizeof name, "qkv_rope_store %s: %s vs cpu", what, part[p]);
        check(d, name, got, ref, count[p], tol[p]);
        free(got), free(same), free(ref);
    }

    free(pos), free(slots), free(qkv), free(kp), free(vp);
    be->free(be, g_qkv), be->free(be, g_pos), be->free(be, g_slots), be->free(be, g_q), be->free(be, g_kp), be->free(be, g_vp);
    be->free(be, u_q), be->free(be, u_kp), be->free(be, u_vp), be->free(be, u_k), be->free(be, u_v);
    CPU->free(CPU, c_qkv), CPU->free(CPU, c_q), CPU->free(CPU, c_kp), CPU->free(CPU, c_vp), CPU->free(CPU, c_pos), CPU->free(CPU, c_slots);
}

/* ---------------------------------------------------------------- paged_attention_rope */

/* A decode step of n sequences (sequence i: token i, its own shuffled blocks of 16, position up to
 * max_pos; token n/2 padding from n = 7 up: seq -1, slot -1): paged_attention_rope against qkv_rope_store
 * then paged_attention, outputs and both pools bit for bit. */
static void test_paged_attention_rope(const Dev *d, int n, int heads, int kv_heads, int head_dim, int max_pos,
                                      const char *label) {
    char name[200];
    const Backend *be = d->be;
    const int bs = 16, max_blocks = (max_pos + 1 + bs - 1) / bs, q_dim = heads * head_dim, kv_dim = kv_heads * head_dim;
    const int row = q_dim + 2 * kv_dim, pool_rows = n * max_blocks * bs;
    int *pos = xmalloc(sizeof(int) * n), *seq = xmalloc(sizeof(int) * n), *slots = xmalloc(sizeof(int) * n);
    int *tables = xmalloc(sizeof(int) * (size_t)n * max_blocks), *blocks = xmalloc(sizeof(int) * (size_t)n * max_blocks);
    for (int b = 0; b < n * max_blocks; b++) blocks[b] = b;
    for (int b = n * max_blocks - 1; b > 0; b--) {
        int j = rand_int(0, b), t = blocks[b];
        blocks[b] = blocks[j], blocks[j] = t;
    }
    for (int i = 0; i < n; i++) {
        for (int k = 0; k < max_blocks; k++) tables[i * max_blocks + k] = blocks[i * max_blocks + k];
        pos[i] = i == 0 ? max_pos : rand_int(0, max_pos), seq[i] = i;
        slots[i] = tables[i * max_blocks + pos[i] / bs] * bs + pos[i] % bs;
    }
    if (n >= 7) seq[n / 2] = -1, slots[n / 2] = -1, pos[n / 2] = 0;
    size_t n_qkv = (size_t)n * row, n_out = (size_t)n * q_dim, n_pool = (size_t)pool_rows * kv_dim;
    float *qkv = rand_floats(n_qkv, 1.0f), *kp = rand_floats(n_pool, 1.0f), *vp = rand_floats(n_pool, 1.0f);
    float *out0 = rand_floats(n_out, 1.0f);
    void *g_qkv = op_upload(d->be, qkv, n_qkv), *g_pos = op_upload_i32(be, pos, n), *g_seq = op_upload_i32(be, seq, n);
    void *g_slots = op_upload_i32(be, slots, n), *g_tables = op_upload_i32(be, tables, (size_t)n * max_blocks);
    void *f_out = op_upload(d->be, out0, n_out), *f_q = be->alloc(be, n_out), *f_kp = op_upload(d->be, kp, n_pool),
         *f_vp = op_upload(d->be, vp, n_pool);
    void *u_out = op_upload(d->be, out0, n_out), *u_q = be->alloc(be, n_out), *u_kp = op_upload(d->be, kp, n_pool),
         *u_vp = op_upload(d->be, vp, n_pool);
    be->paged_attention_rope(be, f_out, f_q, f_kp, f_vp, g_qkv, g_tables, g_seq, g_pos, g_slots, n, heads, kv_heads,
                             head_dim, rope_table(head_dim, 1000000.0f), bs, max_blocks);
    be->qkv_rope_store(be, u_q, u_kp, u_vp, g_qkv, g_pos, g_slots, n, heads, kv_heads, head_dim,
                       rope_table(head_dim, 1000000.0f));
    be->paged_attention(be, u_out, u_q, u_kp, u_vp, g_tables, g_seq, g_pos, n, heads, kv_heads, head_dim, bs, max_blocks);
    const void *fused[3] = {f_out, f_kp, f_vp}, *unfused[3] = {u_out, u_kp, u_vp};
    const size_t count[3] = {n_out, n_pool, n_pool};
    const char *part[3] = {"out", "k pool", "v pool"};
    for (int p = 0; p < 3; p++) {
        snprintf(name, sizeof name, "paged_attention_rope %s H=%d KVH=%d Dh=%d N=%d pos<=%d%s: %s", label, heads,
                 kv_heads, head_dim, n, max_pos, n >= 7 ? " 1 pad" : "", part[p]);
        check_identical_buffers(d, name, fused[p], unfused[p], count[p]);
    }
    free(pos), free(seq), free(slots), free(tables), free(blocks), free(qkv), free(kp), free(vp), free(out0);
    void *bufs[] = {g_qkv, g_pos, g_seq, g_slots, g_tables, f_out, f_q, f_kp, f_vp, u_out, u_q, u_kp, u_vp};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) be->free(be, bufs[k]);
}

/* ---------------------------------------------------------------- swiglu_gate_up */

/* gate_up starts `off` elements into its buffer (off = 1: the scalar kernel). */
static void test_swiglu_gate_up(const Dev *d, int n, int f, size_t off) {
    char name[200];
    size_t no = (size_t)n * f;
    const Backend *be = d->be;
    float *gate_up = rand_floats(2 * no + off, 3.0f);
    void *g_gate_up = op_upload(d->be, gate_up, 2 * no + off), *g_out = be->alloc(be, no), *u_out = be->alloc(be, no);
    void *u_gate = be->alloc(be, no), *u_up = be->alloc(be, no);
    void *c_gate_up = op_upload(CPU, gate_up + off, 2 * no), *c_out = CPU->alloc(CPU, no);

    be->swiglu_gate_up(be, g_out, dev_at(d, g_gate_up, off), n, f);
    for (int i = 0; i < n; i++) {
        be->copy(be, u_gate, (size_t)i * f, g_gate_up, off + (size_t)i * 2 * f, (size_t)f);
        be->copy(be, u_up, (size_t)i * f, g_gate_up, off + (size_t)i * 2 * f + f, (size_t)f);
    }
    be->swiglu(be, u_out, u_gate, u_up, no);
    CPU->swiglu_gate_up(CPU, c_out, c_gate_up, n, f);

    float *got = op_fetch(d->be, g_out, no), *same = op_fetch(d->be, u_out, no), *ref = op_fetch(CPU, c_out, no);
    snprintf(name, sizeof name, "swiglu_gate_up [%d,2*%d]%s: == swiglu (bit-identical)", n, f,
             off ? " misaligned" : "");
    check_identical(d, name, got, same, no);
    snprintf(name, sizeof name, "swiglu_gate_up [%d,2*%d]%s: vs cpu", n, f, off ? " misaligned" : "");
    check(d, name, got, ref, no, SWIGLU_TOL);

    free(gate_up), free(got), free(same), free(ref);
    be->free(be, g_gate_up), be->free(be, g_out), be->free(be, u_out), be->free(be, u_gate), be->free(be, u_up);
    CPU->free(CPU, c_gate_up), CPU->free(CPU, c_out);
}

/* ---------------------------------------------------------------- graph capture */

/* One layer's worth of fused-op inputs and outputs on a device. */
typedef struct FusedStep {
    int n, dim, heads, kv_heads, head_dim, mlp, pool_rows;
    float theta;
    float inv_freq[512]; /* rope_table(head_dim, theta), made by step_init */
    void *x, *xn, *delta, *w, *qkv, *q, *k_pool, *v_pool, *pos, *slots, *gate_up, *out;
} FusedStep;

static void step_init(FusedStep *s, const Backend *be) {
    memcpy(s->inv_freq, rope_table(s->head_dim, s->theta), sizeof(float) * (size_t)(s->head_dim / 2));
    size_t kv_dim = (size_t)s->kv_heads * s->head_dim, row = (size_t)(s->heads + 2 * s->kv_heads) * s->head_dim;
    s->x = be->alloc(be, (size_t)s->n * s->dim), s->xn = be->alloc(be, (size_t)s->n * s->dim);
    s->delta = be->alloc(be, (size_t)s->n * s->dim), s->w = be->alloc(be, (size_t)s->dim);
    s->qkv = be->alloc(be, (size_t)s->n * row), s->q = be->alloc(be, (size_t)s->n * s->heads * s->head_dim);
    s->k_pool = be->alloc(be, (size_t)s->pool_rows * kv_dim), s->v_pool = be->alloc(be, (size_t)s->pool_rows * kv_dim);
    s->pos = be->alloc_i32(be, (size_t)s->n), s->slots = be->alloc_i32(be, (size_t)s->n);
    s->gate_up = be->alloc(be, (size_t)s->n * 2 * s->mlp), s->out = be->alloc(be, (size_t)s->n * s->mlp);
}

static void step_free(FusedStep *s, const Backend *be) {
    void *bufs[10] = {s->x, s->xn, s->delta, s->w, s->qkv, s->q, s->k_pool, s->v_pool, s->gate_up, s->out};
    for (int k = 0; k < 10; k++) be->free(be, bufs[k]);
    be->free(be, s->pos), be->free(be, s->slots);
}

/* Fresh random inputs (the same for every step given the same seed state). */
static void step_upload(FusedStep *s, const Backend *be, uint64_t seed) {
    uint64_t saved = g_random_state;
    g_random_state = seed;
    size_t kv_dim = (size_t)s->kv_heads * s->head_dim, row = (size_t)(s->heads + 2 * s->kv_heads) * s->head_dim;
    void *bufs[7] = {s->x, s->delta, s->w, s->qkv, s->k_pool, s->v_pool, s->gate_up};
    size_t sizes[7] = {(size_t)s->n * s->dim, (size_t)s->n * s->dim, (size_t)s->dim, (size_t)s->n * row,
                       (size_t)s->pool_rows * kv_dim, (size_t)s->pool_rows * kv_dim, (size_t)s->n * 2 * s->mlp};
    for (int k = 0; k < 7; k++) {
        float *v = rand_floats(sizes[k], k == 0 ? 3.0f : 1.0f);
        be->upload(be, bufs[k], v, sizes[k]);
        free(v);
    }
    int *pos = xmalloc((size_t)s->n * sizeof(int)), *slots = xmalloc((size_t)s->n * sizeof(int));
    make_tokens(pos, slots, s->n, s->pool_rows);
    be->upload_i32(be, s->pos, pos, (size_t)s->n), be->upload_i32(be, s->slots, slots, (size_t)s->n);
    free(pos), free(slots);
    g_random_state = saved;
}

static void step_run(const FusedStep *s, const Backend *be) {
    be->add_rmsnorm(be, s->x, s->xn, s->delta, s->w, s->n, s->dim, 1e-6f);
    be->qkv_rope_store(be, s->q, s->k_pool, s->v_pool, s->qkv, s->pos, s->slots, s->n, s->heads, s->kv_heads,
                       s->head_dim, s->inv_freq);
    be->swiglu_gate_up(be, s->out, s->gate_up, s->n, s->mlp);
}

/* Captures the three ops after a warm-up call (as the engine does: the rope
 * table is uploaded there), replays the graph on new inputs twice, and
 * compares every output with an eager run on the same inputs, bitwise. */
static void test_graph(const Dev *d, int n, int dim, int heads, int kv_heads, int head_dim, int mlp) {
    char name[200];
    const Backend *be = d->be;
    FusedStep graphed = {.n = n, .dim = dim, .heads = heads, .kv_heads = kv_heads, .head_dim = head_dim, .mlp = mlp,
                         .pool_rows = n + 37, .theta = 1000000.0f};
    FusedStep eager = graphed;
    step_init(&graphed, be), step_init(&eager, be);
    step_upload(&graphed, be, 1);
    step_run(&graphed, be); /* warm-up */
    be->capture_begin(be);
    step_run(&graphed, be);
    void *graph = be->capture_end(be);
    for (int round = 0; round < 2; round++) {
        uint64_t seed = 100 + (uint64_t)round;
        step_upload(&graphed, be, seed), step_upload(&eager, be, seed);
        be->graph_launch(be, graph);
        step_run(&eager, be);
        size_t kv_dim = (size_t)kv_heads * head_dim;
        const void *a[6] = {graphed.x, graphed.xn, graphed.q, graphed.k_pool, graphed.v_pool, graphed.out};
        const void *b[6] = {eager.x, eager.xn, eager.q, eager.k_pool, eager.v_pool, eager.out};
        const size_t count[6] = {(size_t)n * dim, (size_t)n * dim, (size_t)n * heads * head_dim,
                                 (size_t)graphed.pool_rows * kv_dim, (size_t)graphed.pool_rows * kv_dim,
                                 (size_t)n * mlp};
        const char *what[6] = {"x", "xn", "q", "k pool", "v pool", "swiglu out"};
        for (int k = 0; k < 6; k++) {
            snprintf(name, sizeof name, "graph replay %d, D=%d H=%d KVH=%d Dh=%d F=%d N=%d: %s == eager", round + 1,
                     dim, heads, kv_heads, head_dim, mlp, n, what[k]);
            check_identical_buffers(d, name, a[k], b[k], count[k]);
        }
    }
    be->graph_free(be, graph);
    step_free(&graphed, be), step_free(&eager, be);
}

/* ---------------------------------------------------------------- speed */

/* The unfused side as the engine ran it before: separate q, k, v and gate, up
 * buffers (no copies out of qkv / gate_up). */
typedef struct Timed {
    const Backend *be;
    FusedStep *s;
    void *k, *v, *up;
} Timed;

static void timed_add_rmsnorm(void *ctx) {
    const Timed *t = ctx;
    t->be->add_rmsnorm(t->be, t->s->x, t->s->xn, t->s->delta, t->s->w, t->s->n, t->s->dim, 1e-6f);
}
static void timed_add_then_rmsnorm(void *ctx) {
    const Timed *t = ctx;
    t->be->add(t->be, t->s->x, t->s->x, t->s->delta, (size_t)t->s->n * t->s->dim);
    t->be->rmsnorm(t->be, t->s->xn, t->s->x, t->s->w, t->s->n, t->s->dim, 1e-6f);
}
static void timed_qkv_rope_store(void *ctx) {
    const Timed *t = ctx;
    const FusedStep *s = t->s;
    t->be->qkv_rope_store(t->be, s->q, s->k_pool, s->v_pool, s->qkv, s->pos, s->slots, s->n, s->heads, s->kv_heads,
                          s->head_dim, s->inv_freq);
}
static void timed_rope_rope_store(void *ctx) {
    const Timed *t = ctx;
    const FusedStep *s = t->s;
    t->be->rope_i32(t->be, s->q, s->pos, s->n, s->heads, s->head_dim, s->inv_freq);
    t->be->rope_i32(t->be, t->k, s->pos, s->n, s->kv_heads, s->head_dim, s->inv_freq);
    t->be->paged_kv_store(t->be, s->k_pool, s->v_pool, t->k, t->v, s->slots, s->n, s->kv_heads * s->head_dim);
}
static void timed_swiglu_gate_up(void *ctx) {
    const Timed *t = ctx;
    t->be->swiglu_gate_up(t->be, t->s->out, t->s->gate_up, t->s->n, t->s->mlp);
}
static void timed_swiglu(void *ctx) {
    const Timed *t = ctx;
    t->be->swiglu(t->be, t->s->out, t->s->gate_up, t->up, (size_t)t->s->n * t->s->mlp);
}

static void time_fused(const Dev *d, int n, int dim, int heads, int kv_heads, int head_dim, int mlp,
                       const char *label) {
    FusedStep s = {.n = n, .dim = dim, .heads = heads, .kv_heads = kv_heads, .head_dim = head_dim, .mlp = mlp,
                   .pool_rows = n + 37, .theta = 1000000.0f};
    step_init(&s, d->be);
    step_upload(&s, d->be, 7);
    size_t kv = (size_t)n * kv_heads * head_dim;
    Timed t = {d->be, &s, d->be->alloc(d->be, kv), d->be->alloc(d->be, kv), d->be->alloc(d->be, (size_t)n * mlp)};
    d->be->zero(d->be, t.k, kv), d->be->zero(d->be, t.v, kv), d->be->zero(d->be, t.up, (size_t)n * mlp);
    void (*fused[3])(void *) = {timed_add_rmsnorm, timed_qkv_rope_store, timed_swiglu_gate_up};
    void (*unfused[3])(void *) = {timed_add_then_rmsnorm, timed_rope_rope_store, timed_swiglu};
    const char *names[3] = {"add_rmsnorm vs add + rmsnorm", "qkv_rope_store vs rope_i32 x2 + paged_kv_store",
                            "swiglu_gate_up vs swiglu"};
    for (int k = 0; k < 3; k++) {
        double ms_fused = backend_cuda_time_ms(d->be, fused[k], &t, 200);
        double ms_unfused = backend_cuda_time_ms(d->be, unfused[k], &t, 200);
        printf("time %-9s %s N=%3d %-48s %7.2f us vs %7.2f us\n", d->tag, label, n, names[k], ms_fused * 1e3,
               ms_unfused * 1e3);
    }
    d->be->free(d->be, t.k), d->be->free(d->be, t.v), d->be->free(d->be, t.up);
    step_free(&s, d->be);
}

/* ---------------------------------------------------------------- driver */

typedef struct QwenShape {
    int dim, heads, kv_heads, head_dim, mlp;
    const char *label;
} QwenShape;

static const QwenShape QWEN[3] = {{896, 14, 2, 64, 4864, "0.5B"},
                                  {1536, 12, 2, 128, 8960, "1.5B"},
                                  {3584, 28, 4, 128, 18944, "7B"}};

static void run_ops(const Dev *d) {
    printf("---- %s (storage %s) ----\n", d->tag, d->bf16 ? "bf16" : "fp32");
    const int tokens[3] = {1, 7, 128};
    for (int s = 0; s < 3; s++)
        for (int t = 0; t < 3; t++) {
            const QwenShape *q = &QWEN[s];
            test_add_rmsnorm(d, tokens[t], q->dim, 0, 0);
            test_qkv_rope_store(d, tokens[t], q->heads, q->kv_heads, q->head_dim, 1000000.0f, 0, q->label);
            test_swiglu_gate_up(d, tokens[t], q->mlp, 0);
        }
    /* The other paths of each kernel. */
    test_add_rmsnorm(d, 5, 75, 0, 0);        /* dim % 8 != 0: block-per-row norm */
    test_add_rmsnorm(d, 7, 896, 1, 0);       /* misaligned x/xn: block-per-row norm */
    test_add_rmsnorm(d, 7, 896, 1, 1);
    test_add_rmsnorm(d, 7, 1536, 0, 1);      /* vectorised norm, element loads of delta */
    test_add_rmsnorm(d, 3, 8192, 0, 0);      /* staged in shared memory at 32 KB (fp32) */
    test_add_rmsnorm(d, 3, 12288, 0, 0);     /* fp32: staged in x (48 KB); bf16: shared */
    test_add_rmsnorm(d, 2, 24576, 0, 0);     /* staged in x for both */
    test_qkv_rope_store(d, 7, 14, 2, 64, 1000000.0f, 1, "0.5B"); /* scalar kernel vs vectorised rope_i32 */
    test_qkv_rope_store(d, 9, 28, 4, 128, 1000000.0f, 1, "7B");
    test_qkv_rope_store(d, 9, 4, 2, 8, 10000.0f, 0, "Dh=8");    /* half % 8 != 0: scalar kernels */
    test_qkv_rope_store(d, 7, 6, 6, 72, 10000.0f, 0, "MHA");
    test_qkv_rope_store(d, 7, 8, 4, 48, 10000.0f, 0, "Dh=48"); /* vectorised, 3 groups per half */
    for (int s = 0; s < 3; s++) { /* decode steps: short contexts, and one long enough to split */
        const QwenShape *q = &QWEN[s];
        test_paged_attention_rope(d, 1, q->heads, q->kv_heads, q->head_dim, 200, q->label);
        test_paged_attention_rope(d, 7, q->heads, q->kv_heads, q->head_dim, 700, q->label);
        test_paged_attention_rope(d, 128, q->heads, q->kv_heads, q->head_dim, 300, q->label);
        test_paged_attention_rope(d, 2, q->heads, q->kv_heads, q->head_dim, 5000, q->label);
    }
    test_swiglu_gate_up(d, 5, 75, 0);  /* f % 8 != 0: scalar kernel */
    test_swiglu_gate_up(d, 7, 4864, 1); /* misaligned: scalar kernel vs vectorised swiglu */

    for (int s = 0; s < 3; s++) {
        const QwenShape *q = &QWEN[s];
        test_graph(d, 7, q->dim, q->heads, q->kv_heads, q->head_dim, q->mlp);
    }
    test_graph(d, 64, 75, 4, 2, 8, 75); /* the scalar kernels under capture */
}

int main(void) {
    CPU = backend_cpu();
    const Backend *f32 = backend_cuda_f32(), *bf16 = backend_cuda();
    if (!f32 || !bf16) {
        printf("no CUDA device (cudaGetDeviceCount failed or found none): skipping test_cuda_fused\n");
        return 77;
    }
    Dev devs[2] = {{f32, 0, "cuda_f32"}, {bf16, 1, "cuda_bf16"}};
    for (int k = 0; k < 2; k++) run_ops(&devs[k]);

    printf("---- speed: fused vs unfused (decode, 200 calls each) ----\n");
    for (int s = 0; s < 3; s += 2)
        for (int n = 1; n <= 256; n *= 16) {
            const QwenShape *q = &QWEN[s];
            time_fused(&devs[1], n, q->dim, q->heads, q->kv_heads, q->head_dim, q->mlp, q->label);
        }

    printf("test_cuda_fused: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
