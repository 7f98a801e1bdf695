/* test_grad.c — the training forward and backward against PyTorch autograd.
 *
 * For every model in tests/data/grad_goldens.json (made by
 * tests/ref/make_grad_goldens.py): a packed batch of three sequences (7, 12, 5
 * tokens) in three slots, per-token log-probs under logits / 0.7 of the
 * completion targets, loss = sum w_i logp_i, backward with dlogprobs = w.
 * Checks, with the rules printed:
 *   - log-probs and entropies vs torch: |got - ref| <= 1e-4;
 *   - every parameter's gradient vs torch (all entries of small tensors, 64
 *     sampled entries of large ones): |g - ref| <= 1e-4 * max|ref tensor| + 1e-6,
 *     and its L2 norm within 1e-4 relative; every torch parameter is matched;
 *   - the training log-probs vs the inference path (model_forward logits,
 *     log-softmax in double): |diff| <= 1e-5;
 *   - gradient accumulation: backward on sequences {0, 2} then {1} (two
 *     forward/backward calls) == one call on all three: |diff| <= 1e-5 *
 *     max|g tensor| + 1e-7;
 *   - central finite differences of the loss on a few scalars (tiny-qwen2):
 *     |fd - g| <= 1e-2 * |g| + 2e-3.
 *
 * Dimension legend: N tokens in the batch, V vocab. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/model.h"
#include "model/model_train.h"
#include "shared_data.h"
#include "harness.h"


/* A packed batch: the golden sequences concatenated, sequence s in slot s. */
typedef struct Batch {
    int n, n_seqs, max_len;
    int *tokens, *slot, *pos, *targets; /* [N] */
    float *weights;                     /* [N] dlogprobs */
    double *ref_lp, *ref_ent;           /* [N] */
} Batch;

static void batch_from_json(Batch *b, const json_t *entry) {
    const json_t *seqs = json_object_get(entry, "sequences"), *tg = json_object_get(entry, "targets"),
                 *ws = json_object_get(entry, "weights"), *lp = json_object_get(entry, "logprobs"),
                 *en = json_object_get(entry, "entropies");
    memset(b, 0, sizeof(*b));
    b->n_seqs = (int)json_array_size(seqs);
    for (int s = 0; s < b->n_seqs; s++) {
        int T = (int)json_array_size(json_array_get(seqs, (size_t)s));
        b->n += T;
        if (T > b->max_len) b->max_len = T;
    }
    b->tokens = malloc((size_t)b->n * sizeof(int));
    b->slot = malloc((size_t)b->n * sizeof(int));
    b->pos = malloc((size_t)b->n * sizeof(int));
    b->targets = malloc((size_t)b->n * sizeof(int));
    b->weights = malloc((size_t)b->n * sizeof(float));
    b->ref_lp = malloc((size_t)b->n * sizeof(double));
    b->ref_ent = malloc((size_t)b->n * sizeof(double));
    int i = 0;
    for (int s = 0; s < b->n_seqs; s++) {
        const json_t *seq = json_array_get(seqs, (size_t)s);
        for (size_t t = 0; t < json_array_size(seq); t++, i++) {
            b->tokens[i] = (int)json_integer_value(json_array_get(seq, t));
            b->slot[i] = s;
            b->pos[i] = (int)t;
            b->targets[i] = (int)json_integer_value(json_array_get(json_array_get(tg, (size_t)s), t));
            b->weights[i] = (float)json_number_value(json_array_get(json_array_get(ws, (size_t)s), t));
            b->ref_lp[i] = json_number_value(json_array_get(json_array_get(lp, (size_t)s), t));
            b->ref_ent[i] = json_number_value(json_array_get(json_array_get(en, (size_t)s), t));
        }
    }
}

static void batch_free(Batch *b) {
    free(b->tokens), free(b->slot), free(b->pos), free(b->targets), free(b->weights), free(b->ref_lp),
        free(b->ref_ent);
}

/* Forward (+ backward when g) of the tokens of b whose sequence is in `seqs`
 * (a bitmask), packed in token order into slots 0.. in sequence order.
 * Returns sum w_i logp_i (double) or NAN on error. */
