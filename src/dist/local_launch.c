/* local_launch.c — see local_launch.h. */
#include "dist/local_launch.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"

#define CHILD_MARK "COLT_LOCAL_LAUNCH"
#define STOP_GRACE_SECONDS 30.0

int local_launch_is_child(void) { return getenv(CHILD_MARK) != NULL; }

int local_launch_free_port(char *err) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return errorf(err, "cannot open a socket: %s", strerror(errno));
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = 0, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    else errorf(err, "cannot find a free port on 127.0.0.1: %s", strerror(errno));
    close(fd);
    return port;
}

static volatile sig_atomic_t g_forward_signal = 0;
static void on_signal(int sig) { g_forward_signal = sig; }

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void set_env_int(const char *name, int value) {
    char buf[32];
    snprintf(buf, sizeof buf, "%d", value);
    setenv(name, buf, 1);
}

int local_launch_run(int nproc, char *const *argv, char *err) {
    int port = local_launch_free_port(err);
    if (port < 0) return COLT_ERR;
    /* The signals the children must see arrive here first; forward them. */
    struct sigaction sa = {0}, old_int, old_term;
    sa.sa_handler = on_signal;
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
    pid_t *pids = xcalloc((size_t)nproc, sizeof(pid_t));
    int started = 0, rc = COLT_OK;
    const pid_t launcher = getpid();
    for (int r = 0; r < nproc; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            rc = errorf(err, "cannot start rank %d: %s", r, strerror(errno));
            break;
        }
        if (pid == 0) {
            /* A rank dies with its launcher (kill -9 of `colt train` must not
             * leave ranks training and writing output_dir); the check after
             * prctl catches a launcher that died before it took effect. As
             * colt serve's children do (serve_process.c). */
            prctl(PR_SET_PDEATHSIG, SIGKILL);
            if (getppid() != launcher) _exit(1);
            sigaction(SIGINT, &old_int, NULL);
            sigaction(SIGTERM, &old_term, NULL);
            set_env_int("RANK", r);
            set_env_int("LOCAL_RANK", r);
            set_env_int("WORLD_SIZE", nproc);
            set_env_int("LOCAL_WORLD_SIZE", nproc);
            set_env_int("GROUP_RANK", 0);
            set_env_int("MASTER_PORT", port);
            setenv("MASTER_ADDR", "127.0.0.1", 1);
            setenv(CHILD_MARK, "1", 1);
            execv("/proc/self/exe", argv);
            fprintf(stderr, "colt: rank %d: cannot run /proc/self/exe: %s\n", r, strerror(errno));
            _exit(127);
        }
        pids[started++] = pid;
    }
    /* Wait for all; the first failure stops the rest. */
    int status_out = 0, alive = started;
    double stop_sent = -1;
    bool *done = xcalloc((size_t)(started ? started : 1), sizeof(bool));
    if (rc != 0) {
        for (int i = 0; i < started; i++) kill(pids[i], SIGTERM);
        stop_sent = now_s();
    }
    while (alive > 0) {
        if (g_forward_signal) {
            for (int i = 0; i < started; i++)
                if (!done[i]) kill(pids[i], g_forward_signal);
            g_forward_signal = 0;
        }
        int status = 0;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) {
            if (stop_sent >= 0 && now_s() - stop_sent > STOP_GRACE_SECONDS)
                for (int i = 0; i < started; i++)
                    if (!done[i]) kill(pids[i], SIGKILL);
            struct timespec ts = {0, 20 * 1000 * 1000};
            nanosleep(&ts, NULL);
            continue;
        }
        int i = 0;
        while (i < started && pids[i] != pid) i++;
        if (i == started) continue; /* not ours */
        done[i] = true;
        alive--;
        int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
        if (code != 0 && status_out == 0) {
            status_out = code;
            if (alive > 0) fprintf(stderr, "colt: rank %d exited with status %d; stopping the other ranks\n", i, code);
            for (int k = 0; k < started; k++)
                if (!done[k]) kill(pids[k], SIGTERM);
            stop_sent = now_s();
        }
    }
    sigaction(SIGINT, &old_int, NULL);
    sigaction(SIGTERM, &old_term, NULL);
    free(done);
    free(pids);
    if (rc != 0) return COLT_ERR;
    return status_out;
}
