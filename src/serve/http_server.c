/* http_server.c — see http_server.h. libmicrohttpd runs one thread per
 * connection, so a handler may block: it waits on its request in slices of
 * WAIT_SLICE_S and between slices looks at its socket; a client gone (the
 * peer closed or reset) aborts the request's sequences. The listening socket
 * is colt's own (bind errors say what failed), handed to the daemon.
 * libmicrohttpd's timeout is an idle timer that restarts on every byte, so a
 * peer sending a byte a second would hold its connection forever: a watchdog
 * thread shuts down each connection whose request (headers and body) has not
 * arrived within request_timeout_s. */
#include "serve/http_server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "core/log.h"
#include "dist/store.h"
#include "serve/colt_api.h"

#define WAIT_SLICE_S 0.1
#define STREAM_BLOCK_BYTES (16 * 1024)
#define CONNECTION_IDLE_TIMEOUT_S 300 /* a connection that sends nothing for this long is closed */
#define DEFAULT_REQUEST_TIMEOUT_S 60.0
#define WATCHDOG_PERIOD_S 0.25

typedef struct Counters {
    int64_t responses[6];    /* by status class: [2] 2xx, [4] 4xx, [5] 5xx */
    int64_t requests_running;
    int64_t prompt_tokens, completion_tokens;
    double ttft_sum;         /* seconds to the first token */
    int64_t ttft_count;
    double latency_sum;      /* seconds from submission to the last byte prepared */
    int64_t latency_count;
} Counters;

struct HttpServer {
    struct MHD_Daemon *daemon;
    int listen_fd, port;
    HttpServerOptions o;
    ServeLoop *loop;
    const OpenAIContext *ctx;
    ColtApiContext colt; /* /colt/generate's limits, from ctx */
    pthread_mutex_t mu; /* counters */
    Counters c;
    uint64_t sequence; /* ids: atomic */
    uint64_t unseeded_seed;   /* the seed of every request that gives none (chosen at start) */
    uint64_t unseeded_stream; /* the next RNG stream for their choices: atomic */
    int64_t started;
    /* the watchdog (under mu): connections, their request's deadline */
    struct ConnTrack *conns;
    pthread_t watchdog;
    pthread_cond_t watchdog_cv;
    bool watchdog_stop, watchdog_running;
    int64_t deadline_closes; /* connections cut by the watchdog */
};

/* One connection, from accept to close: whether it is receiving a request
 * and since when (a request fully received is the handler's: no deadline). */
typedef struct ConnTrack {
    int fd;
    double since;
    bool receiving, cut;
    struct ConnTrack *prev, *next;
} ConnTrack;

/* One HTTP request on a connection: its body as it arrives. */
typedef struct Exchange {
    char *body;
    size_t len, cap;
    bool too_large;
    bool answered; /* refused at the headers: the body is read and dropped */
} Exchange;

/* ---------------------------------------------------------------- helpers */

static uint64_t splitmix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* A number no other request of this process gets (ids, seeds of requests without one). */
static uint64_t next_unique(HttpServer *s) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    uint64_t k = __atomic_fetch_add(&s->sequence, 1, __ATOMIC_RELAXED);
    return splitmix64(((uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec) ^ splitmix64(k));
}

static void count_response(HttpServer *s, int status) {
    pthread_mutex_lock(&s->mu);
    s->c.responses[status / 100 < 6 ? status / 100 : 5]++;
    pthread_mutex_unlock(&s->mu);
}

/* Answers with body[len] (malloc'd; the response frees it). */
static enum MHD_Result send_bytes(HttpServer *s, struct MHD_Connection *conn, int status, char *body, size_t len,
                                  const char *content_type) {
    struct MHD_Response *r = MHD_create_response_from_buffer(len, body, MHD_RESPMEM_MUST_FREE);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, content_type);
    enum MHD_Result rc = MHD_queue_response(conn, (unsigned)status, r);
    MHD_destroy_response(r);
    count_response(s, status);
    return rc;
}

static enum MHD_Result send_body(HttpServer *s, struct MHD_Connection *conn, int status, char *body,
                                 const char *content_type) {
    return send_bytes(s, conn, status, body, strlen(body), content_type);
}

static const char *error_type(int status) {
    switch (status) {
    case 400: case 413: case 415: return "invalid_request_error";
    case 401: return "authentication_error";
    case 403: return "permission_error";
    case 404: return "not_found_error";
    case 405: return "method_not_allowed";
    case 503: return "service_unavailable";
    default: return "server_error";
    }
}

static enum MHD_Result send_error(HttpServer *s, struct MHD_Connection *conn, int status, const char *message,
                                  const char *param) {
    return send_body(s, conn, status, openai_error_json(message, error_type(status), param, status),
                     "application/json");
}

/* True when the client closed or reset its connection. A client may also
 * pipeline its next request: readable data is not a disconnect, end of file is. */
