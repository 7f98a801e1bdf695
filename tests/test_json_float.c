/* test_json_float.c — /colt/generate writes its fp32 log-probs with 9
 * significant digits (colt_api.c) and colt train reads them back through a
 * double (serve_client.c): every finite float must come back bit for bit, or
 * server mode would drift from the colocated run. Checked here the way the two
 * sides do it (jansson's json_real, json_dumps with JSON_REAL_PRECISION(9),
 * json_loads, a cast to float) over random bit patterns of every exponent
 * (subnormals included) and the edge values. */
#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/rng.h"
#include "harness.h"

/* f written as the server writes it and read as the client reads it. */
static float round_trip(float f) {
    json_t *a = json_array();
    json_array_append_new(a, json_real(f));
    char *text = json_dumps(a, JSON_COMPACT | JSON_REAL_PRECISION(9));
    json_decref(a);
    json_error_t e;
    json_t *back = json_loads(text, 0, &e);
    free(text);
    float out = back ? (float)json_number_value(json_array_get(back, 0)) : NAN;
    json_decref(back);
    return out;
}

static bool same_bits(float a, float b) { return memcmp(&a, &b, sizeof a) == 0; }

int main(void) {
    const float edges[] = {0.0f, -0.0f, 1.0f, -1.0f, 1e-45f, -1e-45f, 1.17549435e-38f, 3.40282347e38f,
                           -3.40282347e38f, 0.1f, -0.693147182f, -88.7228394f, -1e-7f};
    int bad = 0, n = 0;
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++, n++) bad += !same_bits(round_trip(edges[i]), edges[i]);
    for (uint64_t i = 0; i < 200000; i++) {
        uint32_t bits = (uint32_t)(rng_uniform(5, i, 0) * 4294967296.0);
        float f;
        memcpy(&f, &bits, sizeof f);
        if (!isfinite(f)) continue; /* non-finite log-probs go as null */
        n++;
        if (!same_bits(round_trip(f), f)) {
            if (bad++ < 5) printf("  %a (%.9g) came back as %a\n", (double)f, (double)f, (double)round_trip(f));
        }
    }
    CHECK(bad == 0, "%d of %d floats did not come back bit for bit through 9 significant digits", bad, n);
    printf("test_json_float: %d floats through json_dumps(9) + json_loads, %d changed; %d checks, %d failures\n", n, bad,
           g_checks, g_failures);
    return g_failures ? 1 : 0;
}
