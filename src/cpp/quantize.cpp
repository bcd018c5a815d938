// Reference quantizers, written to reproduce ggml's quantize_row_*_ref bytes.
//
// Each function below mirrors one ggml routine (named in its comment) operation
// for operation: the same float expression trees, the same int<->float
// conversions, the same round-to-nearest via the 1.5*2^23 magic number, the
// same tie-breaking comparisons. Do not "simplify" an expression here (e.g.
// x/d -> x*(1/d), w*l*l -> w*(l*l)): it changes rounding and so the bytes.
#include "quantize.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cmath>
#include <string>

#include "cpu/parallel.h"
#include "errors.h"
#include "quant_types.h"

namespace muser {
namespace {

// Rows per parallel_for chunk in quantize/dequantize: about 64 Ki elements,
// enough work to dwarf taking a chunk, small enough to balance the threads.
int64_t rows_per_chunk(int64_t cols) { return std::max<int64_t>(1, (int64_t{1} << 16) / std::max<int64_t>(1, cols)); }

inline int clamp_int(int v, int lo, int hi) { return std::max(lo, std::min(hi, v)); }

// ggml's make_qkx2_quants: fit x ~ scale * L - min_out with L in [0, nmax]
// by weighted least squares over nstep+1 trial inverse scales. Returns the
// scale, writes L and the (non-negative) min.
float make_qkx2_quants(int n, int nmax, const float* x, const float* weights, uint8_t* L,
                       float* min_out, uint8_t* Laux, float rmin, float rdelta, int nstep,
                       bool use_mad) {
  float min = x[0];
  float max = x[0];
  float sum_w = weights[0];
  float sum_x = sum_w * x[0];
  for (int i = 1; i < n; ++i) {
    if (x[i] < min) min = x[i];
    if (x[i] > max) max = x[i];
    const float w = weights[i];
    sum_w += w;
    sum_x += w * x[i];
  }
  if (min > 0) min = 0;
  if (max == min) {
    for (int i = 0; i < n; ++i) L[i] = 0;
    *min_out = -min;
    return 0.0f;
  }
  float iscale = (float)nmax / (max - min);
  float scale = 1 / iscale;
  float best_error = 0;
  for (int i = 0; i < n; ++i) {
    const int l = nearest_int(iscale * (x[i] - min));
    L[i] = (uint8_t)clamp_int(l, 0, nmax);
    float diff = scale * (float)L[i] + min - x[i];
    diff = use_mad ? fabsf(diff) : diff * diff;
    best_error += weights[i] * diff;
  }
  if (nstep < 1) {
    *min_out = -min;
    return scale;
  }
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * (float)is + (float)nmax) / (max - min);
    float sum_l = 0, sum_l2 = 0, sum_xl = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clamp_int(nearest_int(iscale * (x[i] - min)), 0, nmax);
      Laux[i] = (uint8_t)l;
      const float w = weights[i];
      const float fl = (float)l;
      sum_l += w * fl;
      sum_l2 += w * fl * fl;
      sum_xl += w * fl * x[i];
    }
    const float D = sum_w * sum_l2 - sum_l * sum_l;
    if (D > 0) {
      float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
      float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
      if (this_min > 0) {
        this_min = 0;
        this_scale = sum_xl / sum_l2;
      }
      float cur_error = 0;
      for (int i = 0; i < n; ++i) {
        float diff = this_scale * (float)Laux[i] + this_min - x[i];
        diff = use_mad ? fabsf(diff) : diff * diff;
        cur_error += weights[i] * diff;
      }
      if (cur_error < best_error) {
        for (int i = 0; i < n; ++i) L[i] = Laux[i];
        best_error = cur_error;
        scale = this_scale;
        min = this_min;
      }
    }
  }
  *min_out = -min;
  return scale;
}

