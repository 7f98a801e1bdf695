/* rewards.c — the built-in reward functions (length, regex, math) and the
 * external-program reward's JSON protocol, with TRL's semantics: one float per
 * completion, NaN where the function has no opinion (TRL's None).
 *
 * regex: PCRE2 with UTF and Unicode character classes (like Python's re on
 * str), searched anywhere in the completion; a pattern that wants the whole
 * completion anchors itself, as TRL's format rewards do ("^<think>.*?</think>
 * <answer>.*?</answer>$" with flags "s"). Python's re.match anchors at the
 * start only; write "^" to get that.
 *
 * math: answers are compared numerically when both parse as numbers (plain,
 * fractions a/b, \frac{a}{b}), with 1e-6 relative tolerance, else as
 * normalised strings. This is not a symbolic checker (math_verify): "\sqrt{2}"
 * and "\frac{\sqrt{8}}{2}" are different answers here.
 *
 * Every reward is a finite 32-bit float or NaN: a value that overflows fp32
 * (1e39 is finite as a double) is an error naming the reward and the
 * completion, not an Inf that becomes a NaN metric and zeroed advantages.
 * Spec values that become rewards (length's target, regex's reward) are
 * checked when the reward is created.
 *
 * python: a TRL reward function, reward_func(prompts, completions,
 * completion_ids, **columns) -> list of float or None, run by colt's worker
 * (src/data/reward_worker.py, embedded in the binary) in a Python process
 * started once per file and interpreter: the rewards that name functions of one
 * file share that process, so the file is imported once. colt links no Python.
 *
 * model: a sequence-classification reward model (model.h
 * model_load_classifier) loaded once on the caller's backend with its own
 * tokenizer, scoring the texts TRL builds (rewards.h).
 *
 * The process plumbing is in reward_process.c. */
#include "data/rewards.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"
#include "data/prompt.h"
#include "data/reward_judge.h"
#include "data/reward_process.h"
#include "model/hub_cache.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "reward_worker_py.h" /* REWARD_WORKER_SOURCE: src/data/reward_worker.py, embedded at build time */

typedef enum { REWARD_LENGTH, REWARD_REGEX, REWARD_MATH, REWARD_COMMAND, REWARD_PYTHON, REWARD_MODEL, REWARD_JUDGE } RewardType;

enum {
    COMMAND_TIMEOUT_S = 30, /* default seconds per call of a command reward */
    PYTHON_TIMEOUT_S = 120, /* default seconds per call of a python reward, and at least this to import its file */
};

/* A Python process serving the functions of one file (or module) for every
 * reward that names them; freed with its last reward. */
typedef struct PythonWorker {
    struct PythonWorker *next;
    char *key;              /* what it imported and with which interpreter: shared when equal */
    RewardProcess *process;
    int refs;
} PythonWorker;

/* The live workers. Rewards are created and freed on one thread (the main
 * one: see reward_process.c on PR_SET_PDEATHSIG). */
static PythonWorker *python_workers;

struct RewardFunc {
    RewardType type;
    char *name;
    double target;          /* length */
    pcre2_code *regex;      /* regex */
    double match_reward;    /* regex: the reward on a match (0 otherwise) */
    char *column;           /* math: the dataset column holding the reference */
    RewardProcess *process; /* command */
    char *command;          /* command: its text, for messages */
    double timeout;         /* command, python: seconds per call */
    PythonWorker *worker;   /* python */
    char *function;         /* python: the function's name in its file or module */
    char *source;           /* python: the file or module as written, for messages */
    Model *model;           /* model: the sequence classifier */
    Tokenizer *tok;         /* model: its own tokenizer */
    int pad_id;             /* model: the tokenizer's pad id, else its eos id (TRL's config.pad_token_id) */
    char *prompt_column;    /* model: the dataset column holding the prompt */
    json_t *template_kwargs; /* model: the chat template's extra variables (a reference), or NULL */
    WeightPartition zero3;  /* model: its weights partitioned over the data-parallel ranks (ranks 0: whole) */
    RewardJudge *judge;     /* judge */
};

static const char *json_type_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "a list";
    case JSON_STRING: return "a string";
    case JSON_INTEGER:
    case JSON_REAL: return "a number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "unknown";
}

/* |x| below the midpoint between FLT_MAX and 2^128, the values that round to a
 * finite float (so 3.4028235e38, FLT_MAX as Python prints it, still fits). */
static int fits_float32(double x) { return fabs(x) < 0x1.ffffffp+127; }

/* Stores value as rewards[i], or fails naming the reward and the completion. */
static int store_reward(const RewardFunc *r, float *rewards, int i, double value, char *err) {
    if (!fits_float32(value))
        return errorf(err, "reward '%s': completion %d: %g is not a finite 32-bit float (rewards must stay within "
                           "+-3.4e38)",
                      r->name, i, value);
    rewards[i] = (float)value;
    return 0;
}

/* ---------------------------------------------------------------------------
 * Internal regex helpers (fixed patterns: a failure to compile is a bug)
 * ------------------------------------------------------------------------- */

static pcre2_code *regex_compile_fixed(const char *pattern) {
    int code;
    PCRE2_SIZE offset;
    pcre2_code *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED,
                                   PCRE2_UTF | PCRE2_MATCH_INVALID_UTF, &code, &offset, NULL);
    COLT_ASSERT(re != NULL);
    return re;
}

/* Replaces every match of pattern in *s with replacement ($1 refers to a
 * group); *s is freed and replaced. */
static void regex_replace_all(char **s, const char *pattern, const char *replacement) {
    pcre2_code *re = regex_compile_fixed(pattern);
    size_t len = strlen(*s);
    PCRE2_SIZE out_len = len + 64;
    for (;;) {
        char *out = xmalloc(out_len);
        PCRE2_SIZE n = out_len;
        int rc = pcre2_substitute(re, (PCRE2_SPTR)*s, len, 0, PCRE2_SUBSTITUTE_GLOBAL | PCRE2_SUBSTITUTE_OVERFLOW_LENGTH,
                                  NULL, NULL, (PCRE2_SPTR)replacement, PCRE2_ZERO_TERMINATED, (PCRE2_UCHAR *)out, &n);
        if (rc == PCRE2_ERROR_NOMEMORY) {
            free(out);
            out_len = n + 1;
            continue;
        }
        if (rc >= 0) {
            free(*s);
            *s = out;
        } else {
            free(out);  /* e.g. invalid UTF-8 in the subject: leave it as it is */
        }
        break;
    }
    pcre2_code_free(re);
}

/* Matches pattern against the whole of s; fills groups[0..n_groups) with
 * copies of the capture groups 1..n_groups ("" for unset). Returns 1 on a
 * match. */
