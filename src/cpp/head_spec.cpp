#include "head_spec.h"

#include <cmath>
#include <cstdio>
#include <limits>
#include <functional>
#include <map>

#include "errors.h"
#include "gguf.h"
#include "quant_types.h"

namespace muser {

float HeadSpec::applied_scale() const {
  switch (scale_mode) {
    case ScaleMode::None: return 1.0f;
    case ScaleMode::Multiply: return logit_scale;
    case ScaleMode::Divide: return 1.0f / logit_scale;
  }
  return 1.0f;
}

float HeadSpec::inv_softcap() const { return softcap > 0.0f ? 1.0f / softcap : 0.0f; }

const char* norm_kind_name(NormKind k) { return k == NormKind::Rms ? "rms" : "layer"; }
const char* scale_mode_name(ScaleMode m) {
  switch (m) {
    case ScaleMode::None: return "none";
    case ScaleMode::Multiply: return "multiply";
    case ScaleMode::Divide: return "divide";
  }
  return "?";
}

namespace {

// One architecture's conventions, each taken from llama.cpp (file named in
// docs/architectures.md).
struct ArchRule {
  NormKind norm;
  const char* eps_suffix;          // after "{arch}."
  bool always_tied;                // head is token_embd.weight even if output.weight exists
  ScaleMode scale_mode;
  bool scale_required;             // fail closed when the scale key is absent
  bool scale_zero_means_none;      // command-r, granite: scale only when non-zero
  float scale_default;             // used when the key is absent; 0 = no scale
  bool has_softcap;
  float softcap_default;           // used when the key is absent; 0 = none
};

const std::map<std::string, ArchRule>& rules() {
  static const std::map<std::string, ArchRule> r = {
      {"muse-glimmer", {NormKind::Rms, "attention.layer_norm_rms_epsilon", false, ScaleMode::Multiply, true, false, 0.0f, true, 30.0f}},
      {"gemma2", {NormKind::Rms, "attention.layer_norm_rms_epsilon", true, ScaleMode::None, false, false, 0.0f, true, 30.0f}},
      {"gemma3", {NormKind::Rms, "attention.layer_norm_rms_epsilon", true, ScaleMode::None, false, false, 0.0f, false, 0.0f}},
      {"llama", {NormKind::Rms, "attention.layer_norm_rms_epsilon", false, ScaleMode::None, false, false, 0.0f, false, 0.0f}},
      {"qwen2", {NormKind::Rms, "attention.layer_norm_rms_epsilon", false, ScaleMode::None, false, false, 0.0f, false, 0.0f}},
      {"qwen3", {NormKind::Rms, "attention.layer_norm_rms_epsilon", false, ScaleMode::None, false, false, 0.0f, false, 0.0f}},
      {"command-r", {NormKind::Layer, "attention.layer_norm_epsilon", true, ScaleMode::Multiply, false, true, 0.0f, false, 0.0f}},
      {"cohere2", {NormKind::Layer, "attention.layer_norm_epsilon", true, ScaleMode::Multiply, false, true, 0.0f, false, 0.0f}},
      {"granite", {NormKind::Rms, "attention.layer_norm_rms_epsilon", false, ScaleMode::Divide, false, true, 0.0f, false, 0.0f}},
      {"grok", {NormKind::Rms, "attention.layer_norm_rms_epsilon", false, ScaleMode::Multiply, false, false, 0.5773502691896257f, true, 0.0f}},
  };
  return r;
}

[[noreturn]] void fail(const GGUFFile& f, const std::string& what) {
  throw SpecError(f.path() + ": " + what);
}

double number_key(const GGUFFile& f, const std::string& key) {
  const GGUFKV* kv = f.find(key);
  if (!kv->is_number())
    fail(f, "metadata key '" + key + "' must be a number (got a non-numeric value)");
  return kv->as_double();
}

std::string number_text(double v) {
  char buf[40];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

// A metadata or override value the head computes with in float32: finite,
// not negative (zero only where it means "off"), and representable: a value
// beyond float32's range would turn into inf (NaN or saturated logits), a
// non-zero one below it into 0 (an infinite granite divisor).
float checked_float(const GGUFFile& f, const std::string& what, double v, bool allow_zero) {
  if (!std::isfinite(v)) fail(f, what + " must be finite (got " + number_text(v) + ")");
  if (v < 0 || (!allow_zero && v == 0))
    fail(f, what + " must be " + (allow_zero ? "non-negative" : "positive") + " (got " + number_text(v) + ")");
  if (v > (double)std::numeric_limits<float>::max())
    fail(f, what + " is " + number_text(v) + ", beyond float32's range (largest " +
                number_text((double)std::numeric_limits<float>::max()) + ")");
  if (v != 0 && v < (double)std::numeric_limits<float>::min())
    fail(f, what + " is " + number_text(v) + ", below float32's normal range (smallest " +
                number_text((double)std::numeric_limits<float>::min()) + ")");
  return (float)v;
}

const GGUFTensorInfo& need_tensor(const GGUFFile& f, const std::string& name, const std::string& role) {
  const GGUFTensorInfo* t = f.find_tensor(name);
  if (!t) fail(f, "missing tensor '" + name + "' (" + role + ")");
  return *t;
}

void check_vector_tensor(const GGUFFile& f, const GGUFTensorInfo& t, int64_t hidden, const char* role) {
  const uint32_t ty = t.type;
  if (ty != (uint32_t)GgmlType::F32 && ty != (uint32_t)GgmlType::F16 && ty != (uint32_t)GgmlType::BF16)
    fail(f, std::string(role) + " tensor '" + t.name + "' has type " + (type_traits(ty).name ? type_traits(ty).name : "?") +
                ", expected F32, F16 or BF16");
  if (t.nelements() != hidden || t.shape[0] != hidden)
    fail(f, std::string(role) + " tensor '" + t.name + "' has " + std::to_string(t.nelements()) +
                " elements, expected the hidden size " + std::to_string(hidden));
}

}  // namespace

std::vector<std::string> supported_architectures() {
  std::vector<std::string> out;
  for (const auto& kv : rules()) out.push_back(kv.first);
  return out;
}

HeadSpec read_head_spec(const GGUFFile& f, const SpecOverrides& ov) {
  HeadSpec s;
  if (ov.arch) {
    s.arch = *ov.arch;
  } else {
    const GGUFKV* a = f.find("general.architecture");
    if (!a) fail(f, "missing metadata key 'general.architecture'");
    if (a->type != GGUFType::STRING) fail(f, "metadata key 'general.architecture' must be a string");
    s.arch = std::string(a->as_string());
  }
  const auto it = rules().find(s.arch);
  if (it == rules().end()) {
    std::string names;
    for (const auto& n : supported_architectures()) names += (names.empty() ? "" : ", ") + n;
    fail(f, "architecture '" + s.arch + "' has no head rule (supported: " + names + ")");
  }
  const ArchRule& rule = it->second;
  const std::string pre = s.arch + ".";

  // hidden size
  const std::string hkey = pre + "embedding_length";
  if (!f.find(hkey)) fail(f, "missing metadata key '" + hkey + "'");
  const double hd = number_key(f, hkey);
  if (!(hd >= 1 && hd <= (double)(1 << 24)) || hd != std::floor(hd))
    fail(f, "metadata key '" + hkey + "' must be a positive integer (got " + std::to_string(hd) + ")");
  s.hidden = (int64_t)hd;

  // final norm
  s.norm = rule.norm;
  if (ov.eps) {
    s.eps = checked_float(f, "eps override", *ov.eps, true);
    s.eps_source = "override";
  } else {
    const std::string ekey = pre + rule.eps_suffix;
    if (!f.find(ekey)) fail(f, "missing metadata key '" + ekey + "' (final norm epsilon)");
    s.eps = checked_float(f, "metadata key '" + ekey + "'", number_key(f, ekey), true);
    s.eps_source = ekey;
  }
  s.norm_weight = "output_norm.weight";
  check_vector_tensor(f, need_tensor(f, s.norm_weight, "final norm weight"), s.hidden, "final norm weight");
  // None of the architectures with a rule reads output_norm.bias (llama.cpp's
  // build_norm(..., NULL, ...) for all of them), so a file's bias is ignored.

  // output weight: output.weight, else the tied token embedding
  if (ov.output_weight) {
    s.output_weight = *ov.output_weight;
    s.tied = s.output_weight == "token_embd.weight";
  } else if (!rule.always_tied && f.find_tensor("output.weight")) {
    s.output_weight = "output.weight";
  } else {
    s.output_weight = "token_embd.weight";
    s.tied = true;
  }
  const GGUFTensorInfo& w = need_tensor(f, s.output_weight, s.tied ? "tied output weight" : "output weight");
  const TypeTraits tt = type_traits(w.type);
  if (!tt.supported)
    fail(f, "output weight '" + w.name + "' has type " + (tt.name ? tt.name : "?") +
                ", which muser cannot multiply (supported: " + supported_type_list() + ")");
  if (w.shape.size() != 2)
    fail(f, "output weight '" + w.name + "' must be 2-D, got " + std::to_string(w.shape.size()) + " dimensions");
  if (w.shape[0] != s.hidden)
    fail(f, "output weight '" + w.name + "' rows have " + std::to_string(w.shape[0]) + " elements, expected the hidden size " +
                std::to_string(s.hidden));
  s.vocab = w.shape[1];
  s.output_type = w.type;
  // Likewise no rule's graph adds output.bias after the LM head (none has a node for it).

  // logit scale
  s.scale_mode = rule.scale_mode;
  const std::string skey = pre + "logit_scale";
  if (ov.logit_scale_disable) {
    s.scale_mode = ScaleMode::None;
    s.logit_scale_source = "override";
  } else if (ov.logit_scale) {
    if (s.scale_mode == ScaleMode::None) s.scale_mode = ScaleMode::Multiply;
    s.logit_scale = checked_float(f, "logit_scale override", *ov.logit_scale, false);
    s.logit_scale_source = "override";
  } else if (s.scale_mode != ScaleMode::None) {
    if (f.find(skey)) {
      // negative would reverse the token order; zero is "no scale" only where llama.cpp says so
      s.logit_scale = checked_float(f, "metadata key '" + skey + "'", number_key(f, skey), rule.scale_zero_means_none);
      s.logit_scale_source = skey;
      if (rule.scale_zero_means_none && s.logit_scale == 0) s.scale_mode = ScaleMode::None;
    } else if (rule.scale_required) {
      fail(f, "missing metadata key '" + skey + "' (required for " + s.arch + "; muser fails closed)");
    } else if (rule.scale_default != 0.0f) {
      s.logit_scale = rule.scale_default;
      s.logit_scale_source = "default (llama.cpp)";
    } else {
      s.scale_mode = ScaleMode::None;
      s.logit_scale_source = "absent";
    }
  } else {
    s.logit_scale_source = "none";
  }
  if (!std::isfinite(s.applied_scale()) || (s.scale_mode != ScaleMode::None && s.applied_scale() <= 0))
    fail(f, "logit scale from " + s.logit_scale_source + " (" + number_text(s.logit_scale) + ", " +
                scale_mode_name(s.scale_mode) + ") gives the factor " + number_text(s.applied_scale()) +
                ", expected a finite positive float32");

  // final soft cap
  const std::string ckey = pre + "final_logit_softcapping";
  if (ov.softcap_disable) {
    s.softcap = 0.0f;
    s.softcap_source = "override";
  } else if (ov.softcap) {
    s.softcap = checked_float(f, "softcap override", *ov.softcap, true);
    s.softcap_source = "override";
  } else if (rule.has_softcap) {
    if (f.find(ckey)) {
      s.softcap = checked_float(f, "metadata key '" + ckey + "'", number_key(f, ckey), true);
      s.softcap_source = ckey;
    } else {
      s.softcap = rule.softcap_default;
      s.softcap_source = rule.softcap_default > 0 ? "default (llama.cpp)" : "none";
    }
  } else {
    s.softcap_source = "none";
  }
  return s;
}

}  // namespace muser
