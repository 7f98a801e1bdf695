/* cuda_decode_layers.cu — every decoder layer of a small decode step in one launch (backend.h
 * decode_layers; bf16 storage).
 *
 * Why: at batch 1 a decode step of a 0.5B model reads 1 GB of weights (0.2 ms at 4.8 TB/s), but the
 * op sequence is ~8 kernels per layer, ~200 per step, each paying launch and drain latency (2-5 us)
 * whatever its size: the step took 1.1 ms. Here one persistent kernel (one CTA per SM, all resident:
 * a cooperative launch) runs the layers as phases separated by grid-wide barriers:
 *
 *   A  xn = rmsnorm(x) * attn_norm (each CTA for itself); qkv = xn Wqkv^T + b, rows split over CTAs
 *   B  rope q and k, store k / v in the pool (one CTA per KV head), attention: (token, head, key
 *      split) items over CTAs, each leaving its unnormalised output, max and sum
 *   C  att = the merged splits (each CTA for itself); x += att Wo^T (+ b), rows split over CTAs
 *   D  xn = rmsnorm(x) * mlp_norm; h = silu(xn Wg^T) * (xn Wu^T), rows split over CTAs
 *   E  x += h Wd^T, rows split over CTAs
 *
 * Each CTA's rows of a projection are one contiguous range of the weight, each row cut into ks parts
 * so that the rows x ks slots load its warps evenly (dl_pick_ks). The weights reach the dot products
 * one of two ways, the same bits either way (the kernel's RING parameter):
 *   - the weight stream: each thread copies its chunks into its own ring of shared memory
 *     (cp.async) DL_RING_DEFAULT rounds ahead of their use, across phase and layer boundaries, so the
 *     next phase's first weights are in flight while the CTA waits at a barrier or does attention;
 *   - direct loads: every 16-byte load of a round issued into registers before the first is used.
 * The plan times both once per token count at create and keeps the faster (on an H200: the stream
 * for 0.5B and 1.5B shapes and for two tokens, direct loads for 7B at one token, where the stream's
 * copies run slower than plain loads and the barriers matter less). A CTA keeps its own rows of x
 * in shared memory (only its o and down projections write them) and reads the phase's bias while
 * the norm runs, saving a round trip to memory in three epilogues.
 * (Asking the L2 for the next phases' slices ahead, cp.async.bulk.prefetch.L2, was measured slower
 * on an H200 at every distance tried, 128-512 KB per CTA, and is not done. Nor is splitting the down
 * projection by columns to drop the D -> E barrier: each CTA's ~160-byte slices of W_d's rows stream
 * ~3x slower than whole rows, 10-35% slower in all; README, "Later attempts".)
 *
 * The values are the op sequence's (model_paged.c) up to summation order (and attention's
 * probabilities: the op sequence's tensor-core attention rounds them to bf16 before P V, this kernel
 * keeps them fp32): the same roundings to
 * bf16 (q|k|v with bias, roped q and k, attention output, projection, residual sums, gate, up and
 * their swiglu), rmsnorm's sum of squares in rmsnorm_warp_kernel's order, rope and swiglu by the same
 * expressions; the dot products sum lane-strided 8-element chunks and a butterfly, and attention
 * merges its splits by log-sum-exp, so the bits differ from cuBLAS's / the skinny kernel's and the
 * paged kernel's by bf16 rounding. A token's result does not depend on the others in the call or on
 * how many there are: every work split (rows per CTA, key splits per head) depends on the model and
 * the SM count alone.
 *
 * Supported: bf16 storage, head_dim 64 or 128, hidden and intermediate sizes multiples of 8, every
 * weight 16-byte aligned, q|k|v and gate|up weights back to back (the model checks), up to
 * DL_MAX_TOKENS tokens, one per sequence (taken by default for 1-2: DL_DEFAULT_TOKENS).
 * decode_layers_create returns NULL otherwise; decode_layers returns false (nothing launched) for
 * more tokens or in the deterministic mode.
 *
 * Measured (bench_decode, H200, batch 1): 0.5B 895 -> 1500 tok/s, 1.5B 494 -> 782, 7B 213 -> 255
 * (74% of the HBM roofline) against the op sequence. The weights are read evict-first in the L2, so
 * that what the next step reads again (norm weights, biases, the K/V pool) is still there: 3% at 0.5B.
 * What bounds the small models is the chain of dependent steps per phase (barrier, activations from
 * L2, reduction, stores made visible): 3-4.5 us per phase, 5 phases per layer, against 6.2 us of
 * weight bytes per layer at 0.5B. (bench_grid_sync measures that floor alone: 1.2 us per barrier, 1.7
 * us with the read of an 896-float vector, 2.7 / 3.25 us with weight reads in flight, as the ring
 * keeps them across each barrier; holding them back measured slower still.) bench_layer_floor measures the
 * whole design's floor: a skeleton of this kernel with only the weight stream and the exchanges reaches
 * 40% of the roofline at 0.5B and 61% at 1.5B (this kernel: 31% / 50%), the exchanges adding to the
 * stream's time rather than hiding under it.
 * COLT_DECODE_PROFILE=1 prints CTA 0's time per phase (before the dot products, the dot products,
 * reduction + epilogue, barrier), every CTA's gate|up and down dot products (how evenly the shares
 * take) and the rings picked; COLT_DECODE_RING=k forces k rounds (0: direct loads) instead of timing.
 * (Both are the instance's options, read when it opens.) A plan belongs to the instance that made it
 * and runs on its stream.
 *
 * Dimension legend: N tokens, D hidden, F intermediate, H query heads, KVH key/value heads, Dh head
 * dim, W = (H + 2 KVH) Dh, G CTAs (the SM count), S key splits per head. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_grid_barrier.cuh"

#define DL_THREADS 512
#define DL_WARPS (DL_THREADS / 32)
#define DL_MAX_TOKENS 4          /* compiled token counts: 1, 2, 4 */
#define DL_MAX_SPLITS 16         /* key splits per (token, head) */
#define DL_MAX_CTA_ROWS 256       /* a CTA's rows of q|k|v and of the hidden size (bias_s, x_own) */

typedef __nv_bfloat16 bf16;

struct DlLayer {
    const bf16 *attn_norm, *qkv_w, *qkv_b, *o_w, *o_b, *mlp_norm, *gate_up_w, *down_w;
    bf16 *k_pool, *v_pool;
};

struct DlParams {
    const DlLayer *layers;
    int n_layers, D, F, H, KVH, Dh, W, QD, group, block_shift, max_blocks, splits, act_stride, red_floats, ring;
    float eps, qk_scale;
    const float *inv_freq; /* [Dh / 2] */
    int n;
    const int *pos, *seq, *slot_mapping, *block_tables;
    bf16 *x, *qkv, *h;     /* [N, D], [N, W], [N, F] */
    float *part;           /* [N * H * S, Dh + 2]: output (unnormalised), max (log2 domain), sum */
    unsigned *barrier;
    unsigned long long *prof; /* COLT_DECODE_PROFILE: CTA 0's cycles per phase, computing / waiting; launches */
    unsigned long long *prof_cta; /* COLT_DECODE_PROFILE: per CTA, cycles of gate|up's and down's dot products */
};

#define DL_PHASES 5
#define DL_PROF_PARTS 4 /* per phase: before the dot products, the dot products, reduction + epilogue, barrier */
#define DL_PROF_STALL (DL_PROF_PARTS * DL_PHASES) /* cycles waiting on the weight ring */
#define DL_PROF_LAUNCHES (DL_PROF_STALL + 1)
#define DL_PROF_SLOTS (DL_PROF_LAUNCHES + 1)

/* COLT_DECODE_PROFILE: CTA 0's thread 0 adds the cycles since its last mark to a slot. */
struct DlProf {
    unsigned long long *slots; /* NULL: off */
    long long t;
    unsigned long long *cta; /* thread 0 of every CTA: [2] of p.prof_cta (NULL: off) */
    long long t_cta;
    __device__ void mark(int slot) {
        if (!slots) return;
        long long now = clock64();
        slots[slot] += (unsigned long long)(now - t);
        t = now;
    }
    /* The CTA's dot products of gate|up (phase 3) or down (4): from the start of the first warp's to
     * the end of the last warp's. */
    __device__ void cta_begin() {
        if (cta) t_cta = clock64();
    }
    __device__ void cta_end(int phase) {
        if (cta && (phase == 3 || phase == 4)) cta[phase - 3] += (unsigned long long)(clock64() - t_cta);
    }
};

/* Dynamic shared memory: the layer table first (16-byte multiple), then the activations. */
__host__ __device__ inline size_t dl_layers_bytes(int n_layers) { return ((size_t)n_layers * sizeof(DlLayer) + 15) & ~(size_t)15; }

