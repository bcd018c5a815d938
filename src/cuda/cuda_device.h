// What the bindings need from the CUDA device beyond muser::Device: running
// on hidden states already in GPU memory, device logits that outlive the
// call, top-k on the device. Plain C++ (no CUDA headers), so bindings compile
// without nvcc; only built when MUSER_HAVE_CUDA.
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
struct DeviceMemory {
  void* ptr = nullptr;
  size_t bytes = 0;
  int ordinal = 0;
  DeviceMemory(size_t bytes, int ordinal, const char* what);
  ~DeviceMemory();
  DeviceMemory(const DeviceMemory&) = delete;
  DeviceMemory& operator=(const DeviceMemory&) = delete;
};

class CudaDevice : public Device {
 public:
  virtual int ordinal() const = 0;
  // Runs the nodes on t hidden states [t x H] f32 (host memory, or this GPU's
  // memory when hidden_on_device) into device logits [t x V]. The returned
  // memory is a pooled buffer that nothing else held: later calls write it
  // only after every other owner (a Python view) has let go.
  virtual std::shared_ptr<DeviceMemory> run_to_device(const std::vector<Node>& nodes, Acts acts, const float* hidden,
                                                      bool hidden_on_device, int t,
                                                      std::vector<NodeTiming>* timings) = 0;
  // Device seconds of each of `reps` runs of the whole route as it is
  // launched for a call (one CUDA graph; no events between its nodes), after
  // one untimed call with the same arguments. held: each run is enqueued
  // behind hold_stream, so its time excludes the host's launch latency.
  virtual std::vector<double> route_seconds(const std::vector<Node>& nodes, Acts acts, const float* hidden,
                                            bool hidden_on_device, int t, int reps, bool held) = 0;
  // The k best logits of each of t rows of device logits [t x V] (k <= kTopkMax, muser/kernel_args.h),
  // best first; ids and vals are host arrays of t*k.
  virtual void topk(const float* logits, int t, int k, int64_t* ids, float* vals) = 0;
  // Lowest index of a NaN/inf in n floats of this GPU's memory, or -1.
  virtual int64_t find_nonfinite(const float* x, int64_t n) = 0;
  // Copies n floats of this GPU's memory to host memory (synchronous).
  virtual void download(const float* src, float* dst, size_t n) = 0;
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
// Synchronous copy of bytes of device memory (any visible GPU) to host memory.
void copy_to_host(const void* src, void* dst, size_t bytes);

}  // namespace muser::cuda
