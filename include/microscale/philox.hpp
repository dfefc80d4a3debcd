// microscale/philox.hpp — Philox4x32-10, the counter-based generator behind stochastic rounding.
//
// Salmon et al., "Parallel random numbers: as easy as 1, 2, 3" (SC'11); the same generator as
// cuRAND's Philox4_32_10 and TransformerEngine's SR stream. Being counter-based, the random bits of
// element i depend only on (seed, offset, i), never on which thread asks: this is what lets the CPU
// and the GPU, at any tiling, produce the same stochastically rounded bytes.
//
// microscale's stream for a quantization direction: the 16 bytes of
//   philox4x32_10(counter = {lo(b), hi(b), lo(offset), hi(offset)}, key = {lo(seed), hi(seed)})
// are the random bits of the 16 elements of block b (elements 16b .. 16b+15 of the direction's
// row-major output), byte k (little-endian within each word) going to element 16b + k. The
// columnwise direction numbers its elements after the rowwise ones (b += M*K/16), so the two
// directions never share bits.
#pragma once

#include <array>
#include <cstdint>

#include "microscale/host_device.hpp"

namespace microscale {

MICROSCALE_HOST_DEVICE void philox_mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  const uint64_t product = static_cast<uint64_t>(a) * b;
  hi = static_cast<uint32_t>(product >> 32);
  lo = static_cast<uint32_t>(product);
}

/// @brief Ten rounds of Philox4x32 on `counter` (in place) with `key`.
MICROSCALE_HOST_DEVICE void philox4x32_10(uint32_t counter[4], uint32_t key0, uint32_t key1) {
  constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
  constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    philox_mulhilo(kMul0, counter[0], hi0, lo0);
    philox_mulhilo(kMul1, counter[2], hi1, lo1);
    const uint32_t next[4] = {hi1 ^ counter[1] ^ key0, lo1, hi0 ^ counter[3] ^ key1, lo0};
    counter[0] = next[0];
    counter[1] = next[1];
    counter[2] = next[2];
    counter[3] = next[3];
    key0 += kWeyl0;
    key1 += kWeyl1;
  }
}

/// @brief The 16 random bytes of block `block` of the stream (seed, offset), as 4 words.
MICROSCALE_HOST_DEVICE void sr_block_bits(uint64_t seed, uint64_t offset, uint64_t block, uint32_t words[4]) {
  words[0] = static_cast<uint32_t>(block);
  words[1] = static_cast<uint32_t>(block >> 32);
  words[2] = static_cast<uint32_t>(offset);
  words[3] = static_cast<uint32_t>(offset >> 32);
  philox4x32_10(words, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
}

}  // namespace microscale
