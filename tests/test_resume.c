/* test_resume.c — `colt train` must not trust a checkpoint, must stop a run
 * that diverged, and must lose nothing it owns. End to end on the CPU with the
 * real stories260K (the demo's settings, made small), colt run as a program:
 *   1. the resume-mismatch matrix: every setting the checkpoint records,
 *      changed one at a time, and another model, tokenizer or dataset — each a
 *      one-line error naming it, nothing written;
 *   2. trainer_state.json / optimizer.safetensors edited the ways that crashed
 *      colt or were taken silently (indices and lengths out of range, wrong
 *      types, absurd steps, files of two checkpoints, NaN moments) — each a
 *      one-line error;
 *   3. NaN/Inf: a learning rate of 1e30 stops the run with an error naming the
 *      step, and no checkpoint of the diverged state is written;
 *   4. save_total_limit after resuming from an early checkpoint of a folder
 *      with later ones: the stale later ones stay, the resume source stays,
 *      the new run's own newest ones stay;
 *   5. temporaries of killed runs are removed at start (a live writer's are not),
 *      after a complete copy a killed replacement left is put back in place;
 *   6. metrics.jsonl / completions.jsonl write failures stop the run naming the
 *      file and the system's reason;
 *   7. kill -9 at random moments (mid-step, mid-checkpoint), resuming each
 *      time from the newest checkpoint: the same metrics and final weights as
 *      an uninterrupted run, bit for bit;
 *   8. checkpoint integrity: the file manifest (size + XXH64 in
 *      trainer_state.json) against files swapped in from another checkpoint,
 *      truncated or missing, a rollout deleted, the state edited, an older
 *      checkpoint without a manifest, a tensor-parallel checkpoint resumed in
 *      one process — each a one-line error naming the file or the setting,
 *      the checkpoint left as it was;
 *   9. kill -9 inside checkpoint replacement (COLT_TEST_REPLACE_PAUSE_MS
 *      widens the moments with the old copy aside), resuming each time from
 *      the checkpoint being replaced: every checkpoint survives, and the
 *      metrics, final weights and every checkpoint's weights and optimizer
 *      state equal the uninterrupted run's. */
#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/fileio.h"
#include "harness.h"
#include "train/checkpoint.h"

/* Rounds of two optimizer steps (steps_per_generation 2), a reference model
 * (the demo's beta 0.1) and old log-probs: every part of a saved rollout. The
 * smallest batch that holds a group (8 = num_generations: one prompt a step,
 * two a round) and short completions: the checks are about what is saved and
 * resumed, not about learning. */
static const char *BASE =
    "--config examples/demo.yaml --per_device_train_batch_size 8 --max_completion_length 12 "
    "--logging_steps 1 --log_completions_count 0 --save_total_limit 0 --eval_dataset null "
    "--steps_per_generation 2";

/* Runs `colt train ARGS` (through sh, prefix before it: environment
 * assignments), at most 600 s; stderr into *err_out. */
static int run_with(const char *prefix, const char *args, char **err_out) {
    return run_colt_with(&(ColtRun){.env = prefix, .subcommand = "train", .timeout_s = 600}, args, err_out);
}

static int run(const char *args, char **err_out) { return run_with("", args, err_out); }

/* As run, with files limited to max_file_bytes (a write past the limit fails
 * with EFBIG as on a full disk). */
static int run_file_limited(const char *args, long max_file_bytes, char **err_out) {
    return run_colt_with(&(ColtRun){.subcommand = "train", .max_file_bytes = max_file_bytes}, args, err_out);
}

static const char *last_line(const char *s) {
    size_t n = strlen(s);
    while (n > 0 && s[n - 1] == '\n') n--;
    while (n > 0 && s[n - 1] != '\n') n--;
    return s + n;
}

/* True when every value of an F32 safetensors file is finite. */
static bool weights_finite(const char *path) {
    char *data = NULL;
    size_t len = 0;
    if (file_read_all(path, &data, &len, NULL) != 0 || len < 8) return free(data), false;
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)(unsigned char)data[i] << (8 * i);
    bool ok = hlen + 8 <= (uint64_t)len && (len - 8 - hlen) % 4 == 0;
    for (size_t off = 8 + hlen; ok && off < len; off += 4) {
        float f;
        memcpy(&f, data + off, 4);
        ok = isfinite(f);
    }
    free(data);
    return ok;
}

/* A run that must stop on its own (after progress lines) with an error whose
 * last line holds needle, leaving no checkpoint with a non-finite weight. */
static void expect_stopped(const char *name, int code, char *err, const char *out_dir, const char *needle) {
    const char *last = last_line(err);
    CHECK(code != 0 && code < 124, "%s: exit %d", name, code);
    CHECK(strstr(last, "colt train:") && strstr(last, needle), "%s: last line '%s' lacks '%s'", name, last, needle);
    DIR *d = opendir(out_dir);
    struct dirent *e;
    int n = 0;
    while (d && (e = readdir(d))) {
        int st;
        char tail;
        if (sscanf(e->d_name, "checkpoint-%d%c", &st, &tail) != 1) continue;
        char *ck = path_join(out_dir, e->d_name), *w = path_join(ck, "model.safetensors");
        CHECK(weights_finite(w), "%s: %s holds non-finite weights", name, w);
        n++;
        free(ck), free(w);
    }
    if (d) closedir(d);
    printf("  %-40s -> exit %d, %d checkpoint(s) written, all finite: %s", name, code, n, last);
}

/* Number of checkpoint-N folders (exact names) in dir. */
static int count_checkpoints(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        long long s;
        char tail;
        n += sscanf(e->d_name, "checkpoint-%lld%c", &s, &tail) == 1;
    }
    closedir(d);
    return n;
}

/* The run must fail with one stderr line holding needle, and write no
 * checkpoint or model into out_dir. */
static void expect_refused(const char *name, const char *args, const char *out_dir, const char *needle) {
    char *err;
    int code = run(args, &err);
    CHECK(code != 0 && code < 124, "%s: exit %d", name, code);
    CHECK(count_lines(err) == 1, "%s: %d stderr lines: %s", name, count_lines(err), err);
    CHECK(strstr(err, needle) != NULL, "%s: '%s' lacks '%s'", name, err, needle);
    CHECK(count_checkpoints(out_dir) == 0 && !exists_in(out_dir, "model.safetensors"), "%s: wrote into %s", name,
          out_dir);
    printf("  %-40s -> exit %d: %s", name, code, err);
    free(err);
}

