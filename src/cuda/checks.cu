// find_nonfinite: the lowest index of a NaN or +-inf in a device array, so a
// device hidden state gets the same NonFiniteError (naming row and column)
// as a host one. One atomicMin per offending element; the common all-finite
// case writes nothing.
#include <algorithm>

#include "cuda_check.h"
#include "kernels.h"

namespace muser::cuda {

namespace {

__global__ void find_nonfinite_kernel(const float* x, int64_t n, unsigned long long* first_bad) {
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += (int64_t)gridDim.x * blockDim.x)
    if (!isfinite(x[i])) atomicMin(first_bad, (unsigned long long)i);
}

// Beside the route on a side branch of the call's graph: the lowest bad
// index, or ~0, written once to `out` (mapped host memory). The route's
// persistent kernels take whole SMs, so a scan CTA delays the route's CTA on
// its SM for as long as it runs: a few CTAs, each over a short slice with
// four loads in flight a thread, rather than one CTA over all of t * H (which
// held an SM for ~100 us at t = 256). sync = {best, count}, zero at rest:
// best is the largest ~index found (0: none), and the last CTA to finish
// writes ~best to out and zeroes both again.
constexpr int kScanThreads = 1024;
constexpr int64_t kScanPerCta = 64 * 1024;
constexpr int kScanMaxCtas = 64;
__global__ void first_nonfinite_kernel(const float* x, int64_t n, unsigned long long* out, unsigned long long* sync) {
  __shared__ unsigned long long cta_best;
  if (threadIdx.x == 0) cta_best = 0;
  __syncthreads();
  const int64_t stride = (int64_t)gridDim.x * kScanThreads;
  for (int64_t i0 = (int64_t)blockIdx.x * kScanThreads + threadIdx.x; i0 < n; i0 += 4 * stride) {
    float v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = i0 + u * stride < n ? x[i0 + u * stride] : 0.0f;
    int bad = -1;  // this thread's first bad of the four: its indices grow with u
#pragma unroll
    for (int u = 3; u >= 0; --u)
      if (!isfinite(v[u])) bad = u;
    if (bad >= 0) {
      atomicMax(&cta_best, ~(unsigned long long)(i0 + bad * stride));
      break;  // this thread's later indices are larger
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    if (cta_best) atomicMax(&sync[0], cta_best);
    __threadfence();
    if (atomicAdd(reinterpret_cast<unsigned*>(&sync[1]), 1u) == gridDim.x - 1) {
      __threadfence();
      const unsigned long long best = atomicExch(&sync[0], 0ull);
      sync[1] = 0;
      *out = ~best;  // ~0 (no bad value) when best is 0
    }
  }
}

}  // namespace

void first_nonfinite(const float* x, int64_t n, unsigned long long* out, unsigned long long* sync,
                     cudaStream_t stream) {
  const int64_t ctas = std::min<int64_t>(std::max<int64_t>((n + kScanPerCta - 1) / kScanPerCta, 1), kScanMaxCtas);
  first_nonfinite_kernel<<<(unsigned)ctas, kScanThreads, 0, stream>>>(x, n, out, sync);
  check_launch("first_nonfinite");
}

void find_nonfinite(const float* x, int64_t n, unsigned long long* first_bad, cudaStream_t stream) {
  // all ones (above every index) by a memset, not an upload from host memory: capturable, no round trip
  check(cudaMemsetAsync(first_bad, 0xFF, sizeof(unsigned long long), stream), "cudaMemsetAsync(first_bad)");
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 1024);
  if (blocks > 0) find_nonfinite_kernel<<<(unsigned)blocks, threads, 0, stream>>>(x, n, first_bad);
  check_launch("find_nonfinite");
}

}  // namespace muser::cuda
