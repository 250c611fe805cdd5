/*
 * A helper library that looks the driver up itself. Built under file
 * names that start like the driver's (libcuda.so.helper,
 * libnvidia-ml.so.helper) and linked against libcuda: if the interposer
 * trusted names, its dlsym lookups would get the real functions.
 *
 * helper_fill(how, mib): initialises CUDA on device 0 with functions found
 * by dlsym on the libcuda handle (how = 0) or RTLD_NEXT (how = 1), then
 * allocates `mib` MiB with the found cuMemAlloc_v2 up to 30 times. Returns
 * how many allocations succeeded and the last result in *last.
 *
 * helper_nvml_total(): device 0's total memory as NVML functions found by
 * dlsym on the libnvidia-ml handle report it (0 on failure).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;

int helper_fill(int how, int mib, CUresult *last) {
    void *h = how == 0 ? dlopen("libcuda.so.1", RTLD_NOW) : RTLD_NEXT;
    if (!h) return -1;
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))dlsym(h, "cuInit");
    CUresult (*get)(int *, int) = (CUresult(*)(int *, int))dlsym(h, "cuDeviceGet");
    CUresult (*retain)(void **, int) = (CUresult(*)(void **, int))dlsym(h, "cuDevicePrimaryCtxRetain");
    CUresult (*set)(void *) = (CUresult(*)(void *))dlsym(h, "cuCtxSetCurrent");
    CUresult (*alloc)(CUdeviceptr *, size_t) =
        (CUresult(*)(CUdeviceptr *, size_t))dlsym(h, "cuMemAlloc_v2");
    if (!init || !get || !retain || !set || !alloc) return -2;
    int dev;
    void *ctx;
    if ((*last = init(0)) || (*last = get(&dev, 0)) || (*last = retain(&ctx, dev)) ||
        (*last = set(ctx)))
        return -3;
    int n = 0;
    for (int i = 0; i < 30; i++) {
        CUdeviceptr p;
        if ((*last = alloc(&p, (size_t)mib << 20))) break;
        n++;
    }
    return n;
}

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;

unsigned long long helper_nvml_total(void) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!h) return 0;
    int (*init)(void) = (int (*)(void))dlsym(h, "nvmlInit_v2");
    int (*get)(unsigned, void **) = (int (*)(unsigned, void **))dlsym(h, "nvmlDeviceGetHandleByIndex_v2");
    int (*info)(void *, nvmlMemory_t *) = (int (*)(void *, nvmlMemory_t *))dlsym(h, "nvmlDeviceGetMemoryInfo");
    void *dev;
    nvmlMemory_t m;
    if (!init || !get || !info || init() || get(0, &dev) || info(dev, &m)) return 0;
    return m.total;
}
