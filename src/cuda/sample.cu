// Seeded sampling on the device (docs/numerics.md, "Sampling"): muser/sample.h's
// sample_row with its steps spread over the GPU, the same operations on the
// same operands, so the CPU's bits.
//
//   sample_prep    z = processed logits (bias, allowed, temperature) into a
//                  scratch row, the first non-finite z, the top token (first
//                  largest z), the count of finite z, the logits' canonical
//                  logsumexp; greedy rows are finished here.
//   sample_order   (top_k, top_p) each row's tokens as one key each in the
//                  kept-set order (larger z, then lower id; the row in the
//                  high bits), one radix sort of a group of rows, top_k's cut;
//                  sample_kept (first pass) the (m, s) of the z top_k keeps;
//                  sample_top_p walks the sorted order adding e^(z - m) in
//                  sequence, as sample_top_p_count does.
//   sample_final   the kept set (the order's cut, min_p), the canonical pairs
//                  of its z and of its raw logits, and the exponential race
//                  (largest e^(z - m) / E, ties to the lower id: a maximum,
//                  so any split of the race finds the serial winner).
//
// Every kernel but the walk runs a CTA per (row, tile of kLseTile ids); the
// CTA that finishes a row's last tile joins the row (tile_reduce.cuh).
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>

#include "cuda_check.h"
#include "epilogue.cuh"
#include "kernels.h"
#include "muser/sample.h"
#include "logit_keys.cuh"
#include "pdl.cuh"
#include "tile_reduce.cuh"

