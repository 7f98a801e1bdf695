/* tensorboard.h — TensorBoard event files for `report_to: tensorboard`,
 * written beside metrics.jsonl with what it holds, as transformers'
 * TensorBoardCallback writes them: one Event per scalar, tagged
 * "train/<metric>" ("eval_<x>" keys as "eval/<x>", as its rewrite_logs does),
 * at the optimizer step.
 *
 * The file is TensorBoard's record format (TFRecord framing): per record the
 * data's length (uint64, little-endian), the masked CRC32C of those 8 bytes,
 * the data (a serialized Event), the masked CRC32C of the data. Events are
 * packed by protobuf-c from tensorboard_event.proto, a committed subset of
 * TensorBoard's event.proto and summary.proto with their field numbers. CRC32C
 * is computed here, bit by bit: Debian 12 packages no C library for it
 * (libcrc32c is not packaged; ISA-L would be a large dependency for one
 * checksum of a few hundred bytes per logging step).
 *
 * The file grows as the run logs and is flushed at every logging step, as
 * metrics.jsonl is: TensorBoard reads event files while they grow, so they are
 * not written to a temporary name. Not a reader (the tests have their own) and
 * not images, histograms or text. */
#ifndef COLT_TRAIN_TENSORBOARD_H
#define COLT_TRAIN_TENSORBOARD_H

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct TensorboardWriter TensorboardWriter;

/* Whether this build can write event files (it was built with protobuf-c). */
bool tensorboard_available(void);

/* The folder a run's events go to, as transformers chooses it:
 * $TENSORBOARD_LOGGING_DIR when set, else logging_dir (older transformers'
 * setting; may be NULL), else output_dir/runs/<Mon DD_HH-MM-SS>_<hostname>.
 * malloc'd. */
char *tensorboard_log_dir(const char *output_dir, const char *logging_dir);

/* Creates log_dir (and parents) and a new file
 * events.out.tfevents.<seconds>.<hostname>.<pid>.<n> in it (n: the first that
 * does not exist), starting with the file_version event "brain.Event:2". */
int tensorboard_open(TensorboardWriter **out, const char *log_dir, char *err);

/* For tests: the file at path (replaced if present), every event stamped
 * wall_time instead of the clock. */
int tensorboard_open_file(TensorboardWriter **out, const char *path, double wall_time, char *err);

/* The event file's path. */
const char *tensorboard_path(const TensorboardWriter *w);

/* One scalar (stored as a 32-bit float, TensorBoard's simple_value). */
int tensorboard_add_scalar(TensorboardWriter *w, const char *tag, double value, int64_t step, char *err);

/* Mirrors one metrics.jsonl line ({"step": N, "reward": ..., ...}): every
 * number but "step" becomes a scalar at step N, in the line's order; nulls and
 * other values are skipped (transformers skips what is not a number too). Then
 * flushes. A line without an integer "step" is an error. */
int tensorboard_add_metrics(TensorboardWriter *w, json_t *line, char *err);

/* Flushes what was written to the file. */
int tensorboard_flush(TensorboardWriter *w, char *err);

/* Flushes and closes; w may be NULL; err may be NULL. */
int tensorboard_close(TensorboardWriter *w, char *err);

/* CRC32C (Castagnoli, reflected polynomial 0x82F63B78) of n bytes, and the
 * mask TFRecord stores: ((crc >> 15) | (crc << 17)) + 0xa282ead8. */
uint32_t tensorboard_crc32c(const void *data, size_t n);
uint32_t tensorboard_masked_crc(uint32_t crc);

#endif
