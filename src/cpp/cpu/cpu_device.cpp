// The CPU device: weights are read in place from the mmap; every node is a
// parallel_for over rows or elements; nodes run one after another (the
// barrier is the end of the parallel region), each timed under its own label.
// The matvec runs the active ISA's twin (cpu/matvec_dispatch.cpp); with
// acts="q8" the normed vectors are first quantized as ggml's CPU does
// (cpu/acts_q8.cpp), inside the lm_head node as in ggml's mul_mat.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>
#if defined(__linux__)
#include <sched.h>
#endif

#include "cpu/isa.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "device.h"
#include "errors.h"

namespace muser {

namespace cpu {
int default_threads() {
  int n = 0;
#if defined(__linux__)
  cpu_set_t set;  // a taskset'd process counts only its own CPUs
  if (sched_getaffinity(0, sizeof set, &set) == 0) n = CPU_COUNT(&set);
#endif
  if (n <= 0) n = (int)std::thread::hardware_concurrency();
  return std::clamp(n, 1, kMaxThreads);
}

void check_threads(int threads, const char* arg) {
  if (threads < 0 || threads > kMaxThreads)
    throw ArgValueError(std::string(arg) + " must be between 0 (every CPU this process may use) and " +
                        std::to_string(kMaxThreads) + " (muser's maximum, build_info()['max_threads']); got " +
                        std::to_string(threads));
}
}  // namespace cpu

namespace {

using Clock = std::chrono::steady_clock;

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(int threads) : threads_(threads > 0 ? threads : cpu::default_threads()) {}

  std::string name() const override { return "cpu"; }

  void prepare(const HeadSpec& spec, const HeadWeights& w) override {
    spec_ = spec;
    w_ = &w;
  }

  void run(const std::vector<Node>& nodes, Acts acts, const float* hidden, int t, float* logits,
           std::vector<NodeTiming>* timings) override {
    if (acts == Acts::Q8 && !cpu::q8_supported(w_->output.type))
      throw ArgValueError(std::string("acts='q8' quantizes the activations to int8 as ggml's CPU does for "
                                      "Q4_K, Q5_K, Q6_K and Q8_0 weights; ") +
                          spec_.output_weight + " is " + type_traits(w_->output.type).name +
                          " (ggml multiplies float weights with float activations): use acts='f32'");
    const int64_t H = spec_.hidden, V = spec_.vocab;
    // Row chunks for the matvec: whole kernel tiles, a few per thread so a
    // slow thread does not hold the others up.
    const int64_t grain_unit = cpu::matvec_row_grain();
    const int64_t row_grain = std::max<int64_t>(
        grain_unit, std::min<int64_t>(2048, V / (8 * (int64_t)threads_)) / grain_unit * grain_unit);
    normed_.resize((size_t)t * H);
    float* nx = normed_.data();
    const int64_t nl = (int64_t)t * V;
    for (const Node& node : nodes) {
      const auto start = Clock::now();
      switch (node.kind) {
        case NodeKind::RmsNorm:
        case NodeKind::RmsNormCanon:
        case NodeKind::LayerNorm:
        case NodeKind::LayerNormCanon: {
          auto fn = node.kind == NodeKind::RmsNorm        ? cpu::rms_norm_ggml
                    : node.kind == NodeKind::RmsNormCanon ? cpu::rms_norm_canon
                    : node.kind == NodeKind::LayerNorm    ? cpu::layer_norm_ggml
                                                          : cpu::layer_norm_canon;
          cpu::parallel_for(t, 1, t >= 4 ? threads_ : 1, [&](int64_t a, int64_t b) {
            for (int64_t k = a; k < b; ++k) fn(hidden + k * H, H, node.f0, nx + k * H);
          });
          break;
        }
        case NodeKind::MulGamma:
          for (int64_t k = 0; k < t; ++k)
            for (int64_t i = 0; i < H; ++i) nx[k * H + i] = nx[k * H + i] * w_->gamma[i];
          break;
        case NodeKind::AddBeta:
          for (int64_t k = 0; k < t; ++k)
            for (int64_t i = 0; i < H; ++i) nx[k * H + i] = nx[k * H + i] + w_->beta[i];
          break;
        case NodeKind::Matvec:
        case NodeKind::MatvecReference: {
          const bool reference = node.kind == NodeKind::MatvecReference;
          if (acts == Acts::Q8) {
            // quantized once per call, read by every row (part of the node's time, as in ggml's mul_mat)
            cpu::quantize_acts_q8(w_->output.type, nx, H, H, t, &acts_q8_);
            cpu::parallel_for(V, row_grain, threads_, [&](int64_t r0, int64_t r1) {
              // the reference route runs the q8 definition itself: the scalar twin
              if (reference)
                cpu::matvec_q8_scalar(w_->output, acts_q8_, r0, r1, logits, V);
              else
                cpu::matvec_q8(w_->output, acts_q8_, r0, r1, logits, V);
            });
          } else {
            cpu::parallel_for(V, row_grain, threads_, [&](int64_t r0, int64_t r1) {
              if (reference)
                cpu::matvec_reference(w_->output, nx, H, t, r0, r1, logits, V);
              else
                cpu::matvec_canon(w_->output, nx, H, t, r0, r1, logits, V);
            });
          }
          break;
        }
        case NodeKind::AddBias:
          elementwise(nl, [&](int64_t a, int64_t b) {
            for (int64_t i = a; i < b; ++i) logits[i] = logits[i] + w_->bias[i % V];
          });
          break;
        case NodeKind::Scale:
          elementwise(nl, [&](int64_t a, int64_t b) { cpu::scale_inplace(logits + a, b - a, node.f0); });
          break;
        case NodeKind::Tanh:
          elementwise(nl, [&](int64_t a, int64_t b) { cpu::tanh_inplace(logits + a, b - a); }, true);
          break;
        case NodeKind::SoftcapFused:
          elementwise(
              nl, [&](int64_t a, int64_t b) { cpu::softcap_fused_inplace(logits + a, b - a, node.f0, node.f1); }, true);
          break;
        case NodeKind::SoftcapReference:
          cpu::softcap_reference_inplace(logits, nl, node.f1, node.f2);
          break;
        case NodeKind::SoftcapCanon:
          elementwise(nl, [&](int64_t a, int64_t b) {
            cpu::softcap_canon_inplace(logits + a, b - a, node.f0, node.f1, node.f2);
          });
          break;
      }
      if (timings) {
        const double sec = std::chrono::duration<double>(Clock::now() - start).count();
        timings->push_back({node.label, node_kind_name(node.kind), sec, node_bytes(node, spec_, w_->output, t)});
      }
    }
  }

