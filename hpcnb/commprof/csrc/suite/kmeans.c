/* kmeans: point blocks; per-thread partial sums; thread 0 updates the centres (hpcnb C suite). */
#include "csuite.h"
static double *x, *cent, *psum;
static long *pcnt, *label, npts, dim, k, ks, kc; /* ks, kc: per-thread rows of psum, pcnt */
static void kernel(int tid, int nthreads, int phase) {
  if (phase % 2 == 0) {
    for (long c = 0; c < k; c++) {
      pcnt[tid * kc + c] = 0;
      for (long d = 0; d < dim; d++) psum[(tid * ks + c) * dim + d] = 0.0;
    }
    for (long i = cs_lo(0, npts, tid, nthreads); i < cs_hi(0, npts, tid, nthreads); i++) {
      long best = 0;
      double bestd = 1e300;
      for (long c = 0; c < k; c++) {
        double dist = 0.0;
        for (long d = 0; d < dim; d++) {
          double diff = x[i * dim + d] - cent[c * dim + d];
          dist += diff * diff;
        }
        if (dist < bestd) bestd = dist, best = c;
      }
      label[i] = best;
      pcnt[tid * kc + best] += 1;
      for (long d = 0; d < dim; d++) psum[(tid * ks + best) * dim + d] += x[i * dim + d];
    }
  } else if (tid == 0) {
    for (long c = 0; c < k; c++) {
      long cnt = 0;
      for (int t = 0; t < nthreads; t++) cnt += pcnt[t * kc + c];
      if (cnt > 0)
        for (long d = 0; d < dim; d++) {
          double s = 0.0;
          for (int t = 0; t < nthreads; t++) s += psum[(t * ks + c) * dim + d];
          cent[c * dim + d] = s / cnt;
        }
    }
  }
}
int main(int argc, char **argv) {
  cs_init(argc, argv);
  npts = cs_long(0), dim = cs_long(1), k = cs_long(2);
  long T = cs_long(4);
  ks = cs_long(5), kc = cs_long(8); /* k unless the inputs pad each thread's rows */
  x = cs_load("x", npts * dim * 8), cent = cs_load("cent", k * dim * 8);
  psum = cs_load("psum", T * ks * dim * 8), pcnt = cs_load("pcnt", T * kc * 8);
  label = cs_load("label", npts * 8);
  cs_run();
  cs_save("cent", cent, k * dim * 8), cs_save("label", label, npts * 8);
  return 0;
}
