/* serve_client.c — see serve_client.h. One curl easy handle per call, so the
 * background generation thread of async_generation, the threads of a call
 * split over replicas and the trainer's own calls never share one. */
#include "serve/serve_client.h"

#include <curl/curl.h>
#include <jansson.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/error.h"
#include "core/log.h"
#include "serve/colt_api.h"

struct ServeClient {
    char *url;  /* several replicas: their URLs, comma-separated */
    char *auth; /* "Authorization: Bearer KEY", or NULL */
    double timeout_s;
    int n_replicas;
    ServeClient **replicas; /* [n_replicas] when more than one, else NULL: this client is the one server */
};

typedef struct Body {
    char *data;
    size_t len;
} Body;

static size_t on_data(char *ptr, size_t size, size_t n, void *user) {
    Body *b = user;
    b->data = xrealloc(b->data, b->len + size * n + 1);
    memcpy(b->data + b->len, ptr, size * n);
    b->len += size * n;
    b->data[b->len] = '\0';
    return size * n;
}

/* One request (POST of body[body_len] of content_type when body, else GET)
 * bounded by timeout_s, with an Accept line when accept is given. Returns the
 * HTTP status (0 with err set when no answer came) and the answer in *out. */
static long request_with(const ServeClient *c, const char *path, const char *body, size_t body_len,
                         const char *content_type, const char *accept, double timeout_s, Body *out, char *err) {
    *out = (Body){0};
    CURL *h = curl_easy_init();
    if (!h) return errorf(err, "libcurl: cannot create a handle"), 0;
    char *url = xmalloc(strlen(c->url) + strlen(path) + 1);
    strcpy(url, c->url);
    strcat(url, path);
    char type_line[128];
    snprintf(type_line, sizeof type_line, "Content-Type: %s", content_type);
    struct curl_slist *headers = curl_slist_append(NULL, type_line);
    if (c->auth) headers = curl_slist_append(headers, c->auth);
    if (accept) { /* else curl's default */
        char line[128];
        snprintf(line, sizeof line, "Accept: %s", accept);
        headers = curl_slist_append(headers, line);
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)(timeout_s * 1000));
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)(timeout_s * 1000));
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, out);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);
    if (body) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)body_len);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    }
    CURLcode rc = curl_easy_perform(h);
    long status = 0;
    if (rc == CURLE_OK) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    else errorf(err, "%s: %s", url, curl_easy_strerror(rc));
    curl_slist_free_all(headers);
    curl_easy_cleanup(h);
    free(url);
    return status;
}

/* request_with for a JSON body (or a GET when json_body is NULL) and curl's default Accept. */
static long request(const ServeClient *c, const char *path, const char *json_body, double timeout_s, Body *out,
                    char *err) {
    return request_with(c, path, json_body, json_body ? strlen(json_body) : 0, "application/json", NULL, timeout_s, out,
                        err);
}

/* The server's error message from an OpenAI error object, else the body's start. */
static int answer_error(long status, const Body *b, const char *url, const char *path, char *err) {
    json_t *o = b->data ? json_loads(b->data, 0, NULL) : NULL;
    const char *msg = json_string_value(json_object_get(json_object_get(o, "error"), "message"));
    errorf(err, "colt serve at %s%s answered %ld: %.300s", url, path, status, msg ? msg : b->data ? b->data : "");
    json_decref(o);
    return COLT_ERR;
}