static double run_subset(Model *m, TrainState *st, const Batch *b, unsigned seqs, float temperature, ModelGrads *g,
                         float *lp_out, float *ent_out) {
    int n = 0;
    int *tok = calloc((size_t)b->n, sizeof(int)), *sl = calloc((size_t)b->n, sizeof(int)),
        *ps = calloc((size_t)b->n, sizeof(int)), *tg = calloc((size_t)b->n, sizeof(int));
    float *w = calloc((size_t)b->n, sizeof(float)), *lp = calloc((size_t)b->n, sizeof(float)),
          *ent = calloc((size_t)b->n, sizeof(float));
    int slot_of[32], next = 0;
    for (int s = 0; s < b->n_seqs; s++) slot_of[s] = (seqs >> s & 1) ? next++ : -1;
    for (int i = 0; i < b->n; i++) {
        if (slot_of[b->slot[i]] < 0) continue;
        tok[n] = b->tokens[i], sl[n] = slot_of[b->slot[i]], ps[n] = b->pos[i], tg[n] = b->targets[i];
        w[n] = b->weights[i];
        n++;
    }
    char err[ERR_LEN];
    double loss = NAN;
    if (model_train_forward(m, st, tok, sl, ps, tg, n, temperature, lp, ent, err) != 0) {
        printf("model_train_forward: %s\n", err);
        goto done;
    }
    loss = 0.0;
    for (int i = 0; i < n; i++) loss += (double)w[i] * lp[i];
    if (g && model_train_backward(m, st, w, g, err) != 0) {
        printf("model_train_backward: %s\n", err);
        loss = NAN;
    }
    if (lp_out) memcpy(lp_out, lp, (size_t)n * sizeof(float));
    if (ent_out) memcpy(ent_out, ent, (size_t)n * sizeof(float));
done:
    free(tok), free(sl), free(ps), free(tg), free(w), free(lp), free(ent);
    return loss;
}

static float *download_param_grad(Model *m, ModelGrads *g, int i) {
    ModelParam p = model_param(m, i);
    float *host = malloc(p.numel * sizeof(float));
    backend_cpu()->download(backend_cpu(), host, model_grad(g, i), p.numel);
    return host;
}

/* Every parameter's gradient vs the golden entry; prints one line per tensor. */
static void check_grads(Model *m, ModelGrads *g, const json_t *golden_grads, const char *label) {
    int n_params = model_param_count(m);
    CHECK(n_params == (int)json_object_size(golden_grads), "%s: %d parameters, torch has %d", label, n_params,
          (int)json_object_size(golden_grads));
    double worst_model = 0.0;
    for (int i = 0; i < n_params; i++) {
        ModelParam p = model_param(m, i);
        const json_t *ref = json_object_get(golden_grads, p.name);
        if (!ref) {
            CHECK(0, "%s: parameter %s has no torch gradient", label, p.name);
            continue;
        }
        CHECK((size_t)json_integer_value(json_object_get(ref, "numel")) == p.numel, "%s: %s numel differs", label,
              p.name);
        float *got = download_param_grad(m, g, i);
        double max_abs = json_number_value(json_object_get(ref, "max_abs"));
        double tol = 1e-4 * max_abs + 1e-6, worst = 0.0;
        const json_t *full = json_object_get(ref, "full");
        size_t count = 0;
        if (full) {
            count = json_array_size(full);
            for (size_t j = 0; j < count && j < p.numel; j++) {
                double d = fabs(got[j] - json_number_value(json_array_get(full, j)));
                if (!(d <= worst)) worst = d;
            }
        } else {
            const json_t *idx = json_object_get(ref, "idx"), *val = json_object_get(ref, "val");
            count = json_array_size(idx);
            for (size_t j = 0; j < count; j++) {
                size_t k = (size_t)json_integer_value(json_array_get(idx, j));
                double d = k < p.numel ? fabs(got[k] - json_number_value(json_array_get(val, j))) : INFINITY;
                if (!(d <= worst)) worst = d;
            }
        }
        double norm = 0.0, ref_norm = json_number_value(json_object_get(ref, "norm"));
        for (size_t j = 0; j < p.numel; j++) norm += (double)got[j] * got[j];
        norm = sqrt(norm);
        double norm_rel = fabs(norm - ref_norm) / fmax(ref_norm, 1e-30);
        double rel = worst / fmax(max_abs, 1e-30);
        if (!(rel <= worst_model)) worst_model = rel;
        int ok = worst <= tol && norm_rel <= 1e-4 + 1e-6 / fmax(ref_norm, 1e-30) && count > 0;
        printf("  %s %-14s %-48s %3zu entries: max|err|/max|ref| = %.2e, |norm| rel err = %.2e\n",
               ok ? "ok  " : "FAIL", label, p.name, count, rel, norm_rel);
        if (!ok) g_failures++;
        free(got);
    }
    printf("  %s: worst gradient error %.2e of the tensor's max |grad| (tol 1e-4)\n", label, worst_model);
}

