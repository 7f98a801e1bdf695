/* test_dist_comm.c — every communicator op against the sums and gathers it
 * must produce: all_reduce (fp32, fp64, int64; 1, 7, 1000 and 2^20 elements),
 * reduce (fp32, fp64, to the first and the last rank), reduce_scatter (fp32,
 * int64), all_gather (fp32, bytes), broadcast (bytes, fp64, from the first and
 * the last rank), barrier.
 *
 * Run plainly it g_checks the world-of-one communicator, argument errors, the
 * backend policy (comm_choose_kind) and, where Gloo is built, forks 2 and 4
 * ranks on 127.0.0.1 as torchrun would and runs the same ops over Gloo, then a
 * rank that exits early and a rank that hangs: the others must fail within the
 * timeout with a message naming the op, their rank and host.
 *
 * Under mpirun (tests/dist_comm.sh) it runs the ops over MPI on every rank;
 * with --fail=exit or --fail=hang, rank 1 exits early or hangs and the others
 * must report the timeout (--timeout=S, default 5) and abort the job.
 * --backends prints the backends this build has. */
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <netinet/in.h>
#include <arpa/inet.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "dist/comm.h"
#include "harness.h"

#ifdef COLT_HAVE_MPI
#define COMM_HAS_MPI 1
#else
#define COMM_HAS_MPI 0
#endif
#ifdef COLT_HAVE_GLOO
#define COMM_HAS_GLOO 1
#else
#define COMM_HAS_GLOO 0
#endif
#ifdef COLT_HAVE_NCCL
#define COMM_HAS_NCCL 1
#else
#define COMM_HAS_NCCL 0
#endif

static const char *who = "test"; /* "rank 2 (gloo, 4 ranks)" in ranks, for messages */

/* ---------------------------------------------------------------- the ops */

/* Values chosen so every sum is exact in its type (fp32 up to 2^24). */
static void check_all_reduce(Comm *c, size_t n) {
    int r = comm_rank(c), w = comm_world_size(c);
    char err[ERR_LEN] = "";
    float *f = malloc(n * sizeof *f);
    double *d = malloc(n * sizeof *d);
    int64_t *l = malloc(n * sizeof *l);
    for (size_t i = 0; i < n; i++) {
        f[i] = (float)(r + 1) + 0.5f * (float)(i % 4096);
        d[i] = (double)r * 1e10 + (double)i;
        l[i] = ((int64_t)r << 40) + (int64_t)i;
    }
    CHECK(comm_all_reduce(c, f, n, COMM_FLOAT32, NULL, err) == COLT_OK, "all_reduce fp32 x%zu: %s", n, err);
    CHECK(comm_all_reduce(c, d, n, COMM_FLOAT64, NULL, err) == COLT_OK, "all_reduce fp64 x%zu: %s", n, err);
    CHECK(comm_all_reduce(c, l, n, COMM_INT64, NULL, err) == COLT_OK, "all_reduce int64 x%zu: %s", n, err);
    size_t bad_f = 0, bad_d = 0, bad_l = 0;
    int64_t ranks_sum = (int64_t)w * (w - 1) / 2;
    for (size_t i = 0; i < n; i++) {
        float want_f = (float)(w * (w + 1) / 2) + (float)w * 0.5f * (float)(i % 4096);
        double want_d = (double)ranks_sum * 1e10 + (double)w * (double)i;
        int64_t want_l = (ranks_sum << 40) + (int64_t)w * (int64_t)i;
        bad_f += f[i] != want_f;
        bad_d += d[i] != want_d;
        bad_l += l[i] != want_l;
    }
    CHECK(!bad_f && !bad_d && !bad_l, "all_reduce x%zu over %d ranks: %zu fp32, %zu fp64, %zu int64 elements wrong "
          "(fp32[last]=%g)", n, w, bad_f, bad_d, bad_l, (double)f[n - 1]);
    free(f);
    free(d);
    free(l);
}

