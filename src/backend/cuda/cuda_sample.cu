/* cuda_sample.cu — the sample op on the GPU (backend.h, "generation engine"):
 * the host sampler's rules (backend/sampling.h) without sorting, one
 * 1024-thread block per row of logits[n, V], V up to a few hundred thousand.
 *
 * Per row, with y = penalised logit, z = y / temperature, m = max z and
 * e = expf(z - m) (the host's values, op for op: IEEE division, no FMA):
 *   pass 1  max y and its lowest id (coalesced 8-element vector loads);
 *   pass 2  each thread sums e over its own contiguous chunk of ids (fp32 over
 *           8 elements, then double) -> S = sum e (logprob, probabilities);
 *   greedy stops here (token = the argmax). Unfiltered sampling draws right
 *   away: the chunk sums, in 2^-40 fixed point, are scanned across the block;
 *   u * total falls in one thread's chunk, and a warp walks that chunk
 *   again, with the same sums, to the first id whose running mass exceeds it —
 *   two passes over the row plus 1/1024 of one. Batches of up to 8 rows
 *   without filters or penalty spread each row over 128 CTAs instead (the
 *   split path, below): the same bits.
 * Filters (the host's rules, as cut-offs on e): top-k finds the k-th largest
 * y by radix select (8-bit digits, counts; 2 passes for bf16 logits without a
 * penalty, else 4); top-p, among the top-k survivors, finds the largest e
 * whose tail below it stays within 1 - top_p of their mass (radix select on
 * the bits of e, masses in fixed point; 4 passes), and when that cuts into a
 * run of equal e, drops its largest ids first as the host does (one more
 * pass, only then); min-p is min_p * p_max. Each cut-off becomes the smallest
 * e whose probability (float)(e / S) reaches the host's threshold; then one
 * more chunk pass over the kept tokens draws. Histograms use warp-aggregated
 * 64-bit shared atomics: integers, so the result does not depend on the order
 * they land in.
 *
 * Agreement with the host sampler on the same logits: the same kept set and
 * u, and the same token unless u * total falls within rounding (expf here is
 * within 2 ulp of the host's, masses sum in another order) of a boundary
 * between two tokens' cumulative masses, or a kept-set threshold falls within
 * rounding of a token's probability. One tie rule differs: tokens whose e
 * differ but whose probabilities round to the same float are cut by value
 * here, by id on the host. logprob = z[token] - (m + log S), S accumulated as
 * above over the kept tokens (all of them when unfiltered; relative error ~1e-7).
 *
 * Capturable in a CUDA graph: no host copies; the sampling parameters are
 * kernel arguments (a captured graph keeps the ones it saw); the split path's
 * scratch is the instance's, reserved when it opens.
 * Shared memory: the repetition-penalty bitmap (V bits, dynamic) and ~3 KB. */
#include <limits.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/cuda/cuda_common.cuh"

extern "C" {
#include "backend/sampling.h"
#include "core/rng.h"
}

#define SAMPLE_THREADS 1024
#define SAMPLE_WARPS (SAMPLE_THREADS / 32)
#define GROUP 8                             /* elements per vector load */
#define SAMPLE_MAX_BITMAP_BYTES (40 * 1024) /* + the static part stays under the 48 KB default */
#define FULL_MASK 0xffffffffu

/* SamplingParams as kernel arguments. */
struct SampleArgs {
    float temperature, top_p, min_p, repetition_penalty;
    int top_k;
    uint64_t seed;
    int sequential_find; /* test hook: the draw's walk by chunk_find in one thread (the reference) */
};

/* ---------------------------------------------------------------- Philox (core/rng.c) */

/* Philox4x32-10 and rng_uniform of core/rng.c, bit for bit: the same constants
 * (core/rng.h) and rounds, and the uniform from the top 24 bits of the first word. */

__device__ float philox_uniform(uint64_t seed, uint64_t stream, uint64_t counter) {
    uint32_t c0 = (uint32_t)counter, c1 = (uint32_t)(counter >> 32);
    uint32_t c2 = (uint32_t)stream, c3 = (uint32_t)(stream >> 32);
    uint32_t k0 = (uint32_t)seed, k1 = (uint32_t)(seed >> 32);
    for (int round = 0; round < 10; round++) {
        uint32_t lo0 = PHILOX_M0 * c0, hi0 = __umulhi(PHILOX_M0, c0);
        uint32_t lo1 = PHILOX_M1 * c2, hi1 = __umulhi(PHILOX_M1, c2);
        uint32_t n0 = hi1 ^ c1 ^ k0, n1 = lo1, n2 = hi0 ^ c3 ^ k1, n3 = lo0;
        c0 = n0, c1 = n1, c2 = n2, c3 = n3;
        k0 += PHILOX_W0;
        k1 += PHILOX_W1;
    }
    return (float)(c0 >> 8) * (1.0f / 16777216.0f);
}

/* ---------------------------------------------------------------- one row */

/* Masses in fixed point: exact integer sums, the same whatever their order. */
__device__ __forceinline__ unsigned long long to_fixed(double mass) { return __double2ull_rn(mass * 0x1p40); }

/* A row of logits and how to turn them into y, z and e. */
template <typename T> struct Row {
    const T *x;
    int V;
    bool vec;                  /* 16-byte aligned rows of a multiple of 8 elements */
    const unsigned *penalised; /* bitmap of the history's tokens, or NULL */
    float penalty;
    float temperature; /* 1 when greedy */
    float max_z;

    /* y[8] for ids i0..i0+7 (i0 a multiple of 8); ids >= V read -inf. */
    __device__ __forceinline__ void load_y(int i0, float y[GROUP]) const {
        if (vec && i0 + GROUP <= V) {
            load_vector(x + i0, y);
        } else {
#pragma unroll
            for (int k = 0; k < GROUP; k++) y[k] = i0 + k < V ? to_float(x[i0 + k]) : -INFINITY;
        }
        if (penalised) { /* transformers: divide positive logits, multiply the others */
            unsigned word = i0 < V ? penalised[i0 >> 5] >> (i0 & 31) : 0u;
#pragma unroll
            for (int k = 0; k < GROUP; k++)
                if ((word >> k) & 1u) y[k] = y[k] > 0.0f ? __fdiv_rn(y[k], penalty) : __fmul_rn(y[k], penalty);
        }
    }
    __device__ __forceinline__ float z_of(float y) const {
        return temperature == 1.0f ? y : __fdiv_rn(y, temperature);
    }
    __device__ __forceinline__ float e_of(float y) const { return expf(__fsub_rn(z_of(y), max_z)); }

    static __device__ __forceinline__ void load_vector(const float *p, float y[GROUP]) {
        float4 a = reinterpret_cast<const float4 *>(p)[0], b = reinterpret_cast<const float4 *>(p)[1];
        y[0] = a.x, y[1] = a.y, y[2] = a.z, y[3] = a.w, y[4] = b.x, y[5] = b.y, y[6] = b.z, y[7] = b.w;
    }
    static __device__ __forceinline__ void load_vector(const __nv_bfloat16 *p, float y[GROUP]) {
        uint4 r = *reinterpret_cast<const uint4 *>(p);
        unsigned w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
        for (int j = 0; j < 4; j++) y[2 * j] = __uint_as_float(w[j] << 16), y[2 * j + 1] = __uint_as_float(w[j] & 0xffff0000u);
    }
};

