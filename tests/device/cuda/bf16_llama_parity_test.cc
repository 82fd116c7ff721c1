// bf16 parity of the Llama kernels (llama.cu's RMSNorm, rotary qkv and SwiGLU as storage
// templates): each bf16 output is the target's own fp32 kernel on the same bf16 values rounded
// once (bit for bit everywhere: Note [bf16 storage in the CUDA kernels]), and against the CPU
// backend's bf16 kernels bitwise in the host emulation wherever the fp32 suite's results are
// the same bits there (kSameBitsAsCpu below), else within one bf16 rounding (Note [One bf16
// rounding apart] in bf16_helpers.h). RMSNorm's rstd and dweight stay fp32, compared as in fp32.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "device/kernels.h"
#include "tests/device/cuda/bf16_helpers.h"
#include "tests/device/cuda/parity_helpers.h"

// CudaBf16LlamaParityTest on the GPU, EmulatedCudaBf16LlamaParityTest for the host emulation.
#ifndef FERRY_BF16_LLAMA_SUITE
#define FERRY_BF16_LLAMA_SUITE CudaBf16LlamaParityTest
#endif

namespace ferry {
namespace {

constexpr DType kBf = DType::kBF16;

// Where the emulated fp32 kernels give the CPU backend's bits: rotary qkv (the same expressions
// on the same cos and sin; sums of repeats in the same order). RMSNorm sums its rows in double
// over 32 lanes where the CPU sums in float over its SIMD lanes, and SwiGLU's exp is the math
// library's where the CPU's is vec_math.h's: their fp32 results differ in the last places, so
// after one rounding they agree up to one bf16 step.
class FERRY_BF16_LLAMA_SUITE : public ParityFixture {
 public:
  static ::testing::AssertionResult matches_cpu(const Bits& gpu, const Bits& cpu,
                                                bool same_bits_when_emulated) {
    return kEmulated && same_bits_when_emulated ? bitwise(gpu, cpu) : bf16_within(gpu, cpu);
  }
  // The bits of fp32 values rounded once.
  static Bits rounded(const std::vector<float>& v) {
    Bits b(v.size());
    for (size_t i = 0; i < v.size(); ++i) b[i] = float_to_bf16(v[i]).bits;
    return b;
  }
};

TEST_F(FERRY_BF16_LLAMA_SUITE, RmsNormIsItsFp32KernelRoundedOnceAndMatchesTheCpuBackend) {
  std::mt19937 rng(301);
  const RmsNormGeom shapes[] = {{1, 1, 1e-5f}, {3, 37, 1e-5f}, {40, 64, 1e-6f}, {70, 576, 1e-5f}};
  for (const RmsNormGeom& g : shapes) {
    for (const bool in_place : {false, true}) {
      SCOPED_TRACE(fmt::format("rows{} C{}{}", g.rows, g.c, in_place ? " in place" : ""));
      const size_t n = g.rows * g.c;
      const Bits x = random_bf16(n, rng, -2.0f, 2.0f), dy = random_bf16(n, rng);
      const std::vector<float> w = random_floats(g.c, rng, 0.5f, 1.5f);
      Bits y = poisoned_bf16(n), dx = in_place ? dy : poisoned_bf16(n);
      std::vector<float> rstd = poisoned(g.rows), dw = poisoned(g.c);
      cpu(RmsNormForward{g, fp(x.data()), w.data(), fp(y.data()), rstd.data(), kBf});
      cpu(RmsNormBackward{g, fp(x.data()), in_place ? fp(dx.data()) : fp(dy.data()), w.data(),
                          rstd.data(), fp(dx.data()), dw.data(), kBf});

      const uint16_t* gx = mem_.upload(x);
      const float* gw = mem_.upload(w);
      uint16_t* gy = mem_.alloc<uint16_t>(n);
      uint16_t* gdy = mem_.upload(dy);
      uint16_t* gdx = in_place ? gdy : mem_.alloc<uint16_t>(n);
      float* grstd = mem_.alloc<float>(g.rows);
      float* gdw = mem_.alloc<float>(g.c);
      gpu(RmsNormForward{g, fp(gx), gw, fp(gy), grstd, kBf});
      gpu(RmsNormBackward{g, fp(gx), fp(gdy), gw, grstd, fp(gdx), gdw, kBf});
      const Bits got_y = mem_.download(gy, n), got_dx = mem_.download(gdx, n);
      const std::vector<float> got_rstd = mem_.download(grstd, g.rows),
                               got_dw = mem_.download(gdw, g.c);

      // The target's fp32 kernel on the widened values.
      const float* fx = mem_.upload(widened(x));
      float* fy = mem_.alloc<float>(n);
      float* fdx = mem_.alloc<float>(n);
      float* frstd = mem_.alloc<float>(g.rows);
      float* fdw = mem_.alloc<float>(g.c);
      gpu(RmsNormForward{g, fx, gw, fy, frstd});
      gpu(RmsNormBackward{g, fx, mem_.upload(widened(dy)), gw, frstd, fdx, fdw});
      EXPECT_TRUE(bitwise(got_y, rounded(mem_.download(fy, n))));
      EXPECT_TRUE(bitwise(got_dx, rounded(mem_.download(fdx, n))));
      EXPECT_TRUE(bitwise(got_rstd, mem_.download(frstd, g.rows)));
      EXPECT_TRUE(bitwise(got_dw, mem_.download(fdw, g.c)));

      EXPECT_TRUE(matches_cpu(got_y, y, false));
      EXPECT_TRUE(matches_cpu(got_dx, dx, false));
      EXPECT_TRUE(close(got_rstd, rstd, 1e-6, 0));
      EXPECT_TRUE(close(got_dw, dw, 1e-4, 1e-5));
    }
  }
}

TEST_F(FERRY_BF16_LLAMA_SUITE, RopeQkvIsItsFp32KernelRoundedOnceAndMatchesTheCpuBackend) {
  std::mt19937 rng(302);
  struct Case {
    int64_t n, t, heads, kv, d;
    bool packed;
  };
  for (const Case& rc : {Case{1, 1, 1, 1, 2, false}, Case{2, 9, 6, 2, 8, false},
                         Case{2, 33, 9, 3, 64, false}, Case{1, 20, 4, 1, 6, true}}) {
    SCOPED_TRACE(
        fmt::format("{}/{} heads, d {}{}", rc.heads, rc.kv, rc.d, rc.packed ? " packed" : ""));
    const RopeGeom g{rc.n, rc.t, rc.heads, rc.kv, rc.d, 10000.0f};
    const int64_t rows = rc.n * rc.t, qw = g.q_width(), kvw = g.kv_width();
    std::vector<int32_t> segments;
    for (int64_t r = 0; r < rows && rc.packed; ++r) segments.push_back((r % rc.t) / 5 * 5);
    const int32_t* cseg = rc.packed ? segments.data() : nullptr;
    const Bits q = random_bf16(rows * qw, rng), k = random_bf16(rows * kvw, rng),
               v = random_bf16(rows * kvw, rng), dqkv = random_bf16(rows * 3 * qw, rng);
    Bits qkv = poisoned_bf16(rows * 3 * qw), dq = poisoned_bf16(q.size()),
         dk = poisoned_bf16(k.size()), dv = poisoned_bf16(v.size());
    cpu(RopeQkvForward{g, fp(q.data()), fp(k.data()), fp(v.data()), fp(qkv.data()), cseg, kBf});
    cpu(RopeQkvBackward{g, fp(dqkv.data()), fp(dq.data()), fp(dk.data()), fp(dv.data()), cseg,
                        kBf});

    const int32_t* gseg = rc.packed ? mem_.upload(segments) : nullptr;
    uint16_t* gqkv = mem_.alloc<uint16_t>(qkv.size());
    uint16_t* gdq = mem_.alloc<uint16_t>(q.size());
    uint16_t* gdk = mem_.alloc<uint16_t>(k.size());
    uint16_t* gdv = mem_.alloc<uint16_t>(v.size());
    gpu(RopeQkvForward{g, fp(mem_.upload(q)), fp(mem_.upload(k)), fp(mem_.upload(v)), fp(gqkv),
                       gseg, kBf});
    gpu(RopeQkvBackward{g, fp(mem_.upload(dqkv)), fp(gdq), fp(gdk), fp(gdv), gseg, kBf});
    const Bits got_qkv = mem_.download(gqkv, qkv.size()), got_dq = mem_.download(gdq, q.size()),
               got_dk = mem_.download(gdk, k.size()), got_dv = mem_.download(gdv, v.size());

    float* fqkv = mem_.alloc<float>(qkv.size());
    float* fdq = mem_.alloc<float>(q.size());
    float* fdk = mem_.alloc<float>(k.size());
    float* fdv = mem_.alloc<float>(v.size());
    gpu(RopeQkvForward{g, mem_.upload(widened(q)), mem_.upload(widened(k)), mem_.upload(widened(v)),
                       fqkv, gseg});
    gpu(RopeQkvBackward{g, mem_.upload(widened(dqkv)), fdq, fdk, fdv, gseg});
    EXPECT_TRUE(bitwise(got_qkv, rounded(mem_.download(fqkv, qkv.size()))));
    EXPECT_TRUE(bitwise(got_dq, rounded(mem_.download(fdq, q.size()))));
    EXPECT_TRUE(bitwise(got_dk, rounded(mem_.download(fdk, k.size()))));
    EXPECT_TRUE(bitwise(got_dv, rounded(mem_.download(fdv, v.size()))));

    EXPECT_TRUE(matches_cpu(got_qkv, qkv, true));
    EXPECT_TRUE(matches_cpu(got_dq, dq, true));
    EXPECT_TRUE(matches_cpu(got_dk, dk, true));
    EXPECT_TRUE(bitwise(got_dv, dv));  // sums of the same values in the same order everywhere
  }
}

TEST_F(FERRY_BF16_LLAMA_SUITE, SwigluIsItsFp32KernelRoundedOnceAndMatchesTheCpuBackend) {
  std::mt19937 rng(303);
  for (const size_t n : {size_t{1}, size_t{1000}, size_t{65537}}) {
    SCOPED_TRACE(n);
    const auto count = static_cast<int64_t>(n);
    const Bits gate = random_bf16(n, rng, -8.0f, 8.0f), up = random_bf16(n, rng),
               dy = random_bf16(n, rng);
    Bits y = poisoned_bf16(n), dgate = poisoned_bf16(n), dup = poisoned_bf16(n);
    cpu(SwigluForward{count, fp(gate.data()), fp(up.data()), fp(y.data()), kBf});
    cpu(SwigluBackward{count, fp(gate.data()), fp(up.data()), fp(dy.data()), fp(dgate.data()),
                       fp(dup.data()), kBf});

    const uint16_t* gg = mem_.upload(gate);
    const uint16_t* gu = mem_.upload(up);
    uint16_t* gy = mem_.alloc<uint16_t>(n);
    uint16_t* gdy = mem_.upload(dy);
    uint16_t* gdup = mem_.alloc<uint16_t>(n);
    gpu(SwigluForward{count, fp(gg), fp(gu), fp(gy), kBf});
    gpu(SwigluBackward{count, fp(gg), fp(gu), fp(gdy), fp(gdy), fp(gdup), kBf});  // dgate over dy
    const Bits got_y = mem_.download(gy, n), got_dgate = mem_.download(gdy, n),
               got_dup = mem_.download(gdup, n);

    const float* fg = mem_.upload(widened(gate));
    const float* fu = mem_.upload(widened(up));
    float* fy = mem_.alloc<float>(n);
    float* fdgate = mem_.alloc<float>(n);
    float* fdup = mem_.alloc<float>(n);
    gpu(SwigluForward{count, fg, fu, fy});
    gpu(SwigluBackward{count, fg, fu, mem_.upload(widened(dy)), fdgate, fdup});
    EXPECT_TRUE(bitwise(got_y, rounded(mem_.download(fy, n))));
    EXPECT_TRUE(bitwise(got_dgate, rounded(mem_.download(fdgate, n))));
    EXPECT_TRUE(bitwise(got_dup, rounded(mem_.download(fdup, n))));

    EXPECT_TRUE(matches_cpu(got_y, y, false));
    EXPECT_TRUE(matches_cpu(got_dgate, dgate, false));
    EXPECT_TRUE(matches_cpu(got_dup, dup, false));
  }
}

}  // namespace
}  // namespace ferry