static void check_reduce_scatter(Comm *c, size_t n) {
    int r = comm_rank(c), w = comm_world_size(c);
    char err[ERR_LEN] = "";
    float *in = malloc((size_t)w * n * sizeof *in), *out = malloc(n * sizeof *out);
    int64_t *lin = malloc((size_t)w * n * sizeof *lin), *lout = malloc(n * sizeof *lout);
    for (size_t j = 0; j < (size_t)w * n; j++) {
        in[j] = (float)(r + 1) * (float)(j % 1000 + 1);
        lin[j] = (int64_t)(r + 1) * ((int64_t)j + 1) * 1000003;
    }
    CHECK(comm_reduce_scatter(c, out, in, n, COMM_FLOAT32, NULL, err) == COLT_OK, "reduce_scatter fp32: %s", err);
    CHECK(comm_reduce_scatter(c, lout, lin, n, COMM_INT64, NULL, err) == COLT_OK, "reduce_scatter int64: %s", err);
    size_t bad = 0;
    int64_t tri = (int64_t)w * (w + 1) / 2;
    for (size_t k = 0; k < n; k++) {
        size_t j = (size_t)r * n + k;
        bad += out[k] != (float)tri * (float)(j % 1000 + 1);
        bad += lout[k] != tri * ((int64_t)j + 1) * 1000003;
    }
    CHECK(!bad, "reduce_scatter x%zu over %d ranks: %zu elements wrong", n, w, bad);
    free(in);
    free(out);
    free(lin);
    free(lout);
}

/* reduce to root: root's buffer holds the sum (the others' is unspecified). */
static void check_reduce(Comm *c, size_t n) {
    int r = comm_rank(c), w = comm_world_size(c);
    char err[ERR_LEN] = "";
    float *f = malloc(n * sizeof *f);
    double *d = malloc(n * sizeof *d);
    for (int root = 0; root < w; root += (w > 1 ? w - 1 : 1)) {
        for (size_t k = 0; k < n; k++) f[k] = (float)(r + 1) * (float)(k % 1000 + 1), d[k] = (double)(r + 1) * 1e-3 * (double)k;
        CHECK(comm_reduce(c, f, n, COMM_FLOAT32, root, NULL, err) == COLT_OK, "reduce fp32 to %d: %s", root, err);
        CHECK(comm_reduce(c, d, n, COMM_FLOAT64, root, NULL, err) == COLT_OK, "reduce fp64 to %d: %s", root, err);
        if (r == root) {
            size_t bad = 0;
            double tri = (double)w * (w + 1) / 2;
            for (size_t k = 0; k < n; k++) {
                bad += f[k] != (float)tri * (float)(k % 1000 + 1);
                bad += fabs(d[k] - tri * 1e-3 * (double)k) > 1e-9 * (double)(k + 1);
            }
            CHECK(!bad, "reduce x%zu to rank %d over %d ranks: %zu elements wrong", n, root, w, bad);
        }
        if (w == 1) break;
    }
    free(f);
    free(d);
}

static void check_all_gather(Comm *c, size_t n) {
    int r = comm_rank(c), w = comm_world_size(c);
    char err[ERR_LEN] = "";
    float *in = malloc(n * sizeof *in), *out = malloc((size_t)w * n * sizeof *out);
    for (size_t k = 0; k < n; k++) in[k] = (float)(r * 1000 + (int)(k % 1000));
    CHECK(comm_all_gather(c, out, in, n, COMM_FLOAT32, NULL, err) == COLT_OK, "all_gather fp32: %s", err);
    size_t bad = 0;
    for (int s = 0; s < w; s++)
        for (size_t k = 0; k < n; k++) bad += out[(size_t)s * n + k] != (float)(s * 1000 + (int)(k % 1000));
    CHECK(!bad, "all_gather fp32 x%zu over %d ranks: %zu elements wrong", n, w, bad);
    char name[8] = {0}, *names = calloc((size_t)w, 8);
    snprintf(name, sizeof name, "rank%u", (unsigned)r % 1000u);
    CHECK(comm_all_gather(c, names, name, 8, COMM_BYTE, NULL, err) == COLT_OK, "all_gather bytes: %s", err);
    for (int s = 0; s < w; s++) {
        char want[8] = {0};
        snprintf(want, sizeof want, "rank%u", (unsigned)s % 1000u);
        CHECK(!memcmp(names + 8 * s, want, 8), "all_gather bytes: block %d is '%.8s', want '%s'", s, names + 8 * s, want);
    }
    free(in);
    free(out);
    free(names);
}

