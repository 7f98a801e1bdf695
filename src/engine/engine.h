/* engine.h — the generation engine: paged KV cache, continuous batching,
 * sampling on the device, CUDA graphs for decode steps.
 *
 * It computes with the model's own weights (the trainer's, in place: no copy,
 * no sync step) through the same ops as the trainer.
 *
 * Two ways to use it:
 * - engine_generate: complete a set of sequences and return (colt generate,
 *   colt train, colt eval). The KV pool is taken when it starts, from the
 *   memory free at that moment, and given back when it returns, so training
 *   and generation take turns with the device.
 * - A persistent engine (colt serve): engine_create, then requests added and
 *   aborted at any time, engine_step run by the caller's loop reporting each
 *   new token and each finished request. The pool, prefix cache and CUDA
 *   graphs live across requests; engine_sleep gives the device memory back
 *   (requests stay queued) and engine_wake takes it again.
 *   engine_generate is create / add every sequence / step until done / destroy.
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
 * - Weights: every K/V in the pool, every cached block and every recorded graph
 *   was made with the weights of one model_weights_version (model.h). A step
 *   that finds the version moved first forgets them all: running sequences go
 *   back to the queue to be recomputed with the new weights (the tokens they
 *   already have stay), the prefix cache is emptied, the graphs are recorded
 *   again. Whoever changes the weights bumps the version (the optimizer, LoRA,
 *   ZeRO-3 gathers do), so no token is computed from stale weights.
 * - Results are those of generate() (generate.h): same options, same
 *   counter-based RNG keyed by (seed, stream, completion position), so a
 *   sequence's completion does not depend on what else shares its batch.
 *   Requests in one step may have different sampling settings: the sampler
 *   runs once per group of rows with equal settings (rows laid out by group). */
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
    /* Requests will carry a regex (GenerateOptions.regex): engine_memory_plan counts the masks and the
     * logits kept for the policy's log-probs (the engine allocates them with the first such request). */
    bool structured_outputs;
} EngineOptions;

