/* pipeline: thread = stage, one item per phase (hpcnb C suite). */
#include "csuite.h"
static double *src, *buf;
static long nitems;
static void kernel(int tid, int nthreads, int phase) {
  (void)nthreads;
  long q = phase - tid;
  if (q < 0 || q >= nitems) return;
  double v = tid == 0 ? src[q] : buf[(tid - 1) * nitems + q];
  for (int r = 0; r < 8; r++) v = v * 0.5 + 1.0 + r;
  buf[tid * nitems + q] = v;
}
int main(int argc, char **argv) {
  cs_init(argc, argv);
  nitems = cs_long(0);
  src = cs_load("src", nitems * 8), buf = cs_load("buf", cs_long(1) * nitems * 8);
  cs_run();
  cs_save("buf", buf, cs_long(1) * nitems * 8);
  return 0;
}
