/*
 * escape LIB MIB: a hostile tenant's program that reaches the driver
 * around the interposer. It loads the driver at path LIB, but resolves
 * its entry points itself, from the driver's own dynamic symbol table
 * (found with dl_iterate_phdr), so no dlsym hook sees the lookups. It
 * creates a context on device 0 and prints "ready"; after a line on
 * stdin it allocates MIB MiB in one piece, prints "alloc <rc>" and holds
 * the memory until killed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
typedef void *CUcontext;

static const char *names[] = {"cuInit", "cuDeviceGet", "cuCtxCreate_v2", "cuMemAlloc_v2"};
#define NNAMES (sizeof names / sizeof names[0])
static void *found[NNAMES];
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
        for (size_t j = 0; j < NNAMES; j++)
            if (!strcmp(name, names[j])) found[j] = (void *)(info->dlpi_addr + sym[k].st_value);
    }
    return 1;
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    if (!dlopen(argv[1], RTLD_NOW | RTLD_LOCAL)) {
        printf("error dlopen %s\n", dlerror());
        return 3;
    }
    want = argv[1];
    dl_iterate_phdr(walk, 0);
    for (size_t j = 0; j < NNAMES; j++)
        if (!found[j]) {
            printf("error resolve %s\n", names[j]);
            return 4;
        }
    CUresult (*init)(unsigned) = (CUresult(*)(unsigned))found[0];
    CUresult (*get)(int *, int) = (CUresult(*)(int *, int))found[1];
    CUresult (*create)(CUcontext *, unsigned, int) = (CUresult(*)(CUcontext *, unsigned, int))found[2];
    CUresult (*alloc)(unsigned long long *, size_t) = (CUresult(*)(unsigned long long *, size_t))found[3];
    int dev = 0;
    CUcontext ctx = 0;
    unsigned long long ptr = 0;
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
    if (!fgets(line, sizeof line, stdin)) return 6;
    rc = alloc(&ptr, (size_t)strtoull(argv[2], 0, 10) << 20);
    printf("alloc %d\n", rc);
    fflush(stdout);
    for (;;) pause();
}
