/* cpu_threads.h — how many threads this process computes with on the CPU:
 * the cores it may use (its affinity mask, capped by its cgroup's CPU quota),
 * shared among the ranks of a launch on this host. One number, computed once
 * by whoever opens the backend and handed to it; nothing here is global.
 * Not a thread pool: the CPU backend's OpenMP regions are the only one. */
#ifndef COLT_CORE_CPU_THREADS_H
#define COLT_CORE_CPU_THREADS_H

/* Cores this process may run on: the CPUs in its affinity mask
 * (sched_getaffinity), capped by the cgroup's quota (cgroup v2 cpu.max, or
 * v1 cpu.cfs_quota_us / cpu.cfs_period_us), rounded up; at least 1. */
int cpu_cores_usable(void);

/* The threads local rank local_rank of local_world_size on this host computes
 * with: OMP_NUM_THREADS when it is set (the user's or the launcher's choice,
 * as torchrun sets it), else its share of cpu_cores_usable() (the remainder to
 * the lowest ranks), at least 1. *why, when not NULL, says where the number
 * came from, for the log. */
int cpu_threads_for_rank(int local_rank, int local_world_size, const char **why);

/* The quota part of cpu_cores_usable, from a cgroup v2 cpu.max line ("max
 * 100000" or "150000 100000") or v1's quota and period: 0 when unlimited or
 * unreadable. For the tests. */
int cpu_quota_cores(const char *cpu_max_line, long v1_quota, long v1_period);

#endif
