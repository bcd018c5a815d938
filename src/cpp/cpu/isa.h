// Which CPU instruction-set paths this build has and this machine runs.
#pragma once
#include <string>
#include <vector>

namespace muser::cpu {

enum class Isa { Scalar = 0, Avx2 = 1, Avx512 = 2, Neon = 3 };

// Paths compiled into this build that the running CPU supports, best last.
std::vector<Isa> available_isas();
// The path kernels use: the best available, or the one named by the
// MUSER_CPU_ISA environment variable ("scalar", "avx2", "avx512", "neon")
// when that is available (tests use it to run every twin).
Isa active_isa();
const char* isa_name(Isa isa);
// The available path named `name`; throws ArgValueError naming the choices.
Isa isa_by_name(const std::string& name);

#if defined(MUSER_X86)
// The x86 features the SIMD twins need, as this CPU and OS provide them.
struct X86Features {
  bool avx2 = false, fma = false, f16c = false, bmi2 = false;
  bool avx512f = false, avx512bw = false, avx512vl = false, avx512dq = false;
  bool avx512vnni = false, avx512vbmi = false;
};
X86Features x86_features();
#endif

}  // namespace muser::cpu
