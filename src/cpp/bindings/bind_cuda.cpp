// Bindings of the CUDA device beyond what Head.run offers: hidden states
// already in GPU memory, device logits returned without a copy (a DLPack
// ndarray whose capsule owns the device buffer and the Head), top-k on the
// device, and the helpers the tests and the benchmark need (device count,
// the read-bandwidth kernel). python/muser/_cuda.py wraps these.
//
// In a build without CUDA the same names exist: cuda_device_count() is 0 and
// the rest raise muser.DeviceError, so Python never needs to ask which build.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cmath>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "bindings.h"
#include "errors.h"
#include "head.h"
#include "muser/kernel_args.h"

#ifdef MUSER_HAVE_CUDA
#include "cuda_device.h"
#endif

namespace nb = nanobind;

namespace muser::py {

namespace {

using AnyArray = nb::ndarray<nb::ro>;

[[noreturn]] void no_cuda_build() {
  throw DeviceError("this build of muser has no CUDA backend (it was built without nvcc)");
}

#ifdef MUSER_HAVE_CUDA

cuda::CudaDevice& cuda_device_of(Head& h) {
  auto* d = dynamic_cast<cuda::CudaDevice*>(&h.device());
  if (!d) throw ArgValueError("this head runs on '" + h.device().name() + "', not on a CUDA device");
  return *d;
}

std::string shape_str(const AnyArray& a) {
  std::string s = "(";
  for (size_t i = 0; i < a.ndim(); ++i) s += (i ? ", " : "") + std::to_string(a.shape(i));
  return s + (a.ndim() == 1 ? ",)" : ")");
}

// A host hidden state: float32, [t, H], C-contiguous.
const float* host_rows(const AnyArray& a, int64_t H) {
  if (a.dtype() != nb::dtype<float>()) throw ArgTypeError("hidden must be float32");
  if (a.device_type() != nb::device::cpu::value) throw ArgTypeError("hidden must be in host memory here");
  if (a.ndim() != 2 || (int64_t)a.shape(1) != H)
    throw ArgValueError("hidden must have shape (t, " + std::to_string(H) + "), got " + shape_str(a));
  int64_t expect = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expect) throw ArgValueError("hidden must be C-contiguous");
    expect *= (int64_t)a.shape(i);
  }
  return static_cast<const float*>(a.data());
}

[[noreturn]] void throw_nonfinite(int64_t index, int64_t H, float value) {
  const int64_t r = index / H, c = index % H;
  throw NonFiniteError("hidden state row " + std::to_string(r) + ", column " + std::to_string(c) + " is " +
                       std::to_string(value) + " (pass check_finite=False to compute anyway)");
}

// Where the hidden rows are: host array or a device pointer of this GPU.
struct HiddenInput {
  const float* ptr = nullptr;
  bool on_device = false;
};

HiddenInput resolve_hidden(Head& h, cuda::CudaDevice& dev, const std::optional<AnyArray>& host, uint64_t dev_ptr,
                           int64_t t, bool check_finite) {
  const int64_t H = h.spec().hidden;
  if (t < 1 || t > (1 << 20)) throw ArgValueError("t must be in [1, 2^20], got " + std::to_string(t));
  HiddenInput in;
  if (host) {
    in.ptr = host_rows(*host, H);
    if ((int64_t)host->shape(0) != t) throw ArgValueError("hidden has " + std::to_string(host->shape(0)) + " rows, t=" + std::to_string(t));
    if (check_finite)
      for (int64_t i = 0; i < t * H; ++i)
        if (!std::isfinite(in.ptr[i])) throw_nonfinite(i, H, in.ptr[i]);
    return in;
  }
  const void* p = reinterpret_cast<const void*>((uintptr_t)dev_ptr);
  const int owner = cuda::pointer_device(p);
  if (owner < 0) throw ArgValueError("hidden is not in GPU memory (pointer " + std::to_string(dev_ptr) + ")");
  if (owner != dev.ordinal())
    throw ArgValueError("hidden is on cuda:" + std::to_string(owner) + " but the head is on cuda:" +
                        std::to_string(dev.ordinal()));
  in.ptr = static_cast<const float*>(p);
  in.on_device = true;
  if (check_finite) {
    const int64_t bad = dev.find_nonfinite(in.ptr, t * H);
    if (bad >= 0) {
      float v = 0;
      cuda::copy_to_host(in.ptr + bad, &v, sizeof v);
      throw_nonfinite(bad, H, v);
    }
  }
  return in;
}

