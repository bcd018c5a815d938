// The CUDA backend's own helpers the tests and the benches need (device
// count, description, the read-bandwidth kernel, memory info, copies by
// address). Running a head -- resident logits, top-k on the device -- goes
// through the Device interface (bind_device.cpp), never through here.
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

#include "arrays.h"
#include "bindings.h"
#include "errors.h"

#ifdef MUSER_HAVE_CUDA
#include "cuda_device.h"
#endif

namespace nb = nanobind;

namespace muser::py {

namespace {

[[noreturn]] void no_cuda_build() {
  throw DeviceError("this build of muser has no CUDA backend (it was built without nvcc)");
}


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

  m.def("cuda_stream_wait", [](uint64_t waiter, uint64_t waited) {
#ifdef MUSER_HAVE_CUDA
    cuda::stream_wait((uintptr_t)waiter, (uintptr_t)waited);
#else
    (void)waiter, (void)waited;
    no_cuda_build();
#endif
  }, nb::arg("waiter"), nb::arg("waited"),
  "Makes CUDA stream `waiter` wait for the work queued so far on stream `waited` (handles).");

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
