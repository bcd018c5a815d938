// The canonical f32 matvec (Q5_K, the seed head's shape): the 4-rows-per-warp
// kernel (matvec_canon_kernel<DecodeQ5K, 8>, what t = 5..8 ran before) against
// the wide (8 tokens), stream (16), shared-decode (32) and split (16, 32, 64)
// kernels, as launches of their token tiles, on one
// random weight in the device layout. Prints each kernel's time (median
// of CUDA events), its ratio to the FP32-FMA bound 2*V*H*t / 66.9 TFLOP/s, and
// whether its logits equal the old kernel's (run as launches of 8 tokens) bit for
// bit, at t = 8, 12, 16, 17, 24, 32, 41, 64 and 256.
//
//   nvcc -O3 -std=c++17 -arch=sm_90 --fmad=false -Isrc/cpp -Isrc/cuda \
//       bench/experiments/cuda_canon_wide.cu -o /tmp/canon_wide && /tmp/canon_wide [rows cols reps soak_s [name t]]
//   with -DWITH_ROUTE_PLAN and src/cuda/{matvec,pdl,matvec_q5_k,matvec_q4_k,matvec_q6_k,matvec_q8_0,matvec_float}.cu
//   it also runs matvec_canon itself (the route's tile plan) against the 4-row kernel.
//   `/tmp/canon_wide 202048 6656 20 0 small`: the 4-row kernel at t = 1, 2, 4 in other
//   shapes (rows a warp, warps, CTAs a SM) against CanonShape's, GB/s and bits;
//   `/tmp/canon_wide 262144 640 20 0 small_q80` the same for a Q8_0 weight (t = 1, 2, 4, 8),
//   `... small_q6k` for a Q6_K weight (t = 1, 2, 4).
//   `/tmp/canon_wide 202048 6656 5 0 "split|shared" 16,32,64,256`: only the launches whose
//   names hold a '|'-separated part, at those t.
//   With -DWITH_CANON_WS and -gencode arch=compute_90a,code=sm_90a (for -arch=sm_90) it also
//   runs the producer/consumer experiment of cuda_canon_ws.cuh ("ws 32 x 32", "ws 64 x 16")
//   and the ring experiment of cuda_canon_ring.cuh ("ring 32 x 32", "ring 64 x 16", and
//   "ring tma ..." with x by one 2-D tensor copy a unit).
#include <algorithm>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "cuda_canon_split.cuh"
#ifdef WITH_CANON_WS  // the producer/consumer experiment: sm_90a alone
#include <cudaTypedefs.h>

#include "cuda_canon_ring.cuh"
#include "cuda_canon_ws.cuh"
#endif
#ifdef WITH_ROUTE_PLAN
#include "cuda_device.h"
#include "kernels.h"
#endif

using namespace muser;
using namespace muser::cuda;

#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e_ = (x);                                                            \
    if (e_ != cudaSuccess) {                                                         \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                  \
    }                                                                                \
  } while (0)

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint32_t next_u32() {
  rng_state ^= rng_state << 13, rng_state ^= rng_state >> 7, rng_state ^= rng_state << 17;
  return (uint32_t)(rng_state >> 16);
}

struct Launch {
  const char* name;
  void (*run)(const MatvecArgs&);
  int tile;
};

static int sms() {
  int dev = 0, n = 0;
  CK(cudaGetDevice(&dev));
  CK(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  return n;
}

template <class K>
static void launch_grid(K kernel, int threads, size_t smem, int64_t rows_per_cta, const MatvecArgs& a, int extra,
                        bool has_extra) {
  CK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                          (int)smem));
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem));
  if (per_sm < 1) { std::fprintf(stderr, "no CTA fits (%zu bytes)\n", smem); std::exit(1); }
  const int64_t groups = (a.rows + rows_per_cta - 1) / rows_per_cta;
  const int grid = (int)std::min<int64_t>(groups, (int64_t)per_sm * sms());
  if (has_extra) reinterpret_cast<void (*)(MatvecArgs, int)>(kernel)<<<grid, threads, smem>>>(a, extra);
  else reinterpret_cast<void (*)(MatvecArgs)>(kernel)<<<grid, threads, smem>>>(a);
  CK(cudaGetLastError());
}