/* One server's client; waits for its /health until deadline. */
static int open_one(ServeClient **out, const char *base_url, const char *api_key, double timeout_s, double deadline,
                    char *err) {
    *out = NULL;
    curl_global_init(CURL_GLOBAL_DEFAULT);
    ServeClient *c = xcalloc(1, sizeof *c);
    c->n_replicas = 1;
    c->url = xstrdup(base_url);
    if (api_key) {
        c->auth = xmalloc(strlen(api_key) + 32);
        sprintf(c->auth, "Authorization: Bearer %s", api_key);
    }
    size_t n = strlen(c->url);
    while (n > 0 && c->url[n - 1] == '/') c->url[--n] = '\0';
    c->timeout_s = timeout_s;
    char last[ERR_LEN] = "no answer";
    bool told = false;
    for (;;) {
        Body b;
        double left = deadline - time_now();
        long status = request(c, "/health", NULL, left < 5 ? (left > 0.1 ? left : 0.1) : 5, &b, last);
        if (status == 200) {
            free(b.data);
            *out = c;
            return COLT_OK;
        }
        if (status != 0) snprintf(last, sizeof last, "/health answered %ld", status);
        free(b.data);
        if (time_now() >= deadline) break;
        if (!told) log_info0("waiting for colt serve at %s (at most %.0f s, vllm_server_timeout)", c->url, timeout_s);
        told = true;
        nanosleep(&(struct timespec){.tv_nsec = 200000000}, NULL);
    }
    errorf(err, "no colt serve answered at %s within %.0f s (vllm_server_timeout; last: %s): start one with colt "
                "serve --model ... --port ..., or fix vllm_server_host / vllm_server_port",
           c->url, timeout_s, last);
    serve_client_close(c);
    return COLT_ERR;
}

int serve_client_open(ServeClient **out, const char *base_url, const char *api_key, double timeout_s, char *err) {
    *out = NULL;
    double deadline = time_now() + timeout_s;
    if (!strchr(base_url, ',')) return open_one(out, base_url, api_key, timeout_s, deadline, err);
    ServeClient *c = xcalloc(1, sizeof *c);
    c->timeout_s = timeout_s;
    char *list = xstrdup(base_url);
    for (char *at = list; at; at = strchr(at, ',')) c->n_replicas += 1, at++;
    c->replicas = xcalloc((size_t)c->n_replicas, sizeof(ServeClient *));
    int k = 0, rc = COLT_OK;
    for (char *save = NULL, *u = strtok_r(list, ",", &save); u && rc == 0; u = strtok_r(NULL, ",", &save)) {
        while (*u == ' ') u++;
        rc = open_one(&c->replicas[k], u, api_key, timeout_s, deadline, err);
        if (rc != 0) error_prefix(err, "server mode: replica %d of %d", k, c->n_replicas);
        else k++;
    }
    c->n_replicas = k; /* those opened (all of them unless an error) */
    /* the URLs as the replicas' clients hold them (no trailing slash) */
    size_t len = 0;
    for (int i = 0; i < k; i++) len += strlen(c->replicas[i]->url) + 1;
    c->url = xcalloc(len + 1, 1);
    for (int i = 0; i < k; i++) strcat(strcat(c->url, i ? "," : ""), c->replicas[i]->url);
    free(list);
    if (rc != 0) {
        serve_client_close(c);
        return COLT_ERR;
    }
    *out = c;
    return COLT_OK;
}

int serve_client_replicas(const ServeClient *c) { return c->n_replicas; }

ServeClient *serve_client_replica(ServeClient *c, int i) {
    COLT_ASSERT(i >= 0 && i < c->n_replicas);
    return c->replicas ? c->replicas[i] : c;
}

int serve_client_replica_of(int j, int n, int n_replicas) {
    return n > 0 ? (int)((int64_t)j * n_replicas / n) : 0;
}

void serve_client_close(ServeClient *c) {
    if (!c) return;
    if (c->replicas) {
        for (int i = 0; i < c->n_replicas; i++) serve_client_close(c->replicas[i]);
        free(c->replicas);
        free(c->url);
        free(c);
        return;
    }
    free(c->url);
    free(c->auth);
    free(c);
    curl_global_cleanup();
}

const char *serve_client_url(const ServeClient *c) { return c->url; }