/* Which ids the draw keeps: e >= cut and, of the ids whose e is tie_e, those up
 * to last_tie_id (top-p cutting into a run of equal probabilities: the host
 * drops the largest ids first). */
struct Keep {
    float cut, tie_e;
    int last_tie_id;
    __device__ __forceinline__ bool operator()(float e, int id) const {
        return e >= cut && (e != tie_e || id <= last_tie_id);
    }
};

/* A radix select's answer: the key, the measure of the members above it, at it
 * (and how many they are) and in all. */
struct Selected {
    uint32_t key;
    unsigned long long above, at_key, total;
    unsigned count_at_key;
};

/* What the block's threads share besides the penalty bitmap. */
struct SampleShared {
    unsigned long long hist[256]; /* radix select: measure per digit */
    unsigned hist_count[256];     /* and members per digit */
    unsigned long long scan[SAMPLE_WARPS];
    double sum[SAMPLE_WARPS];
    float best[SAMPLE_WARPS];
    int best_id[SAMPLE_WARPS];
    Selected selected;
    unsigned long long find_target; /* the draw: the target's offset in the chunk that holds it */
    int find_thread;                /* and that chunk's thread */
    unsigned digit, tie_keep;
    float cut;
    int id;
    float token_z;
};

/* ---------------------------------------------------------------- block reductions */

/* (max y, lowest id among equals) over the block, returned to every thread. */
__device__ void block_argmax(float &best, int &best_id, SampleShared &sh) {
    for (int o = 16; o > 0; o >>= 1) {
        float v = __shfl_xor_sync(FULL_MASK, best, o);
        int id = __shfl_xor_sync(FULL_MASK, best_id, o);
        if (v > best || (v == best && id < best_id)) best = v, best_id = id;
    }
    if (threadIdx.x % 32 == 0) sh.best[threadIdx.x / 32] = best, sh.best_id[threadIdx.x / 32] = best_id;
    __syncthreads();
    best = sh.best[0], best_id = sh.best_id[0];
    for (int w = 1; w < SAMPLE_WARPS; w++)
        if (sh.best[w] > best || (sh.best[w] == best && sh.best_id[w] < best_id)) best = sh.best[w], best_id = sh.best_id[w];
    __syncthreads();
}

/* Sum over the block in a fixed order (deterministic), returned to every thread. */
__device__ double block_sum(double v, SampleShared &sh) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    if (threadIdx.x % 32 == 0) sh.sum[threadIdx.x / 32] = v;
    __syncthreads();
    double r = 0.0;
    for (int w = 0; w < SAMPLE_WARPS; w++) r += sh.sum[w];
    __syncthreads();
    return r;
}

/* Exclusive prefix sum over the threads in order; *total gets the sum of all. */
__device__ unsigned long long block_exclusive_scan(unsigned long long v, unsigned long long *total, SampleShared &sh) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    unsigned long long inclusive = v;
    for (int o = 1; o < 32; o <<= 1) {
        unsigned long long t = __shfl_up_sync(FULL_MASK, inclusive, o);
        if (lane >= o) inclusive += t;
    }
    if (lane == 31) sh.scan[warp] = inclusive;
    __syncthreads();
    unsigned long long before = 0, all = 0;
    for (int w = 0; w < SAMPLE_WARPS; w++) {
        if (w < warp) before += sh.scan[w];
        all += sh.scan[w];
    }
    __syncthreads();
    *total = all;
    return before + inclusive - v;
}

/* ---------------------------------------------------------------- chunk sums and the draw */

/* Thread t owns ids [t * chunk, t * chunk + chunk): contiguous, so the
 * inverse CDF in id order is a scan over threads, then a walk in one chunk. */
__host__ __device__ __forceinline__ int chunk_size(int V) {
    int groups = (V + GROUP - 1) / GROUP;
    return (groups + SAMPLE_THREADS - 1) / SAMPLE_THREADS * GROUP;
}

/* sum of e over the kept ids of [begin, end): fp32 over each group of 8, in
 * order, then double. chunk_find repeats these exact operations. */
template <typename T> __device__ double chunk_mass(const Row<T> &r, Keep keep, int begin, int end) {
    double acc = 0.0;
    for (int i0 = begin; i0 < end; i0 += GROUP) {
        float y[GROUP], s = 0.0f;
        r.load_y(i0, y);
#pragma unroll
        for (int k = 0; k < GROUP; k++) {
            float e = r.e_of(y[k]);
            if (keep(e, i0 + k)) s += e;
        }
        acc += (double)s;
    }
    return acc;
}

/* The first kept id of [begin, end) whose running mass, in fixed point,
 * exceeds target; *z gets its z. target < to_fixed(chunk_mass(...)), so one is
 * found (the last id is a guard that cannot be reached). One thread: the
 * reference that warp_chunk_find reproduces (COLT_SAMPLE_SEQUENTIAL_FIND=1). */
template <typename T>
__device__ int chunk_find(const Row<T> &r, Keep keep, int begin, int end, unsigned long long target, float *z) {
    double acc = 0.0;
    for (int i0 = begin; i0 < end; i0 += GROUP) {
        float y[GROUP], s = 0.0f;
        r.load_y(i0, y);
#pragma unroll
        for (int k = 0; k < GROUP; k++) {
            float e = r.e_of(y[k]);
            if (keep(e, i0 + k)) {
                s += e;
                if (to_fixed(acc + (double)s) > target) {
                    *z = r.z_of(y[k]);
                    return i0 + k;
                }
            }
        }
        acc += (double)s;
    }
    *z = -INFINITY;
    return end - 1;
}

