// The experiment behind the row-tiled device layout (src/cuda/repack.cuh):
// the q8 staged kernel's weight traffic alone, with no arithmetic, in the
// GGUF row order (a warp reads 16 pieces of 176 bytes, one per row, rows
// 4,576 bytes apart) and in row tiles (the same 2,816 bytes as one run, the
// next unit right after), next to a plain contiguous read of the same bytes.
//
//   nvcc -O3 -arch=sm_90 -o /tmp/tile_locality bench/experiments/cuda_tile_locality.cu && /tmp/tile_locality
//
// H200 (docs/performance.md): read limit 207.8 us; rows 258.0 us (S = 4),
// 259.7 (S = 2); tiled 208.2 (S = 4), 211.6 (S = 2) -- the same at any
// stand-in compute ("spin"). The row order, not the bytes in flight, held
// the kernel at 75 % of DRAM bandwidth.
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>
constexpr int kRows = 202048, kUnits = 26, kBlock = 176, kRowBytes = kUnits * kBlock;
constexpr int kWarps = 16, kRowsPerWarp = 16, kStage = kRowsPerWarp * kBlock, kPieces = kStage / 16;
__device__ __forceinline__ void cp16(uint8_t* d, const uint8_t* s) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((uint32_t)__cvta_generic_to_shared(d)), "l"(s) : "memory");
}
template <int MODE, int S>  // MODE 0: GGUF rows, 1: row tiles; S: stages of the cp.async ring
__global__ void __launch_bounds__(512, 1) k(const uint8_t* w, unsigned* sink, int spin) {
  extern __shared__ uint4 sm[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint8_t* ws = reinterpret_cast<uint8_t*>(sm) + warp * S * kStage;
  const int groups = (kRows + 255) / 256;
  unsigned acc = 0;
  for (int g = blockIdx.x; g < groups; g += gridDim.x) {
    const int64_t rg = (int64_t)g * kWarps + warp;  // 16-row group
    if (rg * 16 >= kRows) break;
    auto src = [&](int u, int p) -> const uint8_t* {
      if (MODE == 0) { int r = p / 11, c = p % 11; return w + (rg * 16 + r) * kRowBytes + u * kBlock + 16 * c; }
      else return w + (rg * kUnits + u) * kStage + 16 * p;
    };
    auto issue = [&](int u, int st) {
      if (u < kUnits)
        for (int kk = 0; kk < 6; ++kk) { int p = lane + 32 * kk; if (p < kPieces) cp16(ws + st * kStage + 16 * p, src(u, p)); }
      asm volatile("cp.async.commit_group;" ::: "memory");
    };
    for (int s = 0; s < S - 1; ++s) issue(s, s);
    int rd = 0, wr = S - 1;
    for (int u = 0; u < kUnits; ++u) {
      asm volatile("cp.async.wait_group %0;" ::"n"(S - 2) : "memory");
      __syncwarp();
      issue(u + S - 1, wr);
      const uint4 v = reinterpret_cast<const uint4*>(ws + rd * kStage)[lane];
      acc ^= v.x ^ v.y ^ v.z ^ v.w;
      for (int i = 0; i < spin; ++i) acc = acc * 1664525u + 1013904223u;  // stand-in compute
      rd = rd == S - 1 ? 0 : rd + 1; wr = wr == S - 1 ? 0 : wr + 1;
    }
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncwarp();
  }
  if (acc == 0x12345678u) sink[0] = acc;
}
__global__ void __launch_bounds__(512) rd(const uint4* p, size_t n16, unsigned* sink) {
  unsigned acc = 0; const size_t stride = (size_t)gridDim.x * blockDim.x; size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
  for (; i + 3 * stride < n16; i += 4 * stride) { uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) asm("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];" : "=r"(v[u].x), "=r"(v[u].y), "=r"(v[u].z), "=r"(v[u].w) : "l"(p + i + u * stride));
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w; }
  if (acc == 0x12345678u) sink[0] = acc;
}
__global__ void fill(uint8_t* w, size_t n) { for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) w[i] = (uint8_t)(i * 2654435761u >> 13); }
template <int MODE, int S>  // MODE 0: GGUF rows, 1: row tiles; S: stages of the cp.async ring
float run(const uint8_t* w, unsigned* sink, int spin, int sms) {
  auto kern = k<MODE, S>;
  const int smem = kWarps * S * kStage;
  cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  std::vector<float> t;
  for (int i = 0; i < 25; ++i) {
    cudaEventRecord(a); kern<<<sms, 512, smem>>>(w, sink, spin); cudaEventRecord(b); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b); if (i >= 5) t.push_back(ms * 1000);
  }
  std::sort(t.begin(), t.end());
  if (cudaGetLastError() != cudaSuccess) printf("error\n");
  return t[t.size() / 2];
}
int main() {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const size_t n = (size_t)kRows * kRowBytes + (1 << 20);
  uint8_t* w; unsigned* sink; cudaMalloc(&w, n); cudaMalloc(&sink, 64);
  fill<<<1024, 256>>>(w, n); cudaDeviceSynchronize();
  {
    cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b); std::vector<float> t;
    const size_t n16 = (size_t)kRows * kRowBytes / 16;
    for (int i = 0; i < 25; ++i) { cudaEventRecord(a); rd<<<sms * 4, 512>>>((const uint4*)w, n16, sink); cudaEventRecord(b); cudaEventSynchronize(b);
      float ms; cudaEventElapsedTime(&ms, a, b); if (i >= 5) t.push_back(ms * 1000); }
    std::sort(t.begin(), t.end()); printf("read limit %.1f us\n", t[t.size() / 2]);
  }
  for (int spin : {0, 40, 80}) {
    printf("spin %3d  rows S=4 %.1f  tiled S=4 %.1f  rows S=2 %.1f  tiled S=2 %.1f  us\n", spin,
           run<0, 4>(w, sink, spin, sms), run<1, 4>(w, sink, spin, sms), run<0, 2>(w, sink, spin, sms), run<1, 2>(w, sink, spin, sms));
  }
  return 0;
}
