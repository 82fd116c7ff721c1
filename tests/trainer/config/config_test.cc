// Config loading: defaults and their resolution, overrides, sizes, strict scalar types, and
// the round trip to_yaml -> load == the same Config.
#include <functional>

#include <gtest/gtest.h>

#include "tests/support/temp_dir.h"
#include "trainer/config/config.h"

namespace ferry {
namespace {

Config parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return parse_config_text(text, overrides, "x.yaml");
}

TEST(ConfigDefaults, ResolvedDefaults) {
  const Config c = default_config();
  EXPECT_EQ(c.run.dir, "runs/default");
  EXPECT_EQ(c.run.steps, 100);
  EXPECT_EQ(c.run.seed, 0u);
  EXPECT_EQ(c.run.log_every, 10);
  EXPECT_FALSE(c.run.trace);
  EXPECT_EQ(c.run.trace_steps, (std::array<int64_t, 2>{2, 3}));
  EXPECT_EQ(c.model.name, "resnet18_cifar");
  EXPECT_EQ(c.model.classes, 10);
  EXPECT_EQ(c.model.input, (std::array<int64_t, 3>{3, 32, 32}));
  EXPECT_EQ(c.model.init_from, "");
  EXPECT_EQ(c.data.source, DataSource::kSynthetic);
  EXPECT_EQ(c.data.batch_size, 32);
  EXPECT_TRUE(c.data.shuffle);
  EXPECT_TRUE(c.data.mean.empty());
  EXPECT_TRUE(c.data.std.empty());
  EXPECT_EQ(c.data.samples, 4096);
  EXPECT_TRUE(c.data.drop_last);
  EXPECT_EQ(c.optim.name, OptimizerKind::kSgd);
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.1);
  EXPECT_DOUBLE_EQ(c.optim.momentum, 0.9);
  EXPECT_FALSE(c.optim.nesterov);
  EXPECT_EQ(c.optim.schedule, ScheduleKind::kConstant);
  EXPECT_EQ(c.optim.step_size, 30);
  EXPECT_DOUBLE_EQ(c.optim.gamma, 0.1);
  EXPECT_DOUBLE_EQ(c.optim.beta2, 0.999);
  EXPECT_DOUBLE_EQ(c.optim.eps, 1e-8);
  EXPECT_EQ(c.device.backend, Backend::kCpu);
  EXPECT_EQ(c.device.memory, uint64_t{4} << 30);
  EXPECT_EQ(c.device.threads, 0);
  EXPECT_EQ(c.checkpoint.dir, "runs/default/checkpoints");
  EXPECT_EQ(c.checkpoint.every, 0);
  EXPECT_EQ(c.checkpoint.keep, 3);
  EXPECT_EQ(c.checkpoint.resume, "");
  EXPECT_EQ(c.memory.policy, MemoryPolicy::kNone);
  EXPECT_EQ(c.memory.budget, c.device.memory);
  EXPECT_EQ(c.memory.host_limit, uint64_t{8} << 30);
  EXPECT_EQ(c.comm.backend, CommBackend::kAuto);
  EXPECT_DOUBLE_EQ(c.comm.bucket_mb, 25.0);
  EXPECT_TRUE(c.comm.overlap);
  EXPECT_EQ(c.topology.file, "");
  EXPECT_EQ(c.topology.scheduler, LinkSchedulerKind::kFifo);
  EXPECT_TRUE(c.topology.bind);
  EXPECT_EQ(c.debug.fail_at_step, -1);
  EXPECT_EQ(c.debug.fail_rank, -1);
}

TEST(ConfigDefaults, EmptyTextAndEmptyMapAreDefaults) {
  EXPECT_EQ(parse_config_text("", {}, "<x>"), default_config());
  EXPECT_EQ(parse_config_text("{}\n", {}, "<x>"), default_config());
  EXPECT_EQ(parse_config_text("# only a comment\n", {}, "<x>"), default_config());
  // A section with every key commented out is an empty section.
  EXPECT_EQ(parse_config_text("optim:\n  # lr: 0.5\n", {}, "<x>"), default_config());
}

