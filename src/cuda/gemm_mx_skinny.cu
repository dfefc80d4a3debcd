// MXFP8 x MXFP8 GEMM on Hopper for an A of few rows (decode: a few tokens against an MXFP8 weight
// B of N x K; E4M3 or E5M2 codes, an E8M0 scale per 32 values of K). docs/perf.md, "An MXFP8
// skinny kernel".
//
// The NVFP4 skinny kernel's shape (skinny_gemm.cuh): each thread converts its share of B in
// registers and multiplies it with mma.sync, B's rows as the 16-row operand. What differs is the
// scales. An E8M0 pair's product 2^(sa + sb - 254) spans far more than fp16, so it cannot ride in
// the fp16 values as NVFP4's E4M3 scales do; each 32-value block gets its own products instead
// (two mma.sync of K 16, from zero), and the block's sum joins the fp32 accumulators times its
// two scales:
//
//   codes --cp.async, 16 bytes per lane--> shared memory --8-byte pieces, cvt--> fp16 pairs
//     --mma.sync x 2--> the block's sum s (fp32) --fma(s * 2^(sa-127), 2^(sb-127), acc)--> acc
//   accumulators --4 warps summed in shared memory, in warp order--> D (or a split's slice)
//
// Exactness: E4M3 and E5M2 values are fp16 values (one cvt per pair), the tensor cores multiply
// fp16 exactly and accumulate in fp32. A block's sum, when not 0, lies in [2^-32, 2^37) (E5M2 x
// E5M2 at both ends), so s * 2^(sa-127) is exact while A's scale lies in [2^-94, 2^90]; the fma
// then rounds s * 2^(sa-127) * 2^(sb-127) + acc once. Each scale is its code shifted into an fp32
// exponent, which holds for the codes 1 .. 254. A chunk in which one of A's scales leaves that
// range (a zero block's 2^-127, a NaN, the extremes) or one of B's is 0 or 0xFF takes
// add_scaled_exact for all its blocks, which holds every pair. Either way D is within the fp32
// accumulation bound of the CPU GEMM's result, as on the other paths. (One difference: the CPU
// GEMM reads each value as an fp32 code * scale, which overflows to Inf for a scale above 2^112
// or so beside a large code; no quantizer writes such a scale, and here the product is exact.)
//
// Which K slot a code takes is free, as long as both operands use the same map: a block's 32 codes
// of a row are 4 threads' 8 bytes (thread t % 4: bytes 8 (t % 4) .. + 7), whose byte pairs (0, 1),
// (2, 3) are the thread's slots (2t, 2t+1), (2t+8, 2t+9) of the block's first mma and (4, 5),
// (6, 7) those of its second.
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include <cstdint>

#include "cuda/cp_async.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/gemm_mx_skinny.hpp"
#include "cuda/skinny_gemm.cuh"

namespace microscale::cuda {
namespace {

constexpr int kChunkK = 64;              // K values of a row per warp step: two blocks of 32
constexpr int kPieces = 2;               // a thread's 8-byte pieces of a row per chunk, one per block
constexpr int kStageRowBytes = 32 * 16;  // a chunk's row of codes for each of 8 rows: 8 x 64 bytes

// Where a thread's rows of one operand lie, in batch l: 32-bit byte offsets from the batch's
// codes and scales (cuda::gemm sends the MX skinny path only batches of codes and of scales below
// 2 GiB), computed once per thread, so that a chunk costs an add per row. A row past the operand
// reads the last row: its products land in D's rows or columns past the operand, never stored.
// (A block past K must read as zero codes and a finite scale instead: its products join the others.)
struct MxOperandRows {
  const uint8_t* codes;   // batch l's
  const uint8_t* scales;  // batch l's

