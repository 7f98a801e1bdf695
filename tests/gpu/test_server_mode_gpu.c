/* test_server_mode_gpu.c — test_server_mode.c on one GPU: colt serve and
 * colt train as two processes sharing it (the server's KV pool capped at 30%,
 * the weights over the host path), the same checks as on the CPU: server mode
 * equals colocated GRPO (completions, metrics within 1e-6 relative, final
 * weights), async staleness 0 then 1, server_devices leaves no server behind,
 * bad input in one line, and LoRA server mode equal to colocated LoRA with the
 * adapters alone pushed after the first push. Exit 77 when no GPU. */
#define TEST_DEVICE "cuda"
#include "backend/backend.h"

static int gpu_count(void) { return backend_cuda_device_count(); }
#define main test_server_mode_main
#include "../test_server_mode.c"
#undef main

int main(void) {
    if (gpu_count() < 1) {
        printf("SKIPPED: test_server_mode_gpu (no GPU)\n");
        return 77;
    }
    return test_server_mode_main();
}
