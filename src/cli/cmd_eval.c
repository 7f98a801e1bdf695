/* cmd_eval.c — `colt eval`: pass@1 and pass@k of a model on a math benchmark
 * (train/math_eval.h does the work). Prints a table on stdout and writes the
 * JSON summary atomically. Not a general benchmark harness: it scores with
 * colt's math reward only. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/error.h"
#include "core/fileio.h"
#include "train/math_eval.h"

static const char *EVAL_USAGE =
    "usage: colt eval --model DIR --dataset FILE [options]\n"
    "  pass@1 and pass@k of the model on a math benchmark: GSM8K rows {\"question\", \"answer\": \"... #### N\"},\n"
    "  MATH-500 rows {\"problem\", \"answer\", \"subject\", \"level\"} (broken down by subject and level), or any\n"
    "  JSON Lines file with a problem and a reference-answer column. Each problem (plus --instruction) is\n"
    "  rendered as colt train renders prompts: a user message through the model's chat template when it has\n"
    "  one (a problem given as chat messages is rendered as it is). --n completions per problem from the\n"
    "  engine, each scored by colt's math reward (#### N, \\boxed{}, last number; numeric compare); pass@k\n"
    "  is the unbiased estimator of Chen et al. 2021. Completion j of\n"
    "  problem i samples from RNG stream i * n + j with --seed: the same command gives the same numbers.\n"
    "  docs/evaluation.md has the details.\n";

#define DEFAULT_INSTRUCTION "Please reason step by step, and put your final answer within \\boxed{}."

/* eval_<stem>.json for dataset path .../<stem>.<ext> */
static char *default_output(const char *dataset) {
    const char *base = strrchr(dataset, '/');
    base = base ? base + 1 : dataset;
    const char *dot = strrchr(base, '.');
    int stem = dot && dot != base ? (int)(dot - base) : (int)strlen(base);
    size_t n = (size_t)stem + 16;
    char *out = xmalloc(n);
    snprintf(out, n, "eval_%.*s.json", stem, base);
    return out;
}

