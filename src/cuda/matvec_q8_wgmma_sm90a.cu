// acts="q8" batches of Q4_K/Q5_K/Q6_K on Hopper: the integer sums on wgmma, compiled
// for sm_90a alone (its own target, src/cuda/CMakeLists.txt) and launched only on
// a 9.0 device (q8_wgmma_ready). The same integers and the same float chain as
// every other q8 kernel (docs/numerics.md, "CUDA q8"), so the logits are the
// CPU's q8 logits bit for bit at every t.
//
// Why a kernel of its own. The mma.sync kernels decode each weight block in
// every warp for the 32 tokens it holds and multiply every sub-block's sum by
// its 6-bit scale on the ALU (isum += sc * C: 8 IMADs per (row, token, block)),
// which bounds them at ~8 x the int8 tensor-core time from t = 32 on
// (docs/performance.md). Here a CTA of two warpgroups owns 128 rows (64 each)
// and up to 128 tokens; per 256-column block:
//   - one thread copies the 128 rows' block (8 row tiles, contiguous in the
//     device layout) and the tokens' block of activations with bulk copies
//     (cp.async.bulk, an mbarrier per stage, as many stages as fit);
//   - each warpgroup decodes its 64 rows once into two u8 planes in shared
//     memory, q * (sc >> 3) and q * (sc & 7) (each at most 31 * 7 = 217), so
//     isum = 8 * (hi plane . x) + (lo plane . x) is a whole block's dot product
//     on the tensor cores: 8 wgmma of each plane (two accumulators up to 64
//     tokens; at 128 one, x 8 between the planes);
//   - the mins' sums msum = sum_j m_j * bsum_j are one f16 wgmma, A = the
//     mins and 256 x them from registers, B = each token's sub-block sums as
//     lo + 256 * hi halves (every product and partial sum an integer below
//     2^24, so f32 holds msum exactly, as kquant45_float_step's mma does);
//   - the lane holding a (row, token) pair steps the CPU's chain
//     (q8_block_step, q8_block_step_exact) over the row's blocks in order.
// What bounds it (two warps a scheduler at 255 registers, the decode and the
// chains' instruction latency, not the tensor cores): docs/performance.md.
// Launches of 49 ... 80 tokens run the same steps with the decode in warpgroups of
// its own (matvec_q8_wgmma_ws_kernel, below), and so do launches of 129 ... 256, whose
// CTAs hold 64 rows decoded once for two warpgroups of up to 128 tokens each.
//
// Q6_K (WgQ6K) takes the same kernel with planes of its own. Its weights are
// w = sc * (q - 32) (sc a signed byte, q six bits), |w| <= 4,096: no split of the
// scale keeps q * part within a byte, so the planes split the product instead.
// 4 (w + 8,192) = q * 4 sc + (32,768 - 128 sc) is in [16,384, 49,152]: one IMAD
// makes it for two elements a word in 16-bit halves (no carry crosses them), and
// the halves' high bytes are floor(w / 64) + 128 (XOR 0x80: the s8 hi plane, -64..64),
// their low bytes lo4 = 4 (w mod 64) (a u8 plane, one PRMT each per four elements):
// isum = 64 (hi . x) + (lo4 . x) / 4, s8 x s8 and u8 x s8 wgmma.
//
// Activations. quantize_acts_q8 also writes every token's quants, mins halves
// and scales in the layout the wgmma operands read (q8_wgmma_relayout_kernel),
// per 256-column block b, for the layout's T tokens (zeros past t):
//   quants [b][T/8 token groups][16 k-chunks][8 tokens x 16 bytes]
//   mins   [b][T/8][2 k-chunks: lo_0..7, hi_0..7][8 tokens x 8 halves]
//   dx     [b][T]
// so any launch's tokens (a run of 8-token groups) are three contiguous bulk
// copies a block, and a slice of the call (score's groups) reads its own run.
// Weights. The shared-memory operands are K-major without swizzle: core
// matrices of 8 rows x 16 bytes (128 contiguous bytes); the leading byte
// offset steps along K, the stride byte offset along rows (tokens).
#include <algorithm>
#include <climits>
#include <cstdlib>
#include <type_traits>

#include "async_copy.cuh"
#include "cuda_check.h"
#include "matvec_q8.cuh"
#include "pdl.cuh"
#include "quant_types.h"

namespace muser::cuda {

#ifndef MUSER_CUDA_WGMMA
#define MUSER_CUDA_WGMMA 1
#endif

namespace {
// a token's block in the activations' layout: 256 quants, the mins' 16 f16 halves, dx
constexpr int kWgMinsBytes = 16 * 2, kWgDxBytes = 4;
constexpr int kWgTokBytes = kQK_K + kWgMinsBytes + kWgDxBytes;
// the block of N tokens a stage holds: quants, then the mins halves, then dx (offsets)
template <int N, int kExtra = kWgMinsBytes>  // kExtra: the format's record after the quants (Q6_K: none)
struct WgActs {
  static constexpr int kBytes = N * (kQK_K + kExtra + kWgDxBytes), kMins = N * kQK_K, kDx = N * (kQK_K + kExtra);
};
// the shared memory a CTA takes, all that an sm_90 part lets one opt in to (227 KB)
constexpr size_t kWgSmemBudget = 232448;
}  // namespace

#if MUSER_CUDA_WGMMA
namespace {

constexpr int kWgRows = 64;              // rows of one warpgroup (wgmma M)
constexpr int kWgCtaRows = 2 * kWgRows;  // two warpgroups a CTA
constexpr int kWgThreads = 2 * 128;
constexpr int kWgPlaneBytes = kWgRows * kQK_K;

// Tokens a launch of `count` computes (wgmma N): 32, 64, then multiples of 16 to 128
// (a step's decode costs the same at any N, its products and chains scale with N).
MUSER_HD constexpr int wg_tokens(int count) { return count <= 32 ? 32 : count <= 64 ? 64 : (count + 15) / 16 * 16; }
// Tokens of each of the two groups a shared-decode launch of `count` computes: 64 ... 128.
MUSER_HD constexpr int wg_shared_tokens(int count) { return count <= 128 ? 64 : wg_tokens((count + 1) / 2); }

template <class F, int N>
struct WgLayout {
  static constexpr int kBlockBytes = F::kBlockBytes;
  static constexpr int kRaw = kWgCtaRows * kBlockBytes;  // the CTA's rows' block: 8 row tiles
  using Acts = WgActs<N, F::kTokExtraBytes>;
  static constexpr int kActs = Acts::kBytes;  // the tokens' block: quants, mins, dx
  static constexpr int kStage = kRaw + kActs;  // what a stage's copies bring
  static constexpr int kPlanes = 2 * 2 * kWgPlaneBytes;  // [warpgroup][hi, lo]
  // as many stages as the H100/H200's 227 KB a CTA hold (2 at 128 tokens, 3 at 80..112,
  // 4 at 64, 5 at 32)
  static constexpr int kFit = (int)((kWgSmemBudget - kPlanes - 256) / kStage);  // 256: the barriers' room
  static constexpr int kStages = kFit < 6 ? kFit : 6;
  static constexpr int kBars = kPlanes + kStages * kStage;
  static constexpr size_t kSmem = (size_t)kBars + kStages * 8 + kStages * 4;
  static_assert(kStages >= 2, "two stages at least");
  static_assert(kSmem <= kWgSmemBudget, "q8_wgmma_ready checks the device for the budget, not each layout");
  static_assert(kRaw % 16 == 0 && kActs % 16 == 0 && kBars % 8 == 0 && (N * F::kTokExtraBytes) % 16 == 0,
                "bulk copies move 16-byte pieces");
};

// ---------------------------------------------------------------- PTX

// generic-proxy writes to shared memory (the planes) before the tensor cores read them
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory"); }
__device__ __forceinline__ void wgmma_wait_all() { asm volatile("wgmma.wait_group.sync.aligned 0;" ::: "memory"); }
// pins a register array around the asynchronous wgmma: no read moves above the wait,
// no write below the issue
template <class T, int R>
__device__ __forceinline__ void fence_operands(T (&d)[R]) {
#pragma unroll
  for (int i = 0; i < R; ++i) {
    if constexpr (std::is_same_v<T, float>) asm volatile("" : "+f"(d[i])::"memory");
    else asm volatile("" : "+r"(d[i])::"memory");
  }
}

// A shared-memory operand: K-major, no swizzle (core matrices of 8 x 16 bytes);
// lbo: bytes between core matrices along K, sbo: along rows
__device__ __forceinline__ uint64_t smem_desc(const void* p, uint32_t lbo, uint32_t sbo) {
  return (uint64_t)((smem_addr(p) & 0x3FFFFu) >> 4) | ((uint64_t)(lbo >> 4) << 16) | ((uint64_t)(sbo >> 4) << 32);
}

// The wgmma shapes the kernel takes, A from shared memory (f16: registers) and B from
// shared memory; inline PTX needs the operand lists spelled out, so the macros below
// spell them: DREGS the accumulators' %0.. (DOPS their constraints), then the operand
// numbers after them, X0..X5.
#define MUSER_WG_D8(C, o) C(d[o]), C(d[o + 1]), C(d[o + 2]), C(d[o + 3]), C(d[o + 4]), C(d[o + 5]), C(d[o + 6]), C(d[o + 7])
#define MUSER_WG_D16(C) MUSER_WG_D8(C, 0), MUSER_WG_D8(C, 8)
#define MUSER_WG_D32(C) MUSER_WG_D16(C), MUSER_WG_D8(C, 16), MUSER_WG_D8(C, 24)
#define MUSER_WG_D40(C) MUSER_WG_D32(C), MUSER_WG_D8(C, 32)
#define MUSER_WG_D48(C) MUSER_WG_D40(C), MUSER_WG_D8(C, 40)
#define MUSER_WG_D56(C) MUSER_WG_D48(C), MUSER_WG_D8(C, 48)
#define MUSER_WG_D64(C) MUSER_WG_D56(C), MUSER_WG_D8(C, 56)
#define MUSER_WG_R16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define MUSER_WG_R32 MUSER_WG_R16 ", %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define MUSER_WG_R40 MUSER_WG_R32 ", %32, %33, %34, %35, %36, %37, %38, %39"
#define MUSER_WG_R48 MUSER_WG_R40 ", %40, %41, %42, %43, %44, %45, %46, %47"
#define MUSER_WG_R56 MUSER_WG_R48 ", %48, %49, %50, %51, %52, %53, %54, %55"
#define MUSER_WG_R64 MUSER_WG_R56 ", %56, %57, %58, %59, %60, %61, %62, %63"
// d (+)= A(64x32 shared, u8 or s8: TYPES) B(32xNN s8, shared), accumulating unless
// `accumulate` is 0; NAME##_first: d = A B (d is not read)
#define MUSER_WG_INT(NN, NAME, TYPES, DREGS, DOPS, X0, X1, X2)                                                       \
  static __device__ __forceinline__ void NAME(int (&d)[NN / 2], uint64_t da, uint64_t db, int accumulate) {           \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " X2 ", 0;\n"                                                      \
                 "wgmma.mma_async.sync.aligned.m64n" #NN "k32.s32." TYPES " {" DREGS "}, " X0 ", " X1 ", p;\n}\n"     \
                 : DOPS("+r")                                                                                         \
                 : "l"(da), "l"(db), "r"(accumulate));                                                                \
  }                                                                                                                   \
  static __device__ __forceinline__ void NAME##_first(int (&d)[NN / 2], uint64_t da, uint64_t db) {                   \
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " X2 ", 0;\n"                                                      \
                 "wgmma.mma_async.sync.aligned.m64n" #NN "k32.s32." TYPES " {" DREGS "}, " X0 ", " X1 ", p;\n}\n"     \
                 : DOPS("=r")                                                                                         \
                 : "l"(da), "l"(db), "r"(0));                                                                         \
  }
