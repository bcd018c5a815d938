// HeadSpec: everything the head needs to know about a model, read from GGUF
// metadata by per-architecture rules (docs/architectures.md), never
// hard-coded per model. Overrides let a user switch each step.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace muser {

class GGUFFile;

enum class NormKind { Rms, Layer };
// How the architecture applies its logit scale: not at all, logits * s, or
// logits * (1/s) with the reciprocal rounded to f32 (granite).
enum class ScaleMode { None, Multiply, Divide };

struct HeadSpec {
  std::string arch;
  int64_t hidden = 0;  // H: length of a hidden state
  int64_t vocab = 0;   // V: rows of the output weight
  NormKind norm = NormKind::Rms;
  float eps = 1e-5f;
  std::string eps_source;      // metadata key, "override" or "default"
  std::string norm_weight;     // tensor name of gamma
  std::string output_weight;   // "output.weight", or the tied "token_embd.weight"
  bool tied = false;
  uint32_t output_type = 0;    // ggml type id of the output weight
  ScaleMode scale_mode = ScaleMode::None;
  float logit_scale = 1.0f;    // as stored in metadata (or overridden)
  std::string logit_scale_source;
  float softcap = 0.0f;        // final logit soft cap; 0 = none
  std::string softcap_source;  // key, "default (llama.cpp)", "override", or "none"

  // The factor every logit is multiplied by (1 when there is no scale).
  float applied_scale() const;
  // 1/softcap rounded to f32 once (0 when there is no cap).
  float inv_softcap() const;
};

// Keyword overrides from Head.load(**overrides). An engaged optional wins
// over metadata; `*_disable` turns a step off (softcap=None, logit_scale=None).
struct SpecOverrides {
  std::optional<double> softcap;
  bool softcap_disable = false;
  std::optional<double> logit_scale;
  bool logit_scale_disable = false;
  std::optional<double> eps;
  std::optional<std::string> output_weight;
  std::optional<std::string> arch;  // treat the file as this architecture
};

// Reads and validates the spec; throws SpecError naming the key or tensor.
HeadSpec read_head_spec(const GGUFFile& file, const SpecOverrides& overrides = {});

// Architectures with a rule, for messages and docs.
std::vector<std::string> supported_architectures();

const char* norm_kind_name(NormKind k);
const char* scale_mode_name(ScaleMode m);

}  // namespace muser
