/*
 * A scriptable CUDA driver API workload for the simulated GPU node.
 *
 * Built two ways by the tests:
 *   cc workload.c -lcuda                 links libcuda.so.1 directly
 *   cc -DUSE_DLOPEN workload.c -ldl      dlopen("libcuda.so.1") and resolve
 *                                        every entry point through
 *                                        cuGetProcAddress_v2, as libcudart does
 *
 * Arguments are operations, run in order; each prints one line:
 *   dev N                   retain device N's primary context, make it current
 *   ctx N                   create a new context on device N (current)
 *   alloc MIB               cuMemAlloc_v2           -> "alloc <rc>"
 *   alloc-bytes N           cuMemAlloc_v2 of N bytes
 *   alloc-until-oom MIB     allocate MIB chunks until one fails
 *                                                   -> "allocs <n> <rc>"
 *   free-all                free every allocation   -> "freed <n>"
 *   meminfo                 cuMemGetInfo_v2         -> "meminfo <free> <total>"
 *   launch NAME G B COUNT   COUNT launches of G blocks of B threads
 *   run NAME G B MS         launch for MS milliseconds of wall time, then sync
 *                                                   -> "run <launches>"
 *   time NAME G B COUNT     time COUNT launches with events -> "elapsed <ms>"
 *   sync                    cuCtxSynchronize
 *   sleep MS
 *   ready                   print "ready" (the parent waits for it)
 *   hold                    sleep until killed
 *   procaddress             check cuGetProcAddress_v2 answers
 * Any failing call prints "error <op> <CUDA_ERROR_NAME>" and exits 1.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream, *CUevent;

#define API(X)                                                                         \
    X(cuInit, (unsigned))                                                              \
    X(cuGetErrorName, (CUresult, const char **))                                      \
    X(cuDeviceGet, (CUdevice *, int))                                                  \
    X(cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice))                               \
    X(cuCtxSetCurrent, (CUcontext))                                                    \
    X(cuCtxSynchronize, (void))                                                        \
    X(cuModuleLoadData, (CUmodule *, const void *))                                    \
    X(cuModuleGetFunction, (CUfunction *, CUmodule, const char *))                     \
    X(cuEventCreate, (CUevent *, unsigned))                                            \
    X(cuEventRecord, (CUevent, CUstream))                                              \
    X(cuEventSynchronize, (CUevent))                                                   \
    X(cuEventElapsedTime, (float *, CUevent, CUevent))                                 \
    X(cuLaunchKernel, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,    \
                       unsigned, unsigned, CUstream, void **, void **))

/* Versioned entry points: the symbol name differs from the base name. */
#define API_V2(X)                                                                      \
    X(cuMemAlloc, cuMemAlloc_v2, (CUdeviceptr *, size_t))                              \
    X(cuMemFree, cuMemFree_v2, (CUdeviceptr))                                          \
    X(cuMemGetInfo, cuMemGetInfo_v2, (size_t *, size_t *))                             \
    X(cuCtxCreate, cuCtxCreate_v2, (CUcontext *, unsigned, CUdevice))

#ifdef USE_DLOPEN
#define DECL(name, args) static CUresult(*p_##name) args;
#define DECL2(base, sym, args) static CUresult(*p_##base) args;
API(DECL)
API_V2(DECL2)
typedef CUresult (*getproc_t)(const char *, void **, int, unsigned long long, int *);
static getproc_t p_getproc;

static void load(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        printf("error dlopen %s\n", dlerror());
        exit(1);
    }
    p_getproc = (getproc_t)dlsym(h, "cuGetProcAddress_v2");
    if (!p_getproc) {
        printf("error dlsym cuGetProcAddress_v2\n");
        exit(1);
    }
    int status = -1;
