/* The few NVML declarations the test programs need, written from the NVML
 * API documentation (API version 12). Deliberately not nvml.h: the tests
 * check the library against the ABI, not against a header it came with. */
#ifndef GPUSIM_TEST_NVML_DECLS_H
#define GPUSIM_TEST_NVML_DECLS_H

typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlEventSet_st *nvmlEventSet_t;

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

typedef struct {
    unsigned int version;
    unsigned long long total, reserved, free, used;
} nvmlMemory_v2_t;
#define NVML_MEMORY_V2 ((unsigned int)(sizeof(nvmlMemory_v2_t) | (2u << 24)))

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
} nvmlProcessInfo_v1_t;

typedef struct {
    unsigned int pid;
    unsigned long long usedGpuMemory;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlProcessInfo_t;

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

typedef struct {
    unsigned int gpu, memory;
} nvmlUtilization_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

#define NVML_EVENT_XID 0x8ULL

int nvmlInit_v2(void);
int nvmlShutdown(void);
const char *nvmlErrorString(int);
int nvmlSystemGetDriverVersion(char *, unsigned int);
int nvmlSystemGetNVMLVersion(char *, unsigned int);
int nvmlSystemGetCudaDriverVersion(int *);
int nvmlDeviceGetCount_v2(unsigned int *);
int nvmlDeviceGetHandleByIndex_v2(unsigned int, nvmlDevice_t *);
int nvmlDeviceGetHandleByUUID(const char *, nvmlDevice_t *);
int nvmlDeviceGetHandleByPciBusId_v2(const char *, nvmlDevice_t *);
int nvmlDeviceGetIndex(nvmlDevice_t, unsigned int *);
int nvmlDeviceGetName(nvmlDevice_t, char *, unsigned int);
int nvmlDeviceGetUUID(nvmlDevice_t, char *, unsigned int);
int nvmlDeviceGetMinorNumber(nvmlDevice_t, unsigned int *);
int nvmlDeviceGetMemoryInfo(nvmlDevice_t, nvmlMemory_t *);
int nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t, nvmlMemory_v2_t *);
int nvmlDeviceGetUtilizationRates(nvmlDevice_t, nvmlUtilization_t *);
int nvmlDeviceGetProcessUtilization(nvmlDevice_t, nvmlProcessUtilizationSample_t *, unsigned int *, unsigned long long);
int nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t, unsigned int *, nvmlProcessInfo_v1_t *);
int nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);
int nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t, unsigned int *, nvmlProcessInfo_t *);
int nvmlDeviceGetPciInfo_v3(nvmlDevice_t, nvmlPciInfo_t *);
int nvmlDeviceGetNumaNodeId(nvmlDevice_t, unsigned int *);
int nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t, nvmlDevice_t, unsigned int *);
int nvmlDeviceGetNvLinkState(nvmlDevice_t, unsigned int, unsigned int *);
int nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t, unsigned int, nvmlPciInfo_t *);
int nvmlDeviceGetMigMode(nvmlDevice_t, unsigned int *, unsigned int *);
int nvmlDeviceGetCudaComputeCapability(nvmlDevice_t, int *, int *);
int nvmlDeviceGetNumGpuCores(nvmlDevice_t, unsigned int *);
int nvmlDeviceGetTemperature(nvmlDevice_t, unsigned int, unsigned int *);
int nvmlDeviceGetPowerUsage(nvmlDevice_t, unsigned int *);
int nvmlDeviceGetClockInfo(nvmlDevice_t, unsigned int, unsigned int *);
int nvmlEventSetCreate(nvmlEventSet_t *);
int nvmlDeviceRegisterEvents(nvmlDevice_t, unsigned long long, nvmlEventSet_t);
int nvmlDeviceGetSupportedEventTypes(nvmlDevice_t, unsigned long long *);
int nvmlEventSetWait_v2(nvmlEventSet_t, nvmlEventData_t *, unsigned int);
int nvmlEventSetFree(nvmlEventSet_t);

#endif