static void check_broadcast(Comm *c) {
    int r = comm_rank(c), w = comm_world_size(c);
    char err[ERR_LEN] = "";
    for (int root = 0; root < w; root += (w > 1 ? w - 1 : 1)) {
        char msg[32] = {0};
        if (r == root) snprintf(msg, sizeof msg, "hello from rank %d", root);
        CHECK(comm_broadcast(c, msg, sizeof msg, COMM_BYTE, root, NULL, err) == COLT_OK, "broadcast bytes: %s", err);
        char want[32] = {0};
        snprintf(want, sizeof want, "hello from rank %d", root);
        CHECK(!memcmp(msg, want, sizeof msg), "broadcast from %d: got '%s'", root, msg);
        double v[3] = {0, 0, 0};
        if (r == root) v[0] = 1.5, v[1] = -2e300, v[2] = (double)root;
        CHECK(comm_broadcast(c, v, 3, COMM_FLOAT64, root, NULL, err) == COLT_OK, "broadcast fp64: %s", err);
        CHECK(v[0] == 1.5 && v[1] == -2e300 && v[2] == (double)root, "broadcast fp64 from %d: %g %g %g", root, v[0], v[1], v[2]);
        if (w == 1) break;
    }
}

/* comm_split into the even and odd ranks (keys reversed, so group ranks run
 * backwards): each group's size and ranks, and a sum that stays in it. */
static void check_split(Comm *c) {
    char err[ERR_LEN] = "";
    int rank = comm_rank(c), world = comm_world_size(c), color = rank % 2;
    Comm *g = NULL;
    CHECK(comm_split(c, color, -rank, &g, err) == COLT_OK, "split: %s", err);
    if (!g) return;
    int size = (world - color + 1) / 2, want_rank = size - 1 - rank / 2;
    CHECK(comm_world_size(g) == size && comm_rank(g) == want_rank, "split: rank %d of %d, want %d of %d", comm_rank(g),
          comm_world_size(g), want_rank, size);
    double v = rank, want = 0;
    for (int r = color; r < world; r += 2) want += r;
    CHECK(comm_all_reduce(g, &v, 1, COMM_FLOAT64, NULL, err) == COLT_OK && v == want,
          "all_reduce in the group of color %d: %g, want %g (%s)", color, v, want, err);
    comm_close(g);
    CHECK(comm_split(c, -1, 0, &g, err) == COLT_ERR && strstr(err, "colors are >= 0"), "negative color: %s", err);
}

static void check_all_ops(Comm *c) {
    char err[ERR_LEN] = "";
    check_split(c);
    static const size_t sizes[] = {1, 7, 1000, 1u << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) check_all_reduce(c, sizes[i]);
    check_reduce(c, 1);
    check_reduce(c, 5003);
    check_reduce_scatter(c, 1);
    check_reduce_scatter(c, 4099);
    check_all_gather(c, 3);
    check_all_gather(c, 5000);
    check_broadcast(c);
    for (int i = 0; i < 3; i++) CHECK(comm_barrier(c, err) == COLT_OK, "barrier %d: %s", i, err);
    CHECK(comm_wait(c, NULL, err) == COLT_OK, "wait: %s", err);
    CHECK(comm_all_reduce(c, NULL, 0, COMM_FLOAT32, NULL, err) == COLT_OK, "an empty all_reduce is a no-op: %s", err);
}

