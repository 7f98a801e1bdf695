/* test_cuda_decode_layers.c — the all-layers decode kernel (backend.h decode_layers) on the GPU
 * (GPU machine only):
 *   - one decode step of up to 4 sequences (contexts of 1 to 700 tokens, shuffled block tables, a
 *     padding row) through model_forward_paged with the kernel, with the op sequence, and on the CPU
 *     backend with the same bf16 weights: the kernel's logits are as close to the CPU's as the op
 *     sequence's are (its sums run in another order; a wrong index or a missed store would put it
 *     far outside), and the K/V it stores are those the ops store;
 *   - the engine with it: every decode step of <= 4 sequences takes it; CUDA graphs and eager
 *     steps give bit-identical completions and log-probs; the engine's log-probs agree with the
 *     trainer's as well as with the op sequence.
 * Models: random Qwen2-shaped bf16 checkpoints with head_dim 64 and 128, GQA groups 2, 4 and 7.
 * Exit 77 when no GPU. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/rng.h"
#include "engine/engine.h"
#include "model/model.h"
#include "model/model_train.h"

#include "../engine_requests.h"
#include "backend/cuda/cuda_instance.h"
#include "../harness.h"

/* cuda_decode_layers.cu, on an instance: calls of up to `tokens` tokens take the kernel (-1: as opened);
 * its launches so far. */
void cuda_decode_layers_set_tokens(const Backend *be, int tokens);
long cuda_decode_layers_calls(const Backend *be);

typedef struct Case {
    const char *name;
    ModelConfig cfg;
} Case;

static ModelConfig config(ModelArch arch, int D, int F, int L, int H, int KVH, int Dh, int V, bool bias) {
    return (ModelConfig){.arch = arch, .hidden_size = D, .intermediate_size = F, .num_hidden_layers = L,
                         .num_attention_heads = H, .num_key_value_heads = KVH, .head_dim = Dh, .vocab_size = V,
                         .max_position_embeddings = 4096, .rms_norm_eps = 1e-6f, .rope_theta = 1e6f,
                         .tie_word_embeddings = arch == ARCH_QWEN2, .attention_bias = bias, .bos_token_id = -1,
                         .torch_dtype = DTYPE_BF16};
}

#define BLOCK 16
#define DL_TEST_TOKENS 4 /* every token count the kernel is compiled for (the default takes 1-2) */
#define MAX_SEQS 4

static void *upload(const Backend *be, const int *src, size_t n) {
    void *buf = be->alloc_i32(be, n);
    be->upload_i32(be, buf, src, n);
    return buf;
}

/* Logits [n, V] of one decode step (token lens[i] - 1 of each sequence, the others prefilled first
 * by the op sequence), with the decode kernel when `plan` is set. The pool is created here and its
 * K/V rows of the step's tokens are returned in kv_out [n, 2, KVD] (fp32). */
typedef struct StepResult {
    float *logits, *kv;
} StepResult;

