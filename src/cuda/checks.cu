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

// One CTA over all n (it runs on a side branch of the call's graph, beside the
// route): the lowest bad index, or ~0, written straight to `out` (mapped host memory).
constexpr int kScanThreads = 1024;
__global__ void first_nonfinite_kernel(const float* x, int64_t n, unsigned long long* out) {
  __shared__ unsigned long long lowest;
  if (threadIdx.x == 0) lowest = ~0ull;
  __syncthreads();
  for (int64_t i = threadIdx.x; i < n; i += kScanThreads)
    if (!isfinite(x[i])) {
      atomicMin(&lowest, (unsigned long long)i);
      break;  // this thread's later indices are larger
    }
  __syncthreads();
  if (threadIdx.x == 0) *out = lowest;
}

}  // namespace

void first_nonfinite(const float* x, int64_t n, unsigned long long* out, cudaStream_t stream) {
  first_nonfinite_kernel<<<1, kScanThreads, 0, stream>>>(x, n, out);
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
