// Logits ranked as 64-bit keys, and the maxima of keys across a warp and a
// CTA: the one order every device ranking uses (topk.cu's argmax and top-k,
// sample.cu's kept-set order and race). A key holds the logit's bits made
// monotonic in the high word (NaN lowest, -0 folded onto +0) and
// 0xFFFFFFFF - id in the low word: a larger key is a better token, ties go to
// the lowest id, NaN never beats a number -- the CPU's rule (sample_before,
// argmax_rows, topk_rows).
#pragma once
#include <cstdint>

namespace muser::cuda {

__device__ __forceinline__ unsigned long long logit_key(float v, int64_t id) {
  const unsigned low = 0xFFFFFFFFu - (unsigned)id;
  if (v != v) return low;  // NaN: below every number
  uint32_t b = __float_as_uint(v == 0.0f ? 0.0f : v);
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return ((unsigned long long)b << 32) | low;
}

// The token id of a key.
__device__ __forceinline__ unsigned logit_key_id(unsigned long long key) { return 0xFFFFFFFFu - (unsigned)key; }

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

}  // namespace muser::cuda
