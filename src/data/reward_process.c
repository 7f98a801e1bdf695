/* reward_process.c — runs a user reward program: fork/exec of /bin/sh -c
 * "<command>" in its own process group, one JSON line out, one JSON line back,
 * with a deadline enforced by poll(). Its stderr is inherited so the user's
 * tracebacks reach the terminal.
 *
 * SIGPIPE: a write to a program that has exited would raise SIGPIPE. Rather
 * than change the whole process's disposition, SIGPIPE is blocked in this
 * thread around each write and a pending one (ours) is consumed, so EPIPE
 * comes back as an error. The child gets SIG_DFL and an empty signal mask.
 *
 * Not a general subprocess library: no environment control, no stderr capture. */
#include "data/reward_process.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"

struct RewardProcess {
    pid_t pid;          /* also its process group id; 0 once reaped */
    int to_child;       /* its stdin, -1 once closed */
    int from_child;     /* its stdout */
    char *label;        /* the command, shortened for messages */
    double timeout_s;
    char *buf;          /* bytes read but not yet consumed (after a line) */
    size_t buf_len, buf_cap;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static void sleep_ms(int ms) {
    struct timespec ts = {0, (long)ms * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

static int remaining_ms(double deadline) {
    double left = deadline - now_s();
    if (left <= 0) return 0;
    return left > 1e6 ? 1000000000 : (int)(left * 1000.0) + 1;
}

int reward_process_start(RewardProcess **out, const char *command, double timeout_s, char *err) {
    *out = NULL;
    int in_fds[2], out_fds[2];
    if (pipe2(in_fds, O_CLOEXEC) != 0) return errorf(err, "reward command '%s': pipe: %s", command, strerror(errno));
    if (pipe2(out_fds, O_CLOEXEC) != 0) {
        close(in_fds[0]);
        close(in_fds[1]);
        return errorf(err, "reward command '%s': pipe: %s", command, strerror(errno));
    }
    fflush(NULL);  /* so buffered output is not written twice */
    pid_t pid = fork();
    if (pid < 0) {
        int e = errno;
        close(in_fds[0]);
        close(in_fds[1]);
        close(out_fds[0]);
        close(out_fds[1]);
        return errorf(err, "reward command '%s': fork: %s", command, strerror(e));
    }
    if (pid == 0) {
        /* Child: only async-signal-safe calls until exec. */
        setpgid(0, 0);
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = SIG_DFL;
        sigaction(SIGPIPE, &sa, NULL);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        if (dup2(in_fds[0], STDIN_FILENO) < 0 || dup2(out_fds[1], STDOUT_FILENO) < 0) _exit(127);
        execl("/bin/sh", "sh", "-c", command, (char *)NULL);
        _exit(127);
    }
    setpgid(pid, pid);  /* also here, so the group exists before we may signal it */
    close(in_fds[0]);
    close(out_fds[1]);
    fcntl(in_fds[1], F_SETFL, fcntl(in_fds[1], F_GETFL) | O_NONBLOCK);
    fcntl(out_fds[0], F_SETFL, fcntl(out_fds[0], F_GETFL) | O_NONBLOCK);

    RewardProcess *p = xcalloc(1, sizeof *p);
    p->pid = pid;
    p->to_child = in_fds[1];
    p->from_child = out_fds[0];
    size_t n = strlen(command);
    p->label = xstrdup(command);
    if (n > 80) strcpy(p->label + 77, "...");
    p->timeout_s = timeout_s;
    *out = p;
    return 0;
}

/* Kills the whole process group and reaps the shell. Safe to call twice. */
static void kill_and_reap(RewardProcess *p) {
    if (p->pid > 0) {
        kill(-p->pid, SIGKILL);
        while (waitpid(p->pid, NULL, 0) < 0 && errno == EINTR) {
        }
        p->pid = 0;
    }
    if (p->to_child >= 0) close(p->to_child);
    p->to_child = -1;
}

/* Waits up to wait_ms for the child to exit, without reaping it (so its
 * process group cannot be reused while we kill stragglers), then kills the
 * group and reaps. Writes "exited with status N" or "was killed by signal N
 * (NAME)" or "did not exit" into how. */
static void reap_and_describe(RewardProcess *p, int wait_ms, char *how, size_t how_len) {
    snprintf(how, how_len, "did not exit");
    for (int waited = 0; p->pid > 0; waited += 10) {
        siginfo_t info;
        memset(&info, 0, sizeof info);
        int rc = waitid(P_PID, (id_t)p->pid, &info, WEXITED | WNOHANG | WNOWAIT);
        if (rc < 0 && errno == EINTR) continue;
        if (rc == 0 && info.si_pid == p->pid) {
            if (info.si_code == CLD_EXITED)
                snprintf(how, how_len, "exited with status %d%s", info.si_status,
                         info.si_status == 127 ? " (command not found?)" : "");
            else
                snprintf(how, how_len, "was killed by signal %d (%s)", info.si_status, strsignal(info.si_status));
            break;
        }
        if (rc < 0 || waited >= wait_ms) break;
        sleep_ms(10);
    }
    kill_and_reap(p);
}

/* Writes all of data before the deadline. Returns 0, or -1 with errno set
 * (EPIPE: the program closed its stdin; ETIMEDOUT). */
static int write_all(RewardProcess *p, const char *data, size_t len, double deadline) {
    sigset_t pipe_set, old_set, pending;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set);
    sigpending(&pending);
    int was_pending = sigismember(&pending, SIGPIPE);
    int rc = 0, saved_errno = 0;
    size_t done = 0;
    while (done < len) {
        struct pollfd pfd = {p->to_child, POLLOUT, 0};
        int ms = remaining_ms(deadline);
        int pr = ms > 0 ? poll(&pfd, 1, ms) : 0;
        if (pr < 0 && errno == EINTR) continue;
        if (pr == 0) {
            rc = -1, saved_errno = ETIMEDOUT;
            break;
        }
        ssize_t w = write(p->to_child, data + done, len - done);
        if (w < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            rc = -1, saved_errno = errno;
            break;
        }
        done += (size_t)w;
    }
    if (rc != 0 && saved_errno == EPIPE && !was_pending) {
        struct timespec zero = {0, 0};
        while (sigtimedwait(&pipe_set, NULL, &zero) < 0 && errno == EINTR) {
        }
    }
    pthread_sigmask(SIG_SETMASK, &old_set, NULL);
    errno = saved_errno;
    return rc;
}

/* Reads until the buffer holds a newline. Returns the line length (without
 * '\n'), -1 on EOF (errno 0), timeout (ETIMEDOUT) or read error. */
static long read_line(RewardProcess *p, double deadline) {
    for (;;) {
        char *nl = p->buf_len ? memchr(p->buf, '\n', p->buf_len) : NULL;
        if (nl) return (long)(nl - p->buf);
        if (p->buf_cap - p->buf_len < 65536) {
            p->buf_cap = p->buf_cap ? 2 * p->buf_cap : 65536 * 2;
            p->buf = xrealloc(p->buf, p->buf_cap);
        }
        struct pollfd pfd = {p->from_child, POLLIN, 0};
        int ms = remaining_ms(deadline);
        int pr = ms > 0 ? poll(&pfd, 1, ms) : 0;
        if (pr < 0 && errno == EINTR) continue;
        if (pr == 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        ssize_t r = read(p->from_child, p->buf + p->buf_len, p->buf_cap - p->buf_len);
        if (r < 0) {
            if (errno == EINTR || errno == EAGAIN) continue;
            return -1;
        }
        if (r == 0) {
            errno = 0;
            return -1;
        }
        p->buf_len += (size_t)r;
    }
}

int reward_process_call(RewardProcess *p, json_t **reply, const json_t *request, char *err) {
    *reply = NULL;
    if (p->pid <= 0) return errorf(err, "reward command '%s' is no longer running (it failed earlier)", p->label);
    char *line = json_dumps(request, JSON_COMPACT | JSON_ENSURE_ASCII);
    if (!line) return errorf(err, "reward command '%s': the request could not be written as JSON", p->label);
    size_t len = strlen(line);
    line = xrealloc(line, len + 2);
    line[len++] = '\n';
    line[len] = '\0';

    double deadline = now_s() + p->timeout_s;
    int w = write_all(p, line, len, deadline);
    int write_errno = errno;
    free(line);
    char how[128];
    if (w != 0) {
        if (write_errno == ETIMEDOUT) {
            kill_and_reap(p);
            return errorf(err, "reward command '%s' did not read its input within %g s (timeout); killed it",
                          p->label, p->timeout_s);
        }
        reap_and_describe(p, 2000, how, sizeof how);
        if (write_errno == EPIPE)
            return errorf(err, "reward command '%s' %s before reading its input (its stdin was closed)", p->label, how);
        return errorf(err, "reward command '%s': writing its input failed: %s", p->label, strerror(write_errno));
    }
    long n = read_line(p, deadline);
    if (n < 0) {
        int e = errno;
        if (e == ETIMEDOUT) {
            kill_and_reap(p);
            return errorf(err, "reward command '%s' did not answer within %g s (timeout); killed it", p->label,
                          p->timeout_s);
        }
        if (e != 0) {
            kill_and_reap(p);
            return errorf(err, "reward command '%s': reading its output failed: %s", p->label, strerror(e));
        }
        reap_and_describe(p, 2000, how, sizeof how);
        return errorf(err, "reward command '%s' %s without answering (it must print one JSON line per request)",
                      p->label, how);
    }
    json_error_t jerr;
    json_t *v = json_loadb(p->buf, (size_t)n, 0, &jerr);
    if (!v) {
        errorf(err, "reward command '%s' wrote a line that is not valid JSON (%s): \"%.*s%s\" (print debugging "
                    "output to stderr, not stdout)",
               p->label, jerr.text, (int)(n > 60 ? 60 : n), p->buf, n > 60 ? "..." : "");
        /* Strip control characters the excerpt may carry. */
        for (char *c = err; c && *c; c++)
            if ((unsigned char)*c < 0x20) *c = ' ';
        kill_and_reap(p);
        return COLT_ERR;
    }
    p->buf_len -= (size_t)n + 1;
    memmove(p->buf, p->buf + n + 1, p->buf_len);
    *reply = v;
    return 0;
}

void reward_process_stop(RewardProcess *p) {
    if (!p) return;
    if (p->to_child >= 0) close(p->to_child);  /* EOF tells a well-behaved program to exit */
    p->to_child = -1;
    char how[128];
    reap_and_describe(p, 1000, how, sizeof how);
    close(p->from_child);
    free(p->label);
    free(p->buf);
    free(p);
}
