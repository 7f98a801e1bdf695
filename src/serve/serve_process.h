/* serve_process.h — `colt serve` started by `colt train` itself (the
 * one-command form of server mode, server_devices): this same executable as
 * a child process on chosen GPUs, bound to 127.0.0.1 on a free port, with
 * the trainer's API key in its environment, its output in a log file,
 * stopped when training ends. The child has its own
 * process group (a Ctrl-C meant for the trainer does not drain it mid-step)
 * and dies with the trainer (PR_SET_PDEATHSIG): no orphan server.
 * Not the server itself (cli/cmd_serve.c), not the client (serve_client.h). */
#ifndef COLT_SERVE_SERVE_PROCESS_H
#define COLT_SERVE_SERVE_PROCESS_H

#include <stdbool.h>
#include <sys/types.h>

typedef struct ServeProcessOptions {
    const char *model;
    const char *device;          /* colt serve's --device: "cuda" or "cpu" */
    const char *cuda_visible;    /* CUDA_VISIBLE_DEVICES for the child ("7", "6,7"), or NULL: inherited */
    bool deterministic;
    double gpu_memory_utilization; /* 0: colt serve's default (what is free) */
    int max_model_len;           /* 0: the model's */
    int max_num_seqs;            /* 0: colt serve's default */
    int tensor_parallel_size;    /* > 1: colt serve --tensor_parallel_size (it starts one process per part,
                                  * on the visible GPUs in order) */
    const char *log_path;
    double timeout_s;            /* bound on the wait for its "listening" line */
    const char *api_key;         /* handed to the child as COLT_API_KEY (its environment: ps shows argv) */
} ServeProcessOptions;

typedef struct ServeProcess {
    pid_t pid;  /* 0: none */
    int port;
} ServeProcess;

/* Starts it and waits until it listens. Errors: it could not start, it exited
 * (err carries the last line of its log), or it did not listen within timeout_s
 * (it is then stopped). */
int serve_process_start(ServeProcess *p, const ServeProcessOptions *o, char *err);
/* Its two halves, so several servers (data-parallel replicas) load at once:
 * starting it, and waiting until it listens (stopped when it does not). */
int serve_process_spawn(ServeProcess *p, const ServeProcessOptions *o, char *err);
int serve_process_wait(ServeProcess *p, const ServeProcessOptions *o, char *err);
/* SIGTERM, then SIGKILL after grace_s; waits for it. Nothing when none runs. */
void serve_process_stop(ServeProcess *p, double grace_s);
/* The same for p[n] at once (one grace period for all). */
void serve_process_stop_all(ServeProcess *p, int n, double grace_s);

#endif
