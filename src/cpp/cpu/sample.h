// Seeded sampling over host logits [t x V] on the CPU: the per-row math of
// muser/sample.h, rows in parallel (cpu/sample.cpp's CpuSteps: the kept-set
// order by nth_element, std::sort or a radix sort; SIMD pairs and weights).
#pragma once
#include <cstdint>

#include "muser/sample.h"

namespace muser::cpu {

// One draw per row r at positions[r]. lse: each row's canonical logsumexp
// (cpu::logsumexp_rows); bias [V] and allowed [V] may be null. out[r] holds
// row r's result (its status says whether it holds a token).
void sample_rows(const float* logits, int t, int64_t V, const float* lse, const float* bias, const uint8_t* allowed,
                 SampleParams params, const uint64_t* positions, int threads, SampleResult* out);

// Many draws from one row (one per position), the kept set built once:
// tokens[j] = the draw at positions[j]. Returns row 0's result at positions[0]
// (n >= 1), or the error status.
SampleResult sample_positions(const float* logits, int64_t V, float lse, const float* bias, const uint8_t* allowed,
                              SampleParams params, const uint64_t* positions, int64_t n, int threads,
                              int64_t* tokens);

}  // namespace muser::cpu