// ggml's make_qx_quants with qw == NULL: symmetric fit x ~ scale * (L - nmax),
// L in [0, 2*nmax). rmse_type 1 weighs each element by x^2 and tries 18
// perturbed scales around -nmax/max. Returns the (signed) scale.
float make_qx_quants(int n, int nmax, const float* x, int8_t* L, int rmse_type) {
  constexpr float kGroupMaxEps = 1e-15f;  // ggml's GROUP_MAX_EPS
  float max = 0;
  float amax = 0;
  for (int i = 0; i < n; ++i) {
    const float ax = fabsf(x[i]);
    if (ax > amax) {
      amax = ax;
      max = x[i];
    }
  }
  if (amax < kGroupMaxEps) {  // all zero: L = 0 (not nmax), as ggml leaves it
    for (int i = 0; i < n; ++i) L[i] = 0;
    return 0.0f;
  }
  float iscale = (float)(-nmax) / max;
  if (rmse_type == 0) {
    for (int i = 0; i < n; ++i)
      L[i] = (int8_t)(nmax + clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1));
    return 1 / iscale;
  }
  bool return_early = false;
  if (rmse_type < 0) {
    rmse_type = -rmse_type;
    return_early = true;
  }
  auto weight = [rmse_type](float v) -> float {
    switch (rmse_type) {
      case 1: return v * v;
      case 2: return 1.0f;
      case 3: return fabsf(v);
      default: return sqrtf(fabsf(v));
    }
  };
  float sumlx = 0;
  float suml2 = 0;
  for (int i = 0; i < n; ++i) {
    const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
    L[i] = (int8_t)(l + nmax);
    const float w = weight(x[i]);
    sumlx += w * x[i] * (float)l;
    suml2 += w * (float)l * (float)l;
  }
  float scale = suml2 != 0 ? sumlx / suml2 : 0.0f;
  if (return_early) return suml2 > 0 ? 0.5f * (scale + 1 / iscale) : 1 / iscale;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -((float)nmax + 0.1f * (float)is) / max;
    sumlx = suml2 = 0;
    for (int i = 0; i < n; ++i) {
      const int l = clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1);
      const float w = weight(x[i]);
      sumlx += w * x[i] * (float)l;
      suml2 += w * (float)l * (float)l;
    }
    if (suml2 > 0 && sumlx * sumlx > best * suml2) {
      for (int i = 0; i < n; ++i)
        L[i] = (int8_t)(nmax + clamp_int(nearest_int(iscale * x[i]), -nmax, nmax - 1));
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// The part of quantize_row_q4_K_ref / quantize_row_q5_K_ref the two share:
// per 32-element sub-block a (scale, min) fit weighted by av_x + |x|, both
// quantized to 6 bits against the block's largest, and the final quants L
// recomputed from the rounded d*sc and dmin*m. nmax is 15 (Q4_K) or 31 (Q5_K).
void quantize_kquant_scales(const float* x, int nmax, float rmin, int nstep, uint16_t* d16,
                            uint16_t* dmin16, uint8_t* packed_scales /*12*/, uint8_t* L /*256*/) {
  float scales[kQK_K / 32];
  float mins[kQK_K / 32];
  float weights[32];
  uint8_t Laux[32];
  float max_scale = 0;  // scales are >= 0 once the min is subtracted
  float max_min = 0;
  for (int j = 0; j < kQK_K / 32; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = sqrtf(sum_x2 / 32);
    for (int l = 0; l < 32; ++l) weights[l] = av_x + fabsf(xs[l]);
    scales[j] = make_qkx2_quants(32, nmax, xs, weights, L + 32 * j, &mins[j], Laux, rmin, 0.1f,
                                 nstep, false);
    if (scales[j] > max_scale) max_scale = scales[j];
    if (mins[j] > max_min) max_min = mins[j];
  }

  const float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0 ? 63.f / max_min : 0.f;
  memset(packed_scales, 0, kKScaleBytes);
  for (int j = 0; j < kQK_K / 32; ++j) {
    // ggml stores nearest_int's result in a uint8_t before clamping: keep the wrap.
    const uint8_t ls = std::min<uint8_t>(63, (uint8_t)nearest_int(inv_scale * scales[j]));
    const uint8_t lm = std::min<uint8_t>(63, (uint8_t)nearest_int(inv_min * mins[j]));
    if (j < 4) {
      packed_scales[j] = ls;
      packed_scales[j + 4] = lm;
    } else {  // low 4 bits in bytes 8..11, high 2 bits in the top of bytes 0..7
      packed_scales[j + 4] = (uint8_t)((ls & 0xF) | ((lm & 0xF) << 4));
      packed_scales[j - 4] |= (uint8_t)((ls >> 4) << 6);
      packed_scales[j] |= (uint8_t)((lm >> 4) << 6);
    }
  }
  *d16 = f32_to_f16(max_scale / 63.f);
  *dmin16 = f32_to_f16(max_min / 63.f);

  const float d_all = f16_to_f32(*d16);
  const float dmin_all = f16_to_f32(*dmin16);
  for (int j = 0; j < kQK_K / 32; ++j) {
    uint8_t sc, m;
    k_scale_min(j, packed_scales, &sc, &m);
    const float d = d_all * (float)sc;
    if (d == 0) continue;  // keeps make_qkx2_quants' L, as ggml does
    const float dm = dmin_all * (float)m;
    for (int i = 0; i < 32; ++i)
      L[32 * j + i] = (uint8_t)clamp_int(nearest_int((x[32 * j + i] + dm) / d), 0, nmax);
  }
}

bool is_block_quant(GgmlType type) {
  return type == GgmlType::Q8_0 || type == GgmlType::Q4_K || type == GgmlType::Q5_K ||
         type == GgmlType::Q6_K;
}

const char* type_name(GgmlType type) {
  const char* name = type_traits((uint32_t)type).name;
  return name ? name : "unknown";
}

void check_type_and_cols(GgmlType type, int64_t cols, bool for_quantize) {
  if (for_quantize ? !can_quantize(type) : !can_dequantize(type))
    throw ArgValueError(std::string("muser cannot ") + (for_quantize ? "quantize to " : "dequantize ") +
                        type_name(type) + "; supported: " + supported_type_list());
  if (cols < 0) throw ArgValueError("cols must be >= 0, got " + std::to_string(cols));
  const int block = type_traits((uint32_t)type).block_elems;
  if (cols % block != 0)
    throw ArgValueError(std::string(type_name(type)) + " needs a row length that is a multiple of " +
                        std::to_string(block) + " (its block size), got " + std::to_string(cols));
}

// First non-finite element of x[0..n), or -1.
int64_t find_non_finite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return i;
  return -1;
}

