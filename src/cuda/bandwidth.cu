// The read limit the benchmark divides by: stream a buffer once with 16-byte
// non-allocating loads, four in flight per thread, every SM busy. The XOR of
// what was read goes to one word per CTA so the loads cannot be dropped.
#include "cuda_check.h"
#include "kernels.h"

namespace muser::cuda {

namespace {

constexpr int kReadThreads = 512;
constexpr int kReadCtasPerSm = 4;

__global__ void __launch_bounds__(kReadThreads) read_bandwidth_kernel(const uint4* p, size_t n16, unsigned* sink) {
  unsigned acc = 0;
  const size_t stride = (size_t)gridDim.x * blockDim.x;
  size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u)
      asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
          : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w)
          : "l"(p + i + u * stride));
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n16; i += stride) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  for (int off = 16; off >= 1; off >>= 1) acc ^= __shfl_xor_sync(0xffffffffu, acc, off);
  if (threadIdx.x == 0) sink[blockIdx.x] = acc;
}

// Spins (sleeping between looks at the global timer) for `nanoseconds`.
__global__ void hold_kernel(unsigned long long nanoseconds) {
  unsigned long long start, now;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
  do {
    __nanosleep(1000);
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
  } while (now - start < nanoseconds);
}

}  // namespace

void hold_stream(cudaStream_t stream, unsigned microseconds) {
  hold_kernel<<<1, 1, 0, stream>>>(1000ull * microseconds);
  check_launch("hold_stream");
}

int read_bandwidth_sink_words(int ordinal) {
  int sms = 0;
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ordinal), "cudaDeviceGetAttribute(SM count)");
  return sms * kReadCtasPerSm;
}

void read_bandwidth(const void* buf, size_t nbytes, unsigned* sink, int sink_words, cudaStream_t stream) {
  read_bandwidth_kernel<<<sink_words, kReadThreads, 0, stream>>>(static_cast<const uint4*>(buf), nbytes / 16, sink);
  check_launch("read_bandwidth");
}

}  // namespace muser::cuda
