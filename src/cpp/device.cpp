// The device registry and the host defaults of Device's abilities.
#include "device.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "cpu/kernels.h"
#include "cpu/parallel.h"
#include "errors.h"

namespace muser {

std::shared_ptr<HostBuffer> Device::alloc_host(size_t n) {
  auto buf = std::make_shared<HostBuffer>();
  const size_t bytes = ((n * sizeof(float) + 63) / 64) * 64;
  buf->data = static_cast<float*>(std::aligned_alloc(64, bytes ? bytes : 64));
  if (!buf->data) throw Error("out of host memory allocating " + std::to_string(bytes) + " bytes for logits");
  buf->count = n;
  buf->release = [](float* p) { std::free(p); };
  return buf;
}

void Device::plan(const HeadSpec& spec, const std::vector<Node>& nodes, bool fuse,
                  bool (*fusable)(NodeKind, NodeKind)) {
  spec_ = spec;
  nodes_ = nodes;
  steps_ = plan_steps(nodes, fuse, fusable);
}

std::shared_ptr<ResidentBuffer> Device::run_resident(const float*, bool, int, std::vector<NodeTiming>*) {
  throw DeviceError("device '" + name() + "' keeps logits in host memory: on_device=True needs a device with "
                    "memory of its own (caps()['resident_logits'])");
}

void Device::topk(const float* logits, int t, int k, int64_t* ids, float* vals) {
  host_topk(logits, t, spec_.vocab, k, ids, vals);
}

int64_t Device::find_nonfinite(const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(x[i])) return i;
  return -1;
}

void Device::download(const float* src, float* dst, size_t n) { std::memcpy(dst, src, n * sizeof(float)); }

int Device::owner_of(const void*) const { return -1; }

std::vector<double> Device::route_seconds(const float* hidden, bool hidden_resident, int t, int reps, bool) {
  if (hidden_resident)
    throw DeviceError("device '" + name() + "' has no memory of its own: route_seconds takes host hidden states");
  if (reps < 1) throw ArgValueError("reps must be >= 1, got " + std::to_string(reps));
  auto out = alloc_host((size_t)t * (size_t)spec_.vocab);
  run(hidden, t, out->data, nullptr);  // warm-up
  std::vector<double> seconds;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run(hidden, t, out->data, nullptr);
    seconds.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  return seconds;
}

void Device::score(const float* hidden, bool hidden_resident, int t, VocabScores& out) {
  if (hidden_resident)
    throw DeviceError("device '" + name() + "' has no memory of its own: score takes host hidden states");
  const int64_t V = spec_.vocab;
  auto logits = alloc_host((size_t)t * (size_t)V);
  run(hidden, t, logits->data, nullptr);
  cpu::logsumexp_rows(logits->data, t, V, cpu::default_threads(), out.lse);
  if (out.keep_on_device) throw DeviceError("device '" + name() + "' has no memory of its own to keep scores in");
  if (out.m > 0)
    cpu::score_rows(logits->data, t, V, out.ids, out.m, out.lse, cpu::default_threads(), out.logprobs, out.values,
                    out.ranks);
}

bool Device::sample(const float*, bool, int, SampleRequest&, SampleResult*) { return false; }

std::shared_ptr<ResidentBuffer> Device::run_resident_log_softmax(const float* hidden, bool hidden_resident, int t) {
  auto logits = run_resident(hidden, hidden_resident, t, nullptr);
  auto* y = static_cast<float*>(logits->ptr);
  std::vector<float> lse((size_t)t);
  cpu::logsumexp_rows(y, t, spec_.vocab, cpu::default_threads(), lse.data());
  cpu::log_softmax_rows(y, t, spec_.vocab, lse.data(), cpu::default_threads());
  return logits;
}

