// What the CLI does when SIGINT (Ctrl-C), SIGTERM or SIGHUP arrives: it removes the outputs it
// has not finished (remove_unfinished_outputs: temporary files, the shards of a conversion not yet
// whole), says so, and ends as the signal would have (a shell sees the same status).
#pragma once

namespace microscale::tools {

/// @brief Installs the handler for each of the three signals that this process does not ignore (a
/// signal ignored at startup, as in a shell's background job, stays ignored).
void remove_unfinished_outputs_on_signals();

}  // namespace microscale::tools
