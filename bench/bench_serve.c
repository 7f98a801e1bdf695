/* bench_serve.c — load on a running `colt serve`: R streamed requests, C in
 * flight at a time (a closed loop: a client sends its next request when its
 * answer ended), over the prompts of a `colt generate --prompts` file
 * ({"prompt": text} to /v1/completions, {"chat": text} or {"messages": [...]}
 * to /v1/chat/completions), with libcurl. Prints one JSON line: requests/s,
 * output tokens/s (the server's usage counts), time to first token and
 * request latency p50 / p99, errors. --no_stream asks for whole answers
 * instead (no time to first token then): the per-event work of client and server
 * is then out of the measurement. bench/gpu/bench_serve.sh runs it against
 * `colt generate` offline on the same prompts.
 * A server with a key: COLT_API_KEY in the environment (sent as a Bearer token).
 * Usage: bench_serve --url http://127.0.0.1:8000 --prompts FILE [--requests R]
 *        [--concurrency C] [--max_tokens N] [--temperature T] [--ignore_eos] [--no_stream] [--model NAME]
 *        [--threads T]  (client threads, each with its share of the C clients; default 4) */
#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

typedef struct Client {
    CURL *curl;
    char *body;           /* the request */
    char *data;           /* the answer so far */
    size_t len, cap;
    double t_start, t_first;
    int request;          /* index of the request it carries */
} Client;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* libcurl's write callback: the bytes appended to the client's buffer (NUL-terminated). */
static size_t append_data(char *p, size_t size, size_t n, void *ud) {
    Client *c = ud;
    if (c->len + size * n + 1 > c->cap) { /* doubling: a stream's thousands of small events stay linear */
        c->cap = 2 * (c->len + size * n + 1);
        c->data = realloc(c->data, c->cap);
    }
    memcpy(c->data + c->len, p, size * n);
    c->len += size * n;
    c->data[c->len] = '\0';
    return size * n;
}

