/* transpose: row blocks of the output (hpcnb C suite). */
#include "csuite.h"
static double *a, *b;
static long n;
static void kernel(int tid, int nthreads, int phase) {
  long lo = cs_lo(0, n, tid, nthreads), hi = cs_hi(0, n, tid, nthreads);
  for (long i = lo; i < hi; i++)
    for (long j = 0; j < n; j++) {
      if (phase == 0)
        a[i * n + j] = (double)(i * n + j);
      else
        b[i * n + j] = a[j * n + i];
    }
}
int main(int argc, char **argv) {
  cs_init(argc, argv);
  n = cs_long(0);
  a = cs_load("a", n * n * 8), b = cs_load("b", n * n * 8);
  cs_run();
  cs_save("b", b, n * n * 8);
  return 0;
}
