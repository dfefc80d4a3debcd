// microscale/error.hpp — the one exception type the library throws.
//
// Every rejected input (bad dtype, shape that cannot be blocked, short buffer, hostile file, ...)
// raises microscale::Error with a message that names the argument and the reason. The library
// never aborts on user input.
#pragma once

#include <stdexcept>
#include <string>

namespace microscale {

/// @brief Raised for every invalid argument or unreadable input; what() says which and why.
class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& reason) : std::runtime_error("microscale: " + reason), reason_(reason) {}
  /// @brief The message without the "microscale: " prefix (for wrapping with more context).
  const std::string& reason() const { return reason_; }

 private:
  std::string reason_;
};

}  // namespace microscale
