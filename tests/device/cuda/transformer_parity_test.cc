// Transformer kernel parity: embedding, layer norm, GELU, the gradient-clipping reductions and
// the attention core, on seeded random shapes. Each is checked twice: against a plain float64
// (or, where the contract fixes the float order, bit-exact float) reference written here, and
// against the CPU backend. Reductions must repeat bit for bit, and not depend on the grid. Runs
// on the GPU (cuda_target.cc; skips without one) and on the host emulation (emulated_target.cc),
// where the cuBLAS attention is absent: its softmax, mask and dropout kernels are checked there
// directly instead.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <numbers>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "device/counter_rng.h"
#include "device/cpu/cpu_kernels.h"
#include "device/cuda/cuda_ops.h"
#include "device/cuda/transformer_ops.h"
#include "tests/device/cuda/parity_helpers.h"
#include "tests/device/cuda/parity_target.h"

// CudaTransformerParityTest on the GPU, EmulatedCudaTransformerParityTest for the emulation.
#ifndef FERRY_PARITY_SUITE
#define FERRY_PARITY_SUITE CudaTransformerParityTest
#endif

// Runs `args` on the CPU backend, or skips the test while the CPU's transformer kernels are not
// written (they land in another branch); any other error propagates.
#define FERRY_CPU_OR_SKIP(args)                                                         \
  do {                                                                                  \
    try {                                                                               \
      cpu(args);                                                                        \
    } catch (const UnsupportedError& cpu_error) {                                       \
      if (std::string(cpu_error.what()).find("not written yet") == std::string::npos) { \
        throw;                                                                          \
      }                                                                                 \
      GTEST_SKIP() << "the CPU backend's " << kernel_name(KernelArgs(args))             \
                   << " is not written yet";                                            \
    }                                                                                   \
  } while (0)

