/* bench_layer_floor.cu — how fast a batch-1 decode step can be when built the way the all-layers
 * kernel is (cuda_decode_layers.cu: one persistent CTA per SM, grid-wide exchanges between the phases
 * of a layer, the weights streamed through a per-thread cp.async ring that runs ahead across them),
 * measured on a skeleton that keeps only those two things: the step's weight bytes and its exchanges.
 *
 * Per layer, five phases in the kernel's order, each CTA streaming its 1/G share of the phase's weights
 * (bf16, a dot product of every 16 bytes with the phase's input: 8 converts and 8 FMAs, the least the
 * real dot products do), summing its share (a block reduction) and writing its share of the phase's
 * output vector:
 *   A q|k|v (W x D), B attention (no weights), C o-proj (D x H Dh), D gate|up (2F x D), E down (D x F);
 * after the last layer the lm_head's V x D bytes stream with no exchange. An "exchange" after a phase
 * is decode_layers' (barrier + read: cuda_grid_barrier.cuh, then every CTA reads the whole output vector
 * from the L2 and sums it into the next phase's input, a real dependency) or, in the "tagged words" rows,
 * no barrier: each value travels with the exchange's number in one 8-byte word and readers poll the
 * words until all carry it (NCCL's LL protocol; bench_grid_sync's "tagged words"). Columns:
 *   stream only        no exchange at all: what the ring's copies reach alone;
 *   5 exchanges        after every phase, as the kernel does;
 *   4 exchanges        none between q|k|v and attention (as if each head's rows were at hand);
 *   3 exchanges        also none between gate|up and down (a column-split down projection, which
 *                      needs a transposed copy of W_d);
 *   exchanges only     the five, no weights: the chain of exchanges alone.
 * Rows: how the ring is filled (per thread: each thread cp.async-copies its own chunks, as the kernel's
 * ring; bulk: thread 0 copies each 32 KB round with one cp.async.bulk, the TMA) and its depth, in rounds
 * of 32 KB per CTA (the kernel holds 2 rounds of up to 64 KB). Each cell:
 * us per step (best of 3 launches of STEPS steps) and the share of the HBM roofline that would be
 * (weight bytes streamed / 4.8 TB/s over the step time; the KV cache and the norm weights, under
 * 0.3% of the bytes at 128-256 tokens of context, left out). Nothing a real step computes beyond
 * this (norms, rope, attention, swiglu, residuals, the sampler) is here, so a real kernel of this
 * shape is slower than its cell. Usage: bench_layer_floor [0.5b 1.5b 7b 8b] (default all; exit 77 without a device). */
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "backend/cuda/cuda_grid_barrier.cuh"
#include "bench_gpu_shapes.h"

#define BENCH_NAME "bench_layer_floor"
#include "bench_grid_common.cuh"

#define THREADS 512
#define ROUND_CHUNKS 4 /* 16-byte chunks per thread per round: 32 KB per CTA */
#define ROUND_BYTES (THREADS * ROUND_CHUNKS * 16)
#define STEPS 10
#define PHASES 5           /* per layer: A q|k|v, B attention, C o, D gate|up, E down */
#define STREAM_PHASES 6    /* the five, then the lm_head */
#define MAX_OUT 19456      /* the longest phase output (7B's intermediate 18944), multiple of 4 */
#define HBM_BYTES_PER_S 4.8e12

struct Plan {
    int layers;
    int out[PHASES];                    /* each phase's output length (floats) */
    long long chunks[STREAM_PHASES];    /* 16-byte chunks of the phase's weight (per layer), lm_head last */
    long long offset[STREAM_PHASES];    /* chunk offset of the phase's weight inside its layer's block */
    long long per_cta[STREAM_PHASES];   /* chunks per CTA (the last CTA's share may be shorter) */
    int rounds[STREAM_PHASES];          /* rounds per CTA */
    long long layer_chunks;             /* one layer's weight block */
    int rounds_per_layer, total_rounds; /* in the stream of one step */
    unsigned exchange_mask;             /* bit p: an exchange after phase p */
    int stream;                         /* 0: no weights (the exchanges alone) */
    int tagged;                         /* exchanges as tagged words instead of barrier + read */
    unsigned epoch;                     /* tagged words: tags before this launch's */
};

