/* fuzz_safetensors.c — libFuzzer target: the safetensors header parser on
 * arbitrary bytes. Must never crash, leak or read outside the input; when it
 * accepts, every tensor's data must lie inside the input (checked here). */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "model/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* A private copy, so ASan catches reads past the end. */
    uint8_t *buf = malloc(size ? size : 1);
    if (size) memcpy(buf, data, size);
    SafeTensorsHeader h;
    char err[ERR_LEN];
    if (safetensors_parse_header(&h, buf, size, "fuzz.safetensors", err) == 0) {
        float tmp[64];
        for (int i = 0; i < h.n_tensors; i++) {
            const SafeTensor *t = &h.tensors[i];
            COLT_ASSERT(t->data >= buf && t->data + (t->end - t->begin) <= buf + size);
            if (safetensors_numel(t) <= 64) safetensors_to_f32(tmp, t);
        }
        safetensors_header_free(&h);
    }
    free(buf);
    return 0;
}
