// argmax / top-k over each row of logits on the device, so only the winners
// travel to the host.
//
// Order: a logit and its token id become one 64-bit key (logit_keys.cuh): a
// larger key is a better token, ties go to the lowest id, NaN never beats a
// number -- the CPU's argmax_rows/topk_rows rule. Keys are distinct, so "the largest key below the last one taken" walks
// the ranking without marking anything.
//
// Thread mapping: a CTA of 256 threads holds a chunk of 2048 keys of one row
// in registers (8 each) and takes its k best in k passes (each a max-reduce:
// warp shuffles, then one shared word per warp). The chunks' winners form the
// next stage's input (k keys per chunk) until one chunk is left; a last kernel
// turns keys into ids and gathers the exact logits (so -0 stays -0).
#include <algorithm>

#include "cuda_check.h"
#include "kernels.h"
#include "pdl.cuh"
#include "logit_keys.cuh"

namespace muser::cuda {

namespace {

constexpr int kTopkThreads = 256;
constexpr int kTopkItems = 8;
constexpr int kTopkChunk = kTopkThreads * kTopkItems;


template <bool kFromLogits>
__global__ void topk_stage_kernel(const float* logits, const unsigned long long* keys_in, int64_t n, int k,
                                  unsigned long long* keys_out) {
  pdl_launch_dependents();
  pdl_wait();  // every read below may be of an earlier node's writes (pdl.cuh)
  const int64_t row = blockIdx.y, chunk = blockIdx.x;
  const int64_t base = chunk * kTopkChunk;
  unsigned long long item[kTopkItems];
#pragma unroll
  for (int i = 0; i < kTopkItems; ++i) {
    const int64_t j = base + i * kTopkThreads + threadIdx.x;
    if (j >= n) item[i] = 0;  // below every real key
    else if (kFromLogits) item[i] = logit_key(logits[row * n + j], j);
    else item[i] = keys_in[row * n + j];
  }
  unsigned long long limit = ~0ull;
  unsigned long long* out = keys_out + (row * gridDim.x + chunk) * k;
  for (int pass = 0; pass < k; ++pass) {
    unsigned long long best = 0;
#pragma unroll
    for (int i = 0; i < kTopkItems; ++i)
      if (item[i] < limit && item[i] > best) best = item[i];
    best = cta_max<kTopkThreads>(best);
    if (threadIdx.x == 0) out[pass] = best;
    limit = best;
  }
}

__global__ void topk_finish_kernel(const float* logits, int64_t V, const unsigned long long* keys, int t, int k,
                                   int64_t* ids, float* vals) {
  pdl_launch_dependents();
  pdl_wait();  // every read below may be of an earlier node's writes (pdl.cuh)
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= t * k) return;
  const int row = i / k;
  const int64_t id = (int64_t)logit_key_id(keys[i]);
  ids[i] = id;
  vals[i] = logits[row * V + id];
}

int64_t chunks_of(int64_t n) { return (n + kTopkChunk - 1) / kTopkChunk; }

void launch_topk(const float* logits, int64_t V, int t, int k, void* scratch, int64_t* ids, float* vals,
                 cudaStream_t stream) {
  auto* buf_a = static_cast<unsigned long long*>(scratch);
  auto* buf_b = buf_a + (size_t)t * chunks_of(V) * k;
  int64_t chunks = chunks_of(V);
  launch_consumer(topk_stage_kernel<true>, dim3((unsigned)chunks, (unsigned)t), dim3(kTopkThreads), 0, stream,
             "topk_stage(logits)", logits, nullptr, V, k, buf_a);
  // each stage leaves `chunks` x k keys per row; merge until one chunk is left
  while (chunks > 1) {
    const int64_t n = chunks * k;
    chunks = chunks_of(n);
    launch_consumer(topk_stage_kernel<false>, dim3((unsigned)chunks, (unsigned)t), dim3(kTopkThreads), 0, stream,
               "topk_stage(keys)", nullptr, buf_a, n, k, buf_b);
    std::swap(buf_a, buf_b);
  }
  const int n = t * k;
  launch_consumer(topk_finish_kernel, dim3((unsigned)((n + 255) / 256)), dim3(256), 0, stream, "topk_finish", logits, V, buf_a,
             t, k, ids, vals);
}

// ---- the call's selection: argmax and small-k top-k in one or two kernels ----
//
// Chunks of kSelChunk keys, one CTA each. argmax: each CTA's best key, and the
// row's last CTA to finish (a ticket, after a fence) reduces the CTAs' bests.
// Top-k by a threshold: the k-th largest of the chunks' bests, L, is a key
// with k distinct keys >= it, so the row's k best are all >= L; the first
// kernel finds L, the second gathers the keys >= L (for real logits a few
// more than k) and its last CTA ranks them: a key's rank is the number of
// candidates above it (keys are distinct), so each one knows its place.
constexpr int kSelThreads = 256;
constexpr int kSelItems = 4;
constexpr int kSelChunk = kSelThreads * kSelItems;
static_assert(kSelChunk == 1 << kTopkChunkShift, "the matvec's partials use the same chunks");
constexpr int kSelGroupRows = 16;      // rows topk_threshold selects at a time (their candidates: [rows x V] keys)
constexpr int kSelRankKeys = 512;      // candidates ranked directly (more: a radix select finds the k-th first)

int64_t sel_chunks(int64_t V) { return (V + kSelChunk - 1) / kSelChunk; }
// argmax of many rows: 4 x the keys a CTA (t = 256 of the seed head: 50,688 CTAs of 1,024
// keys each held the GPU ~3 x the logits' read time); from kArgmaxRowRows rows on, one CTA
// of kArgmaxRowThreads a row (no ticket, no second reduction: the rows fill the GPU)
constexpr int kArgmaxWideItems = 16;
constexpr int kArgmaxWideRows = 8;  // from this many rows on
constexpr int kArgmaxRowRows = 256;  // one run: 46 us beyond the plain call at t = 256 (chunks: 187), 97 at 128
constexpr int kArgmaxRowThreads = 1024;


// Whether this CTA is the last of the row's `ctas` to get here (its writes before are visible to that one).
__device__ bool last_of_row(unsigned* done, unsigned ctas) {
  __shared__ bool last;
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last = atomicAdd(done, 1u) == ctas - 1;
  __syncthreads();
  return last;
}

__device__ int64_t key_id_d(unsigned long long key) {
  return (int64_t)logit_key_id(key);
}

// best[row][chunk] = the chunk's best key; the row's last CTA then writes either
// the argmax id (kArgmax) or the threshold: the k-th largest of the row's bests.
template <bool kArgmax, int kItems = kSelItems>
__global__ void chunk_best_kernel(const float* logits, int64_t V, int k, unsigned long long* best_out,
                                  unsigned* done, int64_t* ids, unsigned long long* threshold) {
  pdl_launch_dependents();
  pdl_wait();  // every read below may be of an earlier node's writes (pdl.cuh)
  const int64_t row = blockIdx.y;
  const unsigned chunks = gridDim.x;
  const float* y = logits + row * V;
  unsigned long long best = 0;
#pragma unroll
  for (int i = 0; i < kItems; ++i) {
    const int64_t j = (int64_t)blockIdx.x * (kSelThreads * kItems) + i * kSelThreads + threadIdx.x;
    if (j < V) {
      const unsigned long long key = logit_key(y[j], j);
      best = key > best ? key : best;
    }
  }
  best = cta_max<kSelThreads>(best);
  unsigned long long* row_best = best_out + row * chunks;
  if (threadIdx.x == 0) row_best[blockIdx.x] = best;
  if (!last_of_row(done + row, chunks)) return;
  if (kArgmax) {
    unsigned long long b = 0;
    for (unsigned c = threadIdx.x; c < chunks; c += kSelThreads) {
      const unsigned long long v = __ldcg(row_best + c);
      b = v > b ? v : b;
    }
    b = cta_max<kSelThreads>(b);
    if (threadIdx.x == 0) {
      ids[row] = key_id_d(b);
      done[row] = 0;
    }
  } else {
    __shared__ __align__(16) unsigned long long bests[kSelRankKeys];
    threshold_of_bests<kSelThreads, kSelRankKeys>(row_best, chunks, k, bests, threshold + row);
    if (threadIdx.x == 0) done[row] = 0;
  }
}

// ids[row] = the row's argmax, one CTA a row.
__global__ void __launch_bounds__(kArgmaxRowThreads) row_argmax_kernel(const float* logits, int64_t V, int64_t* ids) {
  pdl_launch_dependents();
  pdl_wait();  // every read below may be of an earlier node's writes (pdl.cuh)
  const int64_t row = blockIdx.x;
  const float* y = logits + row * V;
  unsigned long long best = 0;
#pragma unroll 16  // the loads run ahead of the one chain of maxima
  for (int64_t j = threadIdx.x; j < V; j += kArgmaxRowThreads) {
    const unsigned long long key = logit_key(y[j], j);
    best = key > best ? key : best;
  }
  best = cta_max<kArgmaxRowThreads>(best);
  if (threadIdx.x == 0) ids[row] = key_id_d(best);
}

// The k-th largest of n distinct keys c[0..n), by a most-significant-digit
// radix select over the CTA (8 passes of 8 bits): the many candidates of tied
// logits (a row of zeros has n = (k - 1) * kSelChunk + 1) in O(n) work.
__device__ unsigned long long cta_kth_largest(const unsigned long long* c, unsigned n, unsigned k) {
  __shared__ unsigned hist[256];
  __shared__ unsigned long long prefix_s;
  __shared__ unsigned remaining_s;
  unsigned long long prefix = 0, mask = 0;
  if (threadIdx.x == 0) remaining_s = k;
  for (int shift = 56; shift >= 0; shift -= 8) {
    for (int d = threadIdx.x; d < 256; d += kSelThreads) hist[d] = 0;
    __syncthreads();
    for (unsigned q = threadIdx.x; q < n; q += kSelThreads) {
      const unsigned long long key = __ldcg(c + q);
      if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255], 1u);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      unsigned cum = 0, want = remaining_s;
      int d = 255;
      for (; d > 0 && cum + hist[d] < want; --d) cum += hist[d];
      remaining_s = want - cum;
      prefix_s = prefix | ((unsigned long long)d << shift);
    }
    __syncthreads();
    prefix = prefix_s;
    mask |= 0xFFull << shift;
  }
  return prefix;
}

