/* tool_worker.c — colt's side of the Python tool worker (tool_worker.py):
 * starting it, requests with ids, answers in any order, the hard time limit
 * that kills a worker whose tool holds the interpreter, and the restart after.
 * The process plumbing (pipes, process group, stderr forwarding, death with
 * colt) is data/reward_process.c's. Not the engine's loop. */
#include "agent/tool_worker.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "data/reward_process.h"
#include "tool_worker_py.h" /* TOOL_WORKER_SOURCE: src/agent/tool_worker.py, embedded at build time */

enum { SEND_TIMEOUT_S = 30 };

typedef struct Pending {
    long id;
    double hard_deadline; /* when colt kills the worker for it; 0: never */
    char *tool;           /* a call's tool name, NULL for environment requests */
    double timeout_s;
    long env;
} Pending;

/* One environment: what tool_worker_environments shows, and its methods' names. */
typedef struct Environment {
    ToolEnvironment pub;          /* name, class_name owned; schemas owned */
    json_t *methods, *async_methods;
} Environment;

typedef struct Ready {
    long id;
    json_t *answer;
} Ready;

struct ToolWorker {
    char *python;
    double start_timeout_s, kill_grace_s;
    json_t *setup; /* sent as the first line at every start */
    RewardProcess *process; /* NULL after a kill or crash, until the next request */
    json_t *schemas;     /* the standalone tools', then every environment's methods' (TRL's self.tools) */
    json_t *async_tools; /* names */
    Environment *envs;
    size_t n_envs;
    ToolEnvironment *env_view; /* [n_envs] the public parts, for tool_worker_environments */
    long next_id;
    Pending *pending;
    size_t n_pending, cap_pending;
    Ready *ready;
    size_t n_ready, cap_ready;
    json_t *probe;      /* the first start's answer (tools, environments): what another rank's copy is made from */
    bool remote;        /* made from a description: the tools run in another rank's worker */
    bool no_restart;    /* a worker lost now stays lost (tool_worker_allow_restart) */
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ---------------------------------------------------------------------------
 * Naming tools and classes ("tools.py:calculator", "pkg.tools.calculator")
 * ------------------------------------------------------------------------- */

static bool is_identifier(const char *s, size_t n) {
    if (n == 0 || !(s[0] == '_' || ((s[0] | 32) >= 'a' && (s[0] | 32) <= 'z'))) return false;
    for (size_t i = 1; i < n; i++)
        if (!(s[i] == '_' || (s[i] >= '0' && s[i] <= '9') || ((s[i] | 32) >= 'a' && (s[i] | 32) <= 'z')))
            return false;
    return true;
}

static bool is_dotted_name(const char *s) {
    for (const char *part = s;;) {
        const char *dot = strchr(part, '.');
        size_t n = dot ? (size_t)(dot - part) : strlen(part);
        if (!is_identifier(part, n)) return false;
        if (!dot) return true;
        part = dot + 1;
    }
}

/* {"file": absolute path or null, "module": name or null, key: name, "display": text}. */
static int spec_from_text(json_t **out, const char *text, const char *key, const char *what, char *err) {
    *out = NULL;
    const char *colon = strrchr(text, ':');
    if (colon) {
        size_t n = (size_t)(colon - text);
        char *file = xmalloc(n + 1);
        memcpy(file, text, n);
        file[n] = '\0';
        bool ok = n > 3 && strcmp(file + n - 3, ".py") == 0 && is_identifier(colon + 1, strlen(colon + 1));
        if (!ok) {
            free(file);
            goto bad;
        }
        char *path = realpath(file, NULL);
        struct stat st;
        if (!path || stat(path, &st) != 0 || !S_ISREG(st.st_mode)) {
            char cwd[PATH_MAX];
            if (!getcwd(cwd, sizeof cwd)) snprintf(cwd, sizeof cwd, "(unknown)");
            errorf(err, "%s \"%s\": %s %s (a relative path is from the current directory, %s)", what, text, file,
                   path ? "is not a regular file" : "not found", cwd);
            free(path);
            free(file);
            return COLT_ERR;
        }
        *out = json_pack("{s:s, s:n, s:s, s:s}", "file", path, "module", key, colon + 1, "display", file);
        free(path);
        free(file);
        if (!*out) return errorf(err, "%s \"%s\": the path is not valid UTF-8", what, text);
        return 0;
    }
    if (strchr(text, '.') && is_dotted_name(text)) {
        const char *dot = strrchr(text, '.');
        char *module = xmalloc((size_t)(dot - text) + 1);
        memcpy(module, text, (size_t)(dot - text));
        module[dot - text] = '\0';
        *out = json_pack("{s:n, s:s, s:s, s:s}", "file", "module", module, key, dot + 1, "display", module);
        free(module);
        return 0;
    }
bad:
    return errorf(err, "%s \"%.100s\": name it \"PATH.py:NAME\" (in a Python file) or \"module.NAME\" (importable)",
                  what, text);
}

/* ---------------------------------------------------------------------------
 * The process
 * ------------------------------------------------------------------------- */

/* The first start's answer: the tools' schemas and each environment's (TRL's _env_tools[name]: the
 * standalone tools, then its methods). */
static void read_environments(ToolWorker *w, const json_t *reply) {
    const json_t *tools = json_object_get(reply, "tools"), *envs = json_object_get(reply, "environments");
    w->schemas = json_deep_copy(tools);
    w->async_tools = json_deep_copy(json_object_get(reply, "async_tools"));
    w->n_envs = json_array_size(envs);
    w->envs = xcalloc(w->n_envs + 1, sizeof(Environment));
    w->env_view = xcalloc(w->n_envs + 1, sizeof(ToolEnvironment));
    for (size_t e = 0; e < w->n_envs; e++) {
        const json_t *env = json_array_get(envs, e);
        Environment *x = &w->envs[e];
        const char *name = json_string_value(json_object_get(env, "name"));
        const char *class_name = json_string_value(json_object_get(env, "class"));
        x->pub.name = name ? xstrdup(name) : NULL;
        x->pub.class_name = xstrdup(class_name ? class_name : "?");
        x->pub.class_index = (int)json_integer_value(json_object_get(env, "class_index"));
        x->pub.has_reward = json_is_true(json_object_get(env, "has_reward"));
        json_t *schemas = json_deep_copy(tools);
        json_array_extend(schemas, json_object_get(env, "schemas"));
        x->pub.schemas = schemas;
        json_array_extend(w->schemas, json_object_get(env, "schemas"));
        x->methods = json_deep_copy(json_object_get(env, "methods"));
        x->async_methods = json_deep_copy(json_object_get(env, "async_methods"));
        w->env_view[e] = x->pub;
    }
}

/* Starts the worker and sends the setup; fills the schemas on the first start. */
static int launch(ToolWorker *w, char *err) {
    char subject[160];
    snprintf(subject, sizeof subject, "tool worker (%.100s)", w->python);
    RewardProcess *p = NULL;
    json_t *reply = NULL;
    if (reward_process_start_python(&p, &reply, w->python, "colt_tool_worker.py", "__colt_tool_worker__", w->setup,
                                    subject, "tools", w->start_timeout_s, err) != 0) {
        char message[ERR_LEN];
        snprintf(message, sizeof message, "%s", err);
        return errorf(err, "%s (colt runs Python as \"%.60s\"; set COLT_PYTHON to use another)", message, w->python);
    }
    const json_t *error = json_object_get(reply, "error");
    if (error || !json_is_true(json_object_get(reply, "ok"))) {
        errorf(err, "tools: %s", json_is_string(error) ? json_string_value(error) : "the worker's answer has no \"ok\"");
        json_decref(reply);
        reward_process_stop(p);
        return COLT_ERR;
    }
    if (!w->schemas) {
        read_environments(w, reply);
        w->probe = json_incref(reply);
    }
    json_decref(reply);
    w->process = p;
    return 0;
}

int tool_worker_start(ToolWorker **out, const char *const *tools, size_t n_tools, const char *environment,
                      const ToolWorkerOptions *options, char *err) {
    return tool_worker_start_environments(out, tools, n_tools, NULL, environment ? &environment : NULL,
                                          environment ? 1 : 0, options, err);
}

int tool_worker_start_environments(ToolWorker **out, const char *const *tools, size_t n_tools,
                                   const char *const *names, const char *const *classes, size_t n_envs,
                                   const ToolWorkerOptions *options, char *err) {
    *out = NULL;
    if (n_tools == 0 && n_envs == 0)
        return errorf(err, "tools: give at least one tool (\"tools.py:NAME\") or an environment class");
    json_t *tool_specs = json_array(), *env_specs = json_array();
    for (size_t i = 0; i < n_tools; i++) {
        json_t *spec = NULL;
        if (!tools[i] || spec_from_text(&spec, tools[i], "function", "tool", err) != 0) {
            if (!tools[i]) errorf(err, "tools[%zu] is missing", i);
            json_decref(tool_specs), json_decref(env_specs);
            return COLT_ERR;
        }
        json_array_append_new(tool_specs, spec);
    }
    for (size_t e = 0; e < n_envs; e++) {
        json_t *spec = NULL;
        char what[160];
        if (names) snprintf(what, sizeof what, "environment_factory[\"%.100s\"]", names[e] ? names[e] : "?");
        else snprintf(what, sizeof what, "environment_factory");
        if (!classes[e] || (names && !names[e]) || spec_from_text(&spec, classes[e], "class", what, err) != 0) {
            if (!classes[e] || (names && !names[e])) errorf(err, "%s: the class or its name is missing", what);
            json_decref(tool_specs), json_decref(env_specs);
            return COLT_ERR;
        }
        json_object_set_new(spec, "name", names ? json_string(names[e]) : json_null());
        json_array_append_new(env_specs, spec);
    }
    ToolWorker *w = xcalloc(1, sizeof *w);
    w->python = xstrdup(reward_process_python(options ? options->python : NULL));
    w->start_timeout_s = options && options->start_timeout_s > 0 ? options->start_timeout_s : 120;
    w->kill_grace_s = options && options->kill_grace_s > 0 ? options->kill_grace_s : 5;
    w->setup = json_pack("{s:s, s:o, s:o}", "source", TOOL_WORKER_SOURCE, "tools", tool_specs, "environments",
                         env_specs);
    if (launch(w, err) != 0) {
        tool_worker_free(w);
        return COLT_ERR;
    }
    *out = w;
    return 0;
}

void tool_worker_free(ToolWorker *w) {
    if (!w) return;
    reward_process_stop(w->process);
    for (size_t i = 0; i < w->n_pending; i++) free(w->pending[i].tool);
    for (size_t i = 0; i < w->n_ready; i++) json_decref(w->ready[i].answer);
    free(w->pending);
    free(w->ready);
    json_decref(w->setup);
    json_decref(w->probe);
    json_decref(w->schemas);
    json_decref(w->async_tools);
    for (size_t e = 0; e < w->n_envs; e++) {
        free((char *)w->envs[e].pub.name), free((char *)w->envs[e].pub.class_name);
        json_decref((json_t *)w->envs[e].pub.schemas);
        json_decref(w->envs[e].methods), json_decref(w->envs[e].async_methods);
    }
    free(w->envs);
    free(w->env_view);
    free(w->python);
    free(w);
}

const json_t *tool_worker_schemas(const ToolWorker *w) { return w->schemas; }
const char *tool_worker_environment_name(const ToolWorker *w) { return w->n_envs ? w->envs[0].pub.class_name : NULL; }
bool tool_worker_environment_has_reward(const ToolWorker *w) {
    for (size_t e = 0; e < w->n_envs; e++)
        if (w->envs[e].pub.has_reward) return true;
    return false;
}

size_t tool_worker_environments(const ToolWorker *w, const ToolEnvironment **out) {
    *out = w->env_view;
    return w->n_envs;
}

int tool_worker_environment_index(const ToolWorker *w, const char *name) {
    for (size_t e = 0; e < w->n_envs; e++)
        if (w->envs[e].pub.name && name && !strcmp(w->envs[e].pub.name, name)) return (int)e;
    return -1;
}

static bool has_name(const json_t *names, const char *name) {
    size_t i;
    json_t *v;
    json_array_foreach(names, i, v) if (json_is_string(v) && !strcmp(json_string_value(v), name)) return true;
    return false;
}

bool tool_worker_is_async(const ToolWorker *w, const char *name, bool with_environment) {
    return tool_worker_is_async_in(w, name, with_environment ? 0 : -1);
}

bool tool_worker_is_async_in(const ToolWorker *w, const char *name, int environment) {
    if (environment >= 0 && (size_t)environment < w->n_envs && has_name(w->envs[environment].methods, name))
        return has_name(w->envs[environment].async_methods, name);
    return has_name(w->async_tools, name);
}

int tool_worker_pid(const ToolWorker *w) { return w->process ? (int)reward_process_pid(w->process) : 0; }
size_t tool_worker_in_flight(const ToolWorker *w) { return w->n_pending; }

/* ---------------------------------------------------------------------------
 * Answers
 * ------------------------------------------------------------------------- */

static void push_ready(ToolWorker *w, long id, json_t *answer) {
    if (w->n_ready == w->cap_ready) {
        w->cap_ready = w->cap_ready ? 2 * w->cap_ready : 16;
        w->ready = xrealloc(w->ready, w->cap_ready * sizeof *w->ready);
    }
    w->ready[w->n_ready++] = (Ready){id, answer};
}

/* Takes the answer to `id` (any answer when id < 0) off the ready list. */
static bool take_ready(ToolWorker *w, long id, long *got, json_t **answer) {
    for (size_t i = 0; i < w->n_ready; i++) {
        if (id >= 0 && w->ready[i].id != id) continue;
        *got = w->ready[i].id;
        *answer = w->ready[i].answer;
        memmove(w->ready + i, w->ready + i + 1, (w->n_ready - i - 1) * sizeof *w->ready);
        w->n_ready--;
        return true;
    }
    return false;
}

static bool remove_pending(ToolWorker *w, long id) {
    for (size_t i = 0; i < w->n_pending; i++) {
        if (w->pending[i].id != id) continue;
        free(w->pending[i].tool);
        w->pending[i] = w->pending[--w->n_pending];
        return true;
    }
    return false;
}

/* Python's repr() of a str, as str({"error": text}) writes its values. */
static void python_repr(char *out, size_t cap, const char *s) {
    char quote = strchr(s, '\'') && !strchr(s, '"') ? '"' : '\'';
    size_t n = 0;
    out[n++] = quote;
    for (; *s && n + 6 < cap; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '\\' || c == (unsigned char)quote) n += (size_t)snprintf(out + n, cap - n, "\\%c", c);
        else if (c == '\n') n += (size_t)snprintf(out + n, cap - n, "\\n");
        else if (c == '\r') n += (size_t)snprintf(out + n, cap - n, "\\r");
        else if (c == '\t') n += (size_t)snprintf(out + n, cap - n, "\\t");
        else if (c < 0x20 || c == 0x7f) n += (size_t)snprintf(out + n, cap - n, "\\x%02x", c);
        else out[n++] = (char)c;
    }
    out[n++] = quote;
    out[n] = '\0';
}

