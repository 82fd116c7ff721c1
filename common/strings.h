// Small string helpers used by config and CLI error messages.
#pragma once

#include <charconv>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ferry {

// Levenshtein distance between two strings.
size_t edit_distance(std::string_view a, std::string_view b);

// The candidate closest to `word` by edit distance, or "" when none is reasonably close
// (distance more than half the word's length, and not a prefix or suffix match).
std::string nearest(std::string_view word, const std::vector<std::string>& candidates);

std::vector<std::string> split(std::string_view text, char sep);

// `text` as a T when it is all decimal digits (no sign, no space) and fits; nullopt otherwise.
template <typename T>
std::optional<T> parse_digits(std::string_view text) {
  if (text.empty() || text.find_first_not_of("0123456789") != std::string_view::npos) return {};
  T value{};
  const auto [end, err] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (err != std::errc() || end != text.data() + text.size()) return {};
  return value;
}

// `text` with its control characters written out (\n, \r, \t, \xNN), so a user's file name
// quoted in an error stays on one line.
std::string printable(std::string_view text);
std::string join(const std::vector<std::string>& parts, std::string_view sep);

}  // namespace ferry
