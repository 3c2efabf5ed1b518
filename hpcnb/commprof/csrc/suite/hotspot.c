/* hotspot: 2-D thread tiles (px x T/px), 5-point stencil with clamped edges (hpcnb C suite). */
#include "csuite.h"
static double *t0, *t1, *power, cap, rx, ry, rz, amb;
static long n, m, px;
static void kernel(int tid, int nthreads, int phase) {
  long py = nthreads / px, ti = tid / px, tj = tid % px;
  long r0 = (n * ti) / py, r1 = (n * (ti + 1)) / py, c0 = (m * tj) / px, c1 = (m * (tj + 1)) / px;
  for (long i = r0; i < r1; i++) {
    long up = i - 1 > 0 ? i - 1 : 0, dn = i + 1 < n - 1 ? i + 1 : n - 1;
    for (long j = c0; j < c1; j++) {
      long lf = j - 1 > 0 ? j - 1 : 0, rt = j + 1 < m - 1 ? j + 1 : m - 1;
      double *s = phase % 2 == 0 ? t0 : t1, *d = phase % 2 == 0 ? t1 : t0;
      double c = s[i * m + j];
      double e = (s[up * m + j] + s[dn * m + j] - 2.0 * c) * ry +
                 (s[i * m + lf] + s[i * m + rt] - 2.0 * c) * rx;
      d[i * m + j] = c + cap * (power[i * m + j] + e + (amb - c) * rz);
    }
  }
}
int main(int argc, char **argv) {
  cs_init(argc, argv);
  n = cs_long(0), m = cs_long(1), px = cs_long(6);
  cap = cs_double(7), rx = cs_double(8), ry = cs_double(9), rz = cs_double(10);
  amb = cs_double(11);
  t0 = cs_load("t0", n * m * 8), t1 = cs_load("t1", n * m * 8);
  power = cs_load("power", n * m * 8);
  cs_run();
  cs_save("t0", t0, n * m * 8), cs_save("t1", t1, n * m * 8);
  return 0;
}
