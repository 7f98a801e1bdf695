/* test_hub_cache.c — models named as TRL users name them ("ORG/NAME"), found in a Hugging Face cache
 * that the test lays out as huggingface_hub does (models--ORG--NAME/refs/main holding a commit,
 * snapshots/COMMIT/ of symlinks into blobs/, a tag, an older commit):
 *   - hub_cache_model_folder: a folder stays itself; a name resolves to the snapshot of main, of a
 *     tag, of a commit; $HF_HUB_CACHE before $HF_HOME/hub before ~/.cache; a name the cache lacks, a
 *     missing revision, a ref whose snapshot is gone and a bad revision are one-line errors naming
 *     the cache and the `hf download` command;
 *   - end to end: `colt generate --model ORG/NAME` prints what the folder itself gives, `colt train`
 *     with model: ORG/NAME and model_revision trains, `colt score` and `colt tokenize` read it,
 *     and a name the cache lacks is one line on stderr, exit 1. */
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/error.h"
#include "harness.h"
#include "model/hub_cache.h"

#define MODEL_DIR COLT_SOURCE_DIR "/models/stories260K"
#define MAIN_COMMIT "0123456789abcdef0123456789abcdef01234567"
#define OLD_COMMIT "89abcdef0123456789abcdef0123456789abcdef"

/* g_tmp/CACHE/models--test-org--tiny-stories: blobs, two snapshots (main and the tag v1 at one
 * commit, an older commit beside it) and refs. */
