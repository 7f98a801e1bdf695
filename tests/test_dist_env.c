/* test_dist_env.c — launch_env_read over a table of environments: each launcher
 * (torchrun, Open MPI, Slurm, none), multi-node layouts, the precedence cases
 * (torchrun over Open MPI over Slurm), and every error, whose exact text is
 * compared. Also the Slurm host-list and tasks-per-node parsers on their own.
 * Environments are arrays of "NAME=value"; nothing calls setenv. */
#include <stdio.h>
#include <string.h>

#include "core/error.h"
#include "dist/launch_env.h"
#include "harness.h"


#define MAX_VARS 24
typedef struct {
    const char *name;
    const char *env[MAX_VARS];
    const char *error; /* NULL: must parse; else the exact error text */
    Launcher launcher;
    int rank, world, local_rank, local_world, node_rank;
    const char *addr;
    int port;
    int agent_store, restart, store_port;
} Case;

#define TORCHRUN_2x4(rank, local, group)                                                          \
    "RANK=" #rank, "WORLD_SIZE=8", "LOCAL_RANK=" #local, "LOCAL_WORLD_SIZE=4", "GROUP_RANK=" #group, \
        "GROUP_WORLD_SIZE=2", "MASTER_ADDR=node01", "MASTER_PORT=29500"

