/* cmd_generate.c — `colt generate`: complete one prompt (text, chat message or
 * ids) n times. Sampling defaults come from the model's generation_config.json
 * when it asks for sampling (do_sample), else greedy, as transformers does;
 * flags override. Completion i uses RNG stream i, so --n does not change what
 * completion 0 is. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "cli/cli_json.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/log.h"
#include "dist/launch_env.h"
#include "parallel/mesh.h"
#include "engine/engine.h"
#include "model/lora.h"
#include "model/model.h"
#include "tokenizer/tokenizer.h"
#include "train/train_config.h"
#include "data/prompt.h"

static const char *GENERATE_USAGE =
    "usage: colt generate --model DIR (--prompt TEXT | --chat TEXT | --ids JSON_ARRAY | --prompts FILE) [options]\n"
    "  prints each completion's text, or with --json one line {\"ids\": [...], \"text\": ...} per completion\n"
    "  (ids of the completion only). Sampling defaults: generation_config.json if it samples, else greedy.\n"
    "  --prompts FILE: one JSON object per line with one of \"prompt\" (text, or a list of messages as in a\n"
    "  colt train / TRL dataset row; other columns are ignored), \"chat\" (a user message),\n"
    "  \"messages\" (a chat) or \"ids\"; all are generated together (--n completions each, in file order;\n"
    "  --json lines then carry \"prompt_index\"). Prompts that start alike share their cached KV blocks.\n"
    "  A chat line may carry \"tools\" (a list) and \"chat_template_kwargs\" (an object, instead of the flag's).\n"
    "  --chat_template_kwargs JSON: extra chat template variables, e.g. '{\"enable_thinking\": false}' (Qwen3).\n"
    "  --bench prints one line of engine statistics (throughput, steps, KV pool) instead of the completions.\n"
    "  --adapter DIR applies a LoRA adapter (PEFT's files) to the model.\n"
    "  --regex RE: structured outputs: every completion that ends on eos is a full match of RE (PCRE2 on bytes;\n"
    "  tokens that cannot continue a match are masked, eos only after a full match; log-probs are the masked\n"
    "  distribution's). Needs a byte-level BPE tokenizer (Qwen, Llama 3); set --max_new_tokens to room for a match.\n"
    "  --tensor_parallel_size N: the model cut across N processes (mpirun -np N colt generate ...), each holding\n"
    "  1/N of every layer; rank 0 prints. Local rank r computes on GPU r; ranks on GPUs of their own talk over\n"
    "  NCCL, ranks beyond the visible GPUs share them and talk through the host.\n";

typedef struct GenerateArgs {
    const char *model, *adapter, *prompt, *chat, *ids, *prompts_file, *device, *regex;
    const char *chat_template_kwargs_text; /* --chat_template_kwargs */
    json_t *chat_template_kwargs;          /* ... parsed; NULL when not given */
    int max_new_tokens, top_k, n, block_size, max_num_seqs, tensor_parallel_size;
    float temperature, top_p, min_p, repetition_penalty, gpu_memory_utilization;
    uint64_t seed;
    bool ignore_eos, json, enforce_eager, bench, deterministic, no_prefix_caching;
} GenerateArgs;

/* Token ids of one prompt given as text, as chat messages (with tools and
 * chat_template_kwargs when not NULL) or as a JSON array of ids (data/prompt.h
 * encodes the first two); exactly one of the three is non-NULL. Errors name `where`. */
static int encode_prompt(int **ids, size_t *n_ids, const char *text, json_t *messages, json_t *tools,
                         json_t *chat_template_kwargs, json_t *id_array, const Tokenizer *tok, int vocab,
                         const char *where, char *err) {
    if (id_array) return cli_json_ids_from_array(ids, n_ids, id_array, vocab, where, err);
    if (!tok) return errorf(err, "%s: the model folder has no tokenizer.json, so text cannot be used (give ids)", where);
    int n = 0, rc = messages ? prompt_encode_chat(ids, &n, tok, messages, tools, chat_template_kwargs, vocab, where, err)
                             : prompt_encode_text(ids, &n, tok, text, false, vocab, where, err);
    *n_ids = (size_t)n;
    return rc;
}

