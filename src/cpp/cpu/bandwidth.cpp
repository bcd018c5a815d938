// The machine's read bandwidth, measured the way the LM head reads its
// weight: every thread streams through its own contiguous share of a large
// buffer once and folds it into a sum (so nothing can be skipped). The bench
// (bench/cpu_head.py) measures it in the same run as the kernels it rates,
// because on shared machines it moves by tens of percent from run to run.
#include "cpu/bandwidth.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "cpu/parallel.h"
#include "errors.h"

namespace muser::cpu {

namespace {

// Sum of the 64-bit words of [p, p + n): eight independent accumulators so
// the compiler vectorizes it and the loop is bound by the loads alone.
uint64_t sum_words(const uint64_t* p, size_t n) {
  uint64_t acc[8] = {};
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int k = 0; k < 8; ++k) acc[k] += p[i + k];
  for (; i < n; ++i) acc[0] += p[i];
  uint64_t s = 0;
  for (uint64_t a : acc) s += a;
  return s;
}

}  // namespace

ReadBandwidth read_bandwidth(size_t nbytes, int threads, int repeats) {
  if (nbytes < (1u << 20)) throw ArgValueError("read_bandwidth: nbytes must be at least 1 MiB");
  check_threads(threads);
  if (threads == 0) threads = default_threads();
  if (repeats <= 0) repeats = 1;
  const size_t words = nbytes / 8;
  std::unique_ptr<uint64_t, void (*)(void*)> buf(static_cast<uint64_t*>(std::aligned_alloc(4096, words * 8)), std::free);
  if (!buf) throw Error("read_bandwidth: cannot allocate " + std::to_string(nbytes) + " bytes");
  uint64_t* p = buf.get();
  // first touch by the threads that will read it (pages land near them)
  const int64_t share = (int64_t)((words + threads - 1) / threads);
  parallel_for(threads, 1, threads, [&](int64_t a, int64_t b) {
    for (int64_t t = a; t < b; ++t) {
      const size_t lo = (size_t)t * share, hi = std::min(words, lo + (size_t)share);
      for (size_t i = lo; i < hi; ++i) p[i] = i;
    }
  });
  ReadBandwidth out;
  out.bytes = words * 8;
  out.threads = threads;
  std::vector<uint64_t> sums((size_t)threads);
  for (int rep = 0; rep < repeats; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    parallel_for(threads, 1, threads, [&](int64_t a, int64_t b) {
      for (int64_t t = a; t < b; ++t) {
        const size_t lo = (size_t)t * share, hi = std::min(words, lo + (size_t)share);
        sums[(size_t)t] = lo < hi ? sum_words(p + lo, hi - lo) : 0;
      }
    });
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    out.seconds.push_back(s);
  }
  uint64_t total = 0;
  for (uint64_t v : sums) total += v;
  out.checksum = total;
  return out;
}

}  // namespace muser::cpu
