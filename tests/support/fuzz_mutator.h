// Deterministic mutation fuzzing for the parsers of untrusted files (the targets are listed in
// tests/fuzz/CMakeLists.txt): a seeded generator, byte- and text-level mutations of valid seed
// inputs, and a tally. Invariant: the same seed always yields the same cases (reproducible CI).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <typeinfo>
#include <vector>

#include <gtest/gtest.h>

#include "common/error.h"

namespace ferry::fuzz {

// A small deterministic generator (64-bit LCG).
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed * 2862933555777941757ull + 3037000493ull) {}
  uint64_t next() {
    s_ = s_ * 6364136223846793005ull + 1442695040888963407ull;
    return s_ >> 33;
  }
  uint64_t next64() { return (next() << 32) ^ next(); }
  size_t below(size_t n) { return n == 0 ? 0 : next64() % n; }
  bool one_in(size_t n) { return below(n) == 0; }

 private:
  uint64_t s_;
};

// Integers at the edges of every width a header field may have.
inline const std::vector<uint64_t>& boundary_integers() {
  static const std::vector<uint64_t> v = {0,
                                          1,
                                          2,
                                          7,
                                          8,
                                          0x7f,
                                          0x80,
                                          0xff,
                                          0x100,
                                          0x7fff,
                                          0xffff,
                                          0x10000,
                                          0x7fffffff,
                                          0x80000000,
                                          0xffffffff,
                                          0x100000000ull,
                                          1'000'000'000'000'000ull,  // 10^15
                                          0x7fffffffffffffffull,
                                          0x8000000000000000ull,
                                          0xfffffffffffffff8ull,
                                          0xffffffffffffffffull};
  return v;
}

// Texts that replace a number in a text format (JSON, YAML).
inline const std::vector<std::string>& nasty_numbers() {
  static const std::vector<std::string> v = {"0",
                                             "-1",
                                             "-0",
                                             "1000000000000000",
                                             "9223372036854775807",
                                             "9223372036854775808",
                                             "18446744073709551615",
                                             "18446744073709551616",
                                             "99999999999999999999999999999999",
                                             "-9223372036854775809",
                                             "4294967296",
                                             "2147483648",
                                             "1e999",
                                             "-1e999",
                                             "1e-400",
                                             "1.5",
                                             "nan",
                                             ".inf",
                                             "0x10",
                                             "1e15",
                                             "",
                                             "null",
                                             "[]",
                                             "{}",
                                             "\"7\""};
  return v;
}

// Writes `value` as `width` bytes (1, 2, 4 or 8) at `at`, little- or big-endian.
inline void put_integer(std::string& s, size_t at, int width, uint64_t value, bool big_endian) {
  for (int i = 0; i < width && at + i < s.size(); ++i) {
    const int shift = 8 * (big_endian ? width - 1 - i : i);
    s[at + i] = static_cast<char>(value >> shift);
  }
}

// One byte-level mutation: truncation, bit flips, byte insertions and deletions, duplicated or
// swapped ranges, and boundary integers written over a header field. `field_offsets` lists
// offsets of known integer fields (with `width`, `big_endian`), hit half of the time.
struct IntegerFields {
  std::vector<size_t> offsets;
  int width = 4;
  bool big_endian = false;
};

inline std::string mutate_bytes(const std::string& in, Rng& rng, const IntegerFields& fields = {}) {
  std::string s = in;
  switch (rng.below(9)) {
    case 0:  // truncate
      return s.substr(0, rng.below(s.size() + 1));
    case 1: {  // flip a few bits
      for (size_t i = 0, n = 1 + rng.below(8); i < n && !s.empty(); ++i) {
        s[rng.below(s.size())] ^= static_cast<char>(1u << rng.below(8));
      }
      return s;
    }
    case 2: {  // overwrite a few bytes with random values
      for (size_t i = 0, n = 1 + rng.below(4); i < n && !s.empty(); ++i) {
        s[rng.below(s.size())] = static_cast<char>(rng.next());
      }
      return s;
    }
    case 3: {  // insert random bytes
      const size_t at = rng.below(s.size() + 1);
      std::string bytes(1 + rng.below(16), '\0');
      for (char& c : bytes) c = static_cast<char>(rng.next());
      s.insert(at, bytes);
      return s;
    }
    case 4: {  // delete a range
      if (s.empty()) return s;
      const size_t at = rng.below(s.size());
      s.erase(at, 1 + rng.below(std::min<size_t>(64, s.size() - at)));
      return s;
    }
    case 5: {  // duplicate a range
      if (s.empty()) return s;
      const size_t at = rng.below(s.size());
      const std::string piece = s.substr(at, 1 + rng.below(64));
      s.insert(rng.below(s.size() + 1), piece);
      return s;
    }
    case 6: {  // append garbage
      s.append(1 + rng.below(32), static_cast<char>(rng.next()));
      return s;
    }
    default: {  // a boundary integer over a header field (or anywhere)
      const auto& values = boundary_integers();
      uint64_t value = values[rng.below(values.size())];
      if (rng.one_in(4)) value += rng.below(3) - 1;  // and its neighbours
      if (!fields.offsets.empty() && !rng.one_in(4)) {
        put_integer(s, fields.offsets[rng.below(fields.offsets.size())], fields.width, value,
                    fields.big_endian);
      } else if (!s.empty()) {
        const int width = 1 << rng.below(4);
        put_integer(s, rng.below(s.size()), width, value, rng.one_in(2));
      }
      return s;
    }
  }
}

