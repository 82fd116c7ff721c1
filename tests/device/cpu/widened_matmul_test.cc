// device/cpu/widened_matmul.cc: bf16 linear layers and convolutions run as fp32 primitives on
// widened operands give exactly the fp32 kernel's bits on the bf16 values, rounded once, in
// row chunks or whole; oneDNN's native bf16 primitives stay within bf16 rounding of them.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "device/cpu/bf16_storage.h"
#include "device/cpu/cpu_kernels_impl.h"
#include "device/kernel_checks.h"
#include "tests/device/cpu/kernel_test_util.h"

namespace ferry {
namespace {

using namespace test;  // kernel_test_util.h
using cpu::Bf16Products;

// `v` rounded to bf16 and widened back: what a kernel writing bf16 storage holds.
std::vector<float> rounded(const std::vector<float>& v) { return Bf16(v).values(); }

// Runs kernels with exactly the workspace each asks for, poisoned so that a read of staging
// the kernel did not write shows.
class Runner {
 public:
  explicit Runner(Bf16Products products) : kernels_(kThreads, products) {}
  template <typename Args>
  void run(Args args) {
    const uint64_t bytes = kernels_.workspace_bytes(args);
    ws_.assign(bytes, std::byte{0xff});
    args.ws = Workspace{ws_.data(), bytes};
    kernels_.run(args);
  }
  cpu::CpuKernels& kernels() { return kernels_; }

 private:
  cpu::CpuKernels kernels_;
  std::vector<std::byte> ws_;
};

class WidenedBf16 : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!widened.kernels().supports(kernel_kind<LinearForward>(), DType::kBF16)) {
      GTEST_SKIP() << "this CPU has no avx512_bf16: no bf16 kernels to test";
    }
  }
  Runner widened{Bf16Products::kWidened};
  Runner native{Bf16Products::kNative};
  Runner fp32{Bf16Products::kAuto};  // runs fp32 only
};

// One bf16 kernel's bf16 output against the fp32 kernel's on the same values: bitwise for the
// widened kernel, within bf16 rounding for the native one.
void expect_rounded_fp32(const Bf16& widened, const Bf16& native, const std::vector<float>& f32) {
  EXPECT_TRUE(bitwise_equal(widened.values(), rounded(f32)));
  EXPECT_TRUE(all_close(native.values(), to_f64(f32), 8e-3, 1e-3));
}

TEST_F(WidenedBf16, LinearIsTheFp32KernelOnTheBf16ValuesRoundedOnce) {
  // The 600-row shapes run in several row chunks (and a shorter last one) in every pass.
  ASSERT_LT(cpu::widened_chunk_rows(600, 48, 1000, 4 * 48 * 1000), 600);
  ASSERT_LT(cpu::widened_chunk_rows(1000, 600, 0, 4 * 600 * 48), 1000);  // fp32 dw
  uint32_t seed = 10;
  for (const LinearGeom& g : {LinearGeom{5, 33, 17}, LinearGeom{64, 96, 40, true},
                              LinearGeom{600, 48, 1000}, LinearGeom{600, 48, 1000, true}}) {
    SCOPED_TRACE(fmt::format("M={} K={} N={} in_out={}", g.m, g.k, g.n, g.weight_in_out));
    Bf16 x(random_floats(g.m * g.k, seed++)), w(random_floats(g.n * g.k, seed++));
    Bf16 dy(random_floats(g.m * g.n, seed++));
    const auto bias = random_floats(g.n, seed++);
    auto x32 = x.values(), w32 = w.values(), dy32 = dy.values();
    const DType bf = DType::kBF16;

    std::vector<float> y32(g.m * g.n);
    fp32.run(LinearForward{g, x32.data(), w32.data(), bias.data(), y32.data()});
    Bf16 yw(g.m * g.n), yn(g.m * g.n);
    widened.run(LinearForward{g, x.ptr(), w.ptr(), bias.data(), yw.ptr(), {}, bf});
    native.run(LinearForward{g, x.ptr(), w.ptr(), bias.data(), yn.ptr(), {}, bf});
    expect_rounded_fp32(yw, yn, y32);

    std::vector<float> dx32(g.m * g.k);
    fp32.run(LinearBackwardData{g, dy32.data(), w32.data(), dx32.data()});
    Bf16 dxw(g.m * g.k), dxn(g.m * g.k);
    widened.run(LinearBackwardData{g, dy.ptr(), w.ptr(), dxw.ptr(), {}, bf});
    native.run(LinearBackwardData{g, dy.ptr(), w.ptr(), dxn.ptr(), {}, bf});
    expect_rounded_fp32(dxw, dxn, dx32);

    // dw and dbias are fp32 in either storage: the widened ones are the fp32 kernel's bits.
    std::vector<float> dw32(g.n * g.k), db32(g.n), dww(dw32.size(), NAN), dbw(g.n, NAN);
    std::vector<float> dwn(dw32.size(), NAN), dbn(g.n, NAN);
    fp32.run(LinearBackwardWeights{g, x32.data(), dy32.data(), dw32.data(), db32.data()});
    widened.run(LinearBackwardWeights{g, x.ptr(), dy.ptr(), dww.data(), dbw.data(), {}, bf});
    native.run(LinearBackwardWeights{g, x.ptr(), dy.ptr(), dwn.data(), dbn.data(), {}, bf});
    EXPECT_TRUE(bitwise_equal(dww, dw32));
    EXPECT_TRUE(bitwise_equal(dbw, db32));
    EXPECT_TRUE(all_close(dwn, to_f64(dw32), 1e-4, 1e-4));
    EXPECT_TRUE(bitwise_equal(dbn, db32));
  }
}

