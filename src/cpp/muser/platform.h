// Portability layer of the shared kernel headers (src/cpp/muser/): they
// compile unchanged as host C++, as CUDA device code and as Metal Shading
// Language. Every header here includes this one and no library header, so a
// construct only one language has fails the shim check
// (tests/metal_shim/, ctest muser_metal_shim) instead of on a Mac.
//
// What the shared headers may use, by language:
//   MUSER_HD              inline, __host__ __device__ __forceinline__ on CUDA
//   MUSER_DEVICE, MUSER_THREADGROUP, MUSER_THREAD, MUSER_CONSTANT
//                         MSL address spaces; empty on C++/CUDA. Never the bare
//                         keywords (`thread`, `device` clash with C++ names).
//   muser::bits_to_f32 / f32_to_bits   bit casts (memcpy; as_type on Metal)
//   fmaf, sqrtf           one rounding each; on Metal mapped to metal::fma /
//                         metal::precise::sqrt (fast math is off there)
//   MUSER_OFFSETOF        offsetof without <cstddef>
//   fixed-width integers  MSL defines the same names
#pragma once

#if defined(__METAL_VERSION__)

#include <metal_stdlib>

#define MUSER_HD inline
#define MUSER_DEVICE device
#define MUSER_THREADGROUP threadgroup
#define MUSER_THREAD thread
#define MUSER_CONSTANT constant

namespace muser {
MUSER_HD float bits_to_f32(uint32_t u) { return metal::as_type<float>(u); }
MUSER_HD uint32_t f32_to_bits(float f) { return metal::as_type<uint32_t>(f); }
}  // namespace muser
// The C names the shared headers spell, with the rounding they have in C.
MUSER_HD float fmaf(float a, float b, float c) { return metal::fma(a, b, c); }
MUSER_HD float sqrtf(float x) { return metal::precise::sqrt(x); }

#else  // host C++ and CUDA

#include <math.h>
#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define MUSER_HD __host__ __device__ __forceinline__
#else
#define MUSER_HD inline
#endif
#define MUSER_DEVICE
#define MUSER_THREADGROUP
#define MUSER_THREAD
#define MUSER_CONSTANT

// memcpy, not __uint_as_float: nvcc folds both into a register move, and
// this keeps the CUDA code what it was.
namespace muser {
MUSER_HD float bits_to_f32(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}
MUSER_HD uint32_t f32_to_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}
}  // namespace muser

#endif  // __METAL_VERSION__

#define MUSER_OFFSETOF(type, field) __builtin_offsetof(type, field)
