// The q8 staged kernel's weight traffic on a head of short rows (the
// Gemma-3 head: Q8_0, 262,144 x 640, a 16-row tile of 5 units of 2,176
// bytes), with no arithmetic but a stand-in per unit ("spin") and per tile
// (300 LCG steps), next to a plain contiguous read of the same bytes: which
// copy method, ring depth, CTA count and order reach the read limit where a
// warp's tile is only five units long.
//
//   nvcc -O3 -arch=sm_90 -Isrc/cuda -o /tmp/short_rows bench/experiments/cuda_short_rows.cu && /tmp/short_rows
//
// Methods: "cp.async" (the staged kernel's: 16-byte cp.async.cg pieces, a
// ring of S units a warp, wait_group), "bulk" (one cp.async.bulk a unit by
// lane 0, an mbarrier a stage); each with an L2 bulk prefetch of the warp's
// tile 1, 2 or 4 groups ahead; the units of a CTA's 16 tiles interleaved (a
// layout the device does not use); each warp a contiguous run of units
// across tiles (no whole-tile tail); 128 CTAs (8 groups each, no uneven
// last wave).
//
// H100, three runs (docs/performance.md, "CUDA batches"): read limit
// 60.1-62.6 us; every ring of either method 63.3-70 us (S = 2: 1.05-1.07 x),
// interleaved and 128 CTAs the same, unit runs 65.4-68.9, and the L2
// prefetch 83-100 us: the copies' pattern alone costs the short rows 5-7 %.
// The last lines: the ring in 2 or 3 CTAs a SM (H100, 2026-12-07: 66.1 and
// 67.8 us against 66.7 for one, read limit 61.9): more warps do not help.
#include <cstdio>
#include <cstdint>
#include <vector>
#include <algorithm>
#include <cuda_runtime.h>

#include "async_copy.cuh"
constexpr int kRows = 262144, kUnits = 5, kUnitBytes = 4 * 34, kRowBytes = 20 * 34;
constexpr int kWarps = 16, kRowsPerWarp = 16, kStage = kRowsPerWarp * kUnitBytes, kPieces = kStage / 16;
constexpr int kTiles = kRows / kRowsPerWarp;

using namespace muser::cuda;  // smem_addr and the mbarrier / bulk-copy PTX (async_copy.cuh)
__device__ __forceinline__ void cp16(uint8_t* d, const uint8_t* s) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_addr(d)), "l"(s) : "memory");
}
// one bulk copy of n bytes, counted on b (one arrival and its bytes)
__device__ __forceinline__ void bulk(uint8_t* d, const uint8_t* s, uint32_t n, uint64_t* b) {
  mbar_expect_tx(b, n);
  bulk_copy(d, s, n, b);
}

