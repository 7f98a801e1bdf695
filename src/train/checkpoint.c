/* checkpoint.c — see checkpoint.h. */
#include "train/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <xxhash.h>

#include "core/error.h"
#include "core/fileio.h"
#include "core/log.h"

/* Counters far beyond any real run (2^40 steps) but far inside int64 arithmetic. */
#define COUNTER_MAX ((int64_t)1 << 40)

/* ---------------------------------------------------------------- fingerprints */

#define FNV_OFFSET 0xcbf29ce484222325ull
#define FNV_PRIME 0x100000001b3ull

static void fnv_bytes(uint64_t *h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) *h = (*h ^ p[i]) * FNV_PRIME;
}

static void fnv_u64(uint64_t *h, uint64_t v) {
    unsigned char b[8];
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)(v >> (8 * i));
    fnv_bytes(h, b, 8);
}

static void fingerprint_format(Fingerprint out, uint64_t h) { snprintf(out, sizeof(Fingerprint), "%016llx", (unsigned long long)h); }

/* Adds a whole file (its name's length and bytes) to the hash. */
static int hash_whole_file(uint64_t *h, const char *path, char *err) {
    char *data = NULL;
    size_t len = 0;
    if (file_read_all(path, &data, &len, err) != 0) return COLT_ERR;
    fnv_u64(h, len);
    fnv_bytes(h, data, len);
    free(data);
    return COLT_OK;
}

/* Adds a weights file: its size, its first 1 MB (length, header, first
 * tensors) and 32 samples of 16 KB spread over the rest. */
static int hash_weights_file(uint64_t *h, const char *path, char *err) {
    size_t file_size = 0;
    int fd = file_open_regular(path, &file_size, err);
    if (fd < 0) return COLT_ERR;
    uint64_t size = file_size;
    fnv_u64(h, size);
    enum { HEAD = 1 << 20, SAMPLE = 16 << 10, N_SAMPLES = 32 };
    char *buf = xmalloc(HEAD);
    int rc = COLT_OK;
    for (int s = -1; s < N_SAMPLES && rc == 0; s++) {
        uint64_t off = s < 0 ? 0 : HEAD + (size > HEAD + SAMPLE ? (size - HEAD - SAMPLE) / (N_SAMPLES - 1) * (uint64_t)s : 0);
        size_t want = s < 0 ? HEAD : SAMPLE;
        if (off >= size) break;
        if (want > size - off) want = (size_t)(size - off);
        ssize_t got = pread(fd, buf, want, (off_t)off);
        if (got != (ssize_t)want) rc = errorf(err, "%s: read failed: %s", path, got < 0 ? strerror(errno) : "short read");
        else fnv_bytes(h, buf, want);
    }
    free(buf);
    close(fd);
    return rc;
}