/* ---------------------------------------------------------------- small helpers */

__device__ __forceinline__ float dl_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Weights stream through the L2 once per step: marked evict-first, so that what is read again (the
 * K/V pool across steps, the norm weights and biases, the activations) stays there. */
__device__ __forceinline__ unsigned long long dl_weight_policy() {
    unsigned long long policy;
    asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(policy));
    return policy;
}

/* Weights: read once per step, never written during the kernel: no L1 allocation. */
__device__ __forceinline__ uint4 dl_load_weight(const bf16 *p, unsigned long long policy) {
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p), "l"(policy));
    return r;
}

/* Activations written by other CTAs in this launch: read at L2 (L1 is not coherent). */
__device__ __forceinline__ uint4 dl_load_shared_act(const bf16 *p) { return __ldcg(reinterpret_cast<const uint4 *>(p)); }
__device__ __forceinline__ float dl_ldcg_bf16(const bf16 *p) {
    unsigned short u = __ldcg(reinterpret_cast<const unsigned short *>(p));
    return __uint_as_float((unsigned)u << 16);
}
__device__ __forceinline__ float bf16_round(float v) { return __bfloat162float(__float2bfloat16_rn(v)); }

__device__ __forceinline__ void unpack8(const uint4 &r, float f[8]) {
    f[0] = bf_lo(r.x), f[1] = bf_hi(r.x), f[2] = bf_lo(r.y), f[3] = bf_hi(r.y);
    f[4] = bf_lo(r.z), f[5] = bf_hi(r.z), f[6] = bf_lo(r.w), f[7] = bf_hi(r.w);
}
__device__ __forceinline__ float dot8(const uint4 &a, const uint4 &b, float acc) {
    acc = fmaf(bf_lo(a.x), bf_lo(b.x), acc);
    acc = fmaf(bf_hi(a.x), bf_hi(b.x), acc);
    acc = fmaf(bf_lo(a.y), bf_lo(b.y), acc);
    acc = fmaf(bf_hi(a.y), bf_hi(b.y), acc);
    acc = fmaf(bf_lo(a.z), bf_lo(b.z), acc);
    acc = fmaf(bf_hi(a.z), bf_hi(b.z), acc);
    acc = fmaf(bf_lo(a.w), bf_lo(b.w), acc);
    acc = fmaf(bf_hi(a.w), bf_hi(b.w), acc);
    return acc;
}

/* ---------------------------------------------------------------- phases */

/* act[t, 0..D) = bf16(w * (x[t] * scale_t)) for t < n, zeros for n <= t < NT: rmsnorm's arithmetic
 * (scale = 1 / sqrt(mean(x^2) + eps) in double, w * (x * scale) in fp32), its sum of squares added in
 * this CTA's order. One pass over global memory: x is staged raw in act, then scaled in place. */
template <int NT>
__device__ void dl_norm(bf16 *act, int stride, const bf16 *x, const bf16 *w, int n, int D, float eps) {
    __shared__ float warp_ss[DL_WARPS][NT];
    __shared__ float scale[NT];
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, nvec = D / 8;
    float ss[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) ss[t] = 0.0f;
    for (int e = threadIdx.x; e < NT * nvec; e += DL_THREADS) {
        int t = e / nvec, v = e % nvec;
        uint4 r = t < n ? dl_load_shared_act(x + (size_t)t * D + v * 8) : make_uint4(0, 0, 0, 0);
        __ldg(reinterpret_cast<const uint4 *>(w + v * 8)); /* into L1 for the second pass */
        *reinterpret_cast<uint4 *>(act + (size_t)t * stride + v * 8) = r;
        float f[8];
        unpack8(r, f);
        float sum = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; k++) sum += f[k] * f[k];
#pragma unroll
        for (int tt = 0; tt < NT; tt++)
            if (tt == t) ss[tt] += sum;
    }
#pragma unroll
    for (int t = 0; t < NT; t++) {
        float v = dl_warp_sum(ss[t]);
        if (lane == 0) warp_ss[warp][t] = v;
    }
    __syncthreads();
    if (threadIdx.x < NT) {
        float total = 0.0f;
        for (int k = 0; k < DL_WARPS; k++) total += warp_ss[k][threadIdx.x];
        scale[threadIdx.x] = (float)(1.0 / sqrt((double)total / D + (double)eps));
    }
    __syncthreads();
    for (int e = threadIdx.x; e < NT * nvec; e += DL_THREADS) {
        int t = e / nvec, v = e % nvec;
        if (t >= n) continue;
        uint4 *a = reinterpret_cast<uint4 *>(act + (size_t)t * stride + v * 8);
        float f[8], g[8];
        unpack8(*a, f);
        unpack8(__ldg(reinterpret_cast<const uint4 *>(w + v * 8)), g);
        float sc = scale[t];
#pragma unroll
        for (int k = 0; k < 8; k++) f[k] = g[k] * (f[k] * sc);
        *a = make_uint4(bf_pack(f[0], f[1]), bf_pack(f[2], f[3]), bf_pack(f[4], f[5]), bf_pack(f[6], f[7]));
    }
    __syncthreads();
}

/* ---------------------------------------------------------------- the weight stream
 *
 * Each thread streams the weight chunks it will multiply, in the order it multiplies them, through
 * its own ring of p.ring rounds in shared memory (cp.async, 16 bytes a chunk): a round is one
 * iteration of dl_gemv's inner loop (8 chunks: 8 of W, or 4 of gate and 4 of up). Consuming a round
 * issues the one p.ring rounds ahead, which may belong to a later phase or layer: the loads of the
 * next phases are in flight while the CTA waits at a grid barrier, does attention or a norm. Each
 * thread reads only the slots it filled itself, so no block barrier guards the ring. */

#define DL_RING_MAX 4     /* rounds per thread in flight (DlParams.ring) */
#define DL_RING_DEFAULT 2 /* the most taken unless COLT_DECODE_RING says otherwise (timed at create) */
#define DL_ROUND 8       /* 16-byte chunks per round */
#define DL_GEMV_PHASES 4 /* q|k|v, o, gate|up, down */
#define DL_ROUND_BYTES (DL_ROUND * DL_THREADS * 16) /* one round of the whole CTA */

/* A CTA's share of one projection: rows [r0, r0 + rows) of W [*, K] (and of W2 for gate|up), each
 * row's nvec chunks cut into ks parts (interleaved 32-chunk blocks) so that the rows x ks slots load
 * the DL_WARPS warps evenly. */
struct DlGeom {
    const bf16 *W, *W2;
    int K, nvec, r0, rows, ks;
};

/* The ks that gives the busiest warp the fewest rounds, ceil(rows ks / warps) x ceil(ceil(blocks /
 * ks) / rounds per block), then the fewest blocks, then the smallest (u: chunks of a row per lane in
 * a round: DL_ROUND, or half for gate|up). Depends on the shape and the CTA's row count alone. */
__host__ __device__ inline int dl_pick_ks(int rows, int nvec, int u) {
    const int blocks = (nvec + 31) / 32;
    int best = 1, best_rounds = 0x7fffffff, best_blocks = 0x7fffffff;
    for (int ks = 1; ks <= DL_WARPS && ks <= blocks; ks++) {
        int per_warp = (rows * ks + DL_WARPS - 1) / DL_WARPS, per_slot = (blocks + ks - 1) / ks;
        int rounds = per_warp * ((per_slot + u - 1) / u), b = per_warp * per_slot;
        if (rounds < best_rounds || (rounds == best_rounds && b < best_blocks)) best = ks, best_rounds = rounds, best_blocks = b;
    }
    return best;
}

/* Rows [r0, r1) of `rows` split evenly over `grid` CTAs. */
__host__ __device__ inline void dl_slice_of(int rows, int cta, int grid, int *r0, int *r1) {
    *r0 = (int)((long long)rows * cta / grid);
    *r1 = (int)((long long)rows * (cta + 1) / grid);
}

/* This CTA's rows and ks per projection, the same for every layer: computed once per launch
 * (dl_cta_shares), kept in shared memory. */
struct DlShare {
    int r0, rows, ks;
};

__device__ void dl_cta_shares(const DlParams &p, DlShare *shares) {
    if (threadIdx.x < DL_GEMV_PHASES) {
        const int ph = threadIdx.x;
        const int total = ph == 0 ? p.W : ph == 2 ? p.F : p.D, K = ph == 1 ? p.QD : ph == 3 ? p.F : p.D;
        int r0, r1;
        dl_slice_of(total, blockIdx.x, gridDim.x, &r0, &r1);
        shares[ph] = DlShare{r0, r1 - r0, dl_pick_ks(r1 - r0, K / 8, ph == 2 ? DL_ROUND / 2 : DL_ROUND)};
    }
}

