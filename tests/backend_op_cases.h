/* backend_op_cases.h — the table of op cases that every backend runs (llama.cpp's test-backend-ops, in
 * colt's shape): one row per op and shape, each a function that draws its inputs, runs the op on the
 * Backend it is given and hands its outputs back, a double-precision reference of the same outputs, and
 * the tolerances. test_backend_ops runs the table on the CPU against the references; tests/gpu/
 * test_cuda_ops runs it on cuda_f32 and cuda (bf16 storage) against the CPU, the CPU given the inputs as
 * the device stored them (bf16-rounded), so only the op's own error is measured.
 * Not here: whole models, memory accounting, device options (those stay in their tests).
 *
 * Dimension legend: N tokens, D width, H query heads, KVH key/value heads, Dh head dim, S cache slots,
 * L max cache length, F MLP width, V vocab. */
#ifndef COLT_TESTS_BACKEND_OP_CASES_H
#define COLT_TESTS_BACKEND_OP_CASES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"

/* One output's bounds. Against the double reference (CPU): max |err| <= ref_abs. Against the CPU: fp32
 * storage |err| <= f32_rel * max|cpu|; bf16 storage |err| <= bf16_abs * max|cpu| + |cpu| * bf16_k * 2^-8,
 * or, with bf16_k = OP_BF16_ROUNDED, exactly the CPU's value rounded once to bf16. */
typedef struct OpTol {
    double ref_abs, f32_rel, bf16_abs, bf16_k;
} OpTol;
#define OP_BF16_ROUNDED (-1.0)

typedef struct OpRun OpRun;

typedef struct OpCase {
    const char *family; /* the op family, e.g. "linear" (COLT_OP_CASES=family,family runs only those) */
    void (*run)(OpRun *r); /* draws inputs (op_in*), runs the op on r->be, hands outputs over (op_out*) */
    /* out[k][...]: output k of run, in double, from r's inputs; every output of run has one. */
    void (*ref)(const OpRun *r, double **out);
    int i[8];          /* shape and switches, as the family reads them */
    float f[4];        /* scales, eps, temperature, ... */
    const int *list;   /* a fixed int list (positions, ids), or NULL to draw one */
    int device_only;   /* a shape for a device's paths only (more rows than SMs, ...): the CPU runs it as
                        * the reference of the device, not against the double reference */
} OpCase;

#define OP_MAX_TENSORS 32

/* One run of one case on one backend: its inputs as the backend stored them, its outputs as it gave
 * them back. Device buffers made through it are freed with it. */
struct OpRun {
    const Backend *be;
    const OpCase *c;
    uint64_t key;        /* the case's index: inputs are drawn by (key, input index), the same on every backend */
    const OpRun *replay; /* when set, inputs are this run's values (the device's rounded copies), not drawn */
    uint64_t int_draws, draws;
    int n_in, n_ints, n_out, n_bufs, n_host;
    float *in[OP_MAX_TENSORS];
    size_t in_n[OP_MAX_TENSORS];
    int *ints[OP_MAX_TENSORS];
    size_t ints_n[OP_MAX_TENSORS];
    char *out_name[OP_MAX_TENSORS];
    float *out[OP_MAX_TENSORS];
    size_t out_n[OP_MAX_TENSORS];
    OpTol out_tol[OP_MAX_TENSORS];
    void *bufs[4 * OP_MAX_TENSORS];
    void *host[4 * OP_MAX_TENSORS];
};

/* ---- for the cases */
/* A storage input of n values drawn N(0, scale^2), uploaded; *host (may be NULL) gets them as stored. */
void *op_in(OpRun *r, size_t n, float scale, const float **host);
/* The same for an [f32] buffer (no rounding). */
void *op_in_f32(OpRun *r, size_t n, float scale, const float **host);
/* An [f32] input of the given values (a case's own function of op_draw's values). */
void *op_in_f32_values(OpRun *r, const float *values, size_t n);
/* n values drawn N(0, scale^2), the same on every backend, freed with the run: for inputs made from them. */
float *op_draw(OpRun *r, size_t n, float scale);
/* Input k's values as the backend stored them (for the references). */
const float *op_input(const OpRun *r, int k);
/* n zeroed ints, freed with the run; the k-th call's array is r->ints[k] (for the references). */
int *op_ints(OpRun *r, size_t n);
/* An int in [lo, hi], the same sequence on every backend. */
int op_rand_int(OpRun *r, int lo, int hi);
/* Empty buffers, freed with the run. */
void *op_alloc(OpRun *r, size_t n);
void *op_alloc_f32(OpRun *r, size_t n);
/* Host copies of a storage / [f32] buffer, freed with the run. */
float *op_download(OpRun *r, const void *buf, size_t n);
float *op_download_f32(OpRun *r, const void *buf, size_t n);
/* Outputs: a storage buffer, an [f32] buffer, or host values; named printf-style. */
void op_out(OpRun *r, OpTol tol, const void *buf, size_t n, const char *fmt, ...) __attribute__((format(printf, 5, 6)));
void op_out_f32(OpRun *r, OpTol tol, const void *buf, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
void op_out_host(OpRun *r, OpTol tol, const float *x, size_t n, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

/* ---- for the tests */
/* Buffers of a test that drives ops itself (malloc'd host copies; free them, and the buffers with be->free):
 * a storage input uploaded and read back into x (x then holds what the op sees: bf16-rounded on a bf16
 * backend), an [f32] or [i32] input, and the host copy of a storage or [f32] buffer. */
void *op_upload(const Backend *be, float *x, size_t n);
void *op_upload_f32(const Backend *be, const float *x, size_t n);
void *op_upload_i32(const Backend *be, const int *x, size_t n);
float *op_fetch(const Backend *be, const void *buf, size_t n);
float *op_fetch_f32(const Backend *be, const void *buf, size_t n);

/* got (a device's) against ref (the CPU's) under t, for a device of bf16 storage or not; prints one line
 * (tag names the device) and says whether every element is within. */
bool op_check_against(const char *tag, bool bf16, const char *what, const float *got, const float *ref, size_t n,
                      OpTol t);

extern const OpCase OP_CASES[];
extern const int OP_CASE_COUNT;

/* The double references computed so far, kept for the next backend that draws the same inputs (every
 * fp32 one): the references cost more than the ops. */
typedef struct OpRefs OpRefs;
OpRefs *op_refs_create(void);
void op_refs_free(OpRefs *refs);

/* Every case on be against its double reference; one line per output. refs (may be NULL) keeps the
 * references between backends. Returns the failures; adds the outputs compared to *checks. */
int op_cases_check_reference(const Backend *be, OpRefs *refs, int *checks);
/* Every case on dev and on cpu (with dev's stored inputs), dev's outputs against cpu's under the
 * tolerance of dev's storage; tag names dev in the lines. Returns the failures; adds to *checks. */
int op_cases_check_backend(const Backend *dev, const char *tag, const Backend *cpu, int *checks);

#endif
