// ASCII lower case for the names the parsers accept in any case ("NVFP4", "RCEIL", "16X16"): A-Z
// only, whatever the C locale (std::tolower follows it: a Turkish locale maps 'I' elsewhere).
#pragma once

#include <string>
#include <string_view>

namespace microscale {

inline std::string ascii_lowercase(std::string_view s) {
  std::string out(s);
  for (char& c : out) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  return out;
}

}  // namespace microscale
