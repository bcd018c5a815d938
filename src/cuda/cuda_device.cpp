// The CUDA device: weights uploaded once at load, in the device layout (device_layout.h), one stream
// per device, nodes launched in route order on that stream (stream order is
// the barrier between dependent nodes), CUDA events around each node when a
// profile is asked for, pinned host memory for the logits the Head returns.
//
// The stream is a blocking one: it waits for work queued on the legacy
// default stream, where PyTorch and CuPy put their work unless told
// otherwise, so a device hidden state they just wrote is complete before our
// first kernel reads it. Every call ends with a stream synchronize, so
// returned device logits are ready for any consumer -- except run_call on a
// caller's stream with nothing to wait for (stream=, check_finite=False),
// which returns with its work queued there (or captured into the caller's graph).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "cuda_check.h"
#include "cuda_device.h"
#include "device.h"
#include "errors.h"
#include "kernels.h"
#include "muser/kernel_args.h"
#include "muser/logsumexp.h"
#include "quant_types.h"

namespace muser {

namespace cuda {

namespace {

std::string with_commas(size_t v) {
  std::string s = std::to_string(v);
  for (int i = (int)s.size() - 3; i > 0; i -= 3) s.insert((size_t)i, ",");
  return s;
}

}  // namespace

[[noreturn]] void throw_cuda_error(cudaError_t err, const std::string& what) {
  (void)cudaGetLastError();  // clear a non-sticky error so the device stays usable
  throw DeviceError("CUDA error in " + what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")");
}

void* device_alloc(size_t bytes, const char* what, int ordinal) {
  void* p = nullptr;
  const cudaError_t err = cudaMalloc(&p, bytes ? bytes : 1);
  if (err == cudaSuccess) return p;
  (void)cudaGetLastError();
  if (err == cudaErrorMemoryAllocation) {
    size_t free_b = 0, total_b = 0;
    const bool info = cudaMemGetInfo(&free_b, &total_b) == cudaSuccess;
    (void)cudaGetLastError();
    throw DeviceError("out of device memory on cuda:" + std::to_string(ordinal) + " allocating " + with_commas(bytes) +
                      " bytes for " + what +
                      (info ? " (" + with_commas(free_b) + " of " + with_commas(total_b) + " bytes free)" : ""));
  }
  throw_cuda_error(err, std::string("cudaMalloc(") + with_commas(bytes) + " bytes for " + what + ")");
}

std::vector<size_t> memory_info(int ordinal) {
  DeviceScope scope(ordinal);
  size_t free_b = 0, total_b = 0;
  check(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  return {free_b, total_b};
}

DeviceScope::DeviceScope(int ordinal) {
  int cur = -1;
  if (cudaGetDevice(&cur) == cudaSuccess && cur != ordinal) {
    if (cudaSetDevice(ordinal) == cudaSuccess) previous_ = cur;
  }
  (void)cudaGetLastError();
}

DeviceScope::~DeviceScope() {
  if (previous_ >= 0) (void)cudaSetDevice(previous_);
}

DeviceMemory::DeviceMemory(size_t n, int dev, const char* what) : ordinal(dev) {
  DeviceScope scope(dev);
  ptr = device_alloc(n, what, dev);
  bytes = n;
}

DeviceMemory::~DeviceMemory() {
  if (!ptr) return;
  DeviceScope scope(ordinal);
  (void)cudaFree(ptr);  // may fail at interpreter exit once the runtime is unloading: nothing to do then
  (void)cudaGetLastError();
}

int device_count() noexcept {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

std::string no_device_reason() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  (void)cudaGetLastError();
  if (err != cudaSuccess) return std::string("no CUDA device is visible (") + cudaGetErrorName(err) + ": " +
                                 cudaGetErrorString(err) + ")";
  if (n == 0) return "no CUDA device is visible (the driver reports 0 devices)";
  return "";
}

int pointer_device(const void* p) {
  cudaPointerAttributes attr{};
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    (void)cudaGetLastError();
    return -1;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged ? attr.device : -1;
}

std::string device_description(int ordinal) {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties");
  char buf[96];
  std::snprintf(buf, sizeof buf, " (sm_%d%d, %d SMs, %.1f GiB)", prop.major, prop.minor, prop.multiProcessorCount,
                (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));
  return std::string(prop.name) + buf;
}

void stream_wait(uintptr_t waiter, uintptr_t waited) {
  cudaEvent_t ev = nullptr;
  check(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming), "cudaEventCreate");
  const cudaError_t rec = cudaEventRecord(ev, reinterpret_cast<cudaStream_t>(waited));
  const cudaError_t wait = rec == cudaSuccess ? cudaStreamWaitEvent(reinterpret_cast<cudaStream_t>(waiter), ev, 0) : rec;
  cudaEventDestroy(ev);  // released once the wait is done
  check(wait, "cudaStreamWaitEvent (a consumer's stream on the logits' stream)");
}

void copy_to_host(const void* src, void* dst, size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToHost), "cudaMemcpy (device to host)");
}

std::vector<double> read_bandwidth_seconds(size_t nbytes, int iters, int ordinal, bool held) {
  if (iters < 1) throw ArgValueError("iters must be >= 1, got " + std::to_string(iters));
  if (nbytes < 16) throw ArgValueError("nbytes must be >= 16, got " + std::to_string(nbytes));
  DeviceScope scope(ordinal);
  nbytes &= ~(size_t)15;
  DeviceMemory buf(nbytes, ordinal, "the read-bandwidth buffer");
  const int sink_words = read_bandwidth_sink_words(ordinal);
  DeviceMemory sink((size_t)sink_words * 4, ordinal, "the read-bandwidth sink");
  check(cudaMemset(buf.ptr, 0x5A, nbytes), "cudaMemset(read-bandwidth buffer)");  // not zeros: see METHOD.md
  cudaStream_t stream = nullptr;
  check(cudaStreamCreate(&stream), "cudaStreamCreate");
  cudaEvent_t start = nullptr, stop = nullptr;
  std::vector<double> seconds;
  try {
    check(cudaEventCreate(&start), "cudaEventCreate");
    check(cudaEventCreate(&stop), "cudaEventCreate");
    for (int i = 0; i < 2; ++i) read_bandwidth(buf.ptr, nbytes, static_cast<unsigned*>(sink.ptr), sink_words, stream);
    for (int i = 0; i < iters; ++i) {
      if (held) hold_stream(stream, kHoldMicroseconds);
      check(cudaEventRecord(start, stream), "cudaEventRecord");
      read_bandwidth(buf.ptr, nbytes, static_cast<unsigned*>(sink.ptr), sink_words, stream);
      check(cudaEventRecord(stop, stream), "cudaEventRecord");
      check(cudaEventSynchronize(stop), "read_bandwidth (synchronize)");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, start, stop), "cudaEventElapsedTime");
      seconds.push_back(ms * 1e-3);
    }
  } catch (...) {
    if (start) cudaEventDestroy(start);
    if (stop) cudaEventDestroy(stop);
    cudaStreamDestroy(stream);
    throw;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  return seconds;
}

namespace {

// A device buffer that grows (never shrinks) to the largest call seen.
struct Scratch {
  std::shared_ptr<DeviceMemory> mem;
  void* ensure(size_t bytes, int ordinal, const char* what) {
    if (!mem || mem->bytes < bytes) {
      mem.reset();  // free first: the old contents are not needed
      mem = std::make_shared<DeviceMemory>(bytes, ordinal, what);
    }
    return mem->ptr;
  }
  // The same for a buffer that is zero at rest (its kernels leave it so): zeroed,
  // and synchronized, only when allocated anew -- outside any capture.
  void* ensure_zeroed(size_t bytes, int ordinal, const char* what, cudaStream_t stream) {
    if (mem && mem->bytes >= bytes) return mem->ptr;
    ensure(bytes, ordinal, what);
    check(cudaMemsetAsync(mem->ptr, 0, mem->bytes, stream), what);
    check(cudaStreamSynchronize(stream), what);
    return mem->ptr;
  }
};

bool is_q8(NodeKind k) { return k == NodeKind::MatvecQ8 || k == NodeKind::MatvecQ8Reference; }

// The element-wise op of a node kind (EpilogueOp::None: not an element-wise node).
EpilogueOp epilogue_op_of(NodeKind k) {
  switch (k) {
    case NodeKind::Scale: return EpilogueOp::Scale;
    case NodeKind::Tanh: return EpilogueOp::Tanh;
    case NodeKind::SoftcapFused: return EpilogueOp::SoftcapFused;
    case NodeKind::SoftcapReference: return EpilogueOp::SoftcapReference;
    case NodeKind::SoftcapCanon: return EpilogueOp::SoftcapCanon;
    default: return EpilogueOp::None;
  }
}

// An element-wise node as the kernels that apply it on a logit take it: its op
// and its own parameters (each op reads only the ones it uses).
EpilogueFold epilogue_fold(const Node& n) {
  EpilogueFold f;
  f.op = epilogue_op_of(n.kind);
  if (f.op != EpilogueOp::None) f.f0 = n.f0, f.f1 = n.f1, f.f2 = n.f2;
  return f;
}

// What this backend fuses: the q8 matvec and the element-wise node after it,
// where the route allows it (the fused route's one soft-cap node; graph keeps
// its nodes): the matvec applies the node's own function (epilogue.cuh) as it
// stores each logit, so the bytes stay the epilogue kernel's and the route has
// one kernel fewer. Not the canonical soft cap: its longer code made the q8
// kernels at their register limit spill (Q6_K, t <= 8), so it stays a node
// (and the consumer kernels fold it: folded_epilogue). The norm and γ stay
// apart: a fused norm + γ kernel (one CTA per row) was measured 1.5 % slower
// on the q8 route at t = 1 (docs/performance.md, "Fusion on CUDA").
bool cuda_fusable(NodeKind a, NodeKind b) {
  const EpilogueOp op = epilogue_op_of(b);
  return is_q8(a) && op != EpilogueOp::None && op != EpilogueOp::SoftcapCanon;
}
// Routes with a q8 matvec also fuse RMSNorm → γ: one kernel (rms_norm_gamma_q8)
// writes the normed row and quantizes it for the matvec, which then skips its
// quantizer (CudaDevice::prologue_q8_). Float routes keep norm and γ apart (a
// one-CTA-per-row norm + γ kernel measured slower than the two overlapped).
bool cuda_fusable_q8(NodeKind a, NodeKind b) {
  return cuda_fusable(a, b) || ((a == NodeKind::RmsNorm || a == NodeKind::RmsNormCanon) && b == NodeKind::MulGamma);
}

class CudaDevice final : public Device {
 public:
  explicit CudaDevice(int ordinal) : ordinal_(ordinal) {
    DeviceScope scope(ordinal_);
    check(cudaSetDevice(ordinal_), "cudaSetDevice");
    check(cudaStreamCreate(&stream_), "cudaStreamCreate");
    own_stream_ = stream_;
    check(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking), "cudaStreamCreate (side)");
    for (cudaEvent_t* e : {&fork_ev_, &join_ev_, &done_ev_})
      check(cudaEventCreateWithFlags(e, cudaEventDisableTiming), "cudaEventCreate");
  }

