/* test_weight_sync.c — the trainer-to-server weight channel (parallel/weight_sync.h)
 * between forked processes on 127.0.0.1, over Gloo through the host:
 * - 2 server ranks + the trainer, small buckets (many broadcasts): each server
 *   ends with the trainer's weights byte for byte and its logits, and its
 *   weights version moved (an engine then drops its prefix cache); a second
 *   push of other weights replaces them (no stale weights);
 * - a server holding another shape: every member fails with one line naming
 *   what differs, none hangs;
 * - a trainer that never comes: the servers fail within the timeout;
 * - LoRA adapters attached on every side (the servers from other base
 *   weights): the first push carries the base and the adapters, the second
 *   the adapters alone (their arena's bytes); each server ends with the
 *   trainer's base and adapters byte for byte and its logits;
 * - a server rank whose adapters have another lora_alpha: every member fails
 *   with one line naming the LoRA scaling.
 * - a tensor-parallel server (2 ranks, each a part; one KV head, so it is
 *   replicated): the trainer pushes its whole model, each rank ends with
 *   its part of it byte for byte (what model_create_random_tp cuts from the
 *   same whole), buckets of 4104 bytes cutting tensors anywhere (a bucket holds whole
 *   elements: weight_sync rounds its size down to a multiple of 8).
 * `test_weight_sync cuda` runs the same on the CUDA backend (processes sharing
 * GPU 0: the host path, as a server and a trainer on one device do). */
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "core/error.h"
#include "core/rng.h"
#include "parallel/weight_sync.h"
#include "harness.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/model_train.h"

static bool g_cuda;

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bind(fd, (struct sockaddr *)&a, sizeof a);
    socklen_t sl = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &sl);
    close(fd);
    return ntohs(a.sin_port);
}

static ModelConfig small_config(int intermediate) {
    return (ModelConfig){.arch = ARCH_QWEN2, .hidden_size = 64, .intermediate_size = intermediate,
                         .num_hidden_layers = 2, .num_attention_heads = 4, .num_key_value_heads = 2, .head_dim = 16,
                         .vocab_size = 256, .max_position_embeddings = 128, .rms_norm_eps = 1e-6f,
                         .rope_theta = 10000.0f, .tie_word_embeddings = true, .bos_token_id = -1,
                         .torch_dtype = DTYPE_F32};
}

static const Backend *open_backend(char *err) {
    if (!g_cuda) return backend_cpu();
    return backend_cuda_open(0, DTYPE_BF16, err);
}

/* The logits of a fixed 6-token prompt (host [6, V]). */
static float *logits_of(Model *m) {
    char err[ERR_LEN];
    int V = model_config(m)->vocab_size, tokens[6] = {1, 20, 200, 7, 99, 3}, slot[6] = {0}, pos[6] = {0, 1, 2, 3, 4, 5};
    ModelState *st = NULL;
    float *out = malloc(sizeof(float) * 6 * (size_t)V);
    if (model_state_create(&st, m, 1, 8, 8, err) != 0 || model_forward(m, st, tokens, slot, pos, 6, NULL, out, err) != 0) {
        fprintf(stderr, "forward: %s\n", err);
        free(out);
        out = NULL;
    }
    model_state_free(st);
    return out;
}

/* The raw bytes of m's weights (host copy). */
static char *weight_bytes(const Model *m, size_t *bytes) {
    size_t numel = 0;
    void *flat = model_params_flat(m, &numel);
    const Backend *be = model_backend(m);
    *bytes = numel * dtype_size(be->storage);
    char *host = malloc(*bytes);
    be->copy_to_host(be, host, flat, *bytes);
    return host;
}

/* The raw bytes of m's base weights (host copy), adapters attached or not. */
static char *base_bytes(const Model *m, size_t *bytes) {
    size_t numel = 0;
    void *flat = model_weights_flat(m, &numel);
    const Backend *be = model_backend(m);
    *bytes = numel * dtype_size(be->storage);
    char *host = malloc(*bytes);
    be->copy_to_host(be, host, flat, *bytes);
    return host;
}

enum { RUN_PUSH, RUN_MISMATCH, RUN_NO_TRAINER, RUN_LORA, RUN_LORA_MISMATCH, RUN_PUSH_TP };

/* A member's end: _exit skips stdio's buffers, so flush them first. */
static void finish(int status) {
    fflush(stdout);
    fflush(stderr);
    _exit(status);
}

static const LoraConfig LORA = {.r = 4, .alpha = 8, .targets = (1u << LORA_Q) | (1u << LORA_V) | (1u << LORA_DOWN)};

