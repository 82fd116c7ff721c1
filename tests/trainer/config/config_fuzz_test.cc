// A deterministic fuzz driver for the config loader: mutated YAML configs and key=value
// overrides with nasty values, plus pathological YAML (deep nesting, alias bombs, recursive
// aliases, huge numbers, unicode, empty and duplicate keys) must each load a valid Config or
// fail with a ConfigError, never crash, hang or blow up memory. Run under ASan and UBSan by the
// fuzz_asan test.
#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/support/fuzz_mutator.h"
#include "trainer/config/config.h"
#include "trainer/config/schema.h"

namespace ferry {
namespace {

using fuzz::Rng;
using fuzz::Tally;

const char kYamlStructural[] = ":-[]{},#&*!|>'\"%@`? \t\n";

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// What a consumer does with a loaded config: print it and load the print back.
void exercise(const Config& c) {
  const std::string yaml = to_yaml(c);
  (void)to_json(c).dump();
  EXPECT_EQ(parse_config_text(yaml, {}, "reloaded.yaml"), c);
}

void load_text(const std::string& text) { exercise(parse_config_text(text, {}, "fuzz.yaml")); }

std::vector<std::string> seeds() {
  Config c = default_config();
  c.data.mean = {0.5, 0.25, 0.125};
  c.data.std = {0.2, 0.2, 0.2};
  c.model.init_from = "w.safetensors";
  return {to_yaml(c), read_text(std::string(FERRY_SOURCE_DIR) + "/configs/quickstart.yaml")};
}

TEST(ConfigFuzz, MutatedYaml) {
  Tally tally;
  uint64_t seed_value = 200;
  for (const std::string& seed : seeds()) {
    ASSERT_NO_THROW(load_text(seed));
    Rng rng(seed_value++);
    for (int i = 0; i < 400; ++i) {
      std::string input = rng.one_in(4) ? fuzz::mutate_bytes(seed, rng)
                                        : fuzz::mutate_text(seed, rng, kYamlStructural);
      if (rng.one_in(3)) input = fuzz::mutate_text(input, rng, kYamlStructural);
      fuzz::run_case<ConfigError>(fmt::format("config-{}", seed_value), i, input, tally, load_text);
    }
  }
  fuzz::expect_tally(tally, "config fuzz", "loaded", "a ConfigError",
                     {.cases = 800, .rejected_above = 200, .accepted_above = 70});
}

TEST(ConfigFuzz, OverridesWithNastyValues) {
  std::vector<std::string> keys;
  for (const auto& k : config_internal::schema()) keys.push_back(k.name);
  std::vector<std::string> values = fuzz::nasty_numbers();
  for (const char* v : {"",
                        "=",
                        "==1",
                        "'",
                        "\"",
                        "\"unterminated",
                        "[",
                        "{",
                        "[1, 2, 3]",
                        "[[[[[[1]]]]]]",
                        "{a: 1}",
                        "&a [*a]",
                        "*undefined",
                        "!!binary AAAA",
                        "true",
                        "yes",
                        "\xff\xfe",
                        "\xc3\x28",
                        "\u00e9\u4e2d\U0001F600",
                        "16GiB",
                        "1.5TB",
                        "99999999999999999999GiB",
                        "-1KiB",
                        "~",
                        "- a\n- b",
                        "a: b: c",
                        "%YAML 1.2",
                        "--- 1",
                        "1 # comment",
                        "0b101",
                        "0o17",
                        "1_000"}) {
    values.push_back(v);
  }
  Tally tally;
  Rng rng(7);
  for (int i = 0; i < 1500; ++i) {
    std::vector<std::string> overrides;
    for (size_t n = 1 + rng.below(3); n > 0; --n) {
      std::string key = keys[rng.below(keys.size())];
      if (rng.one_in(10)) key = fuzz::mutate_bytes(key, rng);  // unknown or damaged keys
      std::string value = values[rng.below(values.size())];
      if (rng.one_in(8)) value = fuzz::mutate_bytes(value, rng);
      overrides.push_back(rng.one_in(20) ? value : key + "=" + value);
    }
    std::string joined;
    for (const auto& o : overrides) joined += o + "\n";
    fuzz::run_case<ConfigError>("override", i, joined, tally, [&](const std::string&) {
      exercise(parse_config_text("", overrides, "fuzz.yaml"));
    });
  }
  fuzz::expect_tally(tally, "override fuzz", "loaded", "a ConfigError",
                     {.cases = 1500, .rejected_above = 500, .accepted_above = 50});
}

// Inputs each built to break a parser; every one must load or be a ConfigError.
std::vector<std::pair<std::string, std::string>> pathological() {
  std::vector<std::pair<std::string, std::string>> cases;
  // Deep nesting, as flow and as block collections, in a value and at the top level.
  cases.push_back({"deep flow list",
                   "data:\n  mean: " + std::string(20000, '[') + std::string(20000, ']') + "\n"});
  cases.push_back({"deep flow map", "data:\n  mean: " + std::string(20000, '{') + "\n"});
  cases.push_back({"deep unclosed", std::string(20000, '[')});
  std::string block = "optim:\n";
  for (int i = 0; i < 5000; ++i) block += std::string(2 * i + 2, ' ') + "k:\n";
  cases.push_back({"deep block map", block});
  std::string dashes;
  for (int i = 0; i < 5000; ++i) dashes += "- ";
  cases.push_back({"deep block list", "data:\n  mean: " + dashes + "1\n"});
  // Billion laughs: each anchor is ten aliases of the previous one (10^9 leaves if expanded).
  std::string laughs = "laughs:\n  l0: &l0 [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]\n";
  for (int i = 1; i < 9; ++i) {
    laughs += fmt::format("  l{}: &l{} [", i, i);
    for (int k = 0; k < 10; ++k) laughs += fmt::format("{}*l{}", k ? ", " : "", i - 1);
    laughs += "]\n";
  }
  cases.push_back({"billion laughs (unknown section)", laughs});
  std::string anchors = "data:\n  mean: &l0 [0.5, 0.5, 0.5]\n";
  cases.push_back({"alias reuse", anchors + "  std: *l0\nmodel:\n  input: [3, 32, 32]\n"});
  std::string bomb = "data:\n  mean: [";
  for (int k = 0; k < 10; ++k) bomb += fmt::format("{}&a{} [*b, *b]", k ? ", " : "", k);
  bomb += "]\n";
  cases.push_back({"undefined aliases", bomb});
  std::string nested_bomb = "x0: &x0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]\n";
  for (int i = 1; i < 12; ++i) {
    nested_bomb += fmt::format("x{}: &x{} [", i, i);
    for (int k = 0; k < 10; ++k) nested_bomb += fmt::format("{}*x{}", k ? ", " : "", i - 1);
    nested_bomb += "]\n";
  }
  cases.push_back({"alias bomb as keys", nested_bomb + "data:\n  mean: *x11\n"});
  std::string in_value = "data:\n  mean: [&v0 [0.5, 0.5, 0.5]";
  for (int i = 1; i < 10; ++i) {
    in_value += fmt::format(", &v{} [", i);
    for (int k = 0; k < 10; ++k) in_value += fmt::format("{}*v{}", k ? ", " : "", i - 1);
    in_value += "]";
  }
  cases.push_back({"alias bomb in a value", in_value + "]\n"});
  cases.push_back({"alias bomb in the next value", in_value + "]\n  std: *v9\n"});
  cases.push_back({"recursive alias", "data:\n  mean: &a [*a]\n"});
  cases.push_back({"recursive map alias", "data: &a\n  mean: *a\n"});
  cases.push_back({"merge key", "base: &b {lr: 0.1}\noptim:\n  <<: *b\n"});
  cases.push_back({"merge key in section", "optim: &o\n  lr: 0.1\nrun:\n  <<: *o\n"});
  // Numbers.
  for (const std::string& n : fuzz::nasty_numbers()) {
    for (const char* key : {"optim.lr", "data.batch_size", "device.memory", "run.seed",
                            "model.input", "data.mean", "run.trace_steps"}) {
      cases.push_back({fmt::format("{}={}", key, n), fmt::format("{}: {}\n", key, n)});
    }
  }
  cases.push_back({"huge digits", "optim:\n  lr: 0." + std::string(100000, '1') + "\n"});
  cases.push_back({"huge exponent", "optim:\n  lr: 1e" + std::string(1000, '9') + "\n"});
  // Keys.
  cases.push_back({"empty key", "\"\": 1\n"});
  cases.push_back({"empty key in section", "optim:\n  \"\": 1\n"});
  cases.push_back({"null key", "~: 1\n"});
  cases.push_back({"complex key", "? [a, b]\n: 1\n"});
  cases.push_back({"complex key in section", "optim:\n  ? {a: 1}\n  : 1\n"});
  cases.push_back({"duplicate section", "optim:\n  lr: 0.1\noptim:\n  lr: 0.2\n"});
  cases.push_back({"duplicate key", "optim:\n  lr: 0.1\n  lr: 0.2\n"});
  cases.push_back({"dotted and nested", "optim.lr: 0.1\noptim:\n  lr: 0.2\n"});
  cases.push_back({"unicode key", "\u00f6ptim:\n  lr: 0.1\n"});
  cases.push_back({"unicode value", "run:\n  dir: \"\u4e2d\U0001F600\"\n"});
  cases.push_back({"invalid utf-8", "run:\n  dir: \xff\xfe\xc3\x28\n"});
  cases.push_back({"nul bytes", std::string("run:\n  dir: a\0b\n", 15)});
  cases.push_back({"bom", "\xef\xbb\xbfoptim:\n  lr: 0.1\n"});
  cases.push_back({"long key", std::string(200000, 'k') + ": 1\n"});
  cases.push_back({"long dotted key", "optim." + std::string(200000, 'k') + ": 1\n"});
  cases.push_back({"many keys", [] {
                     std::string s = "optim:\n";
                     for (int i = 0; i < 5000; ++i) s += fmt::format("  k{}: 1\n", i);
                     return s;
                   }()});
  // Documents, tags, directives.
  cases.push_back({"two documents", "optim:\n  lr: 0.1\n---\noptim:\n  lr: 0.2\n"});
  cases.push_back({"many documents", [] {
                     std::string s;
                     for (int i = 0; i < 2000; ++i) s += "---\n";
                     return s;
                   }()});
  cases.push_back({"tags", "optim: !!map\n  lr: !!str 0.1\n"});
  cases.push_back({"binary tag", "run:\n  dir: !!binary aGVsbG8=\n"});
  cases.push_back({"directive", "%YAML 1.1\n%TAG ! tag:x,2000:\n---\noptim: {lr: 0.1}\n"});
  cases.push_back({"block scalar", "run:\n  dir: |\n    a\n    b\n"});
  cases.push_back({"tabs", "optim:\n\tlr: 0.1\n"});
  return cases;
}

TEST(ConfigFuzz, PathologicalYaml) {
  Tally tally;
  int i = 0;
  for (const auto& [name, text] : pathological()) {
    fuzz::run_case<ConfigError>("pathological", i++, text, tally, load_text);
    // As the value of an override, too.
    fuzz::run_case<ConfigError>("pathological-override", i++, text, tally, [&](const std::string&) {
      exercise(parse_config_text("", {"data.mean=" + text}, "o"));
    });
  }
  fuzz::expect_tally(tally, "pathological yaml", "loaded", "a ConfigError", {.rejected_above = 50});
}

// An alias bomb must not be expanded: loading it is as fast as loading its text.
TEST(ConfigFuzz, AliasBombIsNotExpanded) {
  std::string bomb = "x0: &x0 [0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5, 0.5]\n";
  for (int i = 1; i < 10; ++i) {
    bomb += fmt::format("x{}: &x{} [", i, i);
    for (int k = 0; k < 10; ++k) bomb += fmt::format("{}*x{}", k ? ", " : "", i - 1);
    bomb += "]\n";
  }
  // 10^10 leaves if expanded; a ConfigError naming the value's first element if not.
  EXPECT_THROW(parse_config_text(bomb, {}, "bomb.yaml"), ConfigError);
  EXPECT_THROW(parse_config_text(bomb + "data:\n  mean: *x9\n", {}, "bomb.yaml"), ConfigError);
  std::string in_value = "data:\n  mean: [&v0 [0.5]";
  for (int i = 1; i < 10; ++i) {
    in_value += fmt::format(", &v{} [", i);
    for (int k = 0; k < 10; ++k) in_value += fmt::format("{}*v{}", k ? ", " : "", i - 1);
    in_value += "]";
  }
  EXPECT_THROW(parse_config_text(in_value + "]\n", {}, "bomb.yaml"), ConfigError);
  EXPECT_THROW(parse_config_text("data:\n  mean: []\n", {"data.mean=" + bomb}, "o"), ConfigError);
}

}  // namespace
}  // namespace ferry