  ~CudaDevice() override {
    DeviceScope scope(ordinal_);
    slots_.clear();
    for (auto& e : events_) {
      cudaEventDestroy(e.first);
      cudaEventDestroy(e.second);
    }
    for (cudaEvent_t e : {fork_ev_, join_ev_, done_ev_})
      if (e) cudaEventDestroy(e);
    if (side_) cudaStreamDestroy(side_);
    if (stream_) cudaStreamDestroy(stream_);
    (void)cudaGetLastError();
  }

  std::string name() const override { return "cuda:" + std::to_string(ordinal_); }
  DeviceCaps caps() const override {
    DeviceCaps c;
    c.resident_logits = true;
    c.ranks_on_device = true;
    c.dlpack_device = 2;  // kDLCUDA
    c.compute_device = 2;
    c.ordinal = ordinal_;
    c.max_topk = kTopkMax;
    c.sample_on_device = true;
    return c;
  }
  bool reads_host_weights() const override { return false; }  // uploaded at prepare
  int owner_of(const void* p) const override { return pointer_device(p); }

  void prepare(const HeadSpec& spec, const HeadWeights& w, const std::vector<Node>& nodes, bool fuse) override {
    DeviceScope scope(ordinal_);
    if (!matvec_supports(w.output.type))
      throw DeviceError(std::string("device '") + name() + "': no CUDA kernel for LM-head weight type " +
                        (type_traits(w.output.type).name ? type_traits(w.output.type).name : "?"));
    q8_ = false;
    for (const Node& n : nodes) q8_ = q8_ || is_q8(n.kind);
    plan(spec, nodes, fuse, q8_ ? cuda_fusable_q8 : cuda_fusable);
    // the first step is norm + γ fused, and the step after it the q8 matvec: its kernel quantizes
    prologue_q8_ = q8_ && steps_.size() > 1 && steps_[0].count == 2 && nodes_[1].kind == NodeKind::MulGamma &&
                   is_q8(nodes_[steps_[1].first].kind);
    out_ = w.output;
    weight_ = std::make_unique<DeviceMemory>(device_weight_bytes(out_.type, out_.rows, out_.row_bytes), ordinal_,
                                             "the LM-head weight");
    upload_weight(static_cast<uint8_t*>(weight_->ptr), out_.data, out_.type, out_.rows, out_.row_bytes, ordinal_,
                  stream_);
    gamma_ = upload(w.gamma, "the final-norm weight");
    out_.data = nullptr;  // the host bytes are not used after the upload
    scan_sync_.ensure_zeroed(kScanSyncBytes, ordinal_, "the NaN scan's state", stream_);  // before any capture
  }

  std::shared_ptr<HostBuffer> alloc_host(size_t n) override {
    DeviceScope scope(ordinal_);
    auto buf = std::make_shared<HostBuffer>();
    void* p = nullptr;
    const size_t bytes = std::max<size_t>(n, 1) * sizeof(float);
    const cudaError_t err = cudaHostAlloc(&p, bytes, cudaHostAllocPortable);
    if (err != cudaSuccess) {
      (void)cudaGetLastError();
      throw DeviceError("cudaHostAlloc of " + with_commas(bytes) + " bytes of pinned memory for logits failed: " +
                        cudaGetErrorString(err));
    }
    buf->data = static_cast<float*>(p);
    buf->count = n;
    buf->release = [](float* q) {
      (void)cudaFreeHost(q);
      (void)cudaGetLastError();
    };
    return buf;
  }

  void run(const float* hidden, int t, float* logits, std::vector<NodeTiming>* timings) override {
    auto dev_logits = run_resident(hidden, false, t, timings);
    DeviceScope scope(ordinal_);
    check(cudaMemcpyAsync(logits, dev_logits->ptr, (size_t)t * spec_.vocab * sizeof(float), cudaMemcpyDeviceToHost,
                          stream_),
          "download of the logits");
    check(cudaStreamSynchronize(stream_), "download of the logits (synchronize)");
  }

  std::shared_ptr<ResidentBuffer> run_resident(const float* hidden, bool hidden_on_device, int t,
                                               std::vector<NodeTiming>* timings) override {
    return run_route(hidden, hidden_on_device, t, timings, false);
  }

  // The route and the log-softmax kernels in one graph.
  std::shared_ptr<ResidentBuffer> run_resident_log_softmax(const float* hidden, bool hidden_on_device, int t) override {
    return run_route(hidden, hidden_on_device, t, nullptr, true);
  }

  std::shared_ptr<ResidentBuffer> run_route(const float* hidden, bool hidden_on_device, int t,
                                            std::vector<NodeTiming>* timings, bool log_softmax) {
    if (t < 1) throw ArgValueError("t must be >= 1");
    DeviceScope scope(ordinal_);
    const int64_t H = spec_.hidden, V = spec_.vocab;
    const size_t xbytes = (size_t)t * H * sizeof(float);
    const float* x = device_hidden(hidden, hidden_on_device, xbytes, stream_);
    float* normed = static_cast<float*>(normed_.ensure(xbytes, ordinal_, "normed hidden states"));
    const size_t lbytes = (size_t)t * V * sizeof(float);
    LogitsSlot* slot = logits_slot(lbytes, stream_, false);
    std::shared_ptr<DeviceMemory> result = slot ? slot->mem : std::make_shared<DeviceMemory>(lbytes, ordinal_, "logits");
    float* logits = static_cast<float*>(result->ptr);

    if (q8_) acts_q8_.ensure(acts_q8_scratch_bytes(out_.type, H, t), ordinal_, "int8 activations");
    last_graph_ = nullptr;
    if (!timings && slot) {
      // The route runs as one CUDA graph, captured once per shape and buffers
      // and replayed: the GPU gets every node at once (no launch gaps between
      // them) and the host pays one launch. Each pooled logits buffer has its
      // own graph, so alternating buffers costs no graph update.
      cudaGraphExec_t exec = route_graph(slot->graphs[0], x, normed, logits, t, log_softmax, CallExtras{});
      check(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch (route)");
      check(cudaStreamSynchronize(stream_), "the route's kernels (synchronize)");
      slot->stream = stream_;
      slot->async = false;
      last_graph_ = exec;
    } else if (!timings) {
      // every pooled buffer is held: a one-off buffer, its steps launched directly
      if (log_softmax) ensure_log_softmax(t);
      for (const Step& st : steps_) enqueue(st, x, normed, logits, t);
      if (log_softmax) enqueue_log_softmax(logits, t);
      check(cudaStreamSynchronize(stream_), "the route's kernels (synchronize)");
    } else {
      // Profile: the nodes, each between two event records, are captured into a
      // CUDA graph and launched at once, so the GPU runs them back to back and
      // no node's time includes the host's launch latency (which it would when
      // the GPU waits for the next launch: small nodes would look slow).
      ensure_events(steps_.size());
      cudaGraphExec_t exec = capture(x, normed, logits, t, true);
      const cudaError_t launched = cudaGraphLaunch(exec, stream_);
      const cudaError_t synced = cudaStreamSynchronize(stream_);
      cudaGraphExecDestroy(exec);
      check(launched, "cudaGraphLaunch (profile)");
      check(synced, "the route's kernels (synchronize)");
      for (size_t i = 0; i < steps_.size(); ++i) {
        float ms = 0;
        check(cudaEventElapsedTime(&ms, events_[i].first, events_[i].second), "cudaEventElapsedTime");
        std::string kinds;
        for (size_t k = steps_[i].first; k < steps_[i].first + steps_[i].count; ++k)
          kinds += (kinds.empty() ? "" : "+") + std::string(node_kind_name(nodes_[k].kind));
        timings->push_back({step_label(nodes_, steps_[i]), kinds, ms * 1e-3,
                            step_bytes(nodes_, steps_[i], spec_, out_, t)});
      }
    }
    return result;
  }

  std::vector<double> route_seconds(const float* hidden, bool hidden_on_device, int t, int reps,
                                    bool held) override {
    if (reps < 1) throw ArgValueError("reps must be >= 1, got " + std::to_string(reps));
    // buffers, the graph, a warm-up; keeping its logits buffer keeps it (and so its graph) ours while timing
    const auto timed_logits = run_resident(hidden, hidden_on_device, t, nullptr);
    if (!last_graph_) throw DeviceError("route_seconds: every pooled logits buffer is held by a view; let one go");
    const cudaGraphExec_t exec = last_graph_;
    DeviceScope scope(ordinal_);
    ensure_events(1);
    std::vector<double> seconds;
    for (int i = 0; i < reps; ++i) {
      if (held) hold_stream(stream_, kHoldMicroseconds);
      check(cudaEventRecord(events_[0].first, stream_), "cudaEventRecord");
      check(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch (route)");
      check(cudaEventRecord(events_[0].second, stream_), "cudaEventRecord");
      check(cudaEventSynchronize(events_[0].second), "the route's kernels (synchronize)");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, events_[0].first, events_[0].second), "cudaEventElapsedTime");
      seconds.push_back(ms * 1e-3);
    }
    return seconds;
  }

