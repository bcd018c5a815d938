// Argument structs of the emulator's own test kernels, shared by the kernels
// (compiled as C++ on the Metal shim) and the test program. Fixed-width
// fields only: both sides name uint32_t/float the same.
#pragma once

struct EmuTestArgs {
  uint32_t n;       // elements
  uint32_t offset;  // first element written (write_range)
  float value;      // value written (write_range)
  uint32_t pad;
};
