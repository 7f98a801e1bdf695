/* test_tensorboard.c — TensorBoard event files (src/train/tensorboard.c):
 * CRC32C against RFC 3720's vectors and a table-driven CRC of the test's own;
 * the writer's bytes against tests/data/tensorboard/golden.tfevents, which
 * TensorBoard's own RecordWriter wrote from TensorBoard's Event protos
 * (tests/ref/make_tensorboard_goldens.py); a reader here (framing, both masked
 * CRCs, protobuf-c decoding) against golden.json, what TensorBoard's reader read
 * from it; a corrupted byte caught; a metrics line mirrored with transformers'
 * tags; the log folder's choice; and `colt train` with report_to: tensorboard,
 * every metrics.jsonl number found in the events at its step (and, when Python's
 * tensorboard is installed, the golden script's --check with TensorBoard's
 * EventAccumulator). Exits 77 (skipped) in a build without protobuf-c. */
#include <dirent.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fileio.h"
#include "harness.h"
#include "train/tensorboard.h"

#ifdef COLT_HAVE_PROTOBUF_C
#include "tensorboard_event.pb-c.h"
#endif

#define GOLDEN_DIR COLT_SOURCE_DIR "/tests/data/tensorboard"
#define WALL_TIME 1700000000.25

/* ---------------------------------------------------------------- CRC32C */

/* Table-driven CRC32C, the test's own (the writer's is bit by bit). */
static uint32_t crc32c_table(const void *data, size_t n) {
    static uint32_t table[256];
    if (!table[1])
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int b = 0; b < 8; b++) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;
            table[i] = c;
        }
    const uint8_t *p = data;
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) crc = table[(crc ^ p[i]) & 0xFF] ^ (crc >> 8);
    return ~crc;
}

static uint32_t unmask(uint32_t masked) {
    uint32_t rot = masked - 0xa282ead8u;
    return (rot >> 17) | (rot << 15);
}

static void test_crc(void) {
    uint8_t zeros[32] = {0}, ones[32], ascending[32];
    memset(ones, 0xFF, sizeof ones);
    for (int i = 0; i < 32; i++) ascending[i] = (uint8_t)i;
    struct { const void *data; size_t n; uint32_t want; const char *what; } v[] = {
        {"123456789", 9, 0xE3069283u, "\"123456789\""},
        {zeros, 32, 0x8A9136AAu, "32 zero bytes (RFC 3720 B.4)"},
        {ones, 32, 0x62A8AB43u, "32 0xFF bytes (RFC 3720 B.4)"},
        {ascending, 32, 0x46DD794Eu, "bytes 0..31 (RFC 3720 B.4)"},
        {"", 0, 0x00000000u, "nothing"},
    };
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        uint32_t got = tensorboard_crc32c(v[i].data, v[i].n), table = crc32c_table(v[i].data, v[i].n);
        CHECK(got == v[i].want && table == v[i].want, "crc32c of %s: writer %08x, table %08x, want %08x", v[i].what,
              got, table, v[i].want);
        printf("  crc32c %-30s %08x (want %08x)\n", v[i].what, got, v[i].want);
        CHECK(unmask(tensorboard_masked_crc(got)) == got, "mask of %08x does not unmask", got);
    }
    /* random lengths and bytes: bit by bit = table-driven */
    uint8_t buf[1000];
    int differ = 0;
    for (int n = 0; n < 1000; n += 7) {
        for (int i = 0; i < n; i++) buf[i] = (uint8_t)(i * 131 + n * 7 + 3);
        differ += tensorboard_crc32c(buf, (size_t)n) != crc32c_table(buf, (size_t)n);
    }
    CHECK(differ == 0, "crc32c: %d lengths where the writer's differs from the table's", differ);
    printf("crc32c: 5 known vectors, 143 lengths equal to a table-driven CRC (%d differ)\n", differ);
}

#ifdef COLT_HAVE_PROTOBUF_C
/* ---------------------------------------------------------------- reader */

typedef struct ReadEvent {
    double wall_time;
    int64_t step;
    char file_version[64];
    char tag[128];
    float value;
    bool is_scalar;
} ReadEvent;

