// The documented config error messages (Note [Config error messages] in docs/config.md, written
// from trainer/config/reference_notes.md), exactly: users grep for them.
#include <functional>

#include <gtest/gtest.h>

#include "tests/support/temp_dir.h"
#include "trainer/config/config.h"

namespace ferry {
namespace {

// what() of the ConfigError `f` throws, or a marker when it throws none.
std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "<no ConfigError>";
}

std::string hint_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.hint();
  }
  return "<no ConfigError>";
}

std::string error(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return error_of([&] { parse_config_text(text, overrides, "configs/x.yaml"); });
}

std::string override_error(const std::string& override_text) { return error("", {override_text}); }

TEST(ConfigErrors, UnknownKeyInFileNamesKeyFileLineAndNearest) {
  EXPECT_EQ(error("run:\n  steps: 3\noptim:\n  lr: 0.1\n  lrr: 0.2\n"),
            "unknown key 'optim.lrr' (configs/x.yaml:5); did you mean 'optim.lr'?");
  EXPECT_EQ(error("optimizer:\n  lr: 0.1\n"),
            "unknown key 'optimizer' (configs/x.yaml:1); did you mean 'optim'?");
  EXPECT_EQ(error("data:\n  batchsize: 8\n"),
            "unknown key 'data.batchsize' (configs/x.yaml:2); did you mean 'data.batch_size'?");
  EXPECT_EQ(error("optim.lrr: 0.1\n"),
            "unknown key 'optim.lrr' (configs/x.yaml:1); did you mean 'optim.lr'?");
  // Nothing close: no suggestion.
  EXPECT_EQ(error("zzzzzzzz:\n  q: 1\n"), "unknown key 'zzzzzzzz' (configs/x.yaml:1)");
  // A key written without its section.
  EXPECT_EQ(error("batch_size: 8\n"),
            "unknown key 'batch_size' (configs/x.yaml:1); did you mean 'data.batch_size'?");
  // The hint lists the section's keys.
  const std::string hint =
      hint_of([] { parse_config_text("optim:\n  lrr: 1\n", {}, "configs/x.yaml"); });
  EXPECT_NE(hint.find("keys of section 'optim': optim.name, optim.lr,"), std::string::npos) << hint;
}

TEST(ConfigErrors, UnknownKeyInOverride) {
  EXPECT_EQ(override_error("optim.lrr=0.1"),
            "unknown key 'optim.lrr' (override 'optim.lrr=0.1'); did you mean 'optim.lr'?");
  EXPECT_EQ(override_error("optimizer.lr=0.1"),
            "unknown key 'optimizer.lr' (override 'optimizer.lr=0.1'); did you mean 'optim.lr'?");
  EXPECT_EQ(override_error("optim=3"), "optim: is a section, not a key (override 'optim=3')");
}

TEST(ConfigErrors, DuplicateKeyInFile) {
  EXPECT_EQ(error("optim:\n  lr: 0.1\n  lr: 0.2\n"),
            "duplicate key 'optim.lr' (configs/x.yaml:3); first given at configs/x.yaml:2");
  EXPECT_EQ(error("optim:\n  lr: 0.1\noptim.lr: 0.2\n"),
            "duplicate key 'optim.lr' (configs/x.yaml:3); first given at configs/x.yaml:2");
  EXPECT_EQ(error("run:\n  steps: 1\noptim:\n  lr: 0.1\nrun:\n  seed: 2\n"),
            "duplicate key 'run' (configs/x.yaml:5); first given at configs/x.yaml:1");
  // An override may repeat a file's key or another override's: the last one wins.
  EXPECT_EQ(
      parse_config_text("run:\n  steps: 1\n", {"run.steps=2", "run.steps=3"}, "x.yaml").run.steps,
      3);
}

TEST(ConfigErrors, SectionOrDocumentNotAMap) {
  EXPECT_EQ(error("optim: 5\n"), "optim: expected a map of keys, got '5' (configs/x.yaml:1)");
  EXPECT_EQ(error("run:\n  steps: 2\noptim: [1, 2]\n"),
            "optim: expected a map of keys, got a list (configs/x.yaml:3)");
  EXPECT_EQ(error("- a\n- b\n"),
            "configs/x.yaml: expected a map of sections at the top level, got a list");
  EXPECT_EQ(error("run:\n  steps: 2\n---\nrun:\n  steps: 3\n"),
            "configs/x.yaml: expected one YAML document, found 2");
}

