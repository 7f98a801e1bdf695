/* test_sync_ref.c — sync_ref_model (TR-DPO, TRL's SyncRefModelCallback) end to end on the CPU with the real
 * stories260K, beta 0.1, a sync every 2 optimizer steps with ref_model_mixup_alpha 0.5, a checkpoint every step:
 *   - the mix, checked on the saved tensors against a double-precision reference: checkpoint-N/ref_model is
 *     alpha x checkpoint-N's policy + (1 - alpha) x checkpoint-(N-1)/ref_model within two float roundings at
 *     the sync steps (2, 4), and bit-identical to the previous reference between them (1: the initial model);
 *   - the KL: equal to an unsynced run's until the sync, different after it (and smaller: the reference moved
 *     halfway to the policy);
 *   - a resume from checkpoint-3 (mid-round: rounds are 2 steps) loads the synced reference and reproduces
 *     the uninterrupted run's step 4, final weights and last reference bit for bit;
 *   - a changed file of the saved reference is refused at resume (it is in the checkpoint's manifest);
 *   - sync_ref_model without a reference model (beta 0) or with use_peft: one-line errors, as TRL's.
 * `test_sync_ref cuda` runs the same on a GPU with bf16 weights (the bound: two bf16 roundings). */
#include <float.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/fileio.h"
#include "model/safetensors.h"
#include "harness.h"

#define ALPHA 0.5

/* Rounds of 2 steps, 2 prompts x 4 completions, a reward that splits most groups. */
static const char *BASE =
    "--config examples/demo.yaml --num_generations 4 --per_device_train_batch_size 8 --max_completion_length 16 "
    "--steps_per_generation 2 --logging_steps 1 --log_completions_count 0 --save_total_limit 0 --eval_dataset null "
    "--max_steps 4 --save_steps 1 --warmup_steps 0 --reward_funcs '[{\"type\": \"regex\", \"pattern\": \"\\\\bthe\\\\b\"}]'";
static const char *SYNC = "--sync_ref_model true --ref_model_sync_steps 2 --ref_model_mixup_alpha 0.5";

static const char *g_device = "cpu";
static double g_eps = FLT_EPSILON; /* the storage dtype's epsilon: fp32 on the CPU, bf16 on a GPU */

static int run(const char *args, char **err_out) {
    char full[4096];
    snprintf(full, sizeof full, "%s --device %s", args, g_device);
    return run_colt_with(&(ColtRun){.subcommand = "train"}, full, err_out);
}

static void expect_error(const char *name, const char *args, const char *needle) {
    char *err;
    int code = run(args, &err);
    CHECK(code != 0 && code < 128, "%s: exit %d", name, code);
    CHECK(count_lines(err) == 1, "%s: %d stderr lines: %s", name, count_lines(err), err);
    CHECK(strstr(err, needle) != NULL, "%s: '%s' lacks '%s'", name, err, needle);
    printf("  bad input %-28s -> exit %d: %s", name, code, err);
    free(err);
}

/* One model folder's tensors as fp32 (the CPU saves fp32). */
typedef struct Weights {
    SafeTensorsSet set;
    bool ok;
} Weights;

static Weights weights_open(const char *dir) {
    Weights w = {0};
    char err[512];
    w.ok = safetensors_open_dir(&w.set, dir, err) == 0;
    CHECK(w.ok, "%s: %s", dir, err);
    return w;
}

static float *tensor_f32(const Weights *w, const char *name, size_t *n) {
    const SafeTensor *t = safetensors_find(&w->set, name, NULL);
    if (!t) return NULL;
    *n = safetensors_numel(t);
    float *x = malloc((*n ? *n : 1) * sizeof(float));
    safetensors_to_f32(x, t);
    return x;
}

/* Compares after against the mix of policy and before (mix) or against before alone (!mix: equal, or within
 * `rounding` relative when before is fp32 and after was rounded to storage once), over every tensor of
 * after. Returns the largest error in units of the bound; *moved: max |policy - before|. */
