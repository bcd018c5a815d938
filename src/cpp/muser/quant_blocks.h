// One definition of every block format muser reads. Plain named fields, one
// static_assert per size; C++, CUDA and the CPU tests include this file, and
// the Metal shaders mirror it field for field (src/metal/kernels/).
//
// Layouts follow the GGUF/ggml on-disk formats byte for byte.
#pragma once
#include "platform.h"

namespace muser {

// Elements per block of each K-quant ("super-block") and of the legacy quants.
constexpr int kQK_K = 256;
constexpr int kQK8_0 = 32;
constexpr int kKScaleBytes = 12;  // packed 6-bit scales and mins of Q4_K/Q5_K

// Q8_0: 32 elements, x = d * qs[i].                                  34 bytes
struct BlockQ8_0 {
  uint16_t d;            // f16 scale
  int8_t qs[kQK8_0];     // signed quants
};
static_assert(sizeof(BlockQ8_0) == 34, "Q8_0 block is 34 bytes");

// Q4_K: 256 elements in 8 sub-blocks of 32; x = d*sc[j]*q - dmin*m[j].  144 bytes
struct BlockQ4_K {
  uint16_t d;                    // f16 super-block scale of the scales
  uint16_t dmin;                 // f16 super-block scale of the mins
  uint8_t scales[kKScaleBytes];  // 8 x (6-bit scale, 6-bit min), packed
  uint8_t qs[kQK_K / 2];         // 4-bit quants, two per byte
};
static_assert(sizeof(BlockQ4_K) == 144, "Q4_K block is 144 bytes");

// Q5_K: as Q4_K plus one high bit per element.                        176 bytes
struct BlockQ5_K {
  uint16_t d;                    // f16
  uint16_t dmin;                 // f16
  uint8_t scales[kKScaleBytes];  // 8 x (6-bit scale, 6-bit min), packed
  uint8_t qh[kQK_K / 8];         // bit j of qh[l] is the 5th bit of element 32*j + l
  uint8_t qs[kQK_K / 2];         // low 4 bits; byte 32*c + l holds elements 64c+l (lo), 64c+32+l (hi)
};
static_assert(sizeof(BlockQ5_K) == 176, "Q5_K block is 176 bytes");

// Q6_K: 256 elements in 16 sub-blocks of 16; x = d*scales[j]*(q-32).   210 bytes
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];       // low 4 bits
  uint8_t qh[kQK_K / 4];       // high 2 bits
  int8_t scales[kQK_K / 16];   // signed 8-bit sub-block scales
  uint16_t d;                  // f16 super-block scale
};
static_assert(sizeof(BlockQ6_K) == 210, "Q6_K block is 210 bytes");

// Q8_K: the activation format ggml's CPU uses against K-quant weights.  292 bytes
struct BlockQ8_K {
  float d;                     // f32 scale
  int8_t qs[kQK_K];            // quants
  int16_t bsums[kQK_K / 16];   // sums of groups of 16 quants
};
static_assert(sizeof(BlockQ8_K) == 292, "Q8_K block is 292 bytes");

// GGML type ids as stored in GGUF tensor infos (only those muser names).
enum class GgmlType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  BF16 = 30,
};

// Block geometry of a type: elements per block and bytes per block; {0,0} when
// muser does not know the type. Known-but-unsupported types still get their
// geometry so the GGUF reader can bounds-check every tensor in a file.
struct TypeTraits {
  const char* name;
  int block_elems;
  int block_bytes;
  bool supported;  // muser can dequantize / multiply it
};

