// OutputFile: write beside the destination, rename onto it when complete.
#include "microscale/output_file.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "microscale/error.hpp"

namespace microscale {

namespace fs = std::filesystem;

namespace {

// errno's text after a failed stream operation, when the C library left one.
std::string system_reason() { return errno != 0 ? std::string(": ") + std::strerror(errno) : std::string(); }

}  // namespace

OutputFile::OutputFile(std::string path) : path_(std::move(path)) {
  std::error_code ec;
  const fs::file_status status = fs::status(path_, ec);
  if (fs::exists(status) && !fs::is_regular_file(status)) {
    throw Error("cannot write '" + path_ + "': it exists and is not a regular file");
  }
  // NOTE: in the destination's directory, so that the rename is atomic (one file system); the
  // process id keeps two writers of the same destination apart.
  temporary_ = path_ + ".microscale-tmp." + std::to_string(::getpid());
  errno = 0;
  out_.open(temporary_, std::ios::binary | std::ios::trunc);
  if (!out_) throw Error("cannot write '" + path_ + "'" + system_reason());
}

OutputFile::~OutputFile() {
  if (committed_) return;
  out_.close();
  std::remove(temporary_.c_str());
}

void OutputFile::write(const void* data, size_t nbytes) {
  if (committed_) throw Error("'" + path_ + "' was already committed");
  errno = 0;
  out_.write(static_cast<const char*>(data), static_cast<std::streamsize>(nbytes));
  if (!out_) throw Error("error while writing '" + path_ + "'" + system_reason());
}

void OutputFile::commit() {
  if (committed_) return;
  errno = 0;
  out_.flush();
  out_.close();  // buffered bytes reach the file system here: a full disk shows now
  if (!out_) throw Error("error while writing '" + path_ + "'" + system_reason());
  if (std::rename(temporary_.c_str(), path_.c_str()) != 0) {
    throw Error("cannot move the finished file onto '" + path_ + "'" + system_reason());
  }
  committed_ = true;
}

void write_text_file(const std::string& path, const std::string& text) {
  OutputFile file(path);
  file.write(text);
  file.commit();
}

}  // namespace microscale
