/* test_optim.c — the optimizer against torch and transformers
 * (tests/data/optim_goldens.json from tests/ref/make_optim_goldens.py): on a
 * tiny random Llama on the CPU backend, with the goldens' initial values and
 * gradients, every step's gradient norm (before clip_grad_norm_ at 1.0), lr and
 * parameters (AdamW, weight decay 0.1) for six schedules within 1e-6 relative;
 * the lr lambdas and warmup-step counts on their own; optim_save / optim_load
 * round-trip bit-exactly (a reloaded optimizer continues identically); load
 * rejects states for another model with an error that names the tensor. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/floats.h"
#include "model/model_train.h"
#include "parallel/optim.h"
#include "harness.h"

#define N_RUNS 6
#define N_LR_TABLES 7
#define N_WARMUP 6
#define REL_TOL 1e-6
/* Parameters: |got - torch| <= REL_TOL * |torch| + PARAM_ABS_TOL. Updates are
 * ~lr = 0.01, so a parameter that crosses zero is only known to a few float ulps
 * of 0.01 (1 ulp = 9e-10); 1e-8 allows ~10 of them over 6 steps. */
#define PARAM_ABS_TOL 1e-8


static const ModelConfig TINY = {
    .arch = ARCH_LLAMA, .hidden_size = 4, .intermediate_size = 4, .num_hidden_layers = 1,
    .num_attention_heads = 1, .num_key_value_heads = 1, .head_dim = 4, .vocab_size = 8,
    .max_position_embeddings = 16, .rms_norm_eps = 1e-6f, .rope_theta = 10000.0f,
    .tie_word_embeddings = true, .bos_token_id = -1,
};

static void read_floats(float *dst, size_t n, const json_t *arr) {
    if (json_array_size(arr) != n) {
        fprintf(stderr, "golden array has %zu values, want %zu\n", json_array_size(arr), n);
        exit(1);
    }
    for (size_t i = 0; i < n; i++) dst[i] = (float)json_number_value(json_array_get(arr, i));
}

/* Uploads flat[] (all parameters in model_param order) into the model or the grads. */
static void upload_params(Model *m, const Backend *be, const float *flat) {
    size_t off = 0;
    for (int i = 0; i < model_param_count(m); i++) {
        ModelParam p = model_param(m, i);
        be->upload(be, p.data, flat + off, p.numel);
        off += p.numel;
    }
}
static void upload_grads(Model *m, ModelGrads *g, const Backend *be, const float *flat) {
    size_t off = 0;
    for (int i = 0; i < model_param_count(m); i++) {
        size_t n = model_param(m, i).numel;
        be->upload(be, model_grad(g, i), flat + off, n);
        off += n;
    }
}
static void download_params(float *flat, Model *m, const Backend *be) {
    size_t off = 0;
    for (int i = 0; i < model_param_count(m); i++) {
        ModelParam p = model_param(m, i);
        be->download(be, flat + off, p.data, p.numel);
        off += p.numel;
    }
}

/* ---- a torch-exact AdamW, to tell this optimizer's math from the backend op's ---- */

/* torch's _single_tensor_adam on fp32 CPU tensors, op for op: Python double
 * scalars are rounded to fp32 where they meet a tensor. */
static void reference_adamw(const Backend *be, void *param, void *master, const void *grad, void *m, void *v, size_t n, float lr, float beta1,
                            float beta2, float eps, float weight_decay, float bias_correction1,
                            float bias_correction2) {
    float *p = param, *ms = m, *vs = v;
    const float *g = grad;
    double b1 = float_as_decimal(beta1), b2 = float_as_decimal(beta2), wd = float_as_decimal(weight_decay);
    float decay = (float)(1.0 - (double)lr * wd);
    float w1 = (float)(1.0 - b1), b2f = (float)b2, w2 = (float)(1.0 - b2);
    float step_size = (float)((double)lr / bias_correction1);
    float bc2_sqrt = (float)sqrt((double)bias_correction2);
    for (size_t i = 0; i < n; i++) {
        p[i] *= decay;
        ms[i] = w1 < 0.5f ? ms[i] + w1 * (g[i] - ms[i]) : g[i] - (g[i] - ms[i]) * (1.0f - w1);
        vs[i] = vs[i] * b2f + w2 * g[i] * g[i];
        float denom = sqrtf(vs[i]) / bc2_sqrt + eps;
        p[i] = p[i] + -step_size * (ms[i] / denom);
    }
}

