// The Llama kernels (RMSNorm, rotary embeddings into qkv with grouped-query heads, SwiGLU, the
// embedding without positions) against float64 references written from Hugging Face's formulas
// and finite differences, plus aliasing, refusals and bitwise determinism across threads.
#include <gtest/gtest.h>

#include "common/error.h"
#include "tests/device/cpu/kernel_test_util.h"
#include "tests/device/cpu/llama_reference.h"

namespace ferry {
namespace {

using namespace test;

// ---- RMSNorm ----

struct RmsRun {
  std::vector<float> y, rstd, dx, dw;
};

RmsRun run_rms(int64_t rows, int64_t c, const std::vector<float>& x, const std::vector<float>& w,
               const std::vector<float>& dy, int threads = kThreads) {
  KernelRunner k(threads);
  RmsRun r{std::vector<float>(x.size(), NAN), std::vector<float>(rows, NAN),
           std::vector<float>(x.size(), NAN), std::vector<float>(c, NAN)};
  const RmsNormGeom g{rows, c, 1e-5f};
  k.run(RmsNormForward{g, x.data(), w.data(), r.y.data(), r.rstd.data()});
  k.run(RmsNormBackward{g, x.data(), dy.data(), w.data(), r.rstd.data(), r.dx.data(), r.dw.data()});
  return r;
}

TEST(RmsNormKernel, MatchesReferenceAndFiniteDifferences) {
  const int64_t rows = 7, c = 37;  // a width past one lane block, with a tail
  const auto x = random_floats(rows * c, 1), w = random_floats(c, 2, 0.5f, 1.5f),
             dy = random_floats(rows * c, 3);
  const RmsRun r = run_rms(rows, c, x, w, dy);
  EXPECT_TRUE(
      all_close(r.y, ref::rms_norm_forward(to_f64(x), to_f64(w), rows, c, 1e-5), 1e-5, 1e-6));
  ref::Vec x64 = to_f64(x), w64 = to_f64(w);
  const ref::Vec dy64 = to_f64(dy);
  auto loss = [&](const ref::Vec& xv, const ref::Vec& wv) {
    return dot(ref::rms_norm_forward(xv, wv, rows, c, 1e-5), dy64);
  };
  for (size_t i : sample_indices(x.size(), 60, 4)) {
    EXPECT_NEAR(r.dx[i], numeric_partial([&](const ref::Vec& v) { return loss(v, w64); }, x64, i),
                1e-4)
        << i;
  }
  for (int64_t i = 0; i < c; ++i) {
    EXPECT_NEAR(r.dw[i], numeric_partial([&](const ref::Vec& v) { return loss(x64, v); }, w64, i),
                1e-4)
        << i;
  }
}

TEST(RmsNormKernel, InPlaceBackwardAndThreadsGiveTheSameBits) {
  const int64_t rows = 300, c = 64;  // more rows than one gradient block
  const auto x = random_floats(rows * c, 5), w = random_floats(c, 6),
             dy = random_floats(rows * c, 7);
  const RmsRun two = run_rms(rows, c, x, w, dy, 2), one = run_rms(rows, c, x, w, dy, 1);
  EXPECT_TRUE(bitwise_equal(two.y, one.y));
  EXPECT_TRUE(bitwise_equal(two.dx, one.dx));
  EXPECT_TRUE(bitwise_equal(two.dw, one.dw));
  KernelRunner k;
  std::vector<float> inplace = dy, dw(c);
  k.run(RmsNormBackward{{rows, c, 1e-5f},
                        x.data(),
                        inplace.data(),
                        w.data(),
                        two.rstd.data(),
                        inplace.data(),
                        dw.data()});
  EXPECT_TRUE(bitwise_equal(inplace, two.dx));
  EXPECT_TRUE(bitwise_equal(dw, two.dw));
}

// ---- rotary embeddings into qkv ----

struct RopeCase {
  int64_t n, t, heads, kv, d;
  bool packed;
};

class RopeQkvKernel : public ::testing::TestWithParam<RopeCase> {};

TEST_P(RopeQkvKernel, ForwardMatchesHfAndBackwardIsItsTranspose) {
  const RopeCase p = GetParam();
  const int64_t rows = p.n * p.t, qw = p.heads * p.d, kvw = p.kv * p.d;
  const auto q = random_floats(rows * qw, 11), k = random_floats(rows * kvw, 12),
             v = random_floats(rows * kvw, 13), dqkv = random_floats(rows * 3 * qw, 14);
  std::vector<int32_t> segments;
  std::vector<int64_t> positions(rows);
  for (int64_t r = 0; r < rows; ++r) {
    // Packed: documents of 3 positions (the third row's start shifts by one).
    const int32_t start = p.packed ? static_cast<int32_t>((r % p.t) / 3 * 3) : 0;
    if (p.packed) segments.push_back(start);
    positions[r] = r % p.t - start;
  }
  const int32_t* seg = p.packed ? segments.data() : nullptr;
  const RopeGeom g{p.n, p.t, p.heads, p.kv, p.d, 10000.0f};
  KernelRunner kr;
  std::vector<float> qkv(rows * 3 * qw, NAN);
  kr.run(RopeQkvForward{g, q.data(), k.data(), v.data(), qkv.data(), seg});
  EXPECT_TRUE(all_close(qkv,
                        ref::rope_qkv_forward(to_f64(q), to_f64(k), to_f64(v), positions, p.heads,
                                              p.kv, p.d, 10000.0),
                        1e-6, 1e-6));
  std::vector<float> dq(q.size(), NAN), dk(k.size(), NAN), dv(v.size(), NAN);
  kr.run(RopeQkvBackward{g, dqkv.data(), dq.data(), dk.data(), dv.data(), seg});
  // The op is linear: its gradient is exact, so d/dx <dqkv, F(q, k, v)> is checked by central
  // differences of the float64 reference (exact for a linear map up to rounding).
  ref::Vec q64 = to_f64(q), k64 = to_f64(k), v64 = to_f64(v);
  const ref::Vec d64 = to_f64(dqkv);
  auto loss = [&]() {
    return dot(ref::rope_qkv_forward(q64, k64, v64, positions, p.heads, p.kv, p.d, 10000.0), d64);
  };
  for (size_t i : sample_indices(q.size(), 20, 15)) {
    EXPECT_NEAR(dq[i], numeric_partial([&](const ref::Vec&) { return loss(); }, q64, i), 1e-5);
  }
  for (size_t i : sample_indices(k.size(), 20, 16)) {
    EXPECT_NEAR(dk[i], numeric_partial([&](const ref::Vec&) { return loss(); }, k64, i), 1e-5);
    EXPECT_NEAR(dv[i], numeric_partial([&](const ref::Vec&) { return loss(); }, v64, i), 1e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, RopeQkvKernel,
                         ::testing::Values(RopeCase{2, 5, 4, 4, 8, false},   // no grouping
                                           RopeCase{2, 7, 6, 2, 6, false},   // 3 heads per KV
                                           RopeCase{1, 9, 4, 1, 16, true}),  // packed, one KV
                         [](const auto& info) {
                           const RopeCase& c = info.param;
                           return fmt::format("h{}kv{}d{}{}", c.heads, c.kv, c.d,
                                              c.packed ? "packed" : "");
                         });

TEST(RopeQkvKernelChecks, RefusesOddHeadWidthAndUngroupedKvHeads) {
  KernelRunner k;
  std::vector<float> buf(1024);
  const float* in = buf.data();
  float* out = buf.data();
  EXPECT_THROW(k.run(RopeQkvForward{{1, 2, 2, 2, 3, 1e4f}, in, in, in, out, nullptr}), ConfigError);
  EXPECT_THROW(k.run(RopeQkvForward{{1, 2, 4, 3, 4, 1e4f}, in, in, in, out, nullptr}), ConfigError);
}

// ---- SwiGLU ----

TEST(SwigluKernel, MatchesReferenceFiniteDifferencesAndAliasing) {
  const int64_t n = 5000;
  const auto gate = random_floats(n, 21, -6.0f, 6.0f), up = random_floats(n, 22),
             dy = random_floats(n, 23);
  KernelRunner k;
  std::vector<float> y(n), dgate(n), dup(n);
  k.run(SwigluForward{n, gate.data(), up.data(), y.data()});
  EXPECT_TRUE(all_close(y, ref::swiglu_forward(to_f64(gate), to_f64(up)), 1e-5, 1e-6));
  k.run(SwigluBackward{n, gate.data(), up.data(), dy.data(), dgate.data(), dup.data()});
  ref::Vec g64 = to_f64(gate), u64 = to_f64(up);
  const ref::Vec d64 = to_f64(dy);
  auto loss = [&]() { return dot(ref::swiglu_forward(g64, u64), d64); };
  for (size_t i : sample_indices(n, 50, 24)) {
    EXPECT_NEAR(dgate[i], numeric_partial([&](const ref::Vec&) { return loss(); }, g64, i), 1e-5);
    EXPECT_NEAR(dup[i], numeric_partial([&](const ref::Vec&) { return loss(); }, u64, i), 1e-5);
  }
  std::vector<float> inplace = dy, dup2(n);
  k.run(SwigluBackward{n, gate.data(), up.data(), inplace.data(), inplace.data(), dup2.data()});
  EXPECT_TRUE(bitwise_equal(inplace, dgate));
  EXPECT_TRUE(bitwise_equal(dup2, dup));
}

// ---- the embedding without a position table ----

TEST(TokenEmbeddingKernel, NullPositionTableCopiesTokenRows) {
  const int64_t n = 2, t = 3, c = 5, vocab = 4;
  const std::vector<int32_t> tokens{3, 0, 3, 1, 1, 2};
  const auto wte = random_floats(vocab * c, 31), dy = random_floats(n * t * c, 32);
  KernelRunner k;
  std::vector<float> y(n * t * c), dwte(vocab * c, NAN);
  k.run(EmbeddingForward{n, t, c, vocab, tokens.data(), wte.data(), nullptr, y.data()});
  for (int64_t r = 0; r < n * t; ++r) {
    for (int64_t i = 0; i < c; ++i) EXPECT_EQ(y[r * c + i], wte[tokens[r] * c + i]);
  }
  k.run(EmbeddingBackward{n, t, c, vocab, t, tokens.data(), dy.data(), dwte.data(), nullptr});
  for (int64_t v = 0; v < vocab; ++v) {
    for (int64_t i = 0; i < c; ++i) {
      float expect = 0.0f;
      for (int64_t r = 0; r < n * t; ++r) {
        if (tokens[r] == v) expect += dy[r * c + i];
      }
      EXPECT_EQ(dwte[v * c + i], expect);
    }
  }
}

}  // namespace
}  // namespace ferry
