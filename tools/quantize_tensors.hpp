// `microscale quantize-tensors`: quantize every floating tensor of a safetensors file.
#pragma once

#include <CLI/CLI.hpp>

namespace microscale::tools {

/// Registers the subcommand on `app`; it runs from the parsed callback.
void add_quantize_tensors_command(CLI::App& app);

}  // namespace microscale::tools
