/* memory_plan.c — see memory_plan.h. */
#include "train/memory_plan.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "engine/engine.h"
#include "model/model_train.h"
#include "parallel/optim.h"

#define GB (1024.0 * 1024.0 * 1024.0)
#define TRAIN_HEADROOM MEMORY_PLAN_TRAIN_HEADROOM

static void suggest(MemoryPlan *p, const char *fmt, double a, double b) {
    if (p->n_suggestions >= 8) return;
    snprintf(p->suggestions[p->n_suggestions++], sizeof p->suggestions[0], fmt, a, b);
}

/* The smallest tensor_parallel_size (2, 4 or 8, one the model's heads allow)
 * whose plan fits over the same number of devices, the other settings kept. */
static void suggest_tensor_parallel(MemoryPlan *p, const MemoryPlanInput *in) {
    if (in->tensor_parallel_size > 1) return;
    for (int n = 2; n <= 8; n *= 2) {
        char err[ERR_LEN];
        if (model_tp_check(&in->model, n, err) != 0) continue;
        MemoryPlanInput tin = *in;
        tin.tensor_parallel_size = n;
        tin.world_size = in->world_size / n > 1 ? in->world_size / n : 1;
        tin.gen_seqs = in->gen_seqs * (in->world_size / tin.world_size > 0 ? in->world_size / tin.world_size : 1);
        MemoryPlan tp;
        memory_plan_compute(&tp, &tin);
        if (!tp.fits) continue;
        suggest(p, "tensor_parallel_size: %.0f (every layer cut across that many GPUs: %.1f GB per device)", (double)n,
                tp.peak / GB);
        return;
    }
}

