// Each area of the engine binds itself in its own file; module.cpp calls them.
#pragma once
#include <nanobind/nanobind.h>

#include <vector>

namespace muser {
struct NodeTiming;
}

namespace muser::py {
// A profile as Python dicts (label, kind, seconds, bytes), one per node.
nanobind::list profile_list(const std::vector<NodeTiming>& timings);

void bind_errors(nanobind::module_& m);
void bind_gguf(nanobind::module_& m);   // bind_gguf.cpp: muser.GGUFFile
void bind_quant(nanobind::module_& m);  // bind_quant.cpp: quantize / dequantize
void bind_head(nanobind::module_& m);   // bind_head.cpp: the Head engine
void bind_build_info(nanobind::module_& m);
void bind_cpu(nanobind::module_& m);    // bind_cpu.cpp: read bandwidth, q8 kernels per ISA
void bind_cuda(nanobind::module_& m);   // bind_cuda.cpp: device logits, top-k on the GPU, CUDA helpers
}  // namespace muser::py
