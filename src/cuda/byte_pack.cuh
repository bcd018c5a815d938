// Byte packing shared by the quantizer (quantize_q8.cuh) and the matvec
// decoders (matvec.cuh), which include nothing of each other.
#pragma once
#include <cstdint>

namespace muser::cuda {

// The low bytes of b0..b3 as one word, b0's lowest (two's complement of a
// negative int8 included).
__device__ __forceinline__ uint32_t pack_bytes4(uint32_t b0, uint32_t b1, uint32_t b2, uint32_t b3) {
  return __byte_perm(__byte_perm(b0, b1, 0x0040), __byte_perm(b2, b3, 0x0040), 0x5410);
}

}  // namespace muser::cuda
