/* fileio.c — see fileio.h. POSIX only. */
#define _POSIX_C_SOURCE 200809L
#include "core/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/error.h"

/* What a non-regular file is, for "X: not a regular file (a FIFO)". */
static const char *file_kind(mode_t mode) {
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISDIR(mode)) return "a directory";
    if (S_ISCHR(mode)) return "a character device";
    if (S_ISBLK(mode)) return "a block device";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a plain file";
}

/* Opens path for reading and requires a regular file. O_NONBLOCK because
 * opening a FIFO would otherwise wait forever for a writer; it changes nothing
 * for regular files. Returns the descriptor, or -1 with err set. */
static int open_regular(const char *path, struct stat *st, char *err) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        /* a socket cannot be opened at all (ENXIO): say what it is instead */
        if (stat(path, st) == 0 && !S_ISREG(st->st_mode))
            return errorf(err, "%s: not a regular file (%s)", path, file_kind(st->st_mode));
        return errorf(err, "%s: cannot open: %s", path, strerror(e));
    }
    if (fstat(fd, st) != 0) {
        int e = errno;
        close(fd);
        return errorf(err, "%s: cannot stat: %s", path, strerror(e));
    }
    if (!S_ISREG(st->st_mode)) {
        close(fd);
        return errorf(err, "%s: not a regular file (%s)", path, file_kind(st->st_mode));
    }
    return fd;
}

int file_open_regular(const char *path, size_t *size, char *err) {
    struct stat st;
    int fd = open_regular(path, &st, err);
    if (fd >= 0 && size) *size = (size_t)st.st_size;
    return fd;
}

static char *output_target(const char *path, char *err);

FILE *file_open_append(const char *path, char *err) {
    /* Checked before open: opening a device can have effects of its own (a
     * tape rewinds, a terminal becomes ours), and a FIFO without a reader fails
     * with ENXIO, which says nothing useful. */
    char *target = output_target(path, err);
    if (!target) return NULL;
    free(target);
    int fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0) {
        errorf(err, "%s: cannot open for appending: %s", path, strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        errorf(err, "%s: cannot stat: %s", path, strerror(errno));
        close(fd);
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) { /* replaced between the check and open */
        errorf(err, "%s: not a regular file (%s); colt writes only regular files: give another path", path,
               file_kind(st.st_mode));
        close(fd);
        return NULL;
    }
    fcntl(fd, F_SETFL, O_WRONLY | O_APPEND); /* writes may block again, as for any file */
    FILE *fp = fdopen(fd, "a");
    if (!fp) {
        errorf(err, "%s: cannot open for appending: %s", path, strerror(errno));
        close(fd);
    }
    return fp;
}

int file_read_all(const char *path, char **data, size_t *len, char *err) {
    *data = NULL;
    if (len) *len = 0;
    struct stat st;
    int fd = open_regular(path, &st, err);
    if (fd < 0) return COLT_ERR;
    size_t size = (size_t)st.st_size, got = 0;
    char *buf = xmalloc(size + 1);
    while (got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) {
            int e = errno;
            close(fd);
            free(buf);
            return errorf(err, "%s: cannot read: %s", path, strerror(e));
        }
        if (r == 0) break;
        got += (size_t)r;
    }
    close(fd);
    if (got != size) {
        free(buf);
        return errorf(err, "%s: read %zu of %zu bytes (the file changed while being read)", path, got, size);
    }
    buf[size] = '\0';
    *data = buf;
    if (len) *len = size;
    return COLT_OK;
}

bool file_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

int file_map(MappedFile *mf, const char *path, char *err) {
    mf->data = NULL;
    mf->size = 0;
    struct stat st;
    int fd = open_regular(path, &st, err);
    if (fd < 0) return COLT_ERR;
    mf->size = (size_t)st.st_size;
    if (mf->size > 0) {
        void *p = mmap(NULL, mf->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            int e = errno;
            close(fd);
            mf->size = 0;
            return errorf(err, "%s: cannot map: %s", path, strerror(e));
        }
        mf->data = p;
    }
    close(fd);
    return COLT_OK;
}

