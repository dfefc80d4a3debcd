// The bytes that start a safetensors file, shared by the whole-file and the streaming writer.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

namespace microscale {

/// The header's length (u64 little-endian), then its JSON padded with spaces to a multiple of 8
/// bytes (the data buffer starts 8-byte aligned); microscale::Error when a name or metadata value
/// is not valid UTF-8.
std::string safetensors_file_start(const nlohmann::json& header);

}  // namespace microscale
