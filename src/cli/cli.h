/* cli.h — shared pieces of the `colt` subcommands: option parsing, JSONL on
 * stdin, an output buffer printed only when a whole command succeeded (so an
 * error never leaves half an answer on stdout). Not the commands themselves. */
#ifndef COLT_CLI_CLI_H
#define COLT_CLI_CLI_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum { OPT_STRING, OPT_INT, OPT_U64, OPT_FLOAT, OPT_FLAG } OptionType;

typedef struct CliOption {
    const char *name;   /* without the leading "--" */
    OptionType type;
    void *value;        /* const char **, int *, uint64_t *, float *, bool * */
    const char *help;
    bool seen;          /* set by cli_parse */
} CliOption;

/* Parses "--name value" and "--name=value"; an OPT_FLAG alone is true, and
 * takes true/false/yes/no/1/0 after it or after '=' (as transformers'
 * HfArgumentParser reads a bool). Returns 0, 1 when --help was asked
 * (usage already printed to stdout), or -1 with err set. */
int cli_parse(CliOption *opts, int n_opts, int argc, char **argv, const char *usage, char *err);

/* Growable byte buffer. */
typedef struct OutBuf {
    char *data;
    size_t len, cap;
} OutBuf;
void outbuf_append(OutBuf *b, const char *s, size_t n);
void outbuf_puts(OutBuf *b, const char *s);
void outbuf_free(OutBuf *b);

/* Reads every non-blank line of stdin. lines[i] are malloc'd, NUL-terminated. */
int stdin_read_lines(char ***lines, size_t *n_lines, char *err);
void lines_free(char **lines, size_t n);

/* The subcommands; each returns the process exit code. */
int cmd_tokenize(int argc, char **argv);
int cmd_detokenize(int argc, char **argv);
int cmd_score(int argc, char **argv);
int cmd_generate(int argc, char **argv);
int cmd_init(int argc, char **argv);
int cmd_train(int argc, char **argv);
int cmd_eval(int argc, char **argv);
int cmd_serve(int argc, char **argv);

/* Prints "colt CMD: MESSAGE" on stderr and returns 1 (or 2 for usage errors). */
int cli_fail(const char *cmd, const char *msg);

/* --model as a folder into folder[size]: the folder given, or a Hub name's ("Qwen/Qwen2.5-0.5B-Instruct")
 * snapshot of revision (NULL: main) in the local Hugging Face cache (model/hub_cache.h). Returns 0, or
 * 1 after printing the error. */
int cli_model_folder(char *folder, size_t size, const char *cmd, const char *model, const char *revision);

#endif
