/* mesh.c — the launch's world, groups and backend, opened once (mesh.h). */
#include "parallel/mesh.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/cpu_threads.h"
#include "core/error.h"
#include "core/log.h"

int mesh_check_tensor_parallel_size(int tensor_parallel_size, const LaunchEnv *env, bool one_group, char *err) {
    int tp = tensor_parallel_size, world = env->world_size;
    if (tp < 1) return errorf(err, "tensor_parallel_size %d must be >= 1", tp);
    if (one_group && world != tp)
        return world == 1 ? errorf(err, "--tensor_parallel_size > 1 runs one process per part: start it with mpirun "
                                        "-np N (or torchrun --nproc_per_node N)")
                          : errorf(err, "under a launcher --tensor_parallel_size (%d) must be equal to the number of "
                                        "processes (%d)",
                                   tp, world);
    if (world == 1 && tp > 1)
        return errorf(err, "tensor_parallel_size %d runs one process per part: start %d (or a multiple) with mpirun "
                           "-np or torchrun --nproc_per_node",
                      tp, tp);
    if (world % tp != 0)
        return errorf(err, "tensor_parallel_size %d does not divide the number of ranks (%d)", tp, world);
    return COLT_OK;
}

int mesh_choose_device(int *device, const MeshOptions *o, const LaunchEnv *env, char *err) {
    *device = 0;
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    if (o->device && strcmp(o->device, "cpu") == 0) return COLT_OK; /* CPU ranks, on purpose */
    int n_gpus = backend_gpu_count();
    if (o->share_gpus && !o->devices) {
        *device = n_gpus > 0 ? env->local_rank % n_gpus : 0;
        return COLT_OK;
    }
    if (n_gpus == 0) {
        if ((!o->device || strcmp(o->device, "auto") == 0) && env->world_size > 1)
            return errorf(err, "no GPU is visible to this process (CUDA_VISIBLE_DEVICES=%s) but %d processes were "
                               "launched: pass --device cpu to run CPU ranks on purpose",
                          cvd ? cvd : "unset", env->world_size);
        return COLT_OK; /* auto: the CPU; cuda: backend_open says there is no GPU */
    }
    if (o->devices) {
        if (env->local_rank >= o->n_devices)
            return errorf(err, "local rank %d has no entry in devices (%d listed for %d processes on this node)",
                          env->local_rank, o->n_devices, env->local_world_size);
        *device = o->devices[env->local_rank];
        if (*device >= n_gpus)
            return errorf(err, "devices[%d] is GPU %d, but this process sees %d (CUDA_VISIBLE_DEVICES=%s)",
                          env->local_rank, *device, n_gpus, cvd ? cvd : "unset");
        return COLT_OK;
    }
    if (env->local_rank >= n_gpus)
        return errorf(err, "local rank %d of %d on this node has no GPU of its own: %d visible (CUDA_VISIBLE_DEVICES=%s); "
                           "start at most %d processes per node, or list devices to share GPUs on purpose",
                      env->local_rank, env->local_world_size, n_gpus, cvd ? cvd : "unset", n_gpus);
    *device = env->local_rank;
    return COLT_OK;
}

int mesh_check_visible_devices(Comm *group, int rank, char *err) {
    int size = group ? comm_world_size(group) : 1;
    if (size == 1) return COLT_OK;
    typedef struct {
        char host[64], visible[192];
    } Seen;
    Seen mine;
    memset(&mine, 0, sizeof mine);
    gethostname(mine.host, sizeof mine.host - 1);
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    snprintf(mine.visible, sizeof mine.visible, "%s", cvd ? cvd : "(unset)");
    Seen *all = xcalloc((size_t)size, sizeof(Seen));
    int rc = comm_all_gather(group, all, &mine, sizeof mine, COMM_BYTE, NULL, err);
    for (int r = 0; rc == 0 && r < size; r++)
        if (strcmp(all[r].host, mine.host) == 0 && strcmp(all[r].visible, mine.visible) != 0)
            rc = errorf(err, "CUDA_VISIBLE_DEVICES differs between ranks on host %s: rank %d has %s, rank %d has %s",
                        mine.host, r, all[r].visible, rank, mine.visible);
    free(all);
    return rc;
}