  // One call in one graph launch (CallRequest): the NaN scan of a resident
  // hidden state on a side branch of the graph, the route, argmax/top-k, whose
  // kernels write the results (first bad index | ids | values) straight into
  // mapped pinned memory; then one synchronize, or none (wait = false: the caller's stream
  // orders what follows). On a stream being captured (the caller's CUDA graph)
  // the kernels are enqueued on it directly, into that graph.
  CallResult run_call(const float* hidden, bool hidden_on_device, int t, const CallRequest& req) override {
    if (t < 1) throw ArgValueError("t must be >= 1");
    const int64_t H = spec_.hidden, V = spec_.vocab;
    if (req.k < 0 || req.k > kTopkMax || req.k > V || (req.ids_only && req.k != 1))
      throw ArgValueError("k must be in [1, min(V, " + std::to_string(kTopkMax) + ")] for top-k on the GPU, got " +
                          std::to_string(req.k));
    DeviceScope scope(ordinal_);
    const cudaStream_t s = req.has_stream ? static_cast<cudaStream_t>(req.stream) : own_stream_;
    bool capturing = false;
    // the legacy default stream is never captured (and asking costs microseconds)
    if (req.has_stream && s != nullptr && s != cudaStreamLegacy) {
      cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
      check(cudaStreamIsCapturing(s, &status), "cudaStreamIsCapturing (the stream passed as stream=)");
      capturing = status != cudaStreamCaptureStatusNone;
    }
    const bool scan = req.check_finite && hidden_on_device;
    // wait: for the whole route; a scan alone waits for the scan's answer (it runs beside
    // the route), then returns with the route queued, as a call without the scan does
    const bool wait = req.wait || req.k > 0 || !req.has_stream;
    // A call that waits anyway on the legacy default stream (PyTorch's and CuPy's unless told
    // otherwise) runs on our own blocking stream instead: the same order both ways, and a
    // cheaper synchronize than the legacy stream's.
    const bool legacy = s == nullptr || s == cudaStreamLegacy;
    const cudaStream_t run_on = wait && legacy && !capturing ? own_stream_ : s;
    if (capturing && (wait || scan))
      throw ArgValueError("the stream passed as stream= is being captured into a CUDA graph, and this call would "
                          "have to wait for the GPU (check_finite=True on a device hidden state, or a top-k): pass "
                          "check_finite=False to capture head(x, on_device=True)");
    if (capturing && !hidden_on_device)
      throw ArgValueError("capturing head(x, on_device=True) into a CUDA graph needs x in device memory");
    const size_t xbytes = (size_t)t * H * sizeof(float), lbytes = (size_t)t * V * sizeof(float);
    const size_t q8_bytes = q8_ ? acts_q8_scratch_bytes(out_.type, H, t) : 0;
    auto sized = [](const Scratch& sc, size_t n) { return sc.mem && sc.mem->bytes >= n; };
    if (capturing && (!sized(normed_, xbytes) || (q8_ && !sized(acts_q8_, q8_bytes))))
      throw ArgValueError("capturing head(x, on_device=True) with t=" + std::to_string(t) + " needs this head's "
                          "buffers for that t: call it once with the same t outside the capture first");
    // work of an earlier call on another stream that returned without waiting shares our scratch
    if (!capturing && pending_ && pending_stream_ != run_on)
      check(cudaStreamWaitEvent(run_on, done_ev_, 0), "cudaStreamWaitEvent (the previous call)");

    const float* x = device_hidden(hidden, hidden_on_device, xbytes, run_on);
    float* normed = static_cast<float*>(normed_.ensure(xbytes, ordinal_, "normed hidden states"));
    if (q8_) acts_q8_.ensure(q8_bytes, ordinal_, "int8 activations");
    LogitsSlot* slot = logits_slot(lbytes, run_on, capturing);
    if (capturing && !slot)
      throw ArgValueError("capturing head(x, on_device=True) with t=" + std::to_string(t) + " needs a free pooled "
                          "logits buffer of that size: call it once with the same t outside the capture first (and "
                          "let go of earlier results)");
    std::shared_ptr<DeviceMemory> mem = slot ? slot->mem : std::make_shared<DeviceMemory>(lbytes, ordinal_, "logits");
    float* logits = static_cast<float*>(mem->ptr);

    CallExtras ex;
    ex.scan = scan;
    ex.k = req.k;
    ex.ids_only = req.ids_only;
    ex.fork = true;
    ex.log_softmax = req.log_softmax;
    const size_t n_sel = (size_t)t * req.k;
    ex.result_bytes = (scan || req.k) ? 8 + n_sel * (sizeof(int64_t) + sizeof(float)) : 0;
    MappedHost one_off;
    if (ex.result_bytes) {
      MappedHost& res = slot ? slot->results : one_off;
      res.ensure(ex.result_bytes);
      ex.result_dev = res.dev;
      ex.result_host = res.host;
      if (scan) set_scan_word(ex.result_host, kScanPending);
    }
    if (req.k) ensure_select(t, req.k, req.ids_only);
    if (req.k && slot && !capturing && select_in_matvec(t, req.ids_only ? 0 : req.k))
      ex.sink = select_sink(*slot, t, req.ids_only, reinterpret_cast<int64_t*>(ex.result_dev + 8), &ex.sink_ranked);
    if (req.log_softmax) ensure_log_softmax(t);  // before any capture: a first sizing zeroes and synchronizes

    if (slot && !capturing) {
      const int variant = (req.k ? (req.ids_only ? 1 : 2) : 0) * 2 + (scan ? 1 : 0);
      cudaGraphExec_t exec = route_graph(slot->graphs[variant], x, normed, logits, t, req.log_softmax, ex);
      check(cudaGraphLaunch(exec, run_on), "cudaGraphLaunch (route)");
    } else {
      // the caller's graph capture, or every pooled buffer held: the kernels launched one by one on s
      ex.fork = false;
      StreamSwap on(stream_, run_on);
      enqueue_call(x, normed, logits, t, ex);
    }
    CallResult r;
    if (slot) {
      slot->stream = run_on;
      slot->async = !wait;
    }
    if (capturing) {
      r.logits = mem;
      return r;
    }
    if (!wait) {
      if (scan) r.first_bad = await_scan(ex.result_host, run_on, (int64_t)t * H);
      // later work on our own stream (and calls on other streams) is ordered after this call
      // (a call whose scan found a bad number too: its route still runs into the slot)
      check(cudaEventRecord(done_ev_, run_on), "cudaEventRecord (call)");
      check(cudaStreamWaitEvent(own_stream_, done_ev_, 0), "cudaStreamWaitEvent (call)");
      pending_ = true;
      pending_stream_ = run_on;
      if (r.first_bad < 0) r.logits = mem;
      return r;
    }
    check(cudaStreamSynchronize(run_on), "the route's kernels (synchronize)");
    pending_ = false;
    if (ex.result_bytes) {
      uint64_t first_bad = 0;
      std::memcpy(&first_bad, ex.result_host, 8);
      if (scan && first_bad < (uint64_t)((int64_t)t * H)) {
        r.first_bad = (int64_t)first_bad;
        return r;
      }
      if (req.k) {
        std::memcpy(req.ids, ex.result_host + 8, n_sel * sizeof(int64_t));
        if (!req.ids_only && req.vals)
          std::memcpy(req.vals, ex.result_host + 8 + n_sel * sizeof(int64_t), n_sel * sizeof(float));
      }
    }
    r.logits = mem;
    return r;
  }

  void topk(const float* logits, int t, int k, int64_t* ids, float* vals) override {
    if (k < 1 || k > kTopkMax || k > spec_.vocab)
      throw ArgValueError("k must be in [1, min(V, " + std::to_string(kTopkMax) + ")] for top-k on the GPU, got " +
                          std::to_string(k));
    DeviceScope scope(ordinal_);
    const int64_t V = spec_.vocab;
    void* scratch = topk_scratch_.ensure(topk_scratch_bytes(V, t, k), ordinal_, "top-k scratch");
    const size_t n = (size_t)t * k;
    auto* dev = static_cast<uint8_t*>(topk_out_.ensure(n * (sizeof(int64_t) + sizeof(float)), ordinal_, "top-k"));
    auto* dev_ids = reinterpret_cast<int64_t*>(dev);
    auto* dev_vals = reinterpret_cast<float*>(dev + n * sizeof(int64_t));
    cuda::topk(logits, V, t, k, scratch, dev_ids, dev_vals, stream_);
    check(cudaMemcpyAsync(ids, dev_ids, n * sizeof(int64_t), cudaMemcpyDeviceToHost, stream_), "download of top-k ids");
    check(cudaMemcpyAsync(vals, dev_vals, n * sizeof(float), cudaMemcpyDeviceToHost, stream_), "download of top-k");
    check(cudaStreamSynchronize(stream_), "top-k (synchronize)");
  }

