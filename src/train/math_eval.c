/* math_eval.c — see math_eval.h. One engine call generates every completion
 * (problems x n, continuous batching does the rest); one reward call scores
 * them. Nothing here is sharded over processes: colt eval runs on one device. */
#include "train/math_eval.h"

#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/log.h"
#include "data/dataset.h"
#include "data/rewards.h"
#include "model/lora.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "data/prompt.h"
#include "train/train_config.h"

/* ---------------------------------------------------------------- pass@k */

double math_eval_pass_at_k(int n, int c, int k) {
    COLT_ASSERT(n >= 1 && c >= 0 && c <= n && k >= 1 && k <= n);
    if (n - c < k) return 1.0; /* every draw of k holds a correct sample */
    /* C(n-c, k) / C(n, k) = prod_{i = n-c+1}^{n} (1 - k / i) (Chen et al. 2021, appendix) */
    double all_wrong = 1.0;
    for (int i = n - c + 1; i <= n; i++) all_wrong *= 1.0 - (double)k / i;
    return 1.0 - all_wrong;
}

/* ---------------------------------------------------------------- scores */

typedef struct GroupSum {
    const char *name;
    int problems;
    double sum_1, sum_k;
} GroupSum;

/* The index of name among sums (added when new). */
static int group_index(GroupSum **sums, int *n, const char *name) {
    for (int i = 0; i < *n; i++)
        if (strcmp((*sums)[i].name, name) == 0) return i;
    *sums = xrealloc(*sums, sizeof(GroupSum) * (size_t)(*n + 1));
    (*sums)[*n] = (GroupSum){.name = name};
    return (*n)++;
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const GroupSum *)a)->name, ((const GroupSum *)b)->name);
}

/* Levels as numbers read: "2" before "10", "Level 2" before "Level 10". */
static int by_length_then_name(const void *a, const void *b) {
    const char *x = ((const GroupSum *)a)->name, *y = ((const GroupSum *)b)->name;
    size_t lx = strlen(x), ly = strlen(y);
    return lx != ly ? (lx < ly ? -1 : 1) : strcmp(x, y);
}

static MathEvalGroup group_of(const GroupSum *g) {
    return (MathEvalGroup){.name = xstrdup(g->name), .problems = g->problems,
                           .pass_at_1 = g->problems ? g->sum_1 / g->problems : NAN,
                           .pass_at_k = g->problems ? g->sum_k / g->problems : NAN};
}

/* The groups of names[i] (NULL entries in no group), sorted by cmp. */
static MathEvalGroup *make_groups(int *n_groups, const char *const *names, const int *correct, int problems, int n,
                                  int k, int (*cmp)(const void *, const void *)) {
    GroupSum *sums = NULL;
    int count = 0;
    for (int i = 0; names && i < problems; i++) {
        if (!names[i] || correct[i] < 0) continue;
        int at = group_index(&sums, &count, names[i]); /* may move sums */
        GroupSum *g = &sums[at];
        g->problems++;
        g->sum_1 += (double)correct[i] / n;
        g->sum_k += math_eval_pass_at_k(n, correct[i], k);
    }
    if (count) qsort(sums, (size_t)count, sizeof *sums, cmp);
    MathEvalGroup *groups = count ? xmalloc(sizeof(MathEvalGroup) * (size_t)count) : NULL;
    for (int i = 0; i < count; i++) groups[i] = group_of(&sums[i]);
    free(sums);
    *n_groups = count;
    return groups;
}

