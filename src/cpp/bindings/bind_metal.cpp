// The Metal backend's test hooks (tests/test_metal.py), present only in a
// build with the Metal backend: drop one barrier (the emulator must report
// the hazard), cap the weight views' length (the split into views), read the
// pipeline count (the cache is reused) and, against the emulator, its own
// settings (the OS version it claims, a failing command buffer).
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"

#ifdef MUSER_HAVE_METAL
#include "metal_device.h"
#endif
#ifdef MUSER_METAL_EMULATOR
#include "muser_metal_emulator.h"
#endif

namespace nb = nanobind;

namespace muser::py {

void bind_metal(nb::module_& m) {
#ifdef MUSER_HAVE_METAL
  m.def("metal_read_bandwidth", [](uint64_t nbytes, int iters) -> std::vector<double> {
    nb::gil_scoped_release release;
    return metal::read_bandwidth_seconds((size_t)nbytes, iters);
  }, nb::arg("nbytes"), nb::arg("iters"),
     "GPU seconds of each of `iters` reads of an nbytes shared buffer by read_bandwidth_u32 (bench/metal_head.py's limit).");
  m.def("_metal_test_drop_barrier", [](int n) { metal::test_set_drop_barrier(n); }, nb::arg("n"),
        "Test only: every later Metal run omits the barrier before its n-th dispatch (-1: none omitted).");
  m.def("_metal_test_max_buffer_length", [](uint64_t bytes) { metal::test_set_max_buffer_length(bytes); },
        nb::arg("bytes"), "Test only: Metal heads loaded later wrap the weight in views of at most this many bytes.");
  m.def("_metal_test_library_source", [](const std::string& s) { metal::test_set_library_source(s); },
        "Test only: the next Metal device compiles this library source.");
  m.def("_metal_test_buffer_length_at", [](uintptr_t p) { return metal::test_buffer_length_at((const void*)p); },
        "Test only: the length of the live MTLBuffer whose contents start at this address (0: none).");
  m.def("_metal_test_stats", [] {
    nb::dict d;
    d["pipelines_built"] = metal::test_pipelines_built();
    d["device_draws"] = metal::test_device_draws();
    d["weight_views"] = metal::test_weight_views();
    d["weights_no_copy"] = metal::test_weights_no_copy();
    return d;
  });
#endif
#ifdef MUSER_METAL_EMULATOR
  m.def("_metal_emu_set_os_version", [](int major, int minor) { muser_metal_emu_set_os_version(major, minor); });
  m.def("_metal_emu_fail_next_command_buffer",
        [](const std::string& msg) { muser_metal_emu_fail_next_command_buffer(msg.c_str()); });
  m.def("_metal_emu_set_no_device", [](bool v) { muser_metal_emu_set_no_device(v ? 1 : 0); });
  m.def("_metal_emu_last_error", [] { return std::string(muser_metal_emu_last_error()); });
  m.def("_metal_emu_reset", [] { muser_metal_emu_reset(); });
  m.def("_metal_emu_set_page_size", [](size_t bytes) { muser_metal_emu_set_page_size(bytes); });
#endif
  (void)m;
}

}  // namespace muser::py
