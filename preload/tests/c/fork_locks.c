/*
 * fork_locks cuda|nvml N: forks while another thread is inside the
 * interposer's locked sections.
 *
 * cuda: the parent initialises CUDA and three more threads allocate and
 *   free 2 MiB in a loop; each child asks NVML for device 0's memory
 *   information (CUDA is refused in such a child, NVML is not).
 * nvml: the parent asks NVML only and a second thread reads device 0's
 *   memory information in a loop; each child initialises CUDA and
 *   allocates and frees 16 MiB.
 *
 * The main thread forks N children one after the other, each under a 5 s
 * alarm, and stops at the first that does not finish. Prints
 * "forks <children> <hung> <failed>" (failed: children whose calls
 * returned an error).
 */
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

typedef int CUresult;
typedef unsigned long long CUdeviceptr;
CUresult cuInit(unsigned);
CUresult cuDeviceGet(int *, int);
CUresult cuDevicePrimaryCtxRetain(void **, int);
CUresult cuCtxSetCurrent(void *);
CUresult cuMemAlloc_v2(CUdeviceptr *, size_t);
CUresult cuMemFree_v2(CUdeviceptr);

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
int nvmlInit_v2(void);
int nvmlDeviceGetHandleByIndex_v2(unsigned, void **);
int nvmlDeviceGetMemoryInfo(void *, nvmlMemory_t *);

static volatile int stop;

static void *ctx;

static CUresult cuda_context(void) {
    int dev;
    CUresult rc;
    if ((rc = cuInit(0)) || (rc = cuDeviceGet(&dev, 0)) ||
        (rc = cuDevicePrimaryCtxRetain(&ctx, dev)) || (rc = cuCtxSetCurrent(ctx)))
        return rc;
    return 0;
}

static int nvml_meminfo(void) {
    void *dev;
    nvmlMemory_t m;
    int rc;
    if ((rc = nvmlInit_v2()) || (rc = nvmlDeviceGetHandleByIndex_v2(0, &dev)))
        return rc;
    return nvmlDeviceGetMemoryInfo(dev, &m);
}

static void *churn(void *arg) {
    (void)arg;
    if (cuCtxSetCurrent(ctx)) return NULL;
    while (!stop) {
        CUdeviceptr p;
        if (cuMemAlloc_v2(&p, 2 << 20) == 0) cuMemFree_v2(p);
    }
    return NULL;
}

static void *poll_nvml(void *arg) {
    void *dev = arg;
    while (!stop) {
        nvmlMemory_t m;
        nvmlDeviceGetMemoryInfo(dev, &m);
    }
    return NULL;
}

static int child_cuda(void) {
    CUdeviceptr p;
    CUresult rc;
    if ((rc = cuda_context()) || (rc = cuMemAlloc_v2(&p, 16 << 20))) return rc;
    return cuMemFree_v2(p);
}

int main(int argc, char **argv) {
    if (argc != 3) return 2;
    int cuda = !strcmp(argv[1], "cuda");
    int n = atoi(argv[2]);
    pthread_t t[3];
    int threads = 1;
    if (cuda) {
        if (cuda_context()) return 3;
        threads = 3;
        for (int i = 0; i < threads; i++)
            if (pthread_create(&t[i], NULL, churn, NULL)) return 4;
    } else {
        void *dev;
        if (nvmlInit_v2() || nvmlDeviceGetHandleByIndex_v2(0, &dev)) return 3;
        if (pthread_create(&t[0], NULL, poll_nvml, dev)) return 4;
    }
    int forks = 0, hung = 0, failed = 0;
    for (int i = 0; i < n && !hung; i++) {
        fflush(stdout);
        pid_t child = fork();
        if (child < 0) return 5;
        if (child == 0) {
            alarm(5);
            _exit((cuda ? nvml_meminfo() : child_cuda()) ? 1 : 0);
        }
        int status;
        if (waitpid(child, &status, 0) != child) return 6;
        forks++;
        if (WIFSIGNALED(status) && WTERMSIG(status) == SIGALRM)
            hung++;
        else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
            failed++;
    }
    stop = 1;
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    printf("forks %d %d %d\n", forks, hung, failed);
    return 0;
}