static int compare_strings(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int fingerprint_model_dir(Fingerprint out, const char *dir, char *err) {
    uint64_t h = FNV_OFFSET;
    char *config = path_join(dir, "config.json"), *index = path_join(dir, "model.safetensors.index.json");
    int rc = hash_whole_file(&h, config, err);
    char **files = NULL;
    size_t n_files = 0;
    if (rc == 0 && file_exists(index)) {
        /* Sharded: the index itself, then each shard it names, in name order. */
        char *text = NULL;
        size_t len = 0;
        rc = file_read_all(index, &text, &len, err);
        json_t *o = NULL;
        if (rc == 0) {
            fnv_u64(&h, len);
            fnv_bytes(&h, text, len);
            o = json_loadb(text, len, 0, NULL);
        }
        free(text);
        json_t *map = json_object_get(o, "weight_map");
        if (rc == 0 && !json_is_object(map)) rc = errorf(err, "%s: no weight_map object", index);
        const char *key;
        json_t *v;
        if (rc == 0) files = xcalloc(json_object_size(map) + 1, sizeof(char *));
        if (rc == 0) json_object_foreach(map, key, v) {
            const char *f = json_string_value(v);
            bool seen = false;
            for (size_t i = 0; i < n_files && f; i++) seen |= strcmp(files[i], f) == 0;
            if (f && !seen) files[n_files++] = xstrdup(f);
        }
        json_decref(o);
        if (n_files) qsort(files, n_files, sizeof(char *), compare_strings);
    } else if (rc == 0) {
        files = xcalloc(1, sizeof(char *));
        files[n_files++] = xstrdup("model.safetensors");
    }
    for (size_t i = 0; i < n_files && rc == 0; i++) {
        char *p = path_join(dir, files[i]);
        fnv_bytes(&h, files[i], strlen(files[i]) + 1);
        rc = hash_weights_file(&h, p, err);
        free(p);
    }
    for (size_t i = 0; i < n_files; i++) free(files[i]);
    free(files), free(config), free(index);
    if (rc == 0) fingerprint_format(out, h);
    return rc;
}

int fingerprint_tokenizer_dir(Fingerprint out, const char *dir, char *err) {
    static const char *NAMES[] = {"tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                                  "added_tokens.json", "vocab.json", "merges.txt", "chat_template.jinja"};
    uint64_t h = FNV_OFFSET;
    for (size_t i = 0; i < sizeof NAMES / sizeof NAMES[0]; i++) {
        char *p = path_join(dir, NAMES[i]);
        int rc = COLT_OK;
        if (file_exists(p)) {
            fnv_bytes(&h, NAMES[i], strlen(NAMES[i]) + 1);
            rc = hash_whole_file(&h, p, err);
        }
        free(p);
        if (rc != 0) return COLT_ERR;
    }
    fingerprint_format(out, h);
    return COLT_OK;
}

int fingerprint_file(Fingerprint out, const char *path, char *err) {
    uint64_t h = FNV_OFFSET;
    if (hash_whole_file(&h, path, err) != 0) return COLT_ERR;
    fingerprint_format(out, h);
    return COLT_OK;
}

/* ---------------------------------------------------------------- the resume record */

/* The settings a saved state depends on: the rollout's shape and the way it
 * was generated, scored and shuffled. Others (learning rate, max_steps,
 * logging, the loss's clipping, ...) may change between runs, as in TRL. */
static const char *RECORD_SETTINGS[] = {
    "num_generations", "generation_batch_size", "samples_per_step", "num_iterations", "max_completion_length",
    "max_prompt_length", "seed", "temperature", "top_p", "top_k", "min_p", "repetition_penalty", "beta",
    "scale_rewards", "multi_objective_aggregation", "mask_truncated_completions", "reward_funcs", "reward_weights", "shuffle_dataset",
    "sync_ref_model", "ref_model_mixup_alpha", "ref_model_sync_steps", "environment_factory",
    "rollout_func",
};
/* json_equal ignores the order of an object's keys; a dict of environments'
 * order is its reward columns' (the saved round's per_func). */
static bool same_key_order(const json_t *a, const json_t *b) {
    if (!json_is_object(a)) return true;
    void *ia = json_object_iter((json_t *)a), *ib = json_object_iter((json_t *)b);
    for (; ia && ib; ia = json_object_iter_next((json_t *)a, ia), ib = json_object_iter_next((json_t *)b, ib))
        if (strcmp(json_object_iter_key(ia), json_object_iter_key(ib)) != 0) return false;
    return !ia && !ib;
}

/* Derived entries, and how a message names them. The world size itself may
 * change: what the saved state depends on is how many samples a step takes. */
static const char *setting_title(const char *key) {
    if (strcmp(key, "samples_per_step") == 0)
        return "samples per optimizer step (per_device_train_batch_size x processes x gradient_accumulation_steps)";
    return key;
}
#define N_RECORD_SETTINGS (sizeof RECORD_SETTINGS / sizeof RECORD_SETTINGS[0])

int checkpoint_resume_record(json_t **out, const TrainConfig *c, char *err) {
    *out = NULL;
    Fingerprint model_fp, tokenizer_fp, data_fp;
    if (fingerprint_model_dir(model_fp, c->model, err) != 0 || fingerprint_tokenizer_dir(tokenizer_fp, c->model, err) != 0 ||
        fingerprint_file(data_fp, c->dataset, err) != 0)
        return COLT_ERR;
    json_t *all = train_config_to_json(c), *settings = json_object();
    json_object_set_new(all, "samples_per_step",
                        json_integer((json_int_t)c->per_device_train_batch_size * c->world_size *
                                     c->gradient_accumulation_steps));
    for (size_t i = 0; i < N_RECORD_SETTINGS; i++) {
        json_t *v = json_object_get(all, RECORD_SETTINGS[i]);
        json_object_set(settings, RECORD_SETTINGS[i], v ? v : json_null());
    }
    json_decref(all);
    *out = json_pack("{s:{s:s,s:s},s:s,s:{s:s,s:s},s:o}", "model", "path", c->model, "fingerprint", model_fp,
                     "tokenizer", tokenizer_fp, "dataset", "path", c->dataset, "fingerprint", data_fp, "settings",
                     settings);
    COLT_ASSERT(*out);
    return COLT_OK;
}

/* A JSON value for a message, cut to a readable length. */
static void value_text(char *buf, size_t size, const json_t *v) {
    char *s = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
    snprintf(buf, size, "%s", s ? s : "(not recorded)");
    if (s && strlen(s) >= size && size > 4) memcpy(buf + size - 4, "...", 4);
    free(s);
}

static int check_fingerprint(const json_t *saved, const json_t *current, const char *what, const char *setting,
                             const char *ckpt, char *err) {
    const json_t *a = json_object_get(saved, what), *b = json_object_get(current, what);
    const char *fa = json_is_string(a) ? json_string_value(a) : json_string_value(json_object_get(a, "fingerprint"));
    const char *fb = json_is_string(b) ? json_string_value(b) : json_string_value(json_object_get(b, "fingerprint"));
    if (fa && fb && strcmp(fa, fb) == 0) return COLT_OK;
    const char *pa = json_string_value(json_object_get(a, "path")), *pb = json_string_value(json_object_get(b, "path"));
    if (pa && pb)
        return errorf(err, "resume from %s: the %s differs: the checkpoint's run used %s (fingerprint %s), this run %s "
                           "(fingerprint %s); resume with the same %s, or start a new run with --model %s",
                      ckpt, what, pa, fa ? fa : "none", pb, fb ? fb : "none", setting, ckpt);
    return errorf(err, "resume from %s: the %s differs from the checkpoint's run (fingerprint %s there, %s here); "
                       "resume with the same %s, or start a new run with --model %s",
                  ckpt, what, fa ? fa : "none", fb ? fb : "none", setting, ckpt);
}

int checkpoint_check_resume_record(const json_t *saved, const json_t *current, const char *ckpt, char *err) {
    if (!json_is_object(saved) || !json_is_object(json_object_get(saved, "settings")))
        return errorf(err, "resume from %s: trainer_state.json has no resume record (written by an older colt?); "
                           "start a new run with --model %s",
                      ckpt, ckpt);
    if (check_fingerprint(saved, current, "model", "--model", ckpt, err) != 0 ||
        check_fingerprint(saved, current, "tokenizer", "--model", ckpt, err) != 0 ||
        check_fingerprint(saved, current, "dataset", "--dataset", ckpt, err) != 0)
        return COLT_ERR;
    const json_t *sa = json_object_get(saved, "settings"), *sb = json_object_get(current, "settings");
    for (size_t i = 0; i < N_RECORD_SETTINGS; i++) {
        const json_t *a = json_object_get(sa, RECORD_SETTINGS[i]), *b = json_object_get(sb, RECORD_SETTINGS[i]);
        if (a && b && json_equal((json_t *)a, (json_t *)b) && same_key_order(a, b)) continue;
        /* recorded since shuffle_dataset became a setting: older runs always shuffled */
        if (!a && !strcmp(RECORD_SETTINGS[i], "shuffle_dataset") && json_is_true(b)) continue;
        /* recorded since sync_ref_model became a setting (older runs never synced); the mix's settings
         * matter only while it is on */
        bool syncs = json_is_true(json_object_get(sb, "sync_ref_model"));
        if (!strcmp(RECORD_SETTINGS[i], "sync_ref_model") && !a && !syncs) continue;
        if (!strncmp(RECORD_SETTINGS[i], "ref_model_", 10) && !syncs) continue;
        /* recorded since environments (a round's prompts and rewards come from them); older runs had none */
        if (!a && !strcmp(RECORD_SETTINGS[i], "environment_factory") && json_is_null(b)) continue;
        if (!a && !strcmp(RECORD_SETTINGS[i], "rollout_func") && json_is_null(b)) continue; /* recorded since it came */
        /* recorded since normalize_then_sum came; older runs summed, then normalised */
        if (!a && !strcmp(RECORD_SETTINGS[i], "multi_objective_aggregation") && json_is_string(b) &&
            !strcmp(json_string_value(b), "sum_then_normalize"))
            continue;
        char va[160], vb[160];
        value_text(va, sizeof va, a);
        value_text(vb, sizeof vb, b);
        return errorf(err, "resume from %s: %s was %s there, %s here; the saved state depends on it: resume with the "
                           "same, or start a new run with --model %s",
                      ckpt, setting_title(RECORD_SETTINGS[i]), va, vb, ckpt);
    }
    return COLT_OK;
}

/* ---------------------------------------------------------------- trainer_state.json */

json_t *checkpoint_state_json(const TrainerProgress *p, const Metrics *m, const Rollout *in_round,
                              int micro_batch_samples, const GrpoSamplingMetrics *sm, const json_t *resume_record) {
    json_t *o = json_object();
    json_object_set_new(o, "global_step", json_integer(p->global_step));
    json_object_set_new(o, "round", json_integer(p->round));
    json_object_set_new(o, "epoch", json_integer((json_int_t)p->epoch));
    json_object_set_new(o, "epoch_pos", json_integer((json_int_t)p->epoch_pos));
    json_object_set_new(o, "num_tokens", json_integer(p->num_tokens));
    json_object_set_new(o, "metrics", metrics_to_json(m));
    /* in_round says a rollout must be there: a state whose rollout was deleted is refused, not replayed */
    json_object_set_new(o, "in_round", json_boolean(in_round != NULL));
    json_object_set_new(o, "rollout", in_round ? rollout_to_json(in_round, micro_batch_samples) : json_null());
    if (in_round) /* the round's sampling metrics so far, logged at its first pass's end */
        json_object_set_new(o, "round_sampling",
                            json_pack("{s:f,s:f,s:f,s:I,s:f,s:f,s:f,s:f,s:I}", "logp_difference_mean",
                                      sm->logp_difference_mean, "logp_difference_max", sm->logp_difference_max,
                                      "logp_difference_sum", sm->logp_difference_sum, "logp_difference_count",
                                      (json_int_t)sm->logp_difference_count, "is_ratio_min", sm->is_ratio_min,
                                      "is_ratio_mean", sm->is_ratio_mean, "is_ratio_max", sm->is_ratio_max,
                                      "is_ratio_sum", sm->is_ratio_sum, "is_ratio_count",
                                      (json_int_t)sm->is_ratio_count));
    json_object_set(o, "resume_record", (json_t *)resume_record);
    return o;
}

/* XXH64 of a state's content but "files" and "state_xxh64", as compact JSON
 * with sorted keys: the same for the state saved and the state read back
 * (numbers print as they parse), whatever the file's layout. */
static void state_digest(char hex[17], const json_t *state) {
    json_t *c = json_copy((json_t *)state);
    json_object_del(c, "files");
    json_object_del(c, "state_xxh64");
    char *text = json_dumps(c, JSON_COMPACT | JSON_SORT_KEYS);
    COLT_ASSERT(text);
    snprintf(hex, 17, "%016llx", (unsigned long long)XXH64(text, strlen(text), 0));
    free(text);
    json_decref(c);
}

static int state_int(int64_t *out, json_t *o, const char *key, int64_t lo, int64_t hi, const char *name, char *err) {
    json_t *v = json_object_get(o, key);
    if (!json_is_integer(v)) return errorf(err, "%s: %s must be an integer", name, key);
    json_int_t x = json_integer_value(v);
    if (x < lo || x > hi)
        return errorf(err, "%s: %s is %lld, outside %lld .. %lld", name, key, (long long)x, (long long)lo, (long long)hi);
    *out = x;
    return COLT_OK;
}

static int state_number(double *out, json_t *o, const char *key, const char *name, char *err) {
    json_t *v = json_object_get(o, key);
    if (!json_is_number(v) || !isfinite(json_number_value(v)))
        return errorf(err, "%s: round_sampling %s must be a finite number", name, key);
    *out = json_number_value(v);
    return COLT_OK;
}

static int parse_round_sampling(GrpoSamplingMetrics *r, json_t *sm, const char *name, char *err) {
    int64_t n1 = 0, n2 = 0;
    if (!json_is_object(sm)) return errorf(err, "%s: round_sampling must be an object", name);
    if (state_number(&r->logp_difference_mean, sm, "logp_difference_mean", name, err) != 0 ||
        state_number(&r->logp_difference_max, sm, "logp_difference_max", name, err) != 0 ||
        state_number(&r->logp_difference_sum, sm, "logp_difference_sum", name, err) != 0 ||
        state_number(&r->is_ratio_min, sm, "is_ratio_min", name, err) != 0 ||
        state_number(&r->is_ratio_mean, sm, "is_ratio_mean", name, err) != 0 ||
        state_number(&r->is_ratio_max, sm, "is_ratio_max", name, err) != 0 ||
        state_number(&r->is_ratio_sum, sm, "is_ratio_sum", name, err) != 0 ||
        state_int(&n1, sm, "logp_difference_count", 0, COUNTER_MAX, name, err) != 0 ||
        state_int(&n2, sm, "is_ratio_count", 0, COUNTER_MAX, name, err) != 0)
        return COLT_ERR;
    r->logp_difference_count = n1;
    r->is_ratio_count = n2;
    return COLT_OK;
}

static int parse_state(CheckpointState *st, json_t *o, const StateLimits *lim, const char *name, char *err) {
    if (!json_is_object(o)) return errorf(err, "%s: must hold a JSON object", name);
    json_t *record = json_object_get(o, "resume_record");
    if (!json_is_object(record))
        return errorf(err, "%s: no resume record (written by an older colt?); start a new run with --model set to the "
                           "checkpoint folder",
                      name);
    if (lim->resume_record &&
        checkpoint_check_resume_record(record, lim->resume_record, lim->checkpoint ? lim->checkpoint : name, err) != 0)
        return COLT_ERR;
    st->resume_record = json_incref(record);
    TrainerProgress *p = &st->progress;
    int64_t v;
    const int64_t rows = (int64_t)lim->rollout.dataset_rows;
    if (state_int(&p->global_step, o, "global_step", 0, COUNTER_MAX, name, err) != 0 ||
        state_int(&p->round, o, "round", 0, COUNTER_MAX, name, err) != 0 ||
        state_int(&v, o, "epoch", 0, COUNTER_MAX, name, err) != 0)
        return COLT_ERR;
    p->epoch = (uint64_t)v;
    if (state_int(&v, o, "epoch_pos", 0, rows, name, err) != 0) return COLT_ERR;
    p->epoch_pos = (size_t)v;
    if (p->epoch == 0 && p->epoch_pos != (size_t)rows)
        return errorf(err, "%s: epoch_pos is %zu before the first epoch (must be the dataset's %lld rows)", name,
                      p->epoch_pos, (long long)rows);
    if (state_int(&p->num_tokens, o, "num_tokens", 0, INT64_MAX / 4, name, err) != 0) return COLT_ERR;
    if (p->global_step > lim->total_steps)
        return errorf(err, "%s: the checkpoint is at step %lld, past this run's %lld steps: raise max_steps (or "
                           "num_train_epochs) to train further",
                      name, (long long)p->global_step, (long long)lim->total_steps);
    if (metrics_from_json(&st->metrics, json_object_get(o, "metrics"), name, err) != 0) return COLT_ERR;
    if (rollout_from_json(&st->rollout, json_object_get(o, "rollout"), &lim->rollout, name, err) != 0) return COLT_ERR;
    json_t *in_round = json_object_get(o, "in_round"); /* absent in an older colt's state */
    if (in_round && !json_is_boolean(in_round)) return errorf(err, "%s: in_round must be true or false", name);
    if (json_is_true(in_round) && !st->rollout.samples)
        return errorf(err, "%s: the checkpoint falls inside round %lld (in_round is true) but its 'rollout' (the "
                           "round's samples) is missing; resume from another checkpoint",
                      name, (long long)(p->round - 1));
    if (json_is_false(in_round) && st->rollout.samples)
        return errorf(err, "%s: a 'rollout' is there but in_round is false; resume from another checkpoint", name);
    if (st->rollout.samples) {
        if (st->rollout.round != p->round - 1)
            return errorf(err, "%s: the rollout is of round %lld, but round %lld was the last one started", name,
                          (long long)st->rollout.round, (long long)(p->round - 1));
        if (parse_round_sampling(&st->round_sampling, json_object_get(o, "round_sampling"), name, err) != 0)
            return COLT_ERR;
    }
    /* Last, so an edit that breaks a field is named as such. An older colt wrote neither "files" nor this. */
    const char *sealed = json_string_value(json_object_get(o, "state_xxh64"));
    char hex[17];
    if (json_object_get(o, "files") && !sealed)
        return errorf(err, "%s: 'state_xxh64' is missing (the state was edited after it was saved); resume from "
                           "another checkpoint",
                      name);
    if (sealed && (state_digest(hex, o), strcmp(hex, sealed) != 0))
        return errorf(err, "%s: the state was changed after it was saved (xxh64 %s, recorded state_xxh64 %s); "
                           "resume from another checkpoint",
                      name, hex, sealed);
    return COLT_OK;
}

int checkpoint_state_parse(CheckpointState *st, const char *text, size_t len, const StateLimits *lim,
                           const char *name, char *err) {
    memset(st, 0, sizeof *st);
    json_error_t jerr;
    json_t *o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!o) return errorf(err, "%s: not valid JSON: %s (line %d)", name, jerr.text, jerr.line);
    int rc = parse_state(st, o, lim, name, err);
    json_decref(o);
    if (rc != 0) checkpoint_state_free(st);
    return rc;
}

void checkpoint_state_free(CheckpointState *st) {
    rollout_free(&st->rollout);
    json_decref(st->resume_record);
    memset(st, 0, sizeof *st);
}

/* ---------------------------------------------------------------- folders */

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

void remove_tree(const char *path) { nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS); }

