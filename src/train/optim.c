/* optim.c — torch.optim.AdamW over a model's parameters through the backend's
 * adamw op, transformers' learning-rate schedules, torch's global-norm gradient
 * clipping, and the optimizer-state file.
 *
 * Scalars are computed in double from the decimal the user wrote (0.999f is
 * taken as 0.999, as Python has it) and rounded to float only when handed to
 * the backend, so bias corrections and schedules match torch/transformers to
 * float rounding. This is not the trainer loop and not the GRPO loss. */
#include "train/optim.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/floats.h"
#include "core/fileio.h"
#include "model/safetensors.h"


/* ---------------------------------------------------------------- schedules */

int lr_scheduler_parse(LrSchedulerType *out, const char *s, char *err) {
    static const char *names[] = {"constant", "constant_with_warmup", "linear", "cosine"};
    for (int i = 0; i < 4; i++)
        if (s && strcmp(s, names[i]) == 0) {
            *out = (LrSchedulerType)i;
            return 0;
        }
    return errorf(err, "lr_scheduler_type '%s' is not supported; use constant, constant_with_warmup, linear or cosine",
                  s ? s : "(null)");
}

/* transformers.optimization's lr lambdas (cosine with num_cycles = 0.5,
 * min_lr_rate = 0), times base_lr as LambdaLR does, in double. Note: plain
 * "constant" has no warmup at all in transformers, whatever warmup_steps is. */
float lr_schedule_value(LrSchedulerType type, float base_lr, int step, int total_steps, int warmup_steps) {
    double factor = 1.0;
    switch (type) {
    case LR_CONSTANT: factor = 1.0; break;
    case LR_CONSTANT_WITH_WARMUP:
        factor = step < warmup_steps ? (double)step / fmax(1.0, warmup_steps) : 1.0;
        break;
    case LR_LINEAR:
        if (step < warmup_steps) factor = (double)step / (double)(warmup_steps > 1 ? warmup_steps : 1);
        else {
            int span = total_steps - warmup_steps;
            factor = fmax(0.0, (double)(total_steps - step) / (double)(span > 1 ? span : 1));
        }
        break;
    case LR_COSINE:
        if (step < warmup_steps) factor = (double)step / (double)(warmup_steps > 1 ? warmup_steps : 1);
        else {
            int span = total_steps - warmup_steps;
            double progress = (double)(step - warmup_steps) / (double)(span > 1 ? span : 1);
            factor = fmax(0.0, 0.5 * (1.0 + cos(M_PI * 0.5 * 2.0 * progress)));
        }
        break;
    }
    return (float)(float_as_decimal(base_lr) * factor);
}

/* TrainingArguments.get_warmup_steps (transformers 4.x: warmup_steps if > 0
 * else ceil(total * warmup_ratio); 5.x folds the ratio into warmup_steps < 1,
 * the same numbers). */
int lr_warmup_steps(int total_steps, float warmup_ratio, int warmup_steps) {
    if (warmup_steps > 0) return warmup_steps;
    return (int)ceil((double)total_steps * float_as_decimal(warmup_ratio));
}

/* ---------------------------------------------------------------- AdamW */

struct Optimizer {
    const Backend *be;
    Model *model;
    AdamWConfig cfg;
    int n;                      /* parameter tensors */
    ModelParam *params;         /* [n] */
    void **exp_avg, **exp_avg_sq; /* [n] [f32] views of params[i].numel into the flat buffers */
    void **master;                /* [n] [f32] views of the master weights (storage not fp32), else NULL */
    /* One fp32 buffer each, in the model's weight-arena layout, so a step is one
     * adamw call over everything (alignment padding stays 0 and updates to 0). */
    size_t flat_numel;
    void *exp_avg_flat, *exp_avg_sq_flat, *master_flat;
    int64_t step;
};

