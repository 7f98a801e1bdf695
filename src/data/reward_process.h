/* reward_process.h — private to src/data: a user reward program (or colt's
 * Python reward worker) started once through /bin/sh -c and spoken to in JSON
 * lines over its stdin/stdout. Not a general subprocess library. */
#ifndef COLT_DATA_REWARD_PROCESS_H
#define COLT_DATA_REWARD_PROCESS_H

#include <jansson.h>
#include <sys/types.h>

typedef struct RewardProcess RewardProcess;

/* Starts `command` in its own process group, tied to our death. Its stderr
 * is a pipe whose lines reach our stderr prefixed "[reward <name>] " while a
 * call runs. Messages start with `subject` ("reward command 'python3 r.py'");
 * with `hints` they add advice for the program's author (one JSON line per
 * request, debugging output to stderr). Fails only if pipe/fork fail: a
 * program that cannot be found shows at the first call, as exit status 127. */
int reward_process_start(RewardProcess **out, const char *command, const char *subject, const char *name, int hints,
                         char *err);

/* The command that runs Python: `given` when set, else $COLT_PYTHON, else python3. */
const char *reward_process_python(const char *given);

/* colt's Python workers (tools, rollout_func): starts `python -c BOOTSTRAP`,
 * which reads the setup from its first stdin line and runs setup["source"]
 * (compiled as file_name, `setup` in its globals, __name__ module_name), then
 * sends setup and waits start_timeout_s for the worker's first answer, *reply
 * (the caller checks its "ok"). subject and name as reward_process_start. */
int reward_process_start_python(RewardProcess **out, json_t **reply, const char *python, const char *file_name,
                                const char *module_name, const json_t *setup, const char *subject, const char *name,
                                double start_timeout_s, char *err);

/* Writes `request` as one line and reads one line back into *reply (a JSON
 * value, caller decrefs). Within timeout_s in total, else the program is
 * killed. Errors start with the subject and say what happened (exited with status,
 * killed by signal, timeout, invalid JSON, more than one line, write failed),
 * quoting the program's last stderr line when it wrote one. After an error the
 * program is gone and later calls fail. */
int reward_process_call(RewardProcess *p, json_t **reply, const json_t *request, double timeout_s, char *err);

/* For programs that answer requests out of order (colt's tool worker, whose
 * answers carry the request's id): writes `request` as one line within
 * timeout_s (else kills the program) and returns without reading. Errors as
 * reward_process_call's. */
int reward_process_send(RewardProcess *p, const json_t *request, double timeout_s, char *err);

/* Reads the next line the program wrote, waiting up to wait_s: 0 with *reply
 * (caller decrefs), or 0 with *reply NULL when none came in time (the program
 * keeps running: a slow answer is not an error here). Errors as
 * reward_process_call's (exited, killed, not JSON); after one the program is gone. */
int reward_process_receive(RewardProcess *p, json_t **reply, double wait_s, char *err);

/* Kills the program's process group now and reaps it; later calls fail.
 * For a program that stopped answering. reward_process_stop still frees it. */
void reward_process_kill(RewardProcess *p);

/* The program's pid (the shell's, also its process group id); 0 once it is
 * gone. For tests. */
pid_t reward_process_pid(const RewardProcess *p);

/* Closes its stdin, waits up to a second for it to exit, then kills its
 * process group, and reaps it. Never waits for a descendant that left the
 * group (setsid) and still holds the pipes. NULL is fine. */
void reward_process_stop(RewardProcess *p);

#endif