TEST_F(WidenedBf16, ConvolutionIsTheFp32KernelOnTheBf16ValuesRoundedOnce) {
  const ConvGeom shapes[] = {
      {.n = 2, .c = 3, .h = 9, .w = 9, .k = 16, .r = 3, .s = 3, .pad_h = 1, .pad_w = 1},
      {.n = 2,
       .c = 32,
       .h = 8,
       .w = 8,
       .k = 64,
       .r = 3,
       .s = 3,
       .stride_h = 2,
       .stride_w = 2,
       .pad_h = 1,
       .pad_w = 1},
      {.n = 3, .c = 16, .h = 6, .w = 6, .k = 32, .r = 1, .s = 1},
      {.n = 2,
       .c = 8,
       .h = 6,
       .w = 6,
       .k = 8,
       .r = 3,
       .s = 3,
       .pad_h = 1,
       .pad_w = 1,
       .groups = 2}};
  uint32_t seed = 50;
  for (const ConvGeom& g : shapes) {
    SCOPED_TRACE(conv_geom_text(g));
    const int64_t xs = g.n * g.c * g.h * g.w, ws = g.k * (g.c / g.groups) * g.r * g.s;
    const int64_t ys = g.n * g.k * g.out_h() * g.out_w();
    Bf16 x(random_floats(xs, seed++)), w(random_floats(ws, seed++)), dy(random_floats(ys, seed++));
    const auto bias = random_floats(g.k, seed++);
    auto x32 = x.values(), w32 = w.values(), dy32 = dy.values();
    const DType bf = DType::kBF16;

    std::vector<float> y32(ys);
    fp32.run(ConvForward{g, x32.data(), w32.data(), bias.data(), y32.data()});
    Bf16 yw(ys), yn(ys);
    widened.run(ConvForward{g, x.ptr(), w.ptr(), bias.data(), yw.ptr(), {}, bf});
    native.run(ConvForward{g, x.ptr(), w.ptr(), bias.data(), yn.ptr(), {}, bf});
    expect_rounded_fp32(yw, yn, y32);

    std::vector<float> dx32(xs);
    fp32.run(ConvBackwardData{g, dy32.data(), w32.data(), dx32.data()});
    Bf16 dxw(xs), dxn(xs);
    widened.run(ConvBackwardData{g, dy.ptr(), w.ptr(), dxw.ptr(), {}, bf});
    native.run(ConvBackwardData{g, dy.ptr(), w.ptr(), dxn.ptr(), {}, bf});
    expect_rounded_fp32(dxw, dxn, dx32);

    std::vector<float> dw32(ws), db32(g.k), dww(ws, NAN), dbw(g.k, NAN), dwn(ws, NAN);
    std::vector<float> dbn(g.k, NAN);
    fp32.run(ConvBackwardWeights{g, x32.data(), dy32.data(), dw32.data(), db32.data()});
    widened.run(ConvBackwardWeights{g, x.ptr(), dy.ptr(), dww.data(), dbw.data(), {}, bf});
    native.run(ConvBackwardWeights{g, x.ptr(), dy.ptr(), dwn.data(), dbn.data(), {}, bf});
    EXPECT_TRUE(bitwise_equal(dww, dw32));
    EXPECT_TRUE(bitwise_equal(dbw, db32));
    EXPECT_TRUE(all_close(dwn, to_f64(dw32), 1e-4, 1e-4));
    EXPECT_TRUE(all_close(dbn, to_f64(db32), 1e-5, 1e-5));
  }
}

TEST_F(WidenedBf16, StagingOfAWideOutputIsBoundedByTheChunk) {
  // A GPT-2 LM head over 8 x 1024 tokens: widening the whole (M, V) logits would stage 1.6 GB.
  const LinearGeom g{8192, 768, 50257};
  const uint64_t whole = static_cast<uint64_t>(g.m) * g.n * 4;
  const uint64_t b_bytes = static_cast<uint64_t>(g.k) * g.n * 4;  // the widened weights
  const int64_t rows = cpu::widened_chunk_rows(g.m, g.k, g.n, static_cast<int64_t>(b_bytes));
  EXPECT_LT(rows, g.m);
  // The widened weights, one chunk of x and y (at most B's bytes), and oneDNN's scratchpad.
  const uint64_t chunk = b_bytes + rows * (g.k + g.n) * 4;
  EXPECT_LE(rows * (g.k + g.n) * 4, static_cast<int64_t>(b_bytes));
  const uint64_t bytes = widened.kernels().workspace_bytes(
      LinearForward{g, nullptr, nullptr, nullptr, nullptr, {}, DType::kBF16});
  EXPECT_GE(bytes, chunk);
  EXPECT_LT(bytes, chunk + (uint64_t{64} << 20));
  EXPECT_LT(bytes, whole / 4);
}

TEST_F(WidenedBf16, AutoIsWidenedUnlessOneDnnUsesAmx) {
  // The fp32 runner was made with kAuto: its bf16 linear plans are the widened ones here.
  const LinearGeom g{600, 48, 1000};
  const LinearForward a{g, nullptr, nullptr, nullptr, nullptr, {}, DType::kBF16};
  const uint64_t auto_bytes = fp32.kernels().workspace_bytes(a);
  if (cpu::cpu_has_amx()) {
    EXPECT_EQ(auto_bytes, native.kernels().workspace_bytes(a));
  } else {
    EXPECT_EQ(auto_bytes, widened.kernels().workspace_bytes(a));
    EXPECT_NE(auto_bytes, native.kernels().workspace_bytes(a));
  }
}

}  // namespace
}  // namespace ferry
