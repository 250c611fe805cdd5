/* Loads libnvidia-ml.so.1 at run time, as nvml-wrapper and most tools do,
 * and prints the devices. */
#include <dlfcn.h>
#include <stdio.h>

typedef struct nvmlDevice_st *nvmlDevice_t;

int main(void) {
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        printf("dlopen failed: %s\n", dlerror());
        return 1;
    }
    int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
    int (*shutdown)(void) = (int (*)(void))dlsym(lib, "nvmlShutdown");
    int (*count)(unsigned int *) = (int (*)(unsigned int *))dlsym(lib, "nvmlDeviceGetCount_v2");
    int (*by_index)(unsigned int, nvmlDevice_t *) =
        (int (*)(unsigned int, nvmlDevice_t *))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    int (*name)(nvmlDevice_t, char *, unsigned int) =
        (int (*)(nvmlDevice_t, char *, unsigned int))dlsym(lib, "nvmlDeviceGetName");
    int (*uuid)(nvmlDevice_t, char *, unsigned int) =
        (int (*)(nvmlDevice_t, char *, unsigned int))dlsym(lib, "nvmlDeviceGetUUID");
    if (!init || !shutdown || !count || !by_index || !name || !uuid) {
        printf("dlsym failed\n");
        return 1;
    }
    printf("missing_symbol=%d\n", dlsym(lib, "nvmlDeviceGetNotAFunction") == NULL);
    printf("init=%d\n", init());
    unsigned int n = 0;
    count(&n);
    printf("count=%u\n", n);
    for (unsigned int i = 0; i < n; i++) {
        nvmlDevice_t d;
        char s[96], u[96];
        by_index(i, &d);
        name(d, s, sizeof s);
        uuid(d, u, sizeof u);
        printf("gpu%u=%s|%s\n", i, s, u);
    }
    printf("shutdown=%d\n", shutdown());
    return 0;
}