/* "checkpoint-N" exactly (no suffix); N >= 0. */
static bool checkpoint_step_of(const char *name, int64_t *step) {
    if (strncmp(name, "checkpoint-", 11) != 0) return false;
    const char *s = name + 11;
    if (*s < '0' || *s > '9') return false;
    char *end = NULL;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno != 0 || *end != '\0') return false;
    *step = v;
    return true;
}

void checkpoint_keeper_init(CheckpointKeeper *k, const char *output_dir, int limit, const char *resume_dir,
                            int64_t resume_step) {
    memset(k, 0, sizeof *k);
    k->output_dir = xstrdup(output_dir);
    k->limit = limit;
    k->resume_step = resume_dir ? resume_step : -1;
    k->resume_real_path = resume_dir ? realpath(resume_dir, NULL) : NULL;
}

void checkpoint_keeper_free(CheckpointKeeper *k) {
    free(k->output_dir);
    free(k->resume_real_path);
    free(k->written);
    memset(k, 0, sizeof *k);
}

static bool keeper_wrote(const CheckpointKeeper *k, int64_t step) {
    for (int i = 0; i < k->n_written; i++)
        if (k->written[i] == step) return true;
    return false;
}

typedef struct Found {
    int64_t step;
    bool is_source, deletable;
} Found;

