// unfinished_outputs (unfinished_outputs.hpp) and remove_unfinished_outputs (output_file.hpp).
//
// A signal may arrive on any thread while another remembers or forgets, so the table is a fixed
// array of atomic pointers to heap copies of the paths, and whoever takes a pointer out of its
// slot (exchange with null) owns it until it puts it back: forget() frees what it took, the
// remover removes the path and puts it back, never frees. So no path is freed while it is being
// read, and the remover calls only lock-free atomics and the async-signal-safe unlink and rmdir.
#include "core/unfinished_outputs.hpp"

#include <unistd.h>

#include <atomic>
#include <cstring>
#include <new>

#include "microscale/output_file.hpp"

namespace microscale {
namespace unfinished_outputs {
namespace {

// Files: the temporary files of the OutputFiles open at once and the shards of the conversions
// under way (a model of a few hundred shards fits). Directories: those conversions created.
constexpr int kFileSlots = 2048, kDirectorySlots = 256;

std::atomic<char*> file_slots[kFileSlots];
std::atomic<char*> directory_slots[kDirectorySlots];
static_assert(std::atomic<char*>::is_always_lock_free, "a signal handler may only use lock-free atomics");

std::atomic<char*>* slot(int handle) {
  if (handle < 0 || handle >= kFileSlots + kDirectorySlots) return nullptr;
  return handle < kFileSlots ? &file_slots[handle] : &directory_slots[handle - kFileSlots];
}

}  // namespace

int remember(const std::string& path, Kind kind) noexcept {
  char* copy = new (std::nothrow) char[path.size() + 1];
  if (copy == nullptr) return -1;
  std::memcpy(copy, path.c_str(), path.size() + 1);
  const int first = kind == Kind::File ? 0 : kFileSlots;
  const int count = kind == Kind::File ? kFileSlots : kDirectorySlots;
  for (int handle = first; handle < first + count; ++handle) {
    char* empty = nullptr;
    if (slot(handle)->compare_exchange_strong(empty, copy)) return handle;
  }
  delete[] copy;
  return -1;
}

void forget(int handle) noexcept {
  std::atomic<char*>* s = slot(handle);
  if (s != nullptr) delete[] s->exchange(nullptr);
}

}  // namespace unfinished_outputs

int remove_unfinished_outputs() noexcept {
  using namespace unfinished_outputs;
  // Each path is taken out of its slot while in use and put back after (its owner's forget()
  // frees it; one forgotten meanwhile stays, and a later call finds it gone: unlink fails).
  const auto remove_in = [](std::atomic<char*>& s, int (*remove)(const char*)) {
    char* path = s.exchange(nullptr);
    if (path == nullptr) return false;
    const bool removed = remove(path) == 0;
    char* empty = nullptr;
    s.compare_exchange_strong(empty, path);  // a slot taken meanwhile by another path: left, leaked
    return removed;
  };
  int removed = 0;
  for (std::atomic<char*>& s : file_slots) removed += remove_in(s, ::unlink);
  // A directory is removed only once empty: nested ones are remembered deepest first, and a
  // further pass takes any whose subdirectory came later in the table.
  for (int pass_removed = 1; pass_removed > 0; removed += pass_removed) {
    pass_removed = 0;
    for (std::atomic<char*>& s : directory_slots) pass_removed += remove_in(s, ::rmdir);
  }
  return removed;
}

}  // namespace microscale
