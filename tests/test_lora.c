/* test_lora.c — LoRA adapters on the CPU against PEFT (tests/data/lora/goldens.json,
 * made by tests/ref/make_lora_goldens.py).
 *
 * For each PEFT adapter (every linear layer of a Qwen3 block; q/v only with
 * rsLoRA on a Llama with biases): log-probs of model_forward and of the
 * training forward within 1e-4 of PEFT's (fp32), a greedy continuation
 * identical to PEFT's generate, through the engine (paged path), the
 * gradients of every lora_A / lora_B against PEFT's autograd (also with
 * lora_dropout, PEFT's dropout modules given colt's masks), the engine's
 * log-probs bit-identical to the trainer's in deterministic mode; save +
 * reload bit-identical, the merged checkpoint equal to PEFT's merged model;
 * fresh adapters (B = 0) leave the model unchanged, and disabling them gives
 * the base model back exactly. Then the refusals of adapter_config.json keys
 * colt does not implement.
 *
 * Dimension legend: T sequence length, V vocab. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fileio.h"
#include "engine/engine.h"
#include "harness.h"
#include "engine_requests.h"
#include "model/lora.h"
#include "model/model.h"
#include "model/model_train.h"

static int *json_ints(const json_t *a, int *n) {
    *n = (int)json_array_size(a);
    int *v = malloc((size_t)(*n ? *n : 1) * sizeof(int));
    for (int i = 0; i < *n; i++) v[i] = (int)json_integer_value(json_array_get(a, (size_t)i));
    return v;
}

static Model *load_with_adapter(const char *base, const char *adapter) {
    char err[ERR_LEN], path[1024];
    Model *m = NULL;
    snprintf(path, sizeof path, "%s/%s", COLT_SOURCE_DIR, base);
    if (model_load(&m, path, backend_cpu(), err) != 0) {
        CHECK(0, "model_load %s: %s", path, err);
        return NULL;
    }
    if (adapter) {
        snprintf(path, sizeof path, "%s/%s", COLT_SOURCE_DIR, adapter);
        if (model_lora_load(m, path, err) != 0) {
            CHECK(0, "model_lora_load %s: %s", path, err);
            model_free(m);
            return NULL;
        }
    }
    return m;
}

/* log p(ids[t] | ids[<t]), t = 1..T-1, from one model_forward; lp has T-1 entries. */
static int forward_logprobs(Model *m, const int *ids, int T, double *lp) {
    char err[ERR_LEN];
    int V = model_config(m)->vocab_size;
    ModelState *st = NULL;
    if (model_state_create(&st, m, 1, T, T, err) != 0) {
        CHECK(0, "%s", err);
        return -1;
    }
    int *slot = calloc((size_t)T, sizeof(int)), *pos = malloc((size_t)T * sizeof(int));
    float *logits = malloc((size_t)T * V * sizeof(float));
    for (int t = 0; t < T; t++) pos[t] = t;
    int rc = model_forward(m, st, ids, slot, pos, T, NULL, logits, err);
    CHECK(rc == 0, "model_forward: %s", err);
    for (int t = 1; t < T && rc == 0; t++) {
        const float *row = logits + (size_t)(t - 1) * V;
        double mx = -INFINITY, sum = 0.0;
        for (int v = 0; v < V; v++) mx = fmax(mx, row[v]);
        for (int v = 0; v < V; v++) sum += exp((double)row[v] - mx);
        lp[t - 1] = row[ids[t]] - mx - log(sum);
    }
    free(slot), free(pos), free(logits);
    model_state_free(st);
    return rc;
}

