/* fft: radix-2 decimation in frequency on index blocks, ping-pong (hpcnb C suite). */
#include <complex.h>
#include "csuite.h"
static double complex *xin, *xa, *xb, *w;
static long n;
static void kernel(int tid, int nthreads, int phase) {
  long lo = cs_lo(0, n, tid, nthreads), hi = cs_hi(0, n, tid, nthreads);
  if (phase == 0) {
    for (long i = lo; i < hi; i++) xa[i] = xin[i];
    return;
  }
  long h = n >> phase, stride = n / (2 * h);
  double complex *s = phase % 2 == 1 ? xa : xb, *d = phase % 2 == 1 ? xb : xa;
  for (long i = lo; i < hi; i++) {
    if ((i & h) == 0)
      d[i] = s[i] + s[i + h];
    else
      d[i] = (s[i - h] - s[i]) * w[(i & (h - 1)) * stride];
  }
}
int main(int argc, char **argv) {
  cs_init(argc, argv);
  n = cs_long(0);
  xin = cs_load("xin", n * 16), xa = cs_load("xa", n * 16), xb = cs_load("xb", n * 16);
  w = cs_load("w", cs_long(3) * 16);
  cs_run();
  cs_save("xa", xa, n * 16), cs_save("xb", xb, n * 16);
  return 0;
}
