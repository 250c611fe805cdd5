/*
 * Graph, pool, legacy and context calls the interposer refuses or costs,
 * made the three ways a program reaches the driver:
 *   cc graph_probe.c -lcuda -lpthread               linked directly
 *   cc -DUSE_DLOPEN graph_probe.c -ldl -lpthread    dlopen + cuGetProcAddress_v2
 *   cc -DUSE_DLOPEN -DUSE_DLSYM ...                 dlopen + dlsym of each symbol
 *
 * Operations, run in order, each printing one line:
 *   dev N                  retain device N's primary context, make it current
 *   alloc MIB              cuMemAlloc_v2            -> "alloc <rc>"
 *   fill MIB               cuMemAlloc_v2 until one fails -> "filled <n> <rc>"
 *   memnode MIB            cuGraphAddMemAllocNode, then instantiate and launch
 *                          -> "memnode <rc> <launch rc>"
 *   addnode-mem V MIB      cuGraphAddNode (V=1) / cuGraphAddNode_v2 (V=2) of a
 *                          memory-allocation node, then launch
 *                          -> "addnode-mem <rc> <launch rc>"
 *   capture-alloc MIB      cuMemAllocAsync on a capturing stream; if it works,
 *                          launch the graph, free its memory, launch again
 *                          -> "capture-alloc <rc> <launches>"
 *   capture-race MIB       thread A allocates MIB on a stream while thread B
 *                          begins capturing it (with GPUSIM_IS_CAPTURING_DELAY_MS
 *                          the capture begins after the interposer looked);
 *                          then as capture-alloc
 *                          -> "capture-race <alloc rc> <end capture rc> <launches>"
 *   v1 NAME MIB            a CUDA 2.x entry point (alloc, pitch, meminfo,
 *                          array, array3d, launch, grid, grid-async)
 *                          -> "v1 <name> <rc>"
 *   gcost HOW MS           build a graph whose real cost differs from its
 *                          instantiated one by HOW (addnode, setparams,
 *                          kernelset, childset, update; v1inst: made with the
 *                          CUDA 10 cuGraphInstantiate), launch it for MS ms
 *                          -> "gcost <launches> <elapsed ms> <warps per launch>
 *                              <kernels run> <warps run>"
 *   pool MIB               a pool that keeps freed memory: allocate MIB from
 *                          it, free, destroy the pool -> "pool <rc> <destroy rc>"
 *   ctx-race MIB           thread A destroys a context while thread B makes a
 *                          new one (same handle, with the simulator's knobs)
 *                          and allocates MIB in it -> "ctx-race <same handle>"
 *   ctx-cycle MIB          create a context, allocate MIB in it, destroy it
 *                          -> "ctx-cycle <alloc rc>"
 *   ready / hold
 * "Kernels/warps run" are the simulator's own record (gpusimExecutedWork,
 * not a CUDA call, so no interposer sees it).
 * A failing call that is not the point of the operation prints
 * "error <op> <rc>" and exits 1.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef int CUdevice;
typedef unsigned long long CUdeviceptr;
typedef void *H;

typedef struct {
    H func;
    unsigned grid[3], block[3], shared;
    void **params, **extra;
    H kern, ctx;
} kparams_t; /* CUDA_KERNEL_NODE_PARAMS_v2 / _v3 */

typedef struct {
    int alloc_type, handle_types, loc_type, loc_id;
    void *win32;
    size_t max_size;
    unsigned short usage;
    unsigned char reserved[54];
} poolprops_t; /* CUmemPoolProps */

typedef struct {
    poolprops_t props;
    const void *access;
    size_t access_count, bytesize;
    CUdeviceptr dptr;
} allocnode_t; /* CUDA_MEM_ALLOC_NODE_PARAMS */

typedef struct {
    int type, reserved0[3];
    union {
        long long reserved1[29];
        kparams_t kernel;
        H graph;
        allocnode_t alloc;
    };
    long long reserved2;
} nodeparams_t; /* CUgraphNodeParams */

