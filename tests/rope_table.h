/* rope_table.h — for op tests: the default RoPE table (model_rope_inv_freq of
 * base theta) that the rope ops take. Not a reference for scaled RoPE
 * (test_rope.c checks those tables against transformers). */
#ifndef COLT_TESTS_ROPE_TABLE_H
#define COLT_TESTS_ROPE_TABLE_H

#include "model/model.h"

/* inv_freq[head_dim / 2] in a static buffer, valid until the next call. */
static inline const float *rope_table(int head_dim, float theta) {
    static float table[1024 / 2];
    ModelConfig c = {.head_dim = head_dim, .rope_theta = theta};
    model_rope_inv_freq(table, &c);
    return table;
}

#endif
