/* test_model.c — the CPU forward pass against transformers goldens.
 *
 * For every checkpoint in tests/data/models/goldens.json (made by
 * tests/ref/make_model_goldens.py) and the pretrained stories260K:
 * per-token log-probs of one full-sequence forward (tolerance 1e-4), greedy
 * decoding through the KV cache one token per call (token-identical), a
 * batched forward of two sequences in two slots (= the single runs, 1e-5),
 * save/load round trips (F32 bit-identical, BF16 = transformers' bf16 checkpoint)
 * and random init + save + load. Set COLT_MODEL_SAVE_DIR to keep the saved
 * checkpoints (to check them with transformers: make_model_goldens.py --check).
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
#include "model/model.h"
#include "model/model_train.h"
#include "shared_data.h"
#include "harness.h"


static int *json_ints(const json_t *a, int *n) {
    *n = (int)json_array_size(a);
    int *v = malloc((size_t)(*n ? *n : 1) * sizeof(int));
    for (int i = 0; i < *n; i++) v[i] = (int)json_integer_value(json_array_get(a, (size_t)i));
    return v;
}

/* lp[T-1] = log p(ids[t] | ids[<t]) from one forward of the whole sequence in
 * slot `slot`; log-softmax in double. Returns 0 or -1. */
static int model_logprobs(Model *m, ModelState *st, const int *ids, int T, int slot, double *lp) {
    int V = model_config(m)->vocab_size;
    float *logits = malloc((size_t)T * V * sizeof(float));
    int *slots = malloc((size_t)T * sizeof(int)), *pos = malloc((size_t)T * sizeof(int));
    for (int t = 0; t < T; t++) slots[t] = slot, pos[t] = t;
    char err[ERR_LEN];
    int rc = model_forward(m, st, ids, slots, pos, T, NULL, logits, err);
    if (rc != 0) printf("forward failed: %s\n", err);
    for (int t = 0; rc == 0 && t + 1 < T; t++) {
        const float *row = logits + (size_t)t * V;
        double mx = row[0], sum = 0.0;
        for (int v = 1; v < V; v++) mx = row[v] > mx ? row[v] : mx;
        for (int v = 0; v < V; v++) sum += exp((double)row[v] - mx);
        lp[t] = (double)row[ids[t + 1]] - mx - log(sum);
    }
    free(logits);
    free(slots);
    free(pos);
    return rc;
}

static double max_abs_diff_json(const double *a, const json_t *golden, int n) {
    double worst = 0.0;
    for (int i = 0; i < n; i++) worst = fmax(worst, fabs(a[i] - json_number_value(json_array_get(golden, (size_t)i))));
    return worst;
}

static int argmax(const float *x, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (x[i] > x[best]) best = i;
    return best;
}

/* Log-probs of every golden sequence; returns the worst max |diff|. */
static double check_logprobs(Model *m, const json_t *entry, const char *label) {
    ModelState *st;
    char err[ERR_LEN];
    COLT_ASSERT(model_state_create(&st, m, 2, 128, 128, err) == 0);
    double worst = 0.0;
    const json_t *seqs = json_object_get(entry, "logprobs");
    for (size_t s = 0; s < json_array_size(seqs); s++) {
        int T;
        int *ids = json_ints(json_object_get(json_array_get(seqs, s), "ids"), &T);
        double *lp = malloc((size_t)T * sizeof(double));
        if (model_logprobs(m, st, ids, T, 0, lp) == 0) {
            double d = max_abs_diff_json(lp, json_object_get(json_array_get(seqs, s), "logprobs"), T - 1);
            printf("  %-28s logprobs seq %zu (T=%d): max |diff| vs transformers = %.3g\n", label, s, T, d);
            worst = fmax(worst, d);
        } else {
            worst = INFINITY;
        }
        free(ids);
        free(lp);
    }
    model_state_free(st);
    return worst;
}