static void run_old(const MatvecArgs& a) {  // matvec_canon_kernel<DecodeQ5K, 8>, as plan_matvec sizes it
  using Cta = MatvecCta<8>;
  constexpr int R = RowsPerWarp<8>::value;
  const int chunk = (int)((a.cols + 255) / 256 * 256);
  const size_t smem = (size_t)a.t * 32 * (chunk / 32 + kLanePad) * 4 + (size_t)Cta::warps * 2 * 32 * ((R + 1) / 2) * 4;
  launch_grid(&matvec_canon_kernel<DecodeQ5K, 8>, 32 * Cta::warps, smem, (int64_t)Cta::warps * R, a, chunk, true);
}

// matvec_canon_kernel<Dec, TT> in another shape (rows a warp, warps, CTAs a SM), for t <= 4
template <int TT, int R, int W, int C, class Dec = DecodeQ5K, bool kCross = CanonShape<Dec, TT>::cross_group>
static void run_small(const MatvecArgs& a) {
  const int chunk = (int)((a.cols + Dec::kUnit - 1) / Dec::kUnit * Dec::kUnit);
  const size_t smem = (size_t)a.t * 32 * (chunk / 32 + kLanePad) * 4 + (size_t)W * 2 * 32 * ((R + 1) / 2) * 4;
  launch_grid(&matvec_canon_kernel<Dec, TT, R, W, C, kCross>, 32 * W, smem, (int64_t)W * R, a, chunk, true);
}
// run_small in the tree's shape for Dec at TT (CanonShape), the reference of the small
// modes; kCross: the next row group's first unit loaded during a group's last, or not
template <int TT, class Dec = DecodeQ5K, bool kCross = CanonShape<Dec, TT>::cross_group>
static void run_tree(const MatvecArgs& a) {
  using Shape = CanonShape<Dec, TT>;
  run_small<TT, Shape::rows, Shape::warps, Shape::min_ctas, Dec, kCross>(a);
}

template <int kWarps>
static void run_wide(const MatvecArgs& a) {
  launch_grid(&matvec_canon_wide_kernel<true, kWarps>, 32 * kWarps, wide_smem_floats(a.cols, kWarps) * 4,
              (int64_t)kWarps * kWideRows, a, 0, false);
}

template <int TG>
static void run_shared(const MatvecArgs& a) {
  launch_grid(&matvec_canon_shared_kernel<true, TG>, 32 * kSharedWarps, SharedTile<TG>::smem_bytes,
              SharedTile<TG>::rows, a, 0, false);
}

template <int TC>
static void run_split(const MatvecArgs& a) {
  launch_grid(&matvec_canon_split_kernel<true, TC>, 32 * kSplitWarps, SplitTile<TC>::smem_bytes,
              SplitTile<TC>::rows, a, 0, false);
}