// Quantize one row whose type, length and finiteness are already checked.
void quantize_row_unchecked(GgmlType type, const float* x, int64_t n, uint8_t* out) {
  switch (type) {
    case GgmlType::F32:
      memcpy(out, x, (size_t)n * 4);
      return;
    case GgmlType::F16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_f16(x[i]);
        memcpy(out + 2 * i, &h, 2);
      }
      return;
    case GgmlType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = f32_to_bf16(x[i]);
        memcpy(out + 2 * i, &h, 2);
      }
      return;
    case GgmlType::Q8_0:
      for (int64_t b = 0; b < n / kQK8_0; ++b)
        quantize_block_q8_0(x + b * kQK8_0, reinterpret_cast<BlockQ8_0*>(out) + b);
      return;
    case GgmlType::Q4_K:
      for (int64_t b = 0; b < n / kQK_K; ++b)
        quantize_block_q4_k(x + b * kQK_K, reinterpret_cast<BlockQ4_K*>(out) + b);
      return;
    case GgmlType::Q5_K:
      for (int64_t b = 0; b < n / kQK_K; ++b)
        quantize_block_q5_k(x + b * kQK_K, reinterpret_cast<BlockQ5_K*>(out) + b);
      return;
    case GgmlType::Q6_K:
      for (int64_t b = 0; b < n / kQK_K; ++b)
        quantize_block_q6_k(x + b * kQK_K, reinterpret_cast<BlockQ6_K*>(out) + b);
      return;
    default:
      return;  // unreachable: checked by the caller
  }
}

// Whether every f16 scale field in a quantized row is finite. A finite input
// can still overflow one (Q8_0: max |x| > 127 * 65504); ggml then writes inf.
bool row_scales_finite(GgmlType type, const uint8_t* row, int64_t n) {
  auto finite16 = [](uint16_t h) { return (h & 0x7c00u) != 0x7c00u; };
  switch (type) {
    case GgmlType::Q8_0:
      for (int64_t b = 0; b < n / kQK8_0; ++b)
        if (!finite16(reinterpret_cast<const BlockQ8_0*>(row)[b].d)) return false;
      return true;
    case GgmlType::Q4_K:
      for (int64_t b = 0; b < n / kQK_K; ++b) {
        const BlockQ4_K& blk = reinterpret_cast<const BlockQ4_K*>(row)[b];
        if (!finite16(blk.d) || !finite16(blk.dmin)) return false;
      }
      return true;
    case GgmlType::Q5_K:
      for (int64_t b = 0; b < n / kQK_K; ++b) {
        const BlockQ5_K& blk = reinterpret_cast<const BlockQ5_K*>(row)[b];
        if (!finite16(blk.d) || !finite16(blk.dmin)) return false;
      }
      return true;
    case GgmlType::Q6_K:
      for (int64_t b = 0; b < n / kQK_K; ++b)
        if (!finite16(reinterpret_cast<const BlockQ6_K*>(row)[b].d)) return false;
      return true;
    default:
      return true;  // plain conversions: overflow to inf is the conversion's own (RNE) result
  }
}

}  // namespace

// ---- block quantizers ----

