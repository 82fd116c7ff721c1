// Strict value readers: the text of a scalar must be exactly a value of the key's type
// (booleans true/false only, integers without a fraction, finite reals, sizes via parse_bytes).
// Quoting does not change the type: "0.1" and 0.1 are the same number.
#include "trainer/config/values.h"

#include <charconv>
#include <cmath>
#include <limits>

#include <fmt/format.h>

#include "common/bytes.h"
#include "common/strings.h"

namespace ferry::config_internal {

namespace {

// The text of a scalar node; a list, map or null is a type error naming `expected`.
std::string scalar_text(const YAML::Node& node, const std::string& expected) {
  if (!node.IsDefined() || !node.IsScalar())
    throw ValueError{fmt::format("expected {}, got {}", expected, describe(node)), "", ""};
  return node.Scalar();
}

// Drops one leading '+', which from_chars does not accept ("+5" is a valid YAML integer).
std::string_view without_plus(std::string_view text) {
  if (text.size() > 1 && text.front() == '+' && text[1] != '-') text.remove_prefix(1);
  return text;
}

// The offset of the first byte that breaks UTF-8 (overlong forms, surrogates and code points
// above U+10FFFF included), or npos when `text` is valid.
size_t invalid_utf8_at(std::string_view text) {
  for (size_t i = 0; i < text.size();) {
    const auto b = static_cast<unsigned char>(text[i]);
    size_t len = 0;
    unsigned char lo = 0x80, hi = 0xbf;  // the allowed range of the second byte
    if (b < 0x80) {
      ++i;
      continue;
    } else if (b >= 0xc2 && b <= 0xdf) {
      len = 2;
    } else if (b >= 0xe0 && b <= 0xef) {
      len = 3;
      if (b == 0xe0) lo = 0xa0;  // overlong
      if (b == 0xed) hi = 0x9f;  // surrogates
    } else if (b >= 0xf0 && b <= 0xf4) {
      len = 4;
      if (b == 0xf0) lo = 0x90;  // overlong
      if (b == 0xf4) hi = 0x8f;  // above U+10FFFF
    } else {
      return i;
    }
    if (i + len > text.size()) return i;
    for (size_t k = 1; k < len; ++k) {
      const auto c = static_cast<unsigned char>(text[i + k]);
      if (c < (k == 1 ? lo : 0x80) || c > (k == 1 ? hi : 0xbf)) return i;
    }
    i += len;
  }
  return std::string_view::npos;
}

void check_range(double value, const std::string& shown, const Range& range) {
  if (!range.contains(value))
    throw ValueError{fmt::format("must be {}, got {}", range.text(), shown), "", ""};
}

}  // namespace

bool Range::contains(double value) const {
  if (lo && (lo_open ? !(value > *lo) : !(value >= *lo))) return false;
  if (hi && (hi_open ? !(value < *hi) : !(value <= *hi))) return false;
  return true;
}

std::string Range::text() const {
  if (lo && hi)
    return fmt::format("in {}{}, {}{}", lo_open ? '(' : '[', real_text(*lo), real_text(*hi),
                       hi_open ? ')' : ']');
  if (lo) return fmt::format("{} {}", lo_open ? ">" : ">=", real_text(*lo));
  if (hi) return fmt::format("{} {}", hi_open ? "<" : "<=", real_text(*hi));
  return "";
}

std::string real_text(double value) { return fmt::format("{}", value); }

std::string size_text(uint64_t bytes) {
  static constexpr std::pair<uint64_t, const char*> kUnits[] = {{uint64_t{1} << 40, "TiB"},
                                                                {uint64_t{1} << 30, "GiB"},
                                                                {uint64_t{1} << 20, "MiB"},
                                                                {uint64_t{1} << 10, "KiB"}};
  if (bytes == 0) return "0";
  for (const auto& [scale, name] : kUnits)
    if (bytes % scale == 0) return fmt::format("{}{}", bytes / scale, name);
  return fmt::format("{}", bytes);
}

std::string describe(const YAML::Node& node) {
  if (!node.IsDefined() || node.IsNull()) return "nothing";
  if (node.IsScalar()) return fmt::format("'{}'", node.Scalar());
  if (node.IsSequence()) return "a list";
  return "a map";
}

bool read_bool(const YAML::Node& node) {
  const std::string text = scalar_text(node, "true or false");
  if (text == "true" || text == "True" || text == "TRUE") return true;
  if (text == "false" || text == "False" || text == "FALSE") return false;
  throw ValueError{fmt::format("expected true or false, got '{}'", text), "", ""};
}

int64_t read_int(const YAML::Node& node, const Range& range) {
  const std::string text = scalar_text(node, "an integer");
  const std::string_view digits = without_plus(text);
  int64_t value = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec == std::errc::result_out_of_range)
    throw ValueError{fmt::format("expected a 64-bit integer, got '{}'", text), "", ""};
  if (ec != std::errc() || end != digits.data() + digits.size())
    throw ValueError{fmt::format("expected an integer, got '{}'", text), "", ""};
  check_range(static_cast<double>(value), fmt::format("{}", value), range);
  return value;
}

