// Op parity: every CUDA kernel but convolution and linear against the CPU backend (the
// reference) on seeded random shapes with odd sizes, strides, padding and ceil mode. Selections
// and elementwise ops must match bit for bit, reductions within 1e-4 relative (bit for bit for
// batch norm and the loss under the host emulation); reductions must also repeat bit for bit run
// to run. Runs on the GPU (cuda_target.cc; skips with "no CUDA
// device present" without one) and on the host emulation of the same kernels
// (emulated_target.cc).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "device/cpu/cpu_kernels.h"
#include "device/cuda/cuda_ops.h"
#include "tests/device/cuda/parity_helpers.h"
#include "tests/device/cuda/parity_target.h"

// The suite's name: CudaParityTest on the GPU, EmulatedCudaParityTest for the host emulation.
#ifndef FERRY_PARITY_SUITE
#define FERRY_PARITY_SUITE CudaParityTest
#endif

// The host emulation runs the kernels with the CPU backend's own math library (exp, log, sqrt)
// and summation orders (batch norm: Note [Batch norm's summation order]; the loss: rows in row
// order), so batch norm and the loss must give the CPU backend's bits there. On a GPU they are
// checked within the reduction tolerance (its exp and log may differ in the last place).
constexpr bool kSameMathAsCpu = ferry::kEmulated;

