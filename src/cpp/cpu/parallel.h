// parallel_for over [0, n) in chunks of `grain`: OpenMP on Linux and Windows,
// Grand Central Dispatch on Apple, serial when neither is available. No
// thread pool of our own.
#pragma once
#include <algorithm>
#include <cstdint>

#if defined(__APPLE__)
#include <dispatch/dispatch.h>
#elif defined(_OPENMP)
#include <omp.h>
#endif

namespace muser::cpu {

// Threads used when the caller does not say: OpenMP's default, or the core count.
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
#elif defined(_OPENMP)
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t i0 = c * grain;
    f(i0, std::min(n, i0 + grain));
  }
#else
  f(int64_t{0}, n);
#endif
}

}  // namespace muser::cpu
