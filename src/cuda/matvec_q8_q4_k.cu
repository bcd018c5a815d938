// The q8 matvec instantiated for Q4_K weights (kernel and decoder: matvec_q8.cuh).
// One file per weight type so the 4 token tiles of each compile in parallel.
#include "matvec_q8.cuh"

namespace muser::cuda {

void matvec_q8_q4_k(const Q8Args& a, cudaStream_t stream) { launch_matvec_q8_tiles<Q8DecQ4K>(a, stream); }

}  // namespace muser::cuda
