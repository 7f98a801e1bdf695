/* reward_process.c — runs a user reward program (or colt's Python reward
 * worker): fork/exec of /bin/sh -c "<command>" in its own process group, one
 * JSON line out, one JSON line back, with a deadline enforced by poll().
 *
 * Lifetime: the program must not outlive colt, even after kill -9. The shell
 * gets PR_SET_PDEATHSIG = SIGKILL (which reaches only that process, and fires
 * when the *thread* that forked it exits: create rewards from the main
 * thread). Its descendants ("a; b", pipelines, Python worker pools) are
 * covered by a guard: a second /bin/sh in the same process group, blocked
 * reading a pipe whose only writer is colt; when colt dies the read ends and
 * the guard kills the group. A descendant that calls setsid leaves the group
 * and cannot be reached; it holds only our pipes, never colt's own stderr.
 *
 * Stderr: the program writes to a pipe, drained in the same poll() loop that
 * writes the request and waits for the answer (so a program that writes
 * megabytes to stderr before answering cannot deadlock the exchange), and each
 * line goes to colt's stderr prefixed with the reward's name. The last
 * non-empty line is kept for error messages (a Python traceback's last line).
 * Between calls nobody drains it: a chatty program blocks until the next call.
 * We never wait for EOF on stderr or stdout from a process that may have
 * descendants, only for the program's exit status, checked every TICK_MS.
 *
 * SIGPIPE: a write to a program that has exited would raise SIGPIPE. Rather
 * than change the whole process's disposition, SIGPIPE is blocked in this
 * thread around each write and a pending one (ours) is consumed, so EPIPE
 * comes back as an error. The children get SIG_DFL and an empty signal mask.
 *
 * Not a general subprocess library: no environment control. */
#include "data/reward_process.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"

enum {
    TICK_MS = 100,           /* how often a wait checks whether the program exited */
    AFTER_ANSWER_MS = 2,     /* how long to watch for a second answer after the first */
    STDERR_LINE_MAX = 4096,  /* a longer stderr line is forwarded in pieces */
    STDERR_DRAIN_MAX = 1 << 20, /* bytes read from stderr after a kill (a setsid descendant may keep writing) */
};

struct RewardProcess {
    pid_t pid;          /* the shell; also its process group id; 0 once reaped */
    pid_t guard_pid;    /* kills the group when colt dies; 0 once reaped */
    int to_child;       /* its stdin, -1 once closed */
    int from_child;     /* its stdout */
    int from_child_err; /* its stderr, -1 once at EOF */
    int guard_fd;       /* the guard's stdin: closed by the kernel when colt dies */
    char *subject;      /* what messages call it: "reward command 'cat'" */
    char *name;         /* the reward's name, prefixed to its stderr lines */
    int hints;          /* add advice for a program's author to messages */
    long answered;      /* requests answered so far */
    char *buf;          /* stdout bytes read but not yet consumed */
    size_t buf_len, buf_cap;
    char err_line[STDERR_LINE_MAX]; /* a stderr line not yet complete */
    size_t err_line_len;
    char last_err[160]; /* its last non-empty stderr line, for messages */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static int remaining_ms(double deadline) {
    double left = deadline - now_s();
    if (left <= 0) return 0;
    return left > 1e6 ? 1000000000 : (int)(left * 1000.0) + 1;
}

static int min_int(int a, int b) { return a < b ? a : b; }

/* ---------------------------------------------------------------------------
 * Starting
 * ------------------------------------------------------------------------- */

/* In a child before exec (async-signal-safe only): default signal handling,
 * and no descriptor of ours beyond 0-2 (ours are close-on-exec, but others
 * the process opened may not be, and a descendant must not hold them). */
static void child_reset(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = SIG_DFL;
    sigaction(SIGPIPE, &sa, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
#ifdef SYS_close_range
    syscall(SYS_close_range, 3u, ~0u, 0u);
#endif
}

static void close_pair(int fds[2]) {
    if (fds[0] >= 0) close(fds[0]);
    if (fds[1] >= 0) close(fds[1]);
    fds[0] = fds[1] = -1;
}

int reward_process_start(RewardProcess **out, const char *command, const char *subject, const char *name, int hints,
                         char *err) {
    *out = NULL;
    /* stdin, stdout, stderr, guard */
    int fds[4][2] = {{-1, -1}, {-1, -1}, {-1, -1}, {-1, -1}};
    for (int i = 0; i < 4; i++) {
        if (pipe2(fds[i], O_CLOEXEC) != 0) {
            int e = errno;
            for (int k = 0; k < i; k++) close_pair(fds[k]);
            return errorf(err, "%s: pipe: %s", subject, strerror(e));
        }
    }
    fflush(NULL); /* so buffered output is not written twice */
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid == 0) {
        /* Child: only async-signal-safe calls until exec. */
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent) _exit(127); /* colt died before prctl */
        if (dup2(fds[0][0], STDIN_FILENO) < 0 || dup2(fds[1][1], STDOUT_FILENO) < 0 ||
            dup2(fds[2][1], STDERR_FILENO) < 0)
            _exit(127);
        child_reset();
        execl("/bin/sh", "sh", "-c", command, (char *)NULL);
        _exit(127);
    }
    if (pid < 0) {
        int e = errno;
        for (int k = 0; k < 4; k++) close_pair(fds[k]);
        return errorf(err, "%s: fork: %s", subject, strerror(e));
    }
    setpgid(pid, pid); /* also here, so the group exists before we signal it or the guard joins it */