namespace muser::cuda {

namespace {

// The parameters (mapped host memory, written before the launch: no node writes
// them), read once per CTA -- one read across the bus, not one per warp -- while
// the kernel before still runs; then the wait for that kernel (pdl.cuh). Every
// thread must call it, before its first read of an earlier node's writes.
__device__ __forceinline__ SampleParams cta_params(const SampleKargs& a) {
  __shared__ SampleParams params;
  if (threadIdx.x == 0) params = *a.params;
  pdl_wait();
  __syncthreads();
  return params;
}

// The row's largest z (the top token is always kept): its z, 0 without one.
__device__ __forceinline__ float row_top_z(const SampleKargs& a, int64_t k) {
  const unsigned long long key = a.rows[k].top_key;
  return key ? a.z[k * a.V + logit_key_id(key)] : 0.0f;
}

// Whether (z, id) is kept by the row's order cut.
__device__ __forceinline__ bool within_cut(const SampleRowState& r, float z, int id) {
  return !r.has_cut || sample_before(z, id, r.thr_z, r.thr_id) || id == r.thr_id;
}

__global__ void __launch_bounds__(kTileThreads, 4) sample_prep_kernel(SampleKargs a) {
  pdl_launch_dependents();
  __shared__ TileSmem sm;
  __shared__ unsigned long long warp_top[kTileWarps];
  __shared__ unsigned warp_bad[kTileWarps], warp_finite[kTileWarps];
  const int lane = threadIdx.x % kCanonLanes, warp = threadIdx.x / kCanonLanes;
  const int64_t k = blockIdx.y, tile = blockIdx.x, i0 = tile * kLseTile;
  const int tiles = (int)gridDim.x;
  const int count = (int)(a.V - i0 < kLseTile ? a.V - i0 : kLseTile);
  const SampleParams p = cta_params(a);  // read while the route finishes
  float* x = a.x + k * a.V;
  float* z = a.z + k * a.V;
  const float neg_inf = lse_neg_inf();
  const bool folds = a.fold.op != EpilogueOp::None;
  float v[kStepsPerThread];
  unsigned long long top = 0;
  unsigned bad = 0, finite = 0;  // bad: 0xFFFFFFFF - the lowest bad id (as a key's low word), 0 for none
#pragma unroll
  for (int j = 0; j < kStepsPerThread; ++j) {
    const int i = tile_step_index(j);
    const int id = (int)i0 + i;
    v[j] = neg_inf;
    if (i >= count) continue;
    v[j] = epilogue_apply(a.fold, x[id]);
    if (folds) x[id] = v[j];  // the route's folded node: the logits the later kernels read
    // sample_processed, one token
    float w = neg_inf;
    if (!a.allowed || a.allowed[id]) {
      w = a.bias ? v[j] + a.bias[id] : v[j];
      bool ok = w - w == 0.0f;  // false for NaN and +-inf
      if (ok && p.temperature > 0.0f) {
        w = w / p.temperature;
        ok = w - w == 0.0f;  // a tiny temperature can overflow
      } else if (w == neg_inf) {
        ok = true;  // a -inf logit is a token of probability 0: it stays out
      }
      if (!ok) {
        const unsigned b = 0xFFFFFFFFu - (unsigned)id;
        bad = b > bad ? b : bad;
        w = neg_inf;
      }
    }
    z[id] = w;
    if (w != neg_inf) {
      ++finite;
      const unsigned long long key = logit_key(w, id);
      top = key > top ? key : top;
    }
  }
  top = warp_max(top);
  for (int off = 16; off >= 1; off >>= 1) {
    const unsigned o = __shfl_xor_sync(0xffffffffu, bad, off);
    bad = o > bad ? o : bad;
    finite += __shfl_xor_sync(0xffffffffu, finite, off);
  }
  if (lane == 0) {
    warp_top[warp] = top;
    warp_bad[warp] = bad;
    warp_finite[warp] = finite;
  }
  const LsePair pair = tile_pair(v, sm);  // the logits' own pair: score's logsumexp
  SampleRowState& row = a.rows[k];
  if (threadIdx.x == 0) {
    a.pairs_a[k * tiles + tile] = pair;
    for (int w = 1; w < kTileWarps; ++w) {
      top = warp_top[w] > top ? warp_top[w] : top;
      bad = warp_bad[w] > bad ? warp_bad[w] : bad;
      finite += warp_finite[w];
    }
    if (top) atomicMax(&row.top_key, top);
    if (bad) atomicMax(&row.bad, bad);
    if (finite) atomicAdd(&row.finite, finite);
  }
  if (!finished_row(a.done + k, (unsigned)tiles, sm) || warp != 0) return;
  const LsePair root = join_row(a.pairs_a + k * tiles, tiles, sm);
  if (lane != 0) return;
  a.done[k] = 0;
  const float lse = lse_value(root);
  row.row_lse = lse;
  SampleResult& r = a.out[k];
  const unsigned long long top_key = __ldcg(&row.top_key);
  const unsigned bad_key = __ldcg(&row.bad);
  r = SampleResult{kSampleOk, 0, 0.0f, 0.0f, 0.0f};
  if (bad_key) {
    r.status = kSampleNonFinite;
    r.token = (int32_t)logit_key_id(bad_key);
  } else if (!top_key) {
    r.status = kSampleEmpty;
    r.token = -1;
  } else if (!(p.temperature > 0.0f)) {  // greedy: the kept set is the top token alone (sample_raw_side)
    r.token = (int32_t)logit_key_id(top_key);
    const float xt = __ldcg(x + r.token);  // another CTA's write, when the node is folded
    const float d = xt - lse;
    r.logprob = xt - lse;
    r.kept_mass = canon_exp_nonpos(d < 0.0f ? d : 0.0f);
  }
  if (!(p.temperature > 0.0f)) {  // greedy rows end here
    a.result[k] = r;
    row = SampleRowState{};
  }
}

// The order's sorted keys of row k (sample_order sorted them, row k - row0 of its group).
__device__ __forceinline__ const unsigned long long* sorted_row(const SampleKargs& a, int64_t k, int row0) {
  return a.keys_sorted + (k - row0) * a.V;
}
__device__ __forceinline__ int sorted_id(const SampleKargs& a, unsigned long long key) {
  return (int)(a.id_mask - (unsigned)(key & a.id_mask));
}

// grid (tiles, rows of the group): each token's place in the kept-set order as
// one key -- the group row (first rows largest), the order key of (z, id), a
// -inf z below every finite one -- so one descending sort orders every row.
__global__ void sample_order_keys_kernel(SampleKargs a, int row0, int rows) {
  pdl_launch_dependents();
  pdl_wait();  // every read below may be of an earlier node's writes (pdl.cuh)
  const int64_t r = blockIdx.y, k = row0 + r;
  const float* z = a.z + k * a.V;
  const unsigned long long row_bits = (unsigned long long)(rows - 1 - r) << (32 + a.id_bits);
  for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < a.V; i += (int64_t)gridDim.x * blockDim.x) {
    const float zi = z[i];
    unsigned long long key = row_bits;
    if (zi != lse_neg_inf()) key |= ((logit_key(zi, 0) >> 32) << a.id_bits) | (a.id_mask - (unsigned)i);
    a.keys[r * a.V + i] = key;
  }
}

// Row k's top_k cut (sample_kept_set: only when top_k < the count of finite z):
// last_id, the top_k-th token of the kept-set order, is the threshold.
__device__ __forceinline__ void set_top_k_cut(const SampleKargs& a, int64_t k, int top_k, int last_id) {
  SampleRowState& r = a.rows[k];
  r.has_cut = 0;
  r.cut_count = (int)r.finite;
  if (top_k > 0 && (unsigned)top_k < r.finite) {
    r.has_cut = 1;
    r.thr_id = last_id;
    r.thr_z = a.z[k * a.V + last_id];
    r.cut_count = top_k;
  }
}

// One thread per row of the group: top_k's cut from the sorted order.
__global__ void sample_threshold_kernel(SampleKargs a, int row0, int rows) {
  pdl_launch_dependents();
  const int64_t k = row0 + blockIdx.x;
  const SampleParams p = cta_params(a);
  if (threadIdx.x != 0) return;
  set_top_k_cut(a, k, p.top_k, p.top_k > 0 ? sorted_id(a, sorted_row(a, k, row0)[p.top_k - 1]) : 0);
}

// One thread per row of a group starting at row0: top_k's cut from
// topk_threshold's best_k best z of the row (best_ids [rows x best_k], in the
// kept-set order: larger z, then the lower id), so no sort is needed; best_k
// is the top_k the graph was built for.
__global__ void sample_threshold_best_kernel(SampleKargs a, int row0, const int64_t* best_ids, int best_k) {
  pdl_launch_dependents();
  const int64_t r = blockIdx.x, k = row0 + r;
  const SampleParams p = cta_params(a);
  if (threadIdx.x != 0) return;
  set_top_k_cut(a, k, p.top_k, (int)best_ids[r * best_k + best_k - 1]);
}

// The kept set's pairs: with final = false, the pair of the z the order cut
// keeps (top_p's (m, s)); with final = true, also min_p, the pair of the raw
// logits it keeps and the race, and the finish of each row's draw.
template <bool kFinal>
__global__ void __launch_bounds__(kTileThreads, 4) sample_kept_kernel(SampleKargs a, int row0) {
  pdl_launch_dependents();
  __shared__ TileSmem sm;
  __shared__ unsigned long long warp_race[kTileWarps];
  const int lane = threadIdx.x % kCanonLanes, warp = threadIdx.x / kCanonLanes;
  const int64_t k = row0 + blockIdx.y, tile = blockIdx.x, i0 = tile * kLseTile;
  const int tiles = (int)gridDim.x;
  const int count = (int)(a.V - i0 < kLseTile ? a.V - i0 : kLseTile);
  __shared__ uint64_t position_s;
  if (threadIdx.x == 0) position_s = a.positions[k];
  const SampleParams p = cta_params(a);
  const uint64_t position = position_s;
  const SampleRowState& row = a.rows[k];
  const float* x = a.x + k * a.V;
  const float* z = a.z + k * a.V;
  const float neg_inf = lse_neg_inf();
  const float m = row_top_z(a, k);
  // the race's pruning bound from the top token's key (sample_race stands on it
  // first): a token below it cannot win, so its clock is never drawn
  float z_floor = lse_neg_inf();
  if (kFinal && row.top_key) {
    const int top = (int)logit_key_id(row.top_key);
    z_floor = race_z_floor(sample_race_key(m, m, p.seed, position, top));
  }
  const bool z_pair = !kFinal || a.kept_z_pair, raw_pair = kFinal && a.kept_raw_pair;
  float zk[kStepsPerThread], xk[kStepsPerThread];
  unsigned long long race = 0;
#pragma unroll
  for (int j = 0; j < kStepsPerThread; ++j) {
    const int i = tile_step_index(j);
    const int id = (int)i0 + i;
    zk[j] = neg_inf;
    xk[j] = neg_inf;
    if (i >= count) continue;
    const float zi = z[id];
    bool kept = zi != neg_inf && within_cut(row, zi, id);
    if (kFinal && kept && p.min_p > 0.0f && canon_exp_nonpos(zi - m) < p.min_p) kept = false;
    if (!kept) continue;
    zk[j] = zi;
    if (kFinal) {
      if (raw_pair) xk[j] = x[id];
      if (zi - m < z_floor) continue;
      const float key = sample_race_key(zi, m, p.seed, position, id);
      const unsigned long long packed = logit_key(key, id);  // ranked as a logit: larger, then lower id
      race = packed > race ? packed : race;
    }
  }
  if (kFinal) {
    race = warp_max(race);
    if (lane == 0) warp_race[warp] = race;
  }
  LsePair zpair = lse_empty(), xpair = lse_empty();
  if (z_pair) zpair = tile_pair(zk, sm);  // uniform over the CTA: every thread calls or none
  if (raw_pair) xpair = tile_pair(xk, sm);
  __syncthreads();  // warp_race is read below even where no tile_pair ran
  if (threadIdx.x == 0) {
    a.pairs_a[k * tiles + tile] = zpair;
    if (kFinal) {
      a.pairs_b[k * tiles + tile] = xpair;
      for (int w = 1; w < kTileWarps; ++w) race = warp_race[w] > race ? warp_race[w] : race;
      if (race) atomicMax(&a.rows[k].race_key, race);
    }
  }
  if (!finished_row(a.done + k, (unsigned)tiles, sm) || warp != 0) return;
  LsePair kept_pair = lse_empty(), raw_root = lse_empty();
  if (z_pair) kept_pair = join_row(a.pairs_a + k * tiles, tiles, sm);
  if (raw_pair) raw_root = join_row(a.pairs_b + k * tiles, tiles, sm);
  if (lane != 0) return;
  a.done[k] = 0;
  SampleRowState& r = a.rows[k];
  if (!kFinal) {
    r.cut_pair = kept_pair;
    return;
  }
  SampleResult& out = a.out[k];
  if (out.status == kSampleOk) {  // else sample_prep's verdict stands
    const unsigned long long race_key = __ldcg(&r.race_key);
    out.token = (int32_t)logit_key_id(race_key);
    out.processed_logprob = z[out.token] - (z_pair ? lse_value(kept_pair) : r.row_lse);
    const float d = (raw_pair ? lse_value(raw_root) : r.row_lse) - r.row_lse;  // sample_raw_side
    out.logprob = x[out.token] - r.row_lse;
    out.kept_mass = canon_exp_nonpos(d < 0.0f ? d : 0.0f);
  }
  a.result[k] = out;  // the row's last kernel
  r = SampleRowState{};
}

// One warp per row of the group: top_p's cut (sample_top_p_count) over the
// sorted order. Each lane computes the e^(z - m) of one token in every 32,
// kTopPGroup of them (256 tokens) at a time, the next group's loads in
// flight while every lane adds this group's weights in order (shuffled: the
// same running sum on each lane). The additions are the only chain -- the
// first crossing is kept by a select beside it, and zeros past n add nothing
// -- so a token costs an FADD's latency, not a load's and a branch's. The
// cut's last token becomes the threshold.
constexpr int kTopPGroup = 8;
__global__ void sample_top_p_kernel(SampleKargs a, int row0) {
  pdl_launch_dependents();
  const int64_t k = row0 + blockIdx.x;
  const int lane = threadIdx.x;
  const SampleParams p = cta_params(a);
  SampleRowState& r = a.rows[k];
  const int n = r.cut_count;
  const float m = r.cut_pair.m, target = p.top_p * r.cut_pair.s;
  const unsigned long long* keys = sorted_row(a, k, row0);
  const float* z = a.z + k * a.V;
  auto weights = [&](int base, float (&w)[kTopPGroup]) {
#pragma unroll
    for (int g = 0; g < kTopPGroup; ++g) {
      const int j = base + 32 * g + lane;
      w[g] = j < n ? canon_exp_nonpos(z[sorted_id(a, keys[j])] - m) : 0.0f;
    }
  };
  float c = 0.0f;
  int cut = n;  // not reached: the whole kept set
  float w[kTopPGroup];
  weights(0, w);
  for (int base = 0; base < n; base += 32 * kTopPGroup) {
    float next[kTopPGroup];
    weights(base + 32 * kTopPGroup, next);
    int found = -1;
#pragma unroll
    for (int g = 0; g < kTopPGroup; ++g)
#pragma unroll
      for (int l = 0; l < 32; ++l) {
        c = c + __shfl_sync(0xffffffffu, w[g], l);
        found = (found < 0 && c >= target) ? base + 32 * g + l + 1 : found;
      }
    if (found >= 0) {
      cut = found;
      break;
    }
#pragma unroll
    for (int g = 0; g < kTopPGroup; ++g) w[g] = next[g];
  }
  if (lane == 0 && cut < n) {
    const int id = sorted_id(a, keys[cut - 1]);
    r.has_cut = 1;
    r.thr_id = id;
    r.thr_z = z[id];
  }
}

__global__ void sample_unpack_kernel(const SampleResult* r, int t, int64_t* tokens, float* lp, float* plp,
                                     float* mass) {
  pdl_launch_dependents();
  pdl_wait();  // every read below may be of an earlier node's writes (pdl.cuh)
  const int k = blockIdx.x * blockDim.x + threadIdx.x;
  if (k >= t) return;
  tokens[k] = r[k].token;
  lp[k] = r[k].logprob;
  plp[k] = r[k].processed_logprob;
  mass[k] = r[k].kept_mass;
}

}  // namespace

