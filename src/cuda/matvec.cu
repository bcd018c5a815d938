// LM-head matvec dispatch (canonical lane order, see matvec.cuh), the scalar
// reference kernel, and the load-time upload into the device layout (device_layout.h).
//
// matvec_reference: one thread per row and token, one f32 accumulator in
// index order, acc = acc + w[j] * x[j] (two roundings per step), the weights
// decoded block by block with dequant.h -- the chapter's reference.rs, like
// the CPU's matvec_reference. Slow by design; it exists so route="reference"
// means the same thing on every device.
#include <algorithm>
#include <mutex>
#include <string>

#include "cuda_check.h"
#include "cuda_device.h"
#include "matvec.cuh"
#include "muser/dequant.h"
#include "pdl.cuh"
#include "quant_types.h"

namespace muser::cuda {

namespace {

constexpr int kTokenTile = 64;  // the largest tile: t <= 64 reads the weight once

// ---- reference ----

// Element values of one 256-element (or shorter) slice [k0, k0 + n) of a row,
// by dequant.h; row: the row's first block, stride: bytes between its blocks.
__device__ int decode_reference_chunk(uint32_t type, const uint8_t* row, int64_t stride, int64_t k0, int64_t cols,
                                      float* out) {
  switch (type) {
    case (uint32_t)GgmlType::Q5_K: {
      BlockQ5_K b;
      unpack_block_q5_k(row + (k0 / kQK_K) * stride, &b);
      dequant_block_q5_k(&b, out);
      return kQK_K;
    }
    case (uint32_t)GgmlType::Q4_K: {
      BlockQ4_K b;
      unpack_block_q4_k(row + (k0 / kQK_K) * stride, &b);
      dequant_block_q4_k(&b, out);
      return kQK_K;
    }
    case (uint32_t)GgmlType::Q6_K: {
      BlockQ6_K b;
      memcpy(&b, row + (k0 / kQK_K) * stride, sizeof(b));
      dequant_block_q6_k(&b, out);
      return kQK_K;
    }
    case (uint32_t)GgmlType::Q8_0: {
      BlockQ8_0 b;
      memcpy(&b, row + (k0 / kQK8_0) * stride, sizeof(b));
      dequant_block_q8_0(&b, out);
      return kQK8_0;
    }
    default: {
      const int n = (int)min((int64_t)kQK_K, cols - k0);
      for (int i = 0; i < n; ++i) {
        const int64_t j = k0 + i;
        if (type == (uint32_t)GgmlType::F32) {
          memcpy(&out[i], row + 4 * j, 4);
        } else {
          uint16_t h;
          memcpy(&h, row + 2 * j, 2);
          out[i] = type == (uint32_t)GgmlType::F16 ? f16_to_f32(h) : bf16_to_f32(h);
        }
      }
      return n;
    }
  }
}

__global__ void matvec_reference_kernel(MatvecArgs a) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t id = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (id >= a.rows * a.t) return;
  const int64_t row = id % a.rows;
  const int k = (int)(id / a.rows);
  const int64_t block_bytes = muser::block_bytes(a.type);
  const bool tiled = is_tiled_type(a.type);
  const uint8_t* p = a.w + (tiled ? tiled_row_offset(row, a.row_bytes, block_bytes) : row * a.row_bytes);
  const int64_t stride = tiled ? kTileRows * block_bytes : block_bytes;
  const float* x = a.x + k * a.ldx;
  float wbuf[kQK_K];
  float acc = 0.0f;
  for (int64_t k0 = 0; k0 < a.cols;) {
    const int n = decode_reference_chunk(a.type, p, stride, k0, a.cols, wbuf);
    for (int i = 0; i < n; ++i) acc = acc + wbuf[i] * x[k0 + i];
    k0 += n;
  }
  a.y[k * a.ldy + row] = acc;
}

void launch_matvec_reference(const MatvecArgs& a, cudaStream_t stream) {
  const int threads = 128;
  const int64_t n = a.rows * a.t;
  launch_pdl(matvec_reference_kernel, dim3((unsigned)((n + threads - 1) / threads)), dim3(threads), 0, stream,
             "matvec_reference", a);
}

// ---- upload: GGUF rows -> the device layout (device_layout.h) ----

// One thread per block of a chunk of whole tiles: copies the block from the
// GGUF rows in src to its tiled place in dst, then permutes it (Q4_K/Q5_K).
template <int kBlockBytes, void (*kRepack)(uint8_t*)>
__global__ void tile_blocks_kernel(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t blocks_per_row,
                                   int64_t row_bytes) {
  const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= rows * blocks_per_row) return;
  const int64_t r = i / blocks_per_row, b = i - r * blocks_per_row;
  const uint16_t* from = reinterpret_cast<const uint16_t*>(src + r * row_bytes + b * kBlockBytes);
  uint8_t* to = dst + tiled_row_offset(r, row_bytes, kBlockBytes) + b * kTileRows * kBlockBytes;
  uint16_t* to16 = reinterpret_cast<uint16_t*>(to);  // every block size is even, every block 2-byte aligned
  for (int k = 0; k < kBlockBytes / 2; ++k) to16[k] = from[k];
  if constexpr (kRepack != nullptr) kRepack(to);
}

