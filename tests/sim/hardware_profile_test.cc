// Hardware profiles (--hardware FILE): every shipped profile loads; every key of a file reaches
// the profile and its CostModel (optional ones their defaults); a value outside its range
// (Note [Hardware profile ranges]), a repeated key, an unknown key or a missing one is one
// ConfigError naming the file, the line and the key, with a hint; an unknown name lists the
// shipped ones.
#include "sim/hardware_profile.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"
#include "prefetch/tape.h"
#include "tests/support/temp_dir.h"

namespace ferry {
namespace {

const std::string kGood =
    "name: test-gpu\n"
    "gpu: Test GPU 80GB\n"
    "device_memory: 80GiB\n"
    "compute:\n"
    "  op_tflops: {conv2d: 162}\n"
    "  default_tflops: 67\n"
    "  memory_gbps: 3000\n"
    "  op_memory_gbps: {batchnorm2d: 1000}\n"
    "  step_overhead_us: 8\n"
    "link:\n"
    "  to_host_gbps: 55\n"
    "  to_device_gbps: 49\n"
    "  duplex_factor: 0.84\n"
    "  nominal_gbps: 63\n"
    "host:\n"
    "  update_gbps: 57\n";

// `text` as a profile file in `dir`.
std::string profile_file(const testing::TempDir& dir, const std::string& text,
                         const std::string& name = "profile.yaml") {
  return dir.write(name, text);
}

// kGood with the line starting `key:` (after indentation) replaced by `line`.
std::string with(const std::string& key, const std::string& line) {
  std::string text = kGood;
  const size_t at = text.find(key + ":");
  EXPECT_NE(at, std::string::npos) << key;
  const size_t start = text.rfind('\n', at) + 1;
  text.replace(start, text.find('\n', at) - start, line);
  return text;
}

void expect_refused(const std::string& text, const std::string& needle) {
  const testing::TempDir dir;
  const std::string path = profile_file(dir, text);
  try {
    load_hardware_profile(path);
    ADD_FAILURE() << "accepted; expected an error containing '" << needle << "'";
  } catch (const ConfigError& e) {
    const std::string what = e.what();
    EXPECT_EQ(what.rfind(path + ":", 0), 0u) << "names the file: " << what;
    EXPECT_NE(what.find(needle), std::string::npos) << what;
    EXPECT_FALSE(e.hint().empty()) << what;
  }
}

TEST(HardwareProfile, TheShippedOnesAndAGoodFileLoad) {
  for (const std::string& name : hardware_profile_names()) {
    const HardwareProfile p = load_hardware_profile(name);
    EXPECT_GT(p.cost.compute_flops, 0) << name;
  }
  const testing::TempDir dir;
  const HardwareProfile p = load_hardware_profile(profile_file(dir, kGood));
  EXPECT_EQ(p.name, "test-gpu");
  EXPECT_DOUBLE_EQ(p.cost.step_overhead_s, 8e-6);
  EXPECT_DOUBLE_EQ(p.gpu_link.to_device_gbps, 49);
}

TEST(HardwareProfile, RatesOutsideTheirRangesAreRefused) {
  expect_refused(with("to_host_gbps", "  to_host_gbps: 1e-300"),
                 "link.to_host_gbps must be in [0.01, 1024] GB/s, got 1e-300");
  expect_refused(with("to_device_gbps", "  to_device_gbps: 1e-6"),
                 "link.to_device_gbps must be in [0.01, 1024] GB/s, got 1e-6");
  expect_refused(with("nominal_gbps", "  nominal_gbps: 5000"),
                 "link.nominal_gbps must be in [0.01, 1024] GB/s");
  expect_refused(with("duplex_factor", "  duplex_factor: 0.1"),
                 "link.duplex_factor must be in [0.5, 1], got 0.1");
  expect_refused(with("default_tflops", "  default_tflops: 1e-300"),
                 "compute.default_tflops must be in [0.01, 10000] TFLOP/s, got 1e-300");
  expect_refused(with("op_tflops", "  op_tflops: {conv2d: 1e9}"),
                 "compute.op_tflops.conv2d must be in [0.01, 10000] TFLOP/s");
  expect_refused(with("memory_gbps", "  memory_gbps: 1e-300"),
                 "compute.memory_gbps must be in [1, 100000] GB/s");
  expect_refused(with("op_memory_gbps", "  op_memory_gbps: {maxpool: 0.001}"),
                 "compute.op_memory_gbps.maxpool must be in [1, 100000] GB/s");
  expect_refused(with("step_overhead_us", "  step_overhead_us: -5"),
                 "compute.step_overhead_us must be in [0, 1000000] us, got -5");
  expect_refused(with("device_memory", "device_memory: 1KiB"),
                 "device_memory must be in [256MiB, 16TiB], got 1KiB");
  expect_refused(with("default_tflops", "  default_tflops: nan"), "compute.default_tflops");
  expect_refused(with("update_gbps", "  update_gbps: 0.5"),
                 "host.update_gbps must be in [1, 100000] GB/s, got 0.5");
}

TEST(HardwareProfile, RepeatedKeysAreRefused) {
  expect_refused(kGood + "name: other\n", "profile: duplicate key 'name' (first given at line 1)");
  expect_refused(with("memory_gbps", "  memory_gbps: 3000\n  memory_gbps: 1"),
                 "compute: duplicate key 'memory_gbps'");
  expect_refused(with("op_tflops", "  op_tflops: {conv2d: 162, conv2d: 1}"),
                 "compute.op_tflops: duplicate key 'conv2d'");
  expect_refused(with("to_host_gbps", "  to_host_gbps: 55\n  to_host_gbps: 1"),
                 "link: duplicate key 'to_host_gbps'");
}

// kGood without the line starting `key:` (after indentation).
std::string without(const std::string& key) {
  std::string text = kGood;
  const size_t at = text.find(key + ":");
  EXPECT_NE(at, std::string::npos) << key;
  const size_t start = text.rfind('\n', at) + 1;
  text.erase(start, text.find('\n', at) + 1 - start);
  return text;
}

// The message and hint of the ConfigError `f` throws; a test failure when it throws none.
template <typename F>
std::pair<std::string, std::string> config_error_of(F f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return {e.what(), e.hint()};
  }
  ADD_FAILURE() << "no ConfigError thrown";
  return {};
}

TEST(HardwareProfile, EveryKeyOfAFileReachesTheProfile) {
  const testing::TempDir dir;
  const std::string path = profile_file(dir, kGood);
  const HardwareProfile p = load_hardware_profile(path);
  EXPECT_EQ(p.name, "test-gpu");
  EXPECT_EQ(p.gpu, "Test GPU 80GB");
  EXPECT_EQ(p.source, path);
  EXPECT_EQ(p.device_memory, uint64_t{80} << 30);
  // TFLOP/s become FLOP/s; GB/s stay GB/s.
  EXPECT_DOUBLE_EQ(p.cost.compute_flops, 67e12);
  EXPECT_DOUBLE_EQ(p.cost.memory_gbps, 3000);
  using Rates = std::vector<std::pair<std::string, double>>;
  EXPECT_EQ(p.cost.op_flops, (Rates{{"conv2d", 162e12}}));
  EXPECT_EQ(p.cost.op_memory_gbps, (Rates{{"batchnorm2d", 1000}}));
  EXPECT_DOUBLE_EQ(p.gpu_link.to_host_gbps, 55);
  EXPECT_DOUBLE_EQ(p.gpu_link.to_device_gbps, 49);
  EXPECT_DOUBLE_EQ(p.gpu_link.duplex_factor, 0.84);
  EXPECT_TRUE(p.duplex_given);
  EXPECT_DOUBLE_EQ(p.nominal_gbps, 63);
  // The planner's one link rate is the slower direction; per-direction rates stay unset (0).
  EXPECT_DOUBLE_EQ(p.cost.link_gbps, 49);
  EXPECT_EQ(p.cost.link_gbps_to_host, 0);
  EXPECT_EQ(p.cost.link_gbps_to_device, 0);
  EXPECT_DOUBLE_EQ(p.cost.host_update_gbps, 57);
}

TEST(HardwareProfile, OptionalKeysTakeTheirDefaults) {
  const testing::TempDir dir;
  const std::string path = profile_file(dir,
                                        "compute: {default_tflops: 10, memory_gbps: 900}\n"
                                        "link: {to_host_gbps: 20, to_device_gbps: 25}\n",
                                        "minimal-gpu.yaml");
  const HardwareProfile p = load_hardware_profile(path);
  EXPECT_EQ(p.name, "minimal-gpu") << "the file's stem";
  EXPECT_EQ(p.gpu, "");
  EXPECT_EQ(p.device_memory, 0u);
  EXPECT_TRUE(p.cost.op_flops.empty());
  EXPECT_TRUE(p.cost.op_memory_gbps.empty());
  EXPECT_DOUBLE_EQ(p.cost.step_overhead_s, CostModel{}.step_overhead_s);
  EXPECT_DOUBLE_EQ(p.cost.host_update_gbps, CostModel{}.host_update_gbps);
  EXPECT_FALSE(p.duplex_given);
  EXPECT_DOUBLE_EQ(p.gpu_link.duplex_factor, 1.0) << "full duplex unless the file says";
  EXPECT_DOUBLE_EQ(p.nominal_gbps, 25) << "the faster direction";
  EXPECT_DOUBLE_EQ(p.cost.link_gbps, 20) << "the slower direction";
  EXPECT_DOUBLE_EQ(p.efficiency(TransferDirection::kToHost), 0.8);
  EXPECT_DOUBLE_EQ(p.efficiency(TransferDirection::kToDevice), 1.0);
}

TEST(HardwareProfile, EfficiencyIsEachDirectionsShareOfTheNominalRate) {
  const testing::TempDir dir;
  const HardwareProfile p = load_hardware_profile(profile_file(dir, kGood));
  EXPECT_DOUBLE_EQ(p.efficiency(TransferDirection::kToHost), 55.0 / 63);
  EXPECT_DOUBLE_EQ(p.efficiency(TransferDirection::kToDevice), 49.0 / 63);
  // A measured rate above the nominal one is a share of 1, not more.
  const HardwareProfile fast = load_hardware_profile(
      profile_file(dir, with("nominal_gbps", "  nominal_gbps: 50"), "fast.yaml"));
  EXPECT_DOUBLE_EQ(fast.efficiency(TransferDirection::kToHost), 1.0);
  EXPECT_DOUBLE_EQ(fast.efficiency(TransferDirection::kToDevice), 49.0 / 50);
  // No nominal rate known (a profile built in code): every copy at its full rate.
  EXPECT_DOUBLE_EQ(HardwareProfile{}.efficiency(TransferDirection::kToHost), 1.0);
}

TEST(HardwareProfile, TheProfileDrivesTheCostModelPerOpKind) {
  const testing::TempDir dir;
  const CostModel cost = load_hardware_profile(profile_file(dir, kGood)).cost;
  // A 1 GB tensor read and written by memory-bound steps; no bytes for the compute-bound ones.
  Tape tape;
  tape.tensors = {{"in", 500'000'000}, {"out", 500'000'000}, {"none", 0}};
  const auto step = [](const std::string& op, double flops, std::vector<int> reads,
                       std::vector<int> writes) {
    TapeStep s;
    s.op = op;
    s.name = op;
    s.flops = flops;
    s.reads = std::move(reads);
    s.writes = std::move(writes);
    return s;
  };
  // conv2d at its own 162 TFLOP/s, linear at the default 67, each plus the 8 us overhead.
  EXPECT_NEAR(cost.step_seconds(step("conv2d", 162e9, {2}, {2}), tape), 1e-3 + 8e-6, 1e-12);
  EXPECT_NEAR(cost.step_seconds(step("linear", 67e9, {2}, {2}), tape), 1e-3 + 8e-6, 1e-12);
  // batchnorm2d at its own 1000 GB/s, relu at the default 3000 GB/s.
  EXPECT_NEAR(cost.step_seconds(step("batchnorm2d", 0, {0}, {1}), tape), 1e-3 + 8e-6, 1e-12);
  EXPECT_NEAR(cost.step_seconds(step("relu", 0, {0}, {1}), tape), 1.0 / 3000 + 8e-6, 1e-12);
}

// compute.bf16 (device.precision bf16): its per-op rates replace the fp32 ones for the ops it
// names (adding ops the fp32 rates left at the default); fp32 takes the profile as it is; a
// profile without it refuses bf16 in one line naming the profile; the shipped A100 and H100 have
// their datasheet peaks, the V100 none.
TEST(HardwareProfile, Bf16RatesReplaceTheFp32OnesAndTheirAbsenceRefusesBf16) {
  const testing::TempDir dir;
  const std::string text =
      with("step_overhead_us",
           "  step_overhead_us: 8\n  bf16: {peak_tflops: 989, op_tflops: {conv2d: 324, "
           "attention: 633}}");
  const HardwareProfile p = load_hardware_profile(profile_file(dir, text));
  EXPECT_DOUBLE_EQ(p.bf16_peak_flops, 989e12);
  using Rates = std::vector<std::pair<std::string, double>>;
  EXPECT_EQ(profile_cost(p, Precision::kFp32).op_flops, (Rates{{"conv2d", 162e12}}));
  EXPECT_EQ(profile_cost(p, Precision::kBf16).op_flops,
            (Rates{{"conv2d", 324e12}, {"attention", 633e12}}));
  EXPECT_DOUBLE_EQ(profile_cost(p, Precision::kBf16).compute_flops, 67e12);
  const HardwareProfile none = load_hardware_profile(profile_file(dir, kGood, "none.yaml"));
  try {
    profile_cost(none, Precision::kBf16);
    ADD_FAILURE() << "a profile without compute.bf16 accepted bf16";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("hardware profile 'test-gpu' (Test GPU 80GB) has no bf16 "
                                         "rate"),
              std::string::npos)
        << e.what();
    EXPECT_NE(e.hint().find("device.precision=fp32"), std::string::npos);
  }
  EXPECT_DOUBLE_EQ(load_hardware_profile("a100-pcie4").bf16_peak_flops, 312e12);
  EXPECT_DOUBLE_EQ(load_hardware_profile("h100-pcie5").bf16_peak_flops, 989e12);
  EXPECT_THROW(profile_cost(load_hardware_profile("v100-pcie3"), Precision::kBf16), ConfigError);
  expect_refused(with("step_overhead_us", "  step_overhead_us: 8\n  bf16: {op_tflops: {}}"),
                 "compute.bf16.peak_tflops: required");
  expect_refused(with("step_overhead_us", "  step_overhead_us: 8\n  bf16: {peak_tflops: 9e9}"),
                 "compute.bf16.peak_tflops");
}

