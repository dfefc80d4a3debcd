// The 4over6 options (TransformerEngine's nvfp4_4over6) that quantize-tensors and quantize share.
#pragma once

#include <CLI/CLI.hpp>
#include <optional>
#include <string>

namespace microscale::tools {

struct FourOverSixArgs {
  std::optional<std::string> mode;  // mae | mse; none: off
  bool scaled_error = false;
  int e4m3_max = 448;
};

inline void add_four_over_six_options(CLI::App* cmd, FourOverSixArgs& a) {
  cmd->add_option("--4over6", a.mode,
                  "nvfp4: per block, the better of the usual scale and 1.5 times it (TransformerEngine's "
                  "nvfp4_4over6), by the error mae | mse");
  cmd->add_flag("--4over6-scaled-error", a.scaled_error,
                "nvfp4 --4over6: measure the error in the scaled domain (TE's ..._ERR_USE_FAST_MATH)");
  cmd->add_option("--e4m3-max", a.e4m3_max,
                  "nvfp4: E4M3 bound of the global scale, 448 (default) or 256 (TE's 4over6 default; needs "
                  "--4over6)");
}

}  // namespace microscale::tools
