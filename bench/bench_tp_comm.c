/* bench_tp_comm.c — Megatron-style tensor parallelism (TP) on paper: per decoder layer and per token, the bytes
 * its all-reduces move and their time over NVLink, next to the compute (and, for batch-1 decode, the weight
 * read) that splitting the layer over TP ranks saves, for the Qwen2.5 1.5B / 7B / 72B shapes at TP 2, 4, 8
 * (issue 22: "the expected gain or loss of TP per shape"). Prints two markdown tables and the command line.
 *
 * It computes; it measures nothing and touches no GPU. Every number is arithmetic on the stated assumptions
 * (which the options change), so it bounds what TP can give, not what colt's TP gives.
 *
 * The model of a layer (D hidden, F intermediate, H heads, KVH kv heads, hd head dim, tp ranks):
 * - q/k/v and gate/up are split by columns (heads, F), o_proj and down_proj by rows; each rank holds 1/tp of
 *   every projection. The forward all-reduces the [D] bf16 output of o_proj and of down_proj (2 calls per
 *   layer per token); the training backward all-reduces the gradient at the inputs of q/k/v and of gate/up
 *   (2 more). Norms, embeddings and lm_head are left out.
 * - A ring all-reduce of n bytes sends (and receives) 2*(tp-1)/tp * n bytes per rank (reduce-scatter, then
 *   all-gather); the link's per-direction bandwidth sets its time. Latency is added only where it decides the
 *   answer: batch-1 decode, where a call carries a few KB.
 * - Compute: 2 FLOPs per weight per token forward, 3x that for forward + backward (input and weight
 *   gradients), at one dense bf16 GEMM rate. Attention scores (QK^T, PV), norms and biases are ignored, so
 *   compute is understated for long contexts; all of it splits by tp in the same way.
 * - Communication is not overlapped with compute (Megatron's plain TP: the all-reduce sits between the GEMM
 *   that produces a value and the residual add that needs it).
 * - "Layer speedup vs TP 1" is one model replica's layer time at TP 1 over its time on tp GPUs (the latency
 *   of a step); "per-GPU vs TP 1" divides it by tp: the throughput per GPU against tp data-parallel replicas
 *   at TP 1 on the same GPUs, the alternative whenever the model (and its batch) fits one GPU.
 *
 * Usage: bench_tp_comm [--nvlink_gbs X] [--tflops Y] [--hbm_tbs Z] [--latency_us W] */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BF16_BYTES 2.0
/* All-reduce calls per layer per token: forward (after o_proj, after down_proj); forward + backward adds the
 * gradient all-reduces at the inputs of q/k/v and gate/up. */
#define ALLREDUCE_CALLS_FORWARD 2
#define ALLREDUCE_CALLS_TRAIN 4
/* FLOPs per weight per token: 2 forward; training adds 2 for the input gradient and 2 for the weight gradient. */
#define FLOPS_PER_WEIGHT_FORWARD 2.0
#define FLOPS_PER_WEIGHT_TRAIN 6.0

/* A Qwen2.5 shape. Names and numbers as in bench/gpu/bench_gpu_shapes.h (which has no 72b and derives
 * head_dim as hidden / heads: 128 for all three), not included because that header pulls in the model. */
typedef struct TpShape {
    const char *name;
    int hidden, inter, heads, kv_heads, head_dim, layers, vocab;
    bool tied;  /* lm_head shares the embedding */
} TpShape;

static const TpShape TP_SHAPES[] = {
    {"1.5b", 1536, 8960, 12, 2, 128, 28, 151936, true},
    {"7b", 3584, 18944, 28, 4, 128, 28, 152064, false},
    {"72b", 8192, 29568, 64, 8, 128, 80, 152064, false},
};
static const int TP_SIZES[] = {2, 4, 8};

/* The hardware the arithmetic assumes, in SI units. */
typedef struct TpAssumptions {
    double nvlink_bytes_per_s;   /* per direction, per GPU */
    double flops_per_s;          /* dense bf16 GEMM rate reachable with cuBLAS */
    double hbm_bytes_per_s;      /* weight streaming rate of a memory-bound decode step */
    double allreduce_latency_s;  /* one small all-reduce call, launch to result */
} TpAssumptions;

/* ------------------------------------------------------------------------------------------------------------
 * Arithmetic */

/* Weights of one decoder layer's projections: q and o (D x H*hd each), k and v (D x KVH*hd each), gate, up and
 * down (D x F each). Norm weights and q/k/v biases are ignored (under 0.1% of the layer). */
static double layer_params(const TpShape *s) {
    double D = s->hidden, q = (double)s->heads * s->head_dim, kv = (double)s->kv_heads * s->head_dim;
    return D * q + 2.0 * D * kv + q * D + 3.0 * D * s->inter;
}