void memory_plan_compute(MemoryPlan *p, const MemoryPlanInput *in) {
    memset(p, 0, sizeof *p);
    Backend plan_be = {.name = in->gpu ? "cuda" : "cpu", .storage = in->storage,
                       .logits_chunk_rows = in->logits_chunk_rows};
    Model *m = model_plan_shell(&in->model, &plan_be, in->lora, in->tensor_parallel_size);
    p->weights = model_weight_bytes(m);
    p->adapters = model_lora_bytes(m);
    size_t trainable = 0;
    model_params_flat(m, &trainable); /* the adapters' layout when LoRA is planned */
    int shards = in->zero_stage >= 1 && in->world_size > 1 ? in->world_size : 1;
    size_t shard = shards > 1 ? optim_shard_elements(trainable, shards) : trainable;
    if (shard > trainable) shard = trainable;
    if (in->zero_stage >= 3 && !in->lora) {
        /* this rank's part, two layer windows and the edges; the whole weights only while generating */
        p->weights_gathered = p->weights;
        p->weights = model_params_partition_plan_bytes(m, shard, true);
    }
    p->reference = in->reference_model ? p->weights : 0;
    for (int k = 0; k < in->n_reward_models; k++) {
        /* as rewards.c holds them: cut like the policy when the shape allows; a part alone under zero_stage 3 */
        char why[ERR_LEN];
        int tp = in->tensor_parallel_size > 1 && model_tp_check(&in->reward_models[k], in->tensor_parallel_size, why) == 0
                     ? in->tensor_parallel_size : 1;
        Model *rm = model_plan_shell(&in->reward_models[k], &plan_be, NULL, tp);
        size_t whole = model_weight_bytes(rm), numel = 0;
        model_params_flat(rm, &numel);
        if (in->zero_stage >= 3 && in->world_size > 1) {
            p->reward_models += model_params_partition_plan_bytes(rm, optim_shard_elements(numel, in->world_size), false);
            if (whole > p->reward_model_gathered) p->reward_model_gathered = whole;
        } else p->reward_models += whole;
        model_free(rm);
    }
    /* zero_stage 2: two layers' windows and the edge stages, plus this rank's shard of the sum */
    p->gradients = in->zero_stage >= 2 ? model_grads_plan_bytes(m, true) : trainable * 4;
    int states = in->offload || in->storage != DTYPE_F32 ? 3 : 2;
    if (in->zero_stage >= 2) p->gradients += (shards > 1 ? shard : trainable) * 4;
    /* the device's part of the state: moments, and fp32 master weights beside low-precision ones */
    const size_t device_state_bytes = 4 * (size_t)(in->storage != DTYPE_F32 ? 3 : 2);
    size_t on_device = in->offload ? optim_offload_split(0, shard, in->offload_device_share) : shard;
    p->host_optimizer = optim_offload_host_bytes(shard - on_device, in->storage);
    p->optimizer = on_device * device_state_bytes;
    int N = in->batch * in->max_seq;
    p->activations_full = train_state_plan_bytes(m, in->batch, in->max_seq, N, false);
    p->activations_recompute = train_state_plan_bytes(m, in->batch, in->max_seq, N, true);
    EngineOptions eo = {.deterministic = in->deterministic, .max_num_seqs = engine_round_max_num_seqs(in->gen_seqs)};
    engine_memory_plan(m, in->gen_seqs > 0 ? in->gen_seqs : 1, in->max_seq, &eo, &p->engine_scratch, &p->kv_min,
                       &p->kv_want, &p->headroom);
    model_free(m);
    p->backend = in->gpu ? (in->backend_scratch ? in->backend_scratch : MEMORY_PLAN_CUDA_OVERHEAD) : 0;

    size_t persistent =
        p->weights + p->adapters + p->reference + p->reward_models + p->gradients + p->optimizer + p->backend;
    double room = in->device_free;
    p->recompute = in->recompute;
    if (!p->recompute && (double)(persistent + p->activations_full + TRAIN_HEADROOM) > room &&
        (double)(persistent + p->activations_recompute + TRAIN_HEADROOM) <= room) {
        p->recompute = true;
        p->recompute_forced = true;
    }
    p->activations = p->recompute ? p->activations_recompute : p->activations_full;
    p->train_peak = persistent + p->activations;
    /* Generation: the activations are given back when the engine needs their room. */
    /* zero_stage 3 generates with the whole weights gathered and its part given back meanwhile; the
     * moment of gathering (and of giving back) holds both, without activations or engine. */
    size_t gen_persistent = persistent, gather_peak = 0;
    if (p->weights_gathered) {
        gen_persistent = persistent - p->weights + p->weights_gathered;
        gather_peak = persistent + p->weights_gathered;
    }
    p->generate_peak = gen_persistent + p->engine_scratch + p->kv_min;
    if (gather_peak > p->generate_peak) p->generate_peak = gather_peak;
    /* scoring under zero_stage 3: a reward model whole beside its part (as gathered), the engine asleep */
    if (persistent + p->reward_model_gathered > p->generate_peak) p->generate_peak = persistent + p->reward_model_gathered;
    p->peak = p->train_peak > p->generate_peak ? p->train_peak : p->generate_peak;
    double engine_wants = (double)(p->engine_scratch + p->kv_want + p->headroom);
    size_t beside = p->train_peak + (gen_persistent - persistent) + p->engine_scratch + p->kv_want;
    if (in->gpu && room - (double)(p->train_peak + (gen_persistent - persistent)) >= engine_wants) {
        p->expected_peak = beside;
        size_t release = gather_peak ? p->train_peak + p->weights_gathered : 0; /* giving the whole back */
        if (release > p->expected_peak) p->expected_peak = release;
    } else {
        double pool_room = room - (double)(gen_persistent + p->engine_scratch + p->headroom);
        size_t pool = !in->gpu || pool_room >= (double)p->kv_want ? p->kv_want : pool_room > 0 ? (size_t)pool_room : 0;
        size_t gen = gen_persistent + p->engine_scratch + pool;
        if (gather_peak > gen) gen = gather_peak;
        p->expected_peak = gen > p->train_peak ? gen : p->train_peak;
    }
    p->fits = (double)(p->train_peak + TRAIN_HEADROOM) <= room && (double)(p->generate_peak + p->headroom) <= room;
    p->fits_host = in->host_bytes <= 0 || (double)p->host_optimizer <= 0.9 * in->host_bytes;
    /* Offloaded with room to spare beside the expected peak: the ratio that would keep more of the state on
     * the device (its share updates there, in milliseconds), rounded up to 0.05. */
    p->offload_ratio_room = -1.0;
    if (in->offload && in->gpu && p->fits && shard > 0) {
        double spare = room - (double)(p->expected_peak + TRAIN_HEADROOM);
        double more = spare > 0 ? spare / (double)device_state_bytes : 0.0;
        double share = fmin(1.0, ((double)on_device + more) / (double)shard);
        p->offload_ratio_room = fmin(1.0, ceil((1.0 - share) * 20.0 - 1e-9) / 20.0);
    }

    if (!p->fits) {
        if (!p->recompute && p->activations_full > p->activations_recompute)
            suggest(p, "gradient_checkpointing: true (activations %.1f GB -> %.1f GB)", p->activations_full / GB,
                    p->activations_recompute / GB);
        if (p->optimizer > 0 && in->world_size > 1 && in->zero_stage == 0)
            suggest(p, "zero_stage: 1 (optimizer state %.1f GB -> %.1f GB per device)", p->optimizer / GB,
                    p->optimizer / GB / in->world_size);
        if (p->optimizer > 0 && in->offload)
            suggest(p, "offload_optimizer_ratio: 1 (moves the %.1f GB of optimizer state kept on the device to the host)",
                    p->optimizer / GB, 0.0);
        else if (p->optimizer > 0)
            suggest(p, "offload_optimizer: cpu (moves %.1f GB of optimizer state to host memory; needs %.1f GB there)",
                    p->optimizer / GB, optim_offload_host_bytes(shard, in->storage) / GB);
        /* ZeRO-1 over r ranks keeps full / r of the state on each: the fewest r that fit. */
        size_t full = trainable * 4 * (size_t)states;
        double other = (double)(p->peak - p->optimizer + TRAIN_HEADROOM), avail = room - other;
        if (p->optimizer > 0 && avail > 0) {
            double ranks = fmax(2.0, ceil(full / avail));
            if (ranks > in->world_size)
                suggest(p, "zero_stage: 1 over at least %.0f ranks (%.1f GB of optimizer state each)", ranks,
                        full / GB / ranks);
        }
        if (p->activations > (size_t)1 << 30)
            suggest(p, "a smaller per_device_train_batch_size with more gradient_accumulation_steps (activations "
                       "%.1f GB for %.0f sequences)",
                    p->activations / GB, (double)in->batch);
        if (in->world_size > 1 && in->zero_stage < 2 && !in->lora)
            suggest(p, "zero_stage: 2 (the gradients, %.1f GB, shard over the %.0f ranks too)", p->gradients / GB,
                    (double)in->world_size);
        if (in->world_size > 1 && in->zero_stage < 3 && !in->lora && p->train_peak + TRAIN_HEADROOM > room)
            suggest(p, "zero_stage: 3 (the weights, %.1f GB, shard over the %.0f ranks while training; gathered whole "
                       "only to generate)",
                    p->weights / GB, (double)in->world_size);
        double whole = (double)(p->weights_gathered ? p->weights_gathered : p->weights);
        if (whole + (double)(p->backend + p->engine_scratch + p->kv_min + p->headroom) > room)
            suggest(p, "generation needs the whole weights (%.1f GB) on each device, and they do not fit in %.1f GB: "
                       "tensor parallelism cuts them",
                    whole / GB, room / GB);
        suggest_tensor_parallel(p, in);
    }
    if (!p->fits_host)
        suggest(p, "the offloaded optimizer state needs %.1f GB of host memory but the host has %.1f GB: more ranks "
                   "(zero_stage 1 splits it) or offload_optimizer: none",
                p->host_optimizer / GB, in->host_bytes / GB);
}

