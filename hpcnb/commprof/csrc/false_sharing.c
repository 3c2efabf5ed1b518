/* Per-thread histograms side by side: a false-sharing bug (hpcnb.commprof, notebook 07).
 *
 * Usage: false_sharing T N REPS. T threads each build a 4-bucket histogram of their block of
 * an array of N longs, REPS times, in their own slot of a shared array of histograms. A
 * slot is 32 bytes, so two threads' histograms share each 64-byte cache line and every
 * increment takes the line away from the other core (false sharing: no data flows between
 * the threads). Compiled with -DPAD each slot fills a whole line: the fix.
 * Written for hpcnb; an ordinary pthreads program.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

struct slot {
  long v[4];
#ifdef PAD
  char pad[64 - 4 * sizeof(long)];
#endif
};

static struct slot counts[64] __attribute__((aligned(64)));
static long *data, n;
static int T, reps;

static void *work(void *arg) {
  long t = (long)arg, lo = n * t / T, hi = n * (t + 1) / T;
  for (int r = 0; r < reps; r++)
    for (long i = lo; i < hi; i++) counts[t].v[data[i] & 3]++;
  return NULL;
}

int main(int argc, char **argv) {
  pthread_t th[64];
  if (argc < 4) {
    fprintf(stderr, "usage: %s T N REPS\n", argv[0]);
    return 2;
  }
  T = atoi(argv[1]), n = atol(argv[2]), reps = atoi(argv[3]);
  if (T < 1 || T > 64 || n < T || reps < 1) return 2;
  data = malloc(n * sizeof(long));
  for (long i = 0; i < n; i++) data[i] = (i * 2654435761L) % 1000;
  for (long t = 0; t < T; t++) pthread_create(&th[t], NULL, work, (void *)t);
  long total = 0;
  for (long t = 0; t < T; t++) {
    pthread_join(th[t], NULL);
    total += counts[t].v[1];
  }
  printf("%ld\n", total);
  free(data);
  return 0;
}