typedef struct {
    unsigned long long flags;
    H upload, err_node;
    int result;
} instparams_t; /* CUDA_GRAPH_INSTANTIATE_PARAMS */

typedef struct {
    int result;
    H err_node, err_from;
} updateinfo_t; /* CUgraphExecUpdateResultInfo */

typedef struct {
    unsigned w, h, format, channels;
} arr1_t;
typedef struct {
    unsigned w, h, d, format, channels, flags;
} arr3_t;

_Static_assert(sizeof(nodeparams_t) == 256, "CUgraphNodeParams is 256 bytes");
_Static_assert(sizeof(poolprops_t) == 88, "CUmemPoolProps is 88 bytes");

/* X(slot, symbol, base name, version, parameters) */
#define API(X)                                                                                 \
    X(init, cuInit, cuInit, 2000, (unsigned))                                                  \
    X(errname, cuGetErrorName, cuGetErrorName, 6000, (CUresult, const char **))                \
    X(devget, cuDeviceGet, cuDeviceGet, 2000, (CUdevice *, int))                               \
    X(retain, cuDevicePrimaryCtxRetain, cuDevicePrimaryCtxRetain, 7000, (H *, CUdevice))       \
    X(setcur, cuCtxSetCurrent, cuCtxSetCurrent, 4000, (H))                                     \
    X(ctxcreate, cuCtxCreate_v2, cuCtxCreate, 3020, (H *, unsigned, CUdevice))                 \
    X(ctxdestroy, cuCtxDestroy_v2, cuCtxDestroy, 4000, (H))                                    \
    X(ctxsync, cuCtxSynchronize, cuCtxSynchronize, 2000, (void))                               \
    X(modload, cuModuleLoadData, cuModuleLoadData, 2000, (H *, const void *))                  \
    X(getfunc, cuModuleGetFunction, cuModuleGetFunction, 2000, (H *, H, const char *))         \
    X(malloc2, cuMemAlloc_v2, cuMemAlloc, 3020, (CUdeviceptr *, size_t))                       \
    X(mallocasync, cuMemAllocAsync, cuMemAllocAsync, 11020, (CUdeviceptr *, size_t, H))        \
    X(freeasync, cuMemFreeAsync, cuMemFreeAsync, 11020, (CUdeviceptr, H))                      \
    X(poolcreate, cuMemPoolCreate, cuMemPoolCreate, 11020, (H *, const poolprops_t *))         \
    X(pooldestroy, cuMemPoolDestroy, cuMemPoolDestroy, 11020, (H))                             \
    X(poolset, cuMemPoolSetAttribute, cuMemPoolSetAttribute, 11020, (H, int, void *))          \
    X(poolalloc, cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync, 11020,                      \
      (CUdeviceptr *, size_t, H, H))                                                           \
    X(streamcreate, cuStreamCreate, cuStreamCreate, 2000, (H *, unsigned))                     \
    X(streamsync, cuStreamSynchronize, cuStreamSynchronize, 2000, (H))                         \
    X(begincap, cuStreamBeginCapture_v2, cuStreamBeginCapture, 10010, (H, int))                \
    X(endcap, cuStreamEndCapture, cuStreamEndCapture, 10000, (H, H *))                         \
    X(graphcreate, cuGraphCreate, cuGraphCreate, 10000, (H *, unsigned))                       \
    X(addkernel, cuGraphAddKernelNode_v2, cuGraphAddKernelNode, 12000,                         \
      (H *, H, const H *, size_t, const kparams_t *))                                          \
    X(addmem, cuGraphAddMemAllocNode, cuGraphAddMemAllocNode, 11040,                           \
      (H *, H, const H *, size_t, allocnode_t *))                                              \
    X(addnode1, cuGraphAddNode, cuGraphAddNode, 12020, (H *, H, const H *, size_t, nodeparams_t *)) \
    X(addnode2, cuGraphAddNode_v2, cuGraphAddNode, 12030,                                      \
      (H *, H, const H *, const void *, size_t, nodeparams_t *))                               \
    X(inst, cuGraphInstantiateWithFlags, cuGraphInstantiate, 12000, (H *, H, unsigned long long)) \
    X(instv1, cuGraphInstantiate, cuGraphInstantiate, 10000, (H *, H, H *, char *, size_t))   \
    X(instparams, cuGraphInstantiateWithParams, cuGraphInstantiateWithParams, 12000,          \
      (H *, H, instparams_t *))                                                                \
    X(execnodeset, cuGraphExecNodeSetParams, cuGraphExecNodeSetParams, 12020,                  \
      (H, H, nodeparams_t *))                                                                  \
    X(execkernelset, cuGraphExecKernelNodeSetParams_v2, cuGraphExecKernelNodeSetParams, 12000, \
      (H, H, const kparams_t *))                                                               \
    X(execchildset, cuGraphExecChildGraphNodeSetParams, cuGraphExecChildGraphNodeSetParams,    \
      11010, (H, H, H))                                                                        \
    X(execupdate, cuGraphExecUpdate_v2, cuGraphExecUpdate, 12000, (H, H, updateinfo_t *))      \
    X(launchgraph, cuGraphLaunch, cuGraphLaunch, 10000, (H, H))                                \
    X(v1alloc, cuMemAlloc, cuMemAlloc, 2000, (unsigned *, unsigned))                           \
    X(v1pitch, cuMemAllocPitch, cuMemAllocPitch, 2000,                                         \
      (unsigned *, unsigned *, unsigned, unsigned, unsigned))                                  \
    X(v1meminfo, cuMemGetInfo, cuMemGetInfo, 2000, (unsigned *, unsigned *))                   \
    X(v1array, cuArrayCreate, cuArrayCreate, 2000, (H *, const arr1_t *))                      \
    X(v1array3d, cuArray3DCreate, cuArray3DCreate, 2000, (H *, const arr3_t *))                \
    X(blockshape, cuFuncSetBlockShape, cuFuncSetBlockShape, 2000, (H, int, int, int))          \
    X(v1launch, cuLaunch, cuLaunch, 2000, (H))                                                 \
    X(v1grid, cuLaunchGrid, cuLaunchGrid, 2000, (H, int, int))                                 \
    X(v1gridasync, cuLaunchGridAsync, cuLaunchGridAsync, 2000, (H, int, int, H))

