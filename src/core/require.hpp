// require(): the one-line argument check of the core: throws microscale::Error with the reason.
#pragma once

#include <string>

#include "microscale/error.hpp"

namespace microscale {

inline void require(bool condition, const std::string& reason) {
  if (!condition) throw Error(reason);
}

}  // namespace microscale