__device__ void repack_q5_k_device(uint8_t* b) { repack_block_q5_k(b); }
__device__ void repack_q4_k_device(uint8_t* b) { repack_block_q4_k(b); }

template <int kBlockBytes, void (*kRepack)(uint8_t*)>
void tile_blocks(const uint8_t* src, uint8_t* dst, int64_t rows, int64_t row_bytes, cudaStream_t stream) {
  const int threads = 256;
  const int64_t n = rows * (row_bytes / kBlockBytes);
  tile_blocks_kernel<kBlockBytes, kRepack>
      <<<(unsigned)((n + threads - 1) / threads), threads, 0, stream>>>(src, dst, rows, row_bytes / kBlockBytes, row_bytes);
  check_launch("tile_blocks");
}

constexpr int64_t kUploadStagingBytes = 64ll << 20;  // device staging for the GGUF rows of whole tiles

// A CTA per gathered row j: row ids[j] of w copied to row j of dst, both in the
// device layout (block_bytes: the type's block when tiled, 0 for GGUF rows), in
// 2-byte pieces (every block size and float row is even, every block 2-byte aligned).
__global__ void gather_rows_kernel(const uint8_t* w, uint8_t* dst, const int64_t* ids, int64_t row_bytes,
                                   int block_bytes) {
  const int64_t j = blockIdx.x, r = ids[j];
  for (int64_t byte = 2 * (int64_t)threadIdx.x; byte < row_bytes; byte += 2 * (int64_t)blockDim.x) {
    int64_t from = r * row_bytes + byte, to = j * row_bytes + byte;
    if (block_bytes) {
      const int64_t b = byte / block_bytes, in_block = byte - b * block_bytes, at = b * kTileRows * block_bytes + in_block;
      from = tiled_row_offset(r, row_bytes, block_bytes) + at;
      to = tiled_row_offset(j, row_bytes, block_bytes) + at;
    }
    *reinterpret_cast<uint16_t*>(dst + to) = *reinterpret_cast<const uint16_t*>(w + from);
  }
}

}  // namespace

// ---- launch helpers shared by the per-type files ----

MatvecPlan plan_matvec(const MatvecArgs& a, int unit, int rows_per_warp, int warps, size_t x_budget) {
  // columns per chunk: all of K when t tokens fit the budget, else as many
  // 256-column slices as fit (at least one). Multiples of 256 keep each lane
  // row's length = 4 (mod 8) floats, so 16-byte reads stay conflict-free.
  const int64_t kpad = (a.cols + 255) / 256 * 256;
  const int64_t per_col = 4 * (int64_t)a.t;  // bytes of staged x per column (padding aside)
  int64_t cols = (int64_t)(x_budget / per_col) / 256 * 256;
  cols = std::max<int64_t>(256, std::min(cols, kpad));
  while (cols > 256 && (size_t)a.t * 32 * (cols / 32 + kLanePad) * 4 > x_budget) cols -= 256;
  (void)unit;
  MatvecPlan p;
  p.chunk_cols = (int)cols;
  p.smem_bytes = (size_t)a.t * 32 * (cols / 32 + kLanePad) * sizeof(float) +
                 (size_t)warps * 2 * 32 * ((rows_per_warp + 1) / 2) * sizeof(float);  // factor buffers
  return p;
}