// `in` with one of its numbers (a run of digits, '.' and 'e' starting with a digit), picked at
// random, replaced by one of `values` picked at random; `in` itself when it holds no number.
inline std::string replace_number(const std::string& in, Rng& rng,
                                  const std::vector<std::string>& values) {
  std::string s = in;
  std::vector<std::pair<size_t, size_t>> spans;
  for (size_t i = 0; i < s.size();) {
    const bool digit = s[i] >= '0' && s[i] <= '9';
    if (!digit) {
      ++i;
      continue;
    }
    size_t e = i;
    while (e < s.size() && ((s[e] >= '0' && s[e] <= '9') || s[e] == '.' || s[e] == 'e')) ++e;
    spans.emplace_back(i, e - i);
    i = e;
  }
  if (spans.empty() || values.empty()) return s;
  const auto [pos, len] = spans[rng.below(spans.size())];
  s.replace(pos, len, values[rng.below(values.size())]);
  return s;
}

// One text-level mutation of a structured text (JSON, YAML): a number replaced by a nasty one,
// structural characters overwritten, lines deleted, repeated or swapped.
inline std::string mutate_text(const std::string& in, Rng& rng, const std::string& structural) {
  std::string s = in;
  switch (rng.below(5)) {
    case 0:  // replace a number
      return replace_number(s, rng, nasty_numbers());
    case 1: {  // overwrite structural characters
      for (size_t i = 0, n = 1 + rng.below(3); i < n && !s.empty(); ++i) {
        s[rng.below(s.size())] = structural[rng.below(structural.size())];
      }
      return s;
    }
    default: {  // delete, repeat or swap a line
      std::vector<std::string> lines;
      for (size_t start = 0; start < s.size();) {
        size_t end = s.find('\n', start);
        if (end == std::string::npos) end = s.size();
        lines.push_back(s.substr(start, end - start));
        start = end + 1;
      }
      if (lines.empty()) return s;
      const size_t i = rng.below(lines.size());
      const size_t j = rng.below(lines.size());
      if (rng.one_in(3)) {
        lines.erase(lines.begin() + i);
      } else if (rng.one_in(2)) {
        lines.insert(lines.begin() + i, lines[j]);
      } else {
        std::swap(lines[i], lines[j]);
      }
      std::string out;
      for (const auto& l : lines) out += l + "\n";
      return out;
    }
  }
}

// Outcomes of a fuzz run; `run_case` sorts one attempt into them. Only ferry::Error (of the
// expected type E) may escape a parser; anything else is a test failure naming the case.
struct Tally {
  int accepted = 0;
  int rejected = 0;
};

template <typename E, typename F>
void run_case(const std::string& label, int index, const std::string& input, Tally& tally, F f) {
  if (const char* dir = std::getenv("FERRY_FUZZ_DUMP_DIR")) {  // to replay cases elsewhere
    std::ofstream(std::string(dir) + "/" + label + "-" + std::to_string(index), std::ios::binary)
        << input;
  }
  try {
    f(input);
    ++tally.accepted;
  } catch (const E& e) {
    ++tally.rejected;
    EXPECT_NE(std::string(e.what()), "") << label << " case " << index;
    if (std::getenv("FERRY_FUZZ_VERBOSE"))
      std::printf("%s %d: %s\n", label.c_str(), index, e.what());
  } catch (const std::exception& e) {
    ADD_FAILURE() << label << " case " << index << " threw " << typeid(e).name()
                  << " instead of a typed ferry error: " << e.what();
  }
}

// What a fuzz run must show: `cases` cases in all (any number when negative), more than
// `rejected_above` of them rejected and more than `accepted_above` accepted, so the mutations
// reach both the parser's errors and its accepting paths.
struct TallyBounds {
  int cases = -1;
  int rejected_above = 0;
  int accepted_above = -1;
};

// Prints "<what>: <accepted> <accepted_as>, <rejected> rejected with <error>" and checks `tally`
// against `bounds`.
inline void expect_tally(const Tally& tally, const char* what, const char* accepted_as,
                         const char* error, const TallyBounds& bounds) {
  std::printf("%s: %d %s, %d rejected with %s\n", what, tally.accepted, accepted_as, tally.rejected,
              error);
  if (bounds.cases >= 0) {
    EXPECT_EQ(tally.accepted + tally.rejected, bounds.cases) << what;
  }
  EXPECT_GT(tally.rejected, bounds.rejected_above) << what;
  if (bounds.accepted_above >= 0) {
    EXPECT_GT(tally.accepted, bounds.accepted_above) << what;
  }
}

}  // namespace ferry::fuzz
