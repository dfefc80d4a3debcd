// The --threads option every CLI command shares.
#pragma once

#include <CLI/CLI.hpp>

namespace microscale::tools {

// More threads than this is a typo, not a machine: an OpenMP team of a million threads exhausts
// memory in the runtime, which then aborts instead of reporting.
constexpr int kMaxThreads = 1024;

inline CLI::Option* add_threads_option(CLI::App* cmd, int& threads) {
  return cmd->add_option("--threads", threads, "CPU threads (default: all)")
      ->check(CLI::Range(0, kMaxThreads));
}

}  // namespace microscale::tools