/* Phase 0-3 of layer L: the projection's weights and K, this CTA's share. */
__device__ __forceinline__ DlGeom dl_geom(const DlParams &p, const DlLayer &L, const DlShare *shares, int phase) {
    DlGeom g;
    g.W2 = NULL;
    if (phase == 0) g.W = L.qkv_w, g.K = p.D;
    else if (phase == 1) g.W = L.o_w, g.K = p.QD;
    else if (phase == 2) g.W = L.gate_up_w, g.W2 = L.gate_up_w + (size_t)p.F * p.D, g.K = p.D;
    else g.W = L.down_w, g.K = p.F;
    const DlShare sh = shares[phase];
    g.nvec = g.K / 8, g.r0 = sh.r0, g.rows = sh.rows, g.ks = sh.ks;
    return g;
}

/* The producer side: where this thread's next round to issue is (layer, phase, slot, first chunk). */
struct DlStream {
    uint4 *ring;     /* [p.ring][DL_ROUND][DL_THREADS] */
    const DlShare *shares;
    int head;        /* the ring slot of the next round to consume */
    int layer, phase, slot, v0;
    DlGeom g;
    const bf16 *w, *w2; /* the slot's row of W (and W2) */
};

/* Moves s to the first round at or after (layer, phase, slot) this thread has; layer = n_layers at
 * the end. A lane has no round in a slot when its first chunk is past the row. */
__device__ void dl_stream_settle(DlStream &s, const DlParams &p, const DlLayer *lay) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    while (s.layer < p.n_layers) {
        for (; s.slot < s.g.rows * s.g.ks; s.slot += DL_WARPS) {
            s.v0 = (s.slot % s.g.ks) * 32 + lane;
            if (s.v0 < s.g.nvec) {
                const size_t row_off = (size_t)(s.g.r0 + s.slot / s.g.ks) * s.g.K;
                s.w = s.g.W + row_off, s.w2 = s.g.W2 ? s.g.W2 + row_off : NULL;
                return;
            }
        }
        if (++s.phase == DL_GEMV_PHASES) s.phase = 0, s.layer++;
        if (s.layer < p.n_layers) s.g = dl_geom(p, lay[s.layer], s.shares, s.phase);
        s.slot = warp;
    }
}

/* 16 bytes of weight into the ring, evict-first in the L2 (dl_weight_policy). WIDE: the L2 is asked to
 * fetch the whole 256-byte block from the HBM at once (.L2::256B). Taken at one token, where it measured
 * 1.5B batch 1 +3.5% and 0.5B level; at two tokens it measured 1.5-3% slower, and on the direct loads
 * (7B at one token) 1% slower. */
template <bool WIDE>
__device__ __forceinline__ void dl_cp_async_weight(void *smem_dst, const bf16 *src, unsigned long long policy) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem_dst);
    if (WIDE)
        asm volatile("cp.async.cg.shared.global.L2::cache_hint.L2::256B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "l"(policy)
                     : "memory");
    else
        asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "l"(policy) : "memory");
}

/* Issues the round at the cursor into ring slot k (an empty group past the end), then advances. */
template <bool WIDE>
__device__ void dl_stream_issue(DlStream &s, const DlParams &p, const DlLayer *lay, int k) {
    if (s.layer < p.n_layers) {
        const DlGeom &g = s.g;
        const bool two = s.w2 != NULL;
        const int U = two ? DL_ROUND / 2 : DL_ROUND, step = 32 * g.ks;
        uint4 *dst = s.ring + (size_t)k * DL_ROUND * DL_THREADS + threadIdx.x;
        const unsigned long long policy = dl_weight_policy();
        for (int u = 0; u < U; u++) {
            int v = s.v0 + u * step;
            if (v >= g.nvec) break;
            if (two) {
                dl_cp_async_weight<WIDE>(dst + (2 * u) * DL_THREADS, s.w + (size_t)v * 8, policy);
                dl_cp_async_weight<WIDE>(dst + (2 * u + 1) * DL_THREADS, s.w2 + (size_t)v * 8, policy);
            } else {
                dl_cp_async_weight<WIDE>(dst + u * DL_THREADS, s.w + (size_t)v * 8, policy);
            }
        }
        s.v0 += U * step;
        if (s.v0 >= g.nvec) {
            s.slot += DL_WARPS;
            dl_stream_settle(s, p, lay);
        }
    }
    cp_async_commit();
}

/* The CTA's rows of out = act W^T (g: this layer's phase; TWO: gate and up at once), as fp32 dot
 * products per (row, token) handed to epi(row, t, acc, acc2) for t < n. RING: the weights come from
 * the stream, round by round, each consumed round issuing the one p.ring ahead; otherwise from direct
 * loads. A row's ks parts are added in order through shared memory (red). */
template <int NT, bool TWO, bool RING, typename Epi>
__device__ void dl_gemv(const DlGeom &g, DlStream &s, const DlParams &p, const DlLayer *lay, const bf16 *act,
                        int stride, int n, float *red, DlProf &pf, int phase, Epi epi) {
    pf.mark(DL_PROF_PARTS * phase);
    pf.cta_begin();
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, ks = g.ks, slots = g.rows * ks;
    const int parts = TWO ? 2 : 1;
    constexpr int U = TWO ? DL_ROUND / 2 : DL_ROUND;
    const int step = 32 * ks;
    for (int slot = warp; slot < slots; slot += DL_WARPS) {
        float acc[NT], acc2[NT];
#pragma unroll
        for (int t = 0; t < NT; t++) acc[t] = 0.0f, acc2[t] = 0.0f;
        for (int v0 = (slot % ks) * 32 + lane; v0 < g.nvec; v0 += U * step) {
            if (RING) {
                /* this round's copies have landed (the p.ring - 1 issued after it may not have) */
                const long long w0 = pf.slots ? clock64() : 0;
                if (p.ring == 2) cp_async_wait<1>();
                else if (p.ring == 3) cp_async_wait<2>();
                else if (p.ring == 4) cp_async_wait<3>();
                else cp_async_wait<0>();
                if (pf.slots) pf.slots[DL_PROF_STALL] += (unsigned long long)(clock64() - w0);
                const uint4 *src = s.ring + (size_t)s.head * DL_ROUND * DL_THREADS + threadIdx.x;
#pragma unroll
                for (int u = 0; u < U; u++) {
                    int v = v0 + u * step;
                    if (v < g.nvec) {
                        uint4 a = src[(TWO ? 2 * u : u) * DL_THREADS], b;
                        if (TWO) b = src[(2 * u + 1) * DL_THREADS];
#pragma unroll
                        for (int t = 0; t < NT; t++) {
                            uint4 x = *reinterpret_cast<const uint4 *>(act + (size_t)t * stride + v * 8);
                            acc[t] = dot8(a, x, acc[t]);
                            if (TWO) acc2[t] = dot8(b, x, acc2[t]);
                        }
                    }
                }
                dl_stream_issue<NT == 1>(s, p, lay, s.head);
                s.head = s.head + 1 == p.ring ? 0 : s.head + 1;
            } else { /* direct: every load of the round issued before the first is used */
                const size_t row_off = (size_t)(g.r0 + slot / ks) * g.K;
                const unsigned long long policy = dl_weight_policy();
                uint4 a[U], b[U];
#pragma unroll
                for (int u = 0; u < U; u++) {
                    int v = v0 + u * step;
                    if (v < g.nvec) {
                        a[u] = dl_load_weight(g.W + row_off + (size_t)v * 8, policy);
                        if (TWO) b[u] = dl_load_weight(g.W2 + row_off + (size_t)v * 8, policy);
                    }
                }
#pragma unroll
                for (int u = 0; u < U; u++) {
                    int v = v0 + u * step;
                    if (v < g.nvec)
#pragma unroll
                        for (int t = 0; t < NT; t++) {
                            uint4 x = *reinterpret_cast<const uint4 *>(act + (size_t)t * stride + v * 8);
                            acc[t] = dot8(a[u], x, acc[t]);
                            if (TWO) acc2[t] = dot8(b[u], x, acc2[t]);
                        }
                }
            }
        }
#pragma unroll
        for (int t = 0; t < NT; t++) {
            acc[t] = dl_warp_sum(acc[t]);
            if (TWO) acc2[t] = dl_warp_sum(acc2[t]);
        }
        if (lane == 0)
#pragma unroll
            for (int t = 0; t < NT; t++) {
                red[(slot * NT + t) * parts] = acc[t];
                if (TWO) red[(slot * NT + t) * parts + 1] = acc2[t];
            }
    }
    pf.mark(DL_PROF_PARTS * phase + 1);
    __syncthreads();
    pf.cta_end(phase);
    for (int e = threadIdx.x; e < g.rows * n; e += DL_THREADS) {
        int r = e / n, t = e % n;
        float sum = 0.0f, sum2 = 0.0f;
        for (int k = 0; k < ks; k++) {
            sum += red[((r * ks + k) * NT + t) * parts];
            if (TWO) sum2 += red[((r * ks + k) * NT + t) * parts + 1];
        }
        epi(g.r0 + r, t, sum, sum2);
    }
    __syncthreads();
}