/* Adapters with values of seed (B non-zero too, so they change the logits). */
static void fill_adapters(Model *m, uint64_t seed) {
    const Backend *be = model_backend(m);
    for (int i = 0; i < model_param_count(m); i++) {
        ModelParam p = model_param(m, i);
        float *host = malloc(sizeof(float) * p.numel);
        for (size_t j = 0; j < p.numel; j++) host[j] = 0.2f * (rng_uniform(seed, (uint64_t)i, j) - 0.5f);
        be->upload(be, p.data, host, p.numel);
        free(host);
    }
}

/* The trainer's model at push k of the LoRA run: base of seed 1, adapters of seed 10 + k. */
static Model *lora_model(const ModelConfig *cfg, uint64_t base_seed, const LoraConfig *lc, uint64_t adapter_seed,
                         const Backend *be) {
    char err[ERR_LEN];
    Model *m = NULL;
    if (model_create_random(&m, cfg, base_seed, be, err) != 0 || model_lora_attach(m, lc, 0, err) != 0) {
        fprintf(stderr, "lora model: %s\n", err);
        finish(2);
    }
    fill_adapters(m, adapter_seed);
    return m;
}

/* A LoRA member: two pushes (RUN_LORA), or a server rank with another lora_alpha (RUN_LORA_MISMATCH). */
static void member_lora(int rank, int world, int port, int run, const Backend *be) {
    char err[ERR_LEN] = "";
    bool trainer = rank == world - 1;
    ModelConfig cfg = small_config(128);
    LoraConfig lc = LORA;
    if (run == RUN_LORA_MISMATCH && rank == 1) lc.alpha = 16;
    /* the servers start from other base weights and other adapters */
    Model *m = lora_model(&cfg, trainer ? 1 : 100 + (uint64_t)rank, &lc, trainer ? 10 : 50, be);
    WeightSyncOptions o = {.host = "127.0.0.1", .port = port, .rank = rank, .world_size = world, .be = be,
                           .timeout_s = 60.0, .bucket_bytes = 4096};
    WeightSync *w = NULL;
    if (weight_sync_open(&w, &o, err) != 0) {
        fprintf(stderr, "rank %d: open: %s\n", rank, err);
        finish(2);
    }
    if (run == RUN_LORA_MISMATCH) {
        int rc = trainer ? weight_sync_send(w, m, err) : weight_sync_recv(w, m, err);
        printf("  LoRA mismatch, rank %d: %s\n", rank, err);
        bool want = rank == 1 ? strstr(err, "the trainer's model has other LoRA scaling (lora_alpha, use_rslora) than "
                                            "this server's") != NULL
                              : strstr(err, "1 server rank holds a model of other LoRA scaling") != NULL;
        finish(rc != 0 && want && !strchr(err, '\n') ? 0 : 1);
    }
    int failures = 0;
    for (int push = 0; push < 2; push++) {
        Model *ref = lora_model(&cfg, 1, &lc, 10 + (uint64_t)push, be); /* what the trainer holds at this push */
        if (trainer && push == 1) fill_adapters(m, 11);
        uint64_t version = model_weights_version(m);
        int rc = trainer ? weight_sync_send(w, m, err) : weight_sync_recv(w, m, err);
        if (rc != 0) {
            fprintf(stderr, "rank %d: LoRA push %d: %s\n", rank, push, err);
            finish(2);
        }
        size_t bytes = 0, base = 0, adapters = model_lora_bytes(m);
        double secs = 0;
        weight_sync_last(w, &bytes, &secs);
        free(base_bytes(m, &base));
        size_t want_bytes = push == 0 ? base + adapters : adapters; /* the base once, then the adapters alone */
        if (bytes != want_bytes) {
            fprintf(stderr, "rank %d: LoRA push %d moved %zu bytes, want %zu\n", rank, push, bytes, want_bytes);
            failures++;
        }
        if (trainer) {
            printf("  LoRA push %d: %zu bytes (%s; the adapters are %zu, the base %zu)\n", push, bytes,
                   push == 0 ? "base + adapters" : "adapters alone", adapters, base);
        } else {
            if (model_weights_version(m) == version) {
                fprintf(stderr, "rank %d: LoRA push %d: the weights version did not move\n", rank, push);
                failures++;
            }
            size_t nb, nr, ab, ar;
            char *got = base_bytes(m, &nb), *want = base_bytes(ref, &nr);
            char *got_a = weight_bytes(m, &ab), *want_a = weight_bytes(ref, &ar); /* model_params_flat: the adapters */
            float *lg = logits_of(m), *lr = logits_of(ref);
            bool same_base = nb == nr && !memcmp(got, want, nb), same_adapters = ab == ar && !memcmp(got_a, want_a, ab);
            bool same_logits = lg && lr && !memcmp(lg, lr, sizeof(float) * 6 * (size_t)cfg.vocab_size);
            if (!same_base || !same_adapters || !same_logits) {
                fprintf(stderr, "rank %d: LoRA push %d: base, adapters or logits differ from the trainer's\n", rank,
                        push);
                failures++;
            }
            printf("  LoRA push %d, server rank %d: base %s, adapters (%zu bytes) %s, logits %s\n", push, rank,
                   same_base ? "identical" : "DIFFERENT", ab, same_adapters ? "identical" : "DIFFERENT",
                   same_logits ? "identical" : "differ");
            free(got), free(want), free(got_a), free(want_a), free(lg), free(lr);
        }
        model_free(ref);
        fflush(stdout);
    }
    weight_sync_close(w);
    model_free(m);
    finish(failures ? 1 : 0);
}