/* Bytes of the whole model's bf16 weights (layers, embedding, lm_head when not tied), to say which shapes
 * fit one GPU at all. */
static double model_weight_bytes(const TpShape *s) {
    double embeddings = (s->tied ? 1.0 : 2.0) * (double)s->vocab * s->hidden;
    return (s->layers * layer_params(s) + embeddings) * BF16_BYTES;
}

/* Bytes one rank sends (and as many it receives) in a ring all-reduce of `bytes`: a reduce-scatter and an
 * all-gather, each moving (tp-1)/tp of the buffer. */
static double ring_allreduce_bytes_per_rank(double bytes, int tp) {
    return 2.0 * (tp - 1) / tp * bytes;
}

/* Bytes per rank over the link, per token per layer, for `calls` all-reduces of a [D] bf16 vector. */
static double comm_bytes_per_token_layer(const TpShape *s, int tp, int calls) {
    return calls * ring_allreduce_bytes_per_rank(s->hidden * BF16_BYTES, tp);
}

/* Seconds the link takes for `bytes` per rank, bandwidth only (sending and receiving overlap: full duplex). */
static double comm_seconds(double bytes, const TpAssumptions *a) {
    return bytes / a->nvlink_bytes_per_s;
}

/* Seconds of GEMM per token per layer on one of tp ranks, at `flops_per_weight` (forward or training). */
static double compute_seconds_per_token_layer(const TpShape *s, int tp, double flops_per_weight,
                                              const TpAssumptions *a) {
    return flops_per_weight * layer_params(s) / tp / a->flops_per_s;
}

/* Tokens one all-reduce call must carry for its bandwidth time to equal its fixed latency: below this the
 * large-batch table's bandwidth-only times are too low (a call costs up to twice as much at this size). */
static double tokens_to_amortise_latency(const TpShape *s, int tp, const TpAssumptions *a) {
    return a->allreduce_latency_s * a->nvlink_bytes_per_s / comm_bytes_per_token_layer(s, tp, 1);
}

/* Seconds one rank takes to stream its 1/tp of a layer's bf16 weights from HBM: the time of a batch-1 decode
 * step's layer, which is memory-bound (the activations and KV cache at batch 1 are small beside it). */
static double decode_weight_read_seconds(const TpShape *s, int tp, const TpAssumptions *a) {
    return layer_params(s) * BF16_BYTES / tp / a->hbm_bytes_per_s;
}

/* Seconds a batch-1 decode step's layer adds for TP: its forward all-reduces, each a fixed latency plus the
 * (here negligible) bandwidth time of one token's [D] vector. */
static double decode_comm_seconds(const TpShape *s, int tp, const TpAssumptions *a) {
    double bytes = comm_bytes_per_token_layer(s, tp, ALLREDUCE_CALLS_FORWARD);
    return ALLREDUCE_CALLS_FORWARD * a->allreduce_latency_s + comm_seconds(bytes, a);
}

/* Why colt's TP cannot split this shape tp ways (heads and the vocabulary of lm_head and the embedding must
 * each divide evenly; kv heads and tp must divide one another: fewer kv heads than ranks are replicated),
 * written into `why`; NULL when it can. The tables count 1/tp of every weight per rank: with replicated kv
 * heads a rank holds a little more (its whole k/v head), under 2% of a layer for these shapes. */
static const char *tp_unsupported_reason(const TpShape *s, int tp, char *why, size_t size) {
    if (s->heads % tp) snprintf(why, size, "n/a: %d heads %% %d", s->heads, tp);
    else if (s->kv_heads % tp && tp % s->kv_heads) snprintf(why, size, "n/a: %d kv heads, tp %d", s->kv_heads, tp);
    else if (s->vocab % tp) snprintf(why, size, "n/a: vocab %d %% %d", s->vocab, tp);
    else return NULL;
    return why;
}

/* ------------------------------------------------------------------------------------------------------------
 * Tables */

/* Large batch, training forward + backward: the link is bandwidth-bound (a call carries a whole micro-batch,
 * so its latency is amortised: see the tokens/call column) and the GEMMs compute-bound. The verdict is "gain"
 * when the all-reduce time is smaller than the compute the split saves against TP 1. */