#define MUSER_WGMMA_SS(NN, DREGS, DOPS, X0, X1, X2, X3, X4, X5)                                                       \
  template <>                                                                                                         \
  struct Wgmma<NN> {                                                                                                  \
    MUSER_WG_INT(NN, u8s8, "u8.s8", DREGS, DOPS, X0, X1, X2) /* the planes of Q4_K/Q5_K, Q6_K's lo4 */               \
    MUSER_WG_INT(NN, s8s8, "s8.s8", DREGS, DOPS, X0, X1, X2) /* Q6_K's signed hi plane */                             \
    /* d = A(64x16 f16, registers) B(16xNN f16, shared) */                                                            \
    static __device__ __forceinline__ void f16(float (&d)[NN / 2], const uint32_t (&a)[4], uint64_t db) {             \
      asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, " X5 ", 0;\n"                                                    \
                   "wgmma.mma_async.sync.aligned.m64n" #NN "k16.f32.f16.f16 {" DREGS "}, {" X0 ", " X1 ", " X2        \
                   ", " X3 "}, " X4 ", p, 1, 1, 0;\n}\n"                                                              \
                   : DOPS("=f")                                                                                       \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(0));                                    \
    }                                                                                                                 \
  };

template <int N>
struct Wgmma;
MUSER_WGMMA_SS(32, MUSER_WG_R16, MUSER_WG_D16, "%16", "%17", "%18", "%19", "%20", "%21")
MUSER_WGMMA_SS(64, MUSER_WG_R32, MUSER_WG_D32, "%32", "%33", "%34", "%35", "%36", "%37")
MUSER_WGMMA_SS(80, MUSER_WG_R40, MUSER_WG_D40, "%40", "%41", "%42", "%43", "%44", "%45")
MUSER_WGMMA_SS(96, MUSER_WG_R48, MUSER_WG_D48, "%48", "%49", "%50", "%51", "%52", "%53")
MUSER_WGMMA_SS(112, MUSER_WG_R56, MUSER_WG_D56, "%56", "%57", "%58", "%59", "%60", "%61")
MUSER_WGMMA_SS(128, MUSER_WG_R64, MUSER_WG_D64, "%64", "%65", "%66", "%67", "%68", "%69")
#undef MUSER_WGMMA_SS
#undef MUSER_WG_INT
#undef MUSER_WG_R16
#undef MUSER_WG_R32
#undef MUSER_WG_R40
#undef MUSER_WG_R48
#undef MUSER_WG_R56
#undef MUSER_WG_R64
#undef MUSER_WG_D8
#undef MUSER_WG_D16
#undef MUSER_WG_D32
#undef MUSER_WG_D40
#undef MUSER_WG_D48
#undef MUSER_WG_D56
#undef MUSER_WG_D64

// ---------------------------------------------------------------- the kernel

// Decodes 8 quants of every sub-block of one row into the two planes: row r of
// the warpgroup's 64, positions 8u..8u+7 of each sub-block (the lane words
// 8u..8u+7 of qs' and bytes 8u..8u+7 of qh', device_layout.h). Plane offset of
// (row r, column k): (k / 16) * 1024 + (r / 8) * 128 + (r % 8) * 16 + k % 16.
template <bool kHigh>
__device__ __forceinline__ void wg_decode(const uint8_t* row, uint8_t* planes, int r, int u) {
  using Dec = Q8DecKQuant<kHigh>;
  const KScales ks(*reinterpret_cast<const uint4*>(row));
  const uint4 qa = *reinterpret_cast<const uint4*>(row + Dec::kQsOffset + 32 * u);
  const uint4 qb = *reinterpret_cast<const uint4*>(row + Dec::kQsOffset + 32 * u + 16);
  uint32_t T[4], U[4];  // T[c]: positions 8u..8u+3, nibble pair c (sub-blocks 2c, 2c + 1); U: 8u+4..8u+7
  transpose_bytes(qa, T);
  transpose_bytes(qb, U);
  uint2 qh = make_uint2(0, 0);
  if constexpr (kHigh) qh = *reinterpret_cast<const uint2*>(row + kQ5KHighBitsOffset + 8 * u);
  uint8_t* dst = planes + (u >> 1) * 1024 + (r >> 3) * 128 + (r & 7) * 16 + 8 * (u & 1);
  // the scales' bytes split as sc = 8 * hi + lo, four sub-blocks a word
  const uint32_t sc_hi[2] = {(ks.sc[0] >> 3) & 0x07070707u, (ks.sc[1] >> 3) & 0x07070707u};
  const uint32_t sc_lo[2] = {ks.sc[0] & 0x07070707u, ks.sc[1] & 0x07070707u};
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    uint32_t w[2][2];  // [sub-block 2c + h][positions 8u.., 8u+4..]
    if constexpr (kHigh) {
      const uint32_t x = (qh.x >> c) & 0x11111111u, xu = (qh.y >> c) & 0x11111111u;
      w[0][0] = merge_nibbles(T[c], x << 4);
      w[0][1] = merge_nibbles(U[c], xu << 4);
      w[1][0] = merge_nibbles(T[c] >> 4, x);
      w[1][1] = merge_nibbles(U[c] >> 4, xu);
    } else {
      w[0][0] = T[c] & 0x0f0f0f0fu;
      w[0][1] = U[c] & 0x0f0f0f0fu;
      w[1][0] = (T[c] >> 4) & 0x0f0f0f0fu;
      w[1][1] = (U[c] >> 4) & 0x0f0f0f0fu;
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int j = 2 * c + h;
      const uint32_t hi = (uint32_t)byte_u(sc_hi[j >> 2], j & 3), lo = (uint32_t)byte_u(sc_lo[j >> 2], j & 3);
      // bytes q * hi and q * lo: at most 31 * 7 = 217, so no product carries into its neighbour
      *reinterpret_cast<uint2*>(dst + 2 * j * 1024) = make_uint2(w[h][0] * hi, w[h][1] * hi);
      *reinterpret_cast<uint2*>(dst + kWgPlaneBytes + 2 * j * 1024) = make_uint2(w[h][0] * lo, w[h][1] * lo);
    }
  }
}