void math_eval_score(MathEvalScore *out, const int *correct, const char *const *subjects, const char *const *levels,
                     int problems, int n, int k) {
    COLT_ASSERT(n >= 1 && k >= 1 && k <= n && problems >= 0);
    memset(out, 0, sizeof *out);
    out->n = n, out->k = k, out->problems = problems;
    GroupSum all = {.name = "all"};
    for (int i = 0; i < problems; i++) {
        COLT_ASSERT(correct[i] >= -1 && correct[i] <= n);
        if (correct[i] < 0) {
            out->skipped++;
            continue;
        }
        all.problems++;
        all.sum_1 += (double)correct[i] / n;
        all.sum_k += math_eval_pass_at_k(n, correct[i], k);
    }
    out->all = group_of(&all);
    out->subjects = make_groups(&out->n_subjects, subjects, correct, problems, n, k, by_name);
    out->levels = make_groups(&out->n_levels, levels, correct, problems, n, k, by_length_then_name);
}

void math_eval_score_free(MathEvalScore *s) {
    free(s->all.name);
    for (int i = 0; i < s->n_subjects; i++) free(s->subjects[i].name);
    for (int i = 0; i < s->n_levels; i++) free(s->levels[i].name);
    free(s->subjects);
    free(s->levels);
    memset(s, 0, sizeof *s);
}

static json_t *number_or_null(double x) { return isnan(x) ? json_null() : json_real(x); }

static void put_pass(json_t *o, const MathEvalGroup *g, int k) {
    char key[32];
    json_object_set_new(o, "pass@1", number_or_null(g->pass_at_1));
    snprintf(key, sizeof key, "pass@%d", k);
    if (k > 1) json_object_set_new(o, key, number_or_null(g->pass_at_k));
}

static json_t *groups_json(const MathEvalGroup *groups, int n_groups, int k) {
    json_t *o = json_object();
    for (int i = 0; i < n_groups; i++) {
        json_t *g = json_pack("{s:i}", "problems", groups[i].problems);
        put_pass(g, &groups[i], k);
        json_object_set_new(o, groups[i].name, g);
    }
    return o;
}

json_t *math_eval_score_json(const MathEvalScore *s) {
    json_t *o = json_pack("{s:i,s:i,s:i,s:i}", "problems", s->problems, "skipped", s->skipped,
                          "samples_per_problem", s->n, "k", s->k);
    put_pass(o, &s->all, s->k);
    if (s->n_subjects) json_object_set_new(o, "by_subject", groups_json(s->subjects, s->n_subjects, s->k));
    if (s->n_levels) json_object_set_new(o, "by_level", groups_json(s->levels, s->n_levels, s->k));
    return o;
}

static void print_row(FILE *fp, const char *kind, const MathEvalGroup *g, int k) {
    char label[96];
    snprintf(label, sizeof label, "%s%s%s", kind, *kind ? " " : "", g->name);
    fprintf(fp, "%-32s %8d %8.4f", label, g->problems, g->pass_at_1);
    if (k > 1) fprintf(fp, " %8.4f", g->pass_at_k);
    fputc('\n', fp);
}

void math_eval_print_table(FILE *fp, const MathEvalScore *s) {
    char head[32];
    snprintf(head, sizeof head, "pass@%d", s->k);
    fprintf(fp, "%-32s %8s %8s", "", "problems", "pass@1");
    if (s->k > 1) fprintf(fp, " %8s", head);
    fputc('\n', fp);
    print_row(fp, "", &s->all, s->k);
    for (int i = 0; i < s->n_subjects; i++) print_row(fp, "subject", &s->subjects[i], s->k);
    for (int i = 0; i < s->n_levels; i++) print_row(fp, "level", &s->levels[i], s->k);
    if (s->skipped) fprintf(fp, "(%d problems without a reference answer not scored)\n", s->skipped);
}

/* ---------------------------------------------------------------- the run */

/* "a, b, c": a row's columns, for messages. */
static void columns_text(char *out, size_t n, json_t *row) {
    size_t at = 0;
    const char *key;
    json_t *v;
    out[0] = '\0';
    json_object_foreach(row, key, v) {
        if (at < n) at += (size_t)snprintf(out + at, n - at, "%s%s", at ? ", " : "", key);
    }
    if (!at) snprintf(out, n, "none");
}

/* The problem column: the one given, else the first of problem, question,
 * prompt that the first row has. */
