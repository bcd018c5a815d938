// The Head: one loaded model head on one device with one route. It owns the
// mapped GGUF file, the spec, the device and the logits buffer; calls are
// serialized by a mutex (a Head is safe to share between threads).
#pragma once
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "device.h"
#include "head_spec.h"
#include "route.h"

namespace muser {

class GGUFFile;

struct HeadOptions {
  std::string device = "cpu";
  Route route = Route::Graph;
  Acts acts = Acts::F32;
  int threads = 0;  // 0: the device's default; 1..cpu::kMaxThreads, else ArgValueError
  SpecOverrides overrides;
};

class Head {
 public:
  static std::shared_ptr<Head> load(const std::string& path, const HeadOptions& options);
  static std::shared_ptr<Head> from_file(std::shared_ptr<GGUFFile> file, const HeadOptions& options);

  const HeadSpec& spec() const { return spec_; }
  const HeadOptions& options() const { return options_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::shared_ptr<GGUFFile>& file() const { return file_; }
  const WeightView& output_weight() const { return weights_.output; }
  Device& device() { return *device_; }

  // Runs t hidden states [t x H] into out [t x V] (host memory). When out is
  // null, writes the head's own buffer (grown when t needs more) and returns
  // it. Thread-safe: concurrent calls are serialized.
  std::shared_ptr<HostBuffer> run(const float* hidden, int t, float* out, std::vector<NodeTiming>* timings);

  // The buffer the next call without `out` writes (may be null before the first call).
  std::shared_ptr<HostBuffer> buffer() const;

  std::mutex& mutex() { return mu_; }

 private:
  Head() = default;
  std::shared_ptr<GGUFFile> file_;
  HeadSpec spec_;
  HeadOptions options_;
  HeadWeights weights_;
  std::vector<Node> nodes_;
  std::unique_ptr<Device> device_;
  std::shared_ptr<HostBuffer> buffer_;
  mutable std::mutex mu_;
};

}  // namespace muser
