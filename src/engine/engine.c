/* engine.c — see engine.h. An Engine holds the KV pool, the prefix cache,
 * the step buffers and the CUDA graphs while awake, and the requests (queued
 * and running) for its whole life; engine_generate makes one for one call.
 *
 * Step layout: the host schedules, writes the step's index arrays into one
 * host buffer and uploads it with one copy; the device runs the forward and
 * the sampler; the sampled tokens and log-probs come back with one
 * synchronisation. Pure decode steps (one token per running sequence) are
 * padded to a bucket size and their forward replayed from a CUDA graph
 * captured the second time that bucket is seen (the first run is the warm-up
 * that sizes every lazily allocated buffer). The sampler runs after the graph,
 * once per group of rows with equal sampling settings: a graph records its
 * kernels' arguments, and the settings differ from request to request. */
#include "engine/engine.h"

#include <stdlib.h>
#include <string.h>

#include "core/error.h"
#include "core/log.h"

#define DEFAULT_BLOCK_SIZE 16
#define DEFAULT_MAX_NUM_SEQS 256
#define DEFAULT_MAX_BATCHED_TOKENS 4096
/* Device memory left free beside the pool: cuBLAS, graphs, allocator slack. */
#define DEVICE_HEADROOM_BYTES ((size_t)2 << 30)
#define MAX_STREAM_ID 0x7fffffffu /* streams travel to the sampler as i32 */

/* Decode batch sizes with a CUDA graph: a step of n sequences runs the graph
 * of the smallest bucket >= n, padding rows marked seq = -1. */
static const int GRAPH_BUCKETS[] = {1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128,
                                    160, 192, 224, 256, 320, 384, 448, 512};
#define N_BUCKETS ((int)(sizeof(GRAPH_BUCKETS) / sizeof(GRAPH_BUCKETS[0])))

/* The step buffer holds these arrays, each n_pad ints long, in this order. */
enum { SEG_TOKENS, SEG_POS, SEG_SEQ, SEG_SLOT_MAPPING, SEG_LOGIT_ROWS, SEG_ROW_SEQ, SEG_STREAMS, SEG_COUNTERS,
       N_SEGMENTS };

enum { SEQ_FREE, SEQ_WAITING, SEQ_RUNNING };

/* One request: a sequence with its own settings. */
typedef struct Seq {
    GenSequence *g;     /* the caller's */
    uint64_t id;
    GenerateOptions opt; /* the caller's, stop_ids pointing at stop */
    int *stop;
    int *bias_ids;      /* its logit bias (opt's, copied), or NULL */
    float *bias_values;
    int state;
    int limit;          /* total length (prompt + completion) at which it stops */
    int slot;           /* its block-table row while running, else -1 */
    int n_blocks;       /* blocks in its table row */
    int n_cached;       /* leading tokens whose K/V are in the pool */
    int n_registered;   /* leading blocks of its row offered to the prefix cache */
    int scheduled;      /* tokens it runs in the current step */
    int group;          /* its sampling group in the current step */
} Seq;

/* The prefix cache: every full block a sequence computes is registered under
 * its content, so a later sequence whose tokens start the same way takes the
 * block instead of recomputing it (vLLM's automatic prefix caching). A block's
 * key is (its parent block, the parent's generation, its block_size tokens);
 * the parent stands for the whole prefix before it, so keys are exact (the
 * 64-bit hash only picks the bucket). A block's generation changes each time
 * it leaves the cache, so keys naming an evicted parent never match again.
 * Registered blocks that no sequence holds wait in LRU order and are taken
 * for new blocks only when no never-registered block is free. */
typedef struct PrefixCache {
    bool on;
    int *tokens;       /* [n_blocks, block_size]: a registered block's tokens */
    int *parent;       /* its parent block (-1: it starts the sequence) */
    unsigned *parent_gen, *gen;
    bool *registered;
    int *bucket, *chain; /* bucket[hash & mask] -> first block, chain[b] -> next */
    uint64_t mask;
    int *lru_prev, *lru_next, lru_head, lru_tail, n_lru; /* registered, held by nobody */
    int *scratch;      /* [block_size]: one block's tokens being looked up */
} PrefixCache;

/* A queue of request indices; preempted requests go back to the front. */
typedef struct IndexQueue {
    int *items;
    int cap, head, count;
} IndexQueue;

struct Engine {
    Model *m;
    const Backend *be;
    const ModelConfig *cfg;
    EngineOptions eo;
    bool use_graphs;    /* decode steps replay CUDA graphs */
    bool deterministic; /* EngineOptions.deterministic: log-probs by log_softmax_target */
    int block_size, max_blocks, max_len, n_slots, max_tokens, max_rows;

    /* Held while awake: device memory and what is sized by the pool. */
    bool awake;
    uint64_t weights_version; /* the model's, when the pool's K/V and the cache were made */
    uint64_t layout_version;  /* the model's weights layout, when the graphs and the decode plan were made */
    uint64_t buffers_epoch;   /* the backend's buffers_epoch when the graphs were recorded */
    KvPool pool;
    void *decode_plan;  /* model_decode_plan_create: all layers of a decode step in one launch */
    PagedState *st;
    int *free_blocks, n_free, *refcount;
    PrefixCache cache;
    void *d_tables;
    void *d_hist, *d_hist_len;   /* [n_slots, max_len], [n_slots]: the penalties' histories */
    void *d_prompt_len;          /* [n_slots]: how much of each history is the prompt (vLLM's penalties) */
    bool history_wanted;         /* a request with a penalty was added: keep d_hist */
    void *d_bias_ids, *d_bias_values, *d_bias_len; /* [n_slots, MAX_LOGIT_BIAS] x2, [n_slots]: logit biases */
    bool bias_wanted;            /* a request with a logit bias was added: keep d_bias_* */
    void *d_step;
    void *d_sampled;             /* sampler outputs: tokens [max_rows], then log-probs [max_rows] */
    void *d_tokens, *d_logprobs; /* its two halves */
    void *d_logits_kept;         /* deterministic: [max_rows, V] logits before the sampler clobbers them */
    void *d_mask;                /* [max_rows, mask_words] structured outputs' allowed tokens (mask_wanted) */
    void *graphs[N_BUCKETS];
    bool bucket_seen[N_BUCKETS];

    /* For the engine's life. */
    int *h_tables;      /* [n_slots, table_width] (room for max_blocks) */
    int table_width;    /* blocks per table row now: the most a sequence has had, rounded up to a power of two */
    bool tables_dirty;
    int *free_slots, n_free_slots;
    int *h_step;        /* [N_SEGMENTS * max_tokens] */
    int *h_sampled, *h_tokens, *row_owner; /* h_sampled: d_sampled's host copy; h_tokens its first half */
    float *h_logprobs;                     /* and its second */
    bool mask_wanted;   /* a request with a regex was added: keep d_mask */
    int mask_words;     /* (V + 31) / 32 */
    uint32_t *h_mask;   /* [max_rows, mask_words] */
    float *h_sampled_lp; /* [max_rows] the sampler's log-probs, kept while the policy's are computed */
    Seq *seqs;          /* [seqs_cap]; SEQ_FREE entries are reused */
    int seqs_cap, n_live;
    int *running, n_running; /* admission order: the last one is preempted first */
    int *order;         /* [n_slots] the running sequences grouped by sampling settings (the step's layout) */
    IndexQueue waiting;
    SamplingParams *group_params; /* [n_slots] the step's distinct sampling settings */
    bool *group_bias;             /* [n_slots] whether the group's requests have a logit bias */
    int *group_rows, n_groups;    /* rows of each group */
    EngineEvent *events;
    int n_events, events_cap;
    bool events_delivered;        /* engine_step returned them: the next call starts a new list */
    EngineStats stats;
};

static int min_int(int a, int b) { return a < b ? a : b; }
static int div_up(int a, int b) { return (a + b - 1) / b; }

static int known_tokens(const Seq *s) { return s->g->prompt_len + s->g->n_tokens; }
static int token_at(const Seq *s, int p) {
    return p < s->g->prompt_len ? s->g->prompt[p] : s->g->tokens[p - s->g->prompt_len];
}

/* ---------------------------------------------------------------- the waiting queue */

static void queue_grow(IndexQueue *q) {
    int cap = q->cap ? 2 * q->cap : 16, *items = xmalloc(sizeof(int) * (size_t)cap);
    for (int k = 0; k < q->count; k++) items[k] = q->items[(q->head + k) % q->cap];
    free(q->items);
    q->items = items;
    q->cap = cap;
    q->head = 0;
}

