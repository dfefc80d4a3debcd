// safetensors: round trips, and truncated or hostile files are clear errors, never crashes.
#include "microscale/safetensors.hpp"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>

#include "microscale/error.hpp"
#include "temp_path.hpp"

namespace microscale {
namespace {

void benchmark_sink(uint8_t value) {
  static volatile uint8_t sink;
  sink = value;
  (void)sink;
}

std::string temp_path(const std::string& name) { return testing_paths::temp_path(name).string(); }

std::vector<std::byte> read_all(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::vector<char> chars((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::byte> bytes(chars.size());
  std::memcpy(bytes.data(), chars.data(), chars.size());
  return bytes;
}

// A file made of a raw header string and `data_bytes` zero bytes.
std::vector<std::byte> make_file(const std::string& header, size_t data_bytes) {
  std::vector<std::byte> bytes(8 + header.size() + data_bytes, std::byte{0});
  const uint64_t n = header.size();
  for (int i = 0; i < 8; ++i) bytes[i] = static_cast<std::byte>((n >> (8 * i)) & 0xFF);
  std::memcpy(bytes.data() + 8, header.data(), header.size());
  return bytes;
}

std::string written_file() {
  const std::string path = temp_path("roundtrip.safetensors");
  const std::vector<float> a = {1.0f, -2.0f, 3.5f, 0.25f, 8.0f, 9.0f};
  const std::vector<uint8_t> b = {1, 2, 3};
  write_safetensors(path, {{"a", "F32", {2, 3}, a.data(), 24}, {"b.scale", "U8", {3}, b.data(), 3}},
                    {{"format", "pt"}, {"note", "hello"}});
  return path;
}

TEST(Safetensors, RoundTrip) {
  const SafetensorsFile f = SafetensorsFile::open(written_file());
  ASSERT_EQ(f.tensors().size(), 2u);
  EXPECT_EQ(f.metadata().at("note"), "hello");
  const TensorView a = f.view("a");
  EXPECT_EQ(a.dtype, DType::F32);
  EXPECT_EQ(a.shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(static_cast<const float*>(a.data)[2], 3.5f);
  EXPECT_EQ(f.at("b.scale").nbytes, 3u);
  EXPECT_EQ(f.at("b.scale").dtype, "U8");
  EXPECT_TRUE(f.contains("a"));
  EXPECT_FALSE(f.contains("c"));
  EXPECT_THROW(f.at("c"), Error);
  // Header padded so the data starts 8-byte aligned.
  const std::vector<std::byte> bytes = read_all(written_file());
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ(n % 8, 0u);
}

TEST(Safetensors, EveryTruncationIsAnError) {
  const std::vector<std::byte> full = read_all(written_file());
  for (size_t len = 0; len < full.size(); ++len) {
    std::vector<std::byte> prefix(full.begin(), full.begin() + static_cast<std::ptrdiff_t>(len));
    EXPECT_THROW(SafetensorsFile::from_bytes(prefix), Error) << "prefix of " << len << " bytes";
  }
  EXPECT_NO_THROW(SafetensorsFile::from_bytes(full));
}

TEST(Safetensors, HostileHeaders) {
  const char* cases[] = {
      "not json",
      "[1, 2, 3]",
      R"({"a": 5})",
      R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 16]}})",   // past the end
      R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})",    // size mismatch
      R"({"a": {"dtype": "Q7", "shape": [2], "data_offsets": [0, 8]}})",     // unknown dtype
      R"({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})",   // negative dim
      R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}})",    // reversed
      R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0]}})",       // one offset
      R"({"a": {"dtype": "F32", "shape": 2, "data_offsets": [0, 8]}})",      // shape not array
      R"({"a": {"shape": [2], "data_offsets": [0, 8]}})",                    // no dtype
      R"({"a": {"dtype": "F32", "shape": [2.5], "data_offsets": [0, 8]}})",  // fractional dim
      R"({"a": {"dtype": "F32", "shape": [4611686018427387904, 4], "data_offsets": [0, 8]}})",  // overflow
      R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
          "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})",                      // overlap
      R"({"__metadata__": {"k": 1}})",  // non-string metadata
      R"({"__metadata__": [1]})",
      R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})",  // bytes 4-8 in no tensor
      R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",  // bytes 0-4 in no tensor
      R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
          "b": {"dtype": "U8", "shape": [2], "data_offsets": [6, 8]}})",   // a hole between
      // A name twice: nlohmann's parser would keep the second (and the reference reader would
      // then find bytes 0-4 in no tensor); a field twice.
      R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
          "a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}})",
      R"({"a": {"dtype": "F32", "dtype": "I32", "shape": [2], "data_offsets": [0, 8]}})",
  };
  for (const char* header : cases) {
    EXPECT_THROW(SafetensorsFile::from_bytes(make_file(header, 8)), Error) << header;
  }
  // Header length larger than the file, and absurdly large.
  std::vector<std::byte> bad = make_file("{}", 0);
  bad[0] = std::byte{0xFF};
  EXPECT_THROW(SafetensorsFile::from_bytes(bad), Error);
  bad[7] = std::byte{0xFF};
  EXPECT_THROW(SafetensorsFile::from_bytes(bad), Error);
  EXPECT_NO_THROW(SafetensorsFile::from_bytes(make_file("{}", 0)));
  // The tensors tile the buffer: zero-size ones anywhere in it; JSON whitespace around the header
  // (the reference reader takes it before and after: writers may pad to align the data).
  EXPECT_NO_THROW(SafetensorsFile::from_bytes(
      make_file(std::string("\t\n") + R"({"z": {"dtype": "F32", "shape": [0], "data_offsets": [4, 4]},
          "b": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]},
          "a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]},
          "e": {"dtype": "U8", "shape": [0], "data_offsets": [8, 8]}}   )",
                8)));
  try {
    SafetensorsFile::from_bytes(
        make_file(R"({"a": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}})", 8));
    ADD_FAILURE() << "a file with 4 bytes in no tensor was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the last 4 bytes of the data buffer belong to no tensor"),
              std::string::npos)
        << e.what();
  }
  try {
    SafetensorsFile::from_bytes(make_file(R"({"a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]},
          "a": {"dtype": "U8", "shape": [8], "data_offsets": [0, 8]}})",
                                          8));
    ADD_FAILURE() << "a header naming 'a' twice was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("names 'a' twice"), std::string::npos) << e.what();
  }
  // Sub-byte dtypes: the header counts elements, which must fill whole bytes.
  EXPECT_NO_THROW(SafetensorsFile::from_bytes(
      make_file(R"({"a": {"dtype": "F4", "shape": [2, 8], "data_offsets": [0, 8]}})", 8)));
  EXPECT_NO_THROW(SafetensorsFile::from_bytes(
      make_file(R"({"a": {"dtype": "F6_E2M3", "shape": [4], "data_offsets": [0, 3]}})", 3)));
  EXPECT_THROW(SafetensorsFile::from_bytes(
                   make_file(R"({"a": {"dtype": "F4", "shape": [3], "data_offsets": [0, 2]}})", 8)),
               Error);
  EXPECT_EQ(safetensors_nbytes("F8_E8M0", 5), 5u);
  EXPECT_THROW(safetensors_nbytes("F6_E3M2", 3), Error);
  // Viewing a dtype the quantizer cannot read.
  const SafetensorsFile f = SafetensorsFile::from_bytes(
      make_file(R"({"a": {"dtype": "I64", "shape": [1], "data_offsets": [0, 8]}})", 8));
  EXPECT_THROW(f.view("a"), Error);
}