static int run_step(Model *m, const int *lens, const int *seq_ids, int n, bool use_plan, StepResult *res,
                    long *kernel_calls) {
    const ModelConfig *c = model_config(m);
    const Backend *be = model_backend(m);
    int max_len = 0;
    for (int i = 0; i < n; i++)
        if (lens[i] > max_len) max_len = lens[i];
    int max_blocks = (max_len + BLOCK - 1) / BLOCK, n_blocks = MAX_SEQS * max_blocks + 3;
    KvPool pool;
    kv_pool_create(&pool, m, n_blocks, BLOCK);
    /* Block tables: a fixed shuffle of the pool, so rows are never in order. */
    int *tables = calloc((size_t)MAX_SEQS * max_blocks, sizeof(int)), *perm = malloc(sizeof(int) * n_blocks);
    for (int b = 0; b < n_blocks; b++) perm[b] = b;
    for (int b = n_blocks - 1; b > 0; b--) {
        int j = (int)(rng_uniform(5, 0, (uint64_t)b) * (b + 1));
        int t = perm[b];
        perm[b] = perm[j], perm[j] = t;
    }
    for (int k = 0; k < MAX_SEQS * max_blocks; k++) tables[k] = perm[k];
    void *d_tables = upload(be, tables, (size_t)MAX_SEQS * max_blocks);
    char err[ERR_LEN];
    PagedState *st = NULL;
    if (paged_state_create(&st, m, 1024, MAX_SEQS, err) != 0) {
        CHECK(0, "paged_state_create: %s", err);
        return -1;
    }
    int KVD = c->num_key_value_heads * c->head_dim;
    /* Prefill, one sequence at a time, in chunks of up to 1024 tokens. */
    for (int i = 0; i < n; i++) {
        if (seq_ids[i] < 0) continue;
        for (int p0 = 0; p0 < lens[i] - 1; p0 += 1024) {
            int cnt = lens[i] - 1 - p0 < 1024 ? lens[i] - 1 - p0 : 1024;
            int *tok = malloc(sizeof(int) * cnt), *pos = malloc(sizeof(int) * cnt), *seq = malloc(sizeof(int) * cnt),
                *slot = malloc(sizeof(int) * cnt);
            for (int k = 0; k < cnt; k++) {
                int p = p0 + k;
                tok[k] = (int)(rng_uniform(11, (uint64_t)seq_ids[i], (uint64_t)p) * c->vocab_size);
                pos[k] = p, seq[k] = seq_ids[i];
                slot[k] = tables[seq_ids[i] * max_blocks + p / BLOCK] * BLOCK + p % BLOCK;
            }
            void *dt = upload(be, tok, cnt), *dp = upload(be, pos, cnt), *ds = upload(be, seq, cnt),
                 *dm = upload(be, slot, cnt);
            PagedBatch b = {.n = cnt, .n_logits = 0, .tokens = dt, .pos = dp, .seq = ds, .slot_mapping = dm,
                            .block_tables = d_tables, .max_blocks = max_blocks};
            char fwd_err[ERR_LEN];
            CHECK(model_forward_paged(m, st, &pool, &b, fwd_err) == 0, "prefill: %s", fwd_err);
            be->free(be, dt), be->free(be, dp), be->free(be, ds), be->free(be, dm);
            free(tok), free(pos), free(seq), free(slot);
        }
    }
    /* The decode step. */
    int tok[MAX_SEQS], pos[MAX_SEQS], seq[MAX_SEQS], slot[MAX_SEQS];
    for (int i = 0; i < n; i++) {
        int p = lens[i] - 1;
        bool pad = seq_ids[i] < 0;
        tok[i] = pad ? 0 : (int)(rng_uniform(11, (uint64_t)seq_ids[i], (uint64_t)p) * c->vocab_size);
        pos[i] = pad ? 0 : p;
        seq[i] = seq_ids[i];
        slot[i] = pad ? -1 : tables[seq_ids[i] * max_blocks + p / BLOCK] * BLOCK + p % BLOCK;
    }
    void *dt = upload(be, tok, n), *dp = upload(be, pos, n), *ds = upload(be, seq, n), *dm = upload(be, slot, n);
    void *plan = use_plan ? model_decode_plan_create(m, &pool, max_blocks) : NULL;
    long before = kernel_calls ? cuda_decode_layers_calls(be) : 0;
    PagedBatch b = {.n = n, .n_logits = n, .tokens = dt, .pos = dp, .seq = ds, .slot_mapping = dm,
                    .block_tables = d_tables, .max_blocks = max_blocks, .decode_plan = plan};
    char fwd_err[ERR_LEN];
    CHECK(model_forward_paged(m, st, &pool, &b, fwd_err) == 0, "decode step: %s", fwd_err);
    if (kernel_calls) *kernel_calls = cuda_decode_layers_calls(be) - before;
    size_t V = (size_t)c->vocab_size;
    res->logits = malloc(sizeof(float) * n * V);
    be->download(be, res->logits, paged_state_logits(st), (size_t)n * V);
    /* The step's K/V rows of layer 0 and of the last layer. */
    res->kv = calloc((size_t)n * 4 * KVD, sizeof(float));
    float *row = malloc(sizeof(float) * (size_t)n_blocks * BLOCK * KVD);
    for (int which = 0; which < 4; which++) {
        int layer = which < 2 ? 0 : c->num_hidden_layers - 1;
        be->download(be, row, which % 2 ? pool.v[layer] : pool.k[layer], (size_t)n_blocks * BLOCK * KVD);
        for (int i = 0; i < n; i++)
            if (slot[i] >= 0) memcpy(res->kv + ((size_t)i * 4 + which) * KVD, row + (size_t)slot[i] * KVD, sizeof(float) * KVD);
    }
    free(row);
    model_decode_plan_free(m, plan);
    be->free(be, dt), be->free(be, dp), be->free(be, ds), be->free(be, dm), be->free(be, d_tables);
    paged_state_free(st);
    kv_pool_free(&pool);
    free(tables), free(perm);
    return 0;
}

/* Max |a - b| over the rows of real (non-padding) tokens, and max |b|. */
static double max_diff(const float *a, const float *b, const int *seq_ids, int n, size_t row, double *scale) {
    double d = 0, s = 0;
    for (int i = 0; i < n; i++) {
        if (seq_ids[i] < 0) continue;
        for (size_t k = 0; k < row; k++) {
            double e = fabs((double)a[i * row + k] - b[i * row + k]);
            if (e > d) d = e;
            if (fabs(b[i * row + k]) > s) s = fabs(b[i * row + k]);
        }
    }
    if (scale) *scale = s;
    return d;
}

