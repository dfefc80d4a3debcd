// safetensors reader (mmap, bounds-checked) and writer.
#include "microscale/safetensors.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstring>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "json_unique_keys.hpp"
#include "microscale/error.hpp"
#include "microscale/output_file.hpp"
#include "safetensors_header.hpp"

namespace microscale {
namespace {

using json = nlohmann::json;

// A header larger than this is refused before parsing (the reference implementation's
// MAX_HEADER_SIZE).
constexpr uint64_t kMaxHeaderBytes = 100'000'000;

struct DtypeRow {
  std::string_view name;
  size_t bits;
};
// Every dtype of the safetensors format (Rust enum order); F4 and F6 are sub-byte, so a tensor's
// byte size is numel * bits / 8 and must be whole.
constexpr std::array<DtypeRow, 22> kDtypes = {{
    {"BOOL", 8},    {"F4", 4},      {"F6_E2M3", 6}, {"F6_E3M2", 6},     {"U8", 8},          {"I8", 8},
    {"F8_E5M2", 8}, {"F8_E4M3", 8}, {"F8_E8M0", 8}, {"F8_E4M3FNUZ", 8}, {"F8_E5M2FNUZ", 8}, {"I16", 16},
    {"U16", 16},    {"F16", 16},    {"BF16", 16},   {"I32", 32},        {"U32", 32},        {"F32", 32},
    {"C64", 64},    {"F64", 64},    {"I64", 64},    {"U64", 64},
}};

std::string describe(const std::string& origin) { return origin.empty() ? "safetensors data" : origin; }

}  // namespace

std::string safetensors_file_start(const nlohmann::json& header) {
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception&) {  // the format's JSON is UTF-8
    throw Error("tensor names and metadata of a safetensors file must be valid UTF-8");
  }
  text.append((8 - text.size() % 8) % 8, ' ');  // the data buffer starts 8-byte aligned
  std::string start(8, '\0');                   // the header's length, u64 little-endian
  for (int i = 0; i < 8; ++i)
    start[i] = static_cast<char>((static_cast<uint64_t>(text.size()) >> (8 * i)) & 0xFF);
  return start + text;
}

size_t safetensors_dtype_bits(std::string_view dtype) {
  for (const DtypeRow& row : kDtypes) {
    if (row.name == dtype) return row.bits;
  }
  throw Error("unknown safetensors dtype '" + std::string(dtype) + "'");
}

size_t safetensors_nbytes(std::string_view dtype, uint64_t numel) {
  const size_t bits = safetensors_dtype_bits(dtype);
  if (numel > std::numeric_limits<uint64_t>::max() / bits) throw Error("tensor too large");
  if (numel * bits % 8 != 0) {
    throw Error(std::to_string(numel) + " elements of " + std::string(dtype) + " do not fill whole bytes");
  }
  return static_cast<size_t>(numel * bits / 8);
}

std::optional<DType> safetensors_to_dtype(std::string_view dtype) {
  if (dtype == "F32") return DType::F32;
  if (dtype == "BF16") return DType::BF16;
  if (dtype == "F16") return DType::F16;
  if (dtype == "U8") return DType::U8;
  return std::nullopt;
}

std::string_view dtype_to_safetensors(DType dtype) {
  switch (dtype) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::U8: return "U8";
  }
  throw Error("unknown dtype id " + std::to_string(static_cast<int>(dtype)));
}

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  // O_NONBLOCK: a FIFO opens at once (and is refused below) instead of waiting for a writer.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) throw Error("cannot open '" + path + "': " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error("'" + path + "' is not a regular file");
  }
  SafetensorsFile file;
  file.size_ = static_cast<size_t>(st.st_size);
  if (file.size_ == 0) {
    ::close(fd);
    throw Error("'" + path + "' is empty, not a safetensors file");
  }
  void* mapping = ::mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapping == MAP_FAILED) throw Error("cannot map '" + path + "': " + std::strerror(errno));
  const size_t size = file.size_;
  file.owner_ =
      std::shared_ptr<const void>(mapping, [size](const void* p) { ::munmap(const_cast<void*>(p), size); });
  file.bytes_ = static_cast<const std::byte*>(mapping);
  file.parse(path);
  return file;
}

