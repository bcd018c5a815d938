// The element-wise epilogue operations on one logit, shared by the epilogue
// nodes (epilogue.cu) and by the consumer kernels that fold the route's one
// element-wise node into their load of a raw logit (vocab_reduce.cu,
// sample.cu): the same function on the same operand, so the same bits.
// Each rounding is explicit (__fmul_rn, __fdiv_rn) on top of --fmad=false,
// so no step is contracted; tanh is the platform's tanhf (CUDA's, not glibc's).
#pragma once
#include "kernels.h"
#include "muser/canonical.h"

#include <type_traits>

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

// The one switch over the element-wise nodes: calls f once with the node as a
// compile-time constant (std::integral_constant<EpilogueOp, op>), so a caller that
// applies it to many values branches once.
// (nv_exec_check_disable: f is a host lambda on the host -- a launcher -- and a
// device one on the device; each side instantiates only its own.)
#pragma nv_exec_check_disable
template <class F>
__host__ __device__ __forceinline__ void epilogue_dispatch(EpilogueOp op, F&& f) {
  using Op = EpilogueOp;
  switch (op) {
    case Op::Scale: f(std::integral_constant<Op, Op::Scale>{}); break;
    case Op::Tanh: f(std::integral_constant<Op, Op::Tanh>{}); break;
    case Op::SoftcapFused: f(std::integral_constant<Op, Op::SoftcapFused>{}); break;
    case Op::SoftcapReference: f(std::integral_constant<Op, Op::SoftcapReference>{}); break;
    case Op::SoftcapCanon: f(std::integral_constant<Op, Op::SoftcapCanon>{}); break;
    case Op::None: f(std::integral_constant<Op, Op::None>{}); break;
  }
}

// The folded node of a consumer kernel (EpilogueOp::None: the logits are final already).
__device__ __forceinline__ float epilogue_apply(const EpilogueFold& e, float l) {
  float r = l;
  epilogue_dispatch(e.op, [&](auto op) { r = epilogue_op<decltype(op)::value>(l, e.f0, e.f1, e.f2); });
  return r;
}

}  // namespace muser::cuda