/* chunk_find by one warp: lane j takes group j of each 32; a lane's running
 * mass before its group adds the groups before it one by one in double, in
 * order, as chunk_find does, and within its group it runs chunk_find's test
 * after each kept id; the lowest lane with a hit holds chunk_find's answer.
 * One round of loads instead of one per group. Every lane gets the result. */
template <typename T>
__device__ int warp_chunk_find(const Row<T> &r, Keep keep, int begin, int end, unsigned long long target, float *z) {
    const int lane = threadIdx.x % 32, groups = (end - begin + GROUP - 1) / GROUP;
    double acc = 0.0; /* mass of the groups before this round */
    for (int g0 = 0; g0 < groups; g0 += 32) {
        const int g = g0 + lane, i0 = begin + g * GROUP;
        float y[GROUP], e[GROUP], s = 0.0f;
        if (g < groups) {
            r.load_y(i0, y);
#pragma unroll
            for (int k = 0; k < GROUP; k++) {
                e[k] = r.e_of(y[k]);
                if (keep(e[k], i0 + k)) s += e[k];
            }
        }
        double before = acc;
        for (int j = 0; j < 32 && g0 + j < groups; j++) {
            double v = (double)__shfl_sync(FULL_MASK, s, j);
            if (j < lane) before += v;
            acc += v;
        }
        int hit = -1;
        if (g < groups) {
            float run = 0.0f;
#pragma unroll
            for (int k = 0; k < GROUP; k++)
                if (hit < 0 && keep(e[k], i0 + k)) {
                    run += e[k];
                    if (to_fixed(before + (double)run) > target) hit = k;
                }
        }
        unsigned hits = __ballot_sync(FULL_MASK, hit >= 0);
        if (hits) {
            int src = __ffs(hits) - 1, k = __shfl_sync(FULL_MASK, hit, src);
            float zk = r.z_of(y[k < 0 ? 0 : k]);
            *z = __shfl_sync(FULL_MASK, zk, src);
            return begin + (g0 + src) * GROUP + k;
        }
    }
    *z = -INFINITY;
    return end - 1;
}

/* The draw's last step in a block of threads owning chunks: the thread whose
 * [before, before + q) holds target names its chunk, and warp 0 walks it. */
template <typename T>
__device__ void block_draw_find(const Row<T> &r, Keep keep, int chunk, unsigned long long before, unsigned long long q,
                                unsigned long long target, bool sequential, SampleShared &sh) {
    if (before <= target && target < before + q) sh.find_thread = threadIdx.x, sh.find_target = target - before;
    __syncthreads();
    if (sequential) {
        if (threadIdx.x == 0) {
            const int begin = min(r.V, sh.find_thread * chunk), end = min(r.V, begin + chunk);
            float z;
            sh.id = chunk_find(r, keep, begin, end, sh.find_target, &z);
            sh.token_z = z;
        }
    } else if (threadIdx.x < 32) {
        const int begin = min(r.V, sh.find_thread * chunk), end = min(r.V, begin + chunk);
        float z;
        int id = warp_chunk_find(r, keep, begin, end, sh.find_target, &z);
        if (threadIdx.x == 0) sh.id = id, sh.token_z = z;
    }
    __syncthreads();
}

/* Where a row's results go: tokens[row], logprobs[row], and sequence s's history. */
struct RowOut {
    int *tokens;
    float *logprobs;
    int *history, *history_len;
    int history_stride, row, s;
};

/* A row's last step, once thread t holds its chunk's mass and the block S_drawn (the mass of the
 * distribution drawn from): unless greedy, the inverse CDF over the kept ids in id order (the chunk
 * masses in fixed point scanned across the block, the chunk holding u * total walked by a warp); then
 * thread 0 stores the token, its log-prob and the history append. */
template <typename T>
__device__ void draw_and_store(const Row<T> &r, Keep keep, double mass, double S_drawn, int best_id, bool greedy,
                               const SampleArgs &a, const int *streams, const int *counters, const RowOut &o,
                               SampleShared &sh) {
    int token = best_id;
    float token_z = r.max_z;
    if (!greedy) {
        unsigned long long q = to_fixed(mass), total;
        if (threadIdx.x == 0) sh.find_thread = 0; /* total > 0 (the max has e = 1), so one thread takes it */
        unsigned long long before = block_exclusive_scan(q, &total, sh);
        float u = philox_uniform(a.seed, (uint64_t)streams[o.row], (uint64_t)counters[o.row]);
        unsigned long long target = (unsigned long long)((double)u * (double)total); /* < total: u < 1 */
        block_draw_find(r, keep, chunk_size(r.V), before, q, target, a.sequential_find != 0, sh);
        token = sh.id, token_z = sh.token_z;
    }
    if (threadIdx.x == 0) {
        o.tokens[o.row] = token;
        o.logprobs[o.row] = (float)((double)token_z - ((double)r.max_z + log(S_drawn)));
        if (o.history && o.history_len[o.s] < o.history_stride)
            o.history[(size_t)o.s * o.history_stride + o.history_len[o.s]++] = token;
    }
}

/* The n-th (from 1) id, ascending, whose e equals v: a count per chunk, a scan,
 * and a walk in the chunk that holds it. Returned to every thread. */
template <typename T> __device__ int nth_id_with_e(const Row<T> &r, float v, unsigned n, int begin, int end,
                                                   SampleShared &sh) {
    unsigned long long count = 0, total;
    for (int i0 = begin; i0 < end; i0 += GROUP) {
        float y[GROUP];
        r.load_y(i0, y);
#pragma unroll
        for (int k = 0; k < GROUP; k++) count += r.e_of(y[k]) == v;
    }
    unsigned long long before = block_exclusive_scan(count, &total, sh);
    if (before < n && n <= before + count) {
        unsigned left = n - (unsigned)before;
        for (int i0 = begin; i0 < end && left; i0 += GROUP) {
            float y[GROUP];
            r.load_y(i0, y);
#pragma unroll
            for (int k = 0; k < GROUP; k++)
                if (left && r.e_of(y[k]) == v && --left == 0) sh.id = i0 + k;
        }
    }
    __syncthreads();
    int id = sh.id;
    __syncthreads();
    return id;
}