static int choose_prompt_column(const char **column, json_t *first, const char *given, const char *path, char *err) {
    if (given) {
        *column = given;
        return COLT_OK;
    }
    static const char *const known[] = {"problem", "question", "prompt"};
    for (int i = 0; i < 3; i++)
        if (json_object_get(first, known[i])) {
            *column = known[i];
            return COLT_OK;
        }
    char columns[ERR_LEN / 2];
    columns_text(columns, sizeof columns, first);
    return errorf(err, "%s: no problem column (columns: %s): colt eval reads 'problem' (MATH-500), 'question' (GSM8K) "
                       "or 'prompt'; name another with --prompt_column",
                  path, columns);
}

/* A group name from a row's column: strings as they are, numbers as written
 * (MATH-500's levels are 1 .. 5); NULL when absent or of another type. */
static char *group_name(json_t *row, const char *column) {
    json_t *v = json_object_get(row, column);
    char buf[64];
    if (json_is_string(v)) return xstrdup(json_string_value(v));
    if (json_is_integer(v)) {
        snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(v));
        return xstrdup(buf);
    }
    if (json_is_real(v)) {
        snprintf(buf, sizeof buf, "%g", json_real_value(v));
        return xstrdup(buf);
    }
    return NULL;
}

/* The rows colt eval generates from: each source row with "prompt" set to the
 * problem (and the instruction), as a user message when use_chat; a problem
 * that is already a list of messages (a TRL conversational row) is kept as it
 * is. Checks the problem and answer columns of every row. */
static int build_rows(json_t **out, Dataset *src, size_t n_rows, const char *prompt_column, const char *answer_column,
                      const char *instruction, bool use_chat, const char *path, char *err) {
    json_t *rows = json_array();
    char columns[ERR_LEN / 2];
    for (size_t i = 0; i < n_rows; i++) {
        json_t *raw = dataset_row(src, i);
        json_t *problem = json_object_get(raw, prompt_column), *answer = json_object_get(raw, answer_column);
        const char *missing = !problem ? prompt_column : !answer ? answer_column : NULL;
        if (missing) {
            columns_text(columns, sizeof columns, raw);
            json_decref(rows);
            return errorf(err, "%s row %zu: no '%s' column (columns: %s)%s", path, i, missing, columns,
                          missing == answer_column ? "; name the reference answer's column with --answer_column" : "");
        }
        if (!json_is_string(problem) && !json_is_array(problem)) {
            json_decref(rows);
            return errorf(err, "%s row %zu: '%s' must be a string (the problem's text) or a list of messages", path, i,
                          prompt_column);
        }
        if (!json_is_string(answer) && !json_is_number(answer) && !json_is_null(answer)) {
            json_decref(rows);
            return errorf(err, "%s row %zu: '%s' must be a string or a number (the reference answer)", path, i,
                          answer_column);
        }
        if (json_is_array(problem)) { /* messages: checked by dataset_from_rows, rendered with the template */
            json_t *row = json_copy(raw);
            json_object_set(row, "prompt", problem);
            json_array_append_new(rows, row);
            continue;
        }
        const char *text = json_string_value(problem);
        bool instructed = instruction && *instruction;
        size_t len = strlen(text) + (instructed ? strlen(instruction) + 1 : 0);
        char *content = xmalloc(len + 1);
        snprintf(content, len + 1, "%s%s%s", text, instructed ? "\n" : "", instructed ? instruction : "");
        json_t *row = json_copy(raw);
        json_t *prompt = use_chat ? json_pack("[{s:s,s:s}]", "role", "user", "content", content) : json_string(content);
        free(content);
        if (!prompt) { /* only an instruction that is not UTF-8 gets here: rows come from jansson */
            json_decref(row);
            json_decref(rows);
            return errorf(err, "the instruction is not valid UTF-8");
        }
        json_object_set_new(row, "prompt", prompt);
        json_array_append_new(rows, row);
    }
    *out = rows;
    return COLT_OK;
}

