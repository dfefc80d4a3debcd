// NVFP4 quantization, rowwise and columnwise from ONE read of the input.
//
// A CTA of 128 threads owns a 64 x 128 tile of X, staged in shared memory as loaded (bf16/f16 bit
// patterns, widened to fp32 in registers; fp32 inputs as fp32), 16-byte loads and stores.
//   column phase: thread t owns column k0 + t and its four 16-row chunks (conflict-free reads):
//     columnwise blocks (through the RHT when asked), and for 16x16 tiles the tile amax (16 lanes
//     of a warp = the 16 columns of a tile, reduced with shuffles);
//   row phase: thread owns one row and four consecutive 16-column blocks (rows spread over the
//     lanes of a quarter warp, so the 16-byte reads hit distinct banks with a pitch of 16 bytes
//     over a multiple of 128).
// Each thread writes 32 contiguous data bytes and 4 contiguous scale bytes per direction (compact
// or swizzled: 4 consecutive blocks are 4 consecutive bytes in both layouts); in whole tiles the
// lanes of a pair store each other's halves, so that each store writes whole 32-byte runs (v10).
// Tiles run in reverse order: the amax pass read the tensor forwards, so its tail is
// still in L2.
#include "cuda/common.cuh"
#include "cuda/cuda_check.hpp"
#include "cuda/launchers.hpp"
#include "cuda/nvfp4_block.cuh"
#include "cuda/rht.cuh"