static void queue_push_back(IndexQueue *q, int v) {
    if (q->count == q->cap) queue_grow(q);
    q->items[(q->head + q->count++) % q->cap] = v;
}

static void queue_push_front(IndexQueue *q, int v) {
    if (q->count == q->cap) queue_grow(q);
    q->head = (q->head + q->cap - 1) % q->cap;
    q->items[q->head] = v;
    q->count++;
}

static int queue_front(const IndexQueue *q) { return q->items[q->head]; }

static void queue_pop_front(IndexQueue *q) {
    q->head = (q->head + 1) % q->cap;
    q->count--;
}

static void queue_remove(IndexQueue *q, int v) {
    int w = 0;
    for (int k = 0; k < q->count; k++) {
        int x = q->items[(q->head + k) % q->cap];
        if (x != v) q->items[(q->head + w++) % q->cap] = x;
    }
    q->count = w;
}

/* ---------------------------------------------------------------- blocks, the prefix cache and slots */

static uint64_t mix64(uint64_t h, uint64_t v) { /* splitmix64's finaliser over h ^ v */
    uint64_t z = h ^ (v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2));
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static uint64_t cache_hash(int parent, unsigned parent_gen, const int *tokens, int block_size) {
    uint64_t h = mix64((uint64_t)(uint32_t)parent, parent_gen);
    for (int j = 0; j < block_size; j++) h = mix64(h, (uint32_t)tokens[j]);
    return h;
}

/* The registered block holding `tokens` after `parent` (-1: at the start), or -1; *slot gets their bucket. */
static int cache_find(const Engine *e, int parent, const int *tokens, uint64_t *slot) {
    const PrefixCache *c = &e->cache;
    unsigned pgen = parent >= 0 ? c->gen[parent] : 0;
    *slot = cache_hash(parent, pgen, tokens, e->block_size) & c->mask;
    for (int b = c->bucket[*slot]; b >= 0; b = c->chain[b])
        if (c->parent[b] == parent && c->parent_gen[b] == pgen &&
            memcmp(c->tokens + (size_t)b * e->block_size, tokens, sizeof(int) * (size_t)e->block_size) == 0)
            return b;
    return -1;
}

static int cache_lookup(const Engine *e, int parent, const int *tokens) {
    uint64_t slot;
    return cache_find(e, parent, tokens, &slot);
}

/* Registers block b (full, held by a sequence) unless its content is already there. */
static void cache_register(Engine *e, int b, int parent, const int *tokens) {
    PrefixCache *c = &e->cache;
    uint64_t slot;
    if (cache_find(e, parent, tokens, &slot) >= 0) return;
    memcpy(c->tokens + (size_t)b * e->block_size, tokens, sizeof(int) * (size_t)e->block_size);
    c->parent[b] = parent;
    c->parent_gen[b] = parent >= 0 ? c->gen[parent] : 0;
    c->chain[b] = c->bucket[slot];
    c->bucket[slot] = b;
    c->registered[b] = true;
}

static void cache_unregister(Engine *e, int b) {
    PrefixCache *c = &e->cache;
    uint64_t slot = cache_hash(c->parent[b], c->parent_gen[b], c->tokens + (size_t)b * e->block_size, e->block_size) &
                    c->mask;
    int *link = &c->bucket[slot];
    while (*link != b) link = &c->chain[*link];
    *link = c->chain[b];
    c->registered[b] = false;
    c->gen[b]++; /* blocks registered after it no longer match */
}

static void lru_remove(PrefixCache *c, int b) {
    if (c->lru_prev[b] >= 0) c->lru_next[c->lru_prev[b]] = c->lru_next[b];
    else c->lru_head = c->lru_next[b];
    if (c->lru_next[b] >= 0) c->lru_prev[c->lru_next[b]] = c->lru_prev[b];
    else c->lru_tail = c->lru_prev[b];
    c->n_lru--;
}

static void lru_push_back(PrefixCache *c, int b) {
    c->lru_prev[b] = c->lru_tail;
    c->lru_next[b] = -1;
    if (c->lru_tail >= 0) c->lru_next[c->lru_tail] = b;
    else c->lru_head = b;
    c->lru_tail = b;
    c->n_lru++;
}

static void prefix_cache_init(PrefixCache *c, int n_blocks, int block_size) {
    c->on = true;
    c->tokens = xmalloc(sizeof(int) * (size_t)n_blocks * block_size);
    c->parent = xmalloc(sizeof(int) * (size_t)n_blocks);
    c->parent_gen = xmalloc(sizeof(unsigned) * (size_t)n_blocks);
    c->gen = xcalloc((size_t)n_blocks, sizeof(unsigned));
    c->registered = xcalloc((size_t)n_blocks, sizeof(bool));
    c->chain = xmalloc(sizeof(int) * (size_t)n_blocks);
    size_t n_buckets = 16;
    while (n_buckets < 2 * (size_t)n_blocks) n_buckets *= 2;
    c->mask = n_buckets - 1;
    c->bucket = xmalloc(sizeof(int) * n_buckets);
    for (size_t k = 0; k < n_buckets; k++) c->bucket[k] = -1;
    c->lru_prev = xmalloc(sizeof(int) * (size_t)n_blocks);
    c->lru_next = xmalloc(sizeof(int) * (size_t)n_blocks);
    c->lru_head = c->lru_tail = -1;
    c->n_lru = 0;
    c->scratch = xmalloc(sizeof(int) * (size_t)block_size);
}

static void prefix_cache_free(PrefixCache *c) {
    free(c->tokens), free(c->parent), free(c->parent_gen), free(c->gen), free(c->registered), free(c->chain);
    free(c->bucket), free(c->lru_prev), free(c->lru_next), free(c->scratch);
    memset(c, 0, sizeof *c);
}

/* Blocks a sequence may still be given: never-registered free ones, then cached ones nobody holds. */
static int blocks_available(const Engine *e) { return e->n_free + e->cache.n_lru; }

static int block_alloc(Engine *e) {
    int b;
    if (e->n_free > 0) {
        b = e->free_blocks[--e->n_free];
    } else { /* the least recently used cached block leaves the cache */
        b = e->cache.lru_head;
        lru_remove(&e->cache, b);
        cache_unregister(e, b);
        e->stats.cache_evictions++;
    }
    e->refcount[b] = 1;
    int held = e->pool.n_blocks - blocks_available(e);
    if (held > e->stats.peak_blocks_used) e->stats.peak_blocks_used = held;
    return b;
}

/* Takes a cached block for one more sequence. */
static void block_share(Engine *e, int b) {
    if (e->refcount[b]++ == 0) lru_remove(&e->cache, b);
}

static void block_release(Engine *e, int b) {
    if (--e->refcount[b] > 0) return;
    if (e->cache.on && e->cache.registered[b]) lru_push_back(&e->cache, b);
    else e->free_blocks[e->n_free++] = b;
}

/* Empties the prefix cache (nobody may hold a block): every cached block becomes free. */
static void cache_drop_all(Engine *e) {
    while (e->cache.n_lru > 0) {
        int b = e->cache.lru_head;
        lru_remove(&e->cache, b);
        cache_unregister(e, b);
        e->free_blocks[e->n_free++] = b;
    }
}

/* Offers s's blocks that are full by the end of this step to the cache (the
 * forward stores every token's K/V before any attention reads, so a sequence
 * admitted later in the same step may already take them). */
static void register_full_blocks(Engine *e, Seq *s) {
    if (!e->cache.on) return;
    const int bs = e->block_size, *row = e->h_tables + (size_t)s->slot * e->table_width;
    int *tokens = e->cache.scratch;
    for (; (s->n_registered + 1) * bs <= s->n_cached + s->scheduled; s->n_registered++) {
        int k = s->n_registered, parent = k > 0 ? row[k - 1] : -1;
        if (parent >= 0 && !e->cache.registered[parent]) continue; /* a duplicate's children stay out */
        for (int j = 0; j < bs; j++) tokens[j] = token_at(s, k * bs + j);
        if (!e->cache.registered[row[k]]) cache_register(e, row[k], parent, tokens);
    }
}

static void free_graphs(Engine *e);

/* Rows of at least `blocks` entries. The table goes to the device whenever a
 * block is added, so its width is what sequences use, not max_len's: a server's
 * max_len of 32K tokens would send 2 MB a step for 256 rows (~8% of a small
 * model's decode step). Widening re-lays the rows out and makes the graphs and
 * the decode plan again (they bind the width); it happens a few times at most. */
