/* test_tp.c — tensor parallelism on CPU ranks: a model cut into 2 or 4 parts
 * (model_create_random_tp) against the whole model on every rank, for Qwen2
 * (tied embeddings, q/k/v biases, GQA), Llama (untied, MHA) and Qwen3 (q/k
 * norms) shapes:
 *   - model_forward logits (prefill then a decode step);
 *   - model_train_forward log-probs and entropies, and model_train_backward's
 *     gradients (this rank's part of the whole model's), with and without
 *     activation recompute;
 *   - the engine's greedy and sampled completions (tokens and log-probs), the
 *     same on every rank of the group;
 * each within the float rounding the changed summation order gives (tolerances
 * below). Run as is, it starts itself under mpirun -np 2 (TP 2), -np 4 (TP 4)
 * and -np 4 (TP 2 x DP 2), after checking the bad-input errors in-process.
 * Skips (exit 77) when mpirun is not installed. On a GPU machine:
 * `mpirun -np 2 test_tp 2 cuda-f32` runs the same checks on the CUDA backend
 * (fp32 table), `mpirun -np 2 test_tp 2 cuda-1.5b` on a Qwen2.5-1.5B layer
 * shape in bf16 (4 layers), printing the differences; a device name ending
 * in -nccl puts local rank r on GPU r with the collectives over NCCL. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "dist/launch_env.h"
#include "parallel/tp_group.h"
#include "engine/engine.h"
#include "engine/generate.h"
#include "engine_requests.h"
#include "harness.h"
#include "core/rng.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/model_train.h"
#include "model/safetensors.h"

static const char *MPIRUN = "mpirun --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1 -x " NO_LEAK_CHECK;
/* In sanitizer builds, for the single-process runs: Open MPI keeps what MPI_Init allocates until
 * exit. Multi-rank runs go without leak checking (NO_LEAK_CHECK, harness.h). */
#define LSAN_OPTIONS_VALUE "suppressions=" COLT_SOURCE_DIR "/tests/lsan_openmpi.supp:fast_unwind_on_malloc=0"

/* Tolerances: fp32 (the parts' sums are added in another order); a bf16
 * run (cuda-1.5b) rounds each part's output to bf16 before the sum, so its
 * bounds only catch a wrong cut (which gives differences of order 1) and the
 * numbers it prints are the measurement. */
static double TOL_LOGITS = 2e-5;  /* absolute, logits of magnitude ~1 */
static double TOL_LOGPROB = 2e-5; /* absolute, log-probs and entropies */
static double TOL_GRAD = 1e-4;    /* relative to the tensor's largest |gradient| */
static bool ENGINE_EXACT = true;  /* completions token-identical to the whole model's */

static ModelConfig shape(ModelArch arch, bool tied, int heads, int kv_heads) {
    ModelConfig c = {.arch = arch, .hidden_size = 64, .intermediate_size = 96, .num_hidden_layers = 2,
                     .num_attention_heads = heads, .num_key_value_heads = kv_heads, .head_dim = 8, .vocab_size = 128,
                     .max_position_embeddings = 256, .rms_norm_eps = 1e-6f, .rope_theta = 10000.0f,
                     .tie_word_embeddings = tied, .bos_token_id = -1, .torch_dtype = DTYPE_F32};
    return c;
}

static double max_abs_diff(const float *a, const float *b, size_t n) {
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) worst = fmax(worst, fabs((double)a[i] - (double)b[i]));
    return worst;
}

/* ---------------------------------------------------------------- one rank */

static void check_forward(Model *whole, Model *part, const char *what) {
    char err[ERR_LEN];
    int V = model_config(whole)->vocab_size;
    ModelState *sw = NULL, *sp = NULL;
    CHECK(model_state_create(&sw, whole, 2, 16, 16, err) == 0 && model_state_create(&sp, part, 2, 16, 16, err) == 0,
          "%s: state: %s", what, err);
    if (!sw || !sp) return;
    /* two prompts (5 and 3 tokens), then a decode step of each */
    int tokens[8] = {3, 77, 12, 127, 64, 5, 99, 0}, slot[8] = {0, 0, 0, 0, 0, 1, 1, 1}, pos[8] = {0, 1, 2, 3, 4, 0, 1, 2};
    int step_tok[2] = {41, 100}, step_slot[2] = {0, 1}, step_pos[2] = {5, 3};
    float *lw = malloc(sizeof(float) * 8 * V), *lp = malloc(sizeof(float) * 8 * V);
    CHECK(model_forward(whole, sw, tokens, slot, pos, 8, NULL, lw, err) == 0, "%s: %s", what, err);
    CHECK(model_forward(part, sp, tokens, slot, pos, 8, NULL, lp, err) == 0, "%s: %s", what, err);
    double prefill = max_abs_diff(lw, lp, (size_t)8 * V);
    CHECK(model_forward(whole, sw, step_tok, step_slot, step_pos, 2, NULL, lw, err) == 0, "%s: %s", what, err);
    CHECK(model_forward(part, sp, step_tok, step_slot, step_pos, 2, NULL, lp, err) == 0, "%s: %s", what, err);
    double decode = max_abs_diff(lw, lp, (size_t)2 * V);
    CHECK(prefill <= TOL_LOGITS && decode <= TOL_LOGITS, "%s: logits differ by %.3g (prefill) %.3g (decode)", what,
          prefill, decode);
    printf("  %-34s model_forward logits: max |diff| %.2g prefill, %.2g decode\n", what, prefill, decode);
    free(lw);
    free(lp);
    model_state_free(sw);
    model_state_free(sp);
}

/* The rows of a tensor tensor parallelism cuts by columns (o_proj / down_proj
 * and their adapters' lora_A: their inputs), 0 for the others. */
static int column_cut_rows(const char *name, int hidden, int lora_r) {
    if (strstr(name, "o_proj.weight") || strstr(name, "down_proj.weight")) return hidden;
    if (strstr(name, "o_proj.lora_A") || strstr(name, "down_proj.lora_A")) return lora_r;
    return 0;
}

/* This rank's part of the whole model's parameter (or gradient) `name` (the
 * parts are cut as model.c and lora.c cut them: the inputs of o_proj /
 * down_proj by columns, other cut tensors by rows — k/v projections and
 * their lora_B with fewer KV heads than ranks in blocks of rows that several
 * consecutive ranks hold; whole when as large). */
static void part_of(const float *whole, size_t whole_n, float *out, size_t part_n, const char *name, int rank,
                    int size, int hidden, int lora_r) {
    if (whole_n == part_n) {
        memcpy(out, whole, part_n * sizeof(float));
        return;
    }
    int rows = column_cut_rows(name, hidden, lora_r);
    if (rows > 0) {
        size_t cols = part_n / (size_t)rows;
        for (int r = 0; r < rows; r++)
            memcpy(out + (size_t)r * cols, whole + (size_t)r * cols * size + (size_t)rank * cols, cols * sizeof(float));
        return;
    }
    int blocks = (int)(whole_n / part_n), copies = size / blocks;
    memcpy(out, whole + (size_t)(rank / copies) * part_n, part_n * sizeof(float));
}

/* passes: forward + backward calls accumulated into one set of gradients
 * (the second with other dlogprobs), so a sum over the group that took what
 * earlier passes left would show. */