/* The prompt of --prompt / --chat / --ids. */
static int build_prompt(int **ids, size_t *n_ids, const GenerateArgs *a, const Tokenizer *tok, int vocab, char *err) {
    if (a->ids) {
        json_error_t jerr;
        json_t *arr = json_loads(a->ids, JSON_DECODE_ANY, &jerr);
        if (!arr) return errorf(err, "--ids: invalid JSON: %s", jerr.text);
        int rc = encode_prompt(ids, n_ids, NULL, NULL, NULL, NULL, arr, tok, vocab, "--ids", err);
        json_decref(arr);
        return rc;
    }
    json_t *msgs = NULL;
    if (a->chat && !(msgs = json_pack("[{s:s,s:s}]", "role", "user", "content", a->chat)))
        return errorf(err, "--chat: text is not valid UTF-8");
    int rc = encode_prompt(ids, n_ids, a->prompt, msgs, NULL, a->chat_template_kwargs, NULL, tok, vocab,
                           a->chat ? "--chat" : "--prompt", err);
    json_decref(msgs);
    return rc;
}

/* The prompts of --prompts FILE: one JSON object per line with exactly one of
 * "prompt" (text, or a list of messages as in TRL's conversational rows: the
 * file colt train reads works here), "chat" (a user message), "messages" (a
 * chat) or "ids"; other columns are ignored; a chat
 * may carry "tools" and "chat_template_kwargs" (else chat_template_kwargs, the
 * flag's). */
static int read_prompts_file(int ***prompts, size_t **lens, int *n_prompts, const char *path, const Tokenizer *tok,
                             int vocab, json_t *chat_template_kwargs, char *err) {
    char *data = NULL;
    size_t len = 0;
    if (file_read_all(path, &data, &len, err) != 0) return error_prefix(err, "--prompts");
    int cap = 16, n = 0, rc = COLT_OK, line_no = 0;
    *prompts = xmalloc(sizeof(int *) * (size_t)cap);
    *lens = xmalloc(sizeof(size_t) * (size_t)cap);
    for (char *line = data, *next; rc == 0 && line && *line; line = next) {
        line_no++;
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        if (strspn(line, " \t\r") == strlen(line)) continue; /* blank line */
        char where[300];
        snprintf(where, sizeof where, "%s line %d", path, line_no);
        json_t *o = NULL;
        if (cli_json_parse_line(&o, line, where, err) != 0) {
            rc = COLT_ERR;
            break;
        }
        json_t *text = json_object_get(o, "prompt"), *chat = json_object_get(o, "chat"),
               *msgs = json_object_get(o, "messages"), *ids = json_object_get(o, "ids");
        json_t *wrapped = NULL, *tools = NULL, *kwargs = NULL;
        /* TRL's rows, as colt train reads them: "prompt" is text, or a list of messages (a chat) */
        json_t *prompt_chat = json_is_array(text) ? text : NULL;
        if (prompt_chat) text = NULL;
        int given = (text != NULL) + (prompt_chat != NULL) + (chat != NULL) + (msgs != NULL) + (ids != NULL);
        if (given == 1 && prompt_chat) msgs = prompt_chat;
        if (given != 1) {
            rc = errorf(err, "%s: give exactly one of \"prompt\", \"chat\", \"messages\" or \"ids\"", where);
        } else if ((text && !json_is_string(text)) || (chat && !json_is_string(chat)) ||
                   (msgs && !json_is_array(msgs)) || (ids && !json_is_array(ids))) {
            rc = errorf(err, "%s: \"prompt\" takes a string or a list of messages, \"chat\" a string, \"messages\" and "
                             "\"ids\" an array", where);
        } else if (chat && !(msgs = wrapped = json_pack("[{s:s,s:s}]", "role", "user", "content",
                                                         json_string_value(chat)))) {
            rc = errorf(err, "%s: \"chat\" could not be wrapped as a message", where);
        } else if (prompt_chat_options(&tools, &kwargs, o, where, err) != 0) {
            rc = COLT_ERR;
        } else if ((tools || kwargs) && !msgs) {
            rc = errorf(err, "%s: \"tools\" and \"chat_template_kwargs\" apply to \"chat\" or \"messages\" only",
                        where);
        } else {
            if (n == cap) {
                cap *= 2;
                *prompts = xrealloc(*prompts, sizeof(int *) * (size_t)cap);
                *lens = xrealloc(*lens, sizeof(size_t) * (size_t)cap);
            }
            rc = encode_prompt(&(*prompts)[n], &(*lens)[n], text ? json_string_value(text) : NULL, msgs, tools,
                               kwargs ? kwargs : chat_template_kwargs, ids, tok, vocab, where, err);
            if (rc == 0) n++;
        }
        json_decref(wrapped);
        json_decref(o);
    }
    free(data);
    if (rc == 0 && n == 0) rc = errorf(err, "--prompts: %s holds no prompt", path);
    *n_prompts = n;
    return rc;
}