void sample_unpack(const SampleResult* results, int t, int64_t* tokens, float* logprobs, float* processed,
                   float* kept_mass, cudaStream_t stream) {
  launch_consumer(sample_unpack_kernel, dim3((unsigned)((t + 127) / 128)), dim3(128), 0, stream, "sample_unpack", results, t,
             tokens, logprobs, processed, kept_mass);
}

void sample_prep(const SampleKargs& a, cudaStream_t stream) {
  const unsigned tiles = (unsigned)((a.V + kLseTile - 1) / kLseTile);
  launch_consumer(sample_prep_kernel, dim3(tiles, (unsigned)a.t), dim3(kTileThreads), 0, stream, "sample_prep", a);
}

void sample_order(const SampleKargs& a, int row0, int rows, void* sort_scratch, size_t sort_bytes,
                  cudaStream_t stream) {
  const unsigned blocks = (unsigned)std::min<int64_t>((a.V + 255) / 256, 256);
  launch_consumer(sample_order_keys_kernel, dim3(blocks, (unsigned)rows), dim3(256), 0, stream, "sample_order_keys", a, row0,
             rows);
  size_t bytes = sort_bytes;
  check(cub::DeviceRadixSort::SortKeysDescending(sort_scratch, bytes, a.keys, a.keys_sorted, (int64_t)rows * a.V, 0,
                                                 sample_order_bits(a.id_bits, rows), stream),
        "the kept-set order's sort");
  launch_consumer(sample_threshold_kernel, dim3((unsigned)rows), dim3(32), 0, stream, "sample_threshold", a, row0, rows);
}