/* Reads every record of an event file: framing, both masked CRCs (the test's
 * table CRC), protobuf-c decoding. Returns the count, or -1 with why. */
static int read_events(const char *path, ReadEvent **out, char *why, size_t why_n) {
    char *data = NULL;
    size_t len = 0;
    *out = NULL;
    if (file_read_all(path, &data, &len, NULL) != 0) {
        snprintf(why, why_n, "cannot read %s", path);
        return -1;
    }
    const uint8_t *p = (const uint8_t *)data;
    size_t at = 0;
    int n = 0;
    ReadEvent *ev = NULL;
    while (at < len) {
        if (len - at < 12) {
            snprintf(why, why_n, "record %d: %zu bytes left, a header needs 12", n, len - at);
            goto bad;
        }
        uint64_t size = 0;
        uint32_t len_crc = 0, data_crc = 0;
        for (int i = 0; i < 8; i++) size |= (uint64_t)p[at + i] << (8 * i);
        for (int i = 0; i < 4; i++) len_crc |= (uint32_t)p[at + 8 + i] << (8 * i);
        if (unmask(len_crc) != crc32c_table(p + at, 8)) {
            snprintf(why, why_n, "record %d: the length's CRC is wrong", n);
            goto bad;
        }
        if (size > len - at - 12 || len - at - 12 - size < 4) {
            snprintf(why, why_n, "record %d: %llu bytes of data do not fit", n, (unsigned long long)size);
            goto bad;
        }
        const uint8_t *body = p + at + 12;
        for (int i = 0; i < 4; i++) data_crc |= (uint32_t)body[size + i] << (8 * i);
        if (unmask(data_crc) != crc32c_table(body, size)) {
            snprintf(why, why_n, "record %d: the data's CRC is wrong", n);
            goto bad;
        }
        Tensorboard__Event *e = tensorboard__event__unpack(NULL, size, body);
        if (!e) {
            snprintf(why, why_n, "record %d: not an Event", n);
            goto bad;
        }
        ev = realloc(ev, sizeof(ReadEvent) * (size_t)(n + 1));
        ReadEvent *r = &ev[n++];
        memset(r, 0, sizeof *r);
        r->wall_time = e->wall_time;
        r->step = e->step;
        if (e->what_case == TENSORBOARD__EVENT__WHAT_FILE_VERSION)
            snprintf(r->file_version, sizeof r->file_version, "%s", e->file_version);
        if (e->what_case == TENSORBOARD__EVENT__WHAT_SUMMARY && e->summary->n_value == 1 &&
            e->summary->value[0]->value_case == TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE) {
            r->is_scalar = true;
            snprintf(r->tag, sizeof r->tag, "%s", e->summary->value[0]->tag);
            r->value = e->summary->value[0]->simple_value;
        }
        tensorboard__event__free_unpacked(e, NULL);
        at += 12 + size + 4;
    }
    free(data);
    *out = ev;
    return n;
bad:
    free(data);
    free(ev);
    return -1;
}

/* ---------------------------------------------------------------- golden */

/* What make_tensorboard_goldens.py writes, in order. */
static const struct { const char *tag; double value; int64_t step; } SCALARS[] = {
    {"train/reward", 0.5, 1},
    {"train/loss", -0.0123, 1},
    {"train/kl", 1e-5, 1},
    {"train/rewards/park/mean", 0.875, 1},
    {"eval/reward", 0.25, 1},
    {"train/reward", 0.75, 2},
    {"train/learning_rate", 3e-6, 2},
    {"train/num_tokens", 123456789.0, 2},
    {"train/big_step", -1e30, 1000000000000LL},
    {"train/zero", 0.0, 0},
};
#define N_SCALARS (int)(sizeof SCALARS / sizeof SCALARS[0])

