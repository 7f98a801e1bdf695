/* weight_sync.c — see weight_sync.h. */
#include "parallel/weight_sync.h"

#include "dist/store.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "model/lora.h"
#include "model/model_train.h"

/* What a push carries (FP_SECTIONS, the trainer's choice): the weights'
 * arena, and the adapters' when LoRA adapters are attached. */
enum { SECTION_WEIGHTS = 1, SECTION_ADAPTERS = 2 };

/* What both sides' layouts must agree on, in this order (FP_SECTIONS aside:
 * only the trainer's counts, it tells the servers what follows). The LoRA
 * fields are 0 without adapters. */
enum { FP_BYTES, FP_PARAMS, FP_NAMES, FP_DTYPE, FP_LORA_BYTES, FP_LORA_NAMES, FP_LORA_SCALING, FP_SECTIONS, FP_COUNT };
#define FP_COMPARED FP_SECTIONS
static const char *const FP_WHAT[FP_COMPARED] = {
    "weight bytes", "tensor count", "tensor names and sizes", "storage dtype", "LoRA adapter bytes",
    "LoRA adapters (rank, target modules)", "LoRA scaling (lora_alpha, use_rslora)"};

struct WeightSync {
    Store *store; /* the group's rendezvous (rank 0 serves it), kept while comm lives */
    Comm *comm;
    const Backend *be;
    bool nccl;          /* buffers are device memory */
    int root;           /* the trainer: the last rank */
    size_t bucket_bytes;
    void *host_bucket;  /* Gloo: [bucket_bytes] pinned host staging */
    void *device_small; /* NCCL: [FP_COUNT + 1] int64 for the fingerprint exchange */
    void *device_bucket; /* a tensor-parallel part: [bucket_bytes] device staging (over Gloo after host_bucket) */
    bool weights_sent;  /* the trainer: the weights' arena went over once (the base under LoRA) */
    size_t last_bytes;
    double last_seconds;
};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

/* The options checked; *kind: the communicator the group uses. */
static int check_options(const WeightSyncOptions *opt, CommKind *kind, char *err) {
    if (opt->world_size < 2 || opt->rank < 0 || opt->rank >= opt->world_size)
        return errorf(err, "weight sync: rank %d of %d (the group needs a server rank and the trainer)", opt->rank,
                      opt->world_size);
    if (!opt->host || !opt->host[0] || opt->port <= 0 || opt->port > 65535)
        return errorf(err, "weight sync: bad group address '%s:%d'", opt->host ? opt->host : "", opt->port);
    bool gpu = opt->be->nccl_capable;
    *kind = opt->kind;
    if (*kind == COMM_AUTO) *kind = gpu && opt->use_nccl ? COMM_NCCL : COMM_GLOO;
    if (!comm_built(*kind))
        return errorf(err, "weight sync: this build has no %s (the trainer-to-server channel needs it)",
                      comm_kind_name(*kind));
    return COLT_OK;
}

int weight_sync_meet(Store **out, const WeightSyncOptions *opt, char *err) {
    *out = NULL;
    CommKind kind;
    if (check_options(opt, &kind, err) != 0) return COLT_ERR;
    /* NCCL or Gloo open their own connections only once every member has shown the token here */
    StoreOptions so = {.host = opt->host, .port = opt->port, .serve = opt->rank == 0, .rank = opt->rank,
                       .world_size = opt->world_size, .timeout_s = opt->timeout_s, .key_prefix = "/colt/weight-sync/",
                       .bind_host = opt->bind_host, .token = opt->token, .cancel = opt->cancel};
    Store *store = NULL;
    if (store_open(&store, &so, err) != 0) return error_prefix(err, "weight sync");
    if (store_barrier(store, "joined", err) != 0) {
        store_close(store);
        return error_prefix(err, "weight sync: waiting for every member");
    }
    *out = store;
    return COLT_OK;
}

int weight_sync_open(WeightSync **out, const WeightSyncOptions *opt, char *err) {
    Store *store = NULL;
    *out = NULL;
    if (weight_sync_meet(&store, opt, err) != 0) return COLT_ERR;
    return weight_sync_open_met(out, store, opt, err);
}

