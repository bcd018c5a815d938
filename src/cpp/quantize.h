// Quantizers: f32 rows -> GGUF block bytes, byte for byte what ggml's
// reference quantizers (ggml-quants.c, quantize_row_*_ref, which is what
// ggml_quantize_chunk runs when no importance matrix is given) write, plus the
// plain F32/F16/BF16 conversions. Dequantization of the same types is the
// shared element decode in muser/dequant.h; dequantize() below loops it.
//
// Bit-exactness rests on doing ggml's float operations in ggml's order with
// no contraction (-ffp-contract=off, as ggml-base is built on x86-64 without
// -mfma): every product and sum in quantize.cpp is a separate, rounded op.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "quant_types.h"

namespace muser {

// Types quantize() can write: Q8_0, Q4_K, Q5_K, Q6_K, F32, F16, BF16.
bool can_quantize(GgmlType type);
// Types dequantize() can read (the same list: dequant_row's).
bool can_dequantize(GgmlType type);

// "Q5_K", "q5_k", "BF16", ... -> the type; nullopt for a name muser does not
// know at all (a known but unsupported name such as "Q4_0" is returned, so the
// caller can say "not supported" rather than "unknown").
std::optional<GgmlType> ggml_type_from_name(const std::string& name);

// Bytes of one row of `cols` elements (cols a multiple of the block size).
int64_t quantized_row_bytes(GgmlType type, int64_t cols);

// Throw ArgValueError unless `type` can be quantized (dequantized) and a row
// of `cols` elements is a whole number of its blocks. The message names the
// type, the block size and the row length got.
void check_quantize_args(GgmlType type, int64_t cols);
void check_dequantize_args(GgmlType type, int64_t cols);

// Quantize one row of n finite floats into `out` (quantized_row_bytes(type, n)
// bytes). Throws ArgValueError for an unsupported type, n not a multiple of
// the block size, or a non-finite input.
void quantize_row(GgmlType type, const float* x, int64_t n, void* out);

// Quantize a row-major rows x cols matrix; row r goes to out + r * row_bytes.
// Rows run in parallel (cpu/parallel.h). Throws ArgValueError as quantize_row does,
// naming the offending row and column, and when a finite input is so large
// that a block's f16 scale overflows to infinity (ggml writes that block as
// inf silently; muser refuses).
void quantize(GgmlType type, const float* x, int64_t rows, int64_t cols, void* out);

// Dequantize rows x cols elements stored as `rows` consecutive rows of
// quantized_row_bytes(type, cols) bytes into row-major f32. Throws
// ArgValueError for an unsupported type or misaligned cols.
void dequantize(GgmlType type, const void* data, int64_t rows, int64_t cols, float* out);

// The per-format block quantizers, exposed for the tests. x holds one block.
void quantize_block_q8_0(const float* x /*32*/, BlockQ8_0* y);
void quantize_block_q4_k(const float* x /*256*/, BlockQ4_K* y);
void quantize_block_q5_k(const float* x /*256*/, BlockQ5_K* y);
void quantize_block_q6_k(const float* x /*256*/, BlockQ6_K* y);

// f32 -> bf16, round to nearest even (ggml_compute_fp32_to_bf16 for finite x).
uint16_t f32_to_bf16(float f);

}  // namespace muser
