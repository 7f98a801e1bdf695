/* cli_json.c — see cli_json.h. */
#include "cli/cli_json.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

int cli_json_parse_line(json_t **obj, const char *line, const char *where, char *err) {
    json_error_t jerr;
    json_t *o = json_loads(line, JSON_REJECT_DUPLICATES, &jerr);
    if (!o) return errorf(err, "%s: invalid JSON: %s (column %d)", where, jerr.text, jerr.column);
    if (!json_is_object(o)) {
        json_decref(o);
        return errorf(err, "%s: expected a JSON object", where);
    }
    *obj = o;
    return COLT_OK;
}

int cli_json_ids_from_array(int **ids, size_t *n, json_t *arr, int vocab_size, const char *where, char *err) {
    if (!json_is_array(arr)) return errorf(err, "%s: \"ids\" must be a list of integers", where);
    size_t len = json_array_size(arr);
    int *out = xmalloc(sizeof(int) * (len ? len : 1));
    for (size_t i = 0; i < len; i++) {
        json_t *v = json_array_get(arr, i);
        if (!json_is_integer(v)) {
            free(out);
            return errorf(err, "%s: ids[%zu] is not an integer", where, i);
        }
        json_int_t id = json_integer_value(v);
        if (id < 0 || id >= vocab_size) {
            free(out);
            return errorf(err, "%s: token id %lld at ids[%zu] out of range (vocab %d)", where, (long long)id, i,
                          vocab_size);
        }
        out[i] = (int)id;
    }
    *ids = out;
    *n = len;
    return COLT_OK;
}

int cli_json_read_ids(int **ids, size_t *n, const char *line, int vocab_size, const char *where, char *err) {
    json_t *obj = NULL;
    if (cli_json_parse_line(&obj, line, where, err) != 0) return COLT_ERR;
    json_t *arr = json_object_get(obj, "ids");
    int rc = arr ? cli_json_ids_from_array(ids, n, arr, vocab_size, where, err)
                 : errorf(err, "%s: expected {\"ids\": [...]}", where);
    json_decref(obj);
    return rc;
}

void cli_json_append_ids(OutBuf *out, const char *key, const int *ids, size_t n) {
    char buf[32];
    outbuf_puts(out, "{\"");
    outbuf_puts(out, key);
    outbuf_puts(out, "\": [");
    for (size_t i = 0; i < n; i++) {
        int k = snprintf(buf, sizeof buf, i ? ", %d" : "%d", ids[i]);
        outbuf_append(out, buf, (size_t)k);
    }
    outbuf_puts(out, "]}\n");
}
