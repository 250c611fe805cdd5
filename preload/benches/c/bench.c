/*
 * Cost of the driver calls the interposer wraps, measured from a program
 * linked against libcuda.so.1: run it once plain and once under
 * LD_PRELOAD=libtessera.so and compare.
 *
 *   bench N_LAUNCH N_ALLOC ROUNDS -> "launch <ns per call>" and
 *                                    "allocfree <ns per pair>"
 *
 * Each figure is the best of ROUNDS rounds.
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

typedef int CUresult;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, int);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

#define CHECK(x)                                                                   \
    do {                                                                           \
        if (x) {                                                                   \
            printf("error %s\n", #x);                                              \
            return 1;                                                              \
        }                                                                          \
    } while (0)

int main(int argc, char **argv) {
    long nl = argc > 1 ? atol(argv[1]) : 100000, na = argc > 2 ? atol(argv[2]) : 20000;
    int rounds = argc > 3 ? atoi(argv[3]) : 5;
    CUcontext c;
    CUmodule m;
    CUfunction f;
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&c, 0));
    CHECK(cuCtxSetCurrent(c));
    CHECK(cuModuleLoadData(&m, "bench"));
    CHECK(cuModuleGetFunction(&f, m, "empty"));
    double best_launch = 1e30, best_alloc = 1e30;
    for (int round = 0; round < rounds; round++) {
        double t0 = now();
        for (long i = 0; i < nl; i++) CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, 0, 0, 0));
        double t1 = now();
        CHECK(cuCtxSynchronize());
        if (nl && (t1 - t0) / nl < best_launch) best_launch = (t1 - t0) / nl;
        t0 = now();
        for (long i = 0; i < na; i++) {
            CUdeviceptr p;
            CHECK(cuMemAlloc_v2(&p, 1 << 20));
            CHECK(cuMemFree_v2(p));
        }
        t1 = now();
        if (na && (t1 - t0) / na < best_alloc) best_alloc = (t1 - t0) / na;
    }
    printf("launch %.1f\nallocfree %.1f\n", best_launch, best_alloc);
    return 0;
}
