#include "cpu/isa.h"

#include <cstdlib>
#include <cstring>

#if defined(MUSER_X86)
#include <cpuid.h>
#endif

#include "errors.h"

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

#if defined(MUSER_X86)
// CPUID and XGETBV read directly, the way libgcc's __builtin_cpu_supports
// does, so GCC and clang builds decide alike (clang's builtin does not know
// "f16c"). A vector feature only counts when the OS saves its registers:
// XMM|YMM state in XCR0 for the AVX family (FMA and F16C included), and
// opmask|ZMM state as well for AVX-512. tests/cpp/test_isa.cpp checks every
// bit against the compiler's builtin.
X86Features x86_features() {
  X86Features f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const unsigned ecx1 = c;
  bool avx_os = false, avx512_os = false;
  if (ecx1 & (1u << 27)) {  // OSXSAVE: XGETBV is usable
    unsigned xlo = 0, xhi = 0;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    avx_os = (xlo & 0x6) == 0x6;        // XMM, YMM
    avx512_os = (xlo & 0xe6) == 0xe6;   // and opmask, ZMM_Hi256, Hi16_ZMM
  }
  unsigned ebx7 = 0, ecx7 = 0;
  if (__get_cpuid_max(0, nullptr) >= 7) {
    __cpuid_count(7, 0, a, b, c, d);
    ebx7 = b;
    ecx7 = c;
  }
  const auto bit = [](unsigned r, int i) { return ((r >> i) & 1u) != 0; };
  f.bmi2 = bit(ebx7, 8);
  if (avx_os) {
    f.fma = bit(ecx1, 12);
    f.f16c = bit(ecx1, 29);
    f.avx2 = bit(ebx7, 5);
  }
  if (avx512_os) {
    f.avx512f = bit(ebx7, 16);
    f.avx512dq = bit(ebx7, 17);
    f.avx512bw = bit(ebx7, 30);
    f.avx512vl = bit(ebx7, 31);
    f.avx512vbmi = bit(ecx7, 1);
    f.avx512vnni = bit(ecx7, 11);
  }
  return f;
}
#endif

std::vector<Isa> available_isas() {
  std::vector<Isa> out{Isa::Scalar};
#if defined(MUSER_X86)
  const X86Features f = x86_features();
  const bool avx2 = f.avx2 && f.fma && f.f16c && f.bmi2;
  if (avx2) out.push_back(Isa::Avx2);
  // the AVX-512 twins use VNNI (int8 dot products) and VBMI (byte permutes):
  // Ice Lake, Sapphire Rapids, Zen 4 and later
  if (avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512vnni && f.avx512vbmi)
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
