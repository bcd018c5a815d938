// The element-wise epilogue nodes, one logit per thread, in place:
//   scale_f32            l * scale                        (logit_scale, softcap_scale_in/out)
//   tanh_f32             metal::precise::tanh(l)          (the graph route's tanh node)
//   softcap_f32          v = l * scale; cap * tanh(v / cap)   (fused route)
//   softcap_ref_f32      cap * tanh(l * inv_cap)          (reference route, after its scale node)
//   softcap_canon_f32    canon_epilogue(l, scale, cap, inv_cap) (canonical route, muser/canonical.h)
// Buffers: 0 EpilogueKargs, 1 y [n]; grid: n threads.
#include "common.h"
#include "muser/canonical.h"
#include "muser/epilogue.h"

using namespace muser;

kernel void scale_f32(constant EpilogueKargs& a [[buffer(0)]], device float* y [[buffer(1)]],
                      uint i [[thread_position_in_grid]]) {
  if ((int64_t)i < a.n) y[i] = epilogue_scale(y[i], a.scale);
}

kernel void tanh_f32(constant EpilogueKargs& a [[buffer(0)]], device float* y [[buffer(1)]],
                     uint i [[thread_position_in_grid]]) {
  if ((int64_t)i < a.n) y[i] = platform_tanhf(y[i]);
}

kernel void softcap_f32(constant EpilogueKargs& a [[buffer(0)]], device float* y [[buffer(1)]],
                        uint i [[thread_position_in_grid]]) {
  if ((int64_t)i < a.n) y[i] = epilogue_softcap_fused(y[i], a.scale, a.cap);
}

kernel void softcap_ref_f32(constant EpilogueKargs& a [[buffer(0)]], device float* y [[buffer(1)]],
                            uint i [[thread_position_in_grid]]) {
  if ((int64_t)i < a.n) y[i] = epilogue_softcap_reference(y[i], a.cap, a.inv_cap);
}

kernel void softcap_canon_f32(constant EpilogueKargs& a [[buffer(0)]], device float* y [[buffer(1)]],
                              uint i [[thread_position_in_grid]]) {
  if ((int64_t)i < a.n) y[i] = canon_epilogue(y[i], a.scale, a.cap, a.inv_cap);
}