int cmd_eval(int argc, char **argv) {
    char err[ERR_LEN];
    MathEvalOptions o = {.device = "auto", .n = 1, .max_completion_length = 1024, .chat_template = true,
                         .instruction = DEFAULT_INSTRUCTION};
    o.sampling = sampling_params_greedy();
    const char *output = NULL;
    float temperature = 0.0f, top_p = 1.0f, min_p = 0.0f, gpu_memory_utilization = 0.0f;
    int k = 0, top_k = 0, max_num_seqs = 0;
    uint64_t seed = 0;
    bool deterministic = false, enforce_eager = false;
    const char *template_kwargs_text = NULL;
    CliOption opts[] = {
        {"model", OPT_STRING, &o.model, "Hugging Face model folder with tokenizer.json (required)", false},
        {"dataset", OPT_STRING, &o.dataset, "JSON Lines (or JSON) file of problems (required)", false},
        {"n", OPT_INT, &o.n, "completions per problem (default 1)", false},
        {"k", OPT_INT, &k, "pass@k's k, at most --n (default --n)", false},
        {"temperature", OPT_FLOAT, &temperature, "0 = greedy (default 0 with --n 1, else 1)", false},
        {"top_p", OPT_FLOAT, &top_p, "nucleus sampling mass (default 1 = off)", false},
        {"top_k", OPT_INT, &top_k, "keep the k most likely tokens (default 0 = off)", false},
        {"min_p", OPT_FLOAT, &min_p, "drop tokens below min_p * p(max) (default 0 = off)", false},
        {"seed", OPT_U64, &seed, "random seed (default 0)", false},
        {"max_completion_length", OPT_INT, &o.max_completion_length, "tokens per completion at most (default 1024)",
         false},
        {"max_prompt_length", OPT_INT, &o.max_prompt_length,
         "keep the last N prompt tokens (default 0: whole prompts; one that does not fit is an error)", false},
        {"limit", OPT_INT, &o.limit, "evaluate the first N problems (default 0 = all)", false},
        {"instruction", OPT_STRING, &o.instruction,
         "text appended to each problem after a newline (default \"" DEFAULT_INSTRUCTION "\"; \"\" = none)", false},
        {"chat_template", OPT_FLAG, &o.chat_template,
         "render the problem as a user message with the model's chat template, when it has one (default true)",
         false},
        {"adapter", OPT_STRING, &o.adapter,
         "a LoRA adapter folder (PEFT's files, e.g. a use_peft run's output_dir) applied to the model", false},
        {"chat_template_kwargs", OPT_STRING, &template_kwargs_text,
         "extra chat template variables as a JSON object, e.g. '{\"enable_thinking\": false}' (Qwen3)", false},
        {"prompt_column", OPT_STRING, &o.prompt_column,
         "the problem's column (default: problem, else question, else prompt)", false},
        {"answer_column", OPT_STRING, &o.answer_column, "the reference answer's column (default answer)", false},
        {"output", OPT_STRING, &output, "the JSON summary (default eval_<dataset name>.json)", false},
        {"completions", OPT_STRING, &o.completions_path, "also write every completion to this JSON Lines file",
         false},
        {"device", OPT_STRING, &o.device, "cpu, cuda, cuda_f32 (fp32 weights) or auto (default: cuda when a GPU is usable)", false},
        {"gpu_memory_utilization", OPT_FLOAT, &gpu_memory_utilization,
         "cap of the KV cache as a fraction of device memory (default: what is free)", false},
        {"max_num_seqs", OPT_INT, &max_num_seqs, "sequences decoded together at most (default 256)", false},
        {"deterministic", OPT_FLAG, &deterministic,
         "batch-invariant kernels: a completion does not depend on its batch", false},
        {"enforce_eager", OPT_FLAG, &enforce_eager, "no CUDA graphs for decode steps", false},
    };
    const int n_opts = (int)(sizeof opts / sizeof opts[0]);
    int prc = cli_parse(opts, n_opts, argc, argv, EVAL_USAGE, err);
    if (prc == 1) return 0;
    if (prc != 0) return cli_fail("eval", err);
    if (!o.model || !o.dataset) return cli_fail("eval", "--model DIR and --dataset FILE are required");
    char model_folder[4096];
    if (cli_model_folder(model_folder, sizeof model_folder, "eval", o.model, NULL) != 0) return 1;
    o.model = model_folder;
    if (o.n < 1) return cli_fail("eval", "--n must be >= 1");
    bool k_given = false, temperature_given = false;
    for (int i = 0; i < n_opts; i++) {
        if (opts[i].value == &k) k_given = opts[i].seen;
        if (opts[i].value == &temperature) temperature_given = opts[i].seen;
    }
    o.k = k_given ? k : o.n;
    if (o.k < 1) return cli_fail("eval", "--k must be >= 1");
    if (o.k > o.n) {
        snprintf(err, sizeof err, "--k %d is more than --n %d: pass@k needs at least k completions per problem", o.k,
                 o.n);
        return cli_fail("eval", err);
    }
    if (o.max_completion_length < 1) return cli_fail("eval", "--max_completion_length must be >= 1");
    if (o.max_prompt_length < 0) return cli_fail("eval", "--max_prompt_length must be >= 0");
    if (o.limit < 0) return cli_fail("eval", "--limit must be >= 0");
    if (max_num_seqs < 0) return cli_fail("eval", "--max_num_seqs must be >= 0");
    if (!(gpu_memory_utilization >= 0.0f && gpu_memory_utilization <= 1.0f))
        return cli_fail("eval", "--gpu_memory_utilization must be in [0, 1]");
    o.sampling.temperature = temperature_given ? temperature : o.n > 1 ? 1.0f : 0.0f;
    o.sampling.top_p = top_p;
    o.sampling.top_k = top_k;
    o.sampling.min_p = min_p;
    o.sampling.seed = seed;
    if (sampling_params_validate(&o.sampling, err) != 0) return cli_fail("eval", err);
    o.engine = (EngineOptions){.gpu_memory_utilization = gpu_memory_utilization, .max_num_seqs = max_num_seqs,
                               .deterministic = deterministic, .enforce_eager = enforce_eager};

    /* A bad output path is refused before the evaluation, not after it */
    char *path = output ? xstrdup(output) : default_output(o.dataset);
    if (file_check_output(path, err) != 0 || (o.completions_path && file_check_output(o.completions_path, err) != 0)) {
        free(path);
        return cli_fail("eval", err);
    }
    json_t *template_kwargs = NULL;
    if (template_kwargs_text) {
        json_error_t jerr;
        template_kwargs = json_loads(template_kwargs_text, JSON_REJECT_DUPLICATES, &jerr);
        if (!json_is_object(template_kwargs)) {
            json_decref(template_kwargs);
            free(path);
            return cli_fail("eval", "--chat_template_kwargs must be a JSON object, e.g. '{\"enable_thinking\": false}'");
        }
        o.chat_template_kwargs = template_kwargs;
    }
    json_t *summary = NULL;
    MathEvalScore score;
    int run_rc = math_eval_run(&summary, &score, &o, err);
    json_decref(template_kwargs);
    if (run_rc != 0) {
        free(path);
        return cli_fail("eval", err);
    }
    char *text = json_dumps(summary, JSON_INDENT(2) | JSON_REAL_PRECISION(8));
    int rc = text ? file_write_atomic(path, text, strlen(text), err) : errorf(err, "%s: cannot encode", path);
    if (rc == 0) {
        math_eval_print_table(stdout, &score);
        printf("summary: %s\n", path);
    }
    free(text);
    free(path);
    json_decref(summary);
    math_eval_score_free(&score);
    return rc == 0 ? 0 : cli_fail("eval", err);
}