/* Log-softmax of model_forward's logits / T at each target, in double. */
static double check_inference_parity(Model *m, const Batch *b, const float *train_lp, float temperature,
                                     const char *label) {
    int V = model_config(m)->vocab_size;
    char err[ERR_LEN];
    ModelState *ms;
    if (model_state_create(&ms, m, b->n_seqs, b->max_len, b->n, err) != 0) {
        CHECK(0, "%s", err);
        return INFINITY;
    }
    float *logits = malloc((size_t)b->n * V * sizeof(float));
    double worst = INFINITY;
    if (model_forward(m, ms, b->tokens, b->slot, b->pos, b->n, NULL, logits, err) != 0) {
        CHECK(0, "model_forward: %s", err);
    } else {
        worst = 0.0;
        for (int i = 0; i < b->n; i++) {
            if (b->targets[i] < 0) continue;
            const float *row = logits + (size_t)i * V;
            double mx = -INFINITY, sum = 0.0;
            for (int v = 0; v < V; v++) mx = fmax(mx, row[v] / (double)temperature);
            for (int v = 0; v < V; v++) sum += exp(row[v] / (double)temperature - mx);
            double lp = row[b->targets[i]] / (double)temperature - mx - log(sum);
            double d = fabs(lp - train_lp[i]);
            if (!(d <= worst)) worst = d;
        }
    }
    CHECK(worst <= 1e-5, "%s: training log-probs vs inference path differ by %.3g", label, worst);
    printf("  %s %-14s training vs inference log-probs: max |diff| = %.2e (tol 1e-5)\n",
           worst <= 1e-5 ? "ok  " : "FAIL", label, worst);
    free(logits);
    model_state_free(ms);
    return worst;
}

/* Two forward/backward calls on sequences {0, 2} and {1} vs one on all. */
static void check_accumulation(Model *m, TrainState *st, const Batch *b, float temperature, ModelGrads *whole,
                               const char *label) {
    char err[ERR_LEN];
    ModelGrads *parts;
    if (model_grads_create(&parts, m, err) != 0) {
        CHECK(0, "%s", err);
        return;
    }
    unsigned all = (1u << b->n_seqs) - 1, first = 0x5 & all;
    double l1 = run_subset(m, st, b, first, temperature, parts, NULL, NULL);
    double l2 = run_subset(m, st, b, all & ~first, temperature, parts, NULL, NULL);
    CHECK(!isnan(l1) && !isnan(l2), "%s: accumulation runs failed", label);
    double worst = 0.0;
    for (int i = 0; i < model_param_count(m); i++) {
        ModelParam p = model_param(m, i);
        float *a = download_param_grad(m, whole, i), *c = download_param_grad(m, parts, i);
        double mx = 0.0, d = 0.0;
        for (size_t j = 0; j < p.numel; j++) mx = fmax(mx, fabs(a[j]));
        for (size_t j = 0; j < p.numel; j++) {
            double e = fabs((double)a[j] - c[j]) / (mx + 1e-2);
            if (!(e <= d)) d = e;
        }
        if (!(d <= worst)) worst = d;
        CHECK(d <= 1e-5, "%s: %s accumulated gradient differs by %.3g of its max", label, p.name, d);
        free(a), free(c);
    }
    printf("  %s %-14s accumulation (2 calls vs 1): max |diff| / max|g| = %.2e (tol 1e-5)\n",
           worst <= 1e-5 ? "ok  " : "FAIL", label, worst);
    model_grads_free(parts);
}

/* Activation recompute (gradient checkpointing) must give the very same
 * gradients: the same ops in the same order, only run twice. */
