/* launch_env.c — reads torchrun / Open MPI / Slurm variables into a LaunchEnv
 * (precedence and rationale in launch_env.h). Pure parsing: no sockets, no
 * processes, no global state; the environment comes through a lookup callback. */
#include "dist/launch_env.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/error.h"

#define ERR_PREFIX "launch environment: "

typedef struct {
    EnvLookup lookup;
    void *ctx;
} Env;

static const char *env_get(const Env *env, const char *name) {
    return env->lookup(name, env->ctx);
}

/* Strict non-negative decimal int: digits only, no sign, no spaces, fits an int. */
static int parse_count(int *out, const char *name, const char *value, char *err) {
    if (value[0] == '-' && isdigit((unsigned char)value[1]))
        return errorf(err, ERR_PREFIX "%s=%s is negative", name, value);
    if (!value[0]) return errorf(err, ERR_PREFIX "%s is set but empty", name);
    long long v = 0;
    for (const char *p = value; *p; p++) {
        if (!isdigit((unsigned char)*p))
            return errorf(err, ERR_PREFIX "%s=%s is not a non-negative integer", name, value);
        v = v * 10 + (*p - '0');
        if (v > INT_MAX) return errorf(err, ERR_PREFIX "%s=%s is too large", name, value);
    }
    *out = (int)v;
    return COLT_OK;
}

/* Reads an optional count: *present says whether it was set. */
static int read_count(int *out, bool *present, const Env *env, const char *name, char *err) {
    const char *v = env_get(env, name);
    *present = v != NULL;
    if (!v) return COLT_OK;
    return parse_count(out, name, v, err);
}

static int parse_port(int *out, const char *name, const char *value, char *err) {
    int port = 0;
    if (parse_count(&port, name, value, err) != COLT_OK) return COLT_ERR;
    if (port < 1 || port > 65535)
        return errorf(err, ERR_PREFIX "%s=%s is out of range (a TCP port is 1..65535)", name, value);
    *out = port;
    return COLT_OK;
}

