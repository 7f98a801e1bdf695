/* bench_decode.c — decode throughput of the generation engine on the GPU
 * against the HBM roofline, for Qwen2.5-shaped random models (bf16).
 *
 * Each configuration: `batch` distinct prompts of PROMPT_LEN random tokens,
 * NEW_TOKENS sampled tokens each (temperature 1, eos ignored), through
 * engine_generate with CUDA graphs. Decode tok/s counts only the pure decode
 * steps (one token per sequence; wall time including the host's scheduling
 * and the per-step copy of the sampled tokens). Roofline: one decode step must
 * read every weight once plus each sequence's K/V so far, and do 2 FLOPs per
 * weight per sequence, so step time >= max(bytes / 4.8e12 B/s, 2 * weights *
 * batch / 989e12 FLOP/s) with bytes = weight bytes + batch * mean context *
 * K/V bytes per token (attention FLOPs left out: under 3% here).
 * Usage: bench_decode [preset ...]  (0.5b 1.5b 7b 8b; default the first three)
 * "with prefill tok/s" is every sampled token over the whole engine_generate call (prefill, decode,
 * scheduling): the figure offline benchmarks such as vLLM's "output tokens/s" report.
 * COLT_BATCHES="1 8 64": the batch sizes (default 1 2 4 8 16 32 64 128 256 512).
 * COLT_PROMPT_LEN=512, COLT_DECODE_TOKENS=128: other prompt and completion lengths.
 * COLT_PROMPT_COPIES=8: each prompt that many times in a row (a GRPO round's layout; default 1, all distinct).
 * COLT_LORA_R=16: LoRA adapters of that rank on every linear layer (PEFT's fresh ones: B = 0).
 * COLT_WARMUP=0: no untimed run of each batch first (the figures then include one-time costs).
 * COLT_PROFILE=1: eager steps with every op timed between synchronisations
 * (attribution only: the synchronisations dominate small ops).
 * COLT_DETERMINISTIC=1: the engine's deterministic mode (batch-invariant kernels). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_bench.h"
#include "backend/profile.h"
#include "core/error.h"
#include "core/rng.h"
#include "engine/engine.h"
#include "model/lora.h"
#include "model/model.h"

#include "bench_gpu_shapes.h"

#define PROMPT_LEN 128 /* COLT_PROMPT_LEN overrides */
#define NEW_TOKENS 128 /* COLT_DECODE_TOKENS overrides (short runs under a profiler) */

static int env_int(const char *name, int fallback) {
    const char *e = getenv(name);
    return e && atoi(e) > 0 ? atoi(e) : fallback;
}
#define PROMPT_TOKENS env_int("COLT_PROMPT_LEN", PROMPT_LEN)
#define DECODE_TOKENS env_int("COLT_DECODE_TOKENS", NEW_TOKENS)
#define HBM_BYTES_PER_S 4.8e12
#define BF16_FLOP_PER_S 989e12

/* COLT_DETERMINISTIC=1: the engine's deterministic mode. */
static bool deterministic_mode(void) {
    const char *e = getenv("COLT_DETERMINISTIC");
    return e && atoi(e) > 0;
}

static int run(Model *m, int batch, bool eager, EngineStats *st, char *err) {
    const ModelConfig *c = model_config(m);
    const int prompt_len = PROMPT_TOKENS;
    int *prompts = malloc(sizeof(int) * (size_t)batch * prompt_len);
    const int copies = env_int("COLT_PROMPT_COPIES", 1); /* GRPO's layout: each prompt this many times in a row */
    for (int i = 0; i < batch * prompt_len; i++)
        prompts[i] = (int)(rng_uniform(7, (uint64_t)(i / prompt_len / copies), (uint64_t)i % prompt_len) *
                           (c->vocab_size - 1));
    GenSequence *seqs = calloc((size_t)batch, sizeof(GenSequence));
    for (int i = 0; i < batch; i++) {
        seqs[i].prompt = prompts + (size_t)i * prompt_len;
        seqs[i].prompt_len = prompt_len;
        seqs[i].stream = (uint64_t)i;
    }
    GenerateOptions opt = {.sampling = {.temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.0f, .seed = 1},
                           .max_new_tokens = DECODE_TOKENS,
                           .ignore_eos = true};
    EngineOptions eo = {.max_num_seqs = batch, .enforce_eager = eager,
                        .deterministic = deterministic_mode()};
    int rc = engine_generate(m, seqs, batch, &opt, &eo, st, err);
    for (int i = 0; i < batch && rc == 0; i++) gen_sequence_free(&seqs[i]);
    free(seqs);
    free(prompts);
    return rc;
}

