/* prompt.c — see prompt.h. Moved out of trainer.c so that colt eval encodes
 * prompts exactly as training does. */
#include "train/prompt.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

/* Chat template for conversational rows, else the text with BOS when the
 * tokenizer adds it (TRL tokenizes plain prompts with the tokenizer's
 * defaults). */
int prompt_encode_row(int **ids, int *n, char **text, const Dataset *d, size_t row, const Tokenizer *tok,
                      const json_t *template_kwargs, int max_prompt_length, const char *dataset_name, char *err) {
    if (dataset_prompt_text(text, d, row, tok, template_kwargs, err) != 0) return COLT_ERR;
    int *body = NULL;
    size_t n_body = 0;
    if (tokenizer_encode(tok, *text, strlen(*text), &body, &n_body, err) != 0) {
        free(*text);
        *text = NULL;
        return error_prefix(err, "%s row %zu", dataset_name, row);
    }
    bool bos = !dataset_is_conversational(d, row) && tokenizer_add_bos(tok) && tokenizer_bos_id(tok) >= 0;
    int total = (int)n_body + (bos ? 1 : 0);
    int keep = total < max_prompt_length ? total : max_prompt_length;
    int *out = xmalloc(sizeof(int) * (size_t)(keep > 0 ? keep : 1));
    for (int k = 0; k < keep; k++) {
        int src = total - keep + k;
        out[k] = bos ? (src == 0 ? tokenizer_bos_id(tok) : body[src - 1]) : body[src];
    }
    free(body);
    *ids = out;
    *n = keep;
    if (keep == 0) {
        free(out);
        *ids = NULL;
        free(*text);
        *text = NULL;
        return errorf(err, "row %zu: the prompt is empty after tokenization", row);
    }
    return COLT_OK;
}

int prompt_stop_ids(int *stop_ids, const ModelConfig *mc, const Tokenizer *tok) {
    int n = 0;
    for (int i = 0; i < mc->n_eos; i++) stop_ids[n++] = mc->eos_token_ids[i];
    if (tok && tokenizer_eos_id(tok) >= 0) stop_ids[n++] = tokenizer_eos_id(tok);
    return n;
}
