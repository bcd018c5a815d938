// The read limit bench/metal_head.py divides by: stream a buffer once, one
// 32-bit word per thread per step over a grid-stride loop (consecutive
// threads read consecutive words: coalesced). The XOR of what a thread read
// goes to its own sink word, so the loads cannot be dropped.
// Buffers: 0 ReadKargs, 1 p [n words], 2 sink [grid threads]; grid: a.stride threads.
#include "common.h"

using namespace muser;

MUSER_KERNEL(read_bandwidth_u32, MUSER_ARG_CONSTANT(ReadKargs, a, 0), MUSER_ARG_BUFFER_IN(uint, p, 1),
             MUSER_ARG_BUFFER_OUT(uint, sink, 2), MUSER_ARG_TID(i)) {
  uint acc = 0;
  for (int64_t j = (int64_t)i; j < a.n; j += a.stride) acc ^= p[j];
  if ((int64_t)i < a.stride) sink[i] = acc;
}
