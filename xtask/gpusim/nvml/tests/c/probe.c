/* Linked against libnvidia-ml.so.1: prints what NVML reports about every
 * GPU, one key=value per line, then checks the error paths. */
#include <stdio.h>
#include <string.h>

#include "decls.h"

#define CHECK(call)                                                            \
    do {                                                                       \
        int r_ = (call);                                                       \
        if (r_ != 0) {                                                         \
            printf("fail=%s -> %d\n", #call, r_);                              \
            return 1;                                                          \
        }                                                                      \
    } while (0)

static void print_device(unsigned int i, nvmlDevice_t d) {
    char s[96];
    unsigned int u, v;
    int a, b;
    nvmlMemory_t m1;
    nvmlMemory_v2_t m2;
    nvmlPciInfo_t pci;
    nvmlUtilization_t util;

    memset(s, 0, sizeof s);
    printf("gpu%u.name.ret=%d\n", i, nvmlDeviceGetName(d, s, sizeof s));
    printf("gpu%u.name=%s\n", i, s);
    nvmlDeviceGetUUID(d, s, sizeof s);
    printf("gpu%u.uuid=%s\n", i, s);
    nvmlDeviceGetIndex(d, &u);
    printf("gpu%u.index=%u\n", i, u);
    nvmlDeviceGetMinorNumber(d, &u);
    printf("gpu%u.minor=%u\n", i, u);

    printf("gpu%u.mem.ret=%d\n", i, nvmlDeviceGetMemoryInfo(d, &m1));
    printf("gpu%u.mem.total=%llu\n", i, m1.total);
    printf("gpu%u.mem.used=%llu\n", i, m1.used);
    printf("gpu%u.mem.free=%llu\n", i, m1.free);
    memset(&m2, 0, sizeof m2);
    m2.version = NVML_MEMORY_V2;
    printf("gpu%u.mem2.ret=%d\n", i, nvmlDeviceGetMemoryInfo_v2(d, &m2));
    printf("gpu%u.mem2.total=%llu\n", i, m2.total);
    printf("gpu%u.mem2.reserved=%llu\n", i, m2.reserved);
    printf("gpu%u.mem2.used=%llu\n", i, m2.used);
    printf("gpu%u.mem2.free=%llu\n", i, m2.free);

    memset(&pci, 0, sizeof pci);
    nvmlDeviceGetPciInfo_v3(d, &pci);
    printf("gpu%u.pci.busId=%s\n", i, pci.busId);
    printf("gpu%u.pci.busIdLegacy=%s\n", i, pci.busIdLegacy);
    printf("gpu%u.pci.bus=%u\n", i, pci.bus);
    printf("gpu%u.pci.deviceId=0x%08x\n", i, pci.pciDeviceId);

    printf("gpu%u.numa.ret=%d\n", i, nvmlDeviceGetNumaNodeId(d, &u));
    printf("gpu%u.numa=%u\n", i, u);
    nvmlDeviceGetCudaComputeCapability(d, &a, &b);
    printf("gpu%u.cc=%d.%d\n", i, a, b);
    nvmlDeviceGetNumGpuCores(d, &u);
    printf("gpu%u.cores=%u\n", i, u);
    printf("gpu%u.mig.ret=%d\n", i, nvmlDeviceGetMigMode(d, &u, &v));
    printf("gpu%u.mig=%u/%u\n", i, u, v);

    for (unsigned int l = 0;; l++) {
        int r = nvmlDeviceGetNvLinkState(d, l, &u);
        if (r != 0) {
            printf("gpu%u.nvlink.end=%u:%d\n", i, l, r);
            break;
        }
        if (!u) {
            printf("gpu%u.nvlink.active=%u\n", i, l);
            break;
        }
        memset(&pci, 0, sizeof pci);
        nvmlDeviceGetNvLinkRemotePciInfo_v2(d, l, &pci);
        printf("gpu%u.nvlink%u.remote=%s\n", i, l, pci.busId);
    }

    printf("gpu%u.util.ret=%d\n", i, nvmlDeviceGetUtilizationRates(d, &util));
    printf("gpu%u.util.gpu=%u\n", i, util.gpu);

    {
        nvmlProcessInfo_t p[8];
        nvmlProcessInfo_v1_t p1[8];
        unsigned int n = 0;
        printf("gpu%u.procs.size.ret=%d\n", i, nvmlDeviceGetComputeRunningProcesses_v3(d, &n, NULL));
        printf("gpu%u.procs.size=%u\n", i, n);
        n = 8;
        printf("gpu%u.procs.ret=%d\n", i, nvmlDeviceGetComputeRunningProcesses_v3(d, &n, p));
        printf("gpu%u.procs.n=%u\n", i, n);
        for (unsigned int k = 0; k < n; k++)
            printf("gpu%u.proc%u=%u:%llu:%x\n", i, k, p[k].pid, p[k].usedGpuMemory, p[k].gpuInstanceId);
        n = 8;
        nvmlDeviceGetComputeRunningProcesses(d, &n, p1);
        for (unsigned int k = 0; k < n; k++)
            printf("gpu%u.proc%u.v1=%u:%llu\n", i, k, p1[k].pid, p1[k].usedGpuMemory);
        n = 8;
        printf("gpu%u.graphics.ret=%d\n", i, nvmlDeviceGetGraphicsRunningProcesses_v3(d, &n, p));
        printf("gpu%u.graphics.n=%u\n", i, n);
    }
    {
        nvmlProcessUtilizationSample_t smp[8];
        unsigned int n = 0;
        int r = nvmlDeviceGetProcessUtilization(d, NULL, &n, 0);
        printf("gpu%u.samples.size.ret=%d\n", i, r);
        printf("gpu%u.samples.size=%u\n", i, n);
        n = 8;
        r = nvmlDeviceGetProcessUtilization(d, smp, &n, 0);
        printf("gpu%u.samples.ret=%d\n", i, r);
        for (unsigned int k = 0; r == 0 && k < n; k++)
            printf("gpu%u.sample%u=%u:%u\n", i, k, smp[k].pid, smp[k].smUtil);
    }
    printf("gpu%u.temp.ret=%d\n", i, nvmlDeviceGetTemperature(d, 0, &u));
    printf("gpu%u.power.ret=%d\n", i, nvmlDeviceGetPowerUsage(d, &u));
    printf("gpu%u.power=%u\n", i, u);
    printf("gpu%u.smclock.ret=%d\n", i, nvmlDeviceGetClockInfo(d, 1, &u));
}

int main(void) {
    unsigned int count = 0, u;
    char s[96], tiny[4];
    nvmlDevice_t d0, d1, d, last;
    nvmlMemory_v2_t m2;
    int cuda;

    printf("before_init=%d\n", nvmlDeviceGetCount_v2(&count));
    CHECK(nvmlInit_v2());
    CHECK(nvmlSystemGetDriverVersion(s, sizeof s));
    printf("driver=%s\n", s);
    CHECK(nvmlSystemGetNVMLVersion(s, sizeof s));
    printf("nvml_version=%s\n", s);
    CHECK(nvmlSystemGetCudaDriverVersion(&cuda));
    printf("cuda=%d\n", cuda);
    CHECK(nvmlDeviceGetCount_v2(&count));
    printf("count=%u\n", count);
    for (unsigned int i = 0; i < count; i++) {
        CHECK(nvmlDeviceGetHandleByIndex_v2(i, &d));
        print_device(i, d);
    }

    CHECK(nvmlDeviceGetHandleByIndex_v2(0, &d0));
    CHECK(nvmlDeviceGetHandleByIndex_v2(1, &d1));
    CHECK(nvmlDeviceGetHandleByIndex_v2(count - 1, &last));
    nvmlDeviceGetTopologyCommonAncestor(d0, d0, &u);
    printf("topo.0.0=%u\n", u);
    nvmlDeviceGetTopologyCommonAncestor(d0, d1, &u);
    printf("topo.0.1=%u\n", u);
    nvmlDeviceGetTopologyCommonAncestor(d0, last, &u);
    printf("topo.0.last=%u\n", u);

    nvmlDeviceGetUUID(last, s, sizeof s);
    d = 0;
    nvmlDeviceGetHandleByUUID(s, &d);
    printf("by_uuid=%d\n", d == last);
    nvmlPciInfo_t pci;
    nvmlDeviceGetPciInfo_v3(d1, &pci);
    for (char *c = pci.busId; *c; c++)
        if (*c >= 'A' && *c <= 'F')
            *c += 'a' - 'A';
    d = 0;
    nvmlDeviceGetHandleByPciBusId_v2(pci.busId, &d);
    printf("by_bus=%d\n", d == d1);

    /* Error paths. */
    printf("err.null_count=%d\n", nvmlDeviceGetCount_v2(NULL));
    printf("err.small_name=%d\n", nvmlDeviceGetName(d0, tiny, sizeof tiny));
    memset(&m2, 0, sizeof m2);
    m2.version = 1;
    printf("err.mem_version=%d\n", nvmlDeviceGetMemoryInfo_v2(d0, &m2));
    printf("err.null_mem=%d\n", nvmlDeviceGetMemoryInfo_v2(d0, NULL));
    printf("err.forged_handle=%d\n", nvmlDeviceGetName((nvmlDevice_t)0x1234, s, sizeof s));
    printf("err.stack_handle=%d\n", nvmlDeviceGetName((nvmlDevice_t)&u, s, sizeof s));
    printf("err.bad_index=%d\n", nvmlDeviceGetHandleByIndex_v2(count, &d));
    printf("err.unknown_uuid=%d\n", nvmlDeviceGetHandleByUUID("GPU-00000000-0000-0000-0000-00000000dead", &d));
    printf("err.nvlink_past_max=%d\n", nvmlDeviceGetNvLinkState(d0, 18, &u));
    printf("err.string15=%s\n", nvmlErrorString(15));
    printf("err.string_unknown=%s\n", nvmlErrorString(4242));

    /* Reference counting: two inits need two shutdowns. */
    CHECK(nvmlInit_v2());
    printf("shutdown1=%d\n", nvmlShutdown());
    printf("after_one_shutdown=%d\n", nvmlDeviceGetCount_v2(&count));
    printf("shutdown2=%d\n", nvmlShutdown());
    printf("after_two_shutdowns=%d\n", nvmlDeviceGetCount_v2(&count));
    printf("shutdown3=%d\n", nvmlShutdown());
    return 0;
}
