// Portability macros shared by C++, CUDA and (through plain C subset) Metal.
// Every header in src/cpp/muser/ includes this and nothing heavier, so the
// same code compiles as host C++, as CUDA device code and in CPU tests.
#pragma once

#if defined(__CUDACC__)
#define MUSER_HD __host__ __device__ __forceinline__
#else
#define MUSER_HD inline
#endif

#include <cstdint>
#include <cstring>
