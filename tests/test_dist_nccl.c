/* test_dist_nccl.c — the NCCL communicator on one GPU (what a one-GPU machine
 * can check): every op through real NCCL calls on a world of one (the kind
 * forced, so NCCL runs instead of the self communicator), device buffers on a
 * stream, comm_wait and barrier; the self communicator of a GPU rank (device
 * copies); and a bounded setup: rank 0 of a world of two whose rank 1 never
 * comes must fail after the timeout with a message, not hang. With two GPUs,
 * two forked ranks: the sums over ranks, a hung peer, an aborting peer, and
 * comm_cancel of an op the peer never joins.
 * Skips (77) in builds without NCCL and on machines without a GPU; the
 * two-rank part needs two GPUs. */
#include <stdio.h>

#ifndef COLT_HAVE_NCCL
int main(void) {
    printf("test_dist_nccl: this build has no NCCL (a CUDA build where nccl.h is found has): skipped\n");
    return 77;
}
#else

#include <arpa/inet.h>
#include <cuda_runtime.h>
#include <nccl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "dist/comm.h"
#include "harness.h"

static void on_alarm(int sig) {
    (void)sig;
    static const char msg[] = "test_dist_nccl: still running after 180 s: a wait is not bounded\n";
    (void)!write(2, msg, sizeof msg - 1);
    _exit(1);
}

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bind(fd, (struct sockaddr *)&a, sizeof a);
    socklen_t sl = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &sl);
    close(fd);
    return ntohs(a.sin_port);
}

/* Every op on device buffers; with one rank each result equals its input. */
static void check_ops_on_gpu(Comm *c, const char *label) {
    char err[ERR_LEN] = "";
    const size_t n = 1u << 20;
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    float *hf = malloc(n * sizeof *hf), *back = malloc(n * sizeof *back);
    int64_t hl[5] = {1, -2, (int64_t)1 << 40, 7, 0};
    for (size_t i = 0; i < n; i++) hf[i] = 0.5f * (float)(i % 4096) - 3.0f;
    float *df, *dout;
    int64_t *dl;
    cudaMalloc((void **)&df, n * sizeof *df);
    cudaMalloc((void **)&dout, n * sizeof *dout);
    cudaMalloc((void **)&dl, sizeof hl);
    cudaMemcpy(df, hf, n * sizeof *hf, cudaMemcpyHostToDevice);
    cudaMemcpy(dl, hl, sizeof hl, cudaMemcpyHostToDevice);

    CHECK(comm_all_reduce(c, df, n, COMM_FLOAT32, stream, err) == COLT_OK, "[%s] all_reduce fp32: %s", label, err);
    CHECK(comm_all_reduce(c, dl, 5, COMM_INT64, stream, err) == COLT_OK, "[%s] all_reduce int64: %s", label, err);
    CHECK(comm_reduce_scatter(c, dout, df, n, COMM_FLOAT32, stream, err) == COLT_OK, "[%s] reduce_scatter: %s", label, err);
    CHECK(comm_wait(c, stream, err) == COLT_OK, "[%s] wait: %s", label, err);
    cudaMemcpy(back, dout, n * sizeof *back, cudaMemcpyDeviceToHost);
    CHECK(!memcmp(back, hf, n * sizeof *hf), "[%s] all_reduce + reduce_scatter over one rank changed the data", label);
    int64_t lback[5];
    cudaMemcpy(lback, dl, sizeof lback, cudaMemcpyDeviceToHost);
    CHECK(!memcmp(lback, hl, sizeof hl), "[%s] all_reduce int64 over one rank changed the data", label);

    cudaMemset(dout, 0, n * sizeof *dout);
    CHECK(comm_all_gather(c, dout, df, n, COMM_FLOAT32, stream, err) == COLT_OK, "[%s] all_gather: %s", label, err);
    CHECK(comm_broadcast(c, dout, 16, COMM_BYTE, 0, stream, err) == COLT_OK, "[%s] broadcast: %s", label, err);
    CHECK(comm_wait(c, stream, err) == COLT_OK, "[%s] wait: %s", label, err);
    cudaMemcpy(back, dout, n * sizeof *back, cudaMemcpyDeviceToHost);
    CHECK(!memcmp(back, hf, n * sizeof *hf), "[%s] all_gather over one rank is not a copy", label);
    CHECK(comm_barrier(c, err) == COLT_OK, "[%s] barrier: %s", label, err);
    CHECK(comm_wait(c, stream, err) == COLT_OK, "[%s] a wait with nothing pending: %s", label, err);

    cudaFree(df);
    cudaFree(dout);
    cudaFree(dl);
    free(hf);
    free(back);
    cudaStreamDestroy(stream);
}

