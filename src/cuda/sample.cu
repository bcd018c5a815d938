// Seeded sampling on the device (docs/numerics.md, "Sampling"): muser/sample.h's
// sample_row with its steps spread over the GPU, the same operations on the
// same operands, so the CPU's bits.
//
//   sample_prep    z = processed logits (bias, allowed, temperature) into a
//                  scratch row, the first non-finite z, the top token (first
//                  largest z), the count of finite z, the logits' canonical
//                  logsumexp; greedy rows are finished here. For top_k by
//                  selection of <= 16 rows also topk_threshold's chunk bests of
//                  z and each row's threshold (its first kernel's work).
//   top_k's cut    topk_threshold's k best of each row, then sample_kept_best
//                  (sample_top_k_by_select): top_p, min_p, the pairs and the race
//                  over those k alone, in place of the two steps below;
//                  or, for a top_k beyond it, sample_order: each row's tokens
//                  as one key each in the kept-set order (larger z, then lower
//                  id; the row in the high bits), one radix sort of a group of
//                  rows, the k-th key.
//   top_p's cut    sample_top_p_select: a radix select by fixed-point mass
//                  over the z the top_k cut keeps (below), no sort.
//   sample_kept    the kept set (the cuts, min_p), the canonical pairs of its
//                  z and of its raw logits, and the exponential race (largest
//                  e^(z - m) / E, ties to the lower id: a maximum, so any
//                  split of the race finds the serial winner).
//
// sample_prep and sample_kept run a CTA per (row, tile of kLseTile ids) for a
// few rows, a warp per (row, tile) for many (kCtaTileMaxTiles); the order's
// keys and top_p's passes a CTA per (row, tile). The CTA that finishes a row's
// last tile joins the row (tile_reduce.cuh).
#include <cub/block/block_scan.cuh>
#include <cub/device/device_radix_sort.cuh>

#include <algorithm>
#include <cstdlib>
#include <map>
#include <mutex>
#include <utility>

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

// topk_threshold's chunks of a row of V (kTopkChunkShift): a tile of sample_prep holds two.
static_assert(kLseTile == 2 << kTopkChunkShift, "a tile is two of top_k's chunks");
__device__ __forceinline__ int64_t top_k_chunks(int64_t V) {
  return (V + (1 << kTopkChunkShift) - 1) >> kTopkChunkShift;
}

// The launch shape of sample_prep and sample_kept (tile_reduce.cuh): a CTA per
// (row, tile) up to kCtaTileMaxTiles tiles a launch, else a warp per (row,
// tile), kWarpTiles to a CTA. Each token's work is long (the processed z and
// its key; the race's Philox clock and two exps), so a launch of few tiles
// needs every thread of a CTA on each one: a warp per tile ran one row of the
// seed's vocabulary (99 tiles) on a quarter of the SMs, and lost up to t = 16
// (H100, temperature 1: 1.18-1.28 x the plain call against 1.16-1.17); from
// t = 32 on it wins (1.22-1.25 against 1.29; t = 256: 1.34 against 1.64,
// greedy 1.11 against 1.29).
constexpr int64_t kCtaTileMaxTiles = 2048;
__host__ __device__ constexpr bool cta_per_tile(int64_t tiles) { return tiles <= kCtaTileMaxTiles; }

// Dynamic shared memory (never used) that spreads a CTA-per-tile launch of
// `ctas` <= SMs over the SMs, one CTA of it to a SM (MUSER_SAMPLE_SPREAD=n: n
// to a SM at any size, 0: none asked; for measuring). A short grid launched
// behind the route (PDL) is otherwise packed four CTAs to a SM on the SMs that
// free first, and a tile's work is long: sample_prep's 99 tiles of one row of
// the seed's vocabulary ran on 26 of an H100's 132 SMs, top_p's passes on 34
// and 66, sample_kept on 38; one to a SM took 5-7 us off a top_p draw's chain
// (docs/performance.md, "Where a t = 1 draw's GPU time goes"). A grid of more
// waves is left alone: at t = 8 (792 CTAs) six to a SM instead of eight lost
// 46 us. The kernel's limit on dynamic shared memory is raised once per
// (kernel, device).
size_t spread_smem(const void* kernel, int64_t ctas) {
  static const int setting = [] {
    const char* e = std::getenv("MUSER_SAMPLE_SPREAD");
    return e ? std::max(0, std::atoi(e)) : -1;
  }();
  if (setting == 0) return 0;
  struct Fit {
    int sms, sm_bytes, reserved, kernel_static;
  };
  static std::mutex mu;
  static std::map<std::pair<const void*, int>, Fit> fits;
  int dev = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  Fit f;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = fits.find({kernel, dev});
    if (it == fits.end()) {
      int optin = 0;
      cudaFuncAttributes fa{};
      check(cudaDeviceGetAttribute(&f.sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute(SM count)");
      check(cudaDeviceGetAttribute(&f.sm_bytes, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev),
            "cudaDeviceGetAttribute(shared memory per SM)");
      check(cudaDeviceGetAttribute(&f.reserved, cudaDevAttrReservedSharedMemoryPerBlock, dev),
            "cudaDeviceGetAttribute(reserved shared memory)");
      check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
            "cudaDeviceGetAttribute(shared memory per block)");
      check(cudaFuncGetAttributes(&fa, kernel), "cudaFuncGetAttributes(a sample kernel)");
      f.kernel_static = (int)fa.sharedSizeBytes;
      check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, optin - f.kernel_static),
            "cudaFuncSetAttribute(a sample kernel's shared memory)");
      it = fits.emplace(std::make_pair(kernel, dev), f).first;
    }
    f = it->second;
  }
  if (setting < 0 && ctas > f.sms) return 0;
  const int64_t per_sm = setting > 0 ? setting : 1;
  // one CTA more than per_sm overflows the SM (allocation granules: 128 B)
  const int64_t bytes = f.sm_bytes / (per_sm + 1) + 128 - f.reserved - f.kernel_static;
  return bytes > 0 ? (size_t)bytes : 0;
}

// The launch of a sample kernel over `rows` rows of V ids in the shape above.
template <class Cta, class Warp, class... Args>
void launch_sample_tiles(Cta cta_kernel, Warp warp_kernel, int64_t V, int rows, cudaStream_t stream, const char* what,
                         const Args&... args) {
  const int64_t tiles = lse_tile_count(V);
  if (cta_per_tile(tiles * rows))
    launch_consumer(cta_kernel, dim3((unsigned)tiles, (unsigned)rows), dim3(kTileThreads),
                    spread_smem((const void*)cta_kernel, tiles * rows), stream, what, args...);
  else
    launch_consumer(warp_kernel, dim3((unsigned)warp_tile_ctas(V), (unsigned)rows), dim3(kWarpTileThreads), 0, stream,
                    what, args...);
}

