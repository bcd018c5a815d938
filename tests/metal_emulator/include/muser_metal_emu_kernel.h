// What a .metal kernel compiled as C++ for the test-only Metal emulator sees
// besides the Metal shim (tests/metal_shim/metal_shim.h): the emulator ABI and
// the MSL SIMD-group calls the shim leaves out, added here (not in the shim)
// so the shim stays the other branch's file. Included by kernel_abi.h.
#pragma once

#include "metal_shim.h"
#include "muser_metal_emu_abi.h"

namespace metal {
// Sums of the active lanes, in the butterfly order xor 16, 8, 4, 2, 1 (real
// hardware's order is unspecified: the canonical route never uses simd_sum).
inline float simd_sum(float v) {
  return as_type<float>(muser_emu_simd(MUSER_EMU_SIMD_SUM_F32, as_type<uint32_t>(v), 0));
}
inline int simd_sum(int v) { return as_type<int>(muser_emu_simd(MUSER_EMU_SIMD_SUM_I32, as_type<uint32_t>(v), 0)); }
inline uint simd_sum(uint v) { return muser_emu_simd(MUSER_EMU_SIMD_SUM_I32, v, 0); }
inline float simd_max(float v) {
  return as_type<float>(muser_emu_simd(MUSER_EMU_SIMD_MAX_F32, as_type<uint32_t>(v), 0));
}
inline float simd_min(float v) {
  return as_type<float>(muser_emu_simd(MUSER_EMU_SIMD_MIN_F32, as_type<uint32_t>(v), 0));
}
template <class T>
inline T simd_shuffle(T value, ushort lane) {
  static_assert(sizeof(T) == 4, "the emulator shuffles 32-bit values");
  return as_type<T>(muser_emu_simd(MUSER_EMU_SIMD_SHUFFLE, as_type<uint32_t>(value), lane));
}
template <class T>
inline T simd_broadcast(T value, ushort lane) {
  return simd_shuffle(value, lane);
}
template <class T>
inline T simd_shuffle_up(T value, ushort delta) {
  static_assert(sizeof(T) == 4, "the emulator shuffles 32-bit values");
  return as_type<T>(muser_emu_simd(MUSER_EMU_SIMD_UP, as_type<uint32_t>(value), delta));
}
}  // namespace metal
