// OutputFile: write beside the destination, rename onto it when complete.
#include "microscale/output_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <random>

#include "core/unfinished_outputs.hpp"
#include "microscale/error.hpp"

namespace microscale {

namespace fs = std::filesystem;

namespace {

std::string errno_text(int error) { return std::string(": ") + std::strerror(error); }

// A fresh name beside `destination`: hidden, with a random suffix, short enough that a
// destination name of up to 255 bytes still gives a valid one.
std::string temporary_name(const fs::path& destination) {
  static thread_local std::mt19937_64 random(std::random_device{}() ^ static_cast<uint64_t>(::getpid()));
  char suffix[20];
  std::snprintf(suffix, sizeof suffix, ".%012llx",
                static_cast<unsigned long long>(random() & 0xFFFFFFFFFFFFull));
  std::string name = destination.filename().string();
  name.resize(std::min<size_t>(name.size(), 200));
  name.insert(name.begin(), '.');
  name.append(suffix);
  return (destination.parent_path() / name).string();
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
  if (::close(fd) != 0) throw Error("error while writing '" + path_ + "'" + errno_text(errno));
  if (std::rename(temporary_.c_str(), path_.c_str()) != 0) {
    throw Error("cannot move the finished file onto '" + path_ + "'" + errno_text(errno));
  }
  unfinished_outputs::forget(unfinished_);
  committed_ = true;
}

void write_text_file(const std::string& path, const std::string& text) {
  OutputFile file(path);
  file.write(text);
  file.commit();
}

}  // namespace microscale
