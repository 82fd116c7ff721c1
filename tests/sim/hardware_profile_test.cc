// Hardware profiles (--hardware FILE): every shipped profile loads; a value outside its range
// (Note [Hardware profile ranges]), a repeated key or an unknown key is one ConfigError naming
// the file, the line and the key, with a hint.
#include "sim/hardware_profile.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <fstream>
#include <string>

#include "common/error.h"

namespace ferry {
namespace {

const std::string kGood =
    "name: test-gpu\n"
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
    "  nominal_gbps: 63\n";

std::string profile_file(const std::string& text) {
  static int n = 0;
  const std::string path = ::testing::TempDir() + "/ferry_" + std::to_string(::getpid()) +
                           "_profile_" + std::to_string(n++) + ".yaml";
  std::ofstream(path) << text;
  return path;
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
  const std::string path = profile_file(text);
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
  const HardwareProfile p = load_hardware_profile(profile_file(kGood));
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

}  // namespace
}  // namespace ferry