static void step_cases(const Case *cs, Model *gpu, Model *cpu) {
    static const struct {
        int n, lens[MAX_SEQS], seqs[MAX_SEQS];
    } steps[] = {
        {1, {1}, {0}},
        {1, {700}, {0}},
        {2, {37, 260}, {1, 0}},
        {3, {5, 129, 64}, {2, 0, 1}},
        {4, {300, 17, 1, 90}, {0, -1, 3, 1}}, /* row 1 is padding */
    };
    const ModelConfig *c = model_config(gpu);
    size_t V = (size_t)c->vocab_size, KVD = (size_t)c->num_key_value_heads * c->head_dim;
    for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
        int n = steps[k].n;
        StepResult mega = {0}, ops = {0}, ref = {0};
        long calls = 0;
        if (run_step(gpu, steps[k].lens, steps[k].seqs, n, true, &mega, &calls) != 0 ||
            run_step(gpu, steps[k].lens, steps[k].seqs, n, false, &ops, NULL) != 0 ||
            run_step(cpu, steps[k].lens, steps[k].seqs, n, false, &ref, NULL) != 0)
            return;
        double scale, kv_scale;
        double e_mega = max_diff(mega.logits, ref.logits, steps[k].seqs, n, V, &scale);
        double e_ops = max_diff(ops.logits, ref.logits, steps[k].seqs, n, V, NULL);
        double kv_mega = max_diff(mega.kv, ref.kv, steps[k].seqs, n, 4 * KVD, &kv_scale);
        double kv_ops = max_diff(ops.kv, ref.kv, steps[k].seqs, n, 4 * KVD, NULL);
        printf("  %-26s step %zu (%d seqs, longest %4d): logits vs cpu: kernel %.2e, ops %.2e (max |logit| %.2f); "
               "K/V: kernel %.2e, ops %.2e\n",
               cs->name, k, n, steps[k].lens[0] > steps[k].lens[n - 1] ? steps[k].lens[0] : steps[k].lens[n - 1],
               e_mega, e_ops, scale, kv_mega, kv_ops);
        CHECK(calls == 1, "%s step %zu: the decode kernel ran %ld times (want 1)", cs->name, k, calls);
        /* bf16 rounding of a differently ordered sum: as far from the fp32 CPU as the ops, give or take
         * one rounding of the largest logit. */
        CHECK(e_mega <= 1.5 * e_ops + scale * 0x1p-8, "%s step %zu: logits %.3g from the CPU (ops: %.3g)", cs->name,
              k, e_mega, e_ops);
        CHECK(kv_mega <= 1.5 * kv_ops + kv_scale * 0x1p-8, "%s step %zu: K/V %.3g from the CPU (ops: %.3g)",
              cs->name, k, kv_mega, kv_ops);
        /* The weight stream (shared-memory ring) and direct loads: only where the weights wait differs,
         * so the bits are the same, whichever the plan picked by timing. */
        StepResult direct = {0}, ring = {0}, deep = {0};
        CudaOptions *opt = backend_cuda_options(model_backend(gpu)); /* decode_ring: COLT_DECODE_RING */
        const int ring_opened = opt->decode_ring;
        opt->decode_ring = 0;
        int rc = run_step(gpu, steps[k].lens, steps[k].seqs, n, true, &direct, NULL);
        opt->decode_ring = 2;
        rc |= run_step(gpu, steps[k].lens, steps[k].seqs, n, true, &ring, NULL);
        opt->decode_ring = 4; /* the most rounds the plan fits in shared memory (3 or fewer) */
        rc |= run_step(gpu, steps[k].lens, steps[k].seqs, n, true, &deep, NULL);
        opt->decode_ring = ring_opened;
        if (rc == 0) {
            CHECK(!memcmp(direct.logits, ring.logits, sizeof(float) * n * V) &&
                      !memcmp(direct.kv, ring.kv, sizeof(float) * n * 4 * KVD) &&
                      !memcmp(direct.logits, deep.logits, sizeof(float) * n * V),
                  "%s step %zu: the ring (2 or the most rounds) and direct loads differ", cs->name, k);
            CHECK(!memcmp(direct.logits, mega.logits, sizeof(float) * n * V), "%s step %zu: direct loads differ from the plan's pick",
                  cs->name, k);
        }
        free(direct.logits), free(direct.kv), free(ring.logits), free(ring.kv), free(deep.logits), free(deep.kv);
        free(mega.logits), free(mega.kv), free(ops.logits), free(ops.kv), free(ref.logits), free(ref.kv);
    }
}

#define NEW_TOKENS 24

