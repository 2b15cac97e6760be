// The worker's --summary_json as the multi-process tests read it: parsed, and written back with
// ", " between elements and ": " after keys, in the writer's key order, so that an assertion
// ("[[750, 468]]", "{\"step\": 940, \"from\": \"ps\"") reads the same whatever spacing the
// writer's JSON library chose.
#pragma once

#include <fstream>
#include <sstream>
#include <string>

#include "nlohmann/json.hpp"

namespace pscluster::testing {

inline std::string Canonical(const nlohmann::ordered_json& v) {
  std::string out;
  if (v.is_array()) {
    for (const auto& e : v) out += (out.empty() ? "" : ", ") + Canonical(e);
    return "[" + out + "]";
  }
  if (v.is_object()) {
    for (const auto& [k, e] : v.items()) {
      out += (out.empty() ? "" : ", ") + nlohmann::ordered_json(k).dump() + ": " + Canonical(e);
    }
    return "{" + out + "}";
  }
  return v.dump();
}

// `text` written as Canonical does; text that is not JSON is returned as it is (so that a
// failing assertion shows what the worker wrote).
inline std::string CanonicalJson(const std::string& text) {
  const auto parsed = nlohmann::ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  return parsed.is_discarded() ? text : Canonical(parsed);
}

// A summary file, as CanonicalJson writes it ("" when it cannot be read).
inline std::string ReadSummary(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return CanonicalJson(s.str());
}

// The value of `key` in a summary's JSON text, as Canonical writes it ("" when the text is not
// a JSON object or has no such key).
inline std::string Field(const std::string& json, const std::string& key) {
  const auto parsed = nlohmann::ordered_json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object() || !parsed.contains(key)) return "";
  return Canonical(parsed[key]);
}

}  // namespace pscluster::testing
