// Whether this CPU and oneDNN run bf16 at speed: device.precision bf16 on the cpu backend needs
// the avx512_bf16 instructions and a oneDNN allowed to use them. Invariant: a run that cannot is
// refused before training, never left to run slowly in emulation.
#pragma once

#include <string>
#include <string_view>

namespace ferry::cpu {

// "" when a CPU whose /proc/cpuinfo "flags" line is `cpu_flags` and a oneDNN whose effective ISA
// includes avx512_core_bf16 (`onednn_bf16`) run bf16; otherwise what is missing, for the error.
std::string bf16_gap(std::string_view cpu_flags, bool onednn_bf16);

// bf16_gap for this machine: the first "flags" line of /proc/cpuinfo and oneDNN's effective ISA
// (which ONEDNN_MAX_CPU_ISA / DNNL_MAX_CPU_ISA may lower).
std::string bf16_gap_here();

// Throws ConfigError (exit 2) naming the missing feature when bf16_gap_here() is not empty.
void check_bf16_support();

}  // namespace ferry::cpu