int weight_sync_open_met(WeightSync **out, Store *store, const WeightSyncOptions *opt, char *err) {
    *out = NULL;
    CommKind kind;
    if (check_options(opt, &kind, err) != 0) {
        store_close(store);
        return COLT_ERR;
    }
    LaunchEnv env = {.launcher = LAUNCHER_NONE, .rank = opt->rank, .world_size = opt->world_size,
                     .local_rank = opt->rank, .local_world_size = opt->world_size, .node_rank = -1,
                     .master_port = opt->port};
    snprintf(env.master_addr, sizeof env.master_addr, "%s", opt->host);
    snprintf(env.run_id, sizeof env.run_id, "weight-sync");
    CommOptions co = {.kind = kind, .gpu = kind == COMM_NCCL, .cuda_device = opt->cuda_device,
                      .timeout_s = opt->timeout_s, .store = store};
    Comm *comm = NULL;
    if (comm_open(&comm, &env, &co, err) != 0) {
        store_close(store);
        return COLT_ERR;
    }
    WeightSync *w = xcalloc(1, sizeof(WeightSync));
    w->store = store;
    w->comm = comm;
    w->be = opt->be;
    w->nccl = kind == COMM_NCCL;
    w->root = opt->world_size - 1;
    w->bucket_bytes = opt->bucket_bytes ? opt->bucket_bytes : WEIGHT_SYNC_BUCKET_BYTES;
    if (w->bucket_bytes >= 16) w->bucket_bytes &= ~(size_t)7; /* whole elements per bucket (a TP part cuts them on the device) */
    if (w->nccl) {
        /* exchange() sends FP_COUNT + 1 int64s: two f32 slots each */
        w->device_small = opt->be->alloc_f32(opt->be, 2 * (FP_COUNT + 1));
    } else {
        w->host_bucket = opt->be->alloc_host(opt->be, w->bucket_bytes);
        if (!w->host_bucket) {
            weight_sync_close(w);
            return errorf(err, "weight sync: cannot allocate %zu bytes of host memory for the buckets",
                          w->bucket_bytes);
        }
    }
    *out = w;
    return COLT_OK;
}

/* FNV-1a over tensors' names and sizes (kept positive: it travels as an int64). */
static int64_t hash_tensors(const Model *m, int count, ModelParam (*get)(const Model *, int)) {
    uint64_t h = 1469598103934665603ull;
    for (int i = 0; i < count; i++) {
        ModelParam p = get(m, i);
        for (const char *c = p.name; *c; c++) h = (h ^ (uint8_t)*c) * 1099511628211ull;
        h = (h ^ (uint64_t)p.numel) * 1099511628211ull;
    }
    return (int64_t)(h >> 1);
}

/* The layout's fingerprint (FP_*): a whole model's weights arena, and its
 * adapters' when attached. A tensor-parallel part (a server rank; sending
 * one is refused) answers for the whole model it is a part of: the whole
 * tensors' names and sizes, the whole arena's bytes — what the trainer's
 * whole model has. */
static int fingerprint(const Model *m, bool sending, int64_t fp[FP_COUNT], char *err) {
    if (model_tensor_parallel_size(m) > 1 && sending)
        return errorf(err, "weight sync: a tensor-parallel part (tensor_parallel_size %d) cannot be sent; the "
                           "trainer needs the whole model",
                      model_tensor_parallel_size(m));
    if (model_tensor_parallel_size(m) > 1 && model_has_lora(m))
        return errorf(err, "weight sync: a tensor-parallel server (tensor_parallel_size %d) cannot take LoRA adapters "
                           "yet; serve with tensor_parallel_size 1 for a use_peft trainer",
                      model_tensor_parallel_size(m));
    size_t numel = 0;
    if (!model_weights_flat(m, &numel))
        return errorf(err, "weight sync: the weights are partitioned (zero_stage 3); gather them first");
    const Backend *be = model_backend(m);
    Model *whole = model_tensor_parallel_size(m) > 1 ? model_plan_shell(model_config(m), be, NULL, 1) : NULL;
    const Model *layout = whole ? whole : m;
    model_weights_flat(layout, &numel);
    fp[FP_BYTES] = (int64_t)(numel * dtype_size(be->storage));
    fp[FP_PARAMS] = model_weight_count(layout);
    fp[FP_NAMES] = hash_tensors(layout, model_weight_count(layout), model_weight);
    fp[FP_DTYPE] = be->storage;
    model_free(whole);
    if (model_has_lora(m)) {
        float scaling = lora_scaling(model_lora_config(m));
        uint32_t bits;
        memcpy(&bits, &scaling, sizeof bits);
        fp[FP_LORA_BYTES] = (int64_t)model_lora_bytes(m);
        fp[FP_LORA_NAMES] = hash_tensors(m, model_param_count(m), model_param); /* the adapters, while attached */
        fp[FP_LORA_SCALING] = bits;
    }
    return COLT_OK;
}

