/* A CUDA driver API client for ebpf_gpusim.rs: after "go" on stdin it
 * initialises, makes GPU 0's primary context current, allocates <allocs>
 * blocks of <bytes> and frees the first <frees>, prints "ready", and exits
 * after "exit". Prototypes are declared here, not taken from cuda.h. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned int flags);
CUresult cuDeviceGet(CUdevice *dev, int ordinal);
CUresult cuDevicePrimaryCtxRetain(CUcontext *ctx, CUdevice dev);
CUresult cuCtxSetCurrent(CUcontext ctx);
CUresult cuMemAlloc_v2(CUdeviceptr *ptr, size_t bytes);
CUresult cuMemFree_v2(CUdeviceptr ptr);

static void check(CUresult r, const char *what) {
    if (r != 0) { fprintf(stderr, "%s failed: %d\n", what, r); exit(2); }
}
static void wait_line(const char *want) {
    char line[64];
    if (!fgets(line, sizeof line, stdin) || strncmp(line, want, strlen(want)) != 0) {
        fprintf(stderr, "expected %s\n", want); exit(3);
    }
}
int main(int argc, char **argv) {
    if (argc != 4) return 4;
    if (atoi(argv[1]) > 64 || atoi(argv[3]) > atoi(argv[1])) return 5;
    int allocs = atoi(argv[1]);
    size_t bytes = strtoull(argv[2], 0, 10);
    int frees = atoi(argv[3]);
    CUdeviceptr ptrs[64];
    wait_line("go");
    CUdevice dev; CUcontext ctx;
    check(cuInit(0), "cuInit");
    check(cuDeviceGet(&dev, 0), "cuDeviceGet");
    check(cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    check(cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    for (int i = 0; i < allocs; i++) check(cuMemAlloc_v2(&ptrs[i], bytes), "cuMemAlloc_v2");
    for (int i = 0; i < frees; i++) check(cuMemFree_v2(ptrs[i]), "cuMemFree_v2");
    printf("ready\n"); fflush(stdout);
    wait_line("exit");
    return 0;
}
