// The canonical matvec instantiated for Q6_K weights (kernel and decoder: matvec.cuh).
// One file per weight type so the 7 token tiles of each compile in parallel.
#include "matvec.cuh"

namespace muser::cuda {

void matvec_canon_q6_k(const MatvecArgs& a, cudaStream_t stream) { launch_matvec_tiles<DecodeQ6K>(a, stream); }

}  // namespace muser::cuda