void launch_persistent(const void* kernel, void** params, int threads, size_t smem_bytes, int64_t rows,
                       int64_t rows_per_cta, cudaStream_t stream, const std::string& what) {
  if (smem_bytes > 48 * 1024)
    check(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem_bytes),
          ("cudaFuncSetAttribute(" + what + " shared memory)").c_str());
  int per_sm = 0, dev = 0, sms = 0;
  check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, threads, smem_bytes),
        ("cudaOccupancyMaxActiveBlocksPerMultiprocessor(" + what + ")").c_str());
  if (per_sm < 1)
    throw DeviceError(what + ": no CTA fits on this GPU with " + std::to_string(smem_bytes) + " bytes of shared memory");
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev), "cudaDeviceGetAttribute(SM count)");
  const int64_t groups = (rows + rows_per_cta - 1) / rows_per_cta;
  const int64_t grid = std::min<int64_t>(groups, (int64_t)per_sm * sms);
  launch_pdl(kernel, dim3((unsigned)grid), dim3(threads), smem_bytes, stream, ("launch " + what).c_str(), params);
}

// A kernel launched with PDL behind the norm's kernels runs in their SMs' split
// of L1 and shared memory unless it asks for its own, and the matvecs whose
// small loads of the weight touch each sector several times lost to it (H100,
// the route against the kernel alone): the stream kernel 8 % (t = 16: 1,880
// against 1,726 us; with this preference 1,739-1,741), canonical Q6_K 37 % (t =
// 1: 849 against 622; with it 626), the Q6_K q8 register kernel 1.9 x (t = 1:
// 2,260 against 1,212; with it 1,184).
void prefer_max_l1(const void* kernel, const char* what) {
  check(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxL1),
        (std::string("cudaFuncSetAttribute(") + what + " carveout)").c_str());
}

void launch_matvec_kernel(const void* kernel, const MatvecArgs& a, const MatvecPlan& p, int rows_per_warp, int warps,
                          cudaStream_t stream) {
  prefer_max_l1(kernel, "matvec_canon");
  MatvecArgs args = a;
  int chunk = p.chunk_cols;
  void* params[] = {&args, &chunk};
  launch_persistent(kernel, params, 32 * warps, p.smem_bytes, a.rows, (int64_t)warps * rows_per_warp, stream,
                    "matvec_canon");
}

size_t smem_optin_bytes() {
  int dev = 0, optin = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev),
        "cudaDeviceGetAttribute(shared memory per block)");
  return (size_t)optin;
}

bool matvec_wide_fits(const MatvecArgs& a) {
  if (a.type != (uint32_t)GgmlType::Q5_K && a.type != (uint32_t)GgmlType::Q4_K) return false;
  return wide_smem_floats(a.cols, kWideWarps) * sizeof(float) <= smem_optin_bytes();
}

bool launch_matvec_wide(const void* kernel, const MatvecArgs& a, int warps, cudaStream_t stream) {
  if (!matvec_wide_fits(a)) return false;
  const size_t smem = wide_smem_floats(a.cols, warps) * sizeof(float);
  MatvecArgs args = a;
  void* params[] = {&args};
  launch_persistent(kernel, params, 32 * warps, smem, a.rows, (int64_t)warps * kWideRows, stream, "matvec_canon_wide");
  return true;
}

// Q4_K or Q5_K with x in 16-byte aligned rows: what the kernels that copy x by
// 16-byte cp.async (shared-decode, stream) need besides their shared memory
static bool k_quant_with_aligned_x(const MatvecArgs& a) {
  return (a.type == (uint32_t)GgmlType::Q5_K || a.type == (uint32_t)GgmlType::Q4_K) &&
         reinterpret_cast<uintptr_t>(a.x) % 16 == 0 && a.ldx % 4 == 0;
}

bool matvec_shared_fits(const MatvecArgs& a) {
  return k_quant_with_aligned_x(a) && SharedTile<kSharedTokenGroups>::smem_bytes <= smem_optin_bytes();
}

