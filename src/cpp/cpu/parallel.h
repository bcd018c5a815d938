// parallel_for over [0, n) in chunks of `grain`, with dynamic scheduling:
// muser's own thread pool (cpu/thread_pool.h), Grand Central Dispatch on
// Apple. The pool replaced OpenMP, whose GCC runtime hangs a forked child.
#pragma once
#include <algorithm>
#include <cstdint>

#if defined(__APPLE__)
#include <dispatch/dispatch.h>
#else
#include "cpu/thread_pool.h"
#endif

namespace muser::cpu {

// The most threads any muser entry point accepts (threads=; also the cap on
// default_threads()). The head is memory-bound, one pass over the weight per
// step: a socket's memory channels are saturated by a few dozen cores, so
// more threads only add wake-ups and smaller chunks. 256 still covers every
// hardware thread of the largest single sockets (128 cores x 2 SMT) and of
// common two-socket servers, and bounds what a typo (threads=3000) can start:
// each worker reserves a stack (8 MiB of address space by default).
inline constexpr int kMaxThreads = 256;

// Throws ArgValueError unless 0 <= threads <= kMaxThreads (0: the default);
// the message names `arg` and the maximum.
void check_threads(int threads, const char* arg = "threads");

// Threads used when the caller does not say: the CPUs this process may run
// on (its affinity mask, as OpenMP counted them), at most kMaxThreads.
int default_threads();

template <class F>
void parallel_for(int64_t n, int64_t grain, int threads, const F& f) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  const int64_t chunks = (n + grain - 1) / grain;
  if (threads <= 1 || chunks == 1) {
    f(int64_t{0}, n);
    return;
  }
#if defined(__APPLE__)
  dispatch_apply((size_t)chunks, dispatch_get_global_queue(QOS_CLASS_USER_INITIATED, 0), ^(size_t c) {
    const int64_t i0 = (int64_t)c * grain;
    f(i0, std::min(n, i0 + grain));
  });
#else
  struct Ctx {
    const F* f;
    int64_t n, grain;
  } ctx{&f, n, grain};
  run_chunks(chunks, threads, [](void* p, int64_t c) {
    const Ctx& x = *static_cast<const Ctx*>(p);
    const int64_t i0 = c * x.grain;
    (*x.f)(i0, std::min(x.n, i0 + x.grain));
  }, &ctx);
#endif
}

}  // namespace muser::cpu