static bool client_gone(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!info) return true;
    struct pollfd p = {.fd = info->connect_fd, .events = POLLIN | POLLRDHUP};
    if (poll(&p, 1, 0) <= 0) return false;
    if (p.revents & (POLLERR | POLLHUP | POLLRDHUP | POLLNVAL)) return true;
    char byte;
    ssize_t n = recv(info->connect_fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

/* ---------------------------------------------------------------- generation requests */

/* A submitted request and what its HTTP side has made of it so far. */
typedef struct Generation {
    HttpServer *s;
    struct MHD_Connection *conn;
    OpenAIRequest req;
    ServeRequest *sr;
    int n_choices;
    ChoiceText *texts;
    ChoiceProgress *progress;
    bool *first_sent, *final_sent;
    uint64_t seen;
    char id[48];
    int64_t created;
    double t0;
    /* streaming: bytes prepared and not yet handed to the daemon */
    char *out;
    size_t out_len, out_pos;
    bool ended, usage_sent;
} Generation;

static void generation_free(Generation *g) {
    if (!g) return;
    bool all = true;
    for (int i = 0; g->texts && i < g->n_choices; i++) all &= g->texts[i].finished;
    if (g->sr && !all) serve_request_cancel(g->s->loop, g->sr, -1); /* a client gone: free its sequences */
    for (int i = 0; g->texts && i < g->n_choices; i++) choice_text_free(&g->texts[i]);
    serve_request_release(g->sr);
    openai_request_free(&g->req);
    free(g->texts), free(g->progress), free(g->first_sent), free(g->final_sent), free(g->out);
    pthread_mutex_lock(&g->s->mu);
    g->s->c.requests_running--;
    pthread_mutex_unlock(&g->s->mu);
    free(g);
}

/* Waits one slice for progress and brings every choice's text up to it.
 * Returns 1 when every choice is finished, 0 when not yet, -1 when the request
 * failed (err set). A stop string found cancels its choice in the engine. */
static int generation_advance(Generation *g, char *err) {
    int rc = serve_request_wait(g->sr, g->progress, &g->seen, WAIT_SLICE_S, err);
    if (rc < 0) return -1;
    bool all = true;
    for (int i = 0; i < g->n_choices; i++) {
        bool hit = false;
        if (choice_text_update(&g->texts[i], serve_request_sequence(g->sr, i), &g->progress[i], &g->req,
                               g->s->ctx->tok, &hit, err) != 0)
            return -1;
        if (hit) serve_request_cancel(g->s->loop, g->sr, i);
        all &= g->texts[i].finished && (!g->req.scores || g->progress[i].scored);
    }
    return all ? 1 : 0;
}

static void count_finished(Generation *g) {
    HttpServer *s = g->s;
    long long prompt = 0, completion = 0;
    for (int i = 0; i < g->req.n_prompts; i++) prompt += g->req.prompt_lens[i];
    for (int i = 0; i < g->n_choices; i++) completion += g->texts[i].n_tokens;
    double ttft = serve_request_first_token_seconds(g->sr);
    pthread_mutex_lock(&s->mu);
    s->c.prompt_tokens += prompt;
    s->c.completion_tokens += completion;
    if (ttft > 0) s->c.ttft_sum += ttft, s->c.ttft_count++;
    s->c.latency_sum += time_now() - g->t0;
    s->c.latency_count++;
    pthread_mutex_unlock(&s->mu);
}

/* Streaming: the daemon asks for bytes; this prepares the next events,
 * waiting in slices while nothing is new and the client is still there. */
static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max) {
    Generation *g = cls;
    (void)pos;
    char err[ERR_LEN];
    while (g->out_pos == g->out_len) {
        if (g->ended) return MHD_CONTENT_READER_END_OF_STREAM;
        g->out_len = g->out_pos = 0;
        if (client_gone(g->conn)) return MHD_CONTENT_READER_END_WITH_ERROR; /* generation_free aborts the rest */
        int rc = generation_advance(g, err);
        if (rc < 0) {
            openai_stream_error(&g->out, &g->out_len, err);
            openai_stream_done(&g->out, &g->out_len);
            g->ended = true;
            break;
        }
        for (int i = 0; i < g->n_choices; i++) {
            ChoiceText *ct = &g->texts[i];
            size_t end = choice_text_stream_end(ct, &g->req);
            bool new_text = end > ct->streamed, new_logprobs = g->req.logprobs && ct->n_tokens > ct->n_logprobs_sent;
            bool final = ct->finished && end == (ct->text ? strlen(ct->text) : 0) && !g->final_sent[i];
            bool first = g->req.endpoint == OPENAI_CHAT && !g->first_sent[i];
            if (!(new_text || new_logprobs || final || first)) continue;
            openai_stream_chunk(&g->out, &g->out_len, &g->req, g->sr, ct, i, ct->streamed, end, first, g->id,
                                g->created, g->s->ctx);
            ct->streamed = end;
            g->first_sent[i] = true;
            if (final) g->final_sent[i] = true;
        }
        if (rc == 1) {
            bool all_final = true;
            for (int i = 0; i < g->n_choices; i++) all_final &= g->final_sent[i];
            if (all_final) {
                if (g->req.include_usage)
                    openai_stream_usage(&g->out, &g->out_len, &g->req, g->sr, g->texts, g->id, g->created, g->s->ctx);
                openai_stream_done(&g->out, &g->out_len);
                count_finished(g);
                g->ended = true;
            }
        }
    }
    size_t n = g->out_len - g->out_pos < max ? g->out_len - g->out_pos : max;
    memcpy(buf, g->out + g->out_pos, n);
    g->out_pos += n;
    return (ssize_t)n;
}

