// The GPU device layout of quantized weights, made once at load (CUDA:
// upload_weight in src/cuda/matvec.cu). Shared by host C++ (the C++ tests
// check it without a GPU: tests/cpp/test_device_layout.cpp), CUDA and Metal;
// the functions take their blocks as pointer template arguments (any address
// space).
//
// Row tiles (Q4_K, Q5_K, Q6_K, Q8_0). The rows are stored in tiles of
// kTileRows = 16: tile T holds block 0 of rows 16T .. 16T+15 back to back,
// then block 1 of the same rows, and so on; the last tile is padded with
// zero rows. So block b of row r is at
//   (r / 16) * 16 * row_bytes + b * 16 * B + (r % 16) * B        (B: block bytes)
// and the blocks of one row are kTileRows * B apart. Why: the matvecs give a
// warp (or a CTA) 16 consecutive rows and walk their blocks in step; in the
// GGUF order that is 16 pieces of B bytes a whole row (4.5 KB) apart, and on
// the H200 such a pattern reads at 75 % of the bandwidth of one contiguous
// stream (a DRAM page opened per piece); tiled, the 16 pieces are one run and
// the run goes on where the previous one ended (measured: 258 against 208 us
// for the seed's 925 MB, docs/performance.md). Float weights keep GGUF rows.
//
// Blocks (Q4_K, Q5_K): each block is also permuted so that a lane's bytes
// are contiguous. Values are untouched; the header (d, dmin, 12 scale
// bytes) keeps its place.
//
//   Q5_K (176 B):  [0,16) header | [16,48) qh' | [48,176) qs'
//   Q4_K (144 B):  [0,16) header | [16,144) qs'
//   qs' word l (4 bytes) = qs[l], qs[32+l], qs[64+l], qs[96+l]: lane l's quant
//       bytes for sub-blocks (0,1), (2,3), (4,5), (6,7) (low nibble: even sub-block)
//   qh' byte l: bit c = 5th bit of element 64c + l (sub-block 2c),
//               bit 4+c = 5th bit of element 64c + 32 + l (sub-block 2c+1)
//
// unpack_* restores the GGUF block so dequant.h (the one definition of a
// weight's value) applies unchanged; the reference kernel uses it.
#pragma once
#include "quant_blocks.h"

namespace muser {

MUSER_CONSTANT constexpr int kTileRows = 16;

// Whether a weight type is stored in row tiles on the device.
MUSER_HD bool is_tiled_type(uint32_t type) {
  return type == (uint32_t)GgmlType::Q4_K || type == (uint32_t)GgmlType::Q5_K || type == (uint32_t)GgmlType::Q6_K ||
         type == (uint32_t)GgmlType::Q8_0;
}
// Byte offset of row r's first block in the tiled layout.
MUSER_HD int64_t tiled_row_offset(int64_t r, int64_t row_bytes, int64_t block_bytes) {
  return (r / kTileRows) * kTileRows * row_bytes + (r % kTileRows) * block_bytes;
}

// A repacked block keeps the GGUF block's field offsets (quant_blocks.h).
MUSER_CONSTANT constexpr int kQ5KHighBitsOffset = kKQuantHeaderBytes;  // qh' in a repacked Q5_K block
MUSER_CONSTANT constexpr int kQ5KQuantsOffset = kQ5KQsOffset;          // qs' in a repacked Q5_K block
MUSER_CONSTANT constexpr int kQ4KQuantsOffset = kKQuantHeaderBytes;    // qs' in a repacked Q4_K block

MUSER_HD uint8_t q5k_packed_high_bits(uint8_t qh) {
  uint8_t out = 0;
  for (int c = 0; c < 4; ++c) {
    out |= (uint8_t)(((qh >> (2 * c)) & 1) << c);
    out |= (uint8_t)(((qh >> (2 * c + 1)) & 1) << (4 + c));
  }
  return out;
}

MUSER_HD uint8_t q5k_unpacked_high_bits(uint8_t packed) {
  uint8_t qh = 0;
  for (int c = 0; c < 4; ++c) {
    qh |= (uint8_t)(((packed >> c) & 1) << (2 * c));
    qh |= (uint8_t)(((packed >> (4 + c)) & 1) << (2 * c + 1));
  }
  return qh;
}

// In place: qs (128 bytes at p) from GGUF order to lane-word order.
template <class P>
MUSER_HD void permute_quants_to_lanes(P p) {
  uint8_t tmp[128];
  for (int i = 0; i < 128; ++i) tmp[i] = p[i];
  for (int l = 0; l < 32; ++l)
    for (int c = 0; c < 4; ++c) p[4 * l + c] = tmp[32 * c + l];
}

template <class P, class Q>
MUSER_HD void permute_quants_from_lanes(P p, Q qs) {
  for (int l = 0; l < 32; ++l)
    for (int c = 0; c < 4; ++c) qs[32 * c + l] = p[4 * l + c];
}

template <class P>
MUSER_HD void repack_block_q5_k(P b) {
  // GGUF: header, qh[32] at 16, qs[128] at 48 -- the same offsets as the device layout
  for (int l = 0; l < 32; ++l) b[kQ5KHighBitsOffset + l] = q5k_packed_high_bits(b[kQ5KHighBitsOffset + l]);
  permute_quants_to_lanes(b + kQ5KQuantsOffset);
}

template <class P>
MUSER_HD void repack_block_q4_k(P b) { permute_quants_to_lanes(b + kQ4KQuantsOffset); }

// The header (d, dmin, scales) of a repacked block at b into a GGUF block
// (little-endian f16s, as GGUF stores them).
template <class P, class B>
MUSER_HD void unpack_kquant_header(P b, B out) {
  out->d = (uint16_t)(b[0] | (b[1] << 8));
  out->dmin = (uint16_t)(b[2] | (b[3] << 8));
  for (int i = 0; i < kKScaleBytes; ++i) out->scales[i] = b[4 + i];
}

template <class P, class B>
MUSER_HD void unpack_block_q5_k(P b, B out) {
  unpack_kquant_header(b, out);
  for (int l = 0; l < 32; ++l) out->qh[l] = q5k_unpacked_high_bits(b[kQ5KHighBitsOffset + l]);
  permute_quants_from_lanes(b + kQ5KQuantsOffset, out->qs);
}

template <class P, class B>
MUSER_HD void unpack_block_q4_k(P b, B out) {
  unpack_kquant_header(b, out);
  permute_quants_from_lanes(b + kQ4KQuantsOffset, out->qs);
}

}  // namespace muser
