/* bench_weight_sync.c — the trainer-to-server weight push (parallel/weight_sync.h)
 * on Qwen2.5 shapes in bf16: seconds per push and GB/s, against the path's
 * limit. Two processes: the trainer and one server rank.
 * - host path (Gloo through pinned buckets): both on GPU 0, what a server and a
 *   trainer sharing one GPU use; bound by the device-to-host copy, the loopback
 *   broadcast and the host-to-device copy in turn (no overlap between them);
 * - NCCL (when the machine has 2+ GPUs): trainer on GPU 1, server on GPU 0;
 *   bound by NVLink's 450 GB/s per direction.
 * Usage: bench_weight_sync [0.5b|1.5b|7b ...] (default 0.5b 1.5b); COLT_PUSHES (3). */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "bench_gpu_shapes.h"
#include "core/error.h"
#include "parallel/weight_sync.h"

static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bind(fd, (struct sockaddr *)&a, sizeof a);
    socklen_t sl = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &sl);
    close(fd);
    return ntohs(a.sin_port);
}

/* One member: pushes (trainer) or receives `pushes` times; the trainer writes
 * the fastest push's seconds and the bytes to fd. */
static void member(int rank, const Shape *s, bool nccl, int port, int pushes, int fd) {
    char err[ERR_LEN];
    Backend *be = backend_cuda_open(nccl ? 1 - rank : 0, DTYPE_BF16, err); /* NCCL: trainer (rank 1) on GPU 0 */
    Model *m = NULL;
    ModelConfig cfg = shape_config(s);
    if (!be || model_create_random(&m, &cfg, 1 + (uint64_t)rank, be, err) != 0) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        _exit(2);
    }
    WeightSyncOptions o = {.host = "127.0.0.1", .port = port, .rank = rank, .world_size = 2, .be = be,
                           .kind = nccl ? COMM_NCCL : COMM_GLOO, .use_nccl = nccl, .cuda_device = be->device,
                           .timeout_s = 300};
    WeightSync *w = NULL;
    if (weight_sync_open(&w, &o, err) != 0) {
        fprintf(stderr, "rank %d: %s\n", rank, err);
        _exit(2);
    }
    double best = 1e30;
    size_t bytes = 0;
    for (int p = 0; p < pushes; p++) {
        int rc = rank == 1 ? weight_sync_send(w, m, err) : weight_sync_recv(w, m, err);
        if (rc != 0) {
            fprintf(stderr, "rank %d: %s\n", rank, err);
            _exit(2);
        }
        double secs;
        weight_sync_last(w, &bytes, &secs);
        if (secs < best) best = secs;
    }
    if (rank == 1) {
        double out[2] = {(double)bytes, best};
        if (write(fd, out, sizeof out) != sizeof out) _exit(2);
    }
    weight_sync_close(w);
    model_free(m);
    backend_close(be);
    _exit(0);
}

static int run(const Shape *s, bool nccl, int pushes) {
    int pipefd[2];
    if (pipe(pipefd) != 0) return 1;
    int port = free_port();
    fflush(stdout);
    pid_t pids[2];
    for (int r = 0; r < 2; r++)
        if ((pids[r] = fork()) == 0) member(r, s, nccl, port, pushes, pipefd[1]);
    int bad = 0;
    for (int r = 0; r < 2; r++) {
        int status = 0;
        waitpid(pids[r], &status, 0);
        bad += !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    }
    double got[2] = {0, 0};
    if (bad || read(pipefd[0], got, sizeof got) != sizeof got) {
        printf("| %s | %s | failed | | | | |\n", s->name, nccl ? "NCCL (2 GPUs)" : "host (1 GPU)");
        return 1;
    }
    close(pipefd[0]);
    close(pipefd[1]);
    double gbps = got[0] / got[1] / 1e9;
    printf("| %s | %s | %.2f | %.3f | %.1f | %s | %s |\n", s->name, nccl ? "NCCL (2 GPUs)" : "host (1 GPU)",
           got[0] / 1e9, got[1], gbps, nccl ? "450 (NVLink)" : "see below",
           nccl ? "" : "D2H + loopback + H2D in turn");
    return 0;
}

int main(int argc, char **argv) {
    int pushes = getenv("COLT_PUSHES") ? atoi(getenv("COLT_PUSHES")) : 3;
    /* counted in a child: CUDA initialised in this process would not work in the members forked later */
    int gpus = 0;
    pid_t probe = fork();
    if (probe == 0) _exit(backend_cuda_device_count());
    int status = 0;
    if (probe > 0 && waitpid(probe, &status, 0) == probe && WIFEXITED(status)) gpus = WEXITSTATUS(status);
    if (gpus < 1) {
        printf("bench_weight_sync: no GPU\n");
        return 1;
    }
    printf("Command: bench_weight_sync");
    for (int i = 1; i < argc; i++) printf(" %s", argv[i]);
    printf(" (COLT_PUSHES=%d; fastest push of %d; %d GPU%s)\n\n", pushes, pushes, gpus, gpus == 1 ? "" : "s");
    printf("| shape | path | GB per push | s per push | GB/s | limit GB/s | note |\n|---|---|---:|---:|---:|---|---|\n");
    const char *defaults[] = {"0.5b", "1.5b"};
    int n = argc > 1 ? argc - 1 : 2, bad = 0;
    for (int i = 0; i < n; i++) {
        const Shape *s = shape_by_name(argc > 1 ? argv[i + 1] : defaults[i]);
        if (!s) {
            fprintf(stderr, "bench_weight_sync: unknown shape '%s' (0.5b, 1.5b, 7b)\n", argv[i + 1]);
            return 1;
        }
        bad += run(s, false, pushes);
        if (gpus >= 2 && comm_built(COMM_NCCL)) bad += run(s, true, pushes);
    }
    return bad ? 1 : 0;
}
