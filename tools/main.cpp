// The `microscale` command-line tool: one subcommand per file of tools/.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <exception>

#include "microscale/error.hpp"
#include "quantize_checkpoint.hpp"
#include "quantize_tensors.hpp"
#include "signal_cleanup.hpp"

int main(int argc, char** argv) {
  CLI::App app{"microscale: block-scaled low-precision numerics (NVFP4, MXFP8, MXFP6, MXFP4)"};
  app.require_subcommand(1);
  microscale::tools::add_quantize_command(app);
  microscale::tools::add_inspect_command(app);
  microscale::tools::add_bench_command(app);
  microscale::tools::add_quantize_tensors_command(app);
  microscale::tools::remove_unfinished_outputs_on_signals();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const microscale::Error& e) {
    std::fprintf(stderr, "microscale: error: %s\n", e.reason().c_str());
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
  return 0;
}
