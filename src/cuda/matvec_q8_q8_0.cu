// The q8 matvec instantiated for Q8_0 weights (kernel and decoder: matvec_q8.cuh).
// One file per weight type so the 4 token tiles of each compile in parallel.
#include "matvec_q8.cuh"

namespace muser::cuda {

void matvec_q8_q8_0(const Q8Args& a, cudaStream_t stream) { launch_matvec_q8_tiles<Q8DecQ80>(a, stream); }

}  // namespace muser::cuda