// One token group's block of activations (N tokens from layout token `at` of the block:
// quants, the format's record, dx) into a stage's room for it at dst, counted on bar.
template <class F, int N>
__device__ __forceinline__ void copy_token_group(uint8_t* dst, const Q8Call& a, const uint8_t* mins,
                                                 const uint8_t* dxs, int64_t at, uint64_t* bar) {
  using Acts = WgActs<N, F::kTokExtraBytes>;
  bulk_copy(dst, a.wg + at * kQK_K, N * kQK_K, bar);
  uint8_t* const extra = dst + Acts::kMins;  // the mins halves (Q6_K: none)
  if constexpr (F::kTokExtraBytes > 0) bulk_copy(extra, mins + at * F::kTokExtraBytes, N * F::kTokExtraBytes, bar);
  bulk_copy(dst + Acts::kDx, dxs + at * kWgDxBytes, N * kWgDxBytes, bar);
}

// A (group, block) step of a CTA's walk: its groups blockIdx.x, + gridDim.x, ...
// (n counts them), each the row's blocks in order.
struct WgStep {
  int n = 0, b = 0;
  __device__ __forceinline__ WgStep after(int k, int blocks) const {
    WgStep r{n, b + k};
    while (r.b >= blocks) r.b -= blocks, ++r.n;
    return r;
  }
};

// The block's integer sums of a warpgroup's 64 rows from its two planes, exact in int32:
// isum = (hi plane . x) * 2^kHiShift + (lo plane . x) / 2^kLoShift (the lo plane holds
// 2^kLoShift x its values; the hi plane is s8 where kSignedHi, else u8). Up to 64 tokens
// the planes accumulate apart and every wgmma of a step is one group (one wait), `also`
// issuing more of the group's wgmma and `also_done` fencing their operands; beyond, the
// registers hold one accumulator, shifted between the planes (`also` is not called).
// planes_read() runs once the last wgmma that reads the planes has completed.
template <int N, int kHiShift, int kLoShift, bool kSignedHi, class Also, class AlsoDone, class PlanesRead>
__device__ __forceinline__ void wg_plane_sums(int (&acc)[N / 2], uint64_t da, uint64_t bx, Also also,
                                              AlsoDone also_done, PlanesRead planes_read) {
  constexpr int R = N / 2;  // accumulators a thread: rows G, G + 8 x tokens 8j + 2q, + 1
  // descriptors step by their 16-byte address units: k-step j of a plane is 2,048 bytes on,
  // of the activations 256; the lo plane kWgPlaneBytes after the hi one
  constexpr uint64_t kLoPlane = kWgPlaneBytes >> 4;
  auto hi = [&](int j) {
    if constexpr (kSignedHi) Wgmma<N>::s8s8(acc, da + 128 * j, bx + 16 * j, 1);
    else Wgmma<N>::u8s8(acc, da + 128 * j, bx + 16 * j, 1);
  };
  auto hi_first = [&] {
    if constexpr (kSignedHi) Wgmma<N>::s8s8_first(acc, da, bx);
    else Wgmma<N>::u8s8_first(acc, da, bx);
  };
  wgmma_fence();
  if constexpr (N <= 64) {
    int acc_lo[R];
    // two accumulators in turn: independent chains in the tensor pipe
    hi_first();
    Wgmma<N>::u8s8_first(acc_lo, da + kLoPlane, bx);
#pragma unroll
    for (int j = 1; j < 8; ++j) {
      hi(j);
      Wgmma<N>::u8s8(acc_lo, da + kLoPlane + 128 * j, bx + 16 * j, 1);
    }
    also();
    wgmma_commit();
    wgmma_wait_all();
    fence_operands(acc);
    fence_operands(acc_lo);
    also_done();
    planes_read();
#pragma unroll
    for (int i = 0; i < R; ++i) acc[i] = acc[i] * (1 << kHiShift) + (acc_lo[i] >> kLoShift);
  } else {
    hi_first();
#pragma unroll
    for (int j = 1; j < 8; ++j) hi(j);
    wgmma_commit();
    wgmma_wait_all();
    fence_operands(acc);
#pragma unroll
    for (int i = 0; i < R; ++i) acc[i] <<= kHiShift + kLoShift;
    wgmma_fence();
    fence_operands(acc);
#pragma unroll
    for (int j = 0; j < 8; ++j) Wgmma<N>::u8s8(acc, da + kLoPlane + 128 * j, bx + 16 * j, 1);
    wgmma_commit();
    wgmma_wait_all();
    fence_operands(acc);
    planes_read();
    if constexpr (kLoShift > 0) {
#pragma unroll
      for (int i = 0; i < R; ++i) acc[i] >>= kLoShift;  // exact: the sum is 2^kLoShift isum
    }
  }
}

// The CPU's chain step of a thread's (row, token) pairs over one block: rows G, G + 8 (scale
// d[0], d[1]), tokens 8j + 2q, + 1 (dx from the tokens' block); step(sum, dx, d, v) is
// q8_block_step or q8_block_step_exact
template <int N, int kExtra, class V, class Step>
__device__ __forceinline__ void wg_chain(float (&sum)[N / 2], const uint8_t* xs, int q, float d0, float d1,
                                         const V (&v)[N / 2], Step step) {
  const float* dx = reinterpret_cast<const float*>(xs + WgActs<N, kExtra>::kDx);
#pragma unroll
  for (int j = 0; j < N / 8; ++j) {
    const float2 d2 = *reinterpret_cast<const float2*>(dx + 8 * j + 2 * q);
#pragma unroll
    for (int i = 0; i < 4; ++i)
      sum[4 * j + i] = step(sum[4 * j + i], (i & 1) ? d2.y : d2.x, (i >> 1) ? d1 : d0, v[4 * j + i]);
  }
}

// One step of a Q4_K/Q5_K warpgroup's 64 rows: isum = 8 * (hi plane . x) + (lo plane . x)
// and msum in f32, exactly, on the tensor cores; then the CPU's chains into sum_q and
// sum_m. xs: the tokens' block (quants, mins halves, dx); da: the hi plane's descriptor
// (the lo plane kWgPlaneBytes on).
template <int N, class PlanesRead>
__device__ __forceinline__ void wg_block_step(uint64_t da, const uint8_t* xs, const KScales (&ks)[2],
                                              const uint32_t (&am)[4], int q, float (&sum_q)[N / 2],
                                              float (&sum_m)[N / 2], PlanesRead planes_read) {
  constexpr int R = N / 2;
  constexpr bool kSplit = N <= 64;
  const uint64_t bx = smem_desc(xs, 128, 2048), bm = smem_desc(xs + WgActs<N>::kMins, 128, 256);
  int acc[R];
  float msum[R];
  wg_plane_sums<N, 3, 0, false>(
      acc, da, bx, [&] { Wgmma<N>::f16(msum, am, bm); }, [&] { fence_operands(msum); }, planes_read);
  wg_chain<N, kWgMinsBytes>(sum_q, xs, q, ks[0].d, ks[1].d, acc,
              [](float s, float dx, float d, int v) { return q8_block_step(s, dx, d, v); });
  if constexpr (!kSplit) {  // the mins' wgmma after the chain: its accumulators take acc's registers
    wgmma_fence();
    Wgmma<N>::f16(msum, am, bm);
    wgmma_commit();
    wgmma_wait_all();
    fence_operands(msum);
  }
  wg_chain<N, kWgMinsBytes>(sum_m, xs, q, ks[0].dmin, ks[1].dmin, msum,
              [](float s, float dx, float d, float v) { return q8_block_step_exact(s, dx, d, v); });
}

