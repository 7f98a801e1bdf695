/* cmd_serve.c — `colt serve`: an OpenAI-style HTTP generation server over a
 * persistent engine. The model and engine belong to one engine thread
 * (serve/serve_loop.h); HTTP connections (serve/http_server.h) submit
 * requests to it, and requests of all clients are batched together. The main
 * thread waits for SIGTERM / SIGINT: then no new connection is accepted, the
 * requests in flight finish (at most --drain_timeout seconds, or until a
 * second signal, after which they are cut), and the process exits 0.
 * Tensor parallel (--tensor_parallel_size N: colt starts N processes
 * itself, or runs as one of mpirun's / torchrun's N): every process loads
 * its part of the model; rank 0 serves HTTP and runs the loop, the others
 * follow its engine calls turn by turn (serve/serve_turn.h).
 * The key (--api_key or COLT_API_KEY) is read here once and handed to the
 * HTTP gate; a --host other than loopback without one gets a warning.
 * Not the weight channel (serve_loop.c, parallel/weight_sync.c) nor the HTTP
 * protocol (http_server.c, openai.c, colt_api.c). */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "cli/cli.h"
#include "core/error.h"
#include "core/fileio.h"
#include "core/log.h"
#include "data/prompt.h"
#include "dist/launch_env.h"
#include "dist/local_launch.h"
#include "dist/store.h"
#include "parallel/mesh.h"
#include "model/lora.h"
#include "model/model.h"
#include "serve/http_server.h"
#include "serve/openai.h"
#include "serve/serve_loop.h"
#include "serve/serve_turn.h"
#include "tokenizer/tokenizer.h"

static const char *SERVE_USAGE =
    "usage: colt serve --model DIR [--host 127.0.0.1] [--port 8000] [options]\n"
    "  OpenAI-style HTTP: POST /v1/completions, POST /v1/chat/completions (\"stream\": true for server-sent\n"
    "  events), GET /v1/models, /health, /metrics (Prometheus text). Binds 127.0.0.1 unless --host says\n"
    "  otherwise (0.0.0.0: every interface). SIGTERM or Ctrl-C: finishes the requests in flight, then exits 0.\n"
    "  Settings a request leaves out come from generation_config.json when it samples (do_sample), else\n"
    "  OpenAI's defaults (temperature 1); a request without a seed gets a fresh one.\n"
    "  --tensor_parallel_size N: the model cut across N processes, one per GPU (colt starts them, or run it under\n"
    "  mpirun -np N / torchrun --nproc_per_node N); rank 0 serves HTTP and the others follow its engine. SIGTERM\n"
    "  to colt (or to rank 0, whose pid is printed) drains the requests, then every process exits 0.\n"
    "  Security: --api_key KEY (or COLT_API_KEY=KEY, which ps does not show): every endpoint but /health wants\n"
    "  'Authorization: Bearer KEY'. Without a key the trainer's endpoints (/colt/*, the weight channel) are off.\n"
    "  POST bodies must be application/json; there is no TLS: put a TLS proxy in front beyond this machine.\n";

/* Tensor parallel: the longest a follower waits for rank 0's next turn (it
 * sends one every 0.1 s) or a rank for the others in a collective; past it
 * every rank ends with the reason. */
#define SERVE_TP_TIMEOUT_S 60.0
/* SIGTERM: the longest the engine thread may take to stop after the requests are done or cut. */
#define SERVE_STOP_GRACE_S 5.0

typedef struct ServeArgs {
    const char *model, *adapter, *host, *device, *served_model_name, *api_key;
    int port, tensor_parallel_size, max_model_len, max_num_seqs, block_size, max_tokens_limit;
    int max_queued_sequences, max_connections, max_connections_per_ip, max_body_kb, drain_timeout, request_timeout;
    float gpu_memory_utilization;
    bool enforce_eager, no_prefix_caching, deterministic;
} ServeArgs;