/* Where the CTA's next round of a step's stream (layers' phases in order, then the lm_head) comes from,
 * advanced round by round without divisions (the skeleton's per-round work is part of what it measures,
 * so it is kept to what a real kernel's ring needs). Every CTA takes p.rounds[ph] rounds of a phase; a
 * round has up to THREADS * ROUND_CHUNKS chunks of the CTA's share, fewer (or none) at its end. */
struct Cursor {
    const uint4 *next; /* the round's first chunk */
    long long left;    /* chunks of the CTA's share of the phase not yet taken */
    int ph, layer, r;  /* phase (PHASES: the lm_head, PHASES + 1: past the end), layer, round in the phase */

    /* Moves to the next phase that has weights (after the last layer's down projection, the lm_head). */
    __device__ void advance(const Plan &p, const uint4 *weights) {
        do {
            if (++ph == PHASES && layer + 1 < p.layers) ph = 0, layer++;
        } while (ph < PHASES && p.rounds[ph] == 0);
        r = 0;
        if (ph > PHASES) return;
        const long long base = ph < PHASES ? layer * p.layer_chunks + p.offset[ph] : p.layers * p.layer_chunks;
        const long long first = blockIdx.x * p.per_cta[ph];
        next = weights + base + first;
        left = max(0LL, min(p.per_cta[ph], p.chunks[ph] - first));
    }
    __device__ void start(const Plan &p, const uint4 *weights) {
        layer = 0, ph = -1;
        advance(p, weights);
    }
    /* Takes the next round: its first chunk and length (-1 past the end). */
    __device__ int take(const Plan &p, const uint4 *weights, const uint4 **from) {
        if (ph > PHASES) return -1;
        const int n = (int)min(left, (long long)THREADS * ROUND_CHUNKS);
        *from = next;
        next += n, left -= n;
        if (++r == p.rounds[ph]) advance(p, weights);
        return n;
    }
};

/* The next round of the stream (`at`), the CTA's q-th since the launch, into ring slot q % R. Per-thread
 * copies (BULK false): each thread copies its own ROUND_CHUNKS chunks with cp.async, and only it reads
 * them back, so no block barrier guards a slot (the kernel's ring does the same; a round past the end
 * commits an empty group). Bulk (true): thread 0 copies the whole round with one cp.async.bulk (the TMA)
 * on the slot's `full` mbarrier, after every warp has arrived on its `empty` one for the round the slot
 * held. */
template <int R, bool BULK>
__device__ __forceinline__ void issue_round(const Plan &p, const uint4 *weights, Cursor &at, int q, uint4 *ring,
                                            unsigned long long *full, unsigned long long *empty) {
    if (BULK && threadIdx.x != 0) return;
    const uint4 *from;
    const int n = at.take(p, weights, &from);
    uint4 *slot = &ring[(q % R) * ROUND_CHUNKS * THREADS];
    if constexpr (BULK) {
        if (n < 0) return;
        if (q >= R) mbar_wait(&empty[q % R], (unsigned)((q / R - 1) & 1));
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(&full[q % R])), "r"(n * 16) : "memory");
        if (n)
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         ::"r"(smem_addr(slot)), "l"(from), "r"(n * 16), "r"(smem_addr(&full[q % R]))
                         : "memory");
    } else {
        for (int k = 0; k < ROUND_CHUNKS; k++) {
            const int j = k * THREADS + threadIdx.x;
            if (j < n)
                asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(&slot[j])), "l"(from + j) : "memory");
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
    }
}

/* The CTA's rounds of one phase: wait for each (R - 1 later ones stay in flight), multiply its chunks by
 * the phase's input, and put the round R ahead into the slot it freed. Returns the thread's sum. */