TEST(HardwareProfile, UnknownAndMissingKeysAreRefused) {
  expect_refused(kGood + "gpus: 8\n", "profile: unknown key 'gpus'");
  expect_refused(with("default_tflops", "  default_tflop: 67"),
                 "compute: unknown key 'default_tflop'");
  expect_refused(with("nominal_gbps", "  nominal: 63"), "link: unknown key 'nominal'");
  expect_refused(without("default_tflops"), "compute.default_tflops: required");
  expect_refused(without("memory_gbps"), "compute.memory_gbps: required");
  expect_refused(without("to_host_gbps"), "link.to_host_gbps: required");
  expect_refused(without("to_device_gbps"), "link.to_device_gbps: required");
  expect_refused("name: x\nlink: {to_host_gbps: 1, to_device_gbps: 1}\n", "compute: required");
  expect_refused("name: x\ncompute: {default_tflops: 1, memory_gbps: 10}\n", "link: required");
  // The nearest known key is the hint.
  const testing::TempDir dir;
  const auto [what, hint] =
      config_error_of([&] { load_hardware_profile(profile_file(dir, kGood + "gpus: 8\n")); });
  EXPECT_NE(hint.find("'gpu'"), std::string::npos) << what << " / " << hint;
}

TEST(HardwareProfile, NamesAreTheShippedFilesAndAnUnknownNameListsThem) {
  const std::vector<std::string> names = hardware_profile_names();
  ASSERT_FALSE(names.empty());
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_NE(std::find(names.begin(), names.end(), "h100-pcie5"), names.end());
  for (const std::string& name : names) {
    const HardwareProfile p = load_hardware_profile(name);
    EXPECT_EQ(p.name, name) << "a shipped file names itself after its file";
    EXPECT_EQ(p.cost.link_gbps, std::min(p.gpu_link.to_host_gbps, p.gpu_link.to_device_gbps));
    EXPECT_GT(p.device_memory, 0u) << name;
  }
  const auto [what, hint] = config_error_of([] { load_hardware_profile("no-such-gpu", "sim.hw"); });
  EXPECT_EQ(what, "sim.hw: unknown hardware profile 'no-such-gpu'");
  for (const std::string& name : names) EXPECT_NE(hint.find(name), std::string::npos) << hint;
  const auto [missing, missing_hint] =
      config_error_of([] { load_hardware_profile("/nonexistent/gpu.yaml"); });
  EXPECT_EQ(missing, "--hardware: cannot read hardware profile '/nonexistent/gpu.yaml'");
  EXPECT_FALSE(missing_hint.empty());
}

}  // namespace
}  // namespace ferry
