// Error checking for every CUDA runtime call and kernel launch. Host code
// (.cpp) and the launch layers of the .cu files both use it; failures become
// muser::DeviceError with the call, the CUDA error name and, for allocations,
// the byte count, so Python sees a muser.Error instead of a crash.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "errors.h"

namespace muser::cuda {

[[noreturn]] void throw_cuda_error(cudaError_t err, const std::string& what);

inline void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) throw_cuda_error(err, what);
}

// After a launch: a bad configuration surfaces at once, an illegal access
// only at the next synchronizing call (also checked).
inline void check_launch(const char* kernel) { check(cudaGetLastError(), kernel); }

// cudaMalloc that reports an out-of-memory as DeviceError naming the bytes,
// the purpose and the device (the error is not sticky; the device stays usable).
void* device_alloc(size_t bytes, const char* what, int ordinal);

// Makes `ordinal` current for a scope and restores the caller's device
// (PyTorch or CuPy in the same thread may be using another one).
class DeviceScope {
 public:
  explicit DeviceScope(int ordinal);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace muser::cuda