/* ---------------------------------------------------------------- one rank */

static void test_self(void) {
    who = "self";
    LaunchEnv env = {.launcher = LAUNCHER_NONE, .world_size = 1, .local_world_size = 1};
    CommOptions opt = {.kind = COMM_AUTO, .timeout_s = 5};
    Comm *c = NULL;
    char err[ERR_LEN] = "", want[ERR_LEN], host[64];
    gethostname(host, sizeof host);
    host[63] = '\0';
    CHECK(comm_open(&c, &env, &opt, err) == COLT_OK, "open self: %s", err);
    if (!c) return;
    CHECK(comm_kind(c) == COMM_SELF, "a world of one got %s", comm_kind_name(comm_kind(c)));
    check_all_ops(c);
    /* Argument errors: each names the op, and leaves the communicator usable. */
    char b[4];
    CHECK(comm_all_reduce(c, b, 4, COMM_BYTE, NULL, err) == COLT_ERR, "a byte sum was accepted");
    snprintf(want, sizeof want, "rank 0 on host %s: all_reduce sums numbers: bytes cannot be summed", host);
    CHECK(!strcmp(err, want), "\n  got  \"%s\"\n  want \"%s\"", err, want);
    CHECK(comm_broadcast(c, b, 4, COMM_BYTE, 1, NULL, err) == COLT_ERR, "a broadcast from rank 1 of 1 was accepted");
    snprintf(want, sizeof want, "rank 0 on host %s: broadcast from rank 1, which is not in 0..0", host);
    CHECK(!strcmp(err, want), "\n  got  \"%s\"\n  want \"%s\"", err, want);
    CHECK(comm_reduce_scatter(c, NULL, b, 4, COMM_FLOAT32, NULL, err) == COLT_ERR, "a NULL buffer was accepted");
    snprintf(want, sizeof want, "rank 0 on host %s: reduce_scatter of 4 elements with a NULL buffer", host);
    CHECK(!strcmp(err, want), "\n  got  \"%s\"\n  want \"%s\"", err, want);
    check_all_reduce(c, 3);
    comm_close(c);

    LaunchEnv two = {.launcher = LAUNCHER_TORCHRUN, .rank = 1, .world_size = 2, .local_rank = 1, .local_world_size = 2};
    opt.kind = COMM_SELF;
    CHECK(comm_open(&c, &two, &opt, err) == COLT_ERR, "self opened for a world of two");
    snprintf(want, sizeof want, "rank 1 on host %s: the self communicator is for a world of one, and this launch has 2 ranks", host);
    CHECK(!strcmp(err, want), "\n  got  \"%s\"\n  want \"%s\"", err, want);
#ifndef COLT_HAVE_CUDA
    opt = (CommOptions){.kind = COMM_AUTO, .gpu = true};
    CHECK(comm_open(&c, &env, &opt, err) == COLT_ERR, "a GPU rank opened in a CPU build");
    snprintf(want, sizeof want, "rank 0 on host %s: a GPU rank needs a CUDA build of colt (configure with -DCOLT_CUDA=ON)", host);
    CHECK(!strcmp(err, want), "\n  got  \"%s\"\n  want \"%s\"", err, want);
#endif
}