template <int R, bool BULK>
__device__ __forceinline__ float stream_phase(const Plan &p, const uint4 *weights, int rounds, int &g, int base,
                                              Cursor &issue_at, Cursor &use_at, uint4 *ring,
                                              unsigned long long *full, unsigned long long *empty, float in) {
    float acc = 0.0f;
    for (int r = 0; r < rounds; r++, g++) {
        const int q = base + g;
        if (BULK) mbar_wait(&full[q % R], (unsigned)((q / R) & 1));
        else asm volatile("cp.async.wait_group %0;" ::"n"(R - 1) : "memory");
        /* per thread, a short round's missing chunks are multiplied as they stand (a timing shortcut) */
        const uint4 *unused;
        const int n = BULK ? use_at.take(p, weights, &unused) : THREADS * ROUND_CHUNKS;
        for (int k = 0; k < ROUND_CHUNKS; k++) {
            if (k * THREADS + threadIdx.x >= n) break;
            const uint4 w = ring[((q % R) * ROUND_CHUNKS + k) * THREADS + threadIdx.x];
            const unsigned words[4] = {w.x, w.y, w.z, w.w};
            for (int e = 0; e < 4; e++) {
                acc = fmaf(__uint_as_float(words[e] << 16), in, acc);
                acc = fmaf(__uint_as_float(words[e] & 0xffff0000u), in, acc);
            }
        }
        if (BULK) {
            __syncwarp();
            if (threadIdx.x % 32 == 0) asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(smem_addr(&empty[q % R])) : "memory");
        }
        issue_round<R, BULK>(p, weights, issue_at, q + R, ring, full, empty);
    }
    return acc;
}

/* vec: [PHASES][2][MAX_OUT] fp32, a phase's output by layer parity. */
template <int R, bool BULK>
__global__ void __launch_bounds__(THREADS, 1) floor_kernel(Plan p, const uint4 *weights, unsigned *count, float *vec,
                                                            unsigned long long *words, float *out) {
    extern __shared__ uint4 ring[]; /* [R][ROUND_CHUNKS][THREADS] */
    __shared__ __align__(8) unsigned long long full[R], empty[R];
    if (BULK && threadIdx.x < R) {
        asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(&full[threadIdx.x])) : "memory");
        asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_addr(&empty[threadIdx.x])), "r"(THREADS / 32) : "memory");
        asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncthreads();
    const int G = gridDim.x, c = blockIdx.x;
    unsigned exchanges = 0;
    float in = 1.0f;
    for (int step = 0; step < STEPS; step++) {
        int g = 0;
        const int base = step * p.total_rounds;
        Cursor issue_at, use_at; /* use_at: the bulk copies' consumers, who need each round's length */
        issue_at.start(p, weights);
        use_at.start(p, weights);
        if (p.stream)
            for (int k = 0; k < R; k++) issue_round<R, BULK>(p, weights, issue_at, base + k, ring, full, empty);
        for (int layer = 0; layer < p.layers; layer++) {
            for (int ph = 0; ph < PHASES; ph++) {
                float part = in;
                if (p.stream && p.rounds[ph])
                    part = stream_phase<R, BULK>(p, weights, p.rounds[ph], g, base, issue_at, use_at, ring, full, empty, in);
                const float share = block_sum<THREADS>(part);
                const bool exchange = p.exchange_mask >> ph & 1;
                float *v = vec + ((size_t)ph * 2 + (layer & 1)) * MAX_OUT;
                const int n = p.out[ph], r0 = (int)((long long)n * c / G), r1 = (int)((long long)n * (c + 1) / G);
                if (!(exchange && p.tagged))
                    for (int i = r0 + threadIdx.x; i < r1; i += THREADS) v[i] = share * 1e-9f + (float)i;
                if (!exchange) continue;
                if (p.tagged) { /* each value with the exchange's number in one 8-byte word; readers poll */
                    const unsigned long long tag = p.epoch + ++exchanges;
                    unsigned long long *w = words + ((size_t)ph * 2 + (layer & 1)) * MAX_OUT;
                    for (int i = r0 + threadIdx.x; i < r1; i += THREADS)
                        asm volatile("st.relaxed.gpu.global.u64 [%0], %1;" ::"l"(w + i),
                                     "l"((unsigned long long)__float_as_uint(share * 1e-9f + (float)i) | tag << 32) : "memory");
                    float s = 0.0f;
                    for (int i = 2 * threadIdx.x; i < n; i += 2 * THREADS) {
                        unsigned long long a, b;
                        do {
                            asm volatile("ld.relaxed.gpu.global.v2.u64 {%0,%1}, [%2];" : "=l"(a), "=l"(b) : "l"(w + i) : "memory");
                        } while (a >> 32 != (unsigned)tag || b >> 32 != (unsigned)tag);
                        s += __uint_as_float((unsigned)a) + __uint_as_float((unsigned)b);
                    }
                    in = block_sum<THREADS>(s) * 1e-9f + 1.0f;
                    continue;
                }
                grid_barrier_arrive(count);
                grid_barrier_wait(count, ++exchanges * (unsigned)G);
                float s = 0.0f;
                for (int i = 4 * threadIdx.x; i < n; i += 4 * THREADS) {
                    const float4 x = __ldcg(reinterpret_cast<const float4 *>(v + i));
                    s += x.x + x.y + x.z + x.w;
                }
                in = block_sum<THREADS>(s) * 1e-9f + 1.0f;
            }
        }
        if (p.stream) /* the lm_head */
            in += 1e-9f * block_sum<THREADS>(stream_phase<R, BULK>(p, weights, p.rounds[PHASES], g, base, issue_at, use_at,
                                                                   ring, full, empty, in));
        asm volatile("cp.async.wait_group 0;" ::: "memory"); /* the empty groups past the end */
    }
    if (threadIdx.x == 0) out[c] = in;
}

