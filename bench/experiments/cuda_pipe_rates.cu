// Issue rates of the instructions the q8 batch kernels are made of, on the
// running GPU: IMAD (the scale of each sub-block's integer sum), FADD, FFMA,
// mma.sync m16n8k32 u8 x s8 and m16n8k16 f16 -> f32 (H200: IMAD 63 lane ops
// a clock per SM, half of FFMA's; either mma 6.8 clocks per SM sub-partition,
// docs/performance.md).
//
//   nvcc -O3 -arch=sm_90 -o /tmp/pipe_rates bench/experiments/cuda_pipe_rates.cu && /tmp/pipe_rates
//
// Each kernel runs 8 independent chains per thread (enough to cover each
// pipe's latency), 16 warps per SM, and prints lane operations per clock per
// SM (the CUDA C Programming Guide's unit: FFMA is 128 on sm_90) and, for the
// mmas, clocks per mma per SM sub-partition, at the clock the attribute
// reports (the boost clock: a lower running clock reads as a lower rate).
#include <cstdio>
#include <cstdint>
#include <cuda_runtime.h>

constexpr int kIters = 4096, kChains = 8, kThreads = 512;

__global__ void imad_kernel(int* out, int seed) {
  int v[kChains];
  for (int c = 0; c < kChains; ++c) v[c] = seed + threadIdx.x + c;
  for (int i = 0; i < kIters; ++i)
#pragma unroll
    for (int c = 0; c < kChains; ++c) asm volatile("mad.lo.s32 %0, %0, %1, %2;" : "+r"(v[c]) : "r"(seed), "r"(c));
  int s = 0;
  for (int c = 0; c < kChains; ++c) s ^= v[c];
  if (s == 12345) out[0] = s;
}
__global__ void fadd_kernel(int* out, int seed) {
  float v[kChains];
  for (int c = 0; c < kChains; ++c) v[c] = (float)(seed + threadIdx.x + c);
  const float k = 1.0f + seed;
  for (int i = 0; i < kIters; ++i)
#pragma unroll
    for (int c = 0; c < kChains; ++c) asm volatile("add.rn.f32 %0, %0, %1;" : "+f"(v[c]) : "f"(k));
  int s = 0;
  for (int c = 0; c < kChains; ++c) s ^= __float_as_int(v[c]);
  if (s == 12345) out[0] = s;
}
__global__ void ffma_kernel(int* out, int seed) {
  float v[kChains];
  for (int c = 0; c < kChains; ++c) v[c] = (float)(seed + threadIdx.x + c);
  const float k = 1.0f + seed;
  for (int i = 0; i < kIters; ++i)
#pragma unroll
    for (int c = 0; c < kChains; ++c) asm volatile("fma.rn.f32 %0, %0, %1, %1;" : "+f"(v[c]) : "f"(k));
  int s = 0;
  for (int c = 0; c < kChains; ++c) s ^= __float_as_int(v[c]);
  if (s == 12345) out[0] = s;
}
__global__ void mma_i8_kernel(int* out, int seed) {
  int d[kChains][4];
  const uint32_t a = seed * 0x01010101u + threadIdx.x, b = seed + 7;
  for (int c = 0; c < kChains; ++c)
    for (int j = 0; j < 4; ++j) d[c][j] = c + j;
  for (int i = 0; i < kIters / 4; ++i)
#pragma unroll
    for (int c = 0; c < kChains; ++c)
      asm volatile(
          "mma.sync.aligned.m16n8k32.row.col.s32.u8.s8.s32 {%0, %1, %2, %3}, {%4, %4, %4, %4}, {%5, %5}, "
          "{%0, %1, %2, %3};"
          : "+r"(d[c][0]), "+r"(d[c][1]), "+r"(d[c][2]), "+r"(d[c][3])
          : "r"(a), "r"(b));
  int s = 0;
  for (int c = 0; c < kChains; ++c) s ^= d[c][0] ^ d[c][1] ^ d[c][2] ^ d[c][3];
  if (s == 12345) out[0] = s;
}
__global__ void mma_f16_kernel(int* out, int seed) {
  float d[kChains][4];
  const uint32_t a = 0x3c003c00u + (seed & 1), b = 0x3c003c00u;
  for (int c = 0; c < kChains; ++c)
    for (int j = 0; j < 4; ++j) d[c][j] = (float)(c + j);
  for (int i = 0; i < kIters / 4; ++i)
#pragma unroll
    for (int c = 0; c < kChains; ++c)
      asm volatile(
          "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %4, %4, %4}, {%5, %5}, "
          "{%0, %1, %2, %3};"
          : "+f"(d[c][0]), "+f"(d[c][1]), "+f"(d[c][2]), "+f"(d[c][3])
          : "r"(a), "r"(b));
  int s = 0;
  for (int c = 0; c < kChains; ++c) s ^= __float_as_int(d[c][0]) ^ __float_as_int(d[c][3]);
  if (s == 12345) out[0] = s;
}

int main() {
  int sms = 0, clock_khz = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  cudaDeviceGetAttribute(&clock_khz, cudaDevAttrClockRate, 0);
  int* out;
  cudaMalloc(&out, 4);
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  struct K {
    const char* name;
    void (*fn)(int*, int);
    double ops_per_iter;  // lane ops per thread per outer iteration
    bool mma;
  } ks[] = {{"IMAD", imad_kernel, kChains, false},
            {"FADD", fadd_kernel, kChains, false},
            {"FFMA", ffma_kernel, kChains, false},
            {"mma m16n8k32 u8s8", mma_i8_kernel, kChains / 4.0, true},
            {"mma m16n8k16 f16", mma_f16_kernel, kChains / 4.0, true}};
  const int blocks = sms;  // one CTA of 16 warps per SM
  printf("%d SMs, %.0f MHz boost attribute; rates at the measured clock below\n", sms, clock_khz / 1e3);
  for (const K& k : ks) {
    k.fn<<<blocks, kThreads>>>(out, 1);
    cudaEventRecord(e0);
    for (int r = 0; r < 5; ++r) k.fn<<<blocks, kThreads>>>(out, 1);
    cudaEventRecord(e1);
    cudaEventSynchronize(e1);
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    const double s = ms / 1e3 / 5;
    const double clocks = s * clock_khz * 1e3;
    const double warp_instr = (double)kThreads / 32 * kIters * k.ops_per_iter;  // per SM
    if (k.mma)
      printf("%-22s %8.3f ms  %6.2f clocks per mma per sub-partition (at %.0f MHz)\n", k.name, s * 1e3,
             clocks / (warp_instr / 4), clock_khz / 1e3);
    else
      printf("%-22s %8.3f ms  %6.1f lane ops per clock per SM (at %.0f MHz)\n", k.name, s * 1e3,
             warp_instr * 32 / clocks, clock_khz / 1e3);
  }
  cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) {
    printf("error: %s\n", cudaGetErrorString(err));
    return 1;
  }
  return 0;
}