void sample_top_k_by_select(const SampleKargs& a, int k, int row0, int rows, void* select_scratch,
                            unsigned* select_sync, int64_t* best_ids, float* best_z, cudaStream_t stream) {
  topk_threshold(a.z + (int64_t)row0 * a.V, a.V, rows, k, select_scratch, select_sync, best_ids, best_z, stream);
  launch_consumer(sample_threshold_best_kernel, dim3((unsigned)rows), dim3(32), 0, stream, "sample_threshold", a,
                  row0, (const int64_t*)best_ids, k);
}

size_t sample_order_scratch_bytes(int64_t V, int rows, int id_bits) {
  size_t bytes = 0;
  check(cub::DeviceRadixSort::SortKeysDescending(nullptr, bytes, (unsigned long long*)nullptr,
                                                 (unsigned long long*)nullptr, (int64_t)rows * V, 0,
                                                 sample_order_bits(id_bits, rows)),
        "the kept-set order's sort (size)");
  return bytes;
}

void sample_kept_pairs(const SampleKargs& a, bool final_pass, int row0, int rows, cudaStream_t stream) {
  const unsigned tiles = (unsigned)((a.V + kLseTile - 1) / kLseTile);
  launch_consumer(final_pass ? sample_kept_kernel<true> : sample_kept_kernel<false>, dim3(tiles, (unsigned)rows),
             dim3(kTileThreads), 0, stream, "sample_kept_pairs", a, row0);
}

void sample_top_p(const SampleKargs& a, int row0, int rows, cudaStream_t stream) {
  launch_consumer(sample_top_p_kernel, dim3((unsigned)rows), dim3(32), 0, stream, "sample_top_p", a, row0);
}

}  // namespace muser::cuda
