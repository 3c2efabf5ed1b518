/* Ring exchange among T worker threads (hpcnb.commprof's recorded valgrind run).
 *
 * Usage: ring [T [N]]. Each worker fills its block of N doubles of a heap buffer, waits
 * at a barrier, then sums the block of its right neighbour (t + 1 mod T): worker t reads
 * what worker t + 1 wrote, a ring. Written for hpcnb; an ordinary pthreads program.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static int T = 4, N = 16;
static double *buf;
static double sums[64];
static pthread_barrier_t bar;

static void *work(void *arg) {
  long t = (long)arg;
  for (int i = 0; i < N; i++) buf[t * N + i] = t + i;
  pthread_barrier_wait(&bar);
  long r = (t + 1) % T;
  double s = 0;
  for (int i = 0; i < N; i++) s += buf[r * N + i];
  sums[t] = s;
  return 0;
}

int main(int argc, char **argv) {
  pthread_t th[64];
  if (argc > 1) T = atoi(argv[1]);
  if (argc > 2) N = atoi(argv[2]);
  if (T < 1 || T > 64 || N < 1) return 1;
  buf = malloc(sizeof(double) * T * N);
  pthread_barrier_init(&bar, 0, T);
  for (long t = 0; t < T; t++) pthread_create(&th[t], 0, work, (void *)t);
  for (long t = 0; t < T; t++) pthread_join(th[t], 0);
  double total = 0;
  for (int t = 0; t < T; t++) total += sums[t];
  printf("%g\n", total);
  free(buf);
  return 0;
}