/* vals[n] int64 through the group: broadcast from the root (sum: false) or summed (true). */
static int exchange(WeightSync *w, int64_t *vals, size_t n, bool sum, char *err) {
    void *buf = vals, *stream = NULL;
    if (w->nccl) {
        buf = w->device_small;
        stream = backend_compute_stream(w->be);
        w->be->copy_from_host(w->be, buf, vals, n * sizeof(int64_t));
    }
    int rc = sum ? comm_all_reduce(w->comm, buf, n, COMM_INT64, stream, err)
                 : comm_broadcast(w->comm, buf, n, COMM_INT64, w->root, stream, err);
    if (rc == 0 && w->nccl) rc = comm_wait(w->comm, stream, err);
    if (rc == 0 && w->nccl) w->be->copy_to_host(w->be, vals, buf, n * sizeof(int64_t));
    return rc;
}

/* A fingerprint field as a message shows it: the scaling as the number it is. */
static void field_text(char *out, size_t size, int k, int64_t v) {
    if (k == FP_LORA_SCALING && v != 0) {
        uint32_t bits = (uint32_t)v;
        float scaling;
        memcpy(&scaling, &bits, sizeof scaling);
        snprintf(out, size, "%g", (double)scaling);
    } else {
        snprintf(out, size, "%lld", (long long)v);
    }
}

/* Every member learns whether the layouts agree: the trainer's fingerprint
 * goes out, each server rank counts the fields it disagrees on, the counts
 * are summed. A member whose own model is unusable (mine_ok false) counts as
 * disagreeing on everything, so the others fail too instead of waiting.
 * *sections: what the trainer's push carries (SECTION_*). */
static int agree(WeightSync *w, const int64_t mine[FP_COUNT], bool mine_ok, int64_t *sections, char *err) {
    int64_t theirs[FP_COUNT + 1] = {0};
    memcpy(theirs, mine, sizeof(int64_t) * FP_COUNT);
    theirs[FP_COUNT] = mine_ok;
    char own_err[ERR_LEN];
    if (exchange(w, theirs, FP_COUNT + 1, false, own_err) != 0) return errorf(err, "%s", own_err);
    *sections = theirs[FP_SECTIONS];
    int64_t differ[FP_COUNT + 1] = {0};
    bool root = comm_rank(w->comm) == w->root;
    for (int k = 0; k < FP_COMPARED && !root; k++) differ[k] = !mine_ok || !theirs[FP_COUNT] || mine[k] != theirs[k];
    differ[FP_COUNT] = !mine_ok; /* members that failed on their own */
    if (exchange(w, differ, FP_COUNT + 1, true, own_err) != 0) return errorf(err, "%s", own_err);
    if (!mine_ok) return COLT_ERR; /* err already says why */
    if (!theirs[FP_COUNT]) return errorf(err, "weight sync: the trainer could not send its weights (see its message)");
    for (int k = 0; k < FP_COMPARED && !root; k++)
        if (mine[k] != theirs[k]) {
            char a[40], b[40];
            field_text(a, sizeof a, k, theirs[k]);
            field_text(b, sizeof b, k, mine[k]);
            return errorf(err, "weight sync: the trainer's model has other %s than this server's (%s against %s)",
                          FP_WHAT[k], a, b);
        }
    if (differ[FP_COUNT] > 0)
        return errorf(err, "weight sync: %lld member%s of the group could not take part (see their messages)",
                      (long long)differ[FP_COUNT], differ[FP_COUNT] == 1 ? "" : "s");
    for (int k = 0; k < FP_COMPARED; k++)
        if (differ[k] > 0)
            return errorf(err, "weight sync: %lld server rank%s hold%s a model of other %s than the trainer's",
                          (long long)differ[k], differ[k] == 1 ? "" : "s", differ[k] == 1 ? "s" : "", FP_WHAT[k]);
    return COLT_OK;
}

/* The arena's bytes [0, bytes) broadcast from the root in buckets. */
static int broadcast_arena(WeightSync *w, void *arena, size_t bytes, char *err) {
    bool root = comm_rank(w->comm) == w->root;
    void *stream = w->nccl ? backend_compute_stream(w->be) : NULL;
    for (size_t off = 0; off < bytes; off += w->bucket_bytes) {
        size_t n = bytes - off < w->bucket_bytes ? bytes - off : w->bucket_bytes;
        char *part = (char *)arena + off;
        if (w->nccl) {
            if (comm_broadcast(w->comm, part, n, COMM_BYTE, w->root, stream, err) != 0) return COLT_ERR;
            continue;
        }
        if (root) w->be->copy_to_host(w->be, w->host_bucket, part, n);
        if (comm_broadcast(w->comm, w->host_bucket, n, COMM_BYTE, w->root, NULL, err) != 0) return COLT_ERR;
        if (!root) w->be->copy_from_host(w->be, part, w->host_bucket, n);
    }
    return w->nccl ? comm_wait(w->comm, stream, err) : COLT_OK;
}

/* A tensor-parallel part receives the whole arena the same way, bucket by
 * bucket into device memory (over Gloo: through the host bucket first), and
 * keeps its part of each tensor, cut on the device (model_part_receiver). */