    /* The guard reads its stdin until EOF, which comes only when every copy
     * of the write end (ours alone) is closed: when colt exits or is killed.
     * It must never run in our own group (kill 0 would kill colt's). */
    pid_t guard = fork();
    if (guard == 0) {
        if (setpgid(0, pid) != 0) _exit(1);
        int devnull = open("/dev/null", O_RDWR);
        if (devnull < 0 || dup2(fds[3][0], STDIN_FILENO) < 0 || dup2(devnull, STDOUT_FILENO) < 0 ||
            dup2(devnull, STDERR_FILENO) < 0)
            _exit(1);
        child_reset();
        execl("/bin/sh", "sh", "-c", "read line; kill -s KILL 0", (char *)NULL);
        _exit(1);
    }
    int guard_errno = errno;
    if (guard > 0) setpgid(guard, pid);
    close(fds[0][0]);
    close(fds[1][1]);
    close(fds[2][1]);
    close(fds[3][0]);
    if (guard < 0) {
        kill(-pid, SIGKILL);
        while (waitpid(pid, NULL, 0) < 0 && errno == EINTR) {
        }
        close(fds[0][1]);
        close(fds[1][0]);
        close(fds[2][0]);
        close(fds[3][1]);
        return errorf(err, "%s: fork: %s", subject, strerror(guard_errno));
    }
    for (int i = 0; i < 3; i++) {
        int fd = i == 0 ? fds[0][1] : fds[i][0];
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    }

    RewardProcess *p = xcalloc(1, sizeof *p);
    p->pid = pid;
    p->guard_pid = guard;
    p->to_child = fds[0][1];
    p->from_child = fds[1][0];
    p->from_child_err = fds[2][0];
    p->guard_fd = fds[3][1];
    p->subject = xstrdup(subject);
    p->name = xstrdup(name);
    p->hints = hints;
    *out = p;
    return 0;
}

pid_t reward_process_pid(const RewardProcess *p) { return p ? p->pid : 0; }

/* ---------------------------------------------------------------------------
 * The program's stderr
 * ------------------------------------------------------------------------- */

/* Forwards the assembled line to our stderr and remembers it if not blank. */
static void stderr_emit_line(RewardProcess *p) {
    size_t n = p->err_line_len;
    p->err_line_len = 0;
    if (n > 0 && p->err_line[n - 1] == '\r') n--;
    fprintf(stderr, "[reward %s] %.*s\n", p->name, (int)n, p->err_line);
    size_t a = 0, b = n;
    while (a < b && isspace((unsigned char)p->err_line[a])) a++;
    while (b > a && isspace((unsigned char)p->err_line[b - 1])) b--;
    if (a == b) return;
    size_t keep = b - a, room = sizeof p->last_err - 4;
    if (keep > room) keep = room;
    for (size_t i = 0; i < keep; i++) {
        unsigned char c = (unsigned char)p->err_line[a + i];
        p->last_err[i] = c < 0x20 || c == 0x7f ? ' ' : (char)c; /* messages stay one line */
    }
    strcpy(p->last_err + keep, b - a > keep ? "..." : "");
}

