/* bench_agent.c — multi-turn generation with tool latency (agent_loop.h)
 * against the same number of tokens generated single-turn (issue 39): does
 * parking a conversation while its tool runs keep the device busy?
 *
 * Setup, per model and number of conversations N: N distinct prompts of
 * PROMPT_LEN random tokens, sampled at temperature 1 from a random-weight
 * Qwen2.5-shaped model. A turn ends at a stop id: every TURN_TOKENS-th token
 * id is one, so on a random model (near-uniform next-token distribution) a
 * turn is about TURN_TOKENS tokens, geometrically distributed, as real turns
 * vary. Every ended turn "calls a tool" while the conversation may
 * (max_tool_calling_iterations = ROUNDS); its result, RESULT_TOKENS fixed ids,
 * is ready LATENCY ms of wall clock after the call. The completion budget
 * (max_new_tokens) is BUDGET, twice the mean conversation, so it rarely cuts.
 * Modes, with the same scripted handler:
 * - parked: results come back as soon as they are ready (agent_generate as
 *   the trainer runs it: the other conversations keep decoding);
 * - lockstep: results are held until no conversation is generating, then all
 *   come back LATENCY later — TRL's loop, where the whole batch waits for its
 *   slowest turn and then for the tools, round after round.
 * Single-turn, two baselines over the same prompts, eos ignored:
 * engine_generate with max_new_tokens = the parked L=0 run's mean model
 * tokens per conversation (the same tokens, equal lengths), and the
 * persistent engine with each sequence's max_new_tokens = its conversation's
 * model tokens ("own lengths": the same tokens and the same length tail, no
 * turns). The bounds for a row: ideal = the row's model tokens at the
 * own-lengths rate (tool latency fully hidden, turns free); naive = ideal +
 * rounds x latency (every round the whole batch waits for the tools once).
 * Turn lengths depend only on the RNG (seed, stream, position), so the rows
 * of one N generate the same tokens up to the bf16 GEMMs' batch dependence.
 *
 * Not measured: tool execution itself (a sleep stands for it), parsing of
 * calls, chat templates. The host checks each sampled token against the stop
 * ids by a linear scan (engine.c is_stop), vocab / TURN_TOKENS ids here; the
 * "stop scan" figure times that scan over the tokens sampled (it is in the
 * multi-turn rows, not the single-turn run, which ignores eos).
 *
 * Usage: bench_agent [--cpu] [preset ...]   (GPU: 0.5b 1.5b 7b, default 0.5b;
 *        --cpu: the CPU backend, preset tiny, a sanity check; CPU builds have it too;
 *        OMP_NUM_THREADS=1 on a shared machine, where OpenMP's spinning threads make it 50x slower)
 * COLT_CONVS="64 256" (CPU "8 32"), COLT_LATENCIES_MS="0 50 200", COLT_ROUNDS=3,
 * COLT_TURN_TOKENS=64, COLT_RESULT_TOKENS=24, COLT_PROMPT_LEN=128,
 * COLT_BUDGET (default 2 x ((ROUNDS+1) x TURN_TOKENS + ROUNDS x RESULT_TOKENS)),
 * COLT_LOCKSTEP=0: parked rows only; COLT_REPEATS=3: each run three times, the fastest kept. */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agent/agent_loop.h"
#include "backend/backend.h"
#include "core/error.h"
#include "core/log.h"
#include "core/rng.h"
#include "engine/engine.h"
#include "model/model.h"

#include "bench_gpu_shapes.h"

static int env_int(const char *name, int fallback) {
    const char *e = getenv(name);
    return e && atoi(e) > 0 ? atoi(e) : fallback;
}

/* A whitespace- or comma-separated list of non-negative integers from the
 * environment, or the fallback. Returns how many. */
