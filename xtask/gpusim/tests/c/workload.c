/*
 * A scriptable CUDA driver API workload for the simulated GPU node.
 *
 * Built two ways by the tests:
 *   cc workload.c -lcuda                 links libcuda.so.1 directly
 *   cc -DUSE_DLOPEN workload.c -ldl      dlopen("libcuda.so.1") and resolve
 *                                        every entry point through
 *                                        cuGetProcAddress_v2, as libcudart does
 *   cc -DUSE_DLOPEN -DUSE_DLSYM ...      dlopen, then dlsym() each versioned
 *                                        symbol name (cuMemAlloc_v2, ...)
 *
 * Arguments are operations, run in order; each prints one line:
 *   dev N                   retain device N's primary context, make it current
 *   ctx N                   create a new context on device N (current)
 *   ctx-destroy             destroy the last context made by `ctx`
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
 *   wait                    read a line from stdin  -> "waited"
 *   hold                    sleep until killed
 *   procaddress             check cuGetProcAddress_v2 answers
 *   fill FAMILY MIB         allocate MIB-sized objects of FAMILY until one
 *                           fails -> "filled <family> <n> <rc>"; FAMILY is
 *                           linear, pitch, managed, async, pool, vmm,
 *                           array1d, array2d, array3d or mipmap
 *   one FAMILY MIB          allocate one object  -> "one <family> <rc>"
 *   churn MIB N             N rounds: allocate MIB; on failure free the
 *                           oldest object          -> "churn <ok> <oom>"
 *   totalmem                cuDeviceTotalMem_v2    -> "totalmem <bytes>"
 *   sweep BYTES             cuMemAlloc_v2 of BYTES until one fails (kept
 *                           apart from alloc's)   -> "swept <n> <rc>"
 *   sweep-n N BYTES         N of them (stops at the first failure)
 *                                                   -> "swept <n> <rc>"
 *   sweep-thin K            free every swept allocation but each K-th
 *                                                   -> "thinned <freed> <kept>"
 *   sweep-free              free every swept allocation -> "sweep-freed <n>"
 *   sweep-step              address of the last swept allocation minus the
 *                           one before it          -> "step <bytes>"
 *   bybus ID                cuDeviceGetByPCIBusId  -> "bybus <rc> <device>"
 *   graph NAME G B K N      capture K launches into a graph, launch it N
 *                           times, sync             -> "graph <n>"
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
typedef struct {
    int type, handle_types, loc_type, loc_id;
    void *win32;
    unsigned char flags[8];
} memprop_t;
typedef struct {
    size_t w, h;
    unsigned format, channels;
} array2d_t;
typedef struct {
    size_t w, h, d;
    unsigned format, channels, flags;
} array3d_t;

#define API(X)                                                                         \
    X(cuInit, (unsigned))                                                              \
    X(cuGetErrorName, (CUresult, const char **))                                      \
    X(cuDeviceGet, (CUdevice *, int))                                                  \
    X(cuDeviceGetByPCIBusId, (CUdevice *, const char *))                               \
    X(cuDevicePrimaryCtxRetain, (CUcontext *, CUdevice))                               \
    X(cuCtxSetCurrent, (CUcontext))                                                    \
    X(cuCtxSynchronize, (void))                                                        \
    X(cuCtxDestroy, (CUcontext))                                                       \
    X(cuModuleLoadData, (CUmodule *, const void *))                                    \
    X(cuModuleGetFunction, (CUfunction *, CUmodule, const char *))                     \
    X(cuEventCreate, (CUevent *, unsigned))                                            \
    X(cuEventRecord, (CUevent, CUstream))                                              \
    X(cuEventSynchronize, (CUevent))                                                   \
    X(cuEventElapsedTime, (float *, CUevent, CUevent))                                 \
    X(cuLaunchKernel, (CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,    \
                       unsigned, unsigned, CUstream, void **, void **))                   \
    X(cuMemAllocManaged, (CUdeviceptr *, size_t, unsigned))                            \
    X(cuMemAllocAsync, (CUdeviceptr *, size_t, CUstream))                              \
    X(cuMemAllocFromPoolAsync, (CUdeviceptr *, size_t, void *, CUstream))              \
    X(cuMemFreeAsync, (CUdeviceptr, CUstream))                                         \
    X(cuDeviceGetDefaultMemPool, (void **, CUdevice))                                  \
    X(cuMemCreate, (unsigned long long *, size_t, const memprop_t *, unsigned long long)) \
    X(cuMemRelease, (unsigned long long))                                              \
    X(cuMemAddressReserve, (CUdeviceptr *, size_t, size_t, CUdeviceptr, unsigned long long)) \
    X(cuMemAddressFree, (CUdeviceptr, size_t))                                         \
    X(cuMemMap, (CUdeviceptr, size_t, size_t, unsigned long long, unsigned long long))  \
    X(cuMemUnmap, (CUdeviceptr, size_t))                                               \
    X(cuMipmappedArrayCreate, (void **, const array3d_t *, unsigned))                  \
    X(cuMipmappedArrayDestroy, (void *))                                               \
    X(cuArrayDestroy, (void *))                                                        \
    X(cuStreamCreate, (CUstream *, unsigned))                                          \
    X(cuStreamSynchronize, (CUstream))                                                 \
    X(cuStreamEndCapture, (CUstream, void **))                                         \
    X(cuGraphLaunch, (void *, CUstream))

/* Versioned entry points: the symbol name differs from the base name. */
#define API_V2(X)                                                                      \
    X(cuMemAlloc, cuMemAlloc_v2, (CUdeviceptr *, size_t))                              \
    X(cuMemFree, cuMemFree_v2, (CUdeviceptr))                                          \
    X(cuMemGetInfo, cuMemGetInfo_v2, (size_t *, size_t *))                             \
    X(cuCtxCreate, cuCtxCreate_v2, (CUcontext *, unsigned, CUdevice))                \
    X(cuMemAllocPitch, cuMemAllocPitch_v2, (CUdeviceptr *, size_t *, size_t, size_t, unsigned)) \
    X(cuArrayCreate, cuArrayCreate_v2, (void **, const array2d_t *))                    \
    X(cuArray3DCreate, cuArray3DCreate_v2, (void **, const array3d_t *))                \
    X(cuDeviceTotalMem, cuDeviceTotalMem_v2, (size_t *, CUdevice))                      \
    X(cuStreamBeginCapture, cuStreamBeginCapture_v2, (CUstream, int))                   \
    X(cuGraphInstantiate, cuGraphInstantiateWithFlags, (void **, void *, unsigned long long))

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
#ifdef USE_DLSYM
#define RESOLVE_SYM(name, sym)                                                         \
    if (!(*(void **)&p_##name = dlsym(h, #sym))) {                                     \
        printf("error dlsym %s\n", #sym);                                              \
        exit(1);                                                                       \
    }
#define RESOLVE(name, args) RESOLVE_SYM(name, name)
#define RESOLVE2(base, sym, args) RESOLVE_SYM(base, sym)
#else
#define RESOLVE(name, args)                                                            \
    if (p_getproc(#name, (void **)&p_##name, 12080, 0, &status) || status != 0) {     \
        printf("error getproc %s status %d\n", #name, status);                        \
        exit(1);                                                                       \
    }
#define RESOLVE2(base, sym, args) RESOLVE(base, args)
#endif
    API(RESOLVE)
    API_V2(RESOLVE2)
    (void)status;
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
#define CALL_cuMemAllocPitch cuMemAllocPitch_v2
#define CALL_cuArrayCreate cuArrayCreate_v2
#define CALL_cuArray3DCreate cuArray3DCreate_v2
#define CALL_cuDeviceTotalMem cuDeviceTotalMem_v2
#define CALL_cuStreamBeginCapture cuStreamBeginCapture_v2
#define CALL_cuGraphInstantiate cuGraphInstantiateWithFlags
#define CALL_cuMemAllocManaged cuMemAllocManaged
#define CALL_cuMemAllocAsync cuMemAllocAsync
#define CALL_cuMemAllocFromPoolAsync cuMemAllocFromPoolAsync
#define CALL_cuMemFreeAsync cuMemFreeAsync
#define CALL_cuDeviceGetDefaultMemPool cuDeviceGetDefaultMemPool
#define CALL_cuMemCreate cuMemCreate
#define CALL_cuMemRelease cuMemRelease
#define CALL_cuMemAddressReserve cuMemAddressReserve
#define CALL_cuMemAddressFree cuMemAddressFree
#define CALL_cuMemMap cuMemMap
#define CALL_cuMemUnmap cuMemUnmap
#define CALL_cuMipmappedArrayCreate cuMipmappedArrayCreate
#define CALL_cuMipmappedArrayDestroy cuMipmappedArrayDestroy
#define CALL_cuArrayDestroy cuArrayDestroy
#define CALL_cuStreamCreate cuStreamCreate
#define CALL_cuStreamSynchronize cuStreamSynchronize
#define CALL_cuStreamEndCapture cuStreamEndCapture
#define CALL_cuGraphLaunch cuGraphLaunch
#define CALL_cuInit cuInit
#define CALL_cuGetErrorName cuGetErrorName
#define CALL_cuDeviceGet cuDeviceGet
#define CALL_cuDeviceGetByPCIBusId cuDeviceGetByPCIBusId
#define CALL_cuDevicePrimaryCtxRetain cuDevicePrimaryCtxRetain
#define CALL_cuCtxSetCurrent cuCtxSetCurrent
#define CALL_cuCtxSynchronize cuCtxSynchronize
#define CALL_cuCtxDestroy cuCtxDestroy
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
static CUdeviceptr *swept;
static size_t nswept, swept_cap;
static CUmodule module;
static CUcontext made;

/* Objects of the allocation families (fill / one / churn). */
enum { F_LINEAR, F_PITCH, F_MANAGED, F_ASYNC, F_POOL, F_VMM, F_A1, F_A2, F_A3, F_MIP, F_N };
static const char *family_names[F_N] = {"linear", "pitch",   "managed", "async",   "pool",
                                        "vmm",    "array1d", "array2d", "array3d", "mipmap"};
typedef struct {
    int family;
    CUdeviceptr ptr;
    unsigned long long handle;
    void *obj;
    size_t size;
} object_t;
static object_t objects[65536];
static int nobjects, first_object;

static int family_of(const char *name) {
    for (int f = 0; f < F_N; f++)
        if (!strcmp(name, family_names[f])) return f;
    printf("error unknown-family %s\n", name);
    exit(2);
}

/* Allocates one object of about `bytes`; returns the CUresult. */
static CUresult alloc_object(int family, size_t bytes) {
    object_t o = {family, 0, 0, 0, bytes};
    CUresult rc;
    static void *pool;
    switch (family) {
    case F_LINEAR: rc = CALL(cuMemAlloc)(&o.ptr, bytes); break;
    case F_PITCH: {
        size_t pitch; /* rows of 4096 bytes */
        rc = CALL(cuMemAllocPitch)(&o.ptr, &pitch, 4096, bytes / 4096, 4);
        break;
    }
    case F_MANAGED: rc = CALL(cuMemAllocManaged)(&o.ptr, bytes, 1); break;
    case F_ASYNC: rc = CALL(cuMemAllocAsync)(&o.ptr, bytes, 0); break;
    case F_POOL:
        if (!pool) CHECK("pool", CALL(cuDeviceGetDefaultMemPool)(&pool, 0));
        rc = CALL(cuMemAllocFromPoolAsync)(&o.ptr, bytes, pool, 0);
        break;
    case F_VMM: {
        memprop_t prop = {1, 0, 1, 0, 0, {0}};
        rc = CALL(cuMemCreate)(&o.handle, bytes, &prop, 0);
        if (rc) break;
        CHECK("reserve", CALL(cuMemAddressReserve)(&o.ptr, bytes, 0, 0, 0));
        CHECK("map", CALL(cuMemMap)(o.ptr, bytes, 0, o.handle, 0));
        break;
    }
    case F_A1: { array2d_t d = {bytes / 4, 0, 0x20, 1}; rc = CALL(cuArrayCreate)(&o.obj, &d); break; }
    case F_A2: { array2d_t d = {1024, bytes / 4096, 0x20, 1}; rc = CALL(cuArrayCreate)(&o.obj, &d); break; }
    case F_A3: { array3d_t d = {256, 256, bytes / (256 * 256 * 4), 0x01, 4, 0}; rc = CALL(cuArray3DCreate)(&o.obj, &d); break; }
    default: { /* mipmap: 2 levels, level 0 is 4/5 of the bytes */
        array3d_t d = {1024, bytes / 4096 * 4 / 5, 0, 0x20, 1, 0};
        rc = CALL(cuMipmappedArrayCreate)(&o.obj, &d, 2);
        break;
    }
    }
    if (!rc) objects[nobjects++] = o;
    return rc;
}

static void free_object(object_t *o) {
    switch (o->family) {
    case F_LINEAR: case F_PITCH: case F_MANAGED: CHECK("free", CALL(cuMemFree)(o->ptr)); break;
    case F_ASYNC: case F_POOL: CHECK("free", CALL(cuMemFreeAsync)(o->ptr, 0)); break;
    case F_VMM:
        CHECK("unmap", CALL(cuMemUnmap)(o->ptr, o->size));
        CHECK("release", CALL(cuMemRelease)(o->handle));
        CHECK("addrfree", CALL(cuMemAddressFree)(o->ptr, o->size));
        break;
    case F_MIP: CHECK("free", CALL(cuMipmappedArrayDestroy)(o->obj)); break;
    default: CHECK("free", CALL(cuArrayDestroy)(o->obj)); break;
    }
}

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
                made = c;
            }
            printf("%s ok\n", op);
        } else if (!strcmp(op, "ctx-destroy")) {
            CHECK(op, CALL(cuCtxDestroy)(made));
            nallocs = 0; /* its allocations are gone with it */
            printf("ctx-destroy ok\n");
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
            int n = nallocs + nobjects - first_object;
            while (nallocs) CHECK(op, CALL(cuMemFree)(allocs[--nallocs]));
            while (nobjects > first_object) free_object(&objects[--nobjects]);
            nobjects = first_object = 0;
            printf("freed %d\n", n);
        } else if (!strcmp(op, "fill") || !strcmp(op, "one")) {
            int f = family_of(ARG());
            size_t n = strtoull(ARG(), 0, 10) << 20;
            int count = 0;
            CUresult rc;
            while (!(rc = alloc_object(f, n)) && nobjects < 65536 && !strcmp(op, "fill")) count++;
            if (!strcmp(op, "one")) printf("one %s %s\n", family_names[f], name_of(rc));
            else printf("filled %s %d %s\n", family_names[f], count, name_of(rc));
        } else if (!strcmp(op, "churn")) {
            size_t n = strtoull(ARG(), 0, 10) << 20;
            long rounds = atol(ARG()), ok = 0, oom = 0;
            for (long r = 0; r < rounds; r++) {
                CUresult rc = alloc_object(F_LINEAR, n);
                if (!rc) ok++;
                else if (rc == 2) {
                    oom++;
                    if (first_object < nobjects) free_object(&objects[first_object++]);
                } else CHECK(op, rc);
                if (nobjects == 65536) break;
            }
            printf("churn %ld %ld\n", ok, oom);
        } else if (!strcmp(op, "sweep") || !strcmp(op, "sweep-n")) {
            size_t most = !strcmp(op, "sweep-n") ? strtoull(ARG(), 0, 10) : (size_t)-1;
            size_t n = strtoull(ARG(), 0, 10), count = 0;
            CUresult rc = 0;
            while (count < most) {
                CUdeviceptr p = 0;
                if (nswept == swept_cap) {
                    swept_cap = swept_cap ? swept_cap * 2 : 4096;
                    swept = realloc(swept, swept_cap * sizeof *swept);
                    if (!swept) { printf("error sweep out of host memory\n"); exit(1); }
                }
                rc = CALL(cuMemAlloc)(&p, n);
                if (rc) break;
                swept[nswept++] = p;
                count++;
            }
            printf("swept %zu %s\n", count, name_of(rc));
        } else if (!strcmp(op, "sweep-thin")) {
            size_t k = strtoull(ARG(), 0, 10), kept = 0, freed = 0;
            if (!k) { printf("error sweep-thin K must be positive\n"); exit(2); }
            for (size_t j = 0; j < nswept; j++) {
                if (j % k == 0) swept[kept++] = swept[j];
                else { CHECK(op, CALL(cuMemFree)(swept[j])); freed++; }
            }
            nswept = kept;
            printf("thinned %zu %zu\n", freed, kept);
        } else if (!strcmp(op, "sweep-step")) {
            if (nswept < 2) { printf("error sweep-step needs two allocations\n"); exit(2); }
            printf("step %lld\n", (long long)(swept[nswept - 1] - swept[nswept - 2]));
        } else if (!strcmp(op, "sweep-free")) {
            size_t n = nswept;
            while (nswept) CHECK(op, CALL(cuMemFree)(swept[--nswept]));
            printf("sweep-freed %zu\n", n);
        } else if (!strcmp(op, "totalmem")) {
            size_t t;
            CHECK(op, CALL(cuDeviceTotalMem)(&t, 0));
            printf("totalmem %zu\n", t);
        } else if (!strcmp(op, "bybus")) {
            CUdevice d = -1;
            CUresult rc = CALL(cuDeviceGetByPCIBusId)(&d, ARG());
            printf("bybus %s %d\n", name_of(rc), d);
        } else if (!strcmp(op, "graph")) {
            CUfunction f = function(ARG());
            unsigned g = atoi(ARG()), b = atoi(ARG());
            int k = atoi(ARG()), n = atoi(ARG());
            CUstream s;
            void *graph, *exec;
            CHECK(op, CALL(cuStreamCreate)(&s, 0));
            CHECK(op, CALL(cuStreamBeginCapture)(s, 0));
            for (int j = 0; j < k; j++) CHECK(op, CALL(cuLaunchKernel)(f, g, 1, 1, b, 1, 1, 0, s, 0, 0));
            CHECK(op, CALL(cuStreamEndCapture)(s, &graph));
            CHECK(op, CALL(cuGraphInstantiate)(&exec, graph, 0));
            for (int j = 0; j < n; j++) CHECK(op, CALL(cuGraphLaunch)(exec, s));
            CHECK(op, CALL(cuStreamSynchronize)(s));
            printf("graph %d\n", n);
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
        } else if (!strcmp(op, "wait")) {
            /* Until the test writes a line to stdin (say, after changing
             * the limits). */
            char line[64];
            if (!fgets(line, sizeof line, stdin)) {
                printf("error wait end-of-input\n");
                return 1;
            }
            printf("waited\n");
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