// ---------------------------------------------------------------- the formats

// What the kernels ask of a weight format F:
//   kBlockBytes, kTokExtraBytes (the record a token's block copies after its quants);
//   Sums<N>: a thread's chain sums; Rows: what the chains need of rows hrow, hrow + 8,
//   from their blocks (the raw stage, or the decoders' copies of the 16 bytes from
//   kHeaderOffset that header(row) loads); kSplitDecode: two decoder warpgroups a half
//   in the shared-decode kernel;
//   decode(row, planes, r, u): item u (0..3) of row r into the two planes;
//   step<N>(da, xs, rows, q, sums, planes_read): the block's integer sums and chains;
//   result(sums, i): the logit of accumulator i.

// Q4_K/Q5_K: planes q * (sc >> 3), q * (sc & 7); the mins on an f16 wgmma.
template <bool kHigh>
struct WgKQuant {
  static constexpr int kBlockBytes = Q8DecKQuant<kHigh>::kBlockBytes;
  static constexpr int kTokExtraBytes = kWgMinsBytes;
  template <int N>
  struct Sums {
    float q[N / 2], m[N / 2];
    __device__ __forceinline__ void zero() {
#pragma unroll
      for (int i = 0; i < N / 2; ++i) q[i] = m[i] = 0.0f;
    }
  };
  struct Rows {
    KScales ks[2];
    uint32_t am[4];  // the mins' A fragment (exact: kquant_mins_f16_frag)
    __device__ __forceinline__ Rows(const uint8_t* r0, const uint8_t* r1, int q)
        : ks{KScales(*reinterpret_cast<const uint4*>(r0)), KScales(*reinterpret_cast<const uint4*>(r1))} {
      kquant_mins_f16_frag(ks, q, am);
    }
  };
  static __device__ __forceinline__ void decode(const uint8_t* row, uint8_t* planes, int r, int u) {
    wg_decode<kHigh>(row, planes, r, u);
  }
  // the 16 bytes of a row's block that Rows reads, from kHeaderOffset (the decoder
  // warpgroups keep them beside the planes): d, dmin and the scales
  static constexpr int kHeaderOffset = 0;
  static constexpr bool kSplitDecode = false;  // one decoder warpgroup a half (WsLayout)
  static __device__ __forceinline__ uint4 header(const uint8_t* row) { return *reinterpret_cast<const uint4*>(row); }
  template <int N, class PlanesRead>
  static __device__ __forceinline__ void step(uint64_t da, const uint8_t* xs, const Rows& rows, int q, Sums<N>& s,
                                              PlanesRead planes_read) {
    wg_block_step<N>(da, xs, rows.ks, rows.am, q, s.q, s.m, planes_read);
  }
  template <int N>
  static __device__ __forceinline__ float result(const Sums<N>& s, int i) {
    return q8_kquant45_result(s.q[i], s.m[i]);
  }
};

// 16 bytes at a 2-byte aligned shared address (a Q6_K block is 210 bytes: every other
// row starts 2 bytes off a word): five word loads and four funnel shifts. The word
// pointer is p less its offset, not p's bits masked, so that the compiler still sees
// a shared-memory address (LDS, not generic loads).
__device__ __forceinline__ uint4 lds16_even(const uint8_t* p) {
  const uint32_t off = (uint32_t)reinterpret_cast<uintptr_t>(p) & 2;
  const uint32_t* w = reinterpret_cast<const uint32_t*>(p - off);
  const uint32_t sh = off * 8;
  const uint32_t w0 = w[0], w1 = w[1], w2 = w[2], w3 = w[3], w4 = w[4];
  return make_uint4(__funnelshift_r(w0, w1, sh), __funnelshift_r(w1, w2, sh), __funnelshift_r(w2, w3, sh),
                    __funnelshift_r(w3, w4, sh));
}
__device__ __forceinline__ uint2 lds8_even(const uint8_t* p) {
  const uint32_t off = (uint32_t)reinterpret_cast<uintptr_t>(p) & 2;
  const uint32_t* w = reinterpret_cast<const uint32_t*>(p - off);
  const uint32_t sh = off * 8;
  const uint32_t w0 = w[0], w1 = w[1], w2 = w[2];
  return make_uint2(__funnelshift_r(w0, w1, sh), __funnelshift_r(w1, w2, sh));
}

// Q6_K: planes hi = floor(w / 64) (signed) and lo4 = 4 (w mod 64) of w = sc (q - 32)
// (the file's header). Item u = 2h + v of row r: elements 128h + 32m + 16v + i
// (m = 0..3, i = 0..15), whose low nibbles are byte 64h + 32(m & 1) + 16v + i of ql
// (nibble m >> 1), high bits byte 32h + 16v + i of qh (bits 2m, 2m + 1), scale
// sub-block 8h + 2m + v; each m is 16 columns of one plane row: one 16-byte store.
__device__ __forceinline__ void wg_decode_q6k(const uint8_t* row, uint8_t* planes, int r, int u) {
  const int h = u >> 1, v = u & 1;
  const uint4 la = lds16_even(row + 64 * h + 16 * v), lb = lds16_even(row + 64 * h + 32 + 16 * v);
  const uint4 hb = lds16_even(row + kQ6KQhOffset + 32 * h + 16 * v);
  const uint2 sc8 = lds8_even(row + kQ6KScalesOffset + 8 * h);  // sub-blocks 8h .. 8h + 7
  const uint32_t ql[2][4] = {{la.x, la.y, la.z, la.w}, {lb.x, lb.y, lb.z, lb.w}}, qh[4] = {hb.x, hb.y, hb.z, hb.w};
  uint8_t* dst = planes + (r >> 3) * 128 + (r & 7) * 16;
#pragma unroll
  for (int m = 0; m < 4; ++m) {
    const int sc = byte_s(m < 2 ? sc8.x : sc8.y, 2 * (m & 1) + v);
    // a half's 4 (w + 8,192) = q * 4 sc + 32,768 - 128 sc, in [16,384, 49,152]
    const uint32_t mul = (uint32_t)(4 * sc), add = (uint32_t)(32768 - 128 * sc) * 0x10001u;
    uint32_t hi[4], lo[4];
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      const uint32_t nib = ((m >> 1) ? ql[m & 1][w] >> 4 : ql[m & 1][w]) & 0x0f0f0f0fu;
      const uint32_t top = (m < 2 ? qh[w] << (4 - 2 * m) : qh[w] >> (2 * m - 4)) & 0x30303030u;
      const uint32_t q = nib | top;  // four quants, 0..63
      // 4 (w + 8,192) of elements 4w, 4w + 1 and 4w + 2, 4w + 3, a 16-bit half each: the
      // high bytes are floor(w / 64) + 128 (x 0x80: the s8 value), the low ones 4 (w mod 64)
      const uint32_t p0 = __byte_perm(q, 0, 0x4140) * mul + add, p1 = __byte_perm(q, 0, 0x4342) * mul + add;
      hi[w] = __byte_perm(p0, p1, 0x7531) ^ 0x80808080u;
      lo[w] = __byte_perm(p0, p1, 0x6420);
    }
    const int kc = 8 * h + 2 * m + v;  // the 16-column chunk
    *reinterpret_cast<uint4*>(dst + kc * 1024) = make_uint4(hi[0], hi[1], hi[2], hi[3]);
    *reinterpret_cast<uint4*>(dst + kWgPlaneBytes + kc * 1024) = make_uint4(lo[0], lo[1], lo[2], lo[3]);
  }
}

