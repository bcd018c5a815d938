#include "cpu/isa.h"

#include <cstdlib>
#include <cstring>

namespace muser::cpu {

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
    case Isa::Neon: return "neon";
  }
  return "?";
}

std::vector<Isa> available_isas() {
  std::vector<Isa> out{Isa::Scalar};
#if defined(MUSER_X86) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    __builtin_cpu_supports("f16c") && __builtin_cpu_supports("bmi2");
  if (avx2) out.push_back(Isa::Avx2);
  if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vnni"))
    out.push_back(Isa::Avx512);
#elif defined(__aarch64__) || defined(__ARM_NEON)
  out.push_back(Isa::Neon);
#endif
  return out;
}

Isa active_isa() {
  static const Isa chosen = [] {
    const auto avail = available_isas();
    if (const char* want = std::getenv("MUSER_CPU_ISA")) {
      for (Isa i : avail)
        if (std::strcmp(isa_name(i), want) == 0) return i;
    }
    return avail.back();
  }();
  return chosen;
}

}  // namespace muser::cpu
