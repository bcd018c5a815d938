#include "cpu/isa.h"

#include <cstdlib>
#include <cstring>

#include "errors.h"

#if defined(MUSER_X86) && defined(__clang__) && __clang_major__ < 15
#include <cpuid.h>
#endif

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

#if defined(MUSER_X86) && defined(__clang__) && __clang_major__ < 15
// clang before 15 has no "f16c" for __builtin_cpu_supports (the emulator's
// build uses Debian's clang 14): CPUID leaf 1, ECX bit 29
static bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#elif defined(MUSER_X86)
static bool cpu_has_f16c() { return __builtin_cpu_supports("f16c"); }
#endif

std::vector<Isa> available_isas() {
  std::vector<Isa> out{Isa::Scalar};
#if defined(MUSER_X86) && (defined(__GNUC__) || defined(__clang__))
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
                    cpu_has_f16c() && __builtin_cpu_supports("bmi2");
  if (avx2) out.push_back(Isa::Avx2);
  // the AVX-512 twins use VNNI (int8 dot products) and VBMI (byte permutes):
  // Ice Lake, Sapphire Rapids, Zen 4 and later
  if (avx2 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512vbmi"))
    out.push_back(Isa::Avx512);
#elif defined(__aarch64__) && defined(__ARM_NEON)
  out.push_back(Isa::Neon);
#endif
  return out;
}

Isa isa_by_name(const std::string& name) {
  std::string choices;
  for (Isa i : available_isas()) {
    if (name == isa_name(i)) return i;
    choices += (choices.empty() ? "" : ", ") + std::string(isa_name(i));
  }
  throw ArgValueError("isa '" + name + "' is not available on this machine/build (available: " + choices + ")");
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
