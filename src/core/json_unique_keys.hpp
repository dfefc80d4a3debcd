#pragma once
// JSON text parsed with every object's keys distinct: nlohmann's parser keeps the last of two
// equal keys in an object, which for a file header or an index means silently choosing between
// two entries of one name. The readers of safetensors headers and checkpoint indexes refuse those.
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace microscale {

/// nlohmann::json::parse of [begin, end) (throws nlohmann::json::exception on bad JSON), and in
/// *duplicate_key the first key found twice in one object ("" when none).
inline nlohmann::json parse_json_unique_keys(const char* begin, const char* end, std::string* duplicate_key) {
  using json = nlohmann::json;
  duplicate_key->clear();
  std::vector<std::set<std::string>> open_objects;  // the keys seen so far in each open object
  const json::parser_callback_t track_keys = [&](int, json::parse_event_t event, json& parsed) {
    if (event == json::parse_event_t::object_start) {
      open_objects.emplace_back();
    } else if (event == json::parse_event_t::object_end) {
      open_objects.pop_back();
    } else if (event == json::parse_event_t::key &&
               !open_objects.back().insert(parsed.get<std::string>()).second && duplicate_key->empty()) {
      *duplicate_key = parsed.get<std::string>();
    }
    return true;
  };
  return json::parse(begin, end, track_keys);
}

}  // namespace microscale