static int compare_found_newest_first(const void *a, const void *b) {
    int64_t x = ((const Found *)a)->step, y = ((const Found *)b)->step;
    return x < y ? 1 : x > y ? -1 : 0;
}

void checkpoint_keeper_saved(CheckpointKeeper *k, int64_t step) {
    if (!keeper_wrote(k, step)) {
        if (k->n_written == k->cap_written) {
            k->cap_written = k->cap_written ? 2 * k->cap_written : 16;
            k->written = xrealloc(k->written, sizeof(int64_t) * (size_t)k->cap_written);
        }
        k->written[k->n_written++] = step;
    }
    if (k->limit <= 0) return;
    DIR *d = opendir(k->output_dir);
    if (!d) return;
    Found *found = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        int64_t s;
        if (!checkpoint_step_of(e->d_name, &s)) continue;
        char *path = path_join(k->output_dir, e->d_name), *real = realpath(path, NULL);
        bool is_source = real && k->resume_real_path && strcmp(real, k->resume_real_path) == 0;
        free(path), free(real);
        bool mine = keeper_wrote(k, s), older_history = k->resume_step >= 0 && s < k->resume_step;
        if (!mine && !older_history && !is_source) continue; /* not this run's to count or delete */
        if (n == cap) cap = cap ? 2 * cap : 32, found = xrealloc(found, sizeof(Found) * cap);
        found[n++] = (Found){.step = s, .is_source = is_source, .deletable = !is_source};
    }
    closedir(d);
    /* Keep the newest `limit`, and the resume source whatever its age. */
    qsort(found, n, sizeof(Found), compare_found_newest_first);
    for (size_t i = (size_t)k->limit; i < n; i++) {
        if (!found[i].deletable) continue;
        char name[64];
        snprintf(name, sizeof name, "checkpoint-%lld", (long long)found[i].step);
        char *path = path_join(k->output_dir, name), doomed_name[96];
        /* renamed first, so a kill mid-delete leaves no half checkpoint under its name, only a temporary */
        snprintf(doomed_name, sizeof doomed_name, "%s.pruned.tmp.%ld", name, (long)getpid());
        char *doomed = path_join(k->output_dir, doomed_name);
        if (rename(path, doomed) == 0) remove_tree(doomed);
        else remove_tree(path);
        if (file_exists(path) || file_exists(doomed)) log_error("save_total_limit: could not delete %s", path);
        free(path), free(doomed);
    }
    free(found);
}

