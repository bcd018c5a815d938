// Bindings of the Head engine and of the low-level ops the parity tests use.
// Compute runs with the GIL released; arrays are built after it is re-taken.
// Views of engine buffers carry a capsule owning the buffer (and the Head).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "bindings.h"
#include "cpu/isa.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "errors.h"
#include "gguf.h"
#include "head.h"
#include "muser/quant_blocks.h"

namespace nb = nanobind;

namespace muser::py {

namespace {

using F32Array = nb::ndarray<nb::numpy, float>;
using AnyArray = nb::ndarray<nb::ro>;

std::string dtype_name(const nb::dlpack::dtype& d) {
  const char* kind = d.code == (uint8_t)nb::dlpack::dtype_code::Float  ? "float"
                     : d.code == (uint8_t)nb::dlpack::dtype_code::Int  ? "int"
                     : d.code == (uint8_t)nb::dlpack::dtype_code::UInt ? "uint"
                     : d.code == (uint8_t)nb::dlpack::dtype_code::Bfloat ? "bfloat"
                                                                          : "other";
  return std::string(kind) + std::to_string(d.bits);
}

std::string shape_str(const AnyArray& a) {
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

bool c_contiguous(const AnyArray& a, size_t itemsize) {
  for (size_t i = 0; i < a.ndim(); ++i)
    if (a.shape(i) == 0) return true;  // empty: strides are meaningless
  int64_t expect = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expect) return false;
    expect *= (int64_t)a.shape(i);
  }
  (void)itemsize;
  return true;
}

// Validates a 2-D C-contiguous float32 host array [rows x cols]; returns its data.
const float* f32_matrix(const AnyArray& a, const char* what, int64_t cols) {
  if (a.dtype() != nb::dtype<float>())
    throw ArgTypeError(std::string(what) + " must be float32, got " + dtype_name(a.dtype()));
  if (a.ndim() != 2)
    throw ArgValueError(std::string(what) + " must be 2-D, got shape " + shape_str(a));
  if (cols >= 0 && (int64_t)a.shape(1) != cols)
    throw ArgValueError(std::string(what) + " must have " + std::to_string(cols) + " columns, got shape " + shape_str(a));
  if (a.device_type() != nb::device::cpu::value)
    throw ArgTypeError(std::string(what) + " must be in host memory");
  if (!c_contiguous(a, 4)) throw ArgValueError(std::string(what) + " must be C-contiguous");
  return static_cast<const float*>(a.data());
}

// A numpy [rows x cols] view of a host buffer; the capsule owns the buffer and `keep`.
F32Array view_of(std::shared_ptr<HostBuffer> buf, size_t rows, size_t cols, std::shared_ptr<void> keep) {
  struct Owner {
    std::shared_ptr<HostBuffer> buf;
    std::shared_ptr<void> keep;
  };
  auto* owner = new Owner{buf, std::move(keep)};
  nb::capsule cap(owner, [](void* p) noexcept { delete static_cast<Owner*>(p); });
  size_t shape[2] = {rows, cols};
  return F32Array(buf->data, 2, shape, cap);
}

F32Array new_array(size_t rows, size_t cols) {
  auto buf = std::make_shared<HostBuffer>();
  buf->data = new float[std::max<size_t>(1, rows * cols)];
  buf->count = rows * cols;
  buf->release = [](float* p) { delete[] p; };
  return view_of(buf, rows, cols, nullptr);
}

void check_finite(const float* x, int64_t rows, int64_t cols) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c)
      if (!std::isfinite(x[r * cols + c]))
        throw NonFiniteError("hidden state row " + std::to_string(r) + ", column " + std::to_string(c) + " is " +
                             std::to_string(x[r * cols + c]) + " (pass check_finite=False to compute anyway)");
}

nb::dict spec_dict(const HeadSpec& s) {
  nb::dict d;
  d["arch"] = s.arch;
  d["hidden_size"] = s.hidden;
  d["vocab_size"] = s.vocab;
  d["norm"] = norm_kind_name(s.norm);
  d["eps"] = s.eps;
  d["eps_source"] = s.eps_source;
  d["norm_weight"] = s.norm_weight;
  d["norm_bias"] = s.norm_bias.empty() ? nb::none() : nb::cast(s.norm_bias);
  d["output_weight"] = s.output_weight;
  d["output_type"] = type_traits(s.output_type).name;
  d["tied"] = s.tied;
  d["output_bias"] = s.output_bias.empty() ? nb::none() : nb::cast(s.output_bias);
  d["logit_scale_mode"] = scale_mode_name(s.scale_mode);
  d["logit_scale"] = s.scale_mode == ScaleMode::None ? nb::none() : nb::cast(s.logit_scale);
  d["logit_scale_source"] = s.logit_scale_source;
  d["applied_scale"] = s.applied_scale();
  d["softcap"] = s.softcap > 0 ? nb::cast(s.softcap) : nb::none();
  d["softcap_source"] = s.softcap_source;
  return d;
}