/* Key splits a context of len keys uses: one per DL_KEYS_PER_SPLIT keys, at most S. */
#define DL_KEYS_PER_SPLIT 64
__device__ __forceinline__ int dl_used_splits(int len, int S) {
    return max(1, min(S, (len + DL_KEYS_PER_SPLIT - 1) / DL_KEYS_PER_SPLIT));
}

/* Which keys item (t, h, s) attends to: [k_begin, k_end) of the sequence's len; none when seq < 0
 * (padding) or s >= used. */
struct DlAttnItem {
    int t, h, s, seq, pos, used, k_begin, k_end;
};
__device__ __forceinline__ DlAttnItem dl_attn_item(const DlParams &p, int item) {
    DlAttnItem it;
    const int S = p.splits;
    it.t = item / (p.H * S), it.h = (item / S) % p.H, it.s = item % S;
    it.seq = p.seq[it.t], it.pos = p.pos[it.t];
    const int len = it.pos + 1;
    it.used = dl_used_splits(len, S);
    const int per = (len + it.used - 1) / it.used;
    it.k_begin = min(len, it.s * per), it.k_end = min(len, it.k_begin + per);
    return it;
}

/* The pool row of position `key` of the sequence whose block-table row is `table`. */
__device__ __forceinline__ size_t dl_pool_row(const DlParams &p, const int *table, int key) {
    return ((size_t)__ldg(table + (key >> p.block_shift)) << p.block_shift) + (size_t)(key & ((1 << p.block_shift) - 1));
}

/* A pool row of K and V loaded ahead (key -1: none). */
struct DlKvAhead {
    uint4 k, v;
    int key;
};

/* Loads the K and V row this thread takes first in dl_attend's item, when it is already in the pool
 * (an earlier position: the current one is stored during phase B). It depends on no other CTA, so
 * it is issued between the A -> B barrier's arrival and its wait: the pool's latency overlaps the
 * barrier's instead of following it. */
template <int HEAD_DIM>
__device__ void dl_attend_ahead(const DlParams &p, const DlLayer &L, int item, DlKvAhead &a) {
    constexpr int TPK = HEAD_DIM / 8;
    a.key = -1;
    if (item >= p.n * p.H * p.splits) return;
    const DlAttnItem it = dl_attn_item(p, item);
    const int g = threadIdx.x / TPK, c = threadIdx.x % TPK, key = it.k_begin + g; /* the first pass's key */
    if (it.seq < 0 || it.s >= it.used || key >= it.k_end || key == it.pos) return;
    const int *table = p.block_tables + (size_t)it.seq * p.max_blocks;
    const size_t off = dl_pool_row(p, table, key) * p.KVH * HEAD_DIM + (size_t)(it.h / p.group) * HEAD_DIM + c * 8;
    a.k = *reinterpret_cast<const uint4 *>(L.k_pool + off);
    a.v = *reinterpret_cast<const uint4 *>(L.v_pool + off);
    a.key = key;
}

/* Phase B for one item (token t, query head h, key split s): rope, K/V store, attention over the
 * split's keys, its partial result to p.part. Keys are read by groups of TPK = Dh / 8 threads (one
 * 16-byte chunk each); each group keeps an online softmax in the log2 domain, as paged_attention's
 * CUDA-core kernel. ahead: the first pass's K/V row if dl_attend_ahead loaded it. */
template <int HEAD_DIM>
__device__ void dl_attend(const DlParams &p, const DlLayer &L, int item, float *smem_f, const DlKvAhead &ahead) {
    constexpr int TPK = HEAD_DIM / 8, GROUPS = DL_THREADS / TPK, HALF = HEAD_DIM / 2;
    const DlAttnItem it = dl_attn_item(p, item);
    const int t = it.t, h = it.h, s = it.s;
    const int kvh = h / p.group, tid = threadIdx.x;
    float *part = p.part + (size_t)item * (HEAD_DIM + 2);
    float *q_s = smem_f, *k_s = q_s + HEAD_DIM, *v_s = k_s + HEAD_DIM; /* [Dh] each */
    float *g_acc = v_s + HEAD_DIM;                                      /* [warps, Dh] */
    float *g_m = g_acc + DL_WARPS * HEAD_DIM, *g_l = g_m + DL_WARPS;    /* [warps] */
    const int seq = it.seq;
    if (seq < 0) return; /* padding: dl_gather_attention writes zeros */
    const int pos = it.pos;
    const bf16 *row = p.qkv + (size_t)t * p.W;
    /* Rope (qkv_rope_store's expressions), rounded to bf16 as stored; q pre-scaled. */
    if (tid < HALF) {
        int j = tid;
        float angle = (float)pos * p.inv_freq[j];
        float c = cosf(angle), sn = sinf(angle);
        const bf16 *qh = row + h * HEAD_DIM, *kh = row + p.QD + kvh * HEAD_DIM, *vh = kh + p.KVH * HEAD_DIM;
        float a = dl_ldcg_bf16(qh + j), b = dl_ldcg_bf16(qh + j + HALF);
        q_s[j] = bf16_round(a * c - b * sn) * p.qk_scale;
        q_s[j + HALF] = bf16_round(b * c + a * sn) * p.qk_scale;
        a = dl_ldcg_bf16(kh + j), b = dl_ldcg_bf16(kh + j + HALF);
        float k0 = bf16_round(a * c - b * sn), k1 = bf16_round(b * c + a * sn);
        k_s[j] = k0, k_s[j + HALF] = k1;
        float v0 = dl_ldcg_bf16(vh + j), v1 = dl_ldcg_bf16(vh + j + HALF);
        v_s[j] = v0, v_s[j + HALF] = v1;
        int slot = p.slot_mapping[t];
        if (h % p.group == 0 && s == 0 && slot >= 0) { /* one writer per (token, KV head) */
            size_t off = (size_t)slot * p.KVH * HEAD_DIM + (size_t)kvh * HEAD_DIM;
            L.k_pool[off + j] = __float2bfloat16_rn(k0), L.k_pool[off + j + HALF] = __float2bfloat16_rn(k1);
            L.v_pool[off + j] = __float2bfloat16_rn(v0), L.v_pool[off + j + HALF] = __float2bfloat16_rn(v1);
        }
    }
    __syncthreads();
    if (s >= it.used) return; /* no keys: dl_gather_attention reads only the used splits */
    const int k_begin = it.k_begin, k_end = it.k_end;
    const int g = tid / TPK, c = tid % TPK;
    float q[8], m = -INFINITY, l = 0.0f, acc[8];
#pragma unroll
    for (int e = 0; e < 8; e++) q[e] = q_s[c * 8 + e], acc[e] = 0.0f;
    const int *table = p.block_tables + (size_t)seq * p.max_blocks;
    const size_t head_off = (size_t)kvh * HEAD_DIM + c * 8, row_stride = (size_t)p.KVH * HEAD_DIM;
    /* The loop bound is the warp's (its first group's key), so every lane takes part in the shuffles. */
    const int warp_first = (tid / 32) * (32 / TPK);
    for (int base = k_begin + warp_first; base < k_end; base += GROUPS) {
        const int key = base + (g - warp_first);
        const bool valid = key < k_end;
        float kf[8], vf[8];
        if (!valid) {
#pragma unroll
            for (int e = 0; e < 8; e++) kf[e] = 0.0f, vf[e] = 0.0f;
        } else if (key == pos) {
#pragma unroll
            for (int e = 0; e < 8; e++) kf[e] = k_s[c * 8 + e], vf[e] = v_s[c * 8 + e];
        } else if (key == ahead.key) {
            unpack8(ahead.k, kf);
            unpack8(ahead.v, vf);
        } else {
            size_t r = dl_pool_row(p, table, key);
            unpack8(*reinterpret_cast<const uint4 *>(L.k_pool + r * row_stride + head_off), kf);
            unpack8(*reinterpret_cast<const uint4 *>(L.v_pool + r * row_stride + head_off), vf);
        }
        float sc = 0.0f;
#pragma unroll
        for (int e = 0; e < 8; e++) sc = fmaf(q[e], kf[e], sc);
#pragma unroll
        for (int o = TPK / 2; o > 0; o >>= 1) sc += __shfl_xor_sync(0xffffffffu, sc, o);
        if (!valid) continue;
        float m_new = fmaxf(m, sc), corr = exp2f(m - m_new), pr = exp2f(sc - m_new);
        l = l * corr + pr;
#pragma unroll
        for (int e = 0; e < 8; e++) acc[e] = fmaf(pr, vf[e], acc[e] * corr);
        m = m_new;
    }
    /* Merge the warp's groups by shuffles, then the warps through shared memory. */
#pragma unroll
    for (int o = TPK; o < 32; o <<= 1) {
        float m_o = __shfl_xor_sync(0xffffffffu, m, o), l_o = __shfl_xor_sync(0xffffffffu, l, o);
        float mx = fmaxf(m, m_o);
        float w1 = m == -INFINITY ? 0.0f : exp2f(m - mx), w2 = m_o == -INFINITY ? 0.0f : exp2f(m_o - mx);
        l = l * w1 + l_o * w2;
#pragma unroll
        for (int e = 0; e < 8; e++) acc[e] = acc[e] * w1 + __shfl_xor_sync(0xffffffffu, acc[e], o) * w2;
        m = mx;
    }
    const int warp = tid / 32, lane = tid % 32;
    if (lane < TPK)
#pragma unroll
        for (int e = 0; e < 8; e++) g_acc[warp * HEAD_DIM + c * 8 + e] = acc[e];
    if (lane == 0) g_m[warp] = m, g_l[warp] = l;
    __syncthreads();
    if (tid < HEAD_DIM) {
        float mx = -INFINITY;
        for (int k = 0; k < DL_WARPS; k++) mx = fmaxf(mx, g_m[k]);
        float o = 0.0f, sum = 0.0f;
        if (mx != -INFINITY)
            for (int k = 0; k < DL_WARPS; k++) {
                float wgt = g_l[k] > 0.0f ? exp2f(g_m[k] - mx) : 0.0f;
                o = fmaf(g_acc[k * HEAD_DIM + tid], wgt, o);
                sum = fmaf(g_l[k], wgt, sum);
            }
        part[tid] = o;
        if (tid == 0) part[HEAD_DIM] = mx, part[HEAD_DIM + 1] = sum;
    }
    __syncthreads();
}