/* ---------------------------------------------------------------- 2. edited checkpoints */

typedef void (*EditFn)(json_t *state);

static json_t *rollout_of(json_t *s) { return json_object_get(s, "rollout"); }
static json_t *sample0(json_t *s) { return json_array_get(json_object_get(rollout_of(s), "samples"), 0); }

static void edit_order_out_of_range(json_t *s) { json_array_set_new(json_object_get(rollout_of(s), "order"), 0, json_integer(99999)); }
static void edit_order_repeats(json_t *s) {
    json_t *order = json_object_get(rollout_of(s), "order");
    json_array_set(order, 0, json_array_get(order, 1));
}
static void edit_samples_done_negative(json_t *s) { json_object_set_new(rollout_of(s), "samples_done", json_integer(-1)); }
static void edit_samples_done_large(json_t *s) { json_object_set_new(rollout_of(s), "samples_done", json_integer(999)); }
static void edit_samples_done_partial(json_t *s) { json_object_set_new(rollout_of(s), "samples_done", json_integer(7)); }
static void edit_completion_long(json_t *s) {
    json_t *a = json_array();
    for (int i = 0; i < 300; i++) json_array_append_new(a, json_integer(5));
    json_object_set_new(sample0(s), "completion", a);
}
static void edit_token_out_of_vocab(json_t *s) { json_array_set_new(json_object_get(sample0(s), "completion"), 0, json_integer(100000)); }
static void edit_sample_prompt(json_t *s) { json_object_set_new(sample0(s), "prompt", json_integer(3)); }
static void edit_prompt_row(json_t *s) {
    json_object_set_new(json_array_get(json_object_get(rollout_of(s), "prompts"), 0), "row", json_integer(1000000));
}
static void edit_prompt_ids_empty(json_t *s) {
    json_object_set_new(json_array_get(json_object_get(rollout_of(s), "prompts"), 0), "ids", json_array());
}
static void edit_sample_missing(json_t *s) { json_array_remove(json_object_get(rollout_of(s), "samples"), 5); }
static void edit_old_logp_missing(json_t *s) { json_object_del(sample0(s), "old_logp"); }
static void edit_ref_logp_short(json_t *s) { json_array_remove(json_object_get(sample0(s), "ref_logp"), 0); }
static void edit_logp_string(json_t *s) { json_array_set_new(json_object_get(sample0(s), "sampling_logp"), 0, json_string("x")); }
static void edit_advantage_null(json_t *s) { json_object_set_new(sample0(s), "advantage", json_null()); }
static void edit_step_string(json_t *s) { json_object_set_new(s, "global_step", json_string("3")); }
static void edit_step_real(json_t *s) { json_object_set_new(s, "global_step", json_real(1e20)); }
static void edit_step_huge(json_t *s) { json_object_set_new(s, "global_step", json_integer(INT64_MAX)); }
static void edit_step_negative(json_t *s) { json_object_set_new(s, "global_step", json_integer(-1)); }
static void edit_step_past_end(json_t *s) { json_object_set_new(s, "global_step", json_integer(100)); }
static void edit_epoch_pos(json_t *s) { json_object_set_new(s, "epoch_pos", json_integer(100000)); }
static void edit_metrics(json_t *s) { json_object_set_new(s, "metrics", json_string("x")); }
static void edit_metric_nan(json_t *s) {
    json_array_append_new(json_object_get(s, "metrics"), json_pack("{s:s,s:s,s:i}", "name", "loss", "sum", "nan", "count", 1));
}
static void edit_num_tokens(json_t *s) { json_object_set_new(s, "num_tokens", json_integer(-5)); }
static void edit_no_record(json_t *s) { json_object_del(s, "resume_record"); }
static void edit_rollout_round(json_t *s) { json_object_set_new(rollout_of(s), "round", json_integer(0)); }
static void edit_record_seed(json_t *s) {
    json_object_set_new(json_object_get(json_object_get(s, "resume_record"), "settings"), "seed", json_integer(1));
}

/* Copies checkpoint src to dst and applies edit to its trainer_state.json. */
static void edited_copy(const char *src, const char *dst, EditFn edit) {
    sh("rm -rf %s && cp -r %s %s", dst, src, dst);
    char *p = path_join(dst, "trainer_state.json");
    json_t *s = json_load_file(p, 0, NULL);
    CHECK(s && json_is_object(rollout_of(s)), "%s: no rollout to edit (the checkpoint must fall inside a round)", src);
    edit(s);
    char *text = json_dumps(s, JSON_INDENT(1));
    file_write_atomic(p, text, strlen(text), NULL);
    free(text);
    json_decref(s);
    free(p);
}

/* Overwrites 4 bytes at offset from the end of dir/name with a float NaN. */
static void poke_nan(const char *dir, const char *name, long from_end) {
    char *p = path_join(dir, name);
    FILE *fp = fopen(p, "r+b");
    const unsigned char nan_bytes[4] = {0x00, 0x00, 0xc0, 0x7f};
    if (fp && fseek(fp, -from_end, SEEK_END) == 0) fwrite(nan_bytes, 1, 4, fp);
    if (fp) fclose(fp);
    free(p);
}

/* Sets every value of an F32 tensor of a safetensors file to value. */
static void poke_tensor(const char *path, const char *tensor, float value) {
    char *data = NULL;
    size_t len = 0;
    bool done = false;
    if (file_read_all(path, &data, &len, NULL) == 0 && len >= 8) {
        uint64_t hlen = 0;
        for (int i = 0; i < 8; i++) hlen |= (uint64_t)(unsigned char)data[i] << (8 * i);
        json_t *h = hlen + 8 <= (uint64_t)len ? json_loadb(data + 8, (size_t)hlen, 0, NULL) : NULL;
        json_t *offs = json_object_get(json_object_get(h, tensor), "data_offsets");
        size_t b = (size_t)json_integer_value(json_array_get(offs, 0)), e = (size_t)json_integer_value(json_array_get(offs, 1));
        if (offs && 8 + hlen + e <= len) {
            for (size_t off = 8 + hlen + b; off + 4 <= 8 + hlen + e; off += 4) memcpy(data + off, &value, 4);
            done = file_write_atomic(path, data, len, NULL) == 0;
        }
        json_decref(h);
    }
    CHECK(done, "could not set tensor %s of %s", tensor, path);
    free(data);
}