int memory_plan_error(const MemoryPlan *p, const MemoryPlanInput *in, char *err) {
    char parts[ERR_LEN], tips[ERR_LEN / 2] = "";
    snprintf(parts, sizeof parts,
             "weights %.1f GB%s%s, reward models %.1f GB, gradients %.1f GB, optimizer state %.1f GB%s, activations %.1f GB%s, KV cache %.1f GB "
             "(one sequence) + engine scratch %.1f GB, CUDA/backend %.1f GB",
             (p->weights + p->adapters) / GB, p->reference ? " (+ reference model)" : "",
             p->weights_gathered ? " (+ the whole weights while generating)" : "", p->reward_models / GB, p->gradients / GB,
             p->optimizer / GB, in->offload ? " (offloaded)" : "", p->activations / GB,
             p->recompute ? " (with recompute)" : "", p->kv_min / GB, p->engine_scratch / GB, p->backend / GB);
    size_t used = 0;
    for (int i = 0; i < p->n_suggestions && used + 4 < sizeof tips; i++) {
        int w = snprintf(tips + used, sizeof tips - used, "%s%s", i ? "; " : "", p->suggestions[i]);
        if (w < 0) break;
        used += (size_t)w;
    }
    if (!p->fits_host && p->fits)
        return errorf(err, "memory plan: does not fit host memory: %s", tips);
    return errorf(err, "memory plan: needs %.1f GB per device (%s) plus 2 GB headroom, but %.1f GB are free: %s",
                  p->peak / GB, parts, in->device_free / GB, tips);
}