/* One member; exits 0 when it saw what it should. */
static void member(int rank, int world, int port, int run) {
    char err[ERR_LEN] = "";
    bool trainer = rank == world - 1;
    const Backend *be = open_backend(err);
    if (!be) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        finish(2);
    }
    if (run == RUN_LORA || run == RUN_LORA_MISMATCH) member_lora(rank, world, port, run, be);
    if (run == RUN_NO_TRAINER && trainer) {
        sleep(30); /* never joins; the parent kills it */
        finish(0);
    }
    int inter = run == RUN_MISMATCH && rank == 1 ? 96 : 128;
    ModelConfig cfg = small_config(inter);
    if (run == RUN_PUSH_TP) cfg.num_key_value_heads = 1;
    TensorParallel part = {.rank = rank, .tensor_parallel_size = world - 1}; /* a layout only: nothing here runs a forward */
    Model *m = NULL;
    if (model_create_random_tp(&m, &cfg, trainer ? 1 : 100 + (uint64_t)rank, be,
                               run == RUN_PUSH_TP && !trainer ? &part : NULL, err) != 0) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        finish(2);
    }
    WeightSyncOptions o = {.host = "127.0.0.1", .port = port, .rank = rank, .world_size = world, .be = be,
                           .timeout_s = run == RUN_NO_TRAINER ? 3.0 : 60.0,
                           .bucket_bytes = run == RUN_PUSH_TP ? 4104 : 4096};
    WeightSync *w = NULL;
    int rc = weight_sync_open(&w, &o, err);
    if (run == RUN_NO_TRAINER) { /* the open itself waits for the trainer and gives up */
        printf("  no trainer, rank %d: %s\n", rank, err);
        finish(rc != 0 && strstr(err, "3 s") ? 0 : 1);
    }
    if (rc != 0) {
        fprintf(stderr, "rank %d: open: %s\n", rank, err);
        finish(2);
    }
    if (run == RUN_MISMATCH) {
        rc = trainer ? weight_sync_send(w, m, err) : weight_sync_recv(w, m, err);
        printf("  mismatch, rank %d: %s\n", rank, err);
        char sizes[96]; /* the two models' weight bytes: 4 per element in fp32, 2 in bf16 */
        size_t es = dtype_size(be->storage);
        snprintf(sizes, sizeof sizes, "(%zu against %zu)", 90816 * es, 78528 * es);
        bool want = rank == 1 ? strstr(err, "the trainer's model has other weight bytes than this server's ") &&
                                    strstr(err, sizes)
                              : strstr(err, "1 server rank holds a model of other weight bytes than the trainer's") != NULL;
        finish(rc != 0 && want ? 0 : 1);
    }
    if (run == RUN_PUSH_TP) { /* one push; each rank should then hold its part of the trainer's seed-1 model */
        rc = trainer ? weight_sync_send(w, m, err) : weight_sync_recv(w, m, err);
        if (rc != 0) {
            fprintf(stderr, "rank %d: push: %s\n", rank, err);
            finish(2);
        }
        bool same = true;
        if (!trainer) {
            Model *ref = NULL;
            if (model_create_random_tp(&ref, &cfg, 1, be, &part, err) != 0) finish(2);
            size_t nb = 0, nr = 0;
            char *got = weight_bytes(m, &nb), *want = weight_bytes(ref, &nr);
            same = nb == nr && !memcmp(got, want, nb);
            printf("  tensor-parallel server rank %d of 2: its %zu bytes %s its part of the trainer's whole model\n",
                   rank, nb, same ? "identical to" : "DIFFER from");
            free(got), free(want);
            model_free(ref);
        }
        weight_sync_close(w);
        model_free(m);
        finish(same ? 0 : 1);
    }
    /* two pushes: the trainer's seed-1 weights, then its seed-2 weights */
    int failures = 0;
    for (int push = 0; push < 2; push++) {
        Model *ref = NULL; /* what the trainer holds at this push */
        if (model_create_random(&ref, &cfg, push == 0 ? 1 : 2, be, err) != 0) finish(2);
        if (trainer && push == 1) {
            model_free(m);
            m = ref;
            ref = NULL;
        }
        uint64_t version = model_weights_version(m);
        rc = trainer ? weight_sync_send(w, m, err) : weight_sync_recv(w, m, err);
        if (rc != 0) {
            fprintf(stderr, "rank %d: push %d: %s\n", rank, push, err);
            finish(2);
        }
        if (!trainer && model_weights_version(m) == version) { /* an engine on m would keep its prefix cache */
            fprintf(stderr, "rank %d: push %d: the weights version did not move\n", rank, push);
            failures++;
        }
        size_t bytes = 0;
        double secs = 0;
        weight_sync_last(w, &bytes, &secs);
        if (trainer) {
            printf("  push %d: %zu bytes in %.3f s (%d-byte buckets) to %d server ranks\n", push, bytes, secs, 4096,
                   world - 1);
        } else {
            size_t nb = 0, nr = 0;
            char *got = weight_bytes(m, &nb), *want = weight_bytes(ref, &nr);
            float *lg = logits_of(m), *lr = logits_of(ref);
            bool same = nb == nr && !memcmp(got, want, nb) && lg && lr &&
                        !memcmp(lg, lr, sizeof(float) * 6 * (size_t)cfg.vocab_size);
            if (!same) {
                fprintf(stderr, "rank %d: push %d: weights or logits differ from the trainer's\n", rank, push);
                failures++;
            }
            printf("  push %d, server rank %d: %zu bytes, %s the trainer's, logits %s\n", push, rank, nb,
                   nb == nr && !memcmp(got, want, nb) ? "identical to" : "NOT", same ? "identical" : "differ");
            free(got);
            free(want);
            free(lg);
            free(lr);
        }
        model_free(ref);
        fflush(stdout);
    }
    weight_sync_close(w);
    model_free(m);
    finish(failures ? 1 : 0);
}