namespace microscale::cuda {
namespace {

constexpr int kTM = 64, kTK = 128, kThreads = 128;

struct Nvfp4Params {
  DeviceMatrix x;
  OutputPointers out;
  bool rowwise, columnwise, tile_2d, rht, swizzled, sr;
  uint16_t rht_mask;
  const float* row_amaxes;  // row-scaled: X's rows' amaxes [M] and X^T's [K] (null otherwise)
  const float* col_amaxes;
  uint64_t seed, offset;
  const uint64_t* seed_device;  // when set, the seed (read as the kernel runs: CUDA graphs)
  int64_t tiles_k, tiles;
};

__device__ __forceinline__ void philox_words(const Nvfp4Params& p, uint64_t block, uint32_t (&w)[4]) {
  sr_block_bits(p.seed_device != nullptr ? *p.seed_device : p.seed, p.offset, block, w);
}

// Writes the 4 scale codes of blocks (r, c0 .. c0+3) of a [rows, cols] scale matrix; codes of
// blocks past `cols` are 0 (the swizzled padding).
__device__ __forceinline__ void store_scales4(uint8_t* scale, int64_t r, int64_t c0, int64_t cols,
                                              bool swizzled, uint32_t packed) {
  const int64_t o = scale_offset(r, c0, cols, swizzled);
  if (swizzled || (c0 + 4 <= cols && (o & 3) == 0)) {
    *reinterpret_cast<uint32_t*>(scale + o) = packed;  // swizzled: 4 consecutive, 4-aligned bytes
    return;
  }
  for (int j = 0; j < 4; ++j) {
    if (c0 + j < cols) scale[o + j] = static_cast<uint8_t>(packed >> (8 * j));
  }
}

// The 32 data bytes and 4 scale codes of a thread's four consecutive blocks, pushed in block
// order from a rolled loop: shifted in, so that no register array is indexed at run time (which
// would put it in local memory). Starts zeroed (a read of an unset register is undefined: a build
// that read them gave wrong bytes at 48 registers).
struct BlockRun {
  static constexpr int kBlocks = 4;  // pushes that fill it: kTM / 16 chunks, or a row's 4 blocks
  uint32_t data[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  uint32_t scales = 0;
  __device__ __forceinline__ void push(const uint32_t (&w)[2], uint32_t code) {
#pragma unroll
    for (int q = 0; q < 6; ++q) data[q] = data[q + 2];
    data[6] = w[0];
    data[7] = w[1];
    scales = (scales >> 8) | (code << 24);
  }
};

// Quantizes the tile at (m0, k0), already in shared memory; kRht: the columnwise values through
// the RHT (p.rht; a kernel of its own, so that the others do not hold its registers).
template <typename T, bool kRht>
__device__ __forceinline__ void nvfp4_tile(const Nvfp4Params& p, const Stored<T>* tile, float* tile_amax,
                                           int64_t m0, int64_t k0) {
  constexpr int kLd = kTilePitch<T, kTK>;
  const int64_t M = p.x.rows, K = p.x.cols;
  const int t = threadIdx.x;
  // Every thread of a whole tile stores 32 bytes per direction: lane pairs store whole runs.
  const bool whole_tile = m0 + kTM <= M && k0 + kTK <= K;

  // ---- column phase ----
  if (p.columnwise || p.tile_2d) {
    const int64_t col = k0 + t;
    // Row-scaled: this column's own global scale (a column past K takes none: it writes nothing).
    const Nvfp4Global g = nvfp4_global(p.col_amaxes == nullptr ? p.out.amax[1]
                                       : col < K               ? p.col_amaxes[col]
                                                               : 0.0f);
    BlockRun run;
    // The chunks (and the row phase's blocks) run in loops: unrolled, the kernels waited on
    // instruction fetch (ncu: 30-40 % of the cycles between issues); rolled, row+col took 202 us
    // instead of 221 and the RHT call 279 instead of 284 (docs/perf.md, CUDA v8 and v9).
    static_assert(kTM / 16 == BlockRun::kBlocks, "a column's chunks must fill one BlockRun");
#pragma unroll 1
    for (int rc = 0; rc < kTM / 16; ++rc) {
      float v[16];
#pragma unroll
      for (int i = 0; i < 16; ++i) v[i] = tile_value<T>(tile, (rc * 16 + i) * kLd + t);
      if constexpr (kRht) rht16_outputs(v, p.rht_mask);
      float amax = 0.0f;
#pragma unroll
      for (int i = 0; i < 16; ++i) amax = max_abs_skip_nan(amax, v[i]);
      if (p.tile_2d) {
#pragma unroll
        for (int s = 1; s < 16; s <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, s));
        if ((t & 15) == 0) tile_amax[rc * (kTK / 16) + t / 16] = amax;
      }
      const int64_t r0 = m0 + rc * 16;
      uint32_t w[2] = {0, 0}, code = 0;
      if (p.columnwise && col < K && r0 < M) {
        uint32_t random[4] = {0, 0, 0, 0};
        if (p.sr) philox_words(p, static_cast<uint64_t>(M * K / 16 + col * (M / 16) + r0 / 16), random);
        code = nvfp4_encode_block(v, amax, g, p.sr, random, w);
      }
      run.push(w, code);
    }
    if (p.columnwise && whole_tile) {
      store_runs32_paired(p.out.columnwise_data + col * (M / 2) + m0 / 2, run.data);
      store_scales4(p.out.columnwise_scale, col, m0 / 16, M / 16, p.swizzled, run.scales);
    } else if (p.columnwise && col < K) {
      const int64_t valid_rows = M - m0 < kTM ? M - m0 : kTM;
      store_bytes(p.out.columnwise_data + col * (M / 2) + m0 / 2, run.data, static_cast<int>(valid_rows / 2));
      store_scales4(p.out.columnwise_scale, col, m0 / 16, M / 16, p.swizzled, run.scales);
    }
  }
  if (!p.rowwise) return;
  if (p.tile_2d) __syncthreads();