static int regex_groups(const char *pattern, const char *s, char **groups, int n_groups) {
    pcre2_code *re = regex_compile_fixed(pattern);
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    int rc = pcre2_match(re, (PCRE2_SPTR)s, strlen(s), 0, 0, md, NULL);
    if (rc > 0) {
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        for (int g = 0; g < n_groups; g++) {
            size_t a = ov[2 * (g + 1)], b = ov[2 * (g + 1) + 1];
            if (g + 1 >= rc || a == PCRE2_UNSET) a = b = 0;
            groups[g] = xmalloc(b - a + 1);
            memcpy(groups[g], s + a, b - a);
            groups[g][b - a] = '\0';
        }
    }
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return rc > 0;
}

/* ---------------------------------------------------------------------------
 * Answers: extraction, normalisation, comparison
 * ------------------------------------------------------------------------- */

static char *copy_range(const char *s, size_t n) {
    char *out = xmalloc(n + 1);
    memcpy(out, s, n);
    out[n] = '\0';
    return out;
}

/* Normalises an answer string in place of *s (returns NULL and frees *s if
 * nothing is left): whitespace, $ and % signs, degrees, \left/\right, thousands
 * commas, a leading "x=", trailing periods and trailing decimal zeros go;
 * \dfrac and \tfrac become \frac; a whole-answer \text{...} is unwrapped. */
static char *normalise_answer(char *s) {
    static const char *const rules[][2] = {
        {"\\s+", ""},
        {"^\\\\text\\{(.*)\\}$", "$1"},
        {"\\\\(?:left|right)(?![a-zA-Z])", ""},
        {"\\\\[!,;:]", ""},
        {"\\\\[dt]frac(?![a-zA-Z])", "\\frac"},
        {"\\\\?\\$", ""},
        {"\\\\?%", ""},
        {"\\^\\{?\\\\circ\\}?", ""},
        {"(?<=\\d),(?=\\d{3}(?!\\d))", ""},
        {"^[a-zA-Z]=", ""},
        {"\\.+$", ""},
        {"^\\+", ""},
        {"^(-?\\d+\\.\\d*?)0+$", "$1"},
        {"^(-?\\d+)\\.$", "$1"},
    };
    for (size_t i = 0; i < sizeof rules / sizeof rules[0]; i++) regex_replace_all(&s, rules[i][0], rules[i][1]);
    if (s[0] == '\0') {
        free(s);
        return NULL;
    }
    return s;
}

/* The text after the last "####", up to the end of its line; NULL if none. */
static char *extract_after_hashes(const char *text) {
    const char *last = NULL;
    for (const char *p = text; (p = strstr(p, "####")) != NULL; p += 4) last = p;
    if (!last) return NULL;
    last += 4;
    while (*last == '#') last++;
    size_t n = strcspn(last, "\n");
    return copy_range(last, n);
}

/* The content of the last \boxed{...} whose braces balance; NULL if none. */
static char *extract_boxed(const char *text) {
    char *best = NULL;
    for (const char *p = text; (p = strstr(p, "\\boxed")) != NULL; p += 6) {
        const char *q = p + 6;
        while (*q == ' ') q++;
        if (*q != '{') continue;
        int depth = 0;
        const char *end = NULL;
        for (const char *c = q; *c; c++) {
            if (*c == '{') depth++;
            else if (*c == '}' && --depth == 0) {
                end = c;
                break;
            }
        }
        if (!end) continue;
        free(best);
        best = copy_range(q + 1, (size_t)(end - q - 1));
    }
    return best;
}

/* The last number in text: thousands commas, decimals, a/b fractions and a
 * minus sign that is not a hyphen between words or numbers. NULL if none. */
static char *extract_last_number(const char *text) {
    pcre2_code *re = regex_compile_fixed(
        "(?:(?<![\\w)])-)?(?:\\d{1,3}(?:,\\d{3})+|\\d+)(?:\\.\\d+)?(?:/\\d+)?|(?:(?<![\\w)])-)?\\.\\d+");
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(re, NULL);
    size_t len = strlen(text), start = 0, best_a = 0, best_b = 0;
    int found = 0;
    while (start <= len && pcre2_match(re, (PCRE2_SPTR)text, len, start, 0, md, NULL) > 0) {
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        best_a = ov[0], best_b = ov[1], found = 1;
        start = ov[1] > ov[0] ? ov[1] : ov[0] + 1;
    }
    pcre2_match_data_free(md);
    pcre2_code_free(re);
    return found ? copy_range(text + best_a, best_b - best_a) : NULL;
}

char *reward_extract_answer(const char *text) {
    char *a = extract_after_hashes(text);
    if (a && (a = normalise_answer(a)) != NULL) return a;
    a = extract_boxed(text);
    if (a && (a = normalise_answer(a)) != NULL) return a;
    a = extract_last_number(text);
    return a ? normalise_answer(a) : NULL;
}

/* The reference answer in a dataset column: after "####" (GSM8K), else the
 * last \boxed{}, else the whole text (MATH-500's "answer" column). */
static char *extract_reference(const char *text) {
    char *a = extract_after_hashes(text);
    if (!a) a = extract_boxed(text);
    if (!a) a = xstrdup(text);
    return normalise_answer(a);
}

char *reward_reference_answer(const char *text) { return extract_reference(text); }

/* Parses a normalised answer as a number: "12", "-0.5", "3/4", "\frac{3}{4}",
 * "-\frac{1}{2}", "\frac12". Returns 1 on success. */
static int answer_to_number(const char *s, double *value) {
    static const char *const plain = "^(-?(?:\\d+(?:\\.\\d*)?|\\.\\d+)(?:[eE][-+]?\\d+)?)$";
    static const char *const fraction = "^(-?)(\\d+(?:\\.\\d+)?)/(\\d+(?:\\.\\d+)?)$";
    static const char *const frac_braced = "^(-?)\\\\frac\\{(-?\\d+(?:\\.\\d+)?)\\}\\{(-?\\d+(?:\\.\\d+)?)\\}$";
    static const char *const frac_digits = "^(-?)\\\\frac(\\d)(\\d)$";
    char *g[3];
    if (regex_groups(plain, s, g, 1)) {
        *value = strtod(g[0], NULL);
        free(g[0]);
        return isfinite(*value);
    }
    int ok = regex_groups(fraction, s, g, 3) || regex_groups(frac_braced, s, g, 3) || regex_groups(frac_digits, s, g, 3);
    if (!ok) return 0;
    double num = strtod(g[1], NULL), den = strtod(g[2], NULL);
    int negative = g[0][0] == '-';
    for (int i = 0; i < 3; i++) free(g[i]);
    if (den == 0) return 0;
    *value = (negative ? -num : num) / den;
    return isfinite(*value);
}

static int answers_equal(const char *a, const char *b) {
    double x, y;
    if (answer_to_number(a, &x) && answer_to_number(b, &y)) {
        double scale = fmax(fabs(x), fabs(y));
        return x == y || fabs(x - y) <= 1e-6 * scale;
    }
    return strcmp(a, b) == 0;
}

/* ---------------------------------------------------------------------------
 * Creation
 * ------------------------------------------------------------------------- */