TEST(ConfigDefaults, RunDirFromFileStem) {
  const testing::TempDir dir;
  const Config c = load_config(dir.write("quick_mnist.yaml", "run:\n  steps: 5\n"));
  EXPECT_EQ(c.run.dir, "runs/quick_mnist");
  EXPECT_EQ(c.checkpoint.dir, "runs/quick_mnist/checkpoints");
  EXPECT_EQ(c.run.steps, 5);
  EXPECT_EQ(parse_config_text("", {}, "configs/exp1.yml").run.dir, "runs/exp1");
  EXPECT_EQ(parse_config_text("", {}, "<string>").run.dir, "runs/default");
}

TEST(ConfigDefaults, DerivedDefaultsFollowTheirSource) {
  Config c = parse("run:\n  dir: out/a\n");
  EXPECT_EQ(c.checkpoint.dir, "out/a/checkpoints");
  c = parse("run:\n  dir: out/a\ncheckpoint:\n  dir: /ckpt\n");
  EXPECT_EQ(c.checkpoint.dir, "/ckpt");
  c = parse("", {"device.memory=8GiB"});
  EXPECT_EQ(c.memory.budget, uint64_t{8} << 30);
  c = parse("", {"device.memory=8GiB", "memory.budget=3GiB"});
  EXPECT_EQ(c.memory.budget, uint64_t{3} << 30);
  c = parse("", {"memory.budget=0"});  // 0 means "device.memory"
  EXPECT_EQ(c.memory.budget, uint64_t{4} << 30);
}

TEST(ConfigOverrides, LaterWins) {
  const std::string text = "optim:\n  lr: 0.5\ndata:\n  batch_size: 16\n";
  EXPECT_DOUBLE_EQ(parse(text).optim.lr, 0.5);
  EXPECT_DOUBLE_EQ(parse(text, {"optim.lr=0.2"}).optim.lr, 0.2);
  const Config c = parse(text, {"optim.lr=0.2", "data.batch_size=64", "optim.lr=0.03"});
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.03);
  EXPECT_EQ(c.data.batch_size, 64);
}

TEST(ConfigOverrides, ListsStringsAndChoices) {
  const Config c = parse("", {"model.input=[1,28,28]", "data.mean=[0.5]", "data.std=[0.25]",
                              "data.source=idx", "data.path=data/mnist/train-images", "run.dir=a=b",
                              "model.init_from=\"w x.safetensors\"", "memory.policy=vdnn-all",
                              " optim.name = adamw "});
  EXPECT_EQ(c.model.input, (std::array<int64_t, 3>{1, 28, 28}));
  EXPECT_EQ(c.data.mean, std::vector<double>{0.5});
  EXPECT_EQ(c.data.std, std::vector<double>{0.25});
  EXPECT_EQ(c.data.source, DataSource::kIdx);
  EXPECT_EQ(c.data.path, "data/mnist/train-images");
  EXPECT_EQ(c.run.dir, "a=b");  // split at the first '='
  EXPECT_EQ(c.model.init_from, "w x.safetensors");
  EXPECT_EQ(c.memory.policy, MemoryPolicy::kVdnnAll);
  EXPECT_EQ(c.optim.name, OptimizerKind::kAdamW);
  // An empty value clears a string and a list.
  const Config cleared = parse("model:\n  init_from: w.safetensors\ndata:\n  mean: [1, 2, 3]\n",
                               {"model.init_from=", "data.mean="});
  EXPECT_EQ(cleared.model.init_from, "");
  EXPECT_TRUE(cleared.data.mean.empty());
}

