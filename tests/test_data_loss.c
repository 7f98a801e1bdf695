/* test_data_loss.c — issue 36's data-loss and silent-wrong-answer reproducers
 * (checkpoints aside: test_resume), each now a one-line error, a warning or a
 * non-zero exit with the data intact:
 *   - output paths (core/fileio.c, then colt eval and colt train): a FIFO, a
 *     socket, a directory, a link to a FIFO and a link to /dev/null are refused
 *     and stay what they were; a link (chain, relative, dangling) is written
 *     through and stays a link; a FIFO put in place while a file is written is
 *     not renamed over. /dev/null is only ever checked, never written: the
 *     write tests go through a link in the scratch folder, and only after the
 *     same refusal passed on a FIFO;
 *   - a reward function that gives None for every completion (the shipped
 *     examples/reward_example.py on a dataset without its column) warns every
 *     round and stops after max_rounds_without_reward rounds;
 *   - the progress line prints "-" on a step that starts no round;
 *   - kill -9 of colt's own launcher (--nproc_per_node 2): both ranks gone
 *     within a few seconds;
 *   - colt generate --n 1000000000 and --temperature 1e308: one line each.
 * The `..` shard index is in test_safetensors (run under ASan there). */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fileio.h"
#include "harness.h"

static const char *BASE =
    "--config examples/demo.yaml --per_device_train_batch_size 16 --max_completion_length 24 "
    "--num_eval_prompts 8 --logging_steps 1 --log_completions_count 0 --save_total_limit 0";

static mode_t kind_of(const char *path) {
    struct stat st;
    return lstat(path, &st) == 0 ? st.st_mode & S_IFMT : 0;
}

/* True when dir holds a "<name>.tmp.<pid>" left by a write. */
static bool has_temporary(const char *dir, const char *name) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "ls %s | grep -q '^%s\\.tmp\\.'", dir, name);
    return system(cmd) == 0;
}

static char *scratch(const char *name) { return path_join(g_tmp, name); }

/* A Unix socket bound at path (the descriptor; close it when done). */
static int bind_socket(const char *path) {
    int fd = socket(AF_UNIX, SOCK_STREAM, 0);
    struct sockaddr_un a = {.sun_family = AF_UNIX};
    snprintf(a.sun_path, sizeof a.sun_path, "%s", path);
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        fprintf(stderr, "cannot bind a socket at %s: %s\n", path, strerror(errno));
        return -1;
    }
    return fd;
}

/* One refusal by file_write_atomic and file_open_append: rc, the message's
 * needle, the path still of its kind, no temporary beside it. */
static bool expect_refused(const char *label, const char *path, mode_t kind, const char *needle) {
    char err[ERR_LEN] = "";
    int rc = file_write_atomic(path, "data\n", 5, err);
    bool ok = rc != 0 && strstr(err, needle) && kind_of(path) == kind && !has_temporary(g_tmp, label);
    CHECK(ok, "%s: rc %d, err '%s', kind %o (want %o)", label, rc, err, kind_of(path), kind);
    char err2[ERR_LEN] = "";
    FILE *fp = file_open_append(path, err2);
    CHECK(!fp && strstr(err2, needle) && kind_of(path) == kind, "%s (append): err '%s'", label, err2);
    if (fp) fclose(fp);
    printf("  %-22s -> refused: %s\n", label, err);
    return ok && !fp;
}