static void check_training(Model *whole, Model *part, bool recompute, int passes, const char *what) {
    char err[ERR_LEN];
    const ModelConfig *c = model_config(whole);
    enum { N = 11 };
    int tokens[N] = {3, 77, 12, 127, 64, 9, 5, 99, 0, 31, 126}, slot[N] = {0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1};
    int pos[N] = {0, 1, 2, 3, 4, 5, 0, 1, 2, 3, 4}, targets[N] = {-1, -1, 12, 127, 64, 9, -1, 99, 0, 31, 126};
    TrainState *tw = NULL, *tp = NULL;
    CHECK(train_state_create_recompute(&tw, whole, 2, 8, N, recompute, err) == 0 &&
              train_state_create_recompute(&tp, part, 2, 8, N, recompute, err) == 0,
          "%s: %s", what, err);
    ModelGrads *gw = NULL, *gp = NULL;
    CHECK(model_grads_create(&gw, whole, err) == 0 && model_grads_create(&gp, part, err) == 0, "%s: %s", what, err);
    if (!tw || !tp || !gw || !gp) return;
    float lpw[N], lpp[N], enw[N], enp[N];
    double dlp = 0.0, den = 0.0;
    for (int pass = 0; pass < passes; pass++) {
        CHECK(model_train_forward(whole, tw, tokens, slot, pos, targets, N, 0.7f, lpw, enw, err) == 0, "%s: %s", what,
              err);
        CHECK(model_train_forward(part, tp, tokens, slot, pos, targets, N, 0.7f, lpp, enp, err) == 0, "%s: %s", what,
              err);
        dlp = fmax(dlp, max_abs_diff(lpw, lpp, N)), den = fmax(den, max_abs_diff(enw, enp, N));
        float dl[N];
        for (int i = 0; i < N; i++)
            dl[i] = targets[i] < 0 ? 0.0f : (i == 4 ? 0.0f : 0.1f * (float)((i + 2 * pass) % 5) - 0.2f);
        CHECK(model_train_backward(whole, tw, dl, gw, err) == 0, "%s: %s", what, err);
        CHECK(model_train_backward(part, tp, dl, gp, err) == 0, "%s: %s", what, err);
    }
    CHECK(dlp <= TOL_LOGPROB && den <= TOL_LOGPROB, "%s: log-probs differ by %.3g, entropies by %.3g", what, dlp, den);
    /* the global norm: every part's, a tensor every rank holds whole counted once */
    double sq_whole = 0.0, sq_part = 0.0;
    CHECK(model_grads_sum_squares(whole, gw, &sq_whole, err) == 0 &&
              model_grads_sum_squares(part, gp, &sq_part, err) == 0,
          "%s: %s", what, err);
    double dnorm = fabs(sqrt(sq_part) - sqrt(sq_whole)) / fmax(sqrt(sq_whole), 1e-30);
    CHECK(sq_whole > 0.0 && dnorm <= TOL_GRAD, "%s: gradient norm %.9g, the whole model's %.9g", what, sqrt(sq_part),
          sqrt(sq_whole));
    const LoraConfig *lora = model_lora_config(part);
    double worst = 0.0;
    const char *worst_name = "";
    const Backend *be = model_backend(whole);
    for (int i = 0; i < model_param_count(part); i++) {
        ModelParam pw = model_param(whole, i), pp = model_param(part, i);
        CHECK(!strcmp(pw.name, pp.name), "%s: parameter %d is %s in the part, %s in the whole", what, i, pp.name, pw.name);
        float *a = malloc(pw.numel * sizeof(float)), *cut = malloc(pp.numel * sizeof(float)),
              *b = malloc(pp.numel * sizeof(float));
        be->download_f32(be, a, model_grad(gw, i), pw.numel);
        be->download_f32(be, b, model_grad(gp, i), pp.numel);
        part_of(a, pw.numel, cut, pp.numel, pw.name, model_tensor_parallel_rank(part), model_tensor_parallel_size(part), c->hidden_size,
                lora ? lora->r : 0);
        double scale = 1e-30;
        for (size_t k = 0; k < pp.numel; k++) scale = fmax(scale, fabs(cut[k]));
        double rel = max_abs_diff(cut, b, pp.numel) / scale;
        if (rel > worst) worst = rel, worst_name = pw.name;
        free(a);
        free(cut);
        free(b);
    }
    CHECK(worst <= TOL_GRAD, "%s: gradient of %s differs by %.3g of its largest", what, worst_name, worst);
    printf("  %-34s train log-probs %.2g, entropies %.2g, %d gradients %.2g (relative; %s), norm %.2g%s%s\n", what, dlp,
           den, model_param_count(part), worst, worst_name, dnorm, recompute ? " [recompute]" : "",
           passes > 1 ? " [2 passes]" : "");
    model_grads_free(gw);
    model_grads_free(gp);
    train_state_free(tw);
    train_state_free(tp);
}

/* Generation: the part's tokens equal the whole's, and every rank of the
 * group has the same ones (the hooks' group compares them). */
static void check_engine(Model *whole, Model *part, TpGroup *g, const char *what) {
    char err[ERR_LEN];
    SamplingParams greedy = sampling_params_greedy();
    SamplingParams sampled = {.temperature = 0.9f, .top_k = 40, .top_p = 0.95f, .repetition_penalty = 1.2f, .seed = 5};
    const SamplingParams *params[2] = {&greedy, &sampled};
    for (int p = 0; p < 2; p++) {
        GenerateOptions opt = {.sampling = *params[p], .max_new_tokens = 12, .ignore_eos = true};
        Requests a, b;
        make_requests(&a, model_config(whole)->vocab_size);
        make_requests(&b, model_config(whole)->vocab_size);
        CHECK(engine_generate(whole, a.seqs, N_SEQS, &opt, NULL, NULL, err) == 0, "%s: %s", what, err);
        CHECK(engine_generate(part, b.seqs, N_SEQS, &opt, NULL, NULL, err) == 0, "%s: %s", what, err);
        int same = 0;
        double worst = 0.0;
        uint64_t sum = 0; /* a hash of the completions */
        for (int i = 0; i < N_SEQS; i++) {
            const GenSequence *x = &a.seqs[i], *y = &b.seqs[i];
            bool eq = x->n_tokens == y->n_tokens && !memcmp(x->tokens, y->tokens, sizeof(int) * (size_t)x->n_tokens);
            same += eq;
            if (eq) worst = fmax(worst, max_abs_diff(x->logprobs, y->logprobs, (size_t)x->n_tokens));
            for (int k = 0; k < y->n_tokens; k++) sum = sum * 31 + (uint64_t)y->tokens[k];
        }
        CHECK(same == N_SEQS || !ENGINE_EXACT, "%s, %s: %d/%d sequences equal the whole model's", what,
              p ? "sampled" : "greedy", same, N_SEQS);
        CHECK(worst <= TOL_LOGPROB, "%s: sampled tokens' log-probs differ by %.3g", what, worst);
        /* the same completions on every rank of the group */
        double mine = (double)(sum & 0xffffffffffff), *all = calloc((size_t)g->tensor_parallel_size, sizeof(double));
        CHECK(comm_all_gather(g->tp, all, &mine, 1, COMM_FLOAT64, NULL, err) == 0, "%s: %s", what, err);
        for (int r = 1; r < g->tensor_parallel_size; r++) CHECK(all[r] == all[0], "%s: rank %d of the group generated others", what, r);
        free(all);
        printf("  %-34s engine %s: %d/%d sequences equal, log-probs %.2g\n", what, p ? "sampled" : "greedy", same,
               N_SEQS, worst);
        free_requests(&a);
        free_requests(&b);
    }
}

/* Saving: the group's parts gathered into one Hugging Face folder (written
 * by the group's rank 0) hold exactly the whole model's tensors. */
