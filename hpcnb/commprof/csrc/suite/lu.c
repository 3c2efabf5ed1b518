/* lu: rows dealt cyclically, one pivot row per phase (hpcnb C suite). */
#include "csuite.h"
static double *a;
static long n;
static void kernel(int tid, int nthreads, int phase) {
  long k = phase;
  long first = k + 1 + (((tid - (k + 1)) % nthreads) + nthreads) % nthreads;
  for (long i = first; i < n; i += nthreads) {
    double f = a[i * n + k] / a[k * n + k];
    a[i * n + k] = f;
    for (long j = k + 1; j < n; j++) a[i * n + j] -= f * a[k * n + j];
  }
}
int main(int argc, char **argv) {
  cs_init(argc, argv);
  n = cs_long(0);
  a = cs_load("a", n * n * 8);
  cs_run();
  cs_save("a", a, n * n * 8);
  return 0;
}
