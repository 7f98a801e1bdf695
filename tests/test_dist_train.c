/* test_dist_train.c — data-parallel `colt train` on CPU ranks, end to end,
 * against one process with the same global batch (the demo's settings, made
 * small, deterministic mode on so a completion does not depend on what else
 * shares its engine batch):
 *   - mpirun -np 2 and -np 4 (per_device_train_batch_size 8, one micro-batch a
 *     step) against one process taking the same 16 or 32 samples a step in 2 or
 *     4 micro-batches: the first step's completions, rewards and advantages are
 *     the same bits, so are its metrics; later steps and the final weights agree
 *     to float rounding (the gradient sums group differently);
 *   - `--nproc_per_node 2` (colt starting its ranks itself, torchrun's variables,
 *     Gloo) gives the same bits as mpirun -np 2;
 *   - only rank 0 writes into output_dir;
 *   - SIGINT to one rank: every rank stops after the same step, rank 0 saves a
 *     checkpoint, all exit 0; resuming at world size 2 reproduces the
 *     uninterrupted 2-rank run exactly, and resuming at world size 1 works;
 *   - zero_stage 1 (sharded optimizer state), zero_stage 2 (gradients too, also
 *     with clipping), zero_stage 3 (weights too; with a reference model; at 4
 *     ranks) and offload_optimizer cpu give the same bits as the unsharded run; a sharded checkpoint resumes at world
 *     size 2 exactly and at 4 and 1 (resharded) to float rounding; a lost
 *     shard file is named;
 *   - a rank killed mid-run: the job ends, non-zero, within the bound;
 *   - TRL's entropy mask (top_entropy_quantile) pooled over the ranks' micro-batch: 2 ranks of 8 samples
 *     as one process's micro-batch of 16, with the adaptive entropy controller;
 *   - bad launches: inconsistent variables, a batch the world cannot split, a
 *     MASTER_PORT another process holds, a MASTER_ADDR nobody answers.
 * Each run is two steps, a checkpoint after each: step 1 starts from fresh
 * optimizer state, step 2 uses the moments and the weights step 1 changed
 * (checked to move them, so no identity below holds for want of training),
 * and a resume from checkpoint-1 redoes step 2. Kept that short for the
 * test's budget under ASan on 2 cores (docs/testing.md).
 * Under the sanitizers (build-asan) the 4-rank runs and the runs that repeat a sanitized one's code (z2 with
 * offload or clipping, z3 with offload, offload in one process) are left to Release (multi-rank runs are 5-10x
 * slower there).
 * Skips (exit 77) when mpirun is not installed. */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/fileio.h"
#include "harness.h"

static const char *BASE =
    "--config examples/demo.yaml --max_completion_length 16 --logging_steps 1 --log_completions_count 0 "
    "--save_total_limit 0 --eval_dataset null --deterministic true --ddp_timeout 60 --device cpu";
static const char *MPIRUN = "mpirun --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1 -x " NO_LEAK_CHECK;
/* In sanitizer builds: Open MPI keeps what MPI_Init allocates until exit. */
#define LSAN_ENV "LSAN_OPTIONS=suppressions=" COLT_SOURCE_DIR "/tests/lsan_openmpi.supp:fast_unwind_on_malloc=0"
#if defined(__SANITIZE_ADDRESS__)
#define SANITIZED 1
#else
#define SANITIZED 0
#endif