struct WgQ6K {
  static constexpr int kBlockBytes = (int)sizeof(BlockQ6_K);
  static constexpr int kTokExtraBytes = 0;  // its quants and dx alone
  template <int N>
  struct Sums {
    float q[N / 2];
    __device__ __forceinline__ void zero() {
#pragma unroll
      for (int i = 0; i < N / 2; ++i) q[i] = 0.0f;
    }
  };
  struct Rows {
    float d[2];
    __device__ __forceinline__ Rows(const uint8_t* r0, const uint8_t* r1, int)
        : d{half_bits_to_float(*reinterpret_cast<const uint16_t*>(r0 + kQ6KDOffset)),
            half_bits_to_float(*reinterpret_cast<const uint16_t*>(r1 + kQ6KDOffset))} {}
  };
  static_assert(kQ6KDOffset % 2 == 0, "a halfword read");
  static __device__ __forceinline__ void decode(const uint8_t* row, uint8_t* planes, int r, int u) {
    wg_decode_q6k(row, planes, r, u);
  }
  // the 16 bytes that end with d (Rows reads d alone), at a 2-byte aligned address
  static constexpr int kHeaderOffset = kQ6KDOffset + 2 - 16;
  static constexpr bool kSplitDecode = true;  // its decode is ~1.5 x Q5_K's instructions
  static __device__ __forceinline__ uint4 header(const uint8_t* row) { return lds16_even(row + kHeaderOffset); }
  // isum = 64 (hi . x) + (lo4 . x) / 4, exact in int32 (|64 hi . x| <= 2^27, |4 isum| <= 2^30),
  // then the CPU's chain (Q8DecQ6K::compute: y = sum_q)
  template <int N, class PlanesRead>
  static __device__ __forceinline__ void step(uint64_t da, const uint8_t* xs, const Rows& rows, int q, Sums<N>& s,
                                              PlanesRead planes_read) {
    int acc[N / 2];
    wg_plane_sums<N, 6, 2, true>(acc, da, smem_desc(xs, 128, 2048), [] {}, [] {}, planes_read);
    wg_chain<N, kTokExtraBytes>(s.q, xs, q, rows.d[0], rows.d[1], acc,
                [](float sum, float dx, float d, int v) { return q8_block_step(sum, dx, d, v); });
  }
  template <int N>
  static __device__ __forceinline__ float result(const Sums<N>& s, int i) {
    return s.q[i];
  }
};

// The logits of a warpgroup thread's (row, token) pairs: rows row0 and row0 + 8 (from
// the thread's first), tokens k0 + 8j + 2q and + 1; rows and tokens past the call's unstored.
template <class F, int N>
__device__ __forceinline__ void wg_store_rows(const Q8Call& a, int64_t row0, int q,
                                              const typename F::template Sums<N>& sums, int k0 = 0) {
#pragma unroll
  for (int j = 0; j < N / 8; ++j)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int k = k0 + 8 * j + 2 * q + (i & 1);
      const int64_t row = row0 + 8 * (i >> 1);
      if (k < a.t && row < a.rows) a.y[k * a.ldy + row] = F::template result<N>(sums, 4 * j + i);
    }
}

template <class F, int N>
__global__ void __launch_bounds__(kWgThreads, 1) matvec_q8_wgmma_kernel(Q8Call a) {
  using L = WgLayout<F, N>;
  constexpr int S = L::kStages;
  extern __shared__ __align__(128) uint8_t smem_wg[];
  uint64_t* full = reinterpret_cast<uint64_t*>(smem_wg + L::kBars);
  int* released = reinterpret_cast<int*>(smem_wg + L::kBars + 8 * S);
  // g from lane 0, so that the compiler knows it is the same in the whole warp (the
  // descriptors derived from it then live in uniform registers)
  const int tid = threadIdx.x, g = __shfl_sync(0xffffffffu, tid >> 7, 0), wt = tid & 127, warp = wt >> 5,
            lane = tid & 31, G = lane >> 2, q = lane & 3;
  const int blocks = (int)(a.cols / kQK_K);
  const int64_t groups = (a.rows + kWgCtaRows - 1) / kWgCtaRows;
  const int my_groups = (int)((groups - blockIdx.x + gridDim.x - 1) / gridDim.x);  // >= 1: grid <= groups
  const int64_t last_tile = (a.rows + kTileRows - 1) / kTileRows - 1;
  const int64_t T = a.wg_tokens;
  const uint8_t* const mins = a.wg + blocks * T * kQK_K;
  const uint8_t* const dxs = mins + blocks * T * kWgMinsBytes;

  // row tile i's block of step w (tiles past the last re-read it: their rows are never stored)
  auto weight_src = [&](WgStep w, int i) {
    const int64_t tile0 = (blockIdx.x + (int64_t)w.n * gridDim.x) * (kWgCtaRows / kTileRows);
    const int64_t tile = tile0 + i < last_tile ? tile0 + i : last_tile;
    return a.w + tile * kTileRows * a.row_bytes + (int64_t)w.b * kTileRows * L::kBlockBytes;
  };
  // one thread fills stage s with step w: the weight (it depends on no earlier kernel)
  // before pdl_wait, the activations after
  auto issue_weight = [&](WgStep w, int s) {
    if (w.n >= my_groups) return;
    uint8_t* st = smem_wg + L::kPlanes + s * L::kStage;
    mbar_expect_tx(&full[s], L::kStage);
#pragma unroll 1
    for (int i = 0; i < kWgCtaRows / kTileRows; ++i)
      bulk_copy(st + i * kTileRows * L::kBlockBytes, weight_src(w, i), kTileRows * L::kBlockBytes, &full[s]);
  };
  auto issue_acts = [&](WgStep w, int s) {
    if (w.n >= my_groups) return;
    copy_token_group<F, N>(smem_wg + L::kPlanes + s * L::kStage + L::kRaw, a, mins, dxs,
                           (int64_t)w.b * T + a.wg_k0, &full[s]);
  };

  if (tid == 0) {
#pragma unroll
    for (int k = 0; k < S; ++k) {
      mbar_init(&full[k], 1);
      released[k] = 0;
    }
    fence_mbar_init();
  }
  __syncthreads();
  pdl_launch_dependents();
  if (tid == 0) {
    for (int k = 0; k < S; ++k) issue_weight(WgStep{}.after(k, blocks), k);
  }
  pdl_wait();  // the activations are the previous kernel's output
  if (tid == 0)
    for (int k = 0; k < S; ++k) issue_acts(WgStep{}.after(k, blocks), k);

  uint8_t* const planes = smem_wg + g * 2 * kWgPlaneBytes;
  const uint64_t da = smem_desc(planes, 1024, 128);
  const int hrow = g * kWgRows + warp * 16 + G;  // the CTA row of this thread's first accumulators
  int s = 0;
  uint32_t phase = 0;
#pragma unroll 1
  for (int n = 0; n < my_groups; ++n) {
    typename F::template Sums<N> sums;
    sums.zero();
#pragma unroll 1
    for (int b = 0; b < blocks; ++b) {
      const uint8_t* st = smem_wg + L::kPlanes + s * L::kStage;
      const uint8_t* xs = st + L::kRaw;
      mbar_wait(&full[s], phase);
      // the planes are free: this warp waited for the previous step's last wgmma that
      // read them, one operation of the whole warpgroup, so it has completed for all four
      const uint8_t* raw = st + g * kWgRows * L::kBlockBytes;
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int item = wt + 128 * k, r = item >> 2, u = item & 3;
        F::decode(raw + r * L::kBlockBytes, planes, r, u);
      }
      const typename F::Rows rows(st + hrow * L::kBlockBytes, st + (hrow + 8) * L::kBlockBytes, q);
      fence_proxy_async();
      warpgroup_sync(g);

      F::template step<N>(da, xs, rows, q, sums, [] {});

      // the stage is read: the last of the CTA's 8 warps to finish it refills it, S steps
      // on. A warp is done with it once its own reads are and its wgmma waits have
      // returned (a warpgroup's wgmma completes as one operation, so its planes are free
      // too). No barrier here: warps that finish early go on to the next stage.
      if (lane == 0) {
        __threadfence_block();
        if ((atomicAdd(&released[s], 1) & 7) == 7) {
          const WgStep next = WgStep{n, b}.after(S, blocks);
          issue_weight(next, s);
          issue_acts(next, s);
        }
      }

      if (++s == S) s = 0, phase ^= 1;
    }
    wg_store_rows<F, N>(a, (blockIdx.x + (int64_t)n * gridDim.x) * kWgCtaRows + hrow, q, sums);
  }
}

// ---------------------------------------------------------------- warp-specialized

