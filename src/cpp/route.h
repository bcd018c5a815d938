// A route is a fixed list of labelled nodes, exactly as the chapter draws it.
// Backends own one pipeline per node kind and put a barrier between nodes;
// the profiler books time by label, so the LM head's time can never appear
// under the soft cap's name (the chapter's instrumentation lesson, §20.8).
#pragma once
#include <string>
#include <vector>

#include "head_spec.h"
#include "muser/kernel_args.h"

namespace muser {

enum class Route { Reference, Fused, Graph, Canonical };
// Activations fed to the matvec: exact f32, or int8 blocks as ggml's CPU quantizes them.
enum class Acts { F32, Q8 };

// Every kind is exactly one computation: a backend runs the node it is given
// and decides nothing (the route chose the activation mode and the order).
// A backend's switch over NodeKind has no default, and the project builds
// with -Werror=switch: a kind a backend forgets does not compile.
enum class NodeKind {
  RmsNorm,           // y = x / sqrt(mean(x^2) + eps), ggml order            f0 = eps
  RmsNormCanon,      // the same, canonical order                              f0 = eps
  LayerNorm,         // y = (x - mean) / sqrt(var + eps), ggml order           f0 = eps
  LayerNormCanon,    // the same, canonical order                              f0 = eps
  MulGamma,          // y *= gamma
  MatvecReference,   // logits = W y: dequantized row, one f32 sum in index order (the oracle)
  MatvecCanon,       // logits = W y: f32 activations, canonical lane order
  MatvecQ8,          // y quantized as ggml's CPU does (Q8_K / Q8_0), exact integer block sums, f32 chain
  MatvecQ8Reference, // the same definition, computed by the scalar twin (the q8 oracle)
  Scale,             // logits *= f0
  Tanh,              // logits = tanhf(logits)
  SoftcapFused,      // v = l*f0; f1 * tanhf(v / f1)
  SoftcapReference,  // l = f1 * tanhf(l * f2)   (after a separate Scale node)
  SoftcapCanon,      // v = l*f0; f1 * canon_tanh(v * f2)
};

struct Node {
  NodeKind kind;
  std::string label;
  float f0 = 0, f1 = 0, f2 = 0;
  // The route allows this node and the next to run as one kernel (a backend
  // may fuse them, or not): only where the fused kernel computes exactly the
  // two nodes' bytes. The graph route never sets it on its cap nodes.
  bool fuses_with_next = false;
};

bool is_matvec(NodeKind k);
// An element-wise epilogue node's scalar arguments over `count` logits, as
// every backend's kernel reads them (muser/kernel_args.h).
EpilogueKargs epilogue_kargs(const Node& n, int64_t count);
bool is_norm(NodeKind k);

Route parse_route(const std::string& name);  // throws ArgValueError
const char* route_name(Route r);
Acts parse_acts(const std::string& name);
const char* acts_name(Acts a);
const char* node_kind_name(NodeKind k);

// The route's nodes for this spec and activation mode (acts="q8" picks the q8
// matvec kinds; float weights have none: ArgValueError).
std::vector<Node> build_route(Route route, const HeadSpec& spec, Acts acts);

// Adjacent nodes a backend runs as one kernel: [first, first + count).
struct Step {
  size_t first = 0;
  size_t count = 1;
};
// The route's nodes grouped into steps: when `fuse`, adjacent nodes the route
// allows to fuse (Node::fuses_with_next) and the backend has a kernel for
// (`fusable(a, b)`) become one step; else every node is its own step.
std::vector<Step> plan_steps(const std::vector<Node>& nodes, bool fuse, bool (*fusable)(NodeKind, NodeKind));
// "lm_head+softcap": the labels of a step's nodes, joined by '+'.
std::string step_label(const std::vector<Node>& nodes, const Step& step);

// Labels, one per node role (public: profile() reports them).
namespace labels {
constexpr const char* kFinalNorm = "final_norm";
constexpr const char* kFinalNormGamma = "final_norm_gamma";
constexpr const char* kLmHead = "lm_head";
constexpr const char* kLogitScale = "logit_scale";
constexpr const char* kSoftcapIn = "softcap_scale_in";
constexpr const char* kSoftcapTanh = "softcap_tanh";
constexpr const char* kSoftcapOut = "softcap_scale_out";
constexpr const char* kSoftcap = "softcap";
}  // namespace labels

}  // namespace muser
