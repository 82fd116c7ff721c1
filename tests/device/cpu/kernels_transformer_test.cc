// Transformer kernels (embedding, layer norm, GELU, causal attention) and the Conv1D weight layout
// of the linear kernels against the float64 reference and finite differences, plus dropout-mask
// agreement with DropoutForward, aliasing, accumulation and bitwise determinism.
#include <gtest/gtest.h>

#include <cstring>

#include "common/error.h"
#include "device/counter_rng.h"
#include "tests/device/cpu/kernel_test_util.h"

namespace ferry {
namespace {

using namespace test;  // kernel_test_util.h: all_close, random_floats, to_f64, ...

constexpr double kRel = 1e-4;
constexpr double kAbs = 1e-4;

std::vector<int32_t> random_tokens(size_t n, int32_t vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> dist(0, vocab - 1);
  std::vector<int32_t> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

// Segment starts of rows cut into documents of random lengths (Note [Segments of a packed row] in
// device/kernels.h): each row's documents are 1 to `longest` positions long.
std::vector<int32_t> random_segments(int64_t n, int64_t t, int64_t longest, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int64_t> length(1, longest);
  std::vector<int32_t> s(static_cast<size_t>(n * t));
  for (int64_t b = 0; b < n; ++b) {
    int64_t start = 0, left = 0;
    for (int64_t i = 0; i < t; ++i) {
      if (left == 0) {
        start = i;
        left = length(rng);
      }
      s[static_cast<size_t>(b * t + i)] = static_cast<int32_t>(start);
      --left;
    }
  }
  return s;
}

// ---- embedding ----

TEST(EmbeddingKernel, ForwardMatchesReference) {
  test::KernelRunner k;
  const int64_t n = 3, t = 5, c = 37, vocab = 11, context = 8;
  const auto tokens = random_tokens(n * t, vocab, 1);
  const auto wte = random_floats(vocab * c, 2), wpe = random_floats(context * c, 3);
  std::vector<float> y(n * t * c, NAN);
  k.run(EmbeddingForward{n, t, c, vocab, tokens.data(), wte.data(), wpe.data(), y.data()});
  EXPECT_TRUE(
      all_close(y, ref::embedding_forward(n, t, c, tokens, to_f64(wte), to_f64(wpe)), 1e-6, 1e-6));
}

struct EmbeddingBackwardCase {
  int64_t n, t, c, vocab, context;
};

std::pair<std::vector<float>, std::vector<float>> embedding_backward(
    test::KernelRunner& k, const EmbeddingBackwardCase& s, const std::vector<int32_t>& tokens,
    const std::vector<float>& dy, std::vector<float> dwte, bool accumulate,
    const std::vector<int32_t>* segments = nullptr) {
  std::vector<float> dwpe(s.context * s.c, NAN);
  k.run(EmbeddingBackward{s.n, s.t, s.c, s.vocab, s.context, tokens.data(), dy.data(), dwte.data(),
                          dwpe.data(), accumulate, segments ? segments->data() : nullptr});
  return {dwte, dwpe};
}

// Packed documents: each position's table row is its place in its document.
TEST(EmbeddingKernel, SegmentsRestartThePositions) {
  test::KernelRunner k;
  const EmbeddingBackwardCase s{3, 40, 19, 23, 48};
  const auto tokens = random_tokens(s.n * s.t, static_cast<int32_t>(s.vocab), 100);
  const auto segments = random_segments(s.n, s.t, 9, 101);
  const auto wte = random_floats(s.vocab * s.c, 102), wpe = random_floats(s.context * s.c, 103);
  std::vector<float> y(s.n * s.t * s.c, NAN);
  k.run(EmbeddingForward{s.n, s.t, s.c, s.vocab, tokens.data(), wte.data(), wpe.data(), y.data(),
                         segments.data()});
  EXPECT_TRUE(all_close(
      y, ref::embedding_forward(s.n, s.t, s.c, tokens, to_f64(wte), to_f64(wpe), &segments), 1e-6,
      1e-6));
  const auto dy = random_floats(s.n * s.t * s.c, 104);
  const auto [dwte, dwpe] =
      embedding_backward(k, s, tokens, dy, std::vector<float>(s.vocab * s.c), false, &segments);
  const auto ref =
      ref::embedding_backward(s.n, s.t, s.c, s.vocab, s.context, tokens, to_f64(dy), &segments);
  EXPECT_TRUE(all_close(dwte, ref.dwte, 1e-5, 1e-5));
  EXPECT_TRUE(all_close(dwpe, ref.dwpe, 1e-5, 1e-5));
  // dwpe adds each position's rows onto 0 in (n, t) order, as dwte does (the CUDA kernel's too).
  std::vector<float> expected(s.context * s.c, 0.0f);
  for (int64_t r = 0; r < s.n * s.t; ++r) {
    const int64_t p = r % s.t - segments[static_cast<size_t>(r)];
    for (int64_t j = 0; j < s.c; ++j) expected[p * s.c + j] += dy[r * s.c + j];
  }
  EXPECT_TRUE(test::bitwise_equal(dwpe, expected));
  // Segment starts of 0 everywhere are the plain embedding, bit for bit.
  const std::vector<int32_t> zeros(s.n * s.t, 0);
  const auto plain = embedding_backward(k, s, tokens, dy, std::vector<float>(s.vocab * s.c), false);
  const auto zero =
      embedding_backward(k, s, tokens, dy, std::vector<float>(s.vocab * s.c), false, &zeros);
  EXPECT_TRUE(test::bitwise_equal(plain.second, zero.second));
  // A start after its position, or before the row, is refused before any row is indexed.
  std::vector<int32_t> bad = segments;
  bad[5] = 6;
  EXPECT_THROW(k.run(EmbeddingForward{s.n, s.t, s.c, s.vocab, tokens.data(), wte.data(), wpe.data(),
                                      y.data(), bad.data()}),
               DataError);
  bad[5] = -1;
  EXPECT_THROW(embedding_backward(k, s, tokens, dy, std::vector<float>(s.vocab * s.c), false, &bad),
               DataError);
}

TEST(EmbeddingKernel, BackwardMatchesReferenceAndIsRepeatable) {
  const EmbeddingBackwardCase cases[] = {{1, 1, 1, 1, 1}, {3, 7, 33, 5, 9}, {8, 64, 48, 50, 64}};
  uint32_t seed = 10;
  for (const auto& s : cases) {
    SCOPED_TRACE(fmt::format("N={} T={} C={} vocab={}", s.n, s.t, s.c, s.vocab));
    const auto tokens = random_tokens(s.n * s.t, static_cast<int32_t>(s.vocab), seed++);
    const auto dy = random_floats(s.n * s.t * s.c, seed++);
    test::KernelRunner k1(1), k2(2);
    const std::vector<float> poison(s.vocab * s.c, NAN);
    const auto [dwte, dwpe] = embedding_backward(k2, s, tokens, dy, poison, false);
    const auto ref = ref::embedding_backward(s.n, s.t, s.c, s.vocab, s.context, tokens, to_f64(dy));
    EXPECT_TRUE(all_close(dwte, ref.dwte, 1e-5, 1e-5));
    EXPECT_TRUE(all_close(dwpe, ref.dwpe, 1e-5, 1e-5));
    // Same bits on every run and thread count.
    const auto again = embedding_backward(k2, s, tokens, dy, poison, false);
    const auto one_thread = embedding_backward(k1, s, tokens, dy, poison, false);
    EXPECT_TRUE(test::bitwise_equal(dwte, again.first) && test::bitwise_equal(dwpe, again.second));
    EXPECT_TRUE(test::bitwise_equal(dwte, one_thread.first) &&
                test::bitwise_equal(dwpe, one_thread.second));
  }
}

TEST(EmbeddingKernel, BackwardSumsInPositionOrder) {
  // Token 0 everywhere: dwte[0] is ((0 + dy0) + dy1) + dy2 in float, in that order.
  test::KernelRunner k;
  const EmbeddingBackwardCase s{1, 3, 1, 2, 3};
  const std::vector<int32_t> tokens = {0, 0, 0};
  const std::vector<float> dy = {1.0f, 1e8f, -1e8f};  // (1 + 1e8) - 1e8 = 0 in float
  const auto [dwte, dwpe] = embedding_backward(k, s, tokens, dy, {NAN, NAN}, false);
  EXPECT_EQ(dwte[0], ((0.0f + dy[0]) + dy[1]) + dy[2]);
  EXPECT_EQ(dwte[1], 0.0f);  // token 1 does not occur
  EXPECT_EQ(dwpe, dy);
}

TEST(EmbeddingKernel, AccumulateAddsTheRowsOntoDwte) {
  test::KernelRunner k;
  const EmbeddingBackwardCase s{4, 16, 24, 40, 20};
  const auto tokens = random_tokens(s.n * s.t, static_cast<int32_t>(s.vocab), 20);
  const auto dy = random_floats(s.n * s.t * s.c, 21);
  const auto prior = random_floats(s.vocab * s.c, 22);
  const auto sums = embedding_backward(k, s, tokens, dy, std::vector<float>(prior.size()), false);
  const auto [acc, dwpe] = embedding_backward(k, s, tokens, dy, prior, true);
  // Each dy row added onto the prior row in (n, t) order; rows of absent tokens untouched.
  std::vector<float> expected = prior;
  for (size_t r = 0; r < tokens.size(); ++r) {
    for (int64_t j = 0; j < s.c; ++j) {
      expected[static_cast<size_t>(tokens[r] * s.c + j)] += dy[r * static_cast<size_t>(s.c) + j];
    }
  }
  EXPECT_TRUE(test::bitwise_equal(acc, expected));
  EXPECT_TRUE(test::bitwise_equal(dwpe, sums.second));
  for (int64_t i = s.t * s.c; i < s.context * s.c; ++i) ASSERT_EQ(dwpe[i], 0.0f);
}

// ---- layer norm ----

TEST(LayerNormKernel, MatchesReference) {
  test::KernelRunner k;
  const LayerNormGeom shapes[] = {{1, 1, 1e-5f}, {3, 7, 1e-5f}, {64, 384, 1e-5f}, {5, 769, 1e-3f}};
  uint32_t seed = 30;
  for (const auto& g : shapes) {
    SCOPED_TRACE(fmt::format("rows={} C={}", g.rows, g.c));
    const auto x = random_floats(g.rows * g.c, seed++, -2.0f, 3.0f);
    const auto gamma = random_floats(g.c, seed++), beta = random_floats(g.c, seed++);
    const auto dy = random_floats(g.rows * g.c, seed++);
    std::vector<float> y(g.rows * g.c, NAN), mean(g.rows, NAN), rstd(g.rows, NAN);
    k.run(LayerNormForward{g, x.data(), gamma.data(), beta.data(), y.data(), mean.data(),
                           rstd.data()});
    const auto r = ref::layer_norm_forward(g, to_f64(x), to_f64(gamma), to_f64(beta));
    EXPECT_TRUE(all_close(y, r.y, kRel, kAbs));
    EXPECT_TRUE(all_close(mean, r.mean, 1e-6, 1e-6));
    EXPECT_TRUE(all_close(rstd, r.rstd, 1e-5, 1e-5));

    std::vector<float> dx(g.rows * g.c, NAN), dgamma(g.c, NAN), dbeta(g.c, NAN);
    k.run(LayerNormBackward{g, x.data(), dy.data(), gamma.data(), mean.data(), rstd.data(),
                            dx.data(), dgamma.data(), dbeta.data()});
    const auto rg = ref::layer_norm_backward(g, to_f64(x), to_f64(dy), to_f64(gamma));
    EXPECT_TRUE(all_close(dx, rg.dx, kRel, kAbs));
    EXPECT_TRUE(all_close(dgamma, rg.dgamma, kRel, kAbs));
    EXPECT_TRUE(all_close(dbeta, rg.dbeta, kRel, kAbs));

    // In place (dx == dy): the same bits.
    std::vector<float> inplace = dy, dgamma2(g.c), dbeta2(g.c);
    k.run(LayerNormBackward{g, x.data(), inplace.data(), gamma.data(), mean.data(), rstd.data(),
                            inplace.data(), dgamma2.data(), dbeta2.data()});
    EXPECT_TRUE(test::bitwise_equal(inplace, dx));
    EXPECT_TRUE(test::bitwise_equal(dgamma2, dgamma));
    EXPECT_TRUE(test::bitwise_equal(dbeta2, dbeta));
  }
}

TEST(LayerNormKernel, GradientsMatchFiniteDifferences) {
  test::KernelRunner k;
  const LayerNormGeom g{3, 6, 1e-5f};
  const auto xf = random_floats(g.rows * g.c, 40), gf = random_floats(g.c, 41);
  const auto bf = random_floats(g.c, 42), dyf = random_floats(g.rows * g.c, 43);
  std::vector<float> y(g.rows * g.c), mean(g.rows), rstd(g.rows);
  k.run(LayerNormForward{g, xf.data(), gf.data(), bf.data(), y.data(), mean.data(), rstd.data()});
  std::vector<float> dx(g.rows * g.c), dgamma(g.c), dbeta(g.c);
  k.run(LayerNormBackward{g, xf.data(), dyf.data(), gf.data(), mean.data(), rstd.data(), dx.data(),
                          dgamma.data(), dbeta.data()});
  ref::Vec x = to_f64(xf), gamma = to_f64(gf), beta = to_f64(bf);
  const ref::Vec dy = to_f64(dyf);
  auto loss = [&](const ref::Vec&) {
    return test::dot(dy, ref::layer_norm_forward(g, x, gamma, beta).y);
  };
  for (size_t i = 0; i < x.size(); ++i) EXPECT_NEAR(dx[i], test::numeric_partial(loss, x, i), kAbs);
  for (size_t i = 0; i < gamma.size(); ++i) {
    EXPECT_NEAR(dgamma[i], test::numeric_partial(loss, gamma, i), kAbs);
    EXPECT_NEAR(dbeta[i], test::numeric_partial(loss, beta, i), kAbs);
  }
}

// ---- GELU ----

TEST(GeluKernel, MatchesReferenceAndFiniteDifferences) {
  test::KernelRunner k;
  const int64_t n = 100003;  // several chunks and a ragged tail
  auto x = random_floats(n, 50, -6.0f, 6.0f);
  x[0] = 0.0f, x[1] = -20.0f, x[2] = 20.0f, x[3] = 1e-6f, x[4] = -1e-3f;
  const auto dy = random_floats(n, 51);
  std::vector<float> y(n, NAN), dx(n, NAN);
  k.run(GeluForward{n, x.data(), y.data()});
  k.run(GeluBackward{n, x.data(), dy.data(), dx.data()});
  EXPECT_TRUE(all_close(y, ref::gelu_forward(to_f64(x)), 1e-6, 1e-6));
  EXPECT_TRUE(all_close(dx, ref::gelu_backward(to_f64(x), to_f64(dy)), 1e-5, 1e-6));
  EXPECT_EQ(y[0], 0.0f);
  EXPECT_EQ(y[2], 20.0f);

  // Finite differences of the float64 forward at the first few points.
  ref::Vec x64 = to_f64(x);
  for (size_t i = 5; i < 40; ++i) {
    auto loss = [&](const ref::Vec& v) { return ref::gelu_forward({v[i]})[0]; };
    EXPECT_NEAR(dx[i] / dy[i], test::numeric_partial(loss, x64, i), 1e-5);
  }

  // In place (dx == dy): the same bits.
  std::vector<float> inplace = dy;
  k.run(GeluBackward{n, x.data(), inplace.data(), inplace.data()});
  EXPECT_TRUE(test::bitwise_equal(inplace, dx));
}

// ---- attention ----

struct AttentionRun {
  std::vector<float> y, probs, dqkv;
  std::vector<uint8_t> mask;
};

AttentionRun run_attention(test::KernelRunner& k, const AttentionGeom& g, bool training,
                           uint64_t seed, const std::vector<float>& qkv,
                           const std::vector<float>& dy,
                           const std::vector<int32_t>* segments = nullptr) {
  AttentionRun r;
  const int64_t scores = g.n * g.heads * g.t * g.t;
  r.y.assign(g.n * g.t * g.c, NAN);
  r.probs.assign(scores, NAN);
  r.mask.assign(scores, 7);
  r.dqkv.assign(qkv.size(), NAN);
  AttentionForward f;
  f.g = g, f.training = training, f.seed = seed;
  f.qkv = qkv.data(), f.y = r.y.data(), f.probs = r.probs.data(), f.mask = r.mask.data();
  f.segments = segments ? segments->data() : nullptr;
  k.run(f);
  if (training) {
    AttentionBackward b;
    b.g = g, b.qkv = qkv.data(), b.probs = r.probs.data(), b.mask = r.mask.data();
    b.dy = dy.data(), b.dqkv = r.dqkv.data();
    b.segments = f.segments;
    k.run(b);
  }
  return r;
}

TEST(AttentionKernel, MatchesReference) {
  // (N, T, heads, C, dropout); T = 130 and 600 cut the scores into causal blocks with a short
  // last one (Note [Causal blocks]), and T = 600 cuts N = 3 into chunks of one row (Note
  // [Attention in chunks of the batch]).
  const AttentionGeom shapes[] = {{1, 1, 1, 1, 0.0f},    {2, 7, 2, 8, 0.0f},   {1, 17, 3, 12, 0.1f},
                                  {2, 33, 2, 64, 0.0f},  {3, 20, 4, 32, 0.5f}, {2, 130, 2, 8, 0.2f},
                                  {1, 200, 1, 16, 0.0f}, {3, 600, 2, 4, 0.1f}};
  uint32_t seed = 60;
  for (const AttentionGeom& g : shapes) {
    SCOPED_TRACE(
        fmt::format("N={} T={} heads={} C={} dropout={}", g.n, g.t, g.heads, g.c, g.dropout));
    test::KernelRunner k;
    const auto qkv = random_floats(g.n * g.t * 3 * g.c, seed++, -2.0f, 2.0f);
    const auto dy = random_floats(g.n * g.t * g.c, seed++);
    const AttentionRun r = run_attention(k, g, true, 1234, qkv, dy);
    const bool drop = g.dropout > 0.0f;
    const auto ref = ref::attention_forward(g, to_f64(qkv), drop ? &r.mask : nullptr);
    EXPECT_TRUE(all_close(r.probs, ref.probs, kRel, 1e-6));
    EXPECT_TRUE(all_close(r.y, ref.y, kRel, kAbs));
    EXPECT_TRUE(all_close(
        r.dqkv, ref::attention_backward(g, to_f64(qkv), to_f64(dy), drop ? &r.mask : nullptr), kRel,
        kAbs));
    // Masked scores are exactly 0.
    for (int64_t row = 0; row < g.n * g.heads * g.t; ++row) {
      const int64_t i = row % g.t;
      for (int64_t j = i + 1; j < g.t; ++j) ASSERT_EQ(r.probs[row * g.t + j], 0.0f);
    }
    if (drop) {
      // The mask is DropoutForward's draw over the probabilities, offset 0.
      std::vector<float> dropped(r.probs.size());
      std::vector<uint8_t> mask(r.probs.size());
      k.run(DropoutForward{static_cast<int64_t>(r.probs.size()), g.dropout, 1234, 0, r.probs.data(),
                           dropped.data(), mask.data()});
      EXPECT_EQ(mask, r.mask);
    }
  }
}

// Packed documents: a block-diagonal causal mask (Note [Segments of a packed row]), on the same
// shapes as above (causal blocks, chunks of the batch, dropout).
TEST(AttentionKernel, SegmentsMatchReference) {
  const AttentionGeom shapes[] = {{2, 7, 2, 8, 0.0f},    {1, 17, 3, 12, 0.1f},
                                  {3, 20, 4, 32, 0.5f},  {2, 130, 2, 8, 0.2f},
                                  {1, 200, 1, 16, 0.0f}, {3, 600, 2, 4, 0.0f}};
  uint32_t seed = 160;
  for (const AttentionGeom& g : shapes) {
    SCOPED_TRACE(
        fmt::format("N={} T={} heads={} C={} dropout={}", g.n, g.t, g.heads, g.c, g.dropout));
    test::KernelRunner k;
    const auto qkv = random_floats(g.n * g.t * 3 * g.c, seed++, -2.0f, 2.0f);
    const auto dy = random_floats(g.n * g.t * g.c, seed++);
    const auto segments = random_segments(g.n, g.t, std::max<int64_t>(1, g.t / 3), seed++);
    const AttentionRun r = run_attention(k, g, true, 1234, qkv, dy, &segments);
    const bool drop = g.dropout > 0.0f;
    const auto ref = ref::attention_forward(g, to_f64(qkv), drop ? &r.mask : nullptr, &segments);
    EXPECT_TRUE(all_close(r.probs, ref.probs, kRel, 1e-6));
    EXPECT_TRUE(all_close(r.y, ref.y, kRel, kAbs));
    EXPECT_TRUE(all_close(
        r.dqkv,
        ref::attention_backward(g, to_f64(qkv), to_f64(dy), drop ? &r.mask : nullptr, &segments),
        kRel, kAbs));
    // Keys outside the query's document get exactly 0.
    for (int64_t row = 0; row < g.n * g.heads * g.t; ++row) {
      const int64_t i = row % g.t, n = row / (g.heads * g.t);
      const int64_t first = segments[static_cast<size_t>(n * g.t + i)];
      for (int64_t j = 0; j < g.t; ++j) {
        if (j < first || j > i) ASSERT_EQ(r.probs[row * g.t + j], 0.0f) << row << " " << j;
      }
    }
  }
}

// A packed row computes each of its documents as if it were alone in a row of its own length.
TEST(AttentionKernel, PackedDocumentsEqualEachDocumentAlone) {
  const int64_t heads = 2, c = 16;
  const std::vector<int64_t> lengths = {5, 70, 1, 33, 19};  // and 8 positions of padding
  const int64_t t = 136;
  const AttentionGeom g{1, t, heads, c, 0.0f};
  const auto qkv = random_floats(t * 3 * c, 170, -2.0f, 2.0f);
  const auto dy = random_floats(t * c, 171);
  std::vector<int32_t> segments;
  for (int64_t len : lengths) segments.insert(segments.end(), len, segments.size());
  segments.resize(t, static_cast<int32_t>(segments.size()));  // the padding's own segment
  test::KernelRunner k;
  const AttentionRun packed = run_attention(k, g, true, 0, qkv, dy, &segments);
  int64_t at = 0;
  for (int64_t len : lengths) {
    SCOPED_TRACE(fmt::format("document of {} at {}", len, at));
    const std::vector<float> doc_qkv(qkv.begin() + at * 3 * c, qkv.begin() + (at + len) * 3 * c);
    const std::vector<float> doc_dy(dy.begin() + at * c, dy.begin() + (at + len) * c);
    const AttentionRun alone = run_attention(k, {1, len, heads, c, 0.0f}, true, 0, doc_qkv, doc_dy);
    const std::vector<float> y(packed.y.begin() + at * c, packed.y.begin() + (at + len) * c);
    const std::vector<float> dqkv(packed.dqkv.begin() + at * 3 * c,
                                  packed.dqkv.begin() + (at + len) * 3 * c);
    EXPECT_TRUE(all_close(y, to_f64(alone.y), 1e-5, 1e-6));
    EXPECT_TRUE(all_close(dqkv, to_f64(alone.dqkv), 1e-5, 1e-6));
    for (int64_t h = 0; h < heads; ++h) {
      for (int64_t i = 0; i < len; ++i) {
        for (int64_t j = 0; j < len; ++j) {
          ASSERT_NEAR(packed.probs[(h * t + at + i) * t + at + j],
                      alone.probs[(h * len + i) * len + j], 1e-6);
        }
      }
    }
    at += len;
  }
}

TEST(AttentionKernel, EvaluationIgnoresDropout) {
  test::KernelRunner k;
  AttentionGeom g{2, 9, 3, 12, 0.5f};
  const auto qkv = random_floats(g.n * g.t * 3 * g.c, 70), dy = random_floats(g.n * g.t * g.c, 71);
  std::vector<float> y(g.n * g.t * g.c), probs(g.n * g.heads * g.t * g.t);
  AttentionForward f;
  f.g = g, f.training = false, f.qkv = qkv.data(), f.y = y.data(), f.probs = probs.data();
  k.run(f);  // mask null: not used in evaluation
  const auto ref = ref::attention_forward(g, to_f64(qkv), nullptr);
  EXPECT_TRUE(all_close(y, ref.y, kRel, kAbs));
  g.dropout = 0.0f;
  const AttentionRun plain = run_attention(k, g, true, 0, qkv, dy);
  EXPECT_TRUE(test::bitwise_equal(y, plain.y));
}

TEST(AttentionKernel, GradientsMatchFiniteDifferences) {
  for (float dropout : {0.0f, 0.3f}) {
    SCOPED_TRACE(fmt::format("dropout={}", dropout));
    test::KernelRunner k;
    const AttentionGeom g{2, 5, 2, 6, dropout};
    const auto qkvf = random_floats(g.n * g.t * 3 * g.c, 80),
               dyf = random_floats(g.n * g.t * g.c, 81);
    const AttentionRun r = run_attention(k, g, true, 99, qkvf, dyf);
    ref::Vec qkv = to_f64(qkvf);
    const ref::Vec dy = to_f64(dyf);
    const std::vector<uint8_t>* mask = dropout > 0.0f ? &r.mask : nullptr;
    auto loss = [&](const ref::Vec& v) {
      return test::dot(dy, ref::attention_forward(g, v, mask).y);
    };
    for (size_t i = 0; i < qkv.size(); ++i) {
      EXPECT_NEAR(r.dqkv[i], test::numeric_partial(loss, qkv, i), kAbs) << i;
    }
  }
}

TEST(AttentionKernel, RepeatedRunsAreBitwiseIdentical) {
  const AttentionGeom g{4, 64, 4, 128, 0.1f};
  const auto qkv = random_floats(g.n * g.t * 3 * g.c, 90), dy = random_floats(g.n * g.t * g.c, 91);
  test::KernelRunner k1, k2;
  const AttentionRun a = run_attention(k1, g, true, 5, qkv, dy);
  const AttentionRun b = run_attention(k1, g, true, 5, qkv, dy);
  const AttentionRun c = run_attention(k2, g, true, 5, qkv, dy);
  for (const AttentionRun* o : {&b, &c}) {
    EXPECT_TRUE(test::bitwise_equal(a.y, o->y));
    EXPECT_TRUE(test::bitwise_equal(a.probs, o->probs));
    EXPECT_TRUE(test::bitwise_equal(a.dqkv, o->dqkv));
    EXPECT_EQ(a.mask, o->mask);
  }
  const AttentionRun other_seed = run_attention(k1, g, true, 6, qkv, dy);
  EXPECT_NE(a.mask, other_seed.mask);
}

TEST(TransformerKernels, RejectBadArguments) {
  test::KernelRunner k;
  std::vector<float> buf(4096);
  std::vector<uint8_t> mask(4096);
  AttentionForward f;
  f.g = {1, 4, 3, 8, 0.0f};  // 8 % 3 != 0
  f.qkv = buf.data(), f.y = buf.data(), f.probs = buf.data(), f.mask = mask.data();
  EXPECT_THROW(k.run(f), ConfigError);
  f.g = {1, 4, 2, 8, 1.0f};  // dropout 1
  EXPECT_THROW(k.run(f), ConfigError);
  f.g = {1, 4, 2, 8, 0.1f};
  f.mask = nullptr;  // training with dropout needs a mask
  EXPECT_THROW(k.run(f), ConfigError);
  f.g.t = 0;
  EXPECT_THROW(k.run(f), ConfigError);
  EXPECT_THROW(
      k.run(LayerNormForward{
          {0, 4, 1e-5f}, buf.data(), buf.data(), buf.data(), buf.data(), buf.data(), buf.data()}),
      ConfigError);
  EXPECT_THROW(
      k.run(LayerNormForward{
          {2, 4, 1e-5f}, buf.data(), nullptr, buf.data(), buf.data(), buf.data(), buf.data()}),
      ConfigError);
  EXPECT_THROW(k.run(GeluForward{-1, buf.data(), buf.data()}), ConfigError);
  const std::vector<int32_t> tokens(8, 0);
  EXPECT_THROW(k.run(EmbeddingBackward{1, 8, 4, 2, 4, tokens.data(), buf.data(), buf.data(),
                                       buf.data(), false}),
               ConfigError);  // context < T
}

// ---- linear layers with Conv1D's (K, N) weight ----

TEST(LinearKernel, WeightInOutMatchesTransposedWeight) {
  test::KernelRunner k;
  const LinearGeom shapes[] = {{1, 1, 1}, {5, 33, 17}, {64, 384, 1152}, {7, 96, 5}};
  uint32_t seed = 100;
  for (LinearGeom g : shapes) {
    SCOPED_TRACE(fmt::format("M={} K={} N={}", g.m, g.k, g.n));
    const auto x = random_floats(g.m * g.k, seed++), w = random_floats(g.n * g.k, seed++);
    const auto b = random_floats(g.n, seed++), dy = random_floats(g.m * g.n, seed++);
    std::vector<float> w_in_out(g.k * g.n);  // w^T
    for (int64_t i = 0; i < g.n; ++i) {
      for (int64_t j = 0; j < g.k; ++j) w_in_out[j * g.n + i] = w[i * g.k + j];
    }
    std::vector<float> y1(g.m * g.n), dx1(g.m * g.k), dw1(g.n * g.k), db1(g.n);
    k.run(LinearForward{g, x.data(), w.data(), b.data(), y1.data()});
    k.run(LinearBackwardData{g, dy.data(), w.data(), dx1.data()});
    k.run(LinearBackwardWeights{g, x.data(), dy.data(), dw1.data(), db1.data()});
    g.weight_in_out = true;
    std::vector<float> y2(g.m * g.n), dx2(g.m * g.k), dw2(g.k * g.n), db2(g.n);
    k.run(LinearForward{g, x.data(), w_in_out.data(), b.data(), y2.data()});
    k.run(LinearBackwardData{g, dy.data(), w_in_out.data(), dx2.data()});
    k.run(LinearBackwardWeights{g, x.data(), dy.data(), dw2.data(), db2.data()});
    std::vector<float> dw2_t(g.n * g.k);  // back to (N, K)
    for (int64_t i = 0; i < g.n; ++i) {
      for (int64_t j = 0; j < g.k; ++j) dw2_t[i * g.k + j] = dw2[j * g.n + i];
    }
    EXPECT_TRUE(all_close(y2, to_f64(y1), 1e-6, 1e-6));
    EXPECT_TRUE(all_close(dx2, to_f64(dx1), 1e-6, 1e-6));
    EXPECT_TRUE(all_close(dw2_t, to_f64(dw1), 1e-6, 1e-6));
    EXPECT_TRUE(test::bitwise_equal(db2, db1));
    // And against the float64 reference.
    g.weight_in_out = false;
    ref::Vec b64 = to_f64(b);
    EXPECT_TRUE(all_close(y2, ref::linear_forward(g, to_f64(x), to_f64(w), &b64), kRel, kAbs));
  }
}

}  // namespace
}  // namespace ferry