  // The route in groups of tokens (Device::score): the norm and the
  // activations once, then for each group of g tokens (score_plan) the matvec
  // into a scratch of at most kVocabScratchBytes of logits (or one row) --
  // over every row, or over the vocabulary in slices of whole tiles when the
  // group's logits do not fit -- the element-wise nodes (or the one node,
  // folded into the reduction) and one vocab_reduce launch per slice (the
  // tiles' pairs, the rank counts and each row's finish after the last).
  // Slices count ranks against the chosen ids' logits computed first
  // (score_chosen_): with q8 activations by matvec_q8_pairs, else by the same
  // matvec over the chosen rows gathered (score_gathered_). So a group
  // takes the plain call's largest launch and the weight is read as often as
  // the plain call reads it. The kernels run
  // as one CUDA graph per shape, the NaN scan of a device hidden state beside
  // the route; the kernels read the ids from mapped pinned memory (a long grid:
  // from one upload before the launch, kShortGridCtas) and write the results
  // there themselves: no copy node, one launch, one synchronize.
  void score(const float* hidden, bool hidden_on_device, int t, VocabScores& out) override {
    if (t < 1) throw ArgValueError("t must be >= 1");
    DeviceScope scope(ordinal_);
    const int64_t H = spec_.hidden, V = spec_.vocab, m = out.m, n_ids = (int64_t)t * m;
    const size_t xbytes = (size_t)t * H * sizeof(float);
    const float* x = own_hidden(hidden, hidden_on_device, xbytes, stream_);
    normed_.ensure(xbytes, ordinal_, "normed hidden states");
    if (q8_) acts_q8_.ensure(acts_q8_scratch_bytes(out_.type, H, t), ordinal_, "int8 activations");
    const ScorePlan plan = score_plan(t, m, V);
    // mapped in: ids [t*m] (int64); mapped out: the first non-finite hidden | vocab_scores_layout's arrays
    // (these in device memory instead when they stay there)
    const size_t in_bytes = (size_t)n_ids * 8;
    const VocabScoresLayout at = vocab_scores_layout(t, m);
    const bool check_x = out.check_hidden && hidden_on_device;
    score_in_.ensure(std::max<size_t>(in_bytes, 8));
    std::memcpy(score_in_.host, out.ids, in_bytes);
    // a short reduction grid reads the ids across the bus; a long one from device memory (kShortGridCtas)
    const bool ids_mapped = vocab_reduce_ctas(plan.slice, plan.tokens) <= kShortGridCtas;
    const auto* ids = reinterpret_cast<const int64_t*>(
        ids_mapped ? score_in_.dev : static_cast<uint8_t*>(score_ids_.ensure(score_in_.bytes, ordinal_, "token ids")));
    if (!ids_mapped && in_bytes)
      check(cudaMemcpyAsync(const_cast<int64_t*>(ids), score_in_.host, in_bytes, cudaMemcpyHostToDevice, stream_),
            "upload of token ids");
    score_results_.ensure(8 + at.bytes);
    uint8_t* out_dev = out.keep_on_device ? static_cast<uint8_t*>(score_out_.ensure(at.bytes, ordinal_, "scores"))
                                          : score_results_.dev + 8;
    score_chunk_.ensure((size_t)plan.tokens * plan.slice * 4, ordinal_, "a group's logits");
    score_reduce_.ensure(plan.tokens, (int)m, V, ordinal_, stream_);
    const void *gathered = nullptr, *chosen = nullptr;
    if (plan.slice < V) {  // q8: the chosen pairs' logits; else the chosen rows gathered and their matvec's
      const int64_t n = (int64_t)plan.tokens * m;
      if (!q8_)
        gathered = score_gathered_.ensure_zeroed(device_weight_bytes(out_.type, n, out_.row_bytes), ordinal_,
                                                 "the chosen ids' rows", stream_);
      // q8: [tokens x m]; else [tokens x n] (every token against every gathered row)
      const size_t bytes = (size_t)(q8_ ? 1 : plan.tokens) * n * sizeof(float);
      chosen = score_chosen_.ensure(std::max<size_t>(bytes, 8), ordinal_, "the chosen ids' logits");
    }

    const ScoreKey key{t, (int)m, plan.tokens, plan.slice, check_x, x, ids, out_dev, score_results_.dev,
                       score_chunk_.mem->ptr, score_reduce_.pairs.mem->ptr, score_reduce_.acc.mem->ptr,
                       q8_ ? acts_q8_.mem->ptr : nullptr, normed_.mem->ptr, gathered, chosen};
    const cudaGraphExec_t exec = score_graphs_.get(key, [&] {
      return instantiate(capture_stream([&] {
                           auto* bad = reinterpret_cast<unsigned long long*>(score_results_.dev);
                           if (check_x) fork_scan(x, (int64_t)t * H, bad);
                           enqueue_score(x, t, m, plan, ids, out_dev);
                           if (check_x) join_scan();
                         }),
                         "cudaGraphInstantiate (score)");
    });
    check(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch (score)");
    check(cudaStreamSynchronize(stream_), "score (synchronize)");
    out.first_nonfinite = check_x ? first_bad_index(score_results_.host, (int64_t)t * H) : -1;
    if (out.keep_on_device) {
      if (out.first_nonfinite < 0) out.device_out = device_copy(out_dev, at.bytes, "scores");
      return;
    }
    const uint8_t* res = score_results_.host + 8;
    std::memcpy(out.lse, res, (size_t)t * 4);
    std::memcpy(out.values, res + at.values, (size_t)n_ids * 4);
    std::memcpy(out.logprobs, res + at.logprobs, (size_t)n_ids * 4);
    std::memcpy(out.ranks, res + at.ranks, (size_t)n_ids * 8);
  }

  // A new device buffer holding n bytes copied from src (device memory), complete on return.
  std::shared_ptr<DeviceMemory> device_copy(const void* src, size_t n, const char* what) {
    auto mem = std::make_shared<DeviceMemory>(std::max<size_t>(n, 8), ordinal_, what);
    check(cudaMemcpyAsync(mem->ptr, src, n, cudaMemcpyDeviceToDevice, stream_), "copy of results");
    check(cudaStreamSynchronize(stream_), "copy of results (synchronize)");
    return mem;
  }

  // How score() splits t rows of m chosen ids: groups of `tokens` rows, each
  // over the vocabulary in slices of `slice` ids (slice = V: one launch).
  struct ScorePlan {
    int tokens = 0;
    int64_t slice = 0;
  };
  // All t rows in one launch when their logits fit kVocabScratchBytes; else
  // groups of the matvecs' largest token launch (kScoreSliceTokens, that of
  // the q8 kernels) over slices of whole tiles that fit, when the chosen ids'
  // gathered logits stay small (kScoreChosenBytes); else whole rows in groups
  // of as many 64-token tiles as fit, else multiples of 8, at least one row.
  static constexpr int kScoreSliceTokens = 256;
  static constexpr size_t kScoreChosenBytes = size_t{16} << 20;
  static ScorePlan score_plan(int t, int64_t m, int64_t V) {
    const int64_t fit = (int64_t)(kVocabScratchBytes / (sizeof(float) * (size_t)V));
    if (t <= fit) return ScorePlan{t, V};
    const int64_t g = std::min<int64_t>(t, kScoreSliceTokens);
    const int64_t slice = (int64_t)(kVocabScratchBytes / (sizeof(float) * (size_t)g)) / kLseTile * kLseTile;
    if (slice >= V) return ScorePlan{(int)g, V};
    if (slice > 0 && (size_t)g * g * m * sizeof(float) <= kScoreChosenBytes) return ScorePlan{(int)g, slice};
    const int64_t rows = fit >= 64 ? fit / 64 * 64 : fit >= 8 ? fit / 8 * 8 : std::max<int64_t>(fit, 1);
    return ScorePlan{(int)rows, V};
  }

  // The element-wise node a consumer kernel applies to each raw logit it loads,
  // for a matvec launch that applied `applied`: folded_epilogue's node, or a q8
  // step's fused node that the launch left to a kernel (kQ8FoldMaxTokens), when
  // it is the route's last node -- the same function on the same operand.
  EpilogueFold load_fold(const Step& mstep, const EpilogueFold& applied) const {
    const EpilogueFold fold = folded_epilogue();
    if (fold.op != EpilogueOp::None || applied.op != EpilogueOp::None) return fold;
    if (mstep.count == 2 && mstep.first + 2 == nodes_.size()) return epilogue_fold(nodes_.back());
    return EpilogueFold{};
  }

  // score()'s kernels on the stream (captured into its graph): ids [t x m], results at out (vocab_scores_layout).
  void enqueue_score(const float* x, int t, int64_t m, const ScorePlan& plan, const int64_t* ids, uint8_t* out) {
    const int64_t H = spec_.hidden, V = spec_.vocab;
    float* normed = static_cast<float*>(normed_.mem->ptr);
    const size_t mv = matvec_node();
    for (const Step& st : steps_)
      if (st.first < mv) enqueue(st, x, normed, nullptr, t);
    const NodeKind kind = nodes_[mv].kind;
    const Step& mstep = step_of(mv);
    Q8Call q = q8_args(t, nullptr);
    if (is_q8(kind)) quantize_acts_q8(out_.type, normed, H, H, t, acts_q8_.mem->ptr, &q, stream_, prologue_q8_);
    const auto* w = static_cast<const uint8_t*>(weight_->ptr);
    const VocabScoresLayout at = vocab_scores_layout(t, m);
    float* lse = reinterpret_cast<float*>(out);
    auto* values = reinterpret_cast<float*>(out + at.values);
    auto* logprobs = reinterpret_cast<float*>(out + at.logprobs);
    auto* ranks = reinterpret_cast<int64_t*>(out + at.ranks);
    auto* y = static_cast<float*>(score_chunk_.mem->ptr);
    for (int k0 = 0; k0 < t; k0 += plan.tokens) {
      const int g = std::min(plan.tokens, t - k0);
      Q8Call qg = is_q8(kind) ? q8_tokens(q, k0, g) : q;
      qg.fold = q8_fold(mstep, g);
      const EpilogueFold fold = load_fold(mstep, qg.fold);
      const float* xg = normed + (int64_t)k0 * H;
      auto nodes_after = [&](float* into, int64_t count) {  // the element-wise nodes neither kernel applies
        if (fold.op == EpilogueOp::None)
          for (size_t i = mstep.first + (qg.fold.op == EpilogueOp::None ? 1 : 2); i < nodes_.size(); ++i)
            enqueue_epilogue(nodes_[i], into, count);
      };
      auto logits = [&](const uint8_t* rows_w, int64_t rows, float* into) {  // [g x rows]
        enqueue_matvec_rows(kind, rows_w, rows, xg, qg, g, into, rows);
        nodes_after(into, (int64_t)g * rows);
      };
      const float* chosen = nullptr;
      int64_t chosen_ld = 0;
      const int64_t n_chosen = (int64_t)g * m;
      if (plan.slice < V && n_chosen > 0) {
        auto* c = static_cast<float*>(score_chosen_.mem->ptr);
        if (is_q8(kind)) {  // a warp per (token, id): [k][q]
          matvec_q8_pairs(qg, ids + (int64_t)k0 * m, (int)m, c, stream_);
          nodes_after(c, n_chosen);
          chosen_ld = m;
        } else {  // row j of the gathered weight is ids[k0 * m + j]: token k's ids at [k][k * m + q]
          auto* gathered = static_cast<uint8_t*>(score_gathered_.mem->ptr);
          gather_weight_rows(w, out_.type, out_.row_bytes, ids + (int64_t)k0 * m, (int)n_chosen, gathered, stream_);
          logits(gathered, n_chosen, c);
          chosen_ld = n_chosen + m;
        }
        chosen = c;
      }
      for (int64_t r0 = 0; r0 < V; r0 += plan.slice) {
        const int64_t n = std::min(plan.slice, V - r0);
        // a slice starts on a whole tile of rows (kLseTile, a multiple of kTileRows): row r0's bytes start it
        logits(w + r0 * out_.row_bytes, n, y);
        VocabReduceArgs r = score_reduce_.args(y, V, g, (int)m);
        r.ld = r.n = n;
        r.first = r0;
        r.chosen = chosen;
        r.chosen_ld = chosen_ld;
        r.fold = fold;
        r.ids = ids + (int64_t)k0 * m;
        r.lse = lse + k0;
        r.values = values + (int64_t)k0 * m;
        r.logprobs = logprobs + (int64_t)k0 * m;
        r.ranks = ranks + (int64_t)k0 * m;
        vocab_reduce(r, stream_);
      }
    }
  }

  // The index of the route's matvec node.
  size_t matvec_node() const {
    size_t mv = 0;
    while (mv < nodes_.size() && !is_matvec(nodes_[mv].kind)) ++mv;
    return mv;
  }

  // The step holding node i.
  const Step& step_of(size_t i) const {
    for (const Step& st : steps_)
      if (i >= st.first && i < st.first + st.count) return st;
    throw Error("internal: no step holds node " + std::to_string(i));
  }

  // The element-wise node a q8 matvec step applies itself for t tokens (None: the
  // step is one node, or its node runs as a kernel after it: kQ8FoldMaxTokens).
  EpilogueFold q8_fold(const Step& st, int t) const {
    return st.count == 2 && t <= kQ8FoldMaxTokens ? epilogue_fold(nodes_[st.first + 1]) : EpilogueFold{};
  }

  // Whether the call's selection can run inside the route's matvec (Q8Args::select):
  // a q8 matvec step that ends the route, whose node (if any) it applies itself, in
  // one launch of at most kQ8FoldMaxTokens tokens; for top-k (k > 0) one group of
  // rows whose chunk bests the matvec's last CTA ranks, and at most
  // kTopkInMatvecMaxTokens tokens. Then greedy decoding never writes the logits,
  // and top-k's first pass over them is gone.
  // On by default (H100, seed head, t = 1: argmax 8 us and topk(x, 50) ~5 us less
  // GPU time a call: docs/performance.md, "Per-call overhead");
  // MUSER_SELECT_IN_MATVEC=0 turns both off and =argmax keeps top-k's partials
  // off, for measuring.
  static constexpr int kTopkInMatvecMaxTokens = 2;
  bool select_in_matvec(int t, int k) const {
    static const int setting = [] {  // 0: off, 1: argmax only, 2: argmax and top-k
      const char* e = std::getenv("MUSER_SELECT_IN_MATVEC");
      if (!e || !*e) return 2;
      if (std::strcmp(e, "argmax") == 0) return 1;
      return std::atoi(e) == 0 ? 0 : 2;
    }();
    const bool on = k == 0 ? setting >= 1 : setting == 2;
    if (!on || steps_.empty() || t > kQ8FoldMaxTokens || out_.rows != spec_.vocab) return false;
    // top-k's chunk bests pay inside the matvec only for one or two tokens: topk(x, 50) over
    // the plain call, seed head on an H100, four runs each against MUSER_SELECT_IN_MATVEC=argmax
    // (two sessions): 21.3-22.3 us against 23.4-29.6 at t = 1, 22.7-23.3 against 23.6-30.0 at
    // 2, 28.7-29.8 against 26.0-32.5 at 4 (no gain), 40.6 / 41.5 against 32.6 / 39.7 at 8 and
    // 63.0 / 62.8 against 40.7 / 55.4 at 16 (docs/performance.md)
    if (k > 0 && t > kTopkInMatvecMaxTokens) return false;
    // (Q6_K's register kernel, where its launches fall when the staged kernels' stages do
    // not fit, computes no top-k partials: matvec_q8.cuh, Q8ArgmaxAtomic)
    if (k > 0 && (!topk_bests_fit(spec_.vocab, t, k) || out_.type == (uint32_t)GgmlType::Q6_K)) return false;
    const Step& last = steps_.back();
    return is_q8(nodes_[last.first].kind) && (last.count == 1 || q8_fold(last, t).op != EpilogueOp::None);
  }

  // The route's element-wise node after the matvec when it is the only one and
  // the matvec does not apply it already (the f32 routes' soft cap): a consumer
  // kernel that reads every logit once applies it as it loads each raw one
  // instead of a node of its own -- the same function on the same operand, the
  // same bits. The graph route's separate cap nodes stay nodes. None: nothing to fold.
  EpilogueFold folded_epilogue() const {
    const size_t mv = matvec_node();
    if (step_of(mv).count != 1 || mv + 2 != nodes_.size()) return EpilogueFold{};
    return epilogue_fold(nodes_.back());
  }

  // The scan's answer word in mapped host memory: kScanPending until the scan
  // kernel writes the first bad index (or ~0: none) over it.
  static constexpr uint64_t kScanPending = ~0ull - 1;
  static void set_scan_word(uint8_t* host, uint64_t v) { *reinterpret_cast<volatile uint64_t*>(host) = v; }
  static uint64_t scan_word(const uint8_t* host) {
    const uint64_t v = *reinterpret_cast<const volatile uint64_t*>(host);
    std::atomic_thread_fence(std::memory_order_acquire);
    return v;
  }
  // Spins until the scan beside the route has answered (a few microseconds
  // after the launch: the route goes on running), asking the stream now and
  // then so a failed launch raises instead of spinning forever. The first bad
  // index of the n hidden values, or -1.
  int64_t await_scan(uint8_t* host, cudaStream_t s, int64_t n) {
    uint64_t v = scan_word(host);
    for (unsigned spins = 1; v == kScanPending; ++spins) {
      if (spins % 4096 == 0) {
        const cudaError_t e = cudaStreamQuery(s);
        v = scan_word(host);
        if (v != kScanPending) break;
        if (e != cudaErrorNotReady) {
          check(e, "the NaN scan of the hidden state");
          throw DeviceError("the NaN scan of the hidden state finished without an answer");
        }
      }
      v = scan_word(host);
    }
    return v < (uint64_t)n ? (int64_t)v : -1;
  }

  // The NaN scan of a device hidden state on a side branch of the graph being
  // captured, beside the route (first_nonfinite: its last CTA writes the first bad
  // index, or ~0, to `out`, mapped host memory); join_scan joins it at the end.
  void fork_scan(const float* x, int64_t n, unsigned long long* out) {
    check(cudaEventRecord(fork_ev_, stream_), "cudaEventRecord (fork)");
    check(cudaStreamWaitEvent(side_, fork_ev_, 0), "cudaStreamWaitEvent (fork)");
    first_nonfinite(x, n, out, scan_sync(), side_);
    check(cudaEventRecord(join_ev_, side_), "cudaEventRecord (join)");
  }
  void join_scan() { check(cudaStreamWaitEvent(stream_, join_ev_, 0), "cudaStreamWaitEvent (join)"); }

  // logits [t x V] -= their rows' logsumexps, in place (lsm_reduce_ and
  // lsm_lse_ sized for t by the caller, before any capture)
  void enqueue_log_softmax(float* logits, int t) {
    const int64_t V = spec_.vocab;
    float* lse = static_cast<float*>(lsm_lse_.mem->ptr);
    VocabReduceArgs r = lsm_reduce_.args(logits, V, t, 0);
    r.lse = lse;
    vocab_reduce(r, stream_);
    subtract_rows(logits, V, t, lse, stream_);
  }
  void ensure_log_softmax(int t) {
    lsm_reduce_.ensure(t, 0, spec_.vocab, ordinal_, stream_);
    lsm_lse_.ensure((size_t)t * 4, ordinal_, "logsumexps");
  }

  // Device::sample: the route and the draw as one CUDA graph per shape
  // (sample.cu's kernels; which of them run depends on the steps asked for),
  // the parameters and positions up and the results down through pinned
  // memory. top_k takes its cut from topk_threshold's k best of each group of
  // kSampleOrderRows rows where it takes (V, group, k), else from a sort of
  // each row's tokens in the kept-set order; top_p from sample_top_p_select,
  // every row in one grid.
  bool sample(const float* hidden, bool hidden_on_device, int t, SampleRequest& req, SampleResult* out) override {
    if (t < 1) throw ArgValueError("t must be >= 1");
    const SampleParams& p = req.params;
    const bool greedy = !(p.temperature > 0.0f);
    const bool by_order = !greedy && (p.top_k > 0 || p.top_p < 1.0f);
    int id_bits = 1;
    while ((int64_t{1} << id_bits) < spec_.vocab) ++id_bits;
    if (by_order && id_bits > kSampleMaxIdBits) return false;  // the host's sampler takes the row
    if (!sample_once(hidden, hidden_on_device, t, req, greedy, by_order, id_bits, out)) return false;
    for (int r = 0; r < t; ++r)
      if (out[r].status != kSampleOk) return false;  // the host names the row's problem
    if (req.keep_on_device) {  // tokens [t] (int64) | logprobs | processed_logprobs | kept_mass
      DeviceScope scope(ordinal_);
      auto mem = std::make_shared<DeviceMemory>((size_t)t * 20, ordinal_, "samples");
      auto* base = static_cast<uint8_t*>(mem->ptr);
      auto* f = reinterpret_cast<float*>(base + (size_t)t * 8);
      sample_unpack(static_cast<const SampleResult*>(sample_out_.mem->ptr), t, reinterpret_cast<int64_t*>(base), f,
                    f + t, f + 2 * t, stream_);
      check(cudaStreamSynchronize(stream_), "samples (synchronize)");
      req.device_out = mem;
    }
    return true;
  }

  bool sample_once(const float* hidden, bool hidden_on_device, int t, SampleRequest& req, bool greedy, bool by_order,
                   int id_bits, SampleResult* out) {
    DeviceScope scope(ordinal_);
    const int64_t H = spec_.hidden, V = spec_.vocab, tiles = lse_tile_count(V);
    const SampleParams& p = req.params;
    const size_t xbytes = (size_t)t * H * sizeof(float);
    const float* x = own_hidden(hidden, hidden_on_device, xbytes, stream_);
    normed_.ensure(xbytes, ordinal_, "normed hidden states");
    if (q8_) acts_q8_.ensure(acts_q8_scratch_bytes(out_.type, H, t), ordinal_, "int8 activations");
    const bool check_x = req.check_hidden && hidden_on_device;
    // mapped in: params | positions [t], read by the kernels; mapped out: the first
    // non-finite hidden | results [t], written by each row's last kernel
    const size_t pos_at = (sizeof(SampleParams) + 7) / 8 * 8, in_bytes = pos_at + (size_t)t * 8;
    sample_in_.ensure(in_bytes);
    std::memcpy(sample_in_.host, &p, sizeof p);
    std::memcpy(sample_in_.host + pos_at, req.positions, (size_t)t * 8);
    // short grids read them across the bus; long ones from device memory (kShortGridCtas)
    const bool in_mapped = tiles * t <= kShortGridCtas;
    uint8_t* in = in_mapped ? sample_in_.dev : static_cast<uint8_t*>(sample_in_dev_.ensure(in_bytes, ordinal_, "sampling parameters"));
    if (!in_mapped)
      check(cudaMemcpyAsync(in, sample_in_.host, in_bytes, cudaMemcpyHostToDevice, stream_), "upload of sampling parameters");
    sample_results_.ensure(8 + (size_t)t * sizeof(SampleResult));
    auto* out_dev = static_cast<uint8_t*>(sample_out_.ensure((size_t)t * sizeof(SampleResult), ordinal_, "samples"));
    auto* logits = static_cast<float*>(sample_logits_.ensure((size_t)t * V * 4, ordinal_, "logits to sample"));
    auto* z = static_cast<float*>(sample_z_.ensure((size_t)t * V * 4, ordinal_, "processed logits"));
    auto* pairs = static_cast<LsePair*>(sample_pairs_.ensure(2 * (size_t)t * tiles * sizeof(LsePair), ordinal_,
                                                             "sampling tile pairs"));
    // the row state and counters: zero at rest (the kernels leave them so), zeroed once when allocated
    const size_t state_bytes = (size_t)t * (sizeof(SampleRowState) + sizeof(unsigned));
    auto* state = static_cast<uint8_t*>(sample_state_.ensure_zeroed(state_bytes, ordinal_, "sampling row state", stream_));
    const int group = std::min(t, kSampleOrderRows);
    const bool top_p = by_order && p.top_p < 1.0f, top_k = by_order && p.top_k > 0;
    // top_k: topk_threshold's k best, a group of rows at a time, where it takes (V, group, k)
    const int select_k = top_k && topk_threshold_fits(V, group, p.top_k) ? p.top_k : 0;
    void* keys = nullptr;
    void* sort_scratch = nullptr;
    size_t sort_bytes = 0;
    void* select_scratch = nullptr;
    unsigned* select_sync = nullptr;
    uint8_t* best = nullptr;  // a group's ids [group x select_k] (int64) | z [group x select_k]
    if (select_k) {
      select_scratch = sample_select_.ensure(topk_threshold_scratch_bytes(V, group), ordinal_, "top_k's selection");
      select_sync = static_cast<unsigned*>(sample_select_sync_.ensure_zeroed(
          select_sync_words(group) * sizeof(unsigned), ordinal_, "top_k's selection counters", stream_));  // kept 0
      best = static_cast<uint8_t*>(sample_best_.ensure((size_t)group * select_k * 12, ordinal_, "top_k's best"));
    } else if (top_k) {
      keys = sample_keys_.ensure(2 * (size_t)group * V * 8, ordinal_, "the kept-set order's keys");
      sort_bytes = sample_order_scratch_bytes(V, group, id_bits);
      sort_scratch = sample_sort_.ensure(std::max<size_t>(sort_bytes, 8), ordinal_, "the kept-set order's sort");
    }
    uint8_t* top_p_scratch = top_p && !select_k ? static_cast<uint8_t*>(sample_top_p_.ensure_zeroed(
        sample_top_p_scratch_bytes(t), ordinal_, "top_p's select", stream_)) : nullptr;  // kept 0
    const float* bias = nullptr;
    const uint8_t* allowed = nullptr;
    if (req.bias) {
      bias = static_cast<float*>(sample_bias_.ensure((size_t)V * 4, ordinal_, "logit_bias"));
      check(cudaMemcpyAsync(const_cast<float*>(bias), req.bias, (size_t)V * 4, cudaMemcpyHostToDevice, stream_),
            "upload of logit_bias");
    }
    if (req.allowed) {
      allowed = static_cast<uint8_t*>(sample_allowed_.ensure((size_t)V, ordinal_, "allowed"));
      check(cudaMemcpyAsync(const_cast<uint8_t*>(allowed), req.allowed, (size_t)V, cudaMemcpyHostToDevice, stream_),
            "upload of allowed");
    }

    SampleKargs a;
    a.x = logits;
    a.z = z;
    a.V = V;
    a.t = t;
    a.params = reinterpret_cast<const SampleParams*>(in);
    a.positions = reinterpret_cast<const uint64_t*>(in + pos_at);
    a.bias = bias;
    a.allowed = allowed;
    a.rows = reinterpret_cast<SampleRowState*>(state);
    a.done = reinterpret_cast<unsigned*>(state + (size_t)t * sizeof(SampleRowState));
    a.pairs_a = pairs;
    a.pairs_b = pairs + (size_t)t * tiles;
    a.keys = static_cast<unsigned long long*>(keys);
    a.keys_sorted = keys ? a.keys + (size_t)group * V : nullptr;
    a.id_bits = id_bits;
    a.id_mask = (unsigned)((1ull << id_bits) - 1);
    if (top_p_scratch) {
      a.tp_mass = reinterpret_cast<unsigned long long*>(top_p_scratch);
      a.tp_count = reinterpret_cast<unsigned*>(top_p_scratch + (size_t)t * kTopPBins * 8);
      a.tp_cand = reinterpret_cast<unsigned long long*>(top_p_scratch + (size_t)t * kTopPBins * 12);
    }
    a.out = reinterpret_cast<SampleResult*>(out_dev);
    a.result = reinterpret_cast<SampleResult*>(sample_results_.dev + 8);
    a.fold = folded_epilogue();
    if (select_k && t == group)  // one group of rows: sample_prep ranks top_k's chunks (no chunk_best pass)
      a.sel = topk_threshold_slots(select_scratch, V, t), a.sel_k = select_k;
    a.kept_raw_pair = by_order || p.min_p > 0.0f || allowed;  // something may be dropped
    a.kept_z_pair = a.kept_raw_pair || bias || p.temperature != 1.0f;  // else z is x, bit for bit
    const SampleKey key{t, top_k && !select_k ? id_bits : 0, select_k, greedy, top_p, check_x, a.kept_z_pair,
                        a.kept_raw_pair, x, bias, allowed, in, out_dev, sample_results_.dev, logits, z, pairs, state,
                        keys, sort_scratch, select_scratch, select_sync, best, top_p_scratch,
                        q8_ ? acts_q8_.mem->ptr : nullptr, normed_.mem->ptr};
    const cudaGraphExec_t exec = sample_graphs_.get(key, [&] {
      return instantiate(capture_stream([&] {
        float* normed = static_cast<float*>(normed_.mem->ptr);
        if (check_x) fork_scan(x, (int64_t)t * H, reinterpret_cast<unsigned long long*>(sample_results_.dev));
        const size_t folded = a.fold.op == EpilogueOp::None ? nodes_.size() : nodes_.size() - 1;  // sample_prep's
        for (const Step& st : steps_)
          if (st.first != folded) enqueue(st, x, normed, logits, t);
        sample_prep(a, stream_);
        if (!greedy) {
          for (int r0 = 0; top_k && r0 < t; r0 += group) {
            const int rows = std::min(group, t - r0);
            if (select_k)
              sample_top_k_by_select(a, select_k, r0, rows, select_scratch, select_sync,
                                     reinterpret_cast<int64_t*>(best),
                                     reinterpret_cast<float*>(best + (size_t)group * select_k * 8), stream_);
            else
              sample_order(a, r0, rows, sort_scratch, sort_bytes, stream_);
          }
          if (!select_k) {  // (sample_top_k_by_select draws from the k best itself, top_p and min_p too)
            if (top_p) sample_top_p_select(a, 0, t, stream_);  // every row at once
            sample_kept_pairs(a, 0, t, stream_);
          }
        }
        if (check_x) join_scan();
      }), "cudaGraphInstantiate (sample)");
    });
    check(cudaGraphLaunch(exec, stream_), "cudaGraphLaunch (sample)");
    check(cudaStreamSynchronize(stream_), "sample (synchronize)");
    std::memcpy(out, sample_results_.host + 8, (size_t)t * sizeof(SampleResult));
    req.first_nonfinite = check_x ? first_bad_index(sample_results_.host, (int64_t)t * H) : -1;
    return req.first_nonfinite < 0;
  }

  // The first bad index find_nonfinite left in a pinned word, or -1 (>= n: none).
  static int64_t first_bad_index(const uint8_t* word, int64_t n) {
    unsigned long long bad = 0;
    std::memcpy(&bad, word, 8);
    return bad < (unsigned long long)n ? (int64_t)bad : -1;
  }

  // Hidden states in this device's memory: a device pointer as it is, host
  // rows uploaded on `s` into the head's hidden-state scratch.
  const float* device_hidden(const float* hidden, bool on_device, size_t xbytes, cudaStream_t s) {
    return on_device ? hidden : own_hidden(hidden, false, xbytes, s);
  }
  // Hidden states in the head's own scratch: host rows uploaded, a device
  // pointer's rows copied there. For the graphs keyed by their input's address
  // (score, sample): an engine's hidden states move from call to call, and
  // each new address captured and instantiated a graph (~160 us on the H200 at
  // t = 1) where the copy costs a few.
  const float* own_hidden(const float* hidden, bool on_device, size_t xbytes, cudaStream_t s) {
    float* dst = static_cast<float*>(hidden_.ensure(xbytes, ordinal_, "hidden states"));
    check(cudaMemcpyAsync(dst, hidden, xbytes, on_device ? cudaMemcpyDeviceToDevice : cudaMemcpyHostToDevice, s),
          on_device ? "copy of the hidden states" : "upload of the hidden states");
    return dst;
  }

  int64_t find_nonfinite(const float* x, int64_t n) override {
    DeviceScope scope(ordinal_);
    auto* first = static_cast<unsigned long long*>(flag_.ensure(sizeof(unsigned long long), ordinal_, "a flag"));
    cuda::find_nonfinite(x, n, first, stream_);
    unsigned long long host = 0;
    check(cudaMemcpyAsync(&host, first, sizeof host, cudaMemcpyDeviceToHost, stream_), "download of a flag");
    check(cudaStreamSynchronize(stream_), "find_nonfinite (synchronize)");
    return host >= (unsigned long long)n ? -1 : (int64_t)host;
  }

  void download(const float* src, float* dst, size_t n) override {
    DeviceScope scope(ordinal_);
    check(cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDeviceToHost, stream_), "download");
    check(cudaStreamSynchronize(stream_), "download (synchronize)");
  }

