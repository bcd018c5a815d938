// The SIMD ISAs this machine runs (every available one but Scalar): the ones
// whose twins the C++ tests hold against the scalar definitions.
#pragma once
#include <vector>

#include "cpu/isa.h"

inline std::vector<muser::cpu::Isa> simd_isas() {
  std::vector<muser::cpu::Isa> out;
  for (muser::cpu::Isa i : muser::cpu::available_isas())
    if (i != muser::cpu::Isa::Scalar) out.push_back(i);
  return out;
}