// The keys >= the row's threshold into cand[row] (count[row] of them); the
// row's last CTA ranks them and writes the k best's ids and exact logits.
// With ranked (the matvec's chunk bests, [rows x gridDim.x], each row best first)
// in place of threshold, the row's threshold is its k-th.
__global__ void topk_gather_kernel(const float* logits, int64_t V, int k, const unsigned long long* threshold,
                                   const unsigned long long* ranked, unsigned long long* cand, unsigned* count,
                                   unsigned* done, int64_t* ids, float* vals) {
  pdl_launch_dependents();
  pdl_wait();  // every read below may be of an earlier node's writes (pdl.cuh)
  __shared__ __align__(16) unsigned long long staged[kSelRankKeys];
  __shared__ unsigned n_staged;
  const int64_t row = blockIdx.y;
  const float* y = logits + row * V;
  const unsigned long long limit = ranked ? ranked[row * gridDim.x + k - 1] : threshold[row];
  unsigned long long* c = cand + row * V;
#pragma unroll
  for (int i = 0; i < kSelItems; ++i) {
    const int64_t j = (int64_t)blockIdx.x * kSelChunk + i * kSelThreads + threadIdx.x;
    if (j < V) {
      const unsigned long long key = logit_key(y[j], j);
      if (key >= limit) c[atomicAdd(count + row, 1u)] = key;
    }
  }
  if (!last_of_row(done + row, gridDim.x)) return;
  const unsigned n = __ldcg(count + row);
  if (n <= (unsigned)kSelRankKeys) {
    for (unsigned q = threadIdx.x; q < n; q += kSelThreads) staged[q] = __ldcg(c + q);
    if (threadIdx.x == 0) n_staged = n;
  } else {  // too many to rank pairwise: exactly the k keys >= the k-th largest
    const unsigned long long kth = cta_kth_largest(c, n, (unsigned)k);
    if (threadIdx.x == 0) n_staged = 0;
    __syncthreads();
    for (unsigned q = threadIdx.x; q < n; q += kSelThreads) {
      const unsigned long long key = __ldcg(c + q);
      if (key >= kth) staged[atomicAdd(&n_staged, 1u)] = key;
    }
  }
  __syncthreads();
  if (threadIdx.x == 0) {  // every thread has read count[row]
    count[row] = 0;
    done[row] = 0;
  }
  const unsigned m = n_staged;
  for (unsigned q = threadIdx.x; q < m; q += kSelThreads) {
    const unsigned long long key = staged[q];
    unsigned above = 0;
    for (unsigned d = 0; d < m; ++d) above += staged[d] > key;
    if (above < (unsigned)k) {
      const int64_t id = key_id_d(key);
      ids[row * k + above] = id;
      vals[row * k + above] = y[id];  // the exact logit (so -0 stays -0)
    }
  }
}

}  // namespace