/* act[t, h Dh + d] = bf16 of the merged splits of (t, h) (0 for padding tokens and n <= t < NT).
 * A warp per (t, h): lane s holds split s's max and sum, each lane 2-4 of the head's dims. */
#define DL_GATHER_AHEAD 4 /* splits whose outputs dl_gather_attention loads with their max and sum */
template <int NT, int HEAD_DIM>
__device__ void dl_gather_attention(const DlParams &p, bf16 *act, int stride) {
    constexpr int DPL = HEAD_DIM / 32; /* dims per lane */
    const int S = p.splits, warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    for (int pair = warp; pair < NT * p.H; pair += DL_WARPS) {
        const int t = pair / p.H, h = pair % p.H;
        bf16 *out = act + (size_t)t * stride + h * HEAD_DIM;
        if (t >= p.n || p.seq[t] < 0) {
#pragma unroll
            for (int j = 0; j < DPL; j++) out[lane + 32 * j] = __float2bfloat16_rn(0.0f);
            continue;
        }
        const int used = dl_used_splits(p.pos[t] + 1, S);
        const float *base = p.part + (size_t)(t * p.H + h) * S * (HEAD_DIM + 2);
        float m = lane < used ? __ldcg(base + (size_t)lane * (HEAD_DIM + 2) + HEAD_DIM) : -INFINITY;
        float l = lane < used ? __ldcg(base + (size_t)lane * (HEAD_DIM + 2) + HEAD_DIM + 1) : 0.0f;
        float first[DL_GATHER_AHEAD][DPL]; /* the first splits' outputs, loaded with m and l: one round trip */
#pragma unroll
        for (int sp = 0; sp < DL_GATHER_AHEAD; sp++)
#pragma unroll
            for (int j = 0; j < DPL; j++)
                first[sp][j] = sp < used ? __ldcg(base + (size_t)sp * (HEAD_DIM + 2) + lane + 32 * j) : 0.0f;
        float mx = m;
        for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
        float wgt = l > 0.0f ? exp2f(m - mx) : 0.0f;
        float total = dl_warp_sum(l * wgt);
        float o[DPL];
#pragma unroll
        for (int j = 0; j < DPL; j++) o[j] = 0.0f;
#pragma unroll
        for (int sp = 0; sp < DL_GATHER_AHEAD; sp++) {
            float ws = __shfl_sync(0xffffffffu, wgt, sp);
            if (sp < used)
#pragma unroll
                for (int j = 0; j < DPL; j++) o[j] = fmaf(first[sp][j], ws, o[j]);
        }
#pragma unroll 4
        for (int sp = DL_GATHER_AHEAD; sp < used; sp++) {
            float ws = __shfl_sync(0xffffffffu, wgt, sp);
#pragma unroll
            for (int j = 0; j < DPL; j++) o[j] = fmaf(__ldcg(base + (size_t)sp * (HEAD_DIM + 2) + lane + 32 * j), ws, o[j]);
        }
#pragma unroll
        for (int j = 0; j < DPL; j++) out[lane + 32 * j] = __float2bfloat16_rn(total > 0.0f ? o[j] / total : 0.0f);
    }
    __syncthreads();
}

/* ---------------------------------------------------------------- the kernel */

/* PROF: compiled with COLT_DECODE_PROFILE's counting (p.prof); without it the counting code is not there
 * at all (its untaken branches and the store they guard cost 1-2.5% at one and two tokens on an H200). */
