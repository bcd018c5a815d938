// The backend interface. A device is prepared once per head with the spec,
// the weights and the route's nodes, and builds its plan then (pipelines, the
// steps it fuses, graphs); a call only runs that plan. What only some devices
// can do (logits that stay in device memory, top-k on the device, a device
// scan for NaN) is a virtual with a host default, and callers ask caps()
// instead of testing a device's name.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "head_spec.h"
#include "muser/sample.h"
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

// The bytes the weights point into: the GGUF file's mapping (or its private
// copy), page-aligned, so a device can wrap it without a copy (Metal's
// newBufferWithBytesNoCopy). Empty for weights that live elsewhere.
struct HostMapping {
  const uint8_t* base = nullptr;
  size_t size = 0;   // bytes
  size_t page = 0;   // the host's page size; base is a multiple of it
};

struct HeadWeights {
  WeightView output;
  std::vector<float> gamma;  // [H]
  HostMapping mapping;
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

// Memory of a device with memory of its own (a GPU), freed with its last owner.
struct ResidentBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  virtual ~ResidentBuffer() = default;
};

struct NodeTiming {
  std::string label;  // the step's nodes' labels joined by '+' ("lm_head+softcap")
  std::string kind;   // their kinds, joined the same way
  double seconds = 0;
  double bytes = 0;  // bytes the step must move (reads + writes)
};

// What the consumer layer asks of a call's logits (docs/numerics.md, "The
// vocabulary reduction"): each row's canonical logsumexp and, for m chosen ids
// per row, their logit and 1-based rank (ties: the lower id first; NaN behind
// every number) -- reduced tile by tile, so no [t x V] logits are kept.
struct VocabScores {
  int m = 0;                     // chosen ids per row (0: the logsumexp alone)
  const int64_t* ids = nullptr;  // host [t x m], each in [0, V)
  float* lse = nullptr;          // host [t]
  float* values = nullptr;       // host [t x m]
  float* logprobs = nullptr;     // host [t x m]: value - lse
  int64_t* ranks = nullptr;      // host [t x m]
  // Device-resident hidden states: the device checks them for NaN/inf as part
  // of its own work (no round trip of its own) and reports the lowest bad
  // index, or -1, in first_nonfinite. Only devices with memory of their own see it set.
  bool check_hidden = false;
  int64_t first_nonfinite = -1;
  // A device with memory of its own also leaves the results there when asked:
  // device_out holds them as vocab_scores_layout places them.
  bool keep_on_device = false;
  std::shared_ptr<ResidentBuffer> device_out;
};
// Byte offsets of VocabScores::device_out for t rows of m ids: lse [t] at 0,
// values [t x m], logprobs [t x m], ranks [t x m] (int64, 8-aligned).
struct VocabScoresLayout {
  size_t values, logprobs, ranks, bytes;
};
inline VocabScoresLayout vocab_scores_layout(int64_t t, int64_t m) {
  VocabScoresLayout l;
  l.values = (size_t)t * 4;
  l.logprobs = l.values + (size_t)(t * m) * 4;
  l.ranks = (l.logprobs + (size_t)(t * m) * 4 + 7) / 8 * 8;
  l.bytes = l.ranks + (size_t)(t * m) * 8;
  return l;
}

// What Device::sample draws with (muser/sample.h), in host memory.
struct SampleRequest {
  SampleParams params{};
  const float* bias = nullptr;          // [V] or null
  const uint8_t* allowed = nullptr;     // [V] or null
  const uint64_t* positions = nullptr;  // [t]
  // as VocabScores: a device-resident hidden state checked in the device's own work
  bool check_hidden = false;
  int64_t first_nonfinite = -1;
  // as VocabScores: device_out holds tokens [t] (int64) | logprobs [t] |
  // processed_logprobs [t] | kept_mass [t] (float32)
  bool keep_on_device = false;
  std::shared_ptr<ResidentBuffer> device_out;
};