MUSER_HD TypeTraits type_traits(uint32_t t) {
  switch (t) {
    case 0: return {"F32", 1, 4, true};
    case 1: return {"F16", 1, 2, true};
    case 2: return {"Q4_0", 32, 18, false};
    case 3: return {"Q4_1", 32, 20, false};
    case 6: return {"Q5_0", 32, 22, false};
    case 7: return {"Q5_1", 32, 24, false};
    case 8: return {"Q8_0", 32, 34, true};
    case 9: return {"Q8_1", 32, 36, false};
    case 10: return {"Q2_K", 256, 84, false};
    case 11: return {"Q3_K", 256, 110, false};
    case 12: return {"Q4_K", 256, 144, true};
    case 13: return {"Q5_K", 256, 176, true};
    case 14: return {"Q6_K", 256, 210, true};
    case 15: return {"Q8_K", 256, 292, false};
    case 16: return {"IQ2_XXS", 256, 66, false};
    case 17: return {"IQ2_XS", 256, 74, false};
    case 18: return {"IQ3_XXS", 256, 98, false};
    case 19: return {"IQ1_S", 256, 50, false};
    case 20: return {"IQ4_NL", 32, 18, false};
    case 21: return {"IQ3_S", 256, 110, false};
    case 22: return {"IQ2_S", 256, 82, false};
    case 23: return {"IQ4_XS", 256, 136, false};
    case 24: return {"I8", 1, 1, false};
    case 25: return {"I16", 1, 2, false};
    case 26: return {"I32", 1, 4, false};
    case 27: return {"I64", 1, 8, false};
    case 28: return {"F64", 1, 8, false};
    case 29: return {"IQ1_M", 256, 56, false};
    case 30: return {"BF16", 1, 2, true};
    case 34: return {"TQ1_0", 256, 54, false};
    case 35: return {"TQ2_0", 256, 66, false};
    case 39: return {"MXFP4", 32, 17, false};
    default: return {nullptr, 0, 0, false};
  }
}

// ---- scalar conversions (exact, branch-light, usable on device) ----

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

// IEEE half -> float, exact for every input (subnormals, inf, nan).
MUSER_HD float f16_to_f32(uint16_t h) {
  const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) return bits_to_f32(sign | 0x7f800000u | (mant << 13));
  if (exp != 0) return bits_to_f32(sign | ((exp + 112u) << 23) | (mant << 13));
  if (mant == 0) return bits_to_f32(sign);
  // subnormal half: value = mant * 2^-24, exactly representable in f32
  int e = 113;
  while ((mant & 0x400u) == 0) {
    mant <<= 1;
    --e;
  }
  mant &= 0x3ffu;
  return bits_to_f32(sign | ((uint32_t)e << 23) | (mant << 13));
}

// float -> IEEE half, round to nearest even (the conversion numpy and ggml use).
MUSER_HD uint16_t f32_to_f16(float f) {
  const uint32_t x = f32_to_bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t ax = x & 0x7fffffffu;
  if (ax >= 0x7f800000u) return (uint16_t)(sign | 0x7c00u | (ax > 0x7f800000u ? 0x200u : 0u));
  if (ax >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  // rounds to >= 65520 -> inf
  if (ax < 0x38800000u) {                                      // result is subnormal or zero
    if (ax < 0x33000000u) return (uint16_t)sign;               // < 2^-25 rounds to zero
    const uint32_t e = ax >> 23;
    const uint32_t m = (ax & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126u - e;  // 14..24 bits dropped
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1u);
    const uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return (uint16_t)(sign | r);
  }
  uint32_t r = ((ax >> 13) - (112u << 10));
  const uint32_t rem = ax & 0x1fffu;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return (uint16_t)(sign | r);
}

MUSER_HD float bf16_to_f32(uint16_t h) { return bits_to_f32((uint32_t)h << 16); }

// ggml's nearest_int: round to nearest, ties to even, for |v| <= 2^22 by
// adding 1.5*2^23 and reading the low mantissa bits. Outside that range it
// returns ggml's same garbage (callers clamp), never undefined behaviour.
// The quantizers and the q8 activation quantizer both use it.
MUSER_HD int nearest_int(float v) {
  const float shifted = v + 12582912.0f;
  return (int)(f32_to_bits(shifted) & 0x007fffffu) - 0x00400000;
}

// Unpack the j-th (scale, min) pair of the 12-byte K-quant scale field.
MUSER_HD void k_scale_min(int j, const uint8_t* q, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

}  // namespace muser
