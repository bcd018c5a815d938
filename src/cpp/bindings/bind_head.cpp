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

#include "arrays.h"
#include "bindings.h"
#include "cpu/cpu_device.h"
#include "cpu/isa.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "errors.h"
#include "gguf.h"
#include "head.h"
#include "quant_types.h"

namespace nb = nanobind;

namespace muser::py {

namespace {

using F32Array = nb::ndarray<nb::numpy, float>;
using WritableArray = nb::ndarray<>;

std::string dtype_name(const nb::dlpack::dtype& d) {
  const char* kind = d.code == (uint8_t)nb::dlpack::dtype_code::Float  ? "float"
                     : d.code == (uint8_t)nb::dlpack::dtype_code::Int  ? "int"
                     : d.code == (uint8_t)nb::dlpack::dtype_code::UInt ? "uint"
                     : d.code == (uint8_t)nb::dlpack::dtype_code::Bfloat ? "bfloat"
                                                                          : "other";
  return std::string(kind) + std::to_string(d.bits);
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
  if (!c_contiguous(a)) throw ArgValueError(std::string(what) + " must be C-contiguous");
  if (reinterpret_cast<uintptr_t>(a.data()) % alignof(float) != 0)
    throw ArgValueError(std::string(what) + " must be 4-byte aligned (numpy: np.require(a, requirements='A'))");
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

nb::dict spec_dict(const HeadSpec& s) {
  nb::dict d;
  d["arch"] = s.arch;
  d["hidden_size"] = s.hidden;
  d["vocab_size"] = s.vocab;
  d["norm"] = norm_kind_name(s.norm);
  d["eps"] = s.eps;
  d["eps_source"] = s.eps_source;
  d["norm_weight"] = s.norm_weight;
  d["output_weight"] = s.output_weight;
  d["output_type"] = type_traits(s.output_type).name;
  d["tied"] = s.tied;
  d["logit_scale_mode"] = scale_mode_name(s.scale_mode);
  d["logit_scale"] = s.scale_mode == ScaleMode::None ? nb::none() : nb::cast(s.logit_scale);
  d["logit_scale_source"] = s.logit_scale_source;
  d["applied_scale"] = s.applied_scale();
  d["softcap"] = s.softcap > 0 ? nb::cast(s.softcap) : nb::none();
  d["softcap_source"] = s.softcap_source;
  return d;
}

// An override's number, kept in double so read_head_spec can say when it does not fit float32.
double override_number(const std::string& key, nb::handle v) {
  const std::string got = nb::cast<std::string>(nb::str(v.type().attr("__name__")));
  if (PyBool_Check(v.ptr()) || PyUnicode_Check(v.ptr()) || PyBytes_Check(v.ptr()))
    throw ArgTypeError("override " + key + " must be a number or None, got " + got);
  const double d = PyFloat_AsDouble(v.ptr());  // any real number: int, float, numpy scalars
  if (d == -1.0 && PyErr_Occurred()) {
    PyErr_Clear();
    throw ArgValueError("override " + key + " must be a real number that fits a double, got " + got);
  }
  return d;
}

SpecOverrides parse_overrides(const nb::dict& ov) {
  SpecOverrides o;
  for (auto [k, v] : ov) {
    const std::string key = nb::cast<std::string>(k);
    if (key == "softcap") {
      if (v.is_none()) o.softcap_disable = true;
      else o.softcap = override_number(key, v);
    } else if (key == "logit_scale") {
      if (v.is_none()) o.logit_scale_disable = true;
      else o.logit_scale = override_number(key, v);
    } else if (key == "eps") {
      o.eps = override_number(key, v);
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

WeightView weight_from_bytes(const AnyArray& w, const std::string& type_name, std::unique_ptr<uint8_t[]>& aligned) {
  uint32_t type = 0;
  bool found = false;
  for (uint32_t id = 0; id < 64; ++id) {
    const TypeTraits tt = type_traits(id);
    if (tt.name && type_name == tt.name && tt.supported) {
      type = id;
      found = true;
    }
  }
  if (!found) throw ArgValueError("weight type must be one of " + supported_type_list() + "; got '" + type_name + "'");
  if (w.dtype() != nb::dtype<uint8_t>()) throw ArgTypeError("weight bytes must be uint8, got " + dtype_name(w.dtype()));
  if (w.ndim() != 2) throw ArgValueError("weight bytes must be 2-D (rows, row_bytes), got shape " + shape_str(w));
  if (!c_contiguous(w)) throw ArgValueError("weight bytes must be C-contiguous");
  const TypeTraits tt = type_traits(type);
  const int64_t row_bytes = (int64_t)w.shape(1);
  if (row_bytes % tt.block_bytes != 0)
    throw ArgValueError("row_bytes " + std::to_string(row_bytes) + " is not a multiple of the " + type_name + " block (" +
                        std::to_string(tt.block_bytes) + " bytes)");
  return {type, (int64_t)w.shape(0), row_bytes / tt.block_bytes * tt.block_elems, row_bytes,
          aligned_blocks(static_cast<const uint8_t*>(w.data()), w.size(), aligned)};
}

}  // namespace

void throw_nonfinite(int64_t index, int64_t H, float value) {
  const int64_t r = index / H, c = index % H;
  throw NonFiniteError("hidden state row " + std::to_string(r) + ", column " + std::to_string(c) + " is " +
                       std::to_string(value) + " (pass check_finite=False to compute anyway)");
}

void check_finite_rows(const float* x, int64_t rows, int64_t H) {
  for (int64_t i = 0; i < rows * H; ++i)
    if (!std::isfinite(x[i])) throw_nonfinite(i, H, x[i]);
}

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
             int threads, bool mmap, bool fuse, const nb::dict& overrides, int64_t shard_rank, int64_t shard_world) {
            HeadOptions o;
            o.shard_rank = shard_rank;
            o.shard_world = shard_world;
            o.mmap = mmap;
            o.fuse = fuse;
            o.device = device;
            o.route = parse_route(route);
            o.acts = parse_acts(acts);
            o.threads = threads;
            o.overrides = parse_overrides(overrides);
            nb::gil_scoped_release release;
            return Head::load(path, o);
          },
          nb::arg("path"), nb::arg("device"), nb::arg("route"), nb::arg("acts"), nb::arg("threads"),
          nb::arg("mmap"), nb::arg("fuse"), nb::arg("overrides"), nb::arg("shard_rank") = 0,
          nb::arg("shard_world") = 1)
      .def_ro_static("POOL_SIZE", &Head::kPoolSize)
      .def("check_file", [](const Head& h) { h.check_file(); },
           "Raise GGUFError when the mapped file changed since load (what every call checks first).")
      .def_prop_ro("spec",
                   [](const Head& h) {
                     nb::dict d = spec_dict(h.spec());
                     d["vocab_size"] = h.model_vocab();  // the model's V; a shard's rows are shard_rows
                     return d;
                   })
      .def_prop_ro("shard_rows", [](const Head& h) { return std::make_pair(h.rows().start, h.rows().stop); })
      .def_prop_ro("route", [](const Head& h) { return std::string(route_name(h.options().route)); })
      .def_prop_ro("acts", [](const Head& h) { return std::string(acts_name(h.options().acts)); })
      .def_prop_ro("device", [](Head& h) { return h.device().name(); })
      .def_prop_ro("caps", [](Head& h) { return caps_dict(h.device().caps()); })
      .def_prop_ro("steps",
                   [](Head& h) {
                     // the kernels the device runs: each a list of the node labels it contains
                     std::vector<std::vector<std::string>> out;
                     for (const Step& st : h.device().steps()) {
                       std::vector<std::string> labels;
                       for (size_t i = st.first; i < st.first + st.count; ++i) labels.push_back(h.nodes()[i].label);
                       out.push_back(labels);
                     }
                     return out;
                   })
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
          // out is a writable ndarray: nanobind refuses a read-only one (head.py says so first, clearly)
          [](std::shared_ptr<Head> h, const AnyArray& hidden, std::optional<WritableArray> out, bool profile,
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
                                    shape_str(AnyArray(*out)));
              if (!c_contiguous(AnyArray(*out))) throw ArgValueError("out must be C-contiguous");
              if (out->device_type() != nb::device::cpu::value) throw ArgTypeError("out must be in host memory");
              if (reinterpret_cast<uintptr_t>(out->data()) % alignof(float) != 0)
                throw ArgValueError("out must be 4-byte aligned");
              dst = static_cast<float*>(out->data());
            }
            std::vector<NodeTiming> timings;
            std::shared_ptr<HostBuffer> buf;
            {
              nb::gil_scoped_release release;
              if (check) check_finite_rows(x, t, H);
              buf = h->run(x, (int)t, dst, profile ? &timings : nullptr);
            }
            nb::object result = buf ? nb::cast(view_of(buf, (size_t)t, (size_t)V, h)) : nb::none();
            return nb::make_tuple(result, profile_list(timings));
          },
          nb::arg("hidden"), nb::arg("out").none(), nb::arg("profile") = false, nb::arg("check_finite") = true)
      .def(
          "log_softmax_in_place",
          // logits [t x V] a call of this head wrote: on the device when it can (Metal's shared
          // buffers), else False and the caller reduces them on the host
          [](std::shared_ptr<Head> h, WritableArray logits) {
            if (logits.dtype() != nb::dtype<float>() || logits.ndim() != 2 || !c_contiguous(AnyArray(logits)) ||
                (int64_t)logits.shape(1) != h->spec().vocab || logits.shape(0) < 1 ||
                logits.device_type() != nb::device::cpu::value)
              throw ArgValueError("logits must be a C-contiguous host float32 [t, V] array");
            const int t = (int)logits.shape(0);
            float* y = static_cast<float*>(logits.data());
            nb::gil_scoped_release release;
            return h->log_softmax_in_place(y, t);
          },
          nb::arg("logits"))
      .def_prop_ro("buffer", [](std::shared_ptr<Head> h) -> nb::object {
        auto buf = h->buffer();
        if (!buf) return nb::none();
        return nb::cast(view_of(buf, 1, buf->count, h));
      });

  // ---- the consumer's reductions over host logits (canonical order: muser/logsumexp.h) ----
  m.def("logsumexp_rows", [](const AnyArray& logits, int threads) {
    const float* y = f32_matrix(logits, "logits", -1);
    const int64_t t = (int64_t)logits.shape(0), V = (int64_t)logits.shape(1);
    cpu::check_threads(threads);
    std::vector<float> lse((size_t)t);
    {
      nb::gil_scoped_release release;
      cpu::logsumexp_rows(y, (int)t, V, threads > 0 ? threads : cpu::default_threads(), lse.data());
    }
    return lse;
  }, nb::arg("logits"), nb::arg("threads") = 0);
  m.def("log_softmax_inplace", [](WritableArray logits, const std::vector<float>& lse, int threads) {
    if (logits.dtype() != nb::dtype<float>() || logits.ndim() != 2 || !c_contiguous(AnyArray(logits)))
      throw ArgValueError("logits must be a C-contiguous float32 [t, V] array");
    const int64_t t = (int64_t)logits.shape(0), V = (int64_t)logits.shape(1);
    if ((int64_t)lse.size() != t) throw ArgValueError("lse must hold one value per row");
    cpu::check_threads(threads);
    nb::gil_scoped_release release;
    cpu::log_softmax_rows(static_cast<float*>(logits.data()), (int)t, V, lse.data(),
                          threads > 0 ? threads : cpu::default_threads());
  }, nb::arg("logits"), nb::arg("lse"), nb::arg("threads") = 0);
  m.def("score_rows", [](const AnyArray& logits, const AnyArray& ids, int threads) {
    const float* y = f32_matrix(logits, "logits", -1);
    const int64_t t = (int64_t)logits.shape(0), V = (int64_t)logits.shape(1);
    if (ids.dtype() != nb::dtype<int64_t>() || ids.ndim() != 2 || (int64_t)ids.shape(0) != t || !c_contiguous(ids))
      throw ArgValueError("token ids must be a C-contiguous int64 [t, m] array");
    const int m = (int)ids.shape(1);
    const auto* id = static_cast<const int64_t*>(ids.data());
    for (int64_t q = 0; q < t * m; ++q)
      if (id[q] < 0 || id[q] >= V)
        throw ArgValueError("token id " + std::to_string(id[q]) + " is outside [0, " + std::to_string(V) + ")");
    cpu::check_threads(threads);
    std::vector<float> lse((size_t)t), logprobs((size_t)(t * m)), values((size_t)(t * m));
    std::vector<int64_t> ranks((size_t)(t * m));
    {
      nb::gil_scoped_release release;
      const int n = threads > 0 ? threads : cpu::default_threads();
      cpu::logsumexp_rows(y, (int)t, V, n, lse.data());
      cpu::score_rows(y, (int)t, V, id, m, lse.data(), n, logprobs.data(), values.data(), ranks.data());
    }
    return nb::make_tuple(logprobs, values, ranks, lse);
  }, nb::arg("logits"), nb::arg("ids"), nb::arg("threads") = 0);

  // float16 / bfloat16 host arrays (torch tensors through DLPack too) widened
  // exactly to a new float32 array of the same shape
  m.def("widen_to_f32", [](const AnyArray& a) {
    const auto d = a.dtype();
    const bool f16 = d.code == (uint8_t)nb::dlpack::dtype_code::Float && d.bits == 16;
    const bool bf16 = d.code == (uint8_t)nb::dlpack::dtype_code::Bfloat && d.bits == 16;
    if (!f16 && !bf16) throw ArgTypeError("hidden must be float32, float16 or bfloat16, got " + dtype_name(d));
    if (a.device_type() != nb::device::cpu::value) throw ArgTypeError("hidden must be in host memory here");
    if (a.ndim() != 1 && a.ndim() != 2) throw ArgValueError("hidden must be 1-D or 2-D, got shape " + shape_str(a));
    if (!c_contiguous(a)) throw ArgValueError("a float16/bfloat16 hidden state must be C-contiguous");
    const size_t rows = a.ndim() == 2 ? a.shape(0) : 1, cols = a.shape(a.ndim() - 1);
    F32Array out = new_array(rows, cols);
    const auto* src = static_cast<const uint16_t*>(a.data());
    float* dst = out.data();
    for (size_t i = 0; i < rows * cols; ++i) dst[i] = f16 ? f16_to_f32(src[i]) : bf16_to_f32(src[i]);
    return out;  // [rows, cols]: a 1-D input comes back as one row
  }, nb::arg("array"));

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
      host_topk(y, (int)t, V, (int)kk, ids.data(), vals.data());
    }
    return std::make_pair(ids, vals);
  });

  // ---- low-level ops (tests and parity): each returns a new array ----
  // A route's own nodes (what build_route emits for a head of this shape)
  // run on the CPU device over caller arrays: stage "norm" runs the nodes
  // before the LM head on x [t, H] (gamma [H]); "epilogue" the nodes after it
  // on logits [t, V] in a copy. The parity rungs test exactly these nodes.
  m.def(
      "ops_route",
      [](const std::string& stage, const std::string& route, const AnyArray& x, const std::string& norm, float eps,
         std::optional<AnyArray> gamma, float scale, float cap, bool fuse, int threads) {
        const float* xs = f32_matrix(x, "x", -1);
        const size_t t = x.shape(0), n = x.shape(1);
        cpu::check_threads(threads);
        if (stage != "norm" && stage != "epilogue") throw ArgValueError("stage must be 'norm' or 'epilogue', got '" + stage + "'");
        if (norm != "rms" && norm != "layer") throw ArgValueError("norm must be 'rms' or 'layer', got '" + norm + "'");
        HeadSpec spec;
        spec.arch = "ops";
        spec.hidden = (int64_t)n;
        spec.vocab = (int64_t)n;
        spec.norm = norm == "rms" ? NormKind::Rms : NormKind::Layer;
        spec.eps = eps;
        spec.output_type = (uint32_t)GgmlType::F32;
        spec.scale_mode = scale == 1.0f ? ScaleMode::None : ScaleMode::Multiply;
        spec.logit_scale = scale;
        spec.softcap = cap;
        HeadWeights w;
        if (stage == "norm") {
          if (!gamma || gamma->dtype() != nb::dtype<float>() || gamma->ndim() != 1 || gamma->shape(0) != n ||
              !c_contiguous(*gamma))
            throw ArgValueError("gamma must be a contiguous float32 vector of length " + std::to_string(n));
          const float* g = static_cast<const float*>(gamma->data());
          w.gamma.assign(g, g + n);
        }
        const std::vector<Node> all = build_route(parse_route(route), spec, Acts::F32);
        size_t mv = 0;
        while (!is_matvec(all[mv].kind)) ++mv;
        const std::vector<Node> nodes = stage == "norm" ? std::vector<Node>(all.begin(), all.begin() + mv)
                                                        : std::vector<Node>(all.begin() + mv + 1, all.end());
        // the CPU's own fusions of these nodes, as the device plans them
        const std::vector<Step> steps = plan_steps(nodes, fuse, cpu::cpu_fusable);
        F32Array out = new_array(t, n);
        float* o = out.data();
        {
          nb::gil_scoped_release release;
          cpu::StepBuffers b;
          if (stage == "norm") {
            b.hidden = xs;
            b.normed = o;
          } else {
            std::copy(xs, xs + t * n, o);
            b.logits = o;
          }
          cpu::run_steps(nodes, steps, spec, w, threads > 0 ? threads : cpu::default_threads(), (int)t, b, nullptr);
        }
        return out;
      },
      nb::arg("stage"), nb::arg("route"), nb::arg("x"), nb::arg("norm") = "rms", nb::arg("eps") = 0.0f,
      nb::arg("gamma").none() = nb::none(), nb::arg("scale") = 1.0f, nb::arg("cap") = 0.0f, nb::arg("fuse") = true,
      nb::arg("threads") = 0);
  m.def(
      "ops_matvec",
      [](const AnyArray& w, const std::string& type, const AnyArray& x, const std::string& order,
         std::optional<std::string> isa, int threads) {
        std::unique_ptr<uint8_t[]> aligned;
        const WeightView wv = weight_from_bytes(w, type, aligned);
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
