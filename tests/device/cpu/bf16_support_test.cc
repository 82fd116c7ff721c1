// device/cpu/bf16_support.h: device.precision bf16 on the cpu backend needs avx512_bf16 in the
// CPU's flags and in oneDNN's effective ISA; the error names what is missing.
#include "device/cpu/bf16_support.h"

#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "common/error.h"
#include "device/device.h"

namespace ferry::cpu {
namespace {

TEST(Bf16Support, NamesTheMissingFeature) {
  const std::string flags = "fpu vme avx512f avx512_vnni avx512_bf16 amx_tile";
  EXPECT_EQ(bf16_gap(flags, true), "");
  EXPECT_NE(bf16_gap(flags, false).find("oneDNN"), std::string::npos);
  EXPECT_NE(bf16_gap(flags, false).find("avx512_core_bf16"), std::string::npos);
  // A flag is a whole word: avx512_bf16x or a prefix does not count.
  for (const std::string without :
       {"fpu avx512f avx512_vnni", "avx512_bf16x avx512f", "", "avx512_bf1 amx_bf16"}) {
    const std::string gap = bf16_gap(without, true);
    EXPECT_NE(gap.find("lacks the avx512_bf16 instructions"), std::string::npos) << without;
  }
}

bool cpuinfo_has_avx512_bf16() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("flags", 0) == 0) return (line + " ").find(" avx512_bf16 ") != std::string::npos;
  return false;
}

// This machine: the check agrees with /proc/cpuinfo (oneDNN's ISA is not limited in tests), and
// creating a bf16 cpu device succeeds exactly when it does.
TEST(Bf16Support, ThisMachine) {
  const bool has = cpuinfo_has_avx512_bf16();
  EXPECT_EQ(bf16_gap_here().empty(), has) << bf16_gap_here();
  DeviceOptions options;
  options.memory = 1 << 20;
  options.precision = Precision::kBf16;
  if (has) {
    EXPECT_NO_THROW(create_device(options));
  } else {
    EXPECT_THROW(create_device(options), ConfigError);
  }
  options.precision = Precision::kFp32;
  EXPECT_NO_THROW(create_device(options));
}

}  // namespace
}  // namespace ferry::cpu