static double rel_diff(double got, double want) { return fabs(got - want) / fmax(fabs(want), 1e-30); }

/* ---- the six optimizer runs against torch ---- */
static void test_runs(const json_t *root, Model *m, ModelGrads *g, const Backend *be, size_t total,
                      const char *label) {
    const json_t *cases = json_object_get(root, "cases");
    CHECK(json_array_size(cases) == N_RUNS, "expected %d optimizer runs, goldens have %zu", N_RUNS,
          json_array_size(cases));
    int steps = (int)json_integer_value(json_object_get(root, "steps"));
    float base_lr = (float)json_number_value(json_object_get(root, "base_lr"));
    double max_norm = json_number_value(json_object_get(root, "max_grad_norm"));
    AdamWConfig ac = {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f,
                      .weight_decay = (float)json_number_value(json_object_get(root, "weight_decay"))};
    float *init = xmalloc(total * sizeof(float)), *grads = xmalloc(total * sizeof(float));
    float *want = xmalloc(total * sizeof(float)), *got = xmalloc(total * sizeof(float));
    read_floats(init, total, json_object_get(root, "init"));
    int passed = 0;
    for (size_t c = 0; c < json_array_size(cases); c++) {
        const json_t *cs = json_array_get(cases, c);
        const char *name = json_string_value(json_object_get(cs, "scheduler"));
        LrSchedulerType type;
        char err[ERR_LEN];
        if (lr_scheduler_parse(&type, name, err)) {
            CHECK(0, "%s", err);
            continue;
        }
        int warm = lr_warmup_steps(steps, (float)json_number_value(json_object_get(cs, "warmup_ratio")),
                                   (int)json_integer_value(json_object_get(cs, "warmup_steps")));
        int want_warm = (int)json_integer_value(json_object_get(cs, "num_warmup"));
        upload_params(m, be, init);
        Optimizer *o = NULL;
        if (optim_create(&o, m, &ac, be, err)) {
            CHECK(0, "optim_create: %s", err);
            continue;
        }
        double worst_param = 0.0, worst_abs = 0.0, worst_lr = 0.0, worst_norm = 0.0;
        for (int s = 0; s < steps; s++) {
            read_floats(grads, total, json_array_get(json_object_get(root, "grads"), (size_t)s));
            upload_grads(m, g, be, grads);
            double norm = optim_clip_grad_norm(m, g, max_norm, be);
            float lr = lr_schedule_value(type, base_lr, s, steps, warm, 0.0);
            optim_step(o, g, lr);
            worst_norm = fmax(worst_norm, rel_diff(norm, json_number_value(json_array_get(json_object_get(cs, "grad_norm"), (size_t)s))));
            double want_lr = json_number_value(json_array_get(json_object_get(cs, "lr"), (size_t)s));
            worst_lr = fmax(worst_lr, want_lr == 0.0 ? fabs(lr) : rel_diff(lr, want_lr));
            read_floats(want, total, json_array_get(json_object_get(cs, "params"), (size_t)s));
            download_params(got, m, be);
            for (size_t i = 0; i < total; i++) {
                double d = fabs((double)got[i] - want[i]);
                /* d / (allowed diff): ok when <= 1 */
                double r = d / (REL_TOL * fabs(want[i]) + PARAM_ABS_TOL);
                if (r > worst_param && getenv("OPTIM_DEBUG"))
                    printf("  step %d value %zu: %.9g vs torch %.9g\n", s, i, (double)got[i], (double)want[i]);
                worst_param = fmax(worst_param, r);
                worst_abs = fmax(worst_abs, d);
            }
        }
        int ok = warm == want_warm && worst_param <= 1.0 && worst_lr <= REL_TOL && worst_norm <= REL_TOL &&
                 optim_step_count(o) == steps;
        printf("%s %s: %s/warmup=%d: %d steps, params max |diff| %.2g (%.2g of the tolerance), lr rel %.2g, grad norm rel %.2g\n", ok ? "ok  " : "FAIL",
               label, name, warm, steps, worst_abs, worst_param, worst_lr, worst_norm);
        if (ok) passed++;
        else g_failures++;
        optim_free(o);
    }
    printf("optimizer (%s): %d/%d runs match torch.optim.AdamW + transformers schedules\n", label, passed, N_RUNS);
    free(init), free(grads), free(want), free(got);
}