namespace ferry {
namespace {

// Values on a coarse grid, so pooling windows hold ties and the first-maximum rule matters.
std::vector<float> tied_floats(size_t n, std::mt19937& rng) {
  std::uniform_int_distribution<int> dist(-3, 3);
  std::vector<float> v(n);
  for (auto& x : v) x = 0.5f * static_cast<float>(dist(rng));
  return v;
}

class FERRY_PARITY_SUITE : public ParityFixture {};

// ---- pooling ---------------------------------------------------------------------------------

PoolGeom random_pool(std::mt19937& rng, PoolKind kind) {
  for (;;) {
    PoolGeom g;
    g.kind = kind;
    g.n = pick(rng, 1, 3);
    g.c = pick(rng, 1, 5);
    g.h = pick(rng, 1, 17);
    g.w = pick(rng, 1, 17);
    g.kh = pick(rng, 1, 4);
    g.kw = pick(rng, 1, 4);
    g.stride_h = pick(rng, 1, 3);
    g.stride_w = pick(rng, 1, 3);
    g.pad_h = pick(rng, 0, g.kh / 2);
    g.pad_w = pick(rng, 0, g.kw / 2);
    g.ceil_mode = pick(rng, 0, 1) == 1;
    g.count_include_pad = pick(rng, 0, 1) == 1;
    if (g.h + 2 * g.pad_h >= g.kh && g.w + 2 * g.pad_w >= g.kw && g.out_h() >= 1 &&
        g.out_w() >= 1) {
      return g;
    }
  }
}

std::string describe(const PoolGeom& g) {
  return fmt::format("N{} C{} {}x{} k{}x{} s{}x{} p{}x{}{}{}", g.n, g.c, g.h, g.w, g.kh, g.kw,
                     g.stride_h, g.stride_w, g.pad_h, g.pad_w, g.ceil_mode ? " ceil" : "",
                     g.count_include_pad ? " include_pad" : "");
}

void pool_case(FERRY_PARITY_SUITE& t, GpuArena& mem, const PoolGeom& g, std::mt19937& rng,
               bool ties) {
  SCOPED_TRACE(describe(g));
  const size_t in = g.n * g.c * g.h * g.w, out = g.n * g.c * g.out_h() * g.out_w();
  const std::vector<float> x = ties ? tied_floats(in, rng) : random_floats(in, rng);
  const std::vector<float> dy = random_floats(out, rng);
  std::vector<float> y = poisoned(out), dx = poisoned(in);
  t.cpu(PoolForward{g, x.data(), y.data()});
  t.cpu(PoolBackward{g, x.data(), y.data(), dy.data(), dx.data()});

  const float* gx = mem.upload(x);
  const float* gdy = mem.upload(dy);
  float* gy = mem.alloc<float>(out);
  float* gdx = mem.alloc<float>(in);
  t.gpu(PoolForward{g, gx, gy});
  t.gpu(PoolBackward{g, gx, gy, gdy, gdx});
  const std::vector<float> y_gpu = mem.download(gy, out);
  const std::vector<float> dx_gpu = mem.download(gdx, in);
  if (g.kind == PoolKind::kMax) {
    EXPECT_TRUE(bitwise(y_gpu, y));  // a selection: the same element, the same bits
  } else {
    EXPECT_TRUE(close(y_gpu, y));
  }
  EXPECT_TRUE(close(dx_gpu, dx));
}

TEST_F(FERRY_PARITY_SUITE, MaxPoolRandomGeometriesWithTies) {
  std::mt19937 rng(11);
  for (int i = 0; i < 40; ++i) pool_case(*this, mem_, random_pool(rng, PoolKind::kMax), rng, true);
}

TEST_F(FERRY_PARITY_SUITE, MaxPoolRandomGeometries) {
  std::mt19937 rng(12);
  for (int i = 0; i < 20; ++i) {
    pool_case(*this, mem_, random_pool(rng, PoolKind::kMax), rng, false);
  }
}

TEST_F(FERRY_PARITY_SUITE, AvgPoolRandomGeometries) {
  std::mt19937 rng(13);
  for (int i = 0; i < 40; ++i) {
    pool_case(*this, mem_, random_pool(rng, PoolKind::kAvg), rng, false);
  }
}

TEST_F(FERRY_PARITY_SUITE, ModelPoolings) {
  std::mt19937 rng(14);
  // ResNet's 3x3 s2 p1 stem pooling, VGG's 2x2 s2, and a ceil-mode 3x3 s2 on an odd size.
  PoolGeom stem{PoolKind::kMax, 4, 8, 32, 32, 3, 3, 2, 2, 1, 1, false, true};
  PoolGeom vgg{PoolKind::kMax, 4, 8, 16, 16, 2, 2, 2, 2, 0, 0, false, true};
  PoolGeom ceil{PoolKind::kMax, 2, 3, 15, 15, 3, 3, 2, 2, 0, 0, true, true};
  PoolGeom avg_ceil{PoolKind::kAvg, 2, 3, 15, 14, 3, 3, 2, 2, 1, 1, true, false};
  for (const PoolGeom& g : {stem, vgg, ceil, avg_ceil}) pool_case(*this, mem_, g, rng, false);
}

TEST_F(FERRY_PARITY_SUITE, AdaptiveAvgPoolRandomShapes) {
  std::mt19937 rng(15);
  for (int i = 0; i < 30; ++i) {
    const int64_t n = pick(rng, 1, 3), c = pick(rng, 1, 5), h = pick(rng, 1, 13),
                  w = pick(rng, 1, 13);
    // Outputs both smaller and larger than the input (cells then overlap or repeat).
    const int64_t oh = i == 0 ? 1 : pick(rng, 1, 15), ow = i == 0 ? 1 : pick(rng, 1, 15);
    SCOPED_TRACE(fmt::format("{}x{} -> {}x{}", h, w, oh, ow));
    const size_t in = n * c * h * w, out = n * c * oh * ow;
    const std::vector<float> x = random_floats(in, rng), dy = random_floats(out, rng);
    std::vector<float> y = poisoned(out), dx = poisoned(in);
    cpu(AdaptiveAvgPoolForward{n, c, h, w, oh, ow, x.data(), y.data()});
    cpu(AdaptiveAvgPoolBackward{n, c, h, w, oh, ow, dy.data(), dx.data()});
    float* gy = mem_.alloc<float>(out);
    float* gdx = mem_.alloc<float>(in);
    gpu(AdaptiveAvgPoolForward{n, c, h, w, oh, ow, mem_.upload(x), gy});
    gpu(AdaptiveAvgPoolBackward{n, c, h, w, oh, ow, mem_.upload(dy), gdx});
    EXPECT_TRUE(close(mem_.download(gy, out), y));
    EXPECT_TRUE(close(mem_.download(gdx, in), dx));
  }
}

// ---- batch normalisation -------------------------------------------------------------------

struct BnResult {
  std::vector<float> y, running_mean, running_var, save_mean, save_var, dx, dgamma, dbeta, infer;
};

TEST_F(FERRY_PARITY_SUITE, BatchNormRandomShapes) {
  std::mt19937 rng(21);
  // The last four spread each channel over several chunks (blocks): N*HW > 4096.
  const BatchNormGeom shapes[] = {{2, 3, 1, 1e-5f},    {5, 7, 9, 1e-5f},    {1, 4, 33, 1e-3f},
                                  {8, 3, 1089, 1e-5f}, {3, 16, 64, 1e-5f},  {16, 2, 1, 1e-5f},
                                  {4, 2, 4099, 1e-5f}, {64, 3, 256, 1e-5f}, {9000, 2, 1, 1e-5f},
                                  {2, 1, 40961, 1e-5f}};
  for (const BatchNormGeom& g : shapes) {
    SCOPED_TRACE(fmt::format("N{} C{} HW{}", g.n, g.c, g.hw));
    const size_t n = g.n * g.c * g.hw, c = g.c;
    // An offset mean, so a one-pass variance would lose digits.
    const std::vector<float> x = random_floats(n, rng, 2.0f, 4.0f);
    const std::vector<float> dy = random_floats(n, rng);
    const std::vector<float> gamma = random_floats(c, rng, 0.5f, 1.5f);
    const std::vector<float> beta = random_floats(c, rng);
    const std::vector<float> rm0 = random_floats(c, rng), rv0 = random_floats(c, rng, 0.5f, 2.0f);
    const float momentum = 0.1f;

    BnResult cpu_r{poisoned(n), rm0,         rv0,         poisoned(c), poisoned(c),
                   poisoned(n), poisoned(c), poisoned(c), poisoned(n)};
    cpu(BatchNormForwardTraining{g, momentum, x.data(), gamma.data(), beta.data(), cpu_r.y.data(),
                                 cpu_r.running_mean.data(), cpu_r.running_var.data(),
                                 cpu_r.save_mean.data(), cpu_r.save_var.data()});
    cpu(BatchNormBackward{g, x.data(), dy.data(), gamma.data(), cpu_r.save_mean.data(),
                          cpu_r.save_var.data(), cpu_r.dx.data(), cpu_r.dgamma.data(),
                          cpu_r.dbeta.data()});
    cpu(BatchNormForwardInference{g, x.data(), gamma.data(), beta.data(), rm0.data(), rv0.data(),
                                  cpu_r.infer.data()});

    // Twice on the GPU: the reductions must repeat bit for bit.
    BnResult runs[2];
    for (BnResult& r : runs) {
      const float* gx = mem_.upload(x);
      const float* gdy = mem_.upload(dy);
      const float* ggamma = mem_.upload(gamma);
      const float* gbeta = mem_.upload(beta);
      float* grm = mem_.upload(rm0);
      float* grv = mem_.upload(rv0);
      float* gy = mem_.alloc<float>(n);
      float* gsm = mem_.alloc<float>(c);
      float* gsv = mem_.alloc<float>(c);
      float* gdx = mem_.alloc<float>(n);
      float* gdg = mem_.alloc<float>(c);
      float* gdb = mem_.alloc<float>(c);
      float* ginf = mem_.alloc<float>(n);
      gpu(BatchNormForwardTraining{g, momentum, gx, ggamma, gbeta, gy, grm, grv, gsm, gsv});
      gpu(BatchNormBackward{g, gx, gdy, ggamma, gsm, gsv, gdx, gdg, gdb});
      gpu(BatchNormForwardInference{g, gx, ggamma, gbeta, mem_.upload(rm0), mem_.upload(rv0),
                                    ginf});
      r = {mem_.download(gy, n),  mem_.download(grm, c), mem_.download(grv, c),
           mem_.download(gsm, c), mem_.download(gsv, c), mem_.download(gdx, n),
           mem_.download(gdg, c), mem_.download(gdb, c), mem_.download(ginf, n)};
    }
    const BnResult& r = runs[0];
    EXPECT_TRUE(close(r.y, cpu_r.y));
    EXPECT_TRUE(close(r.save_mean, cpu_r.save_mean));
    EXPECT_TRUE(close(r.save_var, cpu_r.save_var));
    EXPECT_TRUE(close(r.running_mean, cpu_r.running_mean));
    EXPECT_TRUE(close(r.running_var, cpu_r.running_var));
    EXPECT_TRUE(close(r.dx, cpu_r.dx));
    EXPECT_TRUE(close(r.dgamma, cpu_r.dgamma));
    EXPECT_TRUE(close(r.dbeta, cpu_r.dbeta));
    EXPECT_TRUE(close(r.infer, cpu_r.infer));
    if (kSameMathAsCpu) {
      EXPECT_TRUE(bitwise(r.y, cpu_r.y));
      EXPECT_TRUE(bitwise(r.save_mean, cpu_r.save_mean));
      EXPECT_TRUE(bitwise(r.save_var, cpu_r.save_var));
      EXPECT_TRUE(bitwise(r.running_mean, cpu_r.running_mean));
      EXPECT_TRUE(bitwise(r.running_var, cpu_r.running_var));
      EXPECT_TRUE(bitwise(r.dx, cpu_r.dx));
      EXPECT_TRUE(bitwise(r.dgamma, cpu_r.dgamma));
      EXPECT_TRUE(bitwise(r.dbeta, cpu_r.dbeta));
      EXPECT_TRUE(bitwise(r.infer, cpu_r.infer));
    }
    EXPECT_TRUE(bitwise(runs[1].y, r.y));
    EXPECT_TRUE(bitwise(runs[1].save_var, r.save_var));
    EXPECT_TRUE(bitwise(runs[1].dx, r.dx));
    EXPECT_TRUE(bitwise(runs[1].dgamma, r.dgamma));
  }
}

// Every output of batch norm's training forward and backward, as bits.
std::vector<std::vector<float>> bn_outputs(FERRY_PARITY_SUITE& t, GpuArena& mem,
                                           const BatchNormGeom& g, const std::vector<float>& x,
                                           const std::vector<float>& dy) {
  const size_t n = g.n * g.c * g.hw, c = g.c;
  const std::vector<float> gamma(c, 1.25f), beta(c, -0.5f), rm(c, 0.25f), rv(c, 1.5f);
  const float* gx = mem.upload(x);
  const float* ggamma = mem.upload(gamma);
  float* grm = mem.upload(rm);
  float* grv = mem.upload(rv);
  float* gy = mem.alloc<float>(n);
  float* gsm = mem.alloc<float>(c);
  float* gsv = mem.alloc<float>(c);
  float* gdx = mem.alloc<float>(n);
  float* gdg = mem.alloc<float>(c);
  float* gdb = mem.alloc<float>(c);
  t.gpu(BatchNormForwardTraining{g, 0.1f, gx, ggamma, mem.upload(beta), gy, grm, grv, gsm, gsv});
  t.gpu(BatchNormBackward{g, gx, mem.upload(dy), ggamma, gsm, gsv, gdx, gdg, gdb});
  return {mem.download(gy, n),  mem.download(grm, c), mem.download(grv, c), mem.download(gsm, c),
          mem.download(gsv, c), mem.download(gdx, n), mem.download(gdg, c), mem.download(gdb, c)};
}

// Note [Deterministic multi-block reductions]: the grid follows the SM count, the chunks and
// their order follow the shape only, so GPUs of 1 to 132 SMs give the same bits.
TEST_F(FERRY_PARITY_SUITE, BatchNormBitsDoNotDependOnTheGrid) {
  std::mt19937 rng(22);
  const BatchNormGeom g{6, 5, 3001, 1e-5f};  // 5 chunks per channel, 25 in all
  const size_t n = g.n * g.c * g.hw;
  const std::vector<float> x = random_floats(n, rng, 2.0f, 4.0f), dy = random_floats(n, rng);
  std::vector<std::vector<std::vector<float>>> runs;
  for (const int sm_count : {132, 1, 2, 5, 7}) {  // 25, 4, 8, 20 and 25 blocks
    target_->set_sm_count(sm_count);
    runs.push_back(bn_outputs(*this, mem_, g, x, dy));
  }
  target_->set_sm_count(132);
  for (size_t r = 1; r < runs.size(); ++r) {
    for (size_t i = 0; i < runs[0].size(); ++i) {
      EXPECT_TRUE(bitwise(runs[r][i], runs[0][i])) << "run " << r << " output " << i;
    }
  }
  // And the values are the CPU backend's, within the reduction tolerance.
  std::vector<float> y = poisoned(n), sm = poisoned(g.c), sv = poisoned(g.c);
  const std::vector<float> gamma(g.c, 1.25f), beta(g.c, -0.5f);
  cpu(BatchNormForwardTraining{g, 0.1f, x.data(), gamma.data(), beta.data(), y.data(), nullptr,
                               nullptr, sm.data(), sv.data()});
  EXPECT_TRUE(close(runs[0][0], y));
  EXPECT_TRUE(close(runs[0][4], sv));
  if (kSameMathAsCpu) {
    EXPECT_TRUE(bitwise(runs[0][0], y));
    EXPECT_TRUE(bitwise(runs[0][3], sm));
    EXPECT_TRUE(bitwise(runs[0][4], sv));
  }
}

// Values that cancel (2^60 - 2^60 + 1) make every level of Note [Batch norm's summation order]
// show in the bits: another order in a lane, in the lane tree or among the chunks loses the 1 or
// keeps a 1 that the order drops. One channel of 3 * 4096 values: three chunks.
std::vector<float> cancelling_channel() {
  const float big = 0x1p60f, bigger = 0x1p61f;
  std::vector<float> v(3 * 4096, 0.0f);
  v[0] = big;            // chunk 0: 2^60
  v[4096] = -big;        // chunk 1: -2^60
  v[8192] = big;         // chunk 2, lane 0 ...
  v[8192 + 128] = -big;  // ... cancels lane 128 at the tree's first level ...
  v[8192 + 1] = 1.0f;    // ... so lane 1's 1 survives;
  v[8192 + 2] = 1.0f;    // lane 2 in order: 1 + 2^61 absorbs the 1,
  v[8192 + 2 + 256] = bigger;
  v[8192 + 2 + 512] = -bigger;  // and -2^61 leaves 0
  return v;
}

TEST_F(FERRY_PARITY_SUITE, BatchNormSumsInTheSharedOrder) {
  const BatchNormGeom g{1, 1, 3 * 4096, 1e-5f};
  const size_t n = 3 * 4096;
  const std::vector<float> x = cancelling_channel(), dy = cancelling_channel();
  const std::vector<float> one = {1.0f}, zero = {0.0f};
  float* gsm = mem_.alloc<float>(1);
  float* gsv = mem_.alloc<float>(1);
  float* gdg = mem_.alloc<float>(1);
  float* gdb = mem_.alloc<float>(1);
  const float* gx = mem_.upload(x);
  gpu(BatchNormForwardTraining{g, 0.1f, gx, mem_.upload(one), mem_.upload(zero),
                               mem_.alloc<float>(n), nullptr, nullptr, gsm, gsv});
  gpu(BatchNormBackward{g, gx, mem_.upload(dy), mem_.upload(one), gsm, gsv, mem_.alloc<float>(n),
                        gdg, gdb});
  // The channel sums to exactly 1 in this order (every step is exact), on every target.
  EXPECT_EQ(mem_.download(gsm, 1)[0], static_cast<float>(1.0 / static_cast<double>(n)));
  EXPECT_EQ(mem_.download(gdb, 1)[0], 1.0f);
  std::vector<float> sm = poisoned(1), sv = poisoned(1), y = poisoned(n), dx = poisoned(n),
                     dg = poisoned(1), db = poisoned(1);
  cpu(BatchNormForwardTraining{g, 0.1f, x.data(), one.data(), zero.data(), y.data(), nullptr,
                               nullptr, sm.data(), sv.data()});
  cpu(BatchNormBackward{g, x.data(), dy.data(), one.data(), sm.data(), sv.data(), dx.data(),
                        dg.data(), db.data()});
  EXPECT_EQ(sm[0], static_cast<float>(1.0 / static_cast<double>(n)));
  EXPECT_EQ(db[0], 1.0f);
  EXPECT_TRUE(bitwise(mem_.download(gsv, 1), sv));
  EXPECT_TRUE(bitwise(mem_.download(gdg, 1), dg));
}

// Kernels made without a device (for planning) have no reduction scratch: the reducing kernels
// check their arguments first, then refuse by name, before touching any memory.
TEST_F(FERRY_PARITY_SUITE, ReducingKernelsWithoutScratchAreRefusedByName) {
  const cuda::ReductionScratch none;
  EXPECT_THROW(cuda::run(BatchNormForwardTraining{.g = {.n = 1, .c = 3, .hw = 1}}, nullptr, none),
               ConfigError);
  try {
    cuda::run(BatchNormBackward{.g = {.n = 2, .c = 3, .hw = 4}}, nullptr, none);
    ADD_FAILURE() << "no UnsupportedError";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("batch_norm_backward"), std::string::npos) << e.what();
  }
  EXPECT_THROW(cuda::run(SoftmaxCrossEntropyForward{.n = 2, .k = 3}, nullptr, none),
               UnsupportedError);
}

// More channels than the reduction scratch holds statistics for: refused before any launch.
TEST_F(FERRY_PARITY_SUITE, BatchNormRefusesChannelsBeyondTheScratch) {
  const BatchNormGeom g{2, 4097, 1, 1e-5f};
  try {
    gpu(BatchNormForwardTraining{.g = g});
    ADD_FAILURE() << "no UnsupportedError";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("4097 channels"), std::string::npos) << e.what();
  }
}