static int generate_requests(Model *m, Requests *r, const SamplingParams *sp, const EngineOptions *eo, EngineStats *st) {
    char err[ERR_LEN];
    make_requests(r, model_config(m)->vocab_size);
    GenerateOptions opt = {.sampling = *sp, .max_new_tokens = NEW_TOKENS, .ignore_eos = true};
    if (engine_generate(m, r->seqs, N_SEQS, &opt, eo, st, err) != 0) {
        CHECK(0, "engine_generate: %s", err);
        return -1;
    }
    return 0;
}

static void engine_cases(const Case *cs, Model *gpu) {
    char err[ERR_LEN];
    SamplingParams sampled = {.temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.0f, .seed = 7};
    for (int running = 1; running <= 4; running *= 2) {
        EngineOptions graphs = {.max_num_seqs = running}, eager = {.max_num_seqs = running, .enforce_eager = true};
        Requests a, b, o;
        EngineStats st;
        const Backend *be = model_backend(gpu);
        long before = cuda_decode_layers_calls(be);
        if (generate_requests(gpu, &a, &sampled, &graphs, &st) != 0) return;
        long calls = cuda_decode_layers_calls(be) - before; /* graph replays launch without a host call */
        before = cuda_decode_layers_calls(be);
        if (generate_requests(gpu, &b, &sampled, &eager, NULL) != 0) return;
        long calls_eager = cuda_decode_layers_calls(be) - before;
        cuda_decode_layers_set_tokens(be, 0);
        if (generate_requests(gpu, &o, &sampled, &graphs, NULL) != 0) return;
        cuda_decode_layers_set_tokens(be, DL_TEST_TOKENS);
        int same = bit_identical(&a, &b);
        double mean_k, max_k, mean_o, max_o;
        int differ;
        CHECK(trainer_logprob_diff(gpu, &a, 1.0f, &mean_k, &max_k, &differ, err) == 0, "trainer: %s", err);
        CHECK(trainer_logprob_diff(gpu, &o, 1.0f, &mean_o, &max_o, &differ, err) == 0, "trainer: %s", err);
        printf("  %-26s %d running: kernel launches %ld with graphs (graph steps %d of %d), %ld eager; graphs vs "
               "eager %2d/%d bit-identical; engine vs trainer log-probs: kernel mean %.2e max %.2e, ops mean %.2e "
               "max %.2e\n",
               cs->name, running, calls, st.graph_steps, st.steps, calls_eager, same, N_SEQS, mean_k, max_k, mean_o,
               max_o);
        CHECK(calls > 0 && st.graph_steps > 0, "%s: %ld decode kernel launches with graphs", cs->name, calls);
        CHECK(calls_eager >= NEW_TOKENS - 1, "%s: %ld decode kernel launches in eager mode", cs->name, calls_eager);
        CHECK(same == N_SEQS, "%s, %d running: graphs vs eager %d/%d bit-identical", cs->name, running, same, N_SEQS);
        CHECK(mean_k <= 1.5 * mean_o + 1e-4, "%s, %d running: engine vs trainer mean %.3g (ops %.3g)", cs->name,
              running, mean_k, mean_o);
        free_requests(&a), free_requests(&b), free_requests(&o);
    }
}

int main(void) {
    setvbuf(stdout, NULL, _IOLBF, 0); /* progress survives a timeout */
    const Backend *be = backend_cuda();
    if (!be) {
        printf("test_cuda_decode_layers: no GPU\n");
        return 77;
    }
    cuda_decode_layers_set_tokens(be, DL_TEST_TOKENS);
    const Case cases[] = {
        {"qwen2 D256 Dh64 GQA 2", config(ARCH_QWEN2, 256, 704, 3, 4, 2, 64, 1000, true)},
        {"llama D512 Dh128 GQA 4", config(ARCH_LLAMA, 512, 1024, 2, 4, 1, 128, 777, false)},
        {"qwen2.5-0.5b dims, 2 layers", config(ARCH_QWEN2, 896, 4864, 2, 14, 2, 64, 2048, true)},
    };
    char err[ERR_LEN], dir[] = "/tmp/colt_test_decode_layers_XXXXXX";
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp failed");
        return 1;
    }
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        Model *gpu = NULL, *cpu = NULL;
        /* The CPU model holds the GPU model's bf16 weights exactly: saved in bf16, loaded back. */
        if (model_create_random(&gpu, &cases[k].cfg, 42 + k, be, err) != 0 || model_save(gpu, dir, DTYPE_BF16, err) != 0 ||
            model_load(&cpu, dir, backend_cpu(), err) != 0) {
            CHECK(0, "%s: %s", cases[k].name, err);
            continue;
        }
        printf("%s\n", cases[k].name);
        step_cases(&cases[k], gpu, cpu);
        engine_cases(&cases[k], gpu);
        model_free(gpu);
        model_free(cpu);
    }
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    printf("test_cuda_decode_layers: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