/* ---- lr lambdas and warmup counts ---- */
static void test_schedules(const json_t *root) {
    const json_t *tables = json_object_get(root, "lr_table");
    CHECK(json_array_size(tables) == N_LR_TABLES, "expected %d lr tables", N_LR_TABLES);
    int n_values = 0;
    double worst = 0.0;
    for (size_t c = 0; c < json_array_size(tables); c++) {
        const json_t *t = json_array_get(tables, c);
        LrSchedulerType type;
        char err[ERR_LEN];
        CHECK(lr_scheduler_parse(&type, json_string_value(json_object_get(t, "scheduler")), err) == 0, "%s", err);
        int total = (int)json_integer_value(json_object_get(t, "total"));
        int warm = (int)json_integer_value(json_object_get(t, "warmup"));
        float base = (float)json_number_value(json_object_get(t, "base_lr"));
        const json_t *lr = json_object_get(t, "lr");
        for (size_t s = 0; s < json_array_size(lr); s++) {
            double want = json_number_value(json_array_get(lr, s));
            float got = lr_schedule_value(type, base, (int)s, total, warm, 0.0);
            double d = want == 0.0 ? fabs(got) : rel_diff(got, want);
            worst = fmax(worst, d);
            CHECK(d <= REL_TOL, "%s total=%d warmup=%d step %zu: lr %.9g, transformers %.9g",
                  json_string_value(json_object_get(t, "scheduler")), total, warm, s, (double)got, want);
            n_values++;
        }
    }
    printf("schedules: %d lr values match transformers (max rel diff %.2g)\n", n_values, worst);
    const json_t *warmups = json_object_get(root, "warmup_steps");
    CHECK(json_array_size(warmups) == N_WARMUP, "expected %d warmup cases", N_WARMUP);
    for (size_t c = 0; c < json_array_size(warmups); c++) {
        const json_t *w = json_array_get(warmups, c);
        int total = (int)json_integer_value(json_object_get(w, "total"));
        float ratio = (float)json_number_value(json_object_get(w, "ratio"));
        int steps = (int)json_integer_value(json_object_get(w, "steps"));
        int want = (int)json_integer_value(json_object_get(w, "want"));
        int got = lr_warmup_steps(total, ratio, steps);
        CHECK(got == want, "lr_warmup_steps(%d, %g, %d) = %d, transformers %d", total, (double)ratio, steps, got, want);
    }
    printf("warmup: %zu get_warmup_steps cases checked\n", json_array_size(warmups));
    char err[ERR_LEN];
    LrSchedulerType type;
    CHECK(lr_scheduler_parse(&type, "polynomial", err) < 0 && strstr(err, "cosine"), "reject polynomial, naming the valid ones");
}

/* ---- optim_save / optim_load ---- */
static void fill_grads(Model *m, ModelGrads *g, const Backend *be, size_t total, int step) {
    float *flat = xmalloc(total * sizeof(float));
    for (size_t i = 0; i < total; i++) flat[i] = (float)sin(0.7 * (double)i + 1.3 * step) * 0.3f;
    upload_grads(m, g, be, flat);
    free(flat);
}