size_t select_sync_words(int t) { return 3 * (size_t)t; }

size_t argmax_scratch_bytes(int64_t V, int t) { return (size_t)t * sel_chunks(V) * 8; }

void argmax(const float* logits, int64_t V, int t, void* scratch, unsigned* sync, int64_t* ids, cudaStream_t stream) {
  auto* best = static_cast<unsigned long long*>(scratch);  // sel_chunks(V) a row: enough for either chunk size
  if (t >= kArgmaxRowRows) {
    launch_consumer(row_argmax_kernel, dim3((unsigned)t), dim3(kArgmaxRowThreads), 0, stream, "argmax", logits, V, ids);
  } else if (t >= kArgmaxWideRows) {
    constexpr int64_t kChunk = (int64_t)kSelThreads * kArgmaxWideItems;
    const dim3 grid((unsigned)((V + kChunk - 1) / kChunk), (unsigned)t);
    launch_consumer(chunk_best_kernel<true, kArgmaxWideItems>, grid, dim3(kSelThreads), 0, stream, "argmax", logits, V,
                    1, best, sync, ids, nullptr);
  } else {
    const dim3 grid((unsigned)sel_chunks(V), (unsigned)t);
    launch_consumer(chunk_best_kernel<true>, grid, dim3(kSelThreads), 0, stream, "argmax", logits, V, 1, best, sync,
                    ids, nullptr);
  }
}