namespace ferry {
namespace {

class FERRY_PARITY_SUITE : public ParityFixture {};

std::vector<int32_t> random_tokens(size_t n, int64_t vocab, std::mt19937& rng) {
  std::vector<int32_t> v(n);
  for (auto& x : v) x = static_cast<int32_t>(pick(rng, 0, vocab - 1));
  return v;
}

// ---- embedding -------------------------------------------------------------------------------

struct EmbeddingCase {
  int64_t n, t, c, vocab, context;
};

const EmbeddingCase kEmbeddingCases[] = {{1, 1, 1, 1, 1},
                                         {2, 5, 3, 7, 9},
                                         {3, 17, 33, 5, 20},
                                         {4, 64, 48, 300, 64},
                                         {2, 9, 300, 40, 16}};

// The contract's float order: y = wte[token] + wpe[p], p the position (t, or t - segments[n, t]
// for packed documents); dwte rows accumulated in increasing (n, t) (onto dwte when
// accumulating), dwpe rows onto 0 in increasing (n, t) (without segments: over n in increasing
// order, the same additions).
struct EmbeddingResult {
  std::vector<float> y, dwte, dwpe;
};

EmbeddingResult embedding_reference(const EmbeddingCase& e, const std::vector<int32_t>& tokens,
                                    const std::vector<float>& wte, const std::vector<float>& wpe,
                                    const std::vector<float>& dy,
                                    const std::vector<float>& dwte_before, bool accumulate,
                                    const std::vector<int32_t>& segments) {
  const auto position = [&](int64_t row) {
    return row % e.t - (segments.empty() ? 0 : segments[row]);
  };
  EmbeddingResult r;
  r.y.resize(e.n * e.t * e.c);
  for (int64_t row = 0; row < e.n * e.t; ++row) {
    for (int64_t j = 0; j < e.c; ++j) {
      r.y[row * e.c + j] = wte[tokens[row] * e.c + j] + wpe[position(row) * e.c + j];
    }
  }
  r.dwte = accumulate ? dwte_before : std::vector<float>(e.vocab * e.c, 0.0f);
  for (int64_t row = 0; row < e.n * e.t; ++row) {
    for (int64_t j = 0; j < e.c; ++j) r.dwte[tokens[row] * e.c + j] += dy[row * e.c + j];
  }
  r.dwpe.assign(e.context * e.c, 0.0f);
  for (int64_t row = 0; row < e.n * e.t; ++row) {
    for (int64_t j = 0; j < e.c; ++j) r.dwpe[position(row) * e.c + j] += dy[row * e.c + j];
  }
  return r;
}

struct EmbeddingData {
  std::vector<int32_t> tokens, segments;
  std::vector<float> wte, wpe, dy, dwte_before;
  // `segmented`: rows of packed documents of 1 to 6 positions (Note [Segments of a packed row]).
  EmbeddingData(const EmbeddingCase& e, std::mt19937& rng, bool segmented) {
    // Fewer distinct tokens than positions, so rows repeat and the accumulation order shows,
    // spread over several owner blocks.
    tokens = random_tokens(e.n * e.t, std::min<int64_t>(e.vocab, 4 + e.t), rng);
    wte = random_floats(e.vocab * e.c, rng);
    wpe = random_floats(e.context * e.c, rng);
    dy = random_floats(e.n * e.t * e.c, rng, -100.0f, 100.0f);
    dwte_before = random_floats(e.vocab * e.c, rng, -1000.0f, 1000.0f);
    if (!segmented) return;
    for (int64_t b = 0; b < e.n; ++b) {
      int64_t start = 0, left = 0;
      for (int64_t i = 0; i < e.t; ++i) {
        if (left == 0) start = i, left = pick(rng, 1, 6);
        segments.push_back(static_cast<int32_t>(start));
        --left;
      }
    }
  }
  const int32_t* segments_or_null() const { return segments.empty() ? nullptr : segments.data(); }
};

EmbeddingResult embedding_on_target(FERRY_PARITY_SUITE& t, GpuArena& mem, const EmbeddingCase& e,
                                    const EmbeddingData& d, bool accumulate) {
  const int32_t* tokens = mem.upload(d.tokens);
  const int32_t* segments = d.segments.empty() ? nullptr : mem.upload(d.segments);
  float* y = mem.alloc<float>(e.n * e.t * e.c);
  float* dwte = accumulate ? mem.upload(d.dwte_before) : mem.alloc<float>(e.vocab * e.c);
  float* dwpe = mem.alloc<float>(e.context * e.c);
  t.gpu(EmbeddingForward{e.n, e.t, e.c, e.vocab, tokens, mem.upload(d.wte), mem.upload(d.wpe), y,
                         segments});
  t.gpu(EmbeddingBackward{e.n, e.t, e.c, e.vocab, e.context, tokens, mem.upload(d.dy), dwte, dwpe,
                          accumulate, segments});
  return {mem.download(y, e.n * e.t * e.c), mem.download(dwte, e.vocab * e.c),
          mem.download(dwpe, e.context * e.c)};
}

TEST_F(FERRY_PARITY_SUITE, EmbeddingIsTheContractsFloatOrder) {
  std::mt19937 rng(61);
  for (const EmbeddingCase& e : kEmbeddingCases) {
    for (const bool accumulate : {false, true}) {
      for (const bool segmented : {false, true}) {
        SCOPED_TRACE(fmt::format("N{} T{} C{} vocab{} context{}{}{}", e.n, e.t, e.c, e.vocab,
                                 e.context, accumulate ? " accumulate" : "",
                                 segmented ? " segments" : ""));
        const EmbeddingData d(e, rng, segmented);
        const EmbeddingResult want = embedding_reference(e, d.tokens, d.wte, d.wpe, d.dy,
                                                         d.dwte_before, accumulate, d.segments);
        const EmbeddingResult got = embedding_on_target(*this, mem_, e, d, accumulate);
        EXPECT_TRUE(bitwise(got.y, want.y));
        EXPECT_TRUE(bitwise(got.dwte, want.dwte));
        EXPECT_TRUE(bitwise(got.dwpe, want.dwpe));
      }
    }
  }
}

TEST_F(FERRY_PARITY_SUITE, EmbeddingMatchesTheCpuBackend) {
  std::mt19937 rng(62);
  for (const EmbeddingCase& e : kEmbeddingCases) {
    for (const bool accumulate : {false, true}) {
      for (const bool segmented : {false, true}) {
        SCOPED_TRACE(fmt::format("N{} T{} C{}{}{}", e.n, e.t, e.c, accumulate ? " accumulate" : "",
                                 segmented ? " segments" : ""));
        const EmbeddingData d(e, rng, segmented);
        EmbeddingResult cpu_r{poisoned(e.n * e.t * e.c), d.dwte_before, poisoned(e.context * e.c)};
        if (!accumulate) cpu_r.dwte = poisoned(e.vocab * e.c);
        FERRY_CPU_OR_SKIP((EmbeddingForward{e.n, e.t, e.c, e.vocab, d.tokens.data(), d.wte.data(),
                                            d.wpe.data(), cpu_r.y.data(), d.segments_or_null()}));
        FERRY_CPU_OR_SKIP((EmbeddingBackward{e.n, e.t, e.c, e.vocab, e.context, d.tokens.data(),
                                             d.dy.data(), cpu_r.dwte.data(), cpu_r.dwpe.data(),
                                             accumulate, d.segments_or_null()}));
        const EmbeddingResult got = embedding_on_target(*this, mem_, e, d, accumulate);
        // No atomics on either side: the same additions in the same order.
        EXPECT_TRUE(bitwise(got.y, cpu_r.y));
        EXPECT_TRUE(bitwise(got.dwte, cpu_r.dwte));
        EXPECT_TRUE(bitwise(got.dwpe, cpu_r.dwpe));
      }
    }
  }
}

// ---- layer norm ------------------------------------------------------------------------------

const LayerNormGeom kLayerNormCases[] = {{1, 1, 1e-5f},    {3, 7, 1e-5f},     {5, 33, 1e-5f},
                                         {17, 64, 1e-5f},  {40, 300, 1e-5f},  {2, 768, 1e-5f},
                                         {300, 12, 1e-3f}, {1000, 20, 1e-5f}, {9, 5000, 1e-5f}};

struct LayerNormResult {
  std::vector<float> y, mean, rstd, dx, dgamma, dbeta;
};

LayerNormResult layer_norm_reference(const LayerNormGeom& g, const std::vector<float>& x,
                                     const std::vector<float>& gamma,
                                     const std::vector<float>& beta, const std::vector<float>& dy) {
  const int64_t rows = g.rows, c = g.c;
  LayerNormResult r{std::vector<float>(rows * c), std::vector<float>(rows),
                    std::vector<float>(rows),     std::vector<float>(rows * c),
                    std::vector<float>(c),        std::vector<float>(c)};
  std::vector<double> dgamma(c, 0.0), dbeta(c, 0.0);
  for (int64_t i = 0; i < rows; ++i) {
    const float* xr = x.data() + i * c;
    const float* dyr = dy.data() + i * c;
    double mean = 0.0, var = 0.0;
    for (int64_t j = 0; j < c; ++j) mean += xr[j];
    mean /= static_cast<double>(c);
    for (int64_t j = 0; j < c; ++j) var += (xr[j] - mean) * (xr[j] - mean);
    var /= static_cast<double>(c);
    const double rstd = 1.0 / std::sqrt(var + g.eps);
    r.mean[i] = static_cast<float>(mean);
    r.rstd[i] = static_cast<float>(rstd);
    double a = 0.0, b = 0.0;
    for (int64_t j = 0; j < c; ++j) {
      const double xhat = (xr[j] - mean) * rstd;
      r.y[i * c + j] = static_cast<float>(xhat * gamma[j] + beta[j]);
      const double dxhat = static_cast<double>(dyr[j]) * gamma[j];
      a += dxhat;
      b += dxhat * xhat;
      dgamma[j] += dyr[j] * xhat;
      dbeta[j] += dyr[j];
    }
    for (int64_t j = 0; j < c; ++j) {
      const double xhat = (xr[j] - mean) * rstd;
      const double dxhat = static_cast<double>(dyr[j]) * gamma[j];
      r.dx[i * c + j] = static_cast<float>(rstd * (dxhat - a / c - xhat * b / c));
    }
  }
  for (int64_t j = 0; j < c; ++j) {
    r.dgamma[j] = static_cast<float>(dgamma[j]);
    r.dbeta[j] = static_cast<float>(dbeta[j]);
  }
  return r;
}

struct LayerNormData {
  std::vector<float> x, gamma, beta, dy;
  LayerNormData(const LayerNormGeom& g, std::mt19937& rng) {
    x = random_floats(g.rows * g.c, rng, 2.0f, 4.0f);  // an offset mean
    gamma = random_floats(g.c, rng, 0.5f, 1.5f);
    beta = random_floats(g.c, rng);
    dy = random_floats(g.rows * g.c, rng);
  }
};

// Forward then backward on the target; `in_place` passes dy's buffer as dx.
LayerNormResult layer_norm_on_target(FERRY_PARITY_SUITE& t, GpuArena& mem, const LayerNormGeom& g,
                                     const LayerNormData& d, bool in_place) {
  const size_t n = g.rows * g.c, c = g.c, rows = g.rows;
  const float* x = mem.upload(d.x);
  const float* gamma = mem.upload(d.gamma);
  float* y = mem.alloc<float>(n);
  float* mean = mem.alloc<float>(rows);
  float* rstd = mem.alloc<float>(rows);
  float* dy = mem.upload(d.dy);
  float* dx = in_place ? dy : mem.alloc<float>(n);
  float* dgamma = mem.alloc<float>(c);
  float* dbeta = mem.alloc<float>(c);
  t.gpu(LayerNormForward{g, x, gamma, mem.upload(d.beta), y, mean, rstd});
  t.gpu(LayerNormBackward{g, x, dy, gamma, mean, rstd, dx, dgamma, dbeta});
  return {mem.download(y, n),  mem.download(mean, rows), mem.download(rstd, rows),
          mem.download(dx, n), mem.download(dgamma, c),  mem.download(dbeta, c)};
}

void expect_layer_norm_close(const LayerNormResult& got, const LayerNormResult& want) {
  EXPECT_TRUE(close(got.y, want.y));
  EXPECT_TRUE(close(got.mean, want.mean));
  EXPECT_TRUE(close(got.rstd, want.rstd));
  EXPECT_TRUE(close(got.dx, want.dx, kRel, 1e-4));
  EXPECT_TRUE(close(got.dgamma, want.dgamma, kRel, 1e-4));
  EXPECT_TRUE(close(got.dbeta, want.dbeta, kRel, 1e-4));
}

TEST_F(FERRY_PARITY_SUITE, LayerNormMatchesFloat64AndRepeats) {
  std::mt19937 rng(71);
  for (const LayerNormGeom& g : kLayerNormCases) {
    SCOPED_TRACE(fmt::format("rows{} C{}", g.rows, g.c));
    const LayerNormData d(g, rng);
    const LayerNormResult got = layer_norm_on_target(*this, mem_, g, d, false);
    expect_layer_norm_close(got, layer_norm_reference(g, d.x, d.gamma, d.beta, d.dy));
    // In place (dx = dy) and again on another grid: the same bits.
    target_->set_sm_count(3);
    const LayerNormResult again = layer_norm_on_target(*this, mem_, g, d, true);
    target_->set_sm_count(132);
    EXPECT_TRUE(bitwise(again.y, got.y));
    EXPECT_TRUE(bitwise(again.dx, got.dx));
    EXPECT_TRUE(bitwise(again.dgamma, got.dgamma));
    EXPECT_TRUE(bitwise(again.dbeta, got.dbeta));
  }
}

TEST_F(FERRY_PARITY_SUITE, LayerNormMatchesTheCpuBackend) {
  std::mt19937 rng(72);
  for (const LayerNormGeom& g : kLayerNormCases) {
    SCOPED_TRACE(fmt::format("rows{} C{}", g.rows, g.c));
    const LayerNormData d(g, rng);
    const size_t n = g.rows * g.c;
    LayerNormResult cpu_r{poisoned(n), poisoned(g.rows), poisoned(g.rows),
                          poisoned(n), poisoned(g.c),    poisoned(g.c)};
    FERRY_CPU_OR_SKIP((LayerNormForward{g, d.x.data(), d.gamma.data(), d.beta.data(),
                                        cpu_r.y.data(), cpu_r.mean.data(), cpu_r.rstd.data()}));
    FERRY_CPU_OR_SKIP((LayerNormBackward{g, d.x.data(), d.dy.data(), d.gamma.data(),
                                         cpu_r.mean.data(), cpu_r.rstd.data(), cpu_r.dx.data(),
                                         cpu_r.dgamma.data(), cpu_r.dbeta.data()}));
    expect_layer_norm_close(layer_norm_on_target(*this, mem_, g, d, false), cpu_r);
  }
}

TEST_F(FERRY_PARITY_SUITE, LayerNormRefusesRowsWiderThanItsScratch) {
  const LayerNormGeom g{2, cuda::kLayerNormMaxColumns + 1, 1e-5f};
  try {
    gpu(LayerNormBackward{.g = g});
    ADD_FAILURE() << "no UnsupportedError";
  } catch (const UnsupportedError& e) {
    EXPECT_NE(std::string(e.what()).find("layer_norm_backward"), std::string::npos) << e.what();
  }
  EXPECT_THROW(gpu(LayerNormForward{.g = {.rows = 2, .c = 0}}), ConfigError);
}

// ---- GELU --------------------------------------------------------------------------------------

double gelu_ref(double x) {
  const double k = std::sqrt(2.0 / std::numbers::pi);
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

double gelu_grad_ref(double x) {
  const double k = std::sqrt(2.0 / std::numbers::pi);
  const double th = std::tanh(k * (x + 0.044715 * x * x * x));
  return 0.5 * (1.0 + th) + 0.5 * x * (1.0 - th * th) * k * (1.0 + 3.0 * 0.044715 * x * x);
}

struct GeluResult {
  std::vector<float> y, dx;
};

// Forward, then the backward in place (dx = dy).
GeluResult gelu_on_target(FERRY_PARITY_SUITE& t, GpuArena& mem, const std::vector<float>& x,
                          const std::vector<float>& dy) {
  const size_t n = x.size();
  const float* gx = mem.upload(x);
  float* gy = mem.alloc<float>(n);
  float* gdy = mem.upload(dy);
  t.gpu(GeluForward{static_cast<int64_t>(n), gx, gy});
  t.gpu(GeluBackward{static_cast<int64_t>(n), gx, gdy, gdy});
  return {mem.download(gy, n), mem.download(gdy, n)};
}

const size_t kGeluSizes[] = {1, 1000, 65537};

TEST_F(FERRY_PARITY_SUITE, GeluMatchesFloat64) {
  std::mt19937 rng(81);
  for (const size_t n : kGeluSizes) {
    SCOPED_TRACE(n);
    std::vector<float> x = random_floats(n, rng, -6.0f, 6.0f);
    x[0] = 0.0f;
    const std::vector<float> dy = random_floats(n, rng);
    std::vector<float> y_ref(n), dx_ref(n);
    for (size_t i = 0; i < n; ++i) {
      y_ref[i] = static_cast<float>(gelu_ref(x[i]));
      dx_ref[i] = static_cast<float>(dy[i] * gelu_grad_ref(x[i]));
    }
    const GeluResult got = gelu_on_target(*this, mem_, x, dy);
    EXPECT_TRUE(close(got.y, y_ref, 1e-5, 1e-6));
    EXPECT_TRUE(close(got.dx, dx_ref, 1e-5, 1e-6));
  }
}

TEST_F(FERRY_PARITY_SUITE, GeluMatchesTheCpuBackend) {
  std::mt19937 rng(82);
  for (const size_t n : kGeluSizes) {
    SCOPED_TRACE(n);
    const std::vector<float> x = random_floats(n, rng, -6.0f, 6.0f);
    const std::vector<float> dy = random_floats(n, rng);
    std::vector<float> y_cpu = poisoned(n), dx_cpu = poisoned(n);
    const auto count = static_cast<int64_t>(n);
    FERRY_CPU_OR_SKIP((GeluForward{count, x.data(), y_cpu.data()}));
    FERRY_CPU_OR_SKIP((GeluBackward{count, x.data(), dy.data(), dx_cpu.data()}));
    const GeluResult got = gelu_on_target(*this, mem_, x, dy);
    EXPECT_TRUE(close(got.y, y_cpu, 1e-5, 1e-6));
    EXPECT_TRUE(close(got.dx, dx_cpu, 1e-5, 1e-6));
  }
}

// ---- gradient clipping
// ---------------------------------------------------------------------------

TEST_F(FERRY_PARITY_SUITE, SumOfSquaresIsExactlyRoundedAndGridIndependent) {
  std::mt19937 rng(91);
  for (const size_t n : {size_t{0}, size_t{1}, size_t{4095}, size_t{100003}, size_t{3} << 20}) {
    SCOPED_TRACE(n);
    const std::vector<float> x = random_floats(n, rng, -3.0f, 3.0f);
    double want = 0.0;
    for (const float v : x) want += static_cast<double>(v) * v;
    const float* gx = mem_.upload(x);
    std::vector<float> runs;
    for (const int sm : {132, 1, 7}) {
      target_->set_sm_count(sm);
      float* out = mem_.alloc<float>(1);
      gpu(SumOfSquares{static_cast<int64_t>(n), gx, out});
      runs.push_back(mem_.download(out, 1)[0]);
    }
    target_->set_sm_count(132);
    // A float64 sum rounded once: the float of any summation order (to 1e-9 here).
    EXPECT_TRUE(close({runs[0]}, {static_cast<float>(want)}, 1e-6, 0.0));
    EXPECT_TRUE(
        bitwise(std::vector<float>{runs[1], runs[2]}, std::vector<float>{runs[0], runs[0]}));
  }
}

TEST_F(FERRY_PARITY_SUITE, ClipByNormScalesOnlyAboveTheMaximum) {
  std::mt19937 rng(92);
  const size_t n = 5003;
  const std::vector<float> g = random_floats(n, rng);
  double sum = 0.0;
  for (const float v : g) sum += static_cast<double>(v) * v;
  for (const float max_norm : {1.0f, 1e4f}) {
    SCOPED_TRACE(max_norm);
    float* sum_sq = mem_.alloc<float>(1);
    float* y = mem_.upload(g);
    gpu(SumOfSquares{static_cast<int64_t>(n), mem_.upload(g), sum_sq});
    gpu(ClipByNorm{static_cast<int64_t>(n), max_norm, sum_sq, y});
    const float norm = std::sqrt(mem_.download(sum_sq, 1)[0]);
    const float coef = max_norm / (norm + 1e-6f);
    std::vector<float> want = g;
    if (coef < 1.0f) {
      for (float& v : want) v *= coef;
    }
    EXPECT_TRUE(bitwise(mem_.download(y, n), want));
    EXPECT_NEAR(norm, std::sqrt(sum), 1e-3);
  }
  // A NaN norm poisons the gradients, as clip_grad_norm_'s clamp keeps NaN.
  float* y = mem_.upload(g);
  gpu(ClipByNorm{static_cast<int64_t>(n), 1.0f, mem_.upload(std::vector<float>{NAN}), y});
  EXPECT_TRUE(std::isnan(mem_.download(y, n)[0]));
}

TEST_F(FERRY_PARITY_SUITE, GradientClippingMatchesTheCpuBackend) {
  std::mt19937 rng(93);
  const size_t n = 77777;
  const std::vector<float> g = random_floats(n, rng, -0.1f, 0.1f);
  std::vector<float> sum_cpu = poisoned(1), y_cpu = g;
  FERRY_CPU_OR_SKIP((SumOfSquares{static_cast<int64_t>(n), g.data(), sum_cpu.data()}));
  FERRY_CPU_OR_SKIP((ClipByNorm{static_cast<int64_t>(n), 0.5f, sum_cpu.data(), y_cpu.data()}));
  float* sum_sq = mem_.alloc<float>(1);
  float* y = mem_.upload(g);
  gpu(SumOfSquares{static_cast<int64_t>(n), mem_.upload(g), sum_sq});
  gpu(ClipByNorm{static_cast<int64_t>(n), 0.5f, sum_sq, y});
  EXPECT_TRUE(close(mem_.download(sum_sq, 1), sum_cpu, 1e-6, 0.0));
  EXPECT_TRUE(close(mem_.download(y, n), y_cpu, 1e-5, 0.0));
}

// ---- attention ----------------------------------------------------------------------------------

// Whether element `at` of the (N, heads, T, T) probabilities is kept, as DropoutForward draws.
bool kept(uint64_t seed, int64_t at, float p) {
  return counter_uniform(seed, static_cast<uint64_t>(at)) >= p;
}

struct AttentionResult {
  std::vector<float> y, probs, dqkv;
  std::vector<uint8_t> mask;
};

// The core in float64: causal softmax of q k^T / sqrt(D) (keys from the query's segment start
// with `segments`), the dropout of DropoutForward at offset 0 when `drop`, and the gradients.
AttentionResult attention_reference(const AttentionGeom& g, bool drop, uint64_t seed,
                                    const std::vector<float>& qkv, const std::vector<float>& dy,
                                    const std::vector<int32_t>& segments = {}) {
  const int64_t t = g.t, c = g.c, d = g.head_dim(), w = 3 * c;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const double keep = 1.0 - static_cast<double>(g.dropout);
  AttentionResult r;
  r.y.assign(g.n * t * c, 0.0f);
  r.probs.assign(g.n * g.heads * t * t, 0.0f);
  r.dqkv.assign(g.n * t * w, 0.0f);
  r.mask.assign(drop ? g.n * g.heads * t * t : 0, 0);
  std::vector<double> p(t * t), pd(t * t), dp(t * t);
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t h = 0; h < g.heads; ++h) {
      auto at = [&](int64_t row, int64_t block, int64_t k) {
        return (n * t + row) * w + block * c + h * d + k;
      };
      const int64_t base = (n * g.heads + h) * t * t;
      const auto first = [&](int64_t i) {
        return segments.empty() ? int64_t{0} : int64_t{segments[n * t + i]};
      };
      const auto seen = [&](int64_t i, int64_t j) { return first(i) <= j && j <= i; };
      for (int64_t i = 0; i < t; ++i) {
        double top = -INFINITY;
        std::vector<double> s(i + 1);
        for (int64_t j = first(i); j <= i; ++j) {
          double dot = 0.0;
          for (int64_t k = 0; k < d; ++k)
            dot += static_cast<double>(qkv[at(i, 0, k)]) * qkv[at(j, 1, k)];
          s[j] = dot * scale;
          top = std::max(top, s[j]);
        }
        double sum = 0.0;
        for (int64_t j = first(i); j <= i; ++j) sum += std::exp(s[j] - top);
        for (int64_t j = 0; j < t; ++j) {
          p[i * t + j] = seen(i, j) ? std::exp(s[j] - top) / sum : 0.0;
          r.probs[base + i * t + j] = static_cast<float>(p[i * t + j]);
          pd[i * t + j] = p[i * t + j];
          if (drop) {
            const bool k = kept(seed, base + i * t + j, g.dropout);
            r.mask[base + i * t + j] = k ? 1 : 0;
            pd[i * t + j] = k ? p[i * t + j] / keep : 0.0;
          }
        }
      }
      for (int64_t i = 0; i < t; ++i) {
        for (int64_t k = 0; k < d; ++k) {
          double acc = 0.0;
          for (int64_t j = 0; j < t; ++j) acc += pd[i * t + j] * qkv[at(j, 2, k)];
          r.y[(n * t + i) * c + h * d + k] = static_cast<float>(acc);
        }
      }
      // Backward.
      auto dy_at = [&](int64_t row, int64_t k) { return dy[(n * t + row) * c + h * d + k]; };
      for (int64_t i = 0; i < t; ++i) {
        for (int64_t j = 0; j < t; ++j) {
          double acc = 0.0;
          for (int64_t k = 0; k < d; ++k)
            acc += static_cast<double>(dy_at(i, k)) * qkv[at(j, 2, k)];
          if (drop) acc = r.mask[base + i * t + j] ? acc / keep : 0.0;
          dp[i * t + j] = acc;
        }
      }
      for (int64_t j = 0; j < t; ++j) {
        for (int64_t k = 0; k < d; ++k) {
          double acc = 0.0;
          for (int64_t i = 0; i < t; ++i) acc += pd[i * t + j] * dy_at(i, k);
          r.dqkv[at(j, 2, k)] = static_cast<float>(acc);
        }
      }
      for (int64_t i = 0; i < t; ++i) {
        double dot = 0.0;
        for (int64_t j = first(i); j <= i; ++j) dot += dp[i * t + j] * p[i * t + j];
        for (int64_t j = 0; j < t; ++j) {
          dp[i * t + j] = seen(i, j) ? p[i * t + j] * (dp[i * t + j] - dot) : 0.0;  // dS
        }
      }
      for (int64_t i = 0; i < t; ++i) {
        for (int64_t k = 0; k < d; ++k) {
          double dq = 0.0, dk = 0.0;
          for (int64_t j = 0; j < t; ++j) {
            dq += dp[i * t + j] * qkv[at(j, 1, k)];
            dk += dp[j * t + i] * qkv[at(j, 0, k)];
          }
          r.dqkv[at(i, 0, k)] = static_cast<float>(dq * scale);
          r.dqkv[at(i, 1, k)] = static_cast<float>(dk * scale);
        }
      }
    }
  }
  return r;
}

// The softmax, mask and dropout kernels between the cuBLAS products, on their own (the host
// emulation has no cuBLAS): scores in, probabilities, mask and P' out, then dS from dP'.
TEST_F(FERRY_PARITY_SUITE, AttentionSoftmaxKernelsMatchFloat64) {
  if (!kEmulated) GTEST_SKIP() << "the GPU checks these inside AttentionMatchesFloat64";
  std::mt19937 rng(101);
  for (const float p : {0.0f, 0.25f}) {
    for (const int64_t t : {int64_t{1}, int64_t{5}, int64_t{70}, int64_t{150}}) {
      for (const bool segmented : {false, true}) {
        SCOPED_TRACE(fmt::format("T{} p{}{}", t, p, segmented ? " segments" : ""));
        const int64_t heads = 3, rows = heads * t, count = rows * t;  // (1, heads, T, T)
        const uint64_t seed = 77;
        const std::vector<float> scores = random_floats(count, rng, -4.0f, 4.0f);
        const std::vector<float> dprobs = random_floats(count, rng);
        // Packed documents of 1 to 80 positions (Note [Segments of a packed row]).
        std::vector<int32_t> segments(t, 0);
        for (int64_t i = 0, start = 0, left = 0; segmented && i < t; ++i, --left) {
          if (left == 0) start = i, left = pick(rng, 1, 80);
          segments[i] = static_cast<int32_t>(start);
        }
        const int32_t* gsegments = segmented ? mem_.upload(segments) : nullptr;
        float* probs = mem_.upload(scores);
        float* dropped = mem_.alloc<float>(count);
        uint8_t* mask = mem_.alloc<uint8_t>(count);
        cuda::launch_attention_softmax(rows, t, heads, gsegments, p, seed, probs, dropped, mask,
                                       nullptr);
        float* rebuilt = mem_.alloc<float>(count);
        if (p > 0.0f) cuda::launch_attention_dropout_apply(count, p, probs, mask, rebuilt, nullptr);
        float* ds = mem_.upload(dprobs);
        cuda::launch_attention_softmax_backward(rows, t, heads, gsegments, p, probs,
                                                p > 0.0f ? mask : nullptr, ds, nullptr);
        std::vector<float> want_p(count), want_ds(count);
        std::vector<uint8_t> want_mask(count);
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t i = r % t, b = segments[i];
          double top = -INFINITY, sum = 0.0, dot = 0.0;
          for (int64_t j = b; j <= i; ++j) top = std::max(top, double{scores[r * t + j]});
          for (int64_t j = b; j <= i; ++j) sum += std::exp(scores[r * t + j] - top);
          std::vector<double> dp(t);
          for (int64_t j = 0; j < t; ++j) {
            const int64_t q = r * t + j;
            const double pj = b <= j && j <= i ? std::exp(scores[q] - top) / sum : 0.0;
            want_p[q] = static_cast<float>(pj);
            want_mask[q] = kept(seed, q, p) ? 1 : 0;
            dp[j] = p == 0.0f ? dprobs[q] : want_mask[q] ? dprobs[q] / (1.0f - p) : 0.0f;
            if (b <= j && j <= i) dot += dp[j] * pj;
          }
          for (int64_t j = 0; j < t; ++j) {
            want_ds[r * t + j] =
                b <= j && j <= i ? static_cast<float>(want_p[r * t + j] * (dp[j] - dot)) : 0.0f;
          }
        }
        const std::vector<float> got_p = mem_.download(probs, count);
        EXPECT_TRUE(close(got_p, want_p, 1e-5, 1e-7));
        for (int64_t r = 0; r < rows; ++r) {  // the causal and segment mask: exactly 0
          for (int64_t j = 0; j < t; ++j) {
            if (j < segments[r % t] || j > r % t)
              ASSERT_EQ(got_p[r * t + j], 0.0f) << r << " " << j;
          }
        }
        EXPECT_TRUE(close(mem_.download(ds, count), want_ds, 1e-5, 1e-6));
        if (p > 0.0f) {
          EXPECT_TRUE(bitwise(mem_.download(mask, count), want_mask));
          // P' is DropoutForward of the probabilities, and the backward rebuilds the same bits.
          std::vector<float> from_probs(count);
          for (int64_t q = 0; q < count; ++q) {
            from_probs[q] = want_mask[q] ? got_p[q] / (1.0f - p) : 0.0f;
          }
          EXPECT_TRUE(bitwise(mem_.download(dropped, count), from_probs));
          EXPECT_TRUE(bitwise(mem_.download(rebuilt, count), from_probs));
        }
      }
    }
  }
}