static void print_training_table(const TpAssumptions *a) {
    printf("### Large batch: training (forward + backward), per token per layer, bandwidth only\n\n");
    printf("| shape | TP | AR bytes/rank fwd | AR bytes/rank fwd+bwd | NVLink ns fwd | NVLink ns fwd+bwd "
           "| compute ns/rank fwd | compute ns/rank fwd+bwd | comm / compute fwd+bwd | compute saved ns "
           "| tokens/call at latency = transfer | layer speedup vs TP 1 | per-GPU vs TP 1 | verdict |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for (size_t k = 0; k < sizeof TP_SHAPES / sizeof TP_SHAPES[0]; k++) {
        const TpShape *s = &TP_SHAPES[k];
        for (size_t j = 0; j < sizeof TP_SIZES / sizeof TP_SIZES[0]; j++) {
            int tp = TP_SIZES[j];
            char why[64];
            if (tp_unsupported_reason(s, tp, why, sizeof why)) {
                printf("| %s | %d | %s | | | | | | | | | | | n/a |\n", s->name, tp, why);
                continue;
            }
            double bytes_fwd = comm_bytes_per_token_layer(s, tp, ALLREDUCE_CALLS_FORWARD);
            double bytes_train = comm_bytes_per_token_layer(s, tp, ALLREDUCE_CALLS_TRAIN);
            double comm_fwd = comm_seconds(bytes_fwd, a), comm_train = comm_seconds(bytes_train, a);
            double compute_fwd = compute_seconds_per_token_layer(s, tp, FLOPS_PER_WEIGHT_FORWARD, a);
            double compute_train = compute_seconds_per_token_layer(s, tp, FLOPS_PER_WEIGHT_TRAIN, a);
            double compute_train_tp1 = compute_seconds_per_token_layer(s, 1, FLOPS_PER_WEIGHT_TRAIN, a);
            double saved = compute_train_tp1 - compute_train;
            double speedup = compute_train_tp1 / (compute_train + comm_train);
            printf("| %s | %d | %.0f | %.0f | %.1f | %.1f | %.1f | %.1f | %.3f | %.1f | %.0f | %.2fx | %.2fx | %s |\n",
                   s->name, tp, bytes_fwd, bytes_train, comm_fwd * 1e9, comm_train * 1e9, compute_fwd * 1e9,
                   compute_train * 1e9, comm_train / compute_train, saved * 1e9, tokens_to_amortise_latency(s, tp, a),
                   speedup, speedup / tp, comm_train < saved ? "gain" : "loss");
        }
    }
    printf("\n");
}

/* Batch-1 decode: each layer's step is the time to read its weights; TP divides that by tp and adds two small
 * all-reduces whose fixed latency dominates. The verdict is "gain" when the read time saved exceeds the time
 * the all-reduces add. */
static void print_decode_table(const TpAssumptions *a) {
    printf("### Batch-1 decode step, per layer, latency-bound all-reduces\n\n");
    printf("| shape | TP | weights MB/rank | HBM read us TP 1 | HBM read us/rank | read saved us "
           "| AR added us (2 calls) | break-even latency us/call | layer speedup vs TP 1 | per-GPU vs TP 1 "
           "| verdict |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n");
    for (size_t k = 0; k < sizeof TP_SHAPES / sizeof TP_SHAPES[0]; k++) {
        const TpShape *s = &TP_SHAPES[k];
        for (size_t j = 0; j < sizeof TP_SIZES / sizeof TP_SIZES[0]; j++) {
            int tp = TP_SIZES[j];
            char why[64];
            if (tp_unsupported_reason(s, tp, why, sizeof why)) {
                printf("| %s | %d | %s | | | | | | | | n/a |\n", s->name, tp, why);
                continue;
            }
            double read_tp1 = decode_weight_read_seconds(s, 1, a), read_tp = decode_weight_read_seconds(s, tp, a);
            double saved = read_tp1 - read_tp, added = decode_comm_seconds(s, tp, a);
            double bandwidth_part = added - ALLREDUCE_CALLS_FORWARD * a->allreduce_latency_s;
            double break_even = (saved - bandwidth_part) / ALLREDUCE_CALLS_FORWARD;
            double speedup = read_tp1 / (read_tp + added);
            printf("| %s | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.2fx | %.2fx | %s |\n", s->name, tp,
                   layer_params(s) * BF16_BYTES / tp / 1e6, read_tp1 * 1e6, read_tp * 1e6, saved * 1e6,
                   added * 1e6, break_even * 1e6, speedup, speedup / tp, added < saved ? "gain" : "loss");
        }
    }
    printf("\n");
}

/* ------------------------------------------------------------------------------------------------------------
 * Main */

static void usage(FILE *fp) {
    fprintf(fp, "usage: bench_tp_comm [--nvlink_gbs X] [--tflops Y] [--hbm_tbs Z] [--latency_us W]\n"
                "  --nvlink_gbs  NVLink GB/s per direction per GPU (default 450: H100/H200 NVLink 4)\n"
                "  --tflops      dense bf16 GEMM TFLOP/s per GPU (default 790: H100 with cuBLAS)\n"
                "  --hbm_tbs     HBM TB/s per GPU (default 3.35: H100 SXM)\n"
                "  --latency_us  latency of one small all-reduce call, us (default 8)\n");
}