  __device__ MxOperandRows(const GemmDeviceOperand& op, int64_t l)
      : codes(op.data + l * op.batch_bytes), scales(op.scales + l * op.scale_batch_bytes) {}
};

__device__ __forceinline__ int64_t clamp_row(int64_t row, int64_t rows) {
  return row < rows ? row : rows - 1;
}

// Where the 16 bytes of row `row`'s chunk 0 that the row's lane `quad` copies start (bytes
// 16 quad .. + 15 of the chunk's 64).
__device__ __forceinline__ uint32_t code_row_offset(const GemmDeviceOperand& op, int64_t row, int64_t rows,
                                                    int quad) {
  return static_cast<uint32_t>(clamp_row(row, rows) * op.row_bytes + 16 * quad);
}

// Row `row`'s scales of chunk 0; chunk c's are scale_chunk_offset(op, c) further. Swizzled:
// common.cuh's scale_offset split into its row and column terms (a chunk's two scales are
// adjacent bytes of one atom row).
__device__ __forceinline__ uint32_t scale_row_offset(const GemmDeviceOperand& op, int64_t row, int64_t rows,
                                                     int64_t k) {
  const int64_t r = clamp_row(row, rows);
  if (!op.swizzled) return static_cast<uint32_t>(r * op.scale_row_bytes);
  const int64_t atoms_per_row = (k / 32 + 3) / 4;
  return static_cast<uint32_t>((r >> 7) * atoms_per_row * 512 + (r & 31) * 16 + ((r >> 5) & 3) * 4);
}
__device__ __forceinline__ uint32_t scale_chunk_offset(const GemmDeviceOperand& op, int64_t chunk) {
  const uint32_t c = static_cast<uint32_t>(chunk);
  return op.swizzled ? (c >> 1) * 512 + 2 * (c & 1) : 2 * c;
}

// The two block scales (low byte first) at `at`; with the second block past K, 0x7F (2^0) for it:
// its codes are zeros, and a finite scale keeps NaN out of their products. (Its byte is there to
// read: swizzled rows hold a multiple of 4 scales, and cuda::gemm sends this kernel compact rows of
// an even number.)
__device__ __forceinline__ uint32_t load_scale_pair(const uint8_t* at, bool second_in_k) {
  const uint32_t pair = __ldg(reinterpret_cast<const unsigned short*>(at));
  return second_in_k ? pair : (pair & 0xFFu) | 0x7F00u;
}

// Each chunk's scales of a thread, two rows' pairs per word (fewer registers for the two chunks
// loaded ahead): B's rows n0 + lane / 4 + 16 g (+ 8) in b[g]'s low (high) half, A's rows
// m0 + 8 i + 2 (lane % 4) (+ 1) in a[i]'s (the columns of the thread's accumulators).
template <int kGroupsN, int kTilesM>
struct MxScales {
  uint32_t b[kGroupsN], a[kTilesM];
};

// Scale code of block `blk` (0, 1) of row `half` (0, 1) in a word of MxScales.
__device__ __forceinline__ uint32_t scale_code(uint32_t word, int half, int blk) {
  return (word >> (16 * half + 8 * blk)) & 0xFFu;
}

// 8 codes (one 8-byte piece) -> 4 fp16 pairs, exactly: pair q holds codes 2q, 2q + 1.
template <bool kE5M2>
__device__ __forceinline__ uint4 fp8_piece_to_fp16_pairs(const uint2& piece) {
  constexpr __nv_fp8_interpretation_t kKind = kE5M2 ? __NV_E5M2 : __NV_E4M3;
  const auto pair = [](uint32_t two_codes) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(two_codes), kKind);
    return static_cast<uint32_t>(h.x) | (static_cast<uint32_t>(h.y) << 16);
  };
  return make_uint4(pair(piece.x & 0xFFFFu), pair(piece.x >> 16), pair(piece.y & 0xFFFFu),
                    pair(piece.y >> 16));
}

// Whether A's scale code `s` lies in [2^-94, 2^90], where a block's sum times it is exact.
__device__ __forceinline__ bool fast_a_scale(uint32_t s) { return s - 33u <= 217u - 33u; }

// Whether no byte of `w` (four of B's scale codes) is 0 or 0xFF, the codes whose value is not
// their bits shifted into an fp32 exponent (2^-127 is subnormal, 0xFF NaN).
__device__ __forceinline__ bool fast_b_scales(uint32_t w) {
  const auto has_zero_byte = [](uint32_t v) { return ((v - 0x01010101u) & ~v & 0x80808080u) != 0; };
  return !has_zero_byte(w) && !has_zero_byte(~w);
}