static void test_fileio_outputs(void) {
    alarm(20); /* a FIFO opened by mistake would block: fail instead of hanging */
    char err[ERR_LEN];
    char *fifo = scratch("fifo"), *sock = scratch("sock"), *dir = scratch("dir"), *lf = scratch("link_fifo");
    COLT_ASSERT(mkfifo(fifo, 0600) == 0 && mkdir(dir, 0700) == 0 && symlink("fifo", lf) == 0);
    int sfd = bind_socket(sock);
    bool fifo_ok = expect_refused("fifo", fifo, S_IFIFO, "fifo: not a regular file (a FIFO)");
    if (sfd >= 0) expect_refused("sock", sock, S_IFSOCK, "sock: not a regular file (a socket)");
    expect_refused("dir", dir, S_IFDIR, "dir: not a regular file (a directory)");
    bool link_ok = expect_refused("link_fifo", lf, S_IFLNK, "link_fifo: a link to");
    CHECK(kind_of(fifo) == S_IFIFO, "the FIFO behind link_fifo is no longer a FIFO");

    /* /dev/null, directly and through a link: only once the refusals above
     * hold, and never written (as root a regression would replace it): the
     * check alone, and an append open, which writes nothing. */
    struct stat before, after;
    if (fifo_ok && link_ok && stat("/dev/null", &before) == 0 && S_ISCHR(before.st_mode)) {
        char *ln = scratch("link_null");
        COLT_ASSERT(symlink("/dev/null", ln) == 0);
        int rc = file_check_output(ln, err);
        CHECK(rc != 0 && strstr(err, "link_null: a link to /dev/null, which is not a regular file (a character device)"),
              "link to /dev/null: rc %d '%s'", rc, err);
        printf("  %-22s -> refused: %s\n", "link_null", err);
        FILE *fp = file_open_append(ln, err);
        CHECK(!fp && kind_of(ln) == S_IFLNK, "append through a link to /dev/null was opened");
        if (fp) fclose(fp);
        rc = file_check_output("/dev/null", err);
        CHECK(rc != 0 && strstr(err, "/dev/null: not a regular file (a character device)"), "/dev/null: rc %d '%s'",
              rc, err);
        CHECK(stat("/dev/null", &after) == 0 && S_ISCHR(after.st_mode) && after.st_rdev == before.st_rdev,
              "/dev/null is no longer the null device");
        printf("  %-22s -> refused: %s; /dev/null still a character device\n", "/dev/null (check)", err);
        free(ln);
    } else {
        CHECK(false, "the FIFO refusals failed: the /dev/null checks were not run");
    }

    /* /proc's links: /dev/stdout on a pipe reads as "pipe:[N]", which names
     * no file; the kernel's answer (a FIFO) is refused. Checked, not written. */
    int pfd[2];
    COLT_ASSERT(pipe(pfd) == 0);
    char proc_link[64];
    snprintf(proc_link, sizeof proc_link, "/proc/self/fd/%d", pfd[1]);
    int prc = file_check_output(proc_link, err);
    CHECK(prc != 0 && strstr(err, "leads to a FIFO"), "%s (a pipe): rc %d '%s'", proc_link, prc, err);
    printf("  %-22s -> refused: %s\n", "/proc/self/fd/N (pipe)", err);
    close(pfd[0]), close(pfd[1]);

    /* Written through: a relative chain link2 -> link1 -> target.txt, and an
     * absolute link; the links stay links and the target gets the bytes. */
    char *target = scratch("target.txt"), *l1 = scratch("link1"), *l2 = scratch("link2"), *la = scratch("link_abs");
    COLT_ASSERT(file_write_atomic(target, "old\n", 4, err) == 0);
    COLT_ASSERT(symlink("target.txt", l1) == 0 && symlink("link1", l2) == 0 && symlink(target, la) == 0);
    int rc = file_write_atomic(l2, "new\n", 4, err);
    char *text = read_text(g_tmp, "target.txt");
    CHECK(rc == 0 && text && !strcmp(text, "new\n") && kind_of(l1) == S_IFLNK && kind_of(l2) == S_IFLNK,
          "write through link2 -> link1 -> target.txt: rc %d (%s), target '%s'", rc, rc ? err : "", text);
    free(text);
    FILE *fp = file_open_append(la, err);
    CHECK(fp != NULL, "append through an absolute link: %s", err);
    if (fp) fputs("more\n", fp), fclose(fp);
    text = read_text(g_tmp, "target.txt");
    CHECK(text && !strcmp(text, "new\nmore\n") && kind_of(la) == S_IFLNK, "append through link_abs: '%s'", text ? text : "(none)");
    printf("  %-22s -> written through; target.txt now %d lines, links intact\n", "link2 -> link1 -> file",
           count_lines(text));
    free(text);

    /* A dangling link: its target is created, the link stays. */
    char *dl = scratch("dangling");
    COLT_ASSERT(symlink("created.txt", dl) == 0);
    rc = file_write_atomic(dl, "x", 1, err);
    CHECK(rc == 0 && kind_of(dl) == S_IFLNK && exists_in(g_tmp, "created.txt"), "dangling link: rc %d %s", rc,
          rc ? err : "");

    /* A FIFO made at the path while the file is being written: not replaced. */
    char *late = scratch("late");
    AtomicFile af;
    COLT_ASSERT(atomic_open(&af, late, err) == 0 && atomic_write(&af, "abc", 3, err) == 0);
    COLT_ASSERT(mkfifo(late, 0600) == 0);
    rc = atomic_commit(&af, err);
    CHECK(rc != 0 && strstr(err, "late: not a regular file (a FIFO)") && kind_of(late) == S_IFIFO &&
              !has_temporary(g_tmp, "late"),
          "FIFO made during the write: rc %d '%s' kind %o", rc, err, kind_of(late));
    printf("  %-22s -> %s\n", "FIFO made mid-write", rc ? err : "(renamed over it)");

    if (sfd >= 0) close(sfd);
    free(fifo), free(sock), free(dir), free(lf), free(target), free(l1), free(l2), free(la), free(dl), free(late);
    alarm(0);
}