/* Training-forward log-probs (temperature 1) of the same sequence. */
static int train_logprobs(Model *m, const int *ids, int T, float *lp) {
    char err[ERR_LEN];
    TrainState *st = NULL;
    if (train_state_create(&st, m, 1, T, T, err) != 0) {
        CHECK(0, "%s", err);
        return -1;
    }
    int *slot = calloc((size_t)T, sizeof(int)), *pos = malloc((size_t)T * sizeof(int)),
        *tgt = malloc((size_t)T * sizeof(int));
    for (int t = 0; t < T; t++) pos[t] = t, tgt[t] = t + 1 < T ? ids[t + 1] : -1;
    int rc = model_train_forward(m, st, ids, slot, pos, tgt, T, 1.0f, lp, NULL, err);
    CHECK(rc == 0, "model_train_forward: %s", err);
    free(slot), free(pos), free(tgt);
    train_state_free(st);
    return rc;
}

/* Max |forward log-probs - golden[key]| over the entry's sequences. */
static double logprob_gap(Model *m, const json_t *entry, const char *key) {
    double worst = 0.0;
    const json_t *seqs = json_object_get(entry, "logprobs");
    for (size_t s = 0; s < json_array_size(seqs); s++) {
        const json_t *e = json_array_get(seqs, s);
        int T;
        int *ids = json_ints(json_object_get(e, "ids"), &T);
        double *lp = malloc((size_t)T * sizeof(double));
        if (forward_logprobs(m, ids, T, lp) == 0)
            for (int t = 0; t + 1 < T; t++) {
                double d = fabs(lp[t] - json_number_value(json_array_get(json_object_get(e, key), (size_t)t)));
                if (!(d <= worst)) worst = d;
            }
        else
            worst = INFINITY;
        free(ids), free(lp);
    }
    return worst;
}

/* Bit-level comparison of two models' forward log-probs on the entry's first sequence. */
static bool same_logprobs(Model *a, Model *b, const json_t *entry, double *gap) {
    const json_t *e = json_array_get(json_object_get(entry, "logprobs"), 0);
    int T;
    int *ids = json_ints(json_object_get(e, "ids"), &T);
    double *la = malloc((size_t)T * sizeof(double)), *lb = malloc((size_t)T * sizeof(double));
    bool same = forward_logprobs(a, ids, T, la) == 0 && forward_logprobs(b, ids, T, lb) == 0;
    *gap = 0.0;
    for (int t = 0; t + 1 < T && same; t++) *gap = fmax(*gap, fabs(la[t] - lb[t]));
    free(ids), free(la), free(lb);
    return same && *gap == 0.0;
}

static void check_train_forward(Model *m, const json_t *entry, const char *name) {
    const json_t *e = json_array_get(json_object_get(entry, "logprobs"), 0);
    int T;
    int *ids = json_ints(json_object_get(e, "ids"), &T);
    float *lp = malloc((size_t)T * sizeof(float));
    double worst = INFINITY;
    if (train_logprobs(m, ids, T, lp) == 0) {
        worst = 0.0;
        for (int t = 0; t + 1 < T; t++)
            worst = fmax(worst, fabs(lp[t] - json_number_value(json_array_get(json_object_get(e, "logprobs"), (size_t)t))));
    }
    printf("  %-18s training forward log-probs vs PEFT: max |diff| = %.3g\n", name, worst);
    CHECK(worst < 1e-4, "%s: training forward log-probs differ from PEFT's by %.3g", name, worst);
    free(ids), free(lp);
}

/* Greedy continuation through the engine (paged KV cache, the generation path). */
static void check_greedy(Model *m, const json_t *entry, const char *name) {
    const json_t *gj = json_object_get(entry, "greedy");
    int P, N;
    int *prompt = json_ints(json_object_get(gj, "prompt"), &P), *want = json_ints(json_object_get(gj, "new_tokens"), &N);
    char err[ERR_LEN];
    GenSequence seq = {.prompt = prompt, .prompt_len = P, .stream = 0};
    GenerateOptions opt = {.sampling = sampling_params_greedy(), .max_new_tokens = N, .ignore_eos = true};
    int rc = engine_generate(m, &seq, 1, &opt, NULL, NULL, err);
    CHECK(rc == 0, "%s: engine_generate: %s", name, err);
    int same = 0;
    while (rc == 0 && same < N && same < seq.n_tokens && seq.tokens[same] == want[same]) same++;
    printf("  %-18s greedy through the engine: %d/%d tokens identical to PEFT's generate (min margin %.4f)\n", name,
           same, N, json_number_value(json_object_get(gj, "min_margin")));
    CHECK(same == N, "%s: greedy tokens differ from PEFT's at %d", name, same);
    gen_sequence_free(&seq);
    free(prompt), free(want);
}