static Plan make_plan(const Shape &s, int G, unsigned exchange_mask, int stream, int tagged) {
    Plan p;
    memset(&p, 0, sizeof p);
    const long long D = s.hidden, F = s.inter, H = s.heads, Dh = D / H, W = (H + 2LL * s.kv_heads) * Dh;
    /* the lm_head's V x D only: an untied model's input embedding is read one row per token */
    const long long elems[STREAM_PHASES] = {W * D, 0, D * H * Dh, 2 * F * D, D * F, (long long)s.vocab * D};
    const int outs[PHASES] = {(int)W, (int)(H * Dh), (int)D, (int)F, (int)D};
    p.layers = s.layers;
    long long off = 0;
    for (int ph = 0; ph < STREAM_PHASES; ph++) {
        p.chunks[ph] = elems[ph] * 2 / 16;
        p.offset[ph] = ph < PHASES ? off : 0;
        if (ph < PHASES) off += p.chunks[ph];
        p.per_cta[ph] = (p.chunks[ph] + G - 1) / G;
        p.rounds[ph] = (int)((p.per_cta[ph] + THREADS * ROUND_CHUNKS - 1) / (THREADS * ROUND_CHUNKS));
        if (ph < PHASES) p.out[ph] = outs[ph], p.rounds_per_layer += p.rounds[ph];
    }
    p.layer_chunks = off;
    p.total_rounds = p.layers * p.rounds_per_layer + p.rounds[PHASES];
    p.exchange_mask = exchange_mask;
    p.stream = stream;
    p.tagged = tagged;
    return p;
}

static double step_bytes(const Plan &p) {
    return 16.0 * ((double)p.layers * p.layer_chunks + p.chunks[PHASES]);
}

/* What every launch takes beside its plan. */
struct Buffers {
    const uint4 *weights;
    unsigned *count;           /* the grid barrier's counter */
    float *vec;                /* [PHASES][2][MAX_OUT]: the phases' outputs */
    unsigned long long *words; /* the same as tagged words */
    float *out;
    unsigned epoch;            /* tags used so far */
};

