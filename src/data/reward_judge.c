/* reward_judge.c — see reward_judge.h. One batch: every completion's request
 * built, then sent through one libcurl multi handle with at most
 * JUDGE_MAX_IN_FLIGHT transfers at a time (a finished one makes room for the
 * next), each bounded by the spec's timeout, so a batch never waits on a hung
 * judge for longer than that per request. */
#include "data/reward_judge.h"

#include <ctype.h>
#include <curl/curl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/error.h"

enum {
    JUDGE_MAX_IN_FLIGHT = 16,          /* concurrent requests: a server batches them, none waits long */
    JUDGE_MAX_TOKENS = 32,             /* default answer length: a number and a few words */
    JUDGE_MAX_ANSWER_BYTES = 1 << 20,  /* a larger HTTP body is not an answer */
};
#define JUDGE_TIMEOUT_S 60.0

struct RewardJudge {
    char *name;     /* the reward's, for messages */
    char *url;      /* .../chat/completions */
    char *model;
    char *prompt;   /* with {prompt} and {completion} */
    char *auth;     /* "Authorization: Bearer KEY", or NULL */
    double timeout; /* seconds per request */
    int max_tokens;
};

/* ---------------------------------------------------------------- the spec */

/* Fails the creation of j with "judge reward 'NAME': what". */
static int judge_error(RewardJudge *j, char *err, const char *what) {
    errorf(err, "judge reward '%s': %s", j->name, what);
    reward_judge_free(j);
    return COLT_ERR;
}

int reward_judge_create(RewardJudge **out, const json_t *spec, const char *name, char *err) {
    *out = NULL;
    RewardJudge *j = xcalloc(1, sizeof *j);
    j->name = xstrdup(name);
    static const char *const keys[] = {"type", "name", "url", "model", "prompt", "api_key_env", "timeout",
                                       "max_tokens", NULL};
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)spec, key, value) {
        bool known = false;
        for (const char *const *k = keys; *k; k++) known |= strcmp(key, *k) == 0;
        if (!known) {
            errorf(err, "judge reward '%s': unknown key \"%s\" (known: url, model, prompt, api_key_env, timeout, "
                        "max_tokens, name)", name, key);
            reward_judge_free(j);
            return COLT_ERR;
        }
    }
    json_t *url = json_object_get(spec, "url"), *model = json_object_get(spec, "model");
    json_t *prompt = json_object_get(spec, "prompt"), *key_env = json_object_get(spec, "api_key_env");
    json_t *timeout = json_object_get(spec, "timeout"), *max_tokens = json_object_get(spec, "max_tokens");
    const char *u = json_string_value(url);
    if (!u || (strncmp(u, "http://", 7) != 0 && strncmp(u, "https://", 8) != 0))
        return judge_error(j, err, "\"url\" must be the http:// or https:// base of an OpenAI-compatible API "
                                   "(e.g. http://127.0.0.1:8000/v1)");
    if (!json_is_string(model) || json_string_length(model) == 0)
        return judge_error(j, err, "\"model\" must be the name the server serves the judge under");
    if (!json_is_string(prompt) || !strstr(json_string_value(prompt), "{completion}"))
        return judge_error(j, err, "\"prompt\" must be a text with {completion} in it (and {prompt} where the "
                                   "prompt goes)");
    if (timeout && !(json_is_number(timeout) && json_number_value(timeout) > 0 && json_number_value(timeout) <= 86400))
        return judge_error(j, err, "\"timeout\" must be a number of seconds in (0, 86400]");
    if (max_tokens && !(json_is_integer(max_tokens) && json_integer_value(max_tokens) >= 1 &&
                        json_integer_value(max_tokens) <= 1000000))
        return judge_error(j, err, "\"max_tokens\" must be a whole number in [1, 1000000]");
    if (key_env) {
        const char *var = json_string_value(key_env), *k = var ? getenv(var) : NULL;
        if (!var || !*var) return judge_error(j, err, "\"api_key_env\" must name an environment variable");
        if (!k || !*k) {
            errorf(err, "judge reward '%s': api_key_env: the environment variable %s is not set", name, var);
            reward_judge_free(j);
            return COLT_ERR;
        }
        j->auth = xmalloc(strlen(k) + 32);
        sprintf(j->auth, "Authorization: Bearer %s", k);
    }
    size_t n = strlen(u);
    while (n > 0 && u[n - 1] == '/') n--;
    j->url = xmalloc(n + sizeof "/chat/completions");
    memcpy(j->url, u, n);
    strcpy(j->url + n, "/chat/completions");
    j->model = xstrdup(json_string_value(model));
    j->prompt = xstrdup(json_string_value(prompt));
    j->timeout = timeout ? json_number_value(timeout) : JUDGE_TIMEOUT_S;
    j->max_tokens = max_tokens ? (int)json_integer_value(max_tokens) : JUDGE_MAX_TOKENS;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    *out = j;
    return COLT_OK;
}

