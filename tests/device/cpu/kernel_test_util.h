// Helpers for the CPU kernel tests: seeded random tensors, fp32-vs-fp64 comparison with stated
// tolerances, central finite differences, and a runner that gives each kernel exactly the
// workspace it asks for.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <random>
#include <vector>

#include <fmt/format.h>

#include "device/cpu/bf16_storage.h"
#include "device/cpu/cpu_kernels.h"
#include "tests/device/cpu/reference.h"

namespace ferry::test {

// The kernel tests' thread count (the CPU backend's usual setting on this machine).
inline constexpr int kThreads = 2;

inline std::vector<float> random_floats(size_t n, uint32_t seed, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline ref::Vec to_f64(const std::vector<float>& v) { return ref::Vec(v.begin(), v.end()); }

// A tensor in bf16 storage (the bf16 kernel tests): its bits, NaN until written, or fp32 values
// rounded to nearest even; ptr() is what a kernel struct's float* field takes.
struct Bf16 {
  std::vector<uint16_t> bits;
  explicit Bf16(size_t n) : bits(n, 0xffff) {}
  explicit Bf16(const std::vector<float>& v) : bits(v.size()) {
    cpu::narrow_to_bf16(v.data(), bits.data(), static_cast<int64_t>(v.size()));
  }
  float* ptr() { return reinterpret_cast<float*>(bits.data()); }
  std::vector<float> values() const {
    std::vector<float> out(bits.size());
    cpu::widen_bf16(bits.data(), out.data(), static_cast<int64_t>(bits.size()));
    return out;
  }
  ref::Vec f64() const { return to_f64(values()); }
};

// Element-wise |actual - expected| <= abs + rel * |expected|, NaN matching only NaN; names the
// worst element.
inline ::testing::AssertionResult all_close(const std::vector<float>& actual,
                                            const ref::Vec& expected, double rel, double abs) {
  if (actual.size() != expected.size()) {
    return ::testing::AssertionFailure()
           << "size " << actual.size() << " != expected " << expected.size();
  }
  size_t bad = 0, worst = 0;
  double worst_excess = 0.0;
  for (size_t i = 0; i < actual.size(); ++i) {
    if (std::isnan(actual[i]) && std::isnan(expected[i])) continue;
    const double err = std::fabs(static_cast<double>(actual[i]) - expected[i]);
    const double tol = abs + rel * std::fabs(expected[i]);
    if (!(err <= tol)) {
      ++bad;
      const double excess = std::isnan(err) ? INFINITY : err - tol;
      if (bad == 1 || excess > worst_excess) {
        worst_excess = excess;
        worst = i;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << actual.size() << " elements differ; worst [" << worst << "]: actual "
         << actual[worst] << " expected " << expected[worst] << " (rel " << rel << ", abs " << abs
         << ")";
}

inline bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// d loss / d x[i] by central differences of a float64 function of x (x is restored).
template <typename Loss>
double numeric_partial(const Loss& loss, ref::Vec& x, size_t i, double h = 1e-5) {
  const double saved = x[i];
  x[i] = saved + h;
  const double plus = loss(x);
  x[i] = saved - h;
  const double minus = loss(x);
  x[i] = saved;
  return (plus - minus) / (2.0 * h);
}

inline double dot(const ref::Vec& a, const ref::Vec& b) {
  double s = 0.0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

// `count` distinct indices in [0, n), seeded.
inline std::vector<size_t> sample_indices(size_t n, size_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<size_t> idx(n);
  for (size_t i = 0; i < n; ++i) idx[i] = i;
  std::shuffle(idx.begin(), idx.end(), rng);
  idx.resize(std::min(n, count));
  return idx;
}

// Runs kernels now on the calling thread, handing each exactly workspace_bytes() of workspace.
class KernelRunner {
 public:
  explicit KernelRunner(int threads = kThreads) : kernels_(threads) {}

  template <typename Args>
  void run(Args args) {
    if constexpr (requires { args.ws; }) {
      const uint64_t bytes = kernels_.workspace_bytes(args);
      ws_.assign(bytes, std::byte{0});
      args.ws = Workspace{ws_.data(), bytes};
    }
    kernels_.run(args);
  }
  cpu::CpuKernels& kernels() { return kernels_; }

 private:
  cpu::CpuKernels kernels_;
  std::vector<std::byte> ws_;
};

}  // namespace ferry::test