// What one call asks of a device with memory of its own besides the route's
// logits (Device::run_call): the NaN scan of a resident hidden state, the k
// best of each row, the caller's stream. CUDA runs all of it as one graph
// whose results come back in one small copy.
struct CallRequest {
  bool check_finite = false;  // scan a resident hidden state for NaN/inf (host ones are scanned by the caller)
  bool log_softmax = false;   // logits - their row's logsumexp, in place
  int k = 0;                  // > 0: the k best of each row into ids/vals (host [t x k])
  bool ids_only = false;      // with k == 1: argmax, vals untouched
  int64_t* ids = nullptr;
  float* vals = nullptr;
  bool has_stream = false;    // run on `stream` (CUDA: a cudaStream_t) instead of the device's own
  void* stream = nullptr;
  bool wait = true;           // false (only with has_stream, no check, k == 0): return with the work queued
};
struct CallResult {
  std::shared_ptr<ResidentBuffer> logits;  // null when first_bad >= 0
  int64_t first_bad = -1;                  // lowest index of a NaN/inf in the hidden state, or -1
};

// What a device can do beyond run(). The defaults are the CPU's.
struct DeviceCaps {
  bool resident_logits = false;  // run_resident(): logits stay in device memory
  bool ranks_on_device = false;  // topk() ranks resident logits on the device
  int dlpack_device = 1;         // DLPack device type of its memory (1 = kDLCPU, 2 = kDLCUDA, 8 = kDLMetal)
  int compute_device = 1;        // DLPack device type of the processor that runs its kernels: differs from
                                 // dlpack_device on Metal (8), whose logits are host memory (1, unified)
  int ordinal = 0;
  int max_topk = 0;              // largest k topk() takes (0: any k up to V)
  bool sample_on_device = false;  // sample() draws on the device
};

class Device {
 public:
  virtual ~Device() = default;
  virtual std::string name() const = 0;
  virtual DeviceCaps caps() const { return {}; }
  // Called once at load with the route's nodes. The weights' bytes stay valid
  // for the device's life. `fuse`: run the adjacent nodes the route allows to
  // fuse as one kernel where the device has that kernel (plan_steps).
  virtual void prepare(const HeadSpec& spec, const HeadWeights& weights, const std::vector<Node>& nodes,
                       bool fuse) = 0;
  // The nodes and the steps (each one kernel) prepare() planned.
  const std::vector<Node>& nodes() const { return nodes_; }
  const std::vector<Step>& steps() const { return steps_; }
  // Whether a step reads the weights' host bytes (the GGUF mapping) rather
  // than a copy made at prepare: then a file changed after load matters.
  virtual bool reads_host_weights() const { return true; }
  // Host memory for n floats (pinned on GPUs, 64-byte aligned on the CPU).
  virtual std::shared_ptr<HostBuffer> alloc_host(size_t n);
  // Runs the prepared nodes on t hidden states (host memory, [t x H]) into
  // logits (host memory, [t x V]). When timings is non-null, one entry per step.
  virtual void run(const float* hidden, int t, float* logits, std::vector<NodeTiming>* timings) = 0;