/* ---------------------------------------------------------------- the file manifest */

#define STATE_FILE "trainer_state.json"

/* A regular file's size and XXH64, read in 4 MB chunks. */
static int hash_file(const char *path, uint64_t *size, uint64_t *hash, char *err) {
    size_t file_size = 0;
    int fd = file_open_regular(path, &file_size, err);
    if (fd < 0) return COLT_ERR;
    enum { CHUNK = 4 << 20 };
    char *buf = xmalloc(CHUNK);
    XXH64_state_t *h = XXH64_createState();
    if (!h) colt_out_of_memory(64); /* the state is opaque; it is about that size */
    XXH64_reset(h, 0);
    uint64_t total = 0;
    int rc = COLT_OK;
    for (;;) {
        ssize_t got = read(fd, buf, CHUNK);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0) rc = errorf(err, "%s: read failed: %s", path, strerror(errno));
        if (got <= 0) break;
        XXH64_update(h, buf, (size_t)got);
        total += (uint64_t)got;
    }
    free(buf);
    close(fd);
    *size = total;
    *hash = XXH64_digest(h);
    XXH64_freeState(h);
    return rc;
}

/* The one subfolder a checkpoint's manifest covers: sync_ref_model's reference model. */
#define REF_MODEL_DIR "ref_model"

