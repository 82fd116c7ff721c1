// The Llama kernels in bf16 storage (kernels_bf16.cc's RMSNorm, rotary qkv and SwiGLU variants):
// bit for bit the fp32 kernel on the same bf16 values rounded once, fp32 statistics and weight
// gradients, and within one bf16 rounding of the float64 references of Hugging Face's formulas.
#include <gtest/gtest.h>

#include <cmath>

#include "device/cpu/bf16_storage.h"
#include "tests/device/cpu/kernel_test_util.h"
#include "tests/device/cpu/llama_reference.h"

namespace ferry {
namespace {

using namespace test;  // kernel_test_util.h

constexpr DType kBf = DType::kBF16;
// One rounding to bf16 (2^-9 relative) with margin, as kernels_bf16_test.cc.
constexpr double kRel = 8e-3;
constexpr double kAbs = 1e-3;

// The bits of fp32 values rounded once to bf16.
std::vector<uint16_t> rounded(const std::vector<float>& v) { return Bf16(v).bits; }

class LlamaBf16Kernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!k.kernels().supports(kernel_kind<ConvForward>(), DType::kBF16)) {
      GTEST_SKIP() << "this CPU has no avx512_bf16: no bf16 kernels to test";
    }
  }
  KernelRunner k;
};

TEST_F(LlamaBf16Kernels, EveryLlamaKernelRunsInBf16) {
  for (KernelKind kind : {kernel_kind<RmsNormForward>(), kernel_kind<RmsNormBackward>(),
                          kernel_kind<RopeQkvForward>(), kernel_kind<RopeQkvBackward>(),
                          kernel_kind<SwigluForward>(), kernel_kind<SwigluBackward>()}) {
    EXPECT_TRUE(k.kernels().supports(kind, kBf)) << kernel_name(kind);
  }
}

TEST_F(LlamaBf16Kernels, RmsNormIsTheFp32KernelRoundedOnceWithFp32Statistics) {
  for (const auto& [rows, c] : {std::pair<int64_t, int64_t>{1, 1}, {37, 100}, {70, 576}}) {
    SCOPED_TRACE(testing::Message() << rows << "x" << c);
    const RmsNormGeom g{rows, c, 1e-5f};
    const size_t n = static_cast<size_t>(rows * c);
    Bf16 x(random_floats(n, 801, -2.0f, 2.0f)), dy(random_floats(n, 802)), y(n), dx(n);
    const auto w = random_floats(c, 803, 0.5f, 1.5f);
    std::vector<float> rstd(rows, NAN), dw(c, NAN);
    k.run(RmsNormForward{g, x.ptr(), w.data(), y.ptr(), rstd.data(), kBf});
    k.run(RmsNormBackward{g, x.ptr(), dy.ptr(), w.data(), rstd.data(), dx.ptr(), dw.data(), kBf});

    // The fp32 kernel on the same (bf16) values.
    const auto xf = x.values(), dyf = dy.values();
    std::vector<float> y32(n), rstd32(rows), dx32(n), dw32(c);
    k.run(RmsNormForward{g, xf.data(), w.data(), y32.data(), rstd32.data()});
    k.run(RmsNormBackward{g, xf.data(), dyf.data(), w.data(), rstd32.data(), dx32.data(),
                          dw32.data()});
    EXPECT_EQ(y.bits, rounded(y32));
    EXPECT_EQ(dx.bits, rounded(dx32));
    EXPECT_TRUE(bitwise_equal(rstd, rstd32));  // fp32, not rounded
    EXPECT_TRUE(bitwise_equal(dw, dw32));      // fp32 weight gradient
    EXPECT_NE(y.bits, rounded(std::vector<float>(n, 0.0f)));

    const auto ry = ref::rms_norm_forward(to_f64(xf), to_f64(w), rows, c, 1e-5);
    EXPECT_TRUE(all_close(y.values(), ry, kRel, kAbs));

    // In place (dx = dy) gives the same bits.
    Bf16 inplace = dy;
    k.run(RmsNormBackward{g, x.ptr(), inplace.ptr(), w.data(), rstd.data(), inplace.ptr(),
                          dw.data(), kBf});
    EXPECT_EQ(inplace.bits, dx.bits);
  }
}