/* Greedy: prefill the prompt (logits of the last token only), then one token per call. */
static void check_greedy(Model *m, const json_t *entry, const char *label) {
    const json_t *g = json_object_get(entry, "greedy");
    int P, G;
    int *prompt = json_ints(json_object_get(g, "prompt"), &P);
    int *want = json_ints(json_object_get(g, "new_tokens"), &G);
    int V = model_config(m)->vocab_size, L = P + G;
    ModelState *st;
    char err[ERR_LEN];
    COLT_ASSERT(model_state_create(&st, m, 1, L, P, err) == 0);
    int *slots = calloc((size_t)P, sizeof(int)), *pos = malloc((size_t)P * sizeof(int));
    uint8_t *wl = calloc((size_t)P, 1);
    for (int t = 0; t < P; t++) pos[t] = t;
    wl[P - 1] = 1;
    float *logits = malloc((size_t)V * sizeof(float));
    int rc = model_forward(m, st, prompt, slots, pos, P, wl, logits, err);
    int matched = 0;
    for (int i = 0; rc == 0 && i < G; i++) {
        int tok = argmax(logits, V);
        if (tok != want[i]) break;
        matched++;
        int p = P + i, s0 = 0;
        if (i + 1 < G) rc = model_forward(m, st, &tok, &s0, &p, 1, NULL, logits, err);
    }
    if (rc != 0) printf("  forward failed: %s\n", err);
    printf("  %-28s greedy: %d/%d tokens identical to transformers generate\n", label, matched, G);
    CHECK(matched == G, "%s: greedy diverges at new token %d", label, matched);
    free(prompt);
    free(want);
    free(slots);
    free(pos);
    free(wl);
    free(logits);
    model_state_free(st);
}

/* Two sequences in slots 1 and 0 in one call = each run alone. */
static void check_batched(Model *m, const json_t *entry, const char *label) {
    const json_t *seqs = json_object_get(entry, "logprobs");
    if (json_array_size(seqs) < 2) return;
    int Ta, Tb;
    int *a = json_ints(json_object_get(json_array_get(seqs, 0), "ids"), &Ta);
    int *b = json_ints(json_object_get(json_array_get(seqs, 1), "ids"), &Tb);
    int V = model_config(m)->vocab_size, N = Ta + Tb;
    ModelState *st;
    char err[ERR_LEN];
    COLT_ASSERT(model_state_create(&st, m, 2, 128, N, err) == 0);
    double *lpa = malloc((size_t)Ta * sizeof(double)), *lpb = malloc((size_t)Tb * sizeof(double));
    COLT_ASSERT(model_logprobs(m, st, a, Ta, 0, lpa) == 0 && model_logprobs(m, st, b, Tb, 0, lpb) == 0);
    /* Interleave: b's tokens first in slot 1, then a's in slot 0. */
    int *ids = malloc((size_t)N * sizeof(int)), *slots = malloc((size_t)N * sizeof(int)),
        *pos = malloc((size_t)N * sizeof(int));
    for (int t = 0; t < Tb; t++) ids[t] = b[t], slots[t] = 1, pos[t] = t;
    for (int t = 0; t < Ta; t++) ids[Tb + t] = a[t], slots[Tb + t] = 0, pos[Tb + t] = t;
    float *logits = malloc((size_t)N * V * sizeof(float));
    int rc = model_forward(m, st, ids, slots, pos, N, NULL, logits, err);
    CHECK(rc == 0, "batched forward: %s", err);
    double worst = 0.0;
    for (int s = 0; s < 2 && rc == 0; s++) {
        const int *x = s ? a : b;
        int T = s ? Ta : Tb, off = s ? Tb : 0;
        const double *ref = s ? lpa : lpb;
        for (int t = 0; t + 1 < T; t++) {
            const float *row = logits + (size_t)(off + t) * V;
            double mx = row[0], sum = 0.0;
            for (int v = 1; v < V; v++) mx = fmax(mx, row[v]);
            for (int v = 0; v < V; v++) sum += exp(row[v] - mx);
            worst = fmax(worst, fabs(row[x[t + 1]] - mx - log(sum) - ref[t]));
        }
    }
    printf("  %-28s batched (2 slots, %d tokens, one call) vs single runs: max |diff| = %.3g\n", label, N, worst);
    CHECK(worst < 1e-5, "%s: batched differs from single runs by %.3g", label, worst);
    free(a);
    free(b);
    free(lpa);
    free(lpb);
    free(ids);
    free(slots);
    free(pos);
    free(logits);
    model_state_free(st);
}

