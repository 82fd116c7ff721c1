// bf16 parity of the transformer kernels (embedding, layer norm, GELU, the attention core) and of
// the bf16 steps of linear layers and convolutions (biases, bias gradients, widening): against
// the CPU backend's bf16 kernels, or against the fp32 kernel rounded once where the bf16 variant
// is defined that way (Note [bf16 storage in the CUDA kernels]). On the GPU (skips without one)
// and host-emulated; bitwise where the fp32 suites are, else within one bf16 rounding (Note [One
// bf16 rounding apart] in bf16_helpers.h). The cuBLAS attention is checked on the GPU only.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "device/cuda/elementwise.h"
#include "device/cuda/transformer_ops.h"
#include "device/kernels.h"
#include "tests/device/cuda/bf16_helpers.h"
#include "tests/device/cuda/parity_helpers.h"

// CudaBf16TransformerParityTest on the GPU, EmulatedCudaBf16TransformerParityTest emulated.
#ifndef FERRY_BF16_TRANSFORMER_SUITE
#define FERRY_BF16_TRANSFORMER_SUITE CudaBf16TransformerParityTest
#endif

namespace ferry {
namespace {

constexpr DType kBf = DType::kBF16;

class FERRY_BF16_TRANSFORMER_SUITE : public ParityFixture {
 public:
  static ::testing::AssertionResult same_or_one_rounding(const Bits& gpu, const Bits& cpu) {
    return kEmulated ? bitwise(gpu, cpu) : bf16_within(gpu, cpu);
  }
  static void expect_fp32(const std::vector<float>& gpu, const std::vector<float>& cpu) {
    EXPECT_TRUE(close(gpu, cpu));
    if (kEmulated) {
      EXPECT_TRUE(bitwise(gpu, cpu));
    }
  }
};

// ---- embedding -------------------------------------------------------------------------------

TEST_F(FERRY_BF16_TRANSFORMER_SUITE, EmbeddingMatchesTheCpuBackend) {
  std::mt19937 rng(201);
  const int64_t n = 3, t = 17, c = 24, vocab = 50, context = 20;
  for (const bool accumulate : {false, true}) {
    for (const bool segmented : {false, true}) {
      SCOPED_TRACE(
          fmt::format("{}{}", accumulate ? "accumulate" : "", segmented ? " segments" : ""));
      std::vector<int32_t> tokens(n * t), segments(n * t);
      for (auto& v : tokens) v = static_cast<int32_t>(pick(rng, 0, 9));  // repeats: order matters
      for (int64_t row = 0; row < n; ++row) {
        for (int64_t i = 0, start = 0; i < t; ++i) {
          if (segmented && pick(rng, 0, 4) == 0) start = i;
          segments[row * t + i] = static_cast<int32_t>(start);
        }
      }
      const int32_t* seg = segmented ? segments.data() : nullptr;
      const std::vector<float> wte = random_floats(vocab * c, rng),
                               wpe = random_floats(context * c, rng);
      const std::vector<float> before = random_floats(vocab * c, rng);
      const Bits dy = random_bf16(n * t * c, rng);
      Bits y = poisoned_bf16(n * t * c);
      std::vector<float> dwte = accumulate ? before : poisoned(vocab * c),
                         dwpe = poisoned(context * c);
      cpu(EmbeddingForward{n, t, c, vocab, tokens.data(), wte.data(), wpe.data(), fp(y.data()), seg,
                           kBf});
      cpu(EmbeddingBackward{n, t, c, vocab, context, tokens.data(), fp(dy.data()), dwte.data(),
                            dwpe.data(), accumulate, seg, kBf});
      const int32_t* gtokens = mem_.upload(tokens);
      const int32_t* gseg = segmented ? mem_.upload(segments) : nullptr;
      uint16_t* gy = mem_.alloc<uint16_t>(n * t * c);
      float* gdwte = accumulate ? mem_.upload(before) : mem_.alloc<float>(vocab * c);
      float* gdwpe = mem_.alloc<float>(context * c);
      gpu(EmbeddingForward{n, t, c, vocab, gtokens, mem_.upload(wte), mem_.upload(wpe), fp(gy),
                           gseg, kBf});
      gpu(EmbeddingBackward{n, t, c, vocab, context, gtokens, fp(mem_.upload(dy)), gdwte, gdwpe,
                            accumulate, gseg, kBf});
      // No atomics and no transcendental functions: the same bits on every target.
      EXPECT_TRUE(bitwise(mem_.download(gy, n * t * c), y));
      EXPECT_TRUE(bitwise(mem_.download(gdwte, vocab * c), dwte));
      EXPECT_TRUE(bitwise(mem_.download(gdwpe, context * c), dwpe));
    }
  }
}

// ---- layer norm and GELU ---------------------------------------------------------------------

TEST_F(FERRY_BF16_TRANSFORMER_SUITE, LayerNormMatchesTheCpuBackend) {
  std::mt19937 rng(202);
  const LayerNormGeom shapes[] = {{1, 1, 1e-5f}, {5, 33, 1e-5f}, {40, 300, 1e-5f}, {2, 768, 1e-5f}};
  for (const LayerNormGeom& g : shapes) {
    for (const bool in_place : {false, true}) {
      SCOPED_TRACE(fmt::format("rows{} C{}{}", g.rows, g.c, in_place ? " in place" : ""));
      const size_t n = g.rows * g.c;
      const Bits x = random_bf16(n, rng, 1.0f, 3.0f), dy = random_bf16(n, rng);
      const std::vector<float> gamma = random_floats(g.c, rng, 0.5f, 1.5f),
                               beta = random_floats(g.c, rng);
      Bits y = poisoned_bf16(n), dx = in_place ? dy : poisoned_bf16(n);
      std::vector<float> mean = poisoned(g.rows), rstd = poisoned(g.rows), dg = poisoned(g.c),
                         db = poisoned(g.c);
      cpu(LayerNormForward{g, fp(x.data()), gamma.data(), beta.data(), fp(y.data()), mean.data(),
                           rstd.data(), kBf});
      cpu(LayerNormBackward{g, fp(x.data()), in_place ? fp(dx.data()) : fp(dy.data()), gamma.data(),
                            mean.data(), rstd.data(), fp(dx.data()), dg.data(), db.data(), kBf});
      const uint16_t* gx = mem_.upload(x);
      const float* ggamma = mem_.upload(gamma);
      uint16_t* gy = mem_.alloc<uint16_t>(n);
      uint16_t* gdy = mem_.upload(dy);
      uint16_t* gdx = in_place ? gdy : mem_.alloc<uint16_t>(n);
      float* gmean = mem_.alloc<float>(g.rows);
      float* grstd = mem_.alloc<float>(g.rows);
      float* gdg = mem_.alloc<float>(g.c);
      float* gdb = mem_.alloc<float>(g.c);
      gpu(LayerNormForward{g, fp(gx), ggamma, mem_.upload(beta), fp(gy), gmean, grstd, kBf});
      gpu(LayerNormBackward{g, fp(gx), fp(gdy), ggamma, gmean, grstd, fp(gdx), gdg, gdb, kBf});
      EXPECT_TRUE(same_or_one_rounding(mem_.download(gy, n), y));
      EXPECT_TRUE(same_or_one_rounding(mem_.download(gdx, n), dx));
      expect_fp32(mem_.download(gmean, g.rows), mean);
      expect_fp32(mem_.download(grstd, g.rows), rstd);
      // The column sums go through row chunks on the target and row order on the CPU, as in
      // fp32 (LayerNormMatchesTheCpuBackend): close, not the same bits.
      EXPECT_TRUE(close(mem_.download(gdg, g.c), dg));
      EXPECT_TRUE(close(mem_.download(gdb, g.c), db));
    }
  }
}

TEST_F(FERRY_BF16_TRANSFORMER_SUITE, GeluMatchesTheCpuBackend) {
  std::mt19937 rng(203);
  for (const size_t n : {size_t{1}, size_t{1000}, size_t{65539}}) {
    SCOPED_TRACE(n);
    const auto len = static_cast<int64_t>(n);
    const Bits x = random_bf16(n, rng, -6.0f, 6.0f), dy = random_bf16(n, rng);
    Bits y = poisoned_bf16(n), dx = poisoned_bf16(n);
    cpu(GeluForward{len, fp(x.data()), fp(y.data()), kBf});
    cpu(GeluBackward{len, fp(x.data()), fp(dy.data()), fp(dx.data()), kBf});
    const uint16_t* gx = mem_.upload(x);
    uint16_t* gy = mem_.alloc<uint16_t>(n);
    uint16_t* gdx = mem_.alloc<uint16_t>(n);
    gpu(GeluForward{len, fp(gx), fp(gy), kBf});
    gpu(GeluBackward{len, fp(gx), fp(mem_.upload(dy)), fp(gdx), kBf});
    EXPECT_TRUE(same_or_one_rounding(mem_.download(gy, n), y));
    EXPECT_TRUE(same_or_one_rounding(mem_.download(gdx, n), dx));
  }
}

// ---- the attention core ----------------------------------------------------------------------

// The softmax, mask and dropout kernels between the products (Note [Attention in bf16]): from
// the same fp32 scores, the bf16 probabilities and P' are the fp32 kernel's rounded once, and
// dS from bf16 probabilities is the fp32 kernel's dS (from the same values) rounded once.
TEST_F(FERRY_BF16_TRANSFORMER_SUITE, AttentionSoftmaxKernelsAreTheFp32OnesRounded) {
  if (!kEmulated) GTEST_SKIP() << "the GPU checks these inside AttentionMatchesTheCpuBackend";
  std::mt19937 rng(204);
  for (const float p : {0.0f, 0.25f}) {
    for (const int64_t t : {int64_t{1}, int64_t{5}, int64_t{70}}) {
      SCOPED_TRACE(fmt::format("T{} p{}", t, p));
      const int64_t heads = 2, rows = heads * t, count = rows * t;
      const uint64_t seed = 91;
      const std::vector<float> scores = random_floats(count, rng, -4.0f, 4.0f);
      const std::vector<float> dprobs = random_floats(count, rng);
      // fp32, in place.
      float* probs32 = mem_.upload(scores);
      float* dropped32 = mem_.alloc<float>(count);
      uint8_t* mask32 = mem_.alloc<uint8_t>(count);
      cuda::launch_attention_softmax(rows, t, heads, nullptr, p, seed, probs32, dropped32, mask32,
                                     nullptr);
      // bf16 from fp32 scores.
      float* scratch = mem_.upload(scores);
      uint16_t* probs16 = mem_.alloc<uint16_t>(count);
      uint16_t* dropped16 = mem_.alloc<uint16_t>(count);
      uint16_t* rebuilt16 = mem_.alloc<uint16_t>(count);
      uint8_t* mask16 = mem_.alloc<uint8_t>(count);
      cuda::launch_attention_softmax(rows, t, heads, nullptr, p, seed, scratch, fp(probs16),
                                     fp(dropped16), mask16, kBf, nullptr);
      const std::vector<float> p32 = mem_.download(probs32, count);
      const Bits p16 = mem_.download(probs16, count);
      Bits want(count);
      for (int64_t q = 0; q < count; ++q) want[q] = float_to_bf16(p32[q]).bits;
      EXPECT_TRUE(bitwise(p16, want));
      EXPECT_TRUE(bitwise(mem_.download(mask16, count), mem_.download(mask32, count)));
      if (p > 0.0f) {
        const std::vector<float> d32 = mem_.download(dropped32, count);
        for (int64_t q = 0; q < count; ++q) want[q] = float_to_bf16(d32[q]).bits;
        EXPECT_TRUE(bitwise(mem_.download(dropped16, count), want));
        // The backward's rebuilt P' from the bf16 probabilities: DropoutForward's of them.
        cuda::launch_attention_dropout_apply(count, p, fp(probs16), mask16, fp(rebuilt16), kBf,
                                             nullptr);
        const std::vector<float> wide = widened(p16);
        const std::vector<uint8_t> mask = mem_.download(mask16, count);
        for (int64_t q = 0; q < count; ++q) {
          want[q] = float_to_bf16(mask[q] ? wide[q] / (1.0f - p) : 0.0f).bits;
        }
        EXPECT_TRUE(bitwise(mem_.download(rebuilt16, count), want));
      }
      // Backward: fp32 from the widened bf16 probabilities, in place; bf16 into its own buffer.
      const std::vector<float> wide = widened(p16);
      float* ds32 = mem_.upload(dprobs);
      cuda::launch_attention_softmax_backward(rows, t, heads, nullptr, p, mem_.upload(wide),
                                              p > 0.0f ? mask32 : nullptr, ds32, nullptr);
      float* dp16 = mem_.upload(dprobs);
      uint16_t* ds16 = mem_.alloc<uint16_t>(count);
      cuda::launch_attention_softmax_backward(rows, t, heads, nullptr, p, fp(probs16),
                                              p > 0.0f ? mask16 : nullptr, dp16, fp(ds16), kBf,
                                              nullptr);
      const std::vector<float> s32 = mem_.download(ds32, count);
      for (int64_t q = 0; q < count; ++q) want[q] = float_to_bf16(s32[q]).bits;
      EXPECT_TRUE(bitwise(mem_.download(ds16, count), want));
    }
  }
}

// The whole core on cuBLAS (bf16 products, fp32 accumulation) against the CPU backend's bf16
// attention (fp32 products of the widened operands, rounded once). P' is rounded to bf16 before
// y = P' v on the GPU, so y and dqkv are allowed 4 bf16 steps (2^-6 relative) or 1e-3.
TEST_F(FERRY_BF16_TRANSFORMER_SUITE, AttentionMatchesTheCpuBackend) {
  if (kEmulated) GTEST_SKIP() << "the attention core's products run on cuBLAS: GPU only";
  std::mt19937 rng(205);
  for (const float dropout : {0.0f, 0.1f}) {
    const AttentionGeom g{2, 33, 4, 64, dropout};
    SCOPED_TRACE(fmt::format("p{}", dropout));
    const uint64_t seed = 0xb16;
    const size_t nqkv = g.n * g.t * 3 * g.c, ny = g.n * g.t * g.c,
                 scores = g.n * g.heads * g.t * g.t;
    const Bits qkv = random_bf16(nqkv, rng), dy = random_bf16(ny, rng);
    const bool drop = dropout > 0.0f;
    Bits y = poisoned_bf16(ny), probs = poisoned_bf16(scores), dqkv = poisoned_bf16(nqkv);
    std::vector<uint8_t> mask(drop ? scores : 0, 7);
    cpu(AttentionForward{g,
                         true,
                         seed,
                         fp(qkv.data()),
                         fp(y.data()),
                         fp(probs.data()),
                         drop ? mask.data() : nullptr,
                         {},
                         nullptr,
                         kBf});
    cpu(AttentionBackward{g,
                          fp(qkv.data()),
                          fp(probs.data()),
                          drop ? mask.data() : nullptr,
                          fp(dy.data()),
                          fp(dqkv.data()),
                          {},
                          nullptr,
                          kBf});
    const uint16_t* gqkv = mem_.upload(qkv);
    uint16_t* gy = mem_.alloc<uint16_t>(ny);
    uint16_t* gprobs = mem_.alloc<uint16_t>(scores);
    uint16_t* gdqkv = mem_.alloc<uint16_t>(nqkv);
    uint8_t* gmask = drop ? mem_.alloc<uint8_t>(scores) : nullptr;
    gpu(AttentionForward{g, true, seed, fp(gqkv), fp(gy), fp(gprobs), gmask, {}, nullptr, kBf});
    gpu(AttentionBackward{
        g, fp(gqkv), fp(gprobs), gmask, fp(mem_.upload(dy)), fp(gdqkv), {}, nullptr, kBf});
    EXPECT_TRUE(bf16_within(mem_.download(gprobs, scores), probs, 1, 1e-6));
    EXPECT_TRUE(bf16_within(mem_.download(gy, ny), y, 4, 1e-3));
    EXPECT_TRUE(bf16_within(mem_.download(gdqkv, nqkv), dqkv, 4, 1e-3));
    if (drop) {
      EXPECT_TRUE(bitwise(mem_.download(gmask, scores), mask));
    }
  }
}

// ---- the bf16 steps of linear layers and convolutions ----------------------------------------

TEST_F(FERRY_BF16_TRANSFORMER_SUITE, BiasAndWidenStepsRoundOnce) {
  if (!kEmulated) GTEST_SKIP() << "the GPU checks these inside the bf16 linear and conv tests";
  std::mt19937 rng(206);
  const int64_t n = 3, k = 5, hw = 37;
  const size_t count = n * k * hw;
  const std::vector<float> acc = random_floats(count, rng, -8.0f, 8.0f),
                           bias = random_floats(k, rng);
  // A linear layer's fp32 product (rows n * hw, k columns) plus its bias, rounded once.
  uint16_t* y = mem_.alloc<uint16_t>(count);
  cuda::launch_bias_to_bf16(n * hw, k, mem_.upload(acc), mem_.upload(bias), fp(y), nullptr);
  Bits want(count);
  for (size_t i = 0; i < count; ++i) want[i] = float_to_bf16(acc[i] + bias[i % k]).bits;
  EXPECT_TRUE(bitwise(mem_.download(y, count), want));
  // A convolution's bf16 output (N, K, HW) plus a channel bias.
  const Bits out = random_bf16(count, rng, -8.0f, 8.0f);
  uint16_t* conv = mem_.upload(out);
  cuda::launch_channel_bias_bf16(n, k, hw, mem_.upload(bias), fp(conv), nullptr);
  const std::vector<float> wide = widened(out);
  for (size_t i = 0; i < count; ++i) want[i] = float_to_bf16(wide[i] + bias[(i / hw) % k]).bits;
  EXPECT_TRUE(bitwise(mem_.download(conv, count), want));
  // dbias: channel sums of bf16 dy in double, rounded to fp32 once.
  float* dbias = mem_.alloc<float>(k);
  cuda::launch_channel_sums_bf16(n, k, hw, fp(mem_.upload(out)), dbias, nullptr);
  std::vector<float> sums(k);
  for (int64_t c = 0; c < k; ++c) {
    double s = 0.0;
    for (int64_t b = 0; b < n; ++b) {
      for (int64_t i = 0; i < hw; ++i) s += wide[(b * k + c) * hw + i];
    }
    sums[c] = static_cast<float>(s);  // bf16 values sum exactly in double at this size
  }
  EXPECT_TRUE(bitwise(mem_.download(dbias, k), sums));
  // Widening is exact.
  float* w = mem_.alloc<float>(count);
  cuda::launch_widen_bf16(static_cast<int64_t>(count), fp(mem_.upload(out)), w, nullptr);
  EXPECT_TRUE(bitwise(mem_.download(w, count), wide));
}

// fp32 <-> bf16 conversion (the bf16 working copy of the weights): narrowing rounds as the CPU
// backend's float_to_bf16 on edge values (ties, subnormals, overflow to infinity, NaN payloads),
// widening is exact, and any other pair is refused by name.
TEST_F(FERRY_BF16_TRANSFORMER_SUITE, ConvertFloatsRoundsAsTheCpuBackend) {
  if (!kEmulated) GTEST_SKIP() << "a direct launch: host emulation only";
  std::mt19937 rng(207);
  std::vector<float> x = random_floats(10000, rng, -3.0f, 3.0f);
  for (const uint32_t bits : {0x3F808000u, 0x3F818000u, 0x00000001u, 0x807FFFFFu, 0x7F7FFFFFu,
                              0xFF7F8000u, 0x7F800000u, 0x7FA00001u, 0xFFC00000u, 0x80000000u}) {
    x.push_back(bits_float(bits));
  }
  const auto n = static_cast<int64_t>(x.size());
  uint16_t* narrow = mem_.alloc<uint16_t>(x.size());
  cuda::launch_convert_floats(n, DType::kF32, kBf, mem_.upload(x), narrow, nullptr);
  Bits want(x.size());
  for (size_t i = 0; i < x.size(); ++i) want[i] = float_to_bf16(x[i]).bits;
  const Bits got = mem_.download(narrow, x.size());
  EXPECT_TRUE(bitwise(got, want));
  float* wide = mem_.alloc<float>(x.size());
  cuda::launch_convert_floats(n, kBf, DType::kF32, narrow, wide, nullptr);
  const std::vector<float> back = mem_.download(wide, x.size());
  std::vector<uint32_t> back_bits(x.size()), want_bits(x.size());
  for (size_t i = 0; i < x.size(); ++i) {
    back_bits[i] = float_bits(back[i]);
    want_bits[i] = static_cast<uint32_t>(got[i]) << 16;
  }
  EXPECT_TRUE(bitwise(back_bits, want_bits));
  EXPECT_THROW(cuda::launch_convert_floats(n, DType::kF32, DType::kF64, nullptr, nullptr, nullptr),
               UnsupportedError);
}

}  // namespace
}  // namespace ferry
