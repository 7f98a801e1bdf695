/* profile.h — a backend wrapper that times every op (for finding where a step
 * goes). Each op is bracketed by the backend's synchronize, so the times are
 * exclusive per op but the overlap between ops is lost: a tool for attribution,
 * not for the headline numbers. */
#ifndef COLT_BACKEND_PROFILE_H
#define COLT_BACKEND_PROFILE_H

#include <stdio.h>

#include "backend/backend.h"

/* Returns a new instance that forwards to inner, timing each op between two
 * of inner's synchronize (when it has one); bookkeeping ops (memory stats,
 * labels, modes, plans) are forwarded untimed. Ops issued while capturing a
 * graph are recorded untimed (no synchronize may run then); graph_launch is
 * timed as one op. Free with backend_profile_free (or backend_close): either
 * frees the wrapper alone, never inner. */
Backend *backend_profile_wrap(const Backend *inner);
void backend_profile_free(Backend *profiled);
/* Prints op, calls, total ms and share, slowest first; then resets. */
void backend_profile_report(const Backend *profiled, FILE *fp);

#endif
