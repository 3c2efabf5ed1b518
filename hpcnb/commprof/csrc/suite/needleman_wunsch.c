/* needleman_wunsch: row blocks x column tiles, tile cb of thread t in phase t + cb (hpcnb C suite). */
#include "csuite.h"
static long *score, *s1, *s2, rows, cols, penalty, ncb;
static void kernel(int tid, int nthreads, int phase) {
  long n = rows - 1, m = cols - 1, cb = phase - tid;
  if (cb < 0 || cb >= ncb) return;
  long r0 = 1 + (n * tid) / nthreads, r1 = 1 + (n * (tid + 1)) / nthreads;
  long c0 = 1 + (m * cb) / ncb, c1 = 1 + (m * (cb + 1)) / ncb;
  for (long i = r0; i < r1; i++)
    for (long j = c0; j < c1; j++) {
      long sim = s1[i - 1] == s2[j - 1] ? 1 : -1;
      long best = score[(i - 1) * cols + j - 1] + sim;
      long up = score[(i - 1) * cols + j] - penalty;
      long left = score[i * cols + j - 1] - penalty;
      if (up > best) best = up;
      if (left > best) best = left;
      score[i * cols + j] = best;
    }
}
int main(int argc, char **argv) {
  cs_init(argc, argv);
  rows = cs_long(0), cols = cs_long(1), penalty = cs_long(4), ncb = cs_long(5);
  score = cs_load("score", rows * cols * 8);
  s1 = cs_load("s1", cs_long(2) * 8), s2 = cs_load("s2", cs_long(3) * 8);
  cs_run();
  cs_save("score", score, rows * cols * 8);
  return 0;
}