/* The golden batch's loss sum w_i logp_i / T; its gradients vs PEFT's autograd. */
/* The goldens' "train" entry (or, with dropout, "train_dropout": PEFT given colt's lora_dropout masks):
 * the training forward's log-probs and every adapter gradient against PEFT's. */
static void check_gradients(Model *m, const json_t *entry, double temperature, const char *name, bool dropout) {
    const json_t *tr = json_object_get(entry, dropout ? "train_dropout" : "train"), *seqs = json_object_get(tr, "sequences");
    int n = 0, n_seqs = (int)json_array_size(seqs), max_len = 0;
    for (int s = 0; s < n_seqs; s++) {
        int T = (int)json_array_size(json_array_get(seqs, (size_t)s));
        n += T;
        if (T > max_len) max_len = T;
    }
    int *tok = malloc((size_t)n * sizeof(int)), *slot = malloc((size_t)n * sizeof(int)),
        *pos = malloc((size_t)n * sizeof(int)), *tgt = malloc((size_t)n * sizeof(int));
    float *w = malloc((size_t)n * sizeof(float)), *lp = malloc((size_t)n * sizeof(float));
    for (int s = 0, i = 0; s < n_seqs; s++) {
        const json_t *seq = json_array_get(seqs, (size_t)s);
        for (size_t t = 0; t < json_array_size(seq); t++, i++) {
            tok[i] = (int)json_integer_value(json_array_get(seq, t));
            slot[i] = s, pos[i] = (int)t;
            tgt[i] = (int)json_integer_value(json_array_get(json_array_get(json_object_get(tr, "targets"), (size_t)s), t));
            w[i] = (float)json_number_value(json_array_get(json_array_get(json_object_get(tr, "weights"), (size_t)s), t));
        }
    }
    char err[ERR_LEN];
    TrainState *st = NULL;
    ModelGrads *g = NULL;
    if (dropout) /* before the state: it takes the dropout's scratch */
        model_lora_set_dropout(m, (float)json_number_value(json_object_get(tr, "p")));
    if (train_state_create(&st, m, n_seqs, max_len, n, err) != 0 || model_grads_create(&g, m, err) != 0) {
        CHECK(0, "%s: %s", name, err);
        goto done;
    }
    if (dropout)
        model_lora_set_dropout_key(m, (uint64_t)json_integer_value(json_object_get(tr, "seed")),
                                   json_integer_value(json_object_get(tr, "key")));
    int frc = model_train_forward(m, st, tok, slot, pos, tgt, n, (float)temperature, lp, NULL, err);
    model_lora_set_dropout_key(m, 0, -1);
    if (frc != 0 || model_train_backward(m, st, w, g, err) != 0) {
        CHECK(0, "%s: %s", name, err);
        goto done;
    }
    double lp_gap = 0.0;
    for (int s = 0, i = 0; s < n_seqs; s++) {
        const json_t *ref = json_array_get(json_object_get(tr, "logprobs"), (size_t)s);
        for (size_t t = 0; t < json_array_size(ref); t++, i++)
            if (tgt[i] >= 0) lp_gap = fmax(lp_gap, fabs(lp[i] - json_number_value(json_array_get(ref, t))));
    }
    CHECK(lp_gap < 1e-4, "%s: training log-probs%s differ from PEFT's by %.3g", name, dropout ? " with dropout" : "",
          lp_gap);
    const json_t *grads = json_object_get(tr, "grads");
    int n_params = model_param_count(m);
    CHECK(n_params == (int)json_object_size(grads), "%s: %d trainable tensors, PEFT has %d", name, n_params,
          (int)json_object_size(grads));
    double worst = 0.0;
    for (int i = 0; i < n_params; i++) {
        ModelParam p = model_param(m, i);
        const json_t *ref = json_object_get(grads, p.name);
        if (!ref) {
            CHECK(0, "%s: PEFT has no gradient for %s", name, p.name);
            continue;
        }
        float *got = malloc(p.numel * sizeof(float));
        backend_cpu()->download(backend_cpu(), got, model_grad(g, i), p.numel);
        double ref_norm = json_number_value(json_object_get(ref, "norm")), err_max = 0.0, norm = 0.0;
        const json_t *full = json_object_get(ref, "full"), *idx = json_object_get(ref, "idx"),
                     *val = json_object_get(ref, "val");
        size_t count = full ? json_array_size(full) : json_array_size(idx);
        for (size_t j = 0; j < count; j++) {
            size_t k = full ? j : (size_t)json_integer_value(json_array_get(idx, j));
            double r = json_number_value(json_array_get(full ? full : val, j));
            err_max = fmax(err_max, k < p.numel ? fabs(got[k] - r) : INFINITY);
        }
        for (size_t j = 0; j < p.numel; j++) norm += (double)got[j] * got[j];
        double rel = err_max / fmax(ref_norm, 1e-30), norm_rel = fabs(sqrt(norm) - ref_norm) / fmax(ref_norm, 1e-30);
        worst = fmax(worst, fmax(rel, norm_rel));
        CHECK(rel < 1e-4 && norm_rel < 1e-4 && count > 0, "%s: %s gradient differs from PEFT's (%.3g of its norm)",
              name, p.name, fmax(rel, norm_rel));
        free(got);
    }
    printf("  %-18s %d adapter gradients vs PEFT autograd%s: worst error %.2e of the tensor's norm (tol 1e-4); "
           "log-probs within %.2e\n",
           name, n_params, dropout ? " with lora_dropout (PEFT given colt's masks)" : "", worst, lp_gap);
done:
    if (dropout) model_lora_set_dropout(m, 0.0f);
    model_grads_free(g);
    train_state_free(st);
    free(tok), free(slot), free(pos), free(tgt), free(w), free(lp);
}

