// Internal: strict reading of one YAML value as a config type (bool, integer, real, size,
// string, lists) with ranges. Invariant: a reader returns a value inside its range or throws
// ValueError with a message of the forms in Note [Config error messages] (docs/config.md).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <yaml-cpp/yaml.h>

#include "trainer/config/schema.h"

namespace ferry::config_internal {

// A numeric interval; an absent bound is unbounded.
struct Range {
  std::optional<double> lo;
  std::optional<double> hi;
  bool lo_open = false;
  bool hi_open = false;

  bool contains(double value) const;
  // ">= 1", "> 0", "<= 5", "in [0, 1)", "" when unbounded.
  std::string text() const;
};

inline Range unbounded() { return {}; }
inline Range at_least(double lo) { return {lo, std::nullopt, false, false}; }
inline Range above(double lo) { return {lo, std::nullopt, true, false}; }
// [lo, hi]
inline Range closed(double lo, double hi) { return {lo, hi, false, false}; }
// [lo, hi)
inline Range closed_open(double lo, double hi) { return {lo, hi, false, true}; }
// (lo, hi]
inline Range open_closed(double lo, double hi) { return {lo, hi, true, false}; }

// How a value shows in "got ...": 'text' for a scalar, "a list", "a map", "nothing".
std::string describe(const YAML::Node& node);

// Each reader throws ValueError("expected ..., got ..." or "must be ..., got ...").
bool read_bool(const YAML::Node& node);
int64_t read_int(const YAML::Node& node, const Range& range);
uint64_t read_uint(const YAML::Node& node);
double read_real(const YAML::Node& node, const Range& range);
// Sizes: "512MiB", "16GiB", "1.5GB", or an integer byte count; at least `min_bytes`.
uint64_t read_size(const YAML::Node& node, uint64_t min_bytes);
// Any scalar, as written; null is "". `nonempty` rejects "".
std::string read_string(const YAML::Node& node, bool nonempty);
// A list of exactly `count` integers each in `range`; `shape` names them ("[C, H, W]").
std::vector<int64_t> read_int_tuple(const YAML::Node& node, size_t count, const Range& range,
                                    const std::string& shape);
// A list of reals each in `range`, any length; null is the empty list.
std::vector<double> read_real_list(const YAML::Node& node, const Range& range);
// A list of any length of integers, each in `range`; null or [] = empty.
std::vector<int64_t> read_int_list(const YAML::Node& node, const Range& range);
// One of `choices`; the error lists them and suggests the nearest.
std::string read_choice(const YAML::Node& node, const std::vector<std::string>& choices);

}  // namespace ferry::config_internal
