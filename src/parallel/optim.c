/* optim.c — torch.optim.AdamW over a model's parameters through the backend's
 * adamw op, transformers' learning-rate schedules, torch's global-norm gradient
 * clipping, and the optimizer-state file.
 *
 * Scalars are computed in double from the decimal the user wrote (0.999f is
 * taken as 0.999, as Python has it) and rounded to float only when handed to
 * the backend, so bias corrections and schedules match torch/transformers to
 * float rounding. This is not the trainer loop and not the GRPO loss. */
#include "parallel/optim.h"

#include <errno.h>
#include <pthread.h>
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/floats.h"
#include "core/fileio.h"
#include "core/log.h"
#include "model/safetensors.h"
#include "parallel/host_adamw.h"


/* ---------------------------------------------------------------- schedules */

int lr_scheduler_parse(LrSchedulerType *out, const char *s, char *err) {
    static const char *names[] = {"constant", "constant_with_warmup", "linear", "cosine", "cosine_with_min_lr"};
    for (int i = 0; i < 5; i++)
        if (s && strcmp(s, names[i]) == 0) {
            *out = (LrSchedulerType)i;
            return 0;
        }
    return errorf(err, "lr_scheduler_type '%s' is not supported; use constant, constant_with_warmup, linear, cosine or "
                       "cosine_with_min_lr",
                  s ? s : "(null)");
}

/* transformers.optimization's lr lambdas (cosine with num_cycles = 0.5;
 * cosine_with_min_lr's factor f * (1 - min_lr_rate) + min_lr_rate), times
 * base_lr as LambdaLR does, in double. Note: plain "constant" has no warmup at
 * all in transformers, whatever warmup_steps is. */
