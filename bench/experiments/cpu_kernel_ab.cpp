// The AVX-512 q8 matvec (or, built with MUSER_AB_CANON, the canonical f32
// one) of two source revisions, alternating in one process on seed-shaped
// weights (cpu_kernel_ab.sh builds it): median and min ms
// of each at every t, two threads by default. The weight is random bytes with
// finite f16 scales (for Q5_K), so the numbers say nothing of the results,
// only of time; the checksums show both sides computed the same.
//
//   cpu_kernel_ab REPS TYPE THREADS H V TOKENS   (e.g. 9 Q5_K 2 6656 202048 1,8)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "muser/quant_blocks.h"
#include "quant_types.h"
#include "quantize.h"

namespace muser::cpu {
#if defined(MUSER_AB_CANON)
using KernelActs = const float*;
#define MUSER_AB_KERNEL(name) \
  void name(const WeightView&, const float*, int64_t, int, int64_t, int64_t, float*, int64_t);
#else
using KernelActs = const ActsQ8&;
#define MUSER_AB_KERNEL(name) void name(const WeightView&, const ActsQ8&, int64_t, int64_t, float*, int64_t);
#endif
MUSER_AB_KERNEL(matvec_ab_a)
MUSER_AB_KERNEL(matvec_ab_b)
}  // namespace muser::cpu

using namespace muser;
using namespace muser::cpu;

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s REPS TYPE THREADS H V TOKENS\n", argv[0]);
    return 2;
  }
  const int reps = std::atoi(argv[1]), threads = std::atoi(argv[3]);
  const std::string ty = argv[2];
  const int64_t H = std::atoll(argv[4]), V = std::atoll(argv[5]);
  const std::optional<GgmlType> type = ggml_type_from_name(ty);
  if (!type || std::find(std::begin(kQ8Types), std::end(kQ8Types), *type) == std::end(kQ8Types)) {
    std::fprintf(stderr, "TYPE must be a q8 weight type (Q4_K, Q5_K, Q6_K, Q8_0), got %s\n", ty.c_str());
    return 2;
  }
  const GgmlType gt = *type;
  const int64_t rb = quantized_row_bytes(gt, H);
  std::vector<uint8_t> W((size_t)(V * rb));
  std::mt19937_64 g(1);
  for (size_t i = 0; i + 8 <= W.size(); i += 8) {
    const uint64_t v = g();
    std::memcpy(&W[i], &v, 8);
  }
  if (gt == GgmlType::Q5_K)
    for (int64_t r = 0; r < V; ++r)
      for (int64_t b = 0; b < H / 256; ++b) {
        auto* q = reinterpret_cast<BlockQ5_K*>(&W[(size_t)(r * rb + b * (int64_t)sizeof(BlockQ5_K))]);
        q->d = 0x2000, q->dmin = 0x1c00;
      }
  const WeightView w{(uint32_t)gt, V, H, rb, W.data()};
  using Fn = decltype(&matvec_ab_a);
  const Fn fns[2] = {matvec_ab_a, matvec_ab_b};
  std::printf("%s %lld x %lld, %d threads, %d reps, alternating A (first revision) and B\n", ty.c_str(), (long long)V,
              (long long)H, threads, reps);
  std::stringstream tokens(argv[6]);
  for (std::string tok; std::getline(tokens, tok, ',');) {
    const int t = std::atoi(tok.c_str());
    std::vector<float> x((size_t)(t * H));
    for (auto& v : x) v = (float)((int)(g() % 2001) - 1000) / 300.0f;
    ActsQ8 a;
    quantize_acts_q8(w.type, x.data(), H, H, t, &a);  // read by the q8 kernel only
    const int64_t grain = std::max<int64_t>(64, std::min<int64_t>(2048, V / (8 * threads)) / 64 * 64);  // as cpu_device
    std::vector<double> ms[2];
    double sums[2] = {0, 0};
    for (int rep = 0; rep < reps; ++rep)
      for (int v = 0; v < 2; ++v) {
        std::vector<float> y((size_t)(t * V));
        const auto t0 = std::chrono::steady_clock::now();
        parallel_for(V, grain, threads, [&](int64_t r0, int64_t r1) {
#if defined(MUSER_AB_CANON)
          fns[v](w, x.data(), H, t, r0, r1, y.data(), V);
#else
          fns[v](w, a, r0, r1, y.data(), V);
#endif
        });
        ms[v].push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
        if (rep == 0)
          for (float f : y) sums[v] += f;
      }
    for (int v = 0; v < 2; ++v) {
      std::sort(ms[v].begin(), ms[v].end());
      std::printf("t=%-3d %c  median %7.1f ms  min %7.1f  checksum %.6g\n", t, "AB"[v], ms[v][ms[v].size() / 2],
                  ms[v][0], sums[v]);
    }
    std::printf("t=%-3d B / A (medians) %.3f\n", t, ms[1][ms[1].size() / 2] / ms[0][ms[0].size() / 2]);
  }
}
