/* math_eval.h — `colt eval`: a model's accuracy on a math benchmark (GSM8K,
 * MATH-500, or any JSON Lines file of problems with reference answers). Each
 * problem is completed n times by the generation engine from the prompt colt
 * train would feed it (prompt.h), each completion scored by colt's math reward
 * (data/rewards.h, "math": #### N, \boxed{}, last number; numeric compare);
 * pass@1 and pass@k with the unbiased estimator of Chen et al. 2021, overall
 * and per subject and level when the rows carry them (MATH-500).
 *
 * Not the trainer's held-out evaluation (mean reward before and after
 * training, in trainer.c), and not a symbolic checker: answers compare as
 * numbers or as normalised strings, as the reward does. */
#ifndef COLT_TRAIN_MATH_EVAL_H
#define COLT_TRAIN_MATH_EVAL_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "backend/sampling.h"
#include "engine/engine.h"

/* pass@k of one problem with c correct of n samples (0 <= c <= n, 1 <= k <= n):
 * 1 - C(n-c, k) / C(n, k), the probability that k of the n samples drawn
 * without replacement hold a correct one; computed as a product, without
 * binomials that overflow. */
double math_eval_pass_at_k(int n, int c, int k);

/* pass@1 and pass@k over a set of problems. */
typedef struct MathEvalGroup {
    char *name;          /* the subject or level ("all" for every problem) */
    int problems;        /* problems scored (those with a reference answer) */
    double pass_at_1, pass_at_k;
} MathEvalGroup;

typedef struct MathEvalScore {
    int n, k;            /* samples per problem; pass@k's k */
    int problems;        /* problems read */
    int skipped;         /* problems without a reference answer (not scored) */
    MathEvalGroup all;
    MathEvalGroup *subjects, *levels; /* sorted by name (levels by length, then name: 1 < 2 < 10) */
    int n_subjects, n_levels;
} MathEvalScore;

/* Scores problems from their counts: correct[i] of n samples right, or -1 when
 * problem i has no reference answer (skipped). subjects[i] and levels[i] name
 * its groups; either array, or an entry, may be NULL (no breakdown). */
void math_eval_score(MathEvalScore *out, const int *correct, const char *const *subjects, const char *const *levels,
                     int problems, int n, int k);
void math_eval_score_free(MathEvalScore *s);

/* The score as JSON: {"problems", "skipped", "samples_per_problem", "k",
 * "pass@1", "pass@K", "by_subject": {name: {"problems", "pass@1", "pass@K"}},
 * "by_level": {...}} (the breakdowns only when there are groups; "pass@K" only
 * when K > 1). */
json_t *math_eval_score_json(const MathEvalScore *s);

/* Prints the table of the score (all, then each subject and level). */
void math_eval_print_table(FILE *fp, const MathEvalScore *s);

typedef struct MathEvalOptions {
    const char *model;          /* Hugging Face model folder (with tokenizer.json) */
    const char *adapter;        /* a LoRA adapter folder (PEFT's files) applied to it, or NULL */
    const char *dataset;        /* .jsonl / .json rows */
    const char *device;         /* cpu, cuda or auto */
    const char *prompt_column;  /* NULL: "problem" (MATH-500), else "question" (GSM8K), else "prompt" */
    const char *answer_column;  /* NULL: "answer" */
    const char *instruction;    /* appended to each problem after a newline; NULL or "": nothing */
    bool chat_template;         /* the problem as a user message through the model's chat template (if any) */
    const json_t *chat_template_kwargs; /* extra template variables, e.g. {"enable_thinking": false}; or NULL */
    int n, k;                   /* samples per problem, 1 <= k <= n */
    int limit;                  /* the first `limit` problems (0: all) */
    int max_completion_length;  /* >= 1 */
    int max_prompt_length;      /* prompts cut from the left to this many tokens (0: no cut) */
    SamplingParams sampling;    /* seed included: completion j of problem i draws from stream i * n + j */
    EngineOptions engine;
    const char *completions_path; /* NULL, or a JSON Lines file for every completion (written atomically) */
} MathEvalOptions;

/* Runs the evaluation: *summary gets the JSON summary (the score's fields,
 * the settings, timing, and per problem the prompt text the model saw, the
 * reference as the reward reads it, the correct count, subject, level and each
 * completion's extracted answer), *score the score. Errors: the
 * model or dataset cannot be read, a missing column (naming the row and the
 * columns found), a prompt that does not fit the model with
 * max_completion_length, generation or scoring failures. */
int math_eval_run(json_t **summary, MathEvalScore *score, const MathEvalOptions *o, char *err);

#endif