static void check_recompute(Model *m, const Batch *b, float temperature, ModelGrads *whole, const char *label) {
    char err[ERR_LEN];
    TrainState *st;
    ModelGrads *g;
    if (train_state_create_recompute(&st, m, b->n_seqs, b->max_len, b->n, true, err) != 0 ||
        model_grads_create(&g, m, err) != 0) {
        CHECK(0, "%s", err);
        return;
    }
    double loss = run_subset(m, st, b, (1u << b->n_seqs) - 1, temperature, g, NULL, NULL);
    double worst = 0.0;
    for (int i = 0; i < model_param_count(m) && !isnan(loss); i++) {
        ModelParam p = model_param(m, i);
        float *a = download_param_grad(m, whole, i), *c = download_param_grad(m, g, i);
        for (size_t j = 0; j < p.numel; j++) worst = fmax(worst, fabs((double)a[j] - c[j]));
        free(a), free(c);
    }
    int ok = !isnan(loss) && worst == 0.0 && train_state_bytes(st) > 0;
    printf("  %s %-14s activation recompute: max |grad diff| = %.2e (must be 0)\n", ok ? "ok  " : "FAIL", label, worst);
    if (!ok) g_failures++;
    model_grads_free(g);
    train_state_free(st);
}

/* Central differences of the loss on a few scalars of named parameters. */
static void check_finite_differences(Model *m, TrainState *st, const Batch *b, float temperature, ModelGrads *g,
                                     const char *label) {
    static const struct {
        const char *name;
        size_t index;
    } probes[] = {
        {"model.embed_tokens.weight", 0}, /* replaced by a used token's row below */
        {"model.layers.0.self_attn.q_proj.bias", 3},
        {"model.layers.0.self_attn.k_proj.weight", 77},
        {"model.layers.1.self_attn.v_proj.weight", 130},
        {"model.layers.1.mlp.down_proj.weight", 501},
        {"model.layers.0.input_layernorm.weight", 9},
        {"model.norm.weight", 7},
    };
    const Backend *be = backend_cpu();
    int D = model_config(m)->hidden_size;
    int worst_fail = 0;
    for (size_t k = 0; k < sizeof(probes) / sizeof(probes[0]); k++) {
        int idx = -1;
        for (int i = 0; i < model_param_count(m); i++)
            if (strcmp(model_param(m, i).name, probes[k].name) == 0) idx = i;
        if (idx < 0) continue;
        ModelParam p = model_param(m, idx);
        size_t j = k == 0 ? (size_t)b->tokens[4] * D + 5 : probes[k].index % p.numel;
        float *host = malloc(p.numel * sizeof(float));
        be->download(be, host, p.data, p.numel);
        float orig = host[j], eps = 1e-2f;
        host[j] = orig + eps;
        be->upload(be, p.data, host, p.numel);
        double lp = run_subset(m, st, b, (1u << b->n_seqs) - 1, temperature, NULL, NULL, NULL);
        host[j] = orig - eps;
        be->upload(be, p.data, host, p.numel);
        double lm = run_subset(m, st, b, (1u << b->n_seqs) - 1, temperature, NULL, NULL, NULL);
        host[j] = orig;
        be->upload(be, p.data, host, p.numel);
        float *gr = download_param_grad(m, g, idx);
        double fd = (lp - lm) / (2.0 * (double)eps), an = gr[j];
        int ok = fabs(fd - an) <= 1e-2 * fabs(an) + 2e-3;
        printf("  %s %-14s finite difference %s[%zu]: fd %.6f, backward %.6f\n", ok ? "ok  " : "FAIL", label,
               p.name, j, fd, an);
        if (!ok) worst_fail++;
        free(host), free(gr);
    }
    g_failures += worst_fail;
}

/* model_grads_on_ready: a backward announces ranges that tile the flat
 * gradient buffer exactly once, the lm_head / final norm first and the
 * embedding last, and a range's values never change after it is announced
 * (the CPU runs each op when called, so the values seen then are the ones the
 * collective would send). */
typedef struct Announced {
    size_t (*range)[2];
    float **seen; /* the range's values when it was announced */
    int n, cap;
    const float *flat;
} Announced;

static int record_ready(void *ctx, size_t lo, size_t hi, char *err) {
    (void)err;
    Announced *a = ctx;
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 64;
        a->range = realloc(a->range, (size_t)a->cap * sizeof *a->range);
        a->seen = realloc(a->seen, (size_t)a->cap * sizeof *a->seen);
    }
    a->range[a->n][0] = lo;
    a->range[a->n][1] = hi;
    a->seen[a->n] = malloc((hi - lo) * sizeof(float));
    memcpy(a->seen[a->n], a->flat + lo, (hi - lo) * sizeof(float));
    a->n++;
    return 0;
}

