// The sampling arguments both sampling entry points take (bind_sample.cpp on
// host logits, bind_device.cpp on the device), already validated and typed
// by python/muser/_sampling.py; these turn them into sample_row's inputs.
#pragma once
#include <nanobind/ndarray.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "arrays.h"
#include "errors.h"
#include "muser/sample.h"

namespace muser::py {

using Row = nanobind::ndarray<const float, nanobind::ndim<1>, nanobind::c_contig, nanobind::device::cpu>;
using Mask = nanobind::ndarray<const bool, nanobind::ndim<1>, nanobind::c_contig, nanobind::device::cpu>;
using U64s = nanobind::ndarray<const uint64_t, nanobind::ndim<1>, nanobind::c_contig, nanobind::device::cpu>;

// bias [V] / allowed [V] as the pointers sample_row takes (null when absent).
inline const float* bias_ptr(const std::optional<Row>& bias, int64_t V) {
  if (!bias) return nullptr;
  if ((int64_t)bias->shape(0) != V) throw ArgValueError("logit_bias must have shape [" + std::to_string(V) + "]");
  return bias->data();
}
inline const uint8_t* allowed_ptr(const std::optional<Mask>& allowed, int64_t V) {
  if (!allowed) return nullptr;
  if ((int64_t)allowed->shape(0) != V) throw ArgValueError("allowed must have shape [" + std::to_string(V) + "]");
  static_assert(sizeof(bool) == 1, "bool masks are read as bytes");
  return reinterpret_cast<const uint8_t*>(allowed->data());
}

inline SampleParams params_of(uint64_t seed, float temperature, int top_k, float top_p, float min_p, int64_t V) {
  if (!(temperature >= 0.0f) || !(top_p > 0.0f && top_p <= 1.0f) || !(min_p >= 0.0f && min_p <= 1.0f) ||
      top_k < 0 || top_k > V)
    throw ArgValueError("sampling parameters out of range (muser._sampling validates them)");
  return SampleParams{temperature, (int32_t)top_k, top_p, min_p, seed};
}

// A draw's parameters, bias and mask from a binding's arguments.
struct SampleInputs {
  SampleParams params;
  const float* bias;
  const uint8_t* allowed;
};
inline SampleInputs sample_inputs(uint64_t seed, float temperature, int top_k, float top_p, float min_p,
                                  const std::optional<Row>& bias, const std::optional<Mask>& allowed, int64_t V) {
  return SampleInputs{params_of(seed, temperature, top_k, top_p, min_p, V), bias_ptr(bias, V), allowed_ptr(allowed, V)};
}

// Drawn rows as the arrays the Python layer takes: (tokens int64, logprobs,
// processed_logprobs, kept_mass), each [t] (the rows' statuses already checked).
inline nanobind::tuple sample_arrays(const std::vector<SampleResult>& res) {
  const size_t t = res.size();
  std::vector<int64_t> tokens(t);
  std::vector<float> lp(t), plp(t), mass(t);
  for (size_t r = 0; r < t; ++r) {
    tokens[r] = res[r].token;
    lp[r] = res[r].logprob;
    plp[r] = res[r].processed_logprob;
    mass[r] = res[r].kept_mass;
  }
  return nanobind::make_tuple(owned_array(std::move(tokens)), owned_array(std::move(lp)),
                              owned_array(std::move(plp)), owned_array(std::move(mass)));
}

}  // namespace muser::py
