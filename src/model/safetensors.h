/* safetensors.h — reading and writing the safetensors format (one file or an
 * index of shards), with every header field validated.
 *
 * Layout: 8-byte little-endian header length N, N bytes of JSON header
 * {"name": {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}},
 * then the data area; offsets are relative to the data area, and the tensors
 * must tile it exactly (no gap, overlap or trailing byte). Files are
 * memory-mapped; tensors are converted to fp32 on request. This is not a
 * general tensor library: only F32, BF16 and F16 are supported.
 *
 * Dimension legend: none (shapes are whatever the file says, up to 8 dims). */
#ifndef COLT_MODEL_SAFETENSORS_H
#define COLT_MODEL_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/fileio.h"
#include "model/model.h"

#define SAFETENSORS_MAX_DIMS 8

typedef struct SafeTensor {
    char *name;
    DType dtype;
    int ndim;
    int64_t shape[SAFETENSORS_MAX_DIMS];
    size_t begin, end;      /* byte offsets in the data area */
    const uint8_t *data;    /* data area + begin */
    int file_index;         /* which shard of a SafeTensorsSet */
} SafeTensor;

/* A parsed header: tensors in file order. */
typedef struct SafeTensorsHeader {
    SafeTensor *tensors;
    int n_tensors;
    size_t data_offset;     /* 8 + header length: where the data area starts */
} SafeTensorsHeader;

/* Parses and validates the header of an in-memory safetensors file of size
 * bytes, including that the tensors tile the data area exactly (so a header
 * length off by a byte is an error, not shifted weights); name prefixes error
 * messages. Tensor data pointers point into bytes.
 * Returns 0 or -1 with err set; on error nothing needs freeing. */
int safetensors_parse_header(SafeTensorsHeader *h, const uint8_t *bytes, size_t size, const char *name,
                             char *err);
void safetensors_header_free(SafeTensorsHeader *h);

/* A checkpoint's tensors: DIR/model.safetensors, or the shards named by
 * DIR/model.safetensors.index.json, all memory-mapped. */
typedef struct SafeTensorsSet {
    MappedFile *maps;
    char **paths;
    SafeTensorsHeader *headers;
    int n_files;
} SafeTensorsSet;

int safetensors_open_dir(SafeTensorsSet *set, const char *dir, char *err);
/* One file as a set (a LoRA adapter's adapter_model.safetensors). */
int safetensors_open_file(SafeTensorsSet *set, const char *path, char *err);
void safetensors_set_free(SafeTensorsSet *set);
/* The tensor called name, or NULL; *path gets the file holding it. */
const SafeTensor *safetensors_find(const SafeTensorsSet *set, const char *name, const char **path);

/* Element count (product of the shape). */
size_t safetensors_numel(const SafeTensor *t);
/* Converts a tensor's data to fp32 (dst has numel floats). No checks. */
void safetensors_to_f32(float *dst, const SafeTensor *t);
/* The same conversion, also requiring every value to be finite, in one pass.
 * Returns 0, or -1 with err = "<path>: tensor '<name>' has NaN at element
 * <i> [<index per dim>]; ..." (dst is then partly written). Every model load
 * goes through this. */
int safetensors_to_f32_finite(float *dst, const SafeTensor *t, const char *path, char *err);
/* Only the check, for a loader that validates every tensor before touching
 * any state (the optimizer's). Same error as above. */
int safetensors_check_finite(const SafeTensor *t, const char *path, char *err);

/* bf16 <-> fp32; fp32 -> bf16 rounds to nearest even (NaN stays NaN). */
uint16_t safetensors_f32_to_bf16(float x);
float safetensors_bf16_to_f32(uint16_t x);
float safetensors_f16_to_f32(uint16_t x);

/* Produces elements [start, start + count) of a tensor being written. */
typedef void (*SafeTensorFill)(float *dst, size_t start, size_t count, void *ctx);

/* One tensor to write: fp32 host data converted to the file's dtype. When data
 * is NULL, fill(…, fill_ctx) produces the values chunk by chunk instead, so a
 * checkpoint larger than memory can be written. */
typedef struct SafeTensorWrite {
    const char *name;
    int ndim;
    int64_t shape[SAFETENSORS_MAX_DIMS];
    const float *data;
    SafeTensorFill fill;
    void *fill_ctx;
} SafeTensorWrite;

/* Writes tensors (sorted by name, as HF does) to path atomically, dtype F32 or
 * BF16, header padded with spaces to a multiple of 8 bytes, data packed with
 * no gaps. A repeated name is an error. */
int safetensors_write(const char *path, const SafeTensorWrite *tensors, int n, DType dtype, char *err);

#endif