static int env_list(const char *name, const char *fallback, int *out, int cap) {
    const char *e = getenv(name);
    char *list = strdup(e && *e ? e : fallback);
    int n = 0;
    for (char *tok = strtok(list, " ,"); tok && n < cap; tok = strtok(NULL, " ,")) out[n++] = atoi(tok);
    free(list);
    return n;
}

/* The sanity-check model for the CPU backend. */
static const Shape TINY = {"tiny", 64, 128, 2, 4, 2, 4096, true};

typedef struct Setup {
    int n_convs, prompt_len, turn_tokens, result_tokens, rounds, budget;
    int *prompts;      /* [n_convs, prompt_len] */
    int *stop;         /* [n_stop] */
    int n_stop;
} Setup;

/* ---- the scripted tools: a result LATENCY after each call ---- */

typedef struct Tools {
    const Setup *setup;
    double latency_s;
    bool lockstep;
    int vocab;
    /* per conversation */
    double *ready_at;      /* [n]: when its pending result is ready; < 0: none pending */
    int *completion_len;   /* [n]: completion tokens so far (the loop's n_tokens) */
    int *result_ids;       /* [n, result_tokens] */
    int *calls;            /* [n] */
    AgentToolResult *ready;
    int generating;        /* conversations with a turn queued or running (lockstep's barrier) */
    double barrier_at;     /* lockstep: when the held results come back; < 0: not yet set */
} Tools;

static int tools_turn_ended(void *ctx, int c, const int *context, int n_context, const int *turn, int n,
                            FinishReason finish, bool may_call, bool *called, char *err) {
    (void)context, (void)turn, (void)finish, (void)err;
    Tools *t = ctx;
    const Setup *s = t->setup;
    t->generating--;
    t->completion_len[c] = n_context - s->prompt_len + n;
    *called = may_call;
    if (!may_call) return COLT_OK;
    t->calls[c]++;
    t->ready_at[c] = time_now() + t->latency_s;
    int *ids = t->result_ids + (size_t)c * s->result_tokens;
    for (int k = 0; k < s->result_tokens; k++)
        ids[k] = (int)((7919u * (unsigned)c + 104729u * (unsigned)k + 31u * (unsigned)t->calls[c]) % (unsigned)t->vocab);
    return COLT_OK;
}