int cmd_generate(int argc, char **argv) {
    char err[ERR_LEN];
    GenerateArgs a = {.device = "auto", .max_new_tokens = 128, .n = 1, .temperature = 0.0f, .top_p = 1.0f,
                      .repetition_penalty = 1.0f, .tensor_parallel_size = 1};
    CliOption opts[] = {
        {"model", OPT_STRING, &a.model, "Hugging Face model folder (required)", false},
        {"adapter", OPT_STRING, &a.adapter,
         "a LoRA adapter folder (PEFT's adapter_config.json + adapter_model.safetensors, e.g. a use_peft run's "
         "output_dir) applied to the model", false},
        {"prompt", OPT_STRING, &a.prompt, "prompt text (BOS added when the tokenizer says so)", false},
        {"chat", OPT_STRING, &a.chat, "a user message, wrapped with the chat template", false},
        {"ids", OPT_STRING, &a.ids, "prompt token ids as a JSON array", false},
        {"prompts", OPT_STRING, &a.prompts_file, "a JSONL file of prompts, generated together", false},
        {"chat_template_kwargs", OPT_STRING, &a.chat_template_kwargs_text,
         "a JSON object of extra chat template variables for --chat and --prompts, e.g. '{\"enable_thinking\": false}'",
         false},
        {"max_new_tokens", OPT_INT, &a.max_new_tokens, "tokens to generate at most (default 128)", false},
        {"temperature", OPT_FLOAT, &a.temperature, "0 = greedy", false},
        {"top_p", OPT_FLOAT, &a.top_p, "nucleus sampling mass (1 = off)", false},
        {"top_k", OPT_INT, &a.top_k, "keep the k most likely tokens (0 = off)", false},
        {"min_p", OPT_FLOAT, &a.min_p, "drop tokens below min_p * p(max) (0 = off)", false},
        {"repetition_penalty", OPT_FLOAT, &a.repetition_penalty, "> 1 discourages repeats (1 = off)", false},
        {"seed", OPT_U64, &a.seed, "random seed (default 0)", false},
        {"n", OPT_INT, &a.n, "completions of the prompt (default 1)", false},
        {"ignore_eos", OPT_FLAG, &a.ignore_eos, "do not stop at end-of-sequence tokens", false},
        {"regex", OPT_STRING, &a.regex, "constrain every completion to a full match of this regex (PCRE2)", false},
        {"json", OPT_FLAG, &a.json, "print one JSON line per completion", false},
        {"device", OPT_STRING, &a.device, "cpu, cuda, cuda_f32 (fp32 weights) or auto (default: cuda when a GPU is usable)", false},
        {"gpu_memory_utilization", OPT_FLOAT, &a.gpu_memory_utilization,
         "cap of the KV cache as a fraction of device memory (default: what is free)", false},
        {"max_num_seqs", OPT_INT, &a.max_num_seqs, "sequences decoded together at most (default 256)", false},
        {"block_size", OPT_INT, &a.block_size, "tokens per KV cache block (default 16)", false},
        {"enforce_eager", OPT_FLAG, &a.enforce_eager, "no CUDA graphs for decode steps", false},
        {"no_prefix_caching", OPT_FLAG, &a.no_prefix_caching,
         "recompute every prompt's KV (by default blocks whose tokens match are shared)", false},
        {"deterministic", OPT_FLAG, &a.deterministic,
         "batch-invariant kernels: the same completion whatever the batch; log-probs as the trainer scores them",
         false},
        {"bench", OPT_FLAG, &a.bench, "print engine statistics instead of the completions", false},
        {"tensor_parallel_size", OPT_INT, &a.tensor_parallel_size,
         "processes the model is cut across (default 1; run under mpirun -np N)", false},
    };
    const int n_opts = (int)(sizeof opts / sizeof opts[0]);
    int prc = cli_parse(opts, n_opts, argc, argv, GENERATE_USAGE, err);
    if (prc == 1) return 0;
    if (prc != 0) return cli_fail("generate", err);
    if (!a.model) return cli_fail("generate", "--model DIR is required");
    char model_folder[4096];
    if (cli_model_folder(model_folder, sizeof model_folder, "generate", a.model, NULL) != 0) return 1;
    a.model = model_folder;
    if ((a.prompt != NULL) + (a.chat != NULL) + (a.ids != NULL) + (a.prompts_file != NULL) != 1)
        return cli_fail("generate", "give exactly one of --prompt, --chat, --ids or --prompts");
    if (a.chat_template_kwargs_text && !a.chat && !a.prompts_file)
        return cli_fail("generate", "--chat_template_kwargs applies to --chat and --prompts only");
    /* bounded before anything is allocated: --n 1000000000 asked for 48 GB of sequences */
    if (a.n < 1 || a.n > TRAIN_CONFIG_MAX_COMPLETIONS) {
        snprintf(err, ERR_LEN, "--n %d is out of range: 1 to %d completions", a.n, TRAIN_CONFIG_MAX_COMPLETIONS);
        return cli_fail("generate", err);
    }
    if (a.max_new_tokens < 0) return cli_fail("generate", "--max_new_tokens must be >= 0");
    if (a.max_num_seqs < 0) return cli_fail("generate", "--max_num_seqs must be >= 0");
    if (a.block_size < 0 || (a.block_size & (a.block_size - 1)))
        return cli_fail("generate", "--block_size must be a power of two");
    if (!(a.gpu_memory_utilization >= 0.0f && a.gpu_memory_utilization <= 1.0f))
        return cli_fail("generate", "--gpu_memory_utilization must be in [0, 1]");
    if (a.tensor_parallel_size < 1) return cli_fail("generate", "--tensor_parallel_size must be >= 1");

    ModelConfig cfg_probe;
    GenerationDefaults gen;
    if (model_config_load(&cfg_probe, &gen, a.model, err) != 0) return cli_fail("generate", err);
    if (model_tp_check(&cfg_probe, a.tensor_parallel_size, err) != 0) return cli_fail("generate", err);

    /* Tensor parallel: one process per part, the launch's world exactly one group. */
    LaunchEnv env;
    if (launch_env_from_process(&env, err) != 0) return cli_fail("generate", err);
    if (mesh_check_tensor_parallel_size(a.tensor_parallel_size, &env, true, err) != 0) return cli_fail("generate", err);
    log_set_rank(env.rank);
    SamplingParams sp = sampling_params_greedy();
    if (gen.present && gen.do_sample) {
        sp.temperature = gen.temperature;
        sp.top_p = gen.top_p;
        sp.top_k = gen.top_k;
        sp.min_p = gen.min_p;
        sp.repetition_penalty = gen.repetition_penalty;
    }
    for (int i = 0; i < n_opts; i++) {
        if (!opts[i].seen) continue;
        if (opts[i].value == &a.temperature) sp.temperature = a.temperature;
        if (opts[i].value == &a.top_p) sp.top_p = a.top_p;
        if (opts[i].value == &a.top_k) sp.top_k = a.top_k;
        if (opts[i].value == &a.min_p) sp.min_p = a.min_p;
        if (opts[i].value == &a.repetition_penalty) sp.repetition_penalty = a.repetition_penalty;
    }
    sp.seed = a.seed;
    if (sampling_params_validate(&sp, err) != 0) return cli_fail("generate", err);

    Tokenizer *tok = NULL;
    char *tok_path = path_join(a.model, "tokenizer.json");
    bool have_tok = file_exists(tok_path);
    free(tok_path);
    if (have_tok && tokenizer_load(&tok, a.model, err) != 0) return cli_fail("generate", err);
    if (!tok && !a.json && !a.bench) {
        return cli_fail("generate", "the model folder has no tokenizer.json, so text cannot be printed (use --json)");
    }
    /* every rank got this far with the same files and flags: the group, then its device */
    Mesh mesh;
    MeshOptions mo = {.device = a.device, .share_gpus = true, .tensor_parallel_size = a.tensor_parallel_size,
                      .one_group = true};
    TensorParallel hooks;
    Model *m = NULL;
    if (mesh_open(&mesh, &env, &mo, err) != 0 ||
        model_load_tp(&m, a.model, mesh.be, mesh_tensor_parallel(&mesh, &hooks), err) != 0 ||
        (a.adapter && model_lora_load(m, a.adapter, err) != 0)) {
        model_free(m);
        tokenizer_free(tok);
        cli_fail("generate", err);
        mesh_abort(&mesh, err); /* the others may wait in a collective */
        mesh_close(&mesh);
        return 1;
    }
    const Backend *be = mesh.be;
    const ModelConfig *cfg = model_config(m);
    int **prompts = NULL, n_prompts = 0, rc = 0;
    size_t *prompt_lens = NULL;
    json_error_t jerr;
    if (a.chat_template_kwargs_text &&
        !json_is_object(a.chat_template_kwargs = json_loads(a.chat_template_kwargs_text, JSON_DECODE_ANY, &jerr))) {
        if (a.chat_template_kwargs)
            errorf(err, "--chat_template_kwargs: expected a JSON object, e.g. '{\"enable_thinking\": false}'");
        else
            errorf(err, "--chat_template_kwargs: invalid JSON: %s", jerr.text);
        rc = 1;
    } else if (a.prompts_file) {
        if (read_prompts_file(&prompts, &prompt_lens, &n_prompts, a.prompts_file, tok, cfg->vocab_size,
                              a.chat_template_kwargs, err) != 0)
            rc = 1;
    } else {
        prompts = xmalloc(sizeof(int *));
        prompt_lens = xmalloc(sizeof(size_t));
        if (build_prompt(&prompts[0], &prompt_lens[0], &a, tok, cfg->vocab_size, err) != 0) rc = 1;
        else n_prompts = 1;
    }
    if (rc == 0 && (int64_t)n_prompts * a.n > TRAIN_CONFIG_MAX_COMPLETIONS) {
        errorf(err, "%d prompts x --n %d is more than the %d completions generated at once: lower --n or split %s",
               n_prompts, a.n, TRAIN_CONFIG_MAX_COMPLETIONS, a.prompts_file ? a.prompts_file : "the prompts");
        rc = 1;
    }

    /* Stop ids: the model's eos ids, plus the tokenizer's eos (as colt train stops). */
    int stop_ids[MODEL_MAX_EOS + 1];
    int n_stop = prompt_stop_ids(stop_ids, cfg, tok);

    TokenRegex *regex = NULL;
    if (rc == 0 && a.regex) {
        if (!tok) rc = 1, errorf(err, "--regex: the model folder has no tokenizer.json, whose tokens the regex reads");
        else if (prompt_regex_constraint(&regex, tok, cfg->vocab_size, a.regex, err) != 0) rc = 1;
    }

    /* Completion j of prompt i is sequence i * n + j, RNG stream i * n + j. */
    int n_seqs = rc == 0 ? n_prompts * a.n : 0;
    GenSequence *seqs = xcalloc((size_t)(n_seqs > 0 ? n_seqs : 1), sizeof(GenSequence));
    OutBuf out = {0};
    if (rc == 0) {
        size_t prompt_tokens = 0;
        for (int i = 0; i < n_seqs; i++) {
            seqs[i].prompt = prompts[i / a.n];
            seqs[i].prompt_len = (int)prompt_lens[i / a.n];
            seqs[i].stream = (uint64_t)i;
            prompt_tokens += prompt_lens[i / a.n];
        }
        GenerateOptions opt = {.sampling = sp, .max_new_tokens = a.max_new_tokens, .stop_ids = stop_ids,
                               .n_stop_ids = n_stop, .ignore_eos = a.ignore_eos, .regex = regex};
        EngineOptions eo = {.block_size = a.block_size, .gpu_memory_utilization = a.gpu_memory_utilization,
                            .max_num_seqs = a.max_num_seqs, .enforce_eager = a.enforce_eager,
                            .no_prefix_caching = a.no_prefix_caching, .deterministic = a.deterministic};
        EngineStats st;
        if (engine_generate(m, seqs, n_seqs, &opt, &eo, &st, err) != 0) rc = 1;
        if (rc == 0 && a.bench && env.rank == 0) {
            double gb = 1.0 / (1 << 30);
            printf("{\"device\": \"%s\", \"sequences\": %d, \"prompt_tokens\": %zu, \"generated_tokens\": %lld, "
                   "\"seconds\": %.4f, \"tokens_per_s\": %.1f, \"decode_tokens_per_s\": %.1f, \"steps\": %d, "
                   "\"graph_steps\": %d, \"kv_pool_gb\": %.3f, \"pool_blocks\": %d, \"peak_blocks_used\": %d, "
                   "\"peak_running\": %d, \"preemptions\": %d, \"prefill_tokens\": %lld, "
                   "\"prefix_cache_hit_tokens\": %lld, \"prefix_cache_evictions\": %lld}\n",
                   be->name, n_seqs, prompt_tokens, (long long)st.decode_tokens, st.seconds,
                   st.seconds > 0 ? st.decode_tokens / st.seconds : 0.0,
                   st.decode_seconds > 0 ? st.decode_step_tokens / st.decode_seconds : 0.0, st.steps,
                   st.graph_steps, st.pool_bytes * gb, st.pool_blocks, st.peak_blocks_used, st.peak_running,
                   st.preemptions, (long long)st.prefill_tokens, (long long)st.shared_tokens,
                   (long long)st.cache_evictions);
        }
    }
    for (int i = 0; i < n_seqs && rc == 0 && !a.bench; i++) {
        GenSequence *s = &seqs[i];
        /* The text leaves out the stop token, as TRL's completions do. */
        int n_text = s->n_tokens - (s->finish == FINISH_STOP ? 1 : 0);
        char *text = NULL;
        if (tok && tokenizer_decode_generated(tok, s->tokens, (size_t)n_text, true, &text, err) != 0) {
            rc = 1;
            break;
        }
        if (a.json) {
            json_t *ids = json_array();
            for (int k = 0; k < s->n_tokens; k++) json_array_append_new(ids, json_integer(s->tokens[k]));
            json_t *o = json_object();
            if (a.prompts_file) json_object_set_new(o, "prompt_index", json_integer(i / a.n));
            json_object_set_new(o, "ids", ids);
            if (text) json_object_set_new(o, "text", json_string(text));
            char *line = json_dumps(o, 0);
            outbuf_puts(&out, line);
            outbuf_puts(&out, "\n");
            free(line);
            json_decref(o);
        } else {
            outbuf_puts(&out, text);
            outbuf_puts(&out, "\n");
        }
        free(text);
    }
    if (rc != 0) cli_fail("generate", err);
    else if (!a.bench && env.rank == 0) fwrite(out.data ? out.data : "", 1, out.len, stdout);
    outbuf_free(&out);
    for (int i = 0; i < n_seqs; i++) gen_sequence_free(&seqs[i]);
    free(seqs);
    for (int i = 0; i < n_prompts; i++) free(prompts[i]);
    free(prompts);
    free(prompt_lens);
    json_decref(a.chat_template_kwargs);
    token_regex_free(regex);
    model_free(m);
    if (rc != 0) mesh_abort(&mesh, err); /* the others may wait in a collective */
    mesh_close(&mesh);
    tokenizer_free(tok);
    return rc;
}
