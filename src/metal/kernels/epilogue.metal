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

MUSER_KERNEL(scale_f32, MUSER_ARG_CONSTANT(EpilogueKargs, a, 0), MUSER_ARG_BUFFER_INOUT(float, y, 1), MUSER_ARG_TID(i)) {
  if ((int64_t)i < a.n) y[i] = epilogue_scale(y[i], a.scale);
}

MUSER_KERNEL(tanh_f32, MUSER_ARG_CONSTANT(EpilogueKargs, a, 0), MUSER_ARG_BUFFER_INOUT(float, y, 1), MUSER_ARG_TID(i)) {
  if ((int64_t)i < a.n) y[i] = platform_tanhf(y[i]);
}

MUSER_KERNEL(softcap_f32, MUSER_ARG_CONSTANT(EpilogueKargs, a, 0), MUSER_ARG_BUFFER_INOUT(float, y, 1), MUSER_ARG_TID(i)) {
  if ((int64_t)i < a.n) y[i] = epilogue_softcap_fused(y[i], a.scale, a.cap);
}

MUSER_KERNEL(softcap_ref_f32, MUSER_ARG_CONSTANT(EpilogueKargs, a, 0), MUSER_ARG_BUFFER_INOUT(float, y, 1), MUSER_ARG_TID(i)) {
  if ((int64_t)i < a.n) y[i] = epilogue_softcap_reference(y[i], a.cap, a.inv_cap);
}

MUSER_KERNEL(softcap_canon_f32, MUSER_ARG_CONSTANT(EpilogueKargs, a, 0), MUSER_ARG_BUFFER_INOUT(float, y, 1), MUSER_ARG_TID(i)) {
  if ((int64_t)i < a.n) y[i] = canon_epilogue(y[i], a.scale, a.cap, a.inv_cap);
}
