// Size parsing and printing.
#include "common/bytes.h"

#include <cctype>
#include <cmath>
#include <cstdlib>

#include <fmt/format.h>

namespace ferry {

std::optional<uint64_t> parse_bytes(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front())))
    text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back())))
    text.remove_suffix(1);
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.'))
    ++i;
  if (i == 0) return std::nullopt;
  const std::string number(text.substr(0, i));
  if (number.find('.') != number.rfind('.')) return std::nullopt;
  std::string_view unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);

  struct Unit {
    std::string_view name;
    double scale;
  };
  static constexpr Unit kUnits[] = {{"", 1.0},
                                    {"B", 1.0},
                                    {"KiB", 1024.0},
                                    {"MiB", 1048576.0},
                                    {"GiB", 1073741824.0},
                                    {"TiB", 1099511627776.0},
                                    {"KB", 1e3},
                                    {"MB", 1e6},
                                    {"GB", 1e9},
                                    {"TB", 1e12},
                                    {"K", 1024.0},
                                    {"M", 1048576.0},
                                    {"G", 1073741824.0},
                                    {"T", 1099511627776.0}};
  for (const auto& u : kUnits) {
    if (unit == u.name) {
      char* end = nullptr;
      const double value = std::strtod(number.c_str(), &end) * u.scale;
      if (end != number.c_str() + number.size() || !std::isfinite(value)) return std::nullopt;
      if (value >= 1.8e19) return std::nullopt;
      const double rounded = std::round(value);
      if (std::fabs(rounded - value) > 1e-6 * std::max(1.0, value)) return std::nullopt;
      return static_cast<uint64_t>(rounded);
    }
  }
  return std::nullopt;
}

std::string format_bytes(uint64_t bytes) {
  static constexpr const char* kNames[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  double value = static_cast<double>(bytes);
  int unit = 0;
  while (value >= 1024.0 && unit < 5) {
    value /= 1024.0;
    ++unit;
  }
  return fmt::format("{:.2f} {}", value, kNames[unit]);
}

}  // namespace ferry
