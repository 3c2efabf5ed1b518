/* Heap allocation logger for hpcnb.commprof, preloaded into a profiled program.
 *
 * Interposes malloc, calloc, realloc, free, posix_memalign, aligned_alloc and memalign,
 * calls glibc's own implementations (__libc_*), and appends one line per event to the
 * file named by HPCNB_COMMPROF_ALLOC_LOG:
 *
 *   BASE <load bias of the main executable, hex>      (once, at load time)
 *   MAILBOX <address of the event mailbox, hex>        (once, at load time)
 *   STACK <an address near the top of the main thread's stack, hex>   (once)
 *   A <seq> <pointer hex> <bytes> <caller hex>         (an allocation)
 *   F <seq> <pointer hex>                              (a release)
 *
 * The caller is the return address of the allocation call. Every event also stores its
 * sequence number to the mailbox, under the same lock as the line, so a memory trace of
 * the program (valgrind lackey) shows when, and in which thread, event <seq> happened.
 * Written for hpcnb (our own code); no formatted I/O, so nothing here allocates.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <link.h>
#include <stddef.h>
#include <stdlib.h>
#include <unistd.h>

extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void __libc_free(void *);
extern void *__libc_memalign(size_t, size_t);

static int log_fd = -1;
static volatile int lock_word;
static unsigned long seq;
volatile unsigned long hpcnb_commprof_mailbox;

static void lock(void) {
  while (__atomic_exchange_n(&lock_word, 1, __ATOMIC_ACQUIRE)) {
  }
}
static void unlock(void) { __atomic_store_n(&lock_word, 0, __ATOMIC_RELEASE); }

static char *put_hex(char *p, unsigned long v) {
  char tmp[17];
  int n = 0;
  do {
    tmp[n++] = "0123456789abcdef"[v & 15];
    v >>= 4;
  } while (v);
  *p++ = '0';
  *p++ = 'x';
  while (n) *p++ = tmp[--n];
  return p;
}

static char *put_dec(char *p, unsigned long v) {
  char tmp[21];
  int n = 0;
  do {
    tmp[n++] = (char)('0' + v % 10);
    v /= 10;
  } while (v);
  while (n) *p++ = tmp[--n];
  return p;
}

static char *put_text(char *p, const char *s) {
  while (*s) *p++ = *s++;
  return p;
}

static void emit(char kind, void *ptr, size_t bytes, void *caller) {
  char line[96];
  char *p = line;
  if (log_fd < 0 || ptr == NULL) return;
  lock();
  seq++;
  *p++ = kind;
  *p++ = ' ';
  p = put_dec(p, seq);
  *p++ = ' ';
  p = put_hex(p, (unsigned long)ptr);
  if (kind == 'A') {
    *p++ = ' ';
    p = put_dec(p, bytes);
    *p++ = ' ';
    p = put_hex(p, (unsigned long)caller);
  }
  *p++ = '\n';
  if (write(log_fd, line, (size_t)(p - line)) < 0) log_fd = -1;
  hpcnb_commprof_mailbox = seq;
  unlock();
}

static int first_object(struct dl_phdr_info *info, size_t size, void *out) {
  (void)size;
  *(unsigned long *)out = (unsigned long)info->dlpi_addr;
  return 1; /* the first object is the main executable */
}

__attribute__((constructor)) static void open_log(void) {
  const char *path = getenv("HPCNB_COMMPROF_ALLOC_LOG");
  char line[64];
  char *p;
  unsigned long base = 0;
  if (path == NULL) return;
  log_fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
  if (log_fd < 0) return;
  dl_iterate_phdr(first_object, &base);
  p = put_text(line, "BASE ");
  p = put_hex(p, base);
  *p++ = '\n';
  if (write(log_fd, line, (size_t)(p - line)) < 0) log_fd = -1;
  p = put_text(line, "MAILBOX ");
  p = put_hex(p, (unsigned long)&hpcnb_commprof_mailbox);
  *p++ = '\n';
  if (log_fd >= 0 && write(log_fd, line, (size_t)(p - line)) < 0) log_fd = -1;
  p = put_text(line, "STACK ");
  p = put_hex(p, (unsigned long)__builtin_frame_address(0));
  *p++ = '\n';
  if (log_fd >= 0 && write(log_fd, line, (size_t)(p - line)) < 0) log_fd = -1;
}

void *malloc(size_t n) {
  void *r = __libc_malloc(n);
  emit('A', r, n, __builtin_return_address(0));
  return r;
}

void *calloc(size_t k, size_t n) {
  void *r = __libc_calloc(k, n);
  emit('A', r, k * n, __builtin_return_address(0));
  return r;
}

void *realloc(void *old, size_t n) {
  void *r = __libc_realloc(old, n);
  if (r != NULL || n == 0) emit('F', old, 0, NULL);
  emit('A', r, n, __builtin_return_address(0));
  return r;
}

void free(void *ptr) {
  emit('F', ptr, 0, NULL);
  __libc_free(ptr);
}

int posix_memalign(void **out, size_t align, size_t n) {
  void *r = __libc_memalign(align, n);
  if (r == NULL) return 12; /* ENOMEM */
  *out = r;
  emit('A', r, n, __builtin_return_address(0));
  return 0;
}

void *aligned_alloc(size_t align, size_t n) {
  void *r = __libc_memalign(align, n);
  emit('A', r, n, __builtin_return_address(0));
  return r;
}

void *memalign(size_t align, size_t n) {
  void *r = __libc_memalign(align, n);
  emit('A', r, n, __builtin_return_address(0));
  return r;
}
