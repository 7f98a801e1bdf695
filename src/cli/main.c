/* main.c — the `colt` command: dispatches to the subcommands in cli/. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

static const char *USAGE =
    "usage: colt COMMAND [options]   (colt COMMAND --help for its options)\n"
    "commands:\n"
    "  tokenize     stdin JSONL {\"text\"} or {\"messages\", \"add_generation_prompt\"} -> {\"ids\"}\n"
    "  detokenize   stdin JSONL {\"ids\"} -> {\"text\"}\n"
    "  score        stdin JSONL {\"ids\"} -> {\"logprobs\"}: log p(ids[t] | ids[<t])\n"
    "  generate     complete a prompt with a model\n"
    "  init         write a randomly initialised Hugging Face checkpoint\n"
    "  train        GRPO training (TRL's GRPOConfig settings, YAML/JSON config)\n"
    "  eval         pass@1 / pass@k on a math benchmark (GSM8K, MATH-500)\n"
    "  serve        an OpenAI-style HTTP generation server (/v1/completions, /v1/chat/completions)\n";

/* OpenMP's threads wait passively between parallel regions unless the user
 * chose otherwise. libgomp reads its wait policy from OMP_WAIT_POLICY once,
 * when it loads, before main: the one way a program sets it is to set the
 * variable and start itself again (the same process, the same arguments).
 * Spinning threads take the cores from anything else that runs: on a shared
 * or busy machine a step was 4-5x slower with libgomp's default (2 cores,
 * load ~10), and with OpenBLAS's threads beside them 2.5x slower on an idle
 * one. Where the exec cannot happen, colt runs on with the default. */
static void wait_passively(char **argv) {
    if (getenv("OMP_WAIT_POLICY")) return;
    if (setenv("OMP_WAIT_POLICY", "passive", 1) != 0) return;
    execv("/proc/self/exe", argv);
}

int main(int argc, char **argv) {
    wait_passively(argv);
    if (argc < 2) {
        fputs(USAGE, stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0 || strcmp(cmd, "help") == 0) {
        fputs(USAGE, stdout);
        return 0;
    }
    struct { const char *name; int (*run)(int, char **); } commands[] = {
        {"tokenize", cmd_tokenize}, {"detokenize", cmd_detokenize}, {"score", cmd_score},
        {"generate", cmd_generate}, {"init", cmd_init}, {"train", cmd_train}, {"eval", cmd_eval},
        {"serve", cmd_serve},
    };
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(cmd, commands[i].name) == 0) return commands[i].run(argc - 2, argv + 2);
    fprintf(stderr, "colt: unknown command '%s' (see colt --help)\n", cmd);
    return 2;
}
