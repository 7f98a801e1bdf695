/* tool_worker.h — Python tools and environments for agent training, as TRL
 * 1.16's GRPOTrainer(tools=[...], environment_factory=...) takes them, run in
 * one Python worker process (src/agent/tool_worker.py, embedded in the
 * binary; its header comment is the wire protocol).
 *
 * Tools are named as colt names Python rewards: "tools.py:calculator" (a
 * function in a file; relative paths from the current directory) or
 * "my_pkg.tools.calculator" (importable). An environment is a class named
 * the same way ("envs.py:MathEnv"): one instance per rollout, reset(**row)
 * with the dataset row, its public methods (not reset, not get_reward) are
 * tools of that rollout, get_reward() an optional reward.
 *
 * Requests carry ids and are answered as they finish, so the engine can run
 * several tool calls while other sequences decode: submit any number, then
 * tool_worker_poll for answers in any order. The _call/_reset/_reward
 * functions are the same, waiting for their own answer (answers to other
 * requests that arrive meanwhile are kept for poll).
 *
 * Time limits: a call's timeout_s is answered by the worker with TRL-style
 * error text when the tool runs longer (its thread is abandoned). If the
 * worker does not answer even kill_grace_s after that (a tool that holds the
 * interpreter), colt kills the worker, answers every request in flight with an
 * error, and starts a new worker at the next request: environments are then
 * lost (a call naming one answers an error until it is reset again).
 *
 * Threads: a ToolWorker is used from one thread at a time, and the thread
 * that starts it must live as long as the worker (the trainer's main thread):
 * the worker process is tied to the thread that forks it (PR_SET_PDEATHSIG,
 * see data/reward_process.c), and a restart after a kill forks from the
 * thread that submits (tool_worker_allow_restart keeps a shorter-lived
 * thread from restarting it).
 *
 * TRL's dict of environments (environment_factory={"name": cls, ...}) is
 * tool_worker_start_environments: each name's class probed, its own pool of
 * instances, its own tools (tool_worker_environments).
 *
 * Not here: the multi-turn loop (the engine's), parsing calls (tool_calls.h). */
#ifndef COLT_AGENT_TOOL_WORKER_H
#define COLT_AGENT_TOOL_WORKER_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

typedef struct ToolWorker ToolWorker;

typedef struct ToolWorkerOptions {
    const char *python;  /* the command that runs Python; NULL: $COLT_PYTHON, else python3 */
    double start_timeout_s; /* for importing the tools (and transformers); <= 0: 120 */
    double kill_grace_s;    /* how long past a call's limit colt waits before killing the worker; <= 0: 5 */
} ToolWorkerOptions;

/* Starts the worker, imports the tools and the environment class (NULL for
 * none), makes their JSON schemas and probes one environment instance.
 * Errors name the tool or class and say what is wrong (not found, no
 * docstring, no reset method, the import's exception). options may be NULL. */
int tool_worker_start(ToolWorker **out, const char *const *tools, size_t n_tools, const char *environment,
                      const ToolWorkerOptions *options, char *err);
/* The same with TRL's dict of environments: names[e] (NULL: TRL's single
 * factory, then n_envs is 1) and classes[e] ("envs.py:MathEnv"). Errors name
 * the environment ("environment_factory[\"math\"]"). */
int tool_worker_start_environments(ToolWorker **out, const char *const *tools, size_t n_tools,
                                   const char *const *names, const char *const *classes, size_t n_envs,
                                   const ToolWorkerOptions *options, char *err);
void tool_worker_free(ToolWorker *w); /* NULL is fine */

/* One environment of the worker, as TRL 1.16 keeps it per name. */
typedef struct ToolEnvironment {
    const char *name;       /* the dict's key; NULL for a single environment_factory */
    const char *class_name; /* type(instance).__name__: its reward column's name */
    int class_index;        /* the first environment of the same class (TRL: one reward column per class) */
    bool has_reward;        /* the class defines get_reward */
    const json_t *schemas;  /* TRL's _env_tools[name]: the standalone tools' schemas, then its methods' */
} ToolEnvironment;
/* The environments, in the order given (*out borrowed, valid until free). */
size_t tool_worker_environments(const ToolWorker *w, const ToolEnvironment **out);
/* The index of the environment named `name`, or -1. */
int tool_worker_environment_index(const ToolWorker *w, const char *name);

/* The tools' JSON schemas as apply_chat_template renders them (tools=...):
 * the standalone tools, then the environments' methods (TRL's self.tools:
 * with one environment, its tools + methods). Borrowed; valid until
 * tool_worker_free. */
const json_t *tool_worker_schemas(const ToolWorker *w);
/* The (first) environment's class name, or NULL without one; whether any has get_reward. */
const char *tool_worker_environment_name(const ToolWorker *w);
bool tool_worker_environment_has_reward(const ToolWorker *w);
/* Whether the tool `name` is async (an environment's method of that name, with
 * with_environment, wins over a standalone tool, as in TRL's tool dicts;
 * unknown: false). TRL gives the model one completion's results in this
 * order: the sync calls' (and errors') in call order, then the async ones',
 * gathered; the loop keeps that order for parity. */