void launch_matvec_shared(const void* kernel, const MatvecArgs& a, cudaStream_t stream) {
  using Tile = SharedTile<kSharedTokenGroups>;
  MatvecArgs args = a;
  void* params[] = {&args};
  launch_persistent(kernel, params, 32 * kSharedWarps, Tile::smem_bytes, a.rows, Tile::rows, stream,
                    "matvec_canon_shared");
}

bool matvec_stream_fits(const MatvecArgs& a) { return k_quant_with_aligned_x(a); }  // 40 KB: fits every GPU

void launch_matvec_stream(const void* kernel, const MatvecArgs& a, cudaStream_t stream) {
  MatvecArgs args = a;
  void* params[] = {&args};
  prefer_max_l1(kernel, "matvec_canon_stream");
  launch_persistent(kernel, params, 32 * kStreamWarps, stream_smem_bytes(), a.rows, (int64_t)kStreamWarps * kWideRows,
                    stream, "matvec_canon_stream");
}

// ---- checked entries ----

bool matvec_supports(uint32_t type) {
  switch (type) {
    case (uint32_t)GgmlType::Q5_K:
    case (uint32_t)GgmlType::Q4_K:
    case (uint32_t)GgmlType::Q6_K:
    case (uint32_t)GgmlType::Q8_0:
    case (uint32_t)GgmlType::F16:
    case (uint32_t)GgmlType::BF16:
    case (uint32_t)GgmlType::F32:
      return true;
    default:
      return false;
  }
}

// The token tile of matvec_canon for a row of `cols` columns: the largest of
// 64, 32, 16 whose staged x fits its CTA's budget whole, else 8. A chunked x
// is restaged for every row group (matvec.cuh), which cost more than reading
// the weight once per 8 tokens: 4,936 us at t = 16 on the seed head against
// 2 x 1,136 (docs/performance.md); the order of the sums is the same either way.
static int canon_token_tile(int64_t cols) {
  const int64_t kpad = (cols + 255) / 256 * 256;
  auto x_bytes = [&](int64_t t) { return (size_t)t * 32 * (size_t)(kpad / 32 + kLanePad) * sizeof(float); };
  if (x_bytes(64) <= MatvecCta<64>::x_budget) return 64;
  if (x_bytes(32) <= MatvecCta<32>::x_budget) return 32;
  if (x_bytes(16) <= MatvecCta<16>::x_budget) return 16;
  return 8;
}

void matvec_canon(const MatvecArgs& a, cudaStream_t stream) {
  // token tiles of up to 64: t <= 64 reads the weight once, larger t once per tile
  // (fewer tokens per tile when their x would not fit shared memory whole). Where
  // the wide kernel runs (Q4_K/Q5_K), tiles of 8: its 8 rows per warp serve each
  // x read with 8 FMAs, the larger tiles' 1 or 2 rows with 1 or 2 (matvec.cuh).
  // Where the shared-decode kernel runs, tiles of 32 (each weight element decoded once
  // per 32 tokens); a part of fewer than kSharedMinTokens goes as stream tiles of 16
  // (decoded once per 16) and a last part of 8 or fewer as a wide tile.
  const bool shared = a.t >= kSharedMinTokens && matvec_shared_fits(a);
  const bool streamed = a.t > kWideTokens && matvec_stream_fits(a);
  const int token_tile = a.t <= 8            ? kTokenTile
                         : shared              ? SharedTile<kSharedTokenGroups>::tokens
                         : streamed            ? kStreamTokens
                         : matvec_wide_fits(a) ? kWideTokens
                                               : std::min(kTokenTile, canon_token_tile(a.cols));
  for (int k0 = 0, n = 0; k0 < a.t; k0 += n) {
    n = std::min(token_tile, a.t - k0);
    if (shared && n < kSharedMinTokens) n = std::min(n, n > kWideTokens ? kStreamTokens : kWideTokens);
    MatvecArgs tile = a;
    tile.t = n;
    tile.x = a.x + k0 * a.ldx;
    tile.y = a.y + k0 * a.ldy;
    switch (a.type) {
      case (uint32_t)GgmlType::Q5_K: matvec_canon_q5_k(tile, stream); break;
      case (uint32_t)GgmlType::Q4_K: matvec_canon_q4_k(tile, stream); break;
      case (uint32_t)GgmlType::Q6_K: matvec_canon_q6_k(tile, stream); break;
      case (uint32_t)GgmlType::Q8_0: matvec_canon_q8_0(tile, stream); break;
      case (uint32_t)GgmlType::F16:
      case (uint32_t)GgmlType::BF16:
      case (uint32_t)GgmlType::F32: matvec_canon_float(tile, stream); break;
      default:
        throw DeviceError(std::string("matvec: the CUDA device has no kernel for weight type ") +
                          (type_traits(a.type).name ? type_traits(a.type).name : "?"));
    }
    check_launch("matvec_canon");
  }
}

