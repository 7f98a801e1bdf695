/* safetensors.c — see safetensors.h. Header JSON via jansson; data via mmap.
 * Validation follows the reference implementation (huggingface/safetensors,
 * `validate`): header inside the file, known dtypes, byte size = numel * dtype
 * size, and the tensors, sorted by offset, tile the data area exactly: no gap,
 * no overlap, no trailing bytes. The tiling catches a header length that is
 * off by a few bytes, which would otherwise load every tensor shifted (the
 * padding spaces keep the shortened header valid JSON). Assumes a
 * little-endian host. */
#include "model/safetensors.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/floats.h"

#define SAFETENSORS_MAX_HEADER (100u * 1000u * 1000u) /* the reference implementation's limit */

/* ---------------------------------------------------------------- dtype helpers */


static const char *dtype_name(DType d) { return d == DTYPE_F32 ? "F32" : d == DTYPE_BF16 ? "BF16" : "F16"; }

uint16_t safetensors_f32_to_bf16(float x) { return float_to_bf16(x); }

float safetensors_bf16_to_f32(uint16_t x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float safetensors_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, mant = h & 0x3ffu, u;
    if (exp == 0) {
        if (mant == 0) {
            u = sign;
        } else { /* subnormal: normalise */
            int e = -1;
            do {
                e++;
                mant <<= 1;
            } while ((mant & 0x400u) == 0);
            u = sign | ((uint32_t)(127 - 15 - e) << 23) | ((mant & 0x3ffu) << 13);
        }
    } else if (exp == 31) {
        u = sign | 0x7f800000u | (mant << 13);
    } else {
        u = sign | ((exp + 127 - 15) << 23) | (mant << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

size_t safetensors_numel(const SafeTensor *t) {
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

void safetensors_to_f32(float *dst, const SafeTensor *t) {
    size_t n = safetensors_numel(t);
    if (t->dtype == DTYPE_F32) {
        memcpy(dst, t->data, n * 4); /* the mapped data may be unaligned */
        return;
    }
    for (size_t i = 0; i < n; i++) {
        uint16_t h;
        memcpy(&h, t->data + 2 * i, 2);
        dst[i] = t->dtype == DTYPE_BF16 ? safetensors_bf16_to_f32(h) : safetensors_f16_to_f32(h);
    }
}

/* True when the raw element i of t is NaN or ±Inf: exponent bits all ones. */
static int element_non_finite(const SafeTensor *t, size_t i) {
    if (t->dtype == DTYPE_F32) {
        uint32_t u;
        memcpy(&u, t->data + 4 * i, 4);
        return (u & 0x7f800000u) == 0x7f800000u;
    }
    uint16_t h;
    memcpy(&h, t->data + 2 * i, 2);
    uint16_t exp_mask = t->dtype == DTYPE_BF16 ? 0x7f80u : 0x7c00u;
    return (h & exp_mask) == exp_mask;
}

/* The error for t's first non-finite element, found by a scan from 0 (only
 * run once a pass has seen one). */
static int non_finite_error(const SafeTensor *t, const char *path, char *err) {
    size_t n = safetensors_numel(t), i = 0;
    while (i < n && !element_non_finite(t, i)) i++;
    COLT_ASSERT(i < n);
    float v;
    if (t->dtype == DTYPE_F32) {
        memcpy(&v, t->data + 4 * i, 4);
    } else {
        uint16_t h;
        memcpy(&h, t->data + 2 * i, 2);
        v = t->dtype == DTYPE_BF16 ? safetensors_bf16_to_f32(h) : safetensors_f16_to_f32(h);
    }
    char where[160] = "";
    if (t->ndim > 1) { /* the index per dimension too: "[3,17]" */
        size_t k = (size_t)snprintf(where, sizeof(where), " ["), rest = i, stride = n;
        for (int d = 0; d < t->ndim && k < sizeof(where); d++) {
            stride /= (size_t)t->shape[d];
            k += (size_t)snprintf(where + k, sizeof(where) - k, "%s%zu", d ? "," : "", rest / stride);
            rest %= stride;
        }
        if (k < sizeof(where)) snprintf(where + k, sizeof(where) - k, "]");
    }
    return errorf(err, "%s: tensor '%s' has %s at element %zu%s; the checkpoint is corrupt or from a diverged run",
                  path, t->name, isnan(v) ? "NaN" : v > 0 ? "+Inf" : "-Inf", i, where);
}

int safetensors_check_finite(const SafeTensor *t, const char *path, char *err) {
    size_t n = safetensors_numel(t);
    int bad = 0;
    for (size_t i = 0; i < n; i++) bad |= element_non_finite(t, i);
    return bad ? non_finite_error(t, path, err) : COLT_OK;
}

int safetensors_to_f32_finite(float *dst, const SafeTensor *t, const char *path, char *err) {
    size_t n = safetensors_numel(t);
    int bad = 0;
    /* one pass: convert and OR together "exponent all ones" of each element */
    if (t->dtype == DTYPE_F32) {
        for (size_t i = 0; i < n; i++) {
            uint32_t u;
            memcpy(&u, t->data + 4 * i, 4); /* the mapped data may be unaligned */
            bad |= (u & 0x7f800000u) == 0x7f800000u;
            memcpy(&dst[i], &u, 4);
        }
    } else {
        uint16_t exp_mask = t->dtype == DTYPE_BF16 ? 0x7f80u : 0x7c00u;
        for (size_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, t->data + 2 * i, 2);
            bad |= (h & exp_mask) == exp_mask;
            dst[i] = t->dtype == DTYPE_BF16 ? safetensors_bf16_to_f32(h) : safetensors_f16_to_f32(h);
        }
    }
    return bad ? non_finite_error(t, path, err) : COLT_OK;
}

/* ---------------------------------------------------------------- header parsing */

void safetensors_header_free(SafeTensorsHeader *h) {
    for (int i = 0; i < h->n_tensors; i++) free(h->tensors[i].name);
    free(h->tensors);
    h->tensors = NULL;
    h->n_tensors = 0;
}

/* Reads a non-negative JSON integer; returns 0 or -1. */
static int json_get_u64(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return -1;
    *out = (uint64_t)json_integer_value(v);
    return 0;
}

/* Fills t from one header entry; returns 0 or -1 with err set. */
static int parse_tensor_entry(SafeTensor *t, const char *key, json_t *val, size_t data_size, const char *name,
                              char *err) {
    if (!json_is_object(val)) return errorf(err, "%s: tensor '%s': header entry is not an object", name, key);
    json_t *dtype = json_object_get(val, "dtype");
    json_t *shape = json_object_get(val, "shape");
    json_t *offsets = json_object_get(val, "data_offsets");
    if (!dtype) return errorf(err, "%s: tensor '%s': missing field 'dtype'", name, key);
    if (!shape) return errorf(err, "%s: tensor '%s': missing field 'shape'", name, key);
    if (!offsets) return errorf(err, "%s: tensor '%s': missing field 'data_offsets'", name, key);
    if (!json_is_string(dtype)) return errorf(err, "%s: tensor '%s': 'dtype' is not a string", name, key);
    const char *ds = json_string_value(dtype);
    if (strcmp(ds, "F32") == 0) t->dtype = DTYPE_F32;
    else if (strcmp(ds, "BF16") == 0) t->dtype = DTYPE_BF16;
    else if (strcmp(ds, "F16") == 0) t->dtype = DTYPE_F16;
    else return errorf(err, "%s: tensor '%s': unknown dtype '%.32s' (colt reads F32, BF16, F16)", name, key, ds);

    if (!json_is_array(shape) || json_array_size(shape) > SAFETENSORS_MAX_DIMS)
        return errorf(err, "%s: tensor '%s': 'shape' must be an array of at most %d integers", name, key,
                      SAFETENSORS_MAX_DIMS);
    t->ndim = (int)json_array_size(shape);
    uint64_t numel = 1;
    for (int d = 0; d < t->ndim; d++) {
        uint64_t dim;
        if (json_get_u64(json_array_get(shape, (size_t)d), &dim) != 0)
            return errorf(err, "%s: tensor '%s': shape[%d] is not a non-negative integer", name, key, d);
        if (dim > (uint64_t)INT64_MAX || (dim != 0 && numel > UINT64_MAX / 8 / dim))
            return errorf(err, "%s: tensor '%s': shape is too large", name, key);
        t->shape[d] = (int64_t)dim;
        numel *= dim;
    }
    uint64_t begin, end;
    if (!json_is_array(offsets) || json_array_size(offsets) != 2 ||
        json_get_u64(json_array_get(offsets, 0), &begin) != 0 || json_get_u64(json_array_get(offsets, 1), &end) != 0)
        return errorf(err, "%s: tensor '%s': 'data_offsets' must be [begin, end] of non-negative integers", name,
                      key);
    if (end < begin)
        return errorf(err, "%s: tensor '%s': data_offsets end %llu < begin %llu", name, key,
                      (unsigned long long)end, (unsigned long long)begin);
    if (end > data_size)
        return errorf(err, "%s: tensor '%s': data_offsets [%llu,%llu] outside the data area (%zu bytes)", name, key,
                      (unsigned long long)begin, (unsigned long long)end, data_size);
    if (end - begin != numel * dtype_size(t->dtype))
        return errorf(err, "%s: tensor '%s': %llu data bytes, but shape and dtype %s need %llu", name, key,
                      (unsigned long long)(end - begin), dtype_name(t->dtype),
                      (unsigned long long)(numel * dtype_size(t->dtype)));
    t->begin = (size_t)begin;
    t->end = (size_t)end;
    return COLT_OK;
}

static int compare_by_offsets(const void *a, const void *b) {
    const SafeTensor *x = *(const SafeTensor *const *)a, *y = *(const SafeTensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end ? 1 : 0;
}

static const char *plural_bytes(size_t n) { return n == 1 ? "byte" : "bytes"; }

/* The tensors, sorted by offset, must tile [0, data_size) exactly, as the
 * reference implementation requires. Returns 0 or -1 with err set. */
static int check_tiling(const SafeTensorsHeader *h, size_t data_size, const char *name, char *err) {
    if (h->n_tensors == 0) {
        if (data_size == 0) return COLT_OK;
        return errorf(err, "%s: %zu %s of data but the header lists no tensors (the header length may be wrong)", name,
                      data_size, plural_bytes(data_size));
    }
    const SafeTensor **order = xmalloc((size_t)h->n_tensors * sizeof(*order));
    for (int i = 0; i < h->n_tensors; i++) order[i] = &h->tensors[i];
    qsort(order, (size_t)h->n_tensors, sizeof(*order), compare_by_offsets);
    int rc = COLT_OK;
    size_t pos = 0; /* where the previous tensor's data ended */
    for (int i = 0; i < h->n_tensors && rc == COLT_OK; i++) {
        const SafeTensor *t = order[i];
        if (t->begin > pos)
            rc = errorf(err, "%s: gap of %zu %s before tensor '%s' (data_offsets [%zu,%zu]; the data must be packed)",
                        name, t->begin - pos, plural_bytes(t->begin - pos), t->name, t->begin, t->end);
        else if (t->begin < pos)
            rc = errorf(err, "%s: tensors '%s' [%zu,%zu] and '%s' [%zu,%zu] overlap", name, order[i - 1]->name,
                        order[i - 1]->begin, order[i - 1]->end, t->name, t->begin, t->end);
        pos = t->end;
    }
    if (rc == COLT_OK && pos < data_size)
        rc = errorf(err, "%s: %zu %s after the last tensor's data (the header length may be wrong)", name,
                    data_size - pos, plural_bytes(data_size - pos));
    free(order);
    return rc;
}

int safetensors_parse_header(SafeTensorsHeader *h, const uint8_t *bytes, size_t size, const char *name,
                             char *err) {
    memset(h, 0, sizeof(*h));
    if (size < 8) return errorf(err, "%s: file is %zu bytes, too short for a safetensors header", name, size);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | bytes[i];
    if (n > size - 8)
        return errorf(err, "%s: header length %llu is larger than the file (%zu bytes)", name,
                      (unsigned long long)n, size);
    if (n > SAFETENSORS_MAX_HEADER)
        return errorf(err, "%s: header length %llu exceeds the %u-byte limit", name, (unsigned long long)n,
                      SAFETENSORS_MAX_HEADER);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)bytes + 8, (size_t)n, JSON_REJECT_DUPLICATES, &jerr);
    if (!root) return errorf(err, "%s: header is not valid JSON: %s (offset %d)", name, jerr.text, jerr.position);
    if (!json_is_object(root)) {
        json_decref(root);
        return errorf(err, "%s: header is not a JSON object", name);
    }
    size_t data_size = size - 8 - (size_t)n;
    h->data_offset = 8 + (size_t)n;
    h->tensors = xcalloc(json_object_size(root) + 1, sizeof(SafeTensor));
    const char *key;
    json_t *val;
    json_object_foreach(root, key, val) {
        if (strcmp(key, "__metadata__") == 0) {
            if (!json_is_object(val)) {
                errorf(err, "%s: '__metadata__' is not an object", name);
                goto error;
            }
            continue;
        }
        SafeTensor *t = &h->tensors[h->n_tensors];
        if (parse_tensor_entry(t, key, val, data_size, name, err) != 0) goto error;
        t->name = xstrdup(key);
        t->data = bytes + h->data_offset + t->begin;
        h->n_tensors++;
    }
    json_decref(root);
    root = NULL;

    if (check_tiling(h, data_size, name, err) != 0) goto error;
    return COLT_OK;
error:
    if (root) json_decref(root);
    safetensors_header_free(h);
    return COLT_ERR;
}

/* ---------------------------------------------------------------- directories and shards */

void safetensors_set_free(SafeTensorsSet *set) {
    for (int i = 0; i < set->n_files; i++) {
        safetensors_header_free(&set->headers[i]);
        file_unmap(&set->maps[i]);
        free(set->paths[i]);
    }
    free(set->headers);
    free(set->maps);
    free(set->paths);
    memset(set, 0, sizeof(*set));
}

/* Maps and parses one more file into set; returns its index or -1. */
static int set_add_file(SafeTensorsSet *set, const char *path, char *err) {
    int i = set->n_files;
    set->maps = xrealloc(set->maps, (size_t)(i + 1) * sizeof(*set->maps));
    set->paths = xrealloc(set->paths, (size_t)(i + 1) * sizeof(*set->paths));
    set->headers = xrealloc(set->headers, (size_t)(i + 1) * sizeof(*set->headers));
    if (file_map(&set->maps[i], path, err) != 0) return COLT_ERR;
    if (safetensors_parse_header(&set->headers[i], set->maps[i].data, set->maps[i].size, path, err) != 0) {
        file_unmap(&set->maps[i]);
        return COLT_ERR;
    }
    for (int t = 0; t < set->headers[i].n_tensors; t++) set->headers[i].tensors[t].file_index = i;
    set->paths[i] = xstrdup(path);
    set->n_files++;
    return i;
}

static const SafeTensor *header_find(const SafeTensorsHeader *h, const char *name) {
    for (int t = 0; t < h->n_tensors; t++)
        if (strcmp(h->tensors[t].name, name) == 0) return &h->tensors[t];
    return NULL;
}

/* Opens the shards listed in DIR/model.safetensors.index.json's weight_map. */
/* True when an index's shard name stays inside the model folder: relative,
 * with no ".." component ("a..b.safetensors" is a fine name; "../x" and
 * "sub/../../x" are not). */
static bool shard_name_inside(const char *name) {
    if (name[0] == '/') return false;
    for (const char *p = name; *p;) {
        size_t n = strcspn(p, "/");
        if (n == 2 && p[0] == '.' && p[1] == '.') return false;
        p += n;
        while (*p == '/') p++;
    }
    return true;
}

static int open_sharded(SafeTensorsSet *set, const char *dir, const char *index_path, char *err) {
    char *text = NULL;
    size_t len = 0;
    if (file_read_all(index_path, &text, &len, err) != 0) return COLT_ERR;
    json_error_t jerr;
    json_t *root = json_loadb(text, len, 0, &jerr);
    free(text);
    if (!root) return errorf(err, "%s: not valid JSON: %s (line %d)", index_path, jerr.text, jerr.line);
    json_t *map = json_object_get(root, "weight_map");
    if (!json_is_object(map) || json_object_size(map) == 0) {
        json_decref(root);
        return errorf(err, "%s: missing or empty 'weight_map'", index_path);
    }
    const char *key;
    json_t *val;
    json_object_foreach(map, key, val) {
        /* key and val belong to root: format the message before json_decref */
        if (!json_is_string(val) || json_string_value(val)[0] == '\0') {
            errorf(err, "%s: weight_map['%s'] is not a file name in the model folder", index_path, key);
            json_decref(root);
            return COLT_ERR;
        }
        if (!shard_name_inside(json_string_value(val))) {
            errorf(err, "%s: weight_map['%s'] is '%s', which leaves the model folder (an absolute path or a '..' "
                        "part); shards must be files inside %s", index_path, key, json_string_value(val), dir);
            json_decref(root);
            return COLT_ERR;
        }
        char *path = path_join(dir, json_string_value(val));
        int fi = -1;
        for (int i = 0; i < set->n_files; i++)
            if (strcmp(set->paths[i], path) == 0) fi = i;
        if (fi < 0) fi = set_add_file(set, path, err);
        if (fi >= 0 && !header_find(&set->headers[fi], key)) {
            errorf(err, "%s: tensor '%s' (listed in %s) not found", path, key, index_path);
            fi = -1;
        }
        free(path);
        if (fi < 0) {
            json_decref(root);
            return COLT_ERR;
        }
    }
    json_decref(root);
    return COLT_OK;
}

int safetensors_open_dir(SafeTensorsSet *set, const char *dir, char *err) {
    memset(set, 0, sizeof(*set));
    char *index_path = path_join(dir, "model.safetensors.index.json");
    char *single_path = path_join(dir, "model.safetensors");
    int rc;
    if (file_exists(index_path)) {
        rc = open_sharded(set, dir, index_path, err);
    } else if (file_exists(single_path)) {
        rc = set_add_file(set, single_path, err) < 0 ? COLT_ERR : COLT_OK;
    } else {
        rc = errorf(err, "%s: no model.safetensors or model.safetensors.index.json", dir);
    }
    free(index_path);
    free(single_path);
    if (rc != 0) safetensors_set_free(set);
    return rc;
}

int safetensors_open_file(SafeTensorsSet *set, const char *path, char *err) {
    memset(set, 0, sizeof(*set));
    if (set_add_file(set, path, err) >= 0) return COLT_OK;
    safetensors_set_free(set);
    return COLT_ERR;
}

const SafeTensor *safetensors_find(const SafeTensorsSet *set, const char *name, const char **path) {
    for (int i = 0; i < set->n_files; i++) {
        const SafeTensor *t = header_find(&set->headers[i], name);
        if (t) {
            if (path) *path = set->paths[i];
            return t;
        }
    }
    return NULL;
}

/* ---------------------------------------------------------------- writing */

static int compare_write_names(const void *a, const void *b) {
    return strcmp((*(const SafeTensorWrite *const *)a)->name, (*(const SafeTensorWrite *const *)b)->name);
}

static size_t write_numel(const SafeTensorWrite *t) {
    size_t n = 1;
    for (int d = 0; d < t->ndim; d++) n *= (size_t)t->shape[d];
    return n;
}

int safetensors_write(const char *path, const SafeTensorWrite *tensors, int n, DType dtype, char *err) {
    COLT_ASSERT(dtype == DTYPE_F32 || dtype == DTYPE_BF16);
    const SafeTensorWrite **order = xmalloc((size_t)(n ? n : 1) * sizeof(*order));
    for (int i = 0; i < n; i++) order[i] = &tensors[i];
    qsort(order, (size_t)n, sizeof(*order), compare_write_names);
    /* A repeated name would leave its first copy's bytes as a gap nobody can read. */
    for (int i = 0; i < n; i++)
        if ((i > 0 && strcmp(order[i]->name, order[i - 1]->name) == 0) || strcmp(order[i]->name, "__metadata__") == 0) {
            int rc = errorf(err, "%s: tensor name '%s' is repeated or reserved; nothing written", path, order[i]->name);
            free(order);
            return rc;
        }

    json_t *root = json_object();
    json_t *meta = json_object();
    json_object_set_new(meta, "format", json_string("pt"));
    json_object_set_new(root, "__metadata__", meta);
    size_t offset = 0;
    for (int i = 0; i < n; i++) {
        json_t *entry = json_object(), *shape = json_array(), *offs = json_array();
        for (int d = 0; d < order[i]->ndim; d++) json_array_append_new(shape, json_integer(order[i]->shape[d]));
        size_t bytes = write_numel(order[i]) * dtype_size(dtype);
        json_array_append_new(offs, json_integer((json_int_t)offset));
        json_array_append_new(offs, json_integer((json_int_t)(offset + bytes)));
        offset += bytes;
        json_object_set_new(entry, "dtype", json_string(dtype_name(dtype)));
        json_object_set_new(entry, "shape", shape);
        json_object_set_new(entry, "data_offsets", offs);
        json_object_set_new(root, order[i]->name, entry);
    }
    char *header = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    COLT_ASSERT(header);
    size_t hlen = strlen(header), padded = (hlen + 7) / 8 * 8;

    AtomicFile af;
    if (atomic_open(&af, path, err) != 0) {
        free(header);
        free(order);
        return COLT_ERR;
    }
    /* the length field, the header and its padding spaces in one buffer */
    uint8_t *head = xmalloc(8 + padded);
    for (int i = 0; i < 8; i++) head[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    memcpy(head + 8, header, hlen);
    memset(head + 8 + hlen, ' ', padded - hlen);
    int ok = atomic_write(&af, head, 8 + padded, err) == 0;
    free(head);
    free(header);
    enum { CHUNK = 1 << 16 };
    uint16_t *chunk = xmalloc(CHUNK * sizeof(uint16_t));
    float *values = xmalloc(CHUNK * sizeof(float));
    for (int i = 0; ok && i < n; i++) {
        const SafeTensorWrite *w = order[i];
        size_t numel = write_numel(w);
        if (dtype == DTYPE_F32 && w->data) {
            ok = atomic_write(&af, w->data, numel * 4, err) == 0;
            continue;
        }
        for (size_t j = 0; ok && j < numel; j += CHUNK) {
            size_t m = numel - j < CHUNK ? numel - j : CHUNK;
            const float *src = w->data ? w->data + j : values;
            if (!w->data) w->fill(values, j, m, w->fill_ctx);
            if (dtype == DTYPE_F32) {
                ok = atomic_write(&af, src, m * 4, err) == 0;
                continue;
            }
            for (size_t k = 0; k < m; k++) chunk[k] = safetensors_f32_to_bf16(src[k]);
            ok = atomic_write(&af, chunk, m * 2, err) == 0;
        }
    }
    free(values);
    free(chunk);
    free(order);
    if (!ok) { /* err says why */
        atomic_abort(&af);
        return COLT_ERR;
    }
    return atomic_commit(&af, err);
}