static double check_reference(const char *what, const char *after_dir, const char *policy_dir,
                              const char *before_dir, bool mix, double rounding, double *moved, size_t *exact,
                              size_t *total) {
    Weights a = weights_open(after_dir), p = weights_open(policy_dir), b = weights_open(before_dir);
    double worst = 0;
    *moved = 0, *exact = 0, *total = 0;
    int n_tensors = 0;
    for (int f = 0; a.ok && p.ok && b.ok && f < a.set.n_files; f++)
        for (int i = 0; i < a.set.headers[f].n_tensors; i++) {
            const char *name = a.set.headers[f].tensors[i].name;
            size_t na = 0, np = 0, nb = 0;
            float *xa = tensor_f32(&a, name, &na), *xp = tensor_f32(&p, name, &np), *xb = tensor_f32(&b, name, &nb);
            CHECK(xa && xp && xb && na == np && na == nb, "%s: tensor %s missing or of another size", what, name);
            for (size_t k = 0; xa && xp && xb && na == np && na == nb && k < na; k++) {
                double want = mix ? ALPHA * xp[k] + (1.0 - ALPHA) * xb[k] : xb[k];
                /* two roundings to storage (torch's mul_ then add_): each within half an ulp of its result */
                double bound = mix ? g_eps * (fabs((1.0 - ALPHA) * xb[k]) + fabs(want)) + 1e-30
                                   : rounding * fabs(want) + 1e-30;
                double e = fabs(xa[k] - want) / bound;
                if (e > worst) worst = e;
                *exact += (double)xa[k] == want;
                if (fabs((double)xp[k] - xb[k]) > *moved) *moved = fabs((double)xp[k] - xb[k]);
            }
            *total += na;
            n_tensors++;
            free(xa), free(xp), free(xb);
        }
    CHECK(n_tensors > 0, "%s: no tensors compared", what);
    if (a.ok) safetensors_set_free(&a.set);
    if (p.ok) safetensors_set_free(&p.set);
    if (b.ok) safetensors_set_free(&b.set);
    return worst;
}

