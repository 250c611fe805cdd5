/*
 * fork_probe nvml|cuda: the parent asks NVML only, or initialises CUDA and
 * allocates; then it forks, and the child initialises CUDA and allocates
 * 16 MiB on device 0. Prints "child <pid> <CUresult of the allocation>".
 */
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned);
CUresult cuDeviceGet(int *, int);
CUresult cuDevicePrimaryCtxRetain(void **, int);
CUresult cuCtxSetCurrent(void *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
int nvmlInit_v2(void);

static CUresult use_cuda(void) {
    int dev;
    void *ctx;
    CUdeviceptr p;
    CUresult rc;
    if ((rc = cuInit(0)) || (rc = cuDeviceGet(&dev, 0)) ||
        (rc = cuDevicePrimaryCtxRetain(&ctx, dev)) || (rc = cuCtxSetCurrent(ctx)))
        return rc;
    return cuMemAlloc_v2(&p, 16 << 20);
}

int main(int argc, char **argv) {
    if (argc != 2) return 2;
    if (!strcmp(argv[1], "nvml")) {
        if (nvmlInit_v2()) return 3;
    } else if (use_cuda()) {
        return 4;
    }
    fflush(stdout);
    pid_t child = fork();
    if (child == 0) {
        printf("child %d %d\n", (int)getpid(), use_cuda());
        return 0;
    }
    int status;
    waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 5;
}
