// The CPU device: weights are read in place from the mmap; every step is a
// parallel_for over rows or elements; steps run one after another (the
// barrier is the end of the parallel region), each timed under its nodes'
// labels. The matvec runs the active ISA's twin (cpu/matvec_dispatch.cpp); the
// q8 kinds first quantize the normed vectors as ggml's CPU does
// (cpu/acts_q8.cpp), inside the lm_head step as in ggml's mul_mat.
// Fusions (the route allows them; plan_steps): the norm and γ in one pass per
// row; the element-wise epilogue applied to each chunk of rows the matvec has
// just written, while they are in cache. Each computes exactly the unfused
// nodes' bytes (tests/test_fusion.py).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>
#if defined(__linux__)
#include <sched.h>
#endif

#include "cpu/cpu_device.h"
#include "cpu/isa.h"
#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "device.h"
#include "errors.h"
#include "muser/logsumexp.h"

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

bool is_epilogue(NodeKind k) {
  return k == NodeKind::Scale || k == NodeKind::Tanh || k == NodeKind::SoftcapFused ||
         k == NodeKind::SoftcapReference || k == NodeKind::SoftcapCanon;
}

void norm_row(NodeKind kind, const float* x, int64_t H, float eps, float* y) {
  switch (kind) {
    case NodeKind::RmsNorm: cpu::rms_norm_ggml(x, H, eps, y); return;
    case NodeKind::RmsNormCanon: cpu::rms_norm_canon(x, H, eps, y); return;
    case NodeKind::LayerNorm: cpu::layer_norm_ggml(x, H, eps, y); return;
    case NodeKind::LayerNormCanon: cpu::layer_norm_canon(x, H, eps, y); return;
    case NodeKind::MulGamma:
    case NodeKind::MatvecReference:
    case NodeKind::MatvecCanon:
    case NodeKind::MatvecQ8:
    case NodeKind::MatvecQ8Reference:
    case NodeKind::Scale:
    case NodeKind::Tanh:
    case NodeKind::SoftcapFused:
    case NodeKind::SoftcapReference:
    case NodeKind::SoftcapCanon: break;
  }
  throw Error(std::string("internal: ") + node_kind_name(kind) + " is not a norm");
}

// One element-wise epilogue node over n logits, from the node's kernel
// arguments (muser/kernel_args.h, the struct every backend's kernel reads).
void epilogue(const Node& node, float* y, int64_t n) {
  const EpilogueKargs k = epilogue_kargs(node, n);
  switch (node.kind) {
    case NodeKind::Scale: cpu::scale_inplace(y, k.n, k.scale); return;
    case NodeKind::Tanh: cpu::tanh_inplace(y, k.n); return;
    case NodeKind::SoftcapFused: cpu::softcap_fused_inplace(y, k.n, k.scale, k.cap); return;
    case NodeKind::SoftcapReference: cpu::softcap_reference_inplace(y, k.n, k.cap, k.inv_cap); return;
    case NodeKind::SoftcapCanon: cpu::softcap_canon_inplace(y, k.n, k.scale, k.cap, k.inv_cap); return;
    case NodeKind::RmsNorm:
    case NodeKind::RmsNormCanon:
    case NodeKind::LayerNorm:
    case NodeKind::LayerNormCanon:
    case NodeKind::MulGamma:
    case NodeKind::MatvecReference:
    case NodeKind::MatvecCanon:
    case NodeKind::MatvecQ8:
    case NodeKind::MatvecQ8Reference: break;
  }
  throw Error(std::string("internal: ") + node_kind_name(node.kind) + " is not an element-wise epilogue");
}

// Element-wise nodes over the logits. A fork-join costs little on an idle
// machine but up to a scheduler time slice (milliseconds) when another
// process holds a core, so only work worth more than that is split:
// libm tanhf (~10 ns per logit) in 32 Ki chunks, arithmetic-only nodes
// (scale, the vectorized canonical cap: well under 1 ns) in 1 Mi.
int64_t epilogue_grain(NodeKind k) {
  return k == NodeKind::Tanh || k == NodeKind::SoftcapFused ? (1 << 15) : (1 << 20);
}

}  // namespace