CallResult Device::run_call(const float* hidden, bool hidden_resident, int t, const CallRequest& req) {
  if (req.has_stream)
    throw ArgValueError("device '" + name() + "' takes no stream= (it runs on its own queue)");
  CallResult r;
  if (req.check_finite && hidden_resident) {
    r.first_bad = find_nonfinite(hidden, (int64_t)t * spec_.hidden);
    if (r.first_bad >= 0) return r;
  }
  r.logits = req.log_softmax ? run_resident_log_softmax(hidden, hidden_resident, t)
                             : run_resident(hidden, hidden_resident, t, nullptr);
  if (req.k > 0) {
    std::vector<float> scratch;
    float* vals = req.vals;
    if (!vals) {
      scratch.resize((size_t)t * (size_t)req.k);
      vals = scratch.data();
    }
    topk(static_cast<const float*>(r.logits->ptr), t, req.k, req.ids, vals);
  }
  return r;
}

void host_topk(const float* logits, int t, int64_t V, int k, int64_t* ids, float* vals) {
  std::vector<int64_t> idx((size_t)V);
  for (int r = 0; r < t; ++r) {
    const float* row = logits + (int64_t)r * V;
    std::iota(idx.begin(), idx.end(), 0);
    auto better = [row](int64_t a, int64_t b) {
      const bool na = std::isnan(row[a]), nb = std::isnan(row[b]);
      if (na != nb) return nb;  // a number beats NaN
      if (!na && row[a] != row[b]) return row[a] > row[b];
      return a < b;
    };
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(), better);
    for (int j = 0; j < k; ++j) {
      ids[(int64_t)r * k + j] = idx[(size_t)j];
      vals[(int64_t)r * k + j] = row[idx[(size_t)j]];
    }
  }
}

std::unique_ptr<Device> make_device(const std::string& name, int threads) {
  if (name == "cpu") return make_cpu_device(threads);
  if (name == "cuda" || name.rfind("cuda:", 0) == 0) {
    int ordinal = 0;
    if (name.size() > 5) {
      char* end = nullptr;
      const long v = std::strtol(name.c_str() + 5, &end, 10);
      if (name.size() == 5 || *end != '\0' || v < 0 || v > 1024)
        throw ArgValueError("device '" + name + "': expected 'cuda' or 'cuda:N'");
      ordinal = (int)v;
    } else if (name.size() == 5) {
      throw ArgValueError("device '" + name + "': expected 'cuda' or 'cuda:N'");
    }
    return make_cuda_device(ordinal);
  }
  if (name == "metal") return make_metal_device();
  throw ArgValueError("device must be 'cpu', 'cuda', 'cuda:N' or 'metal'; got '" + name + "'");
}

double node_bytes(const Node& n, const HeadSpec& spec, const WeightView& w, int t) {
  const double H = (double)spec.hidden, V = (double)spec.vocab;
  switch (n.kind) {
    case NodeKind::MatvecReference:
    case NodeKind::MatvecCanon:
    case NodeKind::MatvecQ8:
    case NodeKind::MatvecQ8Reference: return (double)w.row_bytes * w.rows + 4.0 * t * (H + V);
    case NodeKind::RmsNorm:
    case NodeKind::RmsNormCanon:
    case NodeKind::LayerNorm:
    case NodeKind::LayerNormCanon: return 8.0 * t * H;
    case NodeKind::MulGamma: return 8.0 * t * H + 4.0 * H;
    case NodeKind::Scale:
    case NodeKind::Tanh:
    case NodeKind::SoftcapFused:
    case NodeKind::SoftcapReference:
    case NodeKind::SoftcapCanon: return 8.0 * t * V;  // read + write every logit
  }
  return 0;
}

double step_bytes(const std::vector<Node>& nodes, const Step& step, const HeadSpec& spec, const WeightView& w,
                  int t) {
  double bytes = 0;
  for (size_t i = step.first; i < step.first + step.count; ++i) bytes += node_bytes(nodes[i], spec, w, t);
  // each seam inside the step is one tensor written and read back that the fused kernel keeps in registers
  for (size_t i = step.first; i + 1 < step.first + step.count; ++i)
    bytes -= 8.0 * t * (double)(is_matvec(nodes[i + 1].kind) || is_norm(nodes[i].kind) || nodes[i].kind == NodeKind::MulGamma
                                    ? spec.hidden
                                    : spec.vocab);
  return bytes;
}

}  // namespace muser
