/* cmd_score.c — `colt score`: per-token log-probabilities of given ids,
 * log p(ids[t] | ids[<t]) for t >= 1, one forward pass per line in chunks
 * (the KV cache carries the prefix), log-softmax in double. Needs no tokenizer. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "cli/cli_json.h"
#include "core/error.h"
#include "engine/sampler.h"
#include "model/lora.h"
#include "model/model.h"

/* Tokens per forward call: bounds the logits buffer (chunk x V floats). */
#define SCORE_CHUNK 128

static const char *SCORE_USAGE =
    "usage: colt score --model DIR [--adapter DIR] < in.jsonl > out.jsonl\n"
    "  each input line {\"ids\": [...]}, each output line {\"logprobs\": [...]} with len(ids)-1 values\n"
    "  --adapter DIR scores with a LoRA adapter (PEFT's files) applied to the model.\n";

/* logprobs[t-1] = log p(ids[t] | ids[<t]) for t in 1..n-1. */
static int score_ids(Model *m, ModelState *st, const int *ids, int n, double *logprobs, float *logits, char *err) {
    const int V = model_config(m)->vocab_size;
    int slot[SCORE_CHUNK], pos[SCORE_CHUNK];
    for (int start = 0; start < n - 1; start += SCORE_CHUNK) {
        int len = n - 1 - start < SCORE_CHUNK ? n - 1 - start : SCORE_CHUNK;
        for (int k = 0; k < len; k++) {
            slot[k] = 0;
            pos[k] = start + k;
        }
        if (model_forward(m, st, ids + start, slot, pos, len, NULL, logits, err) != 0) return COLT_ERR;
        for (int k = 0; k < len; k++)
            logprobs[start + k] = logsoftmax_at(logits + (size_t)k * V, V, ids[start + k + 1]);
    }
    return COLT_OK;
}

int cmd_score(int argc, char **argv) {
    char err[ERR_LEN];
    const char *model_dir = NULL, *device = "auto", *adapter = NULL;
    CliOption opts[] = {{"model", OPT_STRING, &model_dir, "Hugging Face model folder", false},
                        {"adapter", OPT_STRING, &adapter,
                         "a LoRA adapter folder (PEFT's adapter_config.json + adapter_model.safetensors, e.g. a "
                         "use_peft run's output_dir)", false},
                        {"device", OPT_STRING, &device, "cpu, cuda, cuda_f32 (fp32 weights) or auto (default: cuda when a GPU is usable)", false}};
    int prc = cli_parse(opts, 3, argc, argv, SCORE_USAGE, err);
    if (prc == 1) return 0;
    if (prc != 0) return cli_fail("score", err);
    if (!model_dir) return cli_fail("score", "--model DIR is required");
    char model_folder[4096];
    if (cli_model_folder(model_folder, sizeof model_folder, "score", model_dir, NULL) != 0) return 1;
    model_dir = model_folder;

    Backend *be = backend_open(device, 0, err);
    if (!be) return cli_fail("score", err);
    Model *m = NULL;
    if (model_load(&m, model_dir, be, err) != 0 || (adapter && model_lora_load(m, adapter, err) != 0)) {
        model_free(m);
        backend_close(be);
        return cli_fail("score", err);
    }
    const ModelConfig *cfg = model_config(m);
    char **lines = NULL;
    size_t n_lines = 0;
    if (stdin_read_lines(&lines, &n_lines, err) != 0) {
        model_free(m);
        backend_close(be);
        return cli_fail("score", err);
    }
    /* Parse and check every line before any compute, and size the cache once. */
    int **ids = xcalloc(n_lines ? n_lines : 1, sizeof(int *));
    size_t *lens = xcalloc(n_lines ? n_lines : 1, sizeof(size_t));
    size_t max_len = 1;
    int rc = 0;
    for (size_t i = 0; i < n_lines && rc == 0; i++) {
        char where[64];
        snprintf(where, sizeof where, "stdin line %zu", i + 1);
        if (cli_json_read_ids(&ids[i], &lens[i], lines[i], cfg->vocab_size, where, err) != 0) rc = 1;
        else if (lens[i] > (size_t)cfg->max_position_embeddings) {
            errorf(err, "%s: %zu ids, longer than the model's max_position_embeddings (%d)", where, lens[i],
                   cfg->max_position_embeddings);
            rc = 1;
        } else if (lens[i] > max_len) max_len = lens[i];
    }
    ModelState *st = NULL;
    float *logits = NULL;
    double *logprobs = xmalloc(sizeof(double) * max_len);
    OutBuf out = {0};
    if (rc == 0 && model_state_create(&st, m, 1, (int)max_len, SCORE_CHUNK, err) != 0) rc = 1;
    if (rc == 0) logits = xmalloc(sizeof(float) * SCORE_CHUNK * (size_t)cfg->vocab_size);
    for (size_t i = 0; i < n_lines && rc == 0; i++) {
        int n = (int)lens[i];
        if (score_ids(m, st, ids[i], n, logprobs, logits, err) != 0) {
            error_prefix(err, "stdin line %zu", i + 1);
            rc = 1;
            break;
        }
        outbuf_puts(&out, "{\"logprobs\": [");
        char buf[40];
        for (int t = 0; t + 1 < n; t++) {
            int k = snprintf(buf, sizeof buf, t ? ", %.9g" : "%.9g", logprobs[t]);
            outbuf_append(&out, buf, (size_t)k);
        }
        outbuf_puts(&out, "]}\n");
    }
    if (rc == 0) fwrite(out.data ? out.data : "", 1, out.len, stdout);
    else cli_fail("score", err);
    outbuf_free(&out);
    free(logits);
    free(logprobs);
    model_state_free(st);
    for (size_t i = 0; i < n_lines; i++) free(ids[i]);
    free(ids);
    free(lens);
    lines_free(lines, n_lines);
    model_free(m);
    backend_close(be);
    return rc;
}
