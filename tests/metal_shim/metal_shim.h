// A host-compiler stand-in for the Metal Shading Language, as much of it as
// the shared kernel headers (src/cpp/muser/) may use. Compiling those headers
// against this file with the host's standard library switched off
// (-nostdinc -nostdinc++: check_headers.cmake) makes every construct Metal
// lacks a compile error on Linux: `std::`, <cstring>, memcpy, a pointer
// without its address space passed where MSL needs one.
//
// Written to be built on: the Metal issue's CPU emulator (tests/metal_emulator/)
// runs the .metal kernels compiled as C++ against this same file, giving the
// SIMD-group and threadgroup calls their meaning through muser_metal_shim::hooks.
// Arithmetic here is the IEEE operation MSL's safe math mode specifies.
#pragma once

#define __METAL_VERSION__ 310

// ---- address spaces: clang's address_space attribute, so a device pointer does
// not convert to a thread one (Metal's rule); empty under other compilers.
#if defined(__clang__)
#define device __attribute__((address_space(1)))
#define constant __attribute__((address_space(2)))
#define threadgroup __attribute__((address_space(3)))
#else
#define device
#define constant
#define threadgroup
#endif
#define thread  // MSL's default for locals; the host's generic address space

// Kernel-function spellings of .metal files (attributes are MSL's own).
#define kernel

// ---- scalar types by their MSL names ----
typedef signed char int8_t;
typedef unsigned char uint8_t;
typedef short int16_t;
typedef unsigned short uint16_t;
typedef int int32_t;
typedef unsigned int uint32_t;
typedef long int64_t;
typedef unsigned long uint64_t;
typedef unsigned char uchar;
typedef unsigned short ushort;
typedef unsigned int uint;
typedef unsigned long ulong;
typedef decltype(sizeof(0)) size_t;
typedef decltype((int*)0 - (int*)0) ptrdiff_t;

namespace metal {

// Reinterpret the bits of a value of the same size (MSL's as_type).
template <class To, class From>
inline To as_type(From v) {
  static_assert(sizeof(To) == sizeof(From), "as_type needs equal sizes");
  return __builtin_bit_cast(To, v);
}

inline float fma(float a, float b, float c) { return __builtin_fmaf(a, b, c); }
inline float abs(float x) { return __builtin_fabsf(x); }
inline float min(float a, float b) { return __builtin_fminf(a, b); }
inline float max(float a, float b) { return __builtin_fmaxf(a, b); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

namespace precise {
inline float sqrt(float x) { return __builtin_sqrtf(x); }
inline float tanh(float x) { return __builtin_tanhf(x); }
inline float exp(float x) { return __builtin_expf(x); }
inline float divide(float a, float b) { return a / b; }
}  // namespace precise

enum class mem_flags { mem_none = 0, mem_device = 1, mem_threadgroup = 2, mem_texture = 4 };

}  // namespace metal

// What only a scheduler of SIMD-groups and threadgroups can do: the emulator
// fills these in; a shader calling them outside it fails loudly (null call).
namespace muser_metal_shim {
struct Hooks {
  uint32_t (*simd_shuffle_xor)(uint32_t value, ushort lane_mask);
  uint32_t (*simd_shuffle_down)(uint32_t value, ushort delta);
  void (*threadgroup_barrier)(metal::mem_flags flags);
};
inline Hooks hooks = {nullptr, nullptr, nullptr};
}  // namespace muser_metal_shim

namespace metal {
template <class T>
inline T simd_shuffle_xor(T value, ushort lane_mask) {
  static_assert(sizeof(T) == 4, "the shim shuffles 32-bit values");
  return as_type<T>(muser_metal_shim::hooks.simd_shuffle_xor(as_type<uint32_t>(value), lane_mask));
}
template <class T>
inline T simd_shuffle_down(T value, ushort delta) {
  static_assert(sizeof(T) == 4, "the shim shuffles 32-bit values");
  return as_type<T>(muser_metal_shim::hooks.simd_shuffle_down(as_type<uint32_t>(value), delta));
}
inline void threadgroup_barrier(mem_flags flags) { muser_metal_shim::hooks.threadgroup_barrier(flags); }
}  // namespace metal