struct AttentionCase {
  AttentionGeom g;
  bool training;
};

const AttentionCase kAttentionCases[] = {{{1, 1, 1, 1, 0.0f}, true},   {{2, 7, 3, 12, 0.0f}, true},
                                         {{2, 7, 3, 12, 0.2f}, true},  {{1, 33, 2, 16, 0.1f}, true},
                                         {{3, 64, 4, 64, 0.0f}, true}, {{3, 64, 4, 64, 0.1f}, true},
                                         {{2, 20, 2, 8, 0.5f}, false}};

AttentionResult attention_on_target(FERRY_PARITY_SUITE& t, GpuArena& mem, const AttentionCase& a,
                                    uint64_t seed, const std::vector<float>& qkv,
                                    const std::vector<float>& dy,
                                    const std::vector<int32_t>& segments = {}) {
  const AttentionGeom& g = a.g;
  const bool drop = a.training && g.dropout > 0.0f;
  const size_t scores = g.n * g.heads * g.t * g.t;
  const float* gqkv = mem.upload(qkv);
  float* y = mem.alloc<float>(g.n * g.t * g.c);
  float* probs = mem.alloc<float>(scores);
  uint8_t* mask = drop ? mem.alloc<uint8_t>(scores) : nullptr;
  float* dqkv = mem.alloc<float>(qkv.size());
  const int32_t* gsegments = segments.empty() ? nullptr : mem.upload(segments);
  t.gpu(AttentionForward{g, a.training, seed, gqkv, y, probs, mask, {}, gsegments});
  AttentionResult r{mem.download(y, g.n * g.t * g.c), mem.download(probs, scores), {}, {}};
  if (drop) r.mask = mem.download(mask, scores);
  if (a.training) {
    t.gpu(AttentionBackward{g, gqkv, probs, mask, mem.upload(dy), dqkv, {}, gsegments});
    r.dqkv = mem.download(dqkv, qkv.size());
  }
  return r;
}

