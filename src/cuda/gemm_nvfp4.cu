// NVFP4 x NVFP4 block-scaled GEMM on Hopper (version 7: wgmma, split K for small grids; docs/perf.md
// "CUDA GEMM").
//
// Hopper has no FP4 tensor-core instruction, so each block tile of codes is converted to fp16 in
// shared memory once, and wgmma multiplies those fp16 tiles with fp32 accumulation. While the
// tensor cores work on K tile kt, the threads convert tile kt + 1 into the other fp16 buffer:
//
//   global codes + E4M3 scales --cp.async (3 stages)--> shared (raw codes)
//     --convert (all threads)--> shared fp16, 2 buffers, 128-byte swizzle --wgmma--> fp32 registers
//     --epilogue--> D
//
// The conversion is exact (cuda/nvfp4_fp16_codes.cuh): the accumulators hold sum(a * b) * 2^-28,
// scaled back by 2^28 before alpha.
//
// Block tile 128 x 128 x 64 (K); two warpgroups, each the wgmma of 64 rows x 128 columns.
// Within a 16-element block the conversion stores code q of each 8-code word beside code q + 4
// (one shift per pair of codes); A and B are permuted alike, so the sum over K is the same.
#include <algorithm>
#include <cstdint>

#include "cuda/cp_async.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/gemm_epilogue.cuh"
#include "cuda/gemm_nvfp4.hpp"
#include "cuda/gemm_split_launch.hpp"
#include "cuda/nvfp4_fp16_codes.cuh"

namespace microscale::cuda {
namespace {

constexpr int kTileM = 128, kTileN = 128, kTileK = 64;
constexpr int kThreads = 256;
constexpr int kStages = 3;  // raw K tiles: the one being converted and 2 in flight (5 measured slower)
constexpr int kAccumulators = kTileN / 2;        // fp32 registers per thread (64 x kTileN per warpgroup)
constexpr int kCodeBytes = kTileK / 2;           // 32 bytes of codes per row and K tile
constexpr int kScaleBytes = kTileK / 16;         // 4 block scales per row and K tile
constexpr int kRowBytes = kTileK * 2;            // 128: one fp16 row = the swizzle span
constexpr int kTileBytesA = kTileM * kRowBytes;  // 16 KiB
constexpr int kTileBytesB = kTileN * kRowBytes;
constexpr int kBufferBytes = kTileBytesA + kTileBytesB;  // the fp16 A and B tiles of one K tile
constexpr int kStageBytes = (kTileM + kTileN) * (kCodeBytes + kScaleBytes);
// fp16 buffers first (the 128-byte swizzle wants 1024-byte aligned tiles), then the raw stages;
// 1 KiB of slack to align the dynamic shared memory's base.
constexpr int kSharedBytes = 2 * kBufferBytes + kStages * kStageBytes + 1024;
// Two blocks per SM: each block's conversion overlaps the other's wgmmas (128 registers each).
constexpr int kBlocksPerSm = 2;

static_assert(kTileM == 128 && kTileN == 128, "a thread copies and converts one half row of A and one of B");

// Shared-memory stage: A codes [128][32], B codes [128][32], A scales [128][4], B scales [128][4]
// (compact rows, or each tile's 128x4 atom as stored: 512 bytes).
struct Stage {
  uint8_t* a_codes;
  uint8_t* b_codes;
  uint8_t* a_scales;
  uint8_t* b_scales;
  __device__ explicit Stage(uint8_t* base)
      : a_codes(base),
        b_codes(base + kTileM * kCodeBytes),
        a_scales(base + (kTileM + kTileN) * kCodeBytes),
        b_scales(base + (kTileM + kTileN) * kCodeBytes + kTileM * kScaleBytes) {}
};

// What one thread copies into every stage, its addresses worked out once: 16 bytes of codes of
// A (row t/2, half t%2) and of B (the same), and one piece of scales: threads 0-127 A's, 128-255
// B's; compact: the row's 4 bytes; swizzled: 16 bytes of the tile's 512-byte 128x4 atom (the first
// 32 threads of each half). Rows past the matrix read as zeros (their compact scales too).
template <bool SwizzledA, bool SwizzledB>
struct ThreadCopies {
  const uint8_t* a_codes;
  const uint8_t* b_codes;
  const uint8_t* scales;
  int64_t scale_step;  // bytes per K tile: 4 (compact) or 512 (an atom)
  bool a_valid, b_valid, scale_valid, scale_wide, has_scale;
  int code_offset, scale_offset;  // within a stage's code and scale arrays