TEST(ConfigOverrides, CrossKeyChecksRunAfterAllOverrides) {
  // data.source=idx alone would fail, but data.path arrives in a later override.
  EXPECT_NO_THROW(parse("", {"data.source=idx", "data.path=x"}));
  // model.input changes channels: the file's 3-channel mean fails unless it is replaced too.
  const std::string text = "data:\n  mean: [0.4, 0.5, 0.6]\n";
  EXPECT_THROW(parse(text, {"model.input=[1,28,28]"}), ConfigError);
  EXPECT_NO_THROW(parse(text, {"model.input=[1,28,28]", "data.mean=[0.5]"}));
}

TEST(ConfigValues, SizesThroughTheConfig) {
  EXPECT_EQ(parse("device:\n  memory: 512MiB\n").device.memory, uint64_t{512} << 20);
  EXPECT_EQ(parse("device:\n  memory: 16GiB\n").device.memory, uint64_t{16} << 30);
  EXPECT_EQ(parse("device:\n  memory: 1048576\n").device.memory, uint64_t{1} << 20);
  EXPECT_EQ(parse("device:\n  memory: 2GB\n").device.memory, uint64_t{2000000000});
  EXPECT_EQ(parse("", {"device.memory=1.5GiB"}).device.memory, uint64_t{3} << 29);
  EXPECT_EQ(parse("", {"memory.host_limit=0"}).memory.host_limit, 0u);
  EXPECT_EQ(parse("", {"memory.host_limit=\"64MiB\""}).memory.host_limit, uint64_t{64} << 20);
}

TEST(ConfigValues, StrictScalars) {
  EXPECT_TRUE(parse("run:\n  trace: true\n").run.trace);
  EXPECT_TRUE(parse("run:\n  trace: True\n").run.trace);
  EXPECT_THROW(parse("run:\n  trace: yes\n"), ConfigError);
  EXPECT_THROW(parse("run:\n  trace: 1\n"), ConfigError);
  EXPECT_EQ(parse("run:\n  steps: +5\n").run.steps, 5);
  EXPECT_THROW(parse("run:\n  steps: 1.5\n"), ConfigError);
  EXPECT_THROW(parse("run:\n  steps: 1e3\n"), ConfigError);
  EXPECT_THROW(parse("run:\n  steps: 0x10\n"), ConfigError);
  EXPECT_DOUBLE_EQ(parse("optim:\n  lr: 1e-3\n").optim.lr, 1e-3);
  EXPECT_DOUBLE_EQ(parse("optim:\n  lr: \"0.5\"\n").optim.lr, 0.5);  // quoting keeps the type
  EXPECT_DOUBLE_EQ(parse("optim:\n  lr: 3\n").optim.lr, 3.0);
  EXPECT_THROW(parse("optim:\n  lr: .inf\n"), ConfigError);
  EXPECT_THROW(parse("optim:\n  lr: nan\n"), ConfigError);
  EXPECT_EQ(parse("run:\n  seed: 18446744073709551615\n").run.seed, UINT64_MAX);
  EXPECT_THROW(parse("run:\n  seed: 18446744073709551616\n"), ConfigError);
  EXPECT_EQ(parse("debug:\n  fail_at_step: -1\n  fail_rank: 1\n").debug.fail_rank, 1);
  EXPECT_THROW(parse("debug:\n  fail_at_step: -2\n"), ConfigError);
  // Strings take any scalar as written.
  EXPECT_EQ(parse("model:\n  init_from: 123\n").model.init_from, "123");
  // Ranges at their edges.
  EXPECT_DOUBLE_EQ(parse("optim:\n  momentum: 0\n").optim.momentum, 0.0);
  EXPECT_THROW(parse("optim:\n  momentum: 1\n"), ConfigError);
  EXPECT_DOUBLE_EQ(parse("optim:\n  gamma: 1\n").optim.gamma, 1.0);
  EXPECT_THROW(parse("optim:\n  gamma: 0\n"), ConfigError);
}