TEST_F(FERRY_PARITY_SUITE, AttentionMatchesFloat64) {
  if (kEmulated) GTEST_SKIP() << "the attention core's products run on cuBLAS: GPU only";
  std::mt19937 rng(111);
  for (const AttentionCase& a : kAttentionCases) {
    const AttentionGeom& g = a.g;
    SCOPED_TRACE(fmt::format("N{} T{} heads{} C{} p{}{}", g.n, g.t, g.heads, g.c, g.dropout,
                             a.training ? "" : " inference"));
    const uint64_t seed = 0xa77e;
    const std::vector<float> qkv = random_floats(g.n * g.t * 3 * g.c, rng);
    const std::vector<float> dy = random_floats(g.n * g.t * g.c, rng);
    const bool drop = a.training && g.dropout > 0.0f;
    const AttentionResult want = attention_reference(g, drop, seed, qkv, dy);
    const AttentionResult got = attention_on_target(*this, mem_, a, seed, qkv, dy);
    EXPECT_TRUE(close(got.probs, want.probs, 1e-5, 1e-6));
    EXPECT_TRUE(close(got.y, want.y, kRel, 1e-5));
    if (drop) {
      EXPECT_TRUE(bitwise(got.mask, want.mask));
    }
    if (a.training) {
      EXPECT_TRUE(close(got.dqkv, want.dqkv, kRel, 1e-5));
    }
    const AttentionResult again = attention_on_target(*this, mem_, a, seed, qkv, dy);
    EXPECT_TRUE(bitwise(again.y, got.y));
    EXPECT_TRUE(bitwise(again.dqkv, got.dqkv));
  }
}