static void stderr_consume(RewardProcess *p, const char *data, size_t n) {
    for (size_t i = 0; i < n; i++) {
        if (data[i] == '\n') {
            stderr_emit_line(p);
            continue;
        }
        if (p->err_line_len == sizeof p->err_line) stderr_emit_line(p);
        p->err_line[p->err_line_len++] = data[i];
    }
}

/* One read from the program's stderr, if it has something. Returns the bytes
 * read (0 at EOF, when the pipe is closed and forgotten, or when empty). */
static size_t stderr_read_once(RewardProcess *p) {
    if (p->from_child_err < 0) return 0;
    char chunk[16384];
    ssize_t r = read(p->from_child_err, chunk, sizeof chunk);
    if (r > 0) {
        stderr_consume(p, chunk, (size_t)r);
        return (size_t)r;
    }
    if (r == 0 || (errno != EAGAIN && errno != EINTR)) {
        close(p->from_child_err);
        p->from_child_err = -1;
    }
    return 0;
}

/* Forwards what the stderr pipe holds now, up to max bytes, without waiting. */
static void stderr_drain(RewardProcess *p, size_t max) {
    size_t total = 0, r;
    while (total < max && (r = stderr_read_once(p)) > 0) total += r;
}

/* Polls fd for events (fd -1: none) together with the program's stderr for up
 * to ms, forwarding what stderr holds. Returns fd's revents; 0 if nothing
 * happened on fd (timeout, signal, or only stderr). */
static short poll_io(RewardProcess *p, int fd, short events, int ms) {
    struct pollfd pfd[2] = {{fd, events, 0}, {p->from_child_err, POLLIN, 0}};
    int pr = poll(pfd, 2, ms);
    if (pr <= 0) return 0;
    if (pfd[1].revents) stderr_read_once(p);
    return pfd[0].revents;
}

/* "; its last line on stderr was "..."" or "" if it wrote none. */
static const char *stderr_note(const RewardProcess *p, char *note, size_t note_len) {
    if (!p->last_err[0]) return "";
    snprintf(note, note_len, "; its last line on stderr was \"%s\"", p->last_err);
    return note;
}

/* ---------------------------------------------------------------------------
 * Exit and cleanup
 * ------------------------------------------------------------------------- */

/* 1 if the program has exited (not reaped: its process group stays ours). */
static int program_exited(RewardProcess *p, siginfo_t *info) {
    memset(info, 0, sizeof *info);
    return p->pid > 0 && waitid(P_PID, (id_t)p->pid, info, WEXITED | WNOHANG | WNOWAIT) == 0 && info->si_pid == p->pid;
}

static void reap(pid_t *pid) {
    if (*pid <= 0) return;
    while (waitpid(*pid, NULL, 0) < 0 && errno == EINTR) {
    }
    *pid = 0;
}

/* Kills the whole process group (the guard with it) and reaps, then forwards
 * what its stderr pipe already holds: never waits for EOF there, which a
 * setsid descendant could hold off forever. Safe to call twice. */
static void kill_and_reap(RewardProcess *p) {
    if (p->pid > 0) kill(-p->pid, SIGKILL);
    if (p->guard_pid > 0) kill(p->guard_pid, SIGKILL); /* in case it never joined the group */
    reap(&p->pid);
    reap(&p->guard_pid);
    if (p->to_child >= 0) close(p->to_child);
    p->to_child = -1;
    stderr_drain(p, STDERR_DRAIN_MAX);
    if (p->err_line_len > 0) stderr_emit_line(p);
}

/* Waits up to wait_ms for the program to exit, forwarding its stderr, then
 * kills the group and reaps. Writes "exited with status N" or "was killed by
 * signal N (NAME)" or "did not exit" into how. */
static void reap_and_describe(RewardProcess *p, int wait_ms, char *how, size_t how_len) {
    snprintf(how, how_len, "did not exit");
    double deadline = now_s() + wait_ms / 1000.0;
    while (p->pid > 0) {
        siginfo_t info;
        if (program_exited(p, &info)) {
            if (info.si_code == CLD_EXITED)
                snprintf(how, how_len, "exited with status %d%s", info.si_status,
                         info.si_status == 127 ? " (command not found?)" : "");
            else
                snprintf(how, how_len, "was killed by signal %d (%s)", info.si_status, strsignal(info.si_status));
            break;
        }
        int ms = remaining_ms(deadline);
        if (ms == 0) break;
        poll_io(p, -1, 0, min_int(ms, 10));
    }
    kill_and_reap(p);
}

