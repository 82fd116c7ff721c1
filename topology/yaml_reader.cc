// Strict YAML scalar reads with file:line errors. Integers are parsed by hand (decimal or 0x
// hex, with overflow detection) rather than by yaml-cpp's stream conversion.
#include "topology/yaml_reader.h"

#include <charconv>
#include <cmath>
#include <map>
#include <vector>

#include <fmt/format.h>

#include "common/bytes.h"
#include "common/strings.h"
#include "topology/pci.h"

namespace ferry::yaml {

namespace {

const char* type_name(const YAML::Node& n) {
  switch (n.Type()) {
    case YAML::NodeType::Null:
      return "nothing";
    case YAML::NodeType::Scalar:
      return "a scalar";
    case YAML::NodeType::Sequence:
      return "a list";
    case YAML::NodeType::Map:
      return "a map";
    default:
      return "an undefined value";
  }
}

}  // namespace

ConfigError Reader::error(const YAML::Node& at, const std::string& what,
                          const std::string& hint) const {
  const YAML::Mark mark = at.IsDefined() ? at.Mark() : YAML::Mark::null_mark();
  if (mark.is_null()) return ConfigError(fmt::format("{}: {}", file_, what), hint);
  return ConfigError(fmt::format("{}:{}: {}", file_, mark.line + 1, what), hint);
}

void Reader::expect_map(const YAML::Node& map, std::string_view where) const {
  if (!map.IsMap()) {
    throw error(map, fmt::format("{} must be a map, got {}", where, type_name(map)),
                "write it as `key: value` lines");
  }
  // yaml-cpp keeps both entries of a repeated key and reads the first: say so rather than let
  // the second be silently ignored.
  std::map<std::string, YAML::Mark> seen;
  for (const auto& kv : map) {
    if (!kv.first.IsScalar()) continue;
    const auto [first, inserted] = seen.emplace(kv.first.Scalar(), kv.first.Mark());
    if (!inserted) {
      throw error(kv.first,
                  fmt::format("{}: duplicate key '{}'{}", where, kv.first.Scalar(),
                              first->second.is_null() ? std::string()
                                                      : fmt::format(" (first given at line {})",
                                                                    first->second.line + 1)),
                  "give each key once");
    }
  }
}

void Reader::check_keys(const YAML::Node& map, std::initializer_list<std::string_view> allowed,
                        std::string_view where) const {
  expect_map(map, where);
  std::vector<std::string> names(allowed.begin(), allowed.end());
  for (const auto& kv : map) {
    if (!kv.first.IsScalar()) {
      throw error(kv.first, fmt::format("{}: keys must be names", where), "use plain keys");
    }
    const std::string key = kv.first.Scalar();
    bool ok = false;
    for (auto a : allowed) ok = ok || key == a;
    if (!ok) {
      const std::string near = nearest(key, names);
      throw error(kv.first, fmt::format("{}: unknown key '{}'", where, key),
                  near.empty() ? fmt::format("known keys: {}", join(names, ", "))
                               : fmt::format("did you mean '{}'?", near));
    }
  }
}

int64_t Reader::integer(const YAML::Node& node, std::string_view what, int64_t lo,
                        int64_t hi) const {
  if (!node.IsScalar()) {
    throw error(node, fmt::format("{} must be an integer, got {}", what, type_name(node)),
                fmt::format("write an integer from {} to {}", lo, hi));
  }
  std::string_view s = node.Scalar();
  const bool negative = !s.empty() && s.front() == '-';
  if (negative || (!s.empty() && s.front() == '+')) s.remove_prefix(1);
  int base = 10;
  if (s.size() > 2 && s[0] == '0' && (s[1] == 'x' || s[1] == 'X')) {
    base = 16;
    s.remove_prefix(2);
  }
  uint64_t magnitude = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), magnitude, base);
  const bool parsed = !s.empty() && ptr == s.data() + s.size();
  if (!parsed && ec != std::errc::result_out_of_range) {
    throw error(node, fmt::format("{} must be an integer, got '{}'", what, node.Scalar()),
                fmt::format("write an integer from {} to {}", lo, hi));
  }
  const bool fits = ec == std::errc() && magnitude <= static_cast<uint64_t>(INT64_MAX);
  const int64_t value =
      fits ? (negative ? -static_cast<int64_t>(magnitude) : static_cast<int64_t>(magnitude)) : 0;
  if (!fits || value < lo || value > hi) {
    throw error(node, fmt::format("{} {} is out of range", what, node.Scalar()),
                fmt::format("write an integer from {} to {}", lo, hi));
  }
  return value;
}

