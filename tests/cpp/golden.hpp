// Where the golden cases live: ../shared/golden (CMake option MICROSCALE_GOLDEN_DIR), or the
// MICROSCALE_GOLDEN_DIR environment variable when set. The files are read in place, never copied.
#pragma once

#include <cstdlib>
#include <string>

inline std::string golden_dir() {
  if (const char* env = std::getenv("MICROSCALE_GOLDEN_DIR"); env != nullptr && *env != '\0') return env;
  return MICROSCALE_GOLDEN_DIR;
}