/* Parses the options into `a` and the command line (for the output) into `cmd`; 0 ok, -1 on a bad option. */
static int parse_args(TpAssumptions *a, char *cmd, size_t cmd_size, int argc, char **argv) {
    const struct { const char *flag; double scale; double *target; } options[] = {
        {"--nvlink_gbs", 1e9, &a->nvlink_bytes_per_s},
        {"--tflops", 1e12, &a->flops_per_s},
        {"--hbm_tbs", 1e12, &a->hbm_bytes_per_s},
        {"--latency_us", 1e-6, &a->allreduce_latency_s},
    };
    const size_t n_options = sizeof options / sizeof options[0];
    size_t used = (size_t)snprintf(cmd, cmd_size, "bench_tp_comm");
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
            usage(stdout);
            exit(0);
        }
        size_t o = 0;
        while (o < n_options && strcmp(argv[i], options[o].flag) != 0) o++;
        if (o == n_options) {
            fprintf(stderr, "bench_tp_comm: unknown option '%s'\n", argv[i]);
            return -1;
        }
        char *end = NULL;
        double value = i + 1 < argc ? strtod(argv[i + 1], &end) : 0.0;
        if (i + 1 >= argc || end == argv[i + 1] || *end != '\0' || !(value > 0.0 && value < 1e12)) {
            fprintf(stderr, "bench_tp_comm: %s wants a positive number\n", argv[i]);
            return -1;
        }
        *options[o].target = value * options[o].scale;
        if (used < cmd_size) used += (size_t)snprintf(cmd + used, cmd_size - used, " %s %s", argv[i], argv[i + 1]);
        i++;
    }
    return 0;
}

int main(int argc, char **argv) {
    TpAssumptions a = {.nvlink_bytes_per_s = 450e9, .flops_per_s = 790e12, .hbm_bytes_per_s = 3.35e12,
                       .allreduce_latency_s = 8e-6};
    char cmd[1024];
    if (parse_args(&a, cmd, sizeof cmd, argc, argv) != 0) {
        usage(stderr);
        return 2;
    }
    printf("## Tensor parallelism on paper: all-reduce traffic vs compute per layer\n\n");
    printf("Command: `%s`\n\n", cmd);
    printf("Computed, not measured: arithmetic on the assumptions below; no GPU ran.\n\n");
    printf("- Link: NVLink %.0f GB/s per direction per GPU; ring all-reduce, %d calls per layer per token forward "
           "(after o_proj, down_proj), %d forward + backward; bf16 [D] vectors; no overlap with compute.\n",
           a.nvlink_bytes_per_s / 1e9, ALLREDUCE_CALLS_FORWARD, ALLREDUCE_CALLS_TRAIN);
    printf("- Compute: %.0f TFLOP/s dense bf16 per GPU; 2 FLOPs per weight per token forward, 6 forward + backward; "
           "attention scores (QK^T, PV), norms and biases ignored.\n", a.flops_per_s / 1e12);
    printf("- Decode: batch 1, layer time = its bf16 weights / tp read at %.2f TB/s HBM; each all-reduce call "
           "costs an assumed %.1f us of latency (small all-reduces take about 5-10 us and dominate at small "
           "batch), so the per-layer latency floor is %d x %.1f = %.1f us.\n",
           a.hbm_bytes_per_s / 1e12, a.allreduce_latency_s * 1e6, ALLREDUCE_CALLS_FORWARD,
           a.allreduce_latency_s * 1e6, ALLREDUCE_CALLS_FORWARD * a.allreduce_latency_s * 1e6);
    printf("- Verdict: gain when the all-reduce time is below the compute (training) or weight-read time (decode) "
           "that splitting the layer saves against TP 1. \"Layer speedup\" is one replica's layer time at TP 1 "
           "over its time at TP tp; \"per-GPU\" divides it by tp (against tp data-parallel replicas at TP 1).\n");
    printf("- n/a: colt's TP needs tp to divide the heads and the vocabulary, and tp and the kv heads to divide one "
           "another (fewer kv heads than ranks are replicated).\n");
    printf("- Whole-model bf16 weights:");
    for (size_t k = 0; k < sizeof TP_SHAPES / sizeof TP_SHAPES[0]; k++)
        printf(" %s %.1f GB%s", TP_SHAPES[k].name, model_weight_bytes(&TP_SHAPES[k]) / 1e9,
               k + 1 < sizeof TP_SHAPES / sizeof TP_SHAPES[0] ? "," : "");
    printf(" (weights alone; a 72b at TP 1 fits neither an 80 GB H100 nor a 141 GB H200, so its TP 1 numbers "
           "are a reference, not an option).\n\n");
    print_training_table(&a);
    print_decode_table(&a);
    return 0;
}
