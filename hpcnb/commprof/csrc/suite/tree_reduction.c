/* tree_reduction: block sums, then a binary combining tree (hpcnb C suite). */
#include "csuite.h"
static double *x, *part;
static long n;
static void kernel(int tid, int nthreads, int phase) {
  if (phase == 0) {
    double s = 0.0;
    for (long i = cs_lo(0, n, tid, nthreads); i < cs_hi(0, n, tid, nthreads); i++) s += x[i];
    part[tid] = s;
  } else {
    int step = 1 << (phase - 1);
    if (tid % (2 * step) == 0 && tid + step < nthreads) part[tid] += part[tid + step];
  }
}
int main(int argc, char **argv) {
  cs_init(argc, argv);
  n = cs_long(0);
  x = cs_load("x", n * 8), part = cs_load("part", cs_long(1) * 8);
  cs_run();
  cs_save("part", part, cs_long(1) * 8);
  return 0;
}