void reward_judge_free(RewardJudge *j) {
    if (!j) return;
    free(j->name), free(j->url), free(j->model), free(j->prompt), free(j->auth);
    free(j);
}

/* ---------------------------------------------------------------- texts */

bool reward_judge_first_number(const char *text, double *value) {
    for (const char *p = text; *p; p++) {
        const char *s = p;
        if ((*s == '-' || *s == '+') && (isdigit((unsigned char)s[1]) || (s[1] == '.' && isdigit((unsigned char)s[2]))))
            s++;
        if (!isdigit((unsigned char)*s) && !(*s == '.' && isdigit((unsigned char)s[1]))) continue;
        /* decimal only (strtod alone would read "0x1f" as hex, "inf" and "nan") */
        const char *e = s;
        while (isdigit((unsigned char)*e)) e++;
        if (*e == '.')
            for (e++; isdigit((unsigned char)*e);) e++;
        if ((*e == 'e' || *e == 'E')) {
            const char *x = e + 1;
            if (*x == '+' || *x == '-') x++;
            if (isdigit((unsigned char)*x)) {
                while (isdigit((unsigned char)*x)) x++;
                e = x;
            }
        }
        char buf[128];
        size_t len = (size_t)(e - p) < sizeof buf - 1 ? (size_t)(e - p) : sizeof buf - 1;
        memcpy(buf, p, len);
        buf[len] = '\0';
        *value = strtod(buf, NULL);
        return true;
    }
    return false;
}

/* template with every {prompt} and {completion} replaced. malloc'd. */
static char *fill_prompt(const char *template, const char *prompt, const char *completion) {
    size_t cap = strlen(template) + 1, lp = strlen(prompt), lc = strlen(completion);
    for (const char *p = template; (p = strchr(p, '{')); p++) cap += lp + lc; /* at most one of them per brace */
    char *out = xmalloc(cap), *o = out;
    for (const char *p = template; *p;) {
        if (strncmp(p, "{prompt}", 8) == 0) memcpy(o, prompt, lp), o += lp, p += 8;
        else if (strncmp(p, "{completion}", 12) == 0) memcpy(o, completion, lc), o += lc, p += 12;
        else *o++ = *p++;
    }
    *o = '\0';
    return out;
}

/* ---------------------------------------------------------------- requests */

typedef struct Transfer {
    CURL *h;
    char *request;
    char *body;
    size_t len;
    int index;
} Transfer;

static size_t on_body(char *data, size_t size, size_t count, void *ctx) {
    Transfer *t = ctx;
    size_t n = size * count;
    if (t->len + n > JUDGE_MAX_ANSWER_BYTES) return 0; /* stops the transfer: CURLE_WRITE_ERROR */
    t->body = xrealloc(t->body, t->len + n + 1);
    memcpy(t->body + t->len, data, n);
    t->len += n;
    t->body[t->len] = '\0';
    return n;
}

/* The quoted text for a message: at most 80 bytes, control characters as spaces. */
static void quote(char *out, size_t cap, const char *text) {
    snprintf(out, cap, "%.80s", text ? text : "");
    for (char *c = out; *c; c++)
        if ((unsigned char)*c < 0x20) *c = ' ';
}

/* The reward of a finished transfer, or an error naming its completion. */
static int read_answer(RewardJudge *j, Transfer *t, CURLcode code, double *value, char *err) {
    const char *who = j->name;
    if (code == CURLE_OPERATION_TIMEDOUT)
        return errorf(err, "reward '%s': completion %d: no answer from the judge at %s within %g s (timeout)", who,
                      t->index, j->url, j->timeout);
    if (code == CURLE_WRITE_ERROR)
        return errorf(err, "reward '%s': completion %d: the judge at %s answered more than %d bytes", who, t->index,
                      j->url, JUDGE_MAX_ANSWER_BYTES);
    if (code != CURLE_OK)
        return errorf(err, "reward '%s': completion %d: the judge at %s: %s", who, t->index, j->url,
                      curl_easy_strerror(code));
    long status = 0;
    curl_easy_getinfo(t->h, CURLINFO_RESPONSE_CODE, &status);
    json_t *o = json_loads(t->body ? t->body : "", 0, NULL);
    char text[96];
    int rc = COLT_OK;
    if (status != 200) {
        const char *msg = json_string_value(json_object_get(json_object_get(o, "error"), "message"));
        quote(text, sizeof text, msg ? msg : t->body);
        rc = errorf(err, "reward '%s': completion %d: the judge at %s answered HTTP %ld: %s", who, t->index, j->url,
                    status, text);
    } else {
        json_t *content = json_object_get(json_object_get(json_array_get(json_object_get(o, "choices"), 0), "message"),
                                          "content");
        quote(text, sizeof text, json_string_value(content));
        if (!json_is_string(content))
            rc = errorf(err, "reward '%s': completion %d: the judge at %s answered without choices[0].message.content",
                        who, t->index, j->url);
        else if (!reward_judge_first_number(json_string_value(content), value))
            rc = errorf(err, "reward '%s': completion %d: the judge's answer has no number: \"%s\"", who, t->index,
                        text);
        else if (!isfinite(*value))
            rc = errorf(err, "reward '%s': completion %d: the judge's number is out of range: \"%s\"", who, t->index,
                        text);
    }
    json_decref(o);
    return rc;
}