TEST_F(FERRY_PARITY_SUITE, AttentionMatchesTheCpuBackend) {
  if (kEmulated) GTEST_SKIP() << "the attention core's products run on cuBLAS: GPU only";
  std::mt19937 rng(112);
  for (const AttentionCase& a : kAttentionCases) {
    const AttentionGeom& g = a.g;
    SCOPED_TRACE(fmt::format("N{} T{} heads{} C{} p{}", g.n, g.t, g.heads, g.c, g.dropout));
    const uint64_t seed = 0xbeef;
    const std::vector<float> qkv = random_floats(g.n * g.t * 3 * g.c, rng);
    const std::vector<float> dy = random_floats(g.n * g.t * g.c, rng);
    const size_t scores = g.n * g.heads * g.t * g.t;
    const bool drop = a.training && g.dropout > 0.0f;
    AttentionResult cpu_r{poisoned(g.n * g.t * g.c), poisoned(scores), poisoned(qkv.size()),
                          std::vector<uint8_t>(drop ? scores : 0, 7)};
    FERRY_CPU_OR_SKIP((AttentionForward{g, a.training, seed, qkv.data(), cpu_r.y.data(),
                                        cpu_r.probs.data(), drop ? cpu_r.mask.data() : nullptr}));
    if (a.training) {
      FERRY_CPU_OR_SKIP(
          (AttentionBackward{g, qkv.data(), cpu_r.probs.data(), drop ? cpu_r.mask.data() : nullptr,
                             dy.data(), cpu_r.dqkv.data()}));
    }
    const AttentionResult got = attention_on_target(*this, mem_, a, seed, qkv, dy);
    EXPECT_TRUE(close(got.probs, cpu_r.probs, 1e-5, 1e-6));
    EXPECT_TRUE(close(got.y, cpu_r.y, kRel, 1e-5));
    if (drop) {
      EXPECT_TRUE(bitwise(got.mask, cpu_r.mask));
    }
    if (a.training) {
      EXPECT_TRUE(close(got.dqkv, cpu_r.dqkv, kRel, 1e-5));
    }
  }
}

