// Whether the route's launches use programmatic dependent launch (pdl.cuh).
#include <cstdlib>
#include <cstring>

#include "pdl.cuh"

namespace muser::cuda {

bool pdl_enabled() {
  static const bool allowed = [] {
    const char* e = std::getenv("MUSER_PDL");  // MUSER_PDL=0: plain launches, for measuring the difference
    return !(e && std::strcmp(e, "0") == 0);
  }();
  if (!allowed) return false;
  int dev = 0, major = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute(compute capability)");
  return major >= 9;
}

}  // namespace muser::cuda
