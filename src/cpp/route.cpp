#include "route.h"

#include "errors.h"
#include "quant_types.h"

namespace muser {

Route parse_route(const std::string& n) {
  if (n == "reference") return Route::Reference;
  if (n == "fused") return Route::Fused;
  if (n == "graph") return Route::Graph;
  if (n == "canonical") return Route::Canonical;
  throw ArgValueError("route must be one of 'reference', 'fused', 'graph', 'canonical', 'pinned'; got '" + n + "'");
}

const char* route_name(Route r) {
  switch (r) {
    case Route::Reference: return "reference";
    case Route::Fused: return "fused";
    case Route::Graph: return "graph";
    case Route::Canonical: return "canonical";
  }
  return "?";
}

Acts parse_acts(const std::string& n) {
  if (n == "f32") return Acts::F32;
  if (n == "q8") return Acts::Q8;
  throw ArgValueError("acts must be 'f32' or 'q8'; got '" + n + "'");
}
const char* acts_name(Acts a) { return a == Acts::F32 ? "f32" : "q8"; }

const char* node_kind_name(NodeKind k) {
  switch (k) {
    case NodeKind::RmsNorm: return "rms_norm";
    case NodeKind::RmsNormCanon: return "rms_norm_canonical";
    case NodeKind::LayerNorm: return "layer_norm";
    case NodeKind::LayerNormCanon: return "layer_norm_canonical";
    case NodeKind::MulGamma: return "mul";
    case NodeKind::MatvecReference: return "mul_mv_reference";
    case NodeKind::MatvecCanon: return "mul_mv";
    case NodeKind::MatvecQ8: return "mul_mv_q8";
    case NodeKind::MatvecQ8Reference: return "mul_mv_q8_reference";
    case NodeKind::Scale: return "scale";
    case NodeKind::Tanh: return "tanh";
    case NodeKind::SoftcapFused: return "scale_softcap";
    case NodeKind::SoftcapReference: return "softcap_reference";
    case NodeKind::SoftcapCanon: return "scale_softcap_canonical";
  }
  return "?";
}

bool is_matvec(NodeKind k) {
  switch (k) {
    case NodeKind::MatvecReference:
    case NodeKind::MatvecCanon:
    case NodeKind::MatvecQ8:
    case NodeKind::MatvecQ8Reference: return true;
    case NodeKind::RmsNorm:
    case NodeKind::RmsNormCanon:
    case NodeKind::LayerNorm:
    case NodeKind::LayerNormCanon:
    case NodeKind::MulGamma:
    case NodeKind::Scale:
    case NodeKind::Tanh:
    case NodeKind::SoftcapFused:
    case NodeKind::SoftcapReference:
    case NodeKind::SoftcapCanon: return false;
  }
  return false;
}

EpilogueKargs epilogue_kargs(const Node& n, int64_t count) {
  EpilogueKargs e;
  e.n = count;
  switch (n.kind) {
    case NodeKind::Scale: e.scale = n.f0; break;
    case NodeKind::SoftcapFused: e.scale = n.f0, e.cap = n.f1; break;
    case NodeKind::SoftcapReference: e.cap = n.f1, e.inv_cap = n.f2; break;
    case NodeKind::SoftcapCanon: e.scale = n.f0, e.cap = n.f1, e.inv_cap = n.f2; break;
    case NodeKind::Tanh:
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
  return e;
}

bool is_norm(NodeKind k) {
  return k == NodeKind::RmsNorm || k == NodeKind::RmsNormCanon || k == NodeKind::LayerNorm ||
         k == NodeKind::LayerNormCanon;
}

std::vector<Node> build_route(Route route, const HeadSpec& s, Acts acts) {
  if (acts == Acts::Q8 && !is_q8_type(s.output_type))
    throw ArgValueError("acts='q8' quantizes the activations to int8 as ggml's CPU does for " + q8_type_list() +
                        " weights; " + s.output_weight + " is " + type_traits(s.output_type).name +
                        " (ggml multiplies float weights with float activations): use acts='f32'");
  std::vector<Node> nodes;
  const bool canon = route == Route::Canonical;
  // the reference route is the oracle: one node, one kernel, nothing fused
  const bool may_fuse = route != Route::Reference;
  if (s.norm == NormKind::Rms)
    nodes.push_back({canon ? NodeKind::RmsNormCanon : NodeKind::RmsNorm, labels::kFinalNorm, s.eps});
  else
    nodes.push_back({canon ? NodeKind::LayerNormCanon : NodeKind::LayerNorm, labels::kFinalNorm, s.eps});
  // γ is one multiply per element after the norm's own rounding: the same bytes in one pass
  nodes.back().fuses_with_next = may_fuse;
  nodes.push_back({NodeKind::MulGamma, labels::kFinalNormGamma});
  const bool reference = route == Route::Reference;
  const NodeKind mv = acts == Acts::Q8 ? (reference ? NodeKind::MatvecQ8Reference : NodeKind::MatvecQ8)
                                       : (reference ? NodeKind::MatvecReference : NodeKind::MatvecCanon);
  nodes.push_back({mv, labels::kLmHead});

  const bool has_scale = s.scale_mode != ScaleMode::None;
  const float scale = s.applied_scale();
  const bool has_cap = s.softcap > 0.0f;
  switch (route) {
    case Route::Reference:
      if (has_scale) nodes.push_back({NodeKind::Scale, labels::kLogitScale, scale});
      if (has_cap) nodes.push_back({NodeKind::SoftcapReference, labels::kSoftcap, 0, s.softcap, s.inv_softcap()});
      break;
    case Route::Graph:
      // ggml's own nodes, each its own kernel: that separation is the route's promise
      if (has_scale) nodes.push_back({NodeKind::Scale, labels::kLogitScale, scale});
      if (has_cap) {
        nodes.push_back({NodeKind::Scale, labels::kSoftcapIn, s.inv_softcap()});
        nodes.push_back({NodeKind::Tanh, labels::kSoftcapTanh});
        nodes.push_back({NodeKind::Scale, labels::kSoftcapOut, s.softcap});
      }
      break;
    case Route::Fused:
    case Route::Canonical: {
      // one element-wise epilogue, applied to each logit once the matvec wrote
      // it: fusing it into the matvec's store changes no byte
      const NodeKind cap_kind = canon ? NodeKind::SoftcapCanon : NodeKind::SoftcapFused;
      if (has_cap)
        nodes.push_back({cap_kind, labels::kSoftcap, scale, s.softcap, canon ? s.inv_softcap() : 0.0f});
      else if (has_scale)
        nodes.push_back({NodeKind::Scale, labels::kLogitScale, scale});
      if (has_cap || has_scale) nodes[nodes.size() - 2].fuses_with_next = true;
      break;
    }
  }
  return nodes;
}

std::vector<Step> plan_steps(const std::vector<Node>& nodes, bool fuse, bool (*fusable)(NodeKind, NodeKind)) {
  std::vector<Step> steps;
  for (size_t i = 0; i < nodes.size(); ++i) {
    if (fuse && !steps.empty() && nodes[i - 1].fuses_with_next && fusable(nodes[i - 1].kind, nodes[i].kind))
      ++steps.back().count;
    else
      steps.push_back({i, 1});
  }
  return steps;
}

std::string step_label(const std::vector<Node>& nodes, const Step& step) {
  std::string label;
  for (size_t i = step.first; i < step.first + step.count; ++i) label += (label.empty() ? "" : "+") + nodes[i].label;
  return label;
}

}  // namespace muser
