// Each area of the engine binds itself in its own file; module.cpp calls them.
#pragma once
#include <nanobind/nanobind.h>

#include <cstdint>
#include <cstring>
#include <memory>
#include <vector>

namespace muser {
struct NodeTiming;
struct DeviceCaps;
}

namespace muser::py {
// A profile as Python dicts (label, kind, seconds, bytes), one per node.
nanobind::list profile_list(const std::vector<NodeTiming>& timings);
// A device's caps as a Python dict (bind_device.cpp).
nanobind::dict caps_dict(const DeviceCaps& caps);

// Quantized blocks hold 2-byte fields, so the kernels need them at even (GGUF
// files: 8-byte aligned) addresses. Caller bytes at a less aligned address
// (a numpy slice at an odd offset) are copied once into `copy`; aligned bytes
// are used in place.
constexpr uintptr_t kBlockAlignment = 8;
inline const uint8_t* aligned_blocks(const uint8_t* p, size_t n, std::unique_ptr<uint8_t[]>& copy) {
  if (reinterpret_cast<uintptr_t>(p) % kBlockAlignment == 0) return p;
  copy.reset(new uint8_t[n ? n : 1]);  // new[] of uint8_t: aligned to max_align_t (16)
  std::memcpy(copy.get(), p, n);
  return copy.get();
}

// NonFiniteError naming the row and column of element `index` of a [t x H]
// hidden state (bind_head.cpp); check_finite_rows scans host rows for one.
[[noreturn]] void throw_nonfinite(int64_t index, int64_t H, float value);
void check_finite_rows(const float* x, int64_t rows, int64_t H);

void bind_errors(nanobind::module_& m);
void bind_gguf(nanobind::module_& m);   // bind_gguf.cpp: muser.GGUFFile
void bind_quant(nanobind::module_& m);  // bind_quant.cpp: quantize / dequantize
void bind_head(nanobind::module_& m);   // bind_head.cpp: the Head engine
void bind_build_info(nanobind::module_& m);
void bind_cpu(nanobind::module_& m);    // bind_cpu.cpp: read bandwidth, q8 kernels per ISA
void bind_device(nanobind::module_& m);  // bind_device.cpp: resident logits, top-k on the device (Device abilities)
void bind_metal(nanobind::module_& m);   // bind_metal.cpp: the Metal backend's test hooks
void bind_cuda(nanobind::module_& m);    // bind_cuda.cpp: the CUDA backend helpers (count, bandwidth, memory)
void bind_sample(nanobind::module_& m);  // bind_sample.cpp: seeded sampling, the Philox generator
void bind_shard(nanobind::module_& m);   // bind_shard.cpp: the exact pieces of cross-shard reductions
}  // namespace muser::py