int mesh_ranks_own_devices(bool *own, char *why, size_t why_size, Comm *group, const Backend *be, char *err) {
    *own = false;
    if (why_size) why[0] = 0;
    if (!be->nccl_capable) return COLT_OK;
    int size = group ? comm_world_size(group) : 1;
    /* A device is named by its host and the id the backend gives it (a PCI
     * bus id: the same card in every process, whatever CUDA_VISIBLE_DEVICES). */
    typedef struct {
        char host[64], id[32];
    } Card;
    Card mine;
    memset(&mine, 0, sizeof mine);
    gethostname(mine.host, sizeof mine.host - 1);
    backend_device_id(be, mine.id, sizeof mine.id);
    if (size == 1) {
        *own = true;
        return COLT_OK;
    }
    Card *all = xcalloc((size_t)size, sizeof(Card));
    if (comm_all_gather(group, all, &mine, sizeof mine, COMM_BYTE, NULL, err) != 0) {
        free(all);
        return COLT_ERR;
    }
    int shared_a = -1, shared_b = -1;
    for (int a = 0; a < size && shared_a < 0; a++)
        for (int b = a + 1; b < size && shared_a < 0; b++)
            if (!strcmp(all[a].host, all[b].host) && !strcmp(all[a].id, all[b].id)) shared_a = a, shared_b = b;
    if (shared_a >= 0) snprintf(why, why_size, "ranks %d and %d share GPU %s", shared_a, shared_b, all[shared_a].id);
    *own = shared_a < 0;
    free(all);
    return COLT_OK;
}

int mesh_open_world(Mesh *m, const LaunchEnv *env, const MeshOptions *o, char *err) {
    memset(m, 0, sizeof *m);
    m->env = *env;
    snprintf(m->collectives, sizeof m->collectives, "through the host");
    if (mesh_check_tensor_parallel_size(o->tensor_parallel_size, env, o->one_group, err) != 0) return COLT_ERR;
    log_set_rank(env->rank);
    /* A world of one: the groups say so (sizes 1, no communicators). */
    if (env->world_size == 1) return tp_group_open(&m->groups, NULL, o->tensor_parallel_size, NULL, err);
    /* Host buffers: what the world carries itself (agreements, the host
     * path of the hooks) is staged through the host, so a CPU transport
     * serves GPU ranks too. */
    CommOptions co = {.kind = COMM_AUTO, .gpu = false, .cuda_device = -1, .timeout_s = o->timeout_s};
    if (comm_open(&m->world, env, &co, err) != 0) return COLT_ERR;
    return tp_group_open(&m->groups, m->world, o->tensor_parallel_size, NULL, err);
}

int mesh_open_device(Mesh *m, const MeshOptions *o, char *err) {
    int device = 0;
    if (mesh_check_visible_devices(m->world, m->env.rank, err) != 0 ||
        mesh_choose_device(&device, o, &m->env, err) != 0)
        return COLT_ERR;
    m->be = backend_open(o->device, device, err);
    if (!m->be) return COLT_ERR;
    /* Ranks on one host divide its cores: each computes on its share. */
    m->host_threads = cpu_threads_for_rank(m->env.local_rank, m->env.local_world_size, &m->host_threads_why);
    if (m->be->set_threads) m->be->set_threads(m->be, m->host_threads);
    m->groups.be = m->be;
    if (m->world && tp_group_use_nccl(&m->groups, &m->env, m->world, m->be, o->timeout_s, m->collectives,
                                      sizeof m->collectives, err) != 0)
        return COLT_ERR;
    return COLT_OK;
}

int mesh_open(Mesh *m, const LaunchEnv *env, const MeshOptions *o, char *err) {
    if (mesh_open_world(m, env, o, err) != 0) return COLT_ERR;
    return mesh_open_device(m, o, err);
}

const TensorParallel *mesh_tensor_parallel(Mesh *m, TensorParallel *hooks) {
    if (!m->world || m->groups.tensor_parallel_size <= 1) return NULL;
    *hooks = tp_group_hooks(&m->groups);
    return hooks;
}

void mesh_abort(Mesh *m, const char *reason) {
    if (m->world) comm_abort(m->world, reason);
}

void mesh_close(Mesh *m) {
    tp_group_close(&m->groups); /* its NCCL communicators before the device's backend */
    backend_close(m->be);
    if (m->world) comm_close(m->world);
    memset(m, 0, sizeof *m);
}