static bool env_true(const char *v) {
    return v && (!strcmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes"));
}

const char *launcher_name(Launcher launcher) {
    switch (launcher) {
    case LAUNCHER_TORCHRUN: return "torchrun";
    case LAUNCHER_OPENMPI: return "mpirun (Open MPI)";
    case LAUNCHER_SLURM: return "srun (Slurm)";
    case LAUNCHER_NONE: break;
    }
    return "none";
}

/* ---------------------------------------------------------------- Slurm lists */

int slurm_first_host(char *out, int out_len, const char *nodelist, char *err) {
    int n = 0, depth = 0;
    bool copying = true; /* inside a bracket, only the first element is copied */
    for (const char *p = nodelist; *p; p++) {
        char c = *p;
        if (depth == 0 && c == ',') break; /* end of the first host expression */
        if (c == '[') {
            if (depth) return errorf(err, ERR_PREFIX "host list '%s' has nested brackets", nodelist);
            depth = 1;
            copying = true;
            continue;
        }
        if (c == ']') {
            if (!depth) return errorf(err, ERR_PREFIX "host list '%s' has an unmatched ']'", nodelist);
            depth = 0;
            continue;
        }
        if (depth && (c == ',' || c == '-')) copying = false;
        if (depth && !copying) continue;
        if (n + 1 >= out_len) return errorf(err, ERR_PREFIX "host list '%s': first host name too long", nodelist);
        out[n++] = c;
    }
    if (depth) return errorf(err, ERR_PREFIX "host list '%s' has an unmatched '['", nodelist);
    if (n == 0) return errorf(err, ERR_PREFIX "host list '%s' names no host", nodelist);
    out[n] = '\0';
    return COLT_OK;
}

int slurm_tasks_on_node(int *tasks, int *total, const char *list, int node, char *err) {
    const char *p = list;
    long long sum = 0;
    int index = 0, found = -1;
    if (!*p) return errorf(err, ERR_PREFIX "tasks-per-node list is empty");
    while (*p) {
        char *end;
        errno = 0;
        long count = strtol(p, &end, 10);
        if (end == p || !isdigit((unsigned char)*p) || errno || count < 1 || count > INT_MAX)
            return errorf(err, ERR_PREFIX "tasks-per-node list '%s' is not of the form 4 or 2(x3),1", list);
        long repeat = 1;
        p = end;
        if (*p == '(') {
            if (p[1] != 'x') return errorf(err, ERR_PREFIX "tasks-per-node list '%s' is not of the form 4 or 2(x3),1", list);
            const char *q = p + 2;
            repeat = strtol(q, &end, 10);
            if (end == q || !isdigit((unsigned char)*q) || *end != ')' || repeat < 1 || repeat > INT_MAX)
                return errorf(err, ERR_PREFIX "tasks-per-node list '%s' is not of the form 4 or 2(x3),1", list);
            p = end + 1;
        }
        if (node >= index && node < index + repeat) found = (int)count;
        index += (int)repeat;
        sum += (long long)count * repeat;
        if (sum > INT_MAX || index > INT_MAX / 2) return errorf(err, ERR_PREFIX "tasks-per-node list '%s' is too large", list);
        if (*p == ',') {
            p++;
            if (!*p) return errorf(err, ERR_PREFIX "tasks-per-node list '%s' ends with ','", list);
        } else if (*p) {
            return errorf(err, ERR_PREFIX "tasks-per-node list '%s' is not of the form 4 or 2(x3),1", list);
        }
    }
    if (found < 0) return errorf(err, ERR_PREFIX "tasks-per-node list '%s' has %d node entries, none for node %d", list, index, node);
    *tasks = found;
    *total = (int)sum;
    return COLT_OK;
}

/* ------------------------------------------------------------ common pieces */

/* MASTER_ADDR / MASTER_PORT: both or neither; required says whether absence is an error. */
static int read_master(LaunchEnv *out, const Env *env, bool required, const char *why, char *err) {
    const char *addr = env_get(env, "MASTER_ADDR");
    const char *port = env_get(env, "MASTER_PORT");
    if (addr && !addr[0]) return errorf(err, ERR_PREFIX "MASTER_ADDR is set but empty");
    if (addr && strlen(addr) >= LAUNCH_HOST_LEN) return errorf(err, ERR_PREFIX "MASTER_ADDR is longer than %d characters", LAUNCH_HOST_LEN - 1);
    if (addr && !port) return errorf(err, ERR_PREFIX "MASTER_ADDR=%s is set but MASTER_PORT is not: set both", addr);
    if (port && !addr) return errorf(err, ERR_PREFIX "MASTER_PORT=%s is set but MASTER_ADDR is not: set both", port);
    if (!addr) {
        if (required) return errorf(err, ERR_PREFIX "%s: set MASTER_ADDR and MASTER_PORT (the host and a free port of rank 0)", why);
        return COLT_OK;
    }
    if (parse_port(&out->master_port, "MASTER_PORT", port, err) != COLT_OK) return COLT_ERR;
    snprintf(out->master_addr, sizeof out->master_addr, "%s", addr);
    return COLT_OK;
}

/* The checks every launcher's numbers must pass. Names are for the messages. */
static int check_ranks(const LaunchEnv *e, const char *rank_name, const char *world_name,
                       const char *local_name, const char *local_world_name, char *err) {
    if (e->world_size < 1) return errorf(err, ERR_PREFIX "%s=%d: a world has at least one rank", world_name, e->world_size);
    if (e->rank >= e->world_size)
        return errorf(err, ERR_PREFIX "%s=%d is not below %s=%d", rank_name, e->rank, world_name, e->world_size);
    if (e->local_world_size < 1)
        return errorf(err, ERR_PREFIX "%s=%d: a node runs at least one rank", local_world_name, e->local_world_size);
    if (e->local_rank >= e->local_world_size)
        return errorf(err, ERR_PREFIX "%s=%d is not below %s=%d", local_name, e->local_rank, local_world_name, e->local_world_size);
    if (e->local_world_size > e->world_size)
        return errorf(err, ERR_PREFIX "%s=%d is larger than %s=%d", local_world_name, e->local_world_size, world_name, e->world_size);
    /* A node's ranks are consecutive: this node's first rank is rank - local_rank. */
    if (e->local_rank > e->rank || e->rank - e->local_rank + e->local_world_size > e->world_size)
        return errorf(err, ERR_PREFIX "%s=%d with %s=%d and %s=%d does not fit %s=%d", rank_name, e->rank,
                      local_name, e->local_rank, local_world_name, e->local_world_size, world_name, e->world_size);
    return COLT_OK;
}

/* Both of a pair or neither: returns 1 if both present, 0 if neither. */
static int read_pair(int *a, int *b, const Env *env, const char *name_a, const char *name_b, char *err) {
    bool has_a, has_b;
    if (read_count(a, &has_a, env, name_a, err) != COLT_OK) return -1;
    if (read_count(b, &has_b, env, name_b, err) != COLT_OK) return -1;
    if (has_a != has_b) {
        const char *set = has_a ? name_a : name_b, *unset = has_a ? name_b : name_a;
        errorf(err, ERR_PREFIX "%s=%s is set but %s is not: set both", set, env_get(env, set), unset);
        return -1;
    }
    return has_a ? 1 : 0;
}

/* ---------------------------------------------------------------- launchers */

static int read_torchrun(LaunchEnv *e, const Env *env, char *err) {
    e->launcher = LAUNCHER_TORCHRUN;
    int got = read_pair(&e->rank, &e->world_size, env, "RANK", "WORLD_SIZE", err);
    if (got < 0) return COLT_ERR;
    got = read_pair(&e->local_rank, &e->local_world_size, env, "LOCAL_RANK", "LOCAL_WORLD_SIZE", err);
    if (got < 0) return COLT_ERR;
    if (got == 0) {
        if (e->world_size > 1)
            return errorf(err, ERR_PREFIX "RANK=%d and WORLD_SIZE=%d are set but LOCAL_RANK and LOCAL_WORLD_SIZE are not: "
                          "set both (torchrun sets all four)", e->rank, e->world_size);
        e->local_rank = 0;
        e->local_world_size = 1;
    }
    if (check_ranks(e, "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", err) != COLT_OK) return COLT_ERR;

    bool has_group, has_groups;
    int groups = 0;
    if (read_count(&e->node_rank, &has_group, env, "GROUP_RANK", err) != COLT_OK) return COLT_ERR;
    if (read_count(&groups, &has_groups, env, "GROUP_WORLD_SIZE", err) != COLT_OK) return COLT_ERR;
    if (has_group && has_groups && e->node_rank >= groups)
        return errorf(err, ERR_PREFIX "GROUP_RANK=%d is not below GROUP_WORLD_SIZE=%d", e->node_rank, groups);
    if (!has_group) /* torchrun sets it; by hand, nodes of equal size are numbered in rank order */
        e->node_rank = e->world_size % e->local_world_size == 0 ? e->rank / e->local_world_size : -1;

    if (read_master(e, env, e->world_size > 1, "a torchrun-style launch with WORLD_SIZE > 1 needs a rendezvous address", err) != COLT_OK)
        return COLT_ERR;
    e->torchrun_agent_store = env_true(env_get(env, "TORCHELASTIC_USE_AGENT_STORE"));
    bool has_restart;
    if (read_count(&e->restart_count, &has_restart, env, "TORCHELASTIC_RESTART_COUNT", err) != COLT_OK) return COLT_ERR;
    const char *run_id = env_get(env, "TORCHELASTIC_RUN_ID");
    if (run_id) snprintf(e->run_id, sizeof e->run_id, "%s", run_id);
    return COLT_OK;
}

static int read_openmpi(LaunchEnv *e, const Env *env, char *err) {
    e->launcher = LAUNCHER_OPENMPI;
    if (read_pair(&e->rank, &e->world_size, env, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", err) < 0) return COLT_ERR;
    int got = read_pair(&e->local_rank, &e->local_world_size, env, "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", err);
    if (got < 0) return COLT_ERR;
    if (got == 0)
        return errorf(err, ERR_PREFIX "OMPI_COMM_WORLD_RANK=%d is set but OMPI_COMM_WORLD_LOCAL_RANK and OMPI_COMM_WORLD_LOCAL_SIZE "
                      "are not (mpirun sets all four)", e->rank);
    if (check_ranks(e, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
                    "OMPI_COMM_WORLD_LOCAL_SIZE", err) != COLT_OK)
        return COLT_ERR;
    e->node_rank = -1; /* mpirun may map ranks round-robin over nodes: it has no node index */
    return read_master(e, env, false, NULL, err);
}

static int read_slurm(LaunchEnv *e, const Env *env, char *err) {
    e->launcher = LAUNCHER_SLURM;
    const char *ntasks_name = env_get(env, "SLURM_NTASKS") ? "SLURM_NTASKS" : "SLURM_NPROCS";
    const char *procid = env_get(env, "SLURM_PROCID");
    const char *ntasks = env_get(env, ntasks_name);
    if (!ntasks) return errorf(err, ERR_PREFIX "SLURM_PROCID=%s is set but SLURM_NTASKS is not (srun sets both)", procid);
    if (parse_count(&e->rank, "SLURM_PROCID", procid, err) != COLT_OK) return COLT_ERR;
    if (parse_count(&e->world_size, ntasks_name, ntasks, err) != COLT_OK) return COLT_ERR;
    bool has_local, has_node;
    if (read_count(&e->local_rank, &has_local, env, "SLURM_LOCALID", err) != COLT_OK) return COLT_ERR;
    if (!has_local) return errorf(err, ERR_PREFIX "SLURM_PROCID=%s is set but SLURM_LOCALID is not (srun sets both)", procid);
    if (read_count(&e->node_rank, &has_node, env, "SLURM_NODEID", err) != COLT_OK) return COLT_ERR;

    static const char *const per_node_names[] = {"SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_NTASKS_PER_NODE"};
    const char *per_node = NULL, *per_node_name = NULL;
    for (int i = 0; i < 3 && !per_node; i++) {
        per_node_name = per_node_names[i];
        per_node = env_get(env, per_node_name);
    }
    if (!per_node)
        return errorf(err, ERR_PREFIX "SLURM_PROCID=%s is set but none of SLURM_STEP_TASKS_PER_NODE, SLURM_TASKS_PER_NODE, "
                      "SLURM_NTASKS_PER_NODE is (start colt with srun)", procid);
    /* A single plain number ("4") is per node for every node; a list has one entry per node. */
    bool uniform = !strchr(per_node, ',') && !strchr(per_node, '(');
    int tasks = 0, total = 0;
    char sub[ERR_LEN];
    if (slurm_tasks_on_node(&tasks, &total, per_node, uniform ? 0 : (has_node ? e->node_rank : 0), sub) != COLT_OK)
        return errorf(err, "%s (%s, SLURM_NODEID=%s)", sub, per_node_name, has_node ? env_get(env, "SLURM_NODEID") : "unset");
    if (!uniform && !has_node)
        return errorf(err, ERR_PREFIX "%s=%s lists several nodes but SLURM_NODEID is not set", per_node_name, per_node);
    if (uniform ? e->world_size % tasks != 0 : total != e->world_size)
        return errorf(err, ERR_PREFIX "%s=%s does not add up to %s=%s", per_node_name, per_node, ntasks_name, ntasks);
    e->local_world_size = tasks;
    if (check_ranks(e, "SLURM_PROCID", ntasks_name, "SLURM_LOCALID", per_node_name, err) != COLT_OK) return COLT_ERR;
    if (!has_node) e->node_rank = uniform ? e->rank / tasks : 0;
    if (uniform && e->node_rank >= e->world_size / tasks)
        return errorf(err, ERR_PREFIX "SLURM_NODEID=%d is not below the %d nodes that %s=%s and %s=%s make",
                      e->node_rank, e->world_size / tasks, per_node_name, per_node, ntasks_name, ntasks);

    const char *job_id = env_get(env, "SLURM_JOB_ID");
    if (!job_id) job_id = env_get(env, "SLURM_JOBID");
    if (job_id) snprintf(e->run_id, sizeof e->run_id, "%s", job_id);
    if (read_master(e, env, false, NULL, err) != COLT_OK) return COLT_ERR;
    if (e->master_addr[0]) return COLT_OK;
    /* Rank 0 runs on the step's first node (srun's block distribution). */
    static const char *const list_names[] = {"SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"};
    for (int i = 0; i < 3; i++) {
        const char *list = env_get(env, list_names[i]);
        if (!list) continue;
        if (slurm_first_host(e->master_addr, sizeof e->master_addr, list, sub) != COLT_OK)
            return errorf(err, "%s (%s)", sub, list_names[i]);
        break;
    }
    if (!e->master_addr[0] && e->world_size > 1)
        return errorf(err, ERR_PREFIX "SLURM_PROCID=%s is set but neither MASTER_ADDR nor SLURM_JOB_NODELIST is", procid);
    /* A port per job, so two jobs sharing a node do not collide (MASTER_PORT overrides). */
    long id = job_id ? strtol(job_id, NULL, 10) : 0;
    e->master_port = 20000 + (int)((id < 0 ? -id : id) % 10000);
    return COLT_OK;
}

int launch_env_read(LaunchEnv *out, EnvLookup lookup, void *ctx, char *err) {
    LaunchEnv e = {0};
    Env env = {lookup, ctx};
    int rc;
    if (env_get(&env, "RANK") || env_get(&env, "WORLD_SIZE"))
        rc = read_torchrun(&e, &env, err);
    else if (env_get(&env, "OMPI_COMM_WORLD_RANK") || env_get(&env, "OMPI_COMM_WORLD_SIZE"))
        rc = read_openmpi(&e, &env, err);
    else if (env_get(&env, "SLURM_PROCID"))
        rc = read_slurm(&e, &env, err);
    else if (env_get(&env, "ACCELERATE_USE_CPU") && env_get(&env, "MASTER_ADDR"))
        /* accelerate's simple launcher (its --cpu mode) sets MASTER_* only when asked for several processes,
         * but starts one and gives it no rank: running on would be a silent run of one rank */
        rc = errorf(err, ERR_PREFIX "accelerate launch started one process for a launch of several (its --cpu mode "
                                    "starts CPU processes only through mpirun): add --mpirun_hostfile FILE to accelerate "
                                    "launch, or use colt train --nproc_per_node N, or mpirun -np N");
    else {
        e.launcher = LAUNCHER_NONE;
        e.world_size = 1;
        e.local_world_size = 1;
        rc = read_master(&e, &env, false, NULL, err);
    }
    if (rc != COLT_OK) return COLT_ERR;
    const char *store_port = env_get(&env, "COLT_STORE_PORT");
    if (store_port && parse_port(&e.store_port, "COLT_STORE_PORT", store_port, err) != COLT_OK) return COLT_ERR;
    *out = e;
    return COLT_OK;
}

static const char *lookup_process(const char *name, void *ctx) {
    (void)ctx;
    return getenv(name);
}

int launch_env_from_process(LaunchEnv *out, char *err) {
    return launch_env_read(out, lookup_process, NULL, err);
}

const char *launch_env_lookup_envp(const char *name, void *ctx) {
    const char *const *envp = ctx;
    size_t n = strlen(name);
    for (; envp && *envp; envp++)
        if (!strncmp(*envp, name, n) && (*envp)[n] == '=') return *envp + n + 1;
    return NULL;
}