// Packed documents (Note [Segments of a packed row]): the block-diagonal causal mask against
// float64 and the CPU backend.
TEST_F(FERRY_PARITY_SUITE, AttentionWithSegmentsMatchesFloat64AndTheCpuBackend) {
  if (kEmulated) GTEST_SKIP() << "the attention core's products run on cuBLAS: GPU only";
  std::mt19937 rng(113);
  for (const AttentionCase& a : kAttentionCases) {
    const AttentionGeom& g = a.g;
    SCOPED_TRACE(fmt::format("N{} T{} heads{} C{} p{}", g.n, g.t, g.heads, g.c, g.dropout));
    const uint64_t seed = 0x5e9;
    const std::vector<float> qkv = random_floats(g.n * g.t * 3 * g.c, rng);
    const std::vector<float> dy = random_floats(g.n * g.t * g.c, rng);
    std::vector<int32_t> segments;
    for (int64_t b = 0; b < g.n; ++b) {
      for (int64_t i = 0, start = 0, left = 0; i < g.t; ++i, --left) {
        if (left == 0) start = i, left = pick(rng, 1, 20);
        segments.push_back(static_cast<int32_t>(start));
      }
    }
    const bool drop = a.training && g.dropout > 0.0f;
    const AttentionResult want = attention_reference(g, drop, seed, qkv, dy, segments);
    const AttentionResult got = attention_on_target(*this, mem_, a, seed, qkv, dy, segments);
    EXPECT_TRUE(close(got.probs, want.probs, 1e-5, 1e-6));
    EXPECT_TRUE(close(got.y, want.y, kRel, 1e-5));
    if (a.training) EXPECT_TRUE(close(got.dqkv, want.dqkv, kRel, 1e-5));
    const size_t scores = g.n * g.heads * g.t * g.t;
    AttentionResult cpu_r{poisoned(g.n * g.t * g.c), poisoned(scores), poisoned(qkv.size()),
                          std::vector<uint8_t>(drop ? scores : 0, 7)};
    FERRY_CPU_OR_SKIP((AttentionForward{g,
                                        a.training,
                                        seed,
                                        qkv.data(),
                                        cpu_r.y.data(),
                                        cpu_r.probs.data(),
                                        drop ? cpu_r.mask.data() : nullptr,
                                        {},
                                        segments.data()}));
    EXPECT_TRUE(close(got.y, cpu_r.y, kRel, 1e-5));
  }
}

