/*
 * Cost of the driver calls the interposer wraps, measured from a program
 * linked against libcuda.so.1: run it once plain and once under
 * LD_PRELOAD=libtessera.so and compare.
 *
 *   bench N_LAUNCH N_ALLOC ROUNDS -> "launch <ns per call>" and
 *                                    "allocfree <ns per pair>"
 *
 * Each figure is the best of ROUNDS rounds.
 *
 *   bench paired ROUNDS BATCH -> "paired_bound_to_driver <0|1>"
 *                                "paired_launch <added> <direct> <through>"
 *                                "paired_allocfree <added> <direct> <through>"
 *
 * The same calls, in one process, through the dynamic linker's binding
 * (under LD_PRELOAD: the interposer's hook) and directly into the
 * driver library's own definition (found in its ELF symbol table, so no
 * hooked lookup is asked), in alternating batches of BATCH calls; each
 * figure is the median over ROUNDS rounds of ns per call, and "added" is
 * the median of each round's difference. Both sides share the process,
 * its caches and its address layout, which separate runs do not, so the
 * difference is the hook's alone. Without LD_PRELOAD both sides reach the
 * same function and "added" is the method's own zero.
 */
#define _GNU_SOURCE
#include <elf.h>
#include <fcntl.h>
#include <link.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef int CUresult;
typedef void *CUcontext, *CUmodule, *CUfunction, *CUstream;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned);
CUresult cuDevicePrimaryCtxRetain(CUcontext *, int);
CUresult cuCtxSetCurrent(CUcontext);
CUresult cuCtxSynchronize(void);
CUresult cuModuleLoadData(CUmodule *, const void *);
CUresult cuModuleGetFunction(CUfunction *, CUmodule, const char *);
CUresult cuLaunchKernel(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                        unsigned, CUstream, void **, void **);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

