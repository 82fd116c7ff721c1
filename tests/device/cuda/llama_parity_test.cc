// Llama kernel parity (RMSNorm, rotary embeddings into qkv with grouped KV heads, SwiGLU): the
// CUDA kernels against the CPU backend (itself checked against float64 references of Hugging
// Face's formulas in tests/device/cpu/kernels_llama_test.cc), on seeded shapes, and repeated bit
// for bit. Runs on the GPU (cuda_target.cc; skips without one) and on the host emulation
// (emulated_target.cc), the same source.
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "common/error.h"
#include "device/cuda/cuda_ops.h"
#include "tests/device/cuda/parity_helpers.h"
#include "tests/device/cuda/parity_target.h"

#ifndef FERRY_PARITY_SUITE
#define FERRY_PARITY_SUITE CudaLlamaParityTest
#endif

namespace ferry {
namespace {

class FERRY_PARITY_SUITE : public ParityFixture {};

// ---- RMSNorm -----------------------------------------------------------------------------------

struct RmsCase {
  int64_t rows, c;
};
const RmsCase kRmsCases[] = {{1, 1}, {3, 37}, {40, 64}, {70, 576}};

TEST_F(FERRY_PARITY_SUITE, RmsNormMatchesTheCpuBackend) {
  std::mt19937 rng(91);
  for (const RmsCase& rc : kRmsCases) {
    SCOPED_TRACE(testing::Message() << rc.rows << "x" << rc.c);
    const size_t n = static_cast<size_t>(rc.rows * rc.c);
    const auto x = random_floats(n, rng), w = random_floats(rc.c, rng, 0.5f, 1.5f),
               dy = random_floats(n, rng);
    const RmsNormGeom g{rc.rows, rc.c, 1e-5f};
    std::vector<float> y(n), rstd(rc.rows), dx(n), dw(rc.c);
    cpu(RmsNormForward{g, x.data(), w.data(), y.data(), rstd.data()});
    cpu(RmsNormBackward{g, x.data(), dy.data(), w.data(), rstd.data(), dx.data(), dw.data()});
    std::vector<float> first;
    for (int repeat = 0; repeat < 2; ++repeat) {
      const float* gx = mem_.upload(x);
      const float* gw = mem_.upload(w);
      float* gy = mem_.alloc<float>(n);
      float* gr = mem_.alloc<float>(rc.rows);
      float* gdy = mem_.upload(dy);
      float* gdw = mem_.alloc<float>(rc.c);
      gpu(RmsNormForward{g, gx, gw, gy, gr});
      gpu(RmsNormBackward{g, gx, gdy, gw, gr, gdy, gdw});  // dx in place over dy
      const auto got_y = mem_.download(gy, n), got_dx = mem_.download(gdy, n),
                 got_dw = mem_.download(gdw, rc.c), got_r = mem_.download(gr, rc.rows);
      EXPECT_TRUE(close(got_y, y, 1e-5, 1e-6));
      EXPECT_TRUE(close(got_r, rstd, 1e-6, 0));
      EXPECT_TRUE(close(got_dx, dx, 1e-4, 1e-5));
      EXPECT_TRUE(close(got_dw, dw, 1e-4, 1e-5));
      std::vector<float> all = got_y;
      all.insert(all.end(), got_dx.begin(), got_dx.end());
      all.insert(all.end(), got_dw.begin(), got_dw.end());
      if (repeat == 0)
        first = all;
      else
        EXPECT_TRUE(bitwise(all, first));
    }
  }
}

// ---- rotary embeddings into qkv ----------------------------------------------------------------

struct RopeCase {
  int64_t n, t, heads, kv, d;
  bool packed;
};
const RopeCase kRopeCases[] = {{1, 1, 1, 1, 2, false},
                               {2, 9, 6, 2, 8, false},
                               {2, 33, 9, 3, 64, false},
                               {1, 20, 4, 1, 6, true}};

TEST_F(FERRY_PARITY_SUITE, RopeQkvMatchesTheCpuBackend) {
  std::mt19937 rng(92);
  for (const RopeCase& rc : kRopeCases) {
    SCOPED_TRACE(testing::Message() << rc.heads << "/" << rc.kv << " heads, d " << rc.d);
    const int64_t rows = rc.n * rc.t, qw = rc.heads * rc.d, kvw = rc.kv * rc.d;
    const auto q = random_floats(rows * qw, rng), k = random_floats(rows * kvw, rng),
               v = random_floats(rows * kvw, rng), dqkv = random_floats(rows * 3 * qw, rng);
    std::vector<int32_t> segments;
    for (int64_t r = 0; r < rows && rc.packed; ++r) segments.push_back((r % rc.t) / 5 * 5);
    const int32_t* cseg = rc.packed ? segments.data() : nullptr;
    const RopeGeom g{rc.n, rc.t, rc.heads, rc.kv, rc.d, 10000.0f};
    std::vector<float> qkv(rows * 3 * qw), dq(q.size()), dk(k.size()), dv(v.size());
    cpu(RopeQkvForward{g, q.data(), k.data(), v.data(), qkv.data(), cseg});
    cpu(RopeQkvBackward{g, dqkv.data(), dq.data(), dk.data(), dv.data(), cseg});
    const int32_t* gseg = rc.packed ? mem_.upload(segments) : nullptr;
    float* gqkv = mem_.alloc<float>(qkv.size());
    float* gdq = mem_.alloc<float>(q.size());
    float* gdk = mem_.alloc<float>(k.size());
    float* gdv = mem_.alloc<float>(v.size());
    gpu(RopeQkvForward{g, mem_.upload(q), mem_.upload(k), mem_.upload(v), gqkv, gseg});
    gpu(RopeQkvBackward{g, mem_.upload(dqkv), gdq, gdk, gdv, gseg});
    EXPECT_TRUE(close(mem_.download(gqkv, qkv.size()), qkv, 1e-5, 1e-6));
    EXPECT_TRUE(close(mem_.download(gdq, q.size()), dq, 1e-5, 1e-6));
    EXPECT_TRUE(close(mem_.download(gdk, k.size()), dk, 1e-5, 1e-6));
    EXPECT_TRUE(close(mem_.download(gdv, v.size()), dv, 0, 0));  // sums in the same order
  }
}

TEST_F(FERRY_PARITY_SUITE, RopeQkvRefusesAnOddHeadWidth) {
  float* p = mem_.alloc<float>(64);
  EXPECT_THROW(gpu(RopeQkvForward{{1, 2, 2, 2, 3, 1e4f}, p, p, p, p, nullptr}), ConfigError);
  EXPECT_THROW(gpu(RopeQkvForward{{1, 2, 4, 3, 2, 1e4f}, p, p, p, p, nullptr}), ConfigError);
}

// ---- SwiGLU ------------------------------------------------------------------------------------

TEST_F(FERRY_PARITY_SUITE, SwigluMatchesTheCpuBackend) {
  std::mt19937 rng(93);
  for (const size_t n : {size_t{1}, size_t{1000}, size_t{65537}}) {
    SCOPED_TRACE(n);
    const auto gate = random_floats(n, rng, -8.0f, 8.0f), up = random_floats(n, rng),
               dy = random_floats(n, rng);
    const auto count = static_cast<int64_t>(n);
    std::vector<float> y(n), dgate(n), dup(n);
    cpu(SwigluForward{count, gate.data(), up.data(), y.data()});
    cpu(SwigluBackward{count, gate.data(), up.data(), dy.data(), dgate.data(), dup.data()});
    const float* gg = mem_.upload(gate);
    const float* gu = mem_.upload(up);
    float* gy = mem_.alloc<float>(n);
    float* gdy = mem_.upload(dy);
    float* gdup = mem_.alloc<float>(n);
    gpu(SwigluForward{count, gg, gu, gy});
    gpu(SwigluBackward{count, gg, gu, gdy, gdy, gdup});  // dgate in place over dy
    EXPECT_TRUE(close(mem_.download(gy, n), y, 1e-5, 1e-6));
    EXPECT_TRUE(close(mem_.download(gdy, n), dgate, 1e-5, 1e-6));
    EXPECT_TRUE(close(mem_.download(gdup, n), dup, 1e-5, 1e-6));
  }
}

}  // namespace
}  // namespace ferry