/* Appends the regular files of dir/sub (sub NULL: dir itself; its files named "sub/NAME") to names. */
static int list_regular_files(char ***names, size_t *n, size_t *cap, const char *dir, const char *sub, char *err) {
    char *folder = sub ? path_join(dir, sub) : xstrdup(dir);
    DIR *d = opendir(folder);
    if (!d) {
        int rc = errorf(err, "%s: cannot list the checkpoint's files: %s", folder, strerror(errno));
        free(folder);
        return rc;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.' || (!sub && strcmp(e->d_name, STATE_FILE) == 0)) continue;
        char *p = path_join(folder, e->d_name);
        struct stat st;
        bool regular = lstat(p, &st) == 0 && S_ISREG(st.st_mode);
        free(p);
        if (!regular) continue;
        if (*n == *cap) *cap = *cap ? 2 * *cap : 32, *names = xrealloc(*names, sizeof(char *) * *cap);
        (*names)[(*n)++] = sub ? path_join(sub, e->d_name) : xstrdup(e->d_name);
    }
    closedir(d);
    free(folder);
    return COLT_OK;
}

int checkpoint_files_manifest(json_t **out, const char *dir, char *err) {
    *out = NULL;
    char **names = NULL;
    size_t n = 0, cap = 0;
    char *ref = path_join(dir, REF_MODEL_DIR);
    struct stat st;
    bool has_ref = lstat(ref, &st) == 0 && S_ISDIR(st.st_mode);
    free(ref);
    if (list_regular_files(&names, &n, &cap, dir, NULL, err) != 0 ||
        (has_ref && list_regular_files(&names, &n, &cap, dir, REF_MODEL_DIR, err) != 0)) {
        for (size_t i = 0; i < n; i++) free(names[i]);
        free(names);
        return COLT_ERR;
    }
    if (n) qsort(names, n, sizeof(char *), compare_strings);
    json_t *files = json_object();
    int rc = COLT_OK;
    for (size_t i = 0; i < n && rc == 0; i++) {
        char *p = path_join(dir, names[i]), hex[17];
        uint64_t size = 0, hash = 0;
        rc = hash_file(p, &size, &hash, err);
        snprintf(hex, sizeof hex, "%016llx", (unsigned long long)hash);
        if (rc == 0)
            json_object_set_new(files, names[i], json_pack("{s:I,s:s}", "size", (json_int_t)size, "xxh64", hex));
        free(p);
    }
    for (size_t i = 0; i < n; i++) free(names[i]);
    free(names);
    if (rc != 0) json_decref(files);
    else *out = files;
    return rc;
}

int checkpoint_state_seal(json_t *state, const char *dir, char *err) {
    json_t *files = NULL;
    if (checkpoint_files_manifest(&files, dir, err) != 0) return COLT_ERR;
    char hex[17];
    state_digest(hex, state);
    json_object_set_new(state, "files", files);
    json_object_set_new(state, "state_xxh64", json_string(hex));
    return COLT_OK;
}

/* Checks ckpt's files against the manifest object files (who: the message's
 * start, "resume from DIR"). */