 private:
  // What a captured graph depends on besides the prepared steps (fixed for the device's life).
  struct RouteKey {
    int t = 0;
    const void *x = nullptr, *normed = nullptr, *logits = nullptr, *acts_q8 = nullptr, *lsm = nullptr,
               *lsm_lse = nullptr;
    bool log_softmax = false;
    // run_call's extras: the NaN scan, the selection and its buffers, the results' copy
    bool scan = false, ids_only = false;
    int k = 0;
    const void *sel = nullptr, *sel_sync = nullptr, *result_dev = nullptr, *result_host = nullptr, *sink = nullptr;
    bool operator==(const RouteKey& o) const {
      return t == o.t && x == o.x && normed == o.normed && logits == o.logits && acts_q8 == o.acts_q8 &&
             lsm == o.lsm && lsm_lse == o.lsm_lse && log_softmax == o.log_softmax && scan == o.scan &&
             ids_only == o.ids_only && k == o.k && sel == o.sel && sel_sync == o.sel_sync &&
             result_dev == o.result_dev && result_host == o.result_host && sink == o.sink;
    }
  };
  // What score()'s captured graph bakes in.
  struct ScoreKey {
    int t = 0, m = 0, group = 0;
    int64_t slice = 0;
    bool check = false;
    const void *x, *in, *out, *results, *chunk, *pairs, *acc, *acts_q8, *normed, *gathered, *chosen;
    bool operator==(const ScoreKey& o) const {
      return t == o.t && m == o.m && group == o.group && slice == o.slice && check == o.check && x == o.x &&
             in == o.in && out == o.out && results == o.results && chunk == o.chunk && pairs == o.pairs &&
             acc == o.acc && acts_q8 == o.acts_q8 && normed == o.normed && gathered == o.gathered &&
             chosen == o.chosen;
    }
  };
  // What sample()'s captured graph bakes in.
  struct SampleKey {
    int t = 0, order_bits = 0, select_k = 0;
    bool greedy = false, top_p = false, check = false, z_pair = false, raw_pair = false;
    const void *x, *bias, *allowed, *in, *out, *results, *logits, *z, *pairs, *state, *keys, *sort_scratch,
        *select_scratch, *select_sync, *best, *top_p_scratch, *acts_q8, *normed;
    bool operator==(const SampleKey& o) const {
      return t == o.t && order_bits == o.order_bits && select_k == o.select_k && greedy == o.greedy &&
             top_p == o.top_p && check == o.check && z_pair == o.z_pair && raw_pair == o.raw_pair &&
             x == o.x && bias == o.bias && allowed == o.allowed && in == o.in && out == o.out &&
             results == o.results && logits == o.logits && z == o.z && pairs == o.pairs && state == o.state &&
             keys == o.keys && sort_scratch == o.sort_scratch && select_scratch == o.select_scratch &&
             select_sync == o.select_sync && best == o.best && top_p_scratch == o.top_p_scratch &&
             acts_q8 == o.acts_q8 && normed == o.normed;
    }
  };
  // vocab_reduce's scratch for t rows of m chosen ids: the tile pairs, and the
  // accumulators (ahead [t x m], done [t]) zeroed when allocated -- the kernel
  // leaves them zero, so graphs replay without a memset node.
  struct ReduceScratch {
    Scratch pairs, acc;
    // Any layout of (rows, ids) fits a zeroed buffer of enough bytes: every byte is zero at rest.
    void ensure(int rows, int ids, int64_t V, int ordinal, cudaStream_t stream) {
      const int64_t tiles = lse_tile_count(V);
      pairs.ensure((size_t)rows * tiles * lse_pair_bytes(), ordinal, "logsumexp tile pairs");
      const size_t bytes = (size_t)rows * ids * 8 + (size_t)rows * 4;
      acc.ensure_zeroed(std::max<size_t>(bytes, 8), ordinal, "vocab_reduce accumulators", stream);
    }
    // the layout for `rows` x `ids` (ahead_acc first, then done)
    VocabReduceArgs args(const float* y, int64_t V, int rows, int ids) const {
      VocabReduceArgs a;
      a.y = y;
      a.ld = V;
      a.n = V;
      a.vocab = V;
      a.t = rows;
      a.m = ids;
      a.pairs = static_cast<LsePair*>(pairs.mem->ptr);
      a.ahead_acc = static_cast<unsigned long long*>(acc.mem->ptr);
      a.done = reinterpret_cast<unsigned*>(static_cast<uint8_t*>(acc.mem->ptr) + (size_t)rows * ids * 8);
      return a;
    }
  };
  // An executable graph and the key it was captured for.
  template <class Key>
  struct CachedGraph {
    Key key{};
    cudaGraphExec_t exec = nullptr;
    void reset() {
      if (exec) cudaGraphExecDestroy(exec);
      exec = nullptr;
    }
    CachedGraph() = default;
    CachedGraph(const CachedGraph&) = delete;
    CachedGraph& operator=(const CachedGraph&) = delete;
    ~CachedGraph() { reset(); }
  };
  // The last few graphs of one kind of call, by key, so that calls which
  // alternate settings (greedy and top_k draws, score and logsumexp, two batch
  // sizes) replay their graphs instead of capturing and instantiating one
  // (tens of microseconds) every call. The least recently used one makes way.
  template <class Key, int kEntries = 4>
  struct GraphCache {
    CachedGraph<Key> entries[kEntries];
    uint64_t last_use[kEntries] = {};
    uint64_t uses = 0;
    // The graph for `key`: a cached one, or make()'s (an instantiated graph).
    template <class Make>
    cudaGraphExec_t get(const Key& key, Make&& make) {
      int victim = 0;
      for (int i = 0; i < kEntries; ++i) {
        if (entries[i].exec && entries[i].key == key) {
          last_use[i] = ++uses;
          return entries[i].exec;
        }
        if (last_use[i] < last_use[victim]) victim = i;
      }
      entries[victim].reset();
      entries[victim].exec = make();
      entries[victim].key = key;
      last_use[victim] = ++uses;
      return entries[victim].exec;
    }
  };
  using RouteGraph = CachedGraph<RouteKey>;
  // What run_call adds to the route in its graph.
  struct CallExtras {
    bool scan = false;         // the NaN scan of x: result bytes [0, 8) get the first bad index (~0: none)
    int k = 0;                 // the k best of each row: ids at result byte 8, then the values
    bool ids_only = false;     // argmax (k == 1)
    const SelectSink* sink = nullptr;  // the selection (or its partials) inside the route's q8 matvec (select_sink)
    unsigned long long* sink_ranked = nullptr;  // top-k: the sink's chunk bests, ranked by the matvec
    bool fork = false;         // the scan on a side branch of the graph, beside the route
    bool log_softmax = false;
    uint8_t* result_dev = nullptr;   // mapped host memory (MappedHost): the kernels write it
    uint8_t* result_host = nullptr;  // the same bytes, as the host reads them
    size_t result_bytes = 0;
  };
  // Points stream_ (where the enqueue helpers launch) at another stream for a scope.
  struct StreamSwap {
    cudaStream_t& slot;
    cudaStream_t saved;
    StreamSwap(cudaStream_t& s, cudaStream_t use) : slot(s), saved(s) { s = use; }
    ~StreamSwap() { slot = saved; }
  };
  // Pinned host memory mapped into the device's address space, that grows:
  // a call's results, written by its kernels straight across the bus (no copy node).
  struct MappedHost {
    uint8_t* host = nullptr;
    uint8_t* dev = nullptr;
    size_t bytes = 0;
    void ensure(size_t n) {
      if (n <= bytes && host) return;
      release();
      void* p = nullptr;
      check(cudaHostAlloc(&p, std::max<size_t>(n, 64), cudaHostAllocPortable | cudaHostAllocMapped),
            "cudaHostAlloc (call results)");
      host = static_cast<uint8_t*>(p);
      void* d = nullptr;
      const cudaError_t err = cudaHostGetDevicePointer(&d, p, 0);
      if (err != cudaSuccess) {
        release();
        check(err, "cudaHostGetDevicePointer (call results)");
      }
      dev = static_cast<uint8_t*>(d);
      bytes = std::max<size_t>(n, 64);
    }
    void release() {
      if (host) (void)cudaFreeHost(host);
      (void)cudaGetLastError();
      host = dev = nullptr;
      bytes = 0;
    }
    MappedHost() = default;
    MappedHost(const MappedHost&) = delete;
    MappedHost& operator=(const MappedHost&) = delete;
    ~MappedHost() { release(); }
  };
  // A pooled device logits buffer, the route graphs that write it (plain; with
  // the scan; argmax; top-k -- each with and without the scan) and their results.
  struct LogitsSlot {
    std::shared_ptr<DeviceMemory> mem;
    RouteGraph graphs[6];
    MappedHost results;
    std::unique_ptr<DeviceMemory> sink;  // select_sink's two SelectSinks, the done word, the keys
    int sink_t = 0;                      // tokens its keys hold
    const int64_t* sink_ids = nullptr;   // where its argmax SelectSink points the ids
    cudaStream_t stream = nullptr;  // of the last call that wrote it
    bool async = false;             // that call returned without waiting
    void reset_graphs() {
      for (RouteGraph& g : graphs) g.reset();
    }
  };
  static constexpr size_t kLogitsPool = 4;
  std::vector<std::unique_ptr<LogitsSlot>> slots_;
  cudaGraphExec_t last_graph_ = nullptr;  // the graph of the latest graph-launched call

