// The element-wise epilogue operations on one logit, shared by the epilogue
// nodes (epilogue.cu) and by the consumer kernels that fold the route's one
// element-wise node into their load of a raw logit (vocab_reduce.cu,
// sample.cu): the same function on the same operand, so the same bits.
// Each rounding is explicit (__fmul_rn, __fdiv_rn) on top of --fmad=false,
// so no step is contracted; tanh is the platform's tanhf (CUDA's, not glibc's).
#pragma once
#include "kernels.h"
#include "muser/canonical.h"

namespace muser::cuda {

template <EpilogueOp kOp>
__device__ __forceinline__ float epilogue_op(float l, float f0, float f1, float f2) {
  if constexpr (kOp == EpilogueOp::Scale) return __fmul_rn(l, f0);
  else if constexpr (kOp == EpilogueOp::Tanh) return tanhf(l);
  else if constexpr (kOp == EpilogueOp::SoftcapFused) return __fmul_rn(f1, tanhf(__fdiv_rn(__fmul_rn(l, f0), f1)));
  else if constexpr (kOp == EpilogueOp::SoftcapReference) return __fmul_rn(f1, tanhf(__fmul_rn(l, f2)));
  else if constexpr (kOp == EpilogueOp::SoftcapCanon) return canon_epilogue(l, f0, f1, f2);
  else return l;
}

// The folded node of a consumer kernel (EpilogueOp::None: the logits are final already).
__device__ __forceinline__ float epilogue_apply(const EpilogueFold& e, float l) {
  switch (e.op) {
    case EpilogueOp::Scale: return epilogue_op<EpilogueOp::Scale>(l, e.f0, e.f1, e.f2);
    case EpilogueOp::Tanh: return epilogue_op<EpilogueOp::Tanh>(l, e.f0, e.f1, e.f2);
    case EpilogueOp::SoftcapFused: return epilogue_op<EpilogueOp::SoftcapFused>(l, e.f0, e.f1, e.f2);
    case EpilogueOp::SoftcapReference: return epilogue_op<EpilogueOp::SoftcapReference>(l, e.f0, e.f1, e.f2);
    case EpilogueOp::SoftcapCanon: return epilogue_op<EpilogueOp::SoftcapCanon>(l, e.f0, e.f1, e.f2);
    case EpilogueOp::None: break;
  }
  return l;
}

}  // namespace muser::cuda