static void test_save_load(Model *m, ModelGrads *g, const Backend *be, size_t total) {
    char dir[] = "/tmp/colt_test_optim_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char path[512], err[ERR_LEN];
    snprintf(path, sizeof path, "%s/optimizer.safetensors", dir);
    AdamWConfig ac = {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f};
    float *start = xmalloc(total * sizeof(float)), *a = xmalloc(total * sizeof(float)),
          *b = xmalloc(total * sizeof(float));
    download_params(start, m, be);

    /* run A: 3 steps, save, 2 more steps */
    Optimizer *o = NULL, *o2 = NULL;
    CHECK(optim_create(&o, m, &ac, be, err) == 0, "%s", err);
    for (int s = 0; s < 3; s++) fill_grads(m, g, be, total, s), optim_step(o, g, 1e-2f);
    CHECK(optim_save(o, path, err) == 0, "optim_save: %s", err);
    float *mid = xmalloc(total * sizeof(float));
    download_params(mid, m, be);
    for (int s = 3; s < 5; s++) fill_grads(m, g, be, total, s), optim_step(o, g, 1e-2f);
    download_params(a, m, be);

    /* run B: from the same parameters, a fresh optimizer loads the state and does the 2 steps */
    upload_params(m, be, mid);
    CHECK(optim_create(&o2, m, &ac, be, err) == 0, "%s", err);
    CHECK(optim_load(o2, path, err) == 0, "optim_load: %s", err);
    CHECK(optim_step_count(o2) == 3, "loaded step count %lld, want 3", (long long)optim_step_count(o2));
    for (int s = 3; s < 5; s++) fill_grads(m, g, be, total, s), optim_step(o2, g, 1e-2f);
    download_params(b, m, be);
    CHECK(memcmp(a, b, total * sizeof(float)) == 0, "resumed optimizer differs from the uninterrupted one");
    CHECK(optim_step_count(o2) == 5, "step count after resume");
    printf("save/load: state of step 3 reloaded, 2 more steps bit-identical to the uninterrupted run\n");
    upload_params(m, be, start);

    /* a state for another model: other sizes, then other names */
    ModelConfig other = TINY;
    other.intermediate_size = 8;
    Model *m2 = NULL;
    Optimizer *o3 = NULL;
    CHECK(model_create_random(&m2, &other, 7, be, err) == 0, "%s", err);
    if (m2) {
        CHECK(optim_create(&o3, m2, &ac, be, err) == 0, "%s", err);
        int rc = optim_load(o3, path, err);
        CHECK(rc < 0 && strstr(err, "gate_proj.weight.exp_avg") && strstr(err, "elements"),
              "load into a model with other shapes must fail naming the tensor (got %d: %s)", rc, rc ? err : "");
        if (rc < 0) printf("wrong shapes rejected: %s\n", err);
        CHECK(optim_step_count(o3) == 0, "a failed load must not change the step count");
        optim_free(o3);
        model_free(m2);
    }
    other = TINY;
    other.num_hidden_layers = 2;
    CHECK(model_create_random(&m2, &other, 7, be, err) == 0, "%s", err);
    if (m2) {
        CHECK(optim_create(&o3, m2, &ac, be, err) == 0, "%s", err);
        int rc = optim_load(o3, path, err);
        CHECK(rc < 0 && strstr(err, "tensors"), "load into a deeper model must fail (got %d: %s)", rc, rc ? err : "");
        if (rc < 0) printf("wrong names rejected: %s\n", err);
        optim_free(o3);
        model_free(m2);
    }
    /* a file that is not an optimizer state */
    char bad[600];
    snprintf(bad, sizeof bad, "%s/not_optim.safetensors", dir);
    FILE *f = fopen(bad, "wb");
    if (f) fputs("not a safetensors file", f), fclose(f);
    CHECK(optim_load(o2, bad, err) < 0, "loading garbage must fail");
    printf("garbage rejected: %s\n", err);
    CHECK(optim_step_count(o2) == 5, "a failed load must not change the step count");

    optim_free(o);
    optim_free(o2);
    unlink(path);
    unlink(bad);
    rmdir(dir);
    free(start), free(a), free(b), free(mid);
}

