// Emulator self-test: kernels that break a rule real Metal would reject or
// get wrong, one per check of the emulator.
#include <metal_stdlib>
#include "kernel_abi.h"
#include "emu_test_args.h"

// touches its [[threadgroup(0)]] memory (the 33 KiB test sets its length)
MUSER_KERNEL(emu_tg_touch, MUSER_ARG_BUFFER_OUT(float, y, 0), MUSER_ARG_THREADGROUP(float, scratch, 0),
             MUSER_ARG_TPTG(t)) {
  if (t == 0) scratch[0] = 1.0f;
  metal::threadgroup_barrier(metal::mem_flags::mem_threadgroup);
  if (t == 0) y[0] = scratch[0];
}

// a function-scope array of 33 KiB
MUSER_KERNEL(emu_tg_static_big, MUSER_ARG_BUFFER_OUT(float, y, 0), MUSER_ARG_TPTG(t)) {
  MUSER_THREADGROUP_ARRAY(float, big, 33 * 1024 / 4);
  if (t == 0) big[0] = 2.0f;
  metal::threadgroup_barrier(metal::mem_flags::mem_threadgroup);
  if (t == 0) y[0] = big[0];
}

// half the threadgroup skips the barrier
MUSER_KERNEL(emu_barrier_divergent, MUSER_ARG_BUFFER_OUT(float, y, 0), MUSER_ARG_TPTG(t)) {
  if (t < 16) metal::threadgroup_barrier(metal::mem_flags::mem_threadgroup);
  y[t] = 1.0f;
}

// a function-scope threadgroup array used as if each thread had its own copy
MUSER_KERNEL(emu_tg_per_thread, MUSER_ARG_BUFFER_IN(float, x, 0), MUSER_ARG_BUFFER_OUT(float, y, 1),
             MUSER_ARG_TID(gid)) {
  MUSER_THREADGROUP_ARRAY(float, tmp, 4);
  for (uint k = 0; k < 4; ++k) tmp[k] = x[4 * gid + k];
  float s = 0.0f;
  for (uint k = 0; k < 4; ++k) s += tmp[k];
  y[gid] = s;
}

// lanes of one SIMD-group: some at a shuffle, some at a barrier
MUSER_KERNEL(emu_simd_divergent, MUSER_ARG_BUFFER_OUT(float, y, 0), MUSER_ARG_TPTG(t)) {
  float v = (float)t;
  if (t % 2) v = metal::simd_shuffle_xor(v, (ushort)1);
  else metal::threadgroup_barrier(metal::mem_flags::mem_threadgroup);
  y[t] = v;
}