/* Runs "PREFIX colt train ARGS" through sh; stderr into *err_out. */
static int run(const char *prefix, const char *args, char **err_out) {
    char cmd[16384], err_path[300];
    snprintf(err_path, sizeof err_path, "%s/stderr", g_tmp);
    snprintf(cmd, sizeof cmd, "OMP_NUM_THREADS=1 %s timeout 600 %s %s train %s > /dev/null 2> %s", LSAN_ENV, prefix,
             COLT_BINARY, args, err_path);
    int status = system(cmd);
    size_t len;
    if (file_read_all(err_path, err_out, &len, NULL) != 0) *err_out = strdup("");
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

/* metrics.jsonl as JSON objects, one per step (NULL-terminated). */
static json_t **metric_lines(const char *dir, int *n) {
    char *text = read_text(dir, "metrics.jsonl");
    json_t **lines = calloc(256, sizeof(json_t *));
    *n = 0;
    for (char *line = text ? strtok(text, "\n") : NULL; line && *n < 255; line = strtok(NULL, "\n"))
        lines[(*n)++] = json_loads(line, 0, NULL);
    free(text);
    return lines;
}

static void free_lines(json_t **lines, int n) {
    for (int i = 0; i < n; i++) json_decref(lines[i]);
    free(lines);
}

/* Largest difference (metric_difference) of the compared metrics of one step. */
static double metrics_difference(json_t *a, json_t *b, char *worst, size_t worst_size) {
    double d = 0;
    const char *key;
    json_t *va;
    snprintf(worst, worst_size, "-");
    if (!a || !b) return INFINITY;
    json_object_foreach(a, key, va) {
        if (!metric_is_compared(key)) continue;
        json_t *vb = json_object_get(b, key);
        if (!json_is_number(va) || !json_is_number(vb)) {
            if (!(json_is_null(va) && json_is_null(vb))) {
                snprintf(worst, worst_size, "%s (missing)", key);
                return INFINITY;
            }
            continue;
        }
        double x = json_number_value(va), y = json_number_value(vb);
        double rel = metric_difference(key, x, y);
        if (rel > d) {
            d = rel;
            snprintf(worst, worst_size, "%s (%.9g vs %.9g)", key, x, y);
        }
    }
    return d;
}

/* Largest absolute difference between two F32 safetensors files of the same layout. */
static double weights_difference(const char *a_dir, const char *b_dir) {
    char *pa = path_join(a_dir, "model.safetensors"), *pb = path_join(b_dir, "model.safetensors"), *da = NULL, *db = NULL;
    size_t la = 0, lb = 0;
    double d = INFINITY;
    if (file_read_all(pa, &da, &la, NULL) == 0 && file_read_all(pb, &db, &lb, NULL) == 0 && la == lb && la > 8) {
        uint64_t hlen = 0;
        for (int i = 0; i < 8; i++) hlen |= (uint64_t)(unsigned char)da[i] << (8 * i);
        d = memcmp(da, db, 8 + hlen) == 0 ? 0.0 : INFINITY;
        for (size_t off = 8 + hlen; off + 4 <= la && isfinite(d); off += 4) {
            float x, y;
            memcpy(&x, da + off, 4);
            memcpy(&y, db + off, 4);
            d = fmax(d, fabs((double)x - y));
        }
    }
    free(pa), free(pb), free(da), free(db);
    return d;
}

/* Compares a world-size run with the one-process run: step 1 exactly, the rest
 * within tol, final weights within wtol. */
static void compare_runs(const char *what, const char *one_dir, const char *world_dir, double tol, double wtol) {
    int na = 0, nb = 0;
    json_t **a = metric_lines(one_dir, &na), **b = metric_lines(world_dir, &nb);
    CHECK(na == nb && na > 1, "%s: %d metric lines against %d", what, nb, na);
    char worst[256];
    double first = na > 0 && nb > 0 ? metrics_difference(a[0], b[0], worst, sizeof worst) : INFINITY;
    printf("%s: step 1 metrics vs one process: largest relative difference %g (%s)\n", what, first, worst);
    CHECK(first == 0.0, "%s: step 1 differs: %s", what, worst);
    double rest = 0;
    char rest_worst[300] = "-";
    for (int i = 1; i < na && i < nb; i++) {
        double d = metrics_difference(a[i], b[i], worst, sizeof worst);
        if (d > rest) rest = d, snprintf(rest_worst, sizeof rest_worst, "step %d: %s", i + 1, worst);
    }
    double w = weights_difference(one_dir, world_dir);
    printf("%s: later steps within %g (%s); final weights within %g\n", what, rest, rest_worst, w);
    CHECK(rest <= tol, "%s: metrics differ by %g > %g: %s", what, rest, tol, rest_worst);
    CHECK(w <= wtol, "%s: final weights differ by %g > %g", what, w, wtol);
    free_lines(a, na);
    free_lines(b, nb);
}

/* Files in dir other than the expected outputs (what a rank other than 0 might have written). */
static int unexpected_files(const char *dir) {
    static const char *expected[] = {"metrics.jsonl",      "completions.jsonl",     "summary.json",
                                     "reward_curve.svg",   "training_curves.svg",   "model.safetensors",
                                     "config.json",        "generation_config.json", "tokenizer.json",
                                     "tokenizer_config.json", ".",                  ".."};
    DIR *d = opendir(dir);
    int n = 0;
    struct dirent *e;
    while (d && (e = readdir(d))) {
        bool ok = strncmp(e->d_name, "checkpoint-", 11) == 0;
        for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) ok |= strcmp(e->d_name, expected[i]) == 0;
        if (!ok) {
            fprintf(stderr, "unexpected file in %s: %s\n", dir, e->d_name);
            n++;
        }
    }
    if (d) closedir(d);
    return n;
}