static void stream_free(void *cls) { generation_free(cls); }

static enum MHD_Result handle_generation(HttpServer *s, struct MHD_Connection *conn, OpenAIEndpoint ep,
                                         const Exchange *x) {
    char err[ERR_LEN];
    const char *param = NULL;
    Generation *g = xcalloc(1, sizeof *g);
    g->s = s;
    g->conn = conn;
    pthread_mutex_lock(&s->mu);
    s->c.requests_running++;
    pthread_mutex_unlock(&s->mu);
    if (openai_parse_request(&g->req, ep, x->body ? x->body : "", x->len, s->ctx, s->unseeded_seed, &param, err) !=
        0) {
        generation_free(g);
        return send_error(s, conn, 400, err, param);
    }
    g->sr = serve_request_create(g->req.prompts, g->req.prompt_lens, g->req.n_prompts, g->req.n, &g->req.opt);
    if (g->req.scores) serve_request_want_scores(g->sr, g->req.top_logprobs);
    if (!g->req.stream && g->req.n_stop_strings == 0) serve_request_wake_at_end(g->sr); /* choice_text_update */
    if (!g->req.seeded) { /* streams of their own under the shared seed (the engine's streams are 31-bit) */
        int n = serve_request_choices(g->sr);
        uint64_t *streams = xmalloc(sizeof(uint64_t) * (size_t)n);
        uint64_t base = __atomic_fetch_add(&s->unseeded_stream, (uint64_t)n, __ATOMIC_RELAXED);
        for (int i = 0; i < n; i++) streams[i] = (base + (uint64_t)i) & 0x7fffffffu;
        serve_request_set_streams(g->sr, streams);
        free(streams);
    }
    openai_take_prompts(&g->req);
    g->n_choices = serve_request_choices(g->sr);
    g->texts = xcalloc((size_t)g->n_choices, sizeof(ChoiceText));
    g->progress = xcalloc((size_t)g->n_choices, sizeof(ChoiceProgress));
    g->first_sent = xcalloc((size_t)g->n_choices, sizeof(bool));
    g->final_sent = xcalloc((size_t)g->n_choices, sizeof(bool));
    snprintf(g->id, sizeof g->id, "%s-%016llx", ep == OPENAI_CHAT ? "chatcmpl" : "cmpl",
             (unsigned long long)next_unique(s));
    g->created = (int64_t)time(NULL);
    g->t0 = time_now();
    int status = 0;
    if (serve_loop_submit(s->loop, g->sr, &status, err) != 0) {
        for (int i = 0; i < g->n_choices; i++) g->texts[i].finished = true; /* nothing to cancel */
        generation_free(g);
        return send_error(s, conn, status, err, NULL);
    }
    if (g->req.stream) {
        struct MHD_Response *r =
            MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, STREAM_BLOCK_BYTES, stream_read, g, stream_free);
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        enum MHD_Result rc = MHD_queue_response(conn, 200, r);
        MHD_destroy_response(r);
        count_response(s, 200);
        return rc;
    }
    for (;;) {
        int rc = generation_advance(g, err);
        if (rc < 0) {
            generation_free(g);
            return send_error(s, conn, 500, err, NULL);
        }
        if (rc == 1) break;
        if (client_gone(conn)) {
            generation_free(g); /* aborts what is left */
            return MHD_NO;      /* closes the connection */
        }
    }
    count_finished(g);
    char *body = openai_response_json(&g->req, g->sr, g->texts, g->id, g->created, s->ctx);
    generation_free(g);
    return send_body(s, conn, 200, body, "application/json");
}

/* ---------------------------------------------------------------- colt's endpoints (colt_api.h) */