static void transfer_free(CURLM *m, Transfer *t) {
    if (!t) return;
    if (t->h) {
        curl_multi_remove_handle(m, t->h);
        curl_easy_cleanup(t->h);
    }
    free(t->request), free(t->body);
    free(t);
}

/* Starts completion i's request. */
static Transfer *transfer_start(RewardJudge *j, CURLM *m, struct curl_slist *headers, const char *prompt,
                                const char *completion, int i) {
    Transfer *t = xcalloc(1, sizeof *t);
    t->index = i;
    char *text = fill_prompt(j->prompt, prompt, completion);
    json_t *req = json_pack("{s:s, s:[{s:s, s:s}], s:i, s:f}", "model", j->model, "messages", "role", "user",
                            "content", text, "max_tokens", j->max_tokens, "temperature", 0.0);
    free(text);
    /* a text that is not UTF-8 cannot be sent as JSON: an empty request, which the server refuses by name */
    t->request = req ? json_dumps(req, JSON_COMPACT) : xstrdup("{}");
    json_decref(req);
    t->h = curl_easy_init();
    COLT_ASSERT(t->h != NULL);
    curl_easy_setopt(t->h, CURLOPT_URL, j->url);
    curl_easy_setopt(t->h, CURLOPT_POSTFIELDS, t->request);
    curl_easy_setopt(t->h, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(t->h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(t->h, CURLOPT_WRITEDATA, t);
    curl_easy_setopt(t->h, CURLOPT_PRIVATE, t);
    curl_easy_setopt(t->h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(t->h, CURLOPT_TIMEOUT_MS, (long)(j->timeout * 1000));
    curl_multi_add_handle(m, t->h);
    return t;
}

int reward_judge_compute(RewardJudge *j, double *values, const char *const *prompts, const char *const *completions,
                         int n, char *err) {
    if (n <= 0) return COLT_OK;
    CURLM *m = curl_multi_init();
    COLT_ASSERT(m != NULL);
    struct curl_slist *headers = curl_slist_append(NULL, "Content-Type: application/json");
    if (j->auth) headers = curl_slist_append(headers, j->auth);
    Transfer **live = xcalloc((size_t)n, sizeof(Transfer *)); /* by completion, while in flight */
    int next = 0, in_flight = 0, rc = COLT_OK;
    for (; next < n && in_flight < JUDGE_MAX_IN_FLIGHT; next++, in_flight++)
        live[next] = transfer_start(j, m, headers, prompts && prompts[next] ? prompts[next] : "", completions[next], next);
    while (rc == COLT_OK && in_flight > 0) {
        int running = 0, left = 0;
        if (curl_multi_perform(m, &running) != CURLM_OK) {
            rc = errorf(err, "reward '%s': the requests to the judge at %s failed (curl multi)", j->name, j->url);
            break;
        }
        CURLMsg *msg;
        while (rc == COLT_OK && (msg = curl_multi_info_read(m, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            Transfer *t = NULL;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&t);
            rc = read_answer(j, t, msg->data.result, &values[t->index], err);
            live[t->index] = NULL;
            transfer_free(m, t);
            in_flight--;
            if (rc == COLT_OK && next < n) {
                live[next] = transfer_start(j, m, headers, prompts && prompts[next] ? prompts[next] : "",
                                            completions[next], next);
                next++, in_flight++;
            }
        }
        if (rc == COLT_OK && in_flight > 0) curl_multi_poll(m, NULL, 0, 1000, NULL);
    }
    for (int i = 0; i < n; i++) transfer_free(m, live[i]); /* after a failure: the others given up */
    free(live);
    curl_slist_free_all(headers);
    curl_multi_cleanup(m);
    return rc;
}
