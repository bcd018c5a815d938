// The backend interface: a device owns one pipeline per node kind, keeps the
// weights where its kernels read them (the mmap on the CPU, uploaded once on
// a GPU) and runs a route's nodes in order with a barrier between them.
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "head_spec.h"
#include "route.h"

namespace muser {

// A row-major quantized (or float) matrix as stored in the GGUF file.
struct WeightView {
  uint32_t type = 0;      // ggml type id
  int64_t rows = 0;       // V
  int64_t cols = 0;       // H, elements per row
  int64_t row_bytes = 0;  // bytes per row
  const uint8_t* data = nullptr;
};

struct HeadWeights {
  WeightView output;
  std::vector<float> gamma;  // [H]
  std::vector<float> beta;   // [H] or empty
  std::vector<float> bias;   // [V] or empty
};

// Host memory a device writes logits into. Python views of it hold a
// shared_ptr, so the memory outlives the Head while any view exists.
struct HostBuffer {
  float* data = nullptr;
  size_t count = 0;  // floats
  std::function<void(float*)> release;
  HostBuffer() = default;
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() {
    if (data && release) release(data);
  }
};

struct NodeTiming {
  std::string label;
  std::string kind;
  double seconds = 0;
  double bytes = 0;  // bytes the node must move (reads + writes)
};

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;
  // Called once at load; the weights' bytes stay valid for the device's life.
  virtual void prepare(const HeadSpec& spec, const HeadWeights& weights) = 0;
  // Whether a step reads the weights' host bytes (the GGUF mapping) rather
  // than a copy made at prepare: then a file changed after load matters.
  virtual bool reads_host_weights() const { return true; }
  // Host memory for n floats (pinned on GPUs, 64-byte aligned on the CPU).
  virtual std::shared_ptr<HostBuffer> alloc_host(size_t n);
  // Run the nodes on t hidden states (host memory, [t x H]) into logits
  // (host memory, [t x V]). When timings is non-null, one entry per node.
  virtual void run(const std::vector<Node>& nodes, Acts acts, const float* hidden, int t, float* logits,
                   std::vector<NodeTiming>* timings) = 0;
};

// "cpu", "cuda", "cuda:N", "metal". Throws DeviceError for a backend this
// build lacks or a device that is absent. threads <= 0: the default.
std::unique_ptr<Device> make_device(const std::string& name, int threads);

// Bytes a node moves for t tokens (for profiles and GB/s).
double node_bytes(const Node& n, const HeadSpec& spec, const WeightView& w, int t);

}  // namespace muser
