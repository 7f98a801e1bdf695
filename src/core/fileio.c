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

int file_read_all(const char *path, char **data, size_t *len, char *err) {
    *data = NULL;
    if (len) *len = 0;
    FILE *fp = fopen(path, "rb");
    if (!fp) return errorf(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(fp), &st) != 0 || !S_ISREG(st.st_mode)) {
        fclose(fp);
        return errorf(err, "%s: not a regular file", path);
    }
    size_t size = (size_t)st.st_size;
    char *buf = xmalloc(size + 1);
    size_t got = fread(buf, 1, size, fp);
    fclose(fp);
    if (got != size) {
        free(buf);
        return errorf(err, "%s: read %zu of %zu bytes", path, got, size);
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
    int fd = open(path, O_RDONLY);
    if (fd < 0) return errorf(err, "%s: cannot open: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return errorf(err, "%s: not a regular file", path);
    }
    mf->size = (size_t)st.st_size;
    if (mf->size > 0) {
        void *p = mmap(NULL, mf->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (p == MAP_FAILED) {
            close(fd);
            mf->size = 0;
            return errorf(err, "%s: cannot map: %s", path, strerror(errno));
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

int atomic_open(AtomicFile *af, const char *path, char *err) {
    af->path = xstrdup(path);
    size_t n = strlen(path) + 32;
    af->tmp_path = xmalloc(n);
    snprintf(af->tmp_path, n, "%s.tmp.%ld", path, (long)getpid());
    af->fp = fopen(af->tmp_path, "wb");
    if (!af->fp) {
        int e = errno;
        free(af->path);
        free(af->tmp_path);
        af->path = af->tmp_path = NULL;
        return errorf(err, "%s: cannot write: %s", path, strerror(e));
    }
    return COLT_OK;
}

int atomic_commit(AtomicFile *af, char *err) {
    int bad = ferror(af->fp);
    if (fflush(af->fp) != 0) bad = 1;
    if (!bad && fsync(fileno(af->fp)) != 0) bad = 1;
    if (fclose(af->fp) != 0) bad = 1;
    af->fp = NULL;
    int rc = COLT_OK;
    if (bad) {
        rc = errorf(err, "%s: write failed: %s", af->path, strerror(errno));
        remove(af->tmp_path);
    } else if (rename(af->tmp_path, af->path) != 0) {
        rc = errorf(err, "%s: cannot rename into place: %s", af->path, strerror(errno));
        remove(af->tmp_path);
    }
    free(af->path);
    free(af->tmp_path);
    af->path = af->tmp_path = NULL;
    return rc;
}

void atomic_abort(AtomicFile *af) {
    if (af->fp) fclose(af->fp);
    if (af->tmp_path) remove(af->tmp_path);
    free(af->path);
    free(af->tmp_path);
    af->fp = NULL;
    af->path = af->tmp_path = NULL;
}

int file_write_atomic(const char *path, const void *data, size_t len, char *err) {
    AtomicFile af;
    if (atomic_open(&af, path, err) != 0) return COLT_ERR;
    if (len && fwrite(data, 1, len, af.fp) != len) {
        atomic_abort(&af);
        return errorf(err, "%s: write failed", path);
    }
    return atomic_commit(&af, err);
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