// ---- elementwise ---------------------------------------------------------------------------

TEST_F(FERRY_PARITY_SUITE, ReluAddAccumulateCopyAreBitwise) {
  std::mt19937 rng(31);
  for (const size_t n : {size_t{1}, size_t{1000}, size_t{4097}, size_t{1} << 20 | 3}) {
    SCOPED_TRACE(n);
    std::vector<float> a = random_floats(n, rng), b = random_floats(n, rng);
    a[0] = NAN;  // ReLU keeps NaN (PyTorch's clamp_min)
    std::vector<float> relu = poisoned(n), relu_grad = poisoned(n), sum = poisoned(n), acc = b;
    cpu(ReluForward{static_cast<int64_t>(n), a.data(), relu.data()});
    cpu(ReluBackward{static_cast<int64_t>(n), relu.data(), b.data(), relu_grad.data()});
    cpu(AddForward{static_cast<int64_t>(n), a.data(), b.data(), sum.data()});
    cpu(Accumulate{static_cast<int64_t>(n), a.data(), acc.data()});

    const float* ga = mem_.upload(a);
    const float* gb = mem_.upload(b);
    float* grelu = mem_.alloc<float>(n);
    float* ggrad = mem_.alloc<float>(n);
    float* gsum = mem_.alloc<float>(n);
    float* gacc = mem_.upload(b);
    float* gcopy = mem_.alloc<float>(n);
    gpu(ReluForward{static_cast<int64_t>(n), ga, grelu});
    gpu(ReluBackward{static_cast<int64_t>(n), grelu, gb, ggrad});
    gpu(AddForward{static_cast<int64_t>(n), ga, gb, gsum});
    gpu(Accumulate{static_cast<int64_t>(n), ga, gacc});
    gpu(CopyDevice{n * sizeof(float), gb, gcopy});
    EXPECT_TRUE(bitwise(mem_.download(grelu, n), relu));
    EXPECT_TRUE(bitwise(mem_.download(ggrad, n), relu_grad));
    EXPECT_TRUE(bitwise(mem_.download(gsum, n), sum));
    EXPECT_TRUE(bitwise(mem_.download(gacc, n), acc));
    EXPECT_TRUE(bitwise(mem_.download(gcopy, n), b));
  }
}

