/* test_lora_train.c — `colt train` with use_peft, end to end on the CPU with the
 * real stories260K (the demo's settings, made small; beta 0.1, so the
 * reference log-probs come from the same model with its adapters turned off):
 *   1. the run saves PEFT's files (adapter_config.json, adapter_model.safetensors,
 *      no model.safetensors) in output_dir and in each checkpoint, and with
 *      merge_lora a plain merged checkpoint in output_dir/merged that colt loads;
 *      `colt generate --adapter output_dir`, `colt eval --adapter` and `colt score --adapter` apply the adapters
 *      to the base model (score: log-probs within 1e-4 of the merged checkpoint's);
 *   2. resuming from a checkpoint ends with the same adapters, byte for byte, and
 *      the same metrics as the uninterrupted run (lora_dropout at TRL's default
 *      0.05: the masks are keyed by the step, so the resumed run draws the same);
 *      lora_dropout 0 trains other adapters than the default, and says so in
 *      adapter_config.json;
 *   3. bad input: lora_dropout 1, merge_lora without use_peft, a LoRA
 *      checkpoint resumed without use_peft, a checkpoint whose rank differs from
 *      the run's, a full checkpoint resumed with use_peft — each a one-line error,
 *      exit 1. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

static const char *BASE =
    "--config examples/demo.yaml --per_device_train_batch_size 16 --max_completion_length 24 "
    "--logging_steps 1 --log_completions_count 0 --save_total_limit 0 --eval_dataset null "
    "--steps_per_generation 2 --use_peft true --lora_r 8 --lora_alpha 16 --learning_rate 2e-3";

/* `colt train ARGS`; stderr into *err_out. */
static int run(const char *args, char **err_out) {
    return run_colt_with(&(ColtRun){.subcommand = "train", .timeout_s = 600}, args, err_out);
}