static const Case CASES[] = {
    /* ---- none */
    {"empty environment", {NULL}, NULL, LAUNCHER_NONE, 0, 1, 0, 1, 0, "", 0, 0, 0, 0},
    {"none with MASTER_* kept", {"MASTER_ADDR=h", "MASTER_PORT=1234"}, NULL, LAUNCHER_NONE, 0, 1, 0, 1, 0, "h", 1234, 0, 0, 0},
    {"SLURM_NTASKS alone is an sbatch script, not a launch", {"SLURM_NTASKS=8", "SLURM_JOB_ID=7"}, NULL,
     LAUNCHER_NONE, 0, 1, 0, 1, 0, "", 0, 0, 0, 0},
    {"COLT_STORE_PORT", {"COLT_STORE_PORT=31000"}, NULL, LAUNCHER_NONE, 0, 1, 0, 1, 0, "", 0, 0, 0, 31000},
    /* accelerate launch's simple launcher (prepare_simple_launcher_cmd_env): one process, no rank; MASTER_* only
     * when several were asked for */
    {"accelerate launch --cpu, one process", {"ACCELERATE_USE_CPU=True", "ACCELERATE_MIXED_PRECISION=no",
      "OMP_NUM_THREADS=2"}, NULL, LAUNCHER_NONE, 0, 1, 0, 1, 0, "", 0, 0, 0, 0},
    {"accelerate launch --cpu --num_processes 2", {"ACCELERATE_USE_CPU=True", "MASTER_ADDR=127.0.0.1",
      "MASTER_PORT=29500"}, .error = "launch environment: accelerate launch started one process for a launch of several "
      "(its --cpu mode starts CPU processes only through mpirun): add --mpirun_hostfile FILE to accelerate launch, or use "
      "colt train --nproc_per_node N, or mpirun -np N"},
    {"accelerate launch --mpirun_hostfile: Open MPI's ranks", {"ACCELERATE_USE_CPU=True", "MASTER_ADDR=127.0.0.1",
      "MASTER_PORT=29500", "OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_RANK=1",
      "OMPI_COMM_WORLD_LOCAL_SIZE=2"}, NULL, LAUNCHER_OPENMPI, 1, 2, 1, 2, -1, "127.0.0.1", 29500, 0, 0, 0},

    /* ---- torchrun */
    {"torchrun one node", {"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2", "GROUP_RANK=0",
      "MASTER_ADDR=127.0.0.1", "MASTER_PORT=29500", "TORCHELASTIC_USE_AGENT_STORE=True", "TORCHELASTIC_RESTART_COUNT=0",
      "TORCHELASTIC_RUN_ID=none"}, NULL, LAUNCHER_TORCHRUN, 1, 2, 1, 2, 0, "127.0.0.1", 29500, 1, 0, 0},
    {"torchrun two nodes, rank 6", {TORCHRUN_2x4(6, 2, 1), "TORCHELASTIC_USE_AGENT_STORE=False",
      "TORCHELASTIC_RESTART_COUNT=3"}, NULL, LAUNCHER_TORCHRUN, 6, 8, 2, 4, 1, "node01", 29500, 0, 3, 0},
    {"torchrun two nodes, rank 0", {TORCHRUN_2x4(0, 0, 0)}, NULL, LAUNCHER_TORCHRUN, 0, 8, 0, 4, 0, "node01", 29500, 0, 0, 0},
    {"by hand, no GROUP_RANK: node from rank", {"RANK=5", "WORLD_SIZE=8", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=4",
      "MASTER_ADDR=a", "MASTER_PORT=1"}, NULL, LAUNCHER_TORCHRUN, 5, 8, 1, 4, 1, "a", 1, 0, 0, 0},
    {"by hand, world of one needs nothing else", {"RANK=0", "WORLD_SIZE=1"}, NULL, LAUNCHER_TORCHRUN, 0, 1, 0, 1, 0, "", 0, 0, 0, 0},
    {"uneven nodes by hand: node unknown", {"RANK=3", "WORLD_SIZE=5", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2",
      "MASTER_ADDR=a", "MASTER_PORT=65535"}, NULL, LAUNCHER_TORCHRUN, 3, 5, 0, 2, -1, "a", 65535, 0, 0, 0},

    /* ---- precedence */
    {"torchrun under srun: torchrun wins", {TORCHRUN_2x4(5, 1, 1), "SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_LOCALID=0",
      "SLURM_NODEID=1", "SLURM_TASKS_PER_NODE=1(x2)", "SLURM_JOB_NODELIST=node[01-02]"}, NULL,
     LAUNCHER_TORCHRUN, 5, 8, 1, 4, 1, "node01", 29500, 0, 0, 0},
    {"torchrun under mpirun: torchrun wins", {TORCHRUN_2x4(3, 3, 0), "OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2",
      "OMPI_COMM_WORLD_LOCAL_RANK=0", "OMPI_COMM_WORLD_LOCAL_SIZE=1"}, NULL, LAUNCHER_TORCHRUN, 3, 8, 3, 4, 0, "node01", 29500, 0, 0, 0},
    {"mpirun inside an sbatch allocation: Open MPI wins over the inherited SLURM_*",
     {"OMPI_COMM_WORLD_RANK=3", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_RANK=1", "OMPI_COMM_WORLD_LOCAL_SIZE=2",
      "SLURM_PROCID=0", "SLURM_NTASKS=4", "SLURM_LOCALID=0", "SLURM_NODEID=0", "SLURM_TASKS_PER_NODE=2(x2)",
      "SLURM_JOB_NODELIST=n[1-2]", "SLURM_JOB_ID=99"}, NULL, LAUNCHER_OPENMPI, 3, 4, 1, 2, -1, "", 0, 0, 0, 0},

    /* ---- Open MPI */
    {"mpirun -np 2", {"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2", "OMPI_COMM_WORLD_LOCAL_RANK=1",
      "OMPI_COMM_WORLD_LOCAL_SIZE=2"}, NULL, LAUNCHER_OPENMPI, 1, 2, 1, 2, -1, "", 0, 0, 0, 0},
    {"mpirun with MASTER_*", {"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=16", "OMPI_COMM_WORLD_LOCAL_RANK=0",
      "OMPI_COMM_WORLD_LOCAL_SIZE=8", "MASTER_ADDR=10.0.0.1", "MASTER_PORT=29400"}, NULL,
     LAUNCHER_OPENMPI, 0, 16, 0, 8, -1, "10.0.0.1", 29400, 0, 0, 0},

    /* ---- Slurm */
    {"srun 4 nodes x 4, node list with ranges", {"SLURM_PROCID=13", "SLURM_NTASKS=16", "SLURM_LOCALID=1", "SLURM_NODEID=3",
      "SLURM_STEP_TASKS_PER_NODE=4(x4)", "SLURM_JOB_NODELIST=node[01-04,07]", "SLURM_JOB_ID=123456"}, NULL,
     LAUNCHER_SLURM, 13, 16, 1, 4, 3, "node01", 23456, 0, 0, 0},
    {"srun uneven 2(x3),1 on the last node", {"SLURM_PROCID=6", "SLURM_NTASKS=7", "SLURM_LOCALID=0", "SLURM_NODEID=3",
      "SLURM_TASKS_PER_NODE=2(x3),1", "SLURM_JOB_NODELIST=a,b,c,d", "SLURM_JOB_ID=5"}, NULL,
     LAUNCHER_SLURM, 6, 7, 0, 1, 3, "a", 20005, 0, 0, 0},
    {"srun uneven 2(x3),1 on node 1", {"SLURM_PROCID=3", "SLURM_NTASKS=7", "SLURM_LOCALID=1", "SLURM_NODEID=1",
      "SLURM_NTASKS_PER_NODE=2(x3),1", "SLURM_JOB_NODELIST=gpu-[1-2],gpu-9"}, NULL,
     LAUNCHER_SLURM, 3, 7, 1, 2, 1, "gpu-1", 20000, 0, 0, 0},
    {"srun plain per-node count", {"SLURM_PROCID=5", "SLURM_NTASKS=8", "SLURM_LOCALID=1", "SLURM_NODEID=1",
      "SLURM_NTASKS_PER_NODE=4", "SLURM_STEP_NODELIST=r[1-2]-n[3-4]", "SLURM_JOB_NODELIST=x", "SLURM_JOB_ID=1"}, NULL,
     LAUNCHER_SLURM, 5, 8, 1, 4, 1, "r1-n3", 20001, 0, 0, 0},
    {"srun, no SLURM_NODEID, plain count", {"SLURM_PROCID=5", "SLURM_NTASKS=8", "SLURM_LOCALID=1",
      "SLURM_TASKS_PER_NODE=4", "SLURM_JOB_NODELIST=solo"}, NULL, LAUNCHER_SLURM, 5, 8, 1, 4, 1, "solo", 20000, 0, 0, 0},
    {"srun, MASTER_* override the node list", {"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_LOCALID=0", "SLURM_NODEID=0",
      "SLURM_TASKS_PER_NODE=1(x2)", "SLURM_JOB_NODELIST=n[5-6]", "MASTER_ADDR=10.1.1.1", "MASTER_PORT=4000"}, NULL,
     LAUNCHER_SLURM, 0, 2, 0, 1, 0, "10.1.1.1", 4000, 0, 0, 0},
    {"srun, one task", {"SLURM_PROCID=0", "SLURM_NTASKS=1", "SLURM_LOCALID=0", "SLURM_NODEID=0", "SLURM_TASKS_PER_NODE=1"},
     NULL, LAUNCHER_SLURM, 0, 1, 0, 1, 0, "", 20000, 0, 0, 0},

    /* ---- errors: torchrun */
    {"RANK without WORLD_SIZE", {"RANK=1"}, .error = "launch environment: RANK=1 is set but WORLD_SIZE is not: set both"},
    {"WORLD_SIZE without RANK", {"WORLD_SIZE=4"}, .error = "launch environment: WORLD_SIZE=4 is set but RANK is not: set both"},
    {"RANK >= WORLD_SIZE", {"RANK=2", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1", "MASTER_ADDR=a", "MASTER_PORT=1"},
     .error = "launch environment: RANK=2 is not below WORLD_SIZE=2"},
    {"WORLD_SIZE=0", {"RANK=0", "WORLD_SIZE=0"}, .error = "launch environment: WORLD_SIZE=0: a world has at least one rank"},
    {"LOCAL_RANK >= LOCAL_WORLD_SIZE", {"RANK=3", "WORLD_SIZE=4", "LOCAL_RANK=2", "LOCAL_WORLD_SIZE=2"},
     .error = "launch environment: LOCAL_RANK=2 is not below LOCAL_WORLD_SIZE=2"},
    {"LOCAL_WORLD_SIZE > WORLD_SIZE", {"RANK=1", "WORLD_SIZE=2", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=4"},
     .error = "launch environment: LOCAL_WORLD_SIZE=4 is larger than WORLD_SIZE=2"},
    {"LOCAL_RANK > RANK", {"RANK=0", "WORLD_SIZE=4", "LOCAL_RANK=1", "LOCAL_WORLD_SIZE=2"},
     .error = "launch environment: RANK=0 with LOCAL_RANK=1 and LOCAL_WORLD_SIZE=2 does not fit WORLD_SIZE=4"},
    {"node runs past the world", {"RANK=3", "WORLD_SIZE=4", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2"},
     .error = "launch environment: RANK=3 with LOCAL_RANK=0 and LOCAL_WORLD_SIZE=2 does not fit WORLD_SIZE=4"},
    {"LOCAL_RANK without LOCAL_WORLD_SIZE", {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0"},
     .error = "launch environment: LOCAL_RANK=0 is set but LOCAL_WORLD_SIZE is not: set both"},
    {"no LOCAL_* with WORLD_SIZE > 1", {"RANK=0", "WORLD_SIZE=2", "MASTER_ADDR=a", "MASTER_PORT=1"},
     .error = "launch environment: RANK=0 and WORLD_SIZE=2 are set but LOCAL_RANK and LOCAL_WORLD_SIZE are not: set both (torchrun sets all four)"},
    {"non-integer RANK", {"RANK=one", "WORLD_SIZE=2"}, .error = "launch environment: RANK=one is not a non-negative integer"},
    {"trailing junk", {"RANK=1", "WORLD_SIZE=2x"}, .error = "launch environment: WORLD_SIZE=2x is not a non-negative integer"},
    {"negative RANK", {"RANK=-1", "WORLD_SIZE=2"}, .error = "launch environment: RANK=-1 is negative"},
    {"empty RANK", {"RANK=", "WORLD_SIZE=2"}, .error = "launch environment: RANK is set but empty"},
    {"huge WORLD_SIZE", {"RANK=0", "WORLD_SIZE=99999999999"}, .error = "launch environment: WORLD_SIZE=99999999999 is too large"},
    {"GROUP_RANK >= GROUP_WORLD_SIZE", {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=1", "GROUP_RANK=2",
      "GROUP_WORLD_SIZE=2", "MASTER_ADDR=a", "MASTER_PORT=1"}, .error = "launch environment: GROUP_RANK=2 is not below GROUP_WORLD_SIZE=2"},
    {"no MASTER_* with WORLD_SIZE > 1", {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2"},
     .error = "launch environment: a torchrun-style launch with WORLD_SIZE > 1 needs a rendezvous address: set MASTER_ADDR and "
     "MASTER_PORT (the host and a free port of rank 0)"},
    {"MASTER_ADDR without MASTER_PORT", {"MASTER_ADDR=h"}, .error = "launch environment: MASTER_ADDR=h is set but MASTER_PORT is not: set both"},
    {"MASTER_PORT without MASTER_ADDR", {"MASTER_PORT=1"}, .error = "launch environment: MASTER_PORT=1 is set but MASTER_ADDR is not: set both"},
    {"MASTER_PORT out of range", {"RANK=0", "WORLD_SIZE=2", "LOCAL_RANK=0", "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=h", "MASTER_PORT=65536"},
     .error = "launch environment: MASTER_PORT=65536 is out of range (a TCP port is 1..65535)"},
    {"MASTER_PORT zero", {"MASTER_ADDR=h", "MASTER_PORT=0"}, .error = "launch environment: MASTER_PORT=0 is out of range (a TCP port is 1..65535)"},
    {"MASTER_PORT not a number", {"MASTER_ADDR=h", "MASTER_PORT=http"}, .error = "launch environment: MASTER_PORT=http is not a non-negative integer"},
    {"empty MASTER_ADDR", {"MASTER_ADDR=", "MASTER_PORT=5"}, .error = "launch environment: MASTER_ADDR is set but empty"},
    {"bad TORCHELASTIC_RESTART_COUNT", {"RANK=0", "WORLD_SIZE=1", "TORCHELASTIC_RESTART_COUNT=x"},
     .error = "launch environment: TORCHELASTIC_RESTART_COUNT=x is not a non-negative integer"},
    {"bad COLT_STORE_PORT", {"COLT_STORE_PORT=99999"}, .error = "launch environment: COLT_STORE_PORT=99999 is out of range (a TCP port is 1..65535)"},

    /* ---- errors: Open MPI */
    {"OMPI rank without size", {"OMPI_COMM_WORLD_RANK=0"},
     .error = "launch environment: OMPI_COMM_WORLD_RANK=0 is set but OMPI_COMM_WORLD_SIZE is not: set both"},
    {"OMPI without local", {"OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2"},
     .error = "launch environment: OMPI_COMM_WORLD_RANK=0 is set but OMPI_COMM_WORLD_LOCAL_RANK and OMPI_COMM_WORLD_LOCAL_SIZE are not (mpirun sets all four)"},
    {"OMPI rank >= size", {"OMPI_COMM_WORLD_RANK=4", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_RANK=0", "OMPI_COMM_WORLD_LOCAL_SIZE=1"},
     .error = "launch environment: OMPI_COMM_WORLD_RANK=4 is not below OMPI_COMM_WORLD_SIZE=4"},
    {"OMPI local rank >= local size", {"OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_RANK=1",
      "OMPI_COMM_WORLD_LOCAL_SIZE=1"}, .error = "launch environment: OMPI_COMM_WORLD_LOCAL_RANK=1 is not below OMPI_COMM_WORLD_LOCAL_SIZE=1"},

    /* ---- errors: Slurm */
    {"SLURM_PROCID without SLURM_NTASKS", {"SLURM_PROCID=0"},
     .error = "launch environment: SLURM_PROCID=0 is set but SLURM_NTASKS is not (srun sets both)"},
    {"SLURM_PROCID without SLURM_LOCALID", {"SLURM_PROCID=0", "SLURM_NTASKS=2"},
     .error = "launch environment: SLURM_PROCID=0 is set but SLURM_LOCALID is not (srun sets both)"},
    {"no tasks-per-node", {"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_LOCALID=0"},
     .error = "launch environment: SLURM_PROCID=0 is set but none of SLURM_STEP_TASKS_PER_NODE, SLURM_TASKS_PER_NODE, SLURM_NTASKS_PER_NODE is (start colt with srun)"},
    {"SLURM_PROCID >= SLURM_NTASKS", {"SLURM_PROCID=2", "SLURM_NTASKS=2", "SLURM_LOCALID=0", "SLURM_TASKS_PER_NODE=2"},
     .error = "launch environment: SLURM_PROCID=2 is not below SLURM_NTASKS=2"},
    {"SLURM_LOCALID >= tasks on node", {"SLURM_PROCID=1", "SLURM_NTASKS=4", "SLURM_LOCALID=2", "SLURM_NODEID=0",
      "SLURM_TASKS_PER_NODE=2(x2)"}, .error = "launch environment: SLURM_LOCALID=2 is not below SLURM_TASKS_PER_NODE=2"},
    {"list does not add up", {"SLURM_PROCID=0", "SLURM_NTASKS=8", "SLURM_LOCALID=0", "SLURM_NODEID=0", "SLURM_TASKS_PER_NODE=2(x3),1"},
     .error = "launch environment: SLURM_TASKS_PER_NODE=2(x3),1 does not add up to SLURM_NTASKS=8"},
    {"plain count does not divide", {"SLURM_PROCID=0", "SLURM_NTASKS=6", "SLURM_LOCALID=0", "SLURM_NTASKS_PER_NODE=4"},
     .error = "launch environment: SLURM_NTASKS_PER_NODE=4 does not add up to SLURM_NTASKS=6"},
    {"node id past the list", {"SLURM_PROCID=0", "SLURM_NTASKS=7", "SLURM_LOCALID=0", "SLURM_NODEID=4", "SLURM_TASKS_PER_NODE=2(x3),1"},
     .error = "launch environment: tasks-per-node list '2(x3),1' has 4 node entries, none for node 4 (SLURM_TASKS_PER_NODE, SLURM_NODEID=4)"},
    {"node id past a plain count", {"SLURM_PROCID=0", "SLURM_NTASKS=8", "SLURM_LOCALID=0", "SLURM_NODEID=2", "SLURM_TASKS_PER_NODE=4"},
     .error = "launch environment: SLURM_NODEID=2 is not below the 2 nodes that SLURM_TASKS_PER_NODE=4 and SLURM_NTASKS=8 make"},
    {"list without SLURM_NODEID", {"SLURM_PROCID=0", "SLURM_NTASKS=7", "SLURM_LOCALID=0", "SLURM_TASKS_PER_NODE=2(x3),1"},
     .error = "launch environment: SLURM_TASKS_PER_NODE=2(x3),1 lists several nodes but SLURM_NODEID is not set"},
    {"malformed tasks-per-node", {"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_LOCALID=0", "SLURM_NODEID=0", "SLURM_TASKS_PER_NODE=2(3)"},
     .error = "launch environment: tasks-per-node list '2(3)' is not of the form 4 or 2(x3),1 (SLURM_TASKS_PER_NODE, SLURM_NODEID=0)"},
    {"malformed node list", {"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_LOCALID=0", "SLURM_NODEID=0", "SLURM_TASKS_PER_NODE=1(x2)",
      "SLURM_JOB_NODELIST=node[01-02"}, .error = "launch environment: host list 'node[01-02' has an unmatched '[' (SLURM_JOB_NODELIST)"},
    {"negative SLURM_PROCID", {"SLURM_PROCID=-3", "SLURM_NTASKS=2"}, .error = "launch environment: SLURM_PROCID=-3 is negative"},
    {"Slurm world without a host", {"SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_LOCALID=0", "SLURM_NODEID=0", "SLURM_TASKS_PER_NODE=1(x2)"},
     .error = "launch environment: SLURM_PROCID=0 is set but neither MASTER_ADDR nor SLURM_JOB_NODELIST is"},
};

static void run_case(const Case *c) {
    LaunchEnv e;
    char err[ERR_LEN] = "";
    memset(&e, 0x5a, sizeof e);
    int rc = launch_env_read(&e, launch_env_lookup_envp, (void *)c->env, err);
    if (c->error) {
        CHECK(rc == COLT_ERR, "[%s] parsed, want error \"%s\"", c->name, c->error);
        CHECK(rc != COLT_ERR || !strcmp(err, c->error), "[%s]\n  got  \"%s\"\n  want \"%s\"", c->name, err, c->error);
        return;
    }
    CHECK(rc == COLT_OK, "[%s] error: %s", c->name, err);
    if (rc != COLT_OK) return;
    CHECK(e.launcher == c->launcher, "[%s] launcher %s, want %s", c->name, launcher_name(e.launcher), launcher_name(c->launcher));
    CHECK(e.rank == c->rank && e.world_size == c->world, "[%s] rank %d/%d, want %d/%d", c->name, e.rank, e.world_size, c->rank, c->world);
    CHECK(e.local_rank == c->local_rank && e.local_world_size == c->local_world, "[%s] local %d/%d, want %d/%d", c->name,
          e.local_rank, e.local_world_size, c->local_rank, c->local_world);
    CHECK(e.node_rank == c->node_rank, "[%s] node_rank %d, want %d", c->name, e.node_rank, c->node_rank);
    CHECK(!strcmp(e.master_addr, c->addr) && e.master_port == c->port, "[%s] master %s:%d, want %s:%d", c->name,
          e.master_addr, e.master_port, c->addr, c->port);
    CHECK(e.torchrun_agent_store == (c->agent_store != 0), "[%s] agent store %d, want %d", c->name, e.torchrun_agent_store, c->agent_store);
    CHECK(e.restart_count == c->restart, "[%s] restart %d, want %d", c->name, e.restart_count, c->restart);
    CHECK(e.store_port == c->store_port, "[%s] store_port %d, want %d", c->name, e.store_port, c->store_port);
}

static void test_host_lists(void) {
    static const char *const cases[][2] = {
        {"node[01-04,07]", "node01"}, {"a,b", "a"}, {"gpu-[1-2]", "gpu-1"}, {"single", "single"},
        {"n[7,1-3],m[1]", "n7"}, {"r[1-2]-n[3-4]", "r1-n3"}, {"x[001-100]-ib", "x001-ib"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char host[64], err[ERR_LEN] = "";
        int rc = slurm_first_host(host, sizeof host, cases[i][0], err);
        CHECK(rc == COLT_OK && !strcmp(host, cases[i][1]), "host list '%s': got '%s' (%s), want '%s'", cases[i][0],
              rc == COLT_OK ? host : "", err, cases[i][1]);
    }
    static const char *const bad[][2] = {
        {"", "launch environment: host list '' names no host"},
        {",a", "launch environment: host list ',a' names no host"},
        {"a]", "launch environment: host list 'a]' has an unmatched ']'"},
        {"a[1[2]]", "launch environment: host list 'a[1[2]]' has nested brackets"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char host[64], err[ERR_LEN] = "";
        int rc = slurm_first_host(host, sizeof host, bad[i][0], err);
        CHECK(rc == COLT_ERR && !strcmp(err, bad[i][1]), "host list '%s': got \"%s\", want \"%s\"", bad[i][0], err, bad[i][1]);
    }
    char tiny[4], err[ERR_LEN];
    CHECK(slurm_first_host(tiny, sizeof tiny, "longname", err) == COLT_ERR, "a host name longer than the buffer is an error");
}

static void test_tasks_per_node(void) {
    static const struct { const char *list; int node, tasks, total; } cases[] = {
        {"4", 0, 4, 4}, {"2(x3),1", 0, 2, 7}, {"2(x3),1", 2, 2, 7}, {"2(x3),1", 3, 1, 7},
        {"1,3(x2),2", 2, 3, 9}, {"8(x16)", 15, 8, 128},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int tasks = -1, total = -1;
        char err[ERR_LEN] = "";
        int rc = slurm_tasks_on_node(&tasks, &total, cases[i].list, cases[i].node, err);
        CHECK(rc == COLT_OK && tasks == cases[i].tasks && total == cases[i].total, "tasks '%s' node %d: got %d of %d (%s), want %d of %d",
              cases[i].list, cases[i].node, tasks, total, err, cases[i].tasks, cases[i].total);
    }
    static const char *const bad[] = {"", "x", "0", "2(x0)", "2(x3", "2,", "2,,3", "-1", "2(y3)", "3)"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        int tasks, total;
        char err[ERR_LEN] = "";
        CHECK(slurm_tasks_on_node(&tasks, &total, bad[i], 0, err) == COLT_ERR, "tasks list '%s' should be an error", bad[i]);
    }
}

int main(void) {
    size_t n = sizeof CASES / sizeof CASES[0];
    for (size_t i = 0; i < n; i++) run_case(&CASES[i]);
    test_host_lists();
    test_tasks_per_node();
    /* The process-environment wrapper: whatever this environment is, it parses or says why. */
    LaunchEnv e;
    char err[ERR_LEN] = "";
    int rc = launch_env_from_process(&e, err);
    CHECK(rc == COLT_OK || err[0], "launch_env_from_process failed without a message");
    printf("test_dist_env: %zu environments, %d checks, %d failures\n", n, g_checks, g_failures);
    return g_failures ? 1 : 0;
}
