// What the q8 matvec's weight stream costs in time and in power, apart from
// its arithmetic: the seed's 925 MB read by 132 CTAs of 16 warps, a warp
// walking one 16-row tile unit by unit (2,816 bytes, 26 units a tile) as
// matvec_q8_staged_kernel does, with different copy mechanisms and layouts.
// The kernel's compute is a XOR, so only the stream is measured.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 -Isrc/cpp -Isrc/cuda -o /tmp/sp bench/experiments/cuda_stream_power.cu
//   /tmp/sp                # every variant: median kernel time, x the read kernel
//   /tmp/sp VARIANT SECS   # one variant in a loop for SECS seconds (sample the
//                          # power beside it: bench/experiments/cuda_stream_power.py)
//
// Variants: read (muser's read-limit kernel, src/cuda/bandwidth.cu), and
// {cpasync, ldg, bulk} x {tile16, tile256} with S stages:
//   cpasync  cp.async.cg 16 bytes a lane into a per-warp shared ring (the kernel's way)
//   ldg      16-byte loads into registers, one unit ahead (no shared memory)
//   bulk     one cp.async.bulk (TMA) of the whole unit by lane 0, an mbarrier a stage
//   tile16   the device layout (device_layout.h): a warp's unit u is 2,816 contiguous bytes,
//            the 16 warps of a CTA in 16 tiles 73 KB apart
//   tile256  tiles of 256 rows: the 16 warps' units u are one 45 KB run
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "bandwidth.cu"  // the read-limit kernel the CUDA bench divides by

namespace muser::cuda {
[[noreturn]] void throw_cuda_error(cudaError_t err, const std::string& what) {
  std::fprintf(stderr, "%s: %s\n", what.c_str(), cudaGetErrorName(err));
  std::abort();
}
}  // namespace muser::cuda

namespace {

constexpr int kUnits = 26, kUnitBytes = 2816, kWarps = 16, kGroups = 790;  // 790 x 256 rows >= 202,048
constexpr size_t kBytes = (size_t)kGroups * kWarps * kUnits * kUnitBytes;    // 925.4 MB

enum Copy { kCpAsync, kLdg, kBulk };

template <bool kTile256>
__device__ __forceinline__ const uint8_t* unit_src(const uint8_t* w, int64_t group, int warp, int u) {
  if (kTile256) return w + ((group * kUnits + u) * kWarps + warp) * (int64_t)kUnitBytes;
  return w + ((group * kWarps + warp) * kUnits + u) * (int64_t)kUnitBytes;
}

__device__ __forceinline__ void cp16(uint8_t* d, const uint8_t* s) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((uint32_t)__cvta_generic_to_shared(d)), "l"(s) : "memory");
}
__device__ __forceinline__ uint4 ldg16(const uint8_t* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  return v;
}
__device__ __forceinline__ uint32_t smem_addr(const void* p) { return (uint32_t)__cvta_generic_to_shared(p); }
__device__ __forceinline__ void mbar_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void bulk_copy(uint8_t* dst, const uint8_t* src, uint32_t bytes, uint64_t* bar) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_addr(bar)), "r"(bytes) : "memory");
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
               ::"r"(smem_addr(dst)), "l"(src), "r"(bytes), "r"(smem_addr(bar)) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  asm volatile(
      "{\n .reg .pred p;\n WAIT_%=:\n mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n @!p bra WAIT_%=;\n}\n"
      ::"r"(smem_addr(bar)), "r"(parity) : "memory");
}

template <Copy kCopy, bool kTile256, int S>
__global__ void __launch_bounds__(512, 1) stream_kernel(const uint8_t* w, unsigned* sink) {
  extern __shared__ __align__(128) uint8_t smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t my_groups = (kGroups - blockIdx.x + gridDim.x - 1) / gridDim.x;
  const int64_t total = my_groups * kUnits;  // units this warp reads, tile after tile
  auto src = [&](int64_t i) { return unit_src<kTile256>(w, blockIdx.x + (i / kUnits) * gridDim.x, warp, (int)(i % kUnits)); };
  unsigned acc = 0;
  if constexpr (kCopy == kLdg) {
    constexpr int kPer = (kUnitBytes / 16 + 31) / 32;  // 6 pieces a lane, the last one partial
    uint4 cur[kPer], nxt[kPer];
    auto load = [&](uint4 (&v)[kPer], int64_t i) {
      const uint8_t* s = src(i < total ? i : total - 1) + 16 * lane;
#pragma unroll
      for (int k = 0; k < kPer; ++k) v[k] = (k < kPer - 1 || lane + 32 * k < kUnitBytes / 16) ? ldg16(s + 512 * k) : make_uint4(0, 0, 0, 0);
    };
    load(cur, 0);
    for (int64_t i = 0; i < total; ++i) {
      load(nxt, i + 1);
#pragma unroll
      for (int k = 0; k < kPer; ++k) acc ^= cur[k].x ^ cur[k].y ^ cur[k].z ^ cur[k].w, cur[k] = nxt[k];
    }
  } else {
    uint8_t* ring = smem + warp * S * kUnitBytes;
    uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kWarps * S * kUnitBytes) + warp * S;
    if (kCopy == kBulk && lane == 0) {
      for (int s = 0; s < S; ++s) mbar_init(&bars[s]);
      asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    }
    __syncwarp();
    auto issue = [&](int64_t i, int stage) {
      if (kCopy == kCpAsync) {
        if (i < total) {
          const uint8_t* s = src(i) + 16 * lane;
          for (int k = 0; k < 6; ++k)
            if (lane + 32 * k < kUnitBytes / 16) cp16(ring + stage * kUnitBytes + 16 * lane + 512 * k, s + 512 * k);
        }
        asm volatile("cp.async.commit_group;" ::: "memory");
      } else if (lane == 0 && i < total) {
        bulk_copy(ring + stage * kUnitBytes, src(i), kUnitBytes, &bars[stage]);
      }
    };
    for (int s = 0; s < S - 1; ++s) issue(s, s);
    int rd = 0, wr = S - 1;
    for (int64_t i = 0; i < total; ++i) {
      if (kCopy == kCpAsync) {
        asm volatile("cp.async.wait_group %0;" ::"n"(S - 2) : "memory");
      } else {
        mbar_wait(&bars[rd], (uint32_t)((i / S) & 1));
      }
      __syncwarp();
      issue(i + S - 1, wr);
      const uint4 v = reinterpret_cast<const uint4*>(ring + rd * kUnitBytes)[lane];
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
      rd = rd == S - 1 ? 0 : rd + 1;
      wr = wr == S - 1 ? 0 : wr + 1;
    }
    if (kCopy == kCpAsync) asm volatile("cp.async.wait_group 0;" ::: "memory");
  }
  if (acc == 0x12345678u) sink[0] = acc;
}