/* ---------------------------------------------------------------- radix select */

/* hist[bin] += measure and hist_count[bin] += 1 for every lane with bin >= 0,
 * one atomic per distinct bin of the warp. measure < 2^40: summed over 32
 * lanes as 16 + 24 bits. */
__device__ __forceinline__ void warp_hist_add(SampleShared &sh, int bin, unsigned long long measure) {
    if (!__ballot_sync(FULL_MASK, bin >= 0)) return;
    unsigned peers = __match_any_sync(FULL_MASK, bin);
    unsigned hi = __reduce_add_sync(peers, (unsigned)(measure >> 24));
    unsigned lo = __reduce_add_sync(peers, (unsigned)(measure & 0xffffffu));
    if (bin >= 0 && (int)(threadIdx.x % 32) == __ffs(peers) - 1) {
        atomicAdd(&sh.hist[bin], ((unsigned long long)hi << 24) + lo);
        atomicAdd(&sh.hist_count[bin], (unsigned)__popc(peers));
    }
}

/* Orders floats as unsigned ints (-0 as +0: the host sees them equal). */
__device__ __forceinline__ uint32_t order_key(float y) {
    uint32_t b = __float_as_uint(y == 0.0f ? 0.0f : y);
    return (b & 0x80000000u) ? ~b : b | 0x80000000u;
}
__device__ __forceinline__ float key_value(uint32_t key) {
    return __uint_as_float((key & 0x80000000u) ? key & 0x7fffffffu : ~key);
}

/* top-k: the k-th largest y, counting ties (measure 1 per token). */
struct TopK {
    static const bool by_mass = false;
    unsigned long long k;
    __device__ bool operator()(unsigned long long from_top, unsigned long long total) const { return from_top >= k; }
};
/* top-p: the host's test that the tail below a token, as a share of the
 * survivors' mass, is at most 1 - top_p. */
struct TopP {
    static const bool by_mass = true;
    double tail_allowed; /* 1 - top_p */
    __device__ bool tail_ok(unsigned long long tail, unsigned long long total) const {
        return (double)tail / (double)total <= tail_allowed;
    }
    __device__ bool operator()(unsigned long long from_top, unsigned long long total) const {
        return tail_ok(total - from_top, total);
    }
};

/* Radix select from the top, 8 bits per pass, over the key bits above
 * low_bits: the largest key K such that pred(measure of the members with key
 * >= K, measure of all members). Members: top-k, every id (key of y); top-p,
 * ids with e >= member_cut (key = the bits of e, measure e in fixed point).
 * pred holds at the smallest key and is monotone, so each pass picks the
 * highest digit where it holds; that digit's bin is never empty, so the key
 * is one a member has. */
template <typename T, typename Pred>
__device__ Selected radix_select(const Row<T> &r, Pred pred, float member_cut, int low_bits, SampleShared &sh) {
    const int lane = threadIdx.x % 32;
    const int iterations = ((r.V + GROUP - 1) / GROUP + SAMPLE_THREADS - 1) / SAMPLE_THREADS;
    uint32_t prefix = 0;
    unsigned long long above = 0, total = 0;
    for (int shift = 24; shift >= low_bits; shift -= 8) {
        uint32_t fixed_mask = shift == 24 ? 0u : 0xffffffffu << (shift + 8);
        for (int b = threadIdx.x; b < 256; b += SAMPLE_THREADS) sh.hist[b] = 0, sh.hist_count[b] = 0;
        __syncthreads();
        for (int it = 0; it < iterations; it++) { /* the same count on every lane: warp_hist_add is collective */
            int i0 = (threadIdx.x + it * SAMPLE_THREADS) * GROUP;
            float y[GROUP];
            r.load_y(i0, y);
#pragma unroll
            for (int k = 0; k < GROUP; k++) {
                uint32_t key;
                unsigned long long measure = 1;
                bool member = i0 + k < r.V;
                if (Pred::by_mass) {
                    float e = r.e_of(y[k]);
                    member = member && e >= member_cut;
                    key = __float_as_uint(e);
                    measure = __float2ull_rn(e * 0x1p40f);
                } else {
                    key = order_key(y[k]);
                }
                int bin = member && (key & fixed_mask) == prefix ? (int)((key >> shift) & 255u) : -1;
                warp_hist_add(sh, bin, bin >= 0 ? measure : 0);
            }
        }
        __syncthreads();
        if (threadIdx.x < 32) { /* warp 0: lane l holds digits 8l..8l+7 */
            unsigned long long suffix[8], lane_total = 0;
#pragma unroll
            for (int j = 7; j >= 0; j--) suffix[j] = lane_total += sh.hist[8 * lane + j];
            unsigned long long from_higher = lane_total; /* digits of the lanes above, then minus its own */
            for (int o = 1; o < 32; o <<= 1) {
                unsigned long long t = __shfl_down_sync(FULL_MASK, from_higher, o);
                if (lane + o < 32) from_higher += t;
            }
            from_higher -= lane_total;
            if (shift == 24) total = __shfl_sync(FULL_MASK, from_higher + lane_total, 0);
            int best = 0;
            bool has = false;
            unsigned long long from_best = 0; /* measure of the keys >= the best digit */
#pragma unroll
            for (int j = 7; j >= 0; j--)
                if (!has && pred(above + from_higher + suffix[j], total))
                    has = true, best = j, from_best = above + from_higher + suffix[j];
            unsigned found = __ballot_sync(FULL_MASK, has);
            int owner = found ? 31 - __clz(found) : 0; /* found is never 0: pred holds at the lowest key */
            if (lane == owner) {
                int digit = 8 * lane + best;
                sh.digit = digit;
                sh.selected.above = from_best - sh.hist[digit];
                sh.selected.at_key = sh.hist[digit];
                sh.selected.count_at_key = sh.hist_count[digit];
                sh.selected.total = total;
            }
        }
        __syncthreads();
        prefix |= sh.digit << shift;
        above = sh.selected.above;
        total = sh.selected.total;
        __syncthreads();
    }
    Selected sel = sh.selected;
    sel.key = prefix;
    __syncthreads();
    return sel;
}

/* The smallest e >= 0 whose probability (float)(e / S) is at least prob (the
 * host compares probabilities; they are monotone in e). prob <= (float)(1 / S),
 * the most likely token's. Bisection on the bits of e. */