SafetensorsFile SafetensorsFile::from_bytes(std::vector<std::byte> bytes) {
  auto owned = std::make_shared<std::vector<std::byte>>(std::move(bytes));
  SafetensorsFile file;
  file.bytes_ = owned->data();
  file.size_ = owned->size();
  file.owner_ = owned;
  file.parse("");
  return file;
}

void SafetensorsFile::parse(const std::string& origin) {
  const std::string where = describe(origin);
  if (size_ < 8)
    throw Error(where + ": too short for a safetensors header (" + std::to_string(size_) + " bytes)");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes_[i]);
  if (header_len > kMaxHeaderBytes)
    throw Error(where + ": header length " + std::to_string(header_len) + " is too large");
  if (header_len > size_ - 8) {
    throw Error(where + ": header length " + std::to_string(header_len) + " runs past the end of the file (" +
                std::to_string(size_) + " bytes): truncated?");
  }
  const auto* header_begin = reinterpret_cast<const char*>(bytes_ + 8);
  json header;
  std::string duplicate_key;
  try {
    header = parse_json_unique_keys(header_begin, header_begin + header_len, &duplicate_key);
  } catch (const json::exception& e) {
    throw Error(where + ": header is not valid JSON (" + e.what() + ")");
  }
  if (!duplicate_key.empty())
    throw Error(where + ": header names '" + duplicate_key + "' twice in one object");
  if (!header.is_object()) throw Error(where + ": header is not a JSON object");
  const std::byte* data = bytes_ + 8 + header_len;
  const uint64_t data_size = size_ - 8 - header_len;

  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& name = it.key();
    const json& value = it.value();
    if (name == "__metadata__") {
      if (!value.is_object()) throw Error(where + ": __metadata__ must be an object of strings");
      for (auto m = value.begin(); m != value.end(); ++m) {
        if (!m.value().is_string())
          throw Error(where + ": __metadata__ value '" + m.key() + "' is not a string");
        metadata_[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string context = where + ": tensor '" + name + "'";
    if (!value.is_object()) throw Error(context + " is not an object");
    if (!value.contains("dtype") || !value["dtype"].is_string())
      throw Error(context + " has no string dtype");
    if (!value.contains("shape") || !value["shape"].is_array()) throw Error(context + " has no shape array");
    if (!value.contains("data_offsets") || !value["data_offsets"].is_array() ||
        value["data_offsets"].size() != 2) {
      throw Error(context + " needs data_offsets [begin, end]");
    }
    SafetensorsEntry entry;
    entry.name = name;
    entry.dtype = value["dtype"].get<std::string>();
    size_t element_bits = 0;
    try {
      element_bits = safetensors_dtype_bits(entry.dtype);
    } catch (const Error&) {
      throw Error(context + " has unknown dtype '" + entry.dtype + "'");
    }
    uint64_t numel = 1;
    for (const json& d : value["shape"]) {
      if (!d.is_number_unsigned())
        throw Error(context + " has a shape entry that is not a non-negative integer");
      const uint64_t dim = d.get<uint64_t>();
      if (dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          (dim != 0 && numel > std::numeric_limits<uint64_t>::max() / dim)) {
        throw Error(context + " has a shape too large");
      }
      numel *= dim;
      entry.shape.push_back(static_cast<int64_t>(dim));
    }
    const json& offsets = value["data_offsets"];
    if (!offsets[0].is_number_unsigned() || !offsets[1].is_number_unsigned()) {
      throw Error(context + " has data_offsets that are not non-negative integers");
    }
    const uint64_t begin = offsets[0].get<uint64_t>(), end = offsets[1].get<uint64_t>();
    if (begin > end || end > data_size) {
      throw Error(context + " has data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                  "] outside the data buffer of " + std::to_string(data_size) +
                  " bytes: truncated or corrupt");
    }
    // (the header counts logical elements; sub-byte dtypes must fill whole bytes)
    if (numel > std::numeric_limits<uint64_t>::max() / element_bits || numel * element_bits % 8 != 0 ||
        numel * element_bits / 8 != end - begin) {
      throw Error(context + " has " + std::to_string(end - begin) + " bytes but its dtype and shape need " +
                  std::to_string(numel) + " x " + std::to_string(element_bits) + " bits");
    }
    entry.data = data + begin;
    entry.nbytes = static_cast<size_t>(end - begin);
    tensors_.push_back(std::move(entry));
  }
  // The tensors tile the data buffer exactly, as the format requires: no overlap, no byte that
  // belongs to no tensor (what a second file hidden in the buffer would need). Sorted by
  // [begin, end), so that a zero-size tensor comes before the one starting where it sits.
  std::sort(tensors_.begin(), tensors_.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.data != b.data ? a.data < b.data : a.nbytes < b.nbytes;
  });
  const std::byte* covered_to = data;  // the end of the tensors so far
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const SafetensorsEntry& t = tensors_[i];
    if (t.data < covered_to) {
      throw Error(where + ": tensors '" + tensors_[i - 1].name + "' and '" + t.name + "' overlap");
    }
    if (t.data > covered_to) {
      throw Error(where + ": data bytes [" + std::to_string(covered_to - data) + ", " +
                  std::to_string(t.data - data) + ") before tensor '" + t.name +
                  "' belong to no tensor (the tensors must tile the data buffer)");
    }
    covered_to = t.data + t.nbytes;
  }
  if (covered_to != data + data_size) {
    throw Error(where + ": the last " + std::to_string(data + data_size - covered_to) +
                " bytes of the data buffer belong to no tensor (the tensors must tile it)");
  }
  for (size_t i = 0; i < tensors_.size(); ++i) by_name_.emplace(tensors_[i].name, i);
}