__global__ void fill(uint8_t* w, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
    w[i] = (uint8_t)(i * 2654435761u >> 13);
}

struct Variant {
  std::string name;
  void (*launch)(const uint8_t*, unsigned*, int, cudaStream_t);
};

template <Copy kCopy, bool kTile256, int S>
void launch_stream(const uint8_t* w, unsigned* sink, int sms, cudaStream_t st) {
  const int smem = kCopy == kLdg ? 0 : kWarps * S * kUnitBytes + kWarps * S * 8;
  static bool once = [&] {
    cudaFuncSetAttribute(stream_kernel<kCopy, kTile256, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    return true;
  }();
  (void)once;
  stream_kernel<kCopy, kTile256, S><<<sms, 512, smem, st>>>(w, sink);
}
void launch_read(const uint8_t* w, unsigned* sink, int, cudaStream_t st) {
  static const int words = muser::cuda::read_bandwidth_sink_words(0);
  muser::cuda::read_bandwidth(w, kBytes, sink, words, st);
}

#define V(copy, t256, s, name) Variant{name, launch_stream<copy, t256, s>}
const std::vector<Variant>& variants() {
  static const std::vector<Variant> v = {
      {"read", launch_read},
      V(kCpAsync, false, 2, "cpasync tile16 S=2"),  V(kCpAsync, false, 4, "cpasync tile16 S=4"),
      V(kCpAsync, true, 2, "cpasync tile256 S=2"),  V(kCpAsync, true, 4, "cpasync tile256 S=4"),
      V(kLdg, false, 2, "ldg tile16"),              V(kLdg, true, 2, "ldg tile256"),
      V(kBulk, false, 2, "bulk tile16 S=2"),        V(kBulk, false, 4, "bulk tile16 S=4"),
      V(kBulk, true, 2, "bulk tile256 S=2"),        V(kBulk, true, 4, "bulk tile256 S=4"),
  };
  return v;
}

float median_us(const Variant& v, const uint8_t* w, unsigned* sink, int sms, double seconds) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  std::vector<float> t;
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0;; ++i) {
    cudaEventRecord(a);
    v.launch(w, sink, sms, 0);
    cudaEventRecord(b);
    cudaEventSynchronize(b);
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    if (i >= 3) t.push_back(ms * 1000);
    if (i >= 23 && std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() >= seconds) break;
  }
  if (cudaGetLastError() != cudaSuccess) std::printf("CUDA error in %s\n", v.name.c_str());
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  uint8_t* w = nullptr;
  unsigned* sink = nullptr;
  cudaMalloc(&w, kBytes);
  cudaMalloc(&sink, 4 * muser::cuda::read_bandwidth_sink_words(0));
  fill<<<1024, 256>>>(w, kBytes);
  cudaDeviceSynchronize();
  if (argc >= 3) {
    for (const Variant& v : variants())
      if (v.name == argv[1]) {
        std::printf("%-22s %7.1f us\n", v.name.c_str(), median_us(v, w, sink, sms, std::atof(argv[2])));
        return 0;
      }
    std::printf("no variant %s\n", argv[1]);
    return 2;
  }
  const float limit = median_us(variants()[0], w, sink, sms, 0);
  std::printf("%zu bytes; read %.1f us\n", kBytes, limit);
  for (const Variant& v : variants()) {
    const float us = median_us(v, w, sink, sms, 0);
    std::printf("%-22s %7.1f us  %.3f x read\n", v.name.c_str(), us, us / limit);
  }
  return 0;
}
