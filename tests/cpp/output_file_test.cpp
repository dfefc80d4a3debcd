// OutputFile: a file appears under its name only when complete; failures are errors.
#include "microscale/output_file.hpp"

#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <csignal>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "microscale/error.hpp"
#include "microscale/safetensors.hpp"
#include "temp_path.hpp"

namespace microscale {
namespace {

namespace fs = std::filesystem;

std::string read_all(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Files of `dir` other than `keep`.
int other_files(const fs::path& dir, const fs::path& keep) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(dir)) n += e.path() != keep;
  return n;
}

TEST(OutputFile, AppearsOnlyWhenCommitted) {
  const fs::path dir = testing_paths::temp_path("dir");
  fs::remove_all(dir);
  fs::create_directories(dir);
  const fs::path path = dir / "out.txt";
  {
    OutputFile f(path.string());
    f.write("partial");
    EXPECT_FALSE(fs::exists(path));  // still under its temporary name
  }                                  // destroyed without commit: discarded
  EXPECT_FALSE(fs::exists(path));
  EXPECT_EQ(other_files(dir, path), 0);  // no temporary file left behind
  {
    OutputFile f(path.string());
    f.write("whole");
    f.commit();
  }
  EXPECT_EQ(read_all(path), "whole");
  // A failed rewrite leaves the earlier file as it was.
  {
    OutputFile f(path.string());
    f.write("half of a new version");
  }
  EXPECT_EQ(read_all(path), "whole");
  write_text_file(path.string(), "replaced");
  EXPECT_EQ(read_all(path), "replaced");
  EXPECT_EQ(other_files(dir, path), 0);
}

TEST(OutputFile, ReplacesAFileThatIsStillMapped) {
  // The input of a conversion stays mapped while the output is written; writing onto the same
  // path must not truncate the bytes under the mapping (that is a SIGBUS on the next read).
  const fs::path path = testing_paths::temp_path("mapped.safetensors");
  const std::vector<float> a = {1, 2, 3, 4};
  write_safetensors(path.string(), {{"a", "F32", {4}, a.data(), 16}});
  const SafetensorsFile mapped = SafetensorsFile::open(path.string());
  write_safetensors(path.string(), {{"b", "F32", {2}, a.data(), 8}});
  EXPECT_EQ(reinterpret_cast<const float*>(mapped.at("a").data)[3], 4.0f);  // the old bytes, intact
  EXPECT_TRUE(SafetensorsFile::open(path.string()).contains("b"));
}

TEST(OutputFile, AFullDiskIsAnError) {
  // A file size limit stands in for a full disk: write() stops at it with EFBIG (SIGXFSZ ignored).
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  if (old.rlim_max != RLIM_INFINITY && old.rlim_max < 4096)
    GTEST_SKIP() << "file size hard limit below 4 KiB";
  const auto previous = std::signal(SIGXFSZ, SIG_IGN);
  rlimit small = old;
  small.rlim_cur = 4096;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  const fs::path path = testing_paths::temp_path("limited.bin");
  std::string what;
  try {
    OutputFile f(path.string());
    const std::vector<char> bytes(8192, 'x');
    f.write(bytes.data(), bytes.size());
    f.commit();
  } catch (const Error& e) {
    what = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &old);
  std::signal(SIGXFSZ, previous);
  EXPECT_NE(what.find("error while writing"), std::string::npos) << what;
  EXPECT_FALSE(fs::exists(path));
  for (const auto& e : fs::directory_iterator(path.parent_path())) {  // nor its temporary file
    EXPECT_NE(e.path().filename().string().rfind("." + path.filename().string(), 0), 0u) << e.path();
  }
}

TEST(OutputFile, ErrorsNameThePath) {
  const fs::path dir = testing_paths::temp_path("a_directory");
  fs::create_directories(dir);
  EXPECT_THROW(OutputFile(dir.string()), Error);                      // not a regular file
  EXPECT_THROW(OutputFile("/nonexistent_dir/x.safetensors"), Error);  // cannot create
  if (fs::exists("/dev/full")) {
    try {
      write_text_file("/dev/full", "x");
      ADD_FAILURE() << "writing onto /dev/full did not throw";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("/dev/full"), std::string::npos) << e.what();
    }
  }
}

// What a signal handler calls before the process ends: the temporary file goes, a committed file
// stays, and the OutputFile destroyed after it (were the process to go on) removes nothing else.
TEST(OutputFile, RemoveUnfinishedOutputsTakesTheTemporaryFileOnly) {
  const fs::path dir = testing_paths::temp_path("unfinished");
  fs::remove_all(dir);
  fs::create_directories(dir);
  write_text_file((dir / "done.txt").string(), "finished");
  {
    OutputFile f((dir / "out.txt").string());
    f.write("half");
    EXPECT_EQ(other_files(dir, dir / "done.txt"), 1);  // the temporary file
    EXPECT_EQ(remove_unfinished_outputs(), 1);
    EXPECT_EQ(other_files(dir, dir / "done.txt"), 0);
    EXPECT_EQ(remove_unfinished_outputs(), 0);  // already gone
  }
  EXPECT_EQ(read_all(dir / "done.txt"), "finished");
  EXPECT_EQ(other_files(dir, dir / "done.txt"), 0);
  // Later files are written and removed as before.
  {
    OutputFile f((dir / "out.txt").string());
    f.write("whole");
    f.commit();
  }
  EXPECT_EQ(remove_unfinished_outputs(), 0);
  EXPECT_EQ(read_all(dir / "out.txt"), "whole");
}

}  // namespace
}  // namespace microscale
