// The backend-neutral kernel argument checks (device/kernel_checks.h): the rules both backends
// rely on, and the exact text of the messages they share.
#include "device/kernel_checks.h"

#include <gtest/gtest.h>

#include <string>

#include "common/error.h"

namespace ferry {
namespace {

template <typename E, typename F>
std::string error_text(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "nothing thrown";
  return {};
}

TEST(KernelChecks, WorkspaceMessageNamesTheKernelTheNeedAndWhatWasGiven) {
  char bytes[64];
  check_workspace(Workspace{}, 0, "conv_forward");  // needs none: nothing to check
  check_workspace(Workspace{bytes, 64}, 64, "linear_forward");
  EXPECT_EQ(error_text<UnsupportedError>([&] {
              check_workspace(Workspace{bytes, 63}, 64, "linear_forward");
            }),
            "linear_forward needs 64 bytes (64 B) of workspace, was given 63 bytes");
  // A null pointer holds nothing, whatever its size says.
  EXPECT_EQ(error_text<UnsupportedError>([&] {
              check_workspace(Workspace{nullptr, 64}, 64, "conv_forward", "N=1");
            }),
            "conv_forward needs 64 bytes (64 B) of workspace for N=1, was given 0 bytes");
}

TEST(KernelChecks, ConvolutionKernelMustFitThePaddedInputUnderAStride) {
  ConvGeom g;
  g.h = 2;
  g.r = 3;
  g.stride_h = 2;  // (2 - 3) / 2 + 1 rounds up to one output row
  ASSERT_EQ(g.out_h(), 1);
  EXPECT_EQ(error_text<ConfigError>([&] { check_conv_geom(g, "conv_forward"); }),
            "conv_forward: invalid convolution (N=1 C=1 H=2 W=1 K=1 3x1 stride 2x1 pad 0x0 "
            "groups 1)");
  g.pad_h = 1;  // 4 padded rows hold the kernel
  check_conv_geom(g, "conv_forward");
}

TEST(KernelChecks, PoolingWindowsFollowPyTorchWhenTheKernelIsWiderThanTheInput) {
  // torch.nn.functional.max_pool2d on 2x2 with kernel 3, stride 2: "Output size is too small"
  // without padding or ceil mode; one output row with either.
  PoolGeom g;
  g.h = g.w = 2;
  g.kh = g.kw = 3;
  g.stride_h = g.stride_w = 2;
  EXPECT_EQ(g.out_h(), 0);
  EXPECT_THROW(check_pool_geom(g, "max_pool_forward"), ConfigError);
  g.ceil_mode = true;
  EXPECT_EQ(g.out_h(), 1);
  check_pool_geom(g, "max_pool_forward");
  g.ceil_mode = false;
  g.pad_h = g.pad_w = 1;
  EXPECT_EQ(g.out_h(), 1);
  check_pool_geom(g, "max_pool_forward");
  // Stride 1, kernel 3 on 2 rows: no window either.
  g.pad_h = g.pad_w = 0;
  g.stride_h = g.stride_w = 1;
  EXPECT_EQ(g.out_h(), 0);
}

TEST(KernelChecks, OptimizerAndDropoutArguments) {
  EXPECT_EQ(error_text<ConfigError>([] { check_sgd_update(SgdUpdate{.n = -2}); }),
            "sgd_update: negative element count -2");
  EXPECT_EQ(error_text<ConfigError>([] { check_sgd_update(SgdUpdate{.n = 4, .momentum = 0.5f}); }),
            "sgd_update: momentum is set but there is no momentum buffer");
  EXPECT_EQ(error_text<ConfigError>([] { check_adamw_update(AdamWUpdate{.n = 4, .step = 0}); }),
            "adamw_update: step 0 (steps count from 1)");
  EXPECT_EQ(
      error_text<ConfigError>([] { check_dropout_forward(DropoutForward{.n = 4, .p = -0.5f}); }),
      "dropout_forward: p = -0.5 is not a probability");
  check_dropout_forward(DropoutForward{.n = 0, .p = 1.0f});
}

}  // namespace
}  // namespace ferry