/* A command's one-line refusal: exit 1, one stderr line with needle. */
static void expect_cli_error(const char *label, const char *args, const char *needle) {
    char *err;
    int code = run_colt(args, &err);
    CHECK(code == 1 && count_lines(err) == 1 && strstr(err, needle), "%s: exit %d, stderr: %s", label, code, err);
    printf("  %-22s -> exit %d: %s", label, code, err);
    free(err);
}

static void test_cli_outputs(void) {
    alarm(120);
    char args[4096], *err;
    char *fifo = scratch("out_fifo"), *sock = scratch("out_sock"), *lf = scratch("out_link_fifo");
    COLT_ASSERT(mkfifo(fifo, 0600) == 0 && symlink("out_fifo", lf) == 0);
    int sfd = bind_socket(sock);
    const char *eval = "eval --model models/stories260K --dataset examples/data/demo_eval.jsonl --limit 2 "
                       "--max_completion_length 8 --answer_column name";
    snprintf(args, sizeof args, "%s --output %s", eval, fifo);
    expect_cli_error("eval --output FIFO", args, "out_fifo: not a regular file (a FIFO)");
    snprintf(args, sizeof args, "%s --output %s", eval, lf);
    expect_cli_error("eval --output link", args, "out_link_fifo: a link to");
    snprintf(args, sizeof args, "%s --output %s/ok.json --completions %s", eval, g_tmp, sock);
    if (sfd >= 0) expect_cli_error("eval --completions sock", args, "out_sock: not a regular file (a socket)");
    CHECK(kind_of(fifo) == S_IFIFO && kind_of(lf) == S_IFLNK && (sfd < 0 || kind_of(sock) == S_IFSOCK) &&
              !exists_in(g_tmp, "ok.json"),
          "eval: an output changed kind, or ok.json was written after a refusal");

    /* A real evaluation through a link: the target gets the summary. */
    char *target = scratch("eval_target.json"), *link = scratch("eval_link.json");
    COLT_ASSERT(file_write_atomic(target, "{}", 2, NULL) == 0 && symlink("eval_target.json", link) == 0);
    snprintf(args, sizeof args, "%s --device cpu --output %s", eval, link);
    int code = run_colt(args, &err);
    char *text = read_text(g_tmp, "eval_target.json");
    CHECK(code == 0 && kind_of(link) == S_IFLNK && text && strstr(text, "\"pass@1\""),
          "eval through a link: exit %d (%s), link kind %o, target: %.80s", code, err, kind_of(link), text);
    printf("  %-22s -> exit %d, the link's target holds the summary (%zu bytes)\n", "eval --output link->file", code,
           text ? strlen(text) : 0);
    free(text), free(err);

    /* colt train: output_dir files that are not regular files stop it at setup. */
    char out_dir[300];
    snprintf(out_dir, sizeof out_dir, "%s/train_out", g_tmp);
    COLT_ASSERT(mkdir(out_dir, 0700) == 0);
    char *metrics = path_join(out_dir, "metrics.jsonl"), *summary = path_join(out_dir, "summary.json");
    COLT_ASSERT(mkfifo(metrics, 0600) == 0);
    snprintf(args, sizeof args, "train %s --max_steps 1 --output_dir %s", BASE, out_dir);
    expect_cli_error("train metrics.jsonl FIFO", args, "metrics.jsonl: not a regular file (a FIFO)");
    COLT_ASSERT(unlink(metrics) == 0 && symlink(fifo, summary) == 0);
    expect_cli_error("train summary.json link", args, "summary.json: a link to");
    CHECK(kind_of(summary) == S_IFLNK && kind_of(fifo) == S_IFIFO && !exists_in(out_dir, "model.safetensors"),
          "train: summary.json or its FIFO changed, or weights were written");
    if (sfd >= 0) close(sfd);
    free(fifo), free(sock), free(lf), free(target), free(link), free(metrics), free(summary);
    alarm(0);
}