static void expect_refused(const char *what, const char *args, const char *needle) {
    char *err = NULL;
    int code = run(args, &err);
    const char *last = err;
    for (const char *p = err; *p; p++)
        if (p[0] == '\n' && p[1]) last = p + 1;
    printf("  refused %-34s -> exit %d: %s", what, code, last);
    CHECK(code == 1 && strstr(err, needle), "%s: want exit 1 and '%s', got %d: %s", what, needle, code, err);
    free(err);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_test_lora_train_XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    char args[8192], ref[300], res[300], ck2[400], *err = NULL;
    snprintf(ref, sizeof ref, "%s/ref", g_tmp);
    snprintf(res, sizeof res, "%s/resumed", g_tmp);
    snprintf(ck2, sizeof ck2, "%s/checkpoint-2", ref);

    /* 1. the uninterrupted run */
    snprintf(args, sizeof args, "%s --beta 0.1 --max_steps 4 --save_steps 2 --merge_lora true --output_dir %s", BASE,
             ref);
    int code = run(args, &err);
    CHECK(code == 0, "LoRA run: exit %d: %s", code, err);
    CHECK(strstr(err, "LoRA: r 8, lora_alpha 16 on q_proj k_proj v_proj o_proj gate_proj up_proj down_proj"),
          "the run does not say what it adapts: %s", err);
    free(err);
    const char *peft_files[] = {"adapter_config.json", "adapter_model.safetensors"};
    for (int i = 0; i < 2; i++) {
        CHECK(exists_in(ref, peft_files[i]), "output_dir has no %s", peft_files[i]);
        CHECK(exists_in(ck2, peft_files[i]), "checkpoint-2 has no %s", peft_files[i]);
    }
    CHECK(!exists_in(ref, "model.safetensors") && !exists_in(ck2, "model.safetensors"),
          "a LoRA run wrote the full model besides its adapters");
    CHECK(exists_in(ck2, "optimizer.safetensors"), "checkpoint-2 has no optimizer state");
    char merged[400];
    snprintf(merged, sizeof merged, "%s/merged", ref);
    CHECK(exists_in(merged, "model.safetensors") && exists_in(merged, "config.json") &&
              exists_in(merged, "tokenizer.json"),
          "merge_lora: output_dir/merged is not a checkpoint");
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "%s generate --model %s --prompt 'Once upon a time' --max_new_tokens 8 > /dev/null 2>&1",
             COLT_BINARY, merged);
    CHECK(system(cmd) == 0, "colt generate cannot load the merged checkpoint");
    snprintf(cmd, sizeof cmd,
             "%s generate --model models/stories260K --adapter %s --prompt 'Once upon a time' --max_new_tokens 8 "
             "> /dev/null 2>&1",
             COLT_BINARY, ref);
    CHECK(system(cmd) == 0, "colt generate --adapter cannot apply the run's adapters");
    sh("printf '{\"problem\": \"1 + 1 = ?\", \"answer\": \"2\"}\\n' > %s/problems.jsonl", g_tmp);
    snprintf(cmd, sizeof cmd,
             "%s eval --model models/stories260K --adapter %s --dataset %s/problems.jsonl --max_completion_length 4 "
             "--output %s/eval.json > /dev/null 2>&1",
             COLT_BINARY, ref, g_tmp, g_tmp);
    CHECK(system(cmd) == 0, "colt eval --adapter failed");
    char *summary = read_text(g_tmp, "eval.json");
    CHECK(summary && strstr(summary, "\"adapter\""), "colt eval --adapter: the summary does not name the adapter");
    free(summary);
    /* colt score --adapter: the base model with the run's adapters scores as the merged checkpoint does
     * (fp32: the adapter's term added beside the base product, against W + scale * B A summed first) */
    const char *ids = "{\"ids\": [1, 403, 407, 261, 378, 300, 5, 40, 77, 12]}";
    snprintf(cmd, sizeof cmd, "echo '%s' | %s score --model models/stories260K --adapter %s > %s/score_adapter.jsonl",
             ids, COLT_BINARY, ref, g_tmp);
    int rc_adapter = system(cmd);
    snprintf(cmd, sizeof cmd, "echo '%s' | %s score --model %s > %s/score_merged.jsonl", ids, COLT_BINARY, merged, g_tmp);
    int rc_merged = system(cmd);
    snprintf(cmd, sizeof cmd, "echo '%s' | %s score --model models/stories260K > %s/score_base.jsonl", ids, COLT_BINARY,
             g_tmp);
    int rc_base = system(cmd);
    double d_merged = -1, d_base = -1;
    {
        char *ta = read_text(g_tmp, "score_adapter.jsonl"), *tm = read_text(g_tmp, "score_merged.jsonl"),
             *tb = read_text(g_tmp, "score_base.jsonl");
        json_t *a = ta ? json_loads(ta, 0, NULL) : NULL, *mj = tm ? json_loads(tm, 0, NULL) : NULL,
               *b = tb ? json_loads(tb, 0, NULL) : NULL;
        json_t *la = json_object_get(a, "logprobs"), *lm = json_object_get(mj, "logprobs"),
               *lb = json_object_get(b, "logprobs");
        if (json_array_size(la) == 9 && json_array_size(lm) == 9 && json_array_size(lb) == 9) {
            d_merged = d_base = 0;
            for (size_t i = 0; i < 9; i++) {
                double x = json_number_value(json_array_get(la, i));
                d_merged = fmax(d_merged, fabs(x - json_number_value(json_array_get(lm, i))));
                d_base = fmax(d_base, fabs(x - json_number_value(json_array_get(lb, i))));
            }
        }
        json_decref(a), json_decref(mj), json_decref(b);
        free(ta), free(tm), free(tb);
    }
    printf("colt score --adapter: log-probs within %.2g of the merged checkpoint's, %.2g from the base model's\n",
           d_merged, d_base);
    CHECK(rc_adapter == 0 && rc_merged == 0 && rc_base == 0 && d_merged >= 0 && d_merged <= 1e-4 && d_base > 1e-3,
          "colt score --adapter (exit %d / merged %d / base %d): %.3g from merged, %.3g from base", rc_adapter, rc_merged,
          rc_base, d_merged, d_base);
    char *cfg = read_text(ref, "adapter_config.json");
    CHECK(cfg && strstr(cfg, "\"r\": 8") && strstr(cfg, "\"peft_type\": \"LORA\"") && strstr(cfg, "models/stories260K"),
          "adapter_config.json: %s", cfg ? cfg : "(missing)");
    free(cfg);
    printf("LoRA run: adapters in output_dir and checkpoint-2 (PEFT's files, no full model), merged checkpoint loads\n");

    /* 2. resume from checkpoint-2 */
    snprintf(args, sizeof args, "%s --beta 0.1 --max_steps 4 --save_steps 2 --output_dir %s --resume_from_checkpoint %s",
             BASE, res, ck2);
    code = run(args, &err);
    CHECK(code == 0, "resumed run: exit %d: %s", code, err);
    free(err);
    bool same_adapters = same_file(ref, res, "adapter_model.safetensors");
    char *m_ref = metrics_without_timing(ref), *m_res = metrics_without_timing(res);
    /* the resumed run's metrics.jsonl holds steps 3-4 only: the reference's last two lines */
    const char *tail = m_ref;
    for (int skip = count_lines(m_ref) - count_lines(m_res); skip > 0 && tail; skip--) tail = strchr(tail, '\n') + 1;
    bool same_metrics = count_lines(m_res) == 2 && strcmp(tail, m_res) == 0;
    printf("resumed from checkpoint-2: final adapters %s, metrics of steps 3-4 %s\n",
           same_adapters ? "byte-identical" : "DIFFER", same_metrics ? "identical" : "DIFFER");
    CHECK(same_adapters, "resumed run's adapters differ from the uninterrupted run's");
    CHECK(same_metrics, "resumed metrics differ:\n%s\nvs\n%s", tail, m_res);
    free(m_ref), free(m_res);

    /* lora_dropout 0 against the default 0.05: other adapters after 2 steps, the value in adapter_config.json */
    char nodrop[300];
    snprintf(nodrop, sizeof nodrop, "%s/nodrop", g_tmp);
    snprintf(args, sizeof args, "%s --beta 0.1 --max_steps 2 --save_steps 0 --lora_dropout 0 --output_dir %s", BASE,
             nodrop);
    code = run(args, &err);
    CHECK(code == 0, "lora_dropout 0: exit %d: %s", code, err);
    free(err);
    char *cfg0 = read_text(nodrop, "adapter_config.json"), *cfg5 = read_text(ref, "adapter_config.json");
    bool differ = !same_file(ck2, nodrop, "adapter_model.safetensors");
    printf("lora_dropout 0 vs 0.05 after 2 steps: adapters %s; adapter_config.json says %s and %s\n",
           differ ? "differ" : "IDENTICAL", cfg0 && strstr(cfg0, "\"lora_dropout\": 0.0") ? "0.0" : "?",
           cfg5 && strstr(cfg5, "\"lora_dropout\": 0.05") ? "0.05" : "?");
    CHECK(differ, "lora_dropout 0.05 trained the same adapters as lora_dropout 0");
    CHECK(cfg0 && strstr(cfg0, "\"lora_dropout\": 0.0") && cfg5 && strstr(cfg5, "\"lora_dropout\": 0.05"),
          "adapter_config.json does not record lora_dropout: %s / %s", cfg0 ? cfg0 : "(missing)", cfg5 ? cfg5 : "(missing)");
    free(cfg0), free(cfg5);

    /* 3. bad input */
    snprintf(args, sizeof args, "%s --lora_dropout 1 --max_steps 1 --output_dir %s/x", BASE, g_tmp);
    expect_refused("lora_dropout 1", args, "lora_dropout: 1 is out of range");
    snprintf(args, sizeof args, "--config examples/demo.yaml --merge_lora true --max_steps 1 --output_dir %s/x", g_tmp);
    expect_refused("merge_lora without use_peft", args, "merge_lora needs use_peft: true");
    snprintf(args, sizeof args,
             "--config examples/demo.yaml --per_device_train_batch_size 16 --max_completion_length 24 "
             "--steps_per_generation 2 --max_steps 4 --output_dir %s/x --resume_from_checkpoint %s",
             g_tmp, ck2);
    expect_refused("LoRA checkpoint without use_peft", args, "holds LoRA adapters (adapter_config.json): set use_peft");
    snprintf(args, sizeof args, "%s --lora_r 4 --max_steps 4 --output_dir %s/x --resume_from_checkpoint %s", BASE,
             g_tmp, ck2);
    expect_refused("checkpoint of another rank", args, "differ from this run's settings (lora_r 4");
    /* a full-weights checkpoint has no adapters to resume */
    snprintf(args, sizeof args,
             "--config examples/demo.yaml --per_device_train_batch_size 16 --max_completion_length 24 "
             "--steps_per_generation 2 --max_steps 2 --save_steps 2 --log_completions_count 0 --eval_dataset null "
             "--output_dir %s/full",
             g_tmp);
    code = run(args, &err);
    CHECK(code == 0, "full run: exit %d: %s", code, err);
    free(err);
    snprintf(args, sizeof args, "%s --max_steps 4 --output_dir %s/x --resume_from_checkpoint %s/full/checkpoint-2", BASE,
             g_tmp, g_tmp);
    expect_refused("full checkpoint with use_peft", args, "adapter_config.json");

    sh("rm -rf '%s'", g_tmp);
    printf("test_lora_train: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
