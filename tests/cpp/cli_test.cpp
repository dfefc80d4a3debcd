// The `microscale quantize-tensors` command: output names, bytes equal to the library's, the
// table, and clear messages with a non-zero exit for bad input.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "microscale/quantize.hpp"
#include "microscale/safetensors.hpp"
#include "temp_path.hpp"
#include "test_data.hpp"

extern char** environ;  // the process's environment, passed to the spawned CLI (POSIX)

namespace microscale {
namespace {

struct Result {
  int exit_code;
  std::string output;  // stdout and stderr
};

Result run_cli(const std::string& args) {
  const std::string command = std::string(MICROSCALE_CLI_PATH) + " " + args + " 2>&1";
  FILE* pipe = popen(command.c_str(), "r");
  Result r{-1, ""};
  if (pipe == nullptr) return r;
  std::array<char, 4096> buf{};
  size_t n;
  while ((n = fread(buf.data(), 1, buf.size(), pipe)) > 0) r.output.append(buf.data(), n);
  const int status = pclose(pipe);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return r;
}

std::string temp(const std::string& name) { return testing_paths::temp_path(name).string(); }

std::string make_input() {
  const std::string path = temp("in.safetensors");
  const Tensor w = testing_data::random_tensor(DType::BF16, {64, 128}, testing_data::Fill::Normal, 1);
  const Tensor b = testing_data::random_tensor(DType::BF16, {32, 32}, testing_data::Fill::Normal, 2);
  const std::vector<int64_t> ids = {1, 2, 3};
  write_safetensors(path, {{"layer.weight", "BF16", w.shape(), w.data(), w.nbytes()},
                           {"layer.bias", "BF16", b.shape(), b.data(), b.nbytes()},
                           {"ids", "I64", {3}, ids.data(), 24}});
  return path;
}

TEST(Cli, QuantizeTensorsNvfp4) {
  const std::string in = make_input(), out = temp("out.safetensors");
  const Result r = run_cli("quantize-tensors " + in + " -o " + out + " --scheme nvfp4 --rht --swizzle");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("SQNR"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("layer.weight"), std::string::npos);
  const SafetensorsFile f = SafetensorsFile::open(out);
  for (const char* name :
       {"layer.weight.rowwise_data", "layer.weight.rowwise_scale", "layer.weight.rowwise_amax",
        "layer.weight.columnwise_data", "layer.weight.columnwise_scale", "layer.weight.columnwise_amax",
        "layer.bias.rowwise_data", "ids"}) {
    EXPECT_TRUE(f.contains(name)) << name;
  }
  // The bytes are the library's.
  const SafetensorsFile src = SafetensorsFile::open(in);
  QuantizeOptions o;
  o.rowwise = o.columnwise = true;
  o.rht = true;
  o.scale_layout = ScaleLayout::Swizzled;
  const QuantizedTensor q = quantize(src.view("layer.weight"), o);
  const SafetensorsEntry& data = f.at("layer.weight.columnwise_data");
  ASSERT_EQ(data.nbytes, q.columnwise_data.nbytes());
  EXPECT_EQ(0, std::memcmp(data.data, q.columnwise_data.data(), data.nbytes));
  const SafetensorsEntry& scale = f.at("layer.weight.rowwise_scale");
  ASSERT_EQ(scale.nbytes, q.rowwise_scale.nbytes());
  EXPECT_EQ(0, std::memcmp(scale.data, q.rowwise_scale.data(), scale.nbytes));
  EXPECT_EQ(f.metadata().at("microscale.scheme"), "nvfp4");
  // The largest seed is taken whole and recorded; the scheme is recorded by its canonical name.
  const Result seeded = run_cli("quantize-tensors " + in + " -o " + out +
                                " --scheme NVFP4 --rowwise --rht --sr-seed 18446744073709551615");
  ASSERT_EQ(seeded.exit_code, 0) << seeded.output;
  const SafetensorsFile g = SafetensorsFile::open(out);
  EXPECT_EQ(g.metadata().at("microscale.sr_seed"), "18446744073709551615");
  EXPECT_EQ(g.metadata().at("microscale.scheme"), "nvfp4");
  EXPECT_EQ(g.metadata().at("microscale.rht"), "false");  // rowwise only: no transform applied
  // Names in any case, as --scheme; the metadata keeps the canonical spelling.
  const Result upper = run_cli("quantize-tensors " + in + " -o " + out + " --scheme NvFp4 --tile 16X16");
  ASSERT_EQ(upper.exit_code, 0) << upper.output;
  EXPECT_EQ(SafetensorsFile::open(out).metadata().at("microscale.tile"), "16x16");
}

TEST(Cli, QuantizeTensorsNvfp4FourOverSix) {
  const std::string in = make_input(), out = temp("out_4over6.safetensors");
  const Result r = run_cli("quantize-tensors " + in + " -o " + out +
                           " --scheme nvfp4 --tile 16x16 --4over6 MSE --e4m3-max 256");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const SafetensorsFile f = SafetensorsFile::open(out);
  EXPECT_EQ(f.metadata().at("microscale.four_over_six"), "mse");
  EXPECT_EQ(f.metadata().at("microscale.nvfp4_e4m3_max"), "256");
  QuantizeOptions o;
  o.rowwise = o.columnwise = true;
  o.tile = Tile::k16x16;
  o.four_over_six = FourOverSix::MinMse;
  o.nvfp4_e4m3_max = 256;
  const QuantizedTensor q = quantize(SafetensorsFile::open(in).view("layer.weight"), o);
  for (const auto& [name, t] : {std::pair{"layer.weight.rowwise_data", &q.rowwise_data},
                                {"layer.weight.columnwise_scale", &q.columnwise_scale}}) {
    const SafetensorsEntry& e = f.at(name);
    ASSERT_EQ(e.nbytes, t->nbytes()) << name;
    EXPECT_EQ(0, std::memcmp(e.data, t->data(), e.nbytes)) << name;
  }
  // The plain scheme records the usual bound.
  ASSERT_EQ(run_cli("quantize-tensors " + in + " -o " + out + " --scheme nvfp4").exit_code, 0);
  EXPECT_EQ(SafetensorsFile::open(out).metadata().at("microscale.nvfp4_e4m3_max"), "448");
  EXPECT_EQ(SafetensorsFile::open(out).metadata().count("microscale.four_over_six"), 0u);
}

TEST(Cli, QuantizeTensorsNvfp4RowScaled) {
  const std::string in = make_input(), out = temp("out_row_scaled.safetensors");
  const Result r = run_cli("quantize-tensors " + in + " -o " + out + " --scheme nvfp4 --row-scaled");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const SafetensorsFile f = SafetensorsFile::open(out);
  EXPECT_EQ(f.metadata().at("microscale.row_scaled"), "true");
  QuantizeOptions o;
  o.rowwise = o.columnwise = true;
  o.row_scaled = true;
  const QuantizedTensor q = quantize(SafetensorsFile::open(in).view("layer.weight"), o);
  // One amax per row of each usage's matrix: [64] rowwise, [128] columnwise (the rows of X^T).
  for (const auto& [name, t] : {std::pair{"layer.weight.rowwise_amax", &q.rowwise_amaxes},
                                {"layer.weight.columnwise_amax", &q.columnwise_amaxes},
                                {"layer.weight.rowwise_data", &q.rowwise_data},
                                {"layer.weight.columnwise_scale", &q.columnwise_scale}}) {
    const SafetensorsEntry& e = f.at(name);
    EXPECT_EQ(e.shape, t->shape()) << name;
    ASSERT_EQ(e.nbytes, t->nbytes()) << name;
    EXPECT_EQ(0, std::memcmp(e.data, t->data(), e.nbytes)) << name;
  }
  const Result mx = run_cli("quantize-tensors " + in + " -o " + out + " --scheme mxfp8_e4m3 --row-scaled");
  EXPECT_NE(mx.exit_code, 0);
  EXPECT_NE(mx.output.find("--row-scaled applies to nvfp4 only"), std::string::npos) << mx.output;
  const Result tiles =
      run_cli("quantize-tensors " + in + " -o " + out + " --scheme nvfp4 --row-scaled --tile 16x16");
  EXPECT_NE(tiles.exit_code, 0);
  EXPECT_NE(tiles.output.find("1x16 blocks only"), std::string::npos) << tiles.output;
}

TEST(Cli, QuantizeTensorsMxRowwiseOnly) {
  const std::string in = make_input(), out = temp("out_mx.safetensors");
  const Result r =
      run_cli("quantize-tensors " + in + " -o " + out + " --scheme mxfp4 --scale-mode floor --rowwise");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const SafetensorsFile f = SafetensorsFile::open(out);
  EXPECT_TRUE(f.contains("layer.weight.rowwise_data"));
  EXPECT_FALSE(f.contains("layer.weight.columnwise_data"));
  EXPECT_FALSE(f.contains("layer.weight.rowwise_amax"));  // MX has no global scale
  EXPECT_EQ(f.at("layer.weight.rowwise_data").shape, (std::vector<int64_t>{64, 64}));
  EXPECT_EQ(f.at("layer.weight.rowwise_scale").shape, (std::vector<int64_t>{64, 4}));
  EXPECT_EQ(f.metadata().at("microscale.tile"), "1x32");
}

TEST(Cli, QuantizeTensorsMxTiles) {
  const std::string in = make_input(), out = temp("out_mx_tiles.safetensors");
  const Result r = run_cli("quantize-tensors " + in + " -o " + out + " --scheme mxfp8_e4m3 --tile 32X32");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  const SafetensorsFile f = SafetensorsFile::open(out);
  EXPECT_EQ(f.metadata().at("microscale.tile"), "32x32");
  // One scale per 32x32 tile: both directions hold the same codes.
  const SafetensorsEntry row = f.at("layer.weight.rowwise_data"), col = f.at("layer.weight.columnwise_data");
  ASSERT_EQ(row.nbytes, col.nbytes);
  EXPECT_EQ(std::memcmp(row.data, col.data, row.nbytes), 0);
}

TEST(Cli, BadInputIsAMessageAndNonZeroExit) {
  const std::string in = make_input(), out = temp("bad.safetensors");
  const std::pair<std::string, std::string> cases[] = {
      {"quantize-tensors " + in + " -o " + out + " --scheme nvfp5", "unknown scheme"},
      {"quantize-tensors " + in + " -o " + out + " --scheme mxfp8_e4m3 --scale-mode up",
       "unknown scale mode"},
      {"quantize-tensors " + in + " -o " + out + " --scheme nvfp4 --scale-mode floor",
       "--scale-mode applies"},
      {"quantize-tensors " + in + " -o " + out + " --scheme nvfp4 --tile 8x8", "unknown tile '8x8'"},
      {"quantize-tensors " + in + " -o " + out + " --scheme mxfp8_e4m3 --tile 16x16",
       "16x16 tiles are nvfp4's"},
      {"quantize-tensors " + in + " -o " + out + " --scheme nvfp4 --tile 32x32", "32x32 tiles are MX's"},
      {"quantize-tensors " + in + " -o " + out + " --scheme mxfp4 --sr-seed 3", "stochastic rounding"},
      {"quantize-tensors " + in + " -o " + out + " --scheme nvfp4 --bogus", "bogus"},
      {"quantize-tensors " + in + " -o " + out + " --scheme nvfp4 --4over6 l1",
       "unknown 4over6 error mode 'l1'"},
      {"quantize-tensors " + in + " -o " + out + " --scheme mxfp4 --4over6 mae", "--4over6 applies to nvfp4"},
      {"quantize-tensors " + in + " -o " + out + " --scheme nvfp4 --e4m3-max 256", "or 256 with 4over6"},
      {"quantize-tensors " + in + " -o " + out + " --scheme nvfp4 --4over6 mae --rht",
       "does not take the RHT"},
      {"quantize-tensors " + in + " -o " + out + " --scheme nvfp4 --4over6-scaled-error",
       "applies to 4over6 only"},
      {"quantize-tensors " + in + " -o " + out + " --scheme nvfp4 --sr-seed -5", "--sr-seed must be"},
      {"quantize-tensors " + in + " -o " + out + " --scheme nvfp4 --sr-seed 18446744073709551616",
       "--sr-seed must be"},
      {"quantize-tensors " + in + " -o " + out + " --scheme mxfp4 --scale-mode ''", "unknown scale mode"},
      {"quantize-tensors " + in + " -o " + out + " --scheme nvfp4 --threads 1000000", "not in range"},
      {"quantize-tensors " + in + " -o " + in + " --scheme nvfp4", "is the input file"},
      {"quantize-tensors " + in + " -o " + testing_paths::temp_path("").parent_path().string() +
           " --scheme nvfp4",
       "not a regular file"},  // a directory
      {"quantize-tensors " + in + " --scheme nvfp4", "output"},
      {"quantize-tensors /nonexistent.safetensors -o " + out + " --scheme nvfp4", "nonexistent"},
      {"frobnicate", "subcommand"},
  };
  for (const auto& [args, message] : cases) {
    const Result r = run_cli(args);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
  }
  // A truncated file, and a tensor that cannot be blocked (rows of 30 for columnwise).
  {
    std::ofstream bad(temp("truncated.safetensors"), std::ios::binary);
    bad.write("\x40\x00\x00\x00\x00\x00\x00\x00{\"a\":", 13);
  }
  Result r = run_cli("quantize-tensors " + temp("truncated.safetensors") + " -o " + out + " --scheme nvfp4");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("truncated"), std::string::npos) << r.output;
  const std::vector<float> odd(30 * 32, 1.0f);
  write_safetensors(temp("odd.safetensors"), {{"odd", "F32", {30, 32}, odd.data(), odd.size() * 4}});
  r = run_cli("quantize-tensors " + temp("odd.safetensors") + " -o " + out + " --scheme mxfp8_e4m3");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("tensor 'odd'"), std::string::npos) << r.output;
  // RHT needs bf16 input: an f32 tensor is refused by name.
  const std::vector<float> f32(32 * 32, 1.0f);
  write_safetensors(temp("f32.safetensors"), {{"w", "F32", {32, 32}, f32.data(), f32.size() * 4}});
  r = run_cli("quantize-tensors " + temp("f32.safetensors") + " -o " + out + " --scheme nvfp4 --rht");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.output.find("RHT is only supported for bf16"), std::string::npos) << r.output;
  EXPECT_EQ(run_cli("quantize-tensors --help").exit_code, 0);
}

}  // namespace
}  // namespace microscale