static void test_golden(void) {
    char path[512], err[ERR_LEN], why[256];
    snprintf(path, sizeof path, "%s/golden.tfevents", g_tmp);
    TensorboardWriter *w = NULL;
    int rc = tensorboard_open_file(&w, path, WALL_TIME, err);
    CHECK(rc == 0, "open %s: %s", path, err);
    if (rc != 0) return;
    for (int i = 0; i < N_SCALARS && rc == 0; i++)
        rc = tensorboard_add_scalar(w, SCALARS[i].tag, SCALARS[i].value, SCALARS[i].step, err);
    CHECK(rc == 0 && tensorboard_close(w, err) == 0, "write: %s", err);

    char *mine = NULL, *gold = NULL;
    size_t mine_len = 0, gold_len = 0;
    file_read_all(path, &mine, &mine_len, NULL);
    int grc = file_read_all(GOLDEN_DIR "/golden.tfevents", &gold, &gold_len, err);
    CHECK(grc == 0, "%s", err);
    size_t first_diff = 0;
    while (mine && gold && first_diff < mine_len && first_diff < gold_len && mine[first_diff] == gold[first_diff])
        first_diff++;
    bool same = mine && gold && mine_len == gold_len && first_diff == gold_len;
    CHECK(same, "colt's events (%zu bytes) differ from TensorBoard's RecordWriter's (%zu bytes) at byte %zu", mine_len,
          gold_len, first_diff);
    printf("golden: colt wrote %zu bytes for 1 file_version + %d scalar events; TensorBoard's RecordWriter %zu: %s\n",
           mine_len, N_SCALARS, gold_len, same ? "identical" : "DIFFERENT");
    free(mine), free(gold);

    /* the test's reader on the golden file, against what TensorBoard's reader read */
    ReadEvent *ev = NULL;
    int n = read_events(GOLDEN_DIR "/golden.tfevents", &ev, why, sizeof why);
    json_error_t jerr;
    json_t *want = json_load_file(GOLDEN_DIR "/golden.json", 0, &jerr);
    json_t *events = json_object_get(want, "events");
    CHECK(want && n == (int)json_array_size(events) && n == N_SCALARS + 1, "golden: read %d events (%s), want %zu", n,
          n < 0 ? why : "", json_array_size(events));
    int differ = 0;
    for (int i = 0; i < n && i < (int)json_array_size(events); i++) {
        json_t *e = json_array_get(events, (size_t)i);
        bool ok = ev[i].wall_time == json_real_value(json_object_get(e, "wall_time")) &&
                  ev[i].step == json_integer_value(json_object_get(e, "step"));
        if (i == 0) ok = ok && !ev[0].is_scalar && strcmp(ev[0].file_version, "brain.Event:2") == 0;
        else
            ok = ok && ev[i].is_scalar && strcmp(ev[i].tag, json_string_value(json_object_get(e, "tag"))) == 0 &&
                 (double)ev[i].value == json_number_value(json_object_get(e, "value")) &&
                 ev[i].value == (float)SCALARS[i - 1].value;
        if (!ok) {
            differ++;
            fprintf(stderr, "  event %d: %s step %lld value %.9g wall %.3f\n", i, ev[i].tag, (long long)ev[i].step,
                    ev[i].value, ev[i].wall_time);
        }
    }
    CHECK(differ == 0, "golden: %d events differ from golden.json", differ);
    printf("golden: the test's reader (framing, both CRCs, protobuf-c) reads %d events equal to TensorBoard's "
           "(%d differ)\n", n, differ);
    free(ev);
    json_decref(want);

    /* one flipped bit in the data, then in a length, is caught */
    char *bytes = NULL;
    size_t blen = 0;
    file_read_all(GOLDEN_DIR "/golden.tfevents", &bytes, &blen, NULL);
    const size_t flips[2] = {0x45, 0x28}; /* record 1's data; record 1's length CRC */
    const char *wants[2] = {"data's CRC", "length's CRC"};
    for (int k = 0; k < 2 && bytes; k++) {
        bytes[flips[k]] ^= 1;
        snprintf(path, sizeof path, "%s/corrupt.tfevents", g_tmp);
        file_write_atomic(path, bytes, blen, NULL);
        bytes[flips[k]] ^= 1;
        n = read_events(path, &ev, why, sizeof why);
        CHECK(n < 0 && strstr(why, wants[k]), "a flipped bit at byte %zu: read %d events (%s)", flips[k], n, why);
        printf("  bit flipped at byte %#zx: %s\n", flips[k], n < 0 ? why : "not caught");
        free(ev);
    }
    free(bytes);
}

