// libFuzzer target for reading a model directory as `microscale inspect` does: the index
// (model.safetensors.index.json), config.json and a shard, through Checkpoint::open and
// read_quantized_weights (every convention's names, shapes and scales). Any input either reads
// (and every dequantized value is touched, checked by AddressSanitizer) or is a microscale::Error.
//
// An input is three parts: [u16 LE n][n bytes: the index, absent when n = 0][u16 LE m][m bytes:
// config.json, absent when m = 0][the rest: the shard]. The shard is model-00001-of-00001.safetensors
// (which the seed indexes name) with an index, else model.safetensors. The files live in a
// directory of this process, rewritten for each input.
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>

#include "microscale/checkpoint.hpp"
#include "microscale/error.hpp"

namespace {

namespace fs = std::filesystem;

// The next part of the input: a u16 little-endian length and that many bytes (fewer at the end).
std::string_view take_part(const uint8_t*& data, size_t& size) {
  if (size < 2) {
    size = 0;
    return {};
  }
  size_t n = data[0] | (static_cast<size_t>(data[1]) << 8);
  data += 2;
  size -= 2;
  if (n > size) n = size;
  const std::string_view part(reinterpret_cast<const char*>(data), n);
  data += n;
  size -= n;
  return part;
}

// Writes `bytes` to `path`, or removes the file when `present` is false.
void put(const fs::path& path, std::string_view bytes, bool present) {
  std::error_code ec;
  fs::remove(path, ec);
  if (present)
    std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

// This process's directory, removed at exit.
struct ModelDir {
  fs::path path = fs::temp_directory_path() / ("microscale_checkpoint_fuzz_" + std::to_string(::getpid()));
  ModelDir() { fs::create_directories(path); }
  ~ModelDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

const fs::path& model_dir() {
  static const ModelDir dir;
  return dir.path;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view index = take_part(data, size);
  const std::string_view config = take_part(data, size);
  const std::string_view shard(reinterpret_cast<const char*>(data), size);
  const fs::path& dir = model_dir();
  put(dir / "model.safetensors.index.json", index, !index.empty());
  put(dir / "config.json", config, !config.empty());
  put(dir / "model-00001-of-00001.safetensors", shard, !index.empty());
  put(dir / "model.safetensors", shard, index.empty());
  try {
    const microscale::Checkpoint c = microscale::Checkpoint::open(dir.string());
    float sum = 0.0f;
    for (const microscale::DetectedWeight& w : microscale::read_quantized_weights(c)) {
      const float* v = w.values.data_as<float>();
      for (int64_t i = 0; i < w.values.numel(); ++i) sum += v[i];
    }
    (void)sum;
  } catch (const microscale::Error&) {
  }
  return 0;
}