/* max |logprob(a) - logprob(b)| over the golden sequences of entry. */
static double models_max_diff(Model *a, Model *b, const json_t *entry) {
    char err[ERR_LEN];
    ModelState *sa, *sb;
    COLT_ASSERT(model_state_create(&sa, a, 1, 128, 128, err) == 0 && model_state_create(&sb, b, 1, 128, 128, err) == 0);
    double worst = 0.0;
    const json_t *seqs = json_object_get(entry, "logprobs");
    for (size_t s = 0; s < json_array_size(seqs); s++) {
        int T;
        int *ids = json_ints(json_object_get(json_array_get(seqs, s), "ids"), &T);
        double *la = malloc((size_t)T * sizeof(double)), *lb = malloc((size_t)T * sizeof(double));
        COLT_ASSERT(model_logprobs(a, sa, ids, T, 0, la) == 0 && model_logprobs(b, sb, ids, T, 0, lb) == 0);
        for (int t = 0; t + 1 < T; t++) worst = fmax(worst, fabs(la[t] - lb[t]));
        free(ids);
        free(la);
        free(lb);
    }
    model_state_free(sa);
    model_state_free(sb);
    return worst;
}

static const json_t *find_golden(const json_t *models, const char *name) {
    for (size_t i = 0; i < json_array_size(models); i++)
        if (strcmp(json_string_value(json_object_get(json_array_get(models, i), "name")), name) == 0)
            return json_array_get(models, i);
    return NULL;
}

/* Save F32 -> load -> identical; save BF16 -> load -> = transformers' bf16 checkpoint goldens. */
static void check_round_trip(Model *m, const json_t *models, const char *name, const char *tmp) {
    char err[ERR_LEN], dir[512], label[128];
    const json_t *entry = find_golden(models, name);
    const char *keep = getenv("COLT_MODEL_SAVE_DIR");
    snprintf(dir, sizeof(dir), "%s/%s-saved-f32", keep ? keep : tmp, name);
    int rc = model_save(m, dir, DTYPE_F32, err);
    CHECK(rc == 0, "model_save F32: %s", err);
    Model *m2 = NULL;
    if (rc == 0) rc = model_load(&m2, dir, backend_cpu(), err);
    CHECK(rc == 0, "model_load of saved F32: %s", err);
    if (rc == 0) {
        snprintf(label, sizeof(label), "%s saved F32", name);
        double d1 = check_logprobs(m2, entry, label), d = models_max_diff(m, m2, entry);
        printf("  %-28s round trip F32: max |logprob diff| original vs reloaded = %.3g\n", name, d);
        CHECK(d == 0.0 && d1 < 1e-4, "F32 round trip changed log-probs by %.3g", d);
        model_free(m2);
    }
    /* BF16: the f32 checkpoint saved as bf16 must match transformers' own bf16 checkpoint. */
    char bf16_name[128];
    snprintf(bf16_name, sizeof(bf16_name), "%.*s-bf16", (int)(strlen(name) - 4), name);
    const json_t *bf16_entry = find_golden(models, bf16_name);
    if (!bf16_entry || strstr(name, "-f32") == NULL) return;
    snprintf(dir, sizeof(dir), "%s/%s-saved-bf16", keep ? keep : tmp, name);
    rc = model_save(m, dir, DTYPE_BF16, err);
    CHECK(rc == 0, "model_save BF16: %s", err);
    if (rc == 0) rc = model_load(&m2, dir, backend_cpu(), err);
    CHECK(rc == 0, "model_load of saved BF16: %s", err);
    if (rc == 0) {
        snprintf(label, sizeof(label), "%s saved BF16", name);
        double d = check_logprobs(m2, bf16_entry, label);
        CHECK(d < 1e-4, "BF16 round trip vs %s goldens: %.3g", bf16_name, d);
        model_free(m2);
    }
}