static void widen_tables(Engine *e, int blocks) {
    if (blocks <= e->table_width) return;
    int w = e->table_width;
    while (w < blocks) w *= 2;
    if (w > e->max_blocks) w = e->max_blocks;
    for (int r = e->n_slots - 1; r >= 0; r--) { /* the last row first: rows only move up */
        memmove(e->h_tables + (size_t)r * w, e->h_tables + (size_t)r * e->table_width, sizeof(int) * (size_t)e->table_width);
        memset(e->h_tables + (size_t)r * w + e->table_width, 0, sizeof(int) * (size_t)(w - e->table_width));
    }
    e->table_width = w;
    e->tables_dirty = true;
    free_graphs(e);
    if (e->decode_plan) {
        model_decode_plan_free(e->m, e->decode_plan);
        e->decode_plan = model_decode_plan_create(e->m, &e->pool, e->table_width);
    }
}

/* Gives s enough blocks to hold its first `upto` tokens; false (nothing
 * taken) when the pool has too few free. */
static bool grow_blocks(Engine *e, Seq *s, int upto) {
    int need = div_up(upto, e->block_size) - s->n_blocks;
    if (need <= 0) return true;
    if (need > blocks_available(e)) return false;
    widen_tables(e, s->n_blocks + need);
    int *row = e->h_tables + (size_t)s->slot * e->table_width;
    for (int k = 0; k < need; k++) row[s->n_blocks++] = block_alloc(e);
    e->tables_dirty = true;
    return true;
}

/* Frees s's blocks and slot (it leaves the pool); its cached blocks stay cached. */
static void release_seq(Engine *e, Seq *s) {
    int *row = e->h_tables + (size_t)s->slot * e->table_width;
    for (int k = s->n_blocks - 1; k >= 0; k--) block_release(e, row[k]); /* the tail first: evicted first */
    s->n_blocks = 0;
    s->n_cached = 0;
    s->n_registered = 0;
    e->free_slots[e->n_free_slots++] = s->slot;
    s->slot = -1;
}

static void running_remove(Engine *e, int idx) {
    int w = 0;
    for (int r = 0; r < e->n_running; r++)
        if (e->running[r] != idx) e->running[w++] = e->running[r];
    e->n_running = w;
}

/* Evicts the latest-admitted running sequence back to the front of the queue;
 * it will be recomputed from its prompt and the tokens it already has (less
 * what the cache still holds). */
static void requeue_last(Engine *e) {
    int idx = e->running[e->n_running - 1];
    Seq *s = &e->seqs[idx];
    release_seq(e, s);
    s->state = SEQ_WAITING;
    s->scheduled = 0;
    e->n_running--;
    queue_push_front(&e->waiting, idx);
}

static void preempt_last(Engine *e) {
    requeue_last(e);
    e->stats.preemptions++;
}

/* Every running sequence back to the queue, in admission order, ahead of the
 * ones that were waiting (sleep, new weights: not counted as preemptions). */
static void requeue_all(Engine *e) {
    while (e->n_running > 0) requeue_last(e);
}

/* The cached blocks that hold s's first tokens, at most `max_blocks` of them,
 * into hits[]; returns how many, and in *from_lru how many nobody holds now. */
static int cache_hits(const Engine *e, const Seq *s, int max_blocks, int *hits, int *from_lru) {
    int n = 0, *tokens = e->cache.scratch;
    *from_lru = 0;
    if (!e->cache.on) return 0;
    for (int parent = -1; n < max_blocks; n++) {
        for (int j = 0; j < e->block_size; j++) tokens[j] = token_at(s, n * e->block_size + j);
        int b = cache_lookup(e, parent, tokens);
        if (b < 0) break;
        hits[n] = parent = b;
        *from_lru += e->refcount[b] == 0;
    }
    return n;
}

/* The sampler needs the sequence's history (a penalty over its tokens). */
static bool has_penalty(const Seq *s) {
    const SamplingParams *p = &s->opt.sampling;
    return p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
}

/* Puts the front waiting sequence in the pool with `budget` tokens to run, if
 * a slot and blocks are free. Its first blocks come from the prefix cache
 * where they are there (all but the last known token: its logits are needed). */
static bool admit_front(Engine *e, int budget) {
    if (e->waiting.count == 0 || e->n_free_slots == 0 || budget <= 0) return false;
    int idx = queue_front(&e->waiting);
    Seq *s = &e->seqs[idx];
    widen_tables(e, div_up(known_tokens(s), e->block_size)); /* the cached blocks and those it will take */
    int *row = e->h_tables + (size_t)e->free_slots[e->n_free_slots - 1] * e->table_width;
    int from_lru, n_hits = cache_hits(e, s, (known_tokens(s) - 1) / e->block_size, row, &from_lru);
    int start = n_hits * e->block_size;
    int take = min_int(known_tokens(s) - start, budget);
    int need = div_up(start + take, e->block_size) - n_hits;
    if (need > blocks_available(e) - from_lru) return false;

    queue_pop_front(&e->waiting);
    s->slot = e->free_slots[--e->n_free_slots];
    s->state = SEQ_RUNNING;
    for (int k = 0; k < n_hits; k++) block_share(e, row[k]);
    s->n_blocks = s->n_registered = n_hits;
    s->n_cached = start;
    e->stats.shared_tokens += start;
    COLT_ASSERT(grow_blocks(e, s, start + take));
    s->scheduled = take;
    register_full_blocks(e, s);
    e->tables_dirty = true;
    e->running[e->n_running++] = idx;
    if (e->n_running > e->stats.peak_running) e->stats.peak_running = e->n_running;
    if (has_penalty(s)) { /* the sampler's history: every token the sequence has */
        int n = known_tokens(s);
        int *h = xmalloc(sizeof(int) * (size_t)n);
        for (int p = 0; p < n; p++) h[p] = token_at(s, p);
        e->be->upload_i32(e->be, (int *)e->d_hist + (size_t)s->slot * e->max_len, h, (size_t)n);
        e->be->upload_i32(e->be, (int *)e->d_hist_len + s->slot, &n, 1);
        e->be->upload_i32(e->be, (int *)e->d_prompt_len + s->slot, &s->g->prompt_len, 1);
        free(h); /* uploads from pageable memory have read it when they return */
    }
    if (e->bias_wanted) { /* every admission sets its slot's bias (none: 0 entries) */
        int n = s->opt.n_logit_bias;
        if (n > 0) {
            e->be->upload_i32(e->be, (int *)e->d_bias_ids + (size_t)s->slot * MAX_LOGIT_BIAS, s->bias_ids, (size_t)n);
            e->be->upload_i32(e->be, (int *)e->d_bias_values + (size_t)s->slot * MAX_LOGIT_BIAS,
                              (const int *)s->bias_values, (size_t)n); /* f32 bits through the i32 upload */
        }
        e->be->upload_i32(e->be, (int *)e->d_bias_len + s->slot, &n, 1);
    }
    return true;
}

/* ---------------------------------------------------------------- one step */

static int bucket_index(int n) {
    for (int k = 0; k < N_BUCKETS; k++)
        if (GRAPH_BUCKETS[k] >= n) return k;
    return -1;
}

/* Rows that sample alike share one sampler call (and one apply_penalties call:
 * the logit biases themselves are per sequence). Greedy rows take the argmax
 * and the unfiltered log-prob: their filters and seed do not matter. */
static bool same_sampling(const SamplingParams *a, bool a_bias, const SamplingParams *b, bool b_bias) {
    if (a->repetition_penalty != b->repetition_penalty || a->presence_penalty != b->presence_penalty ||
        a->frequency_penalty != b->frequency_penalty || a_bias != b_bias)
        return false;
    if (a->temperature == 0.0f && b->temperature == 0.0f) return true;
    return a->temperature == b->temperature && a->top_k == b->top_k && a->top_p == b->top_p &&
           a->min_p == b->min_p && a->seed == b->seed;
}

/* Fills e->order with the running sequences grouped by sampling settings
 * (groups in order of first appearance, admission order within a group), so
 * that each group's logits rows are consecutive. One group: the running order. */
static void group_running(Engine *e) {
    e->n_groups = 0;
    for (int r = 0; r < e->n_running; r++) {
        Seq *s = &e->seqs[e->running[r]];
        int g = 0;
        bool bias = s->opt.n_logit_bias > 0;
        while (g < e->n_groups && !same_sampling(&e->group_params[g], e->group_bias[g], &s->opt.sampling, bias)) g++;
        if (g == e->n_groups) {
            e->group_bias[e->n_groups] = bias;
            e->group_params[e->n_groups++] = s->opt.sampling;
        }
        s->group = g;
    }
    int k = 0;
    for (int g = 0; g < e->n_groups; g++) {
        e->group_rows[g] = 0;
        for (int r = 0; r < e->n_running; r++)
            if (e->seqs[e->running[r]].group == g) e->order[k++] = e->running[r];
    }
}