/* The worker is gone (killed for `culprit`, or crashed): every request in
 * flight gets an answer, the calls an error text the model can read. */
static void answer_all_lost(ToolWorker *w, const Pending *culprit, const char *why) {
    for (size_t i = 0; i < w->n_pending; i++) {
        const Pending *p = &w->pending[i];
        char message[512], repr[1200], content[1300];
        json_t *answer;
        if (p->tool) {
            if (culprit && p->id == culprit->id)
                snprintf(message, sizeof message, "Tool %s timed out after %g s", p->tool, p->timeout_s);
            else
                snprintf(message, sizeof message, "Tool %s was cut off: %s", p->tool, why);
            python_repr(repr, sizeof repr, message);
            snprintf(content, sizeof content, "{'error': %s}", repr);
            answer = json_pack("{s:I, s:s, s:b, s:b, s:b}", "id", (json_int_t)p->id, "content", content, "failed", 1,
                               "timed_out", culprit && p->id == culprit->id, "worker_lost", 1);
        } else {
            snprintf(message, sizeof message, "environment %ld is lost: %s", p->env, why);
            answer = json_pack("{s:I, s:s, s:b}", "id", (json_int_t)p->id, "error", message, "worker_lost", 1);
        }
        push_ready(w, p->id, answer);
        free(w->pending[i].tool);
    }
    w->n_pending = 0;
}