int optim_create(Optimizer **out, Model *m, const AdamWConfig *cfg, const Backend *be, char *err) {
    *out = NULL;
    if (!be->adamw || !be->alloc_f32 || !be->zero_f32)
        return errorf(err, "backend '%s' has no adamw/zero op; the optimizer cannot run on it", be->name);
    if (!(cfg->beta1 >= 0.0f && cfg->beta1 < 1.0f && cfg->beta2 >= 0.0f && cfg->beta2 < 1.0f))
        return errorf(err, "AdamW betas must be in [0, 1) (got %g, %g)", (double)cfg->beta1, (double)cfg->beta2);
    if (!(cfg->eps >= 0.0f) || !(cfg->weight_decay >= 0.0f))
        return errorf(err, "AdamW eps and weight_decay must be >= 0 (got %g, %g)", (double)cfg->eps,
                      (double)cfg->weight_decay);
    Optimizer *o = xcalloc(1, sizeof(Optimizer));
    o->be = be;
    o->model = m;
    o->cfg = *cfg;
    o->n = model_param_count(m);
    o->params = xcalloc((size_t)(o->n ? o->n : 1), sizeof(ModelParam));
    o->exp_avg = xcalloc((size_t)(o->n ? o->n : 1), sizeof(void *));
    o->exp_avg_sq = xcalloc((size_t)(o->n ? o->n : 1), sizeof(void *));
    o->master = xcalloc((size_t)(o->n ? o->n : 1), sizeof(void *));
    size_t es = dtype_size(be->storage);
    void *weights = model_params_flat(m, &o->flat_numel);
    o->exp_avg_flat = be->alloc_f32(be, o->flat_numel);
    o->exp_avg_sq_flat = be->alloc_f32(be, o->flat_numel);
    COLT_ASSERT(o->exp_avg_flat && o->exp_avg_sq_flat);
    be->zero_f32(be, o->exp_avg_flat, o->flat_numel);
    be->zero_f32(be, o->exp_avg_sq_flat, o->flat_numel);
    if (be->storage != DTYPE_F32) {
        o->master_flat = be->alloc_f32(be, o->flat_numel);
        be->zero_f32(be, o->master_flat, o->flat_numel);
    }
    for (int i = 0; i < o->n; i++) {
        o->params[i] = model_param(m, i);
        size_t numel = o->params[i].numel;
        size_t offset = (size_t)((char *)o->params[i].data - (char *)weights) / es;
        o->exp_avg[i] = (char *)o->exp_avg_flat + offset * sizeof(float);
        o->exp_avg_sq[i] = (char *)o->exp_avg_sq_flat + offset * sizeof(float);
        if (o->master_flat) {
            /* fp32 master copy of a low-precision weight: AdamW updates it. */
            o->master[i] = (char *)o->master_flat + offset * sizeof(float);
            float *host = xmalloc(numel * sizeof(float));
            be->download(be, host, o->params[i].data, numel);
            be->upload_f32(be, o->master[i], host, numel);
            free(host);
        }
    }
    *out = o;
    return 0;
}

void optim_free(Optimizer *o) {
    if (!o) return;
    o->be->free(o->be, o->exp_avg_flat);
    o->be->free(o->be, o->exp_avg_sq_flat);
    if (o->master_flat) o->be->free(o->be, o->master_flat);
    free(o->master);
    free(o->exp_avg);
    free(o->exp_avg_sq);
    free(o->params);
    free(o);
}

int64_t optim_step_count(const Optimizer *o) { return o->step; }

/* A sum of squares in double is finite exactly when every float is (the
 * largest float squared is ~1e77). */
bool optim_state_finite(const Optimizer *o) {
    size_t n = 0;
    const void *weights = o->master_flat ? o->master_flat : model_params_flat(o->model, &n);
    return isfinite(o->be->sum_squares(o->be, weights, o->flat_numel)) &&
           isfinite(o->be->sum_squares(o->be, o->exp_avg_flat, o->flat_numel)) &&
           isfinite(o->be->sum_squares(o->be, o->exp_avg_sq_flat, o->flat_numel));
}

