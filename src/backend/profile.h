/* profile.h — a backend wrapper that times every op (for finding where a step
 * goes). Each op is bracketed by the backend's synchronize, so the times are
 * exclusive per op but the overlap between ops is lost: a tool for attribution,
 * not for the headline numbers. One wrapped backend per process. */
#ifndef COLT_BACKEND_PROFILE_H
#define COLT_BACKEND_PROFILE_H

#include <stdio.h>

#include "backend/backend.h"

/* Returns a backend that forwards to inner, timing each op; sync waits for the
 * inner backend's queued work (NULL for synchronous backends). */
const Backend *backend_profile_wrap(const Backend *inner, void (*sync)(void));
/* Prints op, calls, total ms and share, slowest first; then resets. */
void backend_profile_report(FILE *fp);

#endif
