// The CUDA node kernels' checked entry points (host-callable, plain C++).
// Each is the third layer of an op file (src/cuda/<op>.cu): a static
// __global__ kernel, a launcher on a stream, and this checked entry, which
// throws muser::DeviceError when the launch fails. All pointers are device
// pointers; every entry is asynchronous on `stream`.
#pragma once
#include <cuda_runtime_api.h>

#include <cstdint>

#include "muser/kernel_args.h"
#include "muser/logsumexp.h"
#include "muser/sample.h"

namespace muser::cuda {

// ---- norm.cu: one hidden state per row, [t x H], y may not alias x ----
enum class NormOrder {
  Ggml,       // ggml's CPU arithmetic: f32 squares summed in double (parallel), IEEE div/sqrt
  Canonical,  // docs/numerics.md: 32 lanes, fmaf, butterfly tree -- bit-equal to the CPU
};
void rms_norm(const float* x, float* y, int64_t H, int t, float eps, NormOrder order, cudaStream_t stream);
void layer_norm(const float* x, float* y, int64_t H, int t, float eps, NormOrder order, cudaStream_t stream);
// y[k, i] = y[k, i] * v[i] for k < rows, i < n
void mul_rows(float* y, const float* v, int64_t n, int rows, cudaStream_t stream);
// RMSNorm then γ (y = (x r) γ, the bytes of rms_norm then mul_rows) and the q8
// activations of y for weight type `type` into scratch (quantize_acts_q8's
// layout and bytes; then quantize_acts_q8(..., quantized = true)): one kernel.
void rms_norm_gamma_q8(const float* x, float* y, const float* gamma, int64_t H, int t, float eps, NormOrder order,
                       uint32_t type, void* scratch, cudaStream_t stream);

// A consumer kernel (after the route: reductions, selection, sampling) of at
// most this many CTAs -- about one wave of an H200's 132 SMs -- is bound by
// latency: launched with PDL it is scheduled while the route finishes, and it
// may read its few inputs from mapped host memory. A longer grid is bound by
// throughput: launched plainly (with PDL its early CTAs only held SM slots
// through the route: score at t = 256 took 1.31 x the plain call against 1.18),
// its inputs in device memory (a read across the bus per CTA queues there).
constexpr long long kShortGridCtas = 1024;

// ---- epilogue.cu: element-wise over n logits, in place ----
// One element-wise node (epilogue.cuh's epilogue_op), as a consumer kernel
// applies it to each raw logit it loads when the route's only node after the
// matvec is folded into it (f0, f1, f2: the node's own parameters).
enum class EpilogueOp : int { None, Scale, Tanh, SoftcapFused, SoftcapReference, SoftcapCanon };
struct EpilogueFold {
  EpilogueOp op = EpilogueOp::None;
  float f0 = 0.0f, f1 = 0.0f, f2 = 0.0f;
};
// The node f over n logits at y, in place (one launch; None: nothing).
void epilogue(const EpilogueFold& f, float* y, int64_t n, cudaStream_t stream);

// ---- matvec.cu: logits = W x for t tokens ----
// The weight and the logits, as every LM-head matvec (f32 or q8) sees them:
// the shared scalar arguments (muser/kernel_args.h) and the device pointers.
struct WeightArgs : MatvecKargs {
  const uint8_t* w = nullptr;  // device copy of the weight, in the device layout (device_layout.h)
  float* y = nullptr;          // [t x ldy]
};
struct MatvecArgs : WeightArgs {
  const float* x = nullptr;    // [t x ldx]
  uint32_t exponent_bits = 0x4B000000u;  // the float 2^23 (an argument on purpose: matvec.cuh)
};
// Bytes the device allocates after the weight: the matvec prefetches one
// unit past a row unconditionally (cheaper than a branch per unit).
constexpr size_t kWeightPadBytes = 8192;
// Device bytes of a weight in the device layout (device_layout.h: quantized rows
// in tiles of 16, the last one padded), kWeightPadBytes included.
size_t device_weight_bytes(uint32_t type, int64_t rows, int64_t row_bytes);
// Copies a GGUF weight (host memory, rows x row_bytes) into dst
// (device_weight_bytes of device memory) in the device layout, through a
// bounded device staging buffer; synchronous. Once at load.
void upload_weight(uint8_t* dst, const uint8_t* host, uint32_t type, int64_t rows, int64_t row_bytes, int ordinal,
                   cudaStream_t stream);
// Rows ids[0..n) of a weight w in the device layout copied to rows 0..n of dst
// (device_weight_bytes(type, n, row_bytes), zeroed once: its padding stays zero),
// the same layout: a matvec over dst gives those rows' logits. ids may be mapped host memory.
void gather_weight_rows(const uint8_t* w, uint32_t type, int64_t row_bytes, const int64_t* ids, int n, uint8_t* dst,
                        cudaStream_t stream);
// The canonical lane order (docs/numerics.md), bit-equal to the CPU's matvec_canon.
void matvec_canon(const MatvecArgs& a, cudaStream_t stream);
// The scalar oracle: one f32 accumulator per row in index order (slow by design).
void matvec_reference(const MatvecArgs& a, cudaStream_t stream);
// Whether this build's CUDA matvec handles a ggml type.
bool matvec_supports(uint32_t type);

// ---- matvec_q8.cu: acts="q8", the CPU's q8 mode bit for bit (matvec_q8.cuh) ----
// Whether acts="q8" has a kernel for a weight type (Q4_K, Q5_K, Q6_K, Q8_0).
bool q8_supported(uint32_t type);
// The call's selection inside the q8 matvec (launches of at most
// kQ8FoldMaxTokens tokens), each logit taken through the fused node as its key
// (logit_keys.cuh: larger, then the lower id, NaN last). Two kinds:
//  - argmax (ids set): the keys fold into best[token] instead of being stored,
//    so the logits are never written; the launch's last CTA writes ids[token]
//    and leaves best and done zero, as it found them;
//  - top-k partials (ids null): the logits are stored, and each 1,024-id chunk's
//    best key folds into best[token * chunks + chunk] -- what topk_threshold's
//    first kernel computes; the launch's last CTA ranks each token's bests into
//    ranked[token * chunks ...], best first (any k's threshold is one read for
//    topk_threshold_from_bests), and leaves best and done zero.
// In device memory: Q8Args holds a pointer to it (three pointers more in Q8Args
// made the streamed kernel spill).
struct SelectSink {
  unsigned long long* best = nullptr;  // zero before the launch
  unsigned* done = nullptr;            // argmax: CTAs finished, zero before the launch
  int64_t* ids = nullptr;              // argmax: [t] the argmax of each token's logits
  int64_t chunks = 0;                  // top-k: chunks a token (sel_chunks(V))
  unsigned long long* ranked = nullptr;  // top-k: [t x chunks] each token's chunk bests, best first
};
struct Q8Args : WeightArgs, Q8ActsKargs {
  const int8_t* xq = nullptr;     // [t x xq_pitch] quantized activations, zero past cols
  const uint8_t* meta = nullptr;  // [t x meta_per_token] block records (matvec_q8.cuh)
  const uint8_t* meta_f16 = nullptr;  // Q4_K/Q5_K: the same sums as f16 halves, [t x meta_per_token] x 48 bytes
  EpilogueFold fold;              // the element-wise node fused into the matvec, applied as each logit is stored
  const SelectSink* select = nullptr;  // the call's selection (argmax: the logits go to it, not to y)
};
// A q8 matvec call: the kernels' arguments and, where the wgmma kernel takes the
// call (Q4_K/Q5_K batches on sm_90), the same activations in its layout. Apart
// from Q8Args so that the other kernels' parameters stay as they were (one more
// field made the streamed kernel spill).
struct Q8Call : Q8Args {
  const uint8_t* wg = nullptr;  // the wgmma layout (matvec_q8_wgmma_sm90a.cu), or null
  int32_t wg_tokens = 0;        // tokens it holds (zeros past the call's t)
  int32_t wg_k0 = 0;            // its token of this call's token 0
};
// The q8 kernels apply a fused node (Q8Args::fold) for at most this many tokens
// per launch; their larger token tiles run at the register limit (the node's code
// made them spill), so there the node runs as its own kernel.
constexpr int kQ8FoldMaxTokens = 16;
// Bytes of device scratch quantize_acts_q8 needs for t tokens of K columns.
size_t acts_q8_scratch_bytes(uint32_t type, int64_t K, int t);
// Quantizes x [t x ldx] (K columns) into scratch as the CPU's q8 mode does for
// the weight type and points a's xq/meta/t at it.
// quantized: the scratch holds them already (rms_norm_gamma_q8 wrote them): only a's
// pointers (and the wgmma layout) are set.
void quantize_acts_q8(uint32_t type, const float* x, int64_t ldx, int64_t K, int t, void* scratch, Q8Call* a,
                      cudaStream_t stream, bool quantized = false);
// y = W x with a's quantized activations (t <= 64 per launch; larger t in tiles).
void matvec_q8(const Q8Call& a, cudaStream_t stream);
// Tokens [k0, k0 + count) of a's activations, written from row k0 of a.y.
Q8Call q8_tokens(const Q8Call& a, int k0, int count);
// y[k * m + q] = the logit matvec_q8 gives row rows[k * m + q] for a's token k
// (a.fold applied as it applies it), for m rows per token: a warp per pair
// (matvec_q8_pairs.cu). rows may be mapped host memory.
void matvec_q8_pairs(const Q8Call& a, const int64_t* rows, int m, float* y, cudaStream_t stream);

// ---- topk.cu: the k best logits of each row (ties: lowest id; NaN never beats a number) ----
// scratch must hold topk_scratch_bytes(V, t, k) bytes; ids/vals are device [t x k].
size_t topk_scratch_bytes(int64_t V, int t, int k);
void topk(const float* logits, int64_t V, int t, int k, void* scratch, int64_t* ids, float* vals,
          cudaStream_t stream);
// k <= kTopkMax (muser/kernel_args.h); a larger k falls back to the host.
// The same order in one or two kernels for a call's graph (no host decisions
// between them). sync: select_sync_words(t) words, zero before the first
// launch; the kernels leave them zero again.
size_t select_sync_words(int t);
// ids[row] = the argmax of each row (device int64 [t]); scratch: argmax_scratch_bytes.
size_t argmax_scratch_bytes(int64_t V, int t);
void argmax(const float* logits, int64_t V, int t, void* scratch, unsigned* sync, int64_t* ids, cudaStream_t stream);
// Whether topk_threshold takes (V, t, k): k no more than the row's chunks and than
// the candidates it ranks directly (topk() otherwise); any t, in groups of 16 rows.
bool topk_threshold_fits(int64_t V, int t, int k);
size_t topk_threshold_scratch_bytes(int64_t V, int t);
void topk_threshold(const float* logits, int64_t V, int t, int k, void* scratch, unsigned* sync, int64_t* ids,
                    float* vals, cudaStream_t stream);
// Whether the q8 matvec computes topk_threshold's chunk bests for (V, t, k)
// (SelectSink, top-k partials): one group of rows whose bests one CTA ranks.
bool topk_bests_fit(int64_t V, int t, int k);
// topk_threshold's gather with each row's chunk bests already ranked in ranked
// [t x sel_chunks(V)], best first (the matvec's partials): the k-th is the threshold.
void topk_threshold_from_bests(const float* logits, int64_t V, int t, int k, const unsigned long long* ranked,
                               void* scratch, unsigned* sync, int64_t* ids, float* vals, cudaStream_t stream);
// Where topk_threshold's first kernel leaves one group's (t <= 16 rows) chunk bests
// [t x topk_chunks(V)] and thresholds [t] in its scratch, for a kernel that
// computes them itself; topk_threshold_gather is then its second kernel alone.
struct TopkThresholdSlots {
  unsigned long long* best;
  unsigned long long* threshold;
};
TopkThresholdSlots topk_threshold_slots(void* scratch, int64_t V, int t);
void topk_threshold_gather(const float* logits, int64_t V, int t, int k, void* scratch, unsigned* sync, int64_t* ids,
                           float* vals, cudaStream_t stream);
// The chunks topk_threshold splits a row of V logits into (kSelChunk ids each).
int64_t topk_chunks(int64_t V);
// log2 of the ids a chunk holds
constexpr int kTopkChunkShift = 10;

// ---- vocab_reduce.cu: the consumer's reductions over the vocabulary (muser/logsumexp.h) ----
// Bytes of one (max, sum) pair of a tile.
size_t lse_pair_bytes();
// Over t rows of a vocabulary of `vocab` logits, one launch per slice of it:
// this launch's n logits y[k * ld + i] are ids first + i (first: a multiple of
// kLseTile). When the last slice's launch ends: lse[k] = the row's canonical
// logsumexp; for its m chosen ids ids[k * m + q]: values = their logits,
// logprobs = value - lse, ranks = 1 + the ids ranked ahead (ranks_ahead).
// chosen: null when the row's one slice is all of it; else the chosen ids' raw
// logits (before `fold`), chosen[k * chosen_ld + q]. Scratch: pairs [t x the
// vocabulary's tiles]; ahead_acc [t x m] and done [t] must be zero before the
// first launch, and the last slice's launch leaves them zero.
struct VocabReduceArgs {
  const float* y = nullptr;
  int64_t ld = 0, n = 0;
  int64_t first = 0, vocab = 0;
  int t = 0, m = 0;
  const float* chosen = nullptr;
  int64_t chosen_ld = 0;
  const int64_t* ids = nullptr;
  LsePair* pairs = nullptr;
  unsigned long long* ahead_acc = nullptr;
  unsigned* done = nullptr;
  float* lse = nullptr;
  float* values = nullptr;
  float* logprobs = nullptr;
  int64_t* ranks = nullptr;
  EpilogueFold fold;  // applied to each logit as it is loaded (None: y holds the final logits)
};
// ids may be mapped host memory (read before the kernel waits for the route: no
// node writes them); the results may be too (written once, by each row's finish).
void vocab_reduce(const VocabReduceArgs& a, cudaStream_t stream);
// CTAs of vocab_reduce's grid for a slice of n ids of t rows (kShortGridCtas: mapped ids or not).
int64_t vocab_reduce_ctas(int64_t n, int t);
// ---- sample.cu: one draw per row on the device (muser/sample.h's sample_row) ----
// A row's state across the sampling kernels; zero at rest (zeroed once when
// allocated, and again by the row's last kernel), so a graph needs no memset node.
struct SampleRowState {
  unsigned long long top_key;   // the first largest z as an order key (0: no finite z)
  unsigned long long race_key;  // the race's best (key bits, ~id)
  unsigned bad;                 // ~ the first id whose z is not finite (0: none)
  unsigned finite;              // tokens with z > -inf
  int32_t has_cut;              // 0: no order cut; else the last kept (thr_z, thr_id)
  int32_t thr_id;
  float thr_z;
  float row_lse;                // the logits' canonical logsumexp
  // top_p's select (sample_top_p_select): the region of the kept-set order that holds the cut
  unsigned long long tp_rem;     // the mass the cut still needs within the region
  unsigned long long tp_prefix;  // the region's first tp_bits bits of the order key
  int32_t tp_bits;
  int32_t tp_dbin;               // the region's bin of m - z (the first pass's)
  int32_t tp_phase;              // what the next pass does (sample.cu's TopPPhase)
  unsigned tp_cand;              // candidates collected
};
struct SampleKargs {
  float* x = nullptr;  // logits [t x V] (sample_prep applies `fold` to them in place)
  float* z = nullptr;        // scratch [t x V]: the processed logits, -inf where dropped
  int64_t V = 0;
  int t = 0;
  const SampleParams* params = nullptr;  // mapped host memory or device memory, written before the launch (no node writes it)
  const float* bias = nullptr;           // device [V] or null
  const uint8_t* allowed = nullptr;      // device [V] or null
  const uint64_t* positions = nullptr;   // [t], as params
  SampleRowState* rows = nullptr;        // device [t]
  unsigned* done = nullptr;              // device [t], zero at rest (the kernels leave it zero)
  LsePair* pairs_a = nullptr;            // [t x tiles]
  LsePair* pairs_b = nullptr;            // [t x tiles]
  // the kept-set order (top_k, top_p) of a group of rows: one key per token,
  // sorted descending (sample_order); ids take id_bits bits (id_mask)
  unsigned long long* keys = nullptr;         // [rows x V]
  unsigned long long* keys_sorted = nullptr;  // [rows x V]
  int id_bits = 0;
  unsigned id_mask = 0;
  // top_p's select of the t rows, zero at rest: each row's bins (mass, count) and candidates
  unsigned long long* tp_mass = nullptr;  // [rows x kTopPBins]
  unsigned* tp_count = nullptr;           // [rows x kTopPBins]
  unsigned long long* tp_cand = nullptr;  // [rows x kTopPCandidates x 2]: order key, weight
  // which pairs sample_final computes: the kept z's (else z is x and nothing
  // is dropped: the logits' own logsumexp) and the kept raw logits' (else
  // nothing is dropped: the kept set's raw mass is the whole row's)
  bool kept_z_pair = true, kept_raw_pair = true;
  SampleResult* out = nullptr;     // device [t]
  SampleResult* result = nullptr;  // [t] (mapped host memory): each row's result, written by its last kernel
  EpilogueFold fold;            // the route's element-wise node, applied by sample_prep (None: x is final)
  // top_k by selection of one group of rows (sample_top_k_by_select): sample_prep also
  // leaves each row's chunk bests of z and its threshold in topk_threshold's slots
  TopkThresholdSlots sel{nullptr, nullptr};  // null: it does not
  int sel_k = 0;
};
void sample_prep(const SampleKargs& a, cudaStream_t stream);
// Rows [row0, row0 + rows) (a group of at most kSampleOrderRows): their keys,
// one sort, top_k's threshold (where topk_threshold does not take the k).
// sort_scratch: sample_order_scratch_bytes.
constexpr int kSampleOrderRows = 16;
inline int sample_order_bits(int id_bits, int rows) {
  int row_bits = 0;
  while ((1 << row_bits) < rows) ++row_bits;
  return 32 + id_bits + row_bits;
}
void sample_order(const SampleKargs& a, int row0, int rows, void* sort_scratch, size_t sort_bytes,
                  cudaStream_t stream);
size_t sample_order_scratch_bytes(int64_t V, int rows, int id_bits);
// The draw of rows [row0, row0 + rows) where topk_threshold takes (V, rows, k)
// (topk_threshold_fits; the graph bakes k = the call's top_k in), without a sort
// or a pass over the row after it: the rows' k best z (best_ids, best_z: [rows x k]),
// then top_p, min_p, the kept set's pairs and the race over those k alone (in
// place of sample_top_p_select and sample_kept_pairs).
// select_scratch, select_sync: topk_threshold's, for `rows` rows.
void sample_top_k_by_select(const SampleKargs& a, int k, int row0, int rows, void* select_scratch,
                            unsigned* select_sync, int64_t* best_ids, float* best_z, cudaStream_t stream);
// sample_kept over rows [row0, row0 + rows): the kept set's pairs (min_p applied)
// and the draw itself
void sample_kept_pairs(const SampleKargs& a, int row0, int rows, cudaStream_t stream);
// the most id bits the kept-set order's keys hold (32 bits of z beside them, and the
// sort's row bits)
constexpr int kSampleMaxIdBits = 28;
constexpr int kTopPBins = 2048;
constexpr int kTopPCandidates = 2048;
// top_p's cut for rows [row0, row0 + rows) (after top_k's, if any): a radix
// select by fixed-point mass (muser/sample.h's sample_top_p_target), no sort,
// in two grids over the rows' tiles.
void sample_top_p_select(const SampleKargs& a, int row0, int rows, cudaStream_t stream);
// bytes of top_p's scratch for `rows` rows (tp_mass | tp_count | tp_cand), zero at rest
constexpr size_t sample_top_p_scratch_bytes(int rows) {
  return (size_t)rows * kTopPBins * 12 + (size_t)rows * kTopPCandidates * 16;
}
// The t results as arrays: tokens (int64), logprobs, processed_logprobs, kept_mass.
void sample_unpack(const SampleResult* results, int t, int64_t* tokens, float* logprobs, float* processed,
                   float* kept_mass, cudaStream_t stream);

// y[k, i] -= lse[k] over t rows of V logits: log-softmax in place.
void subtract_rows(float* y, int64_t V, int t, const float* lse, cudaStream_t stream);

// ---- checks.cu ----
// first_bad[0] = lowest index of a NaN/inf among x[0..n), or ~0ull (>= n) when all are finite.
void find_nonfinite(const float* x, int64_t n, unsigned long long* first_bad, cudaStream_t stream);
// The same in one kernel (a call's graph runs it beside the route), *out written
// once (it may be mapped host memory: no copy after it); sync: kScanSyncBytes of
// device memory, zero at rest (the kernel leaves it so).
constexpr size_t kScanSyncBytes = 16;
void first_nonfinite(const float* x, int64_t n, unsigned long long* out, unsigned long long* sync,
                     cudaStream_t stream);

// ---- bandwidth.cu: the read limit the bench divides by ----
// Reads nbytes from buf once with 16-byte loads over the whole GPU; sink gets one word per block.
void read_bandwidth(const void* buf, size_t nbytes, unsigned* sink, int sink_words, cudaStream_t stream);
int read_bandwidth_sink_words(int ordinal);
// Keeps a stream busy for about `microseconds` (one spinning thread), so that
// work enqueued behind it starts back to back, free of the host's launch
// latency: how the benches time GPU work alone ("held"), as nvbench does.
void hold_stream(cudaStream_t stream, unsigned microseconds);
constexpr unsigned kHoldMicroseconds = 200;

}  // namespace muser::cuda
