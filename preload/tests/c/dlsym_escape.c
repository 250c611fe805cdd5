/*
 * dlsym_escape HELPER HOW: loads the helper library at path HELPER, lets
 * it allocate 100 MiB pieces through functions it found with dlsym (HOW:
 * 0 = on the libcuda handle, 1 = RTLD_NEXT) and prints
 * "allocs <count> <last CUresult>", and the total memory NVML functions
 * it found report: "nvml-total <bytes>". Then asks the driver whether its own
 * dlsym lookups still find its own functions: "driver-own <0|1> <rc>".
 * Prints "ready" and holds its memory until killed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef int CUresult;

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    void *helper = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!helper) {
        printf("error dlopen %s\n", dlerror());
        return 3;
    }
    int (*fill)(int, int, CUresult *) = (int (*)(int, int, CUresult *))dlsym(helper, "helper_fill");
    if (!fill) return 4;
    CUresult last = 0;
    int n = fill(atoi(argv[2]), 100, &last);
    printf("allocs %d %d\n", n, last);
    unsigned long long (*nvml_total)(void) =
        (unsigned long long (*)(void))dlsym(helper, "helper_nvml_total");
    printf("nvml-total %llu\n", nvml_total ? nvml_total() : 0);
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
    CUresult (*own)(const char *, int *) =
        cuda ? (CUresult(*)(const char *, int *))dlsym(cuda, "gpusimLooksUpItself") : NULL;
    int yes = -1;
    CUresult rc = own ? own("cuMemAlloc_v2", &yes) : -1;
    printf("driver-own %d %d\nready\n", yes, rc);
    fflush(stdout);
    for (;;) pause();
}