static size_t on_data(char *p, size_t size, size_t n, void *ud) {
    Client *c = ud;
    if (c->t_first == 0 && memmem(p, size * n, "data: ", 6)) c->t_first = now_s(); /* the first event: the first token */
    return append_data(p, size, n, ud);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double percentile(double *v, int n, double q) {
    if (n == 0) return 0;
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    int k = (int)(q * (n - 1) + 0.5);
    return v[k];
}

/* The completion tokens of a finished answer (a stream's usage event, or the whole
 * answer's usage), or -1 when it did not end well. */
static long long answer_tokens(const char *data, int stream) {
    /* an error object opens with {"error" (a completion's text saying "error" comes escaped, or as a "text" value) */
    if (!data || (stream && !strstr(data, "data: [DONE]")) || strstr(data, "{\"error\"")) return -1;
    const char *u = strstr(data, "\"usage\":");
    const char *k = u ? strstr(u, "\"completion_tokens\":") : NULL;
    return k ? atoll(k + strlen("\"completion_tokens\":")) : -1;
}

/* What the threads share: the request bodies, the next request to send, the results. */
typedef struct Run {
    const char *url;
    char **bodies, **paths;
    int n_prompts, requests, stream;
    struct curl_slist *headers;
    pthread_mutex_t mu; /* guards what follows */
    int sent, done, errors, n_ttft;
    long long tokens;
    double *ttft, *latency;
} Run;

typedef struct Worker {
    Run *run;
    int clients;
    pthread_t thread;
} Worker;

/* The run's next request for client cl, or false when every request was sent. */
static bool next_request(Run *run, Client *cl) {
    pthread_mutex_lock(&run->mu);
    int k = run->sent < run->requests ? run->sent++ : -1;
    pthread_mutex_unlock(&run->mu);
    if (k < 0) return false;
    cl->request = k;
    char full[512];
    snprintf(full, sizeof full, "%s%s", run->url, run->paths[k % run->n_prompts]);
    curl_easy_setopt(cl->curl, CURLOPT_URL, full);
    curl_easy_setopt(cl->curl, CURLOPT_POSTFIELDS, run->bodies[k % run->n_prompts]);
    cl->t_start = now_s();
    return true;
}

/* One thread's clients in a closed loop on its own multi handle: one thread for hundreds of streams spends
 * most of a core on their events, and would measure itself instead of the server. */
static void *worker_main(void *arg) {
    Worker *w = arg;
    Run *run = w->run;
    CURLM *multi = curl_multi_init();
    Client *clients = calloc((size_t)w->clients, sizeof(Client));
    int running = 0;
    for (int c = 0; c < w->clients; c++) {
        Client *cl = &clients[c];
        cl->curl = curl_easy_init();
        curl_easy_setopt(cl->curl, CURLOPT_HTTPHEADER, run->headers);
        curl_easy_setopt(cl->curl, CURLOPT_WRITEFUNCTION, on_data);
        curl_easy_setopt(cl->curl, CURLOPT_WRITEDATA, cl);
        curl_easy_setopt(cl->curl, CURLOPT_TIMEOUT, 600L);
        curl_easy_setopt(cl->curl, CURLOPT_PRIVATE, cl);
        if (next_request(run, cl)) curl_multi_add_handle(multi, cl->curl), running++;
    }
    while (running > 0) {
        int still;
        curl_multi_perform(multi, &still);
        CURLMsg *msg;
        int left;
        bool added = false; /* a next request was queued: perform again before any wait, so it is sent now */
        while ((msg = curl_multi_info_read(multi, &left))) {
            if (msg->msg != CURLMSG_DONE) continue;
            Client *cl;
            curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&cl);
            long status = 0;
            curl_easy_getinfo(cl->curl, CURLINFO_RESPONSE_CODE, &status);
            long long n = msg->data.result == CURLE_OK && status == 200 ? answer_tokens(cl->data, run->stream) : -1;
            double t = now_s();
            pthread_mutex_lock(&run->mu);
            if (n < 0) {
                run->errors++;
            } else {
                run->tokens += n;
                if (run->stream && cl->t_first > 0) run->ttft[run->n_ttft++] = cl->t_first - cl->t_start;
            }
            run->latency[run->done++] = t - cl->t_start;
            pthread_mutex_unlock(&run->mu);
            curl_multi_remove_handle(multi, cl->curl);
            running--;
            free(cl->data);
            cl->data = NULL;
            cl->len = cl->cap = 0;
            cl->t_first = 0;
            if (next_request(run, cl)) { /* the client's next request */
                curl_multi_add_handle(multi, cl->curl);
                running++;
                added = true;
            }
        }
        if (running > 0 && !added) curl_multi_poll(multi, NULL, 0, 100, NULL);
    }
    for (int c = 0; c < w->clients; c++) curl_easy_cleanup(clients[c].curl);
    free(clients);
    curl_multi_cleanup(multi);
    return NULL;
}

/* The server's /metrics text (colt serve's colt_engine_*_total counters among it), malloc'd; NULL when it has
 * none (another server). Read right before and after the run, so that their difference
 * covers the run alone. */