  // ---- row phase ----
  const int warp = t / 32, lane = t % 32;
  const int r = (warp % 2) * 32 + lane;
  const int b0 = (warp / 2) * 4;  // first of this thread's four 16-column blocks
  const int64_t row = m0 + r;
  if (row >= M) return;
  const Nvfp4Global g = nvfp4_global(p.row_amaxes == nullptr ? p.out.amax[0] : p.row_amaxes[row]);
  BlockRun run;
#pragma unroll 1
  for (int j = 0; j < BlockRun::kBlocks; ++j) {
    const int b = b0 + j;
    float v[16];
    tile_row<T>(tile + r * kLd + b * 16, v);
    uint32_t w[2] = {0, 0}, code = 0;
    const int64_t c0 = k0 + b * 16;
    if (c0 < K) {
      float amax = 0.0f;
      if (p.tile_2d) {
        amax = tile_amax[(r / 16) * (kTK / 16) + b];
      } else {
#pragma unroll
        for (int i = 0; i < 16; ++i) amax = max_abs_skip_nan(amax, v[i]);
      }
      uint32_t random[4] = {0, 0, 0, 0};
      if (p.sr) philox_words(p, static_cast<uint64_t>(row * (K / 16) + c0 / 16), random);
      code = nvfp4_encode_block(v, amax, g, p.sr, random, w);
    }
    run.push(w, code);
  }
  const int64_t first = k0 + b0 * 16;
  if (whole_tile) {
    store_runs32_paired(p.out.rowwise_data + row * (K / 2) + first / 2, run.data);
    store_scales4(p.out.rowwise_scale, row, first / 16, K / 16, p.swizzled, run.scales);
  } else if (first < K) {
    const int64_t valid_cols = K - first < 64 ? K - first : 64;
    store_bytes(p.out.rowwise_data + row * (K / 2) + first / 2, run.data, static_cast<int>(valid_cols / 2));
    store_scales4(p.out.rowwise_scale, row, first / 16, K / 16, p.swizzled, run.scales);
  }
}

// One tile per CTA, in reverse tensor order. (v2, a persistent grid with the next tile's loads in
// flight in registers, ran 5-10% slower: the kernel is issue-bound, see docs/perf.md.)
// The RHT kernel held to 5 CTAs per SM (95 registers, no spills): left free, the fp32 transform
// took it to 109 registers and 4 CTAs. (0: no bound for the others, which take 64 registers.)
template <typename T, bool kRht>
__global__ void __launch_bounds__(kThreads, kRht ? 5 : 0) nvfp4_quantize_kernel(const Nvfp4Params p) {
  constexpr int kLd = kTilePitch<T, kTK>;
  __shared__ __align__(16) Stored<T> tile[kTM * kLd];
  __shared__ float tile_amax[(kTM / 16) * (kTK / 16)];
  const int64_t t_index = p.tiles - 1 - blockIdx.x;
  const int64_t m0 = (t_index / p.tiles_k) * kTM, k0 = (t_index % p.tiles_k) * kTK;
  TileLoader<T, kTM, kTK, kThreads, kLd> loader;
  loader.fetch(p.x, m0, k0);
  loader.commit(p.x, m0, k0, tile);
  __syncthreads();
  nvfp4_tile<T, kRht>(p, tile, tile_amax, m0, k0);
}

}  // namespace

void launch_nvfp4_quantize(const DeviceMatrix& x, DType dtype, const QuantizeOptions& o,
                           const OutputPointers& out, cudaStream_t stream) {
  Nvfp4Params p{};
  p.x = x;
  p.out = out;
  p.rowwise = o.rowwise;
  p.columnwise = o.columnwise;
  p.tile_2d = o.tile == Tile::k16x16;
  p.rht = o.rht && o.columnwise;
  p.swizzled = o.scale_layout == ScaleLayout::Swizzled;
  p.sr = o.stochastic_rounding.has_value();
  p.rht_mask = o.rht_sign_mask;
  if (o.row_scaled) {  // amax = [2 largest | M rows of X | K rows of X^T] (launch_nvfp4_row_scaled_amax)
    p.row_amaxes = out.amax + 2;
    p.col_amaxes = out.amax + 2 + x.rows;
  }
  if (p.sr) {
    p.seed = o.stochastic_rounding->seed;
    p.offset = o.stochastic_rounding->offset;
    p.seed_device = o.stochastic_rounding->device_seed;
  }
  p.tiles_k = (x.cols + kTK - 1) / kTK;
  p.tiles = p.tiles_k * ((x.rows + kTM - 1) / kTM);
  // validate_quantize lets the RHT through for bf16 only, and only bf16 has an RHT kernel below.
  if (p.rht && dtype != DType::BF16)
    throw Error("nvfp4 RHT needs bf16 input, got " + std::string(dtype_name(dtype)));
  const unsigned grid = static_cast<unsigned>(p.tiles);
  switch (dtype) {
    case DType::BF16:
      if (p.rht)
        nvfp4_quantize_kernel<Bf16, true><<<grid, kThreads, 0, stream>>>(p);
      else
        nvfp4_quantize_kernel<Bf16, false><<<grid, kThreads, 0, stream>>>(p);
      break;
    case DType::F16: nvfp4_quantize_kernel<F16, false><<<grid, kThreads, 0, stream>>>(p); break;
    default: nvfp4_quantize_kernel<float, false><<<grid, kThreads, 0, stream>>>(p); break;
  }
  MICROSCALE_CUDA_CHECK(cudaGetLastError());
}

}  // namespace microscale::cuda
