/* http_server.h — colt serve's HTTP side, on libmicrohttpd (a thread per
 * connection): /v1/completions and /v1/chat/completions (whole responses or
 * server-sent events), /v1/models, /health, /metrics, and colt's own
 * /colt/... (the trainer's). Before any handler runs a request passes the gate:
 * with an API key every endpoint but /health wants "Authorization: Bearer
 * KEY" (401); without one /colt/... is off (403); a POST must be
 * application/json (415) from no foreign Origin (403); a server on loopback
 * takes no Host but a loopback one (DNS rebinding: 403); a connection must send
 * its whole request within request_timeout_s, and one address may hold
 * max_connections_per_ip of them. Handler threads parse
 * and check a request (openai.h), submit it to the engine thread
 * (serve_loop.h) and wait on it in bounded slices, watching the client's
 * socket: a client that disconnects has its sequences aborted. Bad requests
 * get an OpenAI error object and a 4xx status, never a crash.
 * Not the engine loop, not the OpenAI shapes, not the command line (cli/cmd_serve.c). */
#ifndef COLT_SERVE_HTTP_SERVER_H
#define COLT_SERVE_HTTP_SERVER_H

#include <stdbool.h>
#include <stddef.h>

#include "serve/openai.h"
#include "serve/serve_loop.h"

typedef struct HttpServerOptions {
    const char *host;        /* a numeric IPv4 or IPv6 address, or "localhost" */
    int port;                /* 0: any free port (http_server_port says which) */
    size_t max_body_bytes;   /* larger bodies get 413 */
    int max_connections;     /* more are refused by the listener */
    int max_connections_per_ip; /* one peer's share of them (0: max_connections / 2) */
    double request_timeout_s; /* headers and body of one request must arrive within this (0: 60 s) */
    const char *api_key;     /* NULL: none (/colt/... then answers 403); else wanted on all but /health */
} HttpServerOptions;

typedef struct HttpServer HttpServer;

/* Binds and starts serving (errors: the address cannot be parsed or bound).
 * loop and ctx must outlive the server. */
int http_server_start(HttpServer **out, const HttpServerOptions *o, ServeLoop *loop, const OpenAIContext *ctx,
                      char *err);
int http_server_port(const HttpServer *s);
/* Whether host is an address http_server_start takes (checked before the model loads). */
int http_server_check_host(const char *host, char *err);
/* Generation requests being answered (their handlers still running). */
int http_server_requests_running(HttpServer *s);
/* Stops accepting connections (the listening socket closes); those open go on. */
void http_server_quiesce(HttpServer *s);
/* Closes every connection and joins their threads; their requests must be
 * finished or failed first (or their waits end within their bounded slices). */
void http_server_stop(HttpServer *s);

#endif
