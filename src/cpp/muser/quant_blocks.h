// One definition of every block format muser reads. Plain named fields, one
// static_assert per size and per offset a kernel uses; host C++, CUDA and
// Metal compile this same file (platform.h; checked on every build by the
// Metal shim, tests/metal_shim/). Host-only facts about the types (names,
// which ones muser multiplies) are in src/cpp/quant_types.h.
//
// Layouts follow the GGUF/ggml on-disk formats byte for byte.
#pragma once
#include "platform.h"

namespace muser {

// Elements per block of each K-quant ("super-block") and of the legacy quants.
MUSER_CONSTANT constexpr int kQK_K = 256;
MUSER_CONSTANT constexpr int kQK8_0 = 32;
MUSER_CONSTANT constexpr int kKScaleBytes = 12;  // packed 6-bit scales and mins of Q4_K/Q5_K

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

// Bytes of one block (one element for the float types) of each type the
// kernels read; 0 for any other. quant_types.h's type table uses it.
MUSER_HD constexpr int block_bytes(uint32_t type) {
  return type == (uint32_t)GgmlType::F32                                           ? 4
         : type == (uint32_t)GgmlType::F16 || type == (uint32_t)GgmlType::BF16   ? 2
         : type == (uint32_t)GgmlType::Q8_0                                      ? (int)sizeof(BlockQ8_0)
         : type == (uint32_t)GgmlType::Q4_K                                      ? (int)sizeof(BlockQ4_K)
         : type == (uint32_t)GgmlType::Q5_K                                      ? (int)sizeof(BlockQ5_K)
         : type == (uint32_t)GgmlType::Q6_K                                      ? (int)sizeof(BlockQ6_K)
                                                                                 : 0;
}

// Byte offsets the device kernels address blocks by (they read raw bytes:
// Q6_K and Q8_0 blocks are only 2-byte aligned).
MUSER_CONSTANT constexpr int kKQuantHeaderBytes = 4 + kKScaleBytes;  // d, dmin, scales of Q4_K/Q5_K
static_assert(MUSER_OFFSETOF(BlockQ4_K, qs) == kKQuantHeaderBytes, "Q4_K quants follow the header");
static_assert(MUSER_OFFSETOF(BlockQ5_K, qh) == kKQuantHeaderBytes, "Q5_K high bits follow the header");
MUSER_CONSTANT constexpr int kQ5KQsOffset = (int)MUSER_OFFSETOF(BlockQ5_K, qs);      // 48
MUSER_CONSTANT constexpr int kQ6KQhOffset = (int)MUSER_OFFSETOF(BlockQ6_K, qh);      // 128
MUSER_CONSTANT constexpr int kQ6KScalesOffset = (int)MUSER_OFFSETOF(BlockQ6_K, scales);  // 192
MUSER_CONSTANT constexpr int kQ6KDOffset = (int)MUSER_OFFSETOF(BlockQ6_K, d);        // 208
MUSER_CONSTANT constexpr int kQ8_0QsOffset = (int)MUSER_OFFSETOF(BlockQ8_0, qs);     // 2

// ---- scalar conversions (exact, branch-light, usable on device) ----

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

// ---- the 6-bit (scale, min) pairs of Q4_K/Q5_K: the one unpacker ----
// The 12 scale bytes as three little-endian words w0 w1 w2: bytes 0-3 hold
// the scales of sub-blocks 0-3 (low 6 bits) and the top 2 bits of scales
// 4-7; bytes 4-7 the same for the mins; bytes 8-11 the low 4 bits of scale
// j+4 (low nibble) and min j+4 (high nibble). Both halves below work on a
// whole word (4 sub-blocks at once) or on one byte in a word.

// Values of sub-blocks 0-3 from bytes 0-3 (scales) or 4-7 (mins).
MUSER_HD uint32_t kscale_low(uint32_t w) { return w & 0x3f3f3f3fu; }
// Values of sub-blocks 4-7: low 4 bits from `nibbles` (bytes 8-11, shifted
// right by 4 for the mins), top 2 bits from the top of `tops` (bytes 0-3 for
// the scales, 4-7 for the mins).
MUSER_HD uint32_t kscale_high(uint32_t nibbles, uint32_t tops) {
  return (nibbles & 0x0f0f0f0fu) | ((tops >> 2) & 0x30303030u);
}

// All 8 pairs, one byte each: byte j%4 of sc[j/4] / m[j/4] is sub-block j's.
struct KScaleWords {
  uint32_t sc[2], m[2];
};
MUSER_HD KScaleWords kquant_scale_words(uint32_t w0, uint32_t w1, uint32_t w2) {
  KScaleWords k;
  k.sc[0] = kscale_low(w0);
  k.m[0] = kscale_low(w1);
  k.sc[1] = kscale_high(w2, w0);
  k.m[1] = kscale_high(w2 >> 4, w1);
  return k;
}

// The j-th pair from the bytes at q (any address space): the same halves,
// on the two bytes pair j draws from.
template <class P, class O>
MUSER_HD void k_scale_min(int j, P q, O sc, O m) {
  if (j < 4) {
    *sc = (uint8_t)kscale_low(q[j]);
    *m = (uint8_t)kscale_low(q[j + 4]);
  } else {
    *sc = (uint8_t)kscale_high(q[j + 4], q[j - 4]);
    *m = (uint8_t)kscale_high((uint32_t)q[j + 4] >> 4, q[j]);
  }
}

}  // namespace muser