  // ---- abilities (caps()); the defaults throw DeviceError or work on host memory ----
  // Runs into logits that stay in device memory: a pooled buffer nothing else
  // holds. hidden is host memory, or this device's when hidden_resident.
  virtual std::shared_ptr<ResidentBuffer> run_resident(const float* hidden, bool hidden_resident, int t,
                                                       std::vector<NodeTiming>* timings);
  // The k best of each of t rows of logits [t x V] (resident memory when
  // caps().ranks_on_device, else host memory), best first, ties to the lower
  // id, NaN never ahead of a number; ids and vals are host arrays of t*k.
  virtual void topk(const float* logits, int t, int k, int64_t* ids, float* vals);
  // Lowest index of a NaN/inf in n floats of this device's memory, or -1.
  virtual int64_t find_nonfinite(const float* x, int64_t n);
  // Copies n floats of this device's memory to host memory (synchronous).
  virtual void download(const float* src, float* dst, size_t n);
  // The ordinal of the device of this kind that owns p, or -1 when p is not its memory.
  virtual int owner_of(const void* p) const;
  // Seconds of each of `reps` runs of the whole prepared route as a call runs
  // it, after one untimed call (held: behind a stream hold where the device
  // has one, so host launch latency is not timed).
  virtual std::vector<double> route_seconds(const float* hidden, bool hidden_resident, int t, int reps, bool held);
  // Runs the route on t hidden states and reduces its logits over the
  // vocabulary into `out` (VocabScores), in at most a bounded scratch
  // (kVocabScratchBytes) where the device works in groups of tokens (and
  // slices of the vocabulary). The default runs the whole route into host
  // memory and reduces that.
  virtual void score(const float* hidden, bool hidden_resident, int t, VocabScores& out);
  // One call as CallRequest asks (a device with memory of its own). The
  // default runs find_nonfinite, run_resident(_log_softmax) and topk in turn
  // and takes no stream.
  virtual CallResult run_call(const float* hidden, bool hidden_resident, int t, const CallRequest& req);
  // run_resident, then each row's logits - their logsumexp, in place (the CUDA
  // device runs both as one graph). The default reduces on the host, so it
  // serves devices whose resident logits are host memory.
  virtual std::shared_ptr<ResidentBuffer> run_resident_log_softmax(const float* hidden, bool hidden_resident, int t);
  // Each row of logits [t x V] that this device wrote into host-visible memory
  // of its own (alloc_host) minus its logsumexp, in place, on the device; false
  // where it does not (the default; memory it did not make), and the caller
  // reduces them on the host (the same bits: muser/logsumexp.h's order).
  virtual bool log_softmax_in_place(float* /*logits*/, int /*t*/) { return false; }
  // Runs the route and draws one token per row into out [t] on the device,
  // with the bits of muser/sample.h's sample_row on the route's logits; false
  // when it does not for this request or one of its rows (a non-finite or
  // empty row, a top_p prefix past what it ranked, top_k past max_topk): the
  // caller then samples the route's host logits, which also names what went
  // wrong. The default does not (false).
  virtual bool sample(const float* hidden, bool hidden_resident, int t, SampleRequest& req, SampleResult* out);

 protected:
  // What every prepare() records first: the spec, the nodes and their steps.
  void plan(const HeadSpec& spec, const std::vector<Node>& nodes, bool fuse, bool (*fusable)(NodeKind, NodeKind));
  HeadSpec spec_;
  std::vector<Node> nodes_;
  std::vector<Step> steps_;
};

// The most scratch memory a device's score() takes for logits at once: its
// tokens run in groups, and CUDA's over the vocabulary in slices, whose logits
// fit this many bytes (at least one row). 128 MiB holds 256 tokens' logits over
// slices of 131,072 ids: the largest token launch of the CUDA matvecs (the q8
// kernels' 256), so a group reads the weight no more often than the plain call.
constexpr size_t kVocabScratchBytes = size_t{128} << 20;

// Ranks t rows of host logits [t x V]: the k best of each, best first, ties to
// the lower id, NaN after every number (the order every backend's top-k keeps).
void host_topk(const float* logits, int t, int64_t V, int k, int64_t* ids, float* vals);

// "cpu", "cuda", "cuda:N", "metal" (src/cpp/device.cpp). Throws DeviceError
// for a backend this build lacks or a device that is absent. threads <= 0:
// the default.
std::unique_ptr<Device> make_device(const std::string& name, int threads);

// Each backend's factory; a backend that was not built links a stub that
// throws DeviceError naming the missing build (src/cpp/stubs/).
std::unique_ptr<Device> make_cpu_device(int threads);
std::unique_ptr<Device> make_cuda_device(int ordinal);
std::unique_ptr<Device> make_metal_device();

// Bytes a node moves for t tokens (for profiles and GB/s).
double node_bytes(const Node& n, const HeadSpec& spec, const WeightView& w, int t);
// The same for a step: its nodes' bytes, less the intermediate writes and
// reads a fused kernel never makes.
double step_bytes(const std::vector<Node>& nodes, const Step& step, const HeadSpec& spec, const WeightView& w, int t);

}  // namespace muser