uint64_t read_uint(const YAML::Node& node) {
  const std::string text = scalar_text(node, "an integer");
  if (!text.empty() && text.front() == '-') {
    const int64_t negative = read_int(node, unbounded());  // throws if not an integer
    throw ValueError{fmt::format("must be >= 0, got {}", negative), "", ""};
  }
  const std::string_view digits = without_plus(text);
  uint64_t value = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
  if (ec == std::errc::result_out_of_range)
    throw ValueError{fmt::format("expected a 64-bit integer, got '{}'", text), "", ""};
  if (ec != std::errc() || end != digits.data() + digits.size())
    throw ValueError{fmt::format("expected an integer, got '{}'", text), "", ""};
  return value;
}

double read_real(const YAML::Node& node, const Range& range) {
  const std::string text = scalar_text(node, "a number");
  const std::string_view digits = without_plus(text);
  double value = 0;
  const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value,
                                         std::chars_format::general);
  if (ec != std::errc() || end != digits.data() + digits.size())
    throw ValueError{fmt::format("expected a number, got '{}'", text), "", ""};
  if (!std::isfinite(value))
    throw ValueError{fmt::format("expected a finite number, got '{}'", text), "", ""};
  check_range(value, real_text(value), range);
  return value;
}

uint64_t read_size(const YAML::Node& node, uint64_t min_bytes) {
  constexpr const char* kExpected = "a size such as 512MiB, 16GiB or a byte count";
  const std::string text = scalar_text(node, kExpected);
  const std::optional<uint64_t> bytes = parse_bytes(text);
  if (!bytes) throw ValueError{fmt::format("expected {}, got '{}'", kExpected, text), "", ""};
  if (*bytes < min_bytes)
    throw ValueError{fmt::format("must be >= {}, got {}", size_text(min_bytes), size_text(*bytes)),
                     "", ""};
  return *bytes;
}

std::string read_string(const YAML::Node& node, bool nonempty) {
  if (node.IsDefined() && node.IsNull()) {
    if (nonempty) throw ValueError{"must not be empty", "", ""};
    return "";
  }
  std::string text = scalar_text(node, "a string");
  if (nonempty && text.empty()) throw ValueError{"must not be empty", "", ""};
  // The config is also written as JSON, which holds UTF-8 only.
  if (const size_t at = invalid_utf8_at(text); at != std::string_view::npos)
    throw ValueError{fmt::format("expected UTF-8 text, got byte 0x{:02x} at offset {}",
                                 static_cast<unsigned char>(text[at]), at),
                     "", ""};
  return text;
}

// Each element of the sequence `node` read by `read`; a ValueError names its element ("[i]").
template <typename Read>
auto read_elements(const YAML::Node& node, Read read) {
  std::vector<decltype(read(node))> values;
  for (size_t i = 0; i < node.size(); ++i) {
    try {
      values.push_back(read(node[i]));
    } catch (ValueError& e) {
      e.element = fmt::format("[{}]", i);
      throw;
    }
  }
  return values;
}

std::vector<int64_t> read_int_tuple(const YAML::Node& node, size_t count, const Range& range,
                                    const std::string& shape) {
  const std::string expected = fmt::format("a list of {} integers {}", count, shape);
  if (!node.IsDefined() || !node.IsSequence())
    throw ValueError{fmt::format("expected {}, got {}", expected, describe(node)), "", ""};
  if (node.size() != count)
    throw ValueError{fmt::format("expected {}, got a list of {}", expected, node.size()), "", ""};
  return read_elements(node, [&](const YAML::Node& n) { return read_int(n, range); });
}

std::vector<int64_t> read_int_list(const YAML::Node& node, const Range& range) {
  if (node.IsDefined() && node.IsNull()) return {};
  if (!node.IsDefined() || !node.IsSequence())
    throw ValueError{fmt::format("expected a list of integers, got {}", describe(node)), "", ""};
  return read_elements(node, [&](const YAML::Node& n) { return read_int(n, range); });
}

std::vector<double> read_real_list(const YAML::Node& node, const Range& range) {
  if (node.IsDefined() && node.IsNull()) return {};
  if (!node.IsDefined() || !node.IsSequence())
    throw ValueError{fmt::format("expected a list of numbers, got {}", describe(node)), "", ""};
  return read_elements(node, [&](const YAML::Node& n) { return read_real(n, range); });
}

std::string read_choice(const YAML::Node& node, const std::vector<std::string>& choices) {
  const std::string allowed = join(choices, "|");
  const std::string text = scalar_text(node, "one of " + allowed);
  for (const auto& c : choices)
    if (c == text) return text;
  throw ValueError{fmt::format("must be one of {}, got '{}'", allowed, text), "",
                   nearest(text, choices)};
}

}  // namespace ferry::config_internal