/* ---------------------------------------------------------------- two GPUs */

/* One of two ranks on GPUs 0 and 1, as torchrun starts them (store on
 * 127.0.0.1). The ops must give the sums over both ranks; then rank 1 hangs
 * (mode "hang": rank 0's wait must time out after 5 s) or aborts (mode
 * "abort": rank 0 must stop within a few seconds, through NCCL's error or the
 * store's abort key, well before its 20 s timeout). Exit: 77 fewer than two
 * GPUs, 2 setup, 3 wrong sums, 4 wrong failure, 1 comm_abort after the
 * expected failure. */
static void nccl_rank(int rank, int port, const char *mode) {
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 2) _exit(77);
    double timeout = !strcmp(mode, "hang") ? 5.0 : 20.0;
    LaunchEnv env = {.launcher = LAUNCHER_TORCHRUN, .rank = rank, .world_size = 2, .local_rank = rank,
                     .local_world_size = 2, .master_port = port};
    snprintf(env.master_addr, sizeof env.master_addr, "127.0.0.1");
    char err[ERR_LEN] = "", host[64];
    gethostname(host, sizeof host);
    host[63] = '\0';
    Store *store = NULL;
    Comm *c = NULL;
    CommOptions opt = {.kind = COMM_AUTO, .gpu = true, .cuda_device = -1, .timeout_s = timeout};
    if (store_open_for_launch(&store, &env, timeout, err) != COLT_OK) goto setup_failed;
    opt.store = store;
    if (comm_open(&c, &env, &opt, err) != COLT_OK) goto setup_failed;
    cudaStream_t stream;
    cudaStreamCreate(&stream);
    const size_t n = 1u << 20;
    float *h = malloc(2 * n * sizeof *h), *d, *dout;
    int64_t hl[3] = {(int64_t)(rank + 1) << 40, -rank, 5}, *dl;
    for (size_t i = 0; i < 2 * n; i++) h[i] = (float)(rank + 1) + 0.5f * (float)(i % 4096);
    cudaMalloc((void **)&d, 2 * n * sizeof *d);
    cudaMalloc((void **)&dout, 2 * n * sizeof *dout);
    cudaMalloc((void **)&dl, sizeof hl);
    cudaMemcpy(d, h, 2 * n * sizeof *h, cudaMemcpyHostToDevice);
    cudaMemcpy(dl, hl, sizeof hl, cudaMemcpyHostToDevice);
    CHECK(comm_reduce_scatter(c, dout, d, n, COMM_FLOAT32, stream, err) == COLT_OK, "reduce_scatter: %s", err);
    CHECK(comm_all_reduce(c, d, 2 * n, COMM_FLOAT32, stream, err) == COLT_OK, "all_reduce: %s", err);
    CHECK(comm_all_reduce(c, dl, 3, COMM_INT64, stream, err) == COLT_OK, "all_reduce int64: %s", err);
    CHECK(comm_wait(c, stream, err) == COLT_OK, "wait: %s", err);
    float *back = malloc(2 * n * sizeof *back);
    cudaMemcpy(back, d, 2 * n * sizeof *back, cudaMemcpyDeviceToHost);
    size_t bad = 0;
    for (size_t i = 0; i < 2 * n; i++) bad += back[i] != 3.0f + 1.0f * (float)(i % 4096);
    cudaMemcpy(back, dout, n * sizeof *back, cudaMemcpyDeviceToHost);
    for (size_t k = 0; k < n; k++) bad += back[k] != 3.0f + 1.0f * (float)(((size_t)rank * n + k) % 4096);
    int64_t lback[3];
    cudaMemcpy(lback, dl, sizeof lback, cudaMemcpyDeviceToHost);
    bad += lback[0] != (int64_t)3 << 40 || lback[1] != -1 || lback[2] != 10;
    /* all_gather: each rank's first n floats (its own values) in rank order. */
    cudaMemcpy(d, h, n * sizeof *h, cudaMemcpyHostToDevice);
    CHECK(comm_all_gather(c, dout, d, n, COMM_FLOAT32, stream, err) == COLT_OK, "all_gather: %s", err);
    char msg[16] = "";
    if (rank == 1) snprintf(msg, sizeof msg, "from rank 1");
    cudaMemcpy(dl, msg, sizeof msg, cudaMemcpyHostToDevice);
    CHECK(comm_broadcast(c, dl, sizeof msg, COMM_BYTE, 1, stream, err) == COLT_OK, "broadcast: %s", err);
    CHECK(comm_wait(c, stream, err) == COLT_OK, "wait: %s", err);
    CHECK(comm_barrier(c, err) == COLT_OK, "barrier: %s", err);
    cudaMemcpy(back, dout, 2 * n * sizeof *back, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < 2 * n; i++) bad += back[i] != (float)(i / n + 1) + 0.5f * (float)((i % n) % 4096);
    cudaMemcpy(msg, dl, sizeof msg, cudaMemcpyDeviceToHost);
    bad += strcmp(msg, "from rank 1") != 0;
    /* reduce in place to rank 1: its buffer holds the sum */
    cudaMemcpy(d, h, n * sizeof *h, cudaMemcpyHostToDevice);
    CHECK(comm_reduce(c, d, n, COMM_FLOAT32, 1, stream, err) == COLT_OK, "reduce: %s", err);
    CHECK(comm_wait(c, stream, err) == COLT_OK, "wait: %s", err);
    if (rank == 1) {
        cudaMemcpy(back, d, n * sizeof *back, cudaMemcpyDeviceToHost);
        for (size_t k = 0; k < n; k++) bad += back[k] != 3.0f + 1.0f * (float)(k % 4096);
    }
    CHECK(!bad, "rank %d: %zu results wrong over two GPUs", rank, bad);
    if (g_failures) _exit(3);
    printf("nccl, two GPUs, rank %d: sums, reduce, gathers, broadcast and barrier right\n", rank);
    fflush(stdout);
    if (store_barrier(store, "ops-done", err) != COLT_OK) goto setup_failed;

    if (!strcmp(mode, "cancel")) {
        /* Rank 0 enqueues an all_reduce rank 1 never joins (as after an error
         * only one rank saw), drops it with comm_cancel, and closes: at once. */
        if (rank == 1) {
            void *v = NULL;
            size_t len = 0;
            int got = store_get(store, &v, &len, "cancelled", err);
            free(v);
            _exit(got == COLT_OK ? 1 : 2);
        }
        double t0 = now_s();
        int rc = comm_all_reduce(c, d, n, COMM_FLOAT32, stream, err);
        usleep(200000);
        comm_cancel(c);
        int wait_rc = comm_wait(c, stream, err);
        comm_close(c);
        cudaError_t e = cudaStreamSynchronize(stream); /* the dropped kernel is gone from the stream */
        double took = now_s() - t0;
        store_set(store, "cancelled", "1", 1, err);
        if (rc != COLT_OK || wait_rc != COLT_ERR || took > 5.0) {
            fprintf(stderr, "rank 0, mode cancel: rc %d, wait after cancel %d, stream %s, %.1f s\n", rc, wait_rc,
                    cudaGetErrorString(e), took);
            _exit(4);
        }
        printf("EXPECTED-FAILURE-SEEN (cancel): an all_reduce the peer never joined dropped and closed in %.2f s "
               "(stream: %s)\n", took, cudaGetErrorString(e));
        fflush(stdout);
        _exit(1);
    }
    if (rank == 1) {
        if (!strcmp(mode, "hang")) for (;;) pause();
        comm_abort(c, "simulated failure on rank 1");
    }
    double t0 = now_s();
    int rc = comm_all_reduce(c, d, n, COMM_FLOAT32, stream, err);
    if (rc == COLT_OK) rc = comm_wait(c, stream, err);
    double took = now_s() - t0;
    char prefix[160], want[ERR_LEN], aborted[ERR_LEN];
    snprintf(prefix, sizeof prefix, "rank 0 on host %s: all_reduce of 1048576 floats ", host);
    snprintf(want, sizeof want, "%sdid not complete within 5 s (a rank died or hung?)", prefix);
    snprintf(aborted, sizeof aborted, "%sstopped: another rank aborted the job (rank 1 on host %s: simulated failure on rank 1)",
             prefix, host);
    /* An aborting peer: the store's abort key (polled each second) or NCCL's own error, well before the 20 s timeout. */
    bool ok = rc == COLT_ERR && (!strcmp(mode, "hang") ? !strcmp(err, want) && took >= 4.5 && took < 10.0
                                                        : (!strcmp(err, aborted) || strstr(err, " failed")) &&
                                                              !strncmp(err, prefix, strlen(prefix)) && took < 10.0);
    if (!ok) {
        fprintf(stderr, "rank 0, mode %s: wrong failure after %.1f s: rc %d \"%s\"\n", mode, took, rc, err);
        _exit(4);
    }
    printf("EXPECTED-FAILURE-SEEN (%s) after %.1f s: %s\n", mode, took, err);
    fflush(stdout);
    comm_abort(c, err);