TEST_F(FERRY_PARITY_SUITE, DropoutMasksAndValuesAreBitwise) {
  std::mt19937 rng(32);
  for (const float p : {0.0f, 0.1f, 0.5f, 0.9f, 1.0f}) {
    const size_t n = 100003;
    const uint64_t seed = 0x5eedull + static_cast<uint64_t>(p * 10), offset = 12345;
    SCOPED_TRACE(p);
    const std::vector<float> x = random_floats(n, rng), dy = random_floats(n, rng);
    std::vector<float> y = poisoned(n), dx = poisoned(n);
    std::vector<uint8_t> mask(n, 7);
    cpu(DropoutForward{static_cast<int64_t>(n), p, seed, offset, x.data(), y.data(), mask.data()});
    cpu(DropoutBackward{static_cast<int64_t>(n), p, dy.data(), mask.data(), dx.data()});
    float* gy = mem_.alloc<float>(n);
    float* gdx = mem_.alloc<float>(n);
    uint8_t* gmask = mem_.alloc<uint8_t>(n);
    gpu(DropoutForward{static_cast<int64_t>(n), p, seed, offset, mem_.upload(x), gy, gmask});
    gpu(DropoutBackward{static_cast<int64_t>(n), p, mem_.upload(dy), gmask, gdx});
    EXPECT_TRUE(bitwise(mem_.download(gmask, n), mask));
    EXPECT_TRUE(bitwise(mem_.download(gy, n), y));
    EXPECT_TRUE(bitwise(mem_.download(gdx, n), dx));
  }
}

