// Edit distance and splitting.
#include "common/strings.h"

#include <algorithm>
#include <numeric>

namespace ferry {

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  std::iota(row.begin(), row.end(), size_t{0});
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

std::string nearest(std::string_view word, const std::vector<std::string>& candidates) {
  // "lr" for "optim.lr": the last component matches.
  const auto tail = [](std::string_view s) {
    const auto dot = s.rfind('.');
    return dot == std::string_view::npos ? s : s.substr(dot + 1);
  };
  const std::string_view word_tail = tail(word);
  std::string best;
  size_t best_distance = SIZE_MAX;
  for (const auto& c : candidates) {
    // The distance is quadratic: past ~1M steps (a huge name read from an untrusted file) take
    // an upper bound instead, the longer length less a shared last component, so a suggestion
    // stays cheap and the same-leaf rule below still applies.
    constexpr size_t kMaxSteps = size_t{1} << 20;
    size_t d = 0;
    if (word.size() * c.size() > kMaxSteps) {
      d = std::max(word.size(), c.size()) - (word_tail == tail(c) ? word_tail.size() : 0);
    } else {
      d = edit_distance(word, c);
    }
    if (d < best_distance) {
      best_distance = d;
      best = c;
    }
  }
  if (best.empty()) return best;
  const bool close = best_distance * 2 <= std::max<size_t>(word.size(), 2);
  const bool same_leaf = word_tail == tail(best);
  return close || same_leaf ? best : std::string();
}

std::vector<std::string> split(std::string_view text, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t pos = text.find(sep, start);
    parts.emplace_back(text.substr(start, pos - start));
    if (pos == std::string_view::npos) break;
    start = pos + 1;
  }
  return parts;
}

std::string join(const std::vector<std::string>& parts, std::string_view sep) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) {
    if (i) out += sep;
    out += parts[i];
  }
  return out;
}

std::string printable(std::string_view text) {
  static constexpr char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += c;
    }
  }
  return out;
}

}  // namespace ferry
