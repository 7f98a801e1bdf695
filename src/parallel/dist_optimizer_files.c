/* dist_optimizer_files.c — the optimizer's files in a checkpoint
 * (dist_optimizer.h): one file of the whole state, one per tensor-parallel
 * part, or one per data-parallel shard with a list of them, and loading any
 * of these back (a sharded state at any world size). Not the rest of a
 * checkpoint (train/trainer_checkpoint.c) nor the tensors' format (optim.c). */
#include "parallel/dist_optimizer.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/error.h"
#include "core/fileio.h"

static bool tensor_parallel(const DistOptimizer *o) { return o->tp && o->tp->tensor_parallel_size > 1; }

/* An unsharded optimizer's file: one, or one per part under tensor parallelism
 * (a checkpoint resumes at the same tensor_parallel_size). */
static void optimizer_file_name(const DistOptimizer *o, char *buf, size_t size) {
    if (tensor_parallel(o))
        snprintf(buf, size, "optimizer-tp%05d-of-%05d.safetensors", o->tp->tensor_parallel_rank, o->tp->tensor_parallel_size);
    else
        snprintf(buf, size, "optimizer.safetensors");
}

/* The optimizer shard file of data-parallel rank r in a checkpoint of a
 * sharded run (of this rank's part under tensor parallelism). */
static void shard_file_name(const DistOptimizer *o, char *buf, size_t size, int rank, int world) {
    if (tensor_parallel(o))
        snprintf(buf, size, "optimizer-tp%05d-rank%05d-of-%05d.safetensors", o->tp->tensor_parallel_rank, rank, world);
    else
        snprintf(buf, size, "optimizer-rank%05d-of-%05d.safetensors", rank, world);
}

/* The list of a sharded run's shard files: one, or one per part under tensor parallelism. */
static void manifest_name(const DistOptimizer *o, char *buf, size_t size) {
    if (tensor_parallel(o))
        snprintf(buf, size, "optimizer_shards-tp%05d-of-%05d.json", o->tp->tensor_parallel_rank, o->tp->tensor_parallel_size);
    else
        snprintf(buf, size, "optimizer_shards.json");
}

/* The temporary folder carries rank 0's pid (a stale one is recognised as
 * such): every rank that writes into it learns it. */
int dist_optimizer_rank0_pid(DistOptimizer *o, long *pid_out, char *err) {
    bool sharded = optim_is_sharded(o->opt), tp = tensor_parallel(o);
    long pid = (long)getpid();
    int rc = COLT_OK;
    if (sharded) {
        long *pids = xcalloc((size_t)o->dist->world, sizeof(long));
        rc = train_dist_agree(o->dist, train_dist_gather(o->dist, pids, &pid, sizeof pid, err), err);
        pid = pids[0];
        free(pids);
        if (rc != 0) return rc;
    }
    if (tp) { /* every rank of the launch writes into rank 0's folder */
        long *pids = xcalloc((size_t)o->dist->all_world, sizeof(long));
        rc = train_dist_agree(o->dist, comm_all_gather(o->dist->all, pids, &pid, sizeof pid, COMM_BYTE, NULL, err), err);
        pid = pids[0];
        free(pids);
    }
    *pid_out = pid;
    return rc;
}

/* A sharded optimizer's state: every rank its shard into dir, then rank 0
 * the list of them (collective; rc: the folder's outcome so far). */
static int save_shards(DistOptimizer *o, const char *dir, int64_t step, int rc, char *err) {
    rc = train_dist_agree(o->dist, rc, err); /* the folder exists */
    if (rc == 0) {
        char file[64];
        shard_file_name(o, file, sizeof file, o->dist->rank, o->dist->world);
        char *path = path_join(dir, file);
        rc = train_dist_agree(o->dist, optim_save_shard(o->opt, path, err), err);
        free(path);
    }
    if (rc == 0 && o->dist->rank == 0) {
        json_t *m = json_object(), *files = json_array();
        json_object_set_new(m, "format", json_string("colt-adamw-shards"));
        json_object_set_new(m, "world_size", json_integer(o->dist->world));
        json_object_set_new(m, "step", json_integer(step));
        for (int r = 0; r < o->dist->world; r++) {
            char file[64];
            shard_file_name(o, file, sizeof file, r, o->dist->world);
            json_array_append_new(files, json_string(file));
        }
        json_object_set_new(m, "files", files);
        char manifest[64];
        manifest_name(o, manifest, sizeof manifest);
        char *text = json_dumps(m, JSON_INDENT(1)), *path = path_join(dir, manifest);
        rc = file_write_atomic(path, text, strlen(text), err);
        free(text), free(path);
        json_decref(m);
    }
    if (tensor_parallel(o)) rc = train_dist_agree(o->dist, rc, err); /* every part's list is there before the rename */
    return rc;
}