/* /colt/generate: the whole answer at once; the client gone aborts it. */
static enum MHD_Result handle_colt_generate(HttpServer *s, struct MHD_Connection *conn, const Exchange *x) {
    char err[ERR_LEN];
    ColtGenerateRequest q;
    if (colt_generate_parse(&q, x->body ? x->body : "", x->len, &s->colt, err) != 0)
        return send_error(s, conn, 400, err, NULL);
    ServeRequest *sr = serve_request_create(q.prompts, q.prompt_lens, q.n_prompts, 1, &q.opt);
    q.prompts = NULL; /* the request took them */
    serve_request_set_streams(sr, q.streams);
    serve_request_set_turns(sr, q.first_positions, q.max_tokens_each);
    serve_request_wake_at_end(sr); /* the answer is whole */
    colt_generate_free(&q);
    pthread_mutex_lock(&s->mu);
    s->c.requests_running++;
    pthread_mutex_unlock(&s->mu);
    int n = serve_request_choices(sr), status = 500;
    ChoiceProgress *progress = xcalloc((size_t)n, sizeof(ChoiceProgress));
    uint64_t seen = 0;
    enum MHD_Result result;
    if (serve_loop_submit(s->loop, sr, &status, err) != 0) {
        result = send_error(s, conn, status, err, NULL);
    } else {
        int rc = 0;
        for (;;) {
            rc = serve_request_wait(sr, progress, &seen, WAIT_SLICE_S, err);
            if (rc < 0) break;
            bool all = true;
            for (int i = 0; i < n; i++) all &= progress[i].done;
            if (all) break;
            if (client_gone(conn)) {
                rc = -2;
                break;
            }
        }
        if (rc == -2) {
            serve_request_cancel(s->loop, sr, -1);
            result = MHD_NO; /* closes the connection */
        } else if (rc < 0) {
            result = send_error(s, conn, 500, err, NULL);
        } else {
            ServeLoopStats st;
            serve_loop_stats(s->loop, &st);
            const char *accept = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_ACCEPT);
            if (accept && strstr(accept, COLT_GENERATE_BINARY_TYPE)) { /* colt train's: the bytes as they are */
                size_t len = 0;
                char *bytes = colt_generate_response_binary(sr, st.weight_updates, &len);
                result = send_bytes(s, conn, 200, bytes, len, COLT_GENERATE_BINARY_TYPE);
            } else {
                result = send_body(s, conn, 200, colt_generate_response_json(sr, st.weight_updates),
                                   "application/json");
            }
        }
    }
    free(progress);
    serve_request_release(sr);
    pthread_mutex_lock(&s->mu);
    s->c.requests_running--;
    pthread_mutex_unlock(&s->mu);
    return result;
}

/* The weight channel: queued for the engine thread; the answer comes at once. */
static enum MHD_Result handle_colt_sync(HttpServer *s, struct MHD_Connection *conn, ServeSyncOp op,
                                        const Exchange *x) {
    char err[ERR_LEN];
    ServeSyncRequest q;
    int status = 400;
    if (colt_sync_parse(&q, op, x->body ? x->body : "", x->len, s->o.host, err) != 0)
        return send_error(s, conn, status, err, NULL);
    /* the channel's store listens where this server does, and its members need the key too */
    snprintf(q.bind_host, sizeof q.bind_host, "%s", s->o.host);
    COLT_ASSERT(s->o.api_key && strlen(s->o.api_key) < sizeof q.token); /* the gate let no keyless /colt/ through */
    snprintf(q.token, sizeof q.token, "%s", s->o.api_key);
    if (serve_loop_weight_sync(s->loop, &q, &status, err) != 0) return send_error(s, conn, status, err, NULL);
    return send_body(s, conn, 200, xstrdup("{}"), "application/json");
}

/* ---------------------------------------------------------------- other endpoints */

static char *metrics_text(HttpServer *s) {
    ServeLoopStats st;
    serve_loop_stats(s->loop, &st);
    pthread_mutex_lock(&s->mu);
    Counters c = s->c;
    pthread_mutex_unlock(&s->mu);
    char *out = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&out, &len);