/* The ops a CUDA graph may record: the forward (and, deterministic, a copy of
 * the logits, which the sampler clobbers; the log-probs are taken from it). */
static int run_forward(Engine *e, const PagedBatch *b, char *err) {
    if (model_forward_paged(e->m, e->st, &e->pool, b, err) != 0) return COLT_ERR; /* a tensor-parallel collective */
    if (e->deterministic)
        e->be->copy(e->be, e->d_logits_kept, 0, paged_state_logits(e->st), 0, (size_t)b->n_logits * e->cfg->vocab_size);
    return COLT_OK;
}

/* The sampler over each group's rows (consecutive: group_running), with that group's settings. */
static void sample_groups(Engine *e, const int *dev_step, int n_pad) {
    const Backend *be = e->be;
    size_t row_bytes = (size_t)e->cfg->vocab_size * dtype_size(be->storage);
    char *logits = paged_state_logits(e->st);
    for (int g = 0, lo = 0; g < e->n_groups; lo += e->group_rows[g++]) {
        int n = e->group_rows[g];
        if (n == 0) continue;
        const SamplingParams *p = &e->group_params[g];
        const void *row_seq = dev_step + (size_t)SEG_ROW_SEQ * n_pad + lo;
        bool penalty = p->repetition_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
        SamplingParams sp = *p;
        if (sampling_has_vllm_penalties(p, e->group_bias[g])) { /* vLLM's order: bias and penalties, then the sampler */
            be->apply_penalties(be, logits + (size_t)lo * row_bytes, n, e->cfg->vocab_size, p, row_seq,
                                penalty ? e->d_hist : NULL, e->d_hist_len, e->d_prompt_len, e->max_len,
                                e->group_bias[g] ? e->d_bias_ids : NULL, e->d_bias_values, e->d_bias_len,
                                MAX_LOGIT_BIAS);
            sp.repetition_penalty = 1.0f; /* applied */
        }
        be->sample(be, (int *)e->d_tokens + lo, (float *)e->d_logprobs + lo, logits + (size_t)lo * row_bytes, n,
                   e->cfg->vocab_size, &sp, row_seq,
                   dev_step + (size_t)SEG_STREAMS * n_pad + lo, dev_step + (size_t)SEG_COUNTERS * n_pad + lo,
                   penalty ? e->d_hist : NULL, penalty ? e->d_hist_len : NULL, e->max_len);
    }
}

/* Deterministic mode: the trainer's log-prob of each sampled token, by the
 * trainer's op, at each group's temperature (1 when greedy). */
static void trainer_logprobs(Engine *e, int n_rows) {
    const Backend *be = e->be;
    size_t row_bytes = (size_t)e->cfg->vocab_size * dtype_size(be->storage);
    be->download_i32(be, e->h_tokens, e->d_tokens, (size_t)n_rows);
    for (int g = 0, lo = 0; g < e->n_groups; lo += e->group_rows[g++]) {
        int n = e->group_rows[g];
        if (n == 0) continue;
        float t = e->group_params[g].temperature > 0.0f ? e->group_params[g].temperature : 1.0f;
        be->log_softmax_target(be, (float *)e->d_logprobs + lo, NULL, (char *)e->d_logits_kept + (size_t)lo * row_bytes,
                               e->h_tokens + lo, n, e->cfg->vocab_size, t);
    }
    be->download_f32(be, e->h_logprobs, e->d_logprobs, (size_t)n_rows);
}

/* Structured outputs: each row's allowed tokens, worked out on the host from
 * its completion so far (structured.h), become -inf on its logits before the
 * sampler draws (rows without a regex allow every id). The log-probs are then
 * the masked distribution's (in deterministic mode the kept copy is masked
 * too), unless a request asks for the policy's (policy_logprobs): the kept
 * copy then stays unmasked (taken here outside deterministic mode), and
 * *policy says the step's log-probs come from it. */
static int apply_token_masks(Engine *e, int n_rows, bool *policy, char *err) {
    bool any = false;
    *policy = false;
    for (int i = 0; i < n_rows; i++) {
        const GenerateOptions *o = &e->seqs[e->row_owner[i]].opt;
        any |= o->regex != NULL;
        *policy |= o->regex != NULL && o->policy_logprobs;
    }
    if (!any) return COLT_OK;
    const size_t W = (size_t)e->mask_words;
    for (int i = 0; i < n_rows; i++) {
        const Seq *s = &e->seqs[e->row_owner[i]];
        uint32_t *mask = e->h_mask + (size_t)i * W;
        if (!s->opt.regex) {
            memset(mask, 0xff, sizeof(uint32_t) * W);
            continue;
        }
        if (token_regex_mask(s->opt.regex, mask, s->g->tokens, s->g->n_tokens, s->opt.stop_ids, s->opt.n_stop_ids) == 0)
            return regex_dead_end(s->opt.regex, (int)s->g->stream, s->g->n_tokens, err);
    }
    const Backend *be = e->be;
    be->upload_i32(be, e->d_mask, (const int *)e->h_mask, (size_t)n_rows * W);
    if (*policy && !e->deterministic)
        be->copy(be, e->d_logits_kept, 0, paged_state_logits(e->st), 0, (size_t)n_rows * e->cfg->vocab_size);
    be->apply_token_bitmask(be, paged_state_logits(e->st), e->d_mask, n_rows, e->cfg->vocab_size);
    if (e->deterministic && !*policy)
        be->apply_token_bitmask(be, e->d_logits_kept, e->d_mask, n_rows, e->cfg->vocab_size);
    return COLT_OK;
}

static bool is_stop(const GenerateOptions *opt, int token) {
    if (opt->ignore_eos) return false;
    for (int i = 0; i < opt->n_stop_ids; i++)
        if (opt->stop_ids[i] == token) return true;
    return false;
}

static EngineEvent *event_push(Engine *e, uint64_t id) {
    COLT_ASSERT(e->n_events < e->events_cap); /* reserved by engine_add_request */
    EngineEvent *ev = &e->events[e->n_events++];
    *ev = (EngineEvent){.id = id, .token = -1};
    return ev;
}

/* The events of the last engine_step were read: start a new list. */
static void events_reset_if_delivered(Engine *e) {
    if (!e->events_delivered) return;
    e->n_events = 0;
    e->events_delivered = false;
}

static void seq_free(Engine *e, int idx) {
    Seq *s = &e->seqs[idx];
    free(s->stop), free(s->bias_ids), free(s->bias_values);
    memset(s, 0, sizeof *s);
    s->state = SEQ_FREE;
    s->slot = -1;
    e->n_live--;
}

static void forget_weights(Engine *e);
static void forget_values(Engine *e);