#ifdef WITH_CANON_WS
template <int RG, int TG>
static void run_ws(const MatvecArgs& a) {
  launch_grid(&matvec_canon_ws_kernel<true, RG, TG>, 32 * kWsWarps, WsTile<true, RG, TG>::smem_bytes,
              WsTile<true, RG, TG>::rows, a, 0, false);
}
// x as a 2-D tensor map ([t][cols] floats, boxes of 256 columns x tokens tokens), for the
// ring kernel's kTmaX; the driver's encoder through the runtime (no -lcuda)
static CUtensorMap x_tensor_map(const MatvecArgs& a, int tokens) {
  static PFN_cuTensorMapEncodeTiled_v12000 encode = nullptr;
  if (!encode) {
    cudaDriverEntryPointQueryResult q;
    CK(cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", reinterpret_cast<void**>(&encode), 12000,
                                        cudaEnableDefault, &q));
    if (q != cudaDriverEntryPointSuccess) { std::fprintf(stderr, "no cuTensorMapEncodeTiled\n"); std::exit(1); }
  }
  CUtensorMap m;
  const cuuint64_t dims[2] = {(cuuint64_t)a.cols, (cuuint64_t)a.t}, strides[1] = {(cuuint64_t)a.ldx * 4};
  const cuuint32_t box[2] = {256, (cuuint32_t)tokens}, element_strides[2] = {1, 1};
  if (encode(&m, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 2, const_cast<float*>(a.x), dims, strides, box, element_strides,
             CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
             CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS) {
    std::fprintf(stderr, "cuTensorMapEncodeTiled failed\n");
    std::exit(1);
  }
  return m;
}
template <int RG, int TG, bool kTmaX>
static void run_ring(const MatvecArgs& a) {
  using Tile = RingTile<true, RG, TG>;
  auto kernel = &matvec_canon_ring_kernel<true, RG, TG, kTmaX>;
  CK(cudaFuncSetAttribute(reinterpret_cast<const void*>(kernel), cudaFuncAttributeMaxDynamicSharedMemorySize,
                          (int)Tile::smem_bytes));
  const int64_t groups = (a.rows + Tile::rows - 1) / Tile::rows;
  const int grid = (int)std::min<int64_t>(groups, sms());
  CUtensorMap m{};
  if (kTmaX) m = x_tensor_map(a, Tile::tokens);
  kernel<<<grid, 32 * kRingWarps, Tile::smem_bytes>>>(a, m);
  CK(cudaGetLastError());
}
#endif

static void run_stream(const MatvecArgs& a) {
  launch_grid(&matvec_canon_stream_kernel<true>, 32 * kStreamWarps, stream_smem_bytes(),
              (int64_t)kStreamWarps * kWideRows, a, 0, false);
}

#ifdef WITH_ROUTE_PLAN  // linked with matvec.cu, pdl.cu and the per-type files: the route's own tile plan
namespace muser::cuda {
[[noreturn]] void throw_cuda_error(cudaError_t e, const std::string& what) {  // cuda_device.cpp's, without the rest
  std::fprintf(stderr, "%s: %s\n", what.c_str(), cudaGetErrorString(e));
  std::exit(1);
}
DeviceMemory::DeviceMemory(size_t, int, const char*) { std::abort(); }  // upload_weight's, never called here
DeviceMemory::~DeviceMemory() {}
}  // namespace muser::cuda
static void run_plan(const MatvecArgs& a) { matvec_canon(a, 0); }
#endif

// t tokens as matvec_canon runs them: launches of up to `tile`
static void run_tiles(void (*run)(const MatvecArgs&), MatvecArgs a, int t, int tile = 8) {
  for (int k0 = 0; k0 < t; k0 += tile) {
    MatvecArgs tile_a = a;
    tile_a.t = std::min(tile, t - k0);
    tile_a.x = a.x + k0 * a.ldx;
    tile_a.y = a.y + k0 * a.ldy;
    run(tile_a);
  }
}

// Whether name holds one of the '|'-separated parts of filter.
static bool name_matches(const char* name, const char* filter) {
  for (const char* p = filter;;) {
    const char* end = std::strchr(p, '|');
    const std::string part = end ? std::string(p, end) : std::string(p);
    if (!part.empty() && std::strstr(name, part.c_str())) return true;
    if (!end) return false;
    p = end + 1;
  }
}

// How many of the first n floats differ from want's in their bytes.
static size_t differing(const std::vector<float>& got, const std::vector<float>& want, size_t n) {
  size_t diff = 0, first = n;
  for (size_t i = 0; i < n; ++i)
    if (std::memcmp(&got[i], &want[i], 4) != 0 && diff++ == 0) first = i;
  if (diff)  // the first one, as a flat index into [t][rows], for a reader chasing a wrong map
    std::printf("  first differing y[%zu]: got %.9g, want %.9g\n", first, got[first], want[first]);
  return diff;
}

// The median of n runs of run() between two CUDA events, in microseconds.
template <class F>
static double median_us(int n, cudaEvent_t e0, cudaEvent_t e1, F run) {
  std::vector<float> ms;
  for (int i = 0; i < n; ++i) {
    CK(cudaEventRecord(e0));
    run();
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    float m = 0;
    CK(cudaEventElapsedTime(&m, e0, e1));
    ms.push_back(m);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2] * 1e3;
}