void file_unmap(MappedFile *mf) {
    if (mf->data) munmap(mf->data, mf->size);
    mf->data = NULL;
    mf->size = 0;
}

/* Where a write to path lands. A missing path or a regular file: path itself.
 * A symbolic link: its final target (relative links resolved against the
 * link's folder), so the link survives and its target gets the new contents
 * (a missing target is created, as the shell's `>` does). Anything else there,
 * or at the end of the links (device, FIFO, socket, directory), is refused:
 * renaming over it would replace /dev/null or someone's pipe with a file.
 * Returns a malloc'd path, or NULL with err set. */
static char *output_target(const char *path, char *err) {
    char *cur = xstrdup(path);
    for (int hops = 0;; hops++) {
        struct stat st;
        if (lstat(cur, &st) != 0) {
            if (errno != ENOENT) {
                errorf(err, "%s: cannot write: %s", path, strerror(errno));
                break;
            }
            /* Missing: a new file, or a dangling link's target to create,
             * unless the kernel reaches something where our reading of the
             * links finds nothing: /proc's links (/dev/stdout to "pipe:[N]") */
            struct stat real;
            if (hops == 0 || stat(path, &real) != 0) return cur;
            errorf(err, "%s: leads to %s; colt writes only regular files: give another path", path,
                   S_ISREG(real.st_mode) ? "a file it cannot name" : file_kind(real.st_mode));
            break;
        }
        if (S_ISREG(st.st_mode)) return cur;
        if (!S_ISLNK(st.st_mode)) {
            if (strcmp(cur, path) == 0)
                errorf(err, "%s: not a regular file (%s); colt writes only regular files: give another path", path,
                       file_kind(st.st_mode));
            else
                errorf(err, "%s: a link to %s, which is not a regular file (%s); colt writes only regular files: "
                            "give another path", path, cur, file_kind(st.st_mode));
            break;
        }
        if (hops == 40) {
            errorf(err, "%s: cannot write: %s", path, strerror(ELOOP));
            break;
        }
        size_t cap = (size_t)st.st_size + 2; /* st_size is the link's length; +1 detects growth */
        char *link = xmalloc(cap);
        ssize_t n = readlink(cur, link, cap);
        if (n < 0 || (size_t)n >= cap) {
            errorf(err, "%s: cannot read the link %s: %s", path, cur, n < 0 ? strerror(errno) : "it changed");
            free(link);
            break;
        }
        link[n] = '\0';
        char *next;
        const char *slash = strrchr(cur, '/');
        if (link[0] == '/' || !slash) {
            next = link;
        } else {
            size_t d = (size_t)(slash - cur) + 1;
            next = xmalloc(d + (size_t)n + 1);
            memcpy(next, cur, d);
            memcpy(next + d, link, (size_t)n + 1);
            free(link);
        }
        free(cur);
        cur = next;
    }
    free(cur);
    return NULL;
}

int file_check_output(const char *path, char *err) {
    char *target = output_target(path, err);
    free(target);
    return target ? COLT_OK : COLT_ERR;
}

int atomic_open(AtomicFile *af, const char *path, char *err) {
    af->fp = NULL;
    af->path = af->target = af->tmp_path = NULL;
    af->error = 0;
    char *target = output_target(path, err);
    if (!target) return COLT_ERR;
    af->path = xstrdup(path);
    af->target = target;
    size_t n = strlen(target) + 32;
    af->tmp_path = xmalloc(n);
    snprintf(af->tmp_path, n, "%s.tmp.%ld", target, (long)getpid());
    af->fp = fopen(af->tmp_path, "wb");
    if (!af->fp) {
        int e = errno;
        free(af->path);
        free(af->target);
        free(af->tmp_path);
        af->path = af->target = af->tmp_path = NULL;
        return errorf(err, "%s: cannot write: %s", path, strerror(e));
    }
    return COLT_OK;
}