template <int NT, int HEAD_DIM, bool RING, bool PROF>
__global__ void __launch_bounds__(DL_THREADS, 1) decode_layers_kernel(const DlParams p) {
    extern __shared__ __align__(16) unsigned char smem[];
    DlLayer *lay = reinterpret_cast<DlLayer *>(smem);                            /* [n_layers] */
    uint4 *ring = reinterpret_cast<uint4 *>(smem + dl_layers_bytes(p.n_layers)); /* the weight stream */
    bf16 *act = reinterpret_cast<bf16 *>(ring + (size_t)p.ring * DL_ROUND * DL_THREADS); /* [NT, act_stride] */
    float *red = reinterpret_cast<float *>(act + (size_t)NT * p.act_stride);      /* [red_floats] */
    float *attn = red + p.red_floats;                                             /* dl_attend's scratch */
    const int n = p.n, items = n * p.H * p.splits;
    __shared__ DlShare shares[DL_GEMV_PHASES];
    __shared__ float bias_s[DL_MAX_CTA_ROWS];        /* the phase's bias for this CTA's rows */
    __shared__ bf16 x_own[NT][DL_MAX_CTA_ROWS];      /* this CTA's rows of x: only its o and down write them */
    for (int k = threadIdx.x; k < p.n_layers; k += DL_THREADS) lay[k] = p.layers[k];
    dl_cta_shares(p, shares);
    __syncthreads();
    const DlShare xs = shares[1]; /* the o and down projections' rows: the same split of D */
    for (int e = threadIdx.x; e < NT * xs.rows; e += DL_THREADS) {
        int t = e / xs.rows, i = e % xs.rows;
        x_own[t][i] = t < p.n ? p.x[(size_t)t * p.D + xs.r0 + i] : __float2bfloat16_rn(0.0f);
    }
    DlStream s; /* the first p.ring rounds in flight before anything else */
    s.ring = ring, s.shares = shares, s.head = 0, s.layer = 0, s.phase = 0, s.slot = threadIdx.x / 32;
    if (RING) {
        s.g = dl_geom(p, lay[0], shares, 0);
        dl_stream_settle(s, p, lay);
        for (int k = 0; k < p.ring; k++) dl_stream_issue<NT == 1>(s, p, lay, k);
    }
    unsigned barriers = 0;
    DlProf pf{PROF && p.prof && blockIdx.x == 0 && threadIdx.x == 0 ? p.prof : NULL, clock64(),
              PROF && p.prof_cta && threadIdx.x == 0 ? p.prof_cta + 2 * blockIdx.x : NULL, 0};
    auto barrier = [&](int phase, auto &&while_waiting) { /* while_waiting: work that needs no other CTA */
        pf.mark(DL_PROF_PARTS * phase + 2);
        grid_barrier_arrive(p.barrier);
        while_waiting();
        grid_barrier_wait(p.barrier, ++barriers * gridDim.x);
        pf.mark(DL_PROF_PARTS * phase + 3);
    };
    auto nothing = [] {};

    for (int l = 0; l < p.n_layers; l++) {
        const DlLayer &L = lay[l];
        /* A: q|k|v (the bias read while the norm runs) */
        const int qr0 = shares[0].r0, tid = threadIdx.x;
        float bias = L.qkv_b && tid < shares[0].rows ? __bfloat162float(L.qkv_b[qr0 + tid]) : 0.0f;
        dl_norm<NT>(act, p.act_stride, p.x, L.attn_norm, n, p.D, p.eps);
        if (tid < shares[0].rows) bias_s[tid] = bias; /* dl_gemv synchronises before its epilogue */
        dl_gemv<NT, false, RING>(dl_geom(p, L, shares, 0), s, p, lay, act, p.act_stride, n, red, pf, 0,
                           [&](int r, int t, float acc, float) {
                               p.qkv[(size_t)t * p.W + r] = __float2bfloat16_rn(acc + bias_s[r - qr0]);
                           });
        DlKvAhead ahead; /* direct loads: no registers to spare across the wait (140 bytes of spills) */
        ahead.key = -1;
        barrier(0, [&] {
            if (RING) dl_attend_ahead<HEAD_DIM>(p, L, blockIdx.x, ahead);
        });
        /* B: rope, K/V store, attention */
        for (int item = blockIdx.x; item < items; item += gridDim.x) {
            if (item != blockIdx.x) ahead.key = -1;
            dl_attend<HEAD_DIM>(p, L, item, attn, ahead);
        }
        pf.mark(DL_PROF_PARTS * 1);
        barrier(1, nothing);
        /* C: x += att Wo^T (+ b) */
        bias = L.o_b && tid < xs.rows ? __bfloat162float(L.o_b[xs.r0 + tid]) : 0.0f;
        dl_gather_attention<NT, HEAD_DIM>(p, act, p.act_stride);
        if (tid < xs.rows) bias_s[tid] = bias;
        dl_gemv<NT, false, RING>(dl_geom(p, L, shares, 1), s, p, lay, act, p.act_stride, n, red, pf, 2, [&](int r, int t, float acc, float) {
            const int i = r - xs.r0;
            bf16 sum = __float2bfloat16_rn(__bfloat162float(x_own[t][i]) + bf16_round(acc + bias_s[i]));
            x_own[t][i] = sum, p.x[(size_t)t * p.D + r] = sum;
        });
        barrier(2, nothing);
        /* D: h = silu(gate) * up */
        dl_norm<NT>(act, p.act_stride, p.x, L.mlp_norm, n, p.D, p.eps);
        dl_gemv<NT, true, RING>(dl_geom(p, L, shares, 2), s, p, lay, act, p.act_stride, n, red, pf, 3,
                          [&](int r, int t, float g, float u) {
                              g = bf16_round(g), u = bf16_round(u);
                              p.h[(size_t)t * p.F + r] = __float2bfloat16_rn(g / (1.0f + expf(-g)) * u);
                          });
        barrier(3, nothing);
        /* E: x += h Wd^T */
        for (int e = threadIdx.x; e < NT * (p.F / 8); e += DL_THREADS) {
            int t = e / (p.F / 8), v = e % (p.F / 8);
            uint4 val = t < n ? dl_load_shared_act(p.h + (size_t)t * p.F + v * 8) : make_uint4(0, 0, 0, 0);
            *reinterpret_cast<uint4 *>(act + (size_t)t * p.act_stride + v * 8) = val;
        }
        __syncthreads();
        dl_gemv<NT, false, RING>(dl_geom(p, L, shares, 3), s, p, lay, act, p.act_stride, n, red, pf, 4, [&](int r, int t, float acc, float) {
            const int i = r - xs.r0;
            bf16 sum = __float2bfloat16_rn(__bfloat162float(x_own[t][i]) + bf16_round(acc));
            x_own[t][i] = sum, p.x[(size_t)t * p.D + r] = sum;
        });
        if (l + 1 < p.n_layers) barrier(4, nothing);
        else pf.mark(DL_PROF_PARTS * 4 + 2);
    }
    if (pf.slots) pf.slots[DL_PROF_LAUNCHES]++;
}

/* ---------------------------------------------------------------- host side */

struct DecodePlanCuda {
    CudaState *cs;       /* the instance that made it: its device, its stream */
    DlParams p;          /* everything but the per-call fields */
    DlLayer *d_layers;
    float *d_inv_freq, *d_part;
    bf16 *d_qkv, *d_h;
    unsigned *d_barrier;
    unsigned long long *d_prof, *d_prof_cta; /* COLT_DECODE_PROFILE=1 */
    int max_tokens, grid;
    int ring[3];           /* per NT = 1, 2, 4: the weight stream's rounds, 0 = direct loads */
    size_t smem_fixed[3];  /* per NT: shared memory beside the ring */
};

/* Up to this many tokens a call takes the kernel (the option decode_layers_tokens, COLT_DECODE_LAYERS=k,
 * overrides; 0 = never). Measured
 * on an H200 (bench_decode, Qwen2.5 0.5B / 1.5B / 7B shapes): faster than the op sequence at 1 and 2
 * tokens (+49% / +45% / +16% at 1), mixed at 3 (+3% / -2% / -8%) and slower at 4 (-5% / -13% / -12%),
 * where its fp32 dot products on CUDA cores and the per-token attention items cost more than the ops'
 * tensor-core GEMMs save. */
#define DL_DEFAULT_TOKENS 2

static int decode_layers_tokens(const CudaState *cs) {
    return cs->opt.decode_layers_tokens < 0 ? DL_DEFAULT_TOKENS : cs->opt.decode_layers_tokens;
}

/* For tests and benchmarks, on the instance be: calls of up to `tokens` tokens take the kernel (0: none,
 * the op sequence); -1 back to the instance's setting at open (COLT_DECODE_LAYERS / the default). */
extern "C" void cuda_decode_layers_set_tokens(const Backend *be, int tokens) {
    CudaState *cs = cuda_state(be);
    cs->opt.decode_layers_tokens = tokens < 0 ? cs->opt_env.decode_layers_tokens : tokens;
}
/* The instance's launches so far (host calls, not graph replays). */
extern "C" long cuda_decode_layers_calls(const Backend *be) { return cuda_state(be)->decode_layers_calls; }

template <int NT, int HD> static void *dl_kernel(bool ring, bool prof) {
    if (prof) return ring ? (void *)decode_layers_kernel<NT, HD, true, true> : (void *)decode_layers_kernel<NT, HD, false, true>;
    return ring ? (void *)decode_layers_kernel<NT, HD, true, false> : (void *)decode_layers_kernel<NT, HD, false, false>;
}

static void *dl_kernel_for(int nt, int head_dim, bool ring, bool prof = false) {
    if (head_dim == 64)
        return nt == 1 ? dl_kernel<1, 64>(ring, prof) : nt == 2 ? dl_kernel<2, 64>(ring, prof) : dl_kernel<4, 64>(ring, prof);
    return nt == 1 ? dl_kernel<1, 128>(ring, prof) : nt == 2 ? dl_kernel<2, 128>(ring, prof) : dl_kernel<4, 128>(ring, prof);
}

static int dl_nt_index(int nt) { return nt == 1 ? 0 : nt == 2 ? 1 : 2; }

static void dl_pick_rings(DecodePlanCuda *plan);

/* The dynamic shared memory a CTA of `kernel` may take: the device's opt-in maximum less the kernel's
 * static arrays (a ring sized against the maximum alone failed to launch: COLT_DECODE_RING=3 on 1.5B). */
static size_t dl_dynamic_shared_limit(const CudaState *cs, void *kernel) {
    int optin = 0;
    CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, cs->device));
    cudaFuncAttributes attr;
    CUDA_CHECK(cudaFuncGetAttributes(&attr, kernel));
    return (size_t)optin > attr.sharedSizeBytes ? (size_t)optin - attr.sharedSizeBytes : 0;
}

