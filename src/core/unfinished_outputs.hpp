// The outputs this process has started and not finished (an OutputFile's temporary file, the files
// and directories of a checkpoint conversion before its last file is in place), kept where a
// signal handler can remove them: remove_unfinished_outputs (output_file.hpp) takes them away
// before a signal ends the process, as an exception's unwinding would have.
#pragma once

#include <string>

namespace microscale::unfinished_outputs {

enum class Kind { File, Directory };

/// @brief Records a copy of `path`: from now until forget(), remove_unfinished_outputs removes
/// whatever is at that path (a file, or an empty directory), so a writer forgets a record before
/// the path holds something it must keep (a finished file, an earlier run's file it did not
/// replace). Returns the handle for forget(), or -1 when no memory or no slot is left (the path
/// is then not removed by a signal; nothing else changes).
int remember(const std::string& path, Kind kind) noexcept;

/// @brief Drops a record (before the caller removes the path itself, or once it is finished).
/// -1 is a no-op. A removal already under way on another thread (a signal handler that has
/// claimed the record) may still remove the path after this returns; the process is then ending.
void forget(int handle) noexcept;

}  // namespace microscale::unfinished_outputs