// The same steps with the work split by kind over warpgroups, so that one step's decode
// overlaps another's products and chains instead of every warp doing them in turn:
//   - decoder warpgroups, one or two a 64-row half of the CTA's rows: per step each waits
//     for its rows' raw block (its own ring of stages, bulk copies its thread 0 issues),
//     decodes it into a plane buffer (two, in turn) beside the rows' 16-byte headers and
//     tells the math warpgroups that read that half; they run on few registers (setmaxnreg);
//   - two math warpgroups multiply and chain on the registers the decoders gave back;
//     they free a plane buffer once its last wgmma has read it, and the last of their 8
//     warps to finish an activation stage refills it.
// kGroups = 1 (launches of 49 ... 80 tokens): 128 rows, two decoders, each math warpgroup
// one half's rows and all N tokens; two plane buffers and two decoders' rings leave room
// for 80 tokens (kWsMaxTokens). What bounds it is shared memory: the planes are written
// and read once each, and the activations read once per plane and warpgroup (Nsight
// Compute at t = 80: L1/shared 88 % busy; docs/performance.md).
// kGroups = 2 (launches of q8_shared_min_tokens() on, N = 64 ... 128): 64 rows, both
// math warpgroups the same planes for N tokens each (the two token groups of a stage), so
// a launch of up to 256 tokens reads and decodes each block once where two launches of
// 128 did twice; one decoder for Q4_K/Q5_K (224 registers for the math), two of 32 rows
// for Q6_K (its decode is the longer, its math needs 192). Seed head, H100: t = 256
// 1,647 against 1,947 us as two launches of 128 (docs/performance.md). Q6_K's stages
// hold no mins room (WgActs<N, 0>), so that two raw stages fit beside two activation
// stages at N = 128 (1,610 against 1,853 us with one).
constexpr int kWsMaxTokens = kQ8WsMaxTokens;
constexpr int kWsHeaderBytes = 16;

template <class F, int N, int kGroups>
struct WsLayout {
  static constexpr int kHalves = 2 / kGroups;  // 64-row halves of the CTA's rows
  static constexpr int kCtaRows = kHalves * kWgRows;
  // decoder warpgroups a half: two (32 rows each) for a format whose decode is the longer
  // step (F::kSplitDecode: Q6_K, whose math also needs fewer registers), else one
  static constexpr int kSplit = kGroups == 2 && F::kSplitDecode ? 2 : 1;
  static constexpr int kDecoders = kHalves * kSplit;
  static constexpr int kThreads = (kDecoders + 2) * 128;
  // registers a thread (setmaxnreg): the launch gives every thread kLaunchRegs; the
  // decoders give back what the math warpgroups take (Q6_K's decode spills at 48)
  static constexpr int kLaunchRegs = 65536 / kThreads / 8 * 8;
  static constexpr int kDecodeRegs = kGroups == 1 || kSplit == 2 ? 64 : 56;
  static constexpr int kMathRegs = (kLaunchRegs + kDecoders * (kLaunchRegs - kDecodeRegs) / 2) / 8 * 8;
  static constexpr int kBlockBytes = F::kBlockBytes;
  // [half][hi, lo], then the headers
  static constexpr int kPlaneBuf = kHalves * 2 * kWgPlaneBytes + kCtaRows * kWsHeaderBytes;
  using Acts = WgActs<N, F::kTokExtraBytes>;
  static constexpr int kGroupActs = Acts::kBytes;
  static constexpr int kActs = kGroups * kGroupActs;
  static constexpr int kPartRows = kWgRows / kSplit;  // rows a decoder decodes
  static constexpr int kPartRaw = kPartRows * kBlockBytes;  // their block
  // kMinRaw raw stages a decoder (one where two activation stages of 2 x 128 tokens
  // leave room for no more, Q4_K/Q5_K: the decoder then waits for each copy; splitting
  // the rows' block into two stages decoded in turn measured the same), then as many
  // activation stages as fit (up to 4), then raw stages up to 6 a decoder
  static constexpr int kMinRaw =
      kWgSmemBudget - 2 * kPlaneBuf - 2 * kActs - 256 >= (size_t)2 * kDecoders * kPartRaw ? 2 : 1;
  static constexpr int kActsFit =
      (int)((kWgSmemBudget - 2 * kPlaneBuf - kDecoders * kMinRaw * kPartRaw - 256) / kActs);
  static constexpr int kActsStages = kActsFit < 4 ? kActsFit : 4;
  static constexpr int kFit = (int)((kWgSmemBudget - 2 * kPlaneBuf - kActsStages * kActs - 256) / (kDecoders * kPartRaw));
  static constexpr int kRawStages = kFit < 6 ? kFit : 6;
  static constexpr int kRaw0 = 2 * kPlaneBuf + kActsStages * kActs;
  static constexpr int kBars = kRaw0 + kDecoders * kRawStages * kPartRaw;
  // raw_full[kDecoders][kRawStages], acts_full[kActsStages], planes_full[2][kHalves],
  // planes_empty[2][kHalves], released[kActsStages]
  static constexpr size_t kSmem = (size_t)kBars + 8 * (kDecoders * kRawStages + kActsStages + 4 * kHalves) + 4 * kActsStages;
  static_assert(kGroups == 1 || kGroups == 2, "one or two token groups a CTA");
  static_assert((kGroups == 2 || N <= kWsMaxTokens) && kActsStages >= 2 && kRawStages >= kMinRaw, "stages");
  static_assert(kDecoders * 128 * (kLaunchRegs - kDecodeRegs) >= 256 * (kMathRegs - kLaunchRegs) &&
                    kDecodeRegs % 8 == 0 && kMathRegs % 8 == 0,
                "the math takes no more registers than the decoders give back, in setmaxnreg's steps");
  static_assert(kSmem <= kWgSmemBudget, "q8_wgmma_ready checks the device for the budget, not each layout");
  static_assert(kPartRaw % 16 == 0 && kGroupActs % 16 == 0 && kPlaneBuf % 128 == 0 && kBars % 8 == 0, "alignment");
};

