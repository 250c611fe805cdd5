/*
 * A hostile process in a container: every 5 ms it inflates its usage
 * region's launch counters for GPU 0 (warps by 10^9, throttle time by
 * 100 ms), as a tenant would to make the agent believe its warps are
 * cheap and that it is held back. It uses no GPU.
 *   scribble USAGE_PATH BUCKETS_OFFSET SECONDS
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: scribble USAGE BUCKETS_OFFSET SECONDS\n");
        return 2;
    }
    int fd = open(argv[1], O_RDWR);
    if (fd < 0) {
        perror("open");
        return 1;
    }
    long off = atol(argv[2]);
    size_t len = (size_t)lseek(fd, 0, SEEK_END);
    unsigned char *m = mmap(0, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (m == MAP_FAILED) {
        perror("mmap");
        return 1;
    }
    volatile uint64_t *bucket = (volatile uint64_t *)(m + off);
    long rounds = atol(argv[3]) * 200;
    for (long i = 0; i < rounds; i++) {
        bucket[3] += 1000000000ull; /* warps */
        bucket[4] += 100000000ull;  /* throttled_ns */
        usleep(5000);
    }
    return 0;
}