TEST(ConfigValues, DottedKeysAtTheTopLevel) {
  const Config c = parse("optim.lr: 0.25\nrun:\n  steps: 7\n");
  EXPECT_DOUBLE_EQ(c.optim.lr, 0.25);
  EXPECT_EQ(c.run.steps, 7);
}

TEST(ConfigValues, CrossKeyRulesThatPass) {
  // nesterov with momentum > 0; nesterov is not an sgd-only error under adamw.
  EXPECT_TRUE(parse("optim:\n  nesterov: true\n").optim.nesterov);
  EXPECT_NO_THROW(parse("", {"optim.name=adamw", "optim.momentum=0", "optim.nesterov=true"}));
  // min_lr above lr only matters for cosine.
  EXPECT_NO_THROW(parse("", {"optim.min_lr=0.5"}));
  EXPECT_NO_THROW(parse("", {"optim.schedule=cosine", "optim.min_lr=0.1"}));
  // budget equal to memory is fine.
  EXPECT_NO_THROW(parse("", {"memory.budget=4GiB"}));
  // mean and std are independent; a one-channel model takes one value.
  EXPECT_NO_THROW(parse("", {"model.input=[1,8,8]", "data.std=[0.3]"}));
  EXPECT_NO_THROW(parse("", {"run.trace_steps=[4,4]"}));
}

// A config with every key away from its default, through overrides of every kind.
Config everything_changed() {
  return parse_config_text(
      "run:\n"
      "  dir: \"runs/with: colon #hash\"\n"
      "  steps: 12345\n"
      "  seed: 18446744073709551615\n"
      "  log_every: 7\n"
      "  trace: true\n"
      "  trace_steps: [5, 9]\n"
      "model:\n"
      "  name: vgg11_cifar\n"
      "  classes: 100\n"
      "  input: [1, 28, 30]\n"
      "  init_from: \"null\"\n"
      "data:\n"
      "  source: cifar10\n"
      "  path: \"123\"\n"
      "  labels: 'lab''els'\n"
      "  batch_size: 3\n"
      "  shuffle: false\n"
      "  mean: [0.30000000000000004]\n"
      "  std: [1e-7]\n"
      "  samples: 17\n"
      "  seed: 7\n"
      "  drop_last: false\n"
      "optim:\n"
      "  name: adamw\n"
      "  lr: 0.0003\n"
      "  momentum: 0.5\n"
      "  nesterov: true\n"
      "  weight_decay: 0.05\n"
      "  schedule: cosine\n"
      "  warmup_steps: 11\n"
      "  step_size: 3\n"
      "  gamma: 0.5\n"
      "  min_lr: 1e-6\n"
      "  beta1: 0.8\n"
      "  beta2: 0.95\n"
      "  eps: 1e-10\n"
      "device:\n"
      "  backend: cuda\n"
      "  memory: 1000001\n"
      "  threads: 2\n"
      "  copy_gbps: 12.5\n"
      "checkpoint:\n"
      "  dir: ck\n"
      "  every: 5\n"
      "  keep: 0\n"
      "  resume: latest\n"
      "memory:\n"
      "  policy: vdnn-conv\n"
      "  budget: 999999\n"
      "  recompute: true\n"
      "  host_limit: 3MiB\n"
      "  debug_poison: true\n"
      "  measure: false\n"
      "  link_gbps: 3.5\n"
      "comm:\n"
      "  backend: nccl\n"
      "  bucket_mb: 0.5\n"
      "  overlap: false\n"
      "topology:\n"
      "  file: configs/topologies/dgx1.yaml\n"
      "  scheduler: fifo\n"
      "  bind: false\n"
      "  unknown_link_gbps: 7.877\n"
      "debug:\n"
      "  fail_at_step: 3\n"
      "  fail_rank: 1\n",
      {}, "everything.yaml");
}

