/* test_cuda_dist_train.c — data-parallel GRPO on the GPU (GPU machine only).
 * The demo config (bf16, deterministic mode) for 4 steps with 16 completions a
 * step, three ways:
 *   one      one process, 2 micro-batches of 8 accumulated;
 *   shared   2 ranks on GPU 0 (--devices [0,0]), 8 each: gradients summed on
 *            the host in rank order (NCCL refuses two ranks on one GPU);
 *   nccl     2 ranks on GPUs 0 and 1, 8 each: gradients all-reduced over NCCL
 *            in buckets during the backward pass (needs two GPUs).
 * A sum of two partial gradients has the same bits in either order and on
 * either path, and one process adds its second micro-batch to the first the
 * same way, so every metric of every step (timings and the engine's own pool
 * aside) and the saved weights must be identical across the three. The logs
 * must name the gradient path each took. The same holds with the optimizer
 * offloaded to the host and with zero_stage 1, 2 and 3 (shared GPU; over NCCL
 * with two GPUs). Exit 77 when no GPU. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "backend/backend.h"
#include "core/fileio.h"
#include "../harness.h"

#define STEPS 4

static int train(const char *extra, const char *out_dir) {
    char cmd[2048];
    const char *colt = getenv("COLT_BINARY") ? getenv("COLT_BINARY") : "build-cuda/colt";
    snprintf(cmd, sizeof cmd,
             "rm -rf %s && %s train --config examples/demo.yaml --max_completion_length 24 --eval_dataset null "
             "--logging_steps 1 --log_completions_count 0 --save_steps 0 --max_steps %d --device cuda --ddp_timeout 120 "
             "%s --output_dir %s > %s.log 2>&1",
             out_dir, colt, STEPS, extra, out_dir, out_dir);
    int st = system(cmd);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* metrics.jsonl's lines without the keys that differ by design. */
static json_t *metrics(const char *dir) {
    char *p = path_join(dir, "metrics.jsonl"), *data = NULL;
    size_t len;
    json_t *rows = json_array();
    if (file_read_all(p, &data, &len, NULL) == 0) {
        for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n")) {
            json_t *o = json_loads(line, 0, NULL);
            if (!o) continue;
            const char *k;
            json_t *v;
            void *tmp;
            json_object_foreach_safe(o, tmp, k, v) {
                if (!strncmp(k, "time/", 5) || !strncmp(k, "engine/", 7) || !strncmp(k, "memory/", 7) ||
                    !strcmp(k, "step_time"))
                    json_object_del(o, k);
            }
            json_array_append_new(rows, o);
        }
    }
    free(p);
    free(data);
    return rows;
}

static bool log_says(const char *dir, const char *text) {
    char path[512], *data = NULL;
    size_t len;
    snprintf(path, sizeof path, "%s.log", dir);
    bool found = file_read_all(path, &data, &len, NULL) == 0 && strstr(data, text);
    free(data);
    return found;
}

static void compare(const char *label, const char *dir, json_t *want, const char *want_dir) {
    json_t *got = metrics(dir);
    CHECK(json_array_size(got) == STEPS, "%s: %zu steps logged, want %d (see %s.log)", label, json_array_size(got),
          STEPS, dir);
    size_t differing = 0, compared = 0;
    for (size_t s = 0; s < json_array_size(got) && s < json_array_size(want); s++) {
        json_t *a = json_array_get(want, s), *b = json_array_get(got, s);
        const char *k;
        json_t *v;
        json_object_foreach(a, k, v) {
            compared++;
            if (!json_equal(v, json_object_get(b, k))) {
                if (differing++ < 5)
                    printf("  %s step %zu: %s %.9g vs %.9g\n", label, s + 1, k, json_number_value(v),
                           json_number_value(json_object_get(b, k)));
            }
        }
    }
    bool weights = same_file(want_dir, dir, "model.safetensors");
    printf("%s %s: %zu metric values over %d steps compared with one process, %zu differ; saved weights %s\n",
           differing == 0 && weights && compared > 0 ? "ok  " : "FAIL", label, compared, STEPS, differing,
           weights ? "identical" : "DIFFER");
    if (differing || !weights || compared == 0) g_failures++;
    json_decref(got);
}

/* The memory plan (colt train --dry_run --json, the same settings) against the
 * allocator's peak of the run in dir (memory/allocated_peak_gb): within 5%.
 * The allocator counts colt's buffers, not the CUDA context the plan adds. */