/* Forks world members, waits at most limit_s; returns how many ended with status 0. */
static int run_group(int world, int run, double limit_s, const char *what) {
    int port = free_port();
    pid_t pids[8];
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < world; r++)
        if ((pids[r] = fork()) == 0) member(r, world, port, run);
    double t0 = now_s();
    int ok = 0;
    for (int r = 0; r < world; r++) {
        int status = 0;
        bool killed = false;
        for (;;) {
            if (waitpid(pids[r], &status, WNOHANG) == pids[r]) break;
            bool sleeper = run == RUN_NO_TRAINER && r == world - 1; /* the absent trainer */
            if (sleeper || now_s() - t0 > limit_s) {
                kill(pids[r], SIGKILL);
                waitpid(pids[r], &status, 0);
                killed = !sleeper;
                break;
            }
            usleep(10000);
        }
        if (run == RUN_NO_TRAINER && r == world - 1) continue;
        ok += WIFEXITED(status) && WEXITSTATUS(status) == 0;
        CHECK(!killed, "%s: rank %d still running after %.0f s", what, r, limit_s);
    }
    printf("%s: %.1f s\n", what, now_s() - t0);
    return ok;
}

int main(int argc, char **argv) {
    g_cuda = argc > 1 && !strcmp(argv[1], "cuda");
    (void)g_tmp;
    if (!comm_built(COMM_GLOO)) {
        printf("SKIP: this build has no Gloo (libgloo-dev), the channel's host path\n");
        return 77;
    }
    char err[ERR_LEN];
    WeightSync *w = NULL;
    WeightSyncOptions bad = {.host = "127.0.0.1", .port = 1, .rank = 0, .world_size = 1, .be = backend_cpu()};
    CHECK(weight_sync_open(&w, &bad, err) != 0 && strstr(err, "rank 0 of 1"), "a group of one: %s", err);
    bad.world_size = 2, bad.port = 70000;
    CHECK(weight_sync_open(&w, &bad, err) != 0 && strstr(err, "bad group address '127.0.0.1:70000'"), "port: %s", err);
    CHECK(run_group(3, RUN_PUSH, 120, "2 server ranks + trainer, two pushes") == 3, "push: a member failed");
    CHECK(run_group(3, RUN_MISMATCH, 60, "server rank 1 holds another shape") == 3, "mismatch: a member did not fail as it should");
    CHECK(run_group(3, RUN_NO_TRAINER, 30, "the trainer never joins (timeout 3 s)") == 2, "no trainer: a server did not time out");
    CHECK(run_group(3, RUN_LORA, 120, "LoRA: 2 server ranks + trainer, base once then adapters") == 3,
          "LoRA push: a member failed");
    CHECK(run_group(3, RUN_LORA_MISMATCH, 60, "LoRA: server rank 1 has another lora_alpha") == 3,
          "LoRA mismatch: a member did not fail as it should");
    CHECK(run_group(3, RUN_PUSH_TP, 60, "a tensor-parallel server (2 parts) + trainer") == 3,
          "tensor-parallel push: a member failed");
    printf("test_weight_sync%s: %d checks, %d failures\n", g_cuda ? " cuda" : "", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
