// Programmatic dependent launch (Hopper, sm_90): the route's kernels are
// launched with launch_pdl, so each may be scheduled while its predecessor
// still runs, instead of after it has drained and the next launch has been
// processed (a few microseconds per node, 10 % of a q8 route at t = 1).
//
// The contract every kernel launched this way keeps:
//   pdl_launch_dependents()  first: lets the next kernel's CTAs be scheduled;
//   pdl_wait()               in every CTA before its first read or write of
//                            a buffer an earlier node writes or reads -- it
//                            returns once the previous kernel has completed
//                            and its memory is visible. Every CTA waits, so a
//                            kernel's completion still implies its
//                            predecessor's: the chain stays transitive.
// Work that touches only what no node writes (the weight) may come before
// pdl_wait: the matvecs start their weight stream there.
//
// On older GPUs (and with MUSER_PDL=0, for measuring) launches are plain and
// both calls compile to nothing or return at once.
#pragma once
#include <cuda_runtime.h>

#include <utility>

#include "cuda_check.h"
#include "kernels.h"

namespace muser::cuda {

__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Whether launches on the current device use programmatic serialization.
bool pdl_enabled();

// Whether a consumer kernel of `ctas` CTAs is launched with PDL (kernels.h, kShortGridCtas).
inline bool consumer_pdl(long long ctas) { return ctas <= kShortGridCtas; }

// The launch configuration of a route kernel (attr: storage for its one attribute).
inline cudaLaunchConfig_t pdl_config(dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                                     cudaLaunchAttribute (&attr)[1], bool pdl = true) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl && pdl_enabled() ? 1 : 0;
  return cfg;
}

// A kernel on `stream`, with programmatic serialization when `pdl` (and pdl_enabled()).
template <class... Params, class... Args>
void launch_kernel(bool pdl, void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                   const char* what, Args&&... args) {
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = pdl_config(grid, block, smem, stream, attr, pdl);
  check(cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...), what);
}

template <class... Params, class... Args>
void launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream, const char* what,
                Args&&... args) {
  launch_kernel(true, kernel, grid, block, smem, stream, what, std::forward<Args>(args)...);
}

// A consumer kernel: with PDL where consumer_pdl says so.
template <class... Params, class... Args>
void launch_consumer(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem, cudaStream_t stream,
                     const char* what, Args&&... args) {
  launch_kernel(consumer_pdl((long long)grid.x * grid.y * grid.z), kernel, grid, block, smem, stream, what,
                std::forward<Args>(args)...);
}

// The same for a kernel chosen at run time (params: pointers to its arguments).
inline void launch_pdl(const void* kernel, dim3 grid, dim3 block, size_t smem, cudaStream_t stream, const char* what,
                       void** params) {
  cudaLaunchAttribute attr[1];
  const cudaLaunchConfig_t cfg = pdl_config(grid, block, smem, stream, attr);
  check(cudaLaunchKernelExC(&cfg, kernel, params), what);
}

}  // namespace muser::cuda
