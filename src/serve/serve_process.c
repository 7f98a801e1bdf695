/* serve_process.c — see serve_process.h. argv and the environment are built
 * before fork, so the child only calls async-signal-safe functions until exec. */
#include "serve/serve_process.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fileio.h"
#include "core/log.h"

extern char **environ;

#define LISTENING "listening on http://127.0.0.1:"

static void sleep_s(double s) {
    struct timespec ts = {.tv_sec = (time_t)s, .tv_nsec = (long)((s - (double)(time_t)s) * 1e9)};
    nanosleep(&ts, NULL);
}

/* The last non-empty line of the log (for an error message). */
static void last_line(const char *path, char *out, size_t size) {
    char *text = NULL;
    size_t len = 0;
    snprintf(out, size, "(no output)");
    if (file_read_all(path, &text, &len, NULL) != 0) return;
    while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r')) text[--len] = '\0';
    char *nl = strrchr(text, '\n');
    if (len > 0) snprintf(out, size, "%s", nl ? nl + 1 : text);
    free(text);
}

/* The port of its "listening" line, or 0. */
static int listening_port(const char *path) {
    char *text = NULL;
    size_t len = 0;
    if (file_read_all(path, &text, &len, NULL) != 0) return 0;
    const char *at = strstr(text, LISTENING);
    int port = at ? atoi(at + strlen(LISTENING)) : 0;
    free(text);
    return port;
}

int serve_process_start(ServeProcess *p, const ServeProcessOptions *o, char *err) {
    if (serve_process_spawn(p, o, err) != 0) return COLT_ERR;
    return serve_process_wait(p, o, err);
}

int serve_process_spawn(ServeProcess *p, const ServeProcessOptions *o, char *err) {
    *p = (ServeProcess){0};
    char mem[32], len[32], tp[16], seqs[16];
    snprintf(mem, sizeof mem, "%g", o->gpu_memory_utilization);
    snprintf(len, sizeof len, "%d", o->max_model_len);
    const char *argv[32];
    int n = 0;
    argv[n++] = "colt";
    argv[n++] = "serve";
    argv[n++] = "--model", argv[n++] = o->model;
    argv[n++] = "--device", argv[n++] = o->device;
    argv[n++] = "--host", argv[n++] = "127.0.0.1";
    argv[n++] = "--port", argv[n++] = "0";
    argv[n++] = "--drain_timeout", argv[n++] = "5";
    /* a trainer's round in one request: room for large ones (colt serve's defaults suit chat clients) */
    argv[n++] = "--max_queued_sequences", argv[n++] = "65536";
    argv[n++] = "--max_body_kb", argv[n++] = "1048576";
    if (o->deterministic) argv[n++] = "--deterministic";
    if (o->gpu_memory_utilization > 0) argv[n++] = "--gpu_memory_utilization", argv[n++] = mem;
    if (o->max_model_len > 0) argv[n++] = "--max_model_len", argv[n++] = len;
    snprintf(seqs, sizeof seqs, "%d", o->max_num_seqs);
    if (o->max_num_seqs > 0) argv[n++] = "--max_num_seqs", argv[n++] = seqs;
    snprintf(tp, sizeof tp, "%d", o->tensor_parallel_size);
    if (o->tensor_parallel_size > 1) argv[n++] = "--tensor_parallel_size", argv[n++] = tp;
    argv[n] = NULL;
    /* the environment: ours, CUDA_VISIBLE_DEVICES replaced */
    size_t n_env = 0;
    while (environ[n_env]) n_env++;
    char **envp = xcalloc(n_env + 3, sizeof(char *));
    size_t k = 0;
    for (size_t i = 0; i < n_env; i++)
        if ((!o->cuda_visible || strncmp(environ[i], "CUDA_VISIBLE_DEVICES=", 21) != 0) &&
            (!o->api_key || strncmp(environ[i], "COLT_API_KEY=", 13) != 0))
            envp[k++] = environ[i];
    char *key = NULL;
    if (o->api_key) {
        key = xmalloc(strlen(o->api_key) + 16);
        sprintf(key, "COLT_API_KEY=%s", o->api_key);
        envp[k++] = key;
    }
    char *visible = NULL;
    if (o->cuda_visible) {
        visible = xmalloc(strlen(o->cuda_visible) + 32);
        sprintf(visible, "CUDA_VISIBLE_DEVICES=%s", o->cuda_visible);
        envp[k++] = visible;
    }
    envp[k] = NULL;
    int fd = open(o->log_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        free(envp), free(visible), free(key);
        return errorf(err, "server_devices: cannot write colt serve's log %s: %s", o->log_path, strerror(errno));
    }
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        setpgid(0, 0);                    /* the terminal's Ctrl-C is the trainer's to handle */
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* dies with the trainer */
        if (getppid() != parent) _exit(1); /* the trainer died before prctl */
        dup2(fd, STDOUT_FILENO);
        dup2(fd, STDERR_FILENO);
        execve("/proc/self/exe", (char *const *)argv, envp);
        _exit(127);
    }
    close(fd);
    free(envp), free(visible), free(key);
    if (pid < 0) return errorf(err, "server_devices: cannot start colt serve: %s", strerror(errno));
    p->pid = pid;
    log_info0("server_devices: started colt serve (pid %d) on %s%s%s; its log: %s", (int)pid, o->device,
              o->cuda_visible ? " CUDA_VISIBLE_DEVICES=" : "", o->cuda_visible ? o->cuda_visible : "", o->log_path);
    return COLT_OK;
}

int serve_process_wait(ServeProcess *p, const ServeProcessOptions *o, char *err) {
    pid_t pid = p->pid;
    double deadline = time_now() + o->timeout_s;
    for (;;) {
        p->port = listening_port(o->log_path);
        if (p->port > 0) return COLT_OK;
        int status = 0;
        if (waitpid(pid, &status, WNOHANG) == pid) {
            p->pid = 0;
            char line[512];
            last_line(o->log_path, line, sizeof line);
            return errorf(err, "server_devices: colt serve exited before listening (%s %d): %s",
                          WIFEXITED(status) ? "status" : "signal",
                          WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status), line);
        }
        if (time_now() > deadline) break;
        sleep_s(0.05);
    }
    serve_process_stop(p, 5);
    return errorf(err, "server_devices: colt serve did not listen within %.0f s (vllm_server_timeout); its log: %s",
                  o->timeout_s, o->log_path);
}

void serve_process_stop(ServeProcess *p, double grace_s) { serve_process_stop_all(p, 1, grace_s); }

void serve_process_stop_all(ServeProcess *p, int n, double grace_s) {
    for (int i = 0; i < n; i++)
        if (p[i].pid > 0) kill(p[i].pid, SIGTERM);
    double deadline = time_now() + grace_s;
    int status, left = n;
    while (left > 0 && time_now() < deadline) {
        left = 0;
        for (int i = 0; i < n; i++) {
            if (p[i].pid > 0 && waitpid(p[i].pid, &status, WNOHANG) == p[i].pid) p[i].pid = 0;
            left += p[i].pid > 0;
        }
        if (left > 0) sleep_s(0.02);
    }
    for (int i = 0; i < n; i++) {
        if (p[i].pid <= 0) continue;
        kill(p[i].pid, SIGKILL);
        waitpid(p[i].pid, &status, 0);
        p[i].pid = 0;
    }
}