TEST(ConfigErrors, WrongType) {
  EXPECT_EQ(error("optim:\n  lr: fast\n"),
            "optim.lr: expected a number, got 'fast' (configs/x.yaml:2)");
  EXPECT_EQ(override_error("optim.lr=fast"),
            "optim.lr: expected a number, got 'fast' (override 'optim.lr=fast')");
  EXPECT_EQ(error("optim:\n  lr:\n"),
            "optim.lr: expected a number, got nothing (configs/x.yaml:2)");
  EXPECT_EQ(error("optim:\n  lr: [0.1]\n"),
            "optim.lr: expected a number, got a list (configs/x.yaml:2)");
  EXPECT_EQ(error("optim:\n  lr: inf\n"),
            "optim.lr: expected a finite number, got 'inf' (configs/x.yaml:2)");
  EXPECT_EQ(error("data:\n  batch_size: 1.5\n"),
            "data.batch_size: expected an integer, got '1.5' (configs/x.yaml:2)");
  EXPECT_EQ(error("run:\n  trace: yes\n"),
            "run.trace: expected true or false, got 'yes' (configs/x.yaml:2)");
  EXPECT_EQ(error("model:\n  name: {a: 1}\n"),
            "model.name: expected a string, got a map (configs/x.yaml:2)");
  EXPECT_EQ(error("model:\n  name: \"\"\n"), "model.name: must not be empty (configs/x.yaml:2)");
  EXPECT_EQ(override_error("run.seed=-1"),
            "run.seed: must be >= 0, got -1 (override 'run.seed=-1')");
  // The hint says what the key takes.
  EXPECT_EQ(hint_of([] { parse_config_text("", {"optim.lr=fast"}, "x.yaml"); }),
            "optim.lr takes a number > 0 (default 0.1). Base learning rate (after warm-up).");
}

TEST(ConfigErrors, OutOfRange) {
  EXPECT_EQ(error("data:\n  batch_size: 0\n"),
            "data.batch_size: must be >= 1, got 0 (configs/x.yaml:2)");
  EXPECT_EQ(override_error("optim.momentum=1"),
            "optim.momentum: must be in [0, 1), got 1 (override 'optim.momentum=1')");
  EXPECT_EQ(override_error("optim.gamma=0"),
            "optim.gamma: must be in (0, 1], got 0 (override 'optim.gamma=0')");
  EXPECT_EQ(override_error("optim.lr=0"), "optim.lr: must be > 0, got 0 (override 'optim.lr=0')");
  EXPECT_EQ(override_error("optim.weight_decay=-0.1"),
            "optim.weight_decay: must be >= 0, got -0.1 (override 'optim.weight_decay=-0.1')");
  EXPECT_EQ(override_error("device.memory=0"),
            "device.memory: must be >= 1, got 0 (override 'device.memory=0')");
}

// comm.timeout_s (the collective watchdog): 0 is off, else [1, 86400] seconds.
TEST(ConfigErrors, CommTimeout) {
  EXPECT_EQ(override_error("comm.timeout_s=-1"),
            "comm.timeout_s: must be in [0, 86400], got -1 (override 'comm.timeout_s=-1')");
  EXPECT_EQ(
      override_error("comm.timeout_s=1e9"),
      "comm.timeout_s: must be in [0, 86400], got 1000000000 (override 'comm.timeout_s=1e9')");
  EXPECT_EQ(override_error("comm.timeout_s=0.5"),
            "comm.timeout_s: must be 0 (off) or in [1, 86400] seconds, got 0.5 (override "
            "'comm.timeout_s=0.5')");
  EXPECT_NE(hint_of([] { parse_config_text("", {"comm.timeout_s=0.5"}, "x.yaml"); }), "");
  EXPECT_DOUBLE_EQ(parse_config_text("", {"comm.timeout_s=0"}, "x.yaml").comm.timeout_s, 0);
  EXPECT_DOUBLE_EQ(parse_config_text("", {"comm.timeout_s=1"}, "x.yaml").comm.timeout_s, 1);
  EXPECT_DOUBLE_EQ(parse_config_text("", {}, "x.yaml").comm.timeout_s, 300);
}

