/*
 * A CUDA process for the SIGKILL stress test: allocates and frees device
 * memory of random sizes, with a launch now and then, through the normal
 * driver API (linked with -lcuda), for a fixed number of operations.
 *
 *   churn_kill SEED OPS MAX_MIB
 *
 * Prints "ready" once its context exists, waits for a line on stdin (so
 * that every process holds its context before any fills the memory), then
 * prints "done <ok> <oom>" after
 * freeing everything it holds, and exits 0. Any unexpected failure prints
 * "error <what> <code>" and exits 1. The parent kills some of these at
 * random moments; the others must reach "done".
 */
#include <stdio.h>
#include <stdlib.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream;

CUresult cuInit(unsigned);
CUresult cuDeviceGet(CUdevice *, int);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, CUdevice);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);

#define OOM 2
#define HELD 256

static void check(const char *what, CUresult rc) {
    if (rc) {
        printf("error %s %d\n", what, rc);
        exit(1);
    }
}

/* xorshift64*: the same sequence for the same seed. */
static unsigned long long state;
static unsigned long long next(void) {
    state ^= state >> 12;
    state ^= state << 25;
    state ^= state >> 27;
    return state * 2685821657736338717ull;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        printf("error usage churn_kill SEED OPS MAX_MIB\n");
        return 2;
    }
    state = strtoull(argv[1], 0, 10) | 1;
    long ops = atol(argv[2]);
    unsigned long long max_bytes = strtoull(argv[3], 0, 10) << 20;
    CUdevice dev;
    CUcontext ctx;
    CUmodule module;
    CUfunction spin;
    static const char image[] = "gpusim module";
    check("init", cuInit(0));
    check("device", cuDeviceGet(&dev, 0));
    check("context", cuDevicePrimaryCtxRetain(&ctx, dev));
    check("current", cuCtxSetCurrent(ctx));
    check("module", cuModuleLoadData(&module, image));
    check("function", cuModuleGetFunction(&spin, module, "spin"));
    printf("ready\n");
    fflush(stdout);
    char go[8];
    if (!fgets(go, sizeof go, stdin)) {
        printf("error stdin closed\n");
        return 1;
    }

    CUdeviceptr held[HELD];
    int n = 0;
    long ok = 0, oom = 0;
    for (long i = 0; i < ops; i++) {
        unsigned long long r = next();
        if (r % 16 == 0) {
            check("launch", cuLaunchKernel(spin, 1, 1, 1, 1, 1, 1, 0, 0, 0, 0));
        } else if (n > 0 && (n == HELD || r % 3 == 0)) {
            int k = (int)(next() % (unsigned long long)n);
            check("free", cuMemFree_v2(held[k]));
            held[k] = held[--n];
        } else {
            size_t bytes = (size_t)(next() % max_bytes) + 1;
            CUdeviceptr p = 0;
            CUresult rc = cuMemAlloc_v2(&p, bytes);
            if (rc == OOM) {
                oom++;
                if (n > 0) {
                    check("free", cuMemFree_v2(held[--n]));
                }
            } else {
                check("alloc", rc);
                held[n++] = p;
                ok++;
            }
        }
    }
    while (n > 0) check("free", cuMemFree_v2(held[--n]));
    check("sync", cuCtxSynchronize());
    printf("done %ld %ld\n", ok, oom);
    return 0;
}
