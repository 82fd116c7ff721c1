// The CUDA fused attention core (flash_attention.cu) against the CPU fused core and the CPU naive
// core: outputs, log-sum-exp and gradients for causal, padded and packed rows, with dropout, both
// tile shapes (head width up to 64, and up to 128). Runs on the GPU (skips without one) and in
// the host emulation (emulated_target.cc), which CI runs.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "common/error.h"
#include "device/cpu/cpu_kernels.h"
#include "device/cuda/cuda_ops.h"
#include "device/cuda/transformer_ops.h"
#include "tests/device/cuda/parity_helpers.h"
#include "tests/device/cuda/parity_target.h"

#ifndef FERRY_FLASH_SUITE
#define FERRY_FLASH_SUITE CudaFlashAttentionParityTest
#endif

namespace ferry {
namespace {

class FERRY_FLASH_SUITE : public ParityFixture {};

struct Result {
  std::vector<float> y, lse, dqkv;
};

struct FlashCase {
  AttentionGeom g;
  int64_t longest;  // packed documents of 1..longest positions; 0 = plain causal rows
};

// Tiles of 32 (D <= 64) with a partial last tile, several tiles, and tiles of 16 (D = 96, 128).
const FlashCase kCases[] = {{{1, 1, 1, 4, 0.0f}, 0},     {{2, 7, 2, 8, 0.0f}, 0},
                            {{2, 45, 2, 16, 0.1f}, 0},   {{1, 70, 2, 128, 0.0f}, 0},
                            {{2, 100, 3, 96, 0.2f}, 0},  {{2, 80, 2, 16, 0.0f}, 9},
                            {{1, 150, 2, 32, 0.1f}, 60}, {{2, 40, 1, 256, 0.0f}, 0}};

std::vector<int32_t> segments_for(const FlashCase& c, std::mt19937& rng) {
  if (c.longest == 0) return {};
  std::vector<int32_t> s;
  for (int64_t b = 0; b < c.g.n; ++b) {
    for (int64_t i = 0, start = 0, left = 0; i < c.g.t; ++i, --left) {
      if (left == 0) start = i, left = pick(rng, 1, c.longest);
      s.push_back(static_cast<int32_t>(start));
    }
  }
  return s;
}

Result on_target(ParityFixture& f, GpuArena& mem, const AttentionGeom& g, uint64_t seed,
                 const std::vector<float>& qkv, const std::vector<float>& dy,
                 const std::vector<int32_t>& segments) {
  const size_t ny = g.n * g.t * g.c, nl = g.n * g.heads * g.t;
  const float* d_qkv = mem.upload(qkv);
  const float* d_dy = mem.upload(dy);
  const int32_t* d_seg = segments.empty() ? nullptr : mem.upload(segments);
  float* y = mem.alloc<float>(ny);
  float* lse = mem.alloc<float>(nl);
  float* dqkv = mem.alloc<float>(qkv.size());
  f.gpu(FlashAttentionForward{g, true, seed, d_qkv, y, lse, d_seg});
  f.gpu(FlashAttentionBackward{g, seed, d_qkv, y, lse, d_dy, dqkv, d_seg});
  return {mem.download(y, ny), mem.download(lse, nl), mem.download(dqkv, qkv.size())};
}

TEST_F(FERRY_FLASH_SUITE, MatchesTheCpuFusedAndNaiveCores) {
  std::mt19937 rng(2900);
  for (const FlashCase& c : kCases) {
    const AttentionGeom& g = c.g;
    SCOPED_TRACE(fmt::format("N{} T{} heads{} C{} p{} documents<={}", g.n, g.t, g.heads, g.c,
                             g.dropout, c.longest));
    const uint64_t seed = 0xf1a5;
    const std::vector<float> qkv = random_floats(g.n * g.t * 3 * g.c, rng, -2.0f, 2.0f);
    const std::vector<float> dy = random_floats(g.n * g.t * g.c, rng);
    const std::vector<int32_t> segments = segments_for(c, rng);
    const int32_t* seg = segments.empty() ? nullptr : segments.data();
    if (g.head_dim() > cuda::kFlashMaxHead) {
      EXPECT_THROW(gpu(FlashAttentionForward{g, true, seed, mem_.upload(qkv),
                                             mem_.alloc<float>(g.n * g.t * g.c),
                                             mem_.alloc<float>(g.n * g.heads * g.t), nullptr}),
                   UnsupportedError);
      continue;
    }
    const Result got = on_target(*this, mem_, g, seed, qkv, dy, segments);
    Result fused{poisoned(g.n * g.t * g.c), poisoned(g.n * g.heads * g.t), poisoned(qkv.size())};
    cpu(FlashAttentionForward{g, true, seed, qkv.data(), fused.y.data(), fused.lse.data(), seg});
    cpu(FlashAttentionBackward{g, seed, qkv.data(), fused.y.data(), fused.lse.data(), dy.data(),
                               fused.dqkv.data(), seg});
    EXPECT_TRUE(close(got.y, fused.y, 1e-5, 1e-6));
    EXPECT_TRUE(close(got.lse, fused.lse, 1e-5, 1e-6));
    EXPECT_TRUE(close(got.dqkv, fused.dqkv, 1e-5, 1e-5));
    // The naive core (the mask is the same draw).
    const size_t scores = g.n * g.heads * g.t * g.t;
    std::vector<float> y(g.n * g.t * g.c), probs(scores), dqkv(qkv.size());
    std::vector<uint8_t> mask(scores);
    cpu(AttentionForward{g, true, seed, qkv.data(), y.data(), probs.data(), mask.data(), {}, seg});
    cpu(AttentionBackward{
        g, qkv.data(), probs.data(), mask.data(), dy.data(), dqkv.data(), {}, seg});
    EXPECT_TRUE(close(got.y, y, 1e-5, 1e-6));
    EXPECT_TRUE(close(got.dqkv, dqkv, 1e-5, 1e-5));
    // Bitwise again (no atomics).
    const Result again = on_target(*this, mem_, g, seed, qkv, dy, segments);
    EXPECT_TRUE(bitwise(again.y, got.y));
    EXPECT_TRUE(bitwise(again.dqkv, got.dqkv));
  }
}

// Recomputes: lse alone and y alone give the bits of the full forward.
TEST_F(FERRY_FLASH_SUITE, PartialOutputsKeepTheirBits) {
  std::mt19937 rng(2901);
  const AttentionGeom g{2, 50, 2, 32, 0.1f};
  const std::vector<float> qkv = random_floats(g.n * g.t * 3 * g.c, rng);
  const float* d_qkv = mem_.upload(qkv);
  const size_t ny = g.n * g.t * g.c, nl = g.n * g.heads * g.t;
  float* y = mem_.alloc<float>(ny);
  float* lse = mem_.alloc<float>(nl);
  float* y_alone = mem_.alloc<float>(ny);
  float* lse_alone = mem_.alloc<float>(nl);
  gpu(FlashAttentionForward{g, true, 3, d_qkv, y, lse});
  gpu(FlashAttentionForward{g, true, 3, d_qkv, y_alone, nullptr});
  gpu(FlashAttentionForward{g, true, 3, d_qkv, nullptr, lse_alone});
  EXPECT_TRUE(bitwise(mem_.download(y_alone, ny), mem_.download(y, ny)));
  EXPECT_TRUE(bitwise(mem_.download(lse_alone, nl), mem_.download(lse, nl)));
  EXPECT_THROW(gpu(FlashAttentionForward{g, true, 3, d_qkv, nullptr, nullptr}), ConfigError);
}

}  // namespace
}  // namespace ferry