static void check_deterministic_engine(Model *m, const char *name) {
    char err[ERR_LEN];
    Requests r;
    make_requests(&r, model_config(m)->vocab_size);
    SamplingParams sp = {.temperature = 0.8f, .top_k = 0, .top_p = 1.0f, .repetition_penalty = 1.0f, .seed = 5};
    GenerateOptions opt = {.sampling = sp, .max_new_tokens = 12, .ignore_eos = true};
    EngineOptions det = {.deterministic = true};
    if (engine_generate(m, r.seqs, N_SEQS, &opt, &det, NULL, err) != 0) {
        CHECK(0, "%s: %s", name, err);
    } else {
        double mean, max;
        int differ;
        CHECK(trainer_logprob_diff(m, &r, 0.8f, &mean, &max, &differ, err) == 0, "trainer: %s", err);
        printf("  %-18s deterministic engine vs trainer log-probs: %d of %d tokens differ\n", name, differ,
               N_SEQS * 12);
        CHECK(differ == 0, "%s: %d engine log-probs differ from the trainer's (max %.3g)", name, differ, max);
    }
    free_requests(&r);
    backend_cpu()->set_batch_invariant(backend_cpu(), 0);
}

static void check_save_and_merge(Model *m, const json_t *entry, const char *name, const char *base) {
    char err[ERR_LEN], adir[512], mdir[512];
    snprintf(adir, sizeof adir, "%s/%s-adapter", g_tmp, name);
    snprintf(mdir, sizeof mdir, "%s/%s-merged", g_tmp, name);
    CHECK(model_lora_save(m, adir, base, err) == 0, "%s: save: %s", name, err);
    Model *back = load_with_adapter(json_string_value(json_object_get(entry, "base")), NULL);
    if (back && model_lora_load(back, adir, err) != 0) CHECK(0, "%s: reload: %s", name, err);
    double gap = INFINITY;
    bool same = back && model_has_lora(back) && same_logprobs(m, back, entry, &gap);
    printf("  %-18s saved adapter reloaded: log-probs %s\n", name, same ? "bit-identical" : "DIFFER");
    CHECK(same, "%s: reloaded adapter changes log-probs by %.3g", name, gap);
    model_free(back);
    CHECK(model_save_merged(m, mdir, DTYPE_F32, err) == 0, "%s: merge: %s", name, err);
    Model *merged = NULL;
    if (model_load(&merged, mdir, backend_cpu(), err) != 0) {
        CHECK(0, "%s: load merged: %s", name, err);
        return;
    }
    double d = logprob_gap(merged, entry, "merged_logprobs");
    printf("  %-18s merged checkpoint vs PEFT's merge_and_unload: max |diff| = %.3g\n", name, d);
    CHECK(d < 1e-4, "%s: merged model log-probs differ from PEFT's merged model by %.3g", name, d);
    model_free(merged);
}

