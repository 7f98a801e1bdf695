/* mesh.h — the parallel layout of one launch, made once: the world (the
 * launch's host communicator), the tensor- and data-parallel groups with
 * their NCCL variants (parallel/tp_group.h), and this rank's backend
 * instance on the device it was given. Megatron's initialize_model_parallel,
 * but an explicit object the caller holds and passes on; nothing is global.
 *
 * Also here, once: the launch-level check of tensor_parallel_size, the choice
 * of this rank's GPU, and the handshake "every rank has a GPU of its own"
 * that decides whether collectives may go over NCCL (NCCL refuses two ranks
 * on one device).
 *
 * Not here: the transport (dist/comm.h), the model's collectives
 * (parallel/tp_group.c), the gradient path and ZeRO (parallel/train_dist.h),
 * whether the model can be cut tensor_parallel_size ways (model_tp_check). */
#ifndef COLT_PARALLEL_MESH_H
#define COLT_PARALLEL_MESH_H

#include <stdbool.h>
#include <stddef.h>

#include "backend/backend.h"
#include "dist/comm.h"
#include "dist/launch_env.h"
#include "parallel/tp_group.h"

typedef struct MeshOptions {
    const char *device;       /* --device: cpu, cuda, cuda_f32 or auto */
    const int *devices;       /* the GPU of each local rank (colt train's `devices`), or NULL */
    int n_devices;
    /* Without devices: local rank r takes GPU r modulo the GPUs visible
     * (generate, serve), instead of refusing a rank without a GPU of its own
     * (train, whose ranks must not silently share a card). */
    bool share_gpus;
    int tensor_parallel_size; /* processes the model is cut across */
    /* The launch is exactly one tensor-parallel group (generate, serve);
     * else the groups repeat across the world, data parallel between them. */
    bool one_group;
    double timeout_s;         /* bound on every collective wait; 0: COMM_DEFAULT_TIMEOUT_S */
} MeshOptions;

typedef struct Mesh {
    LaunchEnv env;
    Comm *world;      /* the launch over the host transport (NULL: a world of one) */
    TpGroup groups;   /* tensor- and data-parallel groups, over NCCL where they can be */
    Backend *be;      /* this rank's instance */
    int host_threads; /* the threads this rank computes with on the host (its share of the cores, core/cpu_threads.h) */
    const char *host_threads_why; /* where that number came from, for the log */
    char collectives[128]; /* how the tensor-parallel collectives run, for the log */
} Mesh;

/* The launch-level check of tensor_parallel_size, the one place it is made:
 * at least 1, one process per part, and (one_group) the world exactly one
 * group, else a divisor of the world size. */
int mesh_check_tensor_parallel_size(int tensor_parallel_size, const LaunchEnv *env, bool one_group, char *err);

/* The GPU (an index among those this process sees) local rank
 * env->local_rank computes on, following o (devices, share_gpus); 0 for
 * --device cpu or when no GPU is visible. It touches no device. */
int mesh_choose_device(int *device, const MeshOptions *o, const LaunchEnv *env, char *err);

/* Ranks on one host must see the same GPUs, or "local rank r takes GPU r"
 * means different cards to different ranks. Collective over group (NULL or
 * size 1: nothing to compare); rank: this rank in it, for the message. */
int mesh_check_visible_devices(Comm *group, int rank, char *err);

/* The handshake (collective over group; NULL: a world of one): *own is true
 * when be can run NCCL (backend.h nccl_capable) and no two ranks of group
 * sit on one device. When two do, why says which ("ranks 0 and 1 share GPU
 * 0000:18:00.0"); else why is left empty. */
int mesh_ranks_own_devices(bool *own, char *why, size_t why_size, Comm *group, const Backend *be, char *err);

/* Opens the mesh (collective): checks tensor_parallel_size, opens the world
 * and its groups, the backend on this rank's device, and the groups' NCCL
 * variants when the handshake allows them. After an error the world stays
 * open so that the caller, having printed err, can stop the others with
 * mesh_abort; mesh_close frees what was opened either way. */
int mesh_open(Mesh *m, const LaunchEnv *env, const MeshOptions *o, char *err);
/* mesh_open in its two halves, for a caller with work between them (the
 * trainer agrees on errors over the world before it touches a device):
 * the world and its groups (m->be still NULL; a world of one gets groups of
 * size 1 and no communicator); then the visible-devices check, the backend
 * and the groups' NCCL variants. Both collective. */
int mesh_open_world(Mesh *m, const LaunchEnv *env, const MeshOptions *o, char *err);
int mesh_open_device(Mesh *m, const MeshOptions *o, char *err);
/* The model's hooks over the tensor-parallel group, or NULL without tensor parallelism. */
const TensorParallel *mesh_tensor_parallel(Mesh *m, TensorParallel *hooks);
/* Stops every rank (comm_abort) when there are others; returns when there are none. */
void mesh_abort(Mesh *m, const char *reason);
/* The groups' NCCL communicators before the backend, the backend before the world. */
void mesh_close(Mesh *m);

#endif