/* The backend policy for each kind of launch, as this build has it. */
static void test_choose_kind(void) {
    who = "choose";
    char err[ERR_LEN] = "";
    CommKind k = COMM_AUTO;
    LaunchEnv one = {.world_size = 1, .local_world_size = 1};
    CHECK(comm_choose_kind(&k, &one, true, err) == COLT_OK && k == COMM_SELF, "world of one GPU: %s %s", comm_kind_name(k), err);
    LaunchEnv mpi = {.launcher = LAUNCHER_OPENMPI, .rank = 1, .world_size = 2, .local_world_size = 2, .local_rank = 1};
    LaunchEnv slurm = mpi, torch = mpi;
    slurm.launcher = LAUNCHER_SLURM;
    torch.launcher = LAUNCHER_TORCHRUN;
#ifdef COLT_HAVE_MPI
    CHECK(comm_choose_kind(&k, &mpi, false, err) == COLT_OK && k == COMM_MPI, "mpirun CPU: %s %s", comm_kind_name(k), err);
    CHECK(comm_choose_kind(&k, &slurm, false, err) == COLT_OK && k == COMM_MPI, "srun CPU: %s %s", comm_kind_name(k), err);
#endif
#ifdef COLT_HAVE_NCCL
    CHECK(comm_choose_kind(&k, &torch, true, err) == COLT_OK && k == COMM_NCCL, "torchrun GPU: %s %s", comm_kind_name(k), err);
#else
    CHECK(comm_choose_kind(&k, &torch, true, err) == COLT_ERR && strstr(err, "built without it"), "torchrun GPU, no NCCL: %s", err);
#endif
#ifdef COLT_HAVE_GLOO
    CHECK(comm_choose_kind(&k, &torch, false, err) == COLT_OK && k == COMM_GLOO, "torchrun CPU: %s %s", comm_kind_name(k), err);
#else
    CHECK(comm_choose_kind(&k, &torch, false, err) == COLT_ERR &&
          !strncmp(err, "rank 1: CPU ranks need mpirun or srun with MPI; under torchrun use GPUs", 71), "torchrun CPU: %s", err);
#endif
}

/* ---------------------------------------------------------------- forked ranks (Gloo) */

#ifdef COLT_HAVE_GLOO
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bind(fd, (struct sockaddr *)&a, sizeof a);
    socklen_t sl = sizeof a;
    getsockname(fd, (struct sockaddr *)&a, &sl);
    close(fd);
    return ntohs(a.sin_port);
}

enum { FAIL_NONE, FAIL_EXIT, FAIL_HANG };

/* One rank of a torchrun-like launch on 127.0.0.1 (rank 0 serves the store). */
static void gloo_rank(int rank, int world, int port, int fail, double timeout) {
    static char label[64];
    snprintf(label, sizeof label, "rank %d of %d (gloo)", rank, world);
    who = label;
    LaunchEnv env = {.launcher = LAUNCHER_TORCHRUN, .rank = rank, .world_size = world, .local_rank = rank,
                     .local_world_size = world, .node_rank = 0, .master_port = port};
    snprintf(env.master_addr, sizeof env.master_addr, "127.0.0.1");
    /* The failure runs bring their own store, so that all ranks can agree the
     * communicator is open before rank 1 leaves (a rank that dies during the
     * open fails the others' open instead: right, but not what is tested here). */
    Store *store = NULL;
    char err[ERR_LEN] = "";
    if (fail != FAIL_NONE && store_open_for_launch(&store, &env, timeout, err) != COLT_OK) {
        fprintf(stderr, "[%s] store: %s\n", who, err);
        _exit(2);
    }
    CommOptions opt = {.kind = COMM_AUTO, .timeout_s = timeout, .store = store};
    Comm *c = NULL;
    if (comm_open(&c, &env, &opt, err) != COLT_OK) {
        fprintf(stderr, "[%s] open: %s\n", who, err);
        _exit(2);
    }
    if (store && store_barrier(store, "opened", err) != COLT_OK) {
        fprintf(stderr, "[%s] barrier: %s\n", who, err);
        _exit(2);
    }
    if (fail == FAIL_NONE) {
        CHECK(comm_kind(c) == COMM_GLOO, "torchrun CPU ranks got %s", comm_kind_name(comm_kind(c)));
        check_all_ops(c);
        comm_close(c);
        exit(g_failures ? 1 : 0); /* exit, not _exit: an ASan build g_checks this rank for leaks */
    }
    /* Every other rank says it is past the barrier before rank 1 fails: else
     * rank 0 could see rank 1 gone, abort and take the store it serves down
     * while rank 2 still reads the barrier's answer (it would then fail in the
     * barrier, not in the collective under test). */
    char key[32];
    snprintf(key, sizeof key, "past/%d", rank);
    if (rank != 1 && store_set(store, key, "1", 1, err) != COLT_OK) {
        fprintf(stderr, "[%s] store_set: %s\n", who, err);
        _exit(2);
    }
    if (rank == 1) {
        for (int r = 0; r < world; r++) {
            void *v = NULL;
            size_t len = 0;
            snprintf(key, sizeof key, "past/%d", r);
            if (r != 1 && store_get(store, &v, &len, key, err) != COLT_OK) {
                fprintf(stderr, "[%s] store_get: %s\n", who, err);
                _exit(2);
            }
            free(v);
        }
        if (fail == FAIL_EXIT) _exit(0); /* leaves without a word */
        for (;;) pause();                /* hangs until the test kills it */
    }
    size_t n = 1u << 20;
    float *x = calloc(n, sizeof *x);
    double t0 = now_s();
    int rc = comm_all_reduce(c, x, n, COMM_FLOAT32, NULL, err);
    double took = now_s() - t0;
    free(x);
    char host[64], prefix[128];
    gethostname(host, sizeof host);
    host[63] = '\0';
    snprintf(prefix, sizeof prefix, "rank %d on host %s: all_reduce of 1048576 floats ", rank, host);
    /* A hung peer: every rank times out. A dead peer: its neighbours see the
     * closed connection at once, the others time out or see their neighbours go. */
    bool text_ok = rc == COLT_ERR && !strncmp(err, prefix, strlen(prefix)) &&
                   (strstr(err, "did not complete within") || (fail == FAIL_EXIT && strstr(err, "failed (a rank died?)")));
    if (!text_ok || took > timeout + 15.0) { /* generous: ctest runs tests side by side */
        fprintf(stderr, "[%s] wrong failure after %.1f s: rc %d, \"%s\"\n", who, took, rc, err);
        _exit(3);
    }
    printf("[%s] failed as expected after %.1f s: %s\n", who, took, err);
    fflush(stdout);
    comm_abort(c, err); /* exits with status 1 */
}

