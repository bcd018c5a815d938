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

// A vocabulary shard: the LM-head rows [start, stop) one Head computes
// (docs/numerics.md, "Sharded heads").
struct RowRange {
  int64_t start = 0;
  int64_t stop = 0;
  int64_t count() const { return stop - start; }
};

// Rows of shard `rank` of `world` over `vocab` rows: [floor(rank V / world),
// floor((rank + 1) V / world)), so every row lands in exactly one shard and
// shard sizes differ by at most one. Throws ArgValueError unless world >= 1,
// 0 <= rank < world and world <= vocab (no shard is empty).
RowRange shard_row_range(int64_t vocab, int64_t rank, int64_t world);

struct HeadOptions {
  std::string device = "cpu";
  Route route = Route::Graph;
  Acts acts = Acts::F32;
  int threads = 0;  // 0: the device's default; 1..cpu::kMaxThreads, else ArgValueError
  bool mmap = true;  // false: read the file into private memory at load (no window for a changing file)
  bool fuse = true;  // run the adjacent nodes the route allows to fuse as one kernel where the device can
  SpecOverrides overrides;
  int64_t shard_rank = 0;   // this Head computes rows shard_row_range(V, shard_rank, shard_world)
  int64_t shard_world = 1;  // 1: the whole vocabulary
};

class Head {
 public:
  static std::shared_ptr<Head> load(const std::string& path, const HeadOptions& options);
  static std::shared_ptr<Head> from_file(std::shared_ptr<GGUFFile> file, const HeadOptions& options);

  // The spec the device runs: vocab is the shard's row count (the model's V when unsharded).
  const HeadSpec& spec() const { return spec_; }
  // The model's vocabulary (rows of the file's output weight) and this Head's rows of it.
  int64_t model_vocab() const { return model_vocab_; }
  const RowRange& rows() const { return rows_; }
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

  // Device::log_softmax_in_place on logits a call of this head wrote, under the
  // calls' lock; false: the caller reduces them on the host.
  bool log_softmax_in_place(float* logits, int t);

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
  int64_t model_vocab_ = 0;
  RowRange rows_;
  HeadOptions options_;
  HeadWeights weights_;
  std::vector<Node> nodes_;
  std::unique_ptr<Device> device_;
  std::vector<std::shared_ptr<HostBuffer>> pool_;
  std::weak_ptr<HostBuffer> last_;  // what buffer() returns (weak: it must not keep a buffer busy)
  mutable std::mutex mu_;
};

}  // namespace muser