// quantize_row_q8_0_ref: d = amax/127, q = roundf(x / d) computed as x * (1/d).
void quantize_block_q8_0(const float* x, BlockQ8_0* y) {
  float amax = 0.0f;
  for (int j = 0; j < kQK8_0; ++j) amax = std::max(amax, fabsf(x[j]));
  const float d = amax / 127;
  const float id = d != 0 ? 1.0f / d : 0.0f;
  y->d = f32_to_f16(d);
  for (int j = 0; j < kQK8_0; ++j) {
    const float q = roundf(x[j] * id);  // ties away from zero
    // id is inf when amax < ~3.7e-37 (d then stores as f16 zero anyway); ggml
    // converts the inf/NaN products to int8 as 0 on x86 (cvttss2si's 0x80000000,
    // low byte). Say so explicitly instead of relying on undefined behaviour.
    y->qs[j] = std::isfinite(q) ? (int8_t)q : (int8_t)0;
  }
}

// quantize_row_q4_K_ref: make_qkx2_quants(32, 15, ..., -1, 0.1, 20, false).
void quantize_block_q4_k(const float* x, BlockQ4_K* y) {
  uint8_t L[kQK_K];
  quantize_kquant_scales(x, 15, -1.0f, 20, &y->d, &y->dmin, y->scales, L);
  uint8_t* q = y->qs;
  for (int j = 0; j < kQK_K; j += 64, q += 32)
    for (int l = 0; l < 32; ++l) q[l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
}

// quantize_row_q5_K_ref: make_qkx2_quants(32, 31, ..., -0.5, 0.1, 15, false),
// then the 5th bit of element 64c + l goes to bit 2c of qh[l], that of
// 64c + 32 + l to bit 2c + 1.
void quantize_block_q5_k(const float* x, BlockQ5_K* y) {
  uint8_t L[kQK_K];
  quantize_kquant_scales(x, 31, -0.5f, 15, &y->d, &y->dmin, y->scales, L);
  memset(y->qh, 0, sizeof y->qh);
  uint8_t* ql = y->qs;
  uint8_t lo_bit = 1, hi_bit = 2;
  for (int c = 0; c < kQK_K; c += 64, ql += 32, lo_bit <<= 2, hi_bit <<= 2) {
    for (int l = 0; l < 32; ++l) {
      int q_lo = L[c + l];
      int q_hi = L[c + l + 32];
      if (q_lo > 15) {
        q_lo -= 16;
        y->qh[l] |= lo_bit;
      }
      if (q_hi > 15) {
        q_hi -= 16;
        y->qh[l] |= hi_bit;
      }
      ql[l] = (uint8_t)(q_lo | (q_hi << 4));
    }
  }
}

// quantize_row_q6_K_ref: per 16-element sub-block make_qx_quants(16, 32, x, L, 1),
// the signed scales quantized to int8 against the largest |scale| (d = its /-128),
// then L recomputed from the rounded d*scale and split into ql/qh.
void quantize_block_q6_k(const float* x, BlockQ6_K* y) {
  constexpr float kGroupMaxEps = 1e-15f;
  int8_t L[kQK_K];
  float scales[kQK_K / 16];
  float max_scale = 0;
  float max_abs_scale = 0;
  for (int ib = 0; ib < kQK_K / 16; ++ib) {
    const float scale = make_qx_quants(16, 32, x + 16 * ib, L + 16 * ib, 1);
    scales[ib] = scale;
    const float abs_scale = fabsf(scale);
    if (abs_scale > max_abs_scale) {
      max_abs_scale = abs_scale;
      max_scale = scale;
    }
  }
  if (max_abs_scale < kGroupMaxEps) {
    memset(y, 0, sizeof *y);
    y->d = f32_to_f16(0.f);
    return;
  }

  const float iscale = -128.f / max_scale;
  y->d = f32_to_f16(1 / iscale);
  for (int ib = 0; ib < kQK_K / 16; ++ib)
    y->scales[ib] = (int8_t)std::min(127, nearest_int(iscale * scales[ib]));

  const float d_all = f16_to_f32(y->d);
  for (int j = 0; j < kQK_K / 16; ++j) {
    const float d = d_all * (float)y->scales[j];
    if (d == 0) continue;  // keeps make_qx_quants' L, as ggml does
    for (int i = 0; i < 16; ++i)
      L[16 * j + i] = (int8_t)(clamp_int(nearest_int(x[16 * j + i] / d), -32, 31) + 32);
  }

  uint8_t* ql = y->ql;
  uint8_t* qh = y->qh;
  for (int j = 0; j < kQK_K; j += 128, ql += 64, qh += 32) {
    for (int l = 0; l < 32; ++l) {
      const uint8_t q1 = L[j + l + 0] & 0xF;
      const uint8_t q2 = L[j + l + 32] & 0xF;
      const uint8_t q3 = L[j + l + 64] & 0xF;
      const uint8_t q4 = L[j + l + 96] & 0xF;
      ql[l + 0] = (uint8_t)(q1 | (q3 << 4));
      ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
      qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) |
                        ((L[j + l + 64] >> 4) << 4) | ((L[j + l + 96] >> 4) << 6));
    }
  }
}