#define METRIC(name, type, help, fmt, ...) \
    fprintf(f, "# HELP colt_" name " " help "\n# TYPE colt_" name " " type "\n" fmt, __VA_ARGS__)
    METRIC("http_responses_total", "counter", "HTTP responses by status class.",
           "colt_http_responses_total{class=\"2xx\"} %lld\ncolt_http_responses_total{class=\"4xx\"} %lld\n"
           "colt_http_responses_total{class=\"5xx\"} %lld\n",
           (long long)c.responses[2], (long long)c.responses[4], (long long)c.responses[5]);
    METRIC("requests_running", "gauge", "Generation requests being answered.", "colt_requests_running %lld\n",
           (long long)c.requests_running);
    METRIC("requests_finished_total", "counter", "Generation requests the engine completed.",
           "colt_requests_finished_total %lld\n", (long long)st.requests_finished);
    METRIC("prompt_tokens_total", "counter", "Prompt tokens of answered requests.", "colt_prompt_tokens_total %lld\n",
           (long long)c.prompt_tokens);
    METRIC("generation_tokens_total", "counter", "Tokens sampled by the engine.",
           "colt_generation_tokens_total %lld\n", (long long)st.engine.decode_tokens);
    METRIC("generation_tokens_per_second", "gauge", "Tokens sampled per second over the last 10 s.",
           "colt_generation_tokens_per_second %.1f\n", st.tokens_per_second);
    METRIC("sequences_running", "gauge", "Sequences in the KV pool.", "colt_sequences_running %d\n", st.load.running);
    METRIC("sequences_waiting", "gauge", "Sequences queued for the pool.", "colt_sequences_waiting %d\n",
           st.load.waiting);
    METRIC("sequences_in_flight", "gauge", "Sequences submitted and not finished.", "colt_sequences_in_flight %d\n",
           st.outstanding);
    METRIC("kv_cache_usage_ratio", "gauge", "Fraction of the KV pool's blocks held by running sequences.",
           "colt_kv_cache_usage_ratio %.4f\n",
           st.load.pool_blocks ? (double)st.load.blocks_used / st.load.pool_blocks : 0.0);
    METRIC("kv_cache_blocks", "gauge", "Blocks of the KV pool.", "colt_kv_cache_blocks %d\n", st.load.pool_blocks);
    METRIC("prefix_cache_hit_tokens_total", "counter", "Prompt tokens taken from the prefix cache.",
           "colt_prefix_cache_hit_tokens_total %lld\n", (long long)st.engine.shared_tokens);
    METRIC("preemptions_total", "counter", "Sequences evicted from the pool and recomputed.",
           "colt_preemptions_total %d\n", st.engine.preemptions);
    METRIC("engine_steps_total", "counter", "Forward calls of the engine.", "colt_engine_steps_total %d\n",
           st.engine.steps);
    METRIC("engine_graph_steps_total", "counter", "Engine steps replayed from a CUDA graph (pure decode steps).",
           "colt_engine_graph_steps_total %d\n", st.engine.graph_steps);
    METRIC("engine_seconds_total", "counter", "Wall time inside engine steps (forward, sampling, bookkeeping).",
           "colt_engine_seconds_total %.6f\n", st.engine.seconds);
    METRIC("engine_idle_seconds_total", "counter", "Wall time the engine thread waited for work (nothing running or queued).",
           "colt_engine_idle_seconds_total %.6f\n", st.idle_seconds);
    METRIC("engine_loop_seconds_total", "counter",
           "Wall time the engine thread spent between steps (admitting, publishing, aborting, scoring, weight pushes).",
           "colt_engine_loop_seconds_total %.6f\n", st.loop_seconds);
    METRIC("engine_decode_seconds_total", "counter", "Of it, the pure decode steps (one token per running sequence).",
           "colt_engine_decode_seconds_total %.6f\n", st.engine.decode_seconds);
    METRIC("engine_decode_wait_seconds_total", "counter",
           "Of the decode steps, the time spent waiting for the device's results (the rest is the host's).",
           "colt_engine_decode_wait_seconds_total %.6f\n", st.engine.decode_wait_seconds);
    METRIC("engine_decode_step_tokens_total", "counter", "Tokens sampled in pure decode steps.",
           "colt_engine_decode_step_tokens_total %lld\n", (long long)st.engine.decode_step_tokens);
    METRIC("engine_prefill_tokens_total", "counter", "Prompt (and recomputed) tokens run by the engine.",
           "colt_engine_prefill_tokens_total %lld\n", (long long)st.engine.prefill_tokens);
    METRIC("time_to_first_token_seconds", "summary", "From submission to the first sampled token.",
           "colt_time_to_first_token_seconds_sum %.6f\ncolt_time_to_first_token_seconds_count %lld\n", c.ttft_sum,
           (long long)c.ttft_count);
    METRIC("request_seconds", "summary", "From submission to the whole answer.",
           "colt_request_seconds_sum %.6f\ncolt_request_seconds_count %lld\n", c.latency_sum,
           (long long)c.latency_count);
    METRIC("weight_updates_total", "counter", "Weight pushes received from a trainer (/colt/update_weights).",
           "colt_weight_updates_total %lld\n", (long long)st.weight_updates);
    METRIC("weight_update_bytes", "gauge", "Bytes of the last weight push (with LoRA: the adapters alone after the first).",
           "colt_weight_update_bytes %.0f\n", st.last_update_bytes);
    METRIC("weight_sync_failures_total", "counter", "Weight-channel operations that failed (the channel then closes).",
           "colt_weight_sync_failures_total %lld\n", (long long)st.weight_sync_failures);
    METRIC("engine_failed", "gauge", "1 when the engine failed (the server then answers 500).",
           "colt_engine_failed %d\n", st.failed ? 1 : 0);
#undef METRIC
    fclose(f);
    return out;
}

/* ---------------------------------------------------------------- the gate */

/* Whether given equals secret, in time that depends on secret's length alone. */
static bool http_secret_equal(const char *given, const char *secret) {
    size_t n = strlen(secret), m = strlen(given);
    unsigned char diff = (unsigned char)(n != m);
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)((i < m ? given[i] : 0) ^ secret[i]);
    return diff == 0;
}

/* Whether an Origin header names this server: its authority (after "scheme://") equals the Host header. */
static bool same_origin(const char *origin, const char *host) {
    const char *at = strstr(origin, "://");
    return at && host && strcasecmp(at + 3, host) == 0;
}

/* Whether a Host header names a loopback address (port aside): what a client
 * of a loopback-bound server sends, unless a page's DNS name was rebound to
 * 127.0.0.1 to make the browser call this server as that name's origin. */
static bool loopback_host_header(const char *host) {
    char name[256];
    if (!host) return true; /* HTTP/1.0 */
    const char *end = host[0] == '[' ? strchr(host, ']') : strchr(host, ':');
    size_t n = end ? (size_t)(end - host) : strlen(host);
    if (host[0] == '[') host++, n = n > 0 ? n - 1 : 0;
    if (n >= sizeof name) return false;
    memcpy(name, host, n);
    name[n] = '\0';
    return store_host_is_loopback(name);
}

/* Whether the Content-Type header type names want (parameters after ';' allowed). */
static bool content_type_is(const char *type, const char *want) {
    size_t n = strlen(want);
    return type && strncasecmp(type, want, n) == 0 && (!type[n] || type[n] == ';' || type[n] == ' ');
}