// ---- loss ------------------------------------------------------------------------------------

TEST_F(FERRY_PARITY_SUITE, SoftmaxCrossEntropyRandomShapes) {
  std::mt19937 rng(41);
  // From one block of rows to many (32 rows a block); 20000 rows take two scratch pieces.
  const int64_t shapes[][2] = {{1, 1},    {1, 10},    {7, 3},     {128, 10},
                               {300, 17}, {33, 1000}, {257, 100}, {20000, 3}};
  for (const auto& shape : shapes) {
    const int64_t n = shape[0], k = shape[1];
    SCOPED_TRACE(fmt::format("N{} K{}", n, k));
    const std::vector<float> logits = random_floats(n * k, rng, -6.0f, 6.0f);
    std::vector<int32_t> labels(n);
    for (auto& l : labels) l = static_cast<int32_t>(pick(rng, 0, k - 1));
    std::vector<float> loss = poisoned(1), probs = poisoned(n * k), dlogits = poisoned(n * k);
    int32_t correct = -1;
    const float scale = 0.5f;
    cpu(SoftmaxCrossEntropyForward{n, k, logits.data(), labels.data(), loss.data(), probs.data(),
                                   &correct});
    cpu(SoftmaxCrossEntropyBackward{n, k, scale, probs.data(), labels.data(), dlogits.data()});

    std::vector<float> losses;
    for (int run = 0; run < 2; ++run) {
      const float* glogits = mem_.upload(logits);
      const int32_t* glabels = mem_.upload(labels);
      float* gloss = mem_.alloc<float>(1);
      float* gprobs = mem_.alloc<float>(n * k);
      float* gd = mem_.alloc<float>(n * k);
      int32_t* gcorrect = mem_.alloc<int32_t>(1);
      gpu(SoftmaxCrossEntropyForward{n, k, glogits, glabels, gloss, gprobs, gcorrect});
      gpu(SoftmaxCrossEntropyBackward{n, k, scale, gprobs, glabels, gd});
      losses.push_back(mem_.download(gloss, 1)[0]);
      EXPECT_EQ(mem_.download(gcorrect, 1)[0], correct);
      EXPECT_TRUE(close(mem_.download(gprobs, n * k), probs));
      EXPECT_TRUE(close(mem_.download(gd, n * k), dlogits));
    }
    EXPECT_TRUE(close({losses[0]}, loss));
    // Rows summed in row order as on the CPU: with the same exp and log, the same bits.
    if (kSameMathAsCpu) {
      EXPECT_TRUE(bitwise(std::vector<float>{losses[0]}, loss));
    }
    EXPECT_TRUE(bitwise(std::vector<float>{losses[1]}, std::vector<float>{losses[0]}));
  }
}