/* Rewrites dir's trainer_state.json's "files" and "state_xxh64" for the files
 * now there, as colt would have: a checkpoint edited this way passes the
 * manifest, so the checks behind it are tested. strip: remove them instead
 * (a checkpoint of an older colt). */
static void reseal(const char *dir, bool strip) {
    char *p = path_join(dir, "trainer_state.json"), err[512] = "";
    json_t *s = json_load_file(p, 0, NULL);
    bool ok = s != NULL;
    if (ok) {
        json_object_del(s, "files");
        json_object_del(s, "state_xxh64");
        if (!strip) ok = checkpoint_state_seal(s, dir, err) == 0;
    }
    char *text = ok ? json_dumps(s, JSON_INDENT(1)) : NULL;
    ok = ok && text && file_write_atomic(p, text, strlen(text), err) == 0;
    CHECK(ok, "could not reseal %s: %s", dir, err);
    free(text), free(p);
    json_decref(s);
}

/* dir's entries with their sizes and contents' hashes, one a line (to see that nothing changed). */
static char *listing(const char *dir) {
    char cmd[600], *out = NULL;
    snprintf(cmd, sizeof cmd, "cd %s && for f in $(ls -A); do printf '%%s ' $f; cksum < $f; done 2>&1", dir);
    FILE *fp = popen(cmd, "r");
    size_t len = 0;
    FILE *mem = open_memstream(&out, &len);
    char buf[4096];
    size_t n;
    while (fp && (n = fread(buf, 1, sizeof buf, fp)) > 0) fwrite(buf, 1, n, mem);
    if (fp) pclose(fp);
    fclose(mem);
    return out;
}

/* ---------------------------------------------------------------- 7. kill -9 */


/* True when every checkpoint-N folder in dir holds all its files. */
static bool checkpoints_complete(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return true;
    bool ok = true;
    struct dirent *e;
    while ((e = readdir(d))) {
        int s;
        char tail;
        if (sscanf(e->d_name, "checkpoint-%d%c", &s, &tail) != 1) continue;
        char *ck = path_join(dir, e->d_name);
        const char *need[] = {"trainer_state.json", "optimizer.safetensors", "model.safetensors", "config.json",
                              "tokenizer.json", "train_config.json"};
        for (int i = 0; i < 6; i++) ok &= exists_in(ck, need[i]);
        free(ck);
    }
    closedir(d);
    return ok;
}

static bool has_temporaries(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return false;
    bool found = false;
    struct dirent *e;
    while ((e = readdir(d))) found |= strstr(e->d_name, ".tmp.") != NULL || strstr(e->d_name, ".old.") != NULL;
    closedir(d);
    return found;
}

static pid_t start_colt(const char *args) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "exec %s train %s", COLT_BINARY, args);
    return start_command(cmd, NULL, NULL);
}

/* As start_colt, with an environment variable set (NAME=VALUE) and stderr into log. */
static pid_t start_colt_env(const char *env, const char *args, const char *log) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "exec env %s %s train %s", env, COLT_BINARY, args);
    return start_command(cmd, NULL, log);
}

/* dir's entry whose name starts with prefix (malloc'd), or NULL. */
static char *entry_with_prefix(const char *dir, const char *prefix) {
    DIR *d = opendir(dir);
    char *found = NULL;
    struct dirent *e;
    while (d && !found && (e = readdir(d)))
        if (strncmp(e->d_name, prefix, strlen(prefix)) == 0) found = strdup(e->d_name);
    if (d) closedir(d);
    return found;
}

/* step_s: the time of one step (with its checkpoint) of the uninterrupted run. */
static void kill_loop(const char *u_dir, double step_s) {
    char k_dir[300], args[4096];
    snprintf(k_dir, sizeof k_dir, "%s/killed", g_tmp);
    const char *cfg = "--max_steps 12 --save_steps 1";
    uint64_t lcg = 12345;
    int kills = 0, mid_checkpoint = 0, runs = 0, finished = 0;
    bool complete = true;
    while (!finished && runs < 40) {
        int ck = newest_checkpoint(k_dir);
        if (ck > 0) snprintf(args, sizeof args, "%s %s --output_dir %s --resume_from_checkpoint %s/checkpoint-%d", BASE, cfg, k_dir, k_dir, ck);
        else snprintf(args, sizeof args, "%s %s --output_dir %s", BASE, cfg, k_dir);
        runs++;
        pid_t pid = start_colt(args);
        lcg = lcg * 6364136223846793005ull + 1442695040888963407ull;
        /* Odd kills land the moment a temporary appears (a checkpoint or file being
         * written); even ones at a random moment within one step after the run's
         * first new metrics line (so every run gets somewhere, however slow the
         * machine, and the ten kills land before the 12 steps are done, however
         * fast). */
        bool at_write = kills % 2 == 1;
        double extra = step_s * (double)(lcg >> 11) / 9007199254740992.0, progress_at = -1;
        int lines_at_start = count_metric_lines(k_dir);
        int status = 0;
        bool exited = false, fire = false;
        while (!exited && !fire) {
            exited = waitpid(pid, &status, WNOHANG) == pid;
            if (exited || kills >= 10) { /* after 10 kills, let it finish */
                if (!exited) usleep(2000);
                continue;
            }
            if (at_write) fire = has_temporaries(k_dir);
            else {
                if (progress_at < 0 && count_metric_lines(k_dir) > lines_at_start) progress_at = now_s();
                fire = progress_at >= 0 && now_s() - progress_at >= extra;
            }
            if (!fire) usleep(at_write ? 200 : 2000);
        }
        if (!exited) {
            kill(pid, SIGKILL);
            waitpid(pid, &status, 0);
            kills++;
            mid_checkpoint += has_temporaries(k_dir);
            complete &= checkpoints_complete(k_dir);
            continue;
        }
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "kill loop: a run exited with status %d", status);
        finished = WIFEXITED(status) && WEXITSTATUS(status) == 0;
        if (!finished) break;
    }
    char *mu = metrics_without_timing(u_dir), *mk = metrics_without_timing(k_dir);
    bool same_metrics = strcmp(mu, mk) == 0 && count_lines(mu) == 12;
    bool same_weights = same_file(u_dir, k_dir, "model.safetensors");
    printf("kill -9 loop: %d runs, %d killed (%d while a checkpoint or file was being written), every checkpoint "
           "complete: %s, temporaries left at the end: %s; metrics equal to the uninterrupted run: %s, final weights "
           "identical: %s\n",
           runs, kills, mid_checkpoint, complete ? "yes" : "NO", has_temporaries(k_dir) ? "YES" : "no",
           same_metrics ? "yes" : "NO", same_weights ? "yes" : "NO");
    CHECK(finished, "kill loop never finished in %d runs", runs);
    CHECK(kills == 10 && mid_checkpoint >= 2, "kill loop: only %d kills landed, %d while writing", kills, mid_checkpoint);
    CHECK(complete, "a kill left an incomplete checkpoint folder under its final name");
    CHECK(!has_temporaries(k_dir), "temporaries of killed runs were left behind");
    CHECK(same_metrics, "kill loop metrics differ:\n--- uninterrupted\n%s--- killed and resumed\n%s", mu, mk);
    CHECK(same_weights, "kill loop final weights differ");
    free(mu), free(mk);
}

