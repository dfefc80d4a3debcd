// Checkpoint (single file, model.safetensors, or a sharded set with its index) and the streaming
// safetensors writer.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "json_unique_keys.hpp"
#include "microscale/checkpoint.hpp"
#include "microscale/error.hpp"
#include "microscale/output_file.hpp"
#include "safetensors_header.hpp"

namespace microscale {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string read_text(const fs::path& path) {
  std::error_code ec;  // a FIFO or device would block or never end: regular files only
  if (!fs::is_regular_file(path, ec)) throw Error("'" + path.string() + "' is not a regular file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("cannot read '" + path.string() + "'");
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

}  // namespace

Checkpoint Checkpoint::open(const std::string& path) {
  Checkpoint c;
  std::error_code ec;
  const fs::path p(path);
  std::vector<std::string> files;
  if (fs::is_regular_file(p, ec)) {
    c.directory_ = p.has_parent_path() ? p.parent_path().string() : ".";
    files.push_back(p.filename().string());
  } else if (fs::is_directory(p, ec)) {
    c.directory_ = p.string();
    const fs::path index = p / "model.safetensors.index.json";
    if (fs::exists(index, ec)) {
      json j;
      std::string duplicate_key;
      try {
        const std::string text = read_text(index);
        j = parse_json_unique_keys(text.data(), text.data() + text.size(), &duplicate_key);
      } catch (const json::exception& e) {
        throw Error("'" + index.string() + "' is not valid JSON: " + e.what());
      }
      // (a tensor named twice in weight_map could hide a shard that only the first entry lists)
      if (!duplicate_key.empty())
        throw Error("'" + index.string() + "' names '" + duplicate_key + "' twice in one object");
      if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object()) {
        throw Error("'" + index.string() + "' has no weight_map object");
      }
      for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
        if (!it.value().is_string())
          throw Error("'" + index.string() + "': weight_map values must be file names");
        const std::string file = it.value().get<std::string>();
        // A plain file name: no directory part, so no way out of the checkpoint's directory (and
        // no NUL, at which the operating system would cut the name short).
        if (file.empty() || file == "." || file == ".." || file.find('/') != std::string::npos ||
            file.find('\\') != std::string::npos) {
          throw Error("'" + index.string() + "' names a shard outside the directory: '" + file + "'");
        }
        if (file.find('\0') != std::string::npos)
          throw Error("'" + index.string() + "' names a shard with a NUL character in its name");
        // NOTE: which shard each tensor is in is not checked against the index: loaders read
        // every tensor of the shards it lists, and the output's index is written from the shards.
        if (std::find(files.begin(), files.end(), file) == files.end()) files.push_back(file);
      }
      std::sort(files.begin(), files.end());
    } else if (fs::exists(p / "model.safetensors", ec)) {
      files.push_back("model.safetensors");
    } else {
      fs::directory_iterator it(p, ec);
      for (; !ec && it != fs::directory_iterator(); it.increment(ec)) {
        std::error_code type;
        if (it->is_regular_file(type) && it->path().extension() == ".safetensors")
          files.push_back(it->path().filename().string());
      }
      if (ec) throw Error("cannot list '" + path + "': " + ec.message());
      std::sort(files.begin(), files.end());
    }
    if (files.empty()) throw Error("no .safetensors file in '" + path + "'");
  } else {
    throw Error("'" + path + "' is neither a file nor a directory");
  }
  c.shards_.reserve(files.size());
  for (const std::string& f : files) {
    c.shards_.push_back(SafetensorsFile::open((fs::path(c.directory_) / f).string()));
    c.shard_names_.push_back(f);
  }
  for (size_t s = 0; s < c.shards_.size(); ++s) {
    for (const SafetensorsEntry& e : c.shards_[s].tensors()) {
      if (!c.by_name_.emplace(e.name, c.entries_.size()).second) {
        throw Error("tensor '" + e.name + "' appears in more than one shard of '" + path + "'");
      }
      c.entries_.push_back({&e, s});
    }
  }
  const fs::path config = fs::path(c.directory_) / "config.json";
  if (fs::is_directory(p, ec) && fs::exists(config, ec)) c.config_json_ = read_text(config);
  return c;
}

const SafetensorsEntry& Checkpoint::at(const std::string& name) const {
  const auto it = by_name_.find(name);
  if (it == by_name_.end()) throw Error("no tensor named '" + name + "' in the checkpoint");
  return *entries_[it->second].tensor;
}

// ---- streaming writer -----------------------------------------------------------------------------------

struct SafetensorsStreamWriter::File {
  explicit File(const std::string& path) : out(path) {}
  OutputFile out;  // in place at finish(); discarded if the writer is destroyed before
};

SafetensorsStreamWriter::SafetensorsStreamWriter() = default;
SafetensorsStreamWriter::~SafetensorsStreamWriter() = default;

void SafetensorsStreamWriter::declare(const std::string& name, const std::string& dtype,
                                      const std::vector<int64_t>& shape) {
  if (file_) throw Error("declare every tensor before begin()");
  uint64_t numel = 1;
  for (int64_t d : shape) {
    if (d < 0) throw Error("tensor '" + name + "' has a negative dimension");
    if (d != 0 && numel > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(d)) {
      throw Error("tensor '" + name + "' is too large");
    }
    numel *= static_cast<uint64_t>(d);
  }
  for (const Declared& d : declared_) {
    if (d.name == name) throw Error("tensor '" + name + "' declared twice");
  }
  declared_.push_back({name, dtype, shape, safetensors_nbytes(dtype, numel)});
}

void SafetensorsStreamWriter::begin(const std::string& path,
                                    const std::map<std::string, std::string>& metadata) {
  json header = json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (const Declared& d : declared_) {
    header[d.name] = {{"dtype", d.dtype}, {"shape", d.shape}, {"data_offsets", {offset, offset + d.nbytes}}};
    offset += d.nbytes;
  }
  const std::string start = safetensors_file_start(header);
  file_ = std::make_unique<File>(path);
  file_->out.write(start);
}

void SafetensorsStreamWriter::write(const std::string& name, const void* data, size_t nbytes) {
  if (!file_) throw Error("begin() the file before writing tensors");
  if (next_ >= declared_.size() || declared_[next_].name != name) {
    throw Error("tensor '" + name + "' written out of declaration order");
  }
  if (declared_[next_].nbytes != nbytes) {
    throw Error("tensor '" + name + "': " + std::to_string(nbytes) + " bytes written, " +
                std::to_string(declared_[next_].nbytes) + " declared");
  }
  file_->out.write(data, nbytes);
  ++next_;
}

void SafetensorsStreamWriter::finish() {
  if (!file_) throw Error("nothing to finish: begin() was not called");
  if (next_ != declared_.size()) {
    throw Error("'" + file_->out.path() + "': " + std::to_string(declared_.size() - next_) +
                " declared tensors not written");
  }
  file_->out.commit();
}

}  // namespace microscale
