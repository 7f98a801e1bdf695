/* shared_data.h — for tests that read ../shared/data (COLT_SHARED_DATA, set by
 * CMakeLists.txt): the Qwen tokenizers, GSM8K, MATH-500 and the stories260K
 * goldens' copy, which a plain clone of the repository does not have.
 *
 * Without that folder a test skips what needs it and says so in one line,
 * "SKIPPED: <what> (../shared/data not found)", then runs its other checks; a
 * suite with nothing else to check exits SHARED_DATA_SKIP, which CTest reports
 * as skipped. With the folder there every check runs: a file missing inside
 * it is a failure, not a skip. Not a test harness: each test keeps its own. */
#ifndef COLT_TESTS_SHARED_DATA_H
#define COLT_TESTS_SHARED_DATA_H

#include <stdbool.h>
#include <stdio.h>
#include <sys/stat.h>

#define SHARED_DATA_SKIP 77 /* SKIP_RETURN_CODE in CMakeLists.txt */

static inline bool shared_data_present(void) {
    struct stat st;
    return stat(COLT_SHARED_DATA, &st) == 0 && S_ISDIR(st.st_mode);
}

static inline void shared_data_skipped(const char *what) {
    printf("SKIPPED: %s (../shared/data not found)\n", what);
    fflush(stdout);
}

#endif
