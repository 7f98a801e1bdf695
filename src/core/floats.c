/* floats.c — see floats.h. */
#include "core/floats.h"

#include <stdio.h>
#include <stdlib.h>

double float_as_decimal(float x) {
    char buf[32];
    for (int digits = 1; digits <= 9; digits++) {
        snprintf(buf, sizeof buf, "%.*g", digits, (double)x);
        double d = strtod(buf, NULL);
        if ((float)d == x) return d;
    }
    return (double)x;
}
