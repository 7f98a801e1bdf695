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
 * The process plumbing is in reward_process.c. */
#include "data/rewards.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <math.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "data/reward_process.h"

typedef enum { REWARD_LENGTH, REWARD_REGEX, REWARD_MATH, REWARD_COMMAND } RewardType;

struct RewardFunc {
    RewardType type;
    char *name;
    double target;          /* length */
    pcre2_code *regex;      /* regex */
    double match_reward;    /* regex: the reward on a match (0 otherwise) */
    char *column;           /* math: the dataset column holding the reference */
    RewardProcess *process; /* command */
    char *command;          /* command: its text, for messages */
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

int reward_create(RewardFunc **out, json_t *spec, char *err) {
    *out = NULL;
    if (!json_is_object(spec)) return errorf(err, "a reward must be an object with a \"type\", got %s", json_type_name(spec));
    json_t *type_v = json_object_get(spec, "type");
    if (!json_is_string(type_v))
        return errorf(err, "a reward needs a \"type\" string (length, regex, math or command)%s",
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
        if (reward_process_start(&r->process, json_string_value(command), r->name,
                                 timeout ? json_number_value(timeout) : 30.0, err) != 0)
            goto error;
    } else {
        errorf(err, "unknown reward type \"%s\" (known: length, regex, math, command)", type);
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
    if (r->regex) pcre2_code_free(r->regex);
    free(r->column);
    free(r->command);
    free(r->name);
    free(r);
}

const char *reward_name(const RewardFunc *r) { return r->name; }

pid_t reward_command_pid(const RewardFunc *r) { return r->type == REWARD_COMMAND ? reward_process_pid(r->process) : 0; }

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

/* Builds {"prompts", "completions", "<column>": [...]} — every column of the
 * rows except "prompt" (and any named "prompts"/"completions"), null where a
 * row lacks it. */
static int build_request(json_t **out, const RewardFunc *r, const char *const *prompts,
                         const char *const *completions, json_t *const *rows, int n, char *err) {
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
    for (int i = 0; rows && i < n; i++) {
        const char *key;
        json_t *value;
        json_object_foreach(rows[i], key, value) {
            if (!strcmp(key, "prompt") || !strcmp(key, "prompts") || !strcmp(key, "completions")) continue;
            if (json_object_get(req, key)) continue;
            json_t *column = json_array();
            for (int k = 0; k < n; k++) {
                json_t *v = json_object_get(rows[k], key);
                json_array_append_new(column, v ? json_incref(v) : json_null());
            }
            json_object_set_new(req, key, column);
        }
    }
    *out = req;
    return 0;
}

static int compute_command(RewardFunc *r, float *rewards, const char *const *prompts, const char *const *completions,
                           json_t *const *rows, int n, char *err) {
    json_t *req = NULL, *reply = NULL;
    if (build_request(&req, r, prompts, completions, rows, n, err) != 0) return COLT_ERR;
    int rc = reward_process_call(r->process, &reply, req, err);
    json_decref(req);
    if (rc != 0) return COLT_ERR;
    json_t *list = json_object_get(reply, "rewards");
    if (!json_is_object(reply) || !json_is_array(list)) {
        errorf(err, "reward command '%s': its answer must be {\"rewards\": [...]}, got %s%s", r->command,
               json_type_name(reply), json_is_object(reply) ? " without a \"rewards\" list" : "");
        goto error;
    }
    if (json_array_size(list) != (size_t)n) {
        errorf(err, "reward command '%s' returned %zu rewards for %d completions", r->command,
               json_array_size(list), n);
        goto error;
    }
    for (int i = 0; i < n; i++) {
        json_t *v = json_array_get(list, (size_t)i);
        if (json_is_null(v)) {
            rewards[i] = NAN;
        } else if (json_is_number(v)) {
            if (store_reward(r, rewards, i, json_number_value(v), err) != 0) goto error;
        } else {
            errorf(err, "reward command '%s': rewards[%d] is %s, expected a number or null", r->command, i,
                   json_type_name(v));
            goto error;
        }
    }
    json_decref(reply);
    return 0;
error:
    json_decref(reply);
    return COLT_ERR;
}

int reward_compute(RewardFunc *r, float *rewards, const char *const *prompts, const char *const *completions,
                   json_t *const *rows, int n, char *err) {
    if (n <= 0) return 0;
    switch (r->type) {
    case REWARD_LENGTH:
        for (int i = 0; i < n; i++)
            if (store_reward(r, rewards, i, -fabs(r->target - (double)utf8_length(completions[i])), err) != 0)
                return COLT_ERR;
        return 0;
    case REWARD_REGEX: return compute_regex(r, rewards, completions, n, err);
    case REWARD_MATH: return compute_math(r, rewards, completions, rows, n, err);
    case REWARD_COMMAND: return compute_command(r, rewards, prompts, completions, rows, n, err);
    }
    return errorf(err, "reward '%s': unknown type", r->name);
}
