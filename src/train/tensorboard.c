/* tensorboard.c — see tensorboard.h. Without protobuf-c (COLT_HAVE_PROTOBUF_C
 * unset) the writer cannot pack events: opening one is an error saying how to
 * build it in, and train_config refuses report_to: tensorboard up front. */
#include "train/tensorboard.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fileio.h"

#ifdef COLT_HAVE_PROTOBUF_C
#include "tensorboard_event.pb-c.h"
#endif

struct TensorboardWriter {
    FILE *fp;
    char *path;
    double fixed_wall_time; /* NaN: the clock */
    uint8_t *buf;           /* a packed event */
    size_t buf_cap;
};

/* ---------------------------------------------------------------- CRC32C */

uint32_t tensorboard_crc32c(const void *data, size_t n) {
    const uint8_t *p = data;
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < n; i++) {
        crc ^= p[i];
        for (int b = 0; b < 8; b++) crc = (crc >> 1) ^ (0x82F63B78u & (0u - (crc & 1u)));
    }
    return crc ^ 0xFFFFFFFFu;
}

uint32_t tensorboard_masked_crc(uint32_t crc) { return ((crc >> 15) | (crc << 17)) + 0xa282ead8u; }

static void put_le32(uint8_t *out, uint32_t v) {
    for (int i = 0; i < 4; i++) out[i] = (uint8_t)(v >> (8 * i));
}

/* ---------------------------------------------------------------- files */

bool tensorboard_available(void) {
#ifdef COLT_HAVE_PROTOBUF_C
    return true;
#else
    return false;
#endif
}

char *tensorboard_log_dir(const char *output_dir, const char *logging_dir) {
    const char *env = getenv("TENSORBOARD_LOGGING_DIR");
    if (env && *env) return xstrdup(env);
    if (logging_dir && *logging_dir) return xstrdup(logging_dir);
    /* transformers' default_logdir(): runs/<datetime.now():%b%d_%H-%M-%S>_<hostname> */
    char host[256] = "localhost", stamp[64], name[400];
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    time_t now = time(NULL);
    struct tm local;
    localtime_r(&now, &local);
    strftime(stamp, sizeof stamp, "%b%d_%H-%M-%S", &local);
    snprintf(name, sizeof name, "runs/%s_%s", stamp, host);
    return path_join(output_dir, name);
}

