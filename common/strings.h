// Small string helpers used by config and CLI error messages.
#pragma once

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

// `text` with its control characters written out (\n, \r, \t, \xNN), so a user's file name
// quoted in an error stays on one line.
std::string printable(std::string_view text);
std::string join(const std::vector<std::string>& parts, std::string_view sep);

}  // namespace ferry