void optim_fingerprint(const Optimizer *o, double out[2]) {
    size_t n = 0;
    const void *weights = o->master_flat ? o->master_flat : model_params_flat(o->model, &n);
    out[0] = o->be->sum_squares(o->be, weights, o->flat_numel);
    out[1] = o->be->sum_squares(o->be, o->exp_avg_flat, o->flat_numel);
}

size_t optim_state_bytes(const Optimizer *o) {
    return o->flat_numel * sizeof(float) * (o->master_flat ? 3 : 2);
}

/* torch's _single_tensor_adam: step += 1; bias_correction_k = 1 - beta_k ** step
 * in Python doubles; the backend op does the rest in torch's order. */
void optim_step(Optimizer *o, const ModelGrads *g, float lr) {
    o->step++;
    double beta1 = float_as_decimal(o->cfg.beta1), beta2 = float_as_decimal(o->cfg.beta2);
    float bc1 = (float)(1.0 - pow(beta1, (double)o->step));
    float bc2 = (float)(1.0 - pow(beta2, (double)o->step));
    size_t n_weights = 0, n_grads = 0;
    void *weights = model_params_flat(o->model, &n_weights);
    void *grads = model_grads_flat(g, &n_grads);
    COLT_ASSERT(n_weights == o->flat_numel && n_grads == o->flat_numel);
    /* Two groups as transformers' Trainer makes them: weight decay on matrices and
     * embeddings, none on biases and norms (they sit at the end of the layout). */
    size_t split = model_params_no_decay_start(o->model);
    size_t es = dtype_size(o->be->storage);
    for (int group = 0; group < 2; group++) {
        size_t start = group == 0 ? 0 : split, end = group == 0 ? split : o->flat_numel;
        if (end <= start) continue;
        size_t f = start * sizeof(float);
        o->be->adamw(o->be, (char *)weights + start * es, o->master_flat ? (char *)o->master_flat + f : NULL,
                     (char *)grads + f, (char *)o->exp_avg_flat + f, (char *)o->exp_avg_sq_flat + f, end - start, lr,
                     o->cfg.beta1, o->cfg.beta2, o->cfg.eps, group == 0 ? o->cfg.weight_decay : 0.0f, bc1, bc2);
    }
}

/* torch.nn.utils.clip_grad_norm_ (norm_type 2): total = ||(||g_i||)_i||,
 * coef = max_norm / (total + 1e-6), grads *= min(coef, 1). Squares summed in
 * double (torch sums in fp32). */
double optim_clip_grad_norm(const Model *m, ModelGrads *g, double max_norm, const Backend *be) {
    (void)m;
    size_t n = 0;
    void *flat = model_grads_flat(g, &n);  /* padding is 0: it adds nothing to the norm */
    double norm = sqrt(be->sum_squares(be, flat, n));
    if (max_norm > 0.0 && isfinite(norm)) {
        double coef = max_norm / (norm + 1e-6);
        if (coef < 1.0) be->scale(be, flat, (float)coef, n);
    }
    return norm;
}

/* ---------------------------------------------------------------- state file */

#define OPTIM_FORMAT "colt-adamw"
/* Steps far beyond any run, far inside the bias corrections' arithmetic. */
#define OPTIM_MAX_STEP ((int64_t)1 << 40)

/* State tensor k of parameter i: 0 exp_avg, 1 exp_avg_sq, 2 the fp32 master
 * weight (saved when the storage is not fp32, so a GPU run resumes from the
 * exact weights, not their bf16 rounding). */
static void *state_buffer(const Optimizer *o, int i, int k) {
    return k == 0 ? o->exp_avg[i] : k == 1 ? o->exp_avg_sq[i] : o->master[i];
}

