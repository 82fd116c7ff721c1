// Tests that need a CUDA GPU: why they cannot run here, and a fixture that skips each of its
// tests, naming the missing resource, when the build has no CUDA backend or the machine no GPU.
// Needs ferry_device (or a library above it) from its user.
#pragma once

#include <string>

#include <gtest/gtest.h>

#include "device/backend_traits.h"
#include "device/device.h"

namespace ferry::testing {

// Why the GPU tests cannot run here, or "" when they can.
inline std::string gpu_skip_reason() {
  if (!backend_built(Backend::kCuda)) return "this build has no CUDA backend";
  if (cuda_device_count() == 0) return "no CUDA device present";
  return "";
}

// A fixture whose tests skip without a GPU.
class GpuTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string reason = gpu_skip_reason();
    if (!reason.empty()) GTEST_SKIP() << reason;
  }
};

}  // namespace ferry::testing