  __device__ ThreadCopies(const GemmDeviceParams& p, int64_t m0, int64_t n0, int64_t l) {
    const int t = static_cast<int>(threadIdx.x);
    const int row = t / 2, half = t % 2;
    code_offset = row * kCodeBytes + half * 16;
    a_valid = m0 + row < p.m;
    b_valid = n0 + row < p.n;
    a_codes = p.a.data + l * p.a.batch_bytes + (a_valid ? (m0 + row) * p.a.row_bytes : 0) + half * 16;
    b_codes = p.b.data + l * p.b.batch_bytes + (b_valid ? (n0 + row) * p.b.row_bytes : 0) + half * 16;
    const bool for_a = t < kTileM;
    const GemmDeviceOperand& op = for_a ? p.a : p.b;
    const int64_t r0 = for_a ? m0 : n0, rows = for_a ? p.m : p.n;
    const int srow = for_a ? t : t - kTileM;
    scale_wide = for_a ? SwizzledA : SwizzledB;
    const uint8_t* base = op.scales + l * op.scale_batch_bytes;
    if (scale_wide) {
      has_scale = srow < 32;
      scale_valid = true;  // the tile's atom exists: swizzled images are padded to 128 rows
      scales = base + (r0 / 128) * (p.k / kTileK) * 512 + srow * 16;
      scale_step = 512;
      scale_offset = srow * 16;
    } else {
      has_scale = true;
      scale_valid = r0 + srow < rows;
      scales = base + (scale_valid ? (r0 + srow) * op.scale_row_bytes : 0);
      scale_step = kScaleBytes;
      scale_offset = srow * kScaleBytes;
    }
    scale_offset += for_a ? 0 : kTileM * kScaleBytes;  // B's scales follow A's in a stage
  }

