// Seeded sampling on the CPU (docs/numerics.md, "Sampling"): each row runs
// muser/sample.h's sample_row with its own scratch. A batch of at least as
// many rows as threads runs rows in parallel; fewer rows split each row's
// tiles (the canonical pairs) and its race over the threads. Either way the
// bits are those of the serial row: rows are independent, the tile tree is
// fixed and race_beats is a total order.
#include "cpu/sample.h"

#include <algorithm>
#include <memory>
#include <vector>

#include "cpu/kernels.h"
#include "cpu/parallel.h"

namespace muser::cpu {
namespace {

constexpr int64_t kRaceChunk = 16384;  // ids per parallel piece of one race
constexpr int kRadixMin = 2048;        // below this many ids std::sort is as quick

// order[0, n) (ids in increasing order) sorted into the kept-set order: a
// stable LSD radix sort (3 passes of 11 bits) on a key that rises as z falls,
// so equal z keep their increasing ids (sample_before's ties). -0 is keyed
// as +0: the order holds them equal. z is finite here.
void radix_sort_descending(int32_t* order, int n, const float* z) {
  thread_local std::vector<uint32_t> keys, keys2;
  thread_local std::vector<int32_t> ids2;
  if ((int)keys.size() < n) {
    keys.resize((size_t)n);
    keys2.resize((size_t)n);
    ids2.resize((size_t)n);
  }
  for (int j = 0; j < n; ++j) {
    const float v = z[order[j]];
    const uint32_t u = v == 0.0f ? 0u : f32_to_bits(v);
    const uint32_t rising = (u >> 31) ? ~u : (u | 0x80000000u);  // rises with z
    keys[(size_t)j] = ~rising;
  }
  uint32_t* ka = keys.data();
  uint32_t* kb = keys2.data();
  int32_t* ia = order;
  int32_t* ib = ids2.data();
  for (int shift = 0; shift < 32; shift += 11) {
    int count[2049] = {};
    for (int j = 0; j < n; ++j) ++count[((ka[j] >> shift) & 2047u) + 1];
    if (count[((ka[0] >> shift) & 2047u) + 1] == n) continue;  // one digit for all: nothing moves
    for (int d = 0; d < 2048; ++d) count[d + 1] += count[d];
    for (int j = 0; j < n; ++j) {
      const int at = count[(ka[j] >> shift) & 2047u]++;
      kb[at] = ka[j];
      ib[at] = ia[j];
    }
    std::swap(ka, kb);
    std::swap(ia, ib);
  }
  if (ia != order) std::copy(ia, ia + n, order);
}

// sample_row's Steps on the CPU: the kept-set order by nth_element and sort;
// pairs on the SIMD tile twins and the race, both over `threads` (the race
// at 1 thread: SampleSerialSteps' serial form).
struct CpuSteps {
  int threads;