int main(int argc, char **argv) {
    const Backend *be = backend_cuda();
    if (!be) {
        printf("no CUDA device\n");
        return 77;
    }
    const bool profile = getenv("COLT_PROFILE") && atoi(getenv("COLT_PROFILE")) > 0;
    const bool warmup = !(getenv("COLT_WARMUP") && strcmp(getenv("COLT_WARMUP"), "0") == 0);
    if (profile) be = backend_profile_wrap(be);
    const char *want[8] = {"0.5b", "1.5b", "7b"};
    int n_want = 3;
    if (argc > 1) {
        n_want = argc - 1 < 8 ? argc - 1 : 8;
        for (int i = 0; i < n_want; i++) want[i] = argv[i + 1];
    }
    int batches[32] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512}, n_batches = 10;
    if (getenv("COLT_BATCHES")) {
        n_batches = 0;
        char *list = strdup(getenv("COLT_BATCHES"));
        for (char *tok = strtok(list, " ,"); tok && n_batches < 32; tok = strtok(NULL, " ,"))
            batches[n_batches++] = atoi(tok);
        free(list);
    }
    printf("Decode throughput, engine_generate on %s (bf16, CUDA graphs%s), prompts %d tokens (each %d times), "
           "%d new tokens each, temperature 1%s%s\n\n", be->name,
           deterministic_mode() ? ", deterministic mode" : "",
           PROMPT_TOKENS, env_int("COLT_PROMPT_COPIES", 1), DECODE_TOKENS,
           warmup && !profile ? ", each batch timed on its second run" : "",
           env_int("COLT_LORA_R", 0) > 0 ? ", LoRA adapters on every linear layer" : "");
    printf("| model | batch | decode tok/s | ms/step | of which waiting for the GPU | of which launching the forward | "
           "roofline tok/s | %% of roofline | with prefill tok/s | graph steps | graphs recorded | eager tok/s |\n"
           "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    char err[ERR_LEN];
    for (int w = 0; w < n_want; w++) {
        const Shape *s;
        Model *m = shape_random_model(want[w], be, &s);
        if (!m) continue;
        const int lora_r = env_int("COLT_LORA_R", 0);
        LoraConfig lora = {.r = lora_r, .alpha = 2.0f * lora_r, .targets = LORA_ALL_TARGETS};
        if (lora_r > 0 && model_lora_attach(m, &lora, 1, err) != 0) {
            printf("| %s | LoRA: %s |\n", s->name, err);
            model_free(m);
            continue;
        }
        /* Bytes a decode step must move: weights (the embedding table only
         * through the lm_head when tied) and the K/V read so far. */
        double weight_bytes = (double)model_weight_bytes(m);
        if (!s->tied) weight_bytes -= 2.0 * s->vocab * s->hidden; /* the input embedding: only the batch's rows */
        double kv_token_bytes = 2.0 * s->layers * s->kv_heads * (s->hidden / s->heads) * 2.0;
        double mean_ctx = PROMPT_TOKENS + DECODE_TOKENS / 2.0;
        for (int bi = 0; bi < n_batches; bi++) {
            int batch = batches[bi];
            EngineStats st, st_eager;
            /* the untimed first run pays what a process pays once per shape: kernels loaded lazily, GEMM plans,
             * the deterministic mode's timing of its split-K-free algorithms (tens of ms a new row count) */
            if (!profile && warmup && run(m, batch, false, &st, err) != 0) {
                printf("| %s | %d | error: %s |\n", s->name, batch, err);
                continue;
            }
            if (run(m, batch, profile, &st, err) != 0) { /* profiled: eager, each op timed */
                printf("| %s | %d | error: %s |\n", s->name, batch, err);
                continue;
            }
            double eager_tps = 0;
            if (!profile && batch <= 8 && run(m, batch, true, &st_eager, err) == 0 && st_eager.decode_seconds > 0)
                eager_tps = st_eager.decode_step_tokens / st_eager.decode_seconds;
            double tps = st.decode_seconds > 0 ? st.decode_step_tokens / st.decode_seconds : 0;
            double step_bytes = weight_bytes + batch * mean_ctx * kv_token_bytes;
            double step_flops = 2.0 * (weight_bytes / 2.0) * batch;
            double roof_s = step_bytes / HBM_BYTES_PER_S > step_flops / BF16_FLOP_PER_S
                                ? step_bytes / HBM_BYTES_PER_S : step_flops / BF16_FLOP_PER_S;
            double roof = batch / roof_s;
            double e2e = st.seconds > 0 ? st.decode_tokens / st.seconds : 0;
            /* the decode steps' wait for the device's results and their launch of the forward, per step; the rest of a
             * step is the host's */
            double steps = st.decode_step_tokens > 0 ? (double)st.decode_step_tokens / batch : 0;
            printf("| %s | %d | %.0f | %.3f | %.3f | %.3f | %.0f | %.1f%% | %.0f | %d/%d | %d |", s->name, batch, tps,
                   tps > 0 ? 1e3 * batch / tps : 0, steps > 0 ? 1e3 * st.decode_wait_seconds / steps : 0,
                   steps > 0 ? 1e3 * st.decode_launch_seconds / steps : 0, roof, 100 * tps / roof, e2e,
                   st.graph_steps, st.steps, st.graphs_captured);
            if (eager_tps > 0) printf(" %.0f |\n", eager_tps);
            else printf(" |\n");
            if (profile) backend_profile_report(be, stdout);
            fflush(stdout);
        }
        model_free(m);
    }
    printf("\nCommand: build-cuda/bench_decode %s; hardware: see nvidia-smi in the run log.\n", "[presets]");
    return 0;
}