/* Counts the lines of text that contain needle. */
static int count_containing(const char *text, const char *needle) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)); p += strlen(needle)) n++;
    return n;
}

static void test_rewards_without_value(void) {
    if (system("python3 -c 'import json' 2> /dev/null") != 0) {
        printf("SKIPPED: rewards without a value (no python3)\n");
        return;
    }
    /* reward_example.py gives None to rows without a "target"; demo_train has none */
    const char *none = "--reward_funcs '[{\"type\":\"command\",\"command\":\"python3 examples/reward_example.py\"}]'";
    char args[4096], dir[300], *err;
    snprintf(dir, sizeof dir, "%s/none", g_tmp);
    snprintf(args, sizeof args, "train %s %s --eval_dataset null --max_steps 8 --output_dir %s", BASE, none, dir);
    double t0 = now_s();
    int code = run_colt(args, &err);
    int warnings = count_containing(err, "completions got no usable reward ('reward_example' gave none for 16 of 16");
    const char *last = err;
    for (const char *p = err; *p; p++)
        if (*p == '\n' && p[1]) last = p + 1;
    CHECK(code == 1, "all-None rewards: exit %d (want 1)", code);
    CHECK(warnings == 2, "all-None rewards: %d warnings (want 2, steps 1 and 2): %s", warnings, err);
    CHECK(strstr(last, "colt train: step 3: no completion got a usable reward in 3 rounds in a row") &&
              strstr(last, "max_rounds_without_reward: 3") && count_lines(last) == 1,
          "all-None rewards: last line '%s'", last);
    CHECK(count_containing(err, "reward 0.0000") == 0 && count_containing(err, "| reward - |") == 2,
          "all-None rewards: the progress lines print a reward: %s", err);
    char *metrics = read_text(dir, "metrics.jsonl");
    CHECK(metrics && count_lines(metrics) == 2 && count_containing(metrics, "\"reward\": null") == 2,
          "all-None rewards: metrics.jsonl: %s", metrics);
    printf("  all-None reward         -> exit %d after %.1f s, %d warnings, then: %s", code, now_s() - t0, warnings,
           last);
    free(metrics), free(err);

    /* max_rounds_without_reward 0: warns, never stops */
    snprintf(dir, sizeof dir, "%s/none0", g_tmp);
    snprintf(args, sizeof args, "train %s %s --eval_dataset null --max_steps 2 --max_rounds_without_reward 0 "
                                "--output_dir %s", BASE, none, dir);
    code = run_colt(args, &err);
    warnings = count_containing(err, "completions got no usable reward");
    CHECK(code == 0 && warnings == 2, "max_rounds_without_reward 0: exit %d, %d warnings: %s", code, warnings, err);
    printf("  max_rounds_without_reward 0 -> exit %d, %d warnings\n", code, warnings);
    free(err);
    snprintf(args, sizeof args, "train %s --max_rounds_without_reward -1 --output_dir %s/x", BASE, g_tmp);
    expect_cli_error("max_rounds_without_reward -1", args, "max_rounds_without_reward");
}

/* The progress line of a step that starts no round: "-", not 0 (metrics.jsonl has null). */
static void test_progress_line(void) {
    char args[4096], dir[300], *err;
    snprintf(dir, sizeof dir, "%s/progress", g_tmp);
    snprintf(args, sizeof args, "train %s --eval_dataset null --max_steps 2 --steps_per_generation 2 --output_dir %s",
             BASE, dir);
    int code = run_colt(args, &err);
    const char *s1 = strstr(err, "step 1/2 | reward "), *s2 = strstr(err, "step 2/2 | reward - | loss ");
    CHECK(code == 0 && s1 && s1[18] >= '0' && s1[18] <= '9', "progress: step 1 has no reward: %s", err);
    CHECK(s2 && strstr(s2, "| mean length - |"), "progress: step 2 (no new round) is not '-': %s", err);
    char *metrics = read_text(dir, "metrics.jsonl");
    CHECK(metrics && count_lines(metrics) == 2, "progress: metrics.jsonl: %s", metrics);
    printf("  progress line           -> %.*s\n", s2 ? (int)strcspn(s2, "\n") : 0, s2 ? s2 : "");
    free(metrics), free(err);
}

/* The pids whose parent is ppid (from /proc). */
static int children_of(pid_t ppid, pid_t *out, int max) {
    char cmd[128];
    snprintf(cmd, sizeof cmd, "ps -o pid= --ppid %d", (int)ppid);
    FILE *p = popen(cmd, "r");
    int n = 0, pid;
    while (p && n < max && fscanf(p, "%d", &pid) == 1) out[n++] = pid;
    if (p) pclose(p);
    return n;
}