__device__ float e_cut_for_prob(float prob, double S) {
    if (!(prob > 0.0f)) return 0.0f;
    uint32_t lo = 0, hi = 0x3f800000u; /* e = 0 is below it, e = 1 reaches it */
    while (hi - lo > 1) {
        uint32_t mid = lo + (hi - lo) / 2;
        if ((float)((double)__uint_as_float(mid) / S) >= prob) hi = mid;
        else lo = mid;
    }
    return __uint_as_float(hi);
}

__device__ __forceinline__ float prob_of(float e, double S) { return (float)((double)e / S); }

/* Which ids survive top-k, then top-p on the survivors, then min-p. */
template <typename T>
__device__ Keep filter(const Row<T> &r, const SampleArgs &a, double S, bool bf16_keys, int begin, int end,
                       SampleShared &sh) {
    Keep keep = {0.0f, -1.0f, INT_MAX};
    if (a.top_k > 0 && a.top_k < r.V) {
        TopK pred = {(unsigned long long)a.top_k};
        uint32_t key = radix_select(r, pred, 0.0f, bf16_keys ? 16 : 0, sh).key;
        if (bf16_keys) key |= (key & 0x80000000u) ? 0u : 0xffffu; /* the bits a bf16 leaves constant */
        if (threadIdx.x == 0) sh.cut = e_cut_for_prob(prob_of(r.e_of(key_value(key)), S), S);
        __syncthreads();
        keep.cut = sh.cut;
        __syncthreads();
    }
    if (a.top_p < 1.0f) {
        TopP pred = {1.0 - (double)a.top_p};
        Selected sel = radix_select(r, pred, keep.cut, 0, sh);
        float v = __uint_as_float(sel.key);
        if (threadIdx.x == 0) {
            /* The host drops the tail one token at a time, equal probabilities
             * largest id first: of the n tokens at v, the most it can drop (never
             * the most likely token). All have the same measure q. */
            unsigned n = sel.count_at_key;
            unsigned long long q = sel.at_key / n, below = sel.total - sel.above - sel.at_key;
            unsigned lo = 0, hi = sel.above == 0 ? n - 1 : n;
            while (lo < hi) {
                unsigned mid = lo + (hi - lo + 1) / 2;
                if (pred.tail_ok(below + mid * q, sel.total)) lo = mid;
                else hi = mid - 1;
            }
            sh.tie_keep = lo > 0 ? n - lo : 0;
            sh.cut = fmaxf(keep.cut, e_cut_for_prob(prob_of(v, S), S));
        }
        __syncthreads();
        unsigned tie_keep = sh.tie_keep;
        keep.cut = sh.cut;
        __syncthreads();
        if (tie_keep > 0) keep.tie_e = v, keep.last_tie_id = nth_id_with_e(r, v, tie_keep, begin, end, sh);
    }
    if (a.min_p > 0.0f) {
        if (threadIdx.x == 0) sh.cut = fmaxf(keep.cut, e_cut_for_prob(__fmul_rn(a.min_p, prob_of(1.0f, S)), S));
        __syncthreads();
        keep.cut = sh.cut;
        __syncthreads();
    }
    return keep;
}

/* ---------------------------------------------------------------- the kernel */

/* One block per row; rows of padding (seq < 0) return at once. Rows must
 * belong to distinct sequences: each appends to its sequence's history. */
template <typename T>
__global__ void __launch_bounds__(SAMPLE_THREADS)
    sample_kernel(int *tokens, float *logprobs, const T *logits, int V, int vec, SampleArgs a, const int *seq,
                  const int *streams, const int *counters, int *history, int *history_len, int history_stride) {
    __shared__ SampleShared sh;
    extern __shared__ unsigned penalised[];
    const int row = blockIdx.x, s = seq[row];
    if (s < 0) return;
    const bool greedy = a.temperature == 0.0f;
    const bool penalty = history && a.repetition_penalty != 1.0f;
    if (penalty) { /* each distinct token of the history once */
        const int *seq_history = history + (size_t)s * history_stride;
        int n_history = min(history_len[s], history_stride);
        for (int w = threadIdx.x; w < (V + 31) / 32; w += SAMPLE_THREADS) penalised[w] = 0;
        __syncthreads();
        for (int j = threadIdx.x; j < n_history; j += SAMPLE_THREADS) {
            int t = seq_history[j];
            if (t >= 0 && t < V) atomicOr(&penalised[t >> 5], 1u << (t & 31));
        }
        __syncthreads();
    }
    Row<T> r = {logits + (size_t)row * V, V, vec != 0, penalty ? penalised : NULL, a.repetition_penalty,
                greedy ? 1.0f : a.temperature, 0.0f};

    /* pass 1: max y, lowest id on ties */
    float best = -INFINITY;
    int best_id = INT_MAX;
    for (int i0 = threadIdx.x * GROUP; i0 < V; i0 += SAMPLE_THREADS * GROUP) {
        float y[GROUP];
        r.load_y(i0, y);
#pragma unroll
        for (int k = 0; k < GROUP; k++) /* ids ascend per thread: the first max stays */
            if (i0 + k < V && (y[k] > best || best_id == INT_MAX)) best = y[k], best_id = i0 + k;
    }
    block_argmax(best, best_id, sh);
    r.max_z = r.z_of(best); /* division is monotone: max z = z of max y */

    /* pass 2: S */
    const int chunk = chunk_size(V), begin = min(V, threadIdx.x * chunk), end = min(V, begin + chunk);
    Keep keep = {0.0f, -1.0f, INT_MAX};
    double mass = chunk_mass(r, keep, begin, end);
    const double S = block_sum(mass, sh);
    double S_drawn = S; /* mass of the distribution drawn from */

    if (!greedy && (a.top_k > 0 || a.top_p < 1.0f || a.min_p > 0.0f)) {
        keep = filter(r, a, S, sizeof(T) == 2 && !penalty, begin, end, sh);
        if (keep.cut > 0.0f || keep.last_tie_id != INT_MAX) mass = chunk_mass(r, keep, begin, end);
        S_drawn = block_sum(mass, sh); /* the log-prob is renormalised over the kept set */
    }
    RowOut o = {tokens, logprobs, history, history_len, history_stride, row, s};
    draw_and_store(r, keep, mass, S_drawn, best_id, greedy, a, streams, counters, o, sh);
}

/* ---------------------------------------------------------------- small batches: a row over many CTAs */