namespace cpu {

void matvec_rows(NodeKind kind, const WeightView& w, const StepBuffers& b, int t, int64_t r0, int64_t r1, float* y,
                 int64_t ldy) {
  const int64_t H = w.cols;
  switch (kind) {
    case NodeKind::MatvecReference: matvec_reference(w, b.normed, H, t, r0, r1, y, ldy); return;
    case NodeKind::MatvecCanon: matvec_canon(w, b.normed, H, t, r0, r1, y, ldy); return;
    case NodeKind::MatvecQ8: matvec_q8(w, *b.acts_q8, r0, r1, y, ldy); return;
    // the q8 definition itself: the scalar twin
    case NodeKind::MatvecQ8Reference: matvec_q8_scalar(w, *b.acts_q8, r0, r1, y, ldy); return;
    case NodeKind::RmsNorm:
    case NodeKind::RmsNormCanon:
    case NodeKind::LayerNorm:
    case NodeKind::LayerNormCanon:
    case NodeKind::MulGamma:
    case NodeKind::Scale:
    case NodeKind::Tanh:
    case NodeKind::SoftcapFused:
    case NodeKind::SoftcapReference:
    case NodeKind::SoftcapCanon: break;
  }
  throw Error(std::string("internal: ") + node_kind_name(kind) + " is not a matvec");
}

bool cpu_fusable(NodeKind a, NodeKind b) {
  return (is_norm(a) && b == NodeKind::MulGamma) || (is_matvec(a) && is_epilogue(b));
}

void run_steps(const std::vector<Node>& nodes, const std::vector<Step>& steps, const HeadSpec& spec,
               const HeadWeights& w, int threads, int t, const StepBuffers& b, std::vector<NodeTiming>* timings) {
  const int64_t H = spec.hidden, V = spec.vocab;
  for (const Step& step : steps) {
    const auto start = Clock::now();
    const Node& head = nodes[step.first];
    const Node* fused = step.count > 1 ? &nodes[step.first + 1] : nullptr;
    if (is_norm(head.kind)) {
      const bool gamma = fused != nullptr;  // cpu_fusable: only γ follows a norm
      parallel_for(t, 1, t >= 4 ? threads : 1, [&](int64_t a, int64_t c) {
        for (int64_t k = a; k < c; ++k) {
          float* y = b.normed + k * H;
          norm_row(head.kind, b.hidden + k * H, H, head.f0, y);
          if (gamma)
            for (int64_t i = 0; i < H; ++i) y[i] = y[i] * w.gamma[(size_t)i];
        }
      });
    } else if (head.kind == NodeKind::MulGamma) {
      for (int64_t k = 0; k < t; ++k)
        for (int64_t i = 0; i < H; ++i) b.normed[k * H + i] = b.normed[k * H + i] * w.gamma[(size_t)i];
    } else if (is_matvec(head.kind)) {
      // Row chunks: whole kernel tiles, a few per thread so a slow thread does not hold the others up.
      const int64_t unit = matvec_row_grain();
      const int64_t grain = std::max<int64_t>(unit, std::min<int64_t>(2048, V / (8 * (int64_t)threads)) / unit * unit);
      const bool q8 = head.kind == NodeKind::MatvecQ8 || head.kind == NodeKind::MatvecQ8Reference;
      // quantized once per call, read by every row (part of the step's time, as in ggml's mul_mat)
      if (q8) quantize_acts_q8(w.output.type, b.normed, H, H, t, b.acts_q8);
      parallel_for(V, grain, threads, [&](int64_t r0, int64_t r1) {
        matvec_rows(head.kind, w.output, b, t, r0, r1, b.logits, V);
        if (fused)  // this chunk's logits, while they are in cache
          for (int64_t k = 0; k < t; ++k) epilogue(*fused, b.logits + k * V + r0, r1 - r0);
      });
    } else {
      const int64_t n = (int64_t)t * V;
      parallel_for(n, epilogue_grain(head.kind), threads,
                   [&](int64_t a, int64_t c) { epilogue(head, b.logits + a, c - a); });
    }
    if (timings) {
      const double sec = std::chrono::duration<double>(Clock::now() - start).count();
      std::string kinds;
      for (size_t i = step.first; i < step.first + step.count; ++i)
        kinds += (kinds.empty() ? "" : "+") + std::string(node_kind_name(nodes[i].kind));
      timings->push_back({step_label(nodes, step), kinds, sec, step_bytes(nodes, step, spec, w.output, t)});
    }
  }
}

}  // namespace cpu

namespace {

class CpuDevice final : public Device {
 public:
  explicit CpuDevice(int threads) : threads_(threads > 0 ? threads : cpu::default_threads()) {}

  std::string name() const override { return "cpu"; }

  void prepare(const HeadSpec& spec, const HeadWeights& w, const std::vector<Node>& nodes, bool fuse) override {
    plan(spec, nodes, fuse, cpu::cpu_fusable);
    w_ = &w;
  }

  void run(const float* hidden, int t, float* logits, std::vector<NodeTiming>* timings) override {
    normed_.resize((size_t)t * (size_t)spec_.hidden);
    const cpu::StepBuffers b{hidden, normed_.data(), logits, &acts_q8_};
    cpu::run_steps(nodes_, steps_, spec_, *w_, threads_, t, b, timings);
  }

