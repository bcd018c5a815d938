// Bindings of the CPU backend's own tools: the read-bandwidth probe the
// bench compares kernels with, and the q8 (int8-activation) kernels one ISA
// twin at a time, for tests. Compute runs with the GIL released.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstring>
#include <optional>

#include "arrays.h"
#include "bindings.h"
#include "cpu/bandwidth.h"
#include "cpu/isa.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "errors.h"
#include "quant_types.h"
#include "route.h"

namespace nb = nanobind;

namespace muser::py {

namespace {

using F32In = nb::ndarray<const float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using U8In = nb::ndarray<const uint8_t, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using F32Out = nb::ndarray<nb::numpy, float, nb::ndim<2>>;
using U8Out = nb::ndarray<nb::numpy, uint8_t, nb::ndim<2>>;

uint32_t q8_weight_type(const std::string& name) {
  for (uint32_t id = 0; id < 64; ++id) {
    const TypeTraits tt = type_traits(id);
    if (tt.name && name == tt.name && is_q8_type(id)) return id;
  }
  throw ArgValueError("acts='q8' weight type must be one of " + q8_type_list() + "; got '" + name + "'");
}

}  // namespace

void bind_cpu(nb::module_& m) {
  m.def(
      "read_bandwidth",
      [](size_t nbytes, int threads, int repeats) {
        cpu::ReadBandwidth r;
        {
          nb::gil_scoped_release release;
          r = cpu::read_bandwidth(nbytes, threads, repeats);
        }
        nb::dict d;
        d["bytes"] = r.bytes;
        d["threads"] = r.threads;
        nb::list secs;
        for (double s : r.seconds) secs.append(s);
        d["seconds"] = secs;
        d["checksum"] = r.checksum;
        return d;
      },
      nb::arg("nbytes"), nb::arg("threads") = 0, nb::arg("repeats") = 3,
      "Stream nbytes with `threads` threads (0: all, at most build_info()['max_threads']), `repeats` times; returns bytes, threads, seconds per repeat.");

  m.def(
      "ops_quantize_acts",
      [](const F32In& x, const std::string& weight_type) {
        const uint32_t type = q8_weight_type(weight_type);
        const int64_t t = (int64_t)x.shape(0), K = (int64_t)x.shape(1);
        cpu::ActsQ8 a;
        cpu::quantize_acts_q8(type, x.data(), K, K, (int)t, &a);
        const bool k = type != (uint32_t)GgmlType::Q8_0;
        const size_t row_bytes = (size_t)a.blocks * (k ? sizeof(BlockQ8_K) : sizeof(BlockQ8_0));
        auto out = owned<uint8_t>((size_t)t, row_bytes);
        std::memcpy(out.data(), k ? (const void*)a.q8k.data() : (const void*)a.q80.data(), (size_t)t * row_bytes);
        return out;
      },
      nb::arg("x"), nb::arg("weight_type"),
      "ggml's bytes of x [t, K] quantized for weights of weight_type (Q8_K blocks, or Q8_0 for Q8_0).");

  m.def(
      "ops_matvec_q8",
      [](const U8In& w, const std::string& weight_type, const F32In& x, std::optional<std::string> isa, int threads) {
        const uint32_t type = q8_weight_type(weight_type);
        const TypeTraits tt = type_traits(type);
        const int64_t row_bytes = (int64_t)w.shape(1);
        if (row_bytes % tt.block_bytes)
          throw ArgValueError("row_bytes " + std::to_string(row_bytes) + " is not a multiple of the " + weight_type +
                              " block (" + std::to_string(tt.block_bytes) + " bytes)");
        std::unique_ptr<uint8_t[]> aligned;
        const WeightView wv{type, (int64_t)w.shape(0), row_bytes / tt.block_bytes * tt.block_elems, row_bytes,
                            aligned_blocks(w.data(), w.size(), aligned)};
        if ((int64_t)x.shape(1) != wv.cols)
          throw ArgValueError("x must have " + std::to_string(wv.cols) + " columns, got " + std::to_string(x.shape(1)));
        const cpu::Isa which = isa ? cpu::isa_by_name(*isa) : cpu::active_isa();
        cpu::check_threads(threads);
        const int t = (int)x.shape(0);
        auto out = owned<float>((size_t)t, (size_t)wv.rows);
        float* y = out.data();
        {
          nb::gil_scoped_release release;
          cpu::ActsQ8 a;
          cpu::quantize_acts_q8(type, x.data(), wv.cols, wv.cols, t, &a);
          cpu::parallel_for(wv.rows, cpu::matvec_row_grain(), threads > 0 ? threads : cpu::default_threads(),
                            [&](int64_t r0, int64_t r1) { cpu::matvec_q8_isa(which, wv, a, r0, r1, y, wv.rows); });
        }
        return out;
      },
      nb::arg("w"), nb::arg("weight_type"), nb::arg("x"), nb::arg("isa").none() = nb::none(), nb::arg("threads") = 0,
      "x @ W.T with x quantized as ggml's CPU does (acts='q8'), on one ISA twin (default: the active one).");

  m.def(
      "ops_softcap_canon",
      [](const F32In& logits, float scale, float cap, std::optional<std::string> isa) {
        const cpu::Isa which = isa ? cpu::isa_by_name(*isa) : cpu::active_isa();
        const size_t t = logits.shape(0), V = logits.shape(1);
        auto out = owned<float>(t, V);
        std::memcpy(out.data(), logits.data(), t * V * sizeof(float));
        const float inv_cap = cap > 0 ? 1.0f / cap : 0.0f;
        cpu::softcap_canon_isa(which, out.data(), (int64_t)(t * V), scale, cap, inv_cap);
        return out;
      },
      nb::arg("logits"), nb::arg("scale"), nb::arg("cap"), nb::arg("isa").none() = nb::none(),
      "The canonical epilogue (scale, cap * canon_tanh(v / cap)) on one ISA twin.");
}

}  // namespace muser::py
