// The Head: one loaded model head on one device with one route. It owns the
// mapped GGUF file, the spec, the device and a small pool of logits buffers;
// calls are serialized by a mutex, and each call's logits are its own: a
// pooled buffer is written again only when nothing else holds it (a Head is
// safe to share between threads, and a returned view is never overwritten).
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
  bool mmap = true;  // false: read the file into private memory at load (no window for a changing file)
  bool fuse = true;  // run the adjacent nodes the route allows to fuse as one kernel where the device can
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
  // null, writes a buffer no one else holds (from the pool, or a new one) and
  // returns it: the caller's until it lets go. Thread-safe: concurrent calls
  // are serialized. Throws GGUFError when the mapped file changed since load.
  std::shared_ptr<HostBuffer> run(const float* hidden, int t, float* out, std::vector<NodeTiming>* timings);

  // The buffer the latest call without `out` wrote, while something holds it
  // or it waits in the pool (null before the first call).
  std::shared_ptr<HostBuffer> buffer() const;

  // Throws GGUFError when the head reads the file's mapping at step time and
  // the file changed since load (its identity: size, mtime, ctime, inode).
  void check_file() const;

  // Most pooled logits buffers; a call that finds them all held gets a one-off buffer.
  static constexpr size_t kPoolSize = 4;

  std::mutex& mutex() { return mu_; }

 private:
  Head() = default;
  std::shared_ptr<GGUFFile> file_;
  HeadSpec spec_;
  HeadOptions options_;
  HeadWeights weights_;
  std::vector<Node> nodes_;
  std::unique_ptr<Device> device_;
  std::vector<std::shared_ptr<HostBuffer>> pool_;
  std::weak_ptr<HostBuffer> last_;  // what buffer() returns (weak: it must not keep a buffer busy)
  mutable std::mutex mu_;
};

}  // namespace muser