/* With one block per row, a batch of 1-8 rows leaves all but a few SMs idle and
 * each block reads its ~600 KB row three times (~38 us at V = 151936). Rows
 * without filters or a penalty (greedy, or a plain temperature: what GRPO
 * samples with) instead run as three kernels that give the same bits:
 *   split_max   128 CTAs per row, a warp per chunk of the one-block kernel:
 *               each CTA's (max y, lowest id) -> scratch;
 *   split_mass  the same grid: the row's max from those, then each chunk's mass
 *               by chunk_mass's exact operations (lane j sums group j of the
 *               chunk in fp32, the warp adds the groups in order in double);
 *   split_draw  one 1024-thread block per row, thread t holding chunk t's mass
 *               as the one-block kernel's thread t does: the same block_sum,
 *               scan and chunk_find, so the same token and log-prob.
 * The argmax is exact in any order (max value, lowest id). */
#define SPLIT_MAX_ROWS 8
#define SPLIT_WARPS 8                                /* chunks per CTA */
#define SPLIT_CTAS (SAMPLE_THREADS / SPLIT_WARPS)  /* CTAs per row: one chunk per warp */

struct SplitScratch {
    float best[SPLIT_MAX_ROWS][SPLIT_CTAS];
    int best_id[SPLIT_MAX_ROWS][SPLIT_CTAS];
    double mass[SPLIT_MAX_ROWS][SAMPLE_THREADS];
};

/* (max, lowest id) over the 32 lanes, to every lane. */
__device__ __forceinline__ void warp_argmax(float &best, int &best_id) {
    for (int o = 16; o > 0; o >>= 1) {
        float v = __shfl_xor_sync(FULL_MASK, best, o);
        int id = __shfl_xor_sync(FULL_MASK, best_id, o);
        if (v > best || (v == best && id < best_id)) best = v, best_id = id;
    }
}

/* The row's (max y, lowest id) from the CTAs' partials, to every thread of a block of >= SPLIT_CTAS threads. */
__device__ void split_row_max(const SplitScratch *sc, int row, float &best, int &best_id, SampleShared &sh) {
    best = -INFINITY, best_id = INT_MAX;
    if (threadIdx.x < SPLIT_CTAS) best = sc->best[row][threadIdx.x], best_id = sc->best_id[row][threadIdx.x];
    warp_argmax(best, best_id);
    if (threadIdx.x % 32 == 0) sh.best[threadIdx.x / 32] = best, sh.best_id[threadIdx.x / 32] = best_id;
    __syncthreads();
    best = sh.best[0], best_id = sh.best_id[0];
    for (int w = 1; w < (int)(blockDim.x / 32); w++)
        if (sh.best[w] > best || (sh.best[w] == best && sh.best_id[w] < best_id)) best = sh.best[w], best_id = sh.best_id[w];
    __syncthreads();
}

template <typename T>
__global__ void __launch_bounds__(SPLIT_WARPS * 32)
    split_max_kernel(SplitScratch *sc, const T *logits, int V, int vec, const int *seq) {
    __shared__ float best_w[SPLIT_WARPS];
    __shared__ int id_w[SPLIT_WARPS];
    const int row = blockIdx.y, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (seq[row] < 0) return;
    Row<T> r = {logits + (size_t)row * V, V, vec != 0, NULL, 1.0f, 1.0f, 0.0f};
    const int chunk = chunk_size(V), t = blockIdx.x * SPLIT_WARPS + warp;
    const int begin = min(V, t * chunk), end = min(V, begin + chunk);
    float best = -INFINITY;
    int best_id = INT_MAX;
    for (int i0 = begin + lane * GROUP; i0 < end; i0 += 32 * GROUP) {
        float y[GROUP];
        r.load_y(i0, y);
#pragma unroll
        for (int k = 0; k < GROUP; k++)
            if (i0 + k < V && (y[k] > best || best_id == INT_MAX)) best = y[k], best_id = i0 + k;
    }
    warp_argmax(best, best_id);
    if (lane == 0) best_w[warp] = best, id_w[warp] = best_id;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < SPLIT_WARPS; w++)
            if (best_w[w] > best || (best_w[w] == best && id_w[w] < best_id)) best = best_w[w], best_id = id_w[w];
        sc->best[row][blockIdx.x] = best, sc->best_id[row][blockIdx.x] = best_id;
    }
}

template <typename T>
__global__ void __launch_bounds__(SPLIT_WARPS * 32)
    split_mass_kernel(SplitScratch *sc, const T *logits, int V, int vec, float temperature, const int *seq) {
    __shared__ SampleShared sh;
    const int row = blockIdx.y, lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    if (seq[row] < 0) return;
    float best;
    int best_id;
    split_row_max(sc, row, best, best_id, sh);
    Row<T> r = {logits + (size_t)row * V, V, vec != 0, NULL, 1.0f, temperature, 0.0f};
    r.max_z = r.z_of(best);
    const int chunk = chunk_size(V), t = blockIdx.x * SPLIT_WARPS + warp;
    const int begin = min(V, t * chunk), end = min(V, begin + chunk), groups = (end - begin + GROUP - 1) / GROUP;
    double acc = 0.0; /* chunk_mass: fp32 within a group of 8, then double, groups in order */
    for (int g0 = 0; g0 < groups; g0 += 32) {
        float s = 0.0f;
        if (g0 + lane < groups) {
            float y[GROUP];
            r.load_y(begin + (g0 + lane) * GROUP, y);
#pragma unroll
            for (int k = 0; k < GROUP; k++) s += r.e_of(y[k]);
        }
        for (int j = 0; j < 32 && g0 + j < groups; j++) acc += (double)__shfl_sync(FULL_MASK, s, j);
    }
    if (lane == 0) sc->mass[row][t] = acc;
}

template <typename T>
__global__ void __launch_bounds__(SAMPLE_THREADS)
    split_draw_kernel(const SplitScratch *sc, int *tokens, float *logprobs, const T *logits, int V, int vec,
                      SampleArgs a, const int *seq, const int *streams, const int *counters, int *history,
                      int *history_len, int history_stride) {
    __shared__ SampleShared sh;
    const int row = blockIdx.x, s = seq[row];
    if (s < 0) return;
    const bool greedy = a.temperature == 0.0f;
    float best;
    int best_id;
    split_row_max(sc, row, best, best_id, sh);
    Row<T> r = {logits + (size_t)row * V, V, vec != 0, NULL, 1.0f, greedy ? 1.0f : a.temperature, 0.0f};
    r.max_z = r.z_of(best);
    const Keep keep = {0.0f, -1.0f, INT_MAX};
    const double mass = sc->mass[row][threadIdx.x], S = block_sum(mass, sh);
    RowOut o = {tokens, logprobs, history, history_len, history_stride, row, s};
    draw_and_store(r, keep, mass, S, best_id, greedy, a, streams, counters, o, sh);
}