  // Issues the copies of K tile kt into a stage (codes at `codes`, scales at `stage_scales`).
  __device__ __forceinline__ void issue(int kt, uint8_t* codes, uint8_t* stage_scales) const {
    copy16(codes + code_offset, a_codes + kt * kCodeBytes, a_valid);
    copy16(codes + kTileM * kCodeBytes + code_offset, b_codes + kt * kCodeBytes, b_valid);
    if (has_scale) {
      if (scale_wide) {
        copy16(stage_scales + scale_offset, scales + kt * scale_step, scale_valid);
      } else {
        copy4(stage_scales + scale_offset, scales + kt * scale_step, scale_valid);
      }
    }
  }
};

// Byte offset of (row, block j) in a stage's scales of one operand: compact [128][4] or the
// swizzled atom.
template <bool Swizzled>
__device__ __forceinline__ int scale_index(int row, int j) {
  if constexpr (Swizzled) return (row % 32) * 16 + (row / 32) * 4 + j;
  return row * kScaleBytes + j;
}

// Row `row`, codes 32*half..+32 (two 16-element blocks, four 16-byte chunks), of one operand's
// stage into its fp16 tile [rows][64], in wgmma's 128-byte swizzled K-major layout: the 16-byte
// chunk c of row r sits at chunk c ^ (r % 8).
template <bool Swizzled>
__device__ __forceinline__ void convert_half_row(const uint8_t* codes, const uint8_t* scales, uint8_t* tile,
                                                 int row, int half) {
  const uint4 raw = *reinterpret_cast<const uint4*>(codes + row * kCodeBytes + half * 16);
  const ScalePair s = e4m3_scale_pair(scales[scale_index<Swizzled>(row, 2 * half)],
                                      scales[scale_index<Swizzled>(row, 2 * half + 1)]);
  uint8_t* dst = tile + row * kRowBytes;
  const int swz = row % 8;
  const uint32_t words[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int chunk = (4 * half + i) ^ swz;
    *reinterpret_cast<uint4*>(dst + chunk * 16) = nvfp4_word_to_fp16_pairs(words[i], i < 2 ? s.low : s.high);
  }
}

// wgmma shared-memory descriptor of a K-major tile with the 128-byte swizzle: start address,
// stride between 8-row groups 1024 bytes, leading offset unused for this layout.
__device__ __forceinline__ uint64_t tile_descriptor(const void* p) {
  const uint64_t address = shared_address(p);
  return ((address & 0x3FFFF) >> 4) | (uint64_t{1} << 16) | (uint64_t{1024 >> 4} << 32) | (uint64_t{1} << 62);
}

__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int Pending>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(Pending) : "memory");
}
// Keeps the compiler from moving accesses of the accumulators across the asynchronous wgmma.
__device__ __forceinline__ void fence_registers(float (&d)[kAccumulators]) {
#pragma unroll
  for (int i = 0; i < kAccumulators; ++i) asm volatile("" : "+f"(d[i])::"memory");
}
// Orders this thread's shared-memory stores before the tensor cores' (async proxy) reads.
__device__ __forceinline__ void fence_async_shared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// D[64 x N] += A[64 x 16] B[N x 16]^T, both from shared memory (descriptors), fp32 accumulators.
__device__ __forceinline__ void wgmma_64x128x16(float (&d)[64], uint64_t desc_a, uint64_t desc_b) {
  asm volatile(
      "{\n"
      ".reg .pred p;\n"
      "setp.ne.b32 p, 1, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, "
      "%22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, "
      "%42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, "
      "%62, %63}, %64, %65, p, 1, 1, 0, 0;\n"
      "}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
        "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
        "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]),
        "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
        "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]),
        "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]),
        "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]),
        "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]),
        "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b));
}

template <bool SwizzledA, bool SwizzledB>
__global__ void __launch_bounds__(kThreads, kBlocksPerSm)
    nvfp4_gemm_kernel(const __grid_constant__ GemmDeviceParams p) {
  extern __shared__ uint8_t shared_raw[];
  uint8_t* shared =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(shared_raw) + 1023) & ~uintptr_t{1023});
  uint8_t* buffers = shared;                    // 2 x {A tile, B tile}, fp16, swizzled
  uint8_t* stages = shared + 2 * kBufferBytes;  // kStages x Stage
  const int64_t m0 = static_cast<int64_t>(blockIdx.y) * kTileM,
                n0 = static_cast<int64_t>(blockIdx.x) * kTileN;
  // blockIdx.z = batch * splits + split; split s sums K tiles [s * run, min((s + 1) * run, all)).
  const int64_t l = blockIdx.z / p.splits, split = blockIdx.z % p.splits;
  const int t = static_cast<int>(threadIdx.x), lane = t % 32, warp = t / 32;
  const int group = warp / 4;  // warpgroup: rows 64 * group .. + 63 of the tile
  const int first_tile = static_cast<int>(split * p.tiles_per_split);
  const int k_tiles = static_cast<int>(
      p.k / kTileK - first_tile < p.tiles_per_split ? p.k / kTileK - first_tile : p.tiles_per_split);

  const ThreadCopies<SwizzledA, SwizzledB> copies(p, m0, n0, l);
  auto load_stage = [&](int kt) {
    const Stage s(stages + (kt % kStages) * kStageBytes);
    copies.issue(first_tile + kt, s.a_codes, s.a_scales);
  };
  // Each thread converts half row t % 2 of row t / 2 of both tiles.
  auto convert_stage = [&](int kt) {
    const Stage s(stages + (kt % kStages) * kStageBytes);
    uint8_t* buffer = buffers + (kt % 2) * kBufferBytes;
    convert_half_row<SwizzledA>(s.a_codes, s.a_scales, buffer, t / 2, t % 2);
    convert_half_row<SwizzledB>(s.b_codes, s.b_scales, buffer + kTileBytesA, t / 2, t % 2);
    fence_async_shared();
  };

  float acc[kAccumulators];
#pragma unroll
  for (int i = 0; i < kAccumulators; ++i) acc[i] = 0.0f;

    // Prologue: raw tiles 0 .. kStages - 2 in flight, tile 0 converted, raw tile kStages - 1 in
    // flight. Every step commits one group of copies (empty past the last tile), so that group
    // kt always holds raw tile kt.
#pragma unroll
  for (int kt = 0; kt < kStages - 1; ++kt) {
    if (kt < k_tiles) load_stage(kt);
    commit_copies();
  }
  wait_copies<kStages - 2>();
  __syncthreads();
  convert_stage(0);
  if (kStages - 1 < k_tiles) load_stage(kStages - 1);
  commit_copies();
  __syncthreads();

