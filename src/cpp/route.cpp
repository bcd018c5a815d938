#include "route.h"

#include "errors.h"

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
    case NodeKind::AddBeta: return "add";
    case NodeKind::MatvecReference: return "mul_mv_reference";
    case NodeKind::Matvec: return "mul_mv";
    case NodeKind::AddBias: return "add_bias";
    case NodeKind::Scale: return "scale";
    case NodeKind::Tanh: return "tanh";
    case NodeKind::SoftcapFused: return "scale_softcap";
    case NodeKind::SoftcapReference: return "softcap_reference";
    case NodeKind::SoftcapCanon: return "scale_softcap_canonical";
  }
  return "?";
}

std::vector<Node> build_route(Route route, const HeadSpec& s) {
  std::vector<Node> nodes;
  const bool canon = route == Route::Canonical;
  if (s.norm == NormKind::Rms)
    nodes.push_back({canon ? NodeKind::RmsNormCanon : NodeKind::RmsNorm, labels::kFinalNorm, s.eps});
  else
    nodes.push_back({canon ? NodeKind::LayerNormCanon : NodeKind::LayerNorm, labels::kFinalNorm, s.eps});
  nodes.push_back({NodeKind::MulGamma, labels::kFinalNormGamma});
  if (!s.norm_bias.empty()) nodes.push_back({NodeKind::AddBeta, labels::kFinalNormBeta});
  nodes.push_back({route == Route::Reference ? NodeKind::MatvecReference : NodeKind::Matvec, labels::kLmHead});
  if (!s.output_bias.empty()) nodes.push_back({NodeKind::AddBias, labels::kOutputBias});

  const bool has_scale = s.scale_mode != ScaleMode::None;
  const float scale = s.applied_scale();
  const bool has_cap = s.softcap > 0.0f;
  switch (route) {
    case Route::Reference:
      if (has_scale) nodes.push_back({NodeKind::Scale, labels::kLogitScale, scale});
      if (has_cap) nodes.push_back({NodeKind::SoftcapReference, labels::kSoftcap, 0, s.softcap, s.inv_softcap()});
      break;
    case Route::Graph:
      if (has_scale) nodes.push_back({NodeKind::Scale, labels::kLogitScale, scale});
      if (has_cap) {
        nodes.push_back({NodeKind::Scale, labels::kSoftcapIn, s.inv_softcap()});
        nodes.push_back({NodeKind::Tanh, labels::kSoftcapTanh});
        nodes.push_back({NodeKind::Scale, labels::kSoftcapOut, s.softcap});
      }
      break;
    case Route::Fused:
      if (has_cap)
        nodes.push_back({NodeKind::SoftcapFused, labels::kSoftcap, scale, s.softcap});
      else if (has_scale)
        nodes.push_back({NodeKind::Scale, labels::kLogitScale, scale});
      break;
    case Route::Canonical:
      if (has_cap)
        nodes.push_back({NodeKind::SoftcapCanon, labels::kSoftcap, scale, s.softcap, s.inv_softcap()});
      else if (has_scale)
        nodes.push_back({NodeKind::Scale, labels::kLogitScale, scale});
      break;
  }
  return nodes;
}

}  // namespace muser
