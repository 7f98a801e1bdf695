/* fileio.h — whole-file reads, memory maps and atomic writes.
 *
 * Every file colt writes goes through file_write_atomic or AtomicFile: data
 * goes to "<path>.tmp.<pid>", is flushed, then renamed over <path>, so a crash
 * or an error never leaves a half-written file. */
#ifndef COLT_CORE_FILEIO_H
#define COLT_CORE_FILEIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* Reads a whole file; *data is NUL-terminated (not counted in *len). */
int file_read_all(const char *path, char **data, size_t *len, char *err);

bool file_exists(const char *path);

/* Read-only memory map of a whole file. */
typedef struct MappedFile {
    void *data;   /* NULL for an empty file */
    size_t size;
} MappedFile;
int file_map(MappedFile *mf, const char *path, char *err);
void file_unmap(MappedFile *mf);

/* Writes len bytes to path atomically. */
int file_write_atomic(const char *path, const void *data, size_t len, char *err);

/* Streaming atomic write: open, fwrite to .fp, then commit (rename) or abort
 * (remove the temporary file). */
typedef struct AtomicFile {
    FILE *fp;
    char *path;
    char *tmp_path;
} AtomicFile;
int atomic_open(AtomicFile *af, const char *path, char *err);
int atomic_commit(AtomicFile *af, char *err);
void atomic_abort(AtomicFile *af);

/* Returns a newly allocated "dir/name". */
char *path_join(const char *dir, const char *name);

/* Creates a directory (and parents) if missing. */
int make_dirs(const char *path, char *err);

#endif
