/*
 * A hostile tenant's program that reaches the driver around the
 * interposer. It loads the driver at path LIB, but resolves
 * cuGetProcAddress_v2 itself, from the driver's own dynamic symbol table
 * (found with dl_iterate_phdr), so no dlsym hook sees the lookup, and
 * every other entry point through it. It creates a context on device 0
 * and prints "ready"; after a line on stdin (at once when the environment
 * has ESCAPE_GO=1, for a program with no one to write to it, a pod's):
 *   escape LIB MIB                  allocates MIB MiB in one piece, prints
 *                                   "alloc <rc>" and holds the memory
 *                                   until killed;
 *   escape LIB run NAME G B K MS    launches kernel NAME (G blocks of B
 *                                   threads) for MS ms of wall time,
 *                                   synchronising after every K launches,
 *                                   then prints "run <launches>".
 * LIB is the driver the interposer wraps, or a private copy of it.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef void *CUcontext;

typedef CUresult (*getproc_t)(const char *, void **, int, unsigned long long, int *);
static getproc_t getproc;
static const char *want;

static int walk(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    (void)data;
    if (!info->dlpi_name || !strstr(info->dlpi_name, want)) return 0;
    const ElfW(Dyn) *dyn = 0;
    for (int i = 0; i < info->dlpi_phnum; i++)
        if (info->dlpi_phdr[i].p_type == PT_DYNAMIC)
            dyn = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[i].p_vaddr);
    if (!dyn) return 0;
    uintptr_t symtab = 0, strtab = 0, end = 0, strsz = 0;
    for (; dyn->d_tag != DT_NULL; dyn++) {
        if (dyn->d_tag == DT_SYMTAB) symtab = dyn->d_un.d_ptr;
        if (dyn->d_tag == DT_STRTAB) strtab = dyn->d_un.d_ptr;
        if (dyn->d_tag == DT_STRSZ) strsz = dyn->d_un.d_val;
    }
    /* glibc relocates these entries on most targets; not on all. */
    if (symtab < info->dlpi_addr) symtab += info->dlpi_addr;
    if (strtab < info->dlpi_addr) strtab += info->dlpi_addr;
    if (!symtab || strtab <= symtab) return 0;
    /* The symbol table ends where the next table begins (.dynstr, or a
     * hash table in between); entries past it fail the checks below. */
    end = strtab;
    const ElfW(Sym) *sym = (const ElfW(Sym) *)symtab;
    size_t n = (end - symtab) / sizeof(ElfW(Sym));
    for (size_t k = 0; k < n; k++) {
        if (sym[k].st_name >= strsz || sym[k].st_shndx == SHN_UNDEF) continue;
        if (!sym[k].st_value || ELF64_ST_TYPE(sym[k].st_info) != STT_FUNC) continue;
        const char *name = (const char *)strtab + sym[k].st_name;
        if (!strcmp(name, "cuGetProcAddress_v2"))
            getproc = (getproc_t)(info->dlpi_addr + sym[k].st_value);
    }
    return 1;
}

static void *resolve(const char *name) {
    void *p = 0;
    int status = -1;
    if (getproc(name, &p, 12080, 0, &status) || status != 0 || !p) {
        printf("error getproc %s\n", name);
        exit(4);
    }
    return p;
}

static double now_ms(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

int main(int argc, char **argv) {
    int run = argc == 8 && !strcmp(argv[2], "run");
    if (argc != 3 && !run) return 2;
    if (!dlopen(argv[1], RTLD_NOW | RTLD_LOCAL)) {
        printf("error dlopen %s\n", dlerror());
        return 3;
    }
    want = argv[1];
    dl_iterate_phdr(walk, 0);
    if (!getproc) {
        printf("error resolve cuGetProcAddress_v2\n");
        return 4;
    }
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))resolve("cuInit");
    CUresult (*get)(int *, int) = (CUresult(*)(int *, int))resolve("cuDeviceGet");
    CUresult (*create)(CUcontext *, unsigned, int) = (CUresult(*)(CUcontext *, unsigned, int))resolve("cuCtxCreate");
    int dev = 0;
    CUcontext ctx = 0;
    CUresult rc = init(0);
    if (!rc) rc = get(&dev, 0);
    if (!rc) rc = create(&ctx, 0, dev);
    if (rc) {
        printf("error context %d\n", rc);
        return 5;
    }
    printf("ready\n");
    fflush(stdout);
    char line[16];
    const char *go = getenv("ESCAPE_GO");
    if (!(go && !strcmp(go, "1")) && !fgets(line, sizeof line, stdin)) return 6;
    if (run) {
        typedef void *CUmodule, *CUfunction;
        CUresult (*load)(CUmodule *, const void *) = (CUresult(*)(CUmodule *, const void *))resolve("cuModuleLoadData");
        CUresult (*function)(CUfunction *, CUmodule, const char *) =
            (CUresult(*)(CUfunction *, CUmodule, const char *))resolve("cuModuleGetFunction");
        CUresult (*launch)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                           void **, void **) =
            (CUresult(*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void *,
                         void **, void **))resolve("cuLaunchKernel");
        CUresult (*sync)(void) = (CUresult(*)(void))resolve("cuCtxSynchronize");
        static const char image[] = "gpusim module";
        CUmodule m = 0;
        CUfunction f = 0;
        rc = load(&m, image);
        if (!rc) rc = function(&f, m, argv[3]);
        if (rc) {
            printf("error function %d\n", rc);
            return 7;
        }
        unsigned g = atoi(argv[4]), b = atoi(argv[5]);
        long k = atol(argv[6]), n = 0;
        double end = now_ms() + atof(argv[7]);
        while (now_ms() < end) {
            for (long j = 0; j < k && !rc; j++, n++) rc = launch(f, g, 1, 1, b, 1, 1, 0, 0, 0, 0);
            if (!rc) rc = sync();
            if (rc) {
                printf("error launch %d\n", rc);
                return 8;
            }
        }
        printf("run %ld\n", n);
        fflush(stdout);
        return 0;
    }
    CUresult (*alloc)(unsigned long long *, size_t) = (CUresult(*)(unsigned long long *, size_t))resolve("cuMemAlloc");
    unsigned long long ptr = 0;
    rc = alloc(&ptr, (size_t)strtoull(argv[2], 0, 10) << 20);
    printf("alloc %d\n", rc);
    fflush(stdout);
    for (;;) pause();
}