/* Reads at most one answer (waiting up to wait_s) onto the ready list, or
 * kills a worker past a hard deadline. COLT_ERR when the worker crashed. */
static int pump(ToolWorker *w, double wait_s, char *err) {
    if (!w->process || w->n_pending == 0) return 0;
    double now = now_s(), until = now + wait_s;
    const Pending *first = NULL;
    for (size_t i = 0; i < w->n_pending; i++)
        if (w->pending[i].hard_deadline > 0 && (!first || w->pending[i].hard_deadline < first->hard_deadline))
            first = &w->pending[i];
    if (first && first->hard_deadline <= now) {
        char why[256];
        snprintf(why, sizeof why, "tool %s held the worker past its limit, so colt restarted the worker", first->tool);
        fprintf(stderr, "[tools] tool %s did not return within %g s (+%g s); killing the tool worker\n", first->tool,
                first->timeout_s, w->kill_grace_s);
        reward_process_kill(w->process);
        reward_process_stop(w->process);
        w->process = NULL;
        Pending culprit = *first;
        culprit.tool = xstrdup(first->tool);
        answer_all_lost(w, &culprit, why);
        free(culprit.tool);
        return 0;
    }
    if (first && first->hard_deadline < until) until = first->hard_deadline;
    json_t *reply = NULL;
    if (reward_process_receive(w->process, &reply, until - now, err) != 0) {
        reward_process_stop(w->process);
        w->process = NULL;
        answer_all_lost(w, NULL, "the tool worker failed");
        return COLT_ERR;
    }
    if (!reply) return 0;
    const json_t *id = json_object_get(reply, "id");
    if (json_is_integer(id) && remove_pending(w, (long)json_integer_value(id)))
        push_ready(w, (long)json_integer_value(id), reply);
    else
        json_decref(reply); /* not a request in flight: a duplicate cannot happen, the worker answers once */
    return 0;
}