#define DECLARE_SLOT(slot, sym, base, ver, args) static CUresult(*p_##slot) args;
API(DECLARE_SLOT)
static CUresult (*p_work)(unsigned long long *, unsigned long long *);

#ifdef USE_DLOPEN
typedef CUresult (*getproc_t)(const char *, void **, int, unsigned long long, int *);
static void load(void) {
    void *h = dlopen("libcuda.so.1", RTLD_NOW);
    if (!h) {
        printf("error dlopen %s\n", dlerror());
        exit(1);
    }
#ifdef USE_DLSYM
#define RESOLVE(slot, sym, base, ver, args)                                                    \
    if (!(*(void **)&p_##slot = dlsym(h, #sym))) {                                             \
        printf("error dlsym %s\n", #sym);                                                      \
        exit(1);                                                                               \
    }
#else
    getproc_t getproc = (getproc_t)dlsym(h, "cuGetProcAddress_v2");
    if (!getproc) {
        printf("error dlsym cuGetProcAddress_v2\n");
        exit(1);
    }
    int status = -1;
#define RESOLVE(slot, sym, base, ver, args)                                                    \
    if (getproc(#base, (void **)&p_##slot, ver, 0, &status) || status) {                       \
        printf("error getproc %s %d status %d\n", #base, ver, status);                         \
        exit(1);                                                                               \
    }
#endif
    API(RESOLVE)
    /* Not a CUDA entry point: asked of the simulator itself. */
    *(void **)&p_work = dlsym(h, "gpusimExecutedWork");
}
#else
#define DECLARE_FN(slot, sym, base, ver, args) CUresult sym args;
API(DECLARE_FN)
CUresult gpusimExecutedWork(unsigned long long *, unsigned long long *);
static void load(void) {
#define ASSIGN(slot, sym, base, ver, args) p_##slot = sym;
    API(ASSIGN)
    p_work = gpusimExecutedWork;
}
#endif

static const char *name_of(CUresult rc) {
    const char *s = "?";
    p_errname(rc, &s);
    return s;
}

#define CHECK(op, call)                                                                        \
    do {                                                                                       \
        CUresult rc_ = (call);                                                                 \
        if (rc_) {                                                                             \
            printf("error %s %s\n", op, name_of(rc_));                                         \
            fflush(stdout);                                                                    \
            exit(1);                                                                           \
        }                                                                                      \
    } while (0)

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static H function(const char *name) {
    static H module;
    static const char image[] = "gpusim module";
    H f;
    if (!module) CHECK("module", p_modload(&module, image));
    CHECK("function", p_getfunc(&f, module, name));
    return f;
}

static kparams_t kernel(unsigned blocks, unsigned threads) {
    kparams_t k = {0};
    k.func = function("tiny");
    k.grid[0] = blocks, k.grid[1] = k.grid[2] = 1;
    k.block[0] = threads, k.block[1] = k.block[2] = 1;
    return k;
}

static H add_kernel(H g, unsigned blocks, unsigned threads) {
    H n;
    kparams_t k = kernel(blocks, threads);
    CHECK("addkernel", p_addkernel(&n, g, 0, 0, &k));
    return n;
}

static H graph_of(int kernels, unsigned blocks) {
    H g;
    CHECK("graph", p_graphcreate(&g, 0));
    for (int i = 0; i < kernels; i++) add_kernel(g, blocks, 32);
    return g;
}

static allocnode_t alloc_params(size_t bytes) {
    allocnode_t a;
    memset(&a, 0, sizeof a);
    a.props.alloc_type = 1; /* pinned */
    a.props.loc_type = 1;   /* device 0 */
    a.bytesize = bytes;
    return a;
}

/* Launches `exec` on a new stream and waits. */
static CUresult run_graph(H exec) {
    H s;
    CHECK("stream", p_streamcreate(&s, 0));
    CUresult rc = p_launchgraph(exec, s);
    if (!rc) rc = p_streamsync(s);
    return rc;
}

static CUresult mem_graph(H g) {
    H exec;
    CHECK("instantiate", p_inst(&exec, g, 0));
    return run_graph(exec);
}

/* gcost: an executable graph whose real cost is `*warps` per launch. */
static H costed_graph(const char *how, unsigned *warps) {
    H g, exec, n[4];
    CHECK("graph", p_graphcreate(&g, 0));
    if (!strcmp(how, "addnode")) {
        /* 4 one-warp kernels and a child graph of 4 more, through cuGraphAddNode. */
        nodeparams_t np;
        memset(&np, 0, sizeof np);
        np.type = 0;
        np.kernel = kernel(1, 32);
        for (int i = 0; i < 4; i++) CHECK("addnode", p_addnode2(&n[i], g, 0, 0, 0, &np));
        memset(&np, 0, sizeof np);
        np.type = 4;
        np.graph = graph_of(4, 1);
        H child;
        CHECK("addnode-child", p_addnode1(&child, g, 0, 0, &np));
        CHECK("instantiate", p_inst(&exec, g, 0));
        *warps = 8;
    } else if (!strcmp(how, "setparams") || !strcmp(how, "kernelset")) {
        /* 4 one-warp kernels; then the first becomes 29 warps. */
        for (int i = 0; i < 4; i++) n[i] = add_kernel(g, 1, 32);
        instparams_t ip = {0};
        CHECK("instantiate", p_instparams(&exec, g, &ip));
        kparams_t big = kernel(29, 32);
        if (!strcmp(how, "setparams")) {
            nodeparams_t np;
            memset(&np, 0, sizeof np);
            np.type = 0;
            np.kernel = big;
            CHECK("execnodeset", p_execnodeset(exec, n[0], &np));
        } else {
            CHECK("execkernelset", p_execkernelset(exec, n[0], &big));
        }
        *warps = 32;
    } else if (!strcmp(how, "childset")) {
        /* A kernel and a child graph of one kernel; the child becomes 7 kernels. */
        add_kernel(g, 1, 32);
        nodeparams_t np;
        memset(&np, 0, sizeof np);
        np.type = 4;
        np.graph = graph_of(1, 1);
        H child;
        CHECK("addnode-child", p_addnode1(&child, g, 0, 0, &np));
        CHECK("instantiate", p_inst(&exec, g, 0));
        CHECK("execchildset", p_execchildset(exec, child, graph_of(7, 1)));
        *warps = 8;
    } else if (!strcmp(how, "v1inst")) {
        /* 4 kernels of 8 warps, instantiated through the CUDA 10 symbol. */
        for (int i = 0; i < 4; i++) add_kernel(g, 8, 32);
        char log[64];
        H err;
        CHECK("instantiate", p_instv1(&exec, g, &err, log, sizeof log));
        *warps = 32;
    } else if (!strcmp(how, "update")) {
        /* 4 one-warp kernels, updated to 4 of 8 warps. */
        for (int i = 0; i < 4; i++) add_kernel(g, 1, 32);
        CHECK("instantiate", p_inst(&exec, g, 0));
        updateinfo_t info;
        CHECK("execupdate", p_execupdate(exec, graph_of(4, 8), &info));
        *warps = 32;
    } else {
        printf("error gcost unknown %s\n", how);
        exit(2);
    }
    return exec;
}

static unsigned long long work_kernels, work_warps;
static void work(void) {
    if (!p_work) {
        printf("error gpusimExecutedWork missing\n");
        exit(1);
    }
    CHECK("work", p_work(&work_kernels, &work_warps));
}

/* capture-race: thread A allocates on `race_stream`; thread B begins
 * capturing it 50 ms later. */
static size_t race_bytes;
static H race_stream, race_ctx;
static CUdeviceptr race_ptr;
static CUresult race_rc;
static void *race_alloc(void *arg) {
    (void)arg;
    CHECK("set-current", p_setcur(race_ctx));
    race_rc = p_mallocasync(&race_ptr, race_bytes, race_stream);
    return 0;
}
static void *race_capture(void *arg) {
    (void)arg;
    CHECK("set-current", p_setcur(race_ctx));
    usleep(50 * 1000);
    CHECK("begin-capture", p_begincap(race_stream, 2 /* relaxed */));
    return 0;
}

/* ctx-race: thread A destroys `victim`; thread B, once A is inside the
 * destroy, makes a context and allocates in it. */
static H victim, second;
static CUdevice race_dev;
static volatile int destroying;
static void *destroyer(void *arg) {
    (void)arg;
    destroying = 1;
    CHECK("ctx-destroy", p_ctxdestroy(victim));
    return 0;
}
static void *creator(void *arg) {
    (void)arg;
    while (!destroying) usleep(100);
    usleep(100 * 1000); /* the simulator holds the destroy open longer */
    CHECK("ctx-create", p_ctxcreate(&second, 0, race_dev));
    CUdeviceptr p;
    CHECK("ctx-alloc", p_malloc2(&p, race_bytes));
    return 0;
}

int main(int argc, char **argv) {
    load();
    CHECK("init", p_init(0));
    for (int i = 1; i < argc; i++) {
        const char *op = argv[i];
#define ARG() (i + 1 < argc ? argv[++i] : (printf("error %s missing argument\n", op), exit(2), ""))
        if (!strcmp(op, "dev")) {
            CUdevice d;
            H c;
            CHECK(op, p_devget(&d, atoi(ARG())));
            CHECK(op, p_retain(&c, d));
            CHECK(op, p_setcur(c));
            race_ctx = c;
            printf("dev ok\n");
        } else if (!strcmp(op, "alloc")) {
            CUdeviceptr p;
            printf("alloc %s\n", name_of(p_malloc2(&p, strtoull(ARG(), 0, 10) << 20)));
        } else if (!strcmp(op, "fill")) {
            size_t n = strtoull(ARG(), 0, 10) << 20;
            int count = 0;
            CUresult rc;
            CUdeviceptr p;
            while (!(rc = p_malloc2(&p, n))) count++;
            printf("filled %d %s\n", count, name_of(rc));
        } else if (!strcmp(op, "memnode")) {
            H g, node;
            allocnode_t a = alloc_params(strtoull(ARG(), 0, 10) << 20);
            CHECK("graph", p_graphcreate(&g, 0));
            CUresult rc = p_addmem(&node, g, 0, 0, &a);
            CUresult lrc = rc ? rc : mem_graph(g);
            printf("memnode %s %s\n", name_of(rc), name_of(lrc));
        } else if (!strcmp(op, "addnode-mem")) {
            int v = atoi(ARG());
            H g, node;
            nodeparams_t np;
            memset(&np, 0, sizeof np);
            np.type = 10;
            np.alloc = alloc_params(strtoull(ARG(), 0, 10) << 20);
            CHECK("graph", p_graphcreate(&g, 0));
            CUresult rc = v == 1 ? p_addnode1(&node, g, 0, 0, &np) : p_addnode2(&node, g, 0, 0, 0, &np);
            CUresult lrc = rc ? rc : mem_graph(g);
            printf("addnode-mem %s %s\n", name_of(rc), name_of(lrc));
        } else if (!strcmp(op, "capture-alloc")) {
            size_t n = strtoull(ARG(), 0, 10) << 20;
            H s, g, exec;
            CUdeviceptr p = 0;
            CHECK("stream", p_streamcreate(&s, 0));
            CHECK("begin-capture", p_begincap(s, 0));
            CUresult rc = p_mallocasync(&p, n, s);
            H captured = 0;
            CUresult erc = p_endcap(s, &captured);
            int launches = 0;
            if (!rc && !erc) {
                /* Run it, free what it allocated, run it again: the memory is
                 * the graph's again, whatever was booked at capture. */
                CHECK("instantiate", p_inst(&exec, captured, 0));
                CHECK("launch", p_launchgraph(exec, s));
                CHECK("sync", p_streamsync(s));
                launches++;
                CHECK("free", p_freeasync(p, s));
                CHECK("launch", p_launchgraph(exec, s));
                CHECK("sync", p_streamsync(s));
                launches++;
            }
            (void)g;
            printf("capture-alloc %s %d\n", name_of(rc), launches);
        } else if (!strcmp(op, "capture-race")) {
            race_bytes = strtoull(ARG(), 0, 10) << 20;
            pthread_t a, b;
            H captured = 0, exec;
            CHECK("stream", p_streamcreate(&race_stream, 0));
            pthread_create(&a, 0, race_alloc, 0);
            pthread_create(&b, 0, race_capture, 0);
            pthread_join(a, 0);
            pthread_join(b, 0);
            CUresult erc = p_endcap(race_stream, &captured);
            int launches = 0;
            if (!erc) {
                CHECK("instantiate", p_inst(&exec, captured, 0));
                CHECK("launch", p_launchgraph(exec, race_stream));
                CHECK("sync", p_streamsync(race_stream));
                launches++;
                CHECK("free", p_freeasync(race_ptr, race_stream));
                CHECK("launch", p_launchgraph(exec, race_stream));
                CHECK("sync", p_streamsync(race_stream));
                launches++;
            }
            printf("capture-race %s %s %d\n", name_of(race_rc), name_of(erc), launches);
        } else if (!strcmp(op, "v1")) {
            const char *what = ARG();
            unsigned mib = atoi(ARG());
            unsigned d32 = 0, pitch = 0, f32 = 0, t32 = 0;
            H arr, s;
            CUresult rc;
            if (!strcmp(what, "alloc")) rc = p_v1alloc(&d32, mib << 20);
            else if (!strcmp(what, "pitch")) rc = p_v1pitch(&d32, &pitch, 4096, (mib << 20) / 4096, 4);
            else if (!strcmp(what, "meminfo")) rc = p_v1meminfo(&f32, &t32);
            else if (!strcmp(what, "array")) {
                arr1_t a = {1024, (mib << 20) / 4096, 0x20, 1};
                rc = p_v1array(&arr, &a);
            } else if (!strcmp(what, "array3d")) {
                arr3_t a = {256, 256, (mib << 20) / (256 * 256 * 4), 0x01, 4, 0};
                rc = p_v1array3d(&arr, &a);
            } else {
                H f = function("tiny");
                CHECK("blockshape", p_blockshape(f, 64, 1, 1));
                if (!strcmp(what, "launch")) rc = p_v1launch(f);
                else if (!strcmp(what, "grid")) rc = p_v1grid(f, 8, 2);
                else {
                    CHECK("stream", p_streamcreate(&s, 0));
                    rc = p_v1gridasync(f, 8, 2, s);
                }
                CHECK("sync", p_ctxsync());
            }
            printf("v1 %s %s\n", what, name_of(rc));
        } else if (!strcmp(op, "gcost")) {
            const char *how = ARG();
            double ms = atof(ARG());
            unsigned warps;
            H exec = costed_graph(how, &warps), s;
            CHECK("stream", p_streamcreate(&s, 0));
            work();
            unsigned long long k0 = work_kernels, w0 = work_warps;
            long launches = 0;
            double t0 = now_ms(), end = t0 + ms;
            while (now_ms() < end) {
                CHECK("launch", p_launchgraph(exec, s));
                launches++;
            }
            CHECK("sync", p_streamsync(s));
            double elapsed = now_ms() - t0;
            work();
            printf("gcost %ld %.3f %u %llu %llu\n", launches, elapsed, warps, work_kernels - k0,
                   work_warps - w0);
        } else if (!strcmp(op, "work")) {
            work();
            printf("work %llu %llu\n", work_kernels, work_warps);
        } else if (!strcmp(op, "pool")) {
            size_t n = strtoull(ARG(), 0, 10) << 20;
            poolprops_t props;
            memset(&props, 0, sizeof props);
            props.alloc_type = 1;
            props.loc_type = 1;
            H pool, s;
            CUdeviceptr p;
            CHECK("stream", p_streamcreate(&s, 0));
            CHECK("pool-create", p_poolcreate(&pool, &props));
            unsigned long long keep = ~0ULL; /* release threshold: keep everything */
            CHECK("pool-threshold", p_poolset(pool, 4, &keep));
            CUresult rc = p_poolalloc(&p, n, pool, s);
            if (!rc) CHECK("pool-free", p_freeasync(p, s));
            CHECK("sync", p_streamsync(s));
            CUresult drc = p_pooldestroy(pool);
            printf("pool %s %s\n", name_of(rc), name_of(drc));
        } else if (!strcmp(op, "ctx-race")) {
            race_bytes = strtoull(ARG(), 0, 10) << 20;
            pthread_t a, b;
            CHECK("dev", p_devget(&race_dev, 0));
            CHECK("ctx-create", p_ctxcreate(&victim, 0, race_dev));
            pthread_create(&a, 0, destroyer, 0);
            pthread_create(&b, 0, creator, 0);
            pthread_join(a, 0);
            pthread_join(b, 0);
            printf("ctx-race %d\n", victim == second);
        } else if (!strcmp(op, "ctx-cycle")) {
            size_t n = strtoull(ARG(), 0, 10) << 20;
            H c;
            CUdeviceptr p;
            CUdevice d;
            CHECK("dev", p_devget(&d, 0));
            CHECK("ctx-create", p_ctxcreate(&c, 0, d));
            CUresult rc = p_malloc2(&p, n);
            CHECK("ctx-destroy", p_ctxdestroy(c));
            printf("ctx-cycle %s\n", name_of(rc));
        } else if (!strcmp(op, "ready")) {
            printf("ready\n");
        } else if (!strcmp(op, "hold")) {
            fflush(stdout);
            for (;;) pause();
        } else {
            printf("error unknown-op %s\n", op);
            return 2;
        }
        fflush(stdout);
    }
    return 0;
}