/* Fresh adapters (B = 0) change nothing; disabled adapters give the base model bit for bit. */
static void check_fresh_and_disabled(Model *m, const json_t *entry, const char *name) {
    char err[ERR_LEN];
    Model *base = load_with_adapter(json_string_value(json_object_get(entry, "base")), NULL);
    Model *fresh = load_with_adapter(json_string_value(json_object_get(entry, "base")), NULL);
    if (!base || !fresh) goto done;
    LoraConfig cfg = {.r = 8, .alpha = 16.0f, .targets = LORA_ALL_TARGETS};
    CHECK(model_lora_attach(fresh, &cfg, 3, err) == 0, "attach: %s", err);
    double gap;
    bool same = same_logprobs(base, fresh, entry, &gap);
    printf("  %-18s fresh adapters (B = 0): log-probs %s the base model's\n", name, same ? "equal" : "DIFFER from");
    CHECK(same, "%s: fresh adapters change log-probs by %.3g", name, gap);
    uint64_t values = model_weights_version(m), layout = model_weights_layout_version(m);
    model_lora_set_enabled(m, false);
    /* the engine's graphs, recorded with the adapters on, are invalid while they are off, valid again after */
    CHECK(model_weights_layout_version(m) != layout, "%s: switching the adapters off left the layout version", name);
    same = same_logprobs(base, m, entry, &gap);
    model_lora_set_enabled(m, true);
    printf("  %-18s adapters disabled: log-probs %s the base model's\n", name, same ? "equal" : "DIFFER from");
    CHECK(same, "%s: disabled adapters still change log-probs by %.3g", name, gap);
    CHECK(model_weights_layout_version(m) == layout && model_weights_version(m) != values,
          "%s: adapters off and on again: layout version %llu -> %llu (want it back), values version %llu -> %llu "
          "(want it moved)", name, (unsigned long long)layout, (unsigned long long)model_weights_layout_version(m),
          (unsigned long long)values, (unsigned long long)model_weights_version(m));
    CHECK(model_lora_attach(fresh, &cfg, 3, err) != 0 && strstr(err, "already has"), "attach twice: %s", err);
done:
    model_free(base);
    model_free(fresh);
}