/* The scratch of the split path: the instance's, reserved at open. */
cudaError_t cuda_sample_reserve(CudaState *cs, size_t *reserved) {
    cudaError_t e = cudaMalloc(&cs->sample_split, sizeof(SplitScratch));
    if (e != cudaSuccess) {
        cs->sample_split = NULL;
        return e;
    }
    *reserved += sizeof(SplitScratch);
    return cudaSuccess;
}

void cuda_sample_release(CudaState *cs) {
    if (cs->sample_split) CUDA_CHECK(cudaFree(cs->sample_split));
    cs->sample_split = NULL;
}

/* Test hooks, on the instance be: unfiltered batches of up to max_rows rows take the split path (0 never,
 * -1 back to the instance's setting at open); the draw's walk by one thread (on = 1) or a warp (0). */
extern "C" void cuda_sample_split_rows(const Backend *be, int max_rows) {
    CudaState *cs = cuda_state(be);
    cs->opt.sample_split_rows = max_rows < 0 ? cs->opt_env.sample_split_rows : max_rows;
}
extern "C" void cuda_sample_sequential_find(const Backend *be, int on) {
    CudaState *cs = cuda_state(be);
    cs->opt.sample_sequential_find = on < 0 ? cs->opt_env.sample_sequential_find : on;
}

/* The option sample_split_rows (COLT_SAMPLE_SPLIT_ROWS; -1: SPLIT_MAX_ROWS), at most SPLIT_MAX_ROWS. */
static int split_max_rows(const CudaState *cs) {
    int rows = cs->opt.sample_split_rows < 0 ? SPLIT_MAX_ROWS : cs->opt.sample_split_rows;
    return rows > SPLIT_MAX_ROWS ? SPLIT_MAX_ROWS : rows;
}

template <typename T>
void cuda_sample(const Backend *be, void *tokens, void *logprobs, void *logits, int n, int vocab,
                 const struct SamplingParams *p, const void *seq, const void *streams, const void *counters,
                 void *history, void *history_len, int history_stride) {
    if (n <= 0) return;
    CudaState *cs = cuda_enter(be);
    const bool penalty = history && p->repetition_penalty != 1.0f;
    size_t bitmap_bytes = penalty ? (size_t)((vocab + 31) / 32) * sizeof(unsigned) : 0;
    CUDA_ASSERT_HOST(bitmap_bytes <= SAMPLE_MAX_BITMAP_BYTES); /* vocab <= 327680 with a repetition penalty */
    int vec = ((uintptr_t)logits & 15u) == 0 && vocab % GROUP == 0;
    SampleArgs a = {p->temperature, p->top_p, p->min_p, p->repetition_penalty, p->top_k, p->seed,
                    cs->opt.sample_sequential_find};
    const bool filtered = p->temperature != 0.0f && (p->top_k > 0 || p->top_p < 1.0f || p->min_p > 0.0f);
    SplitScratch *sc = n <= split_max_rows(cs) && !filtered && !penalty ? (SplitScratch *)cs->sample_split : NULL;
    if (sc) {
        dim3 grid(SPLIT_CTAS, n);
        float temperature = p->temperature == 0.0f ? 1.0f : p->temperature;
        split_max_kernel<T><<<grid, SPLIT_WARPS * 32, 0, cs->stream>>>(sc, (const T *)logits, vocab, vec,
                                                                          (const int *)seq);
        LAUNCH_CHECK(cs);
        split_mass_kernel<T><<<grid, SPLIT_WARPS * 32, 0, cs->stream>>>(sc, (const T *)logits, vocab, vec,
                                                                           temperature, (const int *)seq);
        LAUNCH_CHECK(cs);
        split_draw_kernel<T><<<n, SAMPLE_THREADS, 0, cs->stream>>>(
            sc, (int *)tokens, (float *)logprobs, (const T *)logits, vocab, vec, a, (const int *)seq,
            (const int *)streams, (const int *)counters, (int *)history, (int *)history_len, history_stride);
        LAUNCH_CHECK(cs);
        return;
    }
    sample_kernel<T><<<n, SAMPLE_THREADS, bitmap_bytes, cs->stream>>>(
        (int *)tokens, (float *)logprobs, (const T *)logits, vocab, vec, a, (const int *)seq, (const int *)streams,
        (const int *)counters, (int *)history, (int *)history_len, history_stride);
    LAUNCH_CHECK(cs);
}

template void cuda_sample<float>(const Backend *, void *, void *, void *, int, int, const struct SamplingParams *,
                                 const void *, const void *, const void *, void *, void *, int);
template void cuda_sample<__nv_bfloat16>(const Backend *, void *, void *, void *, int, int,
                                         const struct SamplingParams *, const void *, const void *, const void *,
                                         void *, void *, int);

/* ---------------------------------------------------------------- dropout (backend.h) */

/* One thread per element: the mask is philox_uniform(seed, stream, i) >= p, as
 * the CPU backend draws it with rng_uniform; one multiply in fp32, rounded to
 * storage once, so both backends give the same bits. */
template <typename T>
__global__ void dropout_kernel(T *out, const T *x, size_t n, float p, float scale, uint64_t seed, uint64_t stream) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        out[i] = philox_uniform(seed, stream, i) >= p ? from_float<T>(to_float(x[i]) * scale) : from_float<T>(0.0f);
}

template <typename T>
void cuda_dropout(const Backend *be, void *out, const void *x, size_t n, float p, uint64_t seed, uint64_t stream) {
    if (n == 0) return;
    CudaState *cs = cuda_enter(be);
    size_t blocks = (n + 255) / 256;
    if (blocks > 65535) blocks = 65535;
    dropout_kernel<T><<<(unsigned)blocks, 256, 0, cs->stream>>>((T *)out, (const T *)x, n, p, 1.0f / (1.0f - p), seed,
                                                                 stream);
    LAUNCH_CHECK(cs);
}

