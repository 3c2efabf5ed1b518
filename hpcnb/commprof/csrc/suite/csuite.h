/* Harness of hpcnb.commprof's C kernel suite: phases of a kernel on T threads.
 *
 * Command line of every suite program: PROG T NPHASES DIR [ARGS...]. The program reads its
 * arrays from DIR/<name>.bin (raw, native byte order), runs kernel(tid, T, phase) for every
 * phase on T threads with a barrier after each phase (the execution model of the Numba
 * suite), and writes the arrays back to DIR/<name>.out. Built with -pthread, the main
 * thread creates T workers; built with -fopenmp, one parallel region with T threads (the
 * master is worker 0). Loops that the Numba kernels write as prange use cs_lo/cs_hi, the
 * same static blocks as hpcnb.commprof.hooks.sched_iters. Built with -DCS_ALIGN, every array
 * starts on a 64-byte cache line. Written for hpcnb.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int NT, NPHASES;
static const char *DIR;
static char **ARGS;
static int NARGS;

static void kernel(int tid, int nthreads, int phase);

__attribute__((unused)) static long cs_lo(long lo, long hi, int tid, int T) { return lo + ((hi - lo) * tid) / T; }
__attribute__((unused)) static long cs_hi(long lo, long hi, int tid, int T) { return lo + ((hi - lo) * (tid + 1)) / T; }
static long cs_long(int k) { return k < NARGS ? atol(ARGS[k]) : 0; }
__attribute__((unused)) static double cs_double(int k) { return k < NARGS ? atof(ARGS[k]) : 0.0; }

static void cs_init(int argc, char **argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: %s T NPHASES DIR [ARGS...]\n", argv[0]);
    exit(2);
  }
  NT = atoi(argv[1]);
  NPHASES = atoi(argv[2]);
  DIR = argv[3];
  ARGS = argv + 4;
  NARGS = argc - 4;
  if (NT < 1 || NT > 63 || NPHASES < 1) {
    fprintf(stderr, "T must be 1..63 and NPHASES >= 1\n");
    exit(2);
  }
}

static void *cs_load(const char *name, size_t bytes) {
  char path[4096];
#ifdef CS_ALIGN /* each array on whole cache lines of its own (-DCS_ALIGN) */
  void *p = aligned_alloc(64, (bytes + 63) / 64 * 64 + 64);
#else
  void *p = malloc(bytes ? bytes : 1);
#endif
  snprintf(path, sizeof path, "%s/%s.bin", DIR, name);
  FILE *f = fopen(path, "rb");
  if (!f || !p || fread(p, 1, bytes, f) != bytes) {
    fprintf(stderr, "cannot read %zu bytes from %s\n", bytes, path);
    exit(2);
  }
  fclose(f);
  return p;
}

static void cs_save(const char *name, const void *p, size_t bytes) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s.out", DIR, name);
  FILE *f = fopen(path, "wb");
  if (!f || fwrite(p, 1, bytes, f) != bytes) {
    fprintf(stderr, "cannot write %s\n", path);
    exit(2);
  }
  fclose(f);
}

#ifdef _OPENMP
#include <omp.h>
static void cs_run(void) {
#pragma omp parallel num_threads(NT)
  {
    int tid = omp_get_thread_num();
    for (int ph = 0; ph < NPHASES; ph++) {
      kernel(tid, NT, ph);
#pragma omp barrier
    }
  }
}
#else
#include <pthread.h>
static pthread_barrier_t cs_bar;
static void *cs_worker(void *arg) {
  int tid = (int)(long)arg;
  for (int ph = 0; ph < NPHASES; ph++) {
    kernel(tid, NT, ph);
    pthread_barrier_wait(&cs_bar);
  }
  return NULL;
}
static void cs_run(void) {
  pthread_t th[64];
  pthread_barrier_init(&cs_bar, NULL, (unsigned)NT);
  for (long t = 0; t < NT; t++) pthread_create(&th[t], NULL, cs_worker, (void *)t);
  for (long t = 0; t < NT; t++) pthread_join(th[t], NULL);
  pthread_barrier_destroy(&cs_bar);
}
#endif