namespace microscale {
namespace {

// `microscale quantize` / `inspect` / `bench` on a small model directory.
std::string make_model_dir() {
  const std::filesystem::path dir = testing_paths::temp_path("model");
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  const Tensor w = testing_data::random_tensor(DType::BF16, {64, 128}, testing_data::Fill::Normal, 7);
  const Tensor e = testing_data::random_tensor(DType::F32, {50, 128}, testing_data::Fill::Normal, 8);
  write_safetensors((dir / "model.safetensors").string(),
                    {{"layers.0.proj.weight", "BF16", w.shape(), w.data(), w.nbytes()},
                     {"embed_tokens.weight", "F32", e.shape(), e.data(), e.nbytes()}});
  std::ofstream(dir / "config.json") << R"({"model_type": "demo"})";
  return dir.string();
}

TEST(CliCheckpoint, QuantizeWritesModelReportAndJson) {
  const std::string in = make_model_dir(), out = temp("model_out"), report = temp("report.json");
  std::filesystem::remove_all(out);
  const Result r = run_cli("quantize " + in + " -o " + out +
                           " --format nvfp4 --convention compressed-tensors --report " + report);
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("summary: nvfp4 (compressed-tensors), 1 of 2 tensors quantized"), std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("1/2"), std::string::npos) << r.output;  // plain progress lines (not a terminal)
  const SafetensorsFile f = SafetensorsFile::open(out + "/model.safetensors");
  EXPECT_TRUE(f.contains("layers.0.proj.weight_packed"));
  EXPECT_TRUE(f.contains("layers.0.proj.weight_global_scale"));
  EXPECT_TRUE(f.contains("embed_tokens.weight"));
  std::ifstream json_in(report);
  const std::string json((std::istreambuf_iterator<char>(json_in)), std::istreambuf_iterator<char>());
  EXPECT_NE(json.find("\"mean_sqnr_db\""), std::string::npos);
  const Result inspect = run_cli("inspect " + out);
  ASSERT_EQ(inspect.exit_code, 0) << inspect.output;
  EXPECT_NE(inspect.output.find("compressed-tensors nvfp4"), std::string::npos) << inspect.output;
  EXPECT_NE(inspect.output.find("layers.0.proj"), std::string::npos) << inspect.output;
  // --skip keeps a layer; gpt-oss needs mxfp4.
  const Result skip = run_cli("quantize " + in + " -o " + out + "2 --format MXFP4 --skip '*proj*' -q");
  ASSERT_EQ(skip.exit_code, 0) << skip.output;
  EXPECT_NE(skip.output.find("0 of 2 tensors quantized"), std::string::npos) << skip.output;
}

TEST(CliCheckpoint, BadInputIsAMessageAndNonZeroExit) {
  const std::string in = make_model_dir(), out = temp("model_bad_out");
  const std::pair<std::string, std::string> cases[] = {
      {"quantize " + in + " -o " + out + " --format int3", "unknown format"},
      {"quantize " + in + " -o " + out + " --format nvfp4 --convention gpt-oss", "has no nvfp4 layout"},
      {"quantize " + in + " -o " + out + " --format mxfp8 --convention awq", "unknown convention"},
      {"quantize /nonexistent -o " + out + " --format nvfp4", "neither a file nor a directory"},
      {"quantize " + in + " -o " + in + " --format nvfp4", "must differ"},
      {"quantize " + in + " -o " + out + " --format nvfp4 --scale-mode floor",
       "scale mode applies to the MX formats"},
      {"inspect /nonexistent.safetensors", "neither a file nor a directory"},
      {"bench --size 33", "multiples of 32"},
  };
  for (const auto& [args, message] : cases) {
    const Result r = run_cli(args);
    EXPECT_NE(r.exit_code, 0) << args;
    EXPECT_NE(r.output.find(message), std::string::npos) << args << "\n" << r.output;
  }
  for (const char* help : {"quantize --help", "inspect --help", "bench --help", "--help"}) {
    EXPECT_EQ(run_cli(help).exit_code, 0) << help;
  }
}

// A child process, ended and reaped however the test leaves (a failed ASSERT included).
struct SpawnedChild {
  pid_t pid = 0;
  ~SpawnedChild() {
    if (pid <= 0) return;
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
  }
  int wait() {  // the status; the child is then gone
    int status = 0;
    const pid_t waited = ::waitpid(pid, &status, 0);
    pid = 0;
    return waited > 0 ? status : -1;
  }
};

// The CLI with `args` as a child: stdout to /dev/null, stderr to the write end of `stderr_pipe`
// (closed here), SIGINT and SIGTERM with their default actions and unblocked, whatever this
// process has (a shell's background job ignores SIGINT).
void spawn_cli(const std::vector<std::string>& args, SpawnedChild& child, int stderr_pipe[2]) {
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, STDOUT_FILENO, "/dev/null", O_WRONLY, 0);
  posix_spawn_file_actions_adddup2(&files, stderr_pipe[1], STDERR_FILENO);
  posix_spawn_file_actions_addclose(&files, stderr_pipe[0]);
  posix_spawn_file_actions_addclose(&files, stderr_pipe[1]);
  posix_spawnattr_t attributes;
  posix_spawnattr_init(&attributes);
  sigset_t signals, none;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  sigemptyset(&none);
  posix_spawnattr_setsigdefault(&attributes, &signals);
  posix_spawnattr_setsigmask(&attributes, &none);
  posix_spawnattr_setflags(&attributes, POSIX_SPAWN_SETSIGDEF | POSIX_SPAWN_SETSIGMASK);
  const std::string cli = MICROSCALE_CLI_PATH;
  std::vector<char*> argv = {const_cast<char*>(cli.c_str())};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const int spawned = posix_spawn(&child.pid, cli.c_str(), &files, &attributes, argv.data(), environ);
  posix_spawn_file_actions_destroy(&files);
  posix_spawnattr_destroy(&attributes);
  if (spawned != 0) child.pid = 0;
  ::close(stderr_pipe[1]);
  ASSERT_EQ(spawned, 0) << std::strerror(spawned);
}