static double wall_time(const TensorboardWriter *w) {
    if (!isnan(w->fixed_wall_time)) return w->fixed_wall_time;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One record: length, its masked CRC, the data, the data's masked CRC. */
static int write_record(TensorboardWriter *w, const uint8_t *data, size_t n, char *err) {
    uint8_t header[12], footer[4];
    for (int i = 0; i < 8; i++) header[i] = (uint8_t)((uint64_t)n >> (8 * i));
    put_le32(header + 8, tensorboard_masked_crc(tensorboard_crc32c(header, 8)));
    put_le32(footer, tensorboard_masked_crc(tensorboard_crc32c(data, n)));
    if (fwrite(header, 1, sizeof header, w->fp) != sizeof header || fwrite(data, 1, n, w->fp) != n ||
        fwrite(footer, 1, sizeof footer, w->fp) != sizeof footer)
        return errorf(err, "%s: cannot write: %s", w->path, strerror(errno));
    return COLT_OK;
}

#ifdef COLT_HAVE_PROTOBUF_C
static int write_event(TensorboardWriter *w, const Tensorboard__Event *e, char *err) {
    size_t n = tensorboard__event__get_packed_size(e);
    if (n > w->buf_cap) {
        w->buf_cap = n * 2;
        w->buf = xrealloc(w->buf, w->buf_cap);
    }
    COLT_ASSERT(tensorboard__event__pack(e, w->buf) == n);
    return write_record(w, w->buf, n, err);
}
#endif

static void writer_free(TensorboardWriter *w) {
    if (!w) return;
    if (w->fp) fclose(w->fp);
    free(w->path);
    free(w->buf);
    free(w);
}

/* Wraps an open descriptor and writes the file_version event. */
static int writer_start(TensorboardWriter **out, int fd, const char *path, double fixed_wall_time, char *err) {
    TensorboardWriter *w = xcalloc(1, sizeof *w);
    w->path = xstrdup(path);
    w->fixed_wall_time = fixed_wall_time;
    w->fp = fdopen(fd, "wb");
    if (!w->fp) {
        int e = errno;
        close(fd);
        writer_free(w);
        return errorf(err, "%s: cannot open: %s", path, strerror(e));
    }
#ifdef COLT_HAVE_PROTOBUF_C
    Tensorboard__Event e = TENSORBOARD__EVENT__INIT;
    e.wall_time = wall_time(w);
    e.what_case = TENSORBOARD__EVENT__WHAT_FILE_VERSION;
    e.file_version = "brain.Event:2";
    if (write_event(w, &e, err) != 0 || tensorboard_flush(w, err) != 0) {
        writer_free(w);
        return COLT_ERR;
    }
#endif
    *out = w;
    return COLT_OK;
}

static int unavailable(char *err) {
    return errorf(err, "report_to tensorboard: this colt was built without protobuf-c, which writes the event files "
                       "(apt-get install libprotobuf-c-dev protobuf-c-compiler, or scripts/setup.sh, then rebuild)");
}

int tensorboard_open(TensorboardWriter **out, const char *log_dir, char *err) {
    *out = NULL;
    if (!tensorboard_available()) return unavailable(err);
    if (make_dirs(log_dir, err) != 0) return error_prefix(err, "report_to tensorboard");
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    long long now = (long long)time(NULL);
    for (int k = 0; k < 1000; k++) {
        char name[400];
        snprintf(name, sizeof name, "events.out.tfevents.%010lld.%s.%ld.%d", now, host, (long)getpid(), k);
        char *path = path_join(log_dir, name);
        int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
        if (fd < 0 && errno == EEXIST) {
            free(path);
            continue;
        }
        int rc = fd < 0 ? errorf(err, "%s: cannot create: %s", path, strerror(errno))
                        : writer_start(out, fd, path, NAN, err);
        free(path);
        return rc;
    }
    return errorf(err, "%s: 1000 event files of this second and process exist already", log_dir);
}

int tensorboard_open_file(TensorboardWriter **out, const char *path, double wall_time_fixed, char *err) {
    *out = NULL;
    if (!tensorboard_available()) return unavailable(err);
    if (file_check_output(path, err) != 0) return COLT_ERR; /* no truncating a device or a FIFO */
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return errorf(err, "%s: cannot create: %s", path, strerror(errno));
    return writer_start(out, fd, path, wall_time_fixed, err);
}

const char *tensorboard_path(const TensorboardWriter *w) { return w->path; }

int tensorboard_add_scalar(TensorboardWriter *w, const char *tag, double value, int64_t step, char *err) {
#ifdef COLT_HAVE_PROTOBUF_C
    Tensorboard__Summary__Value v = TENSORBOARD__SUMMARY__VALUE__INIT;
    v.tag = (char *)tag;
    v.value_case = TENSORBOARD__SUMMARY__VALUE__VALUE_SIMPLE_VALUE;
    v.simple_value = (float)value;
    Tensorboard__Summary__Value *values[1] = {&v};
    Tensorboard__Summary s = TENSORBOARD__SUMMARY__INIT;
    s.n_value = 1;
    s.value = values;
    Tensorboard__Event e = TENSORBOARD__EVENT__INIT;
    e.wall_time = wall_time(w);
    e.step = step;
    e.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
    e.summary = &s;
    return write_event(w, &e, err);
#else
    (void)w, (void)tag, (void)value, (void)step;
    return unavailable(err);
#endif
}

int tensorboard_add_metrics(TensorboardWriter *w, json_t *line, char *err) {
    json_t *step = json_object_get(line, "step");
    if (!json_is_integer(step)) return errorf(err, "%s: a metrics line without an integer step", w->path);
    const char *key;
    json_t *v;
    json_object_foreach(line, key, v) {
        if (strcmp(key, "step") == 0 || !json_is_number(v)) continue;
        /* transformers' rewrite_logs: eval_<x> -> eval/<x>, the rest under train/ */
        char tag[256];
        if (strncmp(key, "eval_", 5) == 0) snprintf(tag, sizeof tag, "eval/%s", key + 5);
        else snprintf(tag, sizeof tag, "train/%s", key);
        if (tensorboard_add_scalar(w, tag, json_number_value(v), json_integer_value(step), err) != 0) return COLT_ERR;
    }
    return tensorboard_flush(w, err);
}

int tensorboard_flush(TensorboardWriter *w, char *err) {
    if (fflush(w->fp) != 0) return errorf(err, "%s: cannot write: %s", w->path, strerror(errno));
    return COLT_OK;
}

int tensorboard_close(TensorboardWriter *w, char *err) {
    if (!w) return COLT_OK;
    int rc = fflush(w->fp) != 0 ? errorf(err, "%s: cannot write: %s", w->path, strerror(errno)) : COLT_OK;
    if (fclose(w->fp) != 0 && rc == 0) rc = errorf(err, "%s: cannot write: %s", w->path, strerror(errno));
    w->fp = NULL;
    writer_free(w);
    return rc;
}
