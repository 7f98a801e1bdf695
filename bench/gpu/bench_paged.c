/* bench_paged.c — HBM bandwidth of the CUDA backend's paged decode attention
 * (`paged_attention`, the attention of one engine decode step), bf16 storage,
 * on the Qwen2.5 / Llama-8B head shapes, as a markdown table with % of the HBM
 * peak, each row in both modes: automatic splits, and the deterministic
 * (batch-invariant) mode (set_batch_invariant on: one split per token).
 *
 * One call: B sequences, one query token each, every sequence with a context of
 * C keys (position C-1: it attends to positions 0..C-1), block size 16, each
 * sequence's blocks contiguous in the pools (sequence s owns blocks
 * s*ceil(C/16) .. (s+1)*ceil(C/16)-1), random bf16 q and K/V. The K/V are
 * already in the pools: no rope, no K/V store (paged_attention_rope's fused
 * extras are not timed), only the attention reading them.
 * Bytes: the K and V the call must read, B * C * KVH * Dh * 2 bytes * 2 (K and
 * V). Left out: q and out (B * H * Dh * 2 bytes each, a share G / C of the K/V
 * with G = H / KVH: 2.7% at most here, 0.5b at C = 256), the block tables, and
 * the fp32 split partials a splitting call writes and reads back. GB/s = bytes
 * / time (1 GB = 1e9 bytes).
 *
 * Not a correctness test (tests/gpu/test_cuda_paged.c is). Timing: CUDA events
 * around `iters` back-to-back calls after one warm-up (backend_cuda_time_ms).
 * Usage: bench_paged [iters] [preset ...]  (presets 0.5b 1.5b 7b 8b; default all;
 * iters default 50)
 * COLT_BATCHES=1,16,64 / COLT_CONTEXTS=256,1024: the batch sizes B and contexts C
 * (comma lists; default B 1 16 64 128 256 x C 256 630 1024 2048 4096).
 * COLT_HBM_GBPS=N: the peak for the % column (default 4800, H200).
 * COLT_POOL_GB=N: skip (B, C) whose K+V pools exceed N GB (default 40).
 * The backend's own options apply as usual (COLT_PAGED_TC=0, COLT_PAGED_SPLITS=k,
 * COLT_INVARIANT_ONLY=linear leaves the deterministic column on automatic splits).
 * Dimension legend: B sequences (= tokens in the call), C keys per sequence, H
 * query heads, KVH key/value heads, Dh head dim. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_bench.h"

#include "bench_fill.h"
#include "bench_gpu_shapes.h"

#define BLOCK_SIZE 16
#define MAX_LIST 32

typedef struct PagedCall {
    const Backend *be;
    void *out, *q, *k_pool, *v_pool, *tables, *seq, *pos;
    int n, heads, kv_heads, head_dim, max_blocks;
} PagedCall;

static void run_paged(void *ctx) {
    PagedCall *c = ctx;
    c->be->paged_attention(c->be, c->out, c->q, c->k_pool, c->v_pool, c->tables, c->seq, c->pos, c->n, c->heads,
                           c->kv_heads, c->head_dim, BLOCK_SIZE, c->max_blocks);
}

/* A comma (or space) separated list of positive ints from the environment, else the defaults. */
static int env_list(const char *name, int *out, const int *defaults, int n_defaults) {
    const char *e = getenv(name);
    int n = 0;
    if (e) {
        char *list = strdup(e);
        for (char *tok = strtok(list, " ,"); tok && n < MAX_LIST; tok = strtok(NULL, " ,"))
            if (atoi(tok) > 0) out[n++] = atoi(tok);
        free(list);
    }
    if (n > 0) return n;
    memcpy(out, defaults, sizeof(int) * (size_t)n_defaults);
    return n_defaults;
}

static double env_double(const char *name, double fallback) {
    const char *e = getenv(name);
    return e && atof(e) > 0 ? atof(e) : fallback;
}

/* Whether s is a whole decimal integer (the iteration count, not a preset such as 0.5b). */
static int is_count(const char *s) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    return *s && !*end && errno == 0 && v > 0 && v < 1000000;
}