int main(int argc, char **argv) {
    double t0 = now_s();
    if (argc > 1) g_device = argv[1], g_eps = strcmp(argv[1], "cpu") == 0 ? FLT_EPSILON : 1.0 / 128;
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_test_sync_ref_XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    char args[4096], s_dir[300], n_dir[300], r_dir[300], *err;
    snprintf(s_dir, sizeof s_dir, "%s/synced", g_tmp);
    snprintf(n_dir, sizeof n_dir, "%s/unsynced", g_tmp);
    snprintf(r_dir, sizeof r_dir, "%s/resumed", g_tmp);

    snprintf(args, sizeof args, "%s %s --output_dir %s", BASE, SYNC, s_dir);
    int code = run(args, &err);
    CHECK(code == 0, "synced run: exit %d: %s", code, err);
    free(err);
    snprintf(args, sizeof args, "%s --output_dir %s", BASE, n_dir);
    code = run(args, &err);
    CHECK(code == 0, "unsynced run: exit %d: %s", code, err);
    free(err);

    /* 1. the saved reference after each step */
    for (int step = 1; step <= 4; step++) {
        char after[400], policy[400], before[400], what[64];
        snprintf(after, sizeof after, "%s/checkpoint-%d/ref_model", s_dir, step);
        snprintf(policy, sizeof policy, "%s/checkpoint-%d", s_dir, step);
        if (step == 1) snprintf(before, sizeof before, "models/stories260K");
        else snprintf(before, sizeof before, "%s/checkpoint-%d/ref_model", s_dir, step - 1);
        bool mix = step % 2 == 0;
        snprintf(what, sizeof what, "step %d", step);
        double moved = 0;
        size_t exact = 0, total = 0;
        /* the initial model's file is fp32: a GPU's reference is its bf16 rounding */
        double rounding = step == 1 && strcmp(g_device, "cpu") != 0 ? g_eps / 2 : 0;
        double worst = check_reference(what, after, policy, before, mix, rounding, &moved, &exact, &total);
        printf("step %d: reference %s: max error %.3g of the bound (two roundings to storage), %zu of %zu elements equal "
               "to the double mix; policy moved up to %.3g from the previous reference\n",
               step, mix ? "= 0.5 policy + 0.5 previous reference" : "unchanged", worst, exact, total, moved);
        CHECK(worst <= 1.0, "step %d: the reference is off the %s by %.3g of the bound", step,
              mix ? "mix" : "previous reference", worst);
        CHECK(total > 0 && (!mix || moved > 0), "step %d: the policy equals the reference: the check proves nothing",
              step);
    }

    /* 2. the KL: the same until the first sync's round (step 3), then against a reference closer to the policy */
    double kl_s[4], kl_n[4];
    metric_by_step(kl_s, 4, s_dir, "kl");
    metric_by_step(kl_n, 4, n_dir, "kl");
    printf("kl synced:   %.6g %.6g %.6g %.6g\nkl unsynced: %.6g %.6g %.6g %.6g\n", kl_s[0], kl_s[1], kl_s[2], kl_s[3],
           kl_n[0], kl_n[1], kl_n[2], kl_n[3]);
    CHECK(kl_s[0] == kl_n[0] && kl_s[1] == kl_n[1], "kl before the sync differs: %g %g vs %g %g", kl_s[0], kl_s[1],
          kl_n[0], kl_n[1]);
    CHECK(isfinite(kl_s[2]) && kl_s[2] != kl_n[2] && kl_s[2] < kl_n[2],
          "step 3 (the first round after the sync): kl %g synced vs %g unsynced; want smaller", kl_s[2], kl_n[2]);

    /* 3. resume mid-round from checkpoint-3: the synced reference comes back from ref_model/ */
    snprintf(args, sizeof args, "%s %s --output_dir %s --resume_from_checkpoint %s/checkpoint-3", BASE, SYNC, r_dir,
             s_dir);
    code = run(args, &err);
    CHECK(code == 0, "resume: exit %d: %s", code, err);
    free(err);
    char *mu = metrics_without_timing(s_dir), *mr = metrics_without_timing(r_dir);
    char *tail = mu;
    for (int k = 0; k < 3 && tail; k++) tail = strchr(tail, '\n') ? strchr(tail, '\n') + 1 : NULL;
    bool same_metrics = tail && mr && strcmp(tail, mr) == 0 && count_lines(mr) == 1;
    bool same_model = same_file(s_dir, r_dir, "model.safetensors");
    char s4[400], r4[400];
    snprintf(s4, sizeof s4, "%s/checkpoint-4/ref_model", s_dir);
    snprintf(r4, sizeof r4, "%s/checkpoint-4/ref_model", r_dir);
    bool same_ref = same_file(s4, r4, "model.safetensors");
    printf("resume from checkpoint-3 (mid-round): step 4 equal: %s, final weights identical: %s, step 4's reference "
           "identical: %s\n", same_metrics ? "yes" : "NO", same_model ? "yes" : "NO", same_ref ? "yes" : "NO");
    CHECK(same_metrics, "resumed step 4 differs:\n--- uninterrupted\n%s--- resumed\n%s", tail ? tail : "",
          mr ? mr : "");
    CHECK(same_model && same_ref, "resumed weights differ (model %d, reference %d)", same_model, same_ref);
    free(mu), free(mr);

    /* 4. the reference's files are in the checkpoint's manifest: a changed one is refused; resuming a synced
     * run without the setting (and its reference) is refused */
    char bad_dir[300], *state = read_text(s_dir, "checkpoint-3/trainer_state.json");
    CHECK(state && strstr(state, "\"ref_model/model.safetensors\"") && strstr(state, "\"ref_model/config.json\""),
          "checkpoint-3/trainer_state.json does not list ref_model/'s files");
    free(state);
    snprintf(bad_dir, sizeof bad_dir, "%s/bad", g_tmp);
    sh("cp -r %s/checkpoint-3 %s/tampered && printf 'x' | dd of=%s/tampered/ref_model/model.safetensors bs=1 "
       "seek=$(($(stat -c %%s %s/tampered/ref_model/model.safetensors) - 1)) conv=notrunc 2>/dev/null",
       s_dir, g_tmp, g_tmp, g_tmp);
    snprintf(args, sizeof args, "%s %s --output_dir %s --resume_from_checkpoint %s/tampered", BASE, SYNC, bad_dir,
             g_tmp);
    expect_error("changed ref_model/ file", args, "ref_model/model.safetensors does not match");
    snprintf(args, sizeof args, "%s --output_dir %s --resume_from_checkpoint %s/checkpoint-3", BASE, bad_dir, s_dir);
    expect_error("resume without sync_ref_model", args, "sync_ref_model");
    snprintf(args, sizeof args, "%s %s --output_dir %s --beta 0", BASE, SYNC, bad_dir);
    expect_error("sync_ref_model with beta 0", args, "beta");
    snprintf(args, sizeof args, "%s %s --output_dir %s --use_peft true", BASE, SYNC, bad_dir);
    expect_error("sync_ref_model with use_peft", args, "use_peft");

    sh("rm -rf %s", g_tmp);
    printf("%d checks, %d failed (%.1f s)\n", g_checks, g_failures, now_s() - t0);
    return g_failures ? 1 : 0;
}