static void run_gloo(int world, int fail, double timeout) {
    int port = free_port();
    pid_t pids[8];
    double t0 = now_s();
    fflush(stdout); /* or the children print the parent's buffered lines again */
    fflush(stderr);
    for (int r = 0; r < world; r++) {
        pids[r] = fork();
        if (pids[r] == 0) gloo_rank(r, world, port, fail, timeout);
    }
    const char *mode = fail == FAIL_NONE ? "ops" : fail == FAIL_EXIT ? "a rank exits early" : "a rank hangs";
    int want = fail == FAIL_NONE ? 0 : 1; /* survivors of a failure end in comm_abort: status 1 */
    double limit = fail == FAIL_NONE ? 120.0 : timeout + 20.0;
    for (int r = 0; r < world; r++) {
        if (fail != FAIL_NONE && r == 1) continue;
        int status = 0;
        for (;;) {
            if (waitpid(pids[r], &status, WNOHANG) == pids[r]) break;
            if (now_s() - t0 > limit) {
                kill(pids[r], SIGKILL);
                waitpid(pids[r], &status, 0);
                break;
            }
            usleep(10000);
        }
        CHECK(WIFEXITED(status) && WEXITSTATUS(status) == want, "gloo, %d ranks, %s: rank %d ended with %s %d, want status %d",
              world, mode, r, WIFEXITED(status) ? "status" : "signal", WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), want);
    }
    if (fail != FAIL_NONE) {
        kill(pids[1], SIGKILL);
        waitpid(pids[1], NULL, 0);
    }
    double took = now_s() - t0;
    CHECK(fail == FAIL_NONE || took < timeout + 20.0, "gloo, %d ranks, %s: the others needed %.1f s", world, mode, took);
    printf("gloo, %d ranks, %s: done in %.1f s\n", world, mode, took);
}
#endif

/* ---------------------------------------------------------------- under mpirun */