/* Waits for SIGTERM / SIGINT (blocked in every thread, taken here); returns the signal, or 0 after timeout_s. */
static int wait_signal(const sigset_t *set, double timeout_s) {
    struct timespec ts = {.tv_sec = (time_t)timeout_s, .tv_nsec = (long)((timeout_s - (time_t)timeout_s) * 1e9)};
    int sig = sigtimedwait(set, NULL, &ts);
    return sig > 0 ? sig : 0;
}

int cmd_serve(int argc, char **argv) {
    char err[ERR_LEN];
    ServeArgs a = {.host = "127.0.0.1", .port = 8000, .device = "auto", .tensor_parallel_size = 1,
                   .max_queued_sequences = 4096, .max_connections = 512, .max_body_kb = 1024, .drain_timeout = 60,
                   .request_timeout = 60};
    CliOption opts[] = {
        {"model", OPT_STRING, &a.model, "Hugging Face model folder (required)", false},
        {"host", OPT_STRING, &a.host, "address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)", false},
        {"port", OPT_INT, &a.port, "port (default 8000; 0: any free port, printed at start)", false},
        {"served_model_name", OPT_STRING, &a.served_model_name,
         "the name requests give as \"model\" (default: --model as given)", false},
        {"adapter", OPT_STRING, &a.adapter, "a LoRA adapter folder (PEFT's files) applied to the model", false},
        {"device", OPT_STRING, &a.device, "cpu, cuda, cuda_f32 (fp32 weights) or auto (default: cuda when a GPU is usable)", false},
        {"tensor_parallel_size", OPT_INT, &a.tensor_parallel_size,
         "processes the model is cut across (default 1; colt starts them, or a launcher does)", false},
        {"max_model_len", OPT_INT, &a.max_model_len,
         "prompt + completion tokens of one sequence (default: the model's max_position_embeddings)", false},
        {"max_tokens_limit", OPT_INT, &a.max_tokens_limit,
         "the most max_tokens a request may ask (default: max_model_len)", false},
        {"max_num_seqs", OPT_INT, &a.max_num_seqs, "sequences in the KV pool at once (default 256)", false},
        {"max_queued_sequences", OPT_INT, &a.max_queued_sequences,
         "sequences accepted and not finished; more get 503 (default 4096)", false},
        {"api_key", OPT_STRING, &a.api_key,
         "the key every endpoint but /health wants as 'Authorization: Bearer KEY' (default: COLT_API_KEY; none: "
         "/colt/* is off)", false},
        {"max_connections", OPT_INT, &a.max_connections, "open HTTP connections at most (default 512)", false},
        {"max_connections_per_ip", OPT_INT, &a.max_connections_per_ip,
         "open HTTP connections of one client address at most (default: half of max_connections)", false},
        {"request_timeout", OPT_INT, &a.request_timeout,
         "seconds a connection has to send a whole request, headers and body (default 60)", false},
        {"max_body_kb", OPT_INT, &a.max_body_kb, "largest request body in KiB; larger get 413 (default 1024)", false},
        {"drain_timeout", OPT_INT, &a.drain_timeout,
         "seconds SIGTERM waits for requests in flight before cutting them (default 60)", false},
        {"gpu_memory_utilization", OPT_FLOAT, &a.gpu_memory_utilization,
         "cap of the KV cache as a fraction of device memory (default: what is free)", false},
        {"block_size", OPT_INT, &a.block_size, "tokens per KV cache block (default 16)", false},
        {"enforce_eager", OPT_FLAG, &a.enforce_eager, "no CUDA graphs for decode steps", false},
        {"no_prefix_caching", OPT_FLAG, &a.no_prefix_caching, "recompute every prompt's KV", false},
        {"deterministic", OPT_FLAG, &a.deterministic,
         "batch-invariant kernels: a completion does not depend on the other requests in its batch", false},
    };
    const int n_opts = (int)(sizeof opts / sizeof opts[0]);
    int prc = cli_parse(opts, n_opts, argc, argv, SERVE_USAGE, err);
    if (prc == 1) return 0;
    if (prc != 0) return cli_fail("serve", err);
    if (!a.model) return cli_fail("serve", "--model DIR is required");
    if (a.tensor_parallel_size < 1) return cli_fail("serve", "--tensor_parallel_size must be >= 1");
    if (a.tensor_parallel_size > 1 && a.adapter)
        return cli_fail("serve", "--adapter with --tensor_parallel_size above 1 is not supported yet; merge the "
                                 "adapter into the model (colt train's merge_lora) or serve on one process");
    if (a.port < 0 || a.port > 65535) return cli_fail("serve", "--port must be in [0, 65535]");
    if (http_server_check_host(a.host, err) != 0) return cli_fail("serve", err);
    if (a.max_model_len < 0 || a.max_tokens_limit < 0 || a.max_num_seqs < 0)
        return cli_fail("serve", "--max_model_len, --max_tokens_limit and --max_num_seqs must be >= 0");
    if (a.max_queued_sequences < 1 || a.max_connections < 1 || a.max_body_kb < 1 || a.drain_timeout < 0 ||
        a.request_timeout < 1 || a.max_connections_per_ip < 0)
        return cli_fail("serve", "--max_queued_sequences, --max_connections, --max_body_kb and --request_timeout "
                                 "must be >= 1, --drain_timeout and --max_connections_per_ip >= 0");
    if (!a.api_key && getenv("COLT_API_KEY") && getenv("COLT_API_KEY")[0]) a.api_key = getenv("COLT_API_KEY");
    if (a.api_key && (!a.api_key[0] || strlen(a.api_key) > 255 || strpbrk(a.api_key, " \t\r\n")))
        return cli_fail("serve", "--api_key (or COLT_API_KEY) must be 1 to 255 characters without spaces");
    if (a.block_size < 0 || (a.block_size & (a.block_size - 1)))
        return cli_fail("serve", "--block_size must be a power of two");
    if (!(a.gpu_memory_utilization >= 0.0f && a.gpu_memory_utilization <= 1.0f))
        return cli_fail("serve", "--gpu_memory_utilization must be in [0, 1]");

    ModelConfig probe;
    GenerationDefaults gen;
    if (model_config_load(&probe, &gen, a.model, err) != 0) return cli_fail("serve", err);
    if (model_tp_check(&probe, a.tensor_parallel_size, err) != 0) return cli_fail("serve", err);
    /* Tensor parallel: one process per part, the launch's world exactly one group. */
    LaunchEnv env;
    if (launch_env_from_process(&env, err) != 0) return cli_fail("serve", err);
    if (a.tensor_parallel_size > 1 && env.launcher == LAUNCHER_NONE && !local_launch_is_child()) {
        /* no launcher: colt starts the N processes itself (as colt train does); a signal to this one
         * reaches them all (rank 0 drains, the others follow it to the end) */
        char **child_argv = xcalloc((size_t)argc + 3, sizeof(char *));
        child_argv[0] = "colt";
        child_argv[1] = "serve";
        for (int i = 0; i < argc; i++) child_argv[i + 2] = argv[i];
        fprintf(stderr, "colt serve: starting %d processes on this node (tensor_parallel_size)\n",
                a.tensor_parallel_size);
        int status = local_launch_run(a.tensor_parallel_size, child_argv, err);
        free(child_argv);
        return status < 0 ? cli_fail("serve", err) : status;
    }
    if (local_launch_is_child()) { /* the processes colt started end with it: no server left behind */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() == 1) return 1; /* it ended before prctl */
    }
    if (mesh_check_tensor_parallel_size(a.tensor_parallel_size, &env, true, err) != 0) return cli_fail("serve", err);
    log_set_rank(env.rank);
    if (env.rank > 0) { /* a follower stops when rank 0 says so; a launcher's SIGTERM to every rank is for rank 0 */
        signal(SIGTERM, SIG_IGN);
        signal(SIGINT, SIG_IGN);
    }
    if (a.max_model_len == 0 || a.max_model_len > probe.max_position_embeddings) {
        if (a.max_model_len > probe.max_position_embeddings)
            log_info0("colt serve: --max_model_len %d is above the model's max_position_embeddings; using %d",
                      a.max_model_len, probe.max_position_embeddings);
        a.max_model_len = probe.max_position_embeddings;
    }
    if (a.max_tokens_limit == 0 || a.max_tokens_limit > a.max_model_len) a.max_tokens_limit = a.max_model_len;
    SamplingParams defaults = {.temperature = 1.0f, .top_p = 1.0f, .repetition_penalty = 1.0f};
    if (gen.present && gen.do_sample)
        defaults = (SamplingParams){.temperature = gen.temperature, .top_p = gen.top_p, .top_k = gen.top_k,
                                    .min_p = gen.min_p, .repetition_penalty = gen.repetition_penalty};
    if (sampling_params_validate(&defaults, err) != 0) return cli_fail("serve", err);

    /* SIGTERM and SIGINT are taken by the main thread alone (sigtimedwait), blocked before any thread starts
     * (OpenMP's, CUDA's, the server's inherit the mask); one that comes while loading waits for serving. */
    sigset_t stop_signals;
    sigemptyset(&stop_signals);
    sigaddset(&stop_signals, SIGTERM);
    sigaddset(&stop_signals, SIGINT);
    pthread_sigmask(SIG_BLOCK, &stop_signals, NULL);
    signal(SIGPIPE, SIG_IGN);

    Tokenizer *tok = NULL;
    char *tok_path = path_join(a.model, "tokenizer.json");
    bool have_tok = file_exists(tok_path);
    free(tok_path);
    if (!have_tok) return cli_fail("serve", "the model folder has no tokenizer.json (colt serve answers in text)");
    if (tokenizer_load(&tok, a.model, err) != 0) return cli_fail("serve", err);
    /* every rank got this far with the same files and flags: the group, then its device; a bound on every
     * wait of a follower for rank 0 */
    Mesh mesh;
    MeshOptions mo = {.device = a.device, .share_gpus = true, .tensor_parallel_size = a.tensor_parallel_size,
                      .one_group = true, .timeout_s = SERVE_TP_TIMEOUT_S};
    TensorParallel hooks;
    Model *m = NULL;
    if (mesh_open(&mesh, &env, &mo, err) != 0 ||
        model_load_tp(&m, a.model, mesh.be, mesh_tensor_parallel(&mesh, &hooks), err) != 0 ||
        (a.adapter && model_lora_load(m, a.adapter, err) != 0)) {
        model_free(m);
        tokenizer_free(tok);
        cli_fail("serve", err);
        mesh_abort(&mesh, err);
        mesh_close(&mesh);
        return 1;
    }
    const Backend *be = mesh.be;
    Comm *world = mesh.world;
    int eos[MODEL_MAX_EOS + 1];
    int n_eos = prompt_stop_ids(eos, model_config(m), tok);
    OpenAIContext ctx = {.tok = tok, .vocab_size = model_config(m)->vocab_size,
                         .model_name = a.served_model_name ? a.served_model_name : a.model,
                         .max_model_len = a.max_model_len, .max_tokens_limit = a.max_tokens_limit,
                         .defaults = defaults, .eos_ids = eos, .n_eos = n_eos,
                         .can_score = mesh.groups.tp == NULL};
    /* chat requests with tools get their calls read out when colt knows how the template writes them */
    const char *template_source = tokenizer_chat_template(tok);
    char no_calls[ERR_LEN];
    ctx.reads_tool_calls = template_source && tool_calls_format_of_template(&ctx.tool_format, template_source,
                                                                            no_calls) == 0;

    ServeLoopOptions lo = {.engine = {.block_size = a.block_size, .gpu_memory_utilization = a.gpu_memory_utilization,
                                      .max_num_seqs = a.max_num_seqs, .enforce_eager = a.enforce_eager,
                                      .no_prefix_caching = a.no_prefix_caching, .deterministic = a.deterministic},
                           .max_model_len = a.max_model_len, .max_queued_sequences = a.max_queued_sequences,
                           .tp = mesh.groups.tp};
    ServeLoop *loop = NULL;
    HttpServer *http = NULL;
    int rc = 0;
    if (env.rank > 0) { /* a follower: rank 0's engine calls, until it says stop */
        if (serve_follow(m, &lo, mesh.groups.tp, err) != 0) {
            cli_fail("serve", err);
            comm_abort(world, err);
        }
    } else if (serve_loop_start(&loop, m, &lo, err) != 0) {
        rc = cli_fail("serve", err);
    } else {
        ServeLoopStats st;
        serve_loop_stats(loop, &st);
        HttpServerOptions ho = {.host = a.host, .port = a.port, .max_body_bytes = (size_t)a.max_body_kb * 1024,
                                .max_connections = a.max_connections,
                                .max_connections_per_ip = a.max_connections_per_ip,
                                .request_timeout_s = a.request_timeout, .api_key = a.api_key};
        log_info0("colt serve: %s on %s, max_model_len %d, KV pool of %d blocks (%.3f GB)", ctx.model_name, be->name,
                  a.max_model_len, st.engine.pool_blocks, st.engine.pool_bytes / 1e9);
        if (world)
            log_info0("colt serve: tensor parallel over %d processes (collectives: %s)", a.tensor_parallel_size,
                      mesh.collectives);
        if (http_server_start(&http, &ho, loop, &ctx, err) != 0) rc = cli_fail("serve", err);
    }
    if (rc == 0 && env.rank == 0) {
        char pid_note[96] = "";
        if (world) snprintf(pid_note, sizeof pid_note, " (rank 0: pid %d; SIGTERM it to stop)", (int)getpid());
        if (!store_host_is_loopback(a.host) && !a.api_key)
            log_info0("colt serve: warning: --host %s without an API key: anyone who reaches this address may "
                      "generate (the trainer's endpoints stay off); set --api_key or COLT_API_KEY, and put a TLS "
                      "proxy in front beyond this machine", a.host);
        log_info0("colt serve: %s", a.api_key ? "API key set: every endpoint but /health wants it"
                                               : "no API key: /colt/* (trainer endpoints, weight channel) is off");
        log_info0("colt serve: listening on http://%s%s%s:%d%s", strchr(a.host, ':') ? "[" : "", a.host,
                  strchr(a.host, ':') ? "]" : "", http_server_port(http), pid_note);
        int sig = 0;
        while (!(sig = wait_signal(&stop_signals, 1.0))) {}
        serve_loop_drain(loop);
        http_server_quiesce(http);
        log_info0("colt serve: %s: draining %d sequences in flight", sig == SIGTERM ? "SIGTERM" : "SIGINT",
                  serve_loop_outstanding(loop));
        /* Drained: every sequence finished and every answer sent (a stream's last events may still be on
         * their way after its sequences finished). */
        double deadline = time_now() + a.drain_timeout;
        while ((serve_loop_outstanding(loop) > 0 || http_server_requests_running(http) > 0) && time_now() < deadline) {
            if (wait_signal(&stop_signals, 0.05)) break; /* a second signal: stop waiting */
        }
        /* Stopping now: more signals change nothing (ignoring them also drops pending ones, which
         * could otherwise reach a thread without the mask, e.g. a sanitizer's at exit). */
        signal(SIGTERM, SIG_IGN);
        signal(SIGINT, SIG_IGN);
        int left = serve_loop_outstanding(loop);
        if (left > 0) {
            log_info0("colt serve: cutting %d sequences still in flight", left);
            serve_loop_abort_all(loop);
            /* their answers end with an error event or a 500 before the connections close */
            for (double until = time_now() + 5; http_server_requests_running(http) > 0 && time_now() < until;)
                nanosleep(&(struct timespec){.tv_nsec = 20000000}, NULL);
        }
        http_server_stop(http);
        log_info0("colt serve: stopped");
    }
    /* tensor parallel: the followers' "stop" turn */
    if (serve_loop_stop(loop, SERVE_STOP_GRACE_S) != 0) {
        /* the engine thread is inside a weight push whose trainer stopped sending: do not wait for it */
        log_error("colt serve: the engine thread is still receiving a weight push after %.0f s; exiting without it",
                  SERVE_STOP_GRACE_S);
        fflush(NULL);
        _exit(1);
    }
    model_free(m);
    mesh_close(&mesh);
    tokenizer_free(tok);
    return rc;
}
