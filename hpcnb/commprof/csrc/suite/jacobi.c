/* jacobi: row blocks, 5-point stencil, ping-pong between a and b (hpcnb C suite). */
#include "csuite.h"
static double *a, *b;
static long n, m;
static void kernel(int tid, int nthreads, int phase) {
  for (long i = cs_lo(1, n - 1, tid, nthreads); i < cs_hi(1, n - 1, tid, nthreads); i++)
    for (long j = 1; j < m - 1; j++) {
      if (phase % 2 == 0)
        b[i * m + j] = 0.25 * (a[(i - 1) * m + j] + a[(i + 1) * m + j] + a[i * m + j - 1] +
                               a[i * m + j + 1]);
      else
        a[i * m + j] = 0.25 * (b[(i - 1) * m + j] + b[(i + 1) * m + j] + b[i * m + j - 1] +
                               b[i * m + j + 1]);
    }
}
int main(int argc, char **argv) {
  cs_init(argc, argv);
  n = cs_long(0), m = cs_long(1);
  a = cs_load("a", n * m * 8), b = cs_load("b", n * m * 8);
  cs_run();
  cs_save("a", a, n * m * 8), cs_save("b", b, n * m * 8);
  return 0;
}
