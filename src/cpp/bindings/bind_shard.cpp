// The exact pieces of the cross-shard reductions (python/muser/shard.py;
// docs/numerics.md, "Sharded heads"): the shard row formula, the canonical
// logsumexp's tile pairs and tree (muser/logsumexp.h), and the per-shard
// steps of sampling (muser/sample.h) with token ids offset by the shard's
// first row, so a shard's uniforms, clocks and race keys are the unsharded
// row's. Each entry point takes exactly typed host arrays (shard.py makes them).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>

#include <optional>
#include <vector>

#include "bindings.h"
#include "errors.h"
#include "head.h"
#include "muser/logsumexp.h"
#include "muser/sample.h"

namespace nb = nanobind;

namespace muser::py {
namespace {

using Rows = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using Row = nb::ndarray<const float, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Pairs = nb::ndarray<const float, nb::ndim<3>, nb::c_contig, nb::device::cpu>;
using Mask = nb::ndarray<const bool, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using U64s = nb::ndarray<const uint64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using I64s = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// A new numpy array of the given shape owning `v`.
template <class T>
nb::ndarray<nb::numpy, T> owned(std::vector<T>&& v, std::initializer_list<size_t> shape) {
  auto* heap = new std::vector<T>(std::move(v));
  nb::capsule owner(heap, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(heap->data(), shape.size(), shape.begin(), owner);
}

// A shard's row seen through global token ids: z[i] is the logit of token i.
struct GlobalRow {
  const float* local;
  int64_t start;
  float operator[](int64_t i) const { return local[i - start]; }
};

}  // namespace

void bind_shard(nb::module_& m) {
  m.def("shard_rows", [](int64_t vocab, int64_t rank, int64_t world) {
    const RowRange r = shard_row_range(vocab, rank, world);
    return std::make_pair(r.start, r.stop);
  }, nb::arg("vocab"), nb::arg("rank"), nb::arg("world"));

  // The canonical pairs (m, s) of consecutive tiles of kLseTile columns of
  // values[:, col0 : col0 + ncols] (the last tile may be shorter): [t, tiles, 2].
  m.def("lse_tile_pairs", [](Rows values, int64_t col0, int64_t ncols) {
    const int64_t t = (int64_t)values.shape(0), n = (int64_t)values.shape(1);
    if (col0 < 0 || ncols < 0 || col0 + ncols > n)
      throw ArgValueError("columns [" + std::to_string(col0) + ", " + std::to_string(col0 + ncols) +
                          ") are outside the " + std::to_string(n) + " columns");
    const int64_t tiles = lse_tile_count(ncols);
    std::vector<float> out((size_t)(t * tiles * 2));
    {
      nb::gil_scoped_release release;
      for (int64_t r = 0; r < t; ++r)
        for (int64_t k = 0; k < tiles; ++k) {
          const int64_t a = col0 + k * kLseTile, len = std::min<int64_t>(kLseTile, col0 + ncols - a);
          const LsePair p = lse_tile(values.data() + r * n + a, (int)len);
          out[(size_t)((r * tiles + k) * 2)] = p.m;
          out[(size_t)((r * tiles + k) * 2 + 1)] = p.s;
        }
    }
    return owned(std::move(out), {(size_t)t, (size_t)tiles, 2});
  }, nb::arg("values"), nb::arg("col0"), nb::arg("ncols"));

  // Each row's tile pairs [t, tiles, 2] joined by the fixed tile tree: (pairs [t, 2], lse [t]).
  m.def("lse_tree_pairs", [](Pairs pairs) {
    const int64_t t = (int64_t)pairs.shape(0), tiles = (int64_t)pairs.shape(1);
    if (pairs.shape(2) != 2) throw ArgValueError("pairs must have shape [t, tiles, 2]");
    std::vector<float> joined((size_t)(t * 2)), lse((size_t)t);
    std::vector<LsePair> row((size_t)std::max<int64_t>(tiles, 1));
    for (int64_t r = 0; r < t; ++r) {
      for (int64_t k = 0; k < tiles; ++k)
        row[(size_t)k] = LsePair{pairs.data()[(r * tiles + k) * 2], pairs.data()[(r * tiles + k) * 2 + 1]};
      const LsePair p = lse_tree(row.data(), (int)tiles);
      joined[(size_t)(2 * r)] = p.m;
      joined[(size_t)(2 * r + 1)] = p.s;
      lse[(size_t)r] = lse_value(p);
    }
    return nb::make_tuple(owned(std::move(joined), {(size_t)t, 2}), owned(std::move(lse), {(size_t)t}));
  }, nb::arg("pairs"));

  m.def("canon_exp_nonpos", [](Row x) {
    std::vector<float> out(x.shape(0));
    for (size_t i = 0; i < out.size(); ++i) out[i] = canon_exp_nonpos(x.data()[i]);
    return owned(std::move(out), {out.size()});
  }, nb::arg("x"));

  // Sampling's step 1 (sample_processed) on a shard's rows x [t, n] with its
  // slices of logit_bias and allowed: (z [t, n], status [t], top [t] (local
  // index; the first bad token's when status is kSampleNonFinite), z_is_x
  // [t], dropped [t]).
  m.def("sample_processed_rows",
        [](Rows x, std::optional<Row> bias, std::optional<Mask> allowed, float temperature) {
          const int64_t t = (int64_t)x.shape(0), n = (int64_t)x.shape(1);
          if ((bias && (int64_t)bias->shape(0) != n) || (allowed && (int64_t)allowed->shape(0) != n))
            throw ArgValueError("logit_bias and allowed must hold one value per column");
          const float* b = bias ? bias->data() : nullptr;
          const uint8_t* a = allowed ? reinterpret_cast<const uint8_t*>(allowed->data()) : nullptr;
          std::vector<float> z((size_t)(t * n));
          std::vector<int32_t> status((size_t)t);
          std::vector<int64_t> top((size_t)t);
          std::vector<uint8_t> z_is_x((size_t)t), dropped((size_t)t);
          for (int64_t r = 0; r < t; ++r) {
            const SampleShape sh = sample_processed(x.data() + r * n, b, a, (int)n, temperature, z.data() + r * n);
            status[(size_t)r] = sh.status;
            top[(size_t)r] = sh.top;
            z_is_x[(size_t)r] = sh.z_is_x;
            dropped[(size_t)r] = sh.dropped;
          }
          return nb::make_tuple(owned(std::move(z), {(size_t)t, (size_t)n}), owned(std::move(status), {(size_t)t}),
                                owned(std::move(top), {(size_t)t}), owned(std::move(z_is_x), {(size_t)t}),
                                owned(std::move(dropped), {(size_t)t}));
        },
        nb::arg("x"), nb::arg("bias").none(), nb::arg("allowed").none(), nb::arg("temperature"));

  // top_p's mass of each row of one shard's z [t, n] (sample_top_p_mass against the
  // row's top z m [t], over all shards): integers, so the shards' masses add to the row's.
  m.def("sample_top_p_mass_rows", [](Rows z, Row m) {
    const int64_t t = (int64_t)z.shape(0), n = (int64_t)z.shape(1);
    if ((int64_t)m.shape(0) != t) throw ArgValueError("m must hold one value per row of z");
    std::vector<uint64_t> S((size_t)t);
    for (int64_t r = 0; r < t; ++r) S[(size_t)r] = sample_top_p_mass(z.data() + r * n, (int)n, m.data()[r]);
    return owned(std::move(S), {(size_t)t});
  }, nb::arg("z"), nb::arg("m"));

  // top_p's cut over z values already in the kept-set order (sample_top_p_count
  // against sample_top_p_target(S, top_p), S the kept set's mass): the prefix length
  // that reaches it, or -1 when these values do not.
  m.def("sample_top_p_cut", [](Row z_sorted, float m, uint64_t S, float top_p) -> int64_t {
    const int64_t n = (int64_t)z_sorted.shape(0);
    std::vector<int32_t> order((size_t)n);
    for (int64_t j = 0; j < n; ++j) order[(size_t)j] = (int32_t)j;
    const int cut = sample_top_p_count(z_sorted.data(), order.data(), (int)n, m, sample_top_p_target(S, top_p));
    return cut > 0 ? cut : -1;
  }, nb::arg("z_sorted"), nb::arg("m"), nb::arg("S"), nb::arg("top_p"));

  // The exponential race over one shard's kept z [t, n] (token ids start ..
  // start + n - 1), from the shard's own top (local index, -1: none kept):
  // (key [t], token [t] global, -1 when the shard keeps nothing). The race
  // order is total, so the best of the shards' winners is the row's winner.
  m.def("sample_race_rows",
        [](Rows z, int64_t start, Row m, uint64_t seed, U64s positions, I64s top) {
          const int64_t t = (int64_t)z.shape(0), n = (int64_t)z.shape(1);
          if ((int64_t)m.shape(0) != t || (int64_t)positions.shape(0) != t || (int64_t)top.shape(0) != t)
            throw ArgValueError("m, positions and top must hold one value per row");
          std::vector<float> key((size_t)t);
          std::vector<int64_t> token((size_t)t);
          {
            nb::gil_scoped_release release;
            for (int64_t r = 0; r < t; ++r) {
              const GlobalRow row{z.data() + r * n, start};
              const int64_t tp = top.data()[r];
              RaceEntry best{0.0f, -1};
              if (tp >= 0) {
                const int32_t id = (int32_t)(start + tp);
                best = RaceEntry{sample_race_key(row[id], m.data()[r], seed, positions.data()[r], id), id};
              }
              best = sample_race_range(row, (int)start, (int)(start + n), m.data()[r], seed, positions.data()[r], best);
              key[(size_t)r] = best.key;
              token[(size_t)r] = best.token;
            }
          }
          return nb::make_tuple(owned(std::move(key), {(size_t)t}), owned(std::move(token), {(size_t)t}));
        },
        nb::arg("z"), nb::arg("start"), nb::arg("m"), nb::arg("seed"), nb::arg("positions"), nb::arg("top"));
}

}  // namespace muser::py
