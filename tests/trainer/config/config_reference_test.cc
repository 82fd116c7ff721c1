// The generated config reference: every key the issues name is declared, every row is
// complete, defaults read back as the default config, and docs/config.md embeds the table.
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <gtest/gtest.h>

#include "trainer/config/config.h"

namespace ferry {
namespace {

// The keys the issues (2-5) ask for by name; the schema may hold more.
const std::vector<std::string> kRequiredKeys = {
    "run.dir",           "run.steps",          "run.seed",
    "run.log_every",     "run.trace",          "run.trace_steps",
    "model.name",        "model.classes",      "model.input",
    "model.init_from",   "data.source",        "data.path",
    "data.labels",       "data.batch_size",    "data.shuffle",
    "data.mean",         "data.std",           "data.samples",
    "data.drop_last",    "optim.name",         "optim.lr",
    "optim.momentum",    "optim.nesterov",     "optim.weight_decay",
    "optim.schedule",    "optim.warmup_steps", "optim.step_size",
    "optim.gamma",       "optim.min_lr",       "optim.beta1",
    "optim.beta2",       "optim.eps",          "device.backend",
    "device.memory",     "device.threads",     "device.copy_gbps",
    "checkpoint.dir",    "checkpoint.every",   "checkpoint.keep",
    "checkpoint.resume", "memory.policy",      "memory.budget",
    "memory.recompute",  "memory.host_limit",  "memory.debug_poison",
    "memory.measure",    "comm.backend",       "comm.bucket_mb",
    "comm.overlap",      "topology.file",      "topology.scheduler",
    "topology.bind",     "debug.fail_at_step", "debug.fail_rank"};

TEST(ConfigReference, DeclaresEveryRequiredKeyOnce) {
  std::set<std::string> keys;
  for (const auto& info : config_reference()) {
    EXPECT_TRUE(keys.insert(info.key).second) << "declared twice: " << info.key;
    EXPECT_FALSE(info.type.empty()) << info.key;
    EXPECT_FALSE(info.default_value.empty()) << info.key;
    EXPECT_FALSE(info.help.empty()) << info.key;
  }
  for (const auto& key : kRequiredKeys) EXPECT_TRUE(keys.count(key)) << "missing: " << key;
}

TEST(ConfigReference, RowsDescribeTypesRangesAndDefaults) {
  std::map<std::string, KeyInfo> by_key;
  for (const auto& info : config_reference()) by_key[info.key] = info;
  EXPECT_EQ(by_key["optim.lr"].type, "float");
  EXPECT_EQ(by_key["optim.lr"].default_value, "0.1");
  EXPECT_EQ(by_key["optim.lr"].allowed, "> 0");
  EXPECT_EQ(by_key["optim.momentum"].allowed, "in [0, 1)");
  EXPECT_EQ(by_key["memory.policy"].allowed, "none | vdnn-conv | vdnn-all | auto");
  EXPECT_EQ(by_key["device.memory"].type, "size");
  EXPECT_EQ(by_key["device.memory"].default_value, "4GiB");
  EXPECT_EQ(by_key["memory.budget"].default_value, "device.memory");
  EXPECT_EQ(by_key["memory.budget"].allowed, "<= device.memory");
  EXPECT_EQ(by_key["checkpoint.dir"].default_value, "<run.dir>/checkpoints");
  EXPECT_EQ(by_key["run.dir"].default_value, "runs/<config file stem>");
  EXPECT_EQ(by_key["model.input"].default_value, "[3, 32, 32]");
  EXPECT_EQ(by_key["model.input"].allowed, "[C, H, W], each >= 1");
  EXPECT_EQ(by_key["model.init_from"].default_value, "\"\"");
  EXPECT_EQ(by_key["data.mean"].default_value, "[]");
  EXPECT_EQ(by_key["optim.eps"].default_value, "1e-08");
}

// Writing each key's documented default as an override changes nothing.
TEST(ConfigReference, DocumentedDefaultsParseToTheDefaults) {
  const Config defaults = default_config();
  for (const auto& info : config_reference()) {
    if (info.default_value.find('<') != std::string::npos || info.key == "memory.budget")
      continue;  // derived defaults are described, not values
    EXPECT_EQ(parse_config_text("", {info.key + "=" + info.default_value}, "<defaults>"), defaults)
        << info.key << "=" << info.default_value;
  }
}

TEST(ConfigReference, MarkdownTableHasOneRowPerKey) {
  const std::string md = config_reference_markdown();
  EXPECT_EQ(
      md.rfind("| Key | Type | Default | Allowed | Description |\n|---|---|---|---|---|\n", 0), 0u);
  size_t lines = 0;
  for (char ch : md) lines += ch == '\n';
  EXPECT_EQ(lines, config_reference().size() + 2);
  EXPECT_NE(md.find("| `optim.name` | choice | `sgd` | sgd \\| adamw | Optimizer. |\n"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| `device.memory` | size | `4GiB` | >= 1 |"), std::string::npos) << md;
}

// docs/config.md embeds the reference table: one row per key. Prints the table when out of date
// (scripts/gen_config_doc.py rewrites the page).
TEST(ConfigReference, ConfigPageEmbedsEveryKey) {
  std::ifstream in(std::string(FERRY_SOURCE_DIR) + "/docs/config.md");
  ASSERT_TRUE(in) << "docs/config.md is missing: run scripts/gen_config_doc.py";
  std::stringstream text;
  text << '\n' << in.rdbuf();  // so that every row starts after a newline
  const std::string readme = text.str();
  bool all = true;
  for (const auto& info : config_reference()) {
    const std::string row = fmt::format("\n| `{}` |", info.key);
    const size_t first = readme.find(row);
    const bool once =
        first != std::string::npos && readme.find(row, first + 1) == std::string::npos;
    EXPECT_TRUE(once) << "docs/config.md should have exactly one table row starting "
                      << row.substr(1);
    all = all && once;
  }
  if (!all)
    ADD_FAILURE() << "the current table (config_reference_markdown()):\n"
                  << config_reference_markdown();
}

}  // namespace
}  // namespace ferry