TEST_F(LlamaBf16Kernels, RopeQkvIsTheFp32KernelRoundedOnce) {
  struct Case {
    int64_t n, t, heads, kv, d;
    bool packed;
  };
  for (const Case& rc : {Case{2, 9, 6, 2, 8, false}, Case{1, 20, 4, 1, 6, true}}) {
    SCOPED_TRACE(testing::Message() << rc.heads << "/" << rc.kv << " heads, d " << rc.d);
    const RopeGeom g{rc.n, rc.t, rc.heads, rc.kv, rc.d, 10000.0f};
    const int64_t rows = rc.n * rc.t, qw = g.q_width(), kvw = g.kv_width();
    std::vector<int32_t> segments;
    std::vector<int64_t> positions;
    for (int64_t r = 0; r < rows; ++r) {
      segments.push_back(rc.packed ? static_cast<int32_t>((r % rc.t) / 5 * 5) : 0);
      positions.push_back(r % rc.t - segments.back());
    }
    const int32_t* seg = rc.packed ? segments.data() : nullptr;
    Bf16 q(random_floats(rows * qw, 811)), kk(random_floats(rows * kvw, 812)),
        v(random_floats(rows * kvw, 813)), dqkv(random_floats(rows * 3 * qw, 814));
    Bf16 qkv(rows * 3 * qw), dq(rows * qw), dk(rows * kvw), dv(rows * kvw);
    k.run(RopeQkvForward{g, q.ptr(), kk.ptr(), v.ptr(), qkv.ptr(), seg, kBf});
    k.run(RopeQkvBackward{g, dqkv.ptr(), dq.ptr(), dk.ptr(), dv.ptr(), seg, kBf});

    const auto qf = q.values(), kf = kk.values(), vf = v.values(), gf = dqkv.values();
    std::vector<float> qkv32(qkv.bits.size()), dq32(dq.bits.size()), dk32(dk.bits.size()),
        dv32(dv.bits.size());
    k.run(RopeQkvForward{g, qf.data(), kf.data(), vf.data(), qkv32.data(), seg});
    k.run(RopeQkvBackward{g, gf.data(), dq32.data(), dk32.data(), dv32.data(), seg});
    EXPECT_EQ(qkv.bits, rounded(qkv32));
    EXPECT_EQ(dq.bits, rounded(dq32));
    EXPECT_EQ(dk.bits, rounded(dk32));
    EXPECT_EQ(dv.bits, rounded(dv32));
    const auto rq = ref::rope_qkv_forward(to_f64(qf), to_f64(kf), to_f64(vf), positions, rc.heads,
                                          rc.kv, rc.d, 10000.0);
    EXPECT_TRUE(all_close(qkv.values(), rq, kRel, kAbs));

    // A gradient not wanted (null) is not written; the others are unchanged.
    Bf16 dk_only(rows * kvw);
    k.run(RopeQkvBackward{g, dqkv.ptr(), nullptr, dk_only.ptr(), nullptr, seg, kBf});
    EXPECT_EQ(dk_only.bits, dk.bits);
  }
}

TEST_F(LlamaBf16Kernels, SwigluIsTheFp32KernelRoundedOnce) {
  for (const size_t n : {size_t{1}, size_t{1000}, size_t{65537}}) {
    SCOPED_TRACE(n);
    const auto count = static_cast<int64_t>(n);
    Bf16 gate(random_floats(n, 821, -8.0f, 8.0f)), up(random_floats(n, 822)),
        dy(random_floats(n, 823)), y(n), dgate(n), dup(n);
    k.run(SwigluForward{count, gate.ptr(), up.ptr(), y.ptr(), kBf});
    k.run(SwigluBackward{count, gate.ptr(), up.ptr(), dy.ptr(), dgate.ptr(), dup.ptr(), kBf});
    const auto gf = gate.values(), uf = up.values(), df = dy.values();
    std::vector<float> y32(n), dgate32(n), dup32(n);
    k.run(SwigluForward{count, gf.data(), uf.data(), y32.data()});
    k.run(SwigluBackward{count, gf.data(), uf.data(), df.data(), dgate32.data(), dup32.data()});
    EXPECT_EQ(y.bits, rounded(y32));
    EXPECT_EQ(dgate.bits, rounded(dgate32));
    EXPECT_EQ(dup.bits, rounded(dup32));
    EXPECT_TRUE(all_close(y.values(), ref::swiglu_forward(to_f64(gf), to_f64(uf)), kRel, kAbs));
    // dgate in place over dy.
    Bf16 inplace = dy;
    k.run(
        SwigluBackward{count, gate.ptr(), up.ptr(), inplace.ptr(), inplace.ptr(), dup.ptr(), kBf});
    EXPECT_EQ(inplace.bits, dgate.bits);
  }
}

}  // namespace
}  // namespace ferry