static void check_save(Model *whole, Model *part, const TpGroup *g, int shape_index, const char *what) {
    char err[ERR_LEN], dir[256];
    /* one folder per group: the ranks of a launch share mpirun's pid */
    snprintf(dir, sizeof dir, "/tmp/colt_test_tp_%d_%d_%d", (int)getppid(), g->data_parallel_rank, shape_index);
    CHECK(model_save(part, dir, DTYPE_F32, err) == 0, "%s: save: %s", what, err);
    if (g->tensor_parallel_rank != 0) return;
    Model *back = NULL;
    CHECK(model_load(&back, dir, model_backend(whole), err) == 0, "%s: load the saved folder: %s", what, err);
    const Backend *be = model_backend(whole);
    int differ = 0;
    for (int i = 0; back && i < model_param_count(whole); i++) {
        ModelParam a = model_param(whole, i), b = model_param(back, i);
        float *x = malloc(a.numel * sizeof(float)), *y = malloc(a.numel * sizeof(float));
        be->download(be, x, a.data, a.numel);
        be->download(be, y, b.data, b.numel);
        bool same = a.numel == b.numel && !memcmp(x, y, a.numel * sizeof(float));
        CHECK(same, "%s: saved %s differs from the whole model's", what, a.name);
        differ += !same;
        free(x);
        free(y);
    }
    printf("  %-34s saved and reloaded: %d tensors, %d differ\n", what, back ? model_param_count(back) : 0, differ);
    model_free(back);
    const char *files[] = {"model.safetensors", "config.json", "generation_config.json"};
    for (size_t f = 0; f < sizeof files / sizeof files[0]; f++) {
        char path[320];
        snprintf(path, sizeof path, "%s/%s", dir, files[f]);
        remove(path);
    }
    rmdir(dir);
}

/* Largest |difference| of two safetensors files' tensors (same names and
 * shapes), INFINITY when unreadable or unlike. */
static double file_diff(const char *path_a, const char *path_b) {
    char err[ERR_LEN];
    SafeTensorsSet x, y;
    if (safetensors_open_file(&x, path_a, err) != 0) return INFINITY;
    if (safetensors_open_file(&y, path_b, err) != 0) {
        safetensors_set_free(&x);
        return INFINITY;
    }
    const SafeTensorsHeader *hx = &x.headers[0], *hy = &y.headers[0];
    double worst = hx->n_tensors == hy->n_tensors && hx->n_tensors > 0 ? 0.0 : INFINITY;
    for (int i = 0; isfinite(worst) && i < hx->n_tensors; i++) {
        const SafeTensor *tx = &hx->tensors[i], *ty = safetensors_find(&y, tx->name, NULL);
        size_t n = safetensors_numel(tx);
        if (!ty || safetensors_numel(ty) != n || tx->ndim != ty->ndim || tx->shape[0] != ty->shape[0]) {
            worst = INFINITY;
            break;
        }
        float *fx = malloc(n * sizeof(float)), *fy = malloc(n * sizeof(float));
        safetensors_to_f32(fx, tx);
        safetensors_to_f32(fy, ty);
        worst = fmax(worst, max_abs_diff(fx, fy, n));
        free(fx);
        free(fy);
    }
    safetensors_set_free(&x);
    safetensors_set_free(&y);
    return worst;
}

/* Every adapter tensor of part equals this rank's part of whole's (exactly:
 * the same values, cut); returns the number that differ. */
static int lora_parts_differ(Model *whole, Model *part, const char *what) {
    const Backend *be = model_backend(whole);
    const ModelConfig *c = model_config(whole);
    int bad = 0;
    for (int i = 0; i < model_param_count(part); i++) {
        ModelParam pw = model_param(whole, i), pp = model_param(part, i);
        float *a = malloc(pw.numel * sizeof(float)), *cut = malloc(pp.numel * sizeof(float)),
              *b = malloc(pp.numel * sizeof(float));
        be->download(be, a, pw.data, pw.numel);
        be->download(be, b, pp.data, pp.numel);
        part_of(a, pw.numel, cut, pp.numel, pw.name, model_tensor_parallel_rank(part), model_tensor_parallel_size(part), c->hidden_size,
                model_lora_config(part)->r);
        if (strcmp(pw.name, pp.name) || memcmp(cut, b, pp.numel * sizeof(float))) {
            bad++;
            fprintf(stderr, "%s: adapter %s is not the whole model's cut\n", what, pp.name);
        }
        free(a);
        free(cut);
        free(b);
    }
    return bad;
}

/* LoRA on every linear layer of the parts against the whole model's: new
 * adapters are the whole model's cut; random non-zero adapters written by the
 * whole model (PEFT's files) and loaded by the parts give the same logits,
 * log-probs (also with lora_dropout: each part draws its slice of the whole
 * model's masks), adapter gradients (accumulated over two passes) and
 * completions; the parts' gathered save and merged checkpoint equal the
 * whole model's. */
static void check_lora(const ModelConfig *cfg, const Backend *be, const TensorParallel *hooks, TpGroup *g,
                       const char *shape_what) {
    char err[ERR_LEN], what[128], dir[256], path_w[320], path_p[320];
    snprintf(what, sizeof what, "%s + LoRA", shape_what);
    snprintf(dir, sizeof dir, "/tmp/colt_test_tp_lora_XXXXXX");
    if (!mkdtemp(dir)) {
        CHECK(0, "%s: mkdtemp failed", what);
        return;
    }
    LoraConfig lc = {.r = 4, .alpha = 8.0f, .targets = LORA_ALL_TARGETS, .dropout = 0.25f};
    Model *whole = NULL, *part = NULL, *fresh = NULL;
    CHECK(model_create_random(&whole, cfg, 7, be, err) == 0 &&
              model_create_random_tp(&part, cfg, 7, be, hooks, err) == 0 &&
              model_create_random_tp(&fresh, cfg, 7, be, hooks, err) == 0,
          "%s: %s", what, err);
    CHECK(model_lora_attach(whole, &lc, 11, err) == 0 && model_lora_attach(fresh, &lc, 11, err) == 0, "%s: %s", what,
          err);
    int bad = lora_parts_differ(whole, fresh, what);
    CHECK(bad == 0, "%s: %d new adapters are not the whole model's cut", what, bad);
    /* random non-zero adapters (B is 0 when new), through PEFT's files */
    for (int i = 0; i < model_param_count(whole); i++) {
        ModelParam p = model_param(whole, i);
        float *host = malloc(p.numel * sizeof(float));
        for (size_t j = 0; j < p.numel; j++) host[j] = 0.2f * (rng_uniform(23, (uint64_t)i, j) - 0.5f);
        be->upload(be, p.data, host, p.numel);
        free(host);
    }
    snprintf(path_w, sizeof path_w, "%s/whole", dir);
    snprintf(path_p, sizeof path_p, "%s/part", dir);
    CHECK(model_lora_save(whole, path_w, "base", err) == 0, "%s: %s", what, err);
    CHECK(model_lora_load(part, path_w, err) == 0, "%s: %s", what, err);
    bad = lora_parts_differ(whole, part, what);
    CHECK(bad == 0, "%s: %d loaded adapters are not the whole model's cut", what, bad);
    check_forward(whole, part, what);
    check_training(whole, part, false, 2, what);
    /* lora_dropout 0.25 (adapter_config.json's): the same masks as the whole model's */
    char what_dropout[160];
    snprintf(what_dropout, sizeof what_dropout, "%s dropout", what);
    model_lora_set_dropout_key(whole, 5, 3);
    model_lora_set_dropout_key(part, 5, 3);
    check_training(whole, part, true, 2, what_dropout);
    model_lora_set_dropout_key(whole, 5, -1);
    model_lora_set_dropout_key(part, 5, -1);
    check_engine(whole, part, g, what);
    /* the parts' save: rank 0 of the group writes the gathered whole tensors */
    CHECK(model_lora_save(part, path_p, "base", err) == 0, "%s: %s", what, err);
    snprintf(path_w, sizeof path_w, "%s/whole_merged", dir);
    snprintf(path_p, sizeof path_p, "%s/part_merged", dir);
    CHECK(model_save_merged(whole, path_w, DTYPE_F32, err) == 0 && model_save_merged(part, path_p, DTYPE_F32, err) == 0,
          "%s: %s", what, err);
    if (g->tensor_parallel_rank == 0) {
        char a[400], b[400];
        snprintf(a, sizeof a, "%s/whole", dir);
        snprintf(b, sizeof b, "%s/part", dir);
        bool same_adapters = same_file(a, b, "adapter_model.safetensors") && same_file(a, b, "adapter_config.json");
        CHECK(same_adapters, "%s: the parts' saved adapters differ from the whole model's", what);
        snprintf(a, sizeof a, "%s/model.safetensors", path_w);
        snprintf(b, sizeof b, "%s/model.safetensors", path_p);
        double merged = file_diff(a, b);
        CHECK(merged == 0.0, "%s: merged checkpoints differ by %.3g", what, merged);
        printf("  %-34s saved adapters %s, merged checkpoint max |diff| %.2g\n", what,
               same_adapters ? "byte-identical" : "DIFFERENT", merged);
    }
    model_free(whole);
    model_free(part);
    model_free(fresh);
    sh("rm -rf %s", dir);
}

