/* hub_cache.c — Hub model names resolved in the local Hugging Face cache (hub_cache.h).
 *
 * The cache's layout, as huggingface_hub writes it: CACHE/models--ORG--NAME/refs/REVISION holds a commit
 * hash, and CACHE/models--ORG--NAME/snapshots/COMMIT/ is the model folder (symlinks into blobs/). The
 * cache folder is the first of $HF_HUB_CACHE, $HUGGINGFACE_HUB_CACHE (the older name), $HF_HOME/hub,
 * $XDG_CACHE_HOME/huggingface/hub and ~/.cache/huggingface/hub. */
#include "model/hub_cache.h"

#include <ctype.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/error.h"
#include "core/fileio.h"

static bool is_folder(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* "NAME" or "ORG/NAME" of letters, digits, '-', '_' and '.', no part "." or "..": what the Hub accepts
 * and nothing a path would look like (absolute, ./x, a/b/c). */
static bool is_hub_name(const char *s) {
    int slashes = 0;
    size_t part = 0;
    for (const char *p = s;; p++) {
        if (*p == '/' || *p == '\0') {
            if (part == 0 || (part == 1 && p[-1] == '.') || (part == 2 && p[-1] == '.' && p[-2] == '.')) return false;
            if (*p == '\0') break;
            slashes++;
            part = 0;
            continue;
        }
        if (!isalnum((unsigned char)*p) && *p != '-' && *p != '_' && *p != '.') return false;
        part++;
    }
    return slashes <= 1 && strlen(s) <= 200;
}

static bool is_commit(const char *s) {
    size_t n = 0;
    for (; s[n]; n++)
        if (!isxdigit((unsigned char)s[n])) return false;
    return n == 40;
}

/* The cache folder (malloc'd) and the variable it came from. */
static char *cache_folder(const char **source) {
    const char *v;
    if ((v = getenv("HF_HUB_CACHE")) && *v) return *source = "$HF_HUB_CACHE", strdup(v);
    if ((v = getenv("HUGGINGFACE_HUB_CACHE")) && *v) return *source = "$HUGGINGFACE_HUB_CACHE", strdup(v);
    if ((v = getenv("HF_HOME")) && *v) return *source = "$HF_HOME/hub", path_join(v, "hub");
    if ((v = getenv("XDG_CACHE_HOME")) && *v) return *source = "$XDG_CACHE_HOME", path_join(v, "huggingface/hub");
    *source = "the default";
    return path_join((v = getenv("HOME")) && *v ? v : "/", ".cache/huggingface/hub");
}

int hub_cache_model_folder(char **out, const char *model, const char *revision, char *err) {
    *out = NULL;
    if (is_folder(model) || !is_hub_name(model)) {
        *out = strdup(model);
        return COLT_OK;
    }
    const char *rev = revision && *revision ? revision : "main";
    if (strstr(rev, "..") || rev[0] == '/')
        return errorf(err, "model_revision '%.100s' is not a branch, tag or commit", rev);
    const char *source;
    char *cache = cache_folder(&source), repo_dir[1024], commit[128] = "";
    int n = snprintf(repo_dir, sizeof repo_dir, "%s/models--", cache);
    for (const char *p = model; *p && n < (int)sizeof repo_dir - 3; p++) {
        if (*p == '/') repo_dir[n++] = '-', repo_dir[n++] = '-';
        else repo_dir[n++] = *p;
    }
    repo_dir[n] = '\0';
    int rc = COLT_ERR;
    char rev_arg[160] = "";
    if (strcmp(rev, "main") != 0) snprintf(rev_arg, sizeof rev_arg, " --revision %.100s", rev);
    if (!is_folder(repo_dir)) {
        errorf(err, "model '%.200s': no such folder, and not in the Hugging Face cache (%.300s, %s); if it is a Hub "
                    "model, download it first: hf download %.200s%s (colt reads local files only)",
               model, cache, source, model, rev_arg);
        goto done;
    }
    if (is_commit(rev)) {
        snprintf(commit, sizeof commit, "%s", rev);
    } else {
        char ref_name[1200], *text = NULL;
        size_t len = 0;
        snprintf(ref_name, sizeof ref_name, "%s/refs/%s", repo_dir, rev);
        if (file_read_all(ref_name, &text, &len, NULL) != 0) {
            errorf(err, "model '%.200s': the Hugging Face cache (%.300s) has no revision '%.100s' (no refs/%.100s): "
                        "download it: hf download %.200s%s",
                   model, repo_dir, rev, rev, model, rev_arg);
            goto done;
        }
        size_t k = 0;
        while (k < len && k + 1 < sizeof commit && !isspace((unsigned char)text[k])) commit[k] = text[k], k++;
        commit[k] = '\0';
        free(text);
        if (!is_commit(commit)) {
            errorf(err, "model '%.200s': %.300s/refs/%.100s does not hold a commit hash", model, repo_dir, rev);
            goto done;
        }
    }
    char *snapshot = xmalloc(strlen(repo_dir) + 64);
    sprintf(snapshot, "%s/snapshots/%s", repo_dir, commit);
    if (!is_folder(snapshot)) {
        errorf(err, "model '%.200s': revision '%.100s' is commit %s, but the Hugging Face cache has no %.300s: "
                    "download it: hf download %.200s%s",
               model, rev, commit, snapshot, model, rev_arg);
        free(snapshot);
        goto done;
    }
    *out = snapshot;
    rc = COLT_OK;
done:
    free(cache);
    return rc;
}