/* Schedules, runs and applies one step (nothing when no request is queued or running). */
static int step_once(Engine *e, char *err) {
    const int budget = e->max_tokens, preemptions_before = e->stats.preemptions;
    int n_tok = 0;
    bool decode_only = true;

    /* Running sequences first, oldest first; a sequence that cannot get a block
     * evicts the youngest (not yet scheduled this step), possibly itself. */
    for (int r = 0; r < e->n_running; r++) {
        Seq *s = &e->seqs[e->running[r]];
        int pending = known_tokens(s) - s->n_cached;
        int take = min_int(pending, budget - n_tok);
        s->scheduled = 0;
        if (take <= 0) continue;
        bool evicted_self = false;
        while (!grow_blocks(e, s, s->n_cached + take)) {
            if (e->running[e->n_running - 1] == e->running[r]) {
                preempt_last(e);
                evicted_self = true;
                break;
            }
            preempt_last(e);
        }
        if (evicted_self) break;
        s->scheduled = take;
        register_full_blocks(e, s);
        n_tok += take;
        if (pending != 1) decode_only = false;
    }
    /* Then waiting sequences, in order, while the budget, slots and blocks last
     * (not in a step that had to preempt, the pool being full, unless nothing
     * else would run). */
    bool may_admit = e->stats.preemptions == preemptions_before || n_tok == 0;
    while (may_admit && n_tok < budget && admit_front(e, budget - n_tok)) {
        n_tok += e->seqs[e->running[e->n_running - 1]].scheduled;
        decode_only = false;
    }
    if (n_tok == 0) {
        if (e->waiting.count > 0)
            return errorf(err, "engine: the waiting sequences cannot be scheduled (pool of %d blocks)",
                          e->pool.n_blocks);
        return COLT_OK;
    }
    double t_start = time_now();

    /* The step's arrays, the sequences grouped by sampling settings; decode steps padded to a graph bucket. */
    group_running(e);
    int bucket = decode_only && e->use_graphs ? bucket_index(n_tok) : -1;
    int n_pad = bucket >= 0 ? GRAPH_BUCKETS[bucket] : n_tok;
    int *seg[N_SEGMENTS];
    for (int k = 0; k < N_SEGMENTS; k++) seg[k] = e->h_step + (size_t)k * n_pad;
    int t = 0, n_rows = 0;
    for (int r = 0; r < e->n_running; r++) {
        Seq *s = &e->seqs[e->order[r]];
        if (s->scheduled == 0) continue;
        const int *row = e->h_tables + (size_t)s->slot * e->table_width;
        for (int k = 0; k < s->scheduled; k++, t++) {
            int p = s->n_cached + k;
            seg[SEG_TOKENS][t] = token_at(s, p);
            seg[SEG_POS][t] = p;
            seg[SEG_SEQ][t] = s->slot;
            seg[SEG_SLOT_MAPPING][t] = row[p / e->block_size] * e->block_size + p % e->block_size;
        }
        bool decode_token = s->scheduled == 1 && s->g->n_tokens > 0 && s->n_cached == known_tokens(s) - 1;
        if (!decode_token) e->stats.prefill_tokens += s->scheduled;
        s->n_cached += s->scheduled;
        if (s->n_cached == known_tokens(s)) { /* its last token's logits give the next token */
            seg[SEG_LOGIT_ROWS][n_rows] = t - 1;
            seg[SEG_ROW_SEQ][n_rows] = s->slot;
            seg[SEG_STREAMS][n_rows] = (int)s->g->stream;
            seg[SEG_COUNTERS][n_rows] = s->g->first_position + s->g->n_tokens;
            e->group_rows[s->group]++;
            e->row_owner[n_rows++] = e->order[r];
        }
    }
    for (; t < n_pad; t++) { /* padding rows: nothing stored, nothing sampled */
        seg[SEG_TOKENS][t] = 0;
        seg[SEG_POS][t] = 0;
        seg[SEG_SEQ][t] = -1;
        seg[SEG_SLOT_MAPPING][t] = -1;
        seg[SEG_ROW_SEQ][t] = -1;
        seg[SEG_STREAMS][t] = 0;
        seg[SEG_COUNTERS][t] = 0;
        seg[SEG_LOGIT_ROWS][t] = t;
    }

    const Backend *be = e->be;
    be->upload_i32(be, e->d_step, e->h_step, (size_t)N_SEGMENTS * n_pad);
    if (e->tables_dirty) {
        be->upload_i32(be, e->d_tables, e->h_tables, (size_t)e->n_slots * e->table_width);
        e->tables_dirty = false;
    }
    const int *d = e->d_step;
    PagedBatch b = {.n = n_pad,
                    .n_logits = decode_only ? n_pad : n_rows,
                    .tokens = d + (size_t)SEG_TOKENS * n_pad,
                    .pos = d + (size_t)SEG_POS * n_pad,
                    .seq = d + (size_t)SEG_SEQ * n_pad,
                    .slot_mapping = d + (size_t)SEG_SLOT_MAPPING * n_pad,
                    .logit_rows = decode_only ? NULL : d + (size_t)SEG_LOGIT_ROWS * n_pad,
                    .block_tables = e->d_tables,
                    .max_blocks = e->table_width,
                    .decode_plan = decode_only ? e->decode_plan : NULL,
                    .decode = decode_only};
    double t_launch = time_now();
    if (bucket >= 0 && e->graphs[bucket]) {
        be->graph_launch(be, e->graphs[bucket]);
        e->stats.graph_steps++;
    } else if (bucket >= 0 && e->bucket_seen[bucket]) {
        be->capture_begin(be);
        int rc = run_forward(e, &b, err);
        e->graphs[bucket] = be->capture_end(be);
        if (rc != 0) return COLT_ERR; /* engine_destroy frees the graph */
        e->stats.graphs_captured++;
        be->graph_launch(be, e->graphs[bucket]);
        e->stats.graph_steps++;
    } else {
        if (run_forward(e, &b, err) != 0) return COLT_ERR;
        if (bucket >= 0) e->bucket_seen[bucket] = true;
    }
    double launch_s = time_now() - t_launch;
    bool policy = false;
    if (apply_token_masks(e, n_rows, &policy, err) != 0) return COLT_ERR;
    sample_groups(e, d, n_pad);
    e->stats.steps++;

    /* Apply the sampled tokens (the copy back waits for the device: everything launched above runs now). */
    double t_wait = time_now();
    if (n_rows > 0) {
        if (e->deterministic) {
            trainer_logprobs(e, n_rows);
        } else if (policy) { /* the policy's log-probs where asked for, the sampler's elsewhere */
            be->download_i32(be, e->h_sampled, e->d_sampled, (size_t)e->max_rows + (size_t)n_rows);
            float *sampler_lp = e->h_sampled_lp;
            memcpy(sampler_lp, e->h_logprobs, sizeof(float) * (size_t)n_rows);
            trainer_logprobs(e, n_rows);
            for (int i = 0; i < n_rows; i++)
                if (!e->seqs[e->row_owner[i]].opt.policy_logprobs) e->h_logprobs[i] = sampler_lp[i];
        } else { /* tokens and log-probs in one copy: one wait per step */
            be->download_i32(be, e->h_sampled, e->d_sampled, (size_t)e->max_rows + (size_t)n_rows);
        }
    }
    e->stats.decode_tokens += n_rows;
    if (decode_only) {
        double t_end = time_now();
        e->stats.decode_seconds += t_end - t_start;
        e->stats.decode_wait_seconds += t_end - t_wait;
        e->stats.decode_launch_seconds += launch_s;
        e->stats.decode_step_tokens += n_rows;
    }
    for (int i = 0; i < n_rows; i++) {
        int idx = e->row_owner[i];
        Seq *s = &e->seqs[idx];
        GenSequence *g = s->g;
        int token = e->h_tokens[i];
        if (token < 0 || token >= e->cfg->vocab_size)
            return errorf(err, "engine: the sampler returned token %d (vocab %d)", token, e->cfg->vocab_size);
        g->tokens[g->n_tokens] = token;
        g->logprobs[g->n_tokens] = e->h_logprobs[i];
        g->n_tokens++;
        EngineEvent *ev = event_push(e, s->id);
        ev->token = token;
        ev->logprob = e->h_logprobs[i];
        bool stop = is_stop(&s->opt, token);
        if (stop) g->finish = FINISH_STOP;
        if (stop || g->n_tokens >= s->opt.max_new_tokens || known_tokens(s) >= s->limit) {
            release_seq(e, s);
            running_remove(e, idx);
            ev->finished = true;
            seq_free(e, idx);
        }
    }
    return COLT_OK;
}

int engine_step(Engine *e, const EngineEvent **events, int *n_events, char *err) {
    events_reset_if_delivered(e);
    *events = e->events;
    *n_events = 0;
    if (!e->awake) return errorf(err, "engine: asleep (engine_wake takes its memory again)");
    if (model_weights_layout_version(e->m) != e->layout_version) forget_weights(e);
    else if (model_weights_version(e->m) != e->weights_version) forget_values(e);
    if (e->be->buffers_epoch && e->be->buffers_epoch(e->be) != e->buffers_epoch) { /* a buffer they read moved */
        free_graphs(e);
        e->buffers_epoch = e->be->buffers_epoch(e->be);
    }
    double t0 = time_now();
    int rc = step_once(e, err);
    e->stats.seconds += time_now() - t0;
    e->events_delivered = true;
    *n_events = e->n_events;
    return rc;
}

/* ---------------------------------------------------------------- memory: taken awake, given back asleep */

/* Rows of logits (the padded decode batch) and tokens per forward call. */
static void engine_step_sizes(int n_slots, bool graphs, const EngineOptions *eo, int *max_rows, int *max_tokens) {
    *max_rows = n_slots;
    int b = bucket_index(n_slots);
    if (graphs && b >= 0) *max_rows = GRAPH_BUCKETS[b]; /* room for the padded decode batch */
    *max_tokens = eo->max_num_batched_tokens > 0 ? eo->max_num_batched_tokens : DEFAULT_MAX_BATCHED_TOKENS;
    if (*max_tokens < *max_rows) *max_tokens = *max_rows;
}

static void free_graphs(Engine *e) {
    for (int k = 0; k < N_BUCKETS; k++) {
        if (e->graphs[k]) e->be->graph_free(e->be, e->graphs[k]);
        e->graphs[k] = NULL;
        e->bucket_seen[k] = false;
    }
}