#endif  // MUSER_HAVE_CUDA

}  // namespace

void bind_cuda(nb::module_& m) {
  m.def("cuda_device_count", []() -> int {
#ifdef MUSER_HAVE_CUDA
    return cuda::device_count();
#else
    return 0;
#endif
  }, "GPUs this process can use; 0 (never an error) without a CUDA build, driver or GPU.");

  m.def("cuda_no_device_reason", []() -> std::string {
#ifdef MUSER_HAVE_CUDA
    return cuda::no_device_reason();
#else
    return "this build of muser has no CUDA backend (built without nvcc)";
#endif
  }, "Why cuda_device_count() is 0 ('' when it is not).");

  m.def("cuda_device_description", [](int ordinal) -> std::string {
#ifdef MUSER_HAVE_CUDA
    return cuda::device_description(ordinal);
#else
    (void)ordinal;
    no_cuda_build();
#endif
  }, nb::arg("device") = 0);

  m.def("cuda_memory_info", [](int ordinal) -> std::vector<size_t> {
#ifdef MUSER_HAVE_CUDA
    return cuda::memory_info(ordinal);
#else
    (void)ordinal;
    no_cuda_build();
#endif
  }, nb::arg("device") = 0, "(free, total) bytes of the GPU's memory (cudaMemGetInfo).");

  m.def("cuda_read_bandwidth", [](uint64_t nbytes, int iters, int ordinal, bool held) -> std::vector<double> {
#ifdef MUSER_HAVE_CUDA
    nb::gil_scoped_release release;
    return cuda::read_bandwidth_seconds((size_t)nbytes, iters, ordinal, held);
#else
    (void)nbytes, (void)iters, (void)ordinal, (void)held;
    no_cuda_build();
#endif
  }, nb::arg("nbytes"), nb::arg("iters"), nb::arg("device") = 0, nb::arg("held") = false,
  "Seconds of each of `iters` passes of a read-only kernel over an nbytes buffer (the read limit); "
  "held: each pass enqueued behind a kernel that holds the stream, so no host launch latency is timed.");

  m.def("cuda_run", [](std::shared_ptr<Head> h, std::optional<AnyArray> hidden, uint64_t hidden_ptr, int64_t t,
                       bool squeeze, bool profile, bool check_finite) -> nb::tuple {
#ifdef MUSER_HAVE_CUDA
    cuda::CudaDevice& dev = cuda_device_of(*h);
    const int64_t V = h->spec().vocab;
    std::vector<NodeTiming> timings;
    std::shared_ptr<cuda::DeviceMemory> logits;
    {
      nb::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(h->mutex());
      const HiddenInput in = resolve_hidden(*h, dev, hidden, hidden_ptr, t, check_finite);
      logits = dev.run_to_device(h->nodes(), h->options().acts, in.ptr, in.on_device, (int)t,
                                 profile ? &timings : nullptr);
    }
    struct Owner {
      std::shared_ptr<cuda::DeviceMemory> mem;
      std::shared_ptr<Head> head;
    };
    auto* owner = new Owner{logits, h};
    nb::capsule cap(owner, [](void* p) noexcept { delete static_cast<Owner*>(p); });
    size_t shape[2] = {(size_t)t, (size_t)V};
    if (squeeze) shape[0] = (size_t)V;
    // array_api: an object with __dlpack__/__dlpack_device__ (without a
    // framework nanobind 3 would hand out a bare, single-use DLPack capsule)
    nb::ndarray<nb::array_api, float, nb::device::cuda> view(logits->ptr, squeeze ? 1 : 2, shape, cap, nullptr,
                                                             nb::dtype<float>(), nb::device::cuda::value,
                                                             dev.ordinal());
    return nb::make_tuple(nb::cast(view), (uint64_t)(uintptr_t)logits->ptr, profile_list(timings));
#else
    (void)h, (void)hidden, (void)hidden_ptr, (void)t, (void)squeeze, (void)profile, (void)check_finite;
    no_cuda_build();
#endif
  }, nb::arg("head"), nb::arg("hidden").none(), nb::arg("hidden_ptr"), nb::arg("t"), nb::arg("squeeze"),
  nb::arg("profile"), nb::arg("check_finite"),
  "Run the head's route on the GPU; returns (device ndarray of the logits, its address, profile). "
  "The logits are a pooled device buffer no one else holds; later calls never write it while a view lives.");

  m.def("cuda_route_seconds", [](std::shared_ptr<Head> h, std::optional<AnyArray> hidden, uint64_t hidden_ptr,
                                 int64_t t, int reps, bool check_finite, bool held) -> std::vector<double> {
#ifdef MUSER_HAVE_CUDA
    cuda::CudaDevice& dev = cuda_device_of(*h);
    nb::gil_scoped_release release;
    std::lock_guard<std::mutex> lock(h->mutex());
    const HiddenInput in = resolve_hidden(*h, dev, hidden, hidden_ptr, t, check_finite);
    return dev.route_seconds(h->nodes(), h->options().acts, in.ptr, in.on_device, (int)t, reps, held);
#else
    (void)h, (void)hidden, (void)hidden_ptr, (void)t, (void)reps, (void)check_finite, (void)held;
    no_cuda_build();
#endif
  }, nb::arg("head"), nb::arg("hidden").none(), nb::arg("hidden_ptr"), nb::arg("t"), nb::arg("reps"),
  nb::arg("check_finite"), nb::arg("held") = false,
  "Device seconds of each of `reps` runs of the whole route, launched as for a call (one CUDA graph), "
  "after one untimed call; held: each run enqueued behind a kernel that holds the stream.");

  m.def("cuda_topk", [](std::shared_ptr<Head> h, std::optional<AnyArray> hidden, uint64_t hidden_ptr, int64_t t,
                        int k, bool check_finite) -> nb::tuple {
#ifdef MUSER_HAVE_CUDA
    cuda::CudaDevice& dev = cuda_device_of(*h);
    const int64_t V = h->spec().vocab;
    if (k < 1 || k > V || k > kTopkMax)
      throw ArgValueError("k must be in [1, min(V, " + std::to_string(kTopkMax) + ")] for top-k on the GPU, got " +
                          std::to_string(k));
    std::vector<int64_t> ids((size_t)(t * k));
    std::vector<float> vals((size_t)(t * k));
    {
      nb::gil_scoped_release release;
      std::lock_guard<std::mutex> lock(h->mutex());
      const HiddenInput in = resolve_hidden(*h, dev, hidden, hidden_ptr, t, check_finite);
      auto logits = dev.run_to_device(h->nodes(), h->options().acts, in.ptr, in.on_device, (int)t, nullptr);
      dev.topk(static_cast<const float*>(logits->ptr), (int)t, k, ids.data(), vals.data());
    }
    return nb::make_tuple(ids, vals);
#else
    (void)h, (void)hidden, (void)hidden_ptr, (void)t, (void)k, (void)check_finite;
    no_cuda_build();
#endif
  }, nb::arg("head"), nb::arg("hidden").none(), nb::arg("hidden_ptr"), nb::arg("t"), nb::arg("k"),
  nb::arg("check_finite"), "Run the route and rank each row on the GPU; only (ids, values) [t*k] come back.");

  m.def("cuda_copy_to_host", [](uint64_t ptr, int64_t count) {
#ifdef MUSER_HAVE_CUDA
    auto* data = new float[(size_t)std::max<int64_t>(count, 1)];
    nb::capsule owner(data, [](void* p) noexcept { delete[] static_cast<float*>(p); });
    {
      nb::gil_scoped_release release;
      cuda::copy_to_host(reinterpret_cast<const void*>((uintptr_t)ptr), data, (size_t)count * sizeof(float));
    }
    size_t shape[1] = {(size_t)count};
    return nb::ndarray<nb::numpy, float>(data, 1, shape, owner);
#else
    (void)ptr, (void)count;
    no_cuda_build();
#endif
  }, nb::arg("ptr"), nb::arg("count"), "A new numpy copy of `count` float32 at a device address.");

  m.def("cuda_array_info", [](AnyArray a) {
    // For objects that speak only DLPack: (address, shape, strides in elements, dtype, device type, device id)
    nb::list shape, strides;
    for (size_t i = 0; i < a.ndim(); ++i) {
      shape.append(a.shape(i));
      strides.append(a.stride(i));
    }
    const bool f32 = a.dtype() == nb::dtype<float>();
    return nb::make_tuple((uint64_t)(uintptr_t)a.data(), nb::tuple(shape), nb::tuple(strides),
                          f32 ? "float32" : "other", a.device_type(), a.device_id());
  }, nb::arg("array"));
}

}  // namespace muser::py