/* device: "cpu", or "cuda-f32" (the CUDA backend's fp32 table: the same
 * tolerances; the ranks share GPU 0 and talk over MPI through the host). */
static int run_rank(const LaunchEnv *env, int tensor_parallel_size, const char *device) {
    char err[ERR_LEN];
    CommOptions co = {.kind = COMM_MPI, .timeout_s = 60};
    Comm *world = NULL;
    if (comm_open(&world, env, &co, err) != 0) {
        fprintf(stderr, "rank %d: %s\n", env->rank, err);
        return 2;
    }
    const Backend *be = backend_cpu();
    Backend *gpu = NULL;
    bool big = !strncmp(device, "cuda-1.5b", 9), nccl = strstr(device, "-nccl") != NULL;
    if (!strncmp(device, "cuda-f32", 8) || big) {
        /* -nccl: local rank r on GPU r, the group's collectives over NCCL */
        gpu = backend_cuda_open(nccl ? env->local_rank : 0, big ? DTYPE_BF16 : DTYPE_F32, err);
        if (!gpu) {
            fprintf(stderr, "rank %d: %s\n", env->rank, err);
            comm_abort(world, err);
        }
        be = gpu;
    }
    TpGroup g;
    if (tp_group_open(&g, world, tensor_parallel_size, be, err) != 0) {
        fprintf(stderr, "rank %d: %s\n", env->rank, err);
        comm_abort(world, err);
    }
    if (nccl) {
        char how[128];
        if (tp_group_use_nccl(&g, env, world, be, 60, how, sizeof how, err) != 0 || !g.nccl) {
            fprintf(stderr, "rank %d: NCCL for the group: %s\n", env->rank, g.nccl ? err : how);
            comm_abort(world, err);
        }
    }
    TensorParallel hooks = tp_group_hooks(&g);
    struct {
        const char *name;
        ModelConfig cfg;
    } shapes[] = {{"qwen2 tied GQA 8/4", shape(ARCH_QWEN2, true, 8, 4)},
                  {"llama untied MHA 4/4", shape(ARCH_LLAMA, false, 4, 4)},
                  {"qwen3 q/k norm GQA 8/4", shape(ARCH_QWEN3, false, 8, 4)},
                  /* fewer KV heads than ranks at TP 4 (TP 2 too for MQA): KV heads replicated */
                  {"qwen2 tied GQA 8/2", shape(ARCH_QWEN2, true, 8, 2)},
                  {"qwen3 q/k norm MQA 8/1", shape(ARCH_QWEN3, false, 8, 1)}};
    size_t n_shapes = sizeof shapes / sizeof shapes[0];
    if (big) { /* Qwen2.5-1.5B's layer shape in bf16, 4 of its 28 layers */
        ModelConfig c = shape(ARCH_QWEN2, true, 12, 2);
        c.hidden_size = 1536, c.intermediate_size = 8960, c.head_dim = 128, c.vocab_size = 151936;
        c.num_hidden_layers = 4, c.max_position_embeddings = 4096, c.rope_theta = 1e6f, c.torch_dtype = DTYPE_BF16;
        shapes[0].name = "Qwen2.5-1.5B shape x4 layers bf16";
        shapes[0].cfg = c;
        n_shapes = 1;
        TOL_LOGITS = 0.1, TOL_LOGPROB = 0.1, TOL_GRAD = 0.1, ENGINE_EXACT = false;
    }
    for (size_t s = 0; s < n_shapes; s++) {
        Model *whole = NULL, *part = NULL;
        char what[96];
        snprintf(what, sizeof what, "TP %d rank %d: %s", tensor_parallel_size, g.tensor_parallel_rank, shapes[s].name);
        CHECK(model_create_random(&whole, &shapes[s].cfg, 7, be, err) == 0, "%s: %s", what, err);
        CHECK(model_create_random_tp(&part, &shapes[s].cfg, 7, be, &hooks, err) == 0, "%s: %s", what, err);
        if (!whole || !part) comm_abort(world, err);
        if (env->rank >= tensor_parallel_size) {
            /* another data-parallel group: the same checks, printed once */
            freopen("/dev/null", "w", stdout);
        }
        check_forward(whole, part, what);
        check_training(whole, part, false, 1, what);
        check_training(whole, part, true, 1, what);
        check_engine(whole, part, &g, what);
        check_save(whole, part, &g, (int)s, what);
        model_free(whole);
        model_free(part);
        check_lora(&shapes[s].cfg, be, &hooks, &g, what);
    }
    /* every rank's verdict */
    double bad = g_failures, *all = calloc((size_t)comm_world_size(world), sizeof(double));
    if (comm_all_gather(world, all, &bad, 1, COMM_FLOAT64, NULL, err) != 0) comm_abort(world, err);
    double total = 0;
    for (int r = 0; r < comm_world_size(world); r++) total += all[r];
    free(all);
    if (env->rank == 0) printf("TP %d on %d ranks: %d checks on rank 0, %.0f failures on all ranks\n", tensor_parallel_size,
                               env->world_size, g_checks, total);
    tp_group_close(&g);
    if (gpu) backend_cuda_close(gpu);
    comm_close(world);
    return total > 0 ? 1 : 0;
}

/* ---------------------------------------------------------------- driver */

static void check_errors(void) {
    char err[ERR_LEN];
    ModelConfig c = shape(ARCH_QWEN2, true, 12, 4);
    c.vocab_size = 132;
    CHECK(model_tp_check(&c, 6, err) != 0 && strstr(err, "tensor_parallel_size 6 and the model's "
                                                         "num_key_value_heads (4): one must divide the other"),
          "KV heads: %s", err);
    printf("  %s\n", err);
    CHECK(model_tp_check(&c, 12, err) == 0 && model_tp_check(&c, 2, err) == 0, "KV heads 4 at TP 12 / 2: %s", err);
    c.num_attention_heads = 6, c.num_key_value_heads = 6;
    CHECK(model_tp_check(&c, 4, err) != 0 && strstr(err, "num_attention_heads (6)"), "heads: %s", err);
    c = shape(ARCH_QWEN2, true, 8, 4);
    c.vocab_size = 130;
    CHECK(model_tp_check(&c, 4, err) != 0 && strstr(err, "vocab_size (130)"), "vocab: %s", err);
    c = shape(ARCH_LLAMA, false, 4, 4);
    c.attention_bias = true;
    CHECK(model_tp_check(&c, 2, err) != 0 && strstr(err, "o_proj bias"), "o_proj bias: %s", err);
    c.attention_bias = false;
    CHECK(model_tp_check(&c, 0, err) != 0, "size 0 accepted");
    CHECK(model_tp_check(&c, 1, err) == 0 && model_tp_check(&c, 4, err) == 0, "valid sizes refused: %s", err);
    TpGroup g;
    CHECK(tp_group_open(&g, NULL, 2, backend_cpu(), err) != 0 &&
              !strcmp(err, "tensor_parallel_size 2 does not divide the number of ranks (1)"),
          "group of 2 on 1 rank: %s", err);
    printf("  %s\n", err);
}

