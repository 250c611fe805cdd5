/*
 * dlsym must behave as without the interposer for everything it does not
 * hook: RTLD_DEFAULT and RTLD_NEXT lookups from the program find the C
 * library's functions, and a library handle without CUDA symbols does not
 * suddenly have them.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <unistd.h>

int main(void) {
    void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
    printf("default %s\n", dlsym(RTLD_DEFAULT, "getpid") == (void *)getpid ? "same" : "different");
    printf("next %s\n", dlsym(RTLD_NEXT, "getpid") == (void *)getpid ? "same" : "different");
    printf("libc-cuda %s\n", dlsym(libc, "cuMemAlloc_v2") ? "present" : "absent");
    printf("missing %s\n", dlsym(RTLD_DEFAULT, "no_such_symbol_anywhere") ? "present" : "absent");
    return 0;
}
