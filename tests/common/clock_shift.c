/* A Redis whose wall clock runs CLOCK_SHIFT_US microseconds off the host's, for tests of nodes
 * whose clocks differ (libfaketime cannot start redis-server: its allocator reads the clock while
 * libfaketime initializes). Loaded with LD_PRELOAD; reads the real clock by the raw system call,
 * so it never recurses into itself. Only the wall clock moves; monotonic clocks are untouched. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>
static long long offset_us(void) {
  const char *s = getenv("CLOCK_SHIFT_US");
  return s ? atoll(s) : 0;
}
int clock_gettime(clockid_t id, struct timespec *ts) {
  int r = (int)syscall(SYS_clock_gettime, id, ts);
  if (r == 0 && (id == CLOCK_REALTIME || id == CLOCK_REALTIME_COARSE)) {
    long long ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec + offset_us() * 1000LL;
    ts->tv_sec = ns / 1000000000LL;
    ts->tv_nsec = ns % 1000000000LL;
  }
  return r;
}
int gettimeofday(struct timeval *tv, void *tz) {
  struct timespec ts;
  (void)tz;
  if (clock_gettime(CLOCK_REALTIME, &ts) != 0) return -1;
  tv->tv_sec = ts.tv_sec;
  tv->tv_usec = ts.tv_nsec / 1000;
  return 0;
}
