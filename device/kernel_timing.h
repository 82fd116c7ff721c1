// Measuring a device: how long one kernel launch of a given geometry takes, and how fast pinned
// host memory and device memory exchange bytes per direction (Note [Measuring on any backend]).
// Invariant: a measurement leaves the device as it found it (scratch released, streams idle).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "device/device.h"

// Note [Measuring on any backend]
// Works on any backend through the Device interface: scratch operands come from the device heap,
// times from timing events.

namespace ferry {

// A launch's cost identity: the kernel kind and every argument that changes its work (shapes,
// whether optional operands are present, optimizer flags), never addresses or values such as
// the learning rate. Two launches with equal keys cost the same on one device.
// "conv_forward n=256 c=3 h=224 w=224 k=64 r=3 s=3 st=1x1 pad=1x1 g=1 bias=1".
std::string kernel_key(const KernelArgs& args);

struct KernelTiming {
  double seconds = 0;  // per launch
  int launches = 0;    // timed launches in all rounds
  int retimed = 0;     // sets of rounds timed again because the rounds disagreed
};

// Note [Timing a kernel robustly]
// One launch can be far slower than the kernel's own cost: a cold cache, a lazily built
// algorithm, a machine busy for a moment. Sizing every round from that one launch left a short
// kernel one launch per round, so the rounds measured the timer's overhead with it (issue 27
// item 8: predicted / measured 63.78 on a first run, 0.38-0.39 later). So: kProbes rounds of one
// launch each, the fastest sizes the rounds; kRounds rounds of that many launches; when the
// slowest round is more than kDisagree times the fastest, the set is timed again (at most
// kRetimes times); the kernel's time is the fastest round's mean per launch.
//
// The measuring loop with its clock as a seam: `round(launches)` runs `launches` back-to-back
// launches and returns the seconds per launch it measured.
KernelTiming time_rounds(const std::function<double(int launches)>& round, double target_seconds);

// Runs `args` on the device's compute stream with scratch operands (filled with benign values:
// ones, zeros for labels and masks) after one warm-up launch, and returns the mean time per
// launch from timing events by time_rounds (Note [Timing a kernel robustly]): each round
// about `target_seconds` long for short kernels (at most 20 launches). The addresses in `args` are
// ignored. Throws OutOfMemoryError when the operands do not fit the device's free memory,
// UnsupportedError when the backend lacks the kernel.
KernelTiming time_kernel(Device& device, const KernelArgs& args, double target_seconds = 2e-3);

// GB/s of `bytes` copied between pinned host memory and device memory on the direction's copy
// stream (StreamKind::kDeviceToHost when to_host), best of `repeats` timed copies after one
// warm-up.
double time_copy(Device& device, bool to_host, uint64_t bytes, int repeats = 3);

}  // namespace ferry