static int verify_manifest(const json_t *files, const char *ckpt, const char *who, char *err) {
    if (!json_is_object(files) || json_object_size(files) == 0)
        return errorf(err, "%s: trainer_state.json's 'files' must list the checkpoint's files", who);
    const char *name;
    json_t *v;
    json_object_foreach((json_t *)files, name, v) {
        json_t *js = json_object_get(v, "size");
        const char *want_hash = json_string_value(json_object_get(v, "xxh64"));
        /* a file name, or one in ref_model/ (nothing else may climb or descend) */
        const char *base = strncmp(name, REF_MODEL_DIR "/", sizeof REF_MODEL_DIR) == 0 ? name + sizeof REF_MODEL_DIR
                                                                                       : name;
        if (!base[0] || strchr(base, '/') || strcmp(base, "..") == 0 || strcmp(base, ".") == 0 ||
            !json_is_integer(js) || json_integer_value(js) < 0 || !want_hash || strlen(want_hash) != 16)
            return errorf(err, "%s: trainer_state.json's files entry '%s' must be a file name with a size and an "
                               "xxh64 of 16 hex digits",
                          who, name);
        uint64_t want_size = (uint64_t)json_integer_value(js), size = 0, hash = 0;
        char *p = path_join(ckpt, name), hex[17];
        struct stat st;
        int rc = COLT_OK;
        if (lstat(p, &st) != 0)
            rc = errorf(err, "%s: %s is missing (trainer_state.json lists it): the checkpoint is incomplete; resume "
                             "from another checkpoint",
                        who, name);
        else if (!S_ISREG(st.st_mode))
            rc = errorf(err, "%s: %s is not a regular file (trainer_state.json lists a file); resume from another "
                             "checkpoint",
                        who, name);
        else if ((uint64_t)st.st_size != want_size)
            rc = errorf(err, "%s: %s is %llu bytes but the checkpoint recorded %llu (truncated or replaced); resume "
                             "from another checkpoint",
                        who, name, (unsigned long long)st.st_size, (unsigned long long)want_size);
        else if ((rc = hash_file(p, &size, &hash, err)) == 0) {
            snprintf(hex, sizeof hex, "%016llx", (unsigned long long)hash);
            if (size != want_size || strcmp(hex, want_hash) != 0)
                rc = errorf(err, "%s: %s does not match the checkpoint's record (xxh64 %s, recorded %s): it was "
                                 "changed or copied in from another checkpoint; resume from another checkpoint",
                            who, name, hex, want_hash);
        }
        free(p);
        if (rc != 0) return rc;
    }
    return COLT_OK;
}

int checkpoint_verify_files(const char *ckpt, bool *has_manifest, char *err) {
    *has_manifest = false;
    char *path = path_join(ckpt, STATE_FILE), *text = NULL, who[PATH_MAX + 16];
    snprintf(who, sizeof who, "resume from %s", ckpt);
    size_t len = 0;
    int rc = file_read_all(path, &text, &len, err);
    json_t *o = NULL;
    if (rc == 0) {
        json_error_t jerr;
        o = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
        if (!o) rc = errorf(err, "%s: not valid JSON: %s (line %d)", path, jerr.text, jerr.line);
    }
    json_t *files = json_object_get(o, "files");
    if (rc == 0 && files) {
        *has_manifest = true;
        rc = verify_manifest(files, ckpt, who, err);
    }
    json_decref(o);
    free(text), free(path);
    return rc;
}

int checkpoint_saved_tensor_parallel_size(const char *ckpt) {
    DIR *d = opendir(ckpt);
    if (!d) return 0;
    int size = 0;
    struct dirent *e;
    while ((e = readdir(d)) && size == 0) {
        int part = 0, n = 0;
        if ((sscanf(e->d_name, "optimizer-tp%d-of-%d", &part, &n) == 2 ||
             sscanf(e->d_name, "optimizer_shards-tp%d-of-%d", &part, &n) == 2) &&
            n > 0)
            size = n;
    }
    closedir(d);
    return size;
}

/* ---------------------------------------------------------------- replacing a folder */

/* fsync of a folder: its entries (files renamed in or out) reach the disk. */
static void sync_folder(const char *path) {
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return;
    (void)fsync(fd); /* some file systems refuse a folder's fsync; the renames are still atomic */
    close(fd);
}

void checkpoint_sync_folder(const char *path) { sync_folder(path); }

/* Tests only: COLT_TEST_REPLACE_PAUSE_MS widens the moments between the steps
 * of a replacement so a kill -9 can land there. */
static void test_pause(void) {
    const char *ms = getenv("COLT_TEST_REPLACE_PAUSE_MS");
    long v = ms ? strtol(ms, NULL, 10) : 0;
    if (v <= 0 || v > 60000) return;
    struct timespec ts = {.tv_sec = v / 1000, .tv_nsec = (v % 1000) * 1000000L};
    nanosleep(&ts, NULL);
}

int checkpoint_install(const char *output_dir, const char *tmp_name, const char *name, char *err) {
    char aside_name[PATH_MAX];
    snprintf(aside_name, sizeof aside_name, "%s.old.%ld", name, (long)getpid());
    char *tmp = path_join(output_dir, tmp_name), *final = path_join(output_dir, name),
         *aside = path_join(output_dir, aside_name);
    int rc = COLT_OK;
    sync_folder(tmp); /* the copy's files were fsynced as written; now its entries */
    struct stat st;
    bool replacing = lstat(final, &st) == 0;
    if (replacing) {
        remove_tree(aside);
        if (rename(final, aside) != 0)
            rc = errorf(err, "%s: cannot move the old checkpoint aside: %s", final, strerror(errno));
        test_pause(); /* old copy aside, new copy complete under its temporary name, no final */
    }
    if (rc == 0 && rename(tmp, final) != 0) {
        rc = errorf(err, "%s: cannot rename the checkpoint into place: %s", final, strerror(errno));
        if (replacing) (void)rename(aside, final); /* put the old one back */
    }
    sync_folder(output_dir);
    if (rc == 0 && replacing) {
        test_pause(); /* new copy in place, old one aside */
        remove_tree(aside);
    }
    free(tmp), free(final), free(aside);
    return rc;
}