typedef struct EngineStats {
    size_t pool_bytes;        /* the KV pool taken for this call */
    int pool_blocks, block_size;
    int peak_blocks_used;     /* most blocks in use at once */
    int peak_running;         /* most sequences held in the pool at once */
    int preemptions;          /* sequences evicted and recomputed */
    int steps, graph_steps;   /* forward calls; of which replayed CUDA graphs */
    int graphs_captured;      /* CUDA graphs recorded (a bucket's second step, and again after the weights move) */
    int64_t prefill_tokens;   /* prompt (and recomputed) tokens run */
    int64_t decode_tokens;    /* sampled tokens */
    int64_t shared_tokens;    /* tokens not recomputed: their blocks came from the prefix cache */
    int64_t cache_evictions;  /* cached blocks taken back for other tokens */
    size_t device_free_min;   /* least free device memory seen while generating (0 on the CPU) */
    double seconds;
    double decode_seconds;    /* wall time of the pure decode steps (one token per running sequence) */
    double decode_wait_seconds; /* of which waiting for the device's results; the rest is the host's (step
                                 * arrays, copies, launches) */
    double decode_launch_seconds; /* of the host's part, launching the forward: microseconds for a CUDA
                                   * graph's replay; an eager step also pays what is done once per new
                                   * shape (GEMM plans, kernels loaded lazily) */
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

/* max_num_seqs for rounds of n_seqs sequences generated together (a GRPO round, a replica's share
 * of it): the default (256), raised to the whole round up to the largest batch with a CUDA graph
 * (512), as TRL sizes vLLM's max_num_seqs to the per-device generation batch. Never below the
 * default: the same engine also runs other batches (evaluation). */
int engine_round_max_num_seqs(int n_seqs);

/* Completes every sequence (see generate()); stats may be NULL. Errors: those
 * of generate(), a pool too small for one sequence, a stream id above 2^31-1. */
int engine_generate(Model *m, GenSequence *seqs, int n_seqs, const GenerateOptions *opt, const EngineOptions *eo,
                    EngineStats *stats, char *err);

/* ---- the persistent engine ---- */

typedef struct Engine Engine;

/* An engine for sequences of up to max_len tokens (prompt + completion; capped
 * at the model's max_position_embeddings), at most max_seqs of them in the pool
 * at once (capped by eo->max_num_seqs); more wait in its queue. It starts
 * awake: the pool and scratch are taken now. eo may be NULL. Errors: a pool
 * too small for one sequence of max_len, a backend without the engine's ops. */
int engine_create(Engine **out, Model *m, const EngineOptions *eo, int max_len, int max_seqs, char *err);
void engine_destroy(Engine *e); /* NULL is fine; requests still queued are dropped */

/* Queues one sequence to complete: g->prompt / prompt_len / stream as for
 * engine_generate, opt its own settings (sampling, max_new_tokens, stop ids —
 * copied; max_batch is ignored). The engine allocates g->tokens and
 * g->logprobs (room for max_new_tokens) and fills them as it samples; g and
 * g->prompt must stay valid until the request is reported finished or is
 * aborted. id names it in events and engine_abort (unique among live
 * requests). Errors, with nothing queued: those of generate_check, a prompt
 * of max_len tokens or more, a stream id above 2^31-1, a duplicate id. */
int engine_add_request(Engine *e, GenSequence *g, const GenerateOptions *opt, uint64_t id, char *err);

/* What one step (or an add) produced for a request. */
typedef struct EngineEvent {
    uint64_t id;
    int token;           /* the token sampled this step (also in g->tokens), or -1: none */
    float logprob;       /* its log-prob (g->logprobs) */
    bool finished;       /* the request is complete (g->finish says why); the engine holds nothing of it */
} EngineEvent;

/* Runs one forward call over the running and admitted sequences and samples
 * their next tokens; *events (engine-owned, valid until the next engine call)
 * gets one event per sequence that sampled, and one for each request that
 * was complete when added (max_new_tokens 0, no room left). With nothing to
 * run it returns those alone (possibly none). Errors: asleep, a failed
 * forward (the engine should then be destroyed). */
int engine_step(Engine *e, const EngineEvent **events, int *n_events, char *err);

/* engine_generate on an engine that lives on: completes every sequence as
 * engine_generate does (the same results), reusing what the engine holds —
 * its pool and its CUDA graphs, which survive weight changes made in place
 * (model_weights_changed_in_place), so a training loop that generates every
 * step records them once. The engine must be awake, with no requests of its
 * own, and long enough: every prompt + opt->max_new_tokens within
 * engine_max_len (capped at the model's max_position_embeddings, as
 * engine_generate caps it). stats (may be NULL): this call's, as
 * engine_generate's; engine_stats keeps the totals. On error the sequences
 * are freed and the engine should be destroyed. */
int engine_run(Engine *e, GenSequence *seqs, int n_seqs, const GenerateOptions *opt, EngineStats *stats, char *err);

/* One call's counters, for a loop that drives engine_add_request and
 * engine_step itself (agent_loop.c) as engine_run does: engine_call_begin
 * starts the counters from zero, keeping the totals aside; engine_call_end
 * copies this call's into *stats (may be NULL) and adds them to the totals. */
typedef struct EngineCall {
    EngineStats before; /* the totals when the call began */
} EngineCall;
void engine_call_begin(Engine *e, EngineCall *call);
void engine_call_end(Engine *e, EngineCall *call, EngineStats *stats);

/* Requests queued or running (engine_step has work). */
bool engine_has_work(const Engine *e);

/* Drops a live request: its blocks are freed (its cached full blocks stay
 * cached), g keeps the tokens sampled so far, no event follows. Returns 0, or
 * -1 when no live request has that id (already finished, or never added). */
int engine_abort(Engine *e, uint64_t id);

/* Gives the device memory back (KV pool, scratch, graphs, prefix cache);
 * running requests go back to the front of the queue, in order, to be
 * recomputed after engine_wake. engine_wake takes the memory again, sized from
 * what is free then (error: not even one sequence fits; the engine stays
 * asleep). Both are no-ops when already in that state. */
void engine_sleep(Engine *e);
int engine_wake(Engine *e, char *err);
bool engine_awake(const Engine *e);

/* What the engine holds now. */
typedef struct EngineLoad {
    int running, waiting;      /* sequences in the pool; queued */
    int blocks_used, pool_blocks; /* blocks held by running sequences; the pool (0 asleep) */
    int cached_blocks;         /* blocks in the prefix cache that nobody holds */
} EngineLoad;
void engine_load(const Engine *e, EngineLoad *out);
/* Totals since engine_create (seconds: time spent in engine_step; peaks over the engine's life). */
void engine_stats(const Engine *e, EngineStats *out);
int engine_max_len(const Engine *e); /* the longest sequence it takes, prompt included */
Model *engine_model(const Engine *e); /* the model it computes with */
/* Whether a sequence of prompt_len + max_new_tokens (capped at the model's
 * max_position_embeddings) fits the engine; else an error naming `what i`
 * ("engine_run: sequence 3 needs ... but the engine was made for ..."). */
int engine_check_length(const Engine *e, const char *what, int i, int prompt_len, int max_new_tokens, char *err);
/* Whether e is as large as engine_create(max_len, max_seqs) with its options would make it. */
bool engine_fits(const Engine *e, int max_len, int max_seqs);

#endif
