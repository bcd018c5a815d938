// A route is a fixed list of labelled nodes, exactly as the chapter draws it.
// Backends own one pipeline per node kind and put a barrier between nodes;
// the profiler books time by label, so the LM head's time can never appear
// under the soft cap's name (the chapter's instrumentation lesson, §20.8).
#pragma once
#include <string>
#include <vector>

#include "head_spec.h"

namespace muser {

enum class Route { Reference, Fused, Graph, Canonical };
// Activations fed to the matvec: exact f32, or int8 blocks as ggml's CPU quantizes them.
enum class Acts { F32, Q8 };

enum class NodeKind {
  RmsNorm,          // y = x / sqrt(mean(x^2) + eps), ggml order
  RmsNormCanon,     // canonical order
  LayerNorm,        // y = (x - mean) / sqrt(var + eps), ggml order
  LayerNormCanon,
  MulGamma,         // y *= gamma
  AddBeta,          // y += beta
  MatvecReference,  // logits = W normed, scalar index-order oracle
  Matvec,           // logits = W normed, canonical lane order
  AddBias,          // logits += bias
  Scale,            // logits *= f0
  Tanh,             // logits = tanhf(logits)
  SoftcapFused,     // v = l*f0; f1 * tanhf(v / f1)
  SoftcapReference, // l = f1 * tanhf(l * f2)   (after a separate Scale node)
  SoftcapCanon,     // v = l*f0; f1 * canon_tanh(v * f2)
};

struct Node {
  NodeKind kind;
  std::string label;
  float f0 = 0, f1 = 0, f2 = 0;
  bool on_logits() const { return kind >= NodeKind::MatvecReference; }
};

Route parse_route(const std::string& name);  // throws ArgValueError
const char* route_name(Route r);
Acts parse_acts(const std::string& name);
const char* acts_name(Acts a);
const char* node_kind_name(NodeKind k);

std::vector<Node> build_route(Route route, const HeadSpec& spec);

// Labels, one per node role (public: profile() reports them).
namespace labels {
constexpr const char* kFinalNorm = "final_norm";
constexpr const char* kFinalNormGamma = "final_norm_gamma";
constexpr const char* kFinalNormBeta = "final_norm_beta";
constexpr const char* kLmHead = "lm_head";
constexpr const char* kOutputBias = "lm_head_bias";
constexpr const char* kLogitScale = "logit_scale";
constexpr const char* kSoftcapIn = "softcap_scale_in";
constexpr const char* kSoftcapTanh = "softcap_tanh";
constexpr const char* kSoftcapOut = "softcap_scale_out";
constexpr const char* kSoftcap = "softcap";
}  // namespace labels

}  // namespace muser
