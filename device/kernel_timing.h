// Measuring a device: how long one kernel launch of a given geometry takes, and how fast pinned
// host memory and device memory exchange bytes per direction. Works on any backend through the
// Device interface: scratch operands come from the device heap, times from timing events.
// Invariant: a measurement leaves the device as it found it (scratch released, streams idle).
#pragma once

#include <cstdint>
#include <string>

#include "device/device.h"

namespace ferry {

// A launch's cost identity: the kernel kind and every argument that changes its work (shapes,
// whether optional operands are present, optimizer flags), never addresses or values such as
// the learning rate. Two launches with equal keys cost the same on one device.
// "conv_forward n=256 c=3 h=224 w=224 k=64 r=3 s=3 st=1x1 pad=1x1 g=1 bias=1".
std::string kernel_key(const KernelArgs& args);

struct KernelTiming {
  double seconds = 0;  // per launch
  int launches = 0;    // timed launches in all rounds
};

// Runs `args` on the device's compute stream with scratch operands (filled with benign values:
// ones, zeros for labels and masks) after one warm-up launch, and returns the mean time per
// launch from timing events: the fastest of three rounds of back-to-back launches, each round
// about `target_seconds` long for short kernels (at most 20 launches). The addresses in `args` are
// ignored. Throws OutOfMemoryError when the operands do not fit the device's free memory,
// UnsupportedError when the backend lacks the kernel.
KernelTiming time_kernel(Device& device, const KernelArgs& args, double target_seconds = 2e-3);

// GB/s of `bytes` copied between pinned host memory and device memory on the direction's copy
// stream (StreamKind::kDeviceToHost when to_host), best of `repeats` timed copies after one
// warm-up.
double time_copy(Device& device, bool to_host, uint64_t bytes, int repeats = 3);

}  // namespace ferry
