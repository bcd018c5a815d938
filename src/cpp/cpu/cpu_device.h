// The CPU device's step runner, shared by the device and by muser.ops (which
// runs a route's own nodes over caller arrays, so the parity tests exercise
// exactly what build_route emits).
#pragma once
#include <vector>

#include "cpu/kernels.h"
#include "device.h"

namespace muser::cpu {

// Where a route's nodes read and write: the nodes before the matvec read
// `hidden` [t x H] and write `normed` [t x H]; the matvec reads `normed` and
// writes `logits` [t x V]; the nodes after it work on `logits` in place.
struct StepBuffers {
  const float* hidden = nullptr;
  float* normed = nullptr;
  float* logits = nullptr;
  ActsQ8* acts_q8 = nullptr;  // scratch for the q8 matvec kinds
};

// Runs the steps (each one kernel: a node, or the nodes the CPU fuses) in
// order on `threads` threads; one timing per step when timings is non-null.
void run_steps(const std::vector<Node>& nodes, const std::vector<Step>& steps, const HeadSpec& spec,
               const HeadWeights& w, int threads, int t, const StepBuffers& b, std::vector<NodeTiming>* timings);

// The matvec node `kind` for rows [r0, r1) of w into y[tok * ldy + r] (b: its
// activations, b.acts_q8 already quantized for the q8 kinds).
void matvec_rows(NodeKind kind, const WeightView& w, const StepBuffers& b, int t, int64_t r0, int64_t r1, float* y,
                 int64_t ldy);

// The CPU's fused kernels: norm + γ, and a matvec with its element-wise epilogue.
bool cpu_fusable(NodeKind a, NodeKind b);

}  // namespace muser::cpu