/* colt generate on the real stories260K (models/, in the repo): the same
 * sampled completions from 1, 2 and 4 processes, and the bad-launch errors. */
static void check_generate_cli(void) {
    const char *args = "generate --model " COLT_SOURCE_DIR "/models/stories260K --prompt 'Once upon a time' "
                       "--max_new_tokens 40 --n 3 --temperature 0.8 --seed 3 --device cpu --json";
    char *outs[3] = {NULL, NULL, NULL}, cmd[2048];
    int sizes[3] = {1, 2, 4};
    for (int k = 0; k < 3; k++) {
        if (sizes[k] == 1) snprintf(cmd, sizeof cmd, "%s %s", COLT_BINARY, args);
        else snprintf(cmd, sizeof cmd, "%s -np %d %s %s --tensor_parallel_size %d", MPIRUN, sizes[k], COLT_BINARY, args,
                      sizes[k]);
        FILE *p = popen(cmd, "r");
        char buf[65536];
        size_t n = p ? fread(buf, 1, sizeof buf - 1, p) : 0;
        buf[n] = '\0';
        int rc = p ? pclose(p) : -1;
        CHECK(rc == 0 && n > 0, "%s: exit %d", cmd, rc);
        outs[k] = strdup(buf);
    }
    CHECK(!strcmp(outs[0], outs[1]) && !strcmp(outs[0], outs[2]),
          "colt generate: the completions of 1, 2 and 4 processes differ:\n%s\n%s\n%s", outs[0], outs[1], outs[2]);
    printf("colt generate --tensor_parallel_size 1 / 2 / 4 on stories260K: %s\n",
           strcmp(outs[0], outs[1]) || strcmp(outs[0], outs[2]) ? "DIFFERENT" : "the same 3 sampled completions");
    for (int k = 0; k < 3; k++) free(outs[k]);
    snprintf(cmd, sizeof cmd, "%s %s --tensor_parallel_size 2 2>&1", COLT_BINARY, args);
    FILE *p = popen(cmd, "r");
    char buf[4096];
    size_t n = fread(buf, 1, sizeof buf - 1, p);
    buf[n] = '\0';
    CHECK(pclose(p) != 0 && strstr(buf, "start it with mpirun -np N"), "one process, TP 2: %s", buf);
    snprintf(cmd, sizeof cmd, "%s -np 2 %s %s --tensor_parallel_size 3 2>&1", MPIRUN, COLT_BINARY, args);
    p = popen(cmd, "r");
    n = fread(buf, 1, sizeof buf - 1, p);
    buf[n] = '\0';
    CHECK(pclose(p) != 0 && strstr(buf, "colt generate: tensor_parallel_size 3 does not divide the model's "
                                        "num_attention_heads (8)"),
          "TP 3: %s", buf);
}

/* ---------------------------------------------------------------- colt train */

static const char *TRAIN =
    "train --config examples/demo.yaml --max_completion_length 16 --logging_steps 1 --log_completions_count 0 "
    "--save_total_limit 0 --eval_dataset null --deterministic true --ddp_timeout 60 --device cpu --max_steps 2 "
    "--save_steps 1";

/* "[mpirun -np NP] colt TRAIN EXTRA --output_dir g_tmp/name"; exit status, stderr in *log. */
static int train_run(int np, const char *extra, const char *name, char **log) {
    char cmd[4096], log_path[512];
    snprintf(log_path, sizeof log_path, "%s/%s.log", g_tmp, name);
    if (np > 1)
        snprintf(cmd, sizeof cmd, "%s -np %d %s %s %s --output_dir %s/%s > /dev/null 2> %s", MPIRUN, np, COLT_BINARY,
                 TRAIN, extra, g_tmp, name, log_path);
    else
        snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 %s %s %s %s --output_dir %s/%s > /dev/null 2> %s",
                 strstr(extra, "--nproc_per_node") ? NO_LEAK_CHECK : "", COLT_BINARY, TRAIN, extra, g_tmp, name, log_path);
    int status = system(cmd);
    size_t len;
    if (file_read_all(log_path, log, &len, NULL) != 0) *log = strdup("");
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

/* Largest |difference| of two runs' saved weights (every tensor), INFINITY when unreadable. */
static double weights_diff(const char *a, const char *b) {
    char da[512], db[512], err[ERR_LEN];
    snprintf(da, sizeof da, "%s/%s", g_tmp, a);
    snprintf(db, sizeof db, "%s/%s", g_tmp, b);
    SafeTensorsSet x, y;
    if (safetensors_open_dir(&x, da, err) != 0) return INFINITY;
    if (safetensors_open_dir(&y, db, err) != 0) {
        safetensors_set_free(&x);
        return INFINITY;
    }
    /* both single files here (the demo model is far below the shard limit) */
    const SafeTensorsHeader *hx = &x.headers[0], *hy = &y.headers[0];
    double worst = x.n_files == 1 && y.n_files == 1 && hx->n_tensors == hy->n_tensors ? 0.0 : INFINITY;
    for (int i = 0; isfinite(worst) && i < hx->n_tensors; i++) {
        const SafeTensor *tx = &hx->tensors[i], *ty = safetensors_find(&y, tx->name, NULL);
        size_t n = safetensors_numel(tx);
        if (!ty || safetensors_numel(ty) != n) {
            worst = INFINITY;
            break;
        }
        float *fx = malloc(n * sizeof(float)), *fy = malloc(n * sizeof(float));
        safetensors_to_f32(fx, tx);
        safetensors_to_f32(fy, ty);
        worst = fmax(worst, max_abs_diff(fx, fy, n));
        free(fx);
        free(fy);
    }
    safetensors_set_free(&x);
    safetensors_set_free(&y);
    return worst;
}

/* The world's metrics of two runs, the largest difference step by step
 * (metric_difference: relative, against each metric's floor). */
static double metrics_diff(const char *a, const char *b, char *worst, size_t worst_size) {
    char da[512], db[512];
    snprintf(da, sizeof da, "%s/%s", g_tmp, a);
    snprintf(db, sizeof db, "%s/%s", g_tmp, b);
    char *ta = read_text(da, "metrics.jsonl"), *tb = read_text(db, "metrics.jsonl");
    double d = ta && tb && count_lines(ta) == count_lines(tb) && count_lines(ta) > 0 ? 0.0 : INFINITY;
    snprintf(worst, worst_size, "-");
    char *sa = NULL, *sb = NULL;
    for (char *la = ta ? strtok_r(ta, "\n", &sa) : NULL, *lb = tb ? strtok_r(tb, "\n", &sb) : NULL; la && lb && isfinite(d);
         la = strtok_r(NULL, "\n", &sa), lb = strtok_r(NULL, "\n", &sb)) {
        json_t *ja = json_loads(la, 0, NULL), *jb = json_loads(lb, 0, NULL);
        const char *key;
        json_t *va;
        json_object_foreach(ja, key, va) {
            if (!metric_is_compared(key) || !json_is_number(va)) continue;
            json_t *vb = json_object_get(jb, key);
            double x = json_number_value(va), y = json_is_number(vb) ? json_number_value(vb) : INFINITY;
            double rel = metric_difference(key, x, y);
            if (!(rel <= d)) {
                d = rel;
                snprintf(worst, worst_size, "%s (%.9g vs %.9g)", key, x, y);
            }
        }
        json_decref(ja);
        json_decref(jb);
    }
    free(ta);
    free(tb);
    return d;
}

