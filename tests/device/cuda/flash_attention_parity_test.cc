// The CUDA fused attention core (flash_attention.cu) against the CPU fused core and the CPU naive
// core: outputs, log-sum-exp and gradients for causal, padded and packed rows, with dropout, both
// tile shapes (head width up to 64, and up to 128), in fp32 and in bf16 storage. Runs on the GPU
// (skips without one) and in the host emulation (emulated_target.cc), which CI runs.
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
#include "tests/device/cuda/bf16_helpers.h"
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

// ---- bf16 storage (Note [Fused attention in bf16 on CUDA]) -------------------------------------

Bits rounded(const std::vector<float>& v) {
  Bits b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = float_to_bf16(v[i]).bits;
  return b;
}

// Head widths and lengths that are not multiples of the tiles (D 40 and 24 in tiles of 32 x 64,
// D 96 in tiles of 16 x 128, T 45, 70, 150), D = 128 exactly, dropout and packed documents.
const FlashCase kBf16Cases[] = {{{2, 7, 2, 8, 0.0f}, 0},    {{2, 45, 2, 80, 0.1f}, 0},
                                {{1, 70, 2, 192, 0.0f}, 0}, {{1, 33, 1, 128, 0.2f}, 0},
                                {{2, 80, 2, 16, 0.0f}, 9},  {{1, 150, 2, 48, 0.1f}, 60}};

// In bf16 storage the target's outputs are its fp32 kernel's on the widened operands, rounded
// once: y and dqkv bitwise, lse (fp32) bitwise. Against the CPU backend's bf16 fused core (the
// fp32 CPU core on widened operands, rounded once; its fp32 math differs from the target's in
// the last places, Note [One bf16 rounding apart]) the backward is given the same bf16 y and
// lse: y and dqkv within one bf16 step or 1e-4, lse within the fp32 suite's 1e-5.
TEST_F(FERRY_FLASH_SUITE, Bf16IsTheFp32KernelRoundedOnceAndMatchesTheCpuBf16Core) {
  std::mt19937 rng(2902);
  constexpr DType kBf = DType::kBF16;
  for (const FlashCase& c : kBf16Cases) {
    const AttentionGeom& g = c.g;
    SCOPED_TRACE(fmt::format("N{} T{} heads{} D{} p{} documents<={}", g.n, g.t, g.heads,
                             g.head_dim(), g.dropout, c.longest));
    const uint64_t seed = 0xbf16;
    const size_t nqkv = g.n * g.t * 3 * g.c, ny = g.n * g.t * g.c, nl = g.n * g.heads * g.t;
    const Bits qkv = random_bf16(nqkv, rng, -2.0f, 2.0f), dy = random_bf16(ny, rng);
    const std::vector<int32_t> segments = segments_for(c, rng);
    const int32_t* seg = segments.empty() ? nullptr : segments.data();
    const int32_t* d_seg = segments.empty() ? nullptr : mem_.upload(segments);
    // bf16 on the target.
    const uint16_t* qkv16 = mem_.upload(qkv);
    const uint16_t* dy16 = mem_.upload(dy);
    uint16_t* y16 = mem_.alloc<uint16_t>(ny);
    float* lse16 = mem_.alloc<float>(nl);
    uint16_t* dqkv16 = mem_.alloc<uint16_t>(nqkv);
    gpu(FlashAttentionForward{g, true, seed, fp(qkv16), fp(y16), lse16, d_seg, kBf});
    gpu(FlashAttentionBackward{g, seed, fp(qkv16), fp(y16), lse16, fp(dy16), fp(dqkv16), d_seg,
                               kBf});
    const Bits y = mem_.download(y16, ny), dqkv = mem_.download(dqkv16, nqkv);
    const std::vector<float> lse = mem_.download(lse16, nl);
    // fp32 on the target from the widened operands (the backward from the bf16 y).
    const float* qkv32 = mem_.upload(widened(qkv));
    float* y32 = mem_.alloc<float>(ny);
    float* lse32 = mem_.alloc<float>(nl);
    float* dqkv32 = mem_.alloc<float>(nqkv);
    gpu(FlashAttentionForward{g, true, seed, qkv32, y32, lse32, d_seg});
    gpu(FlashAttentionBackward{g, seed, qkv32, mem_.upload(widened(y)), lse32,
                               mem_.upload(widened(dy)), dqkv32, d_seg});
    EXPECT_TRUE(bitwise(y, rounded(mem_.download(y32, ny))));
    EXPECT_TRUE(bitwise(lse, mem_.download(lse32, nl)));
    EXPECT_TRUE(bitwise(dqkv, rounded(mem_.download(dqkv32, nqkv))));
    // The CPU backend's bf16 fused core; its backward reads the target's y and lse.
    Bits cpu_y = poisoned_bf16(ny), cpu_dqkv = poisoned_bf16(nqkv);
    std::vector<float> cpu_lse = poisoned(nl);
    cpu(FlashAttentionForward{g, true, seed, fp(qkv.data()), fp(cpu_y.data()), cpu_lse.data(), seg,
                              kBf});
    cpu(FlashAttentionBackward{g, seed, fp(qkv.data()), fp(y.data()), lse.data(), fp(dy.data()),
                               fp(cpu_dqkv.data()), seg, kBf});
    EXPECT_TRUE(bf16_within(y, cpu_y, 1, 1e-4));
    EXPECT_TRUE(close(lse, cpu_lse, 1e-5, 1e-6));
    EXPECT_TRUE(bf16_within(dqkv, cpu_dqkv, 1, 1e-4));
    // Not the fp32 results by accident: some outputs were rounded.
    EXPECT_FALSE(bitwise(widened(dqkv), mem_.download(dqkv32, nqkv)));
    // Bitwise again (no atomics).
    uint16_t* again = mem_.alloc<uint16_t>(nqkv);
    gpu(FlashAttentionBackward{g, seed, fp(qkv16), fp(y16), lse16, fp(dy16), fp(again), d_seg,
                               kBf});
    EXPECT_TRUE(bitwise(mem_.download(again, nqkv), dqkv));
  }
}

// Head widths past the tiles are refused in bf16 as in fp32, before anything runs.
TEST_F(FERRY_FLASH_SUITE, Bf16RefusesHeadsWiderThanTheTiles) {
  const AttentionGeom g{1, 8, 1, 2 * cuda::kFlashMaxHead, 0.0f};
  uint16_t* qkv = mem_.alloc<uint16_t>(g.n * g.t * 3 * g.c);
  uint16_t* y = mem_.alloc<uint16_t>(g.n * g.t * g.c);
  EXPECT_THROW(
      gpu(FlashAttentionForward{g, true, 1, fp(qkv), fp(y), mem_.alloc<float>(g.n * g.heads * g.t),
                                nullptr, DType::kBF16}),
      UnsupportedError);
}

}  // namespace
}  // namespace ferry
