// Emulator self-test: c = a + b, one thread per element (the grid may be
// larger than n: threads past n do nothing).
#include <metal_stdlib>
#include "kernel_abi.h"
#include "emu_test_args.h"

MUSER_KERNEL(emu_vec_add, MUSER_ARG_BUFFER_IN(float, a, 0), MUSER_ARG_BUFFER_IN(float, b, 1),
             MUSER_ARG_BUFFER_OUT(float, c, 2), MUSER_ARG_CONSTANT(EmuTestArgs, k, 3), MUSER_ARG_TID(gid)) {
  if (gid < k.n) c[gid] = a[gid] + b[gid];
}

// y[offset + i] = value for i < n: the hazard tests' writer.
MUSER_KERNEL(emu_write_range, MUSER_ARG_BUFFER_OUT(float, y, 0), MUSER_ARG_CONSTANT(EmuTestArgs, k, 1),
             MUSER_ARG_TID(gid)) {
  if (gid < k.n) y[k.offset + gid] = k.value;
}