// device.precision and comm.dtype: fp32 by default; a bf16 all-reduce needs bf16 precision.
TEST(ConfigErrors, PrecisionAndCommDtype) {
  const Config defaults = parse_config_text("", {}, "x.yaml");
  EXPECT_EQ(defaults.device.precision, Precision::kFp32);
  EXPECT_EQ(defaults.comm.dtype, Precision::kFp32);
  const Config bf16 = parse_config_text("", {"device.precision=bf16", "comm.dtype=bf16"}, "x.yaml");
  EXPECT_EQ(bf16.device.precision, Precision::kBf16);
  EXPECT_EQ(bf16.comm.dtype, Precision::kBf16);
  EXPECT_EQ(parse_config_text("device:\n  precision: bf16\n", {}, "x.yaml").comm.dtype,
            Precision::kFp32);
  EXPECT_EQ(override_error("comm.dtype=bf16"),
            "comm.dtype: bf16 needs device.precision bf16, got fp32 (override "
            "'comm.dtype=bf16')");
  EXPECT_EQ(error("comm:\n  dtype: bf16\n", {"device.precision=fp32"}),
            "comm.dtype: bf16 needs device.precision bf16, got fp32 (configs/x.yaml:2)");
  EXPECT_NE(hint_of([] {
              parse_config_text("", {"comm.dtype=bf16"}, "x.yaml");
            }).find("device.precision=bf16"),
            std::string::npos);
  EXPECT_EQ(override_error("device.precision=fp16"),
            "device.precision: must be one of fp32|bf16, got 'fp16' (override "
            "'device.precision=fp16'); did you mean 'fp32'?");
}

TEST(ConfigErrors, ListValues) {
  EXPECT_EQ(override_error("model.input=[1,0,28]"),
            "model.input[1]: must be >= 1, got 0 (override 'model.input=[1,0,28]')");
  EXPECT_EQ(override_error("model.input=[1,28]"),
            "model.input: expected a list of 3 integers [C, H, W], got a list of 2 "
            "(override 'model.input=[1,28]')");
  EXPECT_EQ(override_error("model.input=1,28,28"),
            "model.input: expected a list of 3 integers [C, H, W], got '1,28,28' "
            "(override 'model.input=1,28,28')");
  EXPECT_EQ(error("model:\n  input:\n    - 3\n    - x\n    - 32\n"),
            "model.input[1]: expected an integer, got 'x' (configs/x.yaml:2)");
  EXPECT_EQ(override_error("data.std=[0.5, 0, 0.5]"),
            "data.std[1]: must be > 0, got 0 (override 'data.std=[0.5, 0, 0.5]')");
  EXPECT_EQ(override_error("data.mean=0.5"),
            "data.mean: expected a list of numbers, got '0.5' (override 'data.mean=0.5')");
}

TEST(ConfigErrors, BadChoiceListsTheAllowedOnes) {
  EXPECT_EQ(error("optim:\n  name: adam\n"),
            "optim.name: must be one of sgd|adamw, got 'adam' (configs/x.yaml:2); did you mean "
            "'adamw'?");
  EXPECT_EQ(override_error("memory.policy=vdnn"),
            "memory.policy: must be one of none|vdnn-conv|vdnn-all|auto, got 'vdnn' "
            "(override 'memory.policy=vdnn')");
  EXPECT_EQ(override_error("data.source=cifar"),
            "data.source: must be one of synthetic|idx|cifar10|imagefolder|tokens, got 'cifar' "
            "(override 'data.source=cifar'); did you mean 'cifar10'?");
}

TEST(ConfigErrors, MalformedSize) {
  EXPECT_EQ(error("device:\n  memory: 4 gigs\n"),
            "device.memory: expected a size such as 512MiB, 16GiB or a byte count, got '4 gigs' "
            "(configs/x.yaml:2)");
  EXPECT_EQ(override_error("memory.host_limit=-1GiB"),
            "memory.host_limit: expected a size such as 512MiB, 16GiB or a byte count, got "
            "'-1GiB' (override 'memory.host_limit=-1GiB')");
  EXPECT_EQ(override_error("device.memory=1.5"),
            "device.memory: expected a size such as 512MiB, 16GiB or a byte count, got '1.5' "
            "(override 'device.memory=1.5')");
}