/* A colt process whose parent is pid (a rank under mpirun), or 0. */
static pid_t child_colt(pid_t parent) {
    char cmd[128], line[64];
    snprintf(cmd, sizeof cmd, "pgrep -P %d colt | tail -n 1", (int)parent);
    FILE *p = popen(cmd, "r");
    pid_t pid = 0;
    if (p && fgets(line, sizeof line, p)) pid = (pid_t)atoi(line);
    if (p) pclose(p);
    return pid;
}

/* TRL's entropy mask takes its quantile over the micro-batch of every process: two ranks of 8 samples
 * must mask what one process masks in its micro-batch of the same 16 (dapo: the same sums either way),
 * and the adaptive entropy controller, fed the world's token-weighted window, must follow the same
 * course. A per-rank quantile would differ. entropy_target 0 keeps the bonus itself off: TRL's bonus is
 * each process's own token mean, which two ranks average and one process does not (by design). */
static void test_entropy_mask_over_ranks(void) {
    const char *opts = "--max_steps 2 --save_steps 0 --top_entropy_quantile 0.3 --off_policy_mask_threshold 0 "
                       "--use_adaptive_entropy true --entropy_coef 0.01 --entropy_target 0";
    char one[300], two[300], args[8192], prefix[512], *err;
    snprintf(one, sizeof one, "%s/entropy_one", g_tmp);
    snprintf(two, sizeof two, "%s/entropy_two", g_tmp);
    snprintf(args, sizeof args, "%s %s --per_device_train_batch_size 16 --output_dir %s", BASE, opts, one);
    int code = run("", args, &err);
    CHECK(code == 0, "entropy mask, one process: exit %d: %s", code, err);
    free(err);
    snprintf(prefix, sizeof prefix, "%s -np 2", MPIRUN);
    snprintf(args, sizeof args, "%s %s --per_device_train_batch_size 8 --output_dir %s", BASE, opts, two);
    code = run(prefix, args, &err);
    CHECK(code == 0, "entropy mask, mpirun -np 2: exit %d: %s", code, err);
    free(err);
    int na = 0, nb = 0;
    json_t **a = metric_lines(one, &na), **b = metric_lines(two, &nb);
    char worst[300] = "-";
    double d = 0;
    for (int i = 0; i < na && i < nb; i++) {
        char w[256];
        double di = metrics_difference(a[i], b[i], w, sizeof w);
        if (di > d || isnan(di)) d = di, snprintf(worst, sizeof worst, "step %d: %s", i + 1, w);
    }
    double coef = na == 2 ? json_number_value(json_object_get(a[1], "entropy_coef")) : NAN;
    bool logged = na == 2 && json_is_number(json_object_get(a[0], "policy_loss"));
    printf("entropy mask over 2 ranks vs one process's micro-batch: metrics within %g (%s), entropy_coef %g after "
           "2 steps\n", d, worst, coef);
    CHECK(na == 2 && nb == 2 && d <= 1e-4, "entropy mask over ranks: %d and %d steps, metrics differ by %g: %s", na, nb,
          d, worst);
    CHECK(logged && coef == 0.0, /* 0.01, above the target twice: 0.005, then the floor entropy_coef_min 0 */ "entropy mask over ranks: policy_loss logged %d, entropy_coef %g",
          logged, coef);
    free_lines(a, na);
    free_lines(b, nb);
}