static void make_cache(const char *cache) {
    char repo[600];
    snprintf(repo, sizeof repo, "%s/models--test-org--tiny-stories", cache);
    sh("mkdir -p %s/blobs %s/refs %s/snapshots/" MAIN_COMMIT " %s/snapshots/" OLD_COMMIT, repo, repo, repo, repo);
    const char *files[] = {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"};
    for (int i = 0; i < 4; i++) {
        sh("cp " MODEL_DIR "/%s %s/blobs/blob%d && ln -s ../../blobs/blob%d %s/snapshots/" MAIN_COMMIT "/%s", files[i],
           repo, i, i, repo, files[i]);
        sh("ln -s ../../blobs/blob%d %s/snapshots/" OLD_COMMIT "/%s", i, repo, files[i]);
    }
    sh("printf " MAIN_COMMIT " > %s/refs/main && printf '" MAIN_COMMIT "\\n' > %s/refs/v1", repo, repo);
    sh("printf 0000000000000000000000000000000000000000 > %s/refs/gone", repo);
}

static void expect_folder(const char *model, const char *revision, const char *want_suffix) {
    char err[ERR_LEN] = "", *out = NULL;
    int rc = hub_cache_model_folder(&out, model, revision, err);
    size_t n = out ? strlen(out) : 0, m = strlen(want_suffix);
    CHECK(rc == 0 && out && n >= m && strcmp(out + n - m, want_suffix) == 0, "%s @ %s: rc %d, %s, want ...%s: %s", model,
          revision ? revision : "(null)", rc, out ? out : "(null)", want_suffix, err);
    free(out);
}

static void expect_error(const char *model, const char *revision, const char *words, const char *more) {
    char err[ERR_LEN] = "", *out = NULL;
    int rc = hub_cache_model_folder(&out, model, revision, err);
    CHECK(rc != 0 && !out && strstr(err, words) && (!more || strstr(err, more)) && !strchr(err, '\n'),
          "%s @ %s: rc %d, error '%s', want '%s' and '%s'", model, revision ? revision : "(null)", rc, err, words,
          more ? more : "");
    free(out);
}

static void check_library(const char *cache) {
    char home[600];
    setenv("HF_HUB_CACHE", cache, 1);
    expect_folder(MODEL_DIR, NULL, "models/stories260K");
    expect_folder("test-org/tiny-stories", NULL, "models--test-org--tiny-stories/snapshots/" MAIN_COMMIT);
    expect_folder("test-org/tiny-stories", "main", "/snapshots/" MAIN_COMMIT);
    expect_folder("test-org/tiny-stories", "v1", "/snapshots/" MAIN_COMMIT);
    expect_folder("test-org/tiny-stories", OLD_COMMIT, "/snapshots/" OLD_COMMIT);
    expect_folder("./not/a/name/x", NULL, "./not/a/name/x"); /* a path: the loader says it is missing */
    expect_error("test-org/other-model", NULL, "not in the Hugging Face cache", "hf download test-org/other-model");
    expect_error("test-org/tiny-stories", "v9", "has no revision 'v9'", "hf download test-org/tiny-stories --revision v9");
    expect_error("test-org/tiny-stories", "gone", "the Hugging Face cache has no", "snapshots/0000");
    expect_error("test-org/tiny-stories", "../../etc", "is not a branch, tag or commit", NULL);
    /* which cache: HF_HUB_CACHE, else HF_HOME/hub, else ~/.cache/huggingface/hub */
    unsetenv("HF_HUB_CACHE");
    snprintf(home, sizeof home, "%s/hf_home", g_tmp);
    sh("mkdir -p %s && ln -s %s %s/hub", home, cache, home);
    setenv("HF_HOME", home, 1);
    expect_folder("test-org/tiny-stories", NULL, "hf_home/hub/models--test-org--tiny-stories/snapshots/" MAIN_COMMIT);
    unsetenv("HF_HOME");
    unsetenv("XDG_CACHE_HOME");
    char *old_home = getenv("HOME") ? strdup(getenv("HOME")) : NULL;
    snprintf(home, sizeof home, "%s/user", g_tmp);
    sh("mkdir -p %s/.cache/huggingface && ln -s %s %s/.cache/huggingface/hub", home, cache, home);
    setenv("HOME", home, 1);
    expect_folder("test-org/tiny-stories", NULL, "user/.cache/huggingface/hub/models--test-org--tiny-stories/snapshots/"
                                                 MAIN_COMMIT);
    expect_error("test-org/missing", NULL, ".cache/huggingface/hub", "the default");
    if (old_home) setenv("HOME", old_home, 1);
    free(old_home);
    printf("hub_cache_model_folder: main, a tag, a commit, three cache variables, 4 errors\n");
}

/* Runs a shell command with HF_HUB_CACHE set; its stdout into g_tmp/NAME.out, stderr .err; exit status. */
static int run(const char *cache, const char *name, const char *cmd) {
    char full[4096];
    snprintf(full, sizeof full, "cd %s && export HF_HUB_CACHE=%s OMP_NUM_THREADS=1 && { %s; } > %s.out 2> %s.err", g_tmp, cache, cmd,
             name, name);
    int status = system(full);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static void check_commands(const char *cache) {
    int a = run(cache, "gen_folder", COLT_BINARY " generate --model " MODEL_DIR " --prompt 'Once upon' --max_new_tokens 12");
    int b = run(cache, "gen_hub", COLT_BINARY " generate --model test-org/tiny-stories --prompt 'Once upon' --max_new_tokens 12");
    char *ta = read_text(g_tmp, "gen_folder.out"), *tb = read_text(g_tmp, "gen_hub.out");
    CHECK(a == 0 && b == 0 && ta && tb && strlen(ta) > 10 && strcmp(ta, tb) == 0,
          "colt generate: the folder (exit %d) and the Hub name (exit %d) print '%s' and '%s'", a, b, ta, tb);
    printf("colt generate --model test-org/tiny-stories: the same greedy text as the folder: %s\n",
           ta && tb && !strcmp(ta, tb) ? "yes" : "NO");
    free(ta), free(tb);

    int c = run(cache, "score", "echo '{\"ids\": [1, 403, 407, 261, 378]}' | " COLT_BINARY
                                " score --model test-org/tiny-stories");
    int d = run(cache, "tok", "echo '{\"text\": \"Once upon a time\"}' | " COLT_BINARY " tokenize --model test-org/tiny-stories");
    char *ts = read_text(g_tmp, "score.out"), *tt = read_text(g_tmp, "tok.out");
    CHECK(c == 0 && ts && strstr(ts, "\"logprobs\""), "colt score with a Hub name: exit %d: %s", c, ts);
    CHECK(d == 0 && tt && strstr(tt, "\"ids\""), "colt tokenize with a Hub name: exit %d: %s", d, tt);
    free(ts), free(tt);

    int e = run(cache, "train",
                COLT_BINARY " train --config " COLT_SOURCE_DIR "/examples/demo.yaml --model test-org/tiny-stories "
                            "--dataset " COLT_SOURCE_DIR "/examples/data/demo_train.jsonl --model_revision v1 "
                            "--max_steps 1 --eval_dataset null --save_steps 0 --output_dir run");
    char *te = read_text(g_tmp, "train.err");
    CHECK(e == 0 && exists_in(g_tmp, "run/model.safetensors") && te && strstr(te, "snapshots/" MAIN_COMMIT),
          "colt train with model test-org/tiny-stories, model_revision v1: exit %d: %s", e, te);
    printf("colt train --model test-org/tiny-stories --model_revision v1: exit %d, model saved: %s\n", e,
           exists_in(g_tmp, "run/model.safetensors") ? "yes" : "no");
    free(te);

    int f = run(cache, "missing", COLT_BINARY " generate --model test-org/nowhere --prompt x");
    int g = run(cache, "missing_train", COLT_BINARY " train --config " COLT_SOURCE_DIR "/examples/demo.yaml "
                                        "--model test-org/nowhere --dataset " COLT_SOURCE_DIR "/examples/data/demo_train.jsonl --output_dir run2");
    char *tf = read_text(g_tmp, "missing.err"), *tg = read_text(g_tmp, "missing_train.err");
    CHECK(f == 1 && tf && count_lines(tf) == 1 && strstr(tf, "colt generate: model 'test-org/nowhere': no such folder") &&
              strstr(tf, "hf download test-org/nowhere"),
          "a name the cache lacks (generate): exit %d: %s", f, tf);
    CHECK(g == 1 && tg && count_lines(tg) == 1 && strstr(tg, "colt train: model 'test-org/nowhere'") &&
              !exists_in(g_tmp, "run2"),
          "a name the cache lacks (train): exit %d: %s", g, tg);
    printf("a name the cache lacks: %s", tf ? tf : "(nothing)\n");
    free(tf), free(tg);
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_test_hub_cache_XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    char cache[400];
    snprintf(cache, sizeof cache, "%s/cache", g_tmp);
    make_cache(cache);
    check_library(cache);
    check_commands(cache);
    sh("rm -rf %s", g_tmp);
    printf("%d checks, %d failed\n", g_checks, g_failures);
    return g_failures ? 1 : 0;
}
