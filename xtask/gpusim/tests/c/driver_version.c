/*
 * cuDriverGetVersion before and after cuInit: prints
 *   "before <version>" and "after <version>" (or "error <step> <rc>").
 */
#include <stdio.h>

typedef int CUresult;
CUresult cuDriverGetVersion(int *version);
CUresult cuInit(unsigned flags);

int main(void) {
    int v = 0;
    CUresult rc = cuDriverGetVersion(&v);
    if (rc) {
        printf("error before %d\n", rc);
        return 1;
    }
    printf("before %d\n", v);
    if ((rc = cuInit(0))) {
        printf("error init %d\n", rc);
        return 1;
    }
    if ((rc = cuDriverGetVersion(&v))) {
        printf("error after %d\n", rc);
        return 1;
    }
    printf("after %d\n", v);
    return 0;
}
