/* fileio.h — whole-file reads, memory maps and atomic writes.
 *
 * Every file colt reads goes through file_read_all or file_map, which refuse
 * anything but a regular file without blocking (a FIFO named config.json must
 * fail, not hang). Every file colt writes goes through file_write_atomic or
 * AtomicFile: data goes to "<path>.tmp.<pid>", is flushed and fsynced, then
 * renamed over <path>, so a crash or an error never leaves a half-written file.
 * Every output path must be missing, a regular file, or a symbolic link: a link
 * is written through (its final target gets the new contents and the link
 * stays), and a device, FIFO, socket or directory — at the path or at the end of
 * its links — is refused in one line ("X: not a regular file (a FIFO); ..."),
 * never replaced: `--output /dev/null` as root must not swap /dev/null for a
 * file. Errors carry the path and the system's reason (strerror). */
#ifndef COLT_CORE_FILEIO_H
#define COLT_CORE_FILEIO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* Reads a whole regular file; *data is NUL-terminated (not counted in *len).
 * A FIFO, directory, device or socket is an error ("X: not a regular file
 * (a FIFO)"), reported at once. */
int file_read_all(const char *path, char **data, size_t *len, char *err);

/* The check above for readers that need the descriptor itself (pread of
 * parts of a large file): opens path O_RDONLY|O_NONBLOCK|O_CLOEXEC, requires a
 * regular file, sets *size. Returns the descriptor (close it) or -1 with err
 * set. */
int file_open_regular(const char *path, size_t *size, char *err);

bool file_exists(const char *path);

/* Read-only memory map of a whole regular file (same refusal as above). */
typedef struct MappedFile {
    void *data;   /* NULL for an empty file */
    size_t size;
} MappedFile;
int file_map(MappedFile *mf, const char *path, char *err);
void file_unmap(MappedFile *mf);

/* The output-path check of atomic_open without opening anything, for callers
 * that want to refuse a bad path before hours of work (colt eval --output). */
int file_check_output(const char *path, char *err);

/* Writes len bytes to path atomically. */
int file_write_atomic(const char *path, const void *data, size_t len, char *err);

/* Streaming atomic write: open, atomic_write (or fwrite to .fp), then commit
 * (rename) or abort (remove the temporary file). */
typedef struct AtomicFile {
    FILE *fp;
    char *path;     /* as the caller gave it (for messages) */
    char *target;   /* where it lands: path, or the end of its symbolic links */
    char *tmp_path; /* "<target>.tmp.<pid>", beside the target so rename stays in one file system */
    int error;      /* errno of the first failed atomic_write, 0 if none */
} AtomicFile;
int atomic_open(AtomicFile *af, const char *path, char *err);
/* fwrite that keeps the system's reason; on error call atomic_abort. */
int atomic_write(AtomicFile *af, const void *data, size_t len, char *err);
/* Flushes, fsyncs, closes and renames; any failure (including an earlier
 * failed write) removes the temporary file and returns -1 with err set to
 * "<path>: write failed: <strerror>". af is finished either way. */
int atomic_commit(AtomicFile *af, char *err);
void atomic_abort(AtomicFile *af);

/* Appends line (and a newline if it lacks one) to an open log such as
 * metrics.jsonl, then fflushes, so a full disk is reported at the line that
 * hit it ("<path>: cannot append: No space left on device"). No fsync: this
 * is for logs written every step. */
int file_append_line(FILE *fp, const char *path, const char *line, char *err);

/* Opens a log for appending (created if missing, written through a symbolic
 * link); a FIFO, device or socket is refused before opening, as for atomic
 * writes. NULL with err set on failure. */
FILE *file_open_append(const char *path, char *err);

/* Returns a newly allocated "dir/name". */
char *path_join(const char *dir, const char *name);

/* Creates a directory (and parents) if missing. */
int make_dirs(const char *path, char *err);

#endif