uint16_t f32_to_bf16(float f) {
  const uint32_t u = f32_to_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 64);  // quiet NaN
  return (uint16_t)((u + (0x7fffu + ((u >> 16) & 1u))) >> 16);
}

// ---- type queries ----

bool can_quantize(GgmlType type) {
  return is_block_quant(type) || type == GgmlType::F32 || type == GgmlType::F16 ||
         type == GgmlType::BF16;
}

bool can_dequantize(GgmlType type) { return can_quantize(type); }

std::optional<GgmlType> ggml_type_from_name(const std::string& name) {
  std::string upper(name);
  for (char& c : upper) c = (char)std::toupper((unsigned char)c);
  for (uint32_t id = 0; id < 64; ++id) {
    const char* known = type_traits(id).name;
    if (!known) continue;
    std::string known_upper(known);
    for (char& c : known_upper) c = (char)std::toupper((unsigned char)c);
    if (known_upper == upper) return (GgmlType)id;
  }
  return std::nullopt;
}

int64_t quantized_row_bytes(GgmlType type, int64_t cols) {
  const TypeTraits t = type_traits((uint32_t)type);
  if (t.block_elems == 0) return 0;
  return cols / t.block_elems * t.block_bytes;
}

// ---- row and matrix entry points ----

void check_quantize_args(GgmlType type, int64_t cols) { check_type_and_cols(type, cols, true); }
void check_dequantize_args(GgmlType type, int64_t cols) { check_type_and_cols(type, cols, false); }

void quantize_row(GgmlType type, const float* x, int64_t n, void* out) {
  check_type_and_cols(type, n, true);
  const int64_t bad = find_non_finite(x, n);
  if (bad >= 0)
    throw ArgValueError("cannot quantize a non-finite value: element " + std::to_string(bad) +
                        " is " + std::to_string(x[bad]));
  uint8_t* row = static_cast<uint8_t*>(out);
  quantize_row_unchecked(type, x, n, row);
  if (!row_scales_finite(type, row, n))
    throw ArgValueError(std::string("values too large for ") + type_name(type) +
                        ": a block's f16 scale overflows to infinity");
}

void quantize(GgmlType type, const float* x, int64_t rows, int64_t cols, void* out) {
  check_type_and_cols(type, cols, true);
  if (rows < 0) throw ArgValueError("rows must be >= 0, got " + std::to_string(rows));
  const int64_t total = rows * cols;
  const int64_t bad = find_non_finite(x, total);
  if (bad >= 0)
    throw ArgValueError("cannot quantize a non-finite value: element [" +
                        std::to_string(bad / cols) + ", " + std::to_string(bad % cols) + "] is " +
                        std::to_string(x[bad]));
  const int64_t row_bytes = quantized_row_bytes(type, cols);
  uint8_t* base = static_cast<uint8_t*>(out);
  // the lowest overflowing row, whichever thread meets it first: the message names the same row every run
  std::atomic<int64_t> first_overflow{rows};
  cpu::parallel_for(rows, rows_per_chunk(cols), cpu::default_threads(), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      uint8_t* row = base + r * row_bytes;
      quantize_row_unchecked(type, x + r * cols, cols, row);
      if (row_scales_finite(type, row, cols)) continue;
      int64_t seen = first_overflow.load(std::memory_order_relaxed);
      while (r < seen && !first_overflow.compare_exchange_weak(seen, r, std::memory_order_relaxed)) {
      }
    }
  });
  if (first_overflow.load() < rows)
    throw ArgValueError(std::string("values too large for ") + type_name(type) + ": row " +
                        std::to_string(first_overflow.load()) +
                        " has a block whose f16 scale overflows to infinity");
}

void dequantize(GgmlType type, const void* data, int64_t rows, int64_t cols, float* out) {
  check_type_and_cols(type, cols, false);
  if (rows < 0) throw ArgValueError("rows must be >= 0, got " + std::to_string(rows));
  const int64_t row_bytes = quantized_row_bytes(type, cols);
  const uint8_t* base = static_cast<const uint8_t*>(data);
  cpu::parallel_for(rows, rows_per_chunk(cols), cpu::default_threads(), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) dequant_row((uint32_t)type, base + r * row_bytes, cols, out + r * cols);
  });
}

}  // namespace muser
