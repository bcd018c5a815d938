// The shared headers as Metal kernels will use them: every template
// instantiated with MSL address spaces (blocks in device memory, partial sums
// in threadgroup memory, arguments in constant memory). -fsyntax-only
// instantiates them, so a body that drops an address space (a `const uint8_t*`
// local initialised from a device pointer, say) fails the shim check.
#include "metal_shim.h"
#include "muser/canonical.h"
#include "muser/dequant.h"
#include "muser/device_layout.h"
#include "muser/kernel_args.h"
#include "muser/q8_step.h"

using namespace muser;

void uses_dequant(device const BlockQ5_K* b5, device const BlockQ4_K* b4, device const BlockQ6_K* b6,
                  device const BlockQ8_0* b8, threadgroup float* tg, thread float* out) {
  dequant_block_q5_k(b5, out);
  dequant_block_q4_k(b4, tg);
  dequant_block_q6_k(b6, out);
  dequant_block_q8_0(b8, tg);
  out[0] = (float)(q5k_quant(b5, 3) + q4k_quant(b4, 3) + q6k_quant(b6, 3));
  uint8_t sc, m;
  k_scale_min(5, b5->scales, &sc, &m);
  float d1[8], m1[8];
  kquant_sub_scales(b4->scales, b4->d, b4->dmin, d1, m1);
  const KScaleWords k = kquant_scale_words(1u, 2u, 3u);
  out[1] = (float)(sc + m + k.sc[0]) + d1[0] + m1[0] + f16_to_f32(b8->d) + bf16_to_f32(b8->d);
}

void uses_canonical(threadgroup float* partials, device float* y, constant EpilogueKargs& e) {
  y[0] = canon_tree32(partials);
  float lanes[kCanonLanes] = {};
  y[1] = canon_tree32(lanes);
  for (int64_t i = 0; i < e.n; ++i) y[i] = canon_epilogue(y[i], e.scale, e.cap, e.inv_cap);
}

void uses_layout(device uint8_t* blocks, device const uint8_t* packed, threadgroup BlockQ5_K* q5,
                 thread BlockQ4_K* q4, constant MatvecKargs& a) {
  repack_block_q5_k(blocks);
  repack_block_q4_k(blocks + a.row_bytes);
  unpack_block_q5_k(packed, q5);
  unpack_block_q4_k(packed, q4);
  blocks[0] = (uint8_t)(is_tiled_type(a.type) ? tiled_row_offset(1, a.row_bytes, block_bytes(a.type)) : 0);
}

float uses_q8(constant Q8ActsKargs& q, device const float* dx, device const int32_t* isum) {
  float acc = 0.0f, mins = 0.0f;
  for (int64_t b = 0; b < q.meta_per_token; ++b) {
    acc = q8_block_step(acc, dx[b], 0.5f, isum[b]);
    mins = q8_block_step(mins, dx[b], 0.25f, isum[b]);
  }
  return q8_kquant45_result(acc, mins) + q8_0_block_step(acc, isum[0], 1.0f, dx[0]);
}