#define CHECK(x)                                                                   \
    do {                                                                           \
        if (x) {                                                                   \
            printf("error %s\n", #x);                                              \
            return 1;                                                              \
        }                                                                          \
    } while (0)

/* The address of `name` as defined by the loaded object whose file name
 * contains `object`, from that file's .dynsym; NULL if not found. */
struct lookup {
    const char *object, *name;
    void *found;
};

static void *symbol_in_file(const char *path, ElfW(Addr) base, const char *name) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    struct stat st;
    void *found = NULL;
    if (fstat(fd, &st) == 0 && (size_t)st.st_size >= sizeof(ElfW(Ehdr))) {
        const unsigned char *f = mmap(NULL, st.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (f != MAP_FAILED) {
            const ElfW(Ehdr) *eh = (const void *)f;
            size_t end = eh->e_shoff + (size_t)eh->e_shnum * sizeof(ElfW(Shdr));
            if (memcmp(eh->e_ident, ELFMAG, SELFMAG) == 0 && end <= (size_t)st.st_size) {
                const ElfW(Shdr) *sh = (const void *)(f + eh->e_shoff);
                for (int i = 0; i < eh->e_shnum && !found; i++) {
                    if (sh[i].sh_type != SHT_DYNSYM || sh[i].sh_link >= eh->e_shnum) continue;
                    const ElfW(Shdr) *strs = &sh[sh[i].sh_link];
                    if (sh[i].sh_offset + sh[i].sh_size > (size_t)st.st_size ||
                        strs->sh_offset + strs->sh_size > (size_t)st.st_size)
                        continue;
                    const ElfW(Sym) *syms = (const void *)(f + sh[i].sh_offset);
                    const char *names = (const char *)(f + strs->sh_offset);
                    for (size_t k = 0; k < sh[i].sh_size / sizeof(ElfW(Sym)); k++) {
                        if (syms[k].st_name >= strs->sh_size || syms[k].st_shndx == SHN_UNDEF ||
                            ELF64_ST_TYPE(syms[k].st_info) != STT_FUNC)
                            continue;
                        if (strcmp(names + syms[k].st_name, name) == 0) {
                            found = (void *)(base + syms[k].st_value);
                            break;
                        }
                    }
                }
            }
            munmap((void *)f, st.st_size);
        }
    }
    close(fd);
    return found;
}

static int find_symbol(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    struct lookup *l = data;
    if (info->dlpi_name && strstr(info->dlpi_name, l->object))
        l->found = symbol_in_file(info->dlpi_name, info->dlpi_addr, l->name);
    return l->found != NULL;
}

static void *driver_symbol(const char *name) {
    struct lookup l = {"libcuda.so", name, NULL};
    dl_iterate_phdr(find_symbol, &l);
    return l.found;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n) {
    qsort(v, n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

typedef CUresult (*launch_fn)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned,
                              unsigned, unsigned, CUstream, void **, void **);
typedef CUresult (*alloc_fn)(CUdeviceptr *, size_t);
typedef CUresult (*free_fn)(CUdeviceptr);

/* ns per launch of `n` launches through `launch`, or -1 on a failed call. */
static double time_launches(launch_fn launch, CUfunction f, long n) {
    double t0 = now();
    for (long i = 0; i < n; i++)
        if (launch(f, 1, 1, 1, 32, 1, 1, 0, 0, 0, 0)) return -1;
    double t = (now() - t0) / n;
    return cuCtxSynchronize() ? -1 : t;
}

static double time_allocs(alloc_fn alloc, free_fn release, long n) {
    double t0 = now();
    for (long i = 0; i < n; i++) {
        CUdeviceptr p;
        if (alloc(&p, 1 << 20) || release(p)) return -1;
    }
    return (now() - t0) / n;
}

/* Alternating batches, direct and through, for `rounds` rounds after one
 * discarded round; prints "<label> <added> <direct> <through>". */
#define PAIRED(label, rounds, timed_direct, timed_through)                          \
    do {                                                                           \
        double *d = malloc(sizeof(double) * 3 * (rounds)), *t = d + (rounds),      \
               *diff = t + (rounds);                                               \
        CHECK(!d);                                                                 \
        for (int r = -1; r < (rounds); r++) {                                      \
            double a, b;                                                           \
            if (r & 1) {                                                           \
                a = timed_direct;                                                  \
                b = timed_through;                                                 \
            } else {                                                               \
                b = timed_through;                                                 \
                a = timed_direct;                                                  \
            }                                                                      \
            CHECK(a < 0 || b < 0);                                                 \
            if (r < 0) continue;                                                   \
            d[r] = a;                                                              \
            t[r] = b;                                                              \
            diff[r] = b - a;                                                       \
        }                                                                          \
        double added = median(diff, rounds), direct = median(d, rounds);           \
        printf(label " %.2f %.2f %.2f\n", added, direct, median(t, rounds));       \
        free(d);                                                                   \
    } while (0)

static int paired(CUfunction f, int rounds, long batch) {
    launch_fn direct_launch = (launch_fn)driver_symbol("cuLaunchKernel");
    alloc_fn direct_alloc = (alloc_fn)driver_symbol("cuMemAlloc_v2");
    free_fn direct_free = (free_fn)driver_symbol("cuMemFree_v2");
    CHECK(!direct_launch || !direct_alloc || !direct_free);
    CHECK(rounds < 1 || batch < 1);
    /* Whether the linker's binding is the driver's own definition: it is
     * without an interposer, and must not be under one (else both sides
     * would time the same function). */
    printf("paired_bound_to_driver %d\n", (void *)cuLaunchKernel == (void *)direct_launch &&
                                                (void *)cuMemAlloc_v2 == (void *)direct_alloc &&
                                                (void *)cuMemFree_v2 == (void *)direct_free);
    PAIRED("paired_launch", rounds, time_launches(direct_launch, f, batch),
           time_launches(cuLaunchKernel, f, batch));
    long allocs = batch / 4 > 0 ? batch / 4 : 1;
    PAIRED("paired_allocfree", rounds, time_allocs(direct_alloc, direct_free, allocs),
           time_allocs(cuMemAlloc_v2, cuMemFree_v2, allocs));
    return 0;
}

int main(int argc, char **argv) {
    int is_paired = argc > 1 && strcmp(argv[1], "paired") == 0;
    long nl = argc > 1 ? atol(argv[1]) : 100000, na = argc > 2 ? atol(argv[2]) : 20000;
    int rounds = argc > 3 ? atoi(argv[3]) : 5;
    CUcontext c;
    CUmodule m;
    CUfunction f;
    CHECK(cuInit(0));
    CHECK(cuDevicePrimaryCtxRetain(&c, 0));
    CHECK(cuCtxSetCurrent(c));
    CHECK(cuModuleLoadData(&m, "bench"));
    CHECK(cuModuleGetFunction(&f, m, "empty"));
    if (is_paired) return paired(f, argc > 2 ? atoi(argv[2]) : 1000, argc > 3 ? atol(argv[3]) : 1000);
    double best_launch = 1e30, best_alloc = 1e30;
    for (int round = 0; round < rounds; round++) {
        double t0 = now();
        for (long i = 0; i < nl; i++) CHECK(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, 0, 0, 0));
        double t1 = now();
        CHECK(cuCtxSynchronize());
        if (nl && (t1 - t0) / nl < best_launch) best_launch = (t1 - t0) / nl;
        t0 = now();
        for (long i = 0; i < na; i++) {
            CUdeviceptr p;
            CHECK(cuMemAlloc_v2(&p, 1 << 20));
            CHECK(cuMemFree_v2(p));
        }
        t1 = now();
        if (na && (t1 - t0) / na < best_alloc) best_alloc = (t1 - t0) / na;
    }
    printf("launch %.1f\nallocfree %.1f\n", best_launch, best_alloc);
    return 0;
}