/* A metrics line becomes transformers' tags at its step, in order; nulls skipped. */
static void test_metrics_line(void) {
    char path[512], err[ERR_LEN], why[256];
    snprintf(path, sizeof path, "%s/line.tfevents", g_tmp);
    TensorboardWriter *w = NULL;
    CHECK(tensorboard_open_file(&w, path, WALL_TIME, err) == 0, "%s", err);
    json_t *line = json_loads("{\"step\": 3, \"epoch\": 0.5, \"reward\": 0.25, \"loss\": null, \"eval_reward\": 0.75, "
                              "\"completions/mean_length\": 12, \"note\": \"text\"}",
                              0, NULL);
    int rc = w ? tensorboard_add_metrics(w, line, err) : -1;
    CHECK(rc == 0, "add_metrics: %s", err);
    json_t *no_step = json_loads("{\"reward\": 1}", 0, NULL);
    CHECK(w && tensorboard_add_metrics(w, no_step, err) != 0 && strstr(err, "without an integer step"),
          "a line without step: '%s'", err);
    tensorboard_close(w, NULL);
    ReadEvent *ev = NULL;
    int n = read_events(path, &ev, why, sizeof why);
    const char *tags[] = {"train/epoch", "train/reward", "eval/reward", "train/completions/mean_length"};
    const float values[] = {0.5f, 0.25f, 0.75f, 12.0f};
    bool ok = n == 5;
    for (int i = 0; ok && i < 4; i++)
        ok = ev[i + 1].is_scalar && strcmp(ev[i + 1].tag, tags[i]) == 0 && ev[i + 1].value == values[i] &&
             ev[i + 1].step == 3;
    CHECK(ok, "metrics line: %d events (%s)", n, n < 0 ? why : "tags, values or steps differ");
    printf("metrics line -> %d scalars at step 3: train/epoch, train/reward, eval/reward, "
           "train/completions/mean_length (null and text skipped)\n", n - 1);
    free(ev);
    json_decref(line);
    json_decref(no_step);
}

/* $TENSORBOARD_LOGGING_DIR, then logging_dir, then output_dir/runs/<Mon DD_HH-MM-SS>_<host>; file names. */
static void test_log_dir(void) {
    char err[ERR_LEN];
    unsetenv("TENSORBOARD_LOGGING_DIR");
    char *d = tensorboard_log_dir("out", NULL);
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    /* out/runs/Nov14_22-13-20_host */
    bool shaped = strncmp(d, "out/runs/", 9) == 0 && strlen(d) == 9 + 14 + 1 + strlen(host) && d[9 + 5] == '_' &&
                  d[9 + 8] == '-' && d[9 + 11] == '-' && d[9 + 14] == '_' && strcmp(d + 9 + 15, host) == 0;
    CHECK(shaped, "default log dir '%s'", d);
    printf("log dir: default %s\n", d);
    free(d);
    d = tensorboard_log_dir("out", "logs/tb");
    CHECK(strcmp(d, "logs/tb") == 0, "logging_dir: '%s'", d);
    free(d);
    setenv("TENSORBOARD_LOGGING_DIR", "/tmp/env_tb", 1);
    d = tensorboard_log_dir("out", "logs/tb");
    CHECK(strcmp(d, "/tmp/env_tb") == 0, "TENSORBOARD_LOGGING_DIR: '%s'", d);
    free(d);
    unsetenv("TENSORBOARD_LOGGING_DIR");

    /* two writers in one folder in the same second: .0 and .1 */
    char dir[512];
    snprintf(dir, sizeof dir, "%s/logs/a/b", g_tmp);
    TensorboardWriter *w1 = NULL, *w2 = NULL;
    int rc = tensorboard_open(&w1, dir, err);
    CHECK(rc == 0, "open in %s: %s", dir, err);
    rc = rc == 0 ? tensorboard_open(&w2, dir, err) : rc;
    CHECK(rc == 0, "second open: %s", err);
    if (rc == 0) {
        const char *p1 = strrchr(tensorboard_path(w1), '/') + 1, *p2 = strrchr(tensorboard_path(w2), '/') + 1;
        char want_end[300];
        snprintf(want_end, sizeof want_end, ".%s.%ld.", host, (long)getpid());
        bool named = strncmp(p1, "events.out.tfevents.", 20) == 0 && strspn(p1 + 20, "0123456789") == 10 &&
                     strstr(p1, want_end) && p1[strlen(p1) - 1] != p2[strlen(p2) - 1];
        CHECK(named, "event file names %s, %s", p1, p2);
        printf("event files: %s, %s\n", p1, p2);
    }
    tensorboard_close(w1, NULL);
    tensorboard_close(w2, NULL);
}

