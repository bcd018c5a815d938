// The canonical matvec instantiated for F16, BF16 and F32 weights (kernel and
// decoder: matvec.cuh); any row length, the last unit guarded per lane.
#include "cuda_check.h"
#include "matvec.cuh"

namespace muser::cuda {

void matvec_canon_float(const MatvecArgs& a, cudaStream_t stream) {
  switch (a.type) {
    case (uint32_t)GgmlType::F16: launch_matvec_tiles<DecodeFloat<(uint32_t)GgmlType::F16>>(a, stream); break;
    case (uint32_t)GgmlType::BF16: launch_matvec_tiles<DecodeFloat<(uint32_t)GgmlType::BF16>>(a, stream); break;
    case (uint32_t)GgmlType::F32: launch_matvec_tiles<DecodeFloat<(uint32_t)GgmlType::F32>>(a, stream); break;
    default: throw DeviceError("matvec_canon_float: not a float weight type");
  }
}

}  // namespace muser::cuda
