// The epilogue nodes over the logits, in place, four logits per thread and
// step (grid-stride): scale, tanh, the fused soft cap (divides by cap), the
// reference soft cap (after its own scale node) and the canonical soft cap
// (canon_epilogue from canonical.h, the same function the CPU runs, bit for
// bit). The operations themselves are epilogue.cuh's.
#include "cuda_check.h"
#include "epilogue.cuh"
#include "kernels.h"
#include "pdl.cuh"

namespace muser::cuda {

namespace {

using Op = EpilogueOp;

// Four logits per thread and step (16-byte accesses), then the n % 4 tail.
template <Op kOp>
__global__ void epilogue_kernel(float* y, EpilogueKargs k) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t stride = (int64_t)gridDim.x * blockDim.x, first = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  float4* y4 = reinterpret_cast<float4*>(y);  // the logits buffer is a cudaMalloc allocation: 16-byte aligned
  const int64_t n = k.n, n4 = n / 4;
  const float f0 = k.scale, f1 = k.cap, f2 = k.inv_cap;
  for (int64_t i = first; i < n4; i += stride) {
    float4 v = y4[i];
    v.x = epilogue_op<kOp>(v.x, f0, f1, f2);
    v.y = epilogue_op<kOp>(v.y, f0, f1, f2);
    v.z = epilogue_op<kOp>(v.z, f0, f1, f2);
    v.w = epilogue_op<kOp>(v.w, f0, f1, f2);
    y4[i] = v;
  }
  for (int64_t i = 4 * n4 + first; i < n; i += stride) y[i] = epilogue_op<kOp>(y[i], f0, f1, f2);
}

template <Op kOp>
void launch_epilogue(float* y, int64_t n, float scale, float cap, float inv_cap, cudaStream_t stream) {
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((n / 4 + threads - 1) / threads, 4096);
  EpilogueKargs k;
  k.n = n, k.scale = scale, k.cap = cap, k.inv_cap = inv_cap;
  if (n > 0)
    launch_pdl(epilogue_kernel<kOp>, dim3((unsigned)std::max<int64_t>(blocks, 1)), dim3(threads), 0, stream,
               "epilogue", y, k);
}

}  // namespace

void epilogue(const EpilogueFold& f, float* y, int64_t n, cudaStream_t stream) {
  switch (f.op) {
    case Op::Scale: launch_epilogue<Op::Scale>(y, n, f.f0, f.f1, f.f2, stream); break;
    case Op::Tanh: launch_epilogue<Op::Tanh>(y, n, f.f0, f.f1, f.f2, stream); break;
    case Op::SoftcapFused: launch_epilogue<Op::SoftcapFused>(y, n, f.f0, f.f1, f.f2, stream); break;
    case Op::SoftcapReference: launch_epilogue<Op::SoftcapReference>(y, n, f.f0, f.f1, f.f2, stream); break;
    case Op::SoftcapCanon: launch_epilogue<Op::SoftcapCanon>(y, n, f.f0, f.f1, f.f2, stream); break;
    case Op::None: return;
  }
  check_launch("epilogue");
}

}  // namespace muser::cuda