static char *moment_name(const char *param, int which) {
    const char *suffix = which == 0 ? ".exp_avg" : which == 1 ? ".exp_avg_sq" : ".master";
    size_t len = strlen(param) + strlen(suffix) + 1;
    char *s = xmalloc(len);
    snprintf(s, len, "%s%s", param, suffix);
    return s;
}

/* An F32 safetensors file (tensors in parameter order, exp_avg then
 * exp_avg_sq) with __metadata__ {"format", "step"}; safetensors_write has no
 * way to add metadata, so the header is written here. */
int optim_save(const Optimizer *o, const char *path, char *err) {
    json_t *root = json_object(), *meta = json_object();
    char step[32];
    snprintf(step, sizeof step, "%lld", (long long)o->step);
    json_object_set_new(meta, "format", json_string(OPTIM_FORMAT));
    json_object_set_new(meta, "step", json_string(step));
    json_object_set_new(root, "__metadata__", meta);
    size_t offset = 0, max_numel = 1;
    const int per_param = o->master_flat ? 3 : 2;
    for (int i = 0; i < o->n; i++) {
        size_t numel = o->params[i].numel;
        if (numel > max_numel) max_numel = numel;
        for (int k = 0; k < per_param; k++) {
            json_t *entry = json_object(), *shape = json_array(), *offs = json_array();
            json_array_append_new(shape, json_integer((json_int_t)numel));
            json_array_append_new(offs, json_integer((json_int_t)offset));
            json_array_append_new(offs, json_integer((json_int_t)(offset + numel * 4)));
            offset += numel * 4;
            json_object_set_new(entry, "dtype", json_string("F32"));
            json_object_set_new(entry, "shape", shape);
            json_object_set_new(entry, "data_offsets", offs);
            char *name = moment_name(o->params[i].name, k);
            json_object_set_new(root, name, entry);
            free(name);
        }
    }
    char *header = json_dumps(root, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(root);
    COLT_ASSERT(header);
    size_t hlen = strlen(header), padded = (hlen + 7) / 8 * 8;

    AtomicFile af;
    if (atomic_open(&af, path, err) != 0) {
        free(header);
        return COLT_ERR;
    }
    uint8_t len_bytes[8];
    for (int i = 0; i < 8; i++) len_bytes[i] = (uint8_t)((uint64_t)padded >> (8 * i));
    int ok = fwrite(len_bytes, 1, 8, af.fp) == 8 && fwrite(header, 1, hlen, af.fp) == hlen;
    for (size_t i = hlen; ok && i < padded; i++) ok = fputc(' ', af.fp) != EOF;
    free(header);
    float *host = xmalloc(max_numel * sizeof(float));
    for (int i = 0; ok && i < o->n; i++)
        for (int k = 0; ok && k < per_param; k++) {
            size_t numel = o->params[i].numel;
            o->be->download_f32(o->be, host, state_buffer(o, i, k), numel);
            ok = fwrite(host, 4, numel, af.fp) == numel;
        }
    free(host);
    if (!ok) {
        atomic_abort(&af);
        return errorf(err, "%s: write failed", path);
    }
    return atomic_commit(&af, err);
}

/* Reads __metadata__.step from the header JSON (safetensors_parse_header has
 * validated the file; it does not keep the metadata). */
static int read_step(int64_t *step, const uint8_t *bytes, size_t size, const char *path, char *err) {
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)bytes[i] << (8 * i);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)bytes + 8, (size_t)hlen, 0, &jerr);
    if (!root) return errorf(err, "%s: header is not JSON: %s", path, jerr.text);
    json_t *meta = json_object_get(root, "__metadata__");
    const char *fmt = json_string_value(json_object_get(meta, "format"));
    const char *s = json_string_value(json_object_get(meta, "step"));
    char *end = NULL;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : -1;
    int bad_format = !fmt || strcmp(fmt, OPTIM_FORMAT) != 0;
    int bad_step = !s || end == s || *end != '\0' || errno != 0 || v < 0 || v > OPTIM_MAX_STEP;
    json_decref(root);
    if (bad_format) return errorf(err, "%s: not a colt optimizer state (metadata format is not '%s')", path, OPTIM_FORMAT);
    if (bad_step)
        return errorf(err, "%s: metadata 'step' is missing or not an integer in 0 .. %lld", path,
                      (long long)OPTIM_MAX_STEP);
    (void)size;
    *step = v;
    return 0;
}