/* ZeRO-1 shards: three shard optimizers on one model (each updating its
 * range of the weights, together all of them) give the unsharded optimizer's
 * bits; their saved shards resume at two shards and at one (resharding)
 * bit-identically; a lost shard, a shard of another model and shards of two
 * steps are refused before anything changes. */
static void test_shards(Model *m, ModelGrads *g, const Backend *be, size_t total) {
    char dir[] = "/tmp/colt_test_optim_shards_XXXXXX";
    CHECK(mkdtemp(dir) != NULL, "mkdtemp");
    char err[ERR_LEN], paths[3][600];
    AdamWConfig ac = {.beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 0.1f};
    float *start = xmalloc(total * sizeof(float)), *mid = xmalloc(total * sizeof(float)),
          *a = xmalloc(total * sizeof(float)), *b = xmalloc(total * sizeof(float));
    download_params(start, m, be);
    Optimizer *ref = NULL, *sh[3] = {NULL, NULL, NULL};
    CHECK(optim_create(&ref, m, &ac, be, err) == 0, "%s", err);
    for (int s = 0; s < 3; s++) fill_grads(m, g, be, total, s), optim_step(ref, g, 1e-2f);
    download_params(mid, m, be);
    for (int s = 3; s < 5; s++) fill_grads(m, g, be, total, s), optim_step(ref, g, 1e-2f);
    download_params(a, m, be);

    upload_params(m, be, start);
    for (int r = 0; r < 3; r++) {
        OptimShardOptions so = {.rank = r, .world = 3};
        CHECK(optim_create_sharded(&sh[r], m, &ac, be, &so, err) == 0, "%s", err);
    }
    for (int s = 0; s < 3; s++) {
        fill_grads(m, g, be, total, s);
        for (int r = 0; r < 3; r++) optim_step(sh[r], g, 1e-2f);
    }
    download_params(b, m, be);
    CHECK(memcmp(mid, b, total * sizeof(float)) == 0, "3 shards after 3 steps differ from the unsharded optimizer");
    for (int r = 0; r < 3; r++) {
        snprintf(paths[r], sizeof paths[r], "%s/optimizer-rank%05d-of-00003.safetensors", dir, r);
        CHECK(optim_save_shard(sh[r], paths[r], err) == 0, "save shard %d: %s", r, err);
        CHECK(optim_save(sh[r], "/dev/null", err) != 0 && strstr(err, "one shard"), "optim_save of a shard: %s", err);
    }
    const char *const files[3] = {paths[0], paths[1], paths[2]};
    /* resharded: 2 shards and 1, each then 2 more steps */
    for (int world = 2; world >= 1; world--) {
        upload_params(m, be, mid);
        Optimizer *re[2] = {NULL, NULL};
        for (int r = 0; r < world; r++) {
            OptimShardOptions so = {.rank = r, .world = world};
            CHECK(optim_create_sharded(&re[r], m, &ac, be, &so, err) == 0, "%s", err);
            CHECK(optim_load_shards(re[r], files, 3, err) == 0, "load 3 shards into %d: %s", world, err);
            CHECK(optim_step_count(re[r]) == 3, "step count %lld", (long long)optim_step_count(re[r]));
        }
        for (int s = 3; s < 5; s++) {
            fill_grads(m, g, be, total, s);
            for (int r = 0; r < world; r++) optim_step(re[r], g, 1e-2f);
        }
        download_params(b, m, be);
        CHECK(memcmp(a, b, total * sizeof(float)) == 0, "3 shards resumed as %d differ from the uninterrupted run",
              world);
        printf("shards: 3 shards saved at step 3, resumed as %d shard(s): 2 more steps bit-identical\n", world);
        for (int r = 0; r < world; r++) optim_free(re[r]);
    }
    /* refusals, each leaving the optimizer as it was */
    Optimizer *one = NULL;
    OptimShardOptions whole = {.rank = 0, .world = 1};
    CHECK(optim_create_sharded(&one, m, &ac, be, &whole, err) == 0, "%s", err);
    int rc = optim_load_shards(one, files, 2, err);
    CHECK(rc != 0 && strstr(err, "do not cover"), "2 of 3 shards: %d %s", rc, err);
    printf("a lost shard: %s\n", err);
    fill_grads(m, g, be, total, 9);
    optim_step(sh[2], g, 1e-2f); /* shard 2 one step ahead */
    CHECK(optim_save_shard(sh[2], paths[2], err) == 0, "%s", err);
    rc = optim_load_shards(one, files, 3, err);
    CHECK(rc != 0 && strstr(err, "step"), "shards of two steps: %d %s", rc, err);
    printf("shards of two steps: %s\n", err);
    ModelConfig other = TINY;
    other.intermediate_size = 8;
    Model *m2 = NULL;
    Optimizer *o2 = NULL;
    CHECK(model_create_random(&m2, &other, 7, be, err) == 0, "%s", err);
    CHECK(optim_create_sharded(&o2, m2, &ac, be, &whole, err) == 0, "%s", err);
    rc = optim_load_shards(o2, files, 3, err);
    CHECK(rc != 0 && strstr(err, "another model"), "shards of another model: %d %s", rc, err);
    printf("shards of another model: %s\n", err);
    CHECK(optim_step_count(one) == 0 && optim_step_count(o2) == 0, "a refused load changed the step count");
    optim_free(o2);
    model_free(m2);
    optim_free(one);
    for (int r = 0; r < 3; r++) optim_free(sh[r]), unlink(paths[r]);
    optim_free(ref);
    rmdir(dir);
    upload_params(m, be, start);
    free(start), free(mid), free(a), free(b);
}