  // A pooled logits buffer of at least `bytes` that no view holds (the pool
  // holds its only reference), grown if needed; null when all kLogitsPool
  // are held. Device logits returned to Python are never overwritten.
  //
  // A buffer a call on stream A returned without waiting may still be read by
  // work the caller queued on A before letting it go; a call on stream s
  // takes it at once only when s is A, else after the device synchronizes
  // (fresh buffers first). A capture (capturing) takes any free buffer and
  // allocates nothing: its graph writes the buffer at replay.
  LogitsSlot* logits_slot(size_t bytes, cudaStream_t s, bool capturing) {
    LogitsSlot *fit = nullptr, *small = nullptr, *foreign = nullptr;
    for (auto& p : slots_) {
      if (!p->mem || p->mem.use_count() != 1) continue;
      if (!capturing && p->async && p->stream != s) {
        if (!foreign) foreign = p.get();
        continue;
      }
      if (p->mem->bytes >= bytes) {
        fit = p.get();
        break;
      }
      if (!small) small = p.get();
    }
    if (!fit && !small && !capturing && slots_.size() < kLogitsPool) {
      slots_.push_back(std::make_unique<LogitsSlot>());
      small = slots_.back().get();
    }
    if (!fit && !small && foreign) {
      check(cudaDeviceSynchronize(), "cudaDeviceSynchronize (a buffer last written on another stream)");
      foreign->async = false;
      (foreign->mem->bytes >= bytes ? fit : small) = foreign;
    }
    std::atomic_thread_fence(std::memory_order_acquire);  // after the last holder's release
    if (fit) return fit;
    if (!small || capturing) return nullptr;
    small->reset_graphs();  // its buffer changes
    small->async = false;
    small->mem.reset();
    small->mem = std::make_shared<DeviceMemory>(bytes, ordinal_, "logits");
    return small;
  }

