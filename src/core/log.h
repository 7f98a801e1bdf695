/* log.h — progress and diagnostics on stderr. Only rank 0 prints info lines
 * (log_info0); errors always print and say their rank once ranks exist. */
#ifndef COLT_CORE_LOG_H
#define COLT_CORE_LOG_H

void log_set_rank(int rank);
int log_rank(void); /* the rank set above (0 by default) */
void log_info0(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Monotonic wall-clock seconds. */
double time_now(void);

#endif
