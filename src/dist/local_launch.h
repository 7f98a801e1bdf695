/* local_launch.h — colt as its own launcher on one node: `colt train` with
 * several GPUs (or --nproc_per_node K) starts one process per rank itself, as
 * torchrun would, so no launcher or accelerate config is needed.
 *
 * The children get torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, GROUP_RANK=0, MASTER_ADDR=127.0.0.1, MASTER_PORT = a free
 * port) and rank 0 serves the rendezvous store there. The parent forwards
 * SIGINT/SIGTERM to every child and waits; when one child fails, the others
 * are stopped (SIGTERM, then SIGKILL after a grace period) and the parent exits
 * with the first failure's status. The children die with the parent (a
 * SIGKILL from the kernel when it exits, even by kill -9), so no rank trains on
 * alone. Not a general process manager: one node, no restarts. */
#ifndef COLT_DIST_LOCAL_LAUNCH_H
#define COLT_DIST_LOCAL_LAUNCH_H

/* Runs nproc copies of the program argv (argv[0] is resolved through
 * /proc/self/exe, so the same binary runs) and waits for all of them. Returns
 * the exit status to use (0 when every rank exited 0), or -1 with err set when
 * the processes could not be started. */
int local_launch_run(int nproc, char *const *argv, char *err);

/* A port on 127.0.0.1 that was free a moment ago (whoever needs it binds it
 * next), or -1 with err set. */
int local_launch_free_port(char *err);

/* True in a process that local_launch_run started (it must not launch again). */
int local_launch_is_child(void);

#endif
