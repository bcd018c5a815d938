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

}  // namespace muser::cpu