void *cuda_decode_layers_create(const Backend *be, const DecodeLayerWeights *layers, const DecodeDims *dims) {
    CudaState *cs = cuda_enter_checked(be);
    const DecodeDims *d = dims;
    int D = d->hidden, F = d->intermediate, H = d->n_heads, KVH = d->n_kv_heads, Dh = d->head_dim;
    if (decode_layers_tokens(cs) == 0) return NULL;
    if (d->n_layers <= 0 || (Dh != 64 && Dh != 128) || H <= 0 || KVH <= 0 || H % KVH || D % 8 || F % 8 ||
        (d->block_size & (d->block_size - 1)) || d->block_size <= 0 || d->max_blocks <= 0)
        return NULL;
    for (int l = 0; l < d->n_layers; l++) {
        const DecodeLayerWeights *w = &layers[l];
        const void *ptrs[] = {w->attn_norm, w->qkv_w, w->o_w, w->mlp_norm, w->gate_up_w, w->down_w, w->k_pool, w->v_pool};
        for (size_t k = 0; k < sizeof ptrs / sizeof ptrs[0]; k++)
            if (!ptrs[k] || !aligned16(ptrs[k])) return NULL;
    }
    DecodePlanCuda *plan = (DecodePlanCuda *)calloc(1, sizeof(DecodePlanCuda));
    DlParams &p = plan->p;
    plan->cs = cs;
    int QD = H * Dh, W = QD + 2 * KVH * Dh;
    plan->grid = cs->sm_count;
    p.n_layers = d->n_layers, p.D = D, p.F = F, p.H = H, p.KVH = KVH, p.Dh = Dh, p.W = W, p.QD = QD;
    p.group = H / KVH;
    p.block_shift = 0;
    while ((1 << p.block_shift) < d->block_size) p.block_shift++;
    p.max_blocks = d->max_blocks;
    p.splits = plan->grid / H;
    if (p.splits < 1) p.splits = 1;
    if (p.splits > DL_MAX_SPLITS) p.splits = DL_MAX_SPLITS;
    p.eps = d->rms_eps;
    p.qk_scale = (float)(1.4426950408889634 / sqrt((double)Dh));
    int kmax = D > F ? D : F;
    if (QD > kmax) kmax = QD;
    p.act_stride = kmax + 8; /* a 16-byte pad between token rows */
    /* red: the most slots (rows x ks) any CTA has in any projection, x NT x 2 floats */
    int slots_max = 0, row_counts[DL_GEMV_PHASES] = {W, D, F, D}, ks_of[DL_GEMV_PHASES] = {D, QD, D, F};
    for (int ph = 0; ph < DL_GEMV_PHASES; ph++)
        for (int cta = 0; cta < plan->grid; cta++) {
            int r0, r1;
            dl_slice_of(row_counts[ph], cta, plan->grid, &r0, &r1);
            int slots = (r1 - r0) * dl_pick_ks(r1 - r0, ks_of[ph] / 8, ph == 2 ? DL_ROUND / 2 : DL_ROUND);
            if (slots > slots_max) slots_max = slots;
        }
    p.red_floats = slots_max * DL_MAX_TOKENS * 2;
    if ((W + plan->grid - 1) / plan->grid > DL_MAX_CTA_ROWS || (D + plan->grid - 1) / plan->grid > DL_MAX_CTA_ROWS) {
        free(plan);
        return NULL;
    }
    size_t attn_floats = 3 * (size_t)Dh + (size_t)DL_WARPS * Dh + 2 * (size_t)DL_WARPS;
    /* Per NT: the kernel with the largest ring that fits (the option decode_ring caps it; 0 = direct loads). */
    const bool ring_forced = cs->opt.decode_ring >= 0;
    int ring_cap = ring_forced ? cs->opt.decode_ring : DL_RING_DEFAULT;
    ring_cap = ring_cap < 0 ? 0 : ring_cap > DL_RING_MAX ? DL_RING_MAX : ring_cap;
    plan->max_tokens = 0;
    for (int nt = 1; nt <= DL_MAX_TOKENS; nt *= 2) {
        const size_t fixed = dl_layers_bytes(d->n_layers) + (size_t)nt * p.act_stride * 2 + (size_t)p.red_floats * 4 +
                             attn_floats * 4;
        int ring = ring_cap;
        const size_t limit_ring = dl_dynamic_shared_limit(cs, dl_kernel_for(nt, Dh, true));
        while (ring > 0 && fixed + (size_t)ring * DL_ROUND_BYTES > limit_ring) ring--;
        if (fixed > dl_dynamic_shared_limit(cs, dl_kernel_for(nt, Dh, false))) break;
        bool resident = true; /* a cooperative launch needs every CTA resident: one per SM */
        for (int with_ring = 0; with_ring < 2; with_ring++)
            for (int prof = 0; prof < 2; prof++) {
                void *kernel = dl_kernel_for(nt, Dh, with_ring, prof);
                size_t bytes = fixed + (with_ring ? (size_t)ring * DL_ROUND_BYTES : 0);
                CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes));
                int blocks = 0;
                CUDA_CHECK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, kernel, DL_THREADS, bytes));
                if (blocks < 1) resident = false;
            }
        if (!resident) break;
        plan->ring[dl_nt_index(nt)] = ring;
        plan->smem_fixed[dl_nt_index(nt)] = fixed;
        plan->max_tokens = nt;
    }
    if (plan->max_tokens == 0) {
        free(plan);
        return NULL;
    }
    /* Per-layer pointers, the model's rope table (what the rope ops take), scratch. */
    DlLayer *host = (DlLayer *)calloc((size_t)d->n_layers, sizeof(DlLayer));
    for (int l = 0; l < d->n_layers; l++) {
        const DecodeLayerWeights *w = &layers[l];
        host[l] = DlLayer{(const bf16 *)w->attn_norm, (const bf16 *)w->qkv_w,    (const bf16 *)w->qkv_b,
                          (const bf16 *)w->o_w,       (const bf16 *)w->o_b,      (const bf16 *)w->mlp_norm,
                          (const bf16 *)w->gate_up_w, (const bf16 *)w->down_w,   (bf16 *)w->k_pool,
                          (bf16 *)w->v_pool};
    }
    int mt = plan->max_tokens;
    CUDA_CHECK(cudaMalloc(&plan->d_layers, sizeof(DlLayer) * d->n_layers));
    CUDA_CHECK(cudaMalloc(&plan->d_inv_freq, sizeof(float) * Dh / 2));
    CUDA_CHECK(cudaMalloc(&plan->d_part, sizeof(float) * (size_t)mt * H * p.splits * (Dh + 2)));
    CUDA_CHECK(cudaMalloc(&plan->d_qkv, sizeof(bf16) * (size_t)mt * W));
    CUDA_CHECK(cudaMalloc(&plan->d_h, sizeof(bf16) * (size_t)mt * F));
    CUDA_CHECK(cudaMalloc(&plan->d_barrier, sizeof(unsigned)));
    CUDA_CHECK(cudaMemcpy(plan->d_layers, host, sizeof(DlLayer) * d->n_layers, cudaMemcpyHostToDevice));
    CUDA_CHECK(cudaMemcpy(plan->d_inv_freq, d->rope_inv_freq, sizeof(float) * Dh / 2, cudaMemcpyHostToDevice));
    free(host);
    const bool profile = cs->opt.decode_profile != 0;
    if (profile) {
        CUDA_CHECK(cudaMalloc(&plan->d_prof, sizeof(unsigned long long) * DL_PROF_SLOTS));
        CUDA_CHECK(cudaMemset(plan->d_prof, 0, sizeof(unsigned long long) * DL_PROF_SLOTS));
        CUDA_CHECK(cudaMalloc(&plan->d_prof_cta, sizeof(unsigned long long) * 2 * plan->grid));
        CUDA_CHECK(cudaMemset(plan->d_prof_cta, 0, sizeof(unsigned long long) * 2 * plan->grid));
    }
    p.prof = plan->d_prof, p.prof_cta = plan->d_prof_cta;
    p.layers = plan->d_layers, p.inv_freq = plan->d_inv_freq, p.part = plan->d_part;
    p.qkv = plan->d_qkv, p.h = plan->d_h, p.barrier = plan->d_barrier;
    if (!ring_forced) dl_pick_rings(plan);
    if (profile)
        fprintf(stderr, "decode_layers: ring rounds per NT 1/2/4: %d %d %d\n", plan->ring[0], plan->ring[1], plan->ring[2]);
    return plan;
}