static void check_announcements(Model *m, const Batch *b, float temperature, ModelGrads *whole, const char *label) {
    char err[ERR_LEN];
    TrainState *st;
    ModelGrads *g;
    if (train_state_create(&st, m, b->n_seqs, b->max_len, b->n, err) != 0 || model_grads_create(&g, m, err) != 0) {
        CHECK(0, "%s", err);
        return;
    }
    size_t n = 0, n_whole = 0;
    const float *flat = model_grads_flat(g, &n), *ref = model_grads_flat(whole, &n_whole);
    Announced a = {.flat = flat};
    model_grads_on_ready(g, record_ready, &a);
    double loss = run_subset(m, st, b, (1u << b->n_seqs) - 1, temperature, g, NULL, NULL);
    unsigned char *covered = calloc(n, 1);
    int overlaps = 0, changed = 0;
    for (int i = 0; i < a.n; i++)
        for (size_t j = a.range[i][0]; j < a.range[i][1]; j++) {
            overlaps += covered[j]++ != 0;
            changed += memcmp(&a.seen[i][j - a.range[i][0]], &flat[j], sizeof(float)) != 0;
        }
    size_t missing = 0;
    for (size_t j = 0; j < n; j++) missing += !covered[j];
    /* the final norm's gradient is in the first announcement; the embedding's (flat offset 0) in the last */
    ModelParam final_norm = {0};
    for (int i = 0; i < model_param_count(m); i++)
        if (!strcmp(model_param(m, i).name, "model.norm.weight")) final_norm = model_param(m, i);
    size_t n_weights = 0; /* the CPU backend's weights are fp32, laid out like the gradients */
    size_t norm_at = (size_t)((char *)final_norm.data - (char *)model_params_flat(m, &n_weights)) / sizeof(float);
    bool head_first = false;
    for (int i = 0; i < a.n && i < 2; i++) head_first |= a.range[i][0] <= norm_at && norm_at < a.range[i][1];
    bool embed_last = a.n > 0 && a.range[a.n - 1][0] == 0;
    int ok = !isnan(loss) && a.n > 0 && !overlaps && !missing && !changed && head_first && embed_last &&
             n == n_whole && memcmp(flat, ref, n * sizeof(float)) == 0;
    printf("  %s %-14s backward announcements: %d ranges tile %zu gradients (overlaps %d, missing %zu, changed after "
           "announced %d, head first %d, embedding last %d, same gradients as without them %d)\n",
           ok ? "ok  " : "FAIL", label, a.n, n, overlaps, missing, changed, head_first, embed_last,
           n == n_whole && memcmp(flat, ref, n * sizeof(float)) == 0);
    if (!ok) g_failures++;
    for (int i = 0; i < a.n; i++) free(a.seen[i]);
    free(a.range), free(a.seen), free(covered);
    model_grads_free(g);
    train_state_free(st);
}

static void test_model_entry(const json_t *entry, float temperature) {
    const char *label = json_string_value(json_object_get(entry, "name"));
    const char *rel = json_string_value(json_object_get(entry, "dir"));
    char dir[1024];
    if (strncmp(rel, "SHARED/", 7) == 0)
        snprintf(dir, sizeof(dir), "%s/%s", COLT_SHARED_DATA, rel + 7);
    else
        snprintf(dir, sizeof(dir), "%s/%s", COLT_SOURCE_DIR, rel);
    char err[ERR_LEN];
    Model *m;
    if (model_load(&m, dir, backend_cpu(), err) != 0) {
        CHECK(0, "%s", err);
        return;
    }
    Batch b;
    batch_from_json(&b, entry);
    printf("%s: %d tokens in %d sequences\n", label, b.n, b.n_seqs);
    TrainState *st;
    ModelGrads *g;
    CHECK(train_state_create(&st, m, b.n_seqs, b.max_len, b.n, err) == 0, "%s", err);
    CHECK(model_grads_create(&g, m, err) == 0, "%s", err);
    float *lp = malloc((size_t)b.n * sizeof(float)), *ent = malloc((size_t)b.n * sizeof(float));
    double loss = run_subset(m, st, &b, (1u << b.n_seqs) - 1, temperature, g, lp, ent);
    double ref_loss = json_number_value(json_object_get(entry, "loss"));
    double lp_err = 0.0, ent_err = 0.0;
    int n_targets = 0;
    for (int i = 0; i < b.n; i++) {
        n_targets += b.targets[i] >= 0;
        lp_err = fmax(lp_err, fabs(lp[i] - b.ref_lp[i]));
        ent_err = fmax(ent_err, fabs(ent[i] - b.ref_ent[i]));
    }
    if (isnan(lp_err) || isnan(ent_err)) lp_err = INFINITY;
    int ok = lp_err <= 1e-4 && ent_err <= 1e-4 && n_targets > 0 && fabs(loss - ref_loss) <= 1e-4 * fmax(1.0, fabs(ref_loss));
    printf("  %s %-14s %d log-probs: max |err| = %.2e, entropies %.2e (tol 1e-4); loss %.6f vs torch %.6f\n",
           ok ? "ok  " : "FAIL", label, n_targets, lp_err, ent_err, loss, ref_loss);
    if (!ok) g_failures++;
    check_grads(m, g, json_object_get(entry, "grads"), label);
    check_inference_parity(m, &b, lp, temperature, label);
    check_recompute(m, &b, temperature, g, label);
    check_announcements(m, &b, temperature, g, label);
    check_accumulation(m, st, &b, temperature, g, label);
    if (strcmp(label, "tiny-qwen2-f32") == 0) check_finite_differences(m, st, &b, temperature, g, label);
    free(lp), free(ent);
    batch_free(&b);
    model_grads_free(g);
    train_state_free(st);
    model_free(m);
}

