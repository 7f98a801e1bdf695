/* backend_select.c — opening a backend instance by name (--device). In a
 * build without CUDA the CUDA entry points exist and say there is no GPU. */
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"

Backend *backend_cpu_open(void); /* cpu/cpu_backend.c */

#ifndef COLT_HAVE_CUDA
const Backend *backend_cuda(void) { return NULL; }
const Backend *backend_cuda_f32(void) { return NULL; }
Backend *backend_cuda_open(int device, DType storage, char *err) {
    (void)device, (void)storage;
    errorf(err, "this colt was built without CUDA (cmake -DCOLT_CUDA=ON)");
    return NULL;
}
void backend_cuda_close(Backend *be) { (void)be; }
int backend_cuda_device_count(void) { return 0; }
#endif

Backend *backend_open(const char *kind, int device, char *err) {
    if (!kind || strcmp(kind, "auto") == 0) {
        char cuda_err[ERR_LEN];
        Backend *be = backend_cuda_open(device, DTYPE_BF16, cuda_err);
        return be ? be : backend_cpu_open();
    }
    if (strcmp(kind, "cpu") == 0) return backend_cpu_open();
    if (strcmp(kind, "cuda") == 0 || strcmp(kind, "cuda_f32") == 0) {
        Backend *be = backend_cuda_open(device, strcmp(kind, "cuda") == 0 ? DTYPE_BF16 : DTYPE_F32, err);
        if (!be) error_prefix(err, "--device %s", kind);
        return be;
    }
    errorf(err, "--device: unknown device '%s' (cpu, cuda, cuda_f32 or auto)", kind);
    return NULL;
}

int backend_gpu_count(void) { return backend_cuda_device_count(); }

bool backend_kind_is_gpu(const char *kind) { return kind && strncmp(kind, "cuda", 4) == 0; }

void backend_close(Backend *be) {
    if (be && be->close_instance) be->close_instance(be);
}
