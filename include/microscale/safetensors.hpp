// microscale/safetensors.hpp — reading and writing safetensors files.
//
// Format (https://github.com/huggingface/safetensors): 8-byte little-endian header length N, N
// bytes of JSON {name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {str: str}},
// then the data buffer. The reader maps the file and checks every offset, size, dtype and shape,
// so a truncated or hostile file is a microscale::Error, never a crash or an out-of-bounds read.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "microscale/tensor.hpp"

namespace microscale {

/// @brief One tensor of a safetensors file; `data` points into the file's mapping.
struct SafetensorsEntry {
  std::string name;
  std::string dtype;  ///< as written in the file: "F32", "BF16", "U8", "F8_E4M3", ...
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;
  size_t nbytes = 0;
};

/// @brief Bits per element of a safetensors dtype string (4 for F4, 6 for F6_*, 8 for F8_* and U8,
/// ...); throws for unknown dtypes.
size_t safetensors_dtype_bits(std::string_view dtype);
/// @brief Bytes of `numel` elements of `dtype`; throws when they do not fill whole bytes. (Shapes in
/// a safetensors header count logical elements, also for the sub-byte F4/F6 dtypes.)
size_t safetensors_nbytes(std::string_view dtype, uint64_t numel);
/// @brief The DType of "F32"/"BF16"/"F16"/"U8", or nullopt for other safetensors dtypes.
std::optional<DType> safetensors_to_dtype(std::string_view dtype);
std::string_view dtype_to_safetensors(DType dtype);

/// @brief A parsed, validated safetensors file (memory-mapped, or an owned byte buffer).
class SafetensorsFile {
 public:
  /// @brief Maps and parses the file at `path`.
  static SafetensorsFile open(const std::string& path);
  /// @brief Parses an in-memory file (takes ownership of the bytes).
  static SafetensorsFile from_bytes(std::vector<std::byte> bytes);

  /// @brief Tensors in file order (by data offset).
  const std::vector<SafetensorsEntry>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(std::string_view name) const;
  /// @brief Throws microscale::Error naming the tensor when it is absent.
  const SafetensorsEntry& at(std::string_view name) const;
  /// @brief A TensorView of an F32/BF16/F16/U8 tensor (throws for other dtypes).
  TensorView view(std::string_view name) const;

 private:
  void parse(const std::string& origin);
  std::shared_ptr<const void> owner_;  // the mapping or the byte buffer
  const std::byte* bytes_ = nullptr;
  size_t size_ = 0;
  std::vector<SafetensorsEntry> tensors_;
  std::map<std::string, size_t, std::less<>> by_name_;  // index into tensors_
  std::map<std::string, std::string> metadata_;
};

/// @brief A tensor to write: raw little-endian bytes with a safetensors dtype string.
struct SafetensorsTensor {
  std::string name;
  std::string dtype;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
};

/// @brief Writes tensors (in the given order) and string metadata to `path`; checks each size.
void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace microscale