 private:
  // Element-wise nodes over the logits. A fork-join costs little on an idle
  // machine but up to a scheduler time slice (milliseconds) when another
  // process holds a core, so only work worth more than that is split:
  // libm tanhf (~10 ns per logit) in 32 Ki chunks, arithmetic-only nodes
  // (scale, bias, the vectorized canonical cap: well under 1 ns) in 1 Mi.
  template <class F>
  void elementwise(int64_t n, const F& f, bool calls_libm = false) {
    cpu::parallel_for(n, calls_libm ? (1 << 15) : (1 << 20), threads_, f);
  }

  int threads_;
  HeadSpec spec_;
  const HeadWeights* w_ = nullptr;
  std::vector<float> normed_;
  cpu::ActsQ8 acts_q8_;  // reused between calls
};

}  // namespace

std::shared_ptr<HostBuffer> Device::alloc_host(size_t n) {
  auto buf = std::make_shared<HostBuffer>();
  const size_t bytes = ((n * sizeof(float) + 63) / 64) * 64;
  buf->data = static_cast<float*>(std::aligned_alloc(64, bytes ? bytes : 64));
  if (!buf->data) throw Error("out of host memory allocating " + std::to_string(bytes) + " bytes for logits");
  buf->count = n;
  buf->release = [](float* p) { std::free(p); };
  return buf;
}

#ifdef MUSER_HAVE_CUDA
std::unique_ptr<Device> make_cuda_device(int ordinal, int threads);  // src/cuda/cuda_device.cpp
#endif

std::unique_ptr<Device> make_device(const std::string& name, int threads) {
  if (name == "cpu") return std::make_unique<CpuDevice>(threads);
  if (name == "cuda" || name.rfind("cuda:", 0) == 0) {
#ifdef MUSER_HAVE_CUDA
    int ordinal = 0;
    if (name.size() > 5) {
      char* end = nullptr;
      const long v = std::strtol(name.c_str() + 5, &end, 10);
      if (*end != '\0' || v < 0 || v > 1024) throw ArgValueError("device '" + name + "': expected 'cuda' or 'cuda:N'");
      ordinal = (int)v;
    }
    return make_cuda_device(ordinal, threads);
#else
    throw DeviceError("device '" + name + "': this build of muser has no CUDA backend (built without nvcc)");
#endif
  }
  if (name == "metal")
    throw DeviceError("device 'metal': this build of muser has no Metal backend (Metal is built on Apple only)");
  throw ArgValueError("device must be 'cpu', 'cuda', 'cuda:N' or 'metal'; got '" + name + "'");
}

double node_bytes(const Node& n, const HeadSpec& spec, const WeightView& w, int t) {
  const double H = (double)spec.hidden, V = (double)spec.vocab;
  switch (n.kind) {
    case NodeKind::Matvec:
    case NodeKind::MatvecReference:
      return (double)w.row_bytes * w.rows + 4.0 * t * (H + V);
    case NodeKind::RmsNorm:
    case NodeKind::RmsNormCanon:
    case NodeKind::LayerNorm:
    case NodeKind::LayerNormCanon:
      return 8.0 * t * H;
    case NodeKind::MulGamma:
    case NodeKind::AddBeta:
      return 8.0 * t * H + 4.0 * H;
    case NodeKind::AddBias:
      return 8.0 * t * V + 4.0 * V;
    default:
      return 8.0 * t * V;  // read + write every logit
  }
}

}  // namespace muser
