#include "core/buffer_pool.hpp"

#include <atomic>
#include <cstring>
#include <iterator>
#include <list>
#include <mutex>

namespace microscale::detail {
namespace {

struct Block {
  std::byte* data;
  size_t capacity;
};

class BufferPool {
 public:
  // A free block of capacity in [bytes, bytes + bytes / 8] (the smallest such), or null.
  Block take(size_t bytes) {
    const std::lock_guard<std::mutex> lock(mutex_);
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it) {
      if (reusable(it->capacity, bytes) && (best == free_.end() || it->capacity < best->capacity)) best = it;
    }
    if (best == free_.end()) return {nullptr, 0};
    const Block b = *best;
    free_.erase(best);
    held_ -= b.capacity;
    return b;
  }

  // Keeps `b` (newest first), freeing the oldest blocks beyond kPooledMaxBytes. A block larger
  // than the whole pool is freed at once (kept, it would evict every other block first). Never
  // throws: it runs in a shared_ptr's deleter.
  void give_back(Block b) noexcept {
    if (b.capacity > kPooledMaxBytes) {
      delete[] b.data;
      return;
    }
    std::list<Block> evicted;
    try {
      const std::lock_guard<std::mutex> lock(mutex_);
      free_.push_front(b);
      held_ += b.capacity;
      while (held_ > kPooledMaxBytes) {
        held_ -= free_.back().capacity;
        evicted.splice(evicted.end(), free_, std::prev(free_.end()));
      }
    } catch (...) {  // no memory for the list node (or a lock error): free the block instead
      delete[] b.data;
    }
    for (const Block& e : evicted) delete[] e.data;  // outside the lock
  }

  size_t held() {
    const std::lock_guard<std::mutex> lock(mutex_);
    return held_;
  }

  // Frees every block kept for reuse (blocks in use come back later, as usual); returns the bytes.
  size_t release() {
    std::list<Block> freed;
    size_t bytes = 0;
    {
      const std::lock_guard<std::mutex> lock(mutex_);
      freed.splice(freed.end(), free_);
      bytes = held_;
      held_ = 0;
    }
    for (const Block& b : freed) delete[] b.data;  // outside the lock
    return bytes;
  }

 private:
  std::mutex mutex_;
  std::list<Block> free_;
  size_t held_ = 0;
};

// Never destroyed: Tensors in static storage may be released after any static pool would be.
// (The blocks it holds stay reachable, so LeakSanitizer does not count them.)
BufferPool& pool() {
  static BufferPool* p = new BufferPool;
  return *p;
}

}  // namespace

bool reusable(size_t capacity, size_t bytes) { return capacity >= bytes && capacity - bytes <= bytes / 8; }

namespace {

// A buffer of `bytes` (new or from the pool), its first `bytes` bytes zeroed when `zeroed`.
std::shared_ptr<std::byte[]> buffer(size_t bytes, bool zeroed) {
  if (bytes < kPooledMinBytes) {
    return std::shared_ptr<std::byte[]>(zeroed ? new std::byte[bytes]() : new std::byte[bytes]);
  }
  Block b = pool().take(bytes);
  if (b.data == nullptr) {
    b = {zeroed ? new std::byte[bytes]() : new std::byte[bytes], bytes};
  } else if (zeroed) {
    std::memset(b.data, 0, bytes);
  }
  const size_t capacity = b.capacity;
  return std::shared_ptr<std::byte[]>(b.data, [capacity](std::byte* p) { pool().give_back({p, capacity}); });
}

std::atomic<int> uninitialized_fill{-1};

}  // namespace

std::shared_ptr<std::byte[]> zeroed_buffer(size_t bytes) { return buffer(bytes, true); }

std::shared_ptr<std::byte[]> uninitialized_buffer(size_t bytes) {
  std::shared_ptr<std::byte[]> b = buffer(bytes, false);
  const int fill = uninitialized_fill.load(std::memory_order_relaxed);
  if (fill >= 0) std::memset(b.get(), fill, bytes);
  return b;
}

void fill_uninitialized_buffers_for_tests(int byte) {
  uninitialized_fill.store(byte, std::memory_order_relaxed);
}

size_t pooled_bytes() { return pool().held(); }

}  // namespace microscale::detail

namespace microscale {

size_t release_cached_host_memory() { return detail::pool().release(); }

}  // namespace microscale
