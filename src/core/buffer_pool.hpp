// Large zeroed host buffers, kept for reuse once their Tensors are gone.
//
// Why: a fresh allocation of megabytes comes from the kernel as untouched pages, and touching them
// costs a page fault each (4 KiB), about as much as a 4096 x 4096 NVFP4 quantize takes in all
// (docs/perf.md, thirty-sixth session). glibc returns such blocks to the kernel when they are
// freed (mmap, or a trimmed heap top), so a loop that quantizes same-shaped tensors again and
// again, a training step's, paid for fresh pages on every call.
#pragma once

#include <cstddef>
#include <memory>

namespace microscale::detail {

/// Buffers below this size come straight from operator new[] (glibc reuses small blocks itself).
constexpr size_t kPooledMinBytes = size_t{1} << 20;
/// The most bytes the pool keeps for reuse; beyond it the oldest buffers are freed.
constexpr size_t kPooledMaxBytes = size_t{512} << 20;

/// @brief A buffer whose first `bytes` bytes are zero (a reused one may be up to 1/8 larger; the
/// rest is not the caller's). The last owner's release gives a pooled buffer back for reuse; the
/// pool keeps at most kPooledMaxBytes, until microscale::release_cached_host_memory() frees what
/// it keeps (tensor.hpp). Thread-safe; a process
/// that forks while another thread allocates may find the pool locked in the child.
std::shared_ptr<std::byte[]> zeroed_buffer(size_t bytes);

/// @brief As zeroed_buffer, but the first `bytes` bytes are left as they are (a reused buffer's
/// old bytes, or new memory): for a caller that writes every byte it reads back.
std::shared_ptr<std::byte[]> uninitialized_buffer(size_t bytes);

/// @brief Tests: fill every uninitialized_buffer with `byte` (0-255), so that a byte its caller
/// failed to write shows; -1 (the default) leaves them unfilled.
void fill_uninitialized_buffers_for_tests(int byte);

/// @brief Whether a pooled buffer of `capacity` bytes may serve a request for `bytes`: large
/// enough, and at most 1/8 larger (a small request does not take a big buffer that a later
/// request of its size would have reused).
bool reusable(size_t capacity, size_t bytes);

/// @brief The bytes the pool holds for reuse now (tests).
size_t pooled_bytes();

}  // namespace microscale::detail