/* Decides from the headers alone whether a request may go on; 0, or the
 * status it gets with msg. Browsers are the reason for the last three: a page
 * may send a "simple" cross-origin POST (text/plain, no preflight) to any
 * address this machine reaches, 127.0.0.1 included, or rebind its own DNS
 * name to 127.0.0.1 and call this server as its own origin. */
static int gate(HttpServer *s, struct MHD_Connection *conn, const char *url, bool post, char *msg, size_t size) {
    if (strcmp(url, "/health") == 0) return 0;
    const char *host = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    if (store_host_is_loopback(s->o.host) && !loopback_host_header(host)) {
        snprintf(msg, size, "Host %.100s is not this server (it listens on %s): DNS names other than localhost are "
                            "refused on a loopback address", host, s->o.host);
        return 403;
    }
    if (!s->o.api_key && strncmp(url, "/colt/", 6) == 0) {
        snprintf(msg, size, "%.100s is off: colt's trainer endpoints (/colt/*: generation by token ids, the weight "
                            "channel) need an API key; start colt serve with --api_key KEY (or COLT_API_KEY=KEY) "
                            "and give the trainer the same key (vllm_server_api_key)", url);
        return 403;
    }
    if (s->o.api_key) {
        const char *auth = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
        if (!auth || strncasecmp(auth, "Bearer ", 7) != 0 || !http_secret_equal(auth + 7, s->o.api_key)) {
            snprintf(msg, size, "%s API key: send the header 'Authorization: Bearer KEY' with the key colt serve was "
                                "started with (--api_key or COLT_API_KEY)", auth ? "wrong" : "no");
            return 401;
        }
    }
    if (!post) return 0;
    const char *origin = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, "Origin");
    if (origin && !same_origin(origin, MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST))) {
        snprintf(msg, size, "cross-origin requests are refused (Origin %.100s is not this server)", origin);
        return 403;
    }
    const char *type = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    /* /colt/generate also takes colt train's binary body (colt_api.h); no browser sends that type without a
     * preflight, which this server never answers */
    bool binary = strcmp(url, "/colt/generate") == 0 && content_type_is(type, COLT_GENERATE_BINARY_TYPE);
    if (!content_type_is(type, "application/json") && !binary) {
        snprintf(msg, size, "the body must be JSON sent as 'Content-Type: application/json' (got %.60s)",
                 type ? type : "none");
        return 415;
    }
    return 0;
}

/* The watchdog's record of conn (NULL when it has none). */
static ConnTrack *conn_track(struct MHD_Connection *conn) {
    const union MHD_ConnectionInfo *info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return info ? (ConnTrack *)info->socket_context : NULL;
}

static void track_receiving(HttpServer *s, struct MHD_Connection *conn, bool receiving) {
    ConnTrack *t = conn_track(conn);
    if (!t) return;
    pthread_mutex_lock(&s->mu);
    t->receiving = receiving;
    t->since = time_now();
    pthread_mutex_unlock(&s->mu);
}

static void on_connection(void *cls, struct MHD_Connection *conn, void **socket_context,
                          enum MHD_ConnectionNotificationCode code) {
    HttpServer *s = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED) {
        const union MHD_ConnectionInfo *info = MHD_get_connection_info(conn, MHD_CONNECTION_INFO_CONNECTION_FD);
        ConnTrack *t = xcalloc(1, sizeof *t);
        t->fd = info ? info->connect_fd : -1;
        t->since = time_now();
        t->receiving = true;
        pthread_mutex_lock(&s->mu);
        t->next = s->conns;
        if (s->conns) s->conns->prev = t;
        s->conns = t;
        pthread_mutex_unlock(&s->mu);
        *socket_context = t;
    } else if (code == MHD_CONNECTION_NOTIFY_CLOSED && *socket_context) {
        ConnTrack *t = *socket_context; /* unlinked before the daemon closes its socket */
        pthread_mutex_lock(&s->mu);
        if (t->prev) t->prev->next = t->next;
        else s->conns = t->next;
        if (t->next) t->next->prev = t->prev;
        pthread_mutex_unlock(&s->mu);
        free(t);
        *socket_context = NULL;
    }
}

/* Cuts every connection whose request is late: shutting its socket down ends
 * its thread's read, and the daemon closes it. */
static void *watchdog_main(void *arg) {
    HttpServer *s = arg;
    pthread_mutex_lock(&s->mu);
    while (!s->watchdog_stop) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_nsec += (long)(WATCHDOG_PERIOD_S * 1e9);
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&s->watchdog_cv, &s->mu, &ts);
        double now = time_now();
        for (ConnTrack *t = s->conns; t; t = t->next)
            if (t->receiving && !t->cut && t->fd >= 0 && now - t->since > s->o.request_timeout_s) {
                shutdown(t->fd, SHUT_RDWR);
                t->cut = true;
                s->deadline_closes++;
            }
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

