/* bfs: vertex blocks, pull-based level-synchronous search (hpcnb C suite). */
#include "csuite.h"
static long *indptr, *indices, *level, *nxt, nv;
static void kernel(int tid, int nthreads, int phase) {
  long depth = phase / 2;
  long lo = cs_lo(0, nv, tid, nthreads), hi = cs_hi(0, nv, tid, nthreads);
  if (phase % 2 == 0) {
    for (long v = lo; v < hi; v++)
      if (level[v] < 0)
        for (long e = indptr[v], end = indptr[v + 1]; e < end; e++)
          if (level[indices[e]] == depth) {
            nxt[v] = 1;
            break;
          }
  } else {
    for (long v = lo; v < hi; v++)
      if (nxt[v] == 1) {
        level[v] = depth + 1;
        nxt[v] = 0;
      }
  }
}
int main(int argc, char **argv) {
  cs_init(argc, argv);
  long ne = cs_long(1);
  nv = cs_long(2);
  indptr = cs_load("indptr", cs_long(0) * 8), indices = cs_load("indices", ne * 8);
  level = cs_load("level", nv * 8), nxt = cs_load("nxt", cs_long(3) * 8);
  cs_run();
  cs_save("level", level, nv * 8);
  return 0;
}