// Padding rows (label -1) add exactly nothing; the total is divided by the given divisor
// (Note [The mean over real tokens] in trainer/data/documents.h). The same as the CPU backend.
TEST_F(FERRY_PARITY_SUITE, SoftmaxCrossEntropyPaddingRowsAndDivisor) {
  std::mt19937 rng(42);
  const int64_t n = 300, k = 17;
  const std::vector<float> logits = random_floats(n * k, rng, -6.0f, 6.0f);
  std::vector<int32_t> labels(n);
  int64_t labelled = 0;
  for (auto& l : labels) {
    l = pick(rng, 0, 3) == 0 ? -1 : static_cast<int32_t>(pick(rng, 0, k - 1));
    labelled += l >= 0 ? 1 : 0;
  }
  for (const float divisor : {0.0f, static_cast<float>(labelled), 123.5f}) {
    SCOPED_TRACE(fmt::format("divisor {}", divisor));
    std::vector<float> loss = poisoned(1), probs = poisoned(n * k), dlogits = poisoned(n * k);
    int32_t correct = -1;
    cpu(SoftmaxCrossEntropyForward{n, k, logits.data(), labels.data(), loss.data(), probs.data(),
                                   &correct, divisor});
    cpu(SoftmaxCrossEntropyBackward{n, k, 1.0f, probs.data(), labels.data(), dlogits.data(),
                                    divisor});
    const int32_t* glabels = mem_.upload(labels);
    float* gloss = mem_.alloc<float>(1);
    float* gprobs = mem_.alloc<float>(n * k);
    float* gd = mem_.alloc<float>(n * k);
    int32_t* gcorrect = mem_.alloc<int32_t>(1);
    gpu(SoftmaxCrossEntropyForward{n, k, mem_.upload(logits), glabels, gloss, gprobs, gcorrect,
                                   divisor});
    gpu(SoftmaxCrossEntropyBackward{n, k, 1.0f, gprobs, glabels, gd, divisor});
    EXPECT_TRUE(close(mem_.download(gloss, 1), loss));
    if (kSameMathAsCpu) EXPECT_TRUE(bitwise(mem_.download(gloss, 1), loss));
    EXPECT_EQ(mem_.download(gcorrect, 1)[0], correct);
    const std::vector<float> d = mem_.download(gd, n * k);
    EXPECT_TRUE(close(d, dlogits));
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t j = 0; labels[i] < 0 && j < k; ++j) ASSERT_EQ(d[i * k + j], 0.0f) << i;
    }
  }
}

