// unfinished_outputs (unfinished_outputs.hpp) and remove_unfinished_outputs (output_file.hpp).
//
// A signal may arrive on any thread while others remember and forget, so the table is a fixed
// array of atomic words, each null or the address of a heap copy of a path, with bit 0 set while
// the remover is using it (new[] gives addresses aligned to at least 2):
// - the remover claims a record (address -> address | 1), removes the path, and puts the bare
//   address back only if the word still holds the claimed one;
// - forget() swaps the word for null: a bare address it frees, a claimed one it leaves to the
//   remover, which then finds the word changed and does not put the record back.
// So no path is freed while it is read, a forgotten record never comes back (a later call cannot
// remove a file whose writer has finished with it), and the remover uses only lock-free atomics
// and the async-signal-safe unlink and rmdir. (A record forgotten while claimed is leaked: that
// only happens while a signal is ending the process.)
#include "core/unfinished_outputs.hpp"

#include <unistd.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>

#include "microscale/output_file.hpp"

namespace microscale {
namespace unfinished_outputs {
namespace {

// Files: the temporary files of the OutputFiles open at once, the shards of the conversions under
// way (a model of a few hundred shards fits) and the file being copied. Directories: those the
// conversions created.
constexpr int kFileSlots = 2048, kDirectorySlots = 256;
constexpr uintptr_t kClaimed = 1;

std::atomic<uintptr_t> file_slots[kFileSlots];
std::atomic<uintptr_t> directory_slots[kDirectorySlots];
static_assert(std::atomic<uintptr_t>::is_always_lock_free, "a signal handler may only use lock-free atomics");

std::atomic<uintptr_t>* slot(int handle) {
  if (handle < 0 || handle >= kFileSlots + kDirectorySlots) return nullptr;
  return handle < kFileSlots ? &file_slots[handle] : &directory_slots[handle - kFileSlots];
}

// Claims the record in `s`, if any, runs `remove` on its path, and puts it back unless forgotten
// meanwhile. True when `remove` succeeded.
bool remove_recorded(std::atomic<uintptr_t>& s, int (*remove)(const char*)) noexcept {
  uintptr_t word = s.load();
  if (word == 0 || (word & kClaimed) != 0) return false;
  if (!s.compare_exchange_strong(word, word | kClaimed)) return false;  // changed: forgotten or new
  const bool removed = remove(reinterpret_cast<const char*>(word)) == 0;
  uintptr_t claimed = word | kClaimed;
  s.compare_exchange_strong(claimed, word);  // fails where forget() took it: then it stays out
  return removed;
}

}  // namespace

int remember(const std::string& path, Kind kind) noexcept {
  char* copy = new (std::nothrow) char[path.size() + 1];
  if (copy == nullptr) return -1;
  std::memcpy(copy, path.c_str(), path.size() + 1);
  const uintptr_t word = reinterpret_cast<uintptr_t>(copy);
  static_assert(alignof(std::max_align_t) >= 2);  // bit 0 of a new[] address is free for kClaimed
  const int first = kind == Kind::File ? 0 : kFileSlots;
  const int count = kind == Kind::File ? kFileSlots : kDirectorySlots;
  for (int handle = first; handle < first + count; ++handle) {
    uintptr_t empty = 0;
    if (slot(handle)->compare_exchange_strong(empty, word)) return handle;
  }
  delete[] copy;
  return -1;
}

void forget(int handle) noexcept {
  std::atomic<uintptr_t>* s = slot(handle);
  if (s == nullptr) return;
  const uintptr_t word = s->exchange(0);
  if ((word & kClaimed) == 0) delete[] reinterpret_cast<char*>(word);  // claimed: the remover's now
}

}  // namespace unfinished_outputs

int remove_unfinished_outputs() noexcept {
  using namespace unfinished_outputs;
  int removed = 0;
  for (std::atomic<uintptr_t>& s : file_slots) removed += remove_recorded(s, ::unlink);
  // A directory is removed only once empty: nested ones are remembered deepest first, and a
  // further pass takes any whose subdirectory came later in the table.
  for (int pass_removed = 1; pass_removed > 0; removed += pass_removed) {
    pass_removed = 0;
    for (std::atomic<uintptr_t>& s : directory_slots) pass_removed += remove_recorded(s, ::rmdir);
  }
  return removed;
}

}  // namespace microscale