template <class F, int N, int kGroups>
__global__ void __launch_bounds__(WsLayout<F, N, kGroups>::kThreads, 1) matvec_q8_wgmma_ws_kernel(Q8Call a) {
  using L = WsLayout<F, N, kGroups>;
  constexpr int RS = L::kRawStages, SA = L::kActsStages, D = L::kDecoders, H = L::kHalves, kSplit = L::kSplit;
  extern __shared__ __align__(128) uint8_t smem_ws[];
  uint64_t* raw_full = reinterpret_cast<uint64_t*>(smem_ws + L::kBars);  // [decoder][stage]
  uint64_t* acts_full = raw_full + D * RS;
  uint64_t* planes_full = acts_full + SA;        // [buffer][half]
  uint64_t* planes_empty = planes_full + 2 * H;  // [buffer][half]
  int* released = reinterpret_cast<int*>(planes_empty + 2 * H);
  const int tid = threadIdx.x, wg = __shfl_sync(0xffffffffu, tid >> 7, 0), wt = tid & 127, warp = wt >> 5,
            lane = tid & 31, G = lane >> 2, q = lane & 3;
  const int blocks = (int)(a.cols / kQK_K);
  const int64_t groups = (a.rows + L::kCtaRows - 1) / L::kCtaRows;
  const int my_groups = (int)((groups - blockIdx.x + gridDim.x - 1) / gridDim.x);  // >= 1: grid <= groups
  const int steps = my_groups * blocks;
  const int64_t last_tile = (a.rows + kTileRows - 1) / kTileRows - 1;
  const int64_t T = a.wg_tokens;
  const uint8_t* const mins = a.wg + blocks * T * kQK_K;
  const uint8_t* const dxs = mins + blocks * T * kWgMinsBytes;
  auto plane_buf = [&](int p) { return smem_ws + p * L::kPlaneBuf; };
  auto headers = [&](int p) { return plane_buf(p) + H * 2 * kWgPlaneBytes; };
  auto raw_stage = [&](int d, int slot) { return smem_ws + L::kRaw0 + (d * RS + slot) * L::kPartRaw; };

  // decoder d's rows of step s into its stage `slot`: kPartRows / kTileRows row tiles
  auto issue_raw = [&](int d, int s, int slot) {
    if (s >= steps) return;
    const int n = s / blocks, b = s - n * blocks;
    uint8_t* st = raw_stage(d, slot);
    uint64_t* bar = &raw_full[d * RS + slot];
    mbar_expect_tx(bar, L::kPartRaw);
    const int64_t tile0 =
        (blockIdx.x + (int64_t)n * gridDim.x) * (L::kCtaRows / kTileRows) + d * (L::kPartRows / kTileRows);
#pragma unroll 1
    for (int i = 0; i < L::kPartRows / kTileRows; ++i) {
      const int64_t tile = tile0 + i < last_tile ? tile0 + i : last_tile;  // past the last: never stored
      bulk_copy(st + i * kTileRows * L::kBlockBytes,
                a.w + tile * kTileRows * a.row_bytes + (int64_t)b * kTileRows * L::kBlockBytes,
                kTileRows * L::kBlockBytes, bar);
    }
  };
  auto issue_acts = [&](int s, int slot) {
    if (s >= steps) return;
    const int b = s % blocks;
    uint8_t* st = smem_ws + 2 * L::kPlaneBuf + slot * L::kActs;
    mbar_expect_tx(&acts_full[slot], L::kActs);
#pragma unroll
    for (int h = 0; h < kGroups; ++h)  // token group h: the launch's tokens hN .. hN + N - 1
      copy_token_group<F, N>(st + h * L::kGroupActs, a, mins, dxs, (int64_t)b * T + a.wg_k0 + h * N,
                             &acts_full[slot]);
  };

  if (tid == 0) {
    for (int k = 0; k < D * RS; ++k) mbar_init(&raw_full[k], 1);
    for (int k = 0; k < SA; ++k) {
      mbar_init(&acts_full[k], 1);
      released[k] = 0;
    }
    for (int k = 0; k < 2 * H; ++k) {
      mbar_init(&planes_full[k], kSplit);          // the half's decoders
      mbar_init(&planes_empty[k], 4 * kGroups);  // a warp of each math warpgroup that reads the half
    }
    fence_mbar_init();
  }
  __syncthreads();
  pdl_launch_dependents();

  if (wg < D) {  // ------------------------------------------------ decoder d: rows of half h
    setmaxnreg_dec<L::kDecodeRegs>();
    const int d = wg, h = d / kSplit, row0 = (d % kSplit) * L::kPartRows;  // row0: within the half
    if (wt == 0) {
      for (int k = 0; k < RS; ++k) issue_raw(d, k, k);  // the weight depends on no earlier kernel
      if (d == 0) {
        pdl_wait();  // the activations are the previous kernel's output
        for (int k = 0; k < SA; ++k) issue_acts(k, k);
      }
    }
    int slot = 0;
    uint32_t rphase = 0;
#pragma unroll 1
    for (int s = 0; s < steps; ++s) {
      const int p = s & 1;
      mbar_wait(&raw_full[d * RS + slot], rphase);
      mbar_wait(&planes_empty[H * p + h], ((s >> 1) & 1) ^ 1);  // a fresh barrier passes parity 1
      const uint8_t* raw = raw_stage(d, slot);
      uint8_t* planes = plane_buf(p) + h * 2 * kWgPlaneBytes;
#pragma unroll
      for (int k = 0; k < L::kPartRows / 32; ++k) {  // kPartRows x 4 items
        const int item = wt + 128 * k, r = item >> 2, u = item & 3;
        F::decode(raw + r * L::kBlockBytes, planes, row0 + r, u);
      }
      if (wt < L::kPartRows)
        *reinterpret_cast<uint4*>(headers(p) + (h * kWgRows + row0 + wt) * kWsHeaderBytes) =
            F::header(raw + wt * L::kBlockBytes);
      fence_proxy_async();
      warpgroup_sync(d);  // its rows' planes are written and its raw stage is read
      if (wt == 0) {
        mbar_arrive(&planes_full[H * p + h]);
        issue_raw(d, s + RS, slot);
      }
      if (++slot == RS) slot = 0, rphase ^= 1;
    }
    return;
  }

  // ------------------------------------------------------------------ the math of warpgroup g
  setmaxnreg_inc<L::kMathRegs>();
  const int g = wg - D;
  const int half = kGroups == 1 ? g : 0, group = kGroups == 1 ? 0 : g;  // its rows' half and tokens
  const int hrow = half * kWgRows + warp * 16 + G;  // the CTA row of this thread's first accumulators
  int sa = 0, s = 0;
  uint32_t aphase = 0;
#pragma unroll 1
  for (int n = 0; n < my_groups; ++n) {
    typename F::template Sums<N> sums;
    sums.zero();
#pragma unroll 1
    for (int b = 0; b < blocks; ++b, ++s) {
      const int p = s & 1;
      const uint8_t* xs = smem_ws + 2 * L::kPlaneBuf + sa * L::kActs + group * L::kGroupActs;
      mbar_wait(&acts_full[sa], aphase);
      mbar_wait(&planes_full[H * p + half], (s >> 1) & 1);
      const uint8_t* hdr = headers(p) - F::kHeaderOffset;  // Rows reads the header bytes at their block offsets
      const typename F::Rows rows(hdr + hrow * kWsHeaderBytes, hdr + (hrow + 8) * kWsHeaderBytes, q);
      const uint64_t da = smem_desc(plane_buf(p) + half * 2 * kWgPlaneBytes, 1024, 128);
      F::template step<N>(da, xs, rows, q, sums, [&] {
        __syncwarp();  // every lane's header reads and plane wgmma are done: the planes are free
        if (lane == 0) mbar_arrive(&planes_empty[H * p + half]);
      });
      // the activation stage is read: the last of the 8 math warps to finish it refills it
      if (lane == 0) {
        __threadfence_block();
        if ((atomicAdd(&released[sa], 1) & 7) == 7) issue_acts(s + SA, sa);
      }
      if (++sa == SA) sa = 0, aphase ^= 1;
    }
    wg_store_rows<F, N>(a, (blockIdx.x + (int64_t)n * gridDim.x) * L::kCtaRows + hrow, q, sums, group * N);
  }
}

// One block per CTA: every token's quants, mins halves and scale of the block in
// the operand layout (the file's header); tokens past t are zeros.
__global__ void q8_wgmma_relayout_kernel(Q8Args a, uint8_t* dst, int T, int blocks) {
  pdl_launch_dependents();
  pdl_wait();
  const int64_t b = blockIdx.x;
  uint8_t* const quants = dst + b * T * kQK_K;
  uint8_t* const mins = dst + (int64_t)blocks * T * kQK_K + b * T * kWgMinsBytes;
  float* const dxs = reinterpret_cast<float*>(dst + (int64_t)blocks * T * (kQK_K + kWgMinsBytes)) + b * T;
  for (int i = threadIdx.x; i < T * 16; i += blockDim.x) {  // in destination order: the writes are contiguous
    const int n = (i >> 7) * 8 + (i & 7), kc = (i >> 3) & 15;
    uint4 v = make_uint4(0, 0, 0, 0);
    if (n < a.t) v = *reinterpret_cast<const uint4*>(a.xq + n * a.xq_pitch + b * kQK_K + 16 * kc);
    reinterpret_cast<uint4*>(quants)[i] = v;
  }
  if (a.type == (uint32_t)GgmlType::Q6_K) {  // no mins: the scales from its records (WgQ6K)
    for (int n = threadIdx.x; n < T; n += blockDim.x)
      dxs[n] = n < a.t ? *reinterpret_cast<const float*>(a.meta + ((int64_t)n * a.meta_per_token + b) * kQ8Sum16RecBytes +
                                                         kQ8Sum16DxOffset)
                       : 0.0f;
    return;
  }
  for (int n = threadIdx.x; n < T; n += blockDim.x) {
    uint4 lo = make_uint4(0, 0, 0, 0), hi = lo;
    float dx = 0.0f;
    if (n < a.t) {  // the f16 record: half2(lo_2i, lo_2i+1), half2(hi_2i, hi_2i+1) for i = 0..3, then dx
      const uint32_t* r =
          reinterpret_cast<const uint32_t*>(a.meta_f16 + ((int64_t)n * a.meta_per_token + b) * kQ8F16RecSrcBytes);
      lo = make_uint4(r[0], r[2], r[4], r[6]);
      hi = make_uint4(r[1], r[3], r[5], r[7]);
      dx = __uint_as_float(r[8]);
    }
    uint8_t* m = mins + (n >> 3) * 256 + (n & 7) * 16;
    *reinterpret_cast<uint4*>(m) = lo;
    *reinterpret_cast<uint4*>(m + 128) = hi;
    dxs[n] = dx;
  }
}