static void sleep_s(double s) {
    if (s <= 0) return;
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* Parked: each result once its own time has come. Lockstep: none while any
 * conversation is generating; then all, latency after the last turn ended.
 * With nothing ready, sleeps up to wait_s (the loop passes 0 while the engine
 * has work) or until the next result is due. */
static int tools_poll(void *ctx, double wait_s, const AgentToolResult **ready, int *n_ready, char *err) {
    (void)err;
    Tools *t = ctx;
    const Setup *s = t->setup;
    int n = 0;
    for (int attempt = 0; attempt < 2 && n == 0; attempt++) {
        double now = time_now(), next = -1;
        if (t->lockstep) {
            bool pending = false;
            for (int c = 0; c < s->n_convs && !pending; c++) pending = t->ready_at[c] >= 0;
            if (pending && t->generating == 0) {
                if (t->barrier_at < 0) t->barrier_at = now + t->latency_s;
                next = t->barrier_at;
            }
        } else {
            for (int c = 0; c < s->n_convs; c++)
                if (t->ready_at[c] >= 0 && (next < 0 || t->ready_at[c] < next)) next = t->ready_at[c];
        }
        for (int c = 0; next >= 0 && c < s->n_convs; c++) {
            if (t->ready_at[c] < 0 || (t->lockstep ? t->barrier_at : t->ready_at[c]) > now) continue;
            t->ready[n++] = (AgentToolResult){.conversation = c, .ids = t->result_ids + (size_t)c * s->result_tokens,
                                              .n = s->result_tokens};
            t->ready_at[c] = -1;
            /* the loop starts its next turn unless the result does not fit or fills the budget */
            if (t->completion_len[c] + s->result_tokens < s->budget) t->generating++;
        }
        if (n > 0 && t->lockstep) t->barrier_at = -1;
        if (n == 0 && attempt == 0 && wait_s > 0 && next >= 0) sleep_s(next - now < wait_s ? next - now : wait_s);
        else break;
    }
    *ready = t->ready;
    *n_ready = n;
    return COLT_OK;
}

/* ---- one run of each kind ---- */

typedef struct Result {
    int64_t model_tokens, tool_tokens;
    int max_rounds;
    double seconds;
    EngineStats st;
} Result;

static const SamplingParams SAMPLING = {.temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.0f, .seed = 1};

/* lens (NULL: not wanted) gets each conversation's model tokens. */
static int run_agent(Model *m, const Setup *s, double latency_s, bool lockstep, int *lens, Result *r, char *err) {
    const int n = s->n_convs;
    Tools t = {.setup = s, .latency_s = latency_s, .lockstep = lockstep, .vocab = model_config(m)->vocab_size,
               .generating = n, .barrier_at = -1};
    t.ready_at = malloc(sizeof(double) * (size_t)n);
    t.completion_len = calloc((size_t)n, sizeof(int));
    t.calls = calloc((size_t)n, sizeof(int));
    t.result_ids = malloc(sizeof(int) * (size_t)n * s->result_tokens);
    t.ready = malloc(sizeof(AgentToolResult) * (size_t)n);
    for (int c = 0; c < n; c++) t.ready_at[c] = -1;
    AgentConversation *convs = calloc((size_t)n, sizeof(AgentConversation));
    for (int c = 0; c < n; c++)
        convs[c] = (AgentConversation){.prompt = s->prompts + (size_t)c * s->prompt_len, .prompt_len = s->prompt_len,
                                       .stream = (uint64_t)c};
    AgentTools tools = {.ctx = &t, .turn_ended = tools_turn_ended, .poll = tools_poll};
    GenerateOptions go = {.sampling = SAMPLING, .max_new_tokens = s->budget, .stop_ids = s->stop,
                          .n_stop_ids = s->n_stop};
    EngineOptions eo = {.max_num_seqs = n};
    AgentLoopOptions lo = {.max_tool_calling_iterations = s->rounds, .idle_wait_s = 0.05};
    double t0 = time_now();
    int rc = agent_generate(m, convs, n, &go, &eo, &tools, &lo, &r->st, err);
    r->seconds = time_now() - t0;
    r->model_tokens = r->tool_tokens = 0;
    r->max_rounds = 0;
    for (int c = 0; rc == 0 && c < n; c++) {
        for (int k = 0; k < convs[c].n_tokens; k++) {
            r->model_tokens += convs[c].model_mask[k];
            r->tool_tokens += !convs[c].model_mask[k];
        }
        if (convs[c].tool_rounds > r->max_rounds) r->max_rounds = convs[c].tool_rounds;
        if (lens) {
            lens[c] = 0;
            for (int k = 0; k < convs[c].n_tokens; k++) lens[c] += convs[c].model_mask[k];
        }
        agent_conversation_free(&convs[c]);
    }
    free(convs);
    free(t.ready_at), free(t.completion_len), free(t.calls), free(t.result_ids), free(t.ready);
    return rc;
}

static int run_single(Model *m, const Setup *s, int max_new, Result *r, char *err) {
    const int n = s->n_convs;
    GenSequence *seqs = calloc((size_t)n, sizeof(GenSequence));
    for (int i = 0; i < n; i++)
        seqs[i] = (GenSequence){.prompt = s->prompts + (size_t)i * s->prompt_len, .prompt_len = s->prompt_len,
                                .stream = (uint64_t)i};
    GenerateOptions go = {.sampling = SAMPLING, .max_new_tokens = max_new, .ignore_eos = true};
    EngineOptions eo = {.max_num_seqs = n};
    double t0 = time_now();
    int rc = engine_generate(m, seqs, n, &go, &eo, &r->st, err);
    r->seconds = time_now() - t0;
    r->model_tokens = 0, r->tool_tokens = 0, r->max_rounds = 0;
    for (int i = 0; rc == 0 && i < n; i++) {
        r->model_tokens += seqs[i].n_tokens;
        gen_sequence_free(&seqs[i]);
    }
    free(seqs);
    return rc;
}

/* Single-turn with each sequence's own length, lens[i] tokens (eos ignored),
 * through the persistent engine (engine_generate takes one max_new_tokens
 * for all): the conversations' tokens without turns or tools. */
static int run_matched(Model *m, const Setup *s, const int *lens, Result *r, char *err) {
    const int n = s->n_convs;
    int longest = 1;
    for (int i = 0; i < n; i++) longest = lens[i] > longest ? lens[i] : longest;
    GenSequence *seqs = calloc((size_t)n, sizeof(GenSequence));
    EngineOptions eo = {.max_num_seqs = n};
    Engine *e = NULL;
    double t0 = time_now();
    int rc = engine_create(&e, m, &eo, s->prompt_len + longest, n, err);
    for (int i = 0; rc == 0 && i < n; i++) {
        seqs[i] = (GenSequence){.prompt = s->prompts + (size_t)i * s->prompt_len, .prompt_len = s->prompt_len,
                                .stream = (uint64_t)i};
        GenerateOptions go = {.sampling = SAMPLING, .max_new_tokens = lens[i] > 0 ? lens[i] : 1, .ignore_eos = true};
        rc = engine_add_request(e, &seqs[i], &go, (uint64_t)i, err);
    }
    while (rc == 0 && engine_has_work(e)) {
        const EngineEvent *events;
        int n_events;
        rc = engine_step(e, &events, &n_events, err);
    }
    if (e) engine_stats(e, &r->st);
    engine_destroy(e);
    r->seconds = time_now() - t0;
    r->model_tokens = 0, r->tool_tokens = 0, r->max_rounds = 0;
    for (int i = 0; i < n; i++) {
        if (rc == 0) r->model_tokens += seqs[i].n_tokens;
        gen_sequence_free(&seqs[i]);
    }
    free(seqs);
    return rc;
}

typedef enum { RUN_PARKED, RUN_LOCKSTEP, RUN_SINGLE, RUN_MATCHED } RunKind;

/* COLT_REPEATS runs of one kind, the fastest kept (the device's run-to-run
 * spread). max_new: RUN_SINGLE's length; lens: RUN_MATCHED's lengths, or
 * where the agent runs put each conversation's model tokens (may be NULL). */
static int run_best(Model *m, const Setup *s, RunKind kind, double latency_s, int max_new, int *lens, Result *r,
                    char *err) {
    int repeats = env_int("COLT_REPEATS", 1);
    for (int k = 0; k < repeats; k++) {
        Result one;
        int rc = kind == RUN_SINGLE    ? run_single(m, s, max_new, &one, err)
                 : kind == RUN_MATCHED ? run_matched(m, s, lens, &one, err)
                                       : run_agent(m, s, latency_s, kind == RUN_LOCKSTEP, lens, &one, err);
        if (rc != 0) return rc;
        if (k == 0 || one.seconds < r->seconds) *r = one;
    }
    return COLT_OK;
}

/* Seconds the host spends checking `tokens` sampled tokens against the stop
 * ids as engine.c's is_stop does (a linear scan; almost no token is one). */
static double stop_scan_seconds(const Setup *s, int64_t tokens, int vocab) {
    volatile int hits = 0;
    int64_t reps = tokens < 200000 ? tokens : 200000;
    double t0 = time_now();
    for (int64_t i = 0; i < reps; i++) {
        int token = (int)((i * 2654435761u) % (unsigned)vocab);
        for (int k = 0; k < s->n_stop; k++)
            if (s->stop[k] == token) {
                hits = hits + 1;
                break;
            }
    }
    double dt = time_now() - t0;
    return reps > 0 ? dt * (double)tokens / (double)reps : 0;
}

/* ---- the table ---- */

/* "NVIDIA H200, 143771 MiB, 570.86.15 (cuda backend, device 0)" from nvidia-smi, or the CPU's model name. */
static void hardware_line(const Backend *be, bool cpu, char *out, size_t cap) {
    snprintf(out, cap, "%s backend, device %d", be->name, be->device);
    char cmd[200], line[256] = "";
    if (cpu) snprintf(cmd, sizeof cmd, "grep -m1 'model name' /proc/cpuinfo | cut -d: -f2");
    else
        snprintf(cmd, sizeof cmd,
                 "nvidia-smi -i %d --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null",
                 be->device);
    FILE *p = popen(cmd, "r");
    if (!p) return;
    if (!fgets(line, sizeof line, p)) line[0] = 0;
    pclose(p);
    size_t used = strlen(line);
    while (used && (line[used - 1] == '\n' || line[used - 1] == ' ')) line[--used] = 0;
    const char *name = line + strspn(line, " ");
    if (!*name) return;
    if (cpu) snprintf(out, cap, "%s, %ld CPUs (%s backend)", name, sysconf(_SC_NPROCESSORS_ONLN), be->name);
    else snprintf(out, cap, "%s (%s backend, device %d)", name, be->name, be->device);
}

static void print_command(int argc, char **argv) {
    static const char *vars[] = {"COLT_CONVS", "COLT_LATENCIES_MS", "COLT_ROUNDS", "COLT_TURN_TOKENS",
                                 "COLT_RESULT_TOKENS", "COLT_PROMPT_LEN", "COLT_BUDGET", "COLT_LOCKSTEP", "COLT_REPEATS", "OMP_NUM_THREADS"};
    printf("Command: `");
    for (size_t k = 0; k < sizeof vars / sizeof vars[0]; k++)
        if (getenv(vars[k])) printf("%s=\"%s\" ", vars[k], getenv(vars[k]));
    for (int i = 0; i < argc; i++) printf("%s%s", i ? " " : "", argv[i]);
    printf("`\n");
}

/* matched_tps: the single-turn rate with the conversations' own lengths.
 * zero_wall: the same mode's wall time with no tool latency (< 0: not run);
 * the difference is what the latency cost (parked, ideally 0; lockstep, about
 * rounds x latency). */
static void print_row(const char *model, const Setup *s, int latency_ms, const char *mode, const Result *r,
                      double matched_tps, double zero_wall, double scan_s) {
    double tps = r->seconds > 0 ? r->model_tokens / r->seconds : 0;
    double ideal = matched_tps > 0 ? r->model_tokens / matched_tps : 0;
    double naive = ideal + r->max_rounds * latency_ms * 1e-3;
    char cost[32] = "–";
    if (zero_wall >= 0) snprintf(cost, sizeof cost, "%+.2f", r->seconds - zero_wall);
    printf("| %s | %d | %d | %s | %lld | %lld | %d | %.2f | %s | %.0f | %d | %lld / %lld | %.2f | %.2f | %.2f | %.0f%% |\n",
           model, s->n_convs, latency_ms, mode, (long long)r->model_tokens, (long long)r->tool_tokens, r->max_rounds,
           r->seconds, cost, tps, r->st.steps, (long long)r->st.shared_tokens, (long long)r->st.prefill_tokens, scan_s,
           ideal, naive, r->seconds > 0 ? 100 * ideal / r->seconds : 0);
    fflush(stdout);
}

static void print_single(const char *model, const Setup *s, const char *mode, const Result *r) {
    printf("| %s | %d | – | %s | %lld | 0 | 0 | %.2f | – | %.0f | %d | %lld / %lld | – | – | – | – |\n", model,
           s->n_convs, mode, (long long)r->model_tokens, r->seconds, r->seconds > 0 ? r->model_tokens / r->seconds : 0,
           r->st.steps, (long long)r->st.shared_tokens, (long long)r->st.prefill_tokens);
}

/* Every row of one model and N: parked L=0, the single-turn runs sized from
 * it, then the other latencies parked and (unless COLT_LOCKSTEP=0) lockstep. */
static void bench_n(Model *m, const char *model, Setup *s, const int *latencies, int n_lat, bool lockstep) {
    char err[ERR_LEN];
    const int vocab = model_config(m)->vocab_size;
    Result base, single, matched;
    int *lens = malloc(sizeof(int) * (size_t)s->n_convs);
    if (run_best(m, s, RUN_PARKED, 0, 0, lens, &base, err) != 0) {
        printf("| %s | %d | error: %s |\n", model, s->n_convs, err);
        free(lens);
        return;
    }
    int max_new = (int)((base.model_tokens + s->n_convs / 2) / s->n_convs);
    if (max_new < 1) max_new = 1;
    char mode[64];
    if (run_best(m, s, RUN_SINGLE, 0, max_new, NULL, &single, err) != 0) {
        printf("| %s | %d | single-turn error: %s |\n", model, s->n_convs, err);
    } else {
        snprintf(mode, sizeof mode, "single-turn, %d each", max_new);
        print_single(model, s, mode, &single);
    }
    double matched_tps = 0;
    if (run_best(m, s, RUN_MATCHED, 0, 0, lens, &matched, err) != 0) {
        printf("| %s | %d | single-turn (own lengths) error: %s |\n", model, s->n_convs, err);
    } else {
        print_single(model, s, "single-turn, own lengths", &matched);
        matched_tps = matched.seconds > 0 ? matched.model_tokens / matched.seconds : 0;
    }
    free(lens);
    for (int mode_k = 0; mode_k < (lockstep ? 2 : 1); mode_k++) {
        double zero_wall = mode_k == 0 ? base.seconds : -1;
        for (int li = 0; li < n_lat; li++) {
            Result r;
            if (mode_k == 0 && latencies[li] == 0) r = base;
            else if (run_best(m, s, mode_k ? RUN_LOCKSTEP : RUN_PARKED, latencies[li] * 1e-3, 0, NULL, &r, err) != 0) {
                printf("| %s | %d | %d | error: %s |\n", model, s->n_convs, latencies[li], err);
                continue;
            }
            if (latencies[li] == 0 && zero_wall < 0) zero_wall = r.seconds;
            print_row(model, s, latencies[li], mode_k ? "lockstep" : "parked", &r, matched_tps, zero_wall,
                      stop_scan_seconds(s, r.model_tokens, vocab));
        }
    }
}

int main(int argc, char **argv) {
    bool cpu = false;
    const char *want[8];
    int n_want = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--cpu") == 0) cpu = true;
        else if (n_want < 8) want[n_want++] = argv[i];
    }
    const Backend *be = cpu ? backend_cpu() : backend_cuda();
    if (!be) {
        printf("no CUDA device (--cpu runs the tiny model on the CPU backend)\n");
        return 77;
    }
    if (n_want == 0) want[n_want++] = cpu ? "tiny" : "0.5b";
    int convs[16], latencies[16];
    int n_convs = env_list("COLT_CONVS", cpu ? "8 32" : "64 256", convs, 16);
    int n_lat = env_list("COLT_LATENCIES_MS", "0 50 200", latencies, 16);
    const char *ls = getenv("COLT_LOCKSTEP");
    bool lockstep = !(ls && strcmp(ls, "0") == 0);
    Setup base = {.prompt_len = env_int("COLT_PROMPT_LEN", 128), .turn_tokens = env_int("COLT_TURN_TOKENS", 64),
                  .result_tokens = env_int("COLT_RESULT_TOKENS", 24), .rounds = env_int("COLT_ROUNDS", 3)};
    base.budget = env_int("COLT_BUDGET", 2 * ((base.rounds + 1) * base.turn_tokens + base.rounds * base.result_tokens));

    char hw[512];
    hardware_line(be, cpu, hw, sizeof hw);
    printf("Multi-turn generation with tool latency (agent_generate) vs single-turn (engine_generate), %s.\n"
           "Random-weight models, prompts %d random tokens, temperature 1; a turn ends at a stop id (every %dth id: "
           "~%d tokens a turn); each turn calls a tool returning %d ids after the latency, up to %d rounds; "
           "completion budget %d.\n\n",
           cpu ? "CPU backend (sanity check)" : "bf16, CUDA graphs", base.prompt_len, base.turn_tokens,
           base.turn_tokens, base.result_tokens, base.rounds, base.budget);
    printf("| model | N | tool ms | mode | model tokens | tool tokens | rounds | wall s | latency cost s | model tok/s | "
           "steps | shared / prefill tokens | stop scan s | ideal s | naive s | ideal / wall |\n"
           "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    char err[ERR_LEN];
    for (int w = 0; w < n_want; w++) {
        const Shape *shape = strcmp(want[w], "tiny") == 0 ? &TINY : shape_by_name(want[w]);
        if (!shape) {
            printf("| %s | unknown preset (0.5b 1.5b 7b tiny) |\n", want[w]);
            continue;
        }
        ModelConfig cfg = shape_config(shape);
        if (cpu) cfg.torch_dtype = DTYPE_F32;
        Model *m = NULL;
        if (model_create_random(&m, &cfg, 1, be, err) != 0) {
            printf("| %s | %s |\n", shape->name, err);
            continue;
        }
        Setup s = base;
        s.n_stop = 0;
        s.stop = malloc(sizeof(int) * (size_t)(cfg.vocab_size / s.turn_tokens + 1));
        for (int id = s.turn_tokens / 2; id < cfg.vocab_size; id += s.turn_tokens) s.stop[s.n_stop++] = id;
        /* warm-up: the backend's first GEMMs and graph captures, outside every row */
        s.n_convs = convs[0];
        s.prompts = malloc(sizeof(int) * (size_t)s.n_convs * s.prompt_len);
        for (int i = 0; i < s.n_convs * s.prompt_len; i++)
            s.prompts[i] = (int)(rng_uniform(9, (uint64_t)i / s.prompt_len, (uint64_t)i % s.prompt_len) * (cfg.vocab_size - 1));
        Result warm;
        if (run_single(m, &s, 16, &warm, err) != 0) printf("| %s | warm-up: %s |\n", shape->name, err);
        free(s.prompts);
        for (int ci = 0; ci < n_convs; ci++) {
            s.n_convs = convs[ci];
            s.prompts = malloc(sizeof(int) * (size_t)s.n_convs * s.prompt_len);
            for (int i = 0; i < s.n_convs * s.prompt_len; i++)
                s.prompts[i] = (int)(rng_uniform(7, (uint64_t)i / s.prompt_len, (uint64_t)i % s.prompt_len) *
                                     (cfg.vocab_size - 1));
            bench_n(m, shape->name, &s, latencies, n_lat, lockstep);
            free(s.prompts);
        }
        free(s.stop);
        model_free(m);
    }
    printf("\n");
    print_command(argc, argv);
    printf("Hardware: %s\n", hw);
    printf("latency cost: wall s - the same mode's wall s at 0 ms (list 0 first). model tok/s: sampled tokens / wall s. steps: forward calls. shared / prefill: tokens whose K/V came from the prefix cache / "
           "tokens computed as prompt (EngineStats). ideal: the row's model tokens at the single-turn own-lengths rate; naive: "
           "ideal + rounds x tool latency (the batch waits for its tools once a round).\n");
    return 0;
}
