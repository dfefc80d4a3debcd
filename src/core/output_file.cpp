// OutputFile: write beside the destination, rename onto it when complete.
#include "microscale/output_file.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <random>

#include "core/unfinished_outputs.hpp"
#include "microscale/error.hpp"

namespace microscale {

namespace fs = std::filesystem;

namespace {

std::string errno_text(int error) { return std::string(": ") + std::strerror(error); }

constexpr size_t kRandomDigits = 12;  // hexadecimal: 48 random bits

// "." + the destination's file name (its first 200 bytes, so that a name of up to 255 bytes still
// gives a valid one) + ".": what every temporary name of that destination starts with.
std::string temporary_prefix(const fs::path& destination) {
  std::string name = destination.filename().string();
  name.resize(std::min<size_t>(name.size(), 200));
  return "." + name + ".";
}

// A fresh name beside `destination`: hidden, with a random suffix.
std::string temporary_name(const fs::path& destination) {
  static thread_local std::mt19937_64 random(std::random_device{}() ^ static_cast<uint64_t>(::getpid()));
  char suffix[kRandomDigits + 1];
  std::snprintf(suffix, sizeof suffix, "%012llx",
                static_cast<unsigned long long>(random() & 0xFFFFFFFFFFFFull));
  return (destination.parent_path() / (temporary_prefix(destination) + suffix)).string();
}

bool is_temporary_name_of(const std::string& name, const std::string& prefix) {
  if (name.size() != prefix.size() + kRandomDigits || name.compare(0, prefix.size(), prefix) != 0)
    return false;
  return std::all_of(name.begin() + static_cast<std::ptrdiff_t>(prefix.size()), name.end(),
                     [](char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); });
}

// Temporary files of `destination` that a process left when it ended without removing them
// (SIGKILL, the OOM killer, a crash, a power loss): named as temporary_name names them, not
// locked (every OutputFile holds an flock on its temporary file until the file has its name; the
// lock goes with the process), and not modified for a minute (covers a writer between its open
// and its flock). Best effort: what cannot be read or locked is left.
void remove_abandoned_temporaries(const fs::path& destination) {
  const std::string prefix = temporary_prefix(destination);
  const fs::path dir = destination.parent_path().empty() ? fs::path(".") : destination.parent_path();
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (!is_temporary_name_of(it->path().filename().string(), prefix)) continue;
    const std::string path = it->path().string();
    const int fd = ::open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) continue;
    struct stat st {};
    const bool abandoned = ::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) &&
                           st.st_mtime < std::time(nullptr) - 60 && ::flock(fd, LOCK_EX | LOCK_NB) == 0;
    struct stat named {};  // still the file that was checked under that name
    if (abandoned && ::lstat(path.c_str(), &named) == 0 && named.st_ino == st.st_ino &&
        named.st_dev == st.st_dev)
      ::unlink(path.c_str());
    ::close(fd);
  }
}

// Makes a rename in the directory of `path` durable (the directory entry on disk). Best effort:
// the file is already complete and in place, and some file systems refuse fsync on a directory.
void sync_directory_of(const std::string& path) {
  const fs::path parent = fs::path(path).parent_path();
  const int fd = ::open(parent.empty() ? "." : parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  static_cast<void>(::fsync(fd));
  ::close(fd);
}

}  // namespace

OutputFile::OutputFile(std::string path) : path_(std::move(path)) {
  struct stat existing {};
  const bool exists = ::stat(path_.c_str(), &existing) == 0;
  if (exists && !S_ISREG(existing.st_mode)) {
    throw Error("cannot write '" + path_ + "': it exists and is not a regular file");
  }
  // NOTE: in the destination's directory, so that the rename is atomic (one file system).
  // O_EXCL | O_NOFOLLOW: a name that exists (another writer's, or a planted link) is never
  // written through; another random name is tried.
  // The name is remembered for remove_unfinished_outputs before the file exists, so that no
  // moment has it on disk and unrecorded (a name someone else holds is forgotten at once).
  for (int attempt = 0; attempt < 16 && fd_ < 0; ++attempt) {
    temporary_ = temporary_name(path_);
    unfinished_ = unfinished_outputs::remember(temporary_, unfinished_outputs::Kind::File);
    fd_ = ::open(temporary_.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
    if (fd_ >= 0) break;
    const int error = errno;
    unfinished_outputs::forget(unfinished_);
    unfinished_ = -1;
    if (error != EEXIST) throw Error("cannot write '" + path_ + "'" + errno_text(error));
  }
  if (fd_ < 0) throw Error("cannot write '" + path_ + "': no free temporary name beside it");
  static_cast<void>(::flock(fd_, LOCK_EX | LOCK_NB));  // new, so free: marks the file as in use
  try {
    remove_abandoned_temporaries(path_);
  } catch (...) {  // best effort (only bad_alloc can come out of it)
  }
  // A replaced file keeps its permissions (a new one gets 0666 less the umask, as open gives it).
  if (exists) static_cast<void>(::fchmod(fd_, existing.st_mode & 07777));  // best effort
}

OutputFile::~OutputFile() {
  if (committed_) return;
  unfinished_outputs::forget(unfinished_);  // first: a signal now removes nothing of another's
  if (fd_ >= 0) ::close(fd_);
  ::unlink(temporary_.c_str());
}

void OutputFile::write(const void* data, size_t nbytes) {
  if (committed_) throw Error("'" + path_ + "' was already committed");
  const auto* bytes = static_cast<const char*>(data);
  while (nbytes > 0) {  // write() may take part of the bytes (a signal, a file size limit)
    const ssize_t n = ::write(fd_, bytes, nbytes);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw Error("error while writing '" + path_ + "'" + errno_text(n < 0 ? errno : ENOSPC));
    bytes += n;
    nbytes -= static_cast<size_t>(n);
  }
}

void OutputFile::commit() {
  if (committed_) return;
  const int fd = fd_;
  fd_ = -1;
  // The flock stays with a second descriptor until the rename is done: close's error is checked
  // before the file gets its name, and no other writer takes it for abandoned meanwhile.
  const int lock = ::dup(fd);
  // The bytes reach the disk before the name does: without fsync, a crash or power loss after the
  // rename can leave the destination empty or short (file systems may write the rename first).
  // EINVAL / ENOTSUP: a file system that cannot sync (some FUSE and network mounts); the file is
  // then as durable as that file system makes it. The file is closed whatever fsync says.
  const bool synced = ::fsync(fd) == 0 || errno == EINVAL || errno == ENOTSUP;
  const int sync_error = errno;
  const bool closed = ::close(fd) == 0;
  if (!synced || !closed) {
    const int error = synced ? errno : sync_error;
    if (lock >= 0) ::close(lock);
    throw Error("error while writing '" + path_ + "'" + errno_text(error));
  }
  const int renamed = std::rename(temporary_.c_str(), path_.c_str());
  const int rename_error = errno;
  if (lock >= 0) ::close(lock);
  if (renamed != 0)
    throw Error("cannot move the finished file onto '" + path_ + "'" + errno_text(rename_error));
  unfinished_outputs::forget(unfinished_);
  committed_ = true;
  sync_directory_of(path_);
}

void write_text_file(const std::string& path, const std::string& text) {
  OutputFile file(path);
  file.write(text);
  file.commit();
}

}  // namespace microscale
