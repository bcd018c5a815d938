// Logits ranked as 64-bit keys, the maxima of keys across a warp and a CTA,
// and top-k's threshold from chunk bests: the one order every device ranking
// uses (topk.cu's argmax and top-k, sample.cu's kept-set order, race and
// top_k). A key holds the logit's bits made monotonic in the high word (NaN
// lowest, -0 folded onto +0) and 0xFFFFFFFF - id in the low word: a larger key
// is a better token, ties go to the lowest id, NaN never beats a number -- the
// CPU's rule (sample_before, argmax_rows, topk_rows).
#pragma once
#include <cstdint>

#include "muser/topk_key.h"

namespace muser::cuda {

// topk_key (muser/topk_key.h) is the one definition; these name it as the
// device code's 64-bit words.
__device__ __forceinline__ unsigned long long logit_key(float v, int64_t id) {
  return (unsigned long long)topk_key(v, id);
}

// The token id of a key.
__device__ __forceinline__ unsigned logit_key_id(unsigned long long key) { return (unsigned)topk_key_id(key); }

// True in every thread of the launch's last CTA to call it: a ticket taken
// after a fence, so every other CTA's writes before its call are visible to
// the last one. Every thread of every CTA calls it; *done counts the CTAs and
// the caller zeroes it for the next launch.
__device__ __forceinline__ bool last_cta_of_launch(unsigned* done) {
  __threadfence();
  // (no shared flag: the kernels' dynamic shared memory may take all a CTA has)
  const bool last = __syncthreads_or(threadIdx.x == 0 && atomicAdd(done, 1u) == gridDim.x - 1);
  if (last) __threadfence();
  return last;
}

// The largest v over the warp (every lane gets it).
__device__ __forceinline__ unsigned long long warp_max(unsigned long long v) {
  for (int off = 16; off >= 1; off >>= 1) {
    const unsigned long long o = __shfl_xor_sync(0xffffffffu, v, off);
    v = o > v ? o : v;
  }
  return v;
}

// The largest of each thread's `best` over a CTA of kThreads (every thread
// gets it; every thread must call it).
template <int kThreads>
__device__ __forceinline__ unsigned long long cta_max(unsigned long long best) {
  __shared__ unsigned long long warp_best[kThreads / 32];
  best = warp_max(best);
  if ((threadIdx.x & 31) == 0) warp_best[threadIdx.x >> 5] = best;
  __syncthreads();
  best = 0;
#pragma unroll
  for (int w = 0; w < kThreads / 32; ++w) best = warp_best[w] > best ? warp_best[w] : best;
  __syncthreads();
  return best;
}

// A top-k threshold: among a row's chunk bests (global, [chunks]; each chunk's best
// key, so they are distinct) the one with exactly k - 1 above it, into *out: the
// row's k best keys are all >= it (topk.cu's topk_threshold). With `ranked`, every
// best also goes to ranked[its rank] (the bests best first), so any k's threshold
// is one read later (out may then be null). They are compared from shared memory
// (staged: room for kStaged, or staged_cap < kStaged, an even count, 16-byte
// aligned; a loop of dependent L2 loads costs microseconds), two a load and
// without a branch where they all fit (the loop with the branch for an unstaged
// tail was ~9 us at 198 chunks). Every thread of the CTA (kThreads) calls it.
template <int kThreads, int kStaged>
__device__ __forceinline__ void threshold_of_bests(const unsigned long long* row_best, unsigned chunks, int k,
                                                   unsigned long long* staged, unsigned long long* out,
                                                   unsigned long long* ranked = nullptr,
                                                   unsigned staged_cap = kStaged) {
  static_assert(kStaged % 2 == 0, "staged in pairs");
  const unsigned cap = staged_cap < (unsigned)kStaged ? staged_cap & ~1u : (unsigned)kStaged;
  const unsigned n = chunks < cap ? chunks : cap;
  const unsigned n2 = (n + 1) & ~1u;  // the pad key 0 is below every real one
  for (unsigned c = threadIdx.x; c < n2; c += kThreads) staged[c] = c < n ? __ldcg(row_best + c) : 0ull;
  __syncthreads();
  auto place = [&](unsigned long long v, unsigned above) {
    if (above == (unsigned)k - 1 && out) *out = v;
    if (ranked) ranked[above] = v;
  };
  if (n == chunks) {
    const auto* pairs = reinterpret_cast<const ulonglong2*>(staged);
    for (unsigned c = threadIdx.x; c < chunks; c += kThreads) {
      const unsigned long long v = staged[c];
      unsigned above = 0;
#pragma unroll 8
      for (unsigned d = 0; d < n2 / 2; ++d) {
        const ulonglong2 p = pairs[d];
        above += (p.x > v) + (p.y > v);
      }
      place(v, above);
    }
    return;
  }
  for (unsigned c = threadIdx.x; c < chunks; c += kThreads) {
    const unsigned long long v = c < n ? staged[c] : __ldcg(row_best + c);
    unsigned above = 0;
    for (unsigned d = 0; d < chunks; ++d) above += (d < n ? staged[d] : __ldcg(row_best + d)) > v;
    place(v, above);
  }
}

}  // namespace muser::cuda