int main(int argc, char **argv) {
    const Backend *be = backend_cuda();
    if (!be) {
        printf("no CUDA device: nothing to benchmark\n");
        return 77;
    }
    int iters = 50, first_preset = 1;
    if (argc > 1 && is_count(argv[1])) iters = atoi(argv[1]), first_preset = 2;
    const char *want[8];
    int n_want = 0;
    for (int a = first_preset; a < argc && n_want < 8; a++) {
        if (!shape_by_name(argv[a])) {
            fprintf(stderr, "bench_paged: unknown preset '%s' (0.5b 1.5b 7b 8b)\n", argv[a]);
            return 2;
        }
        want[n_want++] = argv[a];
    }
    static const int default_batches[] = {1, 16, 64, 128, 256}, default_contexts[] = {256, 630, 1024, 2048, 4096};
    int batches[MAX_LIST], contexts[MAX_LIST];
    int n_batches = env_list("COLT_BATCHES", batches, default_batches, 5);
    int n_contexts = env_list("COLT_CONTEXTS", contexts, default_contexts, 5);
    const double peak_gbps = env_double("COLT_HBM_GBPS", 4800.0), pool_cap_gb = env_double("COLT_POOL_GB", 40.0);

    struct cudaDeviceProp prop;
    const int have_prop = cudaGetDeviceProperties(&prop, 0) == cudaSuccess;
    printf("Paged decode attention (paged_attention), bf16 storage, block size %d, cuda backend, %s (%d SMs)", BLOCK_SIZE,
           have_prop ? prop.name : "unknown device", have_prop ? prop.multiProcessorCount : 0);
    printf("\ncommand: `");
    static const char *const vars[] = {"COLT_BATCHES",       "COLT_CONTEXTS",     "COLT_HBM_GBPS",
                                       "COLT_POOL_GB",       "COLT_PAGED_TC",     "COLT_PAGED_SPLITS",
                                       "COLT_PAGED_TC_TOKENS", "COLT_INVARIANT_ONLY"};
    for (size_t k = 0; k < sizeof vars / sizeof vars[0]; k++)
        if (getenv(vars[k])) printf("%s=%s ", vars[k], getenv(vars[k]));
    for (int a = 0; a < argc; a++) printf("%s%s", a ? " " : "", argv[a]);
    printf("` (%d iterations timed with CUDA events after one warm-up)\n", iters);
    printf("K+V bytes read per call: B * C * KVH * Dh * 2 bytes * 2; auto = automatic splits, det = deterministic mode "
           "(set_batch_invariant: one split)\n\n");
    printf("| model | H/KVH/Dh | B x C | K+V MB | auto us | auto GB/s | auto %% of %.0f | det us | det GB/s | det %% | "
           "det / auto time |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
           peak_gbps);
    fflush(stdout);

    void *chunk = bench_random_chunk(be, 11, 1.0f);

    for (size_t si = 0; si < sizeof SHAPES / sizeof SHAPES[0]; si++) {
        const Shape *s = &SHAPES[si];
        int selected = n_want == 0;
        for (int w = 0; w < n_want; w++) selected |= strcmp(want[w], s->name) == 0;
        if (!selected) continue;
        const int H = s->heads, KVH = s->kv_heads, Dh = s->hidden / s->heads, kv_dim = KVH * Dh;
        for (int bi = 0; bi < n_batches; bi++) {
            for (int ci = 0; ci < n_contexts; ci++) {
                const int B = batches[bi], C = contexts[ci];
                const int max_blocks = (C + BLOCK_SIZE - 1) / BLOCK_SIZE;
                const size_t rows = (size_t)B * max_blocks * BLOCK_SIZE, pool_elems = rows * kv_dim;
                const double pool_gb = 2.0 * (double)pool_elems * 2.0 / 1e9; /* K and V pools, bf16 */
                if (pool_gb > pool_cap_gb) {
                    printf("| %s | %d/%d/%d | %d x %d | skipped: pools %.3g GB > %g GB (COLT_POOL_GB) |\n", s->name, H,
                           KVH, Dh, B, C, pool_gb, pool_cap_gb);
                    continue;
                }
                const size_t nq = (size_t)B * H * Dh;
                PagedCall c = {.be = be, .n = B, .heads = H, .kv_heads = KVH, .head_dim = Dh, .max_blocks = max_blocks};
                c.q = be->alloc(be, nq), c.out = be->alloc(be, nq);
                c.k_pool = be->alloc(be, pool_elems), c.v_pool = be->alloc(be, pool_elems);
                bench_fill(be, c.q, nq, chunk);
                bench_fill(be, c.k_pool, pool_elems, chunk), bench_fill(be, c.v_pool, pool_elems, chunk);
                int *tables = malloc(sizeof(int) * (size_t)B * max_blocks), *seq = malloc(sizeof(int) * (size_t)B),
                    *pos = malloc(sizeof(int) * (size_t)B);
                for (int i = 0; i < B * max_blocks; i++) tables[i] = i; /* sequence s: blocks s*max_blocks + k */
                for (int i = 0; i < B; i++) seq[i] = i, pos[i] = C - 1;
                c.tables = be->alloc_i32(be, (size_t)B * max_blocks);
                c.seq = be->alloc_i32(be, (size_t)B), c.pos = be->alloc_i32(be, (size_t)B);
                be->upload_i32(be, c.tables, tables, (size_t)B * max_blocks);
                be->upload_i32(be, c.seq, seq, (size_t)B), be->upload_i32(be, c.pos, pos, (size_t)B);

                be->set_batch_invariant(be, 0);
                const double auto_ms = backend_cuda_time_ms(be, run_paged, &c, iters);
                be->set_batch_invariant(be, 1);
                const double det_ms = backend_cuda_time_ms(be, run_paged, &c, iters);
                be->set_batch_invariant(be, 0);

                const double bytes = (double)B * C * KVH * Dh * 2.0 * 2.0;
                const double auto_gbps = bytes / (auto_ms * 1e-3) / 1e9, det_gbps = bytes / (det_ms * 1e-3) / 1e9;
                printf("| %s | %d/%d/%d | %d x %d | %.1f | %.1f | %.0f | %.1f%% | %.1f | %.0f | %.1f%% | %.2f |\n",
                       s->name, H, KVH, Dh, B, C, bytes / 1e6, auto_ms * 1e3, auto_gbps, 100.0 * auto_gbps / peak_gbps,
                       det_ms * 1e3, det_gbps, 100.0 * det_gbps / peak_gbps, det_ms / auto_ms);
                fflush(stdout);
                free(tables), free(seq), free(pos);
                be->free(be, c.q), be->free(be, c.out), be->free(be, c.k_pool), be->free(be, c.v_pool);
                be->free(be, c.tables), be->free(be, c.seq), be->free(be, c.pos);
            }
        }
    }
    be->free(be, chunk);
    return 0;
}
