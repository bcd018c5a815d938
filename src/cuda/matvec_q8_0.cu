// The canonical matvec instantiated for Q8_0 weights (kernel and decoder: matvec.cuh).
// One file per weight type so the 7 token tiles of each compile in parallel.
#include "matvec.cuh"

namespace muser::cuda {

void matvec_canon_q8_0(const MatvecArgs& a, cudaStream_t stream) { launch_matvec_tiles<DecodeQ80>(a, stream); }

}  // namespace muser::cuda