int tool_worker_poll(ToolWorker *w, long *request, json_t **answer, double wait_s, char *err) {
    *answer = NULL;
    if (take_ready(w, -1, request, answer)) return 1;
    double deadline = now_s() + wait_s;
    do {
        if (pump(w, deadline - now_s() > 0 ? deadline - now_s() : 0, err) != 0) return COLT_ERR;
        if (take_ready(w, -1, request, answer)) return 1;
    } while (w->n_pending > 0 && now_s() < deadline);
    return 0;
}

/* ---------------------------------------------------------------------------
 * Requests
 * ------------------------------------------------------------------------- */

static int submit(ToolWorker *w, long *request, json_t *req, const char *tool, double timeout_s, long env, char *err) {
    *request = -1;
    if (w->remote || (!w->process && w->no_restart)) {
        json_decref(req);
        return errorf(err, w->remote ? "this rank runs no tools: its tensor-parallel group's first rank does"
                                     : "the tool worker was lost earlier in this round; it restarts for the next");
    }
    if (!w->process && launch(w, err) != 0) {
        json_decref(req);
        return error_prefix(err, "restarting the tool worker");
    }
    long id = ++w->next_id;
    json_object_set_new(req, "id", json_integer(id));
    int rc = reward_process_send(w->process, req, SEND_TIMEOUT_S, err);
    json_decref(req);
    if (rc != 0) {
        reward_process_stop(w->process);
        w->process = NULL;
        answer_all_lost(w, NULL, "the tool worker failed");
        return COLT_ERR;
    }
    if (w->n_pending == w->cap_pending) {
        w->cap_pending = w->cap_pending ? 2 * w->cap_pending : 16;
        w->pending = xrealloc(w->pending, w->cap_pending * sizeof *w->pending);
    }
    w->pending[w->n_pending++] = (Pending){
        .id = id,
        .hard_deadline = timeout_s > 0 ? now_s() + timeout_s + w->kill_grace_s : 0,
        .tool = tool ? xstrdup(tool) : NULL,
        .timeout_s = timeout_s,
        .env = env,
    };
    *request = id;
    return 0;
}