TEST(Safetensors, FilesystemErrors) {
  EXPECT_THROW(SafetensorsFile::open(temp_path("does_not_exist.safetensors")), Error);
  EXPECT_THROW(SafetensorsFile::open(std::filesystem::temp_directory_path().string()), Error);
  const std::string empty = temp_path("empty.safetensors");
  std::ofstream(empty).close();
  EXPECT_THROW(SafetensorsFile::open(empty), Error);
  const std::vector<float> a(4);
  EXPECT_THROW(write_safetensors(temp_path("x.safetensors"), {{"a", "F32", {5}, a.data(), 16}}), Error);
  EXPECT_THROW(write_safetensors(temp_path("x.safetensors"),
                                 {{"a", "F32", {4}, a.data(), 16}, {"a", "F32", {4}, a.data(), 16}}),
               Error);
  EXPECT_THROW(write_safetensors("/nonexistent_dir/x.safetensors", {}), Error);
  // A FIFO is refused at once, not waited on for a writer that never comes.
  const std::string fifo = temp_path("fifo.safetensors");
  std::filesystem::remove(fifo);
  if (::mkfifo(fifo.c_str(), 0600) != 0) GTEST_SKIP() << "no FIFOs in the temporary directory";
  EXPECT_THROW(SafetensorsFile::open(fifo), Error);
}

// A small mutation fuzzer: random byte flips of a valid file parse or throw Error, nothing else.
// (The libFuzzer target of the checkpoint issue extends this.)
TEST(Safetensors, RandomMutationsNeverCrash) {
  const std::vector<std::byte> full = read_all(written_file());
  std::mt19937 rng(99);
  int parsed = 0, rejected = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::vector<std::byte> bytes = full;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int i = 0; i < flips; ++i) bytes[rng() % bytes.size()] = static_cast<std::byte>(rng() & 0xFF);
    try {
      const SafetensorsFile f = SafetensorsFile::from_bytes(bytes);
      for (const SafetensorsEntry& e : f.tensors()) {
        uint8_t sink = 0;
        for (size_t j = 0; j < e.nbytes; ++j)
          sink = static_cast<uint8_t>(sink ^ static_cast<uint8_t>(e.data[j]));
        benchmark_sink(sink);  // every byte read is in bounds (checked under ASan)
      }
      ++parsed;
    } catch (const Error&) {
      ++rejected;
    }
  }
  EXPECT_GT(rejected, 0);
  EXPECT_EQ(parsed + rejected, 3000);
}

}  // namespace
}  // namespace microscale