/* adapter_config.json variations that must be refused, one line naming the key. */
static void check_refusals(const char *adapter, const char *base) {
    struct {
        const char *what, *from, *to, *want;
    } cases[] = {
        {"DoRA", "\"use_dora\": false", "\"use_dora\": true", "use_dora"},
        {"regex targets", "\"target_modules\": [", "\"target_modules\": \".*proj\", \"x\": [", "regular expression"},
        {"unknown module", "\"model.layers.0.self_attn.o_proj\"", "\"model.layers.0.self_attn.x_proj\"", "x_proj"},
        {"one layer only", "\"model.layers.1.mlp.gate_proj\",", "", "adapts layer 1 differently"},
        {"wrong rank", "\"r\": 4", "\"r\": 5", "want [5,"},
        {"modules_to_save", "\"modules_to_save\": null", "\"modules_to_save\": [\"lm_head\"]", "modules_to_save"},
        {"not LoRA", "\"peft_type\": \"LORA\"", "\"peft_type\": \"IA3\"", "peft_type"},
    };
    char src[512], *text = NULL, err[ERR_LEN];
    size_t len;
    snprintf(src, sizeof src, "%s/%s/adapter_config.json", COLT_SOURCE_DIR, adapter);
    if (file_read_all(src, &text, &len, err) != 0) {
        CHECK(0, "%s", err);
        return;
    }
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        char dir[512], path[600];
        snprintf(dir, sizeof dir, "%s/refuse%zu", g_tmp, k);
        sh("mkdir -p '%s' && cp '%s/%s/adapter_model.safetensors' '%s/'", dir, COLT_SOURCE_DIR, adapter, dir);
        const char *at = strstr(text, cases[k].from);
        CHECK(at != NULL, "%s: '%s' not in the golden adapter_config.json", cases[k].what, cases[k].from);
        if (!at) continue;
        size_t pre = (size_t)(at - text), from_len = strlen(cases[k].from);
        char *edited = malloc(len + strlen(cases[k].to) + 1);
        memcpy(edited, text, pre);
        strcpy(edited + pre, cases[k].to);
        strcat(edited, at + from_len);
        snprintf(path, sizeof path, "%s/adapter_config.json", dir);
        CHECK(file_write_atomic(path, edited, strlen(edited), err) == 0, "%s", err);
        free(edited);
        Model *m = load_with_adapter(base, NULL);
        int rc = m ? model_lora_load(m, dir, err) : 0;
        bool ok = m && rc != 0 && strstr(err, cases[k].want) && !strchr(err, '\n') && !model_has_lora(m);
        printf("  refused %-16s -> %s\n", cases[k].what, rc != 0 ? err : "(accepted)");
        CHECK(ok, "%s: want an error naming '%s', got rc %d: %s", cases[k].what, cases[k].want, rc, err);
        model_free(m);
    }
    free(text);
}

int main(void) {
    char *text = NULL, err[ERR_LEN];
    size_t len;
    if (file_read_all(COLT_SOURCE_DIR "/tests/data/lora/goldens.json", &text, &len, err) != 0) {
        printf("FAIL: %s\n", err);
        return 1;
    }
    json_t *root = json_loadb(text, len, 0, NULL);
    free(text);
    COLT_ASSERT(root);
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_test_lora_XXXXXX");
    COLT_ASSERT(mkdtemp(g_tmp));
    double temperature = json_number_value(json_object_get(root, "temperature"));
    const json_t *adapters = json_object_get(root, "adapters");
    for (size_t i = 0; i < json_array_size(adapters); i++) {
        const json_t *e = json_array_get(adapters, i);
        const char *name = json_string_value(json_object_get(e, "name"));
        const char *base = json_string_value(json_object_get(e, "base")), *dir = json_string_value(json_object_get(e, "dir"));
        printf("%s (%s on %s)\n", name, dir, base);
        Model *m = load_with_adapter(base, dir);
        if (!m) continue;
        double d = logprob_gap(m, e, "logprobs");
        printf("  %-18s log-probs vs PEFT: max |diff| = %.3g\n", name, d);
        CHECK(d < 1e-4, "%s: log-probs differ from PEFT's by %.3g (tolerance 1e-4)", name, d);
        check_train_forward(m, e, name);
        check_greedy(m, e, name);
        check_gradients(m, e, temperature, name, false);
        check_gradients(m, e, temperature, name, true);
        check_deterministic_engine(m, name);
        check_save_and_merge(m, e, name, base);
        check_fresh_and_disabled(m, e, name);
        model_free(m);
    }
    check_refusals("tests/data/lora/qwen3-all-linear", "tests/data/models/tiny-qwen3-f32");
    json_decref(root);
    sh("rm -rf '%s'", g_tmp);
    printf("test_lora: %d checks, %d failures\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