static void plan_against_run(const char *dir, const char *extra) {
    char cmd[2048], path[512];
    const char *colt = getenv("COLT_BINARY") ? getenv("COLT_BINARY") : "build-cuda/colt";
    snprintf(path, sizeof path, "%s.plan.json", dir);
    snprintf(cmd, sizeof cmd,
             "%s train --config examples/demo.yaml --max_completion_length 24 --eval_dataset null --max_steps %d "
             "--device cuda %s --output_dir %s --dry_run --json > %s 2>&1",
             colt, STEPS, extra, dir, path);
    int st = system(cmd);
    char *data = NULL;
    size_t len;
    json_t *plan = file_read_all(path, &data, &len, NULL) == 0 ? json_loads(data, 0, NULL) : NULL;
    free(data);
    json_t *dev = json_object_get(plan, "per_device_gb");
    double expect = json_number_value(json_object_get(dev, "expected_peak")) -
                    json_number_value(json_object_get(dev, "backend"));
    double peak = 0;
    char *mp = path_join(dir, "metrics.jsonl");
    if (file_read_all(mp, &data, &len, NULL) == 0) {
        for (char *line = strtok(data, "\n"); line; line = strtok(NULL, "\n")) {
            json_t *o = json_loads(line, 0, NULL);
            double v = json_number_value(json_object_get(o, "memory/allocated_peak_gb"));
            if (v > peak) peak = v;
            json_decref(o);
        }
        free(data);
    }
    free(mp);
    double rel = expect > 0 ? fabs(peak - expect) / expect : INFINITY;
    printf("%s memory plan: expected peak %.4f GB (colt's buffers), allocated peak %.4f GB (%.2f%%)\n",
           WIFEXITED(st) && WEXITSTATUS(st) == 0 && rel <= 0.05 ? "ok  " : "FAIL", expect, peak, 100 * rel);
    CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0 && rel <= 0.05, "plan %.4f GB vs allocated %.4f GB (see %s)", expect,
          peak, path);
    json_decref(plan);
}

