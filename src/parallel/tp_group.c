/* tp_group.c — tensor- and data-parallel groups and the model's collectives
 * over them, through NCCL or the host (tp_group.h). */
#include "parallel/tp_group.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "parallel/mesh.h"

int tp_group_open(TpGroup *g, Comm *world, int tensor_parallel_size, const Backend *be, char *err) {
    memset(g, 0, sizeof *g);
    int rank = world ? comm_rank(world) : 0, size = world ? comm_world_size(world) : 1;
    if (tensor_parallel_size < 1 || size % tensor_parallel_size != 0)
        return errorf(err, "tensor_parallel_size %d does not divide the number of ranks (%d)", tensor_parallel_size, size);
    g->be = be;
    g->tensor_parallel_size = tensor_parallel_size;
    g->tensor_parallel_rank = rank % tensor_parallel_size;
    g->data_parallel_size = size / tensor_parallel_size;
    g->data_parallel_rank = rank / tensor_parallel_size;
    if (tensor_parallel_size > 1 && g->data_parallel_size == 1) {
        g->tp = world; /* one group: the world itself */
    } else if (tensor_parallel_size > 1 && comm_split(world, g->data_parallel_rank, g->tensor_parallel_rank, &g->tp, err) != 0) {
        return COLT_ERR;
    }
    g->owns_tp = tensor_parallel_size > 1 && g->data_parallel_size > 1;
    if (g->data_parallel_size > 1 && tensor_parallel_size > 1 && comm_split(world, g->tensor_parallel_rank, g->data_parallel_rank, &g->dp, err) != 0) {
        tp_group_close(g);
        return COLT_ERR;
    }
    return COLT_OK;
}

static float *staging(TpGroup *g, size_t n) {
    if (n > g->host_n) {
        free(g->host);
        g->host = xmalloc(n * sizeof(float));
        g->host_n = n;
    }
    return g->host;
}

static int host_all_reduce(void *ctx, void *x, size_t n, bool f32, char *err) {
    TpGroup *g = ctx;
    const Backend *be = g->be;
    float *h = staging(g, n);
    (f32 ? be->download_f32 : be->download)(be, h, x, n);
    if (comm_all_reduce(g->tp, h, n, COMM_FLOAT32, NULL, err) != 0) return COLT_ERR;
    (f32 ? be->upload_f32 : be->upload)(be, x, h, n);
    return COLT_OK;
}

static int host_all_gather(void *ctx, void *out, const void *in, size_t n, bool f32, char *err) {
    TpGroup *g = ctx;
    const Backend *be = g->be;
    size_t total = n * (size_t)g->tensor_parallel_size;
    float *h = staging(g, total + n);
    (f32 ? be->download_f32 : be->download)(be, h + total, in, n);
    if (comm_all_gather(g->tp, h, h + total, n, COMM_FLOAT32, NULL, err) != 0) return COLT_ERR;
    (f32 ? be->upload_f32 : be->upload)(be, out, h, total);
    return COLT_OK;
}

/* NCCL: in place on the device, ordered on the compute stream with the ops. */
static CommDtype elements(const TpGroup *g, bool f32) {
    return f32 || g->be->storage == DTYPE_F32 ? COMM_FLOAT32 : COMM_BFLOAT16;
}

static int nccl_all_reduce(void *ctx, void *x, size_t n, bool f32, char *err) {
    TpGroup *g = ctx;
    return comm_all_reduce(g->nccl, x, n, elements(g, f32), backend_compute_stream(g->be), err);
}

static int nccl_all_gather(void *ctx, void *out, const void *in, size_t n, bool f32, char *err) {
    TpGroup *g = ctx;
    return comm_all_gather(g->nccl, out, in, n, elements(g, f32), backend_compute_stream(g->be), err);
}

int tp_group_use_nccl(TpGroup *g, const LaunchEnv *env, Comm *world, const Backend *be, double timeout_s, char *how,
                      size_t how_size, char *err) {
    g->be = be;
    snprintf(how, how_size, "through the host");
    if (g->tensor_parallel_size <= 1 || !be->nccl_capable || !comm_built(COMM_NCCL)) return COLT_OK;
    /* NCCL refuses two ranks on one GPU: the host path stays for those. */
    bool own = false;
    char why[128];
    if (mesh_ranks_own_devices(&own, why, sizeof why, world, be, err) != 0) return COLT_ERR;
    if (!own) return COLT_OK;
    CommOptions co = {.kind = COMM_NCCL, .gpu = true, .cuda_device = be->device, .timeout_s = timeout_s,
                      .store = comm_store(world)};
    Comm *launch = NULL;
    if (comm_open(&launch, env, &co, err) != 0) return COLT_ERR;
    if (g->data_parallel_size == 1) {
        g->nccl = launch;
    } else {
        g->nccl_world = launch;
        if (comm_split(launch, g->data_parallel_rank, g->tensor_parallel_rank, &g->nccl, err) != 0) return COLT_ERR;
    }
    snprintf(how, how_size, "over NCCL, bf16 sums on the compute stream");
    return COLT_OK;
}

int tp_group_data_parallel_nccl(TpGroup *g, Comm **out, char *err) {
    *out = NULL;
    if (!g->nccl_world) return COLT_OK;
    return comm_split(g->nccl_world, g->tensor_parallel_rank, g->data_parallel_rank, out, err);
}

TensorParallel tp_group_hooks(TpGroup *g) {
    if (g->nccl)
        return (TensorParallel){.rank = g->tensor_parallel_rank, .tensor_parallel_size = g->tensor_parallel_size, .all_reduce = nccl_all_reduce,
                                .all_gather = nccl_all_gather, .graph_safe = true, .ctx = g};
    return (TensorParallel){.rank = g->tensor_parallel_rank, .tensor_parallel_size = g->tensor_parallel_size, .all_reduce = host_all_reduce,
                            .all_gather = host_all_gather, .graph_safe = false, .ctx = g};
}

void tp_group_close(TpGroup *g) {
    if (g->nccl) comm_close(g->nccl);
    if (g->nccl_world) comm_close(g->nccl_world);
    if (g->tp && g->owns_tp) comm_close(g->tp);
    if (g->dp) comm_close(g->dp);
    free(g->host);
    memset(g, 0, sizeof *g);
}