SpecOverrides parse_overrides(const nb::dict& ov) {
  SpecOverrides o;
  for (auto [k, v] : ov) {
    const std::string key = nb::cast<std::string>(k);
    if (key == "softcap") {
      if (v.is_none()) o.softcap_disable = true;
      else o.softcap = nb::cast<float>(v);
    } else if (key == "logit_scale") {
      if (v.is_none()) o.logit_scale_disable = true;
      else o.logit_scale = nb::cast<float>(v);
    } else if (key == "eps") {
      o.eps = nb::cast<float>(v);
    } else if (key == "output_weight") {
      o.output_weight = nb::cast<std::string>(v);
    } else if (key == "arch") {
      o.arch = nb::cast<std::string>(v);
    } else {
      throw ArgTypeError("unknown override '" + key + "' (known: softcap, logit_scale, eps, output_weight, arch)");
    }
  }
  return o;
}

WeightView weight_from_bytes(const AnyArray& w, const std::string& type_name) {
  uint32_t type = 0;
  bool found = false;
  for (uint32_t id = 0; id < 64; ++id) {
    const TypeTraits tt = type_traits(id);
    if (tt.name && type_name == tt.name && tt.supported) {
      type = id;
      found = true;
    }
  }
  if (!found) throw ArgValueError("weight type must be one of F32, F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K; got '" + type_name + "'");
  if (w.dtype() != nb::dtype<uint8_t>()) throw ArgTypeError("weight bytes must be uint8, got " + dtype_name(w.dtype()));
  if (w.ndim() != 2) throw ArgValueError("weight bytes must be 2-D (rows, row_bytes), got shape " + shape_str(w));
  if (!c_contiguous(w, 1)) throw ArgValueError("weight bytes must be C-contiguous");
  const TypeTraits tt = type_traits(type);
  const int64_t row_bytes = (int64_t)w.shape(1);
  if (row_bytes % tt.block_bytes != 0)
    throw ArgValueError("row_bytes " + std::to_string(row_bytes) + " is not a multiple of the " + type_name + " block (" +
                        std::to_string(tt.block_bytes) + " bytes)");
  return {type, (int64_t)w.shape(0), row_bytes / tt.block_bytes * tt.block_elems, row_bytes,
          static_cast<const uint8_t*>(w.data())};
}

}  // namespace

nb::list profile_list(const std::vector<NodeTiming>& timings) {
  nb::list prof;
  for (const auto& tm : timings) {
    nb::dict d;
    d["label"] = tm.label;
    d["kind"] = tm.kind;
    d["seconds"] = tm.seconds;
    d["bytes"] = tm.bytes;
    prof.append(d);
  }
  return prof;
}