/* Everything a run holds, freed in one place. */
typedef struct EvalRun {
    Tokenizer *tok;
    Dataset *src, *set;
    Backend *be;
    Model *model;
    RewardFunc *reward;
    int n_problems, n_seqs;
    int **prompt_ids, *prompt_lens;
    char **prompt_texts, **subjects, **levels, **completions, **answers;
    GenSequence *seqs;
    float *rewards;
    int *correct;
} EvalRun;

static void eval_run_free(EvalRun *r) {
    for (int i = 0; i < r->n_problems; i++) {
        if (r->prompt_ids) free(r->prompt_ids[i]);
        if (r->prompt_texts) free(r->prompt_texts[i]);
        if (r->subjects) free(r->subjects[i]);
        if (r->levels) free(r->levels[i]);
    }
    for (int i = 0; i < r->n_seqs; i++) {
        if (r->seqs) gen_sequence_free(&r->seqs[i]);
        if (r->completions) free(r->completions[i]);
        if (r->answers) free(r->answers[i]);
    }
    free(r->prompt_ids), free(r->prompt_lens), free(r->prompt_texts), free(r->subjects), free(r->levels);
    free(r->seqs), free(r->completions), free(r->answers), free(r->rewards), free(r->correct);
    reward_free(r->reward);
    model_free(r->model);
    backend_close(r->be);
    dataset_free(r->set);
    dataset_free(r->src);
    tokenizer_free(r->tok);
}

/* Reads the rows and makes every prompt (before the model is loaded, so a
 * dataset error costs nothing). */
static int prepare(EvalRun *r, const MathEvalOptions *o, const char **prompt_column, bool *use_chat, char *err) {
    if (tokenizer_load(&r->tok, o->model, err) != 0) return COLT_ERR;
    if (dataset_load_rows(&r->src, o->dataset, err) != 0) return COLT_ERR;
    size_t n_rows = dataset_size(r->src);
    if (o->limit > 0 && (size_t)o->limit < n_rows) n_rows = (size_t)o->limit;
    if ((int64_t)n_rows * o->n > TRAIN_CONFIG_MAX_COMPLETIONS)
        return errorf(err, "%zu problems x %d samples is more than the %d completions generated at once: lower --n or "
                           "--limit",
                      n_rows, o->n, TRAIN_CONFIG_MAX_COMPLETIONS);
    if (choose_prompt_column(prompt_column, dataset_row(r->src, 0), o->prompt_column, o->dataset, err) != 0)
        return COLT_ERR;
    const char *answer_column = o->answer_column ? o->answer_column : "answer";
    *use_chat = o->chat_template && tokenizer_chat_template(r->tok) != NULL;
    json_t *rows = NULL;
    if (build_rows(&rows, r->src, n_rows, *prompt_column, answer_column, o->instruction, *use_chat, o->dataset, err) != 0)
        return COLT_ERR;
    int rc = dataset_from_rows(&r->set, rows, "prompt", o->dataset, err);
    json_decref(rows);
    if (rc != 0) return COLT_ERR;
    r->n_problems = (int)n_rows;
    r->prompt_ids = xcalloc(n_rows, sizeof(int *));
    r->prompt_lens = xcalloc(n_rows, sizeof(int));
    r->prompt_texts = xcalloc(n_rows, sizeof(char *));
    r->subjects = xcalloc(n_rows, sizeof(char *));
    r->levels = xcalloc(n_rows, sizeof(char *));
    int max_prompt = o->max_prompt_length > 0 ? o->max_prompt_length : INT_MAX;
    for (size_t i = 0; i < n_rows; i++) {
        if (prompt_encode_row(&r->prompt_ids[i], &r->prompt_lens[i], &r->prompt_texts[i], r->set, i, r->tok,
                              o->chat_template_kwargs, max_prompt, o->dataset, err) != 0)
            return COLT_ERR;
        r->subjects[i] = group_name(dataset_row(r->set, i), "subject");
        r->levels[i] = group_name(dataset_row(r->set, i), "level");
    }
    return COLT_OK;
}