setup_failed:
    fprintf(stderr, "rank %d: %s\n", rank, err);
    _exit(2);
}

/* Returns 0 pass, 77 skipped (fewer than two GPUs), 1 failed. */
static int run_two_ranks(const char *mode) {
    int port = free_port();
    fflush(stdout);
    pid_t pids[2];
    for (int r = 0; r < 2; r++)
        if ((pids[r] = fork()) == 0) nccl_rank(r, port, mode);
    int status[2] = {0, 0};
    double t0 = now_s();
    for (int r = 0; r < 2; r++) {
        for (;;) {
            if (waitpid(pids[r], &status[r], WNOHANG) == pids[r]) break;
            bool give_up = now_s() - t0 > 60.0 || (r == 1 && !strcmp(mode, "hang"));
            if (give_up) {
                kill(pids[r], SIGKILL);
                waitpid(pids[r], &status[r], 0);
                break;
            }
            usleep(10000);
        }
    }
    int s0 = WIFEXITED(status[0]) ? WEXITSTATUS(status[0]) : -1;
    if (s0 == 77) return 77;
    CHECK(s0 == 1, "two GPUs, mode %s: rank 0 ended with %d, want 1 (comm_abort after the expected failure)", mode, s0);
    if (!strcmp(mode, "abort"))
        CHECK(WIFEXITED(status[1]) && WEXITSTATUS(status[1]) == 1, "two GPUs, mode abort: rank 1 did not end in comm_abort");
    return s0 == 1 ? 0 : 1;
}

