// A head's device abilities beyond Head.run, through the Device interface
// only (caps() says which a device has): logits that stay in device memory,
// returned as a DLPack ndarray whose capsule owns the buffer and the Head;
// hidden states already in device memory; top-k ranked where the logits are;
// the route's own timing. python/muser/_device.py wraps these.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "arrays.h"
#include "bindings.h"
#include "sample_args.h"
#include "errors.h"
#include "head.h"

namespace nb = nanobind;

namespace muser::py {

namespace {

// A host hidden state: float32, [t, H], C-contiguous, aligned.
const float* host_rows(const AnyArray& a, int64_t H) {
  if (a.dtype() != nb::dtype<float>()) throw ArgTypeError("hidden must be float32");
  if (a.device_type() != nb::device::cpu::value) throw ArgTypeError("hidden must be in host memory here");
  if (a.ndim() != 2 || (int64_t)a.shape(1) != H)
    throw ArgValueError("hidden must have shape (t, " + std::to_string(H) + "), got " + shape_str(a));
  if (!c_contiguous(a)) throw ArgValueError("hidden must be C-contiguous");
  if (reinterpret_cast<uintptr_t>(a.data()) % alignof(float) != 0)
    throw ArgValueError("hidden must be 4-byte aligned");
  return static_cast<const float*>(a.data());
}

[[noreturn]] void throw_nonfinite_at(Device& dev, const float* x, int64_t bad, int64_t H) {
  float v = 0;
  dev.download(x + bad, &v, 1);
  throw_nonfinite(bad, H, v);
}

// Where the hidden rows are: a host array, or an address in the head device's memory.
struct HiddenInput {
  const float* ptr = nullptr;
  bool resident = false;
};

// check_finite: host rows are scanned here; device rows too unless scan_resident
// is false (run_call scans them inside the call's graph).
HiddenInput resolve_hidden(Head& h, const std::optional<AnyArray>& host, uint64_t address, int64_t t,
                           bool check_finite, bool scan_resident = true) {
  Device& dev = h.device();
  const int64_t H = h.spec().hidden;
  if (t < 1 || t > (1 << 20)) throw ArgValueError("t must be in [1, 2^20], got " + std::to_string(t));
  HiddenInput in;
  if (host) {
    in.ptr = host_rows(*host, H);
    if ((int64_t)host->shape(0) != t)
      throw ArgValueError("hidden has " + std::to_string(host->shape(0)) + " rows, t=" + std::to_string(t));
    if (check_finite) check_finite_rows(in.ptr, t, H);
    return in;
  }
  const void* p = reinterpret_cast<const void*>((uintptr_t)address);
  const int owner = dev.owner_of(p);
  if (owner < 0)
    throw ArgValueError("hidden is not in the memory of device '" + dev.name() + "' (address " +
                        std::to_string(address) + ")");
  if (owner != dev.caps().ordinal)
    throw ArgValueError("hidden is on device " + std::to_string(owner) + " but the head is on '" + dev.name() + "'");
  in.ptr = static_cast<const float*>(p);
  in.resident = true;
  if (check_finite && scan_resident) {
    const int64_t bad = dev.find_nonfinite(in.ptr, t * H);
    if (bad >= 0) throw_nonfinite_at(dev, in.ptr, bad, H);
  }
  return in;
}

// A call: the hidden rows resolved, then Device::run_call (the NaN scan of device
// rows in the call's own graph); a NaN or inf it found raises NonFiniteError.
CallResult run_checked(Head& h, const std::optional<AnyArray>& host, uint64_t address, int64_t t, CallRequest req) {
  const HiddenInput in = resolve_hidden(h, host, address, t, req.check_finite, false);
  CallResult r = h.device().run_call(in.ptr, in.resident, (int)t, req);
  if (r.first_bad >= 0) throw_nonfinite_at(h.device(), in.ptr, r.first_bad, h.spec().hidden);
  return r;
}

Device& resident_device(Head& h) {
  if (!h.device().caps().resident_logits)
    throw ArgValueError("on_device=True and device hidden states need a device with memory of its own; this head "
                        "runs on '" + h.device().name() + "'");
  return h.device();
}

}  // namespace

nb::dict caps_dict(const DeviceCaps& c) {
  nb::dict d;
  d["resident_logits"] = c.resident_logits;
  d["ranks_on_device"] = c.ranks_on_device;
  d["dlpack_device"] = c.dlpack_device;
  d["compute_device"] = c.compute_device;
  d["ordinal"] = c.ordinal;
  d["max_topk"] = c.max_topk;
  d["sample_on_device"] = c.sample_on_device;
  return d;
}

// (DLPack ndarray, address) of n elements of `dt` at byte `offset` of a device
// buffer, in `shape` (C order); the array keeps the buffer and the head alive.
nb::tuple device_view(const std::shared_ptr<ResidentBuffer>& mem, const std::shared_ptr<Head>& h, size_t offset,
                      nb::dlpack::dtype dt, size_t n, const std::vector<size_t>& shape) {
  size_t count = 1;
  for (size_t d : shape) count *= d;
  if (count != n) throw ArgValueError("a device result's shape must hold its " + std::to_string(n) + " values");
  struct Owner {
    std::shared_ptr<ResidentBuffer> mem;
    std::shared_ptr<Head> head;
  };
  const DeviceCaps caps = h->device().caps();
  auto* owner = new Owner{mem, h};
  nb::capsule cap(owner, [](void* p) noexcept { delete static_cast<Owner*>(p); });
  void* ptr = static_cast<uint8_t*>(mem->ptr) + offset;
  nb::ndarray<nb::array_api> view(ptr, shape.size(), shape.data(), cap, nullptr, dt, caps.dlpack_device, caps.ordinal);
  return nb::make_tuple(nb::cast(view), (uint64_t)(uintptr_t)ptr);
}

void bind_device(nb::module_& m) {
  m.def("device_caps", [](const std::string& name) {
    auto dev = make_device(name, 1);
    return caps_dict(dev->caps());
  }, nb::arg("device"), "What a device can do (DeviceCaps) -- making it, so an absent one raises DeviceError.");

  m.def("device_run", [](std::shared_ptr<Head> h, std::optional<AnyArray> hidden, uint64_t address, int64_t t,
                         bool squeeze, bool profile, bool check_finite, bool log_softmax,
                         std::optional<uint64_t> stream, bool wait) -> nb::tuple {
    Device& dev = resident_device(*h);
    const DeviceCaps caps = dev.caps();
    const int64_t V = h->spec().vocab;
    std::vector<NodeTiming> timings;
    std::shared_ptr<ResidentBuffer> logits;
    {
      nb::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(h->mutex());
      if (profile) {
        if (stream) throw ArgValueError("profile takes no stream=");
        const HiddenInput in = resolve_hidden(*h, hidden, address, t, check_finite);
        logits = dev.run_resident(in.ptr, in.resident, (int)t, &timings);
      } else {
        CallRequest req;
        req.check_finite = check_finite;
        req.log_softmax = log_softmax;
        req.has_stream = stream.has_value();
        req.stream = reinterpret_cast<void*>((uintptr_t)stream.value_or(0));
        req.wait = wait;
        logits = run_checked(*h, hidden, address, t, req).logits;
      }
    }
    struct Owner {
      std::shared_ptr<ResidentBuffer> mem;
      std::shared_ptr<Head> head;
    };
    auto* owner = new Owner{logits, h};
    nb::capsule cap(owner, [](void* p) noexcept { delete static_cast<Owner*>(p); });
    size_t shape[2] = {(size_t)t, (size_t)V};
    if (squeeze) shape[0] = (size_t)V;
    // array_api: an object with __dlpack__/__dlpack_device__ (without a
    // framework nanobind 3 would hand out a bare, single-use DLPack capsule)
    nb::ndarray<nb::array_api, float> view(logits->ptr, squeeze ? 1 : 2, shape, cap, nullptr, nb::dtype<float>(),
                                           caps.dlpack_device, caps.ordinal);
    return nb::make_tuple(nb::cast(view), (uint64_t)(uintptr_t)logits->ptr, profile_list(timings));
  }, nb::arg("head"), nb::arg("hidden").none(), nb::arg("address"), nb::arg("t"), nb::arg("squeeze"),
  nb::arg("profile"), nb::arg("check_finite"), nb::arg("log_softmax") = false, nb::arg("stream").none() = nb::none(),
  nb::arg("wait") = true,
  "Run the head's route into logits that stay in device memory (log_softmax: then logits - logsumexp, in place, "
  "on the device); returns (DLPack ndarray, its address, profile). "
  "The logits are a pooled buffer no one else holds; later calls never write it while a view lives. "
  "stream: a CUDA stream handle to run on (wait=False: return with the work queued on it).");

  m.def("device_download", [](std::shared_ptr<Head> h, uint64_t address, int64_t count) {
    Device& dev = resident_device(*h);
    if (count < 0) throw ArgValueError("count must be >= 0");
    auto* data = new float[(size_t)std::max<int64_t>(count, 1)];
    nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<float*>(p); });
    {
      nb::gil_scoped_release release;
      // the device's stream is the head's: a copy must not land inside another thread's graph capture
      std::lock_guard<std::mutex> lock(h->mutex());
      dev.download(reinterpret_cast<const float*>((uintptr_t)address), data, (size_t)count);
    }
    size_t shape[1] = {(size_t)count};
    return nb::ndarray<nb::numpy, float>(data, 1, shape, owner);
  }, nb::arg("head"), nb::arg("address"), nb::arg("count"), "A new numpy copy of `count` float32 of device memory.");

  m.def("device_route_seconds", [](std::shared_ptr<Head> h, std::optional<AnyArray> hidden, uint64_t address,
                                   int64_t t, int reps, bool check_finite, bool held) -> std::vector<double> {
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(h->mutex());
    const HiddenInput in = resolve_hidden(*h, hidden, address, t, check_finite);
    return h->device().route_seconds(in.ptr, in.resident, (int)t, reps, held);
  }, nb::arg("head"), nb::arg("hidden").none(), nb::arg("address"), nb::arg("t"), nb::arg("reps"),
  nb::arg("check_finite"), nb::arg("held") = false,
  "Device seconds of each of `reps` runs of the whole route, launched as for a call, after one untimed call; "
  "held: each run enqueued behind a kernel that holds the stream (devices that have one).");

  m.def("device_topk", [](std::shared_ptr<Head> h, std::optional<AnyArray> hidden, uint64_t address, int64_t t,
                          int k, bool check_finite, bool ids_only) -> nb::object {
    Device& dev = h->device();
    const DeviceCaps caps = dev.caps();
    const int64_t V = h->spec().vocab;
    if (!caps.ranks_on_device) throw ArgValueError("device '" + dev.name() + "' does not rank on the device");
    if (k < 1 || k > V || (caps.max_topk > 0 && k > caps.max_topk))
      throw ArgValueError("k must be in [1, " + std::to_string(caps.max_topk > 0 && caps.max_topk < V ? caps.max_topk : V) +
                          "] for top-k on the device, got " + std::to_string(k));
    if (ids_only && k != 1) throw ArgValueError("ids_only (argmax) takes k=1, got " + std::to_string(k));
    if (t < 1 || t > (1 << 20)) throw ArgValueError("t must be in [1, 2^20], got " + std::to_string(t));
    // numpy arrays the results are copied into straight from pinned memory
    auto* ids = new int64_t[(size_t)(t * k)];
    nb::capsule ids_owner(ids, [](void* p) noexcept { delete[] static_cast<int64_t*>(p); });
    auto* vals = new float[(size_t)(t * k)];
    nb::capsule vals_owner(vals, [](void* p) noexcept { delete[] static_cast<float*>(p); });
    {
      nb::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(h->mutex());
      CallRequest req;
      req.check_finite = check_finite;
      req.k = k;
      req.ids_only = ids_only;
      req.ids = ids;
      req.vals = vals;
      run_checked(*h, hidden, address, t, req);
    }
    size_t shape[2] = {(size_t)t, (size_t)k};
    nb::object id_arr = nb::cast(nb::ndarray<nb::numpy, int64_t>(ids, 2, shape, ids_owner));
    if (ids_only) return id_arr;
    return nb::make_tuple(id_arr, nb::cast(nb::ndarray<nb::numpy, float>(vals, 2, shape, vals_owner)));
  }, nb::arg("head"), nb::arg("hidden").none(), nb::arg("address"), nb::arg("t"), nb::arg("k"),
  nb::arg("check_finite"), nb::arg("ids_only") = false,
  "Run the route and rank each row on the device in the same call; only (ids, values) [t, k] come back "
  "(ids_only, k=1: the argmax ids [t, 1] alone).");
  m.def("device_score", [](std::shared_ptr<Head> h, std::optional<AnyArray> hidden, uint64_t address, int64_t t,
                           const AnyArray& ids, bool check_finite, bool on_device, std::vector<size_t> ids_shape,
                           std::vector<size_t> lse_shape) -> nb::tuple {
    Device& dev = h->device();
    const int64_t V = h->spec().vocab;
    if (ids.dtype() != nb::dtype<int64_t>() || ids.ndim() != 2 || (int64_t)ids.shape(0) != t || !c_contiguous(ids) ||
        ids.device_type() != nb::device::cpu::value)
      throw ArgValueError("token ids must be a C-contiguous host int64 [t, m] array with t=" + std::to_string(t) +
                          ", got shape " + shape_str(ids));
    const int m = (int)ids.shape(1);
    const auto* id = static_cast<const int64_t*>(ids.data());
    for (int64_t q = 0; q < t * m; ++q)
      if (id[q] < 0 || id[q] >= V)
        throw ArgValueError("token id " + std::to_string(id[q]) + " is outside [0, " + std::to_string(V) + ")");
    auto lse = owned<float>(1, (size_t)t);
    auto values = owned<float>((size_t)t, (size_t)m);
    auto logprobs = owned<float>((size_t)t, (size_t)m);
    auto ranks = owned<int64_t>((size_t)t, (size_t)m);
    VocabScores out;
    {
      nb::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(h->mutex());
      h->check_file();
      // a device hidden state is checked inside the device's own work (no round trip of its own)
      const bool device_checks = check_finite && !hidden;
      const HiddenInput in = resolve_hidden(*h, hidden, address, t, check_finite && !device_checks);
      out.m = m;
      out.ids = id;
      out.lse = lse.data();
      out.values = values.data();
      out.logprobs = logprobs.data();
      out.ranks = ranks.data();
      out.check_hidden = device_checks;
      out.keep_on_device = on_device;
      dev.score(in.ptr, in.resident, (int)t, out);
      if (out.first_nonfinite >= 0) {
        float v = 0;
        dev.download(in.ptr + out.first_nonfinite, &v, 1);
        throw_nonfinite(out.first_nonfinite, h->spec().hidden, v);
      }
    }
    if (on_device) {  // the same arrays, left in device memory (vocab_scores_layout)
      const VocabScoresLayout at = vocab_scores_layout(t, m);
      const size_t n = (size_t)(t * m);
      return nb::make_tuple(device_view(out.device_out, h, at.values, nb::dtype<float>(), n, ids_shape),
                            device_view(out.device_out, h, at.ranks, nb::dtype<int64_t>(), n, ids_shape),
                            device_view(out.device_out, h, 0, nb::dtype<float>(), (size_t)t, lse_shape),
                            device_view(out.device_out, h, at.logprobs, nb::dtype<float>(), n, ids_shape));
    }
    return nb::make_tuple(values, ranks, lse, logprobs);
  }, nb::arg("head"), nb::arg("hidden").none(), nb::arg("address"), nb::arg("t"), nb::arg("ids"),
  nb::arg("check_finite"), nb::arg("on_device") = false, nb::arg("ids_shape") = std::vector<size_t>{},
  nb::arg("lse_shape") = std::vector<size_t>{},
  "Run the route and reduce its logits over the vocabulary (Device::score): (values [t, m], ranks [t, m], lse [t], "
  "logprobs [t, m]); on_device: each as (DLPack ndarray, address) in device memory, shaped ids_shape "
  "(lse: lse_shape).");

  m.def("device_sample", [](std::shared_ptr<Head> h, std::optional<AnyArray> hidden, uint64_t address, int64_t t,
                            U64s positions, uint64_t seed, float temperature, int top_k, float top_p, float min_p,
                            std::optional<Row> bias, std::optional<Mask> allowed, bool check_finite,
                            bool on_device, std::vector<size_t> out_shape) -> nb::object {
    Device& dev = h->device();
    const int64_t V = h->spec().vocab;
    if ((int64_t)positions.shape(0) != t)
      throw ArgValueError("positions must hold one value per row (" + std::to_string(t) + ")");
    const SampleInputs inputs = sample_inputs(seed, temperature, top_k, top_p, min_p, bias, allowed, V);
    SampleRequest req;
    req.params = inputs.params;
    req.bias = inputs.bias;
    req.allowed = inputs.allowed;
    req.positions = positions.data();
    std::vector<SampleResult> res((size_t)t);
    bool drawn = false;
    {
      nb::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(h->mutex());
      h->check_file();
      const bool device_checks = check_finite && !hidden;  // as device_score
      const HiddenInput in = resolve_hidden(*h, hidden, address, t, check_finite && !device_checks);
      req.check_hidden = device_checks;
      req.keep_on_device = on_device;
      drawn = dev.sample(in.ptr, in.resident, (int)t, req, res.data());
    }
    if (!drawn) return nb::none();  // the caller samples host logits (and names any row's problem)
    if (on_device) {  // tokens [t] (int64) | logprobs | processed_logprobs | kept_mass
      const size_t n = (size_t)t;
      return nb::make_tuple(device_view(req.device_out, h, 0, nb::dtype<int64_t>(), n, out_shape),
                            device_view(req.device_out, h, 8 * n, nb::dtype<float>(), n, out_shape),
                            device_view(req.device_out, h, 12 * n, nb::dtype<float>(), n, out_shape),
                            device_view(req.device_out, h, 16 * n, nb::dtype<float>(), n, out_shape));
    }
    return sample_arrays(res);
  }, nb::arg("head"), nb::arg("hidden").none(), nb::arg("address"), nb::arg("t"), nb::arg("positions"),
  nb::arg("seed"), nb::arg("temperature"), nb::arg("top_k"), nb::arg("top_p"), nb::arg("min_p"),
  nb::arg("bias").none(), nb::arg("allowed").none(), nb::arg("check_finite"), nb::arg("on_device") = false,
  nb::arg("out_shape") = std::vector<size_t>{},
  "Run the route and draw one token per row on the device (Device::sample): (tokens, logprobs, "
  "processed_logprobs, kept_mass), or None where the device leaves the draw to the host.");
}

}  // namespace muser::py
