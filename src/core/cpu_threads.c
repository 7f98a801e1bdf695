/* cpu_threads.c — see cpu_threads.h. Reads the affinity mask and the cgroup
 * files each time it is asked (a launch asks once); keeps nothing. */
#include "core/cpu_threads.h"

#include <sched.h>
#include <stdio.h>
#include <stdlib.h>

int cpu_quota_cores(const char *cpu_max_line, long v1_quota, long v1_period) {
    long quota = v1_quota, period = v1_period;
    if (cpu_max_line) {
        char q[32];
        if (sscanf(cpu_max_line, "%31s %ld", q, &period) != 2) return 0;
        quota = strtol(q, NULL, 10); /* "max" reads as 0: unlimited */
    }
    if (quota <= 0 || period <= 0) return 0;
    return (int)((quota + period - 1) / period);
}

/* The quota of the cgroup this process is in; 0 when none applies. Tries
 * cgroup v2's unified file, then v1's pair (paths as a container sees them). */
static int cgroup_quota_cores(void) {
    char line[128];
    FILE *f = fopen("/sys/fs/cgroup/cpu.max", "r");
    if (f) {
        int cores = fgets(line, sizeof line, f) ? cpu_quota_cores(line, 0, 0) : 0;
        fclose(f);
        return cores;
    }
    long quota = 0, period = 0;
    if ((f = fopen("/sys/fs/cgroup/cpu/cpu.cfs_quota_us", "r"))) {
        if (fscanf(f, "%ld", &quota) != 1) quota = 0;
        fclose(f);
    }
    if ((f = fopen("/sys/fs/cgroup/cpu/cpu.cfs_period_us", "r"))) {
        if (fscanf(f, "%ld", &period) != 1) period = 0;
        fclose(f);
    }
    return cpu_quota_cores(NULL, quota, period);
}

int cpu_cores_usable(void) {
    cpu_set_t set;
    int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    int quota = cgroup_quota_cores();
    if (quota > 0 && quota < cores) cores = quota;
    return cores > 0 ? cores : 1;
}

int cpu_threads_for_rank(int local_rank, int local_world_size, const char **why) {
    const char *set = getenv("OMP_NUM_THREADS");
    int asked = set ? atoi(set) : 0; /* a list ("4,2") reads as its first level */
    if (asked > 0) {
        if (why) *why = "OMP_NUM_THREADS";
        return asked;
    }
    int cores = cpu_cores_usable(), ranks = local_world_size > 0 ? local_world_size : 1;
    int share = cores / ranks + (local_rank >= 0 && local_rank < cores % ranks ? 1 : 0);
    if (why) *why = ranks > 1 ? "this rank's share of the cores this process may use" : "the cores this process may use";
    return share > 0 ? share : 1;
}