#define RESOLVE(name, args)                                                            \
    if (p_getproc(#name, (void **)&p_##name, 12080, 0, &status) || status != 0) {     \
        printf("error getproc %s status %d\n", #name, status);                        \
        exit(1);                                                                       \
    }
#define RESOLVE2(base, sym, args) RESOLVE(base, args)
    API(RESOLVE)
    API_V2(RESOLVE2)
}
#define CALL(name) p_##name
#else
#define DECL(name, args) CUresult name args;
#define DECL2(base, sym, args) CUresult sym args;
API(DECL)
API_V2(DECL2)
static void load(void) {}
#define CALL(name) CALL_##name
#define CALL_cuMemAlloc cuMemAlloc_v2
#define CALL_cuMemFree cuMemFree_v2
#define CALL_cuMemGetInfo cuMemGetInfo_v2
#define CALL_cuCtxCreate cuCtxCreate_v2
#define CALL_cuInit cuInit
#define CALL_cuGetErrorName cuGetErrorName
#define CALL_cuDeviceGet cuDeviceGet
#define CALL_cuDevicePrimaryCtxRetain cuDevicePrimaryCtxRetain
#define CALL_cuCtxSetCurrent cuCtxSetCurrent
#define CALL_cuCtxSynchronize cuCtxSynchronize
#define CALL_cuModuleLoadData cuModuleLoadData
#define CALL_cuModuleGetFunction cuModuleGetFunction
#define CALL_cuEventCreate cuEventCreate
#define CALL_cuEventRecord cuEventRecord
#define CALL_cuEventSynchronize cuEventSynchronize
#define CALL_cuEventElapsedTime cuEventElapsedTime
#define CALL_cuLaunchKernel cuLaunchKernel
#endif

static const char *name_of(CUresult rc) {
    const char *s = "?";
    CALL(cuGetErrorName)(rc, &s);
    return s;
}

#define CHECK(op, call)                                                                \
    do {                                                                               \
        CUresult rc_ = (call);                                                         \
        if (rc_) {                                                                     \
            printf("error %s %s\n", op, name_of(rc_));                                 \
            fflush(stdout);                                                            \
            exit(1);                                                                   \
        }                                                                              \
    } while (0)

static CUdeviceptr allocs[65536];
static int nallocs;
static CUmodule module;

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static CUfunction function(const char *name) {
    CUfunction f;
    if (!module) {
        static const char image[] = "gpusim module";
        CHECK("module", CALL(cuModuleLoadData)(&module, image));
    }
    CHECK("function", CALL(cuModuleGetFunction)(&f, module, name));
    return f;
}

int main(int argc, char **argv) {
    load();
    CHECK("init", CALL(cuInit)(0));
    for (int i = 1; i < argc; i++) {
        const char *op = argv[i];
#define ARG() (i + 1 < argc ? argv[++i] : (printf("error %s missing argument\n", op), exit(2), ""))
        if (!strcmp(op, "dev") || !strcmp(op, "ctx")) {
            CUdevice d;
            CUcontext c;
            CHECK(op, CALL(cuDeviceGet)(&d, atoi(ARG())));
            if (!strcmp(op, "dev")) {
                CHECK(op, CALL(cuDevicePrimaryCtxRetain)(&c, d));
                CHECK(op, CALL(cuCtxSetCurrent)(c));
            } else {
                CHECK(op, CALL(cuCtxCreate)(&c, 0, d));
            }
            printf("%s ok\n", op);
        } else if (!strcmp(op, "alloc") || !strcmp(op, "alloc-bytes")) {
            size_t n = strtoull(ARG(), 0, 10);
            if (!strcmp(op, "alloc")) n <<= 20;
            CUdeviceptr p = 0;
            CUresult rc = CALL(cuMemAlloc)(&p, n);
            if (!rc) allocs[nallocs++] = p;
            printf("alloc %s\n", name_of(rc));
        } else if (!strcmp(op, "alloc-until-oom")) {
            size_t n = strtoull(ARG(), 0, 10) << 20;
            int count = 0;
            CUresult rc;
            for (;;) {
                CUdeviceptr p = 0;
                rc = CALL(cuMemAlloc)(&p, n);
                if (rc || nallocs == 65536) break;
                allocs[nallocs++] = p;
                count++;
            }
            printf("allocs %d %s\n", count, name_of(rc));
        } else if (!strcmp(op, "free-all")) {
            int n = nallocs;
            while (nallocs) CHECK(op, CALL(cuMemFree)(allocs[--nallocs]));
            printf("freed %d\n", n);
        } else if (!strcmp(op, "meminfo")) {
            size_t f, t;
            CHECK(op, CALL(cuMemGetInfo)(&f, &t));
            printf("meminfo %zu %zu\n", f, t);
        } else if (!strcmp(op, "launch") || !strcmp(op, "run") || !strcmp(op, "time")) {
            CUfunction f = function(ARG());
            unsigned g = atoi(ARG()), b = atoi(ARG());
            long n = atol(ARG());
            CUevent e0, e1;
            if (!strcmp(op, "time")) {
                CHECK(op, CALL(cuEventCreate)(&e0, 0));
                CHECK(op, CALL(cuEventCreate)(&e1, 0));
                CHECK(op, CALL(cuEventRecord)(e0, 0));
            }
            long launched = 0;
            double end = now_ms() + n;
            for (;;) {
                if (!strcmp(op, "run") ? now_ms() >= end : launched >= n) break;
                CHECK(op, CALL(cuLaunchKernel)(f, g, 1, 1, b, 1, 1, 0, 0, 0, 0));
                launched++;
            }
            if (!strcmp(op, "time")) {
                float ms;
                CHECK(op, CALL(cuEventRecord)(e1, 0));
                CHECK(op, CALL(cuEventSynchronize)(e1));
                CHECK(op, CALL(cuEventElapsedTime)(&ms, e0, e1));
                printf("elapsed %.3f\n", ms);
            } else {
                if (!strcmp(op, "run")) CHECK(op, CALL(cuCtxSynchronize)());
                printf("%s %ld\n", op, launched);
            }
        } else if (!strcmp(op, "sync")) {
            CHECK(op, CALL(cuCtxSynchronize)());
            printf("sync ok\n");
        } else if (!strcmp(op, "sleep")) {
            usleep(atoi(ARG()) * 1000);
        } else if (!strcmp(op, "ready")) {
            printf("ready\n");
        } else if (!strcmp(op, "hold")) {
            fflush(stdout);
            for (;;) pause();
        } else if (!strcmp(op, "procaddress")) {
#ifdef USE_DLOPEN
            void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
            void *a = 0, *b = dlsym(h, "cuMemAlloc_v2"), *pt = 0, *lk = dlsym(h, "cuLaunchKernel_ptsz");
            int st = -1;
            CHECK(op, p_getproc("cuMemAlloc", &a, 12080, 0, &st));
            CHECK(op, p_getproc("cuLaunchKernel", &pt, 12080, 2, &st));
            void *self = 0;
            CHECK(op, p_getproc("cuGetProcAddress", &self, 12080, 0, &st));
            CUresult missing = p_getproc("cuNoSuchEntryPoint", &b, 12080, 0, &st);
            printf("procaddress %s %s %s %s %d\n", a == dlsym(h, "cuMemAlloc_v2") ? "v2" : "wrong",
                   pt == lk ? "ptsz" : "wrong", self == (void *)p_getproc ? "nested" : "wrong",
                   name_of(missing), st);
#else
            printf("procaddress direct\n");
#endif
        } else {
            printf("error unknown-op %s\n", op);
            return 2;
        }
        fflush(stdout);
    }
    return 0;
}