int serve_client_host(const ServeClient *c, char *host, size_t size, char *err) {
    if (c->replicas) c = c->replicas[0];
    CURLU *u = curl_url();
    char *h = NULL;
    int rc = COLT_OK;
    if (curl_url_set(u, CURLUPART_URL, c->url, 0) != CURLUE_OK || curl_url_get(u, CURLUPART_HOST, &h, 0) != CURLUE_OK)
        rc = errorf(err, "server mode: cannot read the host of %s", c->url);
    else if (h[0] == '[') /* an IPv6 literal: the store wants it bare */
        snprintf(host, size, "%.*s", (int)strlen(h) - 2, h + 1);
    else
        snprintf(host, size, "%s", h);
    curl_free(h);
    curl_url_cleanup(u);
    return rc;
}

int serve_client_post(ServeClient *c, const char *path, const char *json_body, char *err) {
    for (int i = 0; c->replicas && i < c->n_replicas; i++)
        if (serve_client_post(c->replicas[i], path, json_body, err) != 0) return COLT_ERR;
    if (c->replicas) return COLT_OK;
    Body b;
    long status = request(c, path, json_body, c->timeout_s, &b, err);
    int rc = status == 200 ? COLT_OK : status == 0 ? COLT_ERR : answer_error(status, &b, c->url, path, err);
    free(b.data);
    return rc;
}

int serve_client_get_json(ServeClient *c, const char *path, json_t **out, char *err) {
    if (c->replicas) c = c->replicas[0];
    Body b;
    *out = NULL;
    long status = request(c, path, NULL, c->timeout_s, &b, err);
    int rc = status == 200 ? COLT_OK : status == 0 ? COLT_ERR : answer_error(status, &b, c->url, path, err);
    if (rc == 0 && !(*out = json_loadb(b.data ? b.data : "", b.len, 0, NULL)))
        rc = errorf(err, "colt serve at %s%s: the answer is not JSON (an older colt serve, or not colt serve?)", c->url,
                    path);
    free(b.data);
    return rc;
}

static json_t *ints_json(const int *x, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(x[i]));
    return a;
}

/* Reads completion i of the answer into g. */
static int read_completion(GenSequence *g, json_t *o, int i, int max_tokens, int vocab_size, const char *url,
                           char *err) {
    json_t *ids = json_object_get(o, "token_ids"), *lp = json_object_get(o, "logprobs");
    const char *finish = json_string_value(json_object_get(o, "finish_reason"));
    size_t n = json_array_size(ids);
    if (!json_is_array(ids) || n < 1 || n > (size_t)max_tokens || !json_is_array(lp) || json_array_size(lp) != n ||
        !finish)
        return errorf(err, "colt serve at %s: completion %d of the answer is malformed", url, i);
    g->tokens = xmalloc(sizeof(int) * n);
    g->logprobs = xmalloc(sizeof(float) * n);
    g->n_tokens = (int)n;
    for (size_t k = 0; k < n; k++) {
        json_t *v = json_array_get(lp, k);
        json_t *id = json_array_get(ids, k);
        if (!json_is_integer(id) || json_integer_value(id) < 0 || json_integer_value(id) >= vocab_size)
            return errorf(err, "colt serve at %s: completion %d has token %zu out of the vocabulary (%d): a server "
                               "with another model?", url, i, k, vocab_size);
        g->tokens[k] = (int)json_integer_value(id);
        g->logprobs[k] = json_is_number(v) ? (float)json_number_value(v) : NAN;
    }
    g->finish = strcmp(finish, "stop") == 0 ? FINISH_STOP : FINISH_LENGTH;
    return COLT_OK;
}

int serve_client_generate(ServeClient *c, GenSequence *seqs, int n, const GenerateOptions *opt, int vocab_size,
                          long long *weight_updates, char *err) {
    return serve_client_generate_turns(c, seqs, n, opt, NULL, NULL, vocab_size, weight_updates, err);
}