static void note_device_free(Engine *e) {
    if (!e->be->memory_info) return;
    size_t free_bytes, total_bytes;
    e->be->memory_info(e->be, &free_bytes, &total_bytes);
    if (e->stats.device_free_min == 0 || free_bytes < e->stats.device_free_min) e->stats.device_free_min = free_bytes;
}

static void alloc_history(Engine *e) {
    e->d_hist = e->be->alloc_i32(e->be, (size_t)e->n_slots * e->max_len);
    e->d_hist_len = e->be->alloc_i32(e->be, (size_t)e->n_slots);
    e->d_prompt_len = e->be->alloc_i32(e->be, (size_t)e->n_slots);
}

/* The logit-bias tables; every slot starts with none (a sequence admitted before still reads 0 entries). */
static void alloc_bias(Engine *e) {
    e->d_bias_ids = e->be->alloc_i32(e->be, (size_t)e->n_slots * MAX_LOGIT_BIAS);
    e->d_bias_values = e->be->alloc_i32(e->be, (size_t)e->n_slots * MAX_LOGIT_BIAS);
    e->d_bias_len = e->be->alloc_i32(e->be, (size_t)e->n_slots);
    int *zeros = xcalloc((size_t)e->n_slots, sizeof(int));
    e->be->upload_i32(e->be, e->d_bias_len, zeros, (size_t)e->n_slots);
    free(zeros);
}

/* Everything the awake engine holds on the device, and the host state sized by the pool. */
static void give_memory(Engine *e) {
    const Backend *be = e->be;
    requeue_all(e);
    free_graphs(e);
    model_decode_plan_free(e->m, e->decode_plan);
    e->decode_plan = NULL;
    kv_pool_free(&e->pool);
    paged_state_free(e->st);
    e->st = NULL;
    void **dev[] = {&e->d_tables, &e->d_hist, &e->d_hist_len, &e->d_prompt_len, &e->d_bias_ids, &e->d_bias_values,
                    &e->d_bias_len, &e->d_step, &e->d_sampled, &e->d_logits_kept, &e->d_mask};
    for (size_t k = 0; k < sizeof(dev) / sizeof(dev[0]); k++) {
        if (*dev[k]) be->free(be, *dev[k]);
        *dev[k] = NULL;
    }
    e->d_tokens = e->d_logprobs = NULL;
    prefix_cache_free(&e->cache);
    free(e->free_blocks), free(e->refcount);
    e->free_blocks = e->refcount = NULL;
    e->n_free = 0;
    e->awake = false;
}

/* Scratch first; the pool then takes what is left (capped by
 * gpu_memory_utilization and max_pool_blocks), at most every slot at full length. */
static int take_memory(Engine *e, char *err) {
    const Backend *be = e->be;
    const EngineOptions *eo = &e->eo;
    if (paged_state_create(&e->st, e->m, e->max_tokens, e->max_rows, err) != 0) return COLT_ERR;
    if (e->deterministic) e->d_logits_kept = be->alloc(be, (size_t)e->max_rows * e->cfg->vocab_size);
    size_t block_bytes = kv_pool_block_bytes(e->m, e->block_size);
    int64_t want = (int64_t)e->n_slots * e->max_blocks; /* every running sequence at full length */
    if (be->memory_info) {
        size_t free_bytes, total_bytes;
        be->memory_info(be, &free_bytes, &total_bytes);
        size_t avail = free_bytes > DEVICE_HEADROOM_BYTES ? free_bytes - DEVICE_HEADROOM_BYTES : 0;
        if (eo->gpu_memory_utilization > 0) {
            size_t cap = (size_t)(eo->gpu_memory_utilization * (double)total_bytes);
            if (cap < avail) avail = cap;
        }
        if ((int64_t)(avail / block_bytes) < want) want = (int64_t)(avail / block_bytes);
    }
    if (eo->max_pool_blocks > 0 && want > eo->max_pool_blocks) want = eo->max_pool_blocks;
    if (want < e->max_blocks) {
        give_memory(e);
        return errorf(err, "the KV pool fits %lld blocks of %d tokens but one sequence of %d tokens needs %d; free "
                           "device memory or raise gpu_memory_utilization",
                      (long long)want, e->block_size, e->max_len, e->max_blocks);
    }
    kv_pool_create(&e->pool, e->m, (int)want, e->block_size);
    e->decode_plan = model_decode_plan_create(e->m, &e->pool, e->table_width);

    e->free_blocks = xmalloc(sizeof(int) * (size_t)want);
    e->refcount = xcalloc((size_t)want, sizeof(int));
    if (!eo->no_prefix_caching) prefix_cache_init(&e->cache, (int)want, e->block_size);
    for (int k = 0; k < (int)want; k++) e->free_blocks[k] = (int)want - 1 - k; /* block 0 handed out first */
    e->n_free = (int)want;
    e->d_tables = be->alloc_i32(be, (size_t)e->n_slots * e->max_blocks);
    e->tables_dirty = true;
    if (e->history_wanted) alloc_history(e);
    if (e->bias_wanted) alloc_bias(e);
    if (e->mask_wanted) {
        e->d_mask = be->alloc_i32(be, (size_t)e->max_rows * e->mask_words);
        if (!e->d_logits_kept) e->d_logits_kept = be->alloc(be, (size_t)e->max_rows * e->cfg->vocab_size);
    }
    e->d_step = be->alloc_i32(be, (size_t)N_SEGMENTS * e->max_tokens);
    e->d_sampled = be->alloc_i32(be, 2 * (size_t)e->max_rows);
    e->d_tokens = e->d_sampled;
    e->d_logprobs = (int *)e->d_sampled + e->max_rows;

    e->stats.pool_bytes = e->pool.bytes;
    e->stats.pool_blocks = e->pool.n_blocks;
    e->stats.block_size = e->block_size;
    note_device_free(e);
    e->weights_version = model_weights_version(e->m);
    e->layout_version = model_weights_layout_version(e->m);
    e->awake = true;
    return COLT_OK;
}

/* New values at the same addresses (model_weights_changed_in_place: an
 * optimizer step): the K/V and the cached blocks are stale, the graphs and
 * the decode plan are not (they hold addresses, and the forward launches the
 * same kernels). Running sequences are recomputed (their tokens stay). */
static void forget_values(Engine *e) {
    requeue_all(e);
    if (e->cache.on) cache_drop_all(e);
    e->weights_version = model_weights_version(e->m);
}

/* The weights changed, maybe their addresses (model_weights_changed): nothing
 * computed from or recorded with the old ones may be used again. On top of
 * forget_values, the graphs and the decode plan (which bind the weights'
 * addresses) are made again, and so is the scratch when LoRA adapters it has
 * no room for were attached meanwhile (colt serve's weight channel attaches a
 * trainer's). */
static void forget_weights(Engine *e) {
    forget_values(e);
    free_graphs(e);
    if (!paged_state_fits(e->st, e->m)) {
        char err[ERR_LEN];
        paged_state_free(e->st);
        COLT_ASSERT(paged_state_create(&e->st, e->m, e->max_tokens, e->max_rows, err) == 0); /* sizes made it once */
    }
    model_decode_plan_free(e->m, e->decode_plan);
    e->decode_plan = model_decode_plan_create(e->m, &e->pool, e->table_width);
    e->layout_version = model_weights_layout_version(e->m);
}

/* ---------------------------------------------------------------- the persistent engine */