TEST_F(FERRY_PARITY_SUITE, SoftmaxCrossEntropyBadLabelReadsNaN) {
  const std::vector<float> logits = {1.0f, 2.0f, 3.0f, 0.5f, 0.5f, 0.5f};
  const std::vector<int32_t> labels = {2, 3};  // 3 is outside [0, 3)
  float* gloss = mem_.alloc<float>(1);
  float* gd = mem_.alloc<float>(6);
  float* gprobs = mem_.alloc<float>(6);
  const int32_t* glabels = mem_.upload(labels);
  gpu(SoftmaxCrossEntropyForward{2, 3, mem_.upload(logits), glabels, gloss, gprobs, nullptr});
  gpu(SoftmaxCrossEntropyBackward{2, 3, 1.0f, gprobs, glabels, gd});
  EXPECT_TRUE(std::isnan(mem_.download(gloss, 1)[0]));
  const std::vector<float> d = mem_.download(gd, 6);
  EXPECT_FALSE(std::isnan(d[0]));
  EXPECT_TRUE(std::isnan(d[3]));
}

// ---- optimizers ------------------------------------------------------------------------------

TEST_F(FERRY_PARITY_SUITE, SgdVariants) {
  std::mt19937 rng(51);
  struct Case {
    float momentum, wd;
    bool nesterov;
  };
  for (const Case& c :
       {Case{0.0f, 0.0f, false}, Case{0.9f, 5e-4f, false}, Case{0.9f, 1e-4f, true}}) {
    const size_t n = 70001;
    SCOPED_TRACE(fmt::format("momentum {}{}", c.momentum, c.nesterov ? " nesterov" : ""));
    std::vector<float> p = random_floats(n, rng), buf = random_floats(n, rng);
    const std::vector<float> g = random_floats(n, rng);
    float* gp = mem_.upload(p);
    float* gbuf = mem_.upload(buf);
    const float* gg = mem_.upload(g);
    for (int step = 0; step < 3; ++step) {
      SgdUpdate u{static_cast<int64_t>(n),
                  0.05f,
                  c.momentum,
                  c.wd,
                  c.nesterov,
                  p.data(),
                  g.data(),
                  c.momentum != 0.0f ? buf.data() : nullptr};
      cpu(u);
      u.param = gp;
      u.grad = gg;
      u.momentum_buf = c.momentum != 0.0f ? gbuf : nullptr;
      gpu(u);
    }
    EXPECT_TRUE(close(mem_.download(gp, n), p));
    EXPECT_TRUE(close(mem_.download(gbuf, n), buf));
  }
}