int main(void) {
    int gpus = backend_cuda_device_count();
    if (gpus == 0) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    const char *one = "/tmp/colt_gpu_dist_one", *shared = "/tmp/colt_gpu_dist_shared", *nccl = "/tmp/colt_gpu_dist_nccl";
    CHECK(train("--nproc_per_node 1 --per_device_train_batch_size 8 --gradient_accumulation_steps 2", one) == 0,
          "one process failed (see %s.log)", one);
    json_t *want = metrics(one);
    CHECK(json_array_size(want) == STEPS, "one process logged %zu steps", json_array_size(want));
    plan_against_run(one, "--nproc_per_node 1 --per_device_train_batch_size 8 --gradient_accumulation_steps 2");
    /* Checkpoints hold bf16 weights (the storage's) and the fp32 masters: a resume from step 2 ends with the
     * uninterrupted run's bits. */
    const char *ck = "/tmp/colt_gpu_dist_ck", *resumed = "/tmp/colt_gpu_dist_resumed";
    CHECK(train("--nproc_per_node 1 --per_device_train_batch_size 8 --gradient_accumulation_steps 2 --save_steps 2", ck) ==
              0,
          "the checkpointed run failed (see %s.log)", ck);
    char resume_args[512];
    snprintf(resume_args, sizeof resume_args,
             "--nproc_per_node 1 --per_device_train_batch_size 8 --gradient_accumulation_steps 2 "
             "--resume_from_checkpoint %s/checkpoint-2",
             ck);
    CHECK(train(resume_args, resumed) == 0, "the resumed run failed (see %s.log)", resumed);
    char *cfg_text = NULL, *cfg_path = path_join(ck, "checkpoint-2/config.json");
    size_t cfg_len = 0;
    bool bf16 = file_read_all(cfg_path, &cfg_text, &cfg_len, NULL) == 0 && strstr(cfg_text, "\"bfloat16\"");
    bool same = same_file(one, resumed, "model.safetensors");
    printf("%s checkpoint in bf16: %s; resumed from step 2, final weights identical to the uninterrupted run: %s\n",
           bf16 && same ? "ok  " : "FAIL", bf16 ? "yes" : "NO", same ? "yes" : "NO");
    if (!bf16 || !same) g_failures++;
    free(cfg_text), free(cfg_path);

    CHECK(train("--nproc_per_node 2 --devices '[0,0]' --per_device_train_batch_size 8", shared) == 0,
          "2 ranks on GPU 0 failed (see %s.log)", shared);
    CHECK(log_says(shared, "gradients: summed on the host in rank order: ranks 0 and 1 share GPU"),
          "2 ranks on GPU 0: the log does not say the gradients went through the host (see %s.log)", shared);
    compare("2 ranks sharing GPU 0 (host path)", shared, want, one);

    /* ZeRO-1 and optimizer offload: AdamW is elementwise and the host's repeats the device's arithmetic, so
     * sharding or moving the optimizer changes no bit either. */
    const struct {
        const char *label, *args, *dir;
    } zero[] = {
        {"one process, offload_optimizer cpu",
         "--nproc_per_node 1 --per_device_train_batch_size 8 --gradient_accumulation_steps 2 --offload_optimizer cpu",
         "/tmp/colt_gpu_dist_offload"},
        {"2 ranks sharing GPU 0, zero_stage 1",
         "--nproc_per_node 2 --devices '[0,0]' --per_device_train_batch_size 8 --zero_stage 1", "/tmp/colt_gpu_dist_z1"},
        {"2 ranks sharing GPU 0, zero_stage 1, offload_optimizer cpu",
         "--nproc_per_node 2 --devices '[0,0]' --per_device_train_batch_size 8 --zero_stage 1 --offload_optimizer cpu",
         "/tmp/colt_gpu_dist_z1o"},
        {"2 ranks sharing GPU 0, zero_stage 2",
         "--nproc_per_node 2 --devices '[0,0]' --per_device_train_batch_size 8 --zero_stage 2", "/tmp/colt_gpu_dist_z2"},
        {"2 ranks sharing GPU 0, zero_stage 3",
         "--nproc_per_node 2 --devices '[0,0]' --per_device_train_batch_size 8 --zero_stage 3", "/tmp/colt_gpu_dist_z3"},
        {"2 ranks sharing GPU 0, zero_stage 3, offload_optimizer cpu",
         "--nproc_per_node 2 --devices '[0,0]' --per_device_train_batch_size 8 --zero_stage 3 --offload_optimizer cpu",
         "/tmp/colt_gpu_dist_z3o"},
    };
    for (size_t i = 0; i < sizeof zero / sizeof zero[0]; i++) {
        CHECK(train(zero[i].args, zero[i].dir) == 0, "%s failed (see %s.log)", zero[i].label, zero[i].dir);
        compare(zero[i].label, zero[i].dir, want, one);
    }

    if (gpus >= 2) {
        const char *nccl_z1 = "/tmp/colt_gpu_dist_nccl_z1";
        CHECK(train("--nproc_per_node 2 --per_device_train_batch_size 8 --zero_stage 1", nccl_z1) == 0,
              "2 ranks on 2 GPUs, zero_stage 1 failed (see %s.log)", nccl_z1);
        compare("2 ranks on 2 GPUs, zero_stage 1 (shards broadcast over NCCL)", nccl_z1, want, one);
        const char *nccl_z2 = "/tmp/colt_gpu_dist_nccl_z2";
        CHECK(train("--nproc_per_node 2 --per_device_train_batch_size 8 --zero_stage 2", nccl_z2) == 0,
              "2 ranks on 2 GPUs, zero_stage 2 failed (see %s.log)", nccl_z2);
        compare("2 ranks on 2 GPUs, zero_stage 2 (layers reduced over NCCL as the backward goes)", nccl_z2, want,
                one);
        const char *nccl_z3 = "/tmp/colt_gpu_dist_nccl_z3";
        CHECK(train("--nproc_per_node 2 --per_device_train_batch_size 8 --zero_stage 3", nccl_z3) == 0,
              "2 ranks on 2 GPUs, zero_stage 3 failed (see %s.log)", nccl_z3);
        CHECK(log_says(nccl_z3, "zero_stage 3 over 2 rank(s)"), "zero_stage 3: the log does not say so (see %s.log)",
              nccl_z3);
        compare("2 ranks on 2 GPUs, zero_stage 3 (layers gathered over NCCL, the next one prefetched)", nccl_z3, want,
                one);
        CHECK(train("--nproc_per_node 2 --per_device_train_batch_size 8", nccl) == 0, "2 ranks on 2 GPUs failed (see %s.log)",
              nccl);
        CHECK(log_says(nccl, "gradients: NCCL, all-reduced in buckets"),
              "2 GPUs: the log does not say the gradients went over NCCL (see %s.log)", nccl);
        compare("2 ranks on 2 GPUs (NCCL, overlapped)", nccl, want, one);
    } else {
        printf("one GPU: the NCCL path (2 ranks on 2 GPUs) not run\n");
    }
    json_decref(want);
    printf("%s\n", g_failures ? "FAILED" : "OK");
    return g_failures ? 1 : 0;
}