int main(void) {
    json_error_t jerr;
    json_t *root = json_load_file(COLT_SOURCE_DIR "/tests/data/optim_goldens.json", 0, &jerr);
    if (!root) {
        fprintf(stderr, "cannot read tests/data/optim_goldens.json: %s\n", jerr.text);
        return 1;
    }
    printf("goldens from torch %s, transformers %s\n", json_string_value(json_object_get(root, "torch_version")),
           json_string_value(json_object_get(root, "transformers_version")));
    const Backend *be = backend_cpu();
    char err[ERR_LEN];
    Model *m = NULL;
    ModelGrads *g = NULL;
    if (model_create_random(&m, &TINY, 1, be, err) || model_grads_create(&g, m, err)) {
        fprintf(stderr, "tiny model: %s\n", err);
        return 1;
    }
    /* the goldens were made for this model's parameter list */
    const json_t *names = json_object_get(root, "param_names"), *numels = json_object_get(root, "param_numel");
    size_t total = 0;
    int same = (int)json_array_size(names) == model_param_count(m);
    for (int i = 0; same && i < model_param_count(m); i++) {
        ModelParam p = model_param(m, i);
        same = strcmp(p.name, json_string_value(json_array_get(names, (size_t)i))) == 0 &&
               p.numel == (size_t)json_integer_value(json_array_get(numels, (size_t)i));
        total += p.numel;
    }
    if (!same) {
        fprintf(stderr, "FAIL the tiny model's parameters differ from the goldens' list\n");
        return 1;
    }
    printf("tiny model: %d parameter tensors, %zu values\n", model_param_count(m), total);

    /* Optimizer, schedules and clipping with a torch-exact AdamW op (the same
     * buffers: the harness only swaps the adamw op), then with the CPU backend's op. */
    Backend harness = *be;
    harness.adamw = reference_adamw;
    test_runs(root, m, g, &harness, total, "torch-exact adamw op");
    test_runs(root, m, g, be, total, "cpu backend adamw op");
    test_schedules(root);
    test_save_load(m, g, be, total);
    test_shards(m, g, be, total);

    model_grads_free(g);
    model_free(m);
    json_decref(root);
    if (g_failures) {
        fprintf(stderr, "%d failure(s)\n", g_failures);
        return 1;
    }
    printf("all optimizer g_checks pass\n");
    return 0;
}
