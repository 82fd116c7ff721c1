// bf16 op parity: the CUDA kernels in bf16 storage (Note [bf16 storage in the CUDA kernels] in
// device/cuda/storage.cuh) against the CPU backend's bf16 kernels (device/cpu/kernels_bf16.cc),
// on the GPU (skips without one) and host-emulated. Where the fp32 suites ask for the CPU
// backend's bits, so does this one (the emulation runs the CPU's math library; elementwise
// kernels and selections everywhere); elsewhere, within one bf16 rounding (Note [One bf16
// rounding apart] in bf16_helpers.h). fp32 operands (statistics, the loss) as the fp32 suites.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "device/kernels.h"
#include "tests/device/cuda/bf16_helpers.h"
#include "tests/device/cuda/parity_helpers.h"

// CudaBf16ParityTest on the GPU, EmulatedCudaBf16ParityTest for the host emulation.
#ifndef FERRY_BF16_SUITE
#define FERRY_BF16_SUITE CudaBf16ParityTest
#endif

constexpr bool kSameMathAsCpu = ferry::kEmulated;

namespace ferry {
namespace {

constexpr DType kBf = DType::kBF16;

class FERRY_BF16_SUITE : public ParityFixture {
 public:
  // Bitwise where the target runs the CPU backend's math, else one bf16 rounding apart.
  static ::testing::AssertionResult same_or_one_rounding(const Bits& gpu, const Bits& cpu) {
    return kSameMathAsCpu ? bitwise(gpu, cpu) : bf16_within(gpu, cpu);
  }
};

// ---- elementwise -----------------------------------------------------------------------------

TEST_F(FERRY_BF16_SUITE, ElementwiseKernelsAreBitwise) {
  std::mt19937 rng(101);
  for (const size_t n : {size_t{1}, size_t{1000}, size_t{4097}, size_t{1} << 18 | 3}) {
    SCOPED_TRACE(n);
    const auto len = static_cast<int64_t>(n);
    Bits a = random_bf16(n, rng, -4.0f, 4.0f), b = random_bf16(n, rng);
    a[0] = 0x7FC1;  // a NaN with a payload: ReLU keeps it, bit for bit
    Bits relu = poisoned_bf16(n), grad = poisoned_bf16(n), sum = poisoned_bf16(n), acc = b,
         scaled = a, filled = poisoned_bf16(n), poison = poisoned_bf16(n);
    cpu(ReluForward{len, fp(a.data()), fp(relu.data()), kBf});
    cpu(ReluBackward{len, fp(relu.data()), fp(b.data()), fp(grad.data()), kBf});
    cpu(AddForward{len, fp(a.data()), fp(b.data()), fp(sum.data()), kBf});
    cpu(Accumulate{len, fp(a.data()), fp(acc.data()), kBf});
    cpu(Scale{len, 0.37f, fp(scaled.data()), kBf});
    cpu(Fill{len, 0.3f, fp(filled.data()), kBf});
    cpu(Fill{len, NAN, fp(poison.data()), kBf});

    const uint16_t* ga = mem_.upload(a);
    const uint16_t* gb = mem_.upload(b);
    uint16_t* grelu = mem_.alloc<uint16_t>(n);
    uint16_t* ggrad = mem_.alloc<uint16_t>(n);
    uint16_t* gsum = mem_.alloc<uint16_t>(n);
    uint16_t* gacc = mem_.upload(b);
    uint16_t* gscaled = mem_.upload(a);
    uint16_t* gfilled = mem_.alloc<uint16_t>(n);
    uint16_t* gpoison = mem_.upload(a);
    gpu(ReluForward{len, fp(ga), fp(grelu), kBf});
    gpu(ReluBackward{len, fp(grelu), fp(gb), fp(ggrad), kBf});
    gpu(AddForward{len, fp(ga), fp(gb), fp(gsum), kBf});
    gpu(Accumulate{len, fp(ga), fp(gacc), kBf});
    gpu(Scale{len, 0.37f, fp(gscaled), kBf});
    gpu(Fill{len, 0.3f, fp(gfilled), kBf});
    gpu(Fill{len, NAN, fp(gpoison), kBf});
    EXPECT_TRUE(bitwise(mem_.download(grelu, n), relu));
    EXPECT_TRUE(bitwise(mem_.download(ggrad, n), grad));
    EXPECT_TRUE(bitwise(mem_.download(gsum, n), sum));
    EXPECT_TRUE(bitwise(mem_.download(gacc, n), acc));
    EXPECT_TRUE(bitwise(mem_.download(gscaled, n), scaled));
    EXPECT_TRUE(bitwise(mem_.download(gfilled, n), filled));
    EXPECT_TRUE(bitwise(mem_.download(gpoison, n), poison));
    // The storage is bf16: 0.3 rounds to 0x3E9A, and the sum is rounded once.
    EXPECT_EQ(mem_.download(gfilled, 1)[0], 0x3E9A);
    EXPECT_EQ(sum[n - 1], float_to_bf16(widened(a)[n - 1] + widened(b)[n - 1]).bits);
  }
}

TEST_F(FERRY_BF16_SUITE, DropoutMasksAndValuesAreBitwise) {
  std::mt19937 rng(102);
  for (const float p : {0.0f, 0.1f, 0.5f, 1.0f}) {
    const size_t n = 50003;
    const auto len = static_cast<int64_t>(n);
    const uint64_t seed = 0xb16ull + static_cast<uint64_t>(p * 10), offset = 777;
    SCOPED_TRACE(p);
    const Bits x = random_bf16(n, rng), dy = random_bf16(n, rng);
    Bits y = poisoned_bf16(n), dx = poisoned_bf16(n);
    std::vector<uint8_t> mask(n, 7);
    cpu(DropoutForward{len, p, seed, offset, fp(x.data()), fp(y.data()), mask.data(), kBf});
    cpu(DropoutBackward{len, p, fp(dy.data()), mask.data(), fp(dx.data()), kBf});
    uint16_t* gy = mem_.alloc<uint16_t>(n);
    uint16_t* gdx = mem_.alloc<uint16_t>(n);
    uint8_t* gmask = mem_.alloc<uint8_t>(n);
    gpu(DropoutForward{len, p, seed, offset, fp(mem_.upload(x)), fp(gy), gmask, kBf});
    gpu(DropoutBackward{len, p, fp(mem_.upload(dy)), gmask, fp(gdx), kBf});
    EXPECT_TRUE(bitwise(mem_.download(gmask, n), mask));
    EXPECT_TRUE(bitwise(mem_.download(gy, n), y));
    EXPECT_TRUE(bitwise(mem_.download(gdx, n), dx));
  }
}

// ---- pooling ---------------------------------------------------------------------------------

void pool_case(FERRY_BF16_SUITE& t, GpuArena& mem, const PoolGeom& g, std::mt19937& rng) {
  SCOPED_TRACE(fmt::format("{} N{} C{} {}x{} k{}x{} s{}x{} p{}x{}{}",
                           g.kind == PoolKind::kMax ? "max" : "avg", g.n, g.c, g.h, g.w, g.kh, g.kw,
                           g.stride_h, g.stride_w, g.pad_h, g.pad_w, g.ceil_mode ? " ceil" : ""));
  const size_t in = g.n * g.c * g.h * g.w, out = g.n * g.c * g.out_h() * g.out_w();
  // Coarse values: windows hold ties, so the first-maximum rule matters.
  Bits x(in);
  std::uniform_int_distribution<int> step(-3, 3);
  for (auto& v : x) v = float_to_bf16(0.5f * static_cast<float>(step(rng))).bits;
  const Bits dy = random_bf16(out, rng);
  Bits y = poisoned_bf16(out), dx = poisoned_bf16(in);
  t.cpu(PoolForward{g, fp(x.data()), fp(y.data()), kBf});
  t.cpu(PoolBackward{g, fp(x.data()), fp(y.data()), fp(dy.data()), fp(dx.data()), kBf});
  const uint16_t* gx = mem.upload(x);
  uint16_t* gy = mem.alloc<uint16_t>(out);
  uint16_t* gdx = mem.alloc<uint16_t>(in);
  t.gpu(PoolForward{g, fp(gx), fp(gy), kBf});
  t.gpu(PoolBackward{g, fp(gx), fp(gy), fp(mem.upload(dy)), fp(gdx), kBf});
  if (g.kind == PoolKind::kMax) {
    EXPECT_TRUE(bitwise(mem.download(gy, out), y));  // a selection
  } else {
    EXPECT_TRUE(FERRY_BF16_SUITE::same_or_one_rounding(mem.download(gy, out), y));
  }
  EXPECT_TRUE(FERRY_BF16_SUITE::same_or_one_rounding(mem.download(gdx, in), dx));
}

TEST_F(FERRY_BF16_SUITE, PoolingMatchesTheCpuBackend) {
  std::mt19937 rng(103);
  const PoolGeom shapes[] = {
      {PoolKind::kMax, 4, 8, 32, 32, 3, 3, 2, 2, 1, 1, false, true},  // ResNet's stem
      {PoolKind::kMax, 2, 5, 16, 16, 2, 2, 2, 2, 0, 0, false, true},  // VGG's
      {PoolKind::kMax, 2, 3, 15, 15, 3, 3, 2, 2, 0, 0, true, true},   // ceil mode
      {PoolKind::kAvg, 2, 3, 15, 14, 3, 3, 2, 2, 1, 1, true, false},  // ceil, pads not counted
      {PoolKind::kAvg, 3, 4, 9, 11, 3, 2, 1, 2, 1, 0, false, true}};
  for (const PoolGeom& g : shapes) pool_case(*this, mem_, g, rng);
}

TEST_F(FERRY_BF16_SUITE, AdaptiveAvgPoolMatchesTheCpuBackend) {
  std::mt19937 rng(104);
  const int64_t shapes[][6] = {{2, 3, 7, 7, 1, 1}, {1, 4, 9, 13, 3, 5}, {3, 2, 5, 4, 7, 6}};
  for (const auto& s : shapes) {
    const int64_t n = s[0], c = s[1], h = s[2], w = s[3], oh = s[4], ow = s[5];
    SCOPED_TRACE(fmt::format("N{} C{} {}x{} -> {}x{}", n, c, h, w, oh, ow));
    const size_t in = n * c * h * w, out = n * c * oh * ow;
    const Bits x = random_bf16(in, rng), dy = random_bf16(out, rng);
    Bits y = poisoned_bf16(out), dx = poisoned_bf16(in);
    cpu(AdaptiveAvgPoolForward{n, c, h, w, oh, ow, fp(x.data()), fp(y.data()), kBf});
    cpu(AdaptiveAvgPoolBackward{n, c, h, w, oh, ow, fp(dy.data()), fp(dx.data()), kBf});
    uint16_t* gy = mem_.alloc<uint16_t>(out);
    uint16_t* gdx = mem_.alloc<uint16_t>(in);
    gpu(AdaptiveAvgPoolForward{n, c, h, w, oh, ow, fp(mem_.upload(x)), fp(gy), kBf});
    gpu(AdaptiveAvgPoolBackward{n, c, h, w, oh, ow, fp(mem_.upload(dy)), fp(gdx), kBf});
    EXPECT_TRUE(same_or_one_rounding(mem_.download(gy, out), y));
    EXPECT_TRUE(same_or_one_rounding(mem_.download(gdx, in), dx));
  }
}

// ---- batch norm ------------------------------------------------------------------------------

// bf16 x, y, dy, dx; fp32 parameters and statistics, reduced in the shared order (Note [Batch
// norm's summation order]), so the emulation gives the CPU backend's bits for all of them.
TEST_F(FERRY_BF16_SUITE, BatchNormMatchesTheCpuBackend) {
  std::mt19937 rng(105);
  const BatchNormGeom shapes[] = {{2, 3, 1, 1e-5f}, {5, 7, 9, 1e-5f}, {4, 2, 4099, 1e-5f}};
  for (const BatchNormGeom& g : shapes) {
    SCOPED_TRACE(fmt::format("N{} C{} HW{}", g.n, g.c, g.hw));
    const size_t n = g.n * g.c * g.hw, c = g.c;
    const Bits x = random_bf16(n, rng, 2.0f, 4.0f), dy = random_bf16(n, rng);
    const std::vector<float> gamma = random_floats(c, rng, 0.5f, 1.5f);
    const std::vector<float> beta = random_floats(c, rng);
    const std::vector<float> rm0 = random_floats(c, rng), rv0 = random_floats(c, rng, 0.5f, 2.0f);
    Bits y = poisoned_bf16(n), dx = poisoned_bf16(n), infer = poisoned_bf16(n);
    std::vector<float> rm = rm0, rv = rv0, sm = poisoned(c), sv = poisoned(c), dg = poisoned(c),
                       db = poisoned(c);
    cpu(BatchNormForwardTraining{g, 0.1f, fp(x.data()), gamma.data(), beta.data(), fp(y.data()),
                                 rm.data(), rv.data(), sm.data(), sv.data(), kBf});
    cpu(BatchNormBackward{g, fp(x.data()), fp(dy.data()), gamma.data(), sm.data(), sv.data(),
                          fp(dx.data()), dg.data(), db.data(), kBf});
    cpu(BatchNormForwardInference{g, fp(x.data()), gamma.data(), beta.data(), rm0.data(),
                                  rv0.data(), fp(infer.data()), kBf});

    const uint16_t* gx = mem_.upload(x);
    const float* ggamma = mem_.upload(gamma);
    const float* gbeta = mem_.upload(beta);
    float* grm = mem_.upload(rm0);
    float* grv = mem_.upload(rv0);
    uint16_t* gy = mem_.alloc<uint16_t>(n);
    uint16_t* gdx = mem_.alloc<uint16_t>(n);
    uint16_t* ginf = mem_.alloc<uint16_t>(n);
    float* gsm = mem_.alloc<float>(c);
    float* gsv = mem_.alloc<float>(c);
    float* gdg = mem_.alloc<float>(c);
    float* gdb = mem_.alloc<float>(c);
    gpu(BatchNormForwardTraining{g, 0.1f, fp(gx), ggamma, gbeta, fp(gy), grm, grv, gsm, gsv, kBf});
    gpu(BatchNormBackward{g, fp(gx), fp(mem_.upload(dy)), ggamma, gsm, gsv, fp(gdx), gdg, gdb,
                          kBf});
    gpu(BatchNormForwardInference{g, fp(gx), ggamma, gbeta, mem_.upload(rm0), mem_.upload(rv0),
                                  fp(ginf), kBf});
    EXPECT_TRUE(same_or_one_rounding(mem_.download(gy, n), y));
    EXPECT_TRUE(same_or_one_rounding(mem_.download(gdx, n), dx));
    EXPECT_TRUE(same_or_one_rounding(mem_.download(ginf, n), infer));
    for (const auto& [got, want] : {std::pair{mem_.download(gsm, c), sm},
                                    {mem_.download(gsv, c), sv},
                                    {mem_.download(grm, c), rm},
                                    {mem_.download(grv, c), rv},
                                    {mem_.download(gdg, c), dg},
                                    {mem_.download(gdb, c), db}}) {
      EXPECT_TRUE(close(got, want));
      if (kSameMathAsCpu) {
        EXPECT_TRUE(bitwise(got, want));
      }
    }
  }
}

// ---- loss ------------------------------------------------------------------------------------

TEST_F(FERRY_BF16_SUITE, SoftmaxCrossEntropyMatchesTheCpuBackend) {
  std::mt19937 rng(106);
  const int64_t shapes[][2] = {{1, 10}, {7, 3}, {33, 1000}, {300, 17}};
  for (const auto& shape : shapes) {
    const int64_t n = shape[0], k = shape[1];
    SCOPED_TRACE(fmt::format("N{} K{}", n, k));
    const Bits logits = random_bf16(n * k, rng, -6.0f, 6.0f);
    std::vector<int32_t> labels(n);
    for (auto& l : labels) l = static_cast<int32_t>(pick(rng, 0, k - 1));
    if (n > 2) labels[1] = -1;  // padding: exactly nothing
    std::vector<float> loss = poisoned(1);
    Bits probs = poisoned_bf16(n * k), dlogits = poisoned_bf16(n * k);
    int32_t correct = -1;
    cpu(SoftmaxCrossEntropyForward{n, k, fp(logits.data()), labels.data(), loss.data(),
                                   fp(probs.data()), &correct, 0.0f, kBf});
    cpu(SoftmaxCrossEntropyBackward{n, k, 0.5f, fp(probs.data()), labels.data(), fp(dlogits.data()),
                                    0.0f, kBf});
    const int32_t* glabels = mem_.upload(labels);
    float* gloss = mem_.alloc<float>(1);
    uint16_t* gprobs = mem_.alloc<uint16_t>(n * k);
    uint16_t* gd = mem_.alloc<uint16_t>(n * k);
    int32_t* gcorrect = mem_.alloc<int32_t>(1);
    gpu(SoftmaxCrossEntropyForward{n, k, fp(mem_.upload(logits)), glabels, gloss, fp(gprobs),
                                   gcorrect, 0.0f, kBf});
    gpu(SoftmaxCrossEntropyBackward{n, k, 0.5f, fp(gprobs), glabels, fp(gd), 0.0f, kBf});
    EXPECT_EQ(mem_.download(gcorrect, 1)[0], correct);
    EXPECT_TRUE(same_or_one_rounding(mem_.download(gprobs, n * k), probs));
    // dlogits from the target's own probabilities: one more rounding apart at most.
    EXPECT_TRUE(kSameMathAsCpu ? bitwise(mem_.download(gd, n * k), dlogits)
                               : bf16_within(mem_.download(gd, n * k), dlogits, 2));
    EXPECT_TRUE(close(mem_.download(gloss, 1), loss));
    if (kSameMathAsCpu) {
      EXPECT_TRUE(bitwise(mem_.download(gloss, 1), loss));
    }
  }
}

}  // namespace
}  // namespace ferry
