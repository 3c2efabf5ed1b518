/* radix_sort: LSD 4-bit digits, per-thread histograms, thread 0 scans (hpcnb C suite). */
#include "csuite.h"
static long *keys, *tmp, *hist, *offs, n, nb;
static void kernel(int tid, int nthreads, int phase) {
  long shift = (phase / 3) * 4, step = phase % 3;
  int src_is_keys = (phase / 3) % 2 == 0;
  long lo = cs_lo(0, n, tid, nthreads), hi = cs_hi(0, n, tid, nthreads);
  if (step == 0) {
    for (long d = 0; d < nb; d++) hist[tid * nb + d] = 0;
    for (long i = lo; i < hi; i++) {
      long v = src_is_keys ? keys[i] : tmp[i];
      hist[tid * nb + ((v >> shift) & (nb - 1))] += 1;
    }
  } else if (step == 1) {
    if (tid == 0) {
      long run = 0;
      for (long d = 0; d < nb; d++)
        for (int t = 0; t < nthreads; t++) {
          offs[t * nb + d] = run;
          run += hist[t * nb + d];
        }
    }
  } else {
    for (long i = lo; i < hi; i++) {
      long v = src_is_keys ? keys[i] : tmp[i];
      long d = (v >> shift) & (nb - 1);
      long pos = offs[tid * nb + d];
      offs[tid * nb + d] = pos + 1;
      if (src_is_keys)
        tmp[pos] = v;
      else
        keys[pos] = v;
    }
  }
}
int main(int argc, char **argv) {
  cs_init(argc, argv);
  n = cs_long(0), nb = cs_long(3);
  long T = cs_long(2);
  keys = cs_load("keys", n * 8), tmp = cs_load("tmp", n * 8);
  hist = cs_load("hist", T * nb * 8), offs = cs_load("offs", T * nb * 8);
  cs_run();
  cs_save("keys", keys, n * 8);
  return 0;
}