static void row(FILE *fp, const char *part, size_t bytes, const char *note) {
    fprintf(fp, "  %-34s %9.2f GB  %s\n", part, bytes / GB, note ? note : "");
}

void memory_plan_print(const MemoryPlan *p, const MemoryPlanInput *in, FILE *fp) {
    fprintf(fp, "memory plan: %s, %d rank(s), zero_stage %d, optimizer on the %s, %s storage\n",
            in->gpu ? "GPU" : "CPU", in->world_size, in->zero_stage,
            !in->offload ? "device" : p->optimizer ? "host and the device" : "host",
            in->storage == DTYPE_BF16 ? "bf16" : "fp32");
    fprintf(fp, "  per device (%.1f GB, %.1f GB free):\n", in->device_bytes / GB, in->device_free / GB);
    row(fp, "weights", p->weights, p->weights_gathered ? "this rank's part, two layer windows, embedding / lm_head" : NULL);
    if (p->weights_gathered) row(fp, "weights gathered whole", p->weights_gathered, "zero_stage 3: while generating");
    if (p->adapters) row(fp, "LoRA adapters", p->adapters, NULL);
    if (p->reference) row(fp, "reference model", p->reference, "beta > 0");
    if (in->n_reward_models)
        row(fp, "reward models", p->reward_models, p->reward_model_gathered ? "zero_stage 3: this rank's parts" : NULL);
    if (p->reward_model_gathered)
        row(fp, "reward model gathered whole", p->reward_model_gathered, "zero_stage 3: while it scores");
    row(fp, "gradients (fp32)", p->gradients, NULL);
    row(fp, "optimizer state", p->optimizer,
        !in->offload ? NULL : p->optimizer ? "the device's share (offload_optimizer_ratio < 1)" : "offloaded to the host");
    row(fp, "training activations", p->activations,
        p->recompute_forced ? "gradient checkpointing turned on to fit" : p->recompute ? "gradient checkpointing" : NULL);
    row(fp, "generation: engine scratch", p->engine_scratch, NULL);
    char note[96];
    snprintf(note, sizeof note, "one sequence; the whole round wants %.2f GB", p->kv_want / GB);
    row(fp, "generation: KV cache", p->kv_min, note);
    if (in->gpu) row(fp, "CUDA context and backend scratch", p->backend, in->backend_scratch ? NULL : "estimate");
    row(fp, "peak (training)", p->train_peak, NULL);
    row(fp, "peak (generation, least KV)", p->generate_peak, NULL);
    row(fp, "expected peak of a run", p->expected_peak, "the KV pool as large as the round wants and room allows");
    if (p->host_optimizer) {
        fprintf(fp, "  host (%.1f GB):\n", in->host_bytes / GB);
        row(fp, "optimizer state and staging", p->host_optimizer, NULL);
    }
    if (p->offload_ratio_room >= 0 && p->offload_ratio_room < 1.0 - in->offload_device_share - 0.025)
        fprintf(fp, "  the device has room for more of the optimizer state: offload_optimizer_ratio %.2f keeps %.0f%% of "
                    "it there and leaves the host the rest\n",
                p->offload_ratio_room, 100.0 * (1.0 - p->offload_ratio_room));
    fprintf(fp, "  %s\n", p->fits && p->fits_host ? "fits" : "does NOT fit");
    for (int i = 0; i < p->n_suggestions; i++) fprintf(fp, "  - %s\n", p->suggestions[i]);
}