static void check_random_init(const ModelConfig *cfg, const char *tmp) {
    char err[ERR_LEN], dir[512];
    Model *a = NULL, *b = NULL;
    int rc = model_create_random(&a, cfg, 42, backend_cpu(), err);
    CHECK(rc == 0, "model_create_random: %s", err);
    if (rc != 0) return;
    snprintf(dir, sizeof(dir), "%s/random", tmp);
    rc = model_save(a, dir, DTYPE_F32, err);
    CHECK(rc == 0, "save random: %s", err);
    if (rc == 0) rc = model_load(&b, dir, backend_cpu(), err);
    CHECK(rc == 0, "load random: %s", err);
    if (rc == 0) {
        int ids[12] = {1, 5, 9, 200, 3, 17, 44, 100, 7, 8, 250, 2};
        ModelState *st;
        COLT_ASSERT(model_state_create(&st, a, 1, 16, 12, err) == 0);
        double lpa[12], lpb[12], worst = 0.0, mean = 0.0;
        COLT_ASSERT(model_logprobs(a, st, ids, 12, 0, lpa) == 0 && model_logprobs(b, st, ids, 12, 0, lpb) == 0);
        for (int t = 0; t < 11; t++) worst = fmax(worst, fabs(lpa[t] - lpb[t])), mean += lpa[t] / 11;
        /* Random init near zero: log-probs close to uniform -log(V). */
        printf("  random init: save+load max |diff| = %.3g, mean logprob %.4f (uniform %.4f)\n", worst, mean,
               -log((double)cfg->vocab_size));
        CHECK(worst == 0.0, "random init round trip differs by %.3g", worst);
        CHECK(fabs(mean + log((double)cfg->vocab_size)) < 0.1, "random init log-probs far from uniform");
        model_state_free(st);
        model_free(b);
    }
    model_free(a);

    /* Sharded as transformers shards (a 20 kB limit here): index + shards, the same weights reloaded; saving
     * one file over it again removes the shards and the index. */
    char dir3[512];
    snprintf(dir3, sizeof(dir3), "%s/random_sharded", tmp);
    Model *c = NULL;
    COLT_ASSERT(model_create_random(&a, cfg, 42, backend_cpu(), err) == 0);
    rc = model_save_sharded(a, dir3, DTYPE_F32, 20000, err);
    CHECK(rc == 0, "model_save_sharded: %s", err);
    char *index = path_join(dir3, "model.safetensors.index.json"), *single = path_join(dir3, "model.safetensors");
    json_t *idx = json_load_file(index, 0, NULL);
    size_t n_map = json_object_size(json_object_get(idx, "weight_map"));
    json_int_t total = json_integer_value(json_object_get(json_object_get(idx, "metadata"), "total_size"));
    if (rc == 0) rc = model_load(&c, dir3, backend_cpu(), err);
    CHECK(rc == 0 && n_map > 0 && !file_exists(single), "sharded save: load %d (%s), %zu map entries", rc, err, n_map);
    if (rc == 0) {
        size_t na = 0, nc = 0;
        const float *wa = model_params_flat(a, &na), *wc = model_params_flat(c, &nc);
        bool same = na == nc && memcmp(wa, wc, na * sizeof(float)) == 0;
        printf("  sharded save (20 kB shards): %zu tensors mapped, total_size %lld bytes, reloaded identical: %s\n",
               n_map, (long long)total, same ? "yes" : "NO");
        CHECK(same, "sharded save changed the weights");
        model_free(c);
    }
    json_decref(idx);
    rc = model_save(a, dir3, DTYPE_F32, err);
    CHECK(rc == 0 && file_exists(single) && !file_exists(index), "single save over shards: rc %d, index left %d", rc,
          file_exists(index));
    free(index), free(single);
    model_free(a);

    /* The streaming writer (colt init) writes the same bytes as create + save. */
    char dir2[512];
    snprintf(dir2, sizeof(dir2), "%s/random_streamed", tmp);
    rc = model_save_random(cfg, 42, dir2, DTYPE_F32, err);
    CHECK(rc == 0, "model_save_random: %s", err);
    if (rc == 0) {
        char *p1 = path_join(dir, "model.safetensors"), *p2 = path_join(dir2, "model.safetensors");
        char *d1 = NULL, *d2 = NULL;
        size_t n1 = 0, n2 = 0;
        COLT_ASSERT(file_read_all(p1, &d1, &n1, err) == 0 && file_read_all(p2, &d2, &n2, err) == 0);
        bool same = n1 == n2 && memcmp(d1, d2, n1) == 0;
        printf("  streamed random init (model_save_random): %zu bytes, identical to create+save: %s\n", n2,
               same ? "yes" : "NO");
        CHECK(same, "model_save_random differs from model_create_random + model_save");
        free(d1), free(d2), free(p1), free(p2);
    }
}

