/* test_memory_plan.c — the memory plan (train/memory_plan.h) against what a
 * run allocates, and `colt train --dry_run`:
 *   - the demo on the CPU: the backend's allocation peak (memory_stats, in
 *     metrics.jsonl) equals the --dry_run --json plan's parts within 5%:
 *     weights + reference + gradients + optimizer state + the larger of the
 *     training activations and the engine's scratch and KV pool (the CPU
 *     engine takes the whole round's pool; activations are given back while
 *     it generates); with zero_stage 1, 2 and 3 over 2 ranks, zero_stage 2 in one
 *     process and with the optimizer offloaded too;
 *   - a Qwen2.5-7B shape (its config.json alone) on an 80 GB device: the
 *     benchmark's batch does not fit with the optimizer on the GPU (exit 1, the
 *     plan names offload and recompute), fits with offload_optimizer cpu and
 *     32-sequence micro-batches (recompute chosen by the plan), and the JSON
 *     has the documented keys; offload with too little host memory is refused;
 *   - bad flags get one line and a non-zero exit. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/fileio.h"
#include "harness.h"

/* In sanitizer builds: Open MPI keeps what MPI_Init allocates until exit (as test_dist_train). */
#define LSAN_ENV "LSAN_OPTIONS=suppressions=" COLT_SOURCE_DIR "/tests/lsan_openmpi.supp:fast_unwind_on_malloc=0"
#define MPIRUN_2 "mpirun --oversubscribe --allow-run-as-root --bind-to none -x OMP_NUM_THREADS=1 -x " NO_LEAK_CHECK " -np 2"

/* Runs "colt train ARGS" (through sh, with prefix); stdout into *out, stderr into *err. */
static int colt(const char *prefix, const char *args, char **out, char **err) {
    ColtRun how = {.env = "OMP_NUM_THREADS=1 OMP_WAIT_POLICY=passive " LSAN_ENV, .launcher = prefix,
                   .subcommand = "train", .out = out};
    return run_colt_with(&how, args, err);
}

static double part(json_t *plan, const char *name) {
    return json_number_value(json_object_get(json_object_get(plan, "per_device_gb"), name));
}

/* The largest memory/allocated_peak_gb of a run's metrics. */
static double measured_peak(const char *dir) {
    char *text = read_text(dir, "metrics.jsonl");
    double peak = -1;
    for (char *line = text ? strtok(text, "\n") : NULL; line; line = strtok(NULL, "\n")) {
        json_t *j = json_loads(line, 0, NULL);
        double v = json_number_value(json_object_get(j, "memory/allocated_peak_gb"));
        if (v > peak) peak = v;
        json_decref(j);
    }
    free(text);
    return peak;
}

static const char *DEMO = "--config examples/demo.yaml --max_steps 2 --eval_dataset null --device cpu "
                          "--max_prompt_length 8 --logging_steps 1 --save_steps 0 --log_completions_count 0";

static void plan_matches_run(const char *what, const char *prefix, const char *extra, int world) {
    char args[4096], dir[300], *out, *err;
    static int runs = 0;
    snprintf(dir, sizeof dir, "%s/run_%d", g_tmp, runs++);
    snprintf(args, sizeof args, "%s %s --output_dir %s", DEMO, extra, dir);
    int code = colt(prefix, args, &out, &err);
    CHECK(code == 0, "%s: exit %d: %s", what, code, err);
    free(out), free(err);
    double peak = measured_peak(dir);
    snprintf(args, sizeof args, "%s %s --output_dir %s --dry_run --json --world_size %d", DEMO, extra, dir, world);
    code = colt("", args, &out, &err);
    json_t *plan = json_loads(out, 0, NULL);
    CHECK(code == 0 && plan && json_is_true(json_object_get(plan, "fits")), "%s: dry run exit %d: %s %s", what, code,
          out, err);
    /* The CPU engine takes the whole round's pool after the activations are given back. */
    double persistent = part(plan, "weights") + part(plan, "reference_model") + part(plan, "gradients") +
                        part(plan, "optimizer_state");
    double expect = part(plan, "expected_peak");
    /* zero_stage 3 generates with the whole weights in place of its part; gathering holds both */
    double whole = part(plan, "weights_gathered");
    double generating = persistent - (whole > 0 ? part(plan, "weights") : 0) + whole + part(plan, "engine_scratch") +
                        part(plan, "kv_cache_wanted");
    double gathering = whole > 0 ? persistent + whole : 0;
    CHECK(fabs(expect - fmax(persistent + part(plan, "activations"), fmax(generating, gathering))) < 1e-5,
          "%s: expected_peak %.6f is not the parts' sum", what, expect);
    double rel = fabs(peak - expect) / expect;
    printf("%s: allocated peak %.6f GB, plan %.6f GB (%.2f%%)\n", what, peak, expect, 100 * rel);
    CHECK(peak > 0 && rel <= 0.05, "%s: allocated peak %.6f GB vs plan %.6f GB", what, peak, expect);
    json_decref(plan);
    free(out), free(err);
}