void bind_head(nb::module_& m) {
  nb::class_<Head>(m, "Head")
      .def_static(
          "load",
          [](const std::string& path, const std::string& device, const std::string& route, const std::string& acts,
             int threads, const nb::dict& overrides) {
            HeadOptions o;
            o.device = device;
            o.route = parse_route(route);
            o.acts = parse_acts(acts);
            o.threads = threads;
            o.overrides = parse_overrides(overrides);
            nb::gil_scoped_release release;
            return Head::load(path, o);
          },
          nb::arg("path"), nb::arg("device"), nb::arg("route"), nb::arg("acts"), nb::arg("threads"),
          nb::arg("overrides"))
      .def_prop_ro("spec", [](const Head& h) { return spec_dict(h.spec()); })
      .def_prop_ro("route", [](const Head& h) { return std::string(route_name(h.options().route)); })
      .def_prop_ro("acts", [](const Head& h) { return std::string(acts_name(h.options().acts)); })
      .def_prop_ro("device", [](Head& h) { return h.device().name(); })
      .def_prop_ro("path", [](const Head& h) { return h.file()->path(); })
      .def_prop_ro("nodes",
                   [](const Head& h) {
                     std::vector<std::pair<std::string, std::string>> out;
                     for (const Node& n : h.nodes()) out.emplace_back(n.label, node_kind_name(n.kind));
                     return out;
                   })
      .def_prop_ro("weight_bytes",
                   [](const Head& h) { return (double)h.output_weight().row_bytes * (double)h.output_weight().rows; })
      .def(
          "run",
          [](std::shared_ptr<Head> h, const AnyArray& hidden, std::optional<AnyArray> out, bool profile,
             bool check) {
            const int64_t H = h->spec().hidden, V = h->spec().vocab;
            const float* x = f32_matrix(hidden, "hidden", H);
            const int64_t t = (int64_t)hidden.shape(0);
            if (t < 1) throw ArgValueError("hidden must hold at least one row, got shape " + shape_str(hidden));
            if (t > (1 << 20)) throw ArgValueError("hidden has too many rows (" + std::to_string(t) + ")");
            float* dst = nullptr;
            if (out) {
              if (out->dtype() != nb::dtype<float>())
                throw ArgTypeError("out must be float32, got " + dtype_name(out->dtype()));
              if (out->ndim() != 2 || (int64_t)out->shape(0) != t || (int64_t)out->shape(1) != V)
                throw ArgValueError("out must have shape (" + std::to_string(t) + ", " + std::to_string(V) + "), got " +
                                    shape_str(*out));
              if (!c_contiguous(*out, 4)) throw ArgValueError("out must be C-contiguous");
              if (out->device_type() != nb::device::cpu::value) throw ArgTypeError("out must be in host memory");
              dst = static_cast<float*>(const_cast<void*>(out->data()));
            }
            std::vector<NodeTiming> timings;
            std::shared_ptr<HostBuffer> buf;
            {
              nb::gil_scoped_release release;
              if (check) check_finite(x, t, H);
              buf = h->run(x, (int)t, dst, profile ? &timings : nullptr);
            }
            nb::object result = buf ? nb::cast(view_of(buf, (size_t)t, (size_t)V, h)) : nb::none();
            return nb::make_tuple(result, profile_list(timings));
          },
          nb::arg("hidden"), nb::arg("out").none(), nb::arg("profile") = false, nb::arg("check_finite") = true)
      .def_prop_ro("buffer", [](std::shared_ptr<Head> h) -> nb::object {
        auto buf = h->buffer();
        if (!buf) return nb::none();
        return nb::cast(view_of(buf, 1, buf->count, h));
      });

  // ---- argmax / top-k over logits rows (ties: the lowest token id wins; NaN never wins) ----
  m.def("argmax_rows", [](const AnyArray& logits) {
    const float* y = f32_matrix(logits, "logits", -1);
    const int64_t t = (int64_t)logits.shape(0), V = (int64_t)logits.shape(1);
    std::vector<int64_t> ids((size_t)t, 0);
    {
      nb::gil_scoped_release release;
      for (int64_t k = 0; k < t; ++k) {
        const float* row = y + k * V;
        int64_t best = -1;
        for (int64_t i = 0; i < V; ++i)
          if (!std::isnan(row[i]) && (best < 0 || row[i] > row[best])) best = i;
        ids[(size_t)k] = best < 0 ? 0 : best;
      }
    }
    return ids;
  });
  m.def("topk_rows", [](const AnyArray& logits, int64_t kk) {
    const float* y = f32_matrix(logits, "logits", -1);
    const int64_t t = (int64_t)logits.shape(0), V = (int64_t)logits.shape(1);
    if (kk < 1 || kk > V) throw ArgValueError("k must be in [1, " + std::to_string(V) + "], got " + std::to_string(kk));
    std::vector<int64_t> ids((size_t)(t * kk));
    std::vector<float> vals((size_t)(t * kk));
    {
      nb::gil_scoped_release release;
      std::vector<int64_t> idx((size_t)V);
      for (int64_t k = 0; k < t; ++k) {
        const float* row = y + k * V;
        std::iota(idx.begin(), idx.end(), 0);
        auto better = [row](int64_t a, int64_t b) {
          const bool na = std::isnan(row[a]), nb_ = std::isnan(row[b]);
          if (na != nb_) return nb_;  // a number beats NaN
          if (!na && row[a] != row[b]) return row[a] > row[b];
          return a < b;
        };
        std::partial_sort(idx.begin(), idx.begin() + kk, idx.end(), better);
        for (int64_t j = 0; j < kk; ++j) {
          ids[(size_t)(k * kk + j)] = idx[(size_t)j];
          vals[(size_t)(k * kk + j)] = row[idx[(size_t)j]];
        }
      }
    }
    return std::make_pair(ids, vals);
  });

  // ---- low-level ops (tests and parity): each returns a new array ----
  m.def(
      "ops_epilogue",
      [](const AnyArray& logits, float scale, float cap, const std::string& route) {
        const float* y = f32_matrix(logits, "logits", -1);
        const size_t t = logits.shape(0), V = logits.shape(1);
        F32Array out = new_array(t, V);
        float* o = out.data();
        const int64_t n = (int64_t)(t * V);
        const float inv_cap = cap > 0 ? 1.0f / cap : 0.0f;
        std::copy(y, y + n, o);
        if (route == "graph") {
          cpu::scale_inplace(o, n, scale);
          if (cap > 0) {
            cpu::scale_inplace(o, n, inv_cap);
            cpu::tanh_inplace(o, n);
            cpu::scale_inplace(o, n, cap);
          }
        } else if (route == "fused") {
          if (cap > 0) cpu::softcap_fused_inplace(o, n, scale, cap);
          else cpu::scale_inplace(o, n, scale);
        } else if (route == "reference") {
          cpu::scale_inplace(o, n, scale);
          if (cap > 0) cpu::softcap_reference_inplace(o, n, cap, inv_cap);
        } else if (route == "canonical") {
          if (cap > 0) cpu::softcap_canon_inplace(o, n, scale, cap, inv_cap);
          else cpu::scale_inplace(o, n, scale);
        } else {
          throw ArgValueError("route must be 'reference', 'fused', 'graph' or 'canonical'; got '" + route + "'");
        }
        return out;
      },
      nb::arg("logits"), nb::arg("scale"), nb::arg("cap"), nb::arg("route"));
  m.def(
      "ops_norm",
      [](const AnyArray& x, const AnyArray& gamma, float eps, const std::string& kind, const std::string& order) {
        const float* xs = f32_matrix(x, "x", -1);
        const size_t t = x.shape(0), H = x.shape(1);
        if (gamma.dtype() != nb::dtype<float>() || gamma.ndim() != 1 || gamma.shape(0) != H || !c_contiguous(gamma, 4))
          throw ArgValueError("gamma must be a contiguous float32 vector of length " + std::to_string(H));
        const float* g = static_cast<const float*>(gamma.data());
        auto fn = kind == "rms" ? (order == "canonical" ? cpu::rms_norm_canon : cpu::rms_norm_ggml)
                                : (order == "canonical" ? cpu::layer_norm_canon : cpu::layer_norm_ggml);
        if ((kind != "rms" && kind != "layer") || (order != "ggml" && order != "canonical"))
          throw ArgValueError("kind must be 'rms' or 'layer' and order 'ggml' or 'canonical'");
        F32Array out = new_array(t, H);
        float* o = out.data();
        for (size_t k = 0; k < t; ++k) {
          fn(xs + k * H, (int64_t)H, eps, o + k * H);
          for (size_t i = 0; i < H; ++i) o[k * H + i] = o[k * H + i] * g[i];
        }
        return out;
      },
      nb::arg("x"), nb::arg("gamma"), nb::arg("eps"), nb::arg("kind"), nb::arg("order"));
  m.def(
      "ops_matvec",
      [](const AnyArray& w, const std::string& type, const AnyArray& x, const std::string& order,
         std::optional<std::string> isa, int threads) {
        const WeightView wv = weight_from_bytes(w, type);
        const float* xs = f32_matrix(x, "x", wv.cols);
        const size_t t = x.shape(0);
        cpu::Isa which = cpu::active_isa();
        if (isa) which = cpu::isa_by_name(*isa);
        if (order != "canonical" && order != "reference")
          throw ArgValueError("order must be 'canonical' or 'reference', got '" + order + "'");
        cpu::check_threads(threads);
        F32Array out = new_array(t, (size_t)wv.rows);
        float* o = out.data();
        {
          nb::gil_scoped_release release;
          const int nthreads = threads > 0 ? threads : cpu::default_threads();
          cpu::parallel_for(wv.rows, 64, nthreads, [&](int64_t r0, int64_t r1) {
            if (order == "reference")
              cpu::matvec_reference(wv, xs, wv.cols, (int)t, r0, r1, o, wv.rows);
            else
              cpu::matvec_canon_isa(which, wv, xs, wv.cols, (int)t, r0, r1, o, wv.rows);
          });
        }
        return out;
      },
      nb::arg("w"), nb::arg("type"), nb::arg("x"), nb::arg("order") = "canonical", nb::arg("isa").none() = nb::none(),
      nb::arg("threads") = 0);
}

}  // namespace muser::py
