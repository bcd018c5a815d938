// The element-wise epilogue nodes of one logit (docs/numerics.md, "Epilogue"),
// for kernels that run one element per thread. The canonical soft cap is
// canon_epilogue (canonical.h); these are the platform-tanh routes, whose
// bytes are promised equal to their definition on one backend only: tanh is
// the platform's (glibc tanhf on the host, metal::precise::tanh on Metal,
// never the fast one).
#pragma once
#include "platform.h"

namespace muser {

MUSER_HD float platform_tanhf(float x) {
#if defined(__METAL_VERSION__)
  return metal::precise::tanh(x);
#else
  return tanhf(x);
#endif
}

// Scale nodes (logit_scale, softcap_scale_in, softcap_scale_out): l * s.
MUSER_HD float epilogue_scale(float l, float s) { return l * s; }

// The fused route's soft cap: v = l * scale; cap * tanh(v / cap) (divides).
MUSER_HD float epilogue_softcap_fused(float l, float scale, float cap) {
  const float v = l * scale;
  return cap * platform_tanhf(v / cap);
}

// The reference route's soft cap (after its own scale node): cap * tanh(l * inv_cap).
MUSER_HD float epilogue_softcap_reference(float l, float cap, float inv_cap) {
  return cap * platform_tanhf(l * inv_cap);
}

}  // namespace muser
