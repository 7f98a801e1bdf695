/* memory_plan.h — what a `colt train` run needs on each device and in host
 * memory, from the model's config.json and the settings alone (no weights
 * loaded), and whether it fits: before any work the trainer refuses a run that
 * cannot fit with one error listing the parts and what would make it fit, and
 * turns gradient checkpointing on when only that makes it fit;
 * `colt train --dry_run` prints the plan for a machine the user may not have.
 *
 * Every figure comes from the functions that size the real allocations
 * (model_plan_shell's model, train_state_plan_bytes, engine_memory_plan,
 * optim_shard_elements), so a plan and a run agree; tests compare them with
 * the backend's memory_stats. */
#ifndef COLT_TRAIN_MEMORY_PLAN_H
#define COLT_TRAIN_MEMORY_PLAN_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

#include "backend/backend.h"
#include "model/lora.h"
#include "model/model.h"

#define MEMORY_PLAN_MAX_REWARD_MODELS 8

typedef struct MemoryPlanInput {
    ModelConfig model;
    DType storage;          /* the backend's storage dtype (cuda: BF16, cpu: F32) */
    int logits_chunk_rows;  /* the backend's */
    bool gpu;               /* a CUDA device: its context and the backend's scratch count */
    size_t backend_scratch; /* the backend's own scratch when known (an open backend), else 0: estimated */
    int world_size, zero_stage; /* world_size: data-parallel ranks (models side by side) */
    int tensor_parallel_size;   /* ranks each model is cut across (0 or 1: whole) */
    bool offload;
    double offload_device_share; /* with offload: the share of the optimizer state kept on the device */
    const LoraConfig *lora;  /* use_peft, or NULL */
    bool reference_model;    /* beta > 0 without LoRA: a second copy of the weights */
    /* Reward models ({type: model}): each cut across the tensor-parallel group when its shape allows, else
     * whole; at zero_stage 3 over several ranks partitioned (its 1/world_size at rest, whole while scoring). */
    ModelConfig reward_models[MEMORY_PLAN_MAX_REWARD_MODELS];
    int n_reward_models;
    int batch;               /* per_device_train_batch_size */
    int max_seq;             /* longest prompt + max_completion_length */
    int gen_seqs;            /* completions this rank generates per round */
    bool deterministic;      /* the engine keeps a batch of logits */
    bool recompute;          /* gradient_checkpointing asked for */
    double device_bytes;     /* memory of one device (total) */
    double device_free;      /* free before colt allocates (the total when planning for another machine) */
    double host_bytes;       /* host memory (total); 0: unknown */
} MemoryPlanInput;

/* Bytes, per device (rank) unless named host. */
typedef struct MemoryPlan {
    size_t weights, adapters, reference, gradients, optimizer;
    size_t weights_gathered; /* zero_stage 3: the whole weights, gathered while generating (0 otherwise) */
    size_t reward_models;    /* the reward models' weights at rest (zero_stage 3: this rank's parts) */
    size_t reward_model_gathered; /* zero_stage 3: the largest reward model whole, while it scores (0 otherwise) */
    size_t activations_full, activations_recompute, activations; /* the chosen one */
    size_t engine_scratch, kv_min, kv_want, headroom, backend;
    size_t host_optimizer; /* offloaded state and staging */
    /* offload_optimizer cpu on a GPU that fits with room to spare: the smallest ratio (in steps of 0.05) whose
     * device share still fits beside the expected peak; -1 otherwise */
    double offload_ratio_room;
    size_t train_peak, generate_peak, peak; /* peak: the larger of the two (what must fit) */
    /* What a run is expected to reach: the engine runs beside the activations
     * when the room allows its whole round (it then takes the round's pool),
     * else they are given back and the pool takes what is free, up to the
     * round's need; no device memory to ask (the CPU): given back. */
    size_t expected_peak;
    bool recompute;     /* chosen: asked for, or needed to fit */
    bool recompute_forced; /* turned on by the plan */
    bool fits, fits_host;
    int n_suggestions;
    char suggestions[8][200];
} MemoryPlan;

/* The CUDA context, cuBLAS and the backend's scratch when no backend is open
 * to ask (measured on H100 / H200: see docs/zero.md). */
#define MEMORY_PLAN_CUDA_OVERHEAD ((size_t)1 << 30)
/* What the trainer leaves free beside its activations. */
#define MEMORY_PLAN_TRAIN_HEADROOM ((size_t)2 << 30)

void memory_plan_compute(MemoryPlan *p, const MemoryPlanInput *in);
/* One error line: the parts in GB and what would make it fit. */
int memory_plan_error(const MemoryPlan *p, const MemoryPlanInput *in, char *err);
/* A table for people (the log, --dry_run). */
void memory_plan_print(const MemoryPlan *p, const MemoryPlanInput *in, FILE *fp);
/* --dry_run --json: {"fits", "device_memory_gb", "host_memory_gb", "per_device_gb": {part: GB}, "host_gb":
 * {part: GB}, "world_size", "zero_stage", "recompute", "suggestions": [..]}. */
json_t *memory_plan_json(const MemoryPlan *p, const MemoryPlanInput *in);

/* Host memory of this machine (MemTotal), 0 when unknown. */
double memory_plan_host_total(void);

#endif