template <int R, bool BULK>
static int time_plan(const Plan &p, int G, Buffers &b, double *us) {
    const size_t smem = (size_t)R * ROUND_BYTES;
    CHECK(cudaFuncSetAttribute((void *)floor_kernel<R, BULK>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    cudaEvent_t e0, e1;
    CHECK(cudaEventCreate(&e0));
    CHECK(cudaEventCreate(&e1));
    float best = 1e30f;
    for (int rep = 0; rep < 3; rep++) {
        CHECK(cudaMemset(b.count, 0, sizeof(unsigned)));
        Plan pv = p;
        pv.epoch = b.epoch;
        b.epoch += STEPS * p.layers * PHASES + 1; /* tags only grow: a stale word never passes for a new one */
        void *args[] = {&pv, (void *)&b.weights, &b.count, &b.vec, &b.words, &b.out};
        CHECK(cudaEventRecord(e0));
        CHECK(cudaLaunchCooperativeKernel((void *)floor_kernel<R, BULK>, G, THREADS, args, smem, 0));
        CHECK(cudaEventRecord(e1));
        CHECK(cudaEventSynchronize(e1));
        float ms = 0.0f;
        CHECK(cudaEventElapsedTime(&ms, e0, e1));
        if (ms < best) best = ms;
    }
    CHECK(cudaEventDestroy(e0));
    CHECK(cudaEventDestroy(e1));
    *us = best * 1e3 / STEPS;
    return 0;
}

static int time_any(int R, bool bulk, const Plan &p, int G, Buffers &b, double *us) {
    switch (R * 2 + bulk) {
    case 4: return time_plan<2, false>(p, G, b, us);
    case 5: return time_plan<2, true>(p, G, b, us);
    case 8: return time_plan<4, false>(p, G, b, us);
    case 9: return time_plan<4, true>(p, G, b, us);
    case 12: return time_plan<6, false>(p, G, b, us);
    default: return time_plan<6, true>(p, G, b, us);
    }
}

int main(int argc, char **argv) {
    for (int a = 1; a < argc; a++)
        if (!shape_by_name(argv[a])) {
            fprintf(stderr, "bench_layer_floor: unknown shape '%s' (0.5b, 1.5b or 7b)\n", argv[a]);
            return 2;
        }
    int devices = 0;
    if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
        printf("no CUDA device\n");
        return 77;
    }
    int G = 0;
    cudaDeviceProp prop;
    CHECK(cudaDeviceGetAttribute(&G, cudaDevAttrMultiProcessorCount, 0));
    CHECK(cudaGetDeviceProperties(&prop, 0));
    Buffers b = {};
    const size_t outputs = (size_t)PHASES * 2 * MAX_OUT;
    CHECK(cudaMalloc(&b.count, sizeof(unsigned)));
    CHECK(cudaMalloc(&b.vec, outputs * sizeof(float)));
    CHECK(cudaMemset(b.vec, 0, outputs * sizeof(float)));
    CHECK(cudaMalloc(&b.words, outputs * sizeof(unsigned long long)));
    CHECK(cudaMemset(b.words, 0, outputs * sizeof(unsigned long long)));
    CHECK(cudaMalloc(&b.out, G * sizeof(float)));
    const int depths[3] = {2, 4, 6};
    const unsigned ALL = 0x1f, masks[4] = {0, ALL, ALL & ~1u, ALL & ~1u & ~(1u << 3)};
    /* rows: the ring's copies and the exchange */
    const struct { bool bulk, tagged; } kinds[3] = {{false, false}, {true, false}, {false, true}};
    printf("Batch-1 decode step floor: the weight stream and the grid exchanges alone, %d CTAs x %d threads\n"
           "(one per SM), us per step (best of 3 launches of %d steps) and %% of the HBM roofline (4.8 TB/s)\n\n",
           G, THREADS, STEPS);
    printf("| model | weights per step | copies | exchange | ring per CTA | stream only | 5 exchanges (the kernel's) | 4 exchanges | 3 exchanges | exchanges only |\n");
    printf("|---|---:|---|---|---:|---:|---:|---:|---:|---:|\n");
    const int n_shapes = argc < 2 ? (int)(sizeof SHAPES / sizeof SHAPES[0]) : argc - 1;
    for (int k = 0; k < n_shapes; k++) { /* the shapes bench_decode measures (bench_gpu_shapes.h) */
        const Shape &s = argc < 2 ? SHAPES[k] : *shape_by_name(argv[k + 1]);
        const double bytes = step_bytes(make_plan(s, G, 0, 1, 0)), roof_us = bytes / HBM_BYTES_PER_S * 1e6;
        uint4 *weights;
        CHECK(cudaMalloc(&weights, (size_t)bytes));
        CHECK(cudaMemset(weights, 0, (size_t)bytes));
        b.weights = weights;
        double chain_us[2];
        for (int t = 0; t < 2; t++)
            if (time_any(2, false, make_plan(s, G, ALL, 0, t), G, b, &chain_us[t])) return 1;
        for (int kind = 0; kind < 3; kind++)
            for (int d = 0; d < 3; d++) {
                const bool bulk = kinds[kind].bulk, tagged = kinds[kind].tagged;
                printf("| %s | %.0f MB | %s | %s | %d KB |", s.name, bytes / 1e6, bulk ? "bulk" : "per thread",
                       tagged ? "tagged words" : "barrier + read", depths[d] * ROUND_BYTES / 1024);
                for (int m = 0; m < 4; m++) {
                    double us;
                    if (time_any(depths[d], bulk, make_plan(s, G, masks[m], 1, tagged), G, b, &us)) return 1;
                    printf(" %.0f (%.0f%%) |", us, 100.0 * roof_us / us);
                }
                printf(" %.0f |\n", chain_us[tagged]);
            }
        CHECK(cudaFree(weights));
    }
    printf("\nCommand: build-cuda/bench_layer_floor; hardware: %s, %d SMs.\n", prop.name, G);
    return 0;
}