  // The route tile by tile (kLseTile rows of the vocabulary for every token,
  // in a scratch of each task's own): the nodes after the matvec are
  // element-wise, so a tile's logits are the full call's bytes, reduced while
  // in cache. The chosen ids' logits come first, from their rows alone (a
  // row's dot product does not depend on its neighbours: docs/numerics.md), so
  // each tile can count the ids ahead of them.
  void score(const float* hidden, bool hidden_resident, int t, VocabScores& out) override {
    if (hidden_resident || out.keep_on_device) Device::score(hidden, hidden_resident, t, out);  // refuses, saying why
    const int64_t H = spec_.hidden, V = spec_.vocab, m = out.m;
    normed_.resize((size_t)t * (size_t)H);
    const cpu::StepBuffers b{hidden, normed_.data(), nullptr, &acts_q8_};
    size_t mv = 0;
    while (mv < nodes_.size() && !is_matvec(nodes_[mv].kind)) ++mv;
    std::vector<Step> before;
    for (const Step& st : steps_)
      if (st.first < mv) before.push_back(st);
    cpu::run_steps(nodes_, before, spec_, *w_, threads_, t, b, nullptr);
    const NodeKind kind = nodes_[mv].kind;
    if (kind == NodeKind::MatvecQ8 || kind == NodeKind::MatvecQ8Reference)
      cpu::quantize_acts_q8(w_->output.type, b.normed, H, H, t, b.acts_q8);
    const WeightView& w = w_->output;
    auto rows_view = [&](int64_t r0, int64_t n) {
      WeightView v = w;
      v.data = w.data + r0 * w.row_bytes;
      v.rows = n;
      return v;
    };
    // y [t x ld]: n logits of each token through the nodes after the matvec
    auto finish = [&](float* y, int64_t ld, int64_t n) {
      for (size_t i = mv + 1; i < nodes_.size(); ++i)
        for (int k = 0; k < t; ++k) epilogue(nodes_[i], y + k * ld, n);
    };

    // the chosen ids' logits: each distinct id's row once, for every token
    std::vector<int64_t> uniq(out.ids, out.ids + t * m);
    std::sort(uniq.begin(), uniq.end());
    uniq.erase(std::unique(uniq.begin(), uniq.end()), uniq.end());
    const int64_t U = (int64_t)uniq.size();
    if (U > 0) {
      std::vector<float> chosen((size_t)(t * U));
      cpu::parallel_for(U, 16, threads_, [&](int64_t a, int64_t c) {
        for (int64_t u = a; u < c; ++u)
          cpu::matvec_rows(kind, rows_view(uniq[(size_t)u], 1), b, t, 0, 1, chosen.data() + u, U);
      });
      finish(chosen.data(), U, U);
      for (int64_t q = 0; q < t * m; ++q) {
        const int64_t u = std::lower_bound(uniq.begin(), uniq.end(), out.ids[q]) - uniq.begin();
        out.values[q] = chosen[(size_t)((q / m) * U + u)];
      }
    }

    const int64_t tiles = lse_tile_count(V);
    std::vector<LsePair> pairs((size_t)(t * tiles));
    std::vector<std::atomic<int64_t>> ahead((size_t)(t * m));
    for (auto& a : ahead) a.store(0, std::memory_order_relaxed);
    cpu::parallel_for(tiles, 1, threads_, [&](int64_t a, int64_t c) {
      std::vector<float> y((size_t)t * kLseTile);
      for (int64_t tile = a; tile < c; ++tile) {
        const int64_t r0 = tile * kLseTile, n = std::min<int64_t>(kLseTile, V - r0);
        cpu::matvec_rows(kind, rows_view(r0, n), b, t, 0, n, y.data(), n);
        finish(y.data(), n, n);
        for (int k = 0; k < t; ++k) {
          const float* row = y.data() + k * n;
          pairs[(size_t)(k * tiles + tile)] = cpu::lse_tile_cpu(row, (int)n);
          for (int64_t j = 0; j < m; ++j) {
            const int64_t q = k * m + j, tok = out.ids[q];
            const float v = out.values[q];
            const int64_t count = cpu::count_ranked_ahead(row, n, r0, v, tok);
            if (count) ahead[(size_t)q].fetch_add(count, std::memory_order_relaxed);
          }
        }
      }
    });
    for (int k = 0; k < t; ++k) out.lse[k] = lse_value(lse_tree(pairs.data() + k * tiles, (int)tiles));
    for (int64_t q = 0; q < t * m; ++q) {
      out.ranks[q] = 1 + ahead[(size_t)q].load(std::memory_order_relaxed);
      out.logprobs[q] = out.values[q] - out.lse[q / m];  // log_softmax's one subtraction
    }
  }

 private:
  int threads_;
  const HeadWeights* w_ = nullptr;
  std::vector<float> normed_;
  cpu::ActsQ8 acts_q8_;  // reused between calls
};

}  // namespace

std::unique_ptr<Device> make_cpu_device(int threads) { return std::make_unique<CpuDevice>(threads); }

}  // namespace muser