int main(void) {
    signal(SIGALRM, on_alarm);
    alarm(180);
    /* Two ranks first, forked before this process touches CUDA (a process that
     * initialized CUDA cannot fork children that use it). */
    if (run_two_ranks("hang") != 77) {
        run_two_ranks("abort");
        run_two_ranks("cancel");
    }
    else printf("nccl, two GPUs: fewer than two GPUs here, skipped\n");
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices < 1) {
        printf("test_dist_nccl: no GPU here: skipped\n");
        return 77;
    }
    double t0 = now_s();
    char err[ERR_LEN] = "", host[64], want[ERR_LEN];
    gethostname(host, sizeof host);
    host[63] = '\0';

    /* NCCL itself, on a world of one. */
    LaunchEnv one = {.launcher = LAUNCHER_NONE, .world_size = 1, .local_world_size = 1};
    CommOptions opt = {.kind = COMM_NCCL, .gpu = true, .cuda_device = 0, .timeout_s = 30};
    Comm *c = NULL;
    double t = now_s();
    CHECK(comm_open(&c, &one, &opt, err) == COLT_OK, "open NCCL on one GPU: %s", err);
    printf("nccl, one rank: open in %.2f s\n", now_s() - t);
    if (c) {
        CHECK(comm_kind(c) == COMM_NCCL, "got %s", comm_kind_name(comm_kind(c)));
        check_ops_on_gpu(c, "nccl");
        comm_close(c);
    }

    /* The self communicator of a GPU rank: device-to-device copies. */
    opt.kind = COMM_AUTO;
    c = NULL;
    CHECK(comm_open(&c, &one, &opt, err) == COLT_OK, "open self on a GPU: %s", err);
    if (c) {
        CHECK(comm_kind(c) == COMM_SELF, "a GPU world of one got %s", comm_kind_name(comm_kind(c)));
        check_ops_on_gpu(c, "self");
        comm_close(c);
    }

    /* A world of two whose rank 1 never comes: NCCL's setup must give up. */
    LaunchEnv two = {.launcher = LAUNCHER_TORCHRUN, .rank = 0, .world_size = 2, .local_rank = 0, .local_world_size = 2,
                     .master_port = free_port()};
    snprintf(two.master_addr, sizeof two.master_addr, "127.0.0.1");
    opt = (CommOptions){.kind = COMM_AUTO, .gpu = true, .cuda_device = 0, .timeout_s = 5};
    c = NULL;
    t = now_s();
    CHECK(comm_open(&c, &two, &opt, err) == COLT_ERR, "NCCL opened a world of two with one rank");
    double took = now_s() - t;
    snprintf(want, sizeof want, "rank 0 on host %s: NCCL's setup of 2 ranks did not complete within 5 s (a rank died or hung?)", host);
    CHECK(!strcmp(err, want), "setup without rank 1\n  got  \"%s\"\n  want \"%s\"", err, want);
    CHECK(took >= 4.5 && took < 20.0, "setup without rank 1 gave up after %.1f s, want about 5 s", took);
    printf("nccl, rank 1 missing: gave up after %.1f s: %s\n", took, err);

    int version = 0;
    ncclGetVersion(&version);
    printf("test_dist_nccl: NCCL %d, %d checks, %d failures (%.1f s)\n", version, g_checks, g_failures, now_s() - t0);
    return g_failures ? 1 : 0;
}
#endif