int optim_load_bytes(Optimizer *o, const void *data, size_t size, const char *path, char *err) {
    SafeTensorsHeader h;
    if (safetensors_parse_header(&h, data, size, path, err) != 0) return COLT_ERR;
    int rc = 0;
    int64_t step = 0;
    rc = read_step(&step, data, size, path, err);
    /* Moments always; master weights when the file has them (a GPU run's) and
     * this optimizer keeps them (otherwise they start from the loaded weights). */
    if (rc == 0 && h.n_tensors != 2 * o->n && h.n_tensors != 3 * o->n)
        rc = errorf(err, "%s: has %d tensors, the model's %d parameters need %d (a state for another model?)", path,
                    h.n_tensors, o->n, 2 * o->n);
    const int per_param = h.n_tensors == 3 * o->n && o->master_flat ? 3 : 2;
    /* Check everything before touching the moments, so a bad file changes nothing. */
    const SafeTensor **found = xcalloc((size_t)(3 * o->n + 1), sizeof(*found));
    for (int i = 0; rc == 0 && i < o->n; i++)
        for (int k = 0; rc == 0 && k < per_param; k++) {
            char *name = moment_name(o->params[i].name, k);
            const SafeTensor *t = NULL;
            for (int j = 0; j < h.n_tensors && !t; j++)
                if (strcmp(h.tensors[j].name, name) == 0) t = &h.tensors[j];
            if (!t) rc = errorf(err, "%s: no tensor '%s' (a state for another model?)", path, name);
            else if (t->dtype != DTYPE_F32) rc = errorf(err, "%s: tensor '%s' is not F32", path, name);
            else if (safetensors_numel(t) != o->params[i].numel)
                rc = errorf(err, "%s: tensor '%s' has %zu elements, the model's parameter has %zu", path, name,
                            safetensors_numel(t), o->params[i].numel);
            found[3 * i + k] = t;
            free(name);
        }
    size_t max_numel = 1;
    for (int i = 0; i < o->n; i++)
        if (o->params[i].numel > max_numel) max_numel = o->params[i].numel;
    float *host = xmalloc(max_numel * sizeof(float));
    /* Every value finite (exp_avg_sq also >= 0: AdamW takes its square root),
     * checked before anything is uploaded. */
    for (int i = 0; rc == 0 && i < o->n; i++)
        for (int k = 0; rc == 0 && k < per_param; k++) {
            safetensors_to_f32(host, found[3 * i + k]);
            for (size_t j = 0; j < o->params[i].numel; j++)
                if (!isfinite(host[j]) || (k == 1 && host[j] < 0.0f)) {
                    rc = errorf(err, "%s: tensor '%s' holds %g at index %zu (%s)", path, found[3 * i + k]->name,
                                (double)host[j], j, k == 1 ? "must be finite and >= 0" : "must be finite");
                    break;
                }
        }
    for (int i = 0; rc == 0 && i < o->n; i++)
        for (int k = 0; k < per_param; k++) {
            safetensors_to_f32(host, found[3 * i + k]);
            o->be->upload_f32(o->be, state_buffer(o, i, k), host, o->params[i].numel);
        }
    free(host);
    if (rc == 0) o->step = step;
    free(found);
    safetensors_header_free(&h);
    return rc;
}

int optim_load(Optimizer *o, const char *path, char *err) {
    MappedFile mf;
    if (file_map(&mf, path, err) != 0) return COLT_ERR;
    int rc = optim_load_bytes(o, mf.data, mf.size, path, err);
    file_unmap(&mf);
    return rc;
}