/* ---------------------------------------------------------------------------
 * The exchange
 * ------------------------------------------------------------------------- */

/* Writes all of data before the deadline, forwarding stderr meanwhile.
 * Returns 0, or -1 with errno set (EPIPE: the program closed its stdin;
 * ECHILD: it exited while a descendant holds its stdin; ETIMEDOUT). */
static int write_all(RewardProcess *p, const char *data, size_t len, double deadline) {
    sigset_t pipe_set, old_set, pending;
    sigemptyset(&pipe_set);
    sigaddset(&pipe_set, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_set, &old_set);
    sigpending(&pending);
    int was_pending = sigismember(&pending, SIGPIPE);
    int rc = 0, saved_errno = 0;
    size_t done = 0;
    double next_check = now_s() + TICK_MS / 1000.0;
    while (done < len) {
        int ms = remaining_ms(deadline);
        if (ms == 0) {
            rc = -1, saved_errno = ETIMEDOUT;
            break;
        }
        if (poll_io(p, p->to_child, POLLOUT, min_int(ms, TICK_MS))) {
            ssize_t w = write(p->to_child, data + done, len - done);
            if (w < 0 && errno != EINTR && errno != EAGAIN) {
                rc = -1, saved_errno = errno;
                break;
            }
            if (w > 0) done += (size_t)w;
        }
        siginfo_t info;
        if (now_s() >= next_check) {
            next_check = now_s() + TICK_MS / 1000.0;
            if (program_exited(p, &info)) {
                rc = -1, saved_errno = ECHILD;
                break;
            }
        }
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

/* One read from stdout into the buffer (grown as needed); read()'s result. */
static ssize_t stdout_read_once(RewardProcess *p) {
    if (p->buf_cap - p->buf_len < 65536) {
        p->buf_cap = p->buf_cap ? 2 * p->buf_cap : 65536 * 2;
        p->buf = xrealloc(p->buf, p->buf_cap);
    }
    ssize_t r = read(p->from_child, p->buf + p->buf_len, p->buf_cap - p->buf_len);
    if (r > 0) p->buf_len += (size_t)r;
    return r;
}

static long buffered_line_length(const RewardProcess *p) {
    char *nl = p->buf_len ? memchr(p->buf, '\n', p->buf_len) : NULL;
    return nl ? (long)(nl - p->buf) : -1;
}

/* Reads until the buffer holds a newline, forwarding stderr meanwhile.
 * Returns the line length (without '\n'), or -1 on EOF or exit without a
 * line (errno 0), timeout (ETIMEDOUT) or read error. */
static long read_line(RewardProcess *p, double deadline) {
    double next_check = now_s() + TICK_MS / 1000.0;
    for (;;) {
        long n = buffered_line_length(p);
        if (n >= 0) return n;
        int ms = remaining_ms(deadline);
        if (ms == 0) {
            errno = ETIMEDOUT;
            return -1;
        }
        if (poll_io(p, p->from_child, POLLIN, min_int(ms, TICK_MS))) {
            ssize_t r = stdout_read_once(p);
            if (r == 0) {
                errno = 0;
                return -1;
            }
            if (r < 0 && errno != EINTR && errno != EAGAIN) return -1;
        }
        siginfo_t info;
        if (now_s() >= next_check) {
            next_check = now_s() + TICK_MS / 1000.0;
            if (program_exited(p, &info)) {
                /* A descendant may hold stdout open, so no EOF comes; what the
                 * program wrote before exiting is in the pipe already. */
                while (buffered_line_length(p) < 0 && stdout_read_once(p) > 0) {
                }
                n = buffered_line_length(p);
                if (n >= 0) return n;
                errno = 0;
                return -1;
            }
        }
    }
}

/* Output on stdout that no request asked for (a second answer, a banner)
 * would be taken as the answer to the next request. Watches for it up to ms
 * (0: what is there now); fails, killing the program, if any came. */
static int check_no_extra_output(RewardProcess *p, int ms, char *err) {
    double deadline = now_s() + ms / 1000.0;
    while (p->buf_len == 0) {
        if (poll_io(p, p->from_child, POLLIN, remaining_ms(deadline))) {
            ssize_t r = stdout_read_once(p);
            if (r == 0 || (r < 0 && errno != EAGAIN && errno != EINTR)) return 0; /* the call reports an exit */
        }
        if (p->buf_len == 0 && remaining_ms(deadline) == 0) return 0;
    }
    char excerpt[64];
    size_t n = 0;
    for (; n < p->buf_len && n < 60 && p->buf[n] != '\n'; n++)
        excerpt[n] = (unsigned char)p->buf[n] < 0x20 ? ' ' : p->buf[n];
    excerpt[n] = '\0';
    int more = n < p->buf_len && p->buf[n] != '\n';
    kill_and_reap(p);
    if (p->answered == 0 && ms == 0)
        return errorf(err, "%s wrote to stdout before its first request (\"%s%s\")%s", p->subject, excerpt,
                      more ? "..." : "", p->hints ? "; stdout is for answers only, print anything else to stderr" : "");
    return errorf(err, "%s wrote more than one line for one request (then \"%s%s\")%s", p->subject, excerpt,
                  more ? "..." : "",
                  p->hints ? "; it must print exactly one JSON line per request, anything else to stderr" : "");
}

/* The answer line buf[0..n), parsed and taken out of the buffer. Not JSON: an error quoting it (hint: the
 * stdout advice for programs that print debugging output there) and the process killed. */
static int take_json_line(RewardProcess *p, long n, int hint, json_t **reply, char *err) {
    json_error_t jerr;
    json_t *v = json_loadb(p->buf, (size_t)n, 0, &jerr);
    if (!v) {
        errorf(err, "%s wrote a line that is not valid JSON (%s): \"%.*s%s\"%s", p->subject, jerr.text,
               (int)(n > 60 ? 60 : n), p->buf, n > 60 ? "..." : "",
               hint ? " (print debugging output to stderr, not stdout)" : "");
        /* Strip control characters the excerpt may carry. */
        for (char *c = err; c && *c; c++)
            if ((unsigned char)*c < 0x20) *c = ' ';
        kill_and_reap(p);
        return COLT_ERR;
    }
    p->buf_len -= (size_t)n + 1;
    memmove(p->buf, p->buf + n + 1, p->buf_len);
    p->answered++;
    *reply = v;
    return 0;
}

int reward_process_call(RewardProcess *p, json_t **reply, const json_t *request, double timeout_s, char *err) {
    *reply = NULL;
    if (p->pid <= 0) return errorf(err, "%s is no longer running (it failed earlier)", p->subject);
    if (check_no_extra_output(p, 0, err) != 0) return COLT_ERR;
    char *line = json_dumps(request, JSON_COMPACT | JSON_ENSURE_ASCII);
    if (!line) return errorf(err, "%s: the request could not be written as JSON", p->subject);
    size_t len = strlen(line);
    line = xrealloc(line, len + 2);
    line[len++] = '\n';
    line[len] = '\0';

    double deadline = now_s() + timeout_s;
    int w = write_all(p, line, len, deadline);
    int write_errno = errno;
    free(line);
    char how[128], note[sizeof p->last_err + 48];
    if (w != 0) {
        if (write_errno == ETIMEDOUT) {
            kill_and_reap(p);
            return errorf(err, "%s did not read its input within %g s (timeout); killed it%s",
                          p->subject, timeout_s, stderr_note(p, note, sizeof note));
        }
        reap_and_describe(p, 2000, how, sizeof how);
        if (write_errno == EPIPE)
            return errorf(err, "%s %s before reading its input (its stdin was closed)%s", p->subject,
                          how, stderr_note(p, note, sizeof note));
        if (write_errno == ECHILD)
            return errorf(err, "%s %s before reading all of its input%s", p->subject, how,
                          stderr_note(p, note, sizeof note));
        return errorf(err, "%s: writing its input failed: %s", p->subject, strerror(write_errno));
    }
    long n = read_line(p, deadline);
    if (n < 0) {
        int e = errno;
        if (e == ETIMEDOUT) {
            kill_and_reap(p);
            return errorf(err, "%s did not answer within %g s (timeout); killed it%s", p->subject,
                          timeout_s, stderr_note(p, note, sizeof note));
        }
        if (e != 0) {
            kill_and_reap(p);
            return errorf(err, "%s: reading its output failed: %s", p->subject, strerror(e));
        }
        reap_and_describe(p, 2000, how, sizeof how);
        return errorf(err, "%s %s without answering%s%s", p->subject, how,
                      p->hints ? " (it must print one JSON line per request)" : "", stderr_note(p, note, sizeof note));
    }
    json_t *v = NULL;
    if (take_json_line(p, n, p->hints, &v, err) != 0) return COLT_ERR;
    if (check_no_extra_output(p, AFTER_ANSWER_MS, err) != 0) {
        json_decref(v);
        return COLT_ERR;
    }
    *reply = v;
    return 0;
}

/* ---------------------------------------------------------------------------
 * Out-of-order exchanges: send now, receive answers as they come
 * ------------------------------------------------------------------------- */

int reward_process_send(RewardProcess *p, const json_t *request, double timeout_s, char *err) {
    if (p->pid <= 0) return errorf(err, "%s is no longer running (it failed earlier)", p->subject);
    char *line = json_dumps(request, JSON_COMPACT | JSON_ENSURE_ASCII);
    if (!line) return errorf(err, "%s: the request could not be written as JSON", p->subject);
    size_t len = strlen(line);
    line = xrealloc(line, len + 2);
    line[len++] = '\n';
    line[len] = '\0';
    int w = write_all(p, line, len, now_s() + timeout_s);
    int write_errno = errno;
    free(line);
    if (w == 0) return 0;
    char how[128], note[sizeof p->last_err + 48];
    if (write_errno == ETIMEDOUT) {
        kill_and_reap(p);
        return errorf(err, "%s did not read its input within %g s (timeout); killed it%s", p->subject, timeout_s,
                      stderr_note(p, note, sizeof note));
    }
    reap_and_describe(p, 2000, how, sizeof how);
    if (write_errno == EPIPE || write_errno == ECHILD)
        return errorf(err, "%s %s before reading its input%s", p->subject, how, stderr_note(p, note, sizeof note));
    return errorf(err, "%s: writing its input failed: %s", p->subject, strerror(write_errno));
}

int reward_process_receive(RewardProcess *p, json_t **reply, double wait_s, char *err) {
    *reply = NULL;
    if (p->pid <= 0) return errorf(err, "%s is no longer running (it failed earlier)", p->subject);
    long n = read_line(p, now_s() + (wait_s > 0.001 ? wait_s : 0.001)); /* at least one look at the pipe */
    char how[128], note[sizeof p->last_err + 48];
    if (n < 0) {
        int e = errno;
        if (e == ETIMEDOUT) return 0;
        if (e != 0) {
            kill_and_reap(p);
            return errorf(err, "%s: reading its output failed: %s", p->subject, strerror(e));
        }
        reap_and_describe(p, 2000, how, sizeof how);
        return errorf(err, "%s %s without answering%s", p->subject, how, stderr_note(p, note, sizeof note));
    }
    return take_json_line(p, n, 0, reply, err);
}

void reward_process_kill(RewardProcess *p) {
    if (p) kill_and_reap(p);
}

void reward_process_stop(RewardProcess *p) {
    if (!p) return;
    if (p->to_child >= 0) close(p->to_child); /* EOF tells a well-behaved program to exit */
    p->to_child = -1;
    char how[128];
    reap_and_describe(p, 1000, how, sizeof how);
    close(p->from_child);
    if (p->from_child_err >= 0) close(p->from_child_err);
    close(p->guard_fd);
    free(p->subject);
    free(p->name);
    free(p->buf);
    free(p);
}

const char *reward_process_python(const char *given) {
    const char *env = getenv("COLT_PYTHON");
    return given ? given : env && *env ? env : "python3";
}

int reward_process_start_python(RewardProcess **out, json_t **reply, const char *python, const char *file_name,
                                const char *module_name, const json_t *setup, const char *subject, const char *name,
                                double start_timeout_s, char *err) {
    *out = NULL;
    *reply = NULL;
    char bootstrap[512];
    snprintf(bootstrap, sizeof bootstrap,
             "import json, sys; setup = json.loads(sys.stdin.readline()); "
             "exec(compile(setup[\"source\"], \"%s\", \"exec\"), {\"__name__\": \"%s\", \"setup\": setup})",
             file_name, module_name);
    size_t len = strlen(python) + strlen(bootstrap) + 16;
    char *command = xmalloc(len);
    snprintf(command, len, "exec %s -c '%s'", python, bootstrap);
    RewardProcess *p = NULL;
    int rc = reward_process_start(&p, command, subject, name, 0, err);
    free(command);
    if (rc != 0) return COLT_ERR;
    if (reward_process_call(p, reply, setup, start_timeout_s, err) != 0) {
        reward_process_stop(p);
        return COLT_ERR;
    }
    *out = p;
    return COLT_OK;
}