int engine_create(Engine **out, Model *m, const EngineOptions *eo, int max_len, int max_seqs, char *err) {
    static const EngineOptions defaults = {0};
    *out = NULL;
    Engine *e = xcalloc(1, sizeof *e);
    e->m = m;
    e->be = model_backend(m);
    e->cfg = model_config(m);
    e->eo = eo ? *eo : defaults;
    eo = &e->eo;
    const Backend *be = e->be;
    if (!be->paged_attention || !be->sample) {
        free(e);
        return errorf(err, "backend %s has no generation engine ops", be->name);
    }
    if (eo->deterministic) {
        if (!be->set_batch_invariant || !be->log_softmax_target) {
            free(e);
            return errorf(err, "backend %s has no deterministic mode", be->name);
        }
        be->set_batch_invariant(be, 1);
        e->deterministic = true;
    }
    /* tensor parallel: only collectives that enqueue on the stream can be recorded */
    e->use_graphs = be->capture_begin && !eo->enforce_eager && (model_tensor_parallel_size(m) == 1 || model_tp_graph_safe(m));
    e->block_size = eo->block_size > 0 ? eo->block_size : DEFAULT_BLOCK_SIZE;
    int max_num_seqs = eo->max_num_seqs > 0 ? eo->max_num_seqs : DEFAULT_MAX_NUM_SEQS;
    e->max_len = min_int(max_len, e->cfg->max_position_embeddings);
    e->n_slots = min_int(max_seqs, max_num_seqs);
    if (e->block_size & (e->block_size - 1)) {
        int block_size = e->block_size;
        free(e);
        return errorf(err, "block_size must be a power of two (got %d)", block_size);
    }
    if (e->max_len < 1 || e->n_slots < 1) {
        free(e);
        return errorf(err, "engine: max_len (%d) and max_seqs (%d) must be >= 1", max_len, max_seqs);
    }
    e->max_blocks = div_up(e->max_len, e->block_size);
    e->table_width = e->max_blocks < 32 ? e->max_blocks : 32; /* 512 tokens at blocks of 16; widen_tables */
    engine_step_sizes(e->n_slots, e->use_graphs, eo, &e->max_rows, &e->max_tokens);

    e->h_tables = xcalloc((size_t)e->n_slots * e->max_blocks, sizeof(int));
    e->free_slots = xmalloc(sizeof(int) * (size_t)e->n_slots);
    for (int k = 0; k < e->n_slots; k++) e->free_slots[k] = e->n_slots - 1 - k;
    e->n_free_slots = e->n_slots;
    e->h_step = xmalloc(sizeof(int) * (size_t)N_SEGMENTS * e->max_tokens);
    e->h_sampled = xmalloc(sizeof(int) * 2 * (size_t)e->max_rows);
    e->h_tokens = e->h_sampled;
    e->h_logprobs = (float *)(e->h_sampled + e->max_rows);
    e->row_owner = xmalloc(sizeof(int) * (size_t)e->max_rows);
    e->running = xmalloc(sizeof(int) * (size_t)e->n_slots);
    e->order = xmalloc(sizeof(int) * (size_t)e->n_slots);
    e->group_params = xmalloc(sizeof(SamplingParams) * (size_t)e->n_slots);
    e->group_bias = xcalloc((size_t)e->n_slots, sizeof(bool));
    e->group_rows = xcalloc((size_t)e->n_slots, sizeof(int));
    if (take_memory(e, err) != 0) {
        engine_destroy(e);
        return COLT_ERR;
    }
    *out = e;
    return COLT_OK;
}

void engine_destroy(Engine *e) {
    if (!e) return;
    if (e->awake) give_memory(e);
    for (int i = 0; i < e->seqs_cap; i++) free(e->seqs[i].stop), free(e->seqs[i].bias_ids), free(e->seqs[i].bias_values);
    free(e->seqs), free(e->waiting.items), free(e->events);
    free(e->h_tables), free(e->free_slots), free(e->h_step), free(e->h_sampled), free(e->row_owner);
    free(e->running), free(e->order), free(e->group_params), free(e->group_bias), free(e->group_rows), free(e->h_mask), free(e->h_sampled_lp);
    free(e);
}

/* A free entry of the request table (grown when full). */
static int seq_alloc(Engine *e) {
    for (int i = 0; i < e->seqs_cap; i++)
        if (e->seqs[i].state == SEQ_FREE) return i;
    int old = e->seqs_cap, cap = old ? 2 * old : 16;
    e->seqs = xrealloc(e->seqs, sizeof(Seq) * (size_t)cap);
    memset(e->seqs + old, 0, sizeof(Seq) * (size_t)(cap - old));
    for (int i = old; i < cap; i++) e->seqs[i].state = SEQ_FREE;
    e->seqs_cap = cap;
    return old;
}

static int find_live(const Engine *e, uint64_t id) {
    for (int i = 0; i < e->seqs_cap; i++)
        if (e->seqs[i].state != SEQ_FREE && e->seqs[i].id == id) return i;
    return -1;
}

int engine_add_request(Engine *e, GenSequence *g, const GenerateOptions *opt, uint64_t id, char *err) {
    events_reset_if_delivered(e);
    if (generate_check(e->m, g, 1, opt, err) != 0) return COLT_ERR;
    if (g->prompt_len > e->max_len)
        return errorf(err, "the prompt has %d tokens, more than the engine's max_len (%d)", g->prompt_len, e->max_len);
    if (g->stream > MAX_STREAM_ID)
        return errorf(err, "request %llu: stream id %llu above 2^31-1", (unsigned long long)id,
                      (unsigned long long)g->stream);
    if (find_live(e, id) >= 0) return errorf(err, "request id %llu is already in the engine", (unsigned long long)id);
    if (opt->regex && !e->be->apply_token_bitmask)
        return errorf(err, "backend %s has no structured outputs (apply_token_bitmask)", e->be->name);
    if (sampling_has_vllm_penalties(&opt->sampling, opt->n_logit_bias) && !e->be->apply_penalties)
        return errorf(err, "backend %s has no presence / frequency penalties or logit bias (apply_penalties)",
                      e->be->name);
    int cap = opt->max_new_tokens > 0 ? opt->max_new_tokens : 1;
    g->tokens = xmalloc(sizeof(int) * (size_t)cap);
    g->logprobs = xmalloc(sizeof(float) * (size_t)cap);
    g->n_tokens = 0;
    g->finish = FINISH_LENGTH;
    if (e->events_cap < e->n_events + 1 + e->max_rows) { /* what this add and the next step may report */
        e->events_cap = 2 * (e->n_events + 1 + e->max_rows);
        e->events = xrealloc(e->events, sizeof(EngineEvent) * (size_t)e->events_cap);
    }
    long long limit = (long long)g->prompt_len + opt->max_new_tokens;
    if (limit > e->max_len) limit = e->max_len;
    if (opt->max_new_tokens == 0 || g->prompt_len >= limit) { /* complete already */
        event_push(e, id)->finished = true;
        return COLT_OK;
    }
    int idx = seq_alloc(e);
    Seq *s = &e->seqs[idx];
    *s = (Seq){.g = g, .id = id, .opt = *opt, .state = SEQ_WAITING, .limit = (int)limit, .slot = -1};
    s->stop = xmalloc(sizeof(int) * (size_t)(opt->n_stop_ids > 0 ? opt->n_stop_ids : 1));
    if (opt->n_stop_ids > 0) memcpy(s->stop, opt->stop_ids, sizeof(int) * (size_t)opt->n_stop_ids);
    s->opt.stop_ids = s->stop;
    if (opt->n_logit_bias > 0) {
        s->bias_ids = xmalloc(sizeof(int) * (size_t)opt->n_logit_bias);
        s->bias_values = xmalloc(sizeof(float) * (size_t)opt->n_logit_bias);
        memcpy(s->bias_ids, opt->logit_bias_ids, sizeof(int) * (size_t)opt->n_logit_bias);
        memcpy(s->bias_values, opt->logit_bias_values, sizeof(float) * (size_t)opt->n_logit_bias);
    }
    s->opt.logit_bias_ids = s->bias_ids;
    s->opt.logit_bias_values = s->bias_values;
    e->n_live++;
    queue_push_back(&e->waiting, idx);
    if (has_penalty(s) && !e->history_wanted) {
        e->history_wanted = true;
        if (e->awake) alloc_history(e);
    }
    if (opt->n_logit_bias > 0 && !e->bias_wanted) {
        e->bias_wanted = true;
        if (e->awake) alloc_bias(e);
    }
    if (opt->regex && !e->mask_wanted) {
        e->mask_wanted = true;
        e->mask_words = (e->cfg->vocab_size + 31) / 32;
        e->h_mask = xmalloc(sizeof(uint32_t) * (size_t)e->max_rows * (size_t)e->mask_words);
        e->h_sampled_lp = xmalloc(sizeof(float) * (size_t)e->max_rows);
        if (e->awake) {
            e->d_mask = e->be->alloc_i32(e->be, (size_t)e->max_rows * e->mask_words);
            if (!e->d_logits_kept) e->d_logits_kept = e->be->alloc(e->be, (size_t)e->max_rows * e->cfg->vocab_size);
        }
    }
    return COLT_OK;
}

bool engine_has_work(const Engine *e) { return e->n_live > 0 || (!e->events_delivered && e->n_events > 0); }

int engine_abort(Engine *e, uint64_t id) {
    int idx = find_live(e, id);
    if (idx < 0) return COLT_ERR;
    Seq *s = &e->seqs[idx];
    if (s->state == SEQ_RUNNING) {
        release_seq(e, s);
        running_remove(e, idx);
    } else {
        queue_remove(&e->waiting, idx);
    }
    seq_free(e, idx);
    return COLT_OK;
}

void engine_sleep(Engine *e) {
    if (e->awake) give_memory(e);
}

int engine_wake(Engine *e, char *err) {
    if (e->awake) return COLT_OK;
    return take_memory(e, err);
}

bool engine_awake(const Engine *e) { return e->awake; }