int main(int argc, char** argv) {
  const int64_t rows = argc > 1 ? std::atoll(argv[1]) : 202048, cols = argc > 2 ? std::atoll(argv[2]) : 6656;
  const int reps = argc > 3 ? std::atoi(argv[3]) : 10;
  // argv[5] = small_q80 / small_q6k: a Q8_0 (the Gemma-3 head: 262144 640) or Q6_K weight, for the small mode
  const bool q80 = argc > 5 && !std::strcmp(argv[5], "small_q80"), q6k = argc > 5 && !std::strcmp(argv[5], "small_q6k");
  const char* type_name = q80 ? "Q8_0" : q6k ? "Q6_K" : "Q5_K";
  const int64_t B = q80 ? sizeof(BlockQ8_0) : q6k ? sizeof(BlockQ6_K) : sizeof(BlockQ5_K),
                row_bytes = cols / (q80 ? 32 : 256) * B,
                tiles = (rows + 15) / 16;
  const size_t wbytes = (size_t)(tiles * 16 * row_bytes) + kWeightPadBytes;
  std::vector<uint8_t> w(wbytes);
  for (auto& b : w) b = (uint8_t)next_u32();
  for (size_t off = 0; off + B <= (size_t)(tiles * 16 * row_bytes); off += B) {  // sane f16 d, dmin: 2^-8 .. 2^-7
    const uint16_t d = (uint16_t)(0x1c00 | (next_u32() & 0x3ff)), dmin = (uint16_t)(0x1c00 | (next_u32() & 0x3ff));
    std::memcpy(&w[off + (q6k ? offsetof(BlockQ6_K, d) : 0)], &d, 2);  // Q6_K's d ends its block
    if (!q80 && !q6k) std::memcpy(&w[off + 2], &dmin, 2);
  }
  const int tmax = 256;
  std::vector<float> x((size_t)tmax * cols);
  for (auto& v : x) v = ((int)(next_u32() % 2001) - 1000) * 1.5e-3f;
  uint8_t* dw;
  float *dx, *dy_old, *dy_new;
  CK(cudaMalloc(&dw, wbytes));
  CK(cudaMalloc(&dx, x.size() * 4));
  CK(cudaMalloc(&dy_old, (size_t)tmax * rows * 4));
  CK(cudaMalloc(&dy_new, (size_t)tmax * rows * 4));
  CK(cudaMemcpy(dw, w.data(), wbytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice));

  MatvecArgs a;
  a.rows = rows, a.cols = cols, a.row_bytes = row_bytes, a.ldx = cols, a.ldy = rows;
  a.type = (uint32_t)(q80 ? GgmlType::Q8_0 : q6k ? GgmlType::Q6_K : GgmlType::Q5_K), a.w = dw, a.x = dx;
  const Launch launches[] = {{"old R=4 16 warps", run_old, 8},
                             {"wide R=8 12 warps", run_wide<12>, 8},
                             {"stream 16 tokens", run_stream, 16},
                             {"shared 32 x 32", run_shared<4>, 32},
                             {"split 128 x 16", run_split<16>, 16},
                             {"split 64 x 32", run_split<32>, 32},
                             {"split 32 x 64", run_split<64>, 64},
#ifdef WITH_CANON_WS
                             {"ws 32 x 32", run_ws<2, 4>, 32},
                             {"ws 64 x 16", run_ws<4, 2>, 16},
                             {"ring 32 x 32", run_ring<2, 4, false>, 32},
                             {"ring 64 x 16", run_ring<4, 2, false>, 16},
                             {"ring tma 32 x 32", run_ring<2, 4, true>, 32},
                             {"ring tma 64 x 16", run_ring<4, 2, true>, 16},
#endif
#ifdef WITH_ROUTE_PLAN
                             {"matvec_canon plan", run_plan, 1 << 20},
#endif
  };
  std::printf("%s %lld x %lld, %d reps; FMA bound = 2*V*H*t / 66.9e12\n", type_name, (long long)rows, (long long)cols, reps);
  std::vector<float> got((size_t)tmax * rows), want((size_t)tmax * rows);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  // optional: argv[5] keeps only the launches whose name holds one of its '|'-separated
  // parts, at the t of argv[6] (a comma-separated list; for a profiler);
  // argv[5] = small: the 4-row kernel's shapes at t = 1, 2, 4 instead
  const char* only = argc > 5 ? argv[5] : nullptr;
  std::vector<int> ts = {8, 12, 16, 17, 24, 32, 41, 64, 256};
  if (argc > 6) {  // a comma-separated list
    ts.clear();
    for (const char* p = argv[6]; *p;) {
      ts.push_back(std::atoi(p));
      while (*p && *p != ',') ++p;
      if (*p == ',') ++p;
    }
  }
  if (only && (!std::strcmp(only, "small") || q80 || q6k)) {  // the 4-row kernel's shapes at t = 1, 2, 4 against the tree's (CanonShape)
    struct Small {
      int t;
      const char* name;
      void (*run)(const MatvecArgs&);
    };
    using Q80x4 = DecodeQ80Units<4>;  // 4 blocks a unit (the tree's 8: twice the bytes in flight)
    const Small smalls_q80[] = {
        {1, "(tree)", run_tree<1, DecodeQ80>},
        {1, "4-block units", run_small<1, 4, 16, 1, Q80x4>},
        {1, "cross-group", run_tree<1, DecodeQ80, true>},
        {1, "4-block cross", run_small<1, 4, 16, 1, Q80x4, true>},
        {1, "R2 W8 C3", run_small<1, 2, 8, 3, DecodeQ80>},  // the tile's own shape (before Q8_0 took the t = 8 one)
        {1, "R4 W8 C2", run_small<1, 4, 8, 2, DecodeQ80>},
        {1, "R2 W16 C2", run_small<1, 2, 16, 2, DecodeQ80>},
        {1, "R1 W16 C2", run_small<1, 1, 16, 2, DecodeQ80>},
        {2, "(tree)", run_tree<2, DecodeQ80>},
        {2, "4-block units", run_small<2, 4, 16, 1, Q80x4>},
        {2, "cross-group", run_tree<2, DecodeQ80, true>},
        {2, "4-block cross", run_small<2, 4, 16, 1, Q80x4, true>},
        {4, "(tree)", run_tree<4, DecodeQ80>},
        {4, "4-block units", run_small<4, 4, 16, 1, Q80x4>},
        {4, "cross-group", run_tree<4, DecodeQ80, true>},
        {4, "4-block cross", run_small<4, 4, 16, 1, Q80x4, true>},
        {8, "(tree)", run_tree<8, DecodeQ80>},
        {8, "4-block units", run_small<8, 4, 16, 1, Q80x4>},
        {8, "cross-group", run_tree<8, DecodeQ80, true>},
        {8, "4-block cross", run_small<8, 4, 16, 1, Q80x4, true>},
        {8, "R2 W16 C1", run_small<8, 2, 16, 1, DecodeQ80>},
    };
    const Small smalls_q5k[] = {
        {1, "(tree)", run_tree<1>},
        {1, "R2 W8 C3", run_small<1, 2, 8, 3>},  // the shape before CanonShape
        {1, "R4 W24 C1", run_small<1, 4, 24, 1>},
        {1, "cross-group", run_tree<1, DecodeQ5K, true>},
        {2, "(tree)", run_tree<2>},
        {2, "R2 W8 C3", run_small<2, 2, 8, 3>},  // before
        {4, "(tree)", run_tree<4>},
        {4, "R4 W8 C2", run_small<4, 4, 8, 2>},  // before
    };
    const double weight_bytes = (double)rows * row_bytes;
    using Q6 = DecodeQ6K;
    const Small smalls_q6k[] = {
        {1, "(tree)", run_tree<1, Q6>},
        {1, "cross-group", run_tree<1, Q6, true>},
        {1, "R2 W8 C3", run_small<1, 2, 8, 3, Q6>},  // the tile's own shape (before Q6_K took the t = 8 one)
        {1, "R4 W16 C1", run_small<1, 4, 16, 1, Q6>},  // the t = 8 tile's
        {1, "R4 W8 C2", run_small<1, 4, 8, 2, Q6>},
        {2, "(tree)", run_tree<2, Q6>},
        {2, "R2 W8 C3", run_small<2, 2, 8, 3, Q6>},
        {2, "R4 W16 C1", run_small<2, 4, 16, 1, Q6>},
        {4, "(tree)", run_tree<4, Q6>},
        {4, "cross-group", run_tree<4, Q6, true>},
        {4, "R4 W8 C2", run_small<4, 4, 8, 2, Q6>},
        {4, "R4 W16 C1", run_small<4, 4, 16, 1, Q6>},
    };
    const Small* smalls = q80 ? smalls_q80 : q6k ? smalls_q6k : smalls_q5k;
    const size_t n_smalls = q80 ? std::size(smalls_q80) : q6k ? std::size(smalls_q6k) : std::size(smalls_q5k);
    for (size_t si = 0; si < n_smalls; ++si) {
      const Small& S = smalls[si];
      a.t = S.t;
      const bool ref = std::strstr(S.name, "(tree)") != nullptr;
      a.y = ref ? dy_old : dy_new;
      CK(cudaMemset(a.y, 0xff, (size_t)S.t * rows * 4));
      S.run(a);
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(ref ? want.data() : got.data(), a.y, (size_t)S.t * rows * 4, cudaMemcpyDeviceToHost));
      const size_t diff = ref ? 0 : differing(got, want, (size_t)S.t * rows);
      const double us = median_us(reps, e0, e1, [&] { S.run(a); });
      std::printf("t=%d %-16s %8.1f us  %6.0f GB/s  bits differing from the tree's shape: %zu\n", S.t, S.name, us,
                  weight_bytes / us * 1e-3, diff);
    }
    return 0;
  }
  for (int t : ts) {
    a.y = dy_old;
    run_tiles(run_old, a, t);
    CK(cudaMemcpy(want.data(), dy_old, (size_t)t * rows * 4, cudaMemcpyDeviceToHost));
    const double bound = 2.0 * rows * cols * t / 66.9e12;
    for (const Launch& L : launches) {
      if (only && !name_matches(L.name, only)) continue;
      CK(cudaMemset(dy_new, 0xff, (size_t)t * rows * 4));
      a.y = dy_new;
      run_tiles(L.run, a, t, L.tile);
      CK(cudaDeviceSynchronize());
      CK(cudaMemcpy(got.data(), dy_new, (size_t)t * rows * 4, cudaMemcpyDeviceToHost));
      const size_t diff = differing(got, want, (size_t)t * rows);
      const int n = t >= 64 ? std::max(3, reps / 3) : reps;
      const double us = median_us(n, e0, e1, [&] { run_tiles(L.run, a, t, L.tile); });
      std::printf("t=%3d %-18s %10.1f us  %5.2f x FMA bound (%8.1f us)  bits differing from old: %zu\n", t, L.name,
                  us, us * 1e-6 / bound, bound * 1e6, diff);
    }
  }
  // optional soak: the wide kernel at t = 64 for argv[4] seconds, for an nvidia-smi sampler beside it
  const double soak_s = argc > 4 ? std::atof(argv[4]) : 0.0;
  if (soak_s > 0) {
    a.y = dy_new;
    float total_ms = 0;
    int n = 0;
    CK(cudaEventRecord(e0));
    while (total_ms < soak_s * 1e3) {
      run_tiles(run_wide<12>, a, 64);
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      CK(cudaEventElapsedTime(&total_ms, e0, e1));
      ++n;
    }
    std::printf("soak: %d x t=64 (wide, 12 warps) in %.0f ms: %.1f us per 8 tokens\n", n, total_ms,
                total_ms * 1e3 / (8.0 * n));
  }
  return 0;
}