int atomic_write(AtomicFile *af, const void *data, size_t len, char *err) {
    if (af->error) return errorf(err, "%s: write failed: %s", af->path, strerror(af->error));
    errno = 0;
    if (len == 0 || fwrite(data, 1, len, af->fp) == len) return COLT_OK;
    af->error = errno ? errno : EIO; /* keep the first failure for atomic_commit */
    return errorf(err, "%s: write failed: %s", af->path, strerror(af->error));
}

int atomic_commit(AtomicFile *af, char *err) {
    /* The first failure wins: a failed fwrite often shows up only at fflush
     * (ENOSPC, EFBIG), and fclose must run whatever happened. */
    int e = af->error;
    const char *what = "write failed";
    if (fflush(af->fp) != 0 && !e) e = errno;
    if (!e && ferror(af->fp)) e = EIO; /* a caller's own fwrite failed and its errno is gone */
    if (!e && fsync(fileno(af->fp)) != 0) e = errno, what = "fsync failed";
    if (fclose(af->fp) != 0 && !e) e = errno, what = "close failed";
    af->fp = NULL;
    int rc = COLT_OK;
    char *target = NULL;
    if (e) {
        rc = errorf(err, "%s: %s: %s", af->path, what, strerror(e));
        remove(af->tmp_path);
    } else if (!(target = output_target(af->path, err)) || strcmp(target, af->target) != 0) {
        /* what is at the path changed while we wrote (a FIFO or a link put
         * there since atomic_open): do not rename over it */
        if (target) errorf(err, "%s: changed while being written (now leads to %s); not replaced", af->path, target);
        rc = COLT_ERR;
        remove(af->tmp_path);
    } else if (rename(af->tmp_path, af->target) != 0) {
        rc = errorf(err, "%s: cannot rename into place: %s", af->path, strerror(errno));
        remove(af->tmp_path);
    }
    free(target);
    free(af->path);
    free(af->target);
    free(af->tmp_path);
    af->path = af->target = af->tmp_path = NULL;
    return rc;
}

void atomic_abort(AtomicFile *af) {
    if (af->fp) fclose(af->fp);
    if (af->tmp_path) remove(af->tmp_path);
    free(af->path);
    free(af->target);
    free(af->tmp_path);
    af->fp = NULL;
    af->path = af->target = af->tmp_path = NULL;
}

int file_write_atomic(const char *path, const void *data, size_t len, char *err) {
    AtomicFile af;
    if (atomic_open(&af, path, err) != 0) return COLT_ERR;
    if (atomic_write(&af, data, len, err) != 0) {
        atomic_abort(&af);
        return COLT_ERR;
    }
    return atomic_commit(&af, err);
}

int file_append_line(FILE *fp, const char *path, const char *line, char *err) {
    size_t n = strlen(line);
    errno = 0;
    int ok = fwrite(line, 1, n, fp) == n;
    if (ok && (n == 0 || line[n - 1] != '\n')) ok = fputc('\n', fp) != EOF;
    if (ok) ok = fflush(fp) == 0;
    if (!ok) {
        int e = errno ? errno : EIO;
        clearerr(fp); /* so a later line can succeed once the disk has room again */
        return errorf(err, "%s: cannot append: %s", path, strerror(e));
    }
    return COLT_OK;
}

char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = xmalloc(a + b + 2);
    memcpy(p, dir, a);
    size_t k = a;
    if (a > 0 && dir[a - 1] != '/') p[k++] = '/';
    memcpy(p + k, name, b + 1);
    return p;
}

int make_dirs(const char *path, char *err) {
    char *p = xstrdup(path);
    for (char *s = p + 1; *s; s++) {
        if (*s != '/') continue;
        *s = '\0';
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            int e = errno;
            int rc = errorf(err, "%s: cannot create directory: %s", p, strerror(e));
            free(p);
            return rc;
        }
        *s = '/';
    }
    int rc = COLT_OK;
    if (mkdir(p, 0755) != 0 && errno != EEXIST) rc = errorf(err, "%s: cannot create directory: %s", p, strerror(errno));
    free(p);
    return rc;
}