bool SafetensorsFile::contains(std::string_view name) const { return by_name_.find(name) != by_name_.end(); }

const SafetensorsEntry& SafetensorsFile::at(std::string_view name) const {
  const auto it = by_name_.find(name);
  if (it == by_name_.end())
    throw Error("no tensor named '" + std::string(name) + "' in the safetensors file");
  return tensors_[it->second];
}

TensorView SafetensorsFile::view(std::string_view name) const {
  const SafetensorsEntry& e = at(name);
  const std::optional<DType> dtype = safetensors_to_dtype(e.dtype);
  if (!dtype) throw Error("tensor '" + e.name + "' has dtype " + e.dtype + ", not F32/BF16/F16/U8");
  return TensorView::from_buffer(e.data, e.nbytes, *dtype, e.shape);
}

void write_safetensors(const std::string& path, const std::vector<SafetensorsTensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const SafetensorsTensor& t : tensors) {
    if (t.name == "__metadata__" || header.contains(t.name))
      throw Error("duplicate or reserved tensor name '" + t.name + "'");
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d < 0) throw Error("tensor '" + t.name + "' has a negative dimension");
      if (d != 0 && numel > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d)) {
        throw Error("tensor '" + t.name + "' has a shape too large");
      }
      numel *= static_cast<uint64_t>(d);
    }
    if (safetensors_nbytes(t.dtype, numel) != t.nbytes) {
      throw Error("tensor '" + t.name + "': " + std::to_string(t.nbytes) + " bytes do not match " + t.dtype +
                  " " + shape_string(t.shape));
    }
    if (t.data == nullptr && t.nbytes > 0) throw Error("tensor '" + t.name + "' has a null data pointer");
    header[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.nbytes}}};
    offset += t.nbytes;
  }
  const std::string start = safetensors_file_start(header);
  OutputFile out(path);
  out.write(start);
  for (const SafetensorsTensor& t : tensors) out.write(t.data, t.nbytes);
  out.commit();
}

}  // namespace microscale
