// Seeded sampling (cpu/sample.h) and its generator (muser/philox.h). The
// Python layer (python/muser/_sampling.py) validates and converts every
// argument; these entry points take exactly typed arrays.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>
#include <nanobind/stl/optional.h>

#include <array>
#include <optional>
#include <string>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "sample_args.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "cpu/sample.h"
#include "errors.h"

namespace nb = nanobind;

namespace muser::py {
namespace {

using Rows = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using I64s = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// The error of a row whose processed logits hold no usable token.
[[noreturn]] void throw_status(const SampleResult& r, int64_t row, const float* logits, const float* bias) {
  if (r.status == kSampleNonFinite) {
    const float x = logits[r.token];
    std::string what = "row " + std::to_string(row) + ", token " + std::to_string(r.token) + ": logit " +
                       std::to_string(x);
    if (bias) what += " + logit_bias " + std::to_string(bias[r.token]);
    throw NonFiniteError(what + " is not finite after logit_bias and temperature; sample needs finite logits "
                                "(a -inf logit is allowed: probability 0)");
  }
  throw ArgValueError("row " + std::to_string(row) + ": no token is left to sample (every allowed logit is -inf)");
}

}  // namespace

void bind_sample(nb::module_& m) {
  m.def("sample_rows",
        [](Rows logits, U64s positions, uint64_t seed, float temperature, int top_k, float top_p, float min_p,
           std::optional<Row> bias, std::optional<Mask> allowed, int threads) {
          const int64_t t = (int64_t)logits.shape(0), V = (int64_t)logits.shape(1);
          if ((int64_t)positions.shape(0) != t)
            throw ArgValueError("positions must hold one value per row (" + std::to_string(t) + ")");
          if (V < 1 || V > INT32_MAX) throw ArgValueError("logits must have 1 .. 2^31-1 columns");
          const auto [p, b, a] = sample_inputs(seed, temperature, top_k, top_p, min_p, bias, allowed, V);
          cpu::check_threads(threads);
          std::vector<float> lse((size_t)t);
          std::vector<SampleResult> res((size_t)t);
          {
            nb::gil_scoped_release release;
            const int n = threads > 0 ? threads : cpu::default_threads();
            cpu::logsumexp_rows(logits.data(), (int)t, V, n, lse.data());  // the lse score uses
            cpu::sample_rows(logits.data(), (int)t, V, lse.data(), b, a, p, positions.data(), n, res.data());
          }
          for (int64_t r = 0; r < t; ++r)
            if (res[(size_t)r].status != kSampleOk) throw_status(res[(size_t)r], r, logits.data() + r * V, b);
          return sample_arrays(res);
        },
        nb::arg("logits"), nb::arg("positions"), nb::arg("seed"), nb::arg("temperature"), nb::arg("top_k"),
        nb::arg("top_p"), nb::arg("min_p"), nb::arg("bias").none(), nb::arg("allowed").none(),
        nb::arg("threads") = 0);

  // Many draws from one row of logits, one per position (the kept set built
  // once): the frequency tests' entry point. Returns (tokens, logprob,
  // processed_logprob, kept_mass), the last three of positions[0]'s draw.
  m.def("sample_positions",
        [](Row logits, U64s positions, uint64_t seed, float temperature, int top_k, float top_p, float min_p,
           std::optional<Row> bias, std::optional<Mask> allowed, int threads) {
          const int64_t V = (int64_t)logits.shape(0), n = (int64_t)positions.shape(0);
          if (n < 1) throw ArgValueError("positions must not be empty");
          if (V < 1 || V > INT32_MAX) throw ArgValueError("logits must have 1 .. 2^31-1 values");
          const auto [p, b, a] = sample_inputs(seed, temperature, top_k, top_p, min_p, bias, allowed, V);
          cpu::check_threads(threads);
          std::vector<int64_t> tokens((size_t)n);
          SampleResult first;
          {
            nb::gil_scoped_release release;
            const int nt = threads > 0 ? threads : cpu::default_threads();
            float lse = 0.0f;
            cpu::logsumexp_rows(logits.data(), 1, V, nt, &lse);
            first = cpu::sample_positions(logits.data(), V, lse, b, a, p, positions.data(), n, nt, tokens.data());
          }
          if (first.status != kSampleOk) throw_status(first, 0, logits.data(), b);
          return nb::make_tuple(owned_array(std::move(tokens)), first.logprob, first.processed_logprob,
                                first.kept_mass);
        },
        nb::arg("logits"), nb::arg("positions"), nb::arg("seed"), nb::arg("temperature"), nb::arg("top_k"),
        nb::arg("top_p"), nb::arg("min_p"), nb::arg("bias").none(), nb::arg("allowed").none(),
        nb::arg("threads") = 0);

  // The generator itself, for the known-answer tests.
  m.def("philox4x32_10", [](std::array<uint32_t, 4> ctr, std::array<uint32_t, 2> key) {
    const PhiloxCounter c = philox4x32_10(PhiloxCounter{ctr[0], ctr[1], ctr[2], ctr[3]}, PhiloxKey{key[0], key[1]});
    return std::array<uint32_t, 4>{c.x0, c.x1, c.x2, c.x3};
  }, nb::arg("counter"), nb::arg("key"));
  // The uniform and the exponential clock sampling draws for each (seed, positions[j], tokens[j]).
  m.def("sample_uniforms", [](uint64_t seed, U64s positions, I64s tokens) {
    const size_t n = positions.shape(0);
    if (tokens.shape(0) != n) throw ArgValueError("positions and tokens must have the same length");
    std::vector<float> u(n), e(n);
    for (size_t j = 0; j < n; ++j) {
      u[j] = philox_uniform(philox_token_bits(seed, positions.data()[j], (uint32_t)tokens.data()[j]));
      e[j] = sample_exponential(seed, positions.data()[j], (int32_t)tokens.data()[j]);
    }
    return nb::make_tuple(owned_array(std::move(u)), owned_array(std::move(e)));
  }, nb::arg("seed"), nb::arg("positions"), nb::arg("tokens"));
}

}  // namespace muser::py