static json_t *gb(size_t bytes) { return json_real(round(bytes / GB * 1e6) / 1e6); } /* to the KB */

json_t *memory_plan_json(const MemoryPlan *p, const MemoryPlanInput *in) {
    json_t *o = json_object(), *dev = json_object(), *host = json_object(), *tips = json_array();
    json_object_set_new(o, "fits", json_boolean(p->fits && p->fits_host));
    json_object_set_new(o, "device_memory_gb", json_real(round(in->device_bytes / GB * 1000.0) / 1000.0));
    json_object_set_new(o, "host_memory_gb", json_real(round(in->host_bytes / GB * 1000.0) / 1000.0));
    json_object_set_new(dev, "weights", gb(p->weights + p->adapters));
    json_object_set_new(dev, "weights_gathered", gb(p->weights_gathered));
    json_object_set_new(dev, "reference_model", gb(p->reference));
    json_object_set_new(dev, "reward_models", gb(p->reward_models));
    json_object_set_new(dev, "reward_model_gathered", gb(p->reward_model_gathered));
    json_object_set_new(dev, "gradients", gb(p->gradients));
    json_object_set_new(dev, "optimizer_state", gb(p->optimizer));
    json_object_set_new(dev, "activations", gb(p->activations));
    json_object_set_new(dev, "engine_scratch", gb(p->engine_scratch));
    json_object_set_new(dev, "kv_cache_min", gb(p->kv_min));
    json_object_set_new(dev, "kv_cache_wanted", gb(p->kv_want));
    json_object_set_new(dev, "backend", gb(p->backend));
    json_object_set_new(dev, "peak", gb(p->peak));
    json_object_set_new(dev, "expected_peak", gb(p->expected_peak));
    json_object_set_new(host, "optimizer_state", gb(p->host_optimizer));
    json_object_set_new(o, "per_device_gb", dev);
    json_object_set_new(o, "host_gb", host);
    json_object_set_new(o, "world_size", json_integer(in->world_size));
    json_object_set_new(o, "zero_stage", json_integer(in->zero_stage));
    json_object_set_new(o, "offload_optimizer", json_string(in->offload ? "cpu" : "none"));
    if (in->offload) json_object_set_new(o, "offload_optimizer_ratio", json_real(1.0 - in->offload_device_share));
    if (p->offload_ratio_room >= 0) json_object_set_new(o, "offload_optimizer_ratio_room", json_real(p->offload_ratio_room));
    json_object_set_new(o, "recompute", json_boolean(p->recompute));
    for (int i = 0; i < p->n_suggestions; i++) json_array_append_new(tips, json_string(p->suggestions[i]));
    json_object_set_new(o, "suggestions", tips);
    return o;
}

double memory_plan_host_total(void) {
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f) return 0;
    char line[256];
    double kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "MemTotal: %lf kB", &kb) == 1) break;
    fclose(f);
    return kb * 1024.0;
}