// The forward needs P' beside probs only when it drops; the backward always holds dS.
TEST_F(FERRY_PARITY_SUITE, AttentionWorkspaceGrowsWithTheScores) {
  if (kEmulated) GTEST_SKIP() << "the attention core's workspace is cuBLAS's: GPU only";
  const AttentionGeom g{2, 16, 2, 8, 0.1f};
  const uint64_t scores = 2 * 2 * 16 * 16 * sizeof(float);
  const uint64_t infer = target_->workspace_bytes(AttentionForward{.g = g, .training = false});
  const uint64_t train = target_->workspace_bytes(AttentionForward{.g = g, .training = true});
  EXPECT_GE(train, infer + scores);
  EXPECT_GE(target_->workspace_bytes(AttentionBackward{.g = g}), infer + 2 * scores);
  // No workspace (inference: no mask needed).
  EXPECT_THROW(target_->launch(AttentionForward{.g = g, .training = false}), UnsupportedError);
  // Training with dropout and no mask to record it in.
  EXPECT_THROW(gpu(AttentionForward{.g = g}), ConfigError);
  EXPECT_THROW(target_->workspace_bytes(AttentionForward{.g = {2, 16, 3, 8, 0.0f}}), ConfigError);
}

}  // namespace
}  // namespace ferry