static int receive_into_part(WeightSync *w, Model *m, size_t bytes, char *err) {
    size_t whole_bytes = 0;
    ModelPartReceiver *r = model_part_receiver_create(m, &whole_bytes);
    COLT_ASSERT(whole_bytes == bytes); /* the fingerprints agreed */
    void *stream = w->nccl ? backend_compute_stream(w->be) : NULL;
    if (!w->device_bucket) {
        size_t es = dtype_size(w->be->storage);
        w->device_bucket = w->be->alloc(w->be, (w->bucket_bytes + es - 1) / es);
    }
    int rc = COLT_OK;
    if (!w->device_bucket)
        rc = errorf(err, "weight sync: cannot allocate %zu bytes of device staging for a tensor-parallel part",
                    w->bucket_bytes);
    for (size_t off = 0; rc == 0 && off < bytes; off += w->bucket_bytes) {
        size_t n = bytes - off < w->bucket_bytes ? bytes - off : w->bucket_bytes;
        /* the same stream orders this bucket's arrival after the last one's cuts */
        if (w->nccl) {
            rc = comm_broadcast(w->comm, w->device_bucket, n, COMM_BYTE, w->root, stream, err);
        } else {
            rc = comm_broadcast(w->comm, w->host_bucket, n, COMM_BYTE, w->root, NULL, err);
            if (rc == 0) w->be->copy_from_host(w->be, w->device_bucket, w->host_bucket, n);
        }
        if (rc == 0) model_part_receiver_put(r, w->device_bucket, n);
    }
    if (rc == 0 && w->nccl) rc = comm_wait(w->comm, stream, err);
    if (rc == 0) COLT_ASSERT(model_part_receiver_done(r));
    model_part_receiver_free(r);
    return rc;
}

/* The trainer sends the weights' arena at its first push over the channel
 * and whenever no adapters are attached (then they are what trains), the
 * adapters' whenever they are: with LoRA every later push is the adapters
 * alone, the base being frozen. The servers learn which from FP_SECTIONS. */
static int transfer(WeightSync *w, const Model *m, bool sending, char *err) {
    if ((comm_rank(w->comm) == w->root) != sending)
        return errorf(err, "weight sync: rank %d %s, but the trainer (rank %d) sends and the server's ranks receive",
                      comm_rank(w->comm), sending ? "sends" : "receives", w->root);
    double t0 = now_s();
    int64_t fp[FP_COUNT] = {0};
    bool ok = fingerprint(m, sending, fp, err) == 0;
    if (sending && ok)
        fp[FP_SECTIONS] = (!w->weights_sent || !model_has_lora(m) ? SECTION_WEIGHTS : 0) |
                          (model_has_lora(m) ? SECTION_ADAPTERS : 0);
    int64_t sections = 0;
    if (agree(w, fp, ok, &sections, err) != 0) return COLT_ERR;
    size_t numel = 0, bytes = 0;
    if (sections & SECTION_WEIGHTS) {
        int rc = model_tensor_parallel_size(m) > 1 ? receive_into_part(w, (Model *)m, (size_t)fp[FP_BYTES], err)
                                       : broadcast_arena(w, model_weights_flat(m, &numel), (size_t)fp[FP_BYTES], err);
        if (rc != 0) return COLT_ERR;
        bytes += (size_t)fp[FP_BYTES];
        w->weights_sent = true;
    }
    if (sections & SECTION_ADAPTERS) {
        if (broadcast_arena(w, model_params_flat(m, &numel), (size_t)fp[FP_LORA_BYTES], err) != 0) return COLT_ERR;
        bytes += (size_t)fp[FP_LORA_BYTES];
    }
    w->last_bytes = bytes;
    w->last_seconds = now_s() - t0;
    return COLT_OK;
}

int weight_sync_send(WeightSync *w, const Model *m, char *err) { return transfer(w, m, true, err); }
int weight_sync_recv(WeightSync *w, Model *m, char *err) {
    int rc = transfer(w, m, false, err);
    /* even after a failed transfer: part of the arena may hold new values (in place: the same addresses) */
    model_weights_changed_in_place(m);
    return rc;
}

void weight_sync_last(const WeightSync *w, size_t *bytes, double *seconds) {
    *bytes = w->last_bytes;
    *seconds = w->last_seconds;
}

CommKind weight_sync_kind(const WeightSync *w) { return comm_kind(w->comm); }

void weight_sync_close(WeightSync *w) {
    if (!w) return;
    if (w->host_bucket) w->be->free_host(w->be, w->host_bucket);
    if (w->device_small) w->be->free(w->be, w->device_small);
    if (w->device_bucket) w->be->free(w->be, w->device_bucket);
    comm_close(w->comm);
    store_close(w->store);
    free(w);
}