template void cuda_dropout<float>(const Backend *, void *, const void *, size_t, float, uint64_t, uint64_t);
template void cuda_dropout<__nv_bfloat16>(const Backend *, void *, const void *, size_t, float, uint64_t, uint64_t);

/* ---------------------------------------------------------------- apply_token_bitmask (backend.h) */

/* Structured outputs' mask: one thread per logit of the [n, vocab] rows (grid-stride), reading its row's
 * 32-bit word; a clear bit writes -inf (exact: nothing else changes). Layout: bitmask [n, (vocab + 31) / 32]. */
template <typename T>
__global__ void apply_token_bitmask_kernel(T *logits, const uint32_t *bitmask, int n, int vocab) {
    const size_t total = (size_t)n * vocab, words = ((size_t)vocab + 31) / 32;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < total; k += (size_t)gridDim.x * blockDim.x) {
        size_t row = k / (size_t)vocab, v = k % (size_t)vocab;
        if (!(bitmask[row * words + v / 32] >> (v % 32) & 1u)) logits[k] = from_float<T>(-INFINITY);
    }
}

template <typename T>
void cuda_apply_token_bitmask(const Backend *be, void *logits, const void *bitmask, int n, int vocab) {
    if (n <= 0 || vocab <= 0) return;
    CudaState *cs = cuda_enter(be);
    size_t blocks = ((size_t)n * vocab + 255) / 256;
    if (blocks > 65535) blocks = 65535;
    apply_token_bitmask_kernel<T><<<(unsigned)blocks, 256, 0, cs->stream>>>((T *)logits, (const uint32_t *)bitmask, n,
                                                                            vocab);
    LAUNCH_CHECK(cs);
}

template void cuda_apply_token_bitmask<float>(const Backend *, void *, const void *, int, int);
template void cuda_apply_token_bitmask<__nv_bfloat16>(const Backend *, void *, const void *, int, int);

/* ---------------------------------------------------------------- apply_penalties (backend.h) */

#define PENALTY_THREADS 256

/* vLLM's logit bias and penalties (sampler_apply_penalties): one block per row. Each distinct token of
 * the row's history is claimed by one thread (an atomicOr on a shared bitmap of the vocabulary, V bits),
 * which counts the token's completion occurrences (a scan of the history: O(history) per distinct token),
 * adds its bias, applies the repetition penalty and subtracts frequency * count and presence, in fp32 with
 * the host's roundings (no FMA), and stores once. Then the bias ids outside the history get their bias.
 * Exact against the host on fp32 storage; one bf16 rounding of the host's fp32 value on bf16 storage. */
template <typename T>
__global__ void apply_penalties_kernel(T *logits, int vocab, float repetition, float frequency, float presence,
                                       const int *seq, const int *history, const int *history_len,
                                       const int *prompt_len, int history_stride, const int *bias_ids,
                                       const float *bias_values, const int *bias_len, int bias_stride) {
    extern __shared__ unsigned claimed[];
    const int row = blockIdx.x, s = seq[row];
    if (s < 0) return;
    T *x = logits + (size_t)row * vocab;
    const int *h = history ? history + (size_t)s * history_stride : NULL;
    const int n_h = h ? min(history_len[s], history_stride) : 0, n_p = h ? min(prompt_len[s], n_h) : 0;
    const int *b_ids = bias_ids ? bias_ids + (size_t)s * bias_stride : NULL;
    const float *b_values = bias_values ? bias_values + (size_t)s * bias_stride : NULL;
    const int n_b = b_ids ? min(bias_len[s], bias_stride) : 0;
    const int words = (vocab + 31) / 32;
    for (int w = threadIdx.x; w < words; w += blockDim.x) claimed[w] = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n_h; i += blockDim.x) {
        int t = h[i];
        if (t < 0 || t >= vocab) continue;
        unsigned bit = 1u << (t & 31);
        if (atomicOr(&claimed[t >> 5], bit) & bit) continue; /* another thread has this token */
        int count = 0;
        for (int j = n_p; j < n_h; j++) count += h[j] == t;
        float l = to_float(x[t]);
        for (int j = 0; j < n_b; j++)
            if (b_ids[j] == t) l = __fadd_rn(l, b_values[j]);
        if (repetition != 1.0f) l = l > 0.0f ? __fdiv_rn(l, repetition) : __fmul_rn(l, repetition);
        if (count > 0) {
            l = __fsub_rn(l, __fmul_rn(frequency, (float)count));
            l = __fsub_rn(l, presence);
        }
        x[t] = from_float<T>(l);
    }
    __syncthreads();
    for (int j = threadIdx.x; j < n_b; j += blockDim.x) {
        int t = b_ids[j];
        if (t < 0 || t >= vocab || (claimed[t >> 5] >> (t & 31) & 1u)) continue;
        x[t] = from_float<T>(__fadd_rn(to_float(x[t]), b_values[j]));
    }
}

template <typename T>
void cuda_apply_penalties(const Backend *be, void *logits, int n, int vocab, const struct SamplingParams *p,
                          const void *seq, const void *history, const void *history_len, const void *prompt_len,
                          int history_stride, const void *bias_ids, const void *bias_values, const void *bias_len,
                          int bias_stride) {
    if (n <= 0 || vocab <= 0) return;
    CudaState *cs = cuda_enter(be);
    size_t bitmap_bytes = (size_t)((vocab + 31) / 32) * sizeof(unsigned);
    CUDA_ASSERT_HOST(bitmap_bytes <= SAMPLE_MAX_BITMAP_BYTES); /* vocab <= 327680 */
    apply_penalties_kernel<T><<<n, PENALTY_THREADS, bitmap_bytes, cs->stream>>>(
        (T *)logits, vocab, p->repetition_penalty, p->frequency_penalty, p->presence_penalty, (const int *)seq,
        (const int *)history, (const int *)history_len, (const int *)prompt_len, history_stride,
        (const int *)bias_ids, (const float *)bias_values, (const int *)bias_len, bias_stride);
    LAUNCH_CHECK(cs);
}

template void cuda_apply_penalties<float>(const Backend *, void *, int, int, const struct SamplingParams *,
                                          const void *, const void *, const void *, const void *, int, const void *,
                                          const void *, const void *, int);
template void cuda_apply_penalties<__nv_bfloat16>(const Backend *, void *, int, int, const struct SamplingParams *,
                                                  const void *, const void *, const void *, const void *, int,
                                                  const void *, const void *, const void *, int);
