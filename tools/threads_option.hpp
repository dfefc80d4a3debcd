// The --threads option every CLI command shares.
#pragma once

#include <CLI/CLI.hpp>

#include "microscale/quantize.hpp"  // kMaxThreads

namespace microscale::tools {

inline CLI::Option* add_threads_option(CLI::App* cmd, int& threads) {
  return cmd->add_option("--threads", threads, "CPU threads (default: all)")
      ->check(CLI::Range(0, kMaxThreads));
}

}  // namespace microscale::tools
