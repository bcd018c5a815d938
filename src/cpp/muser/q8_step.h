// The float side of the q8 dot product (docs/numerics.md, "q8 activations"),
// written once for every backend: the CPU's scalar, AVX2 and NEON twins
// (cpu/q8_rows.h), its AVX-512 twin (16 rows per register, through its own
// V) and CUDA (matvec_q8.cuh). Per (row, token) the row's blocks are taken
// in increasing order, each block b contributing with its exact integer sums
// isum (and msum for the mins of Q4_K/Q5_K), converted to f32 here:
//   Q4_K/Q5_K: sum_q = q8_block_step(sum_q, dx, d, isum)
//              sum_m = q8_block_step(sum_m, dx, dmin, msum)
//              y = q8_kquant45_result(sum_q, sum_m)
//   Q6_K:      y = sum_q, stepped as above
//   Q8_0:      y = sum_q = q8_0_block_step(sum_q, isum, d, dx)
// (dx: the activation block's scale; d, dmin: the weight block's, f32).
// Changing an operand order here changes every backend at once, as it must.
#pragma once
#include "float_ops.h"

namespace muser {

// acc + (dx * d) * sum, one rounding for the product dx * d and one fma; sum is
// an integer sum already in f32, exactly (|sum| < 2^24: CUDA's mins sums come
// from the tensor cores as f32).
template <class V = F32Ops>
MUSER_HD typename V::F q8_block_step_exact(typename V::F acc, typename V::F dx, typename V::F d, typename V::F sum) {
  const typename V::F s = V::mul(dx, d);
  return V::fma(s, sum, acc);
}

// acc + (dx * d) * isum: the step above on the integer sum.
template <class V = F32Ops>
MUSER_HD typename V::F q8_block_step(typename V::F acc, typename V::F dx, typename V::F d, typename V::I isum) {
  return q8_block_step_exact<V>(acc, dx, d, V::cvt(isum));
}

// Q8_0's order (ggml's): acc + isum * (d * dx).
template <class V = F32Ops>
MUSER_HD typename V::F q8_0_block_step(typename V::F acc, typename V::I isum, typename V::F d, typename V::F dx) {
  const typename V::F q = V::cvt(isum);
  return V::fma(q, V::mul(d, dx), acc);
}

template <class V = F32Ops>
MUSER_HD typename V::F q8_kquant45_result(typename V::F sum_q, typename V::F sum_m) {
  return V::sub(sum_q, sum_m);
}

}  // namespace muser