void engine_load(const Engine *e, EngineLoad *out) {
    *out = (EngineLoad){.running = e->n_running, .waiting = e->waiting.count};
    if (!e->awake) return;
    out->pool_blocks = e->pool.n_blocks;
    out->cached_blocks = e->cache.n_lru;
    out->blocks_used = e->pool.n_blocks - blocks_available(e);
}

void engine_stats(const Engine *e, EngineStats *out) { *out = e->stats; }

int engine_max_len(const Engine *e) { return e->max_len; }

bool engine_fits(const Engine *e, int max_len, int max_seqs) {
    int max_num_seqs = e->eo.max_num_seqs > 0 ? e->eo.max_num_seqs : DEFAULT_MAX_NUM_SEQS;
    return min_int(max_len, e->cfg->max_position_embeddings) <= e->max_len && min_int(max_seqs, max_num_seqs) <= e->n_slots;
}

Model *engine_model(const Engine *e) { return e->m; }

/* ---------------------------------------------------------------- engine_generate: the loop on top */

/* A stretch of the engine's life added to the totals before it: sums, peaks and the least free memory. */
static void stats_add(EngineStats *total, const EngineStats *part) {
    total->pool_bytes = part->pool_bytes, total->pool_blocks = part->pool_blocks, total->block_size = part->block_size;
    if (part->peak_blocks_used > total->peak_blocks_used) total->peak_blocks_used = part->peak_blocks_used;
    if (part->peak_running > total->peak_running) total->peak_running = part->peak_running;
    if (part->device_free_min && (!total->device_free_min || part->device_free_min < total->device_free_min))
        total->device_free_min = part->device_free_min;
    total->preemptions += part->preemptions;
    total->steps += part->steps, total->graph_steps += part->graph_steps;
    total->graphs_captured += part->graphs_captured;
    total->prefill_tokens += part->prefill_tokens, total->decode_tokens += part->decode_tokens;
    total->shared_tokens += part->shared_tokens, total->cache_evictions += part->cache_evictions;
    total->seconds += part->seconds, total->decode_seconds += part->decode_seconds;
    total->decode_wait_seconds += part->decode_wait_seconds, total->decode_step_tokens += part->decode_step_tokens;
    total->decode_launch_seconds += part->decode_launch_seconds;
}

int engine_check_length(const Engine *e, const char *what, int i, int prompt_len, int max_new_tokens, char *err) {
    long long need = (long long)prompt_len + max_new_tokens;
    if (need > e->cfg->max_position_embeddings) need = e->cfg->max_position_embeddings;
    if (need > e->max_len)
        return errorf(err, "%s %d needs %lld tokens (prompt %d + max_new_tokens %d) but the engine was made for %d",
                      what, i, need, prompt_len, max_new_tokens, e->max_len);
    return COLT_OK;
}

/* this call's counters from zero; the totals before it are added back at the end */
void engine_call_begin(Engine *e, EngineCall *call) {
    call->before = e->stats;
    memset(&e->stats, 0, sizeof e->stats);
    e->stats.pool_bytes = call->before.pool_bytes, e->stats.pool_blocks = call->before.pool_blocks;
    e->stats.block_size = call->before.block_size;
}

void engine_call_end(Engine *e, EngineCall *call, EngineStats *stats) {
    if (e->awake) note_device_free(e); /* the pool is still taken: the peak of this call */
    if (stats) *stats = e->stats;
    stats_add(&call->before, &e->stats);
    e->stats = call->before;
}

int engine_run(Engine *e, GenSequence *seqs, int n_seqs, const GenerateOptions *opt, EngineStats *stats, char *err) {
    if (stats) memset(stats, 0, sizeof *stats);
    if (generate_check(e->m, seqs, n_seqs, opt, err) != 0) return COLT_ERR;
    if (!e->awake) return errorf(err, "engine_run: the engine is asleep (engine_wake takes its memory again)");
    if (engine_has_work(e)) return errorf(err, "engine_run: the engine still has %d requests of its own", e->n_live);
    for (int i = 0; i < n_seqs; i++)
        if (engine_check_length(e, "engine_run: sequence", i, seqs[i].prompt_len, opt->max_new_tokens, err) != 0)
            return COLT_ERR;
    for (int i = 0; i < n_seqs; i++) {
        seqs[i].tokens = NULL;
        seqs[i].logprobs = NULL;
        seqs[i].n_tokens = 0;
        seqs[i].finish = FINISH_LENGTH;
    }
    EngineCall call;
    engine_call_begin(e, &call);
    int rc = COLT_OK, added = 0;
    for (; rc == 0 && added < n_seqs; added++) rc = engine_add_request(e, &seqs[added], opt, (uint64_t)added, err);
    while (rc == 0 && engine_has_work(e)) {
        const EngineEvent *events;
        int n_events;
        rc = engine_step(e, &events, &n_events, err);
    }
    engine_call_end(e, &call, rc == 0 ? stats : NULL);
    if (rc != 0) {
        for (int i = 0; i < added; i++) engine_abort(e, (uint64_t)i);
        for (int i = 0; i < n_seqs; i++) gen_sequence_free(&seqs[i]);
    }
    return rc;
}

int engine_generate(Model *m, GenSequence *seqs, int n_seqs, const GenerateOptions *opt, const EngineOptions *eo,
                    EngineStats *stats, char *err) {
    if (stats) memset(stats, 0, sizeof *stats);
    if (generate_check(m, seqs, n_seqs, opt, err) != 0) return COLT_ERR;
    if (n_seqs == 0) return COLT_OK;
    double t0 = time_now();
    /* Sized for these sequences: the longest at full length, every one in the pool at once. */
    int max_prompt = 0;
    for (int i = 0; i < n_seqs; i++)
        if (seqs[i].prompt_len > max_prompt) max_prompt = seqs[i].prompt_len;
    long long max_len = (long long)max_prompt + opt->max_new_tokens;
    if (max_len > model_config(m)->max_position_embeddings) max_len = model_config(m)->max_position_embeddings;
    Engine *e = NULL;
    int rc = engine_create(&e, m, eo, (int)max_len, n_seqs, err);
    if (rc == 0) rc = engine_run(e, seqs, n_seqs, opt, stats, err);
    if (rc == 0 && stats) stats->seconds = time_now() - t0; /* the engine's making included */
    engine_destroy(e);
    if (rc != 0)
        for (int i = 0; i < n_seqs; i++) gen_sequence_free(&seqs[i]);
    return rc;
}

/* ---------------------------------------------------------------- the memory plan */

int engine_round_max_num_seqs(int n_seqs) {
    int largest = GRAPH_BUCKETS[N_BUCKETS - 1];
    return n_seqs < DEFAULT_MAX_NUM_SEQS ? DEFAULT_MAX_NUM_SEQS : n_seqs > largest ? largest : n_seqs;
}

void engine_memory_plan(const Model *m, int n_seqs, int max_len, const EngineOptions *eo, size_t *scratch,
                        size_t *pool_min, size_t *pool_want, size_t *headroom) {
    static const EngineOptions defaults = {0};
    if (!eo) eo = &defaults;
    int block_size = eo->block_size > 0 ? eo->block_size : DEFAULT_BLOCK_SIZE;
    int max_num_seqs = eo->max_num_seqs > 0 ? eo->max_num_seqs : DEFAULT_MAX_NUM_SEQS;
    int n_slots = min_int(n_seqs, max_num_seqs), max_rows, max_tokens;
    engine_step_sizes(n_slots, !eo->enforce_eager, eo, &max_rows, &max_tokens);
    const size_t V = (size_t)model_config(m)->vocab_size;
    size_t kept = eo->deterministic || eo->structured_outputs ? (size_t)max_rows * V * dtype_size(model_backend(m)->storage)
                                                              : 0;
    if (eo->structured_outputs) kept += (size_t)max_rows * ((V + 31) / 32) * sizeof(int); /* the masks */
    size_t block_bytes = kv_pool_block_bytes(m, block_size), blocks = (size_t)div_up(max_len, block_size);
    *scratch = paged_state_plan_bytes(m, max_tokens, max_rows) + kept;
    *pool_min = blocks * block_bytes;
    *pool_want = (size_t)n_slots * blocks * block_bytes;
    *headroom = DEVICE_HEADROOM_BYTES;
}

size_t engine_memory_wanted(const Model *m, int n_seqs, int max_len, const EngineOptions *eo) {
    size_t scratch, pool_min, pool_want, headroom;
    engine_memory_plan(m, n_seqs, max_len, eo, &scratch, &pool_min, &pool_want, &headroom);
    return pool_want + scratch + headroom;
}