static char *engine_counters(const char *url, struct curl_slist *headers) {
    Client buf = {0};
    char full[512];
    snprintf(full, sizeof full, "%s/metrics", url);
    CURL *curl = curl_easy_init();
    curl_easy_setopt(curl, CURLOPT_URL, full);
    curl_easy_setopt(curl, CURLOPT_HTTPHEADER, headers);
    curl_easy_setopt(curl, CURLOPT_WRITEFUNCTION, append_data);
    curl_easy_setopt(curl, CURLOPT_WRITEDATA, &buf);
    curl_easy_setopt(curl, CURLOPT_TIMEOUT, 10L);
    long status = 0;
    if (curl_easy_perform(curl) == CURLE_OK) curl_easy_getinfo(curl, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_cleanup(curl);
    if (status != 200 || !buf.data) {
        free(buf.data);
        return NULL;
    }
    return buf.data;
}

/* value of counter `name` in a /metrics text, or 0 */
static double counter(const char *text, const char *name) {
    size_t n = strlen(name);
    for (const char *at = text; at && (at = strstr(at, name)); at += n)
        if ((at == text || at[-1] == '\n') && at[n] == ' ') return atof(at + n + 1);
    return 0;
}

int main(int argc, char **argv) {
    const char *url = NULL, *prompts_path = NULL, *model = NULL;
    int requests = 256, concurrency = 32, max_tokens = 256, threads = 4;
    double temperature = 0.0;
    int ignore_eos = 0, stream = 1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--ignore_eos")) ignore_eos = 1;
        else if (!strcmp(a, "--no_stream")) stream = 0;
        else if (!v) {
            fprintf(stderr, "bench_serve: %s needs a value\n", a);
            return 2;
        } else if (!strcmp(a, "--url")) url = v, i++;
        else if (!strcmp(a, "--prompts")) prompts_path = v, i++;
        else if (!strcmp(a, "--model")) model = v, i++;
        else if (!strcmp(a, "--requests")) requests = atoi(v), i++;
        else if (!strcmp(a, "--concurrency")) concurrency = atoi(v), i++;
        else if (!strcmp(a, "--threads")) threads = atoi(v), i++;
        else if (!strcmp(a, "--max_tokens")) max_tokens = atoi(v), i++;
        else if (!strcmp(a, "--temperature")) temperature = atof(v), i++;
        else {
            fprintf(stderr, "bench_serve: unknown option %s\n", a);
            return 2;
        }
    }
    if (!url || !prompts_path || requests < 1 || concurrency < 1 || max_tokens < 1 || threads < 1) {
        fprintf(stderr, "usage: bench_serve --url URL --prompts FILE [--requests R] [--concurrency C] [--max_tokens N] "
                        "[--temperature T] [--ignore_eos] [--no_stream] [--model NAME] [--threads T]\n");
        return 2;
    }
    /* The request bodies, one per prompt line. */
    FILE *f = fopen(prompts_path, "r");
    if (!f) {
        fprintf(stderr, "bench_serve: cannot open %s\n", prompts_path);
        return 1;
    }
    char **bodies = NULL, **paths = NULL, line[1 << 16];
    int n_prompts = 0;
    while (fgets(line, sizeof line, f)) {
        json_t *o = json_loads(line, 0, NULL);
        if (!json_is_object(o)) {
            json_decref(o);
            continue;
        }
        json_t *req = json_pack("{s:i,s:f,s:b,s:b,s:{s:b}}", "max_tokens", max_tokens, "temperature", temperature,
                                "ignore_eos", ignore_eos, "stream", stream, "stream_options", "include_usage", 1);
        if (!stream) json_object_del(req, "stream_options");
        if (model) json_object_set_new(req, "model", json_string(model));
        const char *path = "/v1/completions";
        json_t *p = json_object_get(o, "prompt"), *chat = json_object_get(o, "chat"), *msgs = json_object_get(o, "messages");
        if (json_is_string(p)) json_object_set(req, "prompt", p);
        else if (json_is_string(chat)) json_object_set_new(req, "messages", json_pack("[{s:s,s:O}]", "role", "user", "content", chat));
        else if (json_is_array(msgs)) json_object_set(req, "messages", msgs);
        else {
            json_decref(req), json_decref(o);
            continue;
        }
        if (!json_is_string(p)) path = "/v1/chat/completions";
        bodies = realloc(bodies, sizeof(char *) * (size_t)(n_prompts + 1));
        paths = realloc(paths, sizeof(char *) * (size_t)(n_prompts + 1));
        bodies[n_prompts] = json_dumps(req, JSON_COMPACT);
        paths[n_prompts++] = strdup(path);
        json_decref(req), json_decref(o);
    }
    fclose(f);
    if (n_prompts == 0) {
        fprintf(stderr, "bench_serve: %s holds no {\"prompt\"}, {\"chat\"} or {\"messages\"} line\n", prompts_path);
        return 1;
    }

    curl_global_init(CURL_GLOBAL_DEFAULT);
    struct curl_slist *headers = curl_slist_append(NULL, "Content-Type: application/json");
    char auth[300];
    const char *key = getenv("COLT_API_KEY"); /* a server started with a key */
    if (key && key[0]) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %.255s", key);
        headers = curl_slist_append(headers, auth);
    }
    if (concurrency > requests) concurrency = requests;
    if (threads > concurrency) threads = concurrency;
    Run run = {.url = url, .bodies = bodies, .paths = paths, .n_prompts = n_prompts, .requests = requests,
               .stream = stream, .headers = headers,
               .ttft = calloc((size_t)requests, sizeof(double)), .latency = calloc((size_t)requests, sizeof(double))};
    pthread_mutex_init(&run.mu, NULL);
    Worker *workers = calloc((size_t)threads, sizeof(Worker));
    char *metrics_before = engine_counters(url, headers);
    double t0 = now_s();
    for (int t = 0; t < threads; t++) { /* the clients dealt out over the threads */
        workers[t] = (Worker){.run = &run, .clients = concurrency / threads + (t < concurrency % threads)};
        pthread_create(&workers[t].thread, NULL, worker_main, &workers[t]);
    }
    for (int t = 0; t < threads; t++) pthread_join(workers[t].thread, NULL);
    double t_end = now_s();
    char *metrics_after = engine_counters(url, headers);
    int done = run.done, errors = run.errors, n_ttft = run.n_ttft;
    long long tokens = run.tokens;
    double *ttft = run.ttft, *latency = run.latency;
    double seconds = t_end - t0;
    struct rusage ru; /* this one-threaded client near a core's worth of CPU would be the bottleneck */
    getrusage(RUSAGE_SELF, &ru);
    double client_cpu = (double)ru.ru_utime.tv_sec + 1e-6 * (double)ru.ru_utime.tv_usec + (double)ru.ru_stime.tv_sec +
                        1e-6 * (double)ru.ru_stime.tv_usec;
    printf("{\"stream\": %s, \"requests\": %d, \"concurrency\": %d, \"errors\": %d, \"seconds\": %.3f, \"requests_per_s\": %.2f, "
           "\"output_tokens\": %lld, \"output_tokens_per_s\": %.1f, \"ttft_p50_ms\": %.1f, \"ttft_p99_ms\": %.1f, "
           "\"latency_p50_s\": %.3f, \"latency_p99_s\": %.3f, \"client_cpu_s\": %.3f",
           stream ? "true" : "false", requests, concurrency, errors, seconds, requests / seconds, tokens, tokens / seconds,
           1e3 * percentile(ttft, n_ttft, 0.5), 1e3 * percentile(ttft, n_ttft, 0.99), percentile(latency, done, 0.5),
           percentile(latency, done, 0.99), client_cpu);
    /* the server's side of the same interval (colt serve's counters; {} from a server without them) */
    static const char *names[] = {"seconds", "idle_seconds", "loop_seconds", "steps", "graph_steps", "decode_seconds",
                                  "decode_step_tokens"};
    printf(", \"server\": {");
    for (size_t k = 0; metrics_before && metrics_after && k < sizeof names / sizeof names[0]; k++) {
        char name[64];
        snprintf(name, sizeof name, "colt_engine_%s_total", names[k]);
        printf("%s\"%s\": %.6f", k ? ", " : "", names[k], counter(metrics_after, name) - counter(metrics_before, name));
    }
    printf("}}\n");
    free(metrics_before), free(metrics_after);
    for (int i = 0; i < n_prompts; i++) free(bodies[i]), free(paths[i]);
    free(bodies), free(paths), free(workers), free(ttft), free(latency);
    pthread_mutex_destroy(&run.mu);
    curl_slist_free_all(headers);
    curl_global_cleanup();
    return errors ? 1 : 0;
}
