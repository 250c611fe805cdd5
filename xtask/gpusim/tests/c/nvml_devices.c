/*
 * Which GPUs and processes NVML shows this process, for the simulator's
 * namespace tests: "count <n>", then per device index
 * "gpu <index> <uuid> <minor> <bus id> <total bytes> <used bytes>" and
 * "proc <index> <pid> <bytes>" for each running compute process, and
 * "self <index> <nvmlDeviceGetIndex>" for the handle found by UUID. Loads
 * libnvidia-ml.so.1 with dlopen, as monitoring agents do.
 */
#include <dlfcn.h>
#include <stdio.h>

typedef void *nvmlDevice_t;
typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} proc_t;
typedef struct {
    unsigned long long total, free, used;
} mem_t;
typedef struct {
    char legacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} pci_t;

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
    LOAD(int, nvmlDeviceGetCount_v2, (unsigned *))
    LOAD(int, nvmlDeviceGetHandleByIndex_v2, (unsigned, nvmlDevice_t *))
    LOAD(int, nvmlDeviceGetHandleByUUID, (const char *, nvmlDevice_t *))
    LOAD(int, nvmlDeviceGetIndex, (nvmlDevice_t, unsigned *))
    LOAD(int, nvmlDeviceGetUUID, (nvmlDevice_t, char *, unsigned))
    LOAD(int, nvmlDeviceGetMinorNumber, (nvmlDevice_t, unsigned *))
    LOAD(int, nvmlDeviceGetPciInfo_v3, (nvmlDevice_t, pci_t *))
    LOAD(int, nvmlDeviceGetMemoryInfo, (nvmlDevice_t, mem_t *))
    LOAD(int, nvmlDeviceGetComputeRunningProcesses_v3, (nvmlDevice_t, unsigned *, proc_t *))
    unsigned count;
    if (nvmlInit_v2() || nvmlDeviceGetCount_v2(&count)) {
        printf("error init\n");
        return 1;
    }
    printf("count %u\n", count);
    for (unsigned i = 0; i < count; i++) {
        nvmlDevice_t d, again;
        char uuid[96];
        unsigned minor, index;
        pci_t pci;
        mem_t m;
        if (nvmlDeviceGetHandleByIndex_v2(i, &d) || nvmlDeviceGetUUID(d, uuid, sizeof uuid) ||
            nvmlDeviceGetMinorNumber(d, &minor) || nvmlDeviceGetPciInfo_v3(d, &pci) ||
            nvmlDeviceGetMemoryInfo(d, &m)) {
            printf("error device %u\n", i);
            return 1;
        }
        printf("gpu %u %s %u %s %llu %llu\n", i, uuid, minor, pci.busId, m.total, m.used);
        if (nvmlDeviceGetHandleByUUID(uuid, &again) || nvmlDeviceGetIndex(again, &index)) {
            printf("error uuid %u\n", i);
            return 1;
        }
        printf("self %u %u\n", i, index);
        proc_t procs[64];
        unsigned n = 64;
        if (nvmlDeviceGetComputeRunningProcesses_v3(d, &n, procs)) {
            printf("error processes %u\n", i);
            return 1;
        }
        for (unsigned p = 0; p < n; p++) printf("proc %u %u %llu\n", i, procs[p].pid, procs[p].usedGpuMemory);
    }
    return 0;
}
