/* backend_select.c — picking a backend by name (--device). In a build without
 * CUDA the CUDA entry points exist and say there is no GPU. */
#include <string.h>

#include "backend/backend.h"
#include "core/error.h"

#ifndef COLT_HAVE_CUDA
const Backend *backend_cuda(void) { return NULL; }
const Backend *backend_cuda_f32(void) { return NULL; }
#endif

const Backend *backend_by_name(const char *name, char *err) {
    if (!name || strcmp(name, "auto") == 0) {
        const Backend *be = backend_cuda();
        return be ? be : backend_cpu();
    }
    if (strcmp(name, "cpu") == 0) return backend_cpu();
    if (strcmp(name, "cuda_f32") == 0) {  /* fp32 storage on the GPU: for checking against the CPU */
        const Backend *be = backend_cuda_f32();
        if (!be) errorf(err, "--device cuda_f32: no usable CUDA GPU (or a build without CUDA)");
        return be;
    }
    if (strcmp(name, "cuda") == 0) {
        const Backend *be = backend_cuda();
        if (!be) {
#ifdef COLT_HAVE_CUDA
            errorf(err, "--device cuda: no usable CUDA GPU found");
#else
            errorf(err, "--device cuda: this colt was built without CUDA (cmake -DCOLT_CUDA=ON)");
#endif
        }
        return be;
    }
    errorf(err, "--device: unknown device '%s' (cpu, cuda, cuda_f32 or auto)", name);
    return NULL;
}
