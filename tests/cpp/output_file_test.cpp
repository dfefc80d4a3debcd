// OutputFile: a file appears under its name only when complete; failures are errors.
#include "microscale/output_file.hpp"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
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

// Temporary files of a destination whose writer died (SIGKILL leaves them) go when the next
// OutputFile of that destination starts; those of a live writer (locked), those modified in the
// last minute and other names stay.
TEST(OutputFile, RemovesTheTemporaryFilesOfADeadWriter) {
  const fs::path dir = testing_paths::temp_path("abandoned");
  fs::remove_all(dir);
  fs::create_directories(dir);
  {
    std::ofstream(dir / "probe") << "";
    const int fd = ::open((dir / "probe").c_str(), O_RDONLY);
    const bool locks = fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) == 0;
    if (fd >= 0) ::close(fd);
    fs::remove(dir / "probe");
    if (!locks) GTEST_SKIP() << "no flock on " << dir;
  }
  const auto make = [&](const std::string& name, bool old) {
    std::ofstream(dir / name) << "left";
    if (old) fs::last_write_time(dir / name, fs::last_write_time(dir / name) - std::chrono::minutes(2));
  };
  const std::string dead = ".out.txt.0123456789ab";
  make(dead, true);
  const std::vector<std::string> kept = {
      ".out.txt.fedcba987654",    // modified just now: its writer may be between open and flock
      ".other.txt.0123456789ab",  // another destination's
      ".out.txt.0123",            // not a temporary name: too short
      ".out.txt.0123456789AB",    // nor: upper case
      "out.txt.0123456789ab",     // nor: not hidden
  };
  for (const std::string& name : kept) make(name, name != kept[0]);
  OutputFile live((dir / "out.txt").string());  // the live writer: it removes the dead one's file
  EXPECT_FALSE(fs::exists(dir / dead));
  std::string live_name;  // its own temporary file, made to look old
  for (const auto& e : fs::directory_iterator(dir)) {
    const std::string name = e.path().filename().string();
    if (name != dead && std::find(kept.begin(), kept.end(), name) == kept.end()) live_name = name;
  }
  ASSERT_FALSE(live_name.empty());
  fs::last_write_time(dir / live_name, fs::last_write_time(dir / live_name) - std::chrono::minutes(2));
  {
    OutputFile second((dir / "out.txt").string());  // does not take the live writer's file
    second.write("second");
  }
  EXPECT_TRUE(fs::exists(dir / live_name));
  live.write("live");
  live.commit();
  EXPECT_EQ(read_all(dir / "out.txt"), "live");
  for (const std::string& name : kept) EXPECT_TRUE(fs::exists(dir / name)) << name;
  fs::remove_all(dir);
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