TEST(ConfigRoundTrip, DefaultsLoadBackEqual) {
  const Config c = default_config();
  const std::string yaml = to_yaml(c);
  EXPECT_EQ(parse_config_text(yaml, {}, "config.yaml"), c);
  EXPECT_NE(yaml.find("memory: 4GiB"), std::string::npos) << yaml;
  EXPECT_NE(yaml.find("input: [3, 32, 32]"), std::string::npos) << yaml;
}

TEST(ConfigRoundTrip, EveryKeyChangedLoadsBackEqual) {
  const Config c = everything_changed();
  const Config d = default_config();
  // Every section differs from the defaults, so a key the printer forgot would show.
  EXPECT_NE(c.run, d.run);
  EXPECT_NE(c.debug, d.debug);
  EXPECT_EQ(c.run.dir, "runs/with: colon #hash");
  EXPECT_EQ(c.model.init_from, "null");
  EXPECT_EQ(c.data.labels, "lab'els");
  EXPECT_EQ(c.data.mean, std::vector<double>{0.1 + 0.2});
  const std::string yaml = to_yaml(c);
  const Config back = parse_config_text(yaml, {}, "config.yaml");
  EXPECT_EQ(back, c) << yaml;
  EXPECT_EQ(to_yaml(back), yaml);
  // Through a file too, and with the same text: printing is deterministic.
  const testing::TempDir dir;
  EXPECT_EQ(load_config(dir.write("config.yaml", yaml)), c);
}

TEST(ConfigRoundTrip, YamlListsEveryKeyOnce) {
  const std::string yaml = to_yaml(default_config());
  for (const auto& info : config_reference()) {
    const std::string section = info.key.substr(0, info.key.find('.'));
    const std::string leaf = info.key.substr(info.key.find('.') + 1);
    const size_t at = yaml.find("\n" + section + ":\n");
    ASSERT_NE(at, std::string::npos) << section;
    EXPECT_NE(yaml.find("\n  " + leaf + ":", at), std::string::npos) << info.key;
  }
}

TEST(ConfigJson, NestedTypedValues) {
  const nlohmann::json j = to_json(default_config());
  EXPECT_EQ(j["device"]["memory"], uint64_t{4} << 30);
  EXPECT_EQ(j["memory"]["budget"], uint64_t{4} << 30);
  EXPECT_EQ(j["memory"]["policy"], "none");
  EXPECT_EQ(j["model"]["input"], nlohmann::json::array({3, 32, 32}));
  EXPECT_EQ(j["optim"]["lr"], 0.1);
  EXPECT_EQ(j["run"]["trace"], false);
  EXPECT_EQ(j["data"]["mean"], nlohmann::json::array());
  EXPECT_EQ(j["debug"]["fail_rank"], -1);
  size_t keys = 0;
  for (const auto& section : j) keys += section.size();
  EXPECT_EQ(keys, config_reference().size());
}

TEST(ConfigEnums, SpellingsRoundTrip) {
  EXPECT_EQ(to_string(MemoryPolicy::kVdnnConv), "vdnn-conv");
  EXPECT_EQ(from_string<MemoryPolicy>("vdnn-all"), MemoryPolicy::kVdnnAll);
  EXPECT_EQ(from_string<MemoryPolicy>("VDNN-ALL"), std::nullopt);
  EXPECT_EQ(to_string(Backend::kCuda), "cuda");
  EXPECT_EQ(to_string(LinkSchedulerKind::kFifo), "fifo");
  EXPECT_EQ(from_string<LinkSchedulerKind>("topology"), LinkSchedulerKind::kTopology);
  EXPECT_EQ(enum_spellings<ScheduleKind>(),
            (std::vector<std::string>{"constant", "step", "cosine"}));
  for (const auto& name : enum_spellings<CommBackend>())
    EXPECT_EQ(to_string(*from_string<CommBackend>(name)), name);
}

}  // namespace
}  // namespace ferry