TEST(ConfigErrors, MalformedOverride) {
  EXPECT_EQ(override_error("optim.lr"),
            "malformed override 'optim.lr': expected the form key=value, e.g. optim.lr=0.1");
  EXPECT_EQ(override_error("=5"),
            "malformed override '=5': expected the form key=value, e.g. optim.lr=0.1");
  const std::string e = override_error("model.input=[1,2");
  EXPECT_EQ(e.rfind("malformed value in override 'model.input=[1,2': ", 0), 0u) << e;
}

TEST(ConfigErrors, RequiredDataPath) {
  EXPECT_EQ(override_error("data.source=idx"), "data.path: required when data.source is idx");
  EXPECT_EQ(error("data:\n  source: cifar10\n"), "data.path: required when data.source is cifar10");
  EXPECT_EQ(override_error("data.source=imagefolder"),
            "data.path: required when data.source is imagefolder");
  EXPECT_EQ(override_error("data.crop=28"),
            "data.crop: must equal model.input's height and width (32 x 32) or be 0, got 28 "
            "(override 'data.crop=28')");
  EXPECT_NE(
      hint_of([] { parse_config_text("", {"data.source=idx"}, "x.yaml"); }).find("data.path="),
      std::string::npos);
}

TEST(ConfigErrors, TokenSourceKeys) {
  EXPECT_EQ(override_error("data.source=tokens"), "data.path: required when data.source is tokens");
  EXPECT_EQ(error("data:\n  source: tokens\n  path: t.bin\n  mean: [0.5]\n"),
            "data.mean: must be [] when data.source is tokens, got 1 value (configs/x.yaml:4)");
  EXPECT_EQ(error("data:\n  source: tokens\n  path: t.bin\n", {"data.std=[0.5, 0.5]"}),
            "data.std: must be [] when data.source is tokens, got 2 values (override "
            "'data.std=[0.5, 0.5]')");
  EXPECT_EQ(override_error("data.seq_len=-1"),
            "data.seq_len: must be in [0, 1048576], got -1 (override 'data.seq_len=-1')");
  const Config c = parse_config_text(
      "data:\n  source: tokens\n  path: t.bin\n  seq_len: 64\n"
      "  val_path: v.bin\n");
  EXPECT_EQ(c.data.source, DataSource::kTokens);
  EXPECT_EQ(c.data.seq_len, 64);
  EXPECT_EQ(c.data.val_path, "v.bin");
  // data.seq_len against model.context, where the model side resolves it.
  EXPECT_EQ(check_seq_len(0, 128), 128);
  EXPECT_EQ(check_seq_len(64, 128), 64);
  EXPECT_EQ(check_seq_len(128, 128), 128);
  EXPECT_EQ(error_of([] { check_seq_len(256, 128, " (configs/x.yaml:7)"); }),
            "data.seq_len: must be <= model.context (128), got 256 (configs/x.yaml:7)");
}

TEST(ConfigErrors, CrossKeyChecks) {
  EXPECT_EQ(error("model:\n  input: [1, 28, 28]\ndata:\n  mean: [0.5, 0.5, 0.5]\n"),
            "data.mean: needs one value per channel of model.input (1), got 3 (configs/x.yaml:4)");
  EXPECT_EQ(override_error("data.std=[0.2, 0.2]"),
            "data.std: needs one value per channel of model.input (3), got 2 "
            "(override 'data.std=[0.2, 0.2]')");
  EXPECT_EQ(override_error("memory.budget=8GiB"),
            "memory.budget: must be <= device.memory (4GiB), got 8GiB (override "
            "'memory.budget=8GiB')");
  // The budget given first, the memory lowered later: still caught, at the budget's place.
  EXPECT_EQ(error("memory:\n  budget: 2GiB\n", {"device.memory=1GiB"}),
            "memory.budget: must be <= device.memory (1GiB), got 2GiB (configs/x.yaml:2)");
  EXPECT_EQ(error("optim:\n  momentum: 0\n  nesterov: true\n"),
            "optim.nesterov: requires optim.momentum > 0 with optim.name sgd, got 0 "
            "(configs/x.yaml:3)");
  EXPECT_EQ(error("", {"optim.schedule=cosine", "optim.min_lr=0.5"}),
            "optim.min_lr: must be <= optim.lr (0.1) with the cosine schedule, got 0.5 "
            "(override 'optim.min_lr=0.5')");
  EXPECT_EQ(override_error("run.trace_steps=[5, 3]"),
            "run.trace_steps: first step must be <= last step, got [5, 3] "
            "(override 'run.trace_steps=[5, 3]')");
}