bool topk_threshold_fits(int64_t V, int t, int k) { return t >= 1 && k >= 1 && k <= sel_chunks(V) && k <= kSelRankKeys; }

size_t topk_threshold_scratch_bytes(int64_t V, int t) {
  const size_t g = (size_t)std::min(t, kSelGroupRows);
  return (g * sel_chunks(V) + g + g * V) * 8;
}

// Groups of kSelGroupRows rows, one after another on the stream, through the same
// scratch and counters (the kernels leave the counters zero): scratch for t <= 16
// rows, and at t = 256 of the seed head 16 pairs of launches where the k-pass
// stages (cuda::topk) took 2.2 ms (docs/performance.md).
void topk_threshold(const float* logits, int64_t V, int t, int k, void* scratch, unsigned* sync, int64_t* ids,
                    float* vals, cudaStream_t stream) {
  if (!topk_threshold_fits(V, t, k)) throw ArgValueError("internal: topk_threshold does not take this (V, t, k)");
  const int g = std::min(t, kSelGroupRows);
  auto* best = static_cast<unsigned long long*>(scratch);
  auto* threshold = best + (size_t)g * sel_chunks(V);
  auto* cand = threshold + g;
  for (int r0 = 0; r0 < t; r0 += g) {
    const int rows = std::min(g, t - r0);
    const float* y = logits + (size_t)r0 * V;
    const dim3 grid((unsigned)sel_chunks(V), (unsigned)rows);
    launch_consumer(chunk_best_kernel<false>, grid, dim3(kSelThreads), 0, stream, "topk_threshold(bests)", y, V, k,
                    best, sync, nullptr, threshold);
    launch_consumer(topk_gather_kernel, grid, dim3(kSelThreads), 0, stream, "topk_threshold(gather)", y, V, k, threshold,
                    nullptr, cand, sync + 2 * g, sync + g, ids + (size_t)r0 * k, vals + (size_t)r0 * k);
  }
}