int tool_worker_submit_call(ToolWorker *w, long *request, const char *name, const json_t *arguments, long env,
                            double timeout_s, char *err) {
    if (!name) return errorf(err, "tool call: the tool's name is missing");
    json_t *args = arguments ? json_incref((json_t *)arguments) : json_object();
    json_t *req = json_pack("{s:s, s:s, s:o, s:o, s:o}", "op", "call", "name", name, "arguments", args, "env",
                            env >= 0 ? json_integer(env) : json_null(), "timeout",
                            timeout_s > 0 ? json_real(timeout_s) : json_null());
    if (!req) return errorf(err, "tool call '%.100s': the name is not valid UTF-8", name);
    return submit(w, request, req, name, timeout_s, env, err);
}

static int submit_env(ToolWorker *w, long *request, const char *op, long env, int environment, const json_t *row,
                      char *err) {
    if (w->n_envs == 0) return errorf(err, "%s: no environment_factory was given", op);
    if (env < 0) return errorf(err, "%s: the environment id must be >= 0 (got %ld)", op, env);
    json_t *req = json_pack("{s:s, s:I}", "op", op, "env", (json_int_t)env);
    if (row) json_object_set(req, "row", (json_t *)row);
    if (environment >= 0) json_object_set_new(req, "environment", json_integer(environment));
    return submit(w, request, req, NULL, 0, env, err);
}

