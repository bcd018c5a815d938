// The host's facts about ggml types: names, block geometry, which types muser
// multiplies (one table, which every "supported: ..." message is built from)
// and the row dequantizer. Host C++ only; the block layouts themselves and the
// element decoders are shared with the kernels (muser/quant_blocks.h,
// muser/dequant.h).
#pragma once
#include <cstdint>
#include <cstring>
#include <string>

#include "muser/dequant.h"
#include "muser/quant_blocks.h"

namespace muser {

// The types muser dequantizes and multiplies, in the order messages list them.
inline constexpr GgmlType kSupportedTypes[] = {GgmlType::F32,  GgmlType::F16,  GgmlType::BF16, GgmlType::Q8_0,
                                               GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};
// The weight types acts="q8" quantizes activations for (ggml's vec_dot_type exists).
inline constexpr GgmlType kQ8Types[] = {GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K};

template <size_t N>
constexpr bool type_in(const GgmlType (&list)[N], uint32_t t) {
  for (GgmlType x : list)
    if ((uint32_t)x == t) return true;
  return false;
}
constexpr bool is_supported_type(uint32_t t) { return type_in(kSupportedTypes, t); }
constexpr bool is_q8_type(uint32_t t) { return type_in(kQ8Types, t); }

// Block geometry of a type: elements per block and bytes per block; {0,0} when
// muser does not know the type. Known-but-unsupported types still get their
// geometry so the GGUF reader can bounds-check every tensor in a file.
struct TypeTraits {
  const char* name;
  int block_elems;
  int block_bytes;
  bool supported;  // in kSupportedTypes: muser can dequantize / multiply it
};

constexpr TypeTraits type_traits(uint32_t t) {
  auto tt = [t](const char* name, int elems, int bytes) { return TypeTraits{name, elems, bytes, is_supported_type(t)}; };
  switch (t) {
    case 0: return tt("F32", 1, 4);
    case 1: return tt("F16", 1, 2);
    case 2: return tt("Q4_0", 32, 18);
    case 3: return tt("Q4_1", 32, 20);
    case 6: return tt("Q5_0", 32, 22);
    case 7: return tt("Q5_1", 32, 24);
    case 8: return tt("Q8_0", kQK8_0, (int)sizeof(BlockQ8_0));
    case 9: return tt("Q8_1", 32, 36);
    case 10: return tt("Q2_K", 256, 84);
    case 11: return tt("Q3_K", 256, 110);
    case 12: return tt("Q4_K", kQK_K, (int)sizeof(BlockQ4_K));
    case 13: return tt("Q5_K", kQK_K, (int)sizeof(BlockQ5_K));
    case 14: return tt("Q6_K", kQK_K, (int)sizeof(BlockQ6_K));
    case 15: return tt("Q8_K", kQK_K, (int)sizeof(BlockQ8_K));
    case 16: return tt("IQ2_XXS", 256, 66);
    case 17: return tt("IQ2_XS", 256, 74);
    case 18: return tt("IQ3_XXS", 256, 98);
    case 19: return tt("IQ1_S", 256, 50);
    case 20: return tt("IQ4_NL", 32, 18);
    case 21: return tt("IQ3_S", 256, 110);
    case 22: return tt("IQ2_S", 256, 82);
    case 23: return tt("IQ4_XS", 256, 136);
    case 24: return tt("I8", 1, 1);
    case 25: return tt("I16", 1, 2);
    case 26: return tt("I32", 1, 4);
    case 27: return tt("I64", 1, 8);
    case 28: return tt("F64", 1, 8);
    case 29: return tt("IQ1_M", 256, 56);
    case 30: return tt("BF16", 1, 2);
    case 34: return tt("TQ1_0", 256, 54);
    case 35: return tt("TQ2_0", 256, 66);
    case 39: return tt("MXFP4", 32, 17);
    default: return {nullptr, 0, 0, false};
  }
}

// "F32, F16, BF16, Q8_0, Q4_K, Q5_K, Q6_K": a type table as message text.
template <size_t N>
std::string type_list(const GgmlType (&list)[N]) {
  std::string s;
  for (GgmlType x : list) {
    if (!s.empty()) s += ", ";
    s += type_traits((uint32_t)x).name;
  }
  return s;
}
inline std::string supported_type_list() { return type_list(kSupportedTypes); }
inline std::string q8_type_list() { return type_list(kQ8Types); }

// Dequantize n elements (a multiple of the type's block size) of a row that
// starts at `row`. Returns false for a type muser cannot decode.
inline bool dequant_row(uint32_t type, const void* row, int64_t n, float* out) {
  const uint8_t* p = static_cast<const uint8_t*>(row);
  // whole blocks of Block through its decoder (n / elems of them)
  auto blocks = [&](auto block_tag, int elems, auto decode) {
    using Block = decltype(block_tag);
    for (int64_t b = 0; b < n / elems; ++b) decode(reinterpret_cast<const Block*>(p) + b, out + b * elems);
    return true;
  };
  // 16-bit floats (read unaligned) through their widening
  auto halves = [&](float (*widen)(uint16_t)) {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t h;
      memcpy(&h, p + 2 * i, 2);
      out[i] = widen(h);
    }
    return true;
  };
  switch (type) {
    case (uint32_t)GgmlType::F32: memcpy(out, p, (size_t)n * 4); return true;
    case (uint32_t)GgmlType::F16: return halves(f16_to_f32);
    case (uint32_t)GgmlType::BF16: return halves(bf16_to_f32);
    case (uint32_t)GgmlType::Q8_0: return blocks(BlockQ8_0{}, kQK8_0, [](auto b, float* o) { dequant_block_q8_0(b, o); });
    case (uint32_t)GgmlType::Q4_K: return blocks(BlockQ4_K{}, kQK_K, [](auto b, float* o) { dequant_block_q4_k(b, o); });
    case (uint32_t)GgmlType::Q5_K: return blocks(BlockQ5_K{}, kQK_K, [](auto b, float* o) { dequant_block_q5_k(b, o); });
    case (uint32_t)GgmlType::Q6_K: return blocks(BlockQ6_K{}, kQK_K, [](auto b, float* o) { dequant_block_q6_k(b, o); });
    default: return false;
  }
}

}  // namespace muser