/* A CTA and its gate|up + down cycles, for sorting slowest first. */
struct DlCtaTotal {
    int cta;
    unsigned long long cycles;
};
static int dl_slowest_first(const void *a, const void *b) {
    const unsigned long long x = ((const DlCtaTotal *)a)->cycles, y = ((const DlCtaTotal *)b)->cycles;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* COLT_DECODE_PROFILE: how evenly the CTAs' equal shares of gate|up and down take (us per launch),
 * the slowest and the fastest CTAs by their total. */
static void dl_print_cta_profile(const unsigned long long *d_cta, int grid, double per) {
    unsigned long long *c = (unsigned long long *)malloc(sizeof(unsigned long long) * 2 * grid);
    DlCtaTotal *order = (DlCtaTotal *)malloc(sizeof(DlCtaTotal) * grid);
    if (!c || !order) {
        free(c);
        free(order);
        return;
    }
    CUDA_CHECK(cudaMemcpy(c, d_cta, sizeof(unsigned long long) * 2 * grid, cudaMemcpyDeviceToHost));
    static const char *names[2] = {"gate|up", "down"};
    for (int k = 0; k < 2; k++) {
        double lo = 1e30, hi = 0, sum = 0;
        for (int i = 0; i < grid; i++) {
            double v = c[2 * i + k] * per;
            lo = v < lo ? v : lo, hi = v > hi ? v : hi, sum += v;
        }
        fprintf(stderr, "decode_layers per-CTA %s dot products (us per launch): mean %.1f, min %.1f, max %.1f\n", names[k],
                sum / grid, lo, hi);
    }
    for (int i = 0; i < grid; i++) order[i] = DlCtaTotal{i, c[2 * i] + c[2 * i + 1]};
    qsort(order, (size_t)grid, sizeof *order, dl_slowest_first);
    fprintf(stderr, "decode_layers per-CTA gate|up + down, slowest:");
    for (int i = 0; i < 12 && i < grid; i++) fprintf(stderr, " %d:%.0f", order[i].cta, order[i].cycles * per);
    fprintf(stderr, "; fastest:");
    for (int i = grid - 12 > 0 ? grid - 12 : 0; i < grid; i++) fprintf(stderr, " %d:%.0f", order[i].cta, order[i].cycles * per);
    fprintf(stderr, "\n");
    free(c);
    free(order);
}

void cuda_decode_layers_free(const Backend *be, void *handle) {
    DecodePlanCuda *plan = (DecodePlanCuda *)handle;
    if (!plan) return;
    CudaState *cs = cuda_enter_checked(be);
    CUDA_ASSERT_HOST(plan->cs == cs); /* freed by the instance that made it */
    CUDA_CHECK(cudaStreamSynchronize(cs->stream)); /* a launch may still read them */
    if (plan->d_prof) { /* where CTA 0's time went, per launch */
        unsigned long long c[DL_PROF_SLOTS];
        CUDA_CHECK(cudaMemcpy(c, plan->d_prof, sizeof c, cudaMemcpyDeviceToHost));
        int khz = 0;
        CUDA_CHECK(cudaDeviceGetAttribute(&khz, cudaDevAttrClockRate, cs->device));
        const unsigned long long launches = c[DL_PROF_LAUNCHES];
        double per = launches ? 1e3 / ((double)khz * launches) : 0; /* cycles -> us per launch */
        static const char *names[DL_PHASES] = {"A qkv", "B attention", "C o-proj", "D gate|up", "E down"};
        fprintf(stderr, "decode_layers profile (%llu launches, CTA 0 thread 0, us per launch: before the dot products"
                " / dot products / reduction + epilogue / barrier):", launches);
        for (int k = 0; k < DL_PHASES; k++) {
            const unsigned long long *q = c + DL_PROF_PARTS * k;
            fprintf(stderr, " %s %.1f / %.1f / %.1f / %.1f;", names[k], q[0] * per, q[1] * per, q[2] * per, q[3] * per);
        }
        fprintf(stderr, " waiting on the weight ring %.1f\n", c[DL_PROF_STALL] * per);
        CUDA_CHECK(cudaFree(plan->d_prof));
        dl_print_cta_profile(plan->d_prof_cta, plan->grid, per);
        CUDA_CHECK(cudaFree(plan->d_prof_cta));
    }
    void *bufs[] = {plan->d_layers, plan->d_inv_freq, plan->d_part, plan->d_qkv, plan->d_h, plan->d_barrier};
    for (size_t k = 0; k < sizeof bufs / sizeof bufs[0]; k++) CUDA_CHECK(cudaFree(bufs[k]));
    free(plan);
}

static void dl_launch(DecodePlanCuda *plan, int nt, int ring, void *x, const void *pos, const void *seq,
                      const void *slot_mapping, const void *block_tables, int n) {
    CudaState *cs = plan->cs;
    DlParams p = plan->p;
    p.ring = ring;
    p.n = n;
    p.x = (bf16 *)x;
    p.pos = (const int *)pos, p.seq = (const int *)seq, p.slot_mapping = (const int *)slot_mapping;
    p.block_tables = (const int *)block_tables;
    cudaStream_t st = cs->stream;
    CUDA_CHECK(cudaMemsetAsync(plan->d_barrier, 0, sizeof(unsigned), st));
    void *args[] = {&p};
    void *kernel = dl_kernel_for(nt, p.Dh, ring > 0, p.prof != NULL);
    CUDA_CHECK(cudaLaunchCooperativeKernel(kernel, dim3(plan->grid), dim3(DL_THREADS), args,
                                           plan->smem_fixed[dl_nt_index(nt)] + (size_t)ring * DL_ROUND_BYTES, st));
    LAUNCH_CHECK(cs);
}

/* The picks so far, by shape, are the instance's (CudaState.decode_picks): a plan is made per
 * engine_generate call (every GRPO step), the timing once per shape and instance. */

/* Per NT with a ring: keeps it only if a launch with it is faster than with direct loads (the bits are
 * the same either way: only where the weights wait differs). Timed on padding tokens (no K/V stored,
 * no attention), the weights read as in a real step; best of 3 launches each, after a warm-up. */
static void dl_pick_rings(DecodePlanCuda *plan) {
    CudaState *cs = plan->cs;
    const DlParams &q = plan->p;
    const int key[8] = {q.n_layers, q.D, q.F, q.H, q.KVH, q.Dh, plan->grid, plan->max_tokens};
    for (int k = 0; k < cs->n_decode_picks; k++)
        if (!memcmp(cs->decode_picks[k].key, key, sizeof key)) {
            memcpy(plan->ring, cs->decode_picks[k].ring, sizeof plan->ring);
            return;
        }
    const int D = plan->p.D;
    bf16 *x;
    int *ints; /* pos 0, seq -1, slot -1 per token */
    int host[3 * DL_MAX_TOKENS];
    for (int k = 0; k < DL_MAX_TOKENS; k++) host[k] = 0, host[DL_MAX_TOKENS + k] = -1, host[2 * DL_MAX_TOKENS + k] = -1;
    CUDA_CHECK(cudaMalloc(&x, sizeof(bf16) * (size_t)DL_MAX_TOKENS * D));
    CUDA_CHECK(cudaMalloc(&ints, sizeof host));
    CUDA_CHECK(cudaMemcpy(ints, host, sizeof host, cudaMemcpyHostToDevice));
    cudaEvent_t e0, e1;
    CUDA_CHECK(cudaEventCreate(&e0));
    CUDA_CHECK(cudaEventCreate(&e1));
    cudaStream_t st = cs->stream;
    unsigned long long *prof = plan->p.prof;
    plan->p.prof = NULL; /* COLT_DECODE_PROFILE counts real steps only */
    for (int nt = 1; nt <= plan->max_tokens; nt *= 2) {
        const int idx = dl_nt_index(nt), ring = plan->ring[idx];
        if (ring == 0) continue;
        float best[2] = {1e30f, 1e30f};
        for (int rep = 0; rep < 4; rep++)
            for (int mode = 0; mode < 2; mode++) {
                CUDA_CHECK(cudaMemsetAsync(x, 0, sizeof(bf16) * (size_t)nt * D, st));
                CUDA_CHECK(cudaEventRecord(e0, st));
                dl_launch(plan, nt, mode ? ring : 0, x, ints, ints + DL_MAX_TOKENS, ints + 2 * DL_MAX_TOKENS, ints, nt);
                CUDA_CHECK(cudaEventRecord(e1, st));
                CUDA_CHECK(cudaEventSynchronize(e1));
                float ms = 0;
                CUDA_CHECK(cudaEventElapsedTime(&ms, e0, e1));
                if (rep > 0 && ms < best[mode]) best[mode] = ms;
            }
        if (best[0] < best[1]) plan->ring[idx] = 0;
    }
    plan->p.prof = prof;
    CUDA_CHECK(cudaEventDestroy(e0));
    CUDA_CHECK(cudaEventDestroy(e1));
    CUDA_CHECK(cudaFree(x));
    CUDA_CHECK(cudaFree(ints));
    if (cs->n_decode_picks < CUDA_DECODE_PICKS) {
        memcpy(cs->decode_picks[cs->n_decode_picks].key, key, sizeof key);
        memcpy(cs->decode_picks[cs->n_decode_picks].ring, plan->ring, sizeof plan->ring);
        cs->n_decode_picks++;
    }
}

bool cuda_decode_layers(const Backend *be, void *handle, void *x, const void *pos, const void *seq,
                        const void *slot_mapping, const void *block_tables, int n) {
    DecodePlanCuda *plan = (DecodePlanCuda *)handle;
    if (!plan) return false;
    CudaState *cs = cuda_enter(be);
    CUDA_ASSERT_HOST(plan->cs == cs); /* run by the instance that made it */
    if (n <= 0 || n > plan->max_tokens || n > decode_layers_tokens(cs) || cuda_batch_invariant(cs) ||
        cuda_attention_invariant(cs))
        return false;
    int nt = n <= 1 ? 1 : n <= 2 ? 2 : 4;
    dl_launch(plan, nt, plan->ring[dl_nt_index(nt)], x, pos, seq, slot_mapping, block_tables, n);
    cs->decode_layers_calls++;
    return true;
}
