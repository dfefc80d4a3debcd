// microscale/output_file.hpp — files written whole or not at all.
//
// Every file microscale writes (safetensors, config and index JSON, reports; not the files a
// conversion copies from the model directory) goes through OutputFile: the bytes go to a hidden
// temporary file beside the destination (a random name, created exclusively), which is renamed onto
// the destination only once it is complete, on disk (fsync) and closed without error; the directory
// is synced after the rename. So a full disk, a failed conversion or a power loss leaves no
// truncated file under the real name, and a destination that is also being read (an input file
// still mapped) is replaced, never truncated under the reader. A symbolic link at the destination
// is replaced by the file, not written through; a replaced file keeps its permissions. A process
// that a signal ends while writing leaves its hidden temporary file, unless its handler calls
// remove_unfinished_outputs() first (the CLI's does, for SIGINT, SIGTERM and SIGHUP; SIGKILL cannot
// be caught). Such a file goes when an OutputFile of the same destination starts a minute or more
// later: a writer holds an flock on its temporary file until it has its name, so one that is not
// locked and has not changed for a minute is taken for abandoned (a file system whose flock does
// not reach other hosts cannot tell a writer there).
#pragma once

#include <cstddef>
#include <string>

namespace microscale {

/// @brief A file being written; commit() puts it in place, destruction without commit() discards it.
class OutputFile {
 public:
  /// @brief Creates the temporary file. Throws microscale::Error when `path` names a directory or
  /// another non-regular file, or when the temporary file cannot be created.
  explicit OutputFile(std::string path);
  ~OutputFile();
  OutputFile(const OutputFile&) = delete;
  OutputFile& operator=(const OutputFile&) = delete;

  /// @brief Appends bytes; throws microscale::Error when the write fails.
  void write(const void* data, size_t nbytes);
  void write(const std::string& text) { write(text.data(), text.size()); }
  /// @brief Flushes and closes the file, checking both, then renames it onto the destination.
  void commit();
  const std::string& path() const { return path_; }

 private:
  std::string path_, temporary_;
  int fd_ = -1;          // the temporary file, unbuffered: callers write whole headers and tensors
  int unfinished_ = -1;  // its record for remove_unfinished_outputs
  bool committed_ = false;
};

/// @brief Removes the outputs of this process that are not finished: the temporary file of every
/// OutputFile not yet committed or destroyed, and the files and new directories of every
/// checkpoint conversion that has not yet written its last file. For a signal handler that then
/// ends the process (the objects that wrote them are not told): async-signal-safe, it only
/// unlinks and removes empty directories. Returns how many it removed.
int remove_unfinished_outputs() noexcept;

/// @brief Writes `text` to `path` through an OutputFile.
void write_text_file(const std::string& path, const std::string& text);

}  // namespace microscale
