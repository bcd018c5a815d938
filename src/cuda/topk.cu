// argmax / top-k over each row of logits on the device, so only the winners
// travel to the host.
//
// Order: a logit and its token id become one 64-bit key, the float's bits
// made monotonic in the high word (NaN lowest, -0 folded onto +0) and
// 0xFFFFFFFF - id in the low word: a larger key is a better token, ties go to
// the lowest id, NaN never beats a number -- the CPU's argmax_rows/topk_rows
// rule. Keys are distinct, so "the largest key below the last one taken" walks
// the ranking without marking anything.
//
// Thread mapping: a CTA of 256 threads holds a chunk of 2048 keys of one row
// in registers (8 each) and takes its k best in k passes (each a max-reduce:
// warp shuffles, then one shared word per warp). The chunks' winners form the
// next stage's input (k keys per chunk) until one chunk is left; a last kernel
// turns keys into ids and gathers the exact logits (so -0 stays -0).
#include <algorithm>

#include "cuda_check.h"
#include "kernels.h"

namespace muser::cuda {

namespace {

constexpr int kTopkThreads = 256;
constexpr int kTopkItems = 8;
constexpr int kTopkChunk = kTopkThreads * kTopkItems;

__device__ __forceinline__ unsigned long long logit_key(float v, int64_t id) {
  const unsigned low = 0xFFFFFFFFu - (unsigned)id;
  if (v != v) return low;  // NaN: below every number
  uint32_t b = __float_as_uint(v == 0.0f ? 0.0f : v);
  b = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return ((unsigned long long)b << 32) | low;
}

template <bool kFromLogits>
__global__ void topk_stage_kernel(const float* logits, const unsigned long long* keys_in, int64_t n, int k,
                                  unsigned long long* keys_out) {
  __shared__ unsigned long long warp_best[kTopkThreads / 32];
  const int64_t row = blockIdx.y, chunk = blockIdx.x;
  const int64_t base = chunk * kTopkChunk;
  unsigned long long item[kTopkItems];
#pragma unroll
  for (int i = 0; i < kTopkItems; ++i) {
    const int64_t j = base + i * kTopkThreads + threadIdx.x;
    if (j >= n) item[i] = 0;  // below every real key
    else if (kFromLogits) item[i] = logit_key(logits[row * n + j], j);
    else item[i] = keys_in[row * n + j];
  }
  unsigned long long limit = ~0ull;
  unsigned long long* out = keys_out + (row * gridDim.x + chunk) * k;
  for (int pass = 0; pass < k; ++pass) {
    unsigned long long best = 0;
#pragma unroll
    for (int i = 0; i < kTopkItems; ++i)
      if (item[i] < limit && item[i] > best) best = item[i];
    for (int off = 16; off >= 1; off >>= 1) {
      const unsigned long long o = __shfl_xor_sync(0xffffffffu, best, off);
      best = o > best ? o : best;
    }
    if ((threadIdx.x & 31) == 0) warp_best[threadIdx.x >> 5] = best;
    __syncthreads();
    best = 0;
#pragma unroll
    for (int w = 0; w < kTopkThreads / 32; ++w) best = warp_best[w] > best ? warp_best[w] : best;
    __syncthreads();
    if (threadIdx.x == 0) out[pass] = best;
    limit = best;
  }
}

__global__ void topk_finish_kernel(const float* logits, int64_t V, const unsigned long long* keys, int t, int k,
                                   int64_t* ids, float* vals) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= t * k) return;
  const int row = i / k;
  const int64_t id = (int64_t)(0xFFFFFFFFu - (unsigned)(keys[i] & 0xFFFFFFFFull));
  ids[i] = id;
  vals[i] = logits[row * V + id];
}

int64_t chunks_of(int64_t n) { return (n + kTopkChunk - 1) / kTopkChunk; }

void launch_topk(const float* logits, int64_t V, int t, int k, void* scratch, int64_t* ids, float* vals,
                 cudaStream_t stream) {
  auto* buf_a = static_cast<unsigned long long*>(scratch);
  auto* buf_b = buf_a + (size_t)t * chunks_of(V) * k;
  int64_t chunks = chunks_of(V);
  topk_stage_kernel<true><<<dim3((unsigned)chunks, (unsigned)t), kTopkThreads, 0, stream>>>(logits, nullptr, V, k, buf_a);
  check_launch("topk_stage(logits)");
  // each stage leaves `chunks` x k keys per row; merge until one chunk is left
  while (chunks > 1) {
    const int64_t n = chunks * k;
    chunks = chunks_of(n);
    topk_stage_kernel<false><<<dim3((unsigned)chunks, (unsigned)t), kTopkThreads, 0, stream>>>(nullptr, buf_a, n, k, buf_b);
    check_launch("topk_stage(keys)");
    std::swap(buf_a, buf_b);
  }
  const int n = t * k;
  topk_finish_kernel<<<(n + 255) / 256, 256, 0, stream>>>(logits, V, buf_a, t, k, ids, vals);
}

}  // namespace

size_t topk_scratch_bytes(int64_t V, int t, int k) { return 2 * (size_t)t * chunks_of(V) * k * 8; }

void topk(const float* logits, int64_t V, int t, int k, void* scratch, int64_t* ids, float* vals,
          cudaStream_t stream) {
  if (k < 1 || k > kTopkMax || k > V) throw ArgValueError("topk: k must be in [1, min(V, " + std::to_string(kTopkMax) + ")] on the device");
  launch_topk(logits, V, t, k, scratch, ids, vals, stream);
  check_launch("topk_finish");
}

}  // namespace muser::cuda
