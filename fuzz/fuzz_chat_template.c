/* fuzz_chat_template.c — libFuzzer target for the Jinja subset: the input is
 * a chat template, rendered for a small fixed conversation with and without
 * add_generation_prompt. Any template must render or fail with a message;
 * never crash, hang or exhaust memory (the renderer bounds all three). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "tokenizer/chat_template.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *tmpl = malloc(size + 1);
    memcpy(tmpl, data, size);
    tmpl[size] = '\0';
    ChatMessage msgs[3] = {{"system", "Be brief."}, {"user", "What is 2+2?"}, {"assistant", "4"}};
    char err[ERR_LEN];
    for (int agp = 0; agp < 2; agp++) {
        char *out = NULL;
        if (chat_template_render(&out, tmpl, msgs, 3, agp, "<s>", "</s>", err) == 0) free(out);
    }
    free(tmpl);
    return 0;
}