/* ---------------------------------------------------------------- what killed runs left */

/* A "<base>.tmp.<pid>" or "<base>.old.<pid>" entry: the pid (else 0), *aside
 * for .old, base_len the length of <base>. */
static long leftover_pid(const char *name, bool *aside, size_t *base_len) {
    const char *best = NULL;
    for (const char *t = strchr(name, '.'); t; t = strchr(t + 1, '.'))
        if (strncmp(t, ".tmp.", 5) == 0 || strncmp(t, ".old.", 5) == 0) {
            const char *digits = t + 5;
            char *end = NULL;
            long pid = *digits >= '1' && *digits <= '9' ? strtol(digits, &end, 10) : 0;
            if (pid > 0 && end && *end == '\0') best = t;
        }
    if (!best) return 0;
    *aside = strncmp(best, ".old.", 5) == 0;
    *base_len = (size_t)(best - name);
    return strtol(best + 5, NULL, 10);
}

static bool process_gone(long pid) {
    if (pid == (long)getpid()) return false;
    return pid > INT_MAX || (kill((pid_t)pid, 0) != 0 && errno == ESRCH);
}

static bool exists_in_dir(const char *dir, const char *name) {
    char *p = path_join(dir, name);
    bool e = file_exists(p);
    free(p);
    return e;
}

/* A checkpoint folder whose trainer_state.json is there and whose files match
 * its manifest. One without a manifest (an older colt's, which wrote
 * trainer_state.json and train_config.json last) must hold those, weights
 * and an optimizer file. */
static bool checkpoint_complete(const char *dir) {
    char err[ERR_LEN];
    bool has_manifest = false;
    if (checkpoint_verify_files(dir, &has_manifest, err) != 0) return false;
    if (has_manifest) return true;
    return exists_in_dir(dir, "train_config.json") &&
           (exists_in_dir(dir, "model.safetensors") || exists_in_dir(dir, "model.safetensors.index.json") ||
            exists_in_dir(dir, "adapter_model.safetensors")) &&
           (exists_in_dir(dir, "optimizer.safetensors") || exists_in_dir(dir, "optimizer_shards.json") ||
            checkpoint_saved_tensor_parallel_size(dir) > 0);
}

/* Of a dead run's leftover: its path, and whether its base name is a checkpoint. */
typedef struct Leftover {
    char *name, *base;
    bool aside, is_checkpoint;
} Leftover;

int checkpoint_recover_leftovers(const char *output_dir, int *restored) {
    *restored = 0;
    DIR *d = opendir(output_dir);
    if (!d) return 0;
    Leftover *l = NULL;
    size_t n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        bool aside = false;
        size_t base_len = 0;
        long pid = leftover_pid(e->d_name, &aside, &base_len);
        if (pid <= 0 || !process_gone(pid)) continue; /* its writer may be alive */
        if (n == cap) cap = cap ? 2 * cap : 16, l = xrealloc(l, sizeof(Leftover) * cap);
        int64_t step;
        char *base = strndup(e->d_name, base_len);
        COLT_ASSERT(base);
        l[n++] = (Leftover){.name = xstrdup(e->d_name), .base = base, .aside = aside,
                            .is_checkpoint = checkpoint_step_of(base, &step)};
    }
    closedir(d);
    /* A checkpoint with no complete copy under its own name takes a complete
     * leftover: the new copy (.tmp) before the old one (.old), which returns
     * whatever its state when nothing else can. A final folder
     * that is complete stays; one that is not (a replacement by an older colt
     * killed half-way) gives way to a complete leftover. */
    for (size_t i = 0; i < n; i++) {
        if (!l[i].is_checkpoint) continue;
        char *final = path_join(output_dir, l[i].base);
        struct stat st;
        bool has_final = lstat(final, &st) == 0;
        if (!has_final || !checkpoint_complete(final)) {
            for (int pass = 0; pass < 2; pass++)
                for (size_t j = 0; j < n; j++) {
                    if (strcmp(l[j].base, l[i].base) != 0 || l[j].aside != (pass == 1)) continue;
                    char *p = path_join(output_dir, l[j].name);
                    if (!has_final || !checkpoint_complete(final)) {
                        /* the old copy comes back even unverified: it is what the folder held */
                        if (checkpoint_complete(p) || (!has_final && l[j].aside)) {
                            if (has_final) remove_tree(final);
                            if (rename(p, final) == 0) {
                                has_final = true;
                                (*restored)++;
                                log_info0("restored %s from %s, a complete copy left by a run that was killed",
                                          final, p);
                            }
                        }
                    }
                    free(p);
                }
            sync_folder(output_dir);
        }
        free(final);
    }
    int removed = 0;
    for (size_t i = 0; i < n; i++) {
        char *p = path_join(output_dir, l[i].name);
        struct stat st;
        if (lstat(p, &st) == 0) { /* not restored */
            remove_tree(p);
            if (!file_exists(p)) removed++;
        }
        free(p), free(l[i].name), free(l[i].base);
    }
    free(l);
    return removed;
}