int dist_optimizer_save(DistOptimizer *o, const char *dir, int64_t step, int rc, char *err) {
    if (rc == 0 && !optim_is_sharded(o->opt) && o->dist->rank == 0) {
        /* tensor parallel: the first group's ranks, each its part's */
        char file[64];
        optimizer_file_name(o, file, sizeof file);
        char *path = path_join(dir, file);
        rc = optim_save(o->opt, path, err);
        free(path);
    }
    if (tensor_parallel(o)) rc = train_dist_agree(o->dist, rc, err); /* every part's optimizer state is in the folder */
    if (optim_is_sharded(o->opt)) rc = save_shards(o, dir, step, rc, err);
    return rc;
}

/* Loads the optimizer state of checkpoint ckpt into this rank's optimizer:
 * optimizer.safetensors (an unsharded run's) or the shards listed in
 * optimizer_shards.json (a sharded run's, at any world size). */
int dist_optimizer_load(DistOptimizer *o, const char *ckpt, int saved_tensor_parallel_size, char *err) {
    char file[64], list[64];
    optimizer_file_name(o, file, sizeof file);
    manifest_name(o, list, sizeof list);
    char *whole = path_join(ckpt, file), *manifest = path_join(ckpt, list);
    int rc = COLT_OK;
    if (file_exists(whole)) rc = optim_load(o->opt, whole, err);
    else if (!file_exists(manifest)) {
        int saved_tp = saved_tensor_parallel_size,
            tensor_parallel_size = tensor_parallel(o) ? o->tp->tensor_parallel_size : 1;
        if (saved_tp > 0 && saved_tp != tensor_parallel_size)
            rc = errorf(err, "%s: no optimizer state for tensor_parallel_size %d: the checkpoint was saved with "
                             "tensor_parallel_size %d (optimizer-tp*-of-%05d files); resume it with "
                             "--tensor_parallel_size %d in a launch of a multiple of %d processes (e.g. "
                             "--nproc_per_node %d, or mpirun -np %d), or start a new run from its weights with "
                             "--model %s",
                        ckpt, tensor_parallel_size, saved_tp, saved_tp, saved_tp, saved_tp, saved_tp, saved_tp, ckpt);
        else
            rc = errorf(err, "%s: no optimizer state (neither %s nor %s)%s", ckpt, file, list,
                        tensor_parallel(o) ? ": a checkpoint resumes at the tensor_parallel_size that saved it" : "");
    } else {
        json_error_t jerr;
        json_t *m = json_load_file(manifest, 0, &jerr), *files = json_object_get(m, "files");
        size_t n = json_array_size(files);
        if (!m) rc = errorf(err, "%s line %d: %s", manifest, jerr.line, jerr.text);
        else if (n == 0 || json_integer_value(json_object_get(m, "world_size")) != (json_int_t)n)
            rc = errorf(err, "%s: 'files' must list world_size shard files", manifest);
        char **paths = xcalloc(n ? n : 1, sizeof(char *));
        for (size_t i = 0; rc == 0 && i < n; i++) {
            const char *f = json_string_value(json_array_get(files, i));
            if (!f || strchr(f, '/')) rc = errorf(err, "%s: files[%zu] is not a file name", manifest, i);
            else {
                paths[i] = path_join(ckpt, f);
                if (!file_exists(paths[i]))
                    rc = errorf(err, "%s: optimizer shard %s is missing (the checkpoint of a %zu-rank run is "
                                     "incomplete)",
                                ckpt, f, n);
            }
        }
        if (rc == 0) rc = optim_load_shards(o->opt, (const char *const *)paths, (int)n, err);
        for (size_t i = 0; i < n; i++) free(paths[i]);
        free(paths);
        json_decref(m);
    }
    free(whole), free(manifest);
    return rc;
}