/* Fails naming the first key of spec that is not in allowed (NULL-ended). */
static int check_keys(const json_t *spec, const char *type, const char *const *allowed, char *err) {
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)spec, key, value) {
        int ok = 0;
        for (const char *const *a = allowed; *a; a++) ok |= strcmp(key, *a) == 0;
        if (ok) continue;
        char list[256] = "";
        for (const char *const *a = allowed; *a; a++)
            snprintf(list + strlen(list), sizeof list - strlen(list), "%s%s", a == allowed ? "" : ", ", *a);
        return errorf(err, "%s reward: unknown key \"%s\" (allowed: %s)", type, key, list);
    }
    return 0;
}

/* A default name for a command: its script's or program's base name without
 * extension ("python3 rewards/check.py --x" -> "check", "./score" -> "score"). */
static char *command_default_name(const char *command) {
    const char *words = command, *pick = NULL;
    size_t pick_len = 0, first_len = 0;
    const char *first = NULL;
    while (*words) {
        words += strspn(words, " \t");
        size_t n = strcspn(words, " \t");
        if (n == 0) break;
        if (!first) first = words, first_len = n;
        if (memchr(words, '|', n) || memchr(words, ';', n) || memchr(words, '&', n)) break;  /* end of the command */
        int redirect = memchr(words, '<', n) || memchr(words, '>', n);
        if (!redirect && words[0] != '-' && words != first && (memchr(words, '/', n) || memchr(words, '.', n))) {
            pick = words, pick_len = n;
            break;
        }
        words += n;
    }
    if (!pick) pick = first, pick_len = first_len;
    if (!pick) return xstrdup("command");
    char *name = copy_range(pick, pick_len);
    char *slash = strrchr(name, '/');
    if (slash && slash[1]) memmove(name, slash + 1, strlen(slash + 1) + 1);
    char *dot = strrchr(name, '.');
    if (dot && dot != name) *dot = '\0';
    return name;
}

/* ---------------------------------------------------------------------------
 * Python rewards
 * ------------------------------------------------------------------------- */