int tool_worker_submit_reset(ToolWorker *w, long *request, long env, const json_t *row, char *err) {
    return tool_worker_submit_reset_in(w, request, env, 0, row, err);
}

int tool_worker_submit_reset_in(ToolWorker *w, long *request, long env, int environment, const json_t *row,
                                char *err) {
    if (!json_is_object(row)) return errorf(err, "env_reset: the dataset row must be a JSON object");
    if (environment < 0 || (size_t)environment >= w->n_envs)
        return errorf(err, "env_reset: environment %d of %zu", environment, w->n_envs);
    return submit_env(w, request, "env_reset", env, environment, row, err);
}

int tool_worker_submit_reward(ToolWorker *w, long *request, long env, char *err) {
    return submit_env(w, request, "env_reward", env, -1, NULL, err);
}

int tool_worker_submit_free(ToolWorker *w, long *request, long env, char *err) {
    return submit_env(w, request, "env_free", env, -1, NULL, err);
}

/* Waits for the answer to `id`; other answers stay ready for poll. */
static int wait_for(ToolWorker *w, json_t **answer, long id, char *err) {
    long got;
    for (;;) {
        if (take_ready(w, id, &got, answer)) return 0;
        if (pump(w, 1.0, err) != 0) {
            char message[ERR_LEN];
            snprintf(message, sizeof message, "%s", err);
            if (take_ready(w, id, &got, answer)) json_decref(*answer);
            *answer = NULL;
            return errorf(err, "%s", message);
        }
    }
}

int tool_worker_call(ToolWorker *w, char **content, bool *failed, const char *name, const json_t *arguments, long env,
                     double timeout_s, char *err) {
    *content = NULL;
    *failed = false;
    long id;
    json_t *answer = NULL;
    if (tool_worker_submit_call(w, &id, name, arguments, env, timeout_s, err) != 0) return COLT_ERR;
    if (wait_for(w, &answer, id, err) != 0) return COLT_ERR;
    const json_t *c = json_object_get(answer, "content"), *error = json_object_get(answer, "error");
    if (json_is_string(c)) {
        *content = xstrdup(json_string_value(c));
    } else if (c) {
        *content = json_dumps(c, JSON_COMPACT | JSON_ENSURE_ASCII);
    } else {
        errorf(err, "tool call '%s': %s", name, json_is_string(error) ? json_string_value(error) : "no content");
        json_decref(answer);
        return COLT_ERR;
    }
    *failed = json_is_true(json_object_get(answer, "failed"));
    json_decref(answer);
    return 0;
}