#if !defined(__SANITIZE_ADDRESS__) /* the KV2 runs: Release only (check_train_cli) */
/* g_tmp/kv2: stories260K with its 4 KV heads averaged in pairs into 2, so
 * that TP 4 replicates each KV head on 2 ranks (a real model, so GRPO's
 * rewards still vary and the steps train). */
static bool make_kv2_model(void) {
    char err[ERR_LEN], dir[512];
    const Backend *be = backend_cpu();
    Model *src = NULL, *dst = NULL;
    if (model_load(&src, COLT_SOURCE_DIR "/models/stories260K", be, err) != 0) {
        CHECK(0, "stories260K: %s", err);
        return false;
    }
    ModelConfig c = *model_config(src);
    c.num_key_value_heads = 2;
    bool ok = model_create_random(&dst, &c, 1, be, err) == 0;
    for (int i = 0; ok && i < model_param_count(src); i++) {
        ModelParam a = model_param(src, i), b = model_param(dst, i);
        float *x = malloc(a.numel * sizeof(float));
        be->download(be, x, a.data, a.numel);
        if (b.numel * 2 == a.numel) { /* k/v_proj [4 heads x 8, 64] -> [2 x 8, 64]: heads 2j and 2j + 1 averaged */
            size_t head = (size_t)c.head_dim * c.hidden_size;
            for (size_t j = 0; j < 2; j++)
                for (size_t k = 0; k < head; k++) x[j * head + k] = 0.5f * (x[2 * j * head + k] + x[(2 * j + 1) * head + k]);
        }
        be->upload(be, b.data, x, b.numel);
        free(x);
    }
    snprintf(dir, sizeof dir, "%s/kv2", g_tmp);
    ok = ok && model_save(dst, dir, DTYPE_F32, err) == 0;
    CHECK(ok, "the 2-KV-head model: %s", err);
    sh("cp " COLT_SOURCE_DIR "/models/stories260K/tokenizer*.json %s/", dir);
    model_free(src);
    model_free(dst);
    return ok;
}
#endif

/* GRPO on the demo (stories260K), 2 steps (the second with the moments and
 * weights the first made; checked to move the weights): TP 2 and TP 4 against one process,
 * TP 2 x DP 2 against DP 2, under mpirun and (where Gloo is built) under colt's
 * own launcher, and with zero_stage 1 and 3 + offload (bit for bit as stage 0) (weights
 * within fp32 rounding of the parts' sums;
 * metrics within 2e-3 by metric_difference (relative; the loss, a
 * cancellation of O(1) terms, against a floor of 1): the engine's log-probs
 * now differ from the trainer's by ~5e-7, which sampling_logp_difference reports), a TP 2 run
 * resumed from its checkpoint-1 equal to the straight run bit for bit, TRL's entropy bonus and entropy
 * mask on in the TP 2 and TP 4 runs against one process (the bonus moves the weights by ~1.4e-4 at step 2), and
 * the settings tensor parallelism refuses. Under the sanitizers the TP 4 runs (tp4, kv2_tp4 and its kv2_tp1) are
 * left to Release: a TP 4 trainer takes the TP 2 runs' code, and the in-process TP 4 group (run_rank: forward,
 * backward, engine, save, LoRA; KV heads replicated) runs sanitized; so is tp2dp2z1 (see runs[]). */
#define ENTROPY_BONUS \
    "--top_entropy_quantile 0.5 --use_adaptive_entropy true --entropy_coef 0.05 --entropy_target 10"