/* The tokenizer fits the model and every prompt fits with a whole completion. */
static int check_fit(const EvalRun *r, const MathEvalOptions *o, char *err) {
    const ModelConfig *mc = model_config(r->model);
    if (tokenizer_vocab_size(r->tok) > mc->vocab_size)
        return errorf(err, "%s: the tokenizer has %d tokens but the model only %d", o->model,
                      tokenizer_vocab_size(r->tok), mc->vocab_size);
    for (int i = 0; i < r->n_problems; i++)
        if (r->prompt_lens[i] + o->max_completion_length > mc->max_position_embeddings)
            return errorf(err, "%s row %d: prompt of %d tokens + --max_completion_length %d exceeds the model's "
                               "max_position_embeddings (%d): lower --max_completion_length, or set --max_prompt_length "
                               "(prompts are cut from the left)",
                          o->dataset, i, r->prompt_lens[i], o->max_completion_length, mc->max_position_embeddings);
    return COLT_OK;
}

/* Completes every problem n times: completion j of problem i is sequence
 * i * n + j, RNG stream i * n + j, so it does not depend on --limit or on
 * what shares its batch. */
static int generate_all(EvalRun *r, const MathEvalOptions *o, EngineStats *stats, char *err) {
    const ModelConfig *mc = model_config(r->model);
    r->n_seqs = r->n_problems * o->n;
    r->seqs = xcalloc((size_t)r->n_seqs, sizeof(GenSequence));
    for (int s = 0; s < r->n_seqs; s++) {
        r->seqs[s].prompt = r->prompt_ids[s / o->n];
        r->seqs[s].prompt_len = r->prompt_lens[s / o->n];
        r->seqs[s].stream = (uint64_t)s;
    }
    int stop_ids[MODEL_MAX_EOS + 1];
    GenerateOptions go = {.sampling = o->sampling, .max_new_tokens = o->max_completion_length, .stop_ids = stop_ids,
                          .n_stop_ids = prompt_stop_ids(stop_ids, mc, r->tok)};
    if (engine_generate(r->model, r->seqs, r->n_seqs, &go, &o->engine, stats, err) != 0) return COLT_ERR;
    r->completions = xcalloc((size_t)r->n_seqs, sizeof(char *));
    for (int s = 0; s < r->n_seqs; s++) {
        /* the text leaves out the stop token, as the trainer's completions do */
        int n_text = r->seqs[s].n_tokens - (r->seqs[s].finish == FINISH_STOP ? 1 : 0);
        if (tokenizer_decode_generated(r->tok, r->seqs[s].tokens, (size_t)n_text, true, &r->completions[s], err) != 0)
            return COLT_ERR;
    }
    return COLT_OK;
}

/* The math reward of every completion; correct[i] counts problem i's right
 * ones (-1 when its reference has no answer: the reward is NaN). */