static void write_file(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_test_memory_plan_XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    setvbuf(stdout, NULL, _IOLBF, 0);

    /* 1. plan against the allocator on the CPU */
    plan_matches_run("demo, 1 process", "", "", 1);
    plan_matches_run("demo, 1 process, offload_optimizer cpu", "", "--offload_optimizer cpu", 1);
    plan_matches_run("demo, 1 process, offload_optimizer cpu, ratio 0.5", "",
                     "--offload_optimizer cpu --offload_optimizer_ratio 0.5", 1);
    plan_matches_run("demo, 1 process, zero_stage 2", "", "--zero_stage 2", 1);
    if (system("command -v mpirun > /dev/null 2>&1") == 0) {
        const char *mpirun = MPIRUN_2;
        plan_matches_run("demo, 2 ranks, zero_stage 1", mpirun, "--zero_stage 1 --per_device_train_batch_size 8", 2);
        plan_matches_run("demo, 2 ranks, zero_stage 2", mpirun, "--zero_stage 2 --per_device_train_batch_size 8", 2);
        plan_matches_run("demo, 2 ranks, zero_stage 3", mpirun, "--zero_stage 3 --per_device_train_batch_size 8", 2);
    } else printf("SKIPPED: the 2-rank plans (mpirun not found)\n");

    /* 2. a 7B shape on an 80 GB device, from config.json alone */
    char model[300], args[4096], *out, *err;
    snprintf(model, sizeof model, "%s/qwen2.5-7b", g_tmp);
    sh("mkdir -p %s", model);
    char cfg_path[400];
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", model);
    write_file(cfg_path,
               "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", \"hidden_size\": 3584, "
               "\"intermediate_size\": 18944, \"num_hidden_layers\": 28, \"num_attention_heads\": 28, "
               "\"num_key_value_heads\": 4, \"vocab_size\": 152064, \"max_position_embeddings\": 32768, "
               "\"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, \"tie_word_embeddings\": false, "
               "\"torch_dtype\": \"bfloat16\", \"bos_token_id\": 151643, \"eos_token_id\": 151643}\n");
    const char *bench = "--config bench/gpu/grpo_bench.yaml --dataset none.jsonl --device cuda --max_prompt_length 200";
    snprintf(args, sizeof args, "%s --model %s --output_dir %s/o --dry_run --device_memory_gb 80 --host_memory_gb 128",
             bench, model, g_tmp);
    int code = colt("", args, &out, &err);
    printf("7B, optimizer on the GPU: exit %d\n%s", code, out);
    CHECK(code == 1 && strstr(out, "does NOT fit") && strstr(out, "offload_optimizer: cpu") &&
              strstr(out, "gradient_checkpointing: true"),
          "7B on 80 GB without offload: exit %d: %s %s", code, out, err);
    free(out), free(err);
    /* the same on 2 ranks: the plan also names the tensor_parallel_size that fits (28 heads, 4 KV heads: 2 or 4) */
    snprintf(args, sizeof args, "%s --model %s --output_dir %s/o --dry_run --device_memory_gb 80 --host_memory_gb 128 "
             "--world_size 2", bench, model, g_tmp);
    code = colt("", args, &out, &err);
    CHECK(code == 1 && strstr(out, "- tensor_parallel_size: 4 (every layer cut across that many GPUs: "),
          "7B on 2 x 80 GB: the tensor_parallel_size suggestion: exit %d: %s %s", code, out, err);
    free(out), free(err);
    /* ... and planned with it: one rank's part (weights 14.2 GB / 4) */
    snprintf(args, sizeof args, "%s --model %s --output_dir %s/o --dry_run --json --device_memory_gb 80 "
             "--host_memory_gb 128 --world_size 4 --tensor_parallel_size 4", bench, model, g_tmp);
    code = colt("", args, &out, &err);
    json_t *tp_plan = json_loads(out, 0, NULL);
    double tp_weights = json_number_value(json_object_get(json_object_get(tp_plan, "per_device_gb"), "weights"));
    CHECK(code == 0 && tp_plan && json_is_true(json_object_get(tp_plan, "fits")) && tp_weights > 3.5 && tp_weights < 3.6,
          "7B at tensor_parallel_size 4: exit %d, weights %.2f GB: %s %s", code, tp_weights, out, err);
    printf("7B at tensor_parallel_size 4 on 4 x 80 GB: fits, %.2f GB of weights per device\n", tp_weights);
    json_decref(tp_plan);
    free(out), free(err);
    snprintf(args, sizeof args, "%s --model %s --output_dir %s/o --dry_run --json --device_memory_gb 80 "
             "--host_memory_gb 128 --offload_optimizer cpu --per_device_train_batch_size 32 "
             "--gradient_accumulation_steps 4", bench, model, g_tmp);
    code = colt("", args, &out, &err);
    json_t *plan = json_loads(out, 0, NULL);
    CHECK(code == 0 && plan && json_is_true(json_object_get(plan, "fits")) &&
              json_is_true(json_object_get(plan, "recompute")),
          "7B with offload: exit %d: %s %s", code, out, err);
    const char *keys[] = {"fits", "device_memory_gb", "host_memory_gb", "per_device_gb", "host_gb", "world_size",
                          "zero_stage", "suggestions"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        CHECK(json_object_get(plan, keys[i]) != NULL, "--json has no key %s", keys[i]);
    double host_opt = json_number_value(json_object_get(json_object_get(plan, "host_gb"), "optimizer_state"));
    printf("7B with offload_optimizer cpu, micro-batches of 32: exit %d, peak %.1f GB per GPU, %.1f GB of host "
           "memory for the optimizer\n",
           code, part(plan, "peak"), host_opt);
    /* 7.6e9 parameters x 12 bytes = 85 GiB on the host; on the GPU 2 + 4 bytes each = 42.6 GiB and activations */
    CHECK(host_opt > 84 && host_opt < 86 && part(plan, "peak") > 42 && part(plan, "peak") < 80,
          "7B with offload: host %.1f GB, peak %.1f GB", host_opt, part(plan, "peak"));
    json_decref(plan);
    free(out), free(err);
    /* On a 141 GB device the same run has room to spare: the plan names the ratio that keeps part of the state
     * on the device, and planned with that ratio the run still fits, the state split as the ratio says */
    snprintf(args, sizeof args, "%s --model %s --output_dir %s/o --dry_run --json --device_memory_gb 141 "
             "--host_memory_gb 128 --offload_optimizer cpu --per_device_train_batch_size 32 "
             "--gradient_accumulation_steps 4", bench, model, g_tmp);
    code = colt("", args, &out, &err);
    plan = json_loads(out, 0, NULL);
    double room_ratio = json_number_value(json_object_get(plan, "offload_optimizer_ratio_room"));
    CHECK(code == 0 && plan && room_ratio > 0 && room_ratio < 1, "7B with offload on 141 GB: exit %d, ratio room %g: %s",
          code, room_ratio, out);
    json_decref(plan);
    free(out), free(err);
    snprintf(args, sizeof args, "%s --model %s --output_dir %s/o --dry_run --json --device_memory_gb 141 "
             "--host_memory_gb 128 --offload_optimizer cpu --offload_optimizer_ratio %g --per_device_train_batch_size 32 "
             "--gradient_accumulation_steps 4", bench, model, g_tmp, room_ratio);
    code = colt("", args, &out, &err);
    plan = json_loads(out, 0, NULL);
    double host_part = json_number_value(json_object_get(json_object_get(plan, "host_gb"), "optimizer_state"));
    double device_part = plan ? part(plan, "optimizer_state") : 0, state = 7.6157e9 * 12 / (1 << 30);
    printf("7B with offload on 141 GB: the plan names offload_optimizer_ratio %.2f; with it, %.1f GB of the state on "
           "the device and %.1f GB on the host, peak %.1f GB\n", room_ratio, device_part, host_part,
           plan ? part(plan, "expected_peak") : 0);
    CHECK(code == 0 && plan && json_is_true(json_object_get(plan, "fits")) &&
              fabs(device_part - (1 - room_ratio) * state) < 0.01 * state && fabs(host_part - room_ratio * state) < 0.01 * state &&
              part(plan, "expected_peak") + 2 <= 141,
          "7B with offload_optimizer_ratio %g on 141 GB: exit %d, device %.2f GB, host %.2f GB: %s %s", room_ratio, code,
          device_part, host_part, out, err);
    json_decref(plan);
    free(out), free(err);

    /* The KV pool a round wants: every sequence of the rank's round at once (TRL's vLLM max_num_seqs), up to
     * the largest CUDA-graph batch (512): 512 and 1024 want 4x what 128 wants */
    double kv_wanted[3];
    const int rounds[3] = {128, 512, 1024};
    for (int i = 0; i < 3; i++) {
        snprintf(args, sizeof args, "%s --model %s --output_dir %s/o --dry_run --json --device_memory_gb 80 "
                 "--host_memory_gb 128 --offload_optimizer cpu --generation_batch_size %d", bench, model, g_tmp,
                 rounds[i]);
        code = colt("", args, &out, &err);
        plan = json_loads(out, 0, NULL);
        kv_wanted[i] = plan ? part(plan, "kv_cache_wanted") : 0;
        CHECK(code == 0 && plan, "7B, generation_batch_size %d: exit %d: %s %s", rounds[i], code, out, err);
        json_decref(plan);
        free(out), free(err);
    }
    printf("7B, KV cache a round wants: %.2f / %.2f / %.2f GB for rounds of 128 / 512 / 1024\n", kv_wanted[0],
           kv_wanted[1], kv_wanted[2]);
    CHECK(kv_wanted[0] > 1 && fabs(kv_wanted[1] / kv_wanted[0] - 4) < 0.01 && fabs(kv_wanted[2] / kv_wanted[0] - 4) < 0.01,
          "KV cache wanted: %.3f / %.3f / %.3f GB", kv_wanted[0], kv_wanted[1], kv_wanted[2]);

    /* zero_stage 3 over 8 ranks: the weights' share drops to a part, two layers and the embedding / lm_head;
     * generation still gathers the whole 15.2 GB */
    snprintf(args, sizeof args, "%s --model %s --output_dir %s/o --dry_run --json --device_memory_gb 80 "
             "--world_size 8 --zero_stage 3 --per_device_train_batch_size 8 --gradient_accumulation_steps 1", bench,
             model, g_tmp);
    code = colt("", args, &out, &err);
    plan = json_loads(out, 0, NULL);
    double w3 = part(plan, "weights"), whole = part(plan, "weights_gathered");
    printf("7B, zero_stage 3 over 8 ranks: exit %d, weights %.2f GB per GPU while training, %.2f GB gathered to "
           "generate, peak %.1f GB\n", code, w3, whole, part(plan, "peak"));
    /* 14.19 GiB / 8 + 2 layer windows x 0.43 GiB + embedding and lm_head 2 x 1.02 GiB */
    CHECK(code == 0 && plan && whole > 14.1 && whole < 14.3 && w3 > 4.55 && w3 < 4.8, "7B zero_stage 3: exit %d: %s %s",
          code, out, err);
    json_decref(plan);
    free(out), free(err);
    /* a 72B shape on 32 x 80 GB with zero_stage 3 and offload: training would fit, but the colocated engine
     * needs the whole 135 GiB on each GPU: the plan says so and names tensor parallelism */
    char model72[300];
    snprintf(model72, sizeof model72, "%s/qwen2.5-72b", g_tmp);
    sh("mkdir -p %s", model72);
    snprintf(cfg_path, sizeof cfg_path, "%s/config.json", model72);
    write_file(cfg_path,
               "{\"architectures\": [\"Qwen2ForCausalLM\"], \"model_type\": \"qwen2\", \"hidden_size\": 8192, "
               "\"intermediate_size\": 29568, \"num_hidden_layers\": 80, \"num_attention_heads\": 64, "
               "\"num_key_value_heads\": 8, \"vocab_size\": 152064, \"max_position_embeddings\": 32768, "
               "\"rms_norm_eps\": 1e-06, \"rope_theta\": 1000000.0, \"tie_word_embeddings\": false, "
               "\"torch_dtype\": \"bfloat16\", \"bos_token_id\": 151643, \"eos_token_id\": 151643}\n");
    snprintf(args, sizeof args, "%s --model %s --output_dir %s/o --dry_run --device_memory_gb 80 --world_size 32 "
             "--zero_stage 3 --offload_optimizer cpu --host_memory_gb 2000 --per_device_train_batch_size 4 "
             "--gradient_accumulation_steps 1", bench, model72, g_tmp);
    code = colt("", args, &out, &err);
    printf("72B, zero_stage 3 + offload over 32 ranks: exit %d\n%s", code, out);
    CHECK(code == 1 && strstr(out, "does NOT fit") && strstr(out, "tensor parallelism"),
          "72B zero_stage 3 on 80 GB: exit %d: %s %s", code, out, err);
    free(out), free(err);

    /* offload with too little host memory for the optimizer state: refused by the plan */
    snprintf(args, sizeof args, "%s --model %s --output_dir %s/o --dry_run --device_memory_gb 80 --host_memory_gb 40 "
             "--offload_optimizer cpu --per_device_train_batch_size 32 --gradient_accumulation_steps 4", bench, model,
             g_tmp);
    code = colt("", args, &out, &err);
    printf("7B offloaded with 40 GB of host memory: exit %d\n", code);
    CHECK(code == 1 && strstr(out, "does NOT fit") && strstr(out, "host memory"), "offload without host memory: exit "
          "%d: %s %s", code, out, err);
    free(out), free(err);

    /* 3. bad flags */
    const struct {
        const char *flags, *needle;
    } bad[] = {{"--dry_run --world_size 0", "--world_size needs a positive whole number"},
               {"--json", "go with --dry_run"},
               {"--dry_run --device_memory_gb lots", "--device_memory_gb needs a positive number of GB"}};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(args, sizeof args, "%s --model %s --output_dir %s/o %s", bench, model, g_tmp, bad[i].flags);
        code = colt("", args, &out, &err);
        CHECK(code != 0 && strstr(err, bad[i].needle) && count_lines(err) == 1, "%s: exit %d: %s", bad[i].flags, code,
              err);
        printf("%s: exit %d: %s", bad[i].flags, code, err);
        free(out), free(err);
    }
    /* 4. max_prompt_length not set (TRL 1.16 has none): whole prompts. A 750-token prompt (the old default cut
     * it to 512) sizes the plan whole, and training refuses it in one line naming the row, since it cannot fit
     * stories260K's 512 positions; max_prompt_length 64 cuts it. Without the dataset the dry run needs the key. */
    char data[300];
    snprintf(data, sizeof data, "%s/long.jsonl", g_tmp);
    FILE *f = fopen(data, "w");
    if (f) {
        fprintf(f, "{\"prompt\": \"Once upon a time.\"}\n{\"prompt\": \"");
        for (int i = 0; i < 50; i++) fprintf(f, "%sOnce upon a time, there was a little girl named Tim.", i ? " " : "");
        fprintf(f, "\"}\n");
        fclose(f);
    }
    const char *base = "--config examples/demo.yaml --eval_dataset null --device cpu --max_steps 1";
    int longest = -1, cut = -1;
    snprintf(args, sizeof args, "%s --dataset %s --output_dir %s/o --dry_run", base, data, g_tmp);
    code = colt("", args, &out, &err);
    const char *at = strstr(out, "longest prompt: ");
    if (at) sscanf(at, "longest prompt: %d", &longest);
    free(out), free(err);
    snprintf(args, sizeof args, "%s --dataset %s --output_dir %s/o --dry_run --max_prompt_length 64", base, data, g_tmp);
    code = colt("", args, &out, &err);
    at = strstr(out, "longest prompt: ");
    if (at) sscanf(at, "longest prompt: %d", &cut);
    free(out), free(err);
    printf("a 750-token prompt: the dry run plans %d tokens by default, %d with max_prompt_length 64\n", longest, cut);
    CHECK(longest >= 750 && longest <= 751 && cut == 64, "longest prompt %d (want 750, or 751 with a bos), cut %d", longest,
          cut);
    snprintf(args, sizeof args, "%s --dataset %s --output_dir %s/o", base, data, g_tmp);
    code = colt("", args, &out, &err);
    char want[128];
    snprintf(want, sizeof want, "row 1: prompt of %d tokens + max_completion_length", longest);
    printf("training on it: exit %d: %s", code, err);
    CHECK(code != 0 && strstr(err, want) && strstr(err, "max_position_embeddings (512)") && count_lines(err) == 1,
          "a prompt too long for the model: exit %d: %s", code, err);
    free(out), free(err);
    snprintf(args, sizeof args, "%s --dataset none.jsonl --output_dir %s/o --dry_run", base, g_tmp);
    code = colt("", args, &out, &err);
    printf("a dry run without the dataset or max_prompt_length: exit %d: %s", code, err);
    CHECK(code != 0 && strstr(err, "set max_prompt_length") && count_lines(err) == 1, "exit %d: %s", code, err);
    free(out), free(err);

    sh("rm -rf %s", g_tmp);
    printf("%d checks, %d failed\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