static void check_train_cli(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_test_tp_XXXXXX");
    if (!mkdtemp(g_tmp)) {
        CHECK(0, "mkdtemp failed");
        return;
    }
    struct {
        int np;
        const char *extra, *name;
    } runs[] = {/* with TRL's entropy bonus (applied at step 2: the controller's first measurement is step 1's)
                 * and entropy mask: the entropy's gradient through each rank's vocabulary part */
                {1, ENTROPY_BONUS, "tp1"},
                {2, "--tensor_parallel_size 2 " ENTROPY_BONUS, "tp2"},
#if !defined(__SANITIZE_ADDRESS__)
                {4, "--tensor_parallel_size 4 " ENTROPY_BONUS, "tp4"},
#endif
                {2, "", "dp2"},
                {4, "--tensor_parallel_size 2", "tp2dp2"},
#if !defined(__SANITIZE_ADDRESS__) /* ZeRO-1's sharding runs sanitized in test_dist_train, ZeRO over TP in tp2dp2z3off */
                {4, "--tensor_parallel_size 2 --zero_stage 1", "tp2dp2z1"},
#endif
                {4, "--tensor_parallel_size 2 --zero_stage 3 --offload_optimizer cpu", "tp2dp2z3off"},
#if !defined(__SANITIZE_ADDRESS__)
                /* 2 KV heads at TP 4: each replicated on 2 ranks (make_kv2_model) */
                {1, "--model KV2", "kv2_tp1"},
                {4, "--model KV2 --tensor_parallel_size 4", "kv2_tp4"},
#endif
                /* colt's own launcher: the ranks talk over Gloo, the groups split from its mesh */
                {1, "--nproc_per_node 4 --tensor_parallel_size 2", "gloo_tp2dp2"}};
#if !defined(__SANITIZE_ADDRESS__)
    bool kv2 = make_kv2_model();
#else
    bool kv2 = false; /* no KV2 run */
#endif
    size_t n_runs = sizeof runs / sizeof runs[0] - (comm_built(COMM_GLOO) ? 0 : 1);
    for (size_t r = 0; r < n_runs; r++) {
        char *log = NULL, extra[1024];
        if (!strncmp(runs[r].extra, "--model KV2", 11)) {
            if (!kv2) continue;
            /* "the" (in most stories) rather than "park": this model is too weak to say park in 2 steps */
            snprintf(extra, sizeof extra,
                     "--model %s/kv2 --reward_funcs '{\"type\": \"regex\", \"pattern\": \"\\\\bthe\\\\b\"}'%s",
                     g_tmp, runs[r].extra + 11);
        } else {
            snprintf(extra, sizeof extra, "%s", runs[r].extra);
        }
        int rc = train_run(runs[r].np, extra, runs[r].name, &log);
        CHECK(rc == 0, "colt train %s on %d processes: exit %d: %s", extra, runs[r].np, rc, log);
        free(log);
    }
    /* step 2 moved the weights: a comparison of untrained runs would pass vacuously */
    double moved = weights_diff("tp1", "tp1/checkpoint-1");
    printf("colt train, one process: step 2 moved the weights by up to %.2g\n", moved);
    CHECK(moved > 0 && isfinite(moved), "train tp1: the weights moved by %.3g from step 1 to step 2", moved);
    char worst_z[256];
    struct {
        const char *a, *b;
    } pairs[] = {{"tp1", "tp2"},
#if !defined(__SANITIZE_ADDRESS__)
                 {"tp1", "tp4"}, {"kv2_tp1", "kv2_tp4"},
#endif
                 {"dp2", "tp2dp2"}, {"dp2", "gloo_tp2dp2"}};
    size_t n_pairs = sizeof pairs / sizeof pairs[0] - (comm_built(COMM_GLOO) ? 0 : 1);
    for (size_t k = 0; k < n_pairs; k++) {
        char worst[256];
        double w = weights_diff(pairs[k].a, pairs[k].b), m = metrics_diff(pairs[k].a, pairs[k].b, worst, sizeof worst);
        CHECK(w <= 2e-5, "train %s vs %s: final weights differ by %.3g", pairs[k].a, pairs[k].b, w);
        CHECK(m <= 2e-3, "train %s vs %s: metrics differ by %.3g (%s)", pairs[k].a, pairs[k].b, m, worst);
        printf("colt train %-11s vs %-4s (2 GRPO steps): weights max |diff| %.2g, metrics %.2g relative (%s)\n",
               pairs[k].b, pairs[k].a, w, m, worst);
    }
    /* ZeRO shards each part's optimizer state (stage 1), gradients (2) and weights (3) over the data-parallel
     * group: the same weights bit for bit; the gradient norm is summed from the shards in another order */
    const char *zero_runs[] = {
#if !defined(__SANITIZE_ADDRESS__)
        "tp2dp2z1",
#endif
        "tp2dp2z3off"};
    for (size_t k = 0; k < sizeof zero_runs / sizeof zero_runs[0]; k++) {
        double wz = weights_diff("tp2dp2", zero_runs[k]), mz = metrics_diff("tp2dp2", zero_runs[k], worst_z, sizeof worst_z);
        CHECK(wz == 0.0 && mz <= 1e-6, "TP 2 x DP 2, %s: weights %.3g, metrics %.3g (%s) from zero_stage 0",
              zero_runs[k], wz, mz, worst_z);
        printf("colt train %s vs zero_stage 0: weights max |diff| %.2g, metrics %.2g relative\n", zero_runs[k], wz, mz);
    }
    /* resume: a copy of tp2 from its checkpoint-1 (the entropy controller's state comes back too) */
    sh("cp -r %s/tp2 %s/tp2r", g_tmp, g_tmp);
    char extra[1024], *log = NULL;
    snprintf(extra, sizeof extra, "--tensor_parallel_size 2 " ENTROPY_BONUS " --resume_from_checkpoint %s/tp2r/checkpoint-1",
             g_tmp);
    int rc = train_run(2, extra, "tp2r", &log);
    CHECK(rc == 0, "resume at TP 2: exit %d: %s", rc, log);
    free(log);
    char worst[256];
    double w = weights_diff("tp2", "tp2r"), m = metrics_diff("tp2", "tp2r", worst, sizeof worst);
    CHECK(w == 0.0 && m == 0.0, "TP 2 resumed from checkpoint-1: weights %.3g, metrics %.3g (%s) from the straight run", w,
          m, worst);
    printf("colt train TP 2 resumed from checkpoint-1: weights max |diff| %.2g, metrics %.2g from the straight run\n", w, m);
    snprintf(extra, sizeof extra, ENTROPY_BONUS " --resume_from_checkpoint %s/tp2r/checkpoint-1", g_tmp);
    rc = train_run(1, extra, "tp2r1", &log);
    CHECK(rc != 0 && strstr(log, "the checkpoint was saved with tensor_parallel_size 2") &&
              strstr(log, "resume it with --tensor_parallel_size 2"),
          "resume of a TP 2 checkpoint at TP 1: %s", log);
    printf("colt train TP 2 checkpoint resumed at TP 1: exit %d, %s", rc, strstr(log, "tensor_parallel_size 2") ? "names tensor_parallel_size 2\n" : log);
    free(log);
    /* refused settings */
    struct {
        int np;
        const char *extra, *want;
    } bad[] = {{1, "--tensor_parallel_size 2", "tensor_parallel_size 2 needs a multiple of 2 processes"},
               {3, "--tensor_parallel_size 2", "and this launch has 3"}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        rc = train_run(bad[k].np, bad[k].extra, "bad", &log);
        CHECK(rc != 0 && strstr(log, bad[k].want), "%s on %d processes: exit %d, %s", bad[k].extra, bad[k].np, rc, log);
        free(log);
    }
    if (!getenv("KEEP")) sh("rm -rf %s", g_tmp);
}

#if !defined(__SANITIZE_ADDRESS__) /* the LoRA runs: Release only (main) */
/* Largest |difference| of two runs' saved adapters (adapter_model.safetensors). */
static double adapters_diff(const char *a, const char *b) {
    char pa[512], pb[512];
    snprintf(pa, sizeof pa, "%s/%s/adapter_model.safetensors", g_tmp, a);
    snprintf(pb, sizeof pb, "%s/%s/adapter_model.safetensors", g_tmp, b);
    return file_diff(pa, pb);
}

/* `colt train --use_peft` on the demo, 2 GRPO steps (learning rate 2e-3 so the
 * adapters move; lora_dropout 0, and TRL's default 0.05 for the masks):
 * TP 2 and TP 4 against one process and TP 2 x DP 2 against DP 2 — the saved
 * adapters (gathered on rank 0) and the merge_lora checkpoint within a tenth
 * of the learning rate (AdamW divides each element's gradient by its own
 * running size, so an element whose gradient is near adam_epsilon or the
 * result of a cancellation turns the parts' fp32 rounding, ~1e-6 of a
 * tensor's largest gradient as run_rank measures, into a few percent of a
 * step; the full-model runs above see the same, 3.7e-6 at a learning rate of
 * 3e-4), the metrics within 2e-3 (metric_difference); with adam_epsilon 1e-4, which
 * keeps AdamW from blowing up the smallest gradients, within 2e-6;
 * zero_stage 1, with and without offload_optimizer, bit for bit as stage 0;
 * a TP 2 run resumed from its checkpoint-1 equal to the straight run; and
 * `colt generate --adapter` from 1 and 2 processes. */