  // The slot's selection sinks for t tokens: the argmax one (ids to `ids`, mapped
  // memory) or the top-k one (its chunk bests ranked into *ranked). Laid out as two
  // SelectSinks, the done word, the argmax keys [t], the chunk bests [t x chunks]
  // (all zero as the kernels leave them), the ranked bests [t x chunks]; rewritten
  // only when it grows or the ids move (a synchronous copy, rare).
  const SelectSink* select_sink(LogitsSlot& slot, int t, bool argmax, int64_t* ids, unsigned long long** ranked) {
    constexpr size_t kDone = 2 * sizeof(SelectSink), kKeys = kDone + 8;
    const int64_t chunks = topk_chunks(spec_.vocab);
    auto* base = slot.sink ? static_cast<uint8_t*>(slot.sink->ptr) : nullptr;
    auto* keys = reinterpret_cast<unsigned long long*>(base + kKeys);
    auto header = [&](int i, SelectSink h) {
      h.done = reinterpret_cast<unsigned*>(base + kDone);
      check(cudaMemcpy(base + i * sizeof(SelectSink), &h, sizeof h, cudaMemcpyHostToDevice), "cudaMemcpy (selection sink)");
    };
    if (!slot.sink || slot.sink_t < t) {
      slot.sink.reset();
      slot.sink = std::make_unique<DeviceMemory>(kKeys + 8 * (size_t)t * (1 + 2 * (size_t)chunks), ordinal_,
                                                 "selection keys");
      check(cudaMemset(slot.sink->ptr, 0, slot.sink->bytes), "cudaMemset (selection keys)");
      base = static_cast<uint8_t*>(slot.sink->ptr);
      keys = reinterpret_cast<unsigned long long*>(base + kKeys);
      slot.sink_t = t;
      slot.sink_ids = nullptr;
      SelectSink topk;
      topk.best = keys + t;
      topk.chunks = chunks;
      topk.ranked = topk.best + (size_t)t * chunks;
      header(1, topk);
    }
    *ranked = keys + slot.sink_t + (size_t)slot.sink_t * chunks;
    if (!argmax) return reinterpret_cast<const SelectSink*>(base + sizeof(SelectSink));
    if (slot.sink_ids != ids) {
      SelectSink h;
      h.best = keys;
      h.ids = ids;
      header(0, h);
      slot.sink_ids = ids;
    }
    return reinterpret_cast<const SelectSink*>(base);
  }

  // Launches one step on the stream (the stream order is the barrier).
  // sink: the q8 matvec step's selection (the route's last step; select_in_matvec).
  void enqueue(const Step& st, const float* x, float* normed, float* logits, int t,
               const SelectSink* sink = nullptr) {
    const Node& n = nodes_[st.first];
    const int64_t H = spec_.hidden, V = spec_.vocab, nl = (int64_t)t * V;
    switch (n.kind) {
      case NodeKind::RmsNorm:
      case NodeKind::RmsNormCanon: {
        const NormOrder order = n.kind == NodeKind::RmsNorm ? NormOrder::Ggml : NormOrder::Canonical;
        if (st.count == 2)  // norm + γ + the q8 quantizer (cuda_fusable_q8)
          rms_norm_gamma_q8(x, normed, gamma_f(), H, t, n.f0, order, out_.type, acts_q8_.mem->ptr, stream_);
        else
          rms_norm(x, normed, H, t, n.f0, order, stream_);
        break;
      }
      case NodeKind::LayerNorm: layer_norm(x, normed, H, t, n.f0, NormOrder::Ggml, stream_); break;
      case NodeKind::LayerNormCanon: layer_norm(x, normed, H, t, n.f0, NormOrder::Canonical, stream_); break;
      case NodeKind::MulGamma: mul_rows(normed, gamma_f(), H, t, stream_); break;
      case NodeKind::MatvecQ8:
      case NodeKind::MatvecQ8Reference: {
        // quantized once per call, read by every row (booked under the node, as ggml's mul_mat and the CPU do);
        // the reference kind runs the q8 definition too: this kernel is bit-equal to the CPU's scalar one
        Q8Call q = q8_args(t, logits);
        q.fold = q8_fold(st, t);
        q.select = sink;
        quantize_acts_q8(out_.type, normed, H, H, t, acts_q8_.mem->ptr, &q, stream_, prologue_q8_);
        matvec_q8(q, stream_);
        if (st.count == 2 && q.fold.op == EpilogueOp::None) enqueue_epilogue(nodes_[st.first + 1], logits, nl);
        break;
      }
      case NodeKind::MatvecCanon: matvec_canon(matvec_args(normed, t, logits), stream_); break;
      case NodeKind::MatvecReference: matvec_reference(matvec_args(normed, t, logits), stream_); break;
      case NodeKind::Scale:
      case NodeKind::Tanh:
      case NodeKind::SoftcapFused:
      case NodeKind::SoftcapReference:
      case NodeKind::SoftcapCanon: enqueue_epilogue(n, logits, nl); break;
    }
  }

  // An element-wise node over n logits at y (the start of an allocation: 16-byte aligned).
  void enqueue_epilogue(const Node& n, float* y, int64_t count) {
    const EpilogueFold f = epilogue_fold(n);
    if (f.op == EpilogueOp::None)
      throw Error(std::string("internal: ") + node_kind_name(n.kind) + " is not an element-wise node");
    epilogue(f, y, count, stream_);
  }

  // The matvec node for rows [r0, r0 + rows) of the weight at w (the device
  // layout; r0 a multiple of kTileRows) into y [t x ldy]; q: the call's quantized
  // activations (acts="q8"), x the normed ones.
  void enqueue_matvec_rows(NodeKind kind, const uint8_t* w, int64_t rows, const float* x, const Q8Call& q, int t,
                           float* y, int64_t ldy) {
    auto place = [&](WeightArgs& a) {
      a.w = w;
      a.rows = rows;
      a.y = y;
      a.ldy = ldy;
    };
    if (kind == NodeKind::MatvecQ8 || kind == NodeKind::MatvecQ8Reference) {
      Q8Call a = q;
      place(a);
      matvec_q8(a, stream_);
    } else {
      MatvecArgs a = matvec_args(x, t, y);
      place(a);
      if (kind == NodeKind::MatvecCanon) matvec_canon(a, stream_);
      else matvec_reference(a, stream_);
    }
  }