// acc + sum * 2^(sa - 127) * 2^(sb - 127) for any pair of E8M0 codes (0xFF: NaN). The exponent
// e = sa + sb - 254 is split in halves hi = floor(e / 2) and lo = e - hi, both in [-127, 127]:
// sum * 2^hi rounds only below fp32's normal range, where 2^lo <= 2^-93 shrinks its error below
// the fma's own; it overflows only where sum * 2^e does.
__device__ __forceinline__ float add_scaled_exact(float acc, float sum, uint32_t sa, uint32_t sb) {
  if (sa == 0xFFu || sb == 0xFFu) return __uint_as_float(0x7FC00000u);
  const int e = static_cast<int>(sa + sb) - 254, hi = e >> 1, lo = e - hi;
  // 2^x for x in [-127, 127]: its bits in the exponent, or 2^-127's subnormal bits.
  const auto power_of_two = [](int x) {
    return __uint_as_float(x == -127 ? 0x00400000u : static_cast<uint32_t>(x + 127) << 23);
  };
  return fmaf(sum * power_of_two(hi), power_of_two(lo), acc);
}

// acc[g][i] += the chunk's products of B's row group g and A's tile i, block by block. `stage`:
// the warp's stage of the chunk, row j's 512 bytes at stage + 512 j (B's kRowsB rows, then A's
// kTilesM), this lane's piece of block b at + piece_at[b]. kFast: the chunk's scales passed
// fast_a_scale and fast_b_scales.
template <bool kFast, bool kE5M2A, bool kE5M2B, int kGroupsN, int kTilesM>
__device__ __forceinline__ void multiply(const uint8_t* stage, const uint32_t (&piece_at)[kPieces],
                                         const MxScales<kGroupsN, kTilesM>& scales,
                                         float (&acc)[kGroupsN][kTilesM][4]) {
  constexpr int kRowsB = 2 * kGroupsN;
  const auto piece = [&](int j, int blk) {
    return *reinterpret_cast<const uint2*>(stage + kStageRowBytes * j + piece_at[blk]);
  };
#pragma unroll
  for (int blk = 0; blk < kPieces; ++blk) {
    uint32_t sb[kRowsB], sa[2 * kTilesM];
    float scale_b[kRowsB], scale_a[2 * kTilesM];
#pragma unroll
    for (int j = 0; j < kRowsB; ++j) {
      sb[j] = scale_code(scales.b[j / 2], j % 2, blk);
      scale_b[j] = __uint_as_float(sb[j] << 23);  // 2^(sb - 127) for sb in 1 .. 254
    }
#pragma unroll
    for (int c = 0; c < 2 * kTilesM; ++c) {
      sa[c] = scale_code(scales.a[c / 2], c % 2, blk);
      scale_a[c] = __uint_as_float(sa[c] << 23);  // 2^(sa - 127) for sa in 1 .. 254
    }
    uint4 a_pairs[kTilesM];
#pragma unroll
    for (int i = 0; i < kTilesM; ++i) a_pairs[i] = fp8_piece_to_fp16_pairs<kE5M2A>(piece(kRowsB + i, blk));
#pragma unroll
    for (int g = 0; g < kGroupsN; ++g) {
      const uint4 low = fp8_piece_to_fp16_pairs<kE5M2B>(piece(2 * g, blk));
      const uint4 high = fp8_piece_to_fp16_pairs<kE5M2B>(piece(2 * g + 1, blk));
#pragma unroll
      for (int i = 0; i < kTilesM; ++i) {
        float sum[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        mma_16x8x16(sum, low.x, high.x, low.y, high.y, a_pairs[i].x, a_pairs[i].y);
        mma_16x8x16(sum, low.z, high.z, low.w, high.w, a_pairs[i].z, a_pairs[i].w);
#pragma unroll
        for (int e = 0; e < 4; ++e) {  // D[B row 2g + e / 2][A row 2i + e % 2] of the thread's
          const int rb = 2 * g + e / 2, ca = 2 * i + e % 2;
          acc[g][i][e] = kFast ? fmaf(sum[e] * scale_a[ca], scale_b[rb], acc[g][i][e])
                               : add_scaled_exact(acc[g][i][e], sum[e], sa[ca], sb[rb]);
        }
      }
    }
  }
}

template <int kTilesM>
__host__ __device__ constexpr int rows_per_chunk() {
  return 2 * skinny_groups_n(kTilesM) + kTilesM;
}

// Shared memory of a block: per warp, kSkinnyStages chunks of kRows rows of kStageRowBytes.
template <int kTilesM>
constexpr int shared_bytes() {
  return kSkinnyWarps * kSkinnyStages * rows_per_chunk<kTilesM>() * kStageRowBytes;
}

template <int kTilesM, bool kE5M2A, bool kE5M2B>
__global__ void __launch_bounds__(kSkinnyThreads, kSkinnyBlocksPerSm)
    mx_skinny_gemm_kernel(const __grid_constant__ GemmDeviceParams p) {
  constexpr int kGroupsN = skinny_groups_n(kTilesM), kRowsB = 2 * kGroupsN;
  constexpr int kRows = rows_per_chunk<kTilesM>();
  using Scales = MxScales<kGroupsN, kTilesM>;
  extern __shared__ uint4 shared_slots[];  // the warps' stages; then the partial sums

  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  const int quad = lane % 4, lane_row = lane / 4;
  const SkinnyWarpWork work(p, kChunkK, 16 * kGroupsN, 8 * kTilesM, warp);
  const MxOperandRows b(p.b, work.l), a(p.a, work.l);
  // The thread's rows: B's n0 + lane / 4 + 8 j (codes and scales); A's m0 + lane / 4 + 8 i (codes)
  // and m0 + 8 i + 2 (lane % 4) + c (scales, at 2 i + c: its accumulators' columns).
  uint32_t b_code_at[kRowsB], b_scale_at[kRowsB], a_code_at[kTilesM];
#pragma unroll
  for (int j = 0; j < kRowsB; ++j) {
    const int64_t row = work.n0 + lane_row + 8 * j;
    b_code_at[j] = code_row_offset(p.b, row, p.n, quad);
    b_scale_at[j] = scale_row_offset(p.b, row, p.n, p.k);
  }
#pragma unroll
  for (int i = 0; i < kTilesM; ++i)
    a_code_at[i] = code_row_offset(p.a, work.m0 + lane_row + 8 * i, p.m, quad);
  // A's scale rows are computed per chunk (registers): (i, c)'s is a_scale_at(2 i + c).
  const int64_t a_scale_row = work.m0 + 2 * quad;
  auto a_scale_at = [&](int r) { return scale_row_offset(p.a, a_scale_row + 8 * (r / 2) + r % 2, p.m, p.k); };
  // The warp's stages (stage s at + s * kRows * kStageRowBytes; row j's at + j * kStageRowBytes).
  // The four lanes of a row copy its chunk's 64 bytes, 16 each (cp.async.cg: the codes bypass L1,
  // which keeps the scales), and each then reads the 8-byte pieces its fragments take (block b:
  // bytes 32 b + 8 quad .. + 7) from its neighbours' units: lane 4 r + q's 16 bytes go to unit
  // 4 r + (q ^ swap), swap = 2 ((r / 2) % 2), so that each half-warp's reads of a piece fall in
  // distinct banks (rows r and r + 2 read opposite halves of their 64 bytes).
  uint8_t* const stages =
      reinterpret_cast<uint8_t*>(shared_slots) + warp * kSkinnyStages * kRows * kStageRowBytes;
  auto stage_of = [&](int i) { return stages + (i % kSkinnyStages) * kRows * kStageRowBytes; };
  const int swap = 2 * ((lane_row / 2) % 2);
  const uint32_t copy_at = (4 * lane_row + (quad ^ swap)) * 16;
  uint32_t piece_at[kPieces];
#pragma unroll
  for (int blk = 0; blk < kPieces; ++blk)
    piece_at[blk] = (4 * lane_row + ((2 * blk + quad / 2) ^ swap)) * 16 + 8 * (quad % 2);
  // Whether chunk c's second block lies within K (its first always does).
  auto second_in_k = [&](int64_t chunk) { return chunk * kChunkK + 32 < p.k; };

  auto copy_chunk = [&](int i) {
    const int64_t chunk = work.chunk(i);
    const uint32_t at = static_cast<uint32_t>(chunk * kChunkK);
    const bool valid = quad < 2 || second_in_k(chunk);  // lanes 2, 3 copy the second block
    uint8_t* const stage = stage_of(i) + copy_at;
#pragma unroll
    for (int j = 0; j < kRowsB; ++j) copy16(stage + kStageRowBytes * j, b.codes + (b_code_at[j] + at), valid);
#pragma unroll
    for (int i2 = 0; i2 < kTilesM; ++i2)
      copy16(stage + kStageRowBytes * (kRowsB + i2), a.codes + (a_code_at[i2] + at), valid);
  };
  auto load_scales = [&](int i, Scales& s) {
    const int64_t chunk = work.chunk(i);
    const bool second = second_in_k(chunk);
    const uint32_t b_at = scale_chunk_offset(p.b, chunk), a_at = scale_chunk_offset(p.a, chunk);
    auto two_rows = [second](const uint8_t* scales, uint32_t low_at, uint32_t high_at) {
      return load_scale_pair(scales + low_at, second) | (load_scale_pair(scales + high_at, second) << 16);
    };
#pragma unroll
    for (int g = 0; g < kGroupsN; ++g)
      s.b[g] = two_rows(b.scales, b_scale_at[2 * g] + b_at, b_scale_at[2 * g + 1] + b_at);
#pragma unroll
    for (int i2 = 0; i2 < kTilesM; ++i2)
      s.a[i2] = two_rows(a.scales, a_scale_at(2 * i2) + a_at, a_scale_at(2 * i2 + 1) + a_at);
  };
  float acc[kGroupsN][kTilesM][4] = {};
  run_skinny_pipeline<Scales>(work.count, copy_chunk, load_scales, [&](int i, const Scales& s) {
    __syncwarp();  // the quad's copies of chunk i are complete and seen (each lane waited for its own)
    bool fast = true;
#pragma unroll
    for (int g = 0; g < kGroupsN; ++g) fast = fast && fast_b_scales(s.b[g]);
#pragma unroll
    for (int c = 0; c < 2 * kTilesM; ++c)
      fast = fast && fast_a_scale(scale_code(s.a[c / 2], c % 2, 0)) &&
             fast_a_scale(scale_code(s.a[c / 2], c % 2, 1));
    // Warp-wide: mma.sync needs all 32 lanes on the same path.
    if (__all_sync(0xFFFFFFFFu, fast)) {
      multiply<true, kE5M2A, kE5M2B>(stage_of(i), piece_at, s, acc);
    } else {
      multiply<false, kE5M2A, kE5M2B>(stage_of(i), piece_at, s, acc);
    }
  });
  finish_skinny_block(p, acc, shared_slots, work.n0, work.m0, work.l, work.split, 1.0f);
}

template <int kTilesM, bool kE5M2A, bool kE5M2B>
void launch(const GemmDeviceParams& p, cudaStream_t stream) {
  launch_skinny_kernel(mx_skinny_gemm_kernel<kTilesM, kE5M2A, kE5M2B>, shared_bytes<kTilesM>(), p, stream);
}

template <int kTilesM>
void launch_formats(const GemmDeviceParams& p, cudaStream_t stream) {
  const bool e5m2_a = p.a.scheme == Scheme::MXFP8_E5M2, e5m2_b = p.b.scheme == Scheme::MXFP8_E5M2;
  if (e5m2_a) {
    e5m2_b ? launch<kTilesM, true, true>(p, stream) : launch<kTilesM, true, false>(p, stream);
  } else {
    e5m2_b ? launch<kTilesM, false, true>(p, stream) : launch<kTilesM, false, false>(p, stream);
  }
}

}  // namespace

size_t mx_skinny_workspace_bytes(int64_t m, int64_t n, int64_t k, int64_t batches) {
  return skinny_workspace_bytes(m, n, k, batches, kChunkK);
}

void launch_mx_skinny_gemm(const GemmDeviceParams& problem, cudaStream_t stream, void* workspace,
                           size_t workspace_bytes) {
  run_skinny_gemm(
      problem, kChunkK, stream, workspace, workspace_bytes,
      [stream](const GemmDeviceParams& p, auto tiles) { launch_formats<decltype(tiles)::value>(p, stream); });
}

}  // namespace microscale::cuda