bool tool_worker_is_async(const ToolWorker *w, const char *name, bool with_environment);
/* The same for a rollout of environment `environment` (an index; -1: none). */
bool tool_worker_is_async_in(const ToolWorker *w, const char *name, int environment);
/* The worker's pid (0 while none runs). For tests. */
int tool_worker_pid(const ToolWorker *w);

/* ---- asynchronous: submit, then poll ---------------------------------------
 * Each submit fills *request with a new id. env: the environment instance the
 * call belongs to (its methods are tools), or -1 for none. timeout_s <= 0:
 * no limit. */
int tool_worker_submit_call(ToolWorker *w, long *request, const char *name, const json_t *arguments, long env,
                            double timeout_s, char *err);
int tool_worker_submit_reset(ToolWorker *w, long *request, long env, const json_t *row, char *err);
/* Resets instance env as one of environment `environment` (an index of
 * tool_worker_environments): an id keeps its instance while it names the
 * same environment; TRL's pools are per environment, so the caller numbers
 * the instances of each environment apart. The answer's "environment" is the
 * name. submit_reset is environment 0. */
int tool_worker_submit_reset_in(ToolWorker *w, long *request, long env, int environment, const json_t *row,
                                char *err);
int tool_worker_submit_reward(ToolWorker *w, long *request, long env, char *err);
int tool_worker_submit_free(ToolWorker *w, long *request, long env, char *err);

/* The next answer, waiting up to wait_s: returns 1 with *request and *answer
 * (caller decrefs; its fields as in tool_worker.py: "content" and "failed"
 * for a call, "observation" for a reset, "reward" for a reward, "error" when
 * the request could not be done), 0 when none came in time, COLT_ERR when
 * the worker failed (then every request in flight has been answered with an
 * "error" and the next submit starts a new worker). */
int tool_worker_poll(ToolWorker *w, long *request, json_t **answer, double wait_s, char *err);
/* How many requests are in flight. */
size_t tool_worker_in_flight(const ToolWorker *w);

/* ---- synchronous ----------------------------------------------------------- */

/* Calls a tool as TRL does: *content (malloc'd) is the text the model gets
 * (str(result); for a raising tool, an unknown name, a timeout: the error
 * text), *failed whether it was an error (TRL's tool_failure_count). A list
 * result (TRL's multimodal content) comes back as its JSON text. Fails only
 * when the worker does. */
int tool_worker_call(ToolWorker *w, char **content, bool *failed, const char *name, const json_t *arguments, long env,
                     double timeout_s, char *err);
/* Resets environment `env` (made on first use) with a dataset row;
 * *observation (new ref, may be null: "nothing to add") is what TRL appends to
 * the prompt's last message. Errors say what reset raised. */
int tool_worker_reset(ToolWorker *w, json_t **observation, long env, const json_t *row, char *err);
/* get_reward() of environment env: *has false when it returned None. */
int tool_worker_reward(ToolWorker *w, double *reward, bool *has, long env, char *err);

/* A Python reward function ("rewards.py:f" or "module.f") run in the tool
 * worker, as TRL calls reward functions when there are environments: with its
 * columns (kwargs: prompts, completions, completion_ids, dataset columns) and
 * environments=[the instances of envs[0..n), None where envs[i] < 0]. Fills
 * rewards[n] and has[n] (false: None or NaN, TRL's "no reward"). Errors: the
 * function is missing, raised (its last line), returned the wrong length;
 * timeout_s as a call's (past it and the grace, the worker is killed). */
int tool_worker_reward_function(ToolWorker *w, double *rewards, bool *has, size_t n, const char *function,
                                const json_t *kwargs, const long *envs, double timeout_s, char *err);

/* A Python function or class named as tools are ("file.py:NAME", relative to
 * the current directory, or "module.NAME") as the workers' spec: {"file":
 * absolute path or null, "module": name or null, key: NAME, "display": text}.
 * Errors start with `what` (rollout_func's worker names its function so too). */
int tool_worker_python_spec(json_t **out, const char *text, const char *key, const char *what, char *err);

/* ---- tensor parallelism: one worker per group -------------------------------
 * The group's first rank runs the worker; the others need what it knows of
 * the tools (schemas, which are async, the environment class) to render
 * prompts and parse calls as it does. tool_worker_description: that as JSON
 * (new reference); tool_worker_from_description: a worker without a process
 * made from it, whose submits fail (its group's first rank runs the tools). */
json_t *tool_worker_description(const ToolWorker *w);
int tool_worker_from_description(ToolWorker **out, const json_t *description, char *err);

/* allowed false: a worker killed or crashed from now on is not started again
 * at the next request, which fails instead (the calls then get an error
 * text). For a worker used from a thread that ends before the worker should
 * (async_generation's): a process started there would die with the thread. */
void tool_worker_allow_restart(ToolWorker *w, bool allowed);

#endif