#pragma unroll 1
  for (int kt = 0; kt < k_tiles; ++kt) {
    // The tensor cores take K tile kt (4 wgmmas of K = 16: +32 bytes along the swizzled rows).
    const uint8_t* buffer = buffers + (kt % 2) * kBufferBytes;
    const uint64_t desc_a = tile_descriptor(buffer + group * 64 * kRowBytes);
    const uint64_t desc_b = tile_descriptor(buffer + kTileBytesA);
    fence_registers(acc);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < kTileK / 16; ++kk) wgmma_64x128x16(acc, desc_a + 2 * kk, desc_b + 2 * kk);
    wgmma_commit();
    fence_registers(acc);
    if (kt + 1 < k_tiles) {
      // Meanwhile: convert tile kt + 1 into the other buffer, once the wgmmas of tile kt - 1
      // (which read it) are done in both warpgroups, and raw tile kt + 1 has landed.
      wait_copies<kStages - 2>();
      wgmma_wait<1>();
      fence_registers(acc);
      __syncthreads();
      convert_stage(kt + 1);
      // Raw tile kt + kStages goes into the stage of tile kt (converted before the barrier).
      if (kt + kStages < k_tiles) load_stage(kt + kStages);
      commit_copies();
      __syncthreads();
    }
  }
  wgmma_wait<0>();
  fence_registers(acc);

  // Epilogue. wgmma's fragment: warp w of the group holds rows 16 (w % 4) + lane / 4 (+ 8 for
  // odd i / 2), columns 8 (i / 4) + 2 (lane % 4) (+ 1 for odd i). A split K leaves its sum (times
  // 2^28, exact) in its workspace slice for gemm_epilogue_kernel.
  const float alpha = effective_alpha(p);
  const int row_base = group * 64 + (warp % 4) * 16 + lane / 4, col_base = 2 * (lane % 4);
  float* slice = p.workspace ? p.workspace + (split * p.batches + l) * p.m * p.n : nullptr;
#pragma unroll
  for (int i = 0; i < kAccumulators; ++i) {
    const int64_t row = m0 + row_base + ((i / 2) % 2) * 8;
    const int64_t col = n0 + (i / 4) * 8 + col_base + (i % 2);
    if (row >= p.m || col >= p.n) continue;
    if (slice) {
      slice[row * p.n + col] = acc[i] * 0x1p28f;
    } else {
      store_result(p, row, col, l, alpha * (acc[i] * 0x1p28f));
    }
  }
}

template <bool SwizzledA, bool SwizzledB>
void launch(const GemmDeviceParams& p, cudaStream_t stream) {
  auto kernel = nvfp4_gemm_kernel<SwizzledA, SwizzledB>;
  MICROSCALE_CUDA_CHECK(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, kSharedBytes));
  const dim3 grid(static_cast<unsigned>((p.n + kTileN - 1) / kTileN),
                  static_cast<unsigned>((p.m + kTileM - 1) / kTileM),
                  static_cast<unsigned>(p.batches * p.splits));
  kernel<<<grid, kThreads, kSharedBytes, stream>>>(p);
  MICROSCALE_CUDA_CHECK(cudaGetLastError());
}

GemmSplit split_of(int64_t m, int64_t n, int64_t k, int64_t batches) {
  const int64_t tiles = ((n + kTileN - 1) / kTileN) * ((m + kTileM - 1) / kTileM) * batches;
  return choose_gemm_split(tiles, k / kTileK, multiprocessor_count(), kBlocksPerSm);
}

}  // namespace

size_t nvfp4_gemm_workspace_bytes(int64_t m, int64_t n, int64_t k, int64_t batches) {
  return split_slices_bytes(split_of(m, n, k, batches), m, n, batches);
}

void launch_nvfp4_gemm(const GemmDeviceParams& problem, cudaStream_t stream, void* workspace,
                       size_t workspace_bytes) {
  GemmDeviceParams p = problem;
  const SplitWorkspace scratch(p, split_of(p.m, p.n, p.k, p.batches), workspace, workspace_bytes, stream);
  if (p.a.swizzled) {
    p.b.swizzled ? launch<true, true>(p, stream) : launch<true, false>(p, stream);
  } else {
    p.b.swizzled ? launch<false, true>(p, stream) : launch<false, false>(p, stream);
  }
  if (p.splits > 1) launch_gemm_epilogue(p, stream);
}

}  // namespace microscale::cuda