// grid (tiles, t) of kTileThreads (kCtaTile) or (warp_tile_ctas(V), t) of
// kWarpTileThreads: z = the processed logits, each row's first bad id, top
// key, count of finite z and top_k's chunk bests (a.sel), the tiles' pairs of
// the logits themselves (the row's logsumexp), and greedy rows finished. A
// CTA-per-tile thread takes steps tile_step_index(j) (top_k's first chunk in
// warps 0-3, the second in 4-7); a warp-per-tile lane takes ids l, l + 32, ...
// of its tile (the first chunk in its first 32 steps), a chunk of steps in
// registers at once with the next chunk's loads in flight. The folded node kOp
// is applied to each raw logit as it is loaded (and written back: the logits
// the later kernels read).
template <EpilogueOp kOp, bool kCtaTile>
__global__ void __launch_bounds__(kCtaTile ? kTileThreads : kWarpTileThreads, kCtaTile ? 4 : 8)
    sample_prep_kernel(SampleKargs a) {
  pdl_launch_dependents();
  constexpr int kWarps = kCtaTile ? kTileWarps : kWarpTiles;
  __shared__ TileSmem sm;
  __shared__ unsigned long long warp_top[kWarps], warp_sel[kWarps][2];
  __shared__ unsigned warp_bad[kWarps], warp_finite[kWarps];
  const int lane = threadIdx.x % kCanonLanes, warp = threadIdx.x / kCanonLanes;
  const int64_t k = blockIdx.y;
  const TileSpan tile = kCtaTile ? TileSpan(a.V, 1, 0) : TileSpan(a.V, kWarpTiles, warp);
  const int tiles = (int)lse_tile_count(a.V);
  const int count = tile.count;
  const SampleParams p = cta_params(a);  // read while the route finishes
  float* x = a.x + k * a.V;
  float* z = a.z + k * a.V;
  const float neg_inf = lse_neg_inf();
  unsigned long long top = 0, sel[2] = {0, 0};  // sel: top_k's chunk bests (a.sel), of every z
  unsigned bad = 0, finite = 0;  // bad: 0xFFFFFFFF - the lowest bad id (as a key's low word), 0 for none
  // one token: its raw logit through the folded node (returned: the logit the
  // pairs push), its processed z written, the row's verdicts and bests updated
  auto token = [&](int id, float raw, unsigned long long& chunk_sel) {
    const float v = epilogue_op<kOp>(raw, a.fold.f0, a.fold.f1, a.fold.f2);
    if constexpr (kOp != EpilogueOp::None) x[id] = v;
    float w = neg_inf;  // sample_processed, one token
    if (!a.allowed || a.allowed[id]) {
      bool ok;
      w = sample_processed_one(a.bias ? v + a.bias[id] : v, p.temperature, ok);
      if (!ok) {
        const unsigned b = 0xFFFFFFFFu - (unsigned)id;
        bad = b > bad ? b : bad;
        w = neg_inf;
      }
    }
    if (p.temperature > 0.0f) z[id] = w;  // (a greedy row ends in this kernel: no later one reads z)
    const unsigned long long key = logit_key(w, id);
    chunk_sel = key > chunk_sel ? key : chunk_sel;  // of every z, as topk_threshold's chunk_best ranks z
    if (w != neg_inf) {
      ++finite;
      top = key > top ? key : top;
    }
    return v;
  };
  LsePair pair = lse_empty();  // the tile's (the CTA's thread 0, a warp's lane 0)
  if constexpr (kCtaTile) {
    float v[kStepsPerThread];  // every load in flight before the first token's stores
    tile_steps(count, 0.0f, [&](int i) { return x[tile.first + i]; }, v);
#pragma unroll
    for (int j = 0; j < kStepsPerThread; ++j) {
      const int i = tile_step_index(j);
      v[j] = i < count ? token((int)tile.first + i, v[j], sel[0]) : neg_inf;
    }
    pair = tile_pair(v, sm);
  } else {
    LaneLse lse;
    lane_chunks(count, 0.0f, [&](int i) { return x[tile.first + i]; }, [&](int c, float(&v)[kWarpChunk]) {
      unsigned long long chunk_sel = 0;
#pragma unroll
      for (int j = 0; j < kWarpChunk; ++j) {
        const int i = lane + (c + j) * kCanonLanes;
        v[j] = i < count ? token((int)tile.first + i, v[j], chunk_sel) : neg_inf;  // -inf pushes nothing
      }
      if (c < kWarpTileSteps / 2) sel[0] = chunk_sel > sel[0] ? chunk_sel : sel[0];
      else sel[1] = chunk_sel > sel[1] ? chunk_sel : sel[1];
      lse.push(v);
    });
    pair = warp_lse_join(lse.pair());
  }
  top = warp_max(top);
  for (int off = 16; off >= 1; off >>= 1) {
    const unsigned o = __shfl_xor_sync(0xffffffffu, bad, off);
    bad = o > bad ? o : bad;
    finite += __shfl_xor_sync(0xffffffffu, finite, off);
  }
  if (a.sel.best) {
    sel[0] = warp_max(sel[0]);
    sel[1] = warp_max(sel[1]);
  }
  if (lane == 0) {
    warp_top[warp] = top;
    warp_bad[warp] = bad;
    warp_finite[warp] = finite;
    warp_sel[warp][0] = sel[0];
    warp_sel[warp][1] = sel[1];
  }
  __syncthreads();
  // the tile's pair and top_k's chunk bests (a last tile may hold one chunk)
  const int64_t chunks = top_k_chunks(a.V);
  if (kCtaTile ? threadIdx.x == 0 : lane == 0 && count > 0) {
    a.pairs_a[k * tiles + tile.index] = pair;
    if (a.sel.best)
      for (int c = 0; c < 2 && 2 * tile.index + c < chunks; ++c) {
        unsigned long long b = 0;
        if (kCtaTile)  // warps 0-3 hold the first chunk's ids, 4-7 the second's
          for (int w = c * kTileWarps / 2; w < (c + 1) * kTileWarps / 2; ++w) b = warp_sel[w][0] > b ? warp_sel[w][0] : b;
        else
          b = sel[c];
        a.sel.best[k * chunks + 2 * tile.index + c] = b;
      }
  }
  SampleRowState& row = a.rows[k];
  if (threadIdx.x == 0) {
    for (int w = 1; w < kWarps; ++w) {  // warps past the row's end hold nothing
      top = warp_top[w] > top ? warp_top[w] : top;
      bad = warp_bad[w] > bad ? warp_bad[w] : bad;
      finite += warp_finite[w];
    }
    if (top) atomicMax(&row.top_key, top);
    if (bad) atomicMax(&row.bad, bad);
    if (finite) atomicAdd(&row.finite, finite);
  }
  if (!finished_row(a.done + k, (unsigned)tiles, sm, (unsigned)tile.cta_tiles)) return;
  if (a.sel.best) {  // the row's top_k threshold from its chunk bests (every thread of the CTA)
    threshold_of_bests<kCtaTile ? kTileThreads : kWarpTileThreads, kLseTile / 2>(
        a.sel.best + k * chunks, chunks, a.sel_k, reinterpret_cast<unsigned long long*>(sm.exps), a.sel.threshold + k);
    __syncthreads();  // the staged bests' shared memory becomes join_row's
  }
  if (warp != 0) return;
  // what lane 0 finishes the row from, in flight while the warp joins the pairs
  const unsigned long long top_key = __ldcg(&row.top_key);
  const unsigned bad_key = __ldcg(&row.bad);
  const bool greedy = !(p.temperature > 0.0f);
  const float x_top = greedy && top_key ? __ldcg(x + logit_key_id(top_key)) : 0.0f;  // another CTA's write, folded
  const LsePair root = join_row(a.pairs_a + k * tiles, tiles, sm);
  if (lane != 0) return;
  a.done[k] = 0;
  const float lse_row = lse_value(root);
  row.row_lse = lse_row;
  SampleResult r{kSampleOk, 0, 0.0f, 0.0f, 0.0f};
  if (bad_key) {
    r.status = kSampleNonFinite;
    r.token = (int32_t)logit_key_id(bad_key);
  } else if (!top_key) {
    r.status = kSampleEmpty;
    r.token = -1;
  } else if (greedy) {  // the kept set is the top token alone (sample_raw_side)
    r.token = (int32_t)logit_key_id(top_key);
    const float d = x_top - lse_row;
    r.logprob = x_top - lse_row;
    r.kept_mass = canon_exp_nonpos(d < 0.0f ? d : 0.0f);
  }
  a.out[k] = r;
  if (greedy) {  // greedy rows end here
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

// A token's place in the kept-set order (descending: larger z, then the lower id)
// in 32 + id_bits bits.
__device__ __forceinline__ unsigned long long order_key(const SampleKargs& a, float z, int64_t id) {
  return ((logit_key(z, 0) >> 32) << a.id_bits) | (a.id_mask - (unsigned)id);
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
    if (zi != lse_neg_inf()) key |= order_key(a, zi, i);
    a.keys[r * a.V + i] = key;
  }
}

// Row k's top_k cut (sample_kept_set: only when top_k < the count of finite z):
// last_id, the top_k-th token of the kept-set order, is the threshold.
__device__ __forceinline__ void set_top_k_cut(const SampleKargs& a, int64_t k, int top_k, int last_id) {
  SampleRowState& r = a.rows[k];
  r.has_cut = 0;
  if (top_k > 0 && (unsigned)top_k < r.finite) {
    r.has_cut = 1;
    r.thr_id = last_id;
    r.thr_z = a.z[k * a.V + last_id];
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

// The kept set from topk_threshold's best_k best z of each row (best_ids and
// best_z [rows x best_k], in the kept-set order: larger z, then the lower id;
// best_k is the top_k the graph was built for), one CTA a row of a group
// starting at row0, in place of top_p's select and sample_kept: whatever the
// cuts keep is among those tokens. They are the finite ones of the k best
// (all of the row's finite z where top_k does not cut), then top_p's shortest
// prefix of them reaching its fixed-point mass, then min_p. The kept set's
// canonical pairs come from its tokens alone: a dropped token's -inf adds
// nothing to its lane (lse_push), and a pair merged with an empty one is that
// pair, bit for bit (lse_merge: fmaf(s, 1, 0), 0 * 0 + s), so the lanes,
// the lanes' butterfly and the tile tree over the kept tokens give the bits of
// the whole row's; each warp builds tiles' pairs from the tokens of that
// tile, and join_row joins them.
constexpr int kKeptBestMax = 512;  // topk_threshold's largest k (topk.cu's kSelRankKeys)
constexpr int kKeptBestPerThread = kKeptBestMax / kTileThreads;

__global__ void __launch_bounds__(kTileThreads) sample_kept_best_kernel(SampleKargs a, int row0,
                                                                        const int64_t* best_ids, const float* best_z,
                                                                        int best_k) {
  pdl_launch_dependents();
  __shared__ TileSmem sm;
  __shared__ int ids_s[kKeptBestMax];
  __shared__ float z_s[kKeptBestMax], x_s[kKeptBestMax];
  using Scan = cub::BlockScan<unsigned long long, kTileThreads>;
  __shared__ typename Scan::TempStorage scan;
  const int64_t r = blockIdx.x, k = row0 + r;
  __shared__ uint64_t position_s;
  if (threadIdx.x == 0) position_s = a.positions[k];
  const SampleParams p = cta_params(a);
  const uint64_t position = position_s;
  SampleRowState& row = a.rows[k];
  SampleResult& out = a.out[k];
  const float* x = a.x + k * a.V;
  const float neg_inf = lse_neg_inf();
  const int tiles = (int)lse_tile_count(a.V);
  const bool ok = out.status == kSampleOk;  // else sample_prep's verdict stands
  const float m = row_top_z(a, k);

  // this thread's candidates: ranks j = threadIdx.x * kKeptBestPerThread + i of the order
  int id[kKeptBestPerThread];
  float zj[kKeptBestPerThread];
  bool kept[kKeptBestPerThread];
  unsigned long long w[kKeptBestPerThread];
#pragma unroll
  for (int i = 0; i < kKeptBestPerThread; ++i) {
    const int j = threadIdx.x * kKeptBestPerThread + i;
    kept[i] = false;
    id[i] = 0;
    zj[i] = neg_inf;
    if (ok && j < best_k) {
      id[i] = (int)best_ids[r * best_k + j];
      zj[i] = best_z[r * best_k + j];
      kept[i] = zj[i] != neg_inf;
    }
    w[i] = kept[i] && p.top_p < 1.0f ? sample_top_p_weight(zj[i], m) : 0ull;
  }
  if (p.top_p < 1.0f) {  // the shortest prefix whose mass reaches ceil(top_p * S) (sample_top_p_count)
    unsigned long long mine = 0, before, total;
#pragma unroll
    for (int i = 0; i < kKeptBestPerThread; ++i) mine += w[i];
    Scan(scan).ExclusiveSum(mine, before, total);
    const unsigned long long target = sample_top_p_target(total, p.top_p);
    unsigned long long c = before;
#pragma unroll
    for (int i = 0; i < kKeptBestPerThread; ++i) {
      const int j = threadIdx.x * kKeptBestPerThread + i;
      if (j > 0 && c >= target) kept[i] = false;  // the prefix before it reached the target already
      c += w[i];
    }
  }
  // min_p, then the kept tokens into shared memory in increasing id (a token's
  // place: the kept ids below it; ids are distinct)
  __shared__ unsigned count_s;
  if (threadIdx.x == 0) count_s = 0;
  __syncthreads();
  int slot[kKeptBestPerThread];
#pragma unroll
  for (int i = 0; i < kKeptBestPerThread; ++i) {
    if (kept[i] && p.min_p > 0.0f && canon_exp_nonpos(zj[i] - m) < p.min_p) kept[i] = false;
    slot[i] = kept[i] ? (int)atomicAdd(&count_s, 1u) : -1;
    if (slot[i] >= 0) ids_s[slot[i]] = id[i];  // unsorted for now
  }
  __syncthreads();
  const int n = (int)count_s;
  unsigned long long race = 0;
#pragma unroll
  for (int i = 0; i < kKeptBestPerThread; ++i) {
    if (slot[i] < 0) continue;
    int below = 0;
    for (int q = 0; q < n; ++q) below += ids_s[q] < id[i];
    slot[i] = below;
    const float key = sample_race_key(zj[i], m, p.seed, position, id[i]);
    const unsigned long long packed = logit_key(key, id[i]);  // ranked as a logit: larger, then lower id
    race = packed > race ? packed : race;
  }
  race = cta_max<kTileThreads>(race);  // (its barriers: every thread has read ids_s)
#pragma unroll
  for (int i = 0; i < kKeptBestPerThread; ++i)
    if (slot[i] >= 0) {
      ids_s[slot[i]] = id[i];
      z_s[slot[i]] = zj[i];
      x_s[slot[i]] = x[id[i]];
    }
  __syncthreads();

  // each tile's pairs (lse_tile: lane l pushes the tile's kept ids = l (mod 32) in
  // increasing id, then the butterfly). A tile without a kept token is empty; with
  // one, it is that token's lane pair, which the butterfly's merges with empty lanes
  // leave as it is; a warp builds each tile of several.
  const bool z_pair = a.kept_z_pair, raw_pair = a.kept_raw_pair;
  const int lane = threadIdx.x % kCanonLanes, warp = threadIdx.x / kCanonLanes;
  LsePair* const zpairs = a.pairs_a + k * tiles;
  LsePair* const xpairs = a.pairs_b + k * tiles;
  for (int tile = threadIdx.x; tile < tiles; tile += kTileThreads) zpairs[tile] = xpairs[tile] = lse_empty();
  __shared__ int2 runs[kKeptBestMax / 2];  // [first, end) of the sorted kept tokens of a tile holding several
  __shared__ unsigned n_runs;
  if (threadIdx.x == 0) n_runs = 0;
  __syncthreads();  // (the empty pairs are written before any tile's own)
  for (int q = threadIdx.x; q < n; q += kTileThreads) {
    const int tile = ids_s[q] / kLseTile;
    if (q > 0 && ids_s[q - 1] / kLseTile == tile) continue;  // not the first of its tile
    int end = q + 1;
    while (end < n && ids_s[end] / kLseTile == tile) ++end;
    if (end == q + 1) {
      zpairs[tile] = lse_push(lse_empty(), z_s[q]);
      xpairs[tile] = lse_push(lse_empty(), x_s[q]);
    } else {
      runs[atomicAdd(&n_runs, 1u)] = make_int2(q, end);
    }
  }
  __syncthreads();
  for (int u = warp; u < (int)n_runs; u += kTileWarps) {
    const int2 run = runs[u];
    LsePair zp = lse_empty(), xp = lse_empty();
    for (int q = run.x; q < run.y; ++q)
      if (ids_s[q] % kCanonLanes == lane) {
        zp = lse_push(zp, z_s[q]);
        xp = lse_push(xp, x_s[q]);
      }
    zp = warp_lse_join(zp);
    xp = warp_lse_join(xp);
    if (lane == 0) {
      const int tile = ids_s[run.x] / kLseTile;
      zpairs[tile] = zp;
      xpairs[tile] = xp;
    }
  }
  __syncthreads();  // every tile's pairs are written (join_row reads them through L2)
  // the two tile trees at once, in warps 0 and 1
  __shared__ TileSmem sm_raw;
  __shared__ LsePair roots[2];
  if (warp == 0 && z_pair) {
    const LsePair root = join_row(zpairs, tiles, sm);
    if (lane == 0) roots[0] = root;
  }
  if (warp == 1 && raw_pair) {
    const LsePair root = join_row(xpairs, tiles, sm_raw);
    if (lane == 0) roots[1] = root;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  const LsePair kept_pair = z_pair ? roots[0] : lse_empty(), raw_root = raw_pair ? roots[1] : lse_empty();
  if (ok) {
    out.token = (int32_t)logit_key_id(race);
    const float zt = a.z[k * a.V + out.token];
    out.processed_logprob = zt - (z_pair ? lse_value(kept_pair) : row.row_lse);
    const float d = (raw_pair ? lse_value(raw_root) : row.row_lse) - row.row_lse;  // sample_raw_side
    out.logprob = x[out.token] - row.row_lse;
    out.kept_mass = canon_exp_nonpos(d < 0.0f ? d : 0.0f);
  }
  a.result[k] = out;  // the row's last kernel
  row = SampleRowState{};
}

// The kept set (the order cut, min_p): the pairs of its z and of its raw
// logits, the race, and the finish of each row's draw. Launched as
// sample_prep (launch_sample_tiles); the finishing CTA joins the two rows of
// pairs at once (warps 0 and 1).
template <bool kCtaTile>
__global__ void __launch_bounds__(kCtaTile ? kTileThreads : kWarpTileThreads, kCtaTile ? 4 : 8)
    sample_kept_kernel(SampleKargs a, int row0) {
  pdl_launch_dependents();
  constexpr int kWarps = kCtaTile ? kTileWarps : kWarpTiles;
  __shared__ TileSmem sm, sm_raw;
  __shared__ unsigned long long warp_race[kWarps];
  __shared__ LsePair roots[2];
  const int lane = threadIdx.x % kCanonLanes, warp = threadIdx.x / kCanonLanes;
  const int64_t k = row0 + blockIdx.y;
  const TileSpan tile = kCtaTile ? TileSpan(a.V, 1, 0) : TileSpan(a.V, kWarpTiles, warp);
  const int tiles = (int)lse_tile_count(a.V);
  const int count = tile.count;
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
  if (row.top_key) {
    const int top = (int)logit_key_id(row.top_key);
    z_floor = race_z_floor(sample_race_key(m, m, p.seed, position, top));
  }
  const bool z_pair = a.kept_z_pair, raw_pair = a.kept_raw_pair;
  unsigned long long race = 0;
  // one token (zi: its z; raw(): its raw logit): whether it is kept (zk, xk:
  // its z and raw logit, or -inf), and its clock in the race
  auto token = [&](int id, float zi, auto raw, float& zk, float& xk) {
    bool kept = zi != neg_inf && within_cut(row, zi, id);
    if (kept && p.min_p > 0.0f && canon_exp_nonpos(zi - m) < p.min_p) kept = false;
    zk = kept ? zi : neg_inf;
    xk = kept && raw_pair ? raw() : neg_inf;
    if (!kept || zi - m < z_floor) return;
    const float key = sample_race_key(zi, m, p.seed, position, id);
    const unsigned long long packed = logit_key(key, id);  // ranked as a logit: larger, then lower id
    race = packed > race ? packed : race;
  };
  LsePair zpair = lse_empty(), xpair = lse_empty();  // the tile's (the CTA's thread 0, a warp's lane 0)
  if constexpr (kCtaTile) {
    float zk[kStepsPerThread], xk[kStepsPerThread];  // every load in flight before the first token
    tile_steps(count, neg_inf, [&](int i) { return __ldg(z + tile.first + i); }, zk);
    tile_steps(count, neg_inf, [&](int i) { return raw_pair ? __ldg(x + tile.first + i) : neg_inf; }, xk);
#pragma unroll
    for (int j = 0; j < kStepsPerThread; ++j) {
      const int i = tile_step_index(j);
      const float xi = xk[j];
      xk[j] = neg_inf;
      if (i < count) token((int)tile.first + i, zk[j], [&] { return xi; }, zk[j], xk[j]);
    }
    if (z_pair) zpair = tile_pair(zk, sm);  // uniform over the CTA: every thread calls or none
    if (raw_pair) xpair = tile_pair(xk, sm);
  } else {
    LaneLse zl, xl;
    lane_chunks(count, neg_inf, [&](int i) { return __ldg(z + tile.first + i); }, [&](int c, float(&zk)[kWarpChunk]) {
      float xk[kWarpChunk];
#pragma unroll
      for (int j = 0; j < kWarpChunk; ++j) {
        const int id = (int)tile.first + lane + (c + j) * kCanonLanes;
        token(id, zk[j], [&] { return __ldg(x + id); }, zk[j], xk[j]);
      }
      if (z_pair) zl.push(zk);
      if (raw_pair) xl.push(xk);
    });
    if (z_pair) zpair = warp_lse_join(zl.pair());
    if (raw_pair) xpair = warp_lse_join(xl.pair());
  }
  race = warp_max(race);
  if (lane == 0) warp_race[warp] = race;
  if (kCtaTile ? threadIdx.x == 0 : lane == 0 && count > 0) {
    a.pairs_a[k * tiles + tile.index] = zpair;
    a.pairs_b[k * tiles + tile.index] = xpair;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kWarps; ++w) race = warp_race[w] > race ? warp_race[w] : race;
    if (race) atomicMax(&a.rows[k].race_key, race);
  }
  if (!finished_row(a.done + k, (unsigned)tiles, sm, (unsigned)tile.cta_tiles)) return;
  // what thread 0 finishes the draw from, in flight while warps 0 and 1 join the pairs
  SampleRowState& r = a.rows[k];
  SampleResult out{};
  unsigned long long race_key = 0;
  float row_lse = 0.0f, z_won = 0.0f, x_won = 0.0f;
  if (threadIdx.x == 0) {
    out = a.out[k];
    race_key = __ldcg(&r.race_key);
    row_lse = r.row_lse;
    if (out.status == kSampleOk) {
      out.token = (int32_t)logit_key_id(race_key);
      z_won = z[out.token];
      x_won = x[out.token];
    }
  }
  if (warp == 0 && z_pair) {
    const LsePair root = join_row(a.pairs_a + k * tiles, tiles, sm);
    if (lane == 0) roots[0] = root;
  }
  if (warp == 1 && raw_pair) {
    const LsePair root = join_row(a.pairs_b + k * tiles, tiles, sm_raw);
    if (lane == 0) roots[1] = root;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  const LsePair kept_pair = z_pair ? roots[0] : lse_empty(), raw_root = raw_pair ? roots[1] : lse_empty();
  a.done[k] = 0;
  if (out.status == kSampleOk) {  // else sample_prep's verdict stands
    out.processed_logprob = z_won - (z_pair ? lse_value(kept_pair) : row_lse);
    const float d = (raw_pair ? lse_value(raw_root) : row_lse) - row_lse;  // sample_raw_side
    out.logprob = x_won - row_lse;
    out.kept_mass = canon_exp_nonpos(d < 0.0f ? d : 0.0f);
  }
  a.out[k] = out;
  a.result[k] = out;  // the row's last kernel
  r = SampleRowState{};
}

// ---------------------------------------------------------------- top_p's select
//
// top_p's cut is the shortest prefix of the kept-set order whose fixed-point
// mass reaches T = sample_top_p_target(S, top_p) (muser/sample.h): integer
// sums, so it is found like a radix select, with masses in place of counts,
// and no sort of the row. The region holding the cut narrows in steps:
//   Start    bins of m - z, 1/64 wide (in the order: ascending), S and T;
//   Refine   the region's next 11 bits of the order key (descending);
//   Collect  a region of at most kTopPCandidates tokens: their (key, weight)
//            pairs in the order (a bitonic sort in shared memory), and the
//            crossing -- the cut's last token, top_p's
//            (thr_z, thr_id).
// Two grids over the row's tiles: the first adds each token's weight into its
// d-bin (shared memory, then the row's bins) and its finishing CTA picks the
// region; the second collects the region's candidates, or, where the region
// is larger (a plateau of more than kTopPCandidates tokens 1/64 wide), adds
// one digit's bins, and its finishing CTA goes on alone over the row, a digit
// at a time, until a region fits (every digit narrows it; the whole key is one
// token), then orders the candidates and finds the crossing.
constexpr int kTopPDigitBits = 11;
static_assert(kTopPBins == 1 << kTopPDigitBits, "a bin per digit value");
constexpr float kTopPDbinsPerUnit = 64.0f;
constexpr int kTopPPerThread = kTopPBins / kTileThreads;  // bins a thread picks from; candidates it sorts
static_assert(kTopPCandidates == kTopPPerThread * kTileThreads && kTopPCandidates <= kTopPBins,
              "the blocked slices hold the candidates, the bins their order");
enum TopPPhase : int32_t { kTopPStart = 0, kTopPRefine = 1, kTopPCollect = 2, kTopPDone = 3 };

// pass 0's bin of a finite z (non-decreasing as z falls: ties share one)
__device__ __forceinline__ int top_p_dbin(float z, float m) {
  const float f = (m - z) * kTopPDbinsPerUnit;
  return f < (float)(kTopPBins - 1) ? (int)f : kTopPBins - 1;
}

using TopPScan = cub::BlockScan<unsigned long long, kTileThreads>;
union TopPSmem {
  struct {
    unsigned long long mass[kTopPBins];
    unsigned count[kTopPBins];
  } bins;
  struct {  // a tile's bins (top_p_scan<true>): the mass in halves, the count where bins' is
    unsigned high[kTopPBins], low[kTopPBins], count[kTopPBins];
  } tile;
  typename TopPScan::TempStorage scan;
};

// The region the next step narrows (SampleRowState's tp_ fields).
struct TopPRegion {
  unsigned long long rem, prefix;
  int bits, dbin, phase;
};

// The width of the digit a Refine step bins (the key's next bits, 11 or what is left).
__device__ __forceinline__ int top_p_width(const SampleKargs& a, const TopPRegion& g) {
  const int left = 32 + a.id_bits - g.bits;
  return left < kTopPDigitBits ? left : kTopPDigitBits;
}

// A tile's bins (one CTA's scan of at most kLseTile ids) keep each bin's mass
// as two 32-bit sums, of its weights' high and low kTopPLowBits bits: adds
// the SM does in one instruction, where a 64-bit add in shared memory is a
// compare-and-swap loop that the tokens of one bin retry in turn. A weight is
// at most 2^38 (sample_top_p_fixed's scale), so neither half's sum over a
// tile overflows. Scans of a whole row keep 64-bit masses.
constexpr int kTopPLowBits = 19;
static_assert((double)kLseTile * (1u << kTopPLowBits) <= 4294967295.0 &&
                  (double)kLseTile * (kTopPScale / (1u << kTopPLowBits)) <= 4294967295.0,
              "a tile's sums of either half fit 32 bits");

// One token of top_p_scan (id, its z): its weight into the shared bins or its
// (key, weight) into the candidates.
template <bool kTileBins>
__device__ __forceinline__ void top_p_token(const SampleKargs& a, const SampleRowState& st, const TopPRegion& g, int id,
                                            float zi, float m, int key_bits, int width, int shift, TopPSmem& sm,
                                            unsigned* n, unsigned long long* cand) {
  if (zi == lse_neg_inf() || !within_cut(st, zi, id)) return;
  const int dbin = top_p_dbin(zi, m);
  int bin = dbin;
  if (g.phase != kTopPStart) {
    if (dbin != g.dbin) return;
    const unsigned long long key = order_key(a, zi, id);
    if (g.bits > 0 && (key >> (key_bits - g.bits)) != g.prefix) return;
    if (g.phase == kTopPCollect) {
      const unsigned at = atomicAdd(n, 1u);  // < kTopPCandidates: the region's count
      cand[2 * at] = key;
      cand[2 * at + 1] = sample_top_p_weight(zi, m);
      return;
    }
    bin = (int)((key >> shift) & ((1u << width) - 1));
  }
  const unsigned long long w = sample_top_p_weight(zi, m);
  if (kTileBins) {
    const unsigned high = (unsigned)(w >> kTopPLowBits);
    if (high) atomicAdd(&sm.tile.high[bin], high);  // 0 for most of a row's tail
    atomicAdd(&sm.tile.low[bin], (unsigned)w & ((1u << kTopPLowBits) - 1));
    atomicAdd(&sm.tile.count[bin], 1u);
  } else {
    atomicAdd(&sm.bins.mass[bin], w);
    atomicAdd(&sm.bins.count[bin], 1u);
  }
}

// This thread's ids i0 + threadIdx.x, + kTileThreads, ... < i1 of row z: the
// region's weights into the shared bins (Start, Refine; kTileBins: one tile's,
// sm.tile) or its candidates into cand, counted by *n (Collect). The bins are
// zero before; sync after.
template <bool kTileBins>
__device__ __forceinline__ void top_p_scan(const SampleKargs& a, const SampleRowState& st, const TopPRegion& g,
                                           const float* z, float m, int64_t i0, int64_t i1, TopPSmem& sm, unsigned* n,
                                           unsigned long long* cand) {
  const int key_bits = 32 + a.id_bits, width = top_p_width(a, g), shift = key_bits - g.bits - width;
  // a tile's worth of ids at a time, every load of it in flight before the first
  // token's bins (one round trip to L2 where a load per id waited on the last)
  for (int64_t base = i0 + threadIdx.x; base < i1; base += (int64_t)kStepsPerThread * kTileThreads) {
    float zs[kStepsPerThread];
#pragma unroll
    for (int j = 0; j < kStepsPerThread; ++j) {
      const int64_t i = base + (int64_t)j * kTileThreads;
      zs[j] = i < i1 ? z[i] : lse_neg_inf();
    }
#pragma unroll
    for (int j = 0; j < kStepsPerThread; ++j)
      top_p_token<kTileBins>(a, st, g, (int)(base + (int64_t)j * kTileThreads), zs[j], m, key_bits, width, shift, sm, n,
                           cand);
  }
}

// Zero bins for a scan; sm.tile's are the same bytes as sm.bins'.
__device__ __forceinline__ void top_p_zero_bins(TopPSmem& sm) {
  for (int b = threadIdx.x; b < kTopPBins; b += kTileThreads) {
    sm.bins.mass[b] = 0;
    sm.bins.count[b] = 0;
  }
}
static_assert(sizeof(TopPSmem::tile) == sizeof(TopPSmem::bins) &&
                  offsetof(TopPSmem, tile.count) == offsetof(TopPSmem, bins.count),
              "zeroing bins zeroes a tile's bins");

// In a finishing CTA (every thread calls it): v[kTopPPerThread] is this
// thread's consecutive slice of the order; the one item where the prefix mass
// first reaches T (none for T = 0): its index in the thread that holds it, with
// the mass before it in `before`; -1 in every other thread.
__device__ __forceinline__ int top_p_crossing(const unsigned long long (&v)[kTopPPerThread], unsigned long long T,
                                              TopPSmem& sm, unsigned long long& before) {
  unsigned long long mine = 0, total;
#pragma unroll
  for (int i = 0; i < kTopPPerThread; ++i) mine += v[i];
  TopPScan(sm.scan).ExclusiveSum(mine, before, total);
  unsigned long long c = before;
  int at = -1;
#pragma unroll
  for (int i = 0; i < kTopPPerThread; ++i) {
    const unsigned long long prev = c;
    c += v[i];
    if (at < 0 && prev < T && c >= T) {
      at = i;
      before = prev;
    }
  }
  return at;
}

// In a finishing CTA (every thread calls it, the bins in v and c as top_p_crossing
// reads them): the next region into g (shared), the same in every thread after.
__device__ __forceinline__ void top_p_pick(const unsigned long long (&v)[kTopPPerThread],
                                           const unsigned (&c)[kTopPPerThread], float top_p, int width, TopPSmem& sm,
                                           TopPRegion& g) {
  __syncthreads();  // the bins' shared memory becomes the scan's
  unsigned long long T = g.rem, before;
  if (g.phase == kTopPStart) {  // S is the bins' total, and T follows it
    unsigned long long mine = 0, total;
#pragma unroll
    for (int i = 0; i < kTopPPerThread; ++i) mine += v[i];
    TopPScan(sm.scan).ExclusiveSum(mine, before, total);
    __syncthreads();
    T = total ? sample_top_p_target(total, top_p) : 0;
  }
  const int at = top_p_crossing(v, T, sm, before);
  const TopPRegion was = g;
  __syncthreads();  // every thread has read g
  if (at >= 0) {
    const int pos = threadIdx.x * kTopPPerThread + at;
    g.rem = T - before;
    if (was.phase == kTopPStart) {
      g.dbin = pos;
    } else {
      g.prefix = (was.prefix << width) | (unsigned long long)((1 << width) - 1 - pos);
      g.bits = was.bits + width;
    }
    g.phase = c[at] <= (unsigned)kTopPCandidates ? kTopPCollect : kTopPRefine;
  } else if (threadIdx.x == 0 && T == 0) {
    g.phase = kTopPDone;  // nothing kept: no cut
  }
  __syncthreads();
}

// The bin at item i of this thread's slice of the order (Start: ascending
// d-bins; Refine: descending digits, of `width` bits); negative past the digits.
__device__ __forceinline__ int top_p_slice_bin(int i, bool ascending, int width) {
  const int pos = threadIdx.x * kTopPPerThread + i;
  return ascending ? pos : (1 << width) - 1 - pos;
}

// The bins in the order, this thread's slice (top_p_slice_bin), from mass / count.
template <class PM, class PC>
__device__ __forceinline__ void top_p_take_bins(PM mass, PC count, bool ascending, int width,
                                                unsigned long long (&v)[kTopPPerThread], unsigned (&c)[kTopPPerThread]) {
#pragma unroll
  for (int i = 0; i < kTopPPerThread; ++i) {
    const int b = top_p_slice_bin(i, ascending, width);
    v[i] = 0;
    c[i] = 0;
    if (b >= 0) {
      v[i] = mass(b);
      c[i] = count(b);
    }
  }
}

// In a finishing CTA (every thread calls it): the region's n candidates in the
// order, keys descending, in sm.bins.mass[0, n) with each one's slot in `cand`
// in sm.bins.count. A bitonic sort of the next power of two (zeros pad: below
// every token's key; the keys are distinct, so the order is the one order):
// log2(P)(log2(P)+1)/2 steps of P/2 compare-exchanges, ~1 us at the usual
// handful, where a 50-bit radix sort of every slot took ~20.
__device__ __forceinline__ void top_p_order_candidates(const unsigned long long* cand, unsigned n, TopPSmem& sm) {
  unsigned long long* const key = sm.bins.mass;
  unsigned* const slot = sm.bins.count;
  unsigned P = 2;
  while (P < n) P <<= 1;
  for (unsigned i = threadIdx.x; i < P; i += kTileThreads) {
    key[i] = i < n ? __ldcg(&cand[2 * i]) : 0ull;
    slot[i] = i;
  }
  __syncthreads();
  for (unsigned k = 2; k <= P; k <<= 1)
    for (unsigned j = k >> 1; j > 0; j >>= 1) {
      for (unsigned i = threadIdx.x; i < P / 2; i += kTileThreads) {
        const unsigned lo = ((i & ~(j - 1)) << 1) | (i & (j - 1)), hi = lo + j;
        const bool descending = (lo & k) == 0;  // the whole array when k == P
        const unsigned long long x = key[lo], y = key[hi];
        if (descending ? x < y : x > y) {
          key[lo] = y;
          key[hi] = x;
          const unsigned was = slot[lo];
          slot[lo] = slot[hi];
          slot[hi] = was;
        }
      }
      __syncthreads();
    }
}

// pass 0: the d-bins; pass 1: the region's candidates (or a digit), then the cut.
__global__ void __launch_bounds__(kTileThreads) sample_top_p_pass_kernel(SampleKargs a, int row0, int pass) {
  pdl_launch_dependents();
  __shared__ TopPSmem sm;
  __shared__ TopPRegion g;
  __shared__ unsigned last_flag;
  const int64_t r = blockIdx.y, k = row0 + r, i0 = (int64_t)blockIdx.x * kLseTile;
  const int64_t i1 = a.V - i0 < kLseTile ? a.V : i0 + kLseTile;
  const SampleParams p = cta_params(a);
  SampleRowState& row = a.rows[k];
  const SampleRowState st = row;  // the previous pass's verdict, the top_k cut
  if (pass > 0 && st.tp_phase == kTopPDone) return;
  const float* z = a.z + k * a.V;
  const float m = row_top_z(a, k);
  unsigned long long* gmass = a.tp_mass + r * kTopPBins;
  unsigned* gcount = a.tp_count + r * kTopPBins;
  unsigned long long* cand = a.tp_cand + r * kTopPCandidates * 2;
  if (threadIdx.x == 0)
    g = pass == 0 ? TopPRegion{0, 0, 0, 0, kTopPStart}
                  : TopPRegion{st.tp_rem, st.tp_prefix, st.tp_bits, st.tp_dbin, st.tp_phase};
  __syncthreads();
  const bool bins = g.phase != kTopPCollect;
  const int width = top_p_width(a, g);
  if (bins) {
    top_p_zero_bins(sm);
    __syncthreads();
  }
  top_p_scan<true>(a, st, g, z, m, i0, i1, sm, &row.tp_cand, cand);
  if (bins) {
    __syncthreads();
    for (int b = threadIdx.x; b < kTopPBins; b += kTileThreads)
      if (const unsigned count = sm.tile.count[b]) {
        atomicAdd(&gmass[b], ((unsigned long long)sm.tile.high[b] << kTopPLowBits) + sm.tile.low[b]);
        atomicAdd(&gcount[b], count);
      }
  }
  if (!finished_row(a.done + k, gridDim.x, last_flag)) return;
  if (threadIdx.x == 0) a.done[k] = 0;
  unsigned long long v[kTopPPerThread];
  unsigned c[kTopPPerThread];
  if (bins) {
    const bool ascending = g.phase == kTopPStart;
    top_p_take_bins([&](int b) { return __ldcg(&gmass[b]); }, [&](int b) { return __ldcg(&gcount[b]); }, ascending,
                    width, v, c);
#pragma unroll
    for (int i = 0; i < kTopPPerThread; ++i) {  // the bins it took, zero at rest for the next pass and call
      const int b = top_p_slice_bin(i, ascending, width);
      if (b >= 0) {
        gmass[b] = 0;
        gcount[b] = 0;
      }
    }
    top_p_pick(v, c, p.top_p, width, sm, g);
    if (pass == 0) {  // the second grid collects (or refines) the region
      if (threadIdx.x == 0) {
        row.tp_rem = g.rem;
        row.tp_dbin = g.dbin;
        row.tp_phase = g.phase;
      }
      return;
    }
    // a region larger than the candidates: this CTA alone, a digit at a time (each
    // narrows it; after the key's last digit it is one token)
    for (int digits = 0; g.phase == kTopPRefine && digits <= (32 + kSampleMaxIdBits) / kTopPDigitBits; ++digits) {
      const int w = top_p_width(a, g);
      top_p_zero_bins(sm);
      __syncthreads();
      top_p_scan<false>(a, st, g, z, m, 0, a.V, sm, nullptr, nullptr);
      __syncthreads();
      top_p_take_bins([&](int b) { return sm.bins.mass[b]; }, [&](int b) { return sm.bins.count[b]; }, false, w, v,
                      c);
      top_p_pick(v, c, p.top_p, w, sm, g);
    }
    if (g.phase == kTopPCollect) {
      top_p_scan<false>(a, st, g, z, m, 0, a.V, sm, &row.tp_cand, cand);
      __syncthreads();  // every thread's candidates are written
    }
  }
  // the region's candidates in the order (blocked: thread i holds ranks 8i..8i+7),
  // then the crossing
  const unsigned n = g.phase == kTopPCollect ? __ldcg(&row.tp_cand) : 0u;
  top_p_order_candidates(cand, n, sm);
  unsigned long long keys[kTopPPerThread];
#pragma unroll
  for (int q = 0; q < kTopPPerThread; ++q) {
    const unsigned pos = threadIdx.x * kTopPPerThread + q;
    keys[q] = pos < n ? sm.bins.mass[pos] : 0ull;
    v[q] = pos < n ? __ldcg(&cand[2 * sm.bins.count[pos] + 1]) : 0ull;
  }
  __syncthreads();  // the order's shared memory becomes the scan's
  unsigned long long before;
  const int at = top_p_crossing(v, n ? g.rem : 0ull, sm, before);
  if (at >= 0) {
    const int id = (int)(a.id_mask - (unsigned)(keys[at] & a.id_mask));
    row.has_cut = 1;
    row.thr_id = id;
    row.thr_z = z[id];
  }
  if (threadIdx.x == 0) {
    row.tp_phase = kTopPDone;
    row.tp_cand = 0;
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
  epilogue_dispatch(a.fold.op, [&](auto op) {
    constexpr EpilogueOp kOp = decltype(op)::value;
    launch_sample_tiles(sample_prep_kernel<kOp, true>, sample_prep_kernel<kOp, false>, a.V, a.t, stream, "sample_prep",
                        a);
  });
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
  if (k > kKeptBestMax) throw ArgValueError("internal: sample_top_k_by_select takes k <= 512");
  if (a.sel.best) {  // sample_prep left the thresholds (one group: row0 = 0, rows = t)
    if (row0 != 0 || rows != a.t || a.sel_k != k) throw ArgValueError("internal: sample_prep's thresholds are one group's");
    topk_threshold_gather(a.z, a.V, rows, k, select_scratch, select_sync, best_ids, best_z, stream);
  } else {
    topk_threshold(a.z + (int64_t)row0 * a.V, a.V, rows, k, select_scratch, select_sync, best_ids, best_z, stream);
  }
  launch_consumer(sample_kept_best_kernel, dim3((unsigned)rows), dim3(kTileThreads), 0, stream, "sample_kept_best",
                  a, row0, (const int64_t*)best_ids, (const float*)best_z, k);
}

size_t sample_order_scratch_bytes(int64_t V, int rows, int id_bits) {
  size_t bytes = 0;
  check(cub::DeviceRadixSort::SortKeysDescending(nullptr, bytes, (unsigned long long*)nullptr,
                                                 (unsigned long long*)nullptr, (int64_t)rows * V, 0,
                                                 sample_order_bits(id_bits, rows)),
        "the kept-set order's sort (size)");
  return bytes;
}

void sample_kept_pairs(const SampleKargs& a, int row0, int rows, cudaStream_t stream) {
  launch_sample_tiles(sample_kept_kernel<true>, sample_kept_kernel<false>, a.V, rows, stream, "sample_kept_pairs", a,
                      row0);
}

void sample_top_p_select(const SampleKargs& a, int row0, int rows, cudaStream_t stream) {
  const unsigned tiles = (unsigned)lse_tile_count(a.V);
  for (int pass = 0; pass < 2; ++pass)
    launch_consumer(sample_top_p_pass_kernel, dim3(tiles, (unsigned)rows), dim3(kTileThreads),
                    spread_smem((const void*)sample_top_p_pass_kernel, (int64_t)tiles * rows), stream,
                    "sample_top_p_select", a, row0, pass);
}

}  // namespace muser::cuda
