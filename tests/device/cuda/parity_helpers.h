// Helpers of the CUDA op parity suites (kernel_parity_test.cc, transformer_parity_test.cc):
// seeded random inputs, the tolerance and bitwise comparisons, and the target's memory. Every
// fresh buffer is NaN-poisoned, so an element a kernel forgets to write shows.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "tests/device/cuda/parity_target.h"

namespace ferry {

inline constexpr double kRel = 1e-4;
// Absolute floor for values that are sums cancelling to about zero (gradients of batch norm).
inline constexpr double kAbs = 1e-5;

inline std::vector<float> random_floats(size_t n, std::mt19937& rng, float lo = -1.0f,
                                        float hi = 1.0f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

inline int64_t pick(std::mt19937& rng, int64_t lo, int64_t hi) {
  return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
}

// |gpu - cpu| <= abs + rel * |cpu| everywhere, NaN matching NaN; names the worst element.
inline ::testing::AssertionResult close(const std::vector<float>& gpu,
                                        const std::vector<float>& cpu, double rel = kRel,
                                        double abs = kAbs) {
  if (gpu.size() != cpu.size()) return ::testing::AssertionFailure() << "sizes differ";
  size_t bad = 0, worst = 0;
  double worst_err = -1.0;
  for (size_t i = 0; i < gpu.size(); ++i) {
    if (std::isnan(gpu[i]) && std::isnan(cpu[i])) continue;
    const double err = std::fabs(static_cast<double>(gpu[i]) - cpu[i]);
    if (!(err <= abs + rel * std::fabs(cpu[i]))) {
      ++bad;
      const double e = std::isnan(err) ? INFINITY : err;
      if (e > worst_err) {
        worst_err = e;
        worst = i;
      }
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << bad << " of " << gpu.size() << " differ; worst [" << worst
                                       << "] gpu " << gpu[worst] << " cpu " << cpu[worst];
}

template <typename T>
::testing::AssertionResult bitwise(const std::vector<T>& gpu, const std::vector<T>& cpu) {
  if (gpu.size() != cpu.size()) return ::testing::AssertionFailure() << "sizes differ";
  for (size_t i = 0; i < gpu.size(); ++i) {
    if (std::memcmp(&gpu[i], &cpu[i], sizeof(T)) != 0) {
      return ::testing::AssertionFailure() << "first difference at [" << i << "] of " << gpu.size()
                                           << ": gpu " << +gpu[i] << " cpu " << +cpu[i];
    }
  }
  return ::testing::AssertionSuccess();
}

// The target's memory for one test; fresh buffers are poisoned (NaN bytes) so an element a
// kernel forgets to write shows.
class GpuArena {
 public:
  explicit GpuArena(test::ParityTarget* target) : target_(target) {}
  template <typename T>
  T* alloc(size_t n) {
    return static_cast<T*>(target_->alloc(n * sizeof(T)));
  }
  template <typename T>
  T* upload(const std::vector<T>& host) {
    T* p = alloc<T>(host.size());
    target_->copy_in(p, host.data(), host.size() * sizeof(T));
    return p;
  }
  template <typename T>
  std::vector<T> download(const T* p, size_t n) {
    std::vector<T> host(n);
    target_->copy_out(host.data(), p, n * sizeof(T));
    return host;
  }

 private:
  test::ParityTarget* target_;
};

// NaN-poisoned host outputs for the CPU side.
inline std::vector<float> poisoned(size_t n) { return std::vector<float>(n, NAN); }

}  // namespace ferry