static void check_train_lora_cli(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_test_tp_lora_XXXXXX");
    if (!mkdtemp(g_tmp)) {
        CHECK(0, "mkdtemp failed");
        return;
    }
#define LORA_ARGS "--use_peft true --lora_r 8 --lora_alpha 16 --learning_rate 2e-3 --warmup_steps 0 --merge_lora true"
    const double tol = 0.1 * 2e-3; /* a tenth of the learning rate */
    struct {
        int np;
        const char *extra, *name;
    } runs[] = {{1, LORA_ARGS " --lora_dropout 0", "tp1"},
                {2, LORA_ARGS " --lora_dropout 0 --tensor_parallel_size 2", "tp2"},
                {4, LORA_ARGS " --lora_dropout 0 --tensor_parallel_size 4", "tp4"},
                {2, LORA_ARGS " --lora_dropout 0", "dp2"},
                {4, LORA_ARGS " --lora_dropout 0 --tensor_parallel_size 2", "tp2dp2"},
                {4, LORA_ARGS " --lora_dropout 0 --tensor_parallel_size 2 --zero_stage 1", "tp2dp2z1"},
                {4, LORA_ARGS " --lora_dropout 0 --tensor_parallel_size 2 --zero_stage 1 --offload_optimizer cpu",
                 "tp2dp2z1off"},
                {1, LORA_ARGS, "tp1_dropout"},
                {2, LORA_ARGS " --tensor_parallel_size 2", "tp2_dropout"},
                {1, LORA_ARGS " --lora_dropout 0 --adam_epsilon 1e-4", "tp1_eps"},
                {2, LORA_ARGS " --lora_dropout 0 --adam_epsilon 1e-4 --tensor_parallel_size 2", "tp2_eps"}};
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        char *log = NULL;
        int rc = train_run(runs[r].np, runs[r].extra, runs[r].name, &log);
        CHECK(rc == 0, "colt train %s on %d processes: exit %d: %s", runs[r].extra, runs[r].np, rc, log);
        free(log);
    }
    struct {
        const char *a, *b;
        double tol;
    } pairs[] = {{"tp1", "tp2", tol}, {"tp1", "tp4", tol}, {"dp2", "tp2dp2", tol}, {"tp1_dropout", "tp2_dropout", tol},
                 {"tp1_eps", "tp2_eps", 2e-6}};
    for (size_t k = 0; k < sizeof pairs / sizeof pairs[0]; k++) {
        char worst[256], ma[300], mb[300];
        snprintf(ma, sizeof ma, "%s/merged", pairs[k].a);
        snprintf(mb, sizeof mb, "%s/merged", pairs[k].b);
        double w = adapters_diff(pairs[k].a, pairs[k].b), mw = weights_diff(ma, mb);
        double m = metrics_diff(pairs[k].a, pairs[k].b, worst, sizeof worst);
        char da[300], db[300];
        snprintf(da, sizeof da, "%s/%s", g_tmp, pairs[k].a);
        snprintf(db, sizeof db, "%s/%s", g_tmp, pairs[k].b);
        CHECK(w <= pairs[k].tol && mw <= pairs[k].tol,
              "LoRA train %s vs %s: adapters differ by %.3g, merged weights by %.3g", pairs[k].a, pairs[k].b, w, mw);
        CHECK(m <= 2e-3, "LoRA train %s vs %s: metrics differ by %.3g (%s)", pairs[k].a, pairs[k].b, m, worst);
        CHECK(same_file(da, db, "adapter_config.json"), "LoRA train %s vs %s: adapter_config.json differs", pairs[k].a,
              pairs[k].b);
        printf("colt train --use_peft %-11s vs %-11s (2 GRPO steps): adapters max |diff| %.2g, merged %.2g, metrics "
               "%.2g (%s)\n", pairs[k].b, pairs[k].a, w, mw, m, worst);
    }
    /* the adapters moved: a comparison of untrained adapters would pass vacuously */
    double moved = adapters_diff("tp1", "tp1/checkpoint-1");
    CHECK(moved > 1e-3 && isfinite(moved), "LoRA train: the adapters moved by %.3g from step 1 to step 2", moved);
    CHECK(exists_in(g_tmp, "tp2/checkpoint-1/optimizer-tp00001-of-00002.safetensors") &&
              !exists_in(g_tmp, "tp2/model.safetensors"),
          "LoRA train TP 2: not a LoRA checkpoint with one optimizer file per part");
    const char *zero_runs[2] = {"tp2dp2z1", "tp2dp2z1off"};
    for (int k = 0; k < 2; k++) {
        char worst[256];
        double w = adapters_diff("tp2dp2", zero_runs[k]), m = metrics_diff("tp2dp2", zero_runs[k], worst, sizeof worst);
        CHECK(w == 0.0 && m <= 1e-6, "LoRA TP 2 x DP 2, %s: adapters %.3g, metrics %.3g (%s) from zero_stage 0",
              zero_runs[k], w, m, worst);
        printf("colt train --use_peft %s vs zero_stage 0: adapters max |diff| %.2g, metrics %.2g relative\n",
               zero_runs[k], w, m);
    }
    /* resume: a copy of tp2 from its checkpoint-1 (adapters cut on load, each part's optimizer file) */
    sh("cp -r %s/tp2 %s/tp2r", g_tmp, g_tmp);
    char extra[1024], *log = NULL, worst[256];
    snprintf(extra, sizeof extra,
             LORA_ARGS " --lora_dropout 0 --tensor_parallel_size 2 --resume_from_checkpoint %s/tp2r/checkpoint-1",
             g_tmp);
    int rc = train_run(2, extra, "tp2r", &log);
    CHECK(rc == 0, "LoRA resume at TP 2: exit %d: %s", rc, log);
    free(log);
    double w = adapters_diff("tp2", "tp2r"), m = metrics_diff("tp2", "tp2r", worst, sizeof worst);
    CHECK(w == 0.0 && m == 0.0, "LoRA TP 2 resumed from checkpoint-1: adapters %.3g, metrics %.3g (%s)", w, m, worst);
    printf("colt train --use_peft TP 2 resumed from checkpoint-1: adapters max |diff| %.2g, metrics %.2g\n", w, m);
    /* colt generate with the trained adapters, cut across 1 and 2 processes */
    char *outs[2] = {NULL, NULL}, cmd[2048];
    for (int k = 0; k < 2; k++) {
        snprintf(cmd, sizeof cmd,
                 "%s%s%s generate --model " COLT_SOURCE_DIR "/models/stories260K --adapter %s/tp1 --prompt 'Once upon "
                 "a time' --max_new_tokens 30 --n 3 --temperature 0.8 --seed 3 --device cpu --json%s",
                 k ? MPIRUN : "", k ? " -np 2 " : "", COLT_BINARY, g_tmp, k ? " --tensor_parallel_size 2" : "");
        FILE *p = popen(cmd, "r");
        char buf[65536];
        size_t n = p ? fread(buf, 1, sizeof buf - 1, p) : 0;
        buf[n] = '\0';
        int status = p ? pclose(p) : -1;
        CHECK(status == 0 && n > 0, "%s: exit %d", cmd, status);
        outs[k] = strdup(buf);
    }
    CHECK(!strcmp(outs[0], outs[1]), "colt generate --adapter: 1 and 2 processes differ:\n%s\n%s", outs[0], outs[1]);
    printf("colt generate --adapter --tensor_parallel_size 1 / 2: %s\n",
           strcmp(outs[0], outs[1]) ? "DIFFERENT" : "the same 3 sampled completions");
    free(outs[0]);
    free(outs[1]);
#undef LORA_ARGS
    sh("rm -rf %s", g_tmp);
}
#endif

int main(int argc, char **argv) {
    LaunchEnv env;
    char err[ERR_LEN];
    if (launch_env_from_process(&env, err) != 0) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    if (env.launcher == LAUNCHER_OPENMPI) return run_rank(&env, argc > 1 ? atoi(argv[1]) : 2, argc > 2 ? argv[2] : "cpu");
    check_errors();
    setenv("LSAN_OPTIONS", LSAN_OPTIONS_VALUE, 0);
    if (system("command -v mpirun > /dev/null 2>&1") != 0) {
        printf("SKIP: mpirun not found (scripts/setup.sh installs openmpi-bin); the in-process checks passed: %d "
               "failures\n", g_failures);
        return g_failures ? 1 : 77;
    }
    struct {
        int np, tp;
    } runs[] = {{2, 2}, {4, 4}, {4, 2}};
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "%s -np %d %s %d", MPIRUN, runs[r].np, argv[0], runs[r].tp);
        printf("%s\n", cmd);
        fflush(stdout);
        int rc = system(cmd);
        CHECK(rc == 0, "mpirun -np %d, tensor_parallel_size %d: exit status %d", runs[r].np, runs[r].tp, rc);
    }
    check_generate_cli();
    check_train_cli();
    /* Under the sanitizers the LoRA runs are left to the Release suite (11 launches, most multi-rank, 5-10x slower
     * there): their code is the runs above plus LoRA, whose pieces run sanitized in run_rank's check_lora and in
     * test_lora_train. */
#if !defined(__SANITIZE_ADDRESS__)
    check_train_lora_cli();
#else
    printf("test_tp: the LoRA colt train runs run in the Release suite only\n");
#endif
    printf("test_tp: %d checks in the driver, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