// BULK 0: cp.async pieces; 1: one bulk copy a unit. S stages a warp; the ring runs on across tiles.
// PF: lane 0 pulls the warp's tile PF groups ahead into L2 (one bulk prefetch) as it starts a tile;
// IL: the CTA group's units interleaved (unit u of its 16 tiles side by side), a layout
// the device does not use: the bound of a unit-major relayout; IL = 2: each warp a
// contiguous run of units across tile boundaries (the tail of whole tiles gone).
template <int BULK, int S, int PF = 0, int IL = 0>
__global__ void __launch_bounds__(512) k(const uint8_t* w, unsigned* sink, int spin, int finish) {
  extern __shared__ uint4 sm[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint8_t* ws = reinterpret_cast<uint8_t*>(sm) + warp * S * (kStage + 16);
  uint64_t* bars = reinterpret_cast<uint64_t*>(ws + S * kStage);
  if (BULK && lane == 0) {
    for (int s = 0; s < S; ++s) mbar_init(bars + s, 1);
    fence_mbar_init();
  }
  __syncwarp();
  const int groups = kTiles / kWarps;
  const int gw = blockIdx.x * kWarps + warp, nw = gridDim.x * kWarps, total = kTiles * kUnits;
  const int u0 = (int)((int64_t)gw * total / nw), u1 = (int)((int64_t)(gw + 1) * total / nw);
  const int my = IL == 2 ? (u1 - u0 + kUnits - 1) / kUnits : (groups - blockIdx.x + gridDim.x - 1) / gridDim.x;
  auto tile = [&](int n) { return w + (int64_t)((blockIdx.x + n * gridDim.x) * kWarps + warp) * kRowsPerWarp * kRowBytes; };
  auto unit = [&](int n, int u) {
    if (IL == 2) return w + (int64_t)(u0 + n * kUnits + u) * kStage;
    if (IL) return w + (int64_t)(blockIdx.x + n * gridDim.x) * kWarps * kRowsPerWarp * kRowBytes + (u * kWarps + warp) * kStage;
    return tile(n) + u * kStage;
  };
  int in = 0, iu = 0;
  auto issue = [&](int st) {
    if (IL == 2 ? u0 + in * kUnits + iu < u1 : in < my) {
      const uint8_t* src = unit(in, iu);
      if (BULK) {
        if (lane == 0) bulk(ws + st * kStage, src, kStage, bars + st);
      } else {
        for (int kk = 0; kk < (kPieces + 31) / 32; ++kk) {
          const int p = lane + 32 * kk;
          if (p < kPieces) cp16(ws + st * kStage + 16 * p, src + 16 * p);
        }
      }
      if (++iu == kUnits) iu = 0, ++in;
    }
    if (!BULK) asm volatile("cp.async.commit_group;" ::: "memory");
  };
  for (int s = 0; s < S - 1; ++s) issue(s);
  int rd = 0, wr = S - 1;
  uint32_t phase = 0;
  unsigned acc = 0;
  for (int n = 0; n < my; ++n) {
    if (PF && lane == 0 && n + PF < my)
      asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(tile(n + PF)), "r"(kUnits * kStage) : "memory");
    for (int u = 0; u < kUnits; ++u) {
      if (IL == 2 && u0 + n * kUnits + u >= u1) break;
      if (BULK) {
        mbar_wait(bars + rd, (phase >> rd) & 1);
        phase ^= 1u << rd;
      } else {
        asm volatile("cp.async.wait_group %0;" ::"n"(S - 2) : "memory");
      }
      __syncwarp();
      issue(wr);
      const uint4* st = reinterpret_cast<const uint4*>(ws + rd * kStage);
      for (int p = lane; p < kPieces; p += 32) { const uint4 v = st[p]; acc ^= v.x ^ v.y ^ v.z ^ v.w; }
      for (int i = 0; i < spin; ++i) acc = acc * 1664525u + 1013904223u;  // stand-in compute
      rd = rd == S - 1 ? 0 : rd + 1;
      wr = wr == S - 1 ? 0 : wr + 1;
    }
    for (int i = 0; i < finish; ++i) acc = acc * 1664525u + 1013904223u;  // stand-in tile finish
  }
  if (!BULK) asm volatile("cp.async.wait_group 0;" ::: "memory");
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
template <class F>
float median_us(F launch) {
  cudaEvent_t a, b; cudaEventCreate(&a); cudaEventCreate(&b);
  std::vector<float> t;
  for (int i = 0; i < 30; ++i) {
    cudaEventRecord(a); launch(); cudaEventRecord(b); cudaEventSynchronize(b);
    float ms; cudaEventElapsedTime(&ms, a, b); if (i >= 5) t.push_back(ms * 1000);
  }
  std::sort(t.begin(), t.end());
  if (cudaGetLastError() != cudaSuccess) printf("error\n");
  return t[t.size() / 2];
}
template <int BULK, int S, int PF = 0, int IL = 0>
float run(const uint8_t* w, unsigned* sink, int spin, int finish, int ctas) {
  auto kern = k<BULK, S, PF, IL>;
  const int smem = kWarps * S * (kStage + 16);
  cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  return median_us([&] { kern<<<ctas, 512, smem>>>(w, sink, spin, finish); });
}
int main() {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const size_t n = (size_t)kRows * kRowBytes;
  uint8_t* w; unsigned* sink; cudaMalloc(&w, n + (1 << 20)); cudaMalloc(&sink, 64);
  fill<<<1024, 256>>>(w, n); cudaDeviceSynchronize();
  const float lim = median_us([&] { rd<<<sms * 4, 512>>>((const uint4*)w, n / 16, sink); });
  printf("read limit %.1f us (%zu bytes)\n", lim, n);
  for (int spin : {0, 30}) {
    const int f = 300;
    printf("spin %2d finish %d | 128 CTAs %.1f | unit runs %.1f %.1f | cp.async S=2 %.1f | bulk S=2 %.1f S=4 %.1f | + L2 prefetch 1 tile ahead: cp.async S=2 %.1f bulk S=2 %.1f"
           " | 2 ahead: %.1f %.1f | 4 ahead: %.1f %.1f | interleaved units: cp.async S=2 %.1f bulk S=2 %.1f us\n",
           spin, f, run<0, 2>(w, sink, spin, f, 128), run<0, 2, 0, 2>(w, sink, spin, f, sms),
           run<1, 2, 0, 2>(w, sink, spin, f, sms), run<0, 2>(w, sink, spin, f, sms), run<1, 2>(w, sink, spin, f, sms), run<1, 4>(w, sink, spin, f, sms),
           run<0, 2, 1>(w, sink, spin, f, sms), run<1, 2, 1>(w, sink, spin, f, sms), run<0, 2, 2>(w, sink, spin, f, sms),
           run<1, 2, 2>(w, sink, spin, f, sms), run<0, 2, 4>(w, sink, spin, f, sms), run<1, 2, 4>(w, sink, spin, f, sms),
           run<0, 2, 0, 1>(w, sink, spin, f, sms), run<1, 2, 0, 1>(w, sink, spin, f, sms));
  }
  // more warps a SM: the ring of 2 stages in 2 or 3 CTAs of 16 warps a SM (the route's kernel runs one)
  for (int spin : {0, 30})
    printf("spin %2d | cp.async S=2: 1 CTA a SM %.1f, 2 %.1f, 3 %.1f | cp.async S=4, 1 CTA %.1f | bulk S=2, 2 CTAs %.1f us\n", spin,
           run<0, 2>(w, sink, spin, 300, sms), run<0, 2>(w, sink, spin, 300, 2 * sms), run<0, 2>(w, sink, spin, 300, 3 * sms),
           run<0, 4>(w, sink, spin, 300, sms), run<1, 2>(w, sink, spin, 300, 2 * sms));
  return 0;
}