  void prefix(int32_t* order, int count, int k, const float* z) const {
    const auto before = [z](int32_t a, int32_t b) { return sample_before(z[a], a, z[b], b); };
    if (k < count) std::nth_element(order, order + k, order + count, before);  // O(count), then the prefix
    if (k >= kRadixMin && std::is_sorted(order, order + k)) {
      radix_sort_descending(order, k, z);  // the bucketed candidates come in id order
      return;
    }
    std::sort(order, order + k, before);
  }
  // sample_top_p_mass's and sample_top_p_count's integers: each chunk's weights
  // e^(z - m) on the active ISA's canon_exp_nonpos twin, in fixed point
  uint64_t top_p_mass(const float* z, int n, float m) const {
    uint64_t S = 0;
    constexpr int kChunk = 1024;
    float d[kChunk], w[kChunk];
    for (int j0 = 0; j0 < n; j0 += kChunk) {
      const int len = std::min(kChunk, n - j0);
      int live = 0;
      for (int j = 0; j < len; ++j) {  // the finite z, packed (a -inf z weighs nothing)
        d[live] = z[j0 + j] - m;
        live += (int)(z[j0 + j] != lse_neg_inf());
      }
      exp_nonpos_cpu(d, w, live);
      for (int j = 0; j < live; ++j) S += sample_top_p_fixed(w[j]);
    }
    return S;
  }
  int top_p_count(const float* z, const int32_t* order, int n, float m, uint64_t target) const {
    uint64_t c = 0;
    constexpr int kChunk = 1024;
    float d[kChunk], w[kChunk];
    for (int j0 = 0; j0 < n; j0 += kChunk) {
      const int len = std::min(kChunk, n - j0);
      for (int j = 0; j < len; ++j) d[j] = z[order[j0 + j]] - m;
      exp_nonpos_cpu(d, w, len);
      for (int j = 0; j < len; ++j) {
        c += sample_top_p_fixed(w[j]);
        if (c >= target) return j0 + j + 1;
      }
    }
    return 0;
  }
  // sample_row_pair's tiles on the active ISA's twin (bit-equal to lse_tile)
  LsePair pair(const float* z, int n, LsePair* tiles) const {
    const int count = (int)lse_tile_count(n);
    parallel_for(count, 8, threads, [&](int64_t a, int64_t b) {
      for (int64_t k = a; k < b; ++k) {
        const int i0 = (int)k * kLseTile;
        tiles[k] = lse_tile_cpu(z + i0, n - i0 < kLseTile ? n - i0 : kLseTile);
      }
    });
    return lse_tree(tiles, count);
  }
  int32_t race(const float* z, int n, float m, uint64_t seed, uint64_t position, int32_t top) const {
    if (threads <= 1) return SampleSerialSteps{}.race(z, n, m, seed, position, top);
    const RaceEntry first{sample_race_key(z[top], m, seed, position, top), top};
    const int64_t chunks = (n + kRaceChunk - 1) / kRaceChunk;
    std::vector<RaceEntry> best((size_t)chunks, first);
    parallel_for(chunks, 1, threads, [&](int64_t a, int64_t b) {
      for (int64_t c = a; c < b; ++c) {
        const int i0 = (int)(c * kRaceChunk), i1 = (int)std::min<int64_t>(n, (c + 1) * kRaceChunk);
        best[(size_t)c] = sample_race_range(z, i0, i1, m, seed, position, first);
      }
    });
    RaceEntry winner = first;
    for (const RaceEntry& e : best)
      if (race_beats(e, winner)) winner = e;
    return winner.token;
  }
};

// Per-row scratch: z, the raw mask row, the order, the tile pairs. Every
// array is written before it is read, so none is initialized; each thread
// keeps its own between calls (Scratch::of), so a call neither maps nor
// faults in fresh pages for its ~12 bytes per token of the vocabulary.
struct Scratch {
  std::unique_ptr<float[]> z, raw;
  std::unique_ptr<int32_t[]> order;
  std::unique_ptr<LsePair[]> tiles;
  int64_t size = 0;

  // This thread's scratch, grown to hold rows of V
  static Scratch& of(int64_t V) {
    thread_local Scratch s;
    if (s.size < V) {
      s.z.reset(new float[(size_t)V]);
      s.raw.reset(new float[(size_t)V]);
      s.order.reset(new int32_t[(size_t)V]);
      s.tiles.reset(new LsePair[(size_t)lse_tile_count(V) + 1]);
      s.size = V;
    }
    return s;
  }
};

SampleResult run_row(const float* x, int64_t V, float lse, const float* bias, const uint8_t* allowed,
                     SampleParams params, uint64_t position, Scratch& s, CpuSteps& ops) {
  return sample_row(x, bias, allowed, (int)V, lse, params, position, s.z.get(), s.raw.get(), s.order.get(),
                    s.tiles.get(), ops);
}

}  // namespace

void sample_rows(const float* logits, int t, int64_t V, const float* lse, const float* bias, const uint8_t* allowed,
                 SampleParams params, const uint64_t* positions, int threads, SampleResult* out) {
  if (t >= threads || threads <= 1) {
    parallel_for(t, 1, threads, [&](int64_t a, int64_t b) {
      Scratch& s = Scratch::of(V);
      CpuSteps ops{1};
      for (int64_t r = a; r < b; ++r)
        out[r] = run_row(logits + r * V, V, lse[r], bias, allowed, params, positions[r], s, ops);
    });
    return;
  }
  Scratch& s = Scratch::of(V);
  CpuSteps ops{threads};
  for (int r = 0; r < t; ++r)
    out[r] = run_row(logits + (int64_t)r * V, V, lse[r], bias, allowed, params, positions[r], s, ops);
}

SampleResult sample_positions(const float* logits, int64_t V, float lse, const float* bias, const uint8_t* allowed,
                              SampleParams params, const uint64_t* positions, int64_t n, int threads,
                              int64_t* tokens) {
  Scratch& s = Scratch::of(V);
  CpuSteps ops{1};
  const SampleResult first = run_row(logits, V, lse, bias, allowed, params, positions[0], s, ops);
  if (first.status != kSampleOk) return first;
  if (!(params.temperature > 0.0f)) {
    std::fill(tokens, tokens + n, (int64_t)first.token);
    return first;
  }
  // z now holds the kept set (-inf elsewhere); race it again at every position
  int32_t top = 0;
  for (int32_t i = 1; i < (int32_t)V; ++i) top = s.z[i] > s.z[top] ? i : top;
  const float m = s.z[top];
  parallel_for(n, 1024, threads, [&](int64_t a, int64_t b) {
    for (int64_t j = a; j < b; ++j) tokens[j] = sample_race(s.z.get(), (int)V, m, params.seed, positions[j], top);
  });
  return first;
}

}  // namespace muser::cpu
