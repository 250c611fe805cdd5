/* Linked against libnvidia-ml.so.1: registers for Xid events on GPU <argv[1]>,
 * says "ready", then prints each event (or error) of <argv[2]> waits of
 * 5 s each. */
#include <stdio.h>
#include <stdlib.h>

#include "decls.h"

int main(int argc, char **argv) {
    unsigned int gpu = argc > 1 ? atoi(argv[1]) : 0;
    int waits = argc > 2 ? atoi(argv[2]) : 1;
    nvmlDevice_t d;
    nvmlEventSet_t set;
    nvmlEventData_t e;
    unsigned long long supported = 0;
    unsigned int idx;

    setvbuf(stdout, NULL, _IOLBF, 0);
    if (nvmlInit_v2() || nvmlDeviceGetHandleByIndex_v2(gpu, &d) || nvmlEventSetCreate(&set)) {
        printf("setup failed\n");
        return 1;
    }
    nvmlDeviceGetSupportedEventTypes(d, &supported);
    printf("supported=%llx\n", supported);
    printf("register_unsupported=%d\n", nvmlDeviceRegisterEvents(d, 0x2, set));
    printf("register=%d\n", nvmlDeviceRegisterEvents(d, NVML_EVENT_XID, set));
    printf("quick_wait=%d\n", nvmlEventSetWait_v2(set, &e, 10));
    printf("ready\n");
    for (int i = 0; i < waits; i++) {
        int r = nvmlEventSetWait_v2(set, &e, 5000);
        if (r != 0) {
            printf("wait=%d\n", r);
            continue;
        }
        nvmlDeviceGetIndex(e.device, &idx);
        printf("event gpu=%u type=%llx xid=%llu gi=%x\n", idx, e.eventType, e.eventData, e.gpuInstanceId);
    }
    nvmlMemory_t m;
    printf("mem_after=%d\n", nvmlDeviceGetMemoryInfo(d, &m));
    printf("free=%d\n", nvmlEventSetFree(set));
    printf("free_again=%d\n", nvmlEventSetFree(set));
    nvmlShutdown();
    return 0;
}