static int score_all(EvalRun *r, const MathEvalOptions *o, char *err) {
    json_t *spec = json_pack("{s:s,s:s}", "type", "math", "column", o->answer_column ? o->answer_column : "answer");
    int rc = reward_create(&r->reward, spec, err);
    json_decref(spec);
    if (rc != 0) return COLT_ERR;
    const int N = r->n_seqs;
    const char **prompts = xmalloc(sizeof(char *) * (size_t)N);
    const int **ids = xmalloc(sizeof(int *) * (size_t)N);
    int *lens = xmalloc(sizeof(int) * (size_t)N);
    json_t **rows = xmalloc(sizeof(json_t *) * (size_t)N);
    r->rewards = xmalloc(sizeof(float) * (size_t)N);
    for (int s = 0; s < N; s++) {
        prompts[s] = r->prompt_texts[s / o->n];
        ids[s] = r->seqs[s].tokens;
        lens[s] = r->seqs[s].n_tokens;
        rows[s] = dataset_row(r->set, (size_t)(s / o->n));
    }
    rc = reward_compute(r->reward, r->rewards, prompts, (const char *const *)r->completions, ids, lens, rows, N, err);
    free(prompts), free(ids), free(lens), free(rows);
    if (rc != 0) return COLT_ERR;
    r->correct = xcalloc((size_t)r->n_problems, sizeof(int));
    r->answers = xcalloc((size_t)N, sizeof(char *));
    for (int s = 0; s < N; s++) {
        int i = s / o->n;
        if (isnan(r->rewards[s])) r->correct[i] = -1;
        else if (r->correct[i] >= 0 && r->rewards[s] == 1.0f) r->correct[i]++;
        r->answers[s] = reward_extract_answer(r->completions[s]);
    }
    return COLT_OK;
}

static json_t *text_or_null(const char *s) { return s ? json_string(s) : json_null(); }

/* The reference as the math reward compares it (GSM8K's "#### N" -> "N"). */
static json_t *reference_json(json_t *row, const char *column) {
    json_t *v = json_object_get(row, column);
    if (json_is_number(v)) return json_incref(v);
    char *text = json_is_string(v) ? reward_reference_answer(json_string_value(v)) : NULL;
    json_t *out = text_or_null(text);
    free(text);
    return out;
}

/* Every completion, one JSON line each, written atomically. */
static int write_completions(const EvalRun *r, const MathEvalOptions *o, const char *answer_column, char *err) {
    AtomicFile af;
    if (atomic_open(&af, o->completions_path, err) != 0) return COLT_ERR;
    int rc = COLT_OK;
    for (int s = 0; rc == 0 && s < r->n_seqs; s++) {
        int i = s / o->n;
        json_t *line = json_pack("{s:i,s:i,s:o,s:o,s:o,s:o,s:i,s:b}", "problem", i, "sample", s % o->n, "completion",
                                 text_or_null(r->completions[s]), "answer", text_or_null(r->answers[s]), "reference",
                                 reference_json(dataset_row(r->set, (size_t)i), answer_column), "reward",
                                 number_or_null(r->rewards[s]), "tokens", r->seqs[s].n_tokens, "stopped",
                                 r->seqs[s].finish == FINISH_STOP);
        char *text = line ? json_dumps(line, JSON_COMPACT) : NULL;
        rc = !text ? errorf(err, "%s: completion %d cannot be written as JSON", o->completions_path, s)
                   : atomic_write(&af, text, strlen(text), err) != 0 || atomic_write(&af, "\n", 1, err) != 0 ? COLT_ERR
                                                                                                             : COLT_OK;
        free(text);
        json_decref(line);
    }
    if (rc != 0) {
        atomic_abort(&af);
        return COLT_ERR;
    }
    return atomic_commit(&af, err);
}