int main(void) {
    if (system("command -v mpirun > /dev/null 2>&1") != 0) {
        printf("SKIP: mpirun not found (scripts/setup.sh installs openmpi-bin)\n");
        return 77;
    }
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_test_dist_train_XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    setvbuf(stdout, NULL, _IOLBF, 0);
    char args[8192], prefix[512], one[300], two[300], *err;
    int code;

    /* 1. world size 2 against one process, 16 samples a step (4 prompts x 8 completions a round) */
    snprintf(one, sizeof one, "%s/one", g_tmp);
    snprintf(two, sizeof two, "%s/two", g_tmp);
    snprintf(args, sizeof args, "%s --max_steps 2 --save_steps 1 --per_device_train_batch_size 8 "
             "--gradient_accumulation_steps 2 --output_dir %s", BASE, one);
    code = run("", args, &err);
    CHECK(code == 0, "one process: exit %d: %s", code, err);
    free(err);
    snprintf(prefix, sizeof prefix, "%s -np 2", MPIRUN);
    snprintf(args, sizeof args, "%s --max_steps 2 --save_steps 1 --per_device_train_batch_size 8 "
             "--gradient_accumulation_steps 1 --output_dir %s", BASE, two);
    code = run(prefix, args, &err);
    CHECK(code == 0, "mpirun -np 2: exit %d: %s", code, err);
    CHECK(strstr(err, "data parallel: 2 processes") != NULL, "mpirun -np 2 did not run as 2 ranks: %s", err);
    free(err);
    compare_runs("world size 2", one, two, 1e-4, 1e-5);
    char two_step1[320];
    snprintf(two_step1, sizeof two_step1, "%s/checkpoint-1", two);
    double step2_moved = weights_difference(two_step1, two);
    printf("world size 2: step 2 moved the weights by up to %g\n", step2_moved);
    CHECK(step2_moved > 0 && isfinite(step2_moved), "world size 2: step 2 left the weights as they were (%g): the identities "
          "below would hold without training", step2_moved);
    CHECK(unexpected_files(two) == 0, "world size 2 wrote unexpected files");
    test_entropy_mask_over_ranks();

    /* 1b. the same 2-rank run started by colt itself (torchrun's variables, the store and Gloo instead of MPI):
     * the same bits as under mpirun */
    char self2[300];
    snprintf(self2, sizeof self2, "%s/self2", g_tmp);
    snprintf(args, sizeof args, "%s --max_steps 2 --save_steps 1 --per_device_train_batch_size 8 "
             "--gradient_accumulation_steps 1 --nproc_per_node 2 --output_dir %s", BASE, self2);
    code = run("env " NO_LEAK_CHECK, args, &err);
    CHECK(code == 0, "--nproc_per_node 2: exit %d: %s", code, err);
    bool same_as_mpi = same_file(two, self2, "model.safetensors");
    printf("--nproc_per_node 2 (%s): final weights identical to mpirun -np 2: %s\n",
           strstr(err, "gloo") ? "gloo" : "?", same_as_mpi ? "yes" : "NO");
    CHECK(same_as_mpi, "colt's own launch and mpirun differ");
    free(err);

    /* 2. world size 4, 32 samples a step. Under the sanitizers left to Release: the 2-rank runs take the same
     * code (and test_tp's 4-process TP 2 x DP 2 runs are sanitized). */
#if !defined(__SANITIZE_ADDRESS__)
    char one4[300], four[300];
    snprintf(one4, sizeof one4, "%s/one4", g_tmp);
    snprintf(four, sizeof four, "%s/four", g_tmp);
    snprintf(args, sizeof args, "%s --max_steps 2 --per_device_train_batch_size 8 --gradient_accumulation_steps 4 "
             "--output_dir %s", BASE, one4);
    code = run("", args, &err);
    CHECK(code == 0, "one process (4 micro-batches): exit %d: %s", code, err);
    free(err);
    snprintf(prefix, sizeof prefix, "%s -np 4", MPIRUN);
    snprintf(args, sizeof args, "%s --max_steps 2 --per_device_train_batch_size 8 --gradient_accumulation_steps 1 "
             "--output_dir %s", BASE, four);
    code = run(prefix, args, &err);
    CHECK(code == 0, "mpirun -np 4: exit %d: %s", code, err);
    free(err);
    compare_runs("world size 4", one4, four, 1e-4, 1e-5);
#endif

    /* 3. resume: checkpoint-1 of the 2-rank run, at world size 2 (exact) and at world size 1 */
    char resumed[300];
    snprintf(resumed, sizeof resumed, "%s/resumed2", g_tmp);
    snprintf(prefix, sizeof prefix, "%s -np 2", MPIRUN);
    snprintf(args, sizeof args, "%s --max_steps 2 --save_steps 1 --per_device_train_batch_size 8 "
             "--gradient_accumulation_steps 1 --output_dir %s --resume_from_checkpoint %s/checkpoint-1", BASE,
             resumed, two);
    code = run(prefix, args, &err);
    CHECK(code == 0, "resume at world size 2: exit %d: %s", code, err);
    free(err);
    bool exact = same_file(two, resumed, "model.safetensors");
    printf("resume of a 2-rank checkpoint at world size 2: final weights identical: %s\n", exact ? "yes" : "NO");
    CHECK(exact, "resuming at world size 2 changed the result");
    snprintf(resumed, sizeof resumed, "%s/resumed1", g_tmp);
    snprintf(args, sizeof args, "%s --max_steps 2 --save_steps 1 --per_device_train_batch_size 8 "
             "--gradient_accumulation_steps 2 --output_dir %s --resume_from_checkpoint %s/checkpoint-1", BASE,
             resumed, two);
    code = run("", args, &err);
    double w = weights_difference(two, resumed);
    printf("resume of a 2-rank checkpoint in one process: exit %d, final weights within %g of the 2-rank run\n", code, w);
    CHECK(code == 0 && w <= 1e-5, "resume at world size 1: exit %d, weights %g: %s", code, w, err);
    free(err);

    /* 3b. ZeRO-1 (optimizer state sharded) and optimizer offload: the same bits as the unsharded 2-rank run
     * (AdamW is elementwise; the gathered shards are the weights every rank would have computed) */
    const char *zero_cases[][2] = {{"z1", "--zero_stage 1"},
                                   {"z1_offload", "--zero_stage 1 --offload_optimizer cpu"},
                                   {"z2", "--zero_stage 2"},
#if !defined(__SANITIZE_ADDRESS__) /* Release only: the offload step runs sanitized in z1_offload and test_tp's
                                    * zero_stage 3 + offload, the clipping scales the shard z2's step updates */
                                   /* ZeRO-2's reduced shard of the gradients, half of it updated on the "device" */
                                   {"z2_offload", "--zero_stage 2 --offload_optimizer cpu --offload_optimizer_ratio 0.5"},
                                   {"z2_clipped", "--zero_stage 2 --max_grad_norm 0.01"},
#endif
                                   {"z3", "--zero_stage 3"},
#if !defined(__SANITIZE_ADDRESS__)
                                   {"z3_offload", "--zero_stage 3 --offload_optimizer cpu"}
#endif
    };
    char z1[300], z3[300];
    for (size_t k = 0; k < sizeof zero_cases / sizeof zero_cases[0]; k++) {
        char dir[300];
        snprintf(dir, sizeof dir, "%s/%s", g_tmp, zero_cases[k][0]);
        if (!strcmp(zero_cases[k][0], "z1")) snprintf(z1, sizeof z1, "%s", dir);
        if (!strcmp(zero_cases[k][0], "z3")) snprintf(z3, sizeof z3, "%s", dir);
        snprintf(prefix, sizeof prefix, "%s -np 2", MPIRUN);
        snprintf(args, sizeof args, "%s --max_steps 2 --save_steps 1 --per_device_train_batch_size 8 "
                 "--gradient_accumulation_steps 1 %s --output_dir %s", BASE, zero_cases[k][1], dir);
        code = run(prefix, args, &err);
        CHECK(code == 0, "mpirun -np 2 %s: exit %d: %s", zero_cases[k][1], code, err);
        free(err);
        if (!strcmp(zero_cases[k][0], "z2_clipped")) { /* clipping on: against zero_stage 0 with the same clipping */
            char ref[300];
            snprintf(ref, sizeof ref, "%s/two_clipped", g_tmp);
            snprintf(args, sizeof args, "%s --max_steps 2 --save_steps 1 --per_device_train_batch_size 8 "
                     "--gradient_accumulation_steps 1 --max_grad_norm 0.01 --output_dir %s", BASE, ref);
            code = run(prefix, args, &err);
            CHECK(code == 0, "mpirun -np 2 --max_grad_norm 0.01: exit %d: %s", code, err);
            free(err);
            bool same = same_file(ref, dir, "model.safetensors");
            printf("mpirun -np 2 %s: final weights identical to zero_stage 0 with the same clipping: %s\n",
                   zero_cases[k][1], same ? "yes" : "NO");
            CHECK(same, "%s changed the result", zero_cases[k][1]);
            continue;
        }
        bool same = same_file(two, dir, "model.safetensors");
        printf("mpirun -np 2 %s: final weights identical to zero_stage 0: %s\n", zero_cases[k][1], same ? "yes" : "NO");
        CHECK(same, "%s changed the result", zero_cases[k][1]);
        compare_runs(zero_cases[k][1], one, dir, 1e-4, 1e-5);
    }
    /* zero_stage 3 with a reference model (beta > 0: partitioned too) and at 4 ranks: the same bits as
     * zero_stage 0; its checkpoint resumed at 4 ranks (resharded: float rounding) and at 2 (exact) */
    const struct {
        const char *name, *extra;
        int np, batch;
    } z3_cases[] = {{"beta", "--beta 0.04", 2, 8},
#if !defined(__SANITIZE_ADDRESS__) /* 4 ranks: Release only */
                    {"four", "", 4, 4}
#endif
    };
    for (size_t k = 0; k < sizeof z3_cases / sizeof z3_cases[0]; k++) {
        char ref[300], dir[300];
        snprintf(ref, sizeof ref, "%s/z0_%s", g_tmp, z3_cases[k].name);
        snprintf(dir, sizeof dir, "%s/z3_%s", g_tmp, z3_cases[k].name);
        snprintf(prefix, sizeof prefix, "%s -np %d", MPIRUN, z3_cases[k].np);
        for (int z = 0; z < 2; z++) {
            snprintf(args, sizeof args, "%s --max_steps 2 --per_device_train_batch_size %d "
                     "--gradient_accumulation_steps 1 %s --zero_stage %d --output_dir %s", BASE, z3_cases[k].batch,
                     z3_cases[k].extra, z ? 3 : 0, z ? dir : ref);
            code = run(prefix, args, &err);
            CHECK(code == 0, "mpirun -np %d %s --zero_stage %d: exit %d: %s", z3_cases[k].np, z3_cases[k].extra,
                  z ? 3 : 0, code, err);
            free(err);
        }
        bool same = same_file(ref, dir, "model.safetensors");
        printf("mpirun -np %d %s --zero_stage 3: final weights identical to zero_stage 0: %s\n", z3_cases[k].np,
               z3_cases[k].extra, same ? "yes" : "NO");
        CHECK(same, "zero_stage 3 (%s) changed the result", z3_cases[k].name);
    }
    for (int np = SANITIZED ? 2 : 4; np >= 2; np -= 2) { /* the resume at 4 ranks: Release only */
        char dir[300];
        snprintf(dir, sizeof dir, "%s/z3_resumed%d", g_tmp, np);
        snprintf(prefix, sizeof prefix, "%s -np %d", MPIRUN, np);
        snprintf(args, sizeof args, "%s --max_steps 2 --save_steps 1 --per_device_train_batch_size %d "
                 "--gradient_accumulation_steps 1 --zero_stage 3 --output_dir %s --resume_from_checkpoint "
                 "%s/checkpoint-1", BASE, 16 / np, dir, z3);
        code = run(prefix, args, &err);
        double wd = weights_difference(z3, dir);
        printf("zero_stage 3 checkpoint of 2 ranks resumed at world size %d: exit %d, final weights within %g\n", np,
               code, wd);
        CHECK(code == 0 && (np == 2 ? wd == 0.0 : wd <= 1e-5), "zero_stage 3 resume at world size %d: exit %d, "
              "weights %g: %s", np, code, wd, err);
        free(err);
    }
    /* zero_stage 2 in one process with 2 micro-batches: each backward's gradients are added to the shard
     * after it (the unsharded run accumulates them inside the backward's ops): float rounding apart */
    char one_z2[300];
    snprintf(one_z2, sizeof one_z2, "%s/one_z2", g_tmp);
    snprintf(args, sizeof args, "%s --max_steps 2 --save_steps 1 --per_device_train_batch_size 8 "
             "--gradient_accumulation_steps 2 --zero_stage 2 --output_dir %s", BASE, one_z2);
    code = run("", args, &err);
    CHECK(code == 0, "one process, zero_stage 2: exit %d: %s", code, err);
    free(err);
    compare_runs("one process, zero_stage 2, 2 micro-batches", one, one_z2, 1e-4, 1e-5);
    char ck_shard[400];
    snprintf(ck_shard, sizeof ck_shard, "%s/checkpoint-1/optimizer-rank00001-of-00002.safetensors", z1);
    CHECK(file_exists(ck_shard), "zero_stage 1 checkpoint has no shard file %s", ck_shard);
    /* one process with 60% of the optimizer offloaded (offload_optimizer_ratio; the device updates the rest):
     * the same bits as without, and its checkpoint resumes without offload to the same bits too (the state file
     * does not depend on where the state lived). Under the sanitizers left to Release: z1_offload runs the
     * offload step sanitized (on a shard rather than the whole, all of it on the host) */
#if !defined(__SANITIZE_ADDRESS__)
    char one_off[300], one_off_resumed[300];
    snprintf(one_off, sizeof one_off, "%s/one_offload", g_tmp);
    snprintf(args, sizeof args, "%s --max_steps 2 --save_steps 1 --per_device_train_batch_size 8 "
             "--gradient_accumulation_steps 2 --offload_optimizer cpu --offload_optimizer_ratio 0.6 --output_dir %s",
             BASE, one_off);
    code = run("", args, &err);
    CHECK(code == 0, "one process, offload_optimizer cpu, ratio 0.6: exit %d: %s", code, err);
    CHECK(strstr(err, "state on the host for 60% (offload_optimizer cpu, ratio 0.6), the device for the rest"),
          "the log does not say where the optimizer state lives: %s", err);
    free(err);
    bool same_off = same_file(one, one_off, "model.safetensors");
    printf("one process, offload_optimizer cpu, ratio 0.6: final weights identical to the optimizer on the device: "
           "%s\n", same_off ? "yes" : "NO");
    CHECK(same_off, "offload_optimizer cpu (ratio 0.6) changed the result");
    snprintf(one_off_resumed, sizeof one_off_resumed, "%s/one_offload_resumed", g_tmp);
    snprintf(args, sizeof args, "%s --max_steps 2 --per_device_train_batch_size 8 --gradient_accumulation_steps 2 "
             "--output_dir %s --resume_from_checkpoint %s/checkpoint-1", BASE, one_off_resumed, one_off);
    code = run("", args, &err);
    bool same_resumed = code == 0 && same_file(one, one_off_resumed, "model.safetensors");
    printf("its checkpoint-1 resumed with the optimizer on the device: exit %d, final weights identical: %s\n", code,
           same_resumed ? "yes" : "NO");
    CHECK(same_resumed, "offloaded (ratio 0.6) checkpoint resumed on the device: exit %d: %s", code, err);
    free(err);
#endif
    /* the sharded checkpoint resumed at world size 2 (exact), 4 and 1 (resharded; the gradient sums group
     * differently, so within float rounding) */
    const struct {
        int np, batch, accum;
    } resume_cases[] = {{2, 8, 1},
#if !defined(__SANITIZE_ADDRESS__) /* 4 ranks: Release only (resharding runs sanitized at world size 1) */
                        {4, 4, 1},
#endif
                        {1, 8, 2}};
    for (size_t k = 0; k < sizeof resume_cases / sizeof resume_cases[0]; k++) {
        char dir[300];
        snprintf(dir, sizeof dir, "%s/z1_resumed%d", g_tmp, resume_cases[k].np);
        snprintf(prefix, sizeof prefix, "%s -np %d", MPIRUN, resume_cases[k].np);
        snprintf(args, sizeof args, "%s --max_steps 2 --save_steps 1 --per_device_train_batch_size %d "
                 "--gradient_accumulation_steps %d --zero_stage 1 --output_dir %s --resume_from_checkpoint "
                 "%s/checkpoint-1", BASE, resume_cases[k].batch, resume_cases[k].accum, dir, z1);
        code = run(resume_cases[k].np > 1 ? prefix : "", args, &err);
        double wd = weights_difference(z1, dir);
        printf("zero_stage 1 checkpoint of 2 ranks resumed at world size %d: exit %d, final weights within %g\n",
               resume_cases[k].np, code, wd);
        CHECK(code == 0 && (resume_cases[k].np == 2 ? wd == 0.0 : wd <= 1e-5), "resume at world size %d: exit %d, "
              "weights %g: %s", resume_cases[k].np, code, wd, err);
        free(err);
    }
    /* a shard lost: the resume names it and stops before any work */
    char moved[420];
    snprintf(moved, sizeof moved, "%s.away", ck_shard);
    CHECK(rename(ck_shard, moved) == 0, "cannot move %s", ck_shard);
    snprintf(args, sizeof args, "%s --max_steps 2 --per_device_train_batch_size 8 --gradient_accumulation_steps 2 "
             "--zero_stage 1 --output_dir %s/z1_lost --resume_from_checkpoint %s/checkpoint-1", BASE, g_tmp, z1);
    code = run("", args, &err);
    printf("resume with a shard file missing: exit %d: %s", code, err);
    CHECK(code != 0 && strstr(err, "optimizer-rank00001-of-00002.safetensors is missing"),
          "a lost shard: exit %d: %s", code, err);
    free(err);
    rename(moved, ck_shard);

    /* 4. SIGINT to one rank: all stop after the same step, rank 0 checkpoints, all exit 0 */
    char sig_dir[300], cmd[8192];
    snprintf(sig_dir, sizeof sig_dir, "%s/sigint", g_tmp);
    snprintf(cmd, sizeof cmd, "exec env OMP_NUM_THREADS=1 %s %s -np 2 %s train %s --max_steps 40 --save_steps 0 "
             "--per_device_train_batch_size 8 --output_dir %s", LSAN_ENV, MPIRUN, COLT_BINARY, BASE, sig_dir);
    pid_t launcher = start_command(cmd, NULL, NULL);
    wait_for_metric_lines(sig_dir, 2, 120);
    pid_t rank_pid = child_colt(launcher);
    CHECK(rank_pid > 0, "no colt rank found under mpirun");
    if (rank_pid > 0) kill(rank_pid, SIGINT);
    int status = 0;
    waitpid(launcher, &status, 0);
    int lines = count_metric_lines(sig_dir), ckpt = newest_checkpoint(sig_dir);
    printf("SIGINT to one rank (pid %d): mpirun exit %d, %d steps logged, checkpoint-%d saved\n", (int)rank_pid,
           WIFEXITED(status) ? WEXITSTATUS(status) : -1, lines, ckpt);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "SIGINT: mpirun status %d", status);
    CHECK(ckpt >= 2 && ckpt == lines && ckpt < 40, "SIGINT: checkpoint-%d after %d logged steps", ckpt, lines);

    /* 5. a rank killed mid-run: the others end, non-zero, within the bound */
    snprintf(sig_dir, sizeof sig_dir, "%s/killed", g_tmp);
    snprintf(cmd, sizeof cmd, "exec env OMP_NUM_THREADS=1 %s %s -np 2 %s train %s --max_steps 40 --save_steps 0 "
             "--per_device_train_batch_size 8 --ddp_timeout 30 --output_dir %s", LSAN_ENV, MPIRUN, COLT_BINARY, BASE,
             sig_dir);
    launcher = start_command(cmd, NULL, NULL);
    wait_for_metric_lines(sig_dir, 1, 120);
    rank_pid = child_colt(launcher);
    double killed_at = now_s();
    if (rank_pid > 0) kill(rank_pid, SIGKILL);
    waitpid(launcher, &status, 0);
    double took = now_s() - killed_at;
    printf("kill -9 of one rank: the job ended in %.1f s with status %d (bound: ddp_timeout 30 s)\n", took,
           WIFEXITED(status) ? WEXITSTATUS(status) : -1);
    CHECK(!(WIFEXITED(status) && WEXITSTATUS(status) == 0) && took < 45, "killed rank: status %d after %.1f s", status,
          took);

    /* 6. bad launches */
    snprintf(prefix, sizeof prefix, "%s -np 3", MPIRUN);
    snprintf(args, sizeof args, "%s --max_steps 1 --per_device_train_batch_size 8 --generation_batch_size 16 "
             "--output_dir %s/bad", BASE, g_tmp);
    code = run(prefix, args, &err);
    printf("16 completions over 3 ranks of 8: exit %d: %s", code, err);
    CHECK(code != 0 && strstr(err, "divisible"), "a batch the world cannot split: exit %d: %s", code, err);
    free(err);
    snprintf(args, sizeof args, "%s --max_steps 1 --output_dir %s/bad", BASE, g_tmp);
    code = run("env RANK=1 WORLD_SIZE=1", args, &err);
    printf("RANK=1 WORLD_SIZE=1: exit %d: %s", code, err);
    CHECK(code != 0 && strstr(err, "RANK"), "inconsistent launch variables: exit %d: %s", code, err);
    free(err);

    snprintf(prefix, sizeof prefix, "%s -np 2", MPIRUN);
    snprintf(args, sizeof args, "--config examples/demo.yaml --max_steps 1 --eval_dataset null --device auto "
             "--output_dir %s/bad", g_tmp);
    code = run(prefix, args, &err);
    printf("2 ranks, no GPU, --device auto: exit %d: %s", code, err);
    CHECK(code != 0 && strstr(err, "--device cpu"), "CPU ranks by accident: exit %d: %s", code, err);
    free(err);

    /* A port another process holds, and a rendezvous address nobody answers:
     * bounded one-line errors, not hangs. */
    int holder = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t addr_len = sizeof addr;
    if (holder >= 0 && bind(holder, (struct sockaddr *)&addr, sizeof addr) == 0 && listen(holder, 1) == 0 &&
        getsockname(holder, (struct sockaddr *)&addr, &addr_len) == 0) {
        snprintf(prefix, sizeof prefix,
                 "env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=%d",
                 ntohs(addr.sin_port));
        snprintf(args, sizeof args, "%s --max_steps 1 --ddp_timeout 5 --output_dir %s/bad", BASE, g_tmp);
        double t0 = now_s();
        code = run(prefix, args, &err);
        took = now_s() - t0;
        printf("MASTER_PORT in use: exit %d after %.1f s: %s", code, took, err);
        CHECK(code == 1 && strstr(err, "in use") && strstr(err, "MASTER_PORT") && took < 30,
              "port in use: exit %d after %.1f s: %s", code, took, err);
        free(err);
    } else {
        CHECK(0, "could not hold a local port for the port-in-use case");
    }
    if (holder >= 0) close(holder);
    snprintf(args, sizeof args, "%s --max_steps 1 --ddp_timeout 3 --output_dir %s/bad", BASE, g_tmp);
    double t0 = now_s();
    code = run("env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 MASTER_ADDR=no-such-host.invalid MASTER_PORT=29511",
               args, &err);
    took = now_s() - t0;
    printf("unreachable MASTER_ADDR: exit %d after %.1f s: %s", code, took, err);
    CHECK(code == 1 && strstr(err, "cannot reach MASTER_ADDR=no-such-host.invalid:29511 within 3 s") &&
              !strstr(err, "rank 1: rank 1") && took < 30,
          "unreachable MASTER_ADDR: exit %d after %.1f s: %s", code, took, err);
    free(err);

    sh("rm -rf %s", g_tmp);
    printf("%d checks, %d failed\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