/* One server's /colt/generate for seqs[n]. */
static int generate_one(ServeClient *c, GenSequence *seqs, int n, const GenerateOptions *opt,
                        const int *max_new_tokens, int vocab_size, long long *weight_updates, char *err) {
    if (n == 0) return COLT_OK;
    const SamplingParams *sp = &opt->sampling;
    if (sp->seed > (uint64_t)INT64_MAX) return errorf(err, "server mode: seed %llu is above 2^63-1",
                                                      (unsigned long long)sp->seed);
    /* the settings; the prompts, their streams, positions and budgets go as bytes (colt_api.h) */
    json_t *q = json_pack("{s:i,s:f,s:i,s:f,s:f,s:f,s:I,s:o}", "max_tokens", opt->max_new_tokens, "temperature",
                          (double)sp->temperature, "top_k", sp->top_k, "top_p", (double)sp->top_p, "min_p",
                          (double)sp->min_p, "repetition_penalty", (double)sp->repetition_penalty, "seed",
                          (json_int_t)sp->seed, "stop_token_ids", ints_json(opt->stop_ids, opt->n_stop_ids));
    char *settings = json_dumps(q, JSON_COMPACT | JSON_REAL_PRECISION(17));
    size_t len = 0;
    char *bytes = colt_generate_request_binary(seqs, n, max_new_tokens, settings, &len);
    free(settings);
    /* the answer as bytes too; a colt serve that predates them answers JSON, read below */
    const char *accept = COLT_GENERATE_BINARY_TYPE ", application/json";
    Body b;
    long status = request_with(c, "/colt/generate", bytes, len, COLT_GENERATE_BINARY_TYPE, accept, c->timeout_s, &b, err);
    free(bytes);
    if (status == 415) { /* a colt serve that predates the binary body: the whole request as JSON */
        free(b.data);
        json_t *all_prompts = json_array(), *all_streams = json_array(), *all_positions = json_array();
        for (int i = 0; i < n; i++) {
            json_array_append_new(all_prompts, ints_json(seqs[i].prompt, seqs[i].prompt_len));
            json_array_append_new(all_streams, json_integer((json_int_t)seqs[i].stream));
            json_array_append_new(all_positions, json_integer(seqs[i].first_position));
        }
        json_object_set_new(q, "prompts", all_prompts);
        json_object_set_new(q, "streams", all_streams);
        json_object_set_new(q, "first_positions", all_positions);
        if (max_new_tokens) json_object_set_new(q, "max_tokens", ints_json(max_new_tokens, n));
        char *text = json_dumps(q, JSON_COMPACT | JSON_REAL_PRECISION(17));
        status = request_with(c, "/colt/generate", text, strlen(text), "application/json", accept, c->timeout_s, &b, err);
        free(text);
    }
    json_decref(q);
    int rc = COLT_OK;
    if (status == 0) rc = error_prefix(err, "server mode: generation (vllm_server_timeout %.0f s)", c->timeout_s);
    else if (status != 200) rc = answer_error(status, &b, c->url, "/colt/generate", err);
    if (rc == 0 && b.len >= 8 && memcmp(b.data, COLT_GENERATE_MAGIC, 8) == 0) {
        rc = colt_generate_answer_read(seqs, n, (const unsigned char *)b.data, b.len, opt->max_new_tokens,
                                       max_new_tokens, vocab_size, weight_updates, err);
        if (rc != 0) error_prefix(err, "colt serve at %s: /colt/generate", c->url);
        free(b.data);
        return rc;
    }
    json_t *o = rc == 0 ? json_loadb(b.data ? b.data : "", b.len, 0, NULL) : NULL;
    json_t *list = json_object_get(o, "completions");
    if (rc == 0 && (!json_is_array(list) || json_array_size(list) != (size_t)n))
        rc = errorf(err, "colt serve at %s: /colt/generate answered without %d completions", c->url, n);
    for (int i = 0; rc == 0 && i < n; i++)
        rc = read_completion(&seqs[i], json_array_get(list, (size_t)i), i,
                             max_new_tokens ? max_new_tokens[i] : opt->max_new_tokens, vocab_size, c->url, err);
    if (rc == 0 && weight_updates) *weight_updates = json_integer_value(json_object_get(o, "weight_updates"));
    json_decref(o);
    free(b.data);
    return rc;
}

/* ---------------------------------------------------------------- several replicas */

/* One replica's part of a call: its sequences gathered (copies whose
 * answers go back to the caller's), its budgets, its outcome. */
