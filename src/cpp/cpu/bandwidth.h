// Read bandwidth of this machine (see bandwidth.cpp).
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace muser::cpu {

struct ReadBandwidth {
  size_t bytes = 0;              // bytes read per repeat
  int threads = 0;
  std::vector<double> seconds;   // one entry per repeat
  uint64_t checksum = 0;         // the sum read (keeps the reads observable)
};

// Stream nbytes (>= 1 MiB) with `threads` threads, `repeats` times.
ReadBandwidth read_bandwidth(size_t nbytes, int threads, int repeats);

}  // namespace muser::cpu