  // The nodes captured into an executable graph (with event records around
  // each node when `events`). Launch configurations are fixed at capture, so
  // a graph is valid for the buffers and t it was captured with.
  cudaGraphExec_t capture(const float* x, float* normed, float* logits, int t, bool events) {
    return instantiate(capture_graph(x, normed, logits, t, events, CallExtras{}), "cudaGraphInstantiate");
  }

  cudaGraph_t capture_graph(const float* x, float* normed, float* logits, int t, bool events, const CallExtras& ex) {
    return capture_stream([&] {
      if (events) {
        for (size_t i = 0; i < steps_.size(); ++i) {
          check(cudaEventRecordWithFlags(events_[i].first, stream_, cudaEventRecordExternal), "cudaEventRecord");
          enqueue(steps_[i], x, normed, logits, t);
          check(cudaEventRecordWithFlags(events_[i].second, stream_, cudaEventRecordExternal), "cudaEventRecord");
        }
      } else {
        enqueue_call(x, normed, logits, t, ex);
      }
    });
  }

  // The route with run_call's extras, on stream_.
  void enqueue_call(const float* x, float* normed, float* logits, int t, const CallExtras& ex) {
    const int64_t n = (int64_t)t * spec_.hidden;
    auto* first_bad = reinterpret_cast<unsigned long long*>(ex.result_dev);
    if (ex.scan && ex.fork) {  // beside the route: the graph's branches run at once
      fork_scan(x, n, first_bad);
    } else if (ex.scan) {
      first_nonfinite(x, n, first_bad, scan_sync(), stream_);
    }
    for (const Step& st : steps_) enqueue(st, x, normed, logits, t, &st == &steps_.back() ? ex.sink : nullptr);
    if (ex.log_softmax) enqueue_log_softmax(logits, t);
    if (ex.k && !(ex.sink && ex.ids_only)) {  // argmax in the matvec is done
      auto* ids = reinterpret_cast<int64_t*>(ex.result_dev + 8);
      auto* vals = reinterpret_cast<float*>(ex.result_dev + 8 + (size_t)t * ex.k * sizeof(int64_t));
      if (ex.sink)  // the chunk bests came from the matvec
        topk_threshold_from_bests(logits, spec_.vocab, t, ex.k, ex.sink_ranked, sel_.mem->ptr,
                                  static_cast<unsigned*>(sel_sync_.mem->ptr), ids, vals, stream_);
      else
        enqueue_select(logits, t, ex.k, ex.ids_only, ids, vals);
    }
    if (ex.scan && ex.fork) join_scan();
  }

  // The selection's scratch for (t, k), allocated before a capture bakes it in.
  void ensure_select(int t, int k, bool ids_only) {
    const int64_t V = spec_.vocab;
    const size_t words = select_sync_words(t) * sizeof(unsigned);
    sel_sync_.ensure_zeroed(words, ordinal_, "selection counters", stream_);  // the kernels keep them 0
    if (ids_only) sel_.ensure(argmax_scratch_bytes(V, t), ordinal_, "argmax scratch");
    else if (topk_threshold_fits(V, t, k)) sel_.ensure(topk_threshold_scratch_bytes(V, t), ordinal_, "top-k scratch");
    else topk_scratch_.ensure(topk_scratch_bytes(V, t, k), ordinal_, "top-k scratch");
  }

  void enqueue_select(const float* logits, int t, int k, bool ids_only, int64_t* ids, float* vals) {
    const int64_t V = spec_.vocab;
    auto* sync = static_cast<unsigned*>(sel_sync_.mem->ptr);
    if (ids_only) cuda::argmax(logits, V, t, sel_.mem->ptr, sync, ids, stream_);
    else if (topk_threshold_fits(V, t, k)) topk_threshold(logits, V, t, k, sel_.mem->ptr, sync, ids, vals, stream_);
    else cuda::topk(logits, V, t, k, topk_scratch_.mem->ptr, ids, vals, stream_);
  }

  // What `enqueue_all` launches on the stream, captured into a graph (the capture
  // ended and the error cleared when it throws).
  template <class F>
  cudaGraph_t capture_stream(F&& enqueue_all) {
    check(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeRelaxed), "cudaStreamBeginCapture");
    cudaGraph_t graph = nullptr;
    try {
      enqueue_all();
    } catch (...) {
      (void)cudaStreamEndCapture(stream_, &graph);
      if (graph) cudaGraphDestroy(graph);
      (void)cudaGetLastError();
      throw;
    }
    check(cudaStreamEndCapture(stream_, &graph), "cudaStreamEndCapture");
    return graph;
  }

  // An executable graph of `graph`, which is destroyed.
  static cudaGraphExec_t instantiate(cudaGraph_t graph, const char* what) {
    cudaGraphExec_t exec = nullptr;
    const cudaError_t inst = cudaGraphInstantiate(&exec, graph, 0);
    cudaGraphDestroy(graph);
    check(inst, what);
    return exec;
  }

  // The cached graph of the route for this call's shape and buffers. When
  // they change (another t, a device hidden state at another address) the
  // route is captured again and the executable graph updated in place --
  // cheaper than a new instantiation -- or, when the update is refused,
  // instantiated anew.
  cudaGraphExec_t route_graph(RouteGraph& g, const float* x, float* normed, float* logits, int t, bool log_softmax,
                              CallExtras ex) {
    ex.log_softmax = log_softmax;
    if (log_softmax) ensure_log_softmax(t);  // the buffers the capture bakes in, sized before the key is taken
    RouteKey key{t, x, normed, logits, q8_ ? acts_q8_.mem->ptr : nullptr,
                 log_softmax ? lsm_reduce_.pairs.mem->ptr : nullptr, log_softmax ? lsm_lse_.mem->ptr : nullptr,
                 log_softmax};
    key.scan = ex.scan;
    key.k = ex.k;
    key.ids_only = ex.ids_only;
    key.sel = ex.k && sel_.mem ? sel_.mem->ptr : nullptr;
    key.sel_sync = ex.k ? sel_sync_.mem->ptr : nullptr;
    if (ex.k && !ex.ids_only && !topk_threshold_fits(spec_.vocab, t, ex.k)) key.sel = topk_scratch_.mem->ptr;
    key.result_dev = ex.result_dev;
    key.result_host = ex.result_host;
    key.sink = ex.sink;
    if (g.exec && g.key == key) return g.exec;
    cudaGraph_t graph = capture_graph(x, normed, logits, t, false, ex);
    if (g.exec) {
      cudaGraphExecUpdateResultInfo info{};
      const cudaError_t updated = cudaGraphExecUpdate(g.exec, graph, &info);
      (void)cudaGetLastError();  // a refused update is not an error of the call
      if (updated == cudaSuccess) {
        cudaGraphDestroy(graph);
        g.key = key;
        return g.exec;
      }
      g.reset();
    }
    g.exec = instantiate(graph, "cudaGraphInstantiate (route)");
    g.key = key;
    return g.exec;
  }

  std::unique_ptr<DeviceMemory> upload(const std::vector<float>& v, const char* what) {
    if (v.empty()) return nullptr;
    auto m = std::make_unique<DeviceMemory>(v.size() * sizeof(float), ordinal_, what);
    check(cudaMemcpy(m->ptr, v.data(), v.size() * sizeof(float), cudaMemcpyHostToDevice), what);
    return m;
  }

  // The weight and t logits rows y, for either matvec's arguments.
  void set_weight_args(WeightArgs& a, int t, float* y) const {
    a.w = static_cast<const uint8_t*>(weight_->ptr);
    a.type = out_.type;
    a.rows = out_.rows;
    a.cols = out_.cols;
    a.row_bytes = out_.row_bytes;
    a.t = t;
    a.y = y;
    a.ldy = spec_.vocab;
  }

  MatvecArgs matvec_args(const float* x, int t, float* y) const {
    MatvecArgs a;
    set_weight_args(a, t, y);
    a.x = x;
    a.ldx = spec_.hidden;
    return a;
  }

  Q8Call q8_args(int t, float* y) const {
    Q8Call a;
    set_weight_args(a, t, y);
    return a;
  }

  void ensure_events(size_t n) {
    while (events_.size() < n) {
      cudaEvent_t a = nullptr, b = nullptr;
      check(cudaEventCreate(&a), "cudaEventCreate");
      check(cudaEventCreate(&b), "cudaEventCreate");
      events_.emplace_back(a, b);
    }
  }

  const float* gamma_f() const { return static_cast<const float*>(gamma_->ptr); }

  int ordinal_;
  cudaStream_t stream_ = nullptr;      // where the enqueue helpers launch: own_stream_ but inside a StreamSwap
  cudaStream_t own_stream_ = nullptr;  // the device's blocking stream (every synchronized call's)
  cudaStream_t side_ = nullptr;        // a graph's side branch (the NaN scan) is captured on it
  cudaEvent_t fork_ev_ = nullptr, join_ev_ = nullptr;
  cudaEvent_t done_ev_ = nullptr;      // the end of the latest call that returned without waiting
  bool pending_ = false;               // that call's work may still run (on pending_stream_)
  cudaStream_t pending_stream_ = nullptr;
  Scratch sel_, sel_sync_;             // run_call's argmax / top-k
  Scratch scan_sync_;                  // first_nonfinite's state, zero at rest
  unsigned long long* scan_sync() const { return static_cast<unsigned long long*>(scan_sync_.mem->ptr); }
  WeightView out_;  // shape and type of the weight (data: on the device, in weight_)
  bool q8_ = false;  // the route's matvec quantizes the activations
  std::unique_ptr<DeviceMemory> weight_, gamma_;
  Scratch hidden_, normed_, topk_scratch_, topk_out_, flag_, acts_q8_;
  bool prologue_q8_ = false;  // the norm + γ step quantizes the activations (cuda_fusable_q8)
  Scratch score_ids_, score_out_, score_chunk_;  // score(): ids (long grids), results kept there, a group's logits
  Scratch score_gathered_, score_chosen_;  // score() in slices: the chosen ids' rows (zeroed once), their logits
  ReduceScratch score_reduce_;
  MappedHost score_in_, score_results_;  // score(): the ids; the first bad index and the results
  GraphCache<ScoreKey> score_graphs_;
  ReduceScratch lsm_reduce_;  // log_softmax()
  Scratch sample_out_, sample_logits_, sample_z_, sample_pairs_, sample_state_, sample_keys_, sample_sort_,
      sample_select_, sample_select_sync_, sample_best_, sample_top_p_,
      sample_bias_, sample_allowed_;  // sample()
  MappedHost sample_in_, sample_results_;  // sample(): params | positions; the first bad index | results
  Scratch sample_in_dev_;                  // sample(): params | positions in device memory (long grids)
  GraphCache<SampleKey> sample_graphs_;
  Scratch lsm_lse_;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> events_;
};

}  // namespace

}  // namespace cuda

std::unique_ptr<Device> make_cuda_device(int ordinal) {
  const std::string name = "cuda:" + std::to_string(ordinal);
  const int n = cuda::device_count();
  if (n == 0) throw DeviceError("device '" + name + "': " + cuda::no_device_reason());
  if (ordinal < 0 || ordinal >= n)
    throw DeviceError("device '" + name + "': only " + std::to_string(n) + " CUDA device(s) visible (cuda:0" +
                      (n > 1 ? " .. cuda:" + std::to_string(n - 1) : std::string()) + ")");
  return std::make_unique<cuda::CudaDevice>(ordinal);
}

}  // namespace muser