static int is_identifier(const char *s, size_t n) {
    if (n == 0 || !(s[0] == '_' || (s[0] >= 'a' && s[0] <= 'z') || (s[0] >= 'A' && s[0] <= 'Z'))) return 0;
    for (size_t i = 1; i < n; i++)
        if (!(s[i] == '_' || (s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') || (s[i] >= '0' && s[i] <= '9')))
            return 0;
    return 1;
}

/* "a.b.c": dotted Python identifiers. */
static int is_dotted_name(const char *s) {
    for (;;) {
        size_t n = strcspn(s, ".");
        if (!is_identifier(s, n)) return 0;
        if (!s[n]) return 1;
        s += n + 1;
    }
}

static int ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* A reward given as text, as TRL users name their functions: "PATH.py:FUNCTION"
 * (a function in a file) or "module.function" (an importable one, TRL's CLI
 * form), as a python spec object. */
static int python_spec_from_text(json_t **out, const char *text, char *err) {
    *out = NULL;
    const char *colon = strrchr(text, ':');
    if (colon) {
        char *file = copy_range(text, (size_t)(colon - text));
        int ok = ends_with(file, ".py") && strlen(file) > 3 && is_identifier(colon + 1, strlen(colon + 1));
        if (ok) *out = json_pack("{s:s, s:s, s:s}", "type", "python", "file", file, "function", colon + 1);
        free(file);
        if (ok) return 0;
    } else if (strchr(text, '.') && is_dotted_name(text)) {
        const char *dot = strrchr(text, '.');
        char *module = copy_range(text, (size_t)(dot - text));
        *out = json_pack("{s:s, s:s, s:s}", "type", "python", "module", module, "function", dot + 1);
        free(module);
        return 0;
    }
    return errorf(err, "reward \"%.100s\": a reward given as text must be \"PATH.py:FUNCTION\" (a function in a "
                       "Python file), \"module.function\" (an importable one) or a reward model's folder; "
                       "built-in rewards are objects ({type: length|regex|math|command|python|model, ...})",
                  text);
}

/* The worker for `key`, started and importing the file or module if no reward
 * holds one yet. Errors start with prefix ("reward 'f' (rewards.py)"). */
static int python_worker_get(PythonWorker **out, const char *key, const char *python, const char *file,
                             const char *module, const char *source, double timeout, const char *prefix, char *err) {
    for (PythonWorker *w = python_workers; w; w = w->next) {
        if (strcmp(w->key, key) == 0) {
            w->refs++;
            *out = w;
            return 0;
        }
    }
    /* The bootstrap reads the worker's source from the first line of stdin:
     * the command line stays short, and needs no quoting beyond its own. */
    static const char bootstrap[] =
        "import json, sys; setup = json.loads(sys.stdin.readline()); "
        "exec(compile(setup[\"source\"], \"colt_reward_worker.py\", \"exec\"), "
        "{\"__name__\": \"__colt_reward_worker__\", \"setup\": setup})";
    size_t command_len = strlen(python) + sizeof bootstrap + 16;
    char *command = xmalloc(command_len);
    snprintf(command, command_len, "exec %s -c '%s'", python, bootstrap);
    char subject[160];
    snprintf(subject, sizeof subject, "Python worker (%.100s)", python);
    RewardProcess *process = NULL;
    int rc = reward_process_start(&process, command, subject, source, 0, err);
    free(command);
    if (rc != 0) return error_prefix(err, "%s", prefix);

    json_t *setup = json_pack("{s:s, s:o, s:o, s:s}", "source", REWARD_WORKER_SOURCE, "file",
                              file ? json_string(file) : json_null(), "module",
                              module ? json_string(module) : json_null(), "display", source);
    json_t *reply = NULL;
    if (!setup) {
        reward_process_stop(process);
        return errorf(err, "%s: the path %s is not valid UTF-8", prefix, source);
    }
    rc = reward_process_call(process, &reply, setup, fmax(timeout, PYTHON_TIMEOUT_S), err);
    json_decref(setup);
    if (rc != 0) {
        reward_process_stop(process);
        char message[ERR_LEN];
        snprintf(message, sizeof message, "%s", err);
        return errorf(err, "%s: %s (colt runs Python as \"%.60s\"; set COLT_PYTHON or the reward's \"python\" to "
                           "use another)",
                      prefix, message, python);
    }
    json_t *error = json_object_get(reply, "error");
    if (error || !json_is_true(json_object_get(reply, "ok"))) {
        errorf(err, "%s: %s", prefix, json_is_string(error) ? json_string_value(error) : "the worker's answer has no \"ok\"");
        json_decref(reply);
        reward_process_stop(process);
        return COLT_ERR;
    }
    json_decref(reply);
    PythonWorker *w = xcalloc(1, sizeof *w);
    w->key = xstrdup(key);
    w->process = process;
    w->refs = 1;
    w->next = python_workers;
    python_workers = w;
    *out = w;
    return 0;
}

static void python_worker_release(PythonWorker *w) {
    if (!w || --w->refs > 0) return;
    for (PythonWorker **link = &python_workers; *link; link = &(*link)->next) {
        if (*link == w) {
            *link = w->next;
            break;
        }
    }
    reward_process_stop(w->process);
    free(w->key);
    free(w);
}

/* {type: python, file: PATH.py | module: NAME, function: NAME, timeout, python}:
 * imports the file in its worker (started if needed) and checks the function
 * is there, so a missing file or function fails now, not at the first step.
 * Relative paths are from the current directory, as for `python train.py`. */
static int create_python(RewardFunc *r, const json_t *spec, const json_t *name_v, char *err) {
    static const char *const keys[] = {"type", "name", "file", "module", "function", "timeout", "python", NULL};
    if (check_keys(spec, "python", keys, err) != 0) return COLT_ERR;
    json_t *file_v = json_object_get(spec, "file"), *module_v = json_object_get(spec, "module"),
           *function_v = json_object_get(spec, "function"), *timeout_v = json_object_get(spec, "timeout"),
           *python_v = json_object_get(spec, "python");
    if (!file_v == !module_v)
        return errorf(err, "python reward: give either \"file\" (a .py file) or \"module\" (an importable module)");
    if (file_v && (!json_is_string(file_v) || !ends_with(json_string_value(file_v), ".py") ||
                   json_string_length(file_v) <= 3))
        return errorf(err, "python reward: \"file\" must be the path of a .py file");
    if (module_v && (!json_is_string(module_v) || !is_dotted_name(json_string_value(module_v))))
        return errorf(err, "python reward: \"module\" must be a dotted module name (my_rewards or pkg.rewards)");
    if (!json_is_string(function_v) || !is_identifier(json_string_value(function_v), json_string_length(function_v)))
        return errorf(err, "python reward: \"function\" must be the name of a Python function%s",
                      function_v ? "" : " and is missing");
    if (timeout_v && (!json_is_number(timeout_v) || !(json_number_value(timeout_v) > 0)))
        return errorf(err, "python reward: \"timeout\" must be a positive number of seconds");
    if (python_v && (!json_is_string(python_v) || json_string_length(python_v) == 0))
        return errorf(err, "python reward: \"python\" must be a command that runs Python (python3, /venv/bin/python)");

    r->type = REWARD_PYTHON;
    r->function = xstrdup(json_string_value(function_v));
    r->source = xstrdup(json_string_value(file_v ? file_v : module_v));
    r->timeout = timeout_v ? json_number_value(timeout_v) : PYTHON_TIMEOUT_S;
    const char *python = reward_process_python(python_v ? json_string_value(python_v) : NULL);
    char prefix[300];
    snprintf(prefix, sizeof prefix, "reward '%.100s' (%.150s)", r->function, r->source);

    char *path = NULL;
    if (file_v) {
        struct stat st;
        path = realpath(r->source, NULL);
        if (!path || stat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
            int missing = !path;
            free(path);
            char cwd[4096];
            if (!getcwd(cwd, sizeof cwd)) snprintf(cwd, sizeof cwd, "(unknown)");
            return errorf(err, "%s: %s %s (a relative path is from the current directory, %s)", prefix, r->source,
                          missing ? "not found" : "is not a regular file", cwd);
        }
    }
    size_t key_len = strlen(python) + strlen(path ? path : r->source) + 16;
    char *key = xmalloc(key_len);
    snprintf(key, key_len, "%s\n%s:%s", python, path ? "file" : "module", path ? path : r->source);
    int rc = python_worker_get(&r->worker, key, python, path, path ? NULL : r->source, r->source, r->timeout, prefix,
                               err);
    free(key);
    free(path);
    if (rc != 0) return COLT_ERR;

    json_t *check = json_pack("{s:s, s:s}", "op", "check", "function", r->function), *reply = NULL;
    rc = reward_process_call(r->worker->process, &reply, check, fmax(r->timeout, PYTHON_TIMEOUT_S), err);
    json_decref(check);
    if (rc != 0) return error_prefix(err, "%s", prefix);
    json_t *error = json_object_get(reply, "error"), *name = json_object_get(reply, "name");
    if (error || !json_is_string(name)) {
        errorf(err, "%s: %s", prefix, json_is_string(error) ? json_string_value(error) : "the worker's answer has no name");
        json_decref(reply);
        return COLT_ERR;
    }
    /* TRL names a function's metrics by its __name__. */
    r->name = xstrdup(name_v ? json_string_value(name_v) : json_string_value(name));
    json_decref(reply);
    return 0;
}

/* ---------------------------------------------------------------------------
 * Reward models
 * ------------------------------------------------------------------------- */

static int is_directory(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* TRL names a model reward by its config's name_or_path's last component: the folder's name. */
static char *model_default_name(const char *path) {
    char *name = xstrdup(path);
    for (size_t n = strlen(name); n > 1 && name[n - 1] == '/'; n--) name[n - 1] = '\0';
    const char *slash = strrchr(name, '/');
    if (slash && slash[1]) memmove(name, slash + 1, strlen(slash + 1) + 1);
    return name;
}

/* Loads the classifier and its tokenizer on ctx's backend. */
static int create_model(RewardFunc *r, const json_t *spec, const json_t *name_v, const RewardContext *ctx, char *err) {
    static const char *const keys[] = {"type", "name", "path", NULL};
    if (check_keys(spec, "model", keys, err) != 0) return COLT_ERR;
    json_t *path_v = json_object_get(spec, "path");
    if (!json_is_string(path_v) || json_string_length(path_v) == 0)
        return errorf(err, "model reward: \"path\" must be the folder of a sequence-classification checkpoint "
                           "(or its Hub name in the local cache)");
    const char *path = json_string_value(path_v);
    r->type = REWARD_MODEL;
    r->name = name_v ? xstrdup(json_string_value(name_v)) : model_default_name(path);
    if (!ctx || !ctx->be)
        return errorf(err, "model reward '%s': a reward model needs a device to run on, which only colt train "
                           "lends its rewards", r->name);
    char *folder = NULL;
    if (hub_cache_model_folder(&folder, path, NULL, err) != 0) return error_prefix(err, "model reward '%s'", r->name);
    /* Cut like the policy when its shape allows; else whole on every rank, and the log says why. */
    const TensorParallel *tp = ctx->tp && ctx->tp->tensor_parallel_size > 1 ? ctx->tp : NULL;
    char why_whole[ERR_LEN] = "";
    ModelConfig shape;
    if (tp && (model_config_load(&shape, NULL, folder, why_whole) != 0 ||
               model_tp_check(&shape, tp->tensor_parallel_size, why_whole) != 0))
        tp = NULL;
    int rc = model_load_classifier(&r->model, folder, ctx->be, tp, err);
    if (rc == 0) rc = tokenizer_load(&r->tok, folder, err);
    if (rc != 0) {
        free(folder);
        return error_prefix(err, "model reward '%s'", r->name);
    }
    const ModelConfig *mc = model_config(r->model);
    size_t whole_bytes = model_weight_bytes(r->model);
    r->pad_id = tokenizer_pad_id(r->tok) >= 0 ? tokenizer_pad_id(r->tok) : tokenizer_eos_id(r->tok);
    if (r->pad_id < 0)
        rc = errorf(err, "model reward '%s': %s's tokenizer has neither a pad nor an eos token, so the scored "
                         "token cannot be found as TRL finds it (set pad_token in tokenizer_config.json)",
                    r->name, folder);
    else if (tokenizer_vocab_size(r->tok) > mc->vocab_size)
        rc = errorf(err, "model reward '%s': %s: the tokenizer has %d tokens but the model only %d", r->name, folder,
                    tokenizer_vocab_size(r->tok), mc->vocab_size);
    /* ZeRO-3: every rank keeps its part alone; scoring gathers the whole (compute_model). */
    if (rc == 0 && ctx->zero3 && ctx->zero3->ranks > 1) {
        r->zero3 = *ctx->zero3;
        if (r->zero3.partition(r->zero3.ctx, r->model, err) != 0) rc = error_prefix(err, "model reward '%s'", r->name);
    }
    if (rc == 0) {
        char where[ERR_LEN + 160] = "whole";
        int n = 0;
        if (tp)
            n = snprintf(where, sizeof where, "cut across the %d ranks of the tensor-parallel group",
                         tp->tensor_parallel_size);
        else if (why_whole[0]) n = snprintf(where, sizeof where, "whole on every rank (%s)", why_whole);
        if (r->zero3.ranks > 1)
            snprintf(where + n, sizeof where - (size_t)n, "%spartitioned across %d data-parallel ranks (zero_stage 3)",
                     tp ? ", " : n ? "; " : "", r->zero3.ranks);
        char whole[96] = "";
        if (r->zero3.ranks > 1) snprintf(whole, sizeof whole, " (%.3f MB whole, gathered while scoring)", whole_bytes / 1e6);
        log_info0("reward '%s': %s sequence classifier (num_labels %d, label 0 scores) from %s, %s, %.3f MB of "
                  "weights on the training device%s",
                  r->name, model_arch_name(mc->arch), mc->num_labels, folder, where, model_weight_bytes(r->model) / 1e6,
                  whole);
    }
    free(folder);
    if (rc != 0) return COLT_ERR;
    r->prompt_column = xstrdup(ctx->prompt_column ? ctx->prompt_column : "prompt");
    r->template_kwargs = ctx->chat_template_kwargs ? json_incref(ctx->chat_template_kwargs) : NULL;
    return COLT_OK;
}

/* The text TRL scores for completion i: the conversation rendered with the
 * reward model's chat template (the prompt's messages, then the completion's:
 * a multi-turn one's turns and tool results, else the completion as the
 * assistant's), or the plain prompt followed by the completion's text. */
static int model_text(char **out, RewardFunc *r, const char *prompt, const char *completion, json_t *turns,
                      json_t *row, int i, char *err) {
    json_t *column = row ? json_object_get(row, r->prompt_column) : NULL;
    if (json_is_array(column)) {
        json_t *messages = json_copy(column); /* shallow: the messages stay the row's */
        if (json_is_array(turns)) json_array_extend(messages, turns);
        else json_array_append_new(messages, json_pack("{s:s, s:s}", "role", "assistant", "content", completion));
        char where[160];
        snprintf(where, sizeof where, "reward '%s': completion %d", r->name, i);
        int rc = prompt_render_chat(out, r->tok, messages, NULL, r->template_kwargs, false, where, err);
        json_decref(messages);
        return rc;
    }
    const char *p = json_is_string(column) ? json_string_value(column) : prompt ? prompt : "";
    size_t a = strlen(p), b = strlen(completion);
    *out = xmalloc(a + b + 1);
    memcpy(*out, p, a);
    memcpy(*out + a, completion, b + 1);
    return COLT_OK;
}

/* Under ZeRO-3 every data-parallel rank gathers the whole weights, also with
 * nothing to score or after its texts failed (the gather is collective). */
static int compute_model(RewardFunc *r, float *rewards, const char *const *prompts, const char *const *completions,
                         json_t *const *messages, json_t *const *rows, int n, char *err) {
    int **ids = xcalloc((size_t)n + 1, sizeof(int *)), *lens = xcalloc((size_t)n + 1, sizeof(int)), rc = COLT_OK;
    for (int i = 0; i < n && rc == 0; i++) {
        char *text = NULL;
        size_t len = 0;
        rc = model_text(&text, r, prompts ? prompts[i] : NULL, completions[i], messages ? messages[i] : NULL,
                        rows ? rows[i] : NULL, i, err);
        if (rc == 0 && tokenizer_encode(r->tok, text, strlen(text), &ids[i], &len, err) != 0)
            rc = error_prefix(err, "reward '%s': completion %d", r->name, i);
        lens[i] = (int)len;
        free(text);
    }
    char gather_err[ERR_LEN];
    if (r->zero3.ranks > 1 && r->zero3.gather(r->zero3.ctx, r->model, rc == 0 ? err : gather_err) != 0 && rc == 0)
        rc = error_prefix(err, "reward '%s': gathering its weights", r->name);
    const int K = model_config(r->model)->num_labels;
    float *scores = xmalloc(sizeof(float) * ((size_t)n * (size_t)K + 1));
    if (rc == 0 && model_score_sequences(r->model, scores, (const int *const *)ids, lens, n, r->pad_id, err) != 0)
        rc = error_prefix(err, "reward '%s'", r->name);
    if (r->zero3.ranks > 1) r->zero3.release(r->zero3.ctx, r->model);
    /* TRL's logits[:, 0] */
    for (int i = 0; i < n && rc == 0; i++) rc = store_reward(r, rewards, i, scores[(size_t)i * K], err);
    for (int i = 0; i < n; i++) free(ids[i]);
    free(ids), free(lens), free(scores);
    return rc;
}

/* A reward given as text: a folder (TRL's reward_funcs="path/to/reward-model"),
 * a Python form, or else, when it has a '/', a Hub name for the local cache
 * (or a missing folder, which the loader then names). */
static int spec_from_text(json_t **out, const char *text, char *err) {
    if (is_directory(text)) {
        *out = json_pack("{s:s, s:s}", "type", "model", "path", text);
        return COLT_OK;
    }
    if (python_spec_from_text(out, text, err) == 0) return COLT_OK;
    if (!strchr(text, '/') || strchr(text, ':') || ends_with(text, ".py")) return COLT_ERR; /* python's message */
    *out = json_pack("{s:s, s:s}", "type", "model", "path", text);
    return COLT_OK;
}

int reward_create(RewardFunc **out, json_t *spec, char *err) { return reward_create_ctx(out, spec, NULL, err); }

int reward_model_config(ModelConfig *out, json_t *spec) {
    char err[ERR_LEN];
    json_t *object = json_is_string(spec) && spec_from_text(&object, json_string_value(spec), err) == 0 ? object
                     : json_is_object(spec)                                                            ? json_incref(spec)
                                                                                                       : NULL;
    json_t *type = json_object_get(object, "type"), *path = json_object_get(object, "path");
    char *folder = NULL;
    int found = json_is_string(type) && strcmp(json_string_value(type), "model") == 0 && json_is_string(path) &&
                hub_cache_model_folder(&folder, json_string_value(path), NULL, err) == 0 &&
                model_config_load(out, NULL, folder, err) == 0 && out->num_labels > 0;
    free(folder);
    json_decref(object);
    return found;
}

int reward_create_ctx(RewardFunc **out, json_t *spec, const RewardContext *ctx, char *err) {
    *out = NULL;
    if (json_is_string(spec)) {
        json_t *object = NULL;
        if (spec_from_text(&object, json_string_value(spec), err) != 0) return COLT_ERR;
        COLT_ASSERT(object != NULL); /* parts of a JSON string split at ASCII stay valid UTF-8 */
        int rc = reward_create_ctx(out, object, ctx, err);
        json_decref(object);
        return rc;
    }
    if (!json_is_object(spec))
        return errorf(err, "a reward must be an object with a \"type\" or a \"PATH.py:FUNCTION\" string, got %s",
                      json_type_name(spec));
    json_t *type_v = json_object_get(spec, "type");
    if (!json_is_string(type_v))
        return errorf(err, "a reward needs a \"type\" string (length, regex, math, command, python, model or judge)%s",
                      type_v ? "" : "; none was given");
    const char *type = json_string_value(type_v);
    json_t *name_v = json_object_get(spec, "name");
    if (name_v && (!json_is_string(name_v) || json_string_length(name_v) == 0))
        return errorf(err, "%s reward: \"name\" must be a non-empty string", type);

    RewardFunc *r = xcalloc(1, sizeof *r);
    const char *default_name = type;
    if (strcmp(type, "length") == 0) {
        static const char *const keys[] = {"type", "name", "target", NULL};
        if (check_keys(spec, type, keys, err) != 0) goto error;
        json_t *t = json_object_get(spec, "target");
        if (!json_is_number(t)) {
            errorf(err, "length reward: \"target\" (the wanted number of characters) must be a number%s",
                   t ? "" : " and is missing");
            goto error;
        }
        if (!fits_float32(json_number_value(t))) {
            errorf(err, "length reward: \"target\" %g is not a finite 32-bit float", json_number_value(t));
            goto error;
        }
        r->type = REWARD_LENGTH;
        r->target = json_number_value(t);
    } else if (strcmp(type, "regex") == 0) {
        static const char *const keys[] = {"type", "name", "pattern", "flags", "reward", NULL};
        if (check_keys(spec, type, keys, err) != 0) goto error;
        json_t *pattern = json_object_get(spec, "pattern"), *flags = json_object_get(spec, "flags"),
               *reward = json_object_get(spec, "reward");
        if (!json_is_string(pattern)) {
            errorf(err, "regex reward: \"pattern\" must be a string%s", pattern ? "" : " and is missing");
            goto error;
        }
        uint32_t options = PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF;
        if (flags) {
            if (!json_is_string(flags)) {
                errorf(err, "regex reward: \"flags\" must be a string of letters (s, m, i, x)");
                goto error;
            }
            for (const char *f = json_string_value(flags); *f; f++) {
                switch (*f) {
                case 's': options |= PCRE2_DOTALL; break;
                case 'm': options |= PCRE2_MULTILINE; break;
                case 'i': options |= PCRE2_CASELESS; break;
                case 'x': options |= PCRE2_EXTENDED; break;
                default:
                    errorf(err, "regex reward: unknown flag '%c' (allowed: s = dot matches newline, m = multiline, "
                                "i = ignore case, x = extended)", *f);
                    goto error;
                }
            }
        }
        if (reward && !json_is_number(reward)) {
            errorf(err, "regex reward: \"reward\" must be a number");
            goto error;
        }
        r->match_reward = reward ? json_number_value(reward) : 1.0;
        if (!fits_float32(r->match_reward)) {
            errorf(err, "regex reward: \"reward\" %g is not a finite 32-bit float (rewards must stay within "
                        "+-3.4e38)", r->match_reward);
            goto error;
        }
        int code;
        PCRE2_SIZE offset;
        r->regex = pcre2_compile((PCRE2_SPTR)json_string_value(pattern), json_string_length(pattern), options, &code,
                                 &offset, NULL);
        if (!r->regex) {
            PCRE2_UCHAR message[256];
            pcre2_get_error_message(code, message, sizeof message);
            errorf(err, "regex reward: pattern \"%.100s\" does not compile at offset %zu: %s",
                   json_string_value(pattern), (size_t)offset, (const char *)message);
            goto error;
        }
        r->type = REWARD_REGEX;
    } else if (strcmp(type, "math") == 0) {
        static const char *const keys[] = {"type", "name", "column", NULL};
        if (check_keys(spec, type, keys, err) != 0) goto error;
        json_t *column = json_object_get(spec, "column");
        if (column && !json_is_string(column)) {
            errorf(err, "math reward: \"column\" must be the name of a dataset column");
            goto error;
        }
        r->type = REWARD_MATH;
        r->column = xstrdup(column ? json_string_value(column) : "answer");
    } else if (strcmp(type, "command") == 0) {
        static const char *const keys[] = {"type", "name", "command", "timeout", NULL};
        if (check_keys(spec, type, keys, err) != 0) goto error;
        json_t *command = json_object_get(spec, "command"), *timeout = json_object_get(spec, "timeout");
        if (!json_is_string(command) || json_string_length(command) == 0) {
            errorf(err, "command reward: \"command\" must be a non-empty string (run with /bin/sh -c)");
            goto error;
        }
        if (timeout && (!json_is_number(timeout) || !(json_number_value(timeout) > 0))) {
            errorf(err, "command reward: \"timeout\" must be a positive number of seconds");
            goto error;
        }
        r->type = REWARD_COMMAND;
        r->command = xstrdup(json_string_value(command));
        if (strlen(r->command) > 80) strcpy(r->command + 77, "...");
        r->name = name_v ? xstrdup(json_string_value(name_v)) : command_default_name(json_string_value(command));
        r->timeout = timeout ? json_number_value(timeout) : COMMAND_TIMEOUT_S;
        char subject[128];
        snprintf(subject, sizeof subject, "reward command '%s'", r->command);
        if (reward_process_start(&r->process, json_string_value(command), subject, r->name, 1, err) != 0) goto error;
    } else if (strcmp(type, "python") == 0) {
        if (create_python(r, spec, name_v, err) != 0) goto error;
    } else if (strcmp(type, "model") == 0) {
        if (create_model(r, spec, name_v, ctx, err) != 0) goto error;
    } else if (strcmp(type, "judge") == 0) {
        r->type = REWARD_JUDGE;
        if (reward_judge_create(&r->judge, spec, name_v ? json_string_value(name_v) : type, err) != 0) goto error;
    } else {
        errorf(err, "unknown reward type \"%s\" (known: length, regex, math, command, python, model, judge)", type);
        goto error;
    }
    if (!r->name) r->name = xstrdup(name_v ? json_string_value(name_v) : default_name);
    *out = r;
    return 0;
error:
    reward_free(r);
    return COLT_ERR;
}

void reward_free(RewardFunc *r) {
    if (!r) return;
    reward_process_stop(r->process);
    python_worker_release(r->worker);
    if (r->regex) pcre2_code_free(r->regex);
    free(r->column);
    free(r->command);
    free(r->function);
    free(r->source);
    model_free(r->model);
    reward_judge_free(r->judge);
    tokenizer_free(r->tok);
    free(r->prompt_column);
    json_decref(r->template_kwargs);
    free(r->name);
    free(r);
}

const char *reward_name(const RewardFunc *r) { return r->name; }

pid_t reward_command_pid(const RewardFunc *r) {
    if (r->type == REWARD_COMMAND) return reward_process_pid(r->process);
    return r->type == REWARD_PYTHON ? reward_process_pid(r->worker->process) : 0;
}

/* ---------------------------------------------------------------------------
 * Computing
 * ------------------------------------------------------------------------- */

/* Unicode code points of UTF-8 text, as Python's len(str): bytes that are not
 * continuation bytes. */
static size_t utf8_length(const char *s) {
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) n += (*p & 0xC0) != 0x80;
    return n;
}

static int compute_regex(RewardFunc *r, float *rewards, const char *const *completions, int n, char *err) {
    pcre2_match_data *md = pcre2_match_data_create_from_pattern(r->regex, NULL);
    for (int i = 0; i < n; i++) {
        int rc = pcre2_match(r->regex, (PCRE2_SPTR)completions[i], strlen(completions[i]), 0, 0, md, NULL);
        if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
            PCRE2_UCHAR message[256];
            pcre2_get_error_message(rc, message, sizeof message);
            pcre2_match_data_free(md);
            return errorf(err, "%s reward: matching completion %d failed: %s", r->name, i, (const char *)message);
        }
        rewards[i] = rc >= 0 ? (float)r->match_reward : 0.0f;
    }
    pcre2_match_data_free(md);
    return 0;
}

/* 1 when the completion's answer equals the reference in the row's column, 0
 * when it differs or has none, NaN when the reference is null or has no
 * answer (TRL's accuracy reward skips such rows too). */
static int compute_math(RewardFunc *r, float *rewards, const char *const *completions, json_t *const *rows, int n,
                        char *err) {
    for (int i = 0; i < n; i++) {
        json_t *v = rows ? json_object_get(rows[i], r->column) : NULL;
        if (!v)
            return errorf(err, "%s reward: completion %d's dataset row has no column \"%s\" (set \"column\" in the "
                               "reward to the column holding the reference answer)",
                          r->name, i, r->column);
        char *reference = NULL;
        if (json_is_string(v)) {
            reference = extract_reference(json_string_value(v));
        } else if (json_is_integer(v)) {
            char buf[32];
            snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
            reference = normalise_answer(xstrdup(buf));
        } else if (json_is_real(v)) {
            char buf[40];
            snprintf(buf, sizeof buf, "%.17g", json_real_value(v));
            reference = normalise_answer(xstrdup(buf));
        } else if (!json_is_null(v)) {
            return errorf(err, "%s reward: column \"%s\" of completion %d's row is %s, expected a string or number",
                          r->name, r->column, i, json_type_name(v));
        }
        if (!reference) {
            rewards[i] = NAN;
            continue;
        }
        char *answer = reward_extract_answer(completions[i]);
        rewards[i] = answer && answers_equal(answer, reference) ? 1.0f : 0.0f;
        free(answer);
        free(reference);
    }
    return 0;
}

/* Adds one list per column of the rows, null where a row lacks it, except the
 * columns named in skip (NULL-ended) and keys req already has. */
static void add_columns(json_t *req, json_t *const *rows, int n, const char *const *skip) {
    for (int i = 0; rows && i < n; i++) {
        const char *key;
        json_t *value;
        json_object_foreach(rows[i], key, value) {
            int skipped = json_object_get(req, key) != NULL;
            for (const char *const *s = skip; *s && !skipped; s++) skipped = strcmp(key, *s) == 0;
            if (skipped) continue;
            json_t *column = json_array();
            for (int k = 0; k < n; k++) {
                json_t *v = json_object_get(rows[k], key);
                json_array_append_new(column, v ? json_incref(v) : json_null());
            }
            json_object_set_new(req, key, column);
        }
    }
}

/* [[id, ...], ...]: each completion's token ids, the stop token included. */
static json_t *ids_json(const int *const *ids, const int *lens, int n) {
    json_t *all = json_array();
    for (int i = 0; i < n; i++) {
        json_t *one = json_array();
        for (int k = 0; k < lens[i]; k++) json_array_append_new(one, json_integer(ids[i][k]));
        json_array_append_new(all, one);
    }
    return all;
}

/* Builds the command protocol's request {"prompts", "completions",
 * "completion_ids" (when given), "<column>": [...]} — every column of the rows
 * except "prompt". */
static int build_request(json_t **out, const RewardFunc *r, const char *const *prompts,
                         const char *const *completions, const int *const *ids, const int *id_lens, json_t *const *rows,
                         int n, char *err) {
    json_t *req = json_object(), *p = json_array(), *c = json_array();
    json_object_set_new(req, "prompts", p);
    json_object_set_new(req, "completions", c);
    for (int i = 0; i < n; i++) {
        json_t *ps = prompts && prompts[i] ? json_string(prompts[i]) : json_null();
        json_t *cs = json_string(completions[i]);
        if (!ps || !cs) {
            json_decref(ps);
            json_decref(cs);
            json_decref(req);
            return errorf(err, "%s reward: %s %d is not valid UTF-8", r->name, ps ? "completion" : "prompt", i);
        }
        json_array_append_new(p, ps);
        json_array_append_new(c, cs);
    }
    if (ids) json_object_set_new(req, "completion_ids", ids_json(ids, id_lens, n));
    static const char *const skip[] = {"prompt", NULL};
    add_columns(req, rows, n, skip);
    *out = req;
    return 0;
}

/* TRL's keyword arguments of a reward function: prompts as the dataset has
 * them (a string, or a list of messages for a conversational row), completions
 * as strings, or [{"role": "assistant", "content": text}] where the prompt is a
 * list of messages; completion_ids (None when the caller has none); and one
 * list per other column (all but prompt, completion and completion_ids, as
 * TRL; prompts and completions would collide with the arguments). */
static int build_python_kwargs(json_t **out, const RewardFunc *r, const char *const *prompts,
                               const char *const *completions, json_t *const *messages, const int *const *ids,
                               const int *id_lens, json_t *const *rows, int n, char *err) {
    json_t *kw = json_object(), *p = json_array(), *c = json_array();
    json_object_set_new(kw, "prompts", p);
    json_object_set_new(kw, "completions", c);
    json_object_set_new(kw, "completion_ids", ids ? ids_json(ids, id_lens, n) : json_null());
    for (int i = 0; i < n; i++) {
        json_t *prompt = rows ? json_object_get(rows[i], "prompt") : NULL;
        if (prompt) json_incref(prompt);
        else prompt = prompts && prompts[i] ? json_string(prompts[i]) : json_null();
        json_t *text = json_string(completions[i]);
        if (!prompt || !text) {
            json_decref(prompt);
            json_decref(text);
            json_decref(kw);
            return errorf(err, "reward '%s' (%s): %s %d is not valid UTF-8", r->name, r->source,
                          prompt ? "completion" : "prompt", i);
        }
        json_array_append_new(p, prompt);
        if (messages && messages[i]) { /* a multi-turn completion: its messages, as TRL passes them */
            json_decref(text);
            json_array_append(c, messages[i]);
            continue;
        }
        json_array_append_new(c, json_is_array(prompt) ? json_pack("[{s:s, s:o}]", "role", "assistant", "content", text)
                                                       : text);
    }
    static const char *const skip[] = {"prompt", "completion", "completion_ids", NULL};
    add_columns(kw, rows, n, skip);
    *out = kw;
    return 0;
}

/* rewards[0..n) from an answer {"rewards": [number or null, ...]}; errors
 * start with `who`. */
static int parse_rewards(const RewardFunc *r, float *rewards, const json_t *reply, int n, const char *who, char *err) {
    json_t *list = json_object_get(reply, "rewards");
    if (!json_is_object(reply) || !json_is_array(list))
        return errorf(err, "%s: its answer must be {\"rewards\": [...]}, got %s%s", who, json_type_name(reply),
                      json_is_object(reply) ? " without a \"rewards\" list" : "");
    if (json_array_size(list) != (size_t)n)
        return errorf(err, "%s returned %zu rewards for %d completions", who, json_array_size(list), n);
    for (int i = 0; i < n; i++) {
        json_t *v = json_array_get(list, (size_t)i);
        if (json_is_null(v)) {
            rewards[i] = NAN;
        } else if (json_is_number(v)) {
            if (store_reward(r, rewards, i, json_number_value(v), err) != 0) return COLT_ERR;
        } else {
            return errorf(err, "%s: rewards[%d] is %s, expected a number or null", who, i, json_type_name(v));
        }
    }
    return 0;
}

static int compute_command(RewardFunc *r, float *rewards, const char *const *prompts, const char *const *completions,
                           const int *const *ids, const int *id_lens, json_t *const *rows, int n, char *err) {
    json_t *req = NULL, *reply = NULL;
    if (build_request(&req, r, prompts, completions, ids, id_lens, rows, n, err) != 0) return COLT_ERR;
    int rc = reward_process_call(r->process, &reply, req, r->timeout, err);
    json_decref(req);
    if (rc != 0) return COLT_ERR;
    char who[128];
    snprintf(who, sizeof who, "reward command '%s'", r->command);
    rc = parse_rewards(r, rewards, reply, n, who, err);
    json_decref(reply);
    return rc;
}

int reward_python_kwargs(json_t **out, const RewardFunc *r, const char *const *prompts,
                         const char *const *completions, json_t *const *messages, const int *const *ids,
                         const int *id_lens, json_t *const *rows, int n, char *err) {
    COLT_ASSERT(r->type == REWARD_PYTHON);
    return build_python_kwargs(out, r, prompts, completions, messages, ids, id_lens, rows, n, err);
}

char *reward_python_function(const RewardFunc *r, double *timeout_s) {
    if (r->type != REWARD_PYTHON) return NULL;
    *timeout_s = r->timeout;
    size_t n = strlen(r->source) + strlen(r->function) + 2;
    char *text = xmalloc(n);
    /* a file's source is a .py path (create_python checks), a module's a dotted name */
    snprintf(text, n, "%s%s%s", r->source, ends_with(r->source, ".py") ? ":" : ".", r->function);
    return text;
}

int reward_store_value(const RewardFunc *r, float *rewards, int i, double value, char *err) {
    return store_reward(r, rewards, i, value, err);
}

static int compute_python(RewardFunc *r, float *rewards, const char *const *prompts, const char *const *completions,
                          json_t *const *messages, const int *const *ids, const int *id_lens, json_t *const *rows,
                          int n, char *err) {
    json_t *kwargs = NULL, *reply = NULL;
    if (build_python_kwargs(&kwargs, r, prompts, completions, messages, ids, id_lens, rows, n, err) != 0)
        return COLT_ERR;
    json_t *req = json_pack("{s:s, s:s, s:o}", "op", "call", "function", r->function, "kwargs", kwargs);
    char who[300];
    snprintf(who, sizeof who, "reward '%.100s' (%.150s)", r->name, r->source);
    int rc = reward_process_call(r->worker->process, &reply, req, r->timeout, err);
    json_decref(req);
    if (rc != 0) return error_prefix(err, "%s", who);
    json_t *error = json_object_get(reply, "error");
    if (json_is_string(error)) {
        errorf(err, "%s: %s", who, json_string_value(error));
        for (char *c = err; *c; c++) /* one line, whatever the exception's text held */
            if ((unsigned char)*c < 0x20) *c = ' ';
        rc = COLT_ERR;
    } else {
        rc = parse_rewards(r, rewards, reply, n, who, err);
    }
    json_decref(reply);
    return rc;
}

int reward_compute(RewardFunc *r, float *rewards, const char *const *prompts, const char *const *completions,
                   const int *const *completion_ids, const int *completion_lens, json_t *const *rows, int n,
                   char *err) {
    return reward_compute_messages(r, rewards, prompts, completions, NULL, completion_ids, completion_lens, rows, n,
                                   err);
}

int reward_compute_messages(RewardFunc *r, float *rewards, const char *const *prompts, const char *const *completions,
                            json_t *const *messages, const int *const *completion_ids, const int *completion_lens,
                            json_t *const *rows, int n, char *err) {
    if (r->type == REWARD_MODEL)
        return compute_model(r, rewards, prompts, completions, messages, rows, n > 0 ? n : 0, err);
    if (n <= 0) return 0;
    switch (r->type) {
    case REWARD_LENGTH:
        for (int i = 0; i < n; i++)
            if (store_reward(r, rewards, i, -fabs(r->target - (double)utf8_length(completions[i])), err) != 0)
                return COLT_ERR;
        return 0;
    case REWARD_REGEX: return compute_regex(r, rewards, completions, n, err);
    case REWARD_MATH: return compute_math(r, rewards, completions, rows, n, err);
    case REWARD_COMMAND:
        return compute_command(r, rewards, prompts, completions, completion_ids, completion_lens, rows, n, err);
    case REWARD_PYTHON:
        return compute_python(r, rewards, prompts, completions, messages, completion_ids, completion_lens, rows, n,
                              err);
    case REWARD_MODEL: break; /* above */
    case REWARD_JUDGE: {
        double *values = xmalloc(sizeof(double) * (size_t)n);
        int rc = reward_judge_compute(r->judge, values, prompts, completions, n, err);
        for (int i = 0; i < n && rc == 0; i++) rc = store_reward(r, rewards, i, values[i], err);
        free(values);
        return rc;
    }
    }
    return errorf(err, "reward '%s': unknown type", r->name);
}
