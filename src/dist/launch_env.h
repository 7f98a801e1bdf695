/* launch_env.h — who this process is in a multi-process job, read from the
 * launcher's environment variables: torchrun, Open MPI's mpirun, Slurm's srun,
 * or none (a world of one).
 *
 * Precedence when several launchers' variables are present (each one's
 * variables are authoritative only when that launcher started this process):
 *   1. torchrun: RANK / WORLD_SIZE. torchrun's workers set them per process;
 *      when torchrun itself runs under srun or mpirun, the SLURM_* / OMPI_*
 *      variables describe the torchrun agent (one per node), not the worker.
 *   2. Open MPI: OMPI_COMM_WORLD_RANK / SIZE. Only mpirun (its daemons) sets
 *      them, per process. An mpirun inside a Slurm allocation inherits the
 *      allocation's SLURM_* (SLURM_PROCID=0 in every process), so Slurm's
 *      variables are wrong there and Open MPI's are right.
 *   3. Slurm: SLURM_PROCID / SLURM_NTASKS, set per task by srun (also when
 *      srun starts an MPI program directly, where no OMPI_* variables exist).
 *   4. none: world size 1.
 * Inconsistent or partial variables are an error naming them and their values.
 *
 * This file reads variables; it opens no socket, starts no process and does not
 * choose a communicator (comm.h does). */
#ifndef COLT_DIST_LAUNCH_ENV_H
#define COLT_DIST_LAUNCH_ENV_H

#include <stdbool.h>

typedef enum {
    LAUNCHER_NONE,
    LAUNCHER_TORCHRUN,
    LAUNCHER_OPENMPI,
    LAUNCHER_SLURM,
} Launcher;

#define LAUNCH_HOST_LEN 256

typedef struct LaunchEnv {
    Launcher launcher;
    int rank;             /* global rank, 0 .. world_size-1 */
    int world_size;
    int local_rank;       /* rank among the processes on this node */
    int local_world_size; /* processes on this node */
    int node_rank;        /* index of this node; -1 where the launcher does not say (Open MPI) */
    /* Rendezvous address: MASTER_ADDR / MASTER_PORT when set; under Slurm without
     * them, the first host of SLURM_JOB_NODELIST and a port derived from the job id.
     * master_addr is "" and master_port 0 where nothing says (none, Open MPI). */
    char master_addr[LAUNCH_HOST_LEN];
    int master_port;
    /* torchrun: its agent already serves a c10d TCPStore on MASTER_PORT
     * (TORCHELASTIC_USE_AGENT_STORE=True); colt is then a client of that store. */
    bool torchrun_agent_store;
    int restart_count;    /* TORCHELASTIC_RESTART_COUNT (0 otherwise): fresh store keys per restart */
    char run_id[64];      /* TORCHELASTIC_RUN_ID or SLURM_JOB_ID, "" if none */
    /* COLT_STORE_PORT: host colt's own store on this port of master_addr (rank 0)
     * even under torchrun; 0 if unset. */
    int store_port;
} LaunchEnv;

/* Returns the value of an environment variable, or NULL if unset. */
typedef const char *(*EnvLookup)(const char *name, void *ctx);

/* Fills *out from the variables that lookup(name, ctx) returns. Returns COLT_OK,
 * or COLT_ERR with err naming the offending variables and their values. */
int launch_env_read(LaunchEnv *out, EnvLookup lookup, void *ctx, char *err);

/* launch_env_read over this process's environment (getenv). */
int launch_env_from_process(LaunchEnv *out, char *err);

/* An EnvLookup over a NULL-terminated array of "NAME=value" strings (ctx is the
 * array), so tests describe environments without setenv. */
const char *launch_env_lookup_envp(const char *name, void *ctx);

/* "torchrun", "mpirun (Open MPI)", "srun (Slurm)" or "none". */
const char *launcher_name(Launcher launcher);

/* Parses a Slurm host list ("node[01-04,07]", "a,b", "gpu-[1-2]", "r[1-2]-n[3-4]")
 * and writes its first host name to out (size out_len). COLT_OK or COLT_ERR. */
int slurm_first_host(char *out, int out_len, const char *nodelist, char *err);

/* Expands a Slurm tasks-per-node list ("4", "2(x3),1") and returns the entry for
 * node index `node` in *tasks, and the sum over all entries in *total. */
int slurm_tasks_on_node(int *tasks, int *total, const char *list, int node, char *err);

#endif