// SIGINT (Ctrl-C) or SIGTERM in the middle of `microscale quantize`: the process ends by that
// signal, and the output directory it created is gone with the file in it. The child cannot
// finish first: its progress lines (~90 KB) go to a pipe of 4 KiB (64 KiB on 64 KiB pages) that
// is not read until the signal is sent, so by then it waits in a write.
TEST(CliCheckpoint, ASignalRemovesTheUnfinishedOutput) {
  constexpr int kTensors = 2000;  // "123/2000 quantized model.layers.123.mlp.down_proj.weight"
  const std::filesystem::path model = testing_paths::temp_path("many_tensors");
  std::filesystem::remove_all(model);
  std::filesystem::create_directories(model);
  const Tensor w = testing_data::random_tensor(DType::BF16, {16, 32}, testing_data::Fill::Normal, 9);
  std::vector<std::string> names;
  for (int i = 0; i < kTensors; ++i)
    names.push_back("model.layers." + std::to_string(i) + ".mlp.down_proj.weight");
  std::vector<SafetensorsTensor> tensors;
  for (const std::string& name : names) tensors.push_back({name, "BF16", w.shape(), w.data(), w.nbytes()});
  write_safetensors((model / "model.safetensors").string(), tensors);
  for (const int signal_number : {SIGINT, SIGTERM}) {
    SCOPED_TRACE(signal_number);
    const std::filesystem::path out = temp("interrupted_out") + std::to_string(signal_number);
    std::filesystem::remove_all(out);
    int err[2];
    ASSERT_EQ(::pipe(err), 0);
    const int capacity = ::fcntl(err[0], F_SETPIPE_SZ, 4096);
    if (capacity < 0 || capacity >= kTensors * 40) {
      ::close(err[0]);
      ::close(err[1]);
      GTEST_SKIP() << "no pipe smaller than the progress output (" << capacity << " bytes)";
    }
    SpawnedChild child;
    spawn_cli({"quantize", model.string(), "-o", out.string(), "--format", "nvfp4"}, child, err);
    if (HasFatalFailure()) {
      ::close(err[0]);
      return;
    }
    pollfd first_line{err[0], POLLIN, 0};  // a progress line: the conversion has begun
    const int ready = ::poll(&first_line, 1, 60'000);
    const int sent = ready == 1 ? ::kill(child.pid, signal_number) : -1;
    std::string text;
    char buf[4096];
    for (ssize_t n; sent == 0 && (n = ::read(err[0], buf, sizeof buf)) != 0;) {
      if (n > 0) text.append(buf, static_cast<size_t>(n));
      if (n < 0 && errno != EINTR) break;
    }
    ::close(err[0]);
    ASSERT_EQ(ready, 1) << "no progress output within a minute";
    ASSERT_EQ(sent, 0);
    const int status = child.wait();
    EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == signal_number) << status << "\n" << text;
    EXPECT_NE(text.find("interrupted: removed the outputs it had not finished"), std::string::npos) << text;
    EXPECT_EQ(text.find(std::to_string(kTensors) + "/" + std::to_string(kTensors)), std::string::npos)
        << text;
    EXPECT_FALSE(std::filesystem::exists(out));
  }
  std::filesystem::remove_all(model);
}

TEST(CliCheckpoint, BenchPrintsBaselines) {
  const Result r = run_cli("bench --size 256 --gemm-size 128 --repeats 1");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("memcpy"), std::string::npos);
  EXPECT_NE(r.output.find("sgemm"), std::string::npos);
  EXPECT_NE(r.output.find("nvfp4"), std::string::npos);
}

}  // namespace
}  // namespace microscale