TEST_F(FERRY_PARITY_SUITE, AdamW) {
  std::mt19937 rng(52);
  const size_t n = 50021;
  std::vector<float> p = random_floats(n, rng), m(n, 0.0f), v(n, 0.0f);
  float* gp = mem_.upload(p);
  float* gm = mem_.upload(m);
  float* gv = mem_.upload(v);
  for (int64_t step = 1; step <= 4; ++step) {
    const std::vector<float> g = random_floats(n, rng);
    AdamWUpdate u{static_cast<int64_t>(n),
                  1e-3f,
                  0.9f,
                  0.999f,
                  1e-8f,
                  0.01f,
                  step,
                  p.data(),
                  g.data(),
                  m.data(),
                  v.data()};
    cpu(u);
    u.param = gp;
    u.grad = mem_.upload(g);
    u.m = gm;
    u.v = gv;
    gpu(u);
  }
  EXPECT_TRUE(close(mem_.download(gp, n), p));
  EXPECT_TRUE(close(mem_.download(gm, n), m));
  EXPECT_TRUE(close(mem_.download(gv, n), v, kRel, 1e-9));
}

// ---- argument errors ---------------------------------------------------------------------------

// The ConfigError `launch` throws, as "message | hint"; anything else fails the test.
template <typename Launch>
std::string config_error(Launch&& launch) {
  try {
    launch();
  } catch (const ConfigError& e) {
    return fmt::format("{} | {}", e.what(), e.hint());
  }
  ADD_FAILURE() << "no ConfigError";
  return {};
}

// Both backends run device/kernel_checks.h before touching memory, so every bad argument reads
// the same, hint included (the pointers are never read).
TEST_F(FERRY_PARITY_SUITE, InvalidArgumentsReadAsOnTheCpu) {
  PoolGeom wide_pad;
  wide_pad.kh = wide_pad.kw = 2;
  wide_pad.pad_h = 2;  // more than half the kernel
  PoolGeom no_stride;
  no_stride.kind = PoolKind::kAvg;
  no_stride.stride_w = 0;
  const std::vector<KernelArgs> bad = {
      PoolForward{.g = wide_pad},
      PoolBackward{.g = no_stride},
      AdaptiveAvgPoolForward{.oh = 0},
      AdaptiveAvgPoolBackward{.c = -1},
      BatchNormForwardTraining{.g = {.n = 1, .c = 3, .hw = 1}},  // one value per channel
      BatchNormForwardInference{.g = {.n = 2, .c = 0, .hw = 4}},
      BatchNormBackward{.g = {.n = 2, .c = 3, .hw = 0}},
      ReluForward{.n = -1},
      AddForward{.n = -3},
      DropoutForward{.n = 8, .p = 1.5f},
      DropoutForward{.n = 8, .p = NAN},
      DropoutBackward{.n = -2},
      SoftmaxCrossEntropyForward{.n = 4, .k = 0},
      SoftmaxCrossEntropyBackward{.n = 0, .k = 10},
      SgdUpdate{.n = 4, .momentum = 0.9f},  // no momentum buffer
      SgdUpdate{.n = -1},
      AdamWUpdate{.n = 4, .step = 0},
  };
  for (const KernelArgs& args : bad) {
    SCOPED_TRACE(kernel_name(args));
    const std::string on_cpu = config_error([&] { cpu(args); });
    EXPECT_NE(on_cpu.find(kernel_name(args)), std::string::npos) << on_cpu;
    EXPECT_EQ(config_error([&] { gpu(args); }), on_cpu);
  }
}

}  // namespace
}  // namespace ferry
