/* main.c — the `colt` command: dispatches to the subcommands in cli/. */
#include <stdio.h>
#include <string.h>

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

int main(int argc, char **argv) {
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
