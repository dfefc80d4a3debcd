// Scratch paths for tests: unique per process and per test, so that ctest -j (one process per
// test) and two builds testing at once never share a file. (A file rewritten while another
// process has it mapped would SIGBUS that process: seen when two tests shared a name.)
#pragma once

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <string>

namespace microscale::testing_paths {

/// <tmp>/microscale_<pid>_<test suite>_<test name>_<name>
inline std::filesystem::path temp_path(const std::string& name) {
  const ::testing::TestInfo* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const std::string test = info ? std::string(info->test_suite_name()) + "_" + info->name() : "none";
  std::string file = "microscale_" + std::to_string(::getpid()) + "_" + test + "_" + name;
  for (char& c : file) {
    if (c == '/') c = '_';
  }
  return std::filesystem::temp_directory_path() / file;
}

}  // namespace microscale::testing_paths