TEST(ConfigErrors, MalformedYamlHasFileAndLine) {
  // An unclosed flow list: yaml-cpp reports where the list ends without ']'.
  const std::string e = error("run:\n  steps: 3\nmodel:\n  input: [3, 32, 32\ndata:\n  x: 1\n");
  EXPECT_EQ(e.rfind("malformed YAML: ", 0), 0u) << e;
  EXPECT_NE(e.find("(configs/x.yaml:"), std::string::npos) << e;
  // A second ': ' on one line.
  EXPECT_EQ(error("run:\n  steps: 3\n  dir: x: y\n"),
            "malformed YAML: illegal map value (configs/x.yaml:3)");
  EXPECT_EQ(error("run:\n  steps: 3\n\tdir: x\n"),
            "malformed YAML: illegal tab when looking for indentation (configs/x.yaml:3)");
}

TEST(ConfigErrors, UnreadableFile) {
  EXPECT_EQ(error_of([] { load_config("/nonexistent/ferry/x.yaml"); }),
            "cannot read config file '/nonexistent/ferry/x.yaml': No such file or directory");
  const testing::TempDir scratch;
  const std::string dir = scratch.str();
  EXPECT_EQ(error_of([&] { load_config(dir); }),
            "cannot read config file '" + dir + "': it is a directory");
}

TEST(ConfigErrors, FileMessagesNameTheFile) {
  const testing::TempDir dir;
  const std::string path = dir.write("ferry_config_errors.yaml", "run:\n  steps: 0\n");
  EXPECT_EQ(error_of([&] { load_config(path); }),
            "run.steps: must be >= 1, got 0 (" + path + ":2)");
}

// Every prefix of a full config, and that config with single bytes replaced by YAML's special
// characters, either loads or is a ConfigError: no other exception and no crash.
// Regression (fuzzing): a string value that is not UTF-8 loaded, then to_json threw a
// nlohmann::json exception when the run wrote its resolved config.
TEST(ConfigErrors, StringThatIsNotUtf8) {
  EXPECT_EQ(error("run:\n  dir: a\xff\n"),
            "run.dir: expected UTF-8 text, got byte 0xff at offset 1 (configs/x.yaml:2)");
  EXPECT_EQ(override_error("run.dir=ab\xc3\x28"),
            "run.dir: expected UTF-8 text, got byte 0xc3 at offset 2 (override "
            "'run.dir=ab\xc3\x28')");
  // Overlong forms and surrogates are not UTF-8 either; real multi-byte text is.
  EXPECT_NE(override_error("run.dir=\xc0\xaf").find("byte 0xc0"), std::string::npos);
  EXPECT_NE(override_error("run.dir=\xed\xa0\x80").find("byte 0xed"), std::string::npos);
  EXPECT_EQ(parse_config_text("", {"run.dir=runs/\u00e9\u4e2d\U0001F600"}).run.dir,
            "runs/\u00e9\u4e2d\U0001F600");
}

TEST(ConfigErrors, DamagedFilesOnlyEverThrowConfigError) {
  Config c = default_config();
  c.data.mean = {0.5, 0.25, 0.125};
  c.model.init_from = "w: x.safetensors";
  const std::string yaml = to_yaml(c);
  size_t loaded = 0;
  size_t rejected = 0;
  const auto attempt = [&](const std::string& text) {
    try {
      parse_config_text(text, {}, "damaged.yaml");
      ++loaded;
    } catch (const ConfigError&) {
      ++rejected;
    } catch (const std::exception& e) {
      ADD_FAILURE() << "not a ConfigError: " << e.what() << "\nfor:\n" << text;
    }
  };
  for (size_t n = 0; n <= yaml.size(); ++n) attempt(yaml.substr(0, n));
  const std::string specials = ":-[]{},#&*!|>'\"%@` \t\n";
  for (size_t i = 0; i < yaml.size(); i += 3) {
    std::string damaged = yaml;
    damaged[i] = specials[i % specials.size()];
    attempt(damaged);
  }
  // Both outcomes happen: prefixes ending between keys load, most others do not.
  EXPECT_GT(loaded, 10u);
  EXPECT_GT(rejected, 100u);
}

}  // namespace
}  // namespace ferry