/* 9. Kills land with checkpoint-N's old copy aside: either before the new
 * copy is renamed in (no checkpoint-N at all: the next start must restore
 * it) or after (the old copy is still to be deleted). Each next run resumes
 * from that very checkpoint-N. */
static void replace_loop(const char *u_dir) {
    char r_dir[300], args[4096], log[400];
    snprintf(r_dir, sizeof r_dir, "%s/replaced", g_tmp);
    snprintf(log, sizeof log, "%s/replace.log", g_tmp);
    sh("rm -rf %s && cp -r %s %s", r_dir, u_dir, r_dir); /* checkpoints 1..12 there: every save replaces one */
    int from = 2, landed_before = 0, landed_after = 0, restored = 0, kills = 0;
    bool restore_expected = false;
    for (int i = 0; i < 6; i++, from++) {
        snprintf(args, sizeof args, "%s --max_steps 12 --save_steps 1 --output_dir %s --resume_from_checkpoint "
                 "%s/checkpoint-%d", BASE, r_dir, r_dir, from);
        bool before_rename = i % 2 == 0;
        pid_t pid = start_colt_env("COLT_TEST_REPLACE_PAUSE_MS=500", args, log);
        char final_name[64], aside_prefix[64];
        snprintf(final_name, sizeof final_name, "checkpoint-%d", from + 1);
        snprintf(aside_prefix, sizeof aside_prefix, "checkpoint-%d.old.", from + 1);
        int status = 0;
        bool exited = false, fire = false;
        double start = now_s();
        while (!exited && !fire && now_s() - start < 60) {
            exited = waitpid(pid, &status, WNOHANG) == pid;
            char *aside = exited ? NULL : entry_with_prefix(r_dir, aside_prefix);
            fire = aside && exists_in(r_dir, final_name) != before_rename;
            free(aside);
            if (!fire && !exited) usleep(2000);
        }
        if (!exited) kill(pid, SIGKILL), waitpid(pid, &status, 0);
        CHECK(fire, "replacement loop run %d: the kill did not land inside the replacement of %s", i, final_name);
        kills += fire;
        char *log_text = read_text(g_tmp, "replace.log");
        if (restore_expected) restored += log_text && strstr(log_text, "restored ") != NULL;
        free(log_text);
        /* what the kill left: the old copy aside, and the new one under its temporary name or in place */
        char tmp_prefix[64];
        snprintf(tmp_prefix, sizeof tmp_prefix, "checkpoint-%d.tmp.", from + 1);
        char *tmp = entry_with_prefix(r_dir, tmp_prefix), *aside = entry_with_prefix(r_dir, aside_prefix);
        if (before_rename && fire) {
            char *tmp_dir = tmp ? path_join(r_dir, tmp) : NULL;
            bool tmp_whole = tmp_dir && exists_in(tmp_dir, "trainer_state.json");
            landed_before += !exists_in(r_dir, final_name) && tmp_whole && aside;
            free(tmp_dir);
        } else if (fire)
            landed_after += exists_in(r_dir, final_name) && !tmp && aside;
        free(tmp), free(aside);
        restore_expected = before_rename;
    }
    /* The last run starts from the checkpoint whose replacement was killed, then finishes. */
    snprintf(args, sizeof args, "%s --max_steps 12 --save_steps 1 --output_dir %s --resume_from_checkpoint "
             "%s/checkpoint-%d", BASE, r_dir, r_dir, from);
    pid_t pid = start_colt_env("COLT_TEST_REPLACE_PAUSE_MS=0", args, log);
    int status = 0;
    waitpid(pid, &status, 0);
    char *log_text = read_text(g_tmp, "replace.log");
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "replacement loop: the last run failed: %s",
          log_text ? log_text : "");
    free(log_text);
    int same_checkpoints = 0;
    for (int s = 1; s <= 12; s++) {
        char name[64];
        snprintf(name, sizeof name, "checkpoint-%d", s);
        char *a = path_join(u_dir, name), *b = path_join(r_dir, name);
        same_checkpoints += same_file(a, b, "model.safetensors") && same_file(a, b, "optimizer.safetensors");
        free(a), free(b);
    }
    char *mu = metrics_without_timing(u_dir), *mr = metrics_without_timing(r_dir);
    bool same_metrics = strcmp(mu, mr) == 0 && count_lines(mu) == 12;
    bool same_weights = same_file(u_dir, r_dir, "model.safetensors");
    printf("kill -9 inside checkpoint replacement: %d kills, %d with no checkpoint-N but its new copy whole and the "
           "old aside, %d with the new copy in place and the old aside; %d of 3 next starts restored it; checkpoints "
           "1-12 with the uninterrupted run's weights and optimizer: %d; metrics equal: %s, final weights identical: "
           "%s; leftovers: %s\n",
           kills, landed_before, landed_after, restored, same_checkpoints, same_metrics ? "yes" : "NO",
           same_weights ? "yes" : "NO", has_temporaries(r_dir) ? "YES" : "none");
    CHECK(kills == 6 && landed_before == 3 && landed_after == 3, "replacement kills landed %d/%d/%d, want 6/3/3",
          kills, landed_before, landed_after);
    CHECK(restored == 3, "%d of 3 starts after a kill before the rename restored the checkpoint", restored);
    CHECK(same_checkpoints == 12, "only %d of 12 checkpoints equal the uninterrupted run's", same_checkpoints);
    CHECK(same_metrics, "replacement loop metrics differ:\n--- uninterrupted\n%s--- killed and resumed\n%s", mu, mr);
    CHECK(same_weights, "replacement loop final weights differ");
    CHECK(!has_temporaries(r_dir), "leftovers of killed runs remain in %s", r_dir);
    free(mu), free(mr);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_test_resume_XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    setvbuf(stdout, NULL, _IOLBF, 0); /* nothing buffered is duplicated into forked children */

    char args[8192], ref[300], out[300], ck3[400], *err;

    /* The reference run: 6 steps, a checkpoint every step (3 and 5 fall inside a round). */
    snprintf(ref, sizeof ref, "%s/ref", g_tmp);
    snprintf(out, sizeof out, "%s/out", g_tmp);
    snprintf(ck3, sizeof ck3, "%s/checkpoint-3", ref);
    snprintf(args, sizeof args, "%s --max_steps 6 --save_steps 1 --output_dir %s", BASE, ref);
    int code = run(args, &err);
    CHECK(code == 0, "reference run: exit %d: %s", code, err);
    free(err);
    CHECK(count_checkpoints(ref) == 6, "reference run saved %d checkpoints, want 6", count_checkpoints(ref));
    char *state_before = read_text(ck3, "trainer_state.json");

    /* 1. the resume-mismatch matrix */
    printf("resume with a setting the checkpoint depends on changed:\n");
    struct {
        const char *flags, *needle;
    } changes[] = {
        {"--num_generations 4", "num_generations"},
        {"--generation_batch_size 64", "generation_batch_size"},
        {"--steps_per_generation 4 --per_device_train_batch_size 4", "samples per optimizer step"},
        {"--steps_per_generation 1", "generation_batch_size"},
        {"--num_iterations 2", "num_iterations"},
        {"--gradient_accumulation_steps 2", "samples per optimizer step"},
        {"--max_completion_length 20", "max_completion_length"},
        {"--max_prompt_length 100", "max_prompt_length"},
        {"--seed 7", "seed"},
        {"--temperature 0.9", "temperature"},
        {"--top_p 0.9", "top_p"},
        {"--top_k 50", "top_k"},
        {"--min_p 0.1", "min_p"},
        {"--repetition_penalty 1.1", "repetition_penalty"},
        {"--beta 0", "beta"},
        {"--beta 0.2", "beta"},
        {"--scale_rewards batch", "scale_rewards"},
        {"--mask_truncated_completions true", "mask_truncated_completions"},
        {"--reward_funcs '[{\"type\": \"regex\", \"name\": \"park\", \"pattern\": \"park\"}]'", "reward_funcs"},
        {"--reward_weights '[2.0]'", "reward_weights"},
    };
    int n_changes = (int)(sizeof changes / sizeof changes[0]);
    for (int i = 0; i < n_changes; i++) {
        sh("rm -rf %s", out);
        snprintf(args, sizeof args, "%s --max_steps 6 --output_dir %s --resume_from_checkpoint %s %s", BASE, out, ck3,
                 changes[i].flags);
        expect_refused(changes[i].flags, args, out, changes[i].needle);
    }
    /* Other model, tokenizer and dataset files. The tiny Llama was a SEGV with beta > 0. */
    char other[300], data_copy[300];
    snprintf(other, sizeof other, "%s/model_copy", g_tmp);
    sh("cp -r models/stories260K %s && printf ' ' >> %s/tokenizer_config.json", other, other);
    sh("rm -rf %s", out);
    snprintf(args, sizeof args, "%s --max_steps 6 --output_dir %s --resume_from_checkpoint %s --model %s", BASE, out,
             ck3, other);
    expect_refused("--model (tokenizer file changed)", args, out, "tokenizer differs");
    sh("rm -rf %s && cp -r models/stories260K %s", other, other);
    sh("cp models/stories260K/model.safetensors %s/model.safetensors && printf 'x' | dd of=%s/model.safetensors "
       "bs=1 seek=200000 conv=notrunc status=none",
       other, other);
    snprintf(args, sizeof args, "%s --max_steps 6 --output_dir %s --resume_from_checkpoint %s --model %s", BASE, out,
             ck3, other);
    expect_refused("--model (one weight byte changed)", args, out, "model differs");
    /* A tiny random Llama with stories260K's tokenizer: resuming with it and beta > 0 was a SEGV. */
    sh("rm -rf %s && cp -r tests/data/models/tiny-llama-f32 %s && cp models/stories260K/tokenizer* %s/", other, other,
       other);
    snprintf(args, sizeof args, "%s --max_steps 6 --output_dir %s --resume_from_checkpoint %s --model %s", BASE, out,
             ck3, other);
    expect_refused("--model another model (beta 0.1)", args, out, "model differs");
    snprintf(data_copy, sizeof data_copy, "%s/data.jsonl", g_tmp);
    sh("head -n 100 examples/data/demo_train.jsonl > %s", data_copy);
    snprintf(args, sizeof args, "%s --max_steps 6 --output_dir %s --resume_from_checkpoint %s --dataset %s", BASE, out,
             ck3, data_copy);
    expect_refused("--dataset (rows removed)", args, out, "dataset differs");
    /* and what may change: the learning rate, max_steps, and how a step's samples are split into micro-batches */
    sh("rm -rf %s", out);
    snprintf(args, sizeof args, "%s --max_steps 6 --per_device_train_batch_size 4 --gradient_accumulation_steps 2 "
             "--steps_per_generation 4 --output_dir %s --resume_from_checkpoint %s", BASE, out, ck3);
    code = run(args, &err);
    CHECK(code == 0, "resume with micro-batches of 4 x 2 instead of 8 x 1: exit %d: %s", code, err);
    printf("  resume with micro-batches of 4 x 2 instead of 8 x 1 -> exit %d\n", code);
    free(err);
    /* and what may change: the learning rate, max_steps */
    sh("rm -rf %s", out);
    snprintf(args, sizeof args, "%s --max_steps 4 --learning_rate 1e-4 --output_dir %s --resume_from_checkpoint %s",
             BASE, out, ck3);
    code = run(args, &err);
    CHECK(code == 0, "resume with another learning_rate and max_steps: exit %d: %s", code, err);
    printf("  resume with another learning_rate and max_steps -> exit %d\n", code);
    free(err);
    char *state_after = read_text(ck3, "trainer_state.json");
    CHECK(state_before && state_after && strcmp(state_before, state_after) == 0,
          "the refused resumes changed the checkpoint they were given");
    free(state_after);

    /* 2. edited trainer_state.json */
    printf("resume from an edited checkpoint:\n");
    struct {
        const char *name;
        EditFn edit;
        const char *needle;
    } edits[] = {
        {"order entry out of range", edit_order_out_of_range, "order[0]"},
        {"order repeats a sample", edit_order_repeats, "repeats"},
        {"samples_done -1", edit_samples_done_negative, "samples_done"},
        {"samples_done past the round", edit_samples_done_large, "samples_done"},
        {"samples_done inside a micro-batch", edit_samples_done_partial, "whole number"},
        {"completion of 300 tokens", edit_completion_long, "300 tokens"},
        {"token id out of the vocabulary", edit_token_out_of_vocab, "vocabulary"},
        {"sample's prompt index", edit_sample_prompt, "prompt"},
        {"prompt row past the dataset", edit_prompt_row, "row"},
        {"prompt ids empty", edit_prompt_ids_empty, "ids"},
        {"a sample missing", edit_sample_missing, "samples"},
        {"old_logp missing", edit_old_logp_missing, "old_logp"},
        {"ref_logp one short", edit_ref_logp_short, "ref_logp"},
        {"sampling_logp a string", edit_logp_string, "sampling_logp"},
        {"advantage null", edit_advantage_null, "advantage"},
        {"global_step a string", edit_step_string, "global_step"},
        {"global_step 1e20", edit_step_real, "global_step"},
        {"global_step INT64_MAX", edit_step_huge, "global_step"},
        {"global_step -1", edit_step_negative, "global_step"},
        {"global_step past max_steps", edit_step_past_end, "raise max_steps"},
        {"epoch_pos past the dataset", edit_epoch_pos, "epoch_pos"},
        {"metrics not a list", edit_metrics, "metrics"},
        {"a metric's sum a string", edit_metric_nan, "metric"},
        {"num_tokens -5", edit_num_tokens, "num_tokens"},
        {"no resume record", edit_no_record, "resume record"},
        {"rollout of another round", edit_rollout_round, "round"},
        {"recorded seed differs", edit_record_seed, "seed"},
    };
    char edited[300];
    snprintf(edited, sizeof edited, "%s/edited", g_tmp);
    for (size_t i = 0; i < sizeof edits / sizeof edits[0]; i++) {
        edited_copy(ck3, edited, edits[i].edit);
        sh("rm -rf %s", out);
        snprintf(args, sizeof args, "%s --max_steps 6 --output_dir %s --resume_from_checkpoint %s", BASE, out, edited);
        expect_refused(edits[i].name, args, out, edits[i].needle);
    }
    /* text-level damage and files of two checkpoints */
    sh("rm -rf %s && cp -r %s %s && printf '{' > %s/trainer_state.json", edited, ck3, edited, edited);
    snprintf(args, sizeof args, "%s --max_steps 6 --output_dir %s --resume_from_checkpoint %s", BASE, out, edited);
    expect_refused("trainer_state.json not JSON", args, out, "trainer_state.json");
    sh("rm -rf %s && cp -r %s %s && sed -i '0,/\"global_step\"/s//\"global_step\": 3, \"global_step\"/' "
       "%s/trainer_state.json",
       edited, ck3, edited, edited);
    expect_refused("a duplicate key", args, out, "duplicate");
    /* resealed (the manifest updated as colt would): the checks behind the manifest still hold */
    sh("rm -rf %s && cp -r %s %s && cp %s/checkpoint-1/optimizer.safetensors %s/", edited, ck3, edited, ref, edited);
    reseal(edited, false);
    expect_refused("optimizer of checkpoint-1, resealed", args, out, "optimizer is at step 1");
    sh("rm -rf %s && cp -r %s %s", edited, ck3, edited);
    poke_nan(edited, "optimizer.safetensors", 8);
    reseal(edited, false);
    expect_refused("NaN in optimizer moments, resealed", args, out, "nan");
    sh("rm -rf %s && cp -r %s %s && rm %s/trainer_state.json && mkfifo %s/trainer_state.json", edited, ck3, edited,
       edited, edited);
    expect_refused("trainer_state.json a FIFO", args, out, "regular file");

    /* 8. the file manifest: a copy of checkpoint-1 or -3 damaged one way, refused in one line naming what is
     * wrong, and left as it was (same files, same bytes) */
    printf("checkpoint integrity:\n");
    struct {
        const char *name, *src, *damage, *needle, *needle2;
        bool reseal;
    } damages[] = {
        {"model.safetensors of checkpoint-3 in checkpoint-1", "checkpoint-1",
         "cp %s/checkpoint-3/model.safetensors %s/", "model.safetensors does not match", NULL, false},
        {"optimizer.safetensors of checkpoint-1 in checkpoint-3", "checkpoint-3",
         "cp %s/checkpoint-1/optimizer.safetensors %s/", "optimizer.safetensors does not match", NULL, false},
        {"optimizer.safetensors truncated", "checkpoint-3", "#%s\ntruncate -s 1000 %s/optimizer.safetensors",
         "optimizer.safetensors is 1000 bytes", NULL, false},
        {"tokenizer.json deleted", "checkpoint-3", "#%s\nrm %s/tokenizer.json", "tokenizer.json is missing", NULL,
         false},
        {"rollout deleted from trainer_state.json", "checkpoint-3",
         "#%s\nsed -i 's/\"rollout\": {/\"rollout_deleted\": {/' %s/trainer_state.json", "'rollout'", "missing",
         false},
        {"rollout and in_round deleted", "checkpoint-3",
         "#%s\nsed -i -e 's/\"rollout\": {/\"rollout_deleted\": {/' -e 's/\"in_round\": true/\"x\": 1/' "
         "%s/trainer_state.json", "changed after it was saved", NULL, false},
        {"tensor parallel (2) resumed in one process", "checkpoint-3",
         "#%s\ncd %s && mv optimizer.safetensors optimizer-tp00000-of-00002.safetensors && "
         "cp optimizer-tp00000-of-00002.safetensors optimizer-tp00001-of-00002.safetensors",
         "no optimizer state for tensor_parallel_size 1: the checkpoint was saved with tensor_parallel_size 2",
         "--tensor_parallel_size 2", true},
    };
    char damaged[300];
    snprintf(damaged, sizeof damaged, "%s/damaged", g_tmp);
    for (size_t i = 0; i < sizeof damages / sizeof damages[0]; i++) {
        sh("rm -rf %s && cp -r %s/%s %s", damaged, ref, damages[i].src, damaged);
        sh(damages[i].damage, ref, damaged);
        if (damages[i].reseal) reseal(damaged, false);
        char *before = listing(damaged);
        sh("rm -rf %s", out);
        snprintf(args, sizeof args, "%s --max_steps 6 --output_dir %s --resume_from_checkpoint %s", BASE, out, damaged);
        expect_refused(damages[i].name, args, out, damages[i].needle);
        char *after = listing(damaged), *said = read_text(g_tmp, "stderr");
        CHECK(!damages[i].needle2 || (said && strstr(said, damages[i].needle2)), "%s: the error lacks '%s'",
              damages[i].name, damages[i].needle2);
        free(said);
        CHECK(before && after && strcmp(before, after) == 0 && count_lines(before) >= 7,
              "%s: the refused resume changed the checkpoint:\n%s---\n%s", damages[i].name, before, after);
        free(before), free(after);
    }
    /* an older colt's checkpoint (no manifest): taken, with one line saying its files are not checked */
    sh("rm -rf %s %s && cp -r %s %s", damaged, out, ck3, damaged);
    reseal(damaged, true);
    snprintf(args, sizeof args, "%s --max_steps 4 --output_dir %s --resume_from_checkpoint %s", BASE, out, damaged);
    code = run(args, &err);
    CHECK(code == 0 && strstr(err, "lists no files (saved by an older colt)"),
          "a checkpoint without a manifest: exit %d: %s", code, err);
    printf("  %-40s -> exit %d, noted: %s\n", "no manifest (an older colt's)", code,
           strstr(err, "lists no files") ? "yes" : "NO");
    free(err);

    /* 3. divergence. Settings cannot cause it any more (learning_rate is bounded), so the state does: an
     * optimizer whose first moment is 1e38 with a second moment of 0 makes the next update Inf; a model whose
     * final norm weight is 3e38 (finite) overflows the logits at once. */
    printf("divergence:\n");
    char blown[300], huge[300];
    snprintf(blown, sizeof blown, "%s/blown_optimizer", g_tmp);
    sh("rm -rf %s && cp -r %s %s", blown, ck3, blown);
    char *opt_path = path_join(blown, "optimizer.safetensors");
    poke_tensor(opt_path, "model.norm.weight.exp_avg", 1e38f);
    poke_tensor(opt_path, "model.norm.weight.exp_avg_sq", 0.0f);
    free(opt_path);
    reseal(blown, false);
    snprintf(huge, sizeof huge, "%s/huge_model", g_tmp);
    sh("rm -rf %s && cp -r models/stories260K %s", huge, huge);
    char *huge_weights = path_join(huge, "model.safetensors");
    poke_tensor(huge_weights, "model.norm.weight", 3e38f);
    free(huge_weights);
    struct {
        const char *name, *flags, *needle;
        const char *resume, *model;
    } diverge[] = {
        {"Inf update, no saves", "--save_steps 0 --learning_rate 100", "diverged", blown, NULL},
        {"Inf update, a save every step", "--save_steps 1 --learning_rate 100", "NaN or Inf", blown, NULL},
        {"logits overflow from the start", "--save_steps 1", "diverged", NULL, huge},
    };
    for (size_t i = 0; i < sizeof diverge / sizeof diverge[0]; i++) {
        sh("rm -rf %s", out);
        snprintf(args, sizeof args, "%s --max_steps 6 %s --output_dir %s%s%s%s%s", BASE, diverge[i].flags, out,
                 diverge[i].resume ? " --resume_from_checkpoint " : "", diverge[i].resume ? diverge[i].resume : "",
                 diverge[i].model ? " --model " : "", diverge[i].model ? diverge[i].model : "");
        code = run(args, &err);
        expect_stopped(diverge[i].name, code, err, out, diverge[i].needle);
        CHECK(strstr(err, "step ") != NULL, "%s: the error does not name the step: %s", diverge[i].name, err);
        free(err);
    }

    /* 4. save_total_limit after resuming early in a folder with later checkpoints */
    char prune[300];
    snprintf(prune, sizeof prune, "%s/prune", g_tmp);
    sh("rm -rf %s && cp -r %s %s", prune, ref, prune);
    snprintf(args, sizeof args, "%s --max_steps 4 --save_steps 1 --save_total_limit 2 --output_dir %s "
             "--resume_from_checkpoint %s/checkpoint-2", BASE, prune, prune);
    code = run(args, &err);
    CHECK(code == 0, "prune run: exit %d: %s", code, err);
    free(err);
    bool kept[7];
    char kept_text[64] = "";
    for (int s = 1; s <= 6; s++) {
        char name[32];
        snprintf(name, sizeof name, "checkpoint-%d", s);
        kept[s] = exists_in(prune, name);
        if (kept[s]) snprintf(kept_text + strlen(kept_text), sizeof kept_text - strlen(kept_text), " %d", s);
    }
    printf("save_total_limit 2, resumed from checkpoint-2 of a folder holding 1-6, 4 steps: kept%s "
           "(want 2 3 4 5 6: the source, this run's newest two, the earlier run's later ones)\n", kept_text);
    CHECK(!kept[1] && kept[2] && kept[3] && kept[4] && kept[5] && kept[6], "pruned the wrong checkpoints:%s", kept_text);

    /* 5. temporaries of killed runs */
    char tmp_dir[300];
    snprintf(tmp_dir, sizeof tmp_dir, "%s/temporaries", g_tmp);
    pid_t dead = fork();
    if (dead == 0) _exit(0);
    waitpid(dead, NULL, 0);
    sh("mkdir -p %s/checkpoint-9.tmp.%d %s/checkpoint-8.tmp.%d && touch %s/metrics.jsonl.tmp.%d "
       "%s/checkpoint-9.tmp.%d/model.safetensors",
       tmp_dir, (int)dead, tmp_dir, (int)getpid(), tmp_dir, (int)dead, tmp_dir, (int)dead);
    /* what a replacement killed half-way left: checkpoint-3 with a few small files beside its complete new
     * copy (an older colt deleted the old folder before the rename), and checkpoint-4 only aside */
    sh("mkdir -p %s/checkpoint-3 && cp %s/checkpoint-3/config.json %s/checkpoint-3/tokenizer.json %s/checkpoint-3/ && "
       "cp -r %s/checkpoint-3 %s/checkpoint-3.tmp.%d && cp -r %s/checkpoint-4 %s/checkpoint-4.old.%d",
       tmp_dir, ref, ref, tmp_dir, ref, tmp_dir, (int)dead, ref, tmp_dir, (int)dead);
    snprintf(args, sizeof args, "%s --max_steps 1 --output_dir %s", BASE, tmp_dir);
    code = run(args, &err);
    char *r3 = path_join(ref, "checkpoint-3"), *t3 = path_join(tmp_dir, "checkpoint-3"),
         *r4 = path_join(ref, "checkpoint-4"), *t4 = path_join(tmp_dir, "checkpoint-4");
    bool got3 = same_file(r3, t3, "model.safetensors") && same_file(r3, t3, "trainer_state.json") &&
                same_file(r3, t3, "optimizer.safetensors");
    bool got4 = same_file(r4, t4, "model.safetensors") && same_file(r4, t4, "trainer_state.json");
    printf("a killed replacement's leftovers: checkpoint-3 (a few files) restored from its complete .tmp copy: %s, "
           "checkpoint-4 (missing) from its .old copy: %s\n", got3 ? "yes" : "NO", got4 ? "yes" : "NO");
    CHECK(got3 && got4 && strstr(err, "restored"), "the start did not restore the complete copies: %s", err);
    free(r3), free(t3), free(r4), free(t4);
    char dead_ck[64], dead_metrics[64], live_ck[64];
    snprintf(dead_ck, sizeof dead_ck, "checkpoint-9.tmp.%d", (int)dead);
    snprintf(dead_metrics, sizeof dead_metrics, "metrics.jsonl.tmp.%d", (int)dead);
    snprintf(live_ck, sizeof live_ck, "checkpoint-8.tmp.%d", (int)getpid());
    printf("temporaries: a dead run's folder and file removed: %s, a live process's kept: %s\n",
           !exists_in(tmp_dir, dead_ck) && !exists_in(tmp_dir, dead_metrics) ? "yes" : "NO",
           exists_in(tmp_dir, live_ck) ? "yes" : "NO");
    CHECK(code == 0 && strstr(err, "removed 2 temporary"), "temporaries run: exit %d: %s", code, err);
    CHECK(!exists_in(tmp_dir, dead_ck) && !exists_in(tmp_dir, dead_metrics), "a dead run's temporaries were left");
    CHECK(exists_in(tmp_dir, live_ck), "a live process's temporary was removed");
    free(err);

    /* 6. write failures */
    printf("write failures:\n");
    sh("rm -rf %s && mkdir -p %s/completions.jsonl/x", out, out);
    snprintf(args, sizeof args, "%s --max_steps 2 --output_dir %s", BASE, out);
    expect_refused("completions.jsonl a folder", args, out, "completions.jsonl");
    sh("rm -rf %s && mkdir -p %s && ln -s /dev/full %s/completions.jsonl", out, out, out);
    snprintf(args, sizeof args, "%s --max_steps 6 --log_completions_count 2 --output_dir %s --resume_from_checkpoint %s",
             BASE, out, ck3);
    code = run(args, &err);
    expect_stopped("completions.jsonl a link to /dev/full", code, err, out, "not a regular file");
    CHECK(strstr(last_line(err), "completions.jsonl"), "the error does not name completions.jsonl: %s", err);
    free(err);
    /* metrics.jsonl: a file-size limit just above what the resume keeps of it */
    sh("rm -rf %s && mkdir -p %s && (head -n 3 %s/metrics.jsonl; i=0; while [ $i -lt 40 ]; do "
       "printf '{\"step\": 1, \"pad\": \"%%04000d\"}\\n' 0; i=$((i+1)); done) > %s/metrics.jsonl",
       out, out, ref, out);
    char *metrics_path = path_join(out, "metrics.jsonl");
    struct stat st;
    long limit = stat(metrics_path, &st) == 0 ? (long)st.st_size + 512 : 1 << 20;
    free(metrics_path);
    snprintf(args, sizeof args, "%s --max_steps 6 --save_steps 0 --output_dir %s --resume_from_checkpoint %s", BASE,
             out, ck3);
    code = run_file_limited(args, limit, &err);
    expect_stopped("metrics.jsonl past a file-size limit", code, err, out, "File too large");
    CHECK(strstr(last_line(err), "metrics.jsonl"), "the error does not name metrics.jsonl: %s", err);
    free(err);

    /* 7. kill -9 at random moments */
    char u_dir[300];
    snprintf(u_dir, sizeof u_dir, "%s/uninterrupted", g_tmp);
    snprintf(args, sizeof args, "%s --max_steps 12 --save_steps 1 --output_dir %s", BASE, u_dir);
    double started = now_s();
    code = run(args, &err);
    double step_s = (now_s() - started) / 12;
    CHECK(code == 0, "uninterrupted run: exit %d: %s", code, err);
    free(err);
    printf("uninterrupted run: 12 steps, %.3f s a step (start included)\n", step_s);
    kill_loop(u_dir, step_s);
    replace_loop(u_dir);

    free(state_before);
    sh("rm -rf %s", g_tmp);
    printf("%d checks, %d failed\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