int tool_worker_reset(ToolWorker *w, json_t **observation, long env, const json_t *row, char *err) {
    *observation = NULL;
    long id;
    json_t *answer = NULL;
    if (tool_worker_submit_reset(w, &id, env, row, err) != 0 || wait_for(w, &answer, id, err) != 0) return COLT_ERR;
    const json_t *error = json_object_get(answer, "error");
    if (error) {
        errorf(err, "environment %ld: %s", env, json_string_value(error));
        json_decref(answer);
        return COLT_ERR;
    }
    json_t *obs = json_object_get(answer, "observation");
    *observation = obs ? json_incref(obs) : json_null();
    json_decref(answer);
    return 0;
}

int tool_worker_reward(ToolWorker *w, double *reward, bool *has, long env, char *err) {
    *reward = 0;
    *has = false;
    long id;
    json_t *answer = NULL;
    if (tool_worker_submit_reward(w, &id, env, err) != 0 || wait_for(w, &answer, id, err) != 0) return COLT_ERR;
    const json_t *error = json_object_get(answer, "error"), *r = json_object_get(answer, "reward");
    if (error || !r) {
        errorf(err, "environment %ld: %s", env, json_is_string(error) ? json_string_value(error) : "no reward");
        json_decref(answer);
        return COLT_ERR;
    }
    *has = json_is_number(r);
    *reward = *has ? json_number_value(r) : 0;
    json_decref(answer);
    return 0;
}

int tool_worker_reward_function(ToolWorker *w, double *rewards, bool *has, size_t n, const char *function,
                                const json_t *kwargs, const long *envs, double timeout_s, char *err) {
    json_t *spec = NULL;
    if (!function || spec_from_text(&spec, function, "function", "reward", err) != 0) {
        if (!function) errorf(err, "reward: the function is missing");
        return COLT_ERR;
    }
    if (kwargs && !json_is_object(kwargs)) {
        json_decref(spec);
        return errorf(err, "reward '%s': kwargs must be an object of columns", function);
    }
    json_t *env_ids = json_array();
    for (size_t i = 0; i < n; i++) json_array_append_new(env_ids, envs[i] >= 0 ? json_integer(envs[i]) : json_null());
    json_t *req = json_pack("{s:s, s:o, s:O, s:o}", "op", "reward", "function", spec, "kwargs",
                            kwargs ? kwargs : json_object(), "envs", env_ids);
    long id;
    json_t *answer = NULL;
    /* the reward gets the hard limit of a call: a worker that does not answer is killed */
    char name[160];
    snprintf(name, sizeof name, "reward %s", function);
    if (submit(w, &id, req, name, timeout_s, -1, err) != 0 || wait_for(w, &answer, id, err) != 0) return COLT_ERR;
    const json_t *list = json_object_get(answer, "rewards"), *error = json_object_get(answer, "error");
    if (!json_is_array(list) || json_array_size(list) != n) {
        errorf(err, "%s", json_is_string(error) ? json_string_value(error) : json_is_string(json_object_get(answer, "content"))
                              ? json_string_value(json_object_get(answer, "content")) : "the worker answered no rewards");
        json_decref(answer);
        return COLT_ERR;
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *v = json_array_get(list, i);
        has[i] = json_is_number(v);
        rewards[i] = has[i] ? json_number_value(v) : 0;
    }
    json_decref(answer);
    return 0;
}

int tool_worker_python_spec(json_t **out, const char *text, const char *key, const char *what, char *err) {
    return spec_from_text(out, text, key, what, err);
}

/* ---------------------------------------------------------------------------
 * Another rank's worker
 * ------------------------------------------------------------------------- */

json_t *tool_worker_description(const ToolWorker *w) { return json_incref(w->probe); }

int tool_worker_from_description(ToolWorker **out, const json_t *description, char *err) {
    *out = NULL;
    if (!json_is_array(json_object_get(description, "tools")) ||
        !json_is_array(json_object_get(description, "async_tools")))
        return errorf(err, "tools: the description of the group leader's tool worker has no tools");
    ToolWorker *w = xcalloc(1, sizeof *w);
    w->remote = true;
    w->python = xstrdup("");
    read_environments(w, description);
    w->probe = json_deep_copy(description);
    *out = w;
    return 0;
}

void tool_worker_allow_restart(ToolWorker *w, bool allowed) { w->no_restart = !allowed; }
