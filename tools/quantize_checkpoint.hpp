// `microscale quantize`, `microscale inspect`, `microscale bench`.
#pragma once

#include <CLI/CLI.hpp>

namespace microscale::tools {

void add_quantize_command(CLI::App& app);
void add_inspect_command(CLI::App& app);
void add_bench_command(CLI::App& app);

}  // namespace microscale::tools
