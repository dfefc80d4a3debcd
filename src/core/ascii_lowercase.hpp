// ASCII lower case for the names the parsers accept in any case ("NVFP4", "RCEIL", "16X16").
#pragma once

#include <cctype>
#include <string>
#include <string_view>

namespace microscale {

inline std::string ascii_lowercase(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

}  // namespace microscale
