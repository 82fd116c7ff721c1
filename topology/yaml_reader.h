// Strict typed reads from yaml-cpp nodes for the topology loaders (private to topology/).
// Invariant: every failure is a ConfigError that names the file, line, key and expected type;
// numbers are range-checked before use, so huge values never reach arithmetic.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>

#include <yaml-cpp/yaml.h>

#include "common/error.h"

namespace ferry::yaml {

class Reader {
 public:
  explicit Reader(std::string file) : file_(std::move(file)) {}

  const std::string& file() const { return file_; }

  // "FILE:LINE: what" for a node (line 1-based when the node has a mark).
  ConfigError error(const YAML::Node& at, const std::string& what, const std::string& hint) const;

  // Throws when `map` is not a map, has a key twice, or (check_keys) has a key outside `allowed`
  // (suggesting the nearest).
  void expect_map(const YAML::Node& map, std::string_view where) const;
  void check_keys(const YAML::Node& map, std::initializer_list<std::string_view> allowed,
                  std::string_view where) const;

  // An integer scalar (decimal or 0x hex) in [lo, hi].
  int64_t integer(const YAML::Node& node, std::string_view what, int64_t lo, int64_t hi) const;
  // A finite number in (lo, hi].
  double number(const YAML::Node& node, std::string_view what, double lo, double hi) const;
  // A finite number in [lo, hi], a range stated in `unit` ("GB/s") in the error: the range in
  // which ferry is tested.
  double number_in(const YAML::Node& node, std::string_view what, double lo, double hi,
                   std::string_view unit) const;
  // A link rate in GB/s per direction, in [kMinPlausibleLinkGbps, kMaxPlausibleLinkGbps].
  double link_gbps(const YAML::Node& node, std::string_view what) const;
  std::optional<double> opt_link_gbps(const YAML::Node& map, const char* key) const;
  std::string string(const YAML::Node& node, std::string_view what, size_t max_len = 256) const;
  bool boolean(const YAML::Node& node, std::string_view what) const;
  // A size such as "16GiB" or a plain byte count.
  uint64_t bytes(const YAML::Node& node, std::string_view what) const;

  // Optional map entries.
  std::optional<int64_t> opt_integer(const YAML::Node& map, const char* key, int64_t lo,
                                     int64_t hi) const;
  std::optional<double> opt_number(const YAML::Node& map, const char* key, double lo,
                                   double hi) const;

 private:
  std::string file_;
};

// Parses text into a document root, turning parser exceptions into ConfigError.
YAML::Node parse(const std::string& text, const std::string& file);

}  // namespace ferry::yaml