double Reader::number(const YAML::Node& node, std::string_view what, double lo, double hi) const {
  if (!node.IsScalar()) {
    throw error(node, fmt::format("{} must be a number, got {}", what, type_name(node)),
                fmt::format("write a number above {} and at most {}", lo, hi));
  }
  const std::string& s = node.Scalar();
  double v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ptr != s.data() + s.size() ||
      (ec != std::errc() && ec != std::errc::result_out_of_range)) {
    throw error(node, fmt::format("{} must be a number, got '{}'", what, s),
                fmt::format("write a number above {} and at most {}", lo, hi));
  }
  if (ec == std::errc::result_out_of_range || !std::isfinite(v) || !(v > lo) || !(v <= hi)) {
    throw error(node, fmt::format("{} {} is out of range", what, s),
                fmt::format("write a number above {} and at most {}", lo, hi));
  }
  return v;
}

double Reader::number_in(const YAML::Node& node, std::string_view what, double lo, double hi,
                         std::string_view unit) const {
  const std::string range =
      unit.empty() ? fmt::format("[{}, {}]", lo, hi) : fmt::format("[{}, {}] {}", lo, hi, unit);
  const std::string hint =
      fmt::format("ferry is tested with {} in {}; write a number in that range", what, range);
  if (!node.IsScalar()) {
    throw error(
        node, fmt::format("{} must be a number in {}, got {}", what, range, type_name(node)), hint);
  }
  const std::string& s = node.Scalar();
  double v = 0;
  const auto [ptr, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || ptr != s.data() + s.size() ||
      (ec != std::errc() && ec != std::errc::result_out_of_range)) {
    throw error(node, fmt::format("{} must be a number in {}, got '{}'", what, range, s), hint);
  }
  if (ec == std::errc::result_out_of_range || !std::isfinite(v) || !(v >= lo) || !(v <= hi)) {
    throw error(node, fmt::format("{} must be in {}, got {}", what, range, s), hint);
  }
  return v;
}

double Reader::link_gbps(const YAML::Node& node, std::string_view what) const {
  return number_in(node, what, kMinPlausibleLinkGbps, kMaxPlausibleLinkGbps, "GB/s");
}

std::optional<double> Reader::opt_link_gbps(const YAML::Node& map, const char* key) const {
  const YAML::Node n = map[key];
  if (!n) return std::nullopt;
  return link_gbps(n, fmt::format("'{}'", key));
}

std::string Reader::string(const YAML::Node& node, std::string_view what, size_t max_len) const {
  if (!node.IsScalar()) {
    throw error(node, fmt::format("{} must be a string, got {}", what, type_name(node)),
                "quote the text");
  }
  if (node.Scalar().size() > max_len) {
    throw error(node, fmt::format("{} is longer than {} characters", what, max_len), "shorten it");
  }
  return node.Scalar();
}

bool Reader::boolean(const YAML::Node& node, std::string_view what) const {
  if (node.IsScalar()) {
    const std::string& s = node.Scalar();
    if (s == "true") return true;
    if (s == "false") return false;
  }
  throw error(node, fmt::format("{} must be true or false", what), "write true or false");
}

uint64_t Reader::bytes(const YAML::Node& node, std::string_view what) const {
  if (node.IsScalar()) {
    if (auto b = parse_bytes(node.Scalar())) return *b;
  }
  throw error(node, fmt::format("{} must be a size such as 64GiB", what),
              "write an integer byte count or a number with B, KiB, MiB, GiB or TiB");
}

std::optional<int64_t> Reader::opt_integer(const YAML::Node& map, const char* key, int64_t lo,
                                           int64_t hi) const {
  const YAML::Node n = map[key];
  if (!n.IsDefined() || n.IsNull()) return std::nullopt;
  return integer(n, fmt::format("'{}'", key), lo, hi);
}

std::optional<double> Reader::opt_number(const YAML::Node& map, const char* key, double lo,
                                         double hi) const {
  const YAML::Node n = map[key];
  if (!n.IsDefined() || n.IsNull()) return std::nullopt;
  return number(n, fmt::format("'{}'", key), lo, hi);
}

YAML::Node parse(const std::string& text, const std::string& file) {
  try {
    return YAML::Load(text);
  } catch (const YAML::Exception& e) {
    throw ConfigError(fmt::format("{}:{}: malformed YAML: {}", file, e.mark.line + 1, e.msg),
                      "fix the YAML syntax (indentation, colons, brackets)");
  }
}

}  // namespace ferry::yaml