template <class F, int N>
void launch_wgmma(const Q8Call& a, cudaStream_t stream) {
  using L = WgLayout<F, N>;
  // fits: kSmem <= kWgSmemBudget (static_assert), which q8_wgmma_ready checked the device for
  Q8Call args = a;
  void* params[] = {&args};
  launch_persistent(reinterpret_cast<const void*>(&matvec_q8_wgmma_kernel<F, N>), params, kWgThreads, L::kSmem,
                    a.rows, kWgCtaRows, stream, "matvec_q8_wgmma");
}

template <class F, int N, int kGroups = 1>
void launch_ws(const Q8Call& a, cudaStream_t stream) {
  using L = WsLayout<F, N, kGroups>;
  Q8Call args = a;
  void* params[] = {&args};
  launch_persistent(reinterpret_cast<const void*>(&matvec_q8_wgmma_ws_kernel<F, N, kGroups>), params, L::kThreads,
                    L::kSmem, a.rows, L::kCtaRows, stream, kGroups == 1 ? "matvec_q8_wgmma_ws" : "matvec_q8_wgmma_ws_shared");
}

template <class F>
void launch_wgmma_tokens(const Q8Call& a, cudaStream_t stream) {
  switch (wg_tokens(a.t)) {
    case 32: launch_wgmma<F, 32>(a, stream); break;
    case 64: launch_wgmma<F, 64>(a, stream); break;
    case 80: launch_wgmma<F, 80>(a, stream); break;
    case 96: launch_wgmma<F, 96>(a, stream); break;
    case 112: launch_wgmma<F, 112>(a, stream); break;
    default: launch_wgmma<F, 128>(a, stream); break;
  }
}

// A launch of 2N tokens on the shared-decode kernel: N = wg_shared_tokens(t)
template <class F>
void launch_shared_tokens(const Q8Call& a, cudaStream_t stream) {
  switch (wg_shared_tokens(a.t)) {
    case 64: launch_ws<F, 64, 2>(a, stream); break;
    case 80: launch_ws<F, 80, 2>(a, stream); break;
    case 96: launch_ws<F, 96, 2>(a, stream); break;
    case 112: launch_ws<F, 112, 2>(a, stream); break;
    default: launch_ws<F, 128, 2>(a, stream); break;
  }
}

}  // namespace
#endif  // MUSER_CUDA_WGMMA

bool q8_ws_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("MUSER_Q8_WS");
    return !e || std::atoi(e) != 0;
  }();
  return on;
}

int q8_shared_min_tokens() {
  // MUSER_Q8_SHARED=0 turns the shared-decode kernel off, =<t> moves its threshold (for
  // measuring); it is a decoder-warpgroup kernel, so MUSER_Q8_WS=0 turns it off too
  static const int min_tokens = [] {
    const char* e = std::getenv("MUSER_Q8_SHARED");
    if (!q8_ws_enabled()) return INT_MAX;
    if (!e) return kQ8SharedMinTokens;
    const int v = std::atoi(e);
    return v <= 0 ? INT_MAX : v;
  }();
  return min_tokens;
}

bool q8_wgmma_type(uint32_t type) {
  return type == (uint32_t)GgmlType::Q5_K || type == (uint32_t)GgmlType::Q4_K || type == (uint32_t)GgmlType::Q6_K;
}

int q8_wgmma_min_tokens(uint32_t type) {
  // MUSER_Q8_WGMMA=0 turns the kernels off, MUSER_Q8_WGMMA=<t> moves every type's threshold
  // (for measuring)
  static const int forced = [] {
    const char* e = std::getenv("MUSER_Q8_WGMMA");
    if (!e) return 0;
    const int v = std::atoi(e);
    return v <= 0 ? INT_MAX : v;
  }();
  if (forced) return forced;
  if (type == (uint32_t)GgmlType::Q6_K) return kQ8WgmmaMinTokensQ6K;
  return q8_ws_enabled() ? kQ8WsMinTokens : kQ8WgmmaMinTokens;
}

bool q8_wgmma_ready(uint32_t type, int t) {
  if (!MUSER_CUDA_WGMMA) return false;  // built by a toolkit without sm_90a
  if (!q8_wgmma_type(type)) return false;
  if (t < q8_wgmma_min_tokens(type)) return false;
  int dev = 0, major = 0, minor = 0;
  check(cudaGetDevice(&dev), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev), "cudaDeviceGetAttribute(major)");
  check(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev), "cudaDeviceGetAttribute(minor)");
  // sm_90a code runs on 9.0 alone; every such part opts in to the 227 KB the stages take
  return major == 9 && minor == 0 && smem_optin_bytes() >= kWgSmemBudget;
}

// t in 8-token groups, and kQ8WgmmaChunk zeros after them: a launch of `count` tokens
// from token k0 reads wg_tokens(count) <= count + 31 of them, or (shared decode)
// 2 wg_shared_tokens(count) <= count + 127
int q8_wgmma_layout_tokens(int t) { return (t + 7) / 8 * 8 + kQ8WgmmaChunk; }

size_t q8_wgmma_acts_bytes(int64_t K, int t) {
  return (size_t)(K / kQK_K) * (size_t)q8_wgmma_layout_tokens(t) * kWgTokBytes;
}

#if MUSER_CUDA_WGMMA
void q8_wgmma_relayout(const Q8Args& a, int64_t K, uint8_t* dst, cudaStream_t stream) {
  const int blocks = (int)(K / kQK_K);
  launch_pdl(q8_wgmma_relayout_kernel, dim3((unsigned)blocks), dim3(256), 0, stream, "q8_wgmma_relayout", a, dst,
             q8_wgmma_layout_tokens(a.t), blocks);
  check_launch("q8_wgmma_relayout");
}

void matvec_q8_wgmma(const Q8Call& a, cudaStream_t stream) {
  if (!a.wg) throw DeviceError("matvec_q8_wgmma: the activations were not laid out for it");
  if (a.fold.op != EpilogueOp::None) throw DeviceError("matvec_q8_wgmma: no fused node (kQ8FoldMaxTokens)");
  const bool shared = a.t >= q8_shared_min_tokens();
  const int computed = shared ? 2 * wg_shared_tokens(a.t) : wg_tokens(a.t);
  if (a.t > (shared ? kQ8SharedChunk : kQ8WgmmaChunk) || a.wg_k0 + computed > a.wg_tokens)
    throw DeviceError("matvec_q8_wgmma: a launch past its kernel's tokens or the activations' layout");
  if (shared) {
    if (a.type == (uint32_t)GgmlType::Q6_K) launch_shared_tokens<WgQ6K>(a, stream);
    else if (a.type == (uint32_t)GgmlType::Q5_K) launch_shared_tokens<WgKQuant<true>>(a, stream);
    else launch_shared_tokens<WgKQuant<false>>(a, stream);
    check_launch("matvec_q8_wgmma_shared");
    return;
  }
  if (a.type == (uint32_t)GgmlType::Q6_K) {  // no decoder warpgroups of its own
    launch_wgmma_tokens<WgQ6K>(a, stream);
    check_launch("matvec_q8_wgmma");
    return;
  }
  if (q8_ws_enabled() && a.t <= kQ8WsMaxTokens) {
    const bool n64 = wg_tokens(a.t) <= 64;
    if (a.type == (uint32_t)GgmlType::Q5_K)
      n64 ? launch_ws<WgKQuant<true>, 64>(a, stream) : launch_ws<WgKQuant<true>, 80>(a, stream);
    else n64 ? launch_ws<WgKQuant<false>, 64>(a, stream) : launch_ws<WgKQuant<false>, 80>(a, stream);
    check_launch("matvec_q8_wgmma_ws");
    return;
  }
  if (a.type == (uint32_t)GgmlType::Q5_K) launch_wgmma_tokens<WgKQuant<true>>(a, stream);
  else launch_wgmma_tokens<WgKQuant<false>>(a, stream);
  check_launch("matvec_q8_wgmma");
}

#else
void q8_wgmma_relayout(const Q8Args&, int64_t, uint8_t*, cudaStream_t) {
  throw DeviceError("q8_wgmma_relayout: built without sm_90a");
}
void matvec_q8_wgmma(const Q8Call&, cudaStream_t) { throw DeviceError("matvec_q8_wgmma: built without sm_90a"); }
#endif  // MUSER_CUDA_WGMMA

}  // namespace muser::cuda