static void test_launcher_kill(void) {
    /* Orphaned ranks come to this process (not init), so it can reap them and
     * see them gone; without this their zombies would answer kill -0. */
    COLT_ASSERT(prctl(PR_SET_CHILD_SUBREAPER, 1) == 0);
    char out_dir[300], log_path[300];
    snprintf(out_dir, sizeof out_dir, "%s/launch", g_tmp);
    snprintf(log_path, sizeof log_path, "%s/launch.log", g_tmp);
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "exec %s train %s --eval_dataset null --max_steps 400 --save_steps 0 --device cpu "
                              "--nproc_per_node 2 --output_dir %s > %s 2>&1", COLT_BINARY, BASE, out_dir, log_path);
    pid_t launcher = start_command(cmd, NULL, NULL);
    /* wait until both ranks train (the first progress line), at most 60 s */
    pid_t ranks[8];
    int n = 0;
    double t0 = now_s();
    char *log = NULL;
    while (now_s() - t0 < 60) {
        free(log);
        log = read_text(g_tmp, "launch.log");
        n = children_of(launcher, ranks, 8);
        if (log && strstr(log, "step 1/400")) break;
        usleep(100 * 1000);
    }
    CHECK(n == 2 && log && strstr(log, "step 1/400"), "launcher: %d ranks, log: %s", n, log ? log : "(none)");
    free(log);
    kill(launcher, SIGKILL);
    waitpid(launcher, NULL, 0);
    double killed = now_s(), gone_after = -1;
    int alive = n;
    bool dead[8] = {false};
    while (alive > 0 && now_s() - killed < 10) {
        for (int i = 0; i < n; i++)
            if (!dead[i] && (waitpid(ranks[i], NULL, WNOHANG) == ranks[i] || kill(ranks[i], 0) != 0)) dead[i] = true, alive--;
        if (alive > 0) usleep(50 * 1000);
    }
    gone_after = now_s() - killed;
    const int gone = n - alive;
    for (int i = 0; i < n; i++) {
        CHECK(dead[i] && kill(ranks[i], 0) != 0 && errno == ESRCH, "rank pid %d still alive %.1f s after kill -9 of "
              "its launcher", (int)ranks[i], gone_after);
        if (!dead[i]) kill(ranks[i], SIGKILL), waitpid(ranks[i], NULL, 0); /* ours now: don't leave it */
    }
    CHECK(gone_after < 5.0, "ranks took %.1f s to die", gone_after);
    printf("  kill -9 of the launcher -> %d of %d ranks gone by themselves after %.2f s (then kill -0: ESRCH)\n",
           gone, n, gone_after);
}

static void test_generate_bounds(void) {
    const char *gen = "generate --model models/stories260K --prompt Once --max_new_tokens 2";
    char args[1024];
    snprintf(args, sizeof args, "%s --n 1000000000", gen);
    expect_cli_error("generate --n 1e9", args, "--n 1000000000 is out of range: 1 to 1048576 completions");
    snprintf(args, sizeof args, "%s --temperature 1e308", gen);
    expect_cli_error("--temperature 1e308", args, "--temperature: 1e308 is out of range");
    snprintf(args, sizeof args, "eval --model models/stories260K --dataset examples/data/demo_eval.jsonl "
                                "--temperature 1e308 --output %s/t.json", g_tmp);
    expect_cli_error("eval --temperature 1e308", args, "--temperature: 1e308 is out of range");
}

int main(void) {
    snprintf(g_tmp, sizeof g_tmp, "/tmp/colt_test_data_loss_XXXXXX");
    if (!mkdtemp(g_tmp)) return 1;
    double t0 = now_s();
    printf("output paths (fileio):\n");
    test_fileio_outputs();
    printf("output paths (colt eval, colt train):\n");
    test_cli_outputs();
    printf("rewards without a value:\n");
    test_rewards_without_value();
    test_progress_line();
    printf("launcher:\n");
    test_launcher_kill();
    printf("bounds:\n");
    test_generate_bounds();
    sh("rm -rf %s", g_tmp);
    printf("%s: %d checks, %d failures (%.1f s)\n", g_failures ? "FAIL" : "OK", g_checks, g_failures, now_s() - t0);
    return g_failures ? 1 : 0;
}
