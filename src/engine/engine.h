/* engine.h — the generation engine: paged KV cache, continuous batching,
 * sampling on the device, CUDA graphs for decode steps.
 *
 * It computes with the model's own weights (the trainer's, in place: no copy,
 * no sync step) through the same ops as the trainer. The KV pool is taken when
 * engine_generate starts, from the memory free at that moment, and given back
 * when it returns, so training and generation take turns with the device.
 *
 * - Pool: fixed-size blocks; a block table per sequence. Prefix caching:
 *   every full block is cached under its content (the tokens up to its end),
 *   and a sequence admitted later takes the cached blocks its tokens start
 *   with instead of recomputing them — GRPO's G completions of a prompt (and
 *   --n) prefill the prompt once, prompts sharing a system prompt or few-shot
 *   examples share those blocks, a preempted sequence finds its blocks again
 *   while nothing has reused them. Each sequence recomputes at least its last
 *   known token, in a block of its own (copy-on-write by recomputing the first
 *   block it may write). Cached blocks nobody holds are reused least recently
 *   used first.
 * - Scheduler: every step runs one forward call that mixes decode tokens of
 *   running sequences and prefill chunks of waiting ones, admitting new
 *   sequences as others finish. When the pool is full it preempts the most
 *   recently admitted sequence (its blocks are freed; it is recomputed later
 *   from its prompt and the tokens it already has), so no request fails for
 *   lack of memory as long as one sequence fits.
 * - Results are those of generate() (generate.h): same options, same
 *   counter-based RNG keyed by (seed, stream, completion position), so a
 *   sequence's completion does not depend on what else shares its batch. */
#ifndef COLT_ENGINE_ENGINE_H
#define COLT_ENGINE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/generate.h"

/* vLLM's names where vLLM has the setting. Zero means the default. */
typedef struct EngineOptions {
    int block_size;              /* tokens per KV block (16) */
    double gpu_memory_utilization; /* cap of the KV pool, fraction of total device memory (0 = what is free) */
    int max_num_seqs;            /* sequences running at once (256) */
    int max_num_batched_tokens;  /* tokens per forward call (4096) */
    bool enforce_eager;          /* no CUDA graphs */
    bool no_prefix_caching;      /* vLLM's enable_prefix_caching = False: no block is shared */
    int max_pool_blocks;         /* test hook: a smaller pool, to exercise preemption (0 = off) */
    /* Deterministic mode: turns the backend's batch-invariant kernels on (for the
     * rest of the process: backend.h set_batch_invariant), so a completion does not
     * depend on the batch it ran in, and returns the trainer's log-probs —
     * log_softmax(logits / temperature) of the sampled token by the trainer's own
     * op (temperature 1 when greedy; no top-k/top-p/min-p renormalisation, no
     * repetition penalty) — bit-identical to model_train_forward's in that mode. */
    bool deterministic;
} EngineOptions;

typedef struct EngineStats {
    size_t pool_bytes;        /* the KV pool taken for this call */
    int pool_blocks, block_size;
    int peak_blocks_used;     /* most blocks in use at once */
    int peak_running;         /* most sequences held in the pool at once */
    int preemptions;          /* sequences evicted and recomputed */
    int steps, graph_steps;   /* forward calls; of which replayed CUDA graphs */
    int64_t prefill_tokens;   /* prompt (and recomputed) tokens run */
    int64_t decode_tokens;    /* sampled tokens */
    int64_t shared_tokens;    /* tokens not recomputed: their blocks came from the prefix cache */
    int64_t cache_evictions;  /* cached blocks taken back for other tokens */
    size_t device_free_min;   /* least free device memory seen while generating (0 on the CPU) */
    double seconds;
    double decode_seconds;    /* wall time of the pure decode steps (one token per running sequence) */
    int64_t decode_step_tokens; /* tokens sampled in those steps */
} EngineStats;

/* The device bytes engine_generate prefers for n_seqs sequences of up to
 * max_len tokens: the pool with every running sequence at full length, its
 * scratch and the headroom it leaves free. With less free it takes a smaller
 * pool and preempts when it must; the trainer gives its activations back
 * only when free memory is below this. eo may be NULL. */
size_t engine_memory_wanted(const Model *m, int n_seqs, int max_len, const EngineOptions *eo);
/* The parts of it: the engine's scratch, the KV pool for one sequence at full
 * length (the least it runs with) and for all of them at once (what it takes
 * when free), and the headroom it leaves free. */
void engine_memory_plan(const Model *m, int n_seqs, int max_len, const EngineOptions *eo, size_t *scratch,
                        size_t *pool_min, size_t *pool_want, size_t *headroom);

/* Completes every sequence (see generate()); stats may be NULL. Errors: those
 * of generate(), a pool too small for one sequence, a stream id above 2^31-1. */
int engine_generate(Model *m, GenSequence *seqs, int n_seqs, const GenerateOptions *opt, const EngineOptions *eo,
                    EngineStats *stats, char *err);

#endif
