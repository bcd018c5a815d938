// The CUDA backend's helpers the bindings and benches use beyond
// muser::Device (whose abilities the device implements: resident logits,
// top-k and the NaN scan on the GPU). Plain C++ (no CUDA headers), so
// bindings compile without nvcc; only built when MUSER_HAVE_CUDA.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "device.h"

namespace muser::cuda {

// GPU memory that frees itself when the last owner lets go (views of device
// logits hold one, so they stay valid after the Head is gone).
struct DeviceMemory : ResidentBuffer {
  int ordinal = 0;
  DeviceMemory(size_t bytes, int ordinal, const char* what);
  ~DeviceMemory() override;
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
};

// GPUs visible to this process; 0 (never an exception) without a driver or GPU.
int device_count() noexcept;
// Why device_count() is 0, for skip reasons and messages ("" when it is not).
std::string no_device_reason();
// The device ordinal that owns a pointer, or -1 when it is not device memory.
int pointer_device(const void* p);
// Seconds of each of `iters` timed passes of the read kernel over nbytes
// (held: each enqueued behind hold_stream, as route_seconds).
std::vector<double> read_bandwidth_seconds(size_t nbytes, int iters, int ordinal, bool held);
// "NVIDIA H200 (sm_90, 132 SMs, 139.8 GiB)"
std::string device_description(int ordinal);
// (free, total) bytes of a GPU's memory, as cudaMemGetInfo reports them.
std::vector<size_t> memory_info(int ordinal);
// Makes stream `waiter` wait for the work queued on stream `waited` so far (handles as
// the CUDA runtime takes them: 0 the default stream, 1 legacy, 2 per-thread).
void stream_wait(uintptr_t waiter, uintptr_t waited);
// Synchronous copy of bytes of device memory (any visible GPU) to host memory.
void copy_to_host(const void* src, void* dst, size_t bytes);

}  // namespace muser::cuda
