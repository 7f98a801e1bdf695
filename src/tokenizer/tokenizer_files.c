/* tokenizer_files.c — see tokenizer_files.h. */
#include "tokenizer/tokenizer_files.h"

#include <stdlib.h>

#include "core/error.h"
#include "core/fileio.h"

static const char *TOKENIZER_FILES[] = {"tokenizer.json",    "tokenizer_config.json", "special_tokens_map.json",
                                        "added_tokens.json", "vocab.json",            "merges.txt",
                                        "chat_template.jinja"};

int tokenizer_copy_files(const char *src_dir, const char *dst_dir, char *err) {
    for (size_t i = 0; i < sizeof TOKENIZER_FILES / sizeof TOKENIZER_FILES[0]; i++) {
        char *src = path_join(src_dir, TOKENIZER_FILES[i]);
        char *dst = path_join(dst_dir, TOKENIZER_FILES[i]);
        int rc = COLT_OK;
        if (file_exists(src)) {
            char *data = NULL;
            size_t len = 0;
            rc = file_read_all(src, &data, &len, err);
            if (rc == 0) rc = file_write_atomic(dst, data, len, err);
            free(data);
        }
        free(src);
        free(dst);
        if (rc != 0) return COLT_ERR;
    }
    return COLT_OK;
}