/* Bad input is an error with a message, not a crash. */
static void test_errors(void) {
    char path[1024], err[ERR_LEN];
    snprintf(path, sizeof(path), "%s/tests/data/models/tiny-llama-f32", COLT_SOURCE_DIR);
    Model *m;
    TrainState *st;
    ModelGrads *g;
    if (model_load(&m, path, backend_cpu(), err) != 0) {
        CHECK(0, "%s", err);
        return;
    }
    CHECK(train_state_create(&st, m, 2, 8, 8, err) == 0, "%s", err);
    CHECK(model_grads_create(&g, m, err) == 0, "%s", err);
    int tok[3] = {5, 6, 7}, slot[3] = {0, 0, 0}, pos_gap[3] = {0, 1, 3}, pos_dup[3] = {0, 1, 1}, tg[3] = {6, 7, -1};
    float lp[3], dlp[3] = {1, 1, 0};
    CHECK(model_train_backward(m, st, dlp, g, err) != 0, "backward before any forward must fail");
    CHECK(model_train_forward(m, st, tok, slot, pos_gap, tg, 3, 1.0f, lp, NULL, err) != 0, "a gap must fail");
    printf("  ok   errors: %s\n", err);
    CHECK(model_train_forward(m, st, tok, slot, pos_dup, tg, 3, 1.0f, lp, NULL, err) != 0, "a duplicate must fail");
    printf("  ok   errors: %s\n", err);
    CHECK(model_train_forward(m, st, tok, slot, pos_dup, tg, 9, 1.0f, lp, NULL, err) != 0, "too many tokens");
    printf("  ok   errors: %s\n", err);
    model_grads_free(g);
    train_state_free(st);
    model_free(m);
}

int main(void) {
    char path[1024], err[ERR_LEN];
    snprintf(path, sizeof(path), "%s/tests/data/grad_goldens.json", COLT_SOURCE_DIR);
    json_error_t jerr;
    json_t *root = json_load_file(path, 0, &jerr);
    if (!root) {
        printf("FAIL: %s: %s\n", path, jerr.text);
        return 1;
    }
    (void)err;
    float temperature = (float)json_number_value(json_object_get(root, "temperature"));
    const json_t *models = json_object_get(root, "models");
    int n_models = 0;
    for (size_t i = 0; i < json_array_size(models); i++) {
        const json_t *entry = json_array_get(models, i);
        const char *rel = json_string_value(json_object_get(entry, "dir"));
        if (strncmp(rel, "SHARED/", 7) == 0 && !shared_data_present()) {
            char what[256];
            snprintf(what, sizeof what, "%s gradients against PyTorch (%s)",
                     json_string_value(json_object_get(entry, "name")), rel + 7);
            shared_data_skipped(what);
            continue;
        }
        test_model_entry(entry, temperature);
        n_models++;
    }
    CHECK(n_models >= 2, "only %d models tested", n_models);
    test_errors();
    json_decref(root);
    printf("%s: %d models, %d failures\n", g_failures ? "FAILED" : "OK", n_models, g_failures);
    return g_failures ? 1 : 0;
}