static enum MHD_Result route(HttpServer *s, struct MHD_Connection *conn, const char *url, const char *method,
                             const Exchange *x) {
    bool get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0;
    struct { const char *path; bool post; } routes[] = {
        {"/v1/completions", true}, {"/v1/chat/completions", true}, {"/v1/models", false},
        {"/health", false},        {"/metrics", false},
        {"/colt/generate", true},  {"/colt/init_weight_sync", true}, {"/colt/update_weights", true},
        {"/colt/close_weight_sync", true}, {"/colt/info", false},
    };
    int k = 0, n = (int)(sizeof routes / sizeof routes[0]);
    while (k < n && strcmp(url, routes[k].path) != 0) k++;
    if (k == n) {
        char msg[400];
        snprintf(msg, sizeof msg, "no endpoint %.200s (there are /v1/completions, /v1/chat/completions, /v1/models, "
                                  "/health, /metrics, /colt/generate, /colt/init_weight_sync, /colt/update_weights, "
                                  "/colt/close_weight_sync, /colt/info)", url);
        return send_error(s, conn, 404, msg, NULL);
    }
    if (routes[k].post ? !post : !get) {
        char msg[200];
        snprintf(msg, sizeof msg, "%s takes %s, not %.20s", routes[k].path, routes[k].post ? "POST" : "GET", method);
        return send_error(s, conn, 405, msg, NULL);
    }
    if (x->too_large) {
        char msg[200];
        snprintf(msg, sizeof msg, "the request body is larger than this server's limit of %zu bytes",
                 s->o.max_body_bytes);
        return send_error(s, conn, 413, msg, NULL);
    }
    switch (k) {
    case 0: return handle_generation(s, conn, OPENAI_COMPLETIONS, x);
    case 1: return handle_generation(s, conn, OPENAI_CHAT, x);
    case 2: return send_body(s, conn, 200, openai_models_json(s->ctx, s->started), "application/json");
    case 3:
        if (!serve_loop_healthy(s->loop)) return send_error(s, conn, 503, "not serving: draining or the engine failed", NULL);
        return send_body(s, conn, 200, xstrdup(""), "text/plain");
    case 4: return send_body(s, conn, 200, metrics_text(s), "text/plain; version=0.0.4");
    case 5: return handle_colt_generate(s, conn, x);
    case 6: return handle_colt_sync(s, conn, SERVE_SYNC_OPEN, x);
    case 7: return handle_colt_sync(s, conn, SERVE_SYNC_RECV, x);
    case 8: return handle_colt_sync(s, conn, SERVE_SYNC_CLOSE, x);
    default: {
        ServeLoopStats st;
        serve_loop_stats(s->loop, &st);
        return send_body(s, conn, 200, colt_info_json(&st, &s->colt), "application/json");
    }
    }
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *conn, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls) {
    HttpServer *s = cls;
    (void)version;
    Exchange *x = *con_cls;
    if (!x) { /* the headers: a request the gate refuses, or a body announced as too large, is answered now */
        x = xcalloc(1, sizeof *x);
        *con_cls = x;
        char msg[512];
        int status = gate(s, conn, url, strcmp(method, "POST") == 0, msg, sizeof msg);
        if (status) {
            x->answered = true;
            return send_error(s, conn, status, msg, NULL);
        }
        const char *cl = MHD_lookup_connection_value(conn, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->o.max_body_bytes) {
            x->too_large = x->answered = true;
            return route(s, conn, url, method, x);
        }
        return MHD_YES;
    }
    if (x->answered) { /* what follows a refused request's headers is dropped */
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        if (!x->too_large && x->len + *upload_data_size > s->o.max_body_bytes) {
            x->too_large = true;
            free(x->body);
            x->body = NULL;
            x->len = x->cap = 0;
        }
        if (!x->too_large) {
            if (x->len + *upload_data_size + 1 > x->cap) {
                x->cap = 2 * (x->len + *upload_data_size + 1);
                x->body = xrealloc(x->body, x->cap);
            }
            memcpy(x->body + x->len, upload_data, *upload_data_size);
            x->len += *upload_data_size;
            x->body[x->len] = '\0';
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    track_receiving(s, conn, false); /* the whole request is here: no deadline while it is answered */
    return route(s, conn, url, method, x);
}

static void on_completed(void *cls, struct MHD_Connection *conn, void **con_cls, enum MHD_RequestTerminationCode toe) {
    (void)toe;
    track_receiving(cls, conn, true); /* a kept-alive connection's next request has its own deadline */
    Exchange *x = *con_cls;
    if (x) free(x->body), free(x);
    *con_cls = NULL;
}

/* ---------------------------------------------------------------- the daemon */

/* host (numeric, or "localhost") and port as a socket address. */
static int parse_address(struct sockaddr_storage *addr, socklen_t *addr_len, bool *ipv6, const char *host, int port,
                         char *err) {
    memset(addr, 0, sizeof *addr);
    const char *numeric = strcmp(host, "localhost") == 0 ? "127.0.0.1" : host;
    struct sockaddr_in *a4 = (struct sockaddr_in *)addr;
    struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)addr;
    if (inet_pton(AF_INET, numeric, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons((uint16_t)port);
        *addr_len = sizeof *a4;
        *ipv6 = false;
    } else if (inet_pton(AF_INET6, numeric, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons((uint16_t)port);
        *addr_len = sizeof *a6;
        *ipv6 = true;
    } else {
        return errorf(err, "--host %s: give a numeric IP address (127.0.0.1, 0.0.0.0, ::1) or localhost", host);
    }
    return COLT_OK;
}

int http_server_check_host(const char *host, char *err) {
    struct sockaddr_storage addr;
    socklen_t len;
    bool ipv6;
    return parse_address(&addr, &len, &ipv6, host, 0, err);
}

/* backlog: connections the kernel queues before they are accepted. A burst of
 * clients past it has its SYNs dropped and retried a second later (TCP's
 * first retransmission), so it is the connection limit, not a small default. */
static int open_listener(const char *host, int port, int backlog, int *fd_out, int *bound_port, bool *ipv6,
                         char *err) {
    struct sockaddr_storage addr;
    socklen_t addr_len;
    if (parse_address(&addr, &addr_len, ipv6, host, port, err) != 0) return COLT_ERR;
    int fd = socket(addr.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0), one = 1;
    if (fd < 0) return errorf(err, "socket: %s", strerror(errno));
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&addr, addr_len) != 0 || listen(fd, backlog) != 0) {
        int e = errno;
        close(fd);
        return errorf(err, "cannot listen on %s port %d: %s", host, port, strerror(e));
    }
    struct sockaddr_storage got;
    socklen_t got_len = sizeof got;
    getsockname(fd, (struct sockaddr *)&got, &got_len);
    *bound_port = ntohs(got.ss_family == AF_INET ? ((struct sockaddr_in *)&got)->sin_port
                                                 : ((struct sockaddr_in6 *)&got)->sin6_port);
    *fd_out = fd;
    return COLT_OK;
}

int http_server_start(HttpServer **out, const HttpServerOptions *o, ServeLoop *loop, const OpenAIContext *ctx,
                      char *err) {
    *out = NULL;
    HttpServer *s = xcalloc(1, sizeof *s);
    s->o = *o;
    if (s->o.request_timeout_s <= 0) s->o.request_timeout_s = DEFAULT_REQUEST_TIMEOUT_S;
    if (s->o.max_connections_per_ip <= 0) s->o.max_connections_per_ip = o->max_connections > 1 ? o->max_connections / 2 : 1;
    s->loop = loop;
    s->ctx = ctx;
    s->unseeded_seed = next_unique(s);
    s->colt = (ColtApiContext){.vocab_size = ctx->vocab_size, .max_model_len = ctx->max_model_len,
                               .max_tokens_limit = ctx->max_tokens_limit, .eos_ids = ctx->eos_ids,
                               .n_eos = ctx->n_eos};
    s->started = (int64_t)time(NULL);
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->watchdog_cv, NULL);
    bool ipv6 = false;
    if (open_listener(o->host, o->port, o->max_connections, &s->listen_fd, &s->port, &ipv6, err) != 0) {
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->watchdog_cv);
        free(s);
        return COLT_ERR;
    }
    unsigned flags = MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_THREAD_PER_CONNECTION | MHD_USE_AUTO | MHD_USE_ITC;
    if (ipv6) flags |= MHD_USE_IPv6;
    s->daemon = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s, MHD_OPTION_LISTEN_SOCKET, s->listen_fd,
                                 MHD_OPTION_CONNECTION_LIMIT, (unsigned)o->max_connections,
                                 MHD_OPTION_PER_IP_CONNECTION_LIMIT, (unsigned)s->o.max_connections_per_ip,
                                 MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)CONNECTION_IDLE_TIMEOUT_S,
                                 MHD_OPTION_NOTIFY_CONNECTION, on_connection, s,
                                 MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_END);
    if (s->daemon && pthread_create(&s->watchdog, NULL, watchdog_main, s) == 0) s->watchdog_running = true;
    if (!s->daemon || !s->watchdog_running) {
        if (s->daemon) MHD_stop_daemon(s->daemon);
        close(s->listen_fd);
        pthread_mutex_destroy(&s->mu);
        pthread_cond_destroy(&s->watchdog_cv);
        free(s);
        return errorf(err, "libmicrohttpd could not start on %s port %d", o->host, o->port);
    }
    *out = s;
    return COLT_OK;
}

int http_server_port(const HttpServer *s) { return s->port; }

int http_server_requests_running(HttpServer *s) {
    pthread_mutex_lock(&s->mu);
    int n = (int)s->c.requests_running;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void http_server_quiesce(HttpServer *s) {
    if (s->listen_fd < 0) return;
    MHD_socket fd = MHD_quiesce_daemon(s->daemon);
    if (fd != MHD_INVALID_SOCKET) close(fd);
    s->listen_fd = -1;
}

void http_server_stop(HttpServer *s) {
    if (!s) return;
    pthread_mutex_lock(&s->mu);
    s->watchdog_stop = true;
    pthread_cond_signal(&s->watchdog_cv);
    pthread_mutex_unlock(&s->mu);
    pthread_join(s->watchdog, NULL);
    MHD_stop_daemon(s->daemon);
    if (s->listen_fd >= 0) close(s->listen_fd);
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->watchdog_cv);
    free(s);
}
