/* tp_group.h — the groups of tensor parallelism over a launch: consecutive
 * ranks form a tensor-parallel group (tensor_parallel_size 2 on 8 ranks:
 * [0,1] [2,3] [4,5] [6,7]) and the ranks at the same place in every group a
 * data-parallel one ([0,2,4,6] [1,3,5,7]), as vLLM and Megatron lay them out;
 * and the model's collectives (model.h TensorParallel) over the group.
 *
 * The collectives go over NCCL on the backend's compute stream when the
 * group's ranks are on distinct GPUs (tp_group_use_nccl; bf16 sums like
 * Megatron's; graph-safe), else through the host: each downloads the buffer,
 * runs the fp32 collective on the group's communicator and uploads the result
 * — what CPU ranks need (MPI) and what GPU ranks sharing one GPU get (NCCL
 * refuses two ranks on one device); those are not graph-safe. */
#ifndef COLT_PARALLEL_TP_GROUP_H
#define COLT_PARALLEL_TP_GROUP_H

#include "backend/backend.h"
#include "dist/comm.h"
#include "model/model.h"

typedef struct TpGroup {
    int tensor_parallel_size, tensor_parallel_rank; /* the group's size, this rank in it */
    int data_parallel_size, data_parallel_rank;     /* the data-parallel groups' */
    Comm *tp;   /* this rank's tensor-parallel group (NULL when tensor_parallel_size is 1; the
                 * world itself when there is one group) */
    bool owns_tp;
    Comm *dp;   /* the data-parallel group (NULL when data_parallel_size is 1, or when
                 * tensor_parallel_size is 1: then it is the world itself) */
    const Backend *be;
    Comm *nccl;           /* the group over NCCL (tp_group_use_nccl), or NULL: through the host */
    Comm *nccl_world;     /* the launch over NCCL, split into nccl (several groups), or NULL */
    float *host;          /* staging for the collectives, grown on demand */
    size_t host_n;
} TpGroup;

/* Splits world (collective; NULL: a world of one) into groups of tensor_parallel_size
 * consecutive ranks; an error when tensor_parallel_size does not divide the world size.
 * world must outlive g. */
int tp_group_open(TpGroup *g, Comm *world, int tensor_parallel_size, const Backend *be, char *err);
/* After the backend opened (collective over world): the group's collectives
 * over NCCL when be is a CUDA instance and every rank of the launch has a GPU
 * of its own (an NCCL communicator over the launch, split into the groups
 * when there are several); else nothing changes. how: a few words for the log. */
int tp_group_use_nccl(TpGroup *g, const LaunchEnv *env, Comm *world, const Backend *be, double timeout_s, char *how,
                      size_t how_size, char *err);
/* After tp_group_use_nccl set up several groups over NCCL: the data-parallel
 * group over NCCL (the ranks at the same place in every group), the caller's
 * to close; NULL (and COLT_OK) when the groups are not over NCCL. Collective. */
int tp_group_data_parallel_nccl(TpGroup *g, Comm **out, char *err);
/* The model's hooks over g (which must outlive the model). */
TensorParallel tp_group_hooks(TpGroup *g);
void tp_group_close(TpGroup *g);

#endif