void matvec_reference(const MatvecArgs& a, cudaStream_t stream) {
  if (!matvec_supports(a.type)) throw DeviceError("matvec_reference: unsupported weight type");
  launch_matvec_reference(a, stream);
  check_launch("matvec_reference");
}

size_t device_weight_bytes(uint32_t type, int64_t rows, int64_t row_bytes) {
  const int64_t stored = is_tiled_type(type) ? (rows + kTileRows - 1) / kTileRows * kTileRows : rows;
  return (size_t)stored * (size_t)row_bytes + kWeightPadBytes;
}

void gather_weight_rows(const uint8_t* w, uint32_t type, int64_t row_bytes, const int64_t* ids, int n, uint8_t* dst,
                        cudaStream_t stream) {
  if (n <= 0) return;
  const int block = is_tiled_type(type) ? block_bytes(type) : 0;
  gather_rows_kernel<<<(unsigned)n, 128, 0, stream>>>(w, dst, ids, row_bytes, block);
  check_launch("gather_rows");
}

void upload_weight(uint8_t* dst, const uint8_t* host, uint32_t type, int64_t rows, int64_t row_bytes, int ordinal,
                   cudaStream_t stream) {
  const size_t total = device_weight_bytes(type, rows, row_bytes);
  check(cudaMemsetAsync(dst, 0, total, stream), "cudaMemset(weight)");  // padding rows and bytes read as zeros
  if (!is_tiled_type(type)) {
    check(cudaMemcpyAsync(dst, host, (size_t)rows * row_bytes, cudaMemcpyHostToDevice, stream), "upload of the weight");
    check(cudaStreamSynchronize(stream), "upload of the weight (synchronize)");
    return;
  }
  const int64_t tile_bytes = kTileRows * row_bytes;
  const int64_t tiles = (rows + kTileRows - 1) / kTileRows;
  const int64_t chunk_tiles = std::max<int64_t>(1, std::min<int64_t>(tiles, kUploadStagingBytes / tile_bytes));
  DeviceMemory staging((size_t)(chunk_tiles * tile_bytes), ordinal, "the weight upload's staging buffer");
  auto* st = static_cast<uint8_t*>(staging.ptr);
  for (int64_t t0 = 0; t0 < tiles; t0 += chunk_tiles) {
    const int64_t r0 = t0 * kTileRows, nr = std::min(rows - r0, chunk_tiles * kTileRows);
    // the stream orders this copy after the previous chunk's kernel
    check(cudaMemcpyAsync(st, host + r0 * row_bytes, (size_t)(nr * row_bytes), cudaMemcpyHostToDevice, stream),
          "upload of the weight");
    uint8_t* out = dst + t0 * tile_bytes;
    switch (type) {
      case (uint32_t)GgmlType::Q5_K: tile_blocks<sizeof(BlockQ5_K), repack_q5_k_device>(st, out, nr, row_bytes, stream); break;
      case (uint32_t)GgmlType::Q4_K: tile_blocks<sizeof(BlockQ4_K), repack_q4_k_device>(st, out, nr, row_bytes, stream); break;
      case (uint32_t)GgmlType::Q6_K: tile_blocks<sizeof(BlockQ6_K), nullptr>(st, out, nr, row_bytes, stream); break;
      case (uint32_t)GgmlType::Q8_0: tile_blocks<sizeof(BlockQ8_0), nullptr>(st, out, nr, row_bytes, stream); break;
      default: throw DeviceError("upload_weight: no tiled layout for this type");
    }
  }
  check(cudaStreamSynchronize(stream), "upload of the weight (synchronize)");
}

}  // namespace muser::cuda
