/*
 * What NVML says about GPU 0 of the simulated node, for the simulator's
 * tests: one line per running compute process ("proc <pid> <bytes>"), per
 * utilisation sample of the last second ("sample <pid> <sm%>"), and the
 * device utilisation ("util <gpu%> <mem%>") and memory ("mem <total> <free>
 * <used>", "mem2 <total> <reserved> <free> <used>"). Loads libnvidia-ml.so.1
 * with dlopen, as monitoring agents do.
 */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/time.h>

typedef void *nvmlDevice_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} proc_t;
typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} sample_t;
typedef struct {
    unsigned int gpu, memory;
} util_t;
typedef struct {
    unsigned long long total, free, used;
} mem_t;
typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} mem2_t;

#define LOAD(ret, name, args)                                                    \
    ret(*name) args = (ret(*) args)dlsym(h, #name);                              \
    if (!name) {                                                                 \
        printf("error dlsym %s\n", #name);                                       \
        return 1;                                                                \
    }

int main(void) {
    void *h = dlopen("libnvidia-ml.so.1", RTLD_NOW);
    if (!h) {
        printf("error dlopen %s\n", dlerror());
        return 1;
    }
    LOAD(int, nvmlInit_v2, (void))
    LOAD(int, nvmlDeviceGetHandleByIndex_v2, (unsigned, nvmlDevice_t *))
    LOAD(int, nvmlDeviceGetComputeRunningProcesses_v3, (nvmlDevice_t, unsigned *, proc_t *))
    LOAD(int, nvmlDeviceGetProcessUtilization, (nvmlDevice_t, sample_t *, unsigned *, unsigned long long))
    LOAD(int, nvmlDeviceGetUtilizationRates, (nvmlDevice_t, util_t *))
    LOAD(int, nvmlDeviceGetMemoryInfo, (nvmlDevice_t, mem_t *))
    LOAD(int, nvmlDeviceGetMemoryInfo_v2, (nvmlDevice_t, mem2_t *))
    nvmlDevice_t d;
    if (nvmlInit_v2() || nvmlDeviceGetHandleByIndex_v2(0, &d)) {
        printf("error init\n");
        return 1;
    }
    proc_t procs[64];
    unsigned n = 64;
    int rc = nvmlDeviceGetComputeRunningProcesses_v3(d, &n, procs);
    if (rc) {
        printf("error processes %d\n", rc);
        return 1;
    }
    for (unsigned i = 0; i < n; i++) printf("proc %u %llu\n", procs[i].pid, procs[i].usedGpuMemory);
    struct timeval tv;
    gettimeofday(&tv, 0);
    unsigned long long since = (tv.tv_sec - 1) * 1000000ULL + tv.tv_usec;
    sample_t samples[64];
    n = 64;
    rc = nvmlDeviceGetProcessUtilization(d, samples, &n, since);
    if (rc == 0)
        for (unsigned i = 0; i < n; i++) printf("sample %u %u\n", samples[i].pid, samples[i].smUtil);
    util_t u;
    if (nvmlDeviceGetUtilizationRates(d, &u)) {
        printf("error utilization\n");
        return 1;
    }
    printf("util %u %u\n", u.gpu, u.memory);
    mem_t m;
    if (nvmlDeviceGetMemoryInfo(d, &m) == 0) printf("mem %llu %llu %llu\n", m.total, m.free, m.used);
    mem2_t m2 = {(unsigned)sizeof(mem2_t) | (2u << 24), 0, 0, 0, 0};
    if (nvmlDeviceGetMemoryInfo_v2(d, &m2) == 0)
        printf("mem2 %llu %llu %llu %llu\n", m2.total, m2.reserved, m2.free, m2.used);
    return 0;
}