static void check_forward_errors(Model *m) {
    char err[ERR_LEN] = "";
    ModelState *st;
    COLT_ASSERT(model_state_create(&st, m, 2, 8, 4, err) == 0);
    float logits[4 * 512];
    int tok = 600, slot = 0, pos = 0, V = model_config(m)->vocab_size;
    tok = V + 344;
    int rc = model_forward(m, st, &tok, &slot, &pos, 1, NULL, logits, err);
    CHECK(rc != 0 && strstr(err, "out of range (vocab"), "bad token id: %s", err);
    printf("  error: %s\n", err);
    tok = 1, pos = 8;
    rc = model_forward(m, st, &tok, &slot, &pos, 1, NULL, logits, err);
    CHECK(rc != 0 && strstr(err, "position 8"), "bad pos: %s", err);
    printf("  error: %s\n", err);
    pos = 0, slot = 2;
    rc = model_forward(m, st, &tok, &slot, &pos, 1, NULL, logits, err);
    CHECK(rc != 0 && strstr(err, "slot 2"), "bad slot: %s", err);
    printf("  error: %s\n", err);
    int ids[5] = {1, 1, 1, 1, 1}, sl[5] = {0}, ps[5] = {0, 1, 2, 3, 4};
    rc = model_forward(m, st, ids, sl, ps, 5, NULL, logits, err);
    CHECK(rc != 0 && strstr(err, "at most 4"), "too many tokens: %s", err);
    printf("  error: %s\n", err);
    model_state_free(st);
}

int main(void) {
    char err[ERR_LEN];
    char *text = NULL;
    size_t len;
    const char *golden_path = COLT_SOURCE_DIR "/tests/data/models/goldens.json";
    if (file_read_all(golden_path, &text, &len, err) != 0) {
        printf("FAIL: %s\n", err);
        return 1;
    }
    json_t *root = json_loadb(text, len, 0, NULL);
    free(text);
    COLT_ASSERT(root);
    const json_t *models = json_object_get(root, "models");
    char tmp[] = "/tmp/colt_test_model_XXXXXX";
    COLT_ASSERT(mkdtemp(tmp));
    int n_checked = 0, n_skipped = 0;
    const bool have_shared = shared_data_present();
    for (size_t i = 0; i < json_array_size(models); i++) {
        const json_t *e = json_array_get(models, i);
        const char *name = json_string_value(json_object_get(e, "name"));
        char dir[1024];
        if (json_object_get(e, "shared_dir") && !have_shared) {
            char what[256];
            snprintf(what, sizeof what, "%s (%s) against transformers", name,
                     json_string_value(json_object_get(e, "shared_dir")));
            shared_data_skipped(what);
            n_skipped++;
            continue;
        }
        if (json_object_get(e, "shared_dir"))
            snprintf(dir, sizeof(dir), "%s/%s", COLT_SHARED_DATA, json_string_value(json_object_get(e, "shared_dir")));
        else
            snprintf(dir, sizeof(dir), "%s/%s", COLT_SOURCE_DIR, json_string_value(json_object_get(e, "dir")));
        printf("%s (%s)\n", name, dir);
        Model *m = NULL;
        if (model_load(&m, dir, backend_cpu(), err) != 0) {
            CHECK(0, "model_load %s: %s", name, err);
            continue;
        }
        double d = check_logprobs(m, e, name);
        CHECK(d < 1e-4, "%s: log-probs differ from transformers by %.3g (tolerance 1e-4)", name, d);
        check_greedy(m, e, name);
        check_batched(m, e, name);
        check_round_trip(m, models, name, tmp);
        if (i == 0) {
            check_forward_errors(m);
            check_random_init(model_config(m), tmp);
        }
        model_free(m);
        n_checked++;
    }
    json_decref(root);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", tmp);
    if (system(cmd) != 0) printf("warning: could not remove %s\n", tmp);
    CHECK(n_checked + n_skipped >= 5 && n_checked >= 4, "only %d checkpoints checked", n_checked);
    printf("%s: %d checkpoints, %d failures\n", g_failures ? "FAILED" : "OK", n_checked, g_failures);
    return g_failures ? 1 : 0;
}
