#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "bindings.h"
#include "cpu/isa.h"
#include "muser/kernel_args.h"
#include "quant_types.h"
#include "cpu/parallel.h"

namespace nb = nanobind;

namespace muser::py {

void bind_build_info(nb::module_& m) {
  m.def("build_info", [] {
    nb::dict d;
    d["version"] = MUSER_VERSION;
    d["cpu"] = true;
#ifdef MUSER_HAVE_CUDA
    d["cuda"] = true;
#else
    d["cuda"] = false;
#endif
#ifdef MUSER_HAVE_METAL
    d["metal"] = true;
#else
    d["metal"] = false;
#endif
    nb::list isas;
    for (auto isa : cpu::available_isas()) isas.append(cpu::isa_name(isa));
    d["cpu_isas"] = isas;
    d["cpu_isa_active"] = cpu::isa_name(cpu::active_isa());
    d["topk_max_k"] = kTopkMax;  // a device top-k ranks at most this many per row
    nb::list types;
    for (GgmlType t : kSupportedTypes) types.append(type_traits((uint32_t)t).name);
    d["weight_types"] = types;  // the types muser dequantizes and multiplies
    // what runs parallel_for (cpu/parallel.h), and the most threads= accepts
#if defined(__APPLE__)
    d["cpu_threading"] = "gcd";
#else
    d["cpu_threading"] = "pool";
#endif
    d["max_threads"] = cpu::kMaxThreads;
    d["default_threads"] = cpu::default_threads();
    return d;
  }, "What this build of muser contains: backends compiled in, CPU ISA paths, CPU threading, version, limits.");
}

}  // namespace muser::py
