// The cpu backend's bf16 check: /proc/cpuinfo's flags and oneDNN's effective instruction set.
// Invariant: both must allow avx512_bf16; either missing is named in the error.
#include "device/cpu/bf16_support.h"

#include <fstream>
#include <sstream>

#include <fmt/format.h>
#include <oneapi/dnnl/dnnl.hpp>

#include "common/error.h"

namespace ferry::cpu {

namespace {

bool has_flag(std::string_view flags, std::string_view flag) {
  std::istringstream words{std::string(flags)};
  std::string word;
  while (words >> word)
    if (word == flag) return true;
  return false;
}

}  // namespace

std::string bf16_gap(std::string_view cpu_flags, bool onednn_bf16) {
  if (!has_flag(cpu_flags, "avx512_bf16"))
    return "this CPU lacks the avx512_bf16 instructions (no avx512_bf16 in /proc/cpuinfo's "
           "flags)";
  if (!onednn_bf16)
    return "oneDNN may not use avx512_bf16 here (its effective ISA is below avx512_core_bf16: "
           "check ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA)";
  return "";
}

std::string bf16_gap_here() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  std::string flags;
  while (std::getline(in, line)) {
    if (line.rfind("flags", 0) == 0) {
      flags = line.substr(line.find(':') == std::string::npos ? line.size() : line.find(':') + 1);
      break;
    }
  }
  const auto isa = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto bf16 = static_cast<unsigned>(dnnl::cpu_isa::avx512_core_bf16);
  return bf16_gap(flags, (isa & bf16) == bf16);
}

void check_bf16_support() {
  const std::string gap = bf16_gap_here();
  if (gap.empty()) return;
  throw ConfigError(fmt::format("device.precision: bf16 on the cpu backend needs avx512_bf16, "
                                "but {}",
                                gap),
                    "set device.precision=fp32 on this machine (bf16 would run in slow "
                    "emulation), or train on a CPU with avx512_bf16 (Cooper Lake, Sapphire "
                    "Rapids, Zen 4 or newer)");
}

}  // namespace ferry::cpu