float lr_schedule_value(LrSchedulerType type, float base_lr, int step, int total_steps, int warmup_steps,
                        double min_lr_rate) {
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
    case LR_COSINE_WITH_MIN_LR:
        if (step < warmup_steps) factor = (double)step / (double)(warmup_steps > 1 ? warmup_steps : 1);
        else {
            int span = total_steps - warmup_steps;
            double progress = (double)(step - warmup_steps) / (double)(span > 1 ? span : 1);
            factor = 0.5 * (1.0 + cos(M_PI * 0.5 * 2.0 * progress));
            if (type == LR_COSINE_WITH_MIN_LR) factor = factor * (1.0 - min_lr_rate) + min_lr_rate;
            factor = fmax(0.0, factor);
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

/* Elements per offload chunk: 8M (32 MB of fp32 gradients), big enough for
 * the bus and small enough that two in flight cost little pinned memory. */
#define OFFLOAD_CHUNK ((size_t)8 << 20)

struct Optimizer {
    const Backend *be;
    Model *model;
    AdamWConfig cfg;
    OptimShardOptions so;
    int n;              /* parameter tensors */
    ModelParam *params; /* [n] */
    size_t *offsets;    /* [n] element offset of each parameter in the flat layout */
    size_t flat_numel;  /* the flat layout's elements (alignment padding included; it stays 0) */
    size_t lo, hi;      /* this rank's shard [lo, hi) of the flat layout */
    size_t mid;         /* [lo, mid): state and update on the device; [mid, hi): on the host (offload) */
    /* The device part's state, mid - lo fp32 each, in the flat layout's order.
     * master is NULL when the storage is fp32 (the update runs on the weights
     * themselves). */
    void *exp_avg, *exp_avg_sq, *master;
    /* The host part's, hi - mid each (master always: the host keeps the
     * weights AdamW updates). */
    float *host_exp_avg, *host_exp_avg_sq, *host_master;
    /* offload: pinned staging, two chunks of gradients and of updated weights */
    void *stage_grad[2], *stage_weight[2];
    double last_host_s; /* the last offloaded step's host AdamW time */
    int64_t step;
};

size_t optim_shard_elements(size_t numel, int world) {
    size_t per = (numel + (size_t)world - 1) / (size_t)world;
    return (per + 63) / 64 * 64; /* vector-aligned shard starts */
}

void optim_shard_bounds(size_t numel, int world, int rank, size_t *lo, size_t *hi) {
    size_t per = optim_shard_elements(numel, world), a = per * (size_t)rank, b = a + per;
    *lo = a < numel ? a : numel;
    *hi = b < numel ? b : numel; /* per x world >= numel: the last shard ends at numel */
}

void optim_shard_range(const Optimizer *o, size_t *lo, size_t *hi) {
    *lo = o->lo;
    *hi = o->hi;
}

bool optim_is_sharded(const Optimizer *o) { return o->so.world > 1; }

size_t optim_offload_split(size_t lo, size_t hi, double device_share) {
    if (!(device_share > 0.0)) return lo;
    if (device_share >= 1.0) return hi;
    size_t mid = lo + (size_t)((double)(hi - lo) * device_share) / 64 * 64; /* vector-aligned, as shard starts */
    return mid < hi ? mid : hi;
}

static bool offloaded(const Optimizer *o) { return o->mid < o->hi; }

/* State k (0 exp_avg, 1 exp_avg_sq, 2 master) of the device part and of the host part. */
static void *device_state(const Optimizer *o, int k) { return k == 0 ? o->exp_avg : k == 1 ? o->exp_avg_sq : o->master; }
static float *host_state(const Optimizer *o, int k) {
    return k == 0 ? o->host_exp_avg : k == 1 ? o->host_exp_avg_sq : o->host_master;
}

/* Reads / writes n fp32 values of state k at flat offset off (inside the
 * shard) from / to host memory, across both parts. The device part's master
 * is the weights themselves when the storage is fp32. */
static void state_get(const Optimizer *o, int k, size_t off, size_t n, float *dst) {
    size_t on_device = off < o->mid ? (o->mid - off < n ? o->mid - off : n) : 0;
    if (on_device) {
        if (k == 2 && !o->master) o->be->download(o->be, dst, model_params_at(o->model, off), on_device);
        else o->be->download_f32(o->be, dst, (const char *)device_state(o, k) + (off - o->lo) * sizeof(float), on_device);
    }
    if (on_device < n) memcpy(dst + on_device, host_state(o, k) + (off + on_device - o->mid), (n - on_device) * sizeof(float));
}

/* (state 2 of an fp32 device part is the weights, loaded with the model: nothing to write.) */
static void state_put(Optimizer *o, int k, size_t off, size_t n, const float *src) {
    size_t on_device = off < o->mid ? (o->mid - off < n ? o->mid - off : n) : 0;
    if (on_device && !(k == 2 && !o->master))
        o->be->upload_f32(o->be, (char *)device_state(o, k) + (off - o->lo) * sizeof(float), src, on_device);
    if (on_device < n) memcpy(host_state(o, k) + (off + on_device - o->mid), src + on_device, (n - on_device) * sizeof(float));
}

/* Master weights apart from the weights: a low-precision storage, or a host part. */
static bool has_master(const Optimizer *o) { return o->master != NULL || o->host_master != NULL; }

/* The weights in [off, off + n) as fp32 on the host. */
static void weights_get(const Optimizer *o, size_t off, size_t n, float *dst) {
    o->be->download(o->be, dst, model_params_at(o->model, off), n);
}

int optim_create(Optimizer **out, Model *m, const AdamWConfig *cfg, const Backend *be, char *err) {
    OptimShardOptions whole = {.rank = 0, .world = 1};
    return optim_create_sharded(out, m, cfg, be, &whole, err);
}

int optim_create_sharded(Optimizer **out, Model *m, const AdamWConfig *cfg, const Backend *be,
                         const OptimShardOptions *so, char *err) {
    *out = NULL;
    if (!be->adamw || !be->alloc_f32 || !be->zero_f32)
        return errorf(err, "backend '%s' has no adamw/zero op; the optimizer cannot run on it", be->name);
    if (!(cfg->beta1 >= 0.0f && cfg->beta1 < 1.0f && cfg->beta2 >= 0.0f && cfg->beta2 < 1.0f))
        return errorf(err, "AdamW betas must be in [0, 1) (got %g, %g)", (double)cfg->beta1, (double)cfg->beta2);
    if (!(cfg->eps >= 0.0f) || !(cfg->weight_decay >= 0.0f))
        return errorf(err, "AdamW eps and weight_decay must be >= 0 (got %g, %g)", (double)cfg->eps,
                      (double)cfg->weight_decay);
    if (so->world < 1 || so->rank < 0 || so->rank >= so->world)
        return errorf(err, "optimizer shard: rank %d of world %d", so->rank, so->world);
    if (so->offload && (!be->alloc_host || !be->copy_to_host || !be->copy_from_host))
        return errorf(err, "offload_optimizer: backend '%s' cannot copy to and from host memory", be->name);
    Optimizer *o = xcalloc(1, sizeof(Optimizer));
    o->be = be;
    o->model = m;
    o->cfg = *cfg;
    o->so = *so;
    o->n = model_param_count(m);
    o->params = xcalloc((size_t)(o->n ? o->n : 1), sizeof(ModelParam));
    o->offsets = xcalloc((size_t)(o->n ? o->n : 1), sizeof(size_t));
    size_t es = dtype_size(be->storage);
    model_params_flat(m, &o->flat_numel);
    for (int i = 0; i < o->n; i++) {
        o->params[i] = model_param(m, i);
        o->offsets[i] = model_param_offset(m, i);
    }
    optim_shard_bounds(o->flat_numel, so->world, so->rank, &o->lo, &o->hi);
    o->mid = so->offload ? optim_offload_split(o->lo, o->hi, so->device_share) : o->hi;
    if (offloaded(o)) {
        size_t n = o->hi - o->mid;
        /* Plain host memory (the bulk: 12 bytes a parameter); only the staging is
         * pinned. Touched here by every core (on a 7B model the first step's
         * page faults took 27 s instead of 2 on one thread). */
        for (int k = 0; k < 3; k++) {
            float *buf = malloc(n * sizeof(float));
            if (buf) host_zero(buf, n, so->host_threads);
            if (!buf) {
                optim_free(o);
                return errorf(err, "offload_optimizer: cannot allocate %.2f GB of host memory for the optimizer "
                                   "state (the memory plan counts 12 bytes per offloaded parameter of this rank's shard)",
                              3.0 * (double)n * 4 / 1e9);
            }
            if (k == 0) o->host_exp_avg = buf;
            else if (k == 1) o->host_exp_avg_sq = buf;
            else o->host_master = buf;
        }
        size_t chunk = n < OFFLOAD_CHUNK ? n : OFFLOAD_CHUNK;
        for (int b = 0; b < 2; b++) {
            o->stage_grad[b] = be->alloc_host(be, chunk * sizeof(float));
            o->stage_weight[b] = be->alloc_host(be, chunk * es);
            if (!o->stage_grad[b] || !o->stage_weight[b]) {
                optim_free(o);
                return errorf(err, "offload_optimizer: cannot allocate %.0f MB of pinned host memory for staging",
                              2.0 * (double)chunk * (4 + es) / 1e6);
            }
        }
        /* The master weights start as the model's. */
        for (size_t off = o->mid; off < o->hi; off += OFFLOAD_CHUNK) {
            size_t len = o->hi - off < OFFLOAD_CHUNK ? o->hi - off : OFFLOAD_CHUNK;
            weights_get(o, off, len, o->host_master + (off - o->mid));
        }
    }
    size_t n = o->mid - o->lo;
    if (n > 0 || !offloaded(o)) {
        o->exp_avg = be->alloc_f32(be, n);
        o->exp_avg_sq = be->alloc_f32(be, n);
        be->zero_f32(be, o->exp_avg, n);
        be->zero_f32(be, o->exp_avg_sq, n);
        if (be->storage != DTYPE_F32) {
            /* fp32 master copy of the low-precision weights: AdamW updates it. */
            o->master = be->alloc_f32(be, n);
            float *tmp = xmalloc(OFFLOAD_CHUNK * sizeof(float));
            for (size_t off = o->lo; off < o->mid; off += OFFLOAD_CHUNK) {
                size_t len = o->mid - off < OFFLOAD_CHUNK ? o->mid - off : OFFLOAD_CHUNK;
                weights_get(o, off, len, tmp);
                be->upload_f32(be, (char *)o->master + (off - o->lo) * sizeof(float), tmp, len);
            }
            free(tmp);
        }
    }
    *out = o;
    return 0;
}

void optim_free(Optimizer *o) {
    if (!o) return;
    void *bufs[3] = {o->exp_avg, o->exp_avg_sq, o->master};
    for (int k = 0; k < 3; k++) {
        if (bufs[k]) o->be->free(o->be, bufs[k]);
        free(host_state(o, k));
    }
    for (int b = 0; b < 2; b++) {
        if (o->stage_grad[b]) o->be->free_host(o->be, o->stage_grad[b]);
        if (o->stage_weight[b]) o->be->free_host(o->be, o->stage_weight[b]);
    }
    free(o->offsets);
    free(o->params);
    free(o);
}

int64_t optim_step_count(const Optimizer *o) { return o->step; }

/* Sum of squares in double of the state k (or of the weights AdamW updates,
 * k = 2 without master) over the shard, in a fixed order: the device part,
 * then the host part. */
static double state_sum_squares(const Optimizer *o, int k) {
    size_t n = o->mid - o->lo;
    double sum = 0.0;
    if (n > 0) {
        /* fp32 storage without master: the weights are [f32] */
        const void *x = k == 2 && !o->master ? model_params_at(o->model, o->lo) : device_state(o, k);
        sum = o->be->sum_squares(o->be, x, n);
    }
    if (offloaded(o)) sum += host_sum_squares(host_state(o, k), o->hi - o->mid);
    return sum;
}

/* A sum of squares in double is finite exactly when every float is (the
 * largest float squared is ~1e77). */
bool optim_state_finite(const Optimizer *o) {
    return isfinite(state_sum_squares(o, 2)) && isfinite(state_sum_squares(o, 0)) &&
           isfinite(state_sum_squares(o, 1));
}

void optim_fingerprint(const Optimizer *o, double out[2]) {
    out[0] = state_sum_squares(o, 2);
    out[1] = state_sum_squares(o, 0);
}

size_t optim_state_bytes(const Optimizer *o) { return (o->mid - o->lo) * sizeof(float) * (o->master ? 3 : 2); }

size_t optim_offload_host_bytes(size_t host_numel, DType storage) {
    if (host_numel == 0) return 0;
    size_t chunk = host_numel < OFFLOAD_CHUNK ? host_numel : OFFLOAD_CHUNK;
    return host_numel * sizeof(float) * 3 + 2 * chunk * (sizeof(float) + dtype_size(storage));
}

size_t optim_state_host_bytes(const Optimizer *o) { return optim_offload_host_bytes(o->hi - o->mid, o->be->storage); }

/* ---- the offloaded step: chunks of the shard through pinned staging ----
 *
 * The main thread copies chunk k's gradients down while a worker thread runs
 * AdamW on chunk k - 1, then copies chunk k - 1's new weights up while the
 * worker runs chunk k: the bus and the host's cores work at once. */

typedef struct OffloadJob {
    size_t off, len; /* flat elements */
    float wd;
    int buf;
} OffloadJob;

typedef struct OffloadWorker {
    Optimizer *o;
    const HostAdamWStep *decayed, *plain;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    OffloadJob job;
    bool has_job, quit;
    double busy_s; /* the worker's AdamW time (host_adamw) */
} OffloadWorker;

/* AdamW on the host for one chunk: its gradients are in stage_grad[j.buf], its
 * new weights go to stage_weight[j.buf]. Returns the seconds it took. */
static double run_offload_job(Optimizer *o, const OffloadJob *j, const HostAdamWStep *decayed,
                              const HostAdamWStep *plain) {
    size_t at = j->off - o->mid;
    double t0 = time_now();
    host_adamw(j->wd != 0.0f ? decayed : plain, o->host_master + at, o->host_exp_avg + at, o->host_exp_avg_sq + at,
               o->stage_grad[j->buf], o->stage_weight[j->buf], o->be->storage, j->len, o->so.host_threads);
    return time_now() - t0;
}

static void *offload_worker_main(void *arg) {
    OffloadWorker *w = arg;
    Optimizer *o = w->o;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->has_job && !w->quit) pthread_cond_wait(&w->cv, &w->mu);
        if (!w->has_job) break;
        OffloadJob j = w->job;
        pthread_mutex_unlock(&w->mu);
        double took = run_offload_job(o, &j, w->decayed, w->plain);
        pthread_mutex_lock(&w->mu);
        w->busy_s += took;
        w->has_job = false;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

static void offload_post(OffloadWorker *w, OffloadJob j) {
    pthread_mutex_lock(&w->mu);
    w->job = j;
    w->has_job = true;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

static void offload_wait(OffloadWorker *w) {
    pthread_mutex_lock(&w->mu);
    while (w->has_job) pthread_cond_wait(&w->cv, &w->mu);
    pthread_mutex_unlock(&w->mu);
}

/* grads: the gradient of flat element i at (grads + (i - grads_base) * 4). */
static void offload_step(Optimizer *o, const char *grads, size_t grads_base, size_t split,
                         const HostAdamWStep *decayed, const HostAdamWStep *plain) {
    const Backend *be = o->be;
    size_t es = dtype_size(be->storage);
    /* The chunks: the host part cut at the decay / no-decay boundary and every OFFLOAD_CHUNK. */
    size_t n_jobs = 0, cap = (o->hi - o->mid) / OFFLOAD_CHUNK + 3;
    OffloadJob *jobs = xcalloc(cap, sizeof(OffloadJob));
    for (int group = 0; group < 2; group++) {
        size_t start = group == 0 ? o->mid : (split > o->mid ? split : o->mid);
        size_t end = group == 0 ? (split < o->hi ? split : o->hi) : o->hi;
        for (size_t off = start; off < end; off += OFFLOAD_CHUNK) {
            COLT_ASSERT(n_jobs < cap);
            jobs[n_jobs++] = (OffloadJob){.off = off, .len = end - off < OFFLOAD_CHUNK ? end - off : OFFLOAD_CHUNK,
                                          .wd = group == 0 ? o->cfg.weight_decay : 0.0f};
        }
    }
    OffloadWorker w = {.o = o, .decayed = decayed, .plain = plain};
    pthread_mutex_init(&w.mu, NULL);
    pthread_cond_init(&w.cv, NULL);
    pthread_t thread;
    int started = pthread_create(&thread, NULL, offload_worker_main, &w) == 0;
    for (size_t k = 0; k <= n_jobs; k++) {
        if (k < n_jobs) {
            jobs[k].buf = (int)(k & 1);
            be->copy_to_host(be, o->stage_grad[k & 1], grads + (jobs[k].off - grads_base) * sizeof(float),
                             jobs[k].len * sizeof(float));
        }
        offload_wait(&w); /* chunk k - 1 is done */
        if (k < n_jobs) {
            if (started) offload_post(&w, jobs[k]);
            else w.busy_s += run_offload_job(o, &jobs[k], decayed, plain); /* no thread to be had: in turn */
        }
        if (k >= 1) {
            const OffloadJob *j = &jobs[k - 1];
            be->copy_from_host(be, model_params_at(o->model, j->off), o->stage_weight[j->buf], j->len * es);
        }
    }
    if (started) {
        pthread_mutex_lock(&w.mu);
        w.quit = true;
        pthread_cond_broadcast(&w.cv);
        pthread_mutex_unlock(&w.mu);
        pthread_join(thread, NULL);
    }
    pthread_mutex_destroy(&w.mu);
    pthread_cond_destroy(&w.cv);
    o->last_host_s = w.busy_s;
    free(jobs);
}

/* torch's _single_tensor_adam: step += 1; bias_correction_k = 1 - beta_k ** step
 * in Python doubles; the backend op (or host_adamw) does the rest in torch's order.
 * The gradient of flat element i is at grads + (i - grads_base) * 4. */
static void step_impl(Optimizer *o, const char *grads, size_t grads_base, float lr) {
    o->step++;
    /* an engine that outlives this step must not reuse K/V of the old weights; its graphs stay valid (in place) */
    model_weights_changed_in_place(o->model);
    double beta1 = float_as_decimal(o->cfg.beta1), beta2 = float_as_decimal(o->cfg.beta2);
    float bc1 = (float)(1.0 - pow(beta1, (double)o->step));
    float bc2 = (float)(1.0 - pow(beta2, (double)o->step));
    /* The weights are reached through model_params_at: the arena, or this
     * rank's part of it under zero_stage 3. Two groups as transformers' Trainer makes them: weight decay on matrices and
     * embeddings, none on biases and norms (they sit at the end of the layout). */
    size_t split = model_params_no_decay_start(o->model);
    /* The device part first: its update is queued ahead of the host part's copies and takes milliseconds
     * (memory-bound) where the host's takes the better part of a second. */
    for (int group = 0; group < 2; group++) {
        size_t start = group == 0 ? 0 : split, end = group == 0 ? split : o->flat_numel;
        if (start < o->lo) start = o->lo;
        if (end > o->mid) end = o->mid;
        if (end <= start) continue;
        size_t f = (start - o->lo) * sizeof(float);
        o->be->adamw(o->be, model_params_at(o->model, start), o->master ? (char *)o->master + f : NULL,
                     grads + (start - grads_base) * sizeof(float), (char *)o->exp_avg + f, (char *)o->exp_avg_sq + f,
                     end - start, lr, o->cfg.beta1, o->cfg.beta2, o->cfg.eps,
                     group == 0 ? o->cfg.weight_decay : 0.0f, bc1, bc2);
    }
    if (offloaded(o)) {
        HostAdamWStep decayed, plain;
        host_adamw_step_init(&decayed, lr, o->cfg.beta1, o->cfg.beta2, o->cfg.eps, o->cfg.weight_decay, bc1, bc2);
        host_adamw_step_init(&plain, lr, o->cfg.beta1, o->cfg.beta2, o->cfg.eps, 0.0f, bc1, bc2);
        offload_step(o, grads, grads_base, split, &decayed, &plain);
    }
}

void optim_step(Optimizer *o, const ModelGrads *g, float lr) {
    size_t n_grads = 0;
    const char *grads = model_grads_flat(g, &n_grads);
    COLT_ASSERT(grads && n_grads == o->flat_numel);
    step_impl(o, grads, 0, lr);
}

void optim_step_shard(Optimizer *o, const void *shard_grads, float lr) { step_impl(o, shard_grads, o->lo, lr); }

double optim_last_host_seconds(const Optimizer *o) { return o->last_host_s; }

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

/* ---------------------------------------------------------------- state files */

#define OPTIM_FORMAT "colt-adamw"
#define OPTIM_SHARD_FORMAT "colt-adamw-shard"
/* Steps far beyond any run, far inside the bias corrections' arithmetic. */
#define OPTIM_MAX_STEP ((int64_t)1 << 40)

static const char *STATE_SUFFIX[3] = {".exp_avg", ".exp_avg_sq", ".master"};
static const char *STATE_FLAT[3] = {"exp_avg", "exp_avg_sq", "master"};

static char *moment_name(const char *param, int which) {
    size_t len = strlen(param) + strlen(STATE_SUFFIX[which]) + 1;
    char *s = xmalloc(len);
    snprintf(s, len, "%s%s", param, STATE_SUFFIX[which]);
    return s;
}

/* State k is saved when it exists: the moments always, the master weights
 * when kept apart from the weights (storage not fp32, or offloaded), so a GPU
 * run resumes from the exact weights, not their bf16 rounding. */
static int states_saved(const Optimizer *o) { return has_master(o) ? 3 : 2; }

/* A fingerprint of the flat layout (names, offsets, sizes): shard files of
 * another model or layout are refused. */
static uint64_t layout_hash(const Optimizer *o) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < o->n; i++) {
        for (const char *c = o->params[i].name; *c; c++) h = (h ^ (uint8_t)*c) * 1099511628211ull;
        uint64_t v[2] = {o->offsets[i], o->params[i].numel};
        for (int k = 0; k < 2; k++)
            for (int b = 0; b < 8; b++) h = (h ^ ((v[k] >> (8 * b)) & 0xff)) * 1099511628211ull;
    }
    return h;
}

/* Writes a safetensors file of F32 1-D tensors (names[i], counts[i]) with the
 * given metadata; the data comes from fill(i, offset, n, host) in pieces. */
typedef void (*FillFn)(const Optimizer *o, int tensor, size_t offset, size_t n, float *host);
static int write_f32_file(const Optimizer *o, const char *path, json_t *meta, int n_tensors, char **names,
                          const size_t *counts, FillFn fill, char *err) {
    json_t *root = json_object();
    json_object_set_new(root, "__metadata__", meta);
    size_t offset = 0;
    for (int i = 0; i < n_tensors; i++) {
        json_t *entry = json_object(), *shape = json_array(), *offs = json_array();
        json_array_append_new(shape, json_integer((json_int_t)counts[i]));
        json_array_append_new(offs, json_integer((json_int_t)offset));
        json_array_append_new(offs, json_integer((json_int_t)(offset + counts[i] * 4)));
        offset += counts[i] * 4;
        json_object_set_new(entry, "dtype", json_string("F32"));
        json_object_set_new(entry, "shape", shape);
        json_object_set_new(entry, "data_offsets", offs);
        json_object_set_new(root, names[i], entry);
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
    float *host = xmalloc(OFFLOAD_CHUNK * sizeof(float));
    for (int i = 0; ok && i < n_tensors; i++)
        for (size_t off = 0; ok && off < counts[i]; off += OFFLOAD_CHUNK) {
            size_t len = counts[i] - off < OFFLOAD_CHUNK ? counts[i] - off : OFFLOAD_CHUNK;
            fill(o, i, off, len, host);
            ok = fwrite(host, 4, len, af.fp) == len;
        }
    free(host);
    if (!ok) {
        atomic_abort(&af);
        return errorf(err, "%s: write failed", path);
    }
    return atomic_commit(&af, err);
}

static json_t *step_meta(const Optimizer *o, const char *format) {
    json_t *meta = json_object();
    char step[32];
    snprintf(step, sizeof step, "%lld", (long long)o->step);
    json_object_set_new(meta, "format", json_string(format));
    json_object_set_new(meta, "step", json_string(step));
    return meta;
}

/* Per-parameter file: tensor i * states + k is parameter i's state k. */
static void fill_param(const Optimizer *o, int tensor, size_t offset, size_t n, float *host) {
    int states = states_saved(o), i = tensor / states, k = tensor % states;
    state_get(o, k, o->offsets[i] + offset, n, host);
}

/* An F32 safetensors file with 1-D tensors "<param name>.exp_avg" /
 * ".exp_avg_sq" (/ ".master") of the parameter's numel and metadata
 * {"format", "step"}; safetensors_write has no way to add metadata, so the
 * header is written here. */
int optim_save(const Optimizer *o, const char *path, char *err) {
    if (o->lo != 0 || o->hi != o->flat_numel)
        return errorf(err, "%s: this optimizer holds one shard of the state: save it with optim_save_shard", path);
    int states = states_saved(o), n = o->n * states;
    char **names = xcalloc((size_t)(n ? n : 1), sizeof(char *));
    size_t *counts = xcalloc((size_t)(n ? n : 1), sizeof(size_t));
    for (int i = 0; i < o->n; i++)
        for (int k = 0; k < states; k++) {
            names[i * states + k] = moment_name(o->params[i].name, k);
            counts[i * states + k] = o->params[i].numel;
        }
    int rc = write_f32_file(o, path, step_meta(o, OPTIM_FORMAT), n, names, counts, fill_param, err);
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
    free(counts);
    return rc;
}

static void fill_shard(const Optimizer *o, int tensor, size_t offset, size_t n, float *host) {
    state_get(o, tensor, o->lo + offset, n, host);
}

int optim_save_shard(const Optimizer *o, const char *path, char *err) {
    json_t *meta = step_meta(o, OPTIM_SHARD_FORMAT);
    char num[32];
    size_t v[3] = {o->lo, o->hi, o->flat_numel};
    const char *keys[3] = {"lo", "hi", "flat_numel"};
    for (int k = 0; k < 3; k++) {
        snprintf(num, sizeof num, "%zu", v[k]);
        json_object_set_new(meta, keys[k], json_string(num));
    }
    snprintf(num, sizeof num, "%016llx", (unsigned long long)layout_hash(o));
    json_object_set_new(meta, "layout", json_string(num));
    int states = states_saved(o);
    size_t counts[3] = {o->hi - o->lo, o->hi - o->lo, o->hi - o->lo};
    return write_f32_file(o, path, meta, states, (char **)STATE_FLAT, counts, fill_shard, err);
}

/* Reads the header's __metadata__ (safetensors_parse_header has validated
 * the file; it does not keep the metadata): format and step always. */
static json_t *read_meta(const uint8_t *bytes, const char *path, const char *format, int64_t *step, char *err) {
    uint64_t hlen = 0;
    for (int i = 0; i < 8; i++) hlen |= (uint64_t)bytes[i] << (8 * i);
    json_error_t jerr;
    json_t *root = json_loadb((const char *)bytes + 8, (size_t)hlen, 0, &jerr);
    if (!root) {
        errorf(err, "%s: header is not JSON: %s", path, jerr.text);
        return NULL;
    }
    json_t *meta = json_incref(json_object_get(root, "__metadata__"));
    json_decref(root);
    const char *fmt = json_string_value(json_object_get(meta, "format"));
    const char *s = json_string_value(json_object_get(meta, "step"));
    char *end = NULL;
    errno = 0;
    long long v = s ? strtoll(s, &end, 10) : -1;
    if (!fmt || strcmp(fmt, format) != 0) {
        json_decref(meta);
        errorf(err, "%s: not a colt optimizer %s (metadata format is not '%s')", path,
               strcmp(format, OPTIM_FORMAT) ? "shard" : "state", format);
        return NULL;
    }
    if (!s || end == s || *end != '\0' || errno != 0 || v < 0 || v > OPTIM_MAX_STEP) {
        json_decref(meta);
        errorf(err, "%s: metadata 'step' is missing or not an integer in 0 .. %lld", path, (long long)OPTIM_MAX_STEP);
        return NULL;
    }
    *step = v;
    return meta;
}

/* Every value of t finite (state 1 also >= 0: AdamW takes its square root). */
static int check_finite(const SafeTensor *t, int k, const char *path, char *err) {
    size_t n = safetensors_numel(t);
    float *host = xmalloc(OFFLOAD_CHUNK * sizeof(float));
    int rc = 0;
    SafeTensor part = *t;
    for (size_t off = 0; rc == 0 && off < n; off += OFFLOAD_CHUNK) {
        size_t len = n - off < OFFLOAD_CHUNK ? n - off : OFFLOAD_CHUNK;
        part.data = (const uint8_t *)t->data + off * 4;
        part.shape[0] = (int64_t)len;
        part.ndim = 1;
        safetensors_to_f32(host, &part);
        for (size_t j = 0; j < len; j++)
            if (!isfinite(host[j]) || (k == 1 && host[j] < 0.0f)) {
                rc = errorf(err, "%s: tensor '%s' holds %g at index %zu (%s)", path, t->name, (double)host[j],
                            off + j, k == 1 ? "must be finite and >= 0" : "must be finite");
                break;
            }
    }
    free(host);
    return rc;
}

/* Copies the part [from, to) of the flat layout that t holds (t starting at
 * flat offset t_lo) into state k, clipped to this shard. */
static void load_overlap(Optimizer *o, int k, const SafeTensor *t, size_t t_lo) {
    size_t n = safetensors_numel(t), a = t_lo > o->lo ? t_lo : o->lo, b = t_lo + n < o->hi ? t_lo + n : o->hi;
    if (a >= b) return;
    const float *src = (const float *)((const uint8_t *)t->data) + (a - t_lo);
    float *host = xmalloc(OFFLOAD_CHUNK * sizeof(float));
    for (size_t off = a; off < b; off += OFFLOAD_CHUNK) {
        size_t len = b - off < OFFLOAD_CHUNK ? b - off : OFFLOAD_CHUNK;
        memcpy(host, src + (off - a), len * sizeof(float)); /* the data may be unaligned in the file */
        state_put(o, k, off, len, host);
    }
    free(host);
}

int optim_load_bytes(Optimizer *o, const void *data, size_t size, const char *path, char *err) {
    SafeTensorsHeader h;
    if (safetensors_parse_header(&h, data, size, path, err) != 0) return COLT_ERR;
    int64_t step = 0;
    json_t *meta = read_meta(data, path, OPTIM_FORMAT, &step, err);
    int rc = meta ? 0 : COLT_ERR;
    json_decref(meta);
    /* Moments always; master weights when the file has them (a GPU run's) and
     * this optimizer keeps them (otherwise they start from the loaded weights). */
    if (rc == 0 && h.n_tensors != 2 * o->n && h.n_tensors != 3 * o->n)
        rc = errorf(err, "%s: has %d tensors, the model's %d parameters need %d (a state for another model?)", path,
                    h.n_tensors, o->n, 2 * o->n);
    const int states = h.n_tensors == 3 * o->n && has_master(o) ? 3 : 2;
    /* Check everything before touching the state, so a bad file changes nothing. */
    const SafeTensor **found = xcalloc((size_t)(3 * o->n + 1), sizeof(*found));
    for (int i = 0; rc == 0 && i < o->n; i++)
        for (int k = 0; rc == 0 && k < states; k++) {
            char *name = moment_name(o->params[i].name, k);
            const SafeTensor *t = NULL;
            for (int j = 0; j < h.n_tensors && !t; j++)
                if (strcmp(h.tensors[j].name, name) == 0) t = &h.tensors[j];
            if (!t) rc = errorf(err, "%s: no tensor '%s' (a state for another model?)", path, name);
            else if (t->dtype != DTYPE_F32) rc = errorf(err, "%s: tensor '%s' is not F32", path, name);
            else if (safetensors_numel(t) != o->params[i].numel)
                rc = errorf(err, "%s: tensor '%s' has %zu elements, the model's parameter has %zu", path, name,
                            safetensors_numel(t), o->params[i].numel);
            else rc = check_finite(t, k, path, err);
            found[3 * i + k] = t;
            free(name);
        }
    for (int i = 0; rc == 0 && i < o->n; i++)
        for (int k = 0; k < states; k++) load_overlap(o, k, found[3 * i + k], o->offsets[i]);
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

static int meta_size(json_t *meta, const char *key, size_t *out, const char *path, char *err) {
    const char *s = json_string_value(json_object_get(meta, key));
    char *end = NULL;
    errno = 0;
    unsigned long long v = s ? strtoull(s, &end, 10) : 0;
    if (!s || end == s || *end || errno) return errorf(err, "%s: metadata '%s' is missing or not a count", path, key);
    *out = (size_t)v;
    return 0;
}

int optim_load_shards(Optimizer *o, const char *const *paths, int n_files, char *err) {
    MappedFile *mf = xcalloc((size_t)n_files, sizeof(MappedFile));
    SafeTensorsHeader *h = xcalloc((size_t)n_files, sizeof(SafeTensorsHeader));
    size_t *lo = xcalloc((size_t)n_files, sizeof(size_t)), *hi = xcalloc((size_t)n_files, sizeof(size_t));
    int *states = xcalloc((size_t)n_files, sizeof(int)), mapped = 0, parsed = 0, rc = 0;
    int64_t step = -1;
    char want_layout[32];
    snprintf(want_layout, sizeof want_layout, "%016llx", (unsigned long long)layout_hash(o));
    /* Check every file first (format, step, layout, ranges, values), then load. */
    for (int f = 0; rc == 0 && f < n_files; f++) {
        if ((rc = file_map(&mf[f], paths[f], err)) != 0) break;
        mapped++;
        if ((rc = safetensors_parse_header(&h[f], mf[f].data, mf[f].size, paths[f], err)) != 0) break;
        parsed++;
        int64_t s = 0;
        json_t *meta = read_meta(mf[f].data, paths[f], OPTIM_SHARD_FORMAT, &s, err);
        size_t flat = 0;
        if (!meta) rc = COLT_ERR;
        else if (meta_size(meta, "lo", &lo[f], paths[f], err) || meta_size(meta, "hi", &hi[f], paths[f], err) ||
                 meta_size(meta, "flat_numel", &flat, paths[f], err))
            rc = COLT_ERR;
        else if (flat != o->flat_numel || !json_string_value(json_object_get(meta, "layout")) ||
                 strcmp(json_string_value(json_object_get(meta, "layout")), want_layout) != 0)
            rc = errorf(err, "%s: a shard of another model's optimizer state (its parameter layout differs)", paths[f]);
        else if (step >= 0 && s != step)
            rc = errorf(err, "%s: step %lld, but %s is at step %lld (shards of different checkpoints?)", paths[f],
                        (long long)s, paths[0], (long long)step);
        else if (lo[f] > hi[f] || hi[f] > flat) rc = errorf(err, "%s: shard range %zu..%zu is outside the layout", paths[f], lo[f], hi[f]);
        step = s;
        json_decref(meta);
        if (rc != 0) break;
        states[f] = h[f].n_tensors;
        if (states[f] != 2 && states[f] != 3) {
            rc = errorf(err, "%s: has %d tensors, a shard has 2 or 3", paths[f], states[f]);
            break;
        }
        for (int k = 0; rc == 0 && k < states[f]; k++) {
            const SafeTensor *t = &h[f].tensors[k];
            if (strcmp(t->name, STATE_FLAT[k]) != 0 || t->dtype != DTYPE_F32 || safetensors_numel(t) != hi[f] - lo[f])
                rc = errorf(err, "%s: tensor %d should be F32 '%s' of %zu elements", paths[f], k, STATE_FLAT[k],
                            hi[f] - lo[f]);
            else if (lo[f] < o->hi && hi[f] > o->lo) rc = check_finite(t, k, paths[f], err);
        }
    }
    /* The shards must tile the whole layout, each element once. */
    if (rc == 0) {
        size_t covered = 0;
        for (int pass = 0; pass < n_files && rc == 0; pass++) {
            int next = -1;
            for (int f = 0; f < n_files; f++)
                if (lo[f] == covered && hi[f] > lo[f]) next = f;
            if (next < 0) break;
            covered = hi[next];
        }
        if (covered != o->flat_numel)
            rc = errorf(err, "%s: the %d optimizer shards do not cover the model's parameters (elements from %zu "
                             "on are missing: a shard file lost?)",
                        n_files ? paths[0] : "(none)", n_files, covered);
    }
    for (int f = 0; rc == 0 && f < n_files; f++)
        for (int k = 0; k < (states[f] == 3 && has_master(o) ? 3 : 2); k++) load_overlap(o, k, &h[f].tensors[k], lo[f]);
    if (rc == 0) o->step = step;
    for (int f = 0; f < parsed; f++) safetensors_header_free(&h[f]);
    for (int f = 0; f < mapped; f++) file_unmap(&mf[f]);
    free(mf), free(h), free(lo), free(hi), free(states);
    return rc;
}