static int run_mpi(const LaunchEnv *env, const char *fail, double timeout) {
    static char label[64];
    snprintf(label, sizeof label, "rank %d of %d (mpi)", env->rank, env->world_size);
    who = label;
    CommOptions opt = {.kind = COMM_AUTO, .timeout_s = timeout};
    Comm *c = NULL;
    char err[ERR_LEN] = "";
    if (comm_open(&c, env, &opt, err) != COLT_OK) {
        fprintf(stderr, "[%s] open: %s\n", who, err);
        return 2;
    }
    CHECK(comm_kind(c) == COMM_MPI, "mpirun CPU ranks got %s", comm_kind_name(comm_kind(c)));
    if (!fail) {
        double t0 = now_s();
        check_all_ops(c);
        comm_close(c);
        printf("[%s] %d checks, %d failures (%.1f s)\n", who, g_checks, g_failures, now_s() - t0);
        return g_failures ? 1 : 0;
    }
    if (env->rank == 1) {
        if (!strcmp(fail, "exit")) exit(0); /* without MPI_Finalize: mpirun ends the job */
        for (;;) pause();
    }
    size_t n = 1u << 20;
    float *x = calloc(n, sizeof *x);
    double t0 = now_s();
    int rc = comm_all_reduce(c, x, n, COMM_FLOAT32, NULL, err);
    double took = now_s() - t0;
    free(x);
    char host[64], want[ERR_LEN];
    gethostname(host, sizeof host);
    host[63] = '\0';
    snprintf(want, sizeof want, "rank %d on host %s: all_reduce of 1048576 floats did not complete within %g s (a rank died or hung?)",
             env->rank, host, timeout);
    if (rc != COLT_ERR || strcmp(err, want)) {
        fprintf(stderr, "[%s] wrong failure after %.1f s:\n  got  \"%s\"\n  want \"%s\"\n", who, took, err, want);
        return 3;
    }
    printf("EXPECTED-FAILURE-SEEN [%s] after %.1f s: %s\n", who, took, err);
    fflush(stdout);
    comm_abort(c, err);
}

int main(int argc, char **argv) {
    const char *fail = NULL;
    double timeout = 5.0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--backends")) { /* for tests/dist_comm.sh: what this build can run */
            printf("self%s%s%s\n", COMM_HAS_MPI ? " mpi" : "", COMM_HAS_GLOO ? " gloo" : "", COMM_HAS_NCCL ? " nccl" : "");
            return 0;
        }
        if (!strncmp(argv[i], "--fail=", 7)) fail = argv[i] + 7;
        else if (!strncmp(argv[i], "--timeout=", 10)) timeout = atof(argv[i] + 10);
        else {
            fprintf(stderr, "usage: %s [--fail=exit|hang] [--timeout=SECONDS]\n", argv[0]);
            return 2;
        }
    }
    signal(SIGPIPE, SIG_IGN);
    LaunchEnv env;
    char err[ERR_LEN];
    if (launch_env_from_process(&env, err) != COLT_OK) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    if (env.launcher == LAUNCHER_OPENMPI) return run_mpi(&env, fail, timeout);
    if (fail) {
        fprintf(stderr, "--fail is for runs under mpirun\n");
        return 2;
    }
    double t0 = now_s();
    test_self();
    test_choose_kind();
#ifdef COLT_HAVE_GLOO
    who = "gloo";
    run_gloo(2, FAIL_NONE, 30.0);
    run_gloo(4, FAIL_NONE, 30.0);
    run_gloo(3, FAIL_EXIT, 3.0);
    run_gloo(3, FAIL_HANG, 3.0);
#else
    printf("gloo: not built (libgloo-dev missing), forked-rank tests skipped; MPI runs are in tests/dist_comm.sh\n");
#endif
    printf("test_dist_comm: %d checks in this process, %d failures (%.1f s)\n", g_checks, g_failures, now_s() - t0);
    return g_failures ? 1 : 0;
}