/* ---------------------------------------------------------------- colt train */

/* The one event file under dir (depth 2: runs/<stamp>_<host>/events...). */
static bool find_event_file(char *out, size_t n, const char *runs) {
    DIR *d = opendir(runs);
    struct dirent *e;
    int found = 0;
    while (d && (e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char sub[1024];
        snprintf(sub, sizeof sub, "%s/%s", runs, e->d_name);
        DIR *s = opendir(sub);
        struct dirent *f;
        while (s && (f = readdir(s)))
            if (strncmp(f->d_name, "events.out.tfevents.", 20) == 0) {
                snprintf(out, n, "%s/%s", sub, f->d_name);
                found++;
            }
        if (s) closedir(s);
    }
    if (d) closedir(d);
    return found == 1;
}

static void test_train_run(void) {
    char yaml[512], cmd[4096], out_dir[512], events[1400], why[256];
    snprintf(out_dir, sizeof out_dir, "%s/run", g_tmp);
    snprintf(yaml, sizeof yaml, "%s/tb.yaml", g_tmp);
    FILE *fp = fopen(yaml, "w");
    fprintf(fp,
            "model: %s/models/stories260K\ndataset: %s/examples/data/demo_train.jsonl\n"
            "eval_dataset: %s/examples/data/demo_eval.jsonl\nnum_eval_prompts: 2\noutput_dir: %s\n"
            "reward_funcs: [{type: regex, name: park, pattern: park}]\nnum_generations: 4\n"
            "per_device_train_batch_size: 8\nmax_completion_length: 8\nmax_steps: 2\nlogging_steps: 1\n"
            "eval_steps: 1\nsave_steps: 0\nbeta: 0.1\nlearning_rate: 1.0e-3\nlog_completions_count: 0\n"
            "report_to: tensorboard\ndevice: cpu\n",
            COLT_SOURCE_DIR, COLT_SOURCE_DIR, COLT_SOURCE_DIR, out_dir);
    fclose(fp);
    snprintf(cmd, sizeof cmd, "env -u TENSORBOARD_LOGGING_DIR %s train --config %s > %s/train.log 2>&1", COLT_BINARY,
             yaml, g_tmp);
    int status = system(cmd);
    CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "colt train with report_to tensorboard failed (see %s/train.log)",
          g_tmp);
    char runs[600];
    snprintf(runs, sizeof runs, "%s/runs", out_dir);
    bool found = find_event_file(events, sizeof events, runs);
    CHECK(found, "no single event file under %s", runs);
    if (!found) return;
    ReadEvent *ev = NULL;
    int n = read_events(events, &ev, why, sizeof why);
    CHECK(n > 1 && strcmp(ev[0].file_version, "brain.Event:2") == 0, "%s: %d events (%s)", events, n, why);
    /* every number of every metrics.jsonl line is an event at its step: the same double as a 32-bit float,
     * up to metrics.jsonl's 8 significant digits (relative 5e-8) and the float's rounding (6e-8) */
    char mpath[600];
    snprintf(mpath, sizeof mpath, "%s/metrics.jsonl", out_dir);
    FILE *m = fopen(mpath, "r");
    char *line = NULL;
    size_t cap = 0;
    int compared = 0, missing = 0, eval_lines = 0;
    while (m && getline(&line, &cap, m) > 0) {
        json_t *o = json_loads(line, 0, NULL);
        int64_t step = json_integer_value(json_object_get(o, "step"));
        eval_lines += json_object_get(o, "eval_reward") != NULL;
        const char *key;
        json_t *v;
        json_object_foreach(o, key, v) {
            if (strcmp(key, "step") == 0 || !json_is_number(v)) continue;
            char tag[256];
            if (strncmp(key, "eval_", 5) == 0) snprintf(tag, sizeof tag, "eval/%s", key + 5);
            else snprintf(tag, sizeof tag, "train/%s", key);
            bool hit = false;
            for (int i = 1; i < n && !hit; i++)
                hit = ev[i].step == step && strcmp(ev[i].tag, tag) == 0 &&
                      fabs(ev[i].value - json_number_value(v)) <= 1.2e-7 * fabs(json_number_value(v));
            compared++;
            if (!hit) {
                missing++;
                fprintf(stderr, "  no event %s = %g at step %lld\n", tag, json_number_value(v), (long long)step);
            }
        }
        json_decref(o);
    }
    free(line);
    if (m) fclose(m);
    int eval_points = 0, kl = 0;
    int64_t eval_steps[4] = {-1, -1, -1, -1};
    for (int i = 1; i < n; i++) {
        if (strcmp(ev[i].tag, "eval/reward") == 0 && eval_points < 4) eval_steps[eval_points++] = ev[i].step;
        kl += strcmp(ev[i].tag, "train/kl") == 0;
    }
    CHECK(compared > 40 && missing == 0, "%d metrics.jsonl values, %d not in the events", compared, missing);
    CHECK(eval_lines == 1, "metrics.jsonl: %d eval_reward lines, want 1 (eval_steps 1 of 2 steps: step 1)", eval_lines);
    CHECK(eval_points == 3 && eval_steps[0] == 0 && eval_steps[1] == 1 && eval_steps[2] == 2 && kl == 2,
          "eval/reward at steps %lld %lld %lld (want 0 1 2), train/kl %d times", (long long)eval_steps[0],
          (long long)eval_steps[1], (long long)eval_steps[2], kl);
    printf("colt train report_to tensorboard: %s: %d events; all %d metrics.jsonl values there at their steps (%d "
           "missing); eval/reward at steps 0, 1, 2\n",
           strstr(events, "/runs/"), n, compared, missing);
    free(ev);

    /* TensorBoard's own reader, when Python has it */
    if (system("python3 -c 'import tensorboard' > /dev/null 2>&1") == 0) {
        snprintf(cmd, sizeof cmd, "python3 %s/tests/ref/make_tensorboard_goldens.py --check %s --expect-eval 3",
                 COLT_SOURCE_DIR, out_dir);
        printf("  %s\n  ", cmd);
        fflush(stdout);
        status = system(cmd);
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0, "TensorBoard's EventAccumulator disagrees (exit %d)",
              WEXITSTATUS(status));
    } else {
        printf("SKIPPED: reading the run with TensorBoard's EventAccumulator (python3 has no tensorboard: pip install "
               "tensorboard)\n");
    }
}
#endif

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_test_tensorboard_%d", (int)getpid());
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf %s && mkdir -p %s", g_tmp, g_tmp);
    if (system(cmd) != 0) return 1;
    test_crc();
#ifdef COLT_HAVE_PROTOBUF_C
    test_golden();
    test_metrics_line();
    test_log_dir();
    test_train_run();
#else
    char err[ERR_LEN];
    TensorboardWriter *w = NULL;
    CHECK(tensorboard_open(&w, g_tmp, err) != 0 && strstr(err, "without protobuf-c"), "without protobuf-c: '%s'", err);
    printf("SKIPPED: event files (this build has no protobuf-c: %s)\n", err);
#endif
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_tmp);
    if (g_failures == 0 && system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
    printf("%s: %d checks, %d failed\n", g_failures ? "FAIL" : "OK", g_checks, g_failures);
#ifndef COLT_HAVE_PROTOBUF_C
    if (g_failures == 0) return 77;
#endif
    return g_failures ? 1 : 0;
}
