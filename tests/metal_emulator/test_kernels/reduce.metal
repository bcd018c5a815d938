// Emulator self-test: one threadgroup sums its 256 elements in a fixed tree.
// Each SIMD-group folds its 32 values with a simd_shuffle_xor butterfly
// (16, 8, 4, 2, 1), lane 0 stores the SIMD-group's sum to threadgroup memory,
// a barrier, then the first SIMD-group folds the 8 partials (4, 2, 1).
// The test computes the same tree serially and compares bits.
#include <metal_stdlib>
#include "kernel_abi.h"
#include "emu_test_args.h"

static inline float butterfly32(float v) {
  for (ushort m = 16; m >= 1; m /= 2) v += metal::simd_shuffle_xor(v, m);
  return v;
}


// [[threadgroup(0)]] partials, sized by setThreadgroupMemoryLength (8 floats = 32 bytes)
MUSER_KERNEL(emu_reduce_dynamic, MUSER_ARG_BUFFER_IN(float, x, 0), MUSER_ARG_BUFFER_OUT(float, out, 1),
             MUSER_ARG_THREADGROUP(float, partial, 0), MUSER_ARG_TID(gid), MUSER_ARG_TGID(tgid),
             MUSER_ARG_LANE(lane), MUSER_ARG_SGID(sg)) {
  float v = butterfly32(x[gid]);
  if (lane == 0) partial[sg] = v;
  metal::threadgroup_barrier(metal::mem_flags::mem_threadgroup);
  if (sg == 0) {
    float p = lane < 8 ? partial[lane] : 0.0f;
    for (ushort m = 4; m >= 1; m /= 2) p += metal::simd_shuffle_xor(p, m);
    if (lane == 0) out[tgid] = p;
  }
}

// the same tree with a function-scope threadgroup array
MUSER_KERNEL(emu_reduce_static, MUSER_ARG_BUFFER_IN(float, x, 0), MUSER_ARG_BUFFER_OUT(float, out, 1),
             MUSER_ARG_TID(gid), MUSER_ARG_TGID(tgid), MUSER_ARG_LANE(lane), MUSER_ARG_SGID(sg)) {
  MUSER_THREADGROUP_ARRAY(float, partial, 8);
  float v = butterfly32(x[gid]);
  if (lane == 0) partial[sg] = v;
  metal::threadgroup_barrier(metal::mem_flags::mem_threadgroup);
  if (sg == 0) {
    float p = lane < 8 ? partial[lane] : 0.0f;
    for (ushort m = 4; m >= 1; m /= 2) p += metal::simd_shuffle_xor(p, m);
    if (lane == 0) out[tgid] = p;
  }
}

// simd_sum and simd_shuffle_down agree with the butterfly on exact inputs
MUSER_KERNEL(emu_simd_ops, MUSER_ARG_BUFFER_IN(float, x, 0), MUSER_ARG_BUFFER_OUT(float, out, 1),
             MUSER_ARG_TID(gid), MUSER_ARG_LANE(lane)) {
  float s = metal::simd_sum(x[gid]);
  float d = metal::simd_shuffle_down(x[gid], (ushort)1);
  out[2 * gid] = s;
  out[2 * gid + 1] = d;
  (void)lane;
}