TopkThresholdSlots topk_threshold_slots(void* scratch, int64_t V, int t) {
  if (t < 1 || t > kSelGroupRows) throw ArgValueError("internal: topk_threshold_slots takes one group of rows");
  auto* best = static_cast<unsigned long long*>(scratch);
  return TopkThresholdSlots{best, best + (size_t)t * sel_chunks(V)};  // topk_threshold's layout
}

// topk_threshold's second kernel alone for one group of t rows, in its scratch and
// counters, the threshold from the row's slot or (ranked) the k-th ranked best.
static void launch_threshold_gather(const float* logits, int64_t V, int t, int k, const unsigned long long* ranked,
                                    void* scratch, unsigned* sync, int64_t* ids, float* vals, cudaStream_t stream) {
  const TopkThresholdSlots slots = topk_threshold_slots(scratch, V, t);
  auto* cand = slots.threshold + t;
  const dim3 grid((unsigned)sel_chunks(V), (unsigned)t);
  launch_consumer(topk_gather_kernel, grid, dim3(kSelThreads), 0, stream, "topk_threshold(gather)", logits, V, k,
                  ranked ? nullptr : (const unsigned long long*)slots.threshold, ranked, cand, sync + 2 * t, sync + t,
                  ids, vals);
}

void topk_threshold_gather(const float* logits, int64_t V, int t, int k, void* scratch, unsigned* sync, int64_t* ids,
                           float* vals, cudaStream_t stream) {
  if (!topk_threshold_fits(V, t, k) || t > kSelGroupRows)
    throw ArgValueError("internal: topk_threshold_gather does not take this (V, t, k)");
  launch_threshold_gather(logits, V, t, k, nullptr, scratch, sync, ids, vals, stream);
}

int64_t topk_chunks(int64_t V) { return sel_chunks(V); }

bool topk_bests_fit(int64_t V, int t, int k) {
  return topk_threshold_fits(V, t, k) && t <= kSelGroupRows && sel_chunks(V) <= kSelRankKeys;
}

void topk_threshold_from_bests(const float* logits, int64_t V, int t, int k, const unsigned long long* ranked,
                               void* scratch, unsigned* sync, int64_t* ids, float* vals, cudaStream_t stream) {
  if (!topk_bests_fit(V, t, k)) throw ArgValueError("internal: topk_threshold_from_bests does not take this (V, t, k)");
  launch_threshold_gather(logits, V, t, k, ranked, scratch, sync, ids, vals, stream);
}

size_t topk_scratch_bytes(int64_t V, int t, int k) { return 2 * (size_t)t * chunks_of(V) * k * 8; }

void topk(const float* logits, int64_t V, int t, int k, void* scratch, int64_t* ids, float* vals,
          cudaStream_t stream) {
  if (k < 1 || k > kTopkMax || k > V) throw ArgValueError("topk: k must be in [1, min(V, " + std::to_string(kTopkMax) + ")] on the device");
  launch_topk(logits, V, t, k, scratch, ids, vals, stream);
  check_launch("topk_finish");
}

}  // namespace muser::cuda