typedef struct ReplicaPart {
    ServeClient *client;
    const GenerateOptions *opt;
    int vocab_size;
    GenSequence *seqs; /* [n] */
    int *budgets;      /* [n], or NULL: opt's */
    int *index;        /* [n] positions in the caller's seqs */
    int n;
    long long weight_updates;
    int rc;
    char err[ERR_LEN];
} ReplicaPart;

static void *part_main(void *arg) {
    ReplicaPart *p = arg;
    p->rc = generate_one(p->client, p->seqs, p->n, p->opt, p->budgets, p->vocab_size, &p->weight_updates, p->err);
    return NULL;
}

int serve_client_generate_turns(ServeClient *c, GenSequence *seqs, int n, const GenerateOptions *opt,
                                const int *max_new_tokens, const int *replica, int vocab_size,
                                long long *weight_updates, char *err) {
    if (!c->replicas) return generate_one(c, seqs, n, opt, max_new_tokens, vocab_size, weight_updates, err);
    const int K = c->n_replicas;
    ReplicaPart *parts = xcalloc((size_t)K, sizeof(ReplicaPart));
    int *route = xmalloc(sizeof(int) * (size_t)(n > 0 ? n : 1));
    for (int i = 0; i < n; i++) {
        route[i] = replica ? replica[i] : serve_client_replica_of(i, n, K);
        COLT_ASSERT(route[i] >= 0 && route[i] < K);
        parts[route[i]].n++;
    }
    for (int r = 0; r < K; r++) {
        ReplicaPart *p = &parts[r];
        *p = (ReplicaPart){.client = c->replicas[r], .opt = opt, .vocab_size = vocab_size,
                           .seqs = xcalloc((size_t)p->n + 1, sizeof(GenSequence)),
                           .budgets = max_new_tokens ? xcalloc((size_t)p->n + 1, sizeof(int)) : NULL,
                           .index = xcalloc((size_t)p->n + 1, sizeof(int))};
    }
    for (int i = 0; i < n; i++) {
        ReplicaPart *p = &parts[route[i]];
        p->seqs[p->n] = (GenSequence){.prompt = seqs[i].prompt, .prompt_len = seqs[i].prompt_len,
                                      .stream = seqs[i].stream, .first_position = seqs[i].first_position};
        if (max_new_tokens) p->budgets[p->n] = max_new_tokens[i];
        p->index[p->n++] = i;
    }
    /* replica 0 on this thread, the others on threads of their own: all in flight at once */
    pthread_t *threads = xcalloc((size_t)K, sizeof(pthread_t));
    bool *started = xcalloc((size_t)K, sizeof(bool));
    for (int r = 1; r < K; r++)
        if (parts[r].n > 0) started[r] = pthread_create(&threads[r], NULL, part_main, &parts[r]) == 0;
    part_main(&parts[0]);
    for (int r = 1; r < K; r++) {
        if (started[r]) pthread_join(threads[r], NULL);
        else if (parts[r].n > 0) part_main(&parts[r]); /* no thread to be had: in turn */
    }
    int rc = COLT_OK;
    long long fewest = -1;
    for (int r = 0; r < K; r++) {
        ReplicaPart *p = &parts[r];
        for (int j = 0; j < p->n; j++) { /* the answers become the caller's sequences' */
            GenSequence *g = &seqs[p->index[j]];
            g->tokens = p->seqs[j].tokens, g->logprobs = p->seqs[j].logprobs;
            g->n_tokens = p->seqs[j].n_tokens, g->finish = p->seqs[j].finish;
        }
        if (rc == 0 && p->rc != 0) rc = errorf(err, "%s", p->err);
        if (p->n > 0 && (fewest < 0 || p->weight_updates < fewest)) fewest = p->weight_updates;
        free(p->seqs), free(p->budgets), free(p->index);
    }
    if (rc == 0 && weight_updates) *weight_updates = fewest < 0 ? 0 : fewest;
    free(threads), free(started), free(parts), free(route);
    return rc;
}