/* The summary: the score, the settings, timing, and every problem's result. */
static json_t *summary_json(const EvalRun *r, const MathEvalOptions *o, const MathEvalScore *score,
                            const char *prompt_column, bool use_chat, const EngineStats *st, double seconds) {
    const char *answer_column = o->answer_column ? o->answer_column : "answer";
    json_t *s = json_pack("{s:s,s:s,s:s,s:s,s:s}", "model", o->model, "dataset", o->dataset, "device", r->be->name,
                          "prompt_column", prompt_column, "answer_column", answer_column);
    if (o->adapter) json_object_set_new(s, "adapter", json_string(o->adapter));
    json_t *score_json = math_eval_score_json(score);
    json_object_update(s, score_json);
    json_decref(score_json);
    json_t *settings = json_pack("{s:f,s:f,s:i,s:f,s:I,s:i,s:i,s:s,s:b,s:i}", "temperature", o->sampling.temperature,
                                 "top_p", o->sampling.top_p, "top_k", o->sampling.top_k, "min_p", o->sampling.min_p,
                                 "seed", (json_int_t)o->sampling.seed, "max_completion_length",
                                 o->max_completion_length, "max_prompt_length", o->max_prompt_length, "instruction",
                                 o->instruction ? o->instruction : "", "chat_template", use_chat, "limit", o->limit);
    json_object_set_new(s, "settings", settings);
    int64_t tokens = 0, stopped = 0;
    for (int k = 0; k < r->n_seqs; k++) tokens += r->seqs[k].n_tokens, stopped += r->seqs[k].finish == FINISH_STOP;
    json_object_set_new(s, "completions", json_integer(r->n_seqs));
    json_object_set_new(s, "mean_completion_tokens", json_real(r->n_seqs ? (double)tokens / r->n_seqs : 0.0));
    json_object_set_new(s, "clipped_ratio", json_real(r->n_seqs ? 1.0 - (double)stopped / r->n_seqs : 0.0));
    json_object_set_new(s, "seconds", json_real(seconds));
    json_object_set_new(s, "generation_seconds", json_real(st->seconds));
    json_t *results = json_array();
    for (int i = 0; i < r->n_problems; i++) {
        json_t *answers = json_array();
        for (int j = 0; j < o->n; j++) json_array_append_new(answers, text_or_null(r->answers[i * o->n + j]));
        json_t *p = json_pack("{s:i,s:o,s:o,s:o,s:o,s:o,s:o}", "index", i, "prompt", text_or_null(r->prompt_texts[i]),
                              "reference", reference_json(dataset_row(r->set, (size_t)i), answer_column), "correct",
                              r->correct[i] < 0 ? json_null() : json_integer(r->correct[i]), "subject",
                              text_or_null(r->subjects[i]), "level", text_or_null(r->levels[i]), "answers", answers);
        json_array_append_new(results, p);
    }
    json_object_set_new(s, "results", results);
    return s;
}

int math_eval_run(json_t **summary, MathEvalScore *score, const MathEvalOptions *o, char *err) {
    COLT_ASSERT(o->n >= 1 && o->k >= 1 && o->k <= o->n && o->max_completion_length >= 1);
    *summary = NULL;
    memset(score, 0, sizeof *score);
    double start = time_now();
    EvalRun r;
    memset(&r, 0, sizeof r);
    const char *prompt_column = NULL;
    bool use_chat = false;
    EngineStats stats;
    memset(&stats, 0, sizeof stats);
    int rc = prepare(&r, o, &prompt_column, &use_chat, err);
    if (rc == 0 && !(r.be = backend_open(o->device, 0, err))) rc = COLT_ERR;
    if (rc == 0) rc = model_load(&r.model, o->model, r.be, err);
    if (rc == 0 && o->adapter) rc = model_lora_load(r.model, o->adapter, err);
    if (rc == 0) rc = check_fit(&r, o, err);
    if (rc == 0) {
        log_info0("colt eval: %s on %s: %d problem%s, %d completion%s each (%s, %s, temperature %g, at most %d tokens)",
                  o->model, o->dataset, r.n_problems, r.n_problems == 1 ? "" : "s", o->n, o->n == 1 ? "" : "s",
                  r.be->name,
                  use_chat ? "chat template" : "plain prompts", o->sampling.temperature, o->max_completion_length);
        rc = generate_all(&r, o, &stats, err);
    }
    if (rc == 0) rc = score_all(&r, o, err);
    if (rc == 0 && o->completions_path)
        rc = write_completions(&r, o, o->answer_column ? o->answer_column : "answer", err);
    if (rc == 0) {
        math_eval_score(score, r.correct, (const char *const *)r.subjects, (const char *const *)r.levels,
                        r.n_problems, o->n, o->k);
        *summary = summary_json(&r, o, score, prompt_column, use_chat, &stats, time_now() - start);
    }
    eval_run_free(&r);
    return rc;
}
